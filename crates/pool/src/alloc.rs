//! Slab allocation: which slabs of which disk are in use. The truth lives in the layout's slab
//! set descriptors; this in-memory table is rebuilt from them when a pool is opened.

use serde::{Deserialize, Serialize};

/// One slab: `slab` indexes the slabs of the disk at pool position `disk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SlabRef {
    pub disk: u32,
    pub slab: u32,
}

/// The used/free state of one disk's slabs.
#[derive(Debug, Clone, Default)]
pub struct SlabMap {
    used: Vec<bool>,
    used_count: u32,
}

impl SlabMap {
    pub fn new(slabs: u32) -> SlabMap {
        SlabMap {
            used: vec![false; slabs as usize],
            used_count: 0,
        }
    }

    pub fn total(&self) -> u32 {
        self.used.len() as u32
    }

    pub fn used(&self) -> u32 {
        self.used_count
    }

    pub fn free(&self) -> u32 {
        self.total() - self.used_count
    }

    /// Marks a slab used; false if it already was (a double allocation: a bug or a corrupt map).
    pub fn mark_used(&mut self, slab: u32) -> bool {
        match self.used.get_mut(slab as usize) {
            Some(u) if !*u => {
                *u = true;
                self.used_count += 1;
                true
            }
            _ => false,
        }
    }

    /// Frees a slab; false if it was not in use.
    pub fn release(&mut self, slab: u32) -> bool {
        match self.used.get_mut(slab as usize) {
            Some(u) if *u => {
                *u = false;
                self.used_count -= 1;
                true
            }
            _ => false,
        }
    }

    /// Takes the lowest free slab.
    pub fn take(&mut self) -> Option<u32> {
        let idx = self.used.iter().position(|u| !u)? as u32;
        self.mark_used(idx);
        Some(idx)
    }
}

/// Chooses `count` distinct disks among `candidates` (position, free slabs), the ones with the
/// most free slabs first, so that slab sets spread evenly as the pool fills.
pub fn choose_disks(mut candidates: Vec<(u32, u32)>, count: usize) -> Option<Vec<u32>> {
    candidates.retain(|&(_, free)| free > 0);
    if candidates.len() < count {
        return None;
    }
    candidates.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Some(candidates.into_iter().take(count).map(|(pos, _)| pos).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_map_accounts() {
        let mut m = SlabMap::new(3);
        assert_eq!(m.take(), Some(0));
        assert!(m.mark_used(2));
        assert!(!m.mark_used(2), "double allocation is refused");
        assert_eq!(m.free(), 1);
        assert_eq!(m.take(), Some(1));
        assert_eq!(m.take(), None);
        assert!(m.release(1));
        assert!(!m.release(1), "double free is refused");
        assert!(!m.mark_used(7), "out of range");
        assert_eq!(m.used(), 2);
    }

    #[test]
    fn choose_balances_by_free_space() {
        let c = vec![(0, 5), (1, 9), (2, 0), (3, 9), (4, 1)];
        assert_eq!(choose_disks(c.clone(), 2), Some(vec![1, 3]));
        assert_eq!(choose_disks(c.clone(), 4), Some(vec![1, 3, 0, 4]));
        assert_eq!(choose_disks(c, 5), None, "a full disk cannot take a slab");
    }
}
