//! Ownership of vdisks among several gateways, kept in etcd.
//!
//! Each gateway holds one etcd lease and keeps it alive; owning a vdisk is a key
//! `<prefix>/owner/<vdisk>` attached to that lease, created only if absent (one transaction),
//! so at most one gateway owns a vdisk at a time. The key's creation revision is the owner's
//! epoch: etcd's revisions only grow, so every takeover has a larger epoch than any owner
//! before it. A gateway that dies or stalls stops renewing its lease; when the lease expires
//! etcd deletes its keys and another gateway may take the vdisk, with a new epoch. The epoch
//! is what the data path checks: a write guarded by an older epoch is refused by the storage
//! itself (a RADOS compound write guarded by the vdisk's epoch attribute), so a stalled owner
//! that resumes cannot write after the takeover.
//!
//! Built only with the `etcd` feature. Why etcd-client: it is the maintained Rust client of
//! etcd's v3 API (leases, transactions), async on tokio like the daemon.
#![cfg(feature = "etcd")]

pub mod alua;
#[cfg(feature = "fencing")]
pub mod fence;
#[cfg(feature = "fencing")]
pub mod fenced_disk;
#[cfg(feature = "fencing")]
pub mod rados_meta;

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::task::JoinHandle;

/// What went wrong talking to etcd.
#[derive(Debug)]
pub struct OwnershipError(pub String);

impl std::fmt::Display for OwnershipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for OwnershipError {}

impl From<etcd_client::Error> for OwnershipError {
    fn from(e: etcd_client::Error) -> Self {
        OwnershipError(format!("etcd: {e}"))
    }
}

pub type Result<T> = std::result::Result<T, OwnershipError>;

/// Who owns a vdisk, since which epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub gateway: String,
    pub epoch: i64,
    /// The lease the ownership hangs on. A gateway restarted before its old lease lapsed has
    /// the same name and another lease: what the old run owned is not the new run's (it must
    /// wait for the lease, then take it over and fence the old run off like any other).
    pub lease: i64,
}

/// The owner an owner key names: the gateway in its value, the epoch its creation revision.
pub(crate) fn owner_of(kv: &etcd_client::KeyValue) -> Owner {
    Owner {
        gateway: String::from_utf8_lossy(kv.value()).into_owned(),
        epoch: kv.create_revision(),
        lease: kv.lease(),
    }
}

/// One gateway's membership: its lease, renewed in the background until `leave` (or until
/// the process dies or stalls, which is the point).
pub struct Gateway {
    client: Client,
    name: String,
    prefix: String,
    lease: i64,
    keeper: JoinHandle<()>,
}

