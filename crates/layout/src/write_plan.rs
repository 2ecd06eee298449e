//! Write plans: where a write of a set's logical range goes on the disks, for a caller that
//! starts the disk writes itself and goes on with other work while they are in flight (the
//! NBD server's connection loop), as [`Layouts::plan_read`] does for reads.
//!
//! Only a write that is nothing but its disk writes can be planned: one copy of each piece
//! (no mirror to keep equal, no parity to compute), no block checksums to record, no
//! replacement slab being filled, and disks that write in the background
//! ([`BlockDevice::write_via`](tessera_disk::BlockDevice::write_via)) and whose completion
//! means durable, as a pool on RADOS has. Such a set records no regions in the stripe
//! journal (nothing to resync from), and rebuild, scrub and spot repair have no other copy to
//! act from. Everything else goes through [`Layouts::write`].

use tessera_disk::{DirectWrite, DiskRef};
use tessera_pool::SlabRef;

use crate::geometry::{data_members, split};
use crate::layouts::Layouts;
use crate::slabset::SlabSet;
use crate::spec::LayoutKind;

// A planned write marks no slab (`Pool::mark_write`): its disk's completion means durable,
// so once answered nothing of it waits for a flush, and one in flight when the disk is lost
// either lands whole or fails to its writer, who writes it again the other way.

/// A disk write of a planned request, on `disk` (started with its `write_via`).
pub struct DiskWrite {
    pub disk: DiskRef,
    pub write: DirectWrite,
}

impl Layouts {
    /// Appends the disk writes of `len` bytes at `offset` of `set` (the request's data from
    /// `buf_off`) to `out`, with `members` held by the caller until they complete. False,
    /// having added nothing, when the write is more than its disk writes (see the module) or
    /// a member is not writable: the caller writes with [`write`](Self::write). A write that
    /// fails on the disk is written again that way too (which tells why, and fails what
    /// must be failed).
    pub fn plan_write(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        offset: u64,
        len: usize,
        buf_off: usize,
        out: &mut Vec<DiskWrite>,
    ) -> bool {
        let spec = &set.spec;
        if spec.kind != LayoutKind::Simple || spec.tolerance() != 0 || self.sums().enabled() {
            return false;
        }
        if self.check(set, offset, len).is_err() {
            return false;
        }
        // A rebuild sets the replacement, then waits for the members held (this plan's
        // caller holds them until its writes are done) before it copies.
        match set.replacement.try_read() {
            Some(r) if r.is_none() => {}
            _ => return false,
        }
        let start = out.len();
        for piece in split(spec, offset, len) {
            let m = data_members(spec, piece.row, piece.data_col);
            let slab = members[m[0]];
            let mo = piece.member_offset(spec);
            let planned = self.member_dev(slab).and_then(|disk| {
                let writer = disk.write_via()?;
                // Space first, as a synchronous write reserves it.
                self.reserve_one(&disk, slab, mo, piece.len).ok()?;
                Some(DiskWrite {
                    write: DirectWrite {
                        writer,
                        offset: self.pool.slab_offset(slab) + mo,
                        buf_off: buf_off + piece.buf_off,
                        len: piece.len,
                        io: disk.io().cloned(),
                    },
                    disk,
                })
            });
            match planned {
                Some(w) => out.push(w),
                None => {
                    out.truncate(start);
                    return false;
                }
            }
        }
        true
    }
}
