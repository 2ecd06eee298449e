//! Post-process deduplication: a run reads the grains of the vdisks in scope that have not
//! been written for the minimum age, fingerprints them, and points each grain whose data a
//! slot of its class already holds at that slot, giving its own back. Identical data is then
//! "two grain entries pointing at the same slot", as after a clone: reads are unchanged, a
//! write copies on write, deletes and trims drop references, and `check`, scrub and the scan
//! cover it with nothing added. Grains of zeros are unmapped.
//!
//! Safety of the sharing itself:
//! - A fingerprint only finds a candidate. A grain points somewhere new, under its lock,
//!   only once both hold the same bytes: their whole 256-bit BLAKE3 hashes are equal and
//!   neither slot can have changed since it was hashed (below), or else the bytes of both
//!   slots were read again and compared. A collision, or an index entry left stale by a
//!   later write, is never shared.
//! - "Cannot have changed" is the vdisks' change counts (`change_count`): a batch's own
//!   grains when no change of their vdisk entered between the read that hashed them and the
//!   locks (and none was under way at that read); a candidate when the index entry was
//!   vouched for that way, the grain it names still points at the slot, and its vdisk has
//!   admitted no change since. Anything else is read and compared, as with a test
//!   fingerprinter that forces collisions.
//! - Nothing may overwrite the candidate slot between the compare and the commit. A slot is
//!   overwritten in place only while it has one reference, by a writer holding the lock of the
//!   grain that points at it. So the candidate is held by a reference taken first: under the
//!   lock of the grain the index names, when that grain still points at it, or only if the
//!   slot is shared already (`incref_if_shared`); otherwise it is not used.
//! - The batch that remaps grains is one metadata commit, which flushes the member disks
//!   first: a grain never durably points at a slot whose data is not durable.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
// A run's maps are keyed by fingerprints (uniform already) and by grain and slot numbers:
// FxHash costs a fraction of SipHash (2 % of a file-server run), and what keys crafted to
// collide could cost is bounded by a batch's size.
use rustc_hash::{FxHashMap, FxHashSet};
use tessera_dedup::{
    class_tag, Compression, DedupMode, DedupSettings, DedupStatus, FingerprintIndex, Fingerprinter, GcReport, HashTail,
    IndexEntry, IndexKey, PassOptions, PassReport, VdiskSavings, Vouch,
};
use tessera_disk::{AlignedBuf, Pace};
use tessera_layout::{LayoutError, Progress, SetRead, SlabSet};
use tessera_pool::{MetaBatch, MetaStore, CF_GRAINS, CF_POOL};
use tracing::{info, warn};

use crate::change_count::Mark;
use crate::commit::Op;
use crate::config::Provisioning;
use crate::engine::Engine;
use crate::error::{Result, VolumeError};
use crate::keys::{grain_key, loc_value};
use crate::packed::{lay_out, lay_out_end_to_end, read_grains_each, MAX_PACKED_GRAIN};
use crate::space::{is_packed, loc_parts, packed_loc, piece_of, slot_of, slots_of, Class, Loc};
use crate::vdisk::Vdisk;
use crate::write_clock::{now_secs, REGION};

/// Where a pool's dedup settings are kept (in its own column family).
const SETTINGS_KEY: &[u8] = b"dedup";
/// A batch's plain grains are read in runs of at most this many bytes.
const MAX_RUN_BYTES: u64 = 1 << 20;
/// Threads that fingerprint and compress batches in a throughput run, each one batch at a
/// time (fingerprints and compression are the CPU of a run): one per core, as a run asked
/// for at full speed should use the machine, and four at most, as each holds a 16 MiB batch
/// and the one thread that shares and commits would soon be what the others wait for. A
/// background run takes one, to stay out of the way of the vdisks' I/O.
const MAX_HASHERS: usize = 4;

/// How many threads fingerprint and compress in a run of this mode.
fn hashers(mode: DedupMode) -> usize {
    match mode {
        DedupMode::Background => 1,
        DedupMode::Throughput => std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, MAX_HASHERS),
    }
}
/// Bytes of a vdisk a run reads, fingerprints and remaps at a time, holding the locks of
/// those grains (and of the grains their candidates belong to) only for the compare and the
/// commit. Each batch that shares anything is one metadata commit, with its flush of the
/// member disks: larger batches make fewer of them.
const BATCH_BYTES: u64 = 16 << 20;
/// A grain is kept compressed only if that saves at least 1/MIN_SAVING of it: a grain that
/// barely compresses would cost every read a decompression for next to nothing.
const MIN_SAVING: usize = 8;

/// A pool's dedup settings, its index, and the run under way.
pub(crate) struct DedupState {
    settings: RwLock<DedupSettings>,
    /// Why the settings record could not be read at import, until settings are written.
    settings_unreadable: RwLock<Option<String>>,
    index: FingerprintIndex,
    fingerprinter: RwLock<Fingerprinter>,
    running: Mutex<()>,
    last_run: Mutex<Option<PassReport>>,
}

impl DedupState {
    /// The pool's settings as recorded. A record that cannot be read does not stop the
    /// import: it holds a policy, not data, and every vdisk reads the same without it. The
    /// pool runs with dedup off (nothing is shared anew, no run is scheduled), and says why,
    /// until settings are written again.
    pub fn load(meta: &Arc<MetaStore>) -> Result<DedupState> {
        let (settings, unreadable) = match meta.get(CF_POOL, SETTINGS_KEY)? {
            Some(v) => match serde_json::from_slice(&v) {
                Ok(s) => (s, None),
                Err(e) => {
                    let why = format!(
                        "the pool's dedup settings record cannot be read ({e}): dedup is off until \
                         `tessera dedup enable` or `disable` writes it again"
                    );
                    tracing::error!(store = %meta.location(), "{why}");
                    (DedupSettings::default(), Some(why))
                }
            },
            None => (DedupSettings::default(), None),
        };
        Ok(DedupState {
            settings: RwLock::new(settings),
            settings_unreadable: RwLock::new(unreadable),
            index: FingerprintIndex::new(meta.clone()),
            fingerprinter: RwLock::new(Fingerprinter::Blake3),
            running: Mutex::new(()),
            last_run: Mutex::new(None),
        })
    }
}

/// The tag of a class in the index.
fn tag(c: Class) -> u32 {
    class_tag(&format!(
        "{}/{}",
        serde_json::to_string(&c.layout).expect("serializable"),
        c.grain
    ))
}

/// One mapped grain of a batch, as read before the locks were taken: its index key (none
/// for zeros) and the rest of its 256-bit hash.
struct Seen {
    grain: u64,
    loc: Loc,
    key: Option<IndexKey>,
    tail: Option<HashTail>,
}

