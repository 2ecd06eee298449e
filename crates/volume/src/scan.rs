//! The online metadata scan: the pool's metadata checked against itself while every vdisk
//! goes on serving. It reads a snapshot of the metadata store, so it sees one instant: every
//! change is one atomic batch that moves a grain map entry and the reference counts it touches
//! together, so at any instant each count equals the entries that point at its slot, and
//! whatever disagrees in the snapshot is damage, never a write caught half way. (References
//! held by copies in flight live in memory only and are not part of the durable counts.)
//!
//! Memory is one counter per slot of every slab set (4 bytes per slot); time is one pass over
//! the grain map and one over the counts, plus a second pass over the grain map only when a
//! slot that grains refer to has a wrong count (to name those grains for spot-fix).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::Instant;

use tessera_layout::ranges::ByteRanges;
use tessera_layout::{LayoutSpec, Progress, SlabSetDesc};
use tessera_pool::{
    decode_refcount, hex, MetaBatch, MetaSnapshot, CF_FINDINGS, CF_GRAINS, CF_GRAINSETS, CF_POOL, CF_REFCOUNTS,
    CF_SLABSETS, CF_VDISKS,
};
use tracing::{info, warn};

use crate::engine::Engine;
use crate::error::{Result, VolumeError};
use crate::findings::{encode, finding_key, save_report, Finding, FindingKind, FindingStatus, Repair, ScanReport};
use crate::keys::{parse_grain_key, parse_grain_size, parse_loc};
use crate::space::{loc_parts, piece_of, slots_of, Class, PACK_UNITS};

/// Grains named per wrong count, at most: enough for spot-fix to check that they still point
/// there, without holding every referrer of a much-shared slot.
const MAX_REFERRERS: usize = 16;
/// Findings written per batch.
const WRITE_BATCH: usize = 16384;

struct SetInfo {
    class: Class,
    refs: Vec<u32>,
    /// What the set lost beyond repair (its descriptor's record).
    lost: ByteRanges,
}

struct VdiskInfo {
    class: Class,
    grains: u64,
}

/// What the scan has counted and found so far.
struct Tally {
    sets: HashMap<u32, SetInfo>,
    vdisks: HashMap<u64, VdiskInfo>,
    dangling: BTreeMap<u64, u64>,
    /// Vdisk ids whose record cannot be read, and their grain map entries.
    unreadable_vdisks: BTreeMap<u64, u64>,
    findings: Vec<(FindingKind, Repair)>,
    grains: u64,
    counted: u64,
    /// Grain map records that cannot be read and name no grain of a running vdisk.
    unresolved: u64,
}

impl Tally {
    /// Counts one reference to `l`; false if `l` is no slot of a known set. Such a reference
    /// is not counted: it is wrong in itself (its entry is a finding), and the count of a
    /// place that is no slot should be 0.
    fn count(&mut self, l: u64) -> bool {
        let slots: Vec<u64> = slots_of(l).collect();
        let known = slots.iter().all(|&x| {
            let (set, slot) = loc_parts(x);
            self.sets.get(&set).is_some_and(|s| (slot as usize) < s.refs.len())
        });
        if known {
            for x in slots {
                let (set, slot) = loc_parts(x);
                self.sets.get_mut(&set).expect("known").refs[slot as usize] += 1;
            }
        }
        known
    }

    /// The references counted to `l`, forgotten so that what remains at the end are the
    /// slots with references and no count record.
    fn take(&mut self, l: u64) -> u64 {
        let (set, slot) = loc_parts(l);
        match self.sets.get_mut(&set).and_then(|s| s.refs.get_mut(slot as usize)) {
            Some(r) => std::mem::take(r) as u64,
            None => 0,
        }
    }

