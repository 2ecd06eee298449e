//! A RAM backend that stands for a disk that stalls: the calls a test chooses (writes, or a
//! copy's pastes) wait at a gate the test closes and opens, and are counted as they reach it
//! and as they pass it. It also records its writes and flushes in the order they ended, and
//! can plan writes the way a file-backed pool does (one disk write straight into the RAM).
//! The tests of what waits for what (task management, the write cache turned off, a copy
//! giving way to a reset, writes started on a transport's own ring) share it instead of each
//! delegating every call of [`BlockBackend`] by hand.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use tessera_disk::{AsyncWriter, ReadDone};
use tessera_scsi::{BackendResult, BlockBackend, DirectWrite, Extent, FrozenImage, RamBackend, WriteHold, WritePlan};

/// The calls that wait at the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gated {
    /// WRITE and its kin (`BlockBackend::write`), not the planned writes, which go straight
    /// to the disk.
    Writes,
    /// A copy's chunks (`BlockBackend::paste`).
    Pastes,
}

pub struct GatedRam {
    ram: Arc<RamBackend>,
    gated: Gated,
    open: Mutex<bool>,
    opened: Condvar,
    reached: AtomicUsize,
    passed: AtomicUsize,
    events: Mutex<Vec<&'static str>>,
    plans_writes: bool,
    planned_finished: Arc<AtomicUsize>,
}

impl GatedRam {
    /// `size` bytes of `block_size` blocks, with the gate open.
    pub fn new(name: &str, size: u64, block_size: u32, gated: Gated) -> GatedRam {
        GatedRam {
            ram: Arc::new(RamBackend::new(name, size, block_size)),
            gated,
            open: Mutex::new(true),
            opened: Condvar::new(),
            reached: AtomicUsize::new(0),
            passed: AtomicUsize::new(0),
            events: Mutex::new(Vec::new()),
            plans_writes: false,
            planned_finished: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Plans every write (`BlockBackend::try_plan_write`) as one disk write into the RAM.
    pub fn planning_writes(mut self) -> GatedRam {
        self.plans_writes = true;
        self
    }

    /// The calls gated from now on wait until [`GatedRam::open`].
    pub fn close(&self) {
        *self.open.lock() = false;
    }

    pub fn open(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }

    /// Gated calls that reached the gate (those still waiting included).
    pub fn reached(&self) -> usize {
        self.reached.load(Ordering::SeqCst)
    }

    /// Gated calls that passed the gate and are done with the RAM.
    pub fn passed(&self) -> usize {
        self.passed.load(Ordering::SeqCst)
    }

    /// The writes ("write", or "durable write") and flushes ("flush") ended so far, in order.
    pub fn events(&self) -> Vec<&'static str> {
        self.events.lock().clone()
    }

    pub fn forget_events(&self) {
        self.events.lock().clear();
    }

    /// Planned writes whose hold was finished (by the transport, once their disk writes ended).
    pub fn planned_finished(&self) -> usize {
        self.planned_finished.load(Ordering::SeqCst)
    }

    /// The RAM underneath, to read or write past the gate.
    pub fn ram(&self) -> &Arc<RamBackend> {
        &self.ram
    }

    fn through_gate<T>(&self, call: Gated, run: impl FnOnce() -> T) -> T {
        if call != self.gated {
            return run();
        }
        self.reached.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
        drop(open);
        let r = run();
        self.passed.fetch_add(1, Ordering::SeqCst);
        r
    }
}

/// A planned write's one disk write, into the RAM.
struct IntoRam(Arc<RamBackend>);

impl AsyncWriter for IntoRam {
    unsafe fn start_write(&self, at: *const u8, len: u32, offset: u64, done: ReadDone) {
        // SAFETY: the caller keeps `len` bytes at `at` until `done` completes.
        let data = unsafe { std::slice::from_raw_parts(at, len as usize) };
        done.complete(self.0.write(offset, data, false).is_ok());
    }
}

struct Finished(Arc<AtomicUsize>);

impl WriteHold for Finished {
    fn finish(self: Box<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl BlockBackend for GatedRam {
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
        self.through_gate(Gated::Writes, || {
            self.ram.write(offset, data, durable)?;
            self.events.lock().push(if durable { "durable write" } else { "write" });
            Ok(())
        })
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
    fn paste(&self, at: u64, image: &dyn FrozenImage, from: u64, len: u64) -> BackendResult<()> {
        self.through_gate(Gated::Pastes, || self.ram.paste(at, image, from, len))
    }
    fn try_plan_write(&self, offset: u64, len: usize) -> Option<WritePlan> {
        self.plans_writes.then(|| WritePlan {
            writes: vec![DirectWrite {
                writer: Arc::new(IntoRam(self.ram.clone())),
                offset,
                buf_off: 0,
                len,
                io: None,
            }],
            hold: Box::new(Finished(self.planned_finished.clone())),
        })
    }
}
