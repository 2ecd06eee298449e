//! The block backend: what SCSI emulation needs of the storage under a LUN, and nothing
//! more. A Tessera vdisk is one (tessera-vdisk-lun), [`RamBackend`](crate::RamBackend) another
//! (tests, fuzzing). The emulation owns this interface, as LIO's `sbc_ops` and SPDK's bdev do,
//! so that it builds, is tested and is fuzzed without the engine and its metadata store.

use std::any::Any;

/// What a backend error means to the initiator: the sense a command gets follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendErrorKind {
    /// The pool has no space for the write: SPACE ALLOCATION FAILED WRITE PROTECT, never a
    /// silent loss.
    NoSpace,
    /// The medium failed (lost redundancy, a disk error): a read or write error.
    Medium,
    /// The storage behind refused the command for now (this gateway fenced off by a newer
    /// owner, its cluster unreachable) and nothing was done: NOT READY, ASYMMETRIC ACCESS
    /// STATE TRANSITION, which a host retries (through another path, if it has one) rather
    /// than fail to its file system as it would a medium error.
    Refused,
    /// Anything else: INTERNAL TARGET FAILURE.
    Internal,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendError {
    pub kind: BackendErrorKind,
    pub message: String,
}

impl BackendError {
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> BackendError {
        BackendError {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BackendError {}

pub type BackendResult<T> = Result<T, BackendError>;

/// A run of bytes that is mapped (holds data) or not (reads as zeros), for GET LBA STATUS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub mapped: bool,
}

/// A point-in-time image of ranges of a backend laid end to end: what a ROD token
/// represents. Cheap to keep for a vdisk (grain references, not data).
pub trait FrozenImage: Send + Sync + std::fmt::Debug {
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn block_size(&self) -> u32;
    /// The pool whose space the image holds ("" for none): its tokens end when the pool
    /// is exported.
    fn pool(&self) -> &str {
        ""
    }
    /// The vdisk of that pool the image was frozen from ("" for none): its tokens end when
    /// the vdisk is deleted.
    fn vdisk(&self) -> &str {
        ""
    }
    /// Reads `out.len()` bytes of the image at `offset`.
    fn read(&self, offset: u64, out: &mut [u8]) -> BackendResult<()>;
    /// For a backend that recognises its own images (to share data instead of copying it).
    fn as_any(&self) -> &dyn Any;
}

/// One read a transport submits to its own ring: `len` bytes at `offset` of the disk `via`
/// reaches, into the command's buffer at `buf_off`.
#[derive(Clone)]
pub struct DirectRead {
    pub via: tessera_disk::ReadVia,
    pub offset: u64,
    pub buf_off: usize,
    pub len: usize,
    /// Where the disk counts its I/O.
    pub io: Option<std::sync::Arc<tessera_disk::DiskIo>>,
    /// The read goes to the plan's own scratch buffer ([`PlanHold::scratch`]), `buf_off`
    /// into it, not to the command's buffer.
    pub scratch: bool,
}

/// One write a transport starts itself (on a disk that writes in the background,
/// [`BlockDevice::write_via`](tessera_disk::BlockDevice::write_via)).
pub use tessera_disk::DirectWrite;

/// The disk writes that put a WRITE's data in place, and what keeps them valid (the
/// backend's locks) until the plan is dropped.
pub struct WritePlan {
    pub writes: Vec<DirectWrite>,
    pub hold: Box<dyn WriteHold>,
}

/// What keeps a write plan's writes valid, and records them once done.
pub trait WriteHold: Send {
    /// Once every write completed whole: records what the backend's own write records
    /// after it. A plan dropped without this wrote nothing it vouches for: the WRITE then
    /// runs the ordinary way.
    fn finish(self: Box<Self>);
}

/// The disk reads that fill a READ's buffer, and what keeps them valid (the backend's
/// locks) until the plan is dropped. Parts of the buffer no read covers read as zeros.
pub struct ReadPlan {
    pub reads: Vec<DirectRead>,
    pub hold: Box<dyn PlanHold>,
}

/// What keeps a plan's reads valid, and checks what they brought.
pub trait PlanHold: Send {
    /// Once every read has completed: true if the bytes they brought into the command's
    /// buffer are those written (the backend's checksums), made ready in place (compressed
    /// data decompressed); false sends the READ down the ordinary path, which reads around
    /// the bad copy and repairs it.
    fn finish(&self, buf: &mut [u8]) -> bool;

    /// The start of the plan's scratch buffer, for its reads marked `scratch`; it stays
    /// where it is while the plan lives.
    fn scratch(&mut self) -> *mut u8;
}

/// Writes `[from, from + len)` of `image` at `at` of `to`, a MiB at a time: a paste by
/// copying.
pub fn copy_image<B: BlockBackend + ?Sized>(
    to: &B,
    at: u64,
    image: &dyn FrozenImage,
    from: u64,
    len: u64,
) -> BackendResult<()> {
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done) as usize;
        image.read(from + done, &mut buf[..n])?;
        to.write(at + done, &buf[..n], false)?;
        done += n as u64;
    }
    Ok(())
}

