//! What a vdisk wrote since its last flush, so that its flush fails when that data may be lost.
//!
//! A member whose flush fails is failed at once, and later flushes skip it. A write that had
//! reached it, acknowledged to a host whose flush only began afterwards, would then be
//! reported durable by a flush that never saw the member go (on a layout without redundancy,
//! such data is gone). So each vdisk notes the slab sets it writes, with the pool's loss
//! count taken before each write, and its flush asks, once the disks are flushed, whether one
//! of those sets has lost data since. Only this vdisk's flush fails for its own sets.
//!
//! Notes are kept per [`Writer`]: the flush that finds a loss fails, and so does the next
//! flush of each host whose writes were lost, if the flush that found it was another's (on a
//! LUN several hosts write, the writer's own flush must not say its data is durable).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tessera_layout::SlabSet;

use crate::error::{Result, VolumeError};
use crate::writer::Writer;

/// Writers told of a loss at their next flush, at most: the oldest give way (a host that
/// never flushes again, an NBD export removed).
const MAX_OWED: usize = 1024;

/// Per slab set id written since the last flush took them: the set and the smallest loss
/// count noted by a write into it.
pub(crate) type Sets<S> = HashMap<u32, (S, u64)>;

/// `S` is what a flush asks about: a slab set (a plain id in the tests).
pub(crate) struct Unsynced<S = Arc<SlabSet>> {
    /// The sets each writer wrote since the last flush took them.
    pending: Mutex<HashMap<Writer, Sets<S>>>,
    /// Losses found by another writer's flush, owed to the writer of the lost data at its
    /// next flush; oldest first.
    owed: Mutex<VecDeque<(Writer, String)>>,
    /// Flushes begun so far: each takes a ticket before it waits for its turn.
    begun: AtomicU64,
    /// Held by the flush under way; holds the last failure and the tickets it answers: every
    /// flush begun before that failure was found may cover the writes it lost.
    turn: Mutex<Option<(u64, String)>>,
    /// The sets the flush under way took, every writer's, until it knows whether they lost
    /// data: still unsettled for a copy of their data (`unsettled`).
    flushing: Mutex<Sets<S>>,
}

