//! A disk absent when the pool is imported, and back at a later import: current wherever no
//! write went around it, stale (read around, then resynced where it is) in the slab sets a
//! write did go around it, and failed when what it missed is not known.

mod common;

use std::sync::Arc;

use common::{pattern, spec, Rig, MIB};
use tessera_disk::{read_label, BlockDevice, DiskRef, FaultyDisk, MemDisk, PowerSupply, VolatileDisk};
use tessera_pool::{MetaBatch, MetaStore, CF_POOL};
use tessera_volume::{DiskState, LayoutKind, Progress, Provisioning, RebuildOptions};

const SIZE: u64 = 4 * MIB;

fn read_all(rig: &Rig) -> Vec<u8> {
    let mut b = vec![0u8; SIZE as usize];
    rig.engine().vdisk("v").unwrap().read(0, &mut b).unwrap();
    b
}

/// A repair resyncs `stale` members where they are (no free space taken); then disk 0 is
/// failed, and the vdisk reads as `data` from what is left.
fn resync_in_place_then_read_without_disk_0(rig: &Rig, data: &[u8], stale: usize) {
    let free = rig.engine().pool().capacity().free_bytes;
    assert_eq!(rig.repair(), stale);
    assert_eq!(rig.engine().pool().capacity().free_bytes, free, "resynced where it is");
    rig.engine().fail_disk("mem0").unwrap();
    assert_eq!(read_all(rig), data);
}

/// A two-disk mirror of four slab sets, written whole: every set has a member on each disk.
fn mirrored_pair() -> (Rig, Vec<u8>) {
    let (rig, data) = with_mirror_written(Rig::new(2, 32 * MIB, MIB));
    assert!(rig.engine().layouts().sets().len() >= 4);
    (rig, data)
}

/// `rig` with a mirror vdisk "v" of `SIZE` bytes, written whole and flushed, and what it holds.
fn with_mirror_written(rig: Rig) -> (Rig, Vec<u8>) {
    let data = pattern(1, 0, SIZE as usize);
    rig.engine()
        .create_vdisk(&spec("v", SIZE, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap()
        .write(0, &data, true)
        .unwrap();
    (rig, data)
}

/// Stops the pool cleanly (nothing left to resync), as a daemon stopped for maintenance.
fn stop(rig: &mut Rig) {
    rig.engine.take().unwrap().export().unwrap();
}

/// The bytes of disk `i` as they are now: what a backup or a snapshot of it would keep.
fn image_of(rig: &Rig, i: usize) -> Vec<u8> {
    let mut image = vec![0u8; rig.disks[i].size() as usize];
    rig.disks[i].read_at(&mut image, 0).unwrap();
    image
}

/// A disk named `path` holding `image`: a copy put back in the place of the disk it was taken of.
fn copy_of(path: &str, image: &[u8]) -> Arc<FaultyDisk> {
    let d = FaultyDisk::new(Arc::new(MemDisk::new(path, image.len() as u64)) as DiskRef);
    d.write_at(image, 0).unwrap();
    d
}

/// Writes the vdisk's first 4 KiB block with pattern `seed`, and into `model`.
fn write_first_block(rig: &Rig, model: &mut [u8], seed: u64) {
    let new = pattern(seed, 0, 4096);
    rig.engine().vdisk("v").unwrap().write(0, &new, true).unwrap();
    model[..4096].copy_from_slice(&new);
}

fn assert_failed_as_an_older_copy(rig: &Rig, disk: usize) {
    let d = &rig.engine().pool().disks()[disk];
    assert_eq!(d.info.state, DiskState::Failed);
    assert!(
        d.problem.as_deref().unwrap_or("").contains("older copy"),
        "{:?}",
        d.problem
    );
}

fn state(rig: &Rig, disk: usize) -> DiskState {
    rig.engine().pool().disks()[disk].info.state
}

#[test]
fn a_disk_back_that_missed_no_write_is_current() {
    let (mut rig, data) = mirrored_pair();
    stop(&mut rig);
    let away = rig.disks.remove(1);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Missing);
    assert_eq!(read_all(&rig), data, "read without it");
    stop(&mut rig);
    rig.disks.insert(1, away);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Healthy, "nothing went around it");
    assert!(rig.engine().layouts().repair_needed().0.is_empty());
    // It holds the data: the other disk failed, everything reads from it alone.
    rig.engine().fail_disk("mem0").unwrap();
    assert_eq!(read_all(&rig), data);
}

#[test]
fn a_disk_back_is_stale_only_in_the_slab_sets_written_around_it_and_resynced_where_it_is() {
    let (mut rig, mut data) = mirrored_pair();
    let sets = rig.engine().layouts().sets().len();
    stop(&mut rig);
    let away = rig.disks.remove(1);
    rig.reopen();
    // One block written while the disk is away: one set goes around it.
    write_first_block(&rig, &mut data, 2);
    // Closed as a crash would: the record of it must be durable already.
    rig.engine = None;
    rig.disks.insert(1, away);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Healthy);
    let layouts = rig.engine().layouts();
    assert_eq!(
        layouts.stale_members(),
        1,
        "one set of {sets} was written around the disk"
    );
    assert_eq!(layouts.repair_needed().0.len(), 1);
    assert_eq!(layouts.repair_space_needed(), 0, "resynced where it is");
    let stale: Vec<_> = layouts
        .audit()
        .unwrap()
        .into_iter()
        .filter(|f| format!("{f:?}").contains("\"stale\""))
        .collect();
    assert_eq!(stale.len(), 1, "{stale:?}");
    // Read around the stale member meanwhile.
    for _ in 0..8 {
        assert_eq!(read_all(&rig), data);
    }
    // The resynced disk alone holds the data, the block written while it was away included.
    resync_in_place_then_read_without_disk_0(&rig, &data, 1);
    assert_eq!(rig.engine().layouts().stale_members(), 0);
    rig.reopen();
    assert_eq!(read_all(&rig), data, "the resync outlives a restart");
    rig.assert_consistent();
}

/// Labels of the disks of a pool whose members await a resync say so, with a flag that a
/// daemon which does not know such members (and would read them as current) refuses: a
/// downgrade meanwhile finds no disk it can take. The flag goes once the resync is done.
#[test]
fn while_members_await_a_resync_every_label_says_so() {
    let pending = |rig: &Rig| -> Vec<bool> {
        rig.disks
            .iter()
            .map(|d| {
                let mut raw = vec![0u8; 4096];
                d.read_at(&mut raw, 0).unwrap();
                let flags = u32::from_le_bytes(raw[84..88].try_into().unwrap());
                let label = read_label(d.as_ref()).unwrap();
                assert_eq!(label.resync_pending, flags & 2 != 0);
                // What a daemon that knows only the export flag accepts.
                assert_eq!(flags & !1 != 0, label.resync_pending);
                label.resync_pending
            })
            .collect()
    };
    let (mut rig, mut data) = mirrored_pair();
    assert_eq!(pending(&rig), [false, false]);
    stop(&mut rig);
    let away = rig.disks.remove(1);
    rig.reopen();
    write_first_block(&rig, &mut data, 2);
    assert_eq!(pending(&rig), [false], "a member on a missing disk is read by nobody");
    rig.engine = None;
    rig.disks.insert(1, away);
    rig.reopen();
    assert_eq!(rig.engine().layouts().stale_members(), 1);
    assert_eq!(pending(&rig), [true, true]);
    // A crash keeps it: the labels say so until the resync is done.
    rig.engine = None;
    rig.reopen();
    assert_eq!(pending(&rig), [true, true]);
    assert_eq!(rig.repair(), 1);
    assert_eq!(pending(&rig), [false, false]);
    rig.reopen();
    assert_eq!(pending(&rig), [false, false]);
    assert_eq!(read_all(&rig), data);
}

