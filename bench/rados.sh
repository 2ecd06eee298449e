#!/usr/bin/env bash
# Tessera serving a pool on Ceph RADOS against librbd on an RBD image of the same RADOS pool,
# in one run, on a loopback cluster that this script starts (scripts/ceph-dev.sh: one
# monitor, one manager, OSDS BlueStore OSDs on sparse files, and etcd).
#
# Both sides hold SIZE of data in the same RADOS pool: an RBD image filled by `rbd bench`
# (sequential 4M writes), and a Tessera vdisk (layout simple on the pool's one disk in the
# cluster, 4 KiB blocks) filled by fio over NBD the same way, so no read lands on unwritten
# space. Then RUNS times, for each workload, DURATION seconds each:
#
#   fio's rbd engine on the image (librbd in fio's process: no network hop of its own), at
#   librbd's defaults (its cache on, policy writearound: a write is answered when sent),
#   fio's rbd engine with `rbd_cache = false`, as tcmu-runner, the Ceph iSCSI gateway, runs
#   librbd (a write is answered once the OSDs applied it, as Tessera answers it: a gateway
#   that dies must not take answered writes with it; docs/scale-out.md),
#   fio's nbd engine on Tessera over NBD on 127.0.0.1 (the same client, one hop more),
#   fio's nbd engine on qemu-nbd serving the RBD image through librbd (the same hop, a peer
#   gateway: what the hop itself costs), started for its run only, on the image fio rbd
#   used just before (one client at a time holds its exclusive lock),
#   `tessera bench` on Tessera over iSCSI on 127.0.0.1 (fio has no iSCSI engine here),
#   `rbd bench` on the image (the reference the Ceph project ships), same size and depth,
#
#   4K random read QD32, 4K random write QD32, 256K sequential read QD8, 256K sequential
#   write QD8;
#
# and `tessera bench` with 4K random writes through (-Sh, the seeds' diskspd -h: FUA), QD32,
# over iSCSI and NBD, beside the same over NBD written back (-Su), against fio rbd without
# librbd's cache (which answers a write once the OSDs have it: the same promise).
#
# Prints a markdown table of medians (IOPS for 4K, MiB/s for 256K) and Tessera / fio-rbd (with
# and without librbd's cache) and Tessera / qemu-nbd, how many operations the OSDs did per I/O of each fio run (their
# perf counters), and the CPU time each 4K I/O cost the OSDs, the gateway (Tessera's daemon,
# qemu-nbd; none for librbd in fio's process) and the client (fio, `tessera bench`): what the
# hop costs, on a machine whose cores all of them share.
#
# Needs: ceph-mon, ceph-osd, ceph-mgr, ceph-common (rbd), etcd, fio (with its rbd and nbd
# engines), qemu-nbd with qemu-block-extra (its rbd driver), python3. The tessera binary
# needs the `rados` feature: by default a release build of it, as the other benchmarks build
# theirs (after them, only Tessera's crates are built again, with the feature);
# PROFILE=test reuses the test suite's build instead (Tessera's own code at opt-level 1: on
# 2026-11-30 no measurable difference: 4K writes over NBD, test build 4,602 IOPS and 79 µs
# of the daemon's CPU each, release build 4,281 and 82, medians of five rounds in turn; the
# daemon's time is librados' and the kernel's). TESSERA_BIN=path skips the build. KEEP=1 keeps DIR.
#
# Usage: bench/rados.sh   (RUNS=3 SIZE=2G DURATION=10 OSDS=1 OSD_SIZE=20G DIR=/var/tmp/tessera-bench-rados
#          PROFILE=release TESSERA_BIN= KEEP=0 TESSERA_PORT=13819 QEMU_NBD_PORT=13820)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SIZE=${SIZE:-2G}
DURATION=${DURATION:-10}
OSDS=${OSDS:-1}
DIR=${DIR:-/var/tmp/tessera-bench-rados}
TESSERA_PORT=${TESSERA_PORT:-13819}
QEMU_NBD_PORT=${QEMU_NBD_PORT:-13820}
KEEP=${KEEP:-0}
RPOOL=bench

