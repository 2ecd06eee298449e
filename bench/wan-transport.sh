#!/usr/bin/env bash
# What a plain TCP copy gets across an emulated WAN (tessera-linkem: two network namespaces,
# set bandwidth, RTT and random loss each way): one stream with cubic (the seeds' replication
# products), one with BBR, and STREAMS streams with BBR. It is the peer replication is
# measured against, and the evidence for the transport replication uses.
#
# Needs root (network namespaces, /dev/net/tun) and iproute2.
# Usage: bench/wan-transport.sh   (RUNS=3 WARMUP=3s WINDOW=10s STREAMS=4 PROFILE=release)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
WARMUP=${WARMUP:-3s}
WINDOW=${WINDOW:-10s}
STREAMS=${STREAMS:-4}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}
PROFILE=${PROFILE:-release}
source bench/lib.sh
require ip
cargo build --profile "$PROFILE" -q -p tessera-linkem
L=$CARGO_TARGET_DIR/$(profile_dir)/tessera-linkem
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

# rate rtt loss: the issue's scenarios (100 Mbit/s) and the seed's (10 Mbit/s).
SCENARIOS=("100mbit 90ms 0.1%" "100mbit 90ms 1%" "100mbit 90ms 5%" "10mbit 90ms 1%" "10mbit 90ms 7%")
for s in "${SCENARIOS[@]}"; do
  read -r rate rtt loss <<< "$s"
  for t in "cubic 1" "bbr 1" "bbr $STREAMS"; do
    read -r cc n <<< "$t"
    for run in $(seq "$RUNS"); do
      "$L" measure --rate "$rate" --rtt "$rtt" --loss "$loss" --cc "$cc" --streams "$n" \
        --warmup "$WARMUP" --window "$WINDOW" \
        | python3 -c 'import json,sys; v=json.load(sys.stdin); v["scenario"]=sys.argv[1]; print(json.dumps(v))' "$s" >> "$OUT"
      echo "$s $cc x$n run $run: $(tail -1 "$OUT" | python3 -c 'import json,sys; v=json.load(sys.stdin); print("%.2f Mbit/s" % (v["goodput_bps"]/1e6))')" >&2
    done
  done
done

python3 - "$OUT" "$RUNS" "$STREAMS" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
n = sys.argv[3]
print(f"Goodput across the emulated link, median of {sys.argv[2]} run(s), Mbit/s (share of the link rate):")
print()
print(f"| link | RTT | loss | 1 x cubic | 1 x BBR | {n} x BBR | {n} x BBR / cubic |")
print("|---|---|---|---:|---:|---:|---:|")
order = []
for r in runs:
    if r["scenario"] not in order:
        order.append(r["scenario"])
for s in order:
    rate, rtt, loss = s.split()
    cell = {}
    for key in (("cubic", 1), ("bbr", 1), ("bbr", int(n))):
        g = [r["goodput_bps"] for r in runs if r["scenario"] == s and r["congestion"] == key[0] and r["streams"] == key[1]]
        cell[key] = statistics.median(g)
    link = runs[[r["scenario"] for r in runs].index(s)]["link_rate_bps"]
    fmt = lambda g: f"{g/1e6:.2f} ({g/link:.0%})"
    print(f"| {rate} | {rtt} | {loss} | {fmt(cell[('cubic',1)])} | {fmt(cell[('bbr',1)])} | {fmt(cell[('bbr',int(n))])} | {cell[('bbr',int(n))]/cell[('cubic',1)]:.1f}x |")
PY
