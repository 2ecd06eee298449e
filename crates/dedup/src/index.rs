//! The fingerprint index: for each class of grains (layout and grain size) and fingerprint,
//! where data with that fingerprint was found (a grain slot, and the vdisk grain that held it
//! then). It lives in the pool's metadata store (column family `dedup`), so its size on disk
//! grows with the unique data and its memory does not: RocksDB's memtable and a bounded block
//! cache (`DEDUP_INDEX_CACHE`) are all it holds in memory.
//!
//! The index is advisory. An entry may be stale (the slot rewritten in place, freed, or
//! reused) or name data that merely collides: the volume layer shares a grain only when the
//! entry's vouch still holds (below) and the whole 256-bit hashes are equal, or after it
//! compared the bytes, and corrects the entry when they differ.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use tessera_pool::{MetaBatch, MetaStore, Result, CF_DEDUP};

use crate::fingerprint::{Fingerprint, HashTail};

/// A class tag (4 bytes) then the fingerprint (16): the grains that may share a slot.
pub type IndexKey = [u8; 20];

/// A tag for a class of grains, from a stable description of it (its layout spec and grain
/// size as JSON): grains of different classes are never shared, so a vdisk keeps the
/// resilience it was made with. A tag that two classes happen to share costs misses only: the
/// volume layer checks the class before sharing.
pub fn class_tag(description: &str) -> u32 {
    let h = blake3::hash(description.as_bytes());
    u32::from_be_bytes(h.as_bytes()[..4].try_into().expect("4 bytes"))
}

pub fn key(class: u32, f: &Fingerprint) -> IndexKey {
    let mut k = [0u8; 20];
    k[..4].copy_from_slice(&class.to_be_bytes());
    k[4..].copy_from_slice(&f.0);
    k
}

/// Where data with a fingerprint was found: a grain slot, and the grain (vdisk id, index)
/// that pointed at it when it was indexed. The grain's lock is what keeps writers out of an
/// unshared slot while it is compared and shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub loc: u64,
    pub vdisk: u64,
    pub grain: u64,
    /// Set when the slot was known to hold the hashed bytes as the entry was made.
    pub vouch: Option<Vouch>,
}

/// What lets a later run share with an entry's slot without reading it: the rest of the
/// 256-bit hash of the bytes the slot held, and the change count of the owning vdisk (an
/// epoch unique to the vdisk's opening, and how many changes it had admitted) when those
/// bytes were read and nothing was changing it. While the owner has admitted no change
/// since and its grain still points at the slot, the slot holds those bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vouch {
    pub tail: HashTail,
    pub epoch: u64,
    pub changes: u64,
}

/// Bytes of an entry without a vouch, and with one.
const PLAIN_LEN: usize = 24;
const VOUCHED_LEN: usize = PLAIN_LEN + 32;

impl IndexEntry {
    pub fn to_bytes(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(VOUCHED_LEN);
        v.extend_from_slice(&self.loc.to_le_bytes());
        v.extend_from_slice(&self.vdisk.to_le_bytes());
        v.extend_from_slice(&self.grain.to_le_bytes());
        if let Some(w) = self.vouch {
            v.extend_from_slice(&w.tail);
            v.extend_from_slice(&w.epoch.to_le_bytes());
            v.extend_from_slice(&w.changes.to_le_bytes());
        }
        v
    }

    pub fn parse(b: &[u8]) -> Option<IndexEntry> {
        if b.len() != PLAIN_LEN && b.len() != VOUCHED_LEN {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        Some(IndexEntry {
            loc: word(0),
            vdisk: word(8),
            grain: word(16),
            vouch: (b.len() == VOUCHED_LEN).then(|| Vouch {
                tail: b[24..40].try_into().expect("16 bytes"),
                epoch: word(40),
                changes: word(48),
            }),
        })
    }
}

/// How big the index is and what it holds in memory.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IndexStats {
    /// Entries, as RocksDB estimates them: about one per unique grain indexed.
    pub entries: u64,
    /// Bytes in memory: the memtable and the index's block cache (filters and index blocks
    /// included), bounded by the cache's capacity however many entries there are.
    pub memory_bytes: u64,
    /// Bytes on disk in the metadata store.
    pub disk_bytes: u64,
}

pub struct FingerprintIndex {
    meta: Arc<MetaStore>,
}

impl FingerprintIndex {
    pub fn new(meta: Arc<MetaStore>) -> FingerprintIndex {
        FingerprintIndex { meta }
    }

    /// The entries of `keys`, in order.
    pub fn get_many(&self, keys: &[IndexKey]) -> Result<Vec<Option<IndexEntry>>> {
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        Ok(self
            .meta
            .multi_get(CF_DEDUP, &refs)?
            .into_iter()
            .map(|v| v.as_deref().and_then(IndexEntry::parse))
            .collect())
    }

