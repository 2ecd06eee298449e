//! This daemon's membership among the gateways: its etcd lease, the pools it takes and gives
//! up, and the courier that carries commands and notices between gateways.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tessera_ownership::fence::take_over;
use tessera_ownership::rados_meta::last_owner;
use tessera_ownership::{Ask, AsksComing, Courier, Gateway, Lasting, NoticesComing};
use tessera_rados::Cluster;
use tokio::runtime::Handle;

use super::cluster::*;
use super::PlaceRefused;
use super::*;

/// The certificates `[gateway]` names for TLS to etcd, read.
fn etcd_tls(files: &crate::config::EtcdTlsFiles) -> Result<tessera_ownership::EtcdTls, String> {
    let read = |field: &str, path: &Path| {
        std::fs::read(path).map_err(|e| format!("cannot read [gateway] {field} '{}': {e}", path.display()))
    };
    Ok(tessera_ownership::EtcdTls {
        ca: read("etcd_ca_file", &files.ca)?,
        identity: match &files.identity {
            Some((cert, key)) => Some((read("etcd_cert_file", cert)?, read("etcd_key_file", key)?)),
            None => None,
        },
    })
}

/// The etcd user `[gateway]` names, with its password read from its file (one line; a
/// file others may read, or that another user owns, is refused, as ssh refuses such a
/// key). The file is opened once, and what is checked is what is read.
pub(super) fn etcd_user((name, file): &(String, PathBuf)) -> Result<tessera_ownership::EtcdUser, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let shown = file.display();
    let unreadable = |e: std::io::Error| format!("cannot read [gateway] etcd_password_file '{shown}': {e}");
    let mut f = std::fs::File::open(file).map_err(unreadable)?;
    let meta = f.metadata().map_err(unreadable)?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "[gateway] etcd_password_file '{shown}' may be read by others: chmod 600 it"
        ));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "[gateway] etcd_password_file '{shown}' belongs to user {}, not to this daemon's ({me}) nor root",
            meta.uid()
        ));
    }
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(unreadable)?;
    let password = text.strip_suffix('\n').unwrap_or(&text);
    let password = password.strip_suffix('\r').unwrap_or(password);
    if password.is_empty() || password.contains('\n') {
        return Err(format!(
            "[gateway] etcd_password_file '{shown}' must hold the password on one line"
        ));
    }
    Ok(tessera_ownership::EtcdUser::new(name.clone(), password))
}

/// The ownership key of pool `name` among the gateways.
fn owner_key(name: &str) -> String {
    format!("pool.{name}")
}

/// The notices other gateways send about pools ([`Membership::watch_notices`]).
pub struct PoolNotices(NoticesComing);

impl PoolNotices {
    /// The next notices, as (pool, notice); None once the watch ended.
    pub async fn next(&mut self) -> Option<Vec<(String, Vec<u8>)>> {
        let got = self.0.next().await?;
        Some(
            got.into_iter()
                .filter_map(|(what, n)| Some((what.strip_prefix("pool.")?.to_string(), n)))
                .collect(),
        )
    }

    /// Where a watch made again after this one ended goes on ([`Membership::watch_notices`]).
    pub fn seen(&self) -> i64 {
        self.0.seen()
    }
}

/// How long a call on the membership may take, and how long a call waits for the
/// membership, which a taking holds through its fence (a monitor command, `CLUSTER_TIMEOUT`
/// at most, per previous owner).
const MEMBERSHIP_AT_MOST: Duration = Duration::from_secs(45);

/// How long each call to etcd of a taking may go unanswered: a taking is bounded call by
/// call, never cut short as a whole once its transaction may have landed.
const TAKING_CALL_AT_MOST: Duration = Duration::from_secs(15);

/// How long the owner's taking or answering of forwarded commands may take: a request
/// that went to an etcd member that stalls would otherwise hold every later command up
/// for as long as it stalls. A taking cut short runs the asks it took until then (each
/// call bounded, [`Courier::take_asks`]), and loses at most the one it was taking; an
/// answer cut short may still land, or not, and then the asker tells its host to try
/// again a command that ran (what a stalled etcd costs).
const COURIER_AT_MOST: Duration = Duration::from_secs(5);

/// How much of its bound a call on the membership must have left once it has it: one that
/// waited nearly all of it for another call (a taking fencing at slow monitors) is refused
/// before it asks etcd anything, rather than cut short just after its request went out,
/// when what it asked may or may not land.
const CALL_NEEDS_AT_LEAST: Duration = Duration::from_secs(5);

