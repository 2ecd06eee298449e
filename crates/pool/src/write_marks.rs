//! Which slabs of a disk may hold writes its medium does not have yet: written since the
//! disk's last successful flush, or being written now.
//!
//! A disk that an I/O error takes out while the pool runs keeps what it held at its last
//! successful flush, and no more is sure: its volatile cache may have lost the rest (a power
//! blip of its enclosure, a cable pulled), and a write that failed may have left anything
//! behind. Those slabs are stale should the disk come back; every other slab of it is as
//! current as the day it left (writes that go around it after that are recorded by the
//! layout layer, as for a missing disk).
//!
//! A write marks its slab before it looks for the disk and stamps it when done; a flush
//! takes a number before it starts, and once it succeeds every slab stamped before that
//! number is on the medium. A write that completes after the flush began may not be, and is
//! stamped at or after the number.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// The count flushes take their number from, shared by every disk of a pool.
pub(crate) type FlushClock = Arc<AtomicU64>;

pub(crate) fn new_clock() -> FlushClock {
    // Stamps start at 0 (never written), below the first flush's number.
    Arc::new(AtomicU64::new(1))
}

/// The number of a round of flushes, taken before any of its disks' flushes is issued.
pub(crate) fn flush_round(clock: &FlushClock) -> u64 {
    clock.fetch_add(1, Ordering::SeqCst) + 1
}

#[derive(Default)]
struct SlabMark {
    in_flight: AtomicU32,
    /// The clock when its last write completed; 0 if never written since the pool opened.
    stamp: AtomicU64,
}

/// The marks of one disk's slabs.
pub(crate) struct WriteMarks {
    slabs: Vec<SlabMark>,
    clock: FlushClock,
    /// The number of the last flush of this disk that succeeded.
    flushed_from: AtomicU64,
}

impl WriteMarks {
    pub(crate) fn new(slabs: u32, clock: &FlushClock) -> Arc<WriteMarks> {
        Arc::new(WriteMarks {
            slabs: (0..slabs).map(|_| SlabMark::default()).collect(),
            clock: clock.clone(),
            // Until a flush of it succeeds, every slab: what the disk's cache holds from
            // before the pool was opened is not known.
            flushed_from: AtomicU64::new(0),
        })
    }

    /// Marks `slab` written from now until the returned mark is dropped.
    pub(crate) fn begin(self: &Arc<Self>, slab: u32) -> WriteMark {
        if let Some(m) = self.slabs.get(slab as usize) {
            m.in_flight.fetch_add(1, Ordering::SeqCst);
        }
        WriteMark {
            marks: Some(self.clone()),
            slab,
        }
    }

    /// The flush numbered `n` succeeded: what was stamped before it is on the medium.
    pub(crate) fn flushed(&self, n: u64) {
        self.flushed_from.fetch_max(n, Ordering::SeqCst);
    }

    /// The number of the last flush of this disk that succeeded (0: none yet).
    pub(crate) fn flushed_from(&self) -> u64 {
        self.flushed_from.load(Ordering::SeqCst)
    }

    /// The slabs whose medium may lack writes: being written, or written since the last
    /// successful flush began.
    pub(crate) fn unflushed(&self) -> Vec<u32> {
        let from = self.flushed_from.load(Ordering::SeqCst);
        self.slabs
            .iter()
            .enumerate()
            .filter(|(_, m)| m.in_flight.load(Ordering::SeqCst) > 0 || m.stamp.load(Ordering::SeqCst) >= from)
            .map(|(i, _)| i as u32)
            .collect()
    }
}

/// A write of one slab under way; dropped once the disk answered it.
pub struct WriteMark {
    marks: Option<Arc<WriteMarks>>,
    slab: u32,
}

impl WriteMark {
    /// A mark that marks nothing: a disk the pool does not hold.
    pub(crate) fn none() -> WriteMark {
        WriteMark { marks: None, slab: 0 }
    }
}

impl WriteMarks {
    /// A write of `slab` completed when the clock read `at`.
    fn done(&self, slab: u32, at: u64) {
        if let Some(m) = self.slabs.get(slab as usize) {
            // Stamped before it stops counting as in flight, so that it is never neither; and
            // never lowered: another write of the slab may have completed after a flush began
            // and stamped it so, before this one (which read the clock earlier) got here.
            m.stamp.fetch_max(at, Ordering::SeqCst);
            m.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for WriteMark {
    fn drop(&mut self) {
        if let Some(marks) = &self.marks {
            marks.done(self.slab, marks.clock.load(Ordering::SeqCst));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slab_is_unflushed_from_its_write_until_a_flush_begun_after_it_succeeds() {
        let clock = new_clock();
        let marks = WriteMarks::new(4, &clock);
        assert_eq!(
            marks.unflushed(),
            vec![0, 1, 2, 3],
            "no flush yet: its cache may hold anything"
        );
        let n = flush_round(&clock);
        marks.flushed(n);
        assert!(marks.unflushed().is_empty(), "nothing written since a flush");
        let w = marks.begin(1);
        assert_eq!(marks.unflushed(), vec![1], "in flight");
        // A flush begun while the write is in flight does not cover it.
        let early = flush_round(&clock);
        drop(w);
        marks.flushed(early);
        assert_eq!(marks.unflushed(), vec![1], "completed after the flush began");
        let later = flush_round(&clock);
        assert_eq!(marks.unflushed(), vec![1], "until that flush succeeds");
        marks.flushed(later);
        assert!(marks.unflushed().is_empty());
        // A flush that failed covers nothing.
        drop(marks.begin(2));
        let _failed = flush_round(&clock);
        assert_eq!(marks.unflushed(), vec![2]);
        // An older flush answering late does not undo a newer one.
        let a = flush_round(&clock);
        let b = flush_round(&clock);
        marks.flushed(b);
        marks.flushed(a);
        assert!(marks.unflushed().is_empty());
    }

    #[test]
    fn a_write_that_read_the_clock_earlier_does_not_lower_the_stamp_of_a_later_one() {
        let clock = new_clock();
        let marks = WriteMarks::new(1, &clock);
        let n = flush_round(&clock);
        marks.flushed(n);
        let (_a, _b) = (marks.begin(0), marks.begin(0));
        let before = clock.load(Ordering::SeqCst);
        let flush = flush_round(&clock);
        // B completes after the flush began; A, which read the clock before it, lands last.
        marks.done(0, clock.load(Ordering::SeqCst));
        marks.done(0, before);
        std::mem::forget(_a);
        std::mem::forget(_b);
        marks.flushed(flush);
        assert_eq!(marks.unflushed(), vec![0], "B is not covered by that flush");
    }

    #[test]
    fn flushes_of_other_disks_do_not_cover_a_disk() {
        let clock = new_clock();
        let (one, two) = (WriteMarks::new(2, &clock), WriteMarks::new(2, &clock));
        let n = flush_round(&clock);
        one.flushed(n);
        drop(one.begin(0));
        let n = flush_round(&clock);
        two.flushed(n);
        assert_eq!(one.unflushed(), vec![0]);
        drop(one.begin(7)); // past its end: not tracked, no panic
    }
}
