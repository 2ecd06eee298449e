//! Scrub: reads every row of a slab set from every member and checks each 4 KiB block against
//! its checksum, mirror copies against each other and parity against the data. With
//! `repair`, a block that fails is rewritten from a copy that passes, or from what the other
//! members reconstruct (checked against the block's checksum before it is written), and a
//! block whose checksum is unknown (written before the pool kept checksums) gets one once its
//! row's redundancy agrees on it. Without checksums, only disagreement can be seen, and it is
//! reported, not repaired: nothing says which side is right.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_disk::AlignedBuf;
use tessera_pool::SlabRef;

use crate::codec;
use crate::error::Result;
use crate::geometry::{data_members, parity_members};
use crate::layouts::{Layouts, MemberFault};
use crate::slabset::SlabSet;
use crate::sums::{block_sum, sums_of, BLOCK};
use tracing::{info, warn};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    pub set: u32,
    pub row: u64,
    pub what: String,
}

/// What a scrub found and did. Per-disk figures are by pool position.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubTally {
    /// Member blocks read and checked.
    pub blocks: u64,
    /// Blocks rewritten with good data, per disk.
    pub repaired: BTreeMap<u32, u64>,
    /// Blocks that failed with no good data to repair them from, per disk.
    pub unrecoverable: BTreeMap<u32, u64>,
    /// Rows skipped: a member unavailable (a repair's work, not a scrub's).
    pub skipped_rows: u64,
    /// Rows found wrong; with repair, those left wrong (unrecoverable, or no checksum to
    /// say which copy is right). At most [`MAX_MISMATCHES`] are kept.
    pub mismatches: Vec<Mismatch>,
}

/// Mismatches a tally keeps (the counts above go on).
pub const MAX_MISMATCHES: usize = 1000;

impl ScrubTally {
    pub fn add(&mut self, o: ScrubTally) {
        self.blocks += o.blocks;
        self.skipped_rows += o.skipped_rows;
        for (d, n) in o.repaired {
            *self.repaired.entry(d).or_default() += n;
        }
        for (d, n) in o.unrecoverable {
            *self.unrecoverable.entry(d).or_default() += n;
        }
        for m in o.mismatches {
            self.mismatch(m);
        }
    }

    fn mismatch(&mut self, m: Mismatch) {
        if self.mismatches.len() < MAX_MISMATCHES {
            self.mismatches.push(m);
        }
    }

    pub fn repaired_total(&self) -> u64 {
        self.repaired.values().sum()
    }

    pub fn unrecoverable_total(&self) -> u64 {
        self.unrecoverable.values().sum()
    }
}

/// One block of one member as read: its bytes (None: unreadable) and what its checksum says.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Good,
    Bad,
    Unknown,
}

/// A row's members as read, with a verdict per block.
struct RowRead {
    bufs: Vec<Option<AlignedBuf>>,
    verdicts: Vec<Vec<Verdict>>,
}

impl RowRead {
    fn block(&self, m: usize, i: usize) -> Option<&[u8]> {
        let b = self.bufs[m].as_ref()?;
        (self.verdicts[m][i] != Verdict::Bad).then(|| &b[i * BLOCK as usize..(i + 1) * BLOCK as usize])
    }

    fn raw(&self, m: usize, i: usize) -> Option<&[u8]> {
        Some(&self.bufs[m].as_ref()?[i * BLOCK as usize..(i + 1) * BLOCK as usize])
    }
}

impl Layouts {
    /// Checks every row of a slab set and reports what is wrong, changing nothing. Rows with
    /// an unavailable member are skipped (there is nothing to compare with); each row is
    /// checked under its lock, so concurrent writes do not show up as false mismatches.
    pub fn scrub_set(&self, set: &SlabSet) -> Result<Vec<Mismatch>> {
        let rows = self.pool.slab_size() / set.spec.interleave;
        Ok(self.scrub_rows(set, 0..rows, false)?.mismatches)
    }

    /// Rows in one member slab of a set: a scrub's progress is counted in them.
    pub fn rows_of(&self, set: &SlabSet) -> u64 {
        self.pool.slab_size() / set.spec.interleave
    }

