//! The request and response bodies of the management API: the daemon serves them, the CLI
//! deserializes them, and the OpenAPI document (api/openapi.rs) is generated from them, so the
//! three cannot disagree. Doc comments here are the document's descriptions; `#[schemars]`
//! attributes carry the limits the daemon enforces.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tessera_pool::{Capacity, DiskState, DiskStatus, DiskUsage};
use tessera_volume::{LayoutKind, LayoutSpec, Provisioning};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePool {
    pub name: String,
    /// Absolute paths of the member disks (files or block devices), as the daemon sees them;
    /// none for a pool on Ceph RADOS.
    #[serde(default)]
    pub disks: Vec<String>,
    pub slab_size: Option<u64>,
    /// Absolute paths of disks that hold the write-back cache log (two, so that losing one
    /// loses nothing).
    #[serde(default)]
    pub cache_disks: Vec<String>,
    /// A pool wholly in a Ceph cluster instead of on disks: its data and metadata in objects
    /// of this RADOS pool, its redundancy the RADOS pool's. Needs the daemon to be a gateway
    /// (`[gateway]` in its configuration) and a build with the `rados` feature.
    #[serde(default)]
    pub rados: Option<RadosPlacement>,
    /// Bytes a pool on RADOS may hold (thin: nothing is used in the cluster until written).
    pub capacity: Option<u64>,
}

/// Where a pool on Ceph RADOS lives, and how this daemon reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RadosPlacement {
    /// The RADOS pool (replicated or erasure-coded) holding the objects.
    pub pool: String,
    /// The cluster's configuration file as the daemon sees it (default /etc/ceph/ceph.conf).
    pub ceph_conf: Option<String>,
    /// The Ceph client the daemon connects as, without "client." (default "admin").
    pub client_name: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportPool {
    pub name: String,
    /// A pool on Ceph RADOS that another gateway created: where it lives. This gateway
    /// serves it once it owns it (at once if nobody does, else when its owner goes away).
    #[serde(default)]
    pub rados: Option<RadosPlacement>,
    /// Import the pool although none of its write-back cache disks is found, giving them up
    /// for good: the writes their log held and had not destaged are lost (reads of them fail
    /// until they are written again). Without it such an import is refused, and loses
    /// nothing; for cache disks that are gone for good.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub without_log: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RepairPool {
    /// Slab sets rebuilt at the same time (default 4).
    #[schemars(range(min = 1, max = 64))]
    pub parallel: Option<usize>,
    /// Bytes per second written to replacement slabs; absent for no limit.
    #[schemars(range(min = 1))]
    pub rate_limit: Option<u64>,
}

/// Move a pool on Ceph RADOS to another gateway.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MovePool {
    /// The gateway to serve the pool: one that presents LUNs of it.
    pub to: String,
}

/// Start a scrub of a pool, or go on with the one paused.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScrubPool {
    /// Bytes per second read from the disks; absent for no limit.
    #[schemars(range(min = 1))]
    pub rate_limit: Option<u64>,
}

