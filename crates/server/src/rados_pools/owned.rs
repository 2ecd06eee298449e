//! A pool this gateway took: its own connection to the cluster, at its epoch, and the disks
//! and metadata opened through it.

use std::sync::Arc;

use tessera_disk::DiskRef;
use tessera_ownership::fenced_disk::FencedDisk;
use tessera_ownership::rados_meta::RadosMeta;
use tessera_pool::{MetaStore, Pool};
use tessera_rados::Cluster;
use tessera_volume::Engine;

use super::cluster::*;
use super::*;

/// A pool this gateway took: its own connection to the cluster and its epoch.
pub struct Owned {
    pub(super) cluster: Arc<Cluster>,
    pub(super) placement: Placement,
    pub epoch: i64,
    /// The lease it was taken under: it is this gateway's only while that lease is.
    pub lease: i64,
    /// Until when that lease surely holds: its disks serve nothing past it.
    pub(super) lease_clock: tessera_ownership::LeaseClock,
    /// The disks opened through it, to learn whether the OSDs refused a write.
    pub(super) disks: Arc<parking_lot::Mutex<Vec<std::sync::Weak<FencedDisk>>>>,
    /// A change of the metadata through it whose outcome is not known, described: its
    /// disks vouch for nothing from then on (`RadosMeta::on_unknown`).
    pub(super) meta_unknown: Arc<parking_lot::Mutex<Option<String>>>,
}

/// An opening's disks and metadata, as [`Owned::refusals`] gives them.
#[derive(Clone)]
pub struct Refusals {
    disks: Arc<parking_lot::Mutex<Vec<std::sync::Weak<FencedDisk>>>>,
    meta_unknown: Arc<parking_lot::Mutex<Option<String>>>,
}

impl Refusals {
    /// Why a disk or the metadata of the opening vouches for nothing more, if one does.
    /// (The disks are asked once the list is let go of: each may take a while to answer.)
    pub fn refused(&self) -> Option<String> {
        let disks: Vec<_> = self.disks.lock().iter().filter_map(|d| d.upgrade()).collect();
        let on_disk = disks.iter().find_map(|d| d.refused());
        on_disk.or_else(|| self.meta_unknown.lock().clone())
    }
}

impl Owned {
    /// The metadata of pool `name` as this connection writes it: at its epoch, each
    /// batch stamped with its address.
    fn rados_meta(&self, name: &str) -> Result<RadosMeta, String> {
        let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
        let address = self
            .cluster
            .address()
            .map_err(|e| format!("cannot learn this client's address: {e}"))?;
        Ok(RadosMeta::new(pool, &Placement::meta_object(name), self.epoch).owned_by(address))
    }

    fn meta(&self, name: &str) -> Result<MetaStore, String> {
        let (disks, unknown) = (self.disks.clone(), self.meta_unknown.clone());
        let meta = MetaStore::on(self.rados_meta(name)?).on_unknown(move |why| {
            // What this gateway holds may differ from the cluster's records: no flush
            // through this connection says "durable" again, and the pool is opened anew.
            tracing::warn!(error = why, "a metadata change failed; the pool is opened again");
            unknown.lock().get_or_insert_with(|| why.to_string());
            for d in disks.lock().iter().filter_map(|d| d.upgrade()) {
                d.refuse(why);
            }
        });
        Ok(meta)
    }

    /// Says in the metadata object of pool `name` that this connection owns it now, at
    /// its epoch (`tessera.owner`, in a batch of no records), before the opening writes
    /// anything else of the pool: should etcd lose the fence record, the next owner finds
    /// this connection there to fence off, whatever it wrote since.
    fn stamp(&self, name: &str) -> Result<(), String> {
        // A batch at version 0 would make the object: one gone since its records were
        // read (removed by hand) is not made again, bare.
        let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
        if !metadata_is_there(&pool, name)? {
            return Err(format!("the metadata object of pool {name} is gone"));
        }
        // Seen: removed after this look, it is not made again either.
        let meta = self.rados_meta(name)?.seen();
        tessera_pool::MetaBackend::commit(&meta, &tessera_pool::MetaBatch::new(), true)
            .map_err(|e| format!("cannot say in the metadata of pool {name} that this gateway owns it: {e}"))
    }

    fn disk(&self, name: &str, size: u64) -> Result<Arc<FencedDisk>, String> {
        let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
        let disk = FencedDisk::new(pool, &Placement::data_prefix(name), size, self.epoch)
            .map(|d| Arc::new(d.under_lease(self.lease_clock.clone())))
            .map_err(|e| e.to_string())?;
        let mut disks = self.disks.lock();
        if let Some(why) = &*self.meta_unknown.lock() {
            disk.refuse(why);
        }
        disks.push(Arc::downgrade(&disk));
        Ok(disk)
    }

