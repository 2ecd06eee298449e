//! The online metadata scan and spot-fix as the daemon runs them: each a job (progress in
//! metadata records, cancellable), one of them at a time per pool; the findings stay in the
//! pool until a spot-fix settles them.

use tessera_volume::VolumeError;

use crate::error::{ApiError, ApiResult};
use crate::jobs::JobView;
use crate::model::ScanResult;
use crate::Daemon;

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
        let job = self.jobs.spawn("scan", name, move |p| match e.scan(p) {
            Ok(r) => Ok(serde_json::to_value(r).expect("serializable")),
            Err(VolumeError::Layout(tessera_layout::LayoutError::Cancelled)) => {
                Err("cancelled; the last complete scan's findings are kept".into())
            }
            Err(err) => Err(err.to_string()),
        });
        Ok(job.view())
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
            report,
            next_after: findings.last().map(|f| f.id + 1).filter(|_| findings.len() == limit),
            findings,
        })
    }
}
