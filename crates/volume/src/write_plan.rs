//! Write plans: the disk writes of a vdisk write that only overwrites data in place, for a
//! caller that starts them itself and goes on with other work while they are in flight (the
//! NBD server's connection loop), as [`ReadPlan`](crate::ReadPlan) does for reads. On a pool
//! whose disks write in the background (a pool on RADOS), such a write then costs no worker
//! thread between the connection and the cluster: the connection starts it, and is told on
//! its ring once the OSDs applied it.
//!
//! The plan holds what the synchronous write holds for its duration (the vdisk's gate, its
//! grains exclusively, the members of the sets written) until it is dropped, and
//! [`finish`](WritePlan::finish) records what that write records once done.

use std::sync::Arc;

use parking_lot::{ArcRwLockReadGuard, RawRwLock};
use tessera_layout::{DiskWrite, MembersGuard, SlabSet};

use crate::locks::OwnedWriteGuard;
use crate::space::is_packed;
use crate::vdisk::{grain_pieces, sector_envelope, Vdisk};
use crate::writer::Writer;

/// The disk writes that put a request's data (`len` bytes at the offset it was planned for)
/// in place: start every one, then [`finish`](Self::finish) the plan if all completed
/// whole, or drop it and write the request with [`Vdisk::write`], which tells why a write
/// fails (nothing was acknowledged: writing the same bytes again is harmless).
pub struct WritePlan {
    pub writes: Vec<DiskWrite>,
    vdisk: Arc<Vdisk>,
    /// The sets written, and the pool's loss count taken before any write started.
    sets: Vec<Arc<SlabSet>>,
    noted: u64,
    /// Whose write it is: a plan may finish on another thread than the one that made it.
    writer: Writer,
    _grains: Vec<OwnedWriteGuard>,
    _members: Vec<(u32, MembersGuard)>,
    _gate: ArcRwLockReadGuard<RawRwLock, ()>,
}

impl WritePlan {
    /// Once every write completed whole: the data is as durable as a flush makes it (the
    /// disks' completions say so), and the next flush of the vdisk vouches for its sets.
    pub fn finish(self) {
        self.vdisk.s.cache.wrote_through();
        for set in &self.sets {
            self.vdisk.unsynced.note(self.writer, set.id, set, self.noted);
        }
    }
}

impl Drop for WritePlan {
    fn drop(&mut self) {
        self.vdisk.changes.leave();
    }
}

impl Vdisk {
    /// A plan for writing `len` bytes at `offset`, or None when this write must go through
    /// [`write`](Vdisk::write): an invalid range or a snapshot (which `write` reports), a
    /// grain held by another request or a set by a rebuild (this never blocks), a grain
    /// unmapped, shared, compressed or written in part of a sector, a write-back cache in
    /// use, or a layout whose write is more than its disk writes
    /// ([`Layouts::plan_write`](tessera_layout::Layouts::plan_write)).
    pub fn try_plan_write(self: &Arc<Self>, offset: u64, len: usize) -> Option<WritePlan> {
        if self.is_snapshot() {
            return None;
        }
        self.check_range(offset, len as u64).ok()?;
        let gate = self.gate.try_read_arc()?;
        if self.deleted.load(std::sync::atomic::Ordering::Acquire) || !self.s.cache.passes_through() {
            return None;
        }
        // Its completion may answer a write through (FUA): never once the records may differ
        // from memory (`MetaStore::whole`).
        self.s.pool.meta().whole().ok()?;
        let pieces: Vec<_> = grain_pieces(self.class.grain, offset, len as u64).collect();
        let grains = self.s.locks.try_write_owned(pieces.iter().map(|p| (self.id, p.unit)))?;
        // Taken before any write starts: a disk lost after this may have taken it.
        let noted = self.s.pool.losses();
        let mut writes = Vec::with_capacity(pieces.len());
        let mut members: Vec<(u32, MembersGuard)> = Vec::new();
        let mut sets: Vec<Arc<SlabSet>> = Vec::new();
        for p in pieces {
            let l = self.entry(p.unit);
            let (a, b) = sector_envelope(p.off, p.len);
            if l == 0 || is_packed(l) || self.s.space.refcount(l) != 1 || a != p.off || b != p.off + p.len as u64 {
                return None;
            }
            let (set, base) = self.s.space.locate(l).ok()?;
            // Data lost with the write-back log: the cache must learn that this write replaces it.
            if self.s.cache.holds_lost(set.id, base + p.off, p.len as u64) {
                return None;
            }
            let held = match members.iter().position(|(id, _)| *id == set.id) {
                Some(i) => i,
                None => {
                    members.push((set.id, set.try_members()?));
                    sets.push(set.clone());
                    members.len() - 1
                }
            };
            if !self
                .s
                .layouts
                .plan_write(&set, &members[held].1, base + p.off, p.len, p.buf_off, &mut writes)
            {
                return None;
            }
        }
        merge(&mut writes);
        self.clock.touch(offset, len as u64);
        // Counted out when the plan is dropped.
        self.changes.enter();
        Some(WritePlan {
            writes,
            vdisk: self.clone(),
            sets,
            noted,
            writer: Writer::current(),
            _grains: grains,
            _members: members,
            _gate: gate,
        })
    }
}

/// Joins writes that continue each other on one disk and in the data into one: the grains
/// of a large write are usually neighbours on the disk.
fn merge(writes: &mut Vec<DiskWrite>) {
    writes.dedup_by(|w, last| {
        let (last_w, w_w) = (&mut last.write, &w.write);
        let joins = Arc::ptr_eq(&last.disk, &w.disk)
            && last_w.offset + last_w.len as u64 == w_w.offset
            && last_w.buf_off + last_w.len == w_w.buf_off;
        if joins {
            last_w.len += w_w.len;
        }
        joins
    });
}
