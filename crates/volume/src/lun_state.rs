//! What a logical unit keeps about itself (its persistent reservations, its mode settings),
//! kept in the pool's metadata beside its vdisk, for pools whose metadata several gateways
//! open in turn (a pool on RADOS): the gateway that takes such a pool over finds the state
//! the last owner left, and a replaced owner cannot change it (its metadata writes are
//! fenced like its data writes). The records go with the vdisk when it is deleted.

use tessera_pool::{MetaBatch, MetaStore, CF_POOL};

use crate::engine::Engine;
use crate::error::Result;
use crate::vdisk::Vdisk;

/// The records of one vdisk's logical unit: this prefix, its id (big endian), then the
/// record's kind.
const PREFIX: &[u8] = b"lun-state\0";

fn key_of(vdisk: u64, kind: &str) -> Vec<u8> {
    let mut k = range_of(vdisk).0;
    k.extend_from_slice(kind.as_bytes());
    k
}

/// The keys of every record of a vdisk's logical unit: [start, end).
fn range_of(vdisk: u64) -> (Vec<u8>, Vec<u8>) {
    let at = |id: u64| [PREFIX, &id.to_be_bytes()[..]].concat();
    (at(vdisk), at(vdisk + 1))
}

/// Deletes the records of a vdisk's logical unit with the rest of the vdisk.
pub(crate) fn delete_all(b: &mut MetaBatch, vdisk: u64) {
    let (from, to) = range_of(vdisk);
    b.delete_range(CF_POOL, from, to);
}

impl Engine {
    /// Whether other machines open this pool's metadata too (a pool on RADOS, whose gateways
    /// take it over from each other): its logical units then keep their state in it.
    pub fn metadata_shared(&self) -> bool {
        self.pool().meta().shared()
    }

    /// The record `kind` of the logical unit of vdisk `vdisk` (its id) as `meta` holds it,
    /// read without opening the pool (a gateway presenting a LUN it does not own).
    pub fn recorded_lun_state(meta: &MetaStore, vdisk: u64, kind: &str) -> Result<Option<Vec<u8>>> {
        Ok(meta.get(CF_POOL, &key_of(vdisk, kind))?)
    }

    /// The record `kind` of vdisk `v`'s logical unit, if one was saved.
    pub fn lun_state(&self, v: &Vdisk, kind: &str) -> Result<Option<Vec<u8>>> {
        Self::recorded_lun_state(self.pool().meta(), v.id(), kind)
    }

    /// Saves (or, with `None`, forgets) the record `kind` of vdisk `v`'s logical unit,
    /// durably before it returns. Refused once the vdisk is being deleted, so that no record
    /// outlives it.
    pub fn set_lun_state(&self, v: &Vdisk, kind: &str, value: Option<&[u8]>) -> Result<()> {
        self.set_lun_states(&[(v, kind, value)])
    }

    /// Saves (or forgets) records of several vdisks' logical units in one commit: all of them
    /// or none.
    pub fn set_lun_states(&self, changes: &[(&Vdisk, &str, Option<&[u8]>)]) -> Result<()> {
        let _alive = changes
            .iter()
            .map(|(v, _, _)| v.enter_unchanged())
            .collect::<Result<Vec<_>>>()?;
        let mut b = MetaBatch::new();
        for (v, kind, value) in changes {
            match value {
                Some(bytes) => b.put(CF_POOL, key_of(v.id(), kind), bytes),
                None => b.delete(CF_POOL, key_of(v.id(), kind)),
            }
        }
        Ok(self.pool().meta().commit(b, true)?)
    }
}
