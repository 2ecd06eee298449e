//! Prometheus metrics, served as `GET /metrics` in the text exposition format on the API
//! listeners (and on `metrics_listen`, under the same token).
//!
//! Two kinds: what counts as I/O happens (operations, bytes, errors and latency per protocol,
//! pool, vdisk and operation), kept in [`IoMetrics`] for the daemon's life; and the state of
//! pools, disks, vdisks, the write-back cache, dedup, scrub, jobs, sessions and replicas, read from the
//! engines at each scrape, so a scrape always sees the state the API shows. Names follow the
//! Prometheus conventions: base units (bytes, seconds), `_total` for counters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use tessera_disk::{DiskOp, IoMeter, IoOp, OpFigures};

use crate::daemon::Daemon;
use crate::jobs::JobState;
use crate::model::{PoolHealth, ScrubRunState};
use tessera_volume::DiskState;

/// Latency buckets, in seconds: those of the member disks' histograms, so that a request's
/// latency and its disks' compare bucket by bucket.
pub use tessera_disk::LATENCY_BUCKETS;

const IO_LABELS: [&str; 4] = ["protocol", "pool", "vdisk", "op"];

/// I/O by protocol, pool, vdisk and operation, for the daemon's life.
pub struct IoMetrics {
    registry: Registry,
    ops: IntCounterVec,
    bytes: IntCounterVec,
    errors: IntCounterVec,
    latency: HistogramVec,
    /// Meters handed out, by (protocol, pool, vdisk): one set of series per vdisk and
    /// protocol, however many exports or LUNs present it.
    meters: Mutex<BTreeMap<(String, String, String), Arc<VdiskMeter>>>,
}

impl Default for IoMetrics {
    fn default() -> IoMetrics {
        let registry = Registry::new();
        let ops = IntCounterVec::new(
            Opts::new(
                "tessera_io_operations_total",
                "Requests answered, by protocol, vdisk and operation",
            ),
            &IO_LABELS,
        )
        .expect("valid metric");
        let bytes = IntCounterVec::new(
            Opts::new("tessera_io_bytes_total", "Bytes read or written by requests answered"),
            &IO_LABELS,
        )
        .expect("valid metric");
        let errors = IntCounterVec::new(
            Opts::new("tessera_io_errors_total", "Requests answered with an error"),
            &IO_LABELS,
        )
        .expect("valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "tessera_io_latency_seconds",
                "Time from a request's arrival to its answer being ready to send",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &IO_LABELS,
        )
        .expect("valid metric");
        for c in [&ops, &bytes, &errors] {
            registry.register(Box::new(c.clone())).expect("registered once");
        }
        registry.register(Box::new(latency.clone())).expect("registered once");
        IoMetrics {
            registry,
            ops,
            bytes,
            errors,
            latency,
            meters: Mutex::new(BTreeMap::new()),
        }
    }
}

impl IoMetrics {
    /// The meter of a vdisk served over `protocol` ("nbd", "iscsi").
    pub fn meter(&self, protocol: &str, pool: &str, vdisk: &str) -> Arc<VdiskMeter> {
        let key = (protocol.to_string(), pool.to_string(), vdisk.to_string());
        self.meters
            .lock()
            .entry(key)
            .or_insert_with(|| {
                let per_op = |op: IoOp| {
                    let l = [protocol, pool, vdisk, op.name()];
                    OpMeter {
                        ops: self.ops.with_label_values(&l),
                        bytes: self.bytes.with_label_values(&l),
                        errors: self.errors.with_label_values(&l),
                        latency: self.latency.with_label_values(&l),
                    }
                };
                Arc::new(VdiskMeter {
                    ops: IoOp::ALL.map(per_op),
                })
            })
            .clone()
    }

