//! Group commit of metadata batches.
//!
//! A batch that points at newly written data may only become durable after that data is: so
//! each commit first flushes the member disks, then writes the batch synchronously. Callers
//! that arrive while a commit is under way queue up, and the next leader commits all of them
//! with one flush and one synchronous write.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use tessera_layout::Layouts;
use tessera_pool::WriteBatch;

use crate::error::{Result, VolumeError};

/// One metadata change, recorded so that queued changes can be merged into one batch.
#[derive(Debug, Clone)]
pub enum Op {
    Put(&'static str, Vec<u8>, Vec<u8>),
    Delete(&'static str, Vec<u8>),
    Merge(&'static str, Vec<u8>, Vec<u8>),
}

struct Queue {
    ops: Vec<Op>,
    /// Ticket of the last op queued, and of the last op durably committed.
    queued: u64,
    committed: u64,
    leader: bool,
    /// The tickets of the last failed commit (first, last), and why.
    failed: Option<(u64, u64, String)>,
}

pub struct Committer {
    layouts: Arc<Layouts>,
    q: Mutex<Queue>,
    cv: Condvar,
}

impl Committer {
    pub fn new(layouts: Arc<Layouts>) -> Committer {
        Committer {
            layouts,
            q: Mutex::new(Queue {
                ops: Vec::new(),
                queued: 0,
                committed: 0,
                leader: false,
                failed: None,
            }),
            cv: Condvar::new(),
        }
    }

    /// Makes `ops` durable, together with the data written before the call.
    pub fn commit(&self, ops: Vec<Op>) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut q = self.q.lock();
        q.queued += 1;
        let ticket = q.queued;
        q.ops.extend(ops);
        loop {
            if q.committed >= ticket {
                if let Some((first, last, why)) = &q.failed {
                    if (*first..=*last).contains(&ticket) {
                        return Err(VolumeError::Invalid(format!("metadata commit failed: {why}")));
                    }
                }
                return Ok(());
            }
            if !q.leader {
                q.leader = true;
                let ops = std::mem::take(&mut q.ops);
                let upto = q.queued;
                let first = q.committed + 1;
                drop(q);
                let r = self.write(ops);
                q = self.q.lock();
                q.leader = false;
                q.committed = upto;
                if let Err(e) = r {
                    q.failed = Some((first, upto, e.to_string()));
                }
                self.cv.notify_all();
                continue;
            }
            self.cv.wait(&mut q);
        }
    }

    fn write(&self, ops: Vec<Op>) -> Result<()> {
        let pool = self.layouts.pool();
        // Data first: nothing may point at bytes that are not durable yet.
        self.layouts.flush()?;
        let meta = pool.meta();
        let mut b = WriteBatch::default();
        for op in ops {
            match op {
                Op::Put(cf, k, v) => b.put_cf(meta.cf(cf), k, v),
                Op::Delete(cf, k) => b.delete_cf(meta.cf(cf), k),
                Op::Merge(cf, k, v) => b.merge_cf(meta.cf(cf), k, v),
            }
        }
        meta.commit(b, true)?;
        Ok(())
    }
}
