//! Until when this gateway's lease surely holds, on this process's monotonic clock: the
//! sending of the last renewal etcd answered, plus the time to live it granted. etcd lets
//! the lease lapse no sooner than that (it counts from the renewal's arrival), and another
//! gateway takes what the lease owned only after it lapsed. A gateway that stalled (SIGSTOP,
//! a long pause) and runs again finds the time passed before its renewal task can notice:
//! its disks refuse I/O from that instant, so that a read served then cannot return what
//! the new owner has changed since, before the cluster's blocklist reaches every OSD.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The instant the clock counts from (the first use in the process).
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn nanos(t: Instant) -> u64 {
    t.saturating_duration_since(base()).as_nanos().min(u64::MAX as u128) as u64
}

/// Shared by the lease's renewal task, which moves it on, and the disks of what the lease
/// owns, which look at it before each request.
#[derive(Clone, Debug)]
pub struct LeaseClock {
    /// Nanoseconds from `base()` until which the lease holds; 0: it does not.
    until: Arc<AtomicU64>,
}

impl LeaseClock {
    /// A lease granted by a request sent at `sent`, for `ttl`.
    pub fn granted(sent: Instant, ttl: Duration) -> LeaseClock {
        let c = LeaseClock {
            until: Arc::new(AtomicU64::new(0)),
        };
        c.renewed(sent, ttl);
        c
    }

    /// Holds for ever: a disk used without a lease (tools, tests of the disk alone).
    pub fn unbounded() -> LeaseClock {
        LeaseClock {
            until: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// etcd answered a renewal sent at `sent`, granting `ttl` from its arrival.
    pub fn renewed(&self, sent: Instant, ttl: Duration) {
        // The instant itself, then its distance from the base: an instant before the base
        // (made before the clock's first use) counts as the base, which errs towards lapsed.
        let until = sent.checked_add(ttl).map_or(u64::MAX, nanos);
        self.until.fetch_max(until, Ordering::AcqRel);
    }

    /// The lease is lost (or may be): nothing holds from now on.
    pub fn lapsed(&self) {
        self.until.store(0, Ordering::Release);
    }

    /// Whether the lease surely holds now.
    pub fn holds(&self) -> bool {
        nanos(Instant::now()) < self.until.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_holds_for_its_time_to_live_from_the_last_renewal_sent() {
        let sent = Instant::now();
        let c = LeaseClock::granted(sent, Duration::from_millis(200));
        assert!(c.holds());
        // An answer to an older renewal does not take the time back.
        c.renewed(
            sent.checked_sub(Duration::from_secs(10)).unwrap_or(sent),
            Duration::from_millis(1),
        );
        assert!(c.holds());
        std::thread::sleep(Duration::from_millis(250));
        assert!(!c.holds(), "past its time to live, as after a stall");
        c.renewed(Instant::now(), Duration::from_secs(5));
        assert!(c.holds(), "renewed");
        c.lapsed();
        assert!(!c.holds());
        assert!(LeaseClock::unbounded().holds());
    }
}
