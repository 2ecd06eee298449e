//! Deduplication: identical grains of the vdisks in scope end up in one slot, every vdisk
//! reads as before, writes copy on write, a collision never merges different data, the
//! minimum age and the scope are kept, and racing writers never see another's data.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{compressible, enable_dedup, pattern, run_dedup, Rig, MIB};
use tessera_disk::FaultOp;
use tessera_volume::{
    Compression, DedupSettings, Engine, Fingerprinter, LayoutKind, PassOptions, Progress, Provisioning, VdiskSpec,
};

const G: u64 = 4096;

fn vdisk(e: &Engine, name: &str, size: u64, kind: LayoutKind) {
    let mut s = VdiskSpec::new(name, size, kind);
    s.block_size = Some(4096);
    if kind == LayoutKind::Parity {
        s.columns = Some(3);
    }
    e.create_vdisk(&s).unwrap();
}

/// A "disk image": 4 KiB blocks, some shared with the other images (the same block at the
/// same or another place), some its own, some zeros.
fn image(seed: u64, blocks: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity((blocks * G) as usize);
    for b in 0..blocks {
        let block = match b % 4 {
            0 | 1 => pattern(7, b * G, G as usize),      // common to every image, same place
            2 => pattern(8, (b / 8) * G, G as usize),    // common, repeated within the image
            _ if b % 8 == 3 => vec![0u8; G as usize],    // zeros
            _ => pattern(100 + seed, b * G, G as usize), // the image's own
        };
        out.extend_from_slice(&block);
    }
    out
}

/// A 4 KiB block that no other seed makes (`pattern` differs between seeds by a constant
/// byte only, so different seeds may give the same block).
fn unique_block(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..G / 8)
        .flat_map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes()
        })
        .collect()
}

fn read_all(e: &Engine, name: &str, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    e.vdisk(name).unwrap().read(0, &mut back).unwrap();
    back
}

#[test]
fn identical_blocks_across_vdisks_are_stored_once_and_read_back() {
    let mut rig = Rig::new(4, 64 * MIB, MIB);
    let blocks = 512; // 2 MiB per image
    let images: Vec<Vec<u8>> = (0..3).map(|i| image(i, blocks)).collect();
    {
        let e = rig.engine();
        // Sharing alone, counted exactly (`pattern` compresses).
        enable_dedup(e, Compression::Off);
        for (i, img) in images.iter().enumerate() {
            let name = format!("img{i}");
            vdisk(e, &name, blocks * G, LayoutKind::Mirror);
            assert_eq!(e.vdisk(&name).unwrap().grain_size(), G, "dedup in scope: 4 KiB grains");
            e.vdisk(&name).unwrap().write(0, img, false).unwrap();
        }
        let before = e.dedup_status();
        assert_eq!(before.saved_bytes, 0);
        assert_eq!(before.logical_bytes, 3 * blocks * G);
        let r = run_dedup(e);
        assert_eq!(r.grains_scanned, 3 * blocks);
        assert_eq!(r.zero_grains_unmapped, 3 * blocks / 8);
        assert_eq!(r.mismatches, 0);
        // Unique data: the common blocks once (half the image), the repeated ones once per
        // eight, each image's own.
        let unique = blocks / 2 + blocks / 4 / 2 + 3 * blocks / 8;
        let st = e.dedup_status();
        assert_eq!(st.physical_bytes, unique * G, "{st:#?}");
        assert_eq!(st.logical_bytes, 3 * (blocks - blocks / 8) * G);
        assert!(st.saved_ratio > 0.5, "{st:#?}");
        let shares: u64 = st.vdisks.iter().map(|v| v.physical_bytes).sum();
        assert!(
            shares.abs_diff(st.physical_bytes) <= 3,
            "each vdisk's share adds up to the pool's"
        );
        for (i, img) in images.iter().enumerate() {
            assert_eq!(&read_all(e, &format!("img{i}"), img.len()), img);
        }
        // A second run finds nothing new to read.
        assert_eq!(run_dedup(e).grains_scanned, 0);
    }
    rig.assert_consistent();
    rig.reopen();
    rig.assert_consistent();
    let e = rig.engine();
    for (i, img) in images.iter().enumerate() {
        assert_eq!(&read_all(e, &format!("img{i}"), img.len()), img);
    }
    // Deleting two of the three gives back what only they held.
    let used = e.pool().capacity().used_bytes;
    e.delete_vdisk("img1").unwrap();
    e.delete_vdisk("img2").unwrap();
    assert_eq!(&read_all(e, "img0", images[0].len()), &images[0]);
    assert!(e.pool().capacity().used_bytes <= used);
    rig.assert_consistent();
}

