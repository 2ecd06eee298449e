//! Replication between two real daemons on loopback: a replica bit-exact to its source's
//! snapshot after full and incremental cycles, read-only until promoted; cycles cut by SIGKILL
//! of either daemon go on where they stopped; a peer without the key gets nothing; promote,
//! demote and reverse send only what changed; a full pool at the replica fails the cycle and
//! leaves the source whole.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

struct Site {
    d: Daemon,
    dir: PathBuf,
}

impl Site {
    /// A daemon taking replicas on a loopback port, with the key file `key` (made by the
    /// first site that starts with it), and a pool `pool` of three 1 GiB file disks.
    fn start(dir: &Path, key: &Path, pool: &str, disk_size: u64) -> Site {
        Site::start_with(dir, key, pool, disk_size, "")
    }

    /// `start`, with `extra` lines in the daemon's configuration.
    fn start_with(dir: &Path, key: &Path, pool: &str, disk_size: u64, extra: &str) -> Site {
        let d = Site::daemon(dir, key, &stable_listen(), extra);
        create_pool(&d, pool, &disks(&dir.join("disks"), 3, disk_size));
        Site {
            d,
            dir: dir.to_path_buf(),
        }
    }

    fn daemon(dir: &Path, key: &Path, listen: &str, extra: &str) -> Daemon {
        std::fs::create_dir_all(dir).unwrap();
        let cfg = format!(
            "replication_listen = \"{listen}\"\nreplication_psk_file = \"{}\"\n{extra}",
            key.display()
        );
        Daemon::start_configured(&dir.join("state"), &cfg)
    }

    /// Starts the daemon again, on the same replication port.
    fn restart(&mut self, key: &Path, listen: &str) {
        self.d = Site::daemon(&self.dir, key, listen, "");
    }

    /// `replica create VDISK --to TO --target-pool POOL --name NAME EXTRA...` at this site.
    fn replicate(&self, vdisk: &str, to: &str, pool: &str, name: &str, extra: &[&str]) -> String {
        let mut args = vec![
            "replica",
            "create",
            vdisk,
            "--to",
            to,
            "--target-pool",
            pool,
            "--name",
            name,
        ];
        args.extend_from_slice(extra);
        self.d.ok(&args)
    }