impl Gateway {
    /// Joins as gateway `name` with a lease of `ttl` seconds, renewed every third of it.
    pub async fn join(endpoints: &[String], prefix: &str, name: &str, ttl: i64) -> Result<Gateway> {
        if ttl < 2 {
            return Err(OwnershipError(format!(
                "a lease of {ttl} s is too short to be renewed in time"
            )));
        }
        let mut client = Client::connect(endpoints, None).await?;
        let lease = client.lease_grant(ttl, None).await?.id();
        let (mut keeper, mut answers) = client.lease_keep_alive(lease).await?;
        let every = Duration::from_millis(ttl as u64 * 1000 / 3);
        let lease_time = Duration::from_secs(ttl as u64);
        let keeper = tokio::spawn(async move {
            loop {
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                match tokio::time::timeout(lease_time, answers.message()).await {
                    Ok(Ok(Some(a))) if a.ttl() > 0 => {}
                    // The lease is gone (expired while this process stalled, or revoked), or
                    // etcd did not answer for as long as the lease lasts, so it may be:
                    // whatever this gateway owned, it must take for lost.
                    _ => return,
                }
                tokio::time::sleep(every).await;
            }
        });
        Ok(Gateway {
            client,
            name: name.to_string(),
            prefix: prefix.trim_end_matches('/').to_string(),
            lease,
            keeper,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease this run of the gateway holds what it owns under.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Whether `owner` is this run of this gateway (not an earlier run of the same name whose
    /// lease has not lapsed yet).
    pub fn holds(&self, owner: &Owner) -> bool {
        owner.gateway == self.name && owner.lease == self.lease
    }

    fn key(&self, vdisk: &str) -> String {
        format!("{}/owner/{vdisk}", self.prefix)
    }

    /// Takes `vdisk` if nobody owns it. Returns the owner afterwards: this gateway with its
    /// new epoch, or the gateway that holds it.
    pub async fn acquire(&mut self, vdisk: &str) -> Result<Owner> {
        let key = self.key(vdisk);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                self.name.as_str(),
                Some(PutOptions::new().with_lease(self.lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let r = self.client.txn(txn).await?;
        if r.succeeded() {
            // The put's revision is the key's creation revision.
            let epoch = r
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| OwnershipError("etcd answered a transaction without a header".into()))?;
            return Ok(Owner {
                gateway: self.name.clone(),
                epoch,
                lease: self.lease,
            });
        }
        for op in r.op_responses() {
            if let TxnOpResponse::Get(g) = op {
                if let Some(kv) = g.kvs().first() {
                    return Ok(owner_of(kv));
                }
            }
        }
        // Released between the compare and the read: try again.
        Box::pin(self.acquire(vdisk)).await
    }

    /// Takes `vdisk` if nobody owns it, as `acquire` does, and records `fence_address` (this
    /// gateway's client address in the storage) as the one to fence off should another
    /// gateway take the vdisk later. Returns the owner afterwards and, when this gateway took
    /// it, the address the previous owner recorded (none for the first owner): the caller
    /// fences that address off before it serves the vdisk.
    pub async fn acquire_fencing(&mut self, vdisk: &str, fence_address: &str) -> Result<(Owner, Option<String>)> {
        let key = self.key(vdisk);
        let fence = format!("{}/fence/{vdisk}", self.prefix);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.as_str(),
                    self.name.as_str(),
                    Some(PutOptions::new().with_lease(self.lease)),
                ),
                TxnOp::get(fence.as_str(), None),
                // No lease: the address must outlive the lease it was recorded under.
                TxnOp::put(fence.as_str(), fence_address, None),
            ])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let r = self.client.txn(txn).await?;
        if !r.succeeded() {
            // Another owns it, as read in the same transaction. (Falling back to `acquire`
            // here once took the vdisk without recording this gateway's address or returning
            // the previous owner's, when the key went in between: that owner went unfenced.)
            let holder = r.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().first().map(owner_of),
                _ => None,
            });
            return match holder {
                Some(o) => Ok((o, None)),
                // Released between the compare and the read: try again.
                None => Box::pin(self.acquire_fencing(vdisk, fence_address)).await,
            };
        }
        let epoch = r
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| OwnershipError("etcd answered a transaction without a header".into()))?;
        let previous = r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            _ => None,
        });
        Ok((
            Owner {
                gateway: self.name.clone(),
                epoch,
                lease: self.lease,
            },
            previous,
        ))
    }

    /// Takes `vdisk` if nobody owns it, as `acquire_fencing` does with `address`, and when
    /// this gateway took it, runs `fence` on the previous owner's address before returning
    /// (None for the first owner, and for this gateway's own address: it has nothing to fence
    /// off from itself). If `fence` fails the vdisk is given up again and the error returned:
    /// serving before the old owner is fenced could let its writes land. Returns the owner
    /// afterwards: this gateway, ready to serve at its epoch, or the one that holds it.
    pub async fn take_fenced(
        &mut self,
        vdisk: &str,
        address: &str,
        fence: impl FnOnce(Option<&str>) -> std::result::Result<(), String>,
    ) -> Result<Owner> {
        let (owner, previous) = self.acquire_fencing(vdisk, address).await?;
        if !self.holds(&owner) {
            return Ok(owner);
        }
        let other = previous.as_deref().filter(|a| *a != address);
        if let Err(e) = fence(other) {
            let _ = self.release(vdisk, owner.epoch).await;
            return Err(OwnershipError(format!(
                "cannot fence the previous owner of {vdisk} ({}) off: {e}",
                other.unwrap_or("none recorded")
            )));
        }
        Ok(owner)
    }

    /// The owner of `vdisk`, if any.
    pub async fn owner(&mut self, vdisk: &str) -> Result<Option<Owner>> {
        let r = self.client.get(self.key(vdisk), None::<GetOptions>).await?;
        Ok(r.kvs().first().map(owner_of))
    }

    /// Gives `vdisk` up, if this gateway owns it at `epoch`.
    pub async fn release(&mut self, vdisk: &str, epoch: i64) -> Result<bool> {
        let key = self.key(vdisk);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.as_str(), CompareOp::Equal, epoch),
                Compare::value(key.as_str(), CompareOp::Equal, self.name.as_str()),
            ])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        Ok(self.client.txn(txn).await?.succeeded())
    }

    fn mark_key(&self, kind: &str, what: &str) -> String {
        format!("{}/{kind}/{what}/{}", self.prefix, self.name)
    }

    /// Puts this gateway's mark of `kind` on `what`, on its lease: it goes with the lease
    /// when the gateway dies, stalls or leaves.
    async fn mark(&mut self, kind: &str, what: &str) -> Result<()> {
        let key = self.mark_key(kind, what);
        self.client
            .put(key, "", Some(PutOptions::new().with_lease(self.lease)))
            .await?;
        Ok(())
    }

    async fn unmark(&mut self, kind: &str, what: &str) -> Result<()> {
        let key = self.mark_key(kind, what);
        self.client.delete(key, None).await?;
        Ok(())
    }

    /// The gateways whose mark of `kind` is on `what` now (whose leases hold), in name order.
    async fn marked(&mut self, kind: &str, what: &str) -> Result<Vec<String>> {
        let from = format!("{}/{kind}/{what}/", self.prefix);
        let r = self
            .client
            .get(from.as_str(), Some(GetOptions::new().with_prefix().with_keys_only()))
            .await?;
        let mut names: Vec<String> = r
            .kvs()
            .iter()
            .filter_map(|kv| kv.key_str().ok()?.strip_prefix(from.as_str()).map(String::from))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Says that this gateway presents `what` (the LUNs of a pool), on its lease: the word
    /// goes with the lease when the gateway dies, stalls or leaves.
    pub async fn announce(&mut self, what: &str) -> Result<()> {
        self.mark("presents", what).await
    }

    /// Takes back [`announce`](Self::announce).
    pub async fn unannounce(&mut self, what: &str) -> Result<()> {
        self.unmark("presents", what).await
    }

    /// The gateways that present `what` now (whose leases hold), in name order.
    pub async fn presenting(&mut self, what: &str) -> Result<Vec<String>> {
        self.marked("presents", what).await
    }

    /// Asks the owner of `what` to hand it over (hosts reach this gateway and not the
    /// owner), on this gateway's lease.
    pub async fn ask_for(&mut self, what: &str) -> Result<()> {
        self.mark("wants", what).await
    }

    /// Takes back [`ask_for`](Self::ask_for).
    pub async fn stop_asking(&mut self, what: &str) -> Result<()> {
        self.unmark("wants", what).await
    }

    /// The gateways that ask for `what` now, in name order.
    pub async fn asking(&mut self, what: &str) -> Result<Vec<String>> {
        self.marked("wants", what).await
    }

    /// Whether the lease is still being renewed (false once it was lost, or may have been: a
    /// gateway stops serving what it owned when this turns false).
    pub fn alive(&self) -> bool {
        !self.keeper.is_finished()
    }

    /// Stops renewing the lease without giving anything up, as a gateway that stalls or dies
    /// does: what it owns passes to others once the lease expires.
    pub fn stall(&self) {
        self.keeper.abort();
    }

    /// Leaves: revokes the lease, which gives up everything this gateway owns at once.
    pub async fn leave(mut self) -> Result<()> {
        self.keeper.abort();
        self.client.lease_revoke(self.lease).await?;
        Ok(())
    }
}
