//! Fencing on RADOS: what makes a replaced owner harmless when it resumes (within the 30 days
//! a blocklist lasts).
//!
//! Two layers, because either alone leaves a hole:
//! - every object a gateway writes carries the epoch it wrote under (attribute
//!   `tessera.epoch`, a fixed-width number, so that byte order is number order), and every
//!   write is guarded by "the object's epoch is at most mine": an object a later owner wrote
//!   refuses the old owner's writes, on the OSD, in the same operation;
//! - an object the new owner has not written yet still carries an old epoch, so the new owner
//!   also blocklists the old owner's client address before it serves. A placement group
//!   refuses the old client once it holds the map with the blocklist, and the new owner's
//!   first operation on an object brings its placement group there: the old owner can write
//!   an object only before the new owner first reads or writes it, as if the write had landed
//!   before the takeover, never after.

use tessera_rados::{Cluster, Pool, RadosError, WriteOp, XattrCmp};

use crate::{Gateway, Owner, OwnershipError, Result};

/// The attribute that holds the epoch an object was last written under.
pub const EPOCH_ATTR: &str = "tessera.epoch";

/// An epoch as the attribute holds it: 20 decimal digits.
pub fn epoch_text(epoch: i64) -> Vec<u8> {
    format!("{:020}", epoch.max(0)).into_bytes()
}

/// Writes to a pool on behalf of an owner at `epoch`.
pub struct FencedWriter<'p, 'c> {
    pool: &'p Pool<'c>,
    epoch: i64,
}

impl<'p, 'c> FencedWriter<'p, 'c> {
    pub fn new(pool: &'p Pool<'c>, epoch: i64) -> Self {
        FencedWriter { pool, epoch }
    }

    /// The guarded write of `data` at `offset` of an object that exists (one that does not
    /// fails with `ENOENT`: [`write`](Self::write) makes it), as a compound operation.
    pub fn guarded(&self, offset: u64, data: &[u8]) -> WriteOp {
        self.guarded_pieces(vec![(offset, data.to_vec())])
    }

    /// One guarded write of several pieces of an object that exists, applied in the order
    /// given (a later piece over an earlier one wins), as one compound operation.
    ///
    /// The data comes first and the guard after it (the OSD refuses the whole operation
    /// whichever step fails): the message's data then starts with the first piece's bytes,
    /// which the OSD receives aligned as their place in the object and writes without
    /// copying them. Behind the guard's few bytes, every piece had to be copied to realign
    /// it (the OSD's CPU per 256 KiB write fell by a tenth).
    pub fn guarded_pieces(&self, pieces: Vec<(u64, Vec<u8>)>) -> WriteOp {
        let mine = epoch_text(self.epoch);
        let mut op = WriteOp::new().assert_exists();
        for (offset, data) in pieces {
            op = op.write_owned(offset, data);
        }
        op.guard_xattr(EPOCH_ATTR, XattrCmp::Lte, &mine)
            .set_xattr(EPOCH_ATTR, &mine)
    }

    /// Writes `data` at `offset` of `oid`, unless an owner with a later epoch wrote the object
    /// (`RadosError::is_guard_failure`) or this client was fenced off (`is_fenced`).
    pub fn write(&self, oid: &str, offset: u64, data: &[u8]) -> std::result::Result<(), RadosError> {
        let mine = epoch_text(self.epoch);
        loop {
            match self.pool.operate(oid, &self.guarded(offset, data)) {
                Err(e) if e.errno() == Some(libc::ENOENT) => {}
                r => return r,
            }
            // A new object: made with the epoch, unless another writer made it meanwhile
            // (then the guarded write again).
            let made = WriteOp::new()
                .create(true)
                .write(offset, data)
                .set_xattr(EPOCH_ATTR, &mine);
            match self.pool.operate(oid, &made) {
                Err(e) if e.errno() == Some(libc::EEXIST) => continue,
                r => return r,
            }
        }
    }
}

/// How long a fenced-off client stays blocklisted: 30 days. Ceph's default (0 asks for it)
/// is an hour, after which a gateway that stalled longer (a paused virtual machine) could
/// have its queued writes accepted again by objects the new owner has not written since,
/// which the epoch guard alone does not refuse. Entries expire, so the cluster's map does
/// not grow for ever with every takeover.
pub const BLOCKLIST_SECONDS: u32 = 30 * 24 * 3600;

/// Takes `vdisk` for `gateway` if nobody owns it, fencing the previous owners' clients off
/// the cluster first (`Gateway::take_fenced`, with a blocklist of each address not known to
/// be fenced off yet). Returns the owner afterwards: this gateway (ready to serve at its
/// epoch) or the one that holds it.
pub async fn take_over(gateway: &mut Gateway, cluster: &Cluster, vdisk: &str) -> Result<Owner> {
    let mine = cluster
        .address()
        .map_err(|e| OwnershipError(format!("cannot learn this client's address: {e}")))?;
    gateway
        .take_fenced(vdisk, &mine, |old| {
            old.iter()
                .try_for_each(|a| cluster.blocklist(a, BLOCKLIST_SECONDS).map_err(|e| format!("{a}: {e}")))
        })
        .await
}
