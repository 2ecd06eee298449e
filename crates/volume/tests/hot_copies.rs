//! Second copies of hot slots: on a layout with no redundancy, a slot that more than 100
//! grains share gets a copy in another slab set (on another disk where there is one); a read
//! that fails on the slot reads the copy and rewrites the slot, scrub repairs either from the
//! other, the copy goes once the slot is no longer shared enough, and the counts stay right
//! throughout, across a restart.

mod common;

use common::{compressible, enable_dedup, pattern, run_dedup, Rig, MIB};
use tessera_volume::{Compression, Engine, LayoutKind, Progress, ScrubOptions, VdiskSpec, HOT_REFS};

const G: u64 = 4096;

fn vdisk(e: &Engine, name: &str, blocks: u64, kind: LayoutKind) {
    let mut s = VdiskSpec::new(name, blocks * G, kind);
    s.block_size = Some(4096);
    s.columns = Some(1);
    e.create_vdisk(&s).unwrap();
}

/// `blocks` blocks, of which the first `same` are one block repeated and the rest differ.
fn data(blocks: u64, same: u64, compress: bool) -> Vec<u8> {
    let block = |seed: u64, at: u64| {
        if compress {
            compressible(seed, at, G as usize)
        } else {
            pattern(seed, at, G as usize)
        }
    };
    (0..blocks)
        .flat_map(|b| if b < same { block(1, 0) } else { block(2, b * G) })
        .collect()
}

fn read_all(e: &Engine, name: &str, len: usize) -> std::result::Result<Vec<u8>, String> {
    let mut back = vec![0u8; len];
    e.vdisk(name).unwrap().read(0, &mut back).map_err(|x| x.to_string())?;
    Ok(back)
}

/// The disk a slot lies on and the byte offset of the slot there (sets of one column).
fn place(rig: &Rig, slot: u64) -> (u32, u64) {
    let (set, index) = ((slot >> 32) as u32, slot as u32 as u64);
    let set = rig.engine().layouts().sets().into_iter().find(|s| s.id == set).unwrap();
    let member = set.desc().members[0];
    (member.disk, rig.engine().pool().slab_offset(member) + index * G)
}

/// Flips bits in the first blocks of a slot, as rot on the disk would.
fn rot(rig: &Rig, slot: u64) {
    let (disk, at) = place(rig, slot);
    for k in 0..8 {
        rig.disks[disk as usize].faults().flip_bit(at + k * 97, 3).unwrap();
    }
}

fn scrub(e: &Engine) -> tessera_volume::ScrubPass {
    e.scrub(&ScrubOptions::default(), &Progress::default()).unwrap()
}

