//! Model-based property tests: random sequences of writes, zero writes, trims, flushes,
//! clone_range, snapshots, clones of vdisks and snapshots, frozen images pasted back (what ODX
//! tokens are), deletes of all of these in random order, disk failures within tolerance,
//! repairs, restarts and dedup runs (with a weak fingerprint now and then, so that different
//! data collides), for every layout and
//! both provisioning types, checked block for block against an in-memory model, and ending
//! with a metadata consistency check and a scrub of the redundancy.
//!
//! TESSERA_PROPTEST_CASES sets the number of cases per configuration (CI runs a few dozen).

mod common;

use common::{compressible, pattern, spec, Rig, MIB};
use proptest::prelude::*;
use tessera_volume::{
    DedupMode, DedupSettings, Fingerprinter, Frozen, LayoutKind, PassOptions, Progress, Provisioning, RebuildOptions,
};

const BLOCK: u64 = 512;
const GRAIN_BLOCKS: u64 = 32; // 16 KiB grains
const VDISK_SIZE: u64 = 768 * 1024 + 512; // a partial last grain on purpose
const BLOCKS: u64 = VDISK_SIZE / BLOCK;
const DISKS: usize = 8;

#[derive(Debug, Clone)]
enum Op {
    Write {
        vd: usize,
        blk: u64,
        n: u64,
        seed: u64,
        fua: bool,
    },
    Zero {
        vd: usize,
        blk: u64,
        n: u64,
        unmap: bool,
    },
    Trim {
        vd: usize,
        blk: u64,
        n: u64,
    },
    /// Whole grains of one of a few contents, the same wherever they land: duplicates for
    /// dedup to find, within a vdisk and across vdisks.
    WriteCommon {
        vd: usize,
        grain: u64,
        grains: u64,
        content: u64,
    },
    Dedup {
        weak: bool,
        background: bool,
    },
    Flush,
    Clone {
        src: usize,
        dst: usize,
        sblk: u64,
        dblk: u64,
        n: u64,
    },
    Snapshot {
        vd: usize,
    },
    /// A clone of a vdisk (below 2) or of an extra image (snapshot or clone).
    CloneOf {
        src: usize,
    },
    DeleteExtra {
        idx: usize,
    },
    Freeze {
        vd: usize,
        blk: u64,
        n: u64,
    },
    Paste {
        img: usize,
        vd: usize,
        iblk: u64,
        dblk: u64,
        n: u64,
    },
    DropFrozen {
        img: usize,
    },
    FailDisk {
        disk: usize,
        admin: bool,
    },
    Repair,
    Reopen,
}

fn clamp(blk: u64, n: u64) -> (u64, u64) {
    let blk = blk % BLOCKS;
    (blk, n.clamp(1, BLOCKS - blk))
}