/// Runs `f` on `member` once joined (`not_joined` says why not otherwise). With a `bound`,
/// for that long at most, the wait for `member` (which another call may hold) included,
/// and `f` is not started with less than `CALL_NEEDS_AT_LEAST` of it left; without, `f`
/// bounds each of its calls itself and is not cut short part way, and only the wait for
/// `member` is bounded (`MEMBERSHIP_AT_MOST`). A wait that runs out and a call that does
/// are told apart: the first asked etcd nothing.
async fn on_member<G, T>(
    member: &tokio::sync::Mutex<Option<G>>,
    bound: Option<Duration>,
    not_joined: impl FnOnce() -> String,
    f: impl AsyncFnOnce(&mut G) -> Result<T, String>,
) -> Result<T, String> {
    let start = tokio::time::Instant::now();
    let waited_for = bound.unwrap_or(MEMBERSHIP_AT_MOST);
    let busy = |waited: Duration| {
        format!(
            "this gateway's membership was busy for {} s (another call holds it: one etcd does not \
             answer, or a taking fencing a previous owner at slow monitors); etcd was asked \
             nothing, try again",
            waited.as_secs()
        )
    };
    let Ok(mut held) = tokio::time::timeout(waited_for, member.lock()).await else {
        return Err(busy(waited_for));
    };
    let Some(g) = held.as_mut() else {
        return Err(not_joined());
    };
    let Some(bound) = bound else {
        return f(g).await;
    };
    let waited = start.elapsed();
    let left = bound.saturating_sub(waited);
    debug_assert!(
        bound > CALL_NEEDS_AT_LEAST,
        "a bound of {bound:?} would never let its call be made"
    );
    if left < CALL_NEEDS_AT_LEAST {
        return Err(busy(waited));
    }
    tokio::time::timeout(left, f(g)).await.unwrap_or_else(|_| {
        let after_wait = match waited >= Duration::from_secs(1) {
            true => format!(", after {} s waiting for this gateway's membership", waited.as_secs()),
            false => String::new(),
        };
        Err(format!(
            "etcd did not answer within {:.0} s{after_wait} (a member stalled, or is cut off?)",
            left.as_secs_f64()
        ))
    })
}

async fn within_courier_time<T>(
    f: impl std::future::Future<Output = tessera_ownership::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(COURIER_AT_MOST, f).await {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(_) => Err(format!("etcd did not answer within {} s", COURIER_AT_MOST.as_secs())),
    }
}

/// How long an owner tries to answer a command it ran, while etcd fails it.
const ANSWER_TRIED_FOR: Duration = Duration::from_secs(10);

/// An ask kept alive while it runs here ([`Membership::keep_running`]), until dropped.
pub struct KeptRunning(tokio::task::JoinHandle<()>);