/// What a batch decided for a grain, under the locks.
enum Plan {
    /// Point the grain at `to` (a reference on it is held).
    Share {
        grain: u64,
        from: Loc,
        to: Loc,
    },
    Unmap {
        grain: u64,
        from: Loc,
    },
    /// Point the grain at its compressed form, in a pack slot written for this batch.
    Pack {
        grain: u64,
        from: Loc,
        to: Loc,
    },
}

impl Engine {
    pub fn dedup_settings(&self) -> DedupSettings {
        self.dedup.settings.read().clone()
    }

    /// Replaces the pool's dedup settings. Named vdisks must exist and be thin vdisks, not
    /// snapshots: a fixed vdisk keeps a slot for every grain, which sharing would give away.
    pub fn set_dedup_settings(&self, s: DedupSettings) -> Result<()> {
        for name in &s.vdisks {
            let v = self.vdisk(name)?;
            if v.is_snapshot() {
                return Err(VolumeError::Invalid(format!(
                    "'{name}' is a snapshot: it shares its grains with its vdisk already, and is never changed"
                )));
            }
            if v.config().provisioning == Provisioning::Fixed {
                return Err(VolumeError::Invalid(format!(
                    "'{name}' is fixed: it keeps a slot for each of its grains, which sharing would give away; \
                     clone it to a thin vdisk to deduplicate it"
                )));
            }
        }
        let meta = self.pool().meta();
        let mut b = MetaBatch::new();
        b.put(CF_POOL, SETTINGS_KEY, serde_json::to_vec(&s).expect("serializable"));
        meta.commit(b, true)?;
        info!(pool = %self.pool().name(), enabled = s.enabled, "dedup settings changed");
        *self.dedup.settings.write() = s;
        *self.dedup.settings_unreadable.write() = None;
        Ok(())
    }

    /// Why the pool's dedup settings record could not be read at import, until settings
    /// are written again.
    pub fn dedup_settings_unreadable(&self) -> Option<String> {
        self.dedup.settings_unreadable.read().clone()
    }

    /// The grain size a new vdisk gets when none is asked for: 4 KiB when dedup covers it,
    /// since file systems and databases write 4 KiB blocks at any 4 KiB-aligned place, and
    /// 64 KiB grains would miss most of their duplicates.
    pub(crate) fn default_grain_for(&self, name: &str) -> Option<u64> {
        self.dedup.settings.read().covers(name).then_some(4096)
    }

    /// Fingerprints made another way (tests force collisions with a weak one).
    pub fn set_fingerprinter(&self, f: Fingerprinter) {
        *self.dedup.fingerprinter.write() = f;
    }

    /// The vdisks a run works on: in scope, thin, not snapshots.
    fn dedup_scope(&self, s: &DedupSettings) -> Vec<Arc<Vdisk>> {
        self.vdisks()
            .into_iter()
            .filter(|v| !v.is_snapshot() && !v.fixed() && s.covers(&v.name()))
            .collect()
    }

    /// One optimization run over the vdisks in scope. `progress` counts the mapped bytes of
    /// those vdisks; setting its cancel flag stops the run after the batch under way (what
    /// was done stays done).
    pub fn dedup_run(&self, opts: &PassOptions, progress: &Progress) -> Result<PassReport> {
        let _one = self.dedup.running.try_lock().ok_or_else(|| {
            VolumeError::Invalid(format!("a dedup run of pool '{}' is under way", self.pool().name()))
        })?;
        let settings = self.dedup_settings();
        if !settings.enabled {
            return Err(VolumeError::Invalid(format!(
                "dedup is not enabled on pool '{}' (tessera dedup enable {})",
                self.pool().name(),
                self.pool().name()
            )));
        }
        let started = Instant::now();
        let now = now_secs();
        let cutoff = if opts.ignore_min_age {
            now
        } else {
            now.saturating_sub(settings.min_age_secs.min(u32::MAX as u64) as u32)
        };
        let vdisks = self.dedup_scope(&settings);
        progress
            .total_bytes
            .store(vdisks.iter().map(|v| v.allocated_bytes()).sum(), Ordering::Relaxed);
        let mut report = PassReport {
            mode: opts.mode,
            vdisks: vdisks.len() as u64,
            ..Default::default()
        };
        let pace = Pace::new(Some(opts.rate(&settings)));
        let owners: FxHashMap<u64, Arc<Vdisk>> = self.vdisks().into_iter().map(|v| (v.id, v)).collect();
        let hashers = hashers(opts.mode);
        for v in &vdisks {
            self.optimize(
                v,
                cutoff,
                &owners,
                settings.compression,
                hashers,
                &pace,
                &mut report,
                progress,
            )?;
        }
        let hot = self.keep_hot_copies()?;
        report.hot_copies_made = hot.made;
        report.hot_copies_dropped = hot.dropped;
        report.sets_freed = self.shared().space.reclaim_empty()? as u64;
        report.seconds = started.elapsed().as_secs_f64();
        report.mb_per_s = report.bytes_scanned as f64 / 1e6 / report.seconds.max(1e-9);
        info!(
            pool = %self.pool().name(),
            scanned = report.bytes_scanned,
            shared = report.grains_shared,
            zeros = report.zero_grains_unmapped,
            mismatches = report.mismatches,
            "dedup run finished"
        );
        *self.dedup.last_run.lock() = Some(report.clone());
        Ok(report)
    }

    pub(crate) fn dedup_last_run(&self) -> Option<PassReport> {
        self.dedup.last_run.lock().clone()
    }

