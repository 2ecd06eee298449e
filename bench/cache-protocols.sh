#!/usr/bin/env bash
# The seeds' 70/30 4K profile (70 % reads, 30 % writes, random) over iSCSI and NBD, with
# `tessera bench`, on parity 3+1 vdisks with and without the write-back cache, in one run.
#
# One daemon, one pool: 4 data disks and 2 cache disks, all sparse files in DIR (so the cache
# is on the same file system as the data, not on a faster device). Two parity vdisks of SIZE,
# filled by `vdisk import` of one random image: `cached` (default 1 GiB cache) and `direct`
# (`--write-cache-size 0`). Each is exported over NBD and presented as an iSCSI LUN. Then RUNS
# times, for each vdisk and protocol: `tessera bench --profile 4k-70-30` for DURATION seconds,
# THREADS x OUTSTANDING deep, each run once the cache holds no dirty data. Prints the medians.
#
# Usage: bench/cache-protocols.sh  (RUNS=3 SIZE=2G DURATION=15 THREADS=4 OUTSTANDING=8
#          DIR=/var/tmp/tessera-bench-cachep PROFILE=release TESSERA_BIN= KEEP=0
#          ISCSI_PORT=13260 NBD_PORT=13809)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SIZE=${SIZE:-2G}
DURATION=${DURATION:-15}
THREADS=${THREADS:-4}
OUTSTANDING=${OUTSTANDING:-8}
DIR=${DIR:-/var/tmp/tessera-bench-cachep}
ISCSI_PORT=${ISCSI_PORT:-13260}
NBD_PORT=${NBD_PORT:-13809}
KEEP=${KEEP:-0}

source bench/lib.sh
require python3 numfmt
tessera_binary
SIZE_B=$(numfmt --from=iec "$SIZE")
IQN=iqn.2026-11.io.tessera:cachebench

cleanup() {
  set +e
  if [ -f "$DIR/tessera.pid" ]; then kill "$(cat "$DIR/tessera.pid")" 2>/dev/null; wait "$(cat "$DIR/tessera.pid")" 2>/dev/null; fi
  if [ "$KEEP" = 1 ]; then echo "kept $DIR" >&2; else rm -rf "$DIR"; fi
}
ports_free "$ISCSI_PORT" "$NBD_PORT"
rm -rf "$DIR"; mkdir -p "$DIR/logs"
trap cleanup EXIT

dd if=/dev/urandom of="$DIR/raw.img" bs=1M count=$((SIZE_B >> 20)) status=none
for i in 0 1 2 3; do truncate -s $((SIZE_B + (1 << 30))) "$DIR/disk$i.img"; done
for i in 0 1; do truncate -s 3G "$DIR/cache$i.img"; done

start_tessera --iscsi-listen "127.0.0.1:$ISCSI_PORT" --nbd-listen "127.0.0.1:$NBD_PORT" --nbd-insecure
logged setup.log "$T" pool create bench --disk "$DIR/disk0.img" --disk "$DIR/disk1.img" --disk "$DIR/disk2.img" \
  --disk "$DIR/disk3.img" --cache-disk "$DIR/cache0.img" --cache-disk "$DIR/cache1.img"
logged setup.log "$T" target create "$IQN" --allow-any-initiator
lun=0
for v in cached direct; do
  extra=(); [ "$v" = direct ] && extra=(--write-cache-size 0)
  logged setup.log "$T" vdisk create "bench/$v" --size "$SIZE_B" --layout parity --columns 4 --block-size 4096 "${extra[@]}"
  logged setup.log "$T" vdisk import "bench/$v" "$DIR/raw.img"
  logged setup.log "$T" nbd export "bench/$v"
  logged setup.log "$T" target lun add "$IQN" "bench/$v" --lun "$lun"
  lun=$((lun + 1))
done
logged setup.log "$T" pool show bench

# Waits until the pool's write-back cache holds no dirty data (at most 10 minutes).
drained() {
  local i
  for i in $(seq 3000); do
    "$T" --json pool show bench | python3 -c 'import json,sys; sys.exit(json.load(sys.stdin)["cache"]["dirty_bytes"] != 0)' && return
    sleep 0.2
  done
  echo "the cache did not drain" >&2; exit 1
}

OUT=$DIR/results
for run in $(seq "$RUNS"); do
  lun=0
  for v in cached direct; do
    for proto in iscsi nbd; do
      # Each run starts with the log destaged: a run right after the cached vdisk's would
      # otherwise share the disks with the destage of what that one left in the cache.
      drained
      case $proto in
        iscsi) uri=iscsi://127.0.0.1:$ISCSI_PORT/$IQN/$lun;;
        nbd) uri=nbd://127.0.0.1:$NBD_PORT/$v;;
      esac
      "$T" --json bench "$uri" --profile 4k-70-30 -t "$THREADS" -o "$OUTSTANDING" -d "$DURATION" \
        > "$DIR/logs/$run-$v-$proto.json" 2>> "$DIR/logs/bench.log"
      python3 - "$DIR/logs/$run-$v-$proto.json" "$v" "$proto" >> "$OUT" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); r = j["runs"][-1]
print(sys.argv[2], sys.argv[3], r["total"]["iops"], r["read"]["latency"]["p50_us"], r["write"]["latency"]["p50_us"],
      r["write"]["latency"]["p99_us"], r["total"]["latency"]["stdev_us"])
PY
      echo "run $run: $v over $proto: $(tail -1 "$OUT")" >&2
    done
    lun=$((lun + 1))
  done
done
"$T" --json pool show bench > "$DIR/logs/pool.json"

python3 - "$OUT" "$RUNS" "$THREADS" "$OUTSTANDING" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    v, p, *x = line.split()
    rows[(v, p)].append([float(a) for a in x])
print(f"parity 3+1, 4K 70 % read / 30 % write random, {sys.argv[3]} threads x {sys.argv[4]} outstanding, median of {sys.argv[2]} runs")
print("| vdisk | protocol | IOPS | read p50 µs | write p50 µs | write p99 µs | stdev µs |")
print("|---|---|---:|---:|---:|---:|---:|")
for (v, p), xs in sorted(rows.items()):
    m = [statistics.median(c) for c in zip(*xs)]
    name = "write-back cache" if v == "cached" else "no cache"
    print(f"| {name} | {p} | {m[0]:.0f} | {m[1]:.0f} | {m[2]:.0f} | {m[3]:.0f} | {m[4]:.0f} |")
for p in ("iscsi", "nbd"):
    c = statistics.median(x[0] for x in rows[("cached", p)]); d = statistics.median(x[0] for x in rows[("direct", p)])
    print(f"{p}: cache / no cache = {c/d:.2f}")
PY
