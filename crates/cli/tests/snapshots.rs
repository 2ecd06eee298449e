//! `tessera snapshot`: a snapshot keeps the data of its moment while the vdisk changes, is
//! read-only wherever it is presented, can be cloned back into a writable vdisk, is accounted
//! as shared and exclusive space, and can be deleted before or after its vdisk.

mod common;

use common::*;

#[test]
fn snapshots_keep_their_moment_and_restore_through_clones() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "p", &disks(&t.path().join("disks"), 3, 1 << 30));
    d.ok(&["vdisk", "create", "p/db", "--size", "64M", "--layout", "mirror"]);
    let before = t.path().join("before.img");
    random_image(&before, 16 << 20, 41);
    d.ok(&["vdisk", "import", "p/db", before.to_str().unwrap()]);

    let out = d.ok(&["snapshot", "create", "p/db@before-upgrade"]);
    assert!(out.contains("snapshot p/db@before-upgrade taken"), "{out}");
    let v = d.json(&["vdisk", "show", "p/db"]);
    assert_eq!(v["snapshots"], 1);
    assert_eq!(v["exclusive_bytes"], 0, "everything is shared with the snapshot: {v}");
    assert_eq!(v["shared_bytes"], v["allocated_bytes"]);

    // The vdisk changes; the snapshot does not.
    let after = t.path().join("after.img");
    random_image(&after, 8 << 20, 42);
    d.ok(&["vdisk", "import", "p/db", after.to_str().unwrap()]);
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    let v = d.json(&["vdisk", "show", "p/db"]);
    assert!(
        n(&v, "exclusive_bytes") > 0,
        "rewritten grains are the vdisk's own: {v}"
    );
    assert_eq!(
        n(&v, "exclusive_bytes") + n(&v, "shared_bytes"),
        n(&v, "allocated_bytes")
    );
    let s = d.json(&["snapshot", "show", "p/db@before-upgrade"]);
    assert_eq!(s["vdisk"], "db");
    assert_eq!(s["name"], "before-upgrade");
    assert_eq!(s["full_name"], "db@before-upgrade");
    assert!(
        n(&s, "exclusive_bytes") > 0,
        "the overwritten grains are the snapshot's own: {s}"
    );
    assert_eq!(
        n(&s, "shared_bytes"),
        n(&v, "shared_bytes"),
        "what they share, they share: {s} {v}"
    );
    let back = t.path().join("snap.img");
    d.ok(&["vdisk", "export", "p/db@before-upgrade", back.to_str().unwrap()]);
    assert!(read_back_matches(&before, &back), "the snapshot changed with its vdisk");

    // Snapshots are not vdisks in listings, and are listed per vdisk, pool and daemon.
    d.ok(&["snapshot", "create", "p/db@second"]);
    let list = d.ok(&["snapshot", "list", "p/db"]);
    let b = list.find("p/db@before-upgrade").unwrap();
    let s2 = list.find("p/db@second").unwrap();
    assert!(b < s2, "oldest first: {list}");
    assert_eq!(d.json(&["snapshot", "list"]).as_array().unwrap().len(), 2);
    assert_eq!(d.json(&["snapshot", "list", "p"]).as_array().unwrap().len(), 2);
    let vdisks = d.json(&["vdisk", "list", "p"]);
    assert_eq!(vdisks.as_array().unwrap().len(), 1, "{vdisks}");

    // Read-only: imports into it, a resize and an NBD write are refused.
    let err = d.fails(&["vdisk", "import", "p/db@second", after.to_str().unwrap()]);
    assert!(err.contains("snapshot"), "{err}");
    assert!(d
        .fails(&["vdisk", "resize", "p/db@second", "--size", "128M"])
        .contains("snapshot"));
    d.ok(&["nbd", "export", "p/db@second"]);
    let e = d.json(&["nbd", "show", "db@second"]);
    assert_eq!(e["read_only"], true, "{e}");
    let uri = format!("nbd://{}/db@second", d.nbd_address());
    let info = ok("nbdinfo", &["--json", &uri]);
    assert!(info.contains("\"is_read_only\": true"), "{info}");

    // Restore: a clone of the snapshot is a writable vdisk with the old data.
    let out = d.ok(&["vdisk", "clone", "p/db@before-upgrade", "restored"]);
    assert!(out.contains("0 B copied") || out.contains("copied"), "{out}");
    let r = t.path().join("restored.img");
    d.ok(&["vdisk", "export", "p/restored", r.to_str().unwrap()]);
    assert!(read_back_matches(&before, &r));
    d.ok(&["vdisk", "import", "p/restored", after.to_str().unwrap()]);

    // Bad names.
    assert!(d.fails(&["snapshot", "create", "p/db"]).contains("POOL/VDISK@NAME"));
    assert!(d.fails(&["snapshot", "create", "p/db@a@b"]).contains("POOL/VDISK@NAME"));
    assert!(d.fails(&["snapshot", "create", "p/db@-x"]).contains("must not start"));
    assert!(d
        .fails(&["snapshot", "create", "p/db@second"])
        .contains("already exists"));
    assert!(d.fails(&["snapshot", "create", "p/nope@x"]).contains("nope"));
    assert!(d.fails(&["snapshot", "delete", "p/db@nope"]).contains("no snapshot"));
    let r = d.http(
        "POST",
        "/api/pools/p/vdisks/db/snapshots",
        Some(r#"{"name":"x","y":1}"#),
    );
    assert_eq!(r.code(), "malformed_request", "{}", r.body);

    // Any order: the vdisk goes first, its snapshots stay readable; a presented snapshot
    // cannot be deleted.
    assert!(d.fails(&["snapshot", "delete", "p/db@second"]).contains("presented"));
    d.ok(&["nbd", "remove", "db@second"]);
    d.ok(&["vdisk", "delete", "p/db"]);
    let back = t.path().join("snap2.img");
    d.ok(&["vdisk", "export", "p/db@before-upgrade", back.to_str().unwrap()]);
    assert!(read_back_matches(&before, &back));
    d.ok(&["pool", "check", "p"]);
    d.ok(&["snapshot", "delete", "p/db@before-upgrade"]);
    d.ok(&["snapshot", "delete", "p/db@second"]);
    assert_eq!(d.json(&["snapshot", "list"]).as_array().unwrap().len(), 0);
    d.ok(&["pool", "check", "p"]);
}
