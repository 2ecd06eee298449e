//! The receiving side of a cycle: checks what the sender proposes, answers each offer with
//! the blocks its replica lacks (fingerprints differ), writes what arrives after checking it
//! against the fingerprint offered, and takes the cycle's snapshot once the sender commits.
//!
//! The replica vdisk is the working copy; its snapshots are the consistent points. A cycle
//! cut short leaves the working copy part-way, and a marker saying which cycle it was in:
//! the same cycle, begun again, carries on (grains already written match their offers and
//! are not sent again); any other cycle first puts the working copy back to its base
//! snapshot, so that it starts from what the sender's diff assumes.

use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use tessera_pool::validate_name;
use tessera_volume::{Engine, LayoutKind, Provisioning, VdiskSpec, VdiskState};
use tracing::{info, warn};

use crate::error::{ReplError, Result};
use crate::wire::{self, Begin, Done, Join, Kind, Offered, Ready, Refusal, BLOCK, HASH, MAGIC};

pub struct ReceiveOptions {
    /// Layout of a replica this side creates.
    pub layout: LayoutKind,
    /// Where the markers of cycles under way are kept (one small file per replica).
    pub cycles_dir: PathBuf,
    /// Cycles of several streams waiting for their extra streams: one table for every
    /// connection the site takes.
    pub joins: Arc<Joins>,
    /// The deadline of the connection's handshake, which goes on until the peer's opening
    /// (the magic and a Begin or Join) is read: a peer holding a key and sending a byte now
    /// and then would otherwise hold its place at the listener for ever. None: no deadline.
    pub opening: Mutex<Option<tessera_psk::Deadline>>,
    /// How slowly the peer may send each frame once the cycle is under way.
    pub pace: wire::Pace,
    /// The identity of the key the peer proved: what the cycles of one key may hold at once
    /// is bounded apart from the site's whole.
    pub identity: String,
}

/// A connection a cycle's data may come over.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// What the cycles a site takes share: where a cycle of several streams waits for the others,
/// by the token its Begin carried, and the blocks asked for and not yet received across them.
pub struct Joins {
    /// Token -> where its cycle takes streams, and the replica (pool, vdisk) it writes.
    waiting: Mutex<HashMap<String, WaitingCycle>>,
    /// Fingerprints the site's cycles hold, and how many they may hold together; the cycles
    /// of one key may hold half of that (whatever it holds open, a peer leaves the other
    /// peers room). Changed under `wanted_by_key`'s lock.
    wanted: AtomicUsize,
    wanted_cap: AtomicUsize,
    wanted_by_key: Mutex<HashMap<String, usize>>,
}

impl Default for Joins {
    fn default() -> Joins {
        Joins {
            waiting: Mutex::default(),
            wanted: AtomicUsize::new(0),
            wanted_cap: AtomicUsize::new(wire::MAX_SITE_WANTED_BLOCKS),
            wanted_by_key: Mutex::default(),
        }
    }
}

impl Joins {
    /// Blocks the site's cycles asked for and have not received yet.
    pub fn wanted(&self) -> usize {
        self.wanted.load(Ordering::SeqCst)
    }

    /// How many blocks the site's cycles may ask for and wait for together (default
    /// `wire::MAX_SITE_WANTED_BLOCKS`).
    pub fn set_wanted_cap(&self, blocks: usize) {
        self.wanted_cap.store(blocks, Ordering::SeqCst);
    }

    /// Counts `n` more blocks asked for by a cycle of the peer holding `key`, within the
    /// site's bound and the key's, or says which it would pass.
    fn hold(&self, key: &str, n: usize) -> Result<()> {
        let mut by_key = self.wanted_by_key.lock().expect("not poisoned");
        let (total, cap) = (
            self.wanted.load(Ordering::SeqCst),
            self.wanted_cap.load(Ordering::SeqCst),
        );
        if total + n > cap {
            return Err(ReplError::Invalid(format!(
                "this site's cycles wait for {total} blocks asked for and not yet sent, as many as it holds at once: the cycle is refused for now"
            )));
        }
        let mine = by_key.get(key).copied().unwrap_or(0);
        if mine + n > cap / 2 {
            return Err(ReplError::Invalid(format!(
                "the cycles of key '{key}' wait for {mine} blocks asked for and not yet sent, as many as the cycles of one key hold at once: the cycle is refused for now"
            )));
        }
        *by_key.entry(key.to_string()).or_default() += n;
        self.wanted.fetch_add(n, Ordering::SeqCst);
        Ok(())
    }

    /// Counts `n` blocks of `key`'s cycles out: received, or their cycle ended.
    fn release(&self, key: &str, n: usize) {
        if n == 0 {
            return;
        }
        let mut by_key = self.wanted_by_key.lock().expect("not poisoned");
        if let Some(m) = by_key.get_mut(key) {
            *m = m.saturating_sub(n);
            if *m == 0 {
                by_key.remove(key);
            }
        }
        self.wanted.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Fingerprints of the blocks a cycle asked for, by offset, until their data arrives (over any
/// of the cycle's streams); counted into the site's total, and out of it when they arrive or
/// the cycle ends.
struct Expected<'a> {
    map: Mutex<HashMap<u64, [u8; HASH]>>,
    site: &'a Joins,
    /// The key of the peer whose cycle this is.
    key: &'a str,
    /// Why an extra stream of the cycle failed, for the cycle to end with at once.
    failed: Mutex<Option<ReplError>>,
}

impl Expected<'_> {
    /// Records why the cycle fails, unless a reason came first.
    fn fail(&self, why: ReplError) {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(why);
    }
}

impl Drop for Expected<'_> {
    fn drop(&mut self) {
        let left = self
            .map
            .get_mut()
            .map(|m| m.len())
            .unwrap_or_else(|e| e.into_inner().len());
        self.site.release(self.key, left);
    }
}

