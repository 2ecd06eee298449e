//! A disk wrapper that injects faults, for tests of everything above the disk layer.
//!
//! The faults are controlled through [`Faults`], a cloneable handle, so that a test can keep
//! steering a disk after handing the disk itself to a pool as a [`DiskRef`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::{check_request, AlignedBuf, BlockDevice, DiskError, DiskRef, SECTOR};

/// Which requests a failing range affects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Both,
}

impl FaultOp {
    fn covers(self, is_write: bool) -> bool {
        match self {
            FaultOp::Read => !is_write,
            FaultOp::Write => is_write,
            FaultOp::Both => true,
        }
    }
}

#[derive(Default)]
struct Plan {
    ranges: Vec<(u64, u64, FaultOp)>,
    /// I/Os still allowed before every I/O fails.
    budget: Option<u64>,
    latency: Duration,
    tear_next: Option<usize>,
    fail_flushes: bool,
    /// Flushes still allowed before every flush fails.
    flush_budget: Option<u64>,
    /// Every request is refused as the storage behind a disk refuses it for now.
    refusing: bool,
    /// The file system behind the disk is full, as for a sparse file: what was reserved or
    /// written before takes writes, the rest fails them (and its reservation) with ENOSPC.
    full: bool,
}

/// What a full disk still takes writes to is tracked in pieces of this size.
const HELD_CHUNK: u64 = 1 << 20;

struct State {
    inner: DiskRef,
    plan: Mutex<Plan>,
    pulled: AtomicBool,
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    /// The [`HELD_CHUNK`]s reserved or written so far, which a full disk still writes to.
    held: Mutex<std::collections::HashSet<u64>>,
}

/// Handle that controls the faults of one [`FaultyDisk`]. Clones control the same disk.
#[derive(Clone)]
pub struct Faults {
    state: Arc<State>,
}

/// A [`BlockDevice`] that passes requests to an inner disk unless a fault says otherwise.
/// Its path is the inner disk's path.
pub struct FaultyDisk {
    faults: Faults,
}

impl FaultyDisk {
    pub fn new(inner: DiskRef) -> Arc<FaultyDisk> {
        let state = State {
            inner,
            plan: Mutex::new(Plan::default()),
            pulled: AtomicBool::new(false),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            held: Mutex::new(Default::default()),
        };
        Arc::new(FaultyDisk {
            faults: Faults { state: Arc::new(state) },
        })
    }

    /// The fault controls; clone the handle to keep it after giving the disk away.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    pub fn inner(&self) -> &DiskRef {
        &self.faults.state.inner
    }

    fn injected(&self, what: impl Into<String>) -> DiskError {
        DiskError::Injected {
            path: self.path().to_string(),
            what: what.into(),
        }
    }

    fn refused(&self, op: &'static str, offset: u64, len: usize) -> DiskError {
        DiskError::Unavailable {
            path: self.path().to_string(),
            op,
            offset,
            len,
            reason: "injected: the storage refuses requests for now".into(),
        }
    }

    /// Takes up the space of `[offset, offset + len)`; with the disk full, fails with ENOSPC
    /// (and takes nothing) unless all of it was taken before.
    fn hold(&self, op: &'static str, offset: u64, len: u64) -> Result<(), DiskError> {
        let s = &self.faults.state;
        let chunks = offset / HELD_CHUNK..(offset + len).div_ceil(HELD_CHUNK);
        let mut held = s.held.lock();
        if s.plan.lock().full && chunks.clone().any(|c| !held.contains(&c)) {
            return Err(DiskError::Io {
                path: self.path().to_string(),
                op,
                offset,
                len: len as usize,
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            });
        }
        held.extend(chunks);
        Ok(())
    }

    /// Decides the fate of one read or write. Ok(Some(n)) means a torn write of n bytes.
    fn admit(&self, is_write: bool, offset: u64, len: usize) -> Result<Option<usize>, DiskError> {
        let s = &self.faults.state;
        let (latency, verdict) = {
            let mut plan = s.plan.lock();
            if plan.refusing {
                return Err(self.refused(if is_write { "write" } else { "read" }, offset, len));
            }
            let verdict = if s.pulled.load(Ordering::SeqCst) {
                Err("disk pulled".to_string())
            } else if let Some(0) = plan.budget {
                Err("I/O budget exhausted, every I/O fails".to_string())
            } else if let Some(&(start, flen, _)) = plan
                .ranges
                .iter()
                .find(|&&(start, flen, op)| op.covers(is_write) && overlaps(start, flen, offset, len as u64))
            {
                let op = if is_write { "write" } else { "read" };
                Err(format!(
                    "{op} overlaps failing range [{start}, {})",
                    start.saturating_add(flen)
                ))
            } else {
                Ok(if is_write { plan.tear_next.take() } else { None })
            };
            if let Some(n) = plan.budget.as_mut() {
                *n = n.saturating_sub(1);
            }
            (plan.latency, verdict)
        };
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        verdict.map_err(|what| self.injected(what))
    }
}

