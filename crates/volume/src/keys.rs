//! Keys and values of the volume layer's records in the metadata store.

use tessera_pool::{MetaBatch, CF_REFCOUNTS};

use crate::space::{slot_of, slots_of, Loc};

pub fn vdisk_key(id: u64) -> Vec<u8> {
    id.to_be_bytes().to_vec()
}

/// Grain map entry: vdisk id then grain index, big endian, so a vdisk's map is one key range
/// in grain order.
pub fn grain_key(vdisk: u64, grain: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&vdisk.to_be_bytes());
    k.extend_from_slice(&grain.to_be_bytes());
    k
}

pub fn parse_grain_key(k: &[u8]) -> Option<(u64, u64)> {
    if k.len() != 16 {
        return None;
    }
    Some((
        u64::from_be_bytes(k[..8].try_into().ok()?),
        u64::from_be_bytes(k[8..].try_into().ok()?),
    ))
}

pub fn loc_value(l: Loc) -> Vec<u8> {
    l.to_le_bytes().to_vec()
}

pub fn parse_loc(v: &[u8]) -> Option<Loc> {
    Some(u64::from_le_bytes(v.try_into().ok()?))
}

/// A slot's reference count; a piece of a pack slot counts against its slot.
pub fn refcount_key(l: Loc) -> Vec<u8> {
    slot_of(l).to_be_bytes().to_vec()
}

/// Moves by `delta` the counts of the slots a grain pointing at `l` holds (two for a piece
/// that runs on into the next slot).
pub fn count_refs(b: &mut MetaBatch, l: Loc, delta: i64) {
    for slot in slots_of(l) {
        b.count(CF_REFCOUNTS, refcount_key(slot), delta);
    }
}

/// A slab set's grain size record, if it holds one a set can have.
pub fn parse_grain_size(v: &[u8]) -> Option<u64> {
    let g = u64::from_le_bytes(v.try_into().ok()?);
    crate::config::grain_size_ok(g).then_some(g)
}
