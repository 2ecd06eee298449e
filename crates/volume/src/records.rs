//! The space records read at import: each slot's reference count and each slab set's grain
//! size. A record that cannot be read (a key or value of the wrong length, a grain size no
//! set can have: a damaged store) is never taken for "nothing", which would hand out slots
//! that grains use or free a set that holds data: a count is counted again from the grain
//! map, a set's grain size is taken from the grains (and hot copies) that lie in it, and
//! what cannot be known stops the import with the record named.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tessera_pool::{
    decode_refcount, hex, refcount_delta, MetaBatch, MetaStore, CF_GRAINS, CF_GRAINSETS, CF_POOL, CF_REFCOUNTS,
};
use tracing::warn;

use crate::config::VdiskConfig;
use crate::error::{Result, VolumeError};
use crate::keys::{parse_grain_key, parse_grain_size, parse_loc, refcount_key};
use crate::space::{loc, loc_parts, slots_of, Loc};

/// Reference counts by slab set and slot.
pub type Counts = HashMap<u32, HashMap<u32, i64>>;

/// Counts again, and writes back whole, every reference count whose record cannot be read
/// (the grain map's references and the hot copies'), or holds a count no slot can have (below
/// zero, or past 32 bits: taken as it is, either would leave a slot that grains use free).
/// First thing at import, before anything moves a count.
pub fn mend_counts(meta: &MetaStore) -> Result<()> {
    let mut unreadable: HashMap<Loc, i64> = HashMap::new();
    meta.for_each_prefix(CF_REFCOUNTS, &[], |k, v| {
        let possible = v.len() == 8 && (0..=u32::MAX as i64).contains(&decode_refcount(v));
        if let (Ok(k), false) = (<[u8; 8]>::try_from(k), possible) {
            unreadable.insert(u64::from_be_bytes(k), 0);
        }
        Ok(())
    })?;
    if unreadable.is_empty() {
        return Ok(());
    }
    meta.for_each_prefix(CF_GRAINS, &[], |k, v| {
        if let (Some(_), Some(l)) = (parse_grain_key(k), parse_loc(v)) {
            for s in slots_of(l) {
                if let Some(n) = unreadable.get_mut(&s) {
                    *n += 1;
                }
            }
        }
        Ok(())
    })?;
    for (p, c) in hot_pairs(meta)? {
        for s in [p, c] {
            if let Some(n) = unreadable.get_mut(&s) {
                *n += 1;
            }
        }
    }
    let mut b = MetaBatch::new();
    for (&slot, &n) in &unreadable {
        b.put(CF_REFCOUNTS, refcount_key(slot), refcount_delta(n));
    }
    meta.commit(b, true)?;
    warn!(
        records = unreadable.len(),
        "reference count records that could not be read were counted again from the grain map and written back"
    );
    Ok(())
}

fn hot_pairs(meta: &MetaStore) -> Result<Vec<(Loc, Loc)>> {
    crate::hot_copies::stored_pairs(|prefix, f| meta.for_each_prefix(CF_POOL, prefix, f))
}

/// Every slot's reference count, once [`mend_counts`] made each readable.
pub fn load_counts(meta: &MetaStore) -> Result<Counts> {
    let mut counts: Counts = HashMap::new();
    let mut bad_keys = 0u64;
    meta.for_each_prefix(CF_REFCOUNTS, &[], |k, v| {
        match <[u8; 8]>::try_from(k) {
            Ok(k) => {
                let (set, slot) = loc_parts(u64::from_be_bytes(k));
                counts.entry(set).or_default().insert(slot, decode_refcount(v));
            }
            Err(_) => bad_keys += 1,
        }
        Ok(())
    })?;
    if bad_keys > 0 {
        warn!(
            records = bad_keys,
            "reference count records under keys of the wrong length: they count for nothing; 'tessera pool scan' names them, spot-fix removes them"
        );
    }
    Ok(counts)
}

