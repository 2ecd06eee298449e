//! The iSCSI target, driven by initiators nobody here wrote: libiscsi's tools and QEMU.

mod common;

use common::*;
use tessera_test_support::cdbs::pr_out;
use tessera_test_support::cunit;

const IQN: &str = "iqn.2026-11.io.tessera:demo";

#[test]
fn demo_lun_answers_libiscsi_tools() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(&t.path().join("demo"), &["--demo", "--api-listen", "none"]).unwrap();
    let portal = d.iscsi_portal();
    assert!(
        d.stdout().contains(&format!("iscsi://{portal}/{IQN}/0")),
        "{}",
        d.stdout()
    );

    let ls = ok("iscsi-ls", &["-s", &format!("iscsi://{portal}")]);
    assert!(ls.contains(IQN), "{ls}");
    let inq = ok("iscsi-inq", &[&format!("iscsi://{portal}/{IQN}/0")]);
    assert!(inq.contains("TESSERA"), "{inq}");
    let cap = ok("iscsi-readcapacity16", &[&format!("iscsi://{portal}/{IQN}/0")]);
    assert!(
        cap.contains(&(16u64 << 30).to_string()) || cap.contains("33554431"),
        "{cap}"
    );
    // A LUN that does not exist (libiscsi's connect probes it and hears LOGICAL UNIT NOT
    // SUPPORTED), and a target that does not.
    let (success, out) = run("iscsi-inq", &[&format!("iscsi://{portal}/{IQN}/7")]);
    assert!(!success && out.contains("LOGICAL_UNIT_NOT_SUPPORTED"), "{out}");
    let (success, _) = run(
        "iscsi-inq",
        &[&format!("iscsi://{portal}/iqn.2026-11.io.tessera:nope/0")],
    );
    assert!(!success);
}

#[test]
fn qemu_img_round_trip_with_and_without_digests() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "q", &disks(&t.path().join("disks"), 3, 1 << 30));
    d.ok(&["vdisk", "create", "q/v", "--size", "256M", "--layout", "mirror"]);
    d.ok(&[
        "vdisk",
        "create",
        "q/w",
        "--size",
        "256M",
        "--layout",
        "parity",
        "--block-size",
        "4096",
    ]);
    let iqn = "iqn.2026-11.io.tessera:test";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "q/v"]);
    d.ok(&["target", "lun", "add", iqn, "q/w", "--lun", "5"]);
    let shown = d.json(&["target", "show", iqn]);
    assert_eq!(shown["luns"].as_array().unwrap().len(), 2);
    let portal = d.iscsi_portal();

    let img = t.path().join("in.img");
    random_image(&img, 40 << 20, 9);
    for (lun, digest) in [(0, "none"), (5, "crc32c")] {
        let opts = format!("driver=iscsi,transport=tcp,portal={portal},target={iqn},lun={lun},header-digest={digest}");
        ok(
            "qemu-img",
            &[
                "convert",
                "-n",
                "-f",
                "raw",
                img.to_str().unwrap(),
                "--target-image-opts",
                &opts,
            ],
        );
        let out = t.path().join(format!("out{lun}.img"));
        ok(
            "qemu-img",
            &["convert", "-O", "raw", "--image-opts", &opts, out.to_str().unwrap()],
        );
        assert!(read_back_matches(&img, &out), "LUN {lun} ({digest}) read back differs");
    }
    // The data went through the engine: export it through the API too.
    let out = t.path().join("api.img");
    d.ok(&["vdisk", "export", "q/v", out.to_str().unwrap()]);
    assert!(read_back_matches(&img, &out));

    // A presented vdisk cannot be deleted, nor its pool exported.
    assert!(d.fails(&["vdisk", "delete", "q/v"]).contains("LUN 0"));
    assert!(d.fails(&["pool", "export", "q"]).contains("LUN"));
    assert!(d.fails(&["target", "lun", "add", iqn, "q/v"]).contains("already LUN 0"));
    assert!(d.fails(&["target", "create", "IQN.bad"]).contains("not an iSCSI name"));
    d.ok(&["target", "lun", "remove", iqn, "0"]);
    d.ok(&["vdisk", "delete", "q/v"]);
}

#[test]
fn targets_survive_a_restart() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    create_pool(&d, "r", &disks(&t.path().join("disks"), 2, 1 << 30));
    d.ok(&["vdisk", "create", "r/v", "--size", "64M"]);
    let iqn = "iqn.2026-11.io.tessera:keep";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "r/v", "--lun", "3"]);
    d.kill9();
    let mut d = Daemon::start(&state);
    let v = d.json(&["target", "show", iqn]);
    assert_eq!(v["luns"][0]["lun"], 3);
    assert_eq!(v["luns"][0]["online"], true);
    let inq = ok("iscsi-inq", &[&format!("iscsi://{}/{iqn}/3", d.iscsi_portal())]);
    assert!(inq.contains("TESSERA"), "{inq}");

    // Every disk of the pool is away at start: the LUN is configured but offline.
    d.stop();
    let disks: Vec<_> = (0..2).map(|i| t.path().join(format!("disks/d{i}.img"))).collect();
    for p in &disks {
        std::fs::rename(p, p.with_extension("away")).unwrap();
    }
    let d = Daemon::start(&state);
    assert_eq!(d.json(&["target", "show", iqn])["luns"][0]["online"], false);
    assert!(!run("iscsi-inq", &[&format!("iscsi://{}/{iqn}/3", d.iscsi_portal())])
        .1
        .contains("TESSERA"));
    // The disks come back and the pool is imported: so is the LUN.
    for p in &disks {
        std::fs::rename(p.with_extension("away"), p).unwrap();
    }
    d.ok(&["pool", "import", "r"]);
    assert_eq!(d.json(&["target", "show", iqn])["luns"][0]["online"], true);
    let inq = ok("iscsi-inq", &[&format!("iscsi://{}/{iqn}/3", d.iscsi_portal())]);
    assert!(inq.contains("TESSERA"), "{inq}");
}