fn overlaps(start: u64, len: u64, offset: u64, io_len: u64) -> bool {
    let end = start.saturating_add(len);
    let io_end = offset.saturating_add(io_len);
    offset < end && start < io_end
}

impl BlockDevice for FaultyDisk {
    fn path(&self) -> &str {
        self.faults.state.inner.path()
    }

    fn size(&self) -> u64 {
        self.faults.state.inner.size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        let s = &self.faults.state;
        s.reads.fetch_add(1, Ordering::SeqCst);
        check_request(self.path(), "read", offset, buf.len(), self.size())?;
        self.admit(false, offset, buf.len())?;
        s.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        let s = &self.faults.state;
        s.writes.fetch_add(1, Ordering::SeqCst);
        check_request(self.path(), "write", offset, buf.len(), self.size())?;
        let torn = self.admit(true, offset, buf.len())?;
        self.hold("write", offset, buf.len() as u64)?;
        match torn {
            None => s.inner.write_at(buf, offset),
            Some(keep) => {
                let keep = (keep - keep % SECTOR).min(buf.len());
                if keep > 0 {
                    s.inner.write_at(&buf[..keep], offset)?;
                }
                Err(self.injected(format!("torn write: {keep} of {} bytes reached the disk", buf.len())))
            }
        }
    }

    fn reserve(&self, offset: u64, len: u64) -> Result<(), DiskError> {
        if self.faults.state.plan.lock().refusing {
            return Err(self.refused("reserve", offset, len as usize));
        }
        self.hold("reserve", offset, len)?;
        self.faults.state.inner.reserve(offset, len)
    }

    fn flush(&self) -> Result<(), DiskError> {
        let s = &self.faults.state;
        s.flushes.fetch_add(1, Ordering::SeqCst);
        if s.pulled.load(Ordering::SeqCst) {
            return Err(self.injected("disk pulled"));
        }
        {
            let mut plan = s.plan.lock();
            if plan.refusing {
                return Err(self.refused("flush", 0, 0));
            }
            if plan.fail_flushes || plan.flush_budget == Some(0) {
                return Err(self.injected("flush fails"));
            }
            if let Some(n) = plan.flush_budget.as_mut() {
                *n -= 1;
            }
            // A disk that has stopped doing I/O cannot make anything durable either.
            if plan.budget == Some(0) {
                return Err(self.injected("I/O budget exhausted, every I/O fails"));
            }
        }
        s.inner.flush()
    }
}

impl Faults {
    /// Reads and/or writes overlapping `[offset, offset + len)` fail. Ranges accumulate.
    pub fn fail_range(&self, offset: u64, len: u64, kind: FaultOp) {
        self.state.plan.lock().ranges.push((offset, len, kind));
    }

    /// The next `n` reads and writes go through (unless another fault stops them); every
    /// one after that fails, and so does every flush.
    pub fn fail_after(&self, n: u64) {
        self.state.plan.lock().budget = Some(n);
    }

    /// While on, every request is refused with [`DiskError::Unavailable`], as the storage
    /// behind a disk refuses it when its cluster is unreachable or has fenced this client
    /// off; nothing reaches the disk.
    pub fn refuse(&self, on: bool) {
        self.state.plan.lock().refusing = on;
    }

    /// While on, the storage behind the disk is full, as a sparse file's file system is: the
    /// ranges reserved or written before still take writes; a write or a reservation that
    /// needs new space fails with ENOSPC ([`DiskError::is_no_space`]).
    pub fn fill(&self, on: bool) {
        self.state.plan.lock().full = on;
    }

    /// Sleeps this long before each read and write.
    pub fn set_latency(&self, d: Duration) {
        self.state.plan.lock().latency = d;
    }

    /// The next write stores only its first `keep_bytes` (rounded down to whole sectors)
    /// and then fails, as a write interrupted by power loss would.
    pub fn tear_next_write(&self, keep_bytes: usize) {
        self.state.plan.lock().tear_next = Some(keep_bytes);
    }

