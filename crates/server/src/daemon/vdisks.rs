//! Vdisks and their snapshots, clones and images, as the API shows them.

use super::*;

impl Daemon {
    pub fn create_vdisk(&self, pool: &str, req: CreateVdisk) -> ApiResult<VdiskView> {
        let e = self.engine(pool)?;
        let spec = vdisk_spec(&e, req);
        let v = e.create_vdisk(&spec)?;
        let view = vdisk_view(pool, &e, &v);
        self.changed(
            "vdisk.created",
            pool,
            Some(format!("{pool}/{}", view.name)),
            format!(
                "vdisk {pool}/{} created: {}, {}",
                view.name,
                crate::units::format_size(view.size),
                view.layout_description
            ),
        );
        Ok(view)
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
        // A clone of a replica's working copy taken while a cycle writes it would keep two
        // cycles' data mixed for good.
        let (v, stats) = self.with_replica_at_rest(pool, src, "cloned", || Ok(e.clone_vdisk(src, &req.name)?))?;
        self.changed(
            "vdisk.cloned",
            pool,
            Some(format!("{pool}/{}", req.name)),
            format!(
                "vdisk {pool}/{} cloned from {src}: {} shared, {} copied",
                req.name,
                crate::units::format_size(stats.shared_bytes),
                crate::units::format_size(stats.copied_bytes)
            ),
        );
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
        self.refuse_if_replica(pool, vdisk, "snapshotted by hand (its cycles take its snapshots)")?;
        let started = std::time::Instant::now();
        let s = e.snapshot(vdisk, &req.name)?;
        self.changed(
            "snapshot.created",
            pool,
            Some(format!("{pool}/{vdisk}@{}", req.name)),
            format!(
                "snapshot {pool}/{vdisk}@{} taken in {} ms",
                req.name,
                started.elapsed().as_millis()
            ),
        );
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
        self.refuse_if_replica(pool, name, "resized (it takes its source's size)")?;
        e.resize_vdisk(name, size)?;
        // Initiators learn of the new capacity through a unit attention.
        for l in self.targets.luns_of(&format!("{pool}/{name}")) {
            l.capacity_changed();
        }
        self.show_vdisk(pool, name)
    }

    pub fn set_write_cache(&self, pool: &str, name: &str, size: u64) -> ApiResult<VdiskView> {
        let (e, v) = self.vdisk(pool, name)?;
        if v.is_snapshot() {
            return Err(ApiError::invalid(format!("'{name}' is a snapshot: it takes no writes")));
        }
        e.set_write_cache(name, size)?;
        self.show_vdisk(pool, name)
    }

    pub fn delete_vdisk(&self, pool: &str, name: &str) -> ApiResult<()> {
        let (e, _) = self.vdisk(pool, name)?;
        self.refuse_if_replica(pool, name, "deleted while its source keeps it")?;
        if let Some(r) = self.replicas_of(pool, name).first() {
            return Err(ApiError::busy(format!(
                "vdisk '{pool}/{name}' is replicated as '{r}'; 'tessera replica delete {r}' first"
            )));
        }
        let target = format!("{pool}/{name}");
        // No LUN, export nor job takes it between the questions below and its delete.
        let _users = self.users.lock();
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
        // ODX tokens of its data end with it (and give its grains back).
        self.targets.copy.revoke_vdisk(pool, name);
        e.delete_vdisk(name)?;
        let (kind, what) = if name.contains('@') {
            ("snapshot.deleted", "snapshot")
        } else {
            ("vdisk.deleted", "vdisk")
        };
        self.changed(kind, pool, Some(target.clone()), format!("{what} {target} deleted"));
        // A vdisk made later under this name starts its counters from zero.
        self.io_metrics.forget_vdisk(pool, name);
        Ok(())
    }

