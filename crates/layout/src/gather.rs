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
//!
//! A write announces the rows it will touch when it starts ([`RowGather::announce`]). A row's
//! update waits for the writes announced for that row that have not queued yet: the three
//! 256 KiB writes of a sequential stream that fill a 3+1 row are in flight together, but
//! reach the row one after the other; written as they come, the first pays a read-modify-
//! write alone and the other two another one. Waiting cannot deadlock: a write takes its rows
//! in ascending order, so an announced write that has not reached a row is at a lower one,
//! and whatever it waits for is lower still. A write that never comes (a failure before it
//! reaches the row) is waited for [`MAX_WAIT`] at most.
//!
//! Those three writes are often not even under way together: each writer of a stream takes
//! the next range when its last write returns, so the row's first write may start a moment
//! before the others. A write that starts where a recent write of the set ends, or ends where
//! one starts, is part of a stream, and so is a write of a whole column or more in a set where
//! a quarter of the recent writes were (the first write of a row to start often has no
//! neighbour under way yet: set space is in the order the vdisk's grains were allocated,
//! which concurrent writers permute). Its row's update, if the row is not whole yet and other
//! writes of the set are under way, waits [`STREAM_WAIT`] at most for the rest of the row. A
//! lone writer (queue depth 1) has no other write under way, and never waits.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tessera_pool::PoolError;

use crate::error::{LayoutError, Result};
use crate::geometry::Piece;

/// The longest a row's update waits for writes announced for it.
const MAX_WAIT: Duration = Duration::from_millis(20);
/// The longest a row's update that continues a sequential stream waits for the rest of the
/// row, while other writes are under way in the set.
const STREAM_WAIT: Duration = Duration::from_millis(10);
/// The last writes of a set to start, to recognise a write that continues one of them.
const RECENT_WRITES: usize = 64;
/// Of the last 64 writes of a set to start, how many must have had a neighbour for the set
/// to be taken as written by a stream.
const STREAMING_SHARE: u32 = 16;

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
    /// Writes announced for the row that have not queued yet.
    coming: usize,
}

impl Queue {
    fn idle(&self) -> bool {
        self.waiting.is_empty() && !self.leader && self.coming == 0
    }
}

/// Recent traffic of one slab set: writes under way, and the last ones to start.
struct Traffic {
    in_flight: usize,
    /// The ranges of the last writes to start, `[start, end)`.
    recent: [(u64, u64); RECENT_WRITES],
    next: usize,
    /// One bit per write among the last 64 to start: whether it had a neighbour in `recent`.
    neighbours: u64,
}

#[derive(Default)]
struct State {
    rows: HashMap<(u32, u64), Queue>,
    sets: HashMap<u32, Traffic>,
}

impl State {
    /// One announced write fewer for a row.
    fn withdraw(&mut self, key: (u32, u64)) {
        let q = self.rows.get_mut(&key).expect("an announced row has a queue");
        q.coming -= 1;
        if q.idle() {
            self.rows.remove(&key);
        }
    }
}

pub(crate) struct RowGather {
    state: Mutex<State>,
    cv: Condvar,
    /// [`MAX_WAIT`] and [`STREAM_WAIT`]; a test that must not depend on the scheduler's
    /// timing waits longer.
    max_wait: Duration,
    stream_wait: Duration,
}

impl Default for RowGather {
    fn default() -> Self {
        Self::with_waits(MAX_WAIT, STREAM_WAIT)
    }
}

impl RowGather {
    fn with_waits(max_wait: Duration, stream_wait: Duration) -> Self {
        RowGather {
            state: Mutex::default(),
            cv: Condvar::new(),
            max_wait,
            stream_wait,
        }
    }
}

/// A write under way in set `set`: the rows it has announced and not yet reached (dropping
/// it withdraws them, as for a write that failed on the way), and whether it continues a
/// write that ended a moment ago (a sequential stream).
pub(crate) struct Announced<'a> {
    gather: &'a RowGather,
    set: u32,
    rows: Range<u64>,
    streaming: bool,
}

impl Drop for Announced<'_> {
    fn drop(&mut self) {
        let mut st = self.gather.state.lock();
        for row in self.rows.clone() {
            st.withdraw((self.set, row));
        }
        let t = st
            .sets
            .get_mut(&self.set)
            .expect("a write under way has its set's traffic");
        t.in_flight -= 1;
        if t.in_flight == 0 {
            st.sets.remove(&self.set);
        }
        self.gather.cv.notify_all();
    }
}

