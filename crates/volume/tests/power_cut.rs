//! Power cuts: the member disks have volatile write caches (`VolatileDisk`), and the power
//! goes off at a random write or flush, keeping a random subset of what each cache held,
//! tearing one write and losing the rest, on every disk at the same instant. A child process
//! runs four writers at once, one per layout (simple, mirror, parity, dual parity), each
//! writing (with and without FUA), flushing, trimming and cloning ranges from its own vdisk and
//! from a vdisk of the same layout whose grains it shares; the child exits at the cut. The
//! next child opens the pool (replaying the stripe journal, itself on volatile disks, so the
//! power may go again during the replay) and reports every block; the parent checks that each
//! block holds its last durable content (written with FUA, or flushed) or one of the values
//! written to it since, that the metadata check finds nothing, and that scrub finds the
//! redundancy in step with the data. At the end a disk is failed and everything read again.
//!
//! A fifth thread runs dedup over every vdisk the whole time, with a garbage collection every
//! fourth run (the work vdisks start with a copy of their base's first MiB, written apart, for
//! it to share), so cuts land in its compares, commits and collections too, and in the second
//! copies of shared slots that each run and collection keeps on the simple layout.
//!
//! The same runs again on a pool with the write-back cache: its log on two cache disks with
//! volatile caches too, cut while batches are written, flushed and destaged (the destage delay
//! is short in half the rounds, so cuts land in destages as well as in appends), and replayed
//! by the next open; and once more with the log's two disks missing at the restart after the
//! cut: what it held must then be refused as lost, never read as it was before.
//!
//! TESSERA_POWER_CUT_ROUNDS sets the number of cuts (default 24; `make soak` runs thousands).

mod common;

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::child::run_test_child;
use rand::{Rng, SeedableRng};
use tessera_disk::{DiskError, DiskRef, FileDisk, PowerSupply, VolatileDisk};
use tessera_volume::{
    DedupMode, DedupSettings, Engine, LayoutKind, PassOptions, Progress, Provisioning, RebuildOptions, VdiskSpec,
};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 2 * MIB;
const BLOCK: u64 = 4096;
const BLOCKS: usize = (SIZE / BLOCK) as usize;
/// One writer per layout, each on its own vdisk, sharing grains with a base vdisk of the
/// same layout that nobody writes after the setup.
const LAYOUTS: [(&str, LayoutKind, u32); 4] = [
    ("simple", LayoutKind::Simple, 2),
    ("mirror", LayoutKind::Mirror, 2),
    ("parity", LayoutKind::Parity, 3),
    ("dual", LayoutKind::DualParity, 4),
];

fn work_name(t: usize) -> String {
    format!("work-{}", LAYOUTS[t].0)
}

fn base_name(t: usize) -> String {
    format!("base-{}", LAYOUTS[t].0)
}

fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            ((offset + i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93))
                .rotate_right(29) as u8
        })
        .collect()
}

