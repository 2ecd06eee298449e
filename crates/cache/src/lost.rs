//! Ranges whose data was lost with the write-back log's last disk: the log held them, not
//! destaged, and grain maps committed while the log held them point at slots that still hold
//! whatever was there before. Reads of them fail until a write replaces them; the ranges are
//! kept in the pool's metadata, so that a restart fails them too rather than read stale data.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tessera_layout::ranges::ByteRanges;
use tessera_pool::{Pool, CF_POOL};

use crate::error::{CacheError, Result};

const LOST_KEY: &[u8] = b"write-back-lost";

/// Byte ranges per slab set, each set's kept merged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LostRanges {
    sets: HashMap<u32, ByteRanges>,
}

impl LostRanges {
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.sets.values().map(ByteRanges::bytes).sum()
    }

    /// Adds `[a, b)` of `set`, merged with the ranges it touches.
    pub fn insert(&mut self, set: u32, a: u64, b: u64) {
        if a < b {
            self.sets.entry(set).or_default().insert(a, b);
        }
    }

    /// Removes `[a, b)` of `set`; true if anything was there.
    pub fn cut(&mut self, set: u32, a: u64, b: u64) -> bool {
        let Some(m) = self.sets.get_mut(&set) else { return false };
        let hit = m.cut(a, b);
        if m.is_empty() {
            self.sets.remove(&set);
        }
        hit
    }

    pub fn overlaps(&self, set: u32, a: u64, b: u64) -> bool {
        self.sets.get(&set).is_some_and(|m| m.overlaps(a, b))
    }

    /// Every range: (set, start, end).
    pub fn ranges(&self) -> Vec<(u32, u64, u64)> {
        self.sets
            .iter()
            .flat_map(|(&set, m)| m.iter().map(move |(a, b)| (set, a, b)))
            .collect()
    }

    /// The parts of `[a, b)` of `set` that are held.
    pub fn within(&self, set: u32, a: u64, b: u64) -> Vec<(u64, u64)> {
        self.sets.get(&set).map_or_else(Vec::new, |m| m.within(a, b))
    }

    /// Whether `set` has a range.
    pub fn has_set(&self, set: u32) -> bool {
        self.sets.get(&set).is_some_and(|m| !m.is_empty())
    }

    /// The bytes `set`'s ranges hold.
    pub fn set_bytes(&self, set: u32) -> u64 {
        self.sets.get(&set).map_or(0, ByteRanges::bytes)
    }

    /// The sets that have a range.
    pub fn sets(&self) -> Vec<u32> {
        let mut sets: Vec<u32> = self.sets.keys().copied().collect();
        sets.sort_unstable();
        sets
    }

    /// Forgets a slab set; true if it had ranges.
    pub fn remove_set(&mut self, set: u32) -> bool {
        self.sets.remove(&set).is_some()
    }

    pub fn load(pool: &Pool) -> Result<LostRanges> {
        match pool.meta().get(CF_POOL, LOST_KEY)? {
            None => Ok(LostRanges::default()),
            Some(v) => Self::from_record(&v),
        }
    }

    /// The ranges a record holds, merged again as `insert` keeps them: a record whose ranges
    /// overlap (written by hand, or damaged and still JSON) must still fail every read of
    /// them, which `overlaps` finds only among merged ranges. A range that ends before it
    /// starts names no bytes for sure: refused.
    fn from_record(v: &[u8]) -> Result<LostRanges> {
        let unreadable = |why: String| CacheError::Log(format!("unreadable record of data lost with the log: {why}"));
        let raw: LostRanges = serde_json::from_slice(v).map_err(|e| unreadable(e.to_string()))?;
        let mut out = LostRanges::default();
        for (set, m) in raw.sets {
            let m = m.merged().map_err(|(a, b)| {
                unreadable(format!(
                    "a range of slab set {set} ends at {b}, before it starts at {a}"
                ))
            })?;
            if !m.is_empty() {
                out.sets.insert(set, m);
            }
        }
        Ok(out)
    }

    /// Writes the ranges to the pool's metadata, synchronously.
    pub fn save(&self, pool: &Pool) -> Result<()> {
        let mut b = tessera_pool::MetaBatch::new();
        if self.is_empty() {
            b.delete(CF_POOL, LOST_KEY);
        } else {
            b.put(CF_POOL, LOST_KEY, serde_json::to_vec(self).expect("serialisable"));
        }
        pool.meta().commit(b, true)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u32, u64, u64),
        Cut(u32, u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        (any::<bool>(), 0u32..2, 0u64..64, 0u64..16).prop_map(|(ins, set, a, len)| {
            if ins {
                Op::Insert(set, a, a + len)
            } else {
                Op::Cut(set, a, a + len)
            }
        })
    }

    proptest! {
        /// Against a map of every byte: the same bytes lost, ranges never overlapping nor
        /// touching (kept merged), and the record read back equal.
        #[test]
        fn ranges_match_a_map_of_every_byte(ops in proptest::collection::vec(op(), 0..40)) {
            let mut r = LostRanges::default();
            let mut bytes = [[false; 80]; 2];
            for o in &ops {
                match *o {
                    Op::Insert(s, a, b) => {
                        r.insert(s, a, b);
                        for x in a..b { bytes[s as usize][x as usize] = true; }
                    }
                    Op::Cut(s, a, b) => {
                        let had = (a..b).any(|x| bytes[s as usize][x as usize]);
                        prop_assert_eq!(r.cut(s, a, b), had);
                        for x in a..b { bytes[s as usize][x as usize] = false; }
                    }
                }
            }
            for s in 0..2u32 {
                let held = bytes[s as usize].iter().filter(|&&b| b).count() as u64;
                prop_assert_eq!(r.set_bytes(s), held);
                prop_assert_eq!(r.has_set(s), held > 0);
                for a in 0..80u64 {
                    for len in 1..6u64 {
                        let b = (a + len).min(80);
                        let want = (a..b).any(|x| bytes[s as usize][x as usize]);
                        prop_assert_eq!(r.overlaps(s, a, b), want, "set {} [{}, {})", s, a, b);
                    }
                }
                if let Some(m) = r.sets.get(&s) {
                    let v: Vec<_> = m.iter().collect();
                    for w in v.windows(2) {
                        prop_assert!(w[0].1 < w[1].0, "kept apart: {:?}", v);
                    }
                    prop_assert!(m.iter().all(|(a, b)| a < b));
                }
            }
            for s in 0..2u32 {
                for (a, b) in [(0u64, 80u64), (3, 17), (40, 41)] {
                    let mut got = [false; 80];
                    for (x, y) in r.within(s, a, b) {
                        prop_assert!(a <= x && x < y && y <= b);
                        for k in x..y { got[k as usize] = true; }
                    }
                    for k in a..b {
                        prop_assert_eq!(got[k as usize], bytes[s as usize][k as usize]);
                    }
                }
            }
            let listed: u64 = r.ranges().iter().map(|(_, a, b)| b - a).sum();
            prop_assert_eq!(listed, r.bytes());
            let total: usize = bytes.iter().map(|s| s.iter().filter(|x| **x).count()).sum();
            prop_assert_eq!(r.bytes(), total as u64);
            prop_assert_eq!(r.is_empty(), total == 0);
            let back = LostRanges::from_record(&serde_json::to_vec(&r).unwrap()).unwrap();
            prop_assert_eq!(back, r);
        }
    }

    /// A record whose ranges overlap is merged as it is read: every byte it names is still
    /// found lost; one whose range ends before it starts is refused.
    #[test]
    fn a_record_of_overlapping_ranges_is_merged_and_a_backward_one_refused() {
        let r = LostRanges::from_record(br#"{"sets":{"1":{"0":20000,"8192":16384}}}"#).unwrap();
        assert!(r.overlaps(1, 17000, 18000));
        assert_eq!(r.bytes(), 20000);
        assert_eq!(r.ranges(), vec![(1, 0, 20000)]);
        let e = LostRanges::from_record(br#"{"sets":{"1":{"100":50}}}"#).unwrap_err();
        assert!(e.to_string().contains("ends at 50, before it starts at 100"), "{e}");
    }
}
