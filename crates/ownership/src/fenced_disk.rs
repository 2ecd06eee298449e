//! A disk on RADOS for one owner: the engine's [`BlockDevice`] over objects of
//! [`OBJECT_BYTES`] (`PREFIX.INDEX`, the index in 16 hex digits), every write fenced by the
//! owner's epoch ([`FencedWriter`]). A pool built on such disks keeps its data in the Ceph
//! cluster, with Ceph's redundancy; a gateway that was replaced cannot write to it.
//!
//! Objects are made by their first write, so the disk is thin: a read of an object never
//! written, or past the end of a shorter one, returns zeros.
//!
//! Every write returns once the OSDs applied it (on every replica), as tcmu-runner, the Ceph
//! iSCSI gateway, has librbd answer (it turns librbd's cache off): the gateway has no
//! volatile cache. A host's acknowledged write must outlive the gateway it went through,
//! and the host does not go down with it: had the gateway answered writes it had only sent
//! and then died, the host's next flush, at the gateway that took over, would succeed over
//! writes that never landed. A write the OSDs refuse (a newer owner's epoch, a blocklist, a
//! timeout) fails, and every flush from then on fails too: only the disk opened again, by a
//! client that fences this one off, may say "durable" again.
//!
//! A write to an object that has [`FLYING_PER_OBJECT`] operations on their way (other
//! writers' at once) is held back, and the writes that follow it to that object join it,
//! until one of those on their way settled: then they go as one operation (the pieces in
//! the order they came, adjacent ones joined), and each returns when that operation is
//! applied. Concurrent writes to an object (a stream with several writes in flight) thus
//! cost the OSDs about two operations per round trip, not one per write, as librbd's I/O
//! scheduler merges them; one client's operations on an object are applied in the order sent. A
//! read of the object, a flush, or a held write grown to an object's worth sends what is
//! held at once.
//!
//! Every operation is settled by its completion, on librados' thread: its writers are told
//! there (a writer waiting here is woken; a write started by a connection's ring
//! ([`AsyncWriter`]) is completed to that ring, with no thread of the gateway between the
//! cluster's answer and the connection), and what was held behind it is sent from there.

use std::collections::{BTreeSet, HashMap};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tessera_disk::{
    check_request, unit_pieces, AsyncReader, AsyncWriter, BlockDevice, DiskError, ReadDone, ReadReq, ReadVia, UnitPiece,
};
use tessera_rados::{Pool, RadosError, ReadExtent, WriteOp};

use crate::fence::{write_op, FencedWriter};
use crate::lease_clock::LeaseClock;

/// Bytes per object, as librbd's default: large enough that a sequential stream costs few
/// operations, small enough that objects spread over the placement groups.
pub const OBJECT_BYTES: u64 = 4 << 20;

/// The most bytes of writes sent and not yet known applied: past it, a write waits for the
/// oldest before it is sent (as librbd's `rbd_cache_max_dirty` bounds its cache). Writers
/// wait for their own writes anyway; this bounds what many at once keep in flight.
pub const MAX_BEHIND: usize = 24 << 20;

/// The most a write held back for an object gathers before it goes anyway (bytes, pieces):
/// one object's worth, and few enough pieces that the OSD's transaction stays small.
const HELD_BYTES: usize = OBJECT_BYTES as usize;
const HELD_PIECES: usize = 64;

/// Operations on their way to one object past which the writes that come for it are held to
/// go together (a held group grown full, a read of the object or a flush sends it even so,
/// beside them). Two, not one: a stream of 256 KiB writes at QD8 then has the next
/// operation at the OSD while one is applied (against librbd without its cache, ten runs
/// each, 0.91 of it at the median instead of 0.83; docs/performance.md).
const FLYING_PER_OBJECT: usize = 2;

/// Removals of a destroyed disk's objects on their way at once.
const REMOVING: usize = 64;

pub struct FencedDisk {
    inner: Arc<Handle>,
}

/// The disk's state as its users hold it (the disk, a connection's ring). Its owner is a
/// plain pointer, not the state itself: dropping it then never makes a unique reference to
/// the state while librados' threads may still use it through theirs (`DiskPtr`); it is
/// freed once the last completion returned.
struct Handle(NonNull<Inner>);

// SAFETY: a Handle only owns its Inner, which is Send and Sync.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Inner>()
};

impl Handle {
    fn new(inner: Inner) -> Handle {
        Handle(NonNull::from(Box::leak(Box::new(inner))))
    }
}

