//! `tessera`: the daemon (`tessera serve`) and the command-line client of its management API.

mod bench;
mod client;
mod commands;
mod copy;
mod output;
mod plot;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tessera_server::units::parse_size;
use tessera_volume::{DiskUsage, LayoutKind, Provisioning};

fn parse_layout(s: &str) -> Result<LayoutKind, String> {
    LayoutKind::parse(s).ok_or_else(|| format!("unknown layout '{s}': choose simple, mirror, parity or dual-parity"))
}

fn parse_usage(s: &str) -> Result<DiskUsage, String> {
    DiskUsage::parse(s).ok_or_else(|| format!("unknown disk usage '{s}': choose data or cache"))
}

fn parse_provisioning(s: &str) -> Result<Provisioning, String> {
    Provisioning::parse(s).ok_or_else(|| format!("unknown provisioning '{s}': choose thin or fixed"))
}

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Tessera software SAN: pools, resilient virtual disks, and their daemon"
)]
pub struct Cli {
    /// The daemon's API: unix:/path/api.sock or http://HOST:PORT. Default: the socket in
    /// --state-dir, else /var/lib/tessera/api.sock, else ./tessera-demo/api.sock.
    #[arg(long, env = "TESSERA_API", global = true)]
    pub api: Option<String>,
    /// State directory whose socket to use when --api is not given.
    #[arg(long = "state-dir", env = "TESSERA_STATE_DIR", global = true, value_name = "DIR")]
    pub client_state_dir: Option<PathBuf>,
    /// Bearer token for a TCP API listener.
    #[arg(long, env = "TESSERA_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve(ServeArgs),
    /// Storage pools.
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Disks of a pool.
    #[command(subcommand)]
    Disk(DiskCmd),
    /// Virtual disks.
    #[command(subcommand)]
    Vdisk(VdiskCmd),
    /// Read-only point-in-time snapshots of vdisks (POOL/VDISK@NAME).
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// iSCSI targets and their LUNs.
    #[command(subcommand)]
    Target(TargetCmd),
    /// Measure a target: IOPS, throughput, latency percentiles, CPU; optionally verified.
    Bench(Box<BenchArgs>),
    /// Offloaded copy between LUNs over iSCSI: ODX tokens (POPULATE TOKEN / WRITE USING
    /// TOKEN), EXTENDED COPY, or a host copy through this initiator, to compare.
    Copy(CopyArgs),
    /// NBD exports (nbd://HOST:10809/NAME).
    #[command(subcommand)]
    Nbd(NbdCmd),
    /// Long-running operations.
    #[command(subcommand)]
    Job(JobCmd),
    /// Deduplication: identical blocks of a pool's vdisks stored once.
    #[command(subcommand)]
    Dedup(DedupCmd),
    /// Replication of vdisks to a peer site, and the replicas held here for peers.
    #[command(subcommand)]
    Replica(ReplicaCmd),
    /// What happened: disks failed, pools degraded, repairs, scrub findings, refused logins.
    Events(EventsArgs),
}

/// Where and how a vdisk is replicated.
#[derive(Args)]
pub struct ReplicaArgs {
    /// The source vdisk, POOL/VDISK.
    pub vdisk: String,
    /// The peer's replication listener, HOST:PORT.
    #[arg(long)]
    pub to: String,
    /// The pool on the peer that holds the replica.
    #[arg(long)]
    pub target_pool: String,
    /// The replica's name on the peer (default: the source's name).
    #[arg(long)]
    pub target_vdisk: Option<String>,
    /// This replication's name (default: POOL-VDISK).
    #[arg(long)]
    pub name: Option<String>,
    /// Time between cycles, e.g. 30s, 5m (default 5m; 0: only 'tessera replica sync').
    #[arg(long, value_parser = parse_secs)]
    pub interval: Option<u64>,
    /// Bytes per second the cycles may send, at most, e.g. 50M.
    #[arg(long, value_parser = parse_size)]
    pub bandwidth: Option<u64>,
    /// Recovery point objective: a replica older than this raises an event (default three
    /// intervals; 0: none).
    #[arg(long, value_parser = parse_secs)]
    pub rpo: Option<u64>,
    /// Connections a cycle's data goes over, 1 to 16 (default 1).
    #[arg(long)]
    pub streams: Option<u32>,
}

