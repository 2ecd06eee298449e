//! Group commit of metadata batches.
//!
//! A batch that points at newly written data may only become durable after that data is: so
//! each commit first flushes the member disks, then writes the batch synchronously. Callers
//! that arrive while a commit is under way queue up, and the next leader commits all of them
//! with one flush and one synchronous write.

use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};
use tessera_cache::WriteCache;
use tessera_pool::MetaBatch;

use crate::error::{Result, VolumeError};
use crate::keys::count_refs;
use crate::space::Loc;

/// One metadata change, recorded so that queued changes can be merged into one batch.
#[derive(Debug, Clone)]
pub enum Op {
    Put(&'static str, Vec<u8>, Vec<u8>),
    Delete(&'static str, Vec<u8>),
    /// The reference counts of the slots a location holds moved by a delta.
    Count(Loc, i64),
}

impl Op {
    /// Moves the reference count of the slot `l` is in (of each, for a piece that runs on
    /// into a second slot) by `delta`.
    pub fn count(l: Loc, delta: i64) -> Op {
        Op::Count(l, delta)
    }
}

/// The batch that ops join while they wait: the leader that writes it sets its result, and
/// every op in it reads that result, so no waiter can take another batch's outcome for its own.
#[derive(Default)]
struct Batch {
    result: OnceLock<Result<(), String>>,
}

struct Queue<T> {
    /// Items waiting for the next commit, all of them in `open`.
    items: Vec<T>,
    open: Arc<Batch>,
    leader: bool,
}

/// The queue of a group commit: the first caller to find no commit under way leads, writing
/// everything queued so far in one go; the others wait for the batch they joined.
struct GroupQueue<T> {
    q: Mutex<Queue<T>>,
    cv: Condvar,
}

impl<T> GroupQueue<T> {
    fn new() -> GroupQueue<T> {
        GroupQueue {
            q: Mutex::new(Queue {
                items: Vec::new(),
                open: Arc::default(),
                leader: false,
            }),
            cv: Condvar::new(),
        }
    }

    /// Queues `items` and returns the result of the batch they were written in; `write`
    /// writes a whole batch, when this caller leads.
    fn commit(&self, items: Vec<T>, write: impl Fn(Vec<T>) -> Result<(), String>) -> Result<(), String> {
        let mut q = self.q.lock();
        q.items.extend(items);
        let mine = q.open.clone();
        loop {
            if let Some(r) = mine.result.get() {
                return r.clone();
            }
            if !q.leader {
                q.leader = true;
                let items = std::mem::take(&mut q.items);
                let batch = std::mem::take(&mut q.open);
                drop(q);
                let _ = batch.result.set(write(items));
                q = self.q.lock();
                q.leader = false;
                self.cv.notify_all();
                continue;
            }
            self.cv.wait(&mut q);
        }
    }
}

pub struct Committer {
    cache: Arc<WriteCache>,
    queue: GroupQueue<Op>,
}

impl Committer {
    pub fn new(cache: Arc<WriteCache>) -> Committer {
        Committer {
            cache,
            queue: GroupQueue::new(),
        }
    }

    /// Makes `ops` durable, together with the data written before the call.
    pub fn commit(&self, ops: Vec<Op>) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        self.queue
            .commit(ops, |ops| self.write(ops).map_err(|e| e.to_string()))
            .map_err(|why| VolumeError::Invalid(format!("metadata commit failed: {why}")))
    }

    fn write(&self, ops: Vec<Op>) -> Result<()> {
        let pool = self.cache.layouts().pool();
        // Data first: nothing may point at bytes that are not durable yet (in the layouts,
        // or in the write-back log that a restart replays before anything is read).
        self.cache.flush()?;
        let meta = pool.meta();
        let mut b = MetaBatch::new();
        for op in ops {
            match op {
                Op::Put(cf, k, v) => b.put(cf, k, v),
                Op::Delete(cf, k) => b.delete(cf, k),
                Op::Count(l, d) => count_refs(&mut b, l, d),
            }
        }
        meta.commit(b, true)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// Many writers, and batches that fail one time in two: a writer hears Ok exactly when
    /// the batch holding its item was written. (A queue that remembered only the latest
    /// failure told the waiters of an earlier failed batch Ok when they woke after it.)
    #[test]
    fn every_item_gets_the_outcome_of_its_own_batch() {
        let q = GroupQueue::<u64>::new();
        let written = Mutex::new(HashSet::new());
        let batches = AtomicU64::new(0);
        let write = |items: Vec<u64>| {
            // Let the waiters of the last batch fall behind, as a busy machine does.
            std::thread::yield_now();
            if batches.fetch_add(1, Ordering::Relaxed) % 2 == 0 {
                return Err("injected".to_string());
            }
            written.lock().extend(items);
            Ok(())
        };
        let told: Vec<(u64, bool)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8u64)
                .map(|t| {
                    let (q, write) = (&q, &write);
                    s.spawn(move || {
                        (0..2000u64)
                            .map(|i| {
                                let item = t << 32 | i;
                                (item, q.commit(vec![item], write).is_ok())
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let written = written.into_inner();
        let wrong: Vec<_> = told.iter().filter(|(item, ok)| *ok != written.contains(item)).collect();
        assert!(
            wrong.is_empty(),
            "{} of {} writers were told the wrong outcome, e.g. {:?}",
            wrong.len(),
            told.len(),
            &wrong[..wrong.len().min(4)]
        );
        assert!(
            batches.load(Ordering::Relaxed) > 100,
            "batches grouped too much to test anything"
        );
    }
}
