//! Spot-fix: the repairs the last scan listed, each checked again just before it is applied,
//! while the vdisks stay online. Its time follows the number of findings, not the pool's size.
//!
//! Why a repair found still valid is safe to apply while vdisks write: every change of the
//! metadata moves a grain map entry and the counts it touches in one batch, so a slot's
//! durable count minus its durable references stays what the scan saw until spot-fix changes
//! it; spot-fix applies that difference as a merge delta, which commutes with the deltas of
//! concurrent writes. The check before each repair makes sure the object is still as the scan
//! saw it (a grain still points where it did, a count is still what it was), holding the
//! grains concerned locked and their vdisks' gates shared, so that a snapshot or delete of
//! those vdisks waits for the few microseconds it takes: a pause per object, never per pool.
//! A repair and the removal of its finding are one batch, so a crash never applies one twice.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tessera_disk::AlignedBuf;
use tessera_layout::{LayoutFinding, Progress, RebuildOptions};
use tessera_pool::{
    decode_refcount, unhex, MetaBatch, CF_FINDINGS, CF_GRAINS, CF_GRAINSETS, CF_REFCOUNTS, CF_SLABSETS, CF_VDISKS,
};
use tracing::{info, warn};

use crate::engine::Engine;
use crate::error::{Result, VolumeError};
use crate::findings::{
    encode, finding_key, load_findings, load_report, save_report, Finding, FindingStatus, Repair, SpotfixReport,
};
use crate::keys::{count_refs, grain_key, loc_value, parse_grain_key, parse_loc, refcount_key, vdisk_key};
use crate::vdisk::{read_grain_around_lost, Vdisk};

/// Findings settled per batch of orphan and count repairs.
const CHUNK: usize = 4096;

/// What became of one finding.
enum Outcome {
    Fixed,
    Changed(String),
    Failed(String),
}

