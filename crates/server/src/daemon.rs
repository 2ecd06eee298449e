//! The daemon's state: the pools it has imported (one engine each), the pools it knows but has
//! not imported, and the jobs. Every method here may block on disk I/O; the API calls them from
//! blocking tasks.
//!
//! State directory:
//! - `pools/<name>/`: a pool's metadata store and stripe journal;
//! - `imported.json`: the pools imported when the daemon last ran, imported again at start;
//! - `targets.json`, `nbd.json`, `portals.json`: iSCSI targets, NBD exports, added portals;
//! - `auto-repair.json`: pools whose repairs wait for the administrator;
//! - `replication.json`, `replication-cycles/`, `replication-psk`: replicas (crate::replication);
//! - `events.jsonl`: the event log;
//! - `tessera.lock`, `api.sock`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tessera_disk::{DiskRef, FileDisk};
use tessera_pool::{validate_name, DiskState, DiskUsage, DEFAULT_SLAB_SIZE};
use tessera_volume::{Engine, LayoutKind, Provisioning, RebuildOptions, Vdisk, VdiskSpec};
use tracing::{error, info, warn};

use crate::auto_repair::AutoRepair;
use crate::config::ServerConfig;
use crate::data_paths::{DataPaths, DataUse};
use crate::error::{ApiError, ApiResult};
use crate::events::{EventLog, NewEvent, Severity};
use crate::image;
use crate::jobs::{JobView, Jobs};
use crate::model::*;
use crate::nbd_exports::{NbdExportConfig, NbdExports};
use crate::portals::Portals;
use crate::statefile;
use crate::targets::Targets;

mod destroys;
mod exports;
mod pools;
mod rados;
mod vdisks;

pub(crate) use pools::pool_health;
pub use vdisks::{snapshot_view, vdisk_view};

pub struct Daemon {
    pub cfg: ServerConfig,
    pools: RwLock<BTreeMap<String, Arc<Engine>>>,
    /// Pools that should be imported but could not be, and why.
    unavailable: RwLock<BTreeMap<String, String>>,
    pub jobs: Jobs,
    pub targets: Targets,
    pub nbd: NbdExports,
    pub portals: Portals,
    /// Serializes changes to the set of pools.
    admin: Mutex<()>,
    /// Serializes the taking of pools on RADOS (the tick's and an API call's), which holds
    /// `admin` only to apply what it found; taken before `admin`, never after.
    bringing: Mutex<()>,
    /// Serializes what gives a vdisk a user (a LUN, an NBD export, an image import or export)
    /// with what takes vdisks away (a vdisk's delete, a pool's export or destroy): each asks
    /// whether it may and acts under it, so that neither acts on what the other has just
    /// found. Taken after `admin`, never before it.
    pub(crate) users: Mutex<()>,
    started: Instant,
    /// Pools past their thin provisioning threshold, whose LUNs have been told.
    thin_warned: Mutex<BTreeSet<String>>,
    pub auto_repair: AutoRepair,
    pub scrub_watch: crate::scrubs::ScrubWatch,
    pub scan_watch: crate::scans::ScanWatch,
    pub dedup_schedule: crate::dedup::DedupSchedule,
    /// Set when the daemon begins to stop: jobs cancelled from then on were not cancelled by
    /// the administrator (a scrub stopped so goes on after the restart).
    pub stopping: Arc<std::sync::atomic::AtomicBool>,
    /// I/O counters and latency histograms of the protocol front ends, for `/metrics`.
    pub io_metrics: Arc<crate::metrics::IoMetrics>,
    /// The last hour of I/O per vdisk, for the dashboard.
    pub io_history: crate::io_history::IoHistory,
    /// When the daemon started, in seconds since the Unix epoch.
    pub started_unix: u64,
    /// What happened, for `tessera events`, the journal and the hook.
    pub events: Arc<EventLog>,
    pub(crate) health_watch: crate::health_events::HealthWatch,
    /// Replicas of local vdisks at peers, and replicas held here for peers.
    pub replication: crate::replication::Replication,
    /// This daemon as a gateway of pools on Ceph RADOS (`[gateway]`), if it is one.
    gateway: Option<Arc<crate::rados_pools::Membership>>,
    /// The pools on RADOS this daemon knows, owned here or waiting for their owner to go.
    rados: Mutex<BTreeMap<String, rados::RadosPool>>,
    /// Pools on RADOS given up here (exported, destroyed, not made) whose ownership in etcd
    /// could not be given up then (name, epoch): given up at a later tick.
    unreleased: Mutex<Vec<(String, i64, Option<String>)>>,
    /// What this gateway said in etcd of pools on RADOS it has since left (that it asks for
    /// one, that it serves one's hosts) and could not take back then: taken back at a later
    /// tick.
    marks_left: Mutex<Vec<(String, rados::Mark)>>,
    /// Pools on RADOS being destroyed here, their objects removed from the cluster without
    /// the admin lock (minutes for a large pool): their names are refused to a create or an
    /// import until that ends.
    destroying: Mutex<BTreeSet<String>>,
    /// Pools on RADOS whose destruction did not finish (the daemon stopped during it, or
    /// the cluster did not let it end): finished in the background, their names refused
    /// meanwhile as above.
    unfinished_destroys: Mutex<BTreeMap<String, destroys::UnfinishedDestroy>>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct ImportedList {
    pools: BTreeSet<String>,
}

/// Opens a member disk by the path recorded in its pool.
pub fn open_disk(path: &str) -> Result<DiskRef, tessera_disk::DiskError> {
    Ok(Arc::new(FileDisk::open(path)?))
}

impl Daemon {
    /// Where a request may point the daemon at data (`data_paths.rs`).
    pub(crate) fn data_paths(&self) -> DataPaths {
        DataPaths::new(&self.cfg.state_dir, &self.cfg.data_paths)
    }

