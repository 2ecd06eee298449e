//! The pace of a background run: it takes no more than its rate of the disks, so the vdisks'
//! own I/O keeps the rest.

use std::time::{Duration, Instant};

pub struct Pace {
    /// Bytes per second; 0: as fast as it goes.
    rate: u64,
    start: Instant,
    done: u64,
}

impl Pace {
    pub fn new(rate: u64) -> Pace {
        Pace {
            rate,
            start: Instant::now(),
            done: 0,
        }
    }

    /// Counts `bytes` as done and sleeps for as long as the run is ahead of its rate.
    pub fn step(&mut self, bytes: u64) {
        self.done += bytes;
        if let Some(wait) = self.ahead() {
            std::thread::sleep(wait);
        }
    }

    /// How far the run is ahead of its rate, if it is.
    fn ahead(&self) -> Option<Duration> {
        if self.rate == 0 {
            return None;
        }
        let due = Duration::from_secs_f64(self.done as f64 / self.rate as f64);
        due.checked_sub(self.start.elapsed()).filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paced_run_is_held_to_its_rate() {
        let mut p = Pace::new(1 << 20);
        let t = Instant::now();
        for _ in 0..4 {
            p.step(64 << 10);
        }
        // 256 KiB at 1 MiB/s: a quarter of a second at least.
        assert!(t.elapsed() >= Duration::from_millis(240), "{:?}", t.elapsed());
    }

    #[test]
    fn an_unpaced_run_never_waits() {
        let mut p = Pace::new(0);
        p.step(u64::MAX / 2);
        assert!(p.ahead().is_none());
    }
}
