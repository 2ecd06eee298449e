//! Replication as the daemon runs it. A site replicates local vdisks to peers ("outgoing":
//! a cycle per interval, each a snapshot sent as what changed since the last snapshot both
//! hold) and holds replicas for peers ("incoming": written only by the peer's cycles,
//! read-only to everyone else until promoted).
//!
//! - `outgoing.rs`: replicas of local vdisks made, changed, deleted, demoted;
//! - `cycle.rs`: their cycles, as jobs; `schedule.rs`: when they are due, and the RPO watch;
//! - `incoming.rs`: the listener, what a peer may write, promotion.
//!
//! State: `replication.json` in the state directory (the replicas, their last common
//! snapshots and totals); `replication-cycles/` (the markers of cycles under way, kept by the
//! receiving side, tessera_replication::receive); the key file shared with the peers
//! (`replication_psk_file`).
//!
//! Snapshots that cycles take are named `repl-<replica>-<n>`, on both sites. The source keeps
//! the last one both sites hold (the next cycle's base) and the one of a cycle under way; the
//! replica keeps its newest [`KEEP_REPLICA_SNAPSHOTS`]. Older ones are deleted once nothing
//! presents them.

mod cycle;
mod incoming;
mod listener_keys;
mod outgoing;
mod schedule;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};
use crate::model::ReplicaCycleView;
use crate::statefile;

pub use incoming::start_listener;

/// Prefix of the snapshots cycles take.
pub const SNAPSHOT_PREFIX: &str = "repl-";
/// Consistent snapshots a replica keeps: the newest is the next cycle's base.
pub const KEEP_REPLICA_SNAPSHOTS: usize = 2;
/// Default seconds between cycles.
pub const DEFAULT_INTERVAL_SECS: u64 = 300;
/// A cycle that failed is tried again this soon (or at its interval, if sooner).
pub const RETRY_SECS: u64 = 10;
/// Longest replica name: its snapshots' names must fit in 64 characters.
const MAX_NAME: usize = 40;

/// The longest interval between cycles and recovery point objective a replica takes: a year.
pub(crate) const MAX_SCHEDULE_SECS: u64 = 366 * 24 * 3600;

/// A local vdisk replicated to a peer, as saved.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Outgoing {
    pub pool: String,
    pub vdisk: String,
    pub to: String,
    pub target_pool: String,
    pub target_vdisk: String,
    pub interval_secs: u64,
    pub bandwidth: Option<u64>,
    /// Connections a cycle's data goes over.
    #[serde(default = "one")]
    pub streams: u32,
    /// None: three intervals. Some(0): no objective.
    pub rpo_secs: Option<u64>,
    /// A consistency group: its replicas' snapshots are taken at one instant.
    #[serde(default)]
    pub group: Option<String>,
    pub paused: bool,
    pub created_at: u64,
    /// The number of the last snapshot taken.
    pub seq: u64,
    /// The last snapshot both sites hold, and when the source took it.
    pub base: Option<String>,
    pub base_at: Option<u64>,
    /// The snapshot of a cycle not finished, and when it was taken.
    pub pending: Option<String>,
    pub pending_at: Option<u64>,
    pub cycles: u64,
    pub failures: u64,
    pub changed_bytes: u64,
    pub sent_bytes: u64,
    pub wire_bytes: u64,
    pub last_cycle: Option<ReplicaCycleView>,
    pub last_attempt_at: Option<u64>,
    pub last_error: Option<String>,
    pub last_error_at: Option<u64>,
}

fn one() -> u32 {
    1
}

impl Outgoing {
    pub fn rpo(&self) -> u64 {
        // Saturating: a saved state edited by hand may hold any number.
        self.rpo_secs.unwrap_or(self.interval_secs.saturating_mul(3))
    }

    /// Whether the last cycle tried ended in failure (a pause or a stop is no failure).
    pub fn last_attempt_failed(&self) -> bool {
        self.last_error_at.is_some() && self.last_error_at == self.last_attempt_at
    }

    /// Seconds since the replica's last consistent point (since creation, before the first).
    pub fn lag(&self, now: u64) -> u64 {
        now.saturating_sub(self.base_at.unwrap_or(self.created_at))
    }
}

/// A replica held here for a peer, as saved; keyed by `pool/vdisk`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Incoming {
    pub source: String,
    pub created_at: u64,
    pub last_snapshot: Option<String>,
    /// The source's id of its snapshot that `last_snapshot` was made from: a cycle asked for
    /// again is done only if it is of the very same (None in records saved before these
    /// were kept, and in those a gateway took on from its pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot_id: Option<u64>,
    pub last_cycle_at: Option<u64>,
    pub cycles: u64,
    /// The pool's metadata marks the vdisk a replica (`incoming.rs`): a mark gone since was
    /// cleared by a promotion at another gateway of the pool. (Records saved before there
    /// were marks have none yet; their next cycle makes it.)
    #[serde(default)]
    pub marked: bool,
    /// The id of the vdisk the cycles wrote: a vdisk of the name with another id (the
    /// replica promoted, deleted and made again through another gateway) is not this one.
    /// (None in records saved before ids were kept, and before the first cycle made it.)
    #[serde(default)]
    pub vdisk_id: Option<u64>,
    /// The identity of the replication key the source proved when it made the replica: a
    /// peer holding another key of the file never writes it. (None in records saved before
    /// keys were kept, and in those a gateway took on from its pool's marks: the next cycle's
    /// key is kept.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Saved {
    pub outgoing: BTreeMap<String, Outgoing>,
    pub incoming: BTreeMap<String, Incoming>,
}

