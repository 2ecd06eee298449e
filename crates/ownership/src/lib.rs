//! Ownership of vdisks among several gateways, kept in etcd.
//!
//! Each gateway holds one etcd lease and keeps it alive; owning a vdisk is a key
//! `<prefix>/owner/<vdisk>` attached to that lease, created only if absent (one transaction),
//! so at most one gateway owns a vdisk at a time. The key's creation revision is the owner's
//! epoch: etcd's revisions only grow, so every takeover has a larger epoch than any owner
//! before it. A gateway that dies or stalls stops renewing its lease; when the lease expires
//! etcd deletes its keys and another gateway may take the vdisk, with a new epoch. The epoch
//! is what the data path checks: a write carrying an older epoch than one an object already
//! took is refused by the storage itself (the epoch is the RADOS write's sequence; the
//! metadata object's, a guarded attribute), so a stalled owner that resumes cannot write
//! after the takeover.
//!
//! Built only with the `etcd` feature. Why etcd-client: it is the maintained Rust client of
//! etcd's v3 API (leases, transactions), async on tokio like the daemon.
#![cfg(feature = "etcd")]

pub mod alua;
pub mod courier;
pub mod etcd_user;
#[cfg(feature = "fencing")]
pub mod fence;
#[cfg(feature = "fencing")]
pub mod fenced_disk;
pub mod lease_clock;
mod members;
#[cfg(feature = "fencing")]
pub mod rados_meta;
pub mod watching;

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::task::JoinHandle;

pub use courier::{Ask, AsksComing, Courier, NoticesComing};
pub use etcd_user::EtcdUser;
pub use lease_clock::LeaseClock;

/// A gateway's lease, and whether it is still renewed ([`Gateway::liveness`]).
pub struct Liveness {
    lease: i64,
    keeper: tokio::task::AbortHandle,
}

impl Liveness {
    /// As [`Gateway::alive`].
    pub fn alive(&self) -> bool {
        !self.keeper.is_finished()
    }

    /// As [`Gateway::lease`].
    pub fn lease(&self) -> i64 {
        self.lease
    }
}

/// What went wrong talking to etcd, or taking a vdisk.
#[derive(Debug)]
pub struct OwnershipError {
    message: String,
    /// Set when a taking took the vdisk, could not fence the previous owner off and gave it
    /// back ([`Gateway::take_fenced`]): whether the fence's refusal lasts.
    gave_back: Option<Lasting>,
}

/// Whether a failure lasts until someone changes something (a permission), or may pass by
/// itself (monitors electing a leader, a timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lasting {
    Lasts,
    MayPass,
}

/// What `call` to etcd answers, or an error once `within` passed without an answer.
async fn answered_within<T>(within: Duration, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(within, call).await.unwrap_or_else(|_| {
        Err(OwnershipError::new(format!(
            "etcd did not answer within {} s (a member stalled, or is cut off?)",
            within.as_secs_f64()
        )))
    })
}

impl OwnershipError {
    pub fn new(message: impl Into<String>) -> OwnershipError {
        OwnershipError {
            message: message.into(),
            gave_back: None,
        }
    }

    /// For a taking that took the vdisk, could not fence the previous owner off, and gave
    /// it back: whether the fence's refusal lasts. `None` for any other error.
    pub fn gave_back(&self) -> Option<Lasting> {
        self.gave_back
    }
}

impl std::fmt::Display for OwnershipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for OwnershipError {}

impl From<etcd_client::Error> for OwnershipError {
    fn from(e: etcd_client::Error) -> Self {
        // A refusal's code and message, not the whole gRPC status (its headers); then what
        // caused it, down to a TLS handshake's reason.
        let mut said = match &e {
            etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
            other => other.to_string(),
        };
        let mut cause = match &e {
            etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
            other => std::error::Error::source(other),
        };
        while let Some(c) = cause {
            let c_said = c.to_string();
            if !said.contains(&c_said) {
                said.push_str(&format!(": {c_said}"));
            }
            cause = c.source();
        }
        OwnershipError::new(format!("etcd: {said}"))
    }
}

pub type Result<T> = std::result::Result<T, OwnershipError>;

/// Why fencing the previous owners off failed (what [`Gateway::take_fenced`]'s `fence` returns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceError {
    pub message: String,
    pub lasting: Lasting,
}

impl FenceError {
    /// A refusal that lasts until someone changes something (this gateway's permissions).
    pub fn lasting(message: impl Into<String>) -> FenceError {
        FenceError {
            message: message.into(),
            lasting: Lasting::Lasts,
        }
    }

    /// A failure that may pass by itself (the monitors did not answer in time).
    pub fn passing(message: impl Into<String>) -> FenceError {
        FenceError {
            message: message.into(),
            lasting: Lasting::MayPass,
        }
    }
}

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

/// The addresses a fence record holds, one per line (a record of one address, as an owner
/// records it once it fenced the others off, is one line).
fn fence_addresses(record: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(record)
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect()
}

