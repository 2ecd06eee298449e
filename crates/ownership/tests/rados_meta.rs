//! A pool's metadata store on RADOS, against the cluster `scripts/test-scale-out.sh` starts
//! (TESSERA_CEPH_CONF): the contract every metadata backend keeps, a replaced owner whose
//! batches are refused, and a pool kept wholly in the cluster (data and metadata) that a
//! gateway with nothing of its own opens from another connection.
#![cfg(feature = "fencing")]

mod common;

use std::sync::Arc;

use common::{ceph, ceph_conf, TEST_POOL};

use rand::{Rng, SeedableRng};
use tessera_disk::{DiskError, DiskRef};
use tessera_ownership::fenced_disk::FencedDisk;
use tessera_ownership::rados_meta::RadosMeta;
use tessera_pool::{conformance, MetaBatch, MetaStore, CF_POOL};
use tessera_rados::Cluster;
use tessera_volume::{Engine, LayoutKind, VdiskSpec};

const MIB: u64 = 1 << 20;

fn meta(c: &Arc<Cluster>, oid: &str, epoch: i64) -> RadosMeta {
    RadosMeta::new(Cluster::shared_pool(c, TEST_POOL).unwrap(), oid, epoch)
}

#[test]
fn a_store_on_rados_keeps_the_contract() {
    let _shared = shared();
    let t = "a_store_on_rados_keeps_the_contract";
    let Some(conf) = ceph_conf(t) else { return };
    let c = ceph(&conf);
    let n = std::sync::atomic::AtomicU32::new(0);
    conformance::check_backend(|| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        meta(&c, &format!("{t}-{}-{i}", std::process::id()), 1)
    });
}

#[test]
fn a_replaced_owner_commits_nothing() {
    let _shared = shared();
    let t = "a_replaced_owner_commits_nothing";
    let Some(conf) = ceph_conf(t) else { return };
    let oid = format!("{t}-{}", std::process::id());
    let (ca, cb) = (ceph(&conf), ceph(&conf));
    let old = MetaStore::on(meta(&ca, &oid, 5));
    let new = MetaStore::on(meta(&cb, &oid, 7));
    let put = |k: &str, v: &str| {
        let mut b = MetaBatch::new();
        b.put(CF_POOL, k, v);
        b.count(tessera_pool::CF_REFCOUNTS, k, 1);
        b
    };
    old.commit(put("a", "old"), true).unwrap();
    new.commit(put("b", "new"), true).unwrap();
    let refused = old
        .commit(put("a", "stale"), true)
        .expect_err("the replaced owner committed");
    assert!(refused.to_string().contains("fenced"), "{refused}");
    // Said to be not applied: the guard that refused it is checked in the same operation.
    assert!(
        refused.to_string().contains("was refused, and not applied"),
        "{refused}"
    );
    assert!(!refused.to_string().contains("may or may not"), "{refused}");
    for s in [&old, &new] {
        assert_eq!(
            s.get(CF_POOL, b"a").unwrap().as_deref(),
            Some(&b"old"[..]),
            "the refused batch left nothing"
        );
        assert_eq!(s.get(CF_POOL, b"b").unwrap().as_deref(), Some(&b"new"[..]));
    }
    let count = new.get(tessera_pool::CF_REFCOUNTS, b"a").unwrap();
    assert_eq!(
        count.map(|v| tessera_pool::decode_refcount(&v)),
        Some(1),
        "nor its count"
    );
}

/// A destroy's removal of the metadata object is guarded by the epoch in the same operation:
/// a replaced owner removes nothing of the pool its successor serves; the owner removes it,
/// and a second removal finds it gone and is done.
#[test]
fn a_replaced_owner_removes_no_metadata() {
    let _shared = shared();
    let t = "a_replaced_owner_removes_no_metadata";
    let Some(conf) = ceph_conf(t) else { return };
    let oid = format!("{t}-{}", std::process::id());
    let (ca, cb) = (ceph(&conf), ceph(&conf));
    let (old, new) = (meta(&ca, &oid, 5), meta(&cb, &oid, 7));
    let mut b = MetaBatch::new();
    b.put(CF_POOL, "a", "old");
    tessera_pool::MetaBackend::commit(&old, &b, true).unwrap();
    tessera_pool::MetaBackend::commit(&new, &MetaBatch::new(), true).unwrap();
    let refused = old.remove().expect_err("the replaced owner removed the metadata");
    assert!(refused.to_string().contains("fenced"), "{refused}");
    let pool = Cluster::shared_pool(&ca, TEST_POOL).unwrap();
    assert!(pool.size(&oid).unwrap().is_some(), "the metadata object is gone");
    assert_eq!(
        MetaStore::on(meta(&cb, &oid, 7)).get(CF_POOL, b"a").unwrap().as_deref(),
        Some(&b"old"[..])
    );
    new.remove().unwrap();
    assert_eq!(pool.size(&oid).unwrap(), None);
    new.remove().unwrap();
}

