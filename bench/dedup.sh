#!/usr/bin/env bash
# Deduplication on real data, against restic and borg backing up the same files in the same run.
#
# The data sets are built once by bench/dedup-data.sh (and cached):
#   os      Debian root file systems of different package sets, each a raw ext4 image
#   pgdump  five pg_dump files of a table that grows by 1,000 random rows per round (the seed)
#   files   documentation and source trees of the installed packages in one ext4 image
# For each set, a fresh `tessera serve` on 4 sparse file disks: dedup is enabled (minimum age 0,
# no schedule) before the vdisks are made, so they get 4 KiB grains; each file is imported into
# a vdisk of its own (LAYOUT), and one `tessera dedup run --all` is timed. The pgdump set goes
# round by round, as the seed did: import dump N, run, read the savings. restic and borg
# (bench/dedup-peers.sh, each with its defaults) back the same files up.
#
# "saved" is 1 - stored / input for every tool: for Tessera, stored is the bytes of the distinct
# slots the vdisks point at (zeros take none), input the files' size. "MB/s" is input / seconds:
# for Tessera the optimization run only (the data is in the pool already, as post-process dedup
# finds it), for the peers the whole backup.
#
# Then rehydration: the first OS image is imported again into a vdisk left out of dedup (same
# layout and grain size), and fio (nbd engine) reads 256 KiB sequentially and 4 KiB at random
# from both over NBD: optimized / not, in RH_PAIRS pairs of RH_SECONDS-second runs, with the
# daemon's CPU time per request beside each.
#
# COMPRESSION=zstd|lz4|balanced|off sets how grains with no duplicate are stored.
# TESSERA_BIN=path skips the cargo build. KEEP=1 keeps $DIR.
# Usage: bench/dedup.sh   (SETS="os pgdump files" LAYOUT=mirror DIR=/var/tmp/tessera-bench-dedup
#          COMPRESSION=balanced RH_PAIRS=9 RH_SECONDS=3 PROFILE=release TESSERA_BIN= KEEP=0 PERF=)
set -euo pipefail
cd "$(dirname "$0")/.."
SETS=${SETS:-"os pgdump files"}
LAYOUT=${LAYOUT:-mirror}
DIR=${DIR:-/var/tmp/tessera-bench-dedup}
COMPRESSION=${COMPRESSION:-balanced}
RH_PAIRS=${RH_PAIRS:-9}
RH_SECONDS=${RH_SECONDS:-3}
NBD_PORT=${NBD_PORT:-10829}
source bench/lib.sh
require fio python3 restic borg
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "this fio has no nbd engine" >&2; exit 1; }
tessera_binary
mkdir -p "$DIR"
# The daemon's user and system CPU time so far, in clock ticks.
daemon_cpu_ticks() { awk '{print $14 + $15}' "/proc/$(cat "$DIR/tessera.pid")/stat"; }
stop_tessera() { kill "$(cat "$DIR/tessera.pid" 2>/dev/null)" 2>/dev/null || true; sleep 1; }
trap 'stop_tessera; [ "${KEEP:-0}" = 1 ] || rm -rf "$DIR"' EXIT