fn op() -> impl Strategy<Value = Op> {
    let range = (0..BLOCKS, 1u64..200);
    prop_oneof![
        8 => (0..2usize, range.clone(), any::<u64>(), any::<bool>()).prop_map(|(vd, (blk, n), seed, fua)| Op::Write { vd, blk, n, seed, fua }),
        2 => (0..2usize, range.clone(), any::<bool>()).prop_map(|(vd, (blk, n), unmap)| Op::Zero { vd, blk, n, unmap }),
        2 => (0..2usize, range.clone()).prop_map(|(vd, (blk, n))| Op::Trim { vd, blk, n }),
        3 => (0..2usize, 0..BLOCKS / GRAIN_BLOCKS, 1u64..6, 0..4u64).prop_map(|(vd, grain, grains, content)| Op::WriteCommon { vd, grain, grains, content }),
        2 => (any::<bool>(), any::<bool>()).prop_map(|(weak, background)| Op::Dedup { weak, background }),
        1 => Just(Op::Flush),
        // Half of the clones grain-aligned, so that sharing (not copying) is exercised.
        3 => (0..2usize, 0..2usize, 0..BLOCKS, 0..BLOCKS, 1u64..300, any::<bool>()).prop_map(|(src, dst, s, d, n, aligned)| {
            let (s, d) = if aligned { (s / GRAIN_BLOCKS * GRAIN_BLOCKS, d / GRAIN_BLOCKS * GRAIN_BLOCKS) } else { (s, d) };
            Op::Clone { src, dst, sblk: s, dblk: d, n }
        }),
        1 => (0..2usize).prop_map(|vd| Op::Snapshot { vd }),
        1 => (0..6usize).prop_map(|src| Op::CloneOf { src }),
        1 => (0..8usize).prop_map(|idx| Op::DeleteExtra { idx }),
        2 => (0..2usize, range.clone()).prop_map(|(vd, (blk, n))| Op::Freeze { vd, blk, n }),
        3 => (0..4usize, 0..2usize, 0..BLOCKS, 0..BLOCKS, 1u64..300, any::<bool>()).prop_map(|(img, vd, i, d, n, aligned)| {
            let (i, d) = if aligned { (i / GRAIN_BLOCKS * GRAIN_BLOCKS, d / GRAIN_BLOCKS * GRAIN_BLOCKS) } else { (i, d) };
            Op::Paste { img, vd, iblk: i, dblk: d, n }
        }),
        1 => (0..4usize).prop_map(|img| Op::DropFrozen { img }),
        1 => (0..DISKS, any::<bool>()).prop_map(|(disk, admin)| Op::FailDisk { disk, admin }),
        1 => Just(Op::Repair),
        1 => Just(Op::Reopen),
    ]
}

struct Model {
    data: Vec<Vec<u8>>,
    failed: Vec<bool>,
    failed_since_repair: usize,
}

/// Cache disks of a run with the write-back cache: a third, so that a failed one is replaced.
const CACHE_DISKS: usize = 3;

fn run(kind: LayoutKind, copies: Option<u8>, prov: Provisioning, ops: Vec<Op>) {
    run_with(kind, copies, prov, ops, false)
}

