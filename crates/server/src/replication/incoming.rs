//! The replica side: the listener that takes peers' cycles over TLS with the shared key, what a
//! peer may write (replicas it made, never another vdisk), the replicas' snapshots kept, and
//! promotion (a replica made a writable vdisk at its last consistent snapshot).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tessera_replication::{receive, Commit, ReceiveOptions, ReplicaSite, Transport};
use tessera_volume::{Engine, LayoutKind};
use tracing::{info, warn};

use super::{now, replication_snapshots, Incoming, KEEP_REPLICA_SNAPSHOTS};
use crate::error::{ApiError, ApiResult};
use crate::events::{source_of, NewEvent, Severity};
use crate::model::{IncomingReplicaView, PromotedView, ReplicaList};
use crate::Daemon;

/// Connections taken at once (a cycle may use up to 16); a peer past it waits for its retry.
const MAX_STREAMS: usize = 64;
/// Of those, the streams the cycles of one key may hold (every stream of each, as its Begin
/// says: two cycles of 16 streams, or 32 cycles of one), so that whoever holds a key (a
/// site, or a thief of its key) leaves the other keys' peers room.
const MAX_STREAMS_PER_KEY: usize = MAX_STREAMS / 2;
/// And the connections of one key that proved it and have not said what they bring (a
/// cycle's Begin, or a stream's Join) yet, or were refused at their Begin and are being
/// closed: with the streams above, 40 places past the handshake at most.
const MAX_OPENINGS_PER_KEY: usize = 8;
/// Handshakes under way at once from one source (an IPv4 address, an IPv6 /64). A cycle opens its streams one after
/// another (one handshake at a time), so this leaves room for a site's cycles of several
/// replicas at once, and a stranger who cannot finish a handshake holds no more than this of
/// the places above.
const MAX_HANDSHAKES_PER_SOURCE: usize = 8;
/// How long each read of a cycle's connection waits once the cycle failed and its refusal
/// is sent (the receiver reads on until the sender, reading the refusal, closes): a sender
/// that neither sends nor closes is let go after this, not the whole silence.
const REFUSAL_READS: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a promotion waits for a cycle it cut to end (the receiving threads to see their
/// connections closed and let the replica go): past the silence after which a cycle waiting
/// at its commit for a stream that never joins gives up.
const CUT_WAIT: std::time::Duration =
    tessera_replication::transport::SILENCE.saturating_add(std::time::Duration::from_secs(15));

/// What each of several holders (sources, keys) holds, each up to the same share.
struct Shares<K> {
    share: usize,
    held: parking_lot::Mutex<HashMap<K, usize>>,
}

impl<K: std::hash::Hash + Eq> Shares<K> {
    fn new(share: usize) -> Shares<K> {
        Shares {
            share,
            held: Default::default(),
        }
    }

    /// Counts `n` more for `holder`, unless that would pass its share.
    fn take(&self, holder: K, n: usize) -> bool {
        let mut m = self.held.lock();
        let held = m.entry(holder).or_default();
        if *held + n > self.share {
            return false;
        }
        *held += n;
        true
    }

    fn give(&self, holder: &K, n: usize) {
        let mut m = self.held.lock();
        if let Some(held) = m.get_mut(holder) {
            *held = held.saturating_sub(n);
            if *held == 0 {
                m.remove(holder);
            }
        }
    }
}

/// The handshakes under way, by the source they come from (`source_of`).
struct Handshakes(Shares<IpAddr>);

impl Default for Handshakes {
    fn default() -> Handshakes {
        Handshakes(Shares::new(MAX_HANDSHAKES_PER_SOURCE))
    }
}

impl Handshakes {
    /// Counts one more from `ip`, unless its source has its share under way already.
    fn begin(&self, ip: IpAddr) -> bool {
        self.0.take(source_of(ip), 1)
    }

    fn end(&self, ip: IpAddr) {
        self.0.give(&source_of(ip), 1)
    }
}

/// The listener's places each key's peers hold, by the identity of the key: its connections
/// whose opening has not come yet, and the streams its cycles said they open.
pub(crate) struct KeyPlaces {
    openings: Shares<String>,
    streams: Shares<String>,
}

impl Default for KeyPlaces {
    fn default() -> KeyPlaces {
        KeyPlaces {
            openings: Shares::new(MAX_OPENINGS_PER_KEY),
            streams: Shares::new(MAX_STREAMS_PER_KEY),
        }
    }
}

/// Binds `replication_listen` and takes peers' cycles on threads of their own. The key file
/// is made when it does not exist: copy it to the peers.
pub fn start_listener(d: &Arc<Daemon>) -> Result<Option<SocketAddr>, String> {
    let Some(addr) = d.cfg.replication_listen else {
        return Ok(None);
    };
    let keys = &d.cfg.replication_psk_file;
    if tessera_psk::create_psk_file(keys, "tessera")? {
        info!(path = %keys.display(), "made a replication key; copy it to the peer sites");
    }
    let keys = Arc::new(super::listener_keys::ListenerKeys::load(
        keys,
        &d.cfg.replication_congestion,
    )?);
    *d.replication.keys.lock() = Some(keys.clone());
    let l = TcpListener::bind(addr)
        .map_err(|e| format!("cannot listen for replication on {addr}: {e}; choose another with replication_listen"))?;
    let bound = l.local_addr().map_err(|e| e.to_string())?;
    *d.replication.listening.lock() = Some(bound);
    let d = d.clone();
    let streams = d.replication.connections.clone();
    let handshakes = Arc::new(Handshakes::default());
    std::thread::Builder::new()
        .name("repl-listen".into())
        .spawn(move || {
            for s in l.incoming() {
                let s = match s {
                    Ok(s) => s,
                    Err(e) => {
                        // Out of descriptors, most often: accepting again at once would fail
                        // at once, a core spinning, until some are given back.
                        warn!(error = %e, "replication accept failed");
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        continue;
                    }
                };
                let Ok(peer) = s.peer_addr().map(|a| a.ip()) else { continue };
                if !crate::networks::admits(&d.cfg.replication_peers, peer) {
                    drop(s);
                    peer_refused(&d, &peer.to_string(), peer, "not an address replication_peers lists");
                    continue;
                }
                if streams.load(Ordering::Relaxed) >= MAX_STREAMS {
                    drop(s);
                    continue;
                }
                if !handshakes.begin(peer) {
                    warn!(%peer, "replication connection refused: {MAX_HANDSHAKES_PER_SOURCE} handshakes from this address (or its IPv6 /64) are under way");
                    drop(s);
                    continue;
                }
                // A key taken out of the file since lets this peer in no more.
                d.reread_replication_keys();
                let place = Place::take(&streams);
                let (d, t, h) = (d.clone(), keys.transport(), handshakes.clone());
                // Not spawned: the closure, and the place with it, is dropped.
                let spawned = std::thread::Builder::new()
                    .name("repl-recv".into())
                    .spawn(move || take_cycle(&d, &t, s, place, || h.end(peer)));
                if spawned.is_err() {
                    handshakes.end(peer);
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(Some(bound))
}

impl Daemon {
    /// Reads the listener's key file again if it changed: the connections of cycles under
    /// way with a key no longer in it are cut (as a promotion cuts them), and an event says
    /// so; a file that cannot be taken leaves the keys as they were, and an event says why.
    pub(crate) fn reread_replication_keys(&self) {
        let Some(keys) = self.replication.keys.lock().clone() else {
            return;
        };
        match keys.reread() {
            super::listener_keys::Reread::Same => {}
            super::listener_keys::Reread::Refused(why) => {
                self.events.record(NewEvent::new(
                    Severity::Warning,
                    "replica.keys_refused",
                    format!("the replication key file changed and was not taken (the keys stay as they were): {why}"),
                ));
            }
            super::listener_keys::Reread::Revoked(gone) => {
                info!(revoked = ?gone, "replication keys read again");
                if gone.is_empty() {
                    return;
                }
                let mut cut = 0;
                for l in self.replication.live.lock().streams.values().flatten() {
                    if gone.contains(&l.identity) {
                        let _ = l.sock.shutdown(std::net::Shutdown::Both);
                        cut += 1;
                    }
                }
                self.events.record(NewEvent::new(
                    Severity::Warning,
                    "replica.keys_revoked",
                    format!(
                        "replication keys taken out of the key file: {}; {cut} connection(s) of cycles under way with them cut",
                        gone.join(", ")
                    ),
                ));
            }
        }
    }
}

/// Records that the peer `subject` (its address, counted for the refusal limits as `from`)
/// was refused before it proved a key.
fn peer_refused(d: &Daemon, subject: &str, from: IpAddr, why: &str) {
    d.events.record_refusal(
        NewEvent::new(
            Severity::Warning,
            "replica.peer_refused",
            format!("replication from {subject} refused: {why}"),
        )
        .subject(subject),
        from,
    );
}

/// One of the listener's `MAX_STREAMS` places, given back when dropped: when the connection's
/// thread ends, or, for an extra stream handed to its cycle (and read by that cycle's
/// thread), when the cycle ends.
pub(crate) struct Place(Arc<AtomicUsize>);

impl Place {
    fn take(count: &Arc<AtomicUsize>) -> Place {
        count.fetch_add(1, Ordering::Relaxed);
        Place(count.clone())
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection listed under the replica its cycle writes: its number, a handle a promotion
/// cuts it by, and its place at the listener, kept as long as it is listed.
pub(crate) struct Listed {
    id: u64,
    sock: TcpStream,
    /// The identity of the key the peer proved: a connection is cut when its key is taken
    /// out of the file.
    identity: String,
    _place: Option<Place>,
}

/// Takes a peer's connection: the handshake (`shaken` is called once it is over, whichever
/// way), then the cycle or the stream it brings. Its `place` goes with it.
fn take_cycle(d: &Arc<Daemon>, t: &Transport, s: TcpStream, place: Place, shaken: impl FnOnce()) {
    static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let peer = s.peer_addr().map(|a| a.ip().to_string()).unwrap_or_default();
    // A connection a promotion could not cut is not taken.
    let sock = match s.try_clone() {
        Ok(c) => c,
        Err(e) => {
            warn!(peer = %peer, error = %e, "replication connection refused: cannot keep a handle to cut it by");
            shaken();
            return;
        }
    };
    let accepted = t.accept_until_opened(s);
    shaken();
    let (conn, opening) = match accepted {
        Ok(c) => c,
        Err(e) => {
            // Someone without the key (nothing was read from them), or a handshake this side
            // could not watch.
            let from = peer.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
            peer_refused(d, &peer, from, &e);
            return;
        }
    };
    // The key the peer proved: the replicas it may write are those made with it.
    let key = conn
        .ssl()
        .psk_identity()
        .map(|i| String::from_utf8_lossy(i).into_owned())
        .unwrap_or_default();
    // Counted until its opening comes: refused at once past its key's share.
    if !d.replication.key_places.openings.take(key.clone(), 1) {
        let why = format!(
            "{MAX_OPENINGS_PER_KEY} connections of key '{key}' are waiting to say what they bring, as many as one key may have at this site: this one is refused, and tried again at the next retry"
        );
        warn!(peer = %peer, "replication connection refused: {why}");
        refuse_unopened(conn, &sock, &why);
        return;
    }
    let site = Site {
        d: d.clone(),
        peer: peer.clone(),
        key,
        claimed: parking_lot::Mutex::new(None),
        admitted: parking_lot::Mutex::new(None),
        sock,
        id: CONNECTIONS.fetch_add(1, Ordering::Relaxed),
        registered: parking_lot::Mutex::new(None),
        place: parking_lot::Mutex::new(Some(place)),
        opening_counted: std::sync::atomic::AtomicBool::new(true),
        streams_counted: AtomicUsize::new(0),
    };
    // Closed for good when the receiver lets it go (a stream past its count, or one that
    // failed): the handle a promotion cuts it by would keep it open until the cycle ends.
    let conn = ClosedOnDrop(conn);
    let opts = ReceiveOptions {
        layout: LayoutKind::Mirror,
        cycles_dir: super::cycles_dir(&d.cfg.state_dir),
        joins: d.replication.joins.clone(),
        opening: std::sync::Mutex::new(Some(opening)),
        pace: Default::default(),
        identity: site.key.clone(),
    };
    // A bug in the receiver fails this cycle, not the listing of its streams and places
    // below (the replica would stay "being written" and the places taken for good).
    let out =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| receive(conn, &site, &opts))).unwrap_or_else(|_| {
            Err(tessera_replication::ReplError::Invalid(
                "the receiver of the cycle failed; the cycle is given up".into(),
            ))
        });
    let claimed = site.claimed.lock().take();
    // An extra stream handed to its cycle is read on by that cycle, which may outlive this
    // thread: it stays listed under the replica, and keeps its place at the listener, until
    // the cycle's own connection ends.
    let handed_over = matches!(&out, Ok(r) if r.joined);
    // Unlisted however what follows ends, a panic included: a replica left listed would stay
    // "being written", and counted against its key's quota, until the daemon restarts.
    let _unlist = Unlist {
        d,
        site: &site,
        claimed: claimed.as_deref(),
        handed_over,
    };
    match out {
        Ok(r) if r.joined => {} // an extra stream, handed to its cycle
        Ok(_) => {
            if let Some(key) = &claimed {
                // The cycle itself was recorded at its commit (`committed`).
                let recorded = d.replication.change(|s| {
                    if let Some(i) = s.incoming.get_mut(key) {
                        i.source = peer.clone();
                    }
                    Ok(())
                });
                if let Err(e) = recorded {
                    warn!(replica = %key, error = %e.message, "cannot record a replication cycle");
                }
                if let Some((pool, vdisk)) = key.split_once('/') {
                    d.prune_replica_snapshots(pool, vdisk);
                }
            }
        }
        // The error may quote what the peer sent (a name it failed to pass).
        Err(e) => warn!(
            peer = %peer,
            error = %tessera_replication::wire::peer_text(&e.to_string()),
            "replication cycle from a peer failed"
        ),
    }
}

/// Refuses a connection whose opening was not read, saying `why`: a source reads it as the
/// answer to its Begin (an extra stream's source reads nothing there, and its cycle fails).
/// Closed at once: the connection counts against no key's share, so waiting here for the
/// peer to close would let a key holder hold places past its share. What the peer sent so
/// far is read first, without waiting, so that closing resets nothing that came already; a
/// Begin that comes later meets a reset, and its source still finds the refusal before it.
fn refuse_unopened(mut conn: tessera_replication::transport::Connection, sock: &TcpStream, why: &str) {
    use std::io::{Read, Write};
    use tessera_replication::wire::{self, Kind, Refusal};
    let refused = wire::write_json(&mut conn, Kind::Error, &Refusal { message: why.into() })
        .map_err(|e| e.to_string())
        .and_then(|_| conn.flush().map_err(|e| e.to_string()));
    if refused.is_ok() && sock.set_nonblocking(true).is_ok() {
        let (mut sink, mut left) = ([0u8; 4096], 64usize << 10);
        while left > 0 {
            match conn.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    }
    let _ = sock.shutdown(std::net::Shutdown::Both);
}

/// A peer's connection, shut down when dropped, whatever other handles to its socket are
/// kept.
struct ClosedOnDrop(tessera_replication::transport::Connection);

impl std::io::Read for ClosedOnDrop {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(b)
    }
}

impl std::io::Write for ClosedOnDrop {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        let _ = self.0.get_ref().shutdown(std::net::Shutdown::Both);
    }
}

/// Calls [`unlist`] when dropped.
struct Unlist<'a> {
    d: &'a Daemon,
    site: &'a Site,
    claimed: Option<&'a str>,
    handed_over: bool,
}

impl Drop for Unlist<'_> {
    fn drop(&mut self) {
        unlist(self.d, self.site, self.claimed, self.handed_over);
    }
}

/// Takes the connection of `site` off the lists of cycles under way, and the replica it
/// `claimed` with it once its cycle is over (unless the connection was an extra stream
/// `handed_over` to its cycle).
fn unlist(d: &Daemon, site: &Site, claimed: Option<&str>, handed_over: bool) {
    // Before `live`, as a claim takes them: the replica leaves `growing` with `receiving`, so
    // that the entry of the next cycle that claims it is never the one taken out here.
    let mut growing = d.cfg.replication_quota.map(|_| d.replication.growing.lock());
    let mut live = d.replication.live.lock();
    if let Some(key) = site.registered.lock().take().filter(|_| !handed_over) {
        if let Some(v) = live.streams.get_mut(&key) {
            v.retain(|l| l.id != site.id);
            if v.is_empty() {
                live.streams.remove(&key);
            }
        }
    }
    if let Some(key) = claimed {
        // The cycle is over, with every stream that joined it (its readers were joined
        // before `receive` returned).
        live.streams.remove(key);
        live.receiving.remove(key);
        // Its vdisk now holds what it made (or nothing, if it made none): counted as it is.
        if let Some(growing) = &mut growing {
            growing.remove(key);
        }
    }
}

/// What one peer's cycle may do here.
struct Site {
    d: Arc<Daemon>,
    peer: String,
    /// The identity of the replication key the peer proved.
    key: String,
    /// The replica this cycle writes, once claimed.
    claimed: parking_lot::Mutex<Option<String>>,
    /// The size the cycle may make its replica, once the replication quota admitted it.
    admitted: parking_lot::Mutex<Option<u64>>,
    /// The connection, for a promotion to cut; its number; the replica it is listed under.
    sock: TcpStream,
    id: u64,
    registered: parking_lot::Mutex<Option<String>>,
    /// Its place at the listener, until it is listed under a replica (which then keeps it).
    place: parking_lot::Mutex<Option<Place>>,
    /// Whether it counts among its key's connections whose opening has not come yet.
    opening_counted: std::sync::atomic::AtomicBool,
    /// The streams its cycle counts for among its key's, once its Begin said how many.
    streams_counted: AtomicUsize,
}

impl Site {
    /// Its opening came (a Begin, or a Join): it no longer counts as waiting for it.
    fn opened(&self) {
        if self.opening_counted.swap(false, Ordering::SeqCst) {
            self.d.replication.key_places.openings.give(&self.key, 1);
        }
    }
}

impl Drop for Site {
    /// The connection is over: its cycle's streams (which ended with it) count no more.
    fn drop(&mut self) {
        self.opened();
        let n = self.streams_counted.swap(0, Ordering::SeqCst);
        self.d.replication.key_places.streams.give(&self.key, n);
    }
}

impl Site {
    /// Refuses a replica made with another key than the one this peer proved.
    /// Refuses a peer whose key was taken out of the file after it connected (checked under
    /// the live lock, where its connections are listed: those listed before are cut by the
    /// reading that saw the key gone, `reread_replication_keys`).
    fn key_still_held(&self) -> Result<(), String> {
        match self.d.replication.keys.lock().as_ref() {
            Some(k) if !k.holds(&self.key) => Err(format!(
                "the replication key '{}' was taken out of this site's key file",
                self.key
            )),
            _ => Ok(()),
        }
    }

    fn own(&self, replica: &str, rec: &super::Incoming) -> Result<(), String> {
        match &rec.key {
            Some(k) if *k != self.key => Err(format!(
                "'{replica}' is the replica of a source with another replication key: a peer writes only the replicas made with its own"
            )),
            _ => Ok(()),
        }
    }

    /// A handle on this connection, for a promotion to cut it by.
    fn handle(&self) -> Result<TcpStream, String> {
        self.sock
            .try_clone()
            .map_err(|e| format!("cannot keep a handle on the connection to cut it by: {e}"))
    }

    /// Lists this connection under the replica its cycle writes (the caller holds the live
    /// lock, and the replica is being received).
    fn register(&self, live: &mut super::Live, key: &str, handle: TcpStream) {
        live.streams.entry(key.to_string()).or_default().push(Listed {
            id: self.id,
            sock: handle,
            identity: self.key.clone(),
            _place: self.place.lock().take(),
        });
        *self.registered.lock() = Some(key.to_string());
    }
}

/// The record, beside a vdisk in its pool's metadata, that marks it a replica (its value: the
/// source's address). Kept with the vdisk's logical unit records, which a gateway that takes
/// a pool on RADOS over finds as the last owner left them, and which go with the vdisk.
const REPLICA_MARK: &str = "replica-of";

/// The record beside the mark of the identity of the replication key the replica's source
/// proved (its value): a gateway that takes the replica on from its pool binds it to that
/// key, as the gateway that received it had, so that no holder of another key of the site's
/// file can take it over by writing it first. None: bound to the next cycle's key (a replica
/// marked before keys were kept, or made one again by a demotion).
const REPLICA_KEY: &str = "replica-key";

/// The record a promotion leaves where it clears a replica's mark (its value: when, in
/// seconds since the epoch), so that a gateway still holding its record of the replica never
/// takes the vdisk for one again, even one that could not save its note of having marked it.
/// A demotion, which makes the vdisk a replica again, removes it.
const REPLICA_PROMOTED: &str = "replica-promoted";

/// The record a promotion makes before it drops this daemon's record of a replica, and
/// clears with the mark once it is done: until then the source's cycles are refused, and no
/// gateway that opens the pool takes the vdisk on again as a replica; the promotion can be
/// made again.
const REPLICA_PROMOTING: &str = "replica-promoting";

/// The record a cycle makes before it changes a replica's working copy, and clears once its
/// snapshot is taken (its value: that snapshot's name), so that the copy, holding part of two
/// cycles meanwhile, is copied by no daemon that opens the pool: the receiving daemon's
/// marker of the cycle is a file beside it, which the gateway that takes a pool on RADOS over
/// from it never sees. A promotion, which puts the copy back to a snapshot, clears it.
const REPLICA_CYCLE: &str = "replica-cycle";

impl Site {
    /// Whether replica `key` (`pool/vdisk`) may be made `size` bytes under the peer's
    /// replication key: what the key's other replicas hold (a vdisk a cycle is writing at the
    /// larger of its size now and the size that cycle may make it; a record whose vdisk is
    /// gone, promoted or deleted, holds nothing), and `size`, within `replication_quota`.
    fn within_quota(&self, key: &str, size: u64, growing: &BTreeMap<String, u64>) -> Result<(), String> {
        let Some(quota) = self.d.cfg.replication_quota else {
            return Ok(());
        };
        let others: Vec<String> = self
            .d
            .replication
            .saved
            .lock()
            .incoming
            .iter()
            .filter(|(k, i)| *k != key && i.key.as_deref() == Some(self.key.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        let held: u64 = others
            .iter()
            .map(|k| {
                let now = k
                    .split_once('/')
                    .and_then(|(p, v)| self.d.vdisk(p, v).ok())
                    .map_or(0, |(_, v)| v.size());
                let may_be = growing.get(k).copied().unwrap_or(0);
                now.max(may_be)
            })
            .sum();
        if held.saturating_add(size) > quota {
            return Err(format!(
                "the replicas of key '{}' may take {} here (replication_quota), and hold {} already: '{key}' of {} is refused",
                self.key,
                crate::units::format_size(quota),
                crate::units::format_size(held),
                crate::units::format_size(size)
            ));
        }
        Ok(())
    }

    /// Marks `pool/vdisk` a replica in its pool's metadata, for every gateway that opens the
    /// pool, while this daemon holds it as one: under the lock a promotion drops the record
    /// under, so that a promotion's clearing of the mark always comes after.
    fn mark(&self, pool: &str, vdisk: &str) -> Result<(), String> {
        let key = format!("{pool}/{vdisk}");
        let _marks = self.d.replication.marks.lock();
        let Some(rec) = self.d.replication.saved.lock().incoming.get(&key).cloned() else {
            return Err(format!("'{key}' is no longer a replica held here"));
        };
        let id = self.d.vdisk(pool, vdisk).map_err(|e| e.message)?.1.id();
        if rec.vdisk_id.is_some_and(|was| was != id) {
            return Err(format!(
                "'{key}' is no longer the replica held here: it was made again through another gateway of its pool"
            ));
        }
        self.d
            .mark_replica(pool, vdisk, &self.peer, rec.key.as_deref(), false)
            .map_err(|e| e.message)?;
        if rec.marked && rec.vdisk_id == Some(id) {
            return Ok(());
        }
        self.d
            .replication
            .change(|s| {
                if let Some(i) = s.incoming.get_mut(&key) {
                    i.marked = true;
                    i.vdisk_id = Some(id);
                }
                Ok(())
            })
            .map_err(|e| e.message)
    }
}

impl ReplicaSite for Site {
    fn engine(&self, pool: &str) -> Result<Arc<Engine>, String> {
        let allowed = &self.d.cfg.replication_pools;
        if !allowed.is_empty() && !allowed.iter().any(|p| p == pool) {
            return Err(format!(
                "pool '{pool}' takes no replicas here (replication_pools: {})",
                allowed.join(", ")
            ));
        }
        self.d.engine(pool).map_err(|e| e.message)
    }

    fn may_hold(&self, pool: &str, vdisk: &str, size: u64) -> Result<(), String> {
        if self.d.cfg.replication_quota.is_none() {
            return Ok(());
        }
        // Checked here for a clear answer before anything is done, and again as the replica
        // is claimed (`writing`), where it holds against the other cycles.
        let growing = self.d.replication.growing.lock();
        self.within_quota(&format!("{pool}/{vdisk}"), size, &growing)?;
        *self.admitted.lock() = Some(size);
        Ok(())
    }

    fn may_write(&self, pool: &str, vdisk: &str, exists: bool) -> Result<(), String> {
        let key = format!("{pool}/{vdisk}");
        let held = self.d.replication.saved.lock().incoming.get(&key).cloned();
        if exists && held.is_none() {
            return Err(format!(
                "'{key}' exists here and is not a replica: a peer never writes over it"
            ));
        }
        let Some(rec) = held.filter(|_| exists) else {
            return Ok(());
        };
        self.own(&key, &rec)?;
        if self.d.promoting(pool, vdisk).map_err(|e| e.message)? {
            return Err(format!("'{key}' is being promoted: a peer never writes it again"));
        }
        if self.d.record_is_stale(pool, vdisk, &rec).map_err(|e| e.message)? {
            return Err(format!(
                "'{key}' is no longer a replica: it was promoted (or made again) through another gateway of its pool, and a peer never writes over it"
            ));
        }
        Ok(())
    }

    fn may_name(&self, snapshot: &str) -> Result<(), String> {
        if snapshot.starts_with(super::SNAPSHOT_PREFIX) {
            Ok(())
        } else {
            Err(format!(
                "a cycle's snapshot is named '{}…' (this one: '{snapshot}'): this site prunes those, and keeps no other",
                super::SNAPSHOT_PREFIX
            ))
        }
    }

    fn writing(&self, pool: &str, vdisk: &str, existed: bool) -> Result<(), String> {
        let key = format!("{pool}/{vdisk}");
        // The key the pool's mark binds the replica to, read before the lock (a metadata read
        // may go to the cluster): it binds a record of this daemon's that has none.
        let marked_key = match existed {
            true => self.d.replica_key(pool, vdisk).map_err(|e| e.message)?,
            false => None,
        };
        // The quota again, with every other cycle of the key counted at the size it may make
        // its replica, and this one counted from its claim on: two cycles cannot both pass.
        let mut growing = self.d.cfg.replication_quota.map(|_| self.d.replication.growing.lock());
        let admitted = *self.admitted.lock();
        if let Some(growing) = &growing {
            match admitted {
                Some(size) => self.within_quota(&key, size, growing)?,
                // Found at its full size as the cycle began, gone now: the quota was not asked
                // for the replica this cycle would make. The next cycle asks it.
                None if !existed => {
                    return Err(format!(
                        "'{key}' was deleted here as its cycle began: the next cycle makes it again"
                    ))
                }
                None => {}
            }
        }
        // The claim, the check and the record under the live lock, as a promotion checks the
        // claims and drops the record under it: neither can come between the other's steps.
        let mut live = self.d.replication.live.lock();
        self.key_still_held()?;
        if live.receiving.contains(&key) {
            return Err(format!("another cycle is writing '{key}'"));
        }
        if live.promoting.contains(&key) {
            return Err(format!("'{key}' is being promoted here: a peer never writes it again"));
        }
        // A clone or an image being made of the working copy would take part of two cycles.
        if live.copying.contains(&key) {
            return Err(format!("'{key}' is being cloned here: the cycle waits for it"));
        }
        if let Some(job) = self.d.jobs.running("export", &key) {
            return Err(format!(
                "'{key}' is being exported to an image (job {job}): the cycle waits for it"
            ));
        }
        let handle = self.handle()?;
        // Recorded before anything is written or made: from here on the vdisk is a replica.
        self.d
            .replication
            .change(|s| {
                if existed && !s.incoming.contains_key(&key) {
                    return Err(ApiError::invalid(format!(
                        "'{key}' is no longer a replica held here (promoted, or made here meanwhile): a peer never writes over it"
                    )));
                }
                let fresh = || Incoming {
                    source: self.peer.clone(),
                    created_at: now(),
                    key: Some(self.key.clone()),
                    ..Default::default()
                };
                if existed {
                    let rec = s.incoming.entry(key.clone()).or_insert_with(fresh);
                    if rec.key.is_none() {
                        rec.key = marked_key.clone();
                    }
                    self.own(&key, rec).map_err(ApiError::invalid)?;
                    rec.key.get_or_insert_with(|| self.key.clone());
                } else {
                    // A record of a vdisk of that name that is gone (deleted through another
                    // gateway of the pool) is of no use to the replica made now.
                    s.incoming.insert(key.clone(), fresh());
                }
                Ok(())
            })
            .map_err(|e| e.message)?;
        self.register(&mut live, &key, handle);
        live.receiving.insert(key.clone());
        if let (Some(growing), Some(size)) = (&mut growing, admitted) {
            growing.insert(key.clone(), size);
        }
        *self.claimed.lock() = Some(key);
        drop(live);
        drop(growing);
        // An existing replica is marked before it is written (one made, or found unmarked
        // because its making ended before its mark, is marked before anything is written).
        if existed {
            self.mark(pool, vdisk)?;
        }
        Ok(())
    }

    fn streams(&self, n: u32) -> Result<(), String> {
        let n = n as usize;
        // Refused, it still counts among its key's openings until it is closed.
        if !self.d.replication.key_places.streams.take(self.key.clone(), n) {
            return Err(format!(
                "the cycles of key '{}' may hold {MAX_STREAMS_PER_KEY} of this site's {MAX_STREAMS} connections, \
                 and this cycle's {n} stream(s) would pass that: it is tried again at the next retry",
                self.key
            ));
        }
        let before = self.streams_counted.swap(n, Ordering::SeqCst);
        self.d.replication.key_places.streams.give(&self.key, before);
        self.opened();
        Ok(())
    }

    fn joining(&self, pool: &str, vdisk: &str) -> Result<(), String> {
        let key = format!("{pool}/{vdisk}");
        let handle = self.handle()?;
        if let Some(rec) = self.d.replication.saved.lock().incoming.get(&key) {
            self.own(&key, rec)?;
        }
        let mut live = self.d.replication.live.lock();
        self.key_still_held()?;
        if !live.receiving.contains(&key) {
            return Err(format!("the cycle writing '{key}' has ended"));
        }
        self.register(&mut live, &key, handle);
        // Counted from now on among its cycle's streams, which its cycle's Begin counted.
        self.opened();
        Ok(())
    }

    fn failing(&self) {
        // The refusal's drain: each read waits this long at most for what the sender sends.
        let _ = self.sock.set_read_timeout(Some(REFUSAL_READS));
        let Some(key) = self.claimed.lock().clone() else {
            return;
        };
        let live = self.d.replication.live.lock();
        for l in live.streams.get(&key).into_iter().flatten() {
            if l.id != self.id {
                let _ = l.sock.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    fn not_made(&self, pool: &str, vdisk: &str) {
        let key = format!("{pool}/{vdisk}");
        let forgotten = self.d.replication.change(|s| {
            // Only a record of a replica never committed: this cycle's (a vdisk of the name
            // found meanwhile is one made here, which the peer must never write).
            if s.incoming
                .get(&key)
                .is_some_and(|i| i.cycles == 0 && i.last_snapshot.is_none())
            {
                s.incoming.remove(&key);
            }
            Ok(())
        });
        if let Err(e) = forgotten {
            warn!(replica = %key, error = %e.message, "cannot forget the record of a replica not made");
        }
    }

    fn last_committed(&self, pool: &str, vdisk: &str) -> Option<Commit> {
        let key = format!("{pool}/{vdisk}");
        let rec = self.d.replication.saved.lock().incoming.get(&key).cloned()?;
        // Only of the vdisk the record was made of: a snapshot left by one deleted since is
        // not this replication's commit.
        let id = self.d.vdisk(pool, vdisk).ok()?.1.id();
        if rec.vdisk_id.is_some_and(|was| was != id) {
            return None;
        }
        Some(Commit {
            snapshot: rec.last_snapshot?,
            snapshot_id: rec.last_snapshot_id,
        })
    }

    fn made(&self, pool: &str, vdisk: &str) -> Result<(), String> {
        self.mark(pool, vdisk)
    }

    fn changing(&self, pool: &str, vdisk: &str, snapshot: &str) -> Result<(), String> {
        let (e, v) = self.d.vdisk(pool, vdisk).map_err(|e| e.message)?;
        e.set_lun_state(&v, REPLICA_CYCLE, Some(snapshot.as_bytes()))
            .map_err(|e| format!("cannot record in its pool that a cycle changes '{pool}/{vdisk}': {e}"))
    }

    fn settled(&self, pool: &str, vdisk: &str, snapshot: &str) -> Result<(), String> {
        let (e, v) = self.d.vdisk(pool, vdisk).map_err(|e| e.message)?;
        let recorded = e.lun_state(&v, REPLICA_CYCLE).map_err(|e| e.to_string())?;
        if recorded.as_deref() != Some(snapshot.as_bytes()) {
            return Ok(());
        }
        // Cleared under the live lock, and not while a cycle writes the copy: a later cycle
        // claims it there (`writing`) before it records its own (`changing`), which this
        // must not clear. Rare (a daemon died between a commit and this record's clearing),
        // so the commit under the lock costs the other replicas' cycles nothing in practice.
        let live = self.d.replication.live.lock();
        if live.receiving.contains(&format!("{pool}/{vdisk}")) {
            return Ok(());
        }
        // Read again under the lock: a cycle may have claimed, changed and left the copy
        // since.
        let recorded = e.lun_state(&v, REPLICA_CYCLE).map_err(|e| e.to_string())?;
        if recorded.as_deref() != Some(snapshot.as_bytes()) {
            return Ok(());
        }
        e.set_lun_state(&v, REPLICA_CYCLE, None)
            .map_err(|e| format!("cannot record in its pool that '{pool}/{vdisk}' is whole again: {e}"))?;
        drop(live);
        Ok(())
    }

    fn committed(&self, pool: &str, vdisk: &str, commit: &Commit) -> Result<(), String> {
        let key = format!("{pool}/{vdisk}");
        // (A replica made before there were marks has its mark made here.)
        self.mark(pool, vdisk)?;
        // The working copy is the snapshot just taken: whole, for every gateway of the pool.
        let (e, v) = self.d.vdisk(pool, vdisk).map_err(|e| e.message)?;
        e.set_lun_state(&v, REPLICA_CYCLE, None)
            .map_err(|e| format!("cannot record in its pool that '{pool}/{vdisk}' is whole again: {e}"))?;
        self.d
            .replication
            .change(|s| {
                if let Some(i) = s.incoming.get_mut(&key) {
                    i.cycles += 1;
                    i.last_snapshot = Some(commit.snapshot.clone());
                    i.last_snapshot_id = commit.snapshot_id;
                    i.last_cycle_at = Some(now());
                }
                Ok(())
            })
            .map_err(|e| e.message)
    }
}

impl Daemon {
    /// Both directions, for `replica list`.
    pub fn list_replicas(&self) -> ReplicaList {
        let saved = self.replication.saved.lock().clone();
        ReplicaList {
            outgoing: saved.outgoing.iter().map(|(n, o)| self.outgoing_view(n, o)).collect(),
            incoming: saved
                .incoming
                .keys()
                .filter_map(|k| k.split_once('/'))
                .filter_map(|(p, v)| self.incoming_view(p, v).ok())
                .collect(),
            listen: self.replication.listening.lock().map(|a| a.to_string()),
        }
    }

    pub fn incoming_view(&self, pool: &str, vdisk: &str) -> ApiResult<IncomingReplicaView> {
        let key = format!("{pool}/{vdisk}");
        let i = self
            .replication
            .saved
            .lock()
            .incoming
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("'{key}' is not a replica held here")))?;
        let snapshots = self
            .engine(pool)
            .map(|e| replication_snapshots(&e, vdisk))
            .unwrap_or_default();
        Ok(IncomingReplicaView {
            pool: pool.to_string(),
            vdisk: vdisk.to_string(),
            source: i.source,
            created_at: i.created_at,
            last_snapshot: i.last_snapshot,
            last_cycle_at: i.last_cycle_at,
            cycles: i.cycles,
            receiving: self.replication.live.lock().receiving.contains(&key),
            snapshots,
        })
    }

    /// Makes a replica an ordinary writable vdisk, put back to its last consistent snapshot
    /// (a cycle cut short may have left part of the next one). Its peer's cycles are refused
    /// from then on; `replica create --reverse` replicates it back.
    pub fn promote_replica(&self, pool: &str, vdisk: &str) -> ApiResult<PromotedView> {
        let mut p = self.promote_replicas(pool, &[vdisk.to_string()])?;
        Ok(p.remove(0))
    }

    /// Promotes the replicas of a consistency group together, each at the newest snapshot
    /// all of them hold: the last instant of the group that reached this site whole.
    pub fn promote_replicas(&self, pool: &str, vdisks: &[String]) -> ApiResult<Vec<PromotedView>> {
        if vdisks.is_empty() {
            return Err(ApiError::invalid("name the replicas to promote"));
        }
        let e = self.engine(pool)?;
        // Checked first, so that a promotion that cannot be made cuts nothing; and again
        // below, under the live lock, once no cycle writes them.
        self.promotion_point(&e, pool, vdisks)?;
        let keys: Vec<String> = vdisks.iter().map(|v| format!("{pool}/{v}")).collect();
        // No cycle may claim them while the promotion waits for the one it cut to let go.
        struct Promoting<'a>(&'a super::Replication, &'a [String]);
        impl Drop for Promoting<'_> {
            fn drop(&mut self) {
                let mut live = self.0.live.lock();
                for k in self.1 {
                    live.promoting.remove(k);
                }
            }
        }
        {
            let mut live = self.replication.live.lock();
            if let Some(k) = keys.iter().find(|k| live.promoting.contains(*k)) {
                return Err(ApiError::busy(format!("'{k}' is being promoted already")));
            }
            live.promoting.extend(keys.iter().cloned());
        }
        let _promoting = Promoting(&self.replication, &keys);
        // An image being made of a working copy would read it put back under it: cut, as the
        // cycle is (a failover is not held off by an export).
        for k in &keys {
            if let Some(job) = self.jobs.running("export", k) {
                self.jobs.cancel_because(
                    job,
                    &format!("'{k}' is being promoted: its image would mix two instants"),
                );
            }
        }
        // A cycle under way is cut (its connections shut, every stream of it), as a network
        // failure would cut it: the replica goes back to its last consistent snapshot below
        // all the same, and a source, however slowly it sends, cannot hold off a failover.
        let deadline = std::time::Instant::now() + CUT_WAIT;
        let mut cut = Vec::new();
        let last = loop {
            // Under the live lock, so that no cycle can claim one between the check and the
            // removal; and the marks' lock, so that no mark is made after it.
            let marks = self.replication.marks.lock();
            let live = self.replication.live.lock();
            let busy: Vec<&String> = keys.iter().filter(|k| live.receiving.contains(*k)).collect();
            if busy.is_empty() {
                // The snapshot to go back to, now that no cycle can add one (a cut cycle may
                // have committed one before it ended).
                let last = self.promotion_point(&e, pool, vdisks)?;
                // Made before the records go: a promotion cut from here on (a failure, the
                // daemon's end) leaves the vdisks refusing cycles, and taken on again as
                // replicas by no gateway; it can be made again, by their marks (made here for
                // a replica from before there were marks, which has none yet).
                let vs = vdisks.iter().map(|v| e.vdisk(v)).collect::<Result<Vec<_>, _>>()?;
                let when = now().to_string();
                let mut unmarked = Vec::new();
                for (v, k) in vs.iter().zip(&keys) {
                    if e.lun_state(v, REPLICA_MARK)?.is_none() {
                        let source = self.replication.saved.lock().incoming.get(k).map(|i| i.source.clone());
                        unmarked.push((v, source.unwrap_or_default()));
                    }
                }
                let mut changes: Vec<_> = vs
                    .iter()
                    .map(|v| (&**v, REPLICA_PROMOTING, Some(when.as_bytes())))
                    .collect();
                changes.extend(
                    unmarked
                        .iter()
                        .map(|(v, src)| (&***v, REPLICA_MARK, Some(src.as_bytes()))),
                );
                e.set_lun_states(&changes)?;
                self.replication.change(|s| {
                    for k in &keys {
                        s.incoming.remove(k);
                    }
                    Ok(())
                })?;
                break last;
            }
            if std::time::Instant::now() > deadline {
                return Err(ApiError::busy(format!(
                    "a cycle from the source is writing {} and did not end within {} s of being cut; try again",
                    busy.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", "),
                    CUT_WAIT.as_secs()
                )));
            }
            for key in busy {
                for l in live.streams.get(key).into_iter().flatten() {
                    let _ = l.sock.shutdown(std::net::Shutdown::Both);
                }
                if !cut.contains(key) {
                    warn!(replica = %key, "promotion cuts the replication cycle under way");
                    cut.push(key.clone());
                }
            }
            drop(live);
            drop(marks);
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let mut out = Vec::new();
        for vdisk in vdisks {
            let key = format!("{pool}/{vdisk}");
            let v = e.vdisk(vdisk)?;
            let snap = e.vdisk(&format!("{vdisk}@{last}"))?;
            if v.size() > snap.size() {
                v.write_zeroes(snap.size(), v.size() - snap.size(), true, false)?;
            }
            e.clone_range(&snap, 0, &v, 0, snap.size())?;
            v.flush()?;
            if let Err(e) = tessera_replication::forget_cycle(&super::cycles_dir(&self.cfg.state_dir), pool, vdisk) {
                warn!(replica = %key, error = %e, "cannot remove the marker of the cycle cut short");
            }
            self.events.record(
                NewEvent::new(
                    Severity::Warning,
                    "replica.promoted",
                    format!(
                        "replica {key} promoted at {last}: writable, and no longer kept by its source{}",
                        if cut.contains(&key) {
                            " (the cycle it was receiving was cut)"
                        } else {
                            ""
                        }
                    ),
                )
                .pool(pool)
                .subject(&key),
            );
            out.push(PromotedView {
                pool: pool.to_string(),
                vdisk: vdisk.clone(),
                snapshot: last.clone(),
            });
        }
        // Once all are put back: every gateway of the pool knows they are no replicas now, all
        // in one commit. Until then (a failure above, or here) the marks stay, and the
        // promotion can be made again, of the same snapshot.
        let vs = vdisks.iter().map(|v| e.vdisk(v)).collect::<Result<Vec<_>, _>>()?;
        let when = now().to_string();
        let changes: Vec<_> = vs
            .iter()
            .flat_map(|v| {
                [
                    (&**v, REPLICA_MARK, None),
                    (&**v, REPLICA_KEY, None),
                    (&**v, REPLICA_PROMOTING, None),
                    (&**v, REPLICA_PROMOTED, Some(when.as_bytes())),
                    (&**v, REPLICA_CYCLE, None),
                ]
            })
            .collect();
        e.set_lun_states(&changes)?;
        // The LUNs and exports a gateway that took the pool over did not present while they
        // were replicas.
        let resolve = |vd: &str| self.resolve_lun(vd);
        self.targets.present_missing(&resolve);
        self.nbd.present_missing(&resolve, &|vd| self.may_export_writable(vd));
        Ok(out)
    }

    /// The newest snapshot every replica named holds (the last instant of the group that
    /// reached this site whole), once each is checked to be a replica held here.
    fn promotion_point(&self, e: &Engine, pool: &str, vdisks: &[String]) -> ApiResult<String> {
        let mut held: Option<Vec<String>> = None;
        for vdisk in vdisks {
            let key = format!("{pool}/{vdisk}");
            if !self.is_replica(pool, vdisk)? {
                return Err(ApiError::not_found(format!("'{key}' is not a replica held here")));
            }
            let snaps = replication_snapshots(e, vdisk);
            held = Some(match held {
                None => snaps,
                Some(h) => h.into_iter().filter(|s| snaps.contains(s)).collect(),
            });
        }
        held.and_then(|mut h| h.pop()).ok_or_else(|| {
            ApiError::invalid(format!(
                "{} hold no consistent snapshot in common: no cycle of {} ended here",
                vdisks.join(", "),
                if vdisks.len() > 1 { "them together" } else { "it" }
            ))
        })
    }

    /// Deletes a replica's consistent snapshots beyond the newest few, unless presented.
    fn prune_replica_snapshots(&self, pool: &str, vdisk: &str) {
        let Ok(e) = self.engine(pool) else { return };
        let snaps = replication_snapshots(&e, vdisk);
        let old = snaps.len().saturating_sub(KEEP_REPLICA_SNAPSHOTS);
        for s in &snaps[..old] {
            self.drop_replication_snapshot(pool, vdisk, s);
        }
    }

    /// Brings this daemon's records of the replicas of `pool` in line with the pool's
    /// metadata, as it opens the pool (at start, at `pool import`, when it takes a pool on
    /// RADOS over). A record made stale through another gateway of the pool (the replica
    /// promoted, or made again, there) is dropped. A replica the metadata marks and no record
    /// here holds (received through another gateway) is taken on: listed, kept by its
    /// source's cycles and promotable here as where it was made; it is recorded at the newest
    /// snapshot of its cycles (one is taken only once a cycle's data is all in), and its next
    /// cycle puts the working copy back there first, as no marker of a cycle under way is
    /// here. Never one a promotion is under way for, here or left cut (`REPLICA_PROMOTING`).
    /// Under the marks' lock, which a promotion holds while it drops records.
    pub(crate) fn settle_replicas(&self, pool: &str) {
        let Ok(e) = self.engine(pool) else { return };
        let _marks = self.replication.marks.lock();
        let record = |key: &str| self.replication.saved.lock().incoming.get(key).cloned();
        let report = |key: &str, r: ApiResult<NewEvent>| match r {
            Ok(event) => _ = self.events.record(event.pool(pool).subject(key)),
            Err(err) => {
                warn!(replica = %key, error = %err.message, "cannot settle the record of a replica with its pool")
            }
        };
        // Drops the record of `key` if `still()` holds and no cycle or promotion has it,
        // checked and dropped under the live lock, as a cycle records and claims under it.
        let forget = |key: &str, name: &str, why: &str, still: &dyn Fn() -> bool| {
            let dropped = {
                let live = self.replication.live.lock();
                if live.receiving.contains(key) || live.promoting.contains(key) || !still() {
                    return;
                }
                self.replication.change(|s| {
                    s.incoming.remove(key);
                    Ok(())
                })
            };
            self.forget_cycle_marker(pool, name);
            report(
                key,
                dropped.map(|()| {
                    NewEvent::new(
                        Severity::Warning,
                        "replica.forgotten",
                        format!("replica {key} is no longer kept here: {why}"),
                    )
                }),
            );
        };
        // Records of vdisks gone from the pool (deleted through another gateway); not one a
        // cycle is making the vdisk for.
        let held: Vec<String> = self.replication.saved.lock().incoming.keys().cloned().collect();
        for key in held {
            if let Some((_, name)) = key.split_once('/').filter(|(p, _)| *p == pool) {
                forget(
                    &key,
                    name,
                    "its vdisk was deleted through another gateway of its pool",
                    &|| e.vdisk(name).is_err(),
                );
            }
        }
        for v in e.vdisks().into_iter().filter(|v| !v.is_snapshot()) {
            let name = v.name();
            let key = format!("{pool}/{name}");
            {
                let live = self.replication.live.lock();
                if live.promoting.contains(&key) || live.receiving.contains(&key) {
                    continue;
                }
            }
            if let Some(rec) = record(&key) {
                match self.record_is_stale(pool, &name, &rec) {
                    Ok(true) => forget(
                        &key,
                        &name,
                        "it was promoted (or made again) through another gateway of its pool",
                        &|| true,
                    ),
                    Ok(false) => continue,
                    Err(err) => {
                        report(&key, Err(err));
                        continue;
                    }
                }
            }
            // No record (or a stale one, just dropped): taken on if the pool marks it a
            // replica that no promotion began with.
            let state = |kind| e.lun_state(&v, kind);
            let source = match (state(REPLICA_MARK), state(REPLICA_PROMOTED), state(REPLICA_PROMOTING)) {
                (Ok(Some(source)), Ok(None), Ok(None)) => String::from_utf8_lossy(&source).into_owned(),
                (Err(err), _, _) | (_, Err(err), _) | (_, _, Err(err)) => {
                    report(&key, Err(err.into()));
                    continue;
                }
                _ => continue,
            };
            let key_of_source = match state(REPLICA_KEY) {
                Ok(k) => k.map(|k| String::from_utf8_lossy(&k).into_owned()),
                Err(err) => {
                    report(&key, Err(err.into()));
                    continue;
                }
            };
            let last = replication_snapshots(&e, &name).pop();
            // A marker of a cycle cut here before is of no use to the source's next cycle,
            // which puts the working copy back to that snapshot.
            self.forget_cycle_marker(pool, &name);
            let adopted = self.replication.change(|s| {
                s.incoming.entry(key.clone()).or_insert_with(|| Incoming {
                    source: source.clone(),
                    created_at: now(),
                    last_snapshot: last.clone(),
                    last_snapshot_id: None,
                    last_cycle_at: None,
                    cycles: 0,
                    marked: true,
                    vdisk_id: Some(v.id()),
                    key: key_of_source.clone(),
                });
                Ok(())
            });
            report(
                &key,
                adopted.map(|()| {
                    NewEvent::new(
                        Severity::Info,
                        "replica.adopted",
                        format!(
                            "replica {key} of {source}, marked so in its pool, is kept here from now on (last snapshot: {})",
                            last.as_deref().unwrap_or("none")
                        ),
                    )
                }),
            );
        }
    }

    /// Removes the marker of a cycle cut short into `pool/vdisk`, if any: its record is gone
    /// or made anew, and the working copy is put back to its base by the next cycle.
    fn forget_cycle_marker(&self, pool: &str, vdisk: &str) {
        if let Err(e) = tessera_replication::forget_cycle(&super::cycles_dir(&self.cfg.state_dir), pool, vdisk) {
            warn!(replica = %format!("{pool}/{vdisk}"), error = %e, "cannot remove the marker of a cycle cut short");
        }
    }

    /// Whether the pool's metadata marks `pool/vdisk` a replica: a gateway that opens the
    /// pool after the one that received it (a pool on RADOS taken over) knows it by the mark.
    pub(crate) fn replica_marked(&self, pool: &str, vdisk: &str) -> ApiResult<bool> {
        let Ok(e) = self.engine(pool) else { return Ok(false) };
        let Ok(v) = e.vdisk(vdisk) else { return Ok(false) };
        Ok(e.lun_state(&v, REPLICA_MARK)?.is_some())
    }

    /// The identity of the key the pool's metadata binds the replica `pool/vdisk` to, if any.
    pub(crate) fn replica_key(&self, pool: &str, vdisk: &str) -> ApiResult<Option<String>> {
        let Ok(e) = self.engine(pool) else { return Ok(None) };
        let Ok(v) = e.vdisk(vdisk) else { return Ok(None) };
        Ok(e.lun_state(&v, REPLICA_KEY)?
            .map(|k| String::from_utf8_lossy(&k).into_owned()))
    }

    /// Marks `pool/vdisk` a replica of `source`, written with the replication key `key`
    /// (its identity), in the pool's metadata. Refused where a promotion left its record,
    /// unless `demoting` (a demotion makes a promoted vdisk a replica again, bound to the key
    /// of its next cycle, and removes that record in the same commit).
    pub(crate) fn mark_replica(
        &self,
        pool: &str,
        vdisk: &str,
        source: &str,
        key: Option<&str>,
        demoting: bool,
    ) -> ApiResult<()> {
        let e = self.engine(pool)?;
        let v = e.vdisk(vdisk)?;
        if demoting {
            return Ok(e.set_lun_states(&[
                (&v, REPLICA_MARK, Some(source.as_bytes())),
                (&v, REPLICA_KEY, None),
                (&v, REPLICA_PROMOTING, None),
                (&v, REPLICA_PROMOTED, None),
            ])?);
        }
        if e.lun_state(&v, REPLICA_PROMOTED)?.is_some() {
            return Err(ApiError::invalid(format!(
                "'{pool}/{vdisk}' is no longer a replica: it was promoted through another gateway of its pool"
            )));
        }
        if e.lun_state(&v, REPLICA_PROMOTING)?.is_some() {
            return Err(ApiError::invalid(format!(
                "'{pool}/{vdisk}' is being promoted: a peer never writes it again"
            )));
        }
        let key = key.map(str::as_bytes);
        if e.lun_state(&v, REPLICA_MARK)?.is_some() {
            match (e.lun_state(&v, REPLICA_KEY)?, key) {
                // Bound to another source's key (through another gateway of the pool).
                (Some(was), Some(k)) if was != k => {
                    return Err(ApiError::invalid(format!(
                        "'{pool}/{vdisk}' is the replica of a source with another replication key: a peer writes only the replicas made with its own"
                    )))
                }
                // Marked before keys were kept: the key is added.
                (None, Some(_)) => e.set_lun_state(&v, REPLICA_KEY, key)?,
                _ => {}
            }
            return Ok(());
        }
        Ok(e.set_lun_states(&[(&v, REPLICA_MARK, Some(source.as_bytes())), (&v, REPLICA_KEY, key)])?)
    }

    /// Whether this daemon's record `rec` of the replica `pool/vdisk` is stale: the pool's
    /// metadata holds a promotion's record, or the vdisk of that name is another one (made
    /// again since), or (for a promotion made before those records were kept) the mark this
    /// daemon made is gone.
    fn record_is_stale(&self, pool: &str, vdisk: &str, rec: &Incoming) -> ApiResult<bool> {
        let Ok(e) = self.engine(pool) else { return Ok(false) };
        let Ok(v) = e.vdisk(vdisk) else { return Ok(false) };
        Ok(e.lun_state(&v, REPLICA_PROMOTED)?.is_some()
            || rec.vdisk_id.is_some_and(|id| id != v.id())
            || (rec.marked && e.lun_state(&v, REPLICA_MARK)?.is_none()))
    }

    /// Whether the pool records a cycle that changed the working copy `pool/vdisk` and did
    /// not commit (`REPLICA_CYCLE`), through whichever gateway of the pool received it.
    fn cycle_recorded(&self, pool: &str, vdisk: &str) -> ApiResult<bool> {
        let Ok(e) = self.engine(pool) else { return Ok(false) };
        let Ok(v) = e.vdisk(vdisk) else { return Ok(false) };
        Ok(e.lun_state(&v, REPLICA_CYCLE)?.is_some())
    }

    /// Whether a promotion of `pool/vdisk` began and has not ended (`REPLICA_PROMOTING`).
    fn promoting(&self, pool: &str, vdisk: &str) -> ApiResult<bool> {
        let Ok(e) = self.engine(pool) else { return Ok(false) };
        let Ok(v) = e.vdisk(vdisk) else { return Ok(false) };
        Ok(e.lun_state(&v, REPLICA_PROMOTING)?.is_some())
    }

    /// Whether `pool/vdisk` is a replica held for a peer: recorded so here (unless the record
    /// is stale: the vdisk was promoted through another gateway of the pool since), or marked
    /// so in its pool's metadata.
    pub(crate) fn is_replica(&self, pool: &str, vdisk: &str) -> ApiResult<bool> {
        let record = self
            .replication
            .saved
            .lock()
            .incoming
            .get(&format!("{pool}/{vdisk}"))
            .cloned();
        Ok(match record {
            Some(rec) => !self.record_is_stale(pool, vdisk, &rec)?,
            None => self.replica_marked(pool, vdisk)?,
        })
    }

    /// The vdisk a configured LUN presents, unless it is a replica's working copy (which
    /// another gateway of the pool may have marked so since the LUN was set up).
    pub(crate) fn resolve_lun(&self, vd: &str) -> Option<(Arc<Engine>, Arc<tessera_volume::Vdisk>)> {
        let (p, v) = vd.split_once('/')?;
        if let Err(e) = self.refuse_if_replica(p, v, "presented as a LUN") {
            warn!(vdisk = %vd, error = %e.message, "LUN not presented");
            return None;
        }
        self.vdisk(p, v).ok()
    }

    /// Whether `pool/vdisk` may be offered writable over NBD: not a replica's working copy.
    pub(crate) fn may_export_writable(&self, vd: &str) -> Result<(), String> {
        let Some((p, n)) = vd.split_once('/') else {
            return Ok(());
        };
        self.refuse_if_replica(p, n, "exported writable (export it read-only)")
            .map_err(|e| e.message)
    }

    /// Runs `f` with no cycle writing replica `pool/vdisk` nor starting meanwhile (under the
    /// live lock: a cycle also waits for an export job of it, `Site::writing`);
    /// refused while a cycle is under way, or was cut short and left part of two cycles in the
    /// working copy. Anything but a replica runs `f` as it is.
    pub(crate) fn with_replica_at_rest<T>(
        &self,
        pool: &str,
        vdisk: &str,
        what: &str,
        f: impl FnOnce() -> ApiResult<T>,
    ) -> ApiResult<T> {
        if !self.is_replica(pool, vdisk)? {
            return f();
        }
        let key = format!("{pool}/{vdisk}");
        // Read before the lock (a metadata read may go to the cluster). A cycle that begins
        // after it is seen by the lock below (`receiving`).
        let cut_anywhere = self.cycle_recorded(pool, vdisk)?;
        let mut live = self.replication.live.lock();
        if live.receiving.contains(&key)
            || live.promoting.contains(&key)
            || live.copying.contains(&key)
            || cut_anywhere
            || tessera_replication::cycle_cut(&super::cycles_dir(&self.cfg.state_dir), pool, vdisk)
        {
            return Err(ApiError::busy(format!(
                "'{key}' is a replica, and a cycle is writing it (or was cut short, leaving part of two cycles in \
                 it until the next one): it cannot be {what} now; its snapshots are the consistent points"
            )));
        }
        // Claimed, and the lock let go: a clone takes as long as the vdisk has grains, and
        // every other replica's cycles take the lock meanwhile.
        live.copying.insert(key.clone());
        drop(live);
        let r = f();
        self.replication.live.lock().copying.remove(&key);
        r
    }

    /// Refuses what would change a replica held for a peer: only its peer's cycles write it.
    pub(crate) fn refuse_if_replica(&self, pool: &str, vdisk: &str, what: &str) -> ApiResult<()> {
        if self.is_replica(pool, vdisk)? {
            return Err(ApiError::invalid(format!(
                "'{pool}/{vdisk}' is a replica kept by its source's cycles: it cannot be {what}; \
                 present or clone one of its snapshots, or promote it ('tessera replica promote {pool}/{vdisk}')"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64_and_an_ipv4_one_by_its_address() {
        let h = Handshakes::default();
        // Eight handshakes from eight addresses of one /64 take its share...
        for i in 1..=MAX_HANDSHAKES_PER_SOURCE {
            assert!(h.begin(ip(&format!("2001:db8:1:2::{i:x}"))));
        }
        assert!(
            !h.begin(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")),
            "a ninth address of the /64"
        );
        // ...and no other /64's, nor an IPv4 host's.
        assert!(h.begin(ip("2001:db8:1:3::1")));
        for _ in 0..MAX_HANDSHAKES_PER_SOURCE {
            assert!(h.begin(ip("192.0.2.7")));
        }
        assert!(!h.begin(ip("192.0.2.7")));
        // The same IPv4 host seen through a dual-stack socket is the same source.
        assert!(!h.begin(ip("::ffff:192.0.2.7")));
        assert!(h.begin(ip("192.0.2.8")));
        // A handshake over, from any address of the /64, gives a place back.
        h.end(ip("2001:db8:1:2::3"));
        assert!(h.begin(ip("2001:db8:1:2::abcd")));
        assert!(!h.begin(ip("2001:db8:1:2::abce")));
        h.end(ip("::ffff:192.0.2.7"));
        assert!(h.begin(ip("192.0.2.7")));
    }

    /// A cycle of key `key` on its own connection to `listener`, as `take_cycle` makes one.
    fn site(d: &Arc<Daemon>, listener: &TcpListener, key: &str, id: u64) -> Site {
        Site {
            d: d.clone(),
            peer: "127.0.0.1".into(),
            key: key.into(),
            claimed: parking_lot::Mutex::new(None),
            admitted: parking_lot::Mutex::new(None),
            sock: TcpStream::connect(listener.local_addr().unwrap()).unwrap(),
            id,
            registered: parking_lot::Mutex::new(None),
            place: parking_lot::Mutex::new(None),
            opening_counted: std::sync::atomic::AtomicBool::new(false),
            streams_counted: AtomicUsize::new(0),
        }
    }

    fn daemon(dir: &std::path::Path, config: &str) -> Arc<Daemon> {
        let o = crate::config::Overrides {
            state_dir: Some(dir.to_path_buf()),
            ..Default::default()
        };
        let file = crate::config::parse_file(config).unwrap();
        Arc::new(Daemon::start(crate::config::ServerConfig::resolve(file, o).unwrap()).unwrap())
    }

    /// The cycles of one key hold half of the listener's places at most, counted by the
    /// streams each says it opens, whatever other keys' cycles hold; a cycle's streams count
    /// no more once its connection is over.
    #[test]
    fn the_cycles_of_a_key_hold_at_most_half_of_the_listener_places() {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon(dir.path(), "");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (a1, a2, a3, other) = (
            site(&d, &listener, "a", 1),
            site(&d, &listener, "a", 2),
            site(&d, &listener, "a", 3),
            site(&d, &listener, "c", 4),
        );
        a1.streams(16).unwrap();
        a2.streams(15).unwrap();
        let e = a3.streams(2).unwrap_err();
        assert!(e.contains("key 'a'") && e.contains("32 of this site's 64"), "{e}");
        a3.streams(1).unwrap();
        other.streams(16).unwrap();
        drop(a1);
        let again = site(&d, &listener, "a", 5);
        again.streams(16).unwrap();
        drop((a2, a3, again, other));
        assert!(
            d.replication.key_places.streams.held.lock().is_empty(),
            "nothing left counted"
        );
    }

    /// Two cycles of one key that both passed the quota as they began (neither replica made
    /// yet): the first to claim its replica counts at the size it may make it, and the second
    /// is refused at its claim. Another key's cycle is not held to this key's quota, and
    /// once the first cycle ends having made nothing, the second may claim.
    #[test]
    fn of_two_cycles_that_both_began_within_the_quota_only_the_first_claims() {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon(dir.path(), "replication_quota = \"24M\"\n");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (a, b, other) = (
            site(&d, &listener, "k", 1),
            site(&d, &listener, "k", 2),
            site(&d, &listener, "j", 3),
        );
        for (s, v) in [(&a, "one"), (&b, "two"), (&other, "three")] {
            s.may_hold("q", v, 16 << 20).unwrap();
        }
        a.writing("q", "one", false).unwrap();
        let e = b.writing("q", "two", false).unwrap_err();
        assert!(e.contains("replication_quota"), "{e}");
        other.writing("q", "three", false).unwrap();
        // The first cycle ends without its replica made (no vdisk: it holds nothing).
        unlist(&d, &a, a.claimed.lock().take().as_deref(), false);
        b.writing("q", "two", false).unwrap();
    }
}