    /// What every vdisk has done so far, all protocols together: reads and writes, and the
    /// latency histogram of both, for the dashboard's history.
    pub fn totals(&self) -> BTreeMap<(String, String), IoTotals> {
        use prometheus::core::Metric;
        let mut out: BTreeMap<(String, String), IoTotals> = BTreeMap::new();
        for ((_, pool, vdisk), m) in self.meters.lock().iter() {
            let t = out.entry((pool.clone(), vdisk.clone())).or_insert_with(|| IoTotals {
                buckets: vec![0; LATENCY_BUCKETS.len()],
                ..Default::default()
            });
            for op in [IoOp::Read, IoOp::Write] {
                let o = &m.ops[op as usize];
                let (ops, bytes) = (o.ops.get(), o.bytes.get());
                if op == IoOp::Read {
                    (t.read_ops, t.read_bytes) = (t.read_ops + ops, t.read_bytes + bytes);
                } else {
                    (t.write_ops, t.write_bytes) = (t.write_ops + ops, t.write_bytes + bytes);
                }
                let h = o.latency.metric();
                let h = h.get_histogram();
                t.count += h.get_sample_count();
                for (i, b) in h.get_bucket().iter().enumerate().take(LATENCY_BUCKETS.len()) {
                    t.buckets[i] += b.cumulative_count();
                }
            }
        }
        out
    }

    /// Reads and writes answered so far for the vdisks of `pool`, all protocols together:
    /// its counters only, none of the histograms `totals` reads.
    pub fn requests_of_pool(&self, pool: &str) -> u64 {
        self.meters
            .lock()
            .iter()
            .filter(|((_, p, _), _)| p == pool)
            .map(|(_, m)| m.ops[IoOp::Read as usize].ops.get() + m.ops[IoOp::Write as usize].ops.get())
            .sum()
    }

    /// Forgets the series of a vdisk deleted (or renamed away), so a scrape stops showing it.
    pub fn forget_vdisk(&self, pool: &str, vdisk: &str) {
        let mut meters = self.meters.lock();
        let gone: Vec<_> = meters
            .keys()
            .filter(|(_, p, v)| p == pool && v == vdisk)
            .cloned()
            .collect();
        for key in gone {
            meters.remove(&key);
            for op in IoOp::ALL {
                let l = [key.0.as_str(), pool, vdisk, op.name()];
                let _ = self.ops.remove_label_values(&l);
                let _ = self.bytes.remove_label_values(&l);
                let _ = self.errors.remove_label_values(&l);
                let _ = self.latency.remove_label_values(&l);
            }
        }
    }
}

/// Reads and writes of one vdisk since the daemon started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IoTotals {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Requests answered within each of [`LATENCY_BUCKETS`] (cumulative), and in all.
    pub buckets: Vec<u64>,
    pub count: u64,
}

struct OpMeter {
    ops: IntCounter,
    bytes: IntCounter,
    errors: IntCounter,
    latency: Histogram,
}

/// The series of one vdisk over one protocol, resolved once: recording an I/O is a few
/// atomic adds, no label lookup.
pub struct VdiskMeter {
    ops: [OpMeter; IoOp::COUNT],
}

impl IoMeter for VdiskMeter {
    fn done(&self, op: IoOp, bytes: u64, latency: Duration, ok: bool) {
        let m = &self.ops[op as usize];
        m.ops.inc();
        if ok {
            m.bytes.inc_by(bytes);
        } else {
            m.errors.inc();
        }
        m.latency.observe(latency.as_secs_f64());
    }
}

/// Everything a scrape shows, in the text exposition format.
pub fn render(d: &Daemon) -> String {
    let state = Registry::new();
    let disk_latency = collect_state(d, &state);
    let mut families = d.io_metrics.registry.gather();
    families.extend(state.gather());
    // The text encoder refuses a family without samples: a daemon with no member disks (no
    // pool yet, or only pools on RADOS) has no disk latencies.
    if !disk_latency.get_metric().is_empty() {
        families.push(disk_latency);
    }
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut out)
        .expect("the text encoder writes to memory");
    String::from_utf8(out).expect("the text format is UTF-8")
}

/// Gauges and counters of one scrape, registered as they are made.
struct Scrape<'a> {
    r: &'a Registry,
}

impl Scrape<'_> {
    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
        self.add(g.clone());
        g
    }

    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
        self.add(c.clone());
        c
    }

    fn float(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
        let g = prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
        self.add(g.clone());
        g
    }

    fn add(&self, c: impl Collector + 'static) {
        self.r.register(Box::new(c)).expect("each name once per scrape");
    }
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The latency histogram of each member disk's operations, made from the disk's own
/// counters ([`DiskIo`]): they live in the disk layer, which knows nothing of Prometheus.
struct DiskLatency(Vec<prometheus::proto::Metric>);

