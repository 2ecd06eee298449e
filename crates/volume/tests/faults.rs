//! Fault injection: failures inside a layout's tolerance are invisible to the caller and lose
//! nothing; beyond it, errors are clear and data is never silently wrong.

mod common;

use common::{pattern, spec, Rig, MIB};
use tessera_disk::FaultOp;
use tessera_volume::{DiskState, LayoutKind, Progress, Provisioning, RebuildOptions};

const SIZE: u64 = 4 * MIB;

fn fill(rig: &Rig, name: &str, seed: u64) -> Vec<u8> {
    let data = pattern(seed, 0, SIZE as usize);
    rig.engine().vdisk(name).unwrap().write(0, &data, true).unwrap();
    data
}

fn read(rig: &Rig, name: &str) -> Vec<u8> {
    let mut b = vec![0u8; SIZE as usize];
    rig.engine().vdisk(name).unwrap().read(0, &mut b).unwrap();
    b
}

fn repair(rig: &Rig) {
    rig.engine().flush().unwrap();
    let r = rig
        .engine()
        .repair(
            &RebuildOptions {
                parallel: 3,
                rate_limit: None,
            },
            &Progress::default(),
        )
        .unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert!(
        rig.engine().layouts().repair_needed().0.is_empty(),
        "repair left slab sets to move"
    );
}

#[test]
fn pulled_disk_in_every_redundant_layout() {
    for (kind, copies) in [
        (LayoutKind::Mirror, Some(2)),
        (LayoutKind::Mirror, Some(3)),
        (LayoutKind::Parity, None),
        (LayoutKind::DualParity, None),
    ] {
        let mut rig = Rig::new(7, 64 * MIB, MIB);
        let mut s = spec("v", SIZE, kind, Provisioning::Thin);
        s.copies = copies;
        rig.engine().create_vdisk(&s).unwrap();
        let data = fill(&rig, "v", 1);
        rig.disks[1].faults().pull();
        assert_eq!(read(&rig, "v"), data, "{kind:?}: degraded read");
        // Writes keep working degraded; the pulled disk is failed on its first write error.
        let more = pattern(2, MIB, MIB as usize);
        rig.engine().vdisk("v").unwrap().write(MIB, &more, true).unwrap();
        let mut want = data.clone();
        want[MIB as usize..2 * MIB as usize].copy_from_slice(&more);
        assert_eq!(read(&rig, "v"), want, "{kind:?}: degraded write");
        rig.reopen();
        assert_eq!(read(&rig, "v"), want, "{kind:?}: degraded after restart");
        repair(&rig);
        assert_eq!(read(&rig, "v"), want, "{kind:?}: after repair");
        // The repaired layout again survives the loss of another disk.
        rig.disks[3].faults().pull();
        assert_eq!(read(&rig, "v"), want, "{kind:?}: second failure after repair");
        rig.assert_consistent();
    }
}

/// A slab set that lost a member still serves and overwrites its data in place, but new
/// grains go to a set whose members are all healthy while the pool can make one: they keep
/// the layout's redundancy and survive the next disk's loss. When no whole set can be made,
/// a degraded set takes them rather than failing the write.
#[test]
fn new_grains_go_to_whole_sets_while_the_pool_can_make_them() {
    // Slabs of several grains: a set has room left when its disk fails.
    let rig = Rig::new(3, 64 * MIB, 4 * MIB);
    let mut s = spec("v", SIZE, LayoutKind::Mirror, Provisioning::Thin);
    s.copies = Some(2);
    let v = rig.engine().create_vdisk(&s).unwrap();
    let first = pattern(1, 0, MIB as usize);
    v.write(0, &first, true).unwrap();
    let sets = rig.engine().layouts().sets();
    assert_eq!(sets.len(), 1);
    let members: Vec<u32> = sets[0].desc().members.iter().map(|m| m.disk).collect();
    let (lost, kept) = (members[0], members[1]);
    rig.engine().fail_disk(&format!("mem{lost}")).unwrap();

    // Degraded: the first grain reads and overwrites in place; a new grain goes elsewhere.
    let mut b = vec![0u8; MIB as usize];
    v.read(0, &mut b).unwrap();
    assert!(b == first, "degraded read");
    let second = pattern(2, MIB, MIB as usize);
    v.write(MIB, &second, true).unwrap();
    let sets = rig.engine().layouts().sets();
    assert_eq!(sets.len(), 2, "a new set on the healthy disks took the new grain");
    assert!(sets[1].desc().members.iter().all(|m| m.disk != lost));

    // Losing the other disk of the first set loses the first grain (said, not wrong data)
    // and not the second: it was written with full redundancy.
    rig.engine().fail_disk(&format!("mem{kept}")).unwrap();
    assert!(v.read(0, &mut b).is_err(), "both copies of the first grain are gone");
    v.read(MIB, &mut b).unwrap();
    assert!(
        b == second,
        "the grain written after the first loss survives the second"
    );

    // One healthy disk left: no whole mirror set can be made, and a degraded one takes the
    // write (a mirror with one copy is what the pool still has to give).
    let third = pattern(3, 2 * MIB, MIB as usize);
    v.write(2 * MIB, &third, true).unwrap();
    v.read(2 * MIB, &mut b).unwrap();
    assert!(b == third, "degraded write");
}