/// A cycle waiting for its extra streams: where it takes them (or why one that claimed its
/// place could not join, for the cycle to fail with at once), the replica (pool, vdisk) it
/// writes, how many may join it yet (each claims its place before anything else is done
/// with it, so that none past the count holds anything), and which cycle it is.
struct WaitingCycle {
    tx: SyncSender<Joined>,
    replica: (String, String),
    left: u32,
    id: u64,
}

/// An extra stream handed to its cycle, or why one that claimed its place could not join.
type Joined = std::result::Result<Box<dyn Stream>, String>;

/// A cycle's place in [`Joins`], given up when the cycle ends (if still its own).
struct Waiting<'a> {
    joins: &'a Joins,
    token: String,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut w = self.joins.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if w.get(&self.token).is_some_and(|c| c.id == self.id) {
            w.remove(&self.token);
        }
    }
}

/// What the receiving daemon decides: which pools take replicas, and which vdisks a peer may
/// write. A peer that holds the key may create replicas and update its own; it may never
/// write over a vdisk that is not a replica.
pub trait ReplicaSite {
    /// The engine of `pool`, or why replicas cannot go there.
    fn engine(&self, pool: &str) -> std::result::Result<Arc<Engine>, String>;
    /// Whether `pool/vdisk` may be written as a replica; `exists` says whether it exists.
    fn may_write(&self, pool: &str, vdisk: &str, exists: bool) -> std::result::Result<(), String>;
    /// Whether the replica `pool/vdisk` may be `size` bytes (made so, or grown to it): the
    /// site's bounds on what one peer's replicas may take.
    fn may_hold(&self, _pool: &str, _vdisk: &str, _size: u64) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Whether a cycle may leave a snapshot of this name (the site keeps only those it
    /// prunes, so that a peer cannot pile up snapshots it never deletes).
    fn may_name(&self, _snapshot: &str) -> std::result::Result<(), String> {
        Ok(())
    }
    /// A cycle is about to write `pool/vdisk`, which `existed` says whether it found (else
    /// it makes it next): the site claims it for the cycle, checking again, in the same step
    /// as the claim, that an existing one is still a replica (not promoted, nor made here,
    /// since `may_write`). An error ends the cycle before anything is written or made.
    fn writing(&self, _pool: &str, _vdisk: &str, _existed: bool) -> std::result::Result<(), String> {
        Ok(())
    }
    /// The replica `writing` was told would be made could not be made (a size this site
    /// cannot hold, a full pool): the site forgets what it recorded for it, so that a vdisk
    /// made here later under that name is not taken for a replica.
    fn not_made(&self, _pool: &str, _vdisk: &str) {}
    /// The replica `writing` was told would be made was made, before anything is written to
    /// it: the site may mark it a replica where others that open its pool see it. An error
    /// ends the cycle.
    fn made(&self, _pool: &str, _vdisk: &str) -> std::result::Result<(), String> {
        Ok(())
    }
    /// The working copy `pool/vdisk` is about to change for the cycle of `snapshot`: from
    /// here until `committed`, it may hold part of two cycles. The site records that durably
    /// where every daemon that opens the pool sees it (this side's own marker, a file beside
    /// the daemon, is not seen by another gateway of a pool on RADOS), so that none copies
    /// the working copy meanwhile. An error ends the cycle before the copy changes.
    fn changing(&self, _pool: &str, _vdisk: &str, _snapshot: &str) -> std::result::Result<(), String> {
        Ok(())
    }
    /// The cycle of `snapshot`, asked for again, was committed into `pool/vdisk` already:
    /// what `changing` recorded for it, if still there (the daemon that committed it died
    /// before clearing it), is cleared. An error ends the cycle.
    fn settled(&self, _pool: &str, _vdisk: &str, _snapshot: &str) -> std::result::Result<(), String> {
        Ok(())
    }
    /// The cycle this connection opens brings `streams` connections in all (its own, and
    /// those that join it): the site may refuse so many, as soon as its Begin is read.
    fn streams(&self, _streams: u32) -> std::result::Result<(), String> {
        Ok(())
    }
    /// This connection joins, as an extra stream, the cycle writing `pool/vdisk` (so that
    /// the site can cut it with the cycle's others). An error refuses the stream, and fails
    /// its cycle.
    fn joining(&self, _pool: &str, _vdisk: &str) -> std::result::Result<(), String> {
        Ok(())
    }
    /// The cycle this connection opened ends once under way (after its Ready) without its
    /// Done sent: it failed (or its receiver panicked), its refusal about to be sent. The site shuts the cycle's extra streams down: the refusal waits for
    /// their readers, each of which would otherwise wait for its next frame as long as the
    /// pace allows. It may also bound how long each read of this connection waits from now:
    /// after the refusal, what the sender sent meanwhile is read until it closes, and a
    /// sender that neither sends nor closes would hold the connection for a read's timeout.
    fn failing(&self) {}
    /// The last cycle committed into `pool/vdisk`, as `committed` recorded it.
    fn last_committed(&self, _pool: &str, _vdisk: &str) -> Option<Commit> {
        None
    }
    /// Records, durably, that the cycle `commit` was committed into `pool/vdisk` (its
    /// snapshot taken): a sender that asks again for it is then told it is done, and the
    /// working copy is whole again (what `changing` recorded is cleared).
    fn committed(&self, _pool: &str, _vdisk: &str, _commit: &Commit) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// A cycle committed here: the snapshot it made, and the sender's id of its own snapshot
/// (`wire::Begin::snapshot_id`). The name alone does not say the cycle is the one asked for
/// again: a replication made again under the same name starts its snapshots' names again,
/// and a snapshot deleted at the source and taken again keeps its name, not its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub snapshot: String,
    pub snapshot_id: Option<u64>,
}

impl Commit {
    /// The cycle `begin` asks for.
    pub fn of(begin: &Begin) -> Commit {
        Commit {
            snapshot: begin.snapshot.clone(),
            snapshot_id: begin.snapshot_id,
        }
    }

