//! The stripe journal closes the parity write hole.
//!
//! A crash in the middle of a write can leave a row's members disagreeing: one mirror copy new
//! and the other old, or parity that matches neither the old nor the new data. A later disk
//! failure would then rebuild garbage. Before such a write starts, one of two records is made
//! durable here:
//! - `Dirty`: a region (REGION_BYTES of member space) of a healthy set, or of a mirror with a
//!   copy left to resync, is being written.
//!   Only the first write to a region between two checkpoints pays for it. Replay makes every
//!   row of the region consistent again: parity recomputed from the data, mirror copies made
//!   equal to the first copy. Each block then reads as either before or after the write.
//! - `Update`: every member's new bytes for the touched range of a parity row, for writes to a
//!   degraded set, where the data of the missing member exists only through parity and a
//!   resync is impossible. Replay rewrites the range.
//!
//! Records are deleted in sequence order once the member disks were flushed after the writes
//! they cover completed (a checkpoint). Replay applies the survivors in sequence order. The
//! journal is its own RocksDB instance, so its synchronous appends never make the metadata
//! store's batches durable early.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use rocksdb::{Options, WriteBatch, WriteOptions, DB};

use crate::error::{LayoutError, Result};
use crate::sums::{Sums, CF_SUMS};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordBody {
    /// New bytes for [offset, offset + len) of each listed member.
    Update { offset: u64, writes: Vec<(u16, Vec<u8>)> },
    /// Make every row of the region (`Record::row` holds the region index) consistent.
    Dirty,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub set: u32,
    pub row: u64,
    pub body: RecordBody,
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&self.set.to_le_bytes());
        v.extend_from_slice(&self.row.to_le_bytes());
        match &self.body {
            RecordBody::Dirty => v.push(0),
            RecordBody::Update { offset, writes } => {
                v.push(1);
                v.extend_from_slice(&offset.to_le_bytes());
                v.extend_from_slice(&(writes.len() as u16).to_le_bytes());
                for (m, bytes) in writes {
                    v.extend_from_slice(&m.to_le_bytes());
                    v.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                    v.extend_from_slice(bytes);
                }
            }
        }
        v
    }

    pub fn decode(b: &[u8]) -> Result<Record> {
        let bad = || LayoutError::Journal(format!("malformed record of {} bytes", b.len()));
        let mut r = Reader { b, at: 0 };
        let set = u32::from_le_bytes(r.take(4).ok_or_else(bad)?.try_into().unwrap());
        let row = u64::from_le_bytes(r.take(8).ok_or_else(bad)?.try_into().unwrap());
        let body = match r.take(1).ok_or_else(bad)?[0] {
            0 => RecordBody::Dirty,
            1 => {
                let offset = u64::from_le_bytes(r.take(8).ok_or_else(bad)?.try_into().unwrap());
                let n = u16::from_le_bytes(r.take(2).ok_or_else(bad)?.try_into().unwrap());
                let mut writes = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let m = u16::from_le_bytes(r.take(2).ok_or_else(bad)?.try_into().unwrap());
                    let len = u32::from_le_bytes(r.take(4).ok_or_else(bad)?.try_into().unwrap());
                    writes.push((m, r.take(len as usize).ok_or_else(bad)?.to_vec()));
                }
                RecordBody::Update { offset, writes }
            }
            _ => return Err(bad()),
        };
        if r.at != b.len() {
            return Err(bad());
        }
        Ok(Record { set, row, body })
    }

    pub fn bytes(&self) -> u64 {
        match &self.body {
            RecordBody::Dirty => 0,
            RecordBody::Update { writes, .. } => writes.iter().map(|w| w.1.len() as u64).sum(),
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at + n)?;
        self.at += n;
        Some(s)
    }
}

