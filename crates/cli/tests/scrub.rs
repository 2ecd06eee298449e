//! Scrub through the daemon: bits flipped in a disk file behind its back are found and
//! repaired by `tessera pool scrub`, counted per disk and shown by `pool show`; a paused scrub
//! stays paused across a restart, one cut short by a restart goes on by itself, and a disk
//! whose errors pass `disk_error_limit` is retired as failing and emptied.

mod common;

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, RngCore, SeedableRng};
use serde_json::Value;

const MIB: u64 = 1 << 20;
const IMAGE: u64 = 32 * MIB;
/// Member slabs start 1 MiB into a disk, one after the other (64 MiB each in these pools).
const DATA_OFFSET: u64 = MIB;
const SLAB: u64 = 64 * MIB;

fn start(state: &Path, config: &str) -> Daemon {
    Daemon::start_configured(state, config)
}

/// A pool "s" on three disks with a mirror vdisk "s/m" holding a random image (no zero block,
/// so every block is written and has a checksum).
fn setup(d: &Daemon, t: &Path) -> (Vec<String>, std::path::PathBuf) {
    let img = t.join("in.img");
    let mut buf = vec![0u8; IMAGE as usize];
    rand::rngs::StdRng::seed_from_u64(5).fill_bytes(&mut buf);
    std::fs::write(&img, &buf).unwrap();
    (mirror_pool_with(d, &t.join("disks"), &img), img)
}

/// The first slab of a disk file that holds data: where a copy of the vdisk lies.
fn data_slab(path: &str) -> Option<u64> {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    let mut probe = vec![0u8; 65536];
    (0..(len - DATA_OFFSET) / SLAB)
        .map(|k| DATA_OFFSET + k * SLAB)
        .find(|&at| f.read_exact_at(&mut probe, at).is_ok() && probe.iter().any(|&b| b != 0))
}

/// Flips one bit in each of `n` distinct bytes of the vdisk's copy on `path`; returns the
/// 4 KiB blocks hit.
fn flip(path: &str, n: usize, seed: u64) -> HashSet<u64> {
    let base = data_slab(path).expect("a disk holding a copy");
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut bytes = HashSet::new();
    while bytes.len() < n {
        bytes.insert(rng.random_range(0..IMAGE));
    }
    for &at in &bytes {
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, base + at).unwrap();
        b[0] ^= 1 << rng.random_range(0..8);
        f.write_all_at(&b, base + at).unwrap();
    }
    f.sync_all().unwrap();
    bytes.iter().map(|at| at / 4096).collect()
}

/// The pool's member disks that hold a copy, busiest first.
fn copies(d: &Daemon) -> Vec<(u64, String)> {
    let list = d.json(&["disk", "list", "s"]);
    let mut v: Vec<(u64, String)> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["slabs_used"].as_u64().unwrap() > 0)
        .map(|x| (x["position"].as_u64().unwrap(), x["path"].as_str().unwrap().to_string()))
        .collect();
    v.sort();
    v
}

