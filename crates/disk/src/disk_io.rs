//! What a member disk has done since it was opened: operations, bytes, errors and a latency
//! histogram for reads, writes and flushes. [`MeteredDisk`] records what goes through the
//! [`BlockDevice`] calls; callers that do I/O on the disk's descriptor themselves (a read
//! ring, a batch of writes on io_uring) record it through [`BlockDevice::io`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{BlockDevice, DiskError, ReadReq};

/// Upper bounds of the latency buckets, in seconds: 50 µs to 10 s, about three per decade
/// (the daemon's request histograms use the same, so the two compare bucket by bucket).
pub const LATENCY_BUCKETS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A member disk's operation, as metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskOp {
    Read = 0,
    Write = 1,
    Flush = 2,
}

impl DiskOp {
    pub const ALL: [DiskOp; 3] = [DiskOp::Read, DiskOp::Write, DiskOp::Flush];

    pub fn name(self) -> &'static str {
        match self {
            DiskOp::Read => "read",
            DiskOp::Write => "write",
            DiskOp::Flush => "flush",
        }
    }
}

#[derive(Default)]
struct OpCounters {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    /// Operations by latency bucket (not cumulative); the last counts those above every bound.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    latency_ns: AtomicU64,
}

/// Counters of one disk, updated with relaxed atomic adds: cheap enough for every I/O.
#[derive(Default)]
pub struct DiskIo {
    ops: [OpCounters; 3],
}

/// A copy of one operation's counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpFigures {
    pub ops: u64,
    /// Bytes of operations that succeeded.
    pub bytes: u64,
    pub errors: u64,
    /// Operations by latency bucket, cumulative as Prometheus wants them: `buckets[i]` counts
    /// those that took at most `LATENCY_BUCKETS[i]`.
    pub buckets: Vec<u64>,
    pub latency_sum: Duration,
}

impl OpFigures {
    /// The latency at quantile `q` (0..=1), interpolated within its bucket; None without
    /// operations.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.ops == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.ops as f64;
        let mut below = 0u64;
        let mut lower = 0.0;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n as f64 >= rank && n > below {
                let within = (rank - below as f64) / (n - below) as f64;
                let upper = LATENCY_BUCKETS[i];
                return Some(Duration::from_secs_f64(
                    lower + (upper - lower) * within.clamp(0.0, 1.0),
                ));
            }
            below = n;
            lower = LATENCY_BUCKETS[i];
        }
        // Above the last bound.
        Some(Duration::from_secs_f64(*LATENCY_BUCKETS.last().expect("bounds")))
    }

    /// Mean latency; None without operations.
    pub fn mean(&self) -> Option<Duration> {
        (self.ops > 0).then(|| self.latency_sum / self.ops.min(u32::MAX as u64) as u32)
    }
}

impl DiskIo {
    pub fn new() -> Arc<DiskIo> {
        Arc::new(DiskIo::default())
    }

