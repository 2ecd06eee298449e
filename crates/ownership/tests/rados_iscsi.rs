//! libiscsi's conformance suite against a LUN of a pool wholly on RADOS (its disk a
//! `FencedDisk`, its metadata a `RadosMeta`), against the cluster `scripts/test-scale-out.sh`
//! starts (TESSERA_CEPH_CONF): the same suite and the same exemptions as a LUN on local disks
//! (crates/cli/tests/iscsi.rs).
#![cfg(feature = "fencing")]

mod common;

use std::sync::Arc;

use common::{ceph, ceph_conf, TEST_POOL};

use tessera_disk::DiskRef;
use tessera_iscsi::{Access, Registry, Target};
use tessera_ownership::fenced_disk::FencedDisk;
use tessera_ownership::rados_meta::RadosMeta;
use tessera_pool::MetaStore;
use tessera_rados::Cluster;
use tessera_test_support::cunit;
use tessera_volume::{Engine, LayoutKind, VdiskSpec};

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libiscsi_conformance_on_a_lun_of_a_pool_on_rados() {
    let t = "libiscsi_conformance_on_a_lun_of_a_pool_on_rados";
    let Some(conf) = ceph_conf(t) else { return };
    let c = ceph(&conf);
    let id = format!("{t}-{}", std::process::id());
    let disk: DiskRef =
        Arc::new(FencedDisk::new(Cluster::shared_pool(&c, TEST_POOL).unwrap(), &id, 4096 * MIB, 1).unwrap());
    let meta = MetaStore::on(RadosMeta::new(
        Cluster::shared_pool(&c, TEST_POOL).unwrap(),
        &format!("{id}.meta"),
        1,
    ));
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create_pool_with_meta(&dir.path().join("p"), "p", vec![disk], MIB, meta, true).unwrap();
    let mut spec = VdiskSpec::new("conf", 1024 * MIB, LayoutKind::Simple);
    spec.physical_block_size = Some(512);
    let v = engine.create_vdisk(&spec).unwrap();
    let reg = Registry::new();
    let iqn = "iqn.2026-11.io.tessera:rados";
    let target = reg.add_target(Target::new(iqn));
    target
        .luns
        .write()
        .insert(0, Arc::new(tessera_vdisk_lun::vdisk_lun(v, 0x7AD05, false)));
    target.set_access(Access::open());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("iscsi://{}/{iqn}/0", listener.local_addr().unwrap());
    tokio::spawn(tessera_iscsi::serve(listener, reg.clone()));
    let out = tokio::task::spawn_blocking(move || cunit::run_suite(&url))
        .await
        .unwrap();
    let (ran, failed) = (cunit::tests_ran(&out), cunit::failures(&out));
    eprintln!("libiscsi on RADOS: {ran} tests ran; failed: {failed:?}");
    assert!(ran >= 200, "the suite did not run ({ran} tests):\n{out}");
    assert!(failed.is_empty(), "conformance failures on RADOS {failed:?}:\n{out}");
    let missing = cunit::not_implemented(&out);
    assert!(
        missing.iter().all(|m| *m == "WRITEATOMIC16"),
        "the suite skipped {missing:?} as not implemented:\n{out}"
    );
    let check = engine.check().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
}