source bench/lib.sh
require fio rbd ceph python3 numfmt etcd qemu-nbd
ls /usr/lib/*/qemu/block-rbd.so > /dev/null 2>&1 ||
  { echo "qemu-nbd has no rbd driver: install qemu-block-extra" >&2; exit 1; }
fio --enghelp 2>/dev/null | grep -qw rbd || { echo "this fio has no rbd engine" >&2; exit 1; }
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "this fio has no nbd engine" >&2; exit 1; }

if [ -n "${TESSERA_BIN:-}" ]; then
  T=$TESSERA_BIN
else
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}
  PROFILE=${PROFILE:-release}
  if [ "$PROFILE" = test ]; then
    # The workspace with the features `make test` builds it with: no second build of RocksDB.
    cargo build --workspace --tests --profile test -q \
      --features tessera-rados/librados,tessera-ownership/fencing,tessera-cli/rados
  else
    cargo build --profile "$PROFILE" -q -p tessera-cli --features tessera-cli/rados
  fi
  T=$CARGO_TARGET_DIR/$(profile_dir)/tessera
fi

SIZE_B=$(numfmt --from=iec "$SIZE")
T_URI=nbd://127.0.0.1:$TESSERA_PORT/vol
Q_URI=nbd://127.0.0.1:$QEMU_NBD_PORT/img
IQN=iqn.2026-11.io.tessera:bench-rados

cleanup() {
  set +e
  stop_qemu_nbd
  if [ -f "$DIR/tessera.pid" ]; then kill "$(cat "$DIR/tessera.pid")" 2>/dev/null; wait "$(cat "$DIR/tessera.pid")" 2>/dev/null; fi
  scripts/ceph-dev.sh down "$DIR/cluster" > /dev/null 2>&1
  if [ "$KEEP" = 1 ]; then echo "kept $DIR" >&2; else rm -rf "$DIR"; fi
}
stop_qemu_nbd() {
  [ -f "$DIR/qemu-nbd.pid" ] || return 0
  local pid; pid=$(cat "$DIR/qemu-nbd.pid")
  kill "$pid" 2>/dev/null
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$DIR/qemu-nbd.pid"
}
ports_free "$TESSERA_PORT" "$QEMU_NBD_PORT"
[ ! -e "$DIR/cluster/ceph.conf" ] || scripts/ceph-dev.sh down "$DIR/cluster" > /dev/null 2>&1 || true
rm -rf "$DIR"; mkdir -p "$DIR/logs"
trap cleanup EXIT
# Each OSD's sparse block file (scripts/ceph-dev.sh, OSD_SIZE) grows as BlueStore writes and
# does not shrink when it frees: a run of this bench can fill all of it. A full disk under the
# OSD aborts it and hangs every client, so the room is checked first.
osd_bytes=$(numfmt --from=iec "${OSD_SIZE:-20G}")
avail=$(df --output=avail -B1 "$DIR" | tail -1)
if [ "$avail" -lt $((OSDS * osd_bytes)) ]; then
  echo "bench/rados.sh: $OSDS OSD(s) of OSD_SIZE=${OSD_SIZE:-20G} each need $(numfmt --to=iec $((OSDS * osd_bytes))) free under $DIR, which has $(numfmt --to=iec "$avail"); free some, set DIR elsewhere, or set a smaller OSD_SIZE (a few times SIZE)" >&2
  exit 1
fi

echo "starting a Ceph cluster of $OSDS OSD(s) and etcd" >&2
logged cluster.log scripts/ceph-dev.sh up "$DIR/cluster" "$OSDS"
CONF=$DIR/cluster/ceph.conf
ETCD=$(sed -n 's/^ETCD_ENDPOINTS=//p' "$DIR/cluster/env")
logged cluster.log timeout 120 ceph -c "$CONF" osd pool create "$RPOOL"
logged cluster.log timeout 120 rbd -c "$CONF" pool init "$RPOOL"
logged cluster.log timeout 120 rbd -c "$CONF" create "$RPOOL/img" --size "$((SIZE_B >> 20))M"
# librbd as tcmu-runner runs it: without its cache.
sed 's/^\[client\]$/[client]\nrbd_cache = false/' "$CONF" > "$DIR/nocache.conf"
grep -q '^rbd_cache = false' "$DIR/nocache.conf" || { echo "cannot make $DIR/nocache.conf" >&2; exit 1; }

cat > "$DIR/tessera.toml" <<EOF
[gateway]
name = "bench"
etcd = ["$ETCD"]
EOF
# Plain NBD on loopback: TLS would measure OpenSSL, not the server.
start_tessera --config "$DIR/tessera.toml" --iscsi-listen 127.0.0.1:0 \
  --nbd-listen "127.0.0.1:$TESSERA_PORT" --nbd-insecure
PORTAL=$(sed -n 's/^ *iSCSI portal: //p' "$DIR/logs/tessera.out" | head -1)
TPID=$(cat "$DIR/tessera.pid")
logged tessera-setup.log "$T" pool create tb --rados "$RPOOL" --ceph-conf "$CONF" \
  --capacity "$((SIZE_B * 2 + (1 << 30)))"
logged tessera-setup.log "$T" vdisk create tb/vol --size "$SIZE_B" --layout simple --block-size 4096
logged tessera-setup.log "$T" nbd export tb/vol
logged tessera-setup.log "$T" target create "$IQN" --allow-any-initiator
logged tessera-setup.log "$T" target lun add "$IQN" tb/vol

echo "filling both sides with $SIZE" >&2
logged fill.log timeout 1800 rbd -c "$CONF" bench --io-type write --io-pattern seq --io-size 4M \
  --io-threads 8 --io-total "$SIZE_B" "$RPOOL/img"
logged fill.log fio --name=fill --ioengine=nbd --uri="$T_URI" --rw=write --bs=4M --iodepth=8 \
  --size="$SIZE_B" --buffer_pattern=0xa5

TICK=$(getconf CLK_TCK)
ticks() { # PID... -> the CPU time (user + system, clock ticks) those processes used so far
  local p t=0 n
  for p in "$@"; do
    n=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null) || n=0
    t=$((t + ${n:-0}))
  done
  echo "$t"
}
osd_pids() { cat "$DIR"/cluster/run/osd.*.pid; }
# run_timed OUT COMMAND...: runs COMMAND with its output in OUT; prints the CPU seconds (user +
# system) it used, every thread of it (fio reports only its job thread's, not librbd's).
run_timed() {
  local out=$1; shift
  # `times` writes the locale's decimal mark: a comma is made a point for awk.
  { "$@" > "$out"; times; } | tail -1 | tr , . |
    awk '{ split($1, u, "m"); split($2, s, "m"); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }'
}
# cpu_per_io LOG OSD_TICKS GATEWAY_TICKS CLIENT_SECONDS IOS: writes "osd gateway client" (µs of
# CPU per I/O) to LOG.cpu
cpu_per_io() {
  python3 -c 'import sys; log, o, g, c, n, tick = sys.argv[1:]; n = max(float(n), 1)
open(log + ".cpu", "w").write("%.0f %.0f %.0f\n" % (int(o) / float(tick) / n * 1e6, int(g) / float(tick) / n * 1e6, float(c) / n * 1e6))' "$@" "$TICK"
}

osd_ops() { # -> the client operations (reads, writes, read-modify-writes) the OSDs did so far
  local id total=0 n
  for id in $(timeout 60 ceph -c "$CONF" osd ls); do
    n=$(timeout 60 ceph -c "$CONF" tell "osd.$id" perf dump 2>/dev/null |
      python3 -c 'import json,sys; o=json.load(sys.stdin)["osd"]; print(o["op_r"] + o["op_w"] + o["op_rw"])') || n=0
    total=$((total + n))
  done
  echo "$total"
}

fio_run() { # log rw bs qd engine -> IOPS; writes the OSD operations per I/O to log.ops
  local log=$DIR/logs/$run-$1.json rw=$2 bs=$3 qd=$4 engine=$5 target ops
  case $engine in
    rbd|rbd-nocache) target=(--ioengine=rbd --clientname=admin --pool="$RPOOL" --rbdname=img);;
    nbd) target=(--ioengine=nbd --uri="$T_URI");;
    qemu-nbd) target=(--ioengine=nbd --uri="$Q_URI");;
  esac
  if [ "$engine" = qemu-nbd ]; then
    # qemu-nbd at its defaults (cache=writeback: librbd's cache on, as fio rbd has it),
    # serving the image through its rbd driver; --fork returns once it listens.
    qemu-nbd --fork --pid-file="$DIR/qemu-nbd.pid" --persistent --shared=4 -b 127.0.0.1 \
      -p "$QEMU_NBD_PORT" -x img -f raw "rbd:$RPOOL/img:conf=$CONF:id=admin" \
      >> "$DIR/logs/qemu-nbd.log" 2>&1 || { echo "qemu-nbd did not start: $DIR/logs/qemu-nbd.log" >&2; exit 1; }
  fi
  ops=$(osd_ops)
  local conf=$CONF gw=()
  [ "$engine" != rbd-nocache ] || conf=$DIR/nocache.conf
  case $engine in nbd) gw=("$TPID");; qemu-nbd) gw=("$(cat "$DIR/qemu-nbd.pid")");; esac
  local osd0 gw0
  local client
  osd0=$(ticks $(osd_pids)); gw0=$(ticks "${gw[@]}")
  client=$(run_timed "$log" env CEPH_CONF="$conf" fio --name=b "${target[@]}" --rw="$rw" --bs="$bs" \
      --iodepth="$qd" --numjobs=1 --size="$SIZE_B" --time_based --runtime="$DURATION" \
      --buffer_pattern=0xa5 --output-format=json)
  osd0=$(( $(ticks $(osd_pids)) - osd0 )); gw0=$(( $(ticks "${gw[@]}") - gw0 ))
  ops=$(( $(osd_ops) - ops ))
  [ "$engine" != qemu-nbd ] || stop_qemu_nbd
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
open(sys.argv[1] + ".ops", "w").write("%.2f\n" % (int(sys.argv[2]) / max(ios, 1)))
open(sys.argv[1] + ".ios", "w").write("%d\n" % ios)
print(j["read"]["iops"] + j["write"]["iops"])' "$log" "$ops"
  cpu_per_io "$log" "$osd0" "$gw0" "$client" "$(cat "$log.ios")"
}

tessera_bench_run() { # log rw bs qd [url [caching]] -> IOPS, over iSCSI unless told
  local log=$DIR/logs/$run-$1.json rw=$2 bs=$3 qd=$4 url=${5:-iscsi://$PORTAL/$IQN/0} args
  case $rw in
    randread) args=(-r -w 0);; randwrite) args=(-r -w 100);;
    read) args=(-s -w 0);; write) args=(-s -w 100);;
  esac
  local osd0 gw0 client
  osd0=$(ticks $(osd_pids)); gw0=$(ticks "$TPID")
  client=$(run_timed "$log" "$T" --json bench "$url" "${args[@]}" -S"${6:-u}" -b "$bs" -o "$qd" -t 1 -d "$DURATION")
  osd0=$(( $(ticks $(osd_pids)) - osd0 )); gw0=$(( $(ticks "$TPID") - gw0 ))
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):]); r=j["runs"][0]
open(sys.argv[1] + ".ios", "w").write("%f\n" % (r["total"]["iops"] * r["seconds"]))
print(j["iops_mean"])' "$log"
  cpu_per_io "$log" "$osd0" "$gw0" "$client" "$(cat "$log.ios")"
}

rbd_bench_run() { # log rw bs qd -> IOPS
  local log=$DIR/logs/$run-$1.txt rw=$2 bs=$3 qd=$4 type pattern
  case $rw in
    randread) type=read pattern=rand;; randwrite) type=write pattern=rand;;
    read) type=read pattern=seq;; write) type=write pattern=seq;;
  esac
  # rbd bench runs for a total, not a time: as much as fio-rbd did in DURATION seconds.
  local total=$(python3 -c "print(int(max(float('$6') * $DURATION * $bs, 64 * 1048576) // $bs * $bs))")
  timeout 600 rbd -c "$CONF" bench --io-type "$type" --io-pattern "$pattern" --io-size "$bs" \
    --io-threads "$qd" --io-total "$total" "$RPOOL/img" > "$log" 2>&1
  sed -n 's/.*ops\/sec: *\([0-9.]*\).*/\1/p' "$log" | tail -1
}

