#!/usr/bin/env bash
# Image import and export through the daemon against a plain copy of the same image, in one run.
#
# Starts `tessera serve` on 4 sparse file disks, then RUNS times: copies a SIZE random image
# with `dd ... oflag=direct` to a file on the same file system (the reference), imports it into
# a fresh vdisk of each LAYOUT, and exports that vdisk to a new file. Prints the median MiB/s of
# each and the ratio to the reference.
#
# TESSERA_BIN=path skips the cargo build.
#
# Usage: bench/image.sh   (RUNS=3 SIZE_MIB=1024 LAYOUTS="mirror parity" DIR=/var/tmp/tessera-bench-image PROFILE=release
#          TESSERA_BIN=)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
LAYOUTS=${LAYOUTS:-"mirror parity"}
DIR=${DIR:-/var/tmp/tessera-bench-image}
source bench/lib.sh
tessera_binary
rm -rf "$DIR"; mkdir -p "$DIR/disks"
trap 'kill $(cat "$DIR/pid" 2>/dev/null) 2>/dev/null; sleep 1; rm -rf "$DIR"' EXIT

for i in 0 1 2 3; do truncate -s 8G "$DIR/disks/d$i.img"; done
"$T" serve --state-dir "$DIR/state" --api-listen none > "$DIR/serve.out" 2> "$DIR/serve.log" &
echo $! > "$DIR/pid"
export TESSERA_API=unix:$DIR/state/api.sock
for _ in $(seq 100); do "$T" pool list >/dev/null 2>&1 && break; sleep 0.1; done
"$T" pool create bench $(for i in 0 1 2 3; do echo --disk "$DIR/disks/d$i.img"; done) >/dev/null
dd if=/dev/urandom of="$DIR/in.img" bs=1M count="$SIZE_MIB" status=none

secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rate() { echo "$SIZE_MIB / $1" | bc -l; }

declare -A times
for run in $(seq "$RUNS"); do
  rm -f "$DIR/ref.img"; sync
  times[ref]+="$(secs dd if="$DIR/in.img" of="$DIR/ref.img" bs=4M oflag=direct conv=fsync status=none) "
  for l in $LAYOUTS; do
    "$T" vdisk delete "bench/$l" >/dev/null 2>&1 || true
    rm -f "$DIR/out.img"
    times[import-$l]+="$(secs "$T" vdisk import "bench/$l" "$DIR/in.img" --layout "$l") "
    times[export-$l]+="$(secs "$T" vdisk export "bench/$l" "$DIR/out.img") "
    cmp -s "$DIR/in.img" <(head -c $((SIZE_MIB << 20)) "$DIR/out.img") || { echo "export of $l differs" >&2; exit 1; }
  done
done

ref=$(echo "${times[ref]}" | tr ' ' '\n' | grep . | median)
printf '%-16s %10s %8s\n' what MiB/s ratio
printf '%-16s %10.0f %8.2f\n' "dd (reference)" "$(rate "$ref")" 1
for l in $LAYOUTS; do
  for op in import export; do
    m=$(echo "${times[$op-$l]}" | tr ' ' '\n' | grep . | median)
    printf '%-16s %10.0f %8.2f\n' "$op $l" "$(rate "$m")" "$(echo "$ref / $m" | bc -l)"
  done
done