impl std::ops::Deref for Handle {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        // SAFETY: allocated in `new`, freed only when the Handle goes.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let inner: &Inner = self;
        let _ = inner.flush();
        // The last completions may still be returning: the context they ran for, and the
        // state they settled, stay until they have.
        while inner.callbacks.load(Ordering::Acquire) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: allocated in `new` by a Box, and no completion reaches it any more.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

struct Inner {
    behind: Mutex<Behind>,
    /// Told whenever a write is settled, for the writers and flushes waiting here.
    settled: Condvar,
    /// Completions of writes sent that have not returned yet. They reach the disk through a
    /// plain pointer, not a reference: the last reference is then never dropped on
    /// librados' thread (which must not close the context it runs for), and the disk waits
    /// for them before it goes.
    callbacks: AtomicUsize,
    /// How many objects the disk spans (indexes 0 to this, not included).
    objects: u64,
    pool: Pool<'static>,
    prefix: String,
    size: u64,
    epoch: i64,
    path: String,
    /// The lease the pool is owned under: past it, reads and writes are refused
    /// (lease_clock.rs). Unbounded for a disk opened without one.
    lease: LeaseClock,
}

/// Writes sent and not yet known applied, and writes held back to go together.
#[derive(Default)]
struct Behind {
    /// The operations sent and not settled yet, by sequence number.
    in_flight: BTreeSet<u64>,
    /// Of every write not settled yet, held back or sent.
    bytes: usize,
    /// Operations sent so far: the next one's sequence number.
    next: u64,
    /// Per object, its writes sent and not settled.
    flying: HashMap<u64, usize>,
    /// Per object with at least [`FLYING_PER_OBJECT`] operations on their way: the writes that came
    /// since, to go as one operation once one of those settled (as librbd's scheduler merges
    /// a stream's writes). An object has writes held only while it has writes flying, and
    /// every write that comes for it meanwhile joins them (none overtakes them).
    held: HashMap<u64, Held>,
    /// The first write the OSDs refused (where it starts, how long it is, described), or
    /// what else made this opening of the pool vouch for nothing more ([`FencedDisk::refuse`]):
    /// every flush from then on fails with it.
    failed: Option<(u64, usize, String)>,
    /// Why the cluster says a newer owner took the pool (it fenced this client off, or wrote
    /// under a later epoch), first said: from then on every write is refused at once, not
    /// sent to objects whose placement groups have not heard of the fence yet.
    replaced: Option<String>,
    /// Numbers the writes (or groups of held writes) their writers wait for.
    next_tag: u64,
    /// Per write or group whose writers were not all told yet: who they are, and once
    /// settled how it went.
    waiting: HashMap<u64, Waiters>,
}

/// The writers of one operation.
struct Waiters {
    /// Writers waiting here that have not taken the outcome yet.
    left: usize,
    outcome: Option<Result<(), String>>,
    /// Writes started from a ring: each told when the operation settles.
    started: Vec<Arc<Joint>>,
}

/// What settling a write sent needs to know of it.
#[derive(Clone, Copy)]
struct Ticket {
    seq: u64,
    object: u64,
    /// Where it starts on the disk and how long it is, for a refusal's report.
    offset: u64,
    len: usize,
    /// Its writers' tag in `waiting`.
    tag: u64,
}

/// Writes to one object, in the order they came: each piece at its offset in the object.
struct Held {
    pieces: Vec<(u64, Vec<u8>)>,
    bytes: usize,
    /// Where the first piece was on the disk, for a refusal's report.
    offset: u64,
    /// The tag its writers wait on, how many wait here, and the writes started from a ring.
    tag: u64,
    writers: usize,
    started: Vec<Arc<Joint>>,
}

/// Takes a write's completion off the disk's count when dropped: the last thing the
/// completion does with the disk.
struct Returned(*const Inner);

impl Drop for Returned {
    fn drop(&mut self) {
        // SAFETY: the disk waits for this count before it goes; nothing of it is used after.
        unsafe { (*self.0).callbacks.fetch_sub(1, Ordering::AcqRel) };
    }
}

/// The disk as a completion reaches it on librados' thread.
#[derive(Clone, Copy)]
struct DiskPtr(*const Inner);
// SAFETY: Inner is Sync, and outlives every completion: its Handle waits for its writes'
// when dropped, and a read's caller keeps the Handle until the read is completed.
unsafe impl Send for DiskPtr {}

impl Held {
    /// Adds a write, onto the end of the last piece where it follows it.
    fn add(&mut self, in_obj: u64, data: &[u8]) {
        let room = HELD_BYTES.saturating_sub(self.bytes).max(data.len());
        self.bytes += data.len();
        if let Some((at, last)) = self.pieces.last_mut() {
            if *at + last.len() as u64 == in_obj {
                if last.capacity() - last.len() < data.len() {
                    // A stream: room for sixteen more such writes at once (at least double,
                    // at most what the piece may still gather). Grown by doubling from one
                    // write, a piece of 4 MiB gathered from 256 KiB writes was copied about
                    // once more as it grew (5 % of the gateway's CPU per write).
                    last.reserve_exact(room.min((16 * data.len()).max(last.len())));
                }
                last.extend_from_slice(data);
                return;
            }
        }
        self.pieces.push((in_obj, data.to_vec()));
    }

    fn full(&self) -> bool {
        self.bytes >= HELD_BYTES || self.pieces.len() >= HELD_PIECES
    }
}

impl Behind {
    /// Keeps the first refusal (`what`, made only if it is the first), and whether `e` says
    /// that a newer owner took the pool.
    fn refused(&mut self, what: impl FnOnce() -> (u64, usize, String), e: &RadosError) {
        self.failed.get_or_insert_with(what);
        if (e.is_fenced() || e.is_out_of_order()) && self.replaced.is_none() {
            self.replaced = Some(describe(e));
        }
    }
}

/// What `failed` keeps of a write the OSDs refused.
fn refused_write(offset: u64, len: usize, e: &RadosError) -> (u64, usize, String) {
    (
        offset,
        len,
        format!("a write of {len} bytes at byte {offset} was refused: {}", describe(e)),
    )
}

/// What `failed` keeps of a read the OSDs refused to a client fenced off.
fn refused_read(offset: u64, len: usize, e: &RadosError) -> (u64, usize, String) {
    (
        offset,
        len,
        format!("a read of {len} bytes at byte {offset} was refused: {}", describe(e)),
    )
}

/// `e` as an administrator reads it: a fence or a newer owner's epoch named as such.
pub(crate) fn describe(e: &RadosError) -> String {
    if e.is_fenced() {
        format!("this gateway was fenced off by a newer owner ({e})")
    } else if e.is_out_of_order() {
        format!("a newer owner wrote here ({e})")
    } else {
        e.to_string()
    }
}

/// The object pieces of [offset, offset + len): each piece's `unit` is its object's index.
fn pieces(offset: u64, len: usize) -> impl Iterator<Item = UnitPiece> {
    unit_pieces(OBJECT_BYTES, offset, len as u64)
}

impl FencedDisk {
    /// A disk of `size` bytes (whole sectors) in the objects `PREFIX.*` of `pool`, written
    /// under `epoch`.
    pub fn new(pool: Pool<'static>, prefix: &str, size: u64, epoch: i64) -> Result<FencedDisk, DiskError> {
        let path = format!("rados:{}/{prefix}", pool.name());
        if size == 0 || !size.is_multiple_of(tessera_disk::SECTOR as u64) {
            return Err(DiskError::Unusable {
                path,
                reason: format!("a size of {size} bytes is not a whole number of sectors"),
            });
        }
        if prefix.is_empty() || prefix.contains('\0') {
            return Err(DiskError::Unusable {
                path,
                reason: "an object prefix must be a non-empty name".into(),
            });
        }
        // Every write through this context carries the epoch from now on.
        FencedWriter::new(&pool, epoch).map_err(|e| DiskError::Unusable {
            path: path.clone(),
            reason: match e.errno() {
                Some(libc::EINVAL) => format!(
                    "RADOS pool {} has (or had) pool snapshots ('ceph osd pool mksnap'), whose OSDs would not \
                     refuse a replaced owner's writes: use a pool without them ({e})",
                    pool.name()
                ),
                _ => format!("cannot order its writes by the owner's epoch {epoch}: {e}"),
            },
        })?;
        let inner = Arc::new(Handle::new(Inner {
            behind: Mutex::new(Behind::default()),
            settled: Condvar::new(),
            callbacks: AtomicUsize::new(0),
            objects: size.div_ceil(OBJECT_BYTES),
            pool,
            prefix: prefix.to_string(),
            size,
            epoch,
            path,
            lease: LeaseClock::unbounded(),
        }));
        Ok(FencedDisk { inner })
    }

