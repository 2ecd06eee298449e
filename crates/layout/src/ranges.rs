//! Byte ranges `[a, b)`: what a set of them leaves uncovered within bounds. Shared by the
//! layout's parity writes (which read only what a write leaves alone) and the write-back
//! destager (which reads only what its pieces leave alone).

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
