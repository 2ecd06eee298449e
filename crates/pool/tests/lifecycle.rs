//! Pool lifecycle on in-memory disks: create, import, export, destroy, add, states, slabs.

use std::sync::Arc;

use tessera_disk::{read_label, DiskError, DiskRef, MemDisk};
use tessera_pool::{DiskState, Pool, PoolError};

const MIB: u64 = 1 << 20;

fn disks(n: usize, size: u64) -> Vec<DiskRef> {
    (0..n)
        .map(|i| Arc::new(MemDisk::new(&format!("d{i}"), size)) as DiskRef)
        .collect()
}

fn opener(disks: &[DiskRef]) -> impl Fn(&str) -> Result<DiskRef, DiskError> + '_ {
    move |p: &str| {
        disks
            .iter()
            .find(|d| d.path() == p)
            .cloned()
            .ok_or_else(|| DiskError::Open {
                path: p.into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })
    }
}

#[test]
fn create_import_export_destroy() {
    let dir = tempfile::tempdir().unwrap();
    let pdir = dir.path().join("p");
    let ds = disks(3, 20 * MIB);
    let pool = Pool::create(&pdir, "alpha", ds.clone(), MIB).unwrap();
    let id = pool.id();
    assert_eq!(pool.disks().len(), 3);
    assert_eq!(
        pool.capacity().total_bytes,
        3 * 19 * MIB,
        "19 slabs of 1 MiB per 20 MiB disk"
    );
    for d in &ds {
        let l = read_label(d.as_ref()).unwrap();
        assert_eq!((l.pool_id, l.pool_name.as_str(), l.exported), (id, "alpha", false));
    }
    pool.export().unwrap();
    assert!(read_label(ds[0].as_ref()).unwrap().exported);
    drop(pool);

    let pool = Pool::open(&pdir, &opener(&ds)).unwrap();
    assert_eq!(pool.id(), id);
    let l = read_label(ds[1].as_ref()).unwrap();
    assert!(!l.exported, "an imported pool is in use");
    assert!(pool.disks().iter().all(|d| d.info.state == DiskState::Healthy));
    pool.destroy().unwrap();
    assert!(!pdir.exists(), "the pool directory is removed");
    for d in &ds {
        assert!(read_label(d.as_ref()).is_err(), "labels are wiped");
    }
    // The disks are blank again: a new pool can use them.
    Pool::create(&dir.path().join("q"), "beta", ds, MIB).unwrap();
}

#[test]
fn second_open_of_a_pool_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ds = disks(1, 8 * MIB);
    let _pool = Pool::create(&dir.path().join("p"), "one", ds.clone(), MIB).unwrap();
    let e = Pool::open(&dir.path().join("p"), &opener(&ds)).err().unwrap();
    assert!(matches!(e, PoolError::Meta { .. }), "{e}");
    let e = Pool::create(&dir.path().join("p"), "two", disks(1, 8 * MIB), MIB)
        .err()
        .unwrap();
    assert!(e.to_string().contains("already exists"), "{e}");
}

#[test]
fn bad_creation_requests() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p");
    assert!(Pool::create(&p, "bad name", disks(1, 8 * MIB), MIB).is_err());
    assert!(
        Pool::create(&p, "x", disks(1, 8 * MIB), 3 * MIB).is_err(),
        "slab size not a power of two"
    );
    assert!(
        Pool::create(&p, "x", disks(1, 8 * MIB), MIB / 2).is_err(),
        "slab size below 1 MiB"
    );
    assert!(Pool::create(&p, "x", vec![], MIB).is_err(), "no disk");
    let e = Pool::create(&p, "x", disks(1, MIB + MIB / 2), MIB).err().unwrap();
    assert!(e.to_string().contains("too small"), "{e}");
    let d = disks(1, 8 * MIB);
    let e = Pool::create(&p, "x", vec![d[0].clone(), d[0].clone()], MIB)
        .err()
        .unwrap();
    assert!(e.to_string().contains("listed twice"), "{e}");
    assert!(!p.join("meta").exists(), "a refused creation leaves nothing behind");
}

