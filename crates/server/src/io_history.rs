//! The last hour of I/O of each vdisk, for the dashboard's charts: every [`INTERVAL`] the
//! daemon reads the I/O meters (crates/server/src/metrics.rs) and keeps, per vdisk, the reads
//! and writes per second, the bytes per second and the latency percentiles of the requests
//! answered in that interval, estimated from the histogram's buckets as Prometheus'
//! `histogram_quantile` does.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::metrics::{IoMetrics, IoTotals, LATENCY_BUCKETS};

pub const INTERVAL: Duration = Duration::from_secs(5);
/// One hour of points.
pub const KEEP: usize = 720;

/// One interval of one vdisk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IoPoint {
    /// The interval's end, in seconds since the Unix epoch.
    pub time: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_second: f64,
    pub write_bytes_per_second: f64,
    /// Of the reads and writes answered in the interval; none when there were none.
    pub latency_p50_seconds: Option<f64>,
    pub latency_p99_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VdiskIoHistory {
    pub pool: String,
    pub vdisk: String,
    /// Oldest first.
    pub points: Vec<IoPoint>,
}

/// What `GET /api/stats/io` answers.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IoHistoryView {
    pub interval_seconds: f64,
    pub vdisks: Vec<VdiskIoHistory>,
}

#[derive(Default)]
pub struct IoHistory {
    last: Mutex<Option<(f64, BTreeMap<(String, String), IoTotals>)>>,
    series: Mutex<BTreeMap<(String, String), VecDeque<IoPoint>>>,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The `q` quantile of the requests counted between two cumulative bucket readings, by linear
/// interpolation inside the bucket it falls in; the last bound when it falls past them all.
pub fn quantile(q: f64, before: &[u64], after: &[u64], count: u64) -> Option<f64> {
    if count == 0 {
        return None;
    }
    let rank = q * count as f64;
    let mut below = 0u64;
    for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
        let within = after[i].saturating_sub(before[i]);
        if within as f64 >= rank {
            let lower = if i == 0 { 0.0 } else { LATENCY_BUCKETS[i - 1] };
            let in_bucket = (within - below) as f64;
            let frac = if in_bucket > 0.0 {
                (rank - below as f64) / in_bucket
            } else {
                1.0
            };
            return Some(lower + (bound - lower) * frac.clamp(0.0, 1.0));
        }
        below = within;
    }
    Some(*LATENCY_BUCKETS.last().expect("buckets"))
}

impl IoHistory {
    /// Reads the meters and adds a point per vdisk (none at the first call: a point is a
    /// difference). Vdisks no longer metered are dropped.
    pub fn sample(&self, m: &IoMetrics) {
        let t = now();
        let totals = m.totals();
        let mut last = self.last.lock();
        let mut series = self.series.lock();
        series.retain(|k, _| totals.contains_key(k));
        if let Some((t0, before)) = last.as_ref() {
            let dt = (t - t0).max(0.001);
            for (k, a) in &totals {
                let zero = IoTotals {
                    buckets: vec![0; LATENCY_BUCKETS.len()],
                    ..Default::default()
                };
                let b = before.get(k).unwrap_or(&zero);
                let n = a.count.saturating_sub(b.count);
                let rate = |x: u64, y: u64| x.saturating_sub(y) as f64 / dt;
                let p = IoPoint {
                    time: t,
                    read_iops: rate(a.read_ops, b.read_ops),
                    write_iops: rate(a.write_ops, b.write_ops),
                    read_bytes_per_second: rate(a.read_bytes, b.read_bytes),
                    write_bytes_per_second: rate(a.write_bytes, b.write_bytes),
                    latency_p50_seconds: quantile(0.5, &b.buckets, &a.buckets, n),
                    latency_p99_seconds: quantile(0.99, &b.buckets, &a.buckets, n),
                };
                let s = series.entry(k.clone()).or_default();
                s.push_back(p);
                if s.len() > KEEP {
                    s.pop_front();
                }
            }
        }
        *last = Some((t, totals));
    }

    /// The points of the last `seconds`.
    pub fn view(&self, seconds: f64) -> IoHistoryView {
        let since = now() - seconds;
        IoHistoryView {
            interval_seconds: INTERVAL.as_secs_f64(),
            vdisks: self
                .series
                .lock()
                .iter()
                .map(|((pool, vdisk), points)| VdiskIoHistory {
                    pool: pool.clone(),
                    vdisk: vdisk.clone(),
                    points: points.iter().filter(|p| p.time >= since).cloned().collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_disk::{IoMeter, IoOp};

    #[test]
    fn quantiles_fall_in_the_right_bucket() {
        let n = LATENCY_BUCKETS.len();
        let zero = vec![0; n];
        // 100 requests: 50 within 1 ms (bucket 4), 49 more within 2.5 ms, 1 within 10 ms.
        let mut after = vec![0; n];
        for (i, c) in after.iter_mut().enumerate() {
            *c = match LATENCY_BUCKETS[i] {
                b if b < 0.001 => 0,
                b if b < 0.0025 => 50,
                b if b < 0.01 => 99,
                _ => 100,
            };
        }
        let p50 = quantile(0.5, &zero, &after, 100).unwrap();
        assert!(p50 > 0.0005 && p50 <= 0.001, "{p50}");
        let p99 = quantile(0.99, &zero, &after, 100).unwrap();
        assert!(p99 > 0.001 && p99 <= 0.0025, "{p99}");
        assert_eq!(quantile(0.5, &zero, &zero, 0), None);
        // Past every bound: the last one.
        assert_eq!(quantile(0.5, &zero, &zero, 10), Some(10.0));
    }

    #[test]
    fn a_point_is_what_happened_in_the_interval() {
        let m = IoMetrics::default();
        let h = IoHistory::default();
        let meter = m.meter("nbd", "p", "v");
        meter.done(IoOp::Write, 4096, Duration::from_micros(300), true);
        h.sample(&m);
        assert!(
            h.view(3600.0).vdisks.iter().all(|v| v.points.is_empty()),
            "a difference needs two"
        );
        for _ in 0..10 {
            meter.done(IoOp::Read, 8192, Duration::from_micros(700), true);
        }
        m.meter("iscsi", "p", "v")
            .done(IoOp::Write, 4096, Duration::from_micros(700), true);
        std::thread::sleep(Duration::from_millis(50));
        h.sample(&m);
        let v = h.view(3600.0);
        assert_eq!(v.vdisks.len(), 1);
        let p = &v.vdisks[0].points[0];
        let dt = 10.0 / p.read_iops;
        assert!(dt > 0.04 && dt < 5.0, "{dt}");
        assert!(
            (p.write_iops * dt - 1.0).abs() < 1e-6,
            "one write, both protocols together"
        );
        assert!((p.read_bytes_per_second * dt - 81920.0).abs() < 1e-3);
        let p50 = p.latency_p50_seconds.unwrap();
        assert!(p50 > 0.0005 && p50 <= 0.001, "{p50}");
    }
}
