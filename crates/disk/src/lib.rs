//! Member disks of a Tessera pool.
//!
//! A disk is anything implementing [`BlockDevice`]: a regular file or block device opened
//! with direct I/O ([`FileDisk`]), an in-memory disk for tests ([`MemDisk`]), a wrapper
//! that injects faults ([`FaultyDisk`]), or one with a volatile write cache that a power cut
//! empties ([`VolatileDisk`]). The first [`DATA_OFFSET`] bytes of every disk are
//! reserved; the [`Label`] that ties the disk to its pool lives at offset 0.

mod aligned;
mod disk_io;
mod error;
pub mod eventfd;
mod faulty;
mod file;
mod label;
mod mem;
mod meter;
mod pace;
mod read_ring;
mod read_spread;
mod read_via;
mod skip;
mod unit_pieces;
mod uring;
mod volatile;
mod write_many;

pub use aligned::AlignedBuf;
pub use disk_io::{DiskIo, DiskOp, MeteredDisk, OpFigures, LATENCY_BUCKETS};
pub use error::DiskError;
pub use faulty::{FaultOp, Faults, FaultyDisk};
pub use file::FileDisk;
pub use label::{
    read_label, rewrite_label, verify_label, wipe_label, write_new_label, Label, LabelError, LABEL_VERSION,
    MAX_POOL_NAME,
};
pub use mem::MemDisk;
pub use meter::{IoMeter, IoOp};
pub use pace::Pace;
pub use read_ring::{DirectWrite, ReadRing, RingRead, RingWrite};
pub use read_spread::{read_spread, SpreadRead};
pub use read_via::{AsyncReader, AsyncWriter, ReadDone, ReadVia};
pub use skip::{io_uring_available, skip};
pub use unit_pieces::{unit_pieces, UnitPiece};
pub use volatile::{CutReport, PowerSupply, VolatileDisk};
pub use write_many::{write_many, WriteReq};

/// Alignment unit of every I/O the upper layers issue.
pub const SECTOR: usize = 4096;
/// Size of the on-disk label block at offset 0.
pub const LABEL_SIZE: usize = 4096;
/// First byte after the reserved header area (the label lives at offset 0).
pub const DATA_OFFSET: u64 = 1 << 20;