#[test]
fn a_write_to_a_shared_block_copies_on_write() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::default());
    let data = pattern(3, 0, MIB as usize);
    for name in ["a", "b"] {
        vdisk(e, name, MIB, LayoutKind::Parity);
        e.vdisk(name).unwrap().write(0, &data, false).unwrap();
    }
    assert_eq!(run_dedup(e).grains_shared, MIB / G);
    e.vdisk("a").unwrap().write(8 * G, &[9u8; 4096], false).unwrap();
    let mut want_a = data.clone();
    want_a[(8 * G) as usize..(9 * G) as usize].fill(9);
    assert_eq!(read_all(e, "a", MIB as usize), want_a);
    assert_eq!(read_all(e, "b", MIB as usize), data, "b keeps the shared data");
    rig.assert_consistent();
}

#[test]
fn a_forced_fingerprint_collision_never_merges_different_data() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::default());
    // Two bits of fingerprint: 256 different blocks fall on four fingerprints.
    e.set_fingerprinter(Fingerprinter::Weak { bits: 2 });
    let data: Vec<u8> = (0..256u64).flat_map(unique_block).collect();
    vdisk(e, "a", MIB, LayoutKind::Mirror);
    vdisk(e, "b", MIB, LayoutKind::Mirror);
    e.vdisk("a").unwrap().write(0, &data, false).unwrap();
    // b holds a's blocks in another order: each has one true twin in a.
    let mut shuffled = Vec::new();
    for b in (0..256usize).rev() {
        shuffled.extend_from_slice(&data[b * G as usize..(b + 1) * G as usize]);
    }
    e.vdisk("b").unwrap().write(0, &shuffled, false).unwrap();
    let r = run_dedup(e);
    assert!(r.mismatches > 0, "the weak fingerprint must have collided: {r:?}");
    assert_eq!(read_all(e, "a", MIB as usize), data);
    assert_eq!(read_all(e, "b", MIB as usize), shuffled);
    // Runs again with the strong fingerprint find the true twins the collisions hid.
    e.set_fingerprinter(Fingerprinter::Blake3);
    e.vdisk("a").unwrap().write(0, &data, false).unwrap();
    e.vdisk("b").unwrap().write(0, &shuffled, false).unwrap();
    run_dedup(e);
    assert_eq!(e.dedup_status().physical_bytes, MIB);
    assert_eq!(read_all(e, "b", MIB as usize), shuffled);
    rig.assert_consistent();
}

#[test]
fn scope_layouts_and_minimum_age_are_kept() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    let data = pattern(5, 0, MIB as usize);
    vdisk(e, "m1", MIB, LayoutKind::Mirror);
    vdisk(e, "m2", MIB, LayoutKind::Mirror);
    vdisk(e, "p1", MIB, LayoutKind::Parity);
    let mut fixed = VdiskSpec::new("fx", MIB, LayoutKind::Mirror);
    fixed.provisioning = Provisioning::Fixed;
    e.create_vdisk(&fixed).unwrap();
    for name in ["m1", "m2", "p1", "fx"] {
        e.vdisk(name).unwrap().write(0, &data, false).unwrap();
    }
    // Not enabled: a run is refused.
    assert!(e.dedup_run(&PassOptions::default(), &Progress::default()).is_err());
    // Named vdisks must exist and be thin vdisks.
    let named = |v: &[&str]| DedupSettings {
        enabled: true,
        vdisks: v.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    assert!(e.set_dedup_settings(named(&["nope"])).is_err());
    assert!(e.set_dedup_settings(named(&["fx"])).is_err());
    // Every vdisk, with the default minimum age of an hour: nothing is old enough.
    e.set_dedup_settings(DedupSettings {
        enabled: true,
        exclude: vec!["m2".into()],
        ..Default::default()
    })
    .unwrap();
    let r = e.dedup_run(&PassOptions::default(), &Progress::default()).unwrap();
    assert_eq!((r.grains_scanned, r.grains_shared), (0, 0));
    assert!(r.grains_too_young > 0);
    // m2 excluded, fx fixed: only m1 and p1 are read, and a mirror never shares with parity.
    let r = run_dedup(e);
    assert_eq!(r.vdisks, 2);
    assert_eq!(r.grains_shared, 0, "different layouts share nothing: {r:?}");
    e.set_dedup_settings(named(&["m1", "m2"])).unwrap();
    assert_eq!(
        run_dedup(e).grains_shared,
        MIB / (64 << 10),
        "64 KiB grains made before dedup was on"
    );
    for name in ["m1", "m2", "p1", "fx"] {
        assert_eq!(read_all(e, name, MIB as usize), data);
    }
    rig.assert_consistent();
}