    /// Refuses where a request would put or find a pool on RADOS if the configuration does
    /// not let the API reach it: a RADOS pool not in `rados_pools`, a Ceph client not in
    /// `rados_clients` (where they are set: a token confined by `data_paths` is not to
    /// reach every pool `client.admin` can); and the Ceph configuration file outside
    /// `data_paths`, where they are configured (the default, /etc/ceph/ceph.conf, always may
    /// be): librados reads it, and its errors would tell what it holds.
    pub(crate) fn check_rados_reach(&self, rados: &crate::model::RadosPlacement) -> ApiResult<()> {
        let allowed = |list: &[String], name: &str| list.is_empty() || list.iter().any(|n| n == name);
        if !allowed(&self.cfg.rados_pools, &rados.pool) {
            return Err(ApiError::invalid(format!(
                "RADOS pool '{}' is not one the configuration lets the API use (rados_pools: {})",
                rados.pool,
                self.cfg.rados_pools.join(", ")
            )));
        }
        let client = rados
            .client_name
            .as_deref()
            .unwrap_or(crate::rados_pools::DEFAULT_CLIENT);
        if !allowed(&self.cfg.rados_clients, client) {
            return Err(ApiError::invalid(format!(
                "Ceph client '{client}' is not one the configuration lets the API connect as \
                 (rados_clients: {}); give one of them with --client-name",
                self.cfg.rados_clients.join(", ")
            )));
        }
        let paths = self.data_paths();
        let Some(conf) = rados.ceph_conf.as_deref() else {
            return Ok(());
        };
        if !paths.confined() || conf == crate::rados_pools::DEFAULT_CEPH_CONF {
            return Ok(());
        }
        paths
            .locate(Path::new(conf), DataUse::CephConf)
            .map(drop)
            .map_err(ApiError::invalid)
    }

