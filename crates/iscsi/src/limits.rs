//! What one initiator, or all of them together, may make the target hold: connections per
//! portal, sessions per initiator and per target, and the bytes of write data waiting for
//! their command to run. Past a bound the protocol's own answer is given (a login refused
//! with "out of resources", a write with TASK SET FULL, a connection closed at once), so a
//! hostile or broken client can neither exhaust the daemon's memory nor starve the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The bounds, settable by the daemon's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once on one portal, logged in or still logging in.
    pub connections_per_portal: usize,
    /// Connections from one address still logging in on one portal at once (nothing is known
    /// of their initiator yet); past it a new one from there is closed at once. An initiator
    /// logs in within milliseconds: without this bound one address could hold every place of
    /// `connections_per_portal` with logins that never finish, for the login's timeout, again
    /// and again, and no one else could connect.
    pub logins_per_address: usize,
    /// Normal sessions of one initiator name (MPIO uses a few per initiator).
    pub sessions_per_initiator: usize,
    /// Normal sessions logged in to one target.
    pub sessions_per_target: usize,
    /// Bytes of write buffers one session may hold: data received or solicited for writes
    /// that have not completed yet.
    pub write_bytes_per_session: usize,
    /// The same, for every session of the daemon together.
    pub write_bytes_total: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections_per_portal: 256,
            // Half the portal's: a host logging every session in at once at its start is
            // served, and one address alone cannot take every place.
            logins_per_address: 128,
            sessions_per_initiator: 16,
            sessions_per_target: 256,
            write_bytes_per_session: 256 << 20,
            write_bytes_total: 1 << 30,
        }
    }
}

/// Text a login may carry in all its PDUs together, before and after authentication: far
/// more than any real negotiation needs (RFC 7143 asks that 8192 bytes be accepted).
pub const MAX_LOGIN_TEXT: usize = 64 << 10;

/// Bytes of write buffers held: one per session, one for the daemon.
#[derive(Debug, Default)]
pub struct WriteBudget {
    used: AtomicUsize,
}

impl WriteBudget {
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Takes `n` bytes if that leaves the budget within `limit`.
    fn take(&self, n: usize, limit: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= limit)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Bytes charged to a session's budget and the daemon's; given back when dropped, that is
/// when the buffer they pay for is gone.
#[derive(Debug)]
pub struct Charge {
    session: Arc<WriteBudget>,
    total: Arc<WriteBudget>,
    n: usize,
}

impl Charge {
    /// Charges `n` bytes to both budgets, or neither if either would go past its limit.
    pub fn take(session: &Arc<WriteBudget>, total: &Arc<WriteBudget>, n: usize, limits: &Limits) -> Option<Charge> {
        if !session.take(n, limits.write_bytes_per_session) {
            return None;
        }
        if !total.take(n, limits.write_bytes_total) {
            session.give(n);
            return None;
        }
        Some(Charge {
            session: session.clone(),
            total: total.clone(),
            n,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.session.give(self.n);
        self.total.give(self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stay_within_both_budgets_and_come_back() {
        let limits = Limits {
            write_bytes_per_session: 100,
            write_bytes_total: 150,
            ..Limits::default()
        };
        let (a, b, total) = (Arc::default(), Arc::default(), Arc::default());
        let one = Charge::take(&a, &total, 60, &limits).unwrap();
        assert!(Charge::take(&a, &total, 41, &limits).is_none(), "past the session's");
        let two = Charge::take(&b, &total, 90, &limits).unwrap();
        assert!(Charge::take(&b, &total, 1, &limits).is_none(), "past the daemon's");
        assert_eq!((a.used(), b.used(), total.used()), (60, 90, 150));
        drop(one);
        drop(two);
        assert_eq!((a.used(), b.used(), total.used()), (0, 0, 0));
    }
}