impl DiskLatency {
    fn add(&mut self, pool: &str, disk: &str, op: DiskOp, f: &OpFigures) {
        use prometheus::proto::{Bucket, Histogram, LabelPair, Metric};
        let label = |name: &str, value: &str| {
            let mut l = LabelPair::default();
            l.set_name(name.to_string());
            l.set_value(value.to_string());
            l
        };
        let mut h = Histogram::default();
        h.set_sample_count(f.ops);
        h.set_sample_sum(f.latency_sum.as_secs_f64());
        h.set_bucket(
            LATENCY_BUCKETS
                .iter()
                .zip(&f.buckets)
                .map(|(&bound, &n)| {
                    let mut b = Bucket::default();
                    b.set_upper_bound(bound);
                    b.set_cumulative_count(n);
                    b
                })
                .collect(),
        );
        let mut m = Metric::default();
        m.set_label(vec![label("disk", disk), label("op", op.name()), label("pool", pool)]);
        m.set_histogram(h);
        self.0.push(m);
    }

    fn family(self) -> prometheus::proto::MetricFamily {
        let mut f = prometheus::proto::MetricFamily::default();
        f.set_name("tessera_disk_io_latency_seconds".into());
        f.set_help("Time member disk operations took, from submission to completion".into());
        f.set_field_type(prometheus::proto::MetricType::HISTOGRAM);
        f.set_metric(self.0);
        f
    }
}

