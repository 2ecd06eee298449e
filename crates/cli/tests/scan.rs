//! The metadata scan and spot-fix through the daemon: damage made in the pool while the daemon
//! was stopped is listed by `tessera pool scan` (text, JSON and the API, a page at a time),
//! repaired by `tessera pool spotfix`, and the pool's data and metadata end as they should.

mod common;

use std::path::Path;

use common::*;
use tessera_volume::Engine;

const MIB: u64 = 1 << 20;

fn start(state: &Path) -> Daemon {
    Daemon::start_configured(state, "scrub_interval = \"off\"\n")
}

/// A daemon in `t` serving mirrored pool "s" with vdisk "m" of 16 MiB of random data; with
/// the daemon's state directory and the image of that data.
fn mirrored_pool(t: &Path) -> (std::path::PathBuf, Daemon, std::path::PathBuf) {
    let state = t.join("state");
    let d = start(&state);
    let img = t.join("in.img");
    random_image(&img, 16 * MIB, 3);
    mirror_pool_with(&d, &t.join("disks"), &img);
    (state, d, img)
}

/// Opens pool "s" of a stopped daemon's state and damages its metadata there.
fn damage(state: &Path, f: impl FnOnce(&Engine)) {
    let e = Engine::open(&state.join("pools").join("s"), &|p| {
        tessera_server::daemon::open_disk(p)
    })
    .unwrap();
    f(&e);
}

#[test]
fn scan_lists_damage_and_spotfix_repairs_it_while_the_pool_serves() {
    let t = tempfile::tempdir().unwrap();
    let (state, mut d, img) = mirrored_pool(t.path());
    let clean = d.json(&["pool", "scan", "s"]);
    assert_eq!(clean["report"]["findings"], 0, "{clean}");
    assert!(clean["report"]["grains"].as_u64().unwrap() > 0, "{clean}");
    d.stop();

    // Damage, as a bug or a torn update would leave it.
    damage(&state, |e| {
        e.damage_orphan_slots("m", 20).unwrap();
        e.damage_count("m", 3, 1).unwrap();
    });
    let d = start(&state);
    let found = d.json(&["pool", "scan", "s"]);
    let r = &found["report"];
    assert_eq!(r["findings"], 21, "{found}");
    assert_eq!(r["by_kind"]["orphan_slot"], 20, "{found}");
    assert_eq!(r["by_kind"]["refcount_wrong"], 1, "{found}");
    let listed = found["findings"].as_array().unwrap();
    assert_eq!(listed.len(), 21);
    let wrong = listed.iter().find(|f| f["kind"] == "refcount_wrong").unwrap();
    assert_eq!(wrong["action"]["action"], "set_count", "{wrong}");
    assert_eq!(wrong["action"]["references"], 1, "{wrong}");
    assert_eq!(wrong["action"]["stored"], 2, "{wrong}");
    assert!(
        wrong["repair"].as_str().unwrap().contains("set its count to 1"),
        "{wrong}"
    );

    let text = d.ok(&["pool", "scan", "s", "--last", "--limit", "5"]);
    assert!(
        text.contains("21 finding(s)") && text.contains("orphan slot: 20"),
        "{text}"
    );
    assert!(
        text.contains("--after"),
        "a page of 5 says where the next starts: {text}"
    );
    assert!(d.ok(&["pool", "show", "s"]).contains("last scan:"));

    // The API, a page at a time; bad queries are refused clearly.
    let page = d.http("GET", "/api/pools/s/scan?limit=5", None).json();
    assert_eq!(page["findings"].as_array().unwrap().len(), 5);
    let next = page["next_after"].as_u64().unwrap();
    let rest = d
        .http("GET", &format!("/api/pools/s/scan?after={next}&limit=100"), None)
        .json();
    assert_eq!(rest["findings"].as_array().unwrap().len(), 16);
    assert!(rest["next_after"].is_null());
    for bad in ["limit=0", "limit=x", "after=-1", "color=blue"] {
        let resp = d.http("GET", &format!("/api/pools/s/scan?{bad}"), None);
        assert_eq!(resp.code(), "invalid_argument", "{bad}: {}", resp.body);
    }

    let fixed = d.ok(&["pool", "spotfix", "s"]);
    assert!(fixed.contains("21 fixed, 0 changed"), "{fixed}");
    let check = d.ok(&["pool", "check", "s"]);
    assert!(check.contains("0 problem(s)"), "{check}");
    assert_eq!(d.json(&["pool", "scan", "s"])["report"]["findings"], 0);
    let back = t.path().join("back.img");
    d.ok(&["vdisk", "export", "s/m", back.to_str().unwrap()]);
    assert!(
        read_back_matches(&img, &back),
        "the vdisk reads wrong after the spot-fix"
    );
    assert!(d.logs().contains("spot-fix finished"));
}

/// Scans start by themselves on the schedule (`scan_interval`): counted from the first time
/// the daemon looked at a pool never scanned, then from the last scan's end. One that finds
/// damage tells it as a `scan.findings` event.
#[test]
fn scans_start_by_themselves_on_schedule_and_tell_what_they_found() {
    let t = tempfile::tempdir().unwrap();
    let (state, mut d, _) = mirrored_pool(t.path());
    let none = d.json(&["pool", "scan", "s", "--last"]);
    assert!(none["report"].is_null(), "{none}");
    assert!(none["next_due"].is_u64(), "monthly by default: {none}");
    assert!(d.ok(&["pool", "scan", "s", "--last"]).contains("next scheduled scan"));
    d.stop();
    damage(&state, |e| {
        e.damage_orphan_slots("m", 20).unwrap();
    });
    let d = Daemon::start_configured(&state, "scrub_interval = \"off\"\nscan_interval = \"3s\"\n");
    let started = std::time::Instant::now();
    let r = loop {
        let r = d.json(&["pool", "scan", "s", "--last"]);
        if r["report"]["finished_at"].is_u64() {
            break r;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no scheduled scan: {r}\n{}",
            d.logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(r["report"]["findings"], 20, "{r}");
    assert!(
        r["next_due"].as_u64().unwrap() >= r["report"]["finished_at"].as_u64().unwrap() + 3,
        "{r}"
    );
    assert!(d.logs().contains("scheduled scan started"), "{}", d.logs());
    let shown = d.json(&["pool", "show", "s"]);
    assert!(
        shown["scan_next_due"].as_u64() >= r["report"]["finished_at"].as_u64().map(|t| t + 3),
        "{shown}"
    );
    assert!(d.ok(&["pool", "show", "s"]).contains("next scheduled"));
    let events = d.json(&["events", "-n", "1000"]);
    let told = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "scan.findings")
        .unwrap_or_else(|| panic!("no scan.findings event: {events:#}"));
    assert_eq!(told["severity"], "warning", "{told}");
    assert!(told["message"].as_str().unwrap().contains("orphan_slot: 20"), "{told}");
}
