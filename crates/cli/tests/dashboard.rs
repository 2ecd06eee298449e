//! The dashboard in a real browser: headless Chromium driven over WebDriver (Debian
//! `chromium` and `chromium-driver`). Logs in with the token, creates a pool and a vdisk
//! through the wizards and presents it over iSCSI, checks that with the CLI and `iscsi-inq`,
//! fails a disk and sees the pool turn degraded, repairs it and sees the repair finish. Every
//! page and route refuses without the token. With TESSERA_SCREENSHOTS=DIR, the main pages'
//! screenshots are written there (docs/dashboard/ holds the ones the docs show).

mod common;

use std::time::Duration;

use common::browser::Browser;
use common::*;

const TOKEN: &str = "dashboard-token-0123456789abcdef";

#[test]
fn the_dashboard_makes_a_pool_and_a_vdisk_presents_it_and_watches_a_failure_and_its_repair() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let d = Daemon::start_on_tcp(&state, "scrub_interval = \"off\"\nauto_repair = false\n", TOKEN);
    let api = banner_addr(&d, "dashboard:");
    let shots = match std::env::var_os("TESSERA_SCREENSHOTS") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => t.path().join("screenshots"),
    };
    std::fs::create_dir_all(&shots).unwrap();

    // Without the token: the page is the login form (401), everything else refuses.
    let r = http_tcp(&api, "GET", "/", None, &[]).unwrap();
    assert_eq!(r.status, 401);
    assert!(
        r.body.contains("name=\"token\"") && !r.body.contains("app.js"),
        "{}",
        r.body
    );
    for path in [
        "/ui/app.js",
        "/ui/app.css",
        "/api/pools",
        "/api/stats/io",
        "/api/events",
        "/metrics",
    ] {
        let r = http_tcp(&api, "GET", path, None, &[]).unwrap();
        assert_eq!(r.status, 401, "{path}: {}", r.body);
    }
    let r = http_tcp(&api, "GET", "/", None, &[("Cookie", "tessera_session=forged")]).unwrap();
    assert_eq!(r.status, 401, "a made-up session");
    let r = http_tcp(&api, "POST", "/ui/login", Some("token=wrong-token-0123456789"), &[]).unwrap();
    assert_eq!(r.status, 401);
    assert!(r.body.contains("not the API token"));

    let b = Browser::start();
    b.go(&format!("http://{api}/"));
    b.find("#token");
    b.screenshot("login", &shots);
    b.type_in("#token", TOKEN);
    b.click("#login");
    b.find("#health");
    // The session's cookie alone, as a page on another port of this host would receive it,
    // shows the pages but not the API: that wants the key only the page that logged in has.
    let cookies = b.cmd("GET", "/cookie", None);
    let session = cookies
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tessera_session")
        .map(|c| c["value"].as_str().unwrap().to_string())
        .expect("a session cookie");
    let cookie = format!("tessera_session={session}");
    assert_eq!(
        http_tcp(&api, "GET", "/", None, &[("Cookie", &cookie)]).unwrap().status,
        200
    );
    for path in ["/api/pools", "/api/events/stream?after=0"] {
        let r = http_tcp(&api, "GET", path, None, &[("Cookie", &cookie)]).unwrap();
        assert_eq!(r.status, 401, "{path} with the cookie alone: {}", r.body);
    }
    let key = b.script("return localStorage.getItem('tessera-key')");
    let key = key.as_str().expect("the page keeps its session key");
    assert!(
        !b.script("return location.href").as_str().unwrap().contains(key),
        "the key stays in the address"
    );
    let r = http_tcp(
        &api,
        "GET",
        "/api/pools",
        None,
        &[("Cookie", &cookie), ("x-tessera-key", key)],
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);

    // A pool through the wizard, on file disks made here.
    let paths = disks(&t.path().join("disks"), 3, 1 << 30);
    b.go(&format!("http://{api}/#pools"));
    b.click("#create-pool");
    b.type_in("#pool-name", "web");
    b.type_in("#pool-disks", &paths.join("\n"));
    b.click("#wizard-submit");
    b.wait_text("#pool-web", "healthy", 20);
    assert_eq!(d.json(&["pool", "show", "web"])["disks"], 3);
    // Its integrity checks: none run yet, then a metadata scan from the page.
    b.wait_text("#integrity-web", "never scrubbed; never scanned", 20);
    b.click("#scan-web");
    b.wait_text("#integrity-web", "0 finding(s), 0 open", 30);

    // A vdisk through the wizard, fully provisioned (its slabs are on the disks from the
    // start), presented over iSCSI to one initiator.
    let iqn = "iqn.2026-11.io.tessera:web";
    let host = "iqn.2026-11.io.tessera:host";
    b.go(&format!("http://{api}/#vdisks"));
    b.click("#create-vdisk");
    b.select("#vdisk-pool", "web");
    b.type_in("#vdisk-name", "vol");
    b.type_in("#vdisk-size", "256");
    b.select("#vdisk-unit", "MiB");
    b.select("#vdisk-layout", "mirror");
    b.select("#vdisk-provisioning", "fixed");
    b.select("#vdisk-present", "iscsi");
    b.type_in("#vdisk-iqn", iqn);
    b.type_in("#vdisk-initiator", host);
    b.click("#wizard-submit");
    b.wait_text("tr[data-vdisk='web/vol'] .presented", &format!("iSCSI {iqn} LUN 0"), 20);

    // What the wizard made, seen by the CLI and by an initiator nobody here wrote.
    let v = d.json(&["vdisk", "show", "web/vol"]);
    assert_eq!(v["size"], 256u64 << 20);
    assert_eq!(v["provisioning"], "fixed");
    let target = d.json(&["target", "show", iqn]);
    assert_eq!(target["luns"][0]["vdisk"], "web/vol");
    assert_eq!(target["acl"][0], host);
    let url = format!("iscsi://{}/{iqn}/0", d.iscsi_portal());
    let inq = ok("iscsi-inq", &["-i", host, &url]);
    assert!(inq.contains("TESSERA"), "{inq}");
    // Some I/O for the charts: two samples 5 s apart make a point.
    let mut args = vec!["--image-opts".to_string()];
    for k in 0..32 {
        args.extend(["-c".into(), format!("write -P 0x5a {} 64k", k * 65536)]);
    }
    let (portal_host, portal_port) = d
        .iscsi_portal()
        .rsplit_once(':')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .unwrap();
    args.push(format!(
        "driver=iscsi,transport=tcp,portal={portal_host}:{portal_port},target={iqn},lun=0,initiator-name={host}"
    ));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for _ in 0..2 {
        ok("qemu-io", &args);
        std::thread::sleep(Duration::from_secs(6));
    }

    // Fail the disk holding the most, from its row; the pool turns degraded on the page.
    let victim = busiest_disk(&d, "web");
    b.go(&format!("http://{api}/#pools"));
    b.click(&format!("tr[data-disk='{victim}'] .fail-disk"));
    b.click("#wizard-submit");
    b.wait_text("#pool-web .pool-health", "degraded", 20);
    b.wait_text(&format!("tr[data-disk='{victim}']"), "failed", 20);
    b.screenshot("pools-degraded", &shots);
    assert_eq!(d.json(&["pool", "show", "web"])["health"], "degraded");

    // Repair from the page; the job finishes on the jobs page, the pool is healthy again.
    b.click("#repair-web");
    b.go(&format!("http://{api}/#jobs"));
    b.wait_text("tr[data-kind='repair']", "succeeded", 60);
    b.screenshot("jobs", &shots);
    b.go(&format!("http://{api}/#pools"));
    b.wait_text("#pool-web .pool-health", "healthy", 20);

    // The other pages, as an administrator sees them.
    b.go(&format!("http://{api}/#events"));
    b.wait_text("#event-list", "disk.failed", 20);
    b.wait_text("#event-list", "pool.degraded", 20);
    b.wait_text("#event-list", "repair.finished", 20);
    b.screenshot("events", &shots);
    b.go(&format!("http://{api}/#vdisks"));
    b.click("tr[data-vdisk='web/vol'] button:nth-child(2)");
    b.find("#vdisk-chart polyline");
    b.screenshot("vdisks", &shots);
    b.go(&format!("http://{api}/#targets"));
    b.wait_text("main", iqn, 20);
    b.screenshot("targets", &shots);
    b.go(&format!("http://{api}/#overview"));
    b.wait_text("#pool-table", "healthy", 20);
    b.find("svg.chart polyline");
    b.screenshot("overview", &shots);

    // A snapshot through its dialog.
    b.go(&format!("http://{api}/#vdisks"));
    b.click("tr[data-vdisk='web/vol'] button:nth-child(1)");
    b.type_in("#snapshot-name", "before-upgrade");
    b.click("#wizard-submit");
    b.wait_text("tr[data-vdisk='web/vol']", "1", 20);
    assert_eq!(d.json(&["snapshot", "list", "web/vol"])[0]["name"], "before-upgrade");

    // Log out: the page is the login form again.
    b.click("#logout");
    b.find("#token");
    let cookie = b.cmd("GET", "/cookie", None);
    assert!(
        cookie
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "tessera_session"),
        "{cookie}"
    );
}

