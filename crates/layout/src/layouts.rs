//! `Layouts`: the layout layer of one pool. It owns the slab sets, the row locks and the
//! stripe journal, and turns a (slab set, offset) request into member I/O.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tessera_disk::{AlignedBuf, DiskRef};
use tessera_pool::{DiskState, MetaBatch, Pool, PoolError, SlabRef};
use tracing::{info, warn};

use crate::error::{LayoutError, Result};
use crate::gather::RowGather;
use crate::journal::{RecordBody, StripeJournal};
use crate::slabset::{Registry, SlabSet};
use crate::spec::{LayoutKind, LayoutSpec};
use crate::sums::{block_sum, sums_of, Sums, BLOCK};

const ROW_LOCKS: usize = 4096;

/// Counters an administrator reads to see how hard the layer had to work.
#[derive(Debug, Default)]
pub struct IoStats {
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub reconstructed_reads: AtomicU64,
    pub repaired_blocks: AtomicU64,
    pub journal_records: AtomicU64,
    /// Blocks whose contents did not match their checksum when read.
    pub checksum_errors: AtomicU64,
    /// Parity row updates that covered their range of every data column (parity from the new
    /// data alone, no read), and those that read old data first (read-modify-write).
    pub full_row_writes: AtomicU64,
    pub partial_row_writes: AtomicU64,
}

/// What one disk's reads cost the layer since the pool was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskErrors {
    /// Reads the disk failed.
    pub read: u64,
    /// 4 KiB blocks it returned that did not match their checksum.
    pub checksum: u64,
    /// Bytes rewritten on it with good data from elsewhere.
    pub repaired_bytes: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SetHealth {
    pub id: u32,
    pub layout: String,
    pub width: usize,
    pub unavailable: usize,
    /// Members it may lose, per column for a striped mirror (`per_column`).
    pub tolerance: usize,
    pub per_column: bool,
    /// It has lost more than that: its data can be neither written nor wholly read.
    pub beyond_tolerance: bool,
    pub members: Vec<SlabRef>,
}

impl SetHealth {
    pub fn state(&self) -> &'static str {
        if self.unavailable == 0 {
            "healthy"
        } else if !self.beyond_tolerance {
            "degraded"
        } else {
            "failed"
        }
    }
}

/// Whether new data should be placed in a slab set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every member is on a healthy disk: new data gets the layout's full redundancy.
    Whole,
    /// A member is lost, retiring or being rebuilt, but a write still reaches enough members:
    /// new data is safe only to a reduced degree, so it goes here only when no whole set
    /// can be had.
    Degraded,
    /// More members are lost than the layout tolerates: a write here would fail.
    Lost,
}

/// One write of [`Layouts::write_members`]: `buf` at `mo` of member `m`, with the checksums
/// of `buf` if they were computed already.
pub(crate) struct MemberWrite<'a> {
    pub m: usize,
    pub mo: u64,
    pub buf: &'a [u8],
    pub sums: Option<&'a [Option<u32>]>,
}

pub(crate) enum MemberFault {
    Unavailable,
    Io(String),
    /// The storage behind the disk refused the request for now (this gateway fenced off by a
    /// newer owner, its cluster unreachable): nothing was read or written, and the disk is
    /// not at fault.
    Refused(String),
}

pub struct Layouts {
    pub(crate) pool: Arc<Pool>,
    pub(crate) registry: Registry,
    row_locks: Vec<RwLock<()>>,
    /// Writes to one parity row queued while it is written, written together.
    pub(crate) gather: RowGather,
    pub(crate) journal: StripeJournal,
    pub stats: IoStats,
    disk_errors: Mutex<BTreeMap<u32, DiskErrors>>,
    /// When a write was last logged as refused for a full file system: hosts retry such
    /// writes, and one line every ten seconds says it.
    full_logged: Mutex<Option<std::time::Instant>>,
    /// Every set's `missed` members (slabs that missed writes while their disk was away),
    /// for the checks of every I/O, which know a slab but not its set.
    missed: RwLock<HashSet<SlabRef>>,
    /// Whether `missed` holds anything: most pools never have one, and their I/O skips the
    /// lookup.
    any_missed: AtomicBool,
    /// Members taken back as their disk held them after an I/O error took it out (those of
    /// sets without redundancy, and mirror copies no other copy could resync:
    /// `record_stale_slabs`), recorded with their sets (`SlabSetDesc::held`) so that a
    /// restart knows them too: their checksum mismatches are not counted against the disk
    /// (`count_against_disk`).
    pub(crate) held_as_is: RwLock<HashSet<SlabRef>>,
    /// Members taken as held that a scrub is going through, by set and slab: the next row it
    /// must find them clean in, and the pool's count of losses when the pass began at row 0
    /// (`follow_held`, scrub.rs).
    pub(crate) held_passes: Mutex<HashMap<(u32, SlabRef), (u64, u64)>>,
    /// The sets with a member taken as its disk held it since the pool was opened, with the
    /// pool's count of losses (`Pool::lost_at`) of the latest disk whose loss it was: a
    /// writer that noted the count before that loss may have lost its writes with that
    /// disk's cache, whatever became of the member since (resynced over, moved, lost again),
    /// so its flush fails (`lost_since`).
    held_since: RwLock<HashMap<u32, u64>>,
    /// Held while a disk is taken back or given up: whether a mirror copy is taken as its
    /// disk holds it depends on what the other copies' disks are (`taken_as_held`), which
    /// another disk's return must not change under it.
    pub(crate) returning: Mutex<()>,
    /// Held while a set's `missed` record is saved, so that two writers save in turn.
    marking: Mutex<()>,
    /// The members' rows (slab, member offset) whose checksums a resync after a crash
    /// recorded from what they held, since the pool was opened. A region that could not be
    /// made consistent then is tried again at every checkpoint (its parity member's disk
    /// away, say): by then the write path keeps those checksums, and recording them again
    /// from what the blocks hold would vouch for rot that came since (`resync_row`).
    pub(crate) settled_by_resync: Mutex<HashSet<(SlabRef, u64)>>,
    /// The slab sets a repair works on now: one repair per set at a time (a set has one
    /// replacement slab, and two copies of a member would each think theirs the one).
    pub(crate) rebuilding: Mutex<HashSet<u32>>,
}

