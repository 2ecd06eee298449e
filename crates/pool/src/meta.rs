//! The pool's metadata store: one RocksDB database per pool, one column family per kind of
//! record. Every metadata change is one atomic write batch (see ARCHITECTURE.md).

use std::path::{Path, PathBuf};

use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, Options, WriteBatch, WriteOptions, DB};

use crate::error::{PoolError, Result};

/// Pool configuration and disk table.
pub const CF_POOL: &str = "pool";
/// Slab set descriptors (layout layer).
pub const CF_SLABSETS: &str = "slabsets";
/// Virtual disk descriptors (volume layer).
pub const CF_VDISKS: &str = "vdisks";
/// Grain map entries: (vdisk id, grain index) -> grain location (volume layer).
pub const CF_GRAINS: &str = "grains";
/// Reference counts of allocated grain slots (volume layer). Values are little-endian i64
/// and change by merge deltas, so concurrent updates of one slot commute.
pub const CF_REFCOUNTS: &str = "refcounts";
/// Grain size of each slab set used for grains (volume layer).
pub const CF_GRAINSETS: &str = "grainsets";
/// What the last metadata scan found, one record per finding (volume layer).
pub const CF_FINDINGS: &str = "findings";
/// The fingerprint index of deduplication: (class, fingerprint) -> where such data lies
/// (dedup layer). Advisory: every match is compared byte for byte before data is shared.
pub const CF_DEDUP: &str = "dedup";

/// Block cache of the fingerprint index, its index and filter blocks included: with
/// the memtable, what the index may hold in memory however large it grows.
pub const DEDUP_INDEX_CACHE: usize = 64 << 20;

const ALL_CFS: [&str; 8] = [
    CF_POOL,
    CF_SLABSETS,
    CF_VDISKS,
    CF_GRAINS,
    CF_REFCOUNTS,
    CF_GRAINSETS,
    CF_FINDINGS,
    CF_DEDUP,
];

/// Sums little-endian i64 deltas: the refcount merge operator.
fn sum_i64(_key: &[u8], existing: Option<&[u8]>, operands: &rocksdb::MergeOperands) -> Option<Vec<u8>> {
    let read = |b: &[u8]| b.try_into().map(i64::from_le_bytes).unwrap_or(0);
    let mut v = existing.map(read).unwrap_or(0);
    for op in operands {
        v += read(op);
    }
    Some(v.to_le_bytes().to_vec())
}

/// The delta operand of the refcount merge operator.
pub fn refcount_delta(d: i64) -> [u8; 8] {
    d.to_le_bytes()
}

pub fn decode_refcount(b: &[u8]) -> i64 {
    b.try_into().map(i64::from_le_bytes).unwrap_or(0)
}

pub struct MetaStore {
    db: DB,
    path: PathBuf,
    /// The fingerprint index's own block cache, so that its memory is bounded and measured.
    dedup_cache: rocksdb::Cache,
}

impl MetaStore {
    /// Creates a new store; fails if one already exists at `path`.
    pub fn create(path: &Path) -> Result<MetaStore> {
        if path.join("CURRENT").exists() {
            return Err(PoolError::Exists(format!("a metadata store at {}", path.display())));
        }
        Self::open_inner(path, true)
    }

    /// Opens an existing store; fails with a clear error if there is none.
    pub fn open(path: &Path) -> Result<MetaStore> {
        if !path.join("CURRENT").exists() {
            return Err(PoolError::Meta {
                path: path.display().to_string(),
                message: "no pool metadata here (wrong directory, or the pool was destroyed)".into(),
            });
        }
        Self::open_inner(path, false)
    }

