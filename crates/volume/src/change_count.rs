//! How many changes a vdisk has admitted: what lets dedup know that nothing changed a vdisk
//! between two moments without reading its data again. Every change of a vdisk's data or
//! grain map enters through its gate ([`Vdisk::enter_change`](crate::vdisk::Vdisk)), which
//! counts it in and, when it is done, out. A moment at which every change that entered has
//! left, and a later moment at which none more has entered, bound a span in which the
//! vdisk's data did not change.
//!
//! Dedup's own remapping is the one change not counted: it points a grain at a slot that
//! holds the same bytes, so no grain's data changes.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// A moment of one vdisk's opening: its epoch and the changes admitted by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub epoch: u64,
    pub changes: u64,
}

pub(crate) struct ChangeCount {
    /// Unique to this opening of the vdisk: a count from another opening (an index entry
    /// written before a restart) never matches.
    epoch: u64,
    entered: AtomicU64,
    left: AtomicU64,
}

/// Epochs: a random 64-bit number drawn at the first use (the standard library's hasher
/// keys come from the operating system's randomness; the clock and the process id are mixed
/// in), then one more per vdisk opened, so that no two openings share one, in this process
/// or another.
fn next_epoch() -> u64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut h = RandomState::new().build_hasher();
        (nanos, std::process::id()).hash(&mut h);
        AtomicU64::new(h.finish())
    })
    .fetch_add(1, Ordering::Relaxed)
}

impl ChangeCount {
    pub fn new() -> ChangeCount {
        ChangeCount {
            epoch: next_epoch(),
            entered: AtomicU64::new(0),
            left: AtomicU64::new(0),
        }
    }

    pub fn enter(&self) {
        self.entered.fetch_add(1, Ordering::SeqCst);
    }

    pub fn leave(&self) {
        self.left.fetch_add(1, Ordering::SeqCst);
    }

    /// Now, if no change is under way: every change that entered has left.
    pub fn quiet(&self) -> Option<Mark> {
        let entered = self.entered.load(Ordering::SeqCst);
        (self.left.load(Ordering::SeqCst) == entered).then_some(Mark {
            epoch: self.epoch,
            changes: entered,
        })
    }

    /// True if no change entered since `m` (a mark of this opening).
    pub fn unchanged_since(&self, m: Mark) -> bool {
        m.epoch == self.epoch && self.entered.load(Ordering::SeqCst) == m.changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_under_way_or_entered_since_breaks_the_span() {
        let c = ChangeCount::new();
        let m = c.quiet().expect("nothing under way");
        assert!(c.unchanged_since(m));
        c.enter();
        assert!(c.quiet().is_none(), "a change is under way");
        assert!(!c.unchanged_since(m));
        c.leave();
        let later = c.quiet().expect("the change left");
        assert!(c.unchanged_since(later));
        assert!(!c.unchanged_since(m));
    }

    #[test]
    fn marks_of_another_opening_never_match() {
        let (a, b) = (ChangeCount::new(), ChangeCount::new());
        assert!(!b.unchanged_since(a.quiet().unwrap()));
    }
}