/// The disk at pool position `pos` in a `pool show` answer.
fn disk_at(pool: &Value, pos: u64) -> Value {
    pool["disk_list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["position"].as_u64() == Some(pos))
        .unwrap()
        .clone()
}

fn scrub_view(d: &Daemon) -> Value {
    d.json(&["pool", "show", "s"])["scrub"].clone()
}

fn wait_for(d: &Daemon, what: &str, limit: Duration, f: impl FnMut(&Value) -> bool) -> Value {
    d.wait_for_scrub("s", what, limit, f)
}

fn exported_matches(d: &Daemon, t: &Path, img: &Path) -> bool {
    let back = t.join("back.img");
    let _ = std::fs::remove_file(&back);
    d.ok(&["vdisk", "export", "s/m", back.to_str().unwrap()]);
    read_back_matches(img, &back)
}

#[test]
fn scrub_repairs_every_flipped_block_and_shows_it_per_disk() {
    let t = tempfile::tempdir().unwrap();
    let d = start(&t.path().join("state"), "scrub_interval = \"off\"\n");
    let (_, img) = setup(&d, t.path());
    let (pos, path) = copies(&d)[0].clone();
    let hit = flip(&path, 300, 1);
    let out = d.ok(&["pool", "scrub", "s"]);
    let s = scrub_view(&d);
    assert_eq!(s["state"], "idle", "{s}");
    let last = &s["last"];
    assert_eq!(last["repaired"].as_u64().unwrap(), hit.len() as u64, "{out}\n{s}");
    assert_eq!(last["unrecoverable"], 0, "{s}");
    let per_disk = last["per_disk"].as_array().unwrap();
    assert_eq!(per_disk.len(), 1, "{s}");
    assert_eq!(per_disk[0]["disk"].as_u64().unwrap(), pos);
    assert!(last["blocks_checked"].as_u64().unwrap() >= 2 * IMAGE / 4096);
    let shown = d.ok(&["pool", "show", "s"]);
    assert!(shown.contains("checksums:") && shown.contains("last scrub:"), "{shown}");
    assert!(shown.contains(&format!("{} repaired", hit.len())), "{shown}");
    let disk = disk_at(&d.json(&["pool", "show", "s"]), pos);
    assert_eq!(disk["errors"]["checksum"].as_u64().unwrap(), hit.len() as u64, "{disk}");
    assert!(
        exported_matches(&d, t.path(), &img),
        "the vdisk reads wrong after the scrub"
    );
    d.ok(&["pool", "scrub", "s"]);
    let again = scrub_view(&d);
    assert_eq!(again["last"]["repaired"], 0, "a second scrub repaired: {again}");
    assert!(d.logs().contains("scrub finished"));
}

#[test]
fn a_paused_scrub_waits_and_one_cut_short_by_a_restart_goes_on_by_itself() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let config = "scrub_interval = \"off\"\nscrub_rate = \"off\"\n";
    let mut d = start(&state, config);
    setup(&d, t.path());
    // Paused by the administrator: it keeps its place, and a restart does not resume it.
    d.ok(&["pool", "scrub", "s", "--rate", "4M", "--no-wait"]);
    wait_for(&d, "scrub progress", Duration::from_secs(30), |s| {
        s["state"] == "running" && s["current"]["blocks_checked"].as_u64().unwrap_or(0) > 0
    });
    let paused = d.ok(&["pool", "scrub", "s", "--pause"]);
    assert!(paused.contains("paused"), "{paused}");
    assert_eq!(scrub_view(&d)["state"], "paused");
    d.stop();
    d = start(&state, config);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(scrub_view(&d)["state"], "paused", "a paused scrub resumed by itself");
    let before = scrub_view(&d)["current"]["blocks_checked"].as_u64().unwrap();
    assert!(before > 0);
    d.ok(&["pool", "scrub", "s"]);
    let s = scrub_view(&d);
    assert_eq!(s["state"], "idle");
    assert!(s["last"]["blocks_checked"].as_u64().unwrap() >= before);

    // Cut short by a restart: the daemon goes on with it by itself.
    d.ok(&["pool", "scrub", "s", "--rate", "4M", "--no-wait"]);
    wait_for(&d, "scrub progress", Duration::from_secs(30), |s| {
        s["state"] == "running" && s["current"]["blocks_checked"].as_u64().unwrap_or(0) > 0
    });
    let first_finish = s["last"]["finished_at"].clone();
    d.stop();
    d = start(&state, config);
    let s = wait_for(&d, "the scrub to go on and finish", Duration::from_secs(60), |s| {
        s["state"] == "idle" && s["last"]["finished_at"] != first_finish
    });
    assert_eq!(s["last"]["unrecoverable"], 0);
    assert!(d.logs().contains("going on with the scrub"), "{}", d.logs());
}

/// Retired as failing while automatic repair is off, the disk is still known as failing after
/// a restart: switching automatic repair on empties it with no command typed.
#[test]
fn a_disk_past_the_error_limit_is_retired_and_emptied() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let config = "scrub_interval = \"off\"\ndisk_error_limit = 50\n";
    let mut d = start(&state, config);
    let (_, img) = setup(&d, t.path());
    d.ok(&["pool", "auto-repair", "s", "off"]);
    let (pos, path) = copies(&d)[0].clone();
    flip(&path, 100, 2);
    d.ok(&["pool", "scrub", "s"]);
    // The daemon looks at the error counts now and then.
    let t0 = Instant::now();
    loop {
        let disk = disk_at(&d.json(&["pool", "show", "s"]), pos);
        if disk["state"] == "retired" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not retired: {disk}\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(3));
    let disk = disk_at(&d.json(&["pool", "show", "s"]), pos);
    assert!(
        disk["slabs_used"].as_u64().unwrap() > 0,
        "emptied with automatic repair off: {disk}"
    );
    let events = d.json(&["events", "-n", "1000"]);
    let failing = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "disk.failing")
        .unwrap_or_else(|| panic!("no disk.failing event: {events:#}"));
    assert!(
        failing["message"]
            .as_str()
            .unwrap()
            .contains("100 block(s) not matching"),
        "{failing}"
    );
    assert!(d.logs().contains("event=disk.failing"), "{}", d.logs());
    d.stop();
    let d = start(&state, config);
    d.ok(&["pool", "auto-repair", "s", "on"]);
    let t0 = Instant::now();
    loop {
        let p = d.json(&["pool", "show", "s"]);
        let disk = disk_at(&p, pos);
        if disk["state"] == "retired" && disk["slabs_used"] == 0 && p["health"] == "healthy" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "not emptied after the restart: {p}\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(exported_matches(&d, t.path(), &img));
}