impl Layouts {
    /// Loads the slab sets of a pool and replays the stripe journal left by a crash.
    pub fn open(pool: Arc<Pool>) -> Result<Layouts> {
        let registry = Registry::load(&pool)?;
        let journal_dir = pool.dir().join("journal");
        // The journal holds the regions a crash may have left half written and the blocks'
        // checksums: made anew for a pool that holds data, those regions would never be made
        // consistent and its blocks would read unverified, without a word. Not so for a pool
        // whose metadata several gateways share (on RADOS): each keeps a journal of its own,
        // and one that takes the pool over starts with none.
        if !pool.meta().shared() && !registry.all().is_empty() && !journal_dir.exists() {
            return Err(LayoutError::Journal(format!(
                "the stripe journal {} of pool '{}' is missing: restore it; or, to open the pool without it \
                 (the blocks' checksums are then gone, and a row a crash left half written is not made \
                 consistent), create it as an empty directory",
                journal_dir.display(),
                pool.name()
            )));
        }
        let (journal, replay) = StripeJournal::open(&journal_dir, pool.checksums())?;
        // What an I/O error may have left stale on a disk it took out stays on the pool's
        // list while the disk is away (it comes back only by `disk online`, which records it,
        // or is given up by `disk fail`): recorded now, whether a mirror copy is taken as its
        // disk holds it would be decided by the disks' order, not by which comes back first.
        // A disk on the list that is open (none should be) is recorded.
        let held = record_stale_slabs(&pool, &registry, |d| pool.readable_disk(d).is_some(), true, |_| {})?;
        record_held(&pool, &registry, &held);
        // Members taken as held since they were, at this open or an earlier one.
        let held: HashSet<SlabRef> = registry.all().iter().flat_map(|s| s.held.lock().clone()).collect();
        let live: HashSet<SlabRef> = registry.all().iter().flat_map(|s| s.members.read().clone()).collect();
        journal.sums.keep_only(&live)?;
        let missed: HashSet<SlabRef> = registry.all().iter().flat_map(|s| s.missed.lock().clone()).collect();
        if !missed.is_empty() {
            info!(pool = %pool.name(), slabs = missed.len(), "slabs that missed writes while their disk was away are read around until a repair resyncs them");
        }
        // Raised, it must be on every label before anything is served; cleared, a failure
        // only makes an older daemon refuse a pool it could read.
        let pending = stale_present(&pool, &missed);
        if let Err(e) = pool.set_resync_pending(pending) {
            if pending {
                return Err(e.into());
            }
            warn!(pool = %pool.name(), error = %e, "cannot write the disk labels; they still say members await a resync");
        }
        let layouts = Layouts {
            pool,
            registry,
            row_locks: (0..ROW_LOCKS).map(|_| RwLock::new(())).collect(),
            gather: RowGather::default(),
            journal,
            stats: IoStats::default(),
            disk_errors: Mutex::new(BTreeMap::new()),
            full_logged: Mutex::new(None),
            any_missed: AtomicBool::new(!missed.is_empty()),
            missed: RwLock::new(missed),
            marking: Mutex::new(()),
            settled_by_resync: Mutex::new(HashSet::new()),
            rebuilding: Mutex::new(HashSet::new()),
            held_as_is: RwLock::new(held),
            held_passes: Mutex::new(HashMap::new()),
            held_since: RwLock::new(HashMap::new()),
            returning: Mutex::new(()),
        };
        if !replay.is_empty() {
            info!(records = replay.len(), "replaying the stripe journal");
            for (seq, rec) in replay {
                if !layouts.replay(&rec)? {
                    layouts.journal.pin(seq, rec);
                }
            }
        }
        layouts.journal.checkpoint(|| layouts.flush_members(), true)?;
        Ok(layouts)
    }

    /// Applies one record; false if its work could not be finished, so the record must stay:
    /// a region that cannot be made consistent yet, an update to a set that has lost more
    /// members than it tolerates. An error when what an update goes around cannot be recorded
    /// (the pool is not opened).
    pub(crate) fn replay(&self, rec: &crate::journal::Record) -> Result<bool> {
        let Ok(set) = self.registry.get(rec.set) else {
            warn!(
                set = rec.set,
                "journal record for a slab set that no longer exists; skipped"
            );
            return Ok(true);
        };
        // A record that matches no place of its set (bytes past the end of its slabs, a
        // member it does not have, a region past the end) would write into a neighbouring
        // slab, another set's: it is not replayed, and goes as a record of a set that no
        // longer exists does (nothing of the set lies where it points).
        if let Some(why) = self.stale_because(rec) {
            warn!(
                set = rec.set,
                why, "a journal record matches no place of its set; skipped"
            );
            return Ok(true);
        }
        let members = set.members.read();
        match &rec.body {
            RecordBody::Update { offset, writes } => {
                // A set beyond its tolerance takes no write meanwhile: the update goes to the
                // members here (their bytes and checksums as written) and is kept for those
                // away, applied to every member at the next import that finds enough of them.
                // Recorded as gone around them instead, they would be stale and the set lost.
                let kept = self.unavailable(&members) > 0 && self.beyond_tolerance(&set.spec, &members);
                if !kept {
                    // Written around a member whose disk is away, which is stale should it be
                    // back: recorded first.
                    self.note_missed(&set, &members)?;
                }
                // A member that cannot take its bytes is failed by the write: the set is
                // read around it from then on, and the other members hold the update.
                for (m, bytes) in writes {
                    if let Some(slab) = members.get(*m as usize) {
                        let _ = self.member_write(*slab, *offset, bytes);
                    }
                }
                Ok(!kept)
            }
            RecordBody::Dirty => match self.resync_region(&set, &members, rec.row) {
                Ok(()) => Ok(true),
                Err(e) => {
                    warn!(set = rec.set, region = rec.row, error = %e, "a region written when the pool stopped is not consistent yet; its journal record stays until it is");
                    Ok(false)
                }
            },
        }
    }

    /// Tries again the records replay could not finish; those that now succeed may go.
    fn retry_pinned(&self) {
        for (seq, rec) in self.journal.pinned() {
            if self.replay(&rec).unwrap_or(false) {
                info!(
                    set = rec.set,
                    region = rec.row,
                    "a region left inconsistent by a crash is consistent again"
                );
                self.journal.unpin(seq);
            }
        }
    }

