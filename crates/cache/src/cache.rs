//! The write-back cache of one pool: writes appended to the log in batches (one disk write
//! and, when asked, one flush for many writers), the index that reads consult, each vdisk's
//! budget, and the destager that writes the log's contents to the layouts.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use serde::Serialize;
use tessera_disk::{AlignedBuf, DiskRef, DATA_OFFSET};
use tessera_layout::{Layouts, SetRead, SlabSet};
use tessera_pool::{DiskState, Pool, MIN_CACHE_AREA};
use tracing::{error, info, warn};

use crate::error::{CacheError, Result};
use crate::format::{block_crcs, entry_crc, Entry, Header, BLOCK, MAX_ENTRIES};
use crate::held::{self, Held, Write};
use crate::index::{Piece, SetIndex};
use crate::log::{self, LogRecord};
use crate::lost::LostRanges;
use crate::parked;

mod destage;

use destage::stripe_index;

/// A vdisk's cache budget unless it sets its own.
pub const DEFAULT_VDISK_CACHE: u64 = 1 << 30;
/// Largest entry: a longer write is split.
const MAX_ENTRY: usize = 1 << 20;
/// Largest batch of data.
const MAX_BATCH: usize = 8 << 20;
/// The bounds of a destage round (one flush each), in data of the oldest batches, pieces
/// written alone, and whole parity rows: writers that wait for room wait for a round, a round
/// of scattered 4 KiB pieces is as many read-modify-writes, and a whole row reads and writes a
/// full stripe. Whole rows are the cheapest destage per byte: with 128 MiB of them instead of
/// 64 a full cache on parity 3+1 took 4 KiB random writes 1.1x faster, and the longest wait
/// for room went from about 0.2 s to 0.35 s (256 MiB: no faster again, 0.6 to 0.8 s).
const ROUND_BYTES: u64 = 32 << 20;
const ROUND_PIECES: usize = 2048;
const ROUND_ROW_BYTES: u64 = 128 << 20;
/// Data older than this is destaged even when the cache has room (unless set otherwise). While
/// the cache has room, a destage only competes with the writes for the disks; data that waits
/// longer is more likely to be overwritten or joined by its row's neighbours.
const MAX_AGE: Duration = Duration::from_secs(10);
/// Stripe row locks (hashed).
const STRIPES: usize = 256;
/// Threads a destage round writes with when writers wait for it (or the log is nearly full, or
/// a flush drains the cache).
const DESTAGE_THREADS: usize = 16;
/// Threads a destage round writes with while the cache still has room: it then only makes
/// room ahead of need, and sixteen threads of read-modify-writes would take the disks from the
/// writes the cache is there to absorb.
const BACKGROUND_DESTAGE_THREADS: usize = 2;
/// How long a writer waits for room with nothing made for it, while destage jobs fail, before
/// it is failed rather than kept waiting (unless set otherwise): an initiator gives up on a
/// command after about 30 s, and an answer it can act on (a medium error, another path)
/// beats a hang.
const STALL_LIMIT: Duration = Duration::from_secs(20);
/// Copies the log keeps when the pool has the disks for them.
const COPIES: usize = 2;
/// Batches written at once. One at a time leaves the disks idle while a batch's writers are
/// answered and the next batch is built: the writers wait on the latency of one write. Three
/// measured best on file disks (two: 0.9x of it, four: no better, and a slower destage).
const IN_FLIGHT: usize = 3;
/// Writes queued before a second batch starts beside the one in flight: fewer wait for the
/// next batch rather than pay a header block of their own.
const SECOND_BATCH_MIN: usize = 2;

/// What `status` reports.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct CacheStatus {
    /// Pool positions of the disks that hold the log.
    pub devices: Vec<u32>,
    /// Size of the log on each disk.
    pub log_bytes: u64,
    /// Log space in use (dirty data, and destaged data whose space is not reused yet).
    pub log_used_bytes: u64,
    /// Data not yet written to the layouts.
    pub dirty_bytes: u64,
    /// False when fewer than two cache disks are left: resilient vdisks then write through.
    pub redundant: bool,
    pub cached_writes: u64,
    pub cached_bytes: u64,
    /// Batches written to the log: cached writes per batch is how well writes are grouped.
    pub log_batches: u64,
    pub write_through_writes: u64,
    /// Bytes read from the log.
    pub read_hit_bytes: u64,
    pub destaged_bytes: u64,
    /// Bytes written to the log that a later write replaced before they were destaged.
    pub overwritten_bytes: u64,
    /// Writes that waited for the destager (the cache or the vdisk's budget was full).
    pub throttled_writes: u64,
    pub destage_errors: u64,
    /// Destage rounds run, and the most bytes one wrote (whole rows at their length): what a
    /// writer waiting for room may have to wait for.
    pub destage_rounds: u64,
    pub largest_destage_round_bytes: u64,
    /// Data lost in the log before it was destaged (its last disk failed, or every copy of a
    /// block rotted): reads of it fail until it is written again.
    #[serde(default)]
    pub lost_bytes: u64,
    /// Writes the log held for slab sets that only disks able to come back can take (missing
    /// since the import, or taken out by an I/O error while the pool ran),
    /// parked in the pool's metadata: reads and writes of them are refused until those disks
    /// are back (`disk online`), when they are written to their sets.
    #[serde(default)]
    pub parked_bytes: u64,
}

#[derive(Default)]
struct Counters {
    cached_writes: AtomicU64,
    cached_bytes: AtomicU64,
    log_batches: AtomicU64,
    write_through: AtomicU64,
    read_hit_bytes: AtomicU64,
    destaged_bytes: AtomicU64,
    overwritten_bytes: AtomicU64,
    throttled: AtomicU64,
    destage_errors: AtomicU64,
    destage_rounds: AtomicU64,
    largest_round: AtomicU64,
}

/// The bounds of a destage round (see `ROUND_BYTES`): the oldest batches' data, pieces
/// written alone, whole rows.
#[derive(Clone, Copy)]
pub(crate) struct RoundBounds {
    pub oldest_bytes: u64,
    pub pieces: usize,
    pub row_bytes: u64,
}

/// A batch in the live part of the log.
struct Batch {
    pos: u64,
    len: u64,
    /// Bytes of it that the index holds dirty.
    dirty: u64,
    /// Its entries: (set, offset, length).
    entries: Vec<(u32, u64, u64)>,
    /// Checksum of every data block.
    crcs: Vec<u32>,
    /// False while it is being written: not in the index yet.
    sealed: bool,
    at: Instant,
}

impl Batch {
    fn data_pos(&self) -> u64 {
        self.pos + BLOCK as u64
    }
}

struct State {
    devices: Vec<(u32, DiskRef)>,
    area: u64,
    generation: u64,
    pool_id: [u8; 16],
    index: HashMap<u32, SetIndex>,
    batches: BTreeMap<u64, Batch>,
    head: u64,
    next_seq: u64,
    /// Batches placed in the ring and not yet indexed (or failed), by sequence number.
    in_flight: BTreeSet<u64>,
    /// The first batch that failed on every disk while later ones were in flight, and its
    /// place: those fail too, and the ring ends there again once the last has finished.
    broken: Option<(u64, u64)>,
    /// Every batch of this generation below this sequence number was made durable by a flush
    /// that completed: each new batch's header says so (`Header::flushed_below`), which lets a
    /// replay tell an older batch that rotted from one a crash tore.
    flushed_below: u64,
    /// Log bytes the live batches take.
    used: u64,
    dirty: u64,
    vdisk_dirty: HashMap<u64, u64>,
    budgets: HashMap<u64, u64>,
    /// Writers waiting for room.
    waiting: usize,
    /// Callers that want everything destaged.
    draining: usize,
    /// The destager goes only for room (`WriteCache::hold_destage`).
    held_back: bool,
    /// Data lost with the log's last disk (lost.rs): refused to readers until written again.
    lost: LostRanges,
    /// What the pool's metadata holds of it: a loss is recorded there at once, a range written
    /// again is cut from it only once that write is durable (by the next flush).
    lost_saved: LostRanges,
    /// Lost ranges written again since the last flush took them.
    lost_cuts: LostRanges,
    /// The writes the live log holds, and which of them the metadata records (held.rs).
    held: Held,
    /// Ranges of writes parked in the metadata until disks that are away are back (parked.rs):
    /// refused to readers and writers until written to their sets.
    parked: LostRanges,
}

impl State {
    /// Every batch below this sequence number is written (or failed, and never acknowledged):
    /// a flush of the log's disks begun now makes all of them durable.
    fn written_below(&self) -> u64 {
        let mut below = self.in_flight.first().copied().unwrap_or(self.next_seq);
        // A failed batch is out of flight already; its number is given again.
        if let Some((first, _)) = self.broken {
            below = below.min(first);
        }
        below
    }