declare -A res
for run in $(seq "$RUNS"); do
  echo "run $run/$RUNS" >&2
  for w in "rr4k randread 4096 32" "rw4k randwrite 4096 32" "sr256k read 262144 8" "sw256k write 262144 8"; do
    set -- $w
    rbd_iops=$(fio_run "$1-fiorbd" "$2" "$3" "$4" rbd)
    res[$1-fiorbd]+="$rbd_iops "
    res[$1-fiorbdnc]+="$(fio_run "$1-fiorbdnc" "$2" "$3" "$4" rbd-nocache) "
    res[$1-qemunbd]+="$(fio_run "$1-qemunbd" "$2" "$3" "$4" qemu-nbd) "
    res[$1-nbd]+="$(fio_run "$1-nbd" "$2" "$3" "$4" nbd) "
    res[$1-iscsi]+="$(tessera_bench_run "$1-iscsi" "$2" "$3" "$4") "
    res[$1-rbdbench]+="$(rbd_bench_run "$1-rbdbench" "$2" "$3" "$4" x "$rbd_iops") "
  done
  # Writes through (diskspd -Sh, the seeds' -h): each durable when answered. librbd without
  # its cache answers a write once the OSDs have it, which is the same promise (rw4k above).
  res[wt-iscsi]+="$(tessera_bench_run wt-iscsi randwrite 4096 32 "iscsi://$PORTAL/$IQN/0" h) "
  res[wt-nbd]+="$(tessera_bench_run wt-nbd randwrite 4096 32 "$T_URI" h) "
  res[wb-nbd]+="$(tessera_bench_run wb-nbd randwrite 4096 32 "$T_URI" u) "
