//! The engine: one pool with its layouts, grain space and virtual disks. This is the library
//! face of the storage stack that the daemon and the protocol front ends use.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tessera_cache::{CacheStatus, WriteCache};
use tessera_disk::DiskRef;
use tessera_layout::{LayoutSpec, Layouts, Progress, RebuildOptions, RebuildReport};
use tessera_pool::{
    validate_name, DiskOpener, DiskState, DiskUsage, MetaBatch, MetaStore, Pool, CF_GRAINS, CF_GRAINSETS, CF_POOL,
    CF_VDISKS,
};
use tracing::{info, warn};

use crate::commit::Committer;
use crate::config::{physical_block_size, validate, VdiskConfig, VdiskSpec, VdiskState, DEFAULT_GRAIN};
use crate::dedup::DedupState;
use crate::error::{Result, VolumeError};
use crate::frozen_registry::FrozenRegistry;
use crate::grain_map::GrainMap;
use crate::hot_copies::HotCopies;
use crate::keys::{count_refs, parse_grain_key, parse_loc, vdisk_key};
use crate::locks::GrainLocks;
use crate::shared::Shared;
use crate::space::{Class, GrainSpace};
use crate::vdisk::{Vdisk, BATCH_GRAINS};

/// The engine owns the pool's vdisks by name; each vdisk holds only what vdisks share (the
/// pool, layouts, grain space, locks), which holds no vdisk, so nothing needs breaking by hand
/// when the engine goes.
pub struct Engine {
    s: Arc<Shared>,
    vdisks: RwLock<BTreeMap<String, Arc<Vdisk>>>,
    pub(crate) next_id: AtomicU64,
    /// Serializes changes to the set of vdisks (create, delete, resize).
    admin: Mutex<()>,
    /// Held by the scrub running, if any: one at a time, or their saved positions would mix.
    pub(crate) scrubbing: Mutex<()>,
    /// Held by the metadata scan or spot-fix running, if any: a spot-fix acts on one scan's
    /// findings, so neither may run while the other writes them.
    pub(crate) metadata_job: Mutex<()>,
    /// Dedup settings, fingerprint index and the run under way.
    pub(crate) dedup: DedupState,
    /// Vdisk records the import could not read: those vdisks are left out.
    unreadable: Vec<UnreadableVdisk>,
}

/// Where the next vdisk id is kept (in the pool's own column family).
const NEXT_VDISK_ID_KEY: &[u8] = b"next_vdisk_id";

/// A vdisk left out of the import: its id (its record's key) and why (its record cannot be
/// read, or another vdisk has its name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableVdisk {
    pub id: u64,
    pub error: String,
}

/// The vdisk record `v` kept under id `id`, or why it cannot be read: not JSON of a record,
/// another id, or values no vdisk is made with (a grain of 0 bytes would be divided by),
/// which are as unreadable as a record cut short. The import and the metadata scan read
/// records through this alone, so that they agree on which vdisks are left out.
pub(crate) fn vdisk_record(id: u64, v: &[u8]) -> std::result::Result<VdiskConfig, String> {
    let c = serde_json::from_slice::<VdiskConfig>(v).map_err(|e| e.to_string())?;
    if c.id != id {
        return Err("its id differs from its key's".to_string());
    }
    validate(c.size, c.block_size, c.grain_size, &c.layout)
        .and_then(|()| physical_block_size(c.block_size, Some(c.physical_block_size)))
        .map_err(|e| format!("it holds values no vdisk has: {e}"))?;
    Ok(c)
}