/// What is not saved: cycles under way, and which replicas have been told about.
#[derive(Default)]
pub(crate) struct Live {
    /// Replica name -> the job of its cycle.
    pub running: BTreeMap<String, u64>,
    /// Incoming replicas (`pool/vdisk`) a cycle is writing.
    pub receiving: BTreeSet<String>,
    /// The connections of those cycles (the first and those that joined it): a promotion
    /// cuts them.
    pub streams: BTreeMap<String, Vec<incoming::Listed>>,
    /// Incoming replicas a promotion is taking over: no cycle may claim them meanwhile.
    pub promoting: BTreeSet<String>,
    /// Incoming replicas whose working copy is being cloned here (at rest): no cycle may
    /// claim them meanwhile (`Daemon::with_replica_at_rest`).
    pub copying: BTreeSet<String>,
    /// Outgoing replicas past their RPO, and those whose last cycle failed (told once each).
    pub rpo_exceeded: BTreeSet<String>,
    pub failing: BTreeSet<String>,
}

pub struct Replication {
    path: PathBuf,
    pub(crate) saved: Mutex<Saved>,
    pub(crate) live: Mutex<Live>,
    /// Held while a replica's mark in its pool's metadata is made (incoming.rs), and by a
    /// promotion while it drops the replicas' records: a mark is made only while its record
    /// exists, and a promotion's clearing of it comes after. Apart from `live`, so that a
    /// slow metadata write holds up no cycle, listing or promotion of another replica.
    pub(crate) marks: Mutex<()>,
    /// Incoming replicas (`pool/vdisk`) a cycle is writing under a replication quota, with
    /// the size the cycle may make them: counted against their key's quota at that size until
    /// the cycle ends, as their vdisks may not exist yet, or be smaller.
    /// Held while a cycle's claim is checked against the quota and made, and while a cycle's
    /// end takes its replica off the lists, so that two cycles cannot both pass it; taken
    /// only with a quota set, before `live`, never under it.
    pub(crate) growing: Mutex<BTreeMap<String, u64>>,
    /// Where the listener took its address (port 0 resolved).
    pub(crate) listening: Mutex<Option<std::net::SocketAddr>>,
    /// Cycles of several streams waiting for their extra streams.
    pub(crate) joins: std::sync::Arc<tessera_replication::Joins>,
    /// Connections from peers held now, every stream of every cycle (`MAX_STREAMS` at most).
    pub(crate) connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Of those, what each key's connections hold.
    pub(crate) key_places: incoming::KeyPlaces,
    /// The listener's keys, once it listens.
    pub(crate) keys: Mutex<Option<std::sync::Arc<listener_keys::ListenerKeys>>>,
}

impl Replication {
    pub fn load(path: PathBuf) -> Result<Replication, String> {
        let saved: Saved = statefile::read_json(&path, "fix or remove it; the replicas it names then start anew")?;
        Ok(Replication {
            path,
            saved: Mutex::new(saved),
            live: Default::default(),
            marks: Mutex::new(()),
            growing: Mutex::new(BTreeMap::new()),
            listening: Mutex::new(None),
            joins: Default::default(),
            connections: Default::default(),
            key_places: Default::default(),
            keys: Mutex::new(None),
        })
    }

    /// Changes the saved state and writes it; if the write fails nothing changes.
    pub(crate) fn change<R>(&self, f: impl FnOnce(&mut Saved) -> ApiResult<R>) -> ApiResult<R> {
        let mut s = self.saved.lock();
        statefile::change_saved(&mut *s, f, |s| {
            statefile::write_json(&self.path, s)
                .map_err(|e| ApiError::io(format!("cannot record the replicas in {}: {e}", self.path.display())))
        })
    }

    pub(crate) fn outgoing(&self, name: &str) -> ApiResult<Outgoing> {
        self.saved
            .lock()
            .outgoing
            .get(name)
            .cloned()
            .ok_or_else(|| no_replica(name))
    }
}

/// The names of a vdisk's replication snapshots, oldest first: of the vdisk of that name now,
/// not of one deleted before it was made (another source's replica, maybe), whose snapshots
/// outlive it: a pool hands vdisk ids out in increasing order, so the vdisk's own are those
/// of higher id than it. Pruning, promotion and reversal go by these alone.
pub(crate) fn replication_snapshots(e: &tessera_volume::Engine, vdisk: &str) -> Vec<String> {
    let since = e.vdisk(vdisk).map(|v| v.id()).unwrap_or(0);
    e.snapshots_of(vdisk)
        .into_iter()
        .filter(|s| s.id() > since)
        .filter_map(|s| s.name().split_once('@').map(|(_, n)| n.to_string()))
        .filter(|n| n.starts_with(SNAPSHOT_PREFIX))
        .collect()
}

/// Where the markers of cycles being received are kept.
pub(crate) fn cycles_dir(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("replication-cycles")
}

pub(crate) fn no_replica(name: &str) -> ApiError {
    ApiError::not_found(format!("no replica '{name}'; 'tessera replica list' shows them"))
}

pub(crate) fn check_name(name: &str) -> ApiResult<()> {
    tessera_pool::validate_name("replica", name).map_err(ApiError::invalid)?;
    if name.len() > MAX_NAME {
        return Err(ApiError::invalid(format!(
            "replica name '{name}' is longer than {MAX_NAME} characters"
        )));
    }
    Ok(())
}

/// Seconds since the Unix epoch.
pub(crate) fn now() -> u64 {
    crate::jobs::unix_now()
}
