//! Read plans (`Vdisk::try_plan_read`): the disk reads a caller submits to its own ring must
//! fill a buffer exactly as `Vdisk::read` does, and the plan must hold off writers until it
//! is dropped, without ever blocking its caller.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pattern, MIB};
use tessera_disk::{DiskRef, FileDisk, MemDisk};
use tessera_volume::{Engine, LayoutKind, Vdisk, VdiskSpec};

const GRAIN: u64 = 64 << 10;

fn file_engine(dir: &tempfile::TempDir, disks: usize) -> Engine {
    let refs: Vec<DiskRef> = (0..disks)
        .map(|i| {
            let path = dir.path().join(format!("d{i}.img"));
            Arc::new(FileDisk::create_file(&path, 128 * MIB, false).unwrap()) as DiskRef
        })
        .collect();
    Engine::create_pool(&dir.path().join("pool"), "p", refs, 4 * MIB).unwrap()
}

/// A file engine with dedup on for every vdisk, with no minimum age.
fn dedup_engine(dir: &tempfile::TempDir) -> Engine {
    let e = file_engine(dir, 2);
    e.set_dedup_settings(tessera_volume::DedupSettings {
        enabled: true,
        min_age_secs: 0,
        ..Default::default()
    })
    .unwrap();
    e
}

/// A 16 MiB simple vdisk whose first grain is written.
fn one_grain_vdisk(e: &Engine) -> Arc<Vdisk> {
    let v = e
        .create_vdisk(&VdiskSpec::new("v", 16 * MIB, LayoutKind::Simple))
        .unwrap();
    v.write(0, &pattern(1, 0, GRAIN as usize), false).unwrap();
    v
}

/// Fills a buffer the way a ring would: every planned read from its disk, zeros where the
/// plan says so; poisoned first, so that a byte the plan forgets shows.
fn run_plan(v: &Vdisk, offset: u64, len: usize) -> Option<Vec<u8>> {
    let mut plan = v.try_plan_read(offset, len)?;
    let mut buf = tessera_disk::AlignedBuf::zeroed(len);
    buf.fill(0xee);
    let scratch = plan.scratch_ptr();
    for r in &plan.reads {
        assert!(matches!(r.via, tessera_disk::ReadVia::Uring(fd) if r.disk.uring_fd() == Some(fd)));
        let into = if r.scratch {
            // SAFETY: the plan made its scratch buffer for this read, and lives.
            unsafe { std::slice::from_raw_parts_mut(scratch.add(r.buf_off), r.len) }
        } else {
            &mut buf[r.buf_off..r.buf_off + r.len]
        };
        r.disk.read_at(into, r.offset).unwrap();
    }
    for z in &plan.zeros {
        buf[z.clone()].fill(0);
    }
    assert!(plan.finish(&mut buf), "the plan's reads did not check out");
    Some(buf.to_vec())
}

#[test]
fn a_plan_reads_what_a_read_reads() {
    let dir = tempfile::tempdir().unwrap();
    let e = file_engine(&dir, 2);
    for layout in [LayoutKind::Simple, LayoutKind::Mirror] {
        let v = e
            .create_vdisk(&VdiskSpec::new(&format!("v-{layout:?}"), 16 * MIB, layout))
            .unwrap();
        // Mapped grains with holes between them, and a grain written only in part.
        v.write(0, &pattern(1, 0, 3 * GRAIN as usize), false).unwrap();
        v.write(5 * GRAIN, &pattern(2, 0, GRAIN as usize), false).unwrap();
        v.write(8 * GRAIN + 4096, &pattern(3, 0, 8192), false).unwrap();
        let total = 10 * GRAIN as usize;
        let mut want = vec![0u8; total];
        for (offset, len) in [
            (0, total),
            (4096, GRAIN as usize),
            (2 * GRAIN, 4 * GRAIN as usize),
            (3 * GRAIN, 2 * GRAIN as usize),
            (8 * GRAIN, 4096 * 3),
        ] {
            v.read(offset, &mut want[..len]).unwrap();
            let got = run_plan(&v, offset, len).expect("file disks, no writer: a plan");
            assert!(got == want[..len], "{layout:?}: {len} bytes at {offset}");
        }
        // Neighbouring grains on a disk are one read; a range of holes is no read at all.
        let plan = v.try_plan_read(0, 3 * GRAIN as usize).unwrap();
        assert_eq!(plan.reads.len(), 1, "{layout:?}: three neighbouring grains");
        assert_eq!(plan.reads[0].len, 3 * GRAIN as usize);
        let plan = v.try_plan_read(3 * GRAIN, 2 * GRAIN as usize).unwrap();
        assert!(plan.reads.is_empty());
        assert_eq!(plan.zeros, vec![0..2 * GRAIN as usize]);
    }
}