/// A duplicate of data an earlier run indexed is shared on its whole 256-bit hash, without
/// reading either slot again, while nothing changed the vdisk holding it. Once that vdisk is
/// written (here in place, so its grain still points at the indexed slot), the entry is no
/// longer trusted: the slot is read, found to hold other bytes, and nothing is shared.
#[test]
fn an_entry_is_trusted_on_its_hash_only_while_its_vdisk_is_unchanged() {
    let rig = Rig::new(1, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::Off);
    let (x, y) = (unique_block(1), unique_block(2));
    for name in ["a", "b", "c", "d"] {
        vdisk(e, name, MIB, LayoutKind::Simple);
    }

    e.vdisk("a").unwrap().write(0, &x, false).unwrap();
    run_dedup(e);
    e.vdisk("b").unwrap().write(0, &x, false).unwrap();
    rig.disks[0].faults().reset_counters();
    let r = run_dedup(e);
    assert_eq!((r.grains_shared, r.mismatches), (1, 0));
    // One read: b's grain, once. Neither it nor a's slot is read again to compare.
    assert_eq!(rig.disks[0].faults().reads(), 1);
    assert_eq!(read_all(e, "b", G as usize), x);

    let z = unique_block(3);
    e.vdisk("c").unwrap().write(0, &z, false).unwrap();
    run_dedup(e);
    e.vdisk("c").unwrap().write(0, &y, false).unwrap(); // in place: c's only reference
    e.vdisk("d").unwrap().write(0, &z, false).unwrap();
    let r = run_dedup(e);
    assert_eq!(r.grains_shared, 0, "c's slot holds y now");
    assert_eq!(r.mismatches, 1, "the stale entry was read and compared");
    assert_eq!(read_all(e, "c", G as usize), y);
    assert_eq!(read_all(e, "d", G as usize), z);
    rig.assert_consistent();
}

/// A grain no copy of which can be read is left as it is: the run goes on, shares what it
/// can read, and counts it; a later run, once the disk reads again, takes it.
#[test]
fn a_grain_that_cannot_be_read_is_left_and_the_run_goes_on() {
    let rig = Rig::new(1, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::Off);
    let (x, y) = (unique_block(11), unique_block(12));
    for name in ["a", "b"] {
        vdisk(e, name, MIB, LayoutKind::Simple);
        let v = e.vdisk(name).unwrap();
        v.write(0, &x, false).unwrap();
        v.write(G, &y, false).unwrap();
    }
    // The first place on the disk that holds x: one of the two vdisks' copy of it.
    let disk = rig.disks[0].inner().clone();
    let mut block = vec![0u8; G as usize];
    let at = (0..disk.size() / G)
        .map(|i| i * G)
        .find(|&at| {
            disk.read_at(&mut block, at).unwrap();
            block == x
        })
        .expect("x is on the disk");
    rig.disks[0].faults().fail_range(at, G, FaultOp::Read);
    let r = run_dedup(e);
    assert_eq!(r.grains_unreadable, 1, "{r:?}");
    assert_eq!(r.grains_shared, 1, "y is shared, x not: {r:?}");
    rig.disks[0].faults().clear();
    let r = run_dedup(e);
    assert_eq!((r.grains_unreadable, r.grains_shared), (0, 1), "x is shared now: {r:?}");
    let mut both = x.clone();
    both.extend_from_slice(&y);
    for name in ["a", "b"] {
        assert_eq!(read_all(e, name, 2 * G as usize), both, "{name}");
    }
    rig.assert_consistent();
}

#[test]
fn writers_racing_a_run_read_their_own_data() {
    race_writers_with_runs(false);
}