    /// `[a, b)` of `set` is lost: refused to readers, and recorded in the record to save.
    fn lose(&mut self, set: u32, a: u64, b: u64) {
        self.lost.insert(set, a, b);
        self.lost_saved.insert(set, a, b);
    }

    fn used(&self) -> u64 {
        self.used
    }

    fn tail_pos(&self) -> u64 {
        self.batches.values().next().map(|b| b.pos).unwrap_or(self.head)
    }

    fn budget(&self, vdisk: u64) -> u64 {
        self.budgets.get(&vdisk).copied().unwrap_or(DEFAULT_VDISK_CACHE)
    }

    /// Forgets a dirty piece's bytes (destaged, replaced or dropped).
    fn undirty(&mut self, p: &Piece) {
        if !p.dirty {
            return;
        }
        if let Some(b) = self.batches.get_mut(&p.seq) {
            b.dirty -= p.len;
        }
        if let Some(d) = self.vdisk_dirty.get_mut(&p.vdisk) {
            *d -= p.len;
        }
        self.dirty -= p.len;
    }

    fn overlaps(&self, set: u32, a: u64, b: u64) -> bool {
        self.index.get(&set).is_some_and(|ix| !ix.overlapping(a, b).is_empty())
    }

    fn record(&self) -> LogRecord {
        LogRecord {
            generation: self.generation,
            tail: self.tail_pos(),
            seq: self.batches.keys().next().copied().unwrap_or(self.next_seq),
            devices: self.devices.iter().map(|(p, _)| *p).collect(),
            area: self.area,
        }
    }

    /// Whether the destager must go at full speed: writers wait for room, a caller waits for
    /// everything to be destaged, or the log is nearly full.
    fn urgent(&self) -> bool {
        self.dirty > 0 && (self.waiting > 0 || self.draining > 0 || self.used() >= self.area / 4 * 3)
    }

    fn due(&self, max_age: Duration) -> bool {
        if self.dirty == 0 {
            return false;
        }
        let for_room = self.waiting > 0
            || self.draining > 0
            || self.dirty >= self.area / 2
            || self.used() >= self.area / 2
            // A vdisk three quarters through its budget: destaging now keeps it from waiting.
            || self.vdisk_dirty.iter().any(|(v, d)| *d >= self.budget(*v) / 4 * 3);
        if self.held_back {
            return for_room;
        }
        for_room
            || self.devices.len() < COPIES
            || self
                .batches
                .values()
                .find(|b| b.dirty > 0)
                .is_some_and(|b| b.at.elapsed() >= max_age)
    }
}

/// A write waiting for the batch that carries it.
struct Pending {
    done: Arc<Completion>,
    set: u32,
    offset: u64,
    vdisk: u64,
    data: Vec<u8>,
}

/// Where a queued write learns how its batch went. One per writer, so that a batch written
/// wakes its own writers only, not every writer queued for the batches after it.
#[derive(Default)]
struct Completion {
    /// The sequence number of the batch that holds the write, or why it failed.
    result: Mutex<Option<Result<u64, String>>>,
    cv: Condvar,
}

impl Completion {
    fn set(&self, r: Result<u64, String>) {
        *self.result.lock() = Some(r);
        self.cv.notify_one();
    }

    fn wait(&self) -> Result<u64, String> {
        let mut r = self.result.lock();
        loop {
            if let Some(x) = r.take() {
                return x;
            }
            self.cv.wait(&mut r);
        }
    }
}

#[derive(Default)]
struct Appender {
    queue: Vec<Pending>,
    /// Writers writing batches for the queue: at most `IN_FLIGHT`.
    leaders: usize,
}

struct Inner {
    layouts: Arc<Layouts>,
    pool: Arc<Pool>,
    state: Mutex<State>,
    /// Writers waiting for log space or budget; the destager wakes them.
    room: Condvar,
    /// The destager waits here for work.
    work: Condvar,
    appender: Mutex<Appender>,
    /// Held shared while a batch is written, exclusively by a change of the log's disks (so
    /// that a copy of the log onto a new disk holds every batch written).
    log_lock: RwLock<()>,
    /// The buffers batches are built in, one per batch in flight (a batch is up to 8 MiB).
    buffers: Mutex<Vec<AlignedBuf>>,
    /// Batches are indexed, and their writers answered, in the order of their sequence
    /// numbers, whichever finished writing first: waited on with `state`.
    in_order: Condvar,
    /// Held shared while log positions taken from the index are read; exclusively when log
    /// space is given back for reuse.
    reuse: RwLock<()>,
    /// One destage round at a time; a freed slab set waits for the round in flight.
    destaging: Mutex<()>,
    /// One move of the log's start at a time: two could save their records out of order, and
    /// the older one would send a replay into space already written again.
    advancing: Mutex<()>,
    /// Stripe row locks: a row written whole by a destage, against writes bypassing the cache.
    stripes: Vec<Mutex<()>>,
    /// A write went straight to the layouts since the last flush.
    layout_dirty: AtomicBool,
    /// The pool's loss count just after the log lost its last disk (0 if it never did): what
    /// the log held then, and had not destaged, is gone.
    wiped_at: AtomicU64,
    /// `State::lost` is not empty: writes must tell it what they replace.
    any_lost: AtomicBool,
    /// `State::parked` is not empty: reads and writes must look at it.
    any_parked: AtomicBool,
    /// One settle of the parked writes at a time.
    settling: Mutex<()>,
    /// The log lost its last disk, and a destage round begun before may still write what it
    /// read of the log then: the next write past the cache waits for that round first.
    wipe_fence: AtomicBool,
    /// One save of `State::lost_saved` at a time, each of it as it is then: a save never
    /// goes back to an older copy.
    lost_saving: Mutex<()>,
    /// One change of the metadata's record of the writes the log holds at a time: a write
    /// recorded by a flush is never deleted by a change computed before it.
    held_saving: Mutex<()>,
    /// One flush at a time: a flush that finds nothing new to flush must still not answer
    /// before the flush in flight, which may cover its writes, has completed.
    flushing: Mutex<()>,
    stop: AtomicBool,
    counters: Counters,
    /// Data older than this is destaged even when the cache has room, in milliseconds.
    max_age_ms: AtomicU64,
    /// When a destage job last failed, and why.
    last_failure: Mutex<Option<(Instant, String)>>,
    /// How long a writer may wait for room with no progress made for it, while destage
    /// jobs fail, before it is failed, in milliseconds.
    stall_limit_ms: AtomicU64,
    round_bounds: Mutex<RoundBounds>,
}

/// The write-back cache of a pool (a pass-through when the pool has no cache disk).
pub struct WriteCache {
    inner: Arc<Inner>,
    destager: Mutex<Option<JoinHandle<()>>>,
}