    /// Scrubs rows `rows` of a set, repairing what it can if `repair`.
    pub fn scrub_rows(&self, set: &SlabSet, rows: std::ops::Range<u64>, repair: bool) -> Result<ScrubTally> {
        let mut tally = ScrubTally::default();
        let held = set.held.lock().clone();
        let mut clean = Vec::new();
        {
            let members = set.members.read();
            for row in rows {
                let seen = if self.unavailable(&members) > 0 {
                    tally.skipped_rows += 1;
                    None
                } else {
                    let _g = self.row_lock(set.id, row).write();
                    self.scrub_row(set, &members, row, repair, &mut tally)
                };
                if !held.is_empty() {
                    clean.extend(self.follow_held(set, &members, &held, row, seen.as_deref()));
                }
            }
        }
        // Out of the members' lock, which the record takes again.
        for (slab, noted) in clean {
            self.no_longer_held(set, slab, noted);
        }
        Ok(tally)
    }

    /// Follows, row by row from the first, the members of `set` taken as their disk held
    /// them (`held`) through a pass of a scrub: `seen` says which members had a block that
    /// failed in `row` (None: the row was skipped). Returns those a pass found clean in
    /// every row, with the pool's count of losses when the pass began: the blocks their
    /// disk's cache lost were written again since. A pass over
    /// which the member's disk was lost (and perhaps back, taken as held again, its cache
    /// having lost blocks in rows the pass found clean before) counts for nothing.
    fn follow_held(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        held: &[SlabRef],
        row: u64,
        seen: Option<&[bool]>,
    ) -> Vec<(SlabRef, u64)> {
        let rows = self.rows_of(set);
        let mut passes = self.held_passes.lock();
        let mut clean = Vec::new();
        for &slab in held {
            let key = (set.id, slab);
            let Some(m) = members.iter().position(|s| *s == slab) else {
                passes.remove(&key);
                continue;
            };
            let ok = seen.is_some_and(|bad| !bad[m]);
            let from = match row {
                0 => Some((0, self.pool.losses())),
                _ => passes.get(&key).copied(),
            };
            match from {
                Some((next, noted)) if ok && next == row && !self.pool.lost_since(slab.disk, noted) => {
                    passes.insert(key, (row + 1, noted));
                    if row + 1 == rows {
                        passes.remove(&key);
                        clean.push((slab, noted));
                    }
                }
                _ => {
                    passes.remove(&key);
                }
            }
        }
        clean
    }

    /// A member taken as its disk held it that a scrub found clean in every row is a member
    /// as any other from now on: a block that fails in it later is rot of its disk, and
    /// counts against it.
    fn no_longer_held(&self, set: &SlabSet, slab: SlabRef, noted: u64) {
        // Not between a disk's return taking it as held again and `held_as_is` saying so; and
        // not if its disk was lost since the pass began.
        let _returning = self.returning.lock();
        if self.pool.lost_since(slab.disk, noted) {
            return;
        }
        match self.registry.drop_held(&self.pool, set.id, slab) {
            Ok(()) => {
                self.held_as_is.write().remove(&slab);
                info!(pool = %self.pool.name(), set = set.id, disk = slab.disk, slab = slab.slab, "a member taken as its disk held it after an I/O error was found clean by a scrub: its checksum errors count against its disk again");
            }
            Err(e) => {
                warn!(pool = %self.pool.name(), set = set.id, error = %e, "cannot record that a member is no longer taken as its disk held it; the next clean scrub tries again");
            }
        }
    }

