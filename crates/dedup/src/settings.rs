//! What an operator sets for a pool's deduplication, kept in the pool's metadata.

use serde::{Deserialize, Serialize};

use crate::compress::Compression;

/// A pool's deduplication settings (`tessera dedup enable`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DedupSettings {
    pub enabled: bool,
    /// The vdisks in scope, by name; empty: every vdisk of the pool (snapshots and fixed
    /// vdisks aside).
    #[serde(default)]
    pub vdisks: Vec<String>,
    /// Vdisks left out even when every vdisk is in scope.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// A region (1 MiB) is optimized only once it has not been written for this long: data
    /// still being written would be copied again at its next write.
    #[serde(default = "default_min_age")]
    pub min_age_secs: u64,
    /// Seconds between scheduled runs, in background mode; 0: only runs asked for.
    #[serde(default = "default_schedule")]
    pub schedule_secs: u64,
    /// How fast a background run reads the vdisks, in bytes per second.
    #[serde(default = "default_background_rate")]
    pub background_rate: u64,
    /// How the grains a run finds no duplicate for are compressed (only where that saves
    /// a sector).
    #[serde(default = "compression_of_older_records")]
    pub compression: Compression,
    /// A slot on a layout with no redundancy that more grains than this share (dedup, clones,
    /// snapshots) is kept in a second copy, as Windows' ChunkRedundancyThreshold; 0: none.
    #[serde(default = "default_hot_copy_refs")]
    pub hot_copy_refs: u32,
}

/// Windows deduplication's rule: a chunk referenced more than 100 times is kept twice.
pub const DEFAULT_HOT_COPY_REFS: u32 = 100;

/// A record written before the codec was kept in it is a pool that has compressed with
/// zstd since: it goes on doing so (a pool whose dedup is first enabled gets the default).
fn compression_of_older_records() -> Compression {
    Compression::Zstd
}

fn default_hot_copy_refs() -> u32 {
    DEFAULT_HOT_COPY_REFS
}

fn default_min_age() -> u64 {
    3600
}

fn default_schedule() -> u64 {
    3600
}

fn default_background_rate() -> u64 {
    64 << 20
}

impl Default for DedupSettings {
    fn default() -> DedupSettings {
        DedupSettings {
            enabled: false,
            vdisks: Vec::new(),
            exclude: Vec::new(),
            min_age_secs: default_min_age(),
            schedule_secs: default_schedule(),
            background_rate: default_background_rate(),
            compression: Compression::default(),
            hot_copy_refs: DEFAULT_HOT_COPY_REFS,
        }
    }
}

impl DedupSettings {
    /// True if the vdisk named `name` is in scope: dedup is on, the vdisk is one of those
    /// named (or none are) and not excluded.
    pub fn covers(&self, name: &str) -> bool {
        self.enabled
            && (self.vdisks.is_empty() || self.vdisks.iter().any(|v| v == name))
            && !self.exclude.iter().any(|v| v == name)
    }
}

/// How a run goes: as fast as the disks allow, or held to the background rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum DedupMode {
    Throughput,
    #[default]
    Background,
}

impl DedupMode {
    pub fn parse(s: &str) -> Option<DedupMode> {
        match s {
            "throughput" => Some(DedupMode::Throughput),
            "background" => Some(DedupMode::Background),
            _ => None,
        }
    }
}

/// What one run is asked to do.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PassOptions {
    #[serde(default)]
    pub mode: DedupMode,
    /// Bytes per second read from the vdisks, at most (absent: the background rate in
    /// background mode, unlimited in throughput mode).
    #[serde(default)]
    pub rate: Option<u64>,
    /// Optimizes every region, however recently written (absent: the pool's minimum age).
    #[serde(default)]
    pub ignore_min_age: bool,
}

impl PassOptions {
    /// Bytes per second the run may read; 0: unlimited.
    pub fn rate(&self, s: &DedupSettings) -> u64 {
        match (self.rate, self.mode) {
            (Some(r), _) => r,
            (None, DedupMode::Background) => s.background_rate,
            (None, DedupMode::Throughput) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_is_every_vdisk_or_those_named_less_the_excluded() {
        let mut s = DedupSettings {
            enabled: true,
            ..Default::default()
        };
        assert!(s.covers("a"));
        s.exclude = vec!["b".into()];
        assert!(s.covers("a") && !s.covers("b"));
        s.vdisks = vec!["c".into()];
        assert!(!s.covers("a") && s.covers("c"));
        s.enabled = false;
        assert!(!s.covers("c"));
    }

    #[test]
    fn old_records_read_with_defaults() {
        let s: DedupSettings = serde_json::from_str(r#"{"enabled":true}"#).unwrap();
        assert_eq!(s.min_age_secs, 3600);
        assert!(s.vdisks.is_empty());
        assert_eq!(s.compression, Compression::Zstd);
        assert_eq!(DedupSettings::default().compression, Compression::Balanced);
    }
}
