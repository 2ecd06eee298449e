//! The workload generator against each kind of target it speaks to: a vdisk in this process,
//! an NBD export and an iSCSI LUN served in this process over TCP. Checks that the counts add
//! up and that verify mode finds damage done behind its back; never checks speed.

use std::sync::Arc;
use std::time::Duration;

use tessera_bench::{run, Connect, RunReport, Target, TargetSpec, Verifier, Workload};
use tessera_disk::{DiskRef, FaultyDisk, MemDisk, DATA_OFFSET};
use tessera_volume::{Engine, LayoutKind, VdiskSpec};

const MIB: u64 = 1 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn quiet(_: f64, _: u64) {}

fn assert_counts_add_up(r: &RunReport, w: &Workload) {
    let bs = w.block_size as u64;
    assert!(r.total.ops > 0, "{r:?}");
    assert_eq!(r.total.ops, r.read.ops + r.write.ops);
    assert_eq!(r.total.bytes, r.total.ops * bs);
    assert_eq!(r.read.bytes, r.read.ops * bs);
    assert!((r.total.iops - r.total.ops as f64 / r.seconds).abs() < 1e-6);
    for o in [&r.total, &r.read, &r.write] {
        match &o.latency {
            Some(l) => {
                assert!(o.ops > 0);
                assert!(l.min_us <= l.p50_us && l.p50_us <= l.p90_us && l.p90_us <= l.p99_us);
                assert!(l.p99_us <= l.p999_us && l.p999_us <= l.max_us * 1.001, "{l:?}");
                assert!(l.min_us <= l.mean_us && l.mean_us <= l.max_us);
            }
            None => assert_eq!(o.ops, 0),
        }
    }
    if w.write_percent == 0 {
        assert_eq!(r.write.ops, 0);
    }
    if w.write_percent == 100 {
        assert_eq!(r.read.ops, 0);
    }
}

struct Pool {
    _dir: tempfile::TempDir,
    engine: Engine,
    disk: Arc<FaultyDisk>,
}

/// A one-disk pool (behind a fault injector) with a 16 MiB simple vdisk "v".
fn pool() -> Pool {
    pool_with(true)
}

/// `checksums`: whether the engine keeps block checksums (without, rot reaches the reader).
fn pool_with(checksums: bool) -> Pool {
    let dir = tempfile::tempdir().unwrap();
    let disk = FaultyDisk::new(Arc::new(MemDisk::new("m0", 64 * MIB)) as DiskRef);
    let engine = Engine::create_pool_with_checksums(
        &dir.path().join("p"),
        "p",
        vec![disk.clone() as DiskRef],
        MIB,
        checksums,
    )
    .unwrap();
    engine
        .create_vdisk(&VdiskSpec::new("v", 16 * MIB, LayoutKind::Simple))
        .unwrap();
    Pool {
        _dir: dir,
        engine,
        disk,
    }
}

fn workload(write_percent: u8, random: bool, verify: bool, size: u64) -> Workload {
    Workload {
        block_size: 4096,
        threads: 2,
        outstanding: 4,
        write_percent,
        random,
        duration: Duration::from_millis(400),
        warmup: Duration::from_millis(100),
        size: Some(size),
        verify,
        ..Default::default()
    }
}

