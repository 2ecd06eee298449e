//! The pool's metadata store: one kind of record per column family, every change one atomic
//! batch (see ARCHITECTURE.md). [`MetaStore`] is what the layers hold; where the records live
//! is a [`MetaBackend`]: RocksDB beside the pool ([`RocksMeta`]), or memory ([`MemoryMeta`]).

mod backend;
mod batch;
pub mod conformance;
mod memory;
mod rocks;

use std::path::Path;

pub use backend::{MetaBackend, MetaView, Visit};
pub use batch::{counted, MetaBatch, MetaOp};
pub use memory::MemoryMeta;
pub use rocks::RocksMeta;

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
/// and change by deltas ([`MetaOp::Count`]), so concurrent updates of one slot commute.
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

pub(crate) const ALL_CFS: [&str; 8] = [
    CF_POOL,
    CF_SLABSETS,
    CF_VDISKS,
    CF_GRAINS,
    CF_REFCOUNTS,
    CF_GRAINSETS,
    CF_FINDINGS,
    CF_DEDUP,
];

/// A count's delta, as a count's value is stored.
pub fn refcount_delta(d: i64) -> [u8; 8] {
    d.to_le_bytes()
}

pub fn decode_refcount(b: &[u8]) -> i64 {
    b.try_into().map(i64::from_le_bytes).unwrap_or(0)
}

/// A record's key or bytes in hex: how a store that takes only text keeps them, and how an
/// operator reads one.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes `s` gives in hex (either case), or None if it is not hex: an odd length, or
/// anything but hex digits (`from_str_radix` alone would take a sign, "+f").
pub fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    s.chunks(2)
        .map(|p| std::str::from_utf8(p).ok().and_then(|p| u8::from_str_radix(p, 16).ok()))
        .collect()
}

pub struct MetaStore {
    backend: Box<dyn MetaBackend>,
    /// The first change whose commit (or sync) failed, described. A failed commit may still
    /// be applied, now or later (a write that reached the store's log before its sync
    /// failed, a compound write to RADOS that timed out): what the layers hold in memory
    /// may then differ from the records. So may they after a change refused whole (by a
    /// later owner's guard), which the layers may have counted on. From then on nothing
    /// commits or syncs, and every flush of the pool fails ([`whole`](Self::whole)), until
    /// the pool is opened again from its records: a write answered from memory (an
    /// overwrite in place of a grain whose unmapping may be applied) would otherwise be
    /// vouched for, and lost then.
    /// Set once, then only read: a flush, an allocation and a planned write each ask it.
    unknown: std::sync::OnceLock<String>,
    /// Told of that change, once.
    on_unknown: Option<Box<dyn Fn(&str) + Send + Sync>>,
}

impl MetaStore {
    /// Creates a new RocksDB store at `path`; fails if one already exists there.
    pub fn create(path: &Path) -> Result<MetaStore> {
        Ok(MetaStore::on(RocksMeta::create(path)?))
    }

    /// Opens the RocksDB store at `path`; fails with a clear error if there is none.
    pub fn open(path: &Path) -> Result<MetaStore> {
        Ok(MetaStore::on(RocksMeta::open(path)?))
    }

    /// A store kept by `backend`.
    pub fn on(backend: impl MetaBackend + 'static) -> MetaStore {
        MetaStore {
            backend: Box::new(backend),
            unknown: std::sync::OnceLock::new(),
            on_unknown: None,
        }
    }

    /// Calls `tell` with the reason once a change's outcome is not known (see `unknown`):
    /// the owner of a pool on RADOS opens it again from the cluster.
    pub fn on_unknown(mut self, tell: impl Fn(&str) + Send + Sync + 'static) -> MetaStore {
        self.on_unknown = Some(Box::new(tell));
        self
    }

    /// Fails once a change's outcome is not known: nothing this store holds in memory may
    /// be vouched for until the pool is opened again from its records.
    pub fn whole(&self) -> Result<()> {
        match self.unknown.get() {
            Some(why) => Err(PoolError::Meta {
                path: self.location(),
                message: format!(
                    "refused: {why}, and what the pool holds in memory may differ from its records; \
                     it must be opened again from them (a pool on RADOS is, by its gateway; a local \
                     pool by `tessera pool import NAME`, or when the daemon restarts)"
                ),
            }),
            None => Ok(()),
        }
    }

