//! Consistency check of the volume layer's metadata: every reference counted, every count
//! matching its references, in memory and in the store, and no grain in a slab set that does
//! not exist. The tests run it after every scenario; the scan job will build on it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use tessera_pool::{decode_refcount, CF_GRAINS, CF_GRAINSETS, CF_POOL, CF_REFCOUNTS, CF_SLABSETS};

use crate::engine::Engine;
use crate::error::Result;
use crate::keys::{parse_grain_key, parse_grain_size, parse_loc};
use crate::space::{is_packed, loc_parts, slots_of};

/// What `pool check` found: the grain map and the reference counts agree, or the problems.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct CheckReport {
    pub grains_mapped: u64,
    pub slots_referenced: u64,
    pub problems: Vec<String>,
}

impl Engine {
    pub fn check(&self) -> Result<CheckReport> {
        let s = self.shared();
        let mut report = CheckReport::default();
        let mut expected: HashMap<u64, i64> = HashMap::new();
        let mut live_ids = Vec::new();
        for v in self.vdisks() {
            live_ids.push(v.id);
            let map = v.map.read();
            let mut stored: HashMap<u64, u64> = HashMap::new();
            let mut unreadable = 0u64;
            s.pool
                .meta()
                .for_each_prefix(CF_GRAINS, &v.id.to_be_bytes(), |k, val| {
                    match (parse_grain_key(k), parse_loc(val)) {
                        (Some((_, g)), Some(l)) => {
                            stored.insert(g, l);
                        }
                        // A key of the wrong length is named below, with every such key.
                        (Some(_), None) => unreadable += 1,
                        (None, _) => {}
                    }
                    Ok(())
                })?;
            if unreadable > 0 {
                report
                    .problems
                    .push(format!("{}: {unreadable} grain map record(s) cannot be read", v.name()));
            }
            let mut mapped = 0;
            for (g, e) in map.iter().enumerate() {
                let l = e.load(Ordering::Acquire);
                if stored.get(&(g as u64)).copied().unwrap_or(0) != l {
                    report.problems.push(format!(
                        "{} grain {g}: memory says {l:#x}, the store says {:#x}",
                        v.name(),
                        stored.get(&(g as u64)).copied().unwrap_or(0)
                    ));
                }
                if l != 0 {
                    mapped += 1;
                    for slot in slots_of(l) {
                        *expected.entry(slot).or_default() += 1;
                    }
                    let (set, slot) = loc_parts(l);
                    if is_packed(l) && s.space.slots(set).is_some() && !s.space.is_slot(l) {
                        report
                            .problems
                            .push(format!("{} grain {g} names a piece {l:#x} outside its slot", v.name()));
                    }
                    match s.space.slots(set) {
                        None => report.problems.push(format!(
                            "{} grain {g} points into slab set {set}, which does not exist",
                            v.name()
                        )),
                        Some(ss) if slot as usize >= ss.refs.len() => report
                            .problems
                            .push(format!("{} grain {g} points past the end of slab set {set}", v.name())),
                        _ => {}
                    }
                }
            }
            if stored.len() as u64 != mapped {
                report.problems.push(format!(
                    "{}: {} stored grain entries, {} mapped in memory",
                    v.name(),
                    stored.len(),
                    mapped
                ));
            }
            if mapped != v.mapped.load(Ordering::Relaxed) {
                report.problems.push(format!(
                    "{}: mapped counter {} but {} grains mapped",
                    v.name(),
                    v.mapped.load(Ordering::Relaxed),
                    mapped
                ));
            }
            report.grains_mapped += mapped;
        }
        // Each copy of a hot slot holds a reference on its slot and on the primary.
        let mut stored_pairs =
            crate::hot_copies::stored_pairs(|prefix, f| s.pool.meta().for_each_prefix(CF_POOL, prefix, f))?;
        stored_pairs.sort_unstable();
        let pairs = s.hot.pairs();
        if pairs != stored_pairs {
            report.problems.push(format!(
                "copies of hot slots: memory has {pairs:x?}, the store has {stored_pairs:x?}"
            ));
        }
        for (p, c) in pairs {
            *expected.entry(p).or_default() += 1;
            *expected.entry(c).or_default() += 1;
        }
        // The one check of data here: a copy that differs from its slot would hand a read
        // other bytes than the grain held.
        report.problems.extend(crate::hot_copies::mismatches(s));
        // Frozen images (copies in flight, tokens) hold references of their own, in memory
        // only.
        let mut held: HashMap<u64, i64> = HashMap::new();
        for l in s.frozen.held() {
            for slot in slots_of(l) {
                *held.entry(slot).or_default() += 1;
            }
        }
        // Vdisks left out because their record cannot be read: their grains are kept.
        let left_out: Vec<u64> = self.unreadable_vdisks().iter().map(|u| u.id).collect();
        for u in self.unreadable_vdisks() {
            report
                .problems
                .push(format!("vdisk id {} is left out: {}", u.id, u.error));
        }
        report.problems.extend(self.dedup_settings_unreadable());
        // Grain entries of vdisks that no longer exist would leak their slots.
        s.pool.meta().for_each_prefix(CF_GRAINS, &[], |k, v| {
            match parse_grain_key(k) {
                // Their references are counted as any others.
                Some((id, _)) if left_out.contains(&id) => {
                    for slot in parse_loc(v).into_iter().flat_map(slots_of) {
                        *expected.entry(slot).or_default() += 1;
                    }
                }
                Some((id, g)) if !live_ids.contains(&id) => report
                    .problems
                    .push(format!("grain entry {g} of vdisk id {id}, which does not exist")),
                Some(_) => {}
                None => report
                    .problems
                    .push(format!("a grain map record under a key of {} bytes", k.len())),
            }
            Ok(())
        })?;
        let mut stored_counts: HashMap<u64, i64> = HashMap::new();
        s.pool.meta().for_each_prefix(CF_REFCOUNTS, &[], |k, v| {
            match <[u8; 8]>::try_from(k) {
                Ok(k) if v.len() != 8 => report.problems.push(format!(
                    "the count record of slot {:#x} cannot be read ({} bytes)",
                    u64::from_be_bytes(k),
                    v.len()
                )),
                Ok(k) => {
                    let c = decode_refcount(v);
                    if c != 0 {
                        stored_counts.insert(u64::from_be_bytes(k), c);
                    }
                }
                Err(_) => report
                    .problems
                    .push(format!("a count record under a key of {} bytes", k.len())),
            }
            Ok(())
        })?;
        // The records of the slab sets themselves: one that cannot be read stops the next
        // import or would free its set.
        s.pool.meta().for_each_prefix(CF_GRAINSETS, &[], |k, v| {
            let running = <[u8; 4]>::try_from(k)
                .ok()
                .and_then(|id| s.space.slots(u32::from_be_bytes(id)))
                .map(|ss| ss.class.grain);
            match (parse_grain_size(v), running) {
                (None, _) => report
                    .problems
                    .push(format!("the grain size record {k:02x?} cannot be read: {v:02x?}")),
                (Some(g), Some(r)) if g != r => report
                    .problems
                    .push(format!("the grain size record {k:02x?} says {g}, the running pool {r}")),
                _ => {}
            }
            Ok(())
        })?;
        s.pool.meta().for_each_prefix(CF_SLABSETS, &[], |k, v| {
            if serde_json::from_slice::<tessera_layout::SlabSetDesc>(v).is_err() {
                report
                    .problems
                    .push(format!("the slab set descriptor {k:02x?} cannot be read"));
            }
            Ok(())
        })?;
        for ss in s.space.all_sets() {
            for (slot, r) in ss.refs.iter().enumerate() {
                let l = crate::space::loc(ss.set.id, slot as u32);
                let mem = r.load(Ordering::Acquire) as i64;
                let want = expected.get(&l).copied().unwrap_or(0);
                let frozen = held.get(&l).copied().unwrap_or(0);
                let disk = stored_counts.remove(&l).unwrap_or(0);
                if mem != want + frozen || disk != want {
                    report.problems.push(format!(
                        "slot {l:#x}: {want} reference(s) and {frozen} from frozen images, count in memory {mem}, in the store {disk}"
                    ));
                }
            }
        }
        for (l, c) in stored_counts {
            report.problems.push(format!(
                "slot {l:#x} of a slab set that does not exist has a stored count of {c}"
            ));
        }
        report.slots_referenced = expected.len() as u64;
        Ok(report)
    }
}
