//! Bit rot behind the engine's back: bits flipped on the disks are caught by the block
//! checksums on read, the read returns the right data from another copy or from parity and
//! rewrites the bad copy, a scrub repairs every flip it finds and a second scrub finds
//! nothing. Past the layout's tolerance a read fails; it never returns wrong data.

mod common;

use std::collections::{BTreeMap, HashSet};

use common::{pattern, spec, Rig, MIB};
use tessera_volume::{LayoutKind, Progress, Provisioning, RebuildOptions, SlabRef};

const SIZE: u64 = 4 * MIB;
const BLOCK: u64 = 4096;
const FLIPS: usize = 1000;

/// A tiny deterministic generator: the failures it finds can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn layouts() -> Vec<(&'static str, LayoutKind, Option<u8>)> {
    vec![
        ("mirror", LayoutKind::Mirror, Some(2)),
        ("3-way mirror", LayoutKind::Mirror, Some(3)),
        ("parity", LayoutKind::Parity, None),
        ("dual parity", LayoutKind::DualParity, None),
    ]
}

fn rig_with(kind: LayoutKind, copies: Option<u8>) -> (Rig, Vec<u8>) {
    let rig = Rig::new(6, 64 * MIB, MIB);
    let mut s = spec("v", SIZE, kind, Provisioning::Thin);
    s.copies = copies;
    rig.engine().create_vdisk(&s).unwrap();
    let data = pattern(11, 0, SIZE as usize);
    rig.engine().vdisk("v").unwrap().write(0, &data, true).unwrap();
    (rig, data)
}

/// Every member slab of every set, with its set's index in `sets()`.
fn member_slabs(rig: &Rig) -> Vec<(usize, usize, SlabRef)> {
    let mut out = Vec::new();
    for (s, set) in rig.engine().layouts().sets().iter().enumerate() {
        for (m, slab) in set.desc().members.into_iter().enumerate() {
            out.push((s, m, slab));
        }
    }
    out
}

/// The bytes of every member slab on a disk (the label, rewritten at each import, left out).
fn disk_image(rig: &Rig, disk: u32) -> Vec<(SlabRef, Vec<u8>)> {
    let d = &rig.disks[disk as usize];
    let mut out = Vec::new();
    for (_, _, slab) in member_slabs(rig).into_iter().filter(|x| x.2.disk == disk) {
        let mut b = tessera_disk::AlignedBuf::zeroed(MIB as usize);
        d.inner()
            .read_at(&mut b, rig.engine().pool().slab_offset(slab))
            .unwrap();
        out.push((slab, b.to_vec()));
    }
    out.sort_by_key(|x| (x.0.disk, x.0.slab));
    out
}

/// Where two images of a disk's slabs first differ, if they do.
fn first_difference(a: &[(SlabRef, Vec<u8>)], b: &[(SlabRef, Vec<u8>)]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("{} slabs then, {} now", a.len(), b.len()));
    }
    a.iter().zip(b).find_map(|((sa, da), (sb, db))| {
        if sa != sb {
            return Some(format!("slab {sa:?} then, {sb:?} now"));
        }
        da.iter()
            .zip(db)
            .position(|(x, y)| x != y)
            .map(|at| format!("slab {sa:?}, byte {at}"))
    })
}

/// Flips one bit at each of `n` distinct bytes of the member slabs on `disk`, avoiding the
/// 4 KiB blocks (by offset within the slab) listed in `avoid`. Returns the blocks it hit.
fn flip(rig: &Rig, rng: &mut Rng, disk: u32, n: usize, avoid: &HashSet<u64>) -> HashSet<u64> {
    let slabs: Vec<SlabRef> = member_slabs(rig)
        .into_iter()
        .map(|x| x.2)
        .filter(|s| s.disk == disk)
        .collect();
    assert!(!slabs.is_empty(), "disk {disk} holds no member of the vdisk");
    let mut hit = HashSet::new();
    let mut bytes = HashSet::new();
    while bytes.len() < n {
        let slab = slabs[rng.below(slabs.len() as u64) as usize];
        let mo = rng.below(MIB);
        if avoid.contains(&(mo / BLOCK)) || !bytes.insert((slab, mo)) {
            continue;
        }
        let at = rig.engine().pool().slab_offset(slab) + mo;
        rig.disks[disk as usize]
            .faults()
            .flip_bit(at, (rng.next() % 8) as u8)
            .unwrap();
        hit.insert(mo / BLOCK);
    }
    hit
}

