//! Second copies of hot slots. On a layout with no redundancy, a slot that more than
//! [`HOT_REFS`] grains point at (the pool's `hot_copy_refs` setting), a block that dedup,
//! clones or snapshots share between many vdisks, is one bad sector away from failing all of
//! them at once. Such a slot is kept in a
//! second copy, in another slab set of its class (on other disks where the pool has them),
//! as Windows deduplication keeps a chunk referenced more than 100 times.
//!
//! - The copy map (primary slot → copy slot) is kept in the pool's metadata. Each entry holds
//!   one reference on both slots, counted like any other: the copy is never handed out while
//!   it is mapped, and the primary is never freed nor, having two references or more,
//!   overwritten in place (a pack slot never is). So the two hold the same bytes for as long
//!   as the entry exists, and the entry, the two counts and the copy's data become durable in
//!   one commit, which flushes the data first.
//! - A read that fails on a primary (a block failing its checksum, a lost disk) reads the
//!   same bytes from the copy and rewrites the primary from it.
//! - Scrub checks both slots of every pair at the start of a pass and rewrites the one that
//!   fails to read from the other.
//! - [`Engine::keep_hot_copies`] makes and drops copies: after a dedup run or GC and at the
//!   start of a scrub pass. A copy is dropped once its primary has no more than half the
//!   threshold's references (so a count going up and down by one makes no copy each time),
//!   or none: deleting the last vdisk that shares a hot slot gives both back then.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tessera_pool::{MetaStore, CF_POOL};
use tracing::{info, warn};

use crate::commit::Op;
use crate::engine::Engine;
use crate::error::Result;
use crate::packed::read_slot;
use crate::shared::Shared;
use crate::space::{is_packed, loc_parts, packed_loc, piece_of, slot_of, Loc};

/// A slot on a layout with no redundancy that more grains than this point at gets a copy,
/// unless the pool's dedup settings say otherwise (`hot_copy_refs`).
pub const HOT_REFS: u32 = tessera_dedup::DEFAULT_HOT_COPY_REFS;
/// Copies made or dropped per metadata commit.
const PER_COMMIT: usize = 64;
const KEY_PREFIX: &[u8] = b"hotcopy/";
/// The writer the cache accounts copy writes to: no vdisk has this id.
const UPKEEP_WRITER: u64 = u64::MAX;

fn key(primary: Loc) -> Vec<u8> {
    let mut k = KEY_PREFIX.to_vec();
    k.extend_from_slice(&primary.to_be_bytes());
    k
}

fn parse(k: &[u8], v: &[u8]) -> Option<(Loc, Loc)> {
    let p = u64::from_be_bytes(k.strip_prefix(KEY_PREFIX)?.try_into().ok()?);
    let c = u64::from_le_bytes(v.try_into().ok()?);
    Some((p, c))
}

/// The copy map of a pool, as a store snapshot or the store holds it.
pub(crate) fn stored_pairs(
    each: impl FnOnce(&[u8], &mut dyn FnMut(&[u8], &[u8]) -> tessera_pool::Result<()>) -> tessera_pool::Result<()>,
) -> Result<Vec<(Loc, Loc)>> {
    let mut out = Vec::new();
    each(KEY_PREFIX, &mut |k, v| {
        if let Some(pair) = parse(k, v) {
            out.push(pair);
        }
        Ok(())
    })?;
    Ok(out)
}

/// The copy map in memory.
#[derive(Default)]
pub(crate) struct HotCopies {
    /// Primary slot → copy slot. Readers that fall back to a copy hold it shared for the
    /// whole read, so a copy dropped (and its slot handed out again) is never read as one.
    map: RwLock<HashMap<Loc, Loc>>,
    upkeep: Mutex<()>,
}

impl HotCopies {
    pub fn load(meta: &Arc<MetaStore>) -> Result<HotCopies> {
        let pairs = stored_pairs(|prefix, f| meta.for_each_prefix(CF_POOL, prefix, f))?;
        Ok(HotCopies {
            map: RwLock::new(pairs.into_iter().collect()),
            upkeep: Mutex::new(()),
        })
    }

