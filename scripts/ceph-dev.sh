#!/usr/bin/env bash
# A Ceph cluster on this machine for tests and benchmarks: one monitor, one manager and N OSDs
# (BlueStore on sparse files), plus an etcd, all on loopback, started without systemd. The
# cluster lives in DIR; `down` stops it and removes DIR.
#
#   scripts/ceph-dev.sh up DIR [N]      (N OSDs, default 3; prints the environment to use)
#   scripts/ceph-dev.sh status DIR
#   scripts/ceph-dev.sh down DIR
#
# DIR/env holds CEPH_CONF, CEPH_KEYRING and ETCD_ENDPOINTS for clients (`ceph -c $CEPH_CONF -s`,
# `rados -c $CEPH_CONF -p POOL ls`). Debian's packages
# (ceph-mon, ceph-osd, ceph-mgr, ceph-common, librados-dev, etcd-server, etcd-client) are
# installed by `scripts/install-deps.sh ceph` when missing.
#
# What the daemons need here, learnt the hard way (Ceph 16.2, etcd 3.4): each daemon has a
# keyring of its own (a global `keyring =` pointing at the admin key breaks the manager's
# authentication); an OSD's key is made before `ceph-osd --mkfs`; BlueStore makes its own
# block file (`bluestore_block_create`, a size) rather than being pointed at one; an OSD that
# fills up aborts and leaves clients hanging, so the sparse files are generous and clients
# time out (`rados_osd_op_timeout`).
set -euo pipefail