    /// Stops the background work of the stripe journal's store and of the pool's metadata
    /// store, for a process about to exit with them open.
    pub fn stop_background_work(&self) {
        self.journal.stop_background_work();
        self.pool.meta().stop_background_work();
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn create_set(&self, spec: LayoutSpec) -> Result<Arc<SlabSet>> {
        self.registry.create(&self.pool, spec)
    }

    pub fn set(&self, id: u32) -> Result<Arc<SlabSet>> {
        self.registry.get(id)
    }

    pub fn sets(&self) -> Vec<Arc<SlabSet>> {
        self.registry.all()
    }

    /// The bytes the pool's slab sets lost beyond repair ([`SlabSetDesc::lost`]): reads of
    /// them fail until they are written again.
    ///
    /// [`SlabSetDesc::lost`]: crate::SlabSetDesc::lost
    pub fn lost_bytes(&self) -> u64 {
        self.registry.all().iter().map(|s| s.lost_bytes()).sum()
    }

    /// Writes slab set `id`'s descriptor again from what the running pool holds (where the
    /// stored one cannot be read), with the caller's records of the set in `also`, in one
    /// batch. False if the set is gone.
    pub fn rewrite_set_records(&self, id: u32, also: MetaBatch) -> Result<bool> {
        self.registry.rewrite(&self.pool, id, also)
    }

    /// Frees a slab set whose data nobody references any more. The journal is checkpointed
    /// first, so no record can later replay into slabs that another set may reuse, and the
    /// slabs' checksums are forgotten before another set can take them.
    pub fn free_set(&self, id: u32) -> Result<()> {
        self.journal.checkpoint(|| self.flush_members(), true)?;
        let set = self.registry.get(id)?;
        for slab in set.members.read().iter() {
            self.sums().forget_slab(*slab)?;
        }
        self.registry.remove(&self.pool, id)?;
        // Before its slabs can go to another set: a slab still listed would be read and
        // written around there, and the record of that would be nowhere.
        // Taken out of the set's lock first: forgetting takes `marking`, which a record
        // takes before the set's (`note_missed`).
        let missed = set.missed.lock().clone();
        self.forget_missed(&missed);
        for s in set.members.read().iter() {
            self.held_as_is.write().remove(s);
            self.pool.release_slab(*s);
        }
        // A freed set holds nothing of any writer's (`lost_since` answers no for it): what
        // it lost goes with it, rather than stay in memory until the pool is opened again.
        self.held_since.write().remove(&id);
        Ok(())
    }

    /// Gives a slab back to the pool, its checksums forgotten first.
    pub(crate) fn release_slab(&self, slab: SlabRef) {
        if let Err(e) = self.sums().forget_slab(slab) {
            // Kept out of use rather than handed to a set that would find stale checksums.
            warn!(disk = slab.disk, slab = slab.slab, error = %e, "cannot forget a slab's checksums; the slab stays in use until the next import");
            return;
        }
        self.held_as_is.write().remove(&slab);
        self.pool.release_slab(slab);
    }

    /// The disk of a set's member if the member may be read and written: its disk readable,
    /// and the member not one that missed writes while its disk was away.
    pub(crate) fn member_dev(&self, slab: SlabRef) -> Option<DiskRef> {
        if self.is_missed(slab) {
            return None;
        }
        self.pool.readable_disk(slab.disk)
    }

    /// Takes back, while the pool runs, a data disk missing since the import, or taken out by
    /// an I/O error (`Pool::bring_back`): its slabs recorded as having missed writes, and
    /// those the error may have left stale where another member can resync them, stay unread
    /// and unwritten until a repair resyncs them (the labels say so before the disk is back);
    /// the others are current (those the error left stale with nothing to resync them from as
    /// the disk holds them, `record_stale_slabs`).
    /// In one turn with the records (`marking`), so that no verdict on the labels' flag is
    /// written out of order with it.
    ///
    /// Refused while a journal update kept at the import for a set beyond its tolerance
    /// waits for the disk (the import that finds it applies the update to every member):
    /// taken back without it, the disk would be read as holding what it never got.
    pub fn bring_back_disk(&self, position: u32, dev: DiskRef) -> Result<()> {
        for (_, rec) in self.journal.pinned() {
            let waits = matches!(rec.body, crate::journal::RecordBody::Update { .. })
                && self
                    .registry
                    .get(rec.set)
                    .is_ok_and(|set| set.members.read().iter().any(|s| s.disk == position));
            if waits && self.pool.disk_state(position) == DiskState::Failed {
                return Err(LayoutError::Invalid(format!(
                    "a write to slab set {} that was under way when the pool last stopped waits in the journal for this disk, \
                     which an I/O error took out: only an import applies it, and an import does not take back such a disk, \
                     so it cannot come back ('tessera disk fail' gives it up)",
                    rec.set
                )));
            }
            if waits {
                return Err(LayoutError::Invalid(format!(
                    "a write to slab set {} that was under way when the pool last stopped waits in the journal for this disk: \
                     it is taken back by the pool's next import (restart the daemon, or export and import the pool)",
                    rec.set
                )));
            }
        }
        // What an I/O error may have left stale on it, recorded while it is still away
        // (outside `marking`, which a writer takes while it holds a set's members).
        let _returning = self.returning.lock();
        // Refused before anything is recorded where it can be (another disk in its place, an
        // older copy): a crash after a refusal then leaves nothing to undo.
        self.pool.may_bring_back(position, &dev)?;
        // The disk's list stays in the pool's records until the save that takes the disk back
        // clears it (`Pool::bring_back`): if the disk is refused, or the daemon stops first,
        // the list is still there for its next return or its giving up, with nothing to undo.
        let held = record_stale_slabs(
            &self.pool,
            &self.registry,
            |d| d == position,
            false,
            |new| {
                self.missed.write().extend(new.iter().copied());
                self.any_missed.store(true, Ordering::Release);
            },
        )?;
        let lost_at = self.pool.lost_at(position);
        // What the members taken as held changed, to be undone if the disk is refused.
        let (mut newly_held, mut since_before) = (Vec::new(), HashMap::new());
        for &(set, slab) in &held {
            if self.held_as_is.write().insert(slab) {
                newly_held.push(slab);
            }
            let mut since = self.held_since.write();
            since_before.entry(set).or_insert_with(|| since.get(&set).copied());
            let at = since.entry(set).or_default();
            *at = (*at).max(lost_at);
        }
        {
            let _turn = self.marking.lock();
            let misses = self.missed.read().iter().any(|s| s.disk == position);
            let refused = match misses {
                true => self.pool.set_resync_pending(true).err(),
                false => None,
            };
            let refused = match refused {
                Some(e) => Some(e),
                None => self.pool.bring_back(position, dev).err(),
            };
            if let Some(e) = refused {
                // Refused (an older copy, another disk in its place, say): the flag says
                // what the records say again, and the members taken as held are stale
                // again, as the pool's list still says (judged anew at the disk's next
                // return, or recorded with their sets if it is given up,
                // `record_stale_of_given_up`). Left taken as held, they would count as
                // current copies with the disk still away, and a copy on another disk,
                // stale after the same error, would then wait for them for good rather than
                // be taken as its disk holds it.
                let pending = stale_present(&self.pool, &self.missed.read());
                if let Err(w) = self.pool.set_resync_pending(pending) {
                    warn!(pool = %self.pool.name(), error = %w, "cannot write the disk labels; they still say members await a resync");
                }
                self.unhold(&newly_held, since_before);
                return Err(e.into());
            }
        }
        record_held(&self.pool, &self.registry, &held);
        // The regions a crash left unsynced that waited for it are settled with it now, as
        // the import's replay would settle them, and the journal checkpointed; if that
        // fails, the next write or flush checkpoints, and the disk is back either way.
        if let Err(e) = self.checkpoint() {
            self.journal.request_checkpoint();
            warn!(pool = %self.pool.name(), error = %e, "the disk is back, but the checkpoint after it failed; the next write or flush tries again");
        }
        Ok(())
    }

    /// Undoes in memory the taking as held of members of a disk that was then refused:
    /// `newly` left `held_as_is`, and `held_since` is as it was before. Nothing of it was
    /// recorded: the pool's list of the disk's stale slabs still holds them.
    fn unhold(&self, newly: &[SlabRef], since_before: HashMap<u32, Option<u64>>) {
        {
            let mut as_is = self.held_as_is.write();
            for s in newly {
                as_is.remove(s);
            }
        }
        {
            let mut since = self.held_since.write();
            for (set, before) in since_before {
                // A set freed meanwhile took its entry with it.
                if self.registry.get(set).is_err() {
                    since.remove(&set);
                    continue;
                }
                match before {
                    Some(at) => since.insert(set, at),
                    None => since.remove(&set),
                };
            }
        }
    }

    /// Before a disk an I/O error took out is given up (`disk fail`): the slabs it may lack
    /// writes of (written since its last flush) are recorded with their sets as members that
    /// missed writes, as `disk online` would have recorded them. Forgotten instead, such a
    /// member would count as current, and a mirror's other copy, stale after the same
    /// error (an enclosure that blinked), would wait for it for good rather than be taken
    /// back as its disk holds it (`taken_as_held`).
    pub fn record_stale_of_given_up(&self, position: u32) -> Result<()> {
        let _returning = self.returning.lock();
        let Some((_, slabs)) = self.pool.stale_slabs().into_iter().find(|(d, _)| *d == position) else {
            return Ok(());
        };
        let stale: HashSet<SlabRef> = slabs.iter().map(|&slab| SlabRef { disk: position, slab }).collect();
        // A set without redundancy has nothing to wait for it with: what it held is lost.
        for set in self.registry.all().into_iter().filter(|s| s.spec.tolerance() > 0) {
            self.registry.add_missed(
                &self.pool,
                set.id,
                |s| stale.contains(s),
                |new| {
                    self.missed.write().extend(new.iter().copied());
                    self.any_missed.store(true, Ordering::Release);
                },
            )?;
        }
        Ok(self.pool.forget_stale_slabs(position)?)
    }

    /// Whether `slab` missed writes while its disk was away and is not resynced yet.
    pub(crate) fn is_missed(&self, slab: SlabRef) -> bool {
        self.any_missed.load(Ordering::Acquire) && self.missed.read().contains(&slab)
    }

    /// Records durably, before a write that goes around them reaches any disk, the members
    /// of `set` whose disk is missing: such a disk may be back at the next import, and then
    /// only the members recorded here are stale (the pool takes it back, `returns_as`). The
    /// caller holds `members` (the set's, shared) for the whole write. Nothing to do, and
    /// no lock taken, when no member's disk is missing.
    ///
    /// Only members of disks away now are recorded: one whose disk came back since the
    /// caller looked (`bring_back_disk`, which holds `marking` for the change) is not, and
    /// the caller writes to it (`write_members` looks again), so that no member present turns
    /// stale under another write.
    pub(crate) fn note_missed(&self, set: &SlabSet, members: &[SlabRef]) -> Result<()> {
        let away = |s: &SlabRef| self.pool.may_return(s.disk);
        if !members.iter().any(away) {
            return Ok(());
        }
        let _turn = self.marking.lock();
        let mut missed = set.missed.lock();
        let new = Registry::persist_missed(&self.pool, set, members, &mut missed, away)?;
        if !new.is_empty() {
            self.missed.write().extend(new);
            self.any_missed.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Forgets slabs that are no longer missed members (resynced, moved away, or freed with
    /// their set); their descriptors are saved without them already.
    pub(crate) fn forget_missed(&self, slabs: &[SlabRef]) {
        if slabs.is_empty() {
            return;
        }
        let mut missed = self.missed.write();
        for s in slabs {
            missed.remove(s);
        }
        self.any_missed.store(!missed.is_empty(), Ordering::Release);
        drop(missed);
        // Judged and written in one turn (as records are made, `marking`), so that two
        // calls cannot write their verdicts in the wrong order.
        let _turn = self.marking.lock();
        let pending = stale_present(&self.pool, &self.missed.read());
        if let Err(e) = self.pool.set_resync_pending(pending) {
            warn!(pool = %self.pool.name(), error = %e, "cannot write the disk labels; they still say members await a resync");
        }
    }

    pub(crate) fn sums(&self) -> &Sums {
        &self.journal.sums
    }

    /// Whether blocks are stored with checksums.
    pub fn checksums(&self) -> bool {
        self.sums().enabled()
    }

    /// Read errors, checksum errors and repairs per disk (by pool position) since the pool
    /// was opened.
    pub fn disk_errors(&self) -> BTreeMap<u32, DiskErrors> {
        self.disk_errors.lock().clone()
    }

    /// Counts checksum mismatches of `slab` against its disk (what retires a failing disk),
    /// but those of a member taken back as the disk holds it (`held_as_is`): blocks its
    /// volatile cache lost when an error took it out are not rot of its medium.
    pub(crate) fn count_against_disk(&self, slab: SlabRef, blocks: u64) {
        if !self.held_as_is.read().contains(&slab) {
            self.count_for(slab.disk, |c| c.checksum += blocks);
        }
    }

    pub(crate) fn count_for(&self, disk: u32, f: impl FnOnce(&mut DiskErrors)) {
        f(self.disk_errors.lock().entry(disk).or_default());
    }

    /// Makes every completed write durable and retires every journal record that covers them
    /// (but those of regions still to be made consistent): a clean stop calls it, so that
    /// the next start has nothing to resync, and loses nothing if a disk is missing then.
    pub fn checkpoint(&self) -> Result<()> {
        self.retry_pinned();
        self.journal.checkpoint(|| self.flush_members(), true)
    }

    /// A member was lost (failed by an error or by the administrator): the records of its
    /// sets are retired at the next write or flush, while every other member can still make
    /// them consistent, rather than found at a restart that could not resync them.
    pub fn member_lost(&self) {
        self.journal.request_checkpoint();
    }

    /// Makes every completed write durable. Now and then this is also a journal checkpoint.
    pub fn flush(&self) -> Result<()> {
        if self.journal.wants_checkpoint() {
            self.retry_pinned();
            self.journal.checkpoint(|| self.flush_members(), false)?;
        } else {
            self.flush_members()?;
        }
        if self.journal.checkpoint_requested() {
            // A member was lost on the way: retire now, for good, the records of the writes
            // this flush made durable on the others, so that a crash right after the answer
            // leaves no region that a restart without that member could not resync.
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Flushes every member. A member whose flush failed has been failed by the pool; what it
    /// held since the last flush is durable only if every slab set it belongs to still has
    /// enough members, all flushed, to serve it. If one has not, the flush fails: a write
    /// behind it must never be reported durable.
    pub(crate) fn flush_members(&self) -> Result<()> {
        self.flush_members_holding(None)
    }

    /// [`flush_members`](Self::flush_members) for a caller that holds one set's members
    /// (`held`: its id and members), which are not locked again (a repair swapping a member).
    pub(crate) fn flush_members_holding(&self, held: Option<(u32, &[SlabRef])>) -> Result<()> {
        let failed = self.pool.flush_all()?;
        if failed.is_empty() {
            return Ok(());
        }
        for set in self.registry.all() {
            let guard;
            let members: &[SlabRef] = match held {
                Some((id, members)) if id == set.id => members,
                _ => {
                    guard = set.members.read();
                    &guard
                }
            };
            if !members.iter().any(|m| failed.contains(&m.disk)) {
                continue;
            }
            if self.beyond_tolerance(&set.spec, members) {
                return Err(LayoutError::FlushFailed {
                    set: set.id,
                    unavailable: self.unavailable(members),
                    width: set.spec.width(),
                    tolerance: set.spec.tolerance(),
                });
            }
        }
        warn!(disks = ?failed, "a member's flush failed: its slab sets go on from their other members");
        self.member_lost();
        Ok(())
    }

    /// Whether data written to `set` after the pool's loss count was `noted` may be gone: the
    /// set is beyond its tolerance now, and one of the members it lost was lost after that.
    /// A flush that succeeded cannot vouch for such a write (the member went before it could
    /// flush it, perhaps failed by someone else's flush), so the writer's flush must fail.
    /// A set freed since holds nothing of the writer's any more (a set is freed once nothing
    /// above references its data), so it cannot have lost it.
    ///
    /// A set without redundancy asks only whether a member was lost since: such a member
    /// comes back as its disk holds it (`record_stale_slabs`), so the set may be whole again
    /// by the writer's flush and still lack the write. Any set that had a member taken back
    /// that way for a loss after `noted` (a mirror whose copies all went out on errors) may
    /// lack it too, whatever became of that member since (`held_since`).
    pub fn lost_since(&self, set: &SlabSet, noted: u64) -> bool {
        if !self.set(set.id).is_ok_and(|live| std::ptr::eq(&*live, set)) {
            return false;
        }
        if self.held_since.read().get(&set.id).is_some_and(|&at| at > noted) {
            return true;
        }
        let members = set.members.read();
        let lost = members.iter().any(|m| self.pool.lost_since(m.disk, noted));
        lost && (set.spec.tolerance() == 0 || self.beyond_tolerance(&set.spec, &members))
    }

    pub fn health(&self, set: &SlabSet) -> SetHealth {
        let members = set.members.read().clone();
        SetHealth {
            id: set.id,
            layout: set.spec.describe(),
            width: set.spec.width(),
            unavailable: self.unavailable(&members),
            tolerance: set.spec.tolerance(),
            per_column: set.spec.kind == LayoutKind::Mirror && set.spec.columns > 1,
            beyond_tolerance: self.beyond_tolerance(&set.spec, &members),
            members,
        }
    }

    /// Whether a write to `set` is refused: it has lost more than its layout tolerates (the
    /// check every write makes).
    pub fn refuses_writes(&self, set: &SlabSet) -> bool {
        let members = set.members.read();
        self.beyond_tolerance(&set.spec, &members)
    }

    /// Whether the data of `set` can be neither read nor rebuilt: it has lost more than its
    /// layout tolerates (`beyond_tolerance`) to members on failed or missing disks, which stay
    /// so until the pool is imported again.
    pub fn unrecoverable(&self, set: &SlabSet) -> bool {
        let members = set.members.read();
        self.beyond_tolerance(&set.spec, &members)
    }

    /// Whether a set has lost more than its layout tolerates: a mirror column with no copy
    /// left, or more unavailable members of another layout than it has parity columns. A
    /// mirror tolerates its losses per column: a striped mirror short of one copy in every
    /// column still reads and writes everything from the copies it has, and a repair makes it
    /// whole. Never below the count: a column with no copy has lost more members than the
    /// layout's tolerance.
    pub(crate) fn beyond_tolerance(&self, spec: &LayoutSpec, members: &[SlabRef]) -> bool {
        loses_more_than_tolerated(spec, members.len(), |m| self.member_dev(members[m]).is_none())
    }

    /// Whether `set` has lost more than its tolerance even with every disk away that can come
    /// back as it was back: a member that missed writes (or that an I/O error may have left
    /// stale, in a set with redundancy), or whose disk failed for good, counts as gone. A disk coming back meanwhile
    /// never turns the answer to true (which judging `unrecoverable`, then this with the disk
    /// counted, could).
    pub fn lost_for_good(&self, set: &SlabSet) -> bool {
        let members = set.members.read();
        // Stale before missed: recording moves a slab from the one to the other.
        let lacks = |slab: SlabRef| self.pool.is_stale(slab) || self.is_missed(slab);
        let gone_for_good = |m: usize| {
            let slab = members[m];
            // Asked in this order, a disk taken back between the two questions is never gone.
            // A stale member that nothing could resync is taken back as it is
            // (`record_stale_slabs`).
            (self.pool.is_stale(slab)
                && !taken_as_held(&set.spec, &members, m, lacks, |s| self.pool.last_flush(s.disk)))
                || self.is_missed(slab)
                || (!self.pool.can_come_back(slab.disk) && self.pool.readable_disk(slab.disk).is_none())
        };
        loses_more_than_tolerated(&set.spec, members.len(), gone_for_good)
    }

    /// Where new data may go, judged from the members' disks. Never blocks: a set whose
    /// members a rebuild is swapping counts as degraded (it has a member to rebuild).
    pub fn placement(&self, set: &SlabSet) -> Placement {
        let Some(members) = set.try_members() else {
            return Placement::Degraded;
        };
        if self.beyond_tolerance(&set.spec, &members) {
            Placement::Lost
        } else if self.needs_move(&members).is_empty() && set.replacement.read().is_none() {
            Placement::Whole
        } else {
            Placement::Degraded
        }
    }

    pub(crate) fn unavailable(&self, members: &[SlabRef]) -> usize {
        members.iter().filter(|s| self.member_dev(**s).is_none()).count()
    }

    /// Members that a repair must move (on failed, missing or retired disks) or resync where
    /// they are (missed writes while their disk was away).
    pub(crate) fn needs_move(&self, members: &[SlabRef]) -> Vec<usize> {
        (0..members.len())
            .filter(|&m| self.pool.disk_state(members[m].disk) != DiskState::Healthy || self.is_missed(members[m]))
            .collect()
    }

    pub(crate) fn row_lock(&self, set: u32, row: u64) -> &RwLock<()> {
        let h = (set as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ row.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        &self.row_locks[(h >> 32) as usize % ROW_LOCKS]
    }

    /// Reads member bytes and checks them against their checksums: a block that does not
    /// match is a read error of this member, read around and repaired like one.
    pub(crate) fn member_read(&self, slab: SlabRef, mo: u64, buf: &mut [u8]) -> Result<(), MemberFault> {
        if !self.sums().enabled() {
            return self.member_read_raw(slab, mo, buf);
        }
        let end = mo + buf.len() as u64;
        let (lo, hi) = (mo / BLOCK * BLOCK, end.div_ceil(BLOCK) * BLOCK);
        if (lo, hi) == (mo, end) {
            self.member_read_raw(slab, mo, buf)?;
            self.check_sums(slab, mo, buf)
        } else {
            // Part of a block: its checksum covers the whole block.
            let mut whole = AlignedBuf::zeroed((hi - lo) as usize);
            self.member_read_raw(slab, lo, &mut whole)?;
            buf.copy_from_slice(&whole[(mo - lo) as usize..][..buf.len()]);
            self.check_sums(slab, lo, &whole)
        }
    }

    /// Whether whole blocks read from a member at `mo` match their checksums.
    fn check_sums(&self, slab: SlabRef, mo: u64, buf: &[u8]) -> Result<(), MemberFault> {
        match self.sums().verify(slab, mo, buf) {
            Ok(bad) if bad.is_empty() => Ok(()),
            Ok(bad) => {
                self.checksum_errors(slab, &bad);
                Err(MemberFault::Io(format!(
                    "{} block(s) of disk {} do not match their checksum (the first at byte {} of slab {})",
                    bad.len(),
                    slab.disk,
                    bad[0],
                    slab.slab
                )))
            }
            Err(e) => {
                // The data was read; only the means to check it is missing.
                warn!(disk = slab.disk, error = %e, "cannot read block checksums; the read is not verified");
                Ok(())
            }
        }
    }

    /// Reads several members' bytes with the reads in flight together, each checked against
    /// its checksums; true per request read whole and matching. False leaves the request to
    /// the caller's usual path (`read_piece`), which counts a failure, reads around it and
    /// repairs it: a request this cannot put on the shared submission (a missing disk, part
    /// of a checksum block), a failed read, a mismatch. Nothing is counted or reported here,
    /// so a fault is counted once, when the usual path meets it.
    pub(crate) fn member_reads_together(&self, reqs: &mut [(SlabRef, u64, &mut [u8])]) -> Vec<bool> {
        let mut ok = vec![false; reqs.len()];
        let sums = self.sums().enabled();
        let spread: Vec<(usize, DiskRef)> = reqs
            .iter()
            .enumerate()
            .filter(|(_, (_, mo, buf))| !sums || (mo % BLOCK == 0 && (buf.len() as u64).is_multiple_of(BLOCK)))
            .filter_map(|(i, (slab, _, _))| Some((i, self.member_dev(*slab)?)))
            .collect();
        if spread.len() < 2 {
            return ok;
        }
        let offsets: Vec<u64> = spread
            .iter()
            .map(|(i, _)| self.pool.slab_offset(reqs[*i].0) + reqs[*i].1)
            .collect();
        let mut batch: Vec<tessera_disk::SpreadRead> = Vec::with_capacity(spread.len());
        let mut chosen = spread.iter().zip(&offsets).peekable();
        for (i, (_, _, buf)) in reqs.iter_mut().enumerate() {
            if let Some(((_, dev), &offset)) = chosen.next_if(|((j, _), _)| *j == i) {
                batch.push(tessera_disk::SpreadRead {
                    disk: &**dev,
                    buf: &mut **buf,
                    offset,
                });
            }
        }
        let results = tessera_disk::read_spread(&mut batch);
        drop(batch);
        for ((i, _), res) in spread.iter().zip(results) {
            let (slab, mo, buf) = &reqs[*i];
            ok[*i] = res.is_ok() && (!sums || self.verified(*slab, *mo, buf));
        }
        ok
    }

    /// Reads member bytes as the disk returns them.
    pub(crate) fn member_read_raw(&self, slab: SlabRef, mo: u64, buf: &mut [u8]) -> Result<(), MemberFault> {
        let dev = self.member_dev(slab).ok_or(MemberFault::Unavailable)?;
        dev.read_at(buf, self.pool.slab_offset(slab) + mo).map_err(|e| {
            self.read_error(slab.disk, &e);
            if e.is_unavailable() {
                MemberFault::Refused(e.to_string())
            } else {
                MemberFault::Io(e.to_string())
            }
        })
    }

    /// Counts and logs a member's read error; the caller reads around it.
    pub(crate) fn read_error(&self, disk: u32, e: &tessera_disk::DiskError) {
        self.stats.read_errors.fetch_add(1, Ordering::Relaxed);
        // A refusal of the storage behind the disk is not the disk's error.
        if !e.is_unavailable() {
            self.count_for(disk, |c| c.read += 1);
        }
        warn!(disk, error = %e, "read error");
    }

    /// Counts and logs blocks of a member that do not match their checksums.
    pub(crate) fn checksum_errors(&self, slab: SlabRef, bad: &[u64]) {
        self.stats
            .checksum_errors
            .fetch_add(bad.len() as u64, Ordering::Relaxed);
        self.count_against_disk(slab, bad.len() as u64);
        warn!(
            disk = slab.disk,
            slab = slab.slab,
            blocks = bad.len(),
            first = bad[0],
            "checksum mismatch"
        );
    }

    /// True if the bytes at `mo` (whole blocks) match their checksums. For reads that went to
    /// the disk another way (a batch): on false the caller reads again the single way, which
    /// counts the bad blocks once.
    pub(crate) fn verified(&self, slab: SlabRef, mo: u64, buf: &[u8]) -> bool {
        matches!(self.sums().verify(slab, mo, buf), Ok(bad) if bad.is_empty())
    }

    /// A write error fails the disk: a member that missed a write holds stale data and must
    /// never be read again.
    pub(crate) fn member_write(&self, slab: SlabRef, mo: u64, buf: &[u8]) -> Result<(), MemberFault> {
        self.member_write_summed(slab, mo, buf, None)
    }

    /// Writes the slab a repair fills: written even while it is a member that missed writes
    /// (resynced where it is), which no other write reaches.
    pub(crate) fn replacement_write(&self, slab: SlabRef, mo: u64, buf: &[u8]) -> Result<(), MemberFault> {
        let _mark = self.pool.mark_write(slab);
        let dev = self.pool.readable_disk(slab.disk).ok_or(MemberFault::Unavailable)?;
        self.slab_write(dev, slab, mo, buf, None)
    }

    /// The checksums a write of whole blocks will record, computed once for every copy it
    /// goes to; None when the pool keeps none or the write covers part of a block.
    pub(crate) fn sums_for(&self, mo: u64, buf: &[u8]) -> Option<Vec<Option<u32>>> {
        (self.sums().enabled() && mo % BLOCK == 0 && buf.len() as u64 % BLOCK == 0).then(|| sums_of(buf))
    }

    /// [`member_write`](Self::member_write) with the checksums of `buf` computed already
    /// (by [`sums_for`](Self::sums_for)).
    pub(crate) fn member_write_summed(
        &self,
        slab: SlabRef,
        mo: u64,
        buf: &[u8],
        known: Option<&[Option<u32>]>,
    ) -> Result<(), MemberFault> {
        // Marked before the disk is looked for (`Pool::mark_write`), until it answered.
        let _mark = self.pool.mark_write(slab);
        let dev = self.member_dev(slab).ok_or(MemberFault::Unavailable)?;
        self.slab_write(dev, slab, mo, buf, known)
    }

    fn slab_write(
        &self,
        dev: DiskRef,
        slab: SlabRef,
        mo: u64,
        buf: &[u8],
        known: Option<&[Option<u32>]>,
    ) -> Result<(), MemberFault> {
        // A repair that finds the file system full fails; the disk it writes to is not at fault.
        self.reserve_one(&dev, slab, mo, buf.len())
            .map_err(|e| MemberFault::Io(e.to_string()))?;
        let computed = match known {
            None if self.sums().enabled() => Some(self.sums_after_write(&dev, slab, mo, buf)),
            _ => None,
        };
        let sums = known
            .map(|k| (mo, k))
            .or(computed.as_ref().map(|(lo, c)| (*lo, &c[..])));
        self.member_write_raw(&dev, slab, mo, buf)?;
        if let Some((lo, sums)) = sums {
            if let Err(e) = self.sums().record(slab, lo, sums) {
                warn!(disk = slab.disk, error = %e, "cannot record block checksums");
            }
        }
        Ok(())
    }

    /// The checksums of the blocks a write of `buf` at `mo` touches, once it is done: from
    /// `buf` for whole blocks; for a block written in part, from its other bytes read back,
    /// unless those do not match the block's checksum (rot in bytes the write keeps: no
    /// checksum is recorded rather than one that vouches for it).
    fn sums_after_write(&self, dev: &DiskRef, slab: SlabRef, mo: u64, buf: &[u8]) -> (u64, Vec<Option<u32>>) {
        let end = mo + buf.len() as u64;
        let (lo, hi) = (mo / BLOCK * BLOCK, end.div_ceil(BLOCK) * BLOCK);
        if (lo, hi) == (mo, end) {
            return (lo, sums_of(buf));
        }
        let mut sums = Vec::with_capacity(((hi - lo) / BLOCK) as usize);
        let mut block = AlignedBuf::zeroed(BLOCK as usize);
        for b in (lo..hi).step_by(BLOCK as usize) {
            let (from, to) = (b.max(mo), (b + BLOCK).min(end));
            let new = &buf[(from - mo) as usize..(to - mo) as usize];
            if (from, to) == (b, b + BLOCK) {
                sums.push(Some(block_sum(new)));
                continue;
            }
            let old_ok = dev.read_at(&mut block, self.pool.slab_offset(slab) + b).is_ok()
                && match self.sums().get(slab, b) {
                    Ok(Some(want)) => block_sum(&block) == want,
                    Ok(None) => true,
                    Err(_) => false,
                };
            if old_ok {
                block[(from - b) as usize..(to - b) as usize].copy_from_slice(new);
                sums.push(Some(block_sum(&block)));
            } else {
                sums.push(None);
            }
        }
        (lo, sums)
    }

    fn member_write_raw(&self, dev: &DiskRef, slab: SlabRef, mo: u64, buf: &[u8]) -> Result<(), MemberFault> {
        dev.write_at(buf, self.pool.slab_offset(slab) + mo)
            .map_err(|e| self.member_write_failed(slab, &e).0)
    }

    /// A member that failed a write leaves the set: counted, and its disk taken out (failed,
    /// able to come back with what may be stale on it recorded: `Pool::lose_disk`); unless
    /// the storage behind it only could not take the write now (then the write fails and the
    /// disk stays).
    /// With the fault, why the disk's failure could not be recorded, if it could not: then
    /// what it may lack is not known durably, and a write must not be answered as written
    /// around it.
    fn member_write_failed(&self, slab: SlabRef, e: &tessera_disk::DiskError) -> (MemberFault, Option<String>) {
        self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
        if e.is_unavailable() {
            warn!(disk = slab.disk, error = %e, "write refused by the storage");
            return (MemberFault::Refused(e.to_string()), None);
        }
        self.member_lost();
        let unrecorded = self
            .pool
            .lose_disk(slab.disk, format!("write error: {e}"))
            .err()
            .map(|pe| {
                warn!(error = %pe, "cannot record a disk failure");
                pe.to_string()
            });
        (MemberFault::Io(e.to_string()), unrecorded)
    }

    /// Reserves the space a write of `len` bytes at `mo` of `slab` needs on `dev`
    /// ([`BlockDevice::reserve`](tessera_disk::BlockDevice::reserve)). Only a full file system
    /// is an error (the pool's out-of-space error, which hosts see as a thin pool out of
    /// space); any other failure to reserve is left for the write to find.
    pub(crate) fn reserve_one(&self, dev: &DiskRef, slab: SlabRef, mo: u64, len: usize) -> Result<()> {
        match dev.reserve(self.pool.slab_offset(slab) + mo, len as u64) {
            Err(e) if e.is_no_space() => {
                let mut logged = self.full_logged.lock();
                if logged.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(10)) {
                    *logged = Some(std::time::Instant::now());
                    warn!(pool = %self.pool.name(), disk = %dev.path(), error = %e, "writes refused: the file system holding the disk is full");
                }
                Err(LayoutError::Pool(PoolError::NoSpace {
                    pool: self.pool.name().to_string(),
                    detail: format!(
                        "the file system holding {} is full ({e}); free space there, or move the pool's \
                         disks to a larger one",
                        dev.path()
                    ),
                }))
            }
            _ => Ok(()),
        }
    }

    /// Every slab each write goes to (index in `writes`, slab, its disk, its checksums after
    /// the write), its space reserved; and the members it goes around (their disk not
    /// available, or they missed writes while it was away).
    #[allow(clippy::type_complexity)]
    fn write_targets(
        &self,
        members: &[SlabRef],
        writes: &[MemberWrite<'_>],
        repl: Option<(usize, SlabRef)>,
    ) -> Result<(
        Vec<(usize, SlabRef, DiskRef, Option<(u64, Vec<Option<u32>>)>)>,
        Vec<SlabRef>,
    )> {
        let mut targets = Vec::with_capacity(writes.len() + 1);
        let mut around = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            let extra = repl.filter(|(idx, _)| *idx == w.m).map(|(_, slab)| slab);
            // The member as a member; the slab a repair fills whatever it is (it may be the
            // member itself, resynced where it is).
            let member = std::iter::once((members[w.m], self.member_dev(members[w.m])));
            for (slab, dev) in member.chain(extra.map(|s| (s, self.pool.readable_disk(s.disk)))) {
                let Some(dev) = dev else {
                    if slab == members[w.m] {
                        around.push(slab);
                    }
                    continue;
                };
                // Before anything is read or written for the write.
                self.reserve_one(&dev, slab, w.mo, w.buf.len())?;
                let sums = match w.sums {
                    Some(k) => Some((w.mo, k.to_vec())),
                    None if self.sums().enabled() => Some(self.sums_after_write(&dev, slab, w.mo, w.buf)),
                    None => None,
                };
                targets.push((i, slab, dev, sums));
            }
        }
        Ok((targets, around))
    }

    /// Writes several members of a set at once: each write to its member and, if that member
    /// is being rebuilt, to its replacement slab, with checksums recorded for what was
    /// written. All the disk writes are in flight together. For each write, whether the
    /// member itself took it, or why not (its disk not available, or the disk's error).
    ///
    /// First the space of every write is reserved on its disk: if a disk's file system is
    /// full, nothing is written and the pool's out-of-space error is returned, so that the
    /// copies (or a row's data and parity) never differ for want of space, and no disk is
    /// failed for it.
    pub(crate) fn write_members(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        writes: &[MemberWrite<'_>],
    ) -> Result<Vec<Result<(), MemberFault>>> {
        let repl = *set.replacement.read();
        // Every slab the write may reach, marked before its disk is looked for and until the
        // disk answered (`Pool::mark_write`).
        let _marks: Vec<_> = writes
            .iter()
            .map(|w| members[w.m])
            .chain(repl.map(|(_, slab)| slab))
            .map(|slab| self.pool.mark_write(slab))
            .collect();
        let mut looks = 0;
        let targets = loop {
            looks += 1;
            let (targets, around) = self.write_targets(members, writes, repl)?;
            if around.is_empty() {
                break targets;
            }
            // Before any disk has a byte of it.
            self.note_missed(set, members)?;
            // Every member gone around is now recorded (its disk away) or failed for good;
            // one whose disk came back since the look (`bring_back_disk`) takes the write:
            // looked at again.
            if around
                .iter()
                .all(|s| self.is_missed(*s) || self.pool.disk_state(s.disk) == DiskState::Failed)
            {
                break targets;
            }
            // Disks come back one command at a time: a few looks settle it.
            if looks == 8 {
                return Err(LayoutError::Io {
                    set: set.id,
                    detail: "its members' disks kept changing while a write looked at them; nothing was written".into(),
                });
            }
        };
        let reqs: Vec<tessera_disk::WriteReq> = targets
            .iter()
            .map(|(i, slab, dev, _)| tessera_disk::WriteReq {
                disk: &**dev,
                buf: writes[*i].buf,
                offset: self.pool.slab_offset(*slab) + writes[*i].mo,
            })
            .collect();
        let results = tessera_disk::write_many(&reqs);
        let mut took: Vec<Result<(), MemberFault>> = writes.iter().map(|_| Err(MemberFault::Unavailable)).collect();
        let mut unrecorded = None;
        for ((i, slab, _, sums), res) in targets.iter().zip(results) {
            match res {
                Err(e) => {
                    let (fault, why) = self.member_write_failed(*slab, &e);
                    unrecorded = unrecorded.or(why);
                    if *slab == members[writes[*i].m] {
                        took[*i] = Err(fault);
                    }
                }
                Ok(()) => {
                    if let Some((lo, sums)) = sums {
                        if let Err(e) = self.sums().record(*slab, *lo, sums) {
                            warn!(disk = slab.disk, error = %e, "cannot record block checksums");
                        }
                    }
                    if *slab == members[writes[*i].m] {
                        took[*i] = Ok(());
                    }
                }
            }
        }
        // Every result handled first (the checksums of what the others took are recorded).
        if let Some(why) = unrecorded {
            return Err(LayoutError::Io {
                set: set.id,
                detail: format!("a member's disk failed the write, and its failure could not be recorded: {why}"),
            });
        }
        Ok(took)
    }

    pub(crate) fn too_many(&self, set: &SlabSet, members: &[SlabRef]) -> LayoutError {
        LayoutError::TooManyFailures {
            set: set.id,
            unavailable: self.unavailable(members),
            width: set.spec.width(),
            tolerance: set.spec.tolerance(),
        }
    }
}

/// Records with their slab sets, as members that missed writes, the slabs that I/O errors
/// may have left stale on the disks they took out (`Pool::stale_slabs`, of the disks `which`
/// picks), then, with `forget`, lets the pool forget its lists (without, the save that takes
/// the disk back clears its list). Their disks are away meanwhile (or the pool is being
/// opened): nothing reads or writes those slabs.
/// `recorded` is told of each set's, under the set's records (`Registry::add_missed`).
///
/// A set without redundancy (simple) has no other member to resync its stale member from,
/// and a mirror whose other copies all lack writes too has none that could: recorded, the
/// member would stay unreadable for good. It is taken back as the disk holds it instead
/// (`taken_as_held`), as a power cut of that disk alone would leave it: every write to it
/// since the disk's last successful flush was answered with an error or followed by a flush
/// that failed (`lost_since`), so none was promised durable, and with block checksums a block
/// that did not reach the medium, or reached it torn, does not match the checksum of what
/// was written and is reported unreadable rather than returned.
///
/// Returns the members taken as the disk holds them, with their sets.
fn record_stale_slabs(
    pool: &Pool,
    registry: &Registry,
    which: impl Fn(u32) -> bool,
    forget: bool,
    recorded: impl Fn(&[SlabRef]),
) -> Result<Vec<(u32, SlabRef)>> {
    let mut held = Vec::new();
    for (disk, slabs) in pool.stale_slabs() {
        if !which(disk) {
            continue;
        }
        let stale: HashSet<SlabRef> = slabs.iter().map(|&slab| SlabRef { disk, slab }).collect();
        let (mut resynced, held_before) = (0, held.len());
        for set in registry.all() {
            let here: Vec<SlabRef> = {
                let members = set.members.read();
                let missed = set.missed.lock();
                // Stale on its own disk (not recorded with the set yet), or missed writes.
                let lacks = |s: SlabRef| missed.contains(&s) || pool.is_stale(s);
                (0..members.len())
                    .filter(|&m| {
                        stale.contains(&members[m])
                            && !missed.contains(&members[m])
                            && taken_as_held(&set.spec, &members, m, lacks, |s| pool.last_flush(s.disk))
                    })
                    .map(|m| members[m])
                    .collect()
            };
            held.extend(here.iter().map(|&s| (set.id, s)));
            resynced += registry
                .add_missed(pool, set.id, |s| stale.contains(s) && !here.contains(s), &recorded)?
                .len();
        }
        let as_held = held.len() - held_before;
        info!(pool = %pool.name(), disk, slabs = slabs.len(), resynced, as_held, "slabs written since the last flush of a disk an I/O error took out: those another member can resync are stale until resynced, the others are taken as the disk holds them");
        if forget {
            pool.forget_stale_slabs(disk)?;
        }
    }
    Ok(held)
}

/// Records with their sets the members `held` taken as their disk holds them, so that a
/// restart still knows their checksum mismatches are not rot (`count_against_disk`). A
/// failure is said and left: the members stay taken as held while the pool runs, and only
/// the counting after a restart is lost.
fn record_held(pool: &Pool, registry: &Registry, held: &[(u32, SlabRef)]) {
    let mut by_set: BTreeMap<u32, Vec<SlabRef>> = BTreeMap::new();
    for &(set, slab) in held {
        by_set.entry(set).or_default().push(slab);
    }
    for (set, slabs) in by_set {
        if let Err(e) = registry.add_held(pool, set, &slabs) {
            warn!(pool = %pool.name(), set, error = %e, "cannot record the members taken as their disk holds them; after a restart, their blocks the disk's cache lost count against it as checksum errors");
        }
    }
}

/// Whether member `m` of a set, which an I/O error may have left stale (written since its
/// disk's last successful flush), is taken back as its disk holds it rather than resynced:
/// no other member can hold in its place what a flush vouched for. A set without redundancy
/// has no other member. In a mirror, every other copy of its column must
/// - lack writes itself (`lacks`: missed while its disk was away, or stale after an error
///   of its own), or it holds more and the copy is resynced from it; and
/// - have flushed last, before its disk went away, no later than this copy's disk did
///   (`Pool::last_flush`, known for each). What this copy may lack was written after its
///   disk's last successful flush round began; a flush that vouched for it was a later
///   round, which another copy came through while it was written, and whose last flush
///   before it went away is then later. None did, so nothing this copy lacks was promised
///   durable (copies whose last flush was the same round lack the same writes).
///
/// What its disk's cache lost is then refused by the block checksums, or read as the disk
/// holds it, as after a power cut of that disk.
/// A parity set's stale member is always recorded to be resynced: taken as held, a block
/// its disk's cache lost would enter every rebuild of its stripe, and turn another member's
/// flushed data, rebuilt from it, into something nobody wrote.
fn taken_as_held(
    spec: &LayoutSpec,
    members: &[SlabRef],
    m: usize,
    lacks: impl Fn(SlabRef) -> bool,
    last_flush: impl Fn(SlabRef) -> Option<(u64, u64)>,
) -> bool {
    match spec.kind {
        _ if spec.tolerance() == 0 => true,
        LayoutKind::Mirror => {
            let Some(mine) = last_flush(members[m]) else {
                return false;
            };
            crate::geometry::data_members(spec, 0, m % spec.columns as usize)
                .into_iter()
                .filter(|&c| c != m)
                .all(|c| lacks(members[c]) && last_flush(members[c]).is_some_and(|theirs| theirs <= mine))
        }
        _ => false,
    }
}

/// Whether a member that missed writes sits on a disk that is open: read as current by a
/// daemon that does not know the record, so the labels must say so.
fn stale_present(pool: &Pool, missed: &HashSet<SlabRef>) -> bool {
    missed.iter().any(|s| pool.is_present(s.disk))
}

/// Whether a set of `width` members, of which `gone` says which are unavailable, has lost
/// more than its layout tolerates (`Layouts::beyond_tolerance`).
fn loses_more_than_tolerated(spec: &LayoutSpec, width: usize, gone: impl Fn(usize) -> bool) -> bool {
    match spec.kind {
        LayoutKind::Mirror => {
            (0..spec.columns as usize).any(|d| crate::geometry::data_members(spec, 0, d).into_iter().all(&gone))
        }
        _ => (0..width).filter(|&m| gone(m)).count() > spec.tolerance(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: LayoutKind, copies: u8, columns: u32) -> LayoutSpec {
        LayoutSpec {
            kind,
            copies,
            columns,
            interleave: 64 << 10,
        }
    }

    fn members(n: u32) -> Vec<SlabRef> {
        (0..n).map(|disk| SlabRef { disk, slab: 7 }).collect()
    }

    /// Whether member `m` is taken as held, with `lacking` the disks whose members lack
    /// writes and `flushed` each disk's last flush (None: not known).
    fn held(spec: &LayoutSpec, m: usize, lacking: &[u32], flushed: &[Option<(u64, u64)>]) -> bool {
        let members = members(spec.width() as u32);
        taken_as_held(
            spec,
            &members,
            m,
            |s| lacking.contains(&s.disk),
            |s| flushed[s.disk as usize],
        )
    }

    #[test]
    fn a_member_with_nothing_to_resync_it_from_is_taken_as_held() {
        // Without redundancy: always.
        assert!(held(&spec(LayoutKind::Simple, 1, 2), 1, &[], &[None, None]));
        let two_way = spec(LayoutKind::Mirror, 2, 1);
        let same_round = [Some((3, 10)), Some((3, 10))];
        // The other copy lacks writes too, and flushed last in the same round, or before.
        assert!(held(&two_way, 0, &[1], &same_round));
        assert!(held(&two_way, 0, &[1], &[Some((3, 10)), Some((3, 9))]));
        assert!(held(&two_way, 0, &[1], &[Some((3, 1)), Some((2, u64::MAX))]));
        // It holds more: resynced from it.
        assert!(!held(&two_way, 0, &[], &same_round));
        // It flushed after this copy's disk went: it may have vouched for what this one lacks.
        assert!(!held(&two_way, 0, &[1], &[Some((3, 10)), Some((3, 11))]));
        assert!(!held(&two_way, 0, &[1], &[Some((3, 10)), Some((4, 0))]));
        // Not known when either flushed last.
        assert!(!held(&two_way, 0, &[1], &[None, Some((3, 10))]));
        assert!(!held(&two_way, 0, &[1], &[Some((3, 10)), None]));
    }

    #[test]
    fn a_mirror_asks_every_other_copy_of_its_column_and_no_other() {
        let f = [Some((1, 5)); 6];
        // Three copies: both others must lack writes.
        let three_way = spec(LayoutKind::Mirror, 3, 1);
        assert!(held(&three_way, 2, &[0, 1], &f));
        assert!(!held(&three_way, 2, &[0], &f));
        // Two columns of two copies: members 0 and 2 hold column 0, 1 and 3 column 1.
        let striped = spec(LayoutKind::Mirror, 2, 2);
        assert!(held(&striped, 0, &[2], &f[..4]));
        assert!(
            !held(&striped, 0, &[1, 3], &f[..4]),
            "the other column's copies are not its own"
        );
        assert!(held(&striped, 3, &[1], &f[..4]));
    }

    #[test]
    fn a_parity_member_is_never_taken_as_held() {
        let f = [Some((1, 5)); 4];
        assert!(!held(&spec(LayoutKind::Parity, 1, 3), 0, &[1, 2], &f[..3]));
        assert!(!held(&spec(LayoutKind::DualParity, 1, 4), 0, &[1, 2, 3], &f));
    }
}