pub struct StripeJournal {
    db: Arc<DB>,
    /// The block checksums: stored here so that a checkpoint makes the checksums of the
    /// writes it covers durable in the batch that retires their records.
    pub(crate) sums: Sums,
    next: AtomicU64,
    /// Records appended whose in-place writes are not finished yet.
    inflight: Mutex<BTreeSet<u64>>,
    /// Payload bytes appended since the last checkpoint.
    pending: AtomicU64,
    checkpointing: Mutex<()>,
    /// Regions with a durable `Dirty` record since the last checkpoint. Read on every
    /// write, written only on the first write to a region in an epoch.
    dirty: RwLock<HashSet<(u32, u64)>>,
    /// Held shared by every write for its whole duration; a checkpoint takes it exclusively
    /// to start a new epoch, so that it never deletes the record of a region that a write
    /// still relies on.
    epoch: RwLock<()>,
    /// Replayed records whose work could not be finished (a region with a row that could not
    /// be made consistent): checkpoints keep them until a retry succeeds, so that the next
    /// start tries again instead of trusting the region.
    pinned: Mutex<BTreeMap<u64, Record>>,
    /// Set when a member is lost: its sets' `Dirty` records from before the loss would make
    /// a replay after a crash find those regions impossible to resync (the member is gone)
    /// though they are consistent, so the next write or flush retires them.
    checkpoint_requested: AtomicBool,
    /// Milliseconds after `opened` of the last checkpoint (an atomic: read on every write).
    last_checkpoint_ms: AtomicU64,
    opened: Instant,
}

/// Member bytes covered by one `Dirty` record.
pub const REGION_BYTES: u64 = 4 << 20;
/// Checkpoint at least this often while writes go on, so that recovery has little to resync.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);
const CHECKPOINT_REGIONS: usize = 1024;

/// Start a checkpoint once this much payload has accumulated.
pub const CHECKPOINT_BYTES: u64 = 32 << 20;

