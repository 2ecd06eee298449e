//! A pool on RADOS that loses an OSD for good. The suite's shared cluster has one OSD, which
//! the other failure tests kill and start again; here a cluster of three OSDs of its own
//! (scripts/ceph-dev.sh) holds a RADOS pool of three copies, at least two of them written
//! (Ceph's `size 3`, `min_size 2`), and one OSD is killed, its data removed and the OSD purged
//! from the cluster under a verifying write load through a gateway.

#![cfg(feature = "rados")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::verifying_load as load;
use common::*;

/// A Ceph cluster and an etcd of this test's own, stopped and removed when dropped.
struct Cluster {
    dir: PathBuf,
    conf: String,
    etcd: String,
}

fn ceph_dev() -> String {
    format!("{}/../../scripts/ceph-dev.sh", env!("CARGO_MANIFEST_DIR"))
}

impl Cluster {
    fn up(dir: &Path, osds: u32) -> Cluster {
        let dir_arg = dir.to_str().unwrap().to_string();
        let (started, out) = run(&ceph_dev(), &["up", &dir_arg, &osds.to_string()]);
        // Made before the check, so that what did start is stopped.
        let mut cluster = Cluster {
            dir: dir.to_path_buf(),
            conf: dir.join("ceph.conf").to_str().unwrap().to_string(),
            etcd: String::new(),
        };
        assert!(started, "a cluster of {osds} OSDs did not start:\n{out}");
        let env = std::fs::read_to_string(dir.join("env")).unwrap();
        cluster.etcd = env
            .lines()
            .find_map(|l| l.strip_prefix("ETCD_ENDPOINTS="))
            .expect("etcd's endpoint in the cluster's env file")
            .to_string();
        cluster
    }

    fn ceph(&self, args: &[&str]) -> String {
        let mut all = vec!["-c", &self.conf];
        all.extend_from_slice(args);
        ok("ceph", &all)
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-f", "json"]);
        serde_json::from_str(&self.ceph(&all)).unwrap()
    }

    fn osds_up(&self) -> u64 {
        self.json(&["osd", "stat"])["num_up_osds"].as_u64().unwrap()
    }

    /// The placement groups' states and how many are in each, as `ceph pg stat` gives them.
    fn pg_states(&self) -> Vec<(String, u64)> {
        let stat = self.json(&["pg", "stat"]);
        let states = stat["pg_summary"]["num_pg_by_state"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        states
            .iter()
            .map(|s| (s["name"].as_str().unwrap().to_string(), s["num"].as_u64().unwrap()))
            .collect()
    }

    /// Waits until every placement group is active and clean.
    fn until_clean(&self, limit: Duration) {
        let t = Instant::now();
        loop {
            let states = self.pg_states();
            if !states.is_empty() && states.iter().all(|(s, _)| s == "active+clean") {
                return;
            }
            assert!(
                t.elapsed() < limit,
                "placement groups not clean after {limit:?}: {states:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The process id of OSD `id`.
    fn osd_pid(&self, id: u32) -> i32 {
        let (found, out) = run("pgrep", &["-f", &format!("ceph-osd -c {} -i {id}$", self.conf)]);
        assert!(found, "no OSD {id} of {} running: {out}", self.conf);
        out.lines().next().unwrap().trim().parse().unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = run(&ceph_dev(), &["down", self.dir.to_str().unwrap()]);
    }
}

const RADOS_POOL: &str = "tessera-three";

/// Writes through a gateway go on, every one acknowledged, while one of the three OSDs
/// holding the RADOS pool is killed, its data removed and the OSD purged; every block then
/// holds what was acknowledged last, read through the gateway and again through the gateway
/// started anew (which opens the pool from the two copies left), and the pool checks clean.
#[test]
fn acknowledged_writes_survive_an_osd_lost_for_good_in_a_pool_of_three_copies() {
    let test = "acknowledged_writes_survive_an_osd_lost_for_good_in_a_pool_of_three_copies";
    if std::env::var("TESSERA_CEPH_CONF").unwrap_or_default().is_empty() {
        tessera_disk::skip(
            test,
            "Ceph could not start here (TESSERA_CEPH_CONF is empty: scripts/test-scale-out.sh sets it when it can)",
        );
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let cluster = Cluster::up(&t.path().join("cluster"), 3);
    cluster.ceph(&["osd", "pool", "create", RADOS_POOL]);
    cluster.ceph(&["osd", "pool", "set", RADOS_POOL, "size", "3"]);
    cluster.ceph(&["osd", "pool", "set", RADOS_POOL, "min_size", "2"]);
    cluster.until_clean(Duration::from_secs(90));

    let config = gateway_config("gw-a", &cluster.etcd, "/tessera-three");
    let state = t.path().join("gw");
    let mut a = Daemon::start_configured(&state, &config);
    let pool = "three";
    a.ok(&rados_pool_args(pool, RADOS_POOL, &cluster.conf));
    let vdisk = load::create_vdisk(&a, pool);
    a.ok(&["nbd", "export", &vdisk]);

    let acked = Arc::new(Mutex::new(load::Acked::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (addr, acked, stop) = (a.nbd_address(), acked.clone(), stop.clone());
        std::thread::spawn(move || load::run(addr, acked, stop))
    };
    let writes = || acked.lock().unwrap().writes;
    std::thread::sleep(Duration::from_secs(3));
    let before = writes();
    assert!(before > 50, "the load hardly ran: {before} writes");

    // OSD 2 dies and its data goes with it; the monitor marks it down once the other two
    // report it, and it is then taken out and purged: the cluster will never see it again.
    let lost = 2;
    assert_eq!(unsafe { libc::kill(cluster.osd_pid(lost), libc::SIGKILL) }, 0);
    let killed = Instant::now();
    std::fs::remove_dir_all(cluster.dir.join(format!("osd.{lost}"))).unwrap();
    while cluster.osds_up() > 2 {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "OSD {lost} is still up after 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let marked_down = killed.elapsed();
    cluster.ceph(&["osd", "out", &lost.to_string()]);
    cluster.ceph(&["osd", "purge", &lost.to_string(), "--yes-i-really-mean-it"]);
    let purged = writes();
    let t0 = Instant::now();
    while writes() < purged + 200 {
        assert!(
            !writer.is_finished(),
            "a write failed after OSD {lost} was lost: {}",
            a.logs()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "writes did not go on with two OSDs of three"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The pool runs on two copies: its placement groups say so.
    let states = cluster.pg_states();
    assert!(
        states
            .iter()
            .any(|(s, _)| s.contains("undersized") || s.contains("degraded")),
        "the pool does not run short of a copy: {states:?}"
    );
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let a_ = acked.lock().unwrap();
    assert!(
        a_.unknown.iter().all(|&u| u == 0),
        "a write's outcome was never told: {:?}",
        a_.unknown
            .iter()
            .enumerate()
            .filter(|(_, &u)| u != 0)
            .collect::<Vec<_>>()
    );
    eprintln!(
        "{test}: {before} writes before OSD {lost} was killed, {purged} when it was purged, {} in all; \
         marked down {marked_down:?} after it was killed; placement groups {states:?}",
        a_.writes
    );
    load::verify(&a.nbd_address(), &a_);

    // Started anew, the gateway opens the pool from the two copies left.
    a.stop();
    let a = Daemon::start_configured(&state, &config);
    until_served(&a, pool, Duration::from_secs(30));
    load::verify(&a.nbd_address(), &a_);
    let check = a.json(&["pool", "check", pool]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
}
