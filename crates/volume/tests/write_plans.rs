//! Write plans (`Vdisk::try_plan_write`): the disk writes a caller starts itself must leave
//! the vdisk as `Vdisk::write` does; only a write that is nothing but its disk writes is
//! planned (an overwrite in place of grains this vdisk alone holds, on a layout with one copy
//! and no checksums, on disks that write in the background); and the plan holds off other
//! writers and readers of its grains until it is dropped, without ever blocking its caller.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pattern, MIB};
use tessera_disk::{AsyncWriter, BlockDevice, DiskError, DiskRef, FaultyDisk, MemDisk, ReadDone};
use tessera_volume::{Engine, LayoutKind, Vdisk, VdiskSpec};

const GRAIN: u64 = 64 << 10;

/// A disk in memory that also takes writes started in the background (done at once here:
/// what the plans are tested for is where they write, not when).
struct Background(Arc<MemDisk>);

impl BlockDevice for Background {
    fn path(&self) -> &str {
        self.0.path()
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DiskError> {
        self.0.flush()
    }
    fn write_via(&self) -> Option<Arc<dyn AsyncWriter>> {
        Some(Arc::new(Writer(self.0.clone())))
    }
}

struct Writer(Arc<MemDisk>);

impl AsyncWriter for Writer {
    unsafe fn start_write(&self, at: *const u8, len: u32, offset: u64, done: ReadDone) {
        // SAFETY: the caller keeps the bytes valid until `done` is completed.
        let data = unsafe { std::slice::from_raw_parts(at, len as usize) };
        done.complete(self.0.write_at(data, offset).is_ok());
    }
}

fn engine(dir: &tempfile::TempDir, background: bool, checksums: bool) -> Engine {
    let mem = Arc::new(MemDisk::new("m", 128 * MIB));
    let disk: DiskRef = if background { Arc::new(Background(mem)) } else { mem };
    Engine::create_pool_with_checksums(&dir.path().join("pool"), "p", vec![disk], 4 * MIB, checksums).unwrap()
}

/// A 16 MiB simple vdisk whose first eight grains are written.
fn written_vdisk(e: &Engine, name: &str) -> Arc<Vdisk> {
    let v = e
        .create_vdisk(&VdiskSpec::new(name, 16 * MIB, LayoutKind::Simple))
        .unwrap();
    v.write(0, &pattern(1, 0, 8 * GRAIN as usize), false).unwrap();
    v
}

/// Does what a ring would: every planned write from `data`, then finishes the plan.
fn run_plan(v: &Arc<Vdisk>, offset: u64, data: &[u8]) -> Option<usize> {
    let plan = v.try_plan_write(offset, data.len())?;
    let n = plan.writes.len();
    complete(plan, data);
    Some(n)
}

/// Writes a plan's disk writes from `data`, the bytes it was planned for, and finishes it.
fn complete(plan: tessera_volume::WritePlan, data: &[u8]) {
    for w in &plan.writes {
        let d = &w.write;
        w.disk.write_at(&data[d.buf_off..d.buf_off + d.len], d.offset).unwrap();
    }
    plan.finish();
}

#[test]
fn a_plan_writes_what_a_write_writes() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir, true, false);
    let v = written_vdisk(&e, "v");
    // Across four neighbouring grains: one disk write.
    let data = pattern(2, 0, 3 * GRAIN as usize);
    assert_eq!(
        run_plan(&v, GRAIN / 2, &data),
        Some(1),
        "neighbouring grains went apart"
    );
    let small = pattern(3, 0, 4096);
    assert_eq!(run_plan(&v, 7 * GRAIN + 8192, &small), Some(1));
    let mut want = pattern(1, 0, 8 * GRAIN as usize);
    want[(GRAIN / 2) as usize..(GRAIN / 2) as usize + data.len()].copy_from_slice(&data);
    want[(7 * GRAIN + 8192) as usize..(7 * GRAIN + 8192) as usize + 4096].copy_from_slice(&small);
    let mut back = vec![0u8; want.len()];
    v.read(0, &mut back).unwrap();
    assert!(back == want, "the vdisk reads other than what the plans wrote");
    v.flush().unwrap();
    assert_eq!(v.allocated_bytes(), 8 * GRAIN, "an overwrite in place took space");
}

#[test]
fn writes_that_cannot_be_planned_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir, true, false);
    let v = written_vdisk(&e, "v");
    assert!(v.try_plan_write(0, 4096).is_some(), "a plain overwrite was not planned");
    assert!(
        v.try_plan_write(8 * GRAIN, 4096).is_none(),
        "an unmapped grain needs a slot"
    );
    assert!(
        v.try_plan_write(7 * GRAIN, 2 * 4096 + GRAIN as usize).is_none(),
        "the second grain is unmapped"
    );
    assert!(v.try_plan_write(100, 4096).is_none(), "not a whole block");
    assert!(v.try_plan_write(16 * MIB - 4096, 8192).is_none(), "past the end");
    // Shared with a snapshot: the write must copy the grain first. The snapshot itself
    // takes no writes.
    let snap = e.snapshot("v", "s").unwrap();
    assert!(
        v.try_plan_write(0, 4096).is_none(),
        "a grain shared with a snapshot was planned"
    );
    assert!(snap.try_plan_write(0, 4096).is_none(), "a snapshot was planned a write");
    // A pool with checksums records them with every write; a disk that writes only on its
    // own calls takes no started writes.
    for (background, checksums) in [(true, true), (false, false)] {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(&dir, background, checksums);
        let v = written_vdisk(&e, "w");
        assert!(
            v.try_plan_write(0, 4096).is_none(),
            "planned with background writes {background}, checksums {checksums}"
        );
    }
}

