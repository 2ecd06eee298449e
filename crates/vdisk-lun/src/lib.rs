//! A vdisk as the block backend of a SCSI logical unit. The SCSI emulation owns the
//! [`BlockBackend`] interface and knows nothing of the engine; this crate is where the two
//! meet, so that neither depends on the other.

use std::any::Any;
use std::sync::Arc;

use tessera_scsi::{
    copy_image, BackendError, BackendErrorKind, BackendResult, BlockBackend, DirectRead, Extent, FrozenImage, Lun,
    PlanHold, ReadPlan, WriteHold,
};
use tessera_volume::{Frozen, Provisioning, Vdisk, VolumeError};

/// A vdisk serving a LUN.
pub struct VdiskBackend(Arc<Vdisk>);

/// A vdisk's write plan, held for the transport until its writes completed.
struct WriteHeld(tessera_volume::WritePlan);

impl WriteHold for WriteHeld {
    fn finish(self: Box<Self>) {
        self.0.finish();
    }
}

impl VdiskBackend {
    pub fn new(vdisk: Arc<Vdisk>) -> Arc<dyn BlockBackend> {
        Arc::new(VdiskBackend(vdisk))
    }
}

/// A LUN over `vdisk`; `uid` distinguishes vdisks across pools (see [`Lun::new`]).
pub fn vdisk_lun(vdisk: Arc<Vdisk>, uid: u128, read_only: bool) -> Lun {
    Lun::new(VdiskBackend::new(vdisk), uid, read_only)
}

/// The vdisk under a LUN, if a vdisk is what it serves.
pub fn vdisk_of(lun: &Lun) -> Option<&Arc<Vdisk>> {
    lun.backend().as_any().downcast_ref::<VdiskBackend>().map(|b| &b.0)
}

/// What an engine error means to an initiator.
fn backend_error(e: VolumeError) -> BackendError {
    let kind = if e.is_no_space() {
        BackendErrorKind::NoSpace
    } else if e.is_refused() {
        BackendErrorKind::Refused
    } else {
        match e {
            VolumeError::Layout(_)
            | VolumeError::Pool(_)
            | VolumeError::Cache(_)
            | VolumeError::Lost(_)
            | VolumeError::Corrupt(_) => BackendErrorKind::Medium,
            _ => BackendErrorKind::Internal,
        }
    };
    BackendError::new(kind, e.to_string())
}

impl BlockBackend for VdiskBackend {
    fn name(&self) -> String {
        self.0.name()
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn physical_block_size(&self) -> u32 {
        self.0.physical_block_size()
    }
    fn grain_size(&self) -> u64 {
        self.0.grain_size()
    }
    fn thin(&self) -> bool {
        self.0.config().provisioning == Provisioning::Thin
    }
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> BackendResult<()> {
        self.0.read(offset, buf).map_err(backend_error)
    }
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<BackendResult<()>> {
        self.0
            .read_many(reqs)
            .into_iter()
            .map(|r| r.map_err(backend_error))
            .collect()
    }
    fn write(&self, offset: u64, data: &[u8], durable: bool) -> BackendResult<()> {
        self.0.write(offset, data, durable).map_err(backend_error)
    }
    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool, durable: bool) -> BackendResult<()> {
        self.0.write_zeroes(offset, len, unmap, durable).map_err(backend_error)
    }
    fn trim(&self, offset: u64, len: u64) -> BackendResult<()> {
        self.0.trim(offset, len).map_err(backend_error)
    }
    fn flush(&self) -> BackendResult<()> {
        self.0.flush().map_err(backend_error)
    }
    fn extents(&self, offset: u64, len: u64) -> BackendResult<Vec<Extent>> {
        Ok(self
            .0
            .extents(offset, len)
            .map_err(backend_error)?
            .into_iter()
            .map(|x| Extent {
                offset: x.offset,
                len: x.len,
                mapped: x.mapped,
            })
            .collect())
    }

    fn freeze_footprint(&self, ranges: &[(u64, u64)]) -> u64 {
        self.0.freeze_footprint(ranges)
    }

    fn freeze(&self, ranges: &[(u64, u64)]) -> BackendResult<Box<dyn FrozenImage>> {
        let image = self.0.freeze(ranges).map_err(backend_error)?;
        Ok(Box::new(FrozenVdisk {
            pool: image.pool(),
            vdisk: self.0.name(),
            image,
        }))
    }

    /// Shares grains when the image is a vdisk's (the engine decides whether they can be
    /// shared, and copies what cannot); copies any other image.
    fn paste(&self, at: u64, image: &dyn FrozenImage, from: u64, len: u64) -> BackendResult<()> {
        match image.as_any().downcast_ref::<FrozenVdisk>() {
            Some(f) => self.0.paste(at, &f.image, from, len).map(|_| ()).map_err(backend_error),
            None => copy_image(self, at, image, from, len),
        }
    }

    fn as_writer(&self, initiator: &str, run: &mut dyn FnMut()) {
        tessera_volume::as_writer(tessera_volume::Writer::named(initiator), run)
    }

    fn try_plan_write(&self, offset: u64, len: usize) -> Option<tessera_scsi::WritePlan> {
        let plan = self.0.try_plan_write(offset, len)?;
        let writes = plan.writes.iter().map(|w| w.write.clone()).collect();
        Some(tessera_scsi::WritePlan {
            writes,
            hold: Box::new(WriteHeld(plan)),
        })
    }

    fn try_plan_read(&self, offset: u64, len: usize) -> Option<ReadPlan> {
        let plan = self.0.try_plan_read(offset, len)?;
        let reads = plan
            .reads
            .iter()
            .map(|r| DirectRead {
                via: r.via.clone(),
                offset: r.offset,
                buf_off: r.buf_off,
                len: r.len,
                io: r.disk.io().cloned(),
                scratch: r.scratch,
            })
            .collect();
        Some(ReadPlan {
            reads,
            hold: Box::new(HeldPlan(plan)),
        })
    }
}

/// A vdisk's read plan, held by the transport until its reads complete.
struct HeldPlan(tessera_volume::ReadPlan);

impl PlanHold for HeldPlan {
    fn finish(&self, buf: &mut [u8]) -> bool {
        self.0.finish(buf)
    }

    fn scratch(&mut self) -> *mut u8 {
        self.0.scratch_ptr()
    }
}

/// A point-in-time image of vdisk ranges: grain references, shared again on paste.
#[derive(Debug)]
struct FrozenVdisk {
    image: Frozen,
    pool: String,
    vdisk: String,
}

impl FrozenImage for FrozenVdisk {
    fn len(&self) -> u64 {
        self.image.len()
    }
    fn block_size(&self) -> u32 {
        self.image.block_size()
    }
    fn pool(&self) -> &str {
        &self.pool
    }
    fn vdisk(&self) -> &str {
        &self.vdisk
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> BackendResult<()> {
        self.image.read(offset, out).map_err(backend_error)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