impl<S> Default for Unsynced<S> {
    fn default() -> Unsynced<S> {
        Unsynced {
            pending: Mutex::new(HashMap::new()),
            owed: Mutex::new(VecDeque::new()),
            begun: AtomicU64::new(0),
            turn: Mutex::new(None),
            flushing: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: Clone> Unsynced<S> {
    /// Records a completed write into set `id` by `writer`, begun when the pool's loss count
    /// was `noted`.
    pub fn note(&self, writer: Writer, id: u32, set: &S, noted: u64) {
        add(self.pending.lock().entry(writer).or_default(), id, set, noted);
    }

    /// Runs `flush` (which makes every completed write durable, or fails) for the writes
    /// noted so far, for `writer`, then fails if `lost` says one of their sets may have lost
    /// them since, or if a loss of `writer`'s writes found by another's flush is owed to it.
    /// A failure is reported to this flush and to every flush begun before it was found;
    /// the sets it covered are not asked about again, and each other writer whose writes
    /// were lost is told at its next flush.
    pub fn flush(
        &self,
        writer: Writer,
        flush: impl FnOnce() -> Result<()>,
        lost: impl Fn(&S, u64) -> bool,
    ) -> Result<()> {
        let ticket = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        let mut turn = self.turn.lock();
        if let Some((through, why)) = &*turn {
            if ticket <= *through {
                self.take_owed(writer);
                return Err(VolumeError::Lost(why.clone()));
            }
        }
        // Taken before the flush: a write completed after this point is covered by the next.
        let taken = {
            let mut pending = self.pending.lock();
            let taken = std::mem::take(&mut *pending);
            let mut flushing = self.flushing.lock();
            for sets in taken.values() {
                merge(&mut flushing, sets);
            }
            taken
        };
        let flushed = flush();
        // Asked whatever the flush answered: a failed disk flush fails the disk, and what it
        // lost is owed to its writers all the same.
        let mut found = None;
        for (by, sets) in &taken {
            let Some((id, _)) = sets.iter().find(|(_, (set, noted))| lost(set, *noted)) else {
                continue;
            };
            let why = format!(
                "slab set {id} lost more disks than it tolerates (or, without redundancy, a disk, even if it is back; \
                 or a mirror copy taken back as its disk held it) after it was written: data written since the last \
                 flush may be lost"
            );
            if *by != writer && *by != Writer::ANY {
                self.owe(*by, why.clone());
            }
            found.get_or_insert(why);
        }
        // Known durable, or known lost (and told): what a copy takes from now on is what
        // the sets hold.
        self.flushing.lock().clear();
        let owed = self.take_owed(writer);
        let failed = match (flushed, found) {
            (Err(e), _) => Some(e),
            (Ok(()), Some(why)) => Some(VolumeError::Lost(why)),
            (Ok(()), None) => None,
        };
        if let Some(e) = failed {
            *turn = Some((self.begun.load(Ordering::SeqCst), e.to_string()));
            return Err(e);
        }
        // Found by an earlier flush of another's: this writer's alone, not shared with the
        // flushes waiting meanwhile (whose own writes were not lost).
        match owed {
            Some(why) => Err(VolumeError::Lost(why)),
            None => Ok(()),
        }
    }

    /// The sets that hold writes of this vdisk no flush has made durable yet, with the
    /// smallest loss count noted by those writes: a vdisk that takes a share of their data (a
    /// paste of a frozen image) notes them as its own writes, so that its flush fails if that
    /// data is lost before it is durable.
    pub fn unsettled(&self) -> Sets<S> {
        let mut out = HashMap::new();
        for sets in self.pending.lock().values() {
            merge(&mut out, sets);
        }
        merge(&mut out, &self.flushing.lock());
        out
    }

    fn owe(&self, writer: Writer, why: String) {
        let mut owed = self.owed.lock();
        if !owed.iter().any(|(w, _)| *w == writer) {
            if owed.len() == MAX_OWED {
                owed.pop_front();
            }
            owed.push_back((writer, why));
        }
    }

    /// What is owed to `writer`, now told.
    fn take_owed(&self, writer: Writer) -> Option<String> {
        let mut owed = self.owed.lock();
        let at = owed.iter().position(|(w, _)| *w == writer)?;
        owed.remove(at).map(|(_, why)| why)
    }
}

/// Notes set `id` in `sets`, keeping the smallest loss count of a set noted twice.
fn add<S: Clone>(sets: &mut Sets<S>, id: u32, set: &S, noted: u64) {
    sets.entry(id)
        .and_modify(|(_, n)| *n = (*n).min(noted))
        .or_insert_with(|| (set.clone(), noted));
}

/// Adds every set of `from` to `into`, as [`add`] does.
fn merge<S: Clone>(into: &mut Sets<S>, from: &Sets<S>) {
    for (&id, (set, noted)) in from {
        add(into, id, set, *noted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    /// Sets named by their id alone.
    type Ids = Unsynced<u32>;

    fn note(u: &Ids, id: u32, noted: u64) {
        u.note(Writer::ANY, id, &id, noted)
    }

    #[test]
    fn what_a_flush_has_taken_stays_unsettled_until_it_knows() {
        let u = Ids::default();
        note(&u, 3, 5);
        note(&u, 3, 2);
        note(&u, 4, 9);
        assert_eq!(u.unsettled(), HashMap::from([(3, (3, 2)), (4, (4, 9))]));
        u.flush(
            Writer::ANY,
            || {
                // Taken by the flush, not known durable yet.
                assert_eq!(u.unsettled().len(), 2);
                Ok(())
            },
            |_, _| false,
        )
        .unwrap();
        assert!(u.unsettled().is_empty());
    }

    /// A flush by `first` (whose sets are all lost if `first_finds`) that holds its turn
    /// until a flush by `second` (which finds nothing) has taken its ticket behind it: their
    /// answers.
    fn one_behind_another(u: &Ids, first: Writer, first_finds: bool, second: Writer) -> (Result<()>, Result<()>) {
        let inside = Barrier::new(2);
        let release = Barrier::new(2);
        let begun = u.begun.load(Ordering::SeqCst);
        std::thread::scope(|s| {
            let one = s.spawn(|| {
                u.flush(
                    first,
                    || {
                        inside.wait();
                        release.wait();
                        Ok(())
                    },
                    |_, _| first_finds,
                )
            });
            inside.wait();
            let two = s.spawn(|| u.flush(second, || Ok(()), |_, _| false));
            // The second has its ticket once `begun` moves; then the first may finish.
            while u.begun.load(Ordering::SeqCst) < begun + 2 {
                std::thread::yield_now();
            }
            release.wait();
            (one.join().unwrap(), two.join().unwrap())
        })
    }

    #[test]
    fn a_set_lost_after_its_write_fails_the_flush_once() {
        let u = Ids::default();
        note(&u, 1, 5);
        note(&u, 2, 5);
        let lost = |s: &u32, noted: u64| *s == 2 && noted < 6;
        assert!(matches!(
            u.flush(Writer::ANY, || Ok(()), lost),
            Err(VolumeError::Lost(_))
        ));
        // Reported; the next flush covers only what was written after it.
        assert!(u.flush(Writer::ANY, || Ok(()), lost).is_ok());
        // A write begun after the loss is not lost by it.
        note(&u, 2, 6);
        assert!(u.flush(Writer::ANY, || Ok(()), lost).is_ok());
    }

    /// On a LUN several hosts write: host B's flush finds that host A's write was lost. Both
    /// are told, each once; a host that lost nothing is not told at its next flush.
    #[test]
    fn a_loss_found_by_another_writers_flush_is_owed_to_the_writer() {
        let u = Ids::default();
        let (a, b, c) = (Writer::named("a"), Writer::named("b"), Writer::named("c"));
        u.note(a, 1, &1, 5);
        u.note(b, 2, &2, 5);
        let lost = |s: &u32, noted: u64| *s == 1 && noted < 6;
        assert!(
            matches!(u.flush(b, || Ok(()), lost), Err(VolumeError::Lost(_))),
            "the finder"
        );
        assert!(
            matches!(u.flush(a, || Ok(()), lost), Err(VolumeError::Lost(_))),
            "the writer"
        );
        assert!(u.flush(a, || Ok(()), lost).is_ok(), "told once");
        assert!(u.flush(b, || Ok(()), lost).is_ok());
        assert!(u.flush(c, || Ok(()), lost).is_ok());
        // Found by a flush that failed on its own: owed all the same.
        u.note(a, 1, &1, 5);
        let r = u.flush(b, || Err(VolumeError::Cache("flush failed".into())), lost);
        assert!(matches!(r, Err(VolumeError::Cache(_))));
        assert!(u.flush(a, || Ok(()), lost).is_err());
        // What tools write is owed to no one.
        u.note(Writer::ANY, 1, &1, 5);
        assert!(u.flush(b, || Ok(()), lost).is_err());
        assert!(u.flush(a, || Ok(()), lost).is_ok());
    }

    /// A writer whose own flush was waiting behind the one that found its loss is told by
    /// that shared failure, not again at the next.
    #[test]
    fn a_writer_told_by_a_shared_failure_is_not_told_twice() {
        let u = Ids::default();
        let (a, b) = (Writer::named("a"), Writer::named("b"));
        u.note(a, 1, &1, 0);
        let (found, told) = one_behind_another(&u, b, true, a);
        assert!(found.is_err() && told.is_err());
        assert!(u.flush(a, || Ok(()), |_, _| false).is_ok());
    }

    /// A writer told what it is owed does not fail the flushes of others that waited for it.
    #[test]
    fn what_is_owed_is_told_to_its_writer_alone() {
        let u = Ids::default();
        let (a, b, c) = (Writer::named("a"), Writer::named("b"), Writer::named("c"));
        u.note(a, 1, &1, 0);
        assert!(u.flush(b, || Ok(()), |_, _| true).is_err(), "B finds A's loss");
        let (owed, other) = one_behind_another(&u, a, false, c);
        assert!(owed.is_err(), "A is told");
        assert!(other.is_ok(), "C lost nothing");
    }

    #[test]
    fn what_is_owed_is_bounded() {
        let u = Ids::default();
        for i in 0..MAX_OWED + 10 {
            u.owe(Writer::named(&i.to_string()), "lost".into());
        }
        assert_eq!(u.owed.lock().len(), MAX_OWED);
        assert!(u.take_owed(Writer::named("0")).is_none(), "the oldest gave way");
        assert!(u.take_owed(Writer::named(&(MAX_OWED + 9).to_string())).is_some());
    }

    #[test]
    fn the_oldest_write_into_a_set_decides() {
        let u = Ids::default();
        note(&u, 1, 3);
        note(&u, 1, 9);
        assert!(u.flush(Writer::ANY, || Ok(()), |_, noted| noted < 4).is_err());
    }

    #[test]
    fn a_failed_disk_flush_fails_the_caller_whatever_its_sets() {
        let u = Ids::default();
        let r = u.flush(
            Writer::ANY,
            || Err(VolumeError::Cache("flush failed".into())),
            |_, _| false,
        );
        assert!(matches!(r, Err(VolumeError::Cache(_))));
        assert!(u.flush(Writer::ANY, || Ok(()), |_, _| false).is_ok());
    }

    /// A flush that waited while another found a loss shares that failure: the writes it
    /// must cover may be among those the other took.
    #[test]
    fn a_flush_waiting_behind_a_failing_one_fails_too() {
        let u = Ids::default();
        note(&u, 7, 0);
        let (first, second) = one_behind_another(&u, Writer::ANY, true, Writer::ANY);
        assert!(first.is_err());
        assert!(matches!(second, Err(VolumeError::Lost(_))));
        // One begun after the failure was found succeeds.
        assert!(u.flush(Writer::ANY, || Ok(()), |_, _| true).is_ok());
    }
}