done

echo "## A pool on Ceph RADOS: Tessera over NBD and iSCSI vs librbd on the same RADOS pool"
echo
echo "$(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), kernel $(uname -r);" \
     "Ceph $(pkgver ceph-osd) with $OSDS BlueStore OSD(s) on sparse files (size $(ceph -c "$CONF" osd pool get "$RPOOL" size -f json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])')), all on loopback;" \
     "SIZE=$SIZE, ${DURATION}s per test, median of $RUNS runs; tessera $("$T" --version | awk '{print $2}'), fio $(fio --version | sed 's/^fio-//')"
echo
echo "| workload | rbd bench | fio rbd | fio rbd, no cache | qemu-nbd on rbd (fio) | Tessera NBD (fio) | Tessera iSCSI (tessera bench) | NBD / fio rbd | iSCSI / fio rbd | NBD / fio rbd no cache | iSCSI / fio rbd no cache | NBD / qemu-nbd |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for w in rr4k rw4k sr256k sw256k; do
  case $w in
    rr4k) label="4K random read, QD32 (IOPS)"; scale=1;;
    rw4k) label="4K random write, QD32 (IOPS)"; scale=1;;
    sr256k) label="256K seq read, QD8 (MiB/s)"; scale=4;;
    sw256k) label="256K seq write, QD8 (MiB/s)"; scale=4;;
  esac
  declare -A m=()
  for who in rbdbench fiorbd fiorbdnc qemunbd nbd iscsi; do
    m[$who]=$(echo "${res[$w-$who]}" | tr ' ' '\n' | grep . | median)
    m[$who]=$(python3 -c "print(${m[$who]:-0} / $scale)")
  done
  printf '| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f |\n' "$label" "${m[rbdbench]}" \
    "${m[fiorbd]}" "${m[fiorbdnc]}" "${m[qemunbd]}" "${m[nbd]}" "${m[iscsi]}" "$(python3 -c "print(${m[nbd]} / ${m[fiorbd]})")" \
    "$(python3 -c "print(${m[iscsi]} / ${m[fiorbd]})")" "$(python3 -c "print(${m[nbd]} / ${m[fiorbdnc]})")" \
    "$(python3 -c "print(${m[iscsi]} / ${m[fiorbdnc]})")" "$(python3 -c "print(${m[nbd]} / ${m[qemunbd]})")"