impl Drop for KeptRunning {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// This daemon's membership among the gateways: its etcd lease, renewed in the
/// background. Its methods block; call them from blocking threads.
pub struct Membership {
    cfg: GatewayConfig,
    rt: Handle,
    /// None while this gateway has not joined: etcd did not answer when the daemon
    /// started. The daemon serves its local pools meanwhile and tries again every tick.
    gateway: tokio::sync::Mutex<Option<Gateway>>,
    /// The lease of `gateway` and whether it is renewed, told without waiting for the
    /// membership (which a taking holds through its fence): set with `gateway`.
    liveness: std::sync::Mutex<Option<tessera_ownership::Liveness>>,
    /// Notified when a gateway's key changes in etcd (see [`changes`](Self::changes)).
    changes: Arc<tokio::sync::Notify>,
    /// What [`alive`](Self::alive) last found, for readers that must not wait for a
    /// taking under way (which holds the gateway for as long as the cluster takes).
    seen_alive: std::sync::atomic::AtomicBool,
    /// The place of each pool this gateway looked for ([`place_of`](Self::place_of)), by
    /// its name, configuration file and RADOS pool.
    places: std::sync::Mutex<std::collections::HashMap<(String, String, String), String>>,
    /// Where the API may point the daemon: the Ceph configuration files of pools.
    paths: DataPaths,
    /// This run's end of the channel between the gateways, once joined: reached
    /// without waiting for `gateway`, which a taking holds for as long as it takes.
    courier: std::sync::Mutex<Option<Courier>>,
    /// Why the last attempt to join failed, for what waits on the joining to say.
    join_failed: std::sync::Mutex<Option<String>>,
    /// The notices to send, in the order they were raised, to the task that sends them
    /// one after another ([`notify`](Self::notify)).
    notices_out: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<(Courier, String, Vec<u8>)>>,
}

/// The outcome of an attempt to take a pool.
pub enum Taking {
    /// This gateway owns it now, and may serve it at this epoch.
    Mine(Owned),
    /// Another gateway owns it.
    Elsewhere(PoolOwner),
    /// This gateway took it, could not fence the previous owner off (this gateway's
    /// Ceph client may not blocklist, the monitors did not answer), and gave it back:
    /// why, and whether the refusal lasts (a permission) or may pass by itself (a
    /// timeout). Trying again at once would keep it from the gateways that could serve it.
    GaveBack { why: String, lasting: bool },
}

/// Another gateway's ownership as this one reports it; an earlier run of this very
/// gateway (restarted before its lease lapsed) says so.
fn elsewhere(o: tessera_ownership::Owner, me: &str) -> PoolOwner {
    PoolOwner {
        name: o.gateway.clone(),
        gateway: if o.gateway == me {
            format!("{me} (an earlier run, until its lease lapses)")
        } else {
            o.gateway
        },
        epoch: o.epoch,
    }
}

impl Membership {
    /// Joins the gateways as `cfg.name`, with a lease of `cfg.lease_seconds`; if etcd
    /// does not answer, the membership waits to join (see [`rejoin`](Self::rejoin)), so
    /// that the daemon still starts and serves its local pools.
    pub fn join(cfg: &GatewayConfig, paths: DataPaths, rt: Handle) -> Result<Membership, String> {
        let m = Membership {
            paths,
            cfg: cfg.clone(),
            rt,
            gateway: tokio::sync::Mutex::new(None),
            liveness: Default::default(),
            changes: Arc::default(),
            seen_alive: Default::default(),
            places: Default::default(),
            courier: Default::default(),
            join_failed: Default::default(),
            notices_out: Default::default(),
        };
        if let Err(e) = m.rejoin() {
            tracing::warn!(
                gateway = %cfg.name,
                error = %e,
                "cannot join the gateways at start; serving local pools and trying again every second"
            );
        }
        Ok(m)
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// What a call that needs the membership says before this gateway has joined.
    fn not_joined(&self) -> String {
        let why = self.join_failed.lock().expect("not poisoned").clone();
        format!(
            "this gateway has not joined the gateways yet: {} (it is tried again every second)",
            why.unwrap_or_else(|| format!("etcd at {} does not answer", self.cfg.etcd.join(", ")))
        )
    }

    /// Runs `f` on this gateway's membership, once joined (blocking), for `MEMBERSHIP_AT_MOST`
    /// at most: a request sent to an etcd member that stalls (stopped, frozen, cut off
    /// without a reset) gets no answer and no error, and would hold the tick, and every
    /// command that needs the membership, until the member resumes. Given up, it is as if
    /// etcd had not answered: what it changed, if anything, is found at the next look, as
    /// after a crash.
    fn with_gateway<T>(&self, f: impl AsyncFnOnce(&mut Gateway) -> Result<T, String>) -> Result<T, String> {
        self.with_gateway_bounded(Some(MEMBERSHIP_AT_MOST), f)
    }

    /// Runs `f` on this gateway's membership, once joined (blocking), as [`on_member`]
    /// does: without a `bound` for a taking, whose transaction once landed must be followed
    /// by its fence and the tidying of its fence record.
    fn with_gateway_bounded<T>(
        &self,
        bound: Option<Duration>,
        f: impl AsyncFnOnce(&mut Gateway) -> Result<T, String>,
    ) -> Result<T, String> {
        self.rt
            .block_on(on_member(&self.gateway, bound, || self.not_joined(), f))
    }

    /// Whether this gateway has joined and its lease is still renewed; once false,
    /// whatever it owned may be another's already.
    pub fn alive(&self) -> bool {
        let alive = self
            .liveness
            .lock()
            .expect("not poisoned")
            .as_ref()
            .is_some_and(|l| l.alive());
        self.seen_alive.store(alive, std::sync::atomic::Ordering::Relaxed);
        alive
    }

    /// What [`alive`](Self::alive) found last (the tick asks every second), without
    /// waiting.
    pub fn seen_alive(&self) -> bool {
        self.seen_alive.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether this gateway ever joined since the daemon started.
    pub fn joined(&self) -> bool {
        self.liveness.lock().expect("not poisoned").is_some()
    }

    /// A new lease: at start, or after the last one was lost (the gateway stalled, or
    /// etcd went away).
    pub fn rejoin(&self) -> Result<(), String> {
        let fresh = self.join_anew();
        *self.join_failed.lock().expect("not poisoned") = fresh.as_ref().err().cloned();
        let fresh = fresh?;
        self.rt.block_on(async {
            let mut fresh = fresh;
            let changes = self.changes.clone();
            fresh.follow_changes(move || changes.notify_one()).await;
            // A taking under the old lease may hold the membership through a long fence:
            // the next tick tries again rather than the tick wait for it.
            let Ok(mut gateway) = tokio::time::timeout(MEMBERSHIP_AT_MOST, self.gateway.lock()).await else {
                let _ = tokio::time::timeout(Duration::from_secs(2), fresh.leave()).await;
                return Err(format!(
                    "the membership stayed busy for {} s (a taking waiting on the monitors?)",
                    MEMBERSHIP_AT_MOST.as_secs()
                ));
            };
            *self.courier.lock().expect("not poisoned") = Some(fresh.courier());
            *self.liveness.lock().expect("not poisoned") = Some(fresh.liveness());
            let old = gateway.replace(fresh);
            drop(gateway);
            // Its keeper gave up, and what this gateway owned under it was given up here
            // (`lose_rados_pools`); the lease may hold in etcd all the same (renewals that
            // landed, their answers late): revoked, so that the other gateways, and this
            // one under its new lease, take those pools now rather than once it expires.
            if let Some(old) = old {
                let _ = tokio::time::timeout(Duration::from_secs(2), old.leave()).await;
            }
            Ok(())
        })
    }

    /// A new lease in etcd, through TLS when the configuration sets it up, as the etcd
    /// user it names (its files read now, so that a certificate renewed in place, or a
    /// password changed, counts from the next joining).
    fn join_anew(&self) -> Result<Gateway, String> {
        let etcd = self.cfg.etcd.join(", ");
        let tls = self.cfg.etcd_tls.as_ref().map(etcd_tls).transpose()?;
        let user = self.cfg.etcd_user.as_ref().map(etcd_user).transpose()?;
        self.rt
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    Gateway::join_as(
                        &self.cfg.etcd,
                        tls.as_ref(),
                        user.as_ref(),
                        &self.cfg.prefix,
                        &self.cfg.name,
                        self.cfg.lease_seconds,
                    ),
                )
                .await
            })
            .map_err(|_| format!("etcd at {etcd} did not answer within 10 s"))?
            .map_err(|e| format!("cannot join the gateways through etcd at {etcd}: {e}"))
    }

    fn courier(&self) -> Option<Courier> {
        self.courier.lock().expect("not poisoned").clone()
    }

