//! Fencing on RADOS: what makes a replaced owner harmless when it resumes (within the 30 days
//! a blocklist lasts).
//!
//! Two layers, because either alone leaves a hole:
//! - every write carries the epoch it is written under, and an object refuses a write whose
//!   epoch is lower than one already applied to it: an object a later owner wrote refuses
//!   the old owner's writes, on the OSD, in the same operation. The epoch is the write's
//!   sequence ([`Pool::order_writes`]): RADOS keeps, per object, the highest sequence that
//!   wrote it (a snapshot context's, without snapshots) and refuses lower ones for writes
//!   flagged to be ordered, at no cost of its own. Until 2026-12-02 the epoch was an
//!   attribute (`tessera.epoch`) compared and set by each write: two more steps in every
//!   operation, which cost the OSD about a fifth of a 4K write's time;
//! - an object the new owner has not written yet still carries an old epoch, so the new owner
//!   also blocklists the old owner's client address before it serves. A placement group
//!   refuses the old client once it holds the map with the blocklist, and the new owner's
//!   first operation on an object brings its placement group there: the old owner can write
//!   an object only before the new owner first reads or writes it, as if the write had landed
//!   before the takeover, never after.
//!
//! The pool's metadata object is guarded by the epoch as an attribute too
//! ([`EPOCH_ATTR`]): its commits compare values anyway (crate::rados_meta).

use tessera_rados::{Cluster, Pool, RadosError, WriteOp};

use crate::{FenceError, Gateway, Owner, OwnershipError, Result};

/// The attribute that holds the epoch an object was last written under.
pub const EPOCH_ATTR: &str = "tessera.epoch";

/// An epoch as the attribute holds it: 20 decimal digits.
pub fn epoch_text(epoch: i64) -> Vec<u8> {
    format!("{:020}", epoch.max(0)).into_bytes()
}

/// The epoch an attribute holds, if it holds one as [`epoch_text`] writes it: anything else
/// (set by hand, damaged) compares with epochs by its bytes in the OSD's guards, and refuses
/// every writer if it sorts after their epochs.
pub fn epoch_of(text: &[u8]) -> Option<i64> {
    (text.len() == 20 && text.iter().all(u8::is_ascii_digit))
        .then(|| std::str::from_utf8(text).ok()?.parse().ok())
        .flatten()
}

/// Writes to a pool on behalf of an owner at `epoch`: every write through the pool's context
/// carries it from now on, so that each context serves one owner.
pub struct FencedWriter<'p, 'c> {
    pool: &'p Pool<'c>,
}

impl<'p, 'c> FencedWriter<'p, 'c> {
    /// Orders every write through `pool` by `epoch`. The RADOS pool is put in the
    /// self-managed snapshot mode first (as librbd's images use it), the one in which the
    /// OSDs honour a client's sequence; a pool with pool snapshots is refused, as its OSDs
    /// would ignore it.
    pub fn new(pool: &'p Pool<'c>, epoch: i64) -> std::result::Result<Self, RadosError> {
        pool.use_self_managed_snapshots()?;
        pool.order_writes(epoch.max(0) as u64)?;
        Ok(FencedWriter { pool })
    }

    /// Writes `data` at `offset` of `oid`, unless an owner with a later epoch wrote the object
    /// (`RadosError::is_out_of_order`) or this client was fenced off (`is_fenced`).
    pub fn write(&self, oid: &str, offset: u64, data: &[u8]) -> std::result::Result<(), RadosError> {
        self.pool.operate(oid, &write_op(vec![(offset, data.to_vec())]))
    }
}

/// One write of several pieces of an object, applied in the order given (a later piece over
/// an earlier one wins), as one compound operation, for a context whose writes are ordered
/// by an epoch already ([`FencedWriter::new`]): the epoch is its only guard. The data alone
/// makes the message, which the OSD receives aligned as its place in the object and writes
/// without copying it (the object is made if it does not exist).
pub(crate) fn write_op(pieces: Vec<(u64, Vec<u8>)>) -> WriteOp {
    let mut op = WriteOp::new();
    for (offset, data) in pieces {
        op = op.write_owned(offset, data);
    }
    op
}

/// How long a fenced-off client stays blocklisted: 30 days. Ceph's default (0 asks for it)
/// is an hour, after which a gateway that stalled longer (a paused virtual machine) could
/// have its queued writes accepted again by objects the new owner has not written since,
/// which the epoch alone does not refuse. Entries expire, so the cluster's map does
/// not grow for ever with every takeover.
pub const BLOCKLIST_SECONDS: u32 = 30 * 24 * 3600;

/// At most this many addresses are fenced off in one taking: a fence record grows by one
/// address per owner that was never fenced, a handful at worst; more is a damaged record,
/// each entry of which would cost a monitor command and a blocklist entry for 30 days.
pub const MOST_FENCED: usize = 64;