    /// The disk, serving reads and writes only while `lease` holds: a gateway that stalled
    /// past its lease serves nothing from the instant it runs again, though its renewal task
    /// has not noticed yet and the cluster's blocklist may not have reached every OSD.
    pub fn under_lease(mut self, lease: LeaseClock) -> FencedDisk {
        let handle = Arc::get_mut(&mut self.inner).expect("a disk just opened is not shared yet");
        assert_eq!(
            handle.callbacks.load(Ordering::Acquire),
            0,
            "a disk just opened has sent nothing"
        );
        // SAFETY: not shared, and no operation of it is on its way: nothing else can see it.
        unsafe { handle.0.as_mut() }.lease = lease;
        self
    }

    pub fn epoch(&self) -> i64 {
        self.inner.epoch
    }

    /// The first write that the OSDs refused since the disk was opened (a newer owner's
    /// epoch, the blocklist, a timeout), or read they refused to this client fenced off,
    /// described. From then on every flush fails: only the
    /// disk opened again, by a client that fences this one off, can say "durable" again.
    pub fn refused(&self) -> Option<String> {
        self.inner
            .behind
            .lock()
            .failed
            .as_ref()
            .map(|(_, _, what)| what.clone())
    }

    /// From now on this disk vouches for nothing, as after a write the OSDs refused: every
    /// flush fails with `why`, and [`refused`](Self::refused) says it, so that the pool is
    /// opened again from what the cluster holds. For a change of the pool's metadata whose
    /// outcome is not known (a commit that timed out may still be applied): what this
    /// gateway holds in memory may then differ from what the cluster holds, and a write
    /// answered from it (an overwrite in place of a grain the cluster has unmapped) would be
    /// lost at the next opening.
    pub fn refuse(&self, why: &str) {
        self.inner.behind.lock().failed.get_or_insert((0, 0, why.to_string()));
    }

    /// How many operations the writes took so far (writes held back for an object go in
    /// one).
    pub fn writes_sent(&self) -> u64 {
        self.inner.behind.lock().next
    }

    /// Removes every object of the disk (what a destroyed pool leaves in the cluster), with
    /// [`REMOVING`] removals on their way at a time. Where the RADOS pool holds fewer objects
    /// than the disk spans indexes (a thin disk mostly unwritten, the usual case), the pool's
    /// objects are listed and this disk's removed; otherwise every index is removed, written
    /// or not (those never written answer `ENOENT`): a 10 TiB disk spans 2.6 million.
    pub fn remove_objects(&self) -> Result<(), RadosError> {
        let indexes = self.inner.objects;
        // The count is an estimate (seconds old); either walk is exact.
        let walk = if self.inner.pool.object_count().is_ok_and(|n| n < indexes) {
            Walk::Listing
        } else {
            Walk::Indexes
        };
        self.remove_objects_by(walk)
    }

    /// [`remove_objects`](Self::remove_objects) by the walk given.
    pub fn remove_objects_by(&self, walk: Walk) -> Result<(), RadosError> {
        let inner = &self.inner;
        // Nothing of this disk may land after its objects went.
        let _ = inner.flush();
        let mut removal = Removal::new(inner);
        // The indexes of the objects to remove; a listing that fails ends them with its error.
        let indexes: Box<dyn Iterator<Item = Result<u64, RadosError>>> = match walk {
            Walk::Listing => match inner.pool.objects() {
                Ok(names) => Box::new(names.filter_map(|name| name.map(|n| inner.index_of(&n)).transpose())),
                Err(e) => Box::new(std::iter::once(Err(e))),
            },
            Walk::Indexes => Box::new((0..inner.objects).map(Ok)),
        };
        // The removals sent are waited for whatever stops the walk.
        for index in indexes {
            let going = match index {
                Ok(i) => removal.remove(i),
                Err(e) => {
                    removal.fail(e);
                    false
                }
            };
            if !going {
                break;
            }
        }
        removal.finish()
    }
}

/// The name of object `index` of the disk whose objects are named after `prefix`.
pub fn object_name(prefix: &str, index: u64) -> String {
    format!("{prefix}.{index:016x}")
}

/// Why a disk past its lease refuses a request: another gateway may own its pool.
const LEASE_MAY_HAVE_LAPSED: &str =
    "this gateway's lease on the pool may have lapsed (it stalled, or lost etcd): another gateway may own the pool now";

/// How the objects of a disk are found to remove them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// The pool's objects listed, and this disk's taken: as many steps as the pool holds.
    Listing,
    /// Every index the disk spans, written or not: as many steps as the disk spans.
    Indexes,
}

/// Removals of a disk's objects, [`REMOVING`] on their way at a time; the first error (but
/// `ENOENT`: gone already) stops it.
struct Removal<'a> {
    inner: &'a Inner,
    sent: std::collections::VecDeque<tessera_rados::PendingWrite>,
    first: Result<(), RadosError>,
}

