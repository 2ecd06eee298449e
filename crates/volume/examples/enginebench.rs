//! Engine benchmark driver for bench/engine.sh: builds a pool on file disks, creates one vdisk,
//! fills it, and measures one workload through the engine (no network, no protocol). Prints a
//! JSON line per workload. Concurrency comes from threads doing synchronous I/O, one request
//! in flight each, so `--threads 32` is queue depth 32.
//!
//! With `--cache-disks N` the pool gets N cache disks (files in the same directory, so on the
//! same file system as the data disks, or in `--cache-dir DIR`, such as a faster device) and
//! the vdisk a write-back cache; a write workload then
//! also reports its rate while the cache had room and after it filled (the destage rate).
//! `--trace-ms 500` prints the rate and the cache's state every half second, to see when the
//! destager starts and whether writers stall. `--fua on` forces every write to stable storage
//! before it is answered (a flush each), the cost of flushes through the cache.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tessera_disk::{AlignedBuf, DiskRef, FileDisk};
use tessera_volume::{Engine, LayoutKind, Provisioning, VdiskSpec};

struct Args {
    dir: PathBuf,
    disks: usize,
    disk_size: u64,
    layout: LayoutKind,
    columns: Option<u32>,
    size: u64,
    threads: usize,
    seconds: u64,
    workloads: Vec<String>,
    checksums: bool,
    /// Block size of every workload (default: 4 KiB random, 256 KiB sequential).
    bs: Option<u64>,
    cache_disks: usize,
    cache_dir: Option<PathBuf>,
    cache_disk_size: u64,
    write_cache_size: Option<u64>,
    /// Print the rate and the cache's state to stderr every this many milliseconds (0: never).
    trace_ms: u64,
    /// Every write is forced to stable storage before it is answered (FUA), as a database's
    /// log writes or a VM's flushes ask: the cost of a flush through the cache.
    fua: bool,
}