    /// Optimizes the regions of `v` written since a run last read them, and not after
    /// `cutoff`. Four stages overlap, so that neither the disks nor the cores wait for
    /// another stage: one thread reads batches; `hashers` threads each fingerprint a batch,
    /// look its fingerprints up and compress what looks new (each keeping its compression
    /// context from batch to batch); this one shares, packs and commits them (under their
    /// locks, with the commit's flush), in the order they come ready; one more puts the
    /// entries each batch adds into the index (the index is advisory: a crash that loses
    /// some loses only their finding; until they are in, `Recent` supplies them).
    #[allow(clippy::too_many_arguments)]
    fn optimize(
        &self,
        v: &Arc<Vdisk>,
        cutoff: u32,
        owners: &FxHashMap<u64, Arc<Vdisk>>,
        compression: Compression,
        hashers: usize,
        pace: &Pace,
        report: &mut PassReport,
        progress: &Progress,
    ) -> Result<()> {
        let stop = AtomicBool::new(false);
        // A batch waits between stages, at most: its regions are taken from the write clock,
        // and a failure gives back those of every batch not committed.
        let (read_tx, read_rx) = sync_channel::<Result<Prepared>>(1);
        let read_rx = Mutex::new(read_rx);
        let recent = Recent::default();
        // Buffers kept at most: as many as there are batches between stages.
        let spare = Spare::keeping(hashers + 3);
        std::thread::scope(|scope| {
            let (ready_tx, rx) = sync_channel::<Result<Prepared>>(1);
            let (index_tx, index_rx) = sync_channel::<(Vec<(IndexKey, IndexEntry)>, Vec<u64>)>(2);
            let (stop, spare, recent) = (&stop, &spare, &recent);
            // A batch whose entries cannot be put is read again by the next run.
            let indexer = scope.spawn(move || {
                let mut failed: Option<VolumeError> = None;
                for (entries, taken) in index_rx {
                    if failed.is_none() {
                        match self.dedup.index.put_many(&entries) {
                            Ok(()) => {
                                recent.indexed_one();
                                continue;
                            }
                            Err(e) => failed = Some(e.into()),
                        }
                    }
                    give_back(v, &taken);
                }
                failed.map_or(Ok(()), Err)
            });
            scope.spawn(move || {
                for batch in self.batches(v, cutoff, pace, progress, stop, spare) {
                    if let Err(back) = read_tx.send(batch) {
                        if let Ok(p) = back.0 {
                            p.give_back(v);
                        }
                        return;
                    }
                }
            });
            for _ in 0..hashers {
                let (read_rx, ready_tx) = (&read_rx, ready_tx.clone());
                scope.spawn(move || loop {
                    let Ok(batch) = read_rx.lock().recv() else {
                        return;
                    };
                    let batch = batch.and_then(|mut p| match self.hash_batch(v, &mut p, compression, recent) {
                        Ok(()) => Ok(p),
                        Err(e) => {
                            p.give_back(v);
                            Err(e)
                        }
                    });
                    if let Err(back) = ready_tx.send(batch) {
                        if let Ok(p) = back.0 {
                            p.give_back(v);
                        }
                        // Drain the reader, giving back what it read.
                        while let Ok(batch) = read_rx.lock().recv() {
                            if let Ok(p) = batch {
                                p.give_back(v);
                            }
                        }
                        return;
                    }
                });
            }
            drop(ready_tx);
            let mut failed: Option<VolumeError> = None;
            for batch in rx.iter() {
                if failed.is_some() {
                    if let Ok(p) = batch {
                        p.give_back(v);
                    }
                    continue;
                }
                let outcome = match batch {
                    Err(e) => Err(e),
                    Ok(mut p) => {
                        let (taken, mapped) = (p.taken.clone(), p.mapped);
                        let data = p.data.take();
                        report.grains_too_young += p.too_young;
                        report.grains_unreadable += p.unreadable;
                        let r = match &data {
                            Some(data) if !p.seen.is_empty() => {
                                self.settle_batch(v, p, data, owners, recent, report).map(|inserts| {
                                    recent.add(inserts.clone());
                                    // The indexer never stops taking while this stage sends.
                                    let _ = index_tx.send((inserts, taken.clone()));
                                })
                            }
                            _ => Ok(()),
                        };
                        if let Some(data) = data {
                            spare.give(data);
                        }
                        if r.is_ok() {
                            progress.done_bytes.fetch_add(mapped * v.class.grain, Ordering::Relaxed);
                        } else if !matches!(r, Err(VolumeError::Deleted(_))) {
                            give_back(v, &taken);
                        }
                        r
                    }
                };
                match outcome {
                    Ok(()) => {}
                    // Deleted meanwhile: nothing of it is left to optimize.
                    Err(VolumeError::Deleted(_)) => {
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        failed = Some(e);
                    }
                }
            }
            drop(index_tx);
            let indexed = indexer.join().expect("the indexing thread does not panic");
            failed.map_or(indexed, Err)
        })
    }