/// Every vdisk record of the pool, in id order (those being deleted included), and those
/// that cannot be read. Such a vdisk is left out, not the pool: its grains and the space
/// they hold are kept, the rest is served, and the record put right brings it back.
fn vdisk_records(meta: &MetaStore) -> Result<(Vec<VdiskConfig>, Vec<UnreadableVdisk>)> {
    let (mut configs, mut unreadable) = (Vec::new(), Vec::new());
    meta.for_each_prefix(CF_VDISKS, &[], |k, v| {
        let Ok(id) = <[u8; 8]>::try_from(k).map(u64::from_be_bytes) else {
            warn!(key = %tessera_pool::hex(k), "a vdisk record under a key of the wrong length names no vdisk; left alone");
            return Ok(());
        };
        match vdisk_record(id, v) {
            Ok(c) => configs.push(c),
            Err(error) => unreadable.push(UnreadableVdisk {
                id,
                error: format!("its record cannot be read ({error})"),
            }),
        }
        Ok(())
    })?;
    Ok((configs, unreadable))
}

/// Two vdisks of one name (a record put back after a vdisk was made under its name while it
/// was left out): the one made last keeps the name, which the hosts used meanwhile; the
/// others are left out as an unreadable record's vdisk is, their grains and space kept.
fn same_names_left_out(configs: &mut Vec<VdiskConfig>, unreadable: &mut Vec<UnreadableVdisk>) {
    let mut newest: HashMap<String, u64> = HashMap::new();
    for c in configs.iter().filter(|c| c.state == VdiskState::Online) {
        let id = newest.entry(c.name.clone()).or_insert(c.id);
        *id = (*id).max(c.id);
    }
    configs.retain(|c| {
        let keeps = c.state != VdiskState::Online || newest[&c.name] == c.id;
        if !keeps {
            let error = format!(
                "its name '{}' is that of vdisk id {} too, made later, which keeps it; delete that one to have this one back",
                c.name, newest[&c.name]
            );
            unreadable.push(UnreadableVdisk { id: c.id, error });
        }
        keeps
    });
}

/// Drops grain map entries of vdisks that have no record (left by a write that raced a delete
/// before deletes waited for writes), with the references they held, so that their space
/// comes back and no vdisk made later can ever be shown their data.
fn purge_orphan_grains(meta: &MetaStore) -> Result<()> {
    let mut ids = std::collections::HashSet::new();
    meta.for_each_prefix(CF_VDISKS, &[], |k, _| {
        if let Ok(k) = <[u8; 8]>::try_from(k) {
            ids.insert(u64::from_be_bytes(k));
        }
        Ok(())
    })?;
    let mut b = MetaBatch::new();
    let mut orphans = 0u64;
    meta.for_each_prefix(CF_GRAINS, &[], |k, v| {
        if let (Some((id, _)), Some(l)) = (parse_grain_key(k), parse_loc(v)) {
            if !ids.contains(&id) {
                b.delete(CF_GRAINS, k);
                count_refs(&mut b, l, -1);
                orphans += 1;
            }
        }
        Ok(())
    })?;
    if orphans > 0 {
        warn!(grains = orphans, "dropping grain map entries of deleted vdisks");
        meta.commit(b, true)?;
    }
    Ok(())
}

impl Engine {
    /// Creates a pool in `dir` on blank disks and opens an engine on it.
    pub fn create_pool(dir: &Path, name: &str, disks: Vec<DiskRef>, slab_size: u64) -> Result<Engine> {
        Self::open_pool(Pool::create(dir, name, disks, slab_size)?)
    }

    /// Creates a pool as [`create_pool`](Self::create_pool) does, its metadata kept by `meta`
    /// instead of a RocksDB store in `dir`, with block checksums on or off (off for storage
    /// that checks its own reads, whose pool another machine may open: the checksum pages
    /// stay in `dir`, beside one machine).
    pub fn create_pool_with_meta(
        dir: &Path,
        name: &str,
        disks: Vec<DiskRef>,
        slab_size: u64,
        meta: MetaStore,
        checksums: bool,
    ) -> Result<Engine> {
        let pool = Pool::create_with_meta(dir, name, disks, slab_size, meta)?;
        if !checksums {
            pool.set_checksums(false)?;
        }
        Self::open_pool(pool)
    }

