//! A metadata change as the engine states it, before any store applies it: the batch every
//! layer builds and `MetaStore::commit` applies whole or not at all, whatever the backend.

use crate::meta::refcount_delta;

/// One change to one record kind (column family) of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaOp {
    Put(&'static str, Vec<u8>, Vec<u8>),
    Delete(&'static str, Vec<u8>),
    /// Every key in `[from, to)`.
    DeleteRange(&'static str, Vec<u8>, Vec<u8>),
    /// Moves a reference count (a little-endian i64, absent = 0) by a delta. Deltas commute,
    /// so concurrent batches that count the same slot need not read it first.
    Count(&'static str, Vec<u8>, i64),
}

/// Changes applied together: after a crash, all of them or none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaBatch {
    ops: Vec<MetaOp>,
}

impl MetaBatch {
    pub fn new() -> MetaBatch {
        MetaBatch::default()
    }

    pub fn put(&mut self, cf: &'static str, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.ops
            .push(MetaOp::Put(cf, key.as_ref().to_vec(), value.as_ref().to_vec()));
    }

    pub fn delete(&mut self, cf: &'static str, key: impl AsRef<[u8]>) {
        self.ops.push(MetaOp::Delete(cf, key.as_ref().to_vec()));
    }

    pub fn delete_range(&mut self, cf: &'static str, from: impl AsRef<[u8]>, to: impl AsRef<[u8]>) {
        self.ops
            .push(MetaOp::DeleteRange(cf, from.as_ref().to_vec(), to.as_ref().to_vec()));
    }

    pub fn count(&mut self, cf: &'static str, key: impl AsRef<[u8]>, delta: i64) {
        self.ops.push(MetaOp::Count(cf, key.as_ref().to_vec(), delta));
    }

    pub fn push(&mut self, op: MetaOp) {
        self.ops.push(op);
    }

    pub fn ops(&self) -> &[MetaOp] {
        &self.ops
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl Extend<MetaOp> for MetaBatch {
    fn extend<I: IntoIterator<Item = MetaOp>>(&mut self, iter: I) {
        self.ops.extend(iter);
    }
}

impl FromIterator<MetaOp> for MetaBatch {
    fn from_iter<I: IntoIterator<Item = MetaOp>>(iter: I) -> MetaBatch {
        MetaBatch {
            ops: iter.into_iter().collect(),
        }
    }
}

/// The value a count holds after `delta` moved it from `before`. A count whose record
/// cannot be read (not 8 bytes: a damaged store) stays as it is: moved from 0, it would read
/// as a number, and a wrong one, that nothing could tell from a right one; left unreadable,
/// the pool's next import counts it again from the grain map.
pub fn counted(before: Option<&[u8]>, delta: i64) -> Vec<u8> {
    match before {
        Some(b) if b.len() != 8 => b.to_vec(),
        _ => match before.map(crate::meta::decode_refcount).unwrap_or(0).checked_add(delta) {
            Some(n) => refcount_delta(n).to_vec(),
            // A count damaged past any real one: kept as it is, for the next import to count
            // again (as one not of 8 bytes is), rather than wrap or panic.
            None => before.map(<[u8]>::to_vec).unwrap_or_default(),
        },
    }
}