fn block_hash(b: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

fn block_hashes(data: &[u8]) -> Vec<u64> {
    data.chunks(BLOCK as usize).map(block_hash).collect()
}

#[derive(Debug, Clone)]
enum Action {
    Write {
        off: u64,
        len: u64,
        seed: u64,
        fua: bool,
    },
    Trim {
        off: u64,
        len: u64,
    },
    /// From the writer's own vdisk (`base` false) or its base vdisk.
    Clone {
        base: bool,
        so: u64,
        d_o: u64,
        len: u64,
    },
    Flush,
}

impl Action {
    fn encode(&self) -> String {
        match self {
            Action::Write { off, len, seed, fua } => format!("W {off} {len} {seed} {}", *fua as u8),
            Action::Trim { off, len } => format!("T {off} {len}"),
            Action::Clone { base, so, d_o, len } => format!("C {} {so} {d_o} {len}", *base as u8),
            Action::Flush => "F".into(),
        }
    }

    fn decode(s: &str) -> Action {
        let f: Vec<u64> = s.split(' ').skip(1).map(|x| x.parse().unwrap()).collect();
        match &s[..1] {
            "W" => Action::Write {
                off: f[0],
                len: f[1],
                seed: f[2],
                fua: f[3] == 1,
            },
            "T" => Action::Trim { off: f[0], len: f[1] },
            "C" => Action::Clone {
                base: f[0] == 1,
                so: f[1],
                d_o: f[2],
                len: f[3],
            },
            _ => Action::Flush,
        }
    }

    fn random(rng: &mut impl Rng, seed: u64) -> Action {
        let blocks = SIZE / BLOCK;
        let off = rng.random_range(0..blocks) * BLOCK;
        let len = rng.random_range(1..=(blocks - off / BLOCK).min(40)) * BLOCK;
        match rng.random_range(0..20) {
            0..=10 => Action::Write {
                off,
                len,
                seed,
                fua: rng.random_bool(0.5),
            },
            11..=12 => Action::Flush,
            13..=14 => Action::Trim { off, len },
            k => Action::Clone {
                base: k >= 18,
                so: rng.random_range(0..blocks - len / BLOCK + 1) * BLOCK,
                d_o: off,
                len,
            },
        }
    }

    fn run(&self, e: &Engine, t: usize) {
        let v = e.vdisk(&work_name(t)).unwrap();
        match *self {
            Action::Write { off, len, seed, fua } => v.write(off, &pattern(seed, off, len as usize), fua).unwrap(),
            Action::Trim { off, len } => v.trim(off, len).unwrap(),
            Action::Clone { base, so, d_o, len } => {
                let src = if base {
                    e.vdisk(&base_name(t)).unwrap()
                } else {
                    v.clone()
                };
                e.clone_range(&src, so, &v, d_o, len).unwrap();
            }
            Action::Flush => v.flush().unwrap(),
        }
    }
}

/// What each block of a writer's vdisk may hold after a cut.
struct Model {
    /// The content a read returns now, as hashes of blocks.
    current: Vec<u64>,
    /// Per block: its last durable content and every content written to it since.
    allowed: Vec<HashSet<u64>>,
}

impl Model {
    fn new(content: Vec<u64>) -> Model {
        Model {
            allowed: content.iter().map(|&h| HashSet::from([h])).collect(),
            current: content,
        }
    }

    /// An action starts: the blocks it writes may hold their new content from now on.
    fn begin(&mut self, a: &Action, base: &[u64]) {
        let (first, new): (u64, Vec<u64>) = match *a {
            Action::Write { off, len, seed, .. } => (off, block_hashes(&pattern(seed, off, len as usize))),
            Action::Trim { off, len } => (off, vec![block_hash(&[0u8; BLOCK as usize]); (len / BLOCK) as usize]),
            Action::Clone { base: b, so, d_o, len } => {
                let src = if b { base } else { &self.current[..] };
                let (s, n) = ((so / BLOCK) as usize, (len / BLOCK) as usize);
                (d_o, src[s..s + n].to_vec())
            }
            Action::Flush => return,
        };
        let first = (first / BLOCK) as usize;
        for (i, h) in new.into_iter().enumerate() {
            self.current[first + i] = h;
            self.allowed[first + i].insert(h);
        }
    }

    /// An action was acknowledged: what it made durable can no longer be lost.
    fn ack(&mut self, a: &Action) {
        let durable = match *a {
            Action::Write {
                off, len, fua: true, ..
            } => (off / BLOCK) as usize..((off + len) / BLOCK) as usize,
            Action::Flush => 0..BLOCKS,
            _ => return,
        };
        for b in durable {
            self.allowed[b] = HashSet::from([self.current[b]]);
        }
    }

    /// The content found after a cut is durable now.
    fn settle(&mut self, got: Vec<u64>) {
        *self = Model::new(got);
    }
}

fn volatile_opener(supply: &Arc<PowerSupply>) -> impl Fn(&str) -> Result<DiskRef, DiskError> + '_ {
    move |path: &str| Ok(VolatileDisk::new(Arc::new(FileDisk::open(path)?), supply) as DiskRef)
}

