//! `tessera bench` against every kind of target the daemon serves, checked for correct counts
//! and for the JSON schema of docs/bench.md; never for speed.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

fn bench(args: &[&str]) -> Out {
    Command::new(BIN).arg("bench").args(args).output().unwrap().into()
}

fn bench_json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let o = bench(&a);
    assert!(o.success, "bench {args:?} failed:\n{}{}", o.stdout, o.stderr);
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", o.stdout))
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The schema of docs/bench.md, and counts that add up.
fn check_summary(s: &Value, runs: usize) {
    for k in [
        "target",
        "workload",
        "runs",
        "iops_mean",
        "iops_rsd_percent",
        "mib_per_s_mean",
    ] {
        assert!(s.get(k).is_some(), "no '{k}' in {s}");
    }
    let w = &s["workload"];
    for k in [
        "block_size",
        "threads",
        "outstanding",
        "write_percent",
        "random",
        "duration",
        "warmup",
        "offset",
        "size",
        "verify",
    ] {
        assert!(w.get(k).is_some(), "no workload '{k}' in {w}");
    }
    let bs = w["block_size"].as_u64().unwrap();
    let rs = s["runs"].as_array().unwrap();
    assert_eq!(rs.len(), runs, "{s}");
    for r in rs {
        for k in ["target", "seconds", "total", "read", "write", "cpu_percent", "verify"] {
            assert!(r.get(k).is_some(), "no run '{k}' in {r}");
        }
        let (t, rd, wr) = (&r["total"], &r["read"], &r["write"]);
        let ops = |o: &Value| o["ops"].as_u64().unwrap();
        assert!(ops(t) > 0);
        assert_eq!(ops(t), ops(rd) + ops(wr));
        assert_eq!(t["bytes"].as_u64().unwrap(), ops(t) * bs);
        let lat = &t["latency"];
        for k in [
            "min_us", "mean_us", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "stdev_us",
        ] {
            assert!(lat.get(k).is_some(), "no latency '{k}' in {lat}");
        }
        assert!(num(&lat["p50_us"]) <= num(&lat["p99_us"]) && num(&lat["p99_us"]) <= num(&lat["max_us"]) * 1.001);
        assert!(num(&r["cpu_percent"]) >= 0.0);
    }
}

#[test]
fn bench_daemon_targets_and_a_local_vdisk() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    create_pool(&d, "b", &disks(&t.path().join("disks"), 2, 1 << 30));
    d.ok(&["vdisk", "create", "b/v", "--size", "64M", "--layout", "mirror"]);
    d.ok(&["nbd", "export", "b/v"]);
    let iqn = "iqn.2026-11.io.tessera:bench-test";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "b/v"]);
    let nbd = format!("nbd://{}/v", d.nbd_address());
    let iscsi = format!("iscsi://{}/{iqn}/0", d.iscsi_portal());

    // Verified mixed I/O over both protocols, two runs each.
    for url in [&nbd, &iscsi] {
        let s = bench_json(&[
            url, "-b", "8K", "-t", "2", "-o", "4", "-w", "40", "-d", "0.7", "--runs", "2", "--verify",
        ]);
        check_summary(&s, 2);
        let v = &s["runs"][1]["verify"];
        assert_eq!(v["corrupt"], 0, "{url}: {v}");
        assert!(v["checked"].as_u64().unwrap() > 0, "{url}: {v}");
    }
    // A profile, sequential, with --until-rsd (a loose bound, so that it stops early).
    let s = bench_json(&[
        &nbd,
        "--profile",
        "seq-256k-read",
        "-t",
        "2",
        "-d",
        "0.5",
        "--until-rsd",
        "99",
        "--max-runs",
        "3",
    ]);
    assert_eq!(s["workload"]["random"], false);
    assert_eq!(s["workload"]["block_size"], 262144);
    assert_eq!(s["until_rsd_percent"], 99.0);
    let n = s["runs"].as_array().unwrap().len();
    assert!((2..=3).contains(&n), "{s}");
    check_summary(&s, n);

    // Compare the two protocols on one workload, with a chart.
    let svg = t.path().join("chart.svg");
    let o = bench(&[
        &nbd,
        "--compare",
        &iscsi,
        "-d",
        "0.5",
        "-o",
        "8",
        "--plot",
        svg.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.success, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("x first") && o.stdout.contains(&iscsi),
        "{}",
        o.stdout
    );
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.contains("IOPS"), "{chart}");

    // The daemon holds the pool: an in-process vdisk bench is refused, and says why.
    let o = bench(&["vdisk:b/v", "--state-dir", state.to_str().unwrap(), "-d", "0.2"]);
    assert!(!o.success);
    assert!(
        o.stderr.contains("nbd://") && o.stderr.contains("already serves"),
        "{}",
        o.stderr
    );
    d.stop();
    let s = bench_json(&[
        "vdisk:b/v",
        "--state-dir",
        state.to_str().unwrap(),
        "-d",
        "0.5",
        "-w",
        "50",
        "--verify",
    ]);
    check_summary(&s, 1);
    assert_eq!(s["target"], "vdisk:b/v");

    // A plain file, verified, sequential writes then random reads of what they wrote.
    let f = t.path().join("plain.img");
    std::fs::File::create(&f).unwrap().set_len(32 << 20).unwrap();
    let s = bench_json(&[
        f.to_str().unwrap(),
        "-s",
        "-w",
        "100",
        "-d",
        "0.5",
        "-o",
        "4",
        "--verify",
    ]);
    check_summary(&s, 1);
    assert_eq!(s["runs"][0]["read"]["ops"], 0);
    assert!(
        std::fs::metadata(&f).unwrap().len() == 32 << 20,
        "the file keeps its size"
    );

    // Bad requests get clear errors.
    for (args, why) in [
        (vec!["vdisk:b/nope", "--state-dir", state.to_str().unwrap()], "nope"),
        (
            vec!["vdisk:zz/v", "--state-dir", state.to_str().unwrap()],
            "no pool 'zz'",
        ),
        (vec![&nbd, "--profile", "fast"], "no profile 'fast'"),
        (vec![&nbd, "--until-rsd", "0"], "percentage"),
        (vec!["http://x/y"], "a target is"),
        (vec![&nbd, "-b", "1000"], ""),
        (
            vec![f.to_str().unwrap(), "-b", "1000"],
            "multiple of the target's 4096-byte block",
        ),
        (vec![f.to_str().unwrap(), "--offset", "64M"], "beyond"),
        (vec!["/nonexistent/disk.img"], "cannot open"),
    ] {
        let o = bench(&args);
        assert!(!o.success, "{args:?} succeeded");
        assert!(o.stderr.contains(why), "{args:?}: {}", o.stderr);
    }
}