/// A striped mirror tolerates its losses per column: short of one copy in every column, it
/// still reads and writes everything from the copies it has (a RAID 10 that lost one disk of
/// each pair), is degraded, not failed, and a repair makes it whole; a column with no copy
/// left refuses writes, and reads of it, clearly.
#[test]
fn a_striped_mirror_short_of_a_copy_in_every_column_still_serves() {
    let rig = Rig::new(6, 64 * MIB, MIB);
    let mut s = spec("v", SIZE, LayoutKind::Mirror, Provisioning::Thin);
    (s.copies, s.columns) = (Some(2), Some(2));
    let v = rig.engine().create_vdisk(&s).unwrap();
    // Two columns of 1 MiB slabs: the first 2 MiB fill one slab set.
    let half = 2 * MIB as usize;
    let mut want = pattern(1, 0, half);
    v.write(0, &want, true).unwrap();
    let sets = rig.engine().layouts().sets();
    assert_eq!(sets.len(), 1);
    // Member c * columns + d holds copy c of column d.
    let members: Vec<u32> = sets[0].desc().members.iter().map(|m| m.disk).collect();
    let layouts = rig.engine().layouts();
    rig.engine().fail_disk(&format!("mem{}", members[0])).unwrap();
    rig.engine().fail_disk(&format!("mem{}", members[3])).unwrap();
    let health = layouts.health(&sets[0]);
    assert_eq!((health.unavailable, health.state()), (2, "degraded"), "{health:?}");
    assert!(!layouts.refuses_writes(&sets[0]) && !layouts.unrecoverable(&sets[0]));
    let mut b = vec![0u8; half];
    v.read(0, &mut b).unwrap();
    assert!(b == want, "read with a copy lost in each column");
    // Overwrites in both columns, across the interleave, land on the copies left.
    let more = pattern(2, 4096, half - 8192);
    v.write(4096, &more, true).unwrap();
    want[4096..half - 4096].copy_from_slice(&more);
    v.read(0, &mut b).unwrap();
    assert!(b == want, "written with a copy lost in each column");
    rig.engine().flush().unwrap();
    repair(&rig);
    let set = &rig.engine().layouts().sets()[0];
    assert_eq!(rig.engine().layouts().health(set).state(), "healthy");
    v.read(0, &mut b).unwrap();
    assert!(b == want, "after the repair");
    // The repaired set holds the new data on every copy: the copies written while degraded
    // alone are lost now, one per column, and everything still reads.
    let members: Vec<u32> = set.desc().members.iter().map(|m| m.disk).collect();
    rig.engine().fail_disk(&format!("mem{}", members[2])).unwrap();
    rig.engine().fail_disk(&format!("mem{}", members[1])).unwrap();
    v.read(0, &mut b).unwrap();
    assert!(b == want, "the repaired copies hold what was written while degraded");
    rig.assert_consistent();

    // Both copies of a column gone: that column's data can be neither read nor written.
    let rig = Rig::new(4, 64 * MIB, MIB);
    let v = rig.engine().create_vdisk(&s).unwrap();
    let data = pattern(3, 0, half);
    v.write(0, &data, true).unwrap();
    let set = &rig.engine().layouts().sets()[0];
    let members: Vec<u32> = set.desc().members.iter().map(|m| m.disk).collect();
    rig.engine().fail_disk(&format!("mem{}", members[0])).unwrap();
    rig.engine().fail_disk(&format!("mem{}", members[2])).unwrap();
    let health = rig.engine().layouts().health(set);
    assert_eq!(health.state(), "failed", "{health:?}");
    assert!(rig.engine().layouts().refuses_writes(set));
    let e = v.write(0, &pattern(4, 0, 4096), true).unwrap_err().to_string();
    assert!(e.contains("unavailable"), "{e}");
    let mut b = vec![0u8; 4096];
    assert!(v.read(0, &mut b).is_err(), "column 0 has no copy left");
}

