//! Scrubs as the daemon runs them: started by `tessera pool scrub` or by the schedule
//! (`scrub_interval`, monthly by default), paused by the administrator, and gone on with after
//! a restart from where they stopped (the engine keeps the position in the pool). Also the
//! watch on disks' error counts: a disk past `disk_error_limit` read or checksum errors is
//! taken for failing, retired, and (with auto repair) emptied.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tessera_pool::DiskState;
use tessera_volume::{Engine, ScrubOptions, ScrubPass, VolumeError};
use tracing::{info, warn};

use crate::error::{ApiError, ApiResult};
use crate::events::{NewEvent, Severity};
use crate::jobs::{unix_now, JobState, JobView};
use crate::model::{DiskBlocks, ScrubPassView, ScrubPool, ScrubRunState, ScrubView};
use crate::Daemon;

/// How long after a scrub failed the daemon tries that pass again by itself.
const RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

pub(crate) fn pass_view(p: &ScrubPass) -> ScrubPassView {
    let t = &p.tally;
    let mut per_disk: BTreeMap<u32, DiskBlocks> = BTreeMap::new();
    for (&d, &n) in &t.repaired {
        per_disk
            .entry(d)
            .or_insert(DiskBlocks {
                disk: d,
                ..Default::default()
            })
            .repaired = n;
    }
    for (&d, &n) in &t.unrecoverable {
        per_disk
            .entry(d)
            .or_insert(DiskBlocks {
                disk: d,
                ..Default::default()
            })
            .unrecoverable = n;
    }
    ScrubPassView {
        started_at: p.started_at,
        finished_at: p.finished_at,
        blocks_checked: t.blocks,
        repaired: t.repaired_total(),
        unrecoverable: t.unrecoverable_total(),
        per_disk: per_disk.into_values().collect(),
        hot_copies_checked: p.hot_copies.pairs,
        hot_copies_repaired: p.hot_copies.repaired,
        hot_copies_lost: p.hot_copies.lost,
        problems: t
            .mismatches
            .iter()
            .map(|m| format!("slab set {} row {}: {}", m.set, m.row, m.what))
            .collect(),
    }
}

/// The event of a pass that found damage: `scrub.errors`, an error when some blocks could not
/// be repaired, a warning when every one was.
fn found_errors(pool: &str, v: &ScrubPassView) -> Option<NewEvent> {
    let (lost, repaired) = (v.unrecoverable + v.hot_copies_lost, v.repaired + v.hot_copies_repaired);
    if lost == 0 && repaired == 0 && v.problems.is_empty() {
        return None;
    }
    let mut message = format!(
        "the scrub of pool {pool} found damage: {repaired} block(s) repaired from their good copies, {lost} that could not be"
    );
    if !v.problems.is_empty() {
        message.push_str(&format!(", and {} row(s) whose copies disagree", v.problems.len()));
    }
    message.push_str("; 'tessera pool show' has the details per disk");
    let severity = if lost > 0 || !v.problems.is_empty() {
        Severity::Error
    } else {
        Severity::Warning
    };
    Some(NewEvent::new(severity, "scrub.errors", message).pool(pool))
}

/// Scrub passes that failed, by pool: not tried again before [`RETRY_AFTER`]; and the pools
/// whose scrub is stopped for a handover to another gateway, which goes on with it.
#[derive(Default)]
pub struct ScrubWatch {
    failed: std::sync::Arc<parking_lot::Mutex<BTreeMap<String, Instant>>>,
    pub(crate) handing_over: std::sync::Arc<parking_lot::Mutex<std::collections::BTreeSet<String>>>,
}

impl ScrubWatch {
    /// `pool` is being handed over to another gateway: its scrub, about to be cancelled, is
    /// stopped rather than paused (the gateway that takes the pool goes on with it where it
    /// stopped: the position is in the pool), and this daemon does not go on with it itself
    /// meanwhile.
    pub(crate) fn hold_for_handover(&self, pool: &str) {
        self.handing_over.lock().insert(pool.to_string());
    }

    /// The handover of `pool` is done, or given up (the scrub then goes on here).
    pub(crate) fn release_after_handover(&self, pool: &str) {
        self.handing_over.lock().remove(pool);
    }

    /// Whether `pool` is being handed over to another gateway (no maintenance starts on it).
    pub(crate) fn held_for_handover(&self, pool: &str) -> bool {
        self.handing_over.lock().contains(pool)
    }
}

impl Daemon {
    /// The scrub job running on a pool.
    fn scrub_job(&self, pool: &str) -> Option<u64> {
        self.jobs.running("scrub", pool)
    }

    pub fn scrub_view(&self, name: &str, e: &Engine) -> ScrubView {
        let state = e.scrub_state().unwrap_or_default();
        let job = self.scrub_job(name);
        let run = match (&job, &state.current) {
            (Some(_), _) => ScrubRunState::Running,
            (None, Some(_)) if state.paused => ScrubRunState::Paused,
            (None, Some(_)) => ScrubRunState::Interrupted,
            (None, None) => ScrubRunState::Idle,
        };
        let next_due = self.cfg.scrub_interval.and_then(|every| {
            let from = state
                .last
                .as_ref()
                .and_then(|l| l.finished_at)
                .or(state.scheduled_from)?;
            (state.current.is_none()).then_some(from + every.as_secs())
        });
        ScrubView {
            state: run,
            job,
            checksums: e.layouts().checksums(),
            current: state.current.as_ref().map(pass_view),
            last: state.last.as_ref().map(pass_view),
            next_due,
        }
    }

