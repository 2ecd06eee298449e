//! The engine on a metadata store other than RocksDB: every layer reaches its records through
//! the `MetaStore` seam only, so a pool whose metadata lives elsewhere (in memory here, on
//! RADOS for the pools that several gateways open) works the same, and comes back whole.

mod common;

use std::sync::Arc;

use common::{enable_dedup, pattern, run_dedup, MIB};
use tessera_disk::{DiskError, DiskRef, MemDisk};
use tessera_pool::{MemoryMeta, MetaStore, CF_GRAINS, CF_POOL};
use tessera_volume::{Compression, Engine, LayoutKind, Progress, VdiskSpec};

fn read_all(e: &Engine, name: &str, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    e.vdisk(name).unwrap().read(0, &mut out).unwrap();
    out
}

#[test]
fn a_pool_on_a_memory_store_serves_every_service_and_opens_again_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let pool_dir = dir.path().join("p");
    let disks: Vec<Arc<MemDisk>> = (0..4)
        .map(|i| Arc::new(MemDisk::new(&format!("m{i}"), 96 * MIB)))
        .collect();
    let refs: Vec<DiskRef> = disks.iter().map(|d| d.clone() as DiskRef).collect();
    let meta = MemoryMeta::new();
    let e = Engine::create_pool_with_meta(&pool_dir, "p", refs, MIB, MetaStore::on(meta.clone()), true).unwrap();
    assert!(
        !pool_dir.join("meta").exists(),
        "no RocksDB metadata store was made beside the pool"
    );
    let size = 8 * MIB;
    for (name, layout) in [
        ("m", LayoutKind::Mirror),
        ("p", LayoutKind::Parity),
        ("d", LayoutKind::Mirror),
    ] {
        e.create_vdisk(&VdiskSpec::new(name, size, layout)).unwrap();
    }
    let a = pattern(1, 0, size as usize);
    let b = pattern(2, 0, size as usize);
    e.vdisk("m").unwrap().write(0, &a, false).unwrap();
    e.vdisk("p").unwrap().write(0, &b, false).unwrap();
    // The same data twice, for dedup to find; a snapshot and a clone that share grains.
    e.vdisk("d").unwrap().write(0, &a, false).unwrap();
    e.snapshot("m", "before").unwrap();
    e.clone_vdisk("p", "p2").unwrap();
    e.vdisk("m").unwrap().write(MIB, &b[..MIB as usize], true).unwrap();
    e.vdisk("p2").unwrap().write(0, &a[..MIB as usize], true).unwrap();
    enable_dedup(&e, Compression::Zstd);
    let r = run_dedup(&e);
    assert!(
        r.grains_shared > 0,
        "dedup found the copy through the memory store: {r:?}"
    );
    let scan = e.scan(&Progress::default()).unwrap();
    assert_eq!(scan.findings, 0, "{scan:?}");
    let mut m_now = a.clone();
    m_now[MIB as usize..2 * MIB as usize].copy_from_slice(&b[..MIB as usize]);
    let mut p2_now = b.clone();
    p2_now[..MIB as usize].copy_from_slice(&a[..MIB as usize]);
    let expect = [("m", &m_now), ("m@before", &a), ("d", &a), ("p", &b), ("p2", &p2_now)];
    for (name, want) in expect {
        assert!(read_all(&e, name, size as usize) == *want, "{name} reads wrong");
    }
    let grains = meta_keys(&meta);
    assert!(grains > 0, "the grain map is in the memory store");
    // What a logical unit keeps beside its vdisk (reservations, mode settings) is in the
    // store too; a memory store is this machine's alone.
    assert!(!e.metadata_shared());
    let p2 = e.vdisk("p2").unwrap();
    assert_eq!(e.lun_state(&p2, "reservations").unwrap(), None);
    e.set_lun_state(&p2, "reservations", Some(b"held by node 1")).unwrap();
    e.set_lun_state(&p2, "mode", Some(b"wce")).unwrap();
    e.set_lun_state(&e.vdisk("p").unwrap(), "mode", Some(b"p's own"))
        .unwrap();
    e.set_lun_state(&p2, "mode", None).unwrap();
    assert_eq!(e.lun_state(&p2, "mode").unwrap(), None, "forgotten");
    drop(p2);
    e.flush().unwrap();
    e.export().unwrap();

    // Opened again from the same records (a clone of the store shares them) and the same disks.
    let opener = |path: &str| -> Result<DiskRef, DiskError> {
        let d = disks
            .iter()
            .find(|d| tessera_disk::BlockDevice::path(d.as_ref()) == path);
        Ok(d.expect("a disk of the pool").clone() as DiskRef)
    };
    let e = Engine::open_with_meta(&pool_dir, &opener, MetaStore::on(meta.clone())).unwrap();
    for (name, want) in expect {
        assert!(
            read_all(&e, name, size as usize) == *want,
            "{name} reads wrong after the reopen"
        );
    }
    let check = e.check().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(meta_keys(&meta), grains);
    let p2 = e.vdisk("p2").unwrap();
    assert_eq!(
        e.lun_state(&p2, "reservations").unwrap().as_deref(),
        Some(&b"held by node 1"[..]),
        "a logical unit's record comes back with the pool"
    );
    let records = || {
        let mut n = 0;
        MetaStore::on(meta.clone())
            .for_each_prefix(CF_POOL, b"lun-state", |_, _| {
                n += 1;
                Ok(())
            })
            .unwrap();
        n
    };
    assert_eq!(records(), 2);
    e.delete_vdisk("p2").unwrap();
    assert_eq!(
        records(),
        1,
        "deleting a vdisk takes its logical unit's records, no other"
    );
    assert!(
        e.set_lun_state(&p2, "reservations", Some(b"late")).is_err(),
        "nothing is kept for a deleted vdisk"
    );
    assert_eq!(records(), 1);
    drop(p2);
    assert!(
        meta_keys(&meta) < grains,
        "deleting a vdisk takes its grain map from the store"
    );
    let check = e.check().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);

    // A second pool over the same records is refused, and leaves them alone.
    let other: Vec<DiskRef> = vec![Arc::new(MemDisk::new("x", 16 * MIB))];
    let refused = Engine::create_pool_with_meta(
        &dir.path().join("q"),
        "q",
        other,
        MIB,
        MetaStore::on(meta.clone()),
        true,
    );
    assert!(refused.is_err(), "a store that holds a pool takes no second one");
    assert!(read_all(&e, "m", size as usize) == m_now);
}

fn meta_keys(meta: &MemoryMeta) -> u64 {
    tessera_pool::MetaBackend::estimate_keys(meta, CF_GRAINS)
}