impl<'a> Removal<'a> {
    fn new(inner: &'a Inner) -> Removal<'a> {
        Removal {
            inner,
            sent: std::collections::VecDeque::with_capacity(REMOVING),
            first: Ok(()),
        }
    }

    fn settle(&mut self, sent: tessera_rados::PendingWrite) {
        match sent.wait() {
            Err(e) if e.errno() != Some(libc::ENOENT) => self.fail(e),
            _ => {}
        }
    }

    fn fail(&mut self, e: RadosError) {
        if self.first.is_ok() {
            self.first = Err(e);
        }
    }

    /// Sends the removal of object `index`; false once a removal failed.
    fn remove(&mut self, index: u64) -> bool {
        if self.sent.len() == REMOVING {
            let oldest = self.sent.pop_front().expect("full");
            self.settle(oldest);
        }
        if self.first.is_err() {
            return false;
        }
        // Past the lease another gateway may own the pool: the objects are its to keep.
        if !self.inner.lease.holds() {
            self.fail(RadosError::Invalid(format!(
                "{LEASE_MAY_HAVE_LAPSED}, and its objects stay"
            )));
            return false;
        }
        match self
            .inner
            .pool
            .operate_async(&self.inner.oid(index), WriteOp::new().remove())
        {
            Ok(s) => self.sent.push_back(s),
            Err(e) => self.fail(e),
        }
        self.first.is_ok()
    }

    /// Waits for every removal on its way, whatever became of the others; the first error.
    fn finish(mut self) -> Result<(), RadosError> {
        while let Some(s) = self.sent.pop_front() {
            self.settle(s);
        }
        self.first
    }
}

impl Drop for FencedDisk {
    fn drop(&mut self) {
        // What was held is sent, and what was sent is applied (or refused), when the disk is
        // closed, even while a connection's ring still holds it for a read.
        let _ = self.inner.flush();
    }
}

impl Inner {
    fn oid(&self, index: u64) -> String {
        object_name(&self.prefix, index)
    }

    /// The index of the object named `name`, if it is one of this disk's ([`oid`](Self::oid)).
    fn index_of(&self, name: &[u8]) -> Option<u64> {
        let hex = name.strip_prefix(self.prefix.as_bytes())?.strip_prefix(b".")?;
        let lower_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
        let hex = std::str::from_utf8(hex)
            .ok()
            .filter(|h| h.len() == 16 && h.as_bytes().iter().all(lower_hex))?;
        u64::from_str_radix(hex, 16).ok().filter(|&i| i < self.objects)
    }

    /// Every error of the cluster is a refusal of this request, not a fault of the disk:
    /// the cluster keeps its own redundancy, and a fenced owner must not mark the pool's only
    /// disk failed on its way out.
    fn io_error(&self, op: &'static str, offset: u64, len: usize, e: RadosError) -> DiskError {
        self.unavailable(op, offset, len, describe(&e))
    }

    /// A read the OSDs refused because a newer owner fenced this client off: from then on
    /// the disk vouches for nothing, as after a refused write, and says so
    /// ([`FencedDisk::refused`]), so that the gateway opens the pool again and finds it
    /// owned elsewhere. A gateway whose hosts only read would otherwise go on failing their
    /// reads as the pool's owner. Any other failure of a read (a timeout, an OSD down) says
    /// nothing of who owns the pool, and fails that read alone.
    fn read_refused(&self, offset: u64, len: usize, e: &RadosError) {
        // A pool gone refuses the writes too, and flushes must say so at once: the host's
        // data went with it.
        if e.is_fenced() || e.is_pool_gone() {
            self.behind.lock().refused(|| refused_read(offset, len, e), e);
        }
    }

    /// Refuses the request if the lease the pool is owned under may have lapsed
    /// ([`LEASE_MAY_HAVE_LAPSED`]).
    fn check_lease(&self, op: &'static str, offset: u64, len: usize) -> Result<(), DiskError> {
        match self.lease.holds() {
            true => Ok(()),
            false => Err(self.unavailable(op, offset, len, LEASE_MAY_HAVE_LAPSED.into())),
        }
    }

    fn unavailable(&self, op: &'static str, offset: u64, len: usize, reason: String) -> DiskError {
        DiskError::Unavailable {
            path: self.path.clone(),
            op,
            offset,
            len,
            reason,
        }
    }

    /// Starts the write of a piece of an object: sent at once if fewer than
    /// [`FLYING_PER_OBJECT`] operations are on their way to the object and none is held for
    /// it, else held back to go with the writes that follow it there.
    /// Its writer is `started` (a write started from a ring, told when it settles) or, with
    /// None, a thread that waits for the returned tag ([`wait_applied`](Self::wait_applied)).
    fn start_piece(
        &self,
        b: &mut Behind,
        index: u64,
        in_obj: u64,
        data: &[u8],
        offset: u64,
        started: Option<Arc<Joint>>,
    ) -> Result<u64, DiskError> {
        if b.held.contains_key(&index) || b.flying.get(&index).is_some_and(|&n| n >= FLYING_PER_OBJECT) {
            let Behind { held, next_tag, .. } = b;
            let h = held.entry(index).or_insert_with(|| {
                *next_tag += 1;
                Held {
                    pieces: Vec::new(),
                    bytes: 0,
                    offset,
                    tag: *next_tag - 1,
                    writers: 0,
                    started: Vec::new(),
                }
            });
            h.add(in_obj, data);
            match started {
                Some(j) => h.started.push(j),
                None => h.writers += 1,
            }
            let (tag, full) = (h.tag, h.full());
            b.bytes += data.len();
            if full {
                let h = b.held.remove(&index).expect("held");
                self.send_held(b, index, h);
            }
            return Ok(tag);
        }
        let op = write_op(vec![(in_obj, data.to_vec())]);
        let tag = b.next_tag;
        b.next_tag += 1;
        let left = usize::from(started.is_none());
        b.waiting.insert(
            tag,
            Waiters {
                left,
                outcome: None,
                started: started.into_iter().collect(),
            },
        );
        b.bytes += data.len();
        if let Err(e) = self.send(b, index, op, offset, data.len(), tag) {
            b.bytes -= data.len();
            b.waiting.remove(&tag);
            b.refused(|| refused_write(offset, data.len(), &e), &e);
            return Err(self.io_error("write", offset, data.len(), e));
        }
        Ok(tag)
    }

    /// Waits until more than [`MAX_BEHIND`] bytes are no longer unsettled.
    fn wait_for_room<'a>(&'a self, mut b: parking_lot::MutexGuard<'a, Behind>) {
        while b.bytes > MAX_BEHIND {
            if b.in_flight.is_empty() {
                // Nothing sent to wait for: what is held goes (never so while the rule that
                // an object holds writes only while it has some flying stands).
                self.send_all_held(&mut b);
                if b.in_flight.is_empty() {
                    break;
                }
            } else {
                self.settled.wait(&mut b);
            }
        }
    }