    /// Flushes fail while set.
    pub fn fail_flushes(&self, on: bool) {
        self.state.plan.lock().fail_flushes = on;
    }

    /// The next `n` flushes go through (unless another fault stops them); every one after
    /// that fails, until [`clear`](Self::clear).
    pub fn fail_flushes_after(&self, n: u64) {
        self.state.plan.lock().flush_budget = Some(n);
    }

    /// Flips bit `bit` (0..8) of the byte at `offset` in the inner disk, right now, so that
    /// later reads return silently wrong data. Bypasses every fault and counter.
    pub fn flip_bit(&self, offset: u64, bit: u8) -> Result<(), DiskError> {
        assert!(bit < 8, "bit {bit} is not a bit of a byte");
        let inner = &self.state.inner;
        let sector = offset - offset % SECTOR as u64;
        let mut buf = AlignedBuf::zeroed(SECTOR);
        inner.read_at(&mut buf, sector)?;
        buf[(offset - sector) as usize] ^= 1 << bit;
        inner.write_at(&buf, sector)
    }

    /// Every I/O and flush fails until [`reinsert`](Self::reinsert).
    pub fn pull(&self) {
        self.state.pulled.store(true, Ordering::SeqCst);
    }

    pub fn reinsert(&self) {
        self.state.pulled.store(false, Ordering::SeqCst);
    }

    pub fn is_pulled(&self) -> bool {
        self.state.pulled.load(Ordering::SeqCst)
    }

    /// Removes every fault (flipped bits stay flipped) and reinserts the disk.
    /// Counters are kept.
    pub fn clear(&self) {
        *self.state.plan.lock() = Plan::default();
        self.state.pulled.store(false, Ordering::SeqCst);
    }

    /// Reads issued to the faulty disk, failed ones included.
    pub fn reads(&self) -> u64 {
        self.state.reads.load(Ordering::SeqCst)
    }

    /// Writes issued to the faulty disk, failed ones included.
    pub fn writes(&self) -> u64 {
        self.state.writes.load(Ordering::SeqCst)
    }

    /// Flushes issued to the faulty disk, failed ones included.
    pub fn flushes(&self) -> u64 {
        self.state.flushes.load(Ordering::SeqCst)
    }