    /// Keeps the failure `e` of a commit or sync as the change whose outcome is not known
    /// (the first one), tells the owner, and returns the error to give the caller. A change
    /// the backend refused whole is said to be not applied; what the pool holds in memory
    /// may differ from its records all the same (the caller may have counted on it).
    fn failed(&self, what: &str, e: PoolError) -> PoolError {
        let why = match e {
            PoolError::MetaRefused { .. } => format!("{what} was refused, and not applied ({e})"),
            _ => format!("{what} failed and may or may not be applied ({e})"),
        };
        let first = self.unknown.set(why.clone()).is_ok();
        if first {
            tracing::error!(store = %self.location(), error = %why, "the pool's metadata may differ from what it holds in memory: no change is committed and no flush succeeds until it is opened again");
            if let Some(tell) = &self.on_unknown {
                tell(&why);
            }
        }
        PoolError::Meta {
            path: self.location(),
            message: format!("{why}; nothing more is committed until the pool is opened again"),
        }
    }

    /// Where the records live, for messages.
    pub fn location(&self) -> String {
        self.backend.location()
    }

    /// Whether other machines open this store too (see [`MetaBackend::shared`]).
    pub fn shared(&self) -> bool {
        self.backend.shared()
    }

    /// Commits one atomic batch. `sync` makes it durable before returning.
    pub fn commit(&self, batch: MetaBatch, sync: bool) -> Result<()> {
        self.whole()?;
        match (batch.is_empty(), sync) {
            (true, false) => Ok(()),
            (true, true) => self.sync(),
            _ => self
                .backend
                .commit(&batch, sync)
                .map_err(|e| self.failed("a change of the pool's metadata", e)),
        }
    }

    /// Makes every batch committed so far durable.
    pub fn sync(&self) -> Result<()> {
        self.whole()?;
        self.backend
            .sync()
            .map_err(|e| self.failed("making the pool's metadata durable", e))
    }

    pub fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.backend.get(cf, key)
    }

    /// Looks up several keys of one column family at once.
    pub fn multi_get(&self, cf: &str, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.backend.multi_get(cf, keys)
    }

    /// Roughly how many records `cf` holds (for progress and reports, not for counting).
    pub fn estimate_keys(&self, cf: &str) -> u64 {
        self.backend.estimate_keys(cf)
    }

    /// Bytes `cf` takes on its medium, where the backend knows it (0 otherwise).
    pub fn stored_bytes(&self, cf: &str) -> u64 {
        self.backend.stored_bytes(cf)
    }

    /// Bytes the fingerprint index holds in memory.
    pub fn dedup_index_memory(&self) -> u64 {
        self.backend.dedup_index_memory()
    }

    /// Visits every (key, value) of a column family whose key starts with `prefix`.
    pub fn for_each_prefix(
        &self,
        cf: &str,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.backend
            .scan(cf, prefix, &mut |k, v| prefixed(prefix, k, v, &mut f))
    }

    /// Up to `limit` records of `cf` in key order, from the first at or after `from`.
    pub fn range_from(&self, cf: &str, from: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        if limit > 0 {
            self.backend.scan(cf, from, &mut |k, v| {
                out.push((k.to_vec(), v.to_vec()));
                Ok(out.len() < limit)
            })?;
        }
        Ok(out)
    }

    /// Stops the store's background work (flushes, compactions) and waits for what runs: a
    /// process about to exit with the store still open calls it.
    pub fn stop_background_work(&self) {
        self.backend.stop_background_work();
    }

    /// Compacts a column family whole, where the backend has such a thing (benchmarks).
    pub fn compact(&self, cf: &str) {
        self.backend.compact(cf);
    }

    /// A consistent view of the store as it is now: every batch committed before is in it,
    /// none committed after. A scan reads it while the vdisks go on writing.
    pub fn snapshot(&self) -> MetaSnapshot<'_> {
        MetaSnapshot {
            view: self.backend.snapshot(),
        }
    }

    /// An error of this store, for records the layers above find unreadable.
    pub fn error(&self, message: impl Into<String>) -> PoolError {
        PoolError::Meta {
            path: self.location(),
            message: message.into(),
        }
    }
}

/// Feeds `f` a record while its key starts with `prefix`; false (stop) past them.
fn prefixed(prefix: &[u8], k: &[u8], v: &[u8], f: &mut impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<bool> {
    if !k.starts_with(prefix) {
        return Ok(false);
    }
    f(k, v)?;
    Ok(true)
}

/// A point-in-time view of the metadata store ([`MetaStore::snapshot`]).
pub struct MetaSnapshot<'a> {
    view: Box<dyn MetaView + 'a>,
}

impl MetaSnapshot<'_> {
    /// Visits every (key, value) of a column family whose key starts with `prefix`, as of the
    /// snapshot.
    pub fn for_each_prefix(
        &self,
        cf: &str,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.view.scan(cf, prefix, &mut |k, v| prefixed(prefix, k, v, &mut f))
    }

    /// Roughly how many keys a column family holds (for progress, not for counting).
    pub fn estimate_keys(&self, cf: &str) -> u64 {
        self.view.estimate_keys(cf)
    }
}