    /// The batches of `v` to optimize, each read; ends at the first error (a cancel is
    /// `Cancelled`), when `v` is deleted, or when `stop` is set.
    fn batches<'a>(
        &'a self,
        v: &'a Arc<Vdisk>,
        cutoff: u32,
        pace: &'a Pace,
        progress: &'a Progress,
        stop: &'a AtomicBool,
        spare: &'a Spare,
    ) -> impl Iterator<Item = Result<Prepared>> + 'a {
        let grain = v.class.grain;
        let per_batch = (BATCH_BYTES / grain).max(1);
        // Whole grains only: a partial last grain is left as it is.
        let grains = v.size() / grain;
        let mut first = 0;
        let mut done = false;
        std::iter::from_fn(move || {
            if done || first >= grains || stop.load(Ordering::Relaxed) || v.deleted.load(Ordering::Acquire) {
                return None;
            }
            if progress.cancel.load(Ordering::Relaxed) {
                done = true;
                return Some(Err(VolumeError::Layout(LayoutError::Cancelled)));
            }
            let end = (first + per_batch).min(grains);
            let mut p = Prepared {
                first,
                end,
                ..Default::default()
            };
            for g in first..end {
                let l = v.entry(g);
                if l == 0 {
                    continue;
                }
                p.mapped += 1;
                let (written, dirty) = v.clock.state(g * grain);
                if !dirty {
                    continue; // read by an earlier run, not written since
                }
                if written > cutoff {
                    p.too_young += 1;
                    continue;
                }
                let region = g * grain / REGION;
                if p.taken.last() != Some(&region) {
                    p.taken.push(region);
                }
                p.seen.push(Seen {
                    grain: g,
                    loc: l,
                    key: None,
                    tail: None,
                });
            }
            // Before the read: a write after this marks the region again for the next run.
            for &r in &p.taken {
                v.clock.take(r * REGION);
            }
            first = end;
            if !p.seen.is_empty() {
                // The batch's turn at the run's rate, before its read. A cancel or a stop
                // while waiting ends the run as one before the batch would, with its regions
                // given back.
                let cancelled = || progress.cancel.load(Ordering::Relaxed);
                let go_on = || match cancelled() || stop.load(Ordering::Relaxed) {
                    true => Err(()),
                    false => Ok(()),
                };
                if pace.take(p.seen.len() as u64 * grain, go_on).is_err() {
                    p.give_back(v);
                    done = true;
                    return cancelled().then_some(Err(VolumeError::Layout(LayoutError::Cancelled)));
                }
                if let Err(e) = self.read_batch(v, &mut p, spare) {
                    p.give_back(v);
                    done = true;
                    return Some(Err(e));
                }
            }
            Some(Ok(p))
        })
    }

    /// Reads the mapped grains of a batch (those in `p.seen`).
    fn read_batch(&self, v: &Arc<Vdisk>, p: &mut Prepared, spare: &Spare) -> Result<()> {
        let s = self.shared();
        let grain = v.class.grain;
        let g = grain as usize;
        let first = p.first;
        // Every grain kept in `p.seen` is read into its part below; no stage reads another.
        let mut data = spare.take(((p.end - first) * grain) as usize);
        // Before the read: if no change of the vdisk enters from now until the batch's locks
        // are taken, what is read is what its slots hold then.
        p.mark = v.changes.quiet();
        {
            // As a read does: under the grains' locks, so that no slot read is freed and
            // taken for other data meanwhile.
            let _locks = s.locks.read_many(p.seen.iter().map(|it| (v.id, it.grain)));
            for it in &mut p.seen {
                it.loc = v.entry(it.grain);
            }
            p.seen.retain(|it| it.loc != 0);
            // Plain grains straight into the batch's buffer, neighbouring grains in
            // neighbouring slots as one read; compressed ones through their packs.
            let mut runs: Vec<(Arc<SlabSet>, u64, Range<u64>)> = Vec::new(); // set, offset, grains
            let mut packed: Vec<&Seen> = Vec::new();
            for it in &p.seen {
                if is_packed(it.loc) {
                    packed.push(it);
                    continue;
                }
                let (set, off) = s.space.locate(it.loc)?;
                match runs.last_mut() {
                    Some((rs, ro, gr))
                        if Arc::ptr_eq(rs, &set)
                            && gr.end == it.grain
                            && *ro + (gr.end - gr.start) * grain == off
                            && (gr.end - gr.start + 1) * grain <= MAX_RUN_BYTES =>
                    {
                        gr.end += 1
                    }
                    _ => runs.push((set, off, it.grain..it.grain + 1)),
                }
            }
            // A grain that cannot be read (every copy failing) is left as it is, counted and
            // logged, and its region marked for the next run: one bad grain does not stop the
            // run, nor every later run at the same place.
            let mut unreadable: Vec<(u64, String)> = Vec::new();
            let failed_runs: Vec<Range<u64>> = {
                let mut io: Vec<SetRead> = Vec::with_capacity(runs.len());
                let mut rest: &mut [u8] = &mut data[..];
                let mut at = first;
                for (set, off, gr) in &runs {
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(((gr.start - at) * grain) as usize);
                    let (buf, tail) = tail.split_at_mut(((gr.end - gr.start) * grain) as usize);
                    rest = tail;
                    at = gr.end;
                    io.push(SetRead { set, offset: *off, buf });
                }
                let results = s.cache.read_many(&mut io);
                runs.iter()
                    .zip(results)
                    .filter(|(_, r)| r.is_err())
                    .map(|((_, _, gr), _)| gr.clone())
                    .collect()
            };
            // A run that failed is read again grain by grain, so that only the grains that
            // fail are left out.
            let mut each: Vec<&Seen> = packed;
            each.extend(
                p.seen
                    .iter()
                    .filter(|it| failed_runs.iter().any(|gr| gr.contains(&it.grain))),
            );
            if !each.is_empty() {
                let locs: Vec<Loc> = each.iter().map(|it| it.loc).collect();
                let (read, results) = read_grains_each(s, &locs, g);
                for (k, (it, r)) in each.iter().zip(results).enumerate() {
                    match r {
                        Ok(()) => {
                            let at = ((it.grain - first) * grain) as usize;
                            data[at..at + g].copy_from_slice(&read[k * g..(k + 1) * g]);
                        }
                        Err(e) => unreadable.push((it.grain, e.to_string())),
                    }
                }
            }
            if let Some((grain_at, why)) = unreadable.first() {
                warn!(
                    vdisk = %v.name(),
                    grains = unreadable.len(),
                    first = grain_at * grain,
                    error = %why,
                    "grains that cannot be read are left as they are by this optimization run"
                );
                let bad: FxHashSet<u64> = unreadable.iter().map(|(g, _)| *g).collect();
                p.seen.retain(|it| !bad.contains(&it.grain));
                let regions: FxHashSet<u64> = bad.iter().map(|g| g * grain / REGION).collect();
                give_back(v, &regions.into_iter().collect::<Vec<_>>());
                p.unreadable += bad.len() as u64;
            }
        }
        p.data = Some(data);
        Ok(())
    }

    /// Fingerprints the grains a batch read, looks them up in the index, and makes the
    /// compressed forms of those that look new: no index entry yet (what batches settled
    /// meanwhile add is known when this one is settled), first of their content in the
    /// batch, and not compressed already.
    fn hash_batch(&self, v: &Arc<Vdisk>, p: &mut Prepared, compression: Compression, recent: &Recent) -> Result<()> {
        let Some(data) = p.data.as_ref() else {
            return Ok(());
        };
        let grain = v.class.grain;
        let g = grain as usize;
        let first = p.first;
        let class = tag(v.class);
        let fp = *self.dedup.fingerprinter.read();
        for it in &mut p.seen {
            let at = ((it.grain - first) * grain) as usize;
            let bytes = &data[at..at + g];
            if bytes.iter().any(|&b| b != 0) {
                let (f, tail) = fp.hash(bytes);
                it.key = Some(tessera_dedup::index_key(class, &f));
                it.tail = tail;
            }
        }
        // Whatever is not in the index yet is added to these when this one is settled.
        p.looked_up_after = recent.indexed();
        let keys: Vec<IndexKey> = p.seen.iter().filter_map(|it| it.key).collect();
        p.found = self.dedup.index.found(&keys)?;
        if compression != Compression::Off && grain <= MAX_PACKED_GRAIN {
            let mut firsts = FxHashSet::default();
            for it in &p.seen {
                let new = it
                    .key
                    .is_some_and(|k| !p.found.contains_key(&k) && !is_packed(it.loc) && firsts.insert(k));
                if new {
                    let at = ((it.grain - first) * grain) as usize;
                    p.forms
                        .make(it.grain, compression, &data[at..at + g], g - g / MIN_SAVING);
                }
            }
        }
        Ok(())
    }

    /// Shares or unmaps the grains of a prepared batch that it can, and packs the compressed
    /// forms of those it finds no duplicate for, under the locks of the batch's grains and of
    /// the grains their candidates belong to. Gives the index entries it adds, for the index.
    fn settle_batch(
        &self,
        v: &Arc<Vdisk>,
        p: Prepared,
        data: &[u8],
        owners: &FxHashMap<u64, Arc<Vdisk>>,
        recent: &Recent,
        report: &mut PassReport,
    ) -> Result<Vec<(IndexKey, IndexEntry)>> {
        let s = self.shared();
        let grain = v.class.grain;
        let Prepared {
            first,
            mut seen,
            mut forms,
            mark,
            mut found,
            looked_up_after,
            ..
        } = p;
        report.grains_scanned += seen.len() as u64;
        report.bytes_scanned += seen.len() as u64 * grain;
        let keys: FxHashSet<IndexKey> = seen.iter().filter_map(|it| it.key).collect();
        if !recent.added_since(looked_up_after, &keys, &mut found) {
            let after = recent.indexed();
            let listed: Vec<IndexKey> = keys.iter().copied().collect();
            found = self.dedup.index.found(&listed)?;
            recent.added_since(after, &keys, &mut found);
        }
        // A grain a batch settled since it was looked up made findable is shared, not packed.
        for it in &seen {
            if it.key.is_some_and(|k| found.contains_key(&k)) {
                forms.remove(it.grain);
            }
        }

        let _gate = v.enter_unchanged()?;
        let mut held: Vec<(u64, u64)> = seen.iter().map(|it| (v.id, it.grain)).collect();
        held.extend(found.values().map(|e| (e.vdisk, e.grain)));
        let held_set: FxHashSet<(u64, u64)> = held.iter().copied().collect();
        let _locks = s.locks.lock_many(held);
        // Grains changed since they were read are left for the next run.
        seen.retain(|it| v.entry(it.grain) == it.loc);
        // The batch's slots still hold what was read: nothing changed the vdisk since.
        let unchanged = mark.filter(|&m| v.changes.unchanged_since(m));
        // Candidates we may hold: the grain the index names still points at the slot and is
        // locked here, or the slot is shared already. One reference each, taken now. The
        // hash tail of a candidate whose entry's vouch still holds comes along.
        let mut refs: FxHashMap<Loc, u32> = FxHashMap::default();
        let mut usable: FxHashMap<IndexKey, (Loc, Option<HashTail>)> = FxHashMap::default();
        for (k, e) in &found {
            if s.space.class_of(e.loc) != Some(v.class) {
                continue;
            }
            let owner = owners
                .get(&e.vdisk)
                .filter(|o| held_set.contains(&(e.vdisk, e.grain)) && o.entry(e.grain) == e.loc);
            let taken = if owner.is_some() {
                s.space.incref(e.loc);
                true
            } else {
                s.space.incref_if_shared(e.loc)
            };
            if taken {
                *refs.entry(e.loc).or_default() += 1;
                let vouched = match (owner, e.vouch) {
                    (Some(o), Some(w))
                        if o.changes.unchanged_since(Mark {
                            epoch: w.epoch,
                            changes: w.changes,
                        }) =>
                    {
                        Some(w.tail)
                    }
                    _ => None,
                };
                usable.insert(*k, (e.loc, vouched));
            }
        }
        let batch = Batch {
            v,
            first,
            data,
            forms: &forms,
            unchanged,
        };
        let result = self.compare_and_commit(&batch, &seen, &usable, &mut refs, report);
        // References taken and not handed to a grain entry.
        for (l, n) in refs {
            for _ in 0..n {
                s.space.decref(l);
            }
        }
        result
    }

    /// Shares each grain of the batch that holds the same bytes as its candidate (what the
    /// index names, or a grain before it in the batch), unmaps grains of zeros, packs the
    /// compressed forms of grains that still hold what was compressed, and commits all that
    /// as one batch. Bytes are read again under the locks only where they may have changed
    /// since they were hashed (the module's comment says when). A grain with no candidate
    /// and no form is only indexed, unread: the index is advisory. References in `refs`
    /// that a new grain entry takes are removed from it. Gives the index entries to add.
    fn compare_and_commit(
        &self,
        b: &Batch,
        seen: &[Seen],
        usable: &FxHashMap<IndexKey, (Loc, Option<HashTail>)>,
        refs: &mut FxHashMap<Loc, u32>,
        report: &mut PassReport,
    ) -> Result<Vec<(IndexKey, IndexEntry)>> {
        let s = self.shared();
        let v = b.v;
        let g = v.class.grain as usize;
        let known = b.unchanged.is_some();
        let prepared = |it: &Seen| -> &[u8] {
            let at = ((it.grain - b.first) as usize) * g;
            &b.data[at..at + g]
        };
        // Each grain's candidate: what the index names, or the first grain before it in this
        // batch with the same fingerprint (locked here too). The slots to read are those
        // grains, their candidates and the grains to pack, once each, unless their bytes are
        // known: a batch's own when nothing changed its vdisk, a candidate whose entry's vouch
        // holds when its whole hash is this grain's.
        let mut slots: Vec<Loc> = Vec::new();
        let mut first_of: FxHashMap<IndexKey, &Seen> = FxHashMap::default();
        let mut candidates: Vec<Option<Candidate>> = Vec::with_capacity(seen.len());
        for it in seen {
            let candidate = it.key.and_then(|k| match usable.get(&k) {
                Some(&(loc, vouched)) => Some(Candidate {
                    loc,
                    earlier: None,
                    vouched: known && vouched.is_some() && vouched == it.tail,
                }),
                None => first_of.get(&k).map(|e| Candidate {
                    loc: e.loc,
                    earlier: Some(e),
                    vouched: false,
                }),
            });
            let needed = match (it.key, &candidate) {
                (Some(k), None) => {
                    first_of.insert(k, it);
                    b.forms.contains(it.grain)
                }
                _ => true,
            };
            if needed && !known {
                slots.push(it.loc);
            }
            if let Some(c) = &candidate {
                if !c.vouched && !(known && c.earlier.is_some()) {
                    slots.push(c.loc);
                }
            }
            candidates.push(candidate);
        }
        slots.sort_unstable();
        slots.dedup();
        let (buf, readable) = read_grains_each(s, &slots, g);
        // A slot that cannot be read (or a stale piece that does not decompress) is compared
        // with nothing.
        let content = |l: Loc| -> Option<&[u8]> {
            let i = slots.binary_search(&l).expect("every slot compared was read");
            readable[i].is_ok().then(|| &buf[i * g..(i + 1) * g])
        };
        // What a grain of the batch holds now.
        let own = |it: &Seen| -> Option<&[u8]> {
            if known {
                Some(prepared(it))
            } else {
                content(it.loc)
            }
        };
        let same = |it: &Seen, c: &Candidate| -> bool {
            if c.vouched {
                return true;
            }
            let theirs = match c.earlier {
                Some(e) if known => Some(prepared(e)),
                _ => content(c.loc),
            };
            theirs.is_some() && theirs == own(it)
        };

        // The grains to pack, in grain order: new, still holding what was compressed, and
        // in a slot that only grains of this batch point at (packing a grain whose slot a
        // snapshot, a clone or a copy in flight holds too would only add the packed copy).
        let mut holders: FxHashMap<Loc, u32> = FxHashMap::default();
        for it in seen {
            *holders.entry(it.loc).or_default() += 1;
        }
        let mut to_pack: Vec<&Seen> = Vec::new();
        for (it, candidate) in seen.iter().zip(&candidates) {
            if candidate.is_none()
                && b.forms.contains(it.grain)
                && s.space.refcount(it.loc) == holders[&it.loc]
                // Known: what was compressed is what the slot holds, with nothing to compare.
                && (known || own(it) == Some(prepared(it)))
            {
                to_pack.push(it);
            }
        }
        let packs = self.write_packs(v, &to_pack, b.forms)?;

        let mut plans = Vec::new();
        let mut ops = Vec::new();
        let mut inserts: Vec<(IndexKey, IndexEntry)> = Vec::new();
        for (it, candidate) in seen.iter().zip(candidates) {
            let Some(key) = it.key else {
                if own(it).is_some_and(|c| c.iter().all(|&b| b == 0)) {
                    ops.push(Op::Delete(CF_GRAINS, grain_key(v.id, it.grain)));
                    ops.push(Op::count(it.loc, -1));
                    plans.push(Plan::Unmap {
                        grain: it.grain,
                        from: it.loc,
                    });
                }
                continue;
            };
            match candidate {
                Some(Candidate { loc: to, .. }) if to == it.loc => {
                    // Another grain of the batch holds the same slot; it follows it to its pack.
                    if let Some(&piece) = packs.moved.get(&to) {
                        ops.extend(repoint(v.id, it.grain, it.loc, piece));
                        plans.push(Plan::Share {
                            grain: it.grain,
                            from: it.loc,
                            to: piece,
                        });
                    }
                }
                Some(c) if same(it, &c) => {
                    let to = c.loc;
                    let to = match packs.moved.get(&to) {
                        // Its candidate is packed in this batch: the pack's count takes it.
                        Some(&piece) => piece,
                        None => {
                            // The reference held on `to` becomes this entry's; a slot first
                            // seen in this batch is held by its grain's lock, so it takes one
                            // now.
                            match refs.get_mut(&to) {
                                Some(n) if *n > 0 => *n -= 1,
                                _ => s.space.incref(to),
                            }
                            ops.push(Op::count(to, 1));
                            to
                        }
                    };
                    ops.extend(repoint(v.id, it.grain, it.loc, to));
                    plans.push(Plan::Share {
                        grain: it.grain,
                        from: it.loc,
                        to,
                    });
                }
                found => {
                    // Nothing like it yet, or what the index names holds other bytes (a
                    // collision, or a slot rewritten since): this grain is the one to find.
                    if found.is_some() {
                        report.mismatches += 1;
                    }
                    let loc = match packs.moved.get(&it.loc) {
                        Some(&piece) => {
                            ops.extend(repoint(v.id, it.grain, it.loc, piece));
                            plans.push(Plan::Pack {
                                grain: it.grain,
                                from: it.loc,
                                to: piece,
                            });
                            piece
                        }
                        None => it.loc,
                    };
                    // Vouched for when the slot is known to hold the bytes hashed.
                    let vouch = match (b.unchanged, it.tail) {
                        (Some(m), Some(tail)) => Some(Vouch {
                            tail,
                            epoch: m.epoch,
                            changes: m.changes,
                        }),
                        _ => None,
                    };
                    inserts.push((
                        key,
                        IndexEntry {
                            loc,
                            vdisk: v.id,
                            grain: it.grain,
                            vouch,
                        },
                    ));
                }
            }
        }
        // Each pack slot is counted once for every grain that now points into it.
        let pack_slots: FxHashSet<Loc> = packs.slots.iter().copied().collect();
        let mut per_pack: FxHashMap<Loc, u32> = FxHashMap::default();
        for p in &plans {
            if let Plan::Share { to, .. } | Plan::Pack { to, .. } = p {
                for slot in slots_of(*to) {
                    if pack_slots.contains(&slot) {
                        *per_pack.entry(slot).or_default() += 1;
                    }
                }
            }
        }
        for (&slot, &n) in &per_pack {
            ops.push(Op::count(slot, n as i64));
            for _ in 1..n {
                s.space.incref(slot);
            }
        }
        // A pack no grain points at (every grain it was for was shared instead) is freed.
        for &slot in &packs.slots {
            if !per_pack.contains_key(&slot) {
                s.space.unallocate(slot, None);
            }
        }
        if !ops.is_empty() {
            if let Err(e) = s.committer.commit(ops) {
                for p in &plans {
                    if let Plan::Share { to, .. } = p {
                        if !per_pack.contains_key(&slot_of(*to)) {
                            s.space.decref(*to);
                        }
                    }
                }
                for slot in per_pack.keys() {
                    s.space.unallocate(*slot, None);
                }
                return Err(e);
            }
        }
        for p in plans {
            match p {
                Plan::Share { grain, from, to } => {
                    v.set_entry(grain, to);
                    s.space.decref(from);
                    report.grains_shared += 1;
                }
                Plan::Pack { grain, from, to } => {
                    v.set_entry(grain, to);
                    s.space.decref(from);
                    report.grains_compressed += 1;
                    report.compressed_bytes_in += g as u64;
                    report.compressed_bytes_out +=
                        piece_of(to).map(|(_, n)| n as u64).unwrap_or(0) * g as u64 / crate::space::PACK_UNITS;
                }
                Plan::Unmap { grain, from } => {
                    v.set_entry(grain, 0);
                    s.space.decref(from);
                    report.zero_grains_unmapped += 1;
                }
            }
        }
        report.index_inserts += inserts.len() as u64;
        Ok(inserts)
    }

    /// Lays the compressed forms of `grains` out in pack slots and writes them (not yet
    /// pointed at: the batch's commit does that, after flushing them). Packs nothing, and
    /// says so in the log, when the class has no room for the packs; packs whose slots a
    /// piece's location cannot name are given back, their grains left plain.
    fn write_packs(&self, v: &Arc<Vdisk>, grains: &[&Seen], forms: &Forms) -> Result<Packs> {
        let s = self.shared();
        let g = v.class.grain as usize;
        let mut packs = Packs::default();
        if grains.is_empty() {
            return Ok(packs);
        }
        let bodies: Vec<&[u8]> = grains
            .iter()
            .map(|it| forms.get(it.grain).expect("a grain to pack has a form"))
            .collect();
        // End to end, into neighbouring slots, where the class has redundancy: on a class
        // without, a hot slot's copy is of one slot, so each piece lies in one.
        let end_to_end = v.class.layout.tolerance() > 0;
        let (mut content, mut placed) = if end_to_end {
            lay_out_end_to_end(&bodies, g)
        } else {
            lay_out(&bodies, g)
        };
        let mut n = content.len() / g;
        let slots = match s.space.allocate_run(v.class, n, false) {
            Some(run) => run,
            None => {
                if end_to_end && n > 1 {
                    // No run of neighbouring slots: packs that each hold whole pieces.
                    (content, placed) = lay_out(&bodies, g);
                    n = content.len() / g;
                }
                let mut taken = Vec::with_capacity(n);
                for _ in 0..n {
                    match s.space.allocate(v.class, false) {
                        Ok(l) => taken.push(l),
                        Err(e) => {
                            for l in taken {
                                s.space.unallocate(l, None);
                            }
                            tracing::warn!(vdisk = %v.name(), error = %e, "no room to pack compressed grains; they stay as they are");
                            return Ok(packs);
                        }
                    }
                }
                taken
            }
        };
        // Written as runs of neighbouring slots.
        let mut k = 0;
        while k < n {
            let (set, base) = match s.space.locate(slots[k]) {
                Ok(x) => x,
                Err(e) => {
                    slots.iter().for_each(|&l| s.space.unallocate(l, None));
                    return Err(e);
                }
            };
            let mut run = 1;
            while k + run < n && slots[k + run] == slots[k] + run as u64 {
                run += 1;
            }
            if let Err(e) = v.write_to_set(&set, base, &content[k * g..(k + run) * g]) {
                slots.iter().for_each(|&l| s.space.unallocate(l, None));
                return Err(e);
            }
            k += run;
        }
        for (it, p) in grains.iter().zip(&placed) {
            let (set, slot) = loc_parts(slots[p.pack]);
            if let Some(piece) = packed_loc(set, slot, p.first, p.units) {
                packs.moved.insert(it.loc, piece);
            }
        }
        packs.slots = slots;
        Ok(packs)
    }
}

