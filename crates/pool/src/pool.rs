//! A pool: member disks with labels, their states, the slab allocator and the metadata store.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use tessera_disk::{
    read_label, rewrite_label, verify_label, wipe_label, write_new_label, DiskError, DiskRef, Label, LabelError,
    MeteredDisk, DATA_OFFSET,
};
use tracing::{info, warn};
use uuid::Uuid;

use crate::alloc::{choose_disks, SlabMap, SlabRef};
use crate::config::{validate_name, DiskInfo, DiskState, DiskUsage, PoolConfig, MIN_CACHE_AREA, MIN_SLAB_SIZE};
use crate::error::{PoolError, Result};
use crate::meta::{MetaBatch, MetaStore, CF_POOL};
use crate::write_marks::{flush_round, new_clock, FlushClock, WriteMark, WriteMarks};

const CONFIG_KEY: &[u8] = b"config";

/// Opens a member disk by the path recorded in the pool configuration.
pub type DiskOpener<'a> = &'a dyn Fn(&str) -> std::result::Result<DiskRef, DiskError>;

/// What `Pool::disks` reports for one member.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DiskStatus {
    #[serde(flatten)]
    pub info: DiskInfo,
    pub slabs_used: u32,
    pub used_bytes: u64,
    /// Why the disk is missing or failed, when known.
    pub problem: Option<String>,
}

/// Raw slab space of the healthy disks (copies and parity included).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Capacity {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// Free space on hot spares, kept for repairs: not in the figures above.
    #[serde(default)]
    pub spare_bytes: u64,
}

struct Member {
    dev: Option<DiskRef>,
    slabs: SlabMap,
    problem: Option<String>,
    /// The loss count (`Pool::losses`) at which this member was last failed or went missing
    /// while the pool ran; 0 if it never was (kept once it is back, `bring_back`).
    lost_at: u64,
    /// Which of its slabs its medium may lack writes of (`Pool::mark_write`).
    marks: Arc<WriteMarks>,
}

struct Inner {
    config: PoolConfig,
    members: Vec<Member>,
}

pub struct Pool {
    meta: Arc<MetaStore>,
    /// Held from a change of the configuration until it is saved, so that two changes are
    /// saved in the order they were made (each save writes the whole configuration: without
    /// it, the earlier change's copy could be saved last and undo the later one on disk).
    saving: parking_lot::Mutex<()>,
    /// The pool's directory: its metadata store and the layout's stripe journal live here.
    dir: PathBuf,
    inner: RwLock<Inner>,
    /// How many times a member was lost (failed or missing) since the pool was opened: a
    /// writer notes it before it writes, and a flush asks whether a member of what it wrote
    /// was lost after that (`lost_since`).
    losses: AtomicU64,
    /// Members of the pool are stale until resynced: every label says so (`set_resync_pending`).
    resync_pending: AtomicBool,
    /// The last labels written for that flag failed: some may not say it.
    labels_behind: AtomicBool,
    /// Numbers the flushes of every member ([`WriteMarks`]).
    clock: FlushClock,
    /// A disk's loss is in memory but its save failed (`lose_disk`).
    loss_unsaved: AtomicBool,
    /// The configuration's generation when the pool was opened (or created): a number no
    /// earlier opening had, which orders the flushes of different runs (`last_flush`).
    run: u64,
}

impl Inner {
    /// (position, free slabs) of every disk that may take a new slab: healthy and open.
    fn slab_candidates(&self, exclude: &[u32]) -> Vec<(u32, u32)> {
        self.config
            .disks
            .iter()
            .zip(&self.members)
            .filter(|(i, m)| {
                i.state == DiskState::Healthy
                    && i.usage == DiskUsage::Data
                    && m.dev.is_some()
                    && !exclude.contains(&i.position)
            })
            .map(|(i, m)| (i.position, m.slabs.free()))
            .collect()
    }

    /// (position, free slabs) of the hot spares a replacement slab may go to.
    fn spare_candidates(&self, exclude: &[u32]) -> Vec<(u32, u32)> {
        self.config
            .disks
            .iter()
            .zip(&self.members)
            .filter(|(i, m)| {
                i.state == DiskState::Spare
                    && i.usage == DiskUsage::Data
                    && m.dev.is_some()
                    && !exclude.contains(&i.position)
            })
            .map(|(i, m)| (i.position, m.slabs.free()))
            .collect()
    }
}

/// Whether a configuration read back is one a pool can have: a slab size it could be made
/// with, each disk at its own position (slab references index the disks by it), and no more
/// slabs on a disk than its size holds (each is a mark in memory, and a slab past the end
/// would be handed out).
fn sensible_config(config: &PoolConfig) -> std::result::Result<(), String> {
    if !config.slab_size.is_power_of_two() || config.slab_size < MIN_SLAB_SIZE {
        return Err(format!(
            "a slab size of {} bytes, which no pool has (a power of two of at least {MIN_SLAB_SIZE})",
            config.slab_size
        ));
    }
    for (i, d) in config.disks.iter().enumerate() {
        if d.position as usize != i {
            return Err(format!(
                "disk {} at position {}, in place {i} of the list",
                d.path, d.position
            ));
        }
        if d.slabs > slabs_on(d.size, config.slab_size) {
            return Err(format!(
                "{} slabs on disk {}, whose {} bytes hold {}",
                d.slabs,
                d.path,
                d.size,
                slabs_on(d.size, config.slab_size)
            ));
        }
    }
    Ok(())
}

fn slabs_on(size: u64, slab_size: u64) -> u32 {
    (size.saturating_sub(DATA_OFFSET) / slab_size).min(u32::MAX as u64) as u32
}

impl Pool {
    /// Creates a pool on blank disks, its metadata in a RocksDB store in `dir`. A disk that
    /// carries any label, valid or corrupt, is refused and left untouched.
    pub fn create(dir: &Path, name: &str, disks: Vec<DiskRef>, slab_size: u64) -> Result<Arc<Pool>> {
        Self::create_on(dir, name, disks, slab_size, None)
    }

    /// Creates a pool as [`create`](Self::create) does, its metadata in `meta`, which must
    /// hold no pool yet.
    pub fn create_with_meta(
        dir: &Path,
        name: &str,
        disks: Vec<DiskRef>,
        slab_size: u64,
        meta: MetaStore,
    ) -> Result<Arc<Pool>> {
        Self::create_on(dir, name, disks, slab_size, Some(meta))
    }