    pub fn pairs(&self) -> Vec<(Loc, Loc)> {
        let mut v: Vec<(Loc, Loc)> = self.map.read().iter().map(|(&p, &c)| (p, c)).collect();
        v.sort_unstable();
        v
    }

    /// Runs `read` on the place in the copy that holds what `l` names, if `l`'s slot has a
    /// copy; the copy stays mapped until `read` returns.
    pub fn read_around<R>(&self, l: Loc, read: impl FnOnce(Loc) -> R) -> Option<R> {
        // Recursive: a read of a copy that fails falls back in its turn (finding no copy of a
        // copy), inside `read`; a plain shared lock taken again there would wait behind a
        // writer (hot copies made or dropped) that waits for the first, for ever.
        let map = self.map.read_recursive();
        let copy = *map.get(&slot_of(l))?;
        let alt = if is_packed(l) {
            let (set, slot) = loc_parts(copy);
            let (first, units) = piece_of(l)?;
            packed_loc(set, slot, first, units)?
        } else {
            copy
        };
        Some(read(alt))
    }
}

/// Reads `l` from the copy of its slot after a read of it failed with `failed`, and rewrites
/// the primary from the copy. `read` reads a location into the caller's buffer. Returns
/// `failed` when there is no copy or the copy cannot be read either.
pub(crate) fn fall_back(
    s: &Shared,
    l: Loc,
    failed: crate::error::VolumeError,
    read: impl FnOnce(Loc) -> Result<()>,
) -> Result<()> {
    let outcome = s.hot.read_around(l, |alt| {
        let r = read(alt);
        if r.is_ok() {
            let primary = slot_of(l);
            warn!(slot = format!("{primary:#x}"), error = %failed, "read a hot slot from its second copy");
            rewrite_bad(s, primary, slot_of(alt));
        }
        r
    });
    match outcome {
        Some(Ok(())) => Ok(()),
        _ => Err(failed),
    }
}

/// How a pair stood when checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PairState {
    Good,
    /// One of the two failed to read and was rewritten from the other.
    Repaired,
    /// Neither reads.
    Lost,
}

fn write_slot(s: &Shared, l: Loc, data: &[u8]) -> Result<()> {
    let (set, base) = s.space.locate(l)?;
    s.cache.write(UPKEEP_WRITER, &set, base, data)?;
    Ok(())
}

/// Reads both slots of a pair whole and rewrites the one that fails from the other. Only
/// for a pair that is mapped (the caller holds the map, or the upkeep lock).
fn rewrite_bad(s: &Shared, primary: Loc, copy: Loc) -> PairState {
    match (read_slot(s, primary), read_slot(s, copy)) {
        (Ok(_), Ok(_)) => PairState::Good,
        (Err(e), Ok(good)) => match write_slot(s, primary, &good) {
            Ok(()) => {
                info!(slot = format!("{primary:#x}"), error = %e, "rewrote a hot slot from its copy");
                PairState::Repaired
            }
            Err(w) => {
                warn!(slot = format!("{primary:#x}"), error = %w, "could not rewrite a hot slot from its copy");
                PairState::Lost
            }
        },
        (Ok(good), Err(e)) => match write_slot(s, copy, &good) {
            Ok(()) => {
                info!(slot = format!("{copy:#x}"), error = %e, "rewrote the copy of a hot slot");
                PairState::Repaired
            }
            Err(_) => PairState::Lost,
        },
        (Err(_), Err(_)) => PairState::Lost,
    }
}

/// A line for each pair whose two slots both read and do not hold the same bytes.
pub(crate) fn mismatches(s: &Shared) -> Vec<String> {
    // No pair is dropped (and its slots handed out again) while they are read.
    let _one = s.hot.upkeep.lock();
    s.hot
        .pairs()
        .into_iter()
        .filter_map(|(p, c)| match (read_slot(s, p), read_slot(s, c)) {
            (Ok(a), Ok(b)) if a[..] != b[..] => {
                Some(format!("hot slot {p:#x} and its copy {c:#x} hold different bytes"))
            }
            _ => None,
        })
        .collect()
}