/// A disk missing since the import and reachable again while the pool runs is taken back
/// without a restart, as an import would take it: current where no write went around it,
/// stale (read around, then resynced where it is) where one did, with writers going on
/// throughout; an older copy, a disk that is not missing and a cache disk are refused.
#[test]
fn a_disk_back_while_the_pool_runs_is_taken_back_as_an_import_would() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (mut rig, data) = mirrored_pair();
    let older = image_of(&rig, 1);
    stop(&mut rig);
    let away = rig.disks.remove(1);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Missing);
    let e = rig.engine();
    // Refused: an image of it from before the last stop, and a disk that is there.
    let err = e
        .bring_back_disk("mem1", copy_of("mem1", &older) as DiskRef)
        .unwrap_err()
        .to_string();
    assert!(err.contains("older copy"), "{err}");
    let err = e
        .bring_back_disk("mem0", rig.disks[0].clone() as DiskRef)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not missing"), "{err}");

    // Writers on four quarters of the vdisk, 4 KiB blocks stamped with their writer's
    // count, before, while and after the disk comes back.
    let v = e.vdisk("v").unwrap();
    let stop_writing = AtomicBool::new(false);
    let quarter = SIZE / 4;
    let model = std::sync::Mutex::new(data.clone());
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let (v, model, stop_writing) = (&v, &model, &stop_writing);
            sc.spawn(move || {
                let mut n = 0u64;
                while !stop_writing.load(Ordering::Relaxed) || n < 8 {
                    let at = t * quarter + (n * 7919 * 4096) % quarter;
                    let block = pattern(1000 * t + n, at, 4096);
                    v.write(at, &block, n % 3 == 0).unwrap();
                    model.lock().unwrap()[at as usize..at as usize + 4096].copy_from_slice(&block);
                    n += 1;
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        e.bring_back_disk("mem1", away.clone() as DiskRef).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        stop_writing.store(true, Ordering::Relaxed);
    });
    drop(v);
    let data = model.into_inner().unwrap();
    rig.disks.insert(1, away);
    assert_eq!(state(&rig, 1), DiskState::Healthy);
    let stale = rig.engine().layouts().stale_members();
    assert!(stale > 0, "writes went around it");
    assert_eq!(read_all(&rig), data, "read around what it missed");
    // The disk taken back alone holds everything, the writes made around it included.
    resync_in_place_then_read_without_disk_0(&rig, &data, stale);
    rig.reopen();
    assert_eq!(read_all(&rig), data);
    rig.assert_consistent();
}

/// A write is refused by a set that lost more members than it tolerates: when those come
/// back, the set is whole again (before, each was failed and the set's data lost).
#[test]
fn disks_back_make_whole_again_the_sets_they_were_beyond_tolerance_of() {
    let mut rig = Rig::new(3, 32 * MIB, MIB);
    let size = 8 * MIB;
    let old = pattern(3, 0, size as usize);
    rig.engine()
        .create_vdisk(&spec("v", size, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap()
        .write(0, &old, true)
        .unwrap();
    rig.engine = None;
    let away: Vec<_> = rig.disks.drain(..2).collect();
    rig.reopen();
    let chunk = 256 * 1024;
    let new = pattern(4, 0, size as usize);
    let mut want = old.clone();
    let (mut written, mut refused) = (0, 0);
    for at in (0..size as usize).step_by(chunk) {
        let v = rig.engine().vdisk("v").unwrap();
        match v.write(at as u64, &new[at..at + chunk], true) {
            Ok(()) => {
                want[at..at + chunk].copy_from_slice(&new[at..at + chunk]);
                written += 1;
            }
            Err(_) => refused += 1,
        }
    }
    assert!(
        written > 0 && refused > 0,
        "placement gave no set on both absent disks ({written} written, {refused} refused)"
    );
    rig.engine = None;
    for (i, d) in away.into_iter().enumerate() {
        rig.disks.insert(i, d);
    }
    rig.reopen();
    assert_eq!(
        (state(&rig, 0), state(&rig, 1)),
        (DiskState::Healthy, DiskState::Healthy)
    );
    let mut b = vec![0u8; size as usize];
    rig.engine().vdisk("v").unwrap().read(0, &mut b).unwrap();
    assert!(b == want, "every block reads as last written");
    rig.repair();
    // Disks 0 and 1 alone hold everything, as last written.
    rig.engine().fail_disk("mem2").unwrap();
    rig.engine().vdisk("v").unwrap().read(0, &mut b).unwrap();
    assert!(b == want, "the disks that came back hold every block as last written");
    rig.assert_consistent();
}

/// The daemon's own resync of a disk back touches its stale members alone: the members of a
/// disk still missing (which may yet come back within its delay) stay where they are.
#[test]
fn resyncing_the_stale_members_leaves_a_missing_disks_members_alone() {
    let mut rig = Rig::new(3, 32 * MIB, MIB);
    let size = 8 * MIB;
    let mut data = pattern(7, 0, size as usize);
    rig.engine()
        .create_vdisk(&spec("v", size, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap()
        .write(0, &data, true)
        .unwrap();
    stop(&mut rig);
    let one = rig.disks.remove(1);
    rig.reopen();
    let new = pattern(8, 0, size as usize);
    rig.engine().vdisk("v").unwrap().write(0, &new, true).unwrap();
    data.copy_from_slice(&new);
    stop(&mut rig);
    // Disk 1 is back, disk 2 (now at index 1 of the rig's list) is away.
    let two = rig.disks.remove(1);
    rig.disks.insert(1, one);
    rig.reopen();
    let e = rig.engine();
    assert_eq!(e.pool().disks()[2].info.state, DiskState::Missing);
    let on_two = e.pool().disks()[2].slabs_used;
    assert!(on_two > 0);
    let stale = e.layouts().stale_members();
    assert!(stale > 0);
    let report = e
        .resync_stale(&RebuildOptions::default(), &Progress::default())
        .unwrap();
    assert_eq!(
        e.pool().disks()[2].slabs_used,
        on_two,
        "a missing disk's members stayed"
    );
    // Every set with no member on disk 2 is whole; those with one failed (their other member
    // is the stale one: nothing to resync from) or wait for disk 2's delay.
    for set in e.layouts().sets() {
        let on_disk_two = set.desc().members.iter().any(|m| m.disk == 2);
        if !on_disk_two {
            assert_eq!(e.layouts().health(&set).state(), "healthy", "set {}", set.id);
        }
    }
    assert!(report.slabs_rebuilt > 0 && report.slabs_rebuilt <= stale, "{report:?}");
    drop(two);
}

/// A retired disk is still written until a repair empties it: missing at a start, then back,
/// it is stale where a write went around it (before, it was taken back as it was and read).
#[test]
fn a_retired_disk_back_is_stale_where_a_write_went_around_it() {
    let (mut rig, mut data) = mirrored_pair();
    rig.engine().retire_disk("mem1").unwrap();
    stop(&mut rig);
    let away = rig.disks.remove(1);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Missing);
    write_first_block(&rig, &mut data, 5);
    stop(&mut rig);
    rig.disks.insert(1, away);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Retired);
    assert_eq!(
        rig.engine().layouts().stale_members(),
        0,
        "a retired disk's members move"
    );
    // The stale member is not read: with the other disk failed, the set written around it
    // has no copy to read, and the others read from the retired disk.
    rig.engine().fail_disk("mem0").unwrap();
    let mut b = vec![0u8; 4096];
    assert!(
        rig.engine().vdisk("v").unwrap().read(0, &mut b).is_err(),
        "read from a member that missed the write (the data before it: {})",
        b == pattern(1, 0, 4096)
    );
    let mut rest = vec![0u8; (SIZE - MIB) as usize];
    let v = rig.engine().vdisk("v").unwrap();
    let whole: Vec<u64> = (0..SIZE / MIB)
        .filter(|i| v.read(i * MIB, &mut rest[..MIB as usize]).is_ok())
        .collect();
    assert_eq!(
        whole.len() as u64,
        SIZE / MIB - 1,
        "only the set written around it is unreadable"
    );
    for i in whole {
        v.read(i * MIB, &mut rest[..MIB as usize]).unwrap();
        assert!(rest[..MIB as usize] == data[(i * MIB) as usize..((i + 1) * MIB) as usize]);
    }
}

/// A missing disk can only be failed: retired, say, the writes that go around it would not be
/// recorded, and it would come back current.
#[test]
fn a_missing_disk_can_only_be_failed() {
    let (mut rig, _) = mirrored_pair();
    stop(&mut rig);
    let away = rig.disks.remove(1);
    rig.reopen();
    let e = rig.engine().retire_disk("mem1").unwrap_err().to_string();
    assert!(e.contains("missing") && e.contains("can only be failed"), "{e}");
    assert_eq!(state(&rig, 1), DiskState::Missing);
    rig.engine().fail_disk("mem1").unwrap();
    stop(&mut rig);
    rig.disks.insert(1, away);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Failed);
}

/// What comes back in a missing disk's place with its label but an older generation (an image
/// restored from a backup, a snapshot of a virtual disk) is an older copy of it, whatever it
/// missed while away: failed, never read.
#[test]
fn an_older_copy_of_a_missing_disk_is_failed() {
    let (mut rig, data) = mirrored_pair();
    let image = image_of(&rig, 1);
    // Two restarts later the disk is gone; its old copy is put in its place.
    rig.reopen();
    rig.reopen();
    stop(&mut rig);
    rig.disks.remove(1);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Missing);
    stop(&mut rig);
    rig.disks.insert(1, copy_of("mem1", &image));
    rig.reopen();
    assert_failed_as_an_older_copy(&rig, 1);
    assert_eq!(read_all(&rig), data);
}

