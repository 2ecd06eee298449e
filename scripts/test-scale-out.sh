#!/usr/bin/env bash
# Runs a command (the whole test suite, from `make test`) with a Ceph cluster and an etcd
# beside it: starts both on loopback (scripts/ceph-dev.sh, one OSD), points the tests at them
# (TESSERA_CEPH_CONF, TESSERA_ETCD_ENDPOINTS), runs the command, and stops them. The tests
# that need them are built with the scale-out crates' features (`make test` turns them on for
# the whole workspace, so that everything is compiled once, with one set of features). Where
# the cluster cannot start, the command runs without it, the tests that need it say they were
# skipped and why, and the cluster's log is shown.
# Usage: scripts/test-scale-out.sh COMMAND [ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
DIR=$(mktemp -d /tmp/tessera-ceph.XXXXXX)
trap 'scripts/ceph-dev.sh down "$DIR/cluster" >/dev/null 2>&1; rm -rf "$DIR"' EXIT

conf="" etcd=""
if scripts/ceph-dev.sh up "$DIR/cluster" 1 > "$DIR/up.log" 2>&1; then
  conf="$DIR/cluster/ceph.conf"
  etcd=$(sed -n 's/^ETCD_ENDPOINTS=//p' "$DIR/cluster/env")
else
  echo "Ceph and etcd could not start here; the tests that need them will say they were skipped. The log:"
  tail -20 "$DIR/up.log"
fi
TESSERA_CEPH_CONF="$conf" TESSERA_ETCD_ENDPOINTS="$etcd" "$@"