#[test]
fn added_portals_serve_discovery_and_survive_a_restart() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    create_pool(&d, "p", &disks(&t.path().join("disks"), 1, 1 << 30));
    d.ok(&["vdisk", "create", "p/v", "--size", "64M", "--layout", "simple"]);
    let iqn = "iqn.2026-11.io.tessera:paths";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "p/v"]);
    let first = d.iscsi_portal();
    // A second path on another loopback address, as a second storage network would be.
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let second = format!("127.0.0.2:{port}");
    let added = d.json(&["target", "portal", "add", &second]);
    assert_eq!(added["listening_on"], second.as_str());
    assert_eq!(added["source"], "api");

    // Bad requests are refused with the reason and change nothing.
    assert!(d.fails(&["target", "portal", "add", &second]).contains("exists"));
    assert!(d
        .fails(&["target", "portal", "add", "storage-net"])
        .contains("IP[:PORT]"));
    assert!(d.fails(&["target", "portal", "add", &first]).contains("exists"));
    assert!(d
        .fails(&["target", "portal", "remove", &first])
        .contains("configuration"));
    assert!(d
        .fails(&["target", "portal", "remove", "127.0.0.9"])
        .contains("no portal"));
    assert_eq!(d.json(&["target", "portal", "list"]).as_array().unwrap().len(), 2);

    // Discovery through either portal names both; the LUN answers through the second.
    let check = |first: &str| {
        for via in [first, second.as_str()] {
            let seen = ok("iscsi-ls", &["--url", &format!("iscsi://{via}")]);
            assert!(seen.contains(first) && seen.contains(&second), "via {via}: {seen}");
        }
        let inq = ok("iscsi-inq", &[&format!("iscsi://{second}/{iqn}/0")]);
        assert!(inq.contains("TESSERA"), "{inq}");
    };
    check(&first);
    let listed = d.ok(&["target", "portal", "list"]);
    assert!(listed.contains(&format!("listening on {second}")), "{listed}");

    d.kill9();
    let mut d = Daemon::start(&state);
    check(&d.iscsi_portal());

    d.ok(&["target", "portal", "remove", &second]);
    assert!(std::net::TcpStream::connect(&second).is_err(), "{second} still accepts");
    d.stop();
    let d = Daemon::start(&state);
    assert_eq!(d.json(&["target", "portal", "list"]).as_array().unwrap().len(), 1);
}

/// Failures of libiscsi's suite that are known, each with its reason. The test fails on any
/// other failure, and on one of these that no longer happens (then it leaves this list).
const KNOWN_FAILURES: &[(&str, &str)] = &[];

