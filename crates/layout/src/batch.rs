//! Many reads at once. Each piece of each request goes to the member a lone read would try
//! first, and the pieces bound for one disk are read as one batch, so that a disk that can
//! have many reads in flight ([`tessera_disk::BlockDevice::read_many`]) gets them together.
//! Whatever that fast path cannot do (a member unavailable, a read error) is done again by
//! the single-read path, which reads around failures and repairs in place.

use std::sync::Arc;

use tessera_disk::{DiskRef, ReadReq};

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

/// A piece of a request on its way to a disk.
struct Planned<'a> {
    req: usize,
    piece: Piece,
    buf: &'a mut [u8],
    disk: u32,
    offset: u64,
}

impl Layouts {
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