fn file_opener(path: &str) -> Result<DiskRef, DiskError> {
    Ok(Arc::new(FileDisk::open(path)?) as DiskRef)
}

/// Every vdisk's block hashes: each writer's vdisk, then its base.
fn dump(e: &Engine) -> Vec<Vec<u64>> {
    dump_from(e, 0)
}

/// The block hashes of the vdisks of the writers from `first` on.
fn dump_from(e: &Engine, first: usize) -> Vec<Vec<u64>> {
    (first..LAYOUTS.len())
        .flat_map(|t| [work_name(t), base_name(t)])
        .map(|n| {
            let mut b = vec![0u8; SIZE as usize];
            e.vdisk(&n).unwrap().read(0, &mut b).unwrap();
            block_hashes(&b)
        })
        .collect()
}

/// Problems the metadata check and scrub find, one line each, and any block checksum that did
/// not match since the pool was opened: a power cut must never leave one behind (on a mirror,
/// a read heals it from the other copy and scrub would find nothing).
fn problems(e: &Engine) -> Vec<String> {
    problems_since(e, 0)
}

/// Checksum mismatches counted so far (since the engine opened).
fn mismatches(e: &Engine) -> u64 {
    e.layouts()
        .stats
        .checksum_errors
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// [`problems`], counting only the checksum mismatches past `seen`.
fn problems_since(e: &Engine, seen: u64) -> Vec<String> {
    let mut out: Vec<String> = e.check().unwrap().problems.iter().map(|p| format!("{p:?}")).collect();
    let mismatched = mismatches(e) - seen;
    if mismatched > 0 {
        out.push(format!(
            "{mismatched} block(s) did not match their checksums after the power cut: {:?}",
            e.layouts().disk_errors()
        ));
    }
    for set in e.layouts().sets() {
        for bad in e.layouts().scrub_set(&set).unwrap() {
            out.push(format!("scrub: set {}: {bad:?}", set.id));
        }
    }
    out
}

/// The child: opens the pool on volatile disks (the power may go during the replay), reports
/// what it finds, then runs the writers until the power cut ends the process.
#[test]
#[ignore = "run by power_cuts as a child process"]
fn power_cut_child() {
    let Ok(dir) = std::env::var("TESSERA_POWER_DIR") else {
        return;
    };
    let seed: u64 = std::env::var("TESSERA_POWER_SEED").unwrap().parse().unwrap();
    let cut_after: u64 = std::env::var("TESSERA_POWER_CUT_AFTER").unwrap().parse().unwrap();
    // Counted from the start, or from the moment the writers start.
    let after_ready = std::env::var("TESSERA_POWER_CUT_AFTER_READY").is_ok();
    let supply = PowerSupply::new();
    let arm = || {
        supply.arm(cut_after, seed, |_| {
            // The process ends with the power: no destructor, no flush, nothing more on disk.
            unsafe { libc::_exit(0) }
        })
    };
    if !after_ready {
        arm();
    }
    let e = Engine::open(&Path::new(&dir).join("pool"), &volatile_opener(&supply)).unwrap();
    if let Ok(ms) = std::env::var("TESSERA_POWER_DESTAGE_MS") {
        e.cache().set_destage_delay(Duration::from_millis(ms.parse().unwrap()));
    }
    let out = std::io::stdout();
    writeln!(out.lock(), "OPENED {}", supply.ops()).unwrap();
    for (i, hashes) in dump(&e).into_iter().enumerate() {
        let hs: Vec<String> = hashes.iter().map(|h| h.to_string()).collect();
        writeln!(out.lock(), "DUMP {i} {}", hs.join(" ")).unwrap();
    }
    for p in problems(&e) {
        writeln!(out.lock(), "PROBLEM {p}").unwrap();
    }
    writeln!(out.lock(), "HOT {}", e.hot_copies().len()).unwrap();
    writeln!(out.lock(), "READY {}", supply.ops()).unwrap();
    if after_ready {
        arm();
    }
    std::thread::scope(|s| {
        let e = &e;
        s.spawn(move || {
            let opts = PassOptions {
                mode: DedupMode::Throughput,
                ignore_min_age: true,
                ..Default::default()
            };
            for i in 0u64.. {
                e.dedup_run(&opts, &Progress::default()).unwrap();
                if i % 4 == 3 {
                    e.dedup_gc(&Progress::default()).unwrap();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        for t in 0..LAYOUTS.len() {
            let out = &out;
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 16 + t as u64);
                for i in 0.. {
                    let a = Action::random(&mut rng, (seed * 16 + t as u64) * 1_000_000 + i);
                    writeln!(out.lock(), "BEGIN {t} {}", a.encode()).unwrap();
                    a.run(e, t);
                    writeln!(out.lock(), "ACK {t}").unwrap();
                    if t == 0 && i % 16 == 0 {
                        let c = e.cache_status();
                        writeln!(out.lock(), "CACHE {} {}", c.cached_bytes, c.destaged_bytes).unwrap();
                    }
                }
            });
        }
    });
}

fn setup(dir: &Path, cache: bool) -> Vec<Vec<u64>> {
    let disks: Vec<DiskRef> = (0..5)
        .map(|i| Arc::new(FileDisk::create_file(dir.join(format!("disk{i}")), 48 * MIB, false).unwrap()) as DiskRef)
        .collect();
    let e = Engine::create_pool(&dir.join("pool"), "power", disks, MIB).unwrap();
    if cache {
        for i in 0..2 {
            let d = FileDisk::create_file(dir.join(format!("cache{i}")), 66 * MIB, false).unwrap();
            e.add_cache_disk(Arc::new(d)).unwrap();
        }
    }
    for (t, &(_, kind, cols)) in LAYOUTS.iter().enumerate() {
        for name in [work_name(t), base_name(t)] {
            let mut s = VdiskSpec::new(&name, SIZE, kind);
            s.columns = Some(cols);
            s.interleave = Some(16 << 10);
            s.grain_size = Some(64 << 10);
            s.block_size = Some(4096);
            s.provisioning = Provisioning::Thin;
            e.create_vdisk(&s).unwrap();
        }
        // The base vdisk holds data everywhere but in a hole, for clones to share.
        let base = e.vdisk(&base_name(t)).unwrap();
        base.write(0, &pattern(1000 + t as u64, 0, SIZE as usize), false)
            .unwrap();
        base.trim(MIB, 256 << 10).unwrap();
        // The same bytes in the work vdisk, in slots of its own: for dedup to share.
        e.vdisk(&work_name(t))
            .unwrap()
            .write(0, &pattern(1000 + t as u64, 0, MIB as usize), false)
            .unwrap();
    }
    e.set_dedup_settings(DedupSettings {
        enabled: true,
        min_age_secs: 0,
        schedule_secs: 0,
        // Every slot shared at all on the simple layout is kept twice: cuts land in copies
        // made and dropped as clones, trims and dedup move the counts.
        hot_copy_refs: 1,
        ..Default::default()
    })
    .unwrap();
    e.flush().unwrap();
    let content = dump(&e);
    drop(e);
    content
}

/// One child's output.
#[derive(Default)]
struct Round {
    opened_ops: Option<u64>,
    ready_ops: Option<u64>,
    dumps: Vec<Vec<u64>>,
    problems: Vec<String>,
    /// Per writer: its actions and whether each was acknowledged.
    actions: Vec<Vec<(Action, bool)>>,
    /// The most the write-back cache reported having taken and destaged.
    cached_bytes: u64,
    destaged_bytes: u64,
    /// Second copies of shared slots the reopened pool holds.
    hot_copies: u64,
}

/// Runs a child whose power goes at its `cut_after`-th write or flush, counted from its start
/// or, with `after_ready`, from the moment its writers start.
fn run_child(dir: &Path, seed: u64, cut_after: u64, after_ready: bool) -> Round {
    let mut envs = vec![
        ("TESSERA_POWER_DIR", dir.display().to_string()),
        ("TESSERA_POWER_SEED", seed.to_string()),
        ("TESSERA_POWER_CUT_AFTER", cut_after.to_string()),
        (
            "TESSERA_POWER_DESTAGE_MS",
            if seed % 2 == 0 { "5" } else { "1000" }.to_string(),
        ),
    ];
    if after_ready {
        envs.push(("TESSERA_POWER_CUT_AFTER_READY", "1".to_string()));
    }
    let lines = run_test_child(
        "power_cut_child",
        &envs,
        &format!("seed {seed}, cut after {cut_after} I/Os"),
    );
    let mut r = Round {
        actions: vec![Vec::new(); LAYOUTS.len()],
        ..Round::default()
    };
    for l in &lines {
        // The harness may print "running 1 test" or "test power_cut_child ... " first.
        let Some(at) = [
            "OPENED ", "DUMP ", "PROBLEM ", "HOT ", "READY ", "BEGIN ", "ACK ", "CACHE ",
        ]
        .iter()
        .filter_map(|k| l.find(k))
        .min() else {
            continue;
        };
        let l = &l[at..];
        let (kind, rest) = l.split_once(' ').unwrap();
        match kind {
            "OPENED" => r.opened_ops = Some(rest.parse().unwrap()),
            "CACHE" => {
                let (c, d) = rest.split_once(' ').unwrap();
                r.cached_bytes = r.cached_bytes.max(c.parse().unwrap());
                r.destaged_bytes = r.destaged_bytes.max(d.parse().unwrap());
            }
            "READY" => r.ready_ops = Some(rest.parse().unwrap()),
            "HOT" => r.hot_copies = rest.parse().unwrap(),
            "PROBLEM" => r.problems.push(rest.to_string()),
            "DUMP" => r
                .dumps
                .push(rest.split(' ').skip(1).map(|h| h.parse().unwrap()).collect()),
            "BEGIN" => {
                let (t, a) = rest.split_once(' ').unwrap();
                r.actions[t.parse::<usize>().unwrap()].push((Action::decode(a), false));
            }
            _ => {
                let t: usize = rest.parse().unwrap();
                r.actions[t].last_mut().expect("ACK follows BEGIN").1 = true;
            }
        }
    }
    r
}

/// Checks what a reopened pool holds against the models, then takes it as durable.
fn verify(round: u64, models: &mut [Model], bases: &[Vec<u64>], dumps: &[Vec<u64>]) {
    for (t, model) in models.iter_mut().enumerate() {
        let (got, base) = (&dumps[2 * t], &dumps[2 * t + 1]);
        assert_eq!(base, &bases[t], "round {round}: {} changed", base_name(t));
        for (b, h) in got.iter().enumerate() {
            assert!(
                model.allowed[b].contains(h),
                "round {round}: {} block {b} holds content that was neither durable nor written since",
                work_name(t)
            );
        }
        model.settle(got.clone());
    }
}

#[test]
fn power_cuts() {
    cut_rounds(false);
}

#[test]
fn power_cuts_with_the_write_back_cache() {
    cut_rounds(true);
}

fn cut_rounds(cache: bool) {
    let rounds: u64 = std::env::var("TESSERA_POWER_CUT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let tmp = tempfile::tempdir_in(
        std::env::var("TESSERA_TEST_DIR").unwrap_or_else(|_| std::env::temp_dir().display().to_string()),
    )
    .unwrap();
    let dir = tmp.path();
    let content = setup(dir, cache);
    let bases: Vec<Vec<u64>> = (0..LAYOUTS.len()).map(|t| content[2 * t + 1].clone()).collect();
    let mut models: Vec<Model> = (0..LAYOUTS.len()).map(|t| Model::new(content[2 * t].clone())).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x0ff_c0ffee);
    // I/Os an open takes and a workload span, learned as the rounds go.
    let mut open_ops = 30u64;
    let (mut acked, mut during_open, mut cuts) = (0u64, 0u64, 0u64);
    let (mut cached, mut destaged, mut hot) = (0u64, 0u64, 0u64);
    for round in 0..rounds {
        let cut_after = if rng.random_ratio(1, 6) {
            rng.random_range(1..=open_ops)
        } else {
            open_ops + rng.random_range(1..=3000)
        };
        let r = run_child(dir, round + 1, cut_after, false);
        cuts += 1;
        let Some(ready) = r.ready_ops else {
            // The power went while the pool was opening (replaying the journal): nothing was
            // written by the writers, and the next open must cope with a replay cut short.
            during_open += 1;
            continue;
        };
        open_ops = ready.max(1);
        cached += r.cached_bytes;
        destaged += r.destaged_bytes;
        hot += r.hot_copies;
        assert_eq!(r.dumps.len(), 2 * LAYOUTS.len(), "round {round}: incomplete report");
        verify(round, &mut models, &bases, &r.dumps);
        assert!(
            r.problems.is_empty(),
            "round {round}: after recovery: {:#?}",
            r.problems
        );
        for (t, actions) in r.actions.iter().enumerate() {
            for (a, ok) in actions {
                models[t].begin(a, &bases[t]);
                if *ok {
                    models[t].ack(a);
                    acked += 1;
                }
            }
        }
    }
    eprintln!("{cuts} power cuts, {during_open} of them while the pool was opening; {acked} actions acknowledged; {cached} bytes cached, {destaged} destaged; {hot} copies of shared slots found at the opens");
    assert!(hot > 0, "no round found a second copy of a shared slot to check");
    if cache {
        assert!(
            cached > 0 && destaged > 0,
            "the write-back cache was not exercised: {cached} bytes cached, {destaged} destaged"
        );
    }
    assert!(
        acked > rounds,
        "the writers acknowledged only {acked} actions in {rounds} rounds"
    );

    // The last cut, recovered without volatile caches; then a disk is lost and every block
    // must read the same, rebuilt from the others where needed.
    let e = Engine::open(&dir.join("pool"), &file_opener).unwrap();
    if cache {
        assert_eq!(
            e.cache_status().devices.len(),
            2,
            "the log lost a disk: {:?}",
            e.cache_status()
        );
    }
    let dumps = dump(&e);
    verify(rounds, &mut models, &bases, &dumps);
    let p = problems(&e);
    assert!(p.is_empty(), "after the last recovery: {p:#?}");
    e.fail_disk(&dir.join("disk0").display().to_string()).unwrap();
    // The simple layout has no redundancy: its vdisks are lost with the disk.
    assert_eq!(
        dump_from(&e, 1),
        dumps[2..],
        "data read degraded differs from the data read healthy"
    );
}

/// Rounds of the tests that restart once after a cut with something missing.
fn restart_rounds() -> u64 {
    std::env::var("TESSERA_POWER_CUT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(10, |r: u64| (r / 2).max(1))
}

/// A new pool (with the write-back cache if `cache`) in a directory of its own, one child run
/// on it up to a cut after `cut_after` I/Os of its writers, and the writers' models as the
/// cut left them.
fn one_cut(cache: bool, seed: u64, cut_after: u64) -> (tempfile::TempDir, Vec<Model>) {
    let tmp = tempfile::tempdir_in(
        std::env::var("TESSERA_TEST_DIR").unwrap_or_else(|_| std::env::temp_dir().display().to_string()),
    )
    .unwrap();
    let content = setup(tmp.path(), cache);
    let bases: Vec<Vec<u64>> = (0..LAYOUTS.len()).map(|t| content[2 * t + 1].clone()).collect();
    let mut models: Vec<Model> = (0..LAYOUTS.len()).map(|t| Model::new(content[2 * t].clone())).collect();
    let r = run_child(tmp.path(), seed, cut_after, true);
    assert!(r.ready_ops.is_some(), "seed {seed}: the cut came before the writers");
    for (t, actions) in r.actions.iter().enumerate() {
        for (a, ok) in actions {
            models[t].begin(a, &bases[t]);
            if *ok {
                models[t].ack(a);
            }
        }
    }
    (tmp, models)
}

/// Reads every block of the work vdisks from the `first` layout on: each must read as its
/// model allows (its last durable content or something written since, never an older one),
/// or be refused, which `refusal(layout, error)` checks. Returns the blocks read and refused.
fn read_every_block(
    e: &Engine,
    models: &[Model],
    first: usize,
    what: &str,
    refusal: impl Fn(usize, &str),
) -> (u64, u64) {
    let (mut read, mut refused) = (0, 0);
    for t in first..LAYOUTS.len() {
        let v = e.vdisk(&work_name(t)).unwrap();
        for b in 0..BLOCKS {
            let mut buf = vec![0u8; BLOCK as usize];
            match v.read(b as u64 * BLOCK, &mut buf) {
                Ok(()) => {
                    read += 1;
                    assert!(
                        models[t].allowed[b].contains(&block_hash(&buf)),
                        "{what}: {} block {b} reads data it may not hold (older, or never written)",
                        work_name(t)
                    );
                }
                Err(err) => {
                    refusal(t, &err.to_string());
                    refused += 1;
                }
            }
        }
    }
    (read, refused)
}

/// A cut, then a restart with one disk missing: regions that were being written cannot be
/// resynced, so a parity row torn by the cut may hold parity that matches neither the old nor
/// the new data. Reading what lived on the missing disk must then fail, never return what
/// such parity rebuilds; mirrors resync from the copy left and read whole. At the start after,
/// the disk is back, and everything must read right.
#[test]
fn a_disk_missing_at_the_restart_after_a_cut_never_yields_wrong_data() {
    let rounds = restart_rounds();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xd15c_90e5);
    let (mut refused, mut checked, mut repaired, mut runtime_returns) = (0u64, 0u64, 0u64, 0u64);
    for round in 0..rounds {
        let (tmp, models) = one_cut(false, 1000 + round, rng.random_range(1..=3000));
        let dir = tmp.path();
        let missing = dir.join(format!("disk{}", round % 5)).display().to_string();
        let opener = |path: &str| -> Result<DiskRef, DiskError> {
            if path == missing {
                return Err(DiskError::Open {
                    path: path.into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            }
            file_opener(path)
        };
        let e = Engine::open(&dir.join("pool"), &opener).unwrap();
        let mut check_reads = |stage: &str| {
            let what = format!("round {round}, {stage}, {missing} missing");
            // The simple layout has nothing to read around a missing disk.
            let (read, not) = read_every_block(&e, &models, 1, &what, |t, err| {
                assert_ne!(
                    LAYOUTS[t].1,
                    LayoutKind::Mirror,
                    "{what}: a mirror reads around a missing disk: {err}"
                );
                assert!(
                    err.contains("could not be made consistent at the restart"),
                    "{what}: {err}"
                );
            });
            checked += read;
            refused += not;
        };
        check_reads("before the repair");
        // A repair rebuilds what it can onto the disk left (never from unsynced parity): what
        // it rebuilt must read right too.
        match e.repair(&RebuildOptions::default(), &Progress::default()) {
            Ok(report) => {
                repaired += report.slabs_rebuilt as u64;
                for (set, why) in &report.failures {
                    // The simple layout's sets have nothing to rebuild from.
                    assert!(
                        why.contains("could not be made consistent at the restart")
                            || why.contains("a simple layout has no redundancy"),
                        "round {round}: set {set}: {why}"
                    );
                }
            }
            Err(err) => panic!("round {round}: repair: {err}"),
        }
        check_reads("after the repair");
        // The disk is back, at the next start or (every other round) while the pool runs
        // (unless an update kept at the start waits for it, which only a start applies):
        // taken back as it was where nothing went around it (the sets the repair could not
        // rebuild, the simple layout's), stale and resynced where a replay went around it.
        // Every block now reads as its model allows, the simple layout's too, and the regions
        // left unsynced are settled with it.
        // Mismatches read while the disk was away (a block the cut tore, read around) are
        // not the return's: a new engine starts its count from 0, a running one goes on.
        let seen = mismatches(&e);
        let back_while_running = round % 2 == 1 && e.bring_back_disk(&missing, file_opener(&missing).unwrap()).is_ok();
        let (e, seen) = if back_while_running {
            runtime_returns += 1;
            (e, seen)
        } else {
            drop(e);
            (Engine::open(&dir.join("pool"), &file_opener).unwrap(), 0)
        };
        for stage in ["with the disk back", "after a repair with the disk back"] {
            if stage.starts_with("after") {
                let report = e.repair(&RebuildOptions::default(), &Progress::default()).unwrap();
                assert!(report.failures.is_empty(), "round {round}: {:?}", report.failures);
                assert!(e.layouts().repair_needed().0.is_empty(), "round {round}");
            }
            let what = format!("round {round}, {stage}");
            let (read, _) = read_every_block(&e, &models, 0, &what, |t, err| {
                panic!("{what}: {} refused a read: {err}", work_name(t))
            });
            checked += read;
        }
        let p = problems_since(&e, seen);
        assert!(p.is_empty(), "round {round}: {p:?}");
    }
    eprintln!(
        "{checked} blocks read right, {refused} refused as unsynced; {repaired} slabs rebuilt; \
         {runtime_returns} of {rounds} disks taken back while the pool ran"
    );
}

/// A cut, then a restart with both disks of the write-back log missing, given up (an import
/// without them is refused unless told to, `without_log`): what the log held is gone, and
/// the pool's record of it says which writes those were. Every block must read as its last
/// durable content or something written since, or be refused as lost with the log; never an
/// older content (a write the log had acknowledged as durable, read as before it).
#[test]
fn the_write_back_log_missing_at_the_restart_after_a_cut_never_yields_older_data() {
    let rounds = restart_rounds();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x106_90e5);
    let (mut refused, mut checked) = (0u64, 0u64);
    for round in 0..rounds {
        // Odd seeds: data waits a second in the log before it is destaged; even: 5 ms.
        let (tmp, models) = one_cut(true, 2000 + round, rng.random_range(1..=3000));
        let dir = tmp.path();
        let opener = |path: &str| -> Result<DiskRef, DiskError> {
            if path.contains("/cache") {
                return Err(DiskError::Open {
                    path: path.into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            }
            file_opener(path)
        };
        let err = Engine::open(&dir.join("pool"), &opener)
            .err()
            .expect("opened without its log");
        assert!(err.to_string().contains("--without-log"), "round {round}: {err}");
        let options = tessera_volume::ImportOptions {
            without_log: true,
            ..Default::default()
        };
        let e = Engine::open_with_options(&dir.join("pool"), &opener, options).unwrap();
        assert!(
            e.cache_status().devices.is_empty(),
            "round {round}: the log found its disks"
        );
        let what = format!("round {round}, the write-back log missing");
        let (read, not) = read_every_block(&e, &models, 0, &what, |t, err| {
            assert!(err.contains("is lost:"), "{what}: {}: {err}", work_name(t));
        });
        checked += read;
        refused += not;
        let p = problems(&e);
        assert!(p.is_empty(), "round {round}: {p:#?}");
    }
    eprintln!("{checked} blocks read right, {refused} refused as lost with the write-back log");
    assert!(refused > 0, "no round had the log hold anything at the cut");
}