#[test]
fn chap_and_acl_gate_logins_and_discovery() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    create_pool(&d, "c", &disks(&t.path().join("disks"), 1, 1 << 30));
    d.ok(&["vdisk", "create", "c/v", "--size", "64M", "--layout", "simple"]);
    let open = "iqn.2026-11.io.tessera:open";
    let secure = "iqn.2026-11.io.tessera:secure";
    let mutual = "iqn.2026-11.io.tessera:mutual";
    let closed = "iqn.2026-11.io.tessera:closed";
    let (host_a, host_b) = ("iqn.2026-11.io.example:host-a", "iqn.2026-11.io.example:host-b");
    // open and mutual admit any initiator (mutual with CHAP); secure and closed only their
    // ACL's, and closed has none.
    for iqn in [open, mutual] {
        d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    }
    for iqn in [secure, closed] {
        d.ok(&["target", "create", iqn]);
    }
    for iqn in [open, secure, mutual, closed] {
        d.ok(&["target", "lun", "add", iqn, "c/v"]);
    }
    // Configuration errors are clear and change nothing.
    let e = d.fails(&["target", "chap", "set", secure, "--user", "alice", "--secret", "short"]);
    assert!(e.contains("12 to 255"), "{e}");
    let e = d.fails(&["target", "acl", "add", secure, "not-an-iqn"]);
    assert!(e.contains("is not an iSCSI name"), "{e}");
    let e = d.fails(&["target", "acl", "add", "iqn.2026-11.io.tessera:nope", host_a]);
    assert!(e.contains("no target"), "{e}");
    let e = d.fails(&[
        "target",
        "chap",
        "set",
        mutual,
        "--user",
        "carol",
        "--secret",
        "carol-secret-1",
        "--mutual-user",
        "tgt",
        "--mutual-secret",
        "carol-secret-1",
    ]);
    assert!(e.contains("differ"), "{e}");

    d.ok(&["target", "acl", "add", secure, host_a]);
    let e = d.fails(&["target", "acl", "add", secure, host_a]);
    assert!(e.contains("already"), "{e}");
    d.ok(&[
        "target",
        "chap",
        "set",
        secure,
        "--user",
        "alice",
        "--secret",
        "alice-secret-1",
    ]);
    d.ok(&[
        "target",
        "chap",
        "set",
        mutual,
        "--user",
        "carol",
        "--secret",
        "carol-secret-1",
        "--mutual-user",
        "tgt",
        "--mutual-secret",
        "target-secret-9",
    ]);
    let shown = d.json(&["target", "show", secure]);
    assert_eq!(shown["acl"][0], host_a);
    assert_eq!(shown["chap"]["user"], "alice");
    assert!(
        !shown.to_string().contains("alice-secret-1"),
        "secrets are never shown: {shown}"
    );
    let human = d.ok(&["target", "show", mutual]);
    assert!(
        human.contains("mutual CHAP") && !human.contains("target-secret-9"),
        "{human}"
    );
    // The secrets are on disk, so only root reads the file.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.join("targets.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "targets.json mode {mode:o}");

    let check = |d: &Daemon| {
        let portal = d.iscsi_portal();
        let url = |cred: &str, iqn: &str| format!("iscsi://{cred}{portal}/{iqn}/0");
        let discover = |cred: &str, initiator: &str| {
            run(
                "iscsi-ls",
                &["-i", initiator, "--url", &url(cred, "").replace("//0", "")],
            )
        };
        let inq = |cred: &str, initiator: &str, iqn: &str| run("iscsi-inq", &["-i", initiator, &url(cred, iqn)]);

        // No credentials: only the open target is visible and reachable.
        let (success, seen) = discover("", host_a);
        assert!(success && seen.contains(open), "{seen}");
        assert!(!seen.contains(secure) && !seen.contains(mutual), "{seen}");
        assert!(inq("", host_a, open).0);
        // A target with no ACL, not opened to any initiator, admits nobody and hides.
        assert!(!seen.contains(closed), "{seen}");
        let (success, out) = inq("", host_a, closed);
        assert!(!success, "a target without an ACL admitted an initiator: {out}");
        let (success, out) = inq("", host_a, secure);
        assert!(!success, "login without CHAP succeeded: {out}");
        // Right secret, wrong initiator: outside the ACL.
        let (success, out) = inq("alice%alice-secret-1@", host_b, secure);
        assert!(!success, "initiator outside the ACL logged in: {out}");
        let (success, seen) = discover("alice%alice-secret-1@", host_b);
        assert!(!seen.contains(secure), "{success} {seen}");
        // Wrong secret: refused, in discovery too.
        let (success, out) = inq("alice%alice-secret-2@", host_a, secure);
        assert!(!success, "wrong secret logged in: {out}");
        let (success, seen) = discover("alice%alice-secret-2@", host_a);
        assert!(!success && !seen.contains(secure), "{seen}");
        // Right secret, right initiator.
        let (success, out) = inq("alice%alice-secret-1@", host_a, secure);
        assert!(success && out.contains("TESSERA"), "{out}");
        let (success, seen) = discover("alice%alice-secret-1@", host_a);
        assert!(
            success && seen.contains(secure) && seen.contains(open) && !seen.contains(mutual),
            "{seen}"
        );
        // Mutual CHAP: the initiator checks the target's answer too.
        let carol = "carol%carol-secret-1@";
        let good = [
            ("LIBISCSI_CHAP_TARGET_USERNAME", "tgt"),
            ("LIBISCSI_CHAP_TARGET_PASSWORD", "target-secret-9"),
        ];
        let (success, out) = run_env("iscsi-inq", &["-i", host_b, &url(carol, mutual)], &good);
        assert!(success && out.contains("TESSERA"), "{out}");
        let bad = [
            ("LIBISCSI_CHAP_TARGET_USERNAME", "tgt"),
            ("LIBISCSI_CHAP_TARGET_PASSWORD", "not-the-secret"),
        ];
        let (success, out) = run_env("iscsi-inq", &["-i", host_b, &url(carol, mutual)], &bad);
        assert!(!success, "a target with the wrong mutual secret was accepted: {out}");
        assert!(
            inq(carol, host_b, mutual).0,
            "one-way CHAP to a target with a mutual secret"
        );
    };
    check(&d);
    let logs = d.logs();
    assert!(
        !logs.contains("alice-secret") && !logs.contains("target-secret-9"),
        "a secret reached the log"
    );
    // The rules survive a restart.
    d.stop();
    let d = Daemon::start(&state);
    check(&d);

    // Clearing CHAP and the ACL leaves a target that admits nobody, until it is opened to
    // any initiator; and closed again.
    d.ok(&["target", "chap", "clear", secure]);
    d.ok(&["target", "acl", "remove", secure, host_a]);
    let e = d.fails(&["target", "acl", "remove", secure, host_a]);
    assert!(e.contains("not in the ACL"), "{e}");
    let portal = d.iscsi_portal();
    let login = |iqn: &str| run("iscsi-inq", &["-i", host_b, &format!("iscsi://{portal}/{iqn}/0")]);
    assert!(!login(secure).0, "an emptied ACL admits nobody");
    assert!(d.ok(&["target", "show", secure]).contains("no initiator"));
    d.ok(&["target", "acl", "allow-any", secure]);
    let (success, out) = login(secure);
    assert!(success, "{out}");
    assert_eq!(d.json(&["target", "show", secure])["allow_any_initiator"], true);
    d.ok(&["target", "acl", "allow-any", secure, "--off"]);
    assert!(!login(secure).0);
}

