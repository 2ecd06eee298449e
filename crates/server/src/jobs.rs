//! Long operations (repair, image import and export) run as jobs: a worker thread, progress
//! counters anyone can watch, and a cancel flag. Jobs live in memory; a restart forgets them,
//! and what they were doing is either done or safe to run again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_volume::Progress;
use tracing::info;

use crate::error::{ApiError, ApiResult};
use crate::events::{EventLog, NewEvent, Severity};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn finished(self) -> bool {
        self != JobState::Running
    }

    /// As the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

pub struct Job {
    pub id: u64,
    pub kind: String,
    /// What the job works on: `pool`, `pool/vdisk`.
    pub target: String,
    pub progress: Arc<Progress>,
    started_at: u64,
    started: Instant,
    end: Mutex<Option<JobEnd>>,
    /// Why the daemon, not the administrator, cancelled it: said in its end.
    cancelled_because: Mutex<Option<String>>,
    /// True once the job ended: what a caller waiting for the end watches.
    ended: tokio::sync::watch::Sender<bool>,
}

struct JobEnd {
    state: JobState,
    at: u64,
    elapsed: f64,
    error: Option<String>,
    result: Option<serde_json::Value>,
}

/// A job as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Job")]
pub struct JobView {
    pub id: u64,
    /// What the job does: repair, import or export.
    pub kind: String,
    /// What it works on: POOL or POOL/VDISK.
    pub target: String,
    pub state: JobState,
    pub total_bytes: u64,
    pub done_bytes: u64,
    /// Bytes per second since the start.
    pub rate: f64,
    pub eta_seconds: Option<f64>,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    pub finished_at: Option<u64>,
    pub elapsed_seconds: f64,
    /// Why a failed job failed.
    pub error: Option<String>,
    /// What a succeeded job reports (a repair's report, say).
    pub result: Option<serde_json::Value>,
}

impl Job {
    pub fn view(&self) -> JobView {
        let total = self.progress.total_bytes.load(Ordering::Relaxed);
        let done = self.progress.done_bytes.load(Ordering::Relaxed).min(total.max(1));
        let end = self.end.lock();
        let elapsed = end
            .as_ref()
            .map(|e| e.elapsed)
            .unwrap_or_else(|| self.started.elapsed().as_secs_f64());
        let rate = if elapsed > 0.0 { done as f64 / elapsed } else { 0.0 };
        let state = end.as_ref().map(|e| e.state).unwrap_or(JobState::Running);
        let eta = (state == JobState::Running && rate > 0.0 && total >= done).then(|| (total - done) as f64 / rate);
        JobView {
            id: self.id,
            kind: self.kind.clone(),
            target: self.target.clone(),
            state,
            total_bytes: total,
            done_bytes: done,
            rate,
            eta_seconds: eta,
            started_at: self.started_at,
            finished_at: end.as_ref().map(|e| e.at),
            elapsed_seconds: elapsed,
            error: end.as_ref().and_then(|e| e.error.clone()),
            result: end.as_ref().and_then(|e| e.result.clone()),
        }
    }

    pub fn state(&self) -> JobState {
        self.end.lock().as_ref().map(|e| e.state).unwrap_or(JobState::Running)
    }

    /// Returns once the job ended, or after `limit`, whichever comes first: a client that
    /// waits for a job learns of its end at once instead of at its next poll.
    pub async fn wait(&self, limit: std::time::Duration) {
        let mut ended = self.ended.subscribe();
        let _ = tokio::time::timeout(limit, ended.wait_for(|e| *e)).await;
    }
}

/// How many finished jobs are remembered.
const KEEP_FINISHED: usize = 256;

pub struct Jobs {
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
    next: AtomicU64,
    /// Where each job's start and end are told.
    events: Arc<EventLog>,
}

impl Default for Jobs {
    fn default() -> Jobs {
        Jobs::new(Arc::new(EventLog::in_memory()))
    }
}

impl Jobs {
    pub fn new(events: Arc<EventLog>) -> Jobs {
        Jobs {
            jobs: Default::default(),
            next: Default::default(),
            events,
        }
    }

    /// The event of a job's start or end: `repair.started`, `scrub.failed`, ...
    fn tell(events: &EventLog, job: &Job, state: &str, severity: Severity, message: String) {
        let pool = job.target.split('/').next().unwrap_or_default();
        events.record(
            NewEvent::new(severity, &format!("{}.{state}", job.kind), message)
                .pool(pool)
                .subject(job.target.clone()),
        );
    }

    /// Starts `work` on a thread of its own. `work` reports progress through the counters and
    /// returns a JSON result, or an error message.
    pub fn spawn<F>(&self, kind: &str, target: &str, work: F) -> Arc<Job>
    where
        F: FnOnce(&Progress) -> Result<serde_json::Value, String> + Send + 'static,
    {
        self.spawn_on(std::thread::Builder::new(), kind, target, work)
    }

