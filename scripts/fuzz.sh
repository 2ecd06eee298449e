#!/usr/bin/env bash
# Runs each fuzz target (fuzz/fuzz_targets) for FUZZ_SECONDS (default 20) with libFuzzer and
# AddressSanitizer, starting from the seeds in fuzz/corpus/<target>, and reports each target
# as a line cargo test's summarizer counts ("test result: ok. 1 passed; ..."). Installs the
# nightly toolchain and cargo-fuzz when they are missing; if that is impossible, reports the
# targets as skipped and says why. A crash fails its target and names the reproducer, which
# `cargo +nightly fuzz run <target> <file>` replays.
#
# Targets under fuzz/ need no engine and run in `make test`; those under fuzz/engine/ drive a
# real logical unit over RocksDB, whose build takes many minutes, and run in `make fuzz`.
#
# Usage: scripts/fuzz.sh [target...]   (FUZZ_SECONDS=20 FUZZ_JOBS=1)
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER=${FUZZ_SECONDS:-20}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(iscsi_pdu nbd_proto login_text scsi_cdb disk_label)
TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}/fuzz

skip() {
  echo "fuzz: skipped: $1"
  for t in "${TARGETS[@]}"; do echo "test result: ok. 0 passed; 0 failed; 1 ignored; fuzz $t"; done
  exit 0
}
if ! cargo +nightly --version >/dev/null 2>&1; then
  command -v rustup >/dev/null || skip "no nightly toolchain and no rustup to install one"
  echo "fuzz: installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal >/dev/null 2>&1 || skip "cannot install the nightly toolchain"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked -q >/dev/null 2>&1 || skip "cannot install cargo-fuzz"
fi

status=0
for t in "${TARGETS[@]}"; do
  work=$(mktemp -d)
  log=$work/log
  echo "fuzz: $t for ${SECONDS_PER}s"
  dir=fuzz
  [ -f "fuzz/engine/fuzz_targets/$t.rs" ] && dir=fuzz/engine
  if cargo +nightly fuzz run --fuzz-dir "$dir" --target-dir "$TARGET_DIR" "$t" "$work" "$dir/corpus/$t" -- \
       -max_total_time="$SECONDS_PER" -artifact_prefix="$work/" -print_final_stats=1 > "$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    echo "fuzz: $t: ${runs:-?} inputs, no crash"
    echo "test result: ok. 1 passed; 0 failed; 0 ignored; fuzz $t"
    rm -rf "$work"
  else
    tail -n 40 "$log"
    keep=$dir/artifacts/$t; mkdir -p "$keep"
    cp "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$keep"/ 2>/dev/null
    echo "fuzz: $t FAILED; reproducers in $keep (cargo +nightly fuzz run --fuzz-dir $dir $t $keep/<file>)"
    echo "test result: FAILED. 0 passed; 1 failed; 0 ignored; fuzz $t"
    status=1
  fi
done
exit $status
