//! What `tessera dedup status` and a finished run report.

use serde::{Deserialize, Serialize};

use crate::index::IndexStats;
use crate::settings::{DedupMode, DedupSettings};

/// One vdisk's share of the pool's savings. A slot that `n` grains point at counts `1/n` of
/// its size against each of them, so the vdisks' physical bytes add up to the pool's.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VdiskSavings {
    pub name: String,
    pub grain_size: u64,
    pub in_scope: bool,
    /// Bytes of mapped grains: what the vdisk holds, before sharing.
    pub logical_bytes: u64,
    /// Its share of the slots it points at.
    pub physical_bytes: u64,
    pub saved_bytes: u64,
}

/// Savings of a pool's vdisks in scope, and its index.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DedupStatus {
    pub pool: String,
    pub settings: DedupSettings,
    /// Why the pool's settings record could not be read, if it could not: the pool runs with
    /// dedup off until settings are written again (`dedup enable` or `disable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings_unreadable: Option<String>,
    /// Over the vdisks in scope: bytes of mapped grains, and bytes of the distinct slots they
    /// point at (sharing by clones and snapshots counts too: it is the same mechanism).
    pub logical_bytes: u64,
    pub physical_bytes: u64,
    pub saved_bytes: u64,
    /// saved / logical: Windows' "deduplication rate".
    pub saved_ratio: f64,
    /// Bytes of the distinct grains kept compressed, and of the pack slots that hold them
    /// (part of the physical bytes); their ratio.
    #[serde(default)]
    pub compressed_bytes: u64,
    #[serde(default)]
    pub packed_bytes: u64,
    #[serde(default)]
    pub compression_ratio: f64,
    /// Second copies of slots that more than 100 grains share on layouts with no redundancy,
    /// and their bytes (part of the physical bytes).
    #[serde(default)]
    pub hot_copies: u64,
    #[serde(default)]
    pub hot_copy_bytes: u64,
    pub vdisks: Vec<VdiskSavings>,
    pub index: IndexStats,
    /// The last run since the daemon started, if any.
    pub last_run: Option<PassReport>,
}

/// What one optimization run did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PassReport {
    pub mode: DedupMode,
    pub vdisks: u64,
    /// Mapped grains read and fingerprinted.
    pub grains_scanned: u64,
    pub bytes_scanned: u64,
    /// Grains that now share a slot with identical data elsewhere (their own slot freed,
    /// unless something else still points at it).
    pub grains_shared: u64,
    /// Grains of zeros unmapped (they read as zeros and take no space).
    pub zero_grains_unmapped: u64,
    /// Grains skipped because they were written within the minimum age.
    pub grains_too_young: u64,
    /// Grains left as they were because no copy of them could be read (a scan or repair
    /// is due); the next run tries them again.
    #[serde(default)]
    pub grains_unreadable: u64,
    /// Fingerprints that matched data that was not the same (a collision, or an index entry
    /// whose slot was rewritten since): never shared.
    pub mismatches: u64,
    pub index_inserts: u64,
    /// Grains stored compressed by this run, their bytes, and the bytes of the pieces that
    /// hold them now.
    #[serde(default)]
    pub grains_compressed: u64,
    #[serde(default)]
    pub compressed_bytes_in: u64,
    #[serde(default)]
    pub compressed_bytes_out: u64,
    /// Second copies of hot slots made and dropped after the run.
    #[serde(default)]
    pub hot_copies_made: u64,
    #[serde(default)]
    pub hot_copies_dropped: u64,
    /// Index entries dropped because what they pointed at had gone.
    pub index_pruned: u64,
    /// Slab sets given back to the pool once empty.
    pub sets_freed: u64,
    pub seconds: f64,
    /// Bytes scanned per second, in MB/s.
    pub mb_per_s: f64,
}

impl DedupStatus {
    /// Fills in saved bytes and the ratio from the logical and physical bytes.
    pub fn settle(&mut self) {
        self.saved_bytes = self.logical_bytes.saturating_sub(self.physical_bytes);
        self.saved_ratio = if self.logical_bytes == 0 {
            0.0
        } else {
            self.saved_bytes as f64 / self.logical_bytes as f64
        };
        self.compression_ratio = if self.packed_bytes == 0 {
            0.0
        } else {
            self.compressed_bytes as f64 / self.packed_bytes as f64
        };
    }
}

/// What a garbage collection of the index did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GcReport {
    /// Index entries looked at.
    pub entries: u64,
    /// Entries dropped: their slot was free, or of another class than their key says.
    pub pruned: u64,
    /// Second copies of hot slots dropped (their slot no longer shared enough).
    #[serde(default)]
    pub hot_copies_dropped: u64,
    /// Slab sets given back to the pool once empty.
    pub sets_freed: u64,
    pub seconds: f64,
}
