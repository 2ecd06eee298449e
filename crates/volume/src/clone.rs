//! Snapshots, whole-vdisk clones and clone_range: each a freeze of the source and a paste
//! into the destination, so that they share grains, copy-on-write on both sides afterwards.

use std::sync::Arc;

use tessera_pool::validate_name;

use crate::config::{Provisioning, VdiskSpec, VdiskState};
use crate::engine::Engine;
use crate::error::{Result, VolumeError};
use crate::frozen::{CloneStats, Frozen};
use crate::vdisk::Vdisk;

impl Engine {
    /// A new thin vdisk `name` with the layout, grain and block sizes of `src` (a vdisk or a
    /// snapshot), reading as `src` did at the moment of the call: every grain shared, nothing
    /// copied but a partial last grain. The clone and its source are copy-on-write from then
    /// on, and either can be deleted first.
    pub fn clone_vdisk(&self, src: &str, name: &str) -> Result<(Arc<Vdisk>, CloneStats)> {
        validate_name("vdisk", name).map_err(VolumeError::Invalid)?;
        let s = self.vdisk(src)?;
        let image = s.freeze(&[(0, s.size())])?;
        let spec = Self::thin_spec_like(&s, name);
        self.fill_from(&spec, None, &image)
    }

    /// A read-only point-in-time image of `vdisk`, named `VDISK@SNAPSHOT`. Writes to the vdisk
    /// pause only while its grains are counted; the snapshot shares every grain.
    pub fn snapshot(&self, vdisk: &str, snapshot: &str) -> Result<Arc<Vdisk>> {
        validate_name("snapshot", snapshot).map_err(VolumeError::Invalid)?;
        let s = self.vdisk(vdisk)?;
        if s.is_snapshot() {
            return Err(VolumeError::Invalid(format!(
                "'{vdisk}' is a snapshot; clone it to take snapshots of the clone"
            )));
        }
        let image = s.freeze(&[(0, s.size())])?;
        let spec = Self::thin_spec_like(&s, &format!("{vdisk}@{snapshot}"));
        Ok(self.fill_from(&spec, Some(vdisk.to_string()), &image)?.0)
    }

    /// Snapshots of several vdisks taken at one instant ([`Vdisk::freeze_together`]): a
    /// consistency group. `(vdisk, snapshot)` pairs; all or none are made.
    pub fn snapshot_group(&self, pairs: &[(&str, &str)]) -> Result<Vec<Arc<Vdisk>>> {
        let mut sources = Vec::with_capacity(pairs.len());
        for &(vdisk, snapshot) in pairs {
            validate_name("snapshot", snapshot).map_err(VolumeError::Invalid)?;
            let s = self.vdisk(vdisk)?;
            if s.is_snapshot() {
                return Err(VolumeError::Invalid(format!("'{vdisk}' is a snapshot")));
            }
            if self.vdisk(&format!("{vdisk}@{snapshot}")).is_ok() {
                return Err(VolumeError::Invalid(format!("'{vdisk}@{snapshot}' already exists")));
            }
            sources.push(s);
        }
        let refs: Vec<&Vdisk> = sources.iter().map(|s| &**s).collect();
        let images = Vdisk::freeze_together(&refs)?;
        let mut made: Vec<Arc<Vdisk>> = Vec::with_capacity(pairs.len());
        for ((&(vdisk, snapshot), s), image) in pairs.iter().zip(&sources).zip(&images) {
            let spec = Self::thin_spec_like(s, &format!("{vdisk}@{snapshot}"));
            match self.fill_from(&spec, Some(vdisk.to_string()), image) {
                Ok((v, _)) => made.push(v),
                Err(e) => {
                    for v in made {
                        let _ = self.delete_vdisk(&v.name());
                    }
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    /// The snapshots of `vdisk` (of a vdisk once called so, if it was deleted), oldest first:
    /// in the order they were made, by id (a pool hands ids out in increasing order and never
    /// twice), not by their clock time, which steps back with the clock (an NTP correction, a
    /// machine restored) and would have pruning take the newest for the oldest.
    pub fn snapshots_of(&self, vdisk: &str) -> Vec<Arc<Vdisk>> {
        let mut v: Vec<Arc<Vdisk>> = self
            .vdisks()
            .into_iter()
            .filter(|s| s.config().snapshot_of.as_deref() == Some(vdisk))
            .collect();
        v.sort_by_key(|s| s.id());
        v
    }

    /// A thin vdisk with the layout, grain and block sizes of `s`: what its grains can be
    /// shared with.
    pub(crate) fn thin_spec_like(s: &Vdisk, name: &str) -> VdiskSpec {
        let c = s.config();
        let mut spec = VdiskSpec::new(name, c.size, c.layout.kind);
        spec.copies = Some(c.layout.copies);
        spec.columns = Some(c.layout.columns);
        spec.interleave = Some(c.layout.interleave);
        spec.grain_size = Some(c.grain_size);
        spec.block_size = Some(c.block_size);
        spec.physical_block_size = Some(c.physical_block_size);
        spec.write_cache_size = c.write_cache_size;
        spec.provisioning = Provisioning::Thin;
        spec
    }

    /// Creates a vdisk (marked `Creating` until done) holding a whole frozen image.
    fn fill_from(
        &self,
        spec: &VdiskSpec,
        snapshot_of: Option<String>,
        image: &Frozen,
    ) -> Result<(Arc<Vdisk>, CloneStats)> {
        let v = self.create_with(spec, snapshot_of, VdiskState::Creating)?;
        let done = v
            .paste_into(0, image, 0, image.len())
            .and_then(|stats| self.set_online(&v).map(|_| stats));
        match done {
            Ok(stats) => Ok((v, stats)),
            Err(e) => {
                if let Err(d) = self.delete_vdisk(&spec.name) {
                    tracing::warn!(vdisk = %spec.name, error = %d, "cannot remove the half-made copy");
                }
                Err(e)
            }
        }
    }

    /// Makes [dst_off, dst_off + len) of `dst` read as [src_off, src_off + len) of `src` did
    /// at the moment of the call. Whole grains are shared when both vdisks are in this pool,
    /// have the same layout and grain size and the offsets line up within a grain; the rest is
    /// copied inside the server. Overlapping ranges of one vdisk behave as a memmove.
    pub fn clone_range(&self, src: &Vdisk, src_off: u64, dst: &Vdisk, dst_off: u64, len: u64) -> Result<CloneStats> {
        if !Arc::ptr_eq(&src.s, self.shared()) || !Arc::ptr_eq(&dst.s, self.shared()) {
            return Err(VolumeError::Invalid(
                "clone_range between vdisks of different pools".into(),
            ));
        }
        dst.check_writable()?;
        dst.check_range(dst_off, len)?;
        if src.id == dst.id && src_off == dst_off {
            src.check_range(src_off, len)?;
            return Ok(CloneStats::default());
        }
        let image = src.freeze(&[(src_off, len)])?;
        dst.paste(dst_off, &image, 0, len)
    }
}
