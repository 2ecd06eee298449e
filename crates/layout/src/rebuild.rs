//! Repair: every slab on a failed, missing or retired disk is rebuilt onto spare slabs of the
//! remaining disks (no dedicated hot spare), several slab sets in parallel, rate limited.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use tessera_disk::Pace;
use tracing::{info, warn};

use crate::error::{LayoutError, Result};
use crate::layouts::Layouts;
use crate::slabset::{Registry, SlabSet};

#[derive(Debug, Clone)]
pub struct RebuildOptions {
    /// Slab sets rebuilt at the same time.
    pub parallel: usize,
    /// Bytes per second written to replacement slabs, over all workers; None for no limit.
    pub rate_limit: Option<u64>,
}

impl Default for RebuildOptions {
    fn default() -> Self {
        RebuildOptions {
            parallel: 4,
            rate_limit: None,
        }
    }
}

/// What a repair has to do ([`Layouts::repair_counts`]), in set members.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairCounts {
    /// Members moved to a new slab: on failed, missing or retired disks.
    pub moves: usize,
    /// Members resynced where they are: they missed writes while their disk was away.
    pub stale: usize,
}

/// Shared with whoever watches the repair (a job, a progress bar).
#[derive(Debug, Default)]
pub struct Progress {
    pub total_bytes: AtomicU64,
    pub done_bytes: AtomicU64,
    pub cancel: AtomicBool,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RebuildReport {
    pub slabs_rebuilt: usize,
    pub bytes: u64,
    /// Slab sets that could not be rebuilt, and why.
    pub failures: Vec<(u32, String)>,
}

impl Layouts {
    /// Slab sets with a member that a repair would move, and how many bytes that is.
    pub fn repair_needed(&self) -> (Vec<u32>, u64) {
        let slab = self.pool.slab_size();
        let mut ids = Vec::new();
        let mut bytes = 0;
        for set in self.registry.all() {
            let n = self.needs_move(&set.members.read()).len();
            if n > 0 {
                ids.push(set.id);
                bytes += n as u64 * slab;
            }
        }
        (ids, bytes)
    }

    /// What a repair has to do, in one pass over the sets: the members it moves to new slabs
    /// (which take free space), and those it resyncs where they are (which missed writes
    /// while their disk was away; their disk is back, and they need none).
    pub fn repair_counts(&self) -> RepairCounts {
        let mut counts = RepairCounts::default();
        for set in self.registry.all() {
            let members = set.members.read();
            for m in self.needs_move(&members) {
                if self.in_place(members[m]) {
                    counts.stale += 1;
                } else {
                    counts.moves += 1;
                }
            }
        }
        counts
    }

    /// What a repair needs of the pool's free space ([`repair_counts`](Self::repair_counts)).
    pub fn repair_space_needed(&self) -> u64 {
        self.repair_counts().moves as u64 * self.pool.slab_size()
    }

    /// How many members wait for a repair to resync them where they are
    /// ([`repair_counts`](Self::repair_counts)).
    pub fn stale_members(&self) -> usize {
        self.repair_counts().stale
    }

    /// Whether a member a repair works on is resynced where it is: it sits on a healthy disk
    /// (so it is there because it missed writes while that disk was away).
    fn in_place(&self, member: tessera_pool::SlabRef) -> bool {
        self.pool.disk_state(member.disk) == tessera_pool::DiskState::Healthy
    }

    pub fn rebuild(&self, opts: &RebuildOptions, progress: &Progress) -> Result<RebuildReport> {
        let (ids, _) = self.repair_needed();
        self.rebuild_only(ids, opts, progress)
    }

    /// Resyncs where they are the members that missed writes while their disk was away, and
    /// nothing else: no free space needed, and the members of disks still missing (which may
    /// yet come back) left where they are.
    pub fn resync_stale(&self, opts: &RebuildOptions, progress: &Progress) -> Result<RebuildReport> {
        let ids = self
            .registry
            .all()
            .iter()
            .filter(|set| !self.repair_work(&set.members.read(), true).is_empty())
            .map(|set| set.id)
            .collect();
        self.repair_sets(ids, opts, progress, true)
    }