/// What one upkeep of the copies did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HotCopyUpkeep {
    pub made: u64,
    pub dropped: u64,
    /// Copies kept after it.
    pub kept: u64,
    /// Hot slots left without a copy: no free slot, or a read, write or commit failed.
    pub failed: u64,
}

/// What a scrub found checking the pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HotCopyCheck {
    pub pairs: u64,
    pub repaired: u64,
    /// Pairs where neither slot reads.
    pub lost: u64,
}

impl Engine {
    /// The hot slots and their copies: (primary, copy).
    pub fn hot_copies(&self) -> Vec<(Loc, Loc)> {
        self.shared().hot.pairs()
    }

    /// Makes a copy of every slot on a layout with no redundancy that more grains than the
    /// pool's `hot_copy_refs` point at, and drops the copies no longer needed.
    pub fn keep_hot_copies(&self) -> Result<HotCopyUpkeep> {
        let s = self.shared();
        let _one = s.hot.upkeep.lock();
        let mut report = HotCopyUpkeep::default();
        let threshold = self.dedup_settings().hot_copy_refs;
        // References other than the copy's own.
        let refs_of = |p: Loc| s.space.refcount(p).saturating_sub(1);
        let stale: Vec<(Loc, Loc)> = s
            .hot
            .pairs()
            .into_iter()
            .filter(|&(p, _)| threshold == 0 || refs_of(p) <= threshold / 2)
            .collect();
        for chunk in stale.chunks(PER_COMMIT) {
            self.drop_copies(chunk)?;
            report.dropped += chunk.len() as u64;
        }
        let copied: HashSet<Loc> = s.hot.map.read().keys().copied().collect();
        let mut hot = Vec::new();
        for ss in s.space.all_sets() {
            if threshold == 0 || ss.class.layout.tolerance() > 0 {
                continue;
            }
            for (slot, r) in ss.refs.iter().enumerate() {
                let l = crate::space::loc(ss.set.id, slot as u32);
                if r.load(Ordering::Acquire) > threshold && !copied.contains(&l) {
                    hot.push(l);
                }
            }
        }
        for chunk in hot.chunks(PER_COMMIT) {
            let made = self.make_copies(chunk);
            report.made += made;
            report.failed += chunk.len() as u64 - made;
        }
        report.kept = s.hot.map.read().len() as u64;
        if report.made + report.dropped + report.failed > 0 {
            info!(pool = %self.pool().name(), made = report.made, dropped = report.dropped, failed = report.failed, kept = report.kept, "hot slot copies kept up");
        }
        Ok(report)
    }

    /// Copies each slot of `hot` to a new slot and maps it, in one commit. Returns how many
    /// it copied; a slot that cannot be copied is left for the next upkeep.
    fn make_copies(&self, hot: &[Loc]) -> u64 {
        let s = self.shared();
        let mut made: Vec<(Loc, Loc)> = Vec::new();
        let undo = |made: &[(Loc, Loc)]| {
            for &(p, c) in made {
                s.space.unallocate(c, None);
                s.space.decref(p);
            }
        };
        for &p in hot {
            // The copy's reference on the primary, taken first: a slot with two references or
            // more is not overwritten while it is held, and cannot be freed.
            if !s.space.incref_if_shared(p) {
                continue;
            }
            let copied = (|| {
                let (set, _) = loc_parts(p);
                let class = s
                    .space
                    .class_of(p)
                    .ok_or_else(|| crate::error::VolumeError::Invalid(format!("slot {p:#x} names no slab set")))?;
                let c = s.space.allocate_apart(class, set)?;
                // A piece of a pack slot must be able to name the same units in the copy.
                let ok = packed_loc(loc_parts(c).0, loc_parts(c).1, 0, 1).is_some();
                let written = if ok {
                    read_slot(s, p).and_then(|data| write_slot(s, c, &data))
                } else {
                    Err(crate::error::VolumeError::Invalid(format!(
                        "slot {c:#x} is beyond what a copy of a pack slot may be"
                    )))
                };
                match written {
                    Ok(()) => Ok(c),
                    Err(e) => {
                        s.space.unallocate(c, None);
                        Err(e)
                    }
                }
            })();
            match copied {
                Ok(c) => made.push((p, c)),
                Err(e) => {
                    s.space.decref(p);
                    warn!(slot = format!("{p:#x}"), error = %e, "could not copy a hot slot");
                }
            }
        }
        let mut ops = Vec::with_capacity(made.len() * 3);
        for &(p, c) in &made {
            ops.push(Op::Put(CF_POOL, key(p), c.to_le_bytes().to_vec()));
            ops.push(Op::count(p, 1));
            ops.push(Op::count(c, 1));
        }
        if let Err(e) = s.committer.commit(ops) {
            warn!(error = %e, "could not record copies of hot slots");
            undo(&made);
            return 0;
        }
        s.hot.map.write().extend(made.iter().copied());
        made.len() as u64
    }

