#!/usr/bin/env bash
# Tessera's NBD server against qemu-nbd serving the same data, and fio on a plain file, in one
# run, with the same client for both servers: fio's nbd engine (libnbd).
#
# Fills a SIZE file with random data and gives each side its own copy on the same file system:
# fio's reference file, qemu-nbd's file (opened with O_DIRECT and Linux AIO, --cache=none
# --aio=native, like Tessera's disks), and a simple (one-disk, thin) Tessera vdisk filled by
# `vdisk import` of that file, so no read lands on unmapped space. Then RUNS times, for each
# workload, measures fio on its file (io_uring, O_DIRECT), then qemu-nbd and Tessera over NBD on
# 127.0.0.1, DURATION seconds each:
#
#   4K random read, queue depth 32
#   256K sequential read, SEQ_QD deep
#   256K sequential write, SEQ_QD deep
#
# Prints a markdown table of medians (IOPS for 4K, MiB/s for 256K) and Tessera / qemu-nbd.
#
# Needs: qemu-utils (qemu-nbd), fio, python3. TESSERA_BIN=path skips the cargo build. KEEP=1
# keeps DIR (logs, images, state) after the run.
#
# Usage: bench/nbd-vs-qemu-nbd.sh   (RUNS=3 SIZE=4G DURATION=15 SEQ_QD=8 LBS=4096
#          DIR=/var/tmp/tessera-bench-nbd PROFILE=release TESSERA_BIN= KEEP=0
#          TESSERA_PORT=13809 QEMU_PORT=13810)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SIZE=${SIZE:-4G}
DURATION=${DURATION:-15}
SEQ_QD=${SEQ_QD:-8}
LBS=${LBS:-4096}
DIR=${DIR:-/var/tmp/tessera-bench-nbd}
TESSERA_PORT=${TESSERA_PORT:-13809}
QEMU_PORT=${QEMU_PORT:-13810}
KEEP=${KEEP:-0}

source bench/lib.sh
require fio qemu-nbd python3 numfmt
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "this fio has no nbd engine" >&2; exit 1; }

tessera_binary

SIZE_B=$(numfmt --from=iec "$SIZE")
T_URI=nbd://127.0.0.1:$TESSERA_PORT/vol
Q_URI=nbd://127.0.0.1:$QEMU_PORT/vol

cleanup() {
  set +e
  for p in qemu-nbd tessera; do
    if [ -f "$DIR/$p.pid" ]; then kill "$(cat "$DIR/$p.pid")" 2>/dev/null; wait "$(cat "$DIR/$p.pid")" 2>/dev/null; fi
  done
  if [ "$KEEP" = 1 ]; then echo "kept $DIR" >&2; else rm -rf "$DIR"; fi
}
ports_free "$TESSERA_PORT" "$QEMU_PORT"
rm -rf "$DIR"; mkdir -p "$DIR/logs"
trap cleanup EXIT

dd if=/dev/urandom of="$DIR/raw.img" bs=1M count=$((SIZE_B >> 20)) status=none
cp "$DIR/raw.img" "$DIR/qemu.img"
truncate -s $((SIZE_B + SIZE_B / 4 + (1 << 30))) "$DIR/tessera-disk.img"   # sparse, room for slabs
sync

# Plain NBD on loopback, as qemu-nbd serves it: TLS would measure OpenSSL, not the server.
start_tessera --iscsi-listen none --nbd-listen "127.0.0.1:$TESSERA_PORT" --nbd-insecure
logged tessera-setup.log "$T" pool create bench --disk "$DIR/tessera-disk.img"
logged tessera-setup.log "$T" vdisk import bench/vol "$DIR/raw.img" --layout simple --block-size "$LBS"
logged tessera-setup.log "$T" nbd export bench/vol
logged tessera-setup.log "$T" vdisk show bench/vol

qemu-nbd -f raw -x vol -b 127.0.0.1 -p "$QEMU_PORT" -t -e 64 --cache=none --aio=native "$DIR/qemu.img" \
  > "$DIR/logs/qemu-nbd.log" 2>&1 &
echo $! > "$DIR/qemu-nbd.pid"
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$QEMU_PORT") 2>/dev/null && break; sleep 0.1; done

fio_run() { # log rw bs qd [uri] -> IOPS: on the reference file, or over NBD when a URI is given
  local log=$DIR/logs/$run-$1.json rw=$2 bs=$3 qd=$4 uri=${5:-}
  local target=(--ioengine=io_uring --direct=1 --filename="$DIR/raw.img")
  [ -z "$uri" ] || target=(--ioengine=nbd --uri="$uri")
  fio --name=b "${target[@]}" --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=1 \
      --size="$SIZE_B" --time_based --runtime="$DURATION" --buffer_pattern=0xa5 \
      --output-format=json > "$log"
  # fio's nbd engine says "fio: connected to NBD server" before the JSON.
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(j["read"]["iops"]+j["write"]["iops"])' "$log"
}

declare -A res
for run in $(seq "$RUNS"); do
  echo "run $run/$RUNS" >&2
  for w in "rand4k randread 4096 32" "seqread read 262144 $SEQ_QD" "seqwrite write 262144 $SEQ_QD"; do
    set -- $w
    res[$1-fio]+="$(fio_run "$1-fio" "$2" "$3" "$4") "
    res[$1-qemu]+="$(fio_run "$1-qemu" "$2" "$3" "$4" "$Q_URI") "
    res[$1-tessera]+="$(fio_run "$1-tessera" "$2" "$3" "$4" "$T_URI") "
  done
done

echo "## NBD on 127.0.0.1: Tessera vs qemu-nbd"
echo
echo "$(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), kernel $(uname -r)," \
     "$(df --output=fstype "$DIR" | tail -1) file system; SIZE=$SIZE, ${LBS}-byte blocks, ${DURATION}s per test, median of $RUNS runs;" \
     "tessera $("$T" --version | awk '{print $2}'), qemu-nbd $(pkgver qemu-utils), fio $(fio --version | sed 's/^fio-//') (nbd engine, libnbd $(pkgver libnbd0))"
echo
echo "| workload | fio raw | qemu-nbd | tessera | tessera/qemu-nbd |"
echo "|---|---:|---:|---:|---:|"
for w in rand4k seqread seqwrite; do
  case $w in
    rand4k) label="4K random read, QD32 (IOPS)"; scale=1;;
    seqread) label="256K seq read, QD$SEQ_QD (MiB/s)"; scale=4;;
    seqwrite) label="256K seq write, QD$SEQ_QD (MiB/s)"; scale=4;;
  esac
  declare -A m=()
  for who in fio qemu tessera; do
    m[$who]=$(echo "${res[$w-$who]}" | tr ' ' '\n' | grep . | median)
    m[$who]=$(python3 -c "print(${m[$who]} / $scale)")
  done
  printf '| %s | %.0f | %.0f | %.0f | %.2f |\n' "$label" "${m[fio]}" "${m[qemu]}" "${m[tessera]}" \
    "$(python3 -c "print(${m[tessera]} / ${m[qemu]})")"
done
echo
echo "Tessera / qemu-nbd in each run (the spread shows how much the shared machine moves):"
for w in rand4k seqread seqwrite; do
  per_run_ratios "$w" "${res[$w-tessera]}" "${res[$w-qemu]}"
done
