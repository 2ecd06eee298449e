#!/usr/bin/env bash
# Replication across an emulated WAN (tessera-linkem), against a plain TCP copy with cubic on
# the same link in the same run (the seeds' replication products' situation), and the bytes
# an incremental cycle puts on the wire after 1 % of a vdisk changed.
#
# Each WAN run: a vdisk of as much incompressible data as the link carries in SECONDS is
# replicated (full cycle, TLS with a pre-shared key, BBR) from one namespace to the other;
# then a cubic copy runs 3 s + 10 s across the same link. Goodput = data bytes / cycle time.
# Needs root (namespaces, /dev/net/tun) and iproute2.
#
# Usage: bench/replication.sh   (RUNS=3 SECONDS_OF_DATA=15 SIZE_GIB=4 PROFILE=release)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECS=${SECONDS_OF_DATA:-15}
SIZE_GIB=${SIZE_GIB:-4}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}
PROFILE=${PROFILE:-release}
source bench/lib.sh
require ip
cargo build --profile "$PROFILE" -q -p tessera-replication --example wanbench
W=$CARGO_TARGET_DIR/$(profile_dir)/examples/wanbench
# Each run's figures, one JSON line each: kept, so that a run that fails late loses nothing.
OUT=${OUT:-/var/tmp/tessera-replication-bench.jsonl}
: > "$OUT"

SCENARIOS=("100mbit 90ms 0.1%" "100mbit 90ms 1%" "100mbit 90ms 5%" "10mbit 90ms 1%" "10mbit 90ms 7%")
for s in "${SCENARIOS[@]}"; do
  read -r rate rtt loss <<< "$s"
  for run in $(seq "$RUNS"); do
    "$W" wan --rate "$rate" --rtt "$rtt" --loss "$loss" --seconds "$SECS" \
      | python3 -c 'import json,sys; v=json.load(sys.stdin); v["scenario"]=sys.argv[1]; print(json.dumps(v))' "$s" >> "$OUT"
    echo "$s run $run: $(tail -1 "$OUT" | python3 -c 'import json,sys; v=json.load(sys.stdin); print("replication %.2f Mbit/s, cubic %.2f Mbit/s" % (v["replication_bps"]/1e6, v["cubic_bps"]/1e6))')" >&2
  done
done
for w in 64k 4k; do
  "$W" incremental --size-gib "$SIZE_GIB" --changed 1% --write "$w" >> "$OUT"
  echo "incremental, ${w} writes: $(tail -1 "$OUT")" >&2
done

python3 - "$OUT" "$RUNS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
wan = [r for r in rows if "scenario" in r]
inc = [r for r in rows if "scenario" not in r]
print(f"Replication across the emulated link, median of {sys.argv[2]} run(s):")
print()
print("| link | RTT | loss | replication Mbit/s (of the link) | 1 x cubic copy Mbit/s | replication / cubic |")
print("|---|---|---|---:|---:|---:|")
order = []
for r in wan:
    if r["scenario"] not in order:
        order.append(r["scenario"])
for s in order:
    rs = [r for r in wan if r["scenario"] == s]
    rate, rtt, loss = s.split()
    rep = statistics.median(r["replication_bps"] for r in rs)
    cub = statistics.median(r["cubic_bps"] for r in rs)
    ratio = statistics.median(r["ratio"] for r in rs)
    print(f"| {rate} | {rtt} | {loss} | {rep/1e6:.2f} ({rep/rs[0]['rate_bps']:.0%}) | {cub/1e6:.2f} | {ratio:.1f}x |")
print()
print("Incremental cycle after 1 % of the vdisk changed (distinct aligned writes):")
print()
print("| vdisk | writes of | changed | on the wire | wire / changed |")
print("|---|---|---:|---:|---:|")
for r in inc:
    print(f"| {r['size_bytes']>>30} GiB | {r['write_bytes']>>10} KiB | {r['changed_bytes']/2**20:.1f} MiB | {r['wire_bytes']/2**20:.1f} MiB | {r['wire_over_changed']:.3f} |")
PY
