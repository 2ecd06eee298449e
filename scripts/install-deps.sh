#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test Tessera. Idempotent: quiet and
# quick when everything is already there. Usage: scripts/install-deps.sh [build|test|bench|ceph]
set -euo pipefail

want=(clang libclang-dev)                       # RocksDB's bindings are generated with libclang
want+=(libssl-dev pkg-config)                   # NBD's TLS links the system OpenSSL
case "${1:-build}" in
  test)  want+=(fio libiscsi-bin libnbd-bin qemu-utils qemu-block-extra)
         want+=(prometheus)                      # promtool checks the /metrics output
         want+=(chromium chromium-driver)        # the dashboard's browser test (WebDriver)
         want+=(iproute2)                        # the link emulator's network namespaces
         want+=(ceph-mon ceph-osd ceph-mgr ceph-common librados-dev etcd-server etcd-client)  # scripts/test-scale-out.sh
         want+=(protobuf-compiler)               # etcd-client's build (crates/ownership)
         want+=(openssl) ;;                      # certificates of the etcd TLS tests
  bench) want+=(fio bc tgt libiscsi-bin libnbd-bin qemu-utils qemu-block-extra iproute2)
         want+=(mmdebstrap e2fsprogs postgresql restic borgbackup)    # bench/dedup-*.sh
         want+=(ceph-mon ceph-osd ceph-mgr ceph-common librados-dev etcd-server etcd-client protobuf-compiler) ;;  # bench/rados.sh
  ceph)  want=(ceph-mon ceph-osd ceph-mgr ceph-common librados-dev etcd-server etcd-client python3) ;;  # scripts/ceph-dev.sh
esac

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install the Rust toolchain (rustup) first" >&2
  exit 1
fi
