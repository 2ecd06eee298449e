//! A read-only view of a pool another gateway owns: what this gateway presents of it as
//! standby LUNs.

use std::sync::Arc;

use tessera_ownership::rados_meta::RadosMeta;
use tessera_pool::{MetaStore, Pool};
use tessera_rados::Cluster;
use tessera_volume::Engine;

use super::cluster::*;
use super::*;
use crate::standby::StandbyUnit;
use crate::targets::lun_uid_of;

/// A connection that only reads a pool's metadata, at a gateway that does not own the
/// pool: what it presents of it as standby LUNs. It never writes, so its being fenced
/// off (or not) changes nothing; the owner's connection is another.
pub struct Reader {
    cluster: Arc<Cluster>,
    placement: Placement,
}

impl Reader {
    pub fn connect(placement: &Placement, paths: &DataPaths) -> Result<Reader, String> {
        Ok(Reader {
            cluster: connect(placement, paths)?,
            placement: placement.clone(),
        })
    }

    /// Whether an owner of pool `name` at `epoch` or later has opened it (and so fenced
    /// the owners before it off).
    pub fn opened_since(&self, name: &str, epoch: i64) -> Result<bool, String> {
        let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
        tessera_ownership::rados_meta::written_since(&pool, &Placement::meta_object(name), epoch)
            .map_err(|e| format!("cannot learn who last opened pool {name}: {e}"))
    }

    /// [`Owned::label`], read without owning the pool (nothing is written through it).
    pub fn label(&self, name: &str) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
        label_in(&records_pool(&self.cluster, &self.placement)?, &self.placement, name)
    }

    /// What the metadata of pool `name` records of the vdisks `wanted` ("pool/vdisk"):
    /// those it holds, each with its logical unit's id and mode settings.
    pub fn units(&self, name: &str, wanted: &[String]) -> Result<Vec<(String, StandbyUnit)>, String> {
        let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
        // Epoch 0: nothing is written through it.
        let meta = MetaStore::on(RadosMeta::new(pool, &Placement::meta_object(name), 0));
        let id = Pool::recorded_config(&meta).map_err(|e| e.to_string())?.id.as_u128();
        let mut out = Vec::new();
        for config in Engine::recorded_vdisks(&meta).map_err(|e| e.to_string())? {
            let full = format!("{name}/{}", config.name);
            if !wanted.contains(&full) {
                continue;
            }
            let mode = Engine::recorded_lun_state(&meta, config.id, crate::targets::MODE_RECORD)
                .map_err(|e| e.to_string())?
                .and_then(|b| serde_json::from_slice(&b).ok());
            let unit = StandbyUnit {
                uid: lun_uid_of(id, config.id),
                config,
                mode,
            };
            out.push((full, unit));
        }
        Ok(out)
    }
}