    /// Unmaps the copies of `pairs` and gives back the references each held.
    fn drop_copies(&self, pairs: &[(Loc, Loc)]) -> Result<()> {
        let s = self.shared();
        // Unmapped before the commit, under the map's lock: no reader is in a copy after this.
        let mut map = s.hot.map.write();
        for (p, _) in pairs {
            map.remove(p);
        }
        let mut ops = Vec::with_capacity(pairs.len() * 3);
        for &(p, c) in pairs {
            ops.push(Op::Delete(CF_POOL, key(p)));
            ops.push(Op::count(p, -1));
            ops.push(Op::count(c, -1));
        }
        if let Err(e) = s.committer.commit(ops) {
            map.extend(pairs.iter().copied());
            return Err(e);
        }
        drop(map);
        for &(p, c) in pairs {
            s.space.decref(p);
            s.space.decref(c);
        }
        Ok(())
    }

    /// Reads both slots of every pair and rewrites the one that fails from the other.
    pub(crate) fn check_hot_copies(&self) -> HotCopyCheck {
        let s = self.shared();
        let _one = s.hot.upkeep.lock();
        let mut check = HotCopyCheck::default();
        for (p, c) in s.hot.pairs() {
            check.pairs += 1;
            match rewrite_bad(s, p, c) {
                PairState::Good => {}
                PairState::Repaired => check.repaired += 1,
                PairState::Lost => check.lost += 1,
            }
        }
        if check.repaired + check.lost > 0 {
            warn!(pool = %self.pool().name(), pairs = check.pairs, repaired = check.repaired, lost = check.lost, "scrub checked the copies of hot slots");
        }
        check
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::loc;

    #[test]
    fn a_read_around_a_copy_inside_another_never_waits_behind_a_writer() {
        let (p1, c1, p2, c2) = (loc(1, 1), loc(2, 1), loc(1, 2), loc(2, 2));
        let hot = Arc::new(HotCopies {
            map: RwLock::new([(p1, c1), (p2, c2)].into_iter().collect()),
            upkeep: Mutex::new(()),
        });
        let (done, finished) = std::sync::mpsc::channel();
        let reader = hot.clone();
        // Off the test's thread, so that a deadlock fails the test rather than hangs it.
        std::thread::spawn(move || {
            let inner = reader.clone();
            let r = reader.read_around(p1, |alt| {
                let writer = inner.clone();
                let w = std::thread::spawn(move || {
                    writer.map.write().insert(loc(1, 3), loc(2, 3));
                });
                // Let the writer queue behind this read's lock.
                std::thread::sleep(std::time::Duration::from_millis(100));
                let nested = inner.read_around(p2, |alt2| alt2);
                (alt, nested, w)
            });
            let _ = done.send(r.map(|(alt, nested, w)| {
                w.join().unwrap();
                (alt, nested)
            }));
        });
        let got = finished
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a read around a copy inside another waited for ever behind a writer");
        assert_eq!(got, Some((c1, Some(c2))));
        assert_eq!(hot.map.read().get(&loc(1, 3)), Some(&loc(2, 3)));
    }
}
