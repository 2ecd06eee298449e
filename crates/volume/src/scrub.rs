//! A scrub of the whole pool that can stop and go on: every row of every slab set, in set
//! order, checked and repaired by the layout layer ([`Layouts::scrub_rows`]). Where it is (set,
//! row) and what it has found so far are saved in the pool's metadata store every few seconds
//! and when it stops, so a scrub paused, or cut short by a restart or a crash, goes on from
//! there rather than from the start.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tessera_disk::Pace;
use tessera_layout::{LayoutError, Progress, ScrubTally};
use tessera_pool::{MetaBatch, CF_POOL};
use tracing::{info, warn};

use crate::engine::Engine;
use crate::error::{Result, VolumeError};
use crate::hot_copies::HotCopyCheck;

const STATE_KEY: &[u8] = b"scrub";
/// Rows scrubbed between two looks at the cancel flag and the rate limit.
const ROWS_PER_STEP: u64 = 8;
/// How often the position is saved while a scrub runs.
const SAVE_EVERY: Duration = Duration::from_secs(5);

/// Where the pool's scrubs stand, as saved in its metadata store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubState {
    /// The pass under way (running or paused), if any.
    pub current: Option<ScrubPass>,
    /// The last pass that went to the end.
    pub last: Option<ScrubPass>,
    /// The pass under way was paused by the administrator: it waits for the next `scrub`
    /// call rather than going on by itself after a restart.
    #[serde(default)]
    pub paused: bool,
    /// Seconds since the Unix epoch from which a pool never scrubbed counts its schedule.
    #[serde(default)]
    pub scheduled_from: Option<u64>,
}

/// One pass over the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubPass {
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    pub finished_at: Option<u64>,
    /// The next row to scrub: (slab set, row). Sets are taken in id order.
    pub next: (u32, u64),
    /// What it has found and done so far.
    pub tally: ScrubTally,
    /// The copies of hot slots, checked (and made or dropped) when the pass starts.
    #[serde(default)]
    pub hot_copies: HotCopyCheck,
}

