//! A disk in memory that takes writes in the background (as a disk on RADOS does) and
//! completes them only when the test lets it: for what a transport does while a planned
//! write is on its ring.

use std::sync::{Arc, Mutex};

use tessera_disk::{AsyncWriter, BlockDevice, DiskError, DiskRef, MemDisk, ReadDone};

/// Writes started in the background and not completed yet: where their data is, and how to
/// tell their ring.
type Started = Arc<Mutex<Vec<(usize, u32, u64, ReadDone)>>>;

pub struct HeldWrites {
    disk: Arc<MemDisk>,
    started: Started,
}

impl HeldWrites {
    /// The disk (for a pool) and a handle on its background writes.
    pub fn new(path: &str, size: u64) -> (DiskRef, HeldWrites) {
        let disk = Arc::new(MemDisk::new(path, size));
        let started = Started::default();
        let dev = Arc::new(HeldWrites {
            disk: disk.clone(),
            started: started.clone(),
        });
        (dev, HeldWrites { disk, started })
    }

    /// Background writes started and not completed.
    pub fn started(&self) -> usize {
        self.started.lock().unwrap().len()
    }

    /// Writes every write started so far, and completes each as whole.
    pub fn release(&self) {
        for (at, len, offset, done) in self.started.lock().unwrap().drain(..) {
            // SAFETY: the ring that started the write keeps its data until it is completed.
            let data = unsafe { std::slice::from_raw_parts(at as *const u8, len as usize) };
            let ok = self.disk.write_at(data, offset).is_ok();
            done.complete(ok);
        }
    }
}

impl BlockDevice for HeldWrites {
    fn path(&self) -> &str {
        self.disk.path()
    }
    fn size(&self) -> u64 {
        self.disk.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.disk.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DiskError> {
        self.disk.flush()
    }
    fn write_via(&self) -> Option<Arc<dyn AsyncWriter>> {
        Some(Arc::new(Starter(self.started.clone())))
    }
}

struct Starter(Started);

impl AsyncWriter for Starter {
    unsafe fn start_write(&self, at: *const u8, len: u32, offset: u64, done: ReadDone) {
        self.0.lock().unwrap().push((at as usize, len, offset, done));
    }
}