/// A batch read, fingerprinted and compressed, waiting for its compare and commit: grains
/// [first, end), those of them to look at, the write-clock regions taken for them (given
/// back if the batch is not committed), and what was counted while choosing them.
#[derive(Default)]
struct Prepared {
    first: u64,
    end: u64,
    seen: Vec<Seen>,
    /// Read only when `seen` is not empty.
    data: Option<AlignedBuf>,
    forms: Forms,
    taken: Vec<u64>,
    mapped: u64,
    too_young: u64,
    /// Grains left out because they could not be read.
    unreadable: u64,
    /// The vdisk's change count just before the read, if no change was under way.
    mark: Option<Mark>,
    /// The index entries of its grains, as looked up after `looked_up_after` batches of the
    /// vdisk were settled.
    found: FxHashMap<IndexKey, IndexEntry>,
    looked_up_after: u64,
}

/// The compressed forms of a batch's grains, end to end in one buffer, by grain: one
/// allocation a batch rather than one a grain, and nothing zeroed before a codec writes.
#[derive(Default)]
struct Forms {
    bytes: Vec<u8>,
    at: FxHashMap<u64, Range<usize>>,
}

impl Forms {
    /// Makes the stored form of `grain`'s bytes, if it takes `limit` bytes at most.
    fn make(&mut self, grain: u64, compression: Compression, bytes: &[u8], limit: usize) {
        let start = self.bytes.len();
        if let Some(n) = compression.compress_into(bytes, limit, &mut self.bytes) {
            self.at.insert(grain, start..start + n);
        }
    }