    /// Creates a pool as [`create_pool`](Self::create_pool) does, with block checksums on or
    /// off (off is for measuring what they cost; a pool without them cannot tell a rotten copy
    /// from a good one).
    pub fn create_pool_with_checksums(
        dir: &Path,
        name: &str,
        disks: Vec<DiskRef>,
        slab_size: u64,
        checksums: bool,
    ) -> Result<Engine> {
        let pool = Pool::create(dir, name, disks, slab_size)?;
        pool.set_checksums(checksums)?;
        Self::open_pool(pool)
    }

    /// Imports the pool in `dir`, opening its disks with `opener`, replays the stripe journal
    /// and loads every vdisk.
    pub fn open(dir: &Path, opener: DiskOpener) -> Result<Engine> {
        Self::open_with_options(dir, opener, tessera_pool::ImportOptions::default())
    }

    /// Imports the pool in `dir` as [`open`](Self::open) does, as `options` say (without its
    /// write-back cache disks, given up: `ImportOptions::without_log`).
    pub fn open_with_options(
        dir: &Path,
        opener: DiskOpener,
        mut options: tessera_pool::ImportOptions,
    ) -> Result<Engine> {
        let meta = MetaStore::open(&dir.join("meta"))?;
        options.log_disks = tessera_cache::log_disks(&meta)?;
        Self::open_pool(Pool::open_with_options(dir, opener, meta, options)?)
    }

    /// The vdisks (and snapshots) a pool's metadata records, read without opening the pool:
    /// what a gateway that does not own a shared pool presents of it (standby LUNs). A vdisk
    /// being deleted is left out.
    pub fn recorded_vdisks(meta: &MetaStore) -> Result<Vec<VdiskConfig>> {
        let (mut configs, mut left_out) = vdisk_records(meta)?;
        // The one an import would serve under each name.
        same_names_left_out(&mut configs, &mut left_out);
        configs.retain(|c| c.state != VdiskState::Deleting);
        Ok(configs)
    }

    /// Imports the pool as [`open`](Self::open) does, from the metadata in `meta`.
    pub fn open_with_meta(dir: &Path, opener: DiskOpener, meta: MetaStore) -> Result<Engine> {
        Self::open_pool(Pool::open_with_meta(dir, opener, meta)?)
    }