    /// Waits until the operation that carries the write tagged `tag` settled; its outcome,
    /// or why the OSDs refused it.
    fn wait_applied(&self, tag: u64) -> Result<(), String> {
        let mut b = self.behind.lock();
        loop {
            if let Some(w) = b.waiting.get_mut(&tag) {
                if let Some(outcome) = &w.outcome {
                    let outcome = outcome.clone();
                    w.left -= 1;
                    if w.left == 0 {
                        b.waiting.remove(&tag);
                    }
                    return outcome;
                }
            } else if !b.held.values().any(|h| h.tag == tag) {
                // Neither sent nor held behind a write to its object.
                return Err("the write was lost from the disk's queue".into());
            }
            if b.in_flight.is_empty() {
                // Held with nothing of the disk's on its way (never so while the rule that an
                // object holds writes only while it has some flying stands): sent now.
                self.send_all_held(&mut b);
                if b.in_flight.is_empty() && b.waiting.get(&tag).is_some_and(|w| w.outcome.is_none()) {
                    return Err("the write was lost from the disk's queue".into());
                }
                continue;
            }
            self.settled.wait(&mut b);
        }
    }

    /// Sends an operation carrying the writes tagged `tag`, to be settled by its completion.
    /// Called under the lock, which the completion takes: it cannot settle before the
    /// operation is counted here.
    fn send(
        &self,
        b: &mut Behind,
        object: u64,
        op: WriteOp,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), RadosError> {
        let ticket = Ticket {
            seq: b.next,
            object,
            offset,
            len,
            tag,
        };
        let disk = DiskPtr(self);
        self.callbacks.fetch_add(1, Ordering::AcqRel);
        let then = Box::new(move |outcome: Result<(), RadosError>| {
            let disk = disk;
            // SAFETY: the disk waits for every completion before it goes (`callbacks`).
            unsafe { Inner::completed(disk.0, ticket, outcome) }
        });
        if let Err(e) = self.pool.operate_then(&self.oid(object), op, then) {
            self.callbacks.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        b.next += 1;
        b.in_flight.insert(ticket.seq);
        *b.flying.entry(object).or_default() += 1;
        Ok(())
    }

    /// An operation's completion, on librados' thread. Takes the disk by pointer, not as
    /// `&self`: a reference argument is assumed valid until the function returns, and the
    /// disk may go as soon as the count is seen taken down (by `Returned`, dropped last).
    ///
    /// # Safety
    /// `this` points to a disk that waits for this completion before it goes (`callbacks`).
    unsafe fn completed(this: *const Inner, t: Ticket, outcome: Result<(), RadosError>) {
        // Dropped last, even as a panic unwinds: the disk may go once the count is seen.
        let _returned = Returned(this);
        // SAFETY: alive until `_returned` takes the count down.
        let disk = unsafe { &*this };
        let settling = std::panic::AssertUnwindSafe(|| {
            let mut b = disk.behind.lock();
            disk.settle(&mut b, t, outcome);
        });
        if std::panic::catch_unwind(settling).is_err() {
            // A fault here: what the disk keeps of its writes may be wrong from now on, so it
            // vouches for nothing more (every flush fails), and this write's writers waiting
            // here are told it failed rather than wait for it (those started from a ring, if
            // the panic came while they were told, when their completion is dropped).
            tracing::error!(disk = %disk.path, offset = t.offset, "settling a write panicked: the disk refuses every flush from now on");
            let mut b = disk.behind.lock();
            b.failed
                .get_or_insert_with(|| (t.offset, t.len, "settling a write failed here".to_string()));
            b.in_flight.remove(&t.seq);
            // The writes held behind it are failed too: sent, they would be vouched for by
            // nothing, and their writers would wait for a count that may never come down.
            // Each step on its own, so that one more fault does not skip the other.
            let why = "settling a write failed here";
            let held = std::panic::AssertUnwindSafe(|| Self::fail_held(&mut b, why));
            let _ = std::panic::catch_unwind(held);
            let told = std::panic::AssertUnwindSafe(|| Self::tell(&mut b, t.tag, Err(why.to_string())));
            let _ = std::panic::catch_unwind(told);
        }
        disk.settled.notify_all();
    }

    /// Sends the writes held for `object` as one operation, which their writers wait on; if
    /// it cannot be sent, they fail, and so do the flushes.
    /// Once the cluster said that a newer owner took the pool, or once the lease may have
    /// lapsed (they may have waited long behind writes on their way), they are not sent:
    /// they fail with why.
    fn send_held(&self, b: &mut Behind, object: u64, h: Held) {
        b.waiting.insert(
            h.tag,
            Waiters {
                left: h.writers,
                outcome: None,
                started: h.started,
            },
        );
        let unsendable = match &b.replaced {
            Some(why) => Some(why.clone()),
            None => (!self.lease.holds()).then(|| LEASE_MAY_HAVE_LAPSED.to_string()),
        };
        if let Some(why) = unsendable {
            b.bytes -= h.bytes;
            // Not applied anywhere, and its writers are told so: unlike a write the OSDs
            // refused or timed out (which may be applied in part, or later), it leaves
            // nothing unknown, and the disk goes on vouching for what was applied, as for a
            // write refused at its start past the lease. A lease really lost has the pool
            // given up at the next tick, and a newer owner's refusals fail the flushes.
            Self::tell(b, h.tag, Err(why));
            self.settled.notify_all();
            return;
        }
        let op = write_op(h.pieces);
        if let Err(e) = self.send(b, object, op, h.offset, h.bytes, h.tag) {
            b.bytes -= h.bytes;
            b.refused(|| refused_write(h.offset, h.bytes, &e), &e);
            Self::tell(b, h.tag, Err(describe(&e)));
            self.settled.notify_all();
        }
    }

    /// Fails every write held back, unsent, with `why`.
    fn fail_held(b: &mut Behind, why: &str) {
        let held: Vec<(u64, Held)> = b.held.drain().collect();
        for (_, h) in held {
            b.bytes = b.bytes.saturating_sub(h.bytes);
            let writers = Waiters {
                left: h.writers,
                outcome: None,
                started: h.started,
            };
            b.waiting.insert(h.tag, writers);
            Self::tell(b, h.tag, Err(why.to_string()));
        }
    }

    fn send_all_held(&self, b: &mut Behind) {
        let held: Vec<(u64, Held)> = b.held.drain().collect();
        for (object, h) in held {
            self.send_held(b, object, h);
        }
    }

    /// Sends what is held for the objects a read is about to read: the read then comes after
    /// it (the OSDs apply one client's operations on an object in the order sent).
    fn release_held_for(&self, objects: impl Iterator<Item = u64>) {
        let mut b = self.behind.lock();
        if b.held.is_empty() {
            return;
        }
        for object in objects {
            if let Some(h) = b.held.remove(&object) {
                self.send_held(&mut b, object, h);
            }
        }
    }

    /// Tells the writers of `tag` how their operation went: those started from a ring at
    /// once, those waiting here when they next look. A write started from a ring completes
    /// whole only while no write of the disk was refused: its completion stands for a flush
    /// (a FUA write is answered on it), and after a refusal every flush fails; it is then
    /// written again the synchronous way, whose flush says so.
    fn tell(b: &mut Behind, tag: u64, outcome: Result<(), String>) {
        let whole = outcome.is_ok() && b.failed.is_none();
        let Some(w) = b.waiting.get_mut(&tag) else { return };
        for j in w.started.drain(..) {
            j.piece_done(whole);
        }
        if w.left == 0 {
            b.waiting.remove(&tag);
        } else {
            w.outcome = Some(outcome);
        }
    }

    /// Counts a write that completed out, keeping the first refusal; an object left with
    /// fewer than [`FLYING_PER_OBJECT`] operations on their way sends what was held for it.
    fn settle(&self, b: &mut Behind, t: Ticket, outcome: Result<(), RadosError>) {
        b.in_flight.remove(&t.seq);
        b.bytes -= t.len;
        if let Err(e) = &outcome {
            b.refused(|| refused_write(t.offset, t.len, e), e);
        }
        Self::tell(b, t.tag, outcome.map_err(|e| describe(&e)));
        let flying = b.flying.get_mut(&t.object).expect("a write sent is counted flying");
        *flying -= 1;
        let left = *flying;
        if left == 0 {
            b.flying.remove(&t.object);
        }
        if left < FLYING_PER_OBJECT {
            if let Some(h) = b.held.remove(&t.object) {
                self.send_held(b, t.object, h);
            }
        }
    }

    /// Sends what is held, then waits until the OSDs applied every write sent before; fails
    /// if they refused any write since the disk was opened.
    fn flush(&self) -> Result<(), DiskError> {
        let mut b = self.behind.lock();
        self.send_all_held(&mut b);
        let before = b.next;
        while b.in_flight.first().is_some_and(|&seq| seq < before) {
            self.settled.wait(&mut b);
        }
        match &b.failed {
            Some((offset, len, what)) => Err(self.unavailable("flush", *offset, *len, format!("earlier, {what}"))),
            None => Ok(()),
        }
    }
}

impl BlockDevice for FencedDisk {
    fn path(&self) -> &str {
        &self.inner.path
    }

