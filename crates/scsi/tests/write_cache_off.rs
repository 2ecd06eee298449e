//! MODE SELECT that turns the write cache off answers only once the writes that saw it on
//! have ended, and its flush covers them: a host that then stops sending SYNCHRONIZE CACHE
//! loses nothing such a write was answered for. (Before 2026-12-04 the flush could run while
//! such a write was still on its way, which then ended without ever being flushed.)

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tessera_scsi::{BackendResult, BlockBackend, Extent, FrozenImage, Lun, RamBackend};

const MIB: u64 = 1 << 20;

/// A RAM backend whose writes wait at a gate, and that records its writes and flushes in order.
struct Gated {
    ram: RamBackend,
    open: Mutex<bool>,
    opened: Condvar,
    entered: AtomicBool,
    events: Mutex<Vec<&'static str>>,
}

impl BlockBackend for Gated {
    fn name(&self) -> String {
        self.ram.name()
    }
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn physical_block_size(&self) -> u32 {
        self.ram.physical_block_size()
    }
    fn grain_size(&self) -> u64 {
        self.ram.grain_size()
    }
    fn thin(&self) -> bool {
        self.ram.thin()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> BackendResult<()> {
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], durable: bool) -> BackendResult<()> {
        self.entered.store(true, Ordering::SeqCst);
        let mut open = self.open.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
        drop(open);
        self.ram.write(offset, data, durable)?;
        self.events.lock().push(if durable { "durable write" } else { "write" });
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool, durable: bool) -> BackendResult<()> {
        self.ram.write_zeroes(offset, len, unmap, durable)
    }
    fn trim(&self, offset: u64, len: u64) -> BackendResult<()> {
        self.ram.trim(offset, len)
    }
    fn flush(&self) -> BackendResult<()> {
        self.events.lock().push("flush");
        self.ram.flush()
    }
    fn extents(&self, offset: u64, len: u64) -> BackendResult<Vec<Extent>> {
        self.ram.extents(offset, len)
    }
    fn freeze(&self, ranges: &[(u64, u64)]) -> BackendResult<Box<dyn FrozenImage>> {
        self.ram.freeze(ranges)
    }
}

#[test]
fn turning_the_write_cache_off_waits_for_the_writes_that_saw_it_on_and_flushes_them() {
    let gated = Arc::new(Gated {
        ram: RamBackend::new("gated", 4 * MIB, 512),
        open: Mutex::new(false),
        opened: Condvar::new(),
        entered: AtomicBool::new(false),
        events: Mutex::new(Vec::new()),
    });
    let lun = Arc::new(Lun::new(gated.clone(), 9, false));
    // The caching page as it is (write cache on, the default), then with WCE cleared.
    let sensed = lun.execute(&[0x1A, 0x08, 0x08, 0, 255, 0], &[]);
    assert_eq!(sensed.status, 0);
    assert_ne!(sensed.data[4 + 2] & 0x04, 0, "the write cache is on");
    let mut select = vec![0u8; 4];
    select.extend_from_slice(&sensed.data[4..]);
    select[4 + 2] &= !0x04;
    let write = {
        let lun = lun.clone();
        std::thread::spawn(move || lun.execute(&[0x2A, 0, 0, 0, 0, 8, 0, 0, 1, 0], &[0x5A; 512]))
    };
    let start = Instant::now();
    while !gated.entered.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the write never reached the backend"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let off = {
        let lun = lun.clone();
        let cdb = [0x15, 0x10, 0, 0, select.len() as u8, 0];
        std::thread::spawn(move || lun.execute(&cdb, &select))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !off.is_finished(),
        "MODE SELECT answered while a write that saw the cache on was still on its way"
    );
    *gated.open.lock() = true;
    gated.opened.notify_all();
    assert_eq!(write.join().unwrap().status, 0);
    assert_eq!(off.join().unwrap().status, 0);
    assert_eq!(
        *gated.events.lock(),
        vec!["write", "flush"],
        "the flush of MODE SELECT covers the write"
    );
    // Writes from now on are durable when answered.
    *gated.events.lock() = Vec::new();
    assert_eq!(lun.execute(&[0x2A, 0, 0, 0, 0, 9, 0, 0, 1, 0], &[0x5A; 512]).status, 0);
    assert_eq!(*gated.events.lock(), vec!["durable write"]);
}
