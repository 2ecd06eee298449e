//! What a vdisk wrote since its last flush, so that its flush fails when that data may be lost.
//!
//! A member whose flush fails is failed at once, and later flushes skip it. A write that had
//! reached it, acknowledged to a host whose flush only began afterwards, would then be
//! reported durable by a flush that never saw the member go (on a layout without redundancy,
//! such data is gone). So each vdisk notes the slab sets it writes, with the pool's loss
//! count taken before each write, and its flush asks, once the disks are flushed, whether one
//! of those sets has lost data since. Only this vdisk's flush fails for its own sets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tessera_layout::SlabSet;

use crate::error::{Result, VolumeError};

/// `S` is what a flush asks about: a slab set (a plain id in the tests).
pub(crate) struct Unsynced<S = Arc<SlabSet>> {
    /// Per slab set id written since the last flush took them: the set and the smallest loss
    /// count noted by a write into it.
    pending: Mutex<HashMap<u32, (S, u64)>>,
    /// Flushes begun so far: each takes a ticket before it waits for its turn.
    begun: AtomicU64,
    /// Held by the flush under way; holds the last failure and the tickets it answers: every
    /// flush begun before that failure was found may cover the writes it lost.
    turn: Mutex<Option<(u64, String)>>,
}

impl<S> Default for Unsynced<S> {
    fn default() -> Unsynced<S> {
        Unsynced {
            pending: Mutex::new(HashMap::new()),
            begun: AtomicU64::new(0),
            turn: Mutex::new(None),
        }
    }
}

impl<S: Clone> Unsynced<S> {
    /// Records a completed write into set `id` begun when the pool's loss count was `noted`.
    pub fn note(&self, id: u32, set: &S, noted: u64) {
        self.pending
            .lock()
            .entry(id)
            .and_modify(|(_, n)| *n = (*n).min(noted))
            .or_insert_with(|| (set.clone(), noted));
    }

    /// Runs `flush` (which makes every completed write durable, or fails) for the writes
    /// noted so far, then fails if `lost` says one of their sets may have lost them since.
    /// A failure is reported to this flush and to every flush begun before it was found;
    /// the sets it covered are not asked about again.
    pub fn flush(&self, flush: impl FnOnce() -> Result<()>, lost: impl Fn(&S, u64) -> bool) -> Result<()> {
        let ticket = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        let mut turn = self.turn.lock();
        if let Some((through, why)) = &*turn {
            if ticket <= *through {
                return Err(VolumeError::Lost(why.clone()));
            }
        }
        // Taken before the flush: a write completed after this point is covered by the next.
        let taken = std::mem::take(&mut *self.pending.lock());
        let result = flush().and_then(|()| match taken.iter().find(|(_, (set, noted))| lost(set, *noted)) {
            Some((id, _)) => Err(VolumeError::Lost(format!(
                "slab set {id} lost more disks than it tolerates after it was written: \
                 data written since the last flush may be lost"
            ))),
            None => Ok(()),
        });
        if let Err(e) = &result {
            *turn = Some((self.begun.load(Ordering::SeqCst), e.to_string()));
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    /// Sets named by their id alone.
    type Ids = Unsynced<u32>;

    fn note(u: &Ids, id: u32, noted: u64) {
        u.note(id, &id, noted)
    }

    #[test]
    fn a_set_lost_after_its_write_fails_the_flush_once() {
        let u = Ids::default();
        note(&u, 1, 5);
        note(&u, 2, 5);
        let lost = |s: &u32, noted: u64| *s == 2 && noted < 6;
        assert!(matches!(u.flush(|| Ok(()), lost), Err(VolumeError::Lost(_))));
        // Reported; the next flush covers only what was written after it.
        assert!(u.flush(|| Ok(()), lost).is_ok());
        // A write begun after the loss is not lost by it.
        note(&u, 2, 6);
        assert!(u.flush(|| Ok(()), lost).is_ok());
    }

    #[test]
    fn the_oldest_write_into_a_set_decides() {
        let u = Ids::default();
        note(&u, 1, 3);
        note(&u, 1, 9);
        assert!(u.flush(|| Ok(()), |_, noted| noted < 4).is_err());
    }

    #[test]
    fn a_failed_disk_flush_fails_the_caller_whatever_its_sets() {
        let u = Ids::default();
        let r = u.flush(|| Err(VolumeError::Cache("flush failed".into())), |_, _| false);
        assert!(matches!(r, Err(VolumeError::Cache(_))));
        assert!(u.flush(|| Ok(()), |_, _| false).is_ok());
    }

    /// A flush that waited while another found a loss shares that failure: the writes it
    /// must cover may be among those the other took.
    #[test]
    fn a_flush_waiting_behind_a_failing_one_fails_too() {
        let u = Ids::default();
        note(&u, 7, 0);
        let inside = Barrier::new(2);
        let release = Barrier::new(2);
        std::thread::scope(|s| {
            let first = s.spawn(|| {
                u.flush(
                    || {
                        inside.wait();
                        release.wait();
                        Ok(())
                    },
                    |_, _| true,
                )
            });
            inside.wait();
            let second = s.spawn(|| u.flush(|| Ok(()), |_, _| false));
            // The second has its ticket once `begun` moves; then the first may finish.
            while u.begun.load(Ordering::SeqCst) < 2 {
                std::thread::yield_now();
            }
            release.wait();
            assert!(first.join().unwrap().is_err());
            assert!(matches!(second.join().unwrap(), Err(VolumeError::Lost(_))));
        });
        // One begun after the failure was found succeeds.
        assert!(u.flush(|| Ok(()), |_, _| true).is_ok());
    }
}
