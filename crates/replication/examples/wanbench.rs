//! Replication's goodput across an emulated WAN against a plain TCP copy with cubic on the
//! same link in the same run, and the bytes an incremental cycle puts on the wire. Run by
//! bench/replication.sh; prints one JSON line.
//!
//!   wanbench wan --rate 100mbit --rtt 90ms --loss 1% [--seconds 20]
//!   wanbench incremental [--size-gib 4] [--changed 1%] [--write 4k|64k]

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_disk::{DiskRef, MemDisk};
use tessera_linkem::{measure, netns, parse_duration, parse_fraction, parse_rate, Link, Shape, Transfer, B_ADDR};
use tessera_replication::{receive, send, ReceiveOptions, ReplicaSite, Transport};
use tessera_volume::{Engine, LayoutKind, VdiskSpec};

#[path = "../tests/common/mod.rs"]
mod common;

use common::{noise, GRAIN, MIB};

struct BenchSite {
    dir: tempfile::TempDir,
    engine: Arc<Engine>,
}

impl ReplicaSite for BenchSite {
    fn engine(&self, _pool: &str) -> Result<Arc<Engine>, String> {
        Ok(self.engine.clone())
    }
    fn may_write(&self, _: &str, _: &str, _: bool) -> Result<(), String> {
        Ok(())
    }
}

/// Room for `bytes` and as much again as a fifth of it rewritten in part (copy on write of
/// whole grains under a snapshot); memory disks hold only what is written.
fn site(bytes: u64) -> BenchSite {
    let dir = tempfile::tempdir().unwrap();
    let disks: Vec<DiskRef> = (0..2)
        .map(|i| Arc::new(MemDisk::new(&format!("m{i}"), bytes / 10 * 6 + 256 * MIB)) as DiskRef)
        .collect();
    let engine = Engine::create_pool(&dir.path().join("pool"), "p", disks, 64 * MIB).unwrap();
    BenchSite {
        dir,
        engine: Arc::new(engine),
    }
}

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

/// A source vdisk of `bytes` (simple layout: the bench measures the wire, not the disks),
/// filled with noise, and its snapshot s1.
fn source(bytes: u64) -> BenchSite {
    let src = site(bytes);
    let mut spec = VdiskSpec::new("vol", bytes, LayoutKind::Simple);
    spec.grain_size = Some(GRAIN);
    let v = src.engine.create_vdisk(&spec).unwrap();
    for (k, at) in (0..bytes).step_by((64 * MIB) as usize).enumerate() {
        v.write(at, &noise(k as u64 + 1, (64 * MIB).min(bytes - at) as usize), false)
            .unwrap();
    }
    src.engine.snapshot("vol", "s1").unwrap();
    src
}