/// The replication page: a source's replica with its state and link report, paused and
/// resumed from the page; at the replica site, the replica held for the peer, promoted from
/// the page after a confirmation.
#[test]
fn the_dashboard_shows_replicas_and_promotes_one() {
    let t = tempfile::tempdir().unwrap();
    let key = t.path().join("replication.psk");
    let cfg = format!(
        "replication_listen = \"127.0.0.1:0\"\nreplication_psk_file = \"{}\"\n",
        key.display()
    );
    let b_site = Daemon::start_on_tcp(&t.path().join("b"), &cfg, TOKEN);
    let a_site = Daemon::start_on_tcp(&t.path().join("a"), &cfg, TOKEN);
    create_pool(&a_site, "p", &disks(&t.path().join("da"), 3, 1 << 30));
    create_pool(&b_site, "q", &disks(&t.path().join("db"), 3, 1 << 30));
    a_site.ok(&["vdisk", "create", "p/db", "--size", "32M"]);
    let img = t.path().join("db.img");
    random_image(&img, 8 << 20, 7);
    a_site.ok(&["vdisk", "import", "p/db", img.to_str().unwrap()]);
    let listen = b_site.json(&["replica", "list"])["listen"]
        .as_str()
        .unwrap()
        .to_string();
    a_site.ok(&[
        "replica",
        "create",
        "p/db",
        "--to",
        &listen,
        "--target-pool",
        "q",
        "--name",
        "dr",
        "--interval",
        "0",
    ]);
    a_site.ok(&["replica", "sync", "dr"]);

    let shots = match std::env::var_os("TESSERA_SCREENSHOTS") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => t.path().join("screenshots"),
    };
    std::fs::create_dir_all(&shots).unwrap();
    let b = Browser::start();
    let login = |api: &str| {
        b.go(&format!("http://{api}/"));
        b.type_in("#token", TOKEN);
        b.click("#login");
        b.find("#health");
    };
    let a_api = banner_addr(&a_site, "dashboard:");
    login(&a_api);
    b.go(&format!("http://{a_api}/#replication"));
    b.wait_text("tr[data-replica='dr']", "repl-dr-1", 20);
    b.wait_text("tr[data-replica='dr']", "idle", 20);
    assert!(
        b.text("tr[data-replica='dr']").contains("RTT"),
        "{}",
        b.text("tr[data-replica='dr']")
    );
    b.screenshot("replication", &shots);
    b.click("tr[data-replica='dr'] .pause");
    b.wait_text("tr[data-replica='dr']", "paused", 20);
    assert_eq!(a_site.json(&["replica", "show", "dr"])["state"], "paused");
    b.click("tr[data-replica='dr'] .resume");
    b.wait_text("tr[data-replica='dr']", "idle", 20);

    let b_api = banner_addr(&b_site, "dashboard:");
    login(&b_api);
    b.go(&format!("http://{b_api}/#replication"));
    b.wait_text("tr[data-incoming='q/db']", "repl-dr-1", 20);
    b.screenshot("replication-held", &shots);
    b.click("tr[data-incoming='q/db'] .promote");
    b.click("#wizard-submit");
    b.wait_text("#notice", "q/db promoted at repl-dr-1", 20);
    assert!(b_site.json(&["replica", "list"])["incoming"]
        .as_array()
        .unwrap()
        .is_empty());
    b_site.ok(&["vdisk", "resize", "q/db", "--size", "64M"]);
}