fn run_with(kind: LayoutKind, copies: Option<u8>, prov: Provisioning, ops: Vec<Op>, cache: bool) {
    let mut rig = if cache {
        Rig::with_cache(DISKS, 40 * MIB, MIB, CACHE_DISKS)
    } else {
        Rig::new(DISKS, 40 * MIB, MIB)
    };
    let (mut cache_failed, mut wrote, mut reopened) = (0, false, false);
    let mut s = spec("a", VDISK_SIZE, kind, prov);
    s.copies = copies;
    let layout = rig.engine().create_vdisk(&s).unwrap().config().layout;
    s.name = "b".into();
    rig.engine().create_vdisk(&s).unwrap();
    let names = ["a", "b"];
    rig.engine()
        .set_dedup_settings(DedupSettings {
            enabled: true,
            min_age_secs: 0,
            ..Default::default()
        })
        .unwrap();
    let mut m = Model {
        data: vec![vec![0u8; VDISK_SIZE as usize]; 2],
        failed: vec![false; DISKS],
        failed_since_repair: 0,
    };
    // Snapshots and clones, with the bytes they must read as; frozen images likewise.
    let mut extras: Vec<(String, Vec<u8>)> = Vec::new();
    let mut frozen: Vec<(Frozen, Vec<u8>)> = Vec::new();
    let mut made = 0;

    for (step, op) in ops.into_iter().enumerate() {
        let e = rig.engine();
        match op {
            Op::Write { vd, blk, n, seed, fua } => {
                let (blk, n) = clamp(blk, n);
                let (off, len) = (blk * BLOCK, (n * BLOCK) as usize);
                let bytes = pattern(seed, off, len);
                e.vdisk(names[vd]).unwrap().write(off, &bytes, fua).unwrap();
                m.data[vd][off as usize..off as usize + len].copy_from_slice(&bytes);
                wrote = true;
            }
            Op::WriteCommon {
                vd,
                grain,
                grains,
                content,
            } => {
                let g = GRAIN_BLOCKS * BLOCK;
                let grains = grains.min(BLOCKS / GRAIN_BLOCKS - grain);
                let (off, len) = (grain * g, (grains * g) as usize);
                // Half the contents compress (and are packed by dedup), half do not.
                let one = if content % 2 == 0 {
                    compressible(1000 + content, 0, g as usize)
                } else {
                    pattern(1000 + content, 0, g as usize)
                };
                let bytes = one.repeat(grains as usize);
                e.vdisk(names[vd]).unwrap().write(off, &bytes, false).unwrap();
                m.data[vd][off as usize..off as usize + len].copy_from_slice(&bytes);
                wrote = true;
            }
            Op::Dedup { weak, background } => {
                e.set_fingerprinter(if weak {
                    Fingerprinter::Weak { bits: 2 }
                } else {
                    Fingerprinter::Blake3
                });
                // A background run fingerprints on one thread, a throughput run on up to one
                // per core; both unpaced here.
                let opts = PassOptions {
                    mode: if background {
                        DedupMode::Background
                    } else {
                        DedupMode::Throughput
                    },
                    rate: Some(0),
                    ignore_min_age: true,
                };
                e.dedup_run(&opts, &Progress::default()).unwrap();
            }
            Op::Zero { vd, blk, n, unmap } => {
                let (blk, n) = clamp(blk, n);
                let (off, len) = (blk * BLOCK, n * BLOCK);
                e.vdisk(names[vd])
                    .unwrap()
                    .write_zeroes(off, len, unmap, false)
                    .unwrap();
                m.data[vd][off as usize..(off + len) as usize].fill(0);
            }
            Op::Trim { vd, blk, n } => {
                let (blk, n) = clamp(blk, n);
                let (off, len) = (blk * BLOCK, n * BLOCK);
                e.vdisk(names[vd]).unwrap().trim(off, len).unwrap();
                m.data[vd][off as usize..(off + len) as usize].fill(0);
            }
            Op::Flush => e.flush().unwrap(),
            Op::Clone {
                src,
                dst,
                sblk,
                dblk,
                n,
            } => {
                let (sblk, n) = clamp(sblk, n);
                let (dblk, n) = clamp(dblk, n);
                let n = n.min(BLOCKS - sblk);
                let (so, d_o, len) = (sblk * BLOCK, dblk * BLOCK, n * BLOCK);
                let (sv, dv) = (e.vdisk(names[src]).unwrap(), e.vdisk(names[dst]).unwrap());
                e.clone_range(&sv, so, &dv, d_o, len).unwrap();
                let chunk = m.data[src][so as usize..(so + len) as usize].to_vec();
                m.data[dst][d_o as usize..(d_o + len) as usize].copy_from_slice(&chunk);
            }
            Op::Snapshot { vd } => {
                made += 1;
                let snap = e.snapshot(names[vd], &format!("s{made}")).unwrap();
                assert!(snap.write(0, &[1u8; 512], false).is_err(), "a snapshot is read-only");
                extras.push((format!("{}@s{made}", names[vd]), m.data[vd].clone()));
            }
            Op::CloneOf { src } => {
                let (from, bytes) = if src < 2 || extras.is_empty() {
                    (names[src % 2].to_string(), m.data[src % 2].clone())
                } else {
                    extras[src % extras.len()].clone()
                };
                made += 1;
                let name = format!("c{made}");
                e.clone_vdisk(&from, &name).unwrap();
                extras.push((name, bytes));
            }
            Op::DeleteExtra { idx } => {
                if !extras.is_empty() {
                    let (name, _) = extras.remove(idx % extras.len());
                    e.delete_vdisk(&name).unwrap();
                }
            }
            Op::Freeze { vd, blk, n } => {
                let (blk, n) = clamp(blk, n);
                let (off, len) = (blk * BLOCK, n * BLOCK);
                // Two ranges, the second one block long, so images have several pieces.
                let second = (BLOCKS - 1 - blk) * BLOCK;
                let img = e
                    .vdisk(names[vd])
                    .unwrap()
                    .freeze(&[(off, len), (second, BLOCK)])
                    .unwrap();
                let mut bytes = m.data[vd][off as usize..(off + len) as usize].to_vec();
                bytes.extend_from_slice(&m.data[vd][second as usize..(second + BLOCK) as usize]);
                frozen.push((img, bytes));
            }
            Op::Paste { img, vd, iblk, dblk, n } => {
                if frozen.is_empty() {
                    continue;
                }
                let (image, bytes) = &frozen[img % frozen.len()];
                let iblocks = image.len() / BLOCK;
                let iblk = iblk % iblocks;
                let (dblk, n) = clamp(dblk, n);
                let n = n.min(iblocks - iblk);
                let (io, d_o, len) = (iblk * BLOCK, dblk * BLOCK, n * BLOCK);
                e.vdisk(names[vd]).unwrap().paste(d_o, image, io, len).unwrap();
                m.data[vd][d_o as usize..(d_o + len) as usize]
                    .copy_from_slice(&bytes[io as usize..(io + len) as usize]);
            }
            Op::DropFrozen { img } => {
                if !frozen.is_empty() {
                    frozen.remove(img % frozen.len());
                }
            }
            Op::FailDisk { disk, admin } if cache && disk % 3 == 0 && cache_failed < 2 => {
                // A cache disk instead, pulled (an error on its next write) or failed by the
                // administrator: the log goes on from its other copy.
                let c = DISKS + cache_failed;
                if admin {
                    e.fail_disk(&format!("cache{cache_failed}")).unwrap();
                } else {
                    rig.disks[c].faults().pull();
                    // Noticed at the next flush (or write) of the log, before any other
                    // disk of the log can fail: two at once is beyond its tolerance.
                    e.flush().unwrap();
                }
                cache_failed += 1;
            }
            Op::FailDisk { disk, admin } => {
                let healthy = m.failed.iter().filter(|f| !**f).count();
                if m.failed[disk] || m.failed_since_repair >= layout.tolerance() || healthy - 1 < layout.width() + 1 {
                    continue;
                }
                if admin {
                    e.fail_disk(&format!("mem{disk}")).unwrap();
                } else {
                    rig.disks[disk].faults().pull();
                }
                m.failed[disk] = true;
                m.failed_since_repair += 1;
            }
            Op::Repair => {
                // A flush fails a pulled disk that no write has touched yet.
                e.flush().unwrap();
                let report = e
                    .repair(
                        &RebuildOptions {
                            parallel: 2,
                            rate_limit: None,
                        },
                        &Progress::default(),
                    )
                    .unwrap();
                assert!(
                    report.failures.is_empty(),
                    "step {step}: repair failures {:?}",
                    report.failures
                );
                m.failed_since_repair = 0;
            }
            Op::Reopen => {
                reopened = true;
                rig.assert_consistent();
                // Frozen images live in memory only: a restart ends them.
                frozen.clear();
                // A clean stop, as the daemon's: it checkpoints, so a disk lost before it
                // leaves no region to resync. (After a crash with a disk lost, regions being
                // written refuse reconstruction: crates/volume/tests/power_cut.rs.)
                rig.engine().checkpoint().unwrap();
                rig.reopen();
            }
        }
        for (name, want) in &extras {
            let mut got = vec![0u8; VDISK_SIZE as usize];
            rig.engine().vdisk(name).unwrap().read(0, &mut got).unwrap();
            assert!(
                &got == want,
                "step {step} ({op:?}): {name} does not read as when it was made"
            );
        }
        for (i, (image, want)) in frozen.iter().enumerate() {
            let mut got = vec![0u8; image.len() as usize];
            image.read(0, &mut got).unwrap();
            assert!(&got == want, "step {step} ({op:?}): frozen image {i} changed");
        }
        for (vd, name) in names.iter().enumerate() {
            let mut got = vec![0u8; VDISK_SIZE as usize];
            rig.engine().vdisk(name).unwrap().read(0, &mut got).unwrap();
            if got != m.data[vd] {
                let first = got.iter().zip(&m.data[vd]).position(|(a, b)| a != b).unwrap();
                panic!("step {step} ({op:?}): vdisk {name} differs from the model first at byte {first}");
            }
        }
    }
    if cache && wrote {
        let c = rig.engine().cache_status();
        assert!(
            c.cached_bytes > 0 || cache_failed > 0 || reopened,
            "the writes bypassed the write-back cache: {c:?}"
        );
    }
    rig.assert_consistent();
    let e = rig.engine();
    for set in e.layouts().sets() {
        let bad = e.layouts().scrub_set(&set).unwrap();
        assert!(bad.is_empty(), "redundancy does not match the data: {bad:?}");
    }
    // Deleting everything, in an order the case picked, gives every grain back.
    let mut all: Vec<String> = extras.iter().map(|(n, _)| n.clone()).collect();
    let k = all.len() / 2;
    all.insert(k.min(all.len()), "a".into());
    all.push("b".into());
    for name in all {
        e.delete_vdisk(&name).unwrap();
    }
    rig.assert_consistent();
    frozen.clear();
    rig.assert_consistent();
    assert!(
        rig.engine().layouts().sets().is_empty(),
        "slab sets left behind after every vdisk was deleted"
    );
}