    /// Starts a scrub of the pool, or goes on with the pass under way.
    pub fn scrub_pool(&self, name: &str, req: ScrubPool) -> ApiResult<JobView> {
        let e = self.engine(name)?;
        if req.rate_limit == Some(0) {
            return Err(ApiError::invalid(
                "a rate limit of 0 would never finish; leave it out for no limit",
            ));
        }
        if let Some(j) = self.scrub_job(name) {
            return Err(ApiError::busy(format!(
                "a scrub of pool '{name}' is already running as job {j}"
            )));
        }
        self.scrub_watch.failed.lock().remove(name);
        let opts = ScrubOptions {
            rate_limit: req.rate_limit,
        };
        let stopping = self.stopping.clone();
        let failed = self.scrub_watch.failed.clone();
        let handing_over = self.scrub_watch.handing_over.clone();
        let pool = name.to_string();
        let events = self.events.clone();
        let job = self.jobs.spawn("scrub", name, move |p| match e.scrub(&opts, p) {
            Ok(pass) => {
                let view = pass_view(&pass);
                if let Some(ev) = found_errors(&pool, &view) {
                    events.record(ev);
                }
                Ok(serde_json::to_value(view).expect("serializable"))
            }
            Err(VolumeError::Layout(tessera_layout::LayoutError::Cancelled)) => {
                // A job cancelled by the administrator is a pause; one cancelled by the
                // daemon's shutdown goes on after the restart, and one cancelled for a
                // handover goes on at the gateway that takes the pool.
                let handed_over = handing_over.lock().contains(&pool);
                if !stopping.load(Ordering::Relaxed) && !handed_over {
                    let _ = e.set_scrub_paused(true);
                }
                Err("paused".into())
            }
            Err(err) => {
                failed.lock().insert(pool, Instant::now());
                Err(err.to_string())
            }
        });
        Ok(job.view())
    }

    /// Pauses the pass under way: it keeps its position until `scrub_pool` is called again.
    pub fn pause_scrub(&self, name: &str) -> ApiResult<ScrubView> {
        let e = self.engine(name)?;
        if !e.set_scrub_paused(true)? {
            return Err(ApiError::busy(format!("no scrub of pool '{name}' is under way")));
        }
        if let Some(j) = self.scrub_job(name) {
            self.jobs.cancel(j)?;
            // The position is saved as the job stops; wait for it, briefly.
            for _ in 0..200 {
                if self.jobs.get(j).is_ok_and(|j| j.state() != JobState::Running) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        info!(pool = name, "scrub paused");
        Ok(self.scrub_view(name, &e))
    }

    /// Looks at every pool once: goes on with passes a restart or an error cut short, starts
    /// the scheduled ones that are due, and takes disks past the error limit for failing.
    pub fn scrub_tick(&self) {
        if self.stopping.load(Ordering::Relaxed) {
            return;
        }
        for (name, e) in self.engines_in_turn() {
            self.watch_disk_errors(&name, &e);
            if self.scrub_job(&name).is_some()
                || self.jobs.running("repair", &name).is_some()
                || self.scrub_watch.held_for_handover(&name)
            {
                continue;
            }
            let Ok(state) = e.scrub_state() else { continue };
            let now = unix_now();
            let start = match &state.current {
                Some(_) if state.paused => false,
                Some(_) => {
                    let failed = self.scrub_watch.failed.lock().get(&name).copied();
                    failed.is_none_or(|at| at.elapsed() >= RETRY_AFTER)
                }
                None => {
                    let Some(every) = self.cfg.scrub_interval else { continue };
                    let from = match state.last.as_ref().and_then(|l| l.finished_at) {
                        Some(t) => t,
                        None => match e.scrub_schedule_from(now) {
                            Ok(t) => t,
                            Err(_) => continue,
                        },
                    };
                    now >= from + every.as_secs()
                }
            };
            if !start {
                continue;
            }
            let req = ScrubPool {
                rate_limit: self.cfg.scrub_rate,
            };
            match self.scrub_pool(&name, req) {
                Ok(j) => {
                    let what = if state.current.is_some() {
                        "going on with the scrub that stopped"
                    } else {
                        "scheduled scrub started"
                    };
                    info!(pool = %name, job = j.id, "{what}");
                }
                Err(err) => warn!(pool = %name, error = %err.message, "cannot start a scrub"),
            }
        }
    }

    /// Retires the healthy disks of a pool whose read and checksum errors passed the limit,
    /// once each, and asks auto repair to move their data off.
    fn watch_disk_errors(&self, name: &str, e: &Engine) {
        let errors = e.layouts().disk_errors();
        for d in e.pool().disks() {
            let Some(n) = errors.get(&d.info.position) else {
                continue;
            };
            let count = n.read + n.checksum;
            if d.info.state != DiskState::Healthy || count < self.cfg.disk_error_limit {
                continue;
            }
            let why = format!(
                "failing: {} read error(s) and {} block(s) not matching their checksums since the pool was imported (disk_error_limit {})",
                n.read, n.checksum, self.cfg.disk_error_limit
            );
            self.events.record(
                NewEvent::new(
                    Severity::Error,
                    "disk.failing",
                    format!("disk {} is {why}: retiring it so that its data moves off", d.info.path),
                )
                .pool(name)
                .subject(d.info.path.clone()),
            );
            match e.retire_disk(&d.info.path) {
                Ok(()) => self.auto_repair.mark_failing(name, &d.info.id.to_string(), why),
                Err(err) => warn!(pool = name, disk = %d.info.path, error = %err, "cannot retire a failing disk"),
            }
        }
    }
}