    fn open_inner(path: &Path, create: bool) -> Result<MetaStore> {
        let mut opts = Options::default();
        opts.create_if_missing(create);
        opts.create_missing_column_families(true);
        opts.set_max_background_jobs(2);
        opts.set_keep_log_file_num(4);
        let dedup_cache = rocksdb::Cache::new_lru_cache(DEDUP_INDEX_CACHE);
        let cfs = ALL_CFS.iter().map(|name| {
            let mut o = Options::default();
            o.set_write_buffer_size(16 << 20);
            if *name == CF_REFCOUNTS {
                o.set_merge_operator_associative("tessera_sum_i64", sum_i64);
            }
            if *name == CF_DEDUP {
                // Most lookups are for data seen for the first time: a bloom filter answers
                // them without a disk read. Filters and index blocks live in the bounded
                // cache, not beside it, so the index's memory does not grow with its size.
                let mut t = rocksdb::BlockBasedOptions::default();
                t.set_bloom_filter(10.0, false);
                t.set_block_cache(&dedup_cache);
                t.set_cache_index_and_filter_blocks(true);
                t.set_pin_l0_filter_and_index_blocks_in_cache(true);
                o.set_block_based_table_factory(&t);
            }
            ColumnFamilyDescriptor::new(*name, o)
        });
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|e| PoolError::Meta {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(MetaStore {
            db,
            path: path.to_path_buf(),
            dedup_cache,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn db(&self) -> &DB {
        &self.db
    }

    pub fn cf(&self, name: &str) -> &ColumnFamily {
        self.db.cf_handle(name).expect("column families are created at open")
    }

    /// Commits one atomic batch. `sync` makes it durable before returning.
    pub fn commit(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(batch, &wo).map_err(|e| self.err(e))
    }

    /// Makes every batch committed so far durable.
    pub fn sync(&self) -> Result<()> {
        self.db.flush_wal(true).map_err(|e| self.err(e))
    }

    pub fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get_cf(self.cf(cf), key).map_err(|e| self.err(e))
    }

    /// Looks up several keys of one column family at once.
    pub fn multi_get(&self, cf: &str, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let cf = self.cf(cf);
        self.db
            .multi_get_cf(keys.iter().map(|k| (cf, *k)))
            .into_iter()
            .map(|r| r.map_err(|e| self.err(e)))
            .collect()
    }

    /// A RocksDB integer property of a column family (`rocksdb.estimate-num-keys`, ...).
    pub fn property(&self, cf: &str, name: &str) -> u64 {
        self.db
            .property_int_value_cf(self.cf(cf), name)
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Bytes the fingerprint index holds in memory: its memtables and its block cache (which
    /// holds its filter and index blocks too).
    pub fn dedup_index_memory(&self) -> u64 {
        self.property(CF_DEDUP, "rocksdb.cur-size-all-mem-tables") + self.dedup_cache.get_usage() as u64
    }

    /// Visits every (key, value) of a column family whose key starts with `prefix`.
    pub fn for_each_prefix(
        &self,
        cf: &str,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        let iter = self.db.iterator_cf(
            self.cf(cf),
            rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward),
        );
        self.visit_prefix(iter, prefix, &mut f)
    }

    /// Feeds `f` the items of `iter` (which starts at `prefix`) while their keys start with it.
    fn visit_prefix<I>(&self, iter: I, prefix: &[u8], f: &mut impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<()>
    where
        I: Iterator<Item = std::result::Result<(Box<[u8]>, Box<[u8]>), rocksdb::Error>>,
    {
        for item in iter {
            let (k, v) = item.map_err(|e| self.err(e))?;
            if !k.starts_with(prefix) {
                break;
            }
            f(&k, &v)?;
        }
        Ok(())
    }

    /// Stops the store's background work (flushes, compactions) and waits for what runs: a
    /// process about to exit with the store still open calls it, so that no background job
    /// runs into RocksDB's static destructors.
    pub fn stop_background_work(&self) {
        self.db.cancel_all_background_work(true);
    }

    /// A consistent view of the store as it is now: every batch committed before is in it,
    /// none committed after. A scan reads it while the vdisks go on writing.
    pub fn snapshot(&self) -> MetaSnapshot<'_> {
        MetaSnapshot {
            store: self,
            snap: self.db.snapshot(),
        }
    }

    pub fn err(&self, e: rocksdb::Error) -> PoolError {
        PoolError::Meta {
            path: self.path.display().to_string(),
            message: e.to_string(),
        }
    }
}

/// A point-in-time view of the metadata store ([`MetaStore::snapshot`]).
pub struct MetaSnapshot<'a> {
    store: &'a MetaStore,
    snap: rocksdb::Snapshot<'a>,
}

impl MetaSnapshot<'_> {
    /// Visits every (key, value) of a column family whose key starts with `prefix`, as of the
    /// snapshot. The blocks it reads do not push the serving path's out of the block cache.
    pub fn for_each_prefix(
        &self,
        cf: &str,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut ro = rocksdb::ReadOptions::default();
        ro.fill_cache(false);
        let iter = self.snap.iterator_cf_opt(
            self.store.cf(cf),
            ro,
            rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward),
        );
        self.store.visit_prefix(iter, prefix, &mut f)
    }

    /// Roughly how many keys a column family holds (for progress, not for counting).
    pub fn estimate_keys(&self, cf: &str) -> u64 {
        self.store
            .db
            .property_int_value_cf(self.store.cf(cf), "rocksdb.estimate-num-keys")
            .ok()
            .flatten()
            .unwrap_or(0)
    }
}