    /// Opens a disk a request names for a pool (a new member, data or cache), refused where
    /// the request may not point the daemon (checked on the file opened).
    pub(crate) fn open_new_disk(&self, path: &str) -> ApiResult<DiskRef> {
        let paths = self.data_paths();
        // Found and checked before it is opened for I/O, and opened through what was found:
        // it keeps the name given, which the pool records.
        let found = paths
            .locate(Path::new(path), DataUse::Disk)
            .map_err(ApiError::invalid)?;
        let disk = FileDisk::open_as(&crate::data_paths::through(&found), path)?;
        paths
            .check(&disk, Path::new(path), DataUse::Disk)
            .map_err(ApiError::invalid)?;
        Ok(Arc::new(disk))
    }
}

impl Daemon {
    /// Prepares the state directory and imports every pool that was imported when the daemon
    /// last stopped, and those the configuration names. A pool that cannot be imported is
    /// reported, not fatal: the others are served.
    pub fn start(cfg: ServerConfig) -> Result<Daemon, String> {
        std::fs::create_dir_all(cfg.pools_dir())
            .map_err(|e| format!("cannot create the state directory {}: {e}", cfg.state_dir.display()))?;
        let io_metrics: Arc<crate::metrics::IoMetrics> = Default::default();
        let targets = Targets::load(cfg.state_dir.join("targets.json"), io_metrics.clone())?;
        targets.registry.set_limits(cfg.iscsi_limits);
        let nbd = NbdExports::load(cfg.state_dir.join("nbd.json"), io_metrics.clone())?;
        nbd.registry.held().set_limit(cfg.nbd_buffer_total);
        let portals = Portals::load(
            cfg.state_dir.join("portals.json"),
            cfg.iscsi_listen,
            cfg.iscsi_buffers,
            targets.registry.clone(),
        )?;
        let auto_repair = AutoRepair::load(cfg.state_dir.join("auto-repair.json"))?;
        let replication = crate::replication::Replication::load(cfg.state_dir.join("replication.json"))?;
        let events = Arc::new(EventLog::open(&cfg.state_dir.join("events.jsonl"), &cfg.event_hook)?);
        let told = events.clone();
        targets
            .registry
            .on_refusal(Arc::new(move |r: &tessera_iscsi::LoginRefusal| {
                let who = r.initiator.as_deref().unwrap_or("an unnamed initiator");
                let to = r.target.as_deref().unwrap_or("the target");
                // The address without the port: retries from one host fold into one event, and
                // a flood of new names is held to the budget of refusals.
                told.record_refusal(
                    NewEvent::new(
                        Severity::Warning,
                        "iscsi.login_refused",
                        format!("login of {who} from {} to {to} refused: {}", r.peer.ip(), r.reason),
                    )
                    .subject(who),
                    r.peer.ip(),
                );
            }));
        let gateway = match &cfg.gateway {
            None => None,
            Some(g) => {
                let rt = tokio::runtime::Handle::try_current()
                    .map_err(|_| "a gateway joins etcd from the daemon's runtime".to_string())?;
                Some(Arc::new(crate::rados_pools::Membership::join(
                    g,
                    DataPaths::new(&cfg.state_dir, &cfg.data_paths),
                    rt,
                )?))
            }
        };
        let d = Daemon {
            gateway,
            rados: Mutex::new(BTreeMap::new()),
            unreleased: Mutex::new(Vec::new()),
            marks_left: Mutex::new(Vec::new()),
            destroying: Mutex::new(BTreeSet::new()),
            unfinished_destroys: Mutex::new(BTreeMap::new()),
            cfg,
            pools: RwLock::new(BTreeMap::new()),
            unavailable: RwLock::new(BTreeMap::new()),
            jobs: Jobs::new(events.clone()),
            targets,
            nbd,
            portals,
            admin: Mutex::new(()),
            bringing: Mutex::new(()),
            users: Mutex::new(()),
            started: Instant::now(),
            thin_warned: Mutex::new(BTreeSet::new()),
            auto_repair,
            scrub_watch: Default::default(),
            scan_watch: Default::default(),
            dedup_schedule: Default::default(),
            stopping: Default::default(),
            io_metrics,
            io_history: Default::default(),
            started_unix: crate::jobs::unix_now(),
            events,
            health_watch: Default::default(),
            replication,
        };
        let recorded = d.read_imported()?.pools;
        let mut wanted = recorded.clone();
        wanted.extend(d.cfg.pools.iter().cloned());
        // A pool whose destruction was marked is destroyed, even if the stop came before it
        // was recorded as no longer imported.
        d.load_unfinished_destroys();
        let mut leave_to_tick = false;
        for name in wanted {
            if d.destroy_unfinished(&name) {
                continue;
            }
            let dir = d.pool_dir(&name);
            if d.is_rados_pool(&name) {
                leave_to_tick = d.load_rados_pool(&name, leave_to_tick);
                continue;
            }
            if !dir.join("meta").exists() {
                d.events.record(
                    NewEvent::new(
                        Severity::Critical,
                        "pool.unavailable",
                        format!(
                            "pool {name} could not be imported: no pool metadata in {}",
                            dir.display()
                        ),
                    )
                    .pool(&name),
                );
                d.unavailable
                    .write()
                    .insert(name, format!("no pool metadata in {}", dir.display()));
                continue;
            }
            match Engine::open(&dir, &|p| open_disk(p)) {
                Ok(e) => {
                    d.pools.write().insert(name, Arc::new(e));
                }
                Err(e) => {
                    d.events.record(
                        NewEvent::new(
                            Severity::Critical,
                            "pool.unavailable",
                            format!("pool {name} could not be imported: {e}"),
                        )
                        .pool(&name),
                    );
                    d.unavailable.write().insert(name, e.to_string());
                }
            }
        }
        // Written only when the list changed: a state file system that is full (or read-only)
        // does not keep a daemon with nothing new to record from starting.
        if d.imported_names() != recorded {
            d.write_imported()?;
        }
        let opened: Vec<String> = d.pools.read().keys().cloned().collect();
        for pool in opened {
            d.settle_replicas(&pool);
        }
        d.targets.apply_all(&|vd| d.resolve_lun(vd));
        d.nbd
            .present_missing(&|vd| d.served_vdisk(vd), &|vd| d.may_export_writable(vd));
        Ok(d)
    }

