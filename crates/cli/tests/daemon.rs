//! End-to-end: the real daemon, driven by the real CLI.

mod common;

use common::*;
use std::process::Command;

#[test]
fn pool_and_vdisk_lifecycle() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    let disks = disks(&t.path().join("disks"), 3, 1 << 30);
    create_pool(&d, "tank", &disks);

    let pools = d.json(&["pool", "list"]);
    assert_eq!(pools[0]["name"], "tank");
    assert_eq!(pools[0]["health"], "healthy");
    assert_eq!(pools[0]["disks"], 3);
    assert!(d.ok(&["pool", "list"]).contains("tank"));
    assert_eq!(d.json(&["disk", "list", "tank"]).as_array().unwrap().len(), 3);

    let v = d.json(&["vdisk", "create", "tank/vol1", "--size", "256M", "--layout", "mirror"]);
    assert_eq!(v["size"], 256u64 << 20);
    assert_eq!(v["layout"]["kind"], "mirror");
    assert_eq!(v["provisioning"], "thin");
    assert_eq!(
        (v["block_size"].as_u64(), v["physical_block_size"].as_u64()),
        (Some(512), Some(4096))
    );
    assert!(d
        .ok(&["vdisk", "show", "tank/vol1"])
        .contains("512 (4096 physical, 512e)"));
    let n = d.json(&[
        "vdisk",
        "create",
        "tank/n",
        "--size",
        "1M",
        "--physical-block-size",
        "512",
    ]);
    assert_eq!(n["physical_block_size"], 512);
    assert!(d.ok(&["vdisk", "show", "tank/n"]).contains("512 (512n)"));
    d.ok(&["vdisk", "delete", "tank/n"]);
    d.ok(&[
        "vdisk",
        "create",
        "tank/p",
        "--size",
        "100M",
        "--layout",
        "parity",
        "--block-size",
        "4096",
        "--grain",
        "128K",
    ]);
    d.ok(&[
        "vdisk",
        "create",
        "tank/f",
        "--size",
        "64M",
        "--layout",
        "simple",
        "--provisioning",
        "fixed",
    ]);
    let list = d.json(&["vdisk", "list", "tank"]);
    assert_eq!(list.as_array().unwrap().len(), 3);
    let p = d.json(&["vdisk", "show", "tank/p"]);
    assert_eq!(
        (p["block_size"].as_u64(), p["grain_size"].as_u64()),
        (Some(4096), Some(128 << 10))
    );
    assert!(d.ok(&["vdisk", "show", "tank/p"]).contains("parity"));

    let v = d.json(&["vdisk", "resize", "tank/vol1", "--size", "1G"]);
    assert_eq!(v["size"], 1u64 << 30);
    let show = d.json(&["pool", "show", "tank"]);
    assert_eq!(show["vdisk_list"].as_array().unwrap().len(), 3);
    assert!(d.ok(&["pool", "show", "tank"]).contains("tank/vol1"));

    // Errors say what was wrong.
    assert!(d
        .fails(&["vdisk", "create", "tank/vol1", "--size", "1G"])
        .contains("already exists"));
    assert!(d
        .fails(&["pool", "create", "tank", "--disk", &disks[0]])
        .contains("already exists"));
    assert!(d.fails(&["vdisk", "show", "tank/nope"]).contains("no vdisk 'nope'"));
    assert!(d
        .fails(&["vdisk", "show", "nope/vol1"])
        .contains("no imported pool 'nope'"));
    assert!(d.fails(&["pool", "show", "nope"]).contains("no imported pool"));
    assert!(d
        .fails(&[
            "vdisk",
            "create",
            "tank/big",
            "--size",
            "100G",
            "--provisioning",
            "fixed"
        ])
        .contains("out of space"));
    assert!(d
        .fails(&["vdisk", "create", "tank/dp", "--size", "1G", "--layout", "dual-parity"])
        .contains("dual"));
    assert!(d
        .fails(&["vdisk", "create", "tank/m4", "--size", "1G", "--layout", "mirror", "--copies", "4"])
        .contains("2 or 3 copies"));
    assert!(d
        .fails(&["vdisk", "create", "tank/x", "--size", "1G", "--layout", "raid5"])
        .contains("unknown layout 'raid5': choose simple, mirror, parity or dual-parity"));
    assert!(d
        .fails(&["vdisk", "create", "tank/bad name", "--size", "1G"])
        .contains("vdisk name"));
    assert!(d
        .fails(&["vdisk", "create", "novdisk", "--size", "1G"])
        .contains("POOL/NAME"));
    assert!(d
        .fails(&["vdisk", "create", "tank/odd", "--size", "1000"])
        .contains("multiple"));
    assert!(d
        .fails(&[
            "vdisk",
            "create",
            "tank/odd",
            "--size",
            "1M",
            "--block-size",
            "4096",
            "--physical-block-size",
            "512"
        ])
        .contains("smaller than the 4096 byte logical block size"));
    assert!(d
        .fails(&["vdisk", "resize", "tank/vol1", "--size", "512M"])
        .contains("shrinking"));
    assert!(d
        .fails(&["pool", "create", "p2", "--disk", "/nonexistent/disk.img"])
        .contains("/nonexistent/disk.img"));
    assert!(d
        .fails(&["pool", "create", "p2", "--disk", &disks[1]])
        .contains(&disks[1]));
    let o = d.cli(&["vdisk", "create", "tank/y", "--size", "12Q"]);
    assert!(!o.success && o.stderr.contains("not a size"), "{}", o.stderr);
    assert!(d.fails(&["pool", "destroy", "tank"]).contains("delete them first"));

    for v in ["vol1", "p", "f"] {
        d.ok(&["vdisk", "delete", &format!("tank/{v}")]);
    }
    assert!(d.fails(&["vdisk", "delete", "tank/vol1"]).contains("no vdisk"));
    assert_eq!(d.json(&["vdisk", "list"]).as_array().unwrap().len(), 0);

    // Export, then import again.
    d.ok(&["pool", "export", "tank"]);
    assert_eq!(d.json(&["pool", "list"]).as_array().unwrap().len(), 0);
    let importable = d.json(&["pool", "import"]);
    assert_eq!(importable[0]["name"], "tank");
    assert!(d.fails(&["pool", "import", "ghost"]).contains("no pool 'ghost'"));
    d.ok(&["pool", "import", "tank"]);
    assert!(d.fails(&["pool", "import", "tank"]).contains("already imported"));
    assert_eq!(d.json(&["pool", "show", "tank"])["health"], "healthy");

    // Destroy wipes the labels: the disks make a new pool.
    d.ok(&["pool", "destroy", "tank"]);
    create_pool(&d, "tank2", &disks);
    assert_eq!(d.json(&["pool", "list"])[0]["name"], "tank2");
}