fn cases() -> u32 {
    std::env::var("TESSERA_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

macro_rules! model_test {
    ($name:ident, $kind:expr, $copies:expr, $prov:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]
            #[test]
            fn $name(ops in prop::collection::vec(op(), 1..40)) {
                run($kind, $copies, $prov, ops);
            }
        }
    };
}

macro_rules! cached_model_test {
    ($name:ident, $kind:expr, $copies:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]
            #[test]
            fn $name(ops in prop::collection::vec(op(), 1..40)) {
                run_with($kind, $copies, Provisioning::Thin, ops, true);
            }
        }
    };
}

model_test!(simple_thin, LayoutKind::Simple, None, Provisioning::Thin);
model_test!(simple_fixed, LayoutKind::Simple, None, Provisioning::Fixed);
model_test!(mirror2_thin, LayoutKind::Mirror, Some(2), Provisioning::Thin);
model_test!(mirror2_fixed, LayoutKind::Mirror, Some(2), Provisioning::Fixed);
model_test!(mirror3_thin, LayoutKind::Mirror, Some(3), Provisioning::Thin);
model_test!(mirror3_fixed, LayoutKind::Mirror, Some(3), Provisioning::Fixed);
model_test!(parity_thin, LayoutKind::Parity, None, Provisioning::Thin);
model_test!(parity_fixed, LayoutKind::Parity, None, Provisioning::Fixed);
model_test!(dual_parity_thin, LayoutKind::DualParity, None, Provisioning::Thin);
model_test!(dual_parity_fixed, LayoutKind::DualParity, None, Provisioning::Fixed);

