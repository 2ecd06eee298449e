//! Byte ranges `[a, b)`: what a set of them leaves uncovered within bounds, shared by the
//! layout's parity writes (which read only what a write leaves alone) and the write-back
//! destager (which reads only what its pieces leave alone); and a merged set of them
//! (`ByteRanges`), which holds the blocks a slab set lost beyond repair and what the
//! write-back log lost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Byte ranges kept merged (start -> end): never overlapping nor touching.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ByteRanges(BTreeMap<u64, u64>);

impl ByteRanges {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.0.iter().map(|(a, b)| b - a).sum()
    }

    /// Adds `[a, b)`, merged with the ranges it touches.
    pub fn insert(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let m = &mut self.0;
        let (mut a, mut b) = (a, b);
        // A range that starts before `a` and reaches it.
        if let Some((&s, &e)) = m.range(..=a).next_back() {
            if e >= a {
                a = s;
                b = b.max(e);
            }
        }
        let touched: Vec<u64> = m.range(a..=b).map(|(&s, _)| s).collect();
        for s in touched {
            let e = m.remove(&s).expect("listed");
            b = b.max(e);
        }
        m.insert(a, b);
    }

    /// Removes `[a, b)`; true if anything was there.
    pub fn cut(&mut self, a: u64, b: u64) -> bool {
        if a >= b {
            return false;
        }
        let m = &mut self.0;
        let mut hit: Vec<(u64, u64)> = m.range(a..b).map(|(&s, &e)| (s, e)).collect();
        if let Some((&s, &e)) = m.range(..a).next_back() {
            if e > a {
                hit.push((s, e));
            }
        }
        for &(s, e) in &hit {
            m.remove(&s);
            if s < a {
                m.insert(s, a);
            }
            if e > b {
                m.insert(b, e);
            }
        }
        !hit.is_empty()
    }

    pub fn overlaps(&self, a: u64, b: u64) -> bool {
        a < b && self.0.range(..b).next_back().is_some_and(|(_, &e)| e > a)
    }

    /// Every range, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|(&a, &b)| (a, b))
    }

    /// The parts of `[a, b)` that are held, in order.
    pub fn within(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let m = &self.0;
        let first = m.range(..a).next_back().filter(|(_, &e)| e > a).map(|(&s, &e)| (s, e));
        first
            .into_iter()
            .chain(m.range(a..b).map(|(&s, &e)| (s, e)))
            .map(|(s, e)| (s.max(a), e.min(b)))
            .filter(|(s, e)| s < e)
            .collect()
    }

    /// The same ranges merged again as `insert` keeps them (a record whose ranges overlap,
    /// written by hand or damaged and still readable, must still find every byte it names),
    /// or the first range that ends before it starts, which names no bytes for sure.
    pub fn merged(&self) -> std::result::Result<ByteRanges, (u64, u64)> {
        let mut out = ByteRanges::default();
        for (a, b) in self.iter() {
            if a > b {
                return Err((a, b));
            }
            out.insert(a, b);
        }
        Ok(out)
    }
}

/// True if the ranges `[a, b)` together cover `[lo, hi)`.
pub fn covers(ranges: impl Iterator<Item = (u64, u64)>, lo: u64, hi: u64) -> bool {
    gaps(ranges, lo, hi).is_empty()
}

/// The parts of `[lo, hi)` that none of the ranges `[a, b)` covers, in order.
pub fn gaps(ranges: impl Iterator<Item = (u64, u64)>, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = ranges.collect();
    r.sort_unstable();
    let mut out = Vec::new();
    let mut reached = lo;
    for (a, b) in r {
        if a > reached && reached < hi {
            out.push((reached, a.min(hi)));
        }
        reached = reached.max(b);
    }
    if reached < hi {
        out.push((reached, hi));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{covers, gaps};

    #[test]
    fn gaps_are_what_no_range_covers_within_the_bounds() {
        assert_eq!(gaps([(4, 8), (0, 2)].into_iter(), 0, 10), vec![(2, 4), (8, 10)]);
        assert_eq!(gaps([(0, 3), (2, 10)].into_iter(), 0, 10), vec![]);
        assert_eq!(gaps(std::iter::empty(), 3, 7), vec![(3, 7)]);
        // Ranges reaching past the bounds, or outside them.
        assert_eq!(gaps([(0, 5), (9, 20)].into_iter(), 2, 12), vec![(5, 9)]);
        assert_eq!(gaps([(20, 30)].into_iter(), 2, 12), vec![(2, 12)]);
        assert!(covers([(0, 4), (4, 8)].into_iter(), 1, 8));
        assert!(!covers([(0, 4), (5, 8)].into_iter(), 1, 8));
    }
}
