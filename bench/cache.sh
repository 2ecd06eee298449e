#!/usr/bin/env bash
# The write-back cache against fio on the same files, and the seed's cache experiment.
#
# 1. Parity 3+1 on 4 file disks, 4 KiB random writes at queue depth 32 for SECONDS_PER
#    seconds: without a cache, and with two cache disks (files in the same directory, so on
#    the same file system and device as the data disks, not on a faster one) and the default
#    1 GiB vdisk cache. With the cache, the rate while it had room and after it filled (the
#    destage rate) are given apart, with the 99.9th percentile and the longest write latency
#    (a writer that waits for room waits for a destage round). fio writes 4 KiB at random to
#    the same data files at the same queue depth in the same run.
# 2. The seed's experiment (a 15-drive RAID 5 group, 64 KiB writes: 4.6 MB/s with the write
#    cache off, 160.9 MB/s with it on): parity as wide as the bench has disks (WIDE disks,
#    WIDE-1 data columns), 64 KiB sequential writes at queue depth QD (the seed does not give
#    its benchmark's queue depth; 4 is the default of the desktop disk benchmarks of its day),
#    without and with the cache. fio writes 64 KiB sequentially to one file the size of the
#    data disks together, at the same queue depth, as the bound for one copy of the data.
#
# With FAST_DIR set (a directory on a faster device; /dev/shm stands in for a journal SSD on a
# machine with one disk), the 4K test is also run with the two cache disks there, to show what
# the cache gives when its log does not share the data disks' device.
#
# Each figure is the median of RUNS runs.
# Usage: bench/cache.sh   (RUNS=3 SECONDS_PER=20 WIDE=8 QD=4 DIR=/var/tmp/tessera-cachebench PROFILE=release FAST_DIR=)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECS=${SECONDS_PER:-20}
WIDE=${WIDE:-8}
QD=${QD:-4}
DIR=${DIR:-/var/tmp/tessera-cachebench}
source bench/lib.sh
require fio
# At most: 4 data disks written to 0.8 GiB each and 2 cache disks of 2 GiB taken whole, or the
# seed's WIDE disks and cache disks, or fio's file of WIDE GiB.
require_space "$DIR" $(( (WIDE > 8 ? WIDE : 8) + 2 ))
[ -z "${FAST_DIR:-}" ] || require_space "$FAST_DIR" 5
volume_example enginebench
OUT=$(mktemp)
FAST_DIR=${FAST_DIR:-}
FAST_CACHE=${FAST_DIR:+$FAST_DIR/tessera-cachebench-log}
trap 'rm -rf "$DIR" "$OUT" ${FAST_CACHE:+"$FAST_CACHE"}' EXIT

field() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print("nan" if v is None else v)' "$1" "$2"; }
fio_run() { # rw bs depth files size -> MB/s and IOPS
  fio --name=ref --ioengine=io_uring --direct=1 --rw="$1" --bs="$2" --iodepth="$3" --numjobs=1 \
      --filename="$4" --offset=1M --size="$5" --time_based --runtime="$SECS" --ramp_time=1 \
      --group_reporting --output-format=json \
    | python3 -c 'import json,sys; w=json.load(sys.stdin)["jobs"][0]["write"]; print(w["bw_bytes"]/1e6, w["iops"])'
}