done
echo
echo "4K random writes through (FUA; diskspd -Sh), QD32, IOPS, against librbd without its cache"
echo "(fio), whose writes are durable when answered too (medians; Tessera with its own bench,"
echo "whose NBD client is not fio's):"
echo
echo "| fio rbd, no cache | Tessera iSCSI -Sh | Tessera NBD -Sh | Tessera NBD -Su | iSCSI -Sh / no cache | NBD -Sh / no cache |"
echo "|---:|---:|---:|---:|---:|---:|"
declare -A m=()
m[nc]=$(echo "${res[rw4k-fiorbdnc]}" | tr ' ' '\n' | grep . | median)
for who in wt-iscsi wt-nbd wb-nbd; do
  m[$who]=$(echo "${res[$who]}" | tr ' ' '\n' | grep . | median)
done
printf '| %.0f | %.0f | %.0f | %.0f | %.2f | %.2f |\n' "${m[nc]}" "${m[wt-iscsi]}" "${m[wt-nbd]}" "${m[wb-nbd]}" \
  "$(python3 -c "print(${m[wt-iscsi]} / ${m[nc]})")" "$(python3 -c "print(${m[wt-nbd]} / ${m[nc]})")"
echo
echo "Operations the OSDs did per I/O of fio (median; librbd's cache and Tessera's merging of a"
echo "request's grains both show here):"
echo
echo "| workload | fio rbd | fio rbd, no cache | qemu-nbd on rbd (fio) | Tessera NBD (fio) |"
echo "|---|---:|---:|---:|---:|"
for w in rr4k rw4k sr256k sw256k; do
  printf '| %s | %s | %s | %s | %s |\n' "$w" "$(cat "$DIR"/logs/*-"$w"-fiorbd.json.ops | median)" \
    "$(cat "$DIR"/logs/*-"$w"-fiorbdnc.json.ops | median)" \
    "$(cat "$DIR"/logs/*-"$w"-qemunbd.json.ops | median)" "$(cat "$DIR"/logs/*-"$w"-nbd.json.ops | median)"