    fn open_pool(pool: Arc<Pool>) -> Result<Engine> {
        let layouts = Arc::new(Layouts::open(pool.clone())?);
        // Replayed and destaged before anything reads the layouts or frees a slab set.
        let cache = Arc::new(WriteCache::open(layouts.clone())?);
        let space = GrainSpace::new(cache.clone());
        let meta = pool.meta().clone();

        crate::records::mend_counts(&meta)?;
        purge_orphan_grains(&meta)?;
        let (all_configs, mut unreadable) = vdisk_records(&meta)?;
        let mut configs = all_configs.clone();
        same_names_left_out(&mut configs, &mut unreadable);
        for u in &unreadable {
            warn!(pool = %pool.name(), vdisk_id = u.id, why = %u.error, "a vdisk is left out (its grains and the space they hold are kept); the rest of the pool is served");
        }
        let counts = crate::records::load_counts(&meta)?;
        // Slab sets that hold grains; a set without a grain record was made by a crashed
        // allocation and holds nothing: give it back.
        // Every vdisk whose record reads, left out or not, says the size of the sets its grains
        // lie in.
        let mut grainsets = crate::records::load_grainsets(&meta, &all_configs, &counts)?;
        for set in layouts.sets() {
            match grainsets.remove(&set.id) {
                Some(g) => space.load_set(set.clone(), g, counts.get(&set.id).unwrap_or(&HashMap::new())),
                None => {
                    warn!(
                        set = set.id,
                        "slab set without grain record (interrupted allocation); freeing it"
                    );
                    layouts.free_set(set.id)?;
                }
            }
        }
        for (id, _) in grainsets {
            let mut b = MetaBatch::new();
            b.delete(CF_GRAINSETS, id.to_be_bytes());
            meta.commit(b, true)?;
        }

        let committer = Committer::new(cache.clone());
        let s = Arc::new(Shared {
            pool: pool.clone(),
            layouts,
            cache,
            space,
            committer,
            locks: GrainLocks::new(),
            frozen: FrozenRegistry::default(),
            hot: HotCopies::load(&meta)?,
        });
        let mut vdisks = BTreeMap::new();

        // An unreadable record's id is never given to a new vdisk: its grains are under it.
        let mut max_id = unreadable.iter().map(|u| u.id).max().unwrap_or(0);
        let mut deleting = Vec::new();
        for c in configs {
            max_id = max_id.max(c.id);
            let grains = c.grains();
            // Counted, not refused: what opened before opens again, whatever else is open.
            let map = GrainMap::loaded(grains, &|| format!("vdisk '{}' of {} bytes", c.name, c.size))?;
            let mut mapped = 0;
            let mut unreadable = 0u64;
            meta.for_each_prefix(CF_GRAINS, &c.id.to_be_bytes(), |k, v| {
                match (parse_grain_key(k), parse_loc(v)) {
                    (Some((_, g)), Some(l)) if g < grains => {
                        map[g as usize].store(l, Ordering::Relaxed);
                        mapped += 1;
                    }
                    (Some(_), None) => unreadable += 1,
                    // Past the end, or a key cut short (which names no grain): the scan
                    // names both.
                    _ => {}
                }
                Ok(())
            })?;
            if unreadable > 0 {
                warn!(vdisk = %c.name, records = unreadable, "grain map records that cannot be read: the grains they name read as zeros until written; 'tessera pool scan' names them");
            }
            let v = Arc::new(Vdisk::new(s.clone(), c.clone(), map, mapped));
            if c.state != VdiskState::Online {
                deleting.push(v);
                continue;
            }
            if c.provisioning == crate::config::Provisioning::Fixed {
                s.space.set_reserved(v.class, grains - mapped);
            }
            s.cache.set_budget(c.id, c.write_cache());
            vdisks.insert(c.name.clone(), v);
        }
        let stored_next = meta
            .get(CF_POOL, NEXT_VDISK_ID_KEY)?
            .and_then(|v| v.try_into().ok().map(u64::from_le_bytes))
            .unwrap_or(0);
        let engine = Engine {
            s,
            vdisks: RwLock::new(vdisks),
            // Saturating: an id at the top (a damaged key) leaves no id for a new vdisk,
            // which `create_vdisk` then says, rather than wrap around to ids in use.
            next_id: AtomicU64::new(max_id.saturating_add(1).max(stored_next)),
            admin: Mutex::new(()),
            scrubbing: Mutex::new(()),
            metadata_job: Mutex::new(()),
            dedup: DedupState::load(&meta)?,
            unreadable,
        };
        for v in deleting {
            info!(vdisk = %v.name(), "finishing an interrupted delete, or removing a half-made snapshot or clone");
            // Its reservation was not restored at open: nothing to give back.
            engine.finish_delete(&v, false)?;
        }
        Ok(engine)
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.s.pool
    }

    /// The vdisk records the import could not read (those vdisks are left out; their grains
    /// and space are kept).
    pub fn unreadable_vdisks(&self) -> &[UnreadableVdisk] {
        &self.unreadable
    }

    pub fn layouts(&self) -> &Arc<Layouts> {
        &self.s.layouts
    }

    /// The layout a spec resolves to with this pool's defaults.
    pub fn resolve_layout(&self, spec: &VdiskSpec) -> Result<LayoutSpec> {
        let healthy = self.s.pool.free_slabs().len();
        let l = LayoutSpec::with_defaults(spec.layout, spec.copies, spec.columns, spec.interleave, healthy);
        l.validate(self.s.pool.slab_size(), healthy)
            .map_err(|e| VolumeError::Invalid(tessera_layout::with_lost_disks(&self.s.pool, e)))?;
        Ok(l)
    }