/// Each slab set's grain size. A set whose record cannot be read takes the grain size of
/// the grains that lie in it (their vdisks') or of the grains its hot copies copy, written
/// back. A set in which nothing lies holds no data: its counts, if any, are orphans, and it
/// is left without a record (the import frees it, as a set an interrupted allocation made).
/// Grain sizes that disagree stop the import.
pub fn load_grainsets(meta: &MetaStore, vdisks: &[VdiskConfig], counts: &Counts) -> Result<HashMap<u32, u64>> {
    let mut sets = HashMap::new();
    let mut unreadable: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut drop = MetaBatch::new();
    meta.for_each_prefix(CF_GRAINSETS, &[], |k, v| {
        match (<[u8; 4]>::try_from(k), parse_grain_size(v)) {
            (Ok(id), Some(g)) => {
                sets.insert(u32::from_be_bytes(id), g);
            }
            (Ok(id), None) => {
                unreadable.insert(u32::from_be_bytes(id), v.to_vec());
            }
            // Under no set's key: it names nothing.
            (Err(_), _) => drop.delete(CF_GRAINSETS, k),
        }
        Ok(())
    })?;
    if !drop.is_empty() {
        warn!(
            records = drop.len(),
            "grain size records under keys of the wrong length removed"
        );
        meta.commit(drop, true)?;
    }
    if unreadable.is_empty() {
        return Ok(sets);
    }
    let grain_of: HashMap<u64, u64> = vdisks.iter().map(|c| (c.id, c.grain_size)).collect();
    let mut seen: BTreeMap<u32, BTreeSet<u64>> = unreadable.keys().map(|&id| (id, BTreeSet::new())).collect();
    // Sets that hold grains of a vdisk whose record cannot be read (whose size is not known):
    // never taken for empty.
    let mut unknown: BTreeSet<u32> = BTreeSet::new();
    meta.for_each_prefix(CF_GRAINS, &[], |k, v| {
        if let (Some((vdisk, _)), Some(l)) = (parse_grain_key(k), parse_loc(v)) {
            let set = loc_parts(l).0;
            if let Some(sizes) = seen.get_mut(&set) {
                match grain_of.get(&vdisk) {
                    Some(&g) => {
                        sizes.insert(g);
                    }
                    None => {
                        unknown.insert(set);
                    }
                }
            }
        }
        Ok(())
    })?;
    // A hot copy is a slot of its primary's class, whose size may itself have been learnt
    // from its grains just now: pairs are gone through again until nothing more is learnt.
    let pairs: Vec<(u32, u32)> = hot_pairs(meta)?
        .into_iter()
        .map(|(p, c)| (loc_parts(p).0, loc_parts(c).0))
        .collect();
    loop {
        let known = |set: u32, seen: &BTreeMap<u32, BTreeSet<u64>>| match seen.get(&set) {
            Some(sizes) if sizes.len() == 1 => sizes.first().copied(),
            Some(_) => None,
            None => sets.get(&set).copied(),
        };
        let mut learnt = false;
        for &(p, c) in &pairs {
            for (from, to) in [(p, c), (c, p)] {
                if let (Some(g), true) = (known(from, &seen), seen.contains_key(&to)) {
                    learnt |= seen.get_mut(&to).expect("checked").insert(g);
                }
            }
        }
        if !learnt {
            break;
        }
    }
    let mut b = MetaBatch::new();
    for (id, sizes) in seen {
        let found = hex(&unreadable[&id]);
        match sizes.into_iter().collect::<Vec<_>>()[..] {
            [g] => {
                warn!(set = id, grain = g, found = %found, "a slab set's grain size record could not be read; taken from the grains that lie in it");
                b.put(CF_GRAINSETS, id.to_be_bytes(), g.to_le_bytes());
                sets.insert(id, g);
            }
            // Grains of a vdisk left out for its unreadable record lie in it: it holds data.
            [] if unknown.contains(&id) => {
                return Err(VolumeError::Invalid(format!(
                    "slab set {id}: its grain size record ({found}, hex) cannot be read, and only grains of vdisks whose records cannot be read either lie in it; the pool is not opened, so that nothing is freed or overwritten"
                )))
            }
            // Named by a hot copy whose other slot's size is not known either: it holds data.
            [] if pairs.iter().any(|&(p, c)| p == id || c == id) => {
                return Err(VolumeError::Invalid(format!(
                    "slab set {id}: its grain size record ({found}, hex) cannot be read, and only a hot copy, whose other set's size is not known either, lies in it; the pool is not opened, so that nothing is freed or overwritten"
                )))
            }
            [] => {
                let orphans = counts.get(&id).map(|c| c.values().filter(|&&n| n != 0).count()).unwrap_or(0);
                warn!(set = id, found = %found, counted_slots = orphans, "a slab set's grain size record could not be read, and no grain lies in it: it holds no data and is freed");
                b.delete(CF_GRAINSETS, id.to_be_bytes());
                for &slot in counts.get(&id).into_iter().flat_map(|c| c.keys()) {
                    b.delete(CF_REFCOUNTS, refcount_key(loc(id, slot)));
                }
            }
            ref sizes => {
                return Err(VolumeError::Invalid(format!(
                    "slab set {id}: its grain size record ({found}, hex) cannot be read, and the grains that lie in it have sizes {sizes:?} (grains in the wrong set besides); the pool is not opened, so that nothing is freed or overwritten"
                )))
            }
        }
    }
    meta.commit(b, true)?;
    Ok(sets)
}