    fn listen(&self) -> String {
        self.d.json(&["replica", "list"])["listen"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// The vdisk (or snapshot) read back into a file.
    fn export(&self, vdisk: &str, name: &str) -> PathBuf {
        let p = self.dir.join(name);
        self.d
            .ok(&["vdisk", "export", vdisk, p.to_str().unwrap(), "--overwrite"]);
        p
    }

    fn replica(&self, name: &str) -> Value {
        self.d.json(&["replica", "show", name])
    }

    /// Waits until the replica's state is `state`.
    fn wait_state(&self, name: &str, state: &str) -> Value {
        let t = Instant::now();
        loop {
            let r = self.replica(name);
            if r["state"] == state {
                return r;
            }
            assert!(t.elapsed() < Duration::from_secs(90), "not {state}: {r}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the replica has done `cycles` cycles.
    fn wait_cycles(&self, name: &str, cycles: u64) -> Value {
        let t = Instant::now();
        loop {
            let r = self.replica(name);
            if r["cycles"].as_u64().unwrap() >= cycles && r["state"] != "syncing" {
                return r;
            }
            assert!(t.elapsed() < Duration::from_secs(120), "no cycle {cycles}: {r}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A loopback address for a site's replication listener that stays free while its daemon
/// is killed and started again on it: a port below the kernel's ephemeral range (32768 and
/// up by default), which no socket bound to port 0 (every other listener of the tests that
/// run beside) can take meanwhile, found free now. Once, a site restarted on a port of that
/// range found it taken by another test's daemon.
fn stable_listen() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7919);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = 20000 + (seed.wrapping_add(n.wrapping_mul(104_729)) % 12000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
    panic!("no free port from 20000 to 31999 on 127.0.0.1");
}

/// Checks that site `s` refuses to clone the replica `vdisk` or export it to an image, as it
/// holds part of two cycles, and starts no image.
fn refuses_copies_of_a_torn_copy(s: &Site, vdisk: &str) {
    let img = s.dir.join("mixed.img");
    for (args, what) in [
        (vec!["vdisk", "clone", vdisk, "copy"], "cloned"),
        (
            vec!["vdisk", "export", vdisk, img.to_str().unwrap()],
            "exported to an image",
        ),
    ] {
        let e = s.d.fails(&args);
        assert!(e.contains("a cycle is writing it") && e.contains(what), "{args:?}: {e}");
    }
    assert!(!img.exists(), "an image was started");
}

/// Where most tests start: site A with pool "p" and site B with pool "q", each on 1 GiB
/// disks, sharing the key file in the returned directory.
fn two_sites() -> (tempfile::TempDir, PathBuf, Site, Site) {
    let t = tempfile::tempdir().unwrap();
    let key = t.path().join("replication.psk");
    let a = Site::start(&t.path().join("a"), &key, "p", 1 << 30);
    let b = Site::start(&t.path().join("b"), &key, "q", 1 << 30);
    (t, key, a, b)
}

fn write_image(site: &Site, vdisk: &str, size: u64, seed: u64) {
    let img = site.dir.join(format!("w{seed}.img"));
    random_image(&img, size, seed);
    site.d.ok(&["vdisk", "import", vdisk, img.to_str().unwrap()]);
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

#[test]
fn replicas_follow_their_source_and_fail_over_and_back() {
    let (_t, key, a, b) = two_sites();
    let key_text = std::fs::read_to_string(&key).unwrap();
    assert!(key_text.starts_with("tessera:"), "a psktool key file: {key_text}");

    a.d.ok(&["vdisk", "create", "p/db", "--size", "96M", "--layout", "mirror"]);
    write_image(&a, "p/db", 40 << 20, 1);
    let out = a.replicate("p/db", &b.listen(), "q", "dr", &["--interval", "0"]);
    assert!(out.contains("replica dr: p/db to q/db"), "{out}");

    // The first cycle: only allocated data crosses (the image has holes; the rest of the
    // vdisk was never written).
    let out = a.d.ok(&["replica", "sync", "dr"]);
    assert!(out.contains("full"), "{out}");
    let r = a.replica("dr");
    assert_eq!(r["state"], "idle", "{r}");
    assert_eq!(r["last_snapshot"], "repl-dr-1");
    let allocated = n(&a.d.json(&["vdisk", "show", "p/db"]), "allocated_bytes");
    assert!(n(&r, "changed_bytes") <= allocated, "{r}");
    assert!(n(&r, "wire_bytes") < 40 << 20, "holes and zeros do not cross: {r}");
    let src = a.export("p/db@repl-dr-1", "a1.img");
    let dst = b.export("q/db@repl-dr-1", "b1.img");
    assert!(same_file(&src, &dst), "the replica differs from its source's snapshot");
    assert!(
        r["last_cycle"]["link"]["segments_out"].as_u64().unwrap() > 0,
        "a link report: {r}"
    );

    // The replica is read-only to everyone but its source.
    let i = b.d.json(&["replica", "show", "q/db"]);
    assert_eq!(i["last_snapshot"], "repl-dr-1", "{i}");
    for (args, what) in [
        (vec!["vdisk", "resize", "q/db", "--size", "128M"], "resized"),
        (vec!["vdisk", "delete", "q/db"], "deleted"),
        (vec!["snapshot", "create", "q/db@mine"], "snapshotted"),
        (vec!["nbd", "export", "q/db"], "exported writable"),
    ] {
        let e = b.d.fails(&args);
        assert!(e.contains("is a replica") && e.contains(what), "{args:?}: {e}");
    }
    // Nor cloned or exported to an image while a cycle was cut short in it (its marker
    // stands): it then holds part of two cycles.
    let marker = b
        .dir
        .join("state")
        .join("replication-cycles")
        .join("q")
        .join("db.cycle");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, br#"{"base":"repl-dr-1","snapshot":"repl-dr-2"}"#).unwrap();
    refuses_copies_of_a_torn_copy(&b, "q/db");
    std::fs::remove_file(&marker).unwrap();
    b.d.ok(&["nbd", "export", "q/db", "--read-only"]);
    b.d.ok(&["nbd", "remove", "db"]);
    // Nor can the source's own vdisk be replaced by a peer: B cannot replicate into A's p/db.
    b.d.ok(&["vdisk", "create", "q/other", "--size", "8M"]);
    b.d.ok(&[
        "replica",
        "create",
        "q/other",
        "--to",
        &a.listen(),
        "--target-pool",
        "p",
        "--target-vdisk",
        "db",
        "--name",
        "evil",
        "--interval",
        "0",
    ]);
    let e = b.d.fails(&["replica", "sync", "evil"]);
    assert!(e.contains("is not a replica"), "{e}");
    b.d.ok(&["replica", "delete", "evil"]);
    assert!(same_file(&src, &a.export("p/db@repl-dr-1", "a1b.img")));

    // An incremental cycle after a small change sends about that change.
    write_image(&a, "p/db", 1 << 20, 2);
    a.d.ok(&["replica", "sync", "dr"]);
    let r = a.replica("dr");
    let last = &r["last_cycle"];
    assert_eq!(last["full"], false, "{r}");
    assert!(last["changed_bytes"].as_u64().unwrap() <= 2 << 20, "{r}");
    assert!(last["wire_bytes"].as_u64().unwrap() <= (1 << 20) * 6 / 5, "{r}");
    assert!(same_file(
        &a.export("p/db@repl-dr-2", "a2.img"),
        &b.export("q/db@repl-dr-2", "b2.img")
    ));
    let m = a.d.http("GET", "/metrics", None).body;
    for line in [
        "tessera_replica_cycles_total{pool=\"p\",replica=\"dr\",result=\"ok\",vdisk=\"db\"} 2",
        "tessera_replica_syncing{pool=\"p\",replica=\"dr\",vdisk=\"db\"} 0",
    ] {
        assert!(m.contains(line), "{line} in {m}");
    }
    assert!(m.contains("tessera_replica_wire_bytes_total{pool=\"p\",replica=\"dr\",vdisk=\"db\"}"));
    let m = b.d.http("GET", "/metrics", None).body;
    assert!(
        m.contains("tessera_replica_incoming_age_seconds{pool=\"q\",vdisk=\"db\"}"),
        "{m}"
    );
    // The source keeps only the common snapshot; the replica its newest two.
    let snaps = a.d.ok(&["snapshot", "list", "p/db"]);
    assert!(!snaps.contains("repl-dr-1") && snaps.contains("repl-dr-2"), "{snaps}");

    // Failover: B promotes its replica, which becomes writable at the last snapshot.
    let out = b.d.ok(&["replica", "promote", "q/db"]);
    assert!(out.contains("promoted"), "{out}");
    write_image(&b, "q/db", 2 << 20, 3);
    // A's cycles are refused from now on, and A is not harmed.
    write_image(&a, "p/db", 1 << 20, 4);
    let e = a.d.fails(&["replica", "sync", "dr"]);
    assert!(e.contains("is not a replica"), "{e}");
    // Failback: A hands p/db over, B replicates back from the common snapshot.
    a.d.ok(&["replica", "demote", "dr"]);
    let e = a.d.fails(&["vdisk", "resize", "p/db", "--size", "200M"]);
    assert!(e.contains("is a replica"), "{e}");
    let out = b.d.ok(&[
        "replica",
        "reverse",
        "q/db",
        "--to",
        &a.listen(),
        "--target-pool",
        "p",
        "--name",
        "back",
        "--interval",
        "0",
    ]);
    assert!(out.contains("from the common snapshot repl-dr-2"), "{out}");
    b.d.ok(&["replica", "sync", "back"]);
    let r = b.replica("back");
    let last = &r["last_cycle"];
    assert_eq!(last["full"], false, "only the changes go back: {r}");
    assert!(
        last["wire_bytes"].as_u64().unwrap() <= (2 << 20) * 6 / 5,
        "only what B changed crosses: {r}"
    );
    assert!(
        same_file(
            &b.export("q/db@repl-back-1", "b3.img"),
            &a.export("p/db@repl-back-1", "a3.img")
        ),
        "A converged to B, and gave up what it wrote after the common snapshot"
    );
    assert!(same_file(&b.export("q/db", "b4.img"), &a.export("p/db", "a4.img")));

    let events = a.d.ok(&["events", "-n", "50"]);
    assert!(events.contains("replica.demoted"), "{events}");
    let events = b.d.ok(&["events", "-n", "50"]);
    assert!(events.contains("replica.promoted"), "{events}");
}

/// A gateway that opens a replica's pool without the record of the daemon that received it
/// (a pool on RADOS taken over by another gateway; here the same daemon with its replication
/// record set aside) knows the replica by the mark in the pool's metadata: it refuses to
/// present it writable, and can promote it. The first daemon, back with its old record, then
/// has its source's cycles refused rather than write over what the hosts wrote since.
#[test]
fn a_replica_is_known_by_its_pool_not_only_by_the_daemon_that_received_it() {
    let (_t, key, a, mut b) = two_sites();
    let b_listen = b.listen();
    a.d.ok(&["vdisk", "create", "p/db", "--size", "32M", "--layout", "simple"]);
    write_image(&a, "p/db", 8 << 20, 1);
    a.replicate("p/db", &b_listen, "q", "dr", &["--interval", "0"]);
    a.d.ok(&["replica", "sync", "dr"]);
    assert_eq!(b.replica("q/db")["cycles"], 1);

    // Another gateway: the pool, without this daemon's record of what it received.
    let record = b.dir.join("state").join("replication.json");
    let kept = b.dir.join("replication.json.kept");
    b.d.stop();
    std::fs::rename(&record, &kept).unwrap();
    b.restart(&key, &b_listen);
    let iqn = "iqn.2026-11.test.replication:b";
    b.d.ok(&["target", "create", iqn]);
    for (args, what) in [
        (vec!["nbd", "export", "q/db"], "exported writable"),
        (vec!["vdisk", "delete", "q/db"], "deleted"),
        (vec!["target", "lun", "add", iqn, "q/db"], "presented as a LUN"),
    ] {
        let e = b.d.fails(&args);
        assert!(e.contains("is a replica") && e.contains(what), "{args:?}: {e}");
    }
    // It takes the replica on, by its mark: listed, at the last snapshot a cycle made, and
    // kept by the source's next cycle, which sends only what changed.
    let r = b.replica("q/db");
    assert_eq!(r["last_snapshot"], "repl-dr-1", "{r}");
    let events = b.d.ok(&["events", "-n", "20"]);
    assert!(events.contains("replica.adopted"), "{events}");
    write_image(&a, "p/db", 1 << 20, 5);
    a.d.ok(&["replica", "sync", "dr"]);
    let r = a.replica("dr");
    assert!(n(&r["last_cycle"], "sent_bytes") <= 2 << 20, "{r}");
    assert!(same_file(
        &a.export("p/db@repl-dr-2", "a2.img"),
        &b.export("q/db@repl-dr-2", "b2.img")
    ));
    assert_eq!(b.replica("q/db")["cycles"], 1);
    let out = b.d.ok(&["replica", "promote", "q/db"]);
    assert!(out.contains("promoted"), "{out}");
    b.d.ok(&["nbd", "export", "q/db"]);
    b.d.ok(&["nbd", "remove", "db"]);
    write_image(&b, "q/db", 4 << 20, 2);
    let promoted = b.export("q/db", "promoted.img");

    // The first gateway again, with its old record, which it drops as it opens the pool: the
    // source's next cycle is refused. The record is made to lack its note of having marked
    // the vdisk (as a daemon's whose state file could not be written then): the promotion's
    // own record tells all the same.
    let old_record = |b: &mut Site| {
        b.d.stop();
        let mut saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&kept).unwrap()).unwrap();
        assert_eq!(saved["incoming"]["q/db"]["marked"], true, "{saved}");
        saved["incoming"]["q/db"]["marked"] = false.into();
        std::fs::write(&record, serde_json::to_vec(&saved).unwrap()).unwrap();
        b.restart(&key, &b_listen);
        let events = b.d.ok(&["events", "-n", "20"]);
        assert!(events.contains("replica.forgotten"), "{events}");
        assert!(b.d.fails(&["replica", "show", "q/db"]).contains("not a replica"));
    };
    old_record(&mut b);
    write_image(&a, "p/db", 1 << 20, 3);
    let e = a.d.fails(&["replica", "sync", "dr"]);
    assert!(e.contains("is not a replica"), "{e}");
    assert!(same_file(&promoted, &b.export("q/db", "after.img")));
    // It is no replica here either, and cannot be promoted again (which would put it back to
    // a cycle's snapshot, over what the hosts wrote).
    let e = b.d.fails(&["replica", "promote", "q/db"]);
    assert!(e.contains("not a replica"), "{e}");
    b.d.ok(&["nbd", "export", "q/db"]);
    assert!(same_file(&promoted, &b.export("q/db", "after2.img")));
    b.d.ok(&["nbd", "remove", "db"]);

    // The same when the promoted vdisk was deleted and one of its name made since, which
    // carries no record of a promotion: the old record names another vdisk.
    b.d.ok(&["vdisk", "delete", "q/db"]);
    b.d.ok(&["vdisk", "create", "q/db", "--size", "32M", "--layout", "simple"]);
    write_image(&b, "q/db", 2 << 20, 6);
    let made_again = b.export("q/db", "made-again.img");
    old_record(&mut b);
    let e = a.d.fails(&["replica", "sync", "dr"]);
    assert!(e.contains("is not a replica"), "{e}");
    assert!(same_file(&made_again, &b.export("q/db", "after3.img")));

    // And when the vdisk is gone (deleted through another gateway), the old record is
    // dropped, and the source's next cycle makes the replica again, whole.
    b.d.ok(&["vdisk", "delete", "q/db"]);
    old_record(&mut b);
    a.d.ok(&["replica", "sync", "dr"]);
    assert_eq!(b.replica("q/db")["cycles"], 1);
    assert!(same_file(
        &a.export("p/db", "a-last.img"),
        &b.export("q/db", "b-last.img")
    ));
}

#[test]
fn cycles_cut_by_sigkill_go_on_where_they_stopped() {
    let (_t, key, mut a, mut b) = two_sites();
    let b_listen = b.listen();
    a.d.ok(&["vdisk", "create", "p/db", "--size", "64M", "--layout", "mirror"]);
    write_image(&a, "p/db", 48 << 20, 11);
    // 4 MiB/s: the first cycle takes about ten seconds, time to cut it.
    a.replicate("p/db", &b_listen, "q", "dr", &["--interval", "0", "--bandwidth", "4M"]);
    a.d.ok(&["replica", "sync", "dr", "--no-wait"]);
    wait_progress(&a, "p/db", 8 << 20);
    a.d.kill9();
    a.restart(&key, "127.0.0.1:0");
    // The cycle cut short goes on at once with the same snapshot, not from the start.
    let r = a.wait_cycles("dr", 1);
    assert_eq!(r["last_snapshot"], "repl-dr-1", "{r}");
    let sent_after_restart = r["last_cycle"]["sent_bytes"].as_u64().unwrap();
    assert!(
        sent_after_restart < n(&r, "changed_bytes") - (6 << 20),
        "what the replica got before the cut is not sent again: {r}"
    );
    assert!(same_file(
        &a.export("p/db@repl-dr-1", "a1.img"),
        &b.export("q/db@repl-dr-1", "b1.img")
    ));

    // Now the replica's daemon dies mid-cycle.
    write_image(&a, "p/db", 40 << 20, 12);
    a.d.ok(&["replica", "sync", "dr", "--no-wait"]);
    wait_progress(&a, "p/db", 8 << 20);
    b.d.kill9();
    let r = a.wait_state("dr", "failing");
    assert_eq!(r["pending_snapshot"], "repl-dr-2", "{r}");
    b.restart(&key, &b_listen);
    // The next retry (every 10 s) finds the replica where it was.
    let r = a.wait_cycles("dr", 2);
    assert_eq!(r["last_snapshot"], "repl-dr-2", "{r}");
    assert!(
        n(&r["last_cycle"], "sent_bytes") < n(&r["last_cycle"], "changed_bytes") - (6 << 20),
        "what the replica got before its daemon died is not sent again: {r}"
    );
    assert!(same_file(
        &a.export("p/db@repl-dr-2", "a2.img"),
        &b.export("q/db@repl-dr-2", "b2.img")
    ));
    let events = a.d.ok(&["events", "-n", "50"]);
    assert!(
        events.contains("replica.cycle_failed") && events.contains("replica.recovered"),
        "{events}"
    );
}

/// A cycle cut short leaves the working copy holding part of two cycles. A daemon that opens
/// the pool afterwards without the receiving daemon's files (a pool on RADOS taken over by
/// another gateway; here the same daemon with its replication record and its markers of
/// cycles set aside) knows it from the pool's metadata: it refuses to clone the working copy
/// or export it to an image until the source's next cycle has put it back and committed.
#[test]
fn a_working_copy_cut_mid_cycle_is_known_so_by_its_pool() {
    let (_t, key, a, mut b) = two_sites();
    let b_listen = b.listen();
    a.d.ok(&["vdisk", "create", "p/db", "--size", "64M", "--layout", "simple"]);
    write_image(&a, "p/db", 4 << 20, 21);
    // 4 MiB/s: the second cycle takes about ten seconds, time to cut it.
    a.replicate("p/db", &b_listen, "q", "dr", &["--interval", "0", "--bandwidth", "4M"]);
    a.d.ok(&["replica", "sync", "dr"]);
    write_image(&a, "p/db", 40 << 20, 22);
    a.d.ok(&["replica", "sync", "dr", "--no-wait"]);
    wait_progress(&a, "p/db", 8 << 20);
    b.d.kill9();
    // Held at the source meanwhile: a try of the source's could otherwise reach B first.
    a.wait_state("dr", "failing");
    a.d.ok(&["replica", "pause", "dr"]);
    let state = b.dir.join("state");
    std::fs::rename(state.join("replication.json"), b.dir.join("replication.json.kept")).unwrap();
    let cycles = state.join("replication-cycles");
    assert!(
        cycles.join("q").join("db.cycle").exists(),
        "the cut cycle left no marker"
    );
    std::fs::remove_dir_all(&cycles).unwrap();
    b.restart(&key, &b_listen);
    refuses_copies_of_a_torn_copy(&b, "q/db");
    // The source's next try puts the copy back to its base and commits: whole again.
    a.d.ok(&["replica", "resume", "dr"]);
    let r = a.wait_cycles("dr", 2);
    assert_eq!(r["last_snapshot"], "repl-dr-2", "{r}");
    b.d.ok(&["vdisk", "clone", "q/db", "copy"]);
    assert!(same_file(
        &a.export("p/db@repl-dr-2", "a2.img"),
        &b.export("q/copy", "b-copy.img")
    ));
}

/// A promotion while the source is sending a cycle (slowly: a source that trickles its bytes
/// would hold a cycle open for as long as it likes) cuts that cycle, on every one of its
/// streams, and promotes the replica at its last consistent snapshot; the source's next
/// cycles are refused.
#[test]
fn a_promotion_cuts_the_cycle_under_way() {
    let (_t, _key, a, b) = two_sites();
    a.d.ok(&["vdisk", "create", "p/db", "--size", "64M", "--layout", "mirror"]);
    write_image(&a, "p/db", 2 << 20, 21);
    a.replicate(
        "p/db",
        &b.listen(),
        "q",
        "dr",
        &["--interval", "0", "--bandwidth", "1M", "--streams", "2"],
    );
    a.d.ok(&["replica", "sync", "dr"]);
    let first = a.export("p/db@repl-dr-1", "a1.img");
    // The next cycle carries 40 MiB at 1 MiB/s: under way for about forty seconds.
    write_image(&a, "p/db", 40 << 20, 22);
    a.d.ok(&["replica", "sync", "dr", "--no-wait"]);
    wait_progress(&a, "p/db", 2 << 20);
    assert_eq!(b.d.json(&["replica", "show", "q/db"])["receiving"], true);
    let out = b.d.ok(&["replica", "promote", "q/db"]);
    assert!(out.contains("promoted") && out.contains("repl-dr-1"), "{out}");
    assert!(
        same_file(&b.export("q/db", "b1.img"), &first),
        "promoted at the last cycle"
    );
    let events = b.d.ok(&["events", "-n", "20"]);
    assert!(events.contains("the cycle it was receiving was cut"), "{events}");
    // The source hears of it: its cycle failed, and the next is refused.
    a.wait_state("dr", "failing");
    let e = a.d.fails(&["replica", "sync", "dr"]);
    assert!(e.contains("is not a replica"), "{e}");
}

/// An image being made of a replica's working copy holds the next cycle off (the image would
/// take part of two cycles), and a promotion does not wait for it: the export is cut.
#[test]
fn an_export_of_a_working_copy_holds_cycles_off_and_a_promotion_cuts_it() {
    let (_t, _key, a, b) = two_sites();
    a.d.ok(&["vdisk", "create", "p/db", "--size", "64M", "--layout", "mirror"]);
    write_image(&a, "p/db", 16 << 20, 31);
    a.replicate("p/db", &b.listen(), "q", "dr", &["--interval", "0"]);
    a.d.ok(&["replica", "sync", "dr"]);
    // 14 MiB of data read at 256 KiB/s: under way for most of a minute.
    let img = b.dir.join("slow.img");
    let job = b.d.json(&[
        "vdisk",
        "export",
        "q/db",
        img.to_str().unwrap(),
        "--rate",
        "256K",
        "--no-wait",
    ]);
    let id = job["id"].as_u64().unwrap().to_string();
    write_image(&a, "p/db", 1 << 20, 32);
    let e = a.d.fails(&["replica", "sync", "dr"]);
    assert!(e.contains("exported to an image"), "{e}");
    let running = b.d.json(&["job", "show", &id]);
    assert_eq!(
        running["state"], "running",
        "the export ended before the cycle was asked: {running}"
    );
    assert_eq!(b.d.json(&["replica", "show", "q/db"])["last_snapshot"], "repl-dr-1");
    let out = b.d.ok(&["replica", "promote", "q/db"]);
    assert!(out.contains("promoted"), "{out}");
    // Cut at once, not when its next read is due.
    let t = Instant::now();
    let e = b.d.fails(&["job", "wait", &id]);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the export went on {:?} after the promotion",
        t.elapsed()
    );
    assert!(e.contains("export of q/db) cancelled: 'q/db' is being promoted"), "{e}");
    let done = b.d.json(&["job", "show", &id]);
    assert_eq!(done["state"], "cancelled", "{done}");
}

/// A source that holds the key may keep its cycle's extra stream open by sending a byte now
/// and then, its first connection silent: the promotion cuts that stream too, and does not
/// wait for it.
#[test]
fn a_promotion_cuts_a_trickling_extra_stream() {
    use std::io::Write;
    use tessera_replication::wire::Kind;
    let (_t, key, a, b) = two_sites();
    a.d.ok(&["vdisk", "create", "p/db", "--size", "16M", "--layout", "mirror"]);
    write_image(&a, "p/db", 1 << 20, 31);
    let to = b.listen();
    a.replicate("p/db", &to, "q", "dr", &["--interval", "0"]);
    a.d.ok(&["replica", "sync", "dr"]);
    // The next cycle, from a sender of this test's own: two streams, then nothing but a byte
    // every second on the second one (each resets its read timeout).
    let (first, mut extra) = raw_cycle_of_two_streams(&b, &key, &to, |extra| {
        // A data frame of 1 MiB announced, its bytes sent one a second.
        let mut head = vec![Kind::Data as u8];
        head.extend_from_slice(&(1u32 << 20).to_be_bytes());
        extra.write_all(&head).unwrap();
    });
    // Dripping until the receiver cuts the stream (a write then fails), for at most 120 s.
    let dripping = std::thread::spawn(move || {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(120) {
            if extra.write_all(&[7]).and_then(|()| extra.flush()).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        false
    });
    let began = Instant::now();
    while b.d.json(&["replica", "show", "q/db"])["receiving"] != true {
        assert!(began.elapsed() < Duration::from_secs(30), "the cycle never began");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = b.d.ok(&["replica", "promote", "q/db"]);
    assert!(out.contains("promoted") && out.contains("repl-dr-1"), "{out}");
    assert!(dripping.join().unwrap(), "the extra stream was never cut");
    drop(first);
}

/// Opens, from a sender of the test's own with `key`, the next cycle of the replica `q/db`
/// (made by `dr`) at `to` (site `b`) with two streams: the first and an extra one it joins,
/// which `then` writes more to. Returns both once the cycle took the extra stream (it does so
/// between two frames of its first connection: empty offers, each answered).
fn raw_cycle_of_two_streams(
    b: &Site,
    key: &Path,
    to: &str,
    then: impl FnOnce(&mut dyn std::io::Write),
) -> (
    tessera_replication::transport::Connection,
    tessera_replication::transport::Connection,
) {
    use std::io::Write;
    use tessera_replication::wire::{self, Kind};
    let v = b.d.json(&["vdisk", "show", "q/db"]);
    let tr = tessera_replication::Transport::from_psk_file(key, "cubic").unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    let begin = serde_json::json!({
        "pool": "q", "vdisk": "db", "size": n(&v, "size"), "grain": n(&v, "grain_size"),
        "block_size": n(&v, "block_size"), "snapshot": "repl-dr-2", "base": "repl-dr-1",
        "streams": 2, "token": token,
    });
    let mut first = tr.connect(to).unwrap();
    first.write_all(wire::MAGIC).unwrap();
    wire::write_frame(&mut first, Kind::Begin, begin.to_string().as_bytes()).unwrap();
    first.flush().unwrap();
    let ready = wire::read_frame(&mut first).unwrap().unwrap();
    assert!(
        matches!(ready.kind, Kind::Ready),
        "{:?}",
        String::from_utf8_lossy(&ready.body)
    );
    let mut extra = tr.connect(to).unwrap();
    extra.write_all(wire::MAGIC).unwrap();
    let join = serde_json::json!({ "token": token, "stream": 1 });
    wire::write_frame(&mut extra, Kind::Join, join.to_string().as_bytes()).unwrap();
    then(&mut extra);
    extra.flush().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    for no in 0..2 {
        wire::write_frame(&mut first, Kind::Offer, &wire::encode_offer(no, &[])).unwrap();
        first.flush().unwrap();
        let want = wire::read_frame(&mut first).unwrap().unwrap();
        assert!(
            matches!(want.kind, Kind::Want),
            "{:?}",
            String::from_utf8_lossy(&want.body)
        );
    }
    (first, extra)
}

/// The replication listener's count of the connections it holds, from site `s`'s metrics.
fn listener_connections(s: &Site) -> u64 {
    let m = s.d.http("GET", "/metrics", None).body;
    let line = m
        .lines()
        .find(|l| l.starts_with("tessera_replication_connections{"))
        .unwrap_or_else(|| panic!("no tessera_replication_connections in {m}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// A cycle's extra streams are read by the cycle's own thread once handed to it; they keep
/// their places at the listener (64 in all) as long as that, not only while they were being
/// handed over: a key holder cannot open connections past the limit by joining them.
#[test]
fn the_extra_streams_of_a_cycle_keep_their_place_at_the_listener() {
    let (_t, key, a, b) = two_sites();
    a.d.ok(&["vdisk", "create", "p/db", "--size", "16M", "--layout", "mirror"]);
    write_image(&a, "p/db", 1 << 20, 32);
    let to = b.listen();
    a.replicate("p/db", &to, "q", "dr", &["--interval", "0"]);
    a.d.ok(&["replica", "sync", "dr"]);
    let settle = |want: u64| {
        let t = Instant::now();
        while listener_connections(&b) != want && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
        }
        listener_connections(&b)
    };
    assert_eq!(settle(0), 0, "the source's cycle ended with its connections");
    let (first, extra) = raw_cycle_of_two_streams(&b, &key, &to, |_| {});
    // The extra stream's own thread has handed it over and ended by now.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        listener_connections(&b),
        2,
        "a stream handed to its cycle left the listener's count"
    );
    drop(extra);
    drop(first);
    assert_eq!(settle(0), 0, "the places are given back when the cycle ends");
}

/// A cycle that fails once under way is refused at once, whatever its extra streams do: the
/// site shuts them down rather than wait for their readers (a silent stream's reader waits a
/// minute for its next frame), and lets go within seconds a sender that, refused, neither
/// sends nor closes. Their places at the listener come back, and the source's next cycle
/// goes on.
#[test]
fn a_failed_cycle_is_refused_at_once_and_its_streams_let_go() {
    use std::io::Write;
    use tessera_replication::wire::{self, Kind};
    let (_t, key, a, b) = two_sites();
    a.d.ok(&["vdisk", "create", "p/db", "--size", "16M", "--layout", "mirror"]);
    write_image(&a, "p/db", 1 << 20, 35);
    let to = b.listen();
    a.replicate("p/db", &to, "q", "dr", &["--interval", "0"]);
    a.d.ok(&["replica", "sync", "dr"]);
    // The next cycle, from a sender of the test's own, whose extra stream is silent once
    // it joined; then a hole after the offers, which the replica refuses.
    let (mut first, mut extra) = raw_cycle_of_two_streams(&b, &key, &to, |_| {});
    first.get_ref().set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    wire::write_frame(&mut first, Kind::Hole, &wire::encode_hole(0, 4096)).unwrap();
    first.flush().unwrap();
    let answer = wire::read_frame(&mut first).expect("the refusal came at once").unwrap();
    let body = String::from_utf8_lossy(&answer.body).into_owned();
    assert!(
        matches!(answer.kind, Kind::Error) && body.contains("after the offers"),
        "{body}"
    );
    for s in [&first, &extra] {
        s.get_ref().set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    }
    assert!(
        proved_and_closed(&mut extra, Duration::from_secs(5)),
        "the extra stream of a refused cycle was held"
    );
    assert!(
        proved_and_closed(&mut first, Duration::from_secs(10)),
        "a refused sender that neither sends nor closes was held"
    );
    let t0 = Instant::now();
    while listener_connections(&b) != 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the places were not given back");
        std::thread::sleep(Duration::from_millis(100));
    }
    write_image(&a, "p/db", 1 << 20, 36);
    a.d.ok(&["replica", "sync", "dr"]);
    assert!(same_file(
        &a.export("p/db@repl-dr-2", "a.img"),
        &b.export("q/db@repl-dr-2", "b.img")
    ));
}

/// Waits until a replication job of `target` has offered `bytes`.
fn wait_progress(s: &Site, target: &str, bytes: u64) {
    let t = Instant::now();
    loop {
        let jobs = s.d.json(&["job", "list"]);
        let done = jobs
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["kind"] == "replicate" && j["target"] == target && j["state"] == "running")
            .map(|j| n(j, "done_bytes"))
            .max();
        if done.is_some_and(|d| d >= bytes) {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no progress: {jobs}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn peers_without_the_key_get_nothing_and_a_full_replica_pool_leaves_the_source_whole() {
    let t = tempfile::tempdir().unwrap();
    let key = t.path().join("replication.psk");
    let other = t.path().join("other.psk");
    // B's pool holds far less than A's vdisk.
    let b = Site::start(&t.path().join("b"), &key, "q", 128 << 20);
    let a = Site::start(&t.path().join("a"), &key, "p", 1 << 30);
    let c = Site::start(&t.path().join("c"), &other, "r", 1 << 30);
    assert_ne!(
        std::fs::read_to_string(&key).unwrap(),
        std::fs::read_to_string(&other).unwrap()
    );

    c.d.ok(&["vdisk", "create", "r/x", "--size", "8M"]);
    c.replicate("r/x", &b.listen(), "q", "x", &["--interval", "0"]);
    let e = c.d.fails(&["replica", "sync", "x"]);
    assert!(
        e.to_lowercase().contains("tls") || e.contains("handshake") || e.contains("alert"),
        "{e}"
    );
    assert!(b.d.json(&["vdisk", "list", "q"]).as_array().unwrap().is_empty());
    let events = b.d.ok(&["events", "-n", "20"]);
    assert!(events.contains("replica.peer_refused"), "{events}");
    // Nor does a raw connection that speaks the protocol in clear get anywhere.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(b.listen()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(b"TSRPL002{\"pool\":\"q\"}");
        let mut buf = [0u8; 64];
        let got = s.read(&mut buf).unwrap_or(0);
        assert!(got == 0 || !String::from_utf8_lossy(&buf[..got]).contains("Ready"));
    }
    assert!(b.d.json(&["vdisk", "list", "q"]).as_array().unwrap().is_empty());

    // A replica larger than its pool: the cycle fails with the pool's reason.
    a.d.ok(&["vdisk", "create", "p/big", "--size", "512M", "--layout", "simple"]);
    write_image(&a, "p/big", 300 << 20, 21);
    a.replicate("p/big", &b.listen(), "q", "big", &["--interval", "0"]);
    let e = a.d.fails(&["replica", "sync", "big"]);
    assert!(e.contains("space") || e.contains("full"), "{e}");
    let r = a.replica("big");
    assert_eq!(r["state"], "failing", "{r}");
    assert!(r["last_error"].as_str().unwrap().contains("replica refused"), "{r}");
    // The source is whole and writable.
    let img = a.dir.join("w21.img");
    assert!(read_back_matches(&img, &a.export("p/big", "big.img")));
    write_image(&a, "p/big", 1 << 20, 22);
    let check = a.d.json(&["pool", "check", "p"]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
}

/// The key files of three sites in `dir`: A's and C's each hold its own key, B's both.
struct Keys {
    a: PathBuf,
    c: PathBuf,
    b: PathBuf,
    /// A's line of B's file (a file of it alone takes C's key out).
    line_a: String,
}

fn three_keys(dir: &Path) -> Keys {
    let (a, c, b) = (dir.join("a.psk"), dir.join("c.psk"), dir.join("b.psk"));
    let (line_a, line_c) = (
        format!("site-a:{}\n", "a1".repeat(32)),
        format!("site-c:{}\n", "c3".repeat(32)),
    );
    std::fs::write(&a, &line_a).unwrap();
    std::fs::write(&c, &line_c).unwrap();
    std::fs::write(&b, format!("{line_a}{line_c}")).unwrap();
    Keys { a, c, b, line_a }
}

/// A site that takes replicas from several sources, each with a key of its own in its key
/// file: a source writes only the replicas made with its key. Another source naming one of
/// them (as if it were its own) is refused, and the replica is left as it was; its own
/// replicas it writes as before.
#[test]
fn a_source_writes_only_the_replicas_made_with_its_own_key() {
    let t = tempfile::tempdir().unwrap();
    let Keys {
        a: key_a,
        c: key_c,
        b: key_b,
        ..
    } = three_keys(t.path());
    let mut b = Site::start(&t.path().join("b"), &key_b, "q", 1 << 30);
    let a = Site::start(&t.path().join("a"), &key_a, "p", 1 << 30);
    let c = Site::start(&t.path().join("c"), &key_c, "r", 1 << 30);
    a.d.ok(&["vdisk", "create", "p/db", "--size", "8M", "--layout", "simple"]);
    write_image(&a, "p/db", 4 << 20, 31);
    a.replicate("p/db", &b.listen(), "q", "db", &["--interval", "0"]);
    a.d.ok(&["replica", "sync", "db"]);
    let before = b.d.json(&["replica", "show", "q/db"]);
    let held = b.export("q/db", "db-before.img");

    // C names A's replica as its own.
    c.d.ok(&["vdisk", "create", "r/db", "--size", "8M", "--layout", "simple"]);
    write_image(&c, "r/db", 4 << 20, 32);
    c.replicate("r/db", &b.listen(), "q", "db", &["--interval", "0"]);
    let e = c.d.fails(&["replica", "sync", "db"]);
    assert!(e.contains("another replication key"), "{e}");
    let after = b.d.json(&["replica", "show", "q/db"]);
    assert_eq!(before["snapshots"], after["snapshots"], "{after}");
    assert!(read_back_matches(&held, &b.export("q/db", "db-after.img")));

    // Each source goes on with its own.
    c.d.ok(&["vdisk", "create", "r/mine", "--size", "8M", "--layout", "simple"]);
    c.replicate("r/mine", &b.listen(), "q", "mine", &["--interval", "0"]);
    c.d.ok(&["replica", "sync", "mine"]);
    assert_eq!(n(&b.d.json(&["replica", "show", "q/mine"]), "cycles"), 1);
    // A cycle leaves only snapshots the site prunes: one named otherwise is refused.
    {
        use std::io::Write;
        use tessera_replication::wire::{self, Kind};
        let v = b.d.json(&["vdisk", "show", "q/mine"]);
        let tr = tessera_replication::Transport::from_psk_file(&key_c, "cubic").unwrap();
        let begin = serde_json::json!({
            "pool": "q", "vdisk": "mine", "size": n(&v, "size"), "grain": n(&v, "grain_size"),
            "block_size": n(&v, "block_size"), "snapshot": "keep-me-1", "base": null,
            "streams": 1, "token": "0123456789abcdef0123456789abcdef",
        });
        let mut s = tr.connect(&b.listen()).unwrap();
        s.write_all(wire::MAGIC).unwrap();
        wire::write_frame(&mut s, Kind::Begin, begin.to_string().as_bytes()).unwrap();
        s.flush().unwrap();
        let answer = wire::read_frame(&mut s).unwrap().unwrap();
        let body = String::from_utf8_lossy(&answer.body).into_owned();
        assert!(!matches!(answer.kind, Kind::Ready) && body.contains("prunes"), "{body}");
        assert!(b.d.fails(&["vdisk", "show", "q/mine@keep-me-1"]).contains("keep-me-1"));
    }
    // B, which holds both keys, reaches each source with the key that source names: C's
    // (not the first of B's file, which C does not hold).
    b.d.ok(&["vdisk", "create", "q/back", "--size", "8M", "--layout", "simple"]);
    b.replicate("q/back", &c.listen(), "r", "back", &["--interval", "0"]);
    b.d.ok(&["replica", "sync", "back"]);
    assert_eq!(n(&c.d.json(&["replica", "show", "r/back"]), "cycles"), 1);
    write_image(&a, "p/db", 1 << 20, 33);
    a.d.ok(&["replica", "sync", "db"]);
    assert_eq!(n(&b.d.json(&["replica", "show", "q/db"]), "cycles"), 2);

    // Another gateway of B's pool, which knows the replicas by their marks in the pool alone
    // (this daemon without its record of them): each stays bound to its source's key.
    let listen = b.listen();
    b.d.stop();
    std::fs::remove_file(b.dir.join("state").join("replication.json")).unwrap();
    b.restart(&key_b, &listen);
    assert_eq!(b.replica("q/db")["last_snapshot"], "repl-db-2");
    let e = c.d.fails(&["replica", "sync", "db"]);
    assert!(e.contains("another replication key"), "taken on from its mark: {e}");
    write_image(&a, "p/db", 1 << 20, 34);
    a.d.ok(&["replica", "sync", "db"]);
    assert_eq!(b.replica("q/db")["last_snapshot"], "repl-db-3");
    c.d.ok(&["replica", "sync", "mine"]);
}

/// A connection from the loopback address `from` (a stranger), held open without a handshake.
fn stranger(to: &str, from: &str) -> std::net::TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{from}:0").parse().unwrap()).unwrap();
        s.connect(to.parse().unwrap()).await.unwrap().into_std().unwrap()
    })
}

/// Whether the listener closed the connection within `within` (it reads nothing from a
/// connection before its handshake, so an open one times out here).
fn closed_within(s: &mut std::net::TcpStream, within: Duration) -> bool {
    use std::io::Read;
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => panic!("the listener answered a connection that sent nothing"),
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

/// A stranger that opens connections and never finishes a handshake holds at most 8 of the
/// listener's places: the next one from its address is closed at once, while other
/// addresses are still taken and a peer with the key replicates; the places come back when
/// its connections go.
#[test]
fn one_address_cannot_hold_every_place_of_the_replication_listener() {
    let t = tempfile::tempdir().unwrap();
    let key = t.path().join("replication.psk");
    let b = Site::start(&t.path().join("b"), &key, "q", 1 << 30);
    let a = Site::start(&t.path().join("a"), &key, "p", 1 << 30);
    let to = b.listen();
    let held: Vec<_> = (0..8).map(|_| stranger(&to, "127.0.0.2")).collect();
    let mut one_more = stranger(&to, "127.0.0.2");
    assert!(
        closed_within(&mut one_more, Duration::from_secs(10)),
        "a 9th handshake from one address was taken"
    );
    let mut elsewhere = stranger(&to, "127.0.0.3");
    assert!(
        !closed_within(&mut elsewhere, Duration::from_secs(1)),
        "another address was refused"
    );
    a.d.ok(&["vdisk", "create", "p/x", "--size", "8M"]);
    write_image(&a, "p/x", 4 << 20, 5);
    a.replicate("p/x", &to, "q", "x", &["--interval", "0"]);
    a.d.ok(&["replica", "sync", "x"]);
    assert!(same_file(
        &a.export("p/x@repl-x-1", "a.img"),
        &b.export("q/x@repl-x-1", "b.img")
    ));
    assert!(b
        .d
        .logs()
        .contains("handshakes from this address (or its IPv6 /64) are under way"));
    drop(held);
    let t0 = Instant::now();
    loop {
        let mut again = stranger(&to, "127.0.0.2");
        if !closed_within(&mut again, Duration::from_millis(500)) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the address never got its places back"
        );
    }
}

/// Whether the listener closed a connection that proved a key and sent nothing, within
/// `within` (it holds one waiting for its opening for 20 s).
fn proved_and_closed(s: &mut impl std::io::Read, within: Duration) -> bool {
    let t0 = Instant::now();
    let mut b = [0u8; 16];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => panic!("the listener sent something to a connection that sent nothing"),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if t0.elapsed() >= within {
                    return false;
                }
            }
            Err(_) => return true,
        }
    }
}

/// Whoever holds a site's key cannot keep the other sites from the replica site's listener:
/// the connections of one key that have not said what they bring number 8 at most (the next
/// is told why and closed at once), and its cycles hold 32 streams at most; a cycle past that is refused,
/// and its source says why. Another key's cycle is taken meanwhile, and the first key's
/// cycles are taken again once its others are over.
#[test]
fn one_key_cannot_hold_every_place_of_the_replication_listener() {
    use std::io::Write;
    use tessera_replication::wire::{self, Kind};
    let t = tempfile::tempdir().unwrap();
    let Keys {
        a: key_a,
        c: key_c,
        b: key_b,
        ..
    } = three_keys(t.path());
    let b = Site::start(&t.path().join("b"), &key_b, "q", 1 << 30);
    let a = Site::start(&t.path().join("a"), &key_a, "p", 1 << 30);
    let to = b.listen();
    let (raw_a, raw_c) = (
        tessera_replication::Transport::from_psk_file(&key_a, "cubic").unwrap(),
        tessera_replication::Transport::from_psk_file(&key_c, "cubic").unwrap(),
    );
    let proved = |tr: &tessera_replication::Transport| {
        let s = tr.connect(&to).unwrap();
        s.get_ref().set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        s
    };
    // The source with key A, ready to replicate.
    a.d.ok(&["vdisk", "create", "p/x", "--size", "8M"]);
    write_image(&a, "p/x", 4 << 20, 41);
    a.replicate("p/x", &to, "q", "x", &["--interval", "0"]);
    // Eight connections of key A that say nothing are held; a ninth is told why and closed.
    let mut silent: Vec<_> = (0..8).map(|_| proved(&raw_a)).collect();
    std::thread::sleep(Duration::from_millis(500));
    for s in &mut silent {
        assert!(
            !proved_and_closed(s, Duration::from_millis(200)),
            "a connection waiting for its opening was closed"
        );
    }
    // The ninth is told why, then closed; a source of the key says why its cycle failed.
    let mut ninth = proved(&raw_a);
    ninth.get_ref().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let answer = wire::read_frame(&mut ninth)
        .expect("a 9th connection of one key waiting for its opening was held")
        .expect("a 9th connection of one key was closed without being told why");
    let body = String::from_utf8_lossy(&answer.body).into_owned();
    assert!(
        matches!(answer.kind, Kind::Error)
            && body.contains("8 connections of key 'site-a' are waiting to say what they bring"),
        "{body}"
    );
    ninth
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(
        proved_and_closed(&mut ninth, Duration::from_secs(5)),
        "a refused connection was held"
    );
    // (While the eight are held: each has 20 s from its handshake to say what it brings.)
    let e = a.d.fails(&["replica", "sync", "x"]);
    assert!(e.contains("are waiting to say what they bring"), "{e}");
    // Refused ones hold no place: past the listener's 64 of them, kept open at this end,
    // another key's connection is still taken.
    let refused: Vec<_> = (0..64).filter_map(|_| raw_a.connect(&to).ok()).collect();
    let mut other = raw_c.connect(&to).unwrap_or_else(|e| {
        panic!("the refused connections of one key held the listener's places: another key's failed: {e}")
    });
    other
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(
        !proved_and_closed(&mut other, Duration::from_secs(1)),
        "another key's connection was closed"
    );
    drop(refused);
    drop(silent);
    // (Their places are given back as the site sees them closed.)
    std::thread::sleep(Duration::from_secs(1));
    // Two cycles of key A that say they open 16 streams each, and wait.
    let begin = |tr: &tessera_replication::Transport, vdisk: &str, streams: u32, token: &str| {
        let mut s = proved(tr);
        s.get_ref().set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let begin = serde_json::json!({
            "pool": "q", "vdisk": vdisk, "size": 1 << 20, "grain": 65536, "block_size": 512,
            "snapshot": format!("repl-{vdisk}-1"), "base": null, "streams": streams, "token": token,
        });
        s.write_all(wire::MAGIC).unwrap();
        wire::write_frame(&mut s, Kind::Begin, begin.to_string().as_bytes()).unwrap();
        s.flush().unwrap();
        let answer = wire::read_frame(&mut s).unwrap().unwrap();
        (s, answer.kind, String::from_utf8_lossy(&answer.body).into_owned())
    };
    let mut held = Vec::new();
    for (vdisk, token) in [("r1", "11".repeat(16)), ("r2", "22".repeat(16))] {
        let (s, kind, body) = begin(&raw_a, vdisk, 16, &token);
        assert!(matches!(kind, Kind::Ready), "{body}");
        held.push(s);
    }
    // Key A's own source is refused now, and says why; a refused cycle is closed at once,
    // holding nothing; key C's cycle is taken.
    let e = a.d.fails(&["replica", "sync", "x"]);
    assert!(
        e.contains("the cycles of key 'site-a' may hold 32 of this site's 64 connections"),
        "{e}"
    );
    let (mut refused, kind, body) = begin(&raw_a, "r4", 1, &"44".repeat(16));
    assert!(matches!(kind, Kind::Error) && body.contains("may hold 32"), "{body}");
    refused
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(
        proved_and_closed(&mut refused, Duration::from_secs(5)),
        "a refused cycle was held"
    );
    let (other, kind, body) = begin(&raw_c, "r3", 16, &"33".repeat(16));
    assert!(matches!(kind, Kind::Ready), "{body}");
    drop(other);
    // Once key A's waiting cycles are over, its source's cycle is taken.
    drop(held);
    let t0 = Instant::now();
    loop {
        let o = a.d.cli(&["replica", "sync", "x"]);
        if o.success {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the key never got its places back: {}",
            o.stderr
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(same_file(
        &a.export("p/x@repl-x-1", "a.img"),
        &b.export("q/x@repl-x-1", "b.img")
    ));
}

#[test]
fn a_consistency_group_is_replicated_and_promoted_at_one_instant() {
    let (_t, key, mut a, b) = two_sites();
    for v in ["p/data", "p/log"] {
        a.d.ok(&["vdisk", "create", v, "--size", "64M", "--layout", "mirror"]);
    }
    write_image(&a, "p/data", 8 << 20, 31);
    write_image(&a, "p/log", 8 << 20, 32);
    for (v, name) in [("p/data", "d"), ("p/log", "l")] {
        a.replicate(v, &b.listen(), "q", name, &["--group", "db", "--interval", "0"]);
    }
    // One sync runs the group's round: both snapshots taken at one instant, both sent.
    let job = a.d.json(&["replica", "sync", "l"]);
    assert_eq!(job["target"], "p/data+log", "{job}");
    assert_eq!(job["result"].as_array().map(Vec::len), Some(2), "{job}");
    let changed: u64 = job["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| n(c, "changed_bytes"))
        .sum();
    assert_eq!(n(&job, "total_bytes"), changed, "the job follows both cycles: {job}");
    assert_eq!(n(&job, "done_bytes"), changed, "{job}");
    for name in ["d", "l"] {
        let r = a.replica(name);
        assert_eq!(r["last_snapshot"], "repl-db-1", "{r}");
        assert_eq!(r["group"], "db", "{r}");
    }
    let data1 = a.export("p/data@repl-db-1", "data1.img");
    let log1 = a.export("p/log@repl-db-1", "log1.img");

    // The next round is cut after the data replica's cycle and before the log's: the log's
    // replica is slow.
    a.d.ok(&["replica", "set", "l", "--bandwidth", "2M"]);
    write_image(&a, "p/data", 8 << 20, 33);
    write_image(&a, "p/log", 24 << 20, 34);
    a.d.ok(&["replica", "sync", "d", "--no-wait"]);
    let t0 = Instant::now();
    while a.replica("d")["cycles"] != 2 {
        assert!(t0.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(100));
    }
    a.d.kill9();
    // B holds data at round 2, log at round 1: promoted together, both go back to round 1.
    let held = b.d.json(&["replica", "show", "q/data"]);
    assert!(held["snapshots"].to_string().contains("repl-db-2"), "{held}");
    let out = b.d.ok(&["replica", "promote", "q/data", "q/log"]);
    assert_eq!(out.matches("at snapshot repl-db-1").count(), 2, "{out}");
    assert!(same_file(&data1, &b.export("q/data", "bdata.img")));
    assert!(same_file(&log1, &b.export("q/log", "blog.img")));
    b.d.ok(&["vdisk", "resize", "q/log", "--size", "128M"]);
    a.restart(&key, "127.0.0.1:0");
}

/// A round of a consistency group that lost one of its snapshots at the source before it was
/// sent (what a crash between the members' fills leaves) is taken again whole, under a new
/// number: never the missing snapshot alone, of a later instant, beside the others.
#[test]
fn a_torn_round_of_a_consistency_group_is_taken_again_whole() {
    let (_t, key, a, mut b) = two_sites();
    for v in ["p/data", "p/log"] {
        a.d.ok(&["vdisk", "create", v, "--size", "64M", "--layout", "mirror"]);
    }
    write_image(&a, "p/data", 4 << 20, 51);
    write_image(&a, "p/log", 4 << 20, 52);
    for (v, name) in [("p/data", "d"), ("p/log", "l")] {
        a.replicate(v, &b.listen(), "q", name, &["--group", "db", "--interval", "0"]);
    }
    a.d.ok(&["replica", "sync", "l"]);
    // Round 2 cannot reach B: its snapshots stay pending at A.
    let listen = b.listen();
    b.d.stop();
    write_image(&a, "p/data", 4 << 20, 53);
    write_image(&a, "p/log", 4 << 20, 54);
    assert!(
        !a.d.cli(&["replica", "sync", "l"]).success,
        "a round reached a stopped site"
    );
    assert_eq!(a.replica("l")["pending_snapshot"], "repl-db-2");
    a.d.ok(&["snapshot", "delete", "p/log@repl-db-2"]);
    write_image(&a, "p/log", 4 << 20, 55);
    b.restart(&key, &listen);
    a.d.ok(&["replica", "sync", "l"]);
    for (name, v) in [("d", "data"), ("l", "log")] {
        let r = a.replica(name);
        assert_eq!(r["last_snapshot"], "repl-db-3", "{r}");
        let snap = format!("{v}@repl-db-3");
        assert!(same_file(
            &a.export(&format!("p/{snap}"), &format!("a-{v}.img")),
            &b.export(&format!("q/{snap}"), &format!("b-{v}.img"))
        ));
    }
    let held = b.d.json(&["replica", "show", "q/log"]);
    assert!(!held["snapshots"].to_string().contains("repl-db-2"), "{held}");
}

/// Two daemons in two network namespaces joined by an emulated 100 Mbit/s link with 90 ms of
/// round trip and 1 % random loss (the seeds' lossy WAN), a cycle over three streams cut for
/// a few seconds mid-way: the replica arrives whole, and the link report shows the round
/// trip and the losses, for each stream.
#[test]
fn replication_across_a_lossy_long_link_between_two_namespaces() {
    if let Some(why) = tessera_linkem::unavailable() {
        tessera_disk::skip("replication_across_a_lossy_long_link_between_two_namespaces", &why);
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mut shape = tessera_linkem::Shape::new(100_000_000, Duration::from_millis(90));
    shape.loss = 0.01;
    let prefix = format!("trepl{}", std::process::id() % 100000);
    let link = tessera_linkem::Link::start(&prefix, shape, shape).unwrap();
    let key = t.path().join("replication.psk");
    let site = |side: &str, ns: &str, addr: std::net::Ipv4Addr, pool: &str| {
        let dir = t.path().join(side);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = format!(
            "replication_listen = \"{addr}:3262\"\nreplication_psk_file = \"{}\"\niscsi_listen = \"127.0.0.1:0\"\nnbd_listen = \"none\"\n",
            key.display()
        );
        let d = Daemon::start_in_netns(ns, &dir.join("state"), &cfg);
        create_pool(&d, pool, &disks(&dir.join("disks"), 3, 1 << 30));
        Site { d, dir }
    };
    let b = site("b", &link.b.name, tessera_linkem::B_ADDR, "q");
    let a = site("a", &link.a.name, tessera_linkem::A_ADDR, "p");
    a.d.ok(&["vdisk", "create", "p/db", "--size", "64M", "--layout", "mirror"]);
    write_image(&a, "p/db", 40 << 20, 41);
    let to = format!("{}:3262", tessera_linkem::B_ADDR);
    a.replicate("p/db", &to, "q", "wan", &["--interval", "0", "--streams", "3"]);
    a.d.ok(&["replica", "sync", "wan", "--no-wait"]);
    wait_progress(&a, "p/db", 8 << 20);
    link.set_cut(true);
    std::thread::sleep(Duration::from_secs(4));
    link.set_cut(false);
    let r = a.wait_cycles("wan", 1);
    assert_eq!(r["last_snapshot"], "repl-wan-1", "{r}");
    assert!(same_file(
        &a.export("p/db@repl-wan-1", "a.img"),
        &b.export("q/db@repl-wan-1", "b.img")
    ));
    let l = &r["last_cycle"]["link"];
    assert!(l["rtt_ms"].as_f64().unwrap() >= 80.0, "the link's round trip: {r}");
    let streams = r["last_cycle"]["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 3, "a report per stream: {r}");
    assert!(
        streams.iter().all(|s| s["segments_out"].as_u64().unwrap() > 0),
        "every stream carried data: {r}"
    );
    assert!(
        l["retransmits"].as_u64().unwrap() > 0,
        "1 % of the packets were lost: {r}"
    );
    let [ab, _] = link.stats();
    eprintln!(
        "40 MiB image over 100 Mbit/s, 90 ms, 1 % loss, cut 4 s: {:.1} s, goodput {:.1} Mbit/s; link a->b: {ab:?}",
        r["last_cycle"]["seconds"].as_f64().unwrap(),
        l["goodput"].as_f64().unwrap() * 8.0 / 1e6
    );
}

/// Cycles every second while a host writes through NBD (qemu-io): each replica snapshot,
/// taken in the middle of the writes, is bit-exact to the source's; a replica left without a
/// cycle past its RPO raises an event, and one when it is back within it.
#[test]
fn replicas_stay_exact_under_steady_writes_and_an_rpo_is_watched() {
    let (_t, _key, a, b) = two_sites();
    a.d.ok(&["vdisk", "create", "p/db", "--size", "64M", "--layout", "mirror"]);
    a.d.ok(&["nbd", "export", "p/db"]);
    let uri = format!("nbd://{}/db", a.d.nbd_address());
    a.replicate("p/db", &b.listen(), "q", "dr", &["--interval", "1s", "--rpo", "1h"]);
    let writes = |from: u64, to: u64| {
        for k in from..to {
            // A 64 KiB write of its own pattern somewhere in the first 48 MiB, 4 KiB aligned.
            let at = (k * 7_340_033) % (48 << 20) / 4096 * 4096;
            let cmd = format!("write -P 0x{:02x} {at} 64k", k % 251);
            ok("qemu-io", &["-f", "raw", "-c", &cmd, &uri]);
        }
    };
    writes(0, 60);
    // The writes go on while cycles run; then the replica pauses with writes still coming.
    let t0 = Instant::now();
    let mut k = 60;
    while a.replica("dr")["cycles"].as_u64().unwrap() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(120), "{}", a.replica("dr"));
        writes(k, k + 5);
        k += 5;
    }
    a.d.ok(&["replica", "pause", "dr"]);
    writes(k, k + 20);
    // A cycle under way when it paused ends first (cancelled): paused once it has.
    let t0 = Instant::now();
    let r = loop {
        let r = a.replica("dr");
        if r["state"] == "paused" || t0.elapsed() > Duration::from_secs(60) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(r["state"], "paused", "{r}");
    let snap = r["last_snapshot"].as_str().unwrap().to_string();
    assert!(same_file(
        &a.export(&format!("p/db@{snap}"), "a1.img"),
        &b.export(&format!("q/db@{snap}"), "b1.img")
    ));
    // Resumed, it catches up with what was written while it was paused.
    a.d.ok(&["replica", "resume", "dr"]);
    let r = a.wait_cycles("dr", r["cycles"].as_u64().unwrap() + 1);
    let snap = r["last_snapshot"].as_str().unwrap().to_string();
    assert!(same_file(
        &a.export(&format!("p/db@{snap}"), "a2.img"),
        &b.export(&format!("q/db@{snap}"), "b2.img")
    ));

    // An RPO of 2 s with no cycles: exceeded, then met again after a sync.
    a.d.ok(&["replica", "set", "dr", "--interval", "0", "--rpo", "2s"]);
    let seen = |kind: &str| {
        let t0 = Instant::now();
        loop {
            let ev = a.d.ok(&["events", "-n", "100"]);
            if ev.contains(kind) {
                return ev;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no {kind}: {ev}");
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    let ev = seen("replica.rpo_exceeded");
    assert!(ev.contains("beyond its RPO of 2 s"), "{ev}");
    assert_eq!(a.replica("dr")["rpo_exceeded"], true);
    writes(500, 501);
    a.d.ok(&["replica", "sync", "dr"]);
    seen("replica.rpo_met");
    let m = a.d.http("GET", "/metrics", None).body;
    assert!(
        m.contains("tessera_replica_rpo_seconds{pool=\"p\",replica=\"dr\",vdisk=\"db\"} 2"),
        "{m}"
    );
}

/// Bad requests get clear errors and change nothing.
#[test]
fn bad_replica_requests_are_refused_with_their_reason() {
    let t = tempfile::tempdir().unwrap();
    let key = t.path().join("replication.psk");
    let a = Site::start(&t.path().join("a"), &key, "p", 1 << 30);
    a.d.ok(&["vdisk", "create", "p/db", "--size", "8M"]);
    a.d.ok(&["snapshot", "create", "p/db@s"]);
    let to = a.listen();
    for (args, why) in [
        (vec!["p/nope", "--to", &to, "--target-pool", "q"], "no vdisk 'nope'"),
        (vec!["p/db@s", "--to", &to, "--target-pool", "q"], "is a snapshot"),
        (
            vec!["p/db", "--to", "nowhere", "--target-pool", "q"],
            "is not HOST:PORT",
        ),
        (vec!["p/db", "--to", "h:0", "--target-pool", "q"], "is not HOST:PORT"),
        (vec!["p/db", "--to", &to, "--target-pool", "../q"], "pool name"),
        (
            vec!["p/db", "--to", &to, "--target-pool", "q", "--name", "a b"],
            "replica name",
        ),
        (
            vec!["p/db", "--to", &to, "--target-pool", "q", "--streams", "17"],
            "streams must be 1 to 16",
        ),
        (
            vec!["p/db", "--to", &to, "--target-pool", "q", "--bandwidth", "1k"],
            "at least 4 KiB",
        ),
        (
            vec!["p/db", "--to", &to, "--target-pool", "q", "--group", ".g"],
            "replica name",
        ),
    ] {
        let mut full = vec!["replica", "create"];
        full.extend(args.iter().copied());
        let e = a.d.fails(&full);
        assert!(e.contains(why), "{full:?}: {e}");
    }
    let e =
        a.d.fails(&["replica", "reverse", "p/db", "--to", &to, "--target-pool", "q"]);
    assert!(e.contains("never a replica"), "{e}");
    assert!(a.d.json(&["replica", "list"])["outgoing"]
        .as_array()
        .unwrap()
        .is_empty());
    for args in [
        vec!["replica", "show", "ghost"],
        vec!["replica", "sync", "ghost"],
        vec!["replica", "delete", "ghost"],
        vec!["replica", "demote", "ghost"],
        vec!["replica", "promote", "p/db"],
    ] {
        let e = a.d.fails(&args);
        assert!(e.contains("no replica") || e.contains("not a replica"), "{args:?}: {e}");
    }
    // The API refuses unknown fields and malformed bodies with their reason.
    let r = a.d.http(
        "POST",
        "/api/replicas",
        Some(r#"{"pool":"p","vdisk":"db","to":"h:1","target_pool":"q","color":1}"#),
    );
    assert_eq!(r.code(), "malformed_request", "{}", r.body);
    assert!(r.body.contains("unknown field `color`"), "{}", r.body);
    let r = a.d.http("PUT", "/api/replicas/ghost", Some("{"));
    assert_eq!(r.code(), "malformed_request", "{}", r.body);
    // Times past a year are refused, not summed into an overflow by the schedule.
    for field in ["interval_secs", "rpo_secs"] {
        let body =
            format!(r#"{{"pool":"p","vdisk":"db","to":"{to}","target_pool":"q","{field}":18446744073709551615}}"#);
        let r = a.d.http("POST", "/api/replicas", Some(&body));
        assert!(r.body.contains("longer than a year"), "{field}: {}", r.body);
        let body = format!(r#"{{"{field}":18446744073709551615}}"#);
        let r = a.d.http("PUT", "/api/replicas/ghost", Some(&body));
        assert!(r.body.contains("longer than a year"), "{field}: {}", r.body);
    }
    // A replica made, then its vdisk: the vdisk cannot go while it is replicated.
    a.d.ok(&[
        "replica",
        "create",
        "p/db",
        "--to",
        &to,
        "--target-pool",
        "q",
        "--interval",
        "0",
    ]);
    let e = a.d.fails(&[
        "replica",
        "create",
        "p/db",
        "--to",
        &to,
        "--target-pool",
        "q",
        "--interval",
        "0",
    ]);
    assert!(e.contains("already exists"), "{e}");
    let e = a.d.fails(&["vdisk", "delete", "p/db"]);
    assert!(e.contains("is replicated as 'p-db'"), "{e}");
}

/// A source site with pool `p`, and a site with pool `q` that holds its peers' key to a
/// quota of 24 MiB, with `extra` in its configuration.
fn quota_sites(dir: &Path, extra: &str) -> (Site, Site) {
    let key = dir.join("replication.psk");
    let a = Site::start(&dir.join("a"), &key, "p", 1 << 30);
    let config = format!("{extra}replication_quota = \"24M\"\nreplication_peers = [\"127.0.0.0/8\", \"::1\"]\n");
    let b = Site::start_with(&dir.join("b"), &key, "q", 1 << 30, &config);
    (a, b)
}

/// A site that takes replicas only in the pools its configuration lists, and only up to a
/// key's quota: a peer holding the key can neither put replicas in the site's other pools
/// nor make them without bound (each is disk space and grain map memory every vdisk here
/// shares); the site's own vdisks are still made.
#[test]
fn a_peer_makes_replicas_only_in_the_listed_pools_and_within_its_quota() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = quota_sites(t.path(), "replication_pools = [\"q\"]\n");
    create_pool(&b.d, "local", &disks(&b.dir.join("local-disks"), 2, 256 << 20));
    for v in ["p/one", "p/two"] {
        a.d.ok(&["vdisk", "create", v, "--size", "16M", "--layout", "simple"]);
    }
    write_image(&a, "p/one", 4 << 20, 41);
    // Not into a pool the site keeps for itself.
    a.replicate("p/one", &b.listen(), "local", "elsewhere", &["--interval", "0"]);
    let e = a.d.fails(&["replica", "sync", "elsewhere"]);
    assert!(e.contains("takes no replicas here"), "{e}");
    assert!(b.d.fails(&["vdisk", "show", "local/one"]).contains("one"));
    // Into the listed pool, within the quota.
    a.replicate("p/one", &b.listen(), "q", "one", &["--interval", "0"]);
    a.d.ok(&["replica", "sync", "one"]);
    assert_eq!(n(&b.d.json(&["replica", "show", "q/one"]), "cycles"), 1);
    // A second replica would pass the key's quota: refused, and nothing is made for it.
    a.replicate("p/two", &b.listen(), "q", "two", &["--interval", "0"]);
    let e = a.d.fails(&["replica", "sync", "two"]);
    assert!(e.contains("replication_quota"), "{e}");
    assert!(b.d.fails(&["vdisk", "show", "q/two"]).contains("two"));
    // Nor may the first grow past it.
    a.d.ok(&["vdisk", "resize", "p/one", "--size", "32M"]);
    let e = a.d.fails(&["replica", "sync", "one"]);
    assert!(e.contains("replication_quota"), "{e}");
    assert_eq!(n(&b.d.json(&["vdisk", "show", "q/one"]), "size"), 16 << 20);
    // The site's own vdisks are made as before.
    b.d.ok(&["vdisk", "create", "q/mine", "--size", "64M"]);
    b.d.ok(&["vdisk", "create", "local/mine", "--size", "64M"]);
}

/// Cycles of one key that begin at once are held to its quota together: of three replicas
/// of 16 MiB under a quota of 24 MiB one is made, whichever claims first, and the others are
/// refused with why, leaving nothing. (Each cycle is counted, at the size it may make its
/// replica, from its claim until it ends. Until 2026-12-06 a replica counted only once its
/// vdisk was made, and cycles that checked the quota within the few milliseconds before one
/// was made all passed it; this test runs the cycles at once, but does not make them meet in
/// that window every time: `of_two_cycles_that_both_began_within_the_quota_only_the_first_claims`,
/// crates/server/src/replication/incoming.rs, does.)
#[test]
fn cycles_that_begin_at_once_are_held_to_their_keys_quota_together() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = quota_sites(t.path(), "");
    let names = ["one", "two", "three"];
    for v in names {
        a.d.ok(&[
            "vdisk",
            "create",
            &format!("p/{v}"),
            "--size",
            "16M",
            "--layout",
            "simple",
        ]);
        a.replicate(&format!("p/{v}"), &b.listen(), "q", v, &["--interval", "0"]);
    }
    let synced: Vec<Out> = std::thread::scope(|s| {
        let syncs: Vec<_> = names
            .iter()
            .map(|v| s.spawn(|| a.d.cli(&["replica", "sync", v])))
            .collect();
        syncs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let made: Vec<&str> = names
        .iter()
        .zip(&synced)
        .filter(|(_, o)| o.success)
        .map(|(v, _)| *v)
        .collect();
    assert_eq!(made.len(), 1, "{synced:?}");
    for (v, o) in names.iter().zip(&synced) {
        if !o.success {
            assert!(o.stderr.contains("replication_quota"), "{v}: {}", o.stderr);
            assert!(b.d.fails(&["vdisk", "show", &format!("q/{v}")]).contains(v));
        }
    }
    assert_eq!(
        n(&b.d.json(&["vdisk", "show", &format!("q/{}", made[0])]), "size"),
        16 << 20
    );
}

/// A site that lists the networks its peers connect from closes a connection from any other
/// address at once, before its handshake, and says so in its events.
#[test]
fn a_peer_outside_the_listed_networks_is_closed_before_its_handshake() {
    let t = tempfile::tempdir().unwrap();
    let key = t.path().join("replication.psk");
    let b = Site::start_with(
        &t.path().join("b"),
        &key,
        "q",
        1 << 30,
        "replication_peers = [\"192.0.2.0/24\", \"2001:db8::/32\"]\n",
    );
    let a = Site::start(&t.path().join("a"), &key, "p", 1 << 30);
    a.d.ok(&["vdisk", "create", "p/x", "--size", "8M", "--layout", "simple"]);
    a.replicate("p/x", &b.listen(), "q", "x", &["--interval", "0"]);
    a.d.fails(&["replica", "sync", "x"]);
    assert!(b.d.json(&["vdisk", "list", "q"]).as_array().unwrap().is_empty());
    let events = b.d.ok(&["events", "-n", "20"]);
    assert!(events.contains("not an address replication_peers lists"), "{events}");
}

/// Snapshots a deleted vdisk of the replica's name left at the replica site (restore points
/// an administrator kept, or another source's) are not the replica's: its cycles neither prune
/// them nor, at a promotion, go back to one.
#[test]
fn a_replica_leaves_the_snapshots_of_a_deleted_namesake_alone() {
    let (_t, _key, a, b) = two_sites();
    b.d.ok(&["vdisk", "create", "q/db", "--size", "8M", "--layout", "simple"]);
    write_image(&b, "q/db", 4 << 20, 51);
    b.d.ok(&["snapshot", "create", "q/db@repl-kept-1"]);
    b.d.ok(&["vdisk", "delete", "q/db"]);
    a.d.ok(&["vdisk", "create", "p/db", "--size", "8M", "--layout", "simple"]);
    a.replicate("p/db", &b.listen(), "q", "db", &["--interval", "0"]);
    for seed in 52..55 {
        write_image(&a, "p/db", 1 << 20, seed);
        a.d.ok(&["replica", "sync", "db"]);
    }
    let r = b.replica("q/db");
    assert_eq!(r["last_snapshot"], "repl-db-3", "{r}");
    b.d.ok(&["vdisk", "show", "q/db@repl-kept-1"]);
    assert!(!r.to_string().contains("repl-kept-1"), "listed as the replica's: {r}");
}

/// A source's key taken out of the replica site's key file (it leaked, say) lets that source
/// in no more, and the cycle it has under way is cut, without restarting the site's daemon;
/// the other sources go on.
#[test]
fn a_key_taken_out_of_the_file_is_refused_and_its_cycle_cut_without_a_restart() {
    let t = tempfile::tempdir().unwrap();
    let Keys {
        a: key_a,
        c: key_c,
        b: key_b,
        line_a,
    } = three_keys(t.path());
    let b = Site::start(&t.path().join("b"), &key_b, "q", 1 << 30);
    let a = Site::start(&t.path().join("a"), &key_a, "p", 1 << 30);
    let c = Site::start(&t.path().join("c"), &key_c, "r", 1 << 30);
    let to = b.listen();
    a.d.ok(&["vdisk", "create", "p/mine", "--size", "8M", "--layout", "simple"]);
    a.replicate("p/mine", &to, "q", "mine", &["--interval", "0"]);
    a.d.ok(&["replica", "sync", "mine"]);
    c.d.ok(&["vdisk", "create", "r/db", "--size", "16M", "--layout", "mirror"]);
    write_image(&c, "r/db", 1 << 20, 61);
    c.replicate("r/db", &to, "q", "dr", &["--interval", "0"]);
    c.d.ok(&["replica", "sync", "dr"]);
    // C's next cycle, under way (from a sender of the test's own, with C's key).
    let (first, extra) = raw_cycle_of_two_streams(&b, &key_c, &to, |_| {});
    assert_eq!(b.replica("q/db")["receiving"], true);

    std::fs::write(&key_b, &line_a).unwrap();
    let began = Instant::now();
    while b.replica("q/db")["receiving"] == true {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the cycle of the revoked key went on"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop((first, extra));
    let e = c.d.fails(&["replica", "sync", "dr"]);
    assert!(
        e.to_lowercase().contains("tls") || e.contains("handshake") || e.contains("alert"),
        "{e}"
    );
    assert_eq!(n(&b.replica("q/db"), "cycles"), 1);
    a.d.ok(&["replica", "sync", "mine"]);
    assert_eq!(n(&b.replica("q/mine"), "cycles"), 2);
    let events = b.d.ok(&["events", "-n", "20"]);
    assert!(
        events.contains("replica.keys_revoked") && events.contains("site-c"),
        "{events}"
    );
    // A file that is not a key file is not taken: the keys stay as they were.
    std::fs::write(&key_b, "site-a:not-a-key\n").unwrap();
    a.d.ok(&["replica", "sync", "mine"]);
    let events = b.d.ok(&["events", "-n", "20"]);
    assert!(events.contains("replica.keys_refused"), "{events}");
}