    /// Whether this is the cycle `begin` asks for. A sender that names no id (an older one)
    /// is taken at its name, as it always was.
    pub fn is_of(&self, begin: &Begin) -> bool {
        self.snapshot == begin.snapshot && (begin.snapshot_id.is_none() || self.snapshot_id == begin.snapshot_id)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReceiveReport {
    pub vdisk: String,
    pub snapshot: String,
    pub resumed: bool,
    /// The replica already held the snapshot: the cycle had been committed.
    pub complete: bool,
    /// This connection was an extra data stream, handed to its cycle.
    pub joined: bool,
    /// Connections the cycle's data came over.
    pub streams: u32,
    pub offered_grains: u64,
    pub written_blocks: u64,
    pub holes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Marker {
    base: Option<String>,
    snapshot: String,
    /// The sender's snapshot by its id (`wire::Begin::snapshot_id`): a cut cycle is resumed only
    /// for the very snapshot it was sending, not one taken again under its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    snapshot_id: Option<u64>,
}

/// How much of a refused sender's stream is read, at most, for the refusal to reach it.
const DRAIN_BYTES: u64 = 64 << 20;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Receives one cycle from the peer at the other end of `conn`. A refusal is sent to the
/// peer with its reason, and returned.
pub fn receive<S: Read + Write + Send + 'static>(
    conn: S,
    site: &dyn ReplicaSite,
    opts: &ReceiveOptions,
) -> Result<ReceiveReport> {
    let mut w = BufWriter::with_capacity(1 << 16, conn);
    let mut report = ReceiveReport::default();
    let opened = opening(w.get_mut(), opts.pace);
    if let Some(d) = opts.opening.lock().expect("not poisoned").take() {
        d.met();
    }
    let out = match opened {
        Ok(f) if f.kind == Kind::Join => {
            return join(w, &f, site, opts).map(|()| ReceiveReport { joined: true, ..report })
        }
        Ok(f) => run(&mut w, f, site, opts, &mut report),
        Err(e) => Err(e),
    };
    if let Err(e) = &out {
        let _ = wire::write_json(&mut w, Kind::Error, &Refusal { message: e.to_string() });
        let _ = w.flush();
        // Before Ready, the sender sent its Begin alone, read whole, and waits for the
        // answer: closing now loses nothing.
        let answered = report.streams > 0;
        // Closing now, with the sender's frames unread, would reset the connection and could
        // take the refusal with it: read on until the sender, having read the refusal at its
        // next answer, closes (or the stream fails). A sender reads its answers at least once
        // a window of offers: a few seconds and some MiB are room enough, and a peer that
        // goes on sending is not read without end.
        let mut sink = [0u8; 64 << 10];
        let mut left: u64 = DRAIN_BYTES;
        let until = std::time::Instant::now() + DRAIN_TIME;
        while answered && left > 0 && std::time::Instant::now() < until {
            match w.get_mut().read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n as u64),
            }
        }
    }
    // Every answer was flushed as it was written: what is still buffered is what a flush
    // failed to send, and trying again as the buffer is dropped would hold the connection
    // (and its place) for another write timeout, for a peer that stopped reading.
    drop(w.into_parts());
    out.map(|_| report)
}

/// The magic and the first frame: a cycle's Begin, or a Join.
fn opening<R: Read>(r: &mut R, pace: wire::Pace) -> Result<wire::Frame> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(ReplError::Protocol("not a Tessera replication stream".into()));
    }
    frame(r, pace)
}