/// Registers the state's series in `r`; returns the disks' latency histograms, which are
/// made by hand.
fn collect_state(d: &Daemon, r: &Registry) -> prometheus::proto::MetricFamily {
    let s = Scrape { r };
    let mut disk_latency = DiskLatency(Vec::new());
    let up = s.float(
        "tessera_start_time_seconds",
        "When the daemon started, in seconds since the Unix epoch",
        &[],
    );
    up.with_label_values(&[] as &[&str]).set(d.started_unix as f64);

    let events = s.counter(
        "tessera_events_total",
        "Events recorded since the daemon started, by severity (repeats folded into one event counted too)",
        &["severity"],
    );
    for (sev, n) in d.events.counts() {
        events.with_label_values(&[sev.as_str()]).inc_by(n);
    }
    let hook_failures = s.counter(
        "tessera_event_hook_failures_total",
        "Event hook or webhook runs that failed, timed out or were dropped for a full queue",
        &[],
    );
    hook_failures
        .with_label_values(&[] as &[&str])
        .inc_by(d.events.hook_failures.load(std::sync::atomic::Ordering::Relaxed));
    let unwritten = s.counter(
        "tessera_events_unwritten_total",
        "Events that could not be written to the event log file",
        &[],
    );
    unwritten
        .with_label_values(&[] as &[&str])
        .inc_by(d.events.unwritten.load(std::sync::atomic::Ordering::Relaxed));

    let pool_state = s.gauge(
        "tessera_pool_state",
        "1 for the state the pool is in (healthy, degraded, failed, unavailable), 0 for the others",
        &["pool", "state"],
    );
    let capacity = s.gauge(
        "tessera_pool_capacity_bytes",
        "Raw slab space of the pool's healthy disks",
        &["pool"],
    );
    let used = s.gauge(
        "tessera_pool_used_bytes",
        "Raw slab space in use (copies and parity included)",
        &["pool"],
    );
    let free = s.gauge("tessera_pool_free_bytes", "Raw slab space free", &["pool"]);
    let spare = s.gauge(
        "tessera_pool_spare_bytes",
        "Free space on hot spares, kept for repairs",
        &["pool"],
    );
    let repair = s.gauge(
        "tessera_pool_repair_needed_bytes",
        "Bytes of slab sets that lost a member and wait for a repair",
        &["pool"],
    );
    let vdisks = s.gauge(
        "tessera_pool_vdisks",
        "Vdisks of the pool (snapshots not counted)",
        &["pool"],
    );
    let read_errors = s.counter(
        "tessera_pool_read_errors_total",
        "Member reads that failed, since the pool was opened",
        &["pool"],
    );
    let write_errors = s.counter(
        "tessera_pool_write_errors_total",
        "Member writes that failed, since the pool was opened",
        &["pool"],
    );
    let reconstructed = s.counter(
        "tessera_pool_reconstructed_reads_total",
        "Reads served from another copy or rebuilt from parity, since the pool was opened",
        &["pool"],
    );
    let repaired = s.counter(
        "tessera_pool_repaired_blocks_total",
        "Blocks rewritten with good data from elsewhere, since the pool was opened",
        &["pool"],
    );
    let checksum = s.counter(
        "tessera_pool_checksum_errors_total",
        "Blocks that did not match their checksum when read, since the pool was opened",
        &["pool"],
    );
    let disk_state = s.gauge(
        "tessera_disk_state",
        "1 for the state the disk is in, 0 for the others",
        &["pool", "disk", "path", "state"],
    );
    let disk_size = s.gauge("tessera_disk_size_bytes", "Size of the member disk", &["pool", "disk"]);
    let disk_used = s.gauge(
        "tessera_disk_used_bytes",
        "Slab space in use on the disk",
        &["pool", "disk"],
    );
    let disk_read_errors = s.counter(
        "tessera_disk_read_errors_total",
        "Reads the disk failed, since the pool was opened",
        &["pool", "disk"],
    );
    let disk_checksum = s.counter(
        "tessera_disk_checksum_errors_total",
        "4 KiB blocks the disk returned that did not match their checksum, since the pool was opened",
        &["pool", "disk"],
    );
    let disk_repaired = s.counter(
        "tessera_disk_repaired_bytes_total",
        "Bytes rewritten on the disk with good data from elsewhere, since the pool was opened",
        &["pool", "disk"],
    );
    let disk_ops = s.counter(
        "tessera_disk_io_operations_total",
        "Reads, writes and flushes issued to the member disk, since the pool had it open",
        &["pool", "disk", "op"],
    );
    let disk_bytes = s.counter(
        "tessera_disk_io_bytes_total",
        "Bytes the member disk read or wrote for operations that succeeded",
        &["pool", "disk", "op"],
    );
    let disk_io_errors = s.counter(
        "tessera_disk_io_errors_total",
        "Operations the member disk failed",
        &["pool", "disk", "op"],
    );
    let vd_size = s.gauge(
        "tessera_vdisk_size_bytes",
        "Size the vdisk presents",
        &["pool", "vdisk"],
    );
    let vd_alloc = s.gauge(
        "tessera_vdisk_allocated_bytes",
        "Bytes of grains the vdisk points at",
        &["pool", "vdisk"],
    );
    let vd_excl = s.gauge(
        "tessera_vdisk_exclusive_bytes",
        "Bytes of grains no other vdisk, snapshot or copy shares",
        &["pool", "vdisk"],
    );
    let vd_saved = s.gauge(
        "tessera_vdisk_saved_bytes",
        "Bytes sharing (dedup, clones, snapshots) saves the vdisk",
        &["pool", "vdisk"],
    );
    let cache_dirty = s.gauge(
        "tessera_cache_dirty_bytes",
        "Bytes in the write-back cache not yet destaged",
        &["pool"],
    );
    let cache_log = s.gauge("tessera_cache_log_bytes", "Size of the write-back cache log", &["pool"]);
    let cache_lost = s.gauge(
        "tessera_cache_lost_bytes",
        "Bytes lost before they were destaged (the write-back log's disks failed, or every copy rotted): reads of them fail until written again",
        &["pool"],
    );
    let cache_parked = s.gauge(
        "tessera_cache_parked_bytes",
        "Bytes the write-back log held for slab sets beyond their tolerance, kept for disks that are away and may come back: reads and writes of them are refused until those disks are back",
        &["pool"],
    );
    let cache_cached = s.counter(
        "tessera_cache_written_bytes_total",
        "Bytes written into the write-back cache",
        &["pool"],
    );
    let cache_hits = s.counter(
        "tessera_cache_read_hit_bytes_total",
        "Bytes read from the write-back cache",
        &["pool"],
    );
    let cache_destaged = s.counter(
        "tessera_cache_destaged_bytes_total",
        "Bytes destaged from the write-back cache to the layouts",
        &["pool"],
    );
    let cache_rounds = s.counter(
        "tessera_cache_destage_rounds_total",
        "Destage rounds of the write-back cache, each ended by a flush",
        &["pool"],
    );
    let cache_largest_round = s.gauge(
        "tessera_cache_largest_destage_round_bytes",
        "The most bytes one destage round wrote since the pool was opened: what a writer waiting for room may wait for",
        &["pool"],
    );
    let dd_logical = s.gauge(
        "tessera_dedup_logical_bytes",
        "Bytes of mapped grains of the vdisks in dedup's scope",
        &["pool"],
    );
    let dd_physical = s.gauge(
        "tessera_dedup_physical_bytes",
        "Bytes of the distinct slots they point at",
        &["pool"],
    );
    let dd_saved = s.gauge("tessera_dedup_saved_bytes", "Logical less physical bytes", &["pool"]);
    let dd_ratio = s.float(
        "tessera_dedup_saved_ratio",
        "Saved over logical bytes (the deduplication rate)",
        &["pool"],
    );
    let dd_hot = s.gauge(
        "tessera_dedup_hot_copies",
        "Second copies of blocks shared past the threshold on layouts with no redundancy",
        &["pool"],
    );
    let scrub_running = s.gauge("tessera_scrub_running", "1 while a scrub pass runs", &["pool"]);
    let scrub_done = s.gauge(
        "tessera_scrub_last_finished_time_seconds",
        "When the last scrub pass finished, in seconds since the Unix epoch",
        &["pool"],
    );
    let scrub_repaired = s.gauge(
        "tessera_scrub_last_repaired_blocks",
        "Blocks the last finished scrub pass repaired",
        &["pool"],
    );
    let scrub_lost = s.gauge(
        "tessera_scrub_last_unrecoverable_blocks",
        "Blocks the last finished scrub pass found with no good copy left",
        &["pool"],
    );
    let pool_lost = s.gauge(
        "tessera_pool_lost_bytes",
        "Bytes of vdisks' data lost beyond repair on the pool's disks (rotten on their disk and on the parity where a write or a repair had to read them): reads of them fail until written again",
        &["pool"],
    );
    let scan_done = s.gauge(
        "tessera_scan_last_finished_time_seconds",
        "When the last metadata scan finished, in seconds since the Unix epoch",
        &["pool"],
    );
    let scan_open = s.gauge(
        "tessera_scan_open_findings",
        "Problems the last metadata scan found that no spot-fix has repaired yet",
        &["pool"],
    );

    // Pools on Ceph RADOS: which gateway serves each, at which epoch, and how often this one
    // took it over or failed to.
    if let Some(joined) = d.gateway_joined() {
        s.gauge(
            "tessera_gateway_joined",
            "1 while this gateway holds its lease in etcd (pools on RADOS are served only then), 0 otherwise",
            &[],
        )
        .with_label_values(&[] as &[&str])
        .set(joined as i64);
    }
    let rados_here = s.gauge(
        "tessera_pool_rados_served_here",
        "1 while this gateway owns and serves the pool on RADOS, 0 while another does or nobody yet",
        &["pool"],
    );
    let rados_epoch = s.gauge(
        "tessera_pool_rados_owner_epoch",
        "The epoch (etcd revision) under which the pool's owner writes, where an owner is known",
        &["pool"],
    );
    let rados_owner = s.gauge(
        "tessera_pool_rados_owner_info",
        "1 for the gateway that owns the pool on RADOS, where one is known",
        &["pool", "owner"],
    );
    let rados_takeovers = s.counter(
        "tessera_pool_rados_takeovers_total",
        "Times this gateway took the pool on RADOS and served it, since the daemon started",
        &["pool"],
    );
    let rados_failed = s.counter(
        "tessera_pool_rados_failed_takes_total",
        "Attempts of this gateway to take or open the pool on RADOS that failed, since the daemon started",
        &["pool"],
    );

    for detail in d.pool_details() {
        let p = &detail.summary;
        let name = p.name.as_str();
        if let Some(r) = &p.rados {
            rados_here.with_label_values(&[name]).set(r.here as i64);
            if let Some(epoch) = r.epoch {
                rados_epoch.with_label_values(&[name]).set(epoch);
            }
            if let Some(owner) = &r.owner_name {
                rados_owner.with_label_values(&[name, owner]).set(1);
            }
            rados_takeovers.with_label_values(&[name]).inc_by(r.takeovers);
            rados_failed.with_label_values(&[name]).inc_by(r.failed_takes);
        }
        for st in [
            PoolHealth::Healthy,
            PoolHealth::Degraded,
            PoolHealth::Failed,
            PoolHealth::Unavailable,
            PoolHealth::Destroying,
        ] {
            pool_state
                .with_label_values(&[name, &st.to_string()])
                .set((p.health == st) as i64);
        }
        if let Some(c) = p.capacity {
            capacity.with_label_values(&[name]).set(i(c.total_bytes));
            used.with_label_values(&[name]).set(i(c.used_bytes));
            free.with_label_values(&[name]).set(i(c.free_bytes));
            spare.with_label_values(&[name]).set(i(c.spare_bytes));
        }
        repair.with_label_values(&[name]).set(i(p.repair_needed_bytes));
        pool_lost.with_label_values(&[name]).set(i(p.lost_bytes));
        vdisks.with_label_values(&[name]).set(p.vdisks as i64);
        if let Some(c) = &p.cache {
            cache_dirty.with_label_values(&[name]).set(i(c.dirty_bytes));
            cache_log.with_label_values(&[name]).set(i(c.log_bytes));
            cache_lost.with_label_values(&[name]).set(i(c.lost_bytes));
            cache_parked.with_label_values(&[name]).set(i(c.parked_bytes));
            cache_cached.with_label_values(&[name]).inc_by(c.cached_bytes);
            cache_hits.with_label_values(&[name]).inc_by(c.read_hit_bytes);
            cache_destaged.with_label_values(&[name]).inc_by(c.destaged_bytes);
            cache_rounds.with_label_values(&[name]).inc_by(c.destage_rounds);
            cache_largest_round
                .with_label_values(&[name])
                .set(i(c.largest_destage_round_bytes));
        }
        scrub_running
            .with_label_values(&[name])
            .set((p.scrub.state == ScrubRunState::Running) as i64);
        if let Some(last) = &p.scrub.last {
            scrub_done
                .with_label_values(&[name])
                .set(i(last.finished_at.unwrap_or(0)));
            scrub_repaired.with_label_values(&[name]).set(i(last.repaired));
            scrub_lost.with_label_values(&[name]).set(i(last.unrecoverable));
        }
        if let Some(scan) = &p.scan {
            scan_done.with_label_values(&[name]).set(i(scan.finished_at));
            let fixed = scan.spotfix.as_ref().map_or(0, |f| f.fixed);
            scan_open
                .with_label_values(&[name])
                .set(i(scan.findings.saturating_sub(fixed)));
        }
        read_errors.with_label_values(&[name]).inc_by(detail.stats.read_errors);
        write_errors
            .with_label_values(&[name])
            .inc_by(detail.stats.write_errors);
        reconstructed
            .with_label_values(&[name])
            .inc_by(detail.stats.reconstructed_reads);
        repaired.with_label_values(&[name]).inc_by(detail.stats.repaired_blocks);
        checksum.with_label_values(&[name]).inc_by(detail.stats.checksum_errors);
        let engine = d.engine(name).ok();
        for disk in &detail.disk_list {
            let id = disk.id.as_str();
            for st in [
                DiskState::Healthy,
                DiskState::Failed,
                DiskState::Retired,
                DiskState::Missing,
                DiskState::Spare,
            ] {
                disk_state
                    .with_label_values(&[name, id, &disk.path, st.as_str()])
                    .set((disk.state == st) as i64);
            }
            disk_size.with_label_values(&[name, id]).set(i(disk.size));
            disk_used.with_label_values(&[name, id]).set(i(disk.used_bytes));
            disk_read_errors.with_label_values(&[name, id]).inc_by(disk.errors.read);
            disk_checksum
                .with_label_values(&[name, id])
                .inc_by(disk.errors.checksum);
            disk_repaired
                .with_label_values(&[name, id])
                .inc_by(disk.errors.repaired_bytes);
            // A disk the pool holds no device for (failed, missing) shows zeros.
            let io = engine
                .as_ref()
                .and_then(|e| e.pool().disk_io(disk.position))
                .unwrap_or_default();
            for op in DiskOp::ALL {
                let f = io.figures(op);
                let l = [name, id, op.name()];
                disk_ops.with_label_values(&l).inc_by(f.ops);
                disk_bytes.with_label_values(&l).inc_by(f.bytes);
                disk_io_errors.with_label_values(&l).inc_by(f.errors);
                disk_latency.add(name, id, op, &f);
            }
        }
        for v in &detail.vdisk_list {
            let l = [name, v.name.as_str()];
            vd_size.with_label_values(&l).set(i(v.size));
            vd_alloc.with_label_values(&l).set(i(v.allocated_bytes));
            vd_excl.with_label_values(&l).set(i(v.exclusive_bytes));
            vd_saved.with_label_values(&l).set(i(v.saved_bytes));
        }
        if let Ok(e) = d.engine(name) {
            // The report walks every grain map: only where dedup has something to say.
            if e.dedup_settings().enabled || !e.hot_copies().is_empty() {
                let st = e.dedup_status();
                dd_logical.with_label_values(&[name]).set(i(st.logical_bytes));
                dd_physical.with_label_values(&[name]).set(i(st.physical_bytes));
                dd_saved.with_label_values(&[name]).set(i(st.saved_bytes));
                dd_ratio.with_label_values(&[name]).set(st.saved_ratio);
                dd_hot.with_label_values(&[name]).set(i(st.hot_copies));
            }
        }
    }

    let jobs = s.gauge(
        "tessera_jobs",
        "Jobs the daemon knows, by kind and state",
        &["kind", "state"],
    );
    let running_done = s.gauge(
        "tessera_job_done_bytes",
        "Bytes a running job has done",
        &["id", "kind", "target"],
    );
    let running_total = s.gauge(
        "tessera_job_total_bytes",
        "Bytes a running job has to do",
        &["id", "kind", "target"],
    );
    let mut by: BTreeMap<(String, &'static str), i64> = BTreeMap::new();
    for j in d.jobs.list() {
        let state = match j.state {
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        };
        *by.entry((j.kind.clone(), state)).or_default() += 1;
        if j.state == JobState::Running {
            let l = [j.id.to_string(), j.kind.clone(), j.target.clone()];
            let l: Vec<&str> = l.iter().map(String::as_str).collect();
            running_done.with_label_values(&l).set(i(j.done_bytes));
            running_total.with_label_values(&l).set(i(j.total_bytes));
        }
    }
    for ((kind, state), n) in by {
        jobs.with_label_values(&[kind.as_str(), state]).set(n);
    }

    let sessions = s.gauge(
        "tessera_iscsi_sessions",
        "iSCSI sessions logged in, by target (\"\" for discovery sessions)",
        &["target"],
    );
    for (_, target, _) in d.targets.registry.sessions() {
        sessions.with_label_values(&[target.as_str()]).inc();
    }
    let portal_conns = s.gauge(
        "tessera_iscsi_connections",
        "TCP connections open through the iSCSI portal (logging in, in a session, or ending)",
        &["portal"],
    );
    for p in d.portals.list() {
        if let Some(on) = &p.listening_on {
            portal_conns.with_label_values(&[on.as_str()]).set(p.connections as i64);
        }
    }
    let luns = s.gauge("tessera_iscsi_luns", "LUNs presented, by target", &["target"]);
    for t in d.list_targets() {
        luns.with_label_values(&[t.iqn.as_str()]).set(t.luns.len() as i64);
        sessions.with_label_values(&[t.iqn.as_str()]).add(0);
    }
    let conns = s.gauge(
        "tessera_nbd_connections",
        "Open NBD connections, by export",
        &["export", "vdisk"],
    );
    let online = s.gauge(
        "tessera_nbd_export_online",
        "1 when the export's vdisk is served, 0 when its pool is not imported",
        &["export", "vdisk"],
    );
    for x in d.list_nbd_exports() {
        let l = [x.name.as_str(), x.vdisk.as_str()];
        conns.with_label_values(&l).set(x.connections as i64);
        online.with_label_values(&l).set(x.online as i64);
    }
    // The request buffers initiators and clients hold against their daemon-wide bounds: one
    // at its limit holds some of them back (TASK SET FULL, or NBD requests left unread).
    let buffers = s.gauge(
        "tessera_request_buffer_bytes",
        "Bytes of request buffers held now, by protocol: iSCSI write data not yet written, NBD request data and replies not yet taken",
        &["protocol"],
    );
    let limits = s.gauge(
        "tessera_request_buffer_limit_bytes",
        "The bound on tessera_request_buffer_bytes (iscsi_write_buffer_total, nbd_buffer_total)",
        &["protocol"],
    );
    let held = d.nbd.registry.held();
    for (protocol, used, limit) in [
        (
            "iscsi",
            d.targets.registry.write_bytes_in_use(),
            d.targets.registry.limits().write_bytes_total,
        ),
        ("nbd", held.used(), held.limit()),
    ] {
        buffers.with_label_values(&[protocol]).set(used as i64);
        limits.with_label_values(&[protocol]).set(limit as i64);
    }
    replicas(d, &s);
    disk_latency.family()
}

/// Replicas of local vdisks (by replica name) and replicas held here for peers.
fn replicas(d: &Daemon, s: &Scrape) {
    let l = &["replica", "pool", "vdisk"];
    let lag = s.gauge(
        "tessera_replica_lag_seconds",
        "Age of the replica's last consistent snapshot at the peer (since creation, before the first)",
        l,
    );
    let rpo = s.gauge(
        "tessera_replica_rpo_seconds",
        "The replica's recovery point objective; 0: none",
        l,
    );
    let syncing = s.gauge("tessera_replica_syncing", "1 while a cycle runs", l);
    let cycles = s.counter(
        "tessera_replica_cycles_total",
        "Replication cycles ended, by result",
        &["replica", "pool", "vdisk", "result"],
    );
    let changed = s.counter(
        "tessera_replica_changed_bytes_total",
        "Bytes of grains changed since the base, over all cycles",
        l,
    );
    let sent = s.counter(
        "tessera_replica_sent_bytes_total",
        "Bytes of blocks the replica lacked, sent (before compression)",
        l,
    );
    let wire = s.counter(
        "tessera_replica_wire_bytes_total",
        "Bytes written to replication connections: frames, fingerprints, compressed data",
        l,
    );
    let rtt = s.float(
        "tessera_replica_rtt_seconds",
        "Smoothed round trip time of the last cycle's connection",
        l,
    );
    let retrans = s.float(
        "tessera_replica_retransmit_ratio",
        "Retransmitted share of the last cycle's TCP segments",
        l,
    );
    let goodput = s.float(
        "tessera_replica_goodput_bytes_per_second",
        "Bytes on the wire per second of the last cycle",
        l,
    );
    let list = d.list_replicas();
    for r in &list.outgoing {
        let v = [r.name.as_str(), r.pool.as_str(), r.vdisk.as_str()];
        lag.with_label_values(&v).set(r.lag_seconds as i64);
        rpo.with_label_values(&v).set(i(r.rpo_secs.unwrap_or(0)));
        syncing.with_label_values(&v).set((r.state == "syncing") as i64);
        cycles.with_label_values(&[v[0], v[1], v[2], "ok"]).inc_by(r.cycles);
        cycles
            .with_label_values(&[v[0], v[1], v[2], "failed"])
            .inc_by(r.failures);
        changed.with_label_values(&v).inc_by(r.changed_bytes);
        sent.with_label_values(&v).inc_by(r.sent_bytes);
        wire.with_label_values(&v).inc_by(r.wire_bytes);
        if let Some(c) = &r.last_cycle {
            rtt.with_label_values(&v).set(c.link.rtt_ms / 1000.0);
            retrans.with_label_values(&v).set(c.link.retransmit_percent / 100.0);
            goodput.with_label_values(&v).set(c.link.goodput);
        }
    }
    if let Some(addr) = *d.replication.listening.lock() {
        s.gauge(
            "tessera_replication_connections",
            "Connections from peer sites held by the replication listener (every stream of every cycle), at most 64",
            &["listen"],
        )
        .with_label_values(&[addr.to_string().as_str()])
        .set(d.replication.connections.load(std::sync::atomic::Ordering::Relaxed) as i64);
    }
    let held = s.gauge(
        "tessera_replica_incoming_age_seconds",
        "Seconds since a replica held here for a peer last completed a cycle",
        &["pool", "vdisk"],
    );
    let t = crate::jobs::unix_now();
    for r in &list.incoming {
        if let Some(at) = r.last_cycle_at {
            held.with_label_values(&[r.pool.as_str(), r.vdisk.as_str()])
                .set(i(t.saturating_sub(at)));
        }
    }
}
