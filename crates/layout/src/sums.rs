//! Block checksums: a CRC32C of every 4 KiB block of every member slab, data and parity alike.
//!
//! They are kept by physical slab (disk, slab), not by slab set, so that a member rebuilt onto
//! a new slab gets its checksums from the writes that fill it, and a slab given back loses
//! them. In memory they live in pages of 512 blocks (2 MiB of member space, 2 KiB of sums);
//! on disk, in a column family of the stripe journal's RocksDB, so that a checkpoint writes
//! the pages changed since the last one in the same batch that retires the journal records:
//! a region either still has its `Dirty` record (and a replay settles its checksums against
//! its data, see `Layouts::resync_region`), or its data was flushed and its checksums are
//! durable. A block whose checksum was never recorded (written before checksums, or never
//! written) is *unknown*: it reads unverified, and a write or a scrub records it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockWriteGuard};
use rocksdb::{WriteBatch, WriteOptions, DB};
use tessera_pool::SlabRef;

use crate::error::{LayoutError, Result};

/// Bytes of member space covered by one checksum.
pub const BLOCK: u64 = 4096;
const PAGE_BLOCKS: u64 = 512;
const PAGE_BYTES: u64 = BLOCK * PAGE_BLOCKS;
const SHARDS: usize = 64;
/// Pages kept in memory (2.1 KiB each, for 2 MiB of member space): 64 Ki pages hold the
/// checksums of 128 GiB of member space. Clean pages past this are dropped and read again
/// from the store when needed; pages changed since the last checkpoint always stay.
const CACHED_PAGES: usize = 1 << 16;
pub(crate) const CF_SUMS: &str = "sums";

type Key = (u32, u32, u32);

#[derive(Clone)]
struct Page {
    known: [u64; (PAGE_BLOCKS / 64) as usize],
    sums: [u32; PAGE_BLOCKS as usize],
    dirty: bool,
}

impl Page {
    fn empty() -> Page {
        Page {
            known: [0; (PAGE_BLOCKS / 64) as usize],
            sums: [0; PAGE_BLOCKS as usize],
            dirty: false,
        }
    }

    fn get(&self, i: usize) -> Option<u32> {
        (self.known[i / 64] >> (i % 64) & 1 == 1).then_some(self.sums[i])
    }

    fn set(&mut self, i: usize, sum: Option<u32>) {
        match sum {
            Some(s) => {
                self.known[i / 64] |= 1 << (i % 64);
                self.sums[i] = s;
            }
            None => {
                self.known[i / 64] &= !(1 << (i % 64));
                self.sums[i] = 0;
            }
        }
        self.dirty = true;
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 * self.known.len() + 4 * self.sums.len());
        for k in self.known {
            v.extend_from_slice(&k.to_le_bytes());
        }
        for s in self.sums {
            v.extend_from_slice(&s.to_le_bytes());
        }
        v
    }

    fn decode(b: &[u8]) -> Option<Page> {
        let mut p = Page::empty();
        if b.len() != 8 * p.known.len() + 4 * p.sums.len() {
            return None;
        }
        let (k, s) = b.split_at(8 * p.known.len());
        for (i, c) in k.chunks_exact(8).enumerate() {
            p.known[i] = u64::from_le_bytes(c.try_into().ok()?);
        }
        for (i, c) in s.chunks_exact(4).enumerate() {
            p.sums[i] = u32::from_le_bytes(c.try_into().ok()?);
        }
        Some(p)
    }
}

fn key_bytes(k: Key) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&k.0.to_be_bytes());
    b[4..8].copy_from_slice(&k.1.to_be_bytes());
    b[8..].copy_from_slice(&k.2.to_be_bytes());
    b
}

fn slab_range(slab: SlabRef) -> ([u8; 12], [u8; 12]) {
    (
        key_bytes((slab.disk, slab.slab, 0)),
        key_bytes((slab.disk, slab.slab, u32::MAX)),
    )
}

/// The part of a run of whole blocks that falls in one page: the page, the index of its first
/// block there, that block's index in the run, and how many blocks.
struct Span {
    key: Key,
    first: usize,
    rel: usize,
    n: usize,
}