/// Hosts of one target with a shared CHAP secret can each log in under the other's name (and
/// so reinstate its sessions and take its reservations over); an initiator given credentials
/// of its own logs in with those alone, in discovery too, and the others go on with the
/// target's. Kept across a restart; cleared, the target's credentials serve it again.
#[test]
fn an_initiator_with_its_own_chap_secret_cannot_be_impersonated() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    create_pool(&d, "c", &disks(&t.path().join("disks"), 1, 1 << 30));
    d.ok(&["vdisk", "create", "c/v", "--size", "64M", "--layout", "simple"]);
    let iqn = "iqn.2026-11.io.tessera:cluster";
    let (host_a, host_b) = ("iqn.2026-11.io.example:host-a", "iqn.2026-11.io.example:host-b");
    d.ok(&["target", "create", iqn]);
    d.ok(&["target", "lun", "add", iqn, "c/v"]);
    for h in [host_a, host_b] {
        d.ok(&["target", "acl", "add", iqn, h]);
    }
    let set = [
        "target",
        "chap",
        "set",
        iqn,
        "--user",
        "shared",
        "--secret",
        "shared-secret-1",
    ];
    d.ok(&set);
    let (shared, own) = ("shared%shared-secret-1@", "alice%alice-secret-1@");
    let inq = |d: &Daemon, cred: &str, initiator: &str| {
        let url = format!("iscsi://{cred}{}/{iqn}/0", d.iscsi_portal());
        run("iscsi-inq", &["-i", initiator, &url])
    };
    let discover = |d: &Daemon, cred: &str, initiator: &str| {
        let url = format!("iscsi://{cred}{}", d.iscsi_portal());
        run("iscsi-ls", &["-i", initiator, "--url", &url])
    };
    assert!(inq(&d, shared, host_a).0, "host B, as host A, with the shared secret");

    let e = d.fails(&[
        "target",
        "chap",
        "set",
        iqn,
        "--initiator",
        "not a name",
        "--user",
        "a",
        "--secret",
        "alice-secret-1",
    ]);
    assert!(e.contains("iSCSI name") || e.contains("iqn"), "{e}");
    d.ok(&[
        "target",
        "chap",
        "set",
        iqn,
        "--initiator",
        "IQN.2026-11.io.example:HOST-A",
        "--user",
        "alice",
        "--secret",
        "alice-secret-1",
    ]);
    let shown = d.json(&["target", "show", iqn]);
    assert_eq!(shown["initiator_chap"][host_a]["user"], "alice", "{shown}");
    assert!(
        !shown.to_string().contains("alice-secret-1"),
        "secrets are never shown: {shown}"
    );
    assert!(d
        .ok(&["target", "show", iqn])
        .contains("logs in with its own CHAP user alice"));
    let check = |d: &Daemon| {
        let (success, out) = inq(d, shared, host_a);
        assert!(!success, "host A's name with the shared secret logged in: {out}");
        let (_, seen) = discover(d, shared, host_a);
        assert!(!seen.contains(iqn), "{seen}");
        let (success, out) = inq(d, own, host_a);
        assert!(success, "{out}");
        let (success, seen) = discover(d, own, host_a);
        assert!(success && seen.contains(iqn), "{seen}");
        assert!(!inq(d, own, host_b).0, "host A's credentials under host B's name");
        assert!(inq(d, shared, host_b).0, "host B with the target's secret");
        assert!(!inq(d, "", host_a).0, "host A without CHAP");
    };
    check(&d);
    d.stop();
    d = Daemon::start(&state);
    check(&d);
    d.ok(&["target", "chap", "clear", iqn, "--initiator", host_a]);
    assert!(inq(&d, shared, host_a).0);
    let e = d.fails(&["target", "chap", "clear", iqn, "--initiator", host_a]);
    assert!(e.contains("no CHAP secret of its own"), "{e}");
}

/// A session of `initiator` (ISID ending in `n`) to target `iqn`, past the unit attention its
/// first command may find (the LUN's power on).
async fn logged_in(portal: String, initiator: &str, iqn: &str, n: u8) -> tessera_iscsi::initiator::Session {
    let mut c = tessera_iscsi::initiator::LoginConfig::new(initiator, Some(iqn));
    c.isid[5] = n;
    let s = tessera_iscsi::initiator::Session::login(&portal, &c).await.unwrap();
    if s.command(0, &[0u8; 6], Vec::new(), 0).await.unwrap().status != 0 {
        assert_eq!(s.command(0, &[0u8; 6], Vec::new(), 0).await.unwrap().status, 0);
    }
    s
}

/// POPULATE TOKEN over LUN 0's first 8 blocks, then the token.
async fn rod_token(s: &tessera_iscsi::initiator::Session, list_id: u32) -> Vec<u8> {
    use tessera_test_support::cdbs;
    let (c, p) = cdbs::populate_token(list_id, 60, &[(0, 8)]);
    assert_eq!(s.command(0, &c, p, 0).await.unwrap().status, 0);
    let info = s
        .command(0, &cdbs::receive_rod_token_information(list_id), Vec::new(), 4096)
        .await
        .unwrap();
    cdbs::token_of(&info.data)
}

