#!/usr/bin/env bash
# Engine against fio on the same backing files, in one run.
#
# For each layout (simple, 2-way mirror, parity) it builds a pool on 4 file disks, fills a
# 2 GiB vdisk, then measures through the engine (4 KiB random read and write at queue depth
# 32, 256 KiB sequential read and write), then runs fio (io_uring, O_DIRECT) on the same files
# over the same byte range at the same total queue depth. Each figure is the median of RUNS
# runs; the table gives Tessera / fio. Each layout is also measured on a pool built without
# block checksums (same build, same files): the last column is the cost of checksums, as
# with / without.
#
# Usage: bench/engine.sh   (RUNS=3 SECONDS_PER=10 DIR=/var/tmp/tessera-bench PROFILE=release)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECS=${SECONDS_PER:-10}
DIR=${DIR:-/var/tmp/tessera-bench}
LAYOUTS=${LAYOUTS:-"simple mirror parity"}
source bench/lib.sh
require fio
volume_example enginebench
OUT=$(mktemp)
trap 'rm -rf "$DIR" "$OUT" "$OUT.nosums"' EXIT

fio_run() { # rw bs files size -> iops
  fio --name=ref --ioengine=io_uring --direct=1 --rw="$1" --bs="$2" --iodepth=32 --numjobs=1 \
      --filename="$3" --offset=1M --size="$4" --time_based --runtime="$SECS" --ramp_time=1 \
      --group_reporting --output-format=json \
    | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(j["read"]["iops"]+j["write"]["iops"])'
}

for run in $(seq "$RUNS"); do
  for layout in $LAYOUTS; do
    # Without checksums first, then with, each on fresh files: one figure per workload.
    rm -rf "$DIR"; mkdir -p "$DIR"
    "$BIN" --dir "$DIR" --layout "$layout" --disks 4 --seconds "$SECS" --checksums off > "$DIR/nosums.json"
    while read -r line; do
      case "$line" in *used_per_disk*) continue;; esac
      python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(sys.argv[2], j["workload"], j["iops"])' "$line" "$layout" >> "$OUT.nosums"
    done < "$DIR/nosums.json"
    rm -rf "$DIR"; mkdir -p "$DIR"
    "$BIN" --dir "$DIR" --layout "$layout" --disks 4 --seconds "$SECS" > "$DIR/engine.json"
    used=$(python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "used_per_disk" in l][0]["used_per_disk"])' "$DIR/engine.json")
    files=$(ls "$DIR"/disk* | paste -sd: -)
    while read -r line; do
      case "$line" in *used_per_disk*) continue;; esac
      wl=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["workload"])' "$line")
      iops=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["iops"])' "$line")
      case $wl in randread) rw=randread bs=4k;; randwrite) rw=randwrite bs=4k;; seqread) rw=read bs=256k;; seqwrite) rw=write bs=256k;; esac
      ref=$(fio_run "$rw" "$bs" "$files" "$used")
      echo "$layout $wl $iops $ref $bs" >> "$OUT"
      echo "run $run: $layout $wl tessera=$iops fio=$ref" >&2
    done < "$DIR/engine.json"
  done
done

python3 - "$OUT" "$OUT.nosums" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(lambda: ([], []))
nosums = collections.defaultdict(list)
bs = {}
for line in open(sys.argv[1]):
    layout, wl, t, f, b = line.split()
    rows[(layout, wl)][0].append(float(t)); rows[(layout, wl)][1].append(float(f)); bs[(layout, wl)] = b
for line in open(sys.argv[2]):
    layout, wl, t = line.split()
    nosums[(layout, wl)].append(float(t))
print(f"{'layout':8} {'workload':10} {'tessera':>12} {'fio':>12} {'ratio':>6} {'no sums':>12} {'sums/no':>8}   (IOPS for 4k, MB/s for 256k; median of {len(next(iter(rows.values()))[0])} runs)")
for (layout, wl), (t, f) in rows.items():
    tm, fm, nm = statistics.median(t), statistics.median(f), statistics.median(nosums[(layout, wl)])
    scale = 1 if bs[(layout, wl)] == "4k" else 0.262144
    print(f"{layout:8} {wl:10} {tm*scale:12.0f} {fm*scale:12.0f} {tm/fm:6.2f} {nm*scale:12.0f} {tm/nm:8.2f}")
PY