#[derive(Subcommand)]
pub enum ReplicaCmd {
    /// Replicate POOL/VDISK to a peer's replication listener (its `replication_listen`,
    /// reached with the key of its `replication-psk` file, copied here).
    Create {
        #[command(flatten)]
        replica: ReplicaArgs,
        /// A consistency group: replicas of one pool to one peer whose snapshots are taken at
        /// one instant, on the group's schedule.
        #[arg(long)]
        group: Option<String>,
    },
    /// Replicate back a vdisk promoted from a replica (VDISK is the promoted one): the first
    /// cycle sends only what changed since the last snapshot it received (run 'tessera
    /// replica demote' at the old source first).
    Reverse {
        #[command(flatten)]
        replica: ReplicaArgs,
    },
    /// Replicas of local vdisks, and replicas held here for peers.
    List,
    /// One replica: state, lag, RPO, bytes changed, sent and saved, the last cycle's link
    /// (RTT, retransmissions, goodput). NAME, or POOL/VDISK for a replica held here.
    Show {
        name: String,
    },
    /// Run a cycle now.
    Sync {
        name: String,
        /// Return once the cycle is started.
        #[arg(long)]
        no_wait: bool,
    },
    /// No more cycles until resumed (the cycle under way stops; the next goes on from it).
    Pause {
        name: String,
    },
    Resume {
        name: String,
    },
    /// Change a replica's interval, bandwidth or RPO.
    Set {
        name: String,
        #[arg(long, value_parser = parse_secs)]
        interval: Option<u64>,
        /// 0: no limit.
        #[arg(long, value_parser = parse_size)]
        bandwidth: Option<u64>,
        #[arg(long, value_parser = parse_secs)]
        rpo: Option<u64>,
        #[arg(long)]
        streams: Option<u32>,
    },
    /// Stop replicating; the copy at the peer stays.
    Delete {
        name: String,
    },
    /// Make a replica held here (POOL/VDISK) a writable vdisk at its last consistent snapshot;
    /// name every replica of a consistency group to promote them at the newest snapshot
    /// they all hold.
    Promote {
        #[arg(required = true)]
        vdisks: Vec<String>,
    },
    /// At the old source, after the replica was promoted: the vdisk becomes a replica kept by
    /// the peer's cycles (writes here since the last common snapshot are given up).
    Demote {
        name: String,
    },
}