#[test]
fn scrubs_start_by_themselves_on_schedule() {
    let t = tempfile::tempdir().unwrap();
    let d = start(&t.path().join("state"), "scrub_interval = \"3s\"\n");
    setup(&d, t.path());
    let s = wait_for(&d, "a scheduled scrub", Duration::from_secs(60), |s| {
        s["last"]["finished_at"].is_u64()
    });
    assert!(
        s["next_due"].as_u64().unwrap() >= s["last"]["finished_at"].as_u64().unwrap() + 3,
        "{s}"
    );
    assert!(d.logs().contains("scheduled scrub started"), "{}", d.logs());
}

/// Past the layout's tolerance (a simple vdisk has none), a block that rotted is never
/// returned: the iSCSI READ that covers it fails with MEDIUM ERROR / UNRECOVERED READ ERROR
/// (after the transport's own ring read fails its check and the command is run the ordinary
/// way), and every other block reads right.
#[test]
fn a_rotten_block_with_no_good_copy_is_a_medium_error_over_iscsi() {
    let t = tempfile::tempdir().unwrap();
    let d = start(&t.path().join("state"), "scrub_interval = \"off\"\n");
    let disk = disks(&t.path().join("disks"), 1, 256 * MIB);
    create_pool(&d, "r", &disk);
    let img = t.path().join("in.img");
    let mut want = vec![0u8; IMAGE as usize];
    rand::rngs::StdRng::seed_from_u64(8).fill_bytes(&mut want);
    std::fs::write(&img, &want).unwrap();
    d.ok(&["vdisk", "import", "r/x", img.to_str().unwrap(), "--layout", "simple"]);
    let iqn = "iqn.2026-11.io.tessera:rot";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "r/x", "--lun", "0"]);
    flip(&disk[0], 1, 3);
    let (rt, s) = iscsi_host(&d.iscsi_portal(), iqn, "iqn.2026-11.io.example:reader");
    const CHUNK: usize = 64 << 10;
    let mut failed = 0;
    let mut attention = 4;
    let mut at = 0;
    while at < IMAGE {
        let cdb = tessera_bench::target::rw16(false, at, CHUNK, 512);
        let r = rt.block_on(s.command(0, &cdb, Vec::new(), CHUNK)).unwrap();
        match (r.status, r.sense_key()) {
            (0, _) => assert!(
                r.data[..] == want[at as usize..at as usize + CHUNK],
                "wrong data at {at}"
            ),
            (2, Some((6, _, _))) if attention > 0 => {
                attention -= 1;
                continue;
            }
            (2, Some(k)) => {
                assert_eq!(k, (3, 0x11, 0), "READ at {at}: sense {k:02x?}");
                failed += 1;
            }
            other => panic!("READ at {at}: {other:?}"),
        }
        at += CHUNK as u64;
    }
    assert_eq!(failed, 1, "one 64 KiB read covers the rotten block");
    let shown = d.json(&["pool", "show", "r"]);
    assert!(shown["stats"]["checksum_errors"].as_u64().unwrap() > 0, "{shown}");
}

