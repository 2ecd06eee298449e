//! Many threads at once on shared vdisks: each owns a region of two vdisks and writes, trims,
//! zeroes and clones inside it (clones also across the two vdisks, so grains are shared and
//! copied on write concurrently), verifying every read against its own model, while a disk is
//! pulled and the pool repaired under load. Then the metadata check must be clean.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use common::{pattern, spec, Rig, MIB};
use rand::{Rng, SeedableRng};
use tessera_volume::{LayoutKind, Progress, Provisioning, RebuildOptions};

const THREADS: u64 = 6;
const REGION: u64 = 512 << 10;
const SIZE: u64 = THREADS * REGION;
const BLOCK: u64 = 4096;

fn run(kind: LayoutKind) {
    let rig = Rig::new(6, 64 * MIB, MIB);
    let e = rig.engine();
    for name in ["a", "b"] {
        let mut s = spec(name, SIZE, kind, Provisioning::Thin);
        s.block_size = Some(4096);
        e.create_vdisk(&s).unwrap();
    }
    let (a, b) = (e.vdisk("a").unwrap(), e.vdisk("b").unwrap());
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (a, b) = (&a, &b);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let base = t * REGION;
                let mut model = [vec![0u8; REGION as usize], vec![0u8; REGION as usize]];
                let vds = [a, b];
                for step in 0..150u64 {
                    let vd = rng.random_range(0..2);
                    let blocks = REGION / BLOCK;
                    let off = rng.random_range(0..blocks) * BLOCK;
                    let len = rng.random_range(1..=(blocks - off / BLOCK).min(24)) * BLOCK;
                    let r = off as usize..(off + len) as usize;
                    match rng.random_range(0..10) {
                        0 => {
                            vds[vd].trim(base + off, len).unwrap();
                            model[vd][r].fill(0);
                        }
                        1 => {
                            vds[vd].write_zeroes(base + off, len, false, false).unwrap();
                            model[vd][r].fill(0);
                        }
                        2 | 3 => {
                            // Clone within this thread's region, from either vdisk, grain
                            // aligned half of the time.
                            let src = rng.random_range(0..2);
                            let mut so = rng.random_range(0..blocks - len / BLOCK + 1) * BLOCK;
                            let mut d_o = off;
                            if rng.random_bool(0.5) {
                                so -= so % (16 << 10);
                                d_o -= d_o % (16 << 10);
                            }
                            let len = len.min(REGION - so).min(REGION - d_o);
                            e.clone_range(vds[src], base + so, vds[vd], base + d_o, len).unwrap();
                            let chunk = model[src][so as usize..(so + len) as usize].to_vec();
                            model[vd][d_o as usize..(d_o + len) as usize].copy_from_slice(&chunk);
                        }
                        _ => {
                            let data = pattern(t * 1000 + step, off, len as usize);
                            vds[vd].write(base + off, &data, rng.random_bool(0.1)).unwrap();
                            model[vd][r].copy_from_slice(&data);
                        }
                    }
                    let mut got = vec![0u8; REGION as usize];
                    vds[vd].read(base, &mut got).unwrap();
                    assert!(
                        got == model[vd],
                        "thread {t} step {step}: region of vdisk {vd} differs from its model"
                    );
                }
            });
        }
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            if kind != LayoutKind::Simple {
                rig.disks[2].faults().pull();
                std::thread::sleep(std::time::Duration::from_millis(100));
                e.flush().unwrap();
                let r = e
                    .repair(
                        &RebuildOptions {
                            parallel: 2,
                            rate_limit: None,
                        },
                        &Progress::default(),
                    )
                    .unwrap();
                assert!(r.failures.is_empty(), "{:?}", r.failures);
            }
            done.store(true, Ordering::SeqCst);
        });
    });
    assert!(done.load(Ordering::SeqCst));
    rig.assert_consistent();
    for set in e.layouts().sets() {
        assert!(e.layouts().scrub_set(&set).unwrap().is_empty());
    }
}

#[test]
fn concurrent_simple() {
    run(LayoutKind::Simple);
}

#[test]
fn concurrent_mirror() {
    run(LayoutKind::Mirror);
}

#[test]
fn concurrent_parity() {
    run(LayoutKind::Parity);
}

#[test]
fn concurrent_dual_parity() {
    run(LayoutKind::DualParity);
}

/// Writers that find a class full at the same moment share the one slab set it needs,
/// instead of each adding their own and running the pool out of slabs.
#[test]
fn simultaneous_first_writes_add_one_slab_set() {
    let rig = Rig::new(3, 64 * MIB, MIB);
    let e = rig.engine();
    let v = e
        .create_vdisk(&spec("v", 8 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    assert_eq!(e.layouts().sets().len(), 0);
    let writers = 12u64;
    let start = std::sync::Barrier::new(writers as usize);
    std::thread::scope(|s| {
        for t in 0..writers {
            let (v, start) = (&v, &start);
            s.spawn(move || {
                let data = pattern(t, 0, 4096);
                start.wait();
                v.write(t * (64 << 10), &data, false).unwrap();
            });
        }
    });
    assert_eq!(e.layouts().sets().len(), 1, "one set holds all {writers} grains");
    for t in 0..writers {
        let mut b = vec![0u8; 4096];
        v.read(t * (64 << 10), &mut b).unwrap();
        assert_eq!(b, pattern(t, 0, 4096));
    }
    rig.assert_consistent();
}

/// Many writers that fill small slab sets as fast as they are added never get a false "no
/// space": an allocation that loses the slots of a new set to others tries again for as long
/// as the pool can grow. Only a pool that is really full says so.
#[test]
fn writers_racing_for_new_sets_never_run_out_while_the_pool_has_room() {
    // 1 MiB slabs: 64 grains of 16 KiB per set, as many as there are writers.
    let rig = Rig::new(2, 96 * MIB, MIB);
    let e = rig.engine();
    let v = e
        .create_vdisk(&spec("v", 64 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let writers = 64u64;
    let grain = 16u64 << 10;
    let grains = 64 * MIB / grain;
    let start = std::sync::Barrier::new(writers as usize);
    std::thread::scope(|s| {
        for t in 0..writers {
            let (v, start) = (&v, &start);
            s.spawn(move || {
                start.wait();
                for g in (t..grains).step_by(writers as usize) {
                    v.write(g * grain, &pattern(g, 0, 4096), false).unwrap();
                }
            });
        }
    });
    for g in 0..grains {
        let mut b = vec![0u8; 4096];
        v.read(g * grain, &mut b).unwrap();
        assert_eq!(b, pattern(g, 0, 4096));
    }
    rig.assert_consistent();
    // Past the pool's end the answer is a real "no space".
    let w = e
        .create_vdisk(&spec("w", 64 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let err = (0..grains)
        .find_map(|g| w.write(g * grain, &[1u8; 4096], false).err())
        .expect("a 96 MiB pool cannot hold two full 64 MiB mirrors");
    assert!(err.is_no_space(), "{err}");
}
