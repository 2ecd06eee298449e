//! What the online metadata scan finds and what spot-fix does about it: each finding names
//! one object, what is wrong with it, and the exact repair, kept in the pool's metadata store
//! (one record per finding) until spot-fix settles it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_layout::LayoutFinding;
use tessera_pool::{MetaBatch, MetaStore, CF_FINDINGS, CF_POOL};

use crate::error::{Result, VolumeError};
use crate::space::loc_parts;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A grain map entry names a slab set that does not exist, or a slot past its end (a
    /// snapshot's or a vdisk's reference left dangling).
    GrainOutsideSpace,
    /// A grain map entry past the end of its vdisk.
    GrainBeyondEnd,
    /// A grain map entry names a slot of another layout or grain size than its vdisk's.
    GrainWrongClass,
    /// A slot's reference count differs from the references to it.
    RefcountWrong,
    /// A slot counted as used that nothing refers to: space that never comes back.
    OrphanSlot,
    /// Grain map entries of a vdisk that has no record.
    DanglingGrains,
    /// A slab set with a member on a failed, missing or retired disk.
    SetMemberLost,
    /// A stripe journal record that matches no slab set.
    JournalStale,
    /// A region a crash left inconsistent that replay could not settle.
    RegionUnsynced,
    /// A record of the grain map, the reference counts or the slab sets that cannot be read
    /// (a key or value of the wrong length, a descriptor that does not parse): a damaged
    /// store. Never taken for "nothing": the set it describes is judged from memory.
    RecordMalformed,
    /// Bytes a grain refers to that its slab set lost beyond repair (rotten on their disk and
    /// on the parity where a write or a rebuild had to read them): reads of them fail until
    /// they are written again.
    DataLost,
}