    /// Records one operation of `bytes` that took `latency`.
    pub fn record(&self, op: DiskOp, bytes: u64, latency: Duration, ok: bool) {
        let c = &self.ops[op as usize];
        c.ops.fetch_add(1, Ordering::Relaxed);
        if ok {
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        let secs = latency.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        c.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        c.latency_ns
            .fetch_add(latency.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// The counters of `op` as they are now.
    pub fn figures(&self, op: DiskOp) -> OpFigures {
        let c = &self.ops[op as usize];
        let mut cumulative = 0;
        let buckets = c.buckets[..LATENCY_BUCKETS.len()]
            .iter()
            .map(|b| {
                cumulative += b.load(Ordering::Relaxed);
                cumulative
            })
            .collect();
        OpFigures {
            // At least every bucketed operation: a scrape between two adds stays consistent.
            ops: c.ops.load(Ordering::Relaxed).max(cumulative),
            bytes: c.bytes.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            buckets,
            latency_sum: Duration::from_nanos(c.latency_ns.load(Ordering::Relaxed)),
        }
    }
}

/// A disk whose every call is counted in its [`DiskIo`]. The pool opens its members through
/// it, so the figures cover all the I/O the engine does, whichever path it takes.
pub struct MeteredDisk {
    inner: Arc<dyn BlockDevice>,
    io: Arc<DiskIo>,
}

impl MeteredDisk {
    /// `disk`, counted. A disk already counted is returned as it is.
    pub fn wrap(disk: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
        if disk.io().is_some() {
            return disk;
        }
        Arc::new(MeteredDisk {
            inner: disk,
            io: DiskIo::new(),
        })
    }

    fn timed<R>(&self, op: DiskOp, bytes: u64, f: impl FnOnce() -> Result<R, DiskError>) -> Result<R, DiskError> {
        let start = Instant::now();
        let r = f();
        self.io.record(op, bytes, start.elapsed(), r.is_ok());
        r
    }
}

impl BlockDevice for MeteredDisk {
    fn path(&self) -> &str {
        self.inner.path()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        let len = buf.len() as u64;
        self.timed(DiskOp::Read, len, || self.inner.read_at(buf, offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.timed(DiskOp::Write, buf.len() as u64, || self.inner.write_at(buf, offset))
    }

    fn flush(&self) -> Result<(), DiskError> {
        self.timed(DiskOp::Flush, 0, || self.inner.flush())
    }

    fn reserve(&self, offset: u64, len: u64) -> Result<(), DiskError> {
        self.inner.reserve(offset, len)
    }

    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> Vec<Result<(), DiskError>> {
        let start = Instant::now();
        let results = self.inner.read_many(reqs);
        // The batch is in flight together: each read took as long as the batch.
        let took = start.elapsed();
        for (r, res) in reqs.iter().zip(&results) {
            self.io.record(DiskOp::Read, r.buf.len() as u64, took, res.is_ok());
        }
        results
    }

    fn uring_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.uring_fd()
    }

    fn read_via(&self) -> Option<crate::ReadVia> {
        self.inner.read_via()
    }

    fn write_via(&self) -> Option<Arc<dyn crate::AsyncWriter>> {
        self.inner.write_via()
    }

    fn io(&self) -> Option<&Arc<DiskIo>> {
        Some(&self.io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AlignedBuf, FaultOp, FaultyDisk, MemDisk};

    #[test]
    fn every_call_is_counted_with_its_bytes_errors_and_latency() {
        let mem: Arc<dyn BlockDevice> = Arc::new(MemDisk::new("m", 4 << 20));
        let faulty = FaultyDisk::new(mem);
        let d = MeteredDisk::wrap(faulty.clone());
        assert!(Arc::ptr_eq(&d, &MeteredDisk::wrap(d.clone())), "wrapped once");
        let mut buf = AlignedBuf::zeroed(8192);
        for i in 0..5 {
            d.write_at(&buf, i * 8192).unwrap();
        }
        d.read_at(&mut buf, 0).unwrap();
        let mut a = AlignedBuf::zeroed(4096);
        let mut b = AlignedBuf::zeroed(4096);
        let res = d.read_many(&mut [
            ReadReq { buf: &mut a, offset: 0 },
            ReadReq {
                buf: &mut b,
                offset: 4096,
            },
        ]);
        assert!(res.iter().all(|r| r.is_ok()));
        d.flush().unwrap();
        faulty.faults().fail_range(1 << 20, 4096, FaultOp::Read);
        assert!(d.read_at(&mut buf, 1 << 20).is_err());

        let io = d.io().unwrap();
        let w = io.figures(DiskOp::Write);
        assert_eq!((w.ops, w.bytes, w.errors), (5, 5 * 8192, 0));
        let r = io.figures(DiskOp::Read);
        assert_eq!((r.ops, r.bytes, r.errors), (4, 8192 + 2 * 4096, 1));
        assert_eq!(io.figures(DiskOp::Flush).ops, 1);
        assert_eq!(*r.buckets.last().unwrap(), 4, "every read in a bucket");
        assert!(r.buckets.windows(2).all(|w| w[0] <= w[1]), "cumulative");
        assert!(r.mean().unwrap() <= r.quantile(1.0).unwrap() + Duration::from_millis(10));
    }

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let io = DiskIo::default();
        for _ in 0..90 {
            io.record(DiskOp::Read, 4096, Duration::from_micros(80), true);
        }
        for _ in 0..10 {
            io.record(DiskOp::Read, 4096, Duration::from_millis(4), true);
        }
        let f = io.figures(DiskOp::Read);
        let p50 = f.quantile(0.5).unwrap();
        assert!(
            p50 > Duration::from_micros(50) && p50 <= Duration::from_micros(100),
            "{p50:?}"
        );
        let p99 = f.quantile(0.99).unwrap();
        assert!(
            p99 > Duration::from_micros(2500) && p99 <= Duration::from_millis(5),
            "{p99:?}"
        );
        assert_eq!(DiskIo::default().figures(DiskOp::Write).quantile(0.5), None);
        io.record(DiskOp::Write, 1, Duration::from_secs(30), true);
        assert_eq!(io.figures(DiskOp::Write).quantile(0.5), Some(Duration::from_secs(10)));
    }
}