    /// Whether the lease the pool was taken under surely holds still: past it, another
    /// gateway may own the pool.
    pub fn lease_holds(&self) -> bool {
        self.lease_clock.holds()
    }

    /// [`lease_holds`](Self::lease_holds), for the pool's ports to ask at every command.
    pub fn lease_check(&self) -> crate::standby::LeaseCheck {
        let clock = self.lease_clock.clone();
        Arc::new(move || clock.holds())
    }

    /// What tells the first write the OSDs refused on a disk opened through this
    /// connection, or a change of the metadata whose outcome is not known, if any (no flush
    /// there can say "durable" again): to be asked without holding what holds this, as a
    /// disk answers once it has handed its writes to librados, which may take a while.
    pub fn refusals(&self) -> Refusals {
        Refusals {
            disks: self.disks.clone(),
            meta_unknown: self.meta_unknown.clone(),
        }
    }

    /// This connection's address in the cluster (what a newer owner blocklists).
    pub fn client_address(&self) -> Option<String> {
        self.cluster.address().ok()
    }

    /// Makes pool `name` of `capacity` bytes in the cluster (refused if the cluster holds
    /// one of that name already) and opens an engine on it, with `dir` for what stays
    /// local.
    pub fn create(&self, dir: &Path, name: &str, capacity: u64, slab_size: u64) -> Result<Engine, String> {
        let disk: DiskRef = self.disk(name, capacity)?;
        Engine::create_pool_with_meta(dir, name, vec![disk], slab_size, self.meta(name)?, false)
            .map_err(|e| e.to_string())
    }

    /// Opens the pool `name` as the cluster holds it.
    pub fn open(&self, dir: &Path, name: &str) -> Result<Engine, String> {
        let meta = self.meta(name)?;
        let recorded = Pool::recorded_config(&meta).map_err(|e| {
            format!(
                "the cluster holds no readable pool {name} in RADOS pool '{}': {e}",
                self.placement.rados_pool
            )
        })?;
        self.stamp(name)?;
        let path = self.placement.disk_path(name);
        let opener = |p: &str| -> Result<DiskRef, tessera_disk::DiskError> {
            let info = recorded
                .disks
                .iter()
                .find(|d| d.path == p && p == path)
                .ok_or_else(|| tessera_disk::DiskError::Unusable {
                    path: p.to_string(),
                    reason: format!("not the disk of pool {name} on RADOS ({path})"),
                })?;
            self.disk(name, info.size)
                .map(|d| d as DiskRef)
                .map_err(|reason| tessera_disk::DiskError::Unusable {
                    path: p.to_string(),
                    reason,
                })
        };
        Engine::open_with_meta(dir, &opener, meta).map_err(|e| e.to_string())
    }

    /// The label of pool `name`'s disk of `capacity` bytes as the cluster holds it now
    /// (`Missing` once wiped, or once its first object is gone). Err: the cluster did not
    /// answer.
    pub fn label(
        &self,
        name: &str,
        capacity: u64,
    ) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
        label_of(name, &*self.disk(name, capacity)?)
    }

    /// Removes the objects of the destroyed pool `name` of `capacity` bytes: its metadata
    /// first, so that a removal that stops halfway leaves objects nobody reads, never a
    /// pool another gateway would open with part of its data gone (read as zeros).
    /// Only while this gateway owns the pool: the removal of the metadata object is
    /// guarded by the epoch, and each data object's by its lease and its epoch.
    pub fn remove_objects(&self, name: &str, capacity: u64) -> Result<(), String> {
        let disk = self.disk(name, capacity)?;
        if !self.lease_clock.holds() {
            return Err(format!(
                "this gateway's lease on pool {name} may have lapsed (it stalled, or lost etcd): another gateway \
                 may own it now, and nothing of it was removed"
            ));
        }
        if let Err(e) = self.rados_meta(name)?.remove() {
            return Err(format!(
                "its metadata object {} could not be removed ({e}); it and the data objects {}.* stay \
                 in RADOS pool '{}'",
                Placement::meta_object(name),
                Placement::data_prefix(name),
                self.placement.rados_pool
            ));
        }
        disk.remove_objects().map_err(|e| {
            format!(
                "its metadata is gone, but data objects {}.* stay in RADOS pool '{}' ('rados rm' removes them): {e}",
                Placement::data_prefix(name),
                self.placement.rados_pool
            )
        })
    }
}
