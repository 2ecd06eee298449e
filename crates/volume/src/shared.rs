//! What every vdisk of a pool shares, and holds: the pool, its layouts, the write-back cache
//! in front of them, the grain space, the
//! metadata committer, the grain locks, the registry of frozen images and the copies of hot slots. It holds no vdisk:
//! the engine owns those.

use std::sync::Arc;

use tessera_cache::WriteCache;
use tessera_layout::Layouts;
use tessera_pool::Pool;

use crate::commit::Committer;
use crate::frozen_registry::FrozenRegistry;
use crate::hot_copies::HotCopies;
use crate::locks::GrainLocks;
use crate::space::GrainSpace;

pub(crate) struct Shared {
    pub pool: Arc<Pool>,
    pub layouts: Arc<Layouts>,
    /// Every data read and write goes through it (a pass-through without cache disks).
    pub cache: Arc<WriteCache>,
    pub space: GrainSpace,
    pub committer: Committer,
    pub locks: GrainLocks,
    pub frozen: FrozenRegistry,
    /// Second copies of slots that many grains share, on layouts with no redundancy.
    pub hot: HotCopies,
}