/// Writers that pause now and then, so that runs also read batches while no write is under
/// way and then see writes land before their locks are taken.
#[test]
fn writers_pausing_between_bursts_while_runs_go_read_their_own_data() {
    race_writers_with_runs(true);
}

fn race_writers_with_runs(pauses: bool) {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::default());
    let size = 2 * MIB;
    let common = pattern(11, 0, G as usize);
    for name in ["a", "b", "c"] {
        vdisk(e, name, size, LayoutKind::Mirror);
        e.vdisk(name)
            .unwrap()
            .write(0, &common.repeat((size / G) as usize), false)
            .unwrap();
    }
    let stop = AtomicBool::new(false);
    let last: Vec<parking_lot::Mutex<Vec<u8>>> = (0..3)
        .map(|_| parking_lot::Mutex::new(common.repeat((size / G) as usize)))
        .collect();
    let last = Arc::new(last);
    std::thread::scope(|sc| {
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            let (stop, last, common) = (&stop, last.clone(), &common);
            let v = e.vdisk(name).unwrap();
            sc.spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let block = (n * 7 + i as u64 * 13) % (size / G);
                    // Half the writes put the common block back, so that grains keep
                    // becoming duplicates while others stop being so.
                    let bytes = if n % 2 == 0 {
                        common.clone()
                    } else {
                        pattern(1000 * i as u64 + n, 0, G as usize)
                    };
                    let mut l = last[i].lock();
                    v.write(block * G, &bytes, false).unwrap();
                    l[(block * G) as usize..((block + 1) * G) as usize].copy_from_slice(&bytes);
                    drop(l);
                    if pauses && n % 8 == 0 {
                        std::thread::sleep(std::time::Duration::from_micros(300 * (n % 5)));
                    }
                }
            });
        }
        for _ in 0..20 {
            run_dedup(e);
        }
        stop.store(true, Ordering::Relaxed);
    });
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        assert_eq!(read_all(e, name, size as usize), *last[i].lock(), "{name}");
    }
    rig.assert_consistent();
}

/// A run works on batches of 16 MiB in stages, and puts each batch's index entries in after
/// it is committed: a batch looked up before the entries of the batches ahead of it are in
/// the index still finds them, and they are all in once the run returns.
#[test]
fn duplicates_in_the_next_batches_are_found_while_their_entries_go_into_the_index() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::Off);
    let batch = 16 * MIB;
    let first: Vec<u8> = (0..batch / G).flat_map(unique_block).collect();
    vdisk(e, "a", 3 * batch, LayoutKind::Mirror);
    let a = e.vdisk("a").unwrap();
    for k in 0..3 {
        a.write(k * batch, &first, false).unwrap();
    }
    let r = run_dedup(e);
    assert_eq!(r.grains_shared, 2 * batch / G, "{r:#?}");
    assert_eq!(r.mismatches, 0);
    assert_eq!(e.dedup_status().physical_bytes, batch);
    // Another vdisk with the same data, in a run of its own, finds every entry.
    vdisk(e, "b", batch, LayoutKind::Mirror);
    e.vdisk("b").unwrap().write(0, &first, false).unwrap();
    let r = run_dedup(e);
    assert_eq!(r.grains_shared, batch / G, "{r:#?}");
    assert_eq!(e.dedup_status().physical_bytes, batch);
    assert_eq!(read_all(e, "a", (3 * batch) as usize), first.repeat(3));
    assert_eq!(read_all(e, "b", batch as usize), first);
    rig.assert_consistent();
}

/// A pool with dedup on and two mirrored vdisks "a" and "b" of 1 MiB holding the same data.
fn two_vdisks_alike(seed: u64) -> (Rig, Vec<u8>) {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::default());
    let data = pattern(seed, 0, MIB as usize);
    for name in ["a", "b"] {
        vdisk(e, name, MIB, LayoutKind::Mirror);
        e.vdisk(name).unwrap().write(0, &data, false).unwrap();
    }
    (rig, data)
}

#[test]
fn a_cancelled_run_stops_and_keeps_what_it_did() {
    let (rig, data) = two_vdisks_alike(2);
    let e = rig.engine();
    let p = Progress::default();
    p.cancel.store(true, Ordering::Relaxed);
    let opts = PassOptions {
        ignore_min_age: true,
        ..Default::default()
    };
    assert!(e.dedup_run(&opts, &p).is_err());
    assert_eq!(read_all(e, "b", MIB as usize), data);
    rig.assert_consistent();
}

