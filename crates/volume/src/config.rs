//! The persisted description of a virtual disk, and what a user asks for when creating one.

use serde::{Deserialize, Serialize};
use tessera_layout::{LayoutKind, LayoutSpec};

pub const DEFAULT_GRAIN: u64 = 64 << 10;
pub const MIN_GRAIN: u64 = 4096;
pub const MAX_GRAIN: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
}

impl VdiskConfig {
    pub fn grains(&self) -> u64 {
        self.size.div_ceil(self.grain_size)
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
        }
    }
}

/// Checks what only the vdisk itself determines.
pub fn validate(size: u64, block_size: u32, grain: u64, layout: &LayoutSpec) -> Result<(), String> {
    if block_size != 512 && block_size != 4096 {
        return Err(format!("logical block size must be 512 or 4096, not {block_size}"));
    }
    if !grain.is_power_of_two() || !(MIN_GRAIN..=MAX_GRAIN).contains(&grain) {
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