impl RowGather {
    /// Announces that a write of `[start, end)` of set `set` will reach `rows` in ascending
    /// order, through [`write`](Self::write) with the returned handle.
    /// `column_bytes`: the set's interleave.
    pub fn announce(&self, set: u32, start: u64, end: u64, rows: Range<u64>, column_bytes: u64) -> Announced<'_> {
        let mut st = self.state.lock();
        for row in rows.clone() {
            st.rows
                .entry((set, row))
                .or_insert_with(|| Queue {
                    waiting: Vec::new(),
                    leader: false,
                    coming: 0,
                })
                .coming += 1;
        }
        let t = st.sets.entry(set).or_insert_with(|| Traffic {
            in_flight: 0,
            // Neighbours of no write: no write ends at u64::MAX or starts there.
            recent: [(u64::MAX, u64::MAX); RECENT_WRITES],
            next: 0,
            neighbours: 0,
        });
        t.in_flight += 1;
        // A neighbour on either side: the writes of a stream do not start in their order.
        let neighbour = t.recent.iter().any(|&(a, b)| b == start || a == end);
        t.neighbours = t.neighbours << 1 | neighbour as u64;
        // The first write of a row to start may have no neighbour under way yet: in a set
        // where many writes have one, a write of a whole column is taken as part of a stream.
        let streaming = neighbour || (t.neighbours.count_ones() >= STREAMING_SHARE && end - start >= column_bytes);
        t.recent[t.next] = (start, end);
        t.next = (t.next + 1) % RECENT_WRITES;
        Announced {
            gather: self,
            set,
            rows,
            streaming,
        }
    }

    /// Writes `mine` to row `row` (the next row `announced` holds) with `write`, together
    /// with the writes of the row queued meanwhile; returns the result of the batch that
    /// held it. `whole` tells whether writes cover the row whole (nothing more to wait for).
    pub fn write(
        &self,
        announced: &mut Announced<'_>,
        row: u64,
        mine: RowWrite,
        whole: impl Fn(&[&RowWrite]) -> bool,
        write: impl Fn(&[RowWrite]) -> Result<()>,
    ) -> Result<()> {
        assert_eq!(announced.rows.start, row, "rows are written in the order announced");
        announced.rows.start += 1;
        let (set, streaming) = (announced.set, announced.streaming);
        let key = (set, row);
        let outcome: Outcome = Arc::default();
        let now = Instant::now();
        let (deadline, stream_deadline) = (now + self.max_wait, now + self.stream_wait);
        let mut st = self.state.lock();
        let q = st.rows.get_mut(&key).expect("an announced row has a queue");
        q.coming -= 1;
        q.waiting.push((mine, outcome.clone()));
        self.cv.notify_all();
        loop {
            if let Some(r) = outcome.get() {
                return r.clone().map_err(|Shared(e)| duplicate(&e));
            }
            let in_flight = st.sets.get(&set).map_or(0, |t| t.in_flight);
            let q = st.rows.get_mut(&key).expect("a queue with a waiter stays");
            let now = Instant::now();
            if q.leader {
                self.cv.wait(&mut st);
                continue;
            }
            // Writes on their way to this row; or, for a sequential stream with other writes
            // under way, the rest of the row, which they are likely to bring.
            let wait_until = if q.coming > 0 && now < deadline {
                Some(deadline)
            } else if streaming
                && now < stream_deadline
                && in_flight > q.waiting.len()
                && !whole(&q.waiting.iter().map(|(w, _)| w).collect::<Vec<_>>())
            {
                Some(stream_deadline)
            } else {
                None
            };
            if let Some(t) = wait_until {
                self.cv.wait_until(&mut st, t);
                continue;
            }
            q.leader = true;
            let batch = std::mem::take(&mut q.waiting);
            drop(st);
            let (writes, outcomes): (Vec<RowWrite>, Vec<Outcome>) = batch.into_iter().unzip();
            let r = write(&writes).map_err(|e| Shared(Arc::new(e)));
            for o in outcomes {
                let _ = o.set(r.clone());
            }
            st = self.state.lock();
            let q = st.rows.get_mut(&key).expect("the leader's queue stays");
            q.leader = false;
            if q.idle() {
                st.rows.remove(&key);
            }
            self.cv.notify_all();
        }
    }
}

