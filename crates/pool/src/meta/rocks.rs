//! The metadata store of a pool on local disks: one RocksDB database beside the pool, one
//! column family per kind of record, reference counts moved by a merge operator.

use std::path::{Path, PathBuf};

use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, Options, WriteBatch, WriteOptions, DB};

use crate::error::{PoolError, Result};
use crate::meta::backend::{MetaBackend, MetaView, Visit};
use crate::meta::{counted, refcount_delta, MetaBatch, MetaOp, ALL_CFS, CF_DEDUP, CF_REFCOUNTS, DEDUP_INDEX_CACHE};

/// Sums little-endian i64 deltas: the refcount merge operator (`counted`: an unreadable
/// count stays as it is).
fn sum_i64(_key: &[u8], existing: Option<&[u8]>, operands: &rocksdb::MergeOperands) -> Option<Vec<u8>> {
    let mut v = existing.map(|b| b.to_vec());
    for op in operands {
        v = Some(counted(v.as_deref(), crate::decode_refcount(op)));
    }
    v.or_else(|| Some(refcount_delta(0).to_vec()))
}

pub struct RocksMeta {
    db: DB,
    path: PathBuf,
    /// The fingerprint index's own block cache, so that its memory is bounded and measured.
    dedup_cache: rocksdb::Cache,
}

impl RocksMeta {
    /// Creates a new store; fails if one already exists at `path`.
    pub fn create(path: &Path) -> Result<RocksMeta> {
        if path.join("CURRENT").exists() {
            return Err(PoolError::Exists(format!("a metadata store at {}", path.display())));
        }
        Self::open_inner(path, true)
    }

    /// Opens an existing store; fails with a clear error if there is none.
    pub fn open(path: &Path) -> Result<RocksMeta> {
        if !path.join("CURRENT").exists() {
            return Err(PoolError::Meta {
                path: path.display().to_string(),
                message: "no pool metadata here (wrong directory, or the pool was destroyed)".into(),
            });
        }
        Self::open_inner(path, false)
    }

    fn open_inner(path: &Path, create: bool) -> Result<RocksMeta> {
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
                // The same for the entries not flushed yet: without a filter, every lookup of
                // new data walks the memtable's skip list (a tenth of an optimization run's
                // time on data with few duplicates). 1.6 MiB per 16 MiB memtable.
                o.set_memtable_whole_key_filtering(true);
                o.set_memtable_prefix_bloom_ratio(0.1);
            }
            ColumnFamilyDescriptor::new(*name, o)
        });
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|e| PoolError::Meta {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(RocksMeta {
            db,
            path: path.to_path_buf(),
            dedup_cache,
        })
    }

    fn cf(&self, name: &str) -> &ColumnFamily {
        self.db.cf_handle(name).expect("column families are created at open")
    }

    fn err(&self, e: rocksdb::Error) -> PoolError {
        PoolError::Meta {
            path: self.path.display().to_string(),
            message: e.to_string(),
        }
    }

    fn property(&self, cf: &str, name: &str) -> u64 {
        self.db
            .property_int_value_cf(self.cf(cf), name)
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Feeds `visit` the items of `iter` until it says stop.
    fn visit<I>(&self, iter: I, visit: Visit) -> Result<()>
    where
        I: Iterator<Item = std::result::Result<(Box<[u8]>, Box<[u8]>), rocksdb::Error>>,
    {
        for item in iter {
            let (k, v) = item.map_err(|e| self.err(e))?;
            if !visit(&k, &v)? {
                break;
            }
        }
        Ok(())
    }
}

impl MetaBackend for RocksMeta {
    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn commit(&self, batch: &MetaBatch, sync: bool) -> Result<()> {
        let mut b = WriteBatch::default();
        for op in batch.ops() {
            match op {
                MetaOp::Put(cf, k, v) => b.put_cf(self.cf(cf), k, v),
                MetaOp::Delete(cf, k) => b.delete_cf(self.cf(cf), k),
                MetaOp::DeleteRange(cf, from, to) => b.delete_range_cf(self.cf(cf), from, to),
                MetaOp::Count(cf, k, d) => b.merge_cf(self.cf(cf), k, refcount_delta(*d)),
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(b, &wo).map_err(|e| self.err(e))
    }

    fn sync(&self) -> Result<()> {
        self.db.flush_wal(true).map_err(|e| self.err(e))
    }

    fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get_cf(self.cf(cf), key).map_err(|e| self.err(e))
    }

    fn multi_get(&self, cf: &str, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let cf = self.cf(cf);
        self.db
            .batched_multi_get_cf(cf, keys.iter(), false)
            .into_iter()
            .map(|r| r.map(|v| v.map(|v| v.to_vec())).map_err(|e| self.err(e)))
            .collect()
    }

    fn scan(&self, cf: &str, from: &[u8], visit: Visit) -> Result<()> {
        let iter = self.db.iterator_cf(
            self.cf(cf),
            rocksdb::IteratorMode::From(from, rocksdb::Direction::Forward),
        );
        self.visit(iter, visit)
    }

    fn snapshot(&self) -> Box<dyn MetaView + '_> {
        Box::new(RocksView {
            store: self,
            snap: self.db.snapshot(),
        })
    }

    fn estimate_keys(&self, cf: &str) -> u64 {
        self.property(cf, "rocksdb.estimate-num-keys")
    }

    fn stored_bytes(&self, cf: &str) -> u64 {
        self.property(cf, "rocksdb.total-sst-files-size")
    }

    /// Its memtables and its block cache (which holds its filter and index blocks too).
    fn dedup_index_memory(&self) -> u64 {
        self.property(CF_DEDUP, "rocksdb.cur-size-all-mem-tables") + self.dedup_cache.get_usage() as u64
    }

    /// Waits for the flushes and compactions that run, so that none runs into RocksDB's
    /// static destructors.
    fn stop_background_work(&self) {
        self.db.cancel_all_background_work(true);
    }

    fn compact(&self, cf: &str) {
        self.db.compact_range_cf(self.cf(cf), None::<&[u8]>, None::<&[u8]>);
    }
}

struct RocksView<'a> {
    store: &'a RocksMeta,
    snap: rocksdb::Snapshot<'a>,
}

impl MetaView for RocksView<'_> {
    /// The blocks it reads do not push the serving path's out of the block cache.
    fn scan(&self, cf: &str, from: &[u8], visit: Visit) -> Result<()> {
        let mut ro = rocksdb::ReadOptions::default();
        ro.fill_cache(false);
        let iter = self.snap.iterator_cf_opt(
            self.store.cf(cf),
            ro,
            rocksdb::IteratorMode::From(from, rocksdb::Direction::Forward),
        );
        self.store.visit(iter, visit)
    }

    fn estimate_keys(&self, cf: &str) -> u64 {
        self.store.estimate_keys(cf)
    }
}