    /// The bytes of a grain held at `l` (which starts at byte `at` of its vdisk) that its set
    /// lost beyond repair, as byte ranges of the vdisk; None if none. A grain stored
    /// compressed (a piece of a pack slot) is lost whole when any byte of its units is.
    fn lost_in(&self, l: u64, at: u64) -> Option<Vec<(u64, u64)>> {
        let (set, slot) = loc_parts(l);
        let s = self.sets.get(&set).filter(|s| !s.lost.is_empty())?;
        let g = s.class.grain;
        let bytes: Vec<(u64, u64)> = match piece_of(l) {
            Some((first, units)) => {
                let unit = g / PACK_UNITS;
                let start = slot as u64 * g + first as u64 * unit;
                let end = start + units as u64 * unit;
                if s.lost.within(start, end).is_empty() {
                    Vec::new()
                } else {
                    vec![(at, at + g)]
                }
            }
            None => {
                let start = slot as u64 * g;
                s.lost
                    .within(start, start + g)
                    .into_iter()
                    .map(|(a, b)| (at + a - start, at + b - start))
                    .collect()
            }
        };
        (!bytes.is_empty()).then_some(bytes)
    }

    fn set_class(&self, l: u64) -> Option<Class> {
        let (set, slot) = loc_parts(l);
        self.sets
            .get(&set)
            .filter(|s| (slot as usize) < s.refs.len())
            .map(|s| s.class)
    }
}

/// A record nothing can be made of, and its repair: removed if it still holds what was seen.
fn drop_record(family: &str, key: &[u8], found: &[u8]) -> (FindingKind, Repair) {
    (
        FindingKind::RecordMalformed,
        Repair::DropRecord {
            family: family.to_string(),
            key: hex(key),
            found: hex(found),
        },
    )
}

/// Counts `n` more records done; an error once the job is cancelled (which the caller turns
/// into `Cancelled`).
fn tick(progress: &Progress, n: u64) -> tessera_pool::Result<()> {
    progress.done_bytes.fetch_add(n, Ordering::Relaxed);
    if progress.cancel.load(Ordering::Relaxed) {
        return Err(tessera_pool::PoolError::Meta {
            path: String::new(),
            message: "cancelled".into(),
        });
    }
    Ok(())
}

/// A pass's error, or `Cancelled` when it stopped because the job was cancelled.
fn cancelled_or(progress: &Progress, e: tessera_pool::PoolError) -> VolumeError {
    if progress.cancel.load(Ordering::Relaxed) {
        VolumeError::Layout(tessera_layout::LayoutError::Cancelled)
    } else {
        e.into()
    }
}