/// A daemon killed during an export leaves no file behind, at the name or beside it, where
/// the file system makes unnamed files (the test's temporary directory's does).
#[test]
fn a_daemon_killed_during_an_export_leaves_no_file_behind() {
    use std::os::unix::fs::OpenOptionsExt;
    let t = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "p", &disks(&t.path().join("disks"), 2, 256 << 20));
    let img = t.path().join("in.img");
    random_image(&img, 16 << 20, 9);
    let job = d.json(&["vdisk", "import", "p/v", img.to_str().unwrap(), "--layout", "simple"]);
    assert_eq!(job["state"], "succeeded", "{job}");
    let dir = t.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    let unnamed = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(&dir);
    if unnamed.is_err() {
        return tessera_disk::skip(
            "a_daemon_killed_during_an_export_leaves_no_file_behind",
            "the temporary directory's file system makes no unnamed files (O_TMPFILE)",
        );
    }
    let out = dir.join("v.img");
    let job = d.json(&[
        "vdisk",
        "export",
        "p/v",
        out.to_str().unwrap(),
        "--rate",
        "1M",
        "--no-wait",
    ]);
    let id = job["id"].as_u64().unwrap().to_string();
    let started = std::time::Instant::now();
    while d.json(&["job", "show", &id])["done_bytes"].as_u64().unwrap_or(0) == 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the export does not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    d.kill9();
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn import_export_round_trip_is_bit_exact_and_sparse() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "p", &disks(&t.path().join("disks"), 4, 1 << 30));
    let img = t.path().join("in.img");
    // Not a multiple of 512: the last block is padded.
    let size = (300u64 << 20) + 1000;
    random_image(&img, size, 1);

    // The vdisk does not exist: the import creates it with the given layout.
    let job = d.json(&["vdisk", "import", "p/img", img.to_str().unwrap(), "--layout", "parity"]);
    assert_eq!(job["state"], "succeeded", "{job}");
    let r = &job["result"];
    assert_eq!(r["bytes"], size);
    assert!(r["zero_bytes"].as_u64().unwrap() >= 36 << 20, "{r}");
    let v = d.json(&["vdisk", "show", "p/img"]);
    assert_eq!(v["size"], size.div_ceil(512) * 512);
    assert_eq!(v["layout"]["kind"], "parity");
    // Zero runs were trimmed, not stored.
    assert!(v["allocated_bytes"].as_u64().unwrap() < size - (30 << 20), "{v}");

    let out = t.path().join("out.img");
    d.ok(&["vdisk", "export", "p/img", out.to_str().unwrap()]);
    // The export is the vdisk: the image plus the padding of its last block.
    let f = std::fs::OpenOptions::new().write(true).open(&out).unwrap();
    assert_eq!(f.metadata().unwrap().len(), size.div_ceil(512) * 512);
    f.set_len(size).unwrap();
    drop(f);
    assert!(same_file(&img, &out), "exported image differs from the imported one");
    assert!(
        allocated(&out) < size - (30 << 20),
        "export is not sparse: {} bytes allocated",
        allocated(&out)
    );

    // An existing file is not overwritten by accident.
    assert!(d
        .fails(&["vdisk", "export", "p/img", out.to_str().unwrap()])
        .contains("--overwrite"));
    let job = d.json(&["vdisk", "export", "p/img", out.to_str().unwrap(), "--overwrite"]);
    assert_eq!(job["state"], "succeeded");
    // Nor, even with --overwrite, a disk of a pool (a wrong device name), nor a file of the
    // daemon's own state: the pool reads back whole after the refusals.
    let pool_disk = t.path().join("disks").join("d0.img");
    let head = |p: &std::path::Path| {
        let mut b = vec![0u8; 1 << 20];
        std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(p).unwrap(), &mut b, 0).unwrap();
        b
    };
    let before = head(&pool_disk);
    let e = d.fails(&["vdisk", "export", "p/img", pool_disk.to_str().unwrap(), "--overwrite"]);
    assert!(e.contains("a disk of Tessera pool 'p'"), "{e}");
    assert!(head(&pool_disk) == before, "the refusal changed the disk");
    let inside = t.path().join("state").join("pools").join("x.img");
    let e = d.fails(&["vdisk", "export", "p/img", inside.to_str().unwrap(), "--overwrite"]);
    assert!(e.contains("inside the daemon's state directory"), "{e}");
    assert!(!inside.exists());

    // Importing into an existing, smaller vdisk is refused; a missing image too.
    d.ok(&["vdisk", "create", "p/small", "--size", "1M"]);
    assert!(d
        .fails(&["vdisk", "import", "p/small", img.to_str().unwrap()])
        .contains("larger than vdisk"));
    assert!(d
        .fails(&["vdisk", "import", "p/small", "/no/such.img"])
        .contains("/no/such.img"));
    // A snapshot takes no import: refused before the job starts, not as a failed job.
    d.ok(&["snapshot", "create", "p/small@s"]);
    let e = d.fails(&["vdisk", "import", "p/small@s", img.to_str().unwrap()]);
    assert!(e.contains("is a snapshot"), "{e}");
    // An import that would make its vdisk is refused before it is made: none is left behind
    // (a fixed one would have kept its space reserved).
    let capacity = d.json(&["pool", "show", "p"])["capacity"].clone();
    let e = d.fails(&[
        "vdisk",
        "import",
        "p/made",
        img.to_str().unwrap(),
        "--size",
        "1M",
        "--layout",
        "simple",
        "--provisioning",
        "fixed",
    ]);
    assert!(e.contains("larger than the size asked for"), "{e}");
    assert!(d.fails(&["vdisk", "show", "p/made"]).contains("no vdisk 'made'"));
    assert_eq!(d.json(&["pool", "show", "p"])["capacity"], capacity);
    let r = d.http(
        "POST",
        "/api/pools/p/vdisks/made/import",
        Some(&format!(
            "{{\"path\": \"{}\", \"create\": {{\"name\": \"made\", \"size\": 0, \"block_size\": 0}}}}",
            img.display()
        )),
    );
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_argument"), "{}", r.body);
    assert!(d.fails(&["vdisk", "show", "p/made"]).contains("no vdisk 'made'"));
    // Nor is a file of the daemon's own state read into a vdisk (its keys, its pools'
    // metadata), named as it is or through a link.
    let own = t.path().join("state").join("own.bin");
    std::fs::write(&own, vec![1u8; 4096]).unwrap();
    let link = t.path().join("own-link.img");
    std::os::unix::fs::symlink(&own, &link).unwrap();
    for p in [&own, &link] {
        let e = d.fails(&["vdisk", "import", "p/small", p.to_str().unwrap()]);
        assert!(e.contains("inside the daemon's state directory"), "{e}");
    }

    // Import over existing data: zero runs in the image must read back as zeros.
    let job = d.json(&["vdisk", "import", "p/img", img.to_str().unwrap()]);
    assert_eq!(job["state"], "succeeded");
    d.ok(&["vdisk", "export", "p/img", out.to_str().unwrap(), "--overwrite"]);
    assert!(read_back_matches(&img, &out));

    let e = d.fails(&[
        "vdisk",
        "export",
        "p/img",
        out.to_str().unwrap(),
        "--overwrite",
        "--rate",
        "0",
    ]);
    assert!(e.contains("a rate limit of 0 would never finish"), "{e}");
    // Held to its rate: 14 MiB of data at 8 MiB/s take more than a second (the first read
    // goes at once), and the image is the vdisk all the same.
    let small = t.path().join("paced.img");
    random_image(&small, 16 << 20, 7);
    d.json(&["vdisk", "import", "p/paced", small.to_str().unwrap()]);
    let paced = t.path().join("paced-out.img");
    let started = std::time::Instant::now();
    d.ok(&["vdisk", "export", "p/paced", paced.to_str().unwrap(), "--rate", "8M"]);
    let took = started.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(1),
        "not held to its rate: {took:?}"
    );
    assert!(read_back_matches(&small, &paced));
    // An export cancelled part way leaves no file that looks like an image (a sparse file has
    // its full size from the start), and the image it was to replace as it was.
    let before = std::fs::read(&paced).unwrap();
    let fresh = t.path().join("cancelled.img");
    for (to, overwrite) in [(&paced, true), (&fresh, false)] {
        let mut args = vec![
            "vdisk",
            "export",
            "p/paced",
            to.to_str().unwrap(),
            "--rate",
            "1M",
            "--no-wait",
        ];
        if overwrite {
            args.push("--overwrite");
        }
        let id = d.json(&args)["id"].as_u64().unwrap().to_string();
        d.ok(&["job", "cancel", &id]);
        assert!(d.fails(&["job", "wait", &id]).contains("cancelled"));
    }
    assert!(!fresh.exists(), "a cancelled export left a file at its name");
    assert!(
        std::fs::read(&paced).unwrap() == before,
        "a cancelled export changed the image it was to replace"
    );
    let partial: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with(".tessera-partial-"))
        .collect();
    assert!(partial.is_empty(), "left behind: {partial:?}");
    d.ok(&["vdisk", "delete", "p/paced"]);
    // --no-wait returns a running (or finished) job at once; job wait follows it.
    let job = d.json(&[
        "vdisk",
        "export",
        "p/img",
        out.to_str().unwrap(),
        "--overwrite",
        "--no-wait",
    ]);
    let id = job["id"].as_u64().unwrap().to_string();
    let done = d.json(&["job", "wait", &id]);
    assert_eq!(done["state"], "succeeded");
    assert!(d.ok(&["job", "list"]).contains("export"));
    assert_eq!(d.json(&["job", "show", &id])["kind"], "export");
    assert!(d.fails(&["job", "cancel", &id]).contains("already finished"));
    assert!(d.fails(&["job", "show", "999"]).contains("no job 999"));
    assert!(d.json(&["pool", "check", "p"])["problems"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// With `data_paths` configured, the API makes pools' disks of, and reads and writes images
/// in, those places only, checked on the file opened (a link inside leads nowhere outside);
/// the daemon's own state is never a disk nor an image. A refusal changes nothing.
#[test]
fn the_api_names_data_only_where_the_configuration_lets_it() {
    let t = tempfile::tempdir().unwrap();
    let san = t.path().join("san");
    let inside = disks(&san, 4, 256 << 20);
    let outside = disks(&t.path().join("elsewhere"), 1, 256 << 20);
    let state = t.path().join("state");
    // The state directory listed too, by mistake: its files are refused all the same.
    let d = Daemon::start_configured(
        &state,
        &format!("data_paths = [\"{}\", \"{}\"]\n", san.display(), state.display()),
    );
    let head = |p: &str| {
        let mut b = vec![0u8; 1 << 20];
        std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(p).unwrap(), &mut b, 0).unwrap();
        b
    };
    let link = san.join("link.img");
    std::os::unix::fs::symlink(&outside[0], &link).unwrap();
    let link = link.display().to_string();
    let own = state.join("pools").join("big.img");
    std::fs::File::create(&own).unwrap().set_len(256 << 20).unwrap();
    let own = own.display().to_string();
    let before = head(&outside[0]);
    for (bad, why) in [
        (&outside[0], "outside the places"),
        (&link, "outside the places"),
        (&own, "inside the daemon's state directory"),
    ] {
        let e = d.fails(&["pool", "create", "p", "--disk", &inside[0], "--disk", bad]);
        assert!(
            e.contains(why) && e.contains("data_paths") == (why != "inside the daemon's state directory"),
            "{bad}: {e}"
        );
        let e = d.fails(&["pool", "create", "p", "--disk", &inside[0], "--cache-disk", bad]);
        assert!(e.contains(why), "{bad}: {e}");
    }
    assert!(head(&outside[0]) == before, "a refusal changed the disk");
    assert!(d.json(&["pool", "list"]).as_array().unwrap().is_empty());

    create_pool(&d, "p", &inside[..2]);
    for bad in [&outside[0], &link, &own] {
        let e = d.fails(&["disk", "add", "p", bad]);
        assert!(
            e.contains("outside the places") || e.contains("state directory"),
            "{bad}: {e}"
        );
    }
    d.ok(&["disk", "add", "p", &inside[2]]);
    assert!(head(&outside[0]) == before, "a refusal changed the disk");

    // Images: nothing read from outside (a file any local user could not read), nothing
    // written there.
    let e = d.fails(&["vdisk", "import", "p/x", "/etc/shadow", "--layout", "simple"]);
    assert!(e.contains("outside the places"), "{e}");
    let e = d.fails(&["vdisk", "import", "p/x", &link, "--layout", "simple"]);
    assert!(e.contains("outside the places"), "{e}");
    let img = san.join("in.img");
    random_image(&img, 4 << 20, 5);
    let job = d.json(&["vdisk", "import", "p/x", img.to_str().unwrap(), "--layout", "simple"]);
    assert_eq!(job["state"], "succeeded", "{job}");
    let out = t.path().join("elsewhere").join("out.img");
    let e = d.fails(&["vdisk", "export", "p/x", out.to_str().unwrap()]);
    assert!(e.contains("outside the places"), "{e}");
    assert!(!out.exists(), "the refused export left a file");
    let out = san.join("out.img");
    let job = d.json(&["vdisk", "export", "p/x", out.to_str().unwrap()]);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(same_file(&img, &out));

    // Nor is a file outside read as a pool's Ceph configuration (librados would tell what is
    // in it), whether the pool is made or imported.
    let own = state.join("events.jsonl").display().to_string();
    for (conf, why) in [
        ("/etc/shadow", "outside the places"),
        (&own, "inside the daemon's state directory"),
    ] {
        let create = [
            "pool",
            "create",
            "r",
            "--rados",
            "rbd",
            "--capacity",
            "1G",
            "--ceph-conf",
            conf,
        ];
        let import = ["pool", "import", "r", "--rados", "rbd", "--ceph-conf", conf];
        for args in [&create[..], &import[..]] {
            let e = d.fails(args);
            assert!(e.contains(why), "{args:?}: {e}");
        }
    }
}

/// Where the configuration lists the RADOS pools and Ceph clients the API may use, a pool on
/// RADOS is neither made in nor imported from another, nor reached as another client (the
/// default, admin, included): refused before anything connects to the cluster.
#[test]
fn the_api_reaches_only_the_rados_pools_and_clients_the_configuration_lists() {
    let t = tempfile::tempdir().unwrap();
    let e = Daemon::start_with(
        &t.path().join("bad"),
        &["--config", &{
            let c = t.path().join("bad.toml");
            std::fs::write(&c, "rados_pools = [\"\"]\n").unwrap();
            c.display().to_string()
        }],
    )
    .err()
    .expect("an empty name is refused");
    assert!(e.contains("rados_pools: '' is not a name"), "{e}");
    // A pool on RADOS exported from here before: its directory says where it lives.
    let state = t.path().join("state");
    let old = state.join("pools").join("old");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(
        old.join("rados.json"),
        r#"{"rados_pool": "rbd", "ceph_conf": "/etc/ceph/ceph.conf", "client_name": "gw"}"#,
    )
    .unwrap();
    let d = Daemon::start_configured(&state, "rados_pools = [\"tessera\"]\nrados_clients = [\"gw\"]\n");
    let e = d.fails(&["pool", "import", "old"]);
    assert!(e.contains("RADOS pool 'rbd' is not one"), "{e}");
    for (pool, client, why) in [
        ("rbd", "gw", "RADOS pool 'rbd' is not one"),
        ("tessera", "admin", "Ceph client 'admin' is not one"),
        ("tessera", "", "Ceph client 'admin' is not one"),
    ] {
        let mut create = vec!["pool", "create", "r", "--rados", pool, "--capacity", "1G"];
        let mut import = vec!["pool", "import", "r", "--rados", pool];
        if !client.is_empty() {
            create.extend(["--client-name", client]);
            import.extend(["--client-name", client]);
        }
        for args in [&create, &import] {
            let e = d.fails(args);
            assert!(e.contains(why), "{args:?}: {e}");
        }
    }
}

#[test]
fn failed_disk_is_repaired_by_a_job_with_data_intact() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    let disks = disks(&t.path().join("disks"), 4, 1 << 30);
    create_pool(&d, "r", &disks);
    // The repairs here are the administrator's (tests/auto_repair.rs has the daemon's own).
    assert!(d
        .ok(&["pool", "auto-repair", "r", "off"])
        .contains("automatic repair off"));
    let img = t.path().join("in.img");
    random_image(&img, 96 << 20, 2);
    d.ok(&[
        "vdisk",
        "import",
        "r/m",
        img.to_str().unwrap(),
        "--layout",
        "mirror",
        "--columns",
        "1",
    ]);
    d.ok(&[
        "vdisk",
        "import",
        "r/q",
        img.to_str().unwrap(),
        "--layout",
        "parity",
        "--columns",
        "3",
    ]);

    // Fail the disk holding the most data, by path.
    let list = d.json(&["disk", "list", "r"]);
    let victim = busiest_disk(&d, "r");
    let failed = d.json(&["disk", "fail", "r", &victim]);
    assert_eq!(failed["state"], "failed");
    let show = d.json(&["pool", "show", "r"]);
    assert_eq!(show["health"], "degraded");
    assert!(show["repair_needed_bytes"].as_u64().unwrap() > 0);
    assert!(d.ok(&["pool", "show", "r"]).contains("pool repair r"));

    // Degraded reads still give the data.
    let out = t.path().join("out.img");
    d.ok(&["vdisk", "export", "r/q", out.to_str().unwrap()]);
    assert!(same_file(&img, &out));

    let job = d.json(&["pool", "repair", "r", "--rate", "1G"]);
    assert_eq!(job["kind"], "repair");
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(job["result"]["slabs_rebuilt"].as_u64().unwrap() > 0);
    let show = d.json(&["pool", "show", "r"]);
    assert_eq!(show["health"], "healthy", "{show}");
    assert_eq!(show["repair_needed_bytes"], 0);
    assert!(show["unhealthy_sets"].as_array().unwrap().is_empty());

    for v in ["r/m", "r/q"] {
        d.ok(&["vdisk", "export", v, out.to_str().unwrap(), "--overwrite"]);
        assert!(same_file(&img, &out), "{v} differs after repair");
    }
    assert!(d.json(&["pool", "check", "r"])["problems"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(d.fails(&["disk", "fail", "r", "no-such-disk"]).contains("no disk"));

    // A new disk, then a retired disk is emptied onto it by the next repair.
    let extra = common::disks(&t.path().join("more"), 1, 1 << 30);
    let added = d.json(&["disk", "add", "r", &extra[0]]);
    assert_eq!(added["state"], "healthy");
    assert!(d.fails(&["disk", "add", "r", &extra[0]]).contains(&extra[0]));
    let keep = list.as_array().unwrap().iter().find(|x| x["path"] != victim).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(d.json(&["disk", "retire", "r", &keep])["state"], "retired");
    d.ok(&["pool", "repair", "r"]);
    let disks_now = d.json(&["disk", "list", "r"]);
    let retired = disks_now
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == keep.as_str())
        .unwrap();
    assert_eq!(retired["slabs_used"], 0, "{retired}");
    d.ok(&["vdisk", "export", "r/m", out.to_str().unwrap(), "--overwrite"]);
    assert!(same_file(&img, &out));
}

#[test]
fn sigkill_and_restart_keep_state_and_data() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    create_pool(&d, "k", &disks(&t.path().join("disks"), 3, 1 << 30));
    let img = t.path().join("in.img");
    random_image(&img, 64 << 20, 3);
    d.ok(&["vdisk", "import", "k/a", img.to_str().unwrap(), "--layout", "mirror"]);
    d.ok(&["vdisk", "create", "k/b", "--size", "1G", "--layout", "simple"]);

    // A second daemon on the same state directory is refused, and the first one is unharmed.
    let e = Daemon::refused(&state, &["--api-listen", "none"]);
    assert!(e.contains("another tessera daemon"), "{e}");
    assert_eq!(d.json(&["vdisk", "list"]).as_array().unwrap().len(), 2);

    d.kill9();
    let mut d = Daemon::start(&state);
    let list = d.json(&["vdisk", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    let out = t.path().join("out.img");
    d.ok(&["vdisk", "export", "k/a", out.to_str().unwrap()]);
    assert!(same_file(&img, &out));
    assert!(d.json(&["pool", "check", "k"])["problems"]
        .as_array()
        .unwrap()
        .is_empty());

    // A clean stop and start, too; an exported pool stays exported across restarts.
    d.ok(&["vdisk", "delete", "k/b"]);
    d.stop();
    let mut d = Daemon::start(&state);
    assert_eq!(d.json(&["vdisk", "list"]).as_array().unwrap().len(), 1);
    d.ok(&["pool", "export", "k"]);
    d.stop();
    let d = Daemon::start(&state);
    assert_eq!(d.json(&["pool", "list"]).as_array().unwrap().len(), 0);
    d.ok(&["pool", "import", "k"]);
    assert_eq!(d.json(&["vdisk", "list"]).as_array().unwrap().len(), 1);
}

/// A vdisk record the store cannot read (a damaged store) leaves that vdisk out of the pool,
/// which the daemon imports and serves all the same, and says so in `pool show`; the record
/// put back brings the vdisk back with its data.
#[test]
fn a_vdisk_whose_record_cannot_be_read_is_left_out_and_named() {
    use tessera_pool::{MetaBatch, MetaStore, CF_VDISKS};
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    create_pool(&d, "k", &disks(&t.path().join("disks"), 3, 1 << 30));
    let img = t.path().join("in.img");
    random_image(&img, 16 << 20, 5);
    d.ok(&["vdisk", "import", "k/a", img.to_str().unwrap(), "--layout", "mirror"]);
    d.ok(&["vdisk", "import", "k/b", img.to_str().unwrap(), "--layout", "mirror"]);
    d.stop();

    let meta_dir = state.join("pools/k/meta");
    let (key, record) = {
        let meta = MetaStore::open(&meta_dir).unwrap();
        let mut found = None;
        meta.for_each_prefix(CF_VDISKS, &[], |k, v| {
            let c: serde_json::Value = serde_json::from_slice(v).unwrap();
            if c["name"] == "b" {
                found = Some((k.to_vec(), v.to_vec()));
            }
            Ok(())
        })
        .unwrap();
        let (key, record) = found.unwrap();
        let mut batch = MetaBatch::new();
        batch.put(CF_VDISKS, &key, &b"{\"name\": \"b\", \"si"[..]);
        meta.commit(batch, true).unwrap();
        (key, record)
    };
    let mut d = Daemon::start(&state);
    let names: Vec<String> = d
        .json(&["vdisk", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["a"]);
    let show = d.ok(&["pool", "show", "k"]);
    assert!(show.contains("cannot be read") && show.contains("left out"), "{show}");
    let out = t.path().join("out.img");
    d.ok(&["vdisk", "export", "k/a", out.to_str().unwrap()]);
    assert!(same_file(&img, &out));
    d.stop();

    let meta = MetaStore::open(&meta_dir).unwrap();
    let mut batch = MetaBatch::new();
    batch.put(CF_VDISKS, &key, record);
    meta.commit(batch, true).unwrap();
    drop(meta);
    let d = Daemon::start(&state);
    d.ok(&["vdisk", "export", "k/b", out.to_str().unwrap(), "--overwrite"]);
    assert!(same_file(&img, &out));
    assert!(d.json(&["pool", "check", "k"])["problems"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn concurrent_clients() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "c", &disks(&t.path().join("disks"), 4, 1 << 30));
    std::thread::scope(|s| {
        for i in 0..6 {
            let d = &d;
            s.spawn(move || {
                for j in 0..5 {
                    let name = format!("c/v{i}-{j}");
                    d.ok(&[
                        "vdisk",
                        "create",
                        &name,
                        "--size",
                        "64M",
                        "--layout",
                        if j % 2 == 0 { "mirror" } else { "parity" },
                    ]);
                    d.ok(&["vdisk", "resize", &name, "--size", "128M"]);
                    d.json(&["pool", "show", "c"]);
                    if j % 2 == 1 {
                        d.ok(&["vdisk", "delete", &name]);
                    }
                }
            });
        }
        // And a client that keeps trying a name everyone else might take.
        s.spawn(|| {
            let mut created = 0;
            for _ in 0..10 {
                if d.cli(&["vdisk", "create", "c/shared", "--size", "64M"]).success {
                    created += 1;
                }
            }
            assert_eq!(created, 1);
        });
    });
    let list = d.json(&["vdisk", "list", "c"]);
    assert_eq!(list.as_array().unwrap().len(), 6 * 3 + 1);
    assert!(list
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["name"] != "shared")
        .all(|v| v["size"] == 128u64 << 20));
    assert!(d.json(&["pool", "check", "c"])["problems"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn api_errors_are_json_with_stable_codes() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "e", &disks(&t.path().join("disks"), 2, 1 << 30));

    let r = d.http("POST", "/api/pools/e/vdisks", Some("{\"name\": \"x\", \"size\": "));
    assert_eq!((r.status, r.code().as_str()), (400, "malformed_request"), "{}", r.body);
    let r = d.http(
        "POST",
        "/api/pools/e/vdisks",
        Some("{\"name\": \"x\", \"size\": 1048576, \"colour\": 1}"),
    );
    assert_eq!(r.code(), "malformed_request");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("colour"));
    let r = d.http("POST", "/api/pools/e/vdisks", Some("{\"name\": \"x\", \"size\": -5}"));
    assert_eq!(r.code(), "malformed_request");
    let r = d.http("POST", "/api/pools/e/vdisks", Some("[1,2,3]"));
    assert_eq!(r.code(), "malformed_request");
    let r = d.http("POST", "/api/pools/e/vdisks", None);
    assert_eq!(r.code(), "malformed_request");
    let r = d.http("POST", "/api/pools/e/repair", Some("{\"parallel\": 0}"));
    assert_eq!(r.code(), "invalid_argument");
    let r = d.http("POST", "/api/pools/e/repair", Some("not json"));
    assert_eq!(r.code(), "malformed_request");
    let r = d.http("GET", "/api/nope", None);
    assert_eq!((r.status, r.code().as_str()), (404, "no_such_route"));
    let r = d.http("PUT", "/api/pools", None);
    assert_eq!((r.status, r.code().as_str()), (405, "method_not_allowed"));
    let r = d.http("GET", "/api/jobs/abc", None);
    assert_eq!(r.code(), "invalid_argument");
    // A name that is no text once decoded is refused in JSON too.
    let r = d.http("GET", "/api/pools/%FF", None);
    assert_eq!((r.status, r.code().as_str()), (400, "malformed_request"), "{}", r.body);
    // A request for a job may wait for its end: it answers once the job ended.
    let image = t.path().join("image.raw");
    std::fs::write(&image, vec![0x5Au8; 64 << 20]).unwrap();
    let body = format!(
        "{{\"path\": \"{}\", \"create\": {{\"name\": \"img\", \"size\": 67108864}}}}",
        image.display()
    );
    let r = d.http("POST", "/api/pools/e/vdisks/img/import", Some(&body));
    assert_eq!(r.status, 202, "{}", r.body);
    let id = r.json()["id"].as_u64().unwrap();
    let r = d.http("GET", &format!("/api/jobs/{id}?wait=30"), None);
    assert_eq!(
        r.json()["state"],
        "succeeded",
        "the answer came before the end: {}",
        r.body
    );
    for bad in ["wait=-1", "wait=31", "wait=soon", "wait=NaN", "tail=1"] {
        let r = d.http("GET", &format!("/api/jobs/{id}?{bad}"), None);
        assert_eq!(r.code(), "invalid_argument", "{bad}: {}", r.body);
    }
    let r = d.http("GET", "/api/pools/zzz", None);
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
    let r = d.http(
        "POST",
        "/api/pools/e/vdisks",
        Some("{\"name\": \"x\", \"size\": 1099511627776000, \"provisioning\": \"fixed\"}"),
    );
    assert_eq!((r.status, r.code().as_str()), (507, "no_space"), "{}", r.body);
    let r = d.http(
        "POST",
        "/api/pools/e/vdisks",
        Some("{\"name\": \"x\", \"size\": 1048576}"),
    );
    assert_eq!(r.status, 201);
    let r = d.http(
        "POST",
        "/api/pools/e/vdisks",
        Some("{\"name\": \"x\", \"size\": 1048576}"),
    );
    assert_eq!((r.status, r.code().as_str()), (409, "already_exists"));
    let r = d.http("POST", "/api/pools/e/disks/nope/explode", None);
    assert_eq!(r.code(), "not_found");
    // The daemon is unharmed by all of it.
    assert_eq!(d.http("GET", "/api/health", None).status, 200);
    assert!(d.json(&["pool", "check", "e"])["problems"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn openapi_lists_every_route_and_the_router_serves_them() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    let doc = d.http("GET", "/api/openapi.json", None).json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 15);
    let mut n = 0;
    for (path, ops) in paths {
        for method in ops.as_object().unwrap().keys() {
            let concrete = path
                .replace("{pool}", "nopool")
                .replace("{vdisk}", "novdisk")
                .replace("{disk}", "nodisk")
                .replace("{action}", "fail")
                .replace("{id}", "424242")
                .replace("{iqn}", "iqn.2026-11.io.example:none")
                .replace("{lun}", "0")
                .replace("{initiator}", "iqn.2026-11.io.example:host");
            // A stream would never end: a query it refuses shows the route is served.
            let concrete = if path.ends_with("/stream") {
                format!("{concrete}?severity=none-such")
            } else {
                concrete
            };
            let body = (method == "post" || method == "put").then_some("{}");
            let r = d.http(&method.to_uppercase(), &concrete, body);
            let code = if r.status >= 400 { r.code() } else { String::new() };
            assert!(
                code != "no_such_route" && code != "method_not_allowed",
                "{method} {path}: {}",
                r.body
            );
            n += 1;
        }
    }
    assert!(n >= 20, "only {n} operations documented");
}

/// The TCP address a daemon's banner names for its API.
fn api_addr(d: &Daemon) -> String {
    let banner = d.stdout();
    banner
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no TCP address in the banner: {banner}"))
        .replace("0.0.0.0", "127.0.0.1")
}

#[test]
fn tcp_listener_and_tokens() {
    let t = tempfile::tempdir().unwrap();
    let token = "s3cret-token-0123456789";
    let d = Daemon::start_with(
        &t.path().join("s2"),
        &["--api-listen", "0.0.0.0:0", "--api-token", token],
    )
    .unwrap();
    let addr = api_addr(&d);
    let r = http_tcp(&addr, "GET", "/api/pools", None, &[]).unwrap();
    assert_eq!((r.status, r.code().as_str()), (401, "unauthorized"));
    // A wrong token is answered only after a while: guessing is slow.
    let asked = std::time::Instant::now();
    let r = http_tcp(
        &addr,
        "GET",
        "/api/pools",
        None,
        &[("Authorization", "Bearer wrong-token-0123456789")],
    )
    .unwrap();
    assert_eq!(r.status, 401);
    assert!(
        asked.elapsed() >= std::time::Duration::from_millis(200),
        "{:?}",
        asked.elapsed()
    );
    let r = http_tcp(
        &addr,
        "GET",
        "/api/pools",
        None,
        &[("Authorization", &format!("Bearer {token}"))],
    )
    .unwrap();
    assert_eq!(r.status, 200);
    // The CLI over TCP, with and without the token.
    let api = format!("http://{addr}");
    let o = Daemon::cli_at(&api, None, &["pool", "list"]);
    assert!(!o.success && o.stderr.contains("bearer token"), "{}", o.stderr);
    let o = Daemon::cli_at(&api, Some(token), &["pool", "list"]);
    assert!(o.success, "{}", o.stderr);
    // The unix socket needs no token: its permissions guard it.
    assert_eq!(d.http("GET", "/api/pools", None).status, 200);
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&d.sock).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}

/// The viewer token reads everything and changes nothing, by bearer or by a dashboard login;
/// the metrics token does not log in.
#[test]
fn the_viewer_token_reads_and_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("s");
    let d = Daemon::start_on_tcp(&state, "", "admin-token-0123456789");
    create_pool(&d, "p", &disks(&t.path().join("disks"), 1, 256 << 20));
    let addr = api_addr(&d);
    let viewer = std::fs::read_to_string(state.join("viewer-token"))
        .unwrap()
        .trim()
        .to_string();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(state.join("viewer-token")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let bearer = format!("Bearer {viewer}");
    let by_viewer = [("Authorization", bearer.as_str())];
    for path in ["/api/pools", "/api/pools/p", "/api/events", "/metrics", "/"] {
        let r = http_tcp(&addr, "GET", path, None, &by_viewer).unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    let body = r#"{"name": "v", "size": 1048576}"#;
    let changes = [
        ("POST", "/api/pools/p/vdisks", Some(body)),
        ("DELETE", "/api/pools/p", None),
        ("POST", "/api/pools/p/scrub", None),
        ("PUT", "/api/pools/p/dedup", Some("{}")),
    ];
    let refused = |r: &Resp, what: &str| {
        assert_eq!((r.status, r.code().as_str()), (403, "forbidden"), "{what}: {}", r.body);
        assert!(r.body.contains("only reads"), "{what}: {}", r.body);
    };
    for (method, path, body) in changes {
        refused(&http_tcp(&addr, method, path, body, &by_viewer).unwrap(), path);
    }
    assert!(d.json(&["vdisk", "list", "p"]).as_array().unwrap().is_empty());
    assert_eq!(d.json(&["pool", "show", "p"])["name"], "p", "the pool is still there");

    // A dashboard login with it reads and does not change either.
    let r = http_tcp(&addr, "POST", "/ui/login", Some(&format!("token={viewer}")), &[]).unwrap();
    assert_eq!(r.status, 303, "{}", r.body);
    let cookie = r.header("set-cookie").unwrap().split(';').next().unwrap().to_string();
    let key = r
        .header("location")
        .unwrap()
        .strip_prefix("/#key=")
        .unwrap()
        .to_string();
    let session = [("Cookie", cookie.as_str()), ("x-tessera-key", key.as_str())];
    assert_eq!(
        http_tcp(&addr, "GET", "/api/pools", None, &session).unwrap().status,
        200
    );
    refused(
        &http_tcp(&addr, "POST", "/api/pools/p/vdisks", Some(body), &session).unwrap(),
        "session",
    );
    assert_eq!(
        http_tcp(&addr, "POST", "/ui/logout", None, &session).unwrap().status,
        303
    );
    assert_eq!(
        http_tcp(&addr, "GET", "/api/pools", None, &session).unwrap().status,
        401,
        "logged out"
    );

    // The metrics token reads the metrics, and does not log in.
    let scrape = std::fs::read_to_string(state.join("metrics-token"))
        .unwrap()
        .trim()
        .to_string();
    let r = http_tcp(&addr, "POST", "/ui/login", Some(&format!("token={scrape}")), &[]).unwrap();
    assert_eq!(r.status, 401);
    let by_scraper = format!("Bearer {scrape}");
    let r = http_tcp(&addr, "GET", "/api/pools", None, &[("Authorization", &by_scraper)]).unwrap();
    assert_eq!(r.status, 401);
}

/// Behind a TLS proxy the browser's pages come from the proxy's origin: once configured, the
/// dashboard's login and API requests from it are taken, and no other site's.
#[test]
fn a_configured_proxy_origin_may_use_the_dashboard() {
    let t = tempfile::tempdir().unwrap();
    let token = "proxy-token-0123456789";
    let cfg = "api_allowed_hosts = [\"san.example\"]\napi_public_origins = [\"https://san.example\"]\n";
    let d = Daemon::start_on_tcp(&t.path().join("s"), cfg, token);
    let addr = api_addr(&d);
    // As nginx forwards them (proxy_set_header Host $host).
    let proxied = |method: &str, path: &str, body: Option<&str>, origin: &str, extra: &[(&str, &str)]| {
        let mut h = vec![("Host", "san.example"), ("Origin", origin)];
        h.extend_from_slice(extra);
        http_tcp(&addr, method, path, body, &h).unwrap()
    };
    let login = format!("token={token}");
    let r = proxied("POST", "/ui/login", Some(&login), "https://san.example", &[]);
    assert_eq!(r.status, 303, "{}", r.body);
    let bearer = format!("Bearer {token}");
    let auth = [("Authorization", bearer.as_str())];
    assert_eq!(
        proxied("GET", "/api/pools", None, "https://san.example", &auth).status,
        200
    );
    for other in ["https://evil.example", "http://san.example", "https://san.example:8443"] {
        let r = proxied("GET", "/api/pools", None, other, &auth);
        assert_eq!(r.status, 403, "{other}: {}", r.body);
        let r = proxied("POST", "/ui/login", Some(&login), other, &[]);
        assert_eq!(r.status, 403, "{other}: {}", r.body);
    }
}

/// A loopback listener is not open to every local user or to web pages: it needs the token
/// the daemon made in its state directory, a Host that names it, and no foreign Origin.
#[test]
fn a_loopback_listener_needs_the_token_a_host_naming_it_and_no_foreign_origin() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("s");
    let d = Daemon::start_with(&state, &["--api-listen", "127.0.0.1:0"]).unwrap();
    let addr = api_addr(&d);
    let file = state.join("api-token");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the token file is the owner's alone");
    let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
    assert!(token.len() >= 32);
    let bearer = format!("Bearer {token}");
    // No token: refused, whatever the route (importing /etc/shadow into a vdisk, say).
    let r = http_tcp(&addr, "GET", "/api/pools", None, &[]).unwrap();
    assert_eq!(r.status, 401);
    let r = http_tcp(
        &addr,
        "POST",
        "/api/pools/p/vdisks/v/import",
        Some(r#"{"path": "/etc/shadow"}"#),
        &[],
    )
    .unwrap();
    assert_eq!(r.status, 401);
    assert_eq!(
        http_tcp(&addr, "GET", "/api/pools", None, &[("Authorization", &bearer)])
            .unwrap()
            .status,
        200
    );
    // DNS rebinding: a name that is not the listener's, even with the token.
    let port = addr.rsplit(':').next().unwrap();
    let rebound = format!("attacker.example:{port}");
    let r = http_tcp(
        &addr,
        "GET",
        "/api/pools",
        None,
        &[("Authorization", &bearer), ("Host", &rebound)],
    )
    .unwrap();
    assert_eq!(r.status, 421, "{}", r.body);
    let local = format!("localhost:{port}");
    let r = http_tcp(
        &addr,
        "GET",
        "/api/pools",
        None,
        &[("Authorization", &bearer), ("Host", &local)],
    )
    .unwrap();
    assert_eq!(r.status, 200);
    // A web page of another origin.
    let r = http_tcp(
        &addr,
        "POST",
        "/api/pools/p/export",
        None,
        &[("Authorization", &bearer), ("Origin", "http://attacker.example")],
    )
    .unwrap();
    assert_eq!(r.status, 403, "{}", r.body);
    let own = format!("http://{addr}");
    let r = http_tcp(
        &addr,
        "GET",
        "/api/pools",
        None,
        &[("Authorization", &bearer), ("Origin", &own)],
    )
    .unwrap();
    assert_eq!(r.status, 200);
    // The CLI finds the token in the state directory it is given, when it may read it.
    let o = Command::new(BIN)
        .args(["--api", &own, "--state-dir", state.to_str().unwrap(), "pool", "list"])
        .env_remove("TESSERA_TOKEN")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The same token after a restart.
    drop(d);
    let d = Daemon::start_with(&state, &["--api-listen", "127.0.0.1:0"]).unwrap();
    let addr = api_addr(&d);
    assert_eq!(
        http_tcp(&addr, "GET", "/api/pools", None, &[("Authorization", &bearer)])
            .unwrap()
            .status,
        200
    );
}

#[test]
fn bad_configuration_is_refused_with_the_reason() {
    let t = tempfile::tempdir().unwrap();
    let cfg = t.path().join("tessera.toml");
    std::fs::write(&cfg, "state_dri = \"/tmp/x\"\n").unwrap();
    let e = Daemon::refused(&t.path().join("s"), &["--config", cfg.to_str().unwrap()]);
    assert!(e.contains("unknown field") && e.contains("state_dri"), "{e}");
    let e = Daemon::refused(&t.path().join("s"), &["--config", "/no/such.toml"]);
    assert!(e.contains("/no/such.toml"), "{e}");

    // A good file; the flag overrides its listen address.
    std::fs::write(&cfg, "api_listen = \"127.0.0.1:1\"\nlog_format = \"json\"\n").unwrap();
    let d = Daemon::start_with(
        &t.path().join("s"),
        &["--config", cfg.to_str().unwrap(), "--api-listen", "none"],
    )
    .unwrap();
    assert!(
        d.logs().lines().any(|l| l.starts_with('{')),
        "no JSON log lines: {}",
        d.logs()
    );

    // A pool the configuration names but which does not exist is reported, not fatal.
    std::fs::write(&cfg, "pools = [\"ghost\"]\n").unwrap();
    drop(d);
    let d = Daemon::start_with(
        &t.path().join("s3"),
        &["--config", cfg.to_str().unwrap(), "--api-listen", "none"],
    )
    .unwrap();
    let pools = d.json(&["pool", "list"]);
    assert_eq!(pools[0]["health"], "unavailable");
    assert!(d.fails(&["vdisk", "list", "ghost"]).contains("could not be imported"));
    drop(d);

    // What the configuration names that cannot be had (an address another program holds, a
    // certificate that is not there) refuses the start before the pools are imported: the
    // pool's metadata, the state files and the event log are as they were.
    let state = t.path().join("s4");
    let mut d = Daemon::start(&state);
    create_pool(&d, "p", &disks(&t.path().join("disks"), 3, 256 << 20));
    d.stop();
    // Every state file, and the start of every disk (where its label is).
    let snapshot = |dir: &std::path::Path| {
        let mut files: Vec<(std::path::PathBuf, Vec<u8>)> = walk(dir)
            .into_iter()
            .chain(walk(&t.path().join("disks")))
            .filter(|p| !p.ends_with("tessera.lock"))
            .map(|p| {
                let mut head = vec![0u8; 1 << 20];
                let n = std::io::Read::read(&mut std::fs::File::open(&p).unwrap(), &mut head).unwrap();
                head.truncate(n);
                (p, head)
            })
            .collect();
        files.sort();
        files
    };
    let before = snapshot(&state);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let e = Daemon::refused(&state, &["--api-listen", &addr]);
    assert!(e.contains("cannot listen") && e.contains(&addr), "{e}");
    std::fs::write(
        &cfg,
        "nbd_tls_cert = \"/no/such/cert.pem\"\nnbd_tls_key = \"/no/such/key.pem\"\nnbd_tls_ca = \"/no/such/ca.pem\"\n",
    )
    .unwrap();
    let e = Daemon::refused(
        &state,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--api-listen",
            "none",
            "--nbd-listen",
            "127.0.0.1:0",
        ],
    );
    assert!(e.contains("/no/such/"), "{e}");
    assert!(snapshot(&state) == before, "the state changed at a refused start");
}

/// Every regular file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.is_file() {
            // Not the sockets.
            out.push(p);
        }
    }
    out
}