usage() {
  echo "usage: $0 up DIR [N] | status DIR | down DIR" >&2
  exit 2
}
[ $# -ge 2 ] || usage
cmd=$1
DIR=$(realpath -m "$2")
N=${3:-3}
CONF=$DIR/ceph.conf
# OSD block files: sparse, so their size costs nothing until written.
OSD_SIZE=${OSD_SIZE:-20G}
WAIT=${WAIT:-120}

ceph_() { timeout 60 ceph -c "$CONF" "$@"; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits until `$@` succeeds, up to WAIT seconds of the clock (however long each try takes).
wait_for() {
  local what=$1 deadline=$((SECONDS + WAIT))
  shift
  while [ "$SECONDS" -lt "$deadline" ]; do
    if "$@" > /dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "ceph-dev: $what did not happen within ${WAIT}s; logs in $DIR/log" >&2
  return 1
}

etcd_health() {
  ETCDCTL_API=3 etcdctl --dial-timeout=2s --command-timeout=3s --endpoints "127.0.0.1:$etcd_client" endpoint health
}

# Starts etcd on two free ports, chosen just before: the Ceph daemons started meanwhile bind
# ports of their own, and one of them took the port etcd was to listen on. An etcd that
# exits (a port taken all the same) is started again on others, up to five times.
start_etcd() {
  local try pid deadline
  for try in 1 2 3 4 5; do
    etcd_client=$(free_port)
    etcd_peer=$(free_port)
    rm -rf "$DIR/etcd"
    mkdir -p "$DIR/etcd"
    etcd --name dev --data-dir "$DIR/etcd" \
      --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
      --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
      --initial-cluster "dev=http://127.0.0.1:$etcd_peer" >> "$DIR/log/etcd.log" 2>&1 &
    pid=$!
    echo "$pid" > "$DIR/run/etcd.pid"
    deadline=$((SECONDS + WAIT))
    while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$pid" 2> /dev/null; do
      if etcd_health > /dev/null 2>&1; then return 0; fi
      sleep 0.5
    done
    kill "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
    echo "ceph-dev: etcd did not start on ports $etcd_client/$etcd_peer (try $try); log in $DIR/log/etcd.log" >&2
  done
  return 1
}

osds_up() {
  [ "$(ceph_ osd stat -f json | python3 -c 'import json,sys; print(json.load(sys.stdin)["num_up_osds"])')" -ge "$N" ]
}

up() {
  if [ -e "$DIR/ceph.conf" ]; then
    echo "ceph-dev: $DIR already holds a cluster; '$0 down $DIR' first" >&2
    exit 1
  fi
  "$(dirname "$0")/install-deps.sh" ceph
  mkdir -p "$DIR"/{mon,mgr,run,log,etcd}
  local fsid mon1 mon2 etcd_client etcd_peer
  fsid=$(cat /proc/sys/kernel/random/uuid)
  mon1=$(free_port)
  mon2=$(free_port)
  local pool_size=$((N < 3 ? N : 3))
  cat > "$CONF" <<EOF
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$mon2,v1:127.0.0.1:$mon1]
public_network = 127.0.0.0/8
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
run_dir = $DIR/run
admin_socket = $DIR/run/\$cluster-\$name.asok
pid_file = $DIR/run/\$name.pid
log_file = $DIR/log/\$name.log
# One host: replicas go to different OSDs, not different hosts.
osd_crush_chooseleaf_type = 0
osd_pool_default_size = $pool_size
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 16
osd_pool_default_pgp_num = 16
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_delete = true
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 2
mon_data_avail_crit = 1
auth_allow_insecure_global_id_reclaim = false
rados_osd_op_timeout = 30
rados_mon_op_timeout = 30
client_mount_timeout = 30

[client]
# One socket per client process, as Ceph's default for clients: with one path for every
# client.admin, a new client first probes the socket of the last one, and when that process
# is stopped (SIGSTOP, as the failover tests do) the probe waits 10 s.
admin_socket = $DIR/run/\$cluster-\$name.\$pid.\$cctid.asok

[client.admin]
keyring = $DIR/admin.keyring

[mon.a]
mon_data = $DIR/mon

[mgr.x]
mgr_data = $DIR/mgr
keyring = $DIR/mgr/keyring

[osd]
osd_data = $DIR/osd.\$id
keyring = $DIR/osd.\$id/keyring
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = $(numfmt --from=iec "$OSD_SIZE")
osd_memory_target = 939524096
bluestore_cache_autotune = true
osd_op_num_shards = 2
osd_op_num_threads_per_shard = 1
EOF
  ceph-authtool --create-keyring "$DIR/mon.keyring" --gen-key -n mon. --cap mon 'allow *' > /dev/null
  ceph-authtool --create-keyring "$DIR/admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' > /dev/null
  ceph-authtool "$DIR/mon.keyring" --import-keyring "$DIR/admin.keyring" > /dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon2,v1:127.0.0.1:$mon1]" "$DIR/monmap" > /dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/mon.keyring"
  ceph-mon -c "$CONF" -i a 2>> "$DIR/log/mon.a.stderr"
  wait_for "the monitor answering" ceph_ mon stat

  ceph_ auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' -o "$DIR/mgr/keyring"
  ceph-mgr -c "$CONF" -i x 2>> "$DIR/log/mgr.x.stderr"

  local k uuid id
  for k in $(seq "$N"); do
    uuid=$(cat /proc/sys/kernel/random/uuid)
    id=$(ceph_ osd new "$uuid")
    mkdir -p "$DIR/osd.$id"
    ceph_ auth get-or-create "osd.$id" mon 'allow profile osd' mgr 'allow profile osd' osd 'allow *' \
      -o "$DIR/osd.$id/keyring"
    ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$uuid" > "$DIR/log/mkfs.osd.$id.log" 2>&1
    ceph-osd -c "$CONF" -i "$id" 2>> "$DIR/log/osd.$id.stderr"
  done
  wait_for "$N OSDs up" osds_up

  start_etcd

  cat > "$DIR/env" <<EOF
CEPH_CONF=$CONF
CEPH_KEYRING=$DIR/admin.keyring
ETCD_ENDPOINTS=127.0.0.1:$etcd_client
EOF
  cat "$DIR/env"
}

status() {
  [ -e "$CONF" ] || { echo "ceph-dev: no cluster in $DIR" >&2; exit 1; }
  ceph_ -s
  cat "$DIR/env" 2>/dev/null || true
}

down() {
  local f pid
  for f in "$DIR"/run/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
  done
  for f in "$DIR"/run/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  # Only a directory this script made is removed.
  if [ -e "$DIR/ceph.conf" ] || [ -e "$DIR/monmap" ]; then
    rm -rf "$DIR"
  fi
}

case $cmd in
  up) up ;;
  status) status ;;
  down) down ;;
  *) usage ;;
esac