#[test]
fn reads_that_cannot_be_planned_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let e = file_engine(&dir, 1);
    let v = one_grain_vdisk(&e);
    assert!(v.try_plan_read(16 * MIB - 4096, 8192).is_none(), "beyond the end");
    assert!(v.try_plan_read(0, 0).is_none(), "empty");

    // A disk that is not a file takes no reads from a caller's ring.
    let mem_dir = tempfile::tempdir().unwrap();
    let disks = vec![Arc::new(MemDisk::new("m", 64 * MIB)) as DiskRef];
    let me = Engine::create_pool(&mem_dir.path().join("pool"), "m", disks, 4 * MIB).unwrap();
    let mv = one_grain_vdisk(&me);
    assert!(mv.try_plan_read(0, 4096).is_none());
    // Unmapped space needs no disk: it plans anyway.
    assert!(mv.try_plan_read(GRAIN, 4096).is_some());
}

#[test]
fn a_plan_holds_off_writers_and_gives_way_to_them() {
    let dir = tempfile::tempdir().unwrap();
    let e = file_engine(&dir, 1);
    let v = one_grain_vdisk(&e);
    let plan = v.try_plan_read(0, 4096).unwrap();
    let written = Arc::new(AtomicBool::new(false));
    let writer = {
        let (v, written) = (v.clone(), written.clone());
        std::thread::spawn(move || {
            v.write(0, &pattern(2, 0, 4096), false).unwrap();
            written.store(true, Ordering::SeqCst);
        })
    };
    // Once the writer waits for the grain, a new plan of it is refused rather than waited
    // for (the ring's thread must not block); other grains still plan.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match v.try_plan_read(0, 4096) {
            None => break,
            Some(p) => drop(p),
        }
        assert!(Instant::now() < deadline, "the writer never waited for the grain");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(v.try_plan_read(4 * GRAIN, 4096).is_some());
    assert!(
        !written.load(Ordering::SeqCst),
        "the write went ahead of a read in flight"
    );
    drop(plan);
    writer.join().unwrap();
    assert!(written.load(Ordering::SeqCst));
    assert_eq!(run_plan(&v, 0, 4096).unwrap(), pattern(2, 0, 4096));
}