/// The storage under a LUN. Offsets and lengths are in bytes; the emulation checks them
/// against [`size`](Self::size) and the block size before it calls.
pub trait BlockBackend: Send + Sync {
    /// For messages and logs.
    fn name(&self) -> String;
    fn size(&self) -> u64;
    fn block_size(&self) -> u32;
    fn physical_block_size(&self) -> u32;
    /// The allocation unit: the optimal unmap granularity VPD page 0xB0 reports.
    fn grain_size(&self) -> u64;
    /// Thin provisioned: unwritten blocks hold no space.
    fn thin(&self) -> bool;
    /// For the crate that made the backend, to reach what it wraps.
    fn as_any(&self) -> &dyn Any;

    fn read(&self, offset: u64, buf: &mut [u8]) -> BackendResult<()>;
    /// Reads each `(offset, buf)`; one result per request. Backends that can submit them
    /// together (one request to each disk) should.
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<BackendResult<()>> {
        reqs.iter_mut().map(|(o, b)| self.read(*o, b)).collect()
    }
    /// Writes `data` at `offset`; `durable`: on stable storage before this returns.
    fn write(&self, offset: u64, data: &[u8], durable: bool) -> BackendResult<()>;
    /// Makes `len` bytes read as zeros; `unmap`: their space may be given back.
    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool, durable: bool) -> BackendResult<()>;
    /// Gives the space of the range back (UNMAP): it reads as zeros.
    fn trim(&self, offset: u64, len: u64) -> BackendResult<()>;
    /// Makes every write that completed durable.
    fn flush(&self) -> BackendResult<()>;
    /// Mapped and unmapped runs over the range.
    fn extents(&self, offset: u64, len: u64) -> BackendResult<Vec<Extent>>;

    /// A point-in-time image of the ranges `(offset, len)`, in order (POPULATE TOKEN).
    fn freeze(&self, ranges: &[(u64, u64)]) -> BackendResult<Box<dyn FrozenImage>>;
    /// The memory, in bytes, that [`freeze`](Self::freeze) of `ranges` would hold while its
    /// token lives, judged without making it: counted against the tokens' budget first. By
    /// default the ranges' length, for an image that copies its data.
    fn freeze_footprint(&self, ranges: &[(u64, u64)]) -> u64 {
        ranges.iter().map(|r| r.1).sum()
    }
    /// Makes `[at, at + len)` read as `[from, from + len)` of `image` (WRITE USING TOKEN). By
    /// default the data is copied; a backend shares it when the image is its own kind.
    fn paste(&self, at: u64, image: &dyn FrozenImage, from: u64, len: u64) -> BackendResult<()> {
        copy_image(self, at, image, from, len)
    }

    /// The disk reads of a READ of `len` bytes at `offset`, for a transport with a ring of
    /// its own; None when the read must go through [`read`](Self::read) (the default: a
    /// backend without files to read from). Must not block.
    fn try_plan_read(&self, _offset: u64, _len: usize) -> Option<ReadPlan> {
        None
    }

    /// Runs `run` for the host named `initiator` (an iSCSI initiator's name, which all its
    /// sessions share): a write of it whose data is lost before a flush is then reported at
    /// that host's next flush, even if another host's flush found the loss first. By default,
    /// `run` runs as it is (a backend that loses nothing a flush vouched for).
    fn as_writer(&self, _initiator: &str, run: &mut dyn FnMut()) {
        run()
    }

    /// The disk writes of a WRITE of `len` bytes at `offset` that needs nothing but them (an
    /// overwrite in place on disks that write in the background, and are durable when they
    /// say done), for a transport with a ring of its own; None when it must go through
    /// [`write`](Self::write) (the default). Must not block.
    fn try_plan_write(&self, _offset: u64, _len: usize) -> Option<WritePlan> {
        None
    }
}
