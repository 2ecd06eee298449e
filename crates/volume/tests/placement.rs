//! Where grains land on the disks: a write of neighbouring grains takes neighbouring slots,
//! even while other writers allocate at the same time, so that reading the range back is a
//! run of neighbouring disk reads (which a file disk merges into one request), and writing or
//! overwriting it is one disk write.

mod common;

use std::sync::Arc;

use common::{pattern, MIB};
use parking_lot::Mutex;
use tessera_disk::{BlockDevice, DiskError, DiskRef, MemDisk, ReadReq};
use tessera_volume::{Engine, LayoutKind, Provisioning, VdiskSpec};

/// A disk that remembers the reads of each `read_many` batch, and its writes.
struct Recording {
    inner: MemDisk,
    batches: Mutex<Vec<Vec<(u64, usize)>>>,
    writes: Mutex<Vec<(u64, usize)>>,
}

impl Recording {
    fn new(name: &str) -> Arc<Recording> {
        Arc::new(Recording {
            inner: MemDisk::new(name, 256 * MIB),
            batches: Mutex::new(Vec::new()),
            writes: Mutex::new(Vec::new()),
        })
    }
}

impl BlockDevice for Recording {
    fn path(&self) -> &str {
        self.inner.path()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.batches.lock().push(vec![(offset, buf.len())]);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.writes.lock().push((offset, buf.len()));
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DiskError> {
        self.inner.flush()
    }
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> Vec<Result<(), DiskError>> {
        self.batches
            .lock()
            .push(reqs.iter().map(|r| (r.offset, r.buf.len())).collect());
        self.inner.read_many(reqs)
    }
}

const CHUNK: u64 = MIB;
const WRITERS: u64 = 4;
const CHUNKS: u64 = 32;

#[test]
fn concurrent_sequential_writers_keep_their_grains_together() {
    let disk = Recording::new("rec0");
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::create_pool(&dir.path().join("pool"), "p", vec![disk.clone() as DiskRef], 16 * MIB).unwrap();
    for (name, prov) in [("thin", Provisioning::Thin), ("fixed", Provisioning::Fixed)] {
        // The defaults (64 KiB grains), on the one disk.
        let mut s = VdiskSpec::new(name, CHUNKS * CHUNK, LayoutKind::Simple);
        s.provisioning = prov;
        let v = e.create_vdisk(&s).unwrap();
        // Writers take turns through the chunks, all at once, as an import's workers do.
        std::thread::scope(|s| {
            for w in 0..WRITERS {
                let v = &v;
                s.spawn(move || {
                    for c in (w..CHUNKS).step_by(WRITERS as usize) {
                        v.write(c * CHUNK, &pattern(c, c * CHUNK, CHUNK as usize), false)
                            .unwrap();
                    }
                });
            }
        });
        for c in 0..CHUNKS {
            disk.batches.lock().clear();
            let mut back = vec![0u8; CHUNK as usize];
            v.read(c * CHUNK, &mut back).unwrap();
            assert!(back == pattern(c, c * CHUNK, CHUNK as usize), "{name}: chunk {c}");
            let batches = disk.batches.lock().clone();
            assert_eq!(batches.len(), 1, "{name}: chunk {c} read in one batch: {batches:?}");
            let reads = &batches[0];
            assert!(
                reads.windows(2).all(|w| w[0].0 + w[0].1 as u64 == w[1].0),
                "{name}: chunk {c}'s grains are not neighbours on the disk: {reads:?}"
            );
        }
    }
    let r = e.check().unwrap();
    assert!(r.problems.is_empty(), "metadata check failed: {:#?}", r.problems);
}

/// Disk writes of the grains' data (the pool's metadata lives elsewhere): slab space starts
/// past the label area.
fn data_writes(disk: &Recording) -> Vec<(u64, usize)> {
    disk.writes.lock().iter().copied().filter(|&(o, _)| o >= MIB).collect()
}

#[test]
fn writing_neighbouring_grains_is_one_disk_write() {
    let disk = Recording::new("rec1");
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::create_pool(&dir.path().join("pool"), "p", vec![disk.clone() as DiskRef], 16 * MIB).unwrap();
    let v = e
        .create_vdisk(&VdiskSpec::new("v", 8 * MIB, LayoutKind::Simple))
        .unwrap();
    // A first write of four grains: their data is one disk write (and their entries one
    // commit), where it was four of each in a row.
    disk.writes.lock().clear();
    v.write(768 << 10, &pattern(1, 768 << 10, 256 << 10), false).unwrap();
    let w = data_writes(&disk);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].1, 256 << 10);
    // Partly mapped: the unmapped grains are written one by one.
    v.write(0, &pattern(1, 0, 4 * MIB as usize), false).unwrap();
    // 256 KiB over four mapped 64 KiB grains, in one stripe unit: one write.
    disk.writes.lock().clear();
    v.write(256 << 10, &pattern(2, 256 << 10, 256 << 10), false).unwrap();
    let w = data_writes(&disk);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].1, 256 << 10);
    // A grain a snapshot shares is copied, not overwritten: the snapshot keeps what it had.
    let snap = e.snapshot("v", "s").unwrap();
    disk.writes.lock().clear();
    v.write(0, &pattern(3, 0, MIB as usize), false).unwrap();
    assert_eq!(data_writes(&disk).len(), 16, "shared grains are written grain by grain");
    // Overwritten again, the grains are this vdisk's alone: one write per 256 KiB stripe unit
    // (the layout's unit of placement), each continuing the last.
    disk.writes.lock().clear();
    v.write(0, &pattern(4, 0, MIB as usize), false).unwrap();
    let w = data_writes(&disk);
    assert_eq!(w.len(), 4, "{w:?}");
    assert!(w.windows(2).all(|p| p[0].0 + p[0].1 as u64 == p[1].0), "{w:?}");
    let mut back = vec![0u8; 4 * MIB as usize];
    v.read(0, &mut back).unwrap();
    assert!(back[..MIB as usize] == pattern(4, 0, MIB as usize)[..]);
    assert!(back[MIB as usize..] == pattern(1, 0, 4 * MIB as usize)[MIB as usize..]);
    snap.read(0, &mut back).unwrap();
    let mut want = pattern(1, 0, 4 * MIB as usize);
    want[256 << 10..512 << 10].copy_from_slice(&pattern(2, 256 << 10, 256 << 10));
    assert!(back == want, "the snapshot changed");
    // Blocks smaller than a sector, in part: read-modify-write, grain by grain, still right.
    v.write(4096 + 512, &pattern(5, 0, 128 << 10), false).unwrap();
    v.read(0, &mut back).unwrap();
    assert!(back[4096 + 512..4096 + 512 + (128 << 10)] == pattern(5, 0, 128 << 10)[..]);
    let r = e.check().unwrap();
    assert!(r.problems.is_empty(), "metadata check failed: {:#?}", r.problems);
}