/// Where a pool's scrubs stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScrubRunState {
    /// No pass under way.
    #[default]
    Idle,
    Running,
    /// A pass stopped part way by the administrator: `tessera pool scrub` goes on with it.
    Paused,
    /// A pass stopped part way by a restart or an error: the daemon goes on with it.
    Interrupted,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct ScrubView {
    pub state: ScrubRunState,
    /// The scrub job running now.
    pub job: Option<u64>,
    /// Whether the pool keeps a checksum of every block (without, a scrub can only see that
    /// copies disagree, not which one is right).
    pub checksums: bool,
    /// The pass under way (running, paused or interrupted).
    pub current: Option<ScrubPassView>,
    /// The last pass that went to the end.
    pub last: Option<ScrubPassView>,
    /// When the next scheduled scrub starts (seconds since the Unix epoch); absent when none
    /// is scheduled.
    pub next_due: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct ScrubPassView {
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    pub finished_at: Option<u64>,
    /// 4 KiB member blocks read and checked.
    pub blocks_checked: u64,
    /// Blocks rewritten with good data from another copy or from parity.
    pub repaired: u64,
    /// Blocks that failed with no good copy left: reads of them fail with MEDIUM ERROR.
    pub unrecoverable: u64,
    pub per_disk: Vec<DiskBlocks>,
    /// Second copies of hot blocks (on layouts with no redundancy) checked at the start of
    /// the pass, rewritten from the other copy, and with neither copy readable.
    #[serde(default)]
    pub hot_copies_checked: u64,
    #[serde(default)]
    pub hot_copies_repaired: u64,
    #[serde(default)]
    pub hot_copies_lost: u64,
    /// Rows left wrong, one line each (the first thousand).
    pub problems: Vec<String>,
}

/// What a scrub did on one disk.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct DiskBlocks {
    /// The disk's position in the pool.
    pub disk: u32,
    pub repaired: u64,
    pub unrecoverable: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddDisk {
    pub path: String,
    /// A hot spare: kept empty until a repair needs it (default: an ordinary member).
    #[serde(default)]
    pub spare: bool,
    /// data (the default) or cache: a disk for the write-back cache log, which takes no slab.
    #[serde(default)]
    pub usage: DiskUsage,
}

/// How a pool stands, worst first (and, last, a pool on its way out): what `pool list` shows
/// and a monitor alerts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PoolHealth {
    /// The pool could not be imported (see `problem`).
    Unavailable,
    /// Some slab sets lost more disks than their layout tolerates: some data is unreadable.
    Failed,
    /// Redundancy is reduced, or data waits to move off a disk out of service.
    Degraded,
    Healthy,
    /// A pool on RADOS being destroyed here, no longer served: its destruction goes on, or
    /// was cut short and is finished in the background (see `problem`). Its name is refused
    /// until it ends.
    Destroying,
}

impl std::fmt::Display for PoolHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PoolHealth::Unavailable => "unavailable",
            PoolHealth::Destroying => "destroying",
            PoolHealth::Failed => "failed",
            PoolHealth::Degraded => "degraded",
            PoolHealth::Healthy => "healthy",
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PoolSummary {
    pub name: String,
    pub id: String,
    pub health: PoolHealth,
    pub problem: Option<String>,
    pub disks: usize,
    pub healthy_disks: usize,
    pub capacity: Option<Capacity>,
    pub slab_size: u64,
    pub vdisks: usize,
    /// Bytes a repair would rebuild or move.
    pub repair_needed_bytes: u64,
    /// Bytes of vdisks' data lost beyond repair on the pool's disks (rotten on their disk and
    /// on the parity where a write or a repair had to read them): reads of them fail until
    /// they are written again.
    #[serde(default)]
    pub lost_bytes: u64,
    pub jobs_running: Vec<u64>,
    /// What needs the administrator's eye without being a fault: space past the thin
    /// provisioning threshold, say.
    #[serde(default)]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub auto_repair: AutoRepairView,
    pub scrub: ScrubView,
    /// The last metadata scan (and spot-fix), if the pool was ever scanned.
    #[serde(default)]
    pub scan: Option<tessera_volume::ScanReport>,
    /// When the next scheduled scan starts (seconds since the Unix epoch); absent when none
    /// is scheduled (`scan_interval = "off"`).
    #[serde(default)]
    pub scan_next_due: Option<u64>,
    /// The write-back cache, when the pool has cache disks.
    #[serde(default)]
    pub cache: Option<tessera_volume::CacheStatus>,
    /// For a pool on Ceph RADOS: where, and which gateway owns it.
    #[serde(default)]
    pub rados: Option<RadosPoolView>,
}

/// A pool on Ceph RADOS as one gateway sees it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RadosPoolView {
    /// The RADOS pool holding its objects.
    pub rados_pool: String,
    /// The gateway that owns (serves) it, if any is known, as shown (an earlier run of this
    /// gateway says so).
    pub owner: Option<String>,
    /// That gateway's name among the gateways.
    #[serde(skip)]
    pub owner_name: Option<String>,
    /// The owner's epoch: every write is guarded by it, so a replaced owner writes nothing.
    pub epoch: Option<i64>,
    /// Whether this daemon is the owner.
    pub here: bool,
    /// This gateway's client address in the cluster while it owns the pool (what a gateway
    /// that takes the pool over blocklists; `ceph osd blocklist ls` lists it then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Times this gateway took the pool and served it, since the daemon started.
    #[serde(default)]
    pub takeovers: u64,
    /// Attempts to take or open the pool that failed here since the daemon started (the
    /// cluster refused to fence the previous owner, say), each followed by a longer wait.
    #[serde(default)]
    pub failed_takes: u64,
}