fn read_all(rig: &Rig) -> Vec<u8> {
    let mut b = vec![0u8; SIZE as usize];
    rig.engine().vdisk("v").unwrap().read(0, &mut b).unwrap();
    b
}

fn scrub(rig: &Rig) -> tessera_volume::ScrubTally {
    let l = rig.engine().layouts();
    let mut t = tessera_volume::ScrubTally::default();
    for set in l.sets() {
        t.add(l.scrub_rows(&set, 0..l.rows_of(&set), true).unwrap());
    }
    t
}

/// The disk holding the most member slabs, and another one holding some.
fn two_disks(rig: &Rig) -> (u32, u32) {
    let mut count: BTreeMap<u32, usize> = BTreeMap::new();
    for (_, _, s) in member_slabs(rig) {
        *count.entry(s.disk).or_default() += 1;
    }
    let mut by: Vec<(usize, u32)> = count.into_iter().map(|(d, n)| (n, d)).collect();
    by.sort();
    (by[by.len() - 1].1, by[by.len() - 2].1)
}

#[test]
fn flips_on_one_disk_read_right_are_repaired_and_a_second_scrub_finds_nothing() {
    for (name, kind, copies) in layouts() {
        let (rig, data) = rig_with(kind, copies);
        let (disk, _) = two_disks(&rig);
        let before = disk_image(&rig, disk);
        let mut rng = Rng(0x5EED ^ kind as u64);
        flip(&rig, &mut rng, disk, FLIPS, &HashSet::new());
        assert!(read_all(&rig) == data, "{name}: a read returned rotten data");
        // Small reads too: each 4 KiB block alone.
        let v = rig.engine().vdisk("v").unwrap();
        for at in (0..SIZE).step_by(BLOCK as usize * 7) {
            let mut b = vec![0u8; BLOCK as usize];
            v.read(at, &mut b).unwrap();
            assert!(
                b == data[at as usize..(at + BLOCK) as usize],
                "{name}: block at {at} reads wrong"
            );
        }
        let errors = rig.engine().layouts().disk_errors();
        assert!(
            errors.get(&disk).is_some_and(|e| e.checksum > 0),
            "{name}: no checksum error counted on disk {disk}: {errors:?}"
        );
        let first = scrub(&rig);
        assert_eq!(first.unrecoverable_total(), 0, "{name}: {first:?}");
        assert!(first.mismatches.is_empty(), "{name}: {:?}", first.mismatches);
        assert_eq!(
            first_difference(&disk_image(&rig, disk), &before),
            None,
            "{name}: a flip is left on the disk after scrub"
        );
        let second = scrub(&rig);
        assert_eq!(
            second.repaired_total(),
            0,
            "{name}: the second scrub repaired {second:?}"
        );
        assert!(second.mismatches.is_empty(), "{name}: {:?}", second.mismatches);
        assert!(read_all(&rig) == data, "{name}: the vdisk reads wrong");
        rig.assert_consistent();
    }
}

#[test]
fn flips_on_two_disks_in_different_places_are_within_tolerance() {
    for (name, kind, copies) in layouts() {
        let (rig, data) = rig_with(kind, copies);
        let (a, b) = two_disks(&rig);
        let (before_a, before_b) = (disk_image(&rig, a), disk_image(&rig, b));
        let mut rng = Rng(0xD15C ^ kind as u64);
        let hit = flip(&rig, &mut rng, a, FLIPS / 2, &HashSet::new());
        flip(&rig, &mut rng, b, FLIPS / 2, &hit);
        // Scrub first this time: it finds and repairs what no read has touched yet.
        let t = scrub(&rig);
        assert_eq!(t.unrecoverable_total(), 0, "{name}: {t:?}");
        assert!(
            t.repaired.contains_key(&a) && t.repaired.contains_key(&b),
            "{name}: {t:?}"
        );
        assert_eq!(
            first_difference(&disk_image(&rig, a), &before_a),
            None,
            "{name}: disk {a}"
        );
        assert_eq!(
            first_difference(&disk_image(&rig, b), &before_b),
            None,
            "{name}: disk {b}"
        );
        assert!(read_all(&rig) == data, "{name}: the vdisk reads wrong");
        assert_eq!(scrub(&rig).repaired_total(), 0, "{name}");
    }
}