/// A metadata object removed under its store (by hand, or with the pool destroyed while a
/// job of it still ran) is not made again by the next commit, holding that change alone,
/// which the next opening would take for the whole pool: the commit fails, and says why.
/// Until 2026-12-06 it made the object again. A fenced commit says it was fenced off.
#[test]
fn a_metadata_object_removed_under_its_store_is_not_made_again() {
    let _shared = shared();
    let t = "a_metadata_object_removed_under_its_store_is_not_made_again";
    let Some(conf) = ceph_conf(t) else { return };
    let oid = format!("{t}-{}", std::process::id());
    let c = ceph(&conf);
    let store = MetaStore::on(meta(&c, &oid, 5));
    let put = |k: &str| {
        let mut b = MetaBatch::new();
        b.put(CF_POOL, k, "v");
        b
    };
    // Made by the first commit; the next ones find it.
    store.commit(put("a"), true).unwrap();
    store.commit(put("b"), true).unwrap();
    let pool = Cluster::shared_pool(&c, TEST_POOL).unwrap();
    pool.remove(&oid).unwrap();
    let e = store
        .commit(put("c"), true)
        .expect_err("the removed object was made again");
    assert!(e.to_string().contains("the metadata object is gone"), "{e}");
    assert!(e.to_string().contains("was refused, and not applied"), "{e}");
    assert_eq!(pool.size(&oid).unwrap(), None);
    // A store opened on an object that is there knows it from its first read.
    let other = format!("{oid}-2");
    MetaStore::on(meta(&c, &other, 5)).commit(put("a"), true).unwrap();
    let reopened = MetaStore::on(meta(&c, &other, 5));
    assert!(reopened.get(CF_POOL, b"a").unwrap().is_some());
    pool.remove(&other).unwrap();
    assert!(reopened.commit(put("c"), true).is_err());
    assert_eq!(pool.size(&other).unwrap(), None);
    // Nor one whose caller saw it there (an opening's stamp, after its records were read).
    let seen = MetaStore::on(meta(&c, &format!("{oid}-3"), 5).seen());
    assert!(seen.commit(put("a"), true).is_err(), "an object seen was made");
    assert_eq!(pool.size(&format!("{oid}-3")).unwrap(), None);

    // Fenced off: said so.
    let fenced = ceph(&conf);
    let store = MetaStore::on(meta(&fenced, &oid, 6));
    c.blocklist(&fenced.address().unwrap(), 3600).unwrap();
    // A read of the pool's object through the other client brings its placement group the
    // map that blocklists this one.
    let _ = pool.size(&oid);
    let e = store.commit(put("d"), true).expect_err("a fenced client committed");
    assert!(e.to_string().contains("fenced off"), "{e}");
    // An operation a blocklisted client had sent may have been applied before the OSD
    // learnt of the blocklist: its outcome is not known.
    assert!(e.to_string().contains("may or may not be applied"), "{e}");
}

/// The commits of one store (one owner's) go one after another, rather than overtake each
/// other on the object's version and compute again: many threads committing count deltas at
/// once are never overtaken, and the counts add up. A second store on the object (another
/// gateway's) does overtake them, and they still add up.
#[test]
fn the_commits_of_one_store_do_not_overtake_each_other() {
    use tessera_pool::MetaBackend;
    let _shared = shared();
    let t = "the_commits_of_one_store_do_not_overtake_each_other";
    let Some(conf) = ceph_conf(t) else { return };
    let oid = format!("{t}-{}", std::process::id());
    let c = ceph(&conf);
    let one = Arc::new(meta(&c, &oid, 5));
    let other = Arc::new(meta(&c, &oid, 5));
    let count = |n: i64| {
        let mut b = MetaBatch::new();
        b.count(tessera_pool::CF_REFCOUNTS, b"n", n);
        b.put(CF_POOL, b"last", n.to_le_bytes());
        b
    };
    let run = |stores: &[&Arc<RadosMeta>]| {
        std::thread::scope(|s| {
            for (i, store) in stores.iter().cycle().take(4).enumerate() {
                s.spawn(move || {
                    for _ in 0..25 {
                        store.commit(&count(i as i64 + 1), true).unwrap();
                    }
                });
            }
        });
    };
    run(&[&one]);
    assert_eq!(one.overtaken(), 0, "the commits of one store overtook each other");
    let n = one
        .get(tessera_pool::CF_REFCOUNTS, b"n")
        .unwrap()
        .map(|v| tessera_pool::decode_refcount(&v));
    assert_eq!(n, Some(25 * (1 + 2 + 3 + 4)));
    run(&[&one, &other]);
    let n = one
        .get(tessera_pool::CF_REFCOUNTS, b"n")
        .unwrap()
        .map(|v| tessera_pool::decode_refcount(&v));
    assert_eq!(n, Some(2 * 25 * (1 + 2 + 3 + 4)), "counts lost between two stores");
    eprintln!(
        "{t}: two stores overtook each other {} times",
        one.overtaken() + other.overtaken()
    );
    Cluster::shared_pool(&c, TEST_POOL).unwrap().remove(&oid).unwrap();
}