impl Engine {
    /// Scans the pool's metadata while it serves, keeps the findings in the pool (replacing
    /// the last scan's) and returns the summary. `progress` counts metadata records.
    pub fn scan(&self, progress: &Progress) -> Result<ScanReport> {
        let Some(_one) = self.metadata_job.try_lock() else {
            return Err(VolumeError::Invalid(format!(
                "pool '{}' has a scan or spot-fix running already",
                self.pool().name()
            )));
        };
        let started_at = crate::scrub::unix_now();
        let t0 = Instant::now();
        let s = self.shared();
        // The layout layer's findings first: its audit checkpoints the stripe journal.
        let layout = s.layouts.audit()?;
        let meta = s.pool.meta();
        let snap = meta.snapshot();
        progress.done_bytes.store(0, Ordering::Relaxed);
        progress.total_bytes.store(
            snap.estimate_keys(CF_GRAINS) + snap.estimate_keys(CF_REFCOUNTS),
            Ordering::Relaxed,
        );
        let mut t = self.load_space(&snap)?;
        self.scan_grains(&snap, &mut t, progress)?;
        // Each copy of a hot slot holds a reference on its slot and on the primary.
        for (p, c) in crate::hot_copies::stored_pairs(|prefix, f| snap.for_each_prefix(CF_POOL, prefix, f))? {
            t.count(p);
            t.count(c);
        }
        let wrong_with_refs = Self::scan_counts(&snap, &mut t, progress)?;
        if !wrong_with_refs.is_empty() {
            Self::name_referrers(&snap, &mut t, wrong_with_refs)?;
        }
        if t.unresolved > 0 {
            // A count lowered to what the readable records give could free a slot that an
            // unreadable one still names: only raising is safe until those are removed.
            let before = t.findings.len();
            t.findings.retain(
                |(_, r)| !matches!(r, Repair::SetCount { stored, references, .. } if (*references as i64) < *stored),
            );
            warn!(pool = %s.pool.name(), unreadable = t.unresolved, withheld = before - t.findings.len(), "grain map records that name no running vdisk's grain cannot be read; findings that would lower a count are withheld until spot-fix removed them and a scan runs again");
        }
        for (vdisk, entries) in std::mem::take(&mut t.dangling) {
            t.findings
                .push((FindingKind::DanglingGrains, Repair::DropEntries { vdisk, entries }));
        }
        for (vdisk, grains) in std::mem::take(&mut t.unreadable_vdisks) {
            t.findings
                .push((FindingKind::RecordMalformed, Repair::VdiskRecord { vdisk, grains }));
        }
        for finding in layout {
            let kind = match &finding {
                tessera_layout::LayoutFinding::MemberLost { .. } => FindingKind::SetMemberLost,
                tessera_layout::LayoutFinding::JournalStale { .. } => FindingKind::JournalStale,
                tessera_layout::LayoutFinding::RegionUnsynced { .. } => FindingKind::RegionUnsynced,
            };
            t.findings.push((kind, Repair::Layout { finding }));
        }
        drop(snap);

        let mut report = ScanReport {
            started_at,
            vdisks: t.vdisks.len() as u64,
            grains: t.grains,
            counted_slots: t.counted,
            slab_sets: t.sets.len() as u64,
            findings: t.findings.len() as u64,
            ..Default::default()
        };
        for (kind, _) in &t.findings {
            *report.by_kind.entry(*kind).or_default() += 1;
        }
        report.finished_at = crate::scrub::unix_now();
        report.seconds = t0.elapsed().as_secs_f64();
        self.keep_findings(t.findings, &report)?;
        if report.findings > 0 {
            warn!(pool = %s.pool.name(), findings = report.findings, kinds = ?report.by_kind, "metadata scan found problems; 'tessera pool spotfix' repairs them");
        } else {
            info!(pool = %s.pool.name(), grains = report.grains, secs = report.seconds, "metadata scan found nothing wrong");
        }
        Ok(report)
    }

    /// The slab sets that hold grains and the vdisks, as of the snapshot.
    fn load_space(&self, snap: &MetaSnapshot) -> Result<Tally> {
        let slab = self.pool().slab_size();
        let mut findings = Vec::new();
        // Sets with a record that cannot be read: judged from memory, never as absent (their
        // grains would be taken for dangling references and unmapped).
        let mut unreadable = std::collections::BTreeSet::new();
        let mut specs: HashMap<u32, (LayoutSpec, ByteRanges)> = HashMap::new();
        snap.for_each_prefix(CF_SLABSETS, &[], |k, v| {
            match serde_json::from_slice::<SlabSetDesc>(v) {
                Ok(d) => {
                    specs.insert(d.id, (d.spec, d.lost));
                }
                Err(_) => match <[u8; 4]>::try_from(k) {
                    Ok(id) => {
                        unreadable.insert(u32::from_be_bytes(id));
                    }
                    Err(_) => findings.push(drop_record(CF_SLABSETS, k, v)),
                },
            }
            Ok(())
        })?;
        let mut sets = HashMap::new();
        snap.for_each_prefix(CF_GRAINSETS, &[], |k, v| {
            let Ok(id) = k.try_into().map(u32::from_be_bytes) else {
                findings.push(drop_record(CF_GRAINSETS, k, v));
                return Ok(());
            };
            let running = self.shared().space.slots(id).map(|ss| ss.class.grain);
            match parse_grain_size(v).filter(|&g| running.is_none_or(|r| r == g)) {
                Some(grain) => {
                    if let Some((layout, lost)) = specs.remove(&id) {
                        let slots = (layout.set_capacity(slab) / grain) as usize;
                        sets.insert(
                            id,
                            SetInfo {
                                class: Class { layout, grain },
                                refs: vec![0; slots],
                                lost,
                            },
                        );
                    }
                }
                // Unreadable, or not what the running pool holds for the set.
                None => {
                    unreadable.insert(id);
                }
            }
            Ok(())
        })?;
        for id in unreadable {
            if let Some(ss) = self.shared().space.slots(id) {
                sets.insert(
                    id,
                    SetInfo {
                        class: ss.class,
                        refs: vec![0; ss.refs.len()],
                        lost: ByteRanges::default(),
                    },
                );
            }
            findings.push((FindingKind::RecordMalformed, Repair::RewriteSet { set: id }));
        }
        let mut vdisks = HashMap::new();
        let mut unreadable_vdisks = BTreeMap::new();
        snap.for_each_prefix(CF_VDISKS, &[], |k, v| {
            let Ok(id) = <[u8; 8]>::try_from(k).map(u64::from_be_bytes) else {
                return Ok(());
            };
            // A record that cannot be read leaves its vdisk out of the pool, not its grains:
            // they are kept (counted, never dangling) until the record is put right.
            match crate::engine::vdisk_record(id, v).ok() {
                None => {
                    unreadable_vdisks.insert(id, 0);
                }
                Some(c) => {
                    vdisks.insert(
                        c.id,
                        VdiskInfo {
                            class: Class {
                                layout: c.layout,
                                grain: c.grain_size,
                            },
                            grains: c.grains(),
                        },
                    );
                }
            }
            Ok(())
        })?;
        Ok(Tally {
            sets,
            vdisks,
            dangling: BTreeMap::new(),
            unreadable_vdisks,
            findings,
            grains: 0,
            counted: 0,
            unresolved: 0,
        })
    }

