//! Many reads at once. Each piece of each request goes to the member a lone read would try
//! first, and the pieces bound for one disk are read as one batch, so that a disk that can
//! have many reads in flight ([`tessera_disk::BlockDevice::read_many`]) gets them together.
//! Whatever that fast path cannot do (a member unavailable, a read error) is done again by
//! the single-read path, which reads around failures and repairs in place.
//!
//! A caller with an io_uring of its own can instead ask where a read would go
//! ([`Layouts::plan_read`]) and submit the disk reads itself, so that it is not blocked while
//! they are in flight.

use std::sync::Arc;

use tessera_disk::{DiskRef, ReadReq, ReadVia};
use tessera_pool::SlabRef;

use crate::error::Result;
use crate::geometry::{read_order, split, Piece};
use crate::layouts::Layouts;
use crate::slabset::SlabSet;
use crate::sums::{block_sum, BLOCK};

/// One read of a batch: `buf.len()` bytes at `offset` of `set`'s logical space.
pub struct SetRead<'a> {
    pub set: &'a SlabSet,
    pub offset: u64,
    pub buf: &'a mut [u8],
}

/// A disk read of a planned request: `len` bytes at `offset` of `disk` (the way `via`, its
/// [`read_via`](tessera_disk::BlockDevice::read_via)) into the request's buffer at `buf_off`.
/// Holding `disk` keeps its descriptor open.
pub struct DiskRead {
    pub disk: DiskRef,
    pub via: ReadVia,
    pub offset: u64,
    pub buf_off: usize,
    pub len: usize,
    /// The checksum of each 4 KiB block the read brings (None: unknown), or nothing when the
    /// pool keeps no checksums.
    pub sums: Vec<Option<u32>>,
    /// Set by a caller whose read goes to a scratch buffer of its own, not to the request's
    /// buffer (`buf_off` is then an offset in that scratch buffer).
    pub scratch: bool,
}

impl DiskRead {
    /// True if the bytes this read brought (`data`, its `len` bytes) match their checksums.
    /// A read that does not is done again the synchronous way, which reads around the bad
    /// copy, repairs it and counts it.
    pub fn verify(&self, data: &[u8]) -> bool {
        self.sums.is_empty()
            || data
                .chunks(BLOCK as usize)
                .zip(&self.sums)
                .all(|(b, want)| want.is_none_or(|w| block_sum(b) == w))
    }

    /// Appends a read that continues this one on the disk and in the buffer.
    pub fn join(&mut self, next: &mut DiskRead) {
        self.len += next.len;
        self.sums.append(&mut next.sums);
    }
}

/// A piece of a request on its way to a disk.
struct Planned<'a> {
    req: usize,
    piece: Piece,
    buf: &'a mut [u8],
    slab: SlabRef,
    offset: u64,
}

impl Layouts {
    /// The disk reads that fill `len` bytes at `offset` of `set` into a buffer at `buf_off`,
    /// one per stripe-unit piece, each from the member a lone read tries first (the caller
    /// merges neighbours across the grains of its request); the caller holds `members` (from
    /// [`SlabSet::try_members`]) until they complete, and checks what they bring with
    /// [`DiskRead::verify`]. False, having added nothing, when a member is not readable or its
    /// disk takes no reads from a caller's ring, when the range holds bytes lost beyond
    /// repair, or (with checksums) when a read covers part
    /// of a block or its checksums are not in memory: the caller
    /// reads with [`read`](Self::read), which reads around failures. A read that fails on the
    /// disk is also retried with [`read`](Self::read).
    pub fn plan_read(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        offset: u64,
        len: usize,
        buf_off: usize,
        out: &mut Vec<DiskRead>,
    ) -> bool {
        // Bytes lost beyond repair: refused by `read`.
        if self.check(set, offset, len).is_err() || !set.lost_within(offset, offset + len as u64).is_empty() {
            return false;
        }
        let spec = &set.spec;
        let start = out.len();
        let checked = self.sums().enabled();
        for piece in split(spec, offset, len) {
            let slab = members[read_order(spec, piece.row, piece.data_col)[0]];
            let mo = piece.member_offset(spec);
            let sums = if checked {
                if mo % BLOCK != 0 || piece.len as u64 % BLOCK != 0 {
                    out.truncate(start);
                    return false;
                }
                match self.sums().cached(slab, mo, piece.len as u64) {
                    Some(s) => s,
                    None => {
                        out.truncate(start);
                        return false;
                    }
                }
            } else {
                Vec::new()
            };
            let Some((disk, via)) = self.member_dev(slab).and_then(|d| d.read_via().map(|via| (d, via))) else {
                out.truncate(start);
                return false;
            };
            out.push(DiskRead {
                disk,
                via,
                offset: self.pool.slab_offset(slab) + mo,
                buf_off: buf_off + piece.buf_off,
                len: piece.len,
                sums,
                scratch: false,
            });
        }
        true
    }

