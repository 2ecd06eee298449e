//! Writes the log held for slab sets that only disks able to come back keep from being
//! written (`Layouts::unrecoverable` but not `lost_for_good`: disks missing since the pool's
//! import, or taken out by an I/O error while it runs), parked in the pool's metadata.
//!
//! The open destages everything the log holds and begins a new log, which cannot carry the
//! old one's data; a set beyond its tolerance cannot take its share. While the pool runs, such
//! a set cannot take it either, and kept in the log it would hold the log's start back.
//! Dropped, those writes, answered as durable, would be lost for a disk that was only late or
//! blinked (a cable, an enclosure's power), so the destage parks them instead: each piece,
//! with the sequence number of the batch that held it, in a record of its own, saved before
//! the log's start moves past it. Reads and writes of a parked range are refused (the set's
//! disks hold older data) until the disks are back and the pieces written to the set, oldest
//! batch first; if a disk is failed instead, they are recorded lost (lost.rs) as the log's
//! data would have been.

use std::collections::BTreeMap;

use tessera_pool::{MetaBatch, Pool, CF_POOL};

use crate::error::Result;
use crate::lost::LostRanges;

const PREFIX: &[u8] = b"write-back-parked/";

/// One parked piece: slab set, batch sequence number, offset, data.
#[derive(Debug)]
pub(crate) struct Parked {
    pub set: u32,
    pub seq: u64,
    pub at: u64,
    pub data: Vec<u8>,
}

/// Set, then sequence number, then offset: a set's records in the order they are applied.
fn key(set: u32, seq: u64, at: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(PREFIX.len() + 20);
    k.extend_from_slice(PREFIX);
    k.extend_from_slice(&set.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(&at.to_be_bytes());
    k
}

fn set_prefix(set: u32) -> Vec<u8> {
    let mut k = PREFIX.to_vec();
    k.extend_from_slice(&set.to_be_bytes());
    k
}

pub(crate) fn put(b: &mut MetaBatch, p: &Parked) {
    b.put(CF_POOL, key(p.set, p.seq, p.at), &p.data);
}

/// Deletes every record of `set`.
pub(crate) fn delete_set(b: &mut MetaBatch, set: u32) {
    let from = set_prefix(set);
    let mut to = from.clone();
    to.extend_from_slice(&[0xff; 17]);
    b.delete_range(CF_POOL, from, to);
}

/// The keys of `set`'s records, oldest batch first, as (sequence number, offset): a set's
/// data is read one record at a time. And how many records cannot be read (their data
/// cannot be placed).
pub(crate) fn keys_of(pool: &Pool, set: u32) -> Result<(Vec<(u64, u64)>, usize)> {
    let (mut out, mut bad) = (Vec::new(), 0);
    pool.meta().for_each_prefix(CF_POOL, &set_prefix(set), |k, v| {
        match parse(k) {
            Some((_, seq, at)) if !v.is_empty() => out.push((seq, at)),
            _ => {
                tracing::error!(set, key = %tessera_pool::hex(k), "a record of the writes parked for a slab set cannot be read");
                bad += 1;
            }
        }
        Ok(())
    })?;
    Ok((out, bad))
}

/// The data of one record, if it is still there.
pub(crate) fn get(pool: &Pool, set: u32, seq: u64, at: u64) -> Result<Option<Vec<u8>>> {
    Ok(pool.meta().get(CF_POOL, &key(set, seq, at))?)
}

/// The ranges every record covers, per set (what reads and writes are refused over), and
/// the sets whose records cannot all be read (refused whole, until the settle makes them
/// lost).
pub(crate) fn load_ranges(pool: &Pool) -> Result<(LostRanges, Vec<u32>)> {
    let mut ranges = LostRanges::default();
    let mut unreadable: BTreeMap<u32, ()> = BTreeMap::new();
    pool.meta().for_each_prefix(CF_POOL, PREFIX, |k, v| {
        match parse(k) {
            Some((set, _, at)) if !v.is_empty() => ranges.insert(set, at, at + v.len() as u64),
            Some((set, _, _)) => {
                unreadable.insert(set, ());
            }
            None => {
                // Without its set the record cannot even be refused: it is one of a set.
                if let Some(set) = k.get(PREFIX.len()..PREFIX.len() + 4) {
                    unreadable.insert(u32::from_be_bytes(set.try_into().expect("4 bytes")), ());
                }
            }
        }
        Ok(())
    })?;
    Ok((ranges, unreadable.into_keys().collect()))
}

fn parse(k: &[u8]) -> Option<(u32, u64, u64)> {
    let k = k.strip_prefix(PREFIX)?;
    if k.len() != 20 {
        return None;
    }
    Some((
        u32::from_be_bytes(k[..4].try_into().ok()?),
        u64::from_be_bytes(k[4..12].try_into().ok()?),
        u64::from_be_bytes(k[12..].try_into().ok()?),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_a_sets_records_by_batch_then_offset() {
        let mut keys = [key(2, 9, 0), key(1, 10, 0), key(1, 9, 8192), key(1, 9, 4096)];
        keys.sort();
        let parsed: Vec<_> = keys.iter().map(|k| parse(k).unwrap()).collect();
        assert_eq!(parsed, vec![(1, 9, 4096), (1, 9, 8192), (1, 10, 0), (2, 9, 0)]);
        assert!(parse(&key(1, 2, 3)[..PREFIX.len() + 19]).is_none());
        assert!(
            key(1, u64::MAX, u64::MAX) < {
                let mut to = set_prefix(1);
                to.extend_from_slice(&[0xff; 17]);
                to
            }
        );
    }
}
