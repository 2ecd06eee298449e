//! The bytes of request data all the NBD connections of a registry hold together: READ
//! buffers, WRITE payloads and replies not yet sent. Each connection holds at most
//! `MAX_HELD_BYTES`; without a bound on their sum, a few hundred clients that queue large
//! READs and never take the replies would hold more memory than the machine has.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The bound on what all the connections hold together unless set otherwise.
pub const DEFAULT_MAX_HELD_TOTAL: usize = 1 << 30;

#[derive(Debug)]
pub struct HeldBudget {
    used: AtomicUsize,
    limit: AtomicUsize,
}

impl Default for HeldBudget {
    fn default() -> HeldBudget {
        HeldBudget {
            used: AtomicUsize::new(0),
            limit: AtomicUsize::new(DEFAULT_MAX_HELD_TOTAL),
        }
    }
}

impl HeldBudget {
    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Whether a connection that holds something already must wait before it takes more. One
    /// that holds nothing may always take a request, so that every client goes on, however
    /// much the others hold: the sum stays under the limit plus one request per connection.
    pub(crate) fn full(&self) -> bool {
        self.used() >= self.limit()
    }

    pub(crate) fn charge(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}