    /// Reads every request as [`read`](Self::read) would, with one result per request.
    pub fn read_many(&self, reqs: &mut [SetRead<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = reqs
            .iter()
            .map(|r| {
                self.check(r.set, r.offset, r.buf.len())
                    .and_then(|()| self.refuse_lost(r.set, r.offset, r.buf.len()))
            })
            .collect();
        let sets: Vec<&SlabSet> = reqs.iter().map(|r| r.set).collect();
        // Members cannot change under a request until it is read (a rebuild swapping a slab
        // takes them exclusively). Recursive: two requests may share a set.
        let members: Vec<_> = sets.iter().map(|s| s.members.read_recursive()).collect();
        let mut by_disk: Vec<(DiskRef, Vec<Planned>)> = Vec::new();
        let mut slow: Vec<Planned> = Vec::new();
        let checked = self.sums().enabled();
        for (i, r) in reqs.iter_mut().enumerate() {
            if results[i].is_err() {
                continue;
            }
            let spec = &r.set.spec;
            let mut rest: &mut [u8] = r.buf;
            for piece in split(spec, r.offset, rest.len()) {
                let (buf, tail) = std::mem::take(&mut rest).split_at_mut(piece.len);
                rest = tail;
                let slab = members[i][read_order(spec, piece.row, piece.data_col)[0]];
                let mo = piece.member_offset(spec);
                // Part of a block cannot be checked alone: the single-read path reads the block.
                let whole_blocks = !checked || (mo % BLOCK == 0 && piece.len as u64 % BLOCK == 0);
                let offset = self.pool.slab_offset(slab) + mo;
                let p = Planned {
                    req: i,
                    piece,
                    buf,
                    slab,
                    offset,
                };
                match self.member_dev(slab).filter(|_| whole_blocks) {
                    Some(dev) => match by_disk.iter_mut().find(|(d, _)| Arc::ptr_eq(d, &dev)) {
                        Some((_, list)) => list.push(p),
                        None => by_disk.push((dev, vec![p])),
                    },
                    None => slow.push(p),
                }
            }
        }
        for (dev, list) in by_disk {
            let mut io: Vec<ReadReq> = Vec::with_capacity(list.len());
            let mut meta = Vec::with_capacity(list.len());
            for p in list {
                io.push(ReadReq {
                    buf: p.buf,
                    offset: p.offset,
                });
                meta.push((p.req, p.piece, p.slab));
            }
            let done = dev.read_many(&mut io);
            for ((rr, (req, piece, slab)), res) in io.into_iter().zip(meta).zip(done) {
                let good = match res {
                    Err(e) => {
                        self.read_error(slab.disk, &e);
                        false
                    }
                    Ok(()) => !checked || self.verified(slab, rr.offset - self.pool.slab_offset(slab), rr.buf),
                };
                if !good {
                    slow.push(Planned {
                        req,
                        piece,
                        buf: rr.buf,
                        slab,
                        offset: rr.offset,
                    });
                }
            }
        }
        for p in slow {
            if results[p.req].is_err() {
                continue;
            }
            if let Err(e) = self.read_piece(sets[p.req], &members[p.req], &p.piece, p.buf, false) {
                results[p.req] = Err(e);
            }
        }
        results
    }
}
