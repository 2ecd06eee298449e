//! Pools on Ceph RADOS served by several gateways: two real daemons (`tessera serve` with a
//! `[gateway]` table) against the Ceph cluster and etcd that `scripts/test-scale-out.sh`
//! starts, driven by the CLI and read and written by QEMU over NBD. Built with the `rados`
//! feature only (`make test` turns it on).

#![cfg(feature = "rados")]

mod common;

use std::time::{Duration, Instant};

use common::browser::Browser;
use common::verifying_load as load;
use common::*;
use tessera_test_support::cdbs::pr_out;

/// Held shared by every test on the cluster, and alone by the one that kills its OSD: the
/// tests of this file run side by side, and an OSD that is down stalls them all.
static OSD: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The cluster's configuration file and etcd's endpoint, with the test RADOS pool made if
/// missing, and a share of the cluster (see [`OSD`]); or None (the test then says it was
/// skipped, and why).
fn cluster(test: &str) -> Option<(String, String, std::sync::RwLockReadGuard<'static, ()>)> {
    let shared = OSD.read().unwrap_or_else(|e| e.into_inner());
    let (conf, etcd) = cluster_config(test)?;
    Some((conf, etcd, shared))
}

/// The cluster to this test alone (see [`OSD`]), for one that stops or kills its OSD, or
/// has it refuse writes, until dropped (declared first, it is dropped last, whatever became
/// of the test).
fn alone_on_the_cluster() -> Alone {
    Alone(OSD.write().unwrap_or_else(|e| e.into_inner()))
}

struct Alone(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>);

impl Drop for Alone {
    /// Hands the cluster on only once it answers again, so that a test that left it
    /// unable to does not fail every test after it.
    fn drop(&mut self) {
        until_the_test_cluster_answers();
    }
}

/// [`until_the_cluster_answers`], for the cluster the tests were given, if any (as
/// [`cluster_config`] takes it: a test without both skips).
fn until_the_test_cluster_answers() {
    let conf = std::env::var("TESSERA_CEPH_CONF").unwrap_or_default();
    let etcd = std::env::var("TESSERA_ETCD_ENDPOINTS").unwrap_or_default();
    if !conf.is_empty() && !etcd.is_empty() {
        until_the_cluster_answers(&conf);
    }
}