done
echo
echo "CPU time per 4K I/O, µs (median): the OSDs / the gateway (Tessera's daemon; qemu-nbd) / the"
echo "client (fio; \`tessera bench\` for iSCSI). librbd works in fio's process, the client there:"
echo
echo "| workload | fio rbd | fio rbd, no cache | qemu-nbd on rbd (fio) | Tessera NBD (fio) | Tessera iSCSI |"
echo "|---|---|---|---|---|---|"
cpu_median() { # WORKLOAD WHO -> "osd / gateway / client (total)", each the median over the runs
  python3 -c 'import sys, glob, statistics as s
rows = [list(map(float, open(f).read().split())) for f in sorted(glob.glob(sys.argv[1]))]
if not rows: print("-"); sys.exit()
m = [s.median(c) for c in zip(*rows)]
print("%.0f / %.0f / %.0f (%.0f)" % (m[0], m[1], m[2], sum(m)))' "$DIR/logs/*-$1-$2.json.cpu"
}
for w in rr4k rw4k; do
  printf '| %s | %s | %s | %s | %s | %s |\n' "$w" "$(cpu_median "$w" fiorbd)" "$(cpu_median "$w" fiorbdnc)" \
    "$(cpu_median "$w" qemunbd)" "$(cpu_median "$w" nbd)" "$(cpu_median "$w" iscsi)"
done
echo
echo "Tessera NBD / fio rbd in each run (the spread shows how much the shared machine moves):"
for w in rr4k rw4k sr256k sw256k; do
  per_run_ratios "$w" "${res[$w-nbd]}" "${res[$w-fiorbd]}"
done
echo
echo "Tessera NBD / fio rbd without its cache in each run:"
for w in rr4k rw4k sr256k sw256k; do
  per_run_ratios "$w" "${res[$w-nbd]}" "${res[$w-fiorbdnc]}"
done
echo
echo "qemu-nbd on rbd / fio rbd in each run (what the hop costs a peer gateway):"
for w in rr4k rw4k sr256k sw256k; do
  per_run_ratios "$w" "${res[$w-qemunbd]}" "${res[$w-fiorbd]}"
done