/// Hands an extra data stream to the cycle waiting for it.
fn join<S: Stream + 'static>(
    w: BufWriter<S>,
    f: &wire::Frame,
    site: &dyn ReplicaSite,
    opts: &ReceiveOptions,
) -> Result<()> {
    let j: Join = f.json(Kind::Join)?;
    // Its place claimed first: a stream past the cycle's count is refused here, holding
    // nothing; once the last has claimed its own, the token admits no other (its entry goes).
    let (tx, (pool, vdisk)) = {
        let mut waiting = opts.joins.waiting.lock().expect("not poisoned");
        let c = waiting
            .get_mut(&j.token)
            .ok_or_else(|| ReplError::Protocol("a stream joins a cycle that is not waiting for it".into()))?;
        c.left -= 1;
        let got = (c.tx.clone(), c.replica.clone());
        if c.left == 0 {
            waiting.remove(&j.token);
        }
        got
    };
    // A stream that claimed its place and cannot join fails its cycle at once, with its
    // reason: the cycle would wait for it until its commit's deadline.
    let handed = site
        .joining(&pool, &vdisk)
        .map_err(ReplError::Invalid)
        .and_then(|()| w.into_inner().map_err(|e| ReplError::Io(e.into_error())));
    let conn = match handed {
        Ok(conn) => conn,
        Err(e) => {
            let _ = tx.send(Err(format!("a stream could not join the cycle: {e}")));
            return Err(e);
        }
    };
    tx.send(Ok(Box::new(conn)))
        .map_err(|_| ReplError::Protocol("the cycle the stream joins has ended".into()))
}