    fn read_row(&self, members: &[SlabRef], mo: u64, len: usize) -> RowRead {
        let nb = len / BLOCK as usize;
        let checked = self.sums().enabled();
        let mut bufs = Vec::with_capacity(members.len());
        let mut verdicts = Vec::with_capacity(members.len());
        for &slab in members {
            let mut b = AlignedBuf::zeroed(len);
            match self.member_read_raw(slab, mo, &mut b) {
                Ok(()) => {
                    let v = (0..nb)
                        .map(
                            |i| match checked.then(|| self.sums().get(slab, mo + i as u64 * BLOCK)) {
                                Some(Ok(Some(want))) => {
                                    let block = &b[i * BLOCK as usize..(i + 1) * BLOCK as usize];
                                    if block_sum(block) == want {
                                        Verdict::Good
                                    } else {
                                        Verdict::Bad
                                    }
                                }
                                _ => Verdict::Unknown,
                            },
                        )
                        .collect();
                    bufs.push(Some(b));
                    verdicts.push(v);
                }
                Err(MemberFault::Unavailable | MemberFault::Io(_) | MemberFault::Refused(_)) => {
                    bufs.push(None);
                    verdicts.push(vec![Verdict::Bad; nb]);
                }
            }
        }
        RowRead { bufs, verdicts }
    }

    /// Checks one row (repairing it with `repair`), and says which members had a block that
    /// failed there; None if the row was skipped.
    fn scrub_row(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        row: u64,
        repair: bool,
        tally: &mut ScrubTally,
    ) -> Option<Vec<bool>> {
        let spec = &set.spec;
        let mo = row * spec.interleave;
        let len = spec.interleave as usize;
        let r = self.read_row(members, mo, len);
        let nb = len / BLOCK as usize;
        if !repair && r.bufs.iter().any(Option::is_none) {
            // A member that fails to read (a disk pulled, not yet failed by a write) is a
            // disk's fault, not redundancy that disagrees: a check skips the row, as it skips
            // rows with a member already unavailable. A repairing scrub rewrites the member,
            // which fails the disk if it is gone.
            tally.skipped_rows += 1;
            return None;
        }
        tally.blocks += (nb * members.len()) as u64;
        // Blocks that no member has a checksum for, in a pool that keeps them, were never
        // written since their slabs joined this set: they hold what the set that gave the
        // slabs back left there, no data of this one, and their copies or parity need not
        // agree until a write makes them (a write of part of a parity row computes its parity
        // from every column).
        let unwritten: Vec<bool> = (0..nb)
            .map(|i| {
                self.sums().enabled()
                    && r.bufs.iter().all(Option::is_some)
                    && r.verdicts.iter().all(|v| v[i] == Verdict::Unknown)
            })
            .collect();
        let mut what: Option<String> = None;
        let mut note = |w: String| {
            what.get_or_insert(w);
        };
        // Blocks to write, per member: (block index, bytes).
        let mut fixes: Vec<(usize, usize, Vec<u8>)> = Vec::new();
        let mut lost: Vec<usize> = Vec::new();
        for (m, v) in r.verdicts.iter().enumerate() {
            let bad = v.iter().filter(|&&x| x == Verdict::Bad).count();
            if bad > 0 && r.bufs[m].is_some() {
                // Rot a scrub finds counts against the disk as rot a read finds does (a read
                // error was counted when the read failed).
                self.stats
                    .checksum_errors
                    .fetch_add(bad as u64, std::sync::atomic::Ordering::Relaxed);
                self.count_against_disk(members[m], bad as u64);
            }
            if bad > 0 {
                note(format!(
                    "member {m} (disk {}): {bad} block(s) unreadable or not matching their checksums",
                    members[m].disk
                ));
            }
        }
        if spec.parity_columns() == 0 {
            for d in 0..spec.data_columns() {
                let copies = data_members(spec, row, d);
                for i in (0..nb).filter(|&i| !unwritten[i]) {
                    // The truth: a copy that matches its checksum; with no checksum known,
                    // the copies' agreement.
                    let good = copies
                        .iter()
                        .find(|&&c| r.verdicts[c][i] == Verdict::Good)
                        .and_then(|&c| r.raw(c, i));
                    let readable: Vec<&[u8]> = copies.iter().filter_map(|&c| r.raw(c, i)).collect();
                    let known = copies.iter().any(|&c| r.verdicts[c][i] != Verdict::Unknown);
                    let truth = good.or_else(|| {
                        (!known && !readable.is_empty() && readable.iter().all(|b| *b == readable[0]))
                            .then(|| readable[0])
                    });
                    match truth {
                        Some(t) => {
                            for &c in &copies {
                                if r.block(c, i) != Some(t) {
                                    if r.bufs[c].is_some() && r.verdicts[c][i] != Verdict::Bad {
                                        note(format!("copies of column {d} differ"));
                                    }
                                    fixes.push((c, i, t.to_vec()));
                                }
                            }
                        }
                        None if !known => note(format!(
                            "copies of column {d} differ, and no checksum says which is right"
                        )),
                        None => lost.extend(copies.iter().copied()),
                    }
                }
            }
        } else {
            self.scrub_parity_row(spec, members, row, &r, &unwritten, &mut fixes, &mut lost, &mut note);
        }
        // (Not for never-written blocks: a checksum would make their leftovers data.)
        if repair && self.sums().enabled() && what.is_none() && !unwritten.contains(&true) {
            // Unknown checksums of a row found consistent are recorded now.
            for (m, v) in r.verdicts.iter().enumerate() {
                if v.contains(&Verdict::Unknown) {
                    if let Some(b) = &r.bufs[m] {
                        let _ = self.sums().record(members[m], mo, &sums_of(b));
                    }
                }
            }
        }
        for &m in &lost {
            *tally.unrecoverable.entry(members[m].disk).or_default() += 1;
        }
        let failed: Vec<bool> = r.verdicts.iter().map(|v| v.contains(&Verdict::Bad)).collect();
        let Some(w) = what else { return Some(failed) };
        let mut left = !lost.is_empty();
        if repair && self.sums().enabled() {
            for (m, i, bytes) in &fixes {
                let at = mo + *i as u64 * BLOCK;
                if self.member_write(members[*m], at, bytes).is_ok() {
                    *tally.repaired.entry(members[*m].disk).or_default() += 1;
                    self.count_for(members[*m].disk, |c| c.repaired_bytes += BLOCK);
                } else {
                    left = true;
                }
            }
            if fixes.is_empty() && lost.is_empty() {
                // Found wrong, with nothing to repair it from (no checksum to choose by).
                left = true;
            }
        } else {
            left = true;
        }
        if left {
            tally.mismatch(Mismatch {
                set: set.id,
                row,
                what: w,
            });
        }
        Some(failed)
    }