#[test]
fn dual_parity_survives_two_and_refuses_three() {
    let rig = Rig::new(6, 64 * MIB, MIB);
    let mut s = spec("v", SIZE, LayoutKind::DualParity, Provisioning::Thin);
    s.columns = Some(6);
    rig.engine().create_vdisk(&s).unwrap();
    let data = fill(&rig, "v", 3);
    rig.disks[0].faults().pull();
    rig.disks[4].faults().pull();
    assert_eq!(read(&rig, "v"), data);
    rig.disks[2].faults().pull();
    let mut b = vec![0u8; 65536];
    let err = rig
        .engine()
        .vdisk("v")
        .unwrap()
        .read(0, &mut b)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unavailable") || err.contains("cannot reconstruct"),
        "{err}"
    );
    // Writes beyond tolerance fail too, rather than being half applied and acknowledged.
    let err = rig.engine().vdisk("v").unwrap().write(0, &b, true);
    assert!(err.is_err());
}

#[test]
fn read_errors_are_repaired_in_place() {
    for kind in [LayoutKind::Mirror, LayoutKind::Parity] {
        let rig = Rig::new(4, 64 * MIB, MIB);
        rig.engine()
            .create_vdisk(&spec("v", SIZE, kind, Provisioning::Thin))
            .unwrap();
        let data = fill(&rig, "v", 4);
        // Every disk returns read errors somewhere in the data area; never two at one place.
        for (i, d) in rig.disks.iter().enumerate() {
            d.faults()
                .fail_range(MIB + (i as u64 * 5 + 1) * 65536, 8192, FaultOp::Read);
        }
        assert_eq!(read(&rig, "v"), data, "{kind:?}");
        let stats = &rig.engine().layouts().stats;
        assert!(
            stats.read_errors.load(std::sync::atomic::Ordering::Relaxed) > 0,
            "{kind:?}: the faults were not hit"
        );
        assert!(
            stats.repaired_blocks.load(std::sync::atomic::Ordering::Relaxed) > 0,
            "{kind:?}: nothing rewritten"
        );
        // A read error does not fail the disk: the rewrite succeeded.
        assert!(rig
            .engine()
            .pool()
            .disks()
            .iter()
            .all(|d| d.info.state == DiskState::Healthy));
    }
}