/// A plan carries the checksums of the blocks it reads: bytes that rotted on the disk fail
/// `verify`, and the read the caller then falls back to returns the good copy and repairs it.
#[test]
fn a_plan_that_brings_rotten_bytes_fails_its_check() {
    let dir = tempfile::tempdir().unwrap();
    let e = file_engine(&dir, 2);
    let v = e
        .create_vdisk(&VdiskSpec::new("m", 16 * MIB, LayoutKind::Mirror))
        .unwrap();
    let data = pattern(9, 0, 2 * GRAIN as usize);
    v.write(0, &data, false).unwrap();
    // A first read brings the checksums into memory (a plan never waits to load them).
    let mut b = vec![0u8; data.len()];
    v.read(0, &mut b).unwrap();
    let plan = v.try_plan_read(0, data.len()).unwrap();
    let mut buf = tessera_disk::AlignedBuf::zeroed(data.len());
    for r in &plan.reads {
        r.disk
            .read_at(&mut buf[r.buf_off..r.buf_off + r.len], r.offset)
            .unwrap();
    }
    assert!(plan.finish(&mut buf), "good bytes must pass");
    // Rot on the copy the plan reads, behind the engine's back.
    let r = &plan.reads[0];
    let mut sector = tessera_disk::AlignedBuf::zeroed(4096);
    r.disk.read_at(&mut sector, r.offset + 8192).unwrap();
    sector[100] ^= 0x10;
    r.disk.write_at(&sector, r.offset + 8192).unwrap();
    let mut rotten = tessera_disk::AlignedBuf::zeroed(data.len());
    for r in &plan.reads {
        r.disk
            .read_at(&mut rotten[r.buf_off..r.buf_off + r.len], r.offset)
            .unwrap();
    }
    assert!(!plan.finish(&mut rotten), "rotten bytes passed the plan's check");
    drop(plan);
    v.read(0, &mut b).unwrap();
    assert!(b == data, "the read after a failed plan returned wrong data");
    assert!(e.layouts().stats.checksum_errors.load(Ordering::Relaxed) > 0);
    // Repaired in place: a new plan reads good bytes from the same copy.
    let plan = v.try_plan_read(0, data.len()).unwrap();
    let mut again = tessera_disk::AlignedBuf::zeroed(data.len());
    for r in &plan.reads {
        r.disk
            .read_at(&mut again[r.buf_off..r.buf_off + r.len], r.offset)
            .unwrap();
    }
    assert!(plan.finish(&mut again) && again[..] == data[..]);
}

#[test]
fn compressed_grains_are_planned_and_decompressed_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let e = dedup_engine(&dir);
    let v = e
        .create_vdisk(&VdiskSpec::new("c", 4 * MIB, LayoutKind::Mirror))
        .unwrap();
    assert_eq!(v.grain_size(), 4096);
    // Compressible halves, incompressible quarters, and a hole.
    let mut data = common::compressible(3, 0, (2 * MIB) as usize);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    data.extend((0..MIB / 8).flat_map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x.to_le_bytes()
    }));
    v.write(0, &data, false).unwrap();
    let r = e
        .dedup_run(
            &tessera_volume::PassOptions {
                mode: tessera_volume::DedupMode::Throughput,
                ignore_min_age: true,
                ..Default::default()
            },
            &tessera_volume::Progress::default(),
        )
        .unwrap();
    assert_eq!(r.grains_compressed, 2 * MIB / 4096, "{r:?}");
    let mut want = data.clone();
    want.resize((4 * MIB) as usize, 0);
    // A large read of compressed grains goes the ordinary way (decompressed by workers).
    assert!(v.try_plan_read(0, (4 * MIB) as usize).is_none());
    // Small reads that start and end on grains are planned, compressed grains or not.
    for (at, n) in [
        (4096u64, 4096usize),
        (MIB - 8192, 4 * 4096),
        (2 * MIB - 4096, 8192),
        (3 * MIB, 65536),
    ] {
        assert_eq!(
            run_plan(&v, at, n).unwrap(),
            want[at as usize..at as usize + n],
            "at {at}"
        );
    }
}