impl RadosPoolView {
    /// A pool in `rados_pool` that no gateway is known to own, with the epoch it was last
    /// owned under, if known.
    pub fn unowned(rados_pool: String, epoch: Option<i64>) -> Self {
        RadosPoolView {
            rados_pool,
            owner: None,
            owner_name: None,
            epoch,
            here: false,
            client: None,
            takeovers: 0,
            failed_takes: 0,
        }
    }
}

/// The last metadata scan of a pool: its report and a page of its findings.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ScanResult {
    /// The scan or spot-fix job running now, if any.
    pub job: Option<u64>,
    /// When the next scheduled scan starts (seconds since the Unix epoch); absent when none
    /// is scheduled (`scan_interval = "off"`).
    pub next_due: Option<u64>,
    pub report: Option<tessera_volume::ScanReport>,
    pub findings: Vec<tessera_volume::FindingView>,
    /// Pass as `after` for the next page; absent on the last one.
    pub next_after: Option<u64>,
}

/// Whether the daemon repairs a pool by itself when a disk fails or stays missing, and what it
/// waits for before it does.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct AutoRepairView {
    pub enabled: bool,
    /// e.g. "disk /dev/sdc is missing; repair starts by itself in 4 min unless it comes back".
    pub status: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetAutoRepair {
    pub enabled: bool,
}