#[derive(Args)]
pub struct EventsArgs {
    /// After the events already recorded, print new ones as they happen (Ctrl-C ends).
    #[arg(long, short)]
    pub follow: bool,
    /// How many of the newest events to print (at most 10000).
    #[arg(long, short = 'n', default_value_t = 20)]
    pub limit: usize,
    /// Only the events numbered after SEQ (then the oldest of those first).
    #[arg(long, value_name = "SEQ")]
    pub after: Option<u64>,
    /// The least severity printed: info, warning, error or critical.
    #[arg(long)]
    pub severity: Option<String>,
    /// Only the events of this pool.
    #[arg(long)]
    pub pool: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum CopyMethod {
    /// POPULATE TOKEN then WRITE USING TOKEN, as Windows does.
    Odx,
    /// EXTENDED COPY (LID1) block-to-block segments, as VMware does.
    Xcopy,
    /// READ and WRITE through this initiator: every byte crosses the network twice.
    Host,
}

#[derive(Args)]
pub struct CopyArgs {
    /// iscsi://HOST[:PORT]/IQN/LUN
    pub source: String,
    /// First source block.
    pub source_lba: u64,
    /// iscsi://HOST[:PORT]/IQN/LUN (the same target or another)
    pub destination: String,
    pub destination_lba: u64,
    /// Blocks to copy.
    pub count: u64,
    #[arg(long, value_enum, default_value = "odx")]
    pub method: CopyMethod,
    /// Our initiator name.
    #[arg(long)]
    pub initiator: Option<String>,
    #[arg(long)]
    pub chap_user: Option<String>,
    #[arg(long, env = "TESSERA_CHAP_SECRET", hide_env_values = true)]
    pub chap_secret: Option<String>,
}

/// diskspd's options, with its short flags where they do not clash.
#[derive(Args)]
#[command(
    after_help = "Profiles: 4k-read, 4k-90-10, 4k-70-30 (4K random, 32 threads x 16), oltp-8k \
(8K random, 67% read), seq-256k-read, seq-256k-write. Options given with a profile override it."
)]
pub struct BenchArgs {
    /// vdisk:POOL/NAME (in this process; the daemon must not be running on --state-dir),
    /// iscsi://HOST[:PORT]/IQN/LUN, nbd://HOST[:PORT]/EXPORT, or a file or block device.
    pub target: String,
    /// A named workload (see below).
    #[arg(long)]
    pub profile: Option<String>,
    /// Bytes per I/O (default 4K).
    #[arg(short = 'b', long, value_parser = parse_size)]
    pub block_size: Option<u64>,
    /// Threads: each has its own connection to a network target (default 1).
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// I/Os in flight per thread (default 32).
    #[arg(short = 'o', long)]
    pub outstanding: Option<u32>,
    /// Percentage of writes, 0 to 100 (default 0). Writes destroy the target's data.
    #[arg(short = 'w', long, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub write_percent: Option<u8>,
    /// Random offsets (the default).
    #[arg(short = 'r', long, conflicts_with = "sequential")]
    pub random: bool,
    /// Sequential offsets, each thread in its own stretch of the target.
    #[arg(short = 's', long)]
    pub sequential: bool,
    /// Seconds measured per run.
    #[arg(short = 'd', long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of I/O before measuring.
    #[arg(short = 'W', long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Where the I/O region starts.
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub offset: u64,
    /// How long the I/O region is (default: to the end of the target).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Write self-describing blocks and check every read of them; fails on any mismatch.
    #[arg(long)]
    pub verify: bool,
    /// Caching, as diskspd's -S: h (or w, uw, wu) writes through, each write on stable media
    /// before it completes (FUA); u (unbuffered, as every I/O here is) or none writes back.
    /// diskspd's -h is -Sh. Profiles 4k-90-10 and 4k-70-30 write through, as the seeds ran them.
    #[arg(short = 'S', long = "caching", value_name = "MODE", value_parser = parse_caching, num_args = 0..=1, default_missing_value = "u")]
    pub caching: Option<bool>,
    /// Runs (with --until-rsd: at least this many).
    #[arg(long, default_value_t = 1)]
    pub runs: u32,
    /// Repeat until the relative standard deviation of IOPS is at most this percentage.
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
    pub until_rsd: Option<f64>,
    /// With --until-rsd, give up after this many runs.
    #[arg(long, default_value_t = 10)]
    pub max_runs: u32,
    /// Run the same workload on these targets too and compare them with the first.
    #[arg(long, num_args = 1.., value_name = "TARGET")]
    pub compare: Vec<String>,
    /// Draw IOPS and latency bars into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// iSCSI initiator name (default iqn.2026-11.io.tessera:bench).
    #[arg(long)]
    pub initiator: Option<String>,
    /// iSCSI CHAP user.
    #[arg(long, requires = "chap_secret")]
    pub chap_user: Option<String>,
    /// iSCSI CHAP secret.
    #[arg(long, env = "TESSERA_CHAP_SECRET", hide_env_values = true, requires = "chap_user")]
    pub chap_secret: Option<String>,
    /// iSCSI header and data digests (CRC32C).
    #[arg(long)]
    pub digests: bool,
    /// No progress line.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// diskspd's -S modes: whether writes go through (true) or may be cached (false).
fn parse_caching(s: &str) -> Result<bool, String> {
    match s {
        "h" | "w" | "uw" | "wu" => Ok(true),
        "u" | "" => Ok(false),
        "b" | "r" | "m" => Err(format!(
            "-S{s}: buffered, random-access and sequential hints of the Windows cache have no meaning here (every I/O is unbuffered); use -Sh or -Su"
        )),
        _ if s.contains('/') || s.contains(':') => Err(format!(
            "'{s}' is not a caching mode: it looks like the target, taken as -S's value; write the mode right after -S (-Sh, -Su)"
        )),
        _ => Err(format!("-S{s}: the modes are h (write through), w, uw and u")),
    }
}

fn parse_secs(s: &str) -> Result<u64, String> {
    tessera_server::units::parse_duration(s).map(|d| d.as_secs())
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DedupModeArg {
    /// As fast as the disks allow.
    Throughput,
    /// Held to the pool's background rate, leaving the disks to the vdisks.
    Background,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum CompressionArg {
    /// zstd level 1: the most space saved.
    Zstd,
    /// lz4: faster to read back, less saved.
    Lz4,
    /// lz4, or zstd where lz4 saves less than half the grain and zstd a sixteenth more: most
    /// of zstd's savings, about half the grains read back at lz4's speed.
    Balanced,
    /// Grains are shared only, never compressed.
    Off,
}

#[derive(Subcommand)]
pub enum DedupCmd {
    /// Turn deduplication on for a pool: every vdisk, or those named (thin vdisks only; new
    /// vdisks in scope get 4 KiB grains). Sets the scope to exactly what is given.
    Enable {
        pool: String,
        /// A vdisk in scope (repeat for more); none: every vdisk of the pool.
        #[arg(long = "vdisk")]
        vdisks: Vec<String>,
        /// A vdisk left out (repeat for more).
        #[arg(long)]
        exclude: Vec<String>,
        /// Optimize only regions not written for this long (default 1h), e.g. 0, 30m, 3d.
        #[arg(long, value_parser = parse_secs)]
        min_age: Option<u64>,
        /// Time between scheduled background runs (default 1h; 0: none).
        #[arg(long, value_parser = parse_secs)]
        schedule: Option<u64>,
        /// Read rate of background runs, e.g. 64M (per second).
        #[arg(long, value_parser = parse_size)]
        background_rate: Option<u64>,
        /// How grains with no duplicate are compressed (default balanced; only where it saves
        /// an eighth of the grain or more).
        #[arg(long, value_enum)]
        compression: Option<CompressionArg>,
        /// Keep a second copy of any block that more than N blocks share, on layouts with no
        /// redundancy (default 100; 0: none).
        #[arg(long, value_name = "N")]
        hot_copy_refs: Option<u32>,
    },
    /// Turn deduplication off: no more runs; what is shared stays shared.
    Disable { pool: String },
    /// Optimize now: fingerprint the vdisks in scope and share identical blocks.
    Run {
        pool: String,
        #[arg(long, value_enum, default_value = "throughput")]
        mode: DedupModeArg,
        /// Read rate, at most, e.g. 100M (per second).
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
        /// Optimize every region, however recently written.
        #[arg(long)]
        all: bool,
        /// Return once the job is started.
        #[arg(long)]
        no_wait: bool,
    },
    /// Drop fingerprints of data that is gone and give empty slab sets back to the pool.
    Gc {
        pool: String,
        /// Return once the job is started.
        #[arg(long)]
        no_wait: bool,
    },
    /// Savings: logical, physical and saved bytes, per pool and per vdisk, and the index.
    Status { pool: String },
}

fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("'{s}' is not a percentage"))?;
    if !(v > 0.0 && v <= 100.0) {
        return Err(format!("'{s}': a percentage above 0 and at most 100"));
    }
    Ok(v)
}

#[derive(Subcommand)]
pub enum NbdCmd {
    /// Export a vdisk over NBD.
    Export {
        /// POOL/NAME
        vdisk: String,
        /// The name clients connect to (default: the vdisk's name).
        #[arg(long)]
        name: Option<String>,
        /// Refuse writes, trims and zeroing.
        #[arg(long)]
        read_only: bool,
    },
    List,
    Show {
        name: String,
    },
    /// Stop exporting; connections already open finish their work.
    Remove {
        name: String,
    },
}

#[derive(Subcommand)]
pub enum TargetCmd {
    /// Create an iSCSI target, e.g. iqn.2026-11.com.example:storage. It admits only the
    /// initiators of its ACL ('tessera target acl add'), none at first.
    Create {
        iqn: String,
        /// Admit any initiator that can reach a portal (with CHAP if set): for a lab or a
        /// demo on loopback, as LIO's demo mode.
        #[arg(long)]
        allow_any_initiator: bool,
    },
    List,
    Show {
        iqn: String,
    },
    /// Delete a target; its sessions end when they log out.
    Delete {
        iqn: String,
    },
    /// LUNs of a target.
    #[command(subcommand)]
    Lun(LunCmd),
    /// Which initiators may log in (an empty ACL lets none in, unless any is allowed).
    #[command(subcommand)]
    Acl(AclCmd),
    /// CHAP authentication, one-way or mutual.
    #[command(subcommand)]
    Chap(ChapCmd),
    /// The addresses the iSCSI service listens on; every target is reachable through each.
    #[command(subcommand)]
    Portal(PortalCmd),
}

#[derive(Subcommand)]
pub enum PortalCmd {
    /// Listen on one more address, e.g. a second storage network for MPIO; kept across
    /// restarts. IP[:PORT], port 3260 by default; 0.0.0.0 or [::] for every address.
    Add { address: String },
    /// The configured portal (iscsi_listen) and those added, with their socket buffers.
    List,
    /// Stop listening on an added portal; sessions that came through it go on until they log
    /// out.
    Remove { address: String },
}

#[derive(Subcommand)]
pub enum AclCmd {
    /// Allow an initiator; once the ACL is not empty, every other initiator is refused and
    /// does not see the target in discovery.
    Add { iqn: String, initiator: String },
    /// Remove an initiator from the ACL.
    Remove { iqn: String, initiator: String },
    /// Admit any initiator, the ACL notwithstanding (LIO's demo mode); --off admits only
    /// the ACL's initiators again.
    AllowAny {
        iqn: String,
        #[arg(long)]
        off: bool,
    },
}

#[derive(Subcommand)]
pub enum ChapCmd {
    /// Require CHAP for logins to the target. Secrets are 12 to 255 characters; prefer the
    /// environment variables to flags, which other users can see in the process list. With
    /// --initiator, the credentials that initiator alone logs in with, in place of the
    /// target's: hosts that share one secret can each log in under the other's name.
    Set {
        iqn: String,
        /// The initiator (iSCSI name) these credentials are for; the target's when absent.
        #[arg(long)]
        initiator: Option<String>,
        /// The user name initiators log in with.
        #[arg(long)]
        user: String,
        /// The initiator's secret.
        #[arg(long, env = "TESSERA_CHAP_SECRET", hide_env_values = true)]
        secret: String,
        /// For mutual CHAP: the name the target answers with.
        #[arg(long, requires = "mutual_secret")]
        mutual_user: Option<String>,
        /// For mutual CHAP: the target's secret (different from the initiator's).
        #[arg(
            long,
            env = "TESSERA_CHAP_MUTUAL_SECRET",
            hide_env_values = true,
            requires = "mutual_user"
        )]
        mutual_secret: Option<String>,
    },
    /// Stop requiring CHAP; with --initiator, that initiator logs in with the target's
    /// credentials again (or none).
    Clear {
        iqn: String,
        #[arg(long)]
        initiator: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum LunCmd {
    /// Present a vdisk as a LUN.
    Add {
        iqn: String,
        /// POOL/NAME
        vdisk: String,
        /// LUN number (default: the lowest free).
        #[arg(long)]
        lun: Option<u64>,
    },
    /// Stop presenting a LUN.
    Remove { iqn: String, lun: u64 },
}

#[derive(Args)]
pub struct ServeArgs {
    /// Configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Management API TCP address; "none" for the unix socket only. Default 127.0.0.1:8484.
    #[arg(long, value_name = "ADDR")]
    pub api_listen: Option<String>,
    /// iSCSI portal address; "none" to disable. Default 127.0.0.1:3260.
    #[arg(long, value_name = "ADDR")]
    pub iscsi_listen: Option<String>,
    /// NBD server address; "none" to disable. Default 127.0.0.1:10809. It requires TLS
    /// (nbds://) unless --nbd-insecure is given; <state dir>/nbd.sock serves local clients.
    #[arg(long, value_name = "ADDR")]
    pub nbd_listen: Option<String>,
    /// Serve plain NBD (no TLS) on --nbd-listen: anyone who can reach it reads and writes
    /// every export. For a trusted network or loopback only.
    #[arg(long)]
    pub nbd_insecure: bool,
    /// Bearer token required on the TCP listener (at least 16 characters).
    #[arg(long, env = "TESSERA_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// Serve the embedded demo: 4 file disks, pool "demo", vdisk "demo/vol1". State dir
    /// defaults to ./tessera-demo.
    #[arg(long)]
    pub demo: bool,
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormatArg>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

/// Where a pool on Ceph RADOS lives (the daemon must be a gateway: `[gateway]` in its
/// configuration).
#[derive(clap::Args, Debug, Clone)]
pub struct RadosArgs {
    /// The RADOS pool that holds the pool's objects; its redundancy is the pool's.
    #[arg(long, value_name = "RADOS_POOL", requires = "name")]
    pub rados: Option<String>,
    /// The cluster's configuration file, as the daemon sees it (default /etc/ceph/ceph.conf).
    #[arg(long, value_name = "FILE", requires = "rados")]
    pub ceph_conf: Option<PathBuf>,
    /// The Ceph client the daemon connects as, without "client." (default admin).
    #[arg(long, value_name = "NAME", requires = "rados")]
    pub client_name: Option<String>,
}

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create a pool on blank disks (files or block devices), or wholly in a Ceph cluster
    /// (--rados).
    Create {
        name: String,
        /// A member disk; repeat for each.
        #[arg(long = "disk", value_name = "PATH", required_unless_present = "rados")]
        disks: Vec<PathBuf>,
        /// A disk for the write-back cache log (fast: SSD or NVMe); repeat for a second copy.
        #[arg(long = "cache-disk", value_name = "PATH")]
        cache_disks: Vec<PathBuf>,
        /// Allocation unit on each disk (default 256M).
        #[arg(long, value_parser = parse_size)]
        slab_size: Option<u64>,
        #[command(flatten)]
        rados: RadosArgs,
        /// The most a pool on RADOS may hold, e.g. 10T (thin: nothing is used until written).
        #[arg(long, value_parser = parse_size, requires = "rados")]
        capacity: Option<u64>,
    },
    /// List the pools.
    List,
    /// A pool's health, capacity, disks and vdisks.
    Show { name: String },
    /// Destroy an empty pool: wipes its disks' labels and its metadata.
    Destroy {
        name: String,
        /// For a pool on RADOS listed as `destroying` whose destruction could not be finished
        /// (a stop or the cluster cut it short): abandon it instead, leaving what is left of
        /// the pool in the cluster as it is (`pool import` lists it).
        #[arg(long)]
        abandon: bool,
    },
    /// Import a pool of the state directory, or one on RADOS that another gateway made
    /// (--rados); without NAME, list those that can be imported. An imported pool whose
    /// metadata store failed a change is opened again from its records.
    Import {
        name: Option<String>,
        #[command(flatten)]
        rados: RadosArgs,
        /// Import the pool although none of its write-back cache disks is found, giving them
        /// up: the writes their log held and had not destaged are lost. For cache disks that
        /// are gone for good (without it, such an import is refused and loses nothing).
        #[arg(long, requires = "name")]
        without_log: bool,
    },
    /// Flush a pool and stop serving it; 'pool import' brings it back.
    Export { name: String },
    /// Move a pool on Ceph RADOS to another gateway, one that presents LUNs of it or exports
    /// its vdisks over NBD: its owner hands it over (hosts follow through ALUA), and that
    /// gateway serves it.
    Move {
        name: String,
        /// The gateway to serve the pool (its [gateway] name).
        #[arg(long)]
        to: String,
        /// Seconds to wait for the move to be done.
        #[arg(long, default_value_t = 60, conflicts_with = "no_wait")]
        wait: u64,
        /// Return once the move is asked for.
        #[arg(long)]
        no_wait: bool,
    },
    /// Rebuild every slab on a failed, missing or retired disk onto the other disks.
    Repair {
        name: String,
        /// Slab sets rebuilt at the same time.
        #[arg(long)]
        parallel: Option<usize>,
        /// Maximum rebuild rate per second, e.g. 200M.
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
        /// Return once the job is started.
        #[arg(long)]
        no_wait: bool,
    },
    /// Check the pool's metadata: every grain mapping and reference count.
    Check { name: String },
    /// Read every block of every copy, check it against its checksum and the redundancy, and
    /// repair what fails from the good copies. Goes on with a paused scrub where it stopped.
    Scrub {
        name: String,
        /// Maximum read rate per second, e.g. 200M.
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
        /// Pause the scrub under way; it keeps its position for the next 'pool scrub'.
        #[arg(long, conflicts_with_all = ["rate", "no_wait"])]
        pause: bool,
        /// Return once the job is started.
        #[arg(long)]
        no_wait: bool,
    },
    /// Scan the pool's metadata while its vdisks keep serving: every grain mapping, reference
    /// count, slab set and journal record. Lists what it finds with the exact repair of each.
    Scan {
        name: String,
        /// Return once the job is started.
        #[arg(long, conflicts_with = "last")]
        no_wait: bool,
        /// Show the last scan's findings without scanning again.
        #[arg(long)]
        last: bool,
        /// List findings from this id on.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Findings listed, at most.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Apply the repairs of the last scan's findings, each checked again first, while the
    /// vdisks stay online: time follows the findings, not the pool's size.
    Spotfix {
        name: String,
        /// Return once the job is started.
        #[arg(long)]
        no_wait: bool,
    },
    /// Whether the daemon repairs the pool by itself when a disk fails, or stays missing past
    /// auto_repair_delay (on by default).
    AutoRepair {
        name: String,
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
}

#[derive(Subcommand)]
pub enum DiskCmd {
    /// List a pool's disks.
    List { pool: String },
    /// Add a blank disk to a pool.
    Add {
        pool: String,
        path: PathBuf,
        /// Keep it as a hot spare: empty until a repair needs it, then an ordinary member.
        #[arg(long)]
        spare: bool,
        /// data (default) or cache: a fast disk for the write-back cache log.
        #[arg(long, value_parser = parse_usage, default_value = "data")]
        usage: DiskUsage,
    },
    /// Retire a disk: no new data on it; a repair moves its data away.
    Retire { pool: String, disk: String },
    /// Fail a disk, as a drill, or give up one an I/O error failed: it is never used again.
    Fail { pool: String, disk: String },
    /// Take back a disk missing since the pool was imported, or failed by an I/O error, now
    /// reachable again where the pool recorded it: only what was written around it (or, after
    /// an error, to it since its last flush) is resynced.
    Online { pool: String, disk: String },
}

#[derive(Args, Default, Clone)]
pub struct LayoutArgs {
    /// simple, mirror, parity or dual-parity (default: mirror on 2+ disks).
    #[arg(long, value_parser = parse_layout)]
    pub layout: Option<LayoutKind>,
    /// Mirror copies: 2 or 3.
    #[arg(long)]
    pub copies: Option<u8>,
    /// Disks one stripe spans (default: from the pool, at most 8).
    #[arg(long)]
    pub columns: Option<u32>,
    /// Bytes per column per stripe (default 256K).
    #[arg(long, value_parser = parse_size)]
    pub interleave: Option<u64>,
    /// thin (default) or fixed.
    #[arg(long, value_parser = parse_provisioning)]
    pub provisioning: Option<Provisioning>,
    /// Allocation unit of the vdisk (default 64K).
    #[arg(long, value_parser = parse_size)]
    pub grain: Option<u64>,
    /// Logical block size: 512 (default) or 4096.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Physical block size initiators are told of: 4096 (default; 512-byte logical blocks are
    /// then "512e") or 512 ("512n", for hosts that want it).
    #[arg(long)]
    pub physical_block_size: Option<u32>,
    /// How much of the pool's write-back cache the vdisk may fill (default 1G; 0: none).
    #[arg(long, value_parser = parse_size)]
    pub write_cache_size: Option<u64>,
}

#[derive(Subcommand)]
pub enum VdiskCmd {
    /// Create a virtual disk.
    Create {
        /// POOL/NAME
        vdisk: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
        #[command(flatten)]
        layout: LayoutArgs,
    },
    /// List vdisks, of one pool or of all.
    List {
        pool: Option<String>,
    },
    Show {
        vdisk: String,
    },
    /// A thin copy-on-write clone of a vdisk or snapshot in the same pool: it shares every
    /// grain, so it takes no space until either side is written.
    Clone {
        /// POOL/NAME of the source vdisk, or POOL/VDISK@SNAPSHOT
        source: String,
        /// The clone's name (same pool)
        name: String,
    },
    /// Grow a vdisk.
    Resize {
        vdisk: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
    },
    /// Set how much of the pool's write-back cache a vdisk may fill (0 turns it off).
    WriteCache {
        vdisk: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
    },
    /// Delete a vdisk and free its space.
    Delete {
        vdisk: String,
    },
    /// Copy a raw image into a vdisk (created with the layout options if it does not exist).
    Import {
        vdisk: String,
        image: PathBuf,
        /// Size of a vdisk created by the import (default: the image's size).
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        #[command(flatten)]
        layout: LayoutArgs,
        #[arg(long)]
        no_wait: bool,
    },
    /// Write a vdisk to a sparse raw image.
    Export {
        vdisk: String,
        image: PathBuf,
        /// Replace IMAGE if it exists.
        #[arg(long)]
        overwrite: bool,
        /// Maximum read rate of the vdisk's data per second, e.g. 200M.
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
        #[arg(long)]
        no_wait: bool,
    },
}

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Take a snapshot: it shares every grain with the vdisk, so it is made in well under a
    /// second and takes space only as the vdisk is written.
    Create {
        /// POOL/VDISK@NAME
        snapshot: String,
    },
    /// List snapshots: of one vdisk (POOL/VDISK), of a pool (POOL), or of all.
    List { of: Option<String> },
    Show {
        /// POOL/VDISK@NAME
        snapshot: String,
    },
    /// Delete a snapshot; the grains only it held are freed.
    Delete {
        /// POOL/VDISK@NAME
        snapshot: String,
    },
}

#[derive(Subcommand)]
pub enum JobCmd {
    /// Running and recently finished jobs.
    List,
    Show {
        id: u64,
    },
    /// Follow a job to its end with a progress bar.
    Wait {
        id: u64,
    },
    /// Ask a job to stop.
    Cancel {
        id: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        // A client command writes to a pipe the reader may close (`tessera pool show | head`):
        // end quietly there as Unix tools do, instead of failing on EPIPE with a panic. The
        // daemon keeps SIGPIPE ignored, and its sockets report EPIPE as errors.
        // SAFETY: no other thread exists yet; SIG_DFL is a valid disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
