//! The pace of background reads (a scrub, a repair, a dedup run, an image export): no more
//! than a rate of the disks at any moment, so that the vdisks' own I/O keeps the rest.
//!
//! Each piece of work takes its turn before it starts: the turn begins when the one before
//! it has had its time (bytes / rate) and the work waits for it. Time spent not reading (a
//! slow disk, a flush between slab sets, a slow target) is credit for at most [`CREDIT`]:
//! a rate held only on average since the start would catch up on a long pause at full speed,
//! the burst a rate limit is there to prevent. Turns are shared by every thread of a run,
//! and a wait is taken in short naps, asking the caller between them whether to go on, so
//! that a cancel is seen at once however low the rate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The most idle time a paced run may catch up on at once.
pub const CREDIT: Duration = Duration::from_secs(1);
/// The longest sleep between two looks at whether to go on.
const NAP: Duration = Duration::from_millis(100);
/// The longest time one piece of work is given, so that no absurd size or rate overflows
/// the clock (a year: no real piece comes near).
const LONGEST_TURN: Duration = Duration::from_secs(365 * 24 * 3600);

pub struct Pace {
    /// Bytes per second; None: as fast as it goes.
    rate: Option<u64>,
    credit: Duration,
    /// When the next turn may begin.
    next: Mutex<Instant>,
}

impl Pace {
    /// A pace of `rate` bytes per second; None or 0: unpaced.
    pub fn new(rate: Option<u64>) -> Pace {
        Pace::with_credit(rate, CREDIT)
    }

    fn with_credit(rate: Option<u64>, credit: Duration) -> Pace {
        Pace {
            rate: rate.filter(|&r| r > 0),
            credit,
            next: Mutex::new(Instant::now()),
        }
    }

    /// Bytes per second, if paced.
    pub fn rate(&self) -> Option<u64> {
        self.rate
    }

    /// Takes the turn of `bytes` about to be read and waits for it. It calls `go_on` first
    /// (paced or not, waiting or not: a stopped run takes no turn) and between naps, and
    /// returns its error at once if it has one (a cancel, another worker's failure).
    pub fn take<E>(&self, bytes: u64, mut go_on: impl FnMut() -> Result<(), E>) -> Result<(), E> {
        go_on()?;
        let Some(rate) = self.rate else { return Ok(()) };
        let at = {
            let mut next = self.next.lock();
            let now = Instant::now();
            let at = (*next).max(now.checked_sub(self.credit).unwrap_or(now));
            let time =
                Duration::try_from_secs_f64(bytes as f64 / rate as f64).map_or(LONGEST_TURN, |t| t.min(LONGEST_TURN));
            *next = at + time;
            at
        };
        while let Some(wait) = at.checked_duration_since(Instant::now()).filter(|w| !w.is_zero()) {
            go_on()?;
            std::thread::sleep(wait.min(NAP));
        }
        Ok(())
    }

    /// [`take`](Self::take) while `cancel` is not set: false if it is, and the work is not
    /// to start.
    #[must_use]
    pub fn take_unless(&self, bytes: u64, cancel: &AtomicBool) -> bool {
        self.take(bytes, || {
            if cancel.load(Ordering::Relaxed) {
                Err(())
            } else {
                Ok(())
            }
        })
        .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn take(p: &Pace, bytes: u64) {
        p.take(bytes, || Ok::<(), ()>(())).unwrap();
    }

    #[test]
    fn a_paced_run_is_held_to_its_rate() {
        let p = Pace::new(Some(1 << 20));
        let t = Instant::now();
        for _ in 0..5 {
            take(&p, 64 << 10);
        }
        // The fifth 64 KiB starts after four have had their time at 1 MiB/s.
        assert!(t.elapsed() >= Duration::from_millis(245), "{:?}", t.elapsed());
    }

    #[test]
    fn threads_of_a_run_share_its_rate() {
        let p = Pace::new(Some(4 << 20));
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..4 {
                        take(&p, 64 << 10);
                    }
                });
            }
        });
        // 16 turns of 64 KiB at 4 MiB/s: the last begins 15 / 64 of a second in.
        assert!(t.elapsed() >= Duration::from_millis(230), "{:?}", t.elapsed());
    }

    #[test]
    fn idle_time_is_credit_for_no_more_than_its_cap() {
        let p = Pace::with_credit(Some(1 << 20), Duration::from_millis(50));
        take(&p, 100 << 10);
        // Idle for three turns' time: only the cap of it may be caught up.
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        take(&p, 100 << 10);
        take(&p, 100 << 10);
        // The third turn begins 100 KiB / 1 MiB/s (about 98 ms) after the second, which began
        // at most 50 ms before the second was asked for: a run held only on average would
        // not wait at all.
        assert!(t.elapsed() >= Duration::from_millis(40), "{:?}", t.elapsed());
    }

    #[test]
    fn absurd_sizes_and_rates_do_not_overflow_the_clock() {
        let p = Pace::new(Some(1));
        take(&p, 1);
        let stop = AtomicBool::new(true);
        assert!(!p.take_unless(u64::MAX, &stop));
        let r = p.take(u64::MAX, {
            let mut first = true;
            move || if std::mem::take(&mut first) { Ok(()) } else { Err(()) }
        });
        assert_eq!(r, Err(()));
    }

    #[test]
    fn a_wait_ends_as_soon_as_the_caller_says_stop() {
        let p = Pace::new(Some(1));
        take(&p, 1);
        let asked = AtomicUsize::new(0);
        let t = Instant::now();
        let r = p.take(1, || {
            if asked.fetch_add(1, Ordering::Relaxed) == 0 {
                Ok(())
            } else {
                Err("cancelled")
            }
        });
        assert_eq!(r, Err("cancelled"));
        // Its turn was a second away; the second look stops it, a nap after the first.
        assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
        assert_eq!(asked.load(Ordering::Relaxed), 2);
        // A run stopped already takes no turn, paced or not.
        for p in [Pace::new(Some(1 << 30)), Pace::new(None)] {
            assert_eq!(p.take(1, || Err("stopped")), Err("stopped"));
        }

        let p = Pace::new(Some(10));
        let cancel = AtomicBool::new(false);
        assert!(p.take_unless(1, &cancel));
        assert!(p.take_unless(1, &cancel), "a turn a tenth of a second away, waited for");
        cancel.store(true, Ordering::Relaxed);
        let t = Instant::now();
        assert!(!p.take_unless(1, &cancel));
        assert!(t.elapsed() < Duration::from_millis(90), "{:?}", t.elapsed());
    }

    #[test]
    fn an_unpaced_run_never_waits() {
        for p in [Pace::new(None), Pace::new(Some(0))] {
            assert_eq!(p.rate(), None);
            let t = Instant::now();
            for _ in 0..1000 {
                take(&p, u64::MAX / 2);
            }
            assert!(t.elapsed() < Duration::from_millis(100), "{:?}", t.elapsed());
        }
    }
}