/// The same error for another writer of the batch (errors carry no resources, but not every
/// one is `Clone`: a pool error is passed on as its message).
fn duplicate(e: &LayoutError) -> LayoutError {
    match e {
        // Out of space stays out of space: the host is told so, not of a failure.
        LayoutError::Pool(PoolError::NoSpace { pool, detail }) => LayoutError::Pool(PoolError::NoSpace {
            pool: pool.clone(),
            detail: detail.clone(),
        }),
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
        LayoutError::Refused { set, detail } => LayoutError::Refused {
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
    use std::time::Duration;

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
        let g = RowGather::with_waits(Duration::from_secs(30), Duration::from_secs(30));
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
                        let row = (i % 3) as u64;
                        let mut announced = g.announce(1, row * 48, row * 48 + 16, row..row + 1, 16);
                        let r = g.write(
                            &mut announced,
                            row,
                            piece(t % 3, 16),
                            |_| false,
                            |ws| {
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
                            },
                        );
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
        let st = g.state.lock();
        assert!(st.rows.is_empty() && st.sets.is_empty(), "queues left behind");
    }

    /// Batches a test's writes form: the number of writes in each.
    fn record(batches: &Mutex<Vec<usize>>) -> impl Fn(&[RowWrite]) -> Result<()> + '_ {
        move |ws| {
            batches.lock().push(ws.len());
            Ok(())
        }
    }

    /// A write announced for a row that has not reached it yet is waited for: the row is
    /// written once, with both.
    #[test]
    fn a_row_waits_for_a_write_announced_for_it() {
        // Waits long enough that a busy machine's scheduler cannot end them: what is tested is
        // that the write waits, not for how long.
        let g = RowGather::with_waits(Duration::from_secs(30), Duration::from_secs(30));
        let batches = Mutex::new(Vec::new());
        let mut late = g.announce(1, 0, 16, 0..1, 16);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut first = g.announce(1, 16, 32, 0..1, 16);
                g.write(&mut first, 0, piece(1, 16), |_| false, record(&batches))
                    .unwrap();
            });
            // The late write comes once the first one is queued and waiting for it.
            while g.state.lock().rows.get(&(1, 0)).is_none_or(|q| q.waiting.is_empty()) {
                std::thread::sleep(Duration::from_millis(1));
            }
            g.write(&mut late, 0, piece(0, 16), |_| false, record(&batches))
                .unwrap();
        });
        assert_eq!(*batches.lock(), vec![2]);
        drop(late);
        assert!(g.state.lock().rows.is_empty());
    }

    /// In a set written by a stream, the first column of a row waits for the others, which
    /// start after it: the row is written once, whole. Without other writes under way in the
    /// set (a lone writer), nothing waits.
    #[test]
    fn a_stream_fills_its_row_before_it_is_written() {
        let g = RowGather::with_waits(Duration::from_secs(30), Duration::from_secs(30));
        let batches = Mutex::new(Vec::new());
        let whole = |ws: &[&RowWrite]| (0..3).all(|c| ws.iter().any(|w| w.pieces.iter().any(|p| p.data_col == c)));
        // Another writer keeps the set's traffic; a run of neighbouring writes makes it a stream.
        let keep = g.announce(1, 1 << 40, (1 << 40) + 16, 0..0, 16);
        for i in 0..20u64 {
            drop(g.announce(1, (1 << 30) + i * 16, (1 << 30) + i * 16 + 16, 0..0, 16));
        }
        std::thread::scope(|s| {
            for c in 0..3u64 {
                let (g, batches) = (&g, &batches);
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(c));
                    let mut a = g.announce(1, c * 16, c * 16 + 16, 0..1, 16);
                    g.write(&mut a, 0, piece(c as usize, 16), whole, record(batches))
                        .unwrap();
                });
            }
        });
        assert_eq!(*batches.lock(), vec![3], "one batch of the row's three columns");
        drop(keep);
        // A lone writer: returns at once (well before the 30 s it would wait), alone.
        batches.lock().clear();
        let started = Instant::now();
        let mut a = g.announce(1, 0, 16, 0..1, 16);
        g.write(&mut a, 0, piece(0, 16), whole, record(&batches)).unwrap();
        assert!(started.elapsed() < Duration::from_secs(15), "a lone writer waited");
        assert_eq!(*batches.lock(), vec![1]);
    }
}