    /// A parity row, block by block: data blocks that fail are reconstructed from the blocks
    /// that pass, checked against their checksums, and parity is compared with the parity of
    /// the (repaired) data.
    #[allow(clippy::too_many_arguments)]
    fn scrub_parity_row(
        &self,
        spec: &crate::spec::LayoutSpec,
        members: &[SlabRef],
        row: u64,
        r: &RowRead,
        unwritten: &[bool],
        fixes: &mut Vec<(usize, usize, Vec<u8>)>,
        lost: &mut Vec<usize>,
        note: &mut dyn FnMut(String),
    ) {
        let dms: Vec<usize> = (0..spec.data_columns())
            .map(|d| data_members(spec, row, d)[0])
            .collect();
        let pms = parity_members(spec, row);
        let mo = row * spec.interleave;
        // The usual case first: every block read, none failing, parity right for the row.
        let clean = dms
            .iter()
            .chain(&pms)
            .all(|&m| r.bufs[m].is_some() && !r.verdicts[m].contains(&Verdict::Bad));
        if clean {
            let refs: Vec<&[u8]> = dms.iter().map(|&m| &r.bufs[m].as_ref().expect("read")[..]).collect();
            if let Ok(want) = codec::encode(spec.parity_columns(), &refs) {
                if pms
                    .iter()
                    .enumerate()
                    .all(|(k, &pm)| r.bufs[pm].as_deref() == Some(&want[k][..]))
                {
                    return;
                }
            }
        }
        for i in (0..(spec.interleave / BLOCK) as usize).filter(|&i| !unwritten[i]) {
            let mut data: Vec<Option<Vec<u8>>> = dms.iter().map(|&m| r.block(m, i).map(<[u8]>::to_vec)).collect();
            let parity: Vec<Option<Vec<u8>>> = pms.iter().map(|&m| r.block(m, i).map(<[u8]>::to_vec)).collect();
            let missing: Vec<usize> = (0..dms.len()).filter(|&d| data[d].is_none()).collect();
            if !missing.is_empty() {
                if codec::reconstruct(&mut data, &parity).is_err() {
                    lost.extend(missing.iter().map(|&d| dms[d]));
                    continue;
                }
                let mut all_right = true;
                for &d in &missing {
                    let rebuilt = data[d].as_ref().expect("reconstructed");
                    let m = dms[d];
                    // Reconstructed from blocks that passed, or whose checksum is unknown:
                    // written back only if it matches the checksum the block should have.
                    let want = self.sums().get(members[m], mo + i as u64 * BLOCK).ok().flatten();
                    if want.is_none_or(|w| block_sum(rebuilt) == w) {
                        fixes.push((m, i, rebuilt.clone()));
                    } else {
                        all_right = false;
                        lost.push(m);
                    }
                }
                if !all_right {
                    continue;
                }
            }
            let refs: Vec<&[u8]> = data.iter().map(|d| d.as_deref().expect("complete")).collect();
            let Ok(want) = codec::encode(spec.parity_columns(), &refs) else {
                continue;
            };
            let wrong = pms
                .iter()
                .enumerate()
                .any(|(k, &pm)| r.block(pm, i) != Some(&want[k][..]));
            if wrong && self.rotten_unknown_data(&dms, &pms, r, i, &data, &parity, fixes, note) {
                continue;
            }
            for (k, &pm) in pms.iter().enumerate() {
                if r.block(pm, i) != Some(&want[k][..]) {
                    if r.bufs[pm].is_some() && r.verdicts[pm][i] != Verdict::Bad {
                        note(format!("parity {k} does not match the data"));
                    }
                    fixes.push((pm, i, want[k].clone()));
                }
            }
        }
    }