    /// Counts every grain map entry's reference and judges the entry.
    fn scan_grains(&self, snap: &MetaSnapshot, t: &mut Tally, progress: &Progress) -> Result<()> {
        let mut n = 0u64;
        snap.for_each_prefix(CF_GRAINS, &[], |k, v| {
            n += 1;
            if n % 65536 == 0 {
                tick(progress, 65536)?;
            }
            let (Some((vdisk, grain)), Some(slot)) = (parse_grain_key(k), parse_loc(v)) else {
                // A running vdisk that maps the grain holds its reference (the record was
                // damaged under it; spot-fix writes it again from memory): counted, or its
                // slot would be judged free. One that names no grain of a running vdisk (a
                // key cut short, a vdisk being deleted) may hold a reference nobody can tell.
                match parse_grain_key(k).and_then(|(id, g)| Some(self.vdisk_by_id(id)?.entry(g))) {
                    Some(0) => {}
                    Some(l) => {
                        t.count(l);
                    }
                    None => t.unresolved += 1,
                }
                t.findings.push(drop_record(CF_GRAINS, k, v));
                return Ok(());
            };
            t.grains += 1;
            let in_space = t.count(slot);
            let Some(vi) = t.vdisks.get(&vdisk) else {
                match t.unreadable_vdisks.get_mut(&vdisk) {
                    Some(n) => *n += 1,
                    None => *t.dangling.entry(vdisk).or_default() += 1,
                }
                return Ok(());
            };
            let unmap = Repair::Unmap { vdisk, grain, slot };
            if grain >= vi.grains {
                t.findings.push((FindingKind::GrainBeyondEnd, unmap));
            } else if !in_space {
                t.findings.push((FindingKind::GrainOutsideSpace, unmap));
            } else if t.set_class(slot) != Some(vi.class) {
                t.findings
                    .push((FindingKind::GrainWrongClass, Repair::Recopy { vdisk, grain, slot }));
            } else if let Some(bytes) = t.lost_in(slot, grain * vi.class.grain) {
                t.findings.push((
                    FindingKind::DataLost,
                    Repair::Restore {
                        vdisk,
                        grain,
                        slot,
                        bytes,
                    },
                ));
            }
            Ok(())
        })
        .map_err(|e| cancelled_or(progress, e))?;
        tick(progress, n % 65536).map_err(|e| cancelled_or(progress, e))
    }