impl WriteCache {
    /// Opens the pool's cache: replays the log, destages what it held, and starts a new
    /// generation of the log on the pool's healthy cache disks (two if it has them).
    pub fn open(layouts: Arc<Layouts>) -> Result<WriteCache> {
        let pool = layouts.pool().clone();
        let pool_id = *pool.id().as_bytes();
        let mut healthy = pool.cache_disks();
        let record = log::load_record(&pool)?;
        let mut st = State {
            devices: Vec::new(),
            area: 0,
            generation: 1,
            pool_id,
            index: HashMap::new(),
            batches: BTreeMap::new(),
            head: 0,
            next_seq: 1,
            in_flight: BTreeSet::new(),
            broken: None,
            flushed_below: 0,
            used: 0,
            dirty: 0,
            vdisk_dirty: HashMap::new(),
            budgets: HashMap::new(),
            waiting: 0,
            draining: 0,
            held_back: false,
            lost: LostRanges::load(&pool)?,
            lost_saved: LostRanges::default(),
            lost_cuts: LostRanges::default(),
            held: Held::default(),
            parked: LostRanges::default(),
        };
        let (parked_ranges, unreadable_parked) = parked::load_ranges(&pool)?;
        st.parked = parked_ranges;
        // Records of a set freed since (whose deletion failed then) go before a new set can
        // take its number: they would be written into it.
        let mut freed: Vec<u32> = st
            .parked
            .sets()
            .into_iter()
            .filter(|&s| layouts.set(s).is_err())
            .collect();
        for set in unreadable_parked {
            match layouts.set(set) {
                Ok(s) => {
                    error!(pool = %pool.name(), set, "a record of the writes parked for a slab set cannot be read: the set's whole capacity is refused, and recorded lost once its disks are back and the records that read are written");
                    st.parked.insert(set, 0, s.spec.set_capacity(pool.slab_size()));
                }
                Err(_) => freed.push(set),
            }
        }
        if !freed.is_empty() {
            let mut b = tessera_pool::MetaBatch::new();
            for &set in &freed {
                parked::delete_set(&mut b, set);
                st.parked.remove_set(set);
            }
            pool.meta().commit(b, true)?;
        }
        if !st.parked.is_empty() {
            warn!(pool = %pool.name(), bytes = st.parked.bytes(), "writes the write-back log held for slab sets beyond their tolerance wait for disks that are away: reads and writes of them are refused until those disks are back");
        }
        // Lost ranges of a set freed since (whose record's rewrite failed then) go too: a set
        // made later under its number would have its reads refused there.
        let freed: Vec<u32> = st
            .lost
            .sets()
            .into_iter()
            .filter(|&s| layouts.set(s).is_err())
            .collect();
        if !freed.is_empty() {
            for &set in &freed {
                st.lost.remove_set(set);
            }
            st.lost.save(&pool)?;
            info!(pool = %pool.name(), sets = ?freed, "lost ranges of freed slab sets are forgotten");
        }
        st.lost_saved = st.lost.clone();
        if !st.lost.is_empty() {
            warn!(pool = %pool.name(), bytes = st.lost.bytes(), "data lost with the write-back log's disks is still unwritten: reads of it fail until it is written again");
        }
        let mut replayed = Vec::new();
        // The log could not be read past the batches replayed, from this sequence number on,
        // and the disks whose reads failed there.
        let mut unread_from = None;
        let mut failed_reads = Vec::new();
        if let Some(rec) = &record {
            st.area = rec.area;
            st.generation = rec.generation;
            // A retired disk still reads: the last copy of a log being retired.
            st.devices = rec
                .devices
                .iter()
                .filter_map(|&p| pool.readable_disk(p).map(|d| (p, d)))
                .collect();
            // A ring larger than a disk of it holds was never written there: the record is
            // damaged, and its writes are refused rather than replayed from past the disk's end
            // (or taken for lost).
            if let Some((_, d)) = st.devices.iter().find(|(_, d)| ring_room(d) < rec.area) {
                return Err(CacheError::Log(format!(
                    "the log record holds a ring of {} bytes, more than its disk {} holds ({} bytes): it is damaged",
                    rec.area,
                    d.path(),
                    ring_room(d)
                )));
            }
            if st.devices.is_empty() && !rec.devices.is_empty() {
                error!(pool = %pool.name(), disks = ?rec.devices, "no disk of the write-back log is readable: writes it held and had not destaged are lost");
            }
            let r = log::replay(&st.devices, rec, pool_id);
            st.head = r.head;
            st.next_seq = rec.seq + r.found.len() as u64;
            // A log that lost its disks while the pool ran recorded what it lost then.
            if r.unreadable && !rec.devices.is_empty() {
                unread_from = Some(st.next_seq);
                failed_reads = r.failed_reads;
            }
            replayed = r.found;
        }
        let any_lost = !st.lost.is_empty();
        let any_parked = !st.parked.is_empty();
        let inner = Arc::new(Inner {
            layouts,
            pool: pool.clone(),
            state: Mutex::new(st),
            room: Condvar::new(),
            work: Condvar::new(),
            appender: Mutex::new(Appender::default()),
            log_lock: RwLock::new(()),
            buffers: Mutex::new(Vec::new()),
            in_order: Condvar::new(),
            reuse: RwLock::new(()),
            destaging: Mutex::new(()),
            advancing: Mutex::new(()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            layout_dirty: AtomicBool::new(false),
            wiped_at: AtomicU64::new(0),
            any_lost: AtomicBool::new(any_lost),
            any_parked: AtomicBool::new(any_parked),
            settling: Mutex::new(()),
            wipe_fence: AtomicBool::new(false),
            lost_saving: Mutex::new(()),
            held_saving: Mutex::new(()),
            flushing: Mutex::new(()),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            max_age_ms: AtomicU64::new(MAX_AGE.as_millis() as u64),
            last_failure: Mutex::new(None),
            stall_limit_ms: AtomicU64::new(STALL_LIMIT.as_millis() as u64),
            round_bounds: Mutex::new(RoundBounds {
                oldest_bytes: ROUND_BYTES,
                pieces: ROUND_PIECES,
                row_bytes: ROUND_ROW_BYTES,
            }),
        });
        let replaying = !replayed.is_empty();
        if replaying {
            let bytes: u64 = replayed.iter().map(|f| f.header.data_len as u64).sum();
            info!(pool = %pool.name(), batches = replayed.len(), bytes, "replaying the write-back log");
            let mut st = inner.state.lock();
            let mut rotten = (0, 0);
            for f in replayed {
                if f.rotten {
                    // What it held is lost, and reads of it fail rather than return what an
                    // older batch or the pool's disks hold. Marked in order: a later batch that
                    // wrote part of it again is read, as it is indexed next. A slab set freed
                    // since holds nothing to lose (and its number may be given again).
                    for e in f.header.entries.iter().filter(|e| inner.layouts.set(e.set).is_ok()) {
                        st.lose(e.set, e.offset, e.offset + e.len as u64);
                    }
                    rotten = (rotten.0 + 1, rotten.1 + f.header.data_len as u64);
                    continue;
                }
                let seq = f.header.seq;
                inner.install(&mut st, seq, f.pos, &f.header.entries, f.crcs);
            }
            drop(st);
            if rotten.0 > 0 {
                inner.any_lost.store(true, Ordering::Release);
                error!(pool = %pool.name(), batches = rotten.0, bytes = rotten.1, "batches of the write-back log that a flush had made durable are rotten on every copy: what they held is lost, and reads of it fail until it is written again");
                inner.save_lost()?;
            }
        }
        if let Some(from) = unread_from {
            // The writes the metadata says batches past the replay took are lost: the pool's
            // disks hold what was there before them. Marked once the replayed batches are
            // indexed, so that an older write among them does not count as writing them again.
            // A set freed since (whose records' delete failed then) holds nothing to lose.
            let lost: Vec<Write> = held::load(&pool)?
                .into_iter()
                .filter(|&((set, _, _), seq)| seq >= from && inner.layouts.set(set).is_ok())
                .map(|(w, _)| w)
                .collect();
            if !lost.is_empty() {
                let bytes = {
                    let mut st = inner.state.lock();
                    for &(set, at, len) in &lost {
                        st.lose(set, at, at + len);
                    }
                    st.lost.bytes()
                };
                inner.any_lost.store(true, Ordering::Release);
                error!(pool = %pool.name(), writes = lost.len(), bytes, "the write-back log held writes that no disk of it can give back: reads of them fail until they are written again");
                inner.save_lost()?;
            }
        }
        if replaying {
            // Everything the log held goes to the layouts now, so the new generation starts
            // from an empty log; what sets waiting for missing disks cannot take is parked.
            inner.destage_all()?;
            // Lost ranges the log wrote again after the loss (cut as they were indexed):
            // durable there, and destaged and flushed now.
            let cuts = std::mem::take(&mut inner.state.lock().lost_cuts);
            if !cuts.is_empty() {
                inner.save_cuts(&cuts)?;
            }
        }
        if unread_from.is_some() {
            // Found, and failing the replay's reads: not disks for the next log (what was
            // replayed before is destaged). A copy that read is kept.
            let unreadable: Vec<(u32, DiskRef)> = {
                let mut st = inner.state.lock();
                let (failed, kept) = std::mem::take(&mut st.devices)
                    .into_iter()
                    .partition(|(p, _)| failed_reads.contains(p));
                st.devices = kept;
                failed
            };
            for (p, d) in &unreadable {
                error!(pool = %pool.name(), disk = d.path(), "the write-back log cannot be read from this disk: it is failed");
                pool.set_disk_state(
                    *p,
                    DiskState::Failed,
                    Some("the write-back log cannot be read from it".into()),
                )?;
            }
            if !unreadable.is_empty() {
                healthy = pool.cache_disks();
            }
        }
        {
            let mut st = inner.state.lock();
            st.batches.clear();
            st.used = 0;
            st.index.clear();
            st.held.clear();
            st.generation += 1;
            st.flushed_below = 0;
            // A retired disk that held the log's last copy leaves it now.
            st.devices.retain(|(p, _)| healthy.iter().any(|(h, _)| h == p));
            inner.choose_devices(&mut st, &healthy)?;
            // A pool that never had a cache disk has nothing to record. The new generation
            // holds nothing: what the old one held is destaged, or recorded lost.
            if record.is_some() || !st.devices.is_empty() {
                let mut b = tessera_pool::MetaBatch::new();
                held::delete_all(&mut b);
                log::save_record_with(&pool, &st.record(), b)?;
            }
        }
        let cache = WriteCache {
            inner: inner.clone(),
            destager: Mutex::new(None),
        };
        // Parked writes whose disks are back: those of an earlier open, with what this one
        // parked after them for the same sets.
        inner.settle_parked(true);
        let worker = inner.clone();
        let h = std::thread::Builder::new()
            .name("tessera-destage".into())
            .spawn(move || worker.destage_loop())
            .map_err(|e| CacheError::Log(format!("cannot start the destager: {e}")))?;
        *cache.destager.lock() = Some(h);
        Ok(cache)
    }

    pub fn layouts(&self) -> &Arc<Layouts> {
        &self.inner.layouts
    }

    /// True when the pool has a log to cache writes in.
    pub fn active(&self) -> bool {
        !self.inner.state.lock().devices.is_empty()
    }

    /// Sets how much dirty data `vdisk` may hold in the cache (0: its writes bypass it).
    pub fn set_budget(&self, vdisk: u64, bytes: u64) {
        self.inner.state.lock().budgets.insert(vdisk, bytes);
        self.inner.room.notify_all();
    }

    /// How long data may wait in the cache while it has room (default 10 s). Shorter: less
    /// to replay after a crash; longer: more overwrites merged and more rows gathered.
    pub fn set_destage_delay(&self, d: Duration) {
        self.inner.max_age_ms.store(d.as_millis() as u64, Ordering::Relaxed);
        self.inner.work.notify_all();
    }

    /// Holds the destager (or lets it go again) to what room requires: writers waiting, a
    /// drain, the log half full, a vdisk near its budget. Meanwhile data stays in the log
    /// whatever its age, also in a log of one copy (which is otherwise destaged at once): for
    /// tests of what the log holds.
    pub fn hold_destage(&self, held: bool) {
        self.inner.state.lock().held_back = held;
        self.inner.work.notify_all();
    }

    /// How long a writer waiting for room (log space, or its vdisk's budget) may see nothing
    /// made for it, while destage jobs fail, before it is failed instead (default 20 s).
    pub fn set_stall_limit(&self, d: Duration) {
        self.inner.stall_limit_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// Sets the bounds of a destage round: the oldest batches' data, the pieces written alone
    /// and the whole rows (defaults 32 MiB, 2,048 and 128 MiB). Smaller rounds flush more often
    /// and let a waiting writer go sooner; tests make them small to see that they hold.
    pub fn set_round_bounds(&self, oldest_bytes: u64, pieces: usize, row_bytes: u64) {
        *self.inner.round_bounds.lock() = RoundBounds {
            oldest_bytes: oldest_bytes.max(1),
            pieces: pieces.max(1),
            row_bytes,
        };
    }

    /// True if the log holds data of `[offset, offset + len)` of `set` not yet destaged: a
    /// read of that range must come through [`read_many`](Self::read_many), not straight from
    /// the member disks.
    pub fn holds_dirty(&self, set: u32, offset: u64, len: u64) -> bool {
        let st = self.inner.state.lock();
        // Lost and parked data must be refused by `read_many`, not read as the disks hold it.
        st.lost.overlaps(set, offset, offset + len)
            || st.parked.overlaps(set, offset, offset + len)
            || st.dirty > 0
                && st
                    .index
                    .get(&set)
                    .is_some_and(|ix| ix.overlapping(offset, offset + len).iter().any(|(_, p)| p.dirty))
    }

    /// True if a write would go straight to the member disks with nothing of the cache to
    /// do: no cache disk, nothing in the log, and nothing parked (a write over parked data
    /// must be refused by [`write`](Self::write)). A caller that then writes the disks itself
    /// (a planned write) tells the cache with [`wrote_through`](Self::wrote_through).
    pub fn passes_through(&self) -> bool {
        let i = &self.inner;
        let st = i.state.lock();
        st.devices.is_empty() && st.index.is_empty() && st.parked.is_empty() && {
            drop(st);
            // After a loss of the log, only once the destage round in flight then is over.
            !i.wipe_fence.load(Ordering::Acquire)
                || i.destaging.try_lock().is_some_and(|_d| {
                    i.wipe_fence.store(false, Ordering::Release);
                    true
                })
        }
    }

    /// Records a write that went to the member disks past the cache (as
    /// [`write`](Self::write) does for one it does not take), once it completed: the next
    /// flush flushes them.
    pub fn wrote_through(&self) {
        self.inner.layout_dirty.store(true, Ordering::Release);
        self.inner.counters.write_through.fetch_add(1, Ordering::Relaxed);
    }

    /// Dirty bytes `vdisk` holds in the cache.
    pub fn dirty_bytes(&self, vdisk: u64) -> u64 {
        self.inner.state.lock().vdisk_dirty.get(&vdisk).copied().unwrap_or(0)
    }

    /// Writes `data` at `offset` of `set` for `vdisk`: into the log when the cache takes it
    /// (then readable at once, and durable at the next flush), else to the layouts.
    pub fn write(&self, vdisk: u64, set: &SlabSet, offset: u64, data: &[u8]) -> Result<()> {
        let i = &self.inner;
        let end = offset + data.len() as u64;
        let (cached, one_copy, active) = {
            let st = i.state.lock();
            // Written before the parked data, it would be undone when that is written. Asked
            // in the same look as the log's pieces: a destage round parks only what the log
            // holds, so a write that finds neither here can go past the log.
            if i.any_parked.load(Ordering::Acquire) && st.parked.overlaps(set.id, offset, end) {
                return Err(waiting(set.id, offset, end));
            }
            let takes = !st.devices.is_empty()
                && (set.spec.tolerance() == 0 || st.devices.len() >= COPIES)
                && st.budget(vdisk) > 0;
            // A range the log still holds must go through the log, even when this write
            // would bypass it: the replay would otherwise bring the older copy back.
            let cached = takes || (!st.devices.is_empty() && st.overlaps(set.id, offset, end));
            // Forced into a log of one copy, which is less than the set tolerates losing.
            let one_copy = cached && set.spec.tolerance() > 0 && st.devices.len() < COPIES;
            (cached, one_copy, !st.devices.is_empty() || !st.index.is_empty())
        };
        if !cached {
            if i.wipe_fence.load(Ordering::Acquire) {
                // Not under a destage round that read the lost log before it went.
                let _d = i.destaging.lock();
                i.wipe_fence.store(false, Ordering::Release);
            }
            // Not between a whole-row destage's read of the row and its write back.
            let mut stripes: Vec<usize> = Vec::new();
            if active && set.spec.parity_columns() > 0 {
                let row = set.spec.row_bytes();
                let mut at = offset / row * row;
                while at < end {
                    stripes.push(stripe_index(set.id, at));
                    at += row;
                }
                stripes.sort_unstable();
                stripes.dedup();
            }
            let _held: Vec<_> = stripes.iter().map(|&k| i.stripes[k].lock()).collect();
            i.layouts.write(set, offset, data)?;
            i.layout_dirty.store(true, Ordering::Release);
            i.written_again(set.id, offset, end);
            i.counters.write_through.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if i.layouts.refuses_writes(set) {
            // The layout refuses it (the write says why): the log, which could never destage
            // it, must not answer for it.
            i.layouts.write(set, offset, data)?;
        }
        let mut seqs = Vec::new();
        for (n, chunk) in data.chunks(MAX_BATCH).enumerate() {
            i.wait_for_budget(vdisk, chunk.len() as u64)?;
            seqs.push(i.append(set.id, offset + (n * MAX_BATCH) as u64, vdisk, chunk)?);
        }
        if one_copy {
            i.write_behind_the_log(set, offset, data, &seqs)?;
        }
        i.counters.cached_writes.fetch_add(1, Ordering::Relaxed);
        i.counters.cached_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// True if `[offset, offset + len)` of `set` holds data lost with the log's last disk: a
    /// write of it must come through [`write`](Self::write), which records that it replaced it.
    pub fn holds_lost(&self, set: u32, offset: u64, len: u64) -> bool {
        self.inner.any_lost.load(Ordering::Acquire) && self.inner.state.lock().lost.overlaps(set, offset, offset + len)
    }

    /// The parts of `[offset, offset + len)` of `set` that hold data lost with the log (see
    /// [`holds_lost`](Self::holds_lost)), in order.
    pub fn lost_within(&self, set: u32, offset: u64, len: u64) -> Vec<(u64, u64)> {
        if !self.inner.any_lost.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.inner.state.lock().lost.within(set, offset, offset + len)
    }

    pub fn read(&self, set: &SlabSet, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_many(&mut [SetRead { set, offset, buf }])
            .pop()
            .expect("one result per read")
    }

    /// Reads every request, with what the log holds dirty laid over what the layouts hold.
    pub fn read_many(&self, reqs: &mut [SetRead<'_>]) -> Vec<Result<()>> {
        let i = &self.inner;
        let _reuse = i.reuse.read();
        // Per request: the dirty pieces over it, with their blocks' checksums.
        let mut lost = Vec::new();
        let mut parked = Vec::new();
        let plan: Vec<Vec<(u64, Piece, Vec<u32>)>> = {
            let st = i.state.lock();
            if !st.parked.is_empty() {
                parked = reqs
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| st.parked.overlaps(r.set.id, r.offset, r.offset + r.buf.len() as u64))
                    .map(|(n, _)| n)
                    .collect();
            }
            if !st.lost.is_empty() {
                lost = reqs
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| st.lost.overlaps(r.set.id, r.offset, r.offset + r.buf.len() as u64))
                    .map(|(n, _)| n)
                    .collect();
            }
            if st.dirty == 0 && lost.is_empty() && parked.is_empty() {
                drop(st);
                return i
                    .layouts
                    .read_many(reqs)
                    .into_iter()
                    .map(|r| r.map_err(Into::into))
                    .collect();
            }
            reqs.iter()
                .map(|r| match st.index.get(&r.set.id) {
                    None => Vec::new(),
                    Some(ix) => ix
                        .overlapping(r.offset, r.offset + r.buf.len() as u64)
                        .into_iter()
                        .filter(|(_, p)| p.dirty)
                        .map(|(s, p)| (s, p, piece_crcs(&st, &p)))
                        .collect(),
                })
                .collect()
        };
        let mut results: Vec<Result<()>> = reqs.iter().map(|_| Ok(())).collect();
        // From the layouts: every request the log does not cover whole.
        let partial: Vec<usize> = (0..reqs.len())
            .filter(|&n| plan[n].iter().map(|(_, p, _)| p.len).sum::<u64>() < reqs[n].buf.len() as u64)
            .collect();
        if !partial.is_empty() {
            let mut io: Vec<SetRead> = Vec::with_capacity(partial.len());
            let mut rest: &mut [SetRead] = reqs;
            let mut at = 0;
            for &n in &partial {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(n - at);
                let (r, tail) = tail.split_first_mut().expect("index in range");
                io.push(SetRead {
                    set: r.set,
                    offset: r.offset,
                    buf: &mut *r.buf,
                });
                rest = tail;
                at = n + 1;
            }
            for (n, res) in partial.iter().zip(i.layouts.read_many(&mut io)) {
                results[*n] = res.map_err(Into::into);
            }
        }
        let devices = i.state.lock().devices.clone();
        for (n, r) in reqs.iter_mut().enumerate() {
            for (s, p, crcs) in &plan[n] {
                match log::read_verified(&devices, p.log, crcs) {
                    Ok(data) => {
                        let at = (s - r.offset) as usize;
                        r.buf[at..at + p.len as usize].copy_from_slice(&data);
                        i.counters.read_hit_bytes.fetch_add(p.len, Ordering::Relaxed);
                    }
                    Err(e) => results[n] = Err(e),
                }
            }
        }
        for n in lost {
            results[n] = Err(CacheError::Lost(format!(
                "the data at bytes {}..{} of slab set {} is lost: the write-back log lost it before it reached the pool's disks (its disks failed, or every copy of it rotted); it reads again once written again",
                reqs[n].offset,
                reqs[n].offset + reqs[n].buf.len() as u64,
                reqs[n].set.id
            )));
        }
        for n in parked {
            let r = &reqs[n];
            results[n] = Err(waiting(r.set.id, r.offset, r.offset + r.buf.len() as u64));
        }
        results
    }

    /// Makes every write acknowledged before the call durable: in the log (one flush of each
    /// of its disks) or, for writes that bypassed the cache, in the layouts.
    pub fn flush(&self) -> Result<()> {
        let i = &self.inner;
        let _one = i.flushing.lock();
        // Lost ranges written again before this flush: durable once it succeeds; and the
        // batches written before it, whose writes the record of held ones below takes.
        let (cuts, covered) = {
            let mut st = i.state.lock();
            (std::mem::take(&mut st.lost_cuts), st.written_below())
        };
        // What the log took since the last flush is recorded as the disks flush (were the
        // log's disks all gone at the next open, the record would say what they held): the
        // flush answers once both are durable, in the time of the slower.
        let (held, r) = if i.state.lock().held.has_unsaved() {
            std::thread::scope(|sc| {
                match std::thread::Builder::new().spawn_scoped(sc, || i.save_held()) {
                    Ok(held) => {
                        let r = self.flush_disks();
                        (held.join().expect("the record of the log's writes saved"), r)
                    }
                    // No thread to spare: one after the other.
                    Err(_) => (i.save_held(), self.flush_disks()),
                }
            })
        } else {
            (Ok(()), self.flush_disks())
        };
        // A disk of the log failed: another takes its place, whatever else failed.
        let refresh = matches!(r, Ok(true));
        let r = held.and(r);
        if r.is_ok() {
            let mut st = i.state.lock();
            st.flushed_below = st.flushed_below.max(covered);
        }
        let mut saved = Ok(());
        if !cuts.is_empty() {
            if r.is_ok() {
                saved = i.save_cuts(&cuts);
            }
            // Not recorded: the next flush tries again (and fails while it cannot).
            if r.is_err() || saved.is_err() {
                let mut st = i.state.lock();
                for (set, a, b) in cuts.ranges() {
                    st.lost_cuts.insert(set, a, b);
                }
            }
        }
        drop(_one);
        if refresh {
            self.refresh_devices()?;
        }
        r?;
        saved
    }

    /// Flushes the layouts if written past the cache, and every disk of the log; true if a
    /// disk of the log failed (and left it) while another held it.
    fn flush_disks(&self) -> Result<bool> {
        let i = &self.inner;
        if i.layout_dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = i.layouts.flush() {
                i.layout_dirty.store(true, Ordering::Release);
                return Err(e.into());
            }
        }
        let devices = i.state.lock().devices.clone();
        if devices.is_empty() {
            return Ok(false);
        }
        let mut flushed = 0;
        for (p, d) in &devices {
            match d.flush() {
                Ok(()) => flushed += 1,
                Err(e) => i.lose_device(*p, &format!("flush failed: {e}")),
            }
        }
        if flushed == 0 {
            return Err(CacheError::Log(
                "every disk of the write-back log failed its flush: cached writes may be lost".into(),
            ));
        }
        Ok(flushed < devices.len())
    }

    /// Whether a write into `set` begun when the pool's loss count was `noted` (see
    /// `Pool::losses`) may have been lost since, though a flush succeeded after it: the set
    /// lost more members than it tolerates (a set without redundancy: any member, even one
    /// back by now), or the log lost its last disk, after the write began. A caller's flush
    /// asks this of every set it wrote since its last flush.
    pub fn lost_since(&self, set: &SlabSet, noted: u64) -> bool {
        self.inner.wiped_at.load(Ordering::SeqCst) > noted || self.inner.layouts.lost_since(set, noted)
    }

    /// Destages everything the cache holds, and flushes the layouts.
    pub fn drain(&self) -> Result<()> {
        self.inner.destage_all()
    }

    /// Drops what the cache holds for a slab set about to be freed (nothing in it is
    /// referenced any more), after the destage round in flight.
    pub fn forget_set(&self, set: u32) {
        let i = &self.inner;
        let _d = i.destaging.lock();
        let mut st = i.state.lock();
        if let Some(ix) = st.index.remove(&set) {
            for (_, p) in ix.overlapping(0, u64::MAX) {
                st.undirty(&p);
            }
        }
        // What it lost is no one's any more; a set made later under its number starts clean.
        let had_lost = st.lost_saved.remove_set(set) | st.lost.remove_set(set);
        st.lost_cuts.remove_set(set);
        let had_parked = st.parked.remove_set(set);
        drop(st);
        if had_parked {
            let mut b = tessera_pool::MetaBatch::new();
            parked::delete_set(&mut b, set);
            if let Err(e) = i.pool.meta().commit(b, true) {
                warn!(pool = %i.pool.name(), set, error = %e, "cannot delete the writes parked for a freed slab set");
            }
        }
        i.room.notify_all();
        {
            let _held = i.held_saving.lock();
            i.state.lock().held.forget_set(set);
            let mut b = tessera_pool::MetaBatch::new();
            held::delete_set(&mut b, set);
            if let Err(e) = i.pool.meta().commit(b, true) {
                warn!(pool = %i.pool.name(), set, error = %e, "cannot delete the record of a freed slab set's writes in the write-back log");
            }
        }
        if had_lost {
            if let Err(e) = i.save_lost() {
                error!(pool = %i.pool.name(), set, error = %e, "cannot record that a freed slab set holds no lost data");
            }
        }
    }

    /// Writes the parked writes (parked.rs) of sets whose disks are back, and records lost
    /// those of sets whose disks failed instead; called when a disk comes back or fails.
    /// Returns the bytes still parked.
    pub fn settle_parked(&self) -> u64 {
        self.inner.settle_parked(true)
    }

    /// Takes in changes of the pool's cache disks: a log disk that failed or was retired
    /// leaves the log (a retired one after everything it held is destaged, if it was the last
    /// copy), and a healthy cache disk joins it, with a copy of the live log, while the log
    /// has fewer than two copies.
    pub fn refresh_devices(&self) -> Result<()> {
        let i = &self.inner;
        let _log = i.log_lock.write();
        let healthy = i.pool.cache_disks();
        let leaving: Vec<u32> = {
            let st = i.state.lock();
            st.devices
                .iter()
                .filter(|(p, _)| !healthy.iter().any(|(h, _)| h == p))
                .map(|(p, _)| *p)
                .collect()
        };
        if !leaving.is_empty() {
            let readable_left = {
                let st = i.state.lock();
                st.devices.iter().filter(|(p, _)| !leaving.contains(p)).count()
            };
            if readable_left == 0 {
                // The last copy: destage it while it can still be read (a retired disk can).
                i.destage_all()?;
            }
            i.state.lock().devices.retain(|(p, _)| !leaving.contains(p));
            i.save_log_record()?;
            warn!(pool = %i.pool.name(), disks = ?leaving, "disks left the write-back log");
        }
        i.choose_devices(&mut i.state.lock(), &healthy)?;
        i.save_log_record()?;
        i.work.notify_all();
        Ok(())
    }

    pub fn status(&self) -> CacheStatus {
        let i = &self.inner;
        let st = i.state.lock();
        let c = &i.counters;
        CacheStatus {
            devices: st.devices.iter().map(|(p, _)| *p).collect(),
            log_bytes: st.area,
            log_used_bytes: st.used(),
            dirty_bytes: st.dirty,
            redundant: st.devices.len() >= COPIES,
            cached_writes: c.cached_writes.load(Ordering::Relaxed),
            cached_bytes: c.cached_bytes.load(Ordering::Relaxed),
            log_batches: c.log_batches.load(Ordering::Relaxed),
            write_through_writes: c.write_through.load(Ordering::Relaxed),
            read_hit_bytes: c.read_hit_bytes.load(Ordering::Relaxed),
            destaged_bytes: c.destaged_bytes.load(Ordering::Relaxed),
            overwritten_bytes: c.overwritten_bytes.load(Ordering::Relaxed),
            throttled_writes: c.throttled.load(Ordering::Relaxed),
            destage_errors: c.destage_errors.load(Ordering::Relaxed),
            destage_rounds: c.destage_rounds.load(Ordering::Relaxed),
            largest_destage_round_bytes: c.largest_round.load(Ordering::Relaxed),
            lost_bytes: st.lost.bytes(),
            parked_bytes: st.parked.bytes(),
        }
    }

    /// Stops the destager. What the log holds stays there for the next open to replay.
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.work.notify_all();
        self.inner.room.notify_all();
        if let Some(h) = self.destager.lock().take() {
            let _ = h.join();
        }
        // A settle under way (on a thread of its own) writes nothing past the stop.
        drop(self.inner.settling.lock());
    }
}

impl Drop for WriteCache {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a read or write of a range parked for disks that are away gets.
fn waiting(set: u32, a: u64, b: u64) -> CacheError {
    CacheError::Waiting(format!(
        "bytes {a}..{b} of slab set {set} hold writes the write-back log kept for disks that are away (missing since the pool's import, or taken out by an I/O error); they are refused until those disks are back ('tessera disk online', or for a missing disk an import that finds it) and the writes written to them"
    ))
}

/// The space a disk offers the ring: what lies past its label area, in whole blocks.
fn ring_room(d: &DiskRef) -> u64 {
    d.size().saturating_sub(DATA_OFFSET) / BLOCK as u64 * BLOCK as u64
}

/// The checksums of the blocks a piece covers.
fn piece_crcs(st: &State, p: &Piece) -> Vec<u32> {
    let b = &st.batches[&p.seq];
    let first = ((p.log - b.data_pos()) / BLOCK as u64) as usize;
    b.crcs[first..first + (p.len / BLOCK as u64) as usize].to_vec()
}

/// The log lost its last disk: every dirty range it held becomes lost (in memory and in the
/// record to save), the index and the sealed batches go (nothing is left to read them from;
/// batches still in flight fail when they finish). Returns the bytes lost.
fn take_lost(st: &mut State) -> u64 {
    let mut bytes = 0;
    let index = std::mem::take(&mut st.index);
    for (set, ix) in index {
        for (at, p) in ix.overlapping(0, u64::MAX) {
            if p.dirty {
                st.lose(set, at, at + p.len);
                bytes += p.len;
            }
        }
    }
    st.dirty = 0;
    st.vdisk_dirty.clear();
    st.held.clear();
    st.batches.retain(|_, b| !b.sealed);
    st.used = st.batches.values().map(|b| b.len).sum();
    bytes
}

impl Inner {
    /// Adds a written batch to the index: its entries replace what they cover.
    fn install(&self, st: &mut State, seq: u64, pos: u64, entries: &[Entry], crcs: Vec<u32>) {
        let mut at = pos + BLOCK as u64;
        let mut listed = Vec::with_capacity(entries.len());
        if !st.batches.contains_key(&seq) {
            let len = BLOCK as u64 + entries.iter().map(|e| e.len as u64).sum::<u64>();
            st.used += len;
            st.batches.insert(
                seq,
                Batch {
                    pos,
                    len,
                    dirty: 0,
                    entries: Vec::new(),
                    crcs: Vec::new(),
                    sealed: false,
                    at: Instant::now(),
                },
            );
        }
        st.batches.get_mut(&seq).expect("inserted").crcs = crcs;
        for e in entries {
            let len = e.len as u64;
            // Lost data written again: readable from the log from now on. Under the lock a
            // loss of the log's last disk takes it under, which then makes it lost again.
            self.cut_lost(st, e.set, e.offset, e.offset + len);
            let replaced = st.index.entry(e.set).or_default().insert(
                e.offset,
                Piece {
                    len,
                    seq,
                    log: at,
                    dirty: true,
                    vdisk: e.vdisk,
                },
            );
            for (_, p) in replaced {
                if p.dirty {
                    self.counters.overwritten_bytes.fetch_add(p.len, Ordering::Relaxed);
                }
                st.undirty(&p);
            }
            st.batches.get_mut(&seq).expect("inserted").dirty += len;
            st.held.wrote((e.set, e.offset, len), seq);
            *st.vdisk_dirty.entry(e.vdisk).or_default() += len;
            st.dirty += len;
            listed.push((e.set, e.offset, len));
            at += len;
        }
        let b = st.batches.get_mut(&seq).expect("inserted");
        b.entries = listed;
        b.sealed = true;
    }