    /// The members of a set a repair works on: every one that needs moving or resyncing
    /// (`needs_move`), or with `stale_only` those resynced where they are.
    fn repair_work(&self, members: &[tessera_pool::SlabRef], stale_only: bool) -> Vec<usize> {
        self.needs_move(members)
            .into_iter()
            .filter(|&m| !stale_only || self.in_place(members[m]))
            .collect()
    }

    /// Rebuilds the members that need moving of the listed sets.
    pub(crate) fn rebuild_only(
        &self,
        ids: Vec<u32>,
        opts: &RebuildOptions,
        progress: &Progress,
    ) -> Result<RebuildReport> {
        self.repair_sets(ids, opts, progress, false)
    }

    fn repair_sets(
        &self,
        ids: Vec<u32>,
        opts: &RebuildOptions,
        progress: &Progress,
        stale_only: bool,
    ) -> Result<RebuildReport> {
        let slab = self.pool.slab_size();
        let bytes: u64 = ids
            .iter()
            .filter_map(|&id| self.registry.get(id).ok())
            .map(|set| self.repair_work(&set.members.read(), stale_only).len() as u64 * slab)
            .sum();
        progress.total_bytes.store(bytes, Ordering::Relaxed);
        progress.done_bytes.store(0, Ordering::Relaxed);
        let queue = Mutex::new(ids.into_iter().collect::<VecDeque<u32>>());
        let report = Mutex::new(RebuildReport::default());
        let start = Instant::now();
        // One rate for the whole repair, however many sets are copied at once.
        let pace = Pace::new(opts.rate_limit);
        info!(bytes, "repair started");
        std::thread::scope(|s| {
            for _ in 0..opts.parallel.max(1) {
                s.spawn(|| loop {
                    let Some(id) = queue.lock().pop_front() else { break };
                    if progress.cancel.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(set) = self.registry.get(id) else { continue };
                    if !self.rebuilding.lock().insert(id) {
                        // A repair and a scan's spot fix may both reach a set.
                        report
                            .lock()
                            .failures
                            .push((id, "another repair of this slab set is running".into()));
                        continue;
                    }
                    let result = self.rebuild_set(&set, &pace, progress, stale_only);
                    self.rebuilding.lock().remove(&id);
                    match result {
                        Ok(n) => {
                            let mut r = report.lock();
                            r.slabs_rebuilt += n;
                            r.bytes += n as u64 * self.pool.slab_size();
                        }
                        Err(e) => {
                            warn!(set = id, error = %e, "slab set not rebuilt");
                            report.lock().failures.push((id, e.to_string()));
                        }
                    }
                });
            }
        });
        if progress.cancel.load(Ordering::Relaxed) {
            return Err(LayoutError::Cancelled);
        }
        let report = report.into_inner();
        info!(
            slabs = report.slabs_rebuilt,
            failures = report.failures.len(),
            secs = start.elapsed().as_secs_f64(),
            "repair finished"
        );
        Ok(report)
    }