    /// Block `i` of a parity row whose parity does not match its data: if every parity block
    /// matches its checksum and the data blocks whose checksum is not known are few enough to
    /// rebuild, those are the ones that rotted. A parity block's checksum is recorded when it
    /// is written, from data that a data block whose checksum is still unknown held then
    /// (a write of that block, a crash's replay over its row, or a scrub that found the row
    /// right would have recorded its checksum too), so the parity vouches for what that block
    /// held. They are rebuilt from the parity and the other data, and written back (their
    /// checksums recorded from what is rebuilt). Recomputed from them instead, the parity
    /// would lose the only copy of their right bytes, and the next scrub vouch for the rot.
    /// False, and nothing done, otherwise.
    #[allow(clippy::too_many_arguments)]
    fn rotten_unknown_data(
        &self,
        dms: &[usize],
        pms: &[usize],
        r: &RowRead,
        i: usize,
        data: &[Option<Vec<u8>>],
        parity: &[Option<Vec<u8>>],
        fixes: &mut Vec<(usize, usize, Vec<u8>)>,
        note: &mut dyn FnMut(String),
    ) -> bool {
        let vouched = pms
            .iter()
            .all(|&pm| r.bufs[pm].is_some() && r.verdicts[pm][i] == Verdict::Good);
        let unknown: Vec<usize> = (0..dms.len())
            .filter(|&d| r.verdicts[dms[d]][i] == Verdict::Unknown)
            .collect();
        if !vouched || unknown.is_empty() || unknown.len() > pms.len() {
            return false;
        }
        let mut rebuilt = data.to_vec();
        for &d in &unknown {
            rebuilt[d] = None;
        }
        if codec::reconstruct(&mut rebuilt, parity).is_err() {
            return false;
        }
        for &d in &unknown {
            let right = rebuilt[d].take().expect("reconstructed");
            if data[d].as_deref() != Some(&right[..]) {
                note(format!(
                    "a data block whose checksum is not known does not match the parity that vouches for it (member {})",
                    dms[d]
                ));
                fixes.push((dms[d], i, right));
            }
        }
        true
    }
}