    fn create_on(
        dir: &Path,
        name: &str,
        disks: Vec<DiskRef>,
        slab_size: u64,
        meta: Option<MetaStore>,
    ) -> Result<Arc<Pool>> {
        validate_name("pool", name).map_err(PoolError::Invalid)?;
        if !slab_size.is_power_of_two() || slab_size < MIN_SLAB_SIZE {
            return Err(PoolError::Invalid(format!(
                "slab size {slab_size} must be a power of two of at least 1 MiB"
            )));
        }
        if disks.is_empty() {
            return Err(PoolError::Invalid("a pool needs at least one disk".into()));
        }
        for (i, d) in disks.iter().enumerate() {
            if slabs_on(d.size(), slab_size) == 0 {
                return Err(PoolError::Invalid(format!(
                    "{}: {} bytes is too small for one {} byte slab after the {} byte header",
                    d.path(),
                    d.size(),
                    slab_size,
                    DATA_OFFSET
                )));
            }
            if disks[..i].iter().any(|o| o.path() == d.path()) {
                return Err(PoolError::Invalid(format!("{} is listed twice", d.path())));
            }
            // Check every disk before writing any label, so a refusal changes nothing.
            match read_label(d.as_ref()) {
                Err(tessera_disk::LabelError::Missing { .. }) => {}
                Ok(l) => {
                    return Err(tessera_disk::LabelError::InUse {
                        path: d.path().to_string(),
                        pool_id: l.pool_id,
                        pool_name: l.pool_name,
                    }
                    .into())
                }
                Err(e) => return Err(e.into()),
            }
        }
        std::fs::create_dir_all(dir).map_err(|e| PoolError::Meta {
            path: dir.display().to_string(),
            message: format!("cannot create the pool directory: {e}"),
        })?;
        let local_meta = meta.is_none();
        let meta = Arc::new(match meta {
            None => MetaStore::create(&dir.join("meta"))?,
            Some(m) if m.get(CF_POOL, CONFIG_KEY)?.is_some() => {
                return Err(PoolError::Exists(format!(
                    "a pool in the metadata store at {}",
                    m.location()
                )))
            }
            Some(m) => m,
        });
        let mut config = PoolConfig {
            id: Uuid::new_v4(),
            name: name.to_string(),
            slab_size,
            disks: Vec::new(),
            generation: 1,
            checksums: true,
        };
        let mut members: Vec<Member> = Vec::new();
        let clock = new_clock();
        for (pos, d) in disks.into_iter().enumerate() {
            let info = DiskInfo {
                id: Uuid::new_v4(),
                position: pos as u32,
                path: d.path().to_string(),
                size: d.size(),
                slabs: slabs_on(d.size(), slab_size),
                state: DiskState::Healthy,
                usage: DiskUsage::Data,
                returns_as: None,
                left_at: None,
                stale_slabs: Vec::new(),
                back_after_error: false,
                flushed_through: None,
            };
            let label = label_for(&config, &info, false, false);
            if let Err(e) = write_new_label(d.as_ref(), &label) {
                // Undo the labels written so far: they name a pool that will not exist.
                for m in &members {
                    if let Some(dev) = &m.dev {
                        let _ = wipe_label(dev.as_ref(), config.id);
                    }
                }
                drop(meta);
                if local_meta {
                    let _ = std::fs::remove_dir_all(dir.join("meta"));
                }
                return Err(e.into());
            }
            members.push(Member {
                dev: Some(MeteredDisk::wrap(d)),
                slabs: SlabMap::new(info.slabs),
                problem: None,
                lost_at: 0,
                marks: WriteMarks::new(info.slabs, &clock),
            });
            config.disks.push(info);
        }
        let pool = Pool {
            meta,
            dir: dir.to_path_buf(),
            inner: RwLock::new(Inner { config, members }),
            saving: parking_lot::Mutex::new(()),
            losses: AtomicU64::new(0),
            resync_pending: AtomicBool::new(false),
            labels_behind: AtomicBool::new(false),
            clock,
            loss_unsaved: AtomicBool::new(false),
            run: 1,
        };
        pool.save_config(&pool.inner.read().config)?;
        info!(pool = name, disks = pool.inner.read().members.len(), "pool created");
        Ok(Arc::new(pool))
    }

    /// Imports a pool from its metadata store, opening every member with `opener`. A member
    /// that cannot be opened, or whose label is corrupt or names another pool or disk, is
    /// marked missing and never written; the pool opens degraded.
    pub fn open(dir: &Path, opener: DiskOpener) -> Result<Arc<Pool>> {
        Self::open_with_meta(dir, opener, MetaStore::open(&dir.join("meta"))?)
    }

    /// Imports a pool as [`open`](Self::open) does, from the metadata in `meta`.
    /// `dir` (made if missing) holds what a pool keeps beside its disks and outside `meta`.
    /// The configuration of the pool `meta` holds (its members with their paths and sizes),
    /// read without opening anything: what a gateway needs to know to open the pool's disks.
    pub fn recorded_config(meta: &MetaStore) -> Result<PoolConfig> {
        let raw = meta
            .get(CF_POOL, CONFIG_KEY)?
            .ok_or_else(|| meta.error("pool configuration record is missing"))?;
        serde_json::from_slice(&raw).map_err(|e| meta.error(format!("pool configuration record is unreadable: {e}")))
    }

    pub fn open_with_meta(dir: &Path, opener: DiskOpener, meta: MetaStore) -> Result<Arc<Pool>> {
        Self::open_with_options(dir, opener, meta, ImportOptions::default())
    }

