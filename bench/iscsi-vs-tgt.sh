#!/usr/bin/env bash
# Tessera's iSCSI target against tgt (the Linux SCSI target framework's user-space daemon) and
# fio on a plain file, in one run, with the same libiscsi client for both targets.
#
# Fills a SIZE file with random data and gives each side its own copy on the same file system:
# fio's reference file, tgt's backing file (LUN 1, opened with O_DIRECT like Tessera's disks),
# and a simple (one-disk, thin) Tessera vdisk filled by `vdisk import` of that file (LUN 0), so
# no read lands on unmapped space. Both LUNs have LBS-byte logical blocks: iscsi-perf picks
# random LBAs, so with 4096 its 4K reads are 4K-aligned like fio's. Then RUNS times, for each
# workload, measures fio on its file (io_uring, O_DIRECT), then tgt and Tessera over iSCSI on
# 127.0.0.1, DURATION seconds each:
#
#   4K random read, queue depth 32       iscsi-perf -r -m 32          fio randread
#   256K sequential read, SEQ_QD deep    iscsi-perf -m SEQ_QD         fio read
#   256K sequential write, SEQ_QD deep   qemu-img bench -w -d SEQ_QD  fio write
#
# iscsi-perf (libiscsi-bin) only reads (READ16), and Debian's fio has no libiscsi engine, so the
# write test uses `qemu-img bench -w` over QEMU's libiscsi driver (qemu-block-extra): runs of
# 256 MiB at consecutive offsets, wrapping at the end of the LUN, until DURATION seconds of
# writing, with a non-zero byte pattern. Prints a markdown table of medians (IOPS for 4K, MiB/s
# for 256K) and Tessera / tgt.
#
# tgt's defaults (8 KiB data segments both ways, FirstBurstLength 64K, MaxBurstLength 256K,
# InitialR2T=Yes) roughly halve its write rate on loopback; TGT_PARAMS sets them to what
# Tessera negotiates with libiscsi (256K segments, FirstBurstLength 256K, MaxBurstLength 1M,
# InitialR2T=No). TGT_PARAMS= keeps tgt's defaults.
#
# Needs root (tgtd keeps its control socket in /var/run/tgtd) and: tgt, libiscsi-bin,
# qemu-utils, qemu-block-extra, fio, bc, python3. A system tgtd is left alone: ours uses its own
# control port and portal. TESSERA_BIN=path skips the cargo build. KEEP=1 keeps DIR (logs,
# images, state) after the run.
#
# Usage: bench/iscsi-vs-tgt.sh   (RUNS=3 SIZE=4G DURATION=15 SEQ_QD=8 LBS=4096
#          DIR=/var/tmp/tessera-bench-iscsi PROFILE=release TESSERA_BIN= KEEP=0 TESSERA_PORT=13260
#          TGT_PORT=13261 TGT_CONTROL_PORT=13262 TGT_PARAMS="Key=Value ...")
set -euo pipefail
shopt -s inherit_errexit   # a failure inside $(...) stops the script too
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SIZE=${SIZE:-4G}
DURATION=${DURATION:-15}
SEQ_QD=${SEQ_QD:-8}
LBS=${LBS:-4096}
DIR=${DIR:-/var/tmp/tessera-bench-iscsi}
TESSERA_PORT=${TESSERA_PORT:-13260}
TGT_PORT=${TGT_PORT:-13261}
TGT_CONTROL_PORT=${TGT_CONTROL_PORT:-13262}
TGT_PARAMS=${TGT_PARAMS-MaxRecvDataSegmentLength=262144 MaxXmitDataSegmentLength=262144 \
FirstBurstLength=262144 MaxBurstLength=1048576 InitialR2T=No}
KEEP=${KEEP:-0}

source bench/lib.sh
require fio iscsi-perf qemu-img tgtd tgtadm bc python3 numfmt
[ "$(id -u)" -eq 0 ] || { echo "run as root: tgtd needs /var/run/tgtd" >&2; exit 1; }

tessera_binary

SIZE_B=$(numfmt --from=iec "$SIZE")
CHUNK=$((256 << 20))                     # bytes per qemu-img bench invocation (write test)
[ $((SIZE_B % CHUNK)) -eq 0 ] || { echo "SIZE must be a multiple of 256M" >&2; exit 1; }
T_IQN=iqn.2026-11.io.tessera:bench
G_IQN=iqn.2026-11.io.tessera:tgt-bench
T_URL=iscsi://127.0.0.1:$TESSERA_PORT/$T_IQN/0
G_URL=iscsi://127.0.0.1:$TGT_PORT/$G_IQN/1   # tgt's LUN 0 is its controller
TGTADM=(tgtadm -C "$TGT_CONTROL_PORT" --lld iscsi)

