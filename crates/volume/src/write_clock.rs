//! When each region of a vdisk was last written, and whether dedup has read it since, kept in
//! memory (8 bytes per MiB): what dedup's minimum age and its incremental runs go by. What
//! happened before the pool was opened is not known, so every region counts as written at
//! open.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;

/// Bytes of a vdisk that share one clock.
pub(crate) const REGION: u64 = 1 << 20;
/// Set by a write, cleared by the dedup run that reads the region after it.
const DIRTY: u64 = 1 << 32;

/// Seconds since the Unix epoch (fits the low 32 bits until 2106).
pub(crate) fn now_secs() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0)
}

pub(crate) struct WriteClock {
    /// Per region: the second of its last write, and `DIRTY`.
    regions: RwLock<Vec<AtomicU64>>,
}

impl WriteClock {
    pub fn new(size: u64) -> WriteClock {
        let now = now_secs() as u64 | DIRTY;
        WriteClock {
            regions: RwLock::new((0..size.div_ceil(REGION)).map(|_| AtomicU64::new(now)).collect()),
        }
    }

    /// Notes a write of `len` bytes at `offset`, now.
    pub fn touch(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let now = now_secs() as u64 | DIRTY;
        let regions = self.regions.read();
        for r in offset / REGION..=(offset + len - 1) / REGION {
            if let Some(c) = regions.get(r as usize) {
                // A clock is a hint for what dedup reads, never a guard of data (dedup
                // compares bytes under the grain locks): relaxed, and stored only when it
                // changes, so that a hot region's cache line is not written by every write.
                if c.load(Ordering::Relaxed) != now {
                    c.store(now, Ordering::Relaxed);
                }
            }
        }
    }

    /// When the region holding byte `offset` was last written, and whether it was written
    /// since dedup last took it (`take`).
    pub fn state(&self, offset: u64) -> (u32, bool) {
        let v = self
            .regions
            .read()
            .get((offset / REGION) as usize)
            .map(|c| c.load(Ordering::Relaxed))
            .unwrap_or(0);
        (v as u32, v & DIRTY != 0)
    }

    /// Dedup is about to read the region holding byte `offset`: a write from now on marks it
    /// again, for the next run.
    pub fn take(&self, offset: u64) {
        if let Some(c) = self.regions.read().get((offset / REGION) as usize) {
            c.fetch_and(!DIRTY, Ordering::AcqRel);
        }
    }

    /// Dedup could not finish the region: the next run reads it again.
    pub fn give_back(&self, offset: u64) {
        if let Some(c) = self.regions.read().get((offset / REGION) as usize) {
            c.fetch_or(DIRTY, Ordering::AcqRel);
        }
    }

    /// The vdisk grew to `size` bytes: the new regions are written now (they hold nothing).
    pub fn grow(&self, size: u64) {
        let now = now_secs() as u64 | DIRTY;
        let mut regions = self.regions.write();
        let want = size.div_ceil(REGION) as usize;
        while regions.len() < want {
            regions.push(AtomicU64::new(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_moves_the_clocks_of_the_regions_it_touches_and_marks_them() {
        let c = WriteClock::new(4 * REGION);
        for r in 0..4 {
            c.regions.read()[r].store(5, Ordering::Relaxed);
        }
        assert_eq!(c.state(0), (5, false));
        c.touch(REGION - 512, 1024);
        let (t, dirty) = c.state(0);
        assert!(t > 5 && dirty);
        assert!(c.state(REGION).0 > 5);
        assert_eq!(c.state(2 * REGION), (5, false));
        c.take(0);
        assert_eq!(c.state(0), (t, false));
        c.grow(6 * REGION);
        assert!(c.state(5 * REGION).1);
        assert_eq!(c.state(7 * REGION), (0, false), "past the end");
    }
}