#[test]
fn vdisk_counts_add_up_and_verify_finds_damage() {
    let rt = runtime();
    // Without block checksums, so that damage reaches the benchmark's own verifier (with
    // them the engine refuses it first: see the next test).
    let p = pool_with(false);
    let t = Target::vdisk("vdisk:p/v", p.engine.vdisk("v").unwrap());
    for (wp, random) in [(0, true), (30, true), (100, false)] {
        let w = workload(wp, random, false, 16 * MIB);
        let r = run(&t, &w, None, rt.handle(), &quiet).unwrap();
        assert_counts_add_up(&r, &w);
        assert!(r.verify.is_none());
    }

    // Write every block of a 2 MiB region, check it reads back clean, then damage the disk
    // under the engine and read again: the verifier must notice.
    let w = workload(100, false, true, 2 * MIB);
    let v = Arc::new(Verifier::new(512, 4096));
    // (A run lasts 400 ms: a busy machine may need more than one to cover the region.)
    for _ in 0..50 {
        let r = run(&t, &w, Some(v.clone()), rt.handle(), &quiet).unwrap();
        assert_counts_add_up(&r, &w);
        if v.unwritten() == 0 {
            break;
        }
    }
    assert_eq!(v.unwritten(), 0, "runs of sequential writes left blocks unwritten");
    let reads = workload(0, true, true, 2 * MIB);
    let clean = run(&t, &reads, Some(v.clone()), rt.handle(), &quiet).unwrap();
    let s = clean.verify.clone().unwrap();
    assert!(s.checked > 0 && s.unverified == 0 && s.corrupt == 0, "{s:?}");
    // The vdisk's data sits in the first slabs after the label.
    for off in (DATA_OFFSET..DATA_OFFSET + 8 * MIB).step_by(4096) {
        p.disk.faults().flip_bit(off + 1000, 3).unwrap();
    }
    let damaged = run(&t, &reads, Some(v.clone()), rt.handle(), &quiet).unwrap();
    let s = damaged.verify.clone().unwrap();
    assert!(s.corrupt > 0, "{s:?}");
    assert!(s.errors.iter().any(|e| e.contains("checksum")), "{:?}", s.errors);

    // A disk that fails ends the run with a message, not with numbers.
    let bad_io = {
        p.disk.faults().pull();
        let r = run(
            &t,
            &workload(100, true, true, 2 * MIB),
            Some(v.clone()),
            rt.handle(),
            &quiet,
        );
        p.disk.faults().reinsert();
        r
    };
    assert!(
        bad_io.unwrap_err().contains("failed"),
        "an I/O error ends the run with a message"
    );
}

/// Serves `v` over NBD (export "v") and iSCSI (LUN 0 of "iqn.2026-11.io.tessera:b", open to
/// any initiator) on loopback; their addresses.
fn serve(rt: &tokio::runtime::Runtime, v: &Arc<tessera_volume::Vdisk>) -> (std::net::SocketAddr, std::net::SocketAddr) {
    let nreg = tessera_nbd::Registry::new();
    nreg.add(tessera_nbd::Export::new("v", "p/v", v.clone(), false));
    let nbd = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let nbd_addr = nbd.local_addr().unwrap();
    rt.spawn(tessera_nbd::serve(nbd, nreg));
    let ireg = tessera_iscsi::Registry::new();
    let t = ireg.add_target(tessera_iscsi::Target::new("iqn.2026-11.io.tessera:b"));
    t.set_access(tessera_iscsi::Access::open());
    t.luns
        .write()
        .insert(0, Arc::new(tessera_vdisk_lun::vdisk_lun(v.clone(), 7, false)));
    let iscsi = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let iscsi_addr = iscsi.local_addr().unwrap();
    rt.spawn(tessera_iscsi::serve(iscsi, ireg));
    (nbd_addr, iscsi_addr)
}

#[test]
fn network_targets_count_and_verify() {
    let rt = runtime();
    let p = pool();
    let v = p.engine.vdisk("v").unwrap();
    let (nbd_addr, iscsi_addr) = serve(&rt, &v);

    for url in [
        format!("nbd://{nbd_addr}/v"),
        format!("iscsi://{iscsi_addr}/iqn.2026-11.io.tessera:b/0"),
    ] {
        let spec = TargetSpec::parse(&url).unwrap();
        let w = workload(50, true, true, 4 * MIB);
        let target = rt
            .block_on(Target::connect(&spec, w.threads, &Connect::default()))
            .unwrap();
        assert_eq!(target.size, 16 * MIB, "{url}");
        let verifier = Arc::new(Verifier::new(1024, 4096));
        for _ in 0..2 {
            let r = run(&target, &w, Some(verifier.clone()), rt.handle(), &quiet).unwrap();
            assert_counts_add_up(&r, &w);
            let s = r.verify.unwrap();
            assert_eq!(s.corrupt, 0, "{url}: {s:?}");
        }
        assert!(
            verifier.stats().checked > 0,
            "{url}: reads of earlier writes were checked"
        );
        let w = workload(0, false, false, 16 * MIB);
        let r = run(&target, &w, None, rt.handle(), &quiet).unwrap();
        assert_counts_add_up(&r, &w);
        rt.block_on(target.close());
        // Again with the same initiator name: over iSCSI each new session's first command
        // meets the unit attention the last ones' logout left (I_T nexus loss), and the run
        // asks again instead of failing.
        let w = workload(30, true, false, 16 * MIB);
        let target = rt
            .block_on(Target::connect(&spec, w.threads, &Connect::default()))
            .unwrap();
        let r = run(&target, &w, None, rt.handle(), &quiet).unwrap();
        assert_counts_add_up(&r, &w);
        rt.block_on(target.close());
    }
    // A target that is not there, and an export that is not there: clear errors.
    let e = rt
        .block_on(Target::connect(
            &TargetSpec::parse(&format!("nbd://{nbd_addr}/nope")).unwrap(),
            1,
            &Connect::default(),
        ))
        .err()
        .unwrap();
    assert!(e.contains("nope"), "{e}");
}