/// Taking a host out of a target's ACL takes its access at once: its sessions to that
/// target end, and the ROD tokens it made on the target's LUNs (through those sessions or
/// one that ended before) can no longer be written anywhere; its sessions to other targets,
/// and the tokens it made on their LUNs, are kept.
#[test]
fn taking_a_host_out_of_the_acl_ends_its_sessions_and_their_tokens() {
    use tessera_iscsi::initiator::{LoginConfig, Session};
    use tessera_test_support::cdbs;
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let d = Daemon::start(&state);
    create_pool(&d, "c", &disks(&t.path().join("disks"), 1, 1 << 30));
    d.ok(&["vdisk", "create", "c/v", "--size", "64M", "--layout", "simple"]);
    d.ok(&["vdisk", "create", "c/w", "--size", "64M", "--layout", "simple"]);
    let (open, secure) = ("iqn.2026-11.io.tessera:open", "iqn.2026-11.io.tessera:secure");
    let (host_a, host_b) = ("iqn.2026-11.io.example:host-a", "iqn.2026-11.io.example:host-b");
    d.ok(&["target", "create", open, "--allow-any-initiator"]);
    d.ok(&["target", "create", secure]);
    d.ok(&["target", "acl", "add", secure, host_a]);
    // Each its own LUN: a LUN host A still reaches through another target keeps its tokens.
    d.ok(&["target", "lun", "add", secure, "c/v"]);
    d.ok(&["target", "lun", "add", open, "c/w"]);
    let portal = d.iscsi_portal();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let a_secure = logged_in(portal.clone(), host_a, secure, 1).await;
        let a_open = logged_in(portal.clone(), host_a, open, 2).await;
        let b_open = logged_in(portal.clone(), host_b, open, 3).await;
        async fn write_with(s: &Session, tok: &[u8], list_id: u32) -> tessera_iscsi::initiator::ScsiResult {
            let (c, p) = cdbs::write_using_token(list_id, tok, 0, false, &[(1024, 8)]);
            s.command(0, &c, p, 0).await.unwrap()
        }
        let by_a_secure = rod_token(&a_secure, 1).await;
        let by_a_open = rod_token(&a_open, 2).await;
        // Through a session of its own that ended before its access did.
        let earlier = logged_in(portal.clone(), host_a, secure, 4).await;
        let by_a_earlier = rod_token(&earlier, 3).await;
        earlier.logout().await.unwrap();
        assert_eq!(
            write_with(&a_open, &by_a_secure, 10).await.status,
            0,
            "a token works before (written by a host that may read its source)"
        );

        d.ok(&["target", "acl", "remove", secure, host_a]);
        let after = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            a_secure.command(0, &[0u8; 6], Vec::new(), 0),
        )
        .await;
        assert!(matches!(after, Ok(Err(_))), "host A's session goes on: {after:?}");
        for (tok, list_id) in [(&by_a_secure, 11), (&by_a_earlier, 13)] {
            let refused = write_with(&b_open, tok, list_id).await;
            assert_eq!(refused.status, 2, "a token host A made on the target was written");
            assert_eq!(
                (refused.sense[2] & 0x0F, refused.sense[12], refused.sense[13]),
                (5, 0x23, 0x06),
                "refused as revoked"
            );
        }
        assert_eq!(a_open.command(0, &[0u8; 6], Vec::new(), 0).await.unwrap().status, 0);
        assert_eq!(
            write_with(&b_open, &by_a_open, 12).await.status,
            0,
            "host A's other token works"
        );
        assert!(Session::login(&portal, &LoginConfig::new(host_a, Some(secure)))
            .await
            .is_err());
    });
    let logs = d.logs();
    assert!(logs.contains("the ACL no longer admits the initiator"), "{logs}");
}

/// A ROD token is written only by a host that may read the LUN it was made on, through any
/// target: its 512 bytes, seen on the wire or passed on, do not carry one tenant's data to
/// another tenant's LUN. Once the host is let in to that LUN, the same token works.
#[test]
fn a_token_is_written_only_by_a_host_that_may_read_its_source() {
    use tessera_test_support::cdbs;
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "c", &disks(&t.path().join("disks"), 1, 1 << 30));
    d.ok(&["vdisk", "create", "c/v", "--size", "64M", "--layout", "simple"]);
    d.ok(&["vdisk", "create", "c/w", "--size", "64M", "--layout", "simple"]);
    let (tenant_a, tenant_b) = ("iqn.2026-11.io.tessera:tenant-a", "iqn.2026-11.io.tessera:tenant-b");
    let (host_a, host_b) = ("iqn.2026-11.io.example:host-a", "iqn.2026-11.io.example:host-b");
    d.ok(&["target", "create", tenant_a]);
    d.ok(&["target", "acl", "add", tenant_a, host_a]);
    d.ok(&["target", "lun", "add", tenant_a, "c/v"]);
    d.ok(&["target", "create", tenant_b]);
    d.ok(&["target", "acl", "add", tenant_b, host_b]);
    d.ok(&["target", "lun", "add", tenant_b, "c/w"]);
    let portal = d.iscsi_portal();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let a = logged_in(portal.clone(), host_a, tenant_a, 1).await;
        let b = logged_in(portal.clone(), host_b, tenant_b, 2).await;
        let token = rod_token(&a, 1).await;
        let (c, p) = cdbs::write_using_token(10, &token, 0, false, &[(1024, 8)]);
        let refused = b.command(0, &c, p, 0).await.unwrap();
        assert_eq!(refused.status, 2, "host B wrote tenant A's data into its LUN");
        assert_eq!(
            (refused.sense[2] & 0x0F, refused.sense[12], refused.sense[13]),
            (5, 0x23, 0x00),
            "INVALID TOKEN OPERATION, cause not reportable"
        );
        d.ok(&["target", "acl", "add", tenant_a, host_b]);
        let (c, p) = cdbs::write_using_token(11, &token, 0, false, &[(1024, 8)]);
        assert_eq!(
            b.command(0, &c, p, 0).await.unwrap().status,
            0,
            "host B may read the source now"
        );
    });
}