cleanup() {
  set +e
  if [ -f "$DIR/tgtd.pid" ]; then
    pid=$(cat "$DIR/tgtd.pid")
    if kill -0 "$pid" 2>/dev/null; then   # tgtd ignores SIGTERM: empty it, then ask it to exit
      "${TGTADM[@]}" --op delete --mode logicalunit --tid 1 --lun 1 >/dev/null 2>&1
      "${TGTADM[@]}" --op delete --mode target --tid 1 --force >/dev/null 2>&1
      tgtadm -C "$TGT_CONTROL_PORT" --op delete --mode system >/dev/null 2>&1
      for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    rm -f "/var/run/tgtd/socket.$TGT_CONTROL_PORT" "/var/run/tgtd/socket.$TGT_CONTROL_PORT.lock"
  fi
  if [ -f "$DIR/tessera.pid" ]; then
    kill "$(cat "$DIR/tessera.pid")" 2>/dev/null; wait "$(cat "$DIR/tessera.pid")" 2>/dev/null
  fi
  if [ "$KEEP" = 1 ]; then echo "kept $DIR" >&2; else rm -rf "$DIR"; fi
}
ports_free "$TESSERA_PORT" "$TGT_PORT"
! "${TGTADM[@]}" --op show --mode target >/dev/null 2>&1 \
  || { echo "a tgtd already answers on control port $TGT_CONTROL_PORT: set TGT_CONTROL_PORT" >&2; exit 1; }
rm -rf "$DIR"; mkdir -p "$DIR/logs"
trap cleanup EXIT

# The same random data for the three: fio's file, tgt's file, and Tessera's vdisk.
dd if=/dev/urandom of="$DIR/raw.img" bs=1M count=$((SIZE_B >> 20)) status=none
cp "$DIR/raw.img" "$DIR/tgt.img"
truncate -s $((SIZE_B + SIZE_B / 4 + (1 << 30))) "$DIR/tessera-disk.img"   # sparse, room for slabs
sync

start_tessera --iscsi-listen "127.0.0.1:$TESSERA_PORT" --nbd-listen none
logged tessera-setup.log "$T" pool create bench --disk "$DIR/tessera-disk.img"
logged tessera-setup.log "$T" vdisk import bench/vol "$DIR/raw.img" --layout simple --block-size "$LBS"
logged tessera-setup.log "$T" target create "$T_IQN" --allow-any-initiator
logged tessera-setup.log "$T" target lun add "$T_IQN" bench/vol --lun 0
logged tessera-setup.log "$T" vdisk show bench/vol

tgtd -f -C "$TGT_CONTROL_PORT" --iscsi "portal=127.0.0.1:$TGT_PORT" > "$DIR/logs/tgtd.log" 2>&1 &
echo $! > "$DIR/tgtd.pid"
for _ in $(seq 100); do "${TGTADM[@]}" --op show --mode target >/dev/null 2>&1 && break; sleep 0.1; done
"${TGTADM[@]}" --op show --mode target >/dev/null || { echo "tgtd did not start: $DIR/logs/tgtd.log" >&2; KEEP=1; exit 1; }
logged tgt-setup.log "${TGTADM[@]}" --op new --mode target --tid 1 -T "$G_IQN"
logged tgt-setup.log "${TGTADM[@]}" --op new --mode logicalunit --tid 1 --lun 1 -b "$DIR/tgt.img" \
  --bsoflags direct --blocksize "$LBS"
logged tgt-setup.log "${TGTADM[@]}" --op bind --mode target --tid 1 -I ALL
for kv in $TGT_PARAMS; do
  logged tgt-setup.log "${TGTADM[@]}" --op update --mode target --tid 1 -n "${kv%%=*}" -v "${kv#*=}"
done
logged tgt-setup.log "${TGTADM[@]}" --op show --mode target --tid 1   # the session parameters
logged tgt-setup.log "${TGTADM[@]}" --op show --mode target           # the LUNs