impl Engine {
    /// Applies the repairs of the last scan's open (and failed) findings.
    pub fn spotfix(&self, progress: &Progress) -> Result<SpotfixReport> {
        let Some(_one) = self.metadata_job.try_lock() else {
            return Err(VolumeError::Invalid(format!(
                "pool '{}' has a scan or spot-fix running already",
                self.pool().name()
            )));
        };
        let meta = self.pool().meta();
        let Some(mut scan) = load_report(meta)? else {
            return Err(VolumeError::Invalid(format!(
                "pool '{}' has not been scanned; run 'tessera pool scan' first",
                self.pool().name()
            )));
        };
        let t0 = Instant::now();
        let mut report = SpotfixReport {
            started_at: crate::scrub::unix_now(),
            ..Default::default()
        };
        let todo: Vec<Finding> = load_findings(meta, 0, usize::MAX)?
            .into_iter()
            .filter(|f| f.status != FindingStatus::Changed)
            .collect();
        progress.total_bytes.store(todo.len() as u64, Ordering::Relaxed);
        progress.done_bytes.store(0, Ordering::Relaxed);
        // Counts of slots nothing refers to need no lock (nothing can start to refer to such
        // a slot): they go in large batches. The rest one at a time.
        let (bulk, single): (Vec<Finding>, Vec<Finding>) = todo
            .into_iter()
            .partition(|f| matches!(&f.repair, Repair::SetCount { references: 0, .. }));
        for chunk in bulk.chunks(CHUNK) {
            if progress.cancel.load(Ordering::Relaxed) {
                break;
            }
            self.fix_unreferenced(chunk, &mut report)?;
            progress.done_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        let mut rebuilds = Vec::new();
        for f in single {
            if progress.cancel.load(Ordering::Relaxed) {
                break;
            }
            if let Repair::Layout {
                finding: LayoutFinding::MemberLost { .. },
            } = &f.repair
            {
                rebuilds.push(f);
                continue;
            }
            let outcome = self.fix_one(&f);
            self.settle(&f, outcome, &mut report)?;
            progress.done_bytes.fetch_add(1, Ordering::Relaxed);
        }
        if !rebuilds.is_empty() && !progress.cancel.load(Ordering::Relaxed) {
            self.fix_lost_members(rebuilds, &mut report)?;
        }
        report.finished_at = crate::scrub::unix_now();
        report.seconds = t0.elapsed().as_secs_f64();
        scan.spotfix = Some(report.clone());
        let mut b = MetaBatch::new();
        save_report(&mut b, &scan);
        meta.commit(b, true)?;
        if progress.cancel.load(Ordering::Relaxed) {
            return Err(VolumeError::Layout(tessera_layout::LayoutError::Cancelled));
        }
        info!(pool = %self.pool().name(), fixed = report.fixed, changed = report.changed, failed = report.failed, secs = report.seconds, "spot-fix finished");
        Ok(report)
    }

    /// Records what became of a finding whose repair (if any) is already durable.
    fn settle(&self, f: &Finding, outcome: Outcome, report: &mut SpotfixReport) -> Result<()> {
        let meta = self.pool().meta();
        let mut b = MetaBatch::new();
        Self::settle_in(&mut b, f, outcome, report);
        meta.commit(b, true)?;
        Ok(())
    }

    fn settle_in(b: &mut MetaBatch, f: &Finding, outcome: Outcome, report: &mut SpotfixReport) {
        let (status, note) = match outcome {
            Outcome::Fixed => {
                report.fixed += 1;
                b.delete(CF_FINDINGS, finding_key(f.id));
                return;
            }
            Outcome::Changed(why) => {
                report.changed += 1;
                (FindingStatus::Changed, why)
            }
            Outcome::Failed(why) => {
                warn!(finding = f.id, kind = ?f.kind, error = %why, "spot-fix could not repair a finding");
                report.failed += 1;
                (FindingStatus::Failed, why)
            }
        };
        let mut kept = f.clone();
        kept.status = status;
        kept.note = Some(note);
        b.put(CF_FINDINGS, finding_key(f.id), encode(&kept));
    }

    /// Counts of slots that nothing referred to at the scan: each still as the scan saw it is
    /// set to zero in memory and in the store, and the slot is free again.
    fn fix_unreferenced(&self, chunk: &[Finding], report: &mut SpotfixReport) -> Result<()> {
        let s = self.shared();
        let meta = s.pool.meta();
        let keys: Vec<Vec<u8>> = chunk
            .iter()
            .map(|f| match f.repair {
                Repair::SetCount { slot, .. } => refcount_key(slot),
                _ => unreachable!("only counts of unreferenced slots come here"),
            })
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let now = meta.multi_get(CF_REFCOUNTS, &keys)?;
        let mut b = MetaBatch::new();
        let mut release = Vec::new();
        for (f, now) in chunk.iter().zip(now) {
            let Repair::SetCount { slot, stored, .. } = f.repair else {
                continue;
            };
            let now = now.map(|v| decode_refcount(&v)).unwrap_or(0);
            if now != stored {
                Self::settle_in(
                    &mut b,
                    f,
                    Outcome::Changed(format!("its count is {now} now, not {stored}; scan again")),
                    report,
                );
                continue;
            }
            // A negative stored count was loaded as 0: memory has nothing to give back.
            let mem = stored.max(0);
            b.count(CF_REFCOUNTS, refcount_key(slot), -stored);
            Self::settle_in(&mut b, f, Outcome::Fixed, report);
            release.push((slot, mem));
        }
        meta.commit(b, true)?;
        // Uncounted only once the store no longer counts them.
        for (slot, mem) in release {
            s.space.adjust(slot, -mem);
        }
        Ok(())
    }

    pub(crate) fn vdisk_by_id(&self, id: u64) -> Option<Arc<Vdisk>> {
        self.vdisks().into_iter().find(|v| v.id == id)
    }

    fn fix_one(&self, f: &Finding) -> Outcome {
        let r = match &f.repair {
            Repair::SetCount {
                slot,
                stored,
                references,
                referrers,
            } => self.fix_count(f, *slot, *stored, *references, referrers),
            Repair::Unmap { vdisk, grain, slot } => self.fix_unmap(f, *vdisk, *grain, *slot),
            Repair::Recopy { vdisk, grain, slot } => self.fix_recopy(*vdisk, *grain, *slot),
            Repair::DropEntries { vdisk, .. } => self.fix_dangling(*vdisk),
            Repair::Layout { finding } => self.fix_layout(finding),
            Repair::DropRecord { family, key, found } => self.fix_record(family, key, found),
            Repair::RewriteSet { set } => self.fix_set_records(*set),
            Repair::VdiskRecord { .. } => Ok(Outcome::Failed(
                "a vdisk record cannot be written again from anything else; put it right or restore it, and import the pool again"
                    .into(),
            )),
            Repair::Restore { .. } => Ok(Outcome::Failed(
                "lost data has no other copy in the pool: write it again from a backup or a replica".into(),
            )),
            Repair::Recount { .. } => Ok(Outcome::Failed(
                "counted again at the pool's next import (a restart, or an export and import); memory holds it right meanwhile"
                    .into(),
            )),
        };
        r.unwrap_or_else(|e| Outcome::Failed(e.to_string()))
    }

    /// A slot that grains refer to, with a wrong count: under the referrers' locks, if the
    /// count and the referrers are as the scan saw them, the count is corrected by the
    /// difference (which concurrent changes of other referrers keep).
    fn fix_count(
        &self,
        f: &Finding,
        slot: u64,
        stored: i64,
        references: u64,
        referrers: &[(u64, u64)],
    ) -> Result<Outcome> {
        let s = self.shared();
        let meta = s.pool.meta();
        let ids: BTreeSet<u64> = referrers.iter().map(|r| r.0).collect();
        let mut vds = Vec::new();
        for id in ids {
            match self.vdisk_by_id(id) {
                Some(v) => vds.push(v),
                // Entries of a vdisk id with no record (a finding of their own): only spot-fix
                // changes them, so the store says whether they are still there.
                None if meta.get(CF_VDISKS, &vdisk_key(id))?.is_none() => {}
                None => {
                    return Ok(Outcome::Changed(format!(
                        "vdisk id {id}, which referred to it, is being deleted; scan again"
                    )))
                }
            }
        }
        let mut gates = Vec::new();
        for v in &vds {
            match v.enter_change() {
                Ok(g) => gates.push(g),
                Err(_) => return Ok(Outcome::Changed(format!("{} is being deleted; scan again", v.name()))),
            }
        }
        let _locks = s.locks.lock_many(referrers.iter().copied());
        for &(id, g) in referrers {
            let still = match vds.iter().find(|v| v.id == id) {
                Some(v) => v.entry(g) == slot,
                None => meta.get(CF_GRAINS, &grain_key(id, g))?.and_then(|l| parse_loc(&l)) == Some(slot),
            };
            if !still {
                let who = vds
                    .iter()
                    .find(|v| v.id == id)
                    .map(|v| v.name())
                    .unwrap_or(format!("vdisk id {id}"));
                return Ok(Outcome::Changed(format!(
                    "{who} grain {g} no longer points at it; scan again"
                )));
            }
        }
        let now = meta
            .get(CF_REFCOUNTS, &refcount_key(slot))?
            .map(|v| decode_refcount(&v))
            .unwrap_or(0);
        if now != stored {
            return Ok(Outcome::Changed(format!(
                "its count is {now} now, not {stored}; scan again"
            )));
        }
        let delta = references as i64 - stored;
        let mem_delta = references as i64 - stored.max(0);
        // Counted in memory before the store counts, uncounted after: never handed out while
        // a durable entry points at it.
        if mem_delta > 0 {
            s.space.adjust(slot, mem_delta);
        }
        let mut b = MetaBatch::new();
        b.count(CF_REFCOUNTS, refcount_key(slot), delta);
        b.delete(CF_FINDINGS, finding_key(f.id));
        if let Err(e) = meta.commit(b, true) {
            if mem_delta > 0 {
                s.space.adjust(slot, -mem_delta);
            }
            return Err(e.into());
        }
        if mem_delta < 0 {
            s.space.adjust(slot, mem_delta);
        }
        Ok(Outcome::Fixed)
    }

    /// A grain map entry that points nowhere (or lies past the end of its vdisk): removed
    /// with its reference, if it still points where the scan saw it.
    fn fix_unmap(&self, f: &Finding, vdisk: u64, g: u64, slot: u64) -> Result<Outcome> {
        let s = self.shared();
        let Some(v) = self.vdisk_by_id(vdisk) else {
            return Ok(Outcome::Changed(format!("vdisk id {vdisk} is gone; scan again")));
        };
        let Ok(_gate) = v.enter_change() else {
            return Ok(Outcome::Changed(format!("{} is being deleted", v.name())));
        };
        let _l = s.locks.write(vdisk, g);
        let meta = s.pool.meta();
        if meta.get(CF_GRAINS, &grain_key(vdisk, g))?.and_then(|l| parse_loc(&l)) != Some(slot) {
            return Ok(Outcome::Changed(format!(
                "{} grain {g} no longer points there",
                v.name()
            )));
        }
        let mut b = MetaBatch::new();
        // A reference to a place that is no slot was never counted (the scan says so).
        let counted = s.space.is_slot(slot);
        b.delete(CF_GRAINS, grain_key(vdisk, g));
        if counted {
            count_refs(&mut b, slot, -1);
        }
        b.delete(CF_FINDINGS, finding_key(f.id));
        meta.commit(b, true)?;
        if v.entry(g) == slot {
            v.set_entry(g, 0);
            if v.fixed() {
                // A fixed vdisk keeps a slot reserved for each unmapped grain.
                s.space.set_reserved(v.class, 1);
            }
        }
        if counted {
            s.space.adjust(slot, -1);
        }
        Ok(Outcome::Fixed)
    }

    /// A grain in a slot of another class: copied into a slot of its own (copy on write, as
    /// a write to a shared grain does), if it still points where the scan saw it.
    fn fix_recopy(&self, vdisk: u64, g: u64, slot: u64) -> Result<Outcome> {
        let s = self.shared();
        let Some(v) = self.vdisk_by_id(vdisk) else {
            return Ok(Outcome::Changed(format!("vdisk id {vdisk} is gone; scan again")));
        };
        let Ok(_gate) = v.enter_change() else {
            return Ok(Outcome::Changed(format!("{} is being deleted", v.name())));
        };
        let _l = s.locks.write(vdisk, g);
        if v.entry(g) != slot {
            return Ok(Outcome::Changed(format!(
                "{} grain {g} no longer points there",
                v.name()
            )));
        }
        let mut content = AlignedBuf::zeroed(v.class.grain as usize);
        // What of it is lost (beyond repair, or with the write-back log) stays lost in the copy.
        let lost = match read_grain_around_lost(s, slot, &mut content) {
            Ok(lost) => lost,
            Err(e) => return Ok(Outcome::Failed(format!("cannot read the grain to copy it: {e}"))),
        };
        // Its finding goes in a batch of its own: after a crash in between, the grain no
        // longer points there and the next spot-fix leaves it alone.
        v.replace_slot(g, slot, &content, None, &lost)?;
        Ok(Outcome::Fixed)
    }

    /// Map entries of a vdisk id with no record: nothing can add to them (no vdisk exists to
    /// write them), so they go in batches with their references.
    fn fix_dangling(&self, vdisk: u64) -> Result<Outcome> {
        let s = self.shared();
        let meta = s.pool.meta();
        if self.vdisk_by_id(vdisk).is_some() || meta.get(CF_VDISKS, &vdisk_key(vdisk))?.is_some() {
            return Ok(Outcome::Changed(format!("vdisk id {vdisk} has a record now")));
        }
        let mut entries = Vec::new();
        meta.for_each_prefix(CF_GRAINS, &vdisk.to_be_bytes(), |k, v| {
            if let (Some(_), Some(l)) = (parse_grain_key(k), parse_loc(v)) {
                entries.push((k.to_vec(), l));
            }
            Ok(())
        })?;
        for part in entries.chunks(CHUNK) {
            let mut b = MetaBatch::new();
            for (k, l) in part {
                b.delete(CF_GRAINS, k);
                if s.space.is_slot(*l) {
                    count_refs(&mut b, *l, -1);
                }
            }
            meta.commit(b, true)?;
            for (_, l) in part {
                s.space.adjust(*l, -1);
            }
        }
        Ok(Outcome::Fixed)
    }

    /// A record that cannot be read, if it still holds what the scan saw: removed; but a
    /// grain map entry of a grain that the running vdisk maps (its record was damaged under
    /// it) is written again from memory, under the grain's lock, as a write would.
    fn fix_record(&self, family: &str, key: &str, found: &str) -> Result<Outcome> {
        let Some(cf) = [CF_GRAINS, CF_REFCOUNTS, CF_GRAINSETS, CF_SLABSETS]
            .into_iter()
            .find(|cf| *cf == family)
        else {
            return Ok(Outcome::Failed(format!("spot-fix removes no {family:?} record")));
        };
        let (Some(key), Some(found)) = (unhex(key.as_bytes()), unhex(found.as_bytes())) else {
            return Ok(Outcome::Failed("the finding's key or bytes are not hex".into()));
        };
        let s = self.shared();
        let grain = (cf == CF_GRAINS)
            .then(|| parse_grain_key(&key))
            .flatten()
            .and_then(|(id, g)| Some((self.vdisk_by_id(id)?, g)));
        let _gate = match &grain {
            Some((v, _)) => match v.enter_change() {
                Ok(g) => Some(g),
                Err(_) => return Ok(Outcome::Changed(format!("{} is being deleted", v.name()))),
            },
            None => None,
        };
        let _lock = grain.as_ref().map(|(v, g)| s.locks.write(v.id, *g));
        let meta = s.pool.meta();
        if meta.get(cf, &key)?.as_deref() != Some(found.as_slice()) {
            return Ok(Outcome::Changed("the record changed or is gone".into()));
        }
        let mut b = MetaBatch::new();
        match grain.as_ref().map(|(v, g)| v.entry(*g)) {
            Some(l) if l != 0 => b.put(CF_GRAINS, &key, loc_value(l)),
            _ => b.delete(cf, &key),
        }
        meta.commit(b, true)?;
        Ok(Outcome::Fixed)
    }

    /// A slab set whose descriptor or grain size could not be read: both written again from
    /// the running pool.
    fn fix_set_records(&self, set: u32) -> Result<Outcome> {
        let s = self.shared();
        let Some(slots) = s.space.slots(set) else {
            return Ok(Outcome::Failed(format!(
                "slab set {set} is not in the running pool: nothing to write its records from"
            )));
        };
        let mut also = MetaBatch::new();
        also.put(CF_GRAINSETS, set.to_be_bytes(), slots.class.grain.to_le_bytes());
        Ok(match s.layouts.rewrite_set_records(set, also)? {
            true => Outcome::Fixed,
            false => Outcome::Changed(format!("slab set {set} was freed meanwhile")),
        })
    }

    fn fix_layout(&self, finding: &LayoutFinding) -> Result<Outcome> {
        let layouts = self.layouts();
        Ok(match finding {
            LayoutFinding::JournalStale { seq, .. } => match layouts.drop_stale_record(*seq)? {
                true => Outcome::Fixed,
                false => Outcome::Changed("the record is gone or matches a set now".into()),
            },
            LayoutFinding::RegionUnsynced { seq, .. } => match layouts.resync_unsynced(*seq) {
                Ok(true) => Outcome::Fixed,
                Ok(false) => Outcome::Changed("the region was resynced meanwhile".into()),
                Err(e) => Outcome::Failed(format!("the region still cannot be made consistent: {e}")),
            },
            LayoutFinding::MemberLost { .. } => unreachable!("rebuilt together"),
        })
    }

    /// Slab sets with lost members: rebuilt together, as a repair does, but only these.
    fn fix_lost_members(&self, found: Vec<Finding>, report: &mut SpotfixReport) -> Result<()> {
        let set_of = |f: &Finding| match &f.repair {
            Repair::Layout {
                finding: LayoutFinding::MemberLost { set, .. },
            } => *set,
            _ => unreachable!("only lost members come here"),
        };
        let (need, _) = self.layouts().repair_needed();
        let ids: Vec<u32> = found.iter().map(set_of).filter(|id| need.contains(id)).collect();
        let done = self
            .layouts()
            .rebuild_sets(&ids, &RebuildOptions::default(), &Progress::default());
        for f in &found {
            let id = set_of(f);
            let outcome = if !need.contains(&id) {
                Outcome::Changed("no member of the set needs moving any more".into())
            } else {
                match &done {
                    Err(e) => Outcome::Failed(e.to_string()),
                    Ok(r) => match r.failures.iter().find(|(s, _)| *s == id) {
                        Some((_, why)) => Outcome::Failed(why.clone()),
                        None => Outcome::Fixed,
                    },
                }
            };
            self.settle(f, outcome, report)?;
        }
        Ok(())
    }
}