    pub fn create_vdisk(&self, spec: &VdiskSpec) -> Result<Arc<Vdisk>> {
        validate_name("vdisk", &spec.name).map_err(VolumeError::Invalid)?;
        self.create_with(spec, None, VdiskState::Online)
    }

    /// Creates a vdisk record and its empty map. A snapshot or clone starts `Creating`, so
    /// that a restart before it is filled removes it.
    pub(crate) fn create_with(
        &self,
        spec: &VdiskSpec,
        snapshot_of: Option<String>,
        state: VdiskState,
    ) -> Result<Arc<Vdisk>> {
        let layout = self.resolve_layout(spec)?;
        let grain = spec
            .grain_size
            .or_else(|| self.default_grain_for(&spec.name))
            .unwrap_or(DEFAULT_GRAIN);
        let block_size = spec.block_size.unwrap_or(512);
        validate(spec.size, block_size, grain, &layout).map_err(VolumeError::Invalid)?;
        let physical_block_size =
            physical_block_size(block_size, spec.physical_block_size).map_err(VolumeError::Invalid)?;
        let _admin = self.admin.lock();
        if self.vdisks.read().contains_key(&spec.name) {
            return Err(VolumeError::Exists(spec.name.clone()));
        }
        let c = VdiskConfig {
            id: self
                .next_id
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_add(1))
                .map_err(|_| VolumeError::Invalid("every vdisk id of this pool has been used".into()))?,
            name: spec.name.clone(),
            size: spec.size,
            block_size,
            physical_block_size,
            grain_size: grain,
            layout,
            provisioning: spec.provisioning,
            state,
            snapshot_of,
            write_cache_size: spec.write_cache_size,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        let class = Class { layout, grain };
        let fixed = c.provisioning == crate::config::Provisioning::Fixed;
        if fixed {
            self.s.space.reserve(class, c.grains()).map_err(|e| match e {
                VolumeError::NoSpace(d) => VolumeError::NoSpace(format!(
                    "a fixed vdisk of {} bytes with a {} layout does not fit in pool '{}' ({d})",
                    c.size,
                    layout.describe(),
                    self.s.pool.name()
                )),
                e => e,
            })?;
        }
        // Made before anything is recorded: a map this machine cannot hold is refused here,
        // not at every start after.
        let map = match GrainMap::new(c.grains(), &|| format!("vdisk '{}' of {} bytes", c.name, c.size)) {
            Ok(map) => map,
            Err(e) => {
                if fixed {
                    self.s.space.unreserve(class, c.grains());
                }
                return Err(e);
            }
        };
        if let Err(e) = self.save_config(&c) {
            if fixed {
                self.s.space.unreserve(class, c.grains());
            }
            return Err(e);
        }
        let v = Arc::new(Vdisk::new(self.s.clone(), c.clone(), map, 0));
        self.s.cache.set_budget(c.id, c.write_cache());
        self.vdisks.write().insert(c.name.clone(), v.clone());
        info!(vdisk = %c.name, size = c.size, layout = %layout.describe(), "vdisk created");
        Ok(v)
    }

    /// Marks a vdisk made `Creating` as complete.
    pub(crate) fn set_online(&self, v: &Vdisk) -> Result<()> {
        let mut c = v.config();
        c.state = VdiskState::Online;
        self.save_config(&c)?;
        *v.cfg.write() = c;
        Ok(())
    }

    fn save_config(&self, c: &VdiskConfig) -> Result<()> {
        let meta = self.s.pool.meta();
        let mut b = MetaBatch::new();
        b.put(CF_VDISKS, vdisk_key(c.id), serde_json::to_vec(c).expect("serializable"));
        // Ids are never used twice, even after the vdisk that had the highest is deleted and
        // the pool reopened: whatever might remain keyed by an old id stays with it.
        b.put(
            CF_POOL,
            NEXT_VDISK_ID_KEY,
            c.id.saturating_add(1)
                .max(self.next_id.load(Ordering::SeqCst))
                .to_le_bytes(),
        );
        meta.commit(b, true)?;
        Ok(())
    }

