//! The NBD server, driven by clients nobody here wrote: libnbd's nbdinfo and nbdcopy, QEMU,
//! and fio's nbd engine; exports configured with the CLI and kept across restarts.

mod common;

use common::*;

fn uri(d: &Daemon, export: &str) -> String {
    format!("nbd://{}/{export}", d.nbd_address())
}

#[test]
fn demo_vdisk_is_exported_over_nbd() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(&t.path().join("demo"), &["--demo", "--api-listen", "none"]).unwrap();
    let addr = d.nbd_address();
    assert!(d.stdout().contains(&format!("nbd://{addr}/vol1")), "{}", d.stdout());
    let info = ok("nbdinfo", &["--json", &uri(&d, "vol1")]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap_or_else(|e| panic!("{e}: {info}"));
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], 16u64 << 30, "{info}");
    assert_eq!(e["description"], "demo/vol1");
    assert_eq!(e["block_size_minimum"], 512);
    assert_eq!(e["block_size_maximum"], 32 << 20);
    for cap in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_multi_conn",
    ] {
        assert_eq!(e[cap], true, "{cap}: {info}");
    }
    assert_eq!(e["is_read_only"], false);
    assert!(info.contains("base:allocation"), "{info}");
    // A fresh thin vdisk is one hole.
    let map = ok("nbdinfo", &["--map", &uri(&d, "vol1")]);
    assert!(map.trim().ends_with("hole,zero") && map.lines().count() == 1, "{map}");
    let list = ok("nbdinfo", &["--list", &format!("nbd://{addr}")]);
    assert!(list.contains("export=\"vol1\""), "{list}");
}