    pub fn health(&self) -> HealthView {
        HealthView {
            version: env!("CARGO_PKG_VERSION").to_string(),
            state_dir: self.cfg.state_dir.display().to_string(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            pools: self.pools.read().len(),
            demo: self.cfg.demo,
        }
    }

    fn pool_dir(&self, name: &str) -> PathBuf {
        self.cfg.pools_dir().join(name)
    }

    fn imported_path(&self) -> PathBuf {
        self.cfg.state_dir.join("imported.json")
    }

    fn read_imported(&self) -> Result<ImportedList, String> {
        let list: ImportedList = statefile::read_json(
            &self.imported_path(),
            "fix or remove it, then import pools with 'tessera pool import'",
        )?;
        // A name is a directory under pools/: one the API would refuse could lead out of it.
        for name in &list.pools {
            validate_name("pool", name).map_err(|e| {
                format!(
                    "{}: {e}; fix or remove it, then import pools with 'tessera pool import'",
                    self.imported_path().display()
                )
            })?;
        }
        Ok(list)
    }

    /// Records the imported pools, crash-safely.
    fn write_imported(&self) -> Result<(), String> {
        self.write_imported_list(self.imported_names())
    }

    /// Records the imported pools with `name` among them. Called before a pool made or
    /// imported here is served: one that could not be recorded would be served until the
    /// next start and then silently not be.
    pub(crate) fn record_imported_with(&self, name: &str) -> Result<(), String> {
        let mut names = self.imported_names();
        names.insert(name.to_string());
        self.write_imported_list(names)
    }

    fn write_imported_list(&self, pools: BTreeSet<String>) -> Result<(), String> {
        let list = ImportedList { pools };
        let p = self.imported_path();
        statefile::write_json(&p, &list)
            .map_err(|e| format!("cannot record the imported pools in {}: {e}", p.display()))
    }

    /// The pools imported here, served or not.
    pub(crate) fn imported_names(&self) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self.pools.read().keys().cloned().collect();
        names.extend(self.unavailable.read().keys().cloned());
        names
    }