// The same, with the write-back cache: data sits in the log while it is read, overwritten,
// trimmed, cloned, snapshotted, frozen, reopened (replayed) and destaged; a cache disk fails
// now and then.
cached_model_test!(simple_cached, LayoutKind::Simple, None);
cached_model_test!(mirror2_cached, LayoutKind::Mirror, Some(2));
cached_model_test!(mirror3_cached, LayoutKind::Mirror, Some(3));
cached_model_test!(parity_cached, LayoutKind::Parity, None);
cached_model_test!(dual_parity_cached, LayoutKind::DualParity, None);

/// A sequence the parity model found: a disk pulled, a block written (into a set on that
/// disk), dedup moving it into a pack in a new set and freeing the old one, a repair, a
/// second disk of the freed set pulled, and a write with FUA: its flush must not fail for
/// the freed set, which holds nothing any more.
#[test]
fn parity_a_dedup_between_two_disk_failures_with_a_repair_between() {
    for _ in 0..5 {
        run(
            LayoutKind::Parity,
            None,
            Provisioning::Thin,
            vec![
                Op::FailDisk { disk: 1, admin: false },
                Op::Write {
                    vd: 0,
                    blk: 0,
                    n: 1,
                    seed: 0,
                    fua: false,
                },
                Op::Dedup {
                    weak: false,
                    background: false,
                },
                Op::Repair,
                Op::FailDisk { disk: 0, admin: false },
                Op::Write {
                    vd: 0,
                    blk: 0,
                    n: 1,
                    seed: 0,
                    fua: true,
                },
            ],
        );
    }
}