for run in $(seq "$RUNS"); do
  # 1. parity 3+1, 4K random writes.
  for cache in 0 2; do
    rm -rf "$DIR"; mkdir -p "$DIR"
    line=$("$BIN" --dir "$DIR" --layout parity --disks 4 --seconds "$SECS" --workloads randwrite \
      --cache-disks "$cache" 2>/dev/null | grep '"randwrite"')
    echo "rand4k cache=$cache $(field "$line" iops) $(field "$line" iops_room) $(field "$line" iops_full) $(field "$line" room_seconds) $(field "$line" p999_us) $(field "$line" max_us)" >> "$OUT"
    echo "run $run: parity 3+1 4K randwrite, $cache cache disks: $line" >&2
  done
  if [ -n "$FAST_CACHE" ]; then
    rm -rf "$DIR" "$FAST_CACHE"; mkdir -p "$DIR" "$FAST_CACHE"
    line=$("$BIN" --dir "$DIR" --layout parity --disks 4 --seconds "$SECS" --workloads randwrite \
      --cache-disks 2 --cache-dir "$FAST_CACHE" 2>/dev/null | grep '"randwrite"')
    rm -rf "$FAST_CACHE"
    echo "rand4k cache=fast $(field "$line" iops) $(field "$line" iops_room) $(field "$line" iops_full) $(field "$line" room_seconds) $(field "$line" p999_us) $(field "$line" max_us)" >> "$OUT"
    echo "run $run: parity 3+1 4K randwrite, 2 cache disks in $FAST_DIR: $line" >&2
  fi
  files=$(ls "$DIR"/disk* | paste -sd: -)
  read -r mbs iops < <(fio_run randwrite 4k 32 "$files" 768M)
  echo "rand4k fio $iops" >> "$OUT"
  echo "run $run: fio 4K randwrite on the data files: $iops IOPS" >&2

  # 2. the seed's experiment.
  for cache in 0 2; do
    rm -rf "$DIR"; mkdir -p "$DIR"
    line=$("$BIN" --dir "$DIR" --layout parity --disks "$WIDE" --columns "$WIDE" --disk-size $((1 << 30)) \
      --size $((2 << 30)) --seconds "$SECS" --workloads seqwrite --bs 65536 --threads "$QD" \
      --cache-disks "$cache" 2>/dev/null | grep '"seqwrite"')
    room=$(field "$line" iops_room); full=$(field "$line" iops_full)
    mb() { python3 -c 'import sys; print(float(sys.argv[1]) * 65536 / 1e6)' "$1"; }
    echo "seed64k cache=$cache $(field "$line" mbs) $(mb "$room") $(mb "$full") $(field "$line" room_seconds)" >> "$OUT"
    echo "run $run: parity $((WIDE - 1))+1 64K seqwrite QD$QD, $cache cache disks: $line" >&2
  done
  rm -rf "$DIR"; mkdir -p "$DIR"
  fallocate -l $((WIDE << 30)) "$DIR/one" 2>/dev/null || truncate -s $((WIDE << 30)) "$DIR/one"
  read -r mbs iops < <(fio_run write 64k "$QD" "$DIR/one" $(((WIDE << 30) - (2 << 20))))
  echo "seed64k fio $mbs" >> "$OUT"
  echo "run $run: fio 64K seqwrite QD$QD on one file: $mbs MB/s" >&2
done

python3 - "$OUT" "$WIDE" "$QD" <<'PY'
import sys, statistics, collections, math
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    k1, k2, *vals = line.split()
    rows[(k1, k2)].append([float(v) for v in vals])
def med(key, i):
    xs = [r[i] for r in rows[key] if not math.isnan(r[i])]
    return statistics.median(xs) if xs else float("nan")
n = len(rows[("rand4k", "fio")])
wide, qd = int(sys.argv[2]), sys.argv[3]
fio = med(("rand4k", "fio"), 0)
print(f"parity 3+1, 4 KiB random writes, QD 32 (IOPS, median of {n} runs; fio on the data files: {fio:.0f})")
print(f"{'':28} {'overall':>9} {'/fio':>6} {'room':>9} {'/fio':>6} {'full':>9} {'/fio':>6} {'room s':>7} {'p99.9 ms':>9} {'max ms':>7}")
for c, name in (("cache=0", "no cache"), ("cache=2", "write-back cache (2 files)"), ("cache=fast", "cache on the faster device")):
    if not rows[("rand4k", c)]:
        continue
    o, r, f, s, p999, mx = (med(("rand4k", c), i) for i in range(6))
    print(f"{name:28} {o:9.0f} {o/fio:6.2f} {r:9.0f} {r/fio:6.2f} {f:9.0f} {f/fio:6.2f} {s:7.0f} {p999/1e3:9.1f} {mx/1e3:7.0f}")
fio = med(("seed64k", "fio"), 0)
print()
print(f"the seed's experiment: parity {wide-1}+1, 64 KiB sequential writes, QD {qd} (MB/s, median of {n} runs; fio on one file: {fio:.0f})")
off = med(("seed64k", "cache=0"), 0)
on, room, full = (med(("seed64k", "cache=2"), i) for i in range(3))
print(f"{'cache off':28} {off:9.1f}   ({off/fio:.2f} of fio)     seed: 4.6")
print(f"{'cache on (overall)':28} {on:9.1f}   ({on/fio:.2f} of fio)     seed: 160.9")
print(f"{'  while it had room':28} {room:9.1f}")
print(f"{'  after it filled':28} {full:9.1f}")
print(f"{'on / off':28} {on/off:9.1f}x                  seed: {160.9/4.6:.1f}x")
PY
