//! `tessera vdisk clone`: a clone reads as its source did, the two diverge on write, the pool's
//! metadata stays consistent, and either can be deleted first.

mod common;

use common::*;

#[test]
fn clone_reads_as_the_source_and_diverges() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "c", &disks(&t.path().join("disks"), 3, 1 << 30));
    d.ok(&["vdisk", "create", "c/src", "--size", "64M", "--layout", "mirror"]);
    let img = t.path().join("a.img");
    random_image(&img, 24 << 20, 21);
    d.ok(&["vdisk", "import", "c/src", img.to_str().unwrap()]);

    let out = d.ok(&["vdisk", "clone", "c/src", "copy"]);
    assert!(out.contains("cloned from c/src") && out.contains("shared"), "{out}");
    let v = d.json(&["vdisk", "show", "c/copy"]);
    assert_eq!(v["size"], 64u64 << 20);
    assert_eq!(v["provisioning"], "thin");
    let back = t.path().join("copy.img");
    d.ok(&["vdisk", "export", "c/copy", back.to_str().unwrap()]);
    assert!(
        read_back_matches(&img, &back),
        "the clone reads differently from its source"
    );

    // Overwrite the clone: the source keeps its data.
    let other = t.path().join("b.img");
    random_image(&other, 8 << 20, 22);
    d.ok(&["vdisk", "import", "c/copy", other.to_str().unwrap()]);
    let src_back = t.path().join("src.img");
    d.ok(&["vdisk", "export", "c/src", src_back.to_str().unwrap()]);
    assert!(
        read_back_matches(&img, &src_back),
        "a write to the clone changed the source"
    );
    d.ok(&["pool", "check", "c"]);

    // Errors: a taken name, a missing source, a malformed body.
    assert!(d.fails(&["vdisk", "clone", "c/src", "copy"]).contains("already exists"));
    assert!(d.fails(&["vdisk", "clone", "c/nope", "x"]).contains("nope"));
    let r = d.http(
        "POST",
        "/api/pools/c/vdisks/src/clone",
        Some(r#"{"name":"x","size":1}"#),
    );
    assert_eq!(r.code(), "malformed_request", "{}", r.body);

    // The source goes first; the clone keeps what it shared.
    d.ok(&["vdisk", "delete", "c/src"]);
    let back2 = t.path().join("copy2.img");
    d.ok(&["vdisk", "export", "c/copy", back2.to_str().unwrap()]);
    assert!(read_back_matches(&other, &back2));
    d.ok(&["pool", "check", "c"]);
}
