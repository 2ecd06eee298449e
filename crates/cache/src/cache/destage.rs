//! The destager: writes what the log holds to the layouts, oldest batches first, parity rows
//! written whole where the log holds most of them, and gives the log's space back.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_disk::{AlignedBuf, DiskRef};
use tessera_layout::ranges::gaps;
use tessera_layout::{LayoutError, SlabSet};
use tessera_pool::MetaBatch;
use tracing::{error, info, warn};

use super::{piece_crcs, Inner, BACKGROUND_DESTAGE_THREADS, DESTAGE_THREADS, MAX_BATCH, STRIPES};
use crate::error::{CacheError, Result};
use crate::format::BLOCK;
use crate::held;
use crate::index::Piece;
use crate::log;
use crate::parked::{self, Parked};

/// How often parked writes a settle could not write are tried again.
const SETTLE_RETRY: Duration = Duration::from_secs(30);

impl Inner {
    pub(super) fn destage_loop(self: Arc<Self>) {
        let mut settled = Instant::now();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            // Parked writes a settle could not write yet are tried again now and then, on a
            // thread of their own: the destager goes on meanwhile.
            if self.any_parked.load(Ordering::Acquire) && settled.elapsed() >= SETTLE_RETRY {
                settled = Instant::now();
                let me = self.clone();
                let _ = std::thread::Builder::new()
                    .name("tessera-settle".into())
                    .spawn(move || me.settle_parked(false));
            }
            let max_age = Duration::from_millis(self.max_age_ms.load(Ordering::Relaxed));
            let due = {
                let mut st = self.state.lock();
                if !st.due(max_age) {
                    self.work.wait_for(
                        &mut st,
                        Duration::from_millis(100).min(max_age.max(Duration::from_millis(1))),
                    );
                }
                st.due(max_age)
            };
            if !due || self.stop.load(Ordering::Acquire) {
                continue;
            }
            let round = {
                let _d = self.destaging.lock();
                // Judged again once the round in flight (a drain's, say) is done: it may have
                // destaged what was due, and what was written since is not due for that.
                if !self.state.lock().due(max_age) {
                    continue;
                }
                self.destage_round_held()
            };
            if let Err(e) = round {
                self.counters.destage_errors.fetch_add(1, Ordering::Relaxed);
                warn!(pool = %self.pool.name(), error = %e, "destage failed; retrying");
                *self.last_failure.lock() = Some((Instant::now(), e.to_string()));
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    /// Destages until nothing is dirty, and gives the log space back.
    pub(super) fn destage_all(&self) -> Result<()> {
        self.state.lock().draining += 1;
        let r = (|| {
            while self.destage_round()? > 0 {}
            self.layouts.flush()?;
            self.advance_tail()
        })();
        self.state.lock().draining -= 1;
        r
    }

    /// One round: the dirty pieces of the oldest batches (so that the start of the log moves
    /// on), up to `ROUND_BYTES`. A parity row the log holds at least half dirty is written
    /// whole, with every dirty piece the log holds in it and its clean parts read from the
    /// layout, so that its parity comes from the new data alone: a full-stripe write instead
    /// of a read-modify-write per piece. The rest goes in runs of neighbouring pieces. The
    /// writes are flushed, then the pieces of the jobs that succeeded marked clean: a job that
    /// fails (a slab set that refuses writes) keeps its pieces dirty for the next round, and
    /// the others go on. Returns the bytes it destaged, or the first failure if nothing was.
    fn destage_round(&self) -> Result<u64> {
        let _d = self.destaging.lock();
        self.destage_round_held()
    }

    /// [`destage_round`](Self::destage_round) for a caller that holds `destaging`.
    fn destage_round_held(&self) -> Result<u64> {
        let (picked, rows) = self.pick();
        if picked.is_empty() {
            return Ok(0);
        }
        let jobs = jobs(&picked, &rows);
        let work: u64 = jobs.iter().map(|j| j.len).sum();
        self.counters.destage_rounds.fetch_add(1, Ordering::Relaxed);
        self.counters.largest_round.fetch_max(work, Ordering::Relaxed);
        let devices = self.state.lock().devices.clone();
        // A member lost from here on may have lost what the jobs write to it, whatever the
        // round's flush says (it skips a disk already out).
        let noted = self.pool.losses();
        // Written by several threads at once: scattered pieces are as many read-modify-writes,
        // which the disks serve best together.
        let next = AtomicU64::new(0);
        let failed: Mutex<Option<CacheError>> = Mutex::new(None);
        // What each job wrote, once done (None until then).
        let done: Vec<Mutex<Option<u64>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
        // Once urgent, the round stays so: the threads past the background ones join for good.
        let urgent = AtomicBool::new(false);
        let _reuse = self.reuse.read();
        std::thread::scope(|sc| {
            for t in 0..DESTAGE_THREADS.min(jobs.len()) {
                let (next, jobs, failed, picked, devices, urgent, done) =
                    (&next, &jobs, &failed, &picked, &devices, &urgent, &done);
                sc.spawn(move || loop {
                    if t >= BACKGROUND_DESTAGE_THREADS && !urgent.load(Ordering::Relaxed) {
                        if self.state.lock().urgent() {
                            urgent.store(true, Ordering::Relaxed);
                            continue;
                        }
                        // Not needed yet: looked at again soon, since a writer may begin to
                        // wait at any time.
                        if next.load(Ordering::Relaxed) as usize >= jobs.len() {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(job) = jobs.get(k) else { return };
                    match self.run_job(job, picked, devices) {
                        Ok(n) => *done[k].lock() = Some(n),
                        Err(e) => {
                            failed.lock().get_or_insert(e);
                        }
                    }
                });
            }
        });
        drop(_reuse);
        let mut failed = failed.into_inner();
        let (mut succeeded, mut not_done): (Vec<(&Job, u64)>, Vec<&Job>) = (Vec::new(), Vec::new());
        for (j, d) in jobs.iter().zip(done) {
            match d.into_inner() {
                Some(n) => succeeded.push((j, n)),
                None => not_done.push(j),
            }
        }
        if !succeeded.is_empty() {
            self.layouts.flush()?;
            // A job whose set lost a member since the writes began, and may lack them for it,
            // is not done: the log still holds its pieces, and what becomes of them is judged
            // below with the jobs that failed.
            let lost_meanwhile = |(j, _): &(&Job, u64)| {
                self.layouts
                    .set(j.set)
                    .is_ok_and(|s| self.layouts.lost_since(&s, noted))
            };
            let (lost, kept): (Vec<(&Job, u64)>, Vec<(&Job, u64)>) = succeeded.into_iter().partition(lost_meanwhile);
            if !lost.is_empty() {
                warn!(pool = %self.pool.name(), jobs = lost.len(), "destaged writes may be gone with a disk lost meanwhile; the log keeps them");
            }
            succeeded = kept;
            not_done.extend(lost.into_iter().map(|(j, _)| j));
        }
        // A set that lost more members than it tolerates, for good (failed disks, which never
        // come back), can never take what the log holds for it: that is lost with the set,
        // and kept in the log it would hold the log's start where it is, and every other
        // vdisk's writers would wait for room that never comes. A set that only disks able
        // to come back keep from it (missing since the import, or taken out by an I/O error
        // while the pool runs) has what the log holds for it parked until they are back
        // (parked.rs), and so has a job over a range parked already (after it, in order).
        let (mut hopeless, mut waiting): (Vec<&Job>, Vec<&Job>) = (Vec::new(), Vec::new());
        for j in &not_done {
            let Ok(s) = self.layouts.set(j.set) else { continue };
            let unrecoverable = self.layouts.unrecoverable(&s);
            if !self.layouts.lost_for_good(&s) && (unrecoverable || self.parked_over(j.set, j.at, j.at + j.len)) {
                waiting.push(j);
            } else if unrecoverable {
                hopeless.push(j);
            }
        }
        if hopeless.len() + waiting.len() == not_done.len() {
            failed = None;
        }
        if !waiting.is_empty() {
            self.park_jobs(&waiting, &picked, &devices)?;
        }
        if !hopeless.is_empty() {
            self.lose_jobs(&hopeless, &picked)?;
        }
        if succeeded.is_empty() && hopeless.is_empty() && waiting.is_empty() {
            return match failed {
                Some(e) => Err(e),
                // Every job wrote, but its set lost a disk before the flush and has it back
                // already: still dirty, written again by the next round.
                None => Ok(1),
            };
        }
        // Only what is destaged for good counts; the others are written again, or parked.
        let bytes: u64 = succeeded.iter().map(|(_, n)| n).sum();
        let succeeded: Vec<&Job> = succeeded.into_iter().map(|(j, _)| j).collect();
        self.mark_clean(&succeeded, &picked);
        self.counters.destaged_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.room.notify_all();
        self.advance_tail()?;
        if let Some(e) = failed {
            self.counters.destage_errors.fetch_add(1, Ordering::Relaxed);
            *self.last_failure.lock() = Some((Instant::now(), e.to_string()));
            warn!(pool = %self.pool.name(), error = %e, "part of a destage round failed; it is tried again");
        }
        Ok(bytes.max(1))
    }

    /// What a round destages: the dirty pieces of the oldest batches (so that the start of the
    /// log moves on), and every dirty piece of the parity rows they touch that the log holds
    /// at least half dirty; sorted by set and offset, with the rows to be written whole as
    /// (set, offset of the row, its length). A round is bounded three ways, so that writers
    /// waiting for its room wait for a bounded amount of work: `ROUND_BYTES` of the oldest
    /// batches' data, `ROUND_PIECES` pieces written alone (a read-modify-write each), and
    /// `ROUND_ROW_BYTES` of whole rows (or what `set_round_bounds` set); past the last, the
    /// oldest batches' pieces go alone, so the start of the log keeps moving when whole rows
    /// pull in much newer data.
    #[allow(clippy::type_complexity)]
    fn pick(&self) -> (Vec<(u32, u64, Piece, Vec<u32>)>, BTreeMap<(u32, u64), u64>) {
        let bounds = *self.round_bounds.lock();
        let st = self.state.lock();
        let mut chosen: BTreeMap<(u32, u64), Piece> = BTreeMap::new();
        let mut rows: BTreeMap<(u32, u64), u64> = BTreeMap::new();
        let mut looked: HashSet<(u32, u64)> = HashSet::new();
        let mut row_bytes: HashMap<u32, Option<u64>> = HashMap::new();
        let (mut oldest_bytes, mut alone, mut whole_bytes) = (0, 0, 0);
        'batches: for (&seq, b) in &st.batches {
            if !b.sealed || oldest_bytes >= bounds.oldest_bytes {
                break;
            }
            if b.dirty == 0 {
                continue;
            }
            for &(set, off, len) in &b.entries {
                let Some(ix) = st.index.get(&set) else { continue };
                for (s, p) in ix.overlapping(off, off + len) {
                    if !p.dirty || p.seq != seq {
                        continue;
                    }
                    oldest_bytes += p.len;
                    if chosen.contains_key(&(set, s)) {
                        continue;
                    }
                    let row = *row_bytes.entry(set).or_insert_with(|| {
                        self.layouts
                            .set(set)
                            .ok()
                            .filter(|ss| ss.spec.parity_columns() > 0)
                            .map(|ss| ss.spec.row_bytes())
                    });
                    if let Some(row) = row.filter(|_| whole_bytes < bounds.row_bytes) {
                        let at = s / row * row;
                        if looked.insert((set, at)) {
                            let in_row = ix.overlapping(at, at + row);
                            let dirty: u64 = in_row.iter().filter(|(_, q)| q.dirty).map(|(_, q)| q.len).sum();
                            if dirty * 2 >= row {
                                rows.insert((set, at), row);
                                for (rs, q) in in_row.into_iter().filter(|(_, q)| q.dirty) {
                                    chosen.insert((set, rs), q);
                                }
                                whole_bytes += row;
                                continue;
                            }
                        }
                    }
                    if alone >= bounds.pieces {
                        break 'batches;
                    }
                    chosen.insert((set, s), p);
                    alone += 1;
                }
            }
        }
        let picked = chosen
            .into_iter()
            .map(|((set, s), p)| (set, s, p, piece_crcs(&st, &p)))
            .collect();
        (picked, rows)
    }

    /// Writes one job to the layouts; returns the dirty bytes it wrote.
    fn run_job(&self, job: &Job, picked: &[(u32, u64, Piece, Vec<u32>)], devices: &[(u32, DiskRef)]) -> Result<u64> {
        let Job {
            set,
            at,
            len,
            ref pieces,
            whole_row,
        } = *job;
        let slabset = match self.layouts.set(set) {
            Ok(s) => s,
            // Freed: nothing references the data any more.
            Err(LayoutError::NoSuchSet(_)) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        if self.parked_over(set, at, at + len) {
            // Parked too, after what was parked there before (older), so that the settle
            // writes both in order: written now, before those records, this newer data would
            // be undone by them. (Writers are refused there; a piece the log took before its
            // range was parked is such newer data.)
            return Err(CacheError::Waiting(format!(
                "slab set {set} has writes parked over {at}..{}",
                at + len
            )));
        }
        let mut data = AlignedBuf::zeroed(len as usize);
        // A row's clean parts come from the layout, under the row's stripe lock, so that a
        // write that bypasses the cache cannot land between this read and the write back.
        let _row = whole_row.then(|| self.stripe(set, at).lock());
        let pieces = &picked[pieces.clone()];
        let covered: u64 = pieces.iter().map(|(_, _, p, _)| p.len).sum();
        if whole_row && covered < len {
            // One read of the whole row costs less than one per gap. A row that does not read
            // whole may fail on a block beyond repair that a piece is about to replace (a host
            // writing over what a scan reported lost): then only the gaps are read. A gap
            // that does not read either (bytes lost beyond repair, or rot in two members at
            // one place) leaves the pieces to go alone: the layout's writes read around what
            // is lost, and record it lost where no disk is awaited that may hold it. Failing
            // instead, the job would fail at every round, and hold the log's start for good.
            if self.layouts.read(&slabset, at, &mut data).is_err() {
                for (a, b) in gaps(covered_runs(pieces).into_iter(), at, at + len) {
                    match self
                        .layouts
                        .read(&slabset, a, &mut data[(a - at) as usize..(b - at) as usize])
                    {
                        Ok(()) => {}
                        Err(LayoutError::Io { .. }) => return self.write_pieces_alone(&slabset, at, pieces, devices),
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        let dirty = self.read_pieces(set, at, pieces, devices, &mut data)?;
        self.layouts.write(&slabset, at, &data)?;
        Ok(dirty)
    }

    /// Writes the pieces of a job that starts at `at`, each run of them alone; returns their
    /// bytes.
    fn write_pieces_alone(
        &self,
        slabset: &SlabSet,
        at: u64,
        pieces: &[(u32, u64, Piece, Vec<u32>)],
        devices: &[(u32, DiskRef)],
    ) -> Result<u64> {
        let runs = covered_runs(pieces);
        let end = runs.iter().map(|r| r.1).max().unwrap_or(at);
        let mut data = AlignedBuf::zeroed((end - at) as usize);
        let dirty = self.read_pieces(slabset.id, at, pieces, devices, &mut data)?;
        for (a, b) in runs {
            self.layouts
                .write(slabset, a, &data[(a - at) as usize..(b - at) as usize])?;
        }
        Ok(dirty)
    }

    /// Reads the pieces of a job from the log into `data`, which starts at `at` of `set`;
    /// returns their bytes.
    fn read_pieces(
        &self,
        set: u32,
        at: u64,
        pieces: &[(u32, u64, Piece, Vec<u32>)],
        devices: &[(u32, DiskRef)],
        data: &mut [u8],
    ) -> Result<u64> {
        let mut dirty = 0;
        for (_, s, p, crcs) in pieces {
            let piece = match log::read_verified(devices, p.log, crcs) {
                Ok(piece) => piece,
                Err(e) if devices.is_empty() => return Err(e),
                Err(e) => {
                    // No copy holds the whole piece intact: what every copy holds rotten is
                    // lost (recorded before the layout is written over), the rest goes on.
                    let (piece, bad) = log::read_salvaging(devices, p.log, crcs)?;
                    self.lose_blocks(set, *s, p.seq, &bad, &e)?;
                    piece
                }
            };
            let o = (s - at) as usize;
            data[o..o + piece.len()].copy_from_slice(&piece);
            dirty += p.len;
        }
        Ok(dirty)
    }

    /// Marks the pieces of `jobs` clean (destaged, or lost).
    fn mark_clean(&self, jobs: &[&Job], picked: &[(u32, u64, Piece, Vec<u32>)]) {
        let mut st = self.state.lock();
        for (set, s, p, _) in jobs.iter().flat_map(|j| &picked[j.pieces.clone()]) {
            let cleaned = match st.index.get_mut(set) {
                Some(ix) => ix.mark_clean(*s, s + p.len, p.seq),
                None => Vec::new(),
            };
            for (_, c) in cleaned {
                st.undirty(&c);
            }
        }
    }

    /// The pieces of `jobs`, whose sets wait for disks that can come back (or have writes
    /// parked already), are parked in the pool's metadata (read from the log, saved, then
    /// refused to readers and writers), then dropped from what the log must destage. A write
    /// that reaches the log between the read here and the ranges refused is a newer piece,
    /// left dirty (`mark_clean` takes only these), and parked after these by a later round;
    /// a reader sees the ranges refused and the pieces clean in one look at the state.
    fn park_jobs(
        &self,
        jobs: &[&Job],
        picked: &[(u32, u64, Piece, Vec<u32>)],
        devices: &[(u32, DiskRef)],
    ) -> Result<()> {
        let mut parked = Vec::new();
        for (set, s, p, crcs) in jobs.iter().flat_map(|j| &picked[j.pieces.clone()]) {
            let data = match log::read_verified(devices, p.log, crcs) {
                Ok(data) => data,
                Err(e) if devices.is_empty() => return Err(e),
                Err(e) => {
                    let (data, bad) = log::read_salvaging(devices, p.log, crcs)?;
                    self.lose_blocks(*set, *s, p.seq, &bad, &e)?;
                    data
                }
            };
            parked.push(Parked {
                set: *set,
                seq: p.seq,
                at: *s,
                data: data.to_vec(),
            });
        }
        let mut b = MetaBatch::new();
        for p in &parked {
            parked::put(&mut b, p);
        }
        self.pool.meta().commit(b, true)?;
        let bytes: u64 = parked.iter().map(|p| p.data.len() as u64).sum();
        {
            let mut st = self.state.lock();
            for p in &parked {
                st.parked.insert(p.set, p.at, p.at + p.data.len() as u64);
            }
        }
        self.any_parked.store(true, Ordering::Release);
        warn!(pool = %self.pool.name(), bytes, "writes in the write-back log for slab sets beyond their tolerance wait for disks that can come back (missing, or taken out by an I/O error): parked in the pool's metadata until those disks are back");
        self.mark_clean(jobs, picked);
        Ok(())
    }

    /// Whether `set` has writes parked (parked.rs).
    fn has_parked(&self, set: u32) -> bool {
        self.any_parked.load(Ordering::Acquire) && self.state.lock().parked.has_set(set)
    }

    /// Whether `set` has writes parked over `[a, b)`.
    fn parked_over(&self, set: u32, a: u64, b: u64) -> bool {
        self.any_parked.load(Ordering::Acquire) && self.state.lock().parked.overlaps(set, a, b)
    }

    /// Settles the parked writes (parked.rs) of every set that no longer waits: written to
    /// the set, oldest batch first, flushed, then their records deleted and their ranges given
    /// back to readers and writers, for a set whose disks are back; recorded lost for one
    /// whose disks failed instead; dropped for a set freed. A set that still waits keeps
    /// them, and one whose writes fail keeps them for the next try (said in the log).
    /// One settle at a time; with `wait` false, none if one is under way. Returns the bytes
    /// still parked.
    ///
    /// A destage round under way is waited for: it may have judged a set to wait for a disk
    /// before the change this settle is for (the disk back, or given up), and park its writes
    /// after it; listed before them, those would wait for the next try (`SETTLE_RETRY`),
    /// refused to readers and writers meanwhile.
    pub(crate) fn settle_parked(&self, wait: bool) -> u64 {
        let _one = if wait {
            self.settling.lock()
        } else {
            match self.settling.try_lock() {
                Some(g) => g,
                None => return self.state.lock().parked.bytes(),
            }
        };
        // A settle that came after the stop writes nothing (the pool may be exported).
        if self.stop.load(Ordering::Acquire) {
            return self.state.lock().parked.bytes();
        }
        let sets = {
            let _round = self.destaging.lock();
            if !self.any_parked.load(Ordering::Acquire) {
                return 0;
            }
            self.state.lock().parked.sets()
        };
        for set in sets {
            if let Err(e) = self.settle_parked_set(set) {
                warn!(pool = %self.pool.name(), set, error = %e, "the writes parked for a slab set cannot be written to it yet; tried again later");
            }
        }
        let st = self.state.lock();
        if st.parked.is_empty() {
            self.any_parked.store(false, Ordering::Release);
        }
        st.parked.bytes()
    }

    fn settle_parked_set(&self, set: u32) -> Result<()> {
        let stopping = || -> Result<()> {
            match self.stop.load(Ordering::Acquire) {
                true => Err(CacheError::Log("the cache is stopping".into())),
                false => Ok(()),
            }
        };
        let slabset = match self.layouts.set(set) {
            Ok(s) => Some(s),
            Err(LayoutError::NoSuchSet(_)) => None,
            Err(e) => return Err(e.into()),
        };
        // Whether what is parked for the set is lost now (judged here, taken below under the
        // destager's lock, where `forget_set` cannot drop it meanwhile).
        let mut loses = false;
        let _d = match &slabset {
            // Asked first: a disk back meanwhile never makes a set lost for good.
            Some(s) if self.layouts.lost_for_good(s) => {
                loses = true;
                self.destaging.lock()
            }
            Some(s) if self.layouts.unrecoverable(s) => return Ok(()),
            Some(s) => {
                let mut written = HashSet::new();
                // A member lost while the records are written may lack them (the flush below
                // skips a disk already out): they are kept for the next settle.
                let noted = self.pool.losses();
                let mut keys = parked::keys_of(&self.pool, set)?.0;
                loop {
                    let new: Vec<_> = keys.iter().filter(|k| !written.contains(*k)).copied().collect();
                    for (seq, at) in new {
                        // One piece at a time under the destager's lock: not between a destage
                        // round's read of a whole row and its write back, nor into a set that
                        // `forget_set` (which takes it too) has dropped for freeing.
                        let _d = self.destaging.lock();
                        if !self.has_parked(set) {
                            return Ok(());
                        }
                        stopping()?;
                        if let Some(data) = parked::get(&self.pool, set, seq, at)? {
                            self.layouts.write(s, at, &data)?;
                        }
                        written.insert((seq, at));
                    }
                    self.layouts.flush()?;
                    if self.layouts.lost_since(s, noted) {
                        return Err(CacheError::Log(format!(
                            "slab set {set} lost a disk while its parked writes were written to it; they stay parked"
                        )));
                    }
                    // A destage round parks under the destager's lock, and may have parked
                    // newer pieces for the set while these were written: written too (the next
                    // turn) before the set's records go (all of them, below).
                    let d = self.destaging.lock();
                    let unreadable;
                    (keys, unreadable) = parked::keys_of(&self.pool, set)?;
                    if keys.iter().all(|k| written.contains(k)) {
                        // Where the data of a record that cannot be read goes is not known:
                        // the set's parked range (all of it, for such a record) is lost,
                        // refused until written again, rather than refused for ever or read
                        // as the disks hold it.
                        loses = unreadable > 0;
                        break d;
                    }
                }
            }
            // Freed: nothing references the data any more.
            None => self.destaging.lock(),
        };
        // Dropped meanwhile by `forget_set` (the set freed): nothing left to do.
        if !self.has_parked(set) {
            return Ok(());
        }
        stopping()?;
        let lost = if loses {
            self.state.lock().parked.within(set, 0, u64::MAX)
        } else {
            Vec::new()
        };
        if !lost.is_empty() {
            {
                let mut st = self.state.lock();
                for &(a, b) in &lost {
                    st.lose(set, a, b);
                }
            }
            self.any_lost.store(true, Ordering::Release);
            self.save_lost()?;
            error!(pool = %self.pool.name(), set, bytes = lost.iter().map(|(a, b)| b - a).sum::<u64>(), "writes parked for a slab set that cannot take them are lost (its disks failed instead of coming back, or the record of where they go cannot be read)");
        }
        let mut b = MetaBatch::new();
        parked::delete_set(&mut b, set);
        self.pool.meta().commit(b, true)?;
        let bytes = {
            let mut st = self.state.lock();
            let bytes = st.parked.set_bytes(set);
            st.parked.remove_set(set);
            bytes
        };
        if slabset.is_some() && lost.is_empty() {
            info!(pool = %self.pool.name(), set, bytes, "writes parked for a slab set until its disks were back are written to it");
        }
        Ok(())
    }

    /// The pieces of `jobs`, whose sets are lost for good, are lost with them: recorded (the
    /// parts their batches still hold), saved, then dropped from what the log must destage.
    fn lose_jobs(&self, jobs: &[&Job], picked: &[(u32, u64, Piece, Vec<u32>)]) -> Result<()> {
        let mut lost = 0;
        {
            let mut st = self.state.lock();
            for (set, s, p, _) in jobs.iter().flat_map(|j| &picked[j.pieces.clone()]) {
                let held: Vec<(u64, u64)> = st
                    .index
                    .get(set)
                    .map(|ix| {
                        ix.overlapping(*s, s + p.len)
                            .into_iter()
                            .filter(|(_, q)| q.seq == p.seq && q.dirty)
                            .map(|(x, q)| (x, x + q.len))
                            .collect()
                    })
                    .unwrap_or_default();
                for (x, y) in held {
                    st.lose(*set, x, y);
                    lost += y - x;
                }
            }
        }
        if lost > 0 {
            self.any_lost.store(true, Ordering::Release);
            error!(pool = %self.pool.name(), bytes = lost, "writes in the write-back log for slab sets lost with their failed disks are lost with them");
            self.save_lost()?;
        }
        self.mark_clean(jobs, picked);
        Ok(())
    }

    /// Blocks of a piece that no copy of the log holds intact are lost: recorded (for the
    /// parts the piece's batch still holds; a newer write may have replaced the rest) and
    /// saved before the destage writes the layout over them.
    fn lose_blocks(&self, set: u32, at: u64, seq: u64, bad: &[usize], why: &CacheError) -> Result<()> {
        let mut lost = 0;
        {
            let mut st = self.state.lock();
            for &b in bad {
                let a = at + (b * BLOCK) as u64;
                let held: Vec<(u64, u64)> = st
                    .index
                    .get(&set)
                    .map(|ix| {
                        ix.overlapping(a, a + BLOCK as u64)
                            .into_iter()
                            .filter(|(_, q)| q.seq == seq && q.dirty)
                            .map(|(s, q)| (s, s + q.len))
                            .collect()
                    })
                    .unwrap_or_default();
                for (x, y) in held {
                    st.lose(set, x, y);
                    lost += y - x;
                }
            }
        }
        if lost == 0 {
            return Ok(());
        }
        self.any_lost.store(true, Ordering::Release);
        error!(pool = %self.pool.name(), set, offset = at, bytes = lost, error = %why, "data in the write-back log is unreadable on every copy: it is lost, and reads of it fail until it is written again");
        self.save_lost()
    }

    /// The lock of a stripe row, shared by a whole-row destage and writes that bypass the cache.
    pub(super) fn stripe(&self, set: u32, row_at: u64) -> &Mutex<()> {
        &self.stripes[stripe_index(set, row_at)]
    }

    /// Gives back the log space of the oldest batches that hold nothing dirty: the new start
    /// of the log is saved first, then their pieces leave the index.
    pub(super) fn advance_tail(&self) -> Result<()> {
        let _one = self.advancing.lock();
        let (upto, rec) = {
            let st = self.state.lock();
            let done: Vec<u64> = st
                .batches
                .iter()
                .take_while(|(_, b)| b.sealed && b.dirty == 0)
                .map(|(s, _)| *s)
                .collect();
            let Some(&last) = done.last() else { return Ok(()) };
            let mut rec = st.record();
            match st.batches.range(last + 1..).next() {
                Some((s, b)) => {
                    rec.tail = b.pos;
                    rec.seq = *s;
                }
                None => {
                    rec.tail = st.head;
                    rec.seq = st.next_seq;
                }
            }
            (last, rec)
        };
        // A batch passed here may hold nothing dirty because a newer write cut its pieces,
        // and that write's batch may be written and not yet flushed: a power cut would then
        // take the newer copy while the log's start no longer covers the older one, and the
        // block would read as it was before both. Every installed batch is written, so a
        // flush of the log's disks now makes the newer copies durable before the older go.
        let devices = self.state.lock().devices.clone();
        for (p, d) in &devices {
            if let Err(e) = d.flush() {
                // Not under `advancing`: losing a disk saves the log's record, which takes it.
                drop(_one);
                self.lose_device(*p, &format!("flush failed: {e}"));
                return Err(CacheError::Log(format!(
                    "a disk of the write-back log failed its flush; its start stays where it is: {e}"
                )));
            }
        }
        // The record of the writes only these batches hold goes in the same commit as the
        // log's new start: the metadata never says the log holds a write it no longer covers,
        // nor forgets one it covers.
        let held_saving = self.held_saving.lock();
        let freed = {
            let mut st = self.state.lock();
            let st = &mut *st;
            let mut freed = Vec::new();
            for (&seq, b) in st.batches.range(..=upto) {
                freed.extend(st.held.freed(seq, &b.entries).into_iter().map(|w| (w, seq)));
            }
            freed
        };
        let mut b = tessera_pool::MetaBatch::new();
        held::delete(&mut b, &freed.iter().map(|(w, _)| *w).collect::<Vec<_>>());
        if let Err(e) = log::save_record_with(&self.pool, &rec, b) {
            self.state.lock().held.restore(&freed);
            return Err(e);
        }
        drop(held_saving);
        let _reuse = self.reuse.write();
        let mut st = self.state.lock();
        while let Some((&seq, _)) = st.batches.first_key_value() {
            if seq > upto {
                break;
            }
            let b = st.batches.remove(&seq).expect("first");
            st.used -= b.len;
            for (set, off, len) in b.entries {
                if let Some(ix) = st.index.get_mut(&set) {
                    ix.remove_batch(off, off + len, seq);
                    if ix.is_empty() {
                        st.index.remove(&set);
                    }
                }
            }
        }
        drop(st);
        self.room.notify_all();
        Ok(())
    }
}

/// The ranges `pieces` cover, neighbours joined: pieces sorted by offset, none overlapping.
fn covered_runs(pieces: &[(u32, u64, Piece, Vec<u32>)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(_, s, p, _) in pieces {
        match out.last_mut() {
            Some(last) if last.1 == s => last.1 = s + p.len,
            _ => out.push((s, s + p.len)),
        }
    }
    out
}

/// The stripe lock of a row. Row offsets are multiples of a row's size, so their low bits
/// are zero: every bit is mixed into the ones kept (splitmix64's finaliser), or the rows of a
/// slab set would all share one lock.
pub(super) fn stripe_index(set: u32, row_at: u64) -> usize {
    let mut h = ((set as u64) << 40) ^ row_at;
    h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^= h >> 31;
    (h % STRIPES as u64) as usize
}

/// A unit of destage work: `len` bytes at `at` of slab set `set`, holding the picked pieces
/// `pieces`. Either neighbouring pieces written as one layout write, or (`whole_row`) a parity
/// row written whole, its clean parts read from the layout.
struct Job {
    set: u32,
    at: u64,
    len: u64,
    pieces: std::ops::Range<usize>,
    whole_row: bool,
}

/// The jobs of a round: the pieces of each whole row together, the others in runs of
/// neighbours (up to `MAX_BATCH` bytes each).
fn jobs(picked: &[(u32, u64, Piece, Vec<u32>)], rows: &BTreeMap<(u32, u64), u64>) -> Vec<Job> {
    let row_of = |set: u32, s: u64| {
        rows.range((set, 0)..=(set, s))
            .next_back()
            .filter(|(&(_, at), &len)| s < at + len)
            .map(|(&(_, at), &len)| (at, len))
    };
    let mut jobs: Vec<Job> = Vec::new();
    for (n, (set, s, p, _)) in picked.iter().enumerate() {
        let (set, s) = (*set, *s);
        let row = row_of(set, s);
        let joins = jobs.last().is_some_and(|j| {
            j.set == set
                && match row {
                    // The same row.
                    Some((at, _)) => j.whole_row && j.at == at,
                    // The run this piece continues.
                    None => !j.whole_row && j.at + j.len == s && j.len < MAX_BATCH as u64,
                }
        });
        if joins {
            let j = jobs.last_mut().expect("joins the last");
            j.pieces.end = n + 1;
            if row.is_none() {
                j.len += p.len;
            }
            continue;
        }
        let (at, len) = row.unwrap_or((s, p.len));
        jobs.push(Job {
            set,
            at,
            len,
            pieces: n..n + 1,
            whole_row: row.is_some(),
        });
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_of_a_set_spread_over_the_stripe_locks() {
        // A parity 3+1 row of 256 KiB columns, and an 8-wide one of 64 KiB.
        for row in [768u64 << 10, 7 * 64 << 10] {
            let used: std::collections::HashSet<usize> = (0..1024).map(|k| stripe_index(7, k * row)).collect();
            assert!(
                used.len() > STRIPES * 3 / 4,
                "{} of {STRIPES} locks for row {row}",
                used.len()
            );
        }
    }
}