bench/dedup-data.sh > "$DIR/data.list"
files_of() { awk -v s="$1" '$1 == s {print $2}' "$DIR/data.list"; }
bytes_of() { awk -v s="$1" '$1 == s {n += $3} END {printf "%.0f\n", n}' "$DIR/data.list"; }
# A set at a time: its files imported into mirrored vdisks (two copies of what is not zero
# until the optimization), the restic and borg repositories, scratch.
require_space "$DIR" $(( $(for set in $SETS; do bytes_of "$set"; done | sort -n | tail -1) * 3 / (1 << 30) + 1 ))
json() { python3 -c 'import json,sys; d=json.load(sys.stdin)
for k in sys.argv[1].split("."): d=d[k]
print(d)' "$1"; }

# A fresh daemon and pool, disks big enough for the set unshared and twice over (mirror).
fresh_pool() {
  stop_tessera
  rm -rf "$DIR/state" "$DIR/disks" "$DIR/logs"; mkdir -p "$DIR/disks" "$DIR/logs"
  local per=$(( ($1 * 2 / 4 / (1 << 30) + 4) ))
  for i in 0 1 2 3; do truncate -s "${per}G" "$DIR/disks/d$i.img"; done
  start_tessera --iscsi-listen none --nbd-listen "127.0.0.1:$NBD_PORT" --nbd-insecure
  logged setup.log "$T" pool create bench $(for i in 0 1 2 3; do echo --disk "$DIR/disks/d$i.img"; done)
  logged setup.log "$T" dedup enable bench --min-age 0 --schedule 0 --compression "$COMPRESSION"
}

import_file() { logged setup.log "$T" vdisk import "bench/$1" "$2" --layout "$LAYOUT"; }

# Runs dedup; prints "SECONDS SCANNED_BYTES". With PERF=PREFIX, `perf record` samples the
# daemon during each run into PREFIX.SECONDS (for `perf report -i`; the run is a little slower).
dedup_run() {
  local t0 t1 perf_pid=""
  if [ -n "${PERF:-}" ]; then
    perf record -q -o "$PERF.$(date +%s)" -p "$(cat "$DIR/tessera.pid")" >/dev/null 2>&1 &
    perf_pid=$!
    sleep 0.5
  fi
  t0=$(date +%s.%N)
  logged run.log "$T" dedup run bench --all
  t1=$(date +%s.%N)
  if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; fi
  echo "$(echo "$t1 - $t0" | bc -l) $("$T" --json job list | python3 -c 'import json,sys
j=[x for x in json.load(sys.stdin) if x["kind"]=="dedup"][-1]; print(j["result"]["bytes_scanned"])')"
}

# peer TOOL SET -> "saved mb_per_s" of the whole set; the dumps go one backup per round, as
# the seed's did, each round's line kept in $DIR/pgdump.TOOL.
peer() {
  local each=; [ "$2" = pgdump ] && each=--each
  bench/dedup-peers.sh $each "$1" $(files_of "$2") > "$DIR/$2.$1"
  tail -1 "$DIR/$2.$1" | python3 -c 'import json,sys
d=json.load(sys.stdin); print(d["saved"], d["mb_per_s"])'
}

declare -A RESULT
for set in $SETS; do
  input=$(bytes_of "$set")
  [ "$input" -gt 0 ] || { echo "no data for set $set" >&2; exit 1; }
  fresh_pool "$input"
  if [ "$set" = pgdump ]; then
    n=0; rounds=""; acc=0
    for f in $(files_of pgdump); do
      n=$((n + 1)); acc=$((acc + $(stat -c %s "$f")))
      import_file "dump$n" "$f"
      read -r secs scanned < <(dedup_run)
      phys=$("$T" --json dedup status bench | json physical_bytes)
      rounds+="$n $acc $phys $secs"$'\n'
    done
    echo "$rounds" > "$DIR/pgdump.rounds"
  else
    n=0
    for f in $(files_of "$set"); do n=$((n + 1)); import_file "$set$n" "$f"; done
    read -r secs scanned < <(dedup_run)
    phys=$("$T" --json dedup status bench | json physical_bytes)
  fi
  "$T" --json dedup status bench > "$DIR/$set.status.json"
  RESULT[$set]="$input $phys $secs $scanned"
  RESULT[$set-restic]=$(peer restic "$set")
  RESULT[$set-borg]=$(peer borg "$set")
  if [ "$set" = os ]; then
    # Rehydration: the first image optimized (os1) against the same image not deduplicated.
    first=$(files_of os | head -1)
    "$T" dedup enable bench --min-age 0 --schedule 0 --compression "$COMPRESSION" --exclude plain >/dev/null
    logged setup.log "$T" vdisk import bench/plain "$first" --layout "$LAYOUT" --grain 4K
    logged setup.log "$T" nbd export bench/os1
    logged setup.log "$T" nbd export bench/plain
    # Pairs of short runs, the two vdisks one right after the other and in turn first, so that
    # a change in the machine's speed (it is shared) falls on both sides of a pair; each line
    # also has the daemon's CPU time per request, which such changes move far less than IOPS.
    for pair in $(seq "$RH_PAIRS"); do
      order="os1 plain"; [ $((pair % 2)) = 0 ] && order="plain os1"
      for w in "read 256k 8" "randread 4k 32"; do
        set -- $w
        for v in $order; do
          c0=$(daemon_cpu_ticks)
          r=$(fio --name=r --ioengine=nbd --uri="nbd://127.0.0.1:$NBD_PORT/$v" --rw="$1" --bs="$2" \
                --iodepth="$3" --time_based --runtime="$RH_SECONDS" --output-format=json \
            | python3 -c 'import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index("{"):])["jobs"][0]["read"]
print(r["bw_bytes"]/1e6, r["iops"], r["total_ios"])')
          RESULT[rh-$v-$1]+="$r $(( $(daemon_cpu_ticks) - c0 ))"$'\n'
        done
      done
    done
  fi
done

COMPRESSION=$COMPRESSION python3 - "$DIR" <<'EOF' "${!RESULT[@]}" -- "${RESULT[@]}"
import json, statistics, sys
d = sys.argv[1]
args = sys.argv[2:]
i = args.index("--")
res = dict(zip(args[:i], args[i + 1:]))
seed = {"os": "98 % (3 TB of VHDs, Windows Server 2012)", "pgdump": "rising per round (EMC Avamar)",
        "files": "28 % (900 GB file share)"}
print(f"compression: {__import__('os').environ.get('COMPRESSION', 'zstd')}\n")
print("| set | input | Tessera saved | MB/s | restic saved | MB/s | borg saved | MB/s | seed |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
for s in ["os", "pgdump", "files"]:
    if s not in res:
        continue
    inp, phys, secs, scanned = (float(x) for x in res[s].split())
    rs, rm = (float(x) for x in res[s + "-restic"].split())
    bs, bm = (float(x) for x in res[s + "-borg"].split())
    print(f"| {s} | {inp/1e9:.2f} GB | {100*(1-phys/inp):.1f} % | {inp/1e6/secs:.0f} | {100*rs:.1f} % | {rm:.0f} | "
          f"{100*bs:.1f} % | {bm:.0f} | {seed[s]} |")
if "os" in res:
    st = json.load(open(f"{d}/os.status.json"))
    idx = st["index"]
    unique = idx["entries"] * 4096
    print(f"\nos set: Tessera's own ratio (saved / mapped logical bytes) {100*st['saved_ratio']:.1f} %; "
          f"fingerprint index: {idx['entries']} entries ({unique/2**30:.2f} GiB of unique 4 KiB grains), "
          f"compressed {st.get('compressed_bytes', 0)/1e9:.2f} GB into {st.get('packed_bytes', 0)/1e9:.2f} GB "
          f"({st.get('compression_ratio', 0):.2f}x); "
          f"{st.get('hot_copies', 0)} hot blocks kept twice ({st.get('hot_copy_bytes', 0)/2**20:.1f} MiB, simple layout only); "
          f"{idx['memory_bytes']/2**20:.1f} MiB in memory, {idx['disk_bytes']/2**20:.1f} MiB on disk. Its memory "
          f"is bounded by two 16 MiB memtables and its 64 MiB block cache: at most 96 MiB whatever it holds, "
          f"so at most 96 MiB per TiB of unique data (target 256)")
try:
    rounds = [l.split() for l in open(f"{d}/pgdump.rounds") if l.strip()]
    peers = {t: [json.loads(l) for l in open(f"{d}/pgdump.{t}") if l.strip()] for t in ["restic", "borg"]}
    print("\n| dump round | input so far | Tessera stored | Tessera saved | restic saved | borg saved |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i, (n, acc, phys, _) in enumerate(rounds):
        r, b = peers["restic"][i]["saved"], peers["borg"][i]["saved"]
        print(f"| {n} | {int(acc)/1e6:.2f} MB | {int(phys)/1e6:.2f} MB | {100*(1-int(phys)/int(acc)):.1f} % | "
              f"{100*r:.1f} % | {100*b:.1f} % |")
except FileNotFoundError:
    pass
if "rh-os1-read" in res:
    tick_us = 1e6 / __import__("os").sysconf("SC_CLK_TCK")
    print("\n| rehydration (fio over NBD) | optimized | not deduplicated | ratio, median of the pairs (range) "
          "| daemon CPU per request, optimized / not (µs) |")
    print("|---|---:|---:|---:|---:|")
    for w, col, unit in [("read", 0, "MB/s"), ("randread", 1, "IOPS")]:
        runs = {v: [[float(x) for x in l.split()] for l in res[f"rh-{v}-{w}"].strip().split("\n")]
                for v in ["os1", "plain"]}
        a = statistics.median(r[col] for r in runs["os1"])
        b = statistics.median(r[col] for r in runs["plain"])
        ratios = [x[col] / y[col] for x, y in zip(runs["os1"], runs["plain"])]
        cpu = {v: statistics.median(r[3] * tick_us / r[2] for r in runs[v]) for v in runs}
        label = "256K sequential read" if w == "read" else "4K random read"
        print(f"| {label} ({unit}) | {a:.0f} | {b:.0f} | {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f} to {max(ratios):.2f}) | {cpu['os1']:.1f} / {cpu['plain']:.1f} |")
EOF