    fn persist(&self) -> ApiResult<()> {
        self.write_imported().map_err(ApiError::io)
    }

    pub fn engine(&self, pool: &str) -> ApiResult<Arc<Engine>> {
        if let Some(e) = self.pools.read().get(pool) {
            return Ok(e.clone());
        }
        if let Some(why) = self.unavailable.read().get(pool) {
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                crate::error::code::DATA_UNAVAILABLE,
                format!("pool '{pool}' could not be imported: {why}"),
            ));
        }
        Err(ApiError::not_found(format!(
            "no imported pool '{pool}'; 'tessera pool list' shows the imported pools and 'tessera pool import' the others"
        )))
    }

    pub fn vdisk(&self, pool: &str, name: &str) -> ApiResult<(Arc<Engine>, Arc<Vdisk>)> {
        let e = self.engine(pool)?;
        let v = e.vdisk(name).map_err(|_| {
            ApiError::not_found(format!(
                "pool '{pool}' has no vdisk '{name}'; 'tessera vdisk list' shows them"
            ))
        })?;
        Ok((e, v))
    }

    /// The served vdisk `vd` ("pool/name") and its engine, if there is one.
    pub(crate) fn served_vdisk(&self, vd: &str) -> Option<(Arc<Engine>, Arc<Vdisk>)> {
        let (p, v) = vd.split_once('/')?;
        self.vdisk(p, v).ok()
    }

    /// Stops jobs and flushes every pool, with a journal checkpoint so that the next start has
    /// nothing to replay; the pools stay imported for the next start.
    pub fn shutdown(&self) {
        {
            // Once a taking of a pool on RADOS under way has ended: a pool it opened is
            // served before this (and flushed below); the next sees `stopping` and takes
            // nothing.
            let _bringing = self.bringing.lock();
            self.stopping.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.jobs.cancel_all();
        self.jobs.wait_idle(Duration::from_secs(30));
        for (name, e) in self.pools.read().iter() {
            match e.checkpoint().and_then(|()| e.seal()) {
                Ok(()) => info!(pool = %name, "pool flushed"),
                Err(err) => error!(pool = %name, error = %err, "flush at shutdown failed"),
            }
        }
        self.release_rados_pools();
    }

    /// An administrator's change (a pool made, a vdisk deleted), recorded as an info event.
    pub(crate) fn changed(&self, kind: &str, pool: &str, subject: Option<String>, message: String) {
        let mut ev = NewEvent::new(Severity::Info, kind, message).pool(pool);
        ev.subject = subject;
        self.events.record(ev);
    }

    /// When the daemon started.
    pub(crate) fn started_at(&self) -> Instant {
        self.started
    }

    pub fn engines(&self) -> Vec<(String, Arc<Engine>)> {
        self.pools.read().iter().map(|(n, e)| (n.clone(), e.clone())).collect()
    }

    /// The served pools one at a time, each engine taken as the loop comes to it and let go
    /// of before the next: for the background checks, whose look at a pool on RADOS reads
    /// the cluster. One that waits there (a stalled OSD, up to the cluster's timeout) then
    /// holds only its own pool, not every pool against an export or a destroy, which wait
    /// for its holders only a moment.
    pub fn engines_in_turn(&self) -> impl Iterator<Item = (String, Arc<Engine>)> + '_ {
        let names: Vec<String> = self.pools.read().keys().cloned().collect();
        names
            .into_iter()
            .filter_map(|n| self.pools.read().get(&n).cloned().map(|e| (n, e)))
    }
}