/// Compressed grains whose pieces run on from one pack slot into the next (laid end to end
/// on a mirror): a plan reads each and decompresses it, into the grain's place, or into its
/// scratch buffer where the piece's blocks take more room than the grain.
#[test]
fn plans_of_compressed_grains_read_what_a_read_reads() {
    let dir = tempfile::tempdir().unwrap();
    let e = dedup_engine(&dir);
    let g = 4096usize;
    let mut spec = VdiskSpec::new("c", 256 * g as u64, LayoutKind::Mirror);
    spec.block_size = Some(4096);
    spec.grain_size = Some(g as u64);
    let v = e.create_vdisk(&spec).unwrap();
    // Grains of random bytes then zeros: pieces of 2,600 to 3,500 bytes, at every offset, so
    // that some take more sectors than a grain.
    let data: Vec<u8> = (0..256)
        .flat_map(|i: usize| {
            let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut b: Vec<u8> = (0..g / 8)
                .flat_map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x.to_le_bytes()
                })
                .collect();
            b[2600 + (i * 97) % 900..].fill(0);
            b
        })
        .collect();
    v.write(0, &data, false).unwrap();
    let r = e
        .dedup_run(
            &tessera_volume::PassOptions {
                ignore_min_age: true,
                ..Default::default()
            },
            &tessera_volume::Progress::default(),
        )
        .unwrap();
    assert_eq!(r.grains_compressed, 256);
    let mut planned = 0;
    for i in 0..256 {
        let want = &data[i * g..(i + 1) * g];
        if let Some(got) = run_plan(&v, (i * g) as u64, g) {
            assert_eq!(&got[..], want, "grain {i}");
            planned += 1;
        }
    }
    assert_eq!(planned, 256, "every compressed grain plans");
    let mut back = vec![0u8; data.len()];
    v.read(0, &mut back).unwrap();
    assert_eq!(back, data);
}

/// A read planned straight to the disks must not find there the older data under writes the
/// write-back log kept for a disk missing at the import (parked): half of a vdisk striped over
/// two disks lies on the one that is there, and its checksums still match what it holds.
#[test]
fn no_read_is_planned_over_writes_parked_for_a_missing_disk() {
    let dir = tempfile::tempdir().unwrap();
    let e = file_engine(&dir, 2);
    for i in 0..2 {
        let path = dir.path().join(format!("cache{i}.img"));
        e.add_cache_disk(Arc::new(FileDisk::create_file(&path, 80 * MIB, false).unwrap()) as DiskRef)
            .unwrap();
    }
    let mut spec = VdiskSpec::new("w", 16 * MIB, LayoutKind::Simple);
    spec.columns = Some(2);
    let w = e.create_vdisk(&spec).unwrap();
    w.write(0, &pattern(1, 0, 2 * MIB as usize), false).unwrap();
    e.cache().drain().unwrap();
    assert!(
        run_plan(&w, 0, MIB as usize).is_some(),
        "reads of it are planned at all"
    );
    // In the log only when the pool stops.
    w.write(0, &pattern(2, 0, MIB as usize), false).unwrap();
    w.flush().unwrap();
    assert_eq!(e.cache_status().dirty_bytes, MIB);
    drop(w);
    drop(e);
    std::fs::rename(dir.path().join("d1.img"), dir.path().join("d1.away")).unwrap();
    let opener = |p: &str| -> Result<DiskRef, tessera_disk::DiskError> { Ok(Arc::new(FileDisk::open(p)?) as DiskRef) };
    let e = Engine::open(&dir.path().join("pool"), &opener).unwrap();
    assert_eq!(e.cache_status().parked_bytes, MIB);
    let w = e.vdisk("w").unwrap();
    // Reads of what is not parked, beside it, on the disk that is there, load the
    // checksums a plan needs.
    let mut buf = vec![0u8; GRAIN as usize];
    let read = (MIB..2 * MIB)
        .step_by(GRAIN as usize)
        .filter(|&at| w.read(at, &mut buf).is_ok())
        .count();
    assert!(read > 0, "nothing beside the parked data reads");
    for at in (0..MIB).step_by(GRAIN as usize) {
        assert!(
            w.try_plan_read(at, GRAIN as usize).is_none(),
            "a read of parked data at {at} was planned to the disks"
        );
    }
    // Beside it, on the disk that is there, reads are still planned.
    let planned = (MIB..2 * MIB)
        .step_by(GRAIN as usize)
        .filter(|&at| w.try_plan_read(at, GRAIN as usize).is_some())
        .count();
    assert_eq!(planned, read, "reads beside the parked data");
}