    /// Compares every count record with the references counted. Returns the findings (by
    /// index) of wrong counts of slots that grains refer to.
    fn scan_counts(snap: &MetaSnapshot, t: &mut Tally, progress: &Progress) -> Result<HashMap<u64, usize>> {
        let mut wrong_with_refs = HashMap::new();
        let mut n = 0u64;
        snap.for_each_prefix(CF_REFCOUNTS, &[], |k, v| {
            n += 1;
            if n % 65536 == 0 {
                tick(progress, 65536)?;
            }
            let Ok(slot) = <[u8; 8]>::try_from(k).map(u64::from_be_bytes) else {
                t.findings.push(drop_record(CF_REFCOUNTS, k, v));
                return Ok(());
            };
            let references = t.take(slot);
            // Kept as it is by every change (`tessera_pool::counted`) until the next import
            // counts it again; memory, moved by every change, holds it right meanwhile.
            if v.len() != 8 {
                t.findings
                    .push((FindingKind::RecordMalformed, Repair::Recount { slot }));
                return Ok(());
            }
            let stored = decode_refcount(v);
            if stored != 0 {
                t.counted += 1;
            }
            if stored != references as i64 {
                if references > 0 {
                    wrong_with_refs.insert(slot, t.findings.len());
                }
                t.findings.push((
                    if references == 0 {
                        FindingKind::OrphanSlot
                    } else {
                        FindingKind::RefcountWrong
                    },
                    Repair::SetCount {
                        slot,
                        stored,
                        references,
                        referrers: Vec::new(),
                    },
                ));
            }
            Ok(())
        })
        .map_err(|e| cancelled_or(progress, e))?;
        tick(progress, n % 65536).map_err(|e| cancelled_or(progress, e))?;
        // References to slots with no count record at all: counted as 0, so free to take.
        let mut uncounted: Vec<(u64, u64)> = t
            .sets
            .iter()
            .flat_map(|(&set, si)| {
                si.refs
                    .iter()
                    .enumerate()
                    .filter(|(_, &r)| r > 0)
                    .map(move |(slot, &r)| (crate::space::loc(set, slot as u32), r as u64))
            })
            .collect();
        uncounted.sort_unstable();
        for (slot, references) in uncounted {
            wrong_with_refs.insert(slot, t.findings.len());
            t.findings.push((
                FindingKind::RefcountWrong,
                Repair::SetCount {
                    slot,
                    stored: 0,
                    references,
                    referrers: Vec::new(),
                },
            ));
        }
        Ok(wrong_with_refs)
    }