    /// Imports a pool as [`open_with_meta`](Self::open_with_meta) does, as `options` say.
    pub fn open_with_options(
        dir: &Path,
        opener: DiskOpener,
        meta: MetaStore,
        options: ImportOptions,
    ) -> Result<Arc<Pool>> {
        std::fs::create_dir_all(dir).map_err(|e| PoolError::Meta {
            path: dir.display().to_string(),
            message: format!("cannot create the pool directory: {e}"),
        })?;
        let meta = Arc::new(meta);
        let mut config = Self::recorded_config(&meta)?;
        sensible_config(&config).map_err(|why| meta.error(format!("pool configuration record holds {why}")))?;
        // Every disk that was there when the configuration was last saved carries this
        // generation in its label (labels are written before the configuration is saved).
        let last_saved = config.generation;
        config.generation += 1;
        let run = config.generation;
        // The generation each opened disk's label has, kept for a disk whose label cannot be
        // written below (`write_labels_at_import`).
        let mut label_generation = vec![last_saved; config.disks.len()];
        // Stale members: of a disk back now, or still unresynced since an earlier import
        // (its labels say so). The layout layer, which knows which, settles it once open.
        let mut resync_pending = false;
        let mut members = Vec::new();
        let clock = new_clock();
        for (i, info) in config.disks.iter_mut().enumerate() {
            let mut member = Member {
                dev: None,
                slabs: SlabMap::new(info.slabs),
                problem: None,
                lost_at: 0,
                marks: WriteMarks::new(info.slabs, &clock),
            };
            if info.state == DiskState::Failed {
                // One an I/O error took out waits for `disk online` even if it answers now:
                // a disk that fails writes often still reads its label.
                if info.may_come_back() {
                    member.problem = Some(format!(
                        "an I/O error took it out while the pool ran; {}",
                        away_after_error()
                    ));
                }
                members.push(member);
                continue;
            }
            let opened = opener(&info.path).map_err(PoolError::from).and_then(|dev| {
                let label = verify_label(dev.as_ref(), config.id, info.id)?;
                if label.position != info.position || label.slab_size != config.slab_size {
                    return Err(PoolError::Invalid(format!(
                        "{}: its label puts it at position {} with {} byte slabs, the pool's configuration at {} with {}",
                        info.path, label.position, label.slab_size, info.position, config.slab_size
                    )));
                }
                resync_pending |= label.resync_pending;
                label_generation[i] = label.generation;
                // The generation its label has at least: the configuration's when last saved,
                // or for a missing disk, when it went missing. An older one is an older copy
                // of the disk (an image restored from a backup, a virtual disk's snapshot),
                // which missed what was written since.
                let expected = if info.state == DiskState::Missing {
                    info.left_at
                } else {
                    Some(last_saved)
                };
                if let Some(g) = expected.filter(|&g| label.generation < g) {
                    return Ok((dev, Some((label.generation, g))));
                }
                if dev.size() < info.size {
                    return Err(PoolError::Invalid(format!(
                        "{}: disk shrank from {} to {} bytes",
                        info.path,
                        info.size,
                        dev.size()
                    )));
                }
                Ok((dev, None))
            });
            match opened {
                Ok((dev, Some((older, expected)))) => {
                    warn!(disk = %info.path, label_generation = older, expected, "the disk is an older copy of the pool's member; treating it as failed");
                    info.state = DiskState::Failed;
                    member.problem = Some(format!(
                        "an older copy of the disk is in its place (label generation {older}, {expected} expected): \
                         it missed what was written since; run a repair"
                    ));
                    info.forget_return();
                    drop(dev);
                }
                Ok((dev, None)) if info.state == DiskState::Missing => {
                    match (info.returns_as.take(), info.left_at.take()) {
                        // Every slab set a write went around while it was away says so (the
                        // layout's `missed` members): those of its slabs are stale until a repair
                        // resyncs them, and the rest are as current as the day it left.
                        (Some(state), _) if info.usage == DiskUsage::Data => {
                            info!(disk = %info.path, "disk is back; the slabs that missed writes while it was away are resynced by a repair");
                            info.state = state;
                            resync_pending = true;
                            member.dev = Some(MeteredDisk::wrap(dev));
                        }
                        // Missing since before writes around it were recorded, or a write-back
                        // cache disk (whose log the pool went on without): it may have missed
                        // anything, and only a repair makes the pool whole.
                        _ => {
                            warn!(disk = %info.path, "disk is back, but what it missed while it was away is not known; treating it as failed");
                            info.state = DiskState::Failed;
                            member.problem =
                                Some("was missing while the pool ran: its data may be stale; run a repair".into());
                            drop(dev);
                        }
                    }
                }
                Ok((dev, None)) => member.dev = Some(MeteredDisk::wrap(dev)),
                Err(e) => {
                    warn!(disk = %info.path, error = %e, "pool member refused or missing");
                    member.problem = Some(e.to_string());
                    info.missing_at_import(last_saved);
                }
            }
            members.push(member);
        }
        log_disk_found(&mut config, &mut members, &options)?;
        some_disk_opened(&config.name, &config.disks, &members)?;
        let pool = Pool {
            meta,
            dir: dir.to_path_buf(),
            inner: RwLock::new(Inner { config, members }),
            saving: parking_lot::Mutex::new(()),
            losses: AtomicU64::new(0),
            resync_pending: AtomicBool::new(resync_pending),
            labels_behind: AtomicBool::new(false),
            clock,
            loss_unsaved: AtomicBool::new(false),
            run,
        };
        pool.write_labels_at_import(&label_generation)?;
        pool.save_config(&pool.inner.read().config)?;
        info!(pool = %pool.name(), "pool imported");
        Ok(Arc::new(pool))
    }

    /// Flushes everything and marks every label as cleanly exported. The pool must not be
    /// used afterwards.
    pub fn export(&self) -> Result<()> {
        // A member whose flush fails is marked failed in the labels written below; the
        // layouts' own flush (before this) has said whether the data survived it.
        self.flush_all()?;
        let _saving = self.saving.lock();
        self.inner.write().config.generation += 1;
        self.write_labels(true)?;
        self.save_config(&self.inner.read().config)?;
        self.meta.sync()
    }

    /// Raises the generation in every open member's label, then in the configuration, as an
    /// import and an export do: a copy of a member taken before (a backup image, a snapshot of
    /// a virtual disk) is then known at the next import as older, and failed rather than read.
    /// For a clean stop, which exports nothing.
    pub fn seal(&self) -> Result<()> {
        let _saving = self.saving.lock();
        self.inner.write().config.generation += 1;
        if let Err(e) = self.write_labels(false) {
            // Some labels may have the new generation: the configuration keeps the old one,
            // which they are above, never below.
            self.inner.write().config.generation -= 1;
            return Err(e);
        }
        self.save_config(&self.inner.read().config)
    }