/// A LUN taken out of a target, or the target deleted, ends the ROD tokens made on that LUN
/// by hosts that no other target lets reach it: what a host populated while it had access is
/// not written anywhere after it lost it.
#[test]
fn taking_a_lun_out_or_deleting_its_target_ends_the_tokens_made_on_it() {
    use tessera_iscsi::initiator::ScsiResult;
    use tessera_test_support::cdbs;
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "c", &disks(&t.path().join("disks"), 1, 1 << 30));
    d.ok(&["vdisk", "create", "c/v", "--size", "64M", "--layout", "simple"]);
    d.ok(&["vdisk", "create", "c/w", "--size", "64M", "--layout", "simple"]);
    let (src, dst) = ("iqn.2026-11.io.tessera:src", "iqn.2026-11.io.tessera:dst");
    let (host_a, host_b) = ("iqn.2026-11.io.example:host-a", "iqn.2026-11.io.example:host-b");
    for iqn in [src, dst] {
        d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    }
    d.ok(&["target", "lun", "add", src, "c/v"]);
    d.ok(&["target", "lun", "add", dst, "c/w"]);
    let portal = d.iscsi_portal();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let b = logged_in(portal.clone(), host_b, dst, 9).await;
        let write_with = |tok: Vec<u8>, list_id: u32| {
            let b = &b;
            async move {
                let (c, p) = cdbs::write_using_token(list_id, &tok, 0, false, &[(1024, 8)]);
                b.command(0, &c, p, 0).await.unwrap()
            }
        };
        let revoked = |r: &ScsiResult, what: &str| {
            assert_eq!(r.status, 2, "{what}: the token was written");
            assert_eq!((r.sense[2] & 0x0F, r.sense[12], r.sense[13]), (5, 0x23, 0x06), "{what}");
        };
        let a = logged_in(portal.clone(), host_a, src, 1).await;
        let first = rod_token(&a, 1).await;
        assert_eq!(write_with(first.clone(), 10).await.status, 0, "a token works before");
        d.ok(&["target", "lun", "remove", src, "0"]);
        revoked(&write_with(first, 11).await, "the LUN taken out");

        d.ok(&["target", "lun", "add", src, "c/v"]);
        let a = logged_in(portal.clone(), host_a, src, 2).await;
        let second = rod_token(&a, 2).await;
        assert_eq!(write_with(second.clone(), 12).await.status, 0);
        d.ok(&["target", "delete", src]);
        revoked(&write_with(second, 13).await, "the target deleted");
    });
}

/// A vdisk two targets present: a host that reserved it (SPC-2 RESERVE) through one target
/// whose LUN is then taken out can no longer release it; the reservation ends with its
/// access, and the hosts of the other target are not refused for ever.
#[test]
fn a_reservation_held_through_a_lun_taken_out_ends_with_it() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "c", &disks(&t.path().join("disks"), 1, 1 << 30));
    d.ok(&["vdisk", "create", "c/v", "--size", "64M", "--layout", "simple"]);
    let (one, other) = ("iqn.2026-11.io.tessera:one", "iqn.2026-11.io.tessera:other");
    for iqn in [one, other] {
        d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
        d.ok(&["target", "lun", "add", iqn, "c/v"]);
    }
    let portal = d.iscsi_portal();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let a = logged_in(portal.clone(), "iqn.2026-11.io.example:host-a", one, 1).await;
        let b = logged_in(portal.clone(), "iqn.2026-11.io.example:host-b", other, 2).await;
        let reserve = [0x16u8, 0, 0, 0, 0, 0];
        let mut write10 = [0u8; 10];
        write10[0] = 0x2A;
        write10[8] = 1;
        assert_eq!(a.command(0, &reserve, Vec::new(), 0).await.unwrap().status, 0);
        let refused = b.command(0, &write10, vec![0u8; 512], 0).await.unwrap();
        assert_eq!(refused.status, 0x18, "the reservation holds");
        d.ok(&["target", "lun", "remove", one, "0"]);
        assert_eq!(b.command(0, &write10, vec![0u8; 512], 0).await.unwrap().status, 0);
        assert_eq!(b.command(0, &reserve, Vec::new(), 0).await.unwrap().status, 0);
    });
}

