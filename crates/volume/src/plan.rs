//! Read plans: where the data of a read lies on the disks, for a caller that submits the disk
//! reads to an io_uring of its own and goes on with other work while they are in flight (the
//! NBD server's connection loop, an iSCSI session's reader). The plan holds the grains and slab sets it read from until
//! it is dropped, as a synchronous read holds them for its duration, so that no write,
//! relocation or rebuild can change what it points at before the data has arrived.

use std::ops::Range;

use tessera_layout::{DiskRead, MembersGuard};

use crate::locks::OwnedReadGuard;
use crate::packed::unpack;
use crate::space::{is_packed, Loc};
use crate::vdisk::{grain_pieces, sector_envelope, Vdisk};

/// The disk reads that fill a buffer with `len` bytes of a vdisk, and the parts of that
/// buffer that read as zeros (unmapped grains). Submit every read, zero every part, then
/// drop the plan once all reads have completed; a read that fails or comes back short is
/// done again with [`Vdisk::read`], which reads around failures.
pub struct ReadPlan {
    pub reads: Vec<DiskRead>,
    pub zeros: Vec<Range<usize>>,
    /// Compressed grains: their reads bring the sectors of the pack slot that hold the piece
    /// into the grain's place in the buffer, and [`finish`](Self::finish) decompresses them
    /// there.
    packed: Vec<PackedRead>,
    _grains: Vec<OwnedReadGuard>,
    /// The members of each set read from, by set id.
    _members: Vec<(u32, MembersGuard)>,
}

/// Compressed grains a plan takes at most.
const PLANNED_PACKED: usize = 4;

/// A compressed grain of a plan: where its place in the buffer starts, the grain size, and
/// where in that place the piece's stored form starts, and its length.
struct PackedRead {
    loc: Loc,
    buf_off: usize,
    grain: usize,
    skip: usize,
    len: usize,
}

impl ReadPlan {
    /// Once every read has completed: true if what they brought into `buf` (the buffer the
    /// plan was made for) matches the blocks' checksums, with the compressed grains
    /// decompressed in place; if not, read again with [`Vdisk::read`] (which reports a
    /// grain that cannot be read back).
    pub fn finish(&self, buf: &mut [u8]) -> bool {
        if !self.reads.iter().all(|r| r.verify(&buf[r.buf_off..r.buf_off + r.len])) {
            return false;
        }
        self.packed.iter().all(|p| {
            let stored = buf[p.buf_off + p.skip..p.buf_off + p.skip + p.len].to_vec();
            unpack(p.loc, &stored, &mut buf[p.buf_off..p.buf_off + p.grain]).is_ok()
        })
    }
}

impl Vdisk {
    /// A plan for reading `len` bytes at `offset`, or None when this read must go through
    /// [`read`](Vdisk::read): an invalid range (which `read` reports), a grain held by a
    /// writer or a set by a rebuild (this never blocks), a part of a sector, a member that is
    /// not readable, a disk that takes no reads from a caller's ring, or data that the
    /// write-back cache holds and has not destaged yet.
    pub fn try_plan_read(&self, offset: u64, len: usize) -> Option<ReadPlan> {
        self.check_range(offset, len as u64).ok()?;
        let grain = self.class.grain;
        let pieces: Vec<_> = grain_pieces(grain, offset, len as u64).collect();
        let grains = self.s.locks.try_read_owned(pieces.iter().map(|p| (self.id, p.grain)))?;
        let mut plan = ReadPlan {
            reads: Vec::with_capacity(pieces.len()),
            zeros: Vec::new(),
            packed: Vec::new(),
            _grains: grains,
            _members: Vec::new(),
        };
        for p in pieces {
            let range = p.buf_off..p.buf_off + p.len;
            let l = self.entry(p.grain);
            if l == 0 {
                match plan.zeros.last_mut() {
                    Some(z) if z.end == range.start => z.end = range.end,
                    _ => plan.zeros.push(range),
                }
                continue;
            }
            let sector = tessera_disk::SECTOR as u64;
            if p.off % sector != 0 || p.len as u64 % sector != 0 {
                return None;
            }
            // Where on the set to read, and how much: the grain's part of its slot, or for a
            // compressed grain (read whole), the sectors of its pack slot that hold the piece,
            // which fit in the grain's place.
            let (set, at, len) = if is_packed(l) {
                // Decompression runs on the caller's thread: a plan takes the few compressed
                // grains of a small read; a large read goes the ordinary way, decompressed by
                // the workers, one read per pack slot.
                if p.off != 0 || p.len as u64 != grain || plan.packed.len() >= PLANNED_PACKED {
                    return None;
                }
                let (set, off, len) = self.s.space.locate_piece(l).ok()?;
                let (a, b) = sector_envelope(off, len);
                if b - a > grain {
                    // A piece that runs on into the next slot may take more sectors than
                    // the grain's place holds.
                    return None;
                }
                plan.packed.push(PackedRead {
                    loc: l,
                    buf_off: p.buf_off,
                    grain: grain as usize,
                    skip: (off - a) as usize,
                    len,
                });
                (set, a, (b - a) as usize)
            } else {
                let (set, base) = self.s.space.locate(l).ok()?;
                (set, base + p.off, p.len)
            };
            // Data the write-back log holds is not on the disks yet. The grain locks held keep
            // any write out until the plan is dropped; a destage meanwhile writes the same data.
            if self.s.cache.holds_dirty(set.id, at, len as u64) {
                return None;
            }
            let held = match plan._members.iter().position(|(id, _)| *id == set.id) {
                Some(i) => i,
                None => {
                    plan._members.push((set.id, set.try_members()?));
                    plan._members.len() - 1
                }
            };
            let members = &plan._members[held].1;
            if !self
                .s
                .layouts
                .plan_read(&set, members, at, len, p.buf_off, &mut plan.reads)
            {
                return None;
            }
        }
        merge(&mut plan.reads);
        Some(plan)
    }
}

/// Joins reads that continue each other on one disk and in the buffer into one read, in
/// place: the grains of a large read are usually neighbours on the disk.
fn merge(reads: &mut Vec<DiskRead>) {
    // dedup_by hands each read with the last one kept; a read merged into it is dropped.
    reads.dedup_by(|r, last| {
        let joins = last.fd == r.fd
            && last.offset + last.len as u64 == r.offset
            && last.buf_off + last.len == r.buf_off
            && last.len + r.len <= MAX_MERGED;
        if joins {
            last.join(r);
        }
        joins
    });
}

/// A merged read covers this much at most.
const MAX_MERGED: usize = 1 << 20;