    /// Wipes the labels of every reachable member and deletes the metadata store. The caller
    /// makes sure no virtual disk remains.
    pub fn destroy(self: Arc<Self>) -> Result<()> {
        if Arc::strong_count(&self) != 1 {
            return Err(PoolError::Invalid(format!("pool '{}' is still in use", self.name())));
        }
        let path = self.dir.clone();
        let id = self.id();
        {
            let inner = self.inner.read();
            for m in &inner.members {
                if let Some(dev) = &m.dev {
                    wipe_label(dev.as_ref(), id)?;
                }
            }
        }
        drop(self);
        // Remove only what the pool put there; the directory itself goes if it is then empty.
        for sub in ["meta", "journal"] {
            let p = path.join(sub);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(|e| PoolError::Meta {
                    path: p.display().to_string(),
                    message: format!("cannot remove: {e}"),
                })?;
            }
        }
        let _ = std::fs::remove_dir(&path);
        Ok(())
    }

    /// Writes every opened member's label at an import. A data disk that answered but cannot
    /// take its label (a write, flush or read back that fails) is left out as a disk missing
    /// at the import would be, rather than keep the whole pool from opening: its data is as
    /// current as the day the pool last stopped (or it left, for one missing until now), and
    /// `disk online` (or the next import that can write its label) takes it back, stale only
    /// where a write went around it. Its label then has this import's generation or the one it
    /// was found with (`label_generation`, per disk), never an older one. A cache disk's
    /// failure, or a refusal of the storage itself (`DiskError::Unavailable`, a cluster),
    /// still fails the import: the write-back log would be lost without the disk, which
    /// cannot come back to it, and an import tried again loses nothing.
    fn write_labels_at_import(&self, label_generation: &[u64]) -> Result<()> {
        let failed: Vec<(usize, LabelError)> = {
            let inner = self.inner.read();
            let resync_pending = self.resync_pending.load(Ordering::SeqCst);
            let mut failed = Vec::new();
            for (i, (info, m)) in inner.config.disks.iter().zip(&inner.members).enumerate() {
                let Some(dev) = &m.dev else { continue };
                match rewrite_label(dev.as_ref(), &label_for(&inner.config, info, false, resync_pending)) {
                    Ok(()) => {}
                    Err(LabelError::Disk(e)) if e.is_unavailable() => return Err(PoolError::Disk(*e)),
                    Err(e) if info.usage != DiskUsage::Data => return Err(e.into()),
                    Err(e) => failed.push((i, e)),
                }
            }
            failed
        };
        if failed.is_empty() {
            return Ok(());
        }
        let mut inner = self.inner.write();
        let inner = &mut *inner;
        for (i, e) in failed {
            let (info, m) = (&mut inner.config.disks[i], &mut inner.members[i]);
            warn!(disk = %info.path, error = %e, "cannot write the disk's label at the import; the pool opens without it, as without a missing disk");
            m.dev = None;
            m.problem = Some(format!(
                "its label could not be written at the import ({e}); once the cause is mended, 'tessera disk online' \
                 takes it back"
            ));
            info.missing_at_import(label_generation[i]);
        }
        some_disk_opened(&inner.config.name, &inner.config.disks, &inner.members)
    }

    fn write_labels(&self, exported: bool) -> Result<()> {
        let inner = self.inner.read();
        for (info, m) in inner.config.disks.iter().zip(&inner.members) {
            if let Some(dev) = &m.dev {
                rewrite_label(
                    dev.as_ref(),
                    &label_for(
                        &inner.config,
                        info,
                        exported,
                        self.resync_pending.load(Ordering::SeqCst),
                    ),
                )?;
            }
        }
        Ok(())
    }

    fn save_config(&self, config: &PoolConfig) -> Result<()> {
        let mut b = MetaBatch::new();
        b.put(CF_POOL, CONFIG_KEY, serde_json::to_vec(config).expect("serializable"));
        self.meta.commit(b, true)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn meta(&self) -> &Arc<MetaStore> {
        &self.meta
    }

    pub fn id(&self) -> Uuid {
        self.inner.read().config.id
    }

    pub fn name(&self) -> String {
        self.inner.read().config.name.clone()
    }

    pub fn slab_size(&self) -> u64 {
        self.inner.read().config.slab_size
    }

    pub fn config(&self) -> PoolConfig {
        self.inner.read().config.clone()
    }

    /// Whether blocks are stored with checksums.
    pub fn checksums(&self) -> bool {
        self.inner.read().config.checksums
    }

    /// Turns block checksums on or off, durably; the layout layer reads it when it opens, so
    /// the change takes effect at the next import (a new pool sets it before its first use).
    pub fn set_checksums(&self, on: bool) -> Result<()> {
        let _saving = self.saving.lock();
        let config = {
            let mut inner = self.inner.write();
            inner.config.checksums = on;
            inner.config.clone()
        };
        self.save_config(&config)
    }

    /// Adds a blank disk to the pool.
    pub fn add_disk(&self, dev: DiskRef) -> Result<DiskInfo> {
        self.add_member(dev, DiskState::Healthy, DiskUsage::Data)
    }

    /// Adds a blank disk as a hot spare: kept empty for the next repair.
    pub fn add_spare(&self, dev: DiskRef) -> Result<DiskInfo> {
        self.add_member(dev, DiskState::Spare, DiskUsage::Data)
    }

    /// Adds a blank disk that holds the write-back cache log, and no slab.
    pub fn add_cache_disk(&self, dev: DiskRef) -> Result<DiskInfo> {
        if dev.size() < DATA_OFFSET + MIN_CACHE_AREA {
            return Err(PoolError::Invalid(format!(
                "{}: {} bytes is too small for a cache disk (at least {} MiB)",
                dev.path(),
                dev.size(),
                (DATA_OFFSET + MIN_CACHE_AREA) >> 20
            )));
        }
        self.add_member(dev, DiskState::Healthy, DiskUsage::Cache)
    }

    /// The healthy cache disks, by position.
    pub fn cache_disks(&self) -> Vec<(u32, DiskRef)> {
        let inner = self.inner.read();
        inner
            .config
            .disks
            .iter()
            .zip(&inner.members)
            .filter(|(i, _)| i.usage == DiskUsage::Cache && i.state == DiskState::Healthy)
            .filter_map(|(i, m)| m.dev.clone().map(|d| (i.position, d)))
            .collect()
    }

    /// What a member is for (data if there is no such member).
    pub fn disk_usage(&self, position: u32) -> DiskUsage {
        self.inner
            .read()
            .config
            .disks
            .get(position as usize)
            .map(|d| d.usage)
            .unwrap_or_default()
    }

    fn add_member(&self, dev: DiskRef, state: DiskState, usage: DiskUsage) -> Result<DiskInfo> {
        let _saving = self.saving.lock();
        let mut inner = self.inner.write();
        let slab_size = inner.config.slab_size;
        if inner
            .config
            .disks
            .iter()
            .any(|d| d.path == dev.path() && (d.state != DiskState::Failed || d.may_come_back()))
        {
            return Err(PoolError::Exists(format!(
                "disk {} in pool '{}'",
                dev.path(),
                inner.config.name
            )));
        }
        let slabs = match usage {
            DiskUsage::Data => slabs_on(dev.size(), slab_size),
            DiskUsage::Cache => 0,
        };
        if slabs == 0 && usage == DiskUsage::Data {
            return Err(PoolError::Invalid(format!(
                "{}: {} bytes is too small for one {} byte slab",
                dev.path(),
                dev.size(),
                slab_size
            )));
        }
        let info = DiskInfo {
            id: Uuid::new_v4(),
            position: inner.config.disks.len() as u32,
            path: dev.path().to_string(),
            size: dev.size(),
            slabs,
            state,
            usage,
            returns_as: None,
            left_at: None,
            stale_slabs: Vec::new(),
            back_after_error: false,
            flushed_through: None,
        };
        write_new_label(
            dev.as_ref(),
            &label_for(&inner.config, &info, false, self.resync_pending.load(Ordering::SeqCst)),
        )?;
        inner.config.disks.push(info.clone());
        inner.members.push(Member {
            dev: Some(MeteredDisk::wrap(dev)),
            slabs: SlabMap::new(slabs),
            problem: None,
            lost_at: 0,
            marks: WriteMarks::new(slabs, &self.clock),
        });
        let config = inner.config.clone();
        drop(inner);
        self.save_config(&config)?;
        info!(pool = %config.name, disk = %info.path, state = state.as_str(), "disk added");
        Ok(info)
    }

    /// Finds a member by its id, its path or its position.
    pub fn find_disk(&self, spec: &str) -> Result<u32> {
        let inner = self.inner.read();
        inner
            .config
            .disks
            .iter()
            .find(|d| d.id.to_string() == spec || d.path == spec || d.position.to_string() == spec)
            .map(|d| d.position)
            .ok_or_else(|| PoolError::NoSuchDisk {
                pool: inner.config.name.clone(),
                disk: spec.to_string(),
            })
    }

    /// Changes a member's state durably. A failed disk is closed and never used again (one
    /// an I/O error took out, which could come back, is given up); a retired one stays
    /// readable but takes no new slabs.
    pub fn set_disk_state(&self, position: u32, state: DiskState, why: Option<String>) -> Result<()> {
        let _saving = self.saving.lock();
        let mut inner = self.inner.write();
        let name = inner.config.name.clone();
        let idx = position as usize;
        if idx >= inner.members.len() {
            return Err(PoolError::NoSuchDisk {
                pool: name,
                disk: position.to_string(),
            });
        }
        if state == DiskState::Failed {
            // Failed for good: whatever it was waited for as is gone with it.
            let disk = &mut inner.config.disks[idx];
            let gives_up = disk.returns_as.is_some() || disk.back_after_error || !disk.stale_slabs.is_empty();
            disk.forget_return();
            if disk.state == DiskState::Failed {
                if !gives_up {
                    return Ok(());
                }
                warn!(pool = %name, disk = %disk.path, reason = why.as_deref().unwrap_or(""), "a disk an I/O error took out is given up: it can no longer come back");
                inner.members[idx].problem = why;
                let config = inner.config.clone();
                drop(inner);
                return self.save_config(&config);
            }
        }
        if inner.config.disks[idx].state == state {
            return Ok(());
        }
        if inner.config.disks[idx].state == DiskState::Failed {
            return Err(PoolError::Invalid(format!(
                "disk {} of pool '{}' has failed; a failed disk cannot change state",
                inner.config.disks[idx].path, name
            )));
        }
        // A missing disk is known by what it missed only while it is `missing`: retired (say),
        // writes that go around it would not be recorded, and it would come back current.
        if inner.config.disks[idx].state == DiskState::Missing && state != DiskState::Failed {
            return Err(PoolError::Invalid(format!(
                "disk {} of pool '{}' is missing; a missing disk can only be failed (a repair rebuilds its \
                 slabs elsewhere either way)",
                inner.config.disks[idx].path, name
            )));
        }
        warn!(pool = %name, disk = %inner.config.disks[idx].path, state = state.as_str(), reason = why.as_deref().unwrap_or(""), "disk state change");
        inner.config.disks[idx].state = state;
        if state == DiskState::Failed || state == DiskState::Missing {
            inner.members[idx].dev = None;
            inner.members[idx].problem = why;
            // Under the write lock, so a writer that noted the count before this cannot have
            // taken the device after it.
            inner.members[idx].lost_at = self.losses.fetch_add(1, Ordering::SeqCst) + 1;
        }
        let config = inner.config.clone();
        drop(inner);
        self.save_config(&config)
    }

    /// Takes out a data disk that an I/O error (`why`) failed while the pool runs, so that
    /// it can come back as a missing disk does: failed, with the state it returns to, the
    /// label generation it holds and its slabs whose medium may lack writes
    /// ([`WriteMarks::unflushed`], stale should it be back), all in one save of the
    /// configuration, which comes before the caller answers anything the failure decides.
    /// Writes that go around it from now on are recorded by the layout layer
    /// ([`may_return`](Self::may_return)). A disk already out is left as it is; a disk that
    /// cannot come back (a cache disk, whose log goes on without it) is failed for good.
    pub fn lose_disk(&self, position: u32, why: String) -> Result<()> {
        let _saving = self.saving.lock();
        let mut inner = self.inner.write();
        let idx = position as usize;
        let Some(info) = inner.config.disks.get(idx) else {
            return Err(PoolError::NoSuchDisk {
                pool: inner.config.name.clone(),
                disk: position.to_string(),
            });
        };
        if inner.members[idx].dev.is_none() || info.state == DiskState::Failed {
            drop(inner);
            // Out already; if its record could not be saved, this caller may not answer
            // before it is.
            return self.save_unsaved_loss();
        }
        let returns = info.usage == DiskUsage::Data
            && matches!(info.state, DiskState::Healthy | DiskState::Spare | DiskState::Retired);
        warn!(pool = %inner.config.name, disk = %info.path, reason = %why, may_come_back = returns, "disk failed by an I/O error");
        let generation = inner.config.generation;
        let member = &mut inner.members[idx];
        member.dev = None;
        // Under the write lock, as in `set_disk_state`.
        member.lost_at = self.losses.fetch_add(1, Ordering::SeqCst) + 1;
        // Its device gone first: a write that may have reached it marked its slab before it
        // looked for the device, and is counted here.
        let stale = member.marks.unflushed();
        let flushed_through = (self.run, member.marks.flushed_from());
        member.problem = Some(if returns {
            format!("{why}; {}", away_after_error())
        } else {
            why
        });
        let disk = &mut inner.config.disks[idx];
        disk.flushed_through = Some(flushed_through);
        if returns {
            disk.returns_as = Some(disk.state);
            disk.left_at = Some(generation);
            disk.stale_slabs = stale;
            disk.back_after_error = true;
        }
        disk.state = DiskState::Failed;
        let config = inner.config.clone();
        drop(inner);
        let saved = self.save_config(&config);
        self.loss_unsaved.store(saved.is_err(), Ordering::SeqCst);
        saved
    }

    /// Saves the configuration again if a disk's loss could not be saved (`lose_disk`); the
    /// caller holds `saving`. Until it is saved, every flush fails: the disk is out in memory
    /// and skipped, while the saved configuration would have it read as current.
    fn save_unsaved_loss(&self) -> Result<()> {
        if !self.loss_unsaved.load(Ordering::SeqCst) {
            return Ok(());
        }
        let config = self.inner.read().config.clone();
        self.save_config(&config)?;
        self.loss_unsaved.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Marks a write of `slab` under way until the returned mark is dropped, once its disk
    /// answered it. Made before the writer looks for the slab's disk, so that a disk an I/O
    /// error takes out meanwhile counts the slab among those it may lack writes of
    /// ([`lose_disk`](Self::lose_disk)).
    pub fn mark_write(&self, slab: SlabRef) -> WriteMark {
        let inner = self.inner.read();
        match inner.members.get(slab.disk as usize) {
            Some(m) => m.marks.begin(slab.slab),
            None => WriteMark::none(),
        }
    }

    /// Whether an I/O error may have left `slab` stale on the disk it took out, not recorded
    /// with its slab set yet ([`DiskInfo::stale_slabs`]).
    pub fn is_stale(&self, slab: SlabRef) -> bool {
        self.inner
            .read()
            .config
            .disks
            .get(slab.disk as usize)
            .is_some_and(|d| d.stale_slabs.contains(&slab.slab))
    }

    /// The disks whose slabs an I/O error may have left stale ([`DiskInfo::stale_slabs`]):
    /// (position, slabs), for the layout layer to record with its slab sets.
    pub fn stale_slabs(&self) -> Vec<(u32, Vec<u32>)> {
        self.inner
            .read()
            .config
            .disks
            .iter()
            .filter(|d| !d.stale_slabs.is_empty())
            .map(|d| (d.position, d.stale_slabs.clone()))
            .collect()
    }

    /// The layout layer recorded the disk's stale slabs with its slab sets: the list goes.
    pub fn forget_stale_slabs(&self, position: u32) -> Result<()> {
        let _saving = self.saving.lock();
        let mut inner = self.inner.write();
        let Some(disk) = inner.config.disks.get_mut(position as usize) else {
            return Ok(());
        };
        if disk.stale_slabs.is_empty() {
            return Ok(());
        }
        disk.stale_slabs.clear();
        let config = inner.config.clone();
        drop(inner);
        self.save_config(&config)
    }

    /// Whether `dev` may be taken back in the place of the disk at `position`
    /// ([`bring_back`](Self::bring_back), whose checks this makes, reading its label), but
    /// for its stale slabs: the layout layer records those once this says yes, then brings
    /// it back. Asked first, a disk refused (another in its place, an older copy) leaves
    /// nothing recorded.
    pub fn may_bring_back(&self, position: u32, dev: &DiskRef) -> Result<()> {
        self.check_return(position, dev).map(|_| ())
    }

    /// The checks of [`bring_back`](Self::bring_back): the pool's configuration, the disk's
    /// record and the state it returns to, or why it is refused.
    fn check_return(&self, position: u32, dev: &DiskRef) -> Result<(PoolConfig, DiskInfo, DiskState)> {
        let (config, info) = {
            let inner = self.inner.read();
            let info = inner
                .config
                .disks
                .get(position as usize)
                .cloned()
                .ok_or_else(|| PoolError::NoSuchDisk {
                    pool: inner.config.name.clone(),
                    disk: position.to_string(),
                })?;
            (inner.config.clone(), info)
        };
        let refuse = |why: String| {
            Err(PoolError::Invalid(format!(
                "disk {} of pool '{}' {why}",
                info.path, config.name
            )))
        };
        if info.state == DiskState::Failed && !info.may_come_back() {
            return refuse(
                "has failed for good (failed by the administrator, or found an older copy): repair the pool, \
                 and add it again as a new disk if it is sound"
                    .into(),
            );
        }
        if !matches!(info.state, DiskState::Missing | DiskState::Failed) {
            return refuse(format!("is not missing (it is {})", info.state.as_str()));
        }
        if info.usage != DiskUsage::Data {
            return refuse(
                "is a write-back cache disk: the log went on without it, so it cannot be taken back; fail it, and add it again"
                    .into(),
            );
        }
        let Some(state) = info.returns_as else {
            return refuse(
                "went missing before what it misses was recorded: what it holds may be stale; fail it, and repair the pool"
                    .into(),
            );
        };
        let label = verify_label(dev.as_ref(), config.id, info.id)?;
        if let Some(expected) = info.left_at.filter(|&g| label.generation < g) {
            return refuse(format!(
                "is an older copy (label generation {}, {expected} expected): it missed what was written since; \
                 fail it, and repair the pool",
                label.generation
            ));
        }
        if dev.size() < info.size {
            return refuse(format!("shrank from {} to {} bytes", info.size, dev.size()));
        }
        Ok((config, info, state))
    }

    /// Takes back, while the pool runs, a data disk that was missing when the pool was
    /// imported, or that an I/O error took out ([`lose_disk`](Self::lose_disk)), and may
    /// come back (`may_return`), now opened as `dev`, as an import that found it would: its
    /// label must name this pool's disk, of the generation it had when it went away or
    /// later (an older copy is refused), and it takes back the state it had. Which of its
    /// slabs missed writes meanwhile is in the slab sets' records (the layout layer, which
    /// says so in the labels first, and records the disk's stale slabs before this): the
    /// save that says it is back clears its list of stale slabs, so that a disk refused, or
    /// a crash before that save, finds the list as it was. Its label is written at the
    /// pool's generation before the configuration says it is back: a crash between the two
    /// finds it away, and back, at the next import.
    pub fn bring_back(&self, position: u32, dev: DiskRef) -> Result<()> {
        let _saving = self.saving.lock();
        let (config, info, state) = self.check_return(position, &dev)?;
        rewrite_label(
            dev.as_ref(),
            &label_for(&config, &info, false, self.resync_pending.load(Ordering::SeqCst)),
        )?;
        // Saved before the pool uses it: if that fails, nothing changed (the disk stays
        // missing, and is back at the next import).
        let idx = position as usize;
        let mut saved = self.inner.read().config.clone();
        let disk = &mut saved.disks[idx];
        disk.state = state;
        disk.forget_return();
        self.save_config(&saved)?;
        let mut inner = self.inner.write();
        inner.config = saved;
        inner.members[idx].dev = Some(MeteredDisk::wrap(dev));
        inner.members[idx].problem = None;
        // `lost_at` stays: a writer that noted the count before the loss must still hear that
        // what it wrote to this disk may be gone (a member of a set without redundancy comes
        // back as the disk holds it, not stale), and one that notes it from now on does not.
        info!(pool = %config.name, disk = %info.path, state = state.as_str(), "disk is back; the slabs that missed writes while it was away are resynced by a repair");
        Ok(())
    }

    /// Says in every label whether members of the pool are stale until resynced (the layout
    /// layer knows which): a daemon that does not know the flag refuses such labels, and so
    /// the pool, rather than read those members as current. Labels are written only when it
    /// changes; if that fails, the flag stays raised in memory, so that the next labels
    /// written carry it.
    pub fn set_resync_pending(&self, on: bool) -> Result<()> {
        let _saving = self.saving.lock();
        // Written again after a failure, even with the flag unchanged: some labels may lack it.
        if self.resync_pending.swap(on, Ordering::SeqCst) == on && !self.labels_behind.load(Ordering::SeqCst) {
            return Ok(());
        }
        let written = self.write_labels(false);
        if written.is_err() {
            self.resync_pending.store(true, Ordering::SeqCst);
        }
        self.labels_behind.store(written.is_err(), Ordering::SeqCst);
        written
    }

    /// Whether the disk at `position` is open: its members are read and written.
    pub fn is_present(&self, position: u32) -> bool {
        let inner = self.inner.read();
        inner.members.get(position as usize).is_some_and(|m| m.dev.is_some())
    }

    /// Whether the member at `position` is away but may be back (no device; missing, or
    /// failed by an I/O error that left it able to come back): a write that goes around it
    /// must say so first.
    pub fn may_return(&self, position: u32) -> bool {
        let inner = self.inner.read();
        let idx = position as usize;
        idx < inner.members.len()
            && inner.members[idx].dev.is_none()
            && (inner.config.disks[idx].state != DiskState::Failed || inner.config.disks[idx].may_come_back())
    }

    /// Whether the data disk at `position`, away, can be taken back as it was (by
    /// [`bring_back`](Self::bring_back) or an import that finds it): away since writes around
    /// it were recorded, and not failed for good ([`DiskInfo::may_come_back`]).
    pub fn can_come_back(&self, position: u32) -> bool {
        let inner = self.inner.read();
        let idx = position as usize;
        idx < inner.members.len() && inner.members[idx].dev.is_none() && inner.config.disks[idx].may_come_back()
    }

    /// The count of members lost so far: a writer notes it before it writes.
    pub fn losses(&self) -> u64 {
        self.losses.load(Ordering::SeqCst)
    }

    /// When disk `position`'s last successful flush before it last went away was
    /// ([`DiskInfo::flushed_through`]): what a flush of it vouched for, written to a member
    /// that has missed writes since, or may have lost them. None if it never went away.
    pub fn last_flush(&self, position: u32) -> Option<(u64, u64)> {
        self.inner.read().config.disks.get(position as usize)?.flushed_through
    }

    /// The count of losses when disk `position` was last lost (0 if not since the pool was
    /// opened): see [`lost_since`](Self::lost_since).
    pub fn lost_at(&self, position: u32) -> u64 {
        self.inner
            .read()
            .members
            .get(position as usize)
            .map_or(0, |m| m.lost_at)
    }

    /// Whether the member at `position` was lost after the count was `noted`: what was
    /// written to it since then, and not flushed before, may be gone.
    pub fn lost_since(&self, position: u32, noted: u64) -> bool {
        self.inner
            .read()
            .members
            .get(position as usize)
            .is_some_and(|m| m.lost_at > noted)
    }

    pub fn disk_state(&self, position: u32) -> DiskState {
        self.inner
            .read()
            .config
            .disks
            .get(position as usize)
            .map(|d| d.state)
            .unwrap_or(DiskState::Missing)
    }

    /// The device of a member that may be read: healthy or retired.
    pub fn readable_disk(&self, position: u32) -> Option<DiskRef> {
        let inner = self.inner.read();
        match inner.config.disks.get(position as usize)?.state {
            DiskState::Healthy | DiskState::Retired => inner.members[position as usize].dev.clone(),
            _ => None,
        }
    }

    /// Where the I/O of a member's device is counted, whatever its state, while the pool
    /// holds the device.
    pub fn disk_io(&self, position: u32) -> Option<std::sync::Arc<tessera_disk::DiskIo>> {
        let inner = self.inner.read();
        inner.members.get(position as usize)?.dev.as_ref()?.io().cloned()
    }

    pub fn disks(&self) -> Vec<DiskStatus> {
        let inner = self.inner.read();
        inner
            .config
            .disks
            .iter()
            .zip(&inner.members)
            .map(|(info, m)| DiskStatus {
                info: info.clone(),
                slabs_used: m.slabs.used(),
                used_bytes: m.slabs.used() as u64 * inner.config.slab_size,
                problem: m.problem.clone(),
            })
            .collect()
    }

    /// Raw slab capacity of the disks that can take slabs (healthy ones), and what the hot
    /// spares keep for repairs.
    pub fn capacity(&self) -> Capacity {
        let inner = self.inner.read();
        let ss = inner.config.slab_size;
        let (mut total, mut used, mut spare) = (0u64, 0u64, 0u64);
        for (info, m) in inner.config.disks.iter().zip(&inner.members) {
            match info.state {
                DiskState::Healthy => {
                    total += m.slabs.total() as u64 * ss;
                    used += m.slabs.used() as u64 * ss;
                }
                DiskState::Spare if m.dev.is_some() => spare += m.slabs.free() as u64 * ss,
                _ => {}
            }
        }
        Capacity {
            total_bytes: total,
            used_bytes: used,
            free_bytes: total - used,
            spare_bytes: spare,
        }
    }

    /// Free slabs per healthy disk, by position.
    pub fn free_slabs(&self) -> Vec<(u32, u32)> {
        self.inner.read().slab_candidates(&[])
    }

    /// Allocates one slab on each of `count` distinct healthy disks outside `exclude`, the
    /// emptiest disks first. Nothing is persisted here: the caller records the slabs in its own
    /// descriptor batch, and releases them if that fails.
    pub fn allocate_slabs(&self, count: usize, exclude: &[u32]) -> Result<Vec<SlabRef>> {
        let mut inner = self.inner.write();
        let candidates = inner.slab_candidates(exclude);
        let Some(chosen) = choose_disks(candidates.clone(), count) else {
            let with_space = candidates.iter().filter(|c| c.1 > 0).count();
            // A repair of a set that spans every other disk is not short of space.
            let detail = if candidates.len() < count && !exclude.is_empty() {
                format!(
                    "has too few disks: the slab set needs {count} distinct disks besides the {} it \
                     uses already, and only {} other disks can take slabs; add a disk",
                    exclude.len(),
                    candidates.len()
                )
            } else {
                format!(
                    "is out of space: a slab set needs {count} distinct disks with a free slab, and \
                     only {with_space} have one; add a disk or free space"
                )
            };
            return Err(PoolError::NoSpace {
                pool: inner.config.name.clone(),
                detail,
            });
        };
        Ok(chosen
            .into_iter()
            .map(|pos| {
                let slab = inner.members[pos as usize]
                    .slabs
                    .take()
                    .expect("chosen disks have a free slab");
                SlabRef { disk: pos, slab }
            })
            .collect())
    }

    /// Allocates the slab that replaces a member of a slab set during a repair, on a disk outside
    /// `exclude`: on a hot spare if there is one (the spare becomes an ordinary member, durably,
    /// before the slab is handed out), else as [`Pool::allocate_slabs`] does.
    pub fn allocate_replacement(&self, exclude: &[u32]) -> Result<SlabRef> {
        let saving = self.saving.lock();
        let mut inner = self.inner.write();
        let Some(pos) = choose_disks(inner.spare_candidates(exclude), 1).map(|v| v[0]) else {
            drop((inner, saving));
            return Ok(self.allocate_slabs(1, exclude)?[0]);
        };
        let idx = pos as usize;
        let slab = inner.members[idx].slabs.take().expect("chosen disks have a free slab");
        inner.config.disks[idx].state = DiskState::Healthy;
        let config = inner.config.clone();
        drop(inner);
        let path = &config.disks[idx].path;
        if let Err(e) = self.save_config(&config) {
            let mut inner = self.inner.write();
            inner.config.disks[idx].state = DiskState::Spare;
            inner.members[idx].slabs.release(slab);
            return Err(e);
        }
        info!(pool = %config.name, disk = %path, "hot spare taken into service by a repair");
        Ok(SlabRef { disk: pos, slab })
    }

    /// Records a slab found in a descriptor at open. False if it was already taken (two
    /// descriptors claim one slab: corrupt metadata).
    pub fn mark_slab_used(&self, s: SlabRef) -> bool {
        let mut inner = self.inner.write();
        match inner.members.get_mut(s.disk as usize) {
            Some(m) => m.slabs.mark_used(s.slab),
            None => false,
        }
    }

    pub fn release_slab(&self, s: SlabRef) {
        let mut inner = self.inner.write();
        if let Some(m) = inner.members.get_mut(s.disk as usize) {
            if !m.slabs.release(s.slab) {
                warn!(disk = s.disk, slab = s.slab, "release of a slab that was not in use");
            }
        }
    }

    /// Byte offset of a slab on its disk.
    pub fn slab_offset(&self, s: SlabRef) -> u64 {
        DATA_OFFSET + s.slab as u64 * self.slab_size()
    }

    /// Makes every completed write on every reachable member durable. A member whose flush
    /// fails is failed (and that is recorded before this returns): what it acknowledged may be
    /// lost, so it can no longer be trusted. Returns the positions failed by this flush; the
    /// caller decides whether the layouts still hold the data elsewhere, because the flush of
    /// those members did not make anything durable.
    pub fn flush_all(&self) -> Result<Vec<u32>> {
        let devs: Vec<(u32, DiskRef, Arc<WriteMarks>)> = {
            // A disk being taken out (`lose_disk`) is saved as such before a flush can skip
            // it: the flush's answer must not come before the record of what the disk may
            // lack. One whose save failed is saved now, or the flush fails.
            let _saving = self.saving.lock();
            self.save_unsaved_loss()?;
            let inner = self.inner.read();
            inner
                .members
                .iter()
                .zip(&inner.config.disks)
                .enumerate()
                // The write-back cache flushes its own disks.
                .filter(|(_, (_, info))| info.usage == DiskUsage::Data)
                .filter_map(|(i, (m, _))| m.dev.clone().map(|d| (i as u32, d, m.marks.clone())))
                .collect()
        };
        let mut failed = Vec::new();
        // One number for the round, taken before any disk's flush: the disks that come
        // through it have the same last flush (`last_flush`), none later than another.
        let number = flush_round(&self.clock);
        for (pos, dev, marks) in devs {
            match dev.flush() {
                Ok(()) => marks.flushed(number),
                Err(e) if e.is_unavailable() => return Err(e.into()),
                Err(e) => {
                    self.lose_disk(pos, format!("flush failed: {e}"))?;
                    failed.push(pos);
                }
            }
        }
        Ok(failed)
    }
}

/// Fails an import that could open none of the pool's disks, with each one's reason; unless
/// one is a disk an I/O error took out, which no import opens (only `disk online` takes it
/// back): failed, the import would fail for good, and the disk could never come back. (A
/// cache disk not opened has failed the import already: `log_disk_found`.)
fn some_disk_opened(pool: &str, disks: &[DiskInfo], members: &[Member]) -> Result<()> {
    if members.iter().any(|m| m.dev.is_some()) {
        return Ok(());
    }
    if disks.iter().any(|d| d.state == DiskState::Failed && d.may_come_back()) {
        warn!(pool, "no disk of the pool is open: it opens for 'tessera disk online' to take back the disks I/O errors took out");
        return Ok(());
    }
    let why: Vec<String> = members.iter().filter_map(|m| m.problem.clone()).collect();
    Err(PoolError::Invalid(format!(
        "none of the disks of pool '{pool}' could be opened: {}",
        why.join("; ")
    )))
}

/// What an import may do that it does not by itself, and what it cannot know itself.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Open the pool although none of the disks that hold its write-back log is found,
    /// giving them up: the writes the log held and had not destaged are lost (reads of them
    /// fail until they are written again). For cache disks that are gone for good.
    pub without_log: bool,
    /// The positions of the disks that hold the write-back log (its record, which the cache
    /// layer keeps in the metadata): one of them must be found.
    pub log_disks: Vec<u32>,
}