/// The blocks of [mo, mo + len) of a slab, page by page.
fn spans(slab: SlabRef, mo: u64, len: u64) -> impl Iterator<Item = Span> {
    debug_assert!(mo % BLOCK == 0 && len % BLOCK == 0);
    let end = mo + len;
    let mut at = mo;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let page = at / PAGE_BYTES;
        let n = ((end.min((page + 1) * PAGE_BYTES) - at) / BLOCK) as usize;
        let s = Span {
            key: (slab.disk, slab.slab, page as u32),
            first: ((at % PAGE_BYTES) / BLOCK) as usize,
            rel: ((at - mo) / BLOCK) as usize,
            n,
        };
        at += n as u64 * BLOCK;
        Some(s)
    })
}

/// The checksum of one block's bytes.
pub fn block_sum(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The pages a checkpoint is writing: their dirty marks were cleared when the batch was made,
/// and come back if it fails. While it is held no clean page is dropped, since the store does
/// not hold those pages' latest contents yet.
pub(crate) struct Persisting<'a> {
    keys: Vec<Key>,
    _hold: RwLockWriteGuard<'a, ()>,
}

pub(crate) struct Sums {
    enabled: bool,
    db: Arc<DB>,
    shards: Vec<Mutex<HashMap<Key, Box<Page>>>>,
    persisting: RwLock<()>,
}