/// One gateway's membership: its lease, renewed in the background until `leave` (or until
/// the process dies or stalls, which is the point).
pub struct Gateway {
    client: Client,
    name: String,
    prefix: String,
    lease: i64,
    keeper: JoinHandle<()>,
    /// Until when the lease surely holds, which `keeper` moves on.
    clock: LeaseClock,
    /// Follows the keys of every gateway, once asked to (`follow_changes`).
    follower: Option<JoinHandle<()>>,
    /// Wakes `keeper` for a renewal at once: `follower` saw a key on the lease deleted.
    doubt: std::sync::Arc<tokio::sync::Notify>,
    /// Wakes `token_keeper` to buy a token at once (etcd may have restarted, and forgotten
    /// the one it gave); None without a user.
    renew_token: Option<std::sync::Arc<tokio::sync::Notify>>,
    /// Buys the etcd user's token again before it lapses (etcd_user.rs); None without a user.
    token_keeper: Option<JoinHandle<()>>,
    /// Keeps requests to the etcd members that answer (members.rs); None with one endpoint.
    members_keeper: Option<JoinHandle<()>>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(f) = self.follower.take() {
            f.abort();
        }
        if let Some(k) = self.token_keeper.take() {
            k.abort();
        }
        if let Some(k) = self.members_keeper.take() {
            k.abort();
        }
        // Nobody acts on the lease any more: it lapses, as a stalled gateway's does.
        self.keeper.abort();
    }
}

/// How a gateway reaches an etcd that serves TLS (`https://` endpoints): the certificate of
/// the authority that signed etcd's, and the gateway's own certificate and key, which etcd
/// started with `--client-cert-auth` asks for (with authentication on, the certificate's
/// common name is the etcd user, so that etcd's roles can confine each gateway to the
/// gateways' prefix). A user and password ([`EtcdUser`]) are the other way to be one.
#[derive(Clone, Default)]
pub struct EtcdTls {
    /// PEM.
    pub ca: Vec<u8>,
    /// PEM certificate and PEM private key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

/// How soon a keep-alive stream that broke is opened again.
const REOPEN: Duration = Duration::from_millis(200);

/// How soon the watch of the gateways' keys is made again once it ended.
const REWATCH: Duration = Duration::from_millis(500);

/// Renews `lease` every `every` through `stream`, moving `renewed` on with each answer, until
/// the lease is lost: etcd says it is gone (it expired while this process stalled, or was
/// revoked), or `renewed` no longer holds (no answer for as long as the lease lasts). A stream
/// that breaks (etcd restarted or elected a leader, the connection dropped) is opened again
/// meanwhile, as often as it takes: the lease surely holds until `renewed` says otherwise
/// (etcd counts from the arrival of the last renewal it answered, and gives a lease its whole
/// time again when it restarts), so a short outage of etcd costs the gateway nothing.
/// Opening a stream renews the lease (etcd answers the first renewal before the stream is
/// handed over), but that renewal is not counted: its answer's term is not seen. `doubt` wakes it for a
/// renewal at once (a key on the lease was deleted: etcd may have revoked the lease), so
/// that the lease's loss is known within a round trip, not a period.
async fn keep_lease(
    mut client: Client,
    lease: i64,
    stream: (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream),
    every: Duration,
    renewed: LeaseClock,
    renew_token: Option<std::sync::Arc<tokio::sync::Notify>>,
    terms: members::Terms,
    doubt: std::sync::Arc<tokio::sync::Notify>,
) {
    let mut stream = Some(stream);
    let next = |sent: std::time::Instant| {
        let doubt = doubt.clone();
        async move {
            tokio::select! {
                _ = tokio::time::sleep_until((sent + every).into()) => {}
                _ = doubt.notified() => {}
            }
        }
    };
    // After a failure that came at once (etcd restarting, refusing): not again at once. After
    // a timeout, half a period has gone already.
    let pause_after = |sent: std::time::Instant| {
        let waited = sent.elapsed();
        let pause = if waited < every / 2 {
            REOPEN.saturating_sub(waited)
        } else {
            Duration::ZERO
        };
        tokio::time::sleep(pause)
    };
    loop {
        let (keeper, answers) = match &mut stream {
            Some(s) => s,
            None => {
                let sent = std::time::Instant::now();
                // Half a period at most: a member that stalls must leave time to try another
                // before the lease runs out (three periods after the last renewal).
                match tokio::time::timeout(every / 2, client.lease_keep_alive(lease)).await {
                    Ok(Ok(s)) => {
                        // Its first answer is not counted: etcd-client reads it, and its term
                        // with it, out of sight (a leader deposed while it stalled, reached
                        // again, would renew a lease its successor lets lapse). A renewal on
                        // the new stream, at once, whose answer's term is checked, is.
                        stream = Some(s);
                        continue;
                    }
                    failed => {
                        // etcd says the lease is gone (revoked, or expired while etcd was
                        // away from this gateway): lost at once, not once the clock runs out.
                        let gone = matches!(&failed, Ok(Err(e)) if e.to_string().contains("lease not found"));
                        if gone || !renewed.holds() {
                            renewed.lapsed();
                            return;
                        }
                        pause_after(sent).await;
                        continue;
                    }
                }
            }
        };
        let (sent, stamp) = (std::time::Instant::now(), lease_clock::Stamp::now());
        // Half a period for the answer too: with a renewal unanswered, a reopening timed out
        // and another made, the lease can still be renewed two periods and a half after the
        // last renewal, half a period before it runs out.
        let answer = match keeper.keep_alive().await {
            Ok(()) => match tokio::time::timeout(every / 2, answers.message()).await {
                Ok(Ok(Some(a))) => Some((a.ttl(), a.header().map_or(0, |h| h.raft_term()))),
                _ => None,
            },
            Err(_) => None,
        };
        // An answer in a term older than one heard (in an earlier answer, or from the members
        // asked how they stand) comes from a leader deposed while it stalled, or through a
        // member that has not heard of its successor yet: the successor may not have seen the
        // renewal. It counts as none, and the stream is opened again.
        let answer = answer.filter(|&(_, t)| terms.current(t)).map(|(ttl, _)| ttl);
        match answer {
            Some(ttl) if ttl > 0 => renewed.renewed(stamp, Duration::from_secs(ttl as u64)),
            // Gone: whatever this gateway owned, it must take for lost.
            Some(_) => {
                renewed.lapsed();
                return;
            }
            None if !renewed.holds() => {
                renewed.lapsed();
                return;
            }
            None => {
                stream = None;
                // etcd may have restarted, and forgotten the token with the others it gave
                // since its last snapshot: one is bought at once (the lease's renewals need
                // none, but every other request of the gateway's does).
                if let Some(renew) = &renew_token {
                    renew.notify_one();
                }
                pause_after(sent).await;
                continue;
            }
        }
        // A period from the renewal's sending, however long its answer took.
        next(sent).await;
    }
}

impl Gateway {
    /// Joins as gateway `name` with a lease of `ttl` seconds, renewed every third of it,
    /// through an etcd in plain text.
    pub async fn join(endpoints: &[String], prefix: &str, name: &str, ttl: i64) -> Result<Gateway> {
        Gateway::join_through(endpoints, None, prefix, name, ttl).await
    }