/// Whether `address` is one client's address as librados gives it (`IP:PORT/NONCE`, the IP
/// maybe bracketed, maybe after `v1:` or `v2:`; or a list of such in brackets), whose
/// blocklisting fences that client off alone. A nonce of 0 names no client: the monitors take
/// such an entry for every client of that host (this gateway too, if it is the same), so a
/// fence record that holds one (or anything else) is refused, not obeyed.
pub fn client_address(address: &str) -> std::result::Result<(), String> {
    match address.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
        // The addresses of one client, each of which must be one.
        Some(list) if list.starts_with("v1:") || list.starts_with("v2:") => {
            list.split(',').try_for_each(one_client_address)
        }
        _ => one_client_address(address),
    }
}

fn one_client_address(address: &str) -> std::result::Result<(), String> {
    let bare = address
        .strip_prefix("v1:")
        .or_else(|| address.strip_prefix("v2:"))
        .unwrap_or(address);
    let (host_port, nonce) = bare
        .rsplit_once('/')
        .ok_or_else(|| format!("'{address}' is no client's address (IP:PORT/NONCE)"))?;
    let (host, port) = host_port
        .rsplit_once(':')
        .ok_or_else(|| format!("'{address}' is no client's address (IP:PORT/NONCE)"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.parse::<std::net::IpAddr>().is_err() || port.parse::<u16>().is_err() {
        return Err(format!("'{address}' is no client's address (IP:PORT/NONCE)"));
    }
    match nonce.parse::<u32>() {
        Ok(0) => Err(format!(
            "'{address}' names every client of {host} (a nonce of 0), not one client"
        )),
        Ok(_) => Ok(()),
        Err(_) => Err(format!("'{address}' is no client's address (IP:PORT/NONCE)")),
    }
}

/// Takes `vdisk` for `gateway` if nobody owns it, fencing the previous owners' clients off
/// the cluster first (`Gateway::take_fenced`, with a blocklist of each address not known to
/// be fenced off yet, and of `last_writer` too unless it is among them: the address the
/// vdisk's data last said its owner wrote from, which stands in for a fence record etcd
/// lost). Returns the owner afterwards: this gateway (ready to serve at its epoch) or the
/// one that holds it. Each call to etcd is bounded by `within`.
pub async fn take_over(
    gateway: &mut Gateway,
    cluster: &Cluster,
    vdisk: &str,
    last_writer: Option<&str>,
    within: std::time::Duration,
) -> Result<Owner> {
    let mine = cluster
        .address()
        .map_err(|e| OwnershipError::new(format!("cannot learn this client's address: {e}")))?;
    gateway
        .take_fenced(vdisk, &mine, within, |old| {
            let mut targets = old.to_vec();
            if let Some(w) = last_writer.filter(|w| *w != mine && !old.iter().any(|a| a == w)) {
                targets.push(w.to_string());
            }
            // A damaged record is refused whole: fencing part of it could leave the owner
            // it lost unfenced, and obeying it could fence whole hosts off.
            if targets.len() > MOST_FENCED {
                return Err(FenceError::lasting(format!(
                    "the fence record holds {} addresses, more than {MOST_FENCED}: it is damaged; fence the previous owners off by hand and put the record right in etcd",
                    targets.len()
                )));
            }
            if let Err(e) = old.iter().try_for_each(|a| client_address(a)) {
                return Err(FenceError::lasting(format!(
                    "the fence record of {vdisk} in etcd holds {e}: it is damaged; fence the previous owners off by hand ('ceph osd blocklist add') and put the record right (one client address a line)"
                )));
            }
            if let Some(Err(e)) = last_writer.map(client_address) {
                return Err(FenceError::lasting(format!(
                    "the attribute tessera.owner of the metadata object of {vdisk} holds {e}: it is damaged; fence its last owner off by hand and remove the attribute ('rados rmxattr')"
                )));
            }
            targets.iter().try_for_each(|a| {
                cluster.blocklist(a, BLOCKLIST_SECONDS).map_err(|e| match e.errno() {
                    Some(libc::EACCES) | Some(libc::EPERM) => FenceError::lasting(format!(
                        "{a}: {e}; this gateway's Ceph client may not blocklist: give it the monitor caps 'profile rbd'"
                    )),
                    // An address the monitors cannot parse stays so.
                    Some(libc::EINVAL) => FenceError::lasting(format!("{a}: {e}")),
                    // A timeout, monitors electing a leader: the next try may succeed.
                    _ => FenceError::passing(format!("{a}: {e}")),
                })
            })
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::client_address;

    #[test]
    fn only_one_clients_address_is_fenced() {
        for ok in [
            "127.0.0.1:0/2847524692",
            "v1:10.0.0.7:0/17",
            "[v2:10.0.0.7:0/17,v1:10.0.0.7:0/17]",
            "[::1]:0/99",
            "v2:[fe80::1]:6800/3",
        ] {
            assert_eq!(client_address(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("10.0.0.7:0/0", "every client of 10.0.0.7"),
            ("[v2:10.0.0.7:0/17,v1:10.0.0.7:0/0]", "every client"),
            ("10.0.0.7", "no client's address"),
            ("10.0.0.7:0", "no client's address"),
            ("host.example:0/5", "no client's address"),
            ("10.0.0.7:0/x", "no client's address"),
            ("10.0.0.7:99999/5", "no client's address"),
            ("", "no client's address"),
            ("[]", "no client's address"),
        ] {
            let e = client_address(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