#[test]
fn write_error_fails_the_disk_and_loses_nothing() {
    let mut rig = Rig::new(4, 64 * MIB, MIB);
    rig.engine()
        .create_vdisk(&spec("v", SIZE, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let data = fill(&rig, "v", 5);
    rig.disks[2].faults().fail_after(3);
    let more = pattern(6, 0, SIZE as usize);
    rig.engine().vdisk("v").unwrap().write(0, &more, true).unwrap();
    let failed = &rig.engine().pool().disks()[2];
    assert_eq!(failed.info.state, DiskState::Failed);
    let problem = failed.problem.clone().unwrap_or_default();
    assert!(
        problem.contains("write error") && problem.contains("disk online"),
        "{problem}"
    );
    assert_eq!(read(&rig, "v"), more);
    // Answering again, it stays out across a restart (a disk that fails writes may well read
    // its label) until `disk online` takes it back: stale where it was written since its last
    // flush (it failed in the middle of the write) or written around, read around meanwhile.
    rig.disks[2].faults().clear();
    rig.reopen();
    assert_eq!(rig.engine().pool().disks()[2].info.state, DiskState::Failed);
    assert_eq!(read(&rig, "v"), more);
    rig.engine()
        .bring_back_disk("mem2", rig.disks[2].clone() as tessera_disk::DiskRef)
        .unwrap();
    assert_eq!(rig.engine().pool().disks()[2].info.state, DiskState::Healthy);
    assert!(rig.engine().layouts().stale_members() > 0);
    assert_eq!(read(&rig, "v"), more);
    repair(&rig);
    // What it holds is current now: the set reads right without another disk.
    rig.engine().fail_disk("mem0").unwrap();
    assert_eq!(read(&rig, "v"), more);
    rig.assert_consistent();
    let _ = data;
}

#[test]
fn torn_write_on_a_mirror_copy_fails_that_copy() {
    let rig = Rig::new(2, 64 * MIB, MIB);
    rig.engine()
        .create_vdisk(&spec("v", SIZE, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    fill(&rig, "v", 7);
    rig.disks[0].faults().tear_next_write(4096);
    let more = pattern(8, 0, 65536);
    rig.engine().vdisk("v").unwrap().write(0, &more, true).unwrap();
    let mut b = vec![0u8; 65536];
    rig.engine().vdisk("v").unwrap().read(0, &mut b).unwrap();
    assert_eq!(b, more, "the torn copy must never be read");
    assert_eq!(rig.engine().pool().disks()[0].info.state, DiskState::Failed);
}

#[test]
fn bit_flips_are_found_by_scrub() {
    // Without end-to-end checksums a flipped bit cannot be told from good data on read; the
    // scrub finds the disagreement between copies or with parity.
    for kind in [LayoutKind::Mirror, LayoutKind::Parity] {
        let rig = Rig::new(4, 64 * MIB, MIB);
        rig.engine()
            .create_vdisk(&spec("v", SIZE, kind, Provisioning::Thin))
            .unwrap();
        fill(&rig, "v", 9);
        let set = rig.engine().layouts().sets()[0].clone();
        assert!(rig.engine().layouts().scrub_set(&set).unwrap().is_empty());
        let m = set.desc().members[1];
        let at = rig.engine().pool().slab_offset(m) + 5000;
        rig.disks[m.disk as usize].faults().flip_bit(at, 3).unwrap();
        let bad = rig.engine().layouts().scrub_set(&set).unwrap();
        assert_eq!(bad.len(), 1, "{kind:?}: {bad:?}");
    }
}

#[test]
fn retire_moves_every_slab_off_the_disk() {
    let rig = Rig::new(5, 64 * MIB, MIB);
    rig.engine()
        .create_vdisk(&spec("m", SIZE, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    rig.engine()
        .create_vdisk(&spec("s", SIZE, LayoutKind::Simple, Provisioning::Thin))
        .unwrap();
    let a = fill(&rig, "m", 10);
    let b = fill(&rig, "s", 11);
    let busiest = rig
        .engine()
        .pool()
        .disks()
        .into_iter()
        .max_by_key(|d| d.slabs_used)
        .unwrap();
    assert!(busiest.slabs_used > 0);
    rig.engine().retire_disk(&busiest.info.path).unwrap();
    let progress = Progress::default();
    rig.engine()
        .repair(
            &RebuildOptions {
                parallel: 2,
                rate_limit: Some(64 * MIB),
            },
            &progress,
        )
        .unwrap();
    let d = &rig.engine().pool().disks()[busiest.info.position as usize];
    assert_eq!(d.slabs_used, 0, "retired disk still holds slabs");
    assert_eq!(
        progress.done_bytes.load(std::sync::atomic::Ordering::Relaxed),
        progress.total_bytes.load(std::sync::atomic::Ordering::Relaxed)
    );
    // Even a simple (non-redundant) layout survives a retire: the slab is copied, not rebuilt.
    assert_eq!(read(&rig, "m"), a);
    assert_eq!(read(&rig, "s"), b);
    rig.assert_consistent();
}

/// A repair held to a low rate stops when cancelled, not when its next turn comes: a turn
/// may be seconds away, and the administrator who cancels wants the disks back now.
#[test]
fn a_slow_repair_stops_at_once_when_cancelled() {
    let rig = Rig::new(3, 32 * MIB, MIB);
    rig.engine()
        .create_vdisk(&spec("m", SIZE, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let data = fill(&rig, "m", 22);
    let lost = rig.engine().layouts().sets()[0].desc().members[0].disk;
    rig.engine().fail_disk(&format!("mem{lost}")).unwrap();
    // 16 KiB pieces at 4 KiB/s: four seconds between two pieces.
    let slow = RebuildOptions {
        parallel: 1,
        rate_limit: Some(4 << 10),
    };
    let progress = Progress::default();
    let (result, waited) = std::thread::scope(|s| {
        let job = s.spawn(|| rig.engine().repair(&slow, &progress));
        while progress.done_bytes.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        progress.cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::Instant::now();
        (job.join().unwrap(), t.elapsed())
    });
    assert!(result.is_err(), "{result:?}");
    assert!(waited < std::time::Duration::from_secs(2), "the cancel took {waited:?}");
    // Nothing half done: the set still waits for its repair, which then completes.
    assert!(!rig.engine().layouts().repair_needed().0.is_empty());
    repair(&rig);
    assert!(rig.engine().layouts().repair_needed().0.is_empty());
    assert_eq!(read(&rig, "m"), data);
    rig.assert_consistent();
}

#[test]
fn batched_reads_match_single_reads_through_faults() {
    for kind in [LayoutKind::Simple, LayoutKind::Mirror, LayoutKind::Parity] {
        let rig = Rig::new(4, 64 * MIB, MIB);
        rig.engine()
            .create_vdisk(&spec("v", SIZE, kind, Provisioning::Thin))
            .unwrap();
        let v = rig.engine().vdisk("v").unwrap();
        // Half written, so that some requests cover unmapped grains.
        v.write(0, &pattern(5, 0, (SIZE / 2) as usize), true).unwrap();
        if kind != LayoutKind::Simple {
            // Read errors on every disk, never two at one place, and a mirror also loses a disk.
            for (i, d) in rig.disks.iter().enumerate() {
                d.faults()
                    .fail_range(MIB + (i as u64 * 5 + 1) * 65536, 8192, FaultOp::Read);
            }
            if kind == LayoutKind::Mirror {
                rig.disks[2].faults().pull();
            }
        }
        // Whole blocks, 512-byte pieces of sectors, and a request past the end of the disk.
        let shapes: Vec<(u64, usize)> = (0..40u64)
            .map(|i| {
                (
                    (i * 104_729) % (SIZE - 65536) / 512 * 512,
                    512 * (1 + (i as usize * 37) % 128),
                )
            })
            .chain([(SIZE - 4096, 8192)])
            .collect();
        let mut bufs: Vec<Vec<u8>> = shapes.iter().map(|&(_, len)| vec![0xEE; len]).collect();
        let mut reqs: Vec<(u64, &mut [u8])> = shapes
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(off, _), b)| (off, &mut b[..]))
            .collect();
        let results = v.read_many(&mut reqs);
        assert_eq!(results.len(), shapes.len());
        for ((res, (off, got)), &(_, len)) in results.iter().zip(&reqs).zip(&shapes) {
            let mut want = vec![0u8; len];
            match v.read(*off, &mut want) {
                Ok(()) => {
                    assert!(res.is_ok(), "{kind:?} at {off}: {res:?}");
                    assert!(&got[..] == &want[..], "{kind:?}: {len} bytes at {off} differ");
                }
                Err(e) => {
                    let batch = res.as_ref().expect_err("the batch read succeeded where a read failed");
                    assert_eq!(batch.to_string(), e.to_string());
                }
            }
        }
        assert!(results.last().unwrap().is_err(), "past the end must fail");
        if kind != LayoutKind::Simple {
            let stats = &rig.engine().layouts().stats;
            assert!(
                stats.read_errors.load(std::sync::atomic::Ordering::Relaxed) > 0,
                "{kind:?}: faults not hit"
            );
        }
    }
}

/// A disk whose storage refuses requests for a while (a Ceph cluster unreachable, or this
/// gateway fenced off): the requests fail, but the disk is not failed, nor counted against,
/// and once the storage serves again everything works and nothing was lost.
#[test]
fn a_disk_whose_storage_refuses_requests_for_a_while_is_not_failed() {
    let rig = Rig::new(1, 64 * MIB, MIB);
    let mut one = tessera_volume::VdiskSpec::new("s", SIZE, LayoutKind::Simple);
    one.columns = Some(1);
    rig.engine().create_vdisk(&one).unwrap();
    let data = fill(&rig, "s", 1);
    rig.engine().flush().unwrap();
    rig.disks[0].faults().refuse(true);
    let v = rig.engine().vdisk("s").unwrap();
    let e = v.write(0, &pattern(2, 0, 4096), true).unwrap_err();
    let refused = e.to_string();
    assert!(
        refused.contains("refuses requests for now"),
        "the disk's reason is kept: {refused}"
    );
    // Told apart from a failed write: nothing was written, the host may send it again (a
    // SCSI host hears NOT READY, ASYMMETRIC ACCESS STATE TRANSITION, not a medium error).
    assert!(e.is_refused(), "{e}");
    let mut b = vec![0u8; 4096];
    let e = v.read(0, &mut b).unwrap_err();
    assert!(e.is_refused(), "{e}");
    // Less than a block: read, changed, written; the read refused.
    let e = v.write(512, &pattern(2, 0, 512), false).unwrap_err();
    assert!(e.is_refused(), "{e}");
    assert!(rig.engine().flush().is_err());
    let disks = rig.engine().pool().disks();
    assert_eq!(disks[0].info.state, DiskState::Healthy, "{:?}", disks[0]);
    let counted = rig.engine().layouts().disk_errors();
    assert!(counted.values().all(|c| c.read == 0 && c.checksum == 0), "{counted:?}");
    rig.disks[0].faults().refuse(false);
    assert_eq!(read(&rig, "s"), data);
    v.write(0, &pattern(3, 0, 4096), true).unwrap();
    rig.engine().flush().unwrap();
    let mut b = vec![0u8; 4096];
    v.read(0, &mut b).unwrap();
    assert_eq!(b, pattern(3, 0, 4096));
    assert!(rig.engine().check().unwrap().problems.is_empty());
}

/// A mirror with one copy on a failed disk and the other on storage that refuses requests
/// for now: a write (and a read) is refused, as when every copy refuses, not failed as a
/// medium error: nothing was written, and the host may send it again. Reads and writes
/// judge it alike.
#[test]
fn a_copy_lost_and_the_other_refused_is_a_refusal_not_a_medium_error() {
    let rig = Rig::new(2, 64 * MIB, MIB);
    rig.engine()
        .create_vdisk(&tessera_volume::VdiskSpec::new("m", SIZE, LayoutKind::Mirror))
        .unwrap();
    fill(&rig, "m", 1);
    rig.engine().flush().unwrap();
    let v = rig.engine().vdisk("m").unwrap();
    // Disk 0 fails under a write, which lands on disk 1 alone.
    rig.disks[0].faults().pull();
    v.write(0, &pattern(2, 0, 4096), true).unwrap();
    assert_eq!(rig.engine().pool().disks()[0].info.state, DiskState::Failed);
    rig.disks[1].faults().refuse(true);
    let e = v.write(0, &pattern(3, 0, 4096), true).unwrap_err();
    assert!(
        e.is_refused(),
        "a write refused where it could go is not a medium error: {e}"
    );
    let mut b = vec![0u8; 4096];
    let e = v.read(0, &mut b).unwrap_err();
    assert!(e.is_refused(), "{e}");
    rig.disks[1].faults().refuse(false);
    v.read(0, &mut b).unwrap();
    assert_eq!(b, pattern(2, 0, 4096), "the refused write changed nothing");
    assert_eq!(rig.engine().pool().disks()[1].info.state, DiskState::Healthy);
}

/// Two repairs at once (the administrator's, and a scan's spot fix, say) take one slab set
/// each at a time: the second is told the set is being repaired, and the set comes out whole
/// with one copy of its member, not two half-made ones.
#[test]
fn two_repairs_at_once_take_a_slab_set_one_at_a_time() {
    let rig = Rig::new(3, 32 * MIB, MIB);
    rig.engine()
        .create_vdisk(&spec("m", MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let data = pattern(21, 0, MIB as usize);
    rig.engine().vdisk("m").unwrap().write(0, &data, true).unwrap();
    let lost = rig.engine().layouts().sets()[0].desc().members[0].disk;
    rig.engine().fail_disk(&format!("mem{lost}")).unwrap();
    let free = rig.engine().pool().capacity().free_bytes;
    let slow = RebuildOptions {
        parallel: 1,
        rate_limit: Some(2 * MIB),
    };
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| rig.engine().repair(&slow, &Progress::default()).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(100));
        let second = rig
            .engine()
            .repair(&RebuildOptions::default(), &Progress::default())
            .unwrap();
        (first.join().unwrap(), second)
    });
    assert_eq!(first.slabs_rebuilt + second.slabs_rebuilt, 1, "{first:?} {second:?}");
    assert!(
        second.failures.iter().any(|(_, why)| why.contains("another repair")),
        "{second:?}"
    );
    assert!(rig.engine().layouts().repair_needed().0.is_empty());
    assert_eq!(
        rig.engine().pool().capacity().free_bytes,
        free - MIB,
        "one replacement slab taken, no more"
    );
    let mut b = vec![0u8; MIB as usize];
    rig.engine().vdisk("m").unwrap().read(0, &mut b).unwrap();
    assert!(b == data);
    rig.assert_consistent();
}