    /// The entries found for `keys`, by key (keys with none are left out).
    pub fn found(&self, keys: &[IndexKey]) -> Result<FxHashMap<IndexKey, IndexEntry>> {
        Ok(keys
            .iter()
            .zip(self.get_many(keys)?)
            .filter_map(|(k, e)| Some((*k, e?)))
            .collect())
    }

    /// Writes entries without waiting for them to be durable: the index is advisory, and an
    /// entry lost in a crash is a duplicate found at the next run instead of this one. In key
    /// order: fingerprints come in no order, and the store's in-memory table inserts each key
    /// from where the last one went, which for keys in order is a short walk.
    pub fn put_many(&self, entries: &[(IndexKey, IndexEntry)]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        // Stable: of two entries for one key, the later still goes in last.
        let mut sorted: Vec<&(IndexKey, IndexEntry)> = entries.iter().collect();
        sorted.sort_by_key(|(k, _)| *k);
        let mut b = MetaBatch::new();
        for (k, e) in sorted {
            b.put(CF_DEDUP, k, e.to_bytes());
        }
        self.meta.commit(b, false)
    }

    pub fn delete_many(&self, keys: &[IndexKey]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut b = MetaBatch::new();
        for k in keys {
            b.delete(CF_DEDUP, k);
        }
        self.meta.commit(b, false)
    }

    /// Visits every entry (a garbage collection of the index).
    pub fn for_each(&self, mut f: impl FnMut(IndexKey, IndexEntry)) -> Result<()> {
        self.meta.for_each_prefix(CF_DEDUP, &[], |k, v| {
            if let (Ok(k), Some(e)) = (IndexKey::try_from(k), IndexEntry::parse(v)) {
                f(k, e);
            }
            Ok(())
        })
    }

    pub fn stats(&self) -> IndexStats {
        IndexStats {
            entries: self.meta.estimate_keys(CF_DEDUP),
            memory_bytes: self.meta.dedup_index_memory(),
            disk_bytes: self.meta.stored_bytes(CF_DEDUP),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fingerprinter;

    #[test]
    fn entries_round_trip_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Arc::new(MetaStore::create(&dir.path().join("meta")).unwrap());
        let idx = FingerprintIndex::new(meta);
        let f = Fingerprinter::Blake3;
        let (a, b) = (key(1, &f.of(b"a")), key(2, &f.of(b"a")));
        let e = IndexEntry {
            loc: 0x1_0000_0007,
            vdisk: 3,
            grain: 99,
            vouch: None,
        };
        let vouched = IndexEntry {
            vouch: Some(Vouch {
                tail: [5; 16],
                epoch: 0xdead_beef_0000_0001,
                changes: 42,
            }),
            ..e
        };
        idx.put_many(&[(a, e), (b, vouched)]).unwrap();
        assert_eq!(idx.get_many(&[a, b]).unwrap(), vec![Some(e), Some(vouched)]);
        let mut seen = Vec::new();
        idx.for_each(|k, e| seen.push((k, e))).unwrap();
        assert_eq!(seen, vec![(a, e), (b, vouched)]);
        idx.delete_many(&[a, b]).unwrap();
        assert_eq!(idx.get_many(&[a, b]).unwrap(), vec![None, None]);
    }

    /// Entries go in in key order whatever order they come in, and of two for one key the
    /// later is the one kept.
    #[test]
    fn entries_in_any_order_and_the_later_of_two_for_a_key_kept() {
        let dir = tempfile::tempdir().unwrap();
        let idx = FingerprintIndex::new(Arc::new(MetaStore::create(&dir.path().join("meta")).unwrap()));
        let f = Fingerprinter::Blake3;
        let entry = |grain| IndexEntry {
            loc: 0x1_0000_0007,
            vdisk: 3,
            grain,
            vouch: None,
        };
        let keys: Vec<IndexKey> = (0..50u32).map(|i| key(1, &f.of(&i.to_le_bytes()))).collect();
        let mut entries: Vec<(IndexKey, IndexEntry)> =
            keys.iter().enumerate().map(|(i, &k)| (k, entry(i as u64))).collect();
        entries.insert(10, (keys[30], entry(1000)));
        entries.push((keys[7], entry(2000)));
        idx.put_many(&entries).unwrap();
        let got = idx.get_many(&keys).unwrap();
        for (i, e) in got.into_iter().enumerate() {
            let want = match i {
                7 => 2000,
                // Put before keys[30]'s own entry, so that one is the later.
                30 => 30,
                _ => i as u64,
            };
            assert_eq!(e.map(|e| e.grain), Some(want), "key {i}");
        }
    }

    #[test]
    fn a_malformed_entry_reads_as_none() {
        assert_eq!(IndexEntry::parse(&[1, 2, 3]), None);
    }
}