#[test]
fn past_the_tolerance_a_read_fails_and_never_returns_wrong_data() {
    for (name, kind, copies) in layouts() {
        let (rig, data) = rig_with(kind, copies);
        // The same block of every member of one set: no copy or parity is left to rebuild it.
        let set = rig.engine().layouts().sets()[0].clone();
        let mo = 8 * BLOCK + 100;
        for slab in set.desc().members {
            let at = rig.engine().pool().slab_offset(slab) + mo;
            rig.disks[slab.disk as usize].faults().flip_bit(at, 5).unwrap();
        }
        let v = rig.engine().vdisk("v").unwrap();
        let mut failed = 0;
        for at in (0..SIZE).step_by(BLOCK as usize) {
            let mut b = vec![0u8; BLOCK as usize];
            match v.read(at, &mut b) {
                Ok(()) => assert!(
                    b == data[at as usize..(at + BLOCK) as usize],
                    "{name}: wrong data at {at}"
                ),
                Err(e) => {
                    assert!(
                        e.to_string().contains("checksum") || e.to_string().contains("reconstruct"),
                        "{name}: {e}"
                    );
                    failed += 1;
                }
            }
        }
        assert!(failed > 0, "{name}: no read failed");
        let t = scrub(&rig);
        assert!(t.unrecoverable_total() > 0 && !t.mismatches.is_empty(), "{name}: {t:?}");
    }
}

/// A parity row of a pool whose data was written before checksums were on: a block's
/// checksum is not known until it is written again. Block B of the row is written again (its
/// checksum, and its row's parity's, recorded); block A's stays unknown.
struct UnknownBeside {
    rig: Rig,
    mo: u64,
    /// A and B: their member slab and logical offset.
    a: (SlabRef, u64),
    b: (SlabRef, u64),
    /// What A holds, and what B was written with.
    a_data: Vec<u8>,
    b_data: Vec<u8>,
}

