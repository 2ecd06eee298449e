//! Deduplication through the daemon: `tessera dedup enable/run/status/gc`, the API, the
//! schedule, the savings in `vdisk list`, and bad input refused with a clear reason. Images
//! imported twice are stored once and read back whole, before and after a restart.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const MIB: u64 = 1 << 20;

fn start(state: &Path) -> Daemon {
    Daemon::start_configured(state, "scrub_interval = \"off\"\n")
}

fn export_matches(d: &Daemon, vdisk: &str, img: &Path, dir: &Path) -> bool {
    let out = dir.join(format!("{}.out", vdisk.replace('/', "_")));
    let _ = std::fs::remove_file(&out);
    d.ok(&["vdisk", "export", vdisk, out.to_str().unwrap()]);
    read_back_matches(img, &out)
}

#[test]
fn images_imported_twice_are_stored_once_and_read_back() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = start(&state);
    create_pool(&d, "p", &disks(&t.path().join("disks"), 4, 512 * MIB));
    let img = t.path().join("in.img");
    random_image(&img, 24 * MIB, 5);

    let off = d.json(&["dedup", "status", "p"]);
    assert_eq!(off["settings"]["enabled"], false, "{off}");
    let refused = d.fails(&["dedup", "run", "p"]);
    assert!(refused.contains("not enabled"), "{refused}");
    let bad = d.fails(&["dedup", "enable", "p", "--vdisk", "nope"]);
    assert!(bad.contains("nope"), "{bad}");
    assert!(d
        .fails(&["dedup", "enable", "p", "--min-age", "soon"])
        .contains("duration"));
    let resp = d.http("PUT", "/api/pools/p/dedup", Some(r#"{"enabled":true,"colour":"blue"}"#));
    assert_eq!(resp.code(), "malformed_request", "{}", resp.body);
    assert_eq!(d.json(&["dedup", "status", "p"])["settings"]["enabled"], false);

    let on = d.ok(&["dedup", "enable", "p", "--min-age", "0", "--schedule", "0"]);
    assert!(on.contains("dedup") && on.contains("every vdisk"), "{on}");
    for v in ["p/a", "p/b"] {
        d.ok(&["vdisk", "import", v, img.to_str().unwrap(), "--layout", "mirror"]);
        assert_eq!(
            d.json(&["vdisk", "show", v])["grain_size"],
            4096,
            "dedup in scope: 4 KiB grains"
        );
    }
    let before = d.json(&["dedup", "status", "p"]);
    assert_eq!(before["saved_bytes"], 0, "{before}");

    let ran = d.ok(&["dedup", "run", "p", "--all"]);
    assert!(ran.contains("shared"), "{ran}");
    let st = d.json(&["dedup", "status", "p"]);
    let logical = st["logical_bytes"].as_u64().unwrap();
    let saved = st["saved_bytes"].as_u64().unwrap();
    assert!(logical > 30 * MIB, "{st}");
    assert_eq!(saved * 2, logical, "the second copy is saved whole: {st}");
    assert!((st["saved_ratio"].as_f64().unwrap() - 0.5).abs() < 1e-9, "{st}");
    assert_eq!(st["vdisks"].as_array().unwrap().len(), 2, "{st}");
    let listed = d.json(&["vdisk", "list", "p"]);
    for v in listed.as_array().unwrap() {
        assert_eq!(v["dedup"], true, "{v}");
        assert_eq!(
            v["saved_bytes"].as_u64().unwrap() * 2,
            v["allocated_bytes"].as_u64().unwrap(),
            "{v}"
        );
    }
    assert!(d.ok(&["vdisk", "list", "p"]).contains("SAVED"));
    let text = d.ok(&["dedup", "status", "p"]);
    assert!(text.contains("50.0 %"), "{text}");
    assert!(export_matches(&d, "p/a", &img, t.path()));
    assert!(export_matches(&d, "p/b", &img, t.path()));
    d.ok(&["dedup", "gc", "p"]);
    let check = d.json(&["pool", "check", "p"]);
    assert_eq!(check["problems"].as_array().unwrap().len(), 0, "{check}");

    // Settings and sharing survive a restart.
    d.stop();
    let mut d = start(&state);
    let st = d.json(&["dedup", "status", "p"]);
    assert_eq!(st["settings"]["enabled"], true, "{st}");
    assert_eq!(st["saved_bytes"].as_u64().unwrap(), saved, "{st}");
    assert!(export_matches(&d, "p/b", &img, t.path()));

    // Deleting one copy leaves the other whole, and nothing shared.
    d.ok(&["vdisk", "delete", "p/a"]);
    assert!(export_matches(&d, "p/b", &img, t.path()));
    assert_eq!(d.json(&["dedup", "status", "p"])["saved_bytes"], 0);
    d.stop();
}

#[test]
fn a_scheduled_run_finds_new_duplicates_by_itself() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = start(&state);
    create_pool(&d, "p", &disks(&t.path().join("disks"), 4, 256 * MIB));
    let img = t.path().join("in.img");
    random_image(&img, 8 * MIB, 9);
    d.ok(&["dedup", "enable", "p", "--min-age", "0", "--schedule", "1s"]);
    for v in ["p/a", "p/b"] {
        d.ok(&["vdisk", "import", v, img.to_str().unwrap(), "--layout", "mirror"]);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = d.json(&["dedup", "status", "p"]);
        if st["saved_bytes"].as_u64().unwrap() * 2 == st["logical_bytes"].as_u64().unwrap()
            && st["saved_bytes"].as_u64().unwrap() > 0
        {
            break;
        }
        assert!(Instant::now() < deadline, "no scheduled run shared the copies: {st}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let jobs = d.json(&["job", "list"]);
    assert!(jobs.as_array().unwrap().iter().any(|j| j["kind"] == "dedup"), "{jobs}");
    assert!(export_matches(&d, "p/b", &img, t.path()));
    d.stop();
}

#[test]
fn blocks_shared_past_the_threshold_on_a_simple_layout_are_kept_twice_until_they_are_not() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = start(&state);
    create_pool(&d, "p", &disks(&t.path().join("disks"), 3, 256 * MIB));
    let img = t.path().join("in.img");
    random_image(&img, 2 * MIB, 9);
    let bad = d.fails(&["dedup", "enable", "p", "--hot-copy-refs", "many"]);
    assert!(bad.contains("many"), "{bad}");
    let on = d.ok(&[
        "dedup",
        "enable",
        "p",
        "--min-age",
        "0",
        "--schedule",
        "0",
        "--hot-copy-refs",
        "2",
    ]);
    assert!(on.contains("shared more than 2 times"), "{on}");
    // Three images of one layout with no redundancy: each block shared three times.
    for v in ["p/a", "p/b", "p/c"] {
        d.ok(&["vdisk", "import", v, img.to_str().unwrap(), "--layout", "simple"]);
    }
    let ran = d.ok(&["dedup", "run", "p", "--all"]);
    let st = d.json(&["dedup", "status", "p"]);
    // The image's mapped blocks (the importer leaves blocks of zeros out).
    let image = st["logical_bytes"].as_u64().unwrap() / 3;
    let blocks = image / 4096;
    assert!(blocks > 400, "{st}");
    assert!(ran.contains(&format!("{blocks} made, 0 dropped")), "{ran}");
    assert_eq!(st["hot_copies"], blocks, "{st}");
    assert_eq!(st["hot_copy_bytes"], image, "{st}");
    assert_eq!(st["physical_bytes"], 2 * image, "the copies are stored bytes: {st}");
    d.ok(&["pool", "scrub", "p"]);
    let scrubbed = d.ok(&["pool", "show", "p"]);
    assert!(
        scrubbed.contains(&format!("{blocks} hot block copies checked, 0 repaired")),
        "{scrubbed}"
    );
    let check = d.json(&["pool", "check", "p"]);
    assert_eq!(check["problems"].as_array().unwrap().len(), 0, "{check}");

    // Kept across a restart; one vdisk gone leaves each block shared twice (above half the
    // threshold): kept; two gone: given back at the next collection.
    d.stop();
    let mut d = start(&state);
    d.ok(&["vdisk", "delete", "p/a"]);
    d.ok(&["dedup", "gc", "p"]);
    assert_eq!(d.json(&["dedup", "status", "p"])["hot_copies"], blocks);
    d.ok(&["vdisk", "delete", "p/b"]);
    d.ok(&["dedup", "gc", "p"]);
    let st = d.json(&["dedup", "status", "p"]);
    assert_eq!(
        (st["hot_copies"].as_u64(), st["physical_bytes"].as_u64()),
        (Some(0), Some(image)),
        "{st}"
    );
    assert!(export_matches(&d, "p/c", &img, t.path()));
    let check = d.json(&["pool", "check", "p"]);
    assert_eq!(check["problems"].as_array().unwrap().len(), 0, "{check}");
    d.stop();
}

/// Two runs (or a run and a collection) asked for at once make one job and a refusal, never
/// two jobs of which one fails because the other is under way.
#[test]
fn runs_asked_for_at_once_make_one_job_and_a_refusal() {
    let t = tempfile::tempdir().unwrap();
    let d = start(&t.path().join("state"));
    create_pool(&d, "p", &disks(&t.path().join("disks"), 2, 512 * MIB));
    d.ok(&["vdisk", "create", "p/v", "--size", "64M", "--layout", "simple"]);
    d.ok(&["dedup", "enable", "p", "--min-age", "0", "--schedule", "0"]);
    let ask = |what: &str| d.http("POST", &format!("/api/pools/p/dedup/{what}"), Some("{}"));
    for round in 0..30 {
        let go = std::sync::Barrier::new(2);
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                go.wait();
                ask("run")
            });
            let b = s.spawn(|| {
                go.wait();
                ask(if round % 2 == 0 { "run" } else { "gc" })
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        for r in [&a, &b] {
            assert!(
                r.status == 202 || r.status == 409,
                "round {round}: {} {}",
                r.status,
                r.body
            );
        }
        // Every job asked for ends; none failed for the other.
        let started = Instant::now();
        loop {
            let jobs = d.json(&["job", "list"]);
            let jobs = jobs.as_array().unwrap();
            if jobs.iter().all(|j| j["state"] != "running") {
                for j in jobs {
                    assert_eq!(j["state"], "succeeded", "round {round}: {j}");
                }
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "jobs still running: {jobs:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