/// A block of a parity vdisk rotten on its disk and on the parity at the same place is lost:
/// a host's write beside it (the same stripe row, the same parity) still lands, over iSCSI,
/// and the loss is shown where an administrator looks: `pool show` (its bytes, and a
/// warning), the `tessera_pool_lost_bytes` metric, and a medium error for reads of the
/// block, until the host writes it again.
#[test]
fn a_write_beside_a_block_beyond_repair_lands_and_the_loss_is_shown() {
    let t = tempfile::tempdir().unwrap();
    let d = start(
        &t.path().join("state"),
        "scrub_interval = \"off\"\nscan_interval = \"off\"\n",
    );
    let disk = disks(&t.path().join("disks"), 3, 256 * MIB);
    create_pool(&d, "r", &disk);
    let img = t.path().join("in.img");
    let mut want = vec![0u8; IMAGE as usize];
    rand::rngs::StdRng::seed_from_u64(9).fill_bytes(&mut want);
    std::fs::write(&img, &want).unwrap();
    d.ok(&["vdisk", "import", "r/x", img.to_str().unwrap(), "--layout", "parity"]);
    // Where each 4 KiB block of the vdisk lies: disk and offset in its slab. The vdisk's
    // first block is to be lost; another block at the same place of another disk is in its
    // stripe row, which has its parity on the third disk.
    let by_content: std::collections::HashMap<&[u8], usize> = (0..IMAGE as usize)
        .step_by(4096)
        .map(|at| (&want[at..at + 4096], at))
        .collect();
    let base: Vec<u64> = disk.iter().map(|p| data_slab(p).expect("a slab in use")).collect();
    let mut placed = Vec::new();
    for (k, path) in disk.iter().enumerate() {
        let mut slab = vec![0u8; SLAB as usize];
        std::fs::File::open(path)
            .unwrap()
            .read_exact_at(&mut slab, base[k])
            .unwrap();
        for (i, block) in slab.chunks(4096).enumerate() {
            if let Some(&at) = by_content.get(block) {
                placed.push((k, i * 4096, at));
            }
        }
    }
    let &(first, mo, _) = placed.iter().find(|p| p.2 == 0).expect("the vdisk's first block");
    let &(second, _, beside_at) = placed
        .iter()
        .find(|p| p.1 == mo && p.0 != first)
        .expect("a block in the same stripe row");
    let parity = 3 - first - second;
    for k in [first, parity] {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&disk[k])
            .unwrap();
        let at = base[k] + mo as u64 + 100;
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        b[0] ^= 4;
        f.write_all_at(&b, at).unwrap();
        f.sync_all().unwrap();
    }
    let iqn = "iqn.2026-12.io.tessera:lost";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "r/x", "--lun", "0"]);
    let (rt, s) = iscsi_host(&d.iscsi_portal(), iqn, "iqn.2026-12.io.example:host");
    // A command, past the unit attentions a new session is owed.
    let run = |write: bool, at: usize, data: Vec<u8>| {
        for _ in 0..5 {
            let cdb = tessera_bench::target::rw16(write, at as u64, 4096, 512);
            let r = rt
                .block_on(s.command(0, &cdb, data.clone(), if write { 0 } else { 4096 }))
                .unwrap();
            if !matches!((r.status, r.sense_key()), (2, Some((6, _, _)))) {
                return r;
            }
        }
        panic!("unit attentions without end");
    };
    let medium_error = |what: &str| {
        let r = run(false, 0, Vec::new());
        assert_eq!((r.status, r.sense_key()), (2, Some((3, 0x11, 0))), "{what}");
    };
    medium_error("rotten");
    let beside = vec![0x5au8; 4096];
    let r = run(true, beside_at, beside.clone());
    assert_eq!(r.status, 0, "the write beside the lost block: {:?}", r.sense_key());
    medium_error("lost");
    let r = run(false, beside_at, Vec::new());
    assert_eq!((r.status, &r.data[..]), (0, &beside[..]));
    let shown = d.json(&["pool", "show", "r"]);
    assert_eq!(shown["lost_bytes"], 4096, "{shown}");
    assert!(
        shown["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("DATA LOST")),
        "{shown}"
    );
    let m = d.http("GET", "/metrics", None);
    assert!(
        m.body.lines().any(|l| l == "tessera_pool_lost_bytes{pool=\"r\"} 4096"),
        "{}",
        m.body
    );
    let told = wait_for_event(&d, "pool.data_lost");
    assert!(
        told["message"].as_str().unwrap().contains("lost 4.0 KiB of data"),
        "{told}"
    );
    assert_eq!(told["severity"], "critical");
    // Written again: it reads, and nothing is lost.
    let again = vec![0xa5u8; 4096];
    assert_eq!(run(true, 0, again.clone()).status, 0);
    let r = run(false, 0, Vec::new());
    assert_eq!((r.status, &r.data[..]), (0, &again[..]));
    assert_eq!(d.json(&["pool", "show", "r"])["lost_bytes"], 0);
    wait_for_event(&d, "pool.data_lost_cleared");
}

/// The newest event of `kind`, once the event log has one.
fn wait_for_event(d: &Daemon, kind: &str) -> Value {
    let t = Instant::now();
    loop {
        let v = d.json(&["events", "-n", "1000"]);
        if let Some(e) = v["events"].as_array().unwrap().iter().rev().find(|e| e["kind"] == kind) {
            return e.clone();
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no {kind} event: {v:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
