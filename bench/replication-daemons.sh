#!/usr/bin/env bash
# Replication as an administrator runs it: two `tessera serve` daemons, one per network
# namespace, joined by an emulated WAN (tessera-linkem run), a replica created with
# `tessera replica create` and a full cycle run with `tessera replica sync`; against a plain
# TCP copy with cubic across a link of the same shape in the same run.
#
# The cycle's goodput is the data it sent over the whole cycle, TLS handshake and slow start
# included (`tessera replica show`'s figures), on a vdisk holding as much incompressible data
# as the link carries in SECONDS_OF_DATA. Needs root (namespaces, /dev/net/tun) and iproute2.
#
# Usage: bench/replication-daemons.sh   (RUNS=3 SECONDS_OF_DATA=15 STREAMS=1 PROFILE=release)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECS=${SECONDS_OF_DATA:-15}
STREAMS=${STREAMS:-1}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}
PROFILE=${PROFILE:-release}
source bench/lib.sh
require ip
tessera_binary
cargo build --profile "$PROFILE" -q -p tessera-linkem
L=$CARGO_TARGET_DIR/$(profile_dir)/tessera-linkem
DIR=$(mktemp -d /var/tmp/tessera-replication-daemons.XXXXXX)
OUT=${OUT:-/var/tmp/tessera-replication-daemons.jsonl}
: > "$OUT"
NS=trd$$
PIDS=()

stop_all() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
  if [ -n "${LINK_PID:-}" ]; then
    echo quit >&"${LINK[1]}" 2>/dev/null || true
    wait "$LINK_PID" 2>/dev/null || true
    LINK_PID=
  fi
}
trap 'stop_all; rm -rf "$DIR"' EXIT

# The daemon of side a or b, inside its namespace.
daemon() {
  local side=$1 addr=$2 pool=$3 size=$4
  mkdir -p "$DIR/$side/disks"
  cat > "$DIR/$side.toml" <<EOF
replication_listen = "$addr:3262"
replication_psk_file = "$DIR/replication.psk"
iscsi_listen = "none"
nbd_listen = "none"
nbd_unix_socket = "none"
EOF
  ip netns exec "$NS-$side" "$T" serve --state-dir "$DIR/$side/state" --config "$DIR/$side.toml" \
    --api-listen none > "$DIR/$side.log" 2>&1 &
  PIDS+=($!)
  local sock=$DIR/$side/state/api.sock i
  for i in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
  local disks=() d
  for d in 0 1 2; do
    truncate -s "$size" "$DIR/$side/disks/d$d.img"
    disks+=(--disk "$DIR/$side/disks/d$d.img")
  done
  TESSERA_API=unix:$sock "$T" pool create "$pool" "${disks[@]}" > /dev/null
}

SCENARIOS=("100mbit 90ms 1%" "100mbit 90ms 5%" "10mbit 90ms 7%")
for s in "${SCENARIOS[@]}"; do
  read -r rate rtt loss <<< "$s"
  bits=$(python3 -c 'import sys; r=sys.argv[1].lower(); m={"kbit":1e3,"mbit":1e6,"gbit":1e9}; print(int(float(r[:-4])*m[r[-4:]]))' "$rate")
  bytes=$(( bits / 8 * SECS ))
  head -c "$bytes" /dev/urandom > "$DIR/image.raw"
  for run in $(seq "$RUNS"); do
    coproc LINK { exec "$L" run --name "$NS" --rate "$rate" --rtt "$rtt" --loss "$loss"; }
    LINK_PID=$LINK_PID
    read -r _ <&"${LINK[0]}"
    rm -rf "$DIR/a" "$DIR/b"
    daemon b 10.99.0.2 q $(( bytes * 4 + (1 << 30) ))
    daemon a 10.99.0.1 p $(( bytes * 4 + (1 << 30) ))
    A="env TESSERA_API=unix:$DIR/a/state/api.sock $T"
    $A vdisk import p/db "$DIR/image.raw" --layout simple > /dev/null
    $A replica create p/db --to 10.99.0.2:3262 --target-pool q --name wan --interval 0 --streams "$STREAMS" > /dev/null
    $A --json replica sync wan > "$DIR/job.json"
    $A --json replica show wan > "$DIR/replica.json"
    stop_all
    cubic=$("$L" measure --rate "$rate" --rtt "$rtt" --loss "$loss" --cc cubic --warmup 3s --window 10s)
    python3 - "$s" "$bits" "$DIR/replica.json" "$cubic" >> "$OUT" <<'PY'
import json, sys
scenario, bits, rep, cubic = sys.argv[1], int(sys.argv[2]), json.load(open(sys.argv[3])), json.loads(sys.argv[4])
c = rep["last_cycle"]
bps = c["sent_bytes"] * 8 / c["seconds"]
print(json.dumps({"scenario": scenario, "rate_bps": bits, "replication_bps": bps, "cubic_bps": cubic["goodput_bps"],
                  "ratio": bps / max(cubic["goodput_bps"], 1), "seconds": c["seconds"], "sent_bytes": c["sent_bytes"],
                  "wire_bytes": c["wire_bytes"], "link": c["link"]}))
PY
    echo "$s run $run: $(tail -1 "$OUT" | python3 -c 'import json,sys; v=json.load(sys.stdin); print("daemons %.2f Mbit/s (rtt %.0f ms, %.2f%% retransmitted), cubic %.2f Mbit/s" % (v["replication_bps"]/1e6, v["link"]["rtt_ms"], v["link"]["retransmit_percent"], v["cubic_bps"]/1e6))')" >&2
  done
done

python3 - "$OUT" "$RUNS" "$STREAMS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"Replication between two daemons across the emulated link (a full cycle, 'tessera replica sync', {sys.argv[3]} stream(s)), median of {sys.argv[2]} run(s):")
print()
print("| link | RTT | loss | daemons' cycle Mbit/s (of the link) | 1 x cubic copy Mbit/s | replication / cubic |")
print("|---|---|---|---:|---:|---:|")
order = []
for r in rows:
    if r["scenario"] not in order:
        order.append(r["scenario"])
for s in order:
    rs = [r for r in rows if r["scenario"] == s]
    rate, rtt, loss = s.split()
    rep = statistics.median(r["replication_bps"] for r in rs)
    cub = statistics.median(r["cubic_bps"] for r in rs)
    ratio = statistics.median(r["ratio"] for r in rs)
    print(f"| {rate} | {rtt} | {loss} | {rep/1e6:.2f} ({rep/rs[0]['rate_bps']:.0%}) | {cub/1e6:.2f} | {ratio:.1f}x |")
PY