#[test]
fn slabs_go_to_distinct_and_emptiest_disks() {
    let dir = tempfile::tempdir().unwrap();
    let ds = disks(4, 6 * MIB); // 5 slabs each
    let pool = Pool::create(&dir.path().join("p"), "s", ds, MIB).unwrap();
    let mut taken = Vec::new();
    for _ in 0..10 {
        let s = pool.allocate_slabs(2, &[]).unwrap();
        assert_ne!(s[0].disk, s[1].disk);
        taken.extend(s);
    }
    let used: Vec<u32> = pool.disks().iter().map(|d| d.slabs_used).collect();
    assert_eq!(used, vec![5, 5, 5, 5], "balanced by free space");
    let e = pool.allocate_slabs(1, &[]).err().unwrap();
    assert!(matches!(e, PoolError::NoSpace { .. }), "{e}");
    assert!(e.to_string().contains("is out of space"), "{e}");
    pool.release_slab(taken[0]);
    let e = pool.allocate_slabs(1, &[taken[0].disk]).err().unwrap();
    assert!(e.to_string().contains("is out of space"), "excluded disk: {e}");
    // A set on every disk already (a repair of a member of such a set): not a matter of space.
    let e = pool.allocate_slabs(1, &[0, 1, 2, 3]).err().unwrap();
    assert!(matches!(e, PoolError::NoSpace { .. }), "{e}");
    assert!(
        e.to_string().contains("has too few disks") && !e.to_string().contains("space"),
        "{e}"
    );
    assert_eq!(pool.allocate_slabs(1, &[]).unwrap()[0], taken[0]);
}

#[test]
fn disk_states_persist_and_failed_is_final() {
    let dir = tempfile::tempdir().unwrap();
    let pdir = dir.path().join("p");
    let ds = disks(3, 8 * MIB);
    let pool = Pool::create(&pdir, "st", ds.clone(), MIB).unwrap();
    let d1 = pool.find_disk("d1").unwrap();
    pool.set_disk_state(d1, DiskState::Retired, None).unwrap();
    assert!(pool.readable_disk(d1).is_some(), "a retired disk is still read");
    assert!(pool.allocate_slabs(3, &[]).is_err(), "a retired disk takes no new slab");
    let d2 = pool.find_disk(&pool.disks()[2].info.id.to_string()).unwrap();
    pool.set_disk_state(d2, DiskState::Failed, Some("drill".into()))
        .unwrap();
    assert!(pool.readable_disk(d2).is_none());
    assert!(pool.set_disk_state(d2, DiskState::Healthy, None).is_err());
    assert!(matches!(pool.find_disk("nope"), Err(PoolError::NoSuchDisk { .. })));
    drop(pool);
    let pool = Pool::open(&pdir, &opener(&ds)).unwrap();
    let states: Vec<DiskState> = pool.disks().iter().map(|d| d.info.state).collect();
    assert_eq!(states, vec![DiskState::Healthy, DiskState::Retired, DiskState::Failed]);
    // Adding a new disk, then a disk that is already a member.
    let extra: DiskRef = Arc::new(MemDisk::new("d3", 8 * MIB));
    let info = pool.add_disk(extra.clone()).unwrap();
    assert_eq!(info.position, 3);
    assert!(pool.add_disk(extra).is_err());
}

#[test]
fn a_hot_spare_takes_no_new_sets_and_is_the_first_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let pdir = dir.path().join("p");
    let mut ds = disks(3, 8 * MIB);
    let pool = Pool::create(&pdir, "sp", ds.clone(), MIB).unwrap();
    let spare: DiskRef = Arc::new(MemDisk::new("s0", 8 * MIB));
    ds.push(spare.clone());
    let info = pool.add_spare(spare).unwrap();
    assert_eq!(info.state, DiskState::Spare);
    let c = pool.capacity();
    assert_eq!(
        (c.total_bytes, c.spare_bytes),
        (3 * 7 * MIB, 7 * MIB),
        "spares are not capacity"
    );
    // New slab sets never land on it, even when three disks are asked for.
    for _ in 0..5 {
        let set = pool.allocate_slabs(3, &[]).unwrap();
        assert!(set.iter().all(|s| s.disk != info.position), "{set:?}");
    }
    assert!(pool.allocate_slabs(4, &[]).is_err(), "a spare does not widen a set");
    // A replacement goes to it, and from then on it is a member, also after a reopen.
    let d0 = pool.find_disk("d0").unwrap();
    pool.set_disk_state(d0, DiskState::Failed, Some("drill".into()))
        .unwrap();
    let r = pool.allocate_replacement(&[d0, 1, 2]).unwrap();
    assert_eq!(r.disk, info.position);
    assert_eq!(pool.disk_state(info.position), DiskState::Healthy);
    assert_eq!(pool.capacity().spare_bytes, 0);
    drop(pool);
    let pool = Pool::open(&pdir, &opener(&ds)).unwrap();
    assert_eq!(pool.disk_state(info.position), DiskState::Healthy);
    // With no spare left, a replacement is an ordinary allocation outside the set.
    let r = pool.allocate_replacement(&[1, 2]).unwrap();
    assert_eq!(r.disk, info.position);
    assert!(pool.allocate_replacement(&[1, 2, info.position]).is_err());
}
