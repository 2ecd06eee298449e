//! The online metadata scan and spot-fix: each kind of damage is found and repaired with
//! nothing else changed, a repair whose object changed since the scan is left alone, and a scan
//! while vdisks write, snapshot and delete finds nothing that is not there.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::{contents, pattern, populated, spec, Rig, MIB};
use tessera_disk::FaultOp;
use tessera_volume::{Engine, FindingKind, FindingStatus, LayoutKind, Progress, Provisioning, ScanReport};

fn scan(e: &Engine) -> ScanReport {
    e.scan(&Progress::default()).unwrap()
}

fn kinds(r: &ScanReport) -> BTreeMap<FindingKind, u64> {
    r.by_kind.clone()
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then_some(a.len().min(b.len())))
}

#[test]
fn each_kind_of_damage_is_found_and_repaired_and_nothing_else_changes() {
    let mut rig = populated();
    let grain = 16u64 << 10;
    {
        let e = rig.engine();
        let clean = scan(e);
        assert_eq!(clean.findings, 0, "{:?}", clean.by_kind);
        assert!(clean.grains > 0 && clean.counted_slots > 0);
        let before = contents(e);

        e.damage_orphan_slots("a", 50).unwrap();
        e.damage_count("a", 100, 2).unwrap(); // an exclusive grain of 'a', counted 3 times
        e.damage_count("a", 3, -1).unwrap(); // shared with the snapshot, counted once
        e.damage_free_under("b", 5).unwrap(); // a grain in a slot free to be taken
        e.damage_dangle("a@s1", 7).unwrap(); // a snapshot pointing into a set that is gone
        let leftover = e.damage_leftover_entries("b").unwrap();
        assert!(!e.check().unwrap().problems.is_empty(), "the damage is real");

        let found = scan(e);
        let want: BTreeMap<FindingKind, u64> = [
            (FindingKind::OrphanSlot, 50),
            (FindingKind::RefcountWrong, 3),
            (FindingKind::GrainOutsideSpace, 1),
            (FindingKind::DanglingGrains, 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(kinds(&found), want);
        let listed = e.findings(0, 1000).unwrap();
        assert_eq!(listed.len() as u64, found.findings);
        let dangling = listed.iter().find(|f| f.kind == FindingKind::DanglingGrains).unwrap();
        assert_eq!(dangling.object, format!("vdisk id {leftover}"));
        let outside = listed
            .iter()
            .find(|f| f.kind == FindingKind::GrainOutsideSpace)
            .unwrap();
        assert_eq!(outside.object, "a@s1 grain 7");
        assert!(listed
            .iter()
            .all(|f| f.status == FindingStatus::Open && !f.repair.is_empty()));
        // Paging: from an id on.
        let second_half = e.findings(listed[30].id, 1000).unwrap();
        assert_eq!(second_half.len(), listed.len() - 30);

        let fixed = e.spotfix(&Progress::default()).unwrap();
        assert_eq!((fixed.fixed, fixed.changed, fixed.failed), (found.findings, 0, 0));
        rig.assert_consistent();
        assert!(e.findings(0, 1000).unwrap().is_empty(), "fixed findings are removed");
        assert_eq!(scan(e).findings, 0);
        assert_eq!(
            e.scan_report().unwrap().unwrap().spotfix,
            None,
            "a new scan starts a new report"
        );

        // Nothing but the snapshot's dangling grain, whose data went with its set, changed.
        let mut expected = before;
        let s1 = expected.get_mut("a@s1").unwrap();
        s1[(7 * grain) as usize..(8 * grain) as usize].fill(0);
        let after = contents(e);
        for (name, data) in &expected {
            assert!(
                after[name] == *data,
                "{name} differs at byte {:?}",
                first_difference(&after[name], data)
            );
        }
        // Space comes back: the orphans and the dangling entries were freed.
        let b = e.vdisk("b").unwrap();
        b.write(3 * MIB, &pattern(9, 0, MIB as usize), false).unwrap();
        rig.assert_consistent();
    }
    rig.reopen();
    rig.assert_consistent();
    assert_eq!(scan(rig.engine()).findings, 0);
}

#[test]
fn a_grain_in_a_free_slot_is_counted_again_before_the_slot_is_taken_twice() {
    let rig = populated();
    let e = rig.engine();
    let b = e.vdisk("b").unwrap();
    e.damage_free_under("b", 5).unwrap();
    assert_eq!(kinds(&scan(e)), [(FindingKind::RefcountWrong, 1)].into_iter().collect());
    let r = e.spotfix(&Progress::default()).unwrap();
    assert_eq!(r.fixed, 1);
    // New writes fill the pool's free slots; none may land in grain 5's.
    let c = e
        .create_vdisk(&spec("c", 8 * MIB, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    c.write(0, &pattern(7, 0, (8 * MIB) as usize), false).unwrap();
    let mut got = vec![0u8; 16 << 10];
    b.read(5 * (16 << 10), &mut got).unwrap();
    assert!(
        got == pattern(3, 5 * (16 << 10), 16 << 10),
        "grain 5 of b was overwritten"
    );
    rig.assert_consistent();
}

#[test]
fn spotfix_leaves_alone_what_changed_since_the_scan() {
    let rig = populated();
    let e = rig.engine();
    let a = e.vdisk("a").unwrap();
    e.damage_count("a", 100, 1).unwrap();
    assert_eq!(scan(e).findings, 1);
    // The grain the finding names moves before the spot-fix.
    a.trim(100 * (16 << 10), 16 << 10).unwrap();
    let r = e.spotfix(&Progress::default()).unwrap();
    assert_eq!((r.fixed, r.changed, r.failed), (0, 1, 0));
    let kept = e.findings(0, 10).unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].status, FindingStatus::Changed);
    assert!(kept[0].note.as_deref().unwrap().contains("no longer points"));
    // A spot-fix again does not touch it; a new scan sees what the slot is now: an orphan.
    assert_eq!(e.spotfix(&Progress::default()).unwrap().changed, 0);
    assert_eq!(kinds(&scan(e)), [(FindingKind::OrphanSlot, 1)].into_iter().collect());
    assert_eq!(e.spotfix(&Progress::default()).unwrap().fixed, 1);
    rig.assert_consistent();
}

#[test]
fn spotfix_needs_a_scan_and_one_job_at_a_time() {
    let rig = populated();
    let e = rig.engine();
    let err = e.spotfix(&Progress::default()).unwrap_err().to_string();
    assert!(err.contains("has not been scanned"), "{err}");
    let p = Progress::default();
    p.cancel.store(true, Ordering::Relaxed);
    e.fill_metadata_only("b", 0..256).unwrap();
    assert!(e.scan(&p).is_err(), "a cancelled scan stops");
    assert_eq!(scan(e).findings, 0);
}

#[test]
fn lost_members_are_found_and_rebuilt_by_spotfix() {
    let rig = populated();
    let e = rig.engine();
    let before = contents(e);
    let disk = e.pool().disks()[1].info.path.clone();
    e.fail_disk(&disk).unwrap();
    let found = scan(e);
    let lost = found.by_kind.get(&FindingKind::SetMemberLost).copied().unwrap_or(0);
    assert!(lost > 0, "{:?}", found.by_kind);
    assert_eq!(found.findings, lost);
    let r = e.spotfix(&Progress::default()).unwrap();
    assert_eq!((r.fixed, r.failed), (lost, 0));
    assert!(e.layouts().repair_needed().0.is_empty());
    assert_eq!(scan(e).findings, 0);
    let after = contents(e);
    assert!(after == before, "data changed by the rebuild");
    rig.assert_consistent();
}

/// Writers, snapshots, clones and deletes run while scans follow each other: no scan may find
/// anything, since every change is one batch and the scan reads one instant.
#[test]
fn scans_under_concurrent_writes_snapshots_and_deletes_find_nothing() {
    let rig = Rig::new(5, 256 * MIB, MIB);
    let e = rig.engine();
    for n in ["w0", "w1"] {
        let v = e
            .create_vdisk(&spec(n, 8 * MIB, LayoutKind::Mirror, Provisioning::Thin))
            .unwrap();
        v.write(0, &pattern(1, 0, (4 * MIB) as usize), false).unwrap();
    }
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let scans: Vec<ScanReport> = std::thread::scope(|s| {
        for (t, name) in ["w0", "w1"].into_iter().enumerate() {
            let (stop, ops) = (&stop, &ops);
            s.spawn(move || {
                let v = e.vdisk(name).unwrap();
                let mut x = t as u64 + 1;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let off = (x >> 20) % (8 * MIB / 4096) * 4096;
                    match x % 8 {
                        0 => v.trim(off / (16 << 10) * (16 << 10), 16 << 10).unwrap(),
                        _ => v.write(off, &pattern(x, off, 4096), false).unwrap(),
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        {
            let (stop, ops) = (&stop, &ops);
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let snap = format!("s{i}");
                    e.snapshot("w0", &snap).unwrap();
                    let (c, _) = e.clone_vdisk("w1", &format!("c{i}")).unwrap();
                    let w0 = e.vdisk("w0").unwrap();
                    e.clone_range(&c, 0, &w0, 4 * MIB, MIB).unwrap();
                    e.delete_vdisk(&format!("w0@{snap}")).unwrap();
                    e.delete_vdisk(&format!("c{i}")).unwrap();
                    i += 1;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let started = std::time::Instant::now();
        let mut scans = Vec::new();
        while scans.len() < 12 || (ops.load(Ordering::Relaxed) < 300 && started.elapsed().as_secs() < 60) {
            scans.push(scan(e));
        }
        stop.store(true, Ordering::Relaxed);
        scans
    });
    assert!(
        ops.load(Ordering::Relaxed) >= 300,
        "too little happened during the scans"
    );
    for r in &scans {
        assert_eq!(r.findings, 0, "a scan found {:?} under load", r.by_kind);
    }
    rig.assert_consistent();
}

/// Records replay kept because it could not settle their region: one past the end of its set
/// matches nothing and goes with the checkpoint the scan starts with (never a finding), one of
/// a region whose disks cannot be read is a finding, resynced once they can be read: until
/// then spot-fix says why it fails, and tries again next time.
#[test]
fn journal_records_replay_could_not_settle_are_found_and_settled() {
    let rig = populated();
    let e = rig.engine();
    let mirror = e
        .layouts()
        .sets()
        .into_iter()
        .find(|s| s.spec.kind == LayoutKind::Mirror)
        .unwrap();
    let past = e.pool().slab_size() / (4 << 20) + 10;
    e.layouts().damage_pinned_record(mirror.id, past).unwrap();
    e.layouts().damage_pinned_record(mirror.id, 0).unwrap();
    for m in &mirror.desc().members {
        rig.disks[m.disk as usize]
            .faults()
            .fail_range(0, u64::MAX / 2, FaultOp::Read);
    }
    let found = scan(e);
    assert_eq!(kinds(&found), [(FindingKind::RegionUnsynced, 1)].into_iter().collect());
    let r = e.spotfix(&Progress::default()).unwrap();
    assert_eq!((r.fixed, r.changed, r.failed), (0, 0, 1));
    let left = e.findings(0, 10).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].status, FindingStatus::Failed);
    assert!(
        left[0].note.as_deref().unwrap().contains("cannot be made consistent"),
        "{left:?}"
    );
    for d in &rig.disks {
        d.faults().clear();
    }
    let r = e.spotfix(&Progress::default()).unwrap();
    assert_eq!((r.fixed, r.failed), (1, 0));
    assert_eq!(scan(e).findings, 0);
    rig.assert_consistent();
}

/// The scan schedule's start is kept in the pool: the first time asked, across a restart, and
/// moved by a put-off; a record of the wrong length counts from now (and is written anew)
/// rather than turn scheduled scans off.
#[test]
fn the_scan_schedule_start_is_kept_moved_and_mended() {
    let mut rig = populated();
    assert_eq!(rig.engine().scan_scheduled_from().unwrap(), None);
    assert_eq!(rig.engine().scan_schedule_from(1_000).unwrap(), 1_000);
    assert_eq!(rig.engine().scan_schedule_from(2_000).unwrap(), 1_000, "counted once");
    rig.reopen();
    assert_eq!(rig.engine().scan_scheduled_from().unwrap(), Some(1_000));
    rig.engine().put_off_scan(5_000).unwrap();
    assert_eq!(rig.engine().scan_scheduled_from().unwrap(), Some(5_000));
    let mut b = tessera_pool::MetaBatch::new();
    b.put(tessera_pool::CF_POOL, b"scan-scheduled-from", b"xyz");
    rig.engine().pool().meta().commit(b, true).unwrap();
    assert_eq!(rig.engine().scan_scheduled_from().unwrap(), None);
    assert_eq!(rig.engine().scan_schedule_from(7_000).unwrap(), 7_000);
    assert_eq!(rig.engine().scan_scheduled_from().unwrap(), Some(7_000));
}