    /// Names some of the grains that refer to each slot with a wrong count.
    fn name_referrers(snap: &MetaSnapshot, t: &mut Tally, wanted: HashMap<u64, usize>) -> Result<()> {
        snap.for_each_prefix(CF_GRAINS, &[], |k, v| {
            if let (Some(g), Some(l)) = (parse_grain_key(k), parse_loc(v)) {
                if let Some(&i) = wanted.get(&l) {
                    if let Repair::SetCount { referrers, .. } = &mut t.findings[i].1 {
                        if referrers.len() < MAX_REFERRERS {
                            referrers.push(g);
                        }
                    }
                }
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Replaces the kept findings with these, numbered from 1, and the report.
    fn keep_findings(&self, findings: Vec<(FindingKind, Repair)>, report: &ScanReport) -> Result<()> {
        let meta = self.pool().meta();
        let mut b = MetaBatch::new();
        b.delete_range(CF_FINDINGS, finding_key(0), finding_key(u64::MAX));
        for (i, (kind, repair)) in findings.into_iter().enumerate() {
            let f = Finding {
                id: i as u64 + 1,
                kind,
                repair,
                status: FindingStatus::Open,
                note: None,
            };
            b.put(CF_FINDINGS, finding_key(f.id), encode(&f));
            if b.len() >= WRITE_BATCH {
                meta.commit(std::mem::take(&mut b), false)?;
            }
        }
        save_report(&mut b, report);
        meta.commit(b, true)?;
        Ok(())
    }
}

impl Engine {
    /// The last scan's summary (with the last spot-fix's), if the pool was ever scanned.
    pub fn scan_report(&self) -> Result<Option<ScanReport>> {
        crate::findings::load_report(self.pool().meta())
    }

    /// When the pool's scan schedule started counting, if it did (`scan_schedule_from`,
    /// `put_off_scan`); the end of a later scan counts instead.
    pub fn scan_scheduled_from(&self) -> Result<Option<u64>> {
        crate::findings::load_schedule_from(self.pool().meta())
    }

    /// The next scheduled scan counts from `now` (a scan the administrator stopped: not
    /// started again at once).
    pub fn put_off_scan(&self, now: u64) -> Result<()> {
        let mut b = MetaBatch::new();
        crate::findings::save_schedule_from(&mut b, now);
        self.pool().meta().commit(b, true)?;
        Ok(())
    }

    /// When a pool that has never been scanned started counting its scan schedule: `now` the
    /// first time this is asked (kept in the pool, so that a restart does not put it off).
    pub fn scan_schedule_from(&self, now: u64) -> Result<u64> {
        let meta = self.pool().meta();
        if let Some(t) = self.scan_scheduled_from()? {
            return Ok(t);
        }
        let mut b = MetaBatch::new();
        crate::findings::save_schedule_from(&mut b, now);
        meta.commit(b, true)?;
        Ok(now)
    }

    /// The findings kept, from id `after` on, at most `limit`, in words.
    pub fn findings(&self, after: u64, limit: usize) -> Result<Vec<crate::findings::FindingView>> {
        let names: HashMap<u64, String> = self.vdisks().iter().map(|v| (v.id, v.name())).collect();
        let name = |id: u64| names.get(&id).cloned().unwrap_or_else(|| format!("vdisk id {id}"));
        Ok(crate::findings::load_findings(self.pool().meta(), after, limit)?
            .iter()
            .map(|f| f.view(&name))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{loc, packed_loc};

    /// A tally of one set of 64 KiB grains whose bytes `lost` are lost.
    fn tally(lost: &[(u64, u64)]) -> Tally {
        let mut ranges = ByteRanges::default();
        for &(a, b) in lost {
            ranges.insert(a, b);
        }
        let layout = LayoutSpec {
            kind: tessera_layout::LayoutKind::Parity,
            copies: 1,
            columns: 3,
            interleave: 64 << 10,
        };
        let sets = HashMap::from([(
            7,
            SetInfo {
                class: Class {
                    layout,
                    grain: 64 << 10,
                },
                refs: vec![0; 16],
                lost: ranges,
            },
        )]);
        Tally {
            sets,
            vdisks: HashMap::new(),
            dangling: BTreeMap::new(),
            unreadable_vdisks: BTreeMap::new(),
            findings: Vec::new(),
            grains: 0,
            counted: 0,
            unresolved: 0,
        }
    }

    /// A plain grain reports the lost bytes of its slot, placed in the vdisk; a compressed
    /// one (a piece of a pack slot, which may run on into the next slot) is lost whole when
    /// any byte of its units is, and not when the lost bytes lie outside them.
    #[test]
    fn lost_bytes_of_a_grain_are_placed_in_its_vdisk() {
        const G: u64 = 64 << 10;
        let t = tally(&[(2 * G + 4096, 2 * G + 8192), (5 * G - 4096, 5 * G + 4096)]);
        assert_eq!(t.lost_in(loc(7, 2), 10 * G), Some(vec![(10 * G + 4096, 10 * G + 8192)]));
        assert_eq!(t.lost_in(loc(7, 3), 0), None);
        assert_eq!(t.lost_in(loc(7, 4), G), Some(vec![(2 * G - 4096, 2 * G)]));
        assert_eq!(t.lost_in(loc(8, 2), 0), None, "a set with nothing lost");
        let unit = G / PACK_UNITS;
        // Units 16..32 of slot 2 hold bytes 4096..8192 of it: lost whole.
        let hit = packed_loc(7, 2, 16, 16).unwrap();
        assert_eq!(t.lost_in(hit, 3 * G), Some(vec![(3 * G, 4 * G)]));
        let beside = packed_loc(7, 2, 32, 16).unwrap();
        assert_eq!(t.lost_in(beside, 3 * G), None);
        // Units from the end of slot 4 into slot 5 reach the lost bytes of slot 5.
        let runs_on = packed_loc(7, 4, 250, 10).unwrap();
        assert!(4 * G + 250 * unit + 10 * unit > 5 * G);
        assert_eq!(t.lost_in(runs_on, 0), Some(vec![(0, G)]));
    }
}
