//! The online metadata scan and spot-fix as the daemon runs them: each a job (progress in
//! metadata records, cancellable), one of them at a time per pool, a scan started by
//! `tessera pool scan` or by the schedule (`scan_interval`, monthly by default); the findings
//! stay in the pool until a spot-fix settles them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_volume::{Engine, ScanReport, VolumeError};
use tracing::{info, warn};

use crate::error::{ApiError, ApiResult};
use crate::events::{NewEvent, Severity};
use crate::jobs::{unix_now, JobView};
use crate::model::ScanResult;
use crate::Daemon;

/// A scheduled scan that failed is not started again before this.
const RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// Scans that failed, by pool, and when.
#[derive(Default)]
pub struct ScanWatch {
    failed: Arc<Mutex<BTreeMap<String, Instant>>>,
}

/// The event of a scan that found damage: `scan.findings`, a warning (a spot-fix repairs what
/// the findings say).
fn found_damage(pool: &str, report: &ScanReport) -> Option<NewEvent> {
    if report.findings == 0 {
        return None;
    }
    let kinds: Vec<String> = report
        .by_kind
        .iter()
        .map(|(k, n)| {
            format!(
                "{}: {n}",
                serde_json::to_value(k).expect("serializable").as_str().unwrap_or("?")
            )
        })
        .collect();
    Some(
        NewEvent::new(
            Severity::Warning,
            "scan.findings",
            format!(
                "the scan of pool {pool}'s metadata found {} problem(s) ({}); 'tessera pool scan {pool} --last' lists them, 'tessera pool spotfix {pool}' repairs them",
                report.findings,
                kinds.join(", ")
            ),
        )
        .pool(pool),
    )
}

/// Findings listed per request when the caller does not say, and at most.
pub const DEFAULT_FINDINGS: usize = 100;
pub const MAX_FINDINGS: usize = 10_000;

impl Daemon {
    fn metadata_job(&self, pool: &str) -> Option<u64> {
        self.jobs
            .running("scan", pool)
            .or_else(|| self.jobs.running("spotfix", pool))
    }

    fn refuse_if_busy(&self, pool: &str) -> ApiResult<()> {
        match self.metadata_job(pool) {
            Some(j) => Err(ApiError::busy(format!(
                "a scan or spot-fix of pool '{pool}' is already running as job {j}"
            ))),
            None => Ok(()),
        }
    }

    /// Starts a scan of the pool's metadata; the vdisks keep serving.
    pub fn scan_pool(&self, name: &str) -> ApiResult<JobView> {
        let e = self.engine(name)?;
        self.refuse_if_busy(name)?;
        self.scan_watch.failed.lock().remove(name);
        let (failed, events, pool) = (self.scan_watch.failed.clone(), self.events.clone(), name.to_string());
        let (stopping, handing_over) = (self.stopping.clone(), self.scrub_watch.handing_over.clone());
        let job = self.jobs.spawn("scan", name, move |p| match e.scan(p) {
            Ok(r) => {
                if let Some(ev) = found_damage(&pool, &r) {
                    events.record(ev);
                }
                Ok(serde_json::to_value(r).expect("serializable"))
            }
            Err(VolumeError::Layout(tessera_layout::LayoutError::Cancelled)) => {
                // Stopped by the administrator, the schedule waits a whole interval again;
                // stopped by the daemon's shutdown or for a handover, a scan that was due
                // starts again at the next start, or at the gateway that takes the pool.
                let handed_over = handing_over.lock().contains(&pool);
                if !stopping.load(std::sync::atomic::Ordering::Relaxed) && !handed_over {
                    if let Err(err) = e.put_off_scan(unix_now()) {
                        warn!(pool = %pool, error = %err, "cannot put off the scheduled scan");
                    }
                }
                Err("cancelled; the last complete scan's findings are kept".into())
            }
            Err(err) => {
                failed.lock().insert(pool, Instant::now());
                Err(err.to_string())
            }
        });
        Ok(job.view())
    }

    /// When the next scheduled scan of a pool starts (seconds since the Unix epoch); None
    /// when none is scheduled. It counts from the end of `last` (the pool's last scan, which
    /// the caller has read) or the last scan the administrator stopped, whichever is later;
    /// for a pool never scanned, from the first time the daemon looked (`start_counting`:
    /// recorded in the pool then; else from now).
    pub(crate) fn scan_due(&self, e: &Engine, last: Option<&ScanReport>, start_counting: bool) -> Option<u64> {
        let every = self.cfg.scan_interval?;
        let finished = last.map(|r| r.finished_at);
        let counted = e.scan_scheduled_from().ok()?;
        let from = match (finished.max(counted), start_counting) {
            (Some(t), _) => t,
            (None, true) => e.scan_schedule_from(unix_now()).ok()?,
            (None, false) => unix_now(),
        };
        Some(from + every.as_secs())
    }

    /// Looks at every pool once and starts the scheduled scans that are due: not while a scan,
    /// a spot-fix or a repair runs there, nor while the pool is handed over to another
    /// gateway; one that failed waits [`RETRY_AFTER`].
    pub fn scan_tick(&self) {
        if self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        for (name, e) in self.engines_in_turn() {
            if self.metadata_job(&name).is_some()
                || self.jobs.running("repair", &name).is_some()
                || self.scrub_watch.held_for_handover(&name)
            {
                continue;
            }
            if self
                .scan_watch
                .failed
                .lock()
                .get(&name)
                .is_some_and(|at| at.elapsed() < RETRY_AFTER)
            {
                continue;
            }
            let Ok(last) = e.scan_report() else { continue };
            if self
                .scan_due(&e, last.as_ref(), true)
                .is_none_or(|due| unix_now() < due)
            {
                continue;
            }
            match self.scan_pool(&name) {
                Ok(j) => info!(pool = %name, job = j.id, "scheduled scan started"),
                Err(err) => warn!(pool = %name, error = %err.message, "cannot start a scan"),
            }
        }
    }

    /// Starts a spot-fix of the last scan's findings.
    pub fn spotfix_pool(&self, name: &str) -> ApiResult<JobView> {
        let e = self.engine(name)?;
        self.refuse_if_busy(name)?;
        if e.scan_report()?.is_none() {
            return Err(ApiError::invalid(format!(
                "pool '{name}' has not been scanned; run 'tessera pool scan {name}' first"
            )));
        }
        let job = self.jobs.spawn("spotfix", name, move |p| match e.spotfix(p) {
            Ok(r) => Ok(serde_json::to_value(r).expect("serializable")),
            Err(err) => Err(err.to_string()),
        });
        Ok(job.view())
    }

    /// The last scan's report and findings from id `after` on, at most `limit`.
    pub fn scan_result(&self, name: &str, after: u64, limit: Option<usize>) -> ApiResult<ScanResult> {
        let e = self.engine(name)?;
        let limit = limit.unwrap_or(DEFAULT_FINDINGS);
        if !(1..=MAX_FINDINGS).contains(&limit) {
            return Err(ApiError::invalid(format!(
                "limit must be between 1 and {MAX_FINDINGS}, not {limit}"
            )));
        }
        let report = e.scan_report()?;
        let findings = e.findings(after, limit)?;
        Ok(ScanResult {
            job: self.metadata_job(name),
            next_due: self.scan_due(&e, report.as_ref(), false),
            report,
            next_after: findings.last().map(|f| f.id + 1).filter(|_| findings.len() == limit),
            findings,
        })
    }
}