#[test]
fn demo_creates_and_reopens_its_pool() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("demo");
    let mut d = Daemon::start_with(&state, &["--demo", "--api-listen", "none"]).unwrap();
    assert!(d.stdout().contains("demo/vol1"), "{}", d.stdout());
    let v = d.json(&["vdisk", "show", "demo/vol1"]);
    assert_eq!(v["size"], 16u64 << 30);
    assert_eq!(v["layout"]["kind"], "mirror");
    assert_eq!(v["layout"]["copies"], 2);
    assert_eq!(v["provisioning"], "thin");
    let p = d.json(&["pool", "show", "demo"]);
    assert_eq!(p["disks"], 4);
    // The two copies of the whole of vol1 fit, and still fit on three disks after a repair:
    // WRITE SAME over the whole LUN must never run out of space.
    let total = p["capacity"]["total_bytes"].as_u64().unwrap();
    assert!(total >= 2 * (16u64 << 30), "{total}");
    assert!(total / 4 * 3 >= 2 * (16u64 << 30), "{total}");
    // The demo's target admits any initiator, and says so.
    assert!(d.stdout().contains("admits any initiator"), "{}", d.stdout());
    // Sparse: the disks take almost no space.
    for i in 0..4 {
        assert!(allocated(&state.join(format!("disks/disk{i}.img"))) < 64 << 20);
    }
    d.stop();
    let d = Daemon::start_with(&state, &["--demo", "--api-listen", "none"]).unwrap();
    assert_eq!(d.json(&["vdisk", "list"]).as_array().unwrap().len(), 1);
}

