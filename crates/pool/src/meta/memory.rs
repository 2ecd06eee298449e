//! A metadata store in memory: the contract of [`MetaBackend`] with nothing else, for tests of
//! the contract and of the layers above, and as the plainest reference for other backends.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::Result;
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
