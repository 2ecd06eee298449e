//! A file system that fills up under a pool's sparse file disks, for real: the daemon runs in
//! a mount namespace of its own, with a 200 MiB tmpfs over its disks' directory, and a host
//! writes more than that through NBD. Skipped, with a message, where a mount namespace cannot
//! be made (no privilege to mount).

mod common;

use std::process::Command;

use common::*;

/// Mounts a tmpfs over `dir` in a new mount namespace and runs the command that follows there.
const MOUNT_AND_RUN: &str = "mount -t tmpfs -o size=200m tessera-test \"$0\" && \
     for i in 0 1 2 3; do truncate -s 1100M \"$0/d$i.img\" || exit 1; done && exec \"$@\"";

/// Whether a tmpfs can be mounted over `dir` in a mount namespace here; if not, says the test
/// was skipped and why.
fn can_mount_over(dir: &str) -> bool {
    let probe = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=1m tessera-probe \"$0\"", dir])
        .output();
    let can = probe.as_ref().is_ok_and(|o| o.status.success());
    if !can {
        eprintln!("skipped: cannot mount a tmpfs in a mount namespace here ({probe:?})");
    }
    can
}

#[test]
fn a_full_file_system_under_the_disks_refuses_writes_and_fails_no_disk() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("disks");
    std::fs::create_dir_all(&dir).unwrap();
    let dir_s = dir.to_str().unwrap();
    if !can_mount_over(dir_s) {
        return;
    }
    let wrapper = ["unshare", "-m", "sh", "-c", MOUNT_AND_RUN, dir_s];
    let mut d = Daemon::start_wrapped(&wrapper, &t.path().join("state"), &["--api-listen", "none"]).unwrap();
    let pid = d.child.as_ref().unwrap().id().to_string();
    let disks: Vec<String> = (0..4).map(|i| format!("{dir_s}/d{i}.img")).collect();
    create_pool(&d, "p", &disks);
    d.ok(&["vdisk", "create", "p/v", "--size", "1G", "--layout", "mirror"]);
    d.ok(&["nbd", "export", "p/v"]);
    let uri = format!("nbd://{}/v", d.nbd_address());

    // 300 MiB, two copies, into 200 MiB: the host is told there is no space.
    let (_, out) = run("qemu-io", &["-f", "raw", "-c", "write -P 0x5a 0 300M", &uri]);
    assert!(out.contains("No space left on device"), "the host learns why: {out}");
    let pool = d.json(&["pool", "show", "p"]);
    assert_eq!(pool["health"], "healthy", "{pool}");
    let list = d.json(&["disk", "list", "p"]);
    for disk in list.as_array().unwrap() {
        assert_eq!(
            disk["state"], "healthy",
            "no disk is failed for a full file system: {disk}"
        );
    }
    assert!(
        d.logs().contains("file system holding the disk is full"),
        "{}",
        d.logs()
    );

    // Room again: the same write goes through, and reads back.
    let grown = Command::new("nsenter")
        .args(["-t", &pid, "-m", "mount", "-o", "remount,size=3g", dir_s])
        .output()
        .unwrap();
    assert!(grown.status.success(), "{grown:?}");
    ok("qemu-io", &["-f", "raw", "-c", "write -P 0x5a 0 300M", &uri]);
    let read = ok("qemu-io", &["-f", "raw", "-c", "read -P 0x5a 0 300M", &uri]);
    assert!(!read.contains("Pattern verification failed"), "{read}");
    assert_eq!(d.json(&["pool", "show", "p"])["health"], "healthy");
    d.ok(&["pool", "check", "p"]);
    d.stop();
}