    fn get(&self, grain: u64) -> Option<&[u8]> {
        self.at.get(&grain).map(|r| &self.bytes[r.clone()])
    }

    fn contains(&self, grain: u64) -> bool {
        self.at.contains_key(&grain)
    }

    /// Forgets `grain`'s form (its bytes stay until the batch is done).
    fn remove(&mut self, grain: u64) {
        self.at.remove(&grain);
    }
}

/// Batch buffers given back once their batch is settled, for the reader to fill again: a
/// fresh 16 MiB buffer for every batch cost its page faults and zeroing, a tenth of a run's
/// time. A buffer taken again holds what its last batch read.
struct Spare {
    kept: Mutex<Vec<AlignedBuf>>,
    most: usize,
}

impl Spare {
    fn keeping(most: usize) -> Spare {
        Spare {
            kept: Mutex::new(Vec::with_capacity(most)),
            most,
        }
    }

    fn take(&self, len: usize) -> AlignedBuf {
        let mut kept = self.kept.lock();
        match kept.iter().position(|b| b.len() == len) {
            Some(i) => kept.swap_remove(i),
            None => {
                drop(kept);
                AlignedBuf::zeroed(len)
            }
        }
    }

    fn give(&self, buf: AlignedBuf) {
        let mut kept = self.kept.lock();
        if kept.len() < self.most {
            kept.push(buf);
        }
    }
}