    /// [`join`](Self::join), through TLS when `tls` is given (every endpoint `https://`).
    pub async fn join_through(
        endpoints: &[String],
        tls: Option<&EtcdTls>,
        prefix: &str,
        name: &str,
        ttl: i64,
    ) -> Result<Gateway> {
        Gateway::join_as(endpoints, tls, None, prefix, name, ttl).await
    }

    /// [`join_through`](Self::join_through), as etcd user `user` when given: its password
    /// goes through TLS, or in plain text to an etcd on this machine only.
    pub async fn join_as(
        endpoints: &[String],
        tls: Option<&EtcdTls>,
        user: Option<&EtcdUser>,
        prefix: &str,
        name: &str,
        ttl: i64,
    ) -> Result<Gateway> {
        if ttl < 2 {
            return Err(OwnershipError::new(format!(
                "a lease of {ttl} s is too short to be renewed in time"
            )));
        }
        if user.is_some() && tls.is_none() {
            if let Some(e) = endpoints.iter().find(|e| !etcd_user::is_loopback(e)) {
                return Err(OwnershipError::new(format!(
                    "etcd endpoint '{e}' is plain text and not on this machine: a password goes to it through TLS only"
                )));
            }
        }
        let tls_options = || {
            tls.map(|tls| {
                let mut o = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(&tls.ca));
                if let Some((cert, key)) = &tls.identity {
                    o = o.identity(etcd_client::Identity::from_pem(cert, key));
                }
                etcd_client::ConnectOptions::new().with_tls(o)
            })
        };
        let mut options = tls_options();
        if let Some(u) = user {
            options = Some(
                options
                    .unwrap_or_default()
                    .with_user(u.name.clone(), u.password.clone()),
            );
        }
        let scheme_against = |e: &&String| match tls {
            Some(_) => e.starts_with("http://"),
            None => e.starts_with("https://"),
        };
        if let Some(e) = endpoints.iter().find(scheme_against) {
            return Err(OwnershipError::new(match tls {
                Some(_) => format!("etcd endpoint '{e}' is not https://, though TLS is set up"),
                None => format!("etcd endpoint '{e}' needs TLS: name the authority that signed its certificate"),
            }));
        }
        let mut client = Client::connect(endpoints, options).await?;
        let asked = lease_clock::Stamp::now();
        let granted = client.lease_grant(ttl, None).await?;
        let lease = granted.id();
        let granted = Duration::from_secs(granted.ttl().max(0) as u64);
        let clock = LeaseClock::granted(asked, granted);
        let stream = client.lease_keep_alive(lease).await?;
        let every = Duration::from_millis(ttl as u64 * 1000 / 3);
        // Wakes the token's renewal when the lease's stream breaks (keep_lease).
        let renew_token = user.map(|_| std::sync::Arc::new(tokio::sync::Notify::new()));
        let terms = members::Terms::default();
        let doubt = std::sync::Arc::new(tokio::sync::Notify::new());
        let keeper = tokio::spawn(keep_lease(
            client.clone(),
            lease,
            stream,
            every,
            clock.clone(),
            renew_token.clone(),
            terms.clone(),
            doubt.clone(),
        ));
        let token_keeper =
            user.map(|u| etcd_user::keep_token(&client, u, renew_token.clone().expect("made with a user")));
        let members_keeper = (endpoints.len() > 1).then(|| {
            let full = endpoints
                .iter()
                .map(|e| members::full_endpoint(e, tls.is_some()))
                .collect();
            members::keep_members(client.clone(), full, tls_options(), terms)
        });
        Ok(Gateway {
            client,
            name: name.to_string(),
            prefix: prefix.trim_end_matches('/').to_string(),
            lease,
            keeper,
            clock,
            follower: None,
            doubt,
            renew_token,
            token_keeper,
            members_keeper,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease this run of the gateway holds what it owns under.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// This gateway's end of the channel between the gateways ([`Courier`]).
    pub fn courier(&self) -> Courier {
        Courier {
            client: self.client.clone(),
            prefix: self.prefix.clone(),
            name: self.name.clone(),
            lease: self.lease,
        }
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
    /// new epoch, or the gateway that holds it. Without fencing, and blind to handoffs
    /// ([`release_to`](Self::release_to)): for tests and tools, not for a gateway's takings,
    /// which go through [`take_fenced`](Self::take_fenced).
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
                .ok_or_else(|| OwnershipError::new("etcd answered a transaction without a header"))?;
            return Ok(Owner {
                gateway: self.name.clone(),
                epoch,
                lease: self.lease,
            });
        }
        for op in r.op_responses() {
            if let TxnOpResponse::Get(g) = op {
                match g.kvs().first() {
                    Some(kv) if kv.lease() == 0 => self.drop_leaseless(kv).await?,
                    Some(kv) => return Ok(owner_of(kv)),
                    None => {}
                }
            }
        }
        // Released between the compare and the read: try again.
        Box::pin(self.acquire(vdisk)).await
    }

    /// Takes `vdisk` if nobody owns it, as `acquire` does, and adds `fence_address` (this
    /// gateway's client address in the storage) to the vdisk's fence record: the addresses
    /// to fence off should another gateway take the vdisk later. Returns the owner afterwards
    /// and, when this gateway took it, the addresses the record held before (none for the
    /// first owner): the caller fences those off before it serves the vdisk, then calls
    /// [`fenced`](Self::fenced).
    ///
    /// The record keeps every address until one taking has fenced them all: a taker whose
    /// fencing failed (or that died before it ended) leaves them for the next, so that an
    /// owner is never forgotten unfenced. A key this very run still holds (its release
    /// failed earlier) is given up and taken afresh, at a new epoch, so that the connection
    /// it was taken with before is fenced off like any other's.
    pub async fn acquire_fencing(&mut self, vdisk: &str, fence_address: &str) -> Result<(Owner, Vec<String>)> {
        let key = self.key(vdisk);
        let fence = self.fence_key(vdisk);
        let handoff = self.handoff_key(vdisk);
        let handed = match self.handoff(vdisk).await? {
            (Some(to), _) => return Ok((to, Vec::new())),
            (None, revision) => revision,
        };
        let record = self.client.get(fence.as_str(), None).await?;
        let (previous, changed) = match record.kvs().first() {
            Some(kv) => (fence_addresses(kv.value()), kv.mod_revision()),
            None => (Vec::new(), 0),
        };
        let mut after = previous.clone();
        if !after.iter().any(|a| a == fence_address) {
            after.push(fence_address.to_string());
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                Compare::mod_revision(fence.as_str(), CompareOp::Equal, changed),
                // Handed over since (to another): not taken.
                Compare::mod_revision(handoff.as_str(), CompareOp::Equal, handed),
            ])
            .and_then([
                TxnOp::put(
                    key.as_str(),
                    self.name.as_str(),
                    Some(PutOptions::new().with_lease(self.lease)),
                ),
                // No lease: the addresses must outlive the lease they were recorded under.
                TxnOp::put(fence.as_str(), after.join("\n"), None),
                // Taken by the gateway it was handed to, or back by the one that handed it.
                TxnOp::delete(handoff.as_str(), None),
            ])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let r = self.client.txn(txn).await?;
        if !r.succeeded() {
            // Another owns it, as read in the same transaction. (Falling back to `acquire`
            // here once took the vdisk without recording this gateway's address or returning
            // the previous owner's, when the key went in between: that owner went unfenced.)
            let holder = r.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().first().cloned(),
                _ => None,
            });
            if let Some(kv) = holder.as_ref().filter(|kv| kv.lease() == 0) {
                self.drop_leaseless(kv).await?;
                return Box::pin(self.acquire_fencing(vdisk, fence_address)).await;
            }
            return match holder.as_ref().map(owner_of) {
                Some(o) if self.holds(&o) => {
                    self.release(vdisk, o.epoch).await?;
                    Box::pin(self.acquire_fencing(vdisk, fence_address)).await
                }
                Some(o) => Ok((o, Vec::new())),
                // Released between the compare and the read, or the record changed under
                // another taker: try again.
                None => Box::pin(self.acquire_fencing(vdisk, fence_address)).await,
            };
        }
        let epoch = r
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| OwnershipError::new("etcd answered a transaction without a header"))?;
        Ok((
            Owner {
                gateway: self.name.clone(),
                epoch,
                lease: self.lease,
            },
            previous,
        ))
    }

    /// Says that every address the fence record of `vdisk` held before this gateway took it
    /// at `epoch` is fenced off: the record keeps this gateway's `address` only. Does nothing
    /// once the vdisk is no longer this gateway's at that epoch.
    pub async fn fenced(&mut self, vdisk: &str, epoch: i64, address: &str) -> Result<()> {
        let key = self.key(vdisk);
        let txn = Txn::new().when(self.owned_here_at(&key, epoch)).and_then([TxnOp::put(
            self.fence_key(vdisk),
            address,
            None,
        )]);
        self.client.txn(txn).await?;
        Ok(())
    }

    /// What a transaction on an owner key `key` compares: that this gateway holds it at
    /// `epoch` (its creation revision).
    fn owned_here_at(&self, key: &str, epoch: i64) -> [Compare; 2] {
        [
            Compare::create_revision(key, CompareOp::Equal, epoch),
            Compare::value(key, CompareOp::Equal, self.name.as_str()),
        ]
    }

    fn fence_key(&self, vdisk: &str) -> String {
        format!("{}/fence/{vdisk}", self.prefix)
    }

    fn place_key(&self, vdisk: &str) -> String {
        format!("{}/place/{vdisk}", self.prefix)
    }

    /// Where `vdisk` lives, as recorded ([`claim_place`](Self::claim_place)), if anywhere.
    pub async fn place(&mut self, vdisk: &str) -> Result<Option<String>> {
        let r = self.client.get(self.place_key(vdisk), None::<GetOptions>).await?;
        Ok(r.kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    /// Records `place` as where `vdisk` lives if nothing is recorded yet (without a lease: it
    /// outlives every owner), and returns what is recorded then (`place`, or the place of
    /// another vdisk of that name) and whether this call recorded it. One name is one ownership and one fence record among the
    /// gateways: two things of one name in two places would share them, and each taker would
    /// fence the other's owners rather than its own.
    pub async fn claim_place(&mut self, vdisk: &str, place: &str) -> Result<(String, bool)> {
        let key = self.place_key(vdisk);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), place, None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let r = self.client.txn(txn).await?;
        if r.succeeded() {
            return Ok((place.to_string(), true));
        }
        r.op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| (String::from_utf8_lossy(kv.value()).into_owned(), false)),
                _ => None,
            })
            .ok_or_else(|| OwnershipError::new(format!("etcd holds a place of {vdisk} and did not give it")))
    }

    /// Takes back a place `claim_place` recorded for `vdisk` that was not made there after
    /// all (its making failed before it was taken): only the place, only if it is still
    /// `place`, and only if no gateway took `vdisk` (nor handed it over) since the place was
    /// recorded: one that did may have been told the same place (the same making sent to
    /// two gateways) and made it there. An owner from before (a pool of the name made
    /// elsewhere before places were recorded) did not. Its fence record stays: it may be
    /// that of such a pool.
    pub async fn unclaim_place(&mut self, vdisk: &str, place: &str) -> Result<()> {
        let key = self.place_key(vdisk);
        let found = self.client.get(key.as_str(), None).await?;
        let Some(kv) = found.kvs().first().filter(|kv| kv.value() == place.as_bytes()) else {
            return Ok(());
        };
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision()),
                // An owner key that is absent compares as revision 0.
                Compare::create_revision(self.key(vdisk), CompareOp::Less, kv.create_revision()),
                // Nor handed over since (its owner key gone meanwhile, the pool made).
                Compare::create_revision(self.handoff_key(vdisk), CompareOp::Less, kv.create_revision()),
            ])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        self.client.txn(txn).await?;
        Ok(())
    }

    /// Forgets where `vdisk` lived and its fence record, once it is gone from there for good
    /// (destroyed): only if the place recorded is `place`, so that a gateway never forgets
    /// another's, and only while this gateway owns `vdisk` at `epoch`, so that one whose
    /// lease lapsed meanwhile never forgets the records of a vdisk of the name made there
    /// since by another. True if it forgot them.
    pub async fn forget_place(&mut self, vdisk: &str, place: &str, epoch: i64) -> Result<bool> {
        let key = self.place_key(vdisk);
        let [owned, by_me] = self.owned_here_at(&self.key(vdisk), epoch);
        let txn = Txn::new()
            .when([Compare::value(key.as_str(), CompareOp::Equal, place), owned, by_me])
            .and_then([
                TxnOp::delete(key.as_str(), None),
                TxnOp::delete(self.fence_key(vdisk), None),
            ]);
        Ok(self.client.txn(txn).await?.succeeded())
    }

    /// Takes `vdisk` if nobody owns it, as `acquire_fencing` does with `address`, and when
    /// this gateway took it, runs `fence` on the addresses of the previous owners not known
    /// to be fenced off yet (none for the first owner; never this gateway's own `address`)
    /// before returning. If `fence` fails the vdisk is given up again, those addresses left
    /// on record for the next taker as they were before this taking (not this gateway's
    /// `address`, whose connection only tried to fence and never wrote: each failed taking
    /// would otherwise leave one more for the next taker to fence, one monitor command
    /// each), and the error returned: serving before the old owner is fenced could let its
    /// writes land. Returns the owner afterwards: this gateway, ready to serve at its epoch,
    /// or the one that holds it.
    ///
    /// Each call to etcd is bounded by `within` (a member that stalls answers nothing, not
    /// even an error), each on its own: a bound over the whole taking would pass during a
    /// long fence and cut the taking short after its transaction, leaving the vdisk held
    /// here unserved and this connection's address on record, one more for every next try
    /// to fence. The fence bounds itself (a monitor command each).
    pub async fn take_fenced(
        &mut self,
        vdisk: &str,
        address: &str,
        within: Duration,
        fence: impl FnOnce(&[String]) -> std::result::Result<(), FenceError>,
    ) -> Result<Owner> {
        let (owner, previous) = answered_within(within, self.acquire_fencing(vdisk, address)).await?;
        if !self.holds(&owner) {
            return Ok(owner);
        }
        let others: Vec<String> = previous.iter().filter(|a| *a != address).cloned().collect();
        if let Err(e) = fence(&others) {
            let lasting = e.lasting;
            let fenced_off = if others.is_empty() {
                "none recorded".to_string()
            } else {
                others.join(", ")
            };
            // The record as it was before this taking: the exact undo of `acquire_fencing`.
            let e = e.message;
            return Err(match answered_within(within, self.give_back(vdisk, owner.epoch, &previous)).await {
                Ok(_) => OwnershipError {
                    message: format!("cannot fence the previous owner of {vdisk} ({fenced_off}) off: {e}"),
                    gave_back: Some(lasting),
                },
                // Still held on this lease: not a taking that gave the vdisk back.
                Err(g) => OwnershipError::new(format!(
                    "could not give {vdisk} back after failing to fence its previous owner ({fenced_off}) off ({e}): {g}"
                )),
            });
        }
        // Those are fenced off now; should this fail, the next taker fences them again,
        // which does no harm.
        let _ = answered_within(within, self.fenced(vdisk, owner.epoch, address)).await;
        Ok(owner)
    }

    /// The revision etcd is at now: every epoch taken so far is at most this.
    pub async fn revision(&mut self) -> Result<i64> {
        let r = self
            .client
            // Under the prefix's '/': the range a gateway's etcd role grants (docs/security.md).
            .get(
                format!("{}/", self.prefix),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await?;
        r.header()
            .map(|h| h.revision())
            .ok_or_else(|| OwnershipError::new("etcd's answer carried no revision"))
    }

    /// The owner of `vdisk`, if any. A key without a lease owns nothing (see
    /// [`drop_leaseless`](Self::drop_leaseless)).
    pub async fn owner(&mut self, vdisk: &str) -> Result<Option<Owner>> {
        let r = self.client.get(self.key(vdisk), None::<GetOptions>).await?;
        Ok(r.kvs().iter().find(|kv| kv.lease() != 0).map(owner_of))
    }

    /// Deletes an owner key written without a lease (by hand, or by something that does not
    /// know the gateways' ways), if it is still as read: no gateway's run renews it, so it
    /// would hold the vdisk for ever, and no run of a gateway holds what it names. A taking
    /// then goes on as from any owner gone: it fences off what the fence record holds.
    async fn drop_leaseless(&mut self, kv: &etcd_client::KeyValue) -> Result<()> {
        let key = kv.key();
        tracing::warn!(
            key = %String::from_utf8_lossy(key),
            gateway = %String::from_utf8_lossy(kv.value()),
            "an owner key without a lease owns nothing: deleting it, and taking over as from an owner gone"
        );
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, kv.mod_revision())])
            .and_then([TxnOp::delete(key, None)]);
        self.client.txn(txn).await?;
        Ok(())
    }

    /// Gives up `vdisk`, taken at `epoch` and never served, leaving `record` as its fence
    /// record, in one transaction (nobody else changes the record while this gateway owns
    /// the vdisk). False if this gateway did not own it at that epoch.
    async fn give_back(&mut self, vdisk: &str, epoch: i64, record: &[String]) -> Result<bool> {
        let key = self.key(vdisk);
        let fence_key = self.fence_key(vdisk);
        let restore = match record {
            [] => TxnOp::delete(fence_key, None),
            _ => TxnOp::put(fence_key, record.join("\n"), None),
        };
        let txn = Txn::new()
            .when(self.owned_here_at(&key, epoch))
            .and_then([restore, TxnOp::delete(key.as_str(), None)]);
        Ok(self.client.txn(txn).await?.succeeded())
    }

    /// Gives `vdisk` up, if this gateway owns it at `epoch`, for gateway `to` to take: no
    /// other gateway takes it ([`acquire_fencing`](Self::acquire_fencing) finds it handed
    /// over, to `to`, at epoch 0) until `to` takes it, this gateway takes it back, or `bar`
    /// has passed (the handoff lives on a lease of its own: whatever becomes of both
    /// gateways, the vdisk is free for any after that). Of several gateways that would take
    /// it, the one it is handed to (whose hosts ask for it, or that an administrator moves it
    /// to) gets it, not whichever etcd told first.
    pub async fn release_to(&mut self, vdisk: &str, epoch: i64, to: &str, bar: Duration) -> Result<bool> {
        let key = self.key(vdisk);
        let bar_lease = self.client.lease_grant(bar.as_secs().max(1) as i64, None).await?.id();
        let txn = Txn::new().when(self.owned_here_at(&key, epoch)).and_then([
            TxnOp::delete(key.as_str(), None),
            TxnOp::put(
                self.handoff_key(vdisk),
                format!("{to}\n{}\n{:x}", self.name, self.lease),
                Some(PutOptions::new().with_lease(bar_lease)),
            ),
        ]);
        let released = self.client.txn(txn).await;
        if !matches!(&released, Ok(r) if r.succeeded()) {
            // Nothing handed over (or not known: then the vdisk is free for any at once).
            let _ = self.client.lease_revoke(bar_lease).await;
        }
        Ok(released?.succeeded())
    }

    fn handoff_key(&self, vdisk: &str) -> String {
        format!("{}/handoff/{vdisk}", self.prefix)
    }

    /// The gateway `vdisk` is handed over to ([`release_to`](Self::release_to)), as its owner
    /// at epoch 0 (not taken yet), if another gateway handed it to another than this one; and
    /// the revision of the handoff's key (0 when there is none), for a taking to compare.
    async fn handoff(&mut self, vdisk: &str) -> Result<(Option<Owner>, i64)> {
        let found = self.client.get(self.handoff_key(vdisk), None).await?;
        let Some(kv) = found.kvs().first() else {
            return Ok((None, 0));
        };
        // Without a lease (put by hand, or by a tool that knows no better) it would bar every
        // other gateway for good: it bars none, and the taking deletes it, as it deletes a
        // handoff it ends.
        if kv.lease() == 0 {
            tracing::warn!(
                key = %String::from_utf8_lossy(kv.key()),
                "a handoff without a lease bars nobody: the next taking deletes it"
            );
            return Ok((None, kv.mod_revision()));
        }
        // "to", then who handed it over: its name and lease.
        let value = String::from_utf8_lossy(kv.value()).into_owned();
        let mut lines = value.lines();
        let (to, from, from_lease) = (lines.next(), lines.next(), lines.next());
        // To this gateway, or by this very run (it takes the vdisk back): no bar.
        let mine = to == Some(self.name.as_str())
            || (from == Some(self.name.as_str()) && from_lease == Some(format!("{:x}", self.lease).as_str()));
        let to = (!mine).then(|| Owner {
            gateway: to.unwrap_or_default().to_string(),
            epoch: 0,
            lease: kv.lease(),
        });
        Ok((to, kv.mod_revision()))
    }

    /// The gateway `vdisk` is handed over to, as its owner at epoch 0, while the handoff
    /// lasts; None when nobody bars this gateway from taking it.
    pub async fn handed_to(&mut self, vdisk: &str) -> Result<Option<Owner>> {
        Ok(self.handoff(vdisk).await?.0)
    }

    /// Gives `vdisk` up, if this gateway owns it at `epoch`.
    pub async fn release(&mut self, vdisk: &str, epoch: i64) -> Result<bool> {
        let key = self.key(vdisk);
        let txn = Txn::new()
            .when(self.owned_here_at(&key, epoch))
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
        let mut names: Vec<String> = self
            .every_mark(&format!("{kind}/{what}/"))
            .await?
            .into_iter()
            .filter_map(|(what, gateway)| what.is_empty().then_some(gateway))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Every mark under `PREFIX/under` whose gateway's lease holds: for each,
    /// the rest of its name before the gateway's, and the gateway's name.
    async fn every_mark(&mut self, under: &str) -> Result<Vec<(String, String)>> {
        let from = format!("{}/{under}", self.prefix);
        let r = self
            .client
            .get(from.as_str(), Some(GetOptions::new().with_prefix().with_keys_only()))
            .await?;
        // A mark without a lease (written by hand) is no gateway's word: nothing would ever
        // take it back.
        Ok(r.kvs()
            .iter()
            .filter(|kv| kv.lease() != 0)
            .filter_map(|kv| {
                let rest = kv.key_str().ok()?.strip_prefix(from.as_str())?;
                let (what, gateway) = rest.rsplit_once('/').unwrap_or(("", rest));
                Some((what.to_string(), gateway.to_string()))
            })
            .collect())
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

    /// Says that this gateway exports `what` over NBD (vdisks of a pool), on its lease. Apart
    /// from [`announce`](Self::announce): an export has no target port group to report.
    pub async fn announce_exports(&mut self, what: &str) -> Result<()> {
        self.mark("exports", what).await
    }

    /// Takes back [`announce_exports`](Self::announce_exports).
    pub async fn unannounce_exports(&mut self, what: &str) -> Result<()> {
        self.unmark("exports", what).await
    }

    /// The gateways that export `what` over NBD now (whose leases hold), in name order.
    pub async fn exporting(&mut self, what: &str) -> Result<Vec<String>> {
        self.marked("exports", what).await
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

    /// Everything some gateway asks for now, with the gateways that do (in name order), in
    /// one request.
    pub async fn asked_for(&mut self) -> Result<std::collections::BTreeMap<String, Vec<String>>> {
        let mut asked = std::collections::BTreeMap::<String, Vec<String>>::new();
        for (what, gateway) in self.every_mark("wants/").await? {
            asked.entry(what).or_default().push(gateway);
        }
        asked.values_mut().for_each(|gateways| gateways.sort());
        Ok(asked)
    }

    fn move_key(&self, what: &str) -> String {
        format!("{}/moves/{what}", self.prefix)
    }

    /// Asks, for an administrator, that `what` move to gateway `to`: its owner hands it over
    /// to that gateway, which takes it. The word is on no lease (it is no gateway's): it holds
    /// until a gateway ends it ([`end_move`](Self::end_move)), and a later move replaces it.
    pub async fn move_to(&mut self, what: &str, to: &str) -> Result<()> {
        let key = self.move_key(what);
        self.client.put(key, to, None).await?;
        Ok(())
    }

    /// The gateway `what` is to move to, if a move was asked for, with the revision that
    /// asked it.
    pub async fn moving(&mut self, what: &str) -> Result<Option<(String, i64)>> {
        let r = self.client.get(self.move_key(what), None::<GetOptions>).await?;
        Ok(r.kvs()
            .first()
            .map(|kv| (String::from_utf8_lossy(kv.value()).into_owned(), kv.mod_revision())))
    }

    /// Every move asked for and not ended, in one request: what is to move, to which gateway,
    /// and the revision that asked it.
    pub async fn moves(&mut self) -> Result<Vec<(String, String, i64)>> {
        let under = self.move_key("");
        let r = self
            .client
            .get(under.as_str(), Some(GetOptions::new().with_prefix()))
            .await?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| {
                let what = kv.key().strip_prefix(under.as_bytes())?;
                Some((
                    String::from_utf8_lossy(what).into_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.mod_revision(),
                ))
            })
            .collect())
    }

    /// Ends the move of `what` asked at `revision` (done, or given up); a move asked since
    /// stays. False if there was none at that revision.
    pub async fn end_move(&mut self, what: &str, revision: i64) -> Result<bool> {
        let key = self.move_key(what);
        let txn = Txn::new()
            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        Ok(self.client.txn(txn).await?.succeeded())
    }

    /// Calls `changed` whenever a key of any gateway changes: an owner taking something or
    /// giving it up (or its lease lapsing, which deletes its keys), a gateway asking for
    /// something or saying it presents it. A gateway that acts on these at once need not
    /// wait for its next look. A key on this gateway's own lease deleted wakes its renewal
    /// too, which learns at once whether etcd revoked the lease. A watch that ends (its etcd
    /// member died or stalled, etcd restarted), or that etcd did not make in time, is made
    /// again from the last event it reported, so that no change is missed; past a
    /// compaction (or when none was reported), `changed` is called and the renewal woken once
    /// it runs again. Follows until this gateway is dropped; calling it again starts afresh.
    pub async fn follow_changes(&mut self, changed: impl Fn() + Send + 'static) {
        let under = format!("{}/", self.prefix);
        let options = || etcd_client::WatchOptions::new().with_prefix().with_prev_key();
        // One that etcd does not make in time is made again by the follower, as one that ended.
        let first = watching::watch(&mut self.client, &under, Some(options()))
            .await
            .inspect_err(|e| tracing::debug!(error = %e, "cannot watch the gateways' keys yet; retrying"))
            .ok();
        let mut client = self.client.clone();
        let prefix = self.prefix.clone();
        let (lease, doubt, renew_token) = (self.lease, self.doubt.clone(), self.renew_token.clone());
        let follower = tokio::spawn(async move {
            let mut watch = first;
            // The revision of the last event the watch told: a watch made again starts there
            // (not after it, which may be ahead of etcd's newest revision: see
            // `NoticesComing::watch_after_seen`), and passes over the events up to it.
            let mut told = None;
            let mut after = 0;
            loop {
                if let Some(mut events) = watch.take() {
                    while let Some(r) = events.next(watching::FOLLOWING).await {
                        if r.canceled() {
                            // Past a compaction the changes since are lost: watched from now
                            // on, and looked at by the caller at once (below).
                            if r.compact_revision() > 0 {
                                told = None;
                            }
                            break;
                        }
                        let events: Vec<&etcd_client::Event> = r
                            .events()
                            .iter()
                            .filter(|e| e.kv().is_some_and(|kv| kv.mod_revision() > after))
                            .collect();
                        // From events only: the answer to a progress request (watching.rs)
                        // carries etcd's newest revision, which the events of a watch made
                        // from an earlier one may not have reached yet (etcd before 3.4.25).
                        let last = events.iter().filter_map(|e| e.kv()).map(|kv| kv.mod_revision()).max();
                        if last.is_some() {
                            told = last;
                        }
                        // Progress notes carry no event; asks and answers between the
                        // gateways (on the lease too, with every forwarded command) are the
                        // courier's business.
                        let ours = |kv: &etcd_client::KeyValue| !courier::is_courier_key(&prefix, kv.key());
                        // A key on this gateway's lease deleted: by the gateway itself (a
                        // release), or by etcd revoking the lease (its leader may do so on its
                        // own word, etcd issue 15247). A renewal at once tells which, and
                        // loses nothing if the former.
                        let on_our_lease = |e: &etcd_client::Event| {
                            e.event_type() == etcd_client::EventType::Delete
                                && e.prev_kv().is_some_and(|kv| kv.lease() == lease && ours(kv))
                        };
                        if events.iter().any(|e| on_our_lease(e)) {
                            doubt.notify_one();
                        }
                        if events.iter().any(|e| e.kv().is_some_and(ours)) {
                            changed();
                        }
                    }
                    tracing::warn!(
                        "the watch of the gateways' keys ended (etcd ended it, or its member stalled): watching again"
                    );
                    // etcd may have restarted, and forgotten the token with the others it
                    // gave since its last snapshot: the watch made again needs a new one.
                    if let Some(renew) = &renew_token {
                        renew.notify_one();
                    }
                }
                tokio::time::sleep(REWATCH).await;
                // etcd makes a watch under a token it no longer knows (it restarted since
                // it gave it) as one that says nothing, and answers as if it had made it: a
                // request first tells whether the token still serves, and if not the watch
                // waits for a new one.
                // Bounded as the watch's making is: a member that stalled answers nothing,
                // and this loop is what wakes the tick and the lease's check.
                let probe = GetOptions::new().with_prefix().with_keys_only().with_limit(1);
                let probed = tokio::time::timeout(watching::MAKING, client.get(under.as_str(), Some(probe))).await;
                if let Err(e) = probed
                    .map_err(|_| format!("no answer within {:?}", watching::MAKING))
                    .and_then(|r| r.map_err(|e| e.to_string()))
                {
                    tracing::debug!(error = %e, "cannot watch the gateways' keys yet; retrying");
                    if let Some(renew) = &renew_token {
                        renew.notify_one();
                    }
                    continue;
                }
                let options = match told {
                    Some(r) => options().with_start_revision(r),
                    None => options(),
                };
                match watching::watch(&mut client, &under, Some(options)).await {
                    Ok(w) => {
                        watch = Some(w);
                        after = told.unwrap_or(0);
                        tracing::info!("watching the gateways' keys again");
                        // Whatever the watch cannot replay: looked at now.
                        if told.is_none() {
                            doubt.notify_one();
                            changed();
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot watch the gateways' keys yet; retrying"),
                }
            }
        });
        if let Some(old) = self.follower.replace(follower) {
            old.abort();
        }
    }

    /// Whether the lease is still being renewed (false once it was lost, or may have been: a
    /// gateway stops serving what it owned when this turns false).
    pub fn alive(&self) -> bool {
        !self.keeper.is_finished()
    }

    /// This membership's lease and whether it is still renewed, told without the gateway:
    /// for callers that must not wait for whoever holds it (a taking holds it through its
    /// fence, a monitor command per previous owner).
    pub fn liveness(&self) -> Liveness {
        Liveness {
            lease: self.lease,
            keeper: self.keeper.abort_handle(),
        }
    }

    /// Until when the lease surely holds: the disks of what this gateway owns refuse I/O
    /// past it (lease_clock.rs).
    pub fn lease_clock(&self) -> LeaseClock {
        self.clock.clone()
    }

    /// Stops renewing the lease without giving anything up, as a gateway that stalls or dies
    /// does: what it owns passes to others once the lease expires.
    pub fn stall(&self) {
        self.keeper.abort();
    }

    /// Leaves: revokes the lease, which gives up everything this gateway owns at once. Its
    /// clock lapses first: another gateway may take what it owned as soon as the revocation
    /// lands, and the disks under this lease must serve nothing more from then on.
    pub async fn leave(mut self) -> Result<()> {
        self.keeper.abort();
        self.clock.lapsed();
        self.client.lease_revoke(self.lease).await?;
        Ok(())
    }
}
