//! Metadata scan benchmark driver for bench/scan.sh: a pool on sparse file disks with one
//! vdisk of small (4 KiB) grains mapped by a metadata-only fill (slots taken and counted as
//! writes would, no data written) and a second vdisk holding real data; then orphan slots
//! injected in bulk. It measures 4 KiB random reads on the data vdisk alone, then during the
//! scan, then during the spot-fix, and prints one JSON line.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tessera_disk::{AlignedBuf, DiskRef, FileDisk};
use tessera_volume::{Engine, FindingKind, LayoutKind, Progress, Provisioning, Vdisk, VdiskSpec};

struct Args {
    dir: PathBuf,
    grains: u64,
    orphans: u64,
    threads: usize,
    seconds: u64,
}

fn parse() -> Args {
    let mut a = Args {
        dir: PathBuf::from("/var/tmp/tessera-scanbench"),
        grains: 10_000_000,
        orphans: 1_000_000,
        threads: 16,
        seconds: 10,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--dir" => a.dir = PathBuf::from(v),
            "--grains" => a.grains = v.parse().unwrap(),
            "--orphans" => a.orphans = v.parse().unwrap(),
            "--threads" => a.threads = v.parse().unwrap(),
            "--seconds" => a.seconds = v.parse().unwrap(),
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    a
}

/// 4 KiB random reads over the whole vdisk from `threads` threads until `stop`.
struct Load {
    ops: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(v: &Arc<Vdisk>, threads: usize) -> Load {
        let ops = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..threads)
            .map(|_| {
                let (v, ops, stop) = (v.clone(), ops.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut rng = rand::rng();
                    let mut buf = AlignedBuf::zeroed(4096);
                    let blocks = v.size() / 4096;
                    while !stop.load(Ordering::Relaxed) {
                        v.read(rng.random_range(0..blocks) * 4096, &mut buf).unwrap();
                        ops.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Load { ops, stop, handles }
    }

    /// IOPS while `f` runs, and what it returned.
    fn during<T>(&self, f: impl FnOnce() -> T) -> (f64, f64, T) {
        let (n0, t0) = (self.ops.load(Ordering::Relaxed), Instant::now());
        let r = f();
        let secs = t0.elapsed().as_secs_f64();
        ((self.ops.load(Ordering::Relaxed) - n0) as f64 / secs, secs, r)
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            h.join().unwrap();
        }
    }
}

fn main() {
    let a = parse();
    std::fs::create_dir_all(&a.dir).unwrap();
    let slots = a.grains + a.orphans;
    // Sparse files: the small-grain vdisk's slabs are claimed, never written.
    let disk_size = (slots * 4096 / 4) * 5 / 4 + (8 << 30);
    let disks: Vec<DiskRef> = (0..4)
        .map(|i| Arc::new(FileDisk::create_file(a.dir.join(format!("disk{i}")), disk_size, false).unwrap()) as DiskRef)
        .collect();
    let engine = Engine::create_pool(&a.dir.join("pool"), "scanbench", disks, 256 << 20).unwrap();

    let mut spec = VdiskSpec::new("meta", a.grains * 4096, LayoutKind::Simple);
    spec.grain_size = Some(4096);
    spec.block_size = Some(4096);
    spec.provisioning = Provisioning::Thin;
    engine.create_vdisk(&spec).unwrap();
    let t = Instant::now();
    let mapped = engine.fill_metadata_only("meta", 0..a.grains).unwrap();
    let fill_secs = t.elapsed().as_secs_f64();
    eprintln!("mapped {mapped} grains without data in {fill_secs:.1}s");

    let mut spec = VdiskSpec::new("data", 1 << 30, LayoutKind::Mirror);
    spec.block_size = Some(4096);
    spec.provisioning = Provisioning::Thin;
    let data = engine.create_vdisk(&spec).unwrap();
    let mut buf = AlignedBuf::zeroed(1 << 20);
    rand::rng().fill(&mut buf[..]);
    for off in (0..data.size()).step_by(1 << 20) {
        data.write(off, &buf, false).unwrap();
    }
    data.flush().unwrap();

    let t = Instant::now();
    engine.damage_orphan_slots("meta", a.orphans).unwrap();
    eprintln!(
        "injected {} orphan slots in {:.1}s",
        a.orphans,
        t.elapsed().as_secs_f64()
    );
    // A settled store, as a pool that has been running is: the fill's merge operands folded.
    let t = Instant::now();
    let meta = engine.pool().meta();
    for cf in [tessera_pool::CF_GRAINS, tessera_pool::CF_REFCOUNTS] {
        meta.compact(cf);
    }
    eprintln!("compacted the metadata store in {:.1}s", t.elapsed().as_secs_f64());

    let load = Load::start(&data, a.threads);
    std::thread::sleep(Duration::from_secs(1));
    let (base_iops, _, ()) = load.during(|| std::thread::sleep(Duration::from_secs(a.seconds)));
    eprintln!("4K random reads alone: {base_iops:.0} IOPS");
    let (scan_iops, scan_secs, report) = load.during(|| engine.scan(&Progress::default()).unwrap());
    eprintln!(
        "scan: {} grains, {} findings in {scan_secs:.1}s; reads meanwhile {scan_iops:.0} IOPS",
        report.grains, report.findings
    );
    let orphans_found = report.by_kind.get(&FindingKind::OrphanSlot).copied().unwrap_or(0);
    let (fix_iops, fix_secs, fixed) = load.during(|| engine.spotfix(&Progress::default()).unwrap());
    eprintln!(
        "spot-fix: {} fixed in {fix_secs:.1}s; reads meanwhile {fix_iops:.0} IOPS",
        fixed.fixed
    );
    let (_, rescan_secs, again) = load.during(|| engine.scan(&Progress::default()).unwrap());
    let (after_iops, _, ()) = load.during(|| std::thread::sleep(Duration::from_secs(a.seconds)));
    load.stop();
    println!(
        "{{\"grains\":{},\"orphans\":{},\"fill_seconds\":{fill_secs:.1},\"base_iops\":{base_iops:.0},\"scan_seconds\":{scan_secs:.2},\"findings\":{},\"orphans_found\":{orphans_found},\"scan_iops\":{scan_iops:.0},\"spotfix_seconds\":{fix_secs:.2},\"fixed\":{},\"spotfix_iops\":{fix_iops:.0},\"rescan_seconds\":{rescan_secs:.2},\"rescan_findings\":{},\"after_iops\":{after_iops:.0}}}",
        report.grains, a.orphans, report.findings, fixed.fixed, again.findings
    );
    drop(data);
    drop(engine);
}
