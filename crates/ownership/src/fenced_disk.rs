//! A disk on RADOS for one owner: the engine's [`BlockDevice`] over objects of
//! [`OBJECT_BYTES`] (`PREFIX.INDEX`, the index in 16 hex digits), every write fenced by the
//! owner's epoch ([`FencedWriter`]). A pool built on such disks keeps its data in the Ceph
//! cluster, with Ceph's redundancy; a gateway that was replaced cannot write to it.
//!
//! Objects are made by their first write, so the disk is thin: a read of an object never
//! written, or past the end of a shorter one, returns zeros.
//!
//! Writes to objects that exist are sent and not waited for (a volatile write cache, as a
//! disk's, and as librbd's): up to [`MAX_BEHIND`] bytes may be on their way, and a flush
//! waits until the OSDs applied every write sent before it (on every replica). Writes this
//! client sends to an object are applied in the order sent, and a read sees the writes sent
//! before it, so nothing above the disk can tell, but for the speed and the flush. A write
//! the OSDs refuse (a newer owner's guard, a blocklist, a timeout) fails that flush and
//! every later one: the data it held is lost, and which flush it was under cannot be told.
//! The first write to an object (which makes it) is waited for.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex};
use tessera_disk::{check_request, BlockDevice, DiskError, ReadReq};
use tessera_rados::{PendingWrite, Pool, RadosError, ReadExtent};

use crate::fence::FencedWriter;

/// Bytes per object, as librbd's default: large enough that a sequential stream costs few
/// operations, small enough that objects spread over the placement groups.
pub const OBJECT_BYTES: u64 = 4 << 20;

/// The most bytes of writes sent and not yet known applied, as librbd's cache holds dirty
/// (`rbd_cache_max_dirty`): past it, a write waits for the oldest.
pub const MAX_BEHIND: usize = 24 << 20;

pub struct FencedDisk {
    /// First, so that the writes in flight are waited for before the pool's context goes.
    behind: Mutex<Behind>,
    /// Told whenever a write is settled, for a flush waiting on one another thread waits for.
    settled: Condvar,
    /// The objects known to exist (written, or read, by this disk).
    exists: Vec<AtomicBool>,
    pool: Pool<'static>,
    prefix: String,
    size: u64,
    epoch: i64,
    path: String,
}

/// Writes sent and not yet known applied.
#[derive(Default)]
struct Behind {
    /// Not waited for yet, oldest first.
    sent: VecDeque<Sent>,
    /// Taken out of `sent` by a thread that waits for them and has not settled them yet.
    in_hand: BTreeSet<u64>,
    /// Of every write not settled yet.
    bytes: usize,
    next: u64,
    /// The first write the OSDs refused (offset, length, why): every flush from then on
    /// fails with it.
    failed: Option<(u64, usize, String)>,
}

struct Sent {
    seq: u64,
    write: PendingWrite,
    offset: u64,
    len: usize,
}

impl Behind {
    /// The oldest write sent before `before`, taken out to be waited for.
    fn take_oldest(&mut self, before: u64) -> Option<Sent> {
        if self.sent.front()?.seq >= before {
            return None;
        }
        let s = self.sent.pop_front()?;
        self.in_hand.insert(s.seq);
        Some(s)
    }

    /// Counts a write that completed out, keeping the first refusal.
    fn settle(&mut self, seq: u64, offset: u64, len: usize, outcome: Result<(), RadosError>) {
        self.in_hand.remove(&seq);
        self.bytes -= len;
        if let Err(e) = outcome {
            self.failed.get_or_insert((offset, len, describe(&e)));
        }
    }
}

