//! What a metadata store must do for the engine: the seam between the layers that keep records
//! (pool, layout, volume, dedup) and where the records live. RocksDB beside the pool's disks is
//! the first store; a store another gateway can open (RADOS omap, docs/scale-out.md) is the
//! reason for the seam. `tests::conformance` states the contract every backend is held to.

use crate::error::Result;
use crate::meta::MetaBatch;

/// Visits (key, value) pairs in key order; returns false to stop.
pub type Visit<'f> = &'f mut dyn FnMut(&[u8], &[u8]) -> Result<bool>;

pub trait MetaBackend: Send + Sync {
    /// Where the store is, for messages.
    fn location(&self) -> String;
    /// Whether other machines open this store too, one at a time (a pool's gateways taking
    /// it over from each other): what a logical unit must keep beside its vdisk then lives
    /// here rather than beside one daemon.
    fn shared(&self) -> bool {
        false
    }
    /// Applies every change of `batch`, or none. With `sync`, durable before it returns.
    fn commit(&self, batch: &MetaBatch, sync: bool) -> Result<()>;
    /// Makes every batch committed so far durable.
    fn sync(&self) -> Result<()>;
    fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>>;
    fn multi_get(&self, cf: &str, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(cf, k)).collect()
    }
    /// Visits the records of `cf` from the first key at or after `from`, in key order.
    fn scan(&self, cf: &str, from: &[u8], visit: Visit) -> Result<()>;
    /// A consistent view: every batch committed before it, none after.
    fn snapshot(&self) -> Box<dyn MetaView + '_>;
    /// Roughly how many records `cf` holds (for progress and reports, not for counting).
    fn estimate_keys(&self, cf: &str) -> u64;
    /// Bytes `cf` takes on its medium, where the backend knows it.
    fn stored_bytes(&self, _cf: &str) -> u64 {
        0
    }
    /// Bytes of memory the fingerprint index holds (its share of caches and buffers).
    fn dedup_index_memory(&self) -> u64 {
        0
    }
    /// Stops background work before the process exits with the store open.
    fn stop_background_work(&self) {}
    /// Compacts `cf` whole, where the backend has such a thing (benchmarks).
    fn compact(&self, _cf: &str) {}
}

/// A point-in-time view of a store ([`MetaBackend::snapshot`]).
pub trait MetaView {
    /// As [`MetaBackend::scan`], as of the view; reads that need not stay in caches.
    fn scan(&self, cf: &str, from: &[u8], visit: Visit) -> Result<()>;
    fn estimate_keys(&self, cf: &str) -> u64;
}
