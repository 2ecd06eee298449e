#!/usr/bin/env bash
# The tests that need a Ceph cluster and an etcd: starts both on loopback
# (scripts/ceph-dev.sh, one OSD), runs the RADOS bindings' tests (`librados` feature) and the
# vdisk ownership tests (`etcd` feature) against them, and stops them. Where the cluster
# cannot start, the tests run without it and each says it was skipped, and why; the
# cluster's log is shown. Called by `make test`; its output goes through the same summary as
# the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
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
TESSERA_CEPH_CONF="$conf" TESSERA_ETCD_ENDPOINTS="$etcd" timeout 900 \
  $CARGO test --profile test -p tessera-rados -p tessera-ownership \
    --features tessera-rados/librados,tessera-ownership/fencing --no-fail-fast