    /// [`spawn`](Self::spawn), on a thread made by `builder` (a test gives one that cannot
    /// make any).
    fn spawn_on<F>(&self, builder: std::thread::Builder, kind: &str, target: &str, work: F) -> Arc<Job>
    where
        F: FnOnce(&Progress) -> Result<serde_json::Value, String> + Send + 'static,
    {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let job = Arc::new(Job {
            id,
            kind: kind.to_string(),
            target: target.to_string(),
            progress: Arc::new(Progress::default()),
            started_at: unix_now(),
            started: Instant::now(),
            end: Mutex::new(None),
            cancelled_because: Mutex::new(None),
            ended: tokio::sync::watch::Sender::new(false),
        });
        {
            let mut jobs = self.jobs.lock();
            jobs.insert(id, job.clone());
            let finished: Vec<u64> = jobs
                .iter()
                .filter(|(_, j)| j.state().finished())
                .map(|(id, _)| *id)
                .collect();
            for old in finished.iter().take(finished.len().saturating_sub(KEEP_FINISHED)) {
                jobs.remove(old);
            }
        }
        Jobs::tell(
            &self.events,
            &job,
            "started",
            Severity::Info,
            format!("job {id}: {kind} of {target} started"),
        );
        // Its thread named for it: a stack dump says which job a thread runs.
        let builder = builder.name(format!("job-{id}-{kind}"));
        let j = job.clone();
        let events = self.events.clone();
        let started = builder.spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&j.progress)))
                .unwrap_or_else(|_| Err("the job failed unexpectedly (see the daemon log)".into()));
            Jobs::end(&events, &j, r);
        });
        // No thread (the process is at its limit): the job ends failed and says so; left
        // "running", it would keep its vdisk or pool busy until the daemon restarts.
        if let Err(e) = started {
            Jobs::end(
                &self.events,
                &job,
                Err(format!("cannot start a thread for the job: {e}")),
            );
        }
        job
    }

    /// Records how a job ended, then tells it.
    fn end(events: &EventLog, j: &Job, r: Result<serde_json::Value, String>) {
        let cancelled = j.progress.cancel.load(Ordering::Relaxed);
        let (state, error, result) = match r {
            Ok(v) => (JobState::Succeeded, None, Some(v)),
            Err(_) if cancelled => (
                JobState::Cancelled,
                Some(match j.cancelled_because.lock().as_ref() {
                    Some(why) => format!("cancelled: {why}"),
                    None => "cancelled".to_string(),
                }),
                None,
            ),
            Err(e) => (JobState::Failed, Some(e), None),
        };
        let took = crate::units::format_duration(j.started.elapsed());
        let what = format!("job {}: {} of {}", j.id, j.kind, j.target);
        let told = match (&error, state) {
            (Some(e), JobState::Failed) => ("failed", Severity::Error, format!("{what} failed after {took}: {e}")),
            (Some(e), JobState::Cancelled) if e != "cancelled" => {
                ("cancelled", Severity::Warning, format!("{what} {e} (after {took})"))
            }
            (_, JobState::Cancelled) => ("cancelled", Severity::Warning, format!("{what} cancelled after {took}")),
            _ => ("finished", Severity::Info, format!("{what} finished in {took}")),
        };
        *j.end.lock() = Some(JobEnd {
            state,
            at: unix_now(),
            elapsed: j.started.elapsed().as_secs_f64(),
            error,
            result,
        });
        j.ended.send_replace(true);
        // After the end is set: whoever reads the event finds the job ended.
        Jobs::tell(events, j, told.0, told.1, told.2);
    }

    pub fn list(&self) -> Vec<JobView> {
        self.jobs.lock().values().map(|j| j.view()).collect()
    }

    pub fn get(&self, id: u64) -> ApiResult<Arc<Job>> {
        self.jobs.lock().get(&id).cloned().ok_or_else(|| {
            ApiError::not_found(format!(
                "no job {id}; 'tessera job list' shows the jobs this daemon remembers"
            ))
        })
    }

    pub fn cancel(&self, id: u64) -> ApiResult<JobView> {
        let j = self.get(id)?;
        if j.state().finished() {
            return Err(ApiError::busy(format!(
                "job {id} has already finished ({:?})",
                j.state()
            )));
        }
        j.progress.cancel.store(true, Ordering::Relaxed);
        info!(job = id, "cancel requested");
        Ok(j.view())
    }

    /// Cancels a running job for the daemon's own reason, which its end gives.
    pub fn cancel_because(&self, id: u64, why: &str) {
        if let Ok(j) = self.get(id) {
            if !j.state().finished() {
                *j.cancelled_because.lock() = Some(why.to_string());
                j.progress.cancel.store(true, Ordering::Relaxed);
                info!(job = id, reason = why, "job cancelled");
            }
        }
    }

    /// The kind of a job.
    pub fn kind(&self, id: u64) -> Option<String> {
        self.jobs.lock().get(&id).map(|j| j.kind.clone())
    }

    /// Running jobs that work on `target` or on something inside it.
    pub fn running_on(&self, target: &str) -> Vec<u64> {
        let prefix = format!("{target}/");
        self.jobs
            .lock()
            .values()
            .filter(|j| !j.state().finished() && (j.target == target || j.target.starts_with(&prefix)))
            .map(|j| j.id)
            .collect()
    }

    /// The running job of `kind` whose target is exactly `target`.
    pub fn running(&self, kind: &str, target: &str) -> Option<u64> {
        self.jobs
            .lock()
            .values()
            .find(|j| j.kind == kind && j.target == target && !j.state().finished())
            .map(|j| j.id)
    }

    /// Asks every running job to stop.
    pub fn cancel_all(&self) {
        for j in self.jobs.lock().values() {
            j.progress.cancel.store(true, Ordering::Relaxed);
        }
    }

    /// Waits up to `limit` for running jobs to notice a cancel.
    pub fn wait_idle(&self, limit: std::time::Duration) {
        let t = Instant::now();
        while t.elapsed() < limit && self.jobs.lock().values().any(|j| !j.state().finished()) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn wait(j: &Job) -> JobView {
        for _ in 0..3000 {
            if j.state().finished() {
                return j.view();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("job did not finish");
    }

    #[test]
    fn success_failure_and_cancel() {
        let jobs = Jobs::default();
        let ok = jobs.spawn("t", "p/v", |p| {
            p.total_bytes.store(10, Ordering::Relaxed);
            p.done_bytes.store(10, Ordering::Relaxed);
            Ok(serde_json::json!({"n": 1}))
        });
        let v = wait(&ok);
        assert_eq!(v.state, JobState::Succeeded);
        assert_eq!(v.result.unwrap()["n"], 1);
        assert_eq!(v.done_bytes, 10);

        let bad = jobs.spawn("t", "p", |_| Err("disk on fire".into()));
        let v = wait(&bad);
        assert_eq!(v.state, JobState::Failed);
        assert_eq!(v.error.as_deref(), Some("disk on fire"));

        let slow = jobs.spawn("t", "p/x", |p| {
            while !p.cancel.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err("stopped".into())
        });
        assert_eq!(jobs.running_on("p"), vec![slow.id]);
        assert!(jobs.running_on("q").is_empty());
        assert_eq!(jobs.running("t", "p/x"), Some(slow.id));
        assert_eq!(jobs.running("t", "p"), None, "another target");
        assert_eq!(jobs.running("u", "p/x"), None, "another kind");
        jobs.cancel(slow.id).unwrap();
        assert_eq!(wait(&slow).state, JobState::Cancelled);
        assert_eq!(jobs.cancel(slow.id).unwrap_err().code, crate::error::code::BUSY);
        assert_eq!(jobs.get(99).err().unwrap().code, crate::error::code::NOT_FOUND);
        assert_eq!(jobs.list().len(), 3);

        let boom = jobs.spawn("t", "p", |_| panic!("bug"));
        assert_eq!(wait(&boom).state, JobState::Failed);
    }

    #[test]
    fn a_job_without_a_thread_ends_failed_and_frees_its_target() {
        let events = Arc::new(EventLog::in_memory());
        let jobs = Jobs::new(events.clone());
        // No process can give a thread this much stack: the thread is refused.
        let unstartable = std::thread::Builder::new().stack_size(1 << 60);
        let j = jobs.spawn_on(unstartable, "scrub", "p", |_| Ok(serde_json::json!({})));
        let v = j.view();
        assert_eq!(v.state, JobState::Failed);
        assert!(v.error.unwrap().contains("cannot start a thread"));
        assert_eq!(jobs.running("scrub", "p"), None, "the pool is not left busy");
        let told = events.list(&Default::default(), 100);
        assert!(told.iter().any(|e| e.kind == "scrub.failed"), "{told:?}");
        // The next one starts.
        let ok = jobs.spawn("scrub", "p", |_| Ok(serde_json::json!({})));
        assert_eq!(wait(&ok).state, JobState::Succeeded);
    }

    #[test]
    fn a_job_the_daemon_cancels_says_why() {
        let events = Arc::new(EventLog::in_memory());
        let jobs = Jobs::new(events.clone());
        let slow = jobs.spawn("scrub", "p", |p| {
            while !p.cancel.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err("paused".into())
        });
        assert_eq!(jobs.kind(slow.id).as_deref(), Some("scrub"));
        jobs.cancel_because(slow.id, "pool p handed over to gateway gw-b");
        let v = wait(&slow);
        assert_eq!(v.state, JobState::Cancelled);
        assert_eq!(
            v.error.as_deref(),
            Some("cancelled: pool p handed over to gateway gw-b")
        );
        // After the end is set, the event: wait for it briefly.
        let told = (0..3000).find_map(|_| {
            let e = events
                .list(&Default::default(), 100)
                .into_iter()
                .find(|e| e.kind == "scrub.cancelled");
            if e.is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
            e
        });
        let told = told.expect("the end is told");
        assert!(told.message.contains("handed over to gateway gw-b"), "{}", told.message);
        // Once ended, a second cancel changes nothing.
        jobs.cancel_because(slow.id, "another reason");
        assert_eq!(
            slow.view().error.as_deref(),
            Some("cancelled: pool p handed over to gateway gw-b")
        );
    }
}
