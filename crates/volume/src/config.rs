//! The persisted description of a virtual disk, and what a user asks for when creating one.

use serde::{Deserialize, Serialize};
use tessera_layout::{LayoutKind, LayoutSpec};

pub const DEFAULT_GRAIN: u64 = 64 << 10;
pub const MIN_GRAIN: u64 = 4096;
pub const MAX_GRAIN: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Provisioning {
    /// Space is taken on first write.
    Thin,
    /// Space for every grain is reserved at creation, so a write never fails for lack of it.
    Fixed,
}

impl Provisioning {
    pub fn parse(s: &str) -> Option<Provisioning> {
        match s {
            "thin" => Some(Provisioning::Thin),
            "fixed" => Some(Provisioning::Fixed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Provisioning::Thin => "thin",
            Provisioning::Fixed => "fixed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VdiskState {
    Online,
    /// Being filled by a snapshot or a clone; a restart deletes what was made.
    Creating,
    /// Being deleted; a restart finishes the job.
    Deleting,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VdiskConfig {
    pub id: u64,
    pub name: String,
    pub size: u64,
    pub block_size: u32,
    /// The physical block size presented to initiators (READ CAPACITY's LBPPBE): 4096 unless
    /// the vdisk was made to present 512-byte physical blocks ("512n") for hosts that want them.
    #[serde(default = "default_physical_block_size")]
    pub physical_block_size: u32,
    pub grain_size: u64,
    pub layout: LayoutSpec,
    pub provisioning: Provisioning,
    pub state: VdiskState,
    /// Set on a snapshot: the vdisk it was taken of. A snapshot is read-only and is named
    /// `VDISK@SNAPSHOT`; it outlives its origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_of: Option<String>,
    /// When the vdisk or snapshot was made, in seconds since the Unix epoch (0: before this
    /// was recorded).
    #[serde(default)]
    pub created: u64,
    /// How much dirty data the vdisk may hold in the pool's write-back cache (absent: the
    /// default, 1 GiB; 0: its writes bypass the cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_cache_size: Option<u64>,
}

/// Physical blocks are 4 KiB unless asked otherwise: the smallest write the engine does in
/// place, and what aligned hosts (512e) should write in.
pub const DEFAULT_PHYSICAL_BLOCK: u32 = 4096;

fn default_physical_block_size() -> u32 {
    DEFAULT_PHYSICAL_BLOCK
}

impl VdiskConfig {
    pub fn grains(&self) -> u64 {
        self.size.div_ceil(self.grain_size)
    }

    /// Its write-back cache budget.
    pub fn write_cache(&self) -> u64 {
        self.write_cache_size.unwrap_or(tessera_cache::DEFAULT_VDISK_CACHE)
    }
}

/// A request to create a virtual disk; unset fields take defaults derived from the pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VdiskSpec {
    pub name: String,
    pub size: u64,
    pub layout: LayoutKind,
    pub copies: Option<u8>,
    pub columns: Option<u32>,
    pub interleave: Option<u64>,
    pub provisioning: Provisioning,
    pub grain_size: Option<u64>,
    pub block_size: Option<u32>,
    /// Absent: 4096 (or the logical block size, if larger).
    #[serde(default)]
    pub physical_block_size: Option<u32>,
    /// Write-back cache budget; absent: 1 GiB.
    #[serde(default)]
    pub write_cache_size: Option<u64>,
}

impl VdiskSpec {
    pub fn new(name: &str, size: u64, layout: LayoutKind) -> VdiskSpec {
        VdiskSpec {
            name: name.to_string(),
            size,
            layout,
            copies: None,
            columns: None,
            interleave: None,
            provisioning: Provisioning::Thin,
            grain_size: None,
            block_size: None,
            physical_block_size: None,
            write_cache_size: None,
        }
    }
}

/// Whether `grain` is a grain size a vdisk (and so a slab set) can have.
pub fn grain_size_ok(grain: u64) -> bool {
    grain.is_power_of_two() && (MIN_GRAIN..=MAX_GRAIN).contains(&grain)
}

/// Checks what only the vdisk itself determines.
pub fn validate(size: u64, block_size: u32, grain: u64, layout: &LayoutSpec) -> Result<(), String> {
    if block_size != 512 && block_size != 4096 {
        return Err(format!("logical block size must be 512 or 4096, not {block_size}"));
    }
    if !grain_size_ok(grain) {
        return Err(format!(
            "grain size {grain} must be a power of two between {MIN_GRAIN} and {MAX_GRAIN}"
        ));
    }
    if size == 0 || size % block_size as u64 != 0 {
        return Err(format!(
            "size {size} must be a positive multiple of the {block_size} byte block size"
        ));
    }
    if size > (1u64 << 50) {
        return Err(format!("size {size} is larger than the 1 PiB a vdisk can have"));
    }
    let _ = layout;
    Ok(())
}

/// The physical block size a vdisk of `block_size` byte logical blocks presents when asked for
/// `asked` (None: the default).
pub fn physical_block_size(block_size: u32, asked: Option<u32>) -> Result<u32, String> {
    let p = asked.unwrap_or(DEFAULT_PHYSICAL_BLOCK.max(block_size));
    if p != 512 && p != 4096 {
        return Err(format!("physical block size must be 512 or 4096, not {p}"));
    }
    if p < block_size {
        return Err(format!(
            "physical block size {p} is smaller than the {block_size} byte logical block size"
        ));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_blocks_default_to_4k_and_never_undercut_the_logical_block() {
        assert_eq!(physical_block_size(512, None), Ok(4096));
        assert_eq!(physical_block_size(4096, None), Ok(4096));
        assert_eq!(physical_block_size(512, Some(512)), Ok(512));
        assert_eq!(physical_block_size(512, Some(4096)), Ok(4096));
        assert!(physical_block_size(4096, Some(512)).is_err());
        assert!(physical_block_size(512, Some(2048)).is_err());
    }

    #[test]
    fn a_vdisk_saved_before_physical_block_sizes_presents_4k_ones() {
        let saved = r#"{"id":3,"name":"v","size":1048576,"block_size":512,"grain_size":65536,
            "layout":{"kind":"simple","copies":1,"columns":1,"interleave":262144},
            "provisioning":"thin","state":"online"}"#;
        let c: VdiskConfig = serde_json::from_str(saved).unwrap();
        assert_eq!(c.physical_block_size, 4096);
    }
}
