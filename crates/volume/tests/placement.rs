//! Where grains land on the disks: a write of neighbouring grains takes neighbouring slots,
//! even while other writers allocate at the same time, so that reading the range back is a
//! run of neighbouring disk reads (which a file disk merges into one request).

mod common;

use std::sync::Arc;

use common::{pattern, MIB};
use parking_lot::Mutex;
use tessera_disk::{BlockDevice, DiskError, DiskRef, MemDisk, ReadReq};
use tessera_volume::{Engine, LayoutKind, Provisioning, VdiskSpec};

/// A disk that remembers the reads of each `read_many` batch.
struct Recording {
    inner: MemDisk,
    batches: Mutex<Vec<Vec<(u64, usize)>>>,
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
    let disk = Arc::new(Recording {
        inner: MemDisk::new("rec0", 256 * MIB),
        batches: Mutex::new(Vec::new()),
    });
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