/// The index entries that the last batches of a vdisk's run added, so that a batch looked
/// up before they were settled, or before they were put into the index, need not be looked
/// up again.
#[derive(Default)]
struct Recent {
    log: Mutex<RecentLog>,
}

#[derive(Default)]
struct RecentLog {
    /// Batches settled, in order.
    settled: u64,
    /// Batches whose entries are in the index: the first `indexed` settled (they are put in
    /// the order they were settled).
    indexed: u64,
    /// The entries each of the last `RECENT_BATCHES` settled added.
    kept: VecDeque<Vec<(IndexKey, IndexEntry)>>,
}

/// Batches whose entries `Recent` keeps: more than can be between stages at once.
const RECENT_BATCHES: usize = 16;

impl Recent {
    /// Batches settled whose entries a lookup of the index from now on sees.
    fn indexed(&self) -> u64 {
        self.log.lock().indexed
    }

    /// Notes the entries a batch added, once it is committed.
    fn add(&self, entries: Vec<(IndexKey, IndexEntry)>) {
        let mut log = self.log.lock();
        log.settled += 1;
        log.kept.push_back(entries);
        if log.kept.len() > RECENT_BATCHES {
            log.kept.pop_front();
        }
    }

    /// Notes that the entries of the next batch settled are in the index.
    fn indexed_one(&self) {
        let mut log = self.log.lock();
        debug_assert!(log.indexed < log.settled, "a batch is indexed after it is settled");
        log.indexed += 1;
    }

    /// Adds to `found` the entries of `keys` added by the batches settled after the first
    /// `after`; false if some of those batches are no longer kept.
    fn added_since(&self, after: u64, keys: &FxHashSet<IndexKey>, found: &mut FxHashMap<IndexKey, IndexEntry>) -> bool {
        let log = self.log.lock();
        let (settled, kept) = (log.settled, &log.kept);
        if settled - after > kept.len() as u64 {
            return false;
        }
        for entries in kept.iter().skip(kept.len() - (settled - after) as usize) {
            for (k, e) in entries {
                if keys.contains(k) {
                    found.insert(*k, *e);
                }
            }
        }
        true
    }
}

impl Prepared {
    /// Marks the batch's regions written again, for the next run: it was not committed.
    fn give_back(&self, v: &Vdisk) {
        give_back(v, &self.taken);
    }
}

/// Marks regions (indexes of REGION bytes) written again, for the next run.
fn give_back(v: &Vdisk, regions: &[u64]) {
    for &r in regions {
        v.clock.give_back(r * REGION);
    }
}

/// A batch of one vdisk as read before its locks were taken, and the compressed forms made
/// from it; `unchanged` when the vdisk admitted no change since that read (its mark then).
struct Batch<'a> {
    v: &'a Arc<Vdisk>,
    first: u64,
    data: &'a [u8],
    forms: &'a Forms,
    unchanged: Option<Mark>,
}