#[test]
fn missing_and_corrupt_disks_at_start_leave_the_pool_degraded_not_lost() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    let disks = disks(&t.path().join("disks"), 4, 1 << 30);
    create_pool(&d, "m", &disks);
    d.ok(&["pool", "auto-repair", "m", "off"]);
    let img = t.path().join("in.img");
    random_image(&img, 48 << 20, 4);
    d.ok(&[
        "vdisk",
        "import",
        "m/v",
        img.to_str().unwrap(),
        "--layout",
        "mirror",
        "--columns",
        "1",
    ]);
    let used: Vec<String> = d
        .json(&["disk", "list", "m"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["used_bytes"].as_u64().unwrap() > 0)
        .map(|x| x["path"].as_str().unwrap().to_string())
        .collect();
    // A one-column mirror: each slab set sits on two disks. Concurrent first writes of the
    // import may open a second set, so two or four disks hold data.
    assert!(used.len() >= 2, "{used:?}");
    d.stop();

    // One member vanishes while the daemon is down.
    let moved = t.path().join("away.img");
    std::fs::rename(&used[0], &moved).unwrap();
    let mut d = Daemon::start(&state);
    let p = d.json(&["pool", "show", "m"]);
    assert_eq!(p["health"], "degraded", "{p}");
    let missing = p["disk_list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == used[0].as_str())
        .unwrap()
        .clone();
    assert_eq!(missing["state"], "missing");
    assert!(missing["problem"].as_str().unwrap().contains(&used[0]), "{missing}");
    let out = t.path().join("out.img");
    d.ok(&["vdisk", "export", "m/v", out.to_str().unwrap()]);
    assert!(same_file(&img, &out));
    d.stop();

    // It comes back having missed no write (the daemon only read meanwhile): it is taken
    // back as it was, nothing to repair.
    std::fs::rename(&moved, &used[0]).unwrap();
    let mut d = Daemon::start(&state);
    let p = d.json(&["pool", "show", "m"]);
    let back = p["disk_list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == used[0].as_str())
        .unwrap()
        .clone();
    assert_eq!(back["state"], "healthy", "{back}");
    assert_eq!(p["health"], "healthy", "{p}");
    assert_eq!(p["repair_needed_bytes"], 0, "{p}");
    d.stop();

    // The other member's label is overwritten: refused, never written, and the pool still opens.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&used[1]).unwrap();
        f.write_all_at(&[0xAB; 512], 0).unwrap();
    }
    let d = Daemon::start(&state);
    let p = d.json(&["pool", "show", "m"]);
    let bad = p["disk_list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == used[1].as_str())
        .unwrap()
        .clone();
    assert_eq!(bad["state"], "missing", "{bad}");
    assert!(bad["problem"].as_str().is_some());
    d.ok(&["vdisk", "export", "m/v", out.to_str().unwrap(), "--overwrite"]);
    assert!(same_file(&img, &out));
    let mut label = [0u8; 512];
    {
        use std::os::unix::fs::FileExt;
        std::fs::File::open(&used[1])
            .unwrap()
            .read_exact_at(&mut label, 0)
            .unwrap();
    }
    assert!(label.iter().all(|&b| b == 0xAB), "a refused disk was written");
}

/// `tessera pool show | head`: the reader goes away, and the CLI ends quietly as Unix tools
/// do, not with a panic and a backtrace.
#[test]
fn a_closed_pipe_ends_the_cli_quietly() {
    use std::os::fd::FromRawFd;
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "p", &disks(&t.path().join("disks"), 2, 1 << 30));
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // The reading end is closed before the CLI writes anything: its first write meets EPIPE.
    unsafe { libc::close(fds[0]) };
    let out = Command::new(BIN)
        .args(["--api", &format!("unix:{}", d.sock.display()), "pool", "show", "p"])
        .stdout(unsafe { std::process::Stdio::from_raw_fd(fds[1]) })
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "the CLI panicked on a closed pipe: {stderr}"
    );
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}