fn options(s: &BenchSite) -> ReceiveOptions {
    ReceiveOptions {
        layout: LayoutKind::Simple,
        cycles_dir: s.dir.path().join("cycles"),
        joins: Default::default(),
        opening: Default::default(),
        pace: Default::default(),
        identity: String::new(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("wan") => wan(&args),
        Some("incremental") => incremental(&args),
        _ => {
            eprintln!("usage: wanbench wan --rate R --rtt T --loss L [--seconds S] | incremental [--size-gib N] [--changed P] [--write 4k|64k]");
            std::process::exit(2);
        }
    }
}

fn wan(args: &[String]) {
    let rate = parse_rate(&arg(args, "--rate", "100mbit")).unwrap();
    let rtt = parse_duration(&arg(args, "--rtt", "90ms")).unwrap();
    let loss = parse_fraction(&arg(args, "--loss", "1%")).unwrap();
    let seconds: f64 = arg(args, "--seconds", "20").parse().unwrap();
    // As much data as the link carries in `seconds`, whole grains.
    let bytes = ((rate as f64 / 8.0 * seconds) as u64 / GRAIN).max(16) * GRAIN;
    let src = source(bytes);
    let dst = site(bytes);
    let mut shape = Shape::new(rate, rtt);
    shape.loss = loss;
    let link = Link::start(&format!("wb{}", std::process::id()), shape, shape).unwrap();
    let keys: HashMap<String, Vec<u8>> = [("bench".to_string(), vec![3u8; 32])].into();

    let (a, b) = (link.a.name.clone(), link.b.name.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let (sent, took) = std::thread::scope(|s| {
        let k = keys.clone();
        let dst = &dst;
        let receiver = s.spawn(move || {
            netns::enter(&b).unwrap();
            let l = TcpListener::bind((B_ADDR, 0)).unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            let (c, _) = l.accept().unwrap();
            let t = Transport::with_keys(k, "bbr", Duration::from_secs(60)).unwrap();
            receive(t.accept(c).unwrap(), dst, &options(dst)).unwrap()
        });
        let to = rx.recv().unwrap();
        let src = &src;
        let sender = s.spawn(move || {
            netns::enter(&a).unwrap();
            let t = Transport::with_keys(keys, "bbr", Duration::from_secs(60)).unwrap();
            let start = Instant::now();
            let conn = t.connect(&to.to_string()).unwrap();
            let newer = src.engine.vdisk("vol@s1").unwrap();
            let r = send(conn, &newer, None, "p", "vol", "s1").unwrap();
            (r, start.elapsed())
        });
        let out = sender.join().unwrap();
        receiver.join().unwrap();
        out
    });
    // The peer: one cubic stream across the same link, measured now.
    let cubic = measure(
        &link,
        &Transfer {
            streams: 1,
            congestion: "cubic".into(),
            warmup: Duration::from_secs(3),
            window: Duration::from_secs(10),
        },
    )
    .unwrap();
    let goodput = sent.sent_bytes as f64 * 8.0 / took.as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "rate_bps": rate, "rtt_ms": rtt.as_secs_f64() * 1000.0, "loss": loss,
            "data_bytes": sent.sent_bytes, "wire_bytes": sent.wire_bytes, "seconds": took.as_secs_f64(),
            "replication_bps": goodput, "replication_share": goodput / rate as f64,
            "cubic_bps": cubic.goodput_bps, "ratio": goodput / cubic.goodput_bps,
        })
    );
}

fn incremental(args: &[String]) {
    let size = arg(args, "--size-gib", "4").parse::<u64>().unwrap() << 30;
    let changed = parse_fraction(&arg(args, "--changed", "1%")).unwrap();
    let write: u64 = match arg(args, "--write", "64k").as_str() {
        "4k" => 4096,
        "64k" => 64 << 10,
        w => panic!("--write {w}: 4k or 64k"),
    };
    let src = source(size);
    let dst = site(size);
    let run = |base: Option<&str>, snap: &str| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = l.local_addr().unwrap();
        std::thread::scope(|s| {
            let dst = &dst;
            let r = s.spawn(move || {
                let (c, _) = l.accept().unwrap();
                receive(c.try_clone().unwrap(), dst, &options(dst)).unwrap()
            });
            let c = std::net::TcpStream::connect(to).unwrap();
            let newer = src.engine.vdisk(&format!("vol@{snap}")).unwrap();
            let b = base.map(|b| src.engine.vdisk(&format!("vol@{b}")).unwrap());
            let out = send(&c, &newer, b.as_deref().zip(base), "p", "vol", snap).unwrap();
            r.join().unwrap();
            out
        })
    };
    run(None, "s1");
    // Change `changed` of the vdisk in writes of `write` bytes at random aligned places
    // (distinct, so that the changed bytes are exactly counted).
    let v = src.engine.vdisk("vol").unwrap();
    let writes = (size as f64 * changed / write as f64) as u64;
    let slots = size / write;
    let mut x: u64 = 0x1234_5678;
    let mut seen = std::collections::HashSet::new();
    while (seen.len() as u64) < writes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let slot = x % slots;
        if seen.insert(slot) {
            v.write(slot * write, &noise(x, write as usize), false).unwrap();
        }
    }
    src.engine.snapshot("vol", "s2").unwrap();
    let r = run(Some("s1"), "s2");
    let changed_bytes = writes * write;
    println!(
        "{}",
        serde_json::json!({
            "size_bytes": size, "write_bytes": write, "changed_bytes": changed_bytes,
            "sent_bytes": r.sent_bytes, "wire_bytes": r.wire_bytes,
            "wire_over_changed": r.wire_bytes as f64 / changed_bytes as f64,
        })
    );
}