#[test]
fn persistent_reservations_with_aptpl_survive_a_restart() {
    use tessera_iscsi::initiator::{LoginConfig, Session};
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    create_pool(&d, "r", &disks(&t.path().join("disks"), 2, 1 << 30));
    d.ok(&["vdisk", "create", "r/quorum", "--size", "64M", "--layout", "mirror"]);
    let iqn = "iqn.2026-11.io.tessera:cluster";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "r/quorum"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let node = |n: u8| {
        let mut c = LoginConfig::new(&format!("iqn.2026-11.io.example:node{n}"), Some(iqn));
        c.isid[5] = n;
        c
    };
    // Each command in a session of its own, as a cluster node's occasional check would be.
    // A node's session after its last one ended starts with I_T NEXUS LOSS OCCURRED, which
    // an initiator clears with TEST UNIT READY before it goes on.
    let tur = vec![0u8; 6];
    let run = |portal: &str, c: &LoginConfig, cdb: Vec<u8>, data: Vec<u8>, read: usize| {
        rt.block_on(async {
            let s = Session::login(portal, c).await.unwrap();
            let first = s.command(0, &tur, Vec::new(), 0).await.unwrap();
            if first.status != 0 {
                assert_eq!((first.status, first.sense[12], first.sense[13]), (2, 0x29, 0x07));
                assert_eq!(s.command(0, &tur, Vec::new(), 0).await.unwrap().status, 0);
            }
            let r = s.command(0, &cdb, data, read).await.unwrap();
            s.logout().await.unwrap();
            (r, first.status != 0)
        })
    };
    let read_keys = vec![0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let read_reservation = vec![0x5E, 1, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let write1 = vec![0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let reservations_dir = state.join("reservations");

    // Node 1 registers with APTPL and takes WRITE EXCLUSIVE - REGISTRANTS ONLY, as a
    // failover cluster's quorum disk would be held.
    let portal = d.iscsi_portal();
    let (cdb, p) = pr_out(6, 0, 0, 0x1111, true);
    let (r, told) = run(&portal, &node(1), cdb, p, 0);
    assert_eq!((r.status, told), (0, false), "a port's first session");
    let (cdb, p) = pr_out(1, 5, 0x1111, 0, false);
    let (r, told) = run(&portal, &node(1), cdb, p, 0);
    assert_eq!(
        (r.status, told),
        (0, true),
        "the port's next session is told of the loss"
    );
    assert_eq!(std::fs::read_dir(&reservations_dir).unwrap().count(), 1);

    // A crash and a restart: the registration and the reservation are still there.
    d.kill9();
    // But not a saved state no host could have made (a name past iSCSI's 223 bytes, which
    // READ FULL STATUS would cut at 65,535): the LUN is not presented rather than with it.
    let saved = std::fs::read_dir(&reservations_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let good = std::fs::read_to_string(&saved).unwrap();
    let node1 = "iqn.2026-11.io.example:node1";
    let bad = good.replace(node1, &format!("{node1}{}", "n".repeat(70_000)));
    assert_ne!(bad, good);
    std::fs::write(&saved, bad).unwrap();
    let mut d = Daemon::start(&state);
    let shown = d.json(&["target", "show", iqn]);
    assert_eq!(shown["luns"][0]["online"], false, "{shown}");
    assert!(d.logs().contains("which is no iSCSI name"), "{}", d.logs());
    d.stop();
    std::fs::write(&saved, good).unwrap();
    let mut d = Daemon::start(&state);
    let portal = d.iscsi_portal();
    let (keys, _) = run(&portal, &node(2), read_keys.clone(), Vec::new(), 4096);
    assert_eq!(&keys.data[4..8], &8u32.to_be_bytes(), "{:?}", keys.data);
    assert_eq!(&keys.data[8..16], &0x1111u64.to_be_bytes());
    let (res, _) = run(&portal, &node(2), read_reservation.clone(), Vec::new(), 4096);
    assert_eq!(res.data[21], 5, "reservation type after restart");
    // The administrator sees who holds it.
    let shown = d.json(&["target", "show", iqn]);
    let r = &shown["luns"][0]["reservations"];
    assert_eq!(r["holder"], "iqn.2026-11.io.example:node1,i,0x800054530001", "{shown}");
    assert_eq!(r["kind"], "write exclusive, registrants only");
    assert_eq!(r["aptpl"], true);
    assert_eq!(r["registered"].as_array().unwrap().len(), 1);
    assert!(d
        .ok(&["target", "show", iqn])
        .contains("reserved by iqn.2026-11.io.example:node1"));
    assert_eq!(run(&portal, &node(2), write1.clone(), vec![0; 512], 0).0.status, 0x18);
    assert_eq!(
        run(&portal, &node(1), write1.clone(), vec![0; 512], 0).0.status,
        0,
        "the holder writes"
    );

    // A REGISTER with APTPL=0 stops persisting: after the next restart nothing is left.
    let (cdb, p) = pr_out(0, 0, 0x1111, 0x2222, false);
    assert_eq!(run(&portal, &node(1), cdb, p, 0).0.status, 0);
    assert_eq!(std::fs::read_dir(&reservations_dir).unwrap().count(), 0);
    d.stop();
    let d = Daemon::start(&state);
    let (keys, _) = run(&d.iscsi_portal(), &node(2), read_keys, Vec::new(), 4096);
    assert_eq!(&keys.data[4..8], &0u32.to_be_bytes());
    assert_eq!(run(&d.iscsi_portal(), &node(2), write1, vec![0; 512], 0).0.status, 0);
}

#[test]
fn libiscsi_conformance_suite() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "c", &disks(&t.path().join("disks"), 4, 2 << 30));
    // 512n: libiscsi's GetLBAStatus.UnmapSingle assumes one logical block per physical
    // block (see the 512e run at the end).
    d.ok(&[
        "vdisk",
        "create",
        "c/conf",
        "--size",
        "1G",
        "--layout",
        "mirror",
        "--physical-block-size",
        "512",
    ]);
    let iqn = "iqn.2026-11.io.tessera:conformance";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "c/conf"]);
    let url = format!("iscsi://{}/{iqn}/0", d.iscsi_portal());
    let out = cunit::run_suite(&url);
    let failed = cunit::failures(&out);
    let ran = cunit::tests_ran(&out);
    eprintln!("libiscsi: {ran} tests ran; failed: {failed:?}");
    // TESSERA_CONFORMANCE_LOG=FILE keeps the suite's whole output for reading.
    if let Ok(path) = std::env::var("TESSERA_CONFORMANCE_LOG") {
        std::fs::write(path, &out).unwrap();
    }
    assert!(ran >= 200, "the suite did not run ({ran} tests):\n{out}");
    // Commands the suite found missing: only those of later work or exempt may be.
    let missing = cunit::not_implemented(&out);
    let allowed = [
        "WRITEATOMIC16", // exempt
    ];
    let unexpected: Vec<&&str> = missing.iter().filter(|m| !allowed.contains(m)).collect();
    assert!(
        unexpected.is_empty(),
        "the suite skipped {unexpected:?} as not implemented:\n{out}"
    );
    // Third-party copy: every test of the two suites ran, none skipped.
    for t in [
        "ExtendedCopy.Simple",
        "ExtendedCopy.ParamHdr",
        "ExtendedCopy.DescrLimits",
        "ExtendedCopy.DescrType",
        "ExtendedCopy.ValidTgtDescr",
        "ExtendedCopy.ValidSegDescr",
        "ReceiveCopyResults.CopyStatus",
        "ReceiveCopyResults.OpParams",
    ] {
        let (suite, name) = t.split_once('.').unwrap();
        let ran = out
            .split(&format!("Suite: {suite}"))
            .nth(1)
            .is_some_and(|rest| rest.contains(&format!("Test: {name} ...")));
        assert!(ran, "{t} did not run:\n{out}");
    }
    let skipped_copy: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("[SKIPPED]") && (l.contains("COPY") || l.contains("COPYRESULT")))
        .collect();
    assert!(skipped_copy.is_empty(), "copy tests skipped: {skipped_copy:?}");
    let unexpected: Vec<&String> = failed
        .iter()
        .filter(|f| !KNOWN_FAILURES.iter().any(|(k, _)| k == f))
        .collect();
    assert!(unexpected.is_empty(), "new conformance failures {unexpected:?}:\n{out}");
    for (k, why) in KNOWN_FAILURES {
        // A known failure that never ran means the tool stopped early, not that it passes.
        let tail: Vec<&str> = out
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        assert!(
            out.lines().any(|l| l.trim_start().starts_with(&format!("Test: {k} "))),
            "the suite stopped before {k} ({ran} tests ran); its output ended with:\n{}",
            tail.join("\n")
        );
        assert!(
            failed.iter().any(|f| f == k),
            "{k} passes now ({why} no longer holds): remove it from KNOWN_FAILURES"
        );
    }
    // The suites that depend on the physical block size, on the other two formats. On 4Kn
    // (one logical block per physical block again) they pass.
    let thin_suites = "SCSI.GetLBAStatus,SCSI.Unmap,SCSI.WriteSame10,SCSI.WriteSame16";
    // Under 65536 blocks: WriteSame16.Unmap writes and reads 65536 blocks in one command when
    // the LUN has that many, 256 MiB at 4 KiB, past the maximum transfer length of the block
    // limits page, which the target then refuses (INVALID FIELD IN CDB).
    d.ok(&[
        "vdisk",
        "create",
        "c/conf4k",
        "--size",
        "128M",
        "--layout",
        "mirror",
        "--block-size",
        "4096",
    ]);
    d.ok(&["target", "lun", "add", iqn, "c/conf4k", "--lun", "1"]);
    let url4k = format!("iscsi://{}/{iqn}/1", d.iscsi_portal());
    let (_, out) = run(
        "iscsi-test-cu",
        &[&format!("--test={thin_suites}"), "--dataloss", &url4k],
    );
    assert!(
        out.contains("Test: UnmapSingle ...passed") && cunit::failures(&out).is_empty(),
        "thin provisioning suites on 4Kn:\n{out}"
    );
    // On 512e (the default: eight logical blocks per physical block) the only failure is
    // libiscsi's: UnmapSingle's second half asks GET LBA STATUS about LBA i+1 and expects the
    // first descriptor to start at i+8, where SBC-4 has it start at the LBA asked about.
    d.ok(&["vdisk", "create", "c/conf512e", "--size", "256M", "--layout", "mirror"]);
    d.ok(&["target", "lun", "add", iqn, "c/conf512e", "--lun", "2"]);
    let url512e = format!("iscsi://{}/{iqn}/2", d.iscsi_portal());
    let (_, out) = run(
        "iscsi-test-cu",
        &[&format!("--test={thin_suites}"), "--dataloss", &url512e],
    );
    assert_eq!(
        cunit::failures(&out),
        ["UnmapSingle"],
        "thin provisioning suites on 512e:\n{out}"
    );
    assert!(
        out.contains("lba offset in first descriptor"),
        "UnmapSingle on 512e failed for another reason:\n{out}"
    );
    assert!(d.json(&["pool", "check", "c"])["problems"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// An over-committed thin pool: once its allocation passes the threshold, every nexus of its
/// LUNs hears THIN PROVISIONING SOFT THRESHOLD REACHED once, and the pool carries a warning.
#[test]
fn a_thin_pool_past_its_threshold_tells_the_initiators_and_the_administrator() {
    use tessera_iscsi::initiator::{LoginConfig, Session};
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let cfg = t.path().join("tessera.toml");
    std::fs::write(&cfg, "thin_threshold_percent = 50\n").unwrap();
    let d = Daemon::start_with(&state, &["--config", cfg.to_str().unwrap(), "--api-listen", "none"]).unwrap();
    // 2 × 512 MiB of disks under a 2 GiB thin mirror: promised four times over.
    create_pool(&d, "thin", &disks(&t.path().join("disks"), 2, 512 << 20));
    d.ok(&["vdisk", "create", "thin/big", "--size", "2G", "--layout", "mirror"]);
    let iqn = "iqn.2026-11.io.tessera:thin";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "thin/big"]);
    let portal = d.iscsi_portal();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = rt
        .block_on(Session::login(
            &portal,
            &LoginConfig::new("iqn.2026-11.io.example:host", Some(iqn)),
        ))
        .unwrap();
    let tur = vec![0u8; 6];
    assert_eq!(rt.block_on(s.command(0, &tur, Vec::new(), 0)).unwrap().status, 0);
    assert!(arr_is_empty(&d.json(&["pool", "show", "thin"])["warnings"]));
    // Fill 320 MiB of the vdisk (640 MiB of the pool's 1 GiB with two copies).
    let img = t.path().join("fill.img");
    random_image(&img, 320 << 20, 9);
    d.ok(&["vdisk", "import", "thin/big", img.to_str().unwrap()]);
    let mut heard = None;
    for _ in 0..100 {
        let r = rt.block_on(s.command(0, &tur, Vec::new(), 0)).unwrap();
        if r.status != 0 {
            heard = Some((r.status, r.sense[2] & 0x0F, r.sense[12], r.sense[13]));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        heard,
        Some((2, 6, 0x38, 0x07)),
        "THIN PROVISIONING SOFT THRESHOLD REACHED"
    );
    // Once per crossing.
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(rt.block_on(s.command(0, &tur, Vec::new(), 0)).unwrap().status, 0);
    let p = d.json(&["pool", "show", "thin"]);
    assert!(p["warnings"][0].as_str().unwrap_or("").contains("threshold"), "{p}");
    assert!(d.ok(&["pool", "list"]).contains("warning"));
    assert!(d.logs().contains("thin provisioning threshold"));
}

fn arr_is_empty(v: &serde_json::Value) -> bool {
    v.as_array().is_none_or(|a| a.is_empty())
}