    pub fn reset_counters(&self) {
        self.state.reads.store(0, Ordering::SeqCst);
        self.state.writes.store(0, Ordering::SeqCst);
        self.state.flushes.store(0, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for FaultyDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyDisk").field("path", &self.path()).finish()
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("path", &self.state.inner.path())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;
    use std::time::Instant;

    const MIB: u64 = 1 << 20;
    const S: u64 = SECTOR as u64;

    fn setup() -> (Arc<MemDisk>, DiskRef, Faults) {
        let mem = Arc::new(MemDisk::new("mem0", 4 * MIB));
        let faulty = FaultyDisk::new(mem.clone());
        let faults = faulty.faults().clone();
        (mem, faulty, faults)
    }

    #[test]
    fn a_full_disk_takes_writes_only_where_it_held_space_before() {
        let (_mem, d, faults) = setup();
        fill(&*d, 0, SECTOR, 1).unwrap();
        d.reserve(2 * MIB, MIB).unwrap();
        faults.fill(true);
        fill(&*d, S, SECTOR, 2).unwrap();
        fill(&*d, 2 * MIB + S, SECTOR, 3).unwrap();
        let e = fill(&*d, MIB, SECTOR, 4).unwrap_err();
        assert!(e.is_no_space(), "{e}");
        assert!(d.reserve(MIB, S).unwrap_err().is_no_space());
        // Nothing of a refused write reaches the disk.
        assert_eq!(read(&*d, MIB, SECTOR).unwrap(), vec![0u8; SECTOR]);
        faults.fill(false);
        fill(&*d, MIB, SECTOR, 4).unwrap();
        faults.fill(true);
        fill(&*d, MIB, SECTOR, 5).unwrap();
        assert!(!DiskError::Injected {
            path: "x".into(),
            what: "y".into()
        }
        .is_no_space());
    }

    fn fill(d: &dyn BlockDevice, offset: u64, len: usize, byte: u8) -> Result<(), DiskError> {
        d.write_at(&vec![byte; len], offset)
    }

    fn read(d: &dyn BlockDevice, offset: u64, len: usize) -> Result<Vec<u8>, DiskError> {
        let mut b = vec![0u8; len];
        d.read_at(&mut b, offset).map(|()| b)
    }

    fn is_injected(r: Result<impl std::fmt::Debug, DiskError>, needle: &str) -> bool {
        match r {
            Err(DiskError::Injected { what, path }) => {
                assert_eq!(path, "mem0");
                what.contains(needle)
            }
            other => panic!("expected Injected({needle}), got {other:?}"),
        }
    }

    #[test]
    fn passes_through_without_faults() {
        let (mem, d, f) = setup();
        assert_eq!((d.path(), d.size()), ("mem0", 4 * MIB));
        fill(&*d, S, SECTOR, 7).unwrap();
        assert_eq!(read(&*mem, S, SECTOR).unwrap(), vec![7; SECTOR]);
        assert_eq!(read(&*d, S, SECTOR).unwrap(), vec![7; SECTOR]);
        d.flush().unwrap();
        assert_eq!((f.reads(), f.writes(), f.flushes()), (1, 1, 1));
        assert_eq!(mem.flush_count(), 1);
        f.reset_counters();
        assert_eq!((f.reads(), f.writes(), f.flushes()), (0, 0, 0));
    }

    #[test]
    fn validates_before_injecting() {
        let (_mem, d, f) = setup();
        f.pull();
        assert!(matches!(
            d.read_at(&mut [0u8; 100], 0),
            Err(DiskError::Unaligned { .. })
        ));
        assert!(matches!(
            fill(&*d, 4 * MIB, SECTOR, 1),
            Err(DiskError::OutOfRange { .. })
        ));
        assert!(matches!(d.write_at(&[], 0), Err(DiskError::Unaligned { len: 0, .. })));
    }

    #[test]
    fn fail_range_hits_only_overlapping_requests_of_its_kind() {
        let (mem, d, f) = setup();
        f.fail_range(8 * S, 2 * S, FaultOp::Read);
        // Overlapping reads fail, from either side.
        assert!(is_injected(read(&*d, 8 * S, SECTOR), "[32768, 40960)"));
        assert!(is_injected(read(&*d, 6 * S, 3 * SECTOR), "overlaps"));
        assert!(is_injected(read(&*d, 9 * S, 4 * SECTOR), "overlaps"));
        // Adjacent reads and writes into the range do not.
        read(&*d, 7 * S, SECTOR).unwrap();
        read(&*d, 10 * S, SECTOR).unwrap();
        fill(&*d, 8 * S, SECTOR, 3).unwrap();

        f.fail_range(0, S, FaultOp::Write);
        assert!(is_injected(fill(&*d, 0, 2 * SECTOR, 4), "write"));
        assert_eq!(
            read(&*mem, 0, SECTOR).unwrap(),
            vec![0; SECTOR],
            "failed write reached the disk"
        );
        read(&*d, 0, SECTOR).unwrap();

        f.fail_range(MIB, S, FaultOp::Both);
        assert!(is_injected(read(&*d, MIB, SECTOR), "overlaps"));
        assert!(is_injected(fill(&*d, MIB, SECTOR, 1), "overlaps"));

        f.clear();
        read(&*d, 8 * S, SECTOR).unwrap();
        fill(&*d, 0, SECTOR, 4).unwrap();
    }

    #[test]
    fn fail_after_counts_reads_and_writes() {
        let (_mem, d, f) = setup();
        f.fail_after(3);
        fill(&*d, 0, SECTOR, 1).unwrap();
        read(&*d, 0, SECTOR).unwrap();
        d.flush().unwrap(); // flushes are not counted
        fill(&*d, S, SECTOR, 1).unwrap();
        for _ in 0..3 {
            assert!(is_injected(read(&*d, 0, SECTOR), "budget"));
            assert!(is_injected(fill(&*d, 0, SECTOR, 2), "budget"));
        }
        assert!(is_injected(d.flush(), "budget"));
        f.clear();
        assert_eq!(read(&*d, 0, SECTOR).unwrap(), vec![1; SECTOR]);

        f.fail_after(0);
        assert!(is_injected(read(&*d, 0, SECTOR), "budget"));
    }

    #[test]
    fn latency_delays_each_io() {
        let (_mem, d, f) = setup();
        f.set_latency(Duration::from_millis(30));
        let t = Instant::now();
        read(&*d, 0, SECTOR).unwrap();
        fill(&*d, 0, SECTOR, 1).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(60), "{:?}", t.elapsed());
        // Cleared, an hour's latency is gone (the margin is wide for a busy machine).
        f.set_latency(Duration::from_secs(3600));
        f.clear();
        let t = Instant::now();
        read(&*d, 0, SECTOR).unwrap();
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    }

    #[test]
    fn torn_write_keeps_new_prefix_and_old_rest() {
        let (mem, d, f) = setup();
        fill(&*d, 0, 4 * SECTOR, 0xAA).unwrap();
        // 2.5 sectors requested: rounded down to two.
        f.tear_next_write(2 * SECTOR + SECTOR / 2);
        assert!(is_injected(fill(&*d, 0, 4 * SECTOR, 0xBB), "torn write: 8192 of 16384"));
        let got = read(&*mem, 0, 4 * SECTOR).unwrap();
        assert!(got[..2 * SECTOR].iter().all(|&b| b == 0xBB));
        assert!(got[2 * SECTOR..].iter().all(|&b| b == 0xAA));
        // Only the next write tears.
        fill(&*d, 0, 4 * SECTOR, 0xCC).unwrap();
        assert_eq!(read(&*mem, 0, 4 * SECTOR).unwrap(), vec![0xCC; 4 * SECTOR]);

        // Keeping less than a sector writes nothing; keeping more than the write writes all.
        f.tear_next_write(100);
        assert!(is_injected(fill(&*d, 0, SECTOR, 0xDD), "torn"));
        assert_eq!(read(&*mem, 0, SECTOR).unwrap(), vec![0xCC; SECTOR]);
        f.tear_next_write(1 << 30);
        assert!(is_injected(fill(&*d, 0, SECTOR, 0xEE), "torn"));
        assert_eq!(read(&*mem, 0, SECTOR).unwrap(), vec![0xEE; SECTOR]);
    }

    #[test]
    fn flip_bit_changes_exactly_one_bit() {
        let (_mem, d, f) = setup();
        let data: Vec<u8> = (0..2 * SECTOR).map(|i| (i * 13) as u8).collect();
        d.write_at(&data, 3 * S).unwrap();
        let before = (f.reads(), f.writes());
        f.flip_bit(3 * S + SECTOR as u64 + 77, 5).unwrap();
        assert_eq!((f.reads(), f.writes()), before, "flip_bit must bypass the counters");
        let got = read(&*d, 3 * S, 2 * SECTOR).unwrap();
        let diff: Vec<(usize, u8)> = got
            .iter()
            .zip(&data)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| (i, a ^ b))
            .collect();
        assert_eq!(diff, vec![(SECTOR + 77, 1 << 5)]);
    }