/// Waits until every placement group of the test RADOS pool answers (a listing of its
/// objects visits each one), the cluster's OSD resumed if a test left it stopped. Once, an
/// OSD stopped 30 s (SIGSTOP) and resumed went on refusing a listing for minutes, until
/// it was started again; every test after it failed. An OSD that does not answer within
/// a minute is therefore started again, saying so with what the cluster and the OSD's log
/// said. Does not panic: it runs while a failed test unwinds.
fn until_the_cluster_answers(conf: &str) {
    let answers = |within: Duration| {
        let t0 = Instant::now();
        loop {
            // The listing gives up after `rados_osd_op_timeout` (30 s in the test cluster).
            let ok = std::process::Command::new("rados")
                .args(["-c", conf, "-p", RADOS_POOL, "ls"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return true;
            }
            if t0.elapsed() > within {
                return false;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    if let Some(pid) = osd_pid(conf) {
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    let t0 = Instant::now();
    if answers(Duration::from_secs(60)) {
        return;
    }
    let log = std::path::Path::new(conf).with_file_name("log").join("osd.0.log");
    let (_, status) = try_run("ceph", &["-c", conf, "health", "detail"]);
    // Its last 8 KiB.
    let tail = std::fs::File::open(&log)
        .and_then(|mut f| {
            use std::io::{Read, Seek, SeekFrom};
            let len = f.metadata()?.len();
            f.seek(SeekFrom::Start(len.saturating_sub(8192)))?;
            let mut b = Vec::new();
            f.read_to_end(&mut b)?;
            Ok(String::from_utf8_lossy(&b).into_owned())
        })
        .unwrap_or_else(|e| format!("cannot read it: {e}"));
    eprintln!(
        "the cluster's OSD did not answer a listing of {RADOS_POOL} within {:?} after the test; it is started again.\n\
         ceph health detail:\n{status}\nthe end of {}:\n{tail}",
        t0.elapsed(),
        log.display()
    );
    if let Some(pid) = osd_pid(conf) {
        unsafe { libc::kill(pid, libc::SIGKILL) };
        while unsafe { libc::kill(pid, 0) } == 0 && t0.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let (started, out) = try_run("ceph-osd", &["-c", conf, "-i", "0"]);
    if !started || !answers(Duration::from_secs(120)) {
        eprintln!("the cluster's OSD, started again, does not answer either (started: {started}: {out})");
    }
}

fn cluster_config(test: &str) -> Option<(String, String)> {
    let conf = std::env::var("TESSERA_CEPH_CONF").unwrap_or_default();
    let etcd = std::env::var("TESSERA_ETCD_ENDPOINTS").unwrap_or_default();
    if conf.is_empty() || etcd.is_empty() {
        tessera_disk::skip(
            test,
            "no Ceph cluster or etcd (TESSERA_CEPH_CONF / TESSERA_ETCD_ENDPOINTS are empty: scripts/test-scale-out.sh sets them)",
        );
        return None;
    }
    ok("ceph", &["-c", &conf, "osd", "pool", "create", RADOS_POOL]);
    Some((conf, etcd.split(',').next().unwrap().to_string()))
}

/// The command that creates pool `pool` in the test RADOS pool (4 GiB, 64 MiB slabs).
fn create_rados_pool_args<'a>(pool: &'a str, conf: &'a str) -> [&'a str; 11] {
    rados_pool_args(pool, RADOS_POOL, conf)
}

/// Creates pool `pool` in the test RADOS pool through daemon `d`; what the CLI said.
fn create_rados_pool(d: &Daemon, pool: &str, conf: &str) -> String {
    d.ok(&create_rados_pool_args(pool, conf))
}

const RADOS_POOL: &str = "tessera-gateways";

/// The API token of the daemons whose dashboard a test looks at.
const TOKEN: &str = "gateway-token-0123456789abcdef";

/// Waits until `d` serves `pool` at an epoch later than `epoch`: taken again, not still the
/// opening it had (whose disks refuse everything once its lease lapsed).
fn until_served_after(d: &Daemon, pool: &str, epoch: i64, limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        let p = pool_entry(d, pool);
        if p["health"] != "unavailable"
            && p["rados"]["here"] == true
            && p["rados"]["epoch"].as_i64().is_some_and(|e| e > epoch)
        {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < limit,
            "not taken again after {limit:?}: {p}\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The message of the first `kind` event `d` logged, waited for up to `limit`.
fn until_event(d: &Daemon, kind: &str, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let events = d.json(&["events", "-n", "1000"]);
        let found = events["events"].as_array().unwrap().iter().find(|e| e["kind"] == kind);
        if let Some(e) = found {
            return e["message"].as_str().unwrap().to_string();
        }
        assert!(t0.elapsed() < limit, "no {kind} event within {limit:?}\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `pool move POOL --to TO` at `d`, asked again until `to` has said in etcd that it serves
/// the pool (at its next tick) or the move fails for another reason.
fn move_once_serving(d: &Daemon, pool: &str, to: &str) -> Out {
    let t0 = Instant::now();
    loop {
        let o = d.cli(&["pool", "move", pool, "--to", to]);
        if o.success || !o.stderr.contains("presents no LUN") {
            return o;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "{}", o.stderr);
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn qemu_io(d: &Daemon, export: &str, cmd: &str) -> (bool, String) {
    qemu_io_all(d, export, &[cmd])
}

/// Runs `cmds` in one qemu-io, one connection, in order.
fn qemu_io_all(d: &Daemon, export: &str, cmds: &[&str]) -> (bool, String) {
    let uri = format!("nbd://{}/{export}", d.nbd_address());
    let mut args = vec!["-f", "raw"];
    for &c in cmds {
        args.extend(["-c", c]);
    }
    args.push(&uri);
    let (ok, out) = run("qemu-io", &args);
    // qemu-io reports a failed request on its output and may still exit 0.
    (ok && !out.contains("failed") && !out.contains("error"), out)
}

fn signal(d: &Daemon, sig: i32) {
    let pid = d.child.as_ref().unwrap().id() as i32;
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

#[test]
fn a_pool_on_rados_moves_to_the_other_gateway_when_its_owner_stalls_or_dies() {
    let test = "a_pool_on_rados_moves_to_the_other_gateway_when_its_owner_stalls_or_dies";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("gw{pid}");
    let prefix = format!("/tessera-test-{pid}");
    let t = tempfile::tempdir().unwrap();
    let mut a = Daemon::start_configured(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix));

    // Refusals first: a RADOS pool that does not exist, a capacity left out.
    let e = a.fails(&[
        "pool",
        "create",
        &pool,
        "--rados",
        "no-such-pool",
        "--ceph-conf",
        &conf,
        "--capacity",
        "1G",
    ]);
    assert!(e.contains("no-such-pool"), "{e}");
    let e = a.fails(&["pool", "create", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    assert!(e.contains("--capacity"), "{e}");

    let out = create_rados_pool(&a, &pool, &conf);
    assert!(out.contains("owned by gateway gw-a"), "{out}");
    // A disk of this machine would hold what the other gateways cannot read.
    let local = t.path().join("local.img");
    std::fs::File::create(&local).unwrap().set_len(256 << 20).unwrap();
    let local = local.to_str().unwrap();
    for extra in [
        &["disk", "add", &pool, local][..],
        &["disk", "add", &pool, local, "--usage", "cache"],
    ] {
        let e = a.fails(extra);
        assert!(e.contains("lives in Ceph RADOS"), "{e}");
    }
    let vdisk = format!("{pool}/v");
    a.ok(&["vdisk", "create", &vdisk, "--size", "64M", "--layout", "simple"]);
    a.ok(&["nbd", "export", &vdisk]);
    let (w, out) = qemu_io(&a, "v", "write -P 0xa1 0 4M");
    assert!(w, "{out}");
    let p = pool_entry(&a, &pool);
    assert_eq!(p["rados"]["owner"], "gw-a", "{p}");
    assert_eq!(p["rados"]["here"], true, "{p}");
    // A second pool of that name in the cluster is refused, wherever it is made.
    let e = a.fails(&[
        "pool",
        "create",
        &pool,
        "--rados",
        RADOS_POOL,
        "--ceph-conf",
        &conf,
        "--capacity",
        "4G",
    ]);
    assert!(e.contains("already exists"), "{e}");

    // Gateway B imports the pool and waits: A owns it.
    let mut b = Daemon::start_configured(&t.path().join("b"), &gateway_config("gw-b", &etcd, &prefix));
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    let p = pool_entry(&b, &pool);
    assert_eq!(p["health"], "unavailable", "{p}");
    assert!(p["problem"].as_str().unwrap().contains("owned by gateway gw-a"), "{p}");
    assert_eq!(p["rados"]["owner"], "gw-a", "{p}");
    let listed = b.ok(&["pool", "list"]);
    assert!(
        listed.contains(&format!("{pool}: in RADOS pool {RADOS_POOL}, owned by gateway gw-a")),
        "{listed}"
    );
    // B gets its NBD export and its iSCSI LUN ready: offered once it takes the pool.
    b.ok(&["nbd", "export", &vdisk]);
    let listed = b.json(&["nbd", "list"]);
    assert_eq!(listed[0]["online"], false, "{listed}");
    let iqn = "iqn.2026-11.io.tessera:gw-b";
    b.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    b.ok(&["target", "lun", "add", iqn, &vdisk]);

    // A stalls: B takes the pool over once A's lease lapses, and serves every block A wrote.
    signal(&a, libc::SIGSTOP);
    let took = until_served(&b, &pool, Duration::from_secs(15));
    eprintln!("{test}: taken over {took:?} after the owner stalled (lease 3 s)");
    let (r, out) = qemu_io(&b, "v", "read -P 0xa1 0 4M");
    assert!(r, "{out}");
    let lun = format!("iscsi://{}/{iqn}/0", b.iscsi_portal());
    let (r, out) = run("qemu-io", &["-r", "-f", "raw", "-c", "read -P 0xa1 0 4M", &lun]);
    assert!(r && !out.contains("failed"), "{out}");
    let (w, out) = qemu_io(&b, "v", "write -P 0xb2 0 1M");
    assert!(w, "{out}");
    // B's metrics and list say it serves the pool, taken over once.
    let m = metrics(&b);
    promtool_accepts(&m);
    let this = [("pool", pool.as_str())];
    let this_at_b = [("owner", "gw-b"), ("pool", pool.as_str())];
    for (name, labels, want) in [
        ("tessera_gateway_joined", &[][..], 1.0),
        ("tessera_pool_rados_served_here", &this, 1.0),
        ("tessera_pool_rados_takeovers_total", &this, 1.0),
        ("tessera_pool_rados_failed_takes_total", &this, 0.0),
        ("tessera_pool_rados_owner_info", &this_at_b, 1.0),
    ] {
        assert_eq!(sample(&m, name, labels), Some(want), "{name} {labels:?} in\n{m}");
    }
    assert_eq!(pool_entry(&b, &pool)["rados"]["takeovers"], 1);

    // A resumes: its writes land nowhere, and it lets the pool go.
    signal(&a, libc::SIGCONT);
    let (w, out) = qemu_io(&a, "v", "write -P 0xee 0 1M");
    assert!(!w, "the stalled owner's write was taken after the takeover: {out}");
    let (r, out) = qemu_io(&b, "v", "read -P 0xb2 0 1M");
    assert!(r, "the stalled owner's write changed the data: {out}");
    let t0 = Instant::now();
    loop {
        let p = pool_entry(&a, &pool);
        if p["health"] == "unavailable" && p["rados"]["owner"] == "gw-b" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "A still serves the pool: {p}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let events = a.ok(&["events", "--pool", &pool, "-n", "1000"]);
    assert!(events.contains("no longer served here"), "{events}");
    let m = metrics(&a);
    assert_eq!(sample(&m, "tessera_pool_rados_served_here", &this), Some(0.0), "{m}");
    assert_eq!(
        sample(&m, "tessera_pool_rados_owner_info", &this_at_b),
        Some(1.0),
        "{m}"
    );

    // B dies: A takes the pool back, presents its export again by itself, and reads both.
    b.kill9();
    let took = until_served(&a, &pool, Duration::from_secs(15));
    eprintln!("{test}: taken back {took:?} after the owner was killed (lease 3 s)");
    let (r, out) = qemu_io(&a, "v", "read -P 0xb2 0 1M");
    assert!(r, "{out}");
    let (r, out) = qemu_io(&a, "v", "read -P 0xa1 1M 3M");
    assert!(r, "{out}");
    let check = a.json(&["pool", "check", &pool]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");

    // A crashes and restarts before its lease lapsed: the new run does not take the old
    // run's ownership for its own; it waits for the lease, then takes the pool over like any
    // other gateway would (fencing the old run off).
    a.kill9();
    let mut a = Daemon::start_configured(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix));
    let p = pool_entry(&a, &pool);
    if p["health"] == "unavailable" {
        assert!(p["problem"].as_str().unwrap().contains("an earlier run"), "{p}");
    }
    let took = until_served(&a, &pool, Duration::from_secs(15));
    eprintln!("{test}: taken again {took:?} after the owner restarted");
    let (r, out) = qemu_io(&a, "v", "read -P 0xb2 0 1M");
    assert!(r, "{out}");

    // A clean stop gives the pool up at once, without waiting for the lease to lapse; B,
    // started again, takes it at start and offers its export again.
    a.stop();
    let key = format!("{prefix}/owner/pool.{pool}");
    let (got, owner) = run_env("etcdctl", &["--endpoints", &etcd, "get", &key], &[("ETCDCTL_API", "3")]);
    assert!(got, "{owner}");
    assert!(owner.trim().is_empty(), "still owned after a clean stop: {owner}");
    let mut b = Daemon::start_configured(&t.path().join("b"), &gateway_config("gw-b", &etcd, &prefix));
    until_served(&b, &pool, Duration::from_secs(15));
    let (r, out) = qemu_io(&b, "v", "read -P 0xb2 0 1M");
    assert!(r, "{out}");

    // Destroyed, the pool leaves nothing in the cluster.
    b.ok(&["nbd", "remove", "v"]);
    remove_lun_vdisk_and_pool(&b, iqn, &vdisk, &pool);
    let left = ok("rados", &["-c", &conf, "-p", RADOS_POOL, "ls"]);
    assert!(
        !left.lines().any(|l| l.starts_with(&format!("tessera.{pool}."))),
        "{left}"
    );
    b.stop();
}

/// One name is one pool among the gateways of one etcd prefix: a pool of that name in another
/// RADOS pool has the same ownership and fence record, and each gateway would fence the
/// other pool's owners off instead of its own. Such a pool is refused, created or imported,
/// with why (an import never presents standby LUNs from the other pool's records); once the
/// first is destroyed, the name is free for the other.
#[test]
fn a_pool_name_is_one_pool_among_the_gateways_until_it_is_destroyed() {
    let test = "a_pool_name_is_one_pool_among_the_gateways_until_it_is_destroyed";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("same{pid}");
    let prefix = format!("/tessera-test-same-{pid}");
    let other = "tessera-gateways-other";
    ok("ceph", &["-c", &conf, "osd", "pool", "create", other]);
    let t = tempfile::tempdir().unwrap();
    // An import of a place that holds no such pool claims nothing: the pool is made where
    // it is asked for all the same.
    let mut c = Daemon::start_configured(&t.path().join("c"), &gateway_config("gw-c", &etcd, &prefix));
    c.ok(&["pool", "import", &pool, "--rados", other, "--ceph-conf", &conf]);
    assert_eq!(pool_entry(&c, &pool)["health"], "unavailable");
    std::thread::sleep(Duration::from_secs(2));
    // Nor is it taken (its takings would fence off one connection after another): it waits,
    // saying why.
    let p = pool_entry(&c, &pool);
    assert!(
        p["problem"]
            .as_str()
            .is_some_and(|w| w.contains("the cluster holds no pool")),
        "{p}"
    );
    assert_eq!(p["rados"]["failed_takes"], 0, "{p}");
    c.ok(&["pool", "export", &pool]);
    c.stop();
    let mut a = Daemon::start_configured(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix));
    create_rados_pool(&a, &pool, &conf);
    let mut b = Daemon::start_configured(&t.path().join("b"), &gateway_config("gw-b", &etcd, &prefix));
    let elsewhere = rados_pool_args(&pool, other, &conf);
    let e = b.fails(&elsewhere);
    assert!(
        e.contains(&format!("another pool named {pool} is served by these gateways")) && e.contains(other),
        "{e}"
    );
    let mut c = Daemon::start_configured(&t.path().join("c2"), &gateway_config("gw-c", &etcd, &prefix));
    let e = c.fails(&["pool", "import", &pool, "--rados", other, "--ceph-conf", &conf]);
    assert!(e.contains("another pool named"), "{e}");
    // Through the API: a pool elsewhere exists (409); a RADOS pool the cluster does not have
    // is a mistake in the request (400), no conflict; a cluster that does not answer is
    // unavailable (503).
    let import = |rados_pool: &str| {
        c.http(
            "POST",
            "/api/pools/import",
            Some(&serde_json::json!({"name": pool, "rados": {"pool": rados_pool, "ceph_conf": conf}}).to_string()),
        )
    };
    let r = import(other);
    assert_eq!((r.status, r.code()), (409, "already_exists".to_string()), "{}", r.body);
    let r = import(&format!("nosuchpool{pid}"));
    assert_eq!(
        (r.status, r.code()),
        (400, "invalid_argument".to_string()),
        "{}",
        r.body
    );
    assert!(r.body.contains("the cluster has no such pool"), "{}", r.body);
    assert!(
        c.json(&["pool", "list"]).as_array().unwrap().is_empty(),
        "nothing of the other pool is listed"
    );
    c.stop();
    // A create of the name where the pool lives, while no gateway serves it, is refused and
    // leaves the pool's record as it was: the name is still the pool's. (Until 2026-12-06 the
    // refused create deleted the record, and the name could be given to a pool elsewhere.)
    a.ok(&["pool", "export", &pool]);
    // Refused as a pool that is there, not as one elsewhere: B asked for the name in the
    // other RADOS pool before, and looks where it is asked now.
    let e = b.fails(&create_rados_pool_args(&pool, &conf));
    assert!(e.contains("already carries a label of pool"), "{e}");
    let e = b.fails(&elsewhere);
    assert!(e.contains("another pool named"), "{e}");
    a.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    until_served(&a, &pool, Duration::from_secs(20));
    // A pool of the name made before places were recorded (its record deleted here): a
    // create elsewhere, refused because A owns the pool, leaves no place behind, and the
    // fence record stays the pool's. (Until 2026-12-06 the refused create kept the place it
    // claimed, and once A let the pool go no gateway could take it where it lives.)
    let place = format!("{prefix}/place/pool.{pool}");
    let deleted = ok("etcdctl", &["--endpoints", &etcd, "del", &place]);
    assert_eq!(deleted.trim(), "1", "the place record was there: {deleted}");
    let e = b.fails(&elsewhere);
    assert!(e.contains("gateway gw-a owns it"), "{e}");
    let keys = || {
        let all = format!("{prefix}/");
        ok(
            "etcdctl",
            &["--endpoints", &etcd, "get", "--keys-only", "--prefix", &all],
        )
    };
    let left = keys();
    assert!(!left.contains(&place), "the refused create kept its place: {left}");
    assert!(left.contains(&format!("{prefix}/fence/pool.{pool}")), "{left}");
    // Taken again, the pool is recorded where it lives.
    a.ok(&["pool", "export", &pool]);
    a.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    until_served(&a, &pool, Duration::from_secs(20));
    assert!(keys().contains(&place), "{}", keys());
    // Destroyed at A, the name is B's to give.
    a.ok(&["pool", "destroy", &pool]);
    let out = b.ok(&elsewhere);
    assert!(out.contains("owned by gateway gw-b"), "{out}");
    b.ok(&["pool", "destroy", &pool]);
    a.stop();
    b.stop();
}

/// The configuration record of a pool in the test RADOS pool, damaged by hand (`rados
/// setomapval`) until [`put_right`](Self::put_right).
struct DamagedConfig {
    conf: String,
    object: String,
    saved: std::path::PathBuf,
}

impl DamagedConfig {
    /// The record's omap key: the family "pool", and the key "config" in hex.
    const KEY: &str = "pool/636f6e666967";

    /// Damages the record of pool `pool`, keeping it in `dir` to put it right later.
    fn damage(conf: &str, pool: &str, dir: &std::path::Path) -> DamagedConfig {
        let d = DamagedConfig {
            conf: conf.to_string(),
            object: format!("tessera.{pool}.meta"),
            saved: dir.join("config-record"),
        };
        d.rados(&["getomapval", &d.object, Self::KEY, d.saved.to_str().unwrap()]);
        d.rados(&["setomapval", &d.object, Self::KEY, "{not a configuration"]);
        d
    }

    fn put_right(&self) {
        self.rados(&[
            "setomapval",
            &self.object,
            Self::KEY,
            "--input-file",
            self.saved.to_str().unwrap(),
        ]);
    }

    fn rados(&self, args: &[&str]) {
        ok("rados", &[&["-c", &self.conf, "-p", RADOS_POOL][..], args].concat());
    }
}

/// A pool whose records in the cluster are damaged is not taken, however often it is tried:
/// each taking would blocklist the connection of the one before, an entry that lasts 30
/// days, for an opening that then fails. It waits, saying why, and is taken at a following
/// tick once its records are put right. (Until 2026-12-06 it was taken every 30 s.)
#[test]
fn a_pool_with_damaged_records_is_not_taken_until_they_are_put_right() {
    let test = "a_pool_with_damaged_records_is_not_taken_until_they_are_put_right";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("damaged{pid}");
    let prefix = format!("/tessera-test-damaged-{pid}");
    let t = tempfile::tempdir().unwrap();
    let mut a = Daemon::start_configured(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix));
    create_rados_pool(&a, &pool, &conf);
    a.ok(&["pool", "export", &pool]);
    let damaged = DamagedConfig::damage(&conf, &pool, t.path());
    a.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    std::thread::sleep(Duration::from_secs(3));
    let p = pool_entry(&a, &pool);
    assert_eq!(p["health"], "unavailable", "{p}");
    assert!(
        p["problem"]
            .as_str()
            .is_some_and(|w| w.contains("configuration record is unreadable") && w.contains("not taken")),
        "{p}"
    );
    assert_eq!(p["rados"]["failed_takes"], 0, "{p}");
    assert_eq!(p["rados"]["takeovers"], 0, "{p}");
    damaged.put_right();
    until_served(&a, &pool, Duration::from_secs(20));
    a.ok(&["pool", "destroy", &pool]);
    a.stop();
}

/// Nor is a pool whose metadata's version or epoch no commit of an opening can follow (set
/// by hand, damaged; or an epoch past etcd's revision, as after etcd was restored from an
/// older snapshot): its opening would be refused after its taking fenced a connection off,
/// every tick. It waits, saying what to put right and how, and is taken once it is.
#[test]
fn a_pool_whose_metadata_no_opening_could_stamp_is_not_taken() {
    let test = "a_pool_whose_metadata_no_opening_could_stamp_is_not_taken";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("unstampable{pid}");
    let prefix = format!("/tessera-test-unstampable-{pid}");
    let t = tempfile::tempdir().unwrap();
    let mut a = Daemon::start_configured(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix));
    create_rados_pool(&a, &pool, &conf);
    let meta_object = format!("tessera.{pool}.meta");
    let rados = |args: &[&str]| ok("rados", &[&["-c", conf.as_str(), "-p", RADOS_POOL][..], args].concat());
    let far_epoch = format!("{:020}", 1_000_000_000_000u64);
    // Each put right as its message says: the epoch removed, the revisions bumped (here: the
    // attribute set back), the version set to a number.
    for (attr, value, said, put_right) in [
        (
            "tessera.epoch",
            "x",
            "not an epoch",
            Some(&["rmxattr", meta_object.as_str(), "tessera.epoch"][..]),
        ),
        ("tessera.epoch", far_epoch.as_str(), "etcd lost revisions", None),
        (
            "tessera.meta.version",
            "abc",
            "which no commit can follow",
            Some(&["setxattr", meta_object.as_str(), "tessera.meta.version", "1"][..]),
        ),
    ] {
        a.ok(&["pool", "export", &pool]);
        let original = rados(&["getxattr", &meta_object, attr]);
        assert!(
            !original.trim().is_empty() && original.trim().bytes().all(|b| b.is_ascii_digit()),
            "{original:?}"
        );
        rados(&["setxattr", &meta_object, attr, value]);
        a.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
        std::thread::sleep(Duration::from_secs(3));
        let p = pool_entry(&a, &pool);
        assert_eq!(p["health"], "unavailable", "{attr} {value}: {p}");
        let problem = p["problem"].as_str().unwrap_or_default();
        assert!(
            problem.contains(said) && problem.contains("not taken"),
            "{attr} {value}: {p}"
        );
        assert_eq!(p["rados"]["failed_takes"], 0, "{p}");
        assert_eq!(p["rados"]["takeovers"], 0, "{p}");
        match put_right {
            Some(command) => {
                let said = format!("rados -c {conf} --id admin -p {RADOS_POOL} {}", command.join(" "));
                assert!(problem.contains(&said), "{attr} {value}: not {said:?}: {p}");
                rados(command);
            }
            None => {
                assert!(problem.contains("--bump-revision"), "{p}");
                rados(&["setxattr", &meta_object, attr, original.trim()]);
            }
        }
        until_served(&a, &pool, Duration::from_secs(20));
    }
    a.ok(&["pool", "destroy", &pool]);
    a.stop();
}

/// Nor is a pool whose label is gone (wiped by a destruction that a stop cut short before
/// it removed the records): its opening would refuse it. It waits, saying why, and is
/// taken once the label is back. (Until 2026-12-07 it was taken every 30 s, and a destroyer
/// that came back to finish the destruction waited for the taker to let go.)
#[test]
fn a_pool_whose_label_is_gone_is_not_taken() {
    let test = "a_pool_whose_label_is_gone_is_not_taken";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("unlabelled{pid}");
    let prefix = format!("/tessera-test-unlabelled-{pid}");
    let t = tempfile::tempdir().unwrap();
    let mut a = Daemon::start_configured(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix));
    create_rados_pool(&a, &pool, &conf);
    a.ok(&["pool", "export", &pool]);
    let label_object = format!("tessera.{pool}.data.{:016x}", 0);
    let saved = t.path().join("label");
    let rados = |args: &[&str]| ok("rados", &[&["-c", conf.as_str(), "-p", RADOS_POOL][..], args].concat());
    rados(&["get", &label_object, saved.to_str().unwrap()]);
    rados(&["rm", &label_object]);
    a.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    std::thread::sleep(Duration::from_secs(3));
    let p = pool_entry(&a, &pool);
    assert_eq!(p["health"], "unavailable", "{p}");
    assert!(
        p["problem"]
            .as_str()
            .is_some_and(|w| w.contains("label of pool") && w.contains("is gone") && w.contains("not taken")),
        "{p}"
    );
    assert_eq!(p["rados"]["failed_takes"], 0, "{p}");
    assert_eq!(p["rados"]["takeovers"], 0, "{p}");
    rados(&["put", &label_object, saved.to_str().unwrap()]);
    until_served(&a, &pool, Duration::from_secs(20));
    a.ok(&["pool", "destroy", &pool]);
    a.stop();
}

/// A RADOS pool deleted under the gateway that serves a pool in it: what the host wrote is
/// gone with it, and no read answers zeros for it (librados answers an operation on a
/// deleted pool as a read of an object never written). The pool is listed as unavailable,
/// saying why, and its export here forgets it.
#[test]
fn a_pool_whose_rados_pool_is_deleted_reads_no_zeros_and_is_unavailable() {
    let test = "a_pool_whose_rados_pool_is_deleted_reads_no_zeros_and_is_unavailable";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("deleted{pid}");
    let rados_pool = format!("tessera-deleted-{pid}");
    ok("ceph", &["-c", &conf, "osd", "pool", "create", &rados_pool]);
    let t = tempfile::tempdir().unwrap();
    let mut a = Daemon::start_configured(
        &t.path().join("a"),
        &gateway_config("gw-a", &etcd, &format!("/tessera-test-{pid}-deleted")),
    );
    a.ok(&rados_pool_args(&pool, &rados_pool, &conf));
    let vdisk = format!("{pool}/v");
    a.ok(&["vdisk", "create", &vdisk, "--size", "64M", "--layout", "simple"]);
    a.ok(&["nbd", "export", &vdisk]);
    let (w, out) = qemu_io_all(&a, "v", &["write -P 0xa5 0 16M", "flush"]);
    assert!(w, "{out}");

    ok(
        "ceph",
        &[
            "-c",
            &conf,
            "osd",
            "pool",
            "delete",
            &rados_pool,
            &rados_pool,
            "--yes-i-really-really-mean-it",
        ],
    );
    let t0 = Instant::now();
    let listed = loop {
        // Each read either fails or answers what was written (from what the gateway holds).
        let (_, out) = qemu_io(&a, "v", "read -P 0xa5 0 16M");
        assert!(
            !out.contains("Pattern verification failed"),
            "a read of a deleted RADOS pool answered something else than what was written: {out}"
        );
        let p = pool_entry(&a, &pool);
        if p["health"] == "unavailable" {
            break p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the pool is not listed unavailable: {p}\n{}",
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("{test}: listed as {listed}");
    let problem = listed["problem"].as_str().unwrap_or_default();
    assert!(problem.contains(&rados_pool), "{listed}");
    let (r, out) = qemu_io(&a, "v", "read -P 0xa5 0 4096");
    assert!(!r, "a read of a pool whose RADOS pool is gone was served: {out}");
    a.ok(&["pool", "export", &pool]);
    assert!(a.json(&["pool", "list"]).as_array().unwrap().is_empty());
    a.stop();
}

/// A pool on RADOS whose creation cannot be recorded in the gateway's list of pools to serve
/// at start is not made: it would be served until the next start, then be no gateway's. Its
/// objects and its claim on the name go, and the name can be created again. An import that
/// cannot be recorded is not taken nor served.
#[test]
fn a_pool_on_rados_that_cannot_be_recorded_is_not_made() {
    let test = "a_pool_on_rados_that_cannot_be_recorded_is_not_made";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("unrecorded{pid}");
    let prefix = format!("/tessera-test-unrecorded-{pid}");
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("a");
    let mut a = Daemon::start_configured(&state, &gateway_config("gw-a", &etcd, &prefix));
    // The list is written through a temporary file beside it: a directory there fails it.
    let blocker = state.join("imported.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let e = a.fails(&create_rados_pool_args(&pool, &conf));
    assert!(e.contains("cannot record the imported pools"), "{e}");
    assert!(a.json(&["pool", "list"]).as_array().unwrap().is_empty());
    std::fs::remove_dir(&blocker).unwrap();
    let out = create_rados_pool(&a, &pool, &conf);
    assert!(out.contains("owned by gateway gw-a"), "{out}");
    a.stop();
    let a = Daemon::start_configured(&state, &gateway_config("gw-a", &etcd, &prefix));
    until_served(&a, &pool, Duration::from_secs(30));
    // An import that cannot be recorded is not served behind its error either (nor refused
    // as imported already when tried again).
    a.ok(&["pool", "export", &pool]);
    std::fs::create_dir(&blocker).unwrap();
    let import = ["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf];
    let e = a.fails(&import);
    assert!(e.contains("cannot record the imported pools"), "{e}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        a.json(&["pool", "list"]).as_array().unwrap().is_empty(),
        "{}",
        a.json(&["pool", "list"])
    );
    std::fs::remove_dir(&blocker).unwrap();
    a.ok(&import);
    until_served(&a, &pool, Duration::from_secs(30));
    a.ok(&["pool", "destroy", &pool]);
}

/// A fence record etcd lost (restored from an older snapshot, keys deleted by hand) does not
/// leave a stalled owner unfenced: the pool's metadata says which client its last owner wrote
/// from, and the gateway that takes the pool over blocklists that one too.
#[test]
fn a_stalled_owner_is_fenced_off_even_when_etcd_lost_the_fence_record() {
    let test = "a_stalled_owner_is_fenced_off_even_when_etcd_lost_the_fence_record";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("lostfence{pid}");
    let prefix = format!("/tessera-test-lostfence-{pid}");
    let t = tempfile::tempdir().unwrap();
    let mut a = Daemon::start_configured(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix));
    create_rados_pool(&a, &pool, &conf);
    let vdisk = format!("{pool}/v");
    a.ok(&["vdisk", "create", &vdisk, "--size", "16M", "--layout", "simple"]);
    let client_a = pool_entry(&a, &pool)["rados"]["client"]
        .as_str()
        .expect("the owner's client address")
        .to_string();
    let mut b = Daemon::start_configured(&t.path().join("b"), &gateway_config("gw-b", &etcd, &prefix));
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    signal(&a, libc::SIGSTOP);
    let fence_key = format!("{prefix}/fence/pool.{pool}");
    let deleted = ok("etcdctl", &["--endpoints", &etcd, "del", &fence_key]);
    assert_eq!(deleted.trim(), "1", "the fence record was there: {deleted}");
    let took = until_served(&b, &pool, Duration::from_secs(20));
    eprintln!("{test}: taken over {took:?} after the fence record was deleted");
    let blocklist = ok("ceph", &["-c", &conf, "osd", "blocklist", "ls"]);
    assert!(
        blocklist.contains(&client_a),
        "the stalled owner's client {client_a} is not blocklisted:\n{blocklist}\n{}",
        b.logs()
    );
    signal(&a, libc::SIGCONT);
    a.stop();
    b.ok(&["vdisk", "delete", &vdisk]);
    b.ok(&["pool", "destroy", &pool]);
    b.stop();
}

/// A gateway that starts while its pools' cluster does not answer (its monitors down, here
/// a configuration file naming a monitor address nobody listens on) waits for one taking
/// (the client's 30 s), not one per pool: the pools after it are taken in the background,
/// listed as unavailable meanwhile, and served once the cluster answers. Until 2026-12-07
/// each pool's taking waited 30 s in turn, and the gateway served nothing, its local pools
/// and its API included, until all had: here 90 s, past the 60 s a test waits for a start.
#[test]
fn a_gateway_whose_cluster_does_not_answer_at_its_start_waits_for_one_taking_not_one_per_pool() {
    let test = "a_gateway_whose_cluster_does_not_answer_at_its_start_waits_for_one_taking_not_one_per_pool";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let t = tempfile::tempdir().unwrap();
    // A configuration of its own, to point at a monitor that does not answer.
    let own = t.path().join("ceph.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&own, &text).unwrap();
    let own = own.to_str().unwrap();
    let state = t.path().join("a");
    let config = gateway_config("gw-a", &etcd, &format!("/tessera-test-slowstart-{pid}"));
    let mut a = Daemon::start_configured(&state, &config);
    let pools: Vec<String> = (0..3).map(|i| format!("slow{i}x{pid}")).collect();
    for p in &pools {
        create_rados_pool(&a, p, own);
    }
    a.stop();
    let silent: String = text
        .lines()
        .map(|l| match l.trim_start().starts_with("mon_host") {
            true => "mon_host = [v2:127.0.0.1:9,v1:127.0.0.1:9]\n".to_string(),
            false => format!("{l}\n"),
        })
        .collect();
    assert_ne!(silent, text);
    std::fs::write(own, silent).unwrap();
    let started = Instant::now();
    let a = Daemon::start_configured(&state, &config);
    let took = started.elapsed();
    eprintln!("{test}: started in {took:?} with the cluster not answering");
    // One taking's wait (30 s), not two.
    assert!(took < Duration::from_secs(50), "{took:?}");
    let logs = a.logs();
    assert_eq!(
        logs.matches("pool left to be taken in the background").count(),
        2,
        "{logs}"
    );
    for p in &pools {
        assert_eq!(pool_entry(&a, p)["health"], "unavailable", "{p}");
    }
    std::fs::write(own, &text).unwrap();
    for p in &pools {
        until_served(&a, p, Duration::from_secs(120));
    }
    for p in &pools {
        a.ok(&["pool", "destroy", p]);
    }
}

/// Where `data_paths` confine what the API may name, a Ceph configuration file named through
/// it must be inside them, and so must the files it has the daemon's client read or make:
/// its keyring, its log and its admin socket. A refused one makes nothing.
#[test]
fn a_ceph_configuration_file_named_through_the_api_leads_nowhere_outside_the_data_paths() {
    let test = "a_ceph_configuration_file_named_through_the_api_leads_nowhere_outside_the_data_paths";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("confined{pid}");
    let prefix = format!("/tessera-test-confined-{pid}");
    let t = tempfile::tempdir().unwrap();
    let (data, elsewhere) = (t.path().join("data"), t.path().join("elsewhere"));
    for d in [data.join("run"), data.join("log"), elsewhere.clone()] {
        std::fs::create_dir_all(d).unwrap();
    }
    let cluster_dir = std::path::Path::new(&conf).parent().unwrap();
    std::fs::copy(cluster_dir.join("admin.keyring"), data.join("admin.keyring")).unwrap();
    let text = std::fs::read_to_string(&conf).unwrap();
    let moved = text.replace(cluster_dir.to_str().unwrap(), data.to_str().unwrap());
    assert_ne!(moved, text, "the cluster's configuration names files in its directory");
    let write = |name: &str, text: &str| {
        let p = data.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let as_is = write("as-is.conf", &text);
    // The cluster's file less what it says of where its client makes files.
    let made = ["run_dir", "admin_socket", "log_file", "pid_file"];
    let bare: String = moved
        .lines()
        .filter(|l| !made.iter().any(|m| l.starts_with(m)))
        .map(|l| format!("{l}\n"))
        .collect();
    let socket_elsewhere = write(
        "socket-elsewhere.conf",
        &format!(
            "{bare}\n[client]\nadmin_socket = {}\n",
            elsewhere.join("client.asok").display()
        ),
    );
    let touched_elsewhere = write(
        "touched-elsewhere.conf",
        &format!(
            "{bare}\n[global]\nheartbeat_file = {}\n",
            elsewhere.join("heartbeat").display()
        ),
    );
    // Even inside the data paths: a link put in the log's place before the client opens it
    // would lead anywhere.
    let logged_inside = write(
        "logged-inside.conf",
        &format!(
            "{bare}\n[global]\nlog_file = {}\n",
            data.join("log").join("client.log").display()
        ),
    );
    let config = format!(
        "data_paths = [\"{}\"]\n{}",
        data.display(),
        gateway_config("gw-a", &etcd, &prefix)
    );
    let mut a = Daemon::start_configured(&t.path().join("a"), &config);
    let e = a.fails(&create_rados_pool_args(&pool, &conf));
    assert!(e.contains("outside the places"), "the cluster's own file: {e}");
    let e = a.fails(&create_rados_pool_args(&pool, &as_is));
    assert!(e.contains("sets keyring") && e.contains("outside the places"), "{e}");
    for (file, option) in [
        (&socket_elsewhere, "admin_socket"),
        (&touched_elsewhere, "heartbeat_file"),
        (&logged_inside, "log_file"),
    ] {
        let e = a.fails(&create_rados_pool_args(&pool, file));
        assert!(
            e.contains(&format!("sets {option}")) && e.contains("makes that file by its name"),
            "{e}"
        );
    }
    assert!(a.json(&["pool", "list"]).as_array().unwrap().is_empty());
    // A file that names the monitors names who configures the client too: what the cluster's
    // configuration database says of the client's files counts no more than the file would.
    let client = format!("confined{pid}");
    let entity = format!("client.{client}");
    let keyring = data.join("confined.keyring");
    let _ = run("ceph", &["-c", &conf, "auth", "rm", &entity]);
    ok(
        "ceph",
        &[
            "-c",
            &conf,
            "auth",
            "get-or-create",
            &entity,
            "mon",
            "profile rbd",
            "osd",
            &format!("profile rbd pool={RADOS_POOL}"),
            "-o",
            keyring.to_str().unwrap(),
        ],
    );
    let mon_log = elsewhere.join("from-the-monitors.log");
    ok(
        "ceph",
        &[
            "-c",
            &conf,
            "config",
            "set",
            &entity,
            "log_file",
            mon_log.to_str().unwrap(),
        ],
    );
    let inside = write(
        "inside.conf",
        &format!("{bare}\n[{entity}]\nkeyring = {}\n", keyring.display()),
    );
    let mut args = create_rados_pool_args(&pool, &inside).to_vec();
    args.extend(["--client-name", &client]);
    let out = a.ok(&args);
    let _ = run("ceph", &["-c", &conf, "config", "rm", &entity, "log_file"]);
    assert!(out.contains("owned by gateway gw-a"), "{out}");
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "neither a refused client nor the monitors made a file there"
    );
    a.ok(&["pool", "destroy", &pool]);
    a.stop();
    let _ = run("ceph", &["-c", &conf, "auth", "rm", &entity]);
}

/// What daemon `d` serves at `GET /metrics`.
fn metrics(d: &Daemon) -> String {
    let r = http(&d.sock, "GET", "/metrics", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// A Ceph client of its own for the gateways, with the caps docs/scale-out.md names (`mon
/// 'profile rbd' osd 'profile rbd pool=P'`, librbd's), written to a keyring in `dir`, and a
/// copy of the cluster's configuration file that names that keyring for it. Returns the
/// client's name (without "client.") and that file.
fn client_with_caps(conf: &str, dir: &std::path::Path, name: &str, mon: &str, osd: &str) -> (String, String) {
    let keyring = dir.join(format!("{name}.keyring"));
    let keyring = keyring.to_str().unwrap();
    let entity = format!("client.{name}");
    // Made afresh: caps left from an earlier run of the test would be tested instead.
    let _ = run("ceph", &["-c", conf, "auth", "rm", &entity]);
    ok(
        "ceph",
        &[
            "-c",
            conf,
            "auth",
            "get-or-create",
            &entity,
            "mon",
            mon,
            "osd",
            osd,
            "-o",
            keyring,
        ],
    );
    let own = dir.join(format!("{name}.conf"));
    let text = std::fs::read_to_string(conf).unwrap();
    std::fs::write(&own, format!("{text}\n[{entity}]\nkeyring = {keyring}\n")).unwrap();
    (name.to_string(), own.to_str().unwrap().to_string())
}

/// Imports pool `pool` of the test RADOS pool at daemon `d`, as Ceph client `client` of the
/// configuration file `conf`.
fn import_as(d: &Daemon, pool: &str, conf: &str, client: &str) {
    d.ok(&[
        "pool",
        "import",
        pool,
        "--rados",
        RADOS_POOL,
        "--ceph-conf",
        conf,
        "--client-name",
        client,
    ]);
}

/// The gateways need no more of Ceph than librbd does: running as a client with the caps
/// the docs name (`profile rbd`, on the pool alone), they make a pool, put the RADOS pool in
/// the self-managed snapshot mode, write ordered by their epoch, and the one that takes the
/// pool over blocklists the stalled owner, whose writes then land nowhere. A client whose
/// caps cannot fence (no blocklist) never serves a pool it took over: it gives it back.
#[test]
fn gateways_need_only_the_caps_of_librbd_and_one_that_cannot_fence_serves_nothing() {
    let test = "gateways_need_only_the_caps_of_librbd_and_one_that_cannot_fence_serves_nothing";
    let Some((admin_conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("caps{pid}");
    let prefix = format!("/tessera-test-caps-{pid}");
    let t = tempfile::tempdir().unwrap();
    let osd_caps = format!("profile rbd pool={RADOS_POOL}");
    let (client, conf) = client_with_caps(
        &admin_conf,
        t.path(),
        &format!("tessera-gw-{pid}"),
        "profile rbd",
        &osd_caps,
    );

    let mut a = Daemon::start_on_tcp(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix), TOKEN);
    let mut create = create_rados_pool_args(&pool, &conf).to_vec();
    create.extend(["--client-name", &client]);
    let out = a.ok(&create);
    assert!(out.contains("owned by gateway gw-a"), "{out}");
    let vdisk = format!("{pool}/v");
    a.ok(&["vdisk", "create", &vdisk, "--size", "64M", "--layout", "simple"]);
    a.ok(&["nbd", "export", &vdisk]);
    let (w, out) = qemu_io(&a, "v", "write -P 0xa1 0 4M");
    assert!(w, "{out}");
    let p = pool_entry(&a, &pool);
    assert_eq!(p["rados"]["here"], true, "{p}");
    // The dashboard says where the pool is served.
    let browser = Browser::start();
    let api_a = banner_addr(&a, "dashboard:");
    browser.log_in(&api_a, TOKEN);
    browser.go(&format!("http://{api_a}/#pools"));
    browser.wait_text(
        &format!("#pool-{pool} .rados"),
        &format!(
            "In RADOS pool {RADOS_POOL}: served here at epoch {}",
            p["rados"]["epoch"]
        ),
        20,
    );

    let mut b = Daemon::start_configured(&t.path().join("b"), &gateway_config("gw-b", &etcd, &prefix));
    import_as(&b, &pool, &conf, &client);
    b.ok(&["nbd", "export", &vdisk]);
    signal(&a, libc::SIGSTOP);
    let took = until_served(&b, &pool, Duration::from_secs(15));
    eprintln!("{test}: taken over {took:?} after the owner stalled, with librbd's caps");
    let (r, out) = qemu_io(&b, "v", "read -P 0xa1 0 4M");
    assert!(r, "{out}");
    let (w, out) = qemu_io(&b, "v", "write -P 0xb2 0 1M");
    assert!(w, "{out}");
    signal(&a, libc::SIGCONT);
    let (w, out) = qemu_io(&a, "v", "write -P 0xee 0 1M");
    assert!(!w, "the stalled owner's write was taken after the takeover: {out}");
    let (r, out) = qemu_io(&b, "v", "read -P 0xb2 0 1M");
    assert!(r, "the stalled owner's write changed the data: {out}");
    a.stop();

    // C may read and write the pool's objects but not blocklist anybody: when B stalls, C
    // takes the pool in etcd, cannot fence B off, and gives it back rather than serve it.
    let (weak, weak_conf) = client_with_caps(
        &admin_conf,
        t.path(),
        &format!("tessera-nofence-{pid}"),
        "allow r",
        &osd_caps,
    );
    let mut c = Daemon::start_on_tcp(&t.path().join("c"), &gateway_config("gw-c", &etcd, &prefix), TOKEN);
    import_as(&c, &pool, &weak_conf, &weak);
    c.ok(&["nbd", "export", &vdisk]);
    let b_epoch = pool_entry(&b, &pool)["rados"]["epoch"].as_i64().unwrap();
    signal(&b, libc::SIGSTOP);
    let t0 = Instant::now();
    let mut seen = String::new();
    while t0.elapsed() < Duration::from_secs(12) {
        let p = pool_entry(&c, &pool);
        assert_eq!(
            p["health"], "unavailable",
            "served without fencing the stalled owner: {p}"
        );
        seen = p["problem"].as_str().unwrap_or_default().to_string();
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("{test}: the gateway that cannot fence says: {seen}");
    assert!(
        seen.contains("cannot fence") && seen.contains("may not blocklist"),
        "{seen}\n{}",
        c.logs()
    );
    let (r, _) = qemu_io(&c, "v", "read 0 4k");
    assert!(!r, "the gateway that cannot fence served a read");
    let failed = pool_entry(&c, &pool)["rados"]["failed_takes"].as_u64().unwrap();
    // Tried at 2, 4 s... after the lease lapsed: a few times in 12 s, not hundreds.
    assert!((1..=6).contains(&failed), "{failed} failed attempts");
    let m = metrics(&c);
    let counted = sample(&m, "tessera_pool_rados_failed_takes_total", &[("pool", &pool)]);
    assert!(counted.is_some_and(|n| n >= failed as f64), "{m}");

    // B resumes, finds its lease lost, and takes the pool again (fencing its own earlier
    // connection off); nothing C could not fence was lost. Until then its earlier opening
    // serves nothing: its lease lapsed while it was stopped.
    signal(&b, libc::SIGCONT);
    until_served_after(&b, &pool, b_epoch, Duration::from_secs(20));
    let (r, out) = qemu_io(&b, "v", "read -P 0xb2 0 1M");
    assert!(r, "{out}");
    let (r, out) = qemu_io(&b, "v", "read -P 0xa1 1M 3M");
    assert!(r, "{out}");
    // C's dashboard lists the pool another gateway serves, and C's failed attempts.
    let api_c = banner_addr(&c, "dashboard:");
    browser.log_in(&api_c, TOKEN);
    browser.go(&format!("http://{api_c}/#pools"));
    // C sees B's epoch at its next attempt, after its wait (up to 30 s); B may take the pool
    // afresh meanwhile (at a new epoch), so the two are compared as they are.
    let t0 = Instant::now();
    loop {
        let shown = browser.text(&format!("#pool-{pool} .rados"));
        let epoch = pool_entry(&b, &pool)["rados"]["epoch"].clone();
        if shown.contains(&format!("served by gateway gw-b at epoch {epoch};")) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(45),
            "C's dashboard does not show B's epoch {epoch}: {shown}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    browser.wait_text(&format!("#pool-{pool} .rados"), "failed attempt(s)", 20);
    drop(browser);

    // Moved to C (which exports the vdisk over NBD): C cannot fence B off, so it does not
    // serve the pool; B takes it back once the handover's grace has passed, and gives that
    // move up, once: the pool is not handed over to C again and again.
    until_served(&b, &pool, Duration::from_secs(30));
    let before = pool_entry(&b, &pool)["rados"]["epoch"].as_i64().unwrap();
    b.ok(&["pool", "move", &pool, "--to", "gw-c", "--no-wait"]);
    let t0 = Instant::now();
    let given_up = until_event(&b, "pool.move_given_up", Duration::from_secs(40));
    eprintln!("{test}: B says, {:?} after the move: {given_up}", t0.elapsed());
    assert!(
        given_up.contains("to gateway gw-c is given up: that gateway did not take the pool within 10 s"),
        "{given_up}"
    );
    until_served(&b, &pool, Duration::from_secs(10));
    let back = pool_entry(&b, &pool)["rados"]["epoch"].as_i64().unwrap();
    assert!(back > before, "{back} after {before}");
    std::thread::sleep(Duration::from_secs(12));
    let p = pool_entry(&b, &pool);
    assert_eq!(
        (p["rados"]["here"].clone(), p["rados"]["epoch"].as_i64()),
        (true.into(), Some(back)),
        "{p}"
    );
    c.stop();
    b.ok(&["nbd", "remove", "v"]);
    b.ok(&["vdisk", "delete", &vdisk]);
    b.ok(&["pool", "destroy", &pool]);
    b.stop();
    for name in [client, weak] {
        let _ = run("ceph", &["-c", &admin_conf, "auth", "rm", &format!("client.{name}")]);
    }
}

/// Waits until every OSD holds the cluster's newest map (one that blocklists a client, say):
/// the monitors answer before the OSDs hear of it, and an OSD that has not yet applies what
/// it is sent.
fn osds_caught_up(conf: &str) {
    let json = |args: &[&str]| -> serde_json::Value {
        let out = ok("ceph", &[&["-c", conf, "-f", "json"], args].concat());
        let at = out
            .find(['{', '['])
            .unwrap_or_else(|| panic!("no JSON from ceph {args:?}: {out}"));
        serde_json::Deserializer::from_str(&out[at..])
            .into_iter()
            .next()
            .unwrap()
            .unwrap_or_else(|e| panic!("ceph {args:?}: {e}: {out}"))
    };
    let epoch = json(&["osd", "dump"])["epoch"].as_u64().unwrap();
    let t0 = Instant::now();
    for id in json(&["osd", "ls"]).as_array().unwrap() {
        let osd = format!("osd.{id}");
        while json(&["tell", &osd, "status"])["newest_map"].as_u64().unwrap() < epoch {
            assert!(t0.elapsed() < Duration::from_secs(60), "{osd} is not given map {epoch}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A pool whose writes the cluster refused (here its gateway's client is blocklisted, as a
/// timeout or an operator could have it) is opened again by that gateway, through a fresh
/// client at a new epoch: the host's write fails (over iSCSI with NOT READY, ASYMMETRIC
/// ACCESS STATE TRANSITION, which a host retries, never a medium error, which it would pass
/// to its file system), then writes and flushes go on, and what was written before is there.
#[test]
fn a_pool_whose_writes_were_refused_is_opened_again_and_goes_on() {
    let test = "a_pool_whose_writes_were_refused_is_opened_again_and_goes_on";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("ro{pid}");
    let t = tempfile::tempdir().unwrap();
    let mut a = Daemon::start_configured(
        &t.path().join("a"),
        &gateway_config("gw-a", &etcd, &format!("/tessera-test-{pid}-reopen")),
    );
    create_rados_pool(&a, &pool, &conf);
    let vdisk = format!("{pool}/v");
    a.ok(&["vdisk", "create", &vdisk, "--size", "64M", "--layout", "simple"]);
    a.ok(&["nbd", "export", &vdisk]);
    let iqn = "iqn.2026-11.io.tessera:reopen";
    a.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    a.ok(&["target", "lun", "add", iqn, &vdisk]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let host = tessera_iscsi::initiator::LoginConfig::new("iqn.2026-11.io.example:host", Some(iqn));
    let session = rt
        .block_on(tessera_iscsi::initiator::Session::login(&a.iscsi_portal(), &host))
        .unwrap();
    let iscsi_write = |lba: u32, round: u8| {
        let mut cdb = write1(lba);
        cdb[1] = 0; // no FUA: answered once applied all the same
        rt.block_on(session.command(0, &cdb, block(lba, round), 0))
            .expect("the session answers")
    };
    // Past the first unit attention (the LUN's power on).
    let _ = iscsi_write(8192, 1);
    let r = iscsi_write(8192, 1);
    assert_eq!(r.status, 0, "{:?}", sense_of(&r));
    let write_and_flush = |pattern: &str| qemu_io_all(&a, "v", &[&format!("write -P {pattern} 0 1M"), "flush"]);
    let (w, out) = qemu_io(&a, "v", "write -P 0xa1 0 4M");
    assert!(w, "{out}");
    let (w, out) = write_and_flush("0xa2");
    assert!(w, "{out}");
    let before = pool_entry(&a, &pool);
    let client = before["rados"]["client"]
        .as_str()
        .unwrap_or_else(|| panic!("no client address: {before}"))
        .to_string();
    let epoch = before["rados"]["epoch"].as_i64().unwrap();

    ok("ceph", &["-c", &conf, "osd", "blocklist", "add", &client]);
    osds_caught_up(&conf);
    // Refused by the cluster: nothing written, and the host told to send it again.
    let r = iscsi_write(8192, 2);
    assert_eq!(
        sense_of(&r),
        Some((0x2, 0x04, 0x0A)),
        "a write the cluster refused is not answered as one to send again: status {}",
        r.status
    );
    let (w, out) = write_and_flush("0xb3");
    assert!(
        !w,
        "a flush said durable after the cluster refused the pool's writes: {out}"
    );
    // Opened again within a tick or two (and the lease's check, were it another gateway's).
    let t0 = Instant::now();
    loop {
        let (w, out) = write_and_flush("0xc4");
        if w {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the pool does not take writes again: {out}\n{}",
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("{test}: writes and flushes go on {:?} after the refusal", t0.elapsed());
    let (r, out) = qemu_io(&a, "v", "read -P 0xc4 0 1M");
    assert!(r, "{out}");
    let (r, out) = qemu_io(&a, "v", "read -P 0xa1 1M 3M");
    assert!(r, "what was flushed before the refusal is lost: {out}");
    // The iSCSI host, sending its write again, gets it done: the refused one left nothing.
    let (r, ..) = until_done(
        &rt,
        &session,
        &write1(8192),
        block(8192, 3),
        0,
        Duration::from_secs(30),
        &a,
    );
    assert_eq!(r.status, 0);
    let (r, ..) = until_done(
        &rt,
        &session,
        &read1(8192),
        Vec::new(),
        512,
        Duration::from_secs(30),
        &a,
    );
    assert_eq!(r.data, block(8192, 3));
    let after = pool_entry(&a, &pool);
    assert_eq!(after["rados"]["here"], true, "{after}");
    assert!(after["rados"]["epoch"].as_i64().unwrap() > epoch, "{after}");
    assert_ne!(after["rados"]["client"], before["rados"]["client"], "{after}");
    let events = a.ok(&["events", "--pool", &pool, "-n", "1000"]);
    assert!(events.contains("opened again"), "{events}");
    let check = a.json(&["pool", "check", &pool]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");

    drop(session);
    a.ok(&["target", "delete", iqn]);
    a.ok(&["nbd", "remove", "v"]);
    a.ok(&["vdisk", "delete", &vdisk]);
    a.ok(&["pool", "destroy", &pool]);
    a.stop();
}

/// Makes the OSDs refuse (`on`) or take again every write that sets an attribute (EFBIG:
/// `osd_max_attr_size` of one byte), while reads go on; returns once a write to the test
/// RADOS pool shows it.
fn refuse_attribute_writes(conf: &str, on: bool) {
    if on {
        ok("ceph", &["-c", conf, "config", "set", "osd", "osd_max_attr_size", "1"]);
    } else {
        ok("ceph", &["-c", conf, "config", "rm", "osd", "osd_max_attr_size"]);
    }
    let t = Instant::now();
    let probe = [
        "-c",
        conf,
        "-p",
        RADOS_POOL,
        "setxattr",
        "tessera-attribute-probe",
        "probe",
        "value",
    ];
    while run("rados", &probe).0 == on {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the OSDs did not take the setting"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    if !on {
        ok(
            "rados",
            &["-c", conf, "-p", RADOS_POOL, "rm", "tessera-attribute-probe"],
        );
    }
}

/// A change of a pool's metadata whose write failed other than by a guard (a timeout, a
/// blocklist: the cluster may apply it still) leaves what the gateway holds in memory
/// unlike what the cluster may hold: the pool is opened again from the cluster, though no
/// data write was refused, and no flush says "durable" meanwhile. Before, only a refused
/// data write opened it again: an overwrite in place of a grain whose unmapping had timed
/// out was answered, flushed, and lost at the next opening.
#[test]
fn a_metadata_change_of_unknown_outcome_opens_the_pool_again() {
    let test = "a_metadata_change_of_unknown_outcome_opens_the_pool_again";
    // The OSDs are made to refuse writes (below): the other tests of this file wait.
    let _alone = alone_on_the_cluster();
    let Some((conf, etcd)) = cluster_config(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("mu{pid}");
    let t = tempfile::tempdir().unwrap();
    let mut a = Daemon::start_configured(
        &t.path().join("a"),
        &gateway_config("gw-a", &etcd, &format!("/tessera-test-{pid}-meta-unknown")),
    );
    create_rados_pool(&a, &pool, &conf);
    let vdisk = format!("{pool}/v");
    a.ok(&["vdisk", "create", &vdisk, "--size", "64M", "--layout", "simple"]);
    let before = pool_entry(&a, &pool);
    let epoch = before["rados"]["epoch"].as_i64().unwrap();

    // The OSDs refuse writes that set an attribute (as every metadata batch does), while
    // reads go on. Metadata alone: no data write is refused.
    refuse_attribute_writes(&conf, true);
    let second = format!("{pool}/w");
    let failed = a.cli(&["vdisk", "create", &second, "--size", "16M", "--layout", "simple"]);
    refuse_attribute_writes(&conf, false);
    assert!(!failed.success, "a vdisk made while the cluster held writes back");
    assert!(failed.stderr.contains("may or may not be applied"), "{}", failed.stderr);
    let t0 = Instant::now();
    let after = loop {
        let p = pool_entry(&a, &pool);
        if p["rados"]["here"] == true && p["rados"]["epoch"].as_i64().is_some_and(|e| e > epoch) {
            break p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the pool was not opened again: {p}\n{}",
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    eprintln!("{test}: opened again {:?} after the refusal", t0.elapsed());
    assert_ne!(after["rados"]["client"], before["rados"]["client"], "{after}");
    // Opened from what the cluster holds: the refused change is not there, and the vdisk
    // is made now.
    a.ok(&["vdisk", "create", &second, "--size", "16M", "--layout", "simple"]);
    let check = a.json(&["pool", "check", &pool]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
    a.ok(&["vdisk", "delete", &second]);
    a.ok(&["vdisk", "delete", &vdisk]);
    a.ok(&["pool", "destroy", &pool]);
    a.stop();
}

/// The initiator port of cluster node `node` logging in to `iqn`: its own name and ISID.
fn node_port(node: u8, iqn: &str) -> tessera_iscsi::initiator::LoginConfig {
    let mut c = tessera_iscsi::initiator::LoginConfig::new(&format!("iqn.2026-11.io.example:node{node}"), Some(iqn));
    c.isid[5] = node;
    c
}

/// One command from cluster node `node` (its own initiator port) to LUN 0 of `iqn` at
/// `portal`, in a session of its own, as a node's occasional check would be; unit attentions
/// waiting for the port (its last session ended, the LUN changed) are cleared first with
/// TEST UNIT READY, and returned with the answer (ASC and ASCQ of each). None when the
/// gateway does not serve the LUN (no login, no LUN).
fn node_command(
    rt: &tokio::runtime::Runtime,
    portal: &str,
    iqn: &str,
    node: u8,
    cdb: &[u8],
    data: Vec<u8>,
    read: usize,
) -> Option<(tessera_iscsi::initiator::ScsiResult, Vec<(u8, u8)>)> {
    use tessera_iscsi::initiator::Session;
    rt.block_on(async {
        let s = Session::login(portal, &node_port(node, iqn)).await.ok()?;
        let mut attentions = Vec::new();
        for _ in 0..3 {
            let r = s.command(0, &[0u8; 6], Vec::new(), 0).await.ok()?;
            if r.status == 0 {
                break;
            }
            // Sense key UNIT ATTENTION: cleared by reporting it; NOT READY: a standby port,
            // where the command asked may still be served (PERSISTENT RESERVE IN and OUT);
            // anything else (no such LUN) means the LUN is not served here.
            match r.sense.get(2).map(|k| k & 0x0F) {
                Some(0x06) => attentions.push((r.sense[12], r.sense[13])),
                Some(0x02) => break,
                _ => return None,
            }
        }
        let r = s.command(0, cdb, data, read).await.ok();
        let _ = s.logout().await;
        Some((r?, attentions))
    })
}

/// Gateways A and B, with pool `{tag}{pid}` on RADOS made at A (which owns it), a 64 MiB
/// vdisk `name` in it, and target `iqn` presenting it as LUN 0 at both.
struct TwoGateways {
    a: Daemon,
    b: Daemon,
    pool: String,
    vdisk: String,
    /// Their state directories, removed after the daemons stop (fields drop in order).
    _dir: tempfile::TempDir,
}

fn two_gateways_presenting(conf: &str, etcd: &str, tag: &str, name: &str, iqn: &str) -> TwoGateways {
    two_gateways_presenting_through(conf, [etcd, etcd], tag, name, iqn)
}

/// [`two_gateways_presenting`], A reaching etcd at `etcd[0]` and B at `etcd[1]` (the same
/// etcd through a relay, say).
fn two_gateways_presenting_through(conf: &str, etcd: [&str; 2], tag: &str, name: &str, iqn: &str) -> TwoGateways {
    let pid = std::process::id();
    let pool = format!("{tag}{pid}");
    let prefix = format!("/tessera-test-{tag}-{pid}");
    let dir = tempfile::tempdir().unwrap();
    let a = Daemon::start_configured(&dir.path().join("a"), &gateway_config("gw-a", etcd[0], &prefix));
    create_rados_pool(&a, &pool, conf);
    let vdisk = format!("{pool}/{name}");
    a.ok(&["vdisk", "create", &vdisk, "--size", "64M", "--layout", "simple"]);
    a.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    a.ok(&["target", "lun", "add", iqn, &vdisk]);
    let b = Daemon::start_configured(&dir.path().join("b"), &gateway_config("gw-b", etcd[1], &prefix));
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", conf]);
    b.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    b.ok(&["target", "lun", "add", iqn, &vdisk]);
    TwoGateways {
        a,
        b,
        pool,
        vdisk,
        _dir: dir,
    }
}

/// Removes, at `d` (the owner), LUN 0 of `iqn`, vdisk `vdisk` and pool `pool`.
fn remove_lun_vdisk_and_pool(d: &Daemon, iqn: &str, vdisk: &str, pool: &str) {
    d.ok(&["target", "lun", "remove", iqn, "0"]);
    d.ok(&["vdisk", "delete", vdisk]);
    d.ok(&["pool", "destroy", pool]);
}

/// PERSISTENT RESERVE IN, READ KEYS.
const READ_KEYS: [u8; 10] = [0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];

/// Registers `key` in session `s` (PERSISTENT RESERVE OUT, REGISTER): its first commands
/// find what a new session is owed (POWER ON OCCURRED) and are sent again.
fn register_in(rt: &tokio::runtime::Runtime, s: &tessera_iscsi::initiator::Session, key: u64) {
    let (cdb, p) = pr_out(6, 0, 0, key, false);
    let first = (0..3)
        .map(|_| rt.block_on(s.command(0, &cdb, p.clone(), 0)).unwrap())
        .find(|r| r.status == 0 || sense_of(r).is_some_and(|(k, _, _)| k != 0x6));
    assert_eq!(first.map(|r| r.status), Some(0), "{key:#x} is not registered");
}

/// Sends READ KEYS in session `s` until it hears REGISTRATIONS PREEMPTED (06/2A/05), for up
/// to `limit`, or panics saying `why` and what `logs` returns: how long it took, and the
/// status and sense of every other answer meanwhile.
fn until_preempted(
    rt: &tokio::runtime::Runtime,
    s: &tessera_iscsi::initiator::Session,
    limit: Duration,
    why: &str,
    logs: impl Fn() -> String,
) -> (Duration, Vec<(u8, Option<(u8, u8, u8)>)>) {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        let r = rt.block_on(s.command(0, &READ_KEYS, Vec::new(), 4096)).unwrap();
        if sense_of(&r) == Some((0x6, 0x2A, 0x05)) {
            return (t0.elapsed(), seen);
        }
        seen.push((r.status, sense_of(&r)));
        assert!(t0.elapsed() < limit, "{why}: {seen:?}\n{}", logs());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// READ(10) of one 512-byte block.
fn read1(lba: u32) -> Vec<u8> {
    let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c
}

/// WRITE(10) of one 512-byte block, with FUA.
fn write1(lba: u32) -> Vec<u8> {
    let mut c = vec![0x2A, 0x08, 0, 0, 0, 0, 0, 0, 1, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c
}

/// What round `round` writes to block `lba`.
fn block(lba: u32, round: u8) -> Vec<u8> {
    vec![round ^ lba as u8; 512]
}

/// Sense key, ASC and ASCQ of a CHECK CONDITION (fixed format), None otherwise.
fn sense_of(r: &tessera_iscsi::initiator::ScsiResult) -> Option<(u8, u8, u8)> {
    (r.status == 2).then(|| (r.sense[2] & 0x0F, r.sense[12], r.sense[13]))
}

/// Sends `cdb` through `s` until it succeeds, retrying on what a multipath host retries on:
/// NOT READY (standby, transitioning) and unit attentions. Any other answer fails the test,
/// and so does `limit` passing (with `d`'s log). Returns the answer, how long it took, and
/// the distinct answers on the way.
fn until_done(
    rt: &tokio::runtime::Runtime,
    s: &tessera_iscsi::initiator::Session,
    cdb: &[u8],
    data: Vec<u8>,
    read: usize,
    limit: Duration,
    d: &Daemon,
) -> (tessera_iscsi::initiator::ScsiResult, Duration, Vec<(u8, u8, u8)>) {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        let r = rt
            .block_on(s.command(0, cdb, data.clone(), read))
            .expect("the session answers");
        if r.status == 0 {
            return (r, t0.elapsed(), seen);
        }
        let s = sense_of(&r).unwrap_or_else(|| panic!("status {}", r.status));
        assert!(
            matches!(s, (0x2, 0x04, 0x0B) | (0x2, 0x04, 0x0A) | (0x6, _, _)),
            "{s:x?} is no answer to retry on"
        );
        if seen.last() != Some(&s) {
            seen.push(s);
        }
        assert!(
            t0.elapsed() < limit,
            "not done after {limit:?}: {seen:x?}\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A failover cluster's quorum disk on a pool on RADOS: a node registers and reserves it
/// through the owner (APTPL off, as Windows and Pacemaker do), the owner dies, and at the
/// gateway that takes the pool over the reservation still keeps the other node out, the
/// keys and the mode settings are as they were, and the holder clears them. A replaced
/// owner, resumed, cannot change them.
#[test]
fn persistent_reservations_follow_a_pool_on_rados_to_the_gateway_that_takes_it_over() {
    let test = "persistent_reservations_follow_a_pool_on_rados_to_the_gateway_that_takes_it_over";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = "iqn.2026-11.io.tessera:quorum";
    let TwoGateways {
        a,
        mut b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting(&conf, &etcd, "pr", "quorum", iqn);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let read_reservation = [0x5E, 1, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let write1 = [0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let caching_page = [0x1A, 0x08, 0x08, 0, 255, 0];
    let (pa, pb) = (a.iscsi_portal(), b.iscsi_portal());
    let at = |portal: &str, node: u8, cdb: &[u8], data: Vec<u8>, read: usize| {
        node_command(&rt, portal, iqn, node, cdb, data, read)
            .unwrap_or_else(|| panic!("{portal} does not serve the LUN"))
            .0
    };

    // Node 1 registers and takes WRITE EXCLUSIVE - REGISTRANTS ONLY through A, and turns the
    // LUN's write cache off.
    let (cdb, p) = pr_out(6, 0, 0, 0x1111, false);
    assert_eq!(at(&pa, 1, &cdb, p, 0).status, 0);
    let (cdb, p) = pr_out(1, 5, 0x1111, 0, false);
    assert_eq!(at(&pa, 1, &cdb, p, 0).status, 0);
    assert_eq!(at(&pa, 2, &write1, vec![0; 512], 0).status, 0x18, "node 2 is kept out");
    assert_eq!(at(&pa, 1, &write1, vec![1; 512], 0).status, 0);
    let page = at(&pa, 1, &caching_page, Vec::new(), 255).data;
    assert_eq!(page[4 + 2] & 0x04, 0x04, "the write cache starts on: {page:?}");
    let mut select = vec![0u8; 4];
    select.extend_from_slice(&page[4..]);
    select[4 + 2] &= !0x04;
    let cdb = [0x15, 0x10, 0, 0, select.len() as u8, 0];
    assert_eq!(at(&pa, 1, &cdb, select, 0).status, 0);

    // A stalls; B takes the pool over and presents the LUN as A left it.
    signal(&a, libc::SIGSTOP);
    let took = until_served(&b, &pool, Duration::from_secs(15));
    eprintln!("{test}: taken over {took:?} after the owner stalled");
    // Each host's first command at the new owner is told the logical unit was (re)started.
    let (keys, told) = node_command(&rt, &pb, iqn, 2, &READ_KEYS, Vec::new(), 4096).expect("B serves the LUN");
    assert_eq!(told, [(0x29, 0x00)], "POWER ON OCCURRED first");
    let keys = keys.data;
    assert_eq!(&keys[4..8], &8u32.to_be_bytes(), "one key: {keys:?}");
    assert_eq!(&keys[8..16], &0x1111u64.to_be_bytes());
    let res = at(&pb, 2, &read_reservation, Vec::new(), 4096).data;
    assert_eq!(
        (res[4..8].to_vec(), res[21]),
        (16u32.to_be_bytes().to_vec(), 5),
        "{res:?}"
    );
    // The key registered through A holds at B: READ FULL STATUS says so with ALL_TG_PT.
    let full = at(&pb, 2, &[0x5E, 3, 0, 0, 0, 0, 0, 0x10, 0, 0], Vec::new(), 4096).data;
    assert_eq!(&full[8..16], &0x1111u64.to_be_bytes(), "{full:?}");
    assert_eq!(
        (full[20] & 3, &full[26..28]),
        (3, &[0u8, 0][..]),
        "ALL_TG_PT, R_HOLDER, port 0"
    );
    assert_eq!(
        at(&pb, 2, &write1, vec![0; 512], 0).status,
        0x18,
        "the reservation still keeps node 2 out at the new owner"
    );
    assert_eq!(at(&pb, 1, &write1, vec![2; 512], 0).status, 0, "the holder writes");
    let page = at(&pb, 1, &caching_page, Vec::new(), 255).data;
    assert_eq!(page[4 + 2] & 0x04, 0, "the write cache stays off: {page:?}");
    let shown = b.json(&["target", "show", iqn]);
    let r = &shown["luns"][0]["reservations"];
    assert_eq!(r["holder"], "iqn.2026-11.io.example:node1,i,0x800054530001", "{shown}");

    // A resumes: whatever it still answers, it changes no reservation of its own (its
    // metadata writes are fenced, and it presents the LUN as standby once it finds its lease
    // gone). A registration it accepts is one it forwarded to B, and B holds it.
    signal(&a, libc::SIGCONT);
    let (cdb, p) = pr_out(6, 0, 0, 0x3333, false);
    let stale = node_command(&rt, &pa, iqn, 3, &cdb, p, 0);
    let keys = at(&pb, 2, &READ_KEYS, Vec::new(), 4096).data;
    if stale.as_ref().is_some_and(|(r, _)| r.status == 0) {
        assert_eq!(&keys[4..8], &16u32.to_be_bytes(), "the owner holds it: {keys:?}");
        assert_eq!(&keys[16..24], &0x3333u64.to_be_bytes());
    } else {
        assert_eq!(&keys[4..8], &8u32.to_be_bytes(), "still one key: {keys:?}");
    }

    // The holder clears everything at B; node 2 writes again.
    let (cdb, p) = pr_out(3, 0, 0x1111, 0, false);
    assert_eq!(at(&pb, 1, &cdb, p, 0).status, 0);
    assert_eq!(at(&pb, 2, &write1, vec![3; 512], 0).status, 0);

    remove_lun_vdisk_and_pool(&b, iqn, &vdisk, &pool);
    b.stop();
    drop(a);
}

/// A cluster node whose path to the owner is down registers and reserves through the
/// standby gateway, as Linux's mpathpersist registers down every path, standby ones
/// included: the standby port has the owner run each command, so that the owner enforces
/// the reservation on the paths it serves and the standby port reports the owner's keys,
/// and the pool stays where it is. A preemption at the owner reaches the node's session at
/// the standby port as a unit attention; a MODE SELECT there is the owner's to run too.
#[test]
fn a_standby_gateway_has_the_owner_run_the_reservations_its_hosts_ask_for() {
    let test = "a_standby_gateway_has_the_owner_run_the_reservations_its_hosts_ask_for";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = "iqn.2026-11.io.tessera:quorum2";
    let TwoGateways {
        a,
        mut b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting(&conf, &etcd, "prfw", "quorum2", iqn);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let read_reservation = [0x5E, 1, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let write1 = [0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let (pa, pb) = (a.iscsi_portal(), b.iscsi_portal());
    // B presents the LUN as standby once it has read the pool's metadata.
    let at = |portal: &str, node: u8, cdb: &[u8], data: Vec<u8>, read: usize| {
        let t0 = Instant::now();
        loop {
            if let Some((r, _)) = node_command(&rt, portal, iqn, node, cdb, data.clone(), read) {
                return r;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "{portal} does not serve the LUN"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    // Node 2 registers through B, the standby: the owner holds the key.
    let (cdb, p) = pr_out(6, 0, 0, 0x2222, false);
    let r = at(&pb, 2, &cdb, p, 0);
    assert_eq!((r.status, sense_of(&r)), (0, None), "{}", b.logs());
    let keys = at(&pa, 1, &READ_KEYS, Vec::new(), 4096).data;
    assert_eq!(&keys[4..16], &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x22, 0x22], "{keys:?}");

    // It reserves WRITE EXCLUSIVE through B: the owner keeps node 1 out and lets node 2 in,
    // and B reports the owner's reservation.
    let (cdb, p) = pr_out(1, 1, 0x2222, 0, false);
    assert_eq!(at(&pb, 2, &cdb, p, 0).status, 0);
    assert_eq!(at(&pa, 1, &write1, vec![1; 512], 0).status, 0x18, "node 1 is kept out");
    assert_eq!(at(&pa, 2, &write1, vec![2; 512], 0).status, 0, "the holder writes");
    let res = at(&pb, 1, &read_reservation, Vec::new(), 4096).data;
    assert_eq!(&res[4..8], &16u32.to_be_bytes(), "{res:?}");
    assert_eq!((&res[8..16], res[21]), (&0x2222u64.to_be_bytes()[..], 1), "{res:?}");
    // A command forwarded with a key that is not registered is refused as the owner
    // refuses it.
    let (cdb, p) = pr_out(2, 1, 0x9999, 0, false);
    assert_eq!(at(&pb, 1, &cdb, p, 0).status, 0x18);

    // Released and unregistered through B: node 1 writes again, no key remains.
    let (cdb, p) = pr_out(2, 1, 0x2222, 0, false);
    assert_eq!(at(&pb, 2, &cdb, p, 0).status, 0);
    assert_eq!(at(&pa, 1, &write1, vec![3; 512], 0).status, 0);
    let (cdb, p) = pr_out(0, 0, 0x2222, 0, false);
    assert_eq!(at(&pb, 2, &cdb, p, 0).status, 0);
    let keys = at(&pb, 1, &READ_KEYS, Vec::new(), 4096).data;
    assert_eq!(&keys[4..8], &[0, 0, 0, 0], "{keys:?}");

    // Asks made by hand as a standby gateway makes them: one whose lease in etcd lives too
    // little longer when the owner takes it (its asker could not take it back at the end of
    // its first wait, and gives up before an answer could surely reach it) is answered
    // without being run, an ALUA transition its host retries; one that lives long enough
    // is run. (Until 2026-12-06 the owner ran the first, and the host, told to try again,
    // met its own registration.)
    let naa = designators(&at(&pa, 1, &[0x12, 0x01, 0x83, 0, 255, 0], Vec::new(), 255).data)[&3]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let prefix = format!("/tessera-test-prfw-{}", std::process::id());
    let forged = |id: &str, ttl: u32, key: u64| {
        let granted = ok("etcdctl", &["--endpoints", &etcd, "lease", "grant", &ttl.to_string()]);
        let lease = granted.split_whitespace().nth(1).expect("lease ID").to_string();
        let (cdb, data) = pr_out(6, 0, 0, key, false);
        let request = serde_json::json!({
            "naa": naa, "initiator": "iqn.2026-11.io.example:node3", "isid": node_port(3, iqn).isid,
            "cdb": cdb, "data": data,
        });
        let answer = format!("{prefix}/answer/pool.{pool}/{id}");
        let on_lease = format!("--lease={lease}");
        ok("etcdctl", &["--endpoints", &etcd, "put", &on_lease, &answer, ""]);
        let ask = format!("{prefix}/ask/pool.{pool}/{id}");
        ok(
            "etcdctl",
            &["--endpoints", &etcd, "put", &on_lease, &ask, &request.to_string()],
        );
        let t0 = Instant::now();
        loop {
            let got = ok("etcdctl", &["--endpoints", &etcd, "get", "--print-value-only", &answer]);
            if !got.trim().is_empty() {
                let a: serde_json::Value = serde_json::from_str(got.trim()).unwrap();
                let sense: Vec<u8> = serde_json::from_value(a["sense"].clone()).unwrap();
                return (a["status"].as_u64().unwrap(), sense);
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "no answer to {id}\n{}", a.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (status, sense) = forged("gw-x.1.1", 6, 0x3333);
    assert_eq!(status, 2, "an ask that lived 6 s more was run: {sense:?}");
    assert_eq!((sense[2] & 0x0F, sense[12], sense[13]), (0x2, 0x04, 0x0A), "{sense:?}");
    let keys = at(&pa, 1, &READ_KEYS, Vec::new(), 4096).data;
    assert_eq!(&keys[4..8], &[0, 0, 0, 0], "{keys:?}");
    assert_eq!(forged("gw-x.1.2", 30, 0x3333), (0, Vec::new()));
    let keys = at(&pa, 1, &READ_KEYS, Vec::new(), 4096).data;
    assert_eq!(&keys[4..16], &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x33, 0x33], "{keys:?}");
    let (cdb, p) = pr_out(0, 0, 0x3333, 0, false);
    assert_eq!(at(&pa, 3, &cdb, p, 0).status, 0);

    // Node 2 registers again through a session it keeps at B; node 1 registers at A and
    // preempts node 2's key there: node 2 hears REGISTRATIONS PREEMPTED on its standby path,
    // as it would on a path to the owner.
    use tessera_iscsi::initiator::Session;
    let kept = rt
        .block_on(Session::login(&pb, &node_port(2, iqn)))
        .expect("node 2 logs in at B");
    register_in(&rt, &kept, 0x2222);
    let (cdb, p) = pr_out(6, 0, 0, 0x1111, false);
    assert_eq!(at(&pa, 1, &cdb, p, 0).status, 0);
    let (cdb, p) = pr_out(4, 1, 0x1111, 0x2222, false);
    assert_eq!(at(&pa, 1, &cdb, p, 0).status, 0, "node 1 preempts node 2");
    let (took, seen) = until_preempted(&rt, &kept, Duration::from_secs(5), "node 2 is not told at B", || {
        b.logs()
    });
    assert!(seen.iter().all(|(status, _)| *status == 0), "{seen:?}");
    eprintln!("{test}: told at the standby port {took:?} after the preemption");
    let keys = rt.block_on(kept.command(0, &READ_KEYS, Vec::new(), 4096)).unwrap().data;
    assert_eq!(&keys[4..16], &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x11, 0x11], "{keys:?}");
    let _ = rt.block_on(kept.logout());
    let (cdb, p) = pr_out(0, 0, 0x1111, 0, false);
    assert_eq!(at(&pa, 1, &cdb, p, 0).status, 0);

    // Node 2 turns the write cache off through B: the owner runs the MODE SELECT and keeps
    // the setting, and both ports report it.
    let caching_page = [0x1A, 0x08, 0x08, 0, 255, 0];
    let page = at(&pb, 2, &caching_page, Vec::new(), 255).data;
    assert_eq!(page[4 + 2] & 0x04, 0x04, "the write cache starts on: {page:?}");
    let mut select = vec![0u8; 4];
    select.extend_from_slice(&page[4..]);
    select[4 + 2] &= !0x04;
    let cdb = [0x15, 0x10, 0, 0, select.len() as u8, 0];
    let r = at(&pb, 2, &cdb, select, 0);
    assert_eq!((r.status, sense_of(&r)), (0, None));
    for portal in [&pa, &pb] {
        let page = at(portal, 1, &caching_page, Vec::new(), 255).data;
        assert_eq!(page[4 + 2] & 0x04, 0, "the write cache is off at {portal}: {page:?}");
    }

    // What the hop through etcd costs a reservation command, printed for the record (not a
    // test of speed): the median of 21 READ KEYS through each port, in a session each.
    let median_keys = |portal: &str| {
        rt.block_on(async {
            let s = Session::login(portal, &node_port(1, iqn)).await.unwrap();
            let mut took = Vec::new();
            for _ in 0..21 {
                let t0 = Instant::now();
                let r = s.command(0, &READ_KEYS, Vec::new(), 4096).await.unwrap();
                if r.status == 0 {
                    took.push(t0.elapsed());
                }
            }
            let _ = s.logout().await;
            took.sort();
            took.get(took.len() / 2).copied()
        })
    };
    eprintln!(
        "{test}: READ KEYS, median: {:?} through the owner, {:?} through the standby port",
        median_keys(&pa),
        median_keys(&pb)
    );

    // The owner's target admits nodes 1 and 2 only, B's any initiator still: node 3, let in
    // at B, has the owner refuse what B forwards for it (the logical unit is not presented
    // to it), and registers nothing; node 2 goes on through B.
    for node in ["node1", "node2"] {
        a.ok(&["target", "acl", "add", iqn, &format!("iqn.2026-11.io.example:{node}")]);
    }
    a.ok(&["target", "acl", "allow-any", iqn, "--off"]);
    let (cdb, p) = pr_out(6, 0, 0, 0x3333, false);
    let r = at(&pb, 3, &cdb, p, 0);
    assert_eq!((r.status, sense_of(&r)), (2, Some((0x5, 0x25, 0))), "{}", a.logs());
    let keys = at(&pb, 2, &READ_KEYS, Vec::new(), 4096).data;
    assert_eq!(&keys[4..8], &[0, 0, 0, 0], "node 3 registered: {keys:?}");

    // None of it moved the pool: A owns it still, B waits.
    let (pa, pb) = (pool_entry(&a, &pool), pool_entry(&b, &pool));
    assert_eq!(pa["rados"]["here"], true, "{pa}");
    assert_eq!(pb["health"], "unavailable", "{pb}");

    remove_lun_vdisk_and_pool(&a, iqn, &vdisk, &pool);
    b.stop();
}

/// A registration sent to the standby gateway while the owner stalls: the standby port
/// waits for the owner, and either the command ran at an owner (the gateway that took the
/// pool over meanwhile runs the asks waiting for it, its own included) or the host is told
/// to try again, and its retry registers the key once. Once the stalled owner is resumed and
/// replaced, its standby port passes reservation commands the other way, to the new owner.
#[test]
fn a_registration_at_a_standby_port_while_the_owner_stalls_runs_once_at_an_owner() {
    let test = "a_registration_at_a_standby_port_while_the_owner_stalls_runs_once_at_an_owner";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = "iqn.2026-11.io.tessera:quorum3";
    let TwoGateways {
        a,
        mut b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting(&conf, &etcd, "prst", "quorum3", iqn);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (pa, pb) = (a.iscsi_portal(), b.iscsi_portal());
    let (register, p) = pr_out(6, 0, 0, 0x2222, false);
    // B presents the LUN as standby once it has read the pool's metadata.
    let t0 = Instant::now();
    while node_command(&rt, &pb, iqn, 2, &READ_KEYS, Vec::new(), 4096).is_none_or(|(r, _)| r.status != 0) {
        assert!(t0.elapsed() < Duration::from_secs(15), "B does not answer READ KEYS");
        std::thread::sleep(Duration::from_millis(200));
    }

    signal(&a, libc::SIGSTOP);
    let t0 = Instant::now();
    let first = node_command(&rt, &pb, iqn, 2, &register, p.clone(), 0).expect("B serves the LUN");
    let waited = t0.elapsed();
    eprintln!(
        "{test}: the registration sent while the owner stalled: status {} {:?} after {waited:?}",
        first.0.status,
        sense_of(&first.0)
    );
    assert!(
        first.0.status == 0 || sense_of(&first.0) == Some((0x2, 0x04, 0x0A)),
        "{:?}",
        sense_of(&first.0)
    );
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    // The host sends it again until it succeeds, at B, which owns the pool by now.
    until_served(&b, &pool, Duration::from_secs(15));
    let t0 = Instant::now();
    loop {
        match node_command(&rt, &pb, iqn, 2, &register, p.clone(), 0) {
            Some((r, _)) if r.status == 0 => break,
            other => {
                let s = other.as_ref().and_then(|(r, _)| sense_of(r));
                assert!(
                    t0.elapsed() < Duration::from_secs(15),
                    "not registered at B: {s:?}\n{}",
                    b.logs()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let keys = node_command(&rt, &pb, iqn, 2, &READ_KEYS, Vec::new(), 4096)
        .unwrap()
        .0
        .data;
    assert_eq!(
        &keys[4..16],
        &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x22, 0x22],
        "one key: {keys:?}"
    );

    // A resumes, finds itself replaced, and presents a standby port that asks B.
    signal(&a, libc::SIGCONT);
    let t0 = Instant::now();
    loop {
        let keys = node_command(&rt, &pa, iqn, 1, &READ_KEYS, Vec::new(), 4096);
        if let Some((r, _)) = &keys {
            if r.status == 0 && r.data.get(4..16) == Some(&[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x22, 0x22][..]) {
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "A does not report B's key: {:?}\n{}",
            keys.map(|(r, _)| (r.status, sense_of(&r))),
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (unregister, p) = pr_out(0, 0, 0x2222, 0, false);
    assert_eq!(node_command(&rt, &pa, iqn, 2, &unregister, p, 0).unwrap().0.status, 0);
    let keys = node_command(&rt, &pb, iqn, 1, &READ_KEYS, Vec::new(), 4096)
        .unwrap()
        .0
        .data;
    assert_eq!(&keys[4..8], &[0, 0, 0, 0], "unregistered through A: {keys:?}");

    remove_lun_vdisk_and_pool(&b, iqn, &vdisk, &pool);
    b.stop();
    drop(a);
}

/// The designators of VPD page 0x83, by type: NAA (3), relative target port (4), target
/// port group (5).
fn designators(page: &[u8]) -> std::collections::BTreeMap<u8, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let end = 4 + u16::from_be_bytes([page[2], page[3]]) as usize;
    let mut at = 4;
    while at + 4 <= end.min(page.len()) {
        let len = page[at + 3] as usize;
        out.insert(page[at + 1] & 0x0F, page[at + 4..at + 4 + len].to_vec());
        at += 4 + len;
    }
    out
}

/// A host with a path to each gateway, as iSCSI multipath with implicit ALUA has it: one
/// logical unit (the same NAA id) through two target port groups, the owner's active and
/// optimized, the other's standby (discovery and mode pages answer, reservations are the
/// owner's, the medium is refused). The owner is killed: the host, retrying on the standby path, finds
/// it active once the other gateway took the pool over, within 15 s, and every block the
/// owner acknowledged is there.
#[test]
fn a_host_with_a_path_to_each_gateway_goes_on_through_the_standby_when_the_owner_dies() {
    use tessera_iscsi::initiator::{LoginConfig, ScsiResult, Session};
    let test = "a_host_with_a_path_to_each_gateway_goes_on_through_the_standby_when_the_owner_dies";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = "iqn.2026-11.io.tessera:multipath";
    let TwoGateways {
        mut a,
        b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting(&conf, &etcd, "mp", "mp", iqn);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let host = LoginConfig::new("iqn.2026-11.io.example:host", Some(iqn));
    let (path_a, path_b) = rt.block_on(async {
        (
            Session::login(&a.iscsi_portal(), &host).await.unwrap(),
            Session::login(&b.iscsi_portal(), &host).await.unwrap(),
        )
    });
    let cmd = |s: &Session, cdb: &[u8], data: Vec<u8>, read: usize| -> ScsiResult {
        rt.block_on(s.command(0, cdb, data, read)).expect("the session answers")
    };
    let sense = sense_of;
    // As a host does: a unit attention (the first command at a gateway finds POWER ON
    // OCCURRED) is reported, then the command is sent again.
    let settled = |s: &Session, cdb: &[u8], data: Vec<u8>, read: usize| -> ScsiResult {
        for _ in 0..3 {
            let r = cmd(s, cdb, data.clone(), read);
            if sense(&r).is_none_or(|(k, _, _)| k != 0x6) {
                return r;
            }
        }
        panic!("unit attentions without end");
    };
    let vpd83 = [0x12, 0x01, 0x83, 0, 255, 0];
    // B presents the LUN as a standby port once it has read the pool's records (a tick).
    let t0 = Instant::now();
    let at_b = loop {
        let r = cmd(&path_b, &vpd83, Vec::new(), 255);
        if r.status == 0 {
            break designators(&r.data);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "B presents no standby LUN: {:?}\n{}",
            sense(&r),
            b.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let at_a = designators(&cmd(&path_a, &vpd83, Vec::new(), 255).data);
    assert_eq!(
        at_a[&3], at_b[&3],
        "one logical unit: the same NAA id through both gateways"
    );
    assert_ne!(at_a[&5], at_b[&5], "a target port group per gateway");
    assert_ne!(at_a[&4], at_b[&4], "a relative target port per gateway");
    let group = |d: &std::collections::BTreeMap<u8, Vec<u8>>| u16::from_be_bytes([d[&5][2], d[&5][3]]);
    let (ga, gb) = (group(&at_a), group(&at_b));
    // REPORT TARGET PORT GROUPS, through either path: A's group active/optimized, B's standby.
    let states = |s: &Session| {
        let d = settled(s, &[0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0], Vec::new(), 1024).data;
        let mut out = std::collections::BTreeMap::new();
        let mut at = 4;
        while at + 8 <= d.len() {
            out.insert(u16::from_be_bytes([d[at + 2], d[at + 3]]), d[at] & 0x0F);
            at += 8 + 4 * d[at + 7] as usize;
        }
        out
    };
    // Through either path (the owner learns of B from etcd, where each gateway says which
    // pools it presents, within a tick or two).
    let t0 = Instant::now();
    for s in [&path_a, &path_b] {
        loop {
            let st = states(s);
            if (st.get(&ga), st.get(&gb)) == (Some(&0), Some(&2)) {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "groups: {st:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // The standby path: the medium is refused, mode pages answer, and the reservations are
    // the owner's (none yet).
    const STANDBY: Option<(u8, u8, u8)> = Some((0x2, 0x04, 0x0B));
    assert_eq!(sense(&settled(&path_b, &read1(0), Vec::new(), 512)), STANDBY);
    assert_eq!(sense(&cmd(&path_b, &write1(0), block(0, 9), 0)), STANDBY);
    let keys = cmd(&path_b, &[0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0], Vec::new(), 16);
    assert_eq!(
        (keys.status, &keys.data[4..8]),
        (0, &[0u8; 4][..]),
        "{:?}",
        sense(&keys)
    );
    let mode_sense = [0x1A, 0x08, 0x08, 0, 255, 0];
    assert_eq!(cmd(&path_b, &mode_sense, Vec::new(), 255).status, 0);
    // The owner grows the vdisk: the standby path tells the host too, within a tick or two.
    a.ok(&["vdisk", "resize", &vdisk, "--size", "96M"]);
    let t0 = Instant::now();
    loop {
        let told = sense(&cmd(&path_b, &mode_sense, Vec::new(), 255));
        if told == Some((0x6, 0x2A, 0x09)) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no CAPACITY DATA HAS CHANGED at the standby port: {told:x?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The administrator sees each gateway's part.
    assert_eq!(
        a.json(&["target", "show", iqn])["luns"][0]["access"],
        "active/optimized"
    );
    assert_eq!(b.json(&["target", "show", iqn])["luns"][0]["access"], "standby");
    let shown = b.ok(&["target", "show", iqn]);
    assert!(shown.contains("standby: another gateway owns the pool"), "{shown}");

    // The host writes through the owner, then the owner dies.
    for lba in 0..64 {
        assert_eq!(settled(&path_a, &write1(lba), block(lba, 1), 0).status, 0);
    }
    a.kill9();
    // The host retries on the standby path until it answers.
    let (_, failover, seen) = until_done(&rt, &path_b, &write1(64), block(64, 2), 0, Duration::from_secs(30), &b);
    eprintln!("{test}: first write through the other gateway completed {failover:?} after the owner was killed (lease 3 s); answers on the way: {seen:x?}");
    assert!(failover < Duration::from_secs(15), "failover took {failover:?}");
    assert!(
        seen.contains(&(0x6, 0x29, 0x00)),
        "the host was told the unit started here: {seen:x?}"
    );
    let st = states(&path_b);
    assert_eq!(st.get(&gb), Some(&0), "B's group is active/optimized now: {st:?}");
    assert_eq!(
        b.json(&["target", "show", iqn])["luns"][0]["access"],
        "active/optimized"
    );
    for lba in 0..64 {
        let r = cmd(&path_b, &read1(lba), Vec::new(), 512);
        assert_eq!(r.status, 0);
        assert!(r.data == block(lba, 1), "block {lba} differs after the failover");
    }
    assert!(cmd(&path_b, &read1(64), Vec::new(), 512).data == block(64, 2));
    let cap = cmd(&path_b, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], Vec::new(), 8).data;
    assert_eq!(
        u32::from_be_bytes(cap[0..4].try_into().unwrap()),
        (96 << 11) - 1,
        "the grown size"
    );
    drop(path_a);
    drop(path_b);
    let mut b = b;
    remove_lun_vdisk_and_pool(&b, iqn, &vdisk, &pool);
    b.stop();
}

/// A host whose path to the owner is gone, while the owner lives: its I/O at the standby
/// gateway has the pool handed over there once nobody used it at the owner for a while; and
/// I/O at a standby port never takes the pool from an owner that hosts use.
#[test]
fn a_host_that_reaches_only_the_standby_gateway_has_the_pool_handed_over_without_bouncing() {
    use tessera_iscsi::initiator::{LoginConfig, ScsiResult, Session};
    let test = "a_host_that_reaches_only_the_standby_gateway_has_the_pool_handed_over_without_bouncing";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = "iqn.2026-11.io.tessera:handover";
    let TwoGateways {
        a,
        mut b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting(&conf, &etcd, "ho", "ho", iqn);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let host = LoginConfig::new("iqn.2026-11.io.example:host", Some(iqn));
    let login = |d: &Daemon| rt.block_on(Session::login(&d.iscsi_portal(), &host)).unwrap();
    let cmd = |s: &Session, cdb: &[u8], data: Vec<u8>, read: usize| -> ScsiResult {
        rt.block_on(s.command(0, cdb, data, read)).expect("the session answers")
    };
    let sense = sense_of;

    let (path_a, path_b) = (login(&a), login(&b));
    // B presents the LUN as a standby port once it has read the pool's records (a tick).
    let t0 = Instant::now();
    while cmd(&path_b, &[0x12, 0x01, 0x83, 0, 255, 0], Vec::new(), 255).status != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "B presents no standby LUN\n{}",
            b.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for lba in 0..16 {
        until_done(&rt, &path_a, &write1(lba), block(lba, 1), 0, Duration::from_secs(5), &a);
    }
    // A slow scrub runs at A (16 MiB more data, read at 256 KiB/s): it stops for the handover
    // rather than keep the host from its data until it ends, and B goes on with it.
    for n in 0..64u32 {
        let lba = 4096 + n * 512;
        let mut c = vec![0x2A, 0, 0, 0, 0, 0, 0, 0x02, 0x00, 0];
        c[2..6].copy_from_slice(&lba.to_be_bytes());
        until_done(
            &rt,
            &path_a,
            &c,
            vec![n as u8 ^ 0x5a; 256 << 10],
            0,
            Duration::from_secs(10),
            &a,
        );
    }
    a.ok(&["pool", "scrub", &pool, "--rate", "256K", "--no-wait"]);
    // The host's path to A goes (A lives on); it sends its writes to B, whose port is standby
    // until A hands the pool over.
    drop(path_a);
    let (_, took, seen) = until_done(&rt, &path_b, &write1(16), block(16, 2), 0, Duration::from_secs(40), &b);
    eprintln!(
        "{test}: the first write through B completed {took:?} after the host left A; answers on the way: {seen:x?}"
    );
    assert!(seen.contains(&(0x2, 0x04, 0x0B)), "B was standby first: {seen:x?}");
    assert_eq!(pool_entry(&b, &pool)["rados"]["here"], true);
    let at_a = pool_entry(&a, &pool);
    assert_eq!(at_a["health"], "unavailable", "{at_a}");
    assert!(at_a.to_string().contains("gw-b"), "A says who has the pool: {at_a}");
    for lba in 0..16 {
        let r = cmd(&path_b, &read1(lba), Vec::new(), 512);
        assert!(
            r.status == 0 && r.data == block(lba, 1),
            "block {lba} differs after the handover"
        );
    }
    assert!(
        a.json(&["events", "-n", "1000"])
            .to_string()
            .contains("pool.handed_over"),
        "A records the handover"
    );
    let jobs = a.json(&["job", "list"]);
    let scrub = jobs
        .as_array()
        .and_then(|js| js.iter().find(|j| j["kind"] == "scrub"))
        .unwrap_or_else(|| panic!("no scrub job at A: {jobs}"));
    assert_eq!(scrub["state"], "cancelled", "{scrub}");
    assert!(
        scrub["error"]
            .as_str()
            .is_some_and(|e| e.contains("handed over to gateway gw-b")),
        "the scrub says why it stopped: {scrub}"
    );
    // Stopped, not paused: B goes on with the pass and finishes it (at the configured rate).
    b.wait_for_scrub(&pool, "B did not go on with the scrub", Duration::from_secs(60), |s| {
        assert_ne!(s["state"], "paused", "the handover paused the scrub: {s}");
        s["last"]["finished_at"].is_u64()
    });
    assert!(b.logs().contains("going on with the scrub"), "{}", b.logs());

    // No bounce: the host writes through B while reads reach A's standby port (a path
    // checker, a host that prefers A): B, in use, keeps the pool.
    let path_a = login(&a);
    let t0 = Instant::now();
    let mut at_standby = 0;
    let mut n = 0u32;
    while t0.elapsed() < Duration::from_secs(12) {
        let r = cmd(&path_b, &write1(17 + n % 32), block(17 + n % 32, 3), 0);
        assert!(
            r.status == 0 || sense(&r).is_some_and(|s| s.0 == 0x6),
            "B keeps serving: {:?}",
            sense(&r)
        );
        if sense(&cmd(&path_a, &read1(0), Vec::new(), 512)) == Some((0x2, 0x04, 0x0B)) {
            at_standby += 1;
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(at_standby > 50, "reads at A's standby port: {at_standby}");
    assert_eq!(pool_entry(&b, &pool)["rados"]["here"], true, "B kept the pool");
    assert_eq!(
        b.json(&["target", "show", iqn])["luns"][0]["access"],
        "active/optimized"
    );
    assert_eq!(a.json(&["target", "show", iqn])["luns"][0]["access"], "standby");
    drop(path_a);
    drop(path_b);
    remove_lun_vdisk_and_pool(&b, iqn, &vdisk, &pool);
    b.stop();
}

/// Bytes the daemon has written to the data objects of pool `pool` (its one disk, in the
/// cluster) since it took the pool.
fn rados_written(d: &Daemon, pool: &str) -> u64 {
    let shown = d.json(&["pool", "show", pool]);
    shown["disk_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["io"]["written_bytes"].as_u64().unwrap())
        .sum()
}

/// What Tessera adds over the cluster works on a pool on RADOS, by reference: ODX and
/// EXTENDED COPY between LUNs, a snapshot and a clone write no data to the cluster (only
/// metadata, which goes to the metadata object's omap); a host copy, for contrast, writes
/// every byte.
#[test]
fn copies_snapshots_and_clones_on_a_pool_on_rados_are_made_by_reference() {
    let test = "copies_snapshots_and_clones_on_a_pool_on_rados_are_made_by_reference";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("copies{pid}");
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start_configured(
        &t.path().join("c"),
        &gateway_config("gw-c", &etcd, &format!("/tessera-copies-{pid}")),
    );
    create_rados_pool(&d, &pool, &conf);
    for v in ["src", "odx", "xcopy", "host"] {
        d.ok(&[
            "vdisk",
            "create",
            &format!("{pool}/{v}"),
            "--size",
            "64M",
            "--layout",
            "simple",
        ]);
    }
    let img = t.path().join("src.img");
    random_image(&img, 32 << 20, 77);
    d.ok(&["vdisk", "import", &format!("{pool}/src"), img.to_str().unwrap()]);
    let (a, b) = ("iqn.2026-11.io.tessera:rados-a", "iqn.2026-11.io.tessera:rados-b");
    d.ok(&["target", "create", a, "--allow-any-initiator"]);
    d.ok(&["target", "create", b, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", a, &format!("{pool}/src")]);
    d.ok(&["target", "lun", "add", a, &format!("{pool}/xcopy"), "--lun", "1"]);
    d.ok(&["target", "lun", "add", b, &format!("{pool}/odx")]);
    d.ok(&["target", "lun", "add", b, &format!("{pool}/host")]);
    let portal = d.iscsi_portal();
    let src = format!("iscsi://{portal}/{a}/0");
    let blocks = ((32u64 << 20) / 512).to_string();

    let before = rados_written(&d, &pool);
    for (dst, method) in [
        (format!("iscsi://{portal}/{b}/0"), "odx"),
        (format!("iscsi://{portal}/{a}/1"), "xcopy"),
    ] {
        let r = d.json(&["copy", &src, "0", &dst, "0", &blocks, "--method", method]);
        assert_eq!(r["bytes"], 32u64 << 20, "{r}");
    }
    d.ok(&["snapshot", "create", &format!("{pool}/src@s")]);
    d.ok(&["vdisk", "clone", &format!("{pool}/src"), "cl"]);
    let by_reference = rados_written(&d, &pool) - before;
    eprintln!(
        "{test}: ODX, EXTENDED COPY, a snapshot and a clone of 32 MiB wrote {by_reference} bytes of data to RADOS"
    );
    assert_eq!(by_reference, 0, "copies by reference wrote data to the cluster");

    let before = rados_written(&d, &pool);
    let r = d.json(&[
        "copy",
        &src,
        "0",
        &format!("iscsi://{portal}/{b}/1"),
        "0",
        &blocks,
        "--method",
        "host",
    ]);
    assert_eq!(r["bytes"], 32u64 << 20, "{r}");
    let by_host = rados_written(&d, &pool) - before;
    eprintln!("{test}: a host copy of 32 MiB wrote {by_host} bytes of data to RADOS");
    assert!(
        by_host >= 32 << 20,
        "the counter missed the host copy's writes: {by_host}"
    );

    for v in ["odx", "xcopy", "cl", "host", "src@s"] {
        let back = t.path().join(format!("{v}.img"));
        d.ok(&["vdisk", "export", &format!("{pool}/{v}"), back.to_str().unwrap()]);
        assert!(read_back_matches(&img, &back), "{v} differs from the source");
    }
    for v in ["odx", "xcopy", "cl"] {
        let s = d.json(&["vdisk", "show", &format!("{pool}/{v}")]);
        // Everything it holds is shared with the source (the image has holes, which hold
        // nothing on either side).
        assert!(s["allocated_bytes"].as_u64().unwrap() > 16 << 20, "{v}: {s}");
        assert_eq!(s["shared_bytes"], s["allocated_bytes"], "{v}: {s}");
    }
    let check = d.json(&["pool", "check", &pool]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
}

/// A verifying write load: 4 KiB blocks, each stamped with its number and a sequence number,
/// written one at a time through one gateway's NBD export until the export fails, every other
/// one without FUA and none followed by a flush: a write the gateway acknowledged must be in
/// the cluster all the same, as the gateway that takes over finds it.
/// A host with iSCSI multipath to two gateways, as the verifying load's writer: each write
/// goes through the current path; NOT READY (a standby or transitioning port) and unit
/// attentions mean the write was not done, and it is sent again (through the other path for
/// NOT READY); a write with no answer (a gateway dead or stalled) may or may not have landed,
/// and is sent again through the other path until one path acknowledges it.
mod multipath {
    use std::time::{Duration, Instant};

    use tessera_iscsi::initiator::{LoginConfig, Session};

    use crate::common::verifying_load::{block, Acked, BLOCK, BLOCKS};

    pub struct Host {
        pub portals: [String; 2],
        sessions: [Option<Session>; 2],
        pub current: usize,
        cfg: LoginConfig,
        /// Path switches, for the test's report.
        pub switches: u32,
    }

    /// READ(10) or WRITE(10) of block `n`; a write with FUA if `fua`.
    fn cdb(op: u8, n: u64, fua: bool) -> Vec<u8> {
        let mut c = vec![op, if fua { 0x08 } else { 0 }, 0, 0, 0, 0, 0, 0, 1, 0];
        c[2..6].copy_from_slice(&(n as u32).to_be_bytes());
        c
    }

    impl Host {
        pub fn new(iqn: &str, portals: [String; 2]) -> Host {
            Host {
                portals,
                sessions: [None, None],
                current: 0,
                cfg: LoginConfig::new("iqn.2026-11.io.example:host", Some(iqn)),
                switches: 0,
            }
        }

        fn switch(&mut self) {
            self.current ^= 1;
            self.switches += 1;
        }

        /// One command through the current path: Ok(status, sense key, ASC, ASCQ, data), or
        /// Err when the path gave no answer within `limit` (its session is dropped).
        async fn command(
            &mut self,
            cdb: &[u8],
            data: Vec<u8>,
            read: usize,
            limit: Duration,
        ) -> Result<(u8, u8, u8, u8, Vec<u8>), ()> {
            let k = self.current;
            if self.sessions[k].is_none() {
                let login = Session::login(&self.portals[k], &self.cfg);
                match tokio::time::timeout(Duration::from_secs(2), login).await {
                    Ok(Ok(s)) => self.sessions[k] = Some(s),
                    _ => return Err(()),
                }
            }
            let s = self.sessions[k].as_ref().expect("logged in");
            match tokio::time::timeout(limit, s.command(0, cdb, data, read)).await {
                Ok(Ok(r)) => {
                    let sense = |i: usize| r.sense.get(i).copied().unwrap_or(0);
                    Ok((r.status, sense(2) & 0x0F, sense(12), sense(13), r.data))
                }
                _ => {
                    self.sessions[k] = None;
                    Err(())
                }
            }
        }

        /// Writes block `n` with sequence `seq` until a path acknowledges it, recording in
        /// `acked` a write whose outcome is unknown meanwhile; false if none did by `until`.
        pub async fn write(&mut self, n: u64, seq: u64, acked: &std::sync::Mutex<Acked>, until: Instant) -> bool {
            let data = block(n, seq);
            while Instant::now() < until {
                match self
                    .command(&cdb(0x2A, n, seq % 2 == 0), data.clone(), 0, Duration::from_secs(5))
                    .await
                {
                    Ok((0, ..)) => {
                        let mut a = acked.lock().unwrap();
                        a.seq[n as usize] = seq;
                        a.unknown[n as usize] = 0;
                        a.writes += 1;
                        return true;
                    }
                    // A unit attention: not done; again through the same path.
                    Ok((2, 0x6, ..)) => {}
                    // NOT READY (standby, transitioning, unavailable): not done; the other
                    // path may be the active one.
                    Ok((2, 0x2, 0x04, ..)) => {
                        self.switch();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    // No answer, or a failure that may have come after the data reached the
                    // cluster: the block may hold it.
                    other => {
                        if let Ok(r) = &other {
                            eprintln!(
                                "write of block {n} failed: status {} sense {:x}/{:x}/{:x}",
                                r.0, r.1, r.2, r.3
                            );
                        }
                        acked.lock().unwrap().unknown[n as usize] = seq;
                        self.switch();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            false
        }

        /// Reads every block through whichever path answers, and checks it holds what was
        /// acknowledged last (or the write whose outcome is unknown).
        pub async fn verify(&mut self, acked: &Acked) {
            for n in 0..BLOCKS {
                let got = loop {
                    match self
                        .command(&cdb(0x28, n, false), Vec::new(), BLOCK, Duration::from_secs(5))
                        .await
                    {
                        Ok((0, _, _, _, d)) => break d,
                        Ok((2, 0x6, ..)) => {}
                        _ => {
                            self.switch();
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                };
                crate::common::verifying_load::check(n, &got, acked);
            }
        }
    }
}

/// The OSD of the test cluster (one): its process id, and the command that starts it again.
fn osd_process(conf: &str) -> (i32, Vec<String>) {
    let args = vec!["-c".to_string(), conf.to_string(), "-i".to_string(), "0".to_string()];
    let pid = osd_pid(conf).unwrap_or_else(|| panic!("no OSD 0 of {conf} running"));
    (pid, args)
}

/// The process id of the test cluster's OSD, if it runs. Never panics.
fn osd_pid(conf: &str) -> Option<i32> {
    let (found, out) = try_run("pgrep", &["-f", &format!("ceph-osd -c {conf} -i 0")]);
    found
        .then(|| out.lines().next().and_then(|l| l.trim().parse().ok()))
        .flatten()
}

/// The issue's verifying load through iSCSI multipath: a host with a path to each gateway
/// writes 4 KiB blocks stamped with their number and a sequence number (every other one
/// without FUA, none followed by a flush: acknowledged is durable) through the owner A,
/// while the cluster's OSD is killed and started again, then A is killed (the
/// host goes on through B once B took the pool over), then A comes back as a standby and B
/// is stopped with SIGSTOP (the host goes on through A once A took it over) and resumed.
/// Every block then holds what was acknowledged last, and B, resumed, changed nothing.
#[test]
fn acknowledged_writes_survive_an_osd_and_gateway_failures_under_iscsi_multipath() {
    use std::sync::Mutex;
    let test = "acknowledged_writes_survive_an_osd_and_gateway_failures_under_iscsi_multipath";
    // Alone on the cluster: its OSD goes down under the test.
    let _alone = alone_on_the_cluster();
    let Some((conf, etcd)) = cluster_config(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("mpl{pid}");
    let prefix = format!("/tessera-mpl-{pid}");
    let t = tempfile::tempdir().unwrap();
    let cfg = |name: &str| gateway_config(name, &etcd, &prefix);
    let mut a = Daemon::start_configured(&t.path().join("a"), &cfg("gw-a"));
    create_rados_pool(&a, &pool, &conf);
    let vdisk = load::create_vdisk(&a, &pool);
    let iqn = "iqn.2026-11.io.tessera:load";
    let mut b = Daemon::start_configured(&t.path().join("b"), &cfg("gw-b"));
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    for d in [&a, &b] {
        d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
        d.ok(&["target", "lun", "add", iqn, &vdisk]);
    }
    let acked = Mutex::new(load::Acked::new());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut host = multipath::Host::new(iqn, [a.iscsi_portal(), b.iscsi_portal()]);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    // Writes for `secs` (at least `min` of them), or until `stop` says so; how many.
    let mut write_for = |host: &mut multipath::Host, secs: f64, stop: &mut dyn FnMut(u64) -> bool| -> u64 {
        let t0 = Instant::now();
        let mut done = 0;
        while t0.elapsed().as_secs_f64() < secs && !stop(done) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = x % load::BLOCKS;
            let seq = {
                let mut a = acked.lock().unwrap();
                a.next += 1;
                a.next
            };
            let until = Instant::now() + Duration::from_secs(40);
            assert!(
                rt.block_on(host.write(n, seq, &acked, until)),
                "no path took a write for 40 s"
            );
            done += 1;
        }
        done
    };

    // Through A; the OSD is killed, and started again 2 s later.
    let before = write_for(&mut host, 2.0, &mut |_| false);
    assert!(before > 0, "the load did not run: {before} writes");
    let (osd, args) = osd_process(&conf);
    assert_eq!(unsafe { libc::kill(osd, libc::SIGKILL) }, 0);
    let down = Instant::now();
    let restarter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok("ceph-osd", &args);
    });
    let mut first_after = None;
    let during = write_for(&mut host, 60.0, &mut |done| {
        if done > 0 && first_after.is_none() && down.elapsed() > Duration::from_secs(2) {
            first_after = Some(down.elapsed());
        }
        first_after.is_some_and(|t| down.elapsed() > t + Duration::from_secs(2))
    });
    restarter.join().unwrap();
    eprintln!("{test}: {before} writes through A, then the OSD killed; writes resumed {first_after:?} after ({during} in all around it)");

    // A dies: the host goes on through B.
    a.kill9();
    drop(a);
    let killed = Instant::now();
    let switches = host.switches;
    write_for(&mut host, 60.0, &mut |done| done > 0);
    let failover = killed.elapsed();
    assert_eq!(host.current, 1, "the host writes through B");
    assert!(host.switches > switches);
    write_for(&mut host, 2.0, &mut |_| false);
    eprintln!("{test}: A killed; the first write through B completed {failover:?} after");
    assert!(failover < Duration::from_secs(15), "failover took {failover:?}");

    // A comes back (a standby now); B stalls: the host goes on through A.
    let mut a = Daemon::start_configured(&t.path().join("a"), &cfg("gw-a"));
    // Its portal is on another port in this test (a real one keeps its address).
    host.portals[0] = a.iscsi_portal();
    std::thread::sleep(Duration::from_secs(2));
    signal(&b, libc::SIGSTOP);
    let stalled = Instant::now();
    write_for(&mut host, 60.0, &mut |done| done > 0);
    let failover = stalled.elapsed();
    assert_eq!(host.current, 0, "the host writes through A");
    eprintln!("{test}: B stopped; the first write through A completed {failover:?} after");
    assert!(failover < Duration::from_secs(20), "failover took {failover:?}");
    let snapshot = acked.lock().unwrap().writes;
    signal(&b, libc::SIGCONT);
    write_for(&mut host, 2.0, &mut |_| false);
    let writes = acked.lock().unwrap().writes;
    eprintln!("{test}: {writes} writes acknowledged in all ({snapshot} before B resumed)");
    rt.block_on(host.verify(&acked.lock().unwrap()));
    let check = a.json(&["pool", "check", &pool]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
    a.stop();
    b.kill9();
}

/// Acknowledged writes survive a failover under load: a host writes through gateway A until
/// A is killed, then through B once B took the pool over, until B is stopped and A (started
/// again) takes it; every block then holds what was acknowledged last, read through the
/// gateway that serves it.
#[test]
fn acknowledged_writes_survive_failovers_under_a_verifying_load() {
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};

    let test = "acknowledged_writes_survive_failovers_under_a_verifying_load";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("load{pid}");
    let prefix = format!("/tessera-load-{pid}");
    let t = tempfile::tempdir().unwrap();
    let cfg = |name: &str| gateway_config(name, &etcd, &prefix);
    let mut a = Daemon::start_configured(&t.path().join("a"), &cfg("gw-a"));
    create_rados_pool(&a, &pool, &conf);
    let vdisk = load::create_vdisk(&a, &pool);
    a.ok(&["nbd", "export", &vdisk]);
    let mut b = Daemon::start_configured(&t.path().join("b"), &cfg("gw-b"));
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    b.ok(&["nbd", "export", &vdisk]);

    let acked = Arc::new(Mutex::new(load::Acked::new()));
    let loaded = |addr: String, stop: Arc<AtomicBool>| {
        let acked = acked.clone();
        std::thread::spawn(move || load::run(addr, acked, stop))
    };

    // Through A, which is killed under the load.
    let writer = loaded(a.nbd_address(), Arc::new(AtomicBool::new(false)));
    std::thread::sleep(Duration::from_secs(3));
    a.kill9();
    writer.join().unwrap();
    let took = until_served(&b, &pool, Duration::from_secs(15));
    let writes = acked.lock().unwrap().writes;
    eprintln!("{test}: {writes} writes acknowledged through A before it was killed; B took over {took:?} after");
    assert!(writes > 50, "the load hardly ran: {writes} writes");
    load::verify(&b.nbd_address(), &acked.lock().unwrap());

    // Through B, which is stopped under the load: A, started again, takes the pool over; B,
    // resumed, writes nothing more.
    let mut a = Daemon::start_configured(&t.path().join("a"), &cfg("gw-a"));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = loaded(b.nbd_address(), stop.clone());
    std::thread::sleep(Duration::from_secs(3));
    signal(&b, libc::SIGSTOP);
    let took = until_served(&a, &pool, Duration::from_secs(15));
    let before = acked.lock().unwrap().writes;
    signal(&b, libc::SIGCONT);
    writer.join().unwrap();
    let after = acked.lock().unwrap().writes;
    eprintln!("{test}: {after} writes acknowledged in all; A took over {took:?} after B stalled");
    // The one write B had in flight when it stopped may be answered late, if it reached the
    // cluster before the takeover; nothing after it.
    assert!(
        after <= before + 1,
        "B acknowledged writes after it was replaced: {before} then {after}"
    );
    load::verify(&a.nbd_address(), &acked.lock().unwrap());
    let check = a.json(&["pool", "check", &pool]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
    a.stop();
    b.kill9();
}

/// A gateway answers a write only once the cluster applied it, FUA or not, flush or not:
/// writes without FUA answered by A are all read back through B after A was killed without a
/// flush; and with the cluster's OSD stopped (SIGSTOP) a write through A is not answered at
/// all. A gateway that answered writes when it sent them, as a volatile cache, answered that
/// one at once, lost it when it died, and the host's next flush, at B, said durable over it.
#[test]
fn a_gateway_answers_a_write_only_once_the_cluster_applied_it() {
    let test = "a_gateway_answers_a_write_only_once_the_cluster_applied_it";
    // Alone on the cluster: its OSD stops under the test.
    let _alone = alone_on_the_cluster();
    let Some((conf, etcd)) = cluster_config(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("wt{pid}");
    let prefix = format!("/tessera-wt-{pid}");
    let t = tempfile::tempdir().unwrap();
    let cfg = |name: &str| gateway_config(name, &etcd, &prefix);
    let mut a = Daemon::start_configured(&t.path().join("a"), &cfg("gw-a"));
    create_rados_pool(&a, &pool, &conf);
    let vdisk = format!("{pool}/v");
    a.ok(&["vdisk", "create", &vdisk, "--size", "16M", "--layout", "simple"]);
    a.ok(&["nbd", "export", &vdisk]);
    let mut b = Daemon::start_configured(&t.path().join("b"), &cfg("gw-b"));
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    b.ok(&["nbd", "export", &vdisk]);
    // Every object made first (a write that makes one was always waited for).
    let (w, out) = qemu_io(&a, "v", "write -P 0x11 0 16M");
    assert!(w, "{out}");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let block = |i: u64| vec![(0x40 + i % 64) as u8; 4096];
    let c = rt
        .block_on(tessera_nbd::client::Client::connect(&a.nbd_address(), "v"))
        .unwrap();
    // 256 writes without FUA across the vdisk's four objects, all answered; no flush.
    for i in 0..256u64 {
        rt.block_on(c.write(i * 65536, &block(i), false)).unwrap();
    }
    // The OSD stopped: a write through A is not answered while the cluster cannot apply it.
    let (osd, _) = osd_process(&conf);
    assert_eq!(unsafe { libc::kill(osd, libc::SIGSTOP) }, 0);
    let stalled =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(3), c.write(8192, &[0x99; 4096], false)).await });
    a.kill9();
    assert_eq!(unsafe { libc::kill(osd, libc::SIGCONT) }, 0);
    assert!(
        stalled.is_err(),
        "A answered a write while the cluster's OSD was stopped: {stalled:?}"
    );
    drop(c);
    let took = until_served(&b, &pool, Duration::from_secs(30));
    eprintln!("{test}: B took the pool over {took:?} after A was killed");
    let c = rt
        .block_on(tessera_nbd::client::Client::connect(&b.nbd_address(), "v"))
        .unwrap();
    for i in 0..256u64 {
        let got = rt.block_on(c.read(i * 65536, 4096)).unwrap();
        assert!(
            got == block(i),
            "a write A answered is not at B: block at {}",
            i * 65536
        );
    }
    // The write A never answered: either content, never anything else.
    let got = rt.block_on(c.read(8192, 4096)).unwrap();
    assert!(got.iter().all(|&x| x == 0x99) || got.iter().all(|&x| x == 0x11));
    drop(c);
    drop(a);
    b.stop();
}

/// Relays every connection to `127.0.0.1:port` to `to` (etcd), from the moment it is
/// started (until then nothing listens there and connections are refused), until cut.
struct Relay {
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// While set, what either side sends is kept, not passed on: etcd seems stalled, its
    /// connections open.
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
    live: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    fn start(port: u16, to: String) -> Relay {
        use std::sync::atomic::Ordering;
        let relay = Relay {
            open: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
            held: Default::default(),
            live: Default::default(),
        };
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let (open, held, live) = (relay.open.clone(), relay.held.clone(), relay.live.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !open.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(&to) else {
                    continue;
                };
                let mut kept = live.lock().unwrap();
                kept.push(client.try_clone().unwrap());
                kept.push(server.try_clone().unwrap());
                for (mut from, mut into) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let held = held.clone();
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut buf = vec![0u8; 64 << 10];
                        while let Ok(n @ 1..) = from.read(&mut buf) {
                            while held.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            if into.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = into.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        relay
    }

    /// Closes every connection relayed, and refuses new ones until [`mend`](Self::mend).
    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn mend(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Passes nothing on until [`go_on`](Self::go_on), the connections kept open.
    fn hold(&self) {
        self.held.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn go_on(&self) {
        self.held.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A gateway whose etcd stalls (its connections open, nothing answered): a command that
/// needs etcd fails once the gateway's bound on a call to etcd has passed, saying so, rather
/// than wait for etcd for as long as it stalls (and hold the gateway's tick as long); once
/// etcd answers again the gateway joins again, serves its pool, and the command is answered.
#[test]
fn a_command_that_needs_a_stalled_etcd_fails_in_time() {
    let test = "a_command_that_needs_a_stalled_etcd_fails_in_time";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("stall{pid}");
    let (relay, through_relay) = relay_to(&etcd);
    let t = tempfile::tempdir().unwrap();
    let mut d = Daemon::start_configured(
        &t.path().join("a"),
        &gateway_config("gw-a", &through_relay, &format!("/tessera-test-stall-{pid}")),
    );
    create_rados_pool(&d, &pool, &conf);
    let move_args = ["pool", "move", pool.as_str(), "--to", "gw-b", "--no-wait"];
    let e = d.fails(&move_args);
    assert!(e.contains("gateway 'gw-b' presents no LUN"), "{e}");

    relay.hold();
    let t0 = Instant::now();
    let (out, took) = std::thread::scope(|s| {
        let asked = s.spawn(|| (d.cli(&move_args), t0.elapsed()));
        while !asked.is_finished() && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
        }
        // A command still waiting is answered once etcd is.
        relay.go_on();
        asked.join().unwrap()
    });
    eprintln!("{test}: the command failed after {took:?}: {}", out.stderr.trim());
    assert!(!out.success, "{out:?}");
    // Said as the command's own call timing out, or as its wait for the membership (which
    // the tick's call, stalled as well, held) leaving too little time to make it.
    assert!(
        out.stderr.contains("etcd did not answer within") && out.stderr.contains("a member stalled")
            || out.stderr.contains("membership was busy for") && out.stderr.contains("one etcd does not answer"),
        "{out:?}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}");

    // Its lease lapsed meanwhile (3 s against a stall of 45): it gives the pool up (the pool
    // is listed as served until its tick has seen the lapse), joins again and takes its
    // pool anew.
    until_event(&d, "pool.lost", Duration::from_secs(30));
    until_served(&d, &pool, Duration::from_secs(20));
    let e = d.fails(&move_args);
    assert!(e.contains("gateway 'gw-b' presents no LUN"), "{e}");
    d.ok(&["pool", "destroy", &pool]);
    d.stop();
}

/// A gateway whose etcd does not answer when it starts still starts and serves its local
/// pools; pools on RADOS wait, saying why, and once etcd answers it joins by itself.
#[test]
fn a_gateway_starts_without_etcd_and_joins_once_it_answers() {
    let test = "a_gateway_starts_without_etcd_and_joins_once_it_answers";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("late{pid}");
    let prefix = format!("/tessera-test-late-{pid}");
    // A free port that nothing listens on yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = tempfile::tempdir().unwrap();
    let mut d = Daemon::start_configured(
        &t.path().join("a"),
        &gateway_config("gw-late", &format!("127.0.0.1:{port}"), &prefix),
    );
    create_pool(&d, "local", &disks(&t.path().join("disks"), 2, 256 << 20));
    d.ok(&["vdisk", "create", "local/v", "--size", "64M"]);
    let e = d.fails(&create_rados_pool_args(&pool, &conf));
    assert!(e.contains("has not joined the gateways yet"), "{e}");

    let _relay = Relay::start(port, etcd.trim_start_matches("http://").to_string());
    let t0 = Instant::now();
    loop {
        let out = d.cli(&create_rados_pool_args(&pool, &conf));
        if out.success {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "not joined 20 s after etcd answered: {}\n{}",
            out.stderr,
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(pool_entry(&d, &pool)["rados"]["here"], true);
    assert!(d.logs().contains("joined the gateways"), "{}", d.logs());
    // Exported, it is listed among the pools to import, and comes back by its name.
    let importable = |d: &Daemon| -> Vec<String> {
        d.json(&["pool", "import"])
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(!importable(&d).contains(&pool));
    d.ok(&["pool", "export", &pool]);
    assert_eq!(importable(&d), vec![pool.clone()]);
    d.ok(&["pool", "import", &pool]);
    assert!(importable(&d).is_empty());
    assert_eq!(pool_entry(&d, &pool)["rados"]["here"], true);
    d.ok(&["pool", "destroy", &pool]);
    d.stop();
}

/// A gateway reaches an etcd that serves TLS only and knows each gateway by its certificate,
/// its role confining it to the gateways' prefix (docs/security.md): it joins and serves a
/// pool on RADOS, its keys in that etcd. A gateway that does not trust etcd's certificate
/// joins nothing and says why.
#[test]
fn a_gateway_joins_an_etcd_that_serves_tls_and_knows_it_by_its_certificate() {
    use tessera_test_support::tls_etcd::{Identity, TlsEtcd};
    let test = "a_gateway_joins_an_etcd_that_serves_tls_and_knows_it_by_its_certificate";
    let Some((conf, _plain_etcd, _cluster)) = cluster(test) else {
        return;
    };
    let etcd = match TlsEtcd::start() {
        Ok(e) => e,
        Err(why) => return tessera_disk::skip(test, &why),
    };
    let pid = std::process::id();
    let (pool, prefix) = (format!("tls{pid}"), format!("/tessera-test-tls-{pid}"));
    let table = |name: &str, ca: &std::path::Path, id: &Identity| {
        format!(
            "{}etcd_ca_file = \"{}\"\netcd_cert_file = \"{}\"\netcd_key_file = \"{}\"\n",
            gateway_config(name, &etcd.endpoint, &prefix),
            ca.display(),
            id.cert.display(),
            id.key.display()
        )
    };
    let t = tempfile::tempdir().unwrap();
    let gw = etcd.user_for_prefix("gw-tls", &format!("{prefix}/")).unwrap();
    let mut a = Daemon::start_configured(&t.path().join("a"), &table("gw-tls", &etcd.ca(), &gw));
    create_rados_pool(&a, &pool, &conf);
    assert_eq!(pool_entry(&a, &pool)["rados"]["here"], true);
    let keys = etcd.ctl("root", &["get", "--prefix", "--keys-only", &prefix]).unwrap();
    assert!(keys.contains(&format!("pool.{pool}")), "{keys}");

    // Another authority's certificate for etcd: not trusted, and the pool list says why.
    let stranger = TlsEtcd::start().unwrap();
    let mut b = Daemon::start_configured(
        &t.path().join("b"),
        &table("gw-other", &stranger.ca(), &stranger.identity("gw-other").unwrap()),
    );
    let e = b.fails(&create_rados_pool_args(&format!("{pool}b"), &conf));
    assert!(
        e.contains("has not joined the gateways yet") && e.contains("invalid peer certificate"),
        "{e}"
    );
    b.stop();

    a.ok(&["pool", "destroy", &pool]);
    a.stop();
}

/// A gateway proves itself to etcd with a user and the password its file holds (an etcd on
/// its own machine, so in plain text): it joins and serves a pool on RADOS, its keys in that
/// etcd, and goes on serving it through a restart of etcd. A password file others may read
/// is refused, and the pool list says why.
#[test]
fn a_gateway_joins_an_etcd_as_a_user_with_a_password() {
    use std::os::unix::fs::PermissionsExt;
    use tessera_test_support::password_etcd::PasswordEtcd;
    let test = "a_gateway_joins_an_etcd_as_a_user_with_a_password";
    let Some((conf, _plain_etcd, _cluster)) = cluster(test) else {
        return;
    };
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut etcd = match PasswordEtcd::start(300) {
        Ok(e) => e,
        Err(why) => return tessera_disk::skip(test, &why),
    };
    let pid = std::process::id();
    let (pool, prefix) = (format!("pw{pid}"), format!("/tessera-test-pw-{pid}"));
    etcd.user_for_prefix("gw-pw", "gw-pw-password", &format!("{prefix}/"))
        .unwrap();
    let t = tempfile::tempdir().unwrap();
    let endpoint = etcd.endpoint.clone();
    let password_file = |name: &str, mode: u32| {
        let f = t.path().join(name);
        std::fs::write(&f, "gw-pw-password\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        format!(
            "{}etcd_user = \"gw-pw\"\netcd_password_file = \"{}\"\n",
            // A lease longer than etcd's restart takes on a busy machine.
            gateway_config("gw-pw", &endpoint, &prefix).replace("lease_seconds = 3", "lease_seconds = 8"),
            f.display()
        )
    };
    let mut a = Daemon::start_configured(&t.path().join("a"), &password_file("pw-a", 0o600));
    create_rados_pool(&a, &pool, &conf);
    assert_eq!(pool_entry(&a, &pool)["rados"]["here"], true);
    let keys = etcd.ctl_as_root(&["get", "--prefix", "--keys-only", &prefix]).unwrap();
    assert!(keys.contains(&format!("pool.{pool}")), "{keys}");

    // etcd is killed and started again, forgetting the gateway's token: the gateway serves
    // the pool all along, at the same epoch, and its next request to etcd goes through.
    let epoch = pool_entry(&a, &pool)["rados"]["epoch"].as_i64().unwrap();
    let restarted = AtomicBool::new(false);
    std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut looks = 0;
            let t0 = Instant::now();
            // Until 12 s past the restart, longer than the lease.
            while !restarted.load(Ordering::Relaxed) || t0.elapsed() < Duration::from_secs(12) {
                let p = pool_entry(&a, &pool);
                assert!(
                    p["health"] != "unavailable" && p["rados"]["here"] == true && p["rados"]["epoch"] == epoch,
                    "the gateway let the pool go as etcd restarted: {p}\n{}",
                    a.logs()
                );
                looks += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            looks
        });
        etcd.restart().unwrap();
        restarted.store(true, Ordering::Relaxed);
        let looks = watcher.join().unwrap();
        eprintln!("{test}: the pool was served at each of {looks} looks while etcd restarted");
    });
    create_rados_pool(&a, &format!("{pool}c"), &conf);
    a.ok(&["pool", "destroy", &format!("{pool}c")]);
    // A pool made before is taken again under the role: its metadata's epoch is checked
    // against etcd's revision, read where the role reaches.
    a.ok(&["pool", "export", &pool]);
    a.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    until_served(&a, &pool, Duration::from_secs(20));

    let mut b = Daemon::start_configured(&t.path().join("b"), &password_file("pw-b", 0o644));
    let e = b.fails(&create_rados_pool_args(&format!("{pool}b"), &conf));
    assert!(
        e.contains("has not joined the gateways yet") && e.contains("chmod 600"),
        "{e}"
    );
    b.stop();

    a.ok(&["pool", "destroy", &pool]);
    a.stop();
}

/// A relay to etcd at `etcd` that a test can cut and mend, and its endpoint.
fn relay_to(etcd: &str) -> (Relay, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let relay = Relay::start(port, etcd.trim_start_matches("http://").to_string());
    (relay, format!("127.0.0.1:{port}"))
}

/// An owner cut off from etcd (its lease lapses, and it cannot join again) keeps presenting
/// its LUN, transitioning, rather than withdrawing it: its hosts retry, at the other gateway
/// once that one took the pool, instead of failing the path on a LUN gone (until 2026-12-06
/// the LUN went until etcd answered again). Once it does, the LUN is standby there.
#[test]
fn an_owner_cut_off_from_etcd_keeps_its_lun_transitioning() {
    let test = "an_owner_cut_off_from_etcd_keeps_its_lun_transitioning";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = "iqn.2026-12.io.tessera:lost";
    let (relay, through_relay) = relay_to(&etcd);
    let TwoGateways {
        mut a,
        b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting_through(&conf, [&through_relay, &etcd], "lost", "lost", iqn);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pa = a.iscsi_portal();
    let tur = [0u8; 6];
    let at_a = || node_command(&rt, &pa, iqn, 1, &tur, Vec::new(), 0).map(|(r, _)| sense_of(&r));
    let until_a = |want: Option<(u8, u8, u8)>, limit: Duration, why: &str| {
        let t0 = Instant::now();
        let mut seen = Vec::new();
        loop {
            let now = at_a();
            if now == Some(want) {
                return;
            }
            seen.push(now);
            assert!(t0.elapsed() < limit, "{why}: {seen:?}\n{}", a.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    until_a(None, Duration::from_secs(15), "A does not serve the LUN");

    relay.cut();
    until_served(&b, &pool, Duration::from_secs(30));
    let t0 = Instant::now();
    while pool_entry(&a, &pool)["rados"]["here"] != false {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "A never took its lease for lost"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        at_a(),
        Some(Some((0x2, 0x04, 0x0A))),
        "A's LUN is not there, transitioning"
    );

    relay.mend();
    until_a(
        Some((0x2, 0x04, 0x0B)),
        Duration::from_secs(30),
        "A's LUN is not standby once etcd answers",
    );
    remove_lun_vdisk_and_pool(&b, iqn, &vdisk, &pool);
    a.stop();
}

/// A standby gateway cut off from etcd while the owner raised a unit attention for a host on
/// its standby path tells that host once etcd answers again: it watches the owners' notices
/// again from the last it saw, not from the moment it is back.
#[test]
fn a_standby_gateway_cut_off_from_etcd_tells_its_hosts_what_the_owner_raised_meanwhile() {
    use tessera_iscsi::initiator::Session;
    let test = "a_standby_gateway_cut_off_from_etcd_tells_its_hosts_what_the_owner_raised_meanwhile";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = "iqn.2026-12.io.tessera:cut";
    let (relay, through_relay) = relay_to(&etcd);
    let TwoGateways {
        a,
        mut b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting_through(&conf, [&etcd, &through_relay], "cut", "quorum", iqn);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (pa, pb) = (a.iscsi_portal(), b.iscsi_portal());

    // Node 2 keeps a session at B, the standby, and registers through it.
    let t0 = Instant::now();
    let kept = loop {
        match node_command(&rt, &pb, iqn, 2, &READ_KEYS, Vec::new(), 4096) {
            Some((r, _)) if r.status == 0 => break rt.block_on(Session::login(&pb, &node_port(2, iqn))).unwrap(),
            _ => {
                assert!(t0.elapsed() < Duration::from_secs(15), "B does not present the LUN");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    register_in(&rt, &kept, 0x2222);

    // B loses etcd (its lease lapses); meanwhile node 1 preempts node 2's key at A.
    relay.cut();
    std::thread::sleep(Duration::from_millis(500));
    let at_a = |cdb: &[u8], data: Vec<u8>| node_command(&rt, &pa, iqn, 1, cdb, data, 0).unwrap().0;
    let (cdb, p) = pr_out(6, 0, 0, 0x1111, false);
    assert_eq!(at_a(&cdb, p).status, 0);
    let (cdb, p) = pr_out(4, 1, 0x1111, 0x2222, false);
    assert_eq!(at_a(&cdb, p).status, 0, "node 1 preempts node 2");
    // Longer than B's lease: B joins again as well as watches again.
    std::thread::sleep(Duration::from_secs(4));

    // etcd answers B again: node 2 hears REGISTRATIONS PREEMPTED on its standby path.
    relay.mend();
    let (took, _) = until_preempted(
        &rt,
        &kept,
        Duration::from_secs(20),
        "node 2 is not told at B once etcd answers again",
        || b.logs(),
    );
    eprintln!("{test}: told at the standby port {took:?} after etcd answered B again");
    // Its lease lapsed meanwhile: it joins again too (perhaps only after the notice came,
    // through the watch its earlier connection made again).
    let t0 = Instant::now();
    while !b.logs().contains("joined the gateways") {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "B did not join again\n{}",
            b.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = rt.block_on(kept.logout());

    remove_lun_vdisk_and_pool(&a, iqn, &vdisk, &pool);
    b.stop();
}

/// An administrator moves a pool to the other gateway and back (`tessera pool move`), asked
/// once at the owner and once at the gateway it goes to: the owner hands it over at once,
/// though a host used it a moment before, the other takes it at a larger epoch, and what the
/// host wrote through the one it reads through the other. A move to a gateway that presents
/// no LUN of the pool, or of a pool on this machine's disks, is refused with why; a move to
/// the owner does nothing.
#[test]
fn an_administrator_moves_a_pool_to_the_other_gateway_and_back() {
    use tessera_iscsi::initiator::{LoginConfig, Session};
    let test = "an_administrator_moves_a_pool_to_the_other_gateway_and_back";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = "iqn.2026-12.io.tessera:move";
    let TwoGateways {
        a,
        mut b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting(&conf, &etcd, "mv", "mv", iqn);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let host = LoginConfig::new("iqn.2026-12.io.example:host", Some(iqn));
    let login = |d: &Daemon| rt.block_on(Session::login(&d.iscsi_portal(), &host)).unwrap();
    let (path_a, path_b) = (login(&a), login(&b));

    let e = a.fails(&["pool", "move", &pool, "--to", "gw-c"]);
    assert!(e.contains("gateway 'gw-c' presents no LUN of pool"), "{e}");
    create_pool(&a, "local", &disks(&_dir.path().join("local"), 2, 256 << 20));
    let e = a.fails(&["pool", "move", "local", "--to", "gw-b"]);
    assert!(e.contains("only a pool on Ceph RADOS moves"), "{e}");
    let out = a.ok(&["pool", "move", &pool, "--to", "gw-a"]);
    assert!(out.contains("moved to gateway gw-a"), "{out}");
    let first = pool_entry(&a, &pool)["rados"]["epoch"].as_i64().unwrap();
    // A third gateway presents the pool too: a pool moved is the gateway's it is moved to,
    // and C never takes it on the way. (Until 2026-12-06 a handover was a plain release,
    // and C, told as soon as B, took it about every other time.)
    let prefix = format!("/tessera-test-mv-{}", std::process::id());
    let mut c = Daemon::start_configured(&_dir.path().join("c"), &gateway_config("gw-c", &etcd, &prefix));
    c.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    c.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    c.ok(&["target", "lun", "add", iqn, &vdisk]);

    for lba in 0..16 {
        until_done(
            &rt,
            &path_a,
            &write1(lba),
            block(lba, 1),
            0,
            Duration::from_secs(10),
            &a,
        );
    }
    // B says it presents the pool's LUN once a tick has passed there.
    let moved = move_once_serving(&a, &pool, "gw-b");
    assert!(moved.success, "{moved:?}\n{}", a.logs());
    let served = until_served(&b, &pool, Duration::from_secs(20));
    let at_b = pool_entry(&b, &pool);
    eprintln!("{test}: to B: {} (served there {served:?} after)", moved.stdout.trim());
    let second = at_b["rados"]["epoch"].as_i64().unwrap();
    assert!(second > first, "{second} after {first}");
    for lba in 0..16 {
        let (r, _, _) = until_done(&rt, &path_b, &read1(lba), Vec::new(), 512, Duration::from_secs(10), &b);
        assert_eq!(r.data, block(lba, 1), "block {lba} read through B");
    }
    let events_a = a.json(&["events", "-n", "1000"]).to_string();
    assert!(events_a.contains("pool.move_asked"), "{events_a}");
    assert!(
        events_a.contains(&format!(
            "pool {pool} handed over to gateway gw-b, as an administrator asked"
        )),
        "{events_a}"
    );
    assert!(b.json(&["events", "-n", "1000"]).to_string().contains("pool.moved"));
    // A read the host sends through A as the pool moves (A's port standby now) does not have
    // A ask for the pool back: B, idle, keeps it past the time it would hand it over.
    let mut answers = Vec::new();
    while !answers.contains(&(0x2, 0x04, 0x0B)) {
        let r = rt.block_on(path_a.command(0, &read1(0), Vec::new(), 512)).unwrap();
        answers.push(sense_of(&r).unwrap_or_else(|| panic!("A answered a read: {}", r.status)));
        assert!(answers.len() < 5, "A's port is not standby: {answers:x?}");
    }
    std::thread::sleep(Duration::from_secs(11));
    let at_b_still = pool_entry(&b, &pool);
    assert_eq!(
        at_b_still["rados"]["here"], true,
        "the pool went back to A: {at_b_still}"
    );

    // Back, asked at A, which does not own the pool now.
    for lba in 0..16 {
        until_done(
            &rt,
            &path_b,
            &write1(lba),
            block(lba, 2),
            0,
            Duration::from_secs(10),
            &b,
        );
    }
    let back = a.ok(&["pool", "move", &pool, "--to", "gw-a"]);
    let served = until_served(&a, &pool, Duration::from_secs(20));
    let at_a = pool_entry(&a, &pool);
    eprintln!("{test}: back to A: {} (served there {served:?} after)", back.trim());
    assert!(at_a["rados"]["epoch"].as_i64().unwrap() > second, "{at_a}");
    for lba in 0..16 {
        let (r, _, _) = until_done(&rt, &path_a, &read1(lba), Vec::new(), 512, Duration::from_secs(10), &a);
        assert_eq!(r.data, block(lba, 2), "block {lba} read through A");
    }
    // Done: nothing moves it again.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(pool_entry(&a, &pool)["rados"]["here"], true);
    let at_c = pool_entry(&c, &pool);
    assert_eq!(at_c["rados"]["takeovers"], 0, "C took a pool handed to another: {at_c}");
    c.stop();

    // To B once more, which takes it and dies. A move to B, asked meanwhile (put in etcd
    // here, as an administrator at another gateway would), is given up when A takes the
    // pool back because B presents nothing now; not as a move that B failed to answer, for
    // B took the pool (which ended that move): this one is another, asked since. Until
    // 2026-12-06 A took any move to the gateway it last handed the pool over to for the one
    // it handed it over for.
    a.ok(&["pool", "move", &pool, "--to", "gw-b"]);
    until_served(&b, &pool, Duration::from_secs(20));
    let t0 = Instant::now();
    while pool_entry(&a, &pool)["rados"]["owner"] != "gw-b" {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", pool_entry(&a, &pool));
        std::thread::sleep(Duration::from_millis(100));
    }
    drop((path_a, path_b));
    b.kill9();
    let key = format!("/tessera-test-mv-{}/moves/pool.{pool}", std::process::id());
    let (put, out) = run_env(
        "etcdctl",
        &["--endpoints", &etcd, "put", &key, "gw-b"],
        &[("ETCDCTL_API", "3")],
    );
    assert!(put, "{out}");
    until_served(&a, &pool, Duration::from_secs(30));
    let given_up = until_event(&a, "pool.move_given_up", Duration::from_secs(10));
    assert!(given_up.contains("that gateway presents no LUN"), "{given_up}");
    assert_eq!(pool_entry(&a, &pool)["rados"]["here"], true);

    a.ok(&["pool", "destroy", "local"]);
    remove_lun_vdisk_and_pool(&a, iqn, &vdisk, &pool);
}

/// A gateway that exports a pool's vdisk over NBD, and presents no LUN of it, is a gateway
/// the pool may move to: its NBD clients are the hosts it serves. One that does neither is
/// refused. Until 2026-12-06 only gateways that present LUNs could be moved to.
#[test]
fn a_pool_moves_to_a_gateway_that_exports_it_over_nbd_only() {
    let test = "a_pool_moves_to_a_gateway_that_exports_it_over_nbd_only";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("nbdmv{pid}");
    let prefix = format!("/tessera-test-nbdmv-{pid}");
    let t = tempfile::tempdir().unwrap();
    let a = Daemon::start_configured(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix));
    create_rados_pool(&a, &pool, &conf);
    let vdisk = format!("{pool}/v");
    a.ok(&["vdisk", "create", &vdisk, "--size", "64M", "--layout", "simple"]);
    a.ok(&["nbd", "export", &vdisk]);
    let (w, out) = qemu_io(&a, "v", "write -P 0xc3 0 1M");
    assert!(w, "{out}");
    let mut b = Daemon::start_configured(&t.path().join("b"), &gateway_config("gw-b", &etcd, &prefix));
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    std::thread::sleep(Duration::from_secs(2));
    let e = a.fails(&["pool", "move", &pool, "--to", "gw-b"]);
    assert!(
        e.contains("gateway 'gw-b' presents no LUN of pool") && e.contains("exports none of its vdisks over NBD"),
        "{e}"
    );
    assert!(e.contains("(gateways that do: gw-a)"), "{e}");

    // Recorded at B while A owns the pool; B says so in etcd at its next tick.
    b.ok(&["nbd", "export", &vdisk]);
    let moved = move_once_serving(&a, &pool, "gw-b");
    assert!(moved.success, "{moved:?}\n{}", a.logs());
    let served = until_served(&b, &pool, Duration::from_secs(20));
    eprintln!("{test}: {} (served at B {served:?} after)", moved.stdout.trim());
    let (r, out) = qemu_io(&b, "v", "read -P 0xc3 0 1M");
    assert!(r, "{out}");
    // A offers the export no more: the pool is B's.
    let (r, _) = qemu_io(&a, "v", "read 0 4k");
    assert!(!r, "A still offers the export of a pool it handed over");

    b.ok(&["nbd", "remove", "v"]);
    b.ok(&["vdisk", "delete", &vdisk]);
    b.ok(&["pool", "destroy", &pool]);
    b.stop();
}

/// A pool handed over while the cluster does not give its records (here its configuration
/// record is damaged; in life the OSDs refuse or time out) keeps its LUN at the owner as a
/// standby LUN made from what the owner served, not gone: hosts find a standby path, not a
/// missing logical unit. Until 2026-12-06 the LUN was withdrawn until the records could be
/// read. Nobody takes the pool meanwhile; once the records are put right, the gateway it
/// was moved to takes it.
#[test]
fn a_pool_handed_over_while_its_records_cannot_be_read_keeps_its_lun_as_standby() {
    use tessera_iscsi::initiator::{LoginConfig, Session};
    let test = "a_pool_handed_over_while_its_records_cannot_be_read_keeps_its_lun_as_standby";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = "iqn.2026-12.io.tessera:unreadable";
    let TwoGateways {
        mut a,
        b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting(&conf, &etcd, "ur", "ur", iqn);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let host = LoginConfig::new("iqn.2026-12.io.example:host", Some(iqn));
    let path_a = rt.block_on(Session::login(&a.iscsi_portal(), &host)).unwrap();
    until_done(&rt, &path_a, &write1(0), block(0, 1), 0, Duration::from_secs(10), &a);
    let damaged = DamagedConfig::damage(&conf, &pool, _dir.path());
    // B says it presents the pool's LUN once a tick has passed there.
    let t0 = Instant::now();
    loop {
        let o = a.cli(&["pool", "move", &pool, "--to", "gw-b", "--no-wait"]);
        if o.success {
            break;
        }
        assert!(o.stderr.contains("presents no LUN"), "{}", o.stderr);
        assert!(t0.elapsed() < Duration::from_secs(15), "{}", o.stderr);
        std::thread::sleep(Duration::from_millis(200));
    }
    // Handed over at A's next tick: its port goes standby, and the LUN stays (looked at for
    // 2 s more once standby).
    let t0 = Instant::now();
    let mut answers = Vec::new();
    let mut standby_since = None;
    while standby_since.is_none_or(|t: Instant| t.elapsed() < Duration::from_secs(2)) {
        let r = rt.block_on(path_a.command(0, &read1(0), Vec::new(), 512)).unwrap();
        let answer = sense_of(&r).unwrap_or((0, 0, 0));
        if answers.last() != Some(&answer) {
            answers.push(answer);
        }
        if answer == (0x2, 0x04, 0x0B) {
            standby_since.get_or_insert_with(Instant::now);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not handed over: {answers:x?}\n{}",
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, (0, 0, 0) | (0x2, 0x04, 0x0A) | (0x2, 0x04, 0x0B) | (0x6, _, _))),
        "A's path lost its LUN: {answers:x?}\n{}",
        a.logs()
    );
    assert_eq!(
        answers.last(),
        Some(&(0x2, 0x04, 0x0B)),
        "not handed over: {answers:x?}"
    );
    // The host is told the unit changed under it (POWER ON OCCURRED, as at a new owner),
    // which stands for the unit attentions the real LUN had queued.
    assert!(answers.contains(&(0x6, 0x29, 0x00)), "{answers:x?}");
    let p = pool_entry(&b, &pool);
    assert_eq!(p["rados"]["here"], false, "{p}");
    assert!(
        p["problem"].as_str().is_some_and(|w| w.contains("cannot be read")),
        "{p}"
    );
    damaged.put_right();
    until_served(&b, &pool, Duration::from_secs(30));
    let path_b = rt.block_on(Session::login(&b.iscsi_portal(), &host)).unwrap();
    let (r, _, _) = until_done(&rt, &path_b, &read1(0), Vec::new(), 512, Duration::from_secs(10), &b);
    assert_eq!(r.data, block(0, 1));
    drop((path_a, path_b));
    a.stop();
    remove_lun_vdisk_and_pool(&b, iqn, &vdisk, &pool);
}

/// An owner whose key etcd lost while its lease holds (deleted by hand, or etcd restored from
/// an older snapshot): the other gateway takes the pool and fences it off; once a write of
/// its own is refused, it gives the pool up and presents it as standby, owned there, rather
/// than report an active/optimized path on which every write fails.
#[test]
fn an_owner_whose_key_was_lost_gives_the_pool_up_once_its_writes_are_refused() {
    an_owner_whose_key_was_lost_gives_the_pool_up(
        "an_owner_whose_key_was_lost_gives_the_pool_up_once_its_writes_are_refused",
        "lk",
        false,
    );
}

/// The same, for an owner whose hosts only read: a read refused to it fenced off counts as a
/// write refused. Until 2026-12-06 it failed the host's read and nothing more, and the owner
/// went on reporting an active/optimized path on which every read failed.
#[test]
fn an_owner_whose_key_was_lost_gives_the_pool_up_once_its_reads_are_refused() {
    an_owner_whose_key_was_lost_gives_the_pool_up(
        "an_owner_whose_key_was_lost_gives_the_pool_up_once_its_reads_are_refused",
        "lr",
        true,
    );
}

fn an_owner_whose_key_was_lost_gives_the_pool_up(test: &str, tag: &str, reads_only: bool) {
    use tessera_iscsi::initiator::{LoginConfig, Session};
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let iqn = &format!("iqn.2026-12.io.tessera:{tag}");
    let TwoGateways {
        a,
        mut b,
        pool,
        vdisk,
        _dir,
    } = two_gateways_presenting(&conf, &etcd, tag, tag, iqn);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let host = LoginConfig::new("iqn.2026-12.io.example:host", Some(iqn));
    let path_a = rt.block_on(Session::login(&a.iscsi_portal(), &host)).unwrap();
    until_done(&rt, &path_a, &write1(0), block(0, 1), 0, Duration::from_secs(10), &a);

    let key = format!("/tessera-test-{tag}-{}/owner/pool.{pool}", std::process::id());
    let deleted = ok("etcdctl", &["--endpoints", &etcd, "del", &key]);
    assert_eq!(deleted.trim(), "1", "the owner's key was there: {deleted}");
    let took = until_served(&b, &pool, Duration::from_secs(20));
    eprintln!("{test}: B took the pool {took:?} after A's key was deleted");
    // Refused: A's client is blocklisted. A read of the block written (a grain never written
    // reads as zeros from the pool's map alone); a write far from it, in a grain never
    // written, which reads nothing first.
    let r = if reads_only {
        rt.block_on(path_a.command(0, &read1(0), Vec::new(), 512)).unwrap()
    } else {
        rt.block_on(path_a.command(0, &write1(100_000), block(100_000, 2), 0))
            .unwrap()
    };
    assert_ne!(r.status, 0, "a command through the fenced owner succeeded");
    let t0 = Instant::now();
    loop {
        let p = pool_entry(&a, &pool);
        if p["rados"]["here"] == false && p["rados"]["owner"] == "gw-b" {
            eprintln!(
                "{test}: A gave the pool up {:?} after its {} was refused",
                t0.elapsed(),
                if reads_only { "read" } else { "write" }
            );
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{p}\n{}", a.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(path_a);
    drop(a);
    remove_lun_vdisk_and_pool(&b, iqn, &vdisk, &pool);
    b.stop();
}

/// Sends `SIGCONT` to the cluster's OSD, stopped by a test, when dropped, whatever became of
/// the test, and waits until the cluster answers again: an OSD left stopped would stall
/// every test after it.
struct GoesOn(i32);

impl Drop for GoesOn {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
        until_the_test_cluster_answers();
    }
}

/// Starts `pool destroy POOL` at `d` with the OSD of the cluster of `conf` stopped, and
/// returns once the destruction waits for it, removing the pool's objects: the destroy's
/// thread, and the OSD's stop, which ends when dropped. A background check of the pool
/// (every 2 s) that reads its records as the OSD stops holds the pool until the OSD goes
/// on: the destroy then finds it in use, and says so after a second; tried again then.
fn destroy_waiting_for_the_osd(d: &Daemon, pool: &str, conf: &str) -> (std::thread::JoinHandle<Out>, GoesOn) {
    let api = format!("unix:{}", d.sock.display());
    let removing = "destroying the pool: its objects are removed";
    for attempt in 1.. {
        // Looked for at each attempt: the last one's end may have started it again.
        let (osd, _) = osd_process(conf);
        assert_eq!(unsafe { libc::kill(osd, libc::SIGSTOP) }, 0);
        let stopped = GoesOn(osd);
        let destroy = std::thread::spawn({
            let (api, pool) = (api.clone(), pool.to_string());
            move || Daemon::cli_at(&api, None, &["pool", "destroy", &pool])
        });
        let t0 = Instant::now();
        while !destroy.is_finished() && !d.logs().contains(removing) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the destroy went nowhere\n{}",
                d.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        if !destroy.is_finished() {
            return (destroy, stopped);
        }
        let out = destroy.join().unwrap();
        assert!(
            !out.success && out.stderr.contains("is in use") && attempt < 5,
            "the destruction ended with the OSD stopped (attempt {attempt}): {out:?}"
        );
        drop(stopped);
        std::thread::sleep(Duration::from_secs(3));
    }
    unreachable!()
}

/// A pool on RADOS is destroyed without the administration's lock: its objects are removed
/// from the cluster (minutes for a large pool) while the other changes, and the takings of
/// other pools that wait for that lock, go on. Meanwhile its name is refused to a create
/// and an import, saying why. Here the cluster's OSD is stopped while the pool is
/// destroyed, so that the destruction waits for it. Until 2026-12-06 a pool made meanwhile
/// waited for the destruction, and a failover of another pool with it.
#[test]
fn a_pool_being_destroyed_keeps_no_other_change_waiting() {
    let test = "a_pool_being_destroyed_keeps_no_other_change_waiting";
    // Alone on the cluster: its OSD stops under the test.
    let _alone = alone_on_the_cluster();
    let Some((conf, etcd)) = cluster_config(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("dst{pid}");
    let t = tempfile::tempdir().unwrap();
    let a = Daemon::start_configured(
        &t.path().join("a"),
        &gateway_config("gw-a", &etcd, &format!("/tessera-test-dst-{pid}")),
    );
    create_rados_pool(&a, &pool, &conf);
    let (destroy, stopped) = destroy_waiting_for_the_osd(&a, &pool, &conf);
    let t0 = Instant::now();
    create_pool(&a, "local", &disks(&t.path().join("local"), 2, 256 << 20));
    let made_in = t0.elapsed();
    assert!(
        !destroy.is_finished(),
        "a pool made meanwhile waited for the destruction ({made_in:?}): {:?}",
        destroy.join().unwrap()
    );
    for args in [
        create_rados_pool_args(&pool, &conf).to_vec(),
        vec!["pool", "import", &pool],
        vec!["pool", "export", &pool],
    ] {
        let e = a.fails(&args);
        assert!(e.contains("is being destroyed here"), "{args:?}: {e}");
    }
    let importable = a.ok(&["pool", "import"]);
    assert!(!importable.contains(&pool), "{importable}");
    // Listed meanwhile as being destroyed.
    let listed = pool_entry(&a, &pool);
    assert_eq!(listed["health"], "destroying", "{listed}");
    assert!(
        listed["problem"]
            .as_str()
            .unwrap()
            .contains("being removed from the cluster"),
        "{listed}"
    );
    drop(stopped);
    let out = destroy.join().unwrap();
    assert!(
        out.success,
        "the destruction failed once the OSD went on: {}\n{}",
        out.stderr,
        a.logs()
    );
    // Gone here and in the cluster: its name is free again.
    let names: Vec<String> = a
        .json(&["pool", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["local"]);
    let (_, objects) = run("rados", &["-c", &conf, "-p", RADOS_POOL, "ls"]);
    assert!(
        !objects.lines().any(|o| o.starts_with(&format!("tessera.{pool}."))),
        "objects of the destroyed pool are left: {objects}"
    );
    create_rados_pool(&a, &pool, &conf);
    a.ok(&["pool", "destroy", &pool]);
    a.ok(&["pool", "destroy", "local"]);
}

/// A pool exported while its owner cannot reach etcd is given up there once etcd answers
/// again, at the owner's next ticks: its key, on the owner's lease, would otherwise keep the
/// pool from every other gateway for as long as the owner runs. The owner's lease is long
/// here (60 s), so that it outlasts the cut and only the release frees the pool.
#[test]
fn a_pool_exported_while_etcd_was_cut_off_is_given_up_once_it_answers() {
    let test = "a_pool_exported_while_etcd_was_cut_off_is_given_up_once_it_answers";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("rel{pid}");
    let prefix = format!("/tessera-test-rel-{pid}");
    let (relay, through_relay) = relay_to(&etcd);
    let t = tempfile::tempdir().unwrap();
    let long_lease = gateway_config("gw-a", &through_relay, &prefix).replace("lease_seconds = 3", "lease_seconds = 60");
    assert!(long_lease.contains("lease_seconds = 60"), "{long_lease}");
    let a = Daemon::start_configured(&t.path().join("a"), &long_lease);
    let b = Daemon::start_configured(&t.path().join("b"), &gateway_config("gw-b", &etcd, &prefix));
    create_rados_pool(&a, &pool, &conf);
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    let owner_at_b = || pool_entry(&b, &pool)["rados"]["owner"].clone();
    let t0 = Instant::now();
    while owner_at_b() != "gw-a" {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", pool_entry(&b, &pool));
        std::thread::sleep(Duration::from_millis(100));
    }

    relay.cut();
    let cut = Instant::now();
    a.ok(&["pool", "export", &pool]);
    // The ticks meanwhile try the release again, and fail: the key stays, and B waits.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(owner_at_b(), "gw-a", "{}", pool_entry(&b, &pool));
    relay.mend();
    let cut_for = cut.elapsed();
    assert!(
        cut_for < Duration::from_secs(30),
        "the cut lasted {cut_for:?}: A's lease may have lapsed, which frees the pool without its release"
    );
    until_served(&b, &pool, Duration::from_secs(20));
    assert!(
        a.logs().contains("cannot give the pool up in etcd now"),
        "A's release did not fail during the cut: {}",
        a.logs()
    );
    b.ok(&["pool", "destroy", &pool]);
}

/// An owner does not hand a pool again to a gateway that asked for it and never took it when
/// it was handed over (it failed before it came to take it): another gateway that asks gets
/// it. Here the asks of B and of a gateway "gw-0", which does not run, are put in etcd by
/// hand; the owner hands the pool to gw-0 first (asks are answered in name order), takes it
/// back once its grace is over, and hands it to B next. Without that, gw-0 would be handed
/// the pool again at every round, and B's hosts never served.
#[test]
fn an_owner_hands_a_pool_to_another_asker_after_one_left_it_untaken() {
    let test = "an_owner_hands_a_pool_to_another_asker_after_one_left_it_untaken";
    let Some((conf, etcd, _cluster)) = cluster(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("unt{pid}");
    let prefix = format!("/tessera-test-unt-{pid}");
    let t = tempfile::tempdir().unwrap();
    let a = Daemon::start_configured(&t.path().join("a"), &gateway_config("gw-a", &etcd, &prefix));
    let b = Daemon::start_configured(&t.path().join("b"), &gateway_config("gw-b", &etcd, &prefix));
    create_rados_pool(&a, &pool, &conf);
    let granted = ok("etcdctl", &["--endpoints", &etcd, "lease", "grant", "120"]);
    let lease = granted.split_whitespace().nth(1).expect("lease ID").to_string();
    for asker in ["gw-0", "gw-b"] {
        let key = format!("{prefix}/wants/pool.{pool}/{asker}");
        ok(
            "etcdctl",
            &["--endpoints", &etcd, "put", &format!("--lease={lease}"), &key, ""],
        );
    }
    let handed_to = |to: &str| {
        a.json(&["events", "-n", "1000"])["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                e["kind"] == "pool.handed_over" && e["message"].as_str().unwrap().contains(&format!("to gateway {to}:"))
            })
            .count()
    };
    let t0 = Instant::now();
    while handed_to("gw-0") == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never handed to gw-0\n{}",
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Taken back once its grace is over; B joins only then, so that it cannot take the pool
    // itself once the handoff to gw-0 ends.
    let t0 = Instant::now();
    while pool_entry(&a, &pool)["rados"]["here"] != true {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "A never took the pool back\n{}",
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    until_served(&b, &pool, Duration::from_secs(60));
    // Served at B: gw-0's ask goes, or B would hand the pool to it in turn.
    ok("etcdctl", &["--endpoints", &etcd, "lease", "revoke", &lease]);
    assert_eq!(handed_to("gw-0"), 1, "{}", a.logs());
    assert_eq!(handed_to("gw-b"), 1, "{}", a.logs());
    b.ok(&["pool", "destroy", &pool]);
}

/// A destruction that the cluster does not let finish (here its OSD stopped: the gateway's
/// Ceph client gives up on an operation after 30 s) fails saying that it goes on in the
/// background; the pool is listed as being destroyed, saying why it is not finished, and
/// its name is refused. Once the OSD is back, the gateway decides: the label was never
/// wiped (its read timed out first), so the pool is left whole, not imported here, and it
/// can be imported and destroyed again.
#[test]
fn a_destroy_the_cluster_does_not_let_finish_goes_on_in_the_background() {
    let test = "a_destroy_the_cluster_does_not_let_finish_goes_on_in_the_background";
    // Alone on the cluster: its OSD stops under the test.
    let _alone = alone_on_the_cluster();
    let Some((conf, etcd)) = cluster_config(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("dfail{pid}");
    let t = tempfile::tempdir().unwrap();
    let a = Daemon::start_configured(
        &t.path().join("a"),
        &gateway_config("gw-a", &etcd, &format!("/tessera-test-dfail-{pid}")),
    );
    create_rados_pool(&a, &pool, &conf);
    let (destroy, stopped) = destroy_waiting_for_the_osd(&a, &pool, &conf);
    let out = destroy.join().unwrap();
    assert!(
        !out.success && out.stderr.contains("goes on with it in the background"),
        "{out:?}"
    );
    let listed = pool_entry(&a, &pool);
    assert_eq!(listed["health"], "destroying", "{listed}");
    assert!(
        listed["problem"].as_str().unwrap().contains("failed half way"),
        "{listed}"
    );
    let e = a.fails(&create_rados_pool_args(&pool, &conf));
    assert!(e.contains("is being destroyed here"), "{e}");
    drop(stopped);
    let why = until_event(&a, "pool.destroy_abandoned", Duration::from_secs(60));
    assert!(why.contains("its label was never wiped"), "{why}");
    assert!(a
        .json(&["pool", "list"])
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["name"] != pool));
    // Whole: imported, served, and destroyed for good this time.
    a.ok(&["pool", "import", &pool]);
    until_served(&a, &pool, Duration::from_secs(30));
    a.ok(&["pool", "destroy", &pool]);
    let (_, objects) = run("rados", &["-c", &conf, "-p", RADOS_POOL, "ls"]);
    assert!(
        !objects.lines().any(|o| o.starts_with(&format!("tessera.{pool}."))),
        "objects of the destroyed pool are left: {objects}"
    );
}

/// A destruction that the gateway's stop cuts short is finished at its next start: the
/// pool was marked as being destroyed before its label was wiped, and the gateway takes it
/// again, finds its label wiped and removes what is left of it (its objects, its keys in
/// etcd, its directory), so that its name is free again. Cut before the wipe, the pool is
/// left whole, not imported here: here gateway B, a standby of the pool, takes it and
/// serves it meanwhile, and A leaves it to B. The cluster's OSD is stopped while the pool
/// is destroyed, and the gateway killed meanwhile, before its wipe; the second time the
/// label is wiped by hand (its object removed), as the wipe would have; the pool is listed
/// as being destroyed until then (seen for sure while A runs as no gateway, which cannot
/// finish it). Until 2026-12-06 what was left stayed until removed by hand (`rados rm`, `etcdctl del`),
/// and the name was refused to a create.
#[test]
fn a_destroy_cut_short_by_a_stop_is_finished_at_the_next_start() {
    let test = "a_destroy_cut_short_by_a_stop_is_finished_at_the_next_start";
    // Alone on the cluster: its OSD stops under the test.
    let _alone = alone_on_the_cluster();
    let Some((conf, etcd)) = cluster_config(test) else {
        return;
    };
    let pid = std::process::id();
    let pool = format!("dcut{pid}");
    let prefix = format!("/tessera-test-dcut-{pid}");
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("a");
    let config = gateway_config("gw-a", &etcd, &prefix);
    let mut a = Daemon::start_configured(&state, &config);
    create_rados_pool(&a, &pool, &conf);
    let b = Daemon::start_configured(&t.path().join("b"), &gateway_config("gw-b", &etcd, &prefix));
    b.ok(&["pool", "import", &pool, "--rados", RADOS_POOL, "--ceph-conf", &conf]);
    let objects = || -> Vec<String> {
        let (_, all) = run("rados", &["-c", &conf, "-p", RADOS_POOL, "ls"]);
        all.lines()
            .filter(|o| o.starts_with(&format!("tessera.{pool}.")))
            .map(String::from)
            .collect()
    };
    assert!(objects().len() >= 2, "{:?}", objects());
    let label_object = format!("tessera.{pool}.data.{:016x}", 0);
    let label_file = t.path().join("label");
    let labelled = || {
        let _ = std::fs::remove_file(&label_file);
        let get = [
            "-c",
            &conf,
            "-p",
            RADOS_POOL,
            "get",
            &label_object,
            label_file.to_str().unwrap(),
        ];
        run("rados", &get).0 && std::fs::read(&label_file).unwrap().iter().take(4096).any(|&b| b != 0)
    };
    assert!(labelled());
    let place = format!("{prefix}/place/pool.{pool}");
    let recorded = || {
        ok(
            "etcdctl",
            &[
                "--endpoints",
                &etcd,
                "get",
                "--keys-only",
                "--prefix",
                &format!("{prefix}/"),
            ],
        )
    };
    assert!(recorded().contains(&place), "{}", recorded());
    // Kills `a` while its destroy of the pool waits for the stopped OSD.
    let cut_short = |a: &mut Daemon| {
        let (destroy, stopped) = destroy_waiting_for_the_osd(a, &pool, &conf);
        a.kill9();
        let out = destroy.join().unwrap();
        assert!(!out.success, "a destroy cut short said it was done: {out:?}");
        drop(stopped);
        // What the OSD had of the killed gateway's requests, it has applied by now.
        std::thread::sleep(Duration::from_secs(2));
    };
    // Restarted, `a` ends the destruction one way or the other, refusing the name until
    // then; the kind, number and message of the event that says which, after event `after`.
    let ended_after = |a: &Daemon, after: u64| -> (String, u64, String) {
        let t0 = Instant::now();
        let mut refused = String::new();
        loop {
            let events = a.json(&["events", "-n", "1000"]);
            let ended = events["events"].as_array().unwrap().iter().find_map(|e| {
                let kind = e["kind"].as_str().unwrap();
                let ours = e["pool"].as_str() == Some(pool.as_str()) && e["seq"].as_u64().unwrap() > after;
                (ours && ["pool.destroyed", "pool.destroy_abandoned"].contains(&kind)).then(|| {
                    let message = e["message"].as_str().unwrap().to_string();
                    (kind.to_string(), e["seq"].as_u64().unwrap(), message)
                })
            });
            if let Some(ended) = ended {
                return ended;
            }
            // Refused as being destroyed, or ended since the look above: said by then.
            assert!(
                refused.is_empty(),
                "the name is free, and no event says why: {refused}\n{events:#}"
            );
            // Listed until it ends, as being destroyed.
            let listed = a.json(&["pool", "list"]);
            if let Some(p) = listed.as_array().unwrap().iter().find(|p| p["name"] == pool) {
                assert_eq!(p["health"], "destroying", "{p}");
            }
            // (An export would abandon the destruction.)
            let e = a.fails(&["pool", "destroy", &pool]);
            if !e.contains("is being destroyed here") {
                refused = e;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the destruction cut short was neither finished nor left: {events:#}\n{}",
                a.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    cut_short(&mut a);
    assert!(state.join("pools").join(&pool).exists());
    // The wipe reads the label first, which waited for the OSD: the gateway was killed
    // before it could write anything.
    assert!(labelled());
    // B takes the pool once A's lease lapses, and serves it; A, back, leaves it to B.
    until_served(&b, &pool, Duration::from_secs(30));
    a = Daemon::start_configured(&state, &config);
    let (kind, seen, message) = ended_after(&a, 0);
    assert_eq!(kind, "pool.destroy_abandoned", "{}", a.logs());
    // Left to B from its label, read without taking the pool from B.
    assert!(
        message.contains("gateway gw-b took it, and its label was never wiped"),
        "{message}"
    );
    assert!(labelled());
    until_served(&b, &pool, Duration::from_secs(1));
    // Whole, and served at A once B lets it go.
    b.ok(&["pool", "export", &pool]);
    drop(b);
    assert!(a.ok(&["pool", "import"]).contains(&pool));
    a.ok(&["pool", "import", &pool]);
    until_served(&a, &pool, Duration::from_secs(30));
    // Cut again, and the label wiped by hand (its object removed) as the wipe would have.
    cut_short(&mut a);
    ok("rados", &["-c", &conf, "-p", RADOS_POOL, "rm", &label_object]);
    // Restarted as no gateway, `a` cannot finish it, and lists the pool as being destroyed,
    // saying why it is not finished; its name stays refused.
    a = Daemon::start(&state);
    let listed = pool_entry(&a, &pool);
    assert_eq!(listed["health"], "destroying", "{listed}");
    assert_eq!(listed["rados"]["rados_pool"], RADOS_POOL, "{listed}");
    let why = listed["problem"].as_str().unwrap();
    assert!(
        why.contains("cut short by a stop") && why.contains("no longer a gateway"),
        "{why}"
    );
    let table = a.ok(&["pool", "list"]);
    assert!(
        table.contains("destroying") && table.contains("no longer a gateway"),
        "{table}"
    );
    assert!(a.fails(&["pool", "destroy", &pool]).contains("is being destroyed here"));
    assert!(!a.ok(&["pool", "import"]).contains(&pool));
    drop(a);
    // Cut after the wipe: finished, and nothing of it is left, here, in the cluster or in etcd.
    a = Daemon::start_configured(&state, &config);
    let (kind, _, _) = ended_after(&a, seen);
    assert_eq!(kind, "pool.destroyed", "{}", a.logs());
    assert_eq!(
        objects(),
        Vec::<String>::new(),
        "objects of the destroyed pool are left"
    );
    // Its place, fence and owner keys.
    assert!(!recorded().contains(&format!("pool.{pool}")), "{}", recorded());
    assert!(!state.join("pools").join(&pool).exists());
    // Its name is free again.
    create_rados_pool(&a, &pool, &conf);
    a.ok(&["pool", "destroy", &pool]);
}