    /// Makes the log's copies: the devices it has, then healthy cache disks up to two.
    fn choose_devices(&self, st: &mut State, healthy: &[(u32, DiskRef)]) -> Result<()> {
        for (p, d) in healthy {
            if st.devices.len() >= COPIES {
                break;
            }
            if st.devices.iter().any(|(q, _)| q == p) {
                continue;
            }
            let room = ring_room(d);
            if st.devices.is_empty() && st.batches.is_empty() {
                // A new log: the ring is as large as its disks allow.
                let smallest = healthy
                    .iter()
                    .map(|(_, d)| ring_room(d))
                    .take(COPIES)
                    .min()
                    .unwrap_or(room);
                // Not more than this disk holds: the first ones may have been passed over.
                st.area = smallest.min(room);
                st.head = 0;
            } else if room < st.area {
                warn!(
                    disk = d.path(),
                    "cache disk smaller than the write-back log: not used for it"
                );
                continue;
            }
            if st.area < MIN_CACHE_AREA {
                continue;
            }
            // The ring is written all over, round after round: its space is taken now, so that
            // a full file system under a sparse cache file refuses the disk here rather than
            // fails a log write later.
            if let Err(e) = d
                .reserve(DATA_OFFSET, st.area)
                .or_else(|e| if e.is_no_space() { Err(e) } else { Ok(()) })
            {
                warn!(pool = %self.pool.name(), disk = d.path(), error = %e, "cache disk cannot hold the write-back log: not used for it");
                continue;
            }
            if !st.batches.is_empty() {
                // From the first copy that reads.
                let mut copied = Err(CacheError::Log("no copy of the log is left to copy from".into()));
                for (_, from) in &st.devices {
                    copied = log::copy_live(from, d, st.area, st.tail_pos(), st.head);
                    if copied.is_ok() {
                        break;
                    }
                }
                copied?;
            }
            info!(pool = %self.pool.name(), disk = d.path(), "disk joins the write-back log");
            st.devices.push((*p, d.clone()));
        }
        Ok(())
    }

