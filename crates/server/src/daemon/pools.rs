//! Pools: create, import, export, destroy, repair and check them, their disks, their thin
//! provisioning threshold.

use super::*;

impl Daemon {
    pub fn create_pool(&self, req: CreatePool) -> ApiResult<PoolSummary> {
        validate_name("pool", &req.name).map_err(ApiError::invalid)?;
        if let Some(r) = &req.rados {
            self.check_rados_reach(r)?;
            return self.create_rados_pool(&req, r);
        }
        if req.capacity.is_some() {
            return Err(ApiError::invalid(
                "--capacity is for a pool on RADOS; a pool on disks holds what its disks hold",
            ));
        }
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
        let dir = self.new_pool_dir(&req.name)?;
        for p in &req.cache_disks {
            if !Path::new(p).is_absolute() {
                return Err(ApiError::invalid(format!("cache disk path '{p}' must be absolute")));
            }
            if !seen.insert(p) {
                return Err(ApiError::invalid(format!("disk '{p}' is listed twice")));
            }
        }
        let mut disks = Vec::new();
        for p in &req.disks {
            disks.push(self.open_new_disk(p)?);
        }
        let mut cache_disks = Vec::new();
        for p in &req.cache_disks {
            cache_disks.push(self.open_new_disk(p)?);
        }
        let engine = Engine::create_pool(&dir, &req.name, disks, slab).inspect_err(|_| {
            // Pool::create leaves nothing behind on the disks it refused; the directory it made
            // is ours to remove.
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        for dev in cache_disks {
            if let Err(err) = engine.add_cache_disk(dev) {
                // All or nothing: the pool made so far goes again.
                let _ = engine.destroy();
                let _ = std::fs::remove_dir_all(&dir);
                return Err(err.into());
            }
        }
        // Recorded before it is served, as an import is: a pool that could not be recorded
        // would be served until the next start and then silently not be. All or nothing.
        if let Err(err) = self.record_imported_with(&req.name) {
            let _ = engine.destroy();
            let _ = std::fs::remove_dir_all(&dir);
            return Err(ApiError::io(err));
        }
        self.pools.write().insert(req.name.clone(), Arc::new(engine));
        let n = req.disks.len() + req.cache_disks.len();
        self.changed(
            "pool.created",
            &req.name,
            None,
            format!("pool {} created on {n} disk(s)", req.name),
        );
        self.pool_summary(&req.name)
    }

    /// The directory of a pool about to be made, refused if a pool of that name exists here
    /// (imported or not). Call with the admin lock held.
    pub(super) fn new_pool_dir(&self, name: &str) -> ApiResult<PathBuf> {
        self.not_being_destroyed(name)?;
        let dir = self.pool_dir(name);
        if self.pools.read().contains_key(name) || self.unavailable.read().contains_key(name) {
            return Err(ApiError::exists(format!("pool '{name}' already exists")));
        }
        if dir.exists() {
            return Err(ApiError::exists(format!(
                "pool '{name}' already exists in {} but is not imported; 'tessera pool import {name}' brings it back",
                dir.display(),
            )));
        }
        Ok(dir)
    }

    pub fn list_pools(&self) -> Vec<PoolSummary> {
        self.pool_names()
            .iter()
            .filter_map(|n| self.pool_summary(n).ok())
            .collect()
    }

    /// Every pool's detail (imported or not), as `pool show` gives it.
    pub fn pool_details(&self) -> Vec<PoolDetail> {
        self.pool_names()
            .iter()
            .filter_map(|n| self.pool_detail(n).ok())
            .collect()
    }

    /// The pools listed: imported (served or not), and being destroyed here.
    fn pool_names(&self) -> BTreeSet<String> {
        let mut names = self.imported_names();
        names.extend(self.destroy_names());
        names
    }

    pub fn pool_summary(&self, name: &str) -> ApiResult<PoolSummary> {
        let e = match self.engine(name) {
            Ok(e) => e,
            Err(err) => {
                let unavailable = self.unavailable.read().get(name).cloned();
                let (health, id, problem, rados) = match unavailable {
                    Some(why) => (PoolHealth::Unavailable, String::new(), why, self.rados_view(name)),
                    None => {
                        let d = self.destroy_progress(name).ok_or(err)?;
                        let rados = d
                            .placement
                            .map(|(rados_pool, epoch)| RadosPoolView::unowned(rados_pool, epoch));
                        let id = d.pool_id.map(|i| i.to_string()).unwrap_or_default();
                        (PoolHealth::Destroying, id, d.problem, rados)
                    }
                };
                return Ok(PoolSummary {
                    name: name.to_string(),
                    id,
                    health,
                    problem: Some(problem),
                    disks: 0,
                    healthy_disks: 0,
                    capacity: None,
                    slab_size: 0,
                    vdisks: 0,
                    repair_needed_bytes: 0,
                    lost_bytes: 0,
                    jobs_running: vec![],
                    warnings: vec![],
                    auto_repair: self.auto_repair.view(self.cfg.auto_repair, name),
                    scrub: Default::default(),
                    scan: None,
                    scan_next_due: None,
                    cache: None,
                    rados,
                });
            }
        };
        let pool = e.pool();
        let disks = pool.disks();
        let (health, repair) = pool_health(&e);
        let healthy_disks = disks.iter().filter(|d| d.info.state == DiskState::Healthy).count();
        let idle: Vec<&str> = disks
            .iter()
            .filter(|d| !matches!(d.info.state, DiskState::Healthy | DiskState::Spare) && d.slabs_used == 0)
            .map(|d| d.info.path.as_str())
            .collect();
        let problem = match health {
            PoolHealth::Failed => Some("some slab sets lost more disks than their layout tolerates: their data is unreadable until a disk comes back".to_string()),
            _ if repair > 0 => Some(format!(
                "{} to rebuild or move off failed, missing or retired disks: 'tessera pool repair {name}' starts it now{}",
                crate::units::format_size(repair),
                if disks.iter().any(|d| d.info.may_come_back()) {
                    " (or, for a disk that may come back, 'tessera disk online' once it is mended)"
                } else {
                    ""
                }
            )),
            _ if !idle.is_empty() => Some(format!("disk(s) {} are out of service and hold no data", idle.join(", "))),
            _ => None,
        };
        let scan = e.scan_report().ok().flatten();
        let lost = e.lost_bytes();
        Ok(PoolSummary {
            name: name.to_string(),
            id: pool.id().to_string(),
            health,
            problem,
            disks: disks.len(),
            healthy_disks,
            capacity: Some(pool.capacity()),
            slab_size: pool.slab_size(),
            vdisks: e.vdisks().len(),
            repair_needed_bytes: repair,
            lost_bytes: lost,
            jobs_running: self.jobs.running_on(name),
            warnings: self
                .thin_warning(&e)
                .into_iter()
                .chain((lost > 0).then(|| {
                    format!(
                        "DATA LOST: {} of the vdisks' data is lost beyond repair (rotten on its disk and on the parity at the same place): reads of it fail until the host writes it again (restore it from a backup or a replica)",
                        crate::units::format_size(lost)
                    )
                }))
                .chain(e.unreadable_vdisks().iter().map(|u| {
                    format!(
                        "vdisk id {} is left out, its data and space kept: {}; once that is put right, import the pool again",
                        u.id, u.error
                    )
                }))
                .chain(pool.meta().whole().err().map(|e| e.to_string()))
                .collect(),
            auto_repair: self.auto_repair.view(self.cfg.auto_repair, name),
            scrub: self.scrub_view(name, &e),
            scan_next_due: self.scan_due(&e, scan.as_ref(), false),
            scan,
            cache: disks
                .iter()
                .any(|d| d.info.usage == DiskUsage::Cache)
                .then(|| e.cache_status()),
            rados: self.rados_view(name),
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
                self.events.record(
                    NewEvent::new(
                        Severity::Warning,
                        "pool.thin_threshold",
                        format!(
                            "pool {name} is {pct}% allocated, past its thin provisioning threshold of {threshold}%: \
                             add a disk or free space before writes fail"
                        ),
                    )
                    .pool(&name),
                );
                for lun in self.targets.luns_of_pool(&name) {
                    lun.unit_attention(tessera_scsi::sense::THIN_PROVISIONING_SOFT_THRESHOLD_REACHED, None);
                }
            } else if pct + 5 < threshold && warned.remove(&name) {
                self.events.record(
                    NewEvent::new(
                        Severity::Info,
                        "pool.thin_threshold_cleared",
                        format!("pool {name} is back under its thin provisioning threshold ({pct}% allocated)"),
                    )
                    .pool(&name),
                );
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
                    disk_views(&e),
                    e.vdisks().iter().map(|v| vdisk_view(name, &e, v)).collect(),
                    unhealthy_sets(&e),
                    IoStatsView {
                        read_errors: ld(&s.read_errors),
                        write_errors: ld(&s.write_errors),
                        reconstructed_reads: ld(&s.reconstructed_reads),
                        repaired_blocks: ld(&s.repaired_blocks),
                        checksum_errors: ld(&s.checksum_errors),
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

    /// Pools in the state directory that are not imported: local ones (their metadata store is
    /// there) and pools on RADOS exported here (only where they live is there).
    pub fn importable(&self) -> ApiResult<Vec<ImportablePool>> {
        let dir = self.cfg.pools_dir();
        let rd = std::fs::read_dir(&dir).map_err(|e| ApiError::io(format!("cannot list {}: {e}", dir.display())))?;
        // A pool on RADOS that another gateway serves is imported here too, waiting.
        let on_rados: BTreeSet<String> = self.rados.lock().keys().cloned().collect();
        let pools = self.pools.read();
        let mut out = Vec::new();
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            // One being destroyed is neither.
            let imported = pools.contains_key(&name) || on_rados.contains(&name) || self.being_destroyed(&name);
            if !imported && (entry.path().join("meta").is_dir() || self.is_rados_pool(&name)) {
                out.push(ImportablePool {
                    name,
                    dir: entry.path().display().to_string(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub fn import_pool(&self, name: &str, rados: Option<&RadosPlacement>, without_log: bool) -> ApiResult<PoolSummary> {
        validate_name("pool", name).map_err(ApiError::invalid)?;
        if without_log && (rados.is_some() || self.is_rados_pool(name)) {
            return Err(ApiError::invalid(
                "a pool on RADOS has no write-back cache disks to import it without",
            ));
        }
        if let Some(r) = rados {
            self.check_rados_reach(r)?;
            let placement = crate::rados_pools::Placement::new(r).map_err(ApiError::invalid)?;
            return self.import_rados_pool(name, placement);
        }
        if self.is_rados_pool(name) && !self.pools.read().contains_key(name) {
            // Exported here before: its directory says where it lives.
            let recorded = crate::rados_pools::Placement::read(&self.pool_dir(name)).map_err(ApiError::invalid)?;
            if let Some(placement) = recorded {
                // Where it was recorded is asked again: the configuration may have changed.
                self.check_rados_reach(&RadosPlacement {
                    pool: placement.rados_pool.clone(),
                    ceph_conf: Some(placement.ceph_conf.clone()),
                    client_name: Some(placement.client_name.clone()),
                })?;
                return self.import_rados_pool(name, placement);
            }
        }
        let _admin = self.admin.lock();
        let store = self.pools.read().get(name).map(|e| e.pool().meta().whole());
        match store {
            // A pool on RADOS is opened again by its gateway.
            Some(Err(why)) if !self.is_rados_pool(name) => self.close_for_reopening(name, &why.to_string())?,
            Some(_) => return Err(ApiError::exists(format!("pool '{name}' is already imported"))),
            None => {}
        }
        let dir = self.pool_dir(name);
        if !dir.join("meta").is_dir() {
            return Err(ApiError::not_found(format!(
                "there is no pool '{name}' in {}; 'tessera pool import' lists the pools that can be imported",
                self.cfg.pools_dir().display()
            )));
        }
        let options = tessera_volume::ImportOptions {
            without_log,
            ..Default::default()
        };
        let engine = Engine::open_with_options(&dir, &|p| open_disk(p), options).inspect_err(|e| {
            // Listed unavailable (at start, or closed to be opened again): now for this.
            if let Some(why) = self.unavailable.write().get_mut(name) {
                *why = e.to_string();
            }
        })?;
        // Recorded before it is served: an import that cannot be recorded is not served
        // (nothing, not a scrub nor a repair, has started on it), and the engine closes here.
        self.record_imported_with(name).map_err(ApiError::io)?;
        self.pools.write().insert(name.to_string(), Arc::new(engine));
        self.unavailable.write().remove(name);
        self.changed("pool.imported", name, None, format!("pool {name} imported"));
        self.settle_replicas(name);
        self.present_missing();
        self.pool_summary(name)
    }

    /// Stops serving pool `name` here: it is listed as unavailable for `why` before it leaves
    /// the served pools, so that `pool list` never misses it in between (while a pool handed
    /// over is checkpointed and given up in etcd, for one); then its LUNs, exports and copy
    /// tokens are withdrawn (their configuration stays). In that order: what presents the
    /// configured LUNs and exports that are missing (`present_missing`, after a replica's
    /// promotion, without the administration lock) resolves their vdisks among the served
    /// pools under the same lock as the withdrawal, so it either ran before it, and is undone
    /// by it, or after, and no longer finds the pool. Returns its engine, if it was served.
    pub(super) fn stop_serving(&self, name: &str, why: String) -> Option<Arc<Engine>> {
        self.unavailable.write().insert(name.to_string(), why);
        let engine = self.pools.write().remove(name);
        self.targets.withdraw_served(name);
        self.nbd.withdraw_pool(name);
        self.targets.copy.revoke_pool(name);
        engine
    }

    /// Stops serving a local pool whose metadata store failed a change of unknown outcome, so
    /// that an import opens it again from its records, as a restart of the daemon would,
    /// without stopping the other pools: its LUNs and exports are withdrawn (their
    /// configuration kept: the import presents them again), it is listed as unavailable, and
    /// its engine closed once the requests in flight let go of it and its vdisks. Refused
    /// while a job runs on it; when something still holds it after a while, it is served
    /// again as it was, and the refusal says what holds it.
    fn close_for_reopening(&self, name: &str, why: &str) -> ApiResult<()> {
        let jobs = self.jobs.running_on(name);
        if !jobs.is_empty() {
            return Err(ApiError::busy(format!(
                "cannot open pool '{name}' again: job(s) {jobs:?} are running on it; cancel them first"
            )));
        }
        warn!(pool = %name, why, "opening the pool again from its records");
        let Some(mut engine) = self.stop_serving(name, format!("being opened again: {why}")) else {
            return Ok(());
        };
        // Until none is left holding a vdisk (its records would stay open, and the opening
        // fail), nor the engine (a job started before it left the served pools).
        let mut held = Vec::new();
        for _ in 0..500 {
            held = engine.vdisks_held_elsewhere();
            if held.is_empty() && self.jobs.running_on(name).is_empty() {
                match Arc::try_unwrap(engine) {
                    Ok(e) => {
                        drop(e);
                        return Ok(());
                    }
                    Err(back) => engine = back,
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Served again as it was: still refusing changes, its LUNs and exports back.
        self.pools.write().insert(name.to_string(), engine);
        self.unavailable.write().remove(name);
        self.present_missing();
        let what = match held.is_empty() {
            true => "requests in flight or a job still hold it".to_string(),
            false => format!(
                "vdisk(s) {} are still held, by a request in flight or by a connection to an NBD \
                 export of them (one in the middle of a request holds its vdisk until its client \
                 goes on or disconnects)",
                held.iter()
                    .map(|v| format!("{name}/{v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        Err(ApiError::busy(format!(
            "cannot open pool '{name}' again: {what}; it is served as before, and 'tessera pool import {name}' tries again"
        )))
    }

    /// Presents the LUNs and NBD exports configured whose vdisks are served and that are not
    /// presented yet (those of a pool served again).
    fn present_missing(&self) {
        self.targets.present_missing(&|vd| self.resolve_lun(vd));
        self.nbd
            .present_missing(&|vd| self.served_vdisk(vd), &|vd| self.may_export_writable(vd));
    }

    /// Whether pool `name` is being destroyed here (`destroy_rados_pool`), or its
    /// destruction is to be finished here (`destroys.rs`).
    fn being_destroyed(&self, name: &str) -> bool {
        // One lock at a time (the temporary guard of the first would last the expression).
        let going = self.destroying.lock().contains(name);
        going || self.destroy_unfinished(name)
    }

    /// Refuses pool `name` while it is being destroyed here.
    pub(super) fn not_being_destroyed(&self, name: &str) -> ApiResult<()> {
        if self.being_destroyed(name) {
            return Err(ApiError::busy(format!(
                "pool '{name}' is being destroyed here, and its name is free once that ends (the events say \
                 when, and 'tessera pool list' what holds it up){}",
                match self.destroy_unfinished(name) {
                    true => format!(
                        "; 'tessera pool destroy {name} --abandon' abandons its destruction, leaving what is left of it in the cluster"
                    ),
                    false => String::new(),
                }
            )));
        }
        Ok(())
    }

    /// Takes a pool out of the map for export or destroy; refused while a job or a request
    /// still uses it.
    fn take_pool(&self, name: &str, what: &str) -> ApiResult<Engine> {
        self.not_being_destroyed(name)?;
        // No LUN, export nor image job takes one of its vdisks between the questions below and
        // its leaving the served pools (from then on, none finds it).
        let _users = self.users.lock();
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
        // Requests in flight hold the engine, or one of its vdisks (a connection to an export
        // removed a moment ago, a copy), for a moment; give them that moment. A vdisk held
        // would go on being written after the pool has left this daemon.
        let mut arc = arc;
        let mut held = Vec::new();
        for _ in 0..100 {
            held = arc.vdisks_held_elsewhere();
            if held.is_empty() {
                match Arc::try_unwrap(arc) {
                    Ok(e) => return Ok(e),
                    Err(back) => arc = back,
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.pools.write().insert(name.to_string(), arc);
        Err(ApiError::busy(match held.is_empty() {
            true => format!(
                "pool '{name}' is in use (by a request in flight, or a background check that waits for its storage); try again"
            ),
            false => format!(
                "cannot {what} pool '{name}': vdisk(s) {} are still held by a request in flight; try again",
                held.iter()
                    .map(|v| format!("{name}/{v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }))
    }

    pub fn export_pool(&self, name: &str) -> ApiResult<()> {
        // Held to the end: an import of the name meanwhile would have its marks in etcd
        // (asking for the pool, presenting its LUNs) taken back by the end of this export.
        let _admin = self.admin.lock();
        if self.unavailable.write().remove(name).is_some() {
            // Never imported: forgetting it is all an export means.
            self.forget_rados_pool(name)?;
            return self.persist();
        }
        let e = self.take_pool(name, "export")?;
        if let Err(err) = e.quiesce() {
            // Nothing is marked yet: the pool stays served as it was.
            self.pools.write().insert(name.to_string(), Arc::new(e));
            return Err(err.into());
        }
        if let Err(err) = e.export() {
            self.unavailable
                .write()
                .insert(name.to_string(), format!("its export failed half way: {err}; 'tessera pool import {name}' serves it again, 'tessera pool export {name}' forgets it here"));
            return Err(err.into());
        }
        self.persist()?;
        // On RADOS: another gateway may take it from now on.
        self.forget_rados_pool(name)?;
        self.changed("pool.exported", name, None, format!("pool {name} exported"));
        Ok(())
    }

    pub fn destroy_pool(&self, name: &str) -> ApiResult<()> {
        let admin = self.admin.lock();
        let e = self.take_pool(name, "destroy")?;
        let vdisks: Vec<String> = e.vdisks().iter().map(|v| v.name()).collect();
        if !vdisks.is_empty() {
            self.pools.write().insert(name.to_string(), Arc::new(e));
            return Err(ApiError::busy(format!(
                "pool '{name}' still holds vdisk(s) {}; delete them first ('tessera vdisk delete {name}/NAME')",
                vdisks.join(", ")
            )));
        }
        if self.rados.lock().contains_key(name) {
            return self.destroy_rados_pool(name, e, admin);
        }
        if let Err(err) = e.destroy() {
            // Listed, not lost: the operator sees what is left of it.
            let dir = self.pool_dir(name);
            self.unavailable.write().insert(
                name.to_string(),
                format!(
                    "its destruction failed half way: {err}; what is left of it is in {} ('tessera pool export {name}' forgets it here)",
                    dir.display()
                ),
            );
            return Err(err.into());
        }
        self.persist()?;
        self.pool_destroyed(name, format!("pool {name} destroyed"));
        Ok(())
    }

    /// Says that pool `name` is destroyed, and forgets what was kept of it beside its
    /// directory.
    pub(super) fn pool_destroyed(&self, name: &str, message: String) {
        if let Err(err) = self.auto_repair.forget(name) {
            warn!(pool = name, error = %err, "cannot forget the destroyed pool's automatic repair setting");
        }
        self.changed("pool.destroyed", name, None, message);
    }

    /// Destroys pool `name` on RADOS, taken from the served pools (`e`, holding no vdisk)
    /// under the admin lock (`admin`). Its labels and objects are removed in the cluster
    /// without that lock, which takings of other pools wait for: minutes for a large pool.
    /// Meanwhile its name is refused to a create or an import, and its ownership is held,
    /// so that neither a pool of the name nor another gateway comes between. Marked in its
    /// directory before anything of it is wiped: a destruction that a stop or the cluster
    /// cuts short is finished in the background (`destroys.rs`).
    fn destroy_rados_pool(&self, name: &str, e: Engine, admin: parking_lot::MutexGuard<'_, ()>) -> ApiResult<()> {
        let dir = self.pool_dir(name);
        let Some(capacity) = e.pool().disks().first().map(|d| d.info.size) else {
            self.pools.write().insert(name.to_string(), Arc::new(e));
            return Err(ApiError::internal(format!(
                "pool {name} on RADOS has no disk in the cluster"
            )));
        };
        let mark = destroys::DestroyMark {
            pool_id: e.pool().id(),
            capacity,
            // Owned here, as every pool on RADOS served here is; if not, no later owner is
            // trusted to have fenced its connections off.
            epoch: self.rados.lock().get(name).and_then(|p| p.epoch()).unwrap_or(i64::MAX),
        };
        // Marked, then no longer imported here; if either cannot be recorded, nothing is
        // destroyed.
        let recorded = mark.write(&dir).map_err(ApiError::internal).and_then(|()| {
            self.persist().map_err(|err| match destroys::DestroyMark::clear(&dir) {
                Ok(()) => err,
                // Left, the mark would have the next start take the pool from service.
                Err(e) => ApiError::io(format!(
                    "{}; and {e}: remove it before the daemon starts again, or the pool is no longer imported then",
                    err.message
                )),
            })
        });
        if let Err(err) = recorded {
            self.pools.write().insert(name.to_string(), Arc::new(e));
            return Err(err);
        }
        // Marked first: `pool import` lists it until it leaves `rados`.
        let _marked = DestroyingMark::new(&self.destroying, name);
        let Some(left) = self.leave_rados_pool(name) else {
            unreachable!("a pool on RADOS under the admin lock");
        };
        let placement = left.placement().clone();
        drop(admin);
        info!(
            pool = name,
            "destroying the pool: its objects are removed from the cluster"
        );
        // Its objects go only once its labels went: a pool half removed is never opened.
        let outcome = match e.destroy() {
            Err(err) => self
                .end_rados_pool(name, left, None)
                .and(Err(ApiError::internal(format!(
                    "its labels may not have been wiped ({err})"
                )))),
            Ok(()) => self.end_rados_pool(name, left, Some(capacity)),
        };
        match &outcome {
            Ok(()) => {
                self.pool_destroyed(name, format!("pool {name} destroyed"));
                outcome
            }
            Err(err) => {
                warn!(pool = name, error = %err, "the pool's destruction failed half way; it is finished in the background");
                let state = format!("it failed half way ({})", err.message);
                self.finish_later(name, placement, mark, destroys::RETRY_FIRST, state);
                Err(ApiError::unavailable(format!(
                    "pool {name} is no longer imported here, and its destruction could not finish now: {}; \
                     this gateway goes on with it in the background and its name is refused here until then \
                     (if its labels were never wiped, the pool is left as it was, for 'tessera pool import {name}'; \
                     the events say which)",
                    err.message
                )))
            }
        }
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
        let opts = RebuildOptions {
            parallel: req.parallel.unwrap_or(4),
            rate_limit: req.rate_limit,
        };
        self.spawn_repair(name, e, opts, false)
    }

    /// The daemon's own repair when all there is to do is resync the members a disk back
    /// missed while it was away: the members of disks still missing wait for their delay.
    pub(crate) fn resync_stale_members(&self, name: &str) -> ApiResult<JobView> {
        let e = self.engine(name)?;
        self.spawn_repair(name, e, RebuildOptions::default(), true)
    }

    fn spawn_repair(&self, name: &str, e: Arc<Engine>, opts: RebuildOptions, stale_only: bool) -> ApiResult<JobView> {
        if let Some(j) = self.jobs.running("repair", name) {
            return Err(ApiError::busy(format!(
                "a repair of pool '{name}' is already running as job {j}"
            )));
        }
        let job = self.jobs.spawn("repair", name, move |p| {
            let r = if stale_only {
                e.resync_stale(&opts, p)
            } else {
                e.repair(&opts, p)
            }
            .map_err(|e| e.to_string())?;
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

    /// Switches the daemon's own repairs of a pool on or off.
    pub fn set_auto_repair(&self, name: &str, req: SetAutoRepair) -> ApiResult<PoolSummary> {
        self.engine(name)?;
        self.auto_repair.set(name, req.enabled)?;
        info!(pool = name, enabled = req.enabled, "automatic repair switched");
        self.pool_summary(name)
    }

    pub fn check_pool(&self, name: &str) -> ApiResult<tessera_volume::CheckReport> {
        Ok(self.engine(name)?.check()?)
    }

    // ---- disks ----

    pub fn add_disk(&self, pool: &str, path: &str, spare: bool, usage: DiskUsage) -> ApiResult<DiskView> {
        if !Path::new(path).is_absolute() {
            return Err(ApiError::invalid(format!("disk path '{path}' must be absolute")));
        }
        let e = self.engine(pool)?;
        if self.is_rados_pool(pool) {
            return Err(ApiError::invalid(format!(
                "pool '{pool}' lives in Ceph RADOS, whose pool keeps its copies and its space: a disk of this machine would hold data (a cache disk, writes reported durable) that the other gateways cannot read when they take the pool over"
            )));
        }
        let dev = self.open_new_disk(path)?;
        let info = match (usage, spare) {
            (DiskUsage::Cache, true) => {
                return Err(ApiError::invalid(
                    "a cache disk cannot be a hot spare: a second cache disk is its spare",
                ))
            }
            (DiskUsage::Cache, false) => e.add_cache_disk(dev)?,
            (DiskUsage::Data, true) => e.pool().add_spare(dev)?,
            (DiskUsage::Data, false) => e.pool().add_disk(dev)?,
        };
        disk_views(&e)
            .into_iter()
            .find(|d| d.id == info.id.to_string())
            .ok_or_else(|| ApiError::internal("the added disk is not listed"))
    }

    pub fn set_disk(&self, pool: &str, disk: &str, action: &str) -> ApiResult<DiskView> {
        let e = self.engine(pool)?;
        let pos = e.pool().find_disk(disk)?;
        match action {
            "fail" => e.fail_disk(disk)?,
            "retire" => e.retire_disk(disk)?,
            // Opened where the pool recorded it, as an import would.
            "online" => {
                let path = e.pool().disks()[pos as usize].info.path.clone();
                let dev = crate::daemon::open_disk(&path)
                    .map_err(|e| ApiError::invalid(format!("cannot open disk {path}: {e}")))?;
                e.bring_back_disk(disk, dev)?;
            }
            _ => {
                return Err(ApiError::not_found(format!(
                    "no disk action '{action}'; use fail, retire or online"
                )))
            }
        }
        warn!(pool, disk, action, "disk state changed by the administrator");
        // Told now, not at the next look: the disk's event and the pool's.
        self.health_events_tick();
        disk_views(&e)
            .into_iter()
            .find(|d| d.position == pos)
            .ok_or_else(|| ApiError::internal("the disk is not listed"))
    }
}

/// Every disk of a pool, with what its reads have cost since the pool was imported.
fn disk_views(e: &Engine) -> Vec<DiskView> {
    let errors = e.layouts().disk_errors();
    e.pool()
        .disks()
        .into_iter()
        .map(|d| {
            let position = d.info.position;
            let mut v = DiskView::from(d);
            v.io = e.pool().disk_io(position).map(|io| DiskIoView::of(&io));
            if let Some(n) = errors.get(&position) {
                v.errors = DiskErrorsView {
                    read: n.read,
                    checksum: n.checksum,
                    repaired_bytes: n.repaired_bytes,
                };
            }
            v
        })
        .collect()
}

/// The pool's health and the bytes its repair would rebuild or move. A failed or retired disk
/// that holds nothing any more does not make the pool degraded: every slab set has its full
/// redundancy.
pub(crate) fn pool_health(e: &Engine) -> (PoolHealth, u64) {
    let (_, repair) = e.layouts().repair_needed();
    let sets = unhealthy_sets(e);
    let health = if sets.iter().any(|s| s.state == "failed") {
        PoolHealth::Failed
    } else if !sets.is_empty() || repair > 0 {
        PoolHealth::Degraded
    } else {
        PoolHealth::Healthy
    };
    (health, repair)
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
            per_column: h.per_column,
        })
        .collect()
}

/// Pool `name` marked as being destroyed in the daemon's set until dropped, however the
/// destruction ends (a panic too): a name left marked would be refused until a restart.
struct DestroyingMark<'a> {
    set: &'a parking_lot::Mutex<BTreeSet<String>>,
    name: String,
}

impl<'a> DestroyingMark<'a> {
    fn new(set: &'a parking_lot::Mutex<BTreeSet<String>>, name: &str) -> DestroyingMark<'a> {
        set.lock().insert(name.to_string());
        DestroyingMark {
            set,
            name: name.to_string(),
        }
    }
}

impl Drop for DestroyingMark<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.name);
    }
}