/// A run held to a low rate stops when cancelled, not when its next batch's turn comes
/// (here sixteen seconds after the first).
#[test]
fn a_slow_run_stops_at_once_when_cancelled() {
    let (rig, data) = two_vdisks_alike(3);
    let e = rig.engine();
    let p = Progress::default();
    let opts = PassOptions {
        ignore_min_age: true,
        rate: Some(64 << 10),
        ..Default::default()
    };
    let (result, waited) = std::thread::scope(|s| {
        let job = s.spawn(|| e.dedup_run(&opts, &p));
        std::thread::sleep(std::time::Duration::from_millis(500));
        p.cancel.store(true, Ordering::Relaxed);
        let t = std::time::Instant::now();
        (job.join().unwrap(), t.elapsed())
    });
    assert!(result.is_err(), "{result:?}");
    assert!(waited < std::time::Duration::from_secs(3), "the cancel took {waited:?}");
    assert_eq!(read_all(e, "a", MIB as usize), data);
    assert_eq!(read_all(e, "b", MIB as usize), data);
    rig.assert_consistent();
    // What was left is found by the next run.
    let r = run_dedup(e);
    assert_eq!(r.grains_shared, MIB / G, "{r:#?}");
    assert_eq!(read_all(e, "b", MIB as usize), data);
}

#[test]
fn new_grains_are_compressed_into_packs_and_read_back_after_writes_and_a_restart() {
    let mut rig = Rig::new(4, 64 * MIB, MIB);
    let size = 2 * MIB;
    let mut want = compressible(1, 0, size as usize);
    {
        let e = rig.engine();
        enable_dedup(e, Compression::default());
        vdisk(e, "t", size, LayoutKind::Parity);
        let v = e.vdisk("t").unwrap();
        v.write(0, &want, false).unwrap();
        let r = run_dedup(e);
        assert_eq!(r.grains_compressed, size / G, "{r:?}");
        assert!(r.compressed_bytes_out * 3 < r.compressed_bytes_in, "{r:?}");
        let st = e.dedup_status();
        assert!(st.physical_bytes * 3 < st.logical_bytes, "{st:#?}");
        assert!(st.compression_ratio > 3.0 && st.compressed_bytes == size, "{st:#?}");
        assert_eq!(read_all(e, "t", size as usize), want);
        // Reads of single grains and across grains, alone and as a queue.
        let mut one = vec![0u8; G as usize];
        v.read(77 * G, &mut one).unwrap();
        assert_eq!(&one[..], &want[(77 * G) as usize..(78 * G) as usize]);
        let (mut a, mut b) = (vec![0u8; 3 * G as usize], vec![0u8; 5 * G as usize]);
        for r in v.read_many(&mut [(9 * G, &mut a[..]), (300 * G, &mut b[..])]) {
            r.unwrap();
        }
        assert_eq!(&a[..], &want[(9 * G) as usize..(12 * G) as usize]);
        assert_eq!(&b[..], &want[(300 * G) as usize..(305 * G) as usize]);
        // Writes into compressed grains copy them on write; their neighbours in the packs
        // are left as they were.
        for (at, n, seed) in [(5 * G, G, 2), (100 * G, 2 * G, 3), (511 * G, G, 4)] {
            let d = compressible(seed, at, n as usize);
            v.write(at, &d, false).unwrap();
            want[at as usize..(at + n) as usize].copy_from_slice(&d);
        }
        assert_eq!(read_all(e, "t", size as usize), want);
        rig.assert_consistent();
        // The next run compresses what was rewritten, and only that: the grains still packed
        // are read, found in the index, and left where they are.
        let again = run_dedup(e);
        assert_eq!((again.grains_compressed, again.grains_shared), (4, 0), "{again:?}");
        assert_eq!(read_all(e, "t", size as usize), want);
    }
    rig.assert_consistent();
    rig.reopen();
    rig.assert_consistent();
    let e = rig.engine();
    assert_eq!(read_all(e, "t", size as usize), want);
    e.delete_vdisk("t").unwrap();
    let st = e.dedup_status();
    assert_eq!((st.physical_bytes, st.packed_bytes), (0, 0), "{st:#?}");
    rig.assert_consistent();
}