    /// A log disk failed: it leaves the log, and the pool records it failed.
    fn lose_device(&self, pos: u32, why: &str) {
        // Until the record of what the log held goes: no flush records a write meanwhile.
        let held_saving = self.held_saving.lock();
        let (wiped, lost, emptied) = {
            let mut st = self.state.lock();
            if !st.devices.iter().any(|(p, _)| *p == pos) {
                return;
            }
            st.devices.retain(|(p, _)| *p != pos);
            // The last copy of data not destaged yet.
            let wiped = st.devices.is_empty() && (st.dirty > 0 || !st.batches.is_empty());
            let emptied = st.devices.is_empty();
            let lost = if emptied {
                // Set under the lock a writer decides under whether its write goes past the log.
                self.wipe_fence.store(true, Ordering::Release);
                take_lost(&mut st)
            } else {
                0
            };
            if wiped {
                // Under the same lock: a flush that finds the log without disks from now on
                // answers for writes it held, and must find them lost, though the records below
                // (and the state change that counts the loss) take a while. Above every count a
                // write has noted so far; one that notes the same count meanwhile is taken for
                // lost too, on the safe side.
                self.wiped_at.fetch_max(self.pool.losses() + 1, Ordering::SeqCst);
            }
            (wiped, lost, emptied)
        };
        // First: a crash after the log's new record must still find what was lost.
        if lost > 0 {
            self.any_lost.store(true, Ordering::Release);
            error!(pool = %self.pool.name(), bytes = lost, "the write-back log lost its last disk holding data not yet destaged: reads of that data fail until it is written again");
            if let Err(e) = self.save_lost() {
                error!(pool = %self.pool.name(), error = %e, "cannot record the data lost with the write-back log: after a restart it would read as it was before");
            }
        }
        if emptied {
            // What it held is recorded lost now, as precisely as the index knew it.
            let mut b = tessera_pool::MetaBatch::new();
            held::delete_all(&mut b);
            if let Err(e) = self.pool.meta().commit(b, true) {
                warn!(pool = %self.pool.name(), error = %e, "cannot delete the record of the writes the lost write-back log held");
            }
        }
        drop(held_saving);
        if let Err(e) = self.save_log_record() {
            error!(error = %e, "cannot record the write-back log's disks");
        }
        error!(pool = %self.pool.name(), disk = pos, reason = why, "a disk of the write-back log failed");
        if let Err(e) = self.pool.set_disk_state(pos, DiskState::Failed, Some(why.to_string())) {
            error!(error = %e, "cannot record a failed cache disk");
        }
        if wiped {
            // After the state change, whose count a write that reached this disk noted below.
            self.wiped_at.fetch_max(self.pool.losses().max(1), Ordering::SeqCst);
        }
        self.room.notify_all();
        self.work.notify_all();
    }

