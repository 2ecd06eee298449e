//! Tessera pools: member disks, their labels and states, slabs, and the metadata store that
//! every layer above keeps its records in.

mod alloc;
mod config;
mod error;
mod meta;
mod pool;
mod write_marks;

pub use alloc::{SlabMap, SlabRef};
pub use config::{
    validate_name, DiskInfo, DiskState, DiskUsage, PoolConfig, DEFAULT_SLAB_SIZE, MIN_CACHE_AREA, MIN_SLAB_SIZE,
};
pub use error::{PoolError, Result};
pub use meta::{
    conformance, counted, decode_refcount, hex, refcount_delta, unhex, MemoryMeta, MetaBackend, MetaBatch, MetaOp,
    MetaSnapshot, MetaStore, MetaView, RocksMeta, Visit, CF_DEDUP, CF_FINDINGS, CF_GRAINS, CF_GRAINSETS, CF_POOL,
    CF_REFCOUNTS, CF_SLABSETS, CF_VDISKS, DEDUP_INDEX_CACHE,
};
pub use pool::{Capacity, DiskOpener, DiskStatus, ImportOptions, Pool};
pub use write_marks::WriteMark;