/// A read of part of a compressed grain decompresses the grain aside and copies the part; a
/// read of whole grains decompresses them in place; both in one queue.
#[test]
fn parts_of_compressed_grains_read_back_beside_whole_ones() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::default());
    let (size, g) = (4 * MIB, 64 << 10);
    let mut s = VdiskSpec::new("big", size, LayoutKind::Mirror);
    s.grain_size = Some(g);
    s.block_size = Some(512);
    e.create_vdisk(&s).unwrap();
    let v = e.vdisk("big").unwrap();
    let want = compressible(7, 0, size as usize);
    v.write(0, &want, false).unwrap();
    assert_eq!(run_dedup(e).grains_compressed, size / g);
    let (mut part, mut across, mut whole) = (vec![0u8; 512], vec![0u8; 3 * g as usize], vec![0u8; 2 * g as usize]);
    let (p_at, x_at, w_at) = (5 * g + 1536, 20 * g + 4096, 40 * g);
    for r in v.read_many(&mut [(p_at, &mut part[..]), (x_at, &mut across[..]), (w_at, &mut whole[..])]) {
        r.unwrap();
    }
    for (at, got) in [(p_at, &part), (x_at, &across), (w_at, &whole)] {
        assert!(got[..] == want[at as usize..at as usize + got.len()], "read at {at}");
    }
    assert_eq!(read_all(e, "big", size as usize), want);
    rig.assert_consistent();
}

#[test]
fn duplicates_of_compressed_grains_share_their_pieces() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::default());
    let data = compressible(7, 0, MIB as usize);
    vdisk(e, "a", MIB, LayoutKind::Mirror);
    e.vdisk("a").unwrap().write(0, &data, false).unwrap();
    run_dedup(e);
    let packed = e.dedup_status().physical_bytes;
    assert!(packed * 3 < MIB);
    // b gets a's blocks, half of them twice.
    vdisk(e, "b", 2 * MIB, LayoutKind::Mirror);
    let b = e.vdisk("b").unwrap();
    b.write(0, &data, false).unwrap();
    b.write(MIB, &data[..(MIB / 2) as usize], false).unwrap();
    let r = run_dedup(e);
    assert_eq!(r.grains_shared, MIB / G + MIB / G / 2, "{r:?}");
    assert_eq!(r.grains_compressed, 0);
    let st = e.dedup_status();
    assert_eq!(st.physical_bytes, packed, "{st:#?}");
    let mut want = data.clone();
    want.extend_from_slice(&data[..(MIB / 2) as usize]);
    want.resize(2 * MIB as usize, 0);
    assert_eq!(read_all(e, "b", 2 * MIB as usize), want);
    // Deleting a leaves b's references to the pieces.
    e.delete_vdisk("a").unwrap();
    assert_eq!(read_all(e, "b", 2 * MIB as usize), want);
    rig.assert_consistent();
}

#[test]
fn a_grain_that_a_snapshot_holds_too_stays_plain_and_the_snapshot_reads_it() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::default());
    let data = compressible(9, 0, MIB as usize);
    vdisk(e, "t", MIB, LayoutKind::Mirror);
    e.vdisk("t").unwrap().write(0, &data, false).unwrap();
    e.snapshot("t", "s").unwrap();
    let r = run_dedup(e);
    assert_eq!(r.grains_compressed, 0, "packing would only add a copy: {r:?}");
    assert_eq!(e.dedup_status().physical_bytes, MIB);
    // Once t is rewritten, its new grains compress; the snapshot keeps its plain ones.
    let fresh = compressible(10, 0, MIB as usize);
    e.vdisk("t").unwrap().write(0, &fresh, false).unwrap();
    assert_eq!(run_dedup(e).grains_compressed, MIB / G);
    assert_eq!(read_all(e, "t", MIB as usize), fresh);
    assert_eq!(read_all(e, "t@s", MIB as usize), data);
    rig.assert_consistent();
}

