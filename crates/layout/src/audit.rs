//! The layout layer's part of the online metadata scan: slab sets that lost a member, stripe
//! journal records that no longer match a set, and regions a crash left inconsistent that
//! replay could not settle. Each finding names the one repair that settles it; the repairs
//! re-check their finding before they act, so a finding that went away meanwhile is left
//! alone.

use serde::{Deserialize, Serialize};
use tessera_pool::DiskState;

use crate::error::Result;
use crate::journal::{Record, RecordBody, REGION_BYTES};
use crate::layouts::Layouts;
use crate::rebuild::{Progress, RebuildOptions, RebuildReport};

/// A problem of the layout layer's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LayoutFinding {
    /// A member of the set lies on a disk that is failed, missing or retired: the set runs on
    /// its redundancy. Repair: rebuild the set's lost members onto healthy disks.
    MemberLost { set: u32, members: Vec<LostMember> },
    /// A stripe journal record names a slab set that does not exist, or a place past its end.
    /// Replay skips such a record, so the checkpoint the audit starts with retires it: found
    /// only if one survives that. Repair: delete the record.
    JournalStale { seq: u64, set: u32, row: u64, why: String },
    /// A region written when the pool stopped whose redundancy replay could not make agree
    /// with its data (its record is kept). Repair: resync the region again.
    RegionUnsynced { seq: u64, set: u32, region: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LostMember {
    pub member: u16,
    pub disk: u32,
    pub state: String,
}

impl Layouts {
    /// What the layout layer's metadata says is wrong now. The journal is checkpointed first,
    /// so that only records a checkpoint keeps are judged (a record of a set freed a moment
    /// ago goes at the next checkpoint on its own).
    pub fn audit(&self) -> Result<Vec<LayoutFinding>> {
        let mut found = Vec::new();
        for set in self.registry.all() {
            let members = set.members.read();
            let lost: Vec<LostMember> = self
                .needs_move(&members)
                .into_iter()
                .map(|m| LostMember {
                    member: m as u16,
                    disk: members[m].disk,
                    state: match self.pool.disk_state(members[m].disk) {
                        // Its disk is back, but it missed writes while it was away.
                        DiskState::Healthy if self.is_missed(members[m]) => "stale",
                        s => state_name(s),
                    }
                    .to_string(),
                })
                .collect();
            if !lost.is_empty() {
                found.push(LayoutFinding::MemberLost {
                    set: set.id,
                    members: lost,
                });
            }
        }
        self.checkpoint()?;
        let pinned: Vec<u64> = self.journal.pinned().into_iter().map(|(s, _)| s).collect();
        for (seq, rec) in self.journal.records()? {
            if let Some(why) = self.stale_because(&rec) {
                found.push(LayoutFinding::JournalStale {
                    seq,
                    set: rec.set,
                    row: rec.row,
                    why,
                });
            } else if pinned.contains(&seq) && rec.body == RecordBody::Dirty {
                found.push(LayoutFinding::RegionUnsynced {
                    seq,
                    set: rec.set,
                    region: rec.row,
                });
            }
        }
        Ok(found)
    }

    /// Why a journal record matches no place of a set, or None when it does.
    pub(crate) fn stale_because(&self, rec: &Record) -> Option<String> {
        if rec.set == u32::MAX && rec.row == u64::MAX {
            return Some("the record cannot be decoded".into());
        }
        let Ok(set) = self.registry.get(rec.set) else {
            return Some(format!("slab set {} does not exist", rec.set));
        };
        let slab = self.pool.slab_size();
        match &rec.body {
            RecordBody::Dirty if rec.row.saturating_mul(REGION_BYTES) >= slab => Some(format!(
                "region {} lies past the end of the set's {} byte slabs",
                rec.row, slab
            )),
            RecordBody::Dirty => None,
            RecordBody::Update { offset, writes } => {
                let width = set.spec.width();
                if let Some((m, _)) = writes.iter().find(|(m, _)| *m as usize >= width) {
                    return Some(format!("member {m} of a set of {width}"));
                }
                let end = writes.iter().map(|(_, b)| b.len() as u64).max().unwrap_or(0);
                (offset.saturating_add(end) > slab).then(|| {
                    format!(
                        "bytes {offset}..{} lie past the end of the slabs",
                        offset.saturating_add(end)
                    )
                })
            }
        }
    }

    /// Deletes a journal record the scan found stale, if it still is. False when it is gone
    /// or matches a set now.
    pub fn drop_stale_record(&self, seq: u64) -> Result<bool> {
        let Some((_, rec)) = self.journal.records()?.into_iter().find(|(s, _)| *s == seq) else {
            return Ok(false);
        };
        if self.stale_because(&rec).is_none() {
            return Ok(false);
        }
        self.journal.drop_record(seq)?;
        Ok(true)
    }

    /// Resyncs a region replay left inconsistent, if its record is still pinned. Ok(false)
    /// when it is no longer pinned (settled meanwhile); an error when it still cannot be made
    /// consistent.
    pub fn resync_unsynced(&self, seq: u64) -> Result<bool> {
        let Some((_, rec)) = self.journal.pinned().into_iter().find(|(s, _)| *s == seq) else {
            return Ok(false);
        };
        if rec.body != RecordBody::Dirty {
            // An update kept for a set beyond its tolerance: applied once enough is back.
            if self.replay(&rec)? {
                self.journal.unpin(seq);
                return Ok(true);
            }
            return Ok(false);
        }
        let set = self.registry.get(rec.set)?;
        let members = set.members.read();
        self.resync_region(&set, &members, rec.row)?;
        self.journal.unpin(seq);
        Ok(true)
    }

    /// Rebuilds the lost members of the listed sets (those that still have one).
    pub fn rebuild_sets(&self, ids: &[u32], opts: &RebuildOptions, progress: &Progress) -> Result<RebuildReport> {
        let (need, _) = self.repair_needed();
        let ids: Vec<u32> = ids.iter().copied().filter(|id| need.contains(id)).collect();
        self.rebuild_only(ids, opts, progress)
    }
}

impl Layouts {
    /// Damage on purpose, for drills and tests: a `Dirty` record of `region` of `set` kept as
    /// replay keeps a record whose region it could not make consistent. Returns its sequence.
    /// Leaves in the journal, for the next import to replay, an update of `set` writing
    /// `bytes` to its member `member` at `offset`, as a crash leaves a write's record: what a
    /// damaged journal could hold, wherever it points.
    pub fn damage_update_record(&self, set: u32, offset: u64, member: u16, bytes: Vec<u8>) -> Result<u64> {
        let rec = Record {
            set,
            row: 0,
            body: RecordBody::Update {
                offset,
                writes: vec![(member, bytes)],
            },
        };
        self.journal.append(&rec)
    }

    pub fn damage_pinned_record(&self, set: u32, region: u64) -> Result<u64> {
        let rec = Record {
            set,
            row: region,
            body: RecordBody::Dirty,
        };
        let seq = self.journal.append(&rec)?;
        self.journal.done(seq);
        self.journal.pin(seq, rec);
        Ok(seq)
    }
}

fn state_name(s: DiskState) -> &'static str {
    match s {
        DiskState::Healthy => "healthy",
        DiskState::Failed => "failed",
        DiskState::Retired => "retired",
        DiskState::Missing => "missing",
        DiskState::Spare => "spare",
    }
}
