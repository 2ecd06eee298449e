//! Deduplication as the daemon runs it: the settings of each pool, optimization runs and
//! garbage collections as jobs (one of either at a time per pool), and the schedule that
//! starts a background run, then a garbage collection, every `schedule_secs`.

use std::collections::BTreeMap;
use std::time::Instant;

use parking_lot::Mutex;
use tessera_volume::{DedupMode, DedupStatus, PassOptions, Progress, VolumeError};
use tracing::info;

use crate::error::{ApiError, ApiResult};
use crate::jobs::JobView;
use crate::model::SetDedup;
use crate::Daemon;

/// When each pool's last scheduled run started (the daemon's start, before the first).
#[derive(Default)]
pub struct DedupSchedule {
    last: Mutex<BTreeMap<String, Instant>>,
    /// Held from the question whether a run is under way to the start of a new one, so
    /// that two starts at once (two requests, a request and the schedule) make one job and
    /// a refusal, not a job that fails.
    starting: Mutex<()>,
}

fn job_error(e: VolumeError) -> String {
    match e {
        VolumeError::Layout(tessera_layout::LayoutError::Cancelled) => {
            "cancelled; what was optimized before stays optimized".into()
        }
        e => e.to_string(),
    }
}

impl Daemon {
    /// The dedup or garbage collection job running on a pool.
    fn dedup_job(&self, pool: &str) -> Option<u64> {
        self.jobs
            .running("dedup", pool)
            .or_else(|| self.jobs.running("dedup-gc", pool))
    }

    fn refuse_if_deduplicating(&self, pool: &str) -> ApiResult<()> {
        match self.dedup_job(pool) {
            Some(j) => Err(ApiError::busy(format!(
                "a dedup run or garbage collection of pool '{pool}' is already running as job {j}"
            ))),
            None => Ok(()),
        }
    }

    pub fn dedup_status(&self, pool: &str) -> ApiResult<DedupStatus> {
        Ok(self.engine(pool)?.dedup_status())
    }

    /// Changes what the request names in a pool's dedup settings.
    pub fn set_dedup(&self, pool: &str, req: SetDedup) -> ApiResult<DedupStatus> {
        let e = self.engine(pool)?;
        let mut s = e.dedup_settings();
        if let Some(v) = req.enabled {
            s.enabled = v;
        }
        if let Some(v) = req.vdisks {
            s.vdisks = v;
        }
        if let Some(v) = req.exclude {
            s.exclude = v;
        }
        if let Some(v) = req.min_age_secs {
            s.min_age_secs = v;
        }
        if let Some(v) = req.schedule_secs {
            s.schedule_secs = v;
        }
        if let Some(v) = req.background_rate {
            if v == 0 {
                return Err(ApiError::invalid(
                    "background_rate must be above 0 (a throughput run is not limited)",
                ));
            }
            s.background_rate = v;
        }
        if let Some(v) = req.compression {
            s.compression = v;
        }
        if let Some(v) = req.hot_copy_refs {
            s.hot_copy_refs = v;
        }
        e.set_dedup_settings(s)?;
        Ok(e.dedup_status())
    }

    /// Starts an optimization run of the pool's vdisks in scope.
    pub fn dedup_run(&self, pool: &str, opts: PassOptions) -> ApiResult<JobView> {
        let e = self.engine(pool)?;
        let _starting = self.dedup_schedule.starting.lock();
        self.refuse_if_deduplicating(pool)?;
        if !e.dedup_settings().enabled {
            return Err(ApiError::invalid(format!(
                "dedup is not enabled on pool '{pool}'; 'tessera dedup enable {pool}' turns it on"
            )));
        }
        let job = self.jobs.spawn("dedup", pool, move |p: &Progress| {
            e.dedup_run(&opts, p)
                .map(|r| serde_json::to_value(r).expect("serializable"))
                .map_err(job_error)
        });
        Ok(job.view())
    }

    /// Starts a garbage collection of the pool's fingerprint index.
    pub fn dedup_gc(&self, pool: &str) -> ApiResult<JobView> {
        let e = self.engine(pool)?;
        let _starting = self.dedup_schedule.starting.lock();
        self.refuse_if_deduplicating(pool)?;
        let job = self.jobs.spawn("dedup-gc", pool, move |p: &Progress| {
            e.dedup_gc(p)
                .map(|r| serde_json::to_value(r).expect("serializable"))
                .map_err(job_error)
        });
        Ok(job.view())
    }

    /// Starts the scheduled runs that are due: a background run then a garbage collection,
    /// in one job so that they do not contend.
    pub fn dedup_tick(&self) {
        if self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        for (name, e) in self.engines_in_turn() {
            let s = e.dedup_settings();
            let _starting = self.dedup_schedule.starting.lock();
            if !s.enabled || s.schedule_secs == 0 || self.dedup_job(&name).is_some() {
                continue;
            }
            let mut last = self.dedup_schedule.last.lock();
            let since = last.entry(name.clone()).or_insert_with(|| self.started_at());
            if since.elapsed().as_secs() < s.schedule_secs {
                continue;
            }
            *since = Instant::now();
            drop(last);
            let job = self.jobs.spawn("dedup", &name, move |p: &Progress| {
                let opts = PassOptions {
                    mode: DedupMode::Background,
                    ..Default::default()
                };
                let run = e.dedup_run(&opts, p).map_err(job_error)?;
                // The job's progress is the run's, in bytes; the collection counts entries.
                let gc = e.dedup_gc(&Progress::default()).map_err(job_error)?;
                Ok(serde_json::json!({ "run": run, "gc": gc }))
            });
            info!(pool = %name, job = job.id, "scheduled dedup run started");
        }
    }
}