fn run<S: Read + Write>(
    w: &mut BufWriter<S>,
    first: wire::Frame,
    site: &dyn ReplicaSite,
    opts: &ReceiveOptions,
    report: &mut ReceiveReport,
) -> Result<()> {
    // Every write is flushed before the next read: reads go straight to the connection.
    let begin: Begin = first.json(Kind::Begin)?;
    check_begin(&begin)?;
    site.streams(begin.streams.max(1)).map_err(ReplError::Invalid)?;
    site.may_name(&begin.snapshot).map_err(ReplError::Invalid)?;
    let engine = site.engine(&begin.pool).map_err(ReplError::Invalid)?;
    let engine = &*engine;
    let found = engine.vdisk(&begin.vdisk).ok().map(|v| v.size());
    site.may_write(&begin.pool, &begin.vdisk, found.is_some())
        .map_err(ReplError::Invalid)?;
    if found.is_none_or(|size| size < begin.size) {
        site.may_hold(&begin.pool, &begin.vdisk, begin.size)
            .map_err(ReplError::Invalid)?;
    }
    report.vdisk = begin.vdisk.clone();
    report.snapshot = begin.snapshot.clone();
    let snap_name = format!("{}@{}", begin.vdisk, begin.snapshot);
    let marker_path = marker_path(&opts.cycles_dir, &begin.pool, &begin.vdisk);
    let marker = read_marker(&marker_path);
    if let Ok(snap) = engine.vdisk(&snap_name) {
        // The sender asks again for a cycle whose commit it did not hear of, if this site
        // committed it: recorded so, or its snapshot taken and the marker not yet gone. Any
        // other snapshot of that name is not this cycle's (a replication made before under
        // the same name left it): answering done would make it the sender's base.
        //
        // Only a snapshot made whole, and durable now, is an answer: one still being made
        // (the first try's commit goes on here after the connection was cut) or left half
        // made by a failed commit is deleted by a restart, and the sender, told done, would
        // drop the base the next cycle needs and keep a cycle this site does not hold.
        if snap.config().state != VdiskState::Online {
            return Err(ReplError::Invalid(format!(
                "the snapshot '{snap_name}' of this cycle is still being made here (or was left half made, which a restart of this daemon, or deleting that snapshot, clears): try again later"
            )));
        }
        engine.flush()?;
        let this = Commit::of(&begin);
        let recorded = site
            .last_committed(&begin.pool, &begin.vdisk)
            .is_some_and(|c| c.is_of(&begin));
        let marked = marker.as_ref().is_some_and(|m| {
            Commit {
                snapshot: m.snapshot.clone(),
                snapshot_id: m.snapshot_id,
            }
            .is_of(&begin)
        });
        if !recorded {
            if !marked {
                return Err(ReplError::Invalid(format!(
                    "the replica holds a snapshot '{snap_name}' that no cycle of this replication committed (an earlier replication under the same name left it): delete it here, and the next cycle goes on"
                )));
            }
            // Taken, and its record not made (the site could not write it): made now.
            site.committed(&begin.pool, &begin.vdisk, &this)
                .map_err(ReplError::Invalid)?;
        }
        site.settled(&begin.pool, &begin.vdisk, &begin.snapshot)
            .map_err(ReplError::Invalid)?;
        if marked {
            let _ = std::fs::remove_file(&marker_path);
        }
        report.complete = true;
        let ready = Ready {
            base_ok: false,
            complete: true,
        };
        wire::write_json(w, Kind::Ready, &ready)?;
        w.flush()?;
        info!(replica = %begin.vdisk, snapshot = %begin.snapshot, "replication cycle was already committed");
        return Ok(());
    }
    let existing = engine.vdisk(&begin.vdisk).ok();
    let existed = existing.is_some();
    site.writing(&begin.pool, &begin.vdisk, existed)
        .map_err(ReplError::Invalid)?;
    // Read again now that the replica is this cycle's: another cycle of it, between the read
    // above and the claim, may have reset the copy and left its own marker.
    let marker = read_marker(&marker_path);
    let replica = match existing {
        Some(v) => {
            if v.is_snapshot() {
                return Err(ReplError::Invalid(format!("'{}' is a snapshot", begin.vdisk)));
            }
            if (v.grain_size(), v.block_size()) != (begin.grain, begin.block_size) {
                return Err(ReplError::Invalid(format!(
                    "replica '{}' has {} byte grains and {} byte blocks; the source {} and {}",
                    begin.vdisk,
                    v.grain_size(),
                    v.block_size(),
                    begin.grain,
                    begin.block_size
                )));
            }
            if v.size() > begin.size {
                return Err(ReplError::Invalid(format!(
                    "replica '{}' is larger ({} bytes) than its source ({})",
                    begin.vdisk,
                    v.size(),
                    begin.size
                )));
            }
            v
        }
        None => {
            let mut spec = VdiskSpec::new(&begin.vdisk, begin.size, opts.layout);
            spec.provisioning = Provisioning::Thin;
            spec.grain_size = Some(begin.grain);
            spec.block_size = Some(begin.block_size);
            match engine.create_vdisk(&spec) {
                Ok(v) => {
                    site.made(&begin.pool, &begin.vdisk).map_err(ReplError::Invalid)?;
                    v
                }
                Err(e) => {
                    site.not_made(&begin.pool, &begin.vdisk);
                    return Err(e.into());
                }
            }
        }
    };
    // Only a replica that was there has a base: snapshots outlive their vdisk, and those a
    // deleted vdisk of this name left may be another sender's (another key's), which the
    // new replica must not start from, nor its offers be answered against. Its first cycle
    // is a full one.
    //
    // Nor, for a replica that was there, one such a namesake left: the pool hands vdisk ids
    // out in increasing order, so the replica's own snapshots are those made after it.
    let base = begin
        .base
        .as_ref()
        .filter(|_| existed)
        .and_then(|b| engine.vdisk(&format!("{}@{b}", begin.vdisk)).ok())
        .filter(|b| b.id() > replica.id());
    let wanted = Marker {
        base: base.as_ref().and(begin.base.clone()),
        snapshot: begin.snapshot.clone(),
        snapshot_id: begin.snapshot_id,
    };
    // Only a working copy that was there can hold part of the cycle its marker names (one
    // made now holds nothing, whatever marker a vdisk of that name left).
    report.resumed = existed && marker.as_ref() == Some(&wanted);
    site.changing(&begin.pool, &begin.vdisk, &begin.snapshot)
        .map_err(ReplError::Invalid)?;
    if marker.is_some() && !report.resumed {
        // The other cycle's marker goes first, durably: once the working copy is changed
        // below, it no longer holds part of that cycle, and a refusal or a crash before the
        // new marker is written must not leave one that a later cycle of that name would
        // take for its own (and not reset the copy it then finishes and commits).
        remove_durably(&marker_path)?;
    }
    if let (Some(b), false) = (&base, report.resumed) {
        // Back to the base: the working copy may hold part of another cycle.
        if replica.size() > b.size() {
            replica.write_zeroes(b.size(), replica.size() - b.size(), true, false)?;
        }
        engine.clone_range(b, 0, &replica, 0, b.size())?;
    }
    if replica.size() < begin.size {
        engine.resize_vdisk(&begin.vdisk, begin.size)?;
    }
    if !report.resumed {
        // The reset durable before the marker that says it was done: a partial grain is
        // put back (or zeroed) by plain writes, which a power cut may lose, and the cycle
        // sent again then would not reset the copy.
        replica.flush()?;
    }
    make_dirs_durably(marker_path.parent().expect("in the cycles directory"))?;
    write_durably(&marker_path, &serde_json::to_vec(&wanted).expect("serializable"))?;
    // Extra streams join once the sender has read Ready: the cycle waits for them from now.
    let streams = begin.streams.max(1);
    let (tx, joined) = sync_channel::<Joined>(wire::MAX_STREAMS as usize);
    let _waiting = match (&begin.token, streams) {
        (_, 1) => None,
        (Some(t), _) => {
            // A token already waiting is another cycle's (or this peer's, sent twice): taking
            // its place would leave that cycle without its streams, and hand it ours.
            static CYCLES: AtomicU64 = AtomicU64::new(0);
            let id = CYCLES.fetch_add(1, Ordering::Relaxed);
            match opts.joins.waiting.lock().expect("not poisoned").entry(t.clone()) {
                std::collections::hash_map::Entry::Occupied(_) => {
                    return Err(ReplError::Protocol(
                        "the token of a cycle already waiting for its streams".into(),
                    ))
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(WaitingCycle {
                        tx,
                        replica: (begin.pool.clone(), begin.vdisk.clone()),
                        left: streams - 1,
                        id,
                    });
                }
            }
            Some(Waiting {
                joins: &opts.joins,
                token: t.clone(),
                id,
            })
        }
        (None, _) => {
            return Err(ReplError::Protocol(
                "several streams and no token to join them by".into(),
            ))
        }
    };
    report.streams = streams;
    wire::write_json(
        w,
        Kind::Ready,
        &Ready {
            base_ok: base.is_some(),
            complete: false,
        },
    )?;
    w.flush()?;
    info!(replica = %begin.vdisk, snapshot = %begin.snapshot, base = ?wanted.base, resumed = report.resumed, streams, "replication cycle begins");

    let expected = Expected {
        map: Mutex::new(HashMap::new()),
        site: &*opts.joins,
        key: &opts.identity,
        failed: Mutex::new(None),
    };
    let written = AtomicU64::new(0);
    let size = begin.size;
    // The grains offered so far, a bit each (a 64th of the replica's grain map): an offer
    // costs the sender 32 bytes a block and this site a read of the grain and its hashing, so
    // a grain offered again would let a peer make it read without end.
    let mut offered: Vec<u64> = Vec::new();
    // Holes come first, each past the one before it: zeroing a range walks the grain map
    // over it, and a peer that sent a hole over the whole replica again and again would
    // keep this site at it for the whole cycle. Once in order, they walk the map once.
    let mut holes_end = 0u64;
    let mut offers_began = false;
    let replica = &*replica;
    let extras = Extras::default();
    std::thread::scope(|sc| -> Result<()> {
        let mut closing = Closing {
            extras: &extras,
            site,
            committed: false,
        };
        if streams > 1 {
            let (expected, written, extras, vdisk) = (&expected, &written, &extras, &begin.vdisk);
            // Taken as they join, on a thread of their own: a stream that joins while the
            // cycle waits for a frame on its own connection is read at once (its sender may
            // send nothing more there until it is, its writers waiting on this stream).
            let taking = std::thread::Builder::new()
                .name("repl-joins".into())
                .spawn_scoped(sc, move || loop {
                    let s = match joined.recv_timeout(std::time::Duration::from_millis(100)) {
                        Ok(Ok(s)) => s,
                        Ok(Err(why)) => {
                            expected.fail(ReplError::Protocol(why));
                            extras.changed.notify_all();
                            return;
                        }
                        Err(RecvTimeoutError::Timeout) if extras.lock().over => return,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => {
                            // No stream can join any more: the commit, if some are missing,
                            // fails at once rather than wait for them.
                            if extras.lock().joined + 1 < streams as usize {
                                expected.fail(ReplError::Protocol("the cycle no longer takes its streams".into()));
                                extras.changed.notify_all();
                            }
                            return;
                        }
                    };
                    // Under the lock the cycle's end takes: a stream that joins as the cycle
                    // ends is closed, not read by a thread the end would wait for.
                    let mut n = extras.lock();
                    if n.over {
                        return;
                    }
                    // No more than the cycle said it would open (each a thread and a frame's
                    // buffer here): `join` hands no more over, and this makes sure.
                    if n.joined + 1 >= streams as usize {
                        warn!(replica = %vdisk, streams, "a stream past the cycle's count joined it: closed");
                        continue;
                    }
                    let reader = std::thread::Builder::new()
                        .name("repl-stream".into())
                        .spawn_scoped(sc, move || {
                            let _ended = Ended(extras);
                            let mut s = s;
                            // Caught: a scoped thread that panics makes the whole scope panic,
                            // and the peer would never learn why its cycle failed.
                            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                data_stream(&mut s, expected, replica, written, opts.pace)
                            }));
                            // Recorded before the stream closes: its sender may then close the
                            // cycle's connection, and the cycle ends with this reason.
                            match read {
                                Ok(Ok(())) => {}
                                Ok(Err(e)) => {
                                    expected.fail(ReplError::Protocol(format!("a data stream of the cycle: {e}")))
                                }
                                Err(_) => expected.fail(ReplError::Protocol("a data stream's reader failed".into())),
                            }
                            drop(s);
                        });
                    if let Err(e) = reader {
                        expected.fail(ReplError::Protocol(format!("cannot take a stream of the cycle: {e}")));
                        return;
                    }
                    n.joined += 1;
                    drop(n);
                    extras.changed.notify_all();
                });
            taking.map_err(|e| ReplError::Protocol(format!("cannot take the streams of the cycle: {e}")))?;
        }
        loop {
            if let Some(why) = expected.failed.lock().expect("not poisoned").take() {
                // An extra stream failed: the cycle cannot commit, so it ends now with that
                // stream's reason, not at the commit.
                return Err(why);
            }
            // A sender whose extra stream failed may close this connection: that stream's
            // reason is the cycle's.
            let f = frame(w.get_mut(), opts.pace)
                .map_err(|e| expected.failed.lock().expect("not poisoned").take().unwrap_or(e))?;
            match f.kind {
                Kind::Offer => {
                    offers_began = true;
                    let (no, offers) = wire::decode_offer(&f.body)?;
                    let mut want = Vec::new();
                    let mut exp = expected.map.lock().expect("not poisoned");
                    for (i, o) in offers.iter().enumerate() {
                        check_range(o.offset, o.len as u64, size, begin.grain)?;
                        if o.len as u64 > begin.grain || o.blocks.len() != wire::blocks_in(o.len) {
                            return Err(ReplError::Protocol(format!(
                                "an offer of {} bytes at {}",
                                o.len, o.offset
                            )));
                        }
                        if offered.is_empty() {
                            offered = vec![0; size.div_ceil(begin.grain).div_ceil(64) as usize];
                        }
                        let g = (o.offset / begin.grain) as usize;
                        if offered[g / 64] & (1 << (g % 64)) != 0 {
                            return Err(ReplError::Protocol(format!(
                                "the grain at {} offered twice in one cycle",
                                o.offset
                            )));
                        }
                        offered[g / 64] |= 1 << (g % 64);
                        let lacking = lacking(replica, o)?;
                        if lacking.is_empty() {
                            continue;
                        }
                        // Bounded before anything is held: the cycle's, then the site's.
                        if exp.len() + lacking.len() > wire::MAX_WANTED_BLOCKS {
                            return Err(ReplError::Protocol(format!(
                                "more than {} blocks offered and not sent",
                                wire::MAX_WANTED_BLOCKS
                            )));
                        }
                        opts.joins.hold(&opts.identity, lacking.len())?;
                        let before = exp.len();
                        let mut bits = vec![0u8; o.blocks.len().div_ceil(8)];
                        for &k in &lacking {
                            bits[k / 8] |= 1 << (k % 8);
                            exp.insert(o.offset + k as u64 * BLOCK, o.blocks[k]);
                        }
                        // (Each grain is offered once, so each block is new: none to give back.)
                        opts.joins.release(&opts.identity, lacking.len() - (exp.len() - before));
                        want.push((i as u32, bits));
                    }
                    drop(exp);
                    report.offered_grains += offers.len() as u64;
                    wire::write_frame(w, Kind::Want, &wire::encode_want(no, &want))?;
                    w.flush()?;
                }
                Kind::Data => apply_data(&f.body, &expected, replica, &written)?,
                Kind::Hole => {
                    let (offset, len) = wire::decode_hole(&f.body)?;
                    check_range(offset, len, size, 1)?;
                    if offers_began {
                        return Err(ReplError::Protocol(format!(
                            "a hole of {len} bytes at {offset} after the offers"
                        )));
                    }
                    if offset < holes_end {
                        return Err(ReplError::Protocol(format!(
                            "a hole of {len} bytes at {offset} after one that ended at {holes_end}"
                        )));
                    }
                    holes_end = offset + len;
                    replica.write_zeroes(offset, len, true, false)?;
                    report.holes += 1;
                }
                Kind::Commit => {
                    // Every extra stream joins, sends its End, and is done.
                    let deadline = std::time::Instant::now() + crate::transport::SILENCE;
                    let mut n = extras.lock();
                    loop {
                        if let Some(why) = expected.failed.lock().expect("not poisoned").take() {
                            return Err(why);
                        }
                        let missing = n.joined + 1 < streams as usize;
                        if !missing && n.ended == n.joined {
                            break;
                        }
                        let left = deadline.saturating_duration_since(std::time::Instant::now());
                        if missing && left.is_zero() {
                            return Err(ReplError::Protocol(format!(
                                "commit with {} of {streams} streams joined",
                                n.joined + 1
                            )));
                        }
                        // Once all joined, each stream's read timeout and pace bound the wait
                        // for its End.
                        let wait = if missing { left } else { std::time::Duration::MAX };
                        n = extras
                            .changed
                            .wait_timeout(n, wait.min(std::time::Duration::from_secs(1)))
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                    drop(n);
                    let left = expected.map.lock().expect("not poisoned").len();
                    if left > 0 {
                        return Err(ReplError::Protocol(format!(
                            "commit with {left} blocks asked for and not sent"
                        )));
                    }
                    report.written_blocks = written.load(Ordering::Relaxed);
                    replica.flush()?;
                    engine.snapshot(&begin.vdisk, &begin.snapshot)?;
                    // Recorded before the marker goes: either says the cycle is this site's.
                    site.committed(&begin.pool, &begin.vdisk, &Commit::of(&begin))
                        .map_err(ReplError::Invalid)?;
                    let _ = std::fs::remove_file(&marker_path);
                    wire::write_json(
                        w,
                        Kind::Done,
                        &Done {
                            snapshot: begin.snapshot.clone(),
                            blocks_written: report.written_blocks,
                        },
                    )?;
                    w.flush()?;
                    info!(replica = %begin.vdisk, snapshot = %begin.snapshot, blocks = report.written_blocks, "replication cycle done");
                    closing.committed = true;
                    return Ok(());
                }
                k => return Err(ReplError::Protocol(format!("a {k:?} frame in the middle of a cycle"))),
            }
        }
    })
}