/// A vdisk deleted while a LUN or an NBD export of it is added, or a pool exported while one of
/// its vdisks is presented, never has both succeed: the LUN or export would be recorded for a
/// vdisk that is gone (and offered at every start), or write a pool that has left.
#[test]
fn a_vdisk_is_never_taken_away_and_presented_at_once() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    create_pool(&d, "p", &disks(&t.path().join("disks"), 1, 1 << 30));
    create_pool(&d, "q", &disks(&t.path().join("q-disks"), 1, 1 << 30));
    let iqn = "iqn.2026-12.org.tessera:races";
    d.ok(&["target", "create", iqn, "--allow-any-initiator"]);
    let present = |vdisk: &str, i: usize| match i % 2 {
        0 => d.http(
            "POST",
            &format!("/api/targets/{iqn}/luns"),
            Some(&format!("{{\"vdisk\": \"{vdisk}\", \"lun\": {i}}}")),
        ),
        _ => d.http(
            "POST",
            "/api/nbd/exports",
            Some(&format!("{{\"vdisk\": \"{vdisk}\", \"name\": \"e{i}\"}}")),
        ),
    };
    let at_once = |take: &(dyn Fn() -> Resp + Sync), give: &(dyn Fn() -> Resp + Sync)| {
        let go = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            let taken = s.spawn(|| {
                go.wait();
                take()
            });
            let given = s.spawn(|| {
                go.wait();
                give()
            });
            (taken.join().unwrap(), given.join().unwrap())
        })
    };
    let mut deleted_and_presented = Vec::new();
    for i in 0..40 {
        let name = format!("v{i}");
        d.ok(&[
            "vdisk",
            "create",
            &format!("p/{name}"),
            "--size",
            "1M",
            "--layout",
            "simple",
        ]);
        let (deleted, presented) = at_once(
            &|| d.http("DELETE", &format!("/api/pools/p/vdisks/{name}"), None),
            &|| present(&format!("p/{name}"), i),
        );
        assert!(
            deleted.status < 500 && presented.status < 500,
            "{} {}",
            deleted.body,
            presented.body
        );
        if deleted.status < 300 && presented.status < 300 {
            deleted_and_presented.push(i);
        }
    }
    assert!(
        deleted_and_presented.is_empty(),
        "deleted and presented at once: {deleted_and_presented:?}"
    );
    // What is recorded names only vdisks that are there.
    let t = d.json(&["target", "show", iqn]);
    for l in t["luns"].as_array().unwrap() {
        assert_eq!(l["online"], true, "a LUN of a deleted vdisk: {l}");
    }
    for e in d.json(&["nbd", "list"]).as_array().unwrap() {
        let v = e["vdisk"].as_str().unwrap();
        assert!(
            d.cli(&["vdisk", "show", v]).success,
            "an export of a deleted vdisk: {e}"
        );
    }

    // A pool exported while a LUN of one of its vdisks is added.
    let mut exported_and_presented = Vec::new();
    for i in 0..12 {
        let name = format!("w{i}");
        d.ok(&[
            "vdisk",
            "create",
            &format!("q/{name}"),
            "--size",
            "1M",
            "--layout",
            "simple",
        ]);
        let (exported, presented) = at_once(&|| d.http("POST", "/api/pools/q/export", None), &|| {
            present(&format!("q/{name}"), 100 + i)
        });
        assert!(
            exported.status < 500 && presented.status < 500,
            "{} {}",
            exported.body,
            presented.body
        );
        if exported.status < 300 {
            if presented.status < 300 {
                exported_and_presented.push(i);
            }
            d.ok(&["pool", "import", "q"]);
        }
        // What was presented goes again, for the next round.
        for l in d.json(&["target", "show", iqn])["luns"].as_array().unwrap() {
            d.ok(&["target", "lun", "remove", iqn, &l["lun"].to_string()]);
        }
        for e in d.json(&["nbd", "list"]).as_array().unwrap() {
            d.ok(&["nbd", "remove", e["name"].as_str().unwrap()]);
        }
    }
    assert!(
        exported_and_presented.is_empty(),
        "exported and presented at once: {exported_and_presented:?}"
    );
}