/// The file system under a local pool's metadata fills up: a change its store could not
/// commit may or may not be in its records, so nothing more is committed (writes that need a
/// change are refused, flushes fail) until the pool is opened again from its records. Once
/// there is room, `pool import` does that without restarting the daemon: the export is
/// offered again, every write acknowledged before reads back, and new writes go through.
#[test]
fn a_pool_whose_metadata_store_failed_is_opened_again_by_an_import() {
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let pools = state.join("pools");
    std::fs::create_dir_all(&pools).unwrap();
    let pools_s = pools.to_str().unwrap();
    if !can_mount_over(pools_s) {
        return;
    }
    let disks = disks(&t.path().join("disks"), 2, 512 << 20);
    let wrapper = [
        "unshare",
        "-m",
        "sh",
        "-c",
        "mount -t tmpfs -o size=32m tessera-test \"$0\" && exec \"$@\"",
        pools_s,
    ];
    let mut d = Daemon::start_wrapped(&wrapper, &state, &["--api-listen", "none"]).unwrap();
    let pid = d.child.as_ref().unwrap().id().to_string();
    let in_namespace = |script: &str| {
        Command::new("nsenter")
            .args(["-t", &pid, "-m", "sh", "-c", script, pools_s])
            .output()
            .unwrap()
    };
    create_pool(&d, "p", &disks);
    d.ok(&["vdisk", "create", "p/v", "--size", "256M", "--layout", "mirror"]);
    d.ok(&["nbd", "export", "p/v"]);
    let uri = format!("nbd://{}/v", d.nbd_address());
    ok("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 4M", &uri]);

    // No room left for the metadata: new grains are written until a commit fails.
    in_namespace("dd if=/dev/zero of=\"$0/junk\" bs=64k 2>/dev/null; true");
    let mut refused = None;
    for i in 0..32u64 {
        let (_, out) = run(
            "qemu-io",
            &["-f", "raw", "-c", &format!("write -P 0x22 {}M 4M", 8 + 4 * i), &uri],
        );
        let warnings = d.json(&["pool", "show", "p"])["warnings"].to_string();
        if warnings.contains("opened again") {
            eprintln!("refused at write {i}: {warnings}");
            refused = Some((out, warnings));
            break;
        }
    }
    let (_, warnings) = refused.expect("a metadata commit failed on the full file system");
    assert!(warnings.contains("tessera pool import"), "{warnings}");
    let (wrote, out) = run("qemu-io", &["-f", "raw", "-c", "write -P 0x33 200M 1M", &uri]);
    assert!(
        !wrote || out.contains("error") || out.contains("failed"),
        "a change was committed: {out}"
    );

    // Room again: an import opens it from its records, without a restart.
    let freed = in_namespace("rm \"$0/junk\"");
    assert!(freed.status.success(), "{freed:?}");
    // A connection to its export in the middle of a request (here the client sent half a
    // request's header and stalls) holds the vdisk (and the records) until its client goes
    // on or leaves: the pool is served as it was, and the refusal says what holds it. (An
    // idle connection ends when the export is withdrawn, and holds nothing.)
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connected = rt
        .block_on(tessera_nbd::client::Client::connect(&d.nbd_address(), "v"))
        .unwrap();
    rt.block_on(connected.send_raw(&[0x25, 0x60, 0x95, 0x13, 0, 0]))
        .unwrap();
    let e = d.fails(&["pool", "import", "p"]);
    assert!(e.contains("p/v") && e.contains("NBD export"), "{e}");
    let warnings = d.json(&["pool", "show", "p"])["warnings"].to_string();
    assert!(warnings.contains("opened again"), "{warnings}");
    assert!(d.ok(&["nbd", "list"]).contains("p/v"));
    drop(connected);
    d.ok(&["pool", "import", "p"]);
    let shown = d.json(&["pool", "show", "p"]);
    assert_eq!(shown["warnings"].as_array().map(Vec::len), Some(0), "{shown}");
    let read = ok("qemu-io", &["-f", "raw", "-c", "read -P 0x11 0 4M", &uri]);
    assert!(!read.contains("Pattern verification failed"), "{read}");
    ok("qemu-io", &["-f", "raw", "-c", "write -P 0x44 200M 4M", &uri]);
    let read = ok("qemu-io", &["-f", "raw", "-c", "read -P 0x44 200M 4M", &uri]);
    assert!(!read.contains("Pattern verification failed"), "{read}");
    d.ok(&["pool", "check", "p"]);
    // A pool whose store is whole is not opened again: it is imported already.
    let e = d.fails(&["pool", "import", "p"]);
    assert!(e.contains("already imported"), "{e}");
    d.stop();
}