    pub fn vdisk(&self, name: &str) -> Result<Arc<Vdisk>> {
        self.vdisks
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| VolumeError::NoSuchVdisk(name.to_string()))
    }

    pub fn vdisks(&self) -> Vec<Arc<Vdisk>> {
        self.vdisks.read().values().cloned().collect()
    }

    /// Vdisks something outside the engine still holds (a request in flight, a connection of
    /// an export withdrawn): the pool's records stay open while they do, even once the
    /// engine is dropped.
    pub fn vdisks_held_elsewhere(&self) -> Vec<String> {
        let held = self.vdisks.read();
        held.iter()
            .filter(|(_, v)| Arc::strong_count(v) > 1)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Grows a vdisk. Shrinking is refused: it would silently drop data.
    pub fn resize_vdisk(&self, name: &str, size: u64) -> Result<()> {
        let _admin = self.admin.lock();
        let v = self.vdisk(name)?;
        v.check_writable()?;
        let mut c = v.config();
        if size < c.size {
            return Err(VolumeError::Invalid(format!(
                "{name}: shrinking from {} to {size} bytes would drop data; only growing is supported",
                c.size
            )));
        }
        validate(size, c.block_size, c.grain_size, &c.layout).map_err(VolumeError::Invalid)?;
        let old_grains = c.grains();
        c.size = size;
        let added = c.grains() - old_grains;
        if v.fixed() && added > 0 {
            self.s.space.reserve(v.class, added)?;
        }
        let undo = |grown: bool| {
            if grown {
                v.map.write().shrink(old_grains);
            }
            if v.fixed() && added > 0 {
                self.s.space.unreserve(v.class, added);
            }
        };
        // The map grows before the size is recorded (refused if this machine cannot hold it);
        // its new entries are unused until then, and dropped again if that fails: a map
        // longer than the vdisk would count reserved grains it does not hold.
        if let Err(e) = v
            .map
            .write()
            .grow(added, &|| format!("vdisk '{name}' grown to {size} bytes"))
        {
            undo(false);
            return Err(e);
        }
        if let Err(e) = self.save_config(&c) {
            undo(true);
            return Err(e);
        }
        {
            v.clock.grow(size);
            *v.cfg.write() = c;
        }
        info!(vdisk = name, size, "vdisk grown");
        Ok(())
    }

    /// Deletes a vdisk and drops its references; grains nobody else shares go back to the pool.
    pub fn delete_vdisk(&self, name: &str) -> Result<()> {
        let v = {
            let _admin = self.admin.lock();
            let v = self.vdisk(name)?;
            let mut c = v.config();
            c.state = VdiskState::Deleting;
            self.save_config(&c)?;
            *v.cfg.write() = c;
            v.deleted.store(true, Ordering::Release);
            self.vdisks.write().remove(name);
            v
        };
        // A write that found the vdisk alive may still be under way: wait for every change in
        // flight (new ones see `deleted`), so that none maps a grain after the map is cleared.
        drop(v.gate.write());
        self.finish_delete(&v, true)
    }

    fn finish_delete(&self, v: &Vdisk, release_reservation: bool) -> Result<()> {
        let grains = v.map.read().len() as u64;
        // A fixed vdisk holds a reservation for exactly its unmapped grains.
        let reserved = grains - v.mapped.load(Ordering::Acquire);
        let mut g = 0;
        while g < grains {
            let chunk: Vec<u64> = (g..(g + BATCH_GRAINS * 8).min(grains))
                .filter(|&i| v.entry(i) != 0)
                .collect();
            for part in chunk.chunks(BATCH_GRAINS as usize) {
                v.unmap_grains(part, false)?;
            }
            g += BATCH_GRAINS * 8;
        }
        if v.fixed() && release_reservation {
            self.s.space.unreserve(v.class, reserved);
        }
        let meta = self.s.pool.meta();
        let mut b = MetaBatch::new();
        b.delete(CF_VDISKS, vdisk_key(v.id));
        crate::lun_state::delete_all(&mut b, v.id);
        meta.commit(b, true)?;
        self.s.space.reclaim_empty()?;
        info!(vdisk = %v.name(), "vdisk deleted");
        Ok(())
    }

    /// Sets how much of the write-back cache a vdisk may fill (0: its writes bypass it).
    pub fn set_write_cache(&self, name: &str, bytes: u64) -> Result<()> {
        let _admin = self.admin.lock();
        let v = self.vdisk(name)?;
        let mut c = v.config();
        c.write_cache_size = Some(bytes);
        self.save_config(&c)?;
        *v.cfg.write() = c;
        self.s.cache.set_budget(v.id, bytes);
        info!(vdisk = name, bytes, "write-back cache size set");
        Ok(())
    }

    /// The pool's write-back cache.
    pub fn cache(&self) -> &Arc<WriteCache> {
        &self.s.cache
    }

    pub fn cache_status(&self) -> CacheStatus {
        self.s.cache.status()
    }

    /// Bytes of data the pool's disks lost beyond repair that a grain still refers to: a
    /// slot freed since (its grains trimmed, deleted or written elsewhere) keeps its record
    /// until it is written again, and holds nobody's data.
    pub fn lost_bytes(&self) -> u64 {
        let mut total = 0;
        for set in self.s.layouts.sets() {
            let lost = set.lost_within(0, u64::MAX);
            if lost.is_empty() {
                continue;
            }
            let Some(slots) = self.s.space.slots(set.id) else {
                // A set that holds no grains: what it lost is lost.
                total += lost.iter().map(|(a, b)| b - a).sum::<u64>();
                continue;
            };
            let g = slots.class.grain;
            for (a, b) in lost {
                for slot in a / g..b.div_ceil(g) {
                    let used = slots
                        .refs
                        .get(slot as usize)
                        .is_some_and(|r| r.load(std::sync::atomic::Ordering::Acquire) > 0);
                    if used {
                        total += b.min((slot + 1) * g) - a.max(slot * g);
                    }
                }
            }
        }
        total
    }

    /// Adds a blank disk to hold the write-back log (it joins the log while the log has
    /// fewer than two copies).
    pub fn add_cache_disk(&self, dev: DiskRef) -> Result<tessera_pool::DiskInfo> {
        let info = self.s.pool.add_cache_disk(dev)?;
        self.s.cache.refresh_devices()?;
        Ok(info)
    }

    /// Makes every completed write of every vdisk durable.
    /// Every member disk is flushed too, even when the write-back log holds everything new:
    /// a disk that fails its flush is found now, not at the next destage.
    pub fn flush(&self) -> Result<()> {
        self.s.cache.flush()?;
        self.s.layouts.flush()?;
        self.s.pool.meta().sync()?;
        Ok(())
    }

    /// An administrative failure, for drills: the disk is never used again.
    pub fn fail_disk(&self, disk: &str) -> Result<()> {
        let pos = self.s.pool.find_disk(disk)?;
        self.s.layouts.record_stale_of_given_up(pos)?;
        self.s
            .pool
            .set_disk_state(pos, DiskState::Failed, Some("failed by the administrator".into()))?;
        if self.s.pool.disk_usage(pos) == DiskUsage::Cache {
            // The log goes on from its other copy, and onto another cache disk if there is one.
            self.s.cache.refresh_devices()?;
            return Ok(());
        }
        // Retire now the journal records of the writes the other members hold, so that a
        // crash after this answer leaves no region a restart without the disk cannot resync.
        self.s.layouts.member_lost();
        self.s.layouts.checkpoint()?;
        // Writes parked for a set that waited for this disk, missing, are lost with it.
        self.s.cache.settle_parked();
        Ok(())
    }

    /// Takes back, while the pool runs, a data disk that was missing when the pool was
    /// imported, or that an I/O error took out, now opened as `dev` (`Layouts::bring_back_disk`):
    /// current where no write went around it (nor, after an error, was written since its last
    /// flush), and stale (read around) elsewhere, until a repair resyncs it; a member that
    /// nothing could resync (of a set without redundancy, or a mirror whose other copies lack
    /// writes too) is taken as the disk holds it.
    pub fn bring_back_disk(&self, disk: &str, dev: DiskRef) -> Result<()> {
        let pos = self.s.pool.find_disk(disk)?;
        self.s.layouts.bring_back_disk(pos, dev)?;
        // What the write-back log kept for sets that waited for it goes to them now.
        let waiting = self.s.cache.settle_parked();
        if waiting > 0 {
            warn!(pool = %self.s.pool.name(), disk, bytes = waiting, "writes the write-back log kept for disks that were away still wait (their sets still lack disks, or their writes failed; tried again)");
        }
        Ok(())
    }

    /// Makes every completed write durable and leaves the stripe journal with nothing to
    /// replay (but regions still to be made consistent), as a clean stop should: a start
    /// that then finds a disk missing has no region it cannot resync.
    pub fn checkpoint(&self) -> Result<()> {
        self.s.cache.flush()?;
        self.s.layouts.checkpoint()?;
        self.s.pool.meta().sync()?;
        Ok(())
    }

    /// A clean stop's last word: every member's label and the configuration a generation on
    /// (`Pool::seal`), so that a copy of a disk taken until now is known as older.
    pub fn seal(&self) -> Result<()> {
        Ok(self.s.pool.seal()?)
    }

    /// Retiring a disk: still read, no new slabs; a repair moves its slabs away.
    pub fn retire_disk(&self, disk: &str) -> Result<()> {
        let pos = self.s.pool.find_disk(disk)?;
        self.s
            .pool
            .set_disk_state(pos, DiskState::Retired, Some("retired by the administrator".into()))?;
        if self.s.pool.disk_usage(pos) == DiskUsage::Cache {
            // It leaves the log; if it held the last copy, after the log is destaged.
            self.s.cache.refresh_devices()?;
        }
        Ok(())
    }

    /// Rebuilds every slab on a failed, missing or retired disk onto the others.
    pub fn repair(&self, opts: &RebuildOptions, progress: &Progress) -> Result<RebuildReport> {
        Ok(self.s.layouts.rebuild(opts, progress)?)
    }

    /// Only the part of a repair that resyncs, where they are, the members that missed
    /// writes while their disk was away (`Layouts::resync_stale`).
    pub fn resync_stale(&self, opts: &RebuildOptions, progress: &Progress) -> Result<RebuildReport> {
        Ok(self.s.layouts.resync_stale(opts, progress)?)
    }

    /// Drains the write-back cache into the layouts and checkpoints the metadata: what
    /// `export` does first. It may fail (a disk that refuses writes) with the engine whole,
    /// which an export that consumed the engine first could not give back.
    pub fn quiesce(&self) -> Result<()> {
        // The layouts hold everything then: the disks can move without their cache.
        self.s.cache.drain()?;
        self.checkpoint()?;
        Ok(())
    }

    /// Flushes everything and marks the pool cleanly exported.
    pub fn export(self) -> Result<()> {
        self.quiesce()?;
        // Nothing of the cache writes past this (a settle of parked writes): the disks may
        // be another host's once they say the pool was exported.
        self.s.cache.stop();
        self.s.pool.export()?;
        Ok(())
    }

    /// Destroys the pool: refused while a vdisk remains.
    pub fn destroy(self) -> Result<()> {
        let names: Vec<String> = self.vdisks.read().keys().cloned().collect();
        if !names.is_empty() {
            return Err(VolumeError::Invalid(format!(
                "pool '{}' still holds vdisk(s) {}; delete them first",
                self.s.pool.name(),
                names.join(", ")
            )));
        }
        let pool = self.s.pool.clone();
        drop(self);
        // The engine's other holders of the pool are gone with it.
        pool.destroy()?;
        Ok(())
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.s
    }
}
