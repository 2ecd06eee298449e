//! Snapshots: read-only, point-in-time even under concurrent writes, cloneable, accounted as
//! shared and exclusive space, surviving a restart, deletable in any order; and frozen images
//! (what ODX tokens hold) keeping their content while the source changes.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{pattern, spec, Rig, MIB};
use tessera_volume::{LayoutKind, Provisioning, VolumeError};

#[test]
fn snapshots_are_read_only_images_that_outlive_their_origin() {
    let mut rig = Rig::new(4, 64 * MIB, MIB);
    let g = 16 << 10;
    {
        let e = rig.engine();
        let v = e
            .create_vdisk(&spec("vol", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
            .unwrap();
        let first = pattern(1, 0, (2 * MIB) as usize);
        v.write(0, &first, false).unwrap();
        let s1 = e.snapshot("vol", "s1").unwrap();
        assert_eq!(s1.name(), "vol@s1");
        assert!(s1.is_snapshot());
        assert_eq!(s1.config().snapshot_of.as_deref(), Some("vol"));
        // Read-only in every way.
        assert!(matches!(s1.write(0, &[0u8; 512], false), Err(VolumeError::ReadOnly(_))));
        assert!(matches!(s1.trim(0, 512), Err(VolumeError::ReadOnly(_))));
        assert!(matches!(
            s1.write_zeroes(0, 512, true, false),
            Err(VolumeError::ReadOnly(_))
        ));
        assert!(e.resize_vdisk("vol@s1", 8 * MIB).is_err());
        assert!(e.snapshot("vol@s1", "x").is_err(), "no snapshot of a snapshot");
        assert!(e.snapshot("vol", "s1").is_err(), "name taken");
        assert!(e.snapshot("vol", "bad/name").is_err());
        assert!(e.snapshot("nope", "s").is_err());

        // Everything is shared right after the snapshot; writes make grains exclusive.
        let u = v.space_usage();
        assert_eq!(
            (u.allocated_bytes, u.exclusive_bytes, u.shared_bytes),
            (2 * MIB, 0, 2 * MIB)
        );
        v.write(0, &[9u8; 4096], false).unwrap();
        let u = v.space_usage();
        assert_eq!((u.exclusive_bytes, u.shared_bytes), (g, 2 * MIB - g));
        let su = s1.space_usage();
        assert_eq!((su.exclusive_bytes, su.shared_bytes), (g, 2 * MIB - g));

        let s2 = e.snapshot("vol", "s2").unwrap();
        let names: Vec<String> = e.snapshots_of("vol").iter().map(|s| s.name()).collect();
        assert_eq!(names, ["vol@s1", "vol@s2"]);
        let mut back = vec![0u8; first.len()];
        s1.read(0, &mut back).unwrap();
        assert_eq!(back, first, "s1 reads as the vdisk did when it was taken");
        s2.read(0, &mut back[..4096]).unwrap();
        assert_eq!(&back[..4096], &[9u8; 4096][..]);

        // A writable clone of a snapshot.
        let (c, stats) = e.clone_vdisk("vol@s1", "restored").unwrap();
        assert!(!c.is_snapshot());
        assert_eq!(stats.copied_bytes, 0);
        c.write(MIB, &[3u8; 512], false).unwrap();
        s1.read(0, &mut back).unwrap();
        assert_eq!(back, first, "writing the clone leaves the snapshot alone");
    }
    rig.assert_consistent();
    rig.reopen();
    let e = rig.engine();
    let s1 = e.vdisk("vol@s1").unwrap();
    assert!(s1.is_snapshot(), "still a snapshot after a restart");
    assert!(s1.write(0, &[0u8; 512], false).is_err());
    // The origin goes first; its snapshots stay readable.
    e.delete_vdisk("vol").unwrap();
    let mut back = vec![0u8; (2 * MIB) as usize];
    s1.read(0, &mut back).unwrap();
    assert_eq!(back, pattern(1, 0, (2 * MIB) as usize));
    rig.assert_consistent();
    e.delete_vdisk("vol@s1").unwrap();
    e.delete_vdisk("restored").unwrap();
    rig.assert_consistent();
    e.delete_vdisk("vol@s2").unwrap();
    rig.assert_consistent();
    assert!(e.layouts().sets().is_empty(), "every grain given back");
}

/// Writers stamp the blocks in pairs, block j then block j + N/2, pass after pass. In an
/// image of one instant no second block of a pair is newer than its first. Copying the map
/// grain by grain while they run lets the second block of a pair in without its first
/// (the copy passed the first, a writer then wrote both, the copy reached the second).
#[test]
fn snapshots_and_frozen_images_are_point_in_time_under_writes() {
    let rig = Rig::new(4, 256 * MIB, MIB);
    let e = rig.engine();
    let size = 64 * MIB;
    let block = 4096u64;
    let half = size / block / 2;
    let mut s = spec("busy", size, LayoutKind::Simple, Provisioning::Thin);
    s.block_size = Some(4096);
    let v = e.create_vdisk(&s).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Four writers, each over its own pairs, so that a pair is written often enough to
    // land inside the instant of a freeze.
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let v = v.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut pass = 1u8;
                while !stop.load(Ordering::Relaxed) {
                    for j in (w..half).step_by(4) {
                        v.write(j * block, &[pass; 4096], false).unwrap();
                        v.write((j + half) * block, &[pass; 4096], false).unwrap();
                    }
                    pass = pass.wrapping_add(1).max(1);
                }
            })
        })
        .collect();
    let check = |what: &str, img: &[u8]| {
        let stamps: Vec<u8> = img.chunks(block as usize).map(|c| c[0]).collect();
        for (i, c) in img.chunks(block as usize).enumerate() {
            assert!(c.iter().all(|&x| x == c[0]), "{what}: block {i} is torn");
        }
        for j in 0..half as usize {
            let (first, second) = (stamps[j], stamps[j + half as usize]);
            assert!(
                first == second || first == second.wrapping_add(1).max(1),
                "{what}: block {} holds pass {second} but block {j} only pass {first}",
                j + half as usize
            );
        }
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut img = vec![0u8; size as usize];
    for i in 0..8 {
        let snap = e.snapshot("busy", &format!("t{i}")).unwrap();
        snap.read(0, &mut img).unwrap();
        check(&format!("snapshot t{i}"), &img);
        e.delete_vdisk(&snap.name()).unwrap();
        let frozen = v.freeze(&[(0, size)]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        frozen.read(0, &mut img).unwrap();
        check(&format!("frozen image {i}"), &img);
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    rig.assert_consistent();
}

#[test]
fn frozen_images_keep_their_ranges_and_paste_anywhere() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    let g = 16 << 10;
    let src = e
        .create_vdisk(&spec("src", 2 * MIB, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let data = pattern(5, 0, (2 * MIB) as usize);
    src.write(0, &data, false).unwrap();
    // Three ranges, one not grain-aligned: pieces are laid end to end.
    let ranges = [(g, 4 * g), (512, 1024), (MIB, 2 * g)];
    let img = src.freeze(&ranges).unwrap();
    assert_eq!(img.len(), 4 * g + 1024 + 2 * g);
    assert_eq!(img.mapped_bytes(), img.len());
    src.write(0, &vec![0xEEu8; (2 * MIB) as usize], false).unwrap();
    let mut want = Vec::new();
    for (o, l) in ranges {
        want.extend_from_slice(&data[o as usize..(o + l) as usize]);
    }
    let mut got = vec![0u8; img.len() as usize];
    img.read(0, &mut got).unwrap();
    assert_eq!(got, want, "the image is what the ranges held when frozen");

    // Into another vdisk of the pool: the aligned piece is shared, the rest copied.
    let dst = e
        .create_vdisk(&spec("dst", 2 * MIB, LayoutKind::Parity, Provisioning::Fixed))
        .unwrap();
    let stats = dst.paste(g, &img, 0, img.len()).unwrap();
    assert_eq!(stats.shared_bytes, 4 * g, "the first range lines up with its grains");
    assert_eq!(stats.shared_bytes + stats.copied_bytes, img.len());
    let mut back = vec![0u8; img.len() as usize];
    dst.read(g, &mut back).unwrap();
    assert_eq!(back, want);
    // Part of the image, at an offset, into a vdisk of another class: all copied.
    let other = e
        .create_vdisk(&spec("other", 2 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let stats = other.paste(0, &img, 2 * g, 3 * g).unwrap();
    assert_eq!(stats.shared_bytes, 0);
    let mut part = vec![0u8; (3 * g) as usize];
    other.read(0, &mut part).unwrap();
    assert_eq!(part, want[(2 * g) as usize..(5 * g) as usize]);
    // Bad requests.
    assert!(
        dst.paste(0, &img, img.len() - 512, 1024).is_err(),
        "past the image's end"
    );
    assert!(dst.paste(2 * MIB - 512, &img, 0, 1024).is_err(), "past the vdisk's end");
    assert!(dst.paste(0, &img, 100, 512).is_err(), "unaligned");
    assert!(src.freeze(&[(0, 3 * MIB)]).is_err());
    rig.assert_consistent();
    // The image's references go when it does.
    drop(img);
    rig.assert_consistent();
    for n in ["src", "dst", "other"] {
        e.delete_vdisk(n).unwrap();
    }
    rig.assert_consistent();
    assert!(e.layouts().sets().is_empty());
}

#[test]
fn frozen_images_paste_across_pools_by_copying() {
    let a = Rig::new(2, 64 * MIB, MIB);
    let b = Rig::new(2, 64 * MIB, MIB);
    let src = a
        .engine()
        .create_vdisk(&spec("src", 2 * MIB, LayoutKind::Simple, Provisioning::Thin))
        .unwrap();
    let dst = b
        .engine()
        .create_vdisk(&spec("dst", 2 * MIB, LayoutKind::Simple, Provisioning::Thin))
        .unwrap();
    let data = pattern(11, 0, MIB as usize);
    src.write(0, &data, false).unwrap();
    let img = src.freeze(&[(0, MIB)]).unwrap();
    assert_eq!(img.pool(), "test");
    src.write(0, &vec![0u8; MIB as usize], false).unwrap();
    // Same layout and grain size, but another pool: nothing can be shared.
    let stats = dst.paste(MIB, &img, 0, MIB).unwrap();
    assert_eq!((stats.shared_bytes, stats.copied_bytes), (0, MIB));
    let mut back = vec![0u8; MIB as usize];
    dst.read(MIB, &mut back).unwrap();
    assert_eq!(back, data);
    drop(img);
    a.assert_consistent();
    b.assert_consistent();
    // clone_range refuses pools it does not own.
    assert!(b.engine().clone_range(&src, 0, &dst, 0, MIB).is_err());
}

#[test]
fn an_engine_dropped_takes_its_vdisks_and_snapshots_with_it() {
    let mut rig = Rig::new(2, 32 * MIB, MIB);
    let (vol, snap) = {
        let e = rig.engine();
        let v = e
            .create_vdisk(&spec("vol", 2 * MIB, LayoutKind::Mirror, Provisioning::Thin))
            .unwrap();
        v.write(0, &pattern(3, 0, 64 << 10), false).unwrap();
        let s = e.snapshot("vol", "s").unwrap();
        assert_eq!(e.snapshots_of("vol").len(), 1);
        (Arc::downgrade(&v), Arc::downgrade(&s))
    };
    // Nothing but the engine holds them: no vdisk keeps another, or the engine's map, alive.
    rig.engine = None;
    assert!(vol.upgrade().is_none() && snap.upgrade().is_none());
    rig.reopen();
    assert_eq!(rig.engine().snapshots_of("vol").len(), 1);
}

#[test]
fn what_changed_between_two_snapshots_is_the_grains_written_or_trimmed() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    let v = e
        .create_vdisk(&spec("vol", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let g = v.grain_size();
    v.write(0, &pattern(1, 0, (2 * MIB) as usize), false).unwrap();
    let s1 = e.snapshot("vol", "s1").unwrap();
    let ext = |offset: u64, len: u64, mapped: bool| tessera_volume::Extent { offset, len, mapped };
    let diff = |a: &tessera_volume::Vdisk, b: &tessera_volume::Vdisk| -> Vec<(u64, u64, bool)> {
        a.changed_since(b)
            .unwrap()
            .into_iter()
            .map(|x| (x.offset, x.len, x.mapped))
            .collect()
    };
    assert!(diff(&s1, &s1).is_empty());

    // Part of one grain, two whole grains, a trimmed grain, a grain rewritten with the bytes
    // it held (still copied on write: offered again), and one past the written area.
    v.write(3 * g + 512, &[7u8; 4096], false).unwrap();
    v.write(10 * g, &pattern(2, 0, 2 * g as usize), false).unwrap();
    v.trim(20 * g, g).unwrap();
    v.write(30 * g, &pattern(1, 30 * g, g as usize), false).unwrap();
    v.write(3 * MIB, &[1u8; 4096], false).unwrap();
    let s2 = e.snapshot("vol", "s2").unwrap();
    let want = vec![
        ext(3 * g, g, true),
        ext(10 * g, 2 * g, true),
        ext(20 * g, g, false),
        ext(30 * g, g, true),
        ext(3 * MIB - 3 * MIB % g, g, true),
    ];
    let want: Vec<(u64, u64, bool)> = want.into_iter().map(|x| (x.offset, x.len, x.mapped)).collect();
    assert_eq!(diff(&s2, &s1), want);

    // Everything the diff leaves out reads the same in both.
    let (mut a, mut b) = (vec![0u8; (4 * MIB) as usize], vec![0u8; (4 * MIB) as usize]);
    s1.read(0, &mut a).unwrap();
    s2.read(0, &mut b).unwrap();
    let changed = |o: u64| want.iter().any(|&(off, len, _)| o >= off && o < off + len);
    for k in 0..4 * MIB / g {
        let r = (k * g) as usize..((k + 1) * g) as usize;
        if !changed(k * g) {
            assert_eq!(a[r.clone()], b[r], "grain {k} differs and is not in the diff");
        }
    }

    // Only snapshots compare: a live vdisk may rewrite a grain in place.
    assert!(s2.changed_since(&v).is_err());
    assert!(v.changed_since(&s1).is_err());

    // A base deleted once it was looked up (a replication cycle holds it while it connects)
    // is refused: its entries, cleared, would read as holes, and the grain trimmed since it
    // (20) would look unchanged. Before, the diff went on against it.
    e.delete_vdisk("vol@s1").unwrap();
    let err = s2.changed_since(&s1).unwrap_err().to_string();
    assert!(err.contains("was deleted"), "{err}");
}

/// A consistency group: a writer puts record k in a "log" vdisk, and only once that write
/// returned, in a "data" vdisk. Snapshots of both taken together never hold a data record
/// whose log record they lack, however the writes and the snapshots interleave.
#[test]
fn snapshots_taken_together_keep_the_order_of_writes_across_vdisks() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    for name in ["log", "data"] {
        e.create_vdisk(&spec(name, 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
            .unwrap();
    }
    let stop = AtomicBool::new(false);
    let written = std::sync::atomic::AtomicU64::new(0);
    // Stops the writer however the checks end, so that a failed one fails, not hangs.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let writer = {
            let (stop, written) = (&stop, &written);
            scope.spawn(move || {
                let (log, data) = (e.vdisk("log").unwrap(), e.vdisk("data").unwrap());
                let mut k = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    let block = |k: u64| {
                        let mut b = vec![0u8; 4096];
                        b[..8].copy_from_slice(&k.to_le_bytes());
                        b
                    };
                    let at = (k % 256) * 4096;
                    log.write(at, &block(k), false).unwrap();
                    data.write(at, &block(k), false).unwrap();
                    written.store(k, Ordering::Relaxed);
                    k += 1;
                }
                k
            })
        };
        let newest = |v: &tessera_volume::Vdisk| {
            let mut buf = vec![0u8; 256 * 4096];
            v.read(0, &mut buf).unwrap();
            buf.chunks(4096)
                .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap()))
                .max()
                .unwrap()
        };
        let stopper = StopOnDrop(&stop);
        let mut taken = 0;
        // Groups while the writer writes: 40 at least, and until ten of them hold records and
        // the writer wrote a hundred (a busy machine may schedule it late), a minute at most.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while written.load(Ordering::Relaxed) < 20 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut i = 0;
        while i < 40
            || ((taken <= 10 || written.load(Ordering::Relaxed) <= 100) && std::time::Instant::now() < deadline)
        {
            i += 1;
            let (a, b) = (format!("g{i}"), format!("g{i}"));
            let snaps = e.snapshot_group(&[("data", &a), ("log", &b)]).unwrap();
            let (d, l) = (newest(&snaps[0]), newest(&snaps[1]));
            assert!(d <= l, "group {i}: data holds record {d}, its log only {l}");
            taken += (l > 0) as u32;
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        drop(stopper);
        let records = writer.join().unwrap();
        assert!(
            records > 100 && taken > 10,
            "{records} records, {taken} groups with some"
        );
    });
    // All or none: a name taken in one vdisk fails the group and makes nothing.
    e.snapshot("log", "only-log").unwrap();
    assert!(e.snapshot_group(&[("data", "only-log"), ("log", "only-log")]).is_err());
    assert!(e.vdisk("data@only-log").is_err());
    assert!(e.snapshot_group(&[("data", "twice"), ("data", "twice")]).is_err());
}
