//! A disk on RADOS for one owner: the engine's [`BlockDevice`] over objects of
//! [`OBJECT_BYTES`] (`PREFIX.INDEX`, the index in 16 hex digits), every write fenced by the
//! owner's epoch ([`FencedWriter`]). A pool built on such disks keeps its data in the Ceph
//! cluster, with Ceph's redundancy; a gateway that was replaced cannot write to it.
//!
//! Objects are made by their first write, so the disk is thin: a read of an object never
//! written, or past the end of a shorter one, returns zeros. A write is acknowledged by the
//! OSDs once every replica has it, so a flush has nothing left to do.

use tessera_disk::{check_request, BlockDevice, DiskError, ReadReq};
use tessera_rados::{Pool, RadosError, ReadExtent};

use crate::fence::FencedWriter;

/// Bytes per object, as librbd's default: large enough that a sequential stream costs few
/// operations, small enough that objects spread over the placement groups.
pub const OBJECT_BYTES: u64 = 4 << 20;

pub struct FencedDisk {
    pool: Pool<'static>,
    prefix: String,
    size: u64,
    epoch: i64,
    path: String,
}

impl FencedDisk {
    /// A disk of `size` bytes (whole sectors) in the objects `PREFIX.*` of `pool`, written
    /// under `epoch`.
    pub fn new(pool: Pool<'static>, prefix: &str, size: u64, epoch: i64) -> Result<FencedDisk, DiskError> {
        let path = format!("rados:{}/{prefix}", pool.name());
        if size == 0 || !size.is_multiple_of(tessera_disk::SECTOR as u64) {
            return Err(DiskError::Unusable {
                path,
                reason: format!("a size of {size} bytes is not a whole number of sectors"),
            });
        }
        if prefix.is_empty() || prefix.contains('\0') {
            return Err(DiskError::Unusable {
                path,
                reason: "an object prefix must be a non-empty name".into(),
            });
        }
        Ok(FencedDisk {
            pool,
            prefix: prefix.to_string(),
            size,
            epoch,
            path,
        })
    }

    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Removes every object of the disk (what a destroyed pool leaves in the cluster); the
    /// objects never written are skipped.
    pub fn remove_objects(&self) -> Result<(), RadosError> {
        for index in 0..self.size.div_ceil(OBJECT_BYTES) {
            match self.pool.remove(&self.oid(index)) {
                Err(e) if e.errno() != Some(libc::ENOENT) => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    fn oid(&self, index: u64) -> String {
        format!("{}.{index:016x}", self.prefix)
    }

    /// The object pieces of [offset, offset + len): (object index, offset in it, range of the
    /// request's buffer).
    fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, u64, std::ops::Range<usize>)> {
        let end = offset + len as u64;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let index = at / OBJECT_BYTES;
            let in_obj = at % OBJECT_BYTES;
            let n = (OBJECT_BYTES - in_obj).min(end - at);
            let r = (at - offset) as usize..(at - offset + n) as usize;
            at += n;
            Some((index, in_obj, r))
        })
    }

    /// Every error of the cluster is a refusal of this request, not a fault of the disk:
    /// the cluster keeps its own redundancy, and a fenced owner must not mark the pool's only
    /// disk failed on its way out.
    fn io_error(&self, op: &'static str, offset: u64, len: usize, e: RadosError) -> DiskError {
        let reason = if e.is_fenced() {
            format!("this gateway was fenced off by a newer owner ({e})")
        } else if e.is_guard_failure() {
            format!("a newer owner wrote here ({e})")
        } else {
            e.to_string()
        };
        DiskError::Unavailable {
            path: self.path.clone(),
            op,
            offset,
            len,
            reason,
        }
    }
}

impl BlockDevice for FencedDisk {
    fn path(&self) -> &str {
        &self.path
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        check_request(&self.path, "read", offset, buf.len(), self.size)?;
        for (index, in_obj, r) in Self::pieces(offset, buf.len()) {
            let part = &mut buf[r];
            let got = match self.pool.read(&self.oid(index), in_obj, part) {
                Ok(n) => n,
                // Never written: zeros.
                Err(e) if e.errno() == Some(libc::ENOENT) => 0,
                Err(e) => return Err(self.io_error("read", offset, part.len(), e)),
            };
            // Past the end of what was written: zeros too.
            part[got..].fill(0);
        }
        Ok(())
    }

    /// Every request's object pieces in flight at once, the pieces of one object in one
    /// operation: a read spanning several grains, or a queue of them, costs one round trip.
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> Vec<Result<(), DiskError>> {
        let mut results: Vec<Result<(), DiskError>> = reqs
            .iter()
            .map(|r| check_request(&self.path, "read", r.offset, r.buf.len(), self.size))
            .collect();
        let mut extents: Vec<ReadExtent<'_>> = Vec::new();
        // Per extent: its request, and the request's offset and length (for an error).
        let mut owners: Vec<(usize, u64, usize)> = Vec::new();
        for (i, r) in reqs.iter_mut().enumerate() {
            if results[i].is_err() {
                continue;
            }
            let (offset, len) = (r.offset, r.buf.len());
            let mut rest: &mut [u8] = r.buf;
            for (index, in_obj, range) in Self::pieces(offset, len) {
                let (part, tail) = std::mem::take(&mut rest).split_at_mut(range.len());
                rest = tail;
                extents.push(ReadExtent {
                    oid: self.oid(index),
                    offset: in_obj,
                    buf: part,
                });
                owners.push((i, offset, len));
            }
        }
        let got = self.pool.read_extents(&mut extents);
        for ((extent, got), (i, offset, len)) in extents.iter_mut().zip(got).zip(owners) {
            let n = match got {
                Ok(n) => n,
                // Never written: zeros.
                Err(e) if e.errno() == Some(libc::ENOENT) => 0,
                Err(e) => {
                    if results[i].is_ok() {
                        results[i] = Err(self.io_error("read", offset, len, e));
                    }
                    continue;
                }
            };
            // Past the end of what was written: zeros too.
            extent.buf[n..].fill(0);
        }
        results
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        check_request(&self.path, "write", offset, buf.len(), self.size)?;
        let w = FencedWriter::new(&self.pool, self.epoch);
        for (index, in_obj, r) in Self::pieces(offset, buf.len()) {
            w.write(&self.oid(index), in_obj, &buf[r.clone()])
                .map_err(|e| self.io_error("write", offset + r.start as u64, r.len(), e))?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), DiskError> {
        // Every acknowledged write is on every replica already.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_cut_at_object_boundaries() {
        let got: Vec<_> = FencedDisk::pieces(OBJECT_BYTES - 4096, 3 * 4096).collect();
        assert_eq!(got, vec![(0, OBJECT_BYTES - 4096, 0..4096), (1, 0, 4096..3 * 4096),]);
        let whole: Vec<_> = FencedDisk::pieces(2 * OBJECT_BYTES, OBJECT_BYTES as usize).collect();
        assert_eq!(whole, vec![(2, 0, 0..OBJECT_BYTES as usize)]);
    }
}