/// A slab set that is not healthy.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SetHealthView {
    pub id: u32,
    pub layout: String,
    pub state: String,
    pub unavailable: usize,
    /// Members it may lose; for a striped mirror, in each column (`per_column`).
    pub tolerance: usize,
    #[serde(default)]
    pub per_column: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PoolDetail {
    #[serde(flatten)]
    pub summary: PoolSummary,
    pub disk_list: Vec<DiskView>,
    pub vdisk_list: Vec<VdiskView>,
    /// Slab sets that are not healthy.
    pub unhealthy_sets: Vec<SetHealthView>,
    pub stats: IoStatsView,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct IoStatsView {
    pub read_errors: u64,
    pub write_errors: u64,
    pub reconstructed_reads: u64,
    pub repaired_blocks: u64,
    /// 4 KiB blocks read that did not match their checksum (each was read again from
    /// elsewhere and rewritten).
    pub checksum_errors: u64,
}

/// What a disk's reads cost since its pool was imported.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema)]
pub struct DiskErrorsView {
    pub read: u64,
    /// 4 KiB blocks that did not match their checksum.
    pub checksum: u64,
    /// Bytes rewritten on it with good data.
    pub repaired_bytes: u64,
}

/// What a disk has done since its pool was imported (or the disk came back).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema)]
pub struct DiskIoView {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub written_bytes: u64,
    pub flushes: u64,
    /// Reads, writes and flushes the device failed.
    pub errors: u64,
    /// Latencies in microseconds: the mean, and the 99th percentile interpolated within its
    /// histogram bucket. 0 without operations.
    pub read_mean_us: u64,
    pub read_p99_us: u64,
    pub write_mean_us: u64,
    pub write_p99_us: u64,
    pub flush_mean_us: u64,
}

impl DiskIoView {
    pub fn of(io: &tessera_disk::DiskIo) -> DiskIoView {
        use tessera_disk::DiskOp;
        let us = |d: Option<std::time::Duration>| d.map(|d| d.as_micros() as u64).unwrap_or(0);
        let (r, w, f) = (
            io.figures(DiskOp::Read),
            io.figures(DiskOp::Write),
            io.figures(DiskOp::Flush),
        );
        DiskIoView {
            reads: r.ops,
            read_bytes: r.bytes,
            writes: w.ops,
            written_bytes: w.bytes,
            flushes: f.ops,
            errors: r.errors + w.errors + f.errors,
            read_mean_us: us(r.mean()),
            read_p99_us: us(r.quantile(0.99)),
            write_mean_us: us(w.mean()),
            write_p99_us: us(w.quantile(0.99)),
            flush_mean_us: us(f.mean()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Disk")]
pub struct DiskView {
    pub id: String,
    pub position: u32,
    pub path: String,
    pub size: u64,
    pub state: DiskState,
    #[serde(default)]
    pub usage: DiskUsage,
    pub slabs: u32,
    pub slabs_used: u32,
    pub used_bytes: u64,
    pub problem: Option<String>,
    #[serde(default)]
    pub errors: DiskErrorsView,
    /// None while the pool has no device for the disk (failed, missing).
    #[serde(default)]
    pub io: Option<DiskIoView>,
}

impl From<DiskStatus> for DiskView {
    fn from(d: DiskStatus) -> DiskView {
        DiskView {
            id: d.info.id.to_string(),
            position: d.info.position,
            path: d.info.path,
            size: d.info.size,
            state: d.info.state,
            usage: d.info.usage,
            slabs: d.info.slabs,
            slabs_used: d.slabs_used,
            used_bytes: d.used_bytes,
            problem: d.problem,
            errors: DiskErrorsView::default(),
            io: None,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVdisk {
    pub name: String,
    /// Bytes, a multiple of the block size.
    #[schemars(range(min = 1))]
    pub size: u64,
    /// simple, mirror, parity or dual-parity; absent: mirror on two disks or more, else simple.
    pub layout: Option<LayoutKind>,
    /// Copies of a mirror (absent: 2).
    #[schemars(range(min = 2, max = 3))]
    pub copies: Option<u8>,
    pub columns: Option<u32>,
    pub interleave: Option<u64>,
    pub provisioning: Option<Provisioning>,
    pub grain_size: Option<u64>,
    /// The logical block size: 512 (the default) or 4096.
    #[schemars(extend("enum" = [512, 4096, null]))]
    pub block_size: Option<u32>,
    /// 512 or 4096 (the default): the physical block size initiators are told of.
    #[serde(default)]
    #[schemars(extend("enum" = [512, 4096, null]))]
    pub physical_block_size: Option<u32>,
    /// Bytes of the pool's write-back cache the vdisk may fill (absent: 1 GiB; 0: none).
    #[serde(default)]
    pub write_cache_size: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Vdisk")]
pub struct VdiskView {
    pub pool: String,
    pub name: String,
    pub size: u64,
    pub block_size: u32,
    pub physical_block_size: u32,
    pub grain_size: u64,
    pub layout: LayoutSpec,
    /// e.g. "mirror 2-way, 2 columns, 256 KiB interleave".
    pub layout_description: String,
    pub provisioning: Provisioning,
    /// Bytes of grains the vdisk maps (shared grains counted in full).
    pub allocated_bytes: u64,
    /// Of those, bytes no other vdisk or snapshot points at (what deleting it gives back),
    /// and bytes shared with clones, snapshots or copies in flight.
    pub exclusive_bytes: u64,
    pub shared_bytes: u64,
    /// Its share of the grains it points at (a grain `n` vdisks share counts `1/n`), and
    /// what sharing saves it: allocated - physical.
    #[serde(default)]
    pub physical_bytes: u64,
    #[serde(default)]
    pub saved_bytes: u64,
    /// In the scope of the pool's deduplication.
    #[serde(default)]
    pub dedup: bool,
    /// Number of snapshots taken of this vdisk that still exist.
    pub snapshots: usize,
    /// Bytes of the write-back cache it may fill, and bytes it holds there not yet destaged.
    #[serde(default)]
    pub write_cache_size: u64,
    #[serde(default)]
    pub cache_dirty_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// The snapshot's name; the snapshot is then called `VDISK@NAME`.
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Snapshot")]
pub struct SnapshotView {
    pub pool: String,
    /// The vdisk it was taken of (which may have been deleted since).
    pub vdisk: String,
    pub name: String,
    /// `VDISK@NAME`: what clone, NBD export and target LUN commands take.
    pub full_name: String,
    pub size: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
    pub allocated_bytes: u64,
    pub exclusive_bytes: u64,
    pub shared_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloneVdisk {
    /// The new vdisk's name, in the same pool.
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "CloneResult")]
pub struct CloneView {
    pub vdisk: VdiskView,
    /// Bytes that share the source's grains, and bytes copied (a partial last grain).
    pub shared_bytes: u64,
    pub copied_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetWriteCache {
    /// Bytes; 0 turns the vdisk's write-back cache off.
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeVdisk {
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportImage {
    /// Path of a raw image, as the daemon sees it.
    pub path: String,
    /// Create the vdisk from this spec when it does not exist; its size defaults to the
    /// image's, rounded up to the block size.
    pub create: Option<CreateVdisk>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportImage {
    pub path: String,
    /// Replace an existing file.
    #[serde(default)]
    pub overwrite: bool,
    /// Bytes of the vdisk's data read per second, at most (unmapped ranges cost nothing):
    /// an export from a pool in use leaves its disks to the hosts. None: as fast as it goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub rate_limit: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ImportablePool {
    pub name: String,
    pub dir: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Health")]
pub struct HealthView {
    pub version: String,
    pub state_dir: String,
    pub uptime_seconds: f64,
    pub pools: usize,
    pub demo: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTarget {
    /// iqn.YYYY-MM.reversed.domain[:name], eui.<16 hex> or naa.<16|32 hex>.
    pub iqn: String,
    /// Admit any initiator; absent or false: only those of the ACL.
    #[serde(default)]
    pub allow_any_initiator: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AllowAnyInitiator {
    pub allow: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddLun {
    /// LUN number; absent: the lowest free one.
    #[schemars(range(max = 16383))]
    pub lun: Option<u64>,
    /// "pool/vdisk".
    pub vdisk: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct LunView {
    pub lun: u64,
    pub vdisk: String,
    /// False when the LUN is not presented: its vdisk is not available (its pool not
    /// imported), or its saved state (reservations, mode settings) could not be taken.
    pub online: bool,
    pub size: Option<u64>,
    /// Persistent reservations, when an initiator has registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservations: Option<ReservationsView>,
    /// The ALUA state of this daemon's port for the LUN, when gateways present it in turn (a
    /// pool on RADOS): "active/optimized" at the pool's owner, "standby" elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<String>,
}

/// A logical unit's persistent reservations, as an administrator wants to see them (the
/// reservation keys are left out).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ReservationsView {
    /// PRgeneration: bumped by every registration change.
    pub generation: u32,
    /// Registered initiator ports: "name" or "name,i,0x<isid>".
    pub registered: Vec<String>,
    /// Who holds the reservation ("all registrants" for those types), and its type.
    pub holder: Option<String>,
    pub kind: Option<String>,
    /// Whether the state is kept across restarts.
    pub aptpl: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Target")]
pub struct TargetView {
    pub iqn: String,
    pub luns: Vec<LunView>,
    /// Initiators allowed to log in.
    pub acl: Vec<String>,
    /// Any initiator may log in, the ACL notwithstanding.
    pub allow_any_initiator: bool,
    /// CHAP user names; the secrets are never shown.
    pub chap: Option<ChapView>,
    /// The CHAP user names of initiators that log in with credentials of their own.
    #[serde(default)]
    pub initiator_chap: BTreeMap<String, ChapView>,
    /// The sessions logged in to it now.
    #[serde(default)]
    pub sessions: Vec<SessionView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Session")]
pub struct SessionView {
    pub initiator: String,
    /// The target's handle of the session.
    pub tsih: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ChapView {
    pub user: String,
    pub mutual_user: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AclEntry {
    /// The initiator's iSCSI name.
    pub initiator: String,
}

/// CHAP credentials of a target. The mutual pair is what the target answers with when the
/// initiator asks it to prove itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetChap {
    pub user: String,
    #[schemars(length(min = 12, max = 255))]
    pub secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 12, max = 255))]
    pub mutual_secret: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateNbdExport {
    /// "pool/vdisk".
    pub vdisk: String,
    /// The export name clients ask for; absent: the vdisk's name.
    #[schemars(regex(pattern = r"^[A-Za-z0-9._:-]{1,128}$"))]
    pub name: Option<String>,
    #[serde(default)]
    pub read_only: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "NbdExport")]
pub struct NbdExportView {
    pub name: String,
    pub vdisk: String,
    pub read_only: bool,
    /// False when the vdisk is not available (its pool not imported): the export is not offered.
    pub online: bool,
    pub size: Option<u64>,
    /// Clients connected now.
    pub connections: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddPortal {
    /// IP:PORT, [IPv6]:PORT, or a bare IP for port 3260.
    pub address: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Portal")]
pub struct PortalView {
    /// As configured: 0.0.0.0:3260 listens on every IPv4 address.
    pub address: String,
    /// "config" (iscsi_listen, changed in the configuration) or "api" (added, persisted).
    #[schemars(extend("enum" = ["config", "api"]))]
    pub source: String,
    /// The address bound, when listening.
    pub listening_on: Option<String>,
    /// Socket buffer sizes the kernel granted, as it reports them (Linux counts twice what
    /// was asked for, to cover its bookkeeping); None: left to the kernel's autotuning.
    pub send_buffer: Option<u32>,
    pub recv_buffer: Option<u32>,
    /// Set when the kernel granted smaller buffers than configured.
    pub warning: Option<String>,
    /// Why the portal is not listening.
    pub error: Option<String>,
    /// TCP connections open through the portal.
    #[serde(default)]
    pub connections: usize,
}

#[cfg(test)]
mod pool_health_tests {
    use super::PoolHealth;

    #[test]
    fn pool_health_is_written_as_the_api_documents_it() {
        let doc = crate::api::openapi::document();
        let documented = doc["components"]["schemas"]["PoolHealth"].to_string();
        for h in [
            PoolHealth::Unavailable,
            PoolHealth::Destroying,
            PoolHealth::Failed,
            PoolHealth::Degraded,
            PoolHealth::Healthy,
        ] {
            // What the API writes is what the CLI prints.
            let json = serde_json::to_value(h).unwrap();
            assert_eq!(json, serde_json::Value::String(h.to_string()));
            assert!(
                documented.contains(&json.to_string()),
                "{h} is not in the OpenAPI document"
            );
        }
    }
}

pub use tessera_volume::{
    Compression, DedupMode, DedupSettings, DedupStatus, GcReport, PassOptions, PassReport, VdiskSavings,
};

/// `PUT /api/pools/{pool}/dedup`: what to change in the pool's dedup settings; a field left
/// out keeps its value.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetDedup {
    pub enabled: Option<bool>,
    /// The vdisks in scope; an empty list: every vdisk of the pool.
    pub vdisks: Option<Vec<String>>,
    /// Vdisks left out.
    pub exclude: Option<Vec<String>>,
    /// Seconds a region must go unwritten before it is optimized.
    pub min_age_secs: Option<u64>,
    /// Seconds between scheduled background runs; 0: none.
    pub schedule_secs: Option<u64>,
    /// Bytes per second a background run reads.
    pub background_rate: Option<u64>,
    /// How grains with no duplicate are compressed: zstd, lz4, balanced or off.
    pub compression: Option<Compression>,
    /// A slot on a layout with no redundancy that more grains than this share is kept in a
    /// second copy; 0: none (default 100).
    pub hot_copy_refs: Option<u32>,
}

/// `POST /api/replicas`: replicate a vdisk to a peer site.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateReplica {
    /// The source's pool and vdisk.
    pub pool: String,
    pub vdisk: String,
    /// The peer's replication listener, HOST:PORT.
    pub to: String,
    /// The pool on the peer that holds the replica.
    pub target_pool: String,
    /// The replica vdisk's name on the peer (default: the source's name).
    pub target_vdisk: Option<String>,
    /// The replication's name (default: POOL-VDISK).
    pub name: Option<String>,
    /// Seconds between cycles (default 300); 0: only when asked (`replica sync`).
    pub interval_secs: Option<u64>,
    /// Bytes per second the cycles may send, at most; none: as fast as the link goes.
    pub bandwidth: Option<u64>,
    /// The recovery point objective in seconds: a lag beyond it raises an event (default
    /// three intervals; 0: no objective).
    pub rpo_secs: Option<u64>,
    /// Connections a cycle's data goes over, 1 to 16 (default 1): several keep more of a
    /// lossy link, each with its own congestion window.
    #[schemars(range(min = 1, max = 16))]
    pub streams: Option<u32>,
    /// Replicate back a vdisk promoted from a replica: the first cycle sends only what
    /// changed since the last snapshot it received, which the old source still holds.
    #[serde(default)]
    pub reverse: bool,
    /// A consistency group: replicas of one pool to one peer whose snapshots are taken at
    /// one instant (a database's log and data vdisks), on one schedule.
    pub group: Option<String>,
}

/// `PUT /api/replicas/{name}`: what to change; a field left out keeps its value.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetReplica {
    pub paused: Option<bool>,
    pub interval_secs: Option<u64>,
    /// 0: no limit.
    pub bandwidth: Option<u64>,
    pub rpo_secs: Option<u64>,
    #[schemars(range(min = 1, max = 16))]
    pub streams: Option<u32>,
}

/// What the kernel said of a cycle's connection at its end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LinkView {
    /// Smoothed round trip time.
    pub rtt_ms: f64,
    /// TCP segments sent again, and sent in all.
    pub retransmits: u64,
    pub segments_out: u64,
    /// Retransmitted share of the segments, in percent.
    pub retransmit_percent: f64,
    /// Bytes on the wire per second of the cycle, one stream.
    pub goodput: f64,
    /// The kernel's delivery rate estimate, bytes per second.
    pub delivery_rate: u64,
}

/// One cycle, as the source saw it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct ReplicaCycleView {
    pub snapshot: String,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    pub seconds: f64,
    /// True when everything was offered (a first cycle, or the replica lacked the base).
    pub full: bool,
    /// Bytes of the grains that changed since the base (all allocated data, for a full cycle).
    pub changed_bytes: u64,
    /// Bytes of the blocks the replica lacked, sent before compression.
    pub sent_bytes: u64,
    /// Bytes written to the connection: frames, fingerprints, compressed data.
    pub wire_bytes: u64,
    /// The cycle's link: the control stream's round trip, every stream's segments, the
    /// cycle's bytes over its time.
    pub link: LinkView,
    /// Each stream's own report, when the cycle used several (goodput: bytes it delivered
    /// over the cycle's time).
    #[serde(default)]
    pub streams: Vec<LinkView>,
}

/// A replication of a local vdisk to a peer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct ReplicaView {
    pub name: String,
    pub pool: String,
    pub vdisk: String,
    pub to: String,
    pub target_pool: String,
    pub target_vdisk: String,
    pub group: Option<String>,
    /// syncing, idle, paused, failing, or new (no cycle done yet).
    pub state: String,
    pub interval_secs: u64,
    pub streams: u32,
    pub bandwidth: Option<u64>,
    pub rpo_secs: Option<u64>,
    /// The last snapshot both sites hold: the replica's last consistent point.
    pub last_snapshot: Option<String>,
    /// When that snapshot was taken on the source (seconds since the Unix epoch).
    pub last_consistent_at: Option<u64>,
    /// Age of the replica's last consistent point; since creation while there is none.
    pub lag_seconds: f64,
    pub rpo_exceeded: bool,
    /// A snapshot taken for a cycle that has not ended yet: the next attempt goes on with it.
    pub pending_snapshot: Option<String>,
    pub cycles: u64,
    pub failures: u64,
    /// Totals over all cycles.
    pub changed_bytes: u64,
    pub sent_bytes: u64,
    pub wire_bytes: u64,
    /// Changed bytes that did not cross the wire: blocks the replica had, and compression.
    pub saved_bytes: u64,
    pub last_cycle: Option<ReplicaCycleView>,
    pub last_error: Option<String>,
    pub last_error_at: Option<u64>,
    /// The job of the cycle under way.
    pub job: Option<u64>,
}

/// A replica this site holds for a peer: read-only until promoted.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct IncomingReplicaView {
    pub pool: String,
    pub vdisk: String,
    /// The address the peer last replicated from.
    pub source: String,
    pub created_at: u64,
    /// The newest consistent snapshot, and when its cycle ended here.
    pub last_snapshot: Option<String>,
    pub last_cycle_at: Option<u64>,
    pub cycles: u64,
    /// A cycle is being received now.
    pub receiving: bool,
    /// Its consistent snapshots, oldest first.
    pub snapshots: Vec<String>,
}

/// `GET /api/replicas`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct ReplicaList {
    /// Local vdisks replicated to peers.
    pub outgoing: Vec<ReplicaView>,
    /// Replicas held here for peers.
    pub incoming: Vec<IncomingReplicaView>,
    /// Where peers' replication streams are taken, if anywhere.
    pub listen: Option<String>,
}

/// The answer to a promotion.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct PromotedView {
    pub pool: String,
    pub vdisk: String,
    /// The snapshot the vdisk was put back to: the last consistent point.
    pub snapshot: String,
}

/// `POST /api/replica-promotions`: replicas of one consistency group, held in one pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromoteReplicas {
    pub pool: String,
    #[schemars(length(min = 1))]
    pub vdisks: Vec<String>,
}