impl StripeJournal {
    /// Opens (or creates) the journal and returns the records to replay, in sequence order.
    /// `checksums`: whether block checksums are kept (see [`Sums::open`]).
    pub fn open(dir: &Path, checksums: bool) -> Result<(StripeJournal, Vec<(u64, Record)>)> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_write_buffer_size(64 << 20);
        opts.set_max_background_jobs(1);
        opts.set_keep_log_file_num(2);
        let db = DB::open_cf(&opts, dir, ["default", CF_SUMS])
            .map_err(|e| LayoutError::Journal(format!("{}: {e}", dir.display())))?;
        let db = Arc::new(db);
        let mut records = Vec::new();
        for item in db.iterator(rocksdb::IteratorMode::Start) {
            let (k, v) = item.map_err(|e| LayoutError::Journal(e.to_string()))?;
            let seq = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| LayoutError::Journal("malformed key".into()))?,
            );
            records.push((seq, Record::decode(&v)?));
        }
        let next = records.last().map(|r| r.0 + 1).unwrap_or(1);
        let j = StripeJournal {
            sums: Sums::open(db.clone(), checksums)?,
            db,
            next: AtomicU64::new(next),
            inflight: Mutex::new(BTreeSet::new()),
            pending: AtomicU64::new(0),
            checkpointing: Mutex::new(()),
            dirty: RwLock::new(HashSet::new()),
            epoch: RwLock::new(()),
            pinned: Mutex::new(BTreeMap::new()),
            checkpoint_requested: AtomicBool::new(false),
            last_checkpoint_ms: AtomicU64::new(0),
            opened: Instant::now(),
        };
        Ok((j, records))
    }

    /// Makes a record durable; the caller then writes in place and calls `done`.
    pub fn append(&self, rec: &Record) -> Result<u64> {
        let seq = {
            // The sequence number and the in-flight mark are taken together, so that a
            // checkpoint bound never passes a record that is still being applied.
            let mut inflight = self.inflight.lock();
            let seq = self.next.fetch_add(1, Ordering::SeqCst);
            inflight.insert(seq);
            seq
        };
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        if let Err(e) = self.db.put_opt(seq.to_be_bytes(), rec.encode(), &wo) {
            self.inflight.lock().remove(&seq);
            return Err(LayoutError::Journal(e.to_string()));
        }
        self.pending.fetch_add(rec.bytes() + 64, Ordering::Relaxed);
        Ok(seq)
    }

    /// See [`tessera_pool::MetaStore::stop_background_work`].
    pub fn stop_background_work(&self) {
        self.db.cancel_all_background_work(true);
    }

    /// Every record in the journal now, in sequence order.
    pub fn records(&self) -> Result<Vec<(u64, Record)>> {
        let mut out = Vec::new();
        for item in self.db.iterator(rocksdb::IteratorMode::Start) {
            let (k, v) = item.map_err(|e| LayoutError::Journal(e.to_string()))?;
            let Ok(seq) = <[u8; 8]>::try_from(k.as_ref()).map(u64::from_be_bytes) else {
                continue;
            };
            // A record that does not decode is reported by its sequence number alone.
            let rec = Record::decode(&v).unwrap_or(Record {
                set: u32::MAX,
                row: u64::MAX,
                body: RecordBody::Dirty,
            });
            out.push((seq, rec));
        }
        Ok(out)
    }

    /// Deletes one record, durably, and forgets it if it was pinned.
    pub fn drop_record(&self, seq: u64) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db
            .delete_opt(seq.to_be_bytes(), &wo)
            .map_err(|e| LayoutError::Journal(e.to_string()))?;
        self.unpin(seq);
        Ok(())
    }

    pub fn done(&self, seq: u64) {
        self.inflight.lock().remove(&seq);
    }

    /// Keeps a replayed record through checkpoints: its work is not finished.
    pub fn pin(&self, seq: u64, rec: Record) {
        self.pinned.lock().insert(seq, rec);
    }

    /// The record's work is done: the next checkpoint may delete it.
    pub fn unpin(&self, seq: u64) {
        self.pinned.lock().remove(&seq);
    }

    pub fn pinned(&self) -> Vec<(u64, Record)> {
        self.pinned.lock().iter().map(|(k, r)| (*k, r.clone())).collect()
    }

    /// True if a `Dirty` record of the region was made in this epoch: a write under way
    /// (which holds the epoch) that relies on one finds it still there.
    pub fn is_dirty(&self, set: u32, region: u64) -> bool {
        self.dirty.read().contains(&(set, region))
    }

    /// True if a `Dirty` record of the region is pinned: the region was being written when the
    /// pool stopped and some row of it may still have redundancy that disagrees with its data.
    pub fn is_unsynced(&self, set: u32, region: u64) -> bool {
        self.pinned
            .lock()
            .values()
            .any(|r| r.set == set && r.row == region && r.body == RecordBody::Dirty)
    }

    /// Asks for a checkpoint at the next write or flush.
    pub fn request_checkpoint(&self) {
        self.checkpoint_requested.store(true, Ordering::Relaxed);
    }

    /// True if a checkpoint was asked for since the last one.
    pub fn checkpoint_requested(&self) -> bool {
        self.checkpoint_requested.load(Ordering::Relaxed)
    }

    /// Held by a write from before it records its regions until its last member write.
    pub fn enter(&self) -> RwLockReadGuard<'_, ()> {
        self.epoch.read()
    }

    /// Makes sure a durable `Dirty` record covers the region. Call it holding `enter`.
    pub fn ensure_dirty(&self, set: u32, region: u64) -> Result<()> {
        if self.dirty.read().contains(&(set, region)) {
            return Ok(());
        }
        let seq = self.append(&Record {
            set,
            row: region,
            body: RecordBody::Dirty,
        })?;
        // The record protects writes through the epoch, not through the in-flight set.
        self.done(seq);
        self.dirty.write().insert((set, region));
        Ok(())
    }

    fn now_ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    pub fn wants_checkpoint(&self) -> bool {
        self.checkpoint_requested.load(Ordering::Relaxed)
            || self.pending.load(Ordering::Relaxed) >= CHECKPOINT_BYTES
            || self.dirty.read().len() >= CHECKPOINT_REGIONS
            || self
                .now_ms()
                .saturating_sub(self.last_checkpoint_ms.load(Ordering::Relaxed))
                >= CHECKPOINT_INTERVAL.as_millis() as u64
    }

    /// Deletes every record older than the oldest one still in flight, after `flush` made the
    /// member disks durable. `flush` runs between choosing the bound and deleting, so each
    /// deleted record's in-place writes completed before the flush began.
    pub fn checkpoint(&self, flush: impl FnOnce() -> Result<()>, sync: bool) -> Result<()> {
        let _one = self.checkpointing.lock();
        self.checkpoint_locked(flush, sync)
    }

    /// Holds off every other checkpoint, for a caller that must take a lock a checkpoint's
    /// flush may need (a set's members) after this one, as every other path does, and then
    /// checkpoint itself ([`checkpoint_under`](Self::checkpoint_under)).
    pub fn checkpoints(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.checkpointing.lock()
    }

    /// [`checkpoint`](Self::checkpoint) by the holder of [`checkpoints`](Self::checkpoints).
    pub fn checkpoint_under(
        &self,
        _one: &parking_lot::MutexGuard<'_, ()>,
        flush: impl FnOnce() -> Result<()>,
        sync: bool,
    ) -> Result<()> {
        self.checkpoint_locked(flush, sync)
    }

    /// A checkpoint if one is due and none is under way: writers call it in passing, and
    /// only one of them should pay for it.
    pub fn checkpoint_if_due(&self, flush: impl FnOnce() -> Result<()>) -> Result<()> {
        let Some(_one) = self.checkpointing.try_lock() else {
            return Ok(());
        };
        if !self.wants_checkpoint() {
            return Ok(());
        }
        self.checkpoint_locked(flush, false)
    }

    fn checkpoint_locked(&self, flush: impl FnOnce() -> Result<()>, sync: bool) -> Result<()> {
        let bound = {
            // Every write of the old epoch has finished once this is held; writes of the new
            // one record their regions again, with sequence numbers past the bound.
            let _epoch = self.epoch.write();
            self.checkpoint_requested.store(false, Ordering::Relaxed);
            self.dirty.write().clear();
            self.last_checkpoint_ms.store(self.now_ms(), Ordering::Relaxed);
            let inflight = self.inflight.lock();
            inflight
                .first()
                .copied()
                .unwrap_or_else(|| self.next.load(Ordering::SeqCst))
        };
        self.pending.store(0, Ordering::Relaxed);
        flush()?;
        let mut b = WriteBatch::default();
        // Everything below the bound, but the pinned records.
        let mut from = 0u64;
        for &seq in self.pinned.lock().keys().filter(|&&s| s < bound) {
            b.delete_range(from.to_be_bytes(), seq.to_be_bytes());
            from = seq + 1;
        }
        b.delete_range(from.to_be_bytes(), bound.to_be_bytes());
        // The checksums of every write the flush made durable (and perhaps of some newer
        // ones: their regions keep their records, and a replay settles them).
        let pages = self.sums.persist_into(&mut b);
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        let r = self.db.write_opt(b, &wo);
        self.sums.finish(pages, r.is_ok());
        r.map_err(|e| LayoutError::Journal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_malformed_ones_are_refused() {
        let r = Record {
            set: 7,
            row: 99,
            body: RecordBody::Update {
                offset: 4096,
                writes: vec![(0, vec![1; 10]), (3, vec![2; 10])],
            },
        };
        let enc = r.encode();
        assert_eq!(Record::decode(&enc).unwrap(), r);
        assert!(Record::decode(&enc[..enc.len() - 1]).is_err());
        let mut longer = enc.clone();
        longer.push(0);
        assert!(Record::decode(&longer).is_err());
        let s = Record {
            set: 1,
            row: 2,
            body: RecordBody::Dirty,
        };
        assert_eq!(Record::decode(&s.encode()).unwrap(), s);
        assert!(Record::decode(&[]).is_err());
    }

    #[test]
    fn checkpoint_keeps_inflight_records() {
        let dir = tempfile::tempdir().unwrap();
        let rec = |row| Record {
            set: 1,
            row,
            body: RecordBody::Update {
                offset: 0,
                writes: vec![],
            },
        };
        {
            let (j, replay) = StripeJournal::open(dir.path(), true).unwrap();
            assert!(replay.is_empty());
            let a = j.append(&rec(1)).unwrap();
            let b = j.append(&rec(2)).unwrap();
            let c = j.append(&rec(3)).unwrap();
            j.done(a);
            j.done(c);
            j.checkpoint(|| Ok(()), true).unwrap();
            // b is still in flight: it and everything after it survive.
            let _ = b;
        }
        let (j, replay) = StripeJournal::open(dir.path(), true).unwrap();
        let rows: Vec<u64> = replay.iter().map(|r| r.1.row).collect();
        assert_eq!(rows, vec![2, 3]);
        let d = j.append(&rec(4)).unwrap();
        assert!(
            d > replay.last().unwrap().0,
            "sequence numbers keep growing across opens"
        );
    }
}