#[test]
fn clients_round_trip_data_and_exports_persist() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    create_pool(&d, "n", &disks(&t.path().join("disks"), 3, 1 << 30));
    d.ok(&["vdisk", "create", "n/v", "--size", "256M", "--layout", "mirror"]);
    d.ok(&[
        "vdisk",
        "create",
        "n/w",
        "--size",
        "128M",
        "--layout",
        "parity",
        "--block-size",
        "4096",
    ]);
    let out = d.ok(&["nbd", "export", "n/v"]);
    assert!(out.contains("read-write") && out.contains("n/v"), "{out}");
    d.ok(&["nbd", "export", "n/w", "--name", "w-ro", "--read-only"]);
    let list = d.json(&["nbd", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");

    // qemu-img writes an image and reads it back, bit-exact.
    let img = t.path().join("in.img");
    random_image(&img, 48 << 20, 11);
    ok(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            img.to_str().unwrap(),
            "-O",
            "raw",
            &uri(&d, "v"),
        ],
    );
    let back = t.path().join("back.img");
    ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            &uri(&d, "v"),
            "-O",
            "raw",
            back.to_str().unwrap(),
        ],
    );
    assert!(read_back_matches(&img, &back), "qemu-img read back differs");
    // What was never written comes back sparse: block status reports the holes.
    assert!(allocated(&t.path().join("back.img")) < 100 << 20);
    let map = ok("nbdinfo", &["--map", &uri(&d, "v")]);
    assert!(map.contains("hole,zero") && map.contains("data"), "{map}");

    // nbdcopy, another image, the other way round.
    let img2 = t.path().join("in2.img");
    random_image(&img2, 32 << 20, 12);
    ok("nbdcopy", &["--flush", img2.to_str().unwrap(), &uri(&d, "v")]);
    let back2 = t.path().join("back2.img");
    ok("nbdcopy", &[&uri(&d, "v"), back2.to_str().unwrap()]);
    assert!(read_back_matches(&img2, &back2), "nbdcopy read back differs");

    // fio's nbd engine writes and verifies, on the parity vdisk through a writable export.
    d.ok(&["nbd", "export", "n/w", "--name", "w"]);
    let fio = ok(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", uri(&d, "w")),
            "--rw=randwrite",
            "--bs=4k",
            "--size=32m",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            // fio would otherwise leave its verify state file in the working directory.
            "--verify_state_save=0",
        ],
    );
    assert!(fio.contains("err= 0"), "{fio}");

    // The read-only export refuses writes; the data is unchanged.
    let (success, out) = run("qemu-io", &["-f", "raw", "-c", "write -P 0x55 0 4k", &uri(&d, "w-ro")]);
    assert!(!success || out.contains("failed") || out.contains("ermission"), "{out}");
    let (_, out) = run(
        "qemu-io",
        &["-r", "-f", "raw", "-c", "read -P 0x55 0 4k", &uri(&d, "w-ro")],
    );
    assert!(
        out.contains("Pattern verification failed"),
        "the write went through: {out}"
    );

    // A vdisk that is exported cannot be deleted; bad requests are refused clearly.
    let err = d.fails(&["vdisk", "delete", "n/v"]);
    assert!(err.contains("NBD export v"), "{err}");
    let err = d.fails(&["nbd", "export", "n/v"]);
    assert!(err.contains("already exists"), "{err}");
    let err = d.fails(&["nbd", "export", "n/v", "--name", "a/b"]);
    assert!(err.contains("may hold only"), "{err}");
    let err = d.fails(&["nbd", "export", "n/nope", "--name", "x"]);
    assert!(err.contains("nope"), "{err}");
    let err = d.fails(&["nbd", "remove", "zzz"]);
    assert!(err.contains("no NBD export"), "{err}");
    let r = d.http("POST", "/api/nbd/exports", Some(r#"{"vdisk":"n/v","bogus":1}"#));
    assert_eq!(r.code(), "malformed_request", "{}", r.body);

    // Exports survive a restart; removal is kept too.
    d.ok(&["nbd", "remove", "w"]);
    d.stop();
    let d = Daemon::start(&state);
    let names: Vec<String> = d
        .json(&["nbd", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["v".to_string(), "w-ro".to_string()]);
    let back3 = t.path().join("back3.img");
    ok("nbdcopy", &[&uri(&d, "v"), back3.to_str().unwrap()]);
    assert!(read_back_matches(&img2, &back3), "data after restart differs");
    d.ok(&["nbd", "remove", "v"]);
    d.ok(&["vdisk", "delete", "n/v"]);
}

/// NBD's access control as an operator gets it: the TCP listener requires TLS unless told
/// otherwise, with a pre-shared key the daemon makes (owner-only) and libnbd uses; local
/// clients have an owner-only unix socket.
#[test]
fn the_tcp_listener_requires_tls_and_the_unix_socket_is_the_owners() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let d = Daemon::start_with(&state, &["--nbd-listen", "127.0.0.1:0", "--api-listen", "none"]).unwrap();
    create_pool(&d, "n", &disks(&t.path().join("disks"), 2, 1 << 30));
    d.ok(&["vdisk", "create", "n/v", "--size", "64M", "--layout", "mirror"]);
    d.ok(&["nbd", "export", "n/v"]);
    let addr = d.nbd_address();
    // Plain NBD on TCP: refused.
    let (ok_plain, out) = run("nbdinfo", &[&format!("nbd://{addr}/v")]);
    assert!(!ok_plain, "plain NBD was served on TCP: {out}");
    // TLS with the key the daemon made at its first start.
    let psk = state.join("nbd-psk");
    let mode = std::fs::metadata(&psk).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the key file is the owner's alone");
    let nbds = format!("nbds://tessera@{addr}/v?tls-psk-file={}", psk.display());
    assert!(
        d.stdout().contains(&format!(
            "TLS required: nbds://tessera@{addr}/NAME?tls-psk-file={}",
            psk.display()
        )),
        "the banner shows how to connect: {}",
        d.stdout()
    );
    let info = ok("nbdinfo", &["--json", &nbds]);
    assert!(info.contains(&(64u64 << 20).to_string()), "{info}");
    // The unix socket: owner-only, plain NBD for local clients.
    let sock = state.join("nbd.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let info = ok(
        "nbdinfo",
        &["--json", &format!("nbd+unix:///v?socket={}", sock.display())],
    );
    assert!(info.contains(&(64u64 << 20).to_string()), "{info}");
}