    fn size(&self) -> u64 {
        self.inner.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.inner.read_at(buf, offset)
    }

    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> Vec<Result<(), DiskError>> {
        self.inner.read_many(reqs)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.inner.write_at(buf, offset)
    }

    /// Reads started here and completed from librados' thread: a connection's ring is told
    /// of them with no worker thread between it and the cluster.
    fn read_via(&self) -> Option<ReadVia> {
        Some(ReadVia::Async(self.inner.clone()))
    }

    /// Writes likewise, answered to the ring once the OSDs applied them.
    fn write_via(&self) -> Option<Arc<dyn AsyncWriter>> {
        Some(self.inner.clone())
    }

    /// Sends what is held, then waits until the OSDs applied every write sent before it;
    /// fails if they refused any write since the disk was opened.
    fn flush(&self) -> Result<(), DiskError> {
        self.inner.flush()
    }
}

/// The pieces of one read or write started in the background: the last to complete
/// completes it.
struct Joint {
    left: AtomicUsize,
    failed: AtomicBool,
    done: Mutex<Option<ReadDone>>,
}

impl Joint {
    fn piece_done(&self, whole: bool) {
        if !whole {
            self.failed.store(true, Ordering::Release);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(done) = self.done.lock().take() {
                done.complete(!self.failed.load(Ordering::Acquire));
            }
        }
    }
}

/// Where a piece's bytes go, handed to librados' thread with the piece.
struct Target(*mut u8);
// SAFETY: the memory is the caller's until the read completes, and only the read touches it.
unsafe impl Send for Target {}

impl AsyncReader for Handle {
    /// One read per object piece, each completed from librados' thread; a piece of an
    /// object never written, or past the end of a shorter one, reads as zeros, as in
    /// [`read_many`](Inner::read_many). What is held for those objects is sent first.
    unsafe fn start_read(&self, at: *mut u8, len: u32, offset: u64, done: ReadDone) {
        if check_request(&self.path, "read", offset, len as usize, self.size)
            .and_then(|()| self.check_lease("read", offset, len as usize))
            .is_err()
        {
            return done.complete(false);
        }
        let parts: Vec<_> = pieces(offset, len as usize).collect();
        self.release_held_for(parts.iter().map(|p| p.unit));
        let joint = Arc::new(Joint {
            left: AtomicUsize::new(parts.len()),
            failed: AtomicBool::new(false),
            done: Mutex::new(Some(done)),
        });
        for p in parts {
            let n = p.len;
            // SAFETY: inside the caller's `len` bytes.
            let piece_at = unsafe { at.add(p.buf_off) };
            let target = Target(piece_at);
            let joint = joint.clone();
            let disk = DiskPtr(&**self);
            let then = Box::new(move |got: Result<usize, RadosError>| {
                let (target, disk) = (target, disk);
                let filled = match got {
                    Ok(had) => Some(had.min(n)),
                    Err(e) if e.errno() == Some(libc::ENOENT) => Some(0),
                    Err(e) => {
                        // SAFETY: the disk is kept until the read is completed, which waits
                        // for this piece (below).
                        unsafe { &*disk.0 }.read_refused(offset, len as usize, &e);
                        None
                    }
                };
                if let Some(had) = filled {
                    // SAFETY: the caller's memory until the read is completed, below.
                    unsafe { std::ptr::write_bytes(target.0.add(had), 0, n - had) };
                }
                joint.piece_done(filled.is_some());
            });
            // SAFETY: the caller keeps the memory valid until `done` is completed, which
            // waits for every piece, and keeps `self` (and so the pool) alive until then.
            unsafe { self.pool.read_then(&self.oid(p.unit), p.off, piece_at, n, then) };
        }
    }
}

impl Inner {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        let mut one = [ReadReq { offset, buf }];
        self.read_many(&mut one).pop().expect("one request, one result")
    }