/// A disk that reads and writes whole sectors at byte offsets.
pub trait BlockDevice: Send + Sync + 'static {
    /// The path (or label) of the disk, for messages.
    fn path(&self) -> &str;
    /// Usable size in bytes, always a multiple of [`SECTOR`].
    fn size(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset`. `offset` and `buf.len()` must be multiples
    /// of [`SECTOR`], `buf.len() > 0`, and the range must lie within [`size`](Self::size).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError>;
    /// Writes all of `buf` at `offset`, with the same rules as [`read_at`](Self::read_at).
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError>;
    /// Makes every completed write durable (fdatasync for files and block devices).
    fn flush(&self) -> Result<(), DiskError>;
    /// Makes sure that writes to `[offset, offset + len)` will not fail for want of space in
    /// the storage behind the disk. A sparse file takes its blocks only when written, so once
    /// its file system is full a write to a range never written fails; a file disk has the
    /// file system allocate the range now instead. An error for which
    /// [`DiskError::is_no_space`] is true says the storage is full, not that the disk is
    /// faulty. Disks with nothing to reserve (block devices, memory) do nothing.
    fn reserve(&self, offset: u64, len: u64) -> Result<(), DiskError> {
        let _ = (offset, len);
        Ok(())
    }
    /// Reads every request, as [`read_at`](Self::read_at) would, with one result per request
    /// in order. Backends that can have many reads in flight at once (io_uring) override
    /// this; the default reads one after the other.
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> Vec<Result<(), DiskError>> {
        reqs.iter_mut().map(|r| self.read_at(r.buf, r.offset)).collect()
    }
    /// A descriptor a caller may submit reads and writes to on an io_uring of its own, with
    /// the rules of [`read_at`](Self::read_at) (whole sectors, within [`size`](Self::size),
    /// buffers aligned to [`SECTOR`]), while it holds a reference to the disk. None for disks
    /// whose I/O is not plain I/O on a descriptor (in memory, fault injection).
    fn uring_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// How a caller with a [`ReadRing`] of its own reads the disk without waiting: on its
    /// [`uring_fd`](Self::uring_fd) by default, or by starting reads with the disk. None for
    /// disks that take no reads but their own calls.
    fn read_via(&self) -> Option<ReadVia> {
        self.uring_fd().map(ReadVia::Uring)
    }
    /// How a caller with a [`ReadRing`] of its own writes the disk without waiting: by
    /// starting writes with the disk, which completes them once they are where a flush would
    /// put them (so a write so completed needs no flush of its own). None (the default) for
    /// disks that take no writes but their own calls.
    fn write_via(&self) -> Option<std::sync::Arc<dyn AsyncWriter>> {
        None
    }
    /// Where the disk's I/O is counted, for callers that do I/O on its
    /// [`uring_fd`](Self::uring_fd) themselves. None for a disk nobody counts.
    fn io(&self) -> Option<&std::sync::Arc<DiskIo>> {
        None
    }
}

/// One read of a [`BlockDevice::read_many`] batch.
pub struct ReadReq<'a> {
    pub buf: &'a mut [u8],
    pub offset: u64,
}

/// A shared handle to a disk, as the pool holds it.
pub type DiskRef = std::sync::Arc<dyn BlockDevice>;

/// Checks a request against the rules of [`BlockDevice::read_at`]: aligned offset and
/// length, non-zero length (reported as [`DiskError::Unaligned`]), and within `size`.
/// Backends call it before touching their storage.
pub fn check_request(path: &str, op: &'static str, offset: u64, len: usize, size: u64) -> Result<(), DiskError> {
    if len == 0 || !len.is_multiple_of(SECTOR) || !offset.is_multiple_of(SECTOR as u64) {
        return Err(DiskError::Unaligned {
            path: path.to_string(),
            op,
            offset,
            len,
            align: SECTOR,
        });
    }
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DiskError::OutOfRange {
            path: path.to_string(),
            op,
            offset,
            len,
            size,
        }),
    }
}

/// Rounds a byte count down to whole sectors; the tail of a disk that is not a whole
/// sector can never be addressed by an aligned request.
pub(crate) fn round_down_to_sector(size: u64) -> u64 {
    size - size % SECTOR as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = SECTOR as u64;

    #[test]
    fn accepts_aligned_requests_within_size() {
        check_request("d", "read", 0, SECTOR, 4 * S).unwrap();
        check_request("d", "read", 3 * S, SECTOR, 4 * S).unwrap();
        check_request("d", "write", 0, 4 * SECTOR, 4 * S).unwrap();
    }

    #[test]
    fn rejects_unaligned_offset_and_length() {
        for (offset, len) in [(1, SECTOR), (512, SECTOR), (0, 512), (0, SECTOR + 1), (S, 100)] {
            match check_request("d", "read", offset, len, 16 * S) {
                Err(DiskError::Unaligned {
                    offset: o,
                    len: l,
                    align,
                    op,
                    ..
                }) => {
                    assert_eq!((o, l, align, op), (offset, len, SECTOR, "read"));
                }
                other => panic!("{offset}/{len}: expected Unaligned, got {other:?}"),
            }
        }
    }

    #[test]
    fn rejects_zero_length() {
        assert!(matches!(
            check_request("d", "write", 0, 0, 16 * S),
            Err(DiskError::Unaligned { len: 0, .. })
        ));
    }

    #[test]
    fn rejects_out_of_range_and_overflow() {
        assert!(matches!(
            check_request("d", "read", 4 * S, SECTOR, 4 * S),
            Err(DiskError::OutOfRange { size, .. }) if size == 4 * S
        ));
        assert!(matches!(
            check_request("d", "read", 3 * S, 2 * SECTOR, 4 * S),
            Err(DiskError::OutOfRange { .. })
        ));
        let top = u64::MAX - (u64::MAX % S);
        assert!(matches!(
            check_request("d", "read", top, SECTOR, u64::MAX),
            Err(DiskError::OutOfRange { .. })
        ));
    }

    #[test]
    fn rounds_size_down() {
        assert_eq!(round_down_to_sector(0), 0);
        assert_eq!(round_down_to_sector(S - 1), 0);
        assert_eq!(round_down_to_sector(5 * S + 17), 5 * S);
        assert_eq!(round_down_to_sector(5 * S), 5 * S);
    }
}
