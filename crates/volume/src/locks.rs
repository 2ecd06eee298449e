//! Grain locks: a fixed table of reader-writer locks indexed by a hash of (vdisk, grain).
//! Reads take their grains shared (`read_many`); anything that may change a grain's map entry
//! or its data takes it exclusively. Code that holds several at once takes them through
//! `read_many` or `lock_many`, in ascending table order, so two such callers cannot deadlock.

use std::sync::Arc;

use parking_lot::{ArcRwLockReadGuard, ArcRwLockWriteGuard, RawRwLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

const GRAIN_LOCKS: usize = 65536;

pub struct GrainLocks {
    /// Each in an Arc so that a read in flight on a caller's own io_uring can hold its
    /// grains ([`try_read_owned`](GrainLocks::try_read_owned)).
    table: Vec<Arc<RwLock<()>>>,
}

/// A grain held shared, owned.
pub type OwnedReadGuard = ArcRwLockReadGuard<RawRwLock, ()>;
/// A grain held exclusively, owned.
pub type OwnedWriteGuard = ArcRwLockWriteGuard<RawRwLock, ()>;

impl GrainLocks {
    pub fn new() -> GrainLocks {
        GrainLocks {
            table: (0..GRAIN_LOCKS).map(|_| Arc::new(RwLock::new(()))).collect(),
        }
    }

    /// Neighbouring grains of a vdisk take neighbouring slots of the table (from a place that
    /// depends on the vdisk): a caller holding a run of grains (a large read, a dedup batch)
    /// then shares no slot with one holding the next run, where scattered slots would make
    /// almost every pair of such callers collide somewhere and wait for each other.
    fn index(vdisk: u64, grain: u64) -> usize {
        let base = vdisk.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        (base.wrapping_add(grain) % GRAIN_LOCKS as u64) as usize
    }

    /// The table slots of the listed grains, each once, in table order: the order in which
    /// every caller holding several takes them.
    fn slots(grains: impl IntoIterator<Item = (u64, u64)>) -> Vec<usize> {
        let mut idx: Vec<usize> = grains.into_iter().map(|(v, g)| Self::index(v, g)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx
    }

    pub fn write(&self, vdisk: u64, grain: u64) -> RwLockWriteGuard<'_, ()> {
        self.table[Self::index(vdisk, grain)].write()
    }

    /// Shared locks on every listed grain, each table slot once, in table order.
    pub fn read_many(&self, grains: impl IntoIterator<Item = (u64, u64)>) -> Vec<RwLockReadGuard<'_, ()>> {
        Self::slots(grains).into_iter().map(|i| self.table[i].read()).collect()
    }

    /// Shared locks on every listed grain, owned, or None when any is held or awaited by a
    /// writer: never blocks. A caller that cannot block (it would hold up the completion
    /// of reads a writer waits for) falls back to a path that may.
    pub fn try_read_owned(&self, grains: impl IntoIterator<Item = (u64, u64)>) -> Option<Vec<OwnedReadGuard>> {
        Self::slots(grains)
            .into_iter()
            .map(|i| self.table[i].try_read_arc())
            .collect()
    }

    /// Exclusive locks on every listed grain, owned, or None when any is held: never
    /// blocks (a caller that cannot block falls back to a path that may).
    pub fn try_write_owned(&self, grains: impl IntoIterator<Item = (u64, u64)>) -> Option<Vec<OwnedWriteGuard>> {
        Self::slots(grains)
            .into_iter()
            .map(|i| self.table[i].try_write_arc())
            .collect()
    }

    /// Exclusive locks on every listed grain, each table slot once, in table order.
    pub fn lock_many(&self, grains: impl IntoIterator<Item = (u64, u64)>) -> Vec<RwLockWriteGuard<'_, ()>> {
        Self::slots(grains).into_iter().map(|i| self.table[i].write()).collect()
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

    #[test]
    fn owned_read_locks_give_way_to_writers_without_blocking() {
        let l = GrainLocks::new();
        let held = l.try_read_owned([(1, 5), (1, 6)]).expect("free grains");
        // Shared with other readers; a writer waits for them.
        assert!(l.try_read_owned([(1, 5)]).is_some());
        assert!(l.table[GrainLocks::index(1, 5)].try_write().is_none());
        drop(held);
        let w = l.write(1, 6);
        assert!(l.try_read_owned([(1, 5), (1, 6)]).is_none(), "a writer holds grain 6");
        assert!(l.try_read_owned([(1, 5)]).is_some());
        drop(w);
        assert!(l.try_read_owned([(1, 6)]).is_some());
    }
}
