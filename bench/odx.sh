#!/usr/bin/env bash
# Offloaded copy against a host copy, in one run: copies SIZE bytes between two vdisks of one
# pool over iSCSI on 127.0.0.1, RUNS times each, by ODX (POPULATE TOKEN / WRITE USING TOKEN),
# by EXTENDED COPY, and by a host copy (READ and WRITE through the initiator, 16 MiB in flight,
# then SYNCHRONIZE CACHE), all driven by `tessera copy`. For each copy it measures the time,
# the bytes that crossed the loopback interface (received bytes of `lo` in /proc/net/dev,
# which counts each byte once) and the initiator's CPU (user + system of the `tessera copy`
# process). Prints a markdown table of medians, and host copy / offloaded copy ratios.
#
# The pool is four sparse file disks like the demo's, with a LAYOUT (default simple: a host
# copy of 10 GiB mirrored would need 40 GiB of scratch space) vdisk of SIZE filled with random
# data through NBD by fio. Every run copies into a fresh destination vdisk.
#
# Also times a snapshot of the full source and a clone of it.
#
# Needs: fio (nbd engine), python3, numfmt, bc. TESSERA_BIN=path skips the cargo build. KEEP=1
# keeps DIR after the run.
#
# Usage: bench/odx.sh   (RUNS=3 SIZE=10G LAYOUT=simple DIR=/var/tmp/tessera-bench-odx
#          PROFILE=release TESSERA_BIN= KEEP=0 ISCSI_PORT=13270 NBD_PORT=13271)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SIZE=${SIZE:-10G}
LAYOUT=${LAYOUT:-simple}
DIR=${DIR:-/var/tmp/tessera-bench-odx}
ISCSI_PORT=${ISCSI_PORT:-13270}
NBD_PORT=${NBD_PORT:-13271}
KEEP=${KEEP:-0}

source bench/lib.sh
require fio python3 numfmt bc
tessera_binary
ports_free "$ISCSI_PORT" "$NBD_PORT"

SIZE_B=$(numfmt --from=iec "$SIZE")
BLOCKS=$((SIZE_B / 512))
DISK_B=$(( (SIZE_B * 3 / 4 / (1 << 30) + 4) << 30 ))   # room for the source and a host copy

rm -rf "$DIR"
mkdir -p "$DIR/logs" "$DIR/disks"
cleanup() {
  [ -f "$DIR/tessera.pid" ] && kill "$(cat "$DIR/tessera.pid")" 2>/dev/null || true
  sleep 0.5
  [ "$KEEP" = 1 ] || rm -rf "$DIR"
}
trap cleanup EXIT

start_tessera --iscsi-listen "127.0.0.1:$ISCSI_PORT" --nbd-listen "127.0.0.1:$NBD_PORT"
args=()
for i in 0 1 2 3; do
  truncate -s "$DISK_B" "$DIR/disks/d$i.img"
  args+=(--disk "$DIR/disks/d$i.img")
done
logged setup.log "$T" pool create bench "${args[@]}"
logged setup.log "$T" vdisk create bench/src --size "$SIZE" --layout "$LAYOUT"
logged setup.log "$T" nbd export bench/src
IQN=iqn.2026-11.io.tessera:odx-bench
logged setup.log "$T" target create "$IQN" --allow-any-initiator
logged setup.log "$T" target lun add "$IQN" bench/src

echo "filling $SIZE with random data..." >&2
logged fill.log fio --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$NBD_PORT/src" \
  --rw=write --bs=1M --iodepth=16 --size="$SIZE_B" --refill_buffers=1

# A snapshot and a clone of the full source: time of the API call, seen by the CLI.
timed() { local t0 t1; t0=$(date +%s.%N); logged setup.log "$@"; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
SNAP_S=$(timed "$T" snapshot create bench/src@full)
CLONE_S=$(timed "$T" vdisk clone bench/src@full src-clone)
logged setup.log "$T" vdisk delete bench/src-clone
logged setup.log "$T" snapshot delete bench/src@full

lo_rx() { awk '$1 == "lo:" {print $2}' /proc/net/dev; }

# One copy into a fresh destination vdisk: prints "seconds lo_bytes cpu_seconds".
one_copy() {
  local method=$1
  "$T" target lun remove "$IQN" 1 >/dev/null 2>&1 || true
  "$T" vdisk delete bench/dst >/dev/null 2>&1 || true
  logged setup.log "$T" vdisk create bench/dst --size "$SIZE" --layout "$LAYOUT"
  logged setup.log "$T" target lun add "$IQN" bench/dst --lun 1
  local before after out cpu
  before=$(lo_rx)
  TIMEFORMAT='%U %S'
  { time "$T" --json copy "iscsi://127.0.0.1:$ISCSI_PORT/$IQN/0" 0 \
      "iscsi://127.0.0.1:$ISCSI_PORT/$IQN/1" 0 "$BLOCKS" --method "$method" \
      > "$DIR/logs/copy-$method.json"; } 2> "$DIR/logs/cpu-$method.txt"
  after=$(lo_rx)
  out=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$DIR/logs/copy-$method.json")
  cpu=$(awk '{print $1 + $2}' "$DIR/logs/cpu-$method.txt")
  echo "$out $((after - before)) $cpu"
}

declare -A secs bytes cpus
for r in $(seq "$RUNS"); do
  for m in odx xcopy host; do
    read -r s b c < <(one_copy "$m")
    echo "run $r $m: ${s} s, $b bytes on lo, ${c} s CPU" >&2
    secs[$m]+="$s "; bytes[$m]+="$b "; cpus[$m]+="$c "
  done
done

med() { tr ' ' '\n' | grep -v '^$' | median; }
echo
echo "Copy of $SIZE between two $LAYOUT vdisks of one pool over iSCSI on 127.0.0.1, median of $RUNS runs:"
echo
echo "| method | time (s) | bytes over loopback | initiator CPU (s) |"
echo "|---|---:|---:|---:|"
for m in odx xcopy host; do
  printf '| %s | %s | %s | %s |\n' "$m" "$(echo "${secs[$m]}" | med)" \
    "$(echo "${bytes[$m]}" | med)" "$(echo "${cpus[$m]}" | med)"
done
echo
printf 'snapshot of the full %s source: %.3f s; clone of that snapshot: %.3f s\n' "$SIZE" "$SNAP_S" "$CLONE_S"
hs=$(echo "${secs[host]}" | med)
for m in odx xcopy; do
  s=$(echo "${secs[$m]}" | med)
  echo
  echo "host copy time / $m time: $(python3 -c "print(round($hs / max($s, 1e-9), 1))")x"
done