/// A pool whose creation cannot be recorded in the list of pools to import at start is not
/// made: it would be served until the next start, then silently not be. Its disks are left
/// as they were, and take the pool once the list can be written.
#[test]
fn a_pool_that_cannot_be_recorded_is_not_made() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let mut d = Daemon::start(&state);
    let ds = disks(&t.path().join("disks"), 2, 1 << 30);
    // The list is written through a temporary file beside it: a directory there fails it.
    let blocker = state.join("imported.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let mut args = vec!["pool", "create", "p", "--slab-size", "64M"];
    for p in &ds {
        args.extend(["--disk", p.as_str()]);
    }
    let e = d.fails(&args);
    assert!(e.contains("cannot record the imported pools"), "{e}");
    let e = d.fails(&["pool", "show", "p"]);
    assert!(e.contains("'p'"), "{e}");
    std::fs::remove_dir(&blocker).unwrap();
    create_pool(&d, "p", &ds);
    d.stop();
    let d = Daemon::start(&state);
    assert_eq!(d.json(&["pool", "show", "p"])["name"], "p");
}

/// In either build (with the `rados` feature or without): a pool on RADOS is made by a gateway
/// only, and the options of the two kinds of pool are not mixed.
#[test]
fn a_pool_on_rados_needs_a_gateway_and_says_so() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("state"));
    let e = d.fails(&["pool", "create", "r", "--rados", "rbd", "--capacity", "10G"]);
    assert!(e.contains("needs this daemon to be a gateway"), "{e}");
    let e = d.fails(&["pool", "create", "r", "--disk", "/tmp/x", "--capacity", "10G"]);
    assert!(e.contains("--rados"), "{e}");
    let e = d.fails(&["pool", "import", "r", "--ceph-conf", "/etc/ceph/ceph.conf"]);
    assert!(e.contains("--rados"), "{e}");
}

