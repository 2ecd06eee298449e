//! Tessera virtual disks: the grain map, thin and fixed provisioning, reference-counted grains
//! with copy-on-write, and clone_range, over the layout and pool layers.

mod change_count;
mod check;
mod clone;
mod commit;
mod config;
mod damage;
mod dedup;
mod diff;
mod engine;
mod error;
mod findings;
mod frozen;
mod frozen_registry;
mod grain_map;
mod hot_copies;
mod keys;
mod locks;
mod lun_state;
mod packed;
mod plan;
mod records;
mod scan;
mod scrub;
mod shared;
mod space;
mod spotfix;
mod unsynced;
mod vdisk;
mod write_clock;
mod write_plan;
mod writer;

pub use check::CheckReport;
pub use config::{Provisioning, VdiskConfig, VdiskSpec, VdiskState, DEFAULT_GRAIN, MAX_GRAIN, MIN_GRAIN};
pub use damage::Unreadable;
pub use engine::{Engine, UnreadableVdisk};
pub use error::{Result, VolumeError};
pub use findings::{FindingKind, FindingStatus, FindingView, Repair, ScanReport, SpotfixReport};
pub use frozen::{CloneStats, Frozen};
pub use hot_copies::{HotCopyCheck, HotCopyUpkeep, HOT_REFS};
pub use plan::ReadPlan;
pub use scrub::{ScrubOptions, ScrubPass, ScrubState};
pub use tessera_dedup::{
    Compression, DedupMode, DedupSettings, DedupStatus, Fingerprinter, GcReport, PassOptions, PassReport, VdiskSavings,
};
pub use vdisk::{Extent, SpaceUsage, Vdisk};
pub use write_plan::WritePlan;
pub use writer::{as_writer, Writer};

pub use tessera_cache::{CacheStatus, DEFAULT_VDISK_CACHE};
pub use tessera_layout::{
    DiskErrors, LayoutFinding, LayoutKind, LayoutSpec, Layouts, LostMember, Progress, RebuildOptions, RebuildReport,
    ScrubTally,
};
pub use tessera_pool::{DiskState, DiskUsage, ImportOptions, Pool, SlabRef};