/// Fails an import that found none of the disks holding the pool's write-back log, before
/// anything is saved: the log's writes, answered as durable and perhaps not destaged yet,
/// are on them, and a pool opened without them would record those writes lost, and fail the
/// disks for good when they are back (the log went on without them). An import tried again
/// once they answer loses nothing. With `without_log`, they are given up (failed for good)
/// and the pool opens without its log. Cache disks that hold no part of the log (idle, or
/// retired with the log destaged) are not waited for.
fn log_disk_found(config: &mut PoolConfig, members: &mut [Member], options: &ImportOptions) -> Result<()> {
    let away: Vec<usize> = options
        .log_disks
        .iter()
        .map(|&p| p as usize)
        .filter(|&i| i < config.disks.len() && config.disks[i].state != DiskState::Failed)
        .collect();
    if away.is_empty() || away.iter().any(|&i| members[i].dev.is_some()) {
        return Ok(());
    }
    let paths: Vec<String> = away.iter().map(|&i| config.disks[i].path.clone()).collect();
    if !options.without_log {
        let why: Vec<String> = away
            .iter()
            .map(|&i| {
                format!(
                    "{}: {}",
                    config.disks[i].path,
                    members[i].problem.as_deref().unwrap_or("not found")
                )
            })
            .collect();
        return Err(PoolError::Invalid(format!(
            "none of the write-back cache disks that hold the log of pool '{}' was found ({}): the pool is not imported, so that the \
             writes its log holds are not lost; import it again once they answer, or, if they are gone for good, \
             import it without them ('tessera pool import {} --without-log': the writes the log held and had not \
             destaged are then lost)",
            config.name,
            why.join("; "),
            config.name
        )));
    }
    warn!(pool = %config.name, disks = ?paths, "imported without its write-back cache disks, given up: the writes their log held and had not destaged are lost");
    for i in away {
        config.disks[i].state = DiskState::Failed;
        config.disks[i].forget_return();
        members[i].problem = Some("given up by an import without the write-back log ('--without-log')".into());
    }
    Ok(())
}

/// What becomes of a disk an I/O error took out.
fn away_after_error() -> &'static str {
    "what it holds is kept: once the cause is mended (a cable, an enclosure's power), 'tessera disk online' \
     takes it back, its slabs written since its last flush resynced by a repair (a simple vdisk's, and a mirror's \
     whose other copies went out on errors too, taken as the disk holds them); 'tessera disk fail' gives it up"
}

fn label_for(config: &PoolConfig, info: &DiskInfo, exported: bool, resync_pending: bool) -> Label {
    Label {
        pool_id: config.id,
        pool_name: config.name.clone(),
        disk_id: info.id,
        position: info.position,
        generation: config.generation,
        disk_size: info.size,
        slab_size: config.slab_size,
        exported,
        resync_pending,
    }
}
