//! Who is writing: the host a front end runs a command for, so that data lost before it was
//! flushed is reported to the host that wrote it, whoever's flush found the loss.
//!
//! A front end runs each command inside [`as_writer`]; every path a write takes to the disks
//! (in place, through the write-back cache, a planned write started on a ring) notes the
//! writer of the thread it runs on. It is ambient rather than a parameter because those paths
//! are many and deep (a grain write, a copy-on-write, a cached write), and a command runs on
//! one thread from start to end.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// A host, as the front ends know it. [`Writer::ANY`] is every caller that is not one
/// (tools, maintenance jobs, tests): a loss in what it wrote fails the flush that finds it
/// and is owed to no one else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Writer(u64);

/// Set apart from the values [`Writer::named`] gives (whose top bit is clear).
const UNIQUE: u64 = 1 << 63;

static NEXT_UNIQUE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CURRENT: Cell<Writer> = const { Cell::new(Writer::ANY) };
}

impl Writer {
    pub const ANY: Writer = Writer(0);

    /// The writer a name stands for while the daemon runs: an iSCSI initiator's name, which
    /// every session of that host (several paths, a login again) shares.
    pub fn named(name: &str) -> Writer {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        // Never ANY, never a unique one.
        Writer((h.finish() & !UNIQUE).max(1))
    }

    /// A writer of its own, unlike any other while the daemon runs: an NBD export's
    /// connections, which name no host.
    pub fn unique() -> Writer {
        Writer(UNIQUE | NEXT_UNIQUE.fetch_add(1, Ordering::Relaxed))
    }

    /// The writer of the command running on this thread.
    pub fn current() -> Writer {
        CURRENT.with(|c| c.get())
    }
}

/// Runs `f` as `writer`: the writes it makes are noted for that writer, and its flushes report
/// what that writer lost. The writer before is back when `f` returns or unwinds.
pub fn as_writer<R>(writer: Writer, f: impl FnOnce() -> R) -> R {
    struct Restore(Writer);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(writer)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_is_set_for_the_call_and_restored_after_even_a_panic() {
        let a = Writer::named("iqn.2026-01.example:a");
        assert_eq!(Writer::current(), Writer::ANY);
        as_writer(a, || {
            assert_eq!(Writer::current(), a);
            let b = Writer::unique();
            as_writer(b, || assert_eq!(Writer::current(), b));
            assert_eq!(Writer::current(), a);
        });
        let r = std::panic::catch_unwind(|| as_writer(a, || panic!("inside")));
        assert!(r.is_err());
        assert_eq!(Writer::current(), Writer::ANY);
    }

    #[test]
    fn names_and_connections_give_distinct_writers() {
        let a = Writer::named("iqn.2026-01.example:a");
        assert_eq!(a, Writer::named("iqn.2026-01.example:a"));
        assert_ne!(a, Writer::named("iqn.2026-01.example:b"));
        assert_ne!(a, Writer::ANY);
        let (u, v) = (Writer::unique(), Writer::unique());
        assert_ne!(u, v);
        assert_ne!(u, a);
        assert_ne!(Writer::named(""), Writer::ANY);
    }
}
