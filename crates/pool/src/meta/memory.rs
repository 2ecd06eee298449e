//! A metadata store in memory: the contract of [`MetaBackend`] with nothing else, for tests of
//! the contract and of the layers above, and as the plainest reference for other backends.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::{PoolError, Result};
use crate::meta::backend::{MetaBackend, MetaView, Visit};
use crate::meta::batch::counted;
use crate::meta::{MetaBatch, MetaOp};

type Tables = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

/// Clones share the records: a pool closed and opened again on a clone finds them, as it
/// would on disk (nothing is lost by a crash that keeps the process alive).
#[derive(Default, Clone)]
pub struct MemoryMeta {
    tables: Arc<RwLock<Arc<Tables>>>,
}

impl MemoryMeta {
    pub fn new() -> MemoryMeta {
        MemoryMeta::default()
    }

    /// Puts one record as it is, outside any batch: a backend that reads its records whole
    /// builds its snapshots this way.
    pub fn load(&self, cf: &str, key: Vec<u8>, value: Vec<u8>) {
        let mut guard = self.tables.write();
        Arc::make_mut(&mut guard)
            .entry(cf.to_string())
            .or_default()
            .insert(key, value);
    }

    /// A view of the records as they are now, that holds them itself.
    pub fn into_view(self) -> Box<dyn MetaView + Send + Sync> {
        Box::new(MemoryView(self.tables.read().clone()))
    }
}

fn scan_table(tables: &Tables, cf: &str, from: &[u8], visit: Visit) -> Result<()> {
    if let Some(t) = tables.get(cf) {
        for (k, v) in t.range::<[u8], _>((Bound::Included(from), Bound::Unbounded)) {
            if !visit(k, v)? {
                break;
            }
        }
    }
    Ok(())
}

impl MetaBackend for MemoryMeta {
    fn location(&self) -> String {
        "memory".into()
    }

    fn commit(&self, batch: &MetaBatch, _sync: bool) -> Result<()> {
        // Refused whole, before anything of it is applied.
        for op in batch.ops() {
            if let MetaOp::DeleteRange(cf, from, to) = op {
                if from > to {
                    return Err(PoolError::MetaRefused {
                        path: self.location(),
                        message: format!(
                            "a range of {cf} deleted from {} to {}, before its start",
                            crate::meta::hex(from),
                            crate::meta::hex(to)
                        ),
                    });
                }
            }
        }
        let mut guard = self.tables.write();
        // Copy on write: snapshots keep the tables they were taken of.
        let tables = Arc::make_mut(&mut guard);
        for op in batch.ops() {
            match op {
                MetaOp::Put(cf, k, v) => {
                    tables.entry(cf.to_string()).or_default().insert(k.clone(), v.clone());
                }
                MetaOp::Delete(cf, k) => {
                    if let Some(t) = tables.get_mut(*cf) {
                        t.remove(k);
                    }
                }
                MetaOp::DeleteRange(cf, from, to) => {
                    if let Some(t) = tables.get_mut(*cf) {
                        let doomed: Vec<Vec<u8>> = t
                            .range::<[u8], _>((Bound::Included(&from[..]), Bound::Excluded(&to[..])))
                            .map(|(k, _)| k.clone())
                            .collect();
                        for k in doomed {
                            t.remove(&k);
                        }
                    }
                }
                MetaOp::Count(cf, k, delta) => {
                    let t = tables.entry(cf.to_string()).or_default();
                    let v = counted(t.get(k).map(|v| &v[..]), *delta);
                    t.insert(k.clone(), v);
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.tables.read().get(cf).and_then(|t| t.get(key).cloned()))
    }

    fn scan(&self, cf: &str, from: &[u8], visit: Visit) -> Result<()> {
        // Visit a snapshot: the visitor may commit.
        let tables = self.tables.read().clone();
        scan_table(&tables, cf, from, visit)
    }

    fn snapshot(&self) -> Box<dyn MetaView + '_> {
        Box::new(MemoryView(self.tables.read().clone()))
    }

    fn estimate_keys(&self, cf: &str) -> u64 {
        self.tables.read().get(cf).map_or(0, |t| t.len() as u64)
    }
}

struct MemoryView(Arc<Tables>);

impl MetaView for MemoryView {
    fn scan(&self, cf: &str, from: &[u8], visit: Visit) -> Result<()> {
        scan_table(&self.0, cf, from, visit)
    }

    fn estimate_keys(&self, cf: &str) -> u64 {
        self.0.get(cf).map_or(0, |t| t.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{decode_refcount, refcount_delta, CF_POOL, CF_REFCOUNTS};

    /// A batch that deletes a range ending before its start is refused whole, saying so,
    /// rather than panic half applied.
    #[test]
    fn a_backward_range_is_refused_and_nothing_of_its_batch_applied() {
        let m = MemoryMeta::new();
        let mut b = MetaBatch::new();
        b.put(CF_POOL, b"x", b"1");
        b.delete_range(CF_POOL, b"b", b"a");
        let e = m.commit(&b, true).unwrap_err();
        assert!(e.to_string().contains("before its start"), "{e}");
        assert_eq!(m.get(CF_POOL, b"x").unwrap(), None, "part of a refused batch applied");
    }

    /// A count damaged past any real one is kept as it is (for the next import to count
    /// again), not wrapped around, nor a panic.
    #[test]
    fn a_count_that_would_overflow_is_kept_as_it_is() {
        let m = MemoryMeta::new();
        m.load(CF_REFCOUNTS, b"n".to_vec(), refcount_delta(i64::MAX).to_vec());
        let mut b = MetaBatch::new();
        b.count(CF_REFCOUNTS, b"n", 1);
        m.commit(&b, true).unwrap();
        let n = m.get(CF_REFCOUNTS, b"n").unwrap().unwrap();
        assert_eq!(decode_refcount(&n), i64::MAX);
        let mut b = MetaBatch::new();
        b.count(CF_REFCOUNTS, b"n", -5);
        m.commit(&b, true).unwrap();
        assert_eq!(
            decode_refcount(&m.get(CF_REFCOUNTS, b"n").unwrap().unwrap()),
            i64::MAX - 5
        );
    }
}
