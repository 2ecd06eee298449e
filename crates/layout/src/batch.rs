//! Many reads at once. Each piece of each request goes to the member a lone read would try
//! first, and the pieces bound for one disk are read as one batch, so that a disk that can
//! have many reads in flight ([`tessera_disk::BlockDevice::read_many`]) gets them together.
//! Whatever that fast path cannot do (a member unavailable, a read error) is done again by
//! the single-read path, which reads around failures and repairs in place.
//!
//! A caller with an io_uring of its own can instead ask where a read would go
//! ([`Layouts::plan_read`]) and submit the disk reads itself, so that it is not blocked while
//! they are in flight.

use std::os::fd::RawFd;
use std::sync::Arc;

use tessera_disk::{DiskRef, ReadReq};
use tessera_pool::SlabRef;

use crate::error::Result;
use crate::geometry::{read_order, split, Piece};
use crate::layouts::Layouts;
use crate::slabset::SlabSet;

/// One read of a batch: `buf.len()` bytes at `offset` of `set`'s logical space.
pub struct SetRead<'a> {
    pub set: &'a SlabSet,
    pub offset: u64,
    pub buf: &'a mut [u8],
}

/// A disk read of a planned request: `len` bytes at `offset` of `disk` (through `fd`, its
/// [`uring_fd`](tessera_disk::BlockDevice::uring_fd)) into the request's buffer at `buf_off`.
/// Holding `disk` keeps the descriptor open.
pub struct DiskRead {
    pub disk: DiskRef,
    pub fd: RawFd,
    pub offset: u64,
    pub buf_off: usize,
    pub len: usize,
}

/// A piece of a request on its way to a disk.
struct Planned<'a> {
    req: usize,
    piece: Piece,
    buf: &'a mut [u8],
    disk: u32,
    offset: u64,
}

impl Layouts {
    /// The disk reads that fill `len` bytes at `offset` of `set` into a buffer at `buf_off`,
    /// one per stripe-unit piece, each from the member a lone read tries first (the caller
    /// merges neighbours across the grains of its request); the caller holds `members` (from
    /// [`SlabSet::try_members`]) until they complete. False, having added nothing, when a
    /// member is not readable or its disk takes no reads from a caller's ring: the caller
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
        if self.check(set, offset, len).is_err() {
            return false;
        }
        let spec = &set.spec;
        let start = out.len();
        for piece in split(spec, offset, len) {
            let slab = members[read_order(spec, piece.row, piece.data_col)[0]];
            let Some((disk, fd)) = self
                .pool
                .readable_disk(slab.disk)
                .and_then(|d| d.uring_fd().map(|fd| (d, fd)))
            else {
                out.truncate(start);
                return false;
            };
            out.push(DiskRead {
                disk,
                fd,
                offset: self.pool.slab_offset(slab) + piece.member_offset(spec),
                buf_off: buf_off + piece.buf_off,
                len: piece.len,
            });
        }
        true
    }

    /// Reads every request as [`read`](Self::read) would, with one result per request.
    pub fn read_many(&self, reqs: &mut [SetRead<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = reqs.iter().map(|r| self.check(r.set, r.offset, r.buf.len())).collect();
        let sets: Vec<&SlabSet> = reqs.iter().map(|r| r.set).collect();
        // Members cannot change under a request until it is read (a rebuild swapping a slab
        // takes them exclusively). Recursive: two requests may share a set.
        let members: Vec<_> = sets.iter().map(|s| s.members.read_recursive()).collect();
        let mut by_disk: Vec<(DiskRef, Vec<Planned>)> = Vec::new();
        let mut slow: Vec<Planned> = Vec::new();
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
                let offset = self.pool.slab_offset(slab) + piece.member_offset(spec);
                let p = Planned {
                    req: i,
                    piece,
                    buf,
                    disk: slab.disk,
                    offset,
                };
                match self.pool.readable_disk(slab.disk) {
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
                meta.push((p.req, p.piece, p.disk));
            }
            let done = dev.read_many(&mut io);
            for ((rr, (req, piece, disk)), res) in io.into_iter().zip(meta).zip(done) {
                if let Err(e) = res {
                    self.read_error(disk, &e);
                    slow.push(Planned {
                        req,
                        piece,
                        buf: rr.buf,
                        disk,
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