fn unknown_beside() -> UnknownBeside {
    let mut rig = Rig::new(3, 64 * MIB, MIB);
    rig.engine().pool().set_checksums(false).unwrap();
    rig.reopen();
    let size = 2 * MIB;
    let v = rig
        .engine()
        .create_vdisk(&spec("v", size, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let data = pattern(21, 0, size as usize);
    v.write(0, &data, true).unwrap();
    drop(v);
    // Stopped cleanly (a crash's replay would record checksums of what the rows it settles
    // hold), and opened again with checksums on: every block's is unknown.
    rig.engine().checkpoint().unwrap();
    rig.engine().pool().set_checksums(true).unwrap();
    rig.reopen();
    // Where each data block is: the member and offset whose bytes are that block's, by row.
    let mut rows: BTreeMap<u64, Vec<(SlabRef, u64)>> = BTreeMap::new();
    for p in common::placed_blocks(rig.engine(), |i| rig.disks[i].inner().clone(), &data, BLOCK) {
        rows.entry(p.mo).or_default().push((p.slab, p.at));
    }
    let (mo, pair) = rows
        .into_iter()
        .find(|(_, p)| p.len() == 2)
        .expect("a row of two data blocks");
    let (a, b) = (pair[0], pair[1]);
    let b_data = pattern(22, b.1, BLOCK as usize);
    rig.engine().vdisk("v").unwrap().write(b.1, &b_data, true).unwrap();
    let a_data = data[a.1 as usize..(a.1 + BLOCK) as usize].to_vec();
    UnknownBeside {
        rig,
        mo,
        a,
        b,
        a_data,
        b_data,
    }
}

impl UnknownBeside {
    fn rot(&self, slab: SlabRef) {
        let at = self.rig.engine().pool().slab_offset(slab) + self.mo + 100;
        self.rig.disks[slab.disk as usize].faults().flip_bit(at, 3).unwrap();
    }

    fn read(&self, at: u64) -> tessera_volume::Result<Vec<u8>> {
        let mut got = vec![0u8; BLOCK as usize];
        self.rig.engine().vdisk("v").unwrap().read(at, &mut got).map(|()| got)
    }
}

/// A block rebuilt from parity is checked against the checksum of the member it is rebuilt
/// for, when that member answered (it took every write, so its checksum is current). Rot in
/// a block whose checksum is not known passes every read of it, and fed a rebuild of another
/// block of its row, which then came out wrong. Before, that rebuild was returned to the
/// host, and written over the member by the spot repair with a checksum that vouched for it;
/// now the read fails.
#[test]
fn a_rebuild_fed_by_rot_whose_checksum_is_not_known_is_refused() {
    let u = unknown_beside();
    u.rot(u.a.0);
    u.rot(u.b.0);
    match u.read(u.b.1) {
        Ok(got) => assert_eq!(got, u.b_data, "wrong data returned"),
        Err(e) => assert!(e.to_string().contains("checksum"), "{e}"),
    }
    assert!(u.read(u.b.1).is_err(), "the rebuild from the rotten block was returned");
}

/// Rot in a block whose checksum is not known, in a row whose parity matches its checksum: the
/// parity was written from what that block held (its checksum would be known otherwise), so a
/// scrub rebuilds the block from it. Before, it recomputed the parity from the rotten block,
/// losing the only copy of its right bytes, and its next pass recorded the rot's checksum.
#[test]
fn a_scrub_rebuilds_rot_whose_checksum_is_not_known_from_the_parity_that_vouches_for_it() {
    let u = unknown_beside();
    u.rot(u.a.0);
    assert_ne!(u.read(u.a.1).unwrap(), u.a_data, "the rot reads unverified");
    let t = scrub(&u.rig);
    assert_eq!(t.repaired.get(&u.a.0.disk), Some(&1), "A's member repaired: {t:?}");
    let again = scrub(&u.rig);
    assert!(again.repaired.is_empty() && again.mismatches.is_empty(), "{again:?}");
    assert_eq!(u.read(u.a.1).unwrap(), u.a_data, "rebuilt from the parity");
    assert_eq!(u.read(u.b.1).unwrap(), u.b_data);
}

#[test]
fn a_scrub_stopped_part_way_goes_on_where_it_stopped_after_a_restart() {
    let (mut rig, data) = rig_with(LayoutKind::Mirror, Some(2));
    let (disk, _) = two_disks(&rig);
    let before = disk_image(&rig, disk);
    let mut rng = Rng(0xC0FFEE);
    flip(&rig, &mut rng, disk, 200, &HashSet::new());
    let progress = std::sync::Arc::new(tessera_volume::Progress::default());
    let stopped = std::thread::scope(|s| {
        let p = progress.clone();
        let engine = rig.engine();
        let job = s.spawn(move || {
            // Slow enough to be stopped part way, however late the machine schedules the stop.
            let opts = tessera_volume::ScrubOptions {
                rate_limit: Some(256 << 10),
            };
            engine.scrub(&opts, &p)
        });
        while progress.done_bytes.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        progress.cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        job.join().unwrap()
    });
    assert!(stopped.is_err(), "the scrub was not stopped: {stopped:?}");
    let at = rig
        .engine()
        .scrub_state()
        .unwrap()
        .current
        .expect("a pass under way")
        .next;
    assert!(at != (0, 0), "no progress was saved");
    rig.reopen();
    assert_eq!(
        rig.engine().scrub_state().unwrap().current.unwrap().next,
        at,
        "the position did not survive the restart"
    );
    let p = tessera_volume::Progress::default();
    let pass = rig
        .engine()
        .scrub(&tessera_volume::ScrubOptions::default(), &p)
        .unwrap();
    assert!(
        pass.finished_at.is_some() && pass.tally.unrecoverable_total() == 0,
        "{pass:?}"
    );
    let state = rig.engine().scrub_state().unwrap();
    assert!(state.current.is_none() && state.last == Some(pass));
    assert_eq!(
        first_difference(&disk_image(&rig, disk), &before),
        None,
        "a flip is left after the resumed scrub"
    );
    assert!(read_all(&rig) == data, "the vdisk reads wrong after the scrub");
}

#[test]
fn small_writes_beside_rotten_columns_compute_parity_from_the_right_data() {
    // A small write to a parity row reads the row's other columns to compute its new parity;
    // those reads go to the member disks together. A rotten block among them must be caught
    // and read around, or the new parity would encode the rot and a later repair from it
    // would write wrong data.
    // Wide enough that a write has two or more other columns to read.
    for (name, kind, columns) in [
        ("parity 4+1", LayoutKind::Parity, 5),
        ("dual parity 4+2", LayoutKind::DualParity, 6),
    ] {
        let rig = Rig::new(6, 64 * MIB, MIB);
        let mut s = spec("v", SIZE, kind, Provisioning::Thin);
        s.columns = Some(columns);
        rig.engine().create_vdisk(&s).unwrap();
        let mut data = pattern(11, 0, SIZE as usize);
        rig.engine().vdisk("v").unwrap().write(0, &data, true).unwrap();
        let (disk, _) = two_disks(&rig);
        let mut rng = Rng(0xB10C ^ kind as u64);
        flip(&rig, &mut rng, disk, FLIPS, &HashSet::new());
        let v = rig.engine().vdisk("v").unwrap();
        for k in 0..400u64 {
            let at = rng.below(SIZE / BLOCK) * BLOCK;
            let block = pattern(99 + k, at, BLOCK as usize);
            v.write(at, &block, false).unwrap();
            data[at as usize..(at + BLOCK) as usize].copy_from_slice(&block);
        }
        let errors = rig.engine().layouts().disk_errors();
        assert!(
            errors.get(&disk).is_some_and(|e| e.checksum > 0),
            "{name}: the writes met no rotten block on disk {disk}: {errors:?}"
        );
        let first = scrub(&rig);
        assert_eq!(first.unrecoverable_total(), 0, "{name}: {first:?}");
        assert!(first.mismatches.is_empty(), "{name}: {:?}", first.mismatches);
        assert!(read_all(&rig) == data, "{name}: the vdisk reads wrong after the scrub");
        let second = scrub(&rig);
        assert_eq!(
            second.repaired_total(),
            0,
            "{name}: the second scrub repaired {second:?}"
        );
        rig.assert_consistent();
    }
}

/// A repair that moves a mirror's copy off a retired disk, where no copy of a chunk reads
/// whole, copies it block by block, each block from a copy that matches its checksum. Each
/// rotten block is counted once against its disk, though the chunk was read whole first:
/// past `disk_error_limit` the daemon retires a disk, and a block counted twice would
/// retire a sound disk at half its errors.
#[test]
fn a_repair_copying_block_by_block_counts_each_rotten_block_once() {
    // One column: the set's two members are the two copies of the same bytes.
    let rig = Rig::new(4, 64 * MIB, MIB);
    let mut s = spec("v", SIZE, LayoutKind::Mirror, Provisioning::Thin);
    (s.copies, s.columns) = (Some(2), Some(1));
    rig.engine().create_vdisk(&s).unwrap();
    let data = pattern(11, 0, SIZE as usize);
    rig.engine().vdisk("v").unwrap().write(0, &data, true).unwrap();
    let members = rig.engine().layouts().sets()[0].desc().members;
    assert_eq!(members.len(), 2);
    let (a, b) = (members[0], members[1]);
    // Blocks 1 and 2 of the same chunk (the first 16 KiB), one rotten on each copy: neither
    // reads whole, every block reads right from one of them.
    for (slab, block) in [(a, 1), (b, 2)] {
        let at = rig.engine().pool().slab_offset(slab) + block * BLOCK + 100;
        rig.disks[slab.disk as usize].faults().flip_bit(at, 1).unwrap();
    }
    let retired = rig
        .engine()
        .pool()
        .disks()
        .into_iter()
        .find(|d| d.info.position == a.disk)
        .unwrap();
    rig.engine().retire_disk(&retired.info.path).unwrap();
    rig.engine()
        .repair(&RebuildOptions::default(), &Progress::default())
        .unwrap();
    let errors = rig.engine().layouts().disk_errors();
    for disk in [a.disk, b.disk] {
        assert_eq!(
            errors.get(&disk).map_or((0, 0), |e| (e.read, e.checksum)),
            (0, 1),
            "disk {disk}: {errors:?}"
        );
    }
    assert!(read_all(&rig) == data, "the vdisk reads wrong after the repair");
}

/// A parity set of four columns of 16 KiB, one row of it written and flushed, and the last
/// block of the row's first column beyond repair: rot on its member and on the row's parity
/// at the same place. With what the row holds, the lost block's offset, and its member and
/// the parity member.
struct RottenRow {
    rig: Rig,
    set: std::sync::Arc<tessera_layout::SlabSet>,
    old: Vec<u8>,
    lost: u64,
    holder: SlabRef,
    parity: SlabRef,
}

const ROTTEN_ROW_INTERLEAVE: u64 = 16 << 10;

fn rotten_row() -> RottenRow {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let e = rig.engine();
    let il = ROTTEN_ROW_INTERLEAVE;
    let set = e
        .layouts()
        .create_set(tessera_volume::LayoutSpec {
            kind: LayoutKind::Parity,
            copies: 1,
            columns: 4,
            interleave: il,
        })
        .unwrap();
    let row = 3 * il;
    let old = pattern(31, 0, row as usize);
    e.layouts().write(&set, 0, &old).unwrap();
    e.layouts().flush().unwrap();
    // The last block of the row's first column, and where each member holds what at its offset.
    let lost = il - BLOCK;
    let lost_data = &old[lost as usize..(lost + BLOCK) as usize];
    let members = set.desc().members;
    let image = |slab: SlabRef| {
        let mut b = tessera_disk::AlignedBuf::zeroed(il as usize);
        rig.disks[slab.disk as usize]
            .inner()
            .read_at(&mut b, e.pool().slab_offset(slab))
            .unwrap();
        b.to_vec()
    };
    let mo = il - BLOCK;
    let holder = *members
        .iter()
        .find(|&&s| &image(s)[mo as usize..] == lost_data)
        .expect("the block on a member");
    // The parity member holds none of the row's data.
    let parity = *members
        .iter()
        .find(|&&s| {
            let img = image(s);
            (0..3).all(|c| img[..] != old[(c * il) as usize..((c + 1) * il) as usize])
        })
        .expect("the row's parity member");
    for slab in [holder, parity] {
        rig.disks[slab.disk as usize]
            .faults()
            .flip_bit(e.pool().slab_offset(slab) + mo + 100, 2)
            .unwrap();
    }
    let mut got = vec![0u8; BLOCK as usize];
    assert!(
        e.layouts().read(&set, lost, &mut got).is_err(),
        "a block rotten on its member and the parity was read"
    );
    drop(members);
    RottenRow {
        rig,
        set,
        old,
        lost,
        holder,
        parity,
    }
}

/// A block of a parity row that neither its member nor the parity can give back (rot in both
/// at the same place) is lost: reads of it fail. A write that covers it replaces it, and the
/// parity with it. Before, a write that covered it and reached into the next column (one run
/// across a column's end) read the first column's old bytes over the whole span it touched,
/// the lost block with them, and failed: such writes could never replace it, and a write-back
/// cache destaging one failed at every round.
#[test]
fn a_write_over_a_block_beyond_repair_replaces_it() {
    let RottenRow {
        rig,
        set,
        old,
        lost,
        parity,
        ..
    } = rotten_row();
    let e = rig.engine();
    let il = ROTTEN_ROW_INTERLEAVE;
    let row = 3 * il;
    // Over the lost block and into the next column.
    let new = pattern(32, lost, 2 * BLOCK as usize);
    e.layouts()
        .write(&set, lost, &new)
        .expect("a write over a lost block failed");
    let mut want = old.clone();
    want[lost as usize..(lost + 2 * BLOCK) as usize].copy_from_slice(&new);
    let mut got = vec![0u8; row as usize];
    e.layouts().read(&set, 0, &mut got).unwrap();
    assert!(got == want, "the row reads wrong after the write");
    assert!(
        e.layouts().scrub_set(&set).unwrap().is_empty(),
        "the row's parity is out of step after the write"
    );
    // What does not read there now would not read later: every member is in service. With a
    // member's disk out, what does not read may once it is back.
    assert!(e.layouts().unreadable_is_final(&set, 0, row));
    e.pool()
        .set_disk_state(parity.disk, tessera_volume::DiskState::Failed, None)
        .unwrap();
    assert!(!e.layouts().unreadable_is_final(&set, 0, row));
}

/// A write beside a block beyond repair (same row, the block's parity its own) computes its
/// new parity from that block, which reads from nowhere. With every member in service the
/// block is lost for good: the write goes on, the block recorded lost in the set's
/// descriptor first and written with zeros, the parity in step with them. Reads of it fail,
/// as they did (the record is in the stored descriptor, for a restart); the rest of the row
/// reads as written. Written again, it reads, and is no longer recorded lost. Before,
/// every such write failed for as long as the set lived: writes bypassing a write-back cache
/// beside it failed for good, as did a resync of the row.
#[test]
fn a_write_beside_a_block_beyond_repair_records_it_lost_and_goes_on() {
    let RottenRow {
        rig,
        set,
        old,
        lost,
        holder,
        ..
    } = rotten_row();
    let il = ROTTEN_ROW_INTERLEAVE;
    let row = 3 * il;
    // The next column's block at the same place: the same parity.
    let beside = lost + il;
    let new = pattern(33, beside, BLOCK as usize);
    let e = rig.engine();
    e.layouts()
        .write(&set, beside, &new)
        .expect("a write beside a block beyond repair failed");
    let mut want = old.clone();
    want[beside as usize..(beside + BLOCK) as usize].copy_from_slice(&new);
    let check = |rig: &Rig, want: &[u8], what: &str, lost_at: &[(u64, u64)]| {
        let e = rig.engine();
        let bytes: u64 = lost_at.iter().map(|(a, b)| b - a).sum();
        assert_eq!(e.layouts().lost_bytes(), bytes, "{what}");
        assert_eq!(set.lost_within(0, row), lost_at, "{what}");
        let stored: tessera_layout::SlabSetDesc = serde_json::from_slice(
            &e.pool()
                .meta()
                .get(tessera_pool::CF_SLABSETS, &set.id.to_be_bytes())
                .unwrap()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(stored.lost.iter().collect::<Vec<_>>(), lost_at, "{what}: stored");
        let mut got = vec![0u8; row as usize];
        for &(a, b) in lost_at {
            let err = e
                .layouts()
                .read(&set, a / BLOCK * BLOCK, &mut got[..BLOCK as usize])
                .expect_err("a lost block was read");
            assert!(err.to_string().contains("lost beyond repair"), "{what}: {err}");
            // The batched read refuses it too.
            let mut reqs = [tessera_layout::SetRead {
                set: &set,
                offset: a,
                buf: &mut got[..(b - a) as usize],
            }];
            assert!(e.layouts().read_many(&mut reqs)[0].is_err(), "{what}: read in a batch");
            let mut planned = Vec::new();
            let members = set.try_members().unwrap();
            assert!(
                !e.layouts()
                    .plan_read(&set, &members, a, (b - a) as usize, 0, &mut planned),
                "{what}: planned for a caller's ring"
            );
        }
        // Everything else reads as written, the row's parity in step with what the members
        // hold, and no disk counted against for the rot found at the write.
        let mut at = 0;
        for (a, b) in lost_at.iter().copied().chain([(row, row)]) {
            if at < a {
                e.layouts().read(&set, at, &mut got[at as usize..a as usize]).unwrap();
                assert!(
                    got[at as usize..a as usize] == want[at as usize..a as usize],
                    "{what}: {at}..{a}"
                );
            }
            at = b;
        }
        assert!(e.layouts().scrub_set(&set).unwrap().is_empty(), "{what}: out of step");
        assert!((0..4).all(|d| e.pool().disk_state(d) == tessera_volume::DiskState::Healthy));
    };
    check(&rig, &want, "after the write", &[(lost, lost + BLOCK)]);
    // What its member holds where the block was: zeros, which the parity agrees with.
    let mut z = tessera_disk::AlignedBuf::zeroed(BLOCK as usize);
    rig.disks[holder.disk as usize]
        .inner()
        .read_at(&mut z, e.pool().slab_offset(holder) + il - BLOCK)
        .unwrap();
    assert!(z.iter().all(|&b| b == 0), "no zeros written in the lost block's place");
    // Written again: readable, nothing lost.
    let again = pattern(34, lost, BLOCK as usize);
    e.layouts().write(&set, lost, &again).unwrap();
    want[lost as usize..(lost + BLOCK) as usize].copy_from_slice(&again);
    check(&rig, &want, "written again", &[]);
}

/// The same write while the lost block's disk answers no I/O at all (pulled, its link down):
/// the block may read once the disk answers again, its member may hold it intact, so nothing
/// is given up. The write fails, nothing is recorded lost and no zeros are written there
/// (read errors alone do not take a disk out). Once the disk answers, the block is found
/// rotten there too, and the write goes on around it.
#[test]
fn a_write_beside_a_block_unreadable_while_its_disk_answers_nothing_gives_nothing_up() {
    let RottenRow {
        rig, set, lost, holder, ..
    } = rotten_row();
    let e = rig.engine();
    let beside = lost + ROTTEN_ROW_INTERLEAVE;
    rig.disks[holder.disk as usize].faults().pull();
    let new = pattern(36, beside, BLOCK as usize);
    assert!(
        e.layouts().write(&set, beside, &new).is_err(),
        "written around a block that may read again"
    );
    assert_eq!(e.layouts().lost_bytes(), 0, "given up");
    rig.disks[holder.disk as usize].faults().reinsert();
    let mut z = tessera_disk::AlignedBuf::zeroed(BLOCK as usize);
    rig.disks[holder.disk as usize]
        .inner()
        .read_at(&mut z, e.pool().slab_offset(holder) + ROTTEN_ROW_INTERLEAVE - BLOCK)
        .unwrap();
    assert!(!z.iter().all(|&b| b == 0), "zeros written over the rotten block");
    e.layouts().write(&set, beside, &new).unwrap();
    assert_eq!(set.lost_within(0, u64::MAX), vec![(lost, lost + BLOCK)]);
    let mut got = vec![0u8; BLOCK as usize];
    e.layouts().read(&set, beside, &mut got).unwrap();
    assert!(got == new);
}

/// A member that missed writes (its disk taken out by a write's error, then back), whose own
/// copy of a block is rotten where the parity is rotten too: the resync cannot rebuild that
/// block from the others. It is lost (the member's copy, stale, is no source): recorded lost,
/// zeros written there on the member and the parity in step, and the resync finishes, the
/// member in service again. Before, the resync failed at every try and the member stayed
/// stale, the set degraded, and every write beside the block waited for a disk that was
/// already back.
#[test]
fn a_resync_that_cannot_rebuild_a_block_records_it_lost_and_finishes() {
    let RottenRow {
        rig,
        set,
        old,
        lost,
        holder,
        ..
    } = rotten_row();
    let e = rig.engine();
    let row = 3 * ROTTEN_ROW_INTERLEAVE;
    // The next row written while the lost block's disk answers nothing: it goes around it.
    let disk = &rig.disks[holder.disk as usize];
    disk.faults().pull();
    let next = pattern(37, row, row as usize);
    e.layouts().write(&set, row, &next).unwrap();
    assert_ne!(e.pool().disk_state(holder.disk), tessera_volume::DiskState::Healthy);
    disk.faults().reinsert();
    e.bring_back_disk(
        tessera_disk::BlockDevice::path(&**disk),
        disk.clone() as tessera_disk::DiskRef,
    )
    .unwrap();
    assert_eq!(e.layouts().stale_members(), 1);
    let report = e
        .layouts()
        .resync_stale(&RebuildOptions::default(), &Progress::default())
        .unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(e.layouts().stale_members(), 0, "the member is still stale");
    assert_eq!(set.lost_within(0, 2 * row), vec![(lost, lost + BLOCK)]);
    let mut got = vec![0u8; 2 * row as usize];
    let err = e
        .layouts()
        .read(&set, lost, &mut got[..BLOCK as usize])
        .expect_err("the lost block was read");
    assert!(err.to_string().contains("lost beyond repair"), "{err}");
    let mut want = old.clone();
    want.extend_from_slice(&next);
    e.layouts().read(&set, 0, &mut got[..lost as usize]).unwrap();
    let after = (lost + BLOCK) as usize;
    e.layouts().read(&set, after as u64, &mut got[after..]).unwrap();
    assert!(got[..lost as usize] == want[..lost as usize], "before the lost block");
    assert!(got[after..] == want[after..], "after the lost block");
    assert!(e.layouts().scrub_set(&set).unwrap().is_empty(), "out of step");
    // Written again, it reads.
    let again = pattern(38, lost, BLOCK as usize);
    e.layouts().write(&set, lost, &again).unwrap();
    e.layouts().read(&set, lost, &mut got[..BLOCK as usize]).unwrap();
    assert!(got[..BLOCK as usize] == again[..]);
    assert_eq!(e.layouts().lost_bytes(), 0);
}

/// A write over a block recorded lost clears the record only once the disks' flush has
/// made the write durable: with every flush failing, the write fails and the block stays
/// recorded lost (a power cut then would leave the zeros or the rot there, which must not
/// read as data).
#[test]
fn a_write_over_a_lost_block_whose_flush_fails_leaves_it_lost() {
    let RottenRow { rig, set, lost, .. } = rotten_row();
    let e = rig.engine();
    let beside = lost + ROTTEN_ROW_INTERLEAVE;
    e.layouts()
        .write(&set, beside, &pattern(39, beside, BLOCK as usize))
        .unwrap();
    assert_eq!(set.lost_within(0, u64::MAX), vec![(lost, lost + BLOCK)]);
    for d in &rig.disks {
        d.faults().fail_flushes(true);
    }
    assert!(
        e.layouts()
            .write(&set, lost, &pattern(40, lost, BLOCK as usize))
            .is_err(),
        "a write whose flush failed was answered as done"
    );
    assert_eq!(
        set.lost_within(0, u64::MAX),
        vec![(lost, lost + BLOCK)],
        "no longer recorded lost though nothing was made durable"
    );
}
