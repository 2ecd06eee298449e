//! Tessera layouts: simple, mirror, parity and dual parity over slab sets. Degraded reads and
//! writes within the layout's tolerance, a stripe journal that closes the parity write hole,
//! and repair onto spare slabs.

mod audit;
mod batch;
mod codec;
mod error;
mod gather;
mod geometry;
mod io;
mod journal;
mod layouts;
mod lost;
pub mod ranges;
mod rebuild;
mod scrub;
mod slabset;
mod spec;
mod sums;
mod write_plan;

pub use audit::{LayoutFinding, LostMember};
pub use batch::{DiskRead, SetRead};
pub use error::{LayoutError, Result};
pub use layouts::{DiskErrors, IoStats, Layouts, Placement, SetHealth};
pub use rebuild::{Progress, RebuildOptions, RebuildReport, RepairCounts};
pub use scrub::{Mismatch, ScrubTally, MAX_MISMATCHES};
pub use slabset::{with_lost_disks, MembersGuard, SlabSet, SlabSetDesc};
pub use spec::{LayoutKind, LayoutSpec, DEFAULT_INTERLEAVE, MAX_COLUMNS, MIN_INTERLEAVE};
pub use sums::BLOCK as CHECKSUM_BLOCK;
pub use write_plan::DiskWrite;