/// What the cluster's refusal means for this gateway.
fn describe(e: &RadosError) -> String {
    if e.is_fenced() {
        format!("this gateway was fenced off by a newer owner ({e})")
    } else if e.is_guard_failure() {
        format!("a newer owner wrote here ({e})")
    } else {
        e.to_string()
    }
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
            behind: Mutex::new(Behind::default()),
            settled: Condvar::new(),
            exists: (0..size.div_ceil(OBJECT_BYTES))
                .map(|_| AtomicBool::new(false))
                .collect(),
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
        // Nothing of this disk may land after its objects went.
        let _ = self.flush();
        for index in 0..self.size.div_ceil(OBJECT_BYTES) {
            self.exists[index as usize].store(false, Ordering::Release);
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
        self.unavailable(op, offset, len, describe(&e))
    }

    fn unavailable(&self, op: &'static str, offset: u64, len: usize, reason: String) -> DiskError {
        DiskError::Unavailable {
            path: self.path.clone(),
            op,
            offset,
            len,
            reason,
        }
    }

    /// Sends the guarded write of a piece of an object that exists, without waiting for it,
    /// and settles the writes that completed meanwhile; while more than [`MAX_BEHIND`] bytes
    /// are on their way, waits for the oldest.
    fn send(&self, oid: &str, in_obj: u64, data: &[u8], offset: u64) -> Result<(), DiskError> {
        let op = FencedWriter::new(&self.pool, self.epoch).guarded(in_obj, data);
        let write = self
            .pool
            .operate_async(oid, op)
            .map_err(|e| self.io_error("write", offset, data.len(), e))?;
        let mut b = self.behind.lock();
        let seq = b.next;
        b.next += 1;
        b.bytes += data.len();
        b.sent.push_back(Sent {
            seq,
            write,
            offset,
            len: data.len(),
        });
        // Those that completed, under the lock: a flush that finds the queue past its
        // writes finds their refusals too.
        while b.sent.front().is_some_and(|s| s.write.is_complete()) {
            let s = b.sent.pop_front().expect("a front");
            let (seq, offset, len) = (s.seq, s.offset, s.len);
            b.settle(seq, offset, len, s.write.wait());
        }
        while b.bytes > MAX_BEHIND {
            let Some(s) = b.take_oldest(u64::MAX) else {
                // All in other threads' hands: theirs to wait for.
                self.settled.wait(&mut b);
                continue;
            };
            b = self.wait_for(b, s);
        }
        Ok(())
    }

    /// Waits for a write taken out of the queue, without the lock, and settles it.
    fn wait_for<'a>(&'a self, b: parking_lot::MutexGuard<'a, Behind>, s: Sent) -> parking_lot::MutexGuard<'a, Behind> {
        drop(b);
        let (seq, offset, len) = (s.seq, s.offset, s.len);
        let outcome = s.write.wait();
        let mut b = self.behind.lock();
        b.settle(seq, offset, len, outcome);
        self.settled.notify_all();
        b
    }
}

impl Drop for FencedDisk {
    fn drop(&mut self) {
        // What was sent is waited for (dropping each write waits for it) before the
        // context it was sent on goes.
        self.behind.get_mut().sent.clear();
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
                Ok(n) => {
                    self.exists[index as usize].store(true, Ordering::Release);
                    n
                }
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
        // Per extent: its object, its request, and the request's offset and length (for an
        // error).
        let mut owners: Vec<(u64, usize, u64, usize)> = Vec::new();
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
                owners.push((index, i, offset, len));
            }
        }
        let got = self.pool.read_extents(&mut extents);
        for ((extent, got), (index, i, offset, len)) in extents.iter_mut().zip(got).zip(owners) {
            let n = match got {
                Ok(n) => {
                    self.exists[index as usize].store(true, Ordering::Release);
                    n
                }
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
        for (index, in_obj, r) in Self::pieces(offset, buf.len()) {
            let (oid, at) = (self.oid(index), offset + r.start as u64);
            if self.exists[index as usize].load(Ordering::Acquire) {
                self.send(&oid, in_obj, &buf[r], at)?;
                continue;
            }
            // The object may not exist: written (made) and waited for.
            FencedWriter::new(&self.pool, self.epoch)
                .write(&oid, in_obj, &buf[r.clone()])
                .map_err(|e| self.io_error("write", at, r.len(), e))?;
            self.exists[index as usize].store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Waits until the OSDs applied every write sent before it; fails if they refused any
    /// write since the disk was opened.
    fn flush(&self) -> Result<(), DiskError> {
        let mut b = self.behind.lock();
        let before = b.next;
        loop {
            if let Some(s) = b.take_oldest(before) {
                b = self.wait_for(b, s);
            } else if b.in_hand.first().is_some_and(|&seq| seq < before) {
                // Another thread waits for it: until it has settled it.
                self.settled.wait(&mut b);
            } else {
                break;
            }
        }
        match &b.failed {
            Some((offset, len, why)) => Err(self.unavailable(
                "flush",
                *offset,
                *len,
                format!("a write sent earlier was refused: {why}"),
            )),
            None => Ok(()),
        }
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
