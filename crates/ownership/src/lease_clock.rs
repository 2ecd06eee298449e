//! Until when this gateway's lease surely holds, on this machine's boot clock: the sending
//! of the last renewal etcd answered, plus the time to live it granted. etcd lets the lease
//! lapse no sooner than that (it counts from the renewal's arrival), and another gateway
//! takes what the lease owned only after it lapsed. A gateway that stalled (SIGSTOP, a long
//! pause) and runs again finds the time passed before its renewal task can notice: its
//! disks refuse I/O from that instant, so that a read served then cannot return what the
//! new owner has changed since, before the cluster's blocklist reaches every OSD.
//!
//! The boot clock (CLOCK_BOOTTIME), not the monotonic one Rust's `Instant` reads: it also
//! counts the time the machine spent suspended, which the monotonic clock skips, so that a
//! gateway resumed from a suspend of the whole host does not take its lease for held. A
//! virtual machine paused by its hypervisor is another matter: its guest's clocks, this one
//! included, usually stop with it, and only the fence (the blocklist, the epoch on every
//! write) stands between it and the pool once it runs again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An instant on the boot clock, in nanoseconds from the machine's boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(u64);

impl Stamp {
    /// Now.
    pub fn now() -> Stamp {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec to fill; CLOCK_BOOTTIME exists on every Linux since 2.6.39.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        assert_eq!(rc, 0, "the boot clock cannot be read");
        Stamp(
            (ts.tv_sec as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(ts.tv_nsec as u64),
        )
    }

    /// `d` before this instant (the boot, at the earliest).
    pub fn before(self, d: Duration) -> Stamp {
        Stamp(self.0.saturating_sub(d.as_nanos().min(u64::MAX as u128) as u64))
    }

    /// `d` after this instant; None past what the clock can say.
    pub fn after(self, d: Duration) -> Option<Stamp> {
        u64::try_from(d.as_nanos())
            .ok()
            .and_then(|d| self.0.checked_add(d))
            .map(Stamp)
    }
}

/// Shared by the lease's renewal task, which moves it on, and the disks of what the lease
/// owns, which look at it before each request.
#[derive(Clone, Debug)]
pub struct LeaseClock {
    /// Nanoseconds on the boot clock until which the lease holds; 0: it does not.
    until: Arc<AtomicU64>,
}

impl LeaseClock {
    /// A lease granted by a request sent at `sent`, for `ttl`.
    pub fn granted(sent: Stamp, ttl: Duration) -> LeaseClock {
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

    /// etcd answered a renewal sent at `sent`, granting `ttl` from its arrival. A time the
    /// clock cannot say changes nothing: it errs towards lapsed, never towards for ever.
    pub fn renewed(&self, sent: Stamp, ttl: Duration) {
        if let Some(until) = sent.after(ttl) {
            self.until.fetch_max(until.0, Ordering::AcqRel);
        }
    }

    /// The lease is lost (or may be): nothing holds from now on.
    pub fn lapsed(&self) {
        self.until.store(0, Ordering::Release);
    }

    /// Whether the lease surely holds now.
    pub fn holds(&self) -> bool {
        self.holds_at(Stamp::now())
    }

    /// Whether the lease holds at `now`.
    fn holds_at(&self, now: Stamp) -> bool {
        now.0 < self.until.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_holds_for_its_time_to_live_from_the_last_renewal_sent() {
        let sent = Stamp::now();
        let c = LeaseClock::granted(sent, Duration::from_millis(200));
        assert!(c.holds());
        // An answer to an older renewal does not take the time back.
        c.renewed(sent.before(Duration::from_secs(10)), Duration::from_millis(1));
        assert!(c.holds());
        std::thread::sleep(Duration::from_millis(250));
        assert!(!c.holds(), "past its time to live, as after a stall");
        c.renewed(Stamp::now(), Duration::from_secs(5));
        assert!(c.holds(), "renewed");
        c.lapsed();
        assert!(!c.holds());
        assert!(LeaseClock::unbounded().holds());
    }

    /// Time the machine spent suspended counts: the lease is measured on the boot clock,
    /// which says so, and an instant after a suspend longer than the lease finds it lapsed
    /// however little the monotonic clock moved.
    #[test]
    fn the_lease_is_measured_on_the_boot_clock() {
        let sent = Stamp::now();
        let c = LeaseClock::granted(sent, Duration::from_secs(30));
        assert!(c.holds_at(sent.after(Duration::from_secs(29)).unwrap()));
        assert!(!c.holds_at(sent.after(Duration::from_secs(31)).unwrap()));
        // The boot clock runs no slower than the monotonic one.
        let (mono, boot) = (std::time::Instant::now(), Stamp::now());
        std::thread::sleep(Duration::from_millis(50));
        let (mono, boot) = (mono.elapsed(), Stamp::now().0 - boot.0);
        assert!(
            boot + 1_000_000 >= mono.as_nanos() as u64,
            "{boot} ns on the boot clock, {mono:?} on the monotonic one"
        );
        // A time to live the clock cannot say holds for no time at all.
        let c = LeaseClock::granted(Stamp(u64::MAX - 1), Duration::from_secs(1));
        assert!(!c.holds());
    }
}
