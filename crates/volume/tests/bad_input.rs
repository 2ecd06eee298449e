//! Bad input gets a clear error and changes nothing: corrupt and foreign labels, missing
//! disks, unaligned or out-of-range I/O, impossible layouts, a full pool.

mod common;

use std::sync::Arc;

use common::{pattern, spec, Rig, MIB};
use tessera_disk::{read_label, BlockDevice, DiskRef, MemDisk};
use tessera_volume::{DiskState, Engine, LayoutKind, Provisioning, VdiskSpec, VolumeError};

#[test]
fn corrupt_label_is_refused_and_left_alone() {
    let mut rig = Rig::new(3, 32 * MIB, MIB);
    rig.engine()
        .create_vdisk(&spec("v", 2 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let data = pattern(1, 0, 2 * MIB as usize);
    rig.engine().vdisk("v").unwrap().write(0, &data, true).unwrap();
    rig.engine = None;
    // Damage disk 1's label.
    rig.disks[1].faults().flip_bit(100, 0).unwrap();
    let mut before = vec![0u8; 4096];
    rig.disks[1].read_at(&mut before, 0).unwrap();
    rig.reopen();
    let d = &rig.engine().pool().disks()[1];
    assert_eq!(d.info.state, DiskState::Missing);
    assert!(
        d.problem.as_deref().unwrap_or("").contains("corrupt"),
        "{:?}",
        d.problem
    );
    let mut after = vec![0u8; 4096];
    rig.disks[1].read_at(&mut after, 0).unwrap();
    assert_eq!(before, after, "a corrupt label must never be overwritten");
    // The data is still there through the other copy.
    let mut b = vec![0u8; 2 * MIB as usize];
    rig.engine().vdisk("v").unwrap().read(0, &mut b).unwrap();
    assert_eq!(b, data);
}

#[test]
fn another_pools_disk_is_refused() {
    let rig = Rig::new(2, 32 * MIB, MIB);
    let dir = tempfile::tempdir().unwrap();
    let spare: DiskRef = Arc::new(MemDisk::new("spare", 32 * MIB));
    let foreign: DiskRef = rig.disks[0].clone();
    let err = Engine::create_pool(&dir.path().join("p2"), "other", vec![spare.clone(), foreign], MIB)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("already carries a label of pool 'test'"),
        "{err}"
    );
    // Nothing was written, not even to the blank disk.
    assert!(read_label(spare.as_ref()).is_err());
    assert!(
        rig.engine().pool().add_disk(rig.disks[1].clone()).is_err(),
        "a member cannot be added twice"
    );
}

#[test]
fn missing_disk_at_import_opens_degraded() {
    let mut rig = Rig::new(3, 32 * MIB, MIB);
    rig.engine()
        .create_vdisk(&spec("v", 2 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let data = pattern(2, 0, 2 * MIB as usize);
    rig.engine().vdisk("v").unwrap().write(0, &data, true).unwrap();
    rig.engine = None;
    let gone = rig.disks.remove(0);
    rig.reopen();
    let d = &rig.engine().pool().disks()[0];
    assert_eq!(d.info.state, DiskState::Missing);
    let mut b = vec![0u8; 2 * MIB as usize];
    rig.engine().vdisk("v").unwrap().read(0, &mut b).unwrap();
    assert_eq!(b, data);
    // Written to while it was away, the disk's data is stale when it comes back where a
    // write went around it: read around there until a repair (tests/returning_disk.rs).
    rig.engine()
        .vdisk("v")
        .unwrap()
        .write(0, &pattern(3, 0, 4096), true)
        .unwrap();
    rig.engine = None;
    rig.disks.insert(0, gone);
    rig.reopen();
    assert_eq!(rig.engine().pool().disks()[0].info.state, DiskState::Healthy);
    assert!(rig.engine().layouts().stale_members() > 0);
    for _ in 0..4 {
        rig.engine().vdisk("v").unwrap().read(0, &mut b[..4096]).unwrap();
        assert_eq!(&b[..4096], &pattern(3, 0, 4096)[..]);
    }
}

/// The stripe journal holds the regions a crash may have left half written and the blocks'
/// checksums: a pool that holds data whose journal is gone is refused with why, not opened
/// with an empty one; created empty on purpose, it opens.
#[test]
fn a_pool_whose_stripe_journal_is_gone_is_refused() {
    let mut rig = Rig::new(3, 32 * MIB, MIB);
    let data = pattern(4, 0, MIB as usize);
    rig.engine()
        .create_vdisk(&spec("v", 2 * MIB, LayoutKind::Parity, Provisioning::Thin))
        .unwrap()
        .write(0, &data, true)
        .unwrap();
    rig.engine = None;
    let journal = rig.dir.path().join("pool").join("journal");
    std::fs::rename(&journal, rig.dir.path().join("journal.moved")).unwrap();
    let e = Engine::open(&rig.dir.path().join("pool"), &rig.opener()).err().unwrap();
    assert!(
        e.to_string().contains("stripe journal") && e.to_string().contains("missing"),
        "{e}"
    );
    assert!(!journal.exists(), "nothing made in its place");
    std::fs::create_dir(&journal).unwrap();
    rig.reopen();
    let mut got = vec![0u8; MIB as usize];
    rig.engine().vdisk("v").unwrap().read(0, &mut got).unwrap();
    assert!(got == data);
}

#[test]
fn bad_requests_get_clear_errors() {
    let rig = Rig::new(2, 32 * MIB, MIB);
    let mut s = spec("v", MIB, LayoutKind::Simple, Provisioning::Thin);
    s.block_size = Some(4096);
    let v = rig.engine().create_vdisk(&s).unwrap();
    let mut b = vec![0u8; 4096];
    let e = v.read(512, &mut b).unwrap_err().to_string();
    assert!(e.contains("not aligned to the 4096 byte block size"), "{e}");
    let e = v.read(MIB, &mut b).unwrap_err().to_string();
    assert!(e.contains("beyond the end"), "{e}");
    let e = v.write(0, &[], false).unwrap_err().to_string();
    assert!(e.contains("zero-length"), "{e}");
    let e = v.trim(u64::MAX - 4095, 4096).unwrap_err().to_string();
    assert!(e.contains("beyond the end"), "{e}");
    let e = rig.engine().create_vdisk(&s).unwrap_err();
    assert!(matches!(e, VolumeError::Exists(_)), "{e}");
    for (name, size, bs) in [
        ("bad/name", MIB, 512),
        ("ok", 1000, 512),
        ("ok", MIB, 1024),
        ("ok", 0, 512),
    ] {
        let mut s = VdiskSpec::new(name, size, LayoutKind::Simple);
        s.block_size = Some(bs);
        assert!(rig.engine().create_vdisk(&s).is_err(), "{name} {size} {bs}");
    }
    for (bs, pbs, why) in [
        (512, 1024, "must be 512 or 4096"),
        (4096, 512, "smaller than the 4096 byte logical"),
    ] {
        let mut s = VdiskSpec::new("ok", MIB, LayoutKind::Simple);
        s.block_size = Some(bs);
        s.physical_block_size = Some(pbs);
        let e = rig.engine().create_vdisk(&s).unwrap_err().to_string();
        assert!(e.contains(why), "{bs}/{pbs}: {e}");
    }
    assert!(matches!(rig.engine().vdisk("nope"), Err(VolumeError::NoSuchVdisk(_))));
    let e = rig.engine().resize_vdisk("v", MIB / 2).unwrap_err().to_string();
    assert!(e.contains("only growing"), "{e}");
    rig.assert_consistent();
}

#[test]
fn impossible_layouts_are_refused() {
    let rig = Rig::new(2, 32 * MIB, MIB);
    let mut s = VdiskSpec::new("m3", MIB, LayoutKind::Mirror);
    s.copies = Some(3);
    let e = rig.engine().create_vdisk(&s).unwrap_err().to_string();
    assert!(e.contains("needs 3 distinct healthy disks, and the pool has 2"), "{e}");
    let e = rig
        .engine()
        .create_vdisk(&VdiskSpec::new("p", MIB, LayoutKind::Parity))
        .unwrap_err()
        .to_string();
    assert!(e.contains("distinct healthy disks"), "{e}");
    assert!(rig.engine().vdisks().is_empty());
    assert!(rig.engine().layouts().sets().is_empty());
}

/// A layout that no longer fits because disks failed says which, and why.
#[test]
fn a_layout_refused_for_lost_disks_names_them() {
    let rig = Rig::new(3, 32 * MIB, MIB);
    let disk = rig.engine().pool().disks()[1].info.path.clone();
    rig.engine().fail_disk(&disk).unwrap();
    let e = rig
        .engine()
        .create_vdisk(&VdiskSpec::new("p", MIB, LayoutKind::Parity))
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs 3 distinct healthy disks, and the pool has 2"), "{e}");
    assert!(
        e.contains(&format!("failed or missing: {disk} (failed by the administrator)")),
        "{e}"
    );
}

#[test]
fn full_pool_is_a_clear_error_that_corrupts_nothing() {
    // Two 12 MiB disks with 1 MiB slabs hold 11 slabs each: a 2-way mirror holds 11 MiB.
    let rig = Rig::new(2, 12 * MIB, MIB);
    let fixed = rig.engine().create_vdisk(&{
        let mut s = spec("big", 64 * MIB, LayoutKind::Mirror, Provisioning::Fixed);
        s.copies = Some(2);
        s
    });
    let e = fixed.err().expect("a fixed vdisk larger than the pool must be refused");
    assert!(e.is_no_space(), "{e}");
    assert!(
        rig.engine().layouts().sets().is_empty(),
        "the failed reservation left slab sets behind"
    );

    let v = rig
        .engine()
        .create_vdisk(&spec("thin", 64 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let mut written = 0u64;
    let err = loop {
        match v.write(written, &pattern(written, written, MIB as usize), false) {
            Ok(()) => written += MIB,
            Err(e) => break e,
        }
        assert!(written < 64 * MIB, "the pool never filled");
    };
    assert!(err.is_no_space(), "{err}");
    assert!(err.to_string().contains("add a disk or free space"), "{err}");
    for at in (0..written).step_by(MIB as usize) {
        let mut b = vec![0u8; MIB as usize];
        v.read(at, &mut b).unwrap();
        assert_eq!(
            b,
            pattern(at, at, MIB as usize),
            "data written before the pool filled is intact"
        );
    }
    rig.assert_consistent();
    // Trimming gives space back, and writes succeed again.
    v.trim(0, written).unwrap();
    v.write(written, &pattern(1, written, MIB as usize), false).unwrap();
    rig.assert_consistent();
}

/// A thin vdisk whose grain map this machine cannot hold in memory (1 PiB in 16 KiB grains:
/// 512 GiB of map) is refused when asked for, and when grown to, with what it would take;
/// nothing is recorded, and the pool opens again as it was (it would otherwise abort the
/// daemon at every start).
#[test]
fn a_vdisk_whose_map_cannot_be_held_in_memory_is_refused_and_recorded_nowhere() {
    let mut rig = Rig::new(3, 32 * MIB, MIB);
    let huge = spec("huge", 1 << 50, LayoutKind::Mirror, Provisioning::Thin);
    let e = rig.engine().create_vdisk(&huge).unwrap_err();
    assert!(matches!(e, VolumeError::Invalid(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("vdisk 'huge'") && msg.contains("512.0 GiB of grain map") && msg.contains("larger grains"),
        "{msg}"
    );
    rig.engine()
        .create_vdisk(&spec("v", 2 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let e = rig.engine().resize_vdisk("v", 1 << 50).unwrap_err();
    assert!(e.to_string().contains("grown to"), "{e}");
    assert_eq!(rig.engine().vdisk("v").unwrap().size(), 2 * MIB);
    rig.reopen();
    let names: Vec<String> = rig.engine().vdisks().iter().map(|v| v.name()).collect();
    assert_eq!(names, vec!["v".to_string()]);
    assert_eq!(rig.engine().vdisk("v").unwrap().size(), 2 * MIB);
}