    /// A write went into the log, of one copy, only because the log held its range (a replay
    /// would otherwise bring the older copy back over it), while its set tolerates a failure:
    /// one copy is not enough to answer it. It goes to the layouts too, and once they have
    /// flushed it its pieces in the log become clean: the log's copy now only keeps a replay
    /// from going back to older data. Clean before that flush, they would let the log's start
    /// pass the batches that hold this write and the older one it covers, while the layouts
    /// may still lose it to a power cut: the block would read as it was before both.
    /// Under `destaging`: a round that picked an older piece of the range is over, and the
    /// next can only write this data.
    fn write_behind_the_log(&self, set: &SlabSet, offset: u64, data: &[u8], seqs: &[u64]) -> Result<()> {
        let _d = self.destaging.lock();
        let noted = self.pool.losses();
        self.layouts.write(set, offset, data)?;
        self.layouts.flush()?;
        if self.layouts.lost_since(set, noted) {
            // The set lost more than it tolerates meanwhile, and may lack this write: the
            // log's copy stays dirty, for the destager to write or park, as it does its own.
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let mut st = self.state.lock();
        let mine: Vec<(u64, Piece)> = st
            .index
            .get(&set.id)
            .map(|ix| {
                ix.overlapping(offset, end)
                    .into_iter()
                    .filter(|(_, p)| p.dirty && seqs.contains(&p.seq))
                    .collect()
            })
            .unwrap_or_default();
        for (at, p) in mine {
            let cleaned = match st.index.get_mut(&set.id) {
                Some(ix) => ix.mark_clean(at, at + p.len, p.seq),
                None => Vec::new(),
            };
            for (_, c) in cleaned {
                st.undirty(&c);
            }
        }
        drop(st);
        self.room.notify_all();
        Ok(())
    }

    /// Records that lost ranges were written again (after the write completed); the record
    /// in the metadata follows at the next flush, when the write is durable.
    fn written_again(&self, set: u32, a: u64, b: u64) {
        if !self.any_lost.load(Ordering::Acquire) {
            return;
        }
        self.cut_lost(&mut self.state.lock(), set, a, b);
    }

    /// Lost data of `[a, b)` of `set` was written again: readable now, and recorded so in the
    /// metadata by the next flush (`save_cuts`).
    fn cut_lost(&self, st: &mut State, set: u32, a: u64, b: u64) {
        if st.lost.cut(set, a, b) {
            st.lost_cuts.insert(set, a, b);
            if st.lost.is_empty() {
                self.any_lost.store(false, Ordering::Release);
            }
        }
    }

    /// Makes durable that `cuts` were written again (their writes are durable now), except
    /// what is lost again by then (the log lost since, a block rotten).
    fn save_cuts(&self, cuts: &LostRanges) -> Result<()> {
        {
            let mut st = self.state.lock();
            for (set, a, b) in cuts.ranges() {
                st.lost_saved.cut(set, a, b);
                for (x, y) in st.lost.within(set, a, b) {
                    st.lost_saved.insert(set, x, y);
                }
            }
        }
        self.save_lost()
    }

    /// Records in the pool's metadata the writes the log took since the last time, before a
    /// flush answers for them.
    fn save_held(&self) -> Result<()> {
        let _one = self.held_saving.lock();
        let writes = self.state.lock().held.take_unsaved();
        if writes.is_empty() {
            return Ok(());
        }
        let mut b = tessera_pool::MetaBatch::new();
        held::put(&mut b, &writes);
        if let Err(e) = self.pool.meta().commit(b, true) {
            self.state.lock().held.unsave(&writes);
            return Err(e.into());
        }
        Ok(())
    }

    /// Saves `lost_saved` to the pool's metadata, as it is now.
    fn save_lost(&self) -> Result<()> {
        let _one = self.lost_saving.lock();
        let saved = self.state.lock().lost_saved.clone();
        saved.save(&self.pool)
    }

    /// After a log disk was lost: another cache disk takes its place, with a copy of the live
    /// log, if there is one. The caller holds `log_lock` exclusively, so no batch is being
    /// written.
    fn replace_lost(&self) {
        let healthy = self.pool.cache_disks();
        if let Err(e) = self.choose_devices(&mut self.state.lock(), &healthy) {
            error!(error = %e, "cannot copy the write-back log to another cache disk");
        }
        if let Err(e) = self.save_log_record() {
            error!(error = %e, "cannot record the write-back log's disks");
        }
    }

    /// Saves where the log starts and on which disks, as memory has it. Under `advancing`, so
    /// that it never saves a start older than one `advance_tail` saved and then acted on.
    fn save_log_record(&self) -> Result<()> {
        let _one = self.advancing.lock();
        let rec = self.state.lock().record();
        log::save_record(&self.pool, &rec)
    }

    fn wait_for_budget(&self, vdisk: u64, len: u64) -> Result<()> {
        let mut st = self.state.lock();
        let mut counted = false;
        // The last time this vdisk's dirty data went down.
        let (mut before, mut moved) = (u64::MAX, Instant::now());
        loop {
            let d = st.vdisk_dirty.get(&vdisk).copied().unwrap_or(0);
            // With no log disk left, nothing will be destaged to make room (what was dirty is
            // lost): the write goes on, to be refused by the log.
            if d == 0 || d + len <= st.budget(vdisk) || self.stop.load(Ordering::Acquire) || st.devices.is_empty() {
                return Ok(());
            }
            if d < before {
                moved = Instant::now();
            }
            before = d;
            self.wait_for_room(&mut st, &mut counted);
            self.check_stall(moved, "its virtual disk's share of the write-back cache")?;
        }
    }

    /// Fails a writer waiting for room once nothing was made for it (`moved`: the last time
    /// what it waits on went down) for the stall limit, while destage jobs fail: the room is
    /// not coming, and an answer the initiator can act on (a medium error, another path)
    /// beats a wait past its command timeout. A destager that is only slow fails no one.
    fn check_stall(&self, moved: Instant, waits_for: &str) -> Result<()> {
        let limit = Duration::from_millis(self.stall_limit_ms.load(Ordering::Relaxed));
        if moved.elapsed() < limit {
            return Ok(());
        }
        match &*self.last_failure.lock() {
            Some((at, why)) if *at >= moved => Err(CacheError::Log(format!(
                "this write waited {} s for room in {waits_for}, and the destager cannot make it: {why}",
                moved.elapsed().as_secs()
            ))),
            _ => Ok(()),
        }
    }

    /// Waits a while for the destager to make room (it is told that a writer waits); counts
    /// the write as throttled the first time.
    fn wait_for_room(&self, st: &mut parking_lot::MutexGuard<'_, State>, counted: &mut bool) {
        if !*counted {
            self.counters.throttled.fetch_add(1, Ordering::Relaxed);
            *counted = true;
        }
        st.waiting += 1;
        self.work.notify_one();
        self.room.wait_for(st, Duration::from_millis(50));
        st.waiting -= 1;
    }

    /// Appends one write to the log, in the next batch; returns when the batch is written,
    /// with its sequence number.
    fn append(&self, set: u32, offset: u64, vdisk: u64, data: &[u8]) -> Result<u64> {
        let done = Arc::new(Completion::default());
        let mut q = self.appender.lock();
        q.queue.push(Pending {
            done: done.clone(),
            set,
            offset,
            vdisk,
            data: data.to_vec(),
        });
        if q.leaders >= IN_FLIGHT || (q.leaders > 0 && q.queue.len() < SECOND_BATCH_MIN) {
            drop(q);
            return done.wait().map_err(CacheError::Log);
        }
        q.leaders += 1;
        loop {
            // Take what fits one batch.
            let (mut entries, mut bytes, mut take) = (0, 0, 0);
            for p in &q.queue {
                let n = p.data.len().div_ceil(MAX_ENTRY);
                if take > 0 && (entries + n > MAX_ENTRIES || bytes + p.data.len() > MAX_BATCH) {
                    break;
                }
                entries += n;
                bytes += p.data.len();
                take += 1;
            }
            let batch: Vec<Pending> = q.queue.drain(..take).collect();
            drop(q);
            let result = self.write_batch(&batch).map_err(|e| e.to_string());
            for p in &batch {
                p.done.set(result.clone());
            }
            q = self.appender.lock();
            // Whatever is queued is left to another leader only if there is one.
            if q.queue.is_empty() || (q.leaders > 1 && q.queue.len() < SECOND_BATCH_MIN) {
                q.leaders -= 1;
                drop(q);
                return done.wait().map_err(CacheError::Log);
            }
        }
    }

    /// Writes one batch to every disk of the log and adds it to the index.
    fn write_batch(&self, reqs: &[Pending]) -> Result<u64> {
        let log = self.log_lock.read();
        let mut buf = self.buffers.lock().pop().unwrap_or_else(|| AlignedBuf::zeroed(0));
        let result = self.write_batch_in(reqs, &mut buf);
        self.buffers.lock().push(buf);
        drop(log);
        let (result, lost_some) = result;
        if lost_some {
            // A copy was lost: another cache disk takes its place, with a copy of the live
            // log, once no batch is being written.
            let _log = self.log_lock.write();
            self.replace_lost();
        }
        result
    }

    /// Writes and indexes one batch, built in `buf`; and whether a disk of the log was lost
    /// on the way while another still holds the batch.
    fn write_batch_in(&self, reqs: &[Pending], buf: &mut AlignedBuf) -> (Result<u64>, bool) {
        let mut entries = Vec::new();
        for r in reqs {
            for (n, c) in r.data.chunks(MAX_ENTRY).enumerate() {
                entries.push((r.set, r.offset + (n * MAX_ENTRY) as u64, r.vdisk, c));
            }
        }
        let data_len: usize = entries.iter().map(|e| e.3.len()).sum();
        let size = (BLOCK + data_len) as u64;
        // A place in the ring, waiting for the destager to free one if need be.
        let (pos, seq, generation, pool_id, devices, flushed_below) = {
            let mut st = self.state.lock();
            let mut counted = false;
            // The last time the log's space in use went down.
            let (mut before, mut moved) = (u64::MAX, Instant::now());
            loop {
                if st.devices.is_empty() {
                    return (
                        Err(CacheError::Log("no disk of the write-back log is left".into())),
                        false,
                    );
                }
                if self.stop.load(Ordering::Acquire) {
                    return (Err(CacheError::Log("the pool is closing".into())), false);
                }
                if st.broken.is_some() {
                    // The ring goes back to the failed batch once those in flight are done.
                    self.in_order.wait(&mut st);
                    continue;
                }
                let tail = st.tail_pos();
                if let Some(pos) = log::place(st.area, st.head, tail, st.batches.is_empty(), size) {
                    let seq = st.next_seq;
                    st.next_seq += 1;
                    st.in_flight.insert(seq);
                    st.head = pos + size;
                    st.used += size;
                    st.batches.insert(
                        seq,
                        Batch {
                            pos,
                            len: size,
                            dirty: 0,
                            entries: Vec::new(),
                            crcs: Vec::new(),
                            sealed: false,
                            at: Instant::now(),
                        },
                    );
                    break (
                        pos,
                        seq,
                        st.generation,
                        st.pool_id,
                        st.devices.clone(),
                        st.flushed_below,
                    );
                }
                if st.used < before {
                    moved = Instant::now();
                }
                before = st.used;
                self.wait_for_room(&mut st, &mut counted);
                if let Err(e) = self.check_stall(moved, "the write-back log") {
                    return (Err(e), false);
                }
            }
        };
        if buf.len() < size as usize {
            *buf = AlignedBuf::zeroed((size as usize).max(MAX_BATCH + BLOCK));
        }
        let buf = &mut buf[..size as usize];
        let mut header_entries = Vec::with_capacity(entries.len());
        let mut crcs = Vec::with_capacity(data_len / BLOCK);
        let mut at = BLOCK;
        for (set, offset, vdisk, data) in &entries {
            buf[at..at + data.len()].copy_from_slice(data);
            let c = block_crcs(data);
            header_entries.push(Entry {
                set: *set,
                offset: *offset,
                len: data.len() as u32,
                vdisk: *vdisk,
                crc: entry_crc(&c),
            });
            crcs.extend(c);
            at += data.len();
        }
        Header {
            pool: pool_id,
            generation,
            seq,
            data_len: data_len as u32,
            entries: header_entries.clone(),
            flushed_below,
        }
        .encode(&mut buf[..BLOCK]);
        let results = log::write_all(&devices, pos, buf);
        let written = results.iter().filter(|(_, r)| r.is_ok()).count();
        for (p, r) in &results {
            if let Err(e) = r {
                self.lose_device(*p, &format!("write failed: {e}"));
            }
        }
        let lost_some = written < results.len() && written > 0;
        // In sequence order: a replay reads batches in that order and stops at the first
        // that is not whole, so no batch may be answered before the ones placed ahead of it.
        let mut st = self.state.lock();
        while st.in_flight.first() != Some(&seq) {
            self.in_order.wait(&mut st);
        }
        let failed = if written > 0 && st.devices.is_empty() {
            // Written, and then the log's last disk failed under someone else's flush: the
            // batch is gone with it.
            Some("the write-back log lost its last disk before the write was held".to_string())
        } else if written == 0 {
            Some(format!(
                "the write failed on every disk of the write-back log: {}",
                results
                    .iter()
                    .filter_map(|(p, r)| r.as_ref().err().map(|e| format!("disk {p}: {e}")))
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        } else {
            st.broken
                .map(|(b, _)| format!("an earlier batch of the write-back log (sequence {b}) failed on every disk"))
        };
        st.in_flight.remove(&seq);
        let result = match failed {
            Some(why) => {
                // Nothing may follow a batch the replay cannot read: this one goes too, and
                // the ring ends where the first failed batch began once none is in flight.
                st.batches.remove(&seq);
                st.used -= size;
                let (first, at) = *st.broken.get_or_insert((seq, pos));
                if st.in_flight.is_empty() {
                    st.head = at;
                    st.next_seq = first;
                    st.broken = None;
                    // The numbers from here on are given again, to batches not flushed yet.
                    st.flushed_below = st.flushed_below.min(first);
                }
                Err(CacheError::Log(why))
            }
            None => {
                self.install(&mut st, seq, pos, &header_entries, crcs);
                self.counters.log_batches.fetch_add(1, Ordering::Relaxed);
                Ok(seq)
            }
        };
        drop(st);
        self.in_order.notify_all();
        (result, lost_some)
    }
}
