//! What the log holds, kept in the pool's metadata: every write the log took, by slab set,
//! offset and length, with the sequence number of the last batch that took it, recorded
//! before a flush answers for it (again when a later batch takes it again) and dropped in the
//! same commit as the record of the log's start that frees that batch. A log whose disks are
//! missing or unreadable at open cannot say what it held past the point its replay reached;
//! this record can: each write in it from a batch the replay did not reach is lost, and reads
//! of it fail rather than return what the pool's disks held before.
//!
//! A record can outlive the data it stood for: a batch destaged while an older one is not is
//! freed only with it, and a write forced into a log of one copy is on the pool's disks too.
//! With the log gone, such a range is taken for lost though the pool's disks hold it. The
//! error is on the safe side, and only with the log's disks gone.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use tessera_pool::{MetaBatch, Pool, CF_POOL};

use crate::error::Result;

const PREFIX: &[u8] = b"write-back-held/";

/// A write the log holds: slab set, offset, length.
pub(crate) type Write = (u32, u64, u64);

/// The writes the live log holds, in memory, and which of them the metadata has.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Each write: the sequence number of the last batch that holds it, and whether the
    /// metadata has it (or a save of it is under way).
    writes: HashMap<Write, (u64, bool)>,
    /// Writes the metadata does not have yet: no more than the live log holds, however long
    /// no flush comes.
    unsaved: HashSet<Write>,
}

impl Held {
    /// Batch `seq` holds `w`.
    pub fn wrote(&mut self, w: Write, seq: u64) {
        match self.writes.entry(w) {
            Entry::Occupied(mut e) => {
                let held = e.get_mut();
                if seq > held.0 {
                    held.0 = seq;
                    // Recorded again with its new batch.
                    if held.1 {
                        held.1 = false;
                        self.unsaved.insert(w);
                    }
                }
            }
            Entry::Vacant(e) => {
                e.insert((seq, false));
                self.unsaved.insert(w);
            }
        }
    }

    /// The writes to record now, with their batches; counted as recorded from here
    /// (`unsave` gives back those of a save that failed).
    pub fn take_unsaved(&mut self) -> Vec<(Write, u64)> {
        let mut out = Vec::new();
        for w in std::mem::take(&mut self.unsaved) {
            if let Some(h) = self.writes.get_mut(&w) {
                if !h.1 {
                    h.1 = true;
                    out.push((w, h.0));
                }
            }
        }
        out
    }

    /// A save of `ws` failed: they are to be recorded again, those still held.
    pub fn unsave(&mut self, ws: &[(Write, u64)]) {
        for (w, _) in ws {
            if let Some(h) = self.writes.get_mut(w) {
                if h.1 {
                    h.1 = false;
                    self.unsaved.insert(*w);
                }
            }
        }
    }

    /// Batch `seq`, holding `writes`, is freed: those no later batch holds leave. Returns the
    /// ones the metadata has, to delete there.
    pub fn freed(&mut self, seq: u64, writes: &[Write]) -> Vec<Write> {
        let mut out = Vec::new();
        for w in writes {
            if self.writes.get(w).is_some_and(|h| h.0 == seq) {
                match self.writes.remove(w) {
                    Some((_, true)) => out.push(*w),
                    _ => {
                        self.unsaved.remove(w);
                    }
                }
            }
        }
        out
    }

    /// A change that let `writes` leave (with the sequence numbers of their batches) was not
    /// saved: they are held again, as the metadata still has them. One taken again meanwhile
    /// by a newer batch stays to be recorded with that batch.
    pub fn restore(&mut self, writes: &[(Write, u64)]) {
        for &(w, seq) in writes {
            match self.writes.entry(w) {
                Entry::Vacant(e) => {
                    e.insert((seq, true));
                }
                Entry::Occupied(mut e) => {
                    if e.get().0 <= seq {
                        e.get_mut().1 = true;
                    }
                }
            }
        }
    }

    /// Everything leaves (the log is empty, or lost with what it held recorded otherwise).
    pub fn clear(&mut self) {
        self.writes.clear();
        self.unsaved.clear();
    }

    /// A slab set is freed: its writes leave.
    pub fn forget_set(&mut self, set: u32) {
        self.writes.retain(|w, _| w.0 != set);
        self.unsaved.retain(|w| w.0 != set);
    }

    /// Whether some write may be left to record.
    pub fn has_unsaved(&self) -> bool {
        !self.unsaved.is_empty()
    }

    #[cfg(test)]
    pub fn holds(&self, w: &Write) -> bool {
        self.writes.contains_key(w)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.writes.len()
    }
}

fn key(w: &Write) -> Vec<u8> {
    let mut k = Vec::with_capacity(PREFIX.len() + 20);
    k.extend_from_slice(PREFIX);
    k.extend_from_slice(&w.0.to_be_bytes());
    k.extend_from_slice(&w.1.to_be_bytes());
    k.extend_from_slice(&w.2.to_be_bytes());
    k
}

