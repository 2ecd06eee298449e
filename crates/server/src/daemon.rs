//! The daemon's state: the pools it has imported (one engine each), the pools it knows but has
//! not imported, and the jobs. Every method here may block on disk I/O; the API calls them from
//! blocking tasks.
//!
//! State directory:
//! - `pools/<name>/`: a pool's metadata store and stripe journal;
//! - `imported.json`: the pools imported when the daemon last ran, imported again at start;
//! - `targets.json`, `nbd.json`, `portals.json`: iSCSI targets, NBD exports, added portals;
//! - `tessera.lock`, `api.sock`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tessera_disk::{DiskRef, FileDisk};
use tessera_pool::{validate_name, DiskState, DEFAULT_SLAB_SIZE};
use tessera_volume::{Engine, LayoutKind, Provisioning, RebuildOptions, Vdisk, VdiskSpec};
use tracing::{error, info, warn};

use crate::config::ServerConfig;
use crate::error::{ApiError, ApiResult};
use crate::image;
use crate::jobs::{JobView, Jobs};
use crate::model::*;
use crate::nbd_exports::{NbdExportConfig, NbdExports};
use crate::portals::Portals;
use crate::statefile;
use crate::targets::Targets;

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
    started: Instant,
    /// Pools past their thin provisioning threshold, whose LUNs have been told.
    thin_warned: Mutex<BTreeSet<String>>,
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
    /// Prepares the state directory and imports every pool that was imported when the daemon
    /// last stopped, and those the configuration names. A pool that cannot be imported is
    /// reported, not fatal: the others are served.
    pub fn start(cfg: ServerConfig) -> Result<Daemon, String> {
        std::fs::create_dir_all(cfg.pools_dir())
            .map_err(|e| format!("cannot create the state directory {}: {e}", cfg.state_dir.display()))?;
        let targets = Targets::load(cfg.state_dir.join("targets.json"))?;
        targets.registry.set_limits(cfg.iscsi_limits);
        let nbd = NbdExports::load(cfg.state_dir.join("nbd.json"))?;
        let portals = Portals::load(
            cfg.state_dir.join("portals.json"),
            cfg.iscsi_listen,
            cfg.iscsi_buffers,
            targets.registry.clone(),
        )?;
        let d = Daemon {
            cfg,
            pools: RwLock::new(BTreeMap::new()),
            unavailable: RwLock::new(BTreeMap::new()),
            jobs: Jobs::default(),
            targets,
            nbd,
            portals,
            admin: Mutex::new(()),
            started: Instant::now(),
            thin_warned: Mutex::new(BTreeSet::new()),
        };
        let mut wanted = d.read_imported()?.pools;
        wanted.extend(d.cfg.pools.iter().cloned());
        for name in wanted {
            let dir = d.pool_dir(&name);
            if !dir.join("meta").exists() {
                warn!(pool = %name, dir = %dir.display(), "pool to import has no metadata store");
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
                    error!(pool = %name, error = %e, "cannot import pool");
                    d.unavailable.write().insert(name, e.to_string());
                }
            }
        }
        d.write_imported()?;
        let resolve = |name: &str| {
            let (p, v) = name.split_once('/')?;
            d.vdisk(p, v).ok()
        };
        d.targets.apply_all(&resolve);
        d.nbd.present_missing(&resolve);
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
        statefile::read_json(
            &self.imported_path(),
            "fix or remove it, then import pools with 'tessera pool import'",
        )
    }

    /// Records the imported pools, crash-safely.
    fn write_imported(&self) -> Result<(), String> {
        let mut list = ImportedList {
            pools: self.pools.read().keys().cloned().collect(),
        };
        list.pools.extend(self.unavailable.read().keys().cloned());
        let p = self.imported_path();
        statefile::write_json(&p, &list)
            .map_err(|e| format!("cannot record the imported pools in {}: {e}", p.display()))
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

    // ---- pools ----

    pub fn create_pool(&self, req: CreatePool) -> ApiResult<PoolSummary> {
        validate_name("pool", &req.name).map_err(ApiError::invalid)?;
        if req.disks.is_empty() {
            return Err(ApiError::invalid(
                "a pool needs at least one disk: give --disk PATH once per disk",
            ));
        }
        let mut seen = BTreeSet::new();
        for p in &req.disks {
            if !Path::new(p).is_absolute() {
                return Err(ApiError::invalid(format!("disk path '{p}' must be absolute")));
            }
            if !seen.insert(p) {
                return Err(ApiError::invalid(format!("disk '{p}' is listed twice")));
            }
        }
        let slab = req.slab_size.unwrap_or(DEFAULT_SLAB_SIZE);
        let _admin = self.admin.lock();
        let dir = self.pool_dir(&req.name);
        if self.pools.read().contains_key(&req.name) || self.unavailable.read().contains_key(&req.name) {
            return Err(ApiError::exists(format!("pool '{}' already exists", req.name)));
        }
        if dir.exists() {
            return Err(ApiError::exists(format!(
                "pool '{}' already exists in {} but is not imported; 'tessera pool import {}' brings it back",
                req.name,
                dir.display(),
                req.name
            )));
        }
        let mut disks = Vec::new();
        for p in &req.disks {
            disks.push(open_disk(p)?);
        }
        let engine = Engine::create_pool(&dir, &req.name, disks, slab).inspect_err(|_| {
            // Pool::create leaves nothing behind on the disks it refused; the directory it made
            // is ours to remove.
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        self.pools.write().insert(req.name.clone(), Arc::new(engine));
        self.persist()?;
        info!(pool = %req.name, "pool created");
        self.pool_summary(&req.name)
    }

    pub fn list_pools(&self) -> Vec<PoolSummary> {
        let mut names: BTreeSet<String> = self.pools.read().keys().cloned().collect();
        names.extend(self.unavailable.read().keys().cloned());
        names.iter().filter_map(|n| self.pool_summary(n).ok()).collect()
    }

    pub fn pool_summary(&self, name: &str) -> ApiResult<PoolSummary> {
        let e = match self.engine(name) {
            Ok(e) => e,
            Err(err) => {
                let why = self.unavailable.read().get(name).cloned().ok_or(err)?;
                return Ok(PoolSummary {
                    name: name.to_string(),
                    id: String::new(),
                    health: "unavailable".into(),
                    problem: Some(why),
                    disks: 0,
                    healthy_disks: 0,
                    capacity: None,
                    slab_size: 0,
                    vdisks: 0,
                    repair_needed_bytes: 0,
                    jobs_running: vec![],
                    warnings: vec![],
                });
            }
        };
        let pool = e.pool();
        let disks = pool.disks();
        let (_, repair) = e.layouts().repair_needed();
        let sets = unhealthy_sets(&e);
        let healthy_disks = disks.iter().filter(|d| d.info.state == DiskState::Healthy).count();
        // A failed or retired disk that holds nothing any more does not make the pool degraded:
        // every slab set has its full redundancy.
        let health = if sets.iter().any(|s| s.state == "failed") {
            "failed"
        } else if !sets.is_empty() || repair > 0 {
            "degraded"
        } else {
            "healthy"
        };
        let idle: Vec<&str> = disks
            .iter()
            .filter(|d| d.info.state != DiskState::Healthy && d.slabs_used == 0)
            .map(|d| d.info.path.as_str())
            .collect();
        let problem = match health {
            "failed" => Some("some slab sets lost more disks than their layout tolerates: their data is unreadable until a disk comes back".to_string()),
            _ if repair > 0 => Some(format!(
                "{} to rebuild or move off failed, missing or retired disks: run 'tessera pool repair {name}'",
                crate::units::format_size(repair)
            )),
            _ if !idle.is_empty() => Some(format!("disk(s) {} are out of service and hold no data", idle.join(", "))),
            _ => None,
        };
        Ok(PoolSummary {
            name: name.to_string(),
            id: pool.id().to_string(),
            health: health.to_string(),
            problem,
            disks: disks.len(),
            healthy_disks,
            capacity: Some(pool.capacity()),
            slab_size: pool.slab_size(),
            vdisks: e.vdisks().len(),
            repair_needed_bytes: repair,
            jobs_running: self.jobs.running_on(name),
            warnings: self.thin_warning(&e).into_iter().collect(),
        })
    }

    /// The pool's allocated share, in percent, when it is at or past the thin threshold.
    fn past_thin_threshold(&self, e: &Engine) -> Option<u64> {
        let c = e.pool().capacity();
        let pct = (c.used_bytes * 100).checked_div(c.total_bytes)?;
        (pct >= self.cfg.thin_threshold_percent as u64).then_some(pct)
    }

    fn thin_warning(&self, e: &Engine) -> Option<String> {
        let pct = self.past_thin_threshold(e)?;
        Some(format!(
            "{pct}% of the pool's space is allocated, at or past the thin provisioning threshold of {}%: \
             add a disk, or free space (trim, delete vdisks or snapshots) before writes fail",
            self.cfg.thin_threshold_percent
        ))
    }

    /// Raises THIN PROVISIONING SOFT THRESHOLD REACHED on the LUNs of every pool that has
    /// just gone past the threshold, once per crossing (it must fall 5 points below to be
    /// raised again), and logs it. Called now and then by the daemon.
    pub fn check_thin_thresholds(&self) {
        let pools: Vec<(String, Arc<Engine>)> = self.pools.read().iter().map(|(n, e)| (n.clone(), e.clone())).collect();
        let mut warned = self.thin_warned.lock();
        for (name, e) in pools {
            let c = e.pool().capacity();
            let Some(pct) = (c.used_bytes * 100).checked_div(c.total_bytes) else {
                continue;
            };
            let threshold = self.cfg.thin_threshold_percent as u64;
            if pct >= threshold && warned.insert(name.clone()) {
                warn!(pool = %name, allocated_percent = pct, threshold, "pool past its thin provisioning threshold");
                for lun in self.targets.luns_of_pool(&name) {
                    lun.unit_attention(tessera_scsi::sense::THIN_PROVISIONING_SOFT_THRESHOLD_REACHED, None);
                }
            } else if pct + 5 < threshold && warned.remove(&name) {
                info!(pool = %name, allocated_percent = pct, threshold, "pool back under its thin provisioning threshold");
            }
        }
    }

    pub fn pool_detail(&self, name: &str) -> ApiResult<PoolDetail> {
        let summary = self.pool_summary(name)?;
        let (disk_list, vdisk_list, unhealthy, stats) = match self.engine(name) {
            Ok(e) => {
                let s = &e.layouts().stats;
                let ld = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
                (
                    e.pool().disks().into_iter().map(DiskView::from).collect(),
                    e.vdisks().iter().map(|v| vdisk_view(name, &e, v)).collect(),
                    unhealthy_sets(&e),
                    IoStatsView {
                        read_errors: ld(&s.read_errors),
                        write_errors: ld(&s.write_errors),
                        reconstructed_reads: ld(&s.reconstructed_reads),
                        repaired_blocks: ld(&s.repaired_blocks),
                    },
                )
            }
            Err(_) => (vec![], vec![], vec![], IoStatsView::default()),
        };
        Ok(PoolDetail {
            summary,
            disk_list,
            vdisk_list,
            unhealthy_sets: unhealthy,
            stats,
        })
    }

    /// Pools in the state directory that are not imported.
    pub fn importable(&self) -> ApiResult<Vec<ImportablePool>> {
        let dir = self.cfg.pools_dir();
        let rd = std::fs::read_dir(&dir).map_err(|e| ApiError::io(format!("cannot list {}: {e}", dir.display())))?;
        let pools = self.pools.read();
        let mut out = Vec::new();
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if !pools.contains_key(&name) && entry.path().join("meta").is_dir() {
                out.push(ImportablePool {
                    name,
                    dir: entry.path().display().to_string(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub fn import_pool(&self, name: &str) -> ApiResult<PoolSummary> {
        validate_name("pool", name).map_err(ApiError::invalid)?;
        let _admin = self.admin.lock();
        if self.pools.read().contains_key(name) {
            return Err(ApiError::exists(format!("pool '{name}' is already imported")));
        }
        let dir = self.pool_dir(name);
        if !dir.join("meta").is_dir() {
            return Err(ApiError::not_found(format!(
                "there is no pool '{name}' in {}; 'tessera pool import' lists the pools that can be imported",
                self.cfg.pools_dir().display()
            )));
        }
        let engine = Engine::open(&dir, &|p| open_disk(p))?;
        self.pools.write().insert(name.to_string(), Arc::new(engine));
        self.unavailable.write().remove(name);
        self.persist()?;
        let resolve = |vd: &str| {
            let (p, v) = vd.split_once('/')?;
            self.vdisk(p, v).ok()
        };
        self.targets.present_missing(&resolve);
        self.nbd.present_missing(&resolve);
        self.pool_summary(name)
    }

    /// Takes a pool out of the map for export or destroy; refused while a job or a request
    /// still uses it.
    fn take_pool(&self, name: &str, what: &str) -> ApiResult<Engine> {
        let users = self.users_of(&format!("{name}/"));
        if !users.is_empty() {
            return Err(ApiError::busy(format!(
                "cannot {what} pool '{name}': its vdisks are presented as {}; remove those first",
                users.join(", ")
            )));
        }
        let jobs = self.jobs.running_on(name);
        if !jobs.is_empty() {
            return Err(ApiError::busy(format!(
                "cannot {what} pool '{name}': job(s) {jobs:?} are running on it; wait for them or cancel them"
            )));
        }
        // ROD tokens hold grains of the pool: they end with it.
        self.targets.copy.revoke_pool(name);
        let arc = self.pools.write().remove(name).ok_or_else(|| {
            if self.unavailable.read().contains_key(name) {
                ApiError::invalid(format!("pool '{name}' is not imported (it could not be)"))
            } else {
                ApiError::not_found(format!("no imported pool '{name}'"))
            }
        })?;
        // Requests in flight hold the engine for a moment; give them that moment.
        let mut arc = arc;
        for _ in 0..100 {
            match Arc::try_unwrap(arc) {
                Ok(e) => return Ok(e),
                Err(back) => arc = back,
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.pools.write().insert(name.to_string(), arc);
        Err(ApiError::busy(format!("pool '{name}' is in use; try again")))
    }

    pub fn export_pool(&self, name: &str) -> ApiResult<()> {
        let _admin = self.admin.lock();
        if self.unavailable.write().remove(name).is_some() {
            // Never imported: forgetting it is all an export means.
            return self.persist();
        }
        let e = self.take_pool(name, "export")?;
        e.export()?;
        self.persist()?;
        info!(pool = name, "pool exported");
        Ok(())
    }

    pub fn destroy_pool(&self, name: &str) -> ApiResult<()> {
        let _admin = self.admin.lock();
        let e = self.take_pool(name, "destroy")?;
        let vdisks: Vec<String> = e.vdisks().iter().map(|v| v.name()).collect();
        if !vdisks.is_empty() {
            self.pools.write().insert(name.to_string(), Arc::new(e));
            return Err(ApiError::busy(format!(
                "pool '{name}' still holds vdisk(s) {}; delete them first ('tessera vdisk delete {name}/NAME')",
                vdisks.join(", ")
            )));
        }
        e.destroy()?;
        self.persist()?;
        info!(pool = name, "pool destroyed");
        Ok(())
    }

    pub fn repair_pool(&self, name: &str, req: RepairPool) -> ApiResult<JobView> {
        let e = self.engine(name)?;
        if let Some(p) = req.parallel {
            if !(1..=64).contains(&p) {
                return Err(ApiError::invalid(format!("parallel must be between 1 and 64, not {p}")));
            }
        }
        if req.rate_limit == Some(0) {
            return Err(ApiError::invalid(
                "a rate limit of 0 would never finish; leave it out for no limit",
            ));
        }
        if let Some(j) = self
            .jobs
            .running_on(name)
            .into_iter()
            .find(|&id| self.jobs.get(id).map(|j| j.kind == "repair").unwrap_or(false))
        {
            return Err(ApiError::busy(format!(
                "a repair of pool '{name}' is already running as job {j}"
            )));
        }
        let opts = RebuildOptions {
            parallel: req.parallel.unwrap_or(4),
            rate_limit: req.rate_limit,
        };
        let job = self.jobs.spawn("repair", name, move |p| {
            let r = e.repair(&opts, p).map_err(|e| e.to_string())?;
            if !r.failures.is_empty() {
                let why: Vec<String> = r.failures.iter().map(|(s, m)| format!("slab set {s}: {m}")).collect();
                return Err(format!(
                    "{} slab set(s) could not be rebuilt: {}",
                    r.failures.len(),
                    why.join("; ")
                ));
            }
            Ok(serde_json::to_value(r).expect("serializable"))
        });
        Ok(job.view())
    }

    pub fn check_pool(&self, name: &str) -> ApiResult<tessera_volume::CheckReport> {
        Ok(self.engine(name)?.check()?)
    }

    // ---- disks ----

    pub fn add_disk(&self, pool: &str, path: &str) -> ApiResult<DiskView> {
        if !Path::new(path).is_absolute() {
            return Err(ApiError::invalid(format!("disk path '{path}' must be absolute")));
        }
        let e = self.engine(pool)?;
        let info = e.pool().add_disk(open_disk(path)?)?;
        e.pool()
            .disks()
            .into_iter()
            .find(|d| d.info.id == info.id)
            .map(DiskView::from)
            .ok_or_else(|| ApiError::internal("the added disk is not listed"))
    }

    pub fn set_disk(&self, pool: &str, disk: &str, action: &str) -> ApiResult<DiskView> {
        let e = self.engine(pool)?;
        let pos = e.pool().find_disk(disk)?;
        match action {
            "fail" => e.fail_disk(disk)?,
            "retire" => e.retire_disk(disk)?,
            _ => {
                return Err(ApiError::not_found(format!(
                    "no disk action '{action}'; use fail or retire"
                )))
            }
        }
        warn!(pool, disk, action, "disk state changed by the administrator");
        e.pool()
            .disks()
            .into_iter()
            .find(|d| d.info.position == pos)
            .map(DiskView::from)
            .ok_or_else(|| ApiError::internal("the disk is not listed"))
    }

    // ---- vdisks ----

    pub fn create_vdisk(&self, pool: &str, req: CreateVdisk) -> ApiResult<VdiskView> {
        let e = self.engine(pool)?;
        let spec = vdisk_spec(&e, req);
        let v = e.create_vdisk(&spec)?;
        Ok(vdisk_view(pool, &e, &v))
    }

    /// A thin copy-on-write clone of a vdisk, in the same pool.
    pub fn clone_vdisk(&self, pool: &str, src: &str, req: CloneVdisk) -> ApiResult<CloneView> {
        let (e, _) = self.vdisk(pool, src)?;
        let jobs = self.jobs.running_on(&format!("{pool}/{src}"));
        if !jobs.is_empty() {
            return Err(ApiError::busy(format!(
                "vdisk '{pool}/{src}' is in use by job(s) {jobs:?}; clone it when they end"
            )));
        }
        let (v, stats) = e.clone_vdisk(src, &req.name)?;
        info!(pool, source = src, clone = %req.name, shared = stats.shared_bytes, copied = stats.copied_bytes, "vdisk cloned");
        Ok(CloneView {
            vdisk: vdisk_view(pool, &e, &v),
            shared_bytes: stats.shared_bytes,
            copied_bytes: stats.copied_bytes,
        })
    }

    /// The vdisks (not the snapshots) of one pool or of all.
    pub fn list_vdisks(&self, pool: Option<&str>) -> ApiResult<Vec<VdiskView>> {
        Ok(self
            .engines_of(pool)?
            .iter()
            .flat_map(|(n, e)| {
                e.vdisks()
                    .iter()
                    .filter(|v| !v.is_snapshot())
                    .map(|v| vdisk_view(n, e, v))
                    .collect::<Vec<_>>()
            })
            .collect())
    }

    fn engines_of(&self, pool: Option<&str>) -> ApiResult<Vec<(String, Arc<Engine>)>> {
        Ok(match pool {
            Some(p) => vec![(p.to_string(), self.engine(p)?)],
            None => self.engines(),
        })
    }

    // ---- snapshots ----

    /// A read-only point-in-time image `VDISK@NAME`, sharing every grain with the vdisk.
    pub fn create_snapshot(&self, pool: &str, vdisk: &str, req: CreateSnapshot) -> ApiResult<SnapshotView> {
        let (e, _) = self.vdisk(pool, vdisk)?;
        let started = std::time::Instant::now();
        let s = e.snapshot(vdisk, &req.name)?;
        info!(pool, vdisk, snapshot = %req.name, took_ms = started.elapsed().as_millis() as u64, "snapshot taken");
        Ok(snapshot_view(pool, &s))
    }

    /// Snapshots of one vdisk (also of a deleted one, by its name), of a pool, or of all.
    pub fn list_snapshots(&self, pool: Option<&str>, vdisk: Option<&str>) -> ApiResult<Vec<SnapshotView>> {
        let mut out = Vec::new();
        for (n, e) in self.engines_of(pool)? {
            let snaps = match vdisk {
                Some(v) => e.snapshots_of(v),
                None => {
                    let mut all: Vec<Arc<Vdisk>> = e.vdisks().into_iter().filter(|v| v.is_snapshot()).collect();
                    all.sort_by_key(|s| (s.config().snapshot_of, s.config().created, s.id()));
                    all
                }
            };
            out.extend(snaps.iter().map(|s| snapshot_view(&n, s)));
        }
        Ok(out)
    }

    pub fn show_snapshot(&self, pool: &str, vdisk: &str, name: &str) -> ApiResult<SnapshotView> {
        let (_, s) = self.snapshot(pool, vdisk, name)?;
        Ok(snapshot_view(pool, &s))
    }

    /// Deletes a snapshot; the grains only it held go back to the pool.
    pub fn delete_snapshot(&self, pool: &str, vdisk: &str, name: &str) -> ApiResult<()> {
        let (_, s) = self.snapshot(pool, vdisk, name)?;
        self.delete_vdisk(pool, &s.name())
    }

    fn snapshot(&self, pool: &str, vdisk: &str, name: &str) -> ApiResult<(Arc<Engine>, Arc<Vdisk>)> {
        let full = format!("{vdisk}@{name}");
        match self.vdisk(pool, &full) {
            Ok((e, s)) if s.is_snapshot() => Ok((e, s)),
            _ => Err(ApiError::not_found(format!("pool '{pool}' has no snapshot '{full}'"))),
        }
    }

    pub fn show_vdisk(&self, pool: &str, name: &str) -> ApiResult<VdiskView> {
        let (e, v) = self.vdisk(pool, name)?;
        Ok(vdisk_view(pool, &e, &v))
    }

    pub fn resize_vdisk(&self, pool: &str, name: &str, size: u64) -> ApiResult<VdiskView> {
        let (e, _) = self.vdisk(pool, name)?;
        e.resize_vdisk(name, size)?;
        // Initiators learn of the new capacity through a unit attention.
        for l in self.targets.luns_of(&format!("{pool}/{name}")) {
            l.capacity_changed();
        }
        self.show_vdisk(pool, name)
    }

    pub fn delete_vdisk(&self, pool: &str, name: &str) -> ApiResult<()> {
        let (e, _) = self.vdisk(pool, name)?;
        let target = format!("{pool}/{name}");
        let jobs = self.jobs.running_on(&target);
        if !jobs.is_empty() {
            return Err(ApiError::busy(format!(
                "vdisk '{target}' is in use by job(s) {jobs:?}; wait for them or cancel them"
            )));
        }
        let users = self.users_of(&target);
        if !users.is_empty() {
            return Err(ApiError::busy(format!(
                "vdisk '{target}' is presented as {}; remove it there first ('tessera target lun remove', 'tessera nbd remove')",
                users.join(", ")
            )));
        }
        e.delete_vdisk(name)?;
        Ok(())
    }

    pub fn import_image(&self, pool: &str, name: &str, req: ImportImage) -> ApiResult<JobView> {
        let e = self.engine(pool)?;
        let path = PathBuf::from(&req.path);
        if !path.is_absolute() {
            return Err(ApiError::invalid(format!("image path '{}' must be absolute", req.path)));
        }
        let image_size = image::image_size(&path).map_err(ApiError::invalid)?;
        let v = match e.vdisk(name) {
            Ok(v) => v,
            Err(_) => {
                let Some(mut c) = req.create else {
                    return Err(ApiError::not_found(format!(
                        "pool '{pool}' has no vdisk '{name}'; create it first, or import with a layout to create it"
                    )));
                };
                c.name = name.to_string();
                if c.size == 0 {
                    let bs = c.block_size.unwrap_or(512) as u64;
                    c.size = image_size.div_ceil(bs).max(1) * bs;
                }
                e.create_vdisk(&vdisk_spec(&e, c))?
            }
        };
        if image_size > v.size() {
            return Err(ApiError::invalid(format!(
                "the image {} ({image_size} bytes) is larger than vdisk '{pool}/{name}' ({} bytes); grow the vdisk first",
                req.path,
                v.size()
            )));
        }
        self.busy_vdisk_check(pool, name)?;
        let job = self.jobs.spawn("import", &format!("{pool}/{name}"), move |p| {
            let r = image::import(&v, &path, p)?;
            Ok(serde_json::to_value(r).expect("serializable"))
        });
        Ok(job.view())
    }

    pub fn export_image(&self, pool: &str, name: &str, req: ExportImage) -> ApiResult<JobView> {
        let (_, v) = self.vdisk(pool, name)?;
        let path = PathBuf::from(&req.path);
        if !path.is_absolute() {
            return Err(ApiError::invalid(format!("image path '{}' must be absolute", req.path)));
        }
        let file = image::create_target(&path, req.overwrite, v.size()).map_err(ApiError::invalid)?;
        let job = self.jobs.spawn("export", &format!("{pool}/{name}"), move |p| {
            let r = image::export(&v, file, &path, p)?;
            Ok(serde_json::to_value(r).expect("serializable"))
        });
        Ok(job.view())
    }

    fn busy_vdisk_check(&self, pool: &str, name: &str) -> ApiResult<()> {
        let target = format!("{pool}/{name}");
        for id in self.jobs.running_on(&target) {
            if self.jobs.get(id).map(|j| j.kind == "import").unwrap_or(false) {
                return Err(ApiError::busy(format!(
                    "an import into '{target}' is already running as job {id}"
                )));
            }
        }
        Ok(())
    }

    /// Where a vdisk (or, with a trailing '/', any vdisk of a pool) is served: LUNs and exports.
    fn users_of(&self, prefix_or_name: &str) -> Vec<String> {
        let mut u = self.targets.users_of(prefix_or_name);
        u.extend(self.nbd.users_of(prefix_or_name));
        u
    }

    // ---- iSCSI targets ----

    pub fn target_view(&self, iqn: &str) -> ApiResult<TargetView> {
        let cfg = self.targets.get(iqn)?;
        let luns = cfg
            .luns
            .iter()
            .map(|(&lun, vd)| {
                let v = vd.split_once('/').and_then(|(p, n)| self.vdisk(p, n).ok());
                let presented = self.targets.registry.target(iqn).and_then(|t| t.lun(lun));
                LunView {
                    lun,
                    vdisk: vd.clone(),
                    online: v.is_some(),
                    size: v.map(|(_, v)| v.size()),
                    reservations: presented.map(|l| l.reservations()).and_then(reservations_view),
                }
            })
            .collect();
        Ok(TargetView {
            iqn: cfg.iqn,
            luns,
            acl: cfg.acl,
            allow_any_initiator: cfg.allow_any_initiator,
            chap: cfg.chap.map(|c| ChapView {
                user: c.user,
                mutual_user: c.mutual_user,
            }),
        })
    }

    pub fn list_targets(&self) -> Vec<TargetView> {
        self.targets
            .list()
            .iter()
            .filter_map(|t| self.target_view(&t.iqn).ok())
            .collect()
    }

    pub fn create_target(&self, iqn: &str, allow_any_initiator: bool) -> ApiResult<TargetView> {
        self.targets.create(iqn, allow_any_initiator)?;
        self.target_view(iqn)
    }

    pub fn set_allow_any_initiator(&self, iqn: &str, allow: bool) -> ApiResult<TargetView> {
        self.targets.set_allow_any(iqn, allow)?;
        self.target_view(iqn)
    }

    pub fn delete_target(&self, iqn: &str) -> ApiResult<()> {
        self.targets.delete(iqn)
    }

    pub fn add_lun(&self, iqn: &str, req: AddLun) -> ApiResult<TargetView> {
        let (p, n) = req
            .vdisk
            .split_once('/')
            .ok_or_else(|| ApiError::invalid(format!("'{}' does not name a vdisk: write POOL/NAME", req.vdisk)))?;
        let (e, v) = self.vdisk(p, n)?;
        self.targets.add_lun(iqn, req.lun, &req.vdisk, e, v)?;
        self.target_view(iqn)
    }

    pub fn remove_lun(&self, iqn: &str, lun: u64) -> ApiResult<TargetView> {
        self.targets.remove_lun(iqn, lun)?;
        self.target_view(iqn)
    }

    pub fn acl_add(&self, iqn: &str, initiator: &str) -> ApiResult<TargetView> {
        self.targets.acl_add(iqn, initiator)?;
        self.target_view(iqn)
    }

    pub fn acl_remove(&self, iqn: &str, initiator: &str) -> ApiResult<TargetView> {
        self.targets.acl_remove(iqn, initiator)?;
        self.target_view(iqn)
    }

    pub fn chap_set(&self, iqn: &str, chap: SetChap) -> ApiResult<TargetView> {
        self.targets.chap_set(iqn, chap)?;
        self.target_view(iqn)
    }

    pub fn chap_clear(&self, iqn: &str) -> ApiResult<TargetView> {
        self.targets.chap_clear(iqn)?;
        self.target_view(iqn)
    }

    // ---- NBD exports ----

    fn nbd_view(&self, c: NbdExportConfig) -> NbdExportView {
        let v = c.vdisk.split_once('/').and_then(|(p, n)| self.vdisk(p, n).ok());
        NbdExportView {
            connections: self.nbd.connections(&c.name),
            online: v.is_some(),
            size: v.map(|(_, v)| v.size()),
            name: c.name,
            vdisk: c.vdisk,
            read_only: c.read_only,
        }
    }

    pub fn list_nbd_exports(&self) -> Vec<NbdExportView> {
        self.nbd.list().into_iter().map(|c| self.nbd_view(c)).collect()
    }

    pub fn show_nbd_export(&self, name: &str) -> ApiResult<NbdExportView> {
        Ok(self.nbd_view(self.nbd.get(name)?))
    }

    /// Exports a vdisk over NBD, by default under its own name.
    pub fn add_nbd_export(&self, req: CreateNbdExport) -> ApiResult<NbdExportView> {
        let (p, n) = req
            .vdisk
            .split_once('/')
            .ok_or_else(|| ApiError::invalid(format!("'{}' does not name a vdisk: write POOL/NAME", req.vdisk)))?;
        let (_, v) = self.vdisk(p, n)?;
        let cfg = NbdExportConfig {
            name: req.name.unwrap_or_else(|| n.to_string()),
            vdisk: req.vdisk,
            read_only: req.read_only,
        };
        let name = cfg.name.clone();
        self.nbd.add(cfg, v)?;
        self.show_nbd_export(&name)
    }

    pub fn remove_nbd_export(&self, name: &str) -> ApiResult<()> {
        self.nbd.remove(name)
    }

    /// Stops jobs and flushes every pool, with a journal checkpoint so that the next start has
    /// nothing to replay; the pools stay imported for the next start.
    pub fn shutdown(&self) {
        self.jobs.cancel_all();
        self.jobs.wait_idle(Duration::from_secs(30));
        for (name, e) in self.pools.read().iter() {
            match e.checkpoint() {
                Ok(()) => info!(pool = %name, "pool flushed"),
                Err(err) => error!(pool = %name, error = %err, "flush at shutdown failed"),
            }
        }
    }

    /// Every imported pool's engine, for the protocol front ends and the demo.
    pub fn engines(&self) -> Vec<(String, Arc<Engine>)> {
        self.pools.read().iter().map(|(n, e)| (n.clone(), e.clone())).collect()
    }
}

fn unhealthy_sets(e: &Engine) -> Vec<SetHealthView> {
    let l = e.layouts();
    l.sets()
        .iter()
        .map(|s| l.health(s))
        .filter(|h| h.unavailable > 0)
        .map(|h| SetHealthView {
            id: h.id,
            layout: h.layout.clone(),
            state: h.state().to_string(),
            unavailable: h.unavailable,
            tolerance: h.tolerance,
        })
        .collect()
}

/// A vdisk as the API shows it; `e` is its pool's engine, which knows its snapshots.
pub fn vdisk_view(pool: &str, e: &Engine, v: &Vdisk) -> VdiskView {
    let c = v.config();
    let u = v.space_usage();
    VdiskView {
        pool: pool.to_string(),
        name: c.name.clone(),
        size: c.size,
        block_size: c.block_size,
        physical_block_size: c.physical_block_size,
        grain_size: c.grain_size,
        layout_description: c.layout.describe(),
        layout: c.layout,
        provisioning: c.provisioning,
        allocated_bytes: u.allocated_bytes,
        exclusive_bytes: u.exclusive_bytes,
        shared_bytes: u.shared_bytes,
        snapshots: e.snapshots_of(&v.name()).len(),
    }
}

pub fn snapshot_view(pool: &str, s: &Vdisk) -> SnapshotView {
    let c = s.config();
    let u = s.space_usage();
    let vdisk = c.snapshot_of.clone().unwrap_or_default();
    SnapshotView {
        pool: pool.to_string(),
        name: c.name.strip_prefix(&format!("{vdisk}@")).unwrap_or(&c.name).to_string(),
        full_name: c.name.clone(),
        vdisk,
        size: c.size,
        created: c.created,
        allocated_bytes: u.allocated_bytes,
        exclusive_bytes: u.exclusive_bytes,
        shared_bytes: u.shared_bytes,
    }
}

fn vdisk_spec(e: &Engine, req: CreateVdisk) -> VdiskSpec {
    let healthy = e
        .pool()
        .disks()
        .iter()
        .filter(|d| d.info.state == DiskState::Healthy)
        .count();
    let layout = req.layout.unwrap_or(if healthy >= 2 {
        LayoutKind::Mirror
    } else {
        LayoutKind::Simple
    });
    let mut spec = VdiskSpec::new(&req.name, req.size, layout);
    spec.copies = req.copies;
    spec.columns = req.columns;
    spec.interleave = req.interleave;
    spec.provisioning = req.provisioning.unwrap_or(Provisioning::Thin);
    spec.grain_size = req.grain_size;
    spec.block_size = req.block_size;
    spec.physical_block_size = req.physical_block_size;
    spec
}

fn port_name(p: &tessera_scsi::pr::PortId) -> String {
    match p.isid {
        Some(i) => format!(
            "{},i,0x{}",
            p.initiator,
            i.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
        None => p.initiator.clone(),
    }
}

/// What `target show` says of a LUN's persistent reservations; None when nobody registered.
fn reservations_view(pr: tessera_scsi::PrState) -> Option<ReservationsView> {
    if pr.registrations.is_empty() && pr.reservation.is_none() {
        return None;
    }
    let (holder, kind) = match &pr.reservation {
        Some(r) => {
            let all = matches!(r.kind, 7 | 8);
            let kind = match r.kind {
                1 => "write exclusive",
                3 => "exclusive access",
                5 => "write exclusive, registrants only",
                6 => "exclusive access, registrants only",
                7 => "write exclusive, all registrants",
                8 => "exclusive access, all registrants",
                _ => "unknown",
            };
            let holder = if all {
                "all registrants".to_string()
            } else {
                port_name(&r.holder)
            };
            (Some(holder), Some(kind.to_string()))
        }
        None => (None, None),
    };
    Some(ReservationsView {
        generation: pr.generation,
        registered: pr.registrations.iter().map(|r| port_name(&r.port)).collect(),
        holder,
        kind,
        aptpl: pr.aptpl,
    })
}
