//! The write-back cache through the daemon: a pool made with cache disks, a vdisk's cache set
//! and switched off, data imported through the cache and read back, a cache disk failed and
//! replaced, the daemon killed with data in the log, and bad requests refused.

mod common;

use std::path::Path;

use common::*;

const MIB: u64 = 1 << 20;

fn cache_files(dir: &Path, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|n| {
            let p = dir.join(n);
            std::fs::File::create(&p).unwrap().set_len(80 * MIB).unwrap();
            p.display().to_string()
        })
        .collect()
}

#[test]
fn a_pool_with_cache_disks_caches_survives_a_kill_and_replaces_a_failed_cache_disk() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start_configured(&state, "scrub_interval = \"off\"\n");
    let dir = t.path().join("disks");
    let data = disks(&dir, 4, 256 << 20);
    let caches = cache_files(&dir, &["c0", "c1", "c2"]);
    let mut args = vec!["pool", "create", "c", "--slab-size", "64M"];
    for p in &data {
        args.extend(["--disk", p.as_str()]);
    }
    args.extend(["--cache-disk", caches[0].as_str(), "--cache-disk", caches[1].as_str()]);
    d.ok(&args);
    let show = d.json(&["pool", "show", "c"]);
    let cache = &show["cache"];
    assert_eq!(cache["devices"].as_array().unwrap().len(), 2, "{show}");
    assert_eq!(cache["redundant"], true, "{show}");
    assert_eq!(
        show["capacity"]["total_bytes"],
        4 * 3 * 64 * MIB,
        "cache disks hold no slab: {show}"
    );
    let text = d.ok(&["pool", "show", "c"]);
    assert!(
        text.contains("write-back cache") && text.contains("log on disk(s) 4, 5"),
        "{text}"
    );
    assert!(d.ok(&["disk", "list", "c"]).contains("healthy (cache)"));

    // A parity vdisk with its own budget; an image through the cache and back.
    d.ok(&[
        "vdisk",
        "create",
        "c/p",
        "--size",
        "32M",
        "--layout",
        "parity",
        "--columns",
        "3",
        "--write-cache-size",
        "16M",
    ]);
    let v = d.json(&["vdisk", "show", "c/p"]);
    assert_eq!(v["write_cache_size"], 16 * MIB, "{v}");
    assert!(d.ok(&["vdisk", "show", "c/p"]).contains("up to 16.0 MiB"));
    let img = t.path().join("in.img");
    random_image(&img, 32 * MIB, 9);
    d.ok(&["vdisk", "import", "c/p", img.to_str().unwrap()]);
    let cached = d.json(&["pool", "show", "c"])["cache"]["cached_bytes"]
        .as_u64()
        .unwrap();
    assert!(cached > 0, "the import did not go through the cache");
    let back = t.path().join("back.img");
    d.ok(&["vdisk", "export", "c/p", back.to_str().unwrap()]);
    assert!(read_back_matches(&img, &back));

    // Killed with data in the log: the restart replays it.
    let img2 = t.path().join("in2.img");
    random_image(&img2, 32 * MIB, 10);
    d.ok(&["vdisk", "import", "c/p", img2.to_str().unwrap()]);
    d.kill9();
    let mut d = Daemon::start_configured(&state, "scrub_interval = \"off\"\n");
    std::fs::remove_file(&back).unwrap();
    d.ok(&["vdisk", "export", "c/p", back.to_str().unwrap()]);
    assert!(read_back_matches(&img2, &back), "the log was not replayed after a kill");
    d.ok(&["pool", "check", "c"]);

    // A cache disk fails: the log goes on, not redundant, until another one is added.
    d.ok(&["disk", "fail", "c", &caches[0]]);
    let c = &d.json(&["pool", "show", "c"])["cache"];
    assert_eq!(
        (c["devices"].as_array().unwrap().len(), c["redundant"].clone()),
        (1, false.into()),
        "{c}"
    );
    assert!(d.ok(&["pool", "show", "c"]).contains("NOT redundant"));
    let added = d.ok(&["disk", "add", "c", &caches[2], "--usage", "cache"]);
    assert!(added.contains("write-back cache disk"), "{added}");
    assert_eq!(d.json(&["pool", "show", "c"])["cache"]["redundant"], true);

    // Switched off for the vdisk: later writes go straight to the layout.
    assert!(d.ok(&["vdisk", "write-cache", "c/p", "--size", "0"]).contains("off"));
    assert_eq!(d.json(&["vdisk", "show", "c/p"])["write_cache_size"], 0);
    d.ok(&["vdisk", "import", "c/p", img.to_str().unwrap()]);
    std::fs::remove_file(&back).unwrap();
    d.ok(&["vdisk", "export", "c/p", back.to_str().unwrap()]);
    assert!(read_back_matches(&img, &back));

    // Bad requests: clear errors, nothing changed.
    let e = d.fails(&["disk", "add", "c", &caches[2], "--usage", "bogus"]);
    assert!(e.contains("data or cache"), "{e}");
    let extra = cache_files(&dir, &["c3"]);
    let e = d.fails(&["disk", "add", "c", &extra[0], "--usage", "cache", "--spare"]);
    assert!(e.contains("cannot be a hot spare"), "{e}");
    let small = dir.join("tiny");
    std::fs::File::create(&small).unwrap().set_len(8 * MIB).unwrap();
    let e = d.fails(&["disk", "add", "c", small.to_str().unwrap(), "--usage", "cache"]);
    assert!(e.contains("too small for a cache disk"), "{e}");
    let r = d.http("PUT", "/api/pools/c/vdisks/p/write-cache", Some(r#"{"size":"big"}"#));
    assert_eq!(r.code(), "malformed_request", "{}", r.body);
    let r = d.http("PUT", "/api/pools/c/vdisks/nope/write-cache", Some(r#"{"size":0}"#));
    assert_eq!(r.code(), "not_found", "{}", r.body);
    d.ok(&["pool", "check", "c"]);

    // Killed with writes in the log, and started without its cache disks: the pool is not
    // imported rather than opened without its log; once they are back, an import loses
    // nothing. Gone for good, --without-log gives them up.
    let r = d.http("POST", "/api/pools/import", Some(r#"{"name":"c","without_log":"yes"}"#));
    assert_eq!(r.code(), "malformed_request", "{}", r.body);
    d.ok(&["vdisk", "write-cache", "c/p", "--size", "16M"]);
    d.ok(&["vdisk", "import", "c/p", img2.to_str().unwrap()]);
    d.kill9();
    let away: Vec<(String, String)> = [&caches[1], &caches[2]]
        .iter()
        .map(|c| (c.to_string(), format!("{c}.away")))
        .collect();
    for (c, a) in &away {
        std::fs::rename(c, a).unwrap();
    }
    let mut d = Daemon::start_configured(&state, "scrub_interval = \"off\"\n");
    let e = d.fails(&["pool", "import", "c"]);
    assert!(e.contains("--without-log") && e.contains("write-back cache"), "{e}");
    for (c, a) in &away {
        std::fs::rename(a, c).unwrap();
    }
    d.ok(&["pool", "import", "c"]);
    std::fs::remove_file(&back).unwrap();
    d.ok(&["vdisk", "export", "c/p", back.to_str().unwrap()]);
    assert!(read_back_matches(&img2, &back), "the log's writes were lost");
    d.kill9();
    for (c, _) in &away {
        std::fs::remove_file(c).unwrap();
    }
    let mut d = Daemon::start_configured(&state, "scrub_interval = \"off\"\n");
    let imported = d.ok(&["pool", "import", "c", "--without-log"]);
    assert!(imported.contains("pool c imported"), "{imported}");
    d.ok(&["pool", "check", "c"]);
    d.stop();
}
