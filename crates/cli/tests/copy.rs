//! `tessera copy` against the daemon over iSCSI: ODX tokens between LUNs of two targets and
//! EXTENDED COPY between LUNs of one, done by reference inside the pool (the data stays behind,
//! only commands cross the network), compared with a host copy; and the errors a user can make,
//! among them an EXTENDED COPY that names a LUN of another target.

mod common;

use common::*;

fn copy(d: &Daemon, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["copy"];
    all.extend_from_slice(args);
    d.json(&all)
}

#[test]
fn offloaded_copies_between_targets() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "p", &disks(&t.path().join("disks"), 3, 1 << 30));
    for v in ["src", "odx", "xcopy", "host"] {
        d.ok(&[
            "vdisk",
            "create",
            &format!("p/{v}"),
            "--size",
            "64M",
            "--layout",
            "mirror",
        ]);
    }
    let img = t.path().join("src.img");
    random_image(&img, 32 << 20, 51);
    d.ok(&["vdisk", "import", "p/src", img.to_str().unwrap()]);
    let (a, b) = ("iqn.2026-11.io.tessera:a", "iqn.2026-11.io.tessera:b");
    d.ok(&["target", "create", a, "--allow-any-initiator"]);
    d.ok(&["target", "create", b, "--allow-any-initiator"]);
    d.ok(&["target", "lun", "add", a, "p/src"]);
    // EXTENDED COPY reaches only LUNs of the target it is sent to: p/xcopy is beside p/src.
    d.ok(&["target", "lun", "add", a, "p/xcopy", "--lun", "1"]);
    for v in ["odx", "host"] {
        d.ok(&["target", "lun", "add", b, &format!("p/{v}")]);
    }
    let portal = d.iscsi_portal();
    let src = format!("iscsi://{portal}/{a}/0");
    let blocks = ((32u64 << 20) / 512).to_string();
    let mut payload = Vec::new();
    for (dst, method) in [
        (format!("iscsi://{portal}/{b}/0"), "odx"),
        (format!("iscsi://{portal}/{a}/1"), "xcopy"),
        (format!("iscsi://{portal}/{b}/1"), "host"),
    ] {
        let r = copy(&d, &[&src, "0", &dst, "0", &blocks, "--method", method]);
        assert_eq!(r["bytes"], 32u64 << 20, "{r}");
        payload.push(r["payload_bytes"].as_u64().unwrap());
        let back = t.path().join(format!("{method}.img"));
        d.ok(&["vdisk", "export", &format!("p/{method}"), back.to_str().unwrap()]);
        assert!(read_back_matches(&img, &back), "{method} copy differs from the source");
    }
    // Offloaded copies send commands, not data; the host copy moves every byte twice.
    assert!(payload[0] < 4096 && payload[1] < 4096, "payload {payload:?}");
    assert!(payload[2] >= 2 * (32 << 20), "payload {payload:?}");
    // Done by reference: the copies share the source's grains.
    for v in ["odx", "xcopy"] {
        let s = d.json(&["vdisk", "show", &format!("p/{v}")]);
        assert!(s["shared_bytes"].as_u64().unwrap() > 16 << 20, "{v}: {s}");
        // Wholly: no allocation unit was cut by a segment boundary and copied by data.
        assert_eq!(s["shared_bytes"], s["allocated_bytes"], "{v}: {s}");
    }
    let s = d.json(&["vdisk", "show", "p/host"]);
    assert_eq!(s["shared_bytes"], 0, "{s}");

    // Within one LUN, overlapping, then back: reads as a memmove would leave it.
    let dst = format!("iscsi://{portal}/{b}/0");
    copy(&d, &[&dst, "0", &dst, "1000", "20000"]);
    let r = copy(&d, &[&dst, "1000", &dst, "0", "20000", "--method", "xcopy"]);
    assert_eq!(r["blocks"], 20000);
    let mut want = std::fs::read(&img).unwrap();
    want.resize(64 << 20, 0);
    want.copy_within(0..20000 * 512, 1000 * 512);
    want.copy_within(1000 * 512..21000 * 512, 0);
    let back = t.path().join("odx2.img");
    d.ok(&["vdisk", "export", "p/odx", back.to_str().unwrap()]);
    let mut got = std::fs::read(&back).unwrap();
    got.resize(64 << 20, 0);
    assert!(got == want, "overlapping copies do not read as memmoves");

    // Errors: a range past the end, nothing to copy, not an iSCSI URL, no such target.
    let fails = |args: &[&str]| {
        let mut all = vec!["copy"];
        all.extend_from_slice(args);
        d.fails(&all)
    };
    // Across targets, EXTENDED COPY is refused (CVE-2020-28374 in LIO): it would let a host
    // of one target read or write the LUNs of another.
    let e = fails(&[&src, "0", &dst, "0", "8", "--method", "xcopy"]);
    assert!(e.contains("0x08/0x04") && e.contains("--method odx"), "{e}");
    let e = fails(&[&src, "0", &dst, "131000", "2000"]);
    assert!(e.contains("goes past its end"), "{e}");
    assert!(fails(&[&src, "0", &dst, "0", "0"]).contains("at least one block"));
    assert!(fails(&[&src, "0", "nbd://x/y", "0", "1"]).contains("iscsi://"));
    let ghost = format!("iscsi://{portal}/iqn.2026-11.io.tessera:none/0");
    assert!(fails(&[&src, "0", &ghost, "0", "1"]).contains("login"));
    d.ok(&["pool", "check", "p"]);
}