    /// Every request's object pieces in flight at once, the pieces of one object in one
    /// operation: a read spanning several grains, or a queue of them, costs one round trip.
    /// Pieces that follow one another in an object are read as one extent, into a scratch
    /// buffer copied out after: the OSD reads its disk once for them, not once per piece
    /// (a 256K read of four 64 KiB grains was four reads of the OSD's disk).
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> Vec<Result<(), DiskError>> {
        let mut results: Vec<Result<(), DiskError>> = reqs
            .iter()
            .map(|r| {
                check_request(&self.path, "read", r.offset, r.buf.len(), self.size)
                    .and_then(|()| self.check_lease("read", r.offset, r.buf.len()))
            })
            .collect();
        let spans: Vec<(u64, usize)> = reqs.iter().map(|r| (r.offset, r.buf.len())).collect();
        // Per piece: its object, offset in it, buffer and request.
        let mut parts: Vec<(u64, u64, &mut [u8], usize)> = Vec::new();
        for (i, r) in reqs.iter_mut().enumerate() {
            if results[i].is_err() {
                continue;
            }
            let mut rest: &mut [u8] = r.buf;
            for p in pieces(r.offset, rest.len()) {
                let (part, tail) = std::mem::take(&mut rest).split_at_mut(p.len);
                rest = tail;
                parts.push((p.unit, p.off, part, i));
            }
        }
        // Runs of pieces that follow one another in one object.
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        for i in 0..parts.len() {
            let follows = i > 0 && {
                let (index, in_obj, part, _) = &parts[i - 1];
                parts[i].0 == *index && parts[i].1 == in_obj + part.len() as u64
            };
            match runs.last_mut() {
                Some(run) if follows => run.end = i + 1,
                _ => runs.push(i..i + 1),
            }
        }
        let mut scratch: Vec<Vec<u8>> = runs
            .iter()
            .map(|run| match run.len() {
                1 => Vec::new(),
                _ => vec![0; parts[run.clone()].iter().map(|p| p.2.len()).sum()],
            })
            .collect();
        self.release_held_for(runs.iter().map(|run| parts[run.start].0));
        let got = {
            let mut extents: Vec<ReadExtent<'_>> = Vec::with_capacity(runs.len());
            let mut rest: &mut [(u64, u64, &mut [u8], usize)] = &mut parts;
            for (run, scratch) in runs.iter().zip(scratch.iter_mut()) {
                let (these, tail) = std::mem::take(&mut rest).split_at_mut(run.len());
                rest = tail;
                let (index, in_obj) = (these[0].0, these[0].1);
                let buf: &mut [u8] = if run.len() == 1 { &mut *these[0].2 } else { scratch };
                extents.push(ReadExtent {
                    oid: self.oid(index),
                    offset: in_obj,
                    buf,
                });
            }
            self.pool.read_extents(&mut extents)
        };
        for ((run, scratch), got) in runs.into_iter().zip(scratch).zip(got) {
            let these = &mut parts[run];
            // Never more than was asked for, whatever librados says it read.
            let asked: usize = these.iter().map(|p| p.2.len()).sum();
            let n = match got {
                Ok(n) => n.min(asked),
                // Never written: zeros.
                Err(e) if e.errno() == Some(libc::ENOENT) => 0,
                Err(e) => {
                    let (offset, len) = spans[these[0].3];
                    self.read_refused(offset, len, &e);
                    let e = describe(&e);
                    for (.., req) in these.iter() {
                        if results[*req].is_ok() {
                            let (offset, len) = spans[*req];
                            results[*req] = Err(self.unavailable("read", offset, len, e.clone()));
                        }
                    }
                    continue;
                }
            };
            if these.len() == 1 {
                // Past the end of what was written: zeros too.
                these[0].2[n..].fill(0);
                continue;
            }
            // The scratch buffer is zeros past what was read.
            let mut at = 0;
            for (.., part, _) in these.iter_mut() {
                part.copy_from_slice(&scratch[at..at + part.len()]);
                at += part.len();
            }
        }
        results
    }

    /// Returns once the OSDs applied every piece: the pieces are sent together (or held to
    /// go with other writers' to the same object) and waited for after. A piece of an object
    /// never written makes it. Each piece is sent only while the lease holds (the wait for
    /// room before it may be long) and while the cluster has not said that a newer owner
    /// took the pool.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        check_request(&self.path, "write", offset, buf.len(), self.size)?;
        let mut started: Vec<(u64, usize, u64)> = Vec::new();
        let waited = |started: Vec<(u64, usize, u64)>| -> Result<(), DiskError> {
            let mut first = Ok(());
            for (at, len, tag) in started {
                if let Err(why) = self.wait_applied(tag) {
                    if first.is_ok() {
                        first = Err(self.unavailable("write", at, len, why));
                    }
                }
            }
            first
        };
        for p in pieces(offset, buf.len()) {
            let at = offset + p.buf_off as u64;
            let data = &buf[p.buf_off..p.buf_off + p.len];
            let mut b = self.behind.lock();
            let sendable = match &b.replaced {
                Some(why) => Err(self.unavailable("write", offset, buf.len(), why.clone())),
                None => self.check_lease("write", offset, buf.len()),
            };
            match sendable.and_then(|()| self.start_piece(&mut b, p.unit, p.off, data, at, None)) {
                Ok(tag) => started.push((at, p.len, tag)),
                Err(e) => {
                    drop(b);
                    // What was started is waited for all the same: its writers must be
                    // counted out.
                    let _ = waited(started);
                    return Err(e);
                }
            }
            self.wait_for_room(b);
        }
        waited(started)
    }
}