fn parse() -> Args {
    let mut a = Args {
        dir: PathBuf::from("/tmp/tessera-bench"),
        disks: 4,
        disk_size: 3 << 30,
        layout: LayoutKind::Simple,
        columns: None,
        size: 2 << 30,
        threads: 32,
        seconds: 10,
        workloads: vec![
            "randread".into(),
            "randwrite".into(),
            "seqread".into(),
            "seqwrite".into(),
        ],
        checksums: true,
        bs: None,
        cache_disks: 0,
        cache_dir: None,
        cache_disk_size: 2 << 30,
        write_cache_size: None,
        trace_ms: 0,
        fua: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--dir" => a.dir = PathBuf::from(v),
            "--disks" => a.disks = v.parse().unwrap(),
            "--disk-size" => a.disk_size = v.parse().unwrap(),
            "--layout" => a.layout = LayoutKind::parse(&v).expect("layout: simple|mirror|parity|dual-parity"),
            "--columns" => a.columns = Some(v.parse().unwrap()),
            "--size" => a.size = v.parse().unwrap(),
            "--threads" => a.threads = v.parse().unwrap(),
            "--seconds" => a.seconds = v.parse().unwrap(),
            "--workloads" => a.workloads = v.split(',').map(String::from).collect(),
            "--checksums" => a.checksums = v == "on",
            "--bs" => a.bs = Some(v.parse().unwrap()),
            "--cache-disks" => a.cache_disks = v.parse().unwrap(),
            "--cache-dir" => a.cache_dir = Some(PathBuf::from(v)),
            "--cache-disk-size" => a.cache_disk_size = v.parse().unwrap(),
            "--write-cache-size" => a.write_cache_size = Some(v.parse().unwrap()),
            "--trace-ms" => a.trace_ms = v.parse().unwrap(),
            "--fua" => a.fua = v == "on",
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    a
}

fn main() {
    let a = parse();
    std::fs::create_dir_all(&a.dir).unwrap();
    let disks: Vec<DiskRef> = (0..a.disks)
        .map(|i| {
            Arc::new(FileDisk::create_file(a.dir.join(format!("disk{i}")), a.disk_size, false).unwrap()) as DiskRef
        })
        .collect();
    let engine =
        Engine::create_pool_with_checksums(&a.dir.join("pool"), "bench", disks, 256 << 20, a.checksums).unwrap();
    for i in 0..a.cache_disks {
        let d = FileDisk::create_file(
            a.cache_dir.as_ref().unwrap_or(&a.dir).join(format!("cache{i}")),
            a.cache_disk_size,
            false,
        )
        .unwrap();
        engine.add_cache_disk(Arc::new(d)).unwrap();
    }
    let mut spec = VdiskSpec::new("bench", a.size, a.layout);
    spec.write_cache_size = a.write_cache_size;
    spec.columns = a.columns;
    spec.provisioning = Provisioning::Thin;
    spec.block_size = Some(4096);
    let v = engine.create_vdisk(&spec).unwrap();
    eprintln!("{}: filling {} bytes", v.config().layout.describe(), a.size);
    run(&engine, &v, "fill", 256 << 10, a.threads.min(8), 0, a.size, 0, false);
    v.flush().unwrap();
    // Every workload starts with an empty cache.
    engine.cache().drain().unwrap();
    for w in &a.workloads {
        let bs = a.bs.unwrap_or(if w.starts_with("rand") { 4096 } else { 256 << 10 });
        let stats = &engine.layouts().stats;
        let rows_before = (
            stats.full_row_writes.load(Ordering::Relaxed),
            stats.partial_row_writes.load(Ordering::Relaxed),
        );
        let r = run(&engine, &v, w, bs, a.threads, a.seconds, a.size, a.trace_ms, a.fua);
        let (full, partial) = (
            stats.full_row_writes.load(Ordering::Relaxed) - rows_before.0,
            stats.partial_row_writes.load(Ordering::Relaxed) - rows_before.1,
        );
        let opt = |x: Option<f64>| x.map(|x| format!("{x:.0}")).unwrap_or_else(|| "null".into());
        println!(
            "{{\"layout\":\"{}\",\"workload\":\"{w}\",\"bs\":{bs},\"threads\":{},\"fua\":{},\"checksums\":{},\"cache_disks\":{},\"iops\":{:.0},\"mbs\":{:.1},\"iops_room\":{},\"iops_full\":{},\"room_seconds\":{},\"full_row_writes\":{full},\"partial_row_writes\":{partial},\"p99_us\":{},\"p999_us\":{},\"max_us\":{}}}",
            a.layout.as_str(),
            a.threads,
            a.fua,
            a.checksums,
            a.cache_disks,
            r.iops,
            r.mbs,
            opt(r.iops_room),
            opt(r.iops_full),
            opt(r.room_seconds),
            r.latency_us[0],
            r.latency_us[1],
            r.latency_us[2],
        );
        if a.cache_disks > 0 {
            eprintln!("{w}: {:?}", engine.cache_status());
        }
        engine.cache().drain().unwrap();
    }
    // Where the data landed, for the reference run of fio on the same files.
    let used: Vec<u64> = engine.pool().disks().iter().map(|d| d.used_bytes).collect();
    println!("{{\"used_per_disk\":{}}}", used.iter().max().copied().unwrap_or(0));
    drop(v);
    drop(engine);
}

struct Rates {
    iops: f64,
    mbs: f64,
    /// With a write-back cache: the rate until the first write had to wait for the destager,
    /// how long that took, and the rate after it.
    iops_room: Option<f64>,
    iops_full: Option<f64>,
    room_seconds: Option<f64>,
    /// Request latency in microseconds: 99th and 99.9th percentiles, and the longest.
    latency_us: [u64; 3],
}

/// Runs a workload for `seconds` (or, for "fill", once over the whole vdisk).
#[allow(clippy::too_many_arguments)]
fn run(
    engine: &Engine,
    v: &Arc<tessera_volume::Vdisk>,
    w: &str,
    bs: u64,
    threads: usize,
    seconds: u64,
    size: u64,
    trace_ms: u64,
    fua: bool,
) -> Rates {
    let ops = Arc::new(AtomicU64::new(0));
    let throttled_at_start = engine.cache_status().throttled_writes;
    // (seconds since start, operations done) when the cache first made a writer wait.
    let mut filled: Option<(f64, u64)> = None;
    let stop = Arc::new(AtomicBool::new(false));
    let cursor = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let latencies = std::sync::Mutex::new(Vec::<u32>::new());
    std::thread::scope(|s| {
        for t in 0..threads {
            let (ops, stop, cursor) = (ops.clone(), stop.clone(), cursor.clone());
            let v = v.clone();
            let w = w.to_string();
            let latencies = &latencies;
            s.spawn(move || {
                let mut took: Vec<u32> = Vec::new();
                let mut rng = rand::rng();
                let mut buf = AlignedBuf::zeroed(bs as usize);
                rng.fill(&mut buf[..]);
                buf[0] = t as u8;
                let blocks = size / bs;
                while !stop.load(Ordering::Relaxed) {
                    let off = match w.as_str() {
                        "randread" | "randwrite" => rng.random_range(0..blocks) * bs,
                        _ => {
                            let c = cursor.fetch_add(1, Ordering::Relaxed);
                            if w == "fill" && c >= blocks {
                                break;
                            }
                            (c % blocks) * bs
                        }
                    };
                    let began = Instant::now();
                    if w.ends_with("read") {
                        v.read(off, &mut buf).unwrap();
                    } else {
                        v.write(off, &buf, fua).unwrap();
                    }
                    took.push(began.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    ops.fetch_add(1, Ordering::Relaxed);
                }
                latencies.lock().unwrap().extend(took);
            });
        }
        if seconds > 0 {
            let end = start + Duration::from_secs(seconds);
            let mut last = (Instant::now(), 0u64);
            while Instant::now() < end {
                std::thread::sleep(Duration::from_millis(50));
                if trace_ms > 0 && last.0.elapsed() >= Duration::from_millis(trace_ms) {
                    let n = ops.load(Ordering::Relaxed);
                    let c = engine.cache_status();
                    eprintln!(
                        "t={:.1}s iops={:.0} dirty={}MiB log_used={}MiB destaged={}MiB throttled={}",
                        start.elapsed().as_secs_f64(),
                        (n - last.1) as f64 / last.0.elapsed().as_secs_f64(),
                        c.dirty_bytes >> 20,
                        c.log_used_bytes >> 20,
                        c.destaged_bytes >> 20,
                        c.throttled_writes
                    );
                    last = (Instant::now(), n);
                }
                if filled.is_none() && engine.cache_status().throttled_writes > throttled_at_start {
                    filled = Some((start.elapsed().as_secs_f64(), ops.load(Ordering::Relaxed)));
                }
            }
            stop.store(true, Ordering::Relaxed);
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let n = ops.load(Ordering::Relaxed);
    let cached = engine.cache().active() && w.ends_with("write");
    let (iops_room, iops_full, room_seconds) = match (cached, filled) {
        (false, _) => (None, None, None),
        (true, None) => (Some(n as f64 / secs), None, None),
        (true, Some((t, k))) => (Some(k as f64 / t), Some((n - k) as f64 / (secs - t)), Some(t)),
    };
    let mut took = latencies.into_inner().unwrap();
    took.sort_unstable();
    let at = |q: f64| {
        took.get(((took.len() as f64 * q) as usize).min(took.len().saturating_sub(1)))
            .copied()
    };
    Rates {
        latency_us: [at(0.99), at(0.999), took.last().copied()].map(|x| x.unwrap_or(0) as u64),
        iops: n as f64 / secs,
        mbs: n as f64 * bs as f64 / secs / 1e6,
        iops_room,
        iops_full,
        room_seconds,
    }
}
