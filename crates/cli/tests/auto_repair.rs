//! Repair that starts by itself: a disk failed under load is rebuilt with no command typed, a
//! missing disk gets its delay first, and a pool switched off waits for the administrator.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tessera_bench::target::rw16;
use tessera_iscsi::initiator::Session;

const MIB: u64 = 1 << 20;
const VDISK: u64 = 64 * MIB;
const BLOCK: usize = 64 << 10;

fn start(t: &std::path::Path, delay: &str) -> Daemon {
    Daemon::start_configured(&t.join("state"), &format!("auto_repair_delay = \"{delay}\"\n"))
}

/// Waits until the pool is healthy with nothing left to repair.
fn wait_healthy(d: &Daemon, pool: &str, limit: Duration) -> Value {
    let t = Instant::now();
    loop {
        let p = d.json(&["pool", "show", pool]);
        if p["health"] == "healthy" && p["repair_needed_bytes"] == 0 {
            return p;
        }
        assert!(
            t.elapsed() < limit,
            "pool {pool} not repaired by itself: {p}\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Exports `vdisk` and asserts it holds `model` (else fails with `what`), and that its pool's
/// metadata check finds nothing.
fn assert_exported_as(d: &Daemon, dir: &std::path::Path, vdisk: &str, model: &[u8], what: &str) {
    let out = dir.join("out.img");
    d.ok(&["vdisk", "export", vdisk, out.to_str().unwrap(), "--overwrite"]);
    assert!(std::fs::read(&out).unwrap() == model, "{what}");
    let pool = vdisk.split('/').next().unwrap();
    let check = d.json(&["pool", "check", pool]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
}

fn repair_jobs(d: &Daemon) -> Vec<Value> {
    d.json(&["job", "list"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["kind"] == "repair")
        .cloned()
        .collect()
}

#[test]
fn a_disk_failed_under_load_is_rebuilt_with_no_command_typed() {
    let t = tempfile::tempdir().unwrap();
    let d = start(t.path(), "5m");
    create_pool(&d, "a", &disks(&t.path().join("disks"), 5, 512 * MIB));
    let img = t.path().join("in.img");
    random_image(&img, VDISK, 7);
    for (v, layout) in [
        ("a/m", ["--layout", "mirror", "--columns", "1"]),
        ("a/q", ["--layout", "parity", "--columns", "3"]),
    ] {
        let mut args = vec!["vdisk", "import", v, img.to_str().unwrap()];
        args.extend(layout);
        d.ok(&args);
    }
    assert_eq!(d.json(&["pool", "show", "a"])["auto_repair"]["enabled"], true);
    assert!(d.ok(&["pool", "show", "a"]).contains("auto repair:"));
    let iqn = "iqn.2026-11.io.tessera:auto";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "a/m", "--lun", "0"]);
    d.ok(&["target", "lun", "add", iqn, "a/q", "--lun", "1"]);

    // Writers on both LUNs keep a model of what each 64 KiB block must hold.
    let original = std::fs::read(&img).unwrap();
    let models: Arc<Vec<Mutex<Vec<u8>>>> = Arc::new((0..2).map(|_| Mutex::new(original.clone())).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let portal = d.iscsi_portal();
    let writers: Vec<_> = (0..2u64)
        .map(|lun| {
            let (models, stop, acked, portal) = (models.clone(), stop.clone(), acked.clone(), portal.clone());
            std::thread::spawn(move || {
                let (rt, s) = iscsi_host(&portal, iqn, &format!("iqn.2026-11.io.example:writer{lun}"));
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + lun);
                let mut ua_left = 8;
                while !stop.load(Ordering::Relaxed) {
                    let at = rng.random_range(0..VDISK / BLOCK as u64) * BLOCK as u64;
                    let mut data = vec![0u8; BLOCK];
                    rng.fill(&mut data[..]);
                    let cdb = rw16(true, at, BLOCK, 512);
                    let r = rt.block_on(s.command(lun, &cdb, data.clone(), 0)).unwrap();
                    if r.status == 2 && r.sense.get(2).map(|k| k & 0x0F) == Some(6) && ua_left > 0 {
                        ua_left -= 1;
                        continue;
                    }
                    assert_eq!(r.status, 0, "write to LUN {lun} at {at} failed: sense {:02x?}", r.sense);
                    models[lun as usize].lock().unwrap()[at as usize..at as usize + BLOCK].copy_from_slice(&data);
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let wait_acks = |n: u64| {
        let t = Instant::now();
        let start = acked.load(Ordering::Relaxed);
        while acked.load(Ordering::Relaxed) < start + n {
            assert!(t.elapsed() < Duration::from_secs(60), "the writers stopped");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_acks(50);

    // A hot spare stands by.
    let spare = disks(&t.path().join("spare"), 1, 512 * MIB).remove(0);
    assert_eq!(d.json(&["disk", "add", "a", &spare, "--spare"])["state"], "spare");
    assert!(
        d.json(&["pool", "show", "a"])["capacity"]["spare_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );

    // The disk fails (the administrator's fail stands in for the hardware): nobody types repair.
    let victim = busiest_disk(&d, "a");
    assert_eq!(d.json(&["disk", "fail", "a", &victim])["state"], "failed");
    wait_acks(50);
    let p = wait_healthy(&d, "a", Duration::from_secs(180));
    wait_acks(50);
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let jobs = repair_jobs(&d);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["state"], "succeeded", "{jobs:?}");
    assert!(d.logs().contains("repair started by itself"), "{}", d.logs());
    assert!(p["unhealthy_sets"].as_array().unwrap().is_empty(), "{p}");
    let failed = d.json(&["disk", "list", "a"]);
    let failed = failed
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == victim.as_str())
        .unwrap();
    assert_eq!(failed["slabs_used"], 0, "{failed}");
    let list = d.json(&["disk", "list", "a"]);
    let taken = list
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == spare.as_str())
        .unwrap();
    assert_eq!(
        taken["state"], "healthy",
        "the spare took the failed disk's place: {taken}"
    );
    assert!(taken["slabs_used"].as_u64().unwrap() > 0, "{taken}");

    // The data is exact: every write acknowledged before, during and after the repair.
    let out = t.path().join("out.img");
    for (i, v) in ["a/m", "a/q"].iter().enumerate() {
        d.ok(&["vdisk", "export", v, out.to_str().unwrap(), "--overwrite"]);
        let back = std::fs::read(&out).unwrap();
        assert!(
            back == *models[i].lock().unwrap(),
            "{v} differs after the automatic repair"
        );
    }
    assert!(d.json(&["pool", "check", "a"])["problems"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// A daemon in `t` with pool `b` on `n` disks and a mirror vdisk `b/m` imported from a random
/// image (`seed`), stopped: the daemon, the image, and the disk holding the most.
fn mirror_pool_stopped(t: &std::path::Path, delay: &str, n: usize, seed: u64) -> (Daemon, std::path::PathBuf, String) {
    let mut d = start(t, delay);
    let members = disks(&t.join("disks"), n, 512 * MIB);
    create_pool(&d, "b", &members);
    let img = t.join("in.img");
    random_image(&img, VDISK, seed);
    d.ok(&[
        "vdisk",
        "import",
        "b/m",
        img.to_str().unwrap(),
        "--layout",
        "mirror",
        "--columns",
        "1",
    ]);
    let victim = busiest_disk(&d, "b");
    d.stop();
    (d, img, victim)
}

#[test]
fn a_missing_disk_gets_its_delay_and_a_pool_switched_off_waits() {
    let t = tempfile::tempdir().unwrap();
    let (_, img, victim) = mirror_pool_stopped(t.path(), "4s", 4, 8);

    // The disk is gone at start: the pool waits for it, then repairs by itself.
    let moved = format!("{victim}.away");
    std::fs::rename(&victim, &moved).unwrap();
    // (Ten seconds: long enough that a busy machine's start and three commands fit in it.)
    let mut d2 = start(t.path(), "10s");
    let p = d2.json(&["pool", "show", "b"]);
    assert_eq!(p["health"], "degraded", "{p}");
    let status = p["auto_repair"]["status"].as_str().unwrap_or_default().to_string();
    assert!(status.contains("is missing; repair starts by itself in"), "{p}");
    assert!(repair_jobs(&d2).is_empty(), "a repair started before the delay");
    wait_healthy(&d2, "b", Duration::from_secs(120));
    assert_eq!(repair_jobs(&d2).len(), 1);
    let out = t.path().join("out.img");
    d2.ok(&["vdisk", "export", "b/m", out.to_str().unwrap()]);
    assert!(same_file(&img, &out));

    // Switched off for the pool (and kept across a restart): a failed disk waits.
    let shown = d2.ok(&["pool", "auto-repair", "b", "off"]);
    assert!(shown.contains("automatic repair off"), "{shown}");
    d2.stop();
    let d = start(t.path(), "4s");
    assert_eq!(d.json(&["pool", "show", "b"])["auto_repair"]["enabled"], false);
    let next = busiest_disk(&d, "b");
    d.ok(&["disk", "fail", "b", &next]);
    std::thread::sleep(Duration::from_secs(6));
    assert!(repair_jobs(&d).is_empty(), "a repair started on a pool switched off");
    let p = d.json(&["pool", "show", "b"]);
    assert_eq!(p["health"], "degraded");
    assert!(
        p["auto_repair"]["status"]
            .as_str()
            .unwrap()
            .contains("off for this pool"),
        "{p}"
    );

    // The administrator's repair, slowed down; asked again, the command follows the running one.
    let started = d.json(&["pool", "repair", "b", "--rate", "16M", "--no-wait"]);
    let again = d.cli(&["pool", "repair", "b"]);
    assert!(again.success, "{}", again.stderr);
    assert!(
        again
            .stderr
            .contains(&format!("already running as job {}; following it", started["id"])),
        "{}",
        again.stderr
    );
    assert!(again.stdout.contains("succeeded"), "{}", again.stdout);
    assert_eq!(repair_jobs(&d).len(), 1, "one repair, followed twice");
    wait_healthy(&d, "b", Duration::from_secs(60));
    assert!(d.fails(&["pool", "auto-repair", "nopool", "on"]).contains("nopool"));
    assert!(d.fails(&["pool", "auto-repair", "b", "maybe"]).contains("maybe"));
}

/// How long `pool show` says the automatic repair of `pool` waits for a disk, once it says so.
fn repair_starts_in(d: &Daemon, pool: &str) -> Duration {
    let t = Instant::now();
    loop {
        let p = d.json(&["pool", "show", pool]);
        let status = p["auto_repair"]["status"].as_str().unwrap_or_default().to_string();
        if let Some((_, rest)) = status.split_once("repair starts by itself in ") {
            let (left, _) = rest.split_once(" unless").expect("a status with its condition");
            let words: Vec<&str> = left.split(' ').collect();
            return words.chunks(2).fold(Duration::ZERO, |sum, w| {
                let n: u64 = w[0].parse().unwrap_or_else(|_| panic!("{status}"));
                sum + Duration::from_secs(match w[1] {
                    "h" => n * 3600,
                    "min" => n * 60,
                    "s" => n,
                    _ => panic!("{status}"),
                })
            });
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no delay shown: {p}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The time a daemon saw a missing disk out counts towards its delay across restarts: one
/// restarted more often than the delay (a crash loop, upgrades) still repairs.
#[test]
fn a_restart_goes_on_counting_a_missing_disks_delay() {
    let t = tempfile::tempdir().unwrap();
    let (_, _, victim) = mirror_pool_stopped(t.path(), "10m", 3, 9);
    std::fs::rename(&victim, format!("{victim}.away")).unwrap();

    let mut d = start(t.path(), "10m");
    let first = repair_starts_in(&d, "b");
    assert!(first <= Duration::from_secs(600), "{first:?}");
    std::thread::sleep(Duration::from_secs(12));
    d.stop();
    let d = start(t.path(), "10m");
    let after_restart = repair_starts_in(&d, "b");
    // Twelve seconds and more went by, of which the record keeps ten (it keeps steps of ten,
    // and the status rounds down).
    assert!(
        after_restart + Duration::from_secs(8) <= first,
        "the delay started again at the restart: {first:?}, then {after_restart:?}"
    );
    assert!(repair_jobs(&d).is_empty(), "a repair started before the delay");
}

/// 16 random 4 KiB blocks, one in each sixteenth of the vdisk, written by `host` to LUN 0,
/// and into `model`.
fn write_all_over(host: &(tokio::runtime::Runtime, Session), model: &mut [u8], rng: &mut rand::rngs::StdRng) {
    let (rt, s) = host;
    for i in 0..16u64 {
        let at = i * (VDISK / 16) + rng.random_range(0..16) * BLOCK as u64;
        let mut data = vec![0u8; BLOCK];
        rng.fill(&mut data[..]);
        let r = rt
            .block_on(s.command(0, &rw16(true, at, BLOCK, 512), data.clone(), 0))
            .unwrap();
        assert_eq!(r.status, 0, "write at {at}: sense {:02x?}", r.sense);
        model[at as usize..at as usize + BLOCK].copy_from_slice(&data);
    }
}

/// Pool `c` on three disks, the mirror vdisk `c/m` imported from a random image (`seed`) and
/// presented as LUN 0 of target `iqn`, the daemon stopped: the image, and the disk that holds
/// the most of it.
fn mirror_behind_a_lun(dir: &std::path::Path, seed: u64, iqn: &str) -> (std::path::PathBuf, String) {
    let mut d = start(dir, "5m");
    create_pool(&d, "c", &disks(&dir.join("disks"), 3, 512 * MIB));
    let img = dir.join("in.img");
    random_image(&img, VDISK, seed);
    d.ok(&[
        "vdisk",
        "import",
        "c/m",
        img.to_str().unwrap(),
        "--layout",
        "mirror",
        "--columns",
        "1",
    ]);
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "c/m", "--lun", "0"]);
    let victim = busiest_disk(&d, "c");
    d.stop();
    (img, victim)
}

/// A disk absent at one start and back at the next is taken back as it was: the slab sets
/// written around it meanwhile are resynced where they are, at once and by themselves (no
/// delay to wait, no free space needed), and the rest is as current as the day it left.
#[test]
fn a_disk_back_is_resynced_where_it_missed_writes_with_no_command_typed() {
    let t = tempfile::tempdir().unwrap();
    let iqn = "iqn.2026-12.io.tessera:back";
    let (img, victim) = mirror_behind_a_lun(t.path(), 9, iqn);

    let moved = format!("{victim}.away");
    std::fs::rename(&victim, &moved).unwrap();
    let mut d = start(t.path(), "5m");
    assert_eq!(d.json(&["pool", "show", "c"])["health"], "degraded");
    // Blocks written all over the vdisk while the disk is away.
    let mut model = std::fs::read(&img).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    write_all_over(
        &iscsi_host(&d.iscsi_portal(), iqn, "iqn.2026-12.io.example:host"),
        &mut model,
        &mut rng,
    );
    d.stop();

    std::fs::rename(&moved, &victim).unwrap();
    let d = start(t.path(), "5m");
    let back = d.json(&["disk", "list", "c"]);
    let back = back
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == victim.as_str())
        .unwrap();
    assert_eq!(back["state"], "healthy", "{back}");
    wait_healthy(&d, "c", Duration::from_secs(120));
    let jobs = repair_jobs(&d);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(
        d.logs().contains("missed writes while their disk was away"),
        "{}",
        d.logs()
    );
    assert_exported_as(&d, t.path(), "c/m", &model, "the vdisk differs after the resync");
}

/// The same disk back while the daemon runs: one command takes it back (no restart, no
/// outage of the pool), and the daemon resyncs by itself only what was written around it.
#[test]
fn a_disk_back_while_the_daemon_runs_is_taken_back_with_one_command() {
    let t = tempfile::tempdir().unwrap();
    let iqn = "iqn.2026-12.io.tessera:online";
    let (img, victim) = mirror_behind_a_lun(t.path(), 10, iqn);

    let moved = format!("{victim}.away");
    std::fs::rename(&victim, &moved).unwrap();
    let d = start(t.path(), "5m");
    let err = d.fails(&["disk", "online", "c", &victim]);
    assert!(err.contains("cannot open disk"), "{err}");
    let mut model = std::fs::read(&img).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(10);
    let h = iscsi_host(&d.iscsi_portal(), iqn, "iqn.2026-12.io.example:host");
    write_all_over(&h, &mut model, &mut rng);
    std::fs::rename(&moved, &victim).unwrap();
    let out = d.ok(&["disk", "online", "c", &victim]);
    assert!(out.contains("taken back") && out.contains("healthy"), "{out}");
    // The host goes on writing meanwhile.
    write_all_over(&h, &mut model, &mut rng);
    drop(h);
    wait_healthy(&d, "c", Duration::from_secs(120));
    let jobs = repair_jobs(&d);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_exported_as(&d, t.path(), "c/m", &model, "the vdisk differs after the resync");
}

/// What the write-back log held for a vdisk without redundancy when the daemon died, one of
/// its two disks missing at the next start: kept (not lost, nor read as the disk that is there
/// holds it: half of it lies there), said so by `pool show`, refused to the host, and written
/// to the vdisk by `disk online`.
#[test]
fn writes_the_log_held_for_a_disk_missing_at_the_start_wait_for_disk_online() {
    let t = tempfile::tempdir().unwrap();
    let iqn = "iqn.2026-12.io.tessera:parked";
    let mut d = start(t.path(), "5m");
    let all = disks(&t.path().join("disks"), 4, 512 * MIB);
    create_pool(&d, "c", &all[..2]);
    // Two copies of the log: a log of one is destaged at once.
    for cache in &all[2..] {
        d.ok(&["disk", "add", "c", cache, "--usage", "cache"]);
    }
    let img = t.path().join("in.img");
    random_image(&img, VDISK, 11);
    d.ok(&[
        "vdisk",
        "import",
        "c/s",
        img.to_str().unwrap(),
        "--layout",
        "simple",
        "--columns",
        "2",
    ]);
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "c/s", "--lun", "0"]);
    let dirty = |d: &Daemon| d.json(&["pool", "show", "c"])["cache"]["dirty_bytes"].as_u64().unwrap();
    // The import destaged first: the log then holds only the host's writes.
    let waited = Instant::now();
    while dirty(&d) > 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "the import's data is not destaged"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let victim = busiest_disk(&d, "c");
    let mut model = std::fs::read(&img).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let h = iscsi_host(&d.iscsi_portal(), iqn, "iqn.2026-12.io.example:host");
    write_all_over(&h, &mut model, &mut rng);
    let sync = [0x35u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(h.0.block_on(h.1.command(0, &sync, Vec::new(), 0)).unwrap().status, 0);
    drop(h);
    // In the log only (destaged after ten seconds): the power goes now.
    assert_eq!(dirty(&d), 16 * BLOCK as u64, "the writes are no longer only in the log");
    d.kill9();

    let moved = format!("{victim}.away");
    std::fs::rename(&victim, &moved).unwrap();
    let d = start(t.path(), "5m");
    let show = d.json(&["pool", "show", "c"]);
    assert_eq!(show["cache"]["parked_bytes"], 16 * BLOCK as u64, "{show}");
    assert_eq!(show["cache"]["lost_bytes"], 0, "{show}");
    let text = d.ok(&["pool", "show", "c"]);
    assert!(text.contains("WAITING") && text.contains("disk online"), "{text}");
    let h = iscsi_host(&d.iscsi_portal(), iqn, "iqn.2026-12.io.example:host");
    let read = |h: &(tokio::runtime::Runtime, Session), at: u64| {
        h.0.block_on(h.1.command(0, &rw16(false, at, BLOCK, 512), Vec::new(), BLOCK))
            .unwrap()
    };
    // The blocks the host wrote: refused, never the data the disks hold from before, on the
    // disk that is there as on the other (the first command meets the restart's unit
    // attention).
    let image = std::fs::read(&img).unwrap();
    let written: Vec<u64> = (0..VDISK / BLOCK as u64)
        .map(|b| b * BLOCK as u64)
        .filter(|&at| model[at as usize..][..BLOCK] != image[at as usize..][..BLOCK])
        .collect();
    assert_eq!(written.len(), 16);
    let _ = read(&h, 0);
    for &at in &written {
        let r = read(&h, at);
        assert_ne!(r.status, 0, "the block at {at} was read while its disk is away");
    }
    std::fs::rename(&moved, &victim).unwrap();
    let out = d.ok(&["disk", "online", "c", &victim]);
    assert!(out.contains("taken back"), "{out}");
    let show = d.json(&["pool", "show", "c"]);
    assert_eq!(show["cache"]["parked_bytes"], 0, "{show}");
    for &at in &written {
        let r = read(&h, at);
        assert_eq!(r.status, 0, "the block at {at}: sense {:02x?}", r.sense);
        assert!(r.data[..] == model[at as usize..][..BLOCK], "the block at {at}");
    }
    drop(h);
    assert_exported_as(
        &d,
        t.path(),
        "c/s",
        &model,
        "the vdisk differs from what the host wrote",
    );
}
