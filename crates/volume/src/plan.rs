//! Read plans: where the data of a read lies on the disks, for a caller that submits the disk
//! reads to an io_uring of its own and goes on with other work while they are in flight (the
//! NBD server's connection loop, an iSCSI session's reader). The plan holds the grains and slab sets it read from until
//! it is dropped, as a synchronous read holds them for its duration, so that no write,
//! relocation or rebuild can change what it points at before the data has arrived.

use std::cell::RefCell;
use std::ops::Range;

use tessera_disk::AlignedBuf;
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
    /// into the grain's place in the buffer (or, for a piece that runs on into the next slot
    /// and takes more sectors than that place, into `scratch`), and
    /// [`finish`](Self::finish) decompresses them there.
    packed: Vec<PackedRead>,
    /// Where the reads marked `scratch` go: the caller submits them to
    /// [`scratch_ptr`](Self::scratch_ptr) plus their `buf_off`.
    scratch: AlignedBuf,
    _grains: Vec<OwnedReadGuard>,
    /// The members of each set read from, by set id.
    _members: Vec<(u32, MembersGuard)>,
}

thread_local! {
    /// Where [`ReadPlan::finish`] copies a stored form out of the place it is decompressed
    /// over: kept per thread, as a connection's thread finishes one plan after another.
    static STORED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Compressed grains a plan takes at most.
const PLANNED_PACKED: usize = 4;

/// A compressed grain of a plan: where its place in the buffer starts, the grain size, and
/// where the piece's stored form starts (in that place, or at `from_scratch` in the scratch
/// buffer), and its length.
struct PackedRead {
    loc: Loc,
    buf_off: usize,
    grain: usize,
    skip: usize,
    len: usize,
    from_scratch: Option<usize>,
}

impl ReadPlan {
    /// Once every read has completed: true if what they brought into `buf` (the buffer the
    /// plan was made for) matches the blocks' checksums, with the compressed grains
    /// decompressed in place; if not, read again with [`Vdisk::read`] (which reports a
    /// grain that cannot be read back).
    pub fn finish(&self, buf: &mut [u8]) -> bool {
        let brought = |r: &DiskRead| {
            let from: &[u8] = if r.scratch { &self.scratch } else { buf };
            r.verify(&from[r.buf_off..r.buf_off + r.len])
        };
        if !self.reads.iter().all(brought) {
            return false;
        }
        self.packed.iter().all(|p| {
            let out = p.buf_off..p.buf_off + p.grain;
            match p.from_scratch {
                // The scratch buffer is not the output: decompress straight from it.
                Some(at) => unpack(p.loc, &self.scratch[at + p.skip..at + p.skip + p.len], &mut buf[out]).is_ok(),
                // The stored form lies in the grain's own place, which it is decompressed
                // over: copy it out first.
                None => STORED.with_borrow_mut(|stored| {
                    stored.clear();
                    stored.extend_from_slice(&buf[p.buf_off + p.skip..p.buf_off + p.skip + p.len]);
                    unpack(p.loc, stored, &mut buf[out]).is_ok()
                }),
            }
        })
    }

    /// The start of the scratch buffer that the reads marked `scratch` fill; it stays where
    /// it is while the plan lives, moved or not.
    pub fn scratch_ptr(&mut self) -> *mut u8 {
        self.scratch.as_mut_ptr()
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
        let grains = self.s.locks.try_read_owned(pieces.iter().map(|p| (self.id, p.unit)))?;
        let mut plan = ReadPlan {
            reads: Vec::with_capacity(pieces.len()),
            zeros: Vec::new(),
            packed: Vec::new(),
            scratch: AlignedBuf::zeroed(0),
            _grains: grains,
            _members: Vec::new(),
        };
        let mut scratch_len = 0usize;
        for p in pieces {
            let range = p.buf_off..p.buf_off + p.len;
            let l = self.entry(p.unit);
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
            // compressed grain (read whole), the sectors of its pack slot (or two) that hold
            // the piece, into the grain's place or, where they do not fit there, the scratch
            // buffer.
            let (set, at, len, into_scratch) = if is_packed(l) {
                // Decompression runs on the caller's thread: a plan takes the few compressed
                // grains of a small read; a large read goes the ordinary way, decompressed by
                // the workers, one read per pack slot.
                if p.off != 0 || p.len as u64 != grain || plan.packed.len() >= PLANNED_PACKED {
                    return None;
                }
                let (set, off, len) = self.s.space.locate_piece(l).ok()?;
                let (a, b) = sector_envelope(off, len);
                // A piece that runs on into the next slot may take more sectors than the
                // grain's place holds: those are read into the scratch buffer.
                let from_scratch = (b - a > grain).then(|| {
                    scratch_len += (b - a) as usize;
                    scratch_len - (b - a) as usize
                });
                plan.packed.push(PackedRead {
                    loc: l,
                    buf_off: p.buf_off,
                    grain: grain as usize,
                    skip: (off - a) as usize,
                    len,
                    from_scratch,
                });
                (set, a, (b - a) as usize, from_scratch)
            } else {
                let (set, base) = self.s.space.locate(l).ok()?;
                (set, base + p.off, p.len, None)
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
            let first = plan.reads.len();
            if !self.s.layouts.plan_read(
                &set,
                members,
                at,
                len,
                into_scratch.unwrap_or(p.buf_off),
                &mut plan.reads,
            ) {
                return None;
            }
            if into_scratch.is_some() {
                plan.reads[first..].iter_mut().for_each(|r| r.scratch = true);
            }
        }
        if scratch_len > 0 {
            plan.scratch = AlignedBuf::zeroed(scratch_len);
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
        let joins = last.via.same(&r.via)
            && last.scratch == r.scratch
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