/// The same for a disk that was there at the last start: an older copy of it put in its place
/// while the daemon was stopped is failed, not read as current.
#[test]
fn an_older_copy_in_a_present_disks_place_is_failed() {
    let (mut rig, data) = mirrored_pair();
    let image = image_of(&rig, 1);
    let mut now = data.clone();
    write_first_block(&rig, &mut now, 6);
    stop(&mut rig);
    rig.disks[1] = copy_of("mem1", &image);
    rig.reopen();
    assert_failed_as_an_older_copy(&rig, 1);
    for _ in 0..4 {
        assert_eq!(read_all(&rig), now);
    }
}

/// A copy taken while the pool runs, put back after a clean stop (which seals the pool: every
/// label a generation on), is as old: failed, not read.
#[test]
fn a_copy_taken_while_the_pool_ran_is_older_after_a_clean_stop() {
    let (mut rig, data) = mirrored_pair();
    let image = image_of(&rig, 1);
    let mut now = data.clone();
    write_first_block(&rig, &mut now, 11);
    rig.engine().checkpoint().unwrap();
    rig.engine().seal().unwrap();
    rig.engine = None;
    rig.disks[1] = copy_of("mem1", &image);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Failed);
    for _ in 0..4 {
        assert_eq!(read_all(&rig), now);
    }
}

/// A disk recorded missing by a daemon that did not record the sets written around it: what
/// it missed is not known, and it is failed when it is back, as before.
#[test]
fn a_disk_missing_since_before_such_records_is_failed_when_back() {
    let (mut rig, data) = mirrored_pair();
    rig.engine = None;
    let away = rig.disks.remove(1);
    rig.reopen();
    rig.engine = None;
    // The pool's configuration as that daemon saved it: the disk missing, nothing more.
    let meta_dir = rig.dir.path().join("pool").join("meta");
    {
        let meta = MetaStore::open(&meta_dir).unwrap();
        let mut config: serde_json::Value =
            serde_json::from_slice(&meta.get(CF_POOL, b"config").unwrap().unwrap()).unwrap();
        let disk = &mut config["disks"][1];
        assert_eq!(disk["state"], "missing");
        assert_eq!(disk["returns_as"], "healthy");
        disk.as_object_mut().unwrap().remove("returns_as");
        let mut b = MetaBatch::new();
        b.put(CF_POOL, b"config", serde_json::to_vec(&config).unwrap());
        meta.commit(b, true).unwrap();
    }
    rig.disks.insert(1, away);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Failed);
    assert_eq!(read_all(&rig), data);
}

/// A write-back cache disk back after a start without it is failed: the log went on without
/// it, and its records are not the log's any more.
#[test]
fn a_cache_disk_back_is_failed() {
    let mut rig = Rig::with_cache(2, 32 * MIB, MIB, 2);
    let cache = rig.disks.len() - 1;
    rig.engine = None;
    let away = rig.disks.remove(cache);
    rig.reopen();
    assert_eq!(state(&rig, cache), DiskState::Missing);
    rig.engine = None;
    rig.disks.push(away);
    rig.reopen();
    assert_eq!(state(&rig, cache), DiskState::Failed);
}

/// A crash leaves the update of a degraded parity set in the stripe journal, and at the next
/// start one more of its disks is missing: the set is beyond its tolerance, and the update is
/// kept, neither applied to the one member left nor recorded as gone around the missing one.
/// When that disk is back, the update is applied and the set reads as last written (had it
/// been applied around the disk, the disk would be stale and the set lost for good).
#[test]
fn an_update_kept_while_its_set_is_beyond_tolerance_is_applied_when_its_disk_is_back() {
    let mut rig = Rig::new(3, 32 * MIB, MIB);
    let size = 2 * MIB;
    let mut data = pattern(9, 0, size as usize);
    rig.engine()
        .create_vdisk(&spec("v", size, LayoutKind::Parity, Provisioning::Thin))
        .unwrap()
        .write(0, &data, true)
        .unwrap();
    rig.engine().fail_disk("mem0").unwrap();
    let new = pattern(10, 0, 64 << 10);
    rig.engine().vdisk("v").unwrap().write(0, &new, true).unwrap();
    data[..new.len()].copy_from_slice(&new);
    // A crash, and disk 1 missing at the start after.
    rig.engine = None;
    let away = rig.disks.remove(1);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Missing);
    // Not while the pool runs: the update the import kept waits for the disk.
    let err = rig
        .engine()
        .bring_back_disk("mem1", away.clone() as DiskRef)
        .unwrap_err()
        .to_string();
    assert!(err.contains("waits in the journal"), "{err}");
    assert_eq!(state(&rig, 1), DiskState::Missing);
    rig.engine = None;
    rig.disks.insert(1, away);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Healthy);
    assert_eq!(rig.engine().layouts().stale_members(), 0);
    let mut b = vec![0u8; size as usize];
    rig.engine().vdisk("v").unwrap().read(0, &mut b).unwrap();
    assert!(b == data, "the set reads as last written");
}

/// A two-disk mirror like [`mirrored_pair`] whose disk 1 has a volatile write cache (behind
/// its fault injector), and the power supply of that cache alone.
fn mirrored_pair_with_a_cache_on_disk_1() -> (Rig, Vec<u8>, Arc<PowerSupply>, DiskRef) {
    pair_with_a_cache_on_disk_1(LayoutKind::Mirror, 4)
}

/// Two disks, the second with a volatile write cache (behind its fault injector), and a vdisk
/// of layout `kind` on them in `sets` slab sets, written whole and flushed; the power supply
/// of that cache alone.
fn pair_with_a_cache_on_disk_1(kind: LayoutKind, sets: usize) -> (Rig, Vec<u8>, Arc<PowerSupply>, DiskRef) {
    let dir = tempfile::tempdir().unwrap();
    let supply = PowerSupply::new();
    let medium: DiskRef = Arc::new(MemDisk::new("mem1", 32 * MIB));
    let disks = vec![
        FaultyDisk::new(Arc::new(MemDisk::new("mem0", 32 * MIB)) as DiskRef),
        FaultyDisk::new(VolatileDisk::new(medium.clone(), &supply) as DiskRef),
    ];
    let refs: Vec<DiskRef> = disks.iter().map(|d| d.clone() as DiskRef).collect();
    let engine = tessera_volume::Engine::create_pool(&dir.path().join("pool"), "test", refs, MIB).unwrap();
    let data = pattern(1, 0, SIZE as usize);
    // Written whole and flushed: on both media.
    engine
        .create_vdisk(&spec("v", SIZE, kind, Provisioning::Thin))
        .unwrap()
        .write(0, &data, true)
        .unwrap();
    assert_eq!(engine.layouts().sets().len(), sets);
    let rig = Rig {
        dir,
        disks,
        engine: Some(engine),
    };
    (rig, data, supply, medium)
}

/// Writes `len` bytes of pattern `seed` at `at`, and into `model`.
fn write_at(rig: &Rig, model: &mut [u8], seed: u64, at: u64, len: usize) {
    let new = pattern(seed, at, len);
    rig.engine().vdisk("v").unwrap().write(at, &new, false).unwrap();
    model[at as usize..at as usize + len].copy_from_slice(&new);
}