/// Data the write-back log held when it lost its only disk reads as an error until written
/// again (crates/volume/tests/write_cache.rs). A planned write goes past the cache, which
/// would not learn that the data is there again: a write over lost data is never planned.
#[test]
fn a_write_over_data_lost_with_the_write_back_log_is_not_planned() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir, true, false);
    let v = written_vdisk(&e, "v");
    let cache = FaultyDisk::new(Arc::new(MemDisk::new("cache", 66 * MIB)) as DiskRef);
    e.add_cache_disk(cache.clone() as DiskRef).unwrap();
    // A log of one copy is otherwise destaged at once, before the disk is pulled or not.
    e.cache().hold_destage(true);
    v.write(GRAIN, &pattern(2, GRAIN, 4096), true).unwrap();
    cache.faults().pull();
    assert!(e.flush().is_err(), "the log's only disk is gone");
    assert!(
        v.try_plan_write(0, 4096).is_some(),
        "where nothing was lost, writes are planned"
    );
    assert!(v.try_plan_write(GRAIN, 4096).is_none(), "a plan over lost data");
    assert!(
        v.try_plan_write(GRAIN - 4096, 8192).is_none(),
        "a plan that reaches lost data"
    );
    // Written again the ordinary way: planned again.
    v.write(GRAIN, &pattern(3, GRAIN, 4096), false).unwrap();
    assert!(
        v.try_plan_write(GRAIN, 4096).is_some(),
        "written again, and still not planned"
    );
}

#[test]
fn a_plan_holds_off_writers_and_readers_of_its_grains() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir, true, false);
    let v = written_vdisk(&e, "v");
    let plan = v.try_plan_write(0, 4096).unwrap();
    // Never waits: a second plan of the grain is refused while the first holds it.
    assert!(v.try_plan_write(0, 4096).is_none());
    assert!(
        v.try_plan_read(0, 4096).is_none(),
        "a read was planned under a write in flight"
    );
    assert!(v.try_plan_write(GRAIN, 4096).is_some(), "another grain was held");
    let written = Arc::new(AtomicBool::new(false));
    let writer = {
        let (v, written) = (v.clone(), written.clone());
        std::thread::spawn(move || {
            v.write(0, &pattern(5, 0, 4096), false).unwrap();
            written.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !written.load(Ordering::SeqCst),
        "a write went ahead of a planned one in flight"
    );
    let planned = pattern(4, 0, 4096);
    complete(plan, &planned);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !written.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the write never followed the plan");
        std::thread::sleep(Duration::from_millis(5));
    }
    writer.join().unwrap();
    let mut back = vec![0u8; 4096];
    v.read(0, &mut back).unwrap();
    assert_eq!(back, pattern(5, 0, 4096), "the later write did not win");
    // A vdisk being deleted waits for the plan, and a deleted one plans nothing.
    let plan = v.try_plan_write(GRAIN, 4096).unwrap();
    drop(plan);
    e.delete_vdisk("v").unwrap();
    assert!(v.try_plan_write(GRAIN, 4096).is_none());
}

/// A rebuild that moves a set's slab while a planned write to it is in flight copies the slab
/// only once that write is done: the write lands in the copy, not only in the slab left
/// behind.
#[test]
fn a_rebuild_waits_for_the_planned_writes_in_flight_before_it_copies() {
    let dir = tempfile::tempdir().unwrap();
    let disks: Vec<DiskRef> = (0..2)
        .map(|i| Arc::new(Background(Arc::new(MemDisk::new(&format!("m{i}"), 64 * MIB)))) as DiskRef)
        .collect();
    let e = Engine::create_pool_with_checksums(&dir.path().join("pool"), "p", disks, 4 * MIB, false).unwrap();
    let v = written_vdisk(&e, "v");
    // A disk for the slab to move to (the set spans the first two).
    e.pool()
        .add_disk(Arc::new(Background(Arc::new(MemDisk::new("m2", 64 * MIB)))))
        .unwrap();
    let plan = v.try_plan_write(0, 4096).unwrap();
    let busiest = e.pool().disks().into_iter().max_by_key(|d| d.slabs_used).unwrap();
    e.retire_disk(&busiest.info.path).unwrap();
    let repaired = AtomicBool::new(false);
    let progress = tessera_volume::Progress::default();
    std::thread::scope(|s| {
        s.spawn(|| {
            let opts = tessera_volume::RebuildOptions {
                parallel: 1,
                rate_limit: None,
            };
            e.repair(&opts, &progress).unwrap();
            repaired.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !repaired.load(Ordering::SeqCst),
            "the rebuild went ahead of a planned write in flight"
        );
        assert_eq!(
            progress.done_bytes.load(Ordering::SeqCst),
            0,
            "the slab was copied under a write in flight"
        );
        let planned = pattern(9, 0, 4096);
        complete(plan, &planned);
    });
    assert!(repaired.load(Ordering::SeqCst));
    assert_eq!(e.pool().disks()[busiest.info.position as usize].slabs_used, 0);
    let mut back = vec![0u8; 4096];
    v.read(0, &mut back).unwrap();
    assert_eq!(
        back,
        pattern(9, 0, 4096),
        "the planned write was left behind on the retired disk"
    );
}