/// A cycle's extra streams: how many joined it, how many of those ended, and whether the
/// cycle is over (it takes none from then on); whoever waits is told of each change.
#[derive(Default)]
struct Extras {
    now: Mutex<ExtrasNow>,
    changed: Condvar,
}

#[derive(Default)]
struct ExtrasNow {
    joined: usize,
    ended: usize,
    over: bool,
}

impl Extras {
    fn lock(&self) -> std::sync::MutexGuard<'_, ExtrasNow> {
        self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn change(&self, f: impl FnOnce(&mut ExtrasNow)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }
}

/// Ends the taking of a cycle's streams when dropped: when the cycle ends, however. One that
/// was not `committed` failed: its site is told, before the cycle waits for its streams'
/// readers.
struct Closing<'a> {
    extras: &'a Extras,
    site: &'a dyn ReplicaSite,
    committed: bool,
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        // Over first: a stream that joins once its cycle's others are shut is not read.
        self.extras.change(|n| n.over = true);
        if !self.committed {
            self.site.failing();
        }
    }
}

/// Counts an extra stream's reader ended when dropped, however it ends.
struct Ended<'a>(&'a Extras);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.change(|n| n.ended += 1);
    }
}

/// Checks blocks that arrived against the fingerprints asked for, and writes them.
fn apply_data(
    body: &[u8],
    expected: &Expected<'_>,
    replica: &tessera_volume::Vdisk,
    written: &AtomicU64,
) -> Result<()> {
    let (offset, data) = wire::decode_data(body)?;
    check_range(offset, data.len() as u64, replica.size(), BLOCK)?;
    {
        let mut exp = expected.map.lock().expect("not poisoned");
        for (k, block) in data.chunks(BLOCK as usize).enumerate() {
            let at = offset + k as u64 * BLOCK;
            let hash = exp
                .get(&at)
                .ok_or_else(|| ReplError::Protocol(format!("data at {at} that was not asked for")))?;
            if *blake3::hash(block).as_bytes() != *hash {
                return Err(ReplError::Protocol(format!(
                    "the data at {at} does not match its fingerprint"
                )));
            }
        }
        let before = exp.len();
        for k in 0..data.len().div_ceil(BLOCK as usize) {
            exp.remove(&(offset + k as u64 * BLOCK));
        }
        expected.site.release(expected.key, before - exp.len());
    }
    replica.write(offset, &data, false)?;
    written.fetch_add(data.len().div_ceil(BLOCK as usize) as u64, Ordering::Relaxed);
    Ok(())
}

