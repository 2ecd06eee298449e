#!/usr/bin/env bash
# The online metadata scan and spot-fix at scale, beside the seed's chkdsk figures.
#
# A pool on 4 sparse file disks gets a vdisk of 4 KiB grains with GRAINS grains mapped by a
# metadata-only fill (slots taken and counted as writes would, no data written: the scan reads
# metadata only), a 1 GiB mirror vdisk holding real data, and ORPHANS orphan slots injected
# (counted as used, referred to by nothing). Then, with 4 KiB random reads running on the data
# vdisk the whole time: reads alone, a scan, a spot-fix of every finding, a second scan. Each
# figure is the median of RUNS runs; read IOPS during the scan and the spot-fix are given as a
# ratio to the IOPS of the reads alone, measured in the same run.
#
# Usage: bench/scan.sh   (RUNS=3 GRAINS=10000000 ORPHANS=1000000 SECONDS_PER=10
#                         DIR=/var/tmp/tessera-scanbench PROFILE=release THREADS=16)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
GRAINS=${GRAINS:-10000000}
ORPHANS=${ORPHANS:-1000000}
SECS=${SECONDS_PER:-10}
THREADS=${THREADS:-16}
DIR=${DIR:-/var/tmp/tessera-scanbench}
source bench/lib.sh
volume_example scanbench
OUT=$(mktemp)
trap 'rm -rf "$DIR" "$OUT"' EXIT

for run in $(seq "$RUNS"); do
  rm -rf "$DIR"; mkdir -p "$DIR"
  "$BIN" --dir "$DIR" --grains "$GRAINS" --orphans "$ORPHANS" --seconds "$SECS" --threads "$THREADS" >> "$OUT"
  echo "run $run: $(tail -1 "$OUT")" >&2
done

python3 - "$OUT" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = lambda k: statistics.median(r[k] for r in runs)
ratio = lambda k: statistics.median(r[k] / r["base_iops"] for r in runs)
for r in runs:
    assert r["orphans_found"] == r["orphans"] and r["fixed"] == r["findings"] and r["rescan_findings"] == 0, r
print(f"{len(runs)} run(s); medians. {runs[0]['grains']:,} mapped grain entries, {runs[0]['orphans']:,} orphan slots injected.")
print()
print("| | Tessera | target | Windows Server 2012 chkdsk (seed) |")
print("|---|---:|---:|---|")
print(f"| scan, online | {med('scan_seconds'):.1f} s | <= 60 s | 10,000,000 files: scanned and repaired in 16 min 48 s (Server 2008: > 24 h offline) |")
print(f"| 4K random reads during the scan | {ratio('scan_iops'):.2f}x of {med('base_iops'):,.0f} IOPS alone | >= 0.7x | (volume online) |")
print(f"| spot-fix of every orphan | {med('spotfix_seconds'):.1f} s | <= 30 s | 1,000,000 orphaned files: scanned online, repaired offline in 12 min 6 s (Server 2008: > 24 h offline) |")
print(f"| 4K random reads during the spot-fix | {ratio('spotfix_iops'):.2f}x | | |")
print(f"| second scan (nothing found) | {med('rescan_seconds'):.1f} s | | |")
print(f"| metadata-only fill of the grains | {med('fill_seconds'):.1f} s | | |")
PY