#[test]
fn compression_can_be_lz4_balanced_or_off_and_incompressible_grains_stay_plain() {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::Off);
    let text = compressible(11, 0, MIB as usize);
    vdisk(e, "off", MIB, LayoutKind::Mirror);
    e.vdisk("off").unwrap().write(0, &text, false).unwrap();
    assert_eq!(run_dedup(e).grains_compressed, 0);
    enable_dedup(e, Compression::Lz4);
    vdisk(e, "lz4", MIB, LayoutKind::Mirror);
    e.vdisk("lz4")
        .unwrap()
        .write(0, &compressible(12, 0, MIB as usize), false)
        .unwrap();
    vdisk(e, "noise", MIB, LayoutKind::Mirror);
    let noise: Vec<u8> = (0..MIB / G).flat_map(|b| unique_block(5000 + b)).collect();
    e.vdisk("noise").unwrap().write(0, &noise, false).unwrap();
    let r = run_dedup(e);
    assert_eq!(r.grains_compressed, MIB / G, "lz4's grains only: {r:?}");
    assert_eq!(read_all(e, "lz4", MIB as usize), compressible(12, 0, MIB as usize));
    assert_eq!(read_all(e, "noise", MIB as usize), noise);
    assert_eq!(read_all(e, "off", MIB as usize), text);
    // Balanced: hex digits, which lz4 cannot shrink by an eighth, go to zstd; text stays
    // in lz4; both read back from one pool.
    enable_dedup(e, Compression::Balanced);
    vdisk(e, "balanced", MIB, LayoutKind::Mirror);
    let half = MIB as usize / 2;
    let hex: Vec<u8> = (0..half as u64 / G)
        .flat_map(|b| unique_block(9000 + b))
        .map(|x| b"0123456789abcdef"[(x & 15) as usize])
        .collect();
    let mixed: Vec<u8> = hex.into_iter().chain(compressible(13, 0, half)).collect();
    e.vdisk("balanced").unwrap().write(0, &mixed, false).unwrap();
    let r = run_dedup(e);
    assert_eq!(
        r.grains_compressed,
        MIB / G,
        "every grain, in one codec or the other: {r:?}"
    );
    assert_eq!(read_all(e, "balanced", MIB as usize), mixed);
    rig.assert_consistent();
}

/// A grain of `fill` random bytes then zeros: it compresses to a little more than `fill`.
fn partly_random(seed: u64, fill: usize) -> Vec<u8> {
    let mut g = unique_block(seed);
    g[fill..].fill(0);
    g
}

/// On a layout with redundancy, compressed grains are laid end to end: a piece that does not
/// fit in what is left of a pack slot runs on into the next, and a grain pointing at it
/// holds a reference on both. Grains that compress to a little over half a slot (which
/// packs of whole pieces would store one per slot) take about their compressed size; reads,
/// writes over them, a restart and deleting the vdisk keep every count right, and give
/// every slot back.
#[test]
fn pieces_laid_end_to_end_run_on_into_the_next_slot_and_are_counted_on_both() {
    let mut rig = Rig::new(4, 64 * MIB, MIB);
    let grains = 256u64;
    let data: Vec<u8> = (0..grains)
        .flat_map(|i| partly_random(1000 + i, 2100 + (i as usize % 7) * 40))
        .collect();
    {
        let e = rig.engine();
        enable_dedup(e, Compression::Zstd);
        vdisk(e, "a", grains * G, LayoutKind::Mirror);
        e.vdisk("a").unwrap().write(0, &data, false).unwrap();
        let r = run_dedup(e);
        assert_eq!(r.grains_compressed, grains);
        let st = e.dedup_status();
        assert!(
            st.packed_bytes <= r.compressed_bytes_out + G,
            "packed {} for {} of pieces: laid end to end, only the last slot has room",
            st.packed_bytes,
            r.compressed_bytes_out
        );
        assert!(
            r.compressed_bytes_out > grains * G / 2,
            "each piece is over half a slot"
        );
        assert_eq!(read_all(e, "a", data.len()), data);
        rig.assert_consistent();
    }
    // Writes over a third of them copy on write, dropping their pieces' references.
    let mut now = data.clone();
    {
        let v = rig.engine().vdisk("a").unwrap();
        for i in (0..grains).step_by(3) {
            let b = unique_block(5000 + i);
            v.write(i * G, &b, false).unwrap();
            now[(i * G) as usize..((i + 1) * G) as usize].copy_from_slice(&b);
        }
    }
    rig.assert_consistent();
    rig.reopen();
    let e = rig.engine();
    assert_eq!(read_all(e, "a", now.len()), now);
    rig.assert_consistent();
    let scan = e.scan(&Progress::default()).unwrap();
    assert_eq!(scan.findings, 0, "{scan:?}");
    e.delete_vdisk("a").unwrap();
    rig.assert_consistent();
    assert_eq!(e.dedup_status().physical_bytes, 0);
}