    /// Has the owner of pool `name` run `request` (a command a standby port here
    /// received), and waits up to `wait` for its answer: None when none came (nobody
    /// owns the pool, the owner stalled, etcd does not answer). Blocks; callable from
    /// any thread outside the runtime's workers.
    pub fn ask_owner(&self, name: &str, request: Vec<u8>, wait: Duration) -> Option<Vec<u8>> {
        let courier = self.courier()?;
        let (tx, rx) = std::sync::mpsc::channel();
        let what = owner_key(name);
        self.rt.spawn(async move {
            let _ = tx.send(courier.ask(&what, &request, wait).await);
        });
        // An ask the owner took is waited for as long again, and on while the owner keeps
        // it alive; past that and the steps around it, its keys are gone, and no owner
        // runs it any more.
        let at_most = tessera_ownership::courier::ask_lifetime(wait)
            + 2 * tessera_ownership::courier::ASKING_AT_MOST
            + tessera_ownership::courier::RUN_KEPT_AT_MOST;
        match rx.recv_timeout(at_most + Duration::from_secs(1)) {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                tracing::warn!(pool = %name, error = %e, "cannot ask the pool's owner through etcd");
                None
            }
            Err(_) => None,
        }
    }

    /// A watch of the asks to the owners, made before they are looked at
    /// ([`Courier::watch_asks`]); None before this gateway joined, or if etcd does not
    /// answer.
    pub async fn watch_asks(&self) -> Option<AsksComing> {
        self.courier()?.watch_asks().await.ok()
    }

    /// The asks waiting now for the pools among `owned` (owned here), each taken (it runs
    /// here, once), as (pool, ask), in one read of etcd.
    pub fn take_asks(&self, owned: &[String]) -> Result<Vec<(String, Ask)>, String> {
        let courier = self.courier().ok_or_else(|| self.not_joined())?;
        let keys: HashMap<String, &String> = owned.iter().map(|n| (owner_key(n), n)).collect();
        let asks = self
            .rt
            .block_on(courier.take_asks(|what| keys.contains_key(what), COURIER_AT_MOST))
            .map_err(|e| e.to_string())?;
        Ok(asks.into_iter().map(|a| (keys[a.what.as_str()].clone(), a)).collect())
    }

    /// Answers `ask`, one [`take_asks`](Self::take_asks) returned; false when the asker no
    /// longer waits. Tried again for [`ANSWER_TRIED_FOR`] while etcd fails it (a member
    /// restarting, a leader changing): the command ran, and an asker that heard nothing
    /// would have its host send it again. The answer is the same each time, and lands
    /// only into the asker's waiting key.
    pub fn answer(&self, ask: &Ask, answer: &[u8]) -> Result<bool, String> {
        let courier = self.courier().ok_or_else(|| self.not_joined())?;
        let until = std::time::Instant::now() + ANSWER_TRIED_FOR;
        loop {
            match self.rt.block_on(within_courier_time(courier.answer(ask, answer))) {
                Err(e) if std::time::Instant::now() < until => {
                    tracing::debug!(error = %e, "cannot answer a forwarded command yet: trying again");
                    std::thread::sleep(Duration::from_millis(200));
                }
                answered => return answered,
            }
        }
    }

    /// Keeps `ask` alive while it runs here ([`Courier::keep_running`]), until the guard
    /// returned is dropped; None before this gateway joined.
    pub fn keep_running(&self, ask: &Ask) -> Option<KeptRunning> {
        let courier = self.courier()?;
        let ask = ask.clone();
        Some(KeptRunning(
            self.rt.spawn(async move { courier.keep_running(&ask).await }),
        ))
    }

    /// Tells the other gateways `notice` about pool `name` (owned here: the unit
    /// attentions its logical units raised), without waiting: a notice that etcd does not
    /// take (within 5 s) is lost, as one a gateway not watching misses. Notices reach
    /// etcd in the order they were raised (REGISTRATIONS PREEMPTED for some ports, then
    /// RESERVATIONS RELEASED for others, say).
    pub fn notify(&self, name: &str, notice: Vec<u8>) {
        let Some(courier) = self.courier() else { return };
        let out = self.notices_out.get_or_init(|| {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Courier, String, Vec<u8>)>();
            self.rt.spawn(async move {
                while let Some((courier, pool, notice)) = rx.recv().await {
                    if let Err(e) = within_courier_time(courier.notify(&owner_key(&pool), &notice)).await {
                        tracing::warn!(pool = %pool, error = %e, "cannot tell the other gateways of unit attentions raised here");
                    }
                }
            });
            tx
        });
        let _ = out.send((courier, name.to_string(), notice));
    }

    /// A watch of the notices other gateways send about pools after revision `after`
    /// (where an earlier watch stopped: [`PoolNotices::seen`]), or from now on; None before
    /// this gateway joined, or if etcd does not answer.
    pub async fn watch_notices(&self, after: Option<i64>) -> Option<PoolNotices> {
        Some(PoolNotices(self.courier()?.watch_notices(after).await.ok()?))
    }

    /// Notified when any gateway takes or gives up a pool (or its lease lapses), asks
    /// for one or says it presents one, so that the daemon acts on it at once rather
    /// than at its next tick. Notifications come together: one wakes a waiter once,
    /// however many changes came since.
    pub fn changes(&self) -> Arc<tokio::sync::Notify> {
        self.changes.clone()
    }

    /// Where pool `name` lives, as the gateways record it: the cluster's id and the RADOS
    /// pool's (`FSID/ID`), learned once.
    fn place_of(&self, name: &str, placement: &Placement, link: &mut Link) -> Result<String, PlaceRefused> {
        // By where it is looked for: a name asked for in one RADOS pool, then another
        // (refused there), is in the one asked now.
        let looked_in = (
            name.to_string(),
            placement.ceph_conf.clone(),
            placement.rados_pool.clone(),
        );
        if let Some(p) = self.places.lock().expect("not poisoned").get(&looked_in) {
            return Ok(p.clone());
        }
        let cluster = link.cluster(placement, &self.paths)?;
        let (fsid, id) = Cluster::shared_pool(&cluster, &placement.rados_pool)
            .and_then(|p| p.identity())
            .map_err(|e| {
                let why = format!("cannot open the RADOS pool '{}': {e}", placement.rados_pool);
                // No such pool is a name to correct, not a cluster to wait for.
                match e.errno() {
                    Some(libc::ENOENT) => PlaceRefused::Invalid(format!("{why}: the cluster has no such pool")),
                    _ => PlaceRefused::Unknown(why),
                }
            })?;
        let place = format!("{fsid}/{id}");
        self.places
            .lock()
            .expect("not poisoned")
            .insert(looked_in, place.clone());
        Ok(place)
    }

    /// Whether the metadata of a pool `name` is where `placement` says.
    fn pool_is_at(&self, name: &str, placement: &Placement, link: &mut Link) -> Result<bool, String> {
        let cluster = link.cluster(placement, &self.paths)?;
        let pool = Cluster::shared_pool(&cluster, &placement.rados_pool)
            .map_err(|e| format!("cannot open the RADOS pool '{}': {e}", placement.rados_pool))?;
        metadata_is_there(&pool, name)
    }

    /// Checks that pool `name` is recorded among the gateways (in etcd) as living where
    /// `placement` says: a pool of that name in another RADOS pool or cluster has the
    /// same ownership and fence record, and a gateway serving either would fence the
    /// other's owners off instead of its own. A pool recorded elsewhere is refused, and
    /// this gateway serves nothing of it. Recorded nowhere yet (a pool made before the
    /// record was kept), it is recorded as here once its metadata is found here: a create
    /// that failed, or an import of a place that holds no such pool, claims nothing. Read
    /// afresh at every attempt, never from memory: a record removed and claimed by
    /// another place since is seen.
    pub fn check_place(&self, name: &str, placement: &Placement) -> Result<(), PlaceRefused> {
        self.check_place_through(name, placement, &mut Link::default())
    }

    /// [`check_place`](Self::check_place), through `link`'s connection to the cluster if
    /// one is needed.
    fn check_place_through(&self, name: &str, placement: &Placement, link: &mut Link) -> Result<(), PlaceRefused> {
        let place = self.place_of(name, placement, link)?;
        let key = owner_key(name);
        let recorded = match self.with_gateway(async |g| {
            g.place(&key)
                .await
                .map_err(|e| format!("cannot learn where pool {name} lives: {e}"))
        })? {
            Some(r) => r,
            None if !self.pool_is_at(name, placement, link)? => return Ok(()),
            None => self.with_gateway(async |g| {
                g.claim_place(&key, &place)
                    .await
                    .map(|(recorded, _)| recorded)
                    .map_err(|e| format!("cannot record where pool {name} lives: {e}"))
            })?,
        };
        self.same_place(name, placement, &place, &recorded)
    }

    /// Records that pool `name`, about to be made where `placement` says, lives there:
    /// refused if a pool of that name is recorded elsewhere. True if this call recorded
    /// it: a create that fails then takes the record back (`forget_place`).
    pub fn claim_place(&self, name: &str, placement: &Placement) -> Result<bool, PlaceRefused> {
        let place = self.place_of(name, placement, &mut Link::default())?;
        let (recorded, now) = self.with_gateway(async |g| {
            g.claim_place(&owner_key(name), &place)
                .await
                .map_err(|e| format!("cannot record where pool {name} lives: {e}"))
        })?;
        self.same_place(name, placement, &place, &recorded).map(|()| now)
    }

    /// Ok if `recorded`, where the gateways record pool `name` lives, is `place`.
    fn same_place(&self, name: &str, placement: &Placement, place: &str, recorded: &str) -> Result<(), PlaceRefused> {
        if recorded == place {
            return Ok(());
        }
        let (their_fsid, their_id) = recorded.split_once('/').unwrap_or((recorded, "?"));
        let (fsid, id) = place.split_once('/').unwrap_or((place, "?"));
        Err(PlaceRefused::Elsewhere(format!(
            "another pool named {name} is served by these gateways, in RADOS pool id {their_id} of cluster {their_fsid}; this gateway has it in RADOS pool '{}' (id {id}) of cluster {fsid}: a name is one pool among the gateways of one etcd prefix (export this one here; if no pool of that name is left there, remove the record, etcdctl del {}/place/{})",
            placement.rados_pool,
            self.cfg.prefix,
            owner_key(name)
        )))
    }

    /// Forgets where pool `name`, at `placement`, lived among the gateways, and its fence
    /// record, once it is destroyed while owned here at epoch `destroyed_at`; or only this
    /// gateway's notes of it, once it is exported (`destroyed_at` None). Records that
    /// name another place, or a pool no longer owned here at that epoch, stay.
    pub fn forget_place(&self, name: &str, placement: &Placement, destroyed_at: Option<i64>) -> Result<(), String> {
        let place = destroyed_at.map(|epoch| (self.place_of(name, placement, &mut Link::default()), epoch));
        self.places
            .lock()
            .expect("not poisoned")
            .retain(|(n, _, _), _| n != name);
        let Some((place, epoch)) = place else {
            return Ok(());
        };
        let place = place.map_err(|e| e.to_string())?;
        let forgot = self
            .with_gateway(async |g| {
                g.forget_place(&owner_key(name), &place, epoch)
                    .await
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| {
                let key = owner_key(name);
                let prefix = &self.cfg.prefix;
                format!(
                    "cannot forget where pool {name} lived ({e}): a pool of the name elsewhere is refused until its records go; once etcd answers, if 'etcdctl get {prefix}/place/{key}' still gives {place} (this pool's place: etcd may have forgotten it all the same, and another pool of the name may have been made since), remove them by hand (etcdctl del {prefix}/place/{key}; etcdctl del {prefix}/fence/{key})"
                )
            })?;
        if !forgot {
            tracing::warn!(pool = %name, epoch, "the gateways' record of where the pool lived is not this gateway's to forget (another place's, gone already, or the pool is no longer owned here): it stays in etcd");
        }
        Ok(())
    }

    /// Takes back the place `claim_place` recorded for pool `name` at `placement`, when the
    /// pool was not made there after all (it could not be taken); its fence record stays.
    /// Not when a pool of the name is there all the same, or a gateway took the name (or
    /// handed it over) since the claim: the same making sent to two gateways (an administrator trying again at
    /// another) may have been made by the other, whose pool the record is then.
    pub fn unclaim_place(&self, name: &str, placement: &Placement) -> Result<(), String> {
        let mut link = Link::default();
        let place = self.place_of(name, placement, &mut link).map_err(|e| e.to_string())?;
        match self.pool_is_at(name, placement, &mut link) {
            Ok(true) => {
                tracing::debug!(pool = %name, "a pool of the name was made where it was to live: its place stays recorded");
                return Ok(());
            }
            Ok(false) => {}
            // Most likely what failed the making: etcd's guard alone then (a gateway that
            // took the name since keeps the place).
            Err(e) => {
                tracing::debug!(pool = %name, error = %e, "cannot learn whether a pool of the name was made where it was to live")
            }
        }
        self.places
            .lock()
            .expect("not poisoned")
            .retain(|(n, _, _), _| n != name);
        self.with_gateway(async |g| {
            g.unclaim_place(&owner_key(name), &place)
                .await
                .map_err(|e| format!("cannot take back where pool {name} was to live: {e}"))
        })
    }

    /// Takes pool `name`, to be made, if nobody owns it, fencing its previous owner off the
    /// cluster first.
    pub fn take(&self, name: &str, placement: &Placement) -> Result<Taking, String> {
        self.take_if(name, placement, false)
    }

    /// Takes pool `name`, made before, like [`take`](Self::take); but not if the cluster
    /// holds no pool of that name where `placement` says (destroyed at another gateway, a
    /// name or RADOS pool mistyped at its import): the opening would fail, and each try
    /// would blocklist the connection of the one before, a monitor command and a new map of
    /// the cluster for every OSD and client, for nothing.
    pub fn take_made(&self, name: &str, placement: &Placement) -> Result<Taking, String> {
        self.take_if(name, placement, true)
    }

    fn take_if(&self, name: &str, placement: &Placement, made: bool) -> Result<Taking, String> {
        // Cheap first: while another gateway holds the pool, nothing is asked of the
        // cluster. (The taking below is one etcd transaction all the same.)
        if let Some(o) = self.other_owner(name)? {
            return Ok(Taking::Elsewhere(o));
        }
        // Handed over to another gateway by one that may take it back (`release_to`).
        let handed = self.with_gateway(async |g| {
            g.handed_to(&owner_key(name))
                .await
                .map_err(|e| format!("cannot learn whether pool {name} is handed over: {e}"))
        })?;
        if let Some(o) = handed {
            return Ok(Taking::Elsewhere(elsewhere(o, &self.cfg.name)));
        }
        let started = std::time::Instant::now();
        // One connection for the place's check (the first time) and the taking.
        let mut link = Link::default();
        self.check_place_through(name, placement, &mut link)
            .map_err(|e| e.to_string())?;
        let cluster = link.cluster(placement, &self.paths)?;
        // The RADOS pool must exist before anyone takes anything in it.
        let pool = Cluster::shared_pool(&cluster, &placement.rados_pool)
            .map_err(|e| format!("cannot open the RADOS pool '{}': {e}", placement.rados_pool))?;
        if made && !metadata_is_there(&pool, name)? {
            return Err(format!(
                "the cluster holds no pool {name} in RADOS pool '{}' (destroyed at another gateway, or never made there): 'tessera pool export {name}' forgets it here",
                placement.rados_pool
            ));
        }
        let stamped = match made {
            true => openable_records(&cluster, name, placement)?,
            false => None,
        };
        // An epoch stamped past etcd's revision is one etcd has forgotten (restored from an
        // older snapshot without bumping its revision, or another etcd): no taking now gets an
        // epoch the pool's objects would take (the next taking's is at least the revision
        // after this), and each would fence a connection off for nothing. The pool waits
        // until the revision passes it.
        if let Some(stamped) = stamped {
            let now = self.with_gateway(async |g| {
                g.revision()
                    .await
                    .map_err(|e| format!("cannot learn etcd's revision: {e}"))
            })?;
            if stamped > now + 1 {
                return Err(format!(
                    "pool {name} was last opened at epoch {stamped}, and etcd is at revision {now}: etcd lost \
                     revisions (restored from an older snapshot without 'etcdutl snapshot restore \
                     --bump-revision'?), or it is not the etcd of the gateways that served the pool; the pool's \
                     objects would refuse the writes of any owner it makes now, and it is not taken until \
                     etcd's revision passes {stamped}: restore etcd with its revision bumped past it (etcd \
                     3.5's 'etcdutl snapshot restore --bump-revision'), or raise it by writes (each write to \
                     etcd raises it by one)"
                ));
            }
        }
        // Whom the pool's metadata says its last owner wrote from: fenced off too, should
        // etcd have lost the fence record (restored from an older snapshot, keys deleted).
        let last_writer = last_owner(&pool, &Placement::meta_object(name))
            .map_err(|e| format!("cannot read the last owner of pool {name}: {e}"))?;
        drop(pool);
        let connected = started.elapsed();
        // Not cut short as a whole (each of its calls to etcd is bounded): a taking whose
        // transaction landed goes on to fence and to tidy the fence record, however long the
        // monitors take to blocklist.
        let taken = self.with_gateway_bounded(None, async |g| {
            let o = take_over(
                g,
                &cluster,
                &owner_key(name),
                last_writer.as_deref(),
                TAKING_CALL_AT_MOST,
            )
            .await;
            Ok(match o {
                Ok(o) => {
                    let mine = g.holds(&o);
                    Ok((o, mine, g.lease_clock()))
                }
                Err(e) => match e.gave_back() {
                    Some(lasting) => Err((format!("cannot take pool {name}: {e}"), lasting == Lasting::Lasts)),
                    None => return Err(format!("cannot take pool {name}: {e}")),
                },
            })
        })?;
        let (owner, mine, lease_clock) = match taken {
            Ok(t) => t,
            Err((why, lasting)) => return Ok(Taking::GaveBack { why, lasting }),
        };
        if !mine {
            return Ok(Taking::Elsewhere(elsewhere(owner, &self.cfg.name)));
        }
        tracing::info!(
            pool = name,
            connect_seconds = connected.as_secs_f64(),
            take_and_fence_seconds = (started.elapsed() - connected).as_secs_f64(),
            "pool taken"
        );
        Ok(Taking::Mine(Owned {
            cluster,
            placement: placement.clone(),
            epoch: owner.epoch,
            lease: owner.lease,
            lease_clock,
            disks: Default::default(),
            meta_unknown: Default::default(),
        }))
    }

    /// This run's lease, once joined: what an announcement was made under.
    pub fn lease(&self) -> Option<i64> {
        self.liveness.lock().expect("not poisoned").as_ref().map(|l| l.lease())
    }

    /// Says in etcd, on this gateway's lease, that it presents LUNs of pool `name`, so
    /// that the owner lists this gateway's target port group too.
    pub fn announce(&self, name: &str) -> Result<(), String> {
        self.with_gateway(async |g| g.announce(&owner_key(name)).await.map_err(|e| e.to_string()))
    }

    /// Takes back [`announce`](Self::announce).
    pub fn unannounce(&self, name: &str) -> Result<(), String> {
        self.with_gateway(async |g| g.unannounce(&owner_key(name)).await.map_err(|e| e.to_string()))
    }

    /// The gateways that present LUNs of pool `name` now.
    pub fn presenting(&self, name: &str) -> Result<Vec<String>, String> {
        self.with_gateway(async |g| g.presenting(&owner_key(name)).await.map_err(|e| e.to_string()))
    }

    /// Says that this gateway exports vdisks of pool `name` over NBD.
    pub fn announce_exports(&self, name: &str) -> Result<(), String> {
        self.with_gateway(async |g| g.announce_exports(&owner_key(name)).await.map_err(|e| e.to_string()))
    }

    /// Takes back [`announce_exports`](Self::announce_exports).
    pub fn unannounce_exports(&self, name: &str) -> Result<(), String> {
        self.with_gateway(async |g| g.unannounce_exports(&owner_key(name)).await.map_err(|e| e.to_string()))
    }

    /// The gateways that could serve pool `name`'s hosts now: those that present LUNs of
    /// it, and those that export vdisks of it over NBD, in name order.
    pub fn serving(&self, name: &str) -> Result<Vec<String>, String> {
        self.with_gateway(async |g| {
            let mut all = g.presenting(&owner_key(name)).await.map_err(|e| e.to_string())?;
            all.extend(g.exporting(&owner_key(name)).await.map_err(|e| e.to_string())?);
            all.sort();
            all.dedup();
            Ok(all)
        })
    }

    /// The gateway that owns pool `name` now, if another does (None: nobody, or this
    /// run of this gateway). Asks etcd only, never the cluster.
    pub fn other_owner(&self, name: &str) -> Result<Option<PoolOwner>, String> {
        let o = self.with_gateway(async |g| {
            let o = g.owner(&owner_key(name)).await;
            o.map(|o| o.filter(|o| !g.holds(o)))
                .map_err(|e| format!("cannot learn the owner of pool {name}: {e}"))
        })?;
        Ok(o.map(|o| elsewhere(o, &self.cfg.name)))
    }

    /// Asks the owner of pool `name` to hand it over: hosts send their I/O here.
    pub fn ask_for(&self, name: &str) -> Result<(), String> {
        self.with_gateway(async |g| g.ask_for(&owner_key(name)).await.map_err(|e| e.to_string()))
    }

    /// Takes back [`ask_for`](Self::ask_for).
    pub fn stop_asking(&self, name: &str) -> Result<(), String> {
        self.with_gateway(async |g| g.stop_asking(&owner_key(name)).await.map_err(|e| e.to_string()))
    }

    /// Every pool some gateway asks for now, with the gateways that do, in one request.
    pub fn asked_for(&self) -> Result<std::collections::HashMap<String, Vec<String>>, String> {
        self.with_gateway(async |g| g.asked_for().await.map_err(|e| e.to_string()))
            .map(|asked| {
                asked
                    .into_iter()
                    .filter_map(|(what, gateways)| Some((what.strip_prefix("pool.")?.to_string(), gateways)))
                    .collect()
            })
    }

    /// Asks, for an administrator, that pool `name` move to gateway `to` (see
    /// [`Gateway::move_to`]).
    pub fn move_to(&self, name: &str, to: &str) -> Result<(), String> {
        self.with_gateway(async |g| g.move_to(&owner_key(name), to).await.map_err(|e| e.to_string()))
    }

    /// The gateway pool `name` is to move to, if a move was asked for, with the revision
    /// that asked it.
    pub fn moving(&self, name: &str) -> Result<Option<(String, i64)>, String> {
        self.with_gateway(async |g| g.moving(&owner_key(name)).await.map_err(|e| e.to_string()))
    }

    /// Every pool an administrator moves and to which gateway, with the revision that
    /// asked it, in one request.
    pub fn moves(&self) -> Result<std::collections::HashMap<String, (String, i64)>, String> {
        self.with_gateway(async |g| g.moves().await.map_err(|e| e.to_string()))
            .map(|moves| {
                moves
                    .into_iter()
                    .filter_map(|(what, to, revision)| Some((what.strip_prefix("pool.")?.to_string(), (to, revision))))
                    .collect()
            })
    }

    /// Ends the move of pool `name` asked at `revision`, unless one was asked since (or
    /// another gateway ended it first): false then.
    pub fn end_move(&self, name: &str, revision: i64) -> Result<bool, String> {
        self.with_gateway(async |g| g.end_move(&owner_key(name), revision).await.map_err(|e| e.to_string()))
    }

    /// Gives pool `name` up, if this gateway owns it at `epoch`, for gateway `to` alone to
    /// take until this one takes it back, or for `bar` at most.
    /// True if it was handed over (false: not owned here at that epoch).
    pub fn release_to(&self, name: &str, epoch: i64, to: &str, bar: Duration) -> Result<bool, String> {
        self.with_gateway(async |g| {
            g.release_to(&owner_key(name), epoch, to, bar)
                .await
                .map_err(|e| e.to_string())
        })
    }

    /// Gives pool `name` up, if this gateway owns it at `epoch`.
    pub fn release(&self, name: &str, epoch: i64) -> Result<(), String> {
        self.with_gateway(async |g| {
            g.release(&owner_key(name), epoch)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{on_member, CALL_NEEDS_AT_LEAST};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    type Member = Arc<tokio::sync::Mutex<Option<u32>>>;

    /// Holds `member` for `how_long` from now, as a taking fencing at slow monitors would.
    async fn held_for(member: &Member, how_long: Duration) {
        let held = member.clone().lock_owned().await;
        tokio::spawn(async move {
            tokio::time::sleep(how_long).await;
            drop(held);
        });
    }

    fn not_joined() -> String {
        "not joined".to_string()
    }

    /// A call is told from a wait: one that waited its bound away, or so much of it that it
    /// could be cut just after its request went out, asks nothing and says it was the wait;
    /// one whose etcd call outlasts what is left is cut and says etcd did not answer; a
    /// taking (no bound) waits, and is not cut, however long its calls take.
    #[tokio::test]
    async fn a_call_on_the_membership_is_bounded_and_never_started_too_late() {
        let member: Member = Arc::new(tokio::sync::Mutex::new(Some(7)));
        let asked = AtomicBool::new(false);
        let ask = async |g: &mut u32| {
            asked.store(true, Ordering::SeqCst);
            Ok(*g)
        };

        assert_eq!(
            on_member(&member, Some(Duration::from_secs(10)), not_joined, &ask).await,
            Ok(7)
        );
        assert!(asked.swap(false, Ordering::SeqCst));

        // Held past the whole bound: the wait runs out.
        held_for(&member, Duration::from_secs(3)).await;
        let t0 = Instant::now();
        let e = on_member(&member, Some(Duration::from_secs(1)), not_joined, &ask)
            .await
            .unwrap_err();
        assert!(
            e.contains("membership was busy for 1 s") && e.contains("etcd was asked nothing"),
            "{e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert!(
            !asked.load(Ordering::SeqCst),
            "a call that never had the membership asked etcd"
        );

        // Had within the bound, but with less than a call needs left: not started.
        let bound = CALL_NEEDS_AT_LEAST + Duration::from_secs(1);
        drop(member.lock().await); // the earlier holder let go
        held_for(&member, Duration::from_secs(2)).await;
        let e = on_member(&member, Some(bound), not_joined, &ask).await.unwrap_err();
        assert!(e.contains("membership was busy for 2 s"), "{e}");
        assert!(
            !asked.load(Ordering::SeqCst),
            "a call started with too little time left"
        );

        // Had at once, and etcd does not answer: cut at the bound, and said so.
        let t0 = Instant::now();
        let e = on_member(
            &member,
            Some(bound),
            not_joined,
            async |_: &mut u32| -> Result<u32, String> { std::future::pending().await },
        )
        .await
        .unwrap_err();
        assert_eq!(
            e,
            format!(
                "etcd did not answer within {} s (a member stalled, or is cut off?)",
                bound.as_secs()
            )
        );
        assert!(t0.elapsed() >= bound, "{:?}", t0.elapsed());

        // A taking waits for the membership and is not cut short, however long it takes.
        held_for(&member, Duration::from_secs(1)).await;
        let slow = on_member(&member, None, not_joined, async |g: &mut u32| {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(*g + 1)
        });
        assert_eq!(slow.await, Ok(8));

        let none: Member = Arc::new(tokio::sync::Mutex::new(None));
        for bound in [Some(bound), None] {
            assert_eq!(
                on_member(&none, bound, not_joined, &ask).await,
                Err("not joined".to_string())
            );
        }
        assert!(!asked.load(Ordering::SeqCst));
    }
}