    /// Moves every member of `set` that sits on a disk that is not healthy, and resyncs where
    /// it is every member that missed writes while its disk was away. Returns how many.
    fn rebuild_set(&self, set: &SlabSet, pace: &Pace, progress: &Progress, stale_only: bool) -> Result<usize> {
        let slab_size = self.pool.slab_size();
        let chunk = set.spec.interleave.min(1 << 20);
        let mut moved = 0;
        loop {
            let (m, old, exclude) = {
                let members = set.members.read();
                let Some(&m) = self.repair_work(&members, stale_only).first() else {
                    return Ok(moved);
                };
                (m, members[m], members.iter().map(|s| s.disk).collect::<Vec<u32>>())
            };
            // A member on a healthy disk needs no new place: it is written over where it is
            // (as md resyncs a member its write-intent bitmap names), needing no free slab.
            let in_place = self.in_place(old);
            let new = if in_place {
                old
            } else {
                self.pool.allocate_replacement(&exclude)?
            };
            let give_back = |slab| {
                if !in_place {
                    self.release_slab(slab)
                }
            };
            // A disk lost from here on (and perhaps back before the swap) may have had writes
            // go around the new slab unrecorded, or left it without its copy: no swap then.
            let losses = self.pool.losses();
            *set.replacement.write() = Some((m, new));
            // Writes planned before this (a connection's own, in flight with the members held
            // shared: write_plan.rs) saw no replacement and write the old slab alone: the
            // copy starts once they are done. Those planned after see it, and go the ordinary
            // way, which writes the new slab too.
            drop(set.members.write());
            let copied = (|| -> Result<()> {
                let mut mo = 0;
                while mo < slab_size {
                    if !pace.take_unless(chunk, &progress.cancel) {
                        return Err(LayoutError::Cancelled);
                    }
                    let members = set.members.read();
                    let row = mo / set.spec.interleave;
                    let _g = self.row_lock(set.id, row).write();
                    let (content, refused) = match self.member_content(set, &members, m, mo, chunk as usize) {
                        Ok(c) => c,
                        Err(e) => self.member_content_around_lost(set, &members, m, mo, chunk as usize, e)?,
                    };
                    self.replacement_write(new, mo, &content).map_err(|_| LayoutError::Io {
                        set: set.id,
                        detail: format!("the replacement slab on disk {} failed", new.disk),
                    })?;
                    // Copied as held, refused as there: not vouched for by checksums of the copy.
                    for (at, sum) in refused {
                        self.sums().record(new, at, &[Some(sum)])?;
                    }
                    drop(_g);
                    drop(members);
                    mo += chunk;
                    progress.done_bytes.fetch_add(chunk, Ordering::Relaxed);
                }
                // The copy must be durable before the descriptor points at it.
                let dev = self.pool.readable_disk(new.disk).ok_or_else(|| LayoutError::Io {
                    set: set.id,
                    detail: format!("the replacement slab's disk {} is gone", new.disk),
                })?;
                dev.flush().map_err(|e| LayoutError::Io {
                    set: set.id,
                    detail: format!("flush of the replacement slab: {e}"),
                })?;
                // And its checksums, before a descriptor names it.
                self.journal.checkpoint(|| self.flush_members(), true)?;
                Ok(())
            })();
            if let Err(e) = copied {
                *set.replacement.write() = None;
                give_back(new);
                return Err(e);
            }
            {
                // Checkpoints first, then the members, as every other path takes them: a
                // checkpoint whose flush fails reads every set's members.
                let one = self.journal.checkpoints();
                let mut members = set.members.write();
                // No write is in flight now (the members are held); one that went around the
                // new slab while its disk was away left no record of it.
                if self.pool.losses() != losses || self.pool.readable_disk(new.disk).is_none() {
                    drop(members);
                    *set.replacement.write() = None;
                    give_back(new);
                    return Err(LayoutError::Io {
                        set: set.id,
                        detail: "a disk was lost while the slab was copied; the repair is to be run again".into(),
                    });
                }
                // One repair per set at a time (`rebuilding`): nobody moved it meanwhile.
                debug_assert_eq!(members[m], old);
                members[m] = new;
                let mut missed = set.missed.lock();
                let kept: Vec<_> = missed.iter().copied().filter(|s| *s != old).collect();
                let mut held = set.held.lock();
                let held_kept: Vec<_> = held.iter().copied().filter(|s| *s != old).collect();
                let desc = crate::slabset::SlabSetDesc {
                    id: set.id,
                    spec: set.spec,
                    members: members.clone(),
                    missed: kept.clone(),
                    held: held_kept.clone(),
                    lost: set.lost.lock().clone(),
                };
                if let Err(e) = Registry::persist(&self.pool, &desc) {
                    members[m] = old;
                    *set.replacement.write() = None;
                    give_back(new);
                    return Err(e);
                }
                *missed = kept;
                *held = held_kept;
                drop((missed, held));
                // Resynced where it is, it is a copy of what the others hold, no longer taken
                // as its disk held it (moved, `give_back` forgets it).
                if in_place {
                    self.held_as_is.write().remove(&old);
                }
                self.forget_missed(&[old]);
                *set.replacement.write() = None;
                // Update records written while the set was degraded must not outlive it:
                // writes to the repaired set are covered by Dirty records only, and replaying
                // an older Update over them would bring old data back. No I/O of this set is
                // in flight (the member lock is held), so a checkpoint retires them all.
                self.journal.checkpoint_under(
                    &one,
                    || self.flush_members_holding(Some((set.id, &members[..]))),
                    true,
                )?;
            }
            give_back(old);
            moved += 1;
        }
    }
}