/// Writes through (diskspd -Sh) reach stable media before they complete, on every kind of
/// target: FUA over NBD and iSCSI, a flush after the write in this process; the disk sees
/// about a flush per write. Without, the writes are cached and the disk is not flushed.
#[test]
fn writes_through_flush_the_disk_and_cached_ones_do_not() {
    let rt = runtime();
    let p = pool();
    let v = p.engine.vdisk("v").unwrap();
    let (nbd_addr, iscsi_addr) = serve(&rt, &v);
    // Every grain written once first: the runs below only overwrite, with nothing to commit.
    v.write(0, &vec![1u8; 4 * MIB as usize], true).unwrap();

    for url in [
        "vdisk".to_string(),
        format!("nbd://{nbd_addr}/v"),
        format!("iscsi://{iscsi_addr}/iqn.2026-11.io.tessera:b/0"),
    ] {
        let target = || match url.as_str() {
            "vdisk" => Target::vdisk("vdisk:p/v", v.clone()),
            _ => rt
                .block_on(Target::connect(
                    &TargetSpec::parse(&url).unwrap(),
                    2,
                    &Connect::default(),
                ))
                .unwrap(),
        };
        let mut flushes = Vec::new();
        for through in [true, false] {
            let w = Workload {
                write_through: through,
                ..workload(100, true, false, 4 * MIB)
            };
            let t = target();
            p.disk.faults().reset_counters();
            let r = run(&t, &w, None, rt.handle(), &quiet).unwrap();
            assert_counts_add_up(&r, &w);
            flushes.push((r.write.ops, p.disk.faults().flushes()));
            rt.block_on(t.close());
        }
        let [(through_writes, through_flushes), (cached_writes, cached_flushes)] = flushes[..] else {
            unreachable!()
        };
        // Up to 8 writes in flight may share a flush.
        assert!(
            through_flushes * 8 >= through_writes && through_writes > 0,
            "{url}: {through_flushes} flushes for {through_writes} writes through"
        );
        assert!(
            cached_flushes <= 2 && cached_writes > 0,
            "{url}: {cached_flushes} flushes for {cached_writes} cached writes"
        );
    }
}

#[test]
fn with_block_checksums_rot_ends_the_run_instead_of_reaching_the_reader() {
    let rt = runtime();
    let p = pool();
    let t = Target::vdisk("vdisk:p/v", p.engine.vdisk("v").unwrap());
    let v = Arc::new(Verifier::new(512, 4096));
    run(
        &t,
        &workload(100, false, true, 2 * MIB),
        Some(v.clone()),
        rt.handle(),
        &quiet,
    )
    .unwrap();
    for off in (DATA_OFFSET..DATA_OFFSET + 2 * MIB).step_by(4096) {
        p.disk.faults().flip_bit(off + 1000, 3).unwrap();
    }
    let e = run(&t, &workload(0, true, true, 2 * MIB), Some(v), rt.handle(), &quiet).unwrap_err();
    assert!(e.contains("checksum"), "{e}");
}