# Each takes a log name first; logs go to $DIR/logs/<run>-<name>.
fio_run() { # log rw bs qd -> IOPS
  local log=$DIR/logs/$run-$1.json; shift
  fio --name=ref --ioengine=io_uring --direct=1 --rw="$1" --bs="$2" --iodepth="$3" --numjobs=1 \
      --filename="$DIR/raw.img" --size="$SIZE_B" --time_based --runtime="$DURATION" \
      --buffer_pattern=0xa5 --output-format=json > "$log"
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(j["read"]["iops"]+j["write"]["iops"])' "$log"
}
perf_run() { # log url bytes qd [-r] -> IOPS (iscsi-perf counts in logical blocks)
  local log=$DIR/logs/$run-$1.log; shift
  iscsi-perf -t "$DURATION" -m "$3" -b $(($2 / LBS)) ${4:-} "$1" > "$log" 2>&1 \
    || { echo "iscsi-perf $1 failed: $log" >&2; tail -c 500 "$log" >&2; exit 1; }
  grep -q "transfer size of $(($2 / LBS)) blocks ($2 byte)" "$log" \
    || { echo "$1: logical blocks are not $LBS bytes: $log" >&2; exit 1; }
  tr '\r' '\n' < "$log" | sed -n 's/.*iops average \([0-9]*\).*/\1/p' | tail -1
}
write_run() { # log url bytes qd -> IOPS: 256 MiB runs at consecutive offsets until DURATION seconds
  local log=$DIR/logs/$run-$1.log url=$2 bs=$3 qd=$4 off=0 secs=0 ios=0 s
  while [ "$(echo "$secs < $DURATION" | bc)" = 1 ]; do
    s=$(qemu-img bench -w -f raw -n -c $((CHUNK / bs)) -d "$qd" -s "$bs" -o "$off" --pattern=165 "$url" \
          2>&1 | tee -a "$log" | sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p')
    [ -n "$s" ] || { echo "qemu-img bench $url failed: $log" >&2; exit 1; }
    secs=$(echo "$secs + $s" | bc -l); ios=$((ios + CHUNK / bs)); off=$(((off + CHUNK) % SIZE_B))
  done
  echo "$ios / $secs" | bc -l
}

WORKLOADS="rand4k seq256k-read seq256k-write"
declare -A res
for run in $(seq "$RUNS"); do
  echo "run $run/$RUNS" >&2
  res[rand4k-fio]+="$(fio_run rand4k-fio randread 4096 32) "
  res[rand4k-tgt]+="$(perf_run rand4k-tgt "$G_URL" 4096 32 -r) "
  res[rand4k-tessera]+="$(perf_run rand4k-tessera "$T_URL" 4096 32 -r) "
  res[seq256k-read-fio]+="$(fio_run seqread-fio read 262144 "$SEQ_QD") "
  res[seq256k-read-tgt]+="$(perf_run seqread-tgt "$G_URL" 262144 "$SEQ_QD") "
  res[seq256k-read-tessera]+="$(perf_run seqread-tessera "$T_URL" 262144 "$SEQ_QD") "
  res[seq256k-write-fio]+="$(fio_run seqwrite-fio write 262144 "$SEQ_QD") "
  res[seq256k-write-tgt]+="$(write_run seqwrite-tgt "$G_URL" 262144 "$SEQ_QD") "
  res[seq256k-write-tessera]+="$(write_run seqwrite-tessera "$T_URL" 262144 "$SEQ_QD") "
done

echo "## iSCSI on 127.0.0.1: Tessera vs tgt"
echo
echo "$(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), kernel $(uname -r)," \
     "$(df --output=fstype "$DIR" | tail -1) file system; SIZE=$SIZE, ${LBS}-byte blocks, ${DURATION}s per test, median of $RUNS runs;" \
     "tessera $("$T" --version | awk '{print $2}'), tgt $(pkgver tgt), libiscsi $(pkgver libiscsi-bin)," \
     "qemu-img $(pkgver qemu-utils), fio $(fio --version | sed 's/^fio-//');" \
     "tgt parameters: ${TGT_PARAMS:-its defaults}"
echo
echo "| workload | fio raw | tgt | tessera | tessera/tgt |"
echo "|---|---:|---:|---:|---:|"
for w in $WORKLOADS; do
  case $w in
    rand4k) label="4K random read, QD32 (IOPS)"; scale=1;;
    seq256k-read) label="256K seq read, QD$SEQ_QD (MiB/s)"; scale=4;;      # IOPS * 256K / 1M
    seq256k-write) label="256K seq write, QD$SEQ_QD (MiB/s)"; scale=4;;
  esac
  declare -A m=()
  for who in fio tgt tessera; do
    m[$who]=$(echo "${res[$w-$who]}" | tr ' ' '\n' | grep . | median)
    m[$who]=$(echo "${m[$who]} / $scale" | bc -l)
  done
  printf '| %s | %.0f | %.0f | %.0f | %.2f |\n' "$label" "${m[fio]}" "${m[tgt]}" "${m[tessera]}" \
    "$(echo "${m[tessera]} / ${m[tgt]}" | bc -l)"
done
echo
echo "Tessera / tgt in each run (the spread shows how much the shared machine moves):"
for w in $WORKLOADS; do
  per_run_ratios "$w" "${res[$w-tessera]}" "${res[$w-tgt]}"
done