/// A disk that an I/O error takes out while the pool runs (here its enclosure's power blinks:
/// its cache loses what it held, and its I/O fails meanwhile) keeps everything it had at its
/// last flush. Taken back with `disk online`, it is stale only in the slab sets written since
/// that flush, or around it after, and resynced there; before, such a disk was failed for good.
#[test]
fn a_disk_an_error_took_out_comes_back_stale_only_where_written_since_its_last_flush() {
    let (mut rig, mut data, supply, medium) = mirrored_pair_with_a_cache_on_disk_1();
    // Set 0 written, not flushed: disk 1 has it in its cache only.
    write_at(&rig, &mut data, 2, 0, 8192);
    rig.disks[1].faults().pull();
    let cut = supply.cut(7);
    assert_eq!(cut[0].torn, 1, "{cut:?}");
    // A write to set 2 finds the error: the disk is out, able to come back.
    write_at(&rig, &mut data, 3, 2 * MIB, 4096);
    assert_eq!(state(&rig, 1), DiskState::Failed);
    let problem = rig.engine().pool().disks()[1].problem.clone().unwrap_or_default();
    assert!(problem.contains("disk online"), "{problem}");
    // Set 3 written around it.
    write_at(&rig, &mut data, 4, 3 * MIB, 4096);
    assert_eq!(read_all(&rig), data, "read without it");

    // Its medium holds what reached it; powered again.
    let back = FaultyDisk::new(VolatileDisk::new(medium, &PowerSupply::new()) as DiskRef);
    rig.engine().bring_back_disk("mem1", back.clone() as DiskRef).unwrap();
    rig.disks[1] = back;
    assert_eq!(state(&rig, 1), DiskState::Healthy);
    assert_eq!(
        rig.engine().layouts().stale_members(),
        3,
        "sets 0 (in its lost cache), 2 (the write that failed) and 3 (written around it); set 1 is current"
    );
    assert_eq!(read_all(&rig), data, "read around what is stale");
    // It alone holds everything now.
    resync_in_place_then_read_without_disk_0(&rig, &data, 3);
    rig.reopen();
    assert_eq!(read_all(&rig), data);
    rig.assert_consistent();
}

/// The same blip with a crash before the disk is back: the configuration saved at the error
/// says which of its slabs are stale, the import keeps that list (the disk answers again, but
/// waits for `disk online`: a disk that fails writes may well read its label), and `disk
/// online` records them with their sets and takes the disk back with them stale.
#[test]
fn a_disk_an_error_took_out_keeps_its_stale_slabs_across_a_crash() {
    let (mut rig, mut data, supply, medium) = mirrored_pair_with_a_cache_on_disk_1();
    write_at(&rig, &mut data, 2, MIB, 8192);
    rig.disks[1].faults().pull();
    supply.cut(11);
    write_at(&rig, &mut data, 3, 2 * MIB, 4096);
    assert_eq!(state(&rig, 1), DiskState::Failed);
    // A crash; at the start after it the disk answers again.
    rig.engine = None;
    rig.disks[1] = FaultyDisk::new(VolatileDisk::new(medium, &PowerSupply::new()) as DiskRef);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Failed, "not taken back by the import");
    assert_eq!(
        rig.engine().pool().disks()[1].info.stale_slabs.len(),
        2,
        "kept until the disk is back"
    );
    assert_eq!(read_all(&rig), data);
    rig.engine()
        .bring_back_disk("mem1", rig.disks[1].clone() as DiskRef)
        .unwrap();
    assert_eq!(state(&rig, 1), DiskState::Healthy);
    assert_eq!(rig.engine().layouts().stale_members(), 2, "sets 1 and 2");
    assert_eq!(read_all(&rig), data);
    resync_in_place_then_read_without_disk_0(&rig, &data, 2);
}

/// A disk an error took out that does not answer at the next import stays out, able to come
/// back; `disk fail` gives it up for good, and then neither `disk online` nor an import takes
/// it back.
#[test]
fn disk_fail_gives_up_a_disk_an_error_took_out() {
    let (mut rig, mut data) = mirrored_pair();
    rig.disks[1].faults().pull();
    write_at(&rig, &mut data, 2, 0, 4096);
    assert_eq!(state(&rig, 1), DiskState::Failed);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Failed);
    let problem = rig.engine().pool().disks()[1].problem.clone().unwrap_or_default();
    assert!(
        problem.contains("took it out") && problem.contains("disk online"),
        "{problem}"
    );
    // Its place is not free for another disk meanwhile.
    let err = rig
        .engine()
        .pool()
        .add_disk(FaultyDisk::new(Arc::new(MemDisk::new("mem1", 32 * MIB)) as DiskRef) as DiskRef)
        .unwrap_err()
        .to_string();
    assert!(err.contains("mem1"), "{err}");
    rig.engine().fail_disk("mem1").unwrap();
    rig.disks[1].faults().reinsert();
    let err = rig
        .engine()
        .bring_back_disk("mem1", rig.disks[1].clone() as DiskRef)
        .unwrap_err()
        .to_string();
    assert!(err.contains("failed for good"), "{err}");
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Failed);
    assert_eq!(read_all(&rig), data);
}

/// A daemon older than these records keeps a failed disk's configuration but drops what it
/// does not know (`back_after_error`), and writes around the disk without a record: after
/// it, the disk is failed for good, and `disk online` refuses it.
#[test]
fn a_disk_an_error_took_out_is_failed_for_good_after_a_daemon_that_does_not_know_it() {
    let (mut rig, mut data) = mirrored_pair();
    rig.disks[1].faults().pull();
    write_at(&rig, &mut data, 2, 0, 4096);
    rig.engine = None;
    let meta_dir = rig.dir.path().join("pool").join("meta");
    {
        let meta = MetaStore::open(&meta_dir).unwrap();
        let mut config: serde_json::Value =
            serde_json::from_slice(&meta.get(CF_POOL, b"config").unwrap().unwrap()).unwrap();
        let disk = &mut config["disks"][1];
        assert_eq!(disk["state"], "failed");
        assert_eq!(disk["back_after_error"], true);
        disk.as_object_mut().unwrap().remove("back_after_error");
        let mut b = MetaBatch::new();
        b.put(CF_POOL, b"config", serde_json::to_vec(&config).unwrap());
        meta.commit(b, true).unwrap();
    }
    rig.disks[1].faults().reinsert();
    rig.reopen();
    let err = rig
        .engine()
        .bring_back_disk("mem1", rig.disks[1].clone() as DiskRef)
        .unwrap_err()
        .to_string();
    assert!(err.contains("failed for good"), "{err}");
    assert_eq!(state(&rig, 1), DiskState::Failed);
    assert_eq!(read_all(&rig), data);
}

/// Reads the vdisk block by block: each block's bytes, or the error that refused it.
fn read_blocks(rig: &Rig) -> Vec<Result<Vec<u8>, String>> {
    let v = rig.engine().vdisk("v").unwrap();
    (0..SIZE / 4096)
        .map(|b| {
            let mut buf = vec![0u8; 4096];
            v.read(b * 4096, &mut buf).map(|()| buf).map_err(|e| e.to_string())
        })
        .collect()
}