#[derive(Debug, Clone, Default)]
pub struct ScrubOptions {
    /// Member bytes read per second, at most.
    pub rate_limit: Option<u64>,
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Engine {
    pub fn scrub_state(&self) -> Result<ScrubState> {
        let raw = self.pool().meta().get(CF_POOL, STATE_KEY)?;
        // A record that does not decode is a scrub position lost, nothing more: start over.
        Ok(raw.and_then(|r| serde_json::from_slice(&r).ok()).unwrap_or_default())
    }

    fn save_scrub_state(&self, s: &ScrubState, sync: bool) -> Result<()> {
        let mut b = MetaBatch::new();
        b.put(CF_POOL, STATE_KEY, serde_json::to_vec(s).expect("serializable"));
        self.pool().meta().commit(b, sync)?;
        Ok(())
    }

    /// Marks the pass under way paused, or not. False if there is none.
    pub fn set_scrub_paused(&self, paused: bool) -> Result<bool> {
        let mut s = self.scrub_state()?;
        if s.current.is_none() {
            return Ok(false);
        }
        s.paused = paused;
        self.save_scrub_state(&s, true)?;
        Ok(true)
    }

    /// When a pool that has never been scrubbed started counting its schedule: `now` the
    /// first time this is asked.
    pub fn scrub_schedule_from(&self, now: u64) -> Result<u64> {
        let mut s = self.scrub_state()?;
        if let Some(t) = s.scheduled_from {
            return Ok(t);
        }
        s.scheduled_from = Some(now);
        self.save_scrub_state(&s, true)?;
        Ok(now)
    }

    /// Scrubs the pool, from where the pass under way stopped or from the start, repairing
    /// what it can. Returns the finished pass; a cancel (`progress.cancel`) saves the position
    /// and ends in [`LayoutError::Cancelled`], and the next call goes on from there.
    pub fn scrub(&self, opts: &ScrubOptions, progress: &Progress) -> Result<ScrubPass> {
        let Some(_one) = self.scrubbing.try_lock() else {
            return Err(VolumeError::Invalid(format!(
                "pool '{}' is being scrubbed already",
                self.pool().name()
            )));
        };
        let layouts = self.layouts();
        let mut state = self.scrub_state()?;
        state.paused = false;
        let mut pass = state.current.take().unwrap_or_else(|| ScrubPass {
            started_at: unix_now(),
            ..ScrubPass::default()
        });
        let sets = layouts.sets();
        let bytes_of = |set: &tessera_layout::SlabSet, rows: u64| rows * set.spec.interleave * set.spec.width() as u64;
        let total: u64 = sets.iter().map(|s| bytes_of(s, layouts.rows_of(s))).sum();
        let done_before: u64 = sets
            .iter()
            .map(|s| {
                if s.id < pass.next.0 {
                    bytes_of(s, layouts.rows_of(s))
                } else if s.id == pass.next.0 {
                    bytes_of(s, pass.next.1.min(layouts.rows_of(s)))
                } else {
                    0
                }
            })
            .sum();
        progress.total_bytes.store(total, Ordering::Relaxed);
        progress.done_bytes.store(done_before, Ordering::Relaxed);
        if pass.next == (0, 0) {
            info!(pool = %self.pool().name(), bytes = total, "scrub started");
            // Before the rows: a hot slot that fails to read is rewritten from its copy here,
            // rather than counted as lost by the layout's pass over a set with no redundancy.
            if let Err(e) = self.keep_hot_copies() {
                warn!(pool = %self.pool().name(), error = %e, "could not keep the copies of hot slots up");
            }
            pass.hot_copies = self.check_hot_copies();
        } else {
            info!(pool = %self.pool().name(), set = pass.next.0, row = pass.next.1, "scrub goes on where it stopped");
        }
        let pace = Pace::new(opts.rate_limit);
        let mut saved = Instant::now();
        let from = pass.next;
        for set in sets.iter().filter(|s| s.id >= from.0) {
            let rows = layouts.rows_of(set);
            let mut row = if set.id == from.0 { from.1 } else { 0 };
            while row < rows {
                if progress.cancel.load(Ordering::Relaxed) {
                    pass.next = (set.id, row);
                    state.current = Some(pass);
                    self.save_scrub_state(&state, true)?;
                    info!(pool = %self.pool().name(), set = set.id, row, "scrub stopped; it goes on from here next time");
                    return Err(LayoutError::Cancelled.into());
                }
                let end = (row + ROWS_PER_STEP).min(rows);
                let step = bytes_of(set, end - row);
                // A cancel seen while waiting is handled above, as any other.
                if !pace.take_unless(step, &progress.cancel) {
                    continue;
                }
                let t = match layouts.scrub_rows(set, row..end, true) {
                    Ok(t) => t,
                    // Freed meanwhile: nothing left to check there.
                    Err(LayoutError::NoSuchSet(_)) => break,
                    Err(e) => return Err(e.into()),
                };
                if t.repaired_total() > 0 || t.unrecoverable_total() > 0 {
                    warn!(pool = %self.pool().name(), set = set.id, rows = ?(row..end), repaired = t.repaired_total(), unrecoverable = t.unrecoverable_total(), "scrub found damage");
                }
                pass.tally.add(t);
                progress.done_bytes.fetch_add(step, Ordering::Relaxed);
                row = end;
                pass.next = (set.id, row);
                if saved.elapsed() >= SAVE_EVERY {
                    state.current = Some(pass.clone());
                    self.save_scrub_state(&state, false)?;
                    saved = Instant::now();
                }
            }
            pass.next = (set.id + 1, 0);
        }
        pass.finished_at = Some(unix_now());
        state.current = None;
        state.last = Some(pass.clone());
        self.save_scrub_state(&state, true)?;
        let t = &pass.tally;
        if t.unrecoverable_total() > 0 {
            warn!(pool = %self.pool().name(), blocks = t.blocks, repaired = t.repaired_total(), unrecoverable = t.unrecoverable_total(), "scrub finished: some blocks have no good copy left");
        } else {
            info!(pool = %self.pool().name(), blocks = t.blocks, repaired = t.repaired_total(), "scrub finished");
        }
        Ok(pass)
    }
}