/// A pool on RADOS whose destruction a stop cut short, at a daemon that is no longer a
/// gateway (its `[gateway]` table gone): the destruction cannot be finished here, which the
/// daemon says at start (critical) and in `pool list` (health `destroying`), and the name is
/// refused, to an export too. `pool destroy --abandon` abandons the destruction without a
/// restart: the mark goes, and what is left of the pool is listed by `pool import`, not
/// destroyed, nor imported here.
/// No cluster is needed: the pool's directory is as such a destruction leaves it.
#[test]
fn a_destruction_that_cannot_be_finished_here_is_listed_and_can_be_abandoned() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let dir = state.join("pools").join("gone");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rados.json"),
        r#"{"rados_pool": "tessera-gone", "ceph_conf": "/etc/ceph/ceph.conf", "client_name": "admin"}"#,
    )
    .unwrap();
    let pool_id = "8d0c8f5e-6a55-4d2e-9a4c-3f6b2a1e7c10";
    std::fs::write(
        dir.join("destroying.json"),
        format!(r#"{{"pool_id": "{pool_id}", "capacity": 4294967296, "epoch": 12}}"#),
    )
    .unwrap();
    let mut d = Daemon::start(&state);
    let events = d.json(&["events", "-n", "100"]);
    let said = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "pool.destroy_unfinished");
    let said = said.unwrap_or_else(|| panic!("{events:#}"));
    assert_eq!(said["severity"], "critical", "{said}");
    assert!(
        said["message"].as_str().unwrap().contains("no longer a gateway"),
        "{said}"
    );
    let listed = pool_entry(&d, "gone");
    assert_eq!(listed["health"], "destroying", "{listed}");
    assert_eq!(listed["id"], pool_id, "{listed}");
    assert_eq!(listed["rados"]["rados_pool"], "tessera-gone", "{listed}");
    let problem = listed["problem"].as_str().unwrap();
    assert!(
        problem.contains("no longer a gateway")
            && problem.contains("[gateway] table back")
            && problem.contains("'tessera pool destroy gone --abandon'"),
        "{listed}"
    );
    let shown = d.ok(&["pool", "show", "gone"]);
    assert!(
        shown.contains("destroying") && shown.contains("being destroyed here"),
        "{shown}"
    );
    // The name stays refused, to a local pool too, and the destruction is not redone.
    let ds = disks(&t.path().join("disks"), 2, 256 << 20);
    let e = d.fails(&["pool", "create", "gone", "--disk", &ds[0], "--disk", &ds[1]]);
    assert!(e.contains("is being destroyed here"), "{e}");
    for args in [["pool", "destroy", "gone"], ["pool", "export", "gone"]] {
        let e = d.fails(&args);
        assert!(
            e.contains("is being destroyed here") && e.contains("'tessera pool destroy gone --abandon' abandons"),
            "{e}"
        );
    }
    assert!(!d.ok(&["pool", "import"]).contains("gone"));
    // Abandoned.
    let out = d.ok(&["pool", "destroy", "gone", "--abandon"]);
    assert!(out.contains("is abandoned"), "{out}");
    assert!(!dir.join("destroying.json").exists());
    assert!(dir.join("rados.json").exists());
    assert!(d.json(&["pool", "list"]).as_array().unwrap().is_empty());
    assert!(d.ok(&["pool", "import"]).contains("gone"));
    let events = d.json(&["events", "-n", "100"]);
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "pool.destroy_abandoned"
                && e["message"].as_str().unwrap().contains("at an administrator's request")),
        "{events:#}"
    );
    // Nothing to abandon any more; and a restart finds no mark.
    let e = d.fails(&["pool", "destroy", "gone", "--abandon"]);
    assert!(
        e.contains("no destruction of pool 'gone' is to be finished here"),
        "{e}"
    );
    d.stop();
    let d = Daemon::start(&state);
    assert!(d.json(&["pool", "list"]).as_array().unwrap().is_empty());
}
