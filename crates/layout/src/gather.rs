//! Writes to one parity row that arrive while the row is being written wait and are then
//! written together, as one row update: their pieces merged, parity computed once, and, when
//! together they cover the touched range of every data column (neighbouring writes of a
//! sequential stream, say), computed from the new data alone, with no read. Each writer still
//! returns only once its own bytes are written, so nothing is acknowledged earlier than
//! before; what changes is that queued writes stop paying one read-modify-write each.
//!
//! The queue per row works as the metadata group commit does: the first writer to find no
//! update under way leads and writes everything queued so far; the others wait for the batch
//! they joined, and one of them leads the next.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use crate::error::{LayoutError, Result};
use crate::geometry::Piece;

/// One writer's pieces of a row, with their bytes (`buf_off` indexes `data`; sector-aligned,
/// so the pieces go to the disks without a bounce copy).
pub(crate) struct RowWrite {
    pub pieces: Vec<Piece>,
    pub data: tessera_disk::AlignedBuf,
}

impl RowWrite {
    /// The pieces with the bytes each one writes.
    pub fn parts(&self) -> impl Iterator<Item = (&Piece, &[u8])> {
        self.pieces
            .iter()
            .map(|p| (p, &self.data[p.buf_off..p.buf_off + p.len]))
    }
}

type Outcome = Arc<OnceLock<Result<(), Shared>>>;

/// An error as every writer of a batch receives it.
#[derive(Clone)]
struct Shared(Arc<LayoutError>);

struct Queue {
    waiting: Vec<(RowWrite, Outcome)>,
    leader: bool,
}

#[derive(Default)]
pub(crate) struct RowGather {
    rows: Mutex<HashMap<(u32, u64), Queue>>,
    cv: Condvar,
}

impl RowGather {
    /// Writes `mine` to row `row` of set `set` with `write`, together with the writes of the
    /// row queued meanwhile; returns the result of the batch that held it.
    pub fn write(&self, set: u32, row: u64, mine: RowWrite, write: impl Fn(&[RowWrite]) -> Result<()>) -> Result<()> {
        let key = (set, row);
        let outcome: Outcome = Arc::default();
        let mut rows = self.rows.lock();
        rows.entry(key)
            .or_insert_with(|| Queue {
                waiting: Vec::new(),
                leader: false,
            })
            .waiting
            .push((mine, outcome.clone()));
        loop {
            if let Some(r) = outcome.get() {
                return r.clone().map_err(|Shared(e)| duplicate(&e));
            }
            let q = rows.get_mut(&key).expect("a queue with a waiter stays");
            if q.leader {
                self.cv.wait(&mut rows);
                continue;
            }
            q.leader = true;
            let batch = std::mem::take(&mut q.waiting);
            drop(rows);
            let (writes, outcomes): (Vec<RowWrite>, Vec<Outcome>) = batch.into_iter().unzip();
            let r = write(&writes).map_err(|e| Shared(Arc::new(e)));
            for o in outcomes {
                let _ = o.set(r.clone());
            }
            rows = self.rows.lock();
            let q = rows.get_mut(&key).expect("the leader's queue stays");
            q.leader = false;
            if q.waiting.is_empty() {
                rows.remove(&key);
            }
            self.cv.notify_all();
        }
    }
}

/// The same error for another writer of the batch (errors carry no resources, but not every
/// one is `Clone`: a pool error is passed on as its message).
fn duplicate(e: &LayoutError) -> LayoutError {
    match e {
        LayoutError::Pool(p) => LayoutError::Invalid(p.to_string()),
        LayoutError::Invalid(s) => LayoutError::Invalid(s.clone()),
        &LayoutError::TooManyFailures {
            set,
            unavailable,
            width,
            tolerance,
        } => LayoutError::TooManyFailures {
            set,
            unavailable,
            width,
            tolerance,
        },
        &LayoutError::FlushFailed {
            set,
            unavailable,
            width,
            tolerance,
        } => LayoutError::FlushFailed {
            set,
            unavailable,
            width,
            tolerance,
        },
        LayoutError::Io { set, detail } => LayoutError::Io {
            set: *set,
            detail: detail.clone(),
        },
        LayoutError::Journal(s) => LayoutError::Journal(s.clone()),
        LayoutError::NoSuchSet(s) => LayoutError::NoSuchSet(*s),
        LayoutError::Cancelled => LayoutError::Cancelled,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn piece(col: usize, len: usize) -> RowWrite {
        RowWrite {
            pieces: vec![Piece {
                row: 0,
                data_col: col,
                in_unit: 0,
                len,
                buf_off: 0,
            }],
            data: tessera_disk::AlignedBuf::from_slice(&vec![col as u8; len]),
        }
    }

    /// Writers of one row, many at once: every writer's piece is written exactly once, some
    /// batches hold several, and a failing batch fails exactly its own writers.
    #[test]
    fn every_write_is_written_once_in_some_batch_with_its_outcome() {
        let g = RowGather::default();
        let written = AtomicUsize::new(0);
        let batches = AtomicUsize::new(0);
        let shared = AtomicUsize::new(0);
        let failed = Mutex::new(0usize);
        let told_failed = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..8 {
                let (g, written, batches, shared, failed, told_failed) =
                    (&g, &written, &batches, &shared, &failed, &told_failed);
                s.spawn(move || {
                    for i in 0..500 {
                        let r = g.write(1, (i % 3) as u64, piece(t % 3, 16), |ws| {
                            std::thread::yield_now();
                            let n = batches.fetch_add(1, Ordering::Relaxed);
                            if ws.len() > 1 {
                                shared.fetch_add(1, Ordering::Relaxed);
                            }
                            if n % 7 == 0 {
                                *failed.lock() += ws.len();
                                return Err(LayoutError::Io {
                                    set: 1,
                                    detail: "injected".into(),
                                });
                            }
                            written.fetch_add(ws.iter().map(|w| w.parts().count()).sum(), Ordering::Relaxed);
                            Ok(())
                        });
                        if let Err(e) = r {
                            assert!(e.to_string().contains("injected"));
                            told_failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let failed = *failed.lock();
        assert_eq!(written.load(Ordering::Relaxed) + failed, 8 * 500);
        assert_eq!(told_failed.load(Ordering::Relaxed), failed);
        assert!(shared.load(Ordering::Relaxed) > 0, "no batch gathered two writes");
        assert!(g.rows.lock().is_empty(), "queues left behind");
    }
}
