//! What a benchmark reports: every run, the mean and relative standard deviation of the
//! headline figure, and human tables (the JSON is the same structures, serialized).

use serde::Serialize;

use crate::run::{mean_rsd, OpStats, RunReport};
use crate::workload::Workload;

/// The result of one `tessera bench` against one target.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub target: String,
    pub workload: Workload,
    pub runs: Vec<RunReport>,
    /// Mean IOPS over the runs, and their relative standard deviation in percent.
    pub iops_mean: f64,
    pub iops_rsd_percent: f64,
    pub mib_per_s_mean: f64,
    /// The RSD bound asked for, and whether the runs met it.
    pub until_rsd_percent: Option<f64>,
    pub rsd_met: Option<bool>,
}

impl Summary {
    pub fn new(target: &str, workload: &Workload, runs: Vec<RunReport>, until: Option<f64>) -> Summary {
        let iops: Vec<f64> = runs.iter().map(|r| r.total.iops).collect();
        let mib: Vec<f64> = runs.iter().map(|r| r.total.mib_per_s).collect();
        let (iops_mean, iops_rsd_percent) = mean_rsd(&iops);
        Summary {
            target: target.into(),
            workload: workload.clone(),
            iops_mean,
            iops_rsd_percent,
            mib_per_s_mean: mean_rsd(&mib).0,
            until_rsd_percent: until,
            rsd_met: until.map(|u| runs.len() >= 2 && iops_rsd_percent <= u),
            runs,
        }
    }

    /// Corrupt blocks seen in any run.
    pub fn corrupt(&self) -> u64 {
        self.runs
            .iter()
            .filter_map(|r| r.verify.as_ref())
            .map(|v| v.corrupt)
            .max()
            .unwrap_or(0)
    }
}

pub fn describe(w: &Workload) -> String {
    let size = if w.block_size % (1 << 20) == 0 {
        format!("{}M", w.block_size >> 20)
    } else if w.block_size % 1024 == 0 {
        format!("{}K", w.block_size >> 10)
    } else {
        format!("{}B", w.block_size)
    };
    format!(
        "{size} {}, {}% write, {} thread(s) x {} outstanding, {}s{}{}",
        if w.random { "random" } else { "sequential" },
        w.write_percent,
        w.threads,
        w.outstanding,
        w.duration.as_secs_f64(),
        if w.warmup.is_zero() {
            String::new()
        } else {
            format!(" after {}s warm-up", w.warmup.as_secs_f64())
        },
        if w.verify { ", verified" } else { "" }
    ) + if w.write_through && w.write_percent > 0 {
        ", writes through"
    } else {
        ""
    }
}

fn lat_row(name: &str, o: &OpStats) -> Option<Vec<String>> {
    let l = o.latency.as_ref()?;
    let f = |v: f64| format!("{v:.1}");
    Some(vec![
        name.into(),
        o.ops.to_string(),
        f(l.min_us),
        f(l.mean_us),
        f(l.p50_us),
        f(l.p90_us),
        f(l.p99_us),
        f(l.p999_us),
        f(l.max_us),
        f(l.stdev_us),
    ])
}

/// Prints rows under headers, each column as wide as its widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: &[String]| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<0$}", w[i])
                } else {
                    format!("{c:>0$}", w[i])
                }
            })
            .collect();
        s.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(&headers.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    for r in rows {
        out += &line(r);
    }
    out
}

/// The human report of one summary.
pub fn human(s: &Summary) -> String {
    let mut out = format!("{}\n{}\n\n", s.target, describe(&s.workload));
    let rows: Vec<Vec<String>> = s
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            vec![
                (i + 1).to_string(),
                format!("{:.0}", r.total.iops),
                format!("{:.1}", r.total.mib_per_s),
                r.read
                    .latency
                    .as_ref()
                    .map(|l| format!("{:.1}", l.p99_us))
                    .unwrap_or("-".into()),
                r.write
                    .latency
                    .as_ref()
                    .map(|l| format!("{:.1}", l.p99_us))
                    .unwrap_or("-".into()),
                format!("{:.0}", r.cpu_percent),
            ]
        })
        .collect();
    out += &table(&["run", "IOPS", "MiB/s", "read p99 us", "write p99 us", "CPU %"], &rows);
    if s.runs.len() > 1 {
        out += &format!(
            "mean {:.0} IOPS, {:.1} MiB/s, RSD {:.2}% over {} runs",
            s.iops_mean,
            s.mib_per_s_mean,
            s.iops_rsd_percent,
            s.runs.len()
        );
        if let (Some(u), Some(met)) = (s.until_rsd_percent, s.rsd_met) {
            out += &format!(" ({} the {u}% bound)", if met { "within" } else { "NOT within" });
        }
        out += "\n";
    }
    if let Some(last) = s.runs.last() {
        out += "\nlatency of the last run (microseconds):\n";
        let rows: Vec<Vec<String>> = [lat_row("read", &last.read), lat_row("write", &last.write)]
            .into_iter()
            .flatten()
            .collect();
        out += &table(
            &["", "ops", "min", "mean", "p50", "p90", "p99", "p99.9", "max", "stdev"],
            &rows,
        );
        if let Some(v) = &last.verify {
            out += &format!(
                "\nverify: {} reads checked, {} of blocks not written yet, {} corrupt\n",
                v.checked, v.unverified, v.corrupt
            );
            for e in &v.errors {
                out += &format!("  {e}\n");
            }
        }
    }
    out
}

/// Several summaries of the same workload, relative to the first.
pub fn compare(all: &[Summary]) -> String {
    let Some(base) = all.first() else {
        return String::new();
    };
    let p99 = |s: &Summary| {
        s.runs
            .last()
            .and_then(|r| r.total.latency.as_ref().map(|l| l.p99_us))
            .unwrap_or(0.0)
    };
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|s| {
            vec![
                s.target.clone(),
                format!("{:.0}", s.iops_mean),
                format!("{:.2}", s.iops_mean / base.iops_mean.max(f64::MIN_POSITIVE)),
                format!("{:.1}", s.mib_per_s_mean),
                format!("{:.1}", p99(s)),
                format!("{:.2}", p99(s) / p99(base).max(f64::MIN_POSITIVE)),
                format!("{:.2}", s.iops_rsd_percent),
            ]
        })
        .collect();
    format!(
        "{}\n\n{}",
        describe(&base.workload),
        table(
            &["target", "IOPS", "x first", "MiB/s", "p99 us", "x first", "RSD %"],
            &rows
        )
    )
}