impl Sums {
    /// The checksums of a pool whose journal store is `db`. With checksums off, whatever the
    /// store holds is dropped: writes made without them would leave it stale, so a later
    /// start with them on must find every block unknown, not wrong.
    pub fn open(db: Arc<DB>, enabled: bool) -> Result<Sums> {
        let sums = Sums {
            enabled,
            db,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            persisting: RwLock::new(()),
        };
        if !enabled {
            sums.delete_range(&[0u8; 12], &[0xFF; 12])?;
        }
        Ok(sums)
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn cf(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(CF_SUMS).expect("opened with the column family")
    }

    fn shard(&self, k: Key) -> &Mutex<HashMap<Key, Box<Page>>> {
        let h = (k.0 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (k.1 as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
            ^ (k.2 as u64).wrapping_mul(0x1656_67B1_9E37_79F9);
        &self.shards[(h >> 40) as usize % SHARDS]
    }

    fn load(&self, k: Key) -> Result<Box<Page>> {
        let v = self
            .db
            .get_cf(self.cf(), key_bytes(k))
            .map_err(|e| LayoutError::Journal(format!("checksums: {e}")))?;
        Ok(Box::new(match v {
            // A page that does not decode vouches for nothing: its blocks read as unknown.
            Some(b) => Page::decode(&b).unwrap_or_else(Page::empty),
            None => Page::empty(),
        }))
    }

    /// Runs `f` on the page, read from the store first if it is not in memory.
    fn with_page<R>(&self, k: Key, f: impl FnOnce(&mut Page) -> R) -> Result<R> {
        {
            let mut shard = self.shard(k).lock();
            if let Some(p) = shard.get_mut(&k) {
                return Ok(f(p));
            }
        }
        let loaded = self.load(k)?;
        let mut shard = self.shard(k).lock();
        if shard.len() >= CACHED_PAGES / SHARDS {
            self.evict(&mut shard);
        }
        // Another thread may have loaded it meanwhile: its copy is the one in use.
        let p = shard.entry(k).or_insert(loaded);
        Ok(f(p))
    }

    /// Drops clean pages of a full shard, unless a checkpoint is writing pages out.
    fn evict(&self, shard: &mut HashMap<Key, Box<Page>>) {
        let Some(_g) = self.persisting.try_read() else { return };
        let clean: Vec<Key> = shard
            .iter()
            .filter(|(_, p)| !p.dirty)
            .map(|(k, _)| *k)
            .take(shard.len() / 4 + 1)
            .collect();
        for k in clean {
            shard.remove(&k);
        }
    }

    /// Visits the blocks of [mo, mo + len) of a slab page by page: `f(page, first index,
    /// block offset of that index relative to mo, count)`.
    fn for_blocks(
        &self,
        slab: SlabRef,
        mo: u64,
        len: u64,
        mut f: impl FnMut(&mut Page, usize, usize, usize),
    ) -> Result<()> {
        for s in spans(slab, mo, len) {
            self.with_page(s.key, |p| f(p, s.first, s.rel, s.n))?;
        }
        Ok(())
    }

    /// The member offsets of the blocks of `buf` (whole blocks at `mo`) whose checksum is
    /// known and does not match.
    pub fn verify(&self, slab: SlabRef, mo: u64, buf: &[u8]) -> Result<Vec<u64>> {
        let mut bad = Vec::new();
        self.for_blocks(slab, mo, buf.len() as u64, |p, first, rel, n| {
            for i in 0..n {
                if let Some(want) = p.get(first + i) {
                    let b = &buf[(rel + i) * BLOCK as usize..(rel + i + 1) * BLOCK as usize];
                    if block_sum(b) != want {
                        bad.push(mo + (rel + i) as u64 * BLOCK);
                    }
                }
            }
        })?;
        Ok(bad)
    }

    /// The recorded checksums of whole blocks at `mo`, one per block (None: unknown), if their
    /// pages are in memory: for reads planned onto a caller's ring, which must not wait for
    /// the store. None if a page is not in memory.
    pub fn cached(&self, slab: SlabRef, mo: u64, len: u64) -> Option<Vec<Option<u32>>> {
        let mut out = Vec::with_capacity((len / BLOCK) as usize);
        for s in spans(slab, mo, len) {
            let shard = self.shard(s.key).lock();
            let p = shard.get(&s.key)?;
            out.extend((s.first..s.first + s.n).map(|i| p.get(i)));
        }
        Some(out)
    }

    /// Records the checksums of the whole blocks `sums` (one per block from `mo`).
    pub fn record(&self, slab: SlabRef, mo: u64, sums: &[Option<u32>]) -> Result<()> {
        self.for_blocks(slab, mo, sums.len() as u64 * BLOCK, |p, first, rel, n| {
            for i in 0..n {
                p.set(first + i, sums[rel + i]);
            }
        })
    }

    /// The checksum of a single block, if recorded.
    pub fn get(&self, slab: SlabRef, block_mo: u64) -> Result<Option<u32>> {
        let mut out = None;
        self.for_blocks(slab, block_mo, BLOCK, |p, first, _, _| out = p.get(first))?;
        Ok(out)
    }

    /// Forgets every checksum of a slab given back to the pool, durably: a set that takes the
    /// slab later must not find its blocks vouched for by another set's writes.
    pub fn forget_slab(&self, slab: SlabRef) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        // Not while a checkpoint writes pages out: its batch could put them back.
        let _hold = self.persisting.write();
        for s in &self.shards {
            s.lock().retain(|k, _| (k.0, k.1) != (slab.disk, slab.slab));
        }
        let (from, to) = slab_range(slab);
        self.delete_range(&from, &to)
    }

    fn delete_range(&self, from: &[u8], to: &[u8]) -> Result<()> {
        let mut b = WriteBatch::default();
        b.delete_range_cf(self.cf(), from, to);
        b.delete_cf(self.cf(), to);
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db
            .write_opt(b, &wo)
            .map_err(|e| LayoutError::Journal(format!("checksums: {e}")))
    }

    /// Drops the stored checksums of every slab that no set uses (given back, or the target
    /// of a rebuild a crash cut short), so that no set ever inherits them.
    pub fn keep_only(&self, live: &HashSet<SlabRef>) -> Result<()> {
        let mut dead = HashSet::new();
        for item in self.db.iterator_cf(self.cf(), rocksdb::IteratorMode::Start) {
            let (k, _) = item.map_err(|e| LayoutError::Journal(format!("checksums: {e}")))?;
            if k.len() != 12 {
                continue;
            }
            let slab = SlabRef {
                disk: u32::from_be_bytes(k[..4].try_into().unwrap()),
                slab: u32::from_be_bytes(k[4..8].try_into().unwrap()),
            };
            if !live.contains(&slab) {
                dead.insert(slab);
            }
        }
        for slab in dead {
            let (from, to) = slab_range(slab);
            self.delete_range(&from, &to)?;
        }
        Ok(())
    }

    /// Adds every page changed since the last checkpoint to `b`; the caller writes `b` and
    /// hands the result back to [`finish`](Self::finish).
    pub fn persist_into(&self, b: &mut WriteBatch) -> Persisting<'_> {
        let hold = self.persisting.write();
        let mut keys = Vec::new();
        if self.enabled {
            for s in &self.shards {
                for (k, p) in s.lock().iter_mut().filter(|(_, p)| p.dirty) {
                    p.dirty = false;
                    b.put_cf(self.cf(), key_bytes(*k), p.encode());
                    keys.push(*k);
                }
            }
        }
        Persisting { keys, _hold: hold }
    }

    /// After the checkpoint's batch: if it failed, its pages are marked changed again.
    pub fn finish(&self, persisting: Persisting<'_>, written: bool) {
        if written {
            return;
        }
        for k in persisting.keys {
            if let Some(p) = self.shard(k).lock().get_mut(&k) {
                p.dirty = true;
            }
        }
    }
}

/// The checksums of the whole blocks of `buf`.
pub fn sums_of(buf: &[u8]) -> Vec<Option<u32>> {
    buf.chunks(BLOCK as usize).map(|b| Some(block_sum(b))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &std::path::Path, enabled: bool) -> Sums {
        let mut o = rocksdb::Options::default();
        o.create_if_missing(true);
        o.create_missing_column_families(true);
        let db = DB::open_cf(&o, dir, ["default", CF_SUMS]).unwrap();
        Sums::open(Arc::new(db), enabled).unwrap()
    }

    fn persist(s: &Sums) {
        let mut b = WriteBatch::default();
        let p = s.persist_into(&mut b);
        s.db.write(b).unwrap();
        s.finish(p, true);
    }

    #[test]
    fn recorded_sums_verify_survive_a_reopen_and_a_forgotten_slab_keeps_none() {
        let dir = tempfile::tempdir().unwrap();
        let slab = SlabRef { disk: 1, slab: 7 };
        let other = SlabRef { disk: 2, slab: 7 };
        let data: Vec<u8> = (0..3 * PAGE_BYTES as usize).map(|i| (i * 31 % 251) as u8).collect();
        {
            let s = open(dir.path(), true);
            // Across a page boundary.
            let mo = PAGE_BYTES - 2 * BLOCK;
            s.record(slab, mo, &sums_of(&data[..8 * BLOCK as usize])).unwrap();
            s.record(other, 0, &sums_of(&data[..BLOCK as usize])).unwrap();
            assert!(s.verify(slab, mo, &data[..8 * BLOCK as usize]).unwrap().is_empty());
            let mut rotten = data[..8 * BLOCK as usize].to_vec();
            rotten[5 * BLOCK as usize + 17] ^= 4;
            assert_eq!(s.verify(slab, mo, &rotten).unwrap(), vec![mo + 5 * BLOCK]);
            // Unknown blocks are not judged.
            assert!(s.verify(slab, 0, &rotten[..BLOCK as usize]).unwrap().is_empty());
            persist(&s);
        }
        {
            let s = open(dir.path(), true);
            let mo = PAGE_BYTES - 2 * BLOCK;
            assert_eq!(s.get(slab, mo).unwrap(), Some(block_sum(&data[..BLOCK as usize])));
            assert_eq!(s.cached(slab, mo, BLOCK).unwrap().len(), 1);
            s.forget_slab(slab).unwrap();
            assert_eq!(s.get(slab, mo).unwrap(), None);
            assert!(s.get(other, 0).unwrap().is_some());
            s.keep_only(&HashSet::new()).unwrap();
        }
        let s = open(dir.path(), true);
        assert_eq!(s.get(other, 0).unwrap(), None, "keep_only dropped a slab no set uses");
    }

    #[test]
    fn a_failed_checkpoint_keeps_the_pages_changed_and_turning_checksums_off_drops_them() {
        let dir = tempfile::tempdir().unwrap();
        let slab = SlabRef { disk: 0, slab: 0 };
        {
            let s = open(dir.path(), true);
            s.record(slab, 0, &[Some(5)]).unwrap();
            let mut b = WriteBatch::default();
            let p = s.persist_into(&mut b);
            s.finish(p, false);
            persist(&s);
        }
        assert_eq!(open(dir.path(), true).get(slab, 0).unwrap(), Some(5));
        drop(open(dir.path(), false));
        assert_eq!(open(dir.path(), true).get(slab, 0).unwrap(), None);
    }

    #[test]
    fn pages_round_trip_and_a_malformed_page_vouches_for_nothing() {
        let mut p = Page::empty();
        p.set(0, Some(1));
        p.set(511, Some(u32::MAX));
        p.set(64, Some(0));
        let q = Page::decode(&p.encode()).unwrap();
        assert_eq!(q.get(0), Some(1));
        assert_eq!(q.get(511), Some(u32::MAX));
        assert_eq!(q.get(64), Some(0));
        assert_eq!(q.get(1), None);
        assert!(Page::decode(&p.encode()[1..]).is_none());
    }
}