/// A grain's candidate: its slot, the grain of the batch it comes from (the first with the
/// same fingerprint), if any, and whether its bytes are known to equal the grain's by hash.
#[derive(Clone, Copy)]
struct Candidate<'a> {
    loc: Loc,
    earlier: Option<&'a Seen>,
    vouched: bool,
}

/// Pack slots written for a batch, and the piece each packed grain's old slot moves to.
#[derive(Default)]
struct Packs {
    slots: Vec<Loc>,
    moved: FxHashMap<Loc, Loc>,
}

/// The ops that point grain `g` of vdisk `vdisk` at `to` instead of `from`, dropping its
/// reference to `from` (what `to` gains is counted by the caller: one op per slot or per pack).
fn repoint(vdisk: u64, g: u64, from: Loc, to: Loc) -> [Op; 2] {
    [
        Op::Put(CF_GRAINS, grain_key(vdisk, g), loc_value(to)),
        Op::count(from, -1),
    ]
}

impl Engine {
    /// Savings of the vdisks in scope, each vdisk's share, and the index.
    pub fn dedup_status(&self) -> DedupStatus {
        let settings = self.dedup_settings();
        let s = self.shared();
        let mut st = DedupStatus {
            pool: self.pool().name().to_string(),
            settings: settings.clone(),
            settings_unreadable: self.dedup_settings_unreadable(),
            index: self.dedup.index.stats(),
            last_run: self.dedup_last_run(),
            ..Default::default()
        };
        let mut distinct: FxHashSet<Loc> = FxHashSet::default();
        for v in self.vdisks() {
            let grain = v.class.grain;
            let in_scope = !v.is_snapshot() && !v.fixed() && settings.covers(&v.name());
            let (mut logical, mut physical) = (0u64, 0f64);
            for e in v.map.read().iter() {
                let l = e.load(Ordering::Acquire);
                if l == 0 {
                    continue;
                }
                logical += grain;
                physical += grain as f64 / s.space.refcount(l).max(1) as f64;
                if in_scope {
                    distinct.insert(l);
                }
            }
            let physical = physical.round() as u64;
            if in_scope {
                st.logical_bytes += logical;
            }
            st.vdisks.push(VdiskSavings {
                name: v.name(),
                grain_size: grain,
                in_scope,
                logical_bytes: logical,
                physical_bytes: physical.min(logical),
                saved_bytes: logical.saturating_sub(physical),
            });
        }
        let size = |l: Loc| s.space.class_of(l).map(|c| c.grain).unwrap_or(0);
        let slots: FxHashSet<Loc> = distinct.iter().flat_map(|&l| slots_of(l)).collect();
        st.physical_bytes = slots.iter().map(|&l| size(l)).sum();
        st.compressed_bytes = distinct.iter().filter(|&&l| is_packed(l)).map(|&l| size(l)).sum();
        // Second copies of hot slots are stored bytes too.
        let copies = s.hot.pairs();
        st.hot_copies = copies.len() as u64;
        st.hot_copy_bytes = copies.iter().map(|&(_, c)| size(c)).sum();
        st.physical_bytes += st.hot_copy_bytes;
        st.packed_bytes = distinct
            .iter()
            .filter(|&&l| is_packed(l))
            .flat_map(|&l| slots_of(l))
            .collect::<FxHashSet<Loc>>()
            .into_iter()
            .map(size)
            .sum();
        st.settle();
        st
    }
}

impl Engine {
    /// Drops the index entries that can no longer find anything: their slot is free (every
    /// grain that pointed at it was rewritten, trimmed or deleted), or holds another class of
    /// grains now. Slots themselves are freed by their reference counts as soon as the last
    /// reference goes; empty slab sets go back to the pool here too. Entries whose slot was
    /// rewritten in place are left: the next run that matches them corrects them.
    pub fn dedup_gc(&self, progress: &Progress) -> Result<GcReport> {
        let _one = self.dedup.running.try_lock().ok_or_else(|| {
            VolumeError::Invalid(format!("a dedup run of pool '{}' is under way", self.pool().name()))
        })?;
        let started = Instant::now();
        let s = self.shared();
        let mut report = GcReport::default();
        progress
            .total_bytes
            .store(self.dedup.index.stats().entries.max(1), Ordering::Relaxed);
        let mut dead: Vec<IndexKey> = Vec::new();
        self.dedup.index.for_each(|k, e| {
            report.entries += 1;
            progress.done_bytes.fetch_add(1, Ordering::Relaxed);
            let live = s.space.refcount(e.loc) > 0
                && s.space
                    .class_of(e.loc)
                    .map(|c| tag(c).to_be_bytes() == k[..4])
                    .unwrap_or(false);
            if !live {
                dead.push(k);
            }
        })?;
        for chunk in dead.chunks(10_000) {
            if progress.cancel.load(Ordering::Relaxed) {
                return Err(VolumeError::Layout(LayoutError::Cancelled));
            }
            self.dedup.index.delete_many(chunk)?;
            report.pruned += chunk.len() as u64;
        }
        let hot = self.keep_hot_copies()?;
        report.hot_copies_dropped = hot.dropped;
        report.sets_freed = s.space.reclaim_empty()? as u64;
        report.seconds = started.elapsed().as_secs_f64();
        info!(pool = %self.pool().name(), entries = report.entries, pruned = report.pruned, "dedup garbage collection finished");
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(loc: u64) -> IndexEntry {
        IndexEntry {
            loc,
            vdisk: 1,
            grain: loc,
            vouch: None,
        }
    }

    #[test]
    fn recent_entries_cover_the_batches_settled_since_a_lookup_while_they_are_kept() {
        let r = Recent::default();
        let (a, b) = ([1u8; 20], [2u8; 20]);
        let keys: FxHashSet<IndexKey> = [a, b].into_iter().collect();
        let looked_up = r.indexed();
        r.add(vec![(a, entry(10))]);
        r.add(vec![([3u8; 20], entry(11)), (a, entry(12))]);
        let mut found = FxHashMap::from_iter([(b, entry(5))]);
        assert!(r.added_since(looked_up, &keys, &mut found));
        assert_eq!(
            found,
            FxHashMap::from_iter([(a, entry(12)), (b, entry(5))]),
            "the latest entry of a key wins"
        );
        // Settled but not yet in the index: still supplied.
        r.indexed_one();
        let mut pending = FxHashMap::default();
        assert!(r.added_since(r.indexed(), &keys, &mut pending));
        assert_eq!(
            pending,
            FxHashMap::from_iter([(a, entry(12))]),
            "the second batch is not indexed yet"
        );
        r.indexed_one();
        let mut none = FxHashMap::default();
        assert!(r.added_since(r.indexed(), &keys, &mut none));
        assert!(none.is_empty());
        for n in 0..RECENT_BATCHES as u64 {
            r.add(vec![(b, entry(100 + n))]);
            r.indexed_one();
        }
        assert!(!r.added_since(looked_up, &keys, &mut found), "batches no longer kept");
    }
}
