//! Prometheus metrics through the daemon: `GET /metrics` on the API listeners and on
//! `metrics_listen`, refused without the token, accepted by `promtool check metrics`, and
//! I/O counters and latency histograms that move by exactly what a client did.

mod common;

use common::*;

const TOKEN: &str = "metrics-token-0123456789abcdef";

fn scrape(addr: &str) -> String {
    let r = http_tcp(
        addr,
        "GET",
        "/metrics",
        None,
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

#[test]
fn metrics_count_what_a_client_did_pass_promtool_and_need_the_token() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let d = Daemon::start_on_tcp(
        &state,
        "metrics_listen = \"127.0.0.1:0\"\nscrub_interval = \"off\"\nauto_repair = false\n",
        TOKEN,
    );
    let api = banner_addr(&d, "management API:");
    let metrics = banner_addr(&d, "metrics:");
    create_pool(&d, "p", &disks(&t.path().join("disks"), 3, 256 << 20));
    d.ok(&["vdisk", "create", "p/m", "--size", "64M", "--layout", "mirror"]);
    d.ok(&["nbd", "export", "p/m"]);

    // Without the token, or with another, nothing: on the API listener and on the metrics one.
    for addr in [&api, &metrics] {
        let r = http_tcp(addr, "GET", "/metrics", None, &[]).unwrap();
        assert_eq!(r.status, 401, "{addr}: {}", r.body);
        let r = http_tcp(
            addr,
            "GET",
            "/metrics",
            None,
            &[("Authorization", "Bearer not-the-token-0123456789")],
        )
        .unwrap();
        assert_eq!(r.status, 401, "{addr}");
    }
    // The metrics listener serves nothing else.
    let r = http_tcp(
        &metrics,
        "GET",
        "/api/pools",
        None,
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    )
    .unwrap();
    assert_eq!(r.status, 404, "{}", r.body);
    // The scrape token the daemon made reads the metrics on either listener, and nothing else.
    let scraper = std::fs::read_to_string(state.join("metrics-token")).unwrap();
    let with_scraper = [("Authorization", format!("Bearer {}", scraper.trim()))];
    let with_scraper: Vec<(&str, &str)> = with_scraper.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for addr in [&api, &metrics] {
        let r = http_tcp(addr, "GET", "/metrics", None, &with_scraper).unwrap();
        assert_eq!(r.status, 200, "{addr}: {}", r.body);
    }
    for (method, path) in [("GET", "/api/pools"), ("GET", "/api/targets"), ("POST", "/api/pools")] {
        let r = http_tcp(&api, method, path, Some("{}"), &with_scraper).unwrap();
        assert_eq!(r.status, 401, "{method} {path} with the scrape token: {}", r.body);
    }

    let before = scrape(&metrics);
    promtool_accepts(&before);
    fn nbd(op: &str) -> [(&str, &str); 4] {
        [("protocol", "nbd"), ("pool", "p"), ("vdisk", "m"), ("op", op)]
    }
    assert_eq!(sample(&before, "tessera_io_operations_total", &nbd("write")), Some(0.0));

    // A client nobody here wrote: eight 4 KiB writes and three 4 KiB reads.
    let uri = format!("nbd://{}/m", d.nbd_address());
    let mut args = vec!["-f".to_string(), "raw".to_string()];
    for k in 0..8 {
        args.extend(["-c".into(), format!("write -P 0x{:02x} {} 4k", 0x20 + k, k * 8192)]);
    }
    for k in 0..3 {
        args.extend(["-c".into(), format!("read -P 0x{:02x} {} 4k", 0x20 + k, k * 8192)]);
    }
    args.push(uri);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok("qemu-io", &args);

    let after = scrape(&api);
    promtool_accepts(&after);
    let moved = |name: &str, op: &str| {
        sample(&after, name, &nbd(op)).unwrap_or(0.0) - sample(&before, name, &nbd(op)).unwrap_or(0.0)
    };
    assert_eq!(moved("tessera_io_operations_total", "write"), 8.0, "{after}");
    assert_eq!(moved("tessera_io_bytes_total", "write"), 8.0 * 4096.0);
    assert_eq!(moved("tessera_io_operations_total", "read"), 3.0, "{after}");
    assert_eq!(moved("tessera_io_bytes_total", "read"), 3.0 * 4096.0);
    assert_eq!(moved("tessera_io_latency_seconds_count", "write"), 8.0);
    assert_eq!(moved("tessera_io_errors_total", "write"), 0.0);
    let slowest = sample(
        &after,
        "tessera_io_latency_seconds_bucket",
        &[("op", "write"), ("le", "+Inf")],
    );
    assert_eq!(slowest, Some(8.0), "every write falls in some bucket");
    assert!(sample(&after, "tessera_io_latency_seconds_sum", &nbd("write")).unwrap() > 0.0);

    // iSCSI, through QEMU's initiator: five 4 KiB writes, counted apart from NBD's.
    let disks_before = scrape(&metrics);
    let iqn = "iqn.2026-11.io.tessera:metrics";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", iqn, "p/m"]);
    let mut args = vec!["-f".to_string(), "raw".to_string()];
    for k in 0..5 {
        args.extend([
            "-c".into(),
            format!("write -P 0x{:02x} {} 4k", 0x40 + k, (64 + k) * 4096),
        ]);
    }
    args.push(format!("iscsi://{}/{iqn}/0", d.iscsi_portal()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok("qemu-io", &args);
    let iscsi = scrape(&metrics);
    promtool_accepts(&iscsi);
    // The clients are gone: their request buffers are all given back, under the default bounds.
    for protocol in ["iscsi", "nbd"] {
        let p = [("protocol", protocol)];
        assert_eq!(
            sample(&iscsi, "tessera_request_buffer_bytes", &p),
            Some(0.0),
            "{protocol}"
        );
        let limit = sample(&iscsi, "tessera_request_buffer_limit_bytes", &p);
        assert_eq!(limit, Some((1u64 << 30) as f64), "{protocol}");
    }
    fn on(op: &str) -> [(&str, &str); 4] {
        [("protocol", "iscsi"), ("pool", "p"), ("vdisk", "m"), ("op", op)]
    }
    assert_eq!(
        sample(&iscsi, "tessera_io_operations_total", &on("write")),
        Some(5.0),
        "{iscsi}"
    );
    assert_eq!(
        sample(&iscsi, "tessera_io_bytes_total", &on("write")),
        Some(5.0 * 4096.0)
    );
    assert_eq!(
        sample(&iscsi, "tessera_io_latency_seconds_count", &on("write")),
        Some(5.0)
    );
    assert!(
        sample(&iscsi, "tessera_io_operations_total", &on("other")).unwrap() >= 1.0,
        "INQUIRY and the like"
    );
    assert_eq!(
        sample(&iscsi, "tessera_io_operations_total", &nbd("write")),
        Some(8.0),
        "NBD's unchanged"
    );
    assert_eq!(sample(&iscsi, "tessera_iscsi_luns", &[("target", iqn)]), Some(1.0));

    // The member disks saw those writes: a 2-way mirror writes each block twice (at least;
    // a new grain's first write may write more of it).
    let disk_moved = |name: &str, op: &str| {
        let l = [("pool", "p"), ("op", op)];
        total(&iscsi, name, &l) - total(&disks_before, name, &l)
    };
    assert!(
        disk_moved("tessera_disk_io_operations_total", "write") >= 10.0,
        "{iscsi}"
    );
    assert!(
        disk_moved("tessera_disk_io_bytes_total", "write") >= 2.0 * 5.0 * 4096.0,
        "{iscsi}"
    );
    assert_eq!(disk_moved("tessera_disk_io_errors_total", "write"), 0.0);
    assert!(
        disk_moved("tessera_disk_io_operations_total", "flush") >= 1.0,
        "QEMU flushes at the end"
    );
    for op in ["read", "write", "flush"] {
        let l = [("pool", "p"), ("op", op)];
        let ops = total(&iscsi, "tessera_disk_io_operations_total", &l);
        assert_eq!(total(&iscsi, "tessera_disk_io_latency_seconds_count", &l), ops, "{op}");
        let l = [("pool", "p"), ("op", op), ("le", "+Inf")];
        assert_eq!(total(&iscsi, "tessera_disk_io_latency_seconds_bucket", &l), ops, "{op}");
    }
    // And the API shows each disk's figures.
    let shown = d.json(&["pool", "show", "p"]);
    let api_writes: f64 = shown["disk_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["io"]["written_bytes"].as_f64().unwrap())
        .sum();
    assert!(api_writes >= total(&iscsi, "tessera_disk_io_bytes_total", &[("pool", "p"), ("op", "write")]));

    // Connections per portal: one open without logging in, then closed.
    let portal = d.iscsi_portal();
    let conns = |text: &str| sample(text, "tessera_iscsi_connections", &[("portal", portal.as_str())]);
    assert_eq!(conns(&iscsi), Some(0.0), "{iscsi}");
    let idle = std::net::TcpStream::connect(&portal).unwrap();
    let mut seen = None;
    for _ in 0..1500 {
        seen = conns(&scrape(&metrics));
        if seen == Some(1.0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(seen, Some(1.0));
    drop(idle);

    // The state of the pool, its disks and the vdisk, as the API shows it.
    let after = scrape(&api);
    assert_eq!(
        sample(&after, "tessera_pool_state", &[("pool", "p"), ("state", "healthy")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&after, "tessera_pool_state", &[("pool", "p"), ("state", "degraded")]),
        Some(0.0)
    );
    assert_eq!(sample(&after, "tessera_pool_lost_bytes", &[("pool", "p")]), Some(0.0));
    let shown = d.json(&["pool", "show", "p"]);
    let total = shown["capacity"]["total_bytes"].as_f64().unwrap();
    assert_eq!(
        sample(&after, "tessera_pool_capacity_bytes", &[("pool", "p")]),
        Some(total)
    );
    assert_eq!(
        sample(
            &after,
            "tessera_vdisk_allocated_bytes",
            &[("pool", "p"), ("vdisk", "m")]
        ),
        d.json(&["vdisk", "show", "p/m"])["allocated_bytes"].as_f64()
    );
    let disks = after
        .lines()
        .filter(|l| l.starts_with("tessera_disk_state{") && l.contains("state=\"healthy\"") && l.ends_with(" 1"))
        .count();
    assert_eq!(disks, 3, "{after}");
    assert_eq!(
        sample(&after, "tessera_nbd_export_online", &[("export", "m")]),
        Some(1.0)
    );

    // The metadata scan: when it last finished, and what it left open.
    assert_eq!(sample(&after, "tessera_scan_open_findings", &[("pool", "p")]), None);
    let scan = d.json(&["pool", "scan", "p"]);
    let scanned = scrape(&metrics);
    assert_eq!(
        sample(&scanned, "tessera_scan_last_finished_time_seconds", &[("pool", "p")]),
        scan["report"]["finished_at"].as_f64(),
        "{scan}"
    );
    assert_eq!(
        sample(&scanned, "tessera_scan_open_findings", &[("pool", "p")]),
        Some(0.0)
    );

    // A failed disk shows at the next scrape.
    let path = t.path().join("disks").join("d0.img");
    d.ok(&["disk", "fail", "p", path.to_str().unwrap()]);
    let failed = scrape(&metrics);
    assert_eq!(
        sample(&failed, "tessera_pool_state", &[("pool", "p"), ("state", "degraded")]),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &failed,
            "tessera_disk_state",
            &[("path", path.to_str().unwrap()), ("state", "failed")]
        ),
        Some(1.0),
        "{failed}"
    );
}

/// A daemon with no member disk (no pool yet, or only pools on Ceph RADOS) has no disk
/// latencies to report: its scrape answers all the same, and promtool accepts it (the text
/// encoder refused the empty family once, and every such scrape failed).
#[test]
fn a_daemon_without_member_disks_is_scraped_too() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    let r = http(&d.sock, "GET", "/metrics", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("tessera_start_time_seconds"), "{}", r.body);
    assert!(!r.body.contains("tessera_disk_io_latency_seconds"), "{}", r.body);
    promtool_accepts(&r.body);
}