    #[test]
    fn pull_and_reinsert() {
        let (_mem, d, f) = setup();
        fill(&*d, 0, SECTOR, 5).unwrap();
        f.pull();
        assert!(f.is_pulled());
        assert!(is_injected(read(&*d, 0, SECTOR), "disk pulled"));
        assert!(is_injected(fill(&*d, 0, SECTOR, 6), "disk pulled"));
        assert!(is_injected(d.flush(), "disk pulled"));
        f.reinsert();
        assert_eq!(read(&*d, 0, SECTOR).unwrap(), vec![5; SECTOR]);
        d.flush().unwrap();
        assert_eq!((f.reads(), f.writes(), f.flushes()), (2, 2, 2));

        f.pull();
        f.clear();
        assert!(!f.is_pulled());
        read(&*d, 0, SECTOR).unwrap();
    }

    #[test]
    fn flush_failures() {
        let (mem, d, f) = setup();
        f.fail_flushes(true);
        assert!(is_injected(d.flush(), "flush"));
        assert_eq!(mem.flush_count(), 0);
        fill(&*d, 0, SECTOR, 1).unwrap();
        f.fail_flushes(false);
        d.flush().unwrap();
        assert_eq!(mem.flush_count(), 1);
        f.fail_flushes_after(1);
        d.flush().unwrap();
        assert!(is_injected(d.flush(), "flush"));
        assert!(is_injected(d.flush(), "flush"));
        assert_eq!(mem.flush_count(), 2);
        f.clear();
        d.flush().unwrap();
    }

    #[test]
    fn handle_keeps_working_after_the_disk_is_given_away() {
        let mem = Arc::new(MemDisk::new("mem0", 4 * MIB));
        let faulty = FaultyDisk::new(mem);
        let f = faulty.faults().clone();
        let as_ref: DiskRef = faulty;
        f.pull();
        let worker = std::thread::spawn(move || {
            let r = read(&*as_ref, 0, SECTOR).map(|_| ());
            (as_ref, r)
        });
        let (as_ref, r) = worker.join().unwrap();
        assert!(is_injected(r, "pulled"));
        f.reinsert();
        read(&*as_ref, 0, SECTOR).unwrap();
        assert_eq!(f.reads(), 2);
    }
}