#[test]
fn a_slot_shared_by_more_than_a_hundred_grains_is_kept_twice_and_either_copy_repairs_the_other() {
    for compression in [Compression::Off, Compression::Zstd] {
        let compress = compression != Compression::Off;
        let mut rig = Rig::new(3, 64 * MIB, MIB);
        let blocks = 256;
        let hot = HOT_REFS as u64 + 20;
        let want = data(blocks, hot, compress);
        {
            let e = rig.engine();
            enable_dedup(e, compression);
            vdisk(e, "v", blocks, LayoutKind::Simple);
            e.vdisk("v").unwrap().write(0, &want, true).unwrap();
            let r = run_dedup(e);
            assert_eq!(r.hot_copies_made, 1, "{compression:?}: {r:#?}");
            assert_eq!(e.hot_copies().len(), 1);
            let st = e.dedup_status();
            assert_eq!((st.hot_copies, st.hot_copy_bytes), (1, G), "{st:#?}");
        }
        rig.assert_consistent();
        let (primary, copy) = rig.engine().hot_copies()[0];
        assert_ne!(
            place(&rig, primary).0,
            place(&rig, copy).0,
            "the copy is on another disk than the slot"
        );

        // Rot in the slot: the read takes the copy, and puts the slot right.
        rot(&rig, primary);
        assert_eq!(
            read_all(rig.engine(), "v", want.len()).unwrap(),
            want,
            "{compression:?}"
        );
        let pass = scrub(rig.engine());
        assert_eq!(pass.hot_copies.pairs, 1);
        assert_eq!(pass.hot_copies.repaired, 0, "the read rewrote the slot already");
        assert_eq!(pass.tally.unrecoverable_total(), 0, "{pass:#?}");

        // Rot in the copy, then in the slot: scrub rewrites each from the other.
        for bad in [copy, primary] {
            rot(&rig, bad);
            let pass = scrub(rig.engine());
            assert_eq!(pass.hot_copies.repaired, 1, "{compression:?}, {bad:#x}: {pass:#?}");
            assert_eq!(pass.tally.unrecoverable_total(), 0, "{pass:#?}");
            assert_eq!(scrub(rig.engine()).hot_copies.repaired, 0);
        }
        assert_eq!(read_all(rig.engine(), "v", want.len()).unwrap(), want);

        // Kept across a restart.
        rig.reopen();
        rig.assert_consistent();
        assert_eq!(rig.engine().hot_copies(), vec![(primary, copy)]);
        rot(&rig, primary);
        assert_eq!(read_all(rig.engine(), "v", want.len()).unwrap(), want);

        // Overwritten down to half the threshold (everything else too: the other pieces of
        // a pack slot count as its references): the next run drops the copy and gives its
        // slot back.
        let e = rig.engine();
        let used = e.pool().capacity().used_bytes;
        let keep = HOT_REFS as u64 / 2;
        let fresh = pattern(3, 0, ((blocks - keep) * G) as usize);
        e.vdisk("v").unwrap().write(keep * G, &fresh, true).unwrap();
        let r = run_dedup(e);
        assert_eq!(r.hot_copies_dropped, 1, "{r:#?}");
        assert!(e.hot_copies().is_empty());
        assert_eq!(e.dedup_status().hot_copy_bytes, 0);
        let mut now = want.clone();
        now[(keep * G) as usize..].copy_from_slice(&fresh);
        assert_eq!(read_all(e, "v", now.len()).unwrap(), now);
        assert!(e.pool().capacity().used_bytes <= used);
        rig.assert_consistent();
    }
}

#[test]
fn a_slot_at_the_threshold_or_on_a_redundant_layout_gets_no_copy() {
    let rig = Rig::new(3, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::Off);
    // Exactly HOT_REFS grains on a simple layout; more than that on a mirror.
    vdisk(e, "simple", 200, LayoutKind::Simple);
    e.vdisk("simple")
        .unwrap()
        .write(0, &data(200, HOT_REFS as u64, false), true)
        .unwrap();
    let mut m = VdiskSpec::new("mirror", 200 * G, LayoutKind::Mirror);
    m.block_size = Some(4096);
    e.create_vdisk(&m).unwrap();
    e.vdisk("mirror")
        .unwrap()
        .write(0, &data(200, 150, false), true)
        .unwrap();
    assert_eq!(run_dedup(e).hot_copies_made, 0);
    assert!(e.hot_copies().is_empty());
    rig.assert_consistent();
    // Without a copy, rot in the shared slot fails the read of every grain that shares it
    // (what the copy is for); it never returns wrong data.
    let slot = rig
        .engine()
        .layouts()
        .sets()
        .into_iter()
        .find(|s| s.spec.tolerance() == 0)
        .map(|s| (s.id as u64) << 32)
        .unwrap();
    rot(&rig, slot);
    let mut b = vec![0u8; G as usize];
    assert!(e.vdisk("simple").unwrap().read(0, &mut b).is_err());
}

#[test]
fn deleting_the_vdisks_that_share_a_hot_slot_gives_both_copies_back_at_the_next_gc() {
    let rig = Rig::new(2, 64 * MIB, MIB);
    let e = rig.engine();
    enable_dedup(e, Compression::Off);
    vdisk(e, "a", 128, LayoutKind::Simple);
    e.vdisk("a").unwrap().write(0, &data(128, 128, false), true).unwrap();
    let before = e.pool().capacity().used_bytes;
    assert_eq!(run_dedup(e).hot_copies_made, 1);
    rig.assert_consistent();
    e.delete_vdisk("a").unwrap();
    rig.assert_consistent();
    assert_eq!(e.hot_copies().len(), 1, "kept until an upkeep");
    let gc = e.dedup_gc(&Progress::default()).unwrap();
    assert_eq!(gc.hot_copies_dropped, 1);
    assert!(e.hot_copies().is_empty());
    rig.assert_consistent();
    assert!(e.pool().capacity().used_bytes <= before);
}
