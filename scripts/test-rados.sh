#!/usr/bin/env bash
# The tests that need a Ceph cluster: starts one on loopback (scripts/ceph-dev.sh, one OSD),
# runs the RADOS bindings' tests (built with the `librados` feature) against it, and stops it.
# Where the cluster cannot start, the tests run without it and each says it was skipped, and
# why; the cluster's log is shown. Called by `make test`; its output goes through the same
# summary as the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
DIR=$(mktemp -d /tmp/tessera-ceph.XXXXXX)
trap 'scripts/ceph-dev.sh down "$DIR" >/dev/null 2>&1; rm -rf "$DIR"' EXIT

conf=""
if scripts/ceph-dev.sh up "$DIR/cluster" 1 > "$DIR/up.log" 2>&1; then
  conf="$DIR/cluster/ceph.conf"
else
  echo "Ceph could not start here; the RADOS tests will say they were skipped. Its log:"
  tail -20 "$DIR/up.log"
fi
TESSERA_CEPH_CONF="$conf" timeout 900 \
  $CARGO test --profile test -p tessera-rados --features librados --no-fail-fast