    pub fn import_image(&self, pool: &str, name: &str, req: ImportImage) -> ApiResult<JobView> {
        let e = self.engine(pool)?;
        let path = PathBuf::from(&req.path);
        if !path.is_absolute() {
            return Err(ApiError::invalid(format!("image path '{}' must be absolute", req.path)));
        }
        self.refuse_if_replica(pool, name, "imported into")?;
        // The daemon's own files (keys, pools' metadata) are never read into a vdisk, whatever
        // link leads to them, nor anything outside `data_paths` where they are configured:
        // found and checked before it is opened for reading, and opened through what was
        // found. The file checked is the one read: the job takes it, not the path again.
        let found = self
            .data_paths()
            .locate(&path, DataUse::Image)
            .map_err(ApiError::invalid)?;
        let opened = std::fs::File::open(crate::data_paths::through(&found))
            .map_err(|e| ApiError::invalid(format!("cannot open {}: {e}", req.path)))?;
        let image_size = image::size_of(&opened, &path).map_err(ApiError::invalid)?;
        // The busy check, the vdisk's making and the job's start are one step for a delete or
        // another import of it.
        let _users = self.users.lock();
        self.busy_vdisk_check(pool, name)?;
        let (v, made) = match e.vdisk(name) {
            Ok(v) => (v, false),
            Err(_) => {
                let Some(mut c) = req.create else {
                    return Err(ApiError::not_found(format!(
                        "pool '{pool}' has no vdisk '{name}'; create it first, or import with a layout to create it"
                    )));
                };
                c.name = name.to_string();
                // Everything that can refuse the import is asked before the vdisk is made: a
                // refused import leaves nothing behind (a fixed vdisk would hold its space).
                let bs = c.block_size.unwrap_or(512) as u64;
                if bs == 0 {
                    return Err(ApiError::invalid("a block size of 0 bytes cannot hold an image"));
                }
                if c.size == 0 {
                    c.size = image_size.div_ceil(bs).max(1) * bs;
                }
                if image_size > c.size {
                    return Err(ApiError::invalid(format!(
                        "the image {} ({image_size} bytes) is larger than the size asked for vdisk '{pool}/{name}' ({} bytes); \
                         leave the size out to take the image's",
                        req.path, c.size
                    )));
                }
                (e.create_vdisk(&vdisk_spec(&e, c))?, true)
            }
        };
        // Asked again once the vdisk is found: a peer's first cycle may have made it, a
        // replica, since the first look (its record comes before the vdisk).
        if let Err(refused) = self.refuse_if_replica(pool, name, "imported into") {
            if made {
                // Ours, never used: nothing may have been presented from it under the lock.
                if let Err(err) = e.delete_vdisk(name) {
                    warn!(vdisk = %format!("{pool}/{name}"), error = %err, "cannot delete the vdisk made for a refused import");
                }
            }
            return Err(refused);
        }
        if v.is_snapshot() {
            return Err(ApiError::invalid(format!(
                "'{pool}/{name}' is a snapshot: it takes no writes; import into a vdisk"
            )));
        }
        if image_size > v.size() {
            return Err(ApiError::invalid(format!(
                "the image {} ({image_size} bytes) is larger than vdisk '{pool}/{name}' ({} bytes); grow the vdisk first",
                req.path,
                v.size()
            )));
        }
        let job = self.jobs.spawn("import", &format!("{pool}/{name}"), move |p| {
            let r = image::import(&v, opened, &path, p)?;
            Ok(serde_json::to_value(r).expect("serializable"))
        });
        if made {
            self.changed(
                "vdisk.created",
                pool,
                Some(format!("{pool}/{name}")),
                format!("vdisk {pool}/{name} created to import {}", req.path),
            );
        }
        Ok(job.view())
    }

    pub fn export_image(&self, pool: &str, name: &str, req: ExportImage) -> ApiResult<JobView> {
        // Found and its job started as one step for a delete of it.
        let _users = self.users.lock();
        let (_, v) = self.vdisk(pool, name)?;
        let path = PathBuf::from(&req.path);
        if !path.is_absolute() {
            return Err(ApiError::invalid(format!("image path '{}' must be absolute", req.path)));
        }
        if req.rate_limit == Some(0) {
            return Err(ApiError::invalid(
                "a rate limit of 0 would never finish; leave it out for no limit",
            ));
        }
        let rate = req.rate_limit;
        // The daemon's own files (pools' metadata, keys, configuration) are never a target, nor
        // anything outside `data_paths` where they are configured: checked on the file opened,
        // whatever link or directory leads there.
        // Started while no cycle writes a replica's working copy (and its file made only
        // then); a cycle then waits for it.
        let job = self.with_replica_at_rest(pool, name, "exported to an image", || {
            let file =
                image::create_target(&path, req.overwrite, v.size(), &self.data_paths()).map_err(ApiError::invalid)?;
            Ok(self.jobs.spawn("export", &format!("{pool}/{name}"), move |p| {
                let r = image::export(&v, file, &path, rate, p)?;
                Ok(serde_json::to_value(r).expect("serializable"))
            }))
        })?;
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
        physical_bytes: u.physical_bytes,
        saved_bytes: u.allocated_bytes - u.physical_bytes,
        dedup: !v.is_snapshot()
            && c.provisioning == tessera_volume::Provisioning::Thin
            && e.dedup_settings().covers(&c.name),
        snapshots: e.snapshots_of(&v.name()).len(),
        write_cache_size: c.write_cache(),
        cache_dirty_bytes: e.cache().dirty_bytes(c.id),
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
        .filter(|d| d.info.state == DiskState::Healthy && d.info.usage == tessera_volume::DiskUsage::Data)
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
    spec.write_cache_size = req.write_cache_size;
    spec
}