/// A simple vdisk has nothing to resync a stale slab from: when the disk an error took out is
/// back, its slabs written since its last flush are taken as the disk holds them, as a power
/// cut of that disk would leave them. None of the writes the disk's cache lost was promised
/// durable: the vdisk's flush fails, even once the disk is back. While the pool runs, a block
/// that never reached the medium, or reached it torn, does not match its checksum: it is
/// refused, never returned, until written again. After a crash, the regions the journal
/// recorded as being written are settled as any crash's replay settles them: each block as
/// the disk holds it, sector by sector old or new. Everything else reads as it was. Before,
/// those slabs stayed unreadable for good (1 MiB each here).
fn a_simple_vdisk_takes_back_what_the_disk_holds(crash: bool) {
    // Striped over both disks, 16 KiB to each in turn: blocks 4, 12 and 20 are on disk 1.
    let (mut rig, mut data, supply, medium) = pair_with_a_cache_on_disk_1(LayoutKind::Simple, 2);
    let old = data.clone();
    let blocks_written = [4usize, 12, 20];
    for (k, b) in blocks_written.iter().enumerate() {
        write_at(&rig, &mut data, 2 + k as u64, *b as u64 * 4096, 4096);
    }
    rig.disks[1].faults().pull();
    let cut = supply.cut(SEED);
    assert_eq!((cut[0].kept, cut[0].torn, cut[0].dropped), (1, 1, 1), "{cut:?}");
    // A write to set 1 finds the error: the disk is out.
    let v = rig.engine().vdisk("v").unwrap();
    assert!(v.write(2 * MIB + 16 * 1024, &pattern(9, 2 * MIB, 4096), false).is_err());
    drop(v);
    assert_eq!(state(&rig, 1), DiskState::Failed);
    let back = FaultyDisk::new(VolatileDisk::new(medium, &PowerSupply::new()) as DiskRef);
    if crash {
        rig.engine = None;
        rig.disks[1] = back.clone();
        rig.reopen();
        assert_eq!(state(&rig, 1), DiskState::Failed, "not taken back by the import");
    }
    rig.engine().bring_back_disk("mem1", back.clone() as DiskRef).unwrap();
    rig.disks[1] = back;
    assert_eq!(state(&rig, 1), DiskState::Healthy);
    assert_eq!(rig.engine().layouts().stale_members(), 0, "nothing to resync from");
    assert!(rig.engine().layouts().repair_needed().0.is_empty());
    if !crash {
        // The disk is whole again, but it may lack what the vdisk wrote before the error.
        let err = rig.engine().vdisk("v").unwrap().flush().unwrap_err().to_string();
        assert!(err.contains("may be lost"), "{err}");
    }

    let (new, refused, torn) = sort_blocks(&rig, &data, &old, &blocks_written);
    assert_eq!(new.len(), 1, "the write the disk's cache kept reads back: {new:?}");
    if crash {
        assert!(refused.is_empty(), "{refused:?}");
        assert!(torn.len() <= 1, "{torn:?}");
    } else {
        // The one it dropped and the one it tore.
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(torn.is_empty(), "{torn:?}");
        // Not counted against the disk (past `disk_error_limit`, the daemon would retire a
        // sound disk as failing): its cache lost them, its medium did not rot.
        let errors = rig.engine().layouts().disk_errors();
        assert_eq!(errors.get(&1).map_or(0, |e| e.checksum), 0, "{errors:?}");
        // Nor after a restart: the set's record keeps which members were taken so.
        rig.reopen();
        let again = sort_blocks(&rig, &data, &old, &blocks_written);
        assert_eq!((&again.0, &again.1), (&new, &refused), "after a restart");
        let errors = rig.engine().layouts().disk_errors();
        assert_eq!(
            errors.get(&1).map_or(0, |e| e.checksum),
            0,
            "after a restart: {errors:?}"
        );
        // A scrub finds them too, and leaves the members taken as held.
        scrub_all(&rig);
        let errors = rig.engine().layouts().disk_errors();
        assert_eq!(errors.get(&1).map_or(0, |e| e.checksum), 0, "after a scrub: {errors:?}");
        assert!(!held_members(&rig).is_empty(), "kept taken as held");
    }
    // Written again, every block reads again; so does everything after a restart.
    for b in blocks_written {
        write_at(&rig, &mut data, 40 + b as u64, b as u64 * 4096, 4096);
    }
    rig.engine().vdisk("v").unwrap().flush().unwrap();
    assert_eq!(read_all(&rig), data);
    rig.reopen();
    assert_eq!(read_all(&rig), data);
    rig.assert_consistent();
    // Written again, they are gone: a scrub that finds the members clean ends their taking
    // as held, and rot found in them from then on counts against the disk again.
    let held = held_members(&rig);
    assert!(!held.is_empty());
    // A pass over which the disk went out and came back counts for nothing: its cache may
    // have lost blocks in the rows the pass had found clean.
    let l = rig.engine().layouts();
    let set = l.sets().into_iter().find(|s| s.desc().held.contains(&held[0])).unwrap();
    let rows = l.rows_of(&set);
    l.scrub_rows(&set, 0..rows / 2, true).unwrap();
    rig.disks[1].faults().pull();
    let on_disk_1 = 4 * 4096;
    let v = rig.engine().vdisk("v").unwrap();
    assert!(v.write(on_disk_1, &pattern(77, on_disk_1, 4096), false).is_err());
    drop(v);
    assert_eq!(state(&rig, 1), DiskState::Failed);
    rig.disks[1].faults().reinsert();
    rig.engine()
        .bring_back_disk("mem1", rig.disks[1].clone() as DiskRef)
        .unwrap();
    // The block the failed write left unknown is written again, and the pass goes on.
    write_at(&rig, &mut data, 78, on_disk_1, 4096);
    l.scrub_rows(&set, rows / 2..rows, true).unwrap();
    assert!(held_members(&rig).contains(&held[0]), "a pass the disk went out in");
    scrub_all(&rig);
    assert_eq!(held_members(&rig), Vec::new(), "a clean scrub");
    let slab = held[0];
    rig.disks[slab.disk as usize]
        .faults()
        .flip_bit(rig.engine().pool().slab_offset(slab) + 100, 3)
        .unwrap();
    scrub_all(&rig);
    let errors = rig.engine().layouts().disk_errors();
    assert_eq!(errors.get(&slab.disk).map_or(0, |e| e.checksum), 1, "{errors:?}");
    rig.reopen();
    assert_eq!(held_members(&rig), Vec::new(), "after a restart");
}

/// Every member taken as its disk held it, as the slab sets record them.
fn held_members(rig: &Rig) -> Vec<tessera_pool::SlabRef> {
    let l = rig.engine().layouts();
    l.sets().iter().flat_map(|s| s.desc().held).collect()
}

/// A whole pass of a repairing scrub over every slab set.
fn scrub_all(rig: &Rig) {
    let l = rig.engine().layouts();
    for set in l.sets() {
        l.scrub_rows(&set, 0..l.rows_of(&set), true).unwrap();
    }
}

/// A cut that keeps one of the three cached writes whole, tears one and drops one.
const SEED: u64 = 2;

#[test]
fn a_simple_vdisk_takes_back_as_the_disk_holds_them_the_slabs_an_error_left_stale() {
    a_simple_vdisk_takes_back_what_the_disk_holds(false);
}

#[test]
fn a_simple_vdisk_takes_back_as_the_disk_holds_them_the_slabs_an_error_left_stale_after_a_crash() {
    a_simple_vdisk_takes_back_what_the_disk_holds(true);
}

/// A disk that answers at an import but cannot take its label (its flush fails) no longer
/// keeps the whole pool from opening: it is left out as a missing disk would be, the pool
/// serves from the others, and `disk online` takes it back once it works, stale only where
/// writes went around it.
#[test]
fn a_disk_whose_label_cannot_be_written_at_the_import_is_left_out_and_comes_back() {
    let (mut rig, mut data) = mirrored_pair();
    stop(&mut rig);
    rig.disks[1].faults().fail_flushes(true);
    rig.reopen();
    assert_eq!(state(&rig, 1), DiskState::Missing);
    let problem = rig.engine().pool().disks()[1].problem.clone().unwrap_or_default();
    assert!(
        problem.contains("label could not be written") && problem.contains("disk online"),
        "{problem}"
    );
    assert_eq!(read_all(&rig), data);
    // Set 1 written around it.
    write_at(&rig, &mut data, 2, MIB, 4096);
    rig.engine().vdisk("v").unwrap().flush().unwrap();
    rig.disks[1].faults().fail_flushes(false);
    rig.engine()
        .bring_back_disk("mem1", rig.disks[1].clone() as DiskRef)
        .unwrap();
    assert_eq!(state(&rig, 1), DiskState::Healthy);
    assert_eq!(rig.engine().layouts().stale_members(), 1, "set 1");
    resync_in_place_then_read_without_disk_0(&rig, &data, 1);
}

/// ... but a cache disk that cannot take its label still fails the import: left out, it would
/// take the write-back log's writes with it (the log goes on without it, and it never comes
/// back to it), where an import tried again loses nothing.
#[test]
fn a_cache_disk_whose_label_cannot_be_written_fails_the_import() {
    let (mut rig, data) = with_mirror_written(Rig::with_cache(2, 32 * MIB, MIB, 1));
    rig.engine = None;
    rig.disks[2].faults().fail_flushes(true);
    let err = tessera_volume::Engine::open(&rig.dir.path().join("pool"), &rig.opener())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("cache0"), "{err}");
    rig.disks[2].faults().fail_flushes(false);
    rig.reopen();
    assert_eq!(state(&rig, 2), DiskState::Healthy);
    assert_eq!(read_all(&rig), data);
}