/// A metadata object whose version is written otherwise than a commit writes it ("5", not
/// zero-padded) still takes batches, guarded by the bytes read; an object there without a
/// version at all (not a pool's, or damaged) is refused at once with why, not after ten
/// thousand tries.
#[test]
fn a_version_written_otherwise_is_taken_and_an_object_without_one_refused() {
    let _shared = shared();
    let t = "a_version_written_otherwise_is_taken_and_an_object_without_one_refused";
    let Some(conf) = ceph_conf(t) else { return };
    let c = ceph(&conf);
    let pool = Cluster::shared_pool(&c, TEST_POOL).unwrap();
    let oid = format!("{t}-{}", std::process::id());
    let store = MetaStore::on(meta(&c, &oid, 3));
    let put = |k: &str, v: &str| {
        let mut b = MetaBatch::new();
        b.put(CF_POOL, k, v);
        b
    };
    store.commit(put("a", "1"), true).unwrap();
    pool.operate(
        &oid,
        &tessera_rados::WriteOp::new().set_xattr(tessera_ownership::rados_meta::VERSION_ATTR, b"5"),
    )
    .unwrap();
    let started = std::time::Instant::now();
    store.commit(put("b", "2"), true).unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(store.get(CF_POOL, b"b").unwrap().as_deref(), Some(&b"2"[..]));

    let bare = format!("{oid}-bare");
    pool.write_full(&bare, b"not metadata").unwrap();
    let store = MetaStore::on(meta(&c, &bare, 3));
    let started = std::time::Instant::now();
    let e = store.commit(put("a", "1"), true).unwrap_err();
    assert!(e.to_string().contains("exists without its"), "{e}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// The records of family `pool` in `store`, as a scan reads them and as a snapshot does.
type Records = Vec<(Vec<u8>, Vec<u8>)>;
fn scanned_and_snapshotted(store: &MetaStore) -> (Records, Records) {
    let mut scanned = Vec::new();
    store
        .for_each_prefix(CF_POOL, b"", |k, v| {
            scanned.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
    let mut seen = Vec::new();
    store
        .snapshot()
        .for_each_prefix(CF_POOL, b"", |k, v| {
            seen.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
    (scanned, seen)
}

/// Omap keys of the metadata object that no commit writes (put there by hand or by another
/// program: not hex, upper-case hex, a sign, no family) are no records: a scan passes them
/// over and reads the family's records, in order, as the snapshot does, rather than failing
/// on them or reading one key twice.
#[test]
fn stray_omap_keys_are_no_records_to_a_scan_or_a_snapshot() {
    let _shared = shared();
    let t = "stray_omap_keys_are_no_records_to_a_scan_or_a_snapshot";
    let Some(conf) = ceph_conf(t) else { return };
    let c = ceph(&conf);
    let pool = Cluster::shared_pool(&c, TEST_POOL).unwrap();
    let oid = format!("{t}-{}", std::process::id());
    let store = MetaStore::on(meta(&c, &oid, 3));
    let mut b = MetaBatch::new();
    for (k, v) in [(&b"\x0f"[..], &b"1"[..]), (b"\xab", b"2"), (b"\xcd", b"3")] {
        b.put(CF_POOL, k, v);
    }
    store.commit(b, true).unwrap();
    let stray: [(&[u8], &[u8]); 5] = [
        (b"pool/zz", b"x"),
        (b"pool/AB", b"upper"),
        (b"pool/+f", b"sign"),
        (b"pool/abc", b"odd"),
        (b"junk", b"no family"),
    ];
    pool.operate(&oid, &tessera_rados::WriteOp::new().omap_set(&stray))
        .unwrap();
    let expected: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (vec![0x0f], b"1".to_vec()),
        (vec![0xab], b"2".to_vec()),
        (vec![0xcd], b"3".to_vec()),
    ];
    let (scanned, seen) = scanned_and_snapshotted(&store);
    assert_eq!(scanned, expected, "the scan");
    assert_eq!(seen, expected, "the snapshot");
    assert_eq!(store.range_from(CF_POOL, &[0xab], 10).unwrap(), expected[1..]);
}

/// Omap keys holding a NUL byte (put there by hand: a commit writes hex) are strays too, even
/// at a page's end, where librados is asked to page past a key and takes it as a C string: a
/// scan and a snapshot read every record after them, even past more such keys than a page
/// holds, rather than fail or read the same page forever.
#[test]
fn omap_keys_holding_a_nul_byte_at_a_pages_end_do_not_stop_a_scan() {
    let _shared = shared();
    let t = "omap_keys_holding_a_nul_byte_at_a_pages_end_do_not_stop_a_scan";
    let Some(conf) = ceph_conf(t) else { return };
    let c = ceph(&conf);
    let pool = Cluster::shared_pool(&c, TEST_POOL).unwrap();
    let oid = format!("{t}-{}", std::process::id());
    let store = MetaStore::on(meta(&c, &oid, 3));
    // A page is a thousand omap keys: the 999th record ends the first page's records, and
    // the keys holding a NUL that follow it sort before the next record.
    let expected: Vec<(Vec<u8>, Vec<u8>)> = (0u16..2048)
        .map(|i| (i.to_be_bytes().to_vec(), format!("v{i}").into_bytes()))
        .collect();
    let mut b = MetaBatch::new();
    for (k, v) in &expected {
        b.put(CF_POOL, k, v);
    }
    store.commit(b, true).unwrap();
    let strays: Vec<Vec<u8>> = (0..1200).map(|i| format!("pool/03e6\0{i:05}").into_bytes()).collect();
    let pairs: Vec<(&[u8], &[u8])> = strays.iter().map(|k| (k.as_slice(), &b"stray"[..])).collect();
    pool.operate(&oid, &tessera_rados::WriteOp::new().omap_set(&pairs))
        .unwrap();
    let (scanned, seen) = scanned_and_snapshotted(&store);
    assert!(scanned == expected, "the scan read {} records", scanned.len());
    assert!(seen == expected, "the snapshot read {} records", seen.len());
    assert_eq!(
        store.range_from(CF_POOL, &[0x03, 0xe0], 10).unwrap(),
        expected[0x3e0..0x3ea]
    );
    pool.remove(&oid).unwrap();
}

/// A snapshot of a store that commits without pause (a busy pool's metadata, read by a
/// scan) is still read, and consistent: after a few reads that commits overtook, one holds
/// the store's commits back while it reads, and they go on after it.
#[test]
fn a_snapshot_is_read_while_its_store_commits_on() {
    let _shared = shared();
    let t = "a_snapshot_is_read_while_its_store_commits_on";
    let Some(conf) = ceph_conf(t) else { return };
    let c = ceph(&conf);
    let oid = format!("{t}-{}", std::process::id());
    let store = MetaStore::on(meta(&c, &oid, 3));
    let mut b = MetaBatch::new();
    for i in 0u16..3000 {
        b.put(CF_POOL, i.to_be_bytes(), b"filler");
    }
    store.commit(b, true).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let commits = std::sync::atomic::AtomicU64::new(0);
    let pair = |snap: &tessera_pool::MetaSnapshot| {
        let mut ab = (None, None);
        snap.for_each_prefix(CF_POOL, b"", |k, v| {
            match k {
                b"\x00" => ab.0 = Some(v.to_vec()),
                b"\xff" => ab.1 = Some(v.to_vec()),
                _ => {}
            }
            Ok(())
        })
        .map(|()| ab)
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                // The first record and the last, pages apart.
                let mut b = MetaBatch::new();
                b.put(CF_POOL, b"\x00", n.to_le_bytes());
                b.put(CF_POOL, b"\xff", n.to_le_bytes());
                store.commit(b, true).unwrap();
                commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let mut read = Vec::new();
        let mut slowest = std::time::Duration::ZERO;
        let mut last = 0;
        for _ in 0..5 {
            // Commits went on since the last snapshot (or stopped: the committer failed).
            let waited = std::time::Instant::now();
            while commits.load(std::sync::atomic::Ordering::Relaxed) < last + 20
                && waited.elapsed() < std::time::Duration::from_secs(30)
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let started = std::time::Instant::now();
            let snap = store.snapshot();
            slowest = slowest.max(started.elapsed());
            read.push(pair(&snap).map_err(|e| e.to_string()));
            last = commits.load(std::sync::atomic::Ordering::Relaxed);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        eprintln!("{t}: the slowest of 5 snapshots of 3,002 records took {slowest:?}");
        for (round, r) in read.into_iter().enumerate() {
            let (a, b) = r.unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert!(
                a.is_some() && a == b,
                "round {round}: a snapshot between a batch's two records"
            );
        }
    });
    assert!(
        commits.load(std::sync::atomic::Ordering::Relaxed) >= 100,
        "commits did not go on around the snapshots"
    );
    eprintln!(
        "{t}: {} commits around 5 snapshots",
        commits.load(std::sync::atomic::Ordering::Relaxed)
    );
    Cluster::shared_pool(&c, TEST_POOL).unwrap().remove(&oid).unwrap();
}

/// Held by every test of this file, and alone by one that makes the OSDs refuse writes.
static CLUSTER: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CLUSTER.read().unwrap_or_else(|e| e.into_inner())
}

/// Makes the OSDs refuse (`on`) or take again every write that sets an attribute, as every
/// batch of a `RadosMeta` does (EFBIG: `osd_max_attr_size` of one byte), while reads go on;
/// returns once a write of test pool `pool` shows it.
fn refuse_attribute_writes(conf: &str, pool: &str, on: bool) {
    let ceph = |args: &[&str]| {
        std::process::Command::new(args[0])
            .args(["-c", conf])
            .args(&args[1..])
            .output()
            .expect("the ceph tools")
    };
    let out = if on {
        ceph(&["ceph", "config", "set", "osd", "osd_max_attr_size", "1"])
    } else {
        ceph(&["ceph", "config", "rm", "osd", "osd_max_attr_size"])
    };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = std::time::Instant::now();
    while ceph(&[
        "rados",
        "-p",
        pool,
        "setxattr",
        "tessera-attribute-probe",
        "probe",
        "value",
    ])
    .status
    .success()
        == on
    {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "the OSDs did not take the setting"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if !on {
        ceph(&["rados", "-p", pool, "rm", "tessera-attribute-probe"]);
    }
}

/// A batch whose write fails other than by a guard (here the OSDs refuse it; one that timed
/// out may still be applied, now or later) leaves what the engine holds unlike what the
/// cluster may hold: the store tells its owner once, and commits and syncs nothing more, so
/// that they can differ no further.
#[test]
fn a_batch_whose_outcome_is_unknown_stops_the_store_and_tells_its_owner() {
    let t = "a_batch_whose_outcome_is_unknown_stops_the_store_and_tells_its_owner";
    let _alone = CLUSTER.write().unwrap_or_else(|e| e.into_inner());
    let Some(conf) = ceph_conf(t) else { return };
    let oid = format!("{t}-{}", std::process::id());
    let owner = ceph(&conf);
    let told = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let tell = told.clone();
    let store = MetaStore::on(meta(&owner, &oid, 3)).on_unknown(move |why| tell.lock().unwrap().push(why.to_string()));
    let put = |k: &str| {
        let mut b = MetaBatch::new();
        b.put(CF_POOL, k, "v");
        b
    };
    store.commit(put("a"), true).unwrap();
    store.sync().unwrap();
    // And a store's own commits queued behind one of unknown outcome send nothing (rather
    // than each wait out the cluster's timeout, when it is the cluster that does not answer).
    let direct = meta(&owner, &format!("{oid}-direct"), 3);
    tessera_pool::MetaBackend::commit(&direct, &put("a"), true).unwrap();
    refuse_attribute_writes(&conf, TEST_POOL, true);
    let refused = store.commit(put("b"), true);
    let direct_refused = tessera_pool::MetaBackend::commit(&direct, &put("b"), true);
    refuse_attribute_writes(&conf, TEST_POOL, false);
    let e = direct_refused.expect_err("a commit the OSDs refused");
    assert!(
        matches!(e, tessera_pool::PoolError::Meta { .. }),
        "not of unknown outcome: {e}"
    );
    let e =
        tessera_pool::MetaBackend::commit(&direct, &put("c"), true).expect_err("a commit after one of unknown outcome");
    assert!(e.to_string().contains("an earlier commit through this store"), "{e}");
    assert!(
        matches!(e, tessera_pool::PoolError::MetaRefused { .. }),
        "sent, not refused: {e}"
    );
    Cluster::shared_pool(&owner, TEST_POOL)
        .unwrap()
        .remove(&format!("{oid}-direct"))
        .unwrap();
    let e = refused.expect_err("a commit the OSDs refused");
    assert!(e.to_string().contains("may or may not be applied"), "{e}");
    assert_eq!(told.lock().unwrap().len(), 1, "told once");
    let again = store
        .commit(put("c"), true)
        .expect_err("a commit after one of unknown outcome");
    assert!(again.to_string().contains("opened again"), "{again}");
    assert!(store.sync().is_err(), "a sync after a commit of unknown outcome");
    assert_eq!(told.lock().unwrap().len(), 1, "told once only");
    Cluster::shared_pool(&owner, TEST_POOL).unwrap().remove(&oid).unwrap();
}

/// A pool wholly in the cluster: its disk a `FencedDisk`, its metadata a `RadosMeta`. Another
/// gateway, through its own connection and with an empty directory of its own, opens it at a
/// later epoch and finds every vdisk, snapshot and clone whole; the first, replaced, can
/// write no more metadata.
#[test]
fn a_pool_wholly_on_rados_opens_from_another_gateway() {
    let _shared = shared();
    let t = "a_pool_wholly_on_rados_opens_from_another_gateway";
    let Some(conf) = ceph_conf(t) else { return };
    let id = format!("{t}-{}", std::process::id());
    let size = 64 * MIB;
    let mut data = vec![0u8; 6 * MIB as usize];
    rand::rngs::StdRng::seed_from_u64(9).fill(&mut data[..]);
    let here = tempfile::tempdir().unwrap();
    let ca = ceph(&conf);
    let disk_a: DiskRef =
        Arc::new(FencedDisk::new(Cluster::shared_pool(&ca, TEST_POOL).unwrap(), &id, size, 1).unwrap());
    let first = Engine::create_pool_with_meta(
        &here.path().join("p"),
        "p",
        vec![disk_a],
        MIB,
        MetaStore::on(meta(&ca, &format!("{id}.meta"), 1)),
        true,
    )
    .unwrap();
    let v = first
        .create_vdisk(&VdiskSpec::new("v", 16 * MIB, LayoutKind::Simple))
        .unwrap();
    v.write(MIB, &data, true).unwrap();
    first.snapshot("v", "s").unwrap();
    first.clone_vdisk("v", "c").unwrap();
    let half = MIB as usize / 2;
    v.write(MIB, &data[2 * half..3 * half], true).unwrap();
    first.flush().unwrap();

    // The other gateway: nothing local, another connection, a later epoch.
    let there = tempfile::tempdir().unwrap();
    let cb = ceph(&conf);
    let opener = |path: &str| -> Result<DiskRef, DiskError> {
        assert_eq!(path, format!("rados:{TEST_POOL}/{id}"));
        Ok(Arc::new(FencedDisk::new(
            Cluster::shared_pool(&cb, TEST_POOL).unwrap(),
            &id,
            size,
            2,
        )?))
    };
    let second = Engine::open_with_meta(
        &there.path().join("p"),
        &opener,
        MetaStore::on(meta(&cb, &format!("{id}.meta"), 2)),
    )
    .unwrap();
    let read = |name: &str| {
        let mut out = vec![0u8; data.len()];
        second.vdisk(name).unwrap().read(MIB, &mut out).unwrap();
        out
    };
    let mut now = data.clone();
    now[..half].copy_from_slice(&data[2 * half..3 * half]);
    assert!(read("v") == now, "v reads wrong at the other gateway");
    assert!(read("v@s") == data, "the snapshot reads wrong at the other gateway");
    assert!(read("c") == data, "the clone reads wrong at the other gateway");
    let check = second.check().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    // The other gateway writes: the first, replaced, can commit no metadata any more.
    second
        .vdisk("c")
        .unwrap()
        .write(0, &data[..MIB as usize], true)
        .unwrap();
    let stale = first.vdisk("v").unwrap().write(8 * MIB, &data[..MIB as usize], true);
    assert!(stale.is_err(), "the replaced gateway's write was acknowledged");
    assert!(second.check().unwrap().problems.is_empty());
}
