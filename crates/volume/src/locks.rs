//! Grain locks: a fixed table of reader-writer locks indexed by a hash of (vdisk, grain).
//! Reads take their grains shared (`read_many`); anything that may change a grain's map entry
//! or its data takes it exclusively. Code that holds several at once takes them through
//! `read_many` or `lock_many`, in ascending table order, so two such callers cannot deadlock.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

const GRAIN_LOCKS: usize = 8192;

pub struct GrainLocks {
    table: Vec<RwLock<()>>,
}

impl GrainLocks {
    pub fn new() -> GrainLocks {
        GrainLocks {
            table: (0..GRAIN_LOCKS).map(|_| RwLock::new(())).collect(),
        }
    }

    fn index(vdisk: u64, grain: u64) -> usize {
        let h = vdisk.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ grain.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        ((h ^ (h >> 29)) % GRAIN_LOCKS as u64) as usize
    }

    pub fn write(&self, vdisk: u64, grain: u64) -> RwLockWriteGuard<'_, ()> {
        self.table[Self::index(vdisk, grain)].write()
    }

    /// Shared locks on every listed grain, each table slot once, in table order.
    pub fn read_many(&self, grains: impl IntoIterator<Item = (u64, u64)>) -> Vec<RwLockReadGuard<'_, ()>> {
        let mut idx: Vec<usize> = grains.into_iter().map(|(v, g)| Self::index(v, g)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.table[i].read()).collect()
    }

    /// Exclusive locks on every listed grain, each table slot once, in table order.
    pub fn lock_many(&self, grains: impl IntoIterator<Item = (u64, u64)>) -> Vec<RwLockWriteGuard<'_, ()>> {
        let mut idx: Vec<usize> = grains.into_iter().map(|(v, g)| Self::index(v, g)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.table[i].write()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_many_tolerates_colliding_grains() {
        let l = GrainLocks::new();
        // Many grains share table slots: taking them all at once must not self-deadlock.
        let g = l.lock_many((0..20_000).map(|g| (1, g)));
        assert!(g.len() <= GRAIN_LOCKS);
        drop(g);
        let r = l.read_many((0..20_000).map(|g| (1, g)).chain((0..100).map(|g| (1, g))));
        assert!(r.len() <= GRAIN_LOCKS);
    }
}
