#!/usr/bin/env bash
# The peers of the deduplication benchmark: restic or borg backs the given files up into a
# fresh repository, and the repository's size is set against the files' size.
#
# Each tool runs with its defaults, which are its own best settings for size and must not be
# weakened here: restic's repository format 2 with compression auto (restic always encrypts),
# borg's lz4 compression with encryption off. Both chunk with their default chunker (restic
# about 1 MiB, borg about 2 MiB content-defined chunks).
#
# All files go into one backup and one JSON line is printed:
#   {"tool":..., "input_bytes":N, "repo_bytes":N, "saved":1-repo/input, "seconds":S, "mb_per_s":input/1e6/S}
# With --each every file is a backup of its own into the same repository, in the order given,
# and a line follows each one with "step" and "file" added and the other figures cumulative
# (input, repository size and seconds so far): the seed's incremental dump experiment.
# Seconds are the backups' wall time only, not the repository's creation. The repository is a
# temporary directory in DATA (so on the data's file system) removed at exit. Its size is that
# of its files, as `du -sb` gives it less the directories: du counts each directory as 4 KiB,
# and restic creates 256 empty ones up front, 1 MiB that would swamp the seed-sized dumps.
# Input bytes are the files' apparent sizes, holes in sparse images included, as the tools
# read them.
#
# Usage: bench/dedup-peers.sh [--each] restic|borg FILE...   (DATA=/var/tmp/tessera-dedup-data)
set -euo pipefail
usage() { echo "usage: $0 [--each] restic|borg FILE..." >&2; exit 2; }
each=0
[ "${1:-}" != --each ] || { each=1; shift; }
tool=${1:-}; shift || true
[ "${1:-}" != --each ] || { each=1; shift; }
case $tool in restic|borg) ;; *) usage ;; esac
[ $# -gt 0 ] || usage
files=()    # absolute, before the cd
for f in "$@"; do
  [ -f "$f" ] || { echo "not a file: $f" >&2; exit 1; }
  files+=("$(realpath "$f")")
done
cd "$(dirname "$0")/.."
DATA=${DATA:-/var/tmp/tessera-dedup-data}
source bench/lib.sh
require "$tool"

mkdir -p "$DATA"
TMP=$(mktemp -d -p "$DATA" "peer-$tool.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
trap 'exit 143' INT TERM
REPO=$TMP/repo

# Caches and keys of the tools stay in TMP, out of the repository and out of $HOME.
case $tool in
  restic)
    export RESTIC_PASSWORD=tessera-bench RESTIC_REPOSITORY=$REPO RESTIC_CACHE_DIR=$TMP/cache
    restic init -q >/dev/null
    backup() { restic backup -q "$@" >/dev/null; } ;;
  borg)
    export BORG_BASE_DIR=$TMP/borg
    borg init --encryption=none "$REPO"
    n=0
    backup() { n=$((n + 1)); borg create --compression lz4 "$REPO::b$n" "$@"; } ;;
esac

input=0 seconds=0 step=0
run() { # backs the files up; prints the line with the figures so far
  local f t0 t1 repo label=""
  for f in "$@"; do input=$((input + $(stat -c %s "$f"))); done
  t0=$(date +%s.%N)
  backup "$@"
  t1=$(date +%s.%N)
  repo=$(find "$REPO" -type f -printf '%s\n' | awk '{ n += $1 } END { printf "%.0f", n }')
  step=$((step + 1))
  seconds=$(awk -v s="$seconds" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.3f", s + t1 - t0 }')
  [ $each = 0 ] || label=$(printf '"step":%d,"file":"%s",' "$step" "$1")
  awk -v tool="$tool" -v label="$label" -v input="$input" -v repo="$repo" -v s="$seconds" 'BEGIN {
    printf "{\"tool\":\"%s\",%s\"input_bytes\":%s,\"repo_bytes\":%s,\"saved\":%.4f,\"seconds\":%.2f,\"mb_per_s\":%.1f}\n",
      tool, label, input, repo, 1 - repo / input, s, input / 1e6 / s
  }'
}

if [ $each = 1 ]; then
  for f in "${files[@]}"; do run "$f"; done
else
  run "${files[@]}"
fi
