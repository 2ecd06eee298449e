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

#[test]
fn a_full_file_system_under_the_disks_refuses_writes_and_fails_no_disk() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("disks");
    std::fs::create_dir_all(&dir).unwrap();
    let dir_s = dir.to_str().unwrap();
    let probe = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m tessera-probe \"$0\"",
            dir_s,
        ])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: cannot mount a tmpfs in a mount namespace here ({probe:?})");
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
