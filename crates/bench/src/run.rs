//! Runs a workload against a target: threads × outstanding I/O slots, each issuing one I/O at
//! a time (OS threads for targets in this process, tasks for network ones), latencies in
//! HDR histograms, a warm-up that is not measured, and the CPU this process used.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;
use tessera_disk::AlignedBuf;

use crate::target::{rw16, Opened, Target, FUA, UNIT_ATTENTION_RETRIES};
use crate::verify::{Verifier, VerifyStats};

/// SCSI status CHECK CONDITION, and the sense key of a unit attention.
const CHECK_CONDITION: u8 = 0x02;
const UNIT_ATTENTION: u8 = 0x6;
use crate::workload::Workload;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    pub min_us: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub stdev_us: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OpStats {
    pub ops: u64,
    pub bytes: u64,
    pub iops: f64,
    pub mib_per_s: f64,
    /// None when there were no such operations.
    pub latency: Option<Latency>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunReport {
    pub target: String,
    pub seconds: f64,
    pub total: OpStats,
    pub read: OpStats,
    pub write: OpStats,
    /// CPU time of this process (user + system) over the measured time, as a percentage of
    /// one CPU.
    pub cpu_percent: f64,
    pub verify: Option<VerifyStats>,
}

/// Progress while running: seconds into the measurement, operations so far.
pub type Progress<'a> = &'a (dyn Fn(f64, u64) + Sync);

struct Shared {
    w: Workload,
    region: (u64, u64),
    blocks: u64,
    measuring: AtomicBool,
    /// Set when the measurement ends, or at the first failed I/O (recorded in `failure`).
    stop: AtomicBool,
    /// Operations completed while measuring, for the progress line.
    done: AtomicU64,
    /// Per thread, the next block of its sequential stretch.
    cursors: Vec<AtomicU64>,
    verifier: Option<Arc<Verifier>>,
    results: Mutex<Vec<SlotResult>>,
    failure: Mutex<Option<String>>,
}

struct SlotResult {
    read: Histogram<u64>,
    write: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    // Nanoseconds, 1 ns to 100 s, 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds")
}

/// One I/O about to be issued.
#[derive(Clone, Copy)]
struct Io {
    write: bool,
    block: u64,
    offset: u64,
    /// The generation a verified write carries.
    gen: u64,
}

/// One I/O slot's state: what to do next, and what happened.
struct Slot {
    s: Arc<Shared>,
    thread: u32,
    rng: rand::rngs::SmallRng,
    buf: AlignedBuf,
    res: SlotResult,
}

impl Slot {
    fn new(s: Arc<Shared>, thread: u32, index: u64) -> Slot {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0x7e55_e4a0 ^ index);
        let mut buf = AlignedBuf::zeroed(s.w.block_size as usize);
        // Incompressible data, different per slot.
        rng.fill_bytes(&mut buf);
        Slot {
            s,
            thread,
            rng,
            buf,
            res: SlotResult {
                read: histogram(),
                write: histogram(),
            },
        }
    }

    fn pick_block(&mut self) -> u64 {
        let s = &self.s;
        if s.w.random {
            return self.rng.random_range(0..s.blocks);
        }
        let threads = s.w.threads as u64;
        let stretch = (s.blocks / threads).max(1);
        let start = (self.thread as u64 * stretch) % s.blocks;
        let n = s.cursors[self.thread as usize].fetch_add(1, Ordering::Relaxed);
        (start + n % stretch) % s.blocks
    }

    /// The next I/O, or None when the run is over.
    fn next(&mut self) -> Option<Io> {
        if self.s.stop.load(Ordering::Acquire) {
            return None;
        }
        let write = self.rng.random_range(0..100u8) < self.s.w.write_percent;
        let mut block = self.pick_block();
        if let Some(v) = self.s.verifier.clone() {
            // One I/O per block at a time: find a free one.
            let mut tries = 0;
            while !v.claim(block) {
                tries += 1;
                if tries > 1_000_000 || self.s.stop.load(Ordering::Acquire) {
                    return None;
                }
                block = if self.s.w.random {
                    self.pick_block()
                } else {
                    (block + 1) % self.s.blocks
                };
            }
        }
        let offset = self.s.region.0 + block * self.s.w.block_size as u64;
        let mut gen = 0;
        if write {
            if let Some(v) = &self.s.verifier {
                gen = v.prepare_write(block, &mut self.buf);
            }
        }
        Some(Io {
            write,
            block,
            offset,
            gen,
        })
    }

    /// Records a finished I/O; false when the run must stop.
    fn done(&mut self, io: Io, result: Result<(), String>, took: Duration) -> bool {
        let s = &self.s;
        if let Some(v) = &s.verifier {
            match (&result, io.write) {
                (Ok(()), true) => v.written(io.block, io.gen),
                (Ok(()), false) => {
                    v.check(io.block, &self.buf);
                }
                (Err(_), true) => v.write_failed(io.block),
                (Err(_), false) => {}
            }
            v.release(io.block);
        }
        if let Err(e) = result {
            let what = if io.write { "write" } else { "read" };
            s.failure
                .lock()
                .get_or_insert_with(|| format!("{what} at byte {} failed: {e}", io.offset));
            s.stop.store(true, Ordering::Release);
            return false;
        }
        if s.measuring.load(Ordering::Acquire) && !s.stop.load(Ordering::Acquire) {
            let h = if io.write {
                &mut self.res.write
            } else {
                &mut self.res.read
            };
            h.saturating_record(took.as_nanos().max(1) as u64);
            s.done.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    fn finish(self) {
        self.s.results.lock().push(self.res);
    }
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn latency(h: &Histogram<u64>) -> Option<Latency> {
    if h.is_empty() {
        return None;
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    Some(Latency {
        min_us: us(h.min()),
        mean_us: h.mean() / 1000.0,
        p50_us: us(h.value_at_quantile(0.5)),
        p90_us: us(h.value_at_quantile(0.9)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        max_us: us(h.max()),
        stdev_us: h.stdev() / 1000.0,
    })
}

fn op_stats(h: &Histogram<u64>, block: u32, secs: f64) -> OpStats {
    let ops = h.len();
    let bytes = ops * block as u64;
    OpStats {
        ops,
        bytes,
        iops: ops as f64 / secs,
        mib_per_s: bytes as f64 / secs / (1 << 20) as f64,
        latency: latency(h),
    }
}

/// Runs `w` once on `t`. `verifier` (for verify mode) may be kept across runs: what one run
/// wrote, the next checks. `rt` runs network I/O.
pub fn run(
    t: &Target,
    w: &Workload,
    verifier: Option<Arc<Verifier>>,
    rt: &tokio::runtime::Handle,
    progress: Progress,
) -> Result<RunReport, String> {
    let region = w.region(t.size, t.block)?;
    let blocks = region.1 / w.block_size as u64;
    let inflight = (w.threads * w.outstanding) as u64;
    if let Some(v) = &verifier {
        if v.blocks() != blocks || v.block_size() != w.block_size as usize {
            return Err("the verifier was made for another region".into());
        }
        if blocks < 2 * inflight {
            return Err(format!(
                "--verify keeps one I/O per block: the region's {blocks} blocks need to be at least twice the {inflight} I/Os in flight"
            ));
        }
    }
    let s = Arc::new(Shared {
        w: w.clone(),
        region,
        blocks,
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        done: AtomicU64::new(0),
        cursors: (0..w.threads).map(|_| AtomicU64::new(0)).collect(),
        verifier: verifier.clone(),
        results: Mutex::new(Vec::new()),
        failure: Mutex::new(None),
    });
    let mut threads = Vec::new();
    let mut tasks = Vec::new();
    let through = w.write_through;
    for th in 0..w.threads {
        for o in 0..w.outstanding {
            let mut slot = Slot::new(s.clone(), th, (th * w.outstanding + o) as u64);
            match &t.io {
                Opened::Sync(io) => {
                    let io = io.clone();
                    threads.push(
                        std::thread::Builder::new()
                            .name("bench-io".into())
                            .spawn(move || {
                                while let Some(x) = slot.next() {
                                    let t0 = Instant::now();
                                    let r = if x.write {
                                        io.write(x.offset, &slot.buf, through)
                                    } else {
                                        io.read(x.offset, &mut slot.buf)
                                    };
                                    if !slot.done(x, r, t0.elapsed()) {
                                        break;
                                    }
                                }
                                slot.finish();
                            })
                            .map_err(|e| format!("cannot start an I/O thread: {e}"))?,
                    );
                }
                Opened::Nbd(clients) => {
                    let c = clients[th as usize].clone();
                    tasks.push(rt.spawn(async move {
                        while let Some(x) = slot.next() {
                            let t0 = Instant::now();
                            let r = if x.write {
                                c.write(x.offset, &slot.buf, through).await
                            } else {
                                c.read(x.offset, slot.buf.len() as u32).await.map(|d| {
                                    slot.buf.copy_from_slice(&d);
                                })
                            };
                            if !slot.done(x, r.map_err(|e| e.to_string()), t0.elapsed()) {
                                break;
                            }
                        }
                        slot.finish();
                    }));
                }
                Opened::Iscsi { sessions, lun } => {
                    let sess = sessions[th as usize % sessions.len()].clone();
                    let (lun, block) = (*lun, t.block);
                    tasks.push(rt.spawn(async move {
                        while let Some(x) = slot.next() {
                            let t0 = Instant::now();
                            let len = slot.buf.len();
                            let mut cdb = rw16(x.write, x.offset, len, block);
                            if x.write && through {
                                cdb[1] |= FUA;
                            }
                            // A unit attention (the I_T nexus loss that a session with this
                            // initiator name left, a capacity change) answers a command once
                            // and is gone: as an initiator does, ask again.
                            let mut attempts = 0;
                            let r = loop {
                                let r = if x.write {
                                    sess.command(lun, &cdb, slot.buf.to_vec(), 0).await
                                } else {
                                    sess.command(lun, &cdb, Vec::new(), len).await
                                };
                                attempts += 1;
                                match &r {
                                    Ok(a)
                                        if a.status == CHECK_CONDITION
                                            && a.sense_key().map(|k| k.0) == Some(UNIT_ATTENTION)
                                            && attempts < UNIT_ATTENTION_RETRIES => {}
                                    _ => break r,
                                }
                            };
                            let r = match r {
                                Ok(r) if r.status == 0 && (x.write || r.data.len() == len) => {
                                    if !x.write {
                                        slot.buf.copy_from_slice(&r.data);
                                    }
                                    Ok(())
                                }
                                Ok(r) => Err(format!(
                                    "status {:#x}, sense {:?}, {} bytes",
                                    r.status,
                                    r.sense_key(),
                                    r.data.len()
                                )),
                                Err(e) => Err(e.to_string()),
                            };
                            if !slot.done(x, r, t0.elapsed()) {
                                break;
                            }
                        }
                        slot.finish();
                    }));
                }
            }
        }
    }

    let pause = |d: Duration, t0: Option<Instant>| {
        let end = Instant::now() + d;
        while Instant::now() < end && !s.stop.load(Ordering::Acquire) {
            std::thread::sleep((end - Instant::now()).min(Duration::from_millis(250)));
            if let Some(t0) = t0 {
                progress(t0.elapsed().as_secs_f64(), s.done.load(Ordering::Relaxed));
            }
        }
    };
    pause(w.warmup, None);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    s.measuring.store(true, Ordering::Release);
    pause(w.duration, Some(t0));
    s.stop.store(true, Ordering::Release);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    for h in threads {
        let _ = h.join();
    }
    for task in tasks {
        let _ = rt.block_on(task);
    }
    if let Some(e) = s.failure.lock().take() {
        return Err(format!("{}: {e}", t.name));
    }
    let mut read = histogram();
    let mut write = histogram();
    for r in s.results.lock().iter() {
        read.add(&r.read).expect("same bounds");
        write.add(&r.write).expect("same bounds");
    }
    let mut all = read.clone();
    all.add(&write).expect("same bounds");
    let bs = w.block_size;
    Ok(RunReport {
        target: t.name.clone(),
        seconds: secs,
        total: op_stats(&all, bs, secs),
        read: op_stats(&read, bs, secs),
        write: op_stats(&write, bs, secs),
        cpu_percent: cpu / secs * 100.0,
        verify: verifier.map(|v| v.stats()),
    })
}

/// Mean and relative standard deviation (percent) of a series.
pub fn mean_rsd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 || mean == 0.0 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt() / mean * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsd() {
        assert_eq!(mean_rsd(&[10.0]), (10.0, 0.0));
        let (m, r) = mean_rsd(&[9.0, 10.0, 11.0]);
        assert_eq!(m, 10.0);
        assert!((r - 10.0).abs() < 1e-9, "{r}");
    }
}