/// More threads than the target takes sessions from one initiator: the threads share the
/// sessions it took, the run completes with every block verified, and the user is told.
#[test]
fn bench_threads_share_the_sessions_a_target_limits() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let d = Daemon::start_configured(&state, "iscsi_sessions_per_initiator = 2\n");
    create_pool(&d, "b", &disks(&t.path().join("disks"), 2, 1 << 30));
    d.ok(&["vdisk", "create", "b/v", "--size", "32M", "--layout", "mirror"]);
    let iqn = "iqn.2026-11.io.tessera:bench-limit";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "b/v"]);
    let iscsi = format!("iscsi://{}/{iqn}/0", d.iscsi_portal());
    let o = bench(&[
        &iscsi, "-t", "5", "-o", "2", "-w", "50", "-d", "0.5", "--verify", "--json",
    ]);
    assert!(o.success, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr
            .contains("took 2 sessions from this initiator; the 5 threads share them"),
        "{}",
        o.stderr
    );
    let s: Value = serde_json::from_str(&o.stdout).unwrap();
    check_summary(&s, 1);
    assert_eq!(s["runs"][0]["verify"]["corrupt"], 0, "{s}");
    assert_eq!(s["workload"]["threads"], 5, "{s}");
}

/// diskspd's -S modes: -Sh (and -Sw, -Suw) write through and say so, -Su writes back; hints
/// of the Windows cache, an unknown mode, and a target taken for the mode are refused with
/// the reason, before anything is opened.
#[test]
fn caching_modes_are_read_as_diskspd_writes_them() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("f.img");
    std::fs::File::create(&f).unwrap().set_len(16 << 20).unwrap();
    let f = f.to_str().unwrap();
    for (mode, through) in [("-Sh", true), ("-Sw", true), ("-Suw", true), ("-Su", false)] {
        let o = bench(&[f, mode, "-w", "100", "-o", "2", "-d", "0.2"]);
        assert!(o.success, "{mode}: {}", o.stderr);
        assert_eq!(o.stdout.contains("writes through"), through, "{mode}: {}", o.stdout);
    }
    for (mode, says) in [
        ("-Sb", "no meaning here"),
        ("-Sq", "the modes are"),
        ("-S", "looks like the target"),
    ] {
        let args = if mode == "-S" { vec![mode, f] } else { vec![f, mode] };
        let o = bench(&args);
        assert!(!o.success && o.stderr.contains(says), "{mode}: {}", o.stderr);
    }
}