/// Two disks, each with a volatile write cache of its own power supply (behind its fault
/// injector), and a mirror vdisk on them in four slab sets, written whole and flushed; the
/// supplies and the media.
fn mirror_with_caches_on_both() -> (Rig, Vec<u8>, [Arc<PowerSupply>; 2], [DiskRef; 2]) {
    let dir = tempfile::tempdir().unwrap();
    let supplies = [PowerSupply::new(), PowerSupply::new()];
    let media: [DiskRef; 2] = [
        Arc::new(MemDisk::new("mem0", 32 * MIB)),
        Arc::new(MemDisk::new("mem1", 32 * MIB)),
    ];
    let disks: Vec<Arc<FaultyDisk>> = (0..2)
        .map(|i| FaultyDisk::new(VolatileDisk::new(media[i].clone(), &supplies[i]) as DiskRef))
        .collect();
    let refs: Vec<DiskRef> = disks.iter().map(|d| d.clone() as DiskRef).collect();
    let engine = tessera_volume::Engine::create_pool(&dir.path().join("pool"), "test", refs, MIB).unwrap();
    let data = pattern(1, 0, SIZE as usize);
    engine
        .create_vdisk(&spec("v", SIZE, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap()
        .write(0, &data, true)
        .unwrap();
    assert_eq!(engine.layouts().sets().len(), 4);
    let rig = Rig {
        dir,
        disks,
        engine: Some(engine),
    };
    (rig, data, supplies, media)
}

/// Disk `i`'s medium, powered again behind a new fault injector.
fn powered_again(medium: &DiskRef) -> Arc<FaultyDisk> {
    FaultyDisk::new(VolatileDisk::new(medium.clone(), &PowerSupply::new()) as DiskRef)
}

/// Sorts the vdisk's blocks into those that read `data` where it differs from `old` (new),
/// those refused with a checksum error, and those torn (sector by sector old or new); every
/// other block must read as `old`, and every block outside `written` as it was.
fn sort_blocks(rig: &Rig, data: &[u8], old: &[u8], written: &[usize]) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let (mut new, mut refused, mut torn) = (Vec::new(), Vec::new(), Vec::new());
    for (b, got) in read_blocks(rig).iter().enumerate() {
        let (want, was) = (&data[b * 4096..(b + 1) * 4096], &old[b * 4096..(b + 1) * 4096]);
        if !written.contains(&b) {
            assert!(
                got.as_ref().is_ok_and(|bytes| bytes == want),
                "block {b}: {:?}",
                got.as_ref().err()
            );
            continue;
        }
        match got {
            Ok(bytes) if bytes == want && want != was => new.push(b),
            Ok(bytes) if bytes == was => {}
            Ok(bytes) => {
                for s in 0..8 {
                    let r = s * 512..(s + 1) * 512;
                    assert!(
                        bytes[r.clone()] == want[r.clone()] || bytes[r.clone()] == was[r],
                        "block {b}, sector {s}: neither old nor new"
                    );
                }
                torn.push(b);
            }
            Err(e) => {
                assert!(e.contains("checksum"), "block {b}: {e}");
                refused.push(b);
            }
        }
    }
    (new, refused, torn)
}

/// A mirror whose copies an I/O error took out one after the other: disk 0 first, then,
/// after writes went around it and a flush vouched for them on disk 1 alone, disk 1 (its
/// cache lost). The set is beyond its tolerance; before, the copy on disk 1 came back stale
/// with nothing to resync it from, and the slab (1 MiB here, 256 MiB by default) stayed
/// unreadable for good. Now the copy on disk 1 is taken back as its disk holds it: no other
/// copy could hold what a flush vouched for (disk 0's missed writes since it went out), so
/// none of what disk 1's cache lost was promised durable. Disk 0, back, is resynced from it.
#[test]
fn a_mirror_whose_copies_an_error_took_out_in_turn_takes_back_the_last_as_its_disk_holds_it() {
    let (mut rig, mut data, supplies, media) = mirror_with_caches_on_both();
    // Set 0 written, not flushed; then disk 0 out, on a write to set 1.
    write_at(&rig, &mut data, 2, 0, 8192);
    rig.disks[0].faults().pull();
    supplies[0].cut(3);
    write_at(&rig, &mut data, 3, MIB, 4096);
    assert_eq!(state(&rig, 0), DiskState::Failed);
    // Set 2 written around it, and flushed: on disk 1 alone, promised durable.
    write_at(&rig, &mut data, 4, 2 * MIB, 4096);
    rig.engine().vdisk("v").unwrap().flush().unwrap();
    // Set 3 written around it, not flushed; then disk 1 out too, its cache lost.
    let blocks_written: Vec<usize> = vec![768, 772, 776];
    for (k, b) in blocks_written.iter().enumerate() {
        write_at(&rig, &mut data, 5 + k as u64, *b as u64 * 4096, 4096);
    }
    let old = {
        let mut o = data.clone();
        let before = pattern(1, 0, SIZE as usize);
        for b in &blocks_written {
            o[b * 4096..(b + 1) * 4096].copy_from_slice(&before[b * 4096..(b + 1) * 4096]);
        }
        o
    };
    rig.disks[1].faults().pull();
    let cut = supplies[1].cut(SEED);
    assert_eq!((cut[0].kept, cut[0].torn, cut[0].dropped), (1, 1, 1), "{cut:?}");
    let v = rig.engine().vdisk("v").unwrap();
    assert!(v.write(3 * MIB + 64 * 1024, &pattern(9, 0, 4096), false).is_err());
    let mut b = vec![0u8; 4096];
    assert!(v.read(3 * MIB, &mut b).is_err(), "beyond its tolerance");
    drop(v);
    assert_eq!(state(&rig, 1), DiskState::Failed);

    // Disk 1 back first: taken as its disk holds it where disk 0 missed writes.
    let back1 = powered_again(&media[1]);
    rig.engine().bring_back_disk("mem1", back1.clone() as DiskRef).unwrap();
    rig.disks[1] = back1;
    assert_eq!(state(&rig, 1), DiskState::Healthy);
    let err = rig.engine().vdisk("v").unwrap().flush().unwrap_err().to_string();
    assert!(err.contains("may be lost"), "{err}");
    let (new, refused, torn) = sort_blocks(&rig, &data, &old, &blocks_written);
    assert_eq!(new.len(), 1, "the write disk 1's cache kept: {new:?}");
    assert_eq!(refused.len(), 2, "the one it dropped and the one it tore: {refused:?}");
    assert!(torn.is_empty(), "{torn:?}");

    // Disk 0 back: stale where it missed writes or may lack them, and resynced from disk 1.
    rig.disks[0].faults().reinsert();
    let back0 = powered_again(&media[0]);
    rig.engine().bring_back_disk("mem0", back0.clone() as DiskRef).unwrap();
    rig.disks[0] = back0;
    assert_eq!(rig.engine().layouts().stale_members(), 4, "every set's copy on disk 0");
    // Resynced as disk 1 holds it: the blocks its cache lost are copied and stay refused.
    assert_eq!(rig.repair(), 4);
    rig.engine().fail_disk("mem1").unwrap();
    let (new, refused, torn) = sort_blocks(&rig, &data, &old, &blocks_written);
    assert_eq!((new.len(), refused.len(), torn.len()), (1, 2, 0), "disk 0 alone");
    // Written again, disk 0 alone reads everything.
    for b in &blocks_written {
        write_at(&rig, &mut data, 40 + *b as u64, *b as u64 * 4096, 4096);
    }
    rig.engine().vdisk("v").unwrap().flush().unwrap();
    assert_eq!(read_all(&rig), data);
    rig.reopen();
    assert_eq!(read_all(&rig), data);
    rig.assert_consistent();
}

/// Both copies of a mirror taken out by the same blink (an enclosure's power): both may lack
/// what was written since the last flush, and no flush vouched for it. Taken back with
/// `disk online`, the first copy back is taken as its disk holds it and the other is
/// resynced from it; if one never comes back (`disk fail`), the other is taken as its disk
/// holds it. Before, those slabs waited for a copy that could not hold more, and stayed
/// unreadable for good when it was given up.
///
/// With `refused_first`, disk 0's first `disk online` names the wrong disk (disk 1's), which
/// is refused before anything is recorded; the second names the right one, whose label
/// cannot be written, and is refused after its stale slabs were judged: they are stale again,
/// as before the attempt. Before, they stayed taken as held, current copies on a disk still
/// away, so that once disk 0 was given up, disk 1's copies waited for them for good,
/// unreadable.
fn a_mirror_blinked_whole_comes_back(give_up_disk_0: bool, restart: bool, refused_first: bool) {
    let (mut rig, mut data, supplies, media) = mirror_with_caches_on_both();
    let old = data.clone();
    let blocks_written: Vec<usize> = vec![4, 12, 20];
    for (k, b) in blocks_written.iter().enumerate() {
        write_at(&rig, &mut data, 2 + k as u64, *b as u64 * 4096, 4096);
    }
    for (i, supply) in supplies.iter().enumerate() {
        rig.disks[i].faults().pull();
        supply.cut(SEED);
    }
    let v = rig.engine().vdisk("v").unwrap();
    assert!(v.write(MIB, &pattern(9, 0, 4096), false).is_err());
    drop(v);
    assert_eq!((state(&rig, 0), state(&rig, 1)), (DiskState::Failed, DiskState::Failed));
    if restart {
        // Which copy comes back as its disk holds it is not decided by the import, while
        // both are away, but by the order they come back in (or disk 0 given up first).
        rig.engine = None;
        rig.disks = media.iter().map(powered_again).collect();
        rig.reopen();
        assert_eq!((state(&rig, 0), state(&rig, 1)), (DiskState::Failed, DiskState::Failed));
    }
    let back1 = powered_again(&media[1]);
    if refused_first {
        let err = rig
            .engine()
            .bring_back_disk("mem0", powered_again(&media[1]) as DiskRef)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a different disk"), "{err}");
        // Then the right one, whose label cannot be written: refused after its stale slabs
        // were judged, which are stale again.
        let stale = recorded_stale_slabs(rig.engine().pool(), 0);
        assert!(!stale.is_empty());
        let stuck = LabelWatch::new(powered_again(&media[0]), rig.engine().pool().clone());
        stuck.disk.faults().fail_range(0, 4096, tessera_disk::FaultOp::Write);
        rig.engine()
            .bring_back_disk("mem0", stuck.clone() as DiskRef)
            .unwrap_err();
        assert_eq!((state(&rig, 0), state(&rig, 1)), (DiskState::Failed, DiskState::Failed));
        // A crash at any instant of the attempt finds them on the disk's list: when its
        // label was to be written, and after. Before, the list was cleared before the label
        // was written and saved again after the refusal, so that a crash in between left
        // the copies on disk 0 current with the disk away, and disk 1's waiting for them.
        assert_eq!(
            stuck.seen.lock().unwrap().as_ref(),
            Some(&stale),
            "when the label was to be written"
        );
        assert_eq!(recorded_stale_slabs(rig.engine().pool(), 0), stale, "after the refusal");
    }
    if give_up_disk_0 {
        rig.engine().fail_disk("mem0").unwrap();
        rig.engine().bring_back_disk("mem1", back1.clone() as DiskRef).unwrap();
        rig.disks[1] = back1;
    } else {
        let back0 = powered_again(&media[0]);
        rig.engine().bring_back_disk("mem0", back0.clone() as DiskRef).unwrap();
        rig.disks[0] = back0;
        rig.engine().bring_back_disk("mem1", back1.clone() as DiskRef).unwrap();
        rig.disks[1] = back1;
        // After a restart, the regions the crash left unsynced are settled from disk 0 too,
        // around disk 1.
        let stale = rig.engine().layouts().stale_members();
        assert!(stale == 2 || restart && stale == 4, "sets 0 and 1 on disk 1: {stale}");
    }
    if !restart {
        let err = rig.engine().vdisk("v").unwrap().flush().unwrap_err().to_string();
        assert!(err.contains("may be lost"), "{err}");
    }
    let sorted = sort_blocks(&rig, &data, &old, &blocks_written);
    let (new, refused, torn) = &sorted;
    assert_eq!(new.len(), 1, "the write the disk's cache kept: {new:?}");
    if restart {
        // The crash's replay settled them as the disk holds them, sector by sector.
        assert!(refused.is_empty() && torn.len() <= 1, "{refused:?} {torn:?}");
    } else {
        assert_eq!((refused.len(), torn.len()), (2, 0), "{refused:?} {torn:?}");
    }
    if !give_up_disk_0 {
        // The copy resynced from the one taken as held refuses what it refuses.
        let stale = rig.engine().layouts().stale_members();
        assert_eq!(rig.repair(), stale);
        assert_eq!(sort_blocks(&rig, &data, &old, &blocks_written), sorted);
    }
    for b in &blocks_written {
        write_at(&rig, &mut data, 40 + *b as u64, *b as u64 * 4096, 4096);
    }
    rig.engine().vdisk("v").unwrap().flush().unwrap();
    if !give_up_disk_0 {
        // Whole again, a later error of disk 0 (its copies taken as held above) is an
        // ordinary loss, which disk 1 covers: the writer's flush succeeds.
        rig.disks[0].faults().pull();
        write_at(&rig, &mut data, 60, 0, 4096);
        assert_eq!(state(&rig, 0), DiskState::Failed);
        rig.engine().vdisk("v").unwrap().flush().unwrap();
        rig.engine().fail_disk("mem0").unwrap();
    }
    assert_eq!(read_all(&rig), data);
    rig.reopen();
    assert_eq!(read_all(&rig), data);
    rig.assert_consistent();
}

/// The slabs an I/O error may have left stale on disk `position`, as the pool's records (not
/// its memory) say.
fn recorded_stale_slabs(pool: &tessera_pool::Pool, position: usize) -> Vec<u32> {
    let config = tessera_pool::Pool::recorded_config(pool.meta()).unwrap();
    config.disks[position].stale_slabs.clone()
}

/// A disk that notes, when its label is written, what the pool's records then say of the
/// stale slabs of disk 0 (the disk it stands for), as a crash at that instant would find them.
struct LabelWatch {
    disk: Arc<FaultyDisk>,
    pool: Arc<tessera_pool::Pool>,
    seen: std::sync::Mutex<Option<Vec<u32>>>,
}

impl LabelWatch {
    fn new(disk: Arc<FaultyDisk>, pool: Arc<tessera_pool::Pool>) -> Arc<LabelWatch> {
        Arc::new(LabelWatch {
            disk,
            pool,
            seen: std::sync::Mutex::new(None),
        })
    }
}

impl BlockDevice for LabelWatch {
    fn path(&self) -> &str {
        self.disk.path()
    }

    fn size(&self) -> u64 {
        self.disk.size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), tessera_disk::DiskError> {
        self.disk.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), tessera_disk::DiskError> {
        if offset < 4096 {
            *self.seen.lock().unwrap() = Some(recorded_stale_slabs(&self.pool, 0));
        }
        self.disk.write_at(buf, offset)
    }

    fn flush(&self) -> Result<(), tessera_disk::DiskError> {
        self.disk.flush()
    }
}

#[test]
fn a_mirror_blinked_whole_takes_back_the_first_copy_back_as_its_disk_holds_it() {
    a_mirror_blinked_whole_comes_back(false, false, false);
}

#[test]
fn a_mirror_blinked_whole_with_one_copy_given_up_takes_back_the_other_as_its_disk_holds_it() {
    a_mirror_blinked_whole_comes_back(true, false, false);
}

#[test]
fn a_mirror_blinked_whole_takes_back_the_first_copy_back_as_its_disk_holds_it_after_a_restart() {
    a_mirror_blinked_whole_comes_back(false, true, false);
}

#[test]
fn a_mirror_blinked_whole_with_one_copy_given_up_takes_back_the_other_after_a_restart() {
    a_mirror_blinked_whole_comes_back(true, true, false);
}

#[test]
fn a_mirror_blinked_whole_takes_back_the_first_copy_back_after_the_wrong_disk_and_a_failed_label_write() {
    a_mirror_blinked_whole_comes_back(false, false, true);
}

#[test]
fn a_mirror_blinked_whole_with_one_copy_refused_then_given_up_takes_back_the_other_as_its_disk_holds_it() {
    a_mirror_blinked_whole_comes_back(true, false, true);
}

/// An import that opens none of the pool's disks fails, naming why (a wrong path, an
/// enclosure still off: an import tried later finds them), unless a disk is one an I/O error
/// took out, which no import opens: the pool then opens without a disk, so that `disk online`
/// can take its disks back. Before, such a pool could never be imported again.
#[test]
fn a_pool_whose_every_disk_an_error_took_out_opens_for_disk_online() {
    let (mut rig, data) = mirrored_pair();
    stop(&mut rig);
    let away = std::mem::take(&mut rig.disks);
    let err = tessera_volume::Engine::open(&rig.dir.path().join("pool"), &rig.opener())
        .err()
        .expect("no disk to open")
        .to_string();
    assert!(err.contains("none of the disks") && err.contains("mem0"), "{err}");
    rig.disks = away;
    rig.reopen();
    for d in &rig.disks {
        d.faults().pull();
    }
    let v = rig.engine().vdisk("v").unwrap();
    assert!(v.write(0, &pattern(9, 0, 4096), false).is_err());
    assert!(v.write(MIB, &pattern(9, 0, 4096), false).is_err());
    drop(v);
    assert_eq!((state(&rig, 0), state(&rig, 1)), (DiskState::Failed, DiskState::Failed));
    rig.reopen();
    assert_eq!((state(&rig, 0), state(&rig, 1)), (DiskState::Failed, DiskState::Failed));
    for (i, d) in rig.disks.clone().iter().enumerate() {
        d.faults().reinsert();
        rig.engine()
            .bring_back_disk(&format!("mem{i}"), d.clone() as DiskRef)
            .unwrap();
    }
    let stale = rig.engine().layouts().stale_members();
    assert_eq!(rig.repair(), stale);
    assert_eq!(read_all(&rig), data);
    rig.reopen();
    assert_eq!(read_all(&rig), data);
    rig.assert_consistent();
}

/// A copy that an error took out is not taken as its disk holds it when another copy, stale
/// too, flushed after it went: that flush may have vouched for what the first copy's cache
/// lost. Here disk 0 loses writes with its cache and goes out; the vdisk's flush makes them
/// durable on disk 1 alone. After a restart, disk 1 fails its first flush (so that nothing
/// of it is known flushed in this run: every slab of it is stale). Back first, disk 0 must
/// not be taken as its disk holds it (it lacks what the flush vouched for); disk 1, back
/// second, is, and disk 0 is resynced from it. Taken the other way, the vouched writes
/// would read as a checksum error, or as the old data without checksums.
#[test]
fn a_mirror_copy_is_not_taken_as_held_when_another_flushed_after_it_went() {
    let (mut rig, mut data, supplies, media) = mirror_with_caches_on_both();
    let blocks_written: Vec<usize> = vec![4, 12, 20];
    for (k, b) in blocks_written.iter().enumerate() {
        write_at(&rig, &mut data, 2 + k as u64, *b as u64 * 4096, 4096);
    }
    rig.disks[0].faults().pull();
    let cut = supplies[0].cut(SEED);
    assert_eq!((cut[0].kept, cut[0].torn, cut[0].dropped), (1, 1, 1), "{cut:?}");
    write_at(&rig, &mut data, 9, MIB, 4096);
    assert_eq!(state(&rig, 0), DiskState::Failed);
    // Durable on disk 1 alone.
    rig.engine().vdisk("v").unwrap().flush().unwrap();

    // A restart whose first flush of disk 1 fails (its label's goes through): the import
    // cannot open the pool without disk 1's copies, and one more finds both disks away.
    rig.engine = None;
    rig.disks[1].faults().fail_flushes_after(1);
    let err = tessera_volume::Engine::open(&rig.dir.path().join("pool"), &rig.opener())
        .err()
        .map(|e| e.to_string());
    assert!(err.is_some(), "the pool opened without a copy of its data");
    rig.reopen();
    assert_eq!((state(&rig, 0), state(&rig, 1)), (DiskState::Failed, DiskState::Failed));
    assert_eq!(
        rig.engine().pool().disks()[1].info.stale_slabs.len(),
        rig.engine().pool().disks()[1].info.slabs as usize,
        "nothing of disk 1 flushed in this run"
    );

    // Disk 0 back first: it lacks what disk 1's flush vouched for.
    let back0 = powered_again(&media[0]);
    rig.engine().bring_back_disk("mem0", back0.clone() as DiskRef).unwrap();
    rig.disks[0] = back0;
    let mut b = vec![0u8; 4096];
    assert!(
        rig.engine().vdisk("v").unwrap().read(0, &mut b).is_err(),
        "set 0 read from disk 0 alone"
    );
    // Disk 1 back: taken as its disk holds it, and disk 0 resynced from it.
    let back1 = powered_again(&media[1]);
    rig.engine().bring_back_disk("mem1", back1.clone() as DiskRef).unwrap();
    rig.disks[1] = back1;
    assert_eq!(read_all(&rig), data);
    let stale = rig.engine().layouts().stale_members();
    assert_eq!(rig.repair(), stale);
    rig.engine().fail_disk("mem1").unwrap();
    assert_eq!(read_all(&rig), data, "disk 0 alone, resynced");
    rig.reopen();
    assert_eq!(read_all(&rig), data);
    rig.assert_consistent();
}

/// A writer's flush fails for writes a mirror copy taken as its disk held it may have lost
/// with its disk's cache, whatever became of that copy before the flush: here the other copy
/// is resynced from it, and then its disk goes out again, which the set tolerates. Writes
/// made after it was taken back are vouched for as usual.
#[test]
fn a_flush_fails_for_what_a_copy_taken_as_held_may_have_lost_whatever_became_of_it() {
    let (mut rig, mut data, supplies, media) = mirror_with_caches_on_both();
    for (k, b) in [4u64, 12, 20].iter().enumerate() {
        write_at(&rig, &mut data, 2 + k as u64, b * 4096, 4096);
    }
    for (i, supply) in supplies.iter().enumerate() {
        rig.disks[i].faults().pull();
        supply.cut(SEED);
    }
    assert!(rig
        .engine()
        .vdisk("v")
        .unwrap()
        .write(MIB, &pattern(9, 0, 4096), false)
        .is_err());
    for i in 0..2 {
        let back = powered_again(&media[i]);
        rig.engine()
            .bring_back_disk(&format!("mem{i}"), back.clone() as DiskRef)
            .unwrap();
        rig.disks[i] = back;
    }
    let stale = rig.engine().layouts().stale_members();
    assert_eq!(rig.repair(), stale);
    // Disk 0, whose copies were taken as held, out again; disk 1 holds everything it held.
    rig.disks[0].faults().pull();
    write_at(&rig, &mut data, 30, 2 * MIB, 4096);
    assert_eq!(state(&rig, 0), DiskState::Failed);
    let v = rig.engine().vdisk("v").unwrap();
    let err = v.flush().unwrap_err().to_string();
    assert!(err.contains("may be lost"), "{err}");
    // Told once; later writes are vouched for.
    v.flush().unwrap();
    v.write(3 * MIB, &pattern(31, 0, 4096), false).unwrap();
    v.flush().unwrap();
}

/// ... but not while a write-back cache disk is among the disks not opened: the pool would
/// go on without the log it holds, which cannot come back to it. The import fails, and
/// succeeds once the cache disk answers, the log whole.
#[test]
fn a_pool_without_a_disk_open_does_not_open_without_its_cache_disk() {
    let mut rig = Rig::with_cache(2, 32 * MIB, MIB, 1);
    rig.engine()
        .cache()
        .set_destage_delay(std::time::Duration::from_secs(3600));
    let (rig0, mut data) = with_mirror_written(rig);
    rig = rig0;
    // In the log only.
    write_at(&rig, &mut data, 5, 0, 64 << 10);
    rig.engine().vdisk("v").unwrap().flush().unwrap();
    for i in 0..2 {
        rig.disks[i].faults().pull();
    }
    // A destage meets the errors: both data disks out, the write kept in the log.
    let _ = rig.engine().cache().drain();
    assert_eq!((state(&rig, 0), state(&rig, 1)), (DiskState::Failed, DiskState::Failed));
    rig.engine = None;
    let cache = rig.disks.remove(2);
    let err = tessera_volume::Engine::open(&rig.dir.path().join("pool"), &rig.opener())
        .err()
        .expect("opened without its log")
        .to_string();
    assert!(err.contains("cache0") && err.contains("--without-log"), "{err}");
    rig.disks.push(cache);
    rig.reopen();
    let status = rig.engine().cache_status();
    assert_eq!(status.lost_bytes, 0, "{status:?}");
    for i in 0..2 {
        rig.disks[i].faults().reinsert();
        rig.engine()
            .bring_back_disk(&format!("mem{i}"), rig.disks[i].clone() as DiskRef)
            .unwrap();
    }
    assert_eq!(rig.engine().cache_status().parked_bytes, 0);
    assert_eq!(read_all(&rig), data);
    rig.reopen();
    assert_eq!(read_all(&rig), data);
}

/// A repair that moves a mirror copy off a retired disk reads, block by block where a chunk
/// does not read whole, the copy it moves first: a block the other copy holds rotten is taken
/// right from it, not copied rotten (nor is the move stopped by it).
#[test]
fn moving_a_copy_off_a_retired_disk_keeps_what_only_it_holds_right() {
    let (rig, data) = with_mirror_written(Rig::new(3, 32 * MIB, MIB));
    let set = rig.engine().layouts().sets()[0].clone();
    let (a, b) = (set.desc().members[0], set.desc().members[1]);
    const BLOCK: u64 = 4096;
    // The copy to move cannot read one block, the other holds its neighbour rotten: in
    // one chunk of the copy.
    let at_a = rig.engine().pool().slab_offset(a);
    rig.disks[a.disk as usize]
        .faults()
        .fail_range(at_a, BLOCK, tessera_disk::FaultOp::Read);
    let at_b = rig.engine().pool().slab_offset(b) + BLOCK;
    rig.disks[b.disk as usize].faults().flip_bit(at_b + 10, 3).unwrap();
    let path = rig.disks[a.disk as usize].path().to_string();
    rig.engine().retire_disk(&path).unwrap();
    rig.repair();
    assert!(
        !rig.engine().layouts().sets()[0].desc().members.contains(&a),
        "moved off"
    );
    assert_eq!(read_all(&rig), data);
    rig.assert_consistent();
}