impl AsyncWriter for Handle {
    /// Writes, each piece started as [`write_at`](Inner::write_at) starts it and completed
    /// from librados' thread once applied. A write that finds more than [`MAX_BEHIND`] bytes
    /// unsettled, or that comes after the OSDs refused a write of this disk, is declined at
    /// once, having sent nothing: the caller writes it the synchronous way, which waits for
    /// room, or (with FUA) fails in the flush after it.
    unsafe fn start_write(&self, at: *const u8, len: u32, offset: u64, done: ReadDone) {
        if check_request(&self.path, "write", offset, len as usize, self.size)
            .and_then(|()| self.check_lease("write", offset, len as usize))
            .is_err()
        {
            return done.complete(false);
        }
        let parts: Vec<_> = pieces(offset, len as usize).collect();
        // SAFETY: the caller keeps `len` bytes at `at` valid until `done` is completed; they
        // are copied into the operations (or the held pieces) before this returns.
        let buf = unsafe { std::slice::from_raw_parts(at, len as usize) };
        let mut b = self.behind.lock();
        // After a refusal the disk vouches for nothing (every flush fails): a write that must
        // be durable when answered goes the synchronous way, whose flush says so.
        if b.bytes > MAX_BEHIND || b.failed.is_some() {
            drop(b);
            return done.decline();
        }
        let joint = Arc::new(Joint {
            left: AtomicUsize::new(parts.len()),
            failed: AtomicBool::new(false),
            done: Mutex::new(Some(done)),
        });
        for p in parts {
            let data = &buf[p.buf_off..p.buf_off + p.len];
            let at = offset + p.buf_off as u64;
            if self
                .start_piece(&mut b, p.unit, p.off, data, at, Some(joint.clone()))
                .is_err()
            {
                joint.piece_done(false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_cut_at_object_boundaries() {
        let got: Vec<_> = pieces(OBJECT_BYTES - 4096, 3 * 4096)
            .map(|p| (p.unit, p.off, p.buf_off..p.buf_off + p.len))
            .collect();
        assert_eq!(got, vec![(0, OBJECT_BYTES - 4096, 0..4096), (1, 0, 4096..3 * 4096),]);
        let whole: Vec<_> = pieces(2 * OBJECT_BYTES, OBJECT_BYTES as usize)
            .map(|p| (p.unit, p.off, p.buf_off..p.buf_off + p.len))
            .collect();
        assert_eq!(whole, vec![(2, 0, 0..OBJECT_BYTES as usize)]);
    }

    fn held() -> Held {
        Held {
            pieces: Vec::new(),
            bytes: 0,
            offset: 0,
            tag: 0,
            writers: 0,
            started: Vec::new(),
        }
    }

    /// Writes held back, failed (after a fault settling a write): gone from what is held
    /// and counted, and their writers told why when they look.
    #[test]
    fn writes_held_back_and_failed_tell_their_writers() {
        let mut b = Behind::default();
        for (object, tag) in [(3, 7), (9, 8)] {
            let mut h = held();
            h.add(0, &[1; 4096]);
            h.tag = tag;
            h.writers = 1;
            b.bytes += h.bytes;
            b.held.insert(object, h);
        }
        Inner::fail_held(&mut b, "why");
        assert!(b.held.is_empty());
        assert_eq!(b.bytes, 0);
        for tag in [7, 8] {
            let w = &b.waiting[&tag];
            assert_eq!((w.left, w.outcome.clone()), (1, Some(Err("why".to_string()))));
        }
    }

    #[test]
    fn held_writes_join_where_they_follow_and_keep_their_bytes() {
        let mut h = held();
        h.add(8192, &[1; 4096]);
        h.add(12288, &[2; 4096]);
        h.add(0, &[3; 4096]);
        h.add(4096, &[4; 100]);
        assert_eq!(h.bytes, 3 * 4096 + 100);
        assert_eq!(h.pieces.len(), 2);
        let (at, first) = &h.pieces[0];
        assert_eq!((*at, first.len()), (8192, 8192));
        assert!(first[..4096].iter().all(|&b| b == 1) && first[4096..].iter().all(|&b| b == 2));
        let (at, second) = &h.pieces[1];
        assert_eq!((*at, second.len()), (0, 4196));
        assert!(second[..4096].iter().all(|&b| b == 3) && second[4096..].iter().all(|&b| b == 4));
    }

    #[test]
    fn a_stream_of_large_writes_grows_its_piece_once_and_small_ones_geometrically() {
        // 256 KiB writes: the second makes room for the rest of the object's worth at once.
        let mut h = held();
        let w = vec![7u8; 256 << 10];
        let mut grown = 0;
        for i in 0..16u64 {
            let before = h.pieces.first().map(|(_, p)| p.capacity());
            h.add(i * w.len() as u64, &w);
            let after = h.pieces[0].1.capacity();
            grown += usize::from(before.is_some_and(|b| b != after));
        }
        assert_eq!(grown, 1, "the piece grew more than once");
        assert_eq!(h.pieces[0].1.len(), HELD_BYTES);
        assert!(
            h.pieces[0].1.capacity() <= HELD_BYTES,
            "reserved past what a piece holds"
        );
        assert!(h.full());
        // 4 KiB writes: room for sixteen more at a time, doubling past that; never far
        // past what was written.
        let mut h = held();
        let mut grown = 0;
        for i in 0..256u64 {
            let before = h.pieces.first().map(|(_, p)| p.capacity());
            h.add(i * 4096, &[9; 4096]);
            let p = &h.pieces[0].1;
            grown += usize::from(before.is_some_and(|b| b != p.capacity()));
            assert!(
                p.capacity() <= (2 * p.len()).max(17 * 4096),
                "{} reserved for {}",
                p.capacity(),
                p.len()
            );
        }
        assert!(grown <= 5, "a stream of 1 MiB grew its piece {grown} times");
    }
}
