#!/usr/bin/env bash
# Passes cargo test's output through and ends it with one summary line over every test binary:
# "N passed, N failed, N skipped". Exits non-zero if any test failed or cargo itself failed.
set -uo pipefail
passed=0; failed=0; ignored=0; crashed=0
while IFS= read -r line; do
  printf '%s\n' "$line"
  if [[ "$line" =~ ^test\ result:\ [A-Za-z]+\.\ ([0-9]+)\ passed\;\ ([0-9]+)\ failed\;\ ([0-9]+)\ ignored ]]; then
    passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2])); ignored=$((ignored + BASH_REMATCH[3]))
  fi
  # A test that found it cannot run here (tessera_disk::skip) passed as far as cargo knows.
  if [[ "$line" =~ ^test\ .*\ \.\.\.\ skipped\ at\ run\ time: ]]; then
    passed=$((passed - 1)); ignored=$((ignored + 1))
  fi
  if [[ "$line" =~ ^error:\ (test\ failed|could\ not\ compile|[0-9]+\ targets?\ failed) ]]; then crashed=1; fi
done
status=${PIPESTATUS[0]:-0}
if [ "$crashed" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo
echo "${passed} passed, ${failed} failed, ${ignored} skipped"
[ "$failed" -eq 0 ]
