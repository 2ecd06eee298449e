//! The persisted description of a pool and its member disks.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const MIN_SLAB_SIZE: u64 = 1 << 20;
pub const DEFAULT_SLAB_SIZE: u64 = 256 << 20;
/// The smallest log area a cache disk may offer.
pub const MIN_CACHE_AREA: u64 = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskState {
    /// In service.
    Healthy,
    /// Failed (an I/O error on write or flush, or an administrative failure): neither read nor
    /// written. One an I/O error took out may be taken back by `disk online`
    /// (`DiskInfo::back_after_error`); any other, never.
    Failed,
    /// Being emptied: still readable, no new slabs; repair moves its slabs away.
    Retired,
    /// Not found, or refused, when the pool was imported.
    Missing,
    /// A hot spare: it takes no new slab sets, but a repair puts replacement slabs on it before
    /// any other disk, and from then on it is an ordinary member (healthy).
    Spare,
}

impl DiskState {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskState::Healthy => "healthy",
            DiskState::Failed => "failed",
            DiskState::Retired => "retired",
            DiskState::Missing => "missing",
            DiskState::Spare => "spare",
        }
    }
}

/// What a member disk is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskUsage {
    /// Holds slabs of the layouts.
    #[default]
    Data,
    /// Holds the write-back cache log; never slabs.
    Cache,
}

impl DiskUsage {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskUsage::Data => "data",
            DiskUsage::Cache => "cache",
        }
    }

    pub fn parse(s: &str) -> Option<DiskUsage> {
        match s {
            "data" => Some(DiskUsage::Data),
            "cache" | "journal" => Some(DiskUsage::Cache),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DiskInfo {
    pub id: Uuid,
    /// Position in the pool; slab references use it. Never reused.
    pub position: u32,
    pub path: String,
    pub size: u64,
    /// Number of slabs the disk holds.
    pub slabs: u32,
    pub state: DiskState,
    #[serde(default)]
    pub usage: DiskUsage,
    /// For a missing data disk, or one failed by an I/O error while the pool ran
    /// (`back_after_error`), the state it takes again when it is back. Set only by a daemon
    /// that records every slab set a write goes around while the disk is away (the layout's
    /// `missed` members): a disk without it (recorded missing by an older daemon, whose
    /// writes kept no such record, or failed by the administrator) is failed for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returns_as: Option<DiskState>,
    /// With `returns_as`: the label generation the disk held when it went away. One back
    /// with an older label is an older copy of it (a restored image, a snapshot), failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_at: Option<u64>,
    /// For a disk an I/O error took out while the pool ran: its slabs written since its last
    /// successful flush, which its medium may lack (its volatile cache lost, a write that
    /// failed half done). Stale should it come back, until the layout layer has recorded
    /// them with their slab sets' members that missed writes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_slabs: Vec<u32>,
    /// A failed disk that an I/O error took out, which `tessera disk online` may take back
    /// (with `returns_as` and `left_at`). A field of its own, which a daemon older than it
    /// drops when it saves the configuration: such a daemon writes around a failed disk
    /// without a record, so after it the disk is failed for good.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub back_after_error: bool,
    /// When the disk last went away (an I/O error took it out, or an import did not find it):
    /// when its last successful flush before that was, as (the generation of the run, the
    /// flush round's number in that run), which orders the flushes of different disks across
    /// restarts (`Pool::last_flush`). For a disk an import did not find, (the generation the
    /// pool last saved, the largest number): some time in an earlier run, no later than its
    /// end. Kept when the disk is back or given up: which copy of a mirror could hold the
    /// most of what its members missed since depends on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flushed_through: Option<(u64, u64)>,
}

impl DiskInfo {
    /// Whether the disk, away (missing, or failed by an I/O error), can be taken back as it
    /// was: what it missed meanwhile is recorded.
    pub fn may_come_back(&self) -> bool {
        let away = match self.state {
            DiskState::Missing => true,
            DiskState::Failed => self.back_after_error,
            _ => false,
        };
        away && self.usage == DiskUsage::Data && self.returns_as.is_some()
    }

    /// Marks the disk missing at an import, as it returns (`returns_as`) with a label of at
    /// least `generation` (`left_at`). A retired disk is still written until a repair empties
    /// it: missing, it is written around as any other, and stale where it was when it is back.
    /// Its last flush was some time before: `flushed_through`. A disk failed or missing
    /// already stays as it is.
    pub(crate) fn missing_at_import(&mut self, generation: u64) {
        if matches!(self.state, DiskState::Healthy | DiskState::Spare | DiskState::Retired) {
            self.returns_as = Some(self.state);
            self.left_at = Some(generation);
            self.flushed_through = Some((generation, u64::MAX));
            self.state = DiskState::Missing;
        }
    }

    /// Gives up what the disk was waited for with: failed for good.
    pub(crate) fn forget_return(&mut self) {
        (self.returns_as, self.left_at) = (None, None);
        self.stale_slabs.clear();
        self.back_after_error = false;
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolConfig {
    pub id: Uuid,
    pub name: String,
    pub slab_size: u64,
    pub disks: Vec<DiskInfo>,
    /// Label generation written on every disk at the last import/export.
    pub generation: u64,
    /// Whether every block is stored with a checksum (on unless the pool was created without).
    #[serde(default = "checksums_on")]
    pub checksums: bool,
}

fn checksums_on() -> bool {
    true
}

/// Pool and vdisk names: what a user can type and a URL or IQN can carry.
pub fn validate_name(kind: &str, name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > 64 {
        return Err(format!("{kind} name '{name}' must be 1 to 64 characters long"));
    }
    if !name.chars().all(ok_char) || name.starts_with(['.', '-']) {
        return Err(format!(
            "{kind} name '{name}' may hold only letters, digits, '-', '_' and '.', and must not start with '.' or '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("pool", "demo").is_ok());
        assert!(validate_name("pool", "vol_1.a-b").is_ok());
        assert!(validate_name("pool", "").is_err());
        assert!(validate_name("pool", "a/b").is_err());
        assert!(validate_name("pool", "-x").is_err());
        assert!(validate_name("pool", &"x".repeat(65)).is_err());
    }
}
