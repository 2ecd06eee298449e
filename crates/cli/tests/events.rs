//! The event log through the daemon: what a failed disk, a refused login and a repair leave in
//! `tessera events`, in a follower's stream, in the hook, across a restart; refused without
//! the token.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const TOKEN: &str = "events-token-0123456789abcdef";

fn kinds(events: &Value) -> Vec<String> {
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}

/// Waits until the event log has an event of `kind`; returns the log.
fn wait_for_event(d: &Daemon, kind: &str) -> Value {
    let t = Instant::now();
    loop {
        let v = d.json(&["events", "-n", "1000"]);
        if kinds(&v["events"]).iter().any(|k| k == kind) {
            return v["events"].clone();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no {kind} event: {v:#}\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_failed_disk_a_refused_login_and_a_repair_are_told_followed_hooked_and_kept() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let hooked = t.path().join("hooked.jsonl");
    let hook = t.path().join("hook.sh");
    std::fs::write(&hook, format!("#!/bin/sh\ncat >> {}\n", hooked.display())).unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = format!(
        "scrub_interval = \"off\"\nauto_repair = false\nevent_hook = \"{}\"\nevent_hook_severity = \"warning\"\n",
        hook.display()
    );
    let mut d = Daemon::start_on_tcp(&state, &config, TOKEN);
    let disk_paths = disks(&t.path().join("disks"), 3, 256 << 20);
    create_pool(&d, "p", &disk_paths);
    // Fully provisioned: its slabs are on the disks from the start, so a failed disk degrades.
    d.ok(&[
        "vdisk",
        "create",
        "p/m",
        "--size",
        "64M",
        "--layout",
        "mirror",
        "--provisioning",
        "fixed",
    ]);
    let listed = d.json(&["events"]);
    assert_eq!(
        kinds(&listed["events"]),
        ["pool.created", "vdisk.created"],
        "{listed:#}"
    );

    // A follower, from now on, as JSON lines.
    let mut follower = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--api", &format!("unix:{}", state.join("api.sock").display())])
        .args(["--json", "events", "--follow", "-n", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<Value>();
    let out = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(first["kind"], "vdisk.created", "the newest one first");

    // A disk fails: the disk's event and the pool's, from the daemon's watch.
    let victim = busiest_disk(&d, "p");
    d.ok(&["disk", "fail", "p", &victim]);
    let events = wait_for_event(&d, "pool.degraded");
    let failed = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "disk.failed")
        .unwrap();
    assert_eq!(failed["severity"], "error");
    assert_eq!(failed["subject"], victim.as_str());
    assert_eq!(failed["pool"], "p");

    // An initiator outside the target's ACL, twice: one event (the second folds into it).
    let iqn = "iqn.2026-11.io.tessera:events";
    d.ok(&["target", "create", iqn]);
    d.ok(&["target", "acl", "add", iqn, "iqn.2026-11.io.tessera:host-a"]);
    d.ok(&["target", "lun", "add", iqn, "p/m"]);
    let url = format!("iscsi://{}/{iqn}/0", d.iscsi_portal());
    for _ in 0..2 {
        let (success, out) = run("iscsi-inq", &["-i", "iqn.2026-11.io.tessera:intruder", &url]);
        assert!(!success, "{out}");
    }
    let events = wait_for_event(&d, "iscsi.login_refused");
    let refused: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "iscsi.login_refused")
        .collect();
    assert_eq!(refused.len(), 1, "{events:#}");
    assert_eq!(refused[0]["subject"], "iqn.2026-11.io.tessera:intruder");
    assert!(
        refused[0]["message"].as_str().unwrap().contains("not in the ACL"),
        "{}",
        refused[0]
    );
    // Intruders of new names each time, from the one address: nothing folds, but no more
    // than ten a minute are recorded one by one (the rest are said when the minute ends).
    for i in 0..12 {
        let name = format!("iqn.2026-11.io.tessera:intruder-{i}");
        let (success, out) = run("iscsi-inq", &["-i", &name, &url]);
        assert!(!success, "{out}");
    }
    let t0 = Instant::now();
    let refused = loop {
        let events = d.json(&["events", "-n", "1000"]);
        let refused = kinds(&events["events"])
            .iter()
            .filter(|k| *k == "iscsi.login_refused")
            .count();
        if refused >= 10 || t0.elapsed() > Duration::from_secs(10) {
            break refused;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(refused, 10, "refusals past the budget were recorded one by one");

    // The repair: its start, its end, the pool healthy again.
    d.ok(&["pool", "repair", "p"]);
    let events = wait_for_event(&d, "pool.healthy");
    let order = kinds(&events);
    let at = |k: &str| {
        order
            .iter()
            .position(|x| x == k)
            .unwrap_or_else(|| panic!("no {k}: {order:?}"))
    };
    assert!(at("disk.failed") < at("pool.degraded"));
    assert!(at("repair.started") < at("repair.finished"));
    assert!(at("repair.finished") < at("pool.healthy"), "{order:?}");

    // The follower saw the same events in the same order, numbers rising by one.
    let mut seen = Vec::new();
    while seen.last().is_none_or(|e: &Value| e["kind"] != "pool.healthy") {
        seen.push(rx.recv_timeout(Duration::from_secs(10)).expect("the follower keeps up"));
    }
    follower.kill().unwrap();
    let _ = follower.wait();
    let seqs: Vec<u64> = seen.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let listed: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap() >= seqs[0])
        .collect();
    assert_eq!(listed.len(), seen.len());
    for (a, b) in listed.iter().zip(&seen) {
        assert_eq!(*a, b);
    }

    // Filters.
    let errors = d.json(&["events", "--severity", "error", "-n", "1000"]);
    assert!(errors["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["severity"] == "error" || e["severity"] == "critical"));
    assert!(kinds(&errors["events"]).contains(&"disk.failed".to_string()));
    let human = d.ok(&["events", "--pool", "p", "-n", "1000"]);
    assert!(
        human.contains("disk.failed") && human.contains(&format!("disk {victim} failed")),
        "{human}"
    );
    assert!(d.fails(&["events", "--severity", "loud"]).contains("severity"));

    // The hook had the warnings and worse, not the rest.
    let t0 = Instant::now();
    let hooked_kinds = loop {
        let text = std::fs::read_to_string(&hooked).unwrap_or_default();
        let k: Vec<String> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["kind"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        if k.iter().any(|x| x == "iscsi.login_refused") || t0.elapsed() > Duration::from_secs(10) {
            break k;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(hooked_kinds.contains(&"disk.failed".to_string()), "{hooked_kinds:?}");
    assert!(hooked_kinds.contains(&"pool.degraded".to_string()));
    assert!(hooked_kinds.contains(&"iscsi.login_refused".to_string()));
    assert!(
        !hooked_kinds.contains(&"pool.created".to_string()),
        "info is below the hook's severity"
    );

    // Counted in the metrics.
    let api = banner_addr(&d, "management API:");
    let auth = format!("Bearer {TOKEN}");
    let m = http_tcp(&api, "GET", "/metrics", None, &[("Authorization", &auth)]).unwrap();
    assert!(
        m.body.contains("tessera_events_total{severity=\"error\"}"),
        "{}",
        m.body
    );

    // Without the token: nothing, listed or streamed.
    for path in ["/api/events", "/api/events/stream"] {
        let r = http_tcp(&api, "GET", path, None, &[]).unwrap();
        assert_eq!(r.status, 401, "{path}: {}", r.body);
    }
    let r = http_tcp(&api, "GET", "/api/events?limit=2", None, &[("Authorization", &auth)]).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["events"].as_array().unwrap().len(), 2);
    let r = http_tcp(&api, "GET", "/api/events?after=x", None, &[("Authorization", &auth)]).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);

    // Kept across a restart, numbering going on.
    let last = *seqs.last().unwrap();
    d.stop();
    let d = Daemon::start_on_tcp(&state, &config, TOKEN);
    let kept = d.json(&["events", "-n", "1000"]);
    assert!(kinds(&kept["events"]).contains(&"disk.failed".to_string()));
    d.ok(&["vdisk", "create", "p/after", "--size", "16M"]);
    let newest = d.json(&["events", "-n", "1"]);
    assert_eq!(newest["events"][0]["kind"], "vdisk.created");
    assert!(newest["events"][0]["seq"].as_u64().unwrap() > last);
}