/// An extra stream of a cycle: data frames until its End.
fn data_stream(
    s: &mut Box<dyn Stream>,
    expected: &Expected<'_>,
    replica: &tessera_volume::Vdisk,
    written: &AtomicU64,
    pace: wire::Pace,
) -> Result<()> {
    loop {
        let f = wire::read_frame_paced(s, Some(pace))?
            .ok_or_else(|| ReplError::Protocol("a data stream ended before its End".into()))?;
        match f.kind {
            Kind::Data => apply_data(&f.body, expected, replica, written)?,
            Kind::End => return Ok(()),
            k => return Err(ReplError::Protocol(format!("a {k:?} frame on a data stream"))),
        }
    }
}

fn read_marker(path: &std::path::Path) -> Option<Marker> {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// The marker of a cycle being received into `pool/vdisk`: a directory per pool, since
/// names may hold dots (`dr` + `db.log` and `dr.db` + `log` must not share one).
fn marker_path(cycles_dir: &std::path::Path, pool: &str, vdisk: &str) -> PathBuf {
    cycles_dir.join(pool).join(format!("{vdisk}.cycle"))
}

/// Whether a cycle into `pool/vdisk` was cut short (its marker stands): the replica's working
/// copy then holds part of two cycles until the next cycle puts it back to its base.
pub fn cycle_cut(cycles_dir: &std::path::Path, pool: &str, vdisk: &str) -> bool {
    marker_path(cycles_dir, pool, vdisk).exists()
}

/// Forgets the cycle that was being received into `pool/vdisk`, if any: the next one, from
/// whichever sender, starts by putting the replica back to its base.
pub fn forget_cycle(cycles_dir: &std::path::Path, pool: &str, vdisk: &str) -> std::io::Result<()> {
    match std::fs::remove_file(marker_path(cycles_dir, pool, vdisk)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

fn frame<R: Read>(r: &mut R, pace: wire::Pace) -> Result<wire::Frame> {
    wire::read_frame_paced(r, Some(pace))?
        .ok_or_else(|| ReplError::Protocol("the sender closed the stream before its commit".into()))
}

fn check_begin(b: &Begin) -> Result<()> {
    validate_name("pool", &b.pool).map_err(ReplError::Invalid)?;
    validate_name("vdisk", &b.vdisk).map_err(ReplError::Invalid)?;
    validate_name("snapshot", &b.snapshot).map_err(ReplError::Invalid)?;
    if let Some(base) = &b.base {
        validate_name("snapshot", base).map_err(ReplError::Invalid)?;
    }
    if b.streams > wire::MAX_STREAMS {
        return Err(ReplError::Protocol(format!(
            "{} streams; at most {}",
            b.streams,
            wire::MAX_STREAMS
        )));
    }
    if b.size == 0 || !b.grain.is_power_of_two() || b.grain > wire::MAX_FRAME as u64 / 2 {
        return Err(ReplError::Protocol(format!(
            "a vdisk of {} bytes in {} byte grains",
            b.size, b.grain
        )));
    }
    Ok(())
}

/// An offered range must be whole grains (or the short last one) inside the vdisk.
fn check_range(offset: u64, len: u64, size: u64, align: u64) -> Result<()> {
    let end = offset.checked_add(len).filter(|&e| e <= size);
    if len == 0 || end.is_none() || !offset.is_multiple_of(align) {
        return Err(ReplError::Protocol(format!(
            "a range of {len} bytes at {offset} of a {size} byte vdisk"
        )));
    }
    Ok(())
}

/// The blocks of an offered grain that the replica holds otherwise.
fn lacking(replica: &tessera_volume::Vdisk, o: &Offered) -> Result<Vec<usize>> {
    let mut buf = vec![0u8; o.len as usize];
    replica.read(o.offset, &mut buf)?;
    Ok(buf
        .chunks(BLOCK as usize)
        .zip(&o.blocks)
        .enumerate()
        .filter(|(_, (b, h))| blake3::hash(b).as_bytes() != *h)
        .map(|(k, _)| k)
        .collect())
}

/// Removes `path` and makes its removal durable (its directory synced).
fn remove_durably(path: &std::path::Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Makes `dir` and its missing parents, each made durable in its own parent: a marker
/// written into a directory whose entry a crash then loses would be lost with it.
fn make_dirs_durably(dir: &std::path::Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        make_dirs_durably(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Writes a small file so that a crash leaves the old one or the new one.
fn write_durably(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