/// The repair a finding calls for, with what the scan saw, so that spot-fix can tell whether
/// it still holds before it acts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Repair {
    /// Add `references - stored` to the slot's count. `referrers`: some of the grains that
    /// point at it, (vdisk id, grain), checked again before the change.
    SetCount {
        slot: u64,
        stored: i64,
        references: u64,
        referrers: Vec<(u64, u64)>,
    },
    /// Remove the grain's map entry (and its reference): the grain reads as zeros.
    Unmap { vdisk: u64, grain: u64, slot: u64 },
    /// Copy the grain into a new slot of its vdisk's class and drop the reference to `slot`.
    Recopy { vdisk: u64, grain: u64, slot: u64 },
    /// Remove every map entry of the vdisk id, and their references.
    DropEntries { vdisk: u64, entries: u64 },
    /// A repair of the layout layer.
    Layout { finding: LayoutFinding },
    /// Remove a record that cannot be read and says nothing one can use: a grain map entry
    /// whose key or value has the wrong length (no slot is known, so no count moves), a
    /// count under a key of the wrong length. `key` and `found` (its bytes as the scan saw
    /// them) in hex; the record is removed only if it still holds them.
    DropRecord { family: String, key: String, found: String },
    /// Write the slab set's records (its descriptor and its grain size) again from what the
    /// running pool holds, where one could not be read.
    RewriteSet { set: u32 },
    /// A count whose record cannot be read: counted again from the grain map at the pool's
    /// next import, before any slot is handed out (while it runs, nothing stops the grains
    /// from changing under a recount; memory holds the count right meanwhile).
    Recount { slot: u64 },
    /// A vdisk record that cannot be read: the vdisk is left out of the pool, its `grains`
    /// map entries and their space kept. Nothing else says its name, size or layout, so
    /// spot-fix cannot write it again: put right (or restored), it brings the vdisk back at
    /// the next import.
    VdiskRecord { vdisk: u64, grains: u64 },
    /// Bytes of the vdisk's grain (`bytes`: byte ranges of the vdisk), held in `slot`, that
    /// are lost beyond repair. Nothing but the host (or a backup, a replica) has them: spot-fix
    /// cannot repair them, a write of them does.
    Restore {
        vdisk: u64,
        grain: u64,
        slot: u64,
        bytes: Vec<(u64, u64)>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FindingStatus {
    /// Found by the last scan, not acted on yet.
    #[default]
    Open,
    /// Spot-fix found the object changed since the scan and left it alone: scan again.
    Changed,
    /// Spot-fix tried and failed (`note` says why); the next spot-fix tries again.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub id: u64,
    pub kind: FindingKind,
    pub repair: Repair,
    #[serde(default)]
    pub status: FindingStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A finding as an operator reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FindingView {
    pub id: u64,
    pub kind: FindingKind,
    /// The object concerned: a slot, a vdisk's grain, a slab set, a journal record.
    pub object: String,
    pub problem: String,
    /// What spot-fix will do.
    pub repair: String,
    pub status: FindingStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The repair as spot-fix reads it.
    pub action: Repair,
}

fn slot_name(l: u64) -> String {
    let (set, slot) = loc_parts(l);
    format!("slot {slot} of slab set {set}")
}

impl Finding {
    /// The finding in words; `vdisk` names a vdisk id.
    pub fn view(&self, vdisk: &dyn Fn(u64) -> String) -> FindingView {
        let (object, problem, repair) = match &self.repair {
            Repair::SetCount {
                slot,
                stored,
                references,
                ..
            } => (
                slot_name(*slot),
                if *references == 0 {
                    format!("counted as used {stored} time(s), but nothing refers to it")
                } else {
                    format!("{references} grain(s) refer to it, but its count is {stored}")
                },
                if *references == 0 {
                    "set its count to 0: the slot is free again".to_string()
                } else {
                    format!("set its count to {references}")
                },
            ),
            Repair::Unmap { vdisk: v, grain, slot } => (
                format!("{} grain {grain}", vdisk(*v)),
                match self.kind {
                    FindingKind::GrainBeyondEnd => format!(
                        "a map entry past the end of the vdisk, pointing at {}",
                        slot_name(*slot)
                    ),
                    _ => format!("points at {}, which does not exist", slot_name(*slot)),
                },
                "remove the map entry and its reference: the grain reads as zeros (its data was lost with the slot)"
                    .to_string(),
            ),
            Repair::Recopy { vdisk: v, grain, slot } => (
                format!("{} grain {grain}", vdisk(*v)),
                format!(
                    "points at {}, of another layout or grain size than the vdisk's",
                    slot_name(*slot)
                ),
                "copy the grain into a slot of the vdisk's own layout and drop the reference to the other".to_string(),
            ),
            Repair::DropEntries { vdisk: v, entries } => (
                format!("vdisk id {v}"),
                format!("{entries} grain map entries of a vdisk that has no record"),
                "remove them and the references they hold".to_string(),
            ),
            Repair::DropRecord { family, key, found } => (
                format!("{family} record {key}"),
                format!("cannot be read: {found:?} (hex) is no {family} record"),
                match family.as_str() {
                    "grains" => "write it again from memory if the running vdisk maps its grain; else remove it (the grain reads as zeros, as it has since the pool opened)"
                        .to_string(),
                    _ => "remove it".to_string(),
                },
            ),
            Repair::Recount { slot } => (
                slot_name(*slot),
                "its count record cannot be read; the running pool holds the count in memory".to_string(),
                "none while the pool runs: its next import (a restart, an export and import) counts it again from the grain map"
                    .to_string(),
            ),
            Repair::VdiskRecord { vdisk: v, grains } => (
                format!("vdisk id {v}"),
                format!("its record cannot be read: the vdisk is left out of the pool; its {grains} grain map entries and their space are kept"),
                "none by spot-fix (the record alone says the vdisk's name, size and layout): put the record right or restore it, and import the pool again"
                    .to_string(),
            ),
            Repair::Restore {
                vdisk: v, grain, bytes, ..
            } => (
                format!("{} grain {grain}", vdisk(*v)),
                format!(
                    "bytes {} of the vdisk are lost beyond repair (rotten on their disk and on the parity): reads of them fail",
                    bytes
                        .iter()
                        .map(|(a, b)| format!("{a}..{b}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "none by spot-fix: write them again from a backup or a replica (a write over them makes them readable)"
                    .to_string(),
            ),
            Repair::RewriteSet { set } => (
                format!("slab set {set}"),
                "a record of the set (its descriptor or its grain size) cannot be read; the running pool knows it"
                    .to_string(),
                "write the set's records again from what the running pool holds".to_string(),
            ),
            Repair::Layout { finding } => match finding {
                LayoutFinding::MemberLost { set, members } => (
                    format!("slab set {set}"),
                    members
                        .iter()
                        .map(|m| format!("member {} is on disk {}, which is {}", m.member, m.disk, m.state))
                        .collect::<Vec<_>>()
                        .join("; "),
                    "rebuild those members onto healthy disks".to_string(),
                ),
                LayoutFinding::JournalStale { seq, why, .. } => (
                    format!("stripe journal record {seq}"),
                    format!("matches no slab set: {why}"),
                    "delete the record".to_string(),
                ),
                LayoutFinding::RegionUnsynced { seq, set, region } => (
                    format!("slab set {set} region {region}"),
                    format!("left inconsistent by a crash; journal record {seq} is kept until it is resynced"),
                    "resync the region".to_string(),
                ),
            },
        };
        FindingView {
            id: self.id,
            kind: self.kind,
            object,
            problem,
            repair,
            status: self.status,
            note: self.note.clone(),
            action: self.repair.clone(),
        }
    }
}

/// What the last scan and spot-fix did, kept in the pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ScanReport {
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    pub finished_at: u64,
    pub seconds: f64,
    pub vdisks: u64,
    pub grains: u64,
    /// Slots with a reference count record.
    pub counted_slots: u64,
    pub slab_sets: u64,
    pub findings: u64,
    pub by_kind: BTreeMap<FindingKind, u64>,
    /// The last spot-fix of these findings, if any.
    pub spotfix: Option<SpotfixReport>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SpotfixReport {
    pub started_at: u64,
    pub finished_at: u64,
    pub seconds: f64,
    /// Findings repaired (and removed from the list).
    pub fixed: u64,
    /// Findings whose object changed since the scan, left alone.
    pub changed: u64,
    /// Findings whose repair failed.
    pub failed: u64,
}

const REPORT_KEY: &[u8] = b"scan";

pub(crate) fn finding_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

pub(crate) fn encode(f: &Finding) -> Vec<u8> {
    serde_json::to_vec(f).expect("serializable")
}

pub(crate) fn load_report(meta: &MetaStore) -> Result<Option<ScanReport>> {
    match meta.get(CF_POOL, REPORT_KEY)? {
        None => Ok(None),
        Some(v) => serde_json::from_slice(&v)
            .map(Some)
            .map_err(|e| VolumeError::Invalid(format!("unreadable scan report: {e}"))),
    }
}

pub(crate) fn save_report(b: &mut MetaBatch, r: &ScanReport) {
    b.put(CF_POOL, REPORT_KEY, serde_json::to_vec(r).expect("serializable"));
}

/// Where the scan schedule counts from when no later scan ended (seconds since the epoch):
/// the first time the daemon looked at a pool never scanned, or a scan the administrator
/// stopped.
const SCHEDULE_FROM_KEY: &[u8] = b"scan-scheduled-from";

/// A record of the wrong length is taken for none (and written anew): a schedule that counts
/// again from now, rather than no scheduled scan at all.
pub(crate) fn load_schedule_from(meta: &MetaStore) -> Result<Option<u64>> {
    Ok(meta.get(CF_POOL, SCHEDULE_FROM_KEY)?.and_then(|v| {
        let t = <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes);
        if t.is_none() {
            tracing::warn!(
                bytes = v.len(),
                "the scan schedule record is unreadable; the schedule counts from now"
            );
        }
        t
    }))
}

pub(crate) fn save_schedule_from(b: &mut MetaBatch, at: u64) {
    b.put(CF_POOL, SCHEDULE_FROM_KEY, at.to_be_bytes());
}

/// The findings kept, in id order, from id `after` on, at most `limit`.
pub(crate) fn load_findings(meta: &MetaStore, after: u64, limit: usize) -> Result<Vec<Finding>> {
    let start = finding_key(after);
    let mut out = Vec::new();
    for (k, v) in meta.range_from(CF_FINDINGS, &start, limit)? {
        let id = <[u8; 8]>::try_from(k.as_ref()).map(u64::from_be_bytes).unwrap_or(0);
        let f = serde_json::from_slice::<Finding>(&v)
            .map_err(|e| VolumeError::Invalid(format!("finding {id} is unreadable: {e}")))?;
        out.push(f);
    }
    Ok(out)
}