/// Every write the metadata records as held by the log, with the last batch that took it
/// (a record whose batch cannot be read counts as of the newest batch: taken for lost).
pub(crate) fn load(pool: &Pool) -> Result<Vec<(Write, u64)>> {
    let mut out = Vec::new();
    pool.meta().for_each_prefix(CF_POOL, PREFIX, |k, v| {
        let k = &k[PREFIX.len()..];
        if k.len() == 20 {
            let w = (
                u32::from_be_bytes(k[..4].try_into().expect("4 bytes")),
                u64::from_be_bytes(k[4..12].try_into().expect("8 bytes")),
                u64::from_be_bytes(k[12..].try_into().expect("8 bytes")),
            );
            let seq = v.try_into().map(u64::from_be_bytes).unwrap_or(u64::MAX);
            out.push((w, seq));
        }
        Ok(())
    })?;
    Ok(out)
}

pub(crate) fn put(b: &mut MetaBatch, ws: &[(Write, u64)]) {
    for (w, seq) in ws {
        b.put(CF_POOL, key(w), seq.to_be_bytes());
    }
}

pub(crate) fn delete(b: &mut MetaBatch, ws: &[Write]) {
    for w in ws {
        b.delete(CF_POOL, key(w));
    }
}

/// Deletes every record of a slab set's writes.
pub(crate) fn delete_set(b: &mut MetaBatch, set: u32) {
    let mut from = PREFIX.to_vec();
    from.extend_from_slice(&set.to_be_bytes());
    let mut to = from.clone();
    // Past every key of the set (they are 20 bytes after the prefix).
    to.extend_from_slice(&[0xff; 17]);
    b.delete_range(CF_POOL, from, to);
}

/// Deletes every record.
pub(crate) fn delete_all(b: &mut MetaBatch) {
    let mut to = PREFIX.to_vec();
    to.extend_from_slice(&[0xff; 21]);
    b.delete_range(CF_POOL, PREFIX, to);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_taken_again_stays_until_its_last_batch_is_freed() {
        let mut h = Held::default();
        let w = (3, 4096, 8192);
        h.wrote(w, 10);
        assert_eq!(h.take_unsaved(), vec![(w, 10)]);
        h.wrote(w, 20);
        assert_eq!(h.take_unsaved(), vec![(w, 20)], "recorded again with its new batch");
        h.wrote(w, 20);
        assert!(h.take_unsaved().is_empty(), "already recorded");
        assert!(h.freed(10, &[w]).is_empty(), "batch 20 holds it still");
        assert!(h.holds(&w));
        assert_eq!(h.freed(20, &[w]), vec![w]);
        assert!(!h.holds(&w));
    }

    /// A freed write whose deletion could not be saved is held again as recorded; but if a
    /// newer batch took it meanwhile, it must still be recorded with that batch, or a flush
    /// would answer for the newer copy with the record of the older.
    #[test]
    fn a_write_taken_again_while_its_deletion_failed_is_recorded_with_its_new_batch() {
        let mut h = Held::default();
        let (w, v) = ((2, 0, 4096), (2, 8192, 4096));
        h.wrote(w, 8);
        h.wrote(v, 8);
        assert_eq!(h.take_unsaved().len(), 2);
        let freed = h.freed(8, &[w, v]);
        assert_eq!(freed.len(), 2);
        h.wrote(w, 12);
        h.restore(&freed.iter().map(|&x| (x, 8)).collect::<Vec<_>>());
        assert_eq!(
            h.take_unsaved(),
            vec![(w, 12)],
            "only the write taken again is recorded anew"
        );
        assert!(h.holds(&v));
    }

    /// Without a flush, what waits to be recorded is no more than the live log holds.
    #[test]
    fn writes_freed_before_any_flush_leave_nothing_to_record() {
        let mut h = Held::default();
        for seq in 1..=1000u64 {
            let w = (1, seq * 4096, 4096);
            h.wrote(w, seq);
            assert!(h.freed(seq, &[w]).is_empty(), "never recorded");
        }
        assert!(!h.has_unsaved());
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn a_write_never_recorded_leaves_nothing_to_delete_and_a_failed_save_is_retried() {
        let mut h = Held::default();
        let (a, b) = ((1, 0, 4096), (1, 4096, 4096));
        h.wrote(a, 1);
        h.wrote(b, 1);
        let taken = h.take_unsaved();
        assert_eq!(taken.len(), 2);
        h.unsave(&taken);
        h.unsave(&taken);
        assert_eq!(h.take_unsaved().len(), 2, "each given back once");
        h.unsave(&[(a, 1)]);
        assert_eq!(h.freed(1, &[a, b]), vec![b], "only what the metadata has is deleted");
        assert!(h.take_unsaved().is_empty(), "a write that left is not recorded");
        assert_eq!(h.len(), 0);
    }
}
