//! Pools on Ceph RADOS, as one of several gateways (crate::rados_pools): made, imported,
//! taken when nobody owns them, and let go of when this gateway's lease is lost.
//!
//! A pool on RADOS that another gateway owns stays in the list as unavailable, with its owner;
//! every tick (`rados_tick`, once a second and whenever a gateway's keys change in etcd) tries
//! to take it, which succeeds once the owner's lease lapsed (it died, stalled or left): the pool is then opened here and its configured
//! LUNs and exports presented. When this gateway's own lease is lost, it withdraws every pool
//! on RADOS at once, since another may own them already, and joins again.
//!
//! While another gateway owns a pool, the LUNs configured here for its vdisks are presented
//! as standby ports (crate::standby) from what its metadata records; when this gateway takes
//! the pool, the real LUNs take their places, and when it hands the pool over, standby LUNs
//! take the real ones' places: each LUN in one step, so that a host never finds it missing.
//!
//! A host whose path to the owner is gone sends its I/O to a standby port. That gateway then
//! asks for the pool in etcd, and the owner hands it over (presents standby LUNs, flushes,
//! gives it up) once no host has used it for `HANDOVER_IDLE`; the asking gateway takes it as
//! soon as etcd tells it the owner let go. An owner that hosts use is never asked out, so two hosts that prefer
//! different gateways cannot make the pool bounce between them.

use super::*;
use crate::rados_pools::{Placement, PoolOwner, Reader, Taking, PLACEMENT_FILE};
use crate::standby::{PoolPorts, StandbyUnit};
use tessera_scsi::AccessState;
use tracing::debug;

mod forwarded;
mod handover;

/// How long no host may have used a pool at its owner before the owner hands it over to a
/// gateway whose hosts ask for it: longer than the 5 s between a multipath path checker's
/// reads (which keep a pool where they read it), short against the 15 s a failover may take.
const HANDOVER_IDLE: Duration = Duration::from_secs(8);
/// A standby gateway asks for a pool while a host sent a command for the medium to one of
/// its standby ports within this (a host retries a failed path at its checker's period).
const ASK_WINDOW: Duration = Duration::from_secs(10);
/// After handing a pool over, how long this gateway leaves it to the one that asked before it
/// takes it back itself (should that one never take it).
const HANDOVER_GRACE: Duration = Duration::from_secs(10);

/// How long no gateway but the one a pool is handed to (or the one that handed it over,
/// taking it back) may take it: the grace, and a few seconds for a taking under way then.
/// Past it any gateway may, whatever became of those two.
const HANDOFF_BARS_FOR: Duration = Duration::from_secs(15);

/// A taking at a gateway's start that took this long and did not serve its pool waited on
/// the cluster or etcd not answering: the pools after it are taken by the tick instead.
const SLOW_TAKING_AT_START: Duration = Duration::from_secs(10);

/// A pool whose disk had a write refused is opened again at most this often: a cluster that
/// refuses every write would otherwise have it opened again at every tick.
const REOPEN_EVERY: Duration = Duration::from_secs(30);

/// After an attempt that took a pool in etcd and gave it back for a reason that lasts (the
/// previous owner could not be fenced off because this gateway's Ceph client may not
/// blocklist; or the pool could not be opened), the tick tries it again after this, doubling
/// up to `RETRY_MOST` (`RETRY_MOST_AFTER_OPENING` after many failed openings) while it
/// keeps failing (until it is found served), and this gateway does not ask the owner for it
/// for `NO_ASK_AFTER_FAILURE`. Without it, a gateway that
/// cannot fence took the pool and gave it back as fast as etcd answered, woken by its own
/// changes, and the gateways that could serve it rarely found it free. Failures that take
/// nothing (etcd or the cluster not answering) are tried again at every tick.
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MOST: Duration = Duration::from_secs(30);
/// `RETRY_MOST` once more than `OPENINGS_FAILED_AT_RETRY_MOST` attempts took the pool and
/// could not open it since it was last served here (a few minutes of them; found owned
/// elsewhere meanwhile does not count as served: that may be another gateway's opening,
/// which fails as well): each such taking blocklisted the connection of the one before, an
/// entry in the cluster's map for 30 days (a monitor command, and a new map for every OSD
/// and client). Every 30 s, a pool that no gateway can open (its journal damaged, the pool
/// directory's file system full) would add 2,880 a day; every 10 minutes, about 160. An
/// opening that failed for a while only (its records could not be read in time) is tried
/// every 30 s at most for those minutes. (The causes the records tell are found before any
/// taking: `take_made`.)
const RETRY_MOST_AFTER_OPENING: Duration = Duration::from_secs(600);
const OPENINGS_FAILED_AT_RETRY_MOST: u32 = 10;

/// The longest wait between attempts, after `openings_failed` openings failed since the pool
/// was last served here.
fn retry_most(openings_failed: u32) -> Duration {
    match openings_failed > OPENINGS_FAILED_AT_RETRY_MOST {
        true => RETRY_MOST_AFTER_OPENING,
        false => RETRY_MOST,
    }
}

/// After an attempt that gave the pool back because its fence failed in a way that may pass
/// by itself (the monitors did not answer in time, or were electing a leader), the tick
/// tries again after this, a tick, and the streak's wait is left as it was: a failover while
/// the monitors are busy is not put off by seconds more, and a gateway woken by its own
/// give-back does not try again at once.
const RETRY_PASSING: Duration = Duration::from_secs(1);
/// How long failures that may pass are taken so, from the first of a streak: after it they
/// are taken as lasting. A gateway whose monitor commands keep timing out would otherwise hold
/// the pool for the timeout at every tick, and keep asking the owner for it; quick failures
/// while the monitors elect a leader are tried again every tick meanwhile.
const PASSING_AT_MOST: Duration = Duration::from_secs(10);

/// How long to wait after a failed attempt, and the streak's wait after it, from the
/// streak's wait before it (zero for none), whether the failure lasts and the longest wait.
fn next_retry(streak: Duration, lasting: bool, most: Duration) -> (Duration, Duration) {
    if !lasting {
        return (RETRY_PASSING, streak);
    }
    let wait = if streak.is_zero() {
        RETRY_FIRST
    } else {
        (streak * 2).min(most)
    };
    (wait, wait)
}
/// How long a gateway whose attempt gave a pool back does not ask the owner for it: long
/// against the owner's `HANDOVER_IDLE` and `HANDOVER_GRACE`, so that a gateway that cannot
/// fence does not have the pool handed over, left unserved and taken back, round after round.
const NO_ASK_AFTER_FAILURE: Duration = Duration::from_secs(300);

/// After an administrator moved a pool away from this gateway, how long hosts' commands at
/// its standby ports do not have it ask for the pool back: those sent at the move's moment,
/// before the hosts heard of the new owner, would otherwise undo the move once the new owner
/// saw no I/O for a while.
const NO_ASK_AFTER_MOVE: Duration = Duration::from_secs(60);

/// How long an owner that handed a pool over to a gateway which did not take it (it could
/// not open it, say, before it even came to take it) hands it to that gateway no more when
/// it asks again: another that asks gets it, or it stays here, rather than go unserved for
/// the grace again and again. As long as a gateway that could not fence waits to ask.
const NO_HANDOVER_AFTER_UNTAKEN: Duration = NO_ASK_AFTER_FAILURE;

/// How a gateway serves a pool's hosts, as it says in etcd: the gateways a pool may move to.
#[derive(Clone, Copy, Debug)]
pub(super) enum Serving {
    /// It presents LUNs of the pool (and reports target port groups for them).
    Luns,
    /// It exports vdisks of the pool over NBD.
    Exports,
}

impl Serving {
    fn say(self, gw: &crate::rados_pools::Membership, name: &str) -> Result<(), String> {
        match self {
            Serving::Luns => gw.announce(name),
            Serving::Exports => gw.announce_exports(name),
        }
    }

    fn take_back(self, gw: &crate::rados_pools::Membership, name: &str) -> Result<(), String> {
        match self {
            Serving::Luns => gw.unannounce(name),
            Serving::Exports => gw.unannounce_exports(name),
        }
    }

    /// The lease under which pool `p`'s gateway last said it serves the pool this way.
    fn said(self, p: &RadosPool) -> Option<i64> {
        match self {
            Serving::Luns => p.announced,
            Serving::Exports => p.announced_exports,
        }
    }

    /// What [`Serving::said`] reads, to be changed.
    fn said_mut(self, p: &mut RadosPool) -> &mut Option<i64> {
        match self {
            Serving::Luns => &mut p.announced,
            Serving::Exports => &mut p.announced_exports,
        }
    }
}

/// A pool's place refused, as the API says it: a pool of the name elsewhere exists; a RADOS
/// pool the cluster does not have is a mistake in the request; etcd or the cluster that did
/// not answer (or refused this gateway) is a service unavailable, which the message names.
fn place_refused(e: crate::rados_pools::PlaceRefused) -> ApiError {
    match e {
        crate::rados_pools::PlaceRefused::Elsewhere(m) => ApiError::exists(m),
        crate::rados_pools::PlaceRefused::Invalid(m) => ApiError::invalid(m),
        crate::rados_pools::PlaceRefused::Unknown(m) => ApiError::unavailable(m),
    }
}

/// What a gateway says in etcd of a pool, on its lease, that the others act on: an owner
/// hands the pool to a gateway that asks for it, and moves it only to one that serves it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Mark {
    /// It asks the owner for the pool: a host sends I/O to its standby port.
    Asking,
    /// It serves the pool's hosts this way.
    Serving(Serving),
}

impl Mark {
    fn take_back(self, gw: &crate::rados_pools::Membership, name: &str) -> Result<(), String> {
        match self {
            Mark::Asking => gw.stop_asking(name),
            Mark::Serving(way) => way.take_back(gw, name),
        }
    }

    /// Whether pool entry `p` (the pool imported here again) says it anew.
    fn said_by(self, p: &RadosPool) -> bool {
        match self {
            Mark::Asking => p.asking.is_some(),
            Mark::Serving(way) => way.said(p).is_some(),
        }
    }
}

/// What this gateway knows of one pool on RADOS.
pub(crate) struct RadosPool {
    placement: Placement,
    /// Set while this gateway owns the pool.
    owned: Option<crate::rados_pools::Owned>,
    /// The owner last seen when this gateway could not take it.
    elsewhere: Option<PoolOwner>,
    /// The target port groups its LUNs report here (active/optimized while this gateway owns
    /// it, standby while another does).
    ports: Arc<PoolPorts>,
    /// Reads its metadata for the standby LUNs; made when first needed.
    reader: Option<Arc<Reader>>,
    /// The lease under which this gateway last said it presents the pool's LUNs.
    announced: Option<i64>,
    /// The lease under which this gateway last said it exports vdisks of the pool over NBD.
    announced_exports: Option<i64>,
    /// While this gateway owns the pool: the requests its vdisks have answered here, and
    /// when that count last moved (or the pool was taken): how long no host has used it.
    activity: (u64, Instant),
    /// When this gateway last handed the pool over to a gateway that asked for it.
    handed_over: Option<Instant>,
    /// The move it was handed over for then, if an administrator's: the gateway moved to,
    /// and the revision in etcd of the move (a move asked again since has another).
    moved_to: Option<(String, i64)>,
    /// The gateway it was handed over to then, until this gateway sees it own the pool.
    handed_to: Option<String>,
    /// A gateway the pool was handed over to and that did not take it, and when this
    /// gateway took it back: not handed to it again for [`NO_HANDOVER_AFTER_UNTAKEN`].
    untaken_by: Option<(String, Instant)>,
    /// The lease under which this gateway asks the owner for the pool (in etcd), if it does:
    /// the word goes with that lease, and is said again under the next.
    asking: Option<i64>,
    /// When this gateway last gave the pool up to open it again, a write having been refused.
    reopened: Option<Instant>,
    /// After attempts to take or open the pool that failed: not before when, and the
    /// streak's wait (`RETRY_FIRST`, doubled at each lasting failure since the last success;
    /// zero after passing ones alone: `next_retry`).
    retry: Option<(Instant, Duration)>,
    /// When the first failure that may pass of the streak came (`PASSING_AT_MOST`).
    passing_since: Option<Instant>,
    /// Openings that failed after their taking since the pool was last served here
    /// (`RETRY_MOST_AFTER_OPENING`).
    openings_failed: u32,
    /// Times this gateway took the pool and served it, and attempts that failed, since the
    /// daemon started (`pool list`, metrics).
    takeovers: u64,
    failed_takes: u64,
    /// When an attempt of this gateway last took the pool and gave it back for a reason that
    /// lasts (or could not open it): it does not ask the owner for the pool for
    /// `NO_ASK_AFTER_FAILURE` after.
    gave_back: Option<Instant>,
}

impl RadosPool {
    pub(super) fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The epoch this gateway owns the pool at, if it does.
    pub(super) fn epoch(&self) -> Option<i64> {
        self.owned.as_ref().map(|o| o.epoch)
    }

    /// Etcd made the handoff to gateway `to` just now: `to`'s grace to take the pool counts
    /// from now, not from when the release was asked (it may have waited on etcd).
    fn handed_over_now(&mut self, to: String) {
        self.handed_to = Some(to);
        self.handed_over = Some(Instant::now());
    }

    /// `asks` is told when a host first asks for the pool at one of its standby ports here.
    fn new(
        placement: Placement,
        owned: Option<crate::rados_pools::Owned>,
        me: &str,
        asks: Arc<tokio::sync::Notify>,
    ) -> RadosPool {
        let state = if owned.is_some() {
            AccessState::ActiveOptimized
        } else {
            AccessState::Standby
        };
        let ports = PoolPorts::new(me, state, state.active().then(|| me.to_string()), asks);
        if let Some(o) = &owned {
            ports.owned_under(o.lease_check());
        }
        RadosPool {
            placement,
            owned,
            elsewhere: None,
            ports,
            reader: None,
            announced: None,
            announced_exports: None,
            activity: (u64::MAX, Instant::now()),
            handed_over: None,
            moved_to: None,
            handed_to: None,
            untaken_by: None,
            asking: None,
            reopened: None,
            retry: None,
            openings_failed: 0,
            passing_since: None,
            takeovers: 0,
            failed_takes: 0,
            gave_back: None,
        }
    }
}

/// Jobs that stop for a handover of their pool to the gateway whose hosts ask for it,
/// rather than keep those hosts from their data until they end: maintenance that loses
/// nothing by stopping and that runs again at the next owner (a scrub goes on there where it
/// stopped, a scan and a dedup run or collection start again on their schedule or when
/// asked). An import, an export, a spot-fix or a repair keeps the pool until it ends: an
/// operator waits for it, and stopping it would throw its work away.
const YIELDS_TO_HOSTS: &[&str] = &["scrub", "scan", "dedup", "dedup-gc"];

impl Daemon {
    fn membership(&self) -> ApiResult<&crate::rados_pools::Membership> {
        self.gateway.as_deref().ok_or_else(|| {
            ApiError::invalid(
                "a pool on Ceph RADOS needs this daemon to be a gateway: give it a [gateway] table (name, etcd) in its configuration file",
            )
        })
    }

    pub(super) fn create_rados_pool(&self, req: &CreatePool, r: &RadosPlacement) -> ApiResult<PoolSummary> {
        if !req.disks.is_empty() || !req.cache_disks.is_empty() {
            return Err(ApiError::invalid(
                "a pool on RADOS has no disks of its own: its data lives in the RADOS pool; leave --disk and --cache-disk out",
            ));
        }
        let slab = req.slab_size.unwrap_or(DEFAULT_SLAB_SIZE);
        let capacity = req.capacity.ok_or_else(|| {
            ApiError::invalid(
                "a pool on RADOS needs --capacity SIZE: the most it may hold (thin: nothing is used until written)",
            )
        })?;
        if capacity < 2 * slab || capacity % tessera_disk::SECTOR as u64 != 0 {
            return Err(ApiError::invalid(format!(
                "a capacity of {capacity} bytes must be whole sectors and at least two slabs ({} bytes)",
                2 * slab
            )));
        }
        let placement = Placement::new(r).map_err(ApiError::invalid)?;
        let gw = self.membership()?;
        let _admin = self.admin.lock();
        let dir = self.new_pool_dir(&req.name)?;
        // Its place first, so that a pool of this name elsewhere is refused (as such, not as
        // one that exists) from now on; a create that fails below takes it back, if it
        // recorded it (a pool of this name may be there already, its record kept).
        let claimed = gw.claim_place(&req.name, &placement).map_err(place_refused)?;
        let refused = match gw.take(&req.name, &placement) {
            Ok(Taking::Mine(o)) => Ok(o),
            Err(e) => Err(ApiError::unavailable(e)),
            Ok(Taking::GaveBack { why, .. }) => Err(ApiError::unavailable(why)),
            Ok(Taking::Elsewhere(o)) => Err(ApiError::exists(format!(
                "pool '{}' exists in the cluster and {}: 'tessera pool import {} --rados {}' serves it here too once it is free",
                req.name,
                match o.epoch {
                    0 => format!("is handed over to gateway {}", o.gateway),
                    e => format!("gateway {} owns it (epoch {e})", o.gateway),
                },
                req.name,
                placement.rados_pool
            ))),
        };
        let owned = match refused {
            Ok(o) => o,
            Err(e) => {
                // Not taken, so not made: the name claims no place. Its fence record stays
                // (a pool of this name owned elsewhere may be older than places' records).
                if claimed {
                    if let Err(why) = gw.unclaim_place(&req.name, &placement) {
                        warn!(pool = %req.name, error = %why, "cannot take back the place recorded for a pool that was not made");
                    }
                }
                return Err(e);
            }
        };
        let made = std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))
            .and_then(|()| placement.write(&dir))
            .and_then(|()| owned.create(&dir, &req.name, capacity, slab));
        // Not made: nothing of it stays here, and the name claims no place (while still
        // owned here).
        let not_made = || {
            let _ = std::fs::remove_dir_all(&dir);
            if claimed {
                let _ = gw.forget_place(&req.name, &placement, Some(owned.epoch));
            }
            self.release_or_later(gw, &req.name, owned.epoch, None);
        };
        let engine = match made {
            Ok(e) => e,
            Err(e) => {
                not_made();
                return Err(ApiError::invalid(e));
            }
        };
        // Recorded before it is served, as a local pool is: all or nothing.
        if let Err(err) = self.record_imported_with(&req.name) {
            drop(engine);
            if let Err(e) = owned.remove_objects(&req.name, capacity) {
                warn!(pool = %req.name, error = %e, "cannot remove the objects of a pool whose creation could not be recorded");
            }
            not_made();
            return Err(ApiError::io(err));
        }
        let epoch = owned.epoch;
        let p = RadosPool::new(placement, Some(owned), gw.name(), gw.changes());
        self.connect_to_other_gateways(&req.name, &p.ports);
        self.targets.set_pool_ports(&req.name, Some(p.ports.clone()));
        self.rados.lock().insert(req.name.clone(), p);
        self.pools.write().insert(req.name.clone(), Arc::new(engine));
        self.changed(
            "pool.created",
            &req.name,
            None,
            format!(
                "pool {} created in RADOS pool {}, owned by gateway {} at epoch {epoch}",
                req.name,
                r.pool,
                gw.name()
            ),
        );
        self.pool_summary(&req.name)
    }

    /// Records where pool `name` lives in the cluster and serves it if nobody owns it; else it
    /// waits, listed as unavailable, until its owner lets go.
    pub(super) fn import_rados_pool(&self, name: &str, placement: Placement) -> ApiResult<PoolSummary> {
        // A pool of this name recorded elsewhere is refused here, once, as such: the ticks
        // look at the record only when nobody owns the pool.
        self.membership()?
            .check_place(name, &placement)
            .map_err(place_refused)?;
        {
            let _admin = self.admin.lock();
            self.not_being_destroyed(name)?;
            if self.pools.read().contains_key(name) || self.unavailable.read().contains_key(name) {
                return Err(ApiError::exists(format!("pool '{name}' is already imported")));
            }
            let dir = self.pool_dir(name);
            match Placement::read(&dir).map_err(ApiError::invalid)? {
                Some(p) if p != placement => {
                    return Err(ApiError::exists(format!(
                        "pool '{name}' is recorded in {} as in RADOS pool '{}' of {}: import it without --rados, or export it first",
                        dir.display(),
                        p.rados_pool,
                        p.ceph_conf
                    )))
                }
                Some(_) => {}
                None if dir.exists() => {
                    return Err(ApiError::exists(format!(
                        "a local pool '{name}' is in {}: import it without --rados",
                        dir.display()
                    )))
                }
                None => {
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| ApiError::internal(format!("cannot create {}: {e}", dir.display())))?;
                    placement.write(&dir).map_err(ApiError::internal)?;
                }
            }
            // Recorded before it is waited for, as a made pool is: a list that cannot be
            // written leaves the pool as it was, rather than taken and served here behind
            // the error, and forgotten at the next start.
            self.record_imported_with(name).map_err(ApiError::io)?;
            self.wait_for(name, placement);
        }
        self.bring_rados_pool(name);
        self.pool_summary(name)
    }

    /// At start: pool `name` has a placement file in its directory.
    /// Taken now unless `leave_to_tick` (then the tick takes it, in the background); true
    /// if the pools after it are to be left to the tick: its taking waited
    /// `SLOW_TAKING_AT_START` or more and did not serve it, as when the cluster's monitors
    /// or etcd do not answer. Each taking would wait that out again (30 s for the monitors),
    /// and a gateway starting serves nothing (its local pools, its LUNs) until every pool
    /// was loaded.
    pub(super) fn load_rados_pool(&self, name: &str, leave_to_tick: bool) -> bool {
        let dir = self.pool_dir(name);
        let placement = match Placement::read(&dir) {
            Ok(Some(p)) => p,
            Ok(None) => return leave_to_tick,
            Err(e) => {
                self.unavailable.write().insert(name.to_string(), e);
                return leave_to_tick;
            }
        };
        self.wait_for(name, placement);
        if leave_to_tick {
            info!(pool = %name, "pool left to be taken in the background: a taking before it at start waited on etcd or the cluster");
            return true;
        }
        let started = Instant::now();
        self.bring_rados_pool(name);
        started.elapsed() >= SLOW_TAKING_AT_START && !self.pools.read().contains_key(name)
    }

    /// Lists pool `name` as on RADOS and not served here yet.
    fn wait_for(&self, name: &str, placement: Placement) {
        let me = self.gateway.as_ref().map(|g| g.name()).unwrap_or_default();
        let waiting = RadosPool::new(placement, None, me, self.gateway_changes());
        self.connect_to_other_gateways(name, &waiting.ports);
        self.targets.set_pool_ports(name, Some(waiting.ports.clone()));
        self.rados.lock().insert(name.to_string(), waiting);
        self.unavailable
            .write()
            .insert(name.to_string(), "not taken yet".to_string());
    }

    /// Whether pool `name` is on RADOS (its directory holds a placement).
    pub(super) fn is_rados_pool(&self, name: &str) -> bool {
        self.pool_dir(name).join(PLACEMENT_FILE).exists()
    }

    /// Takes pool `name` if nobody owns it and serves it; otherwise records who does.
    ///
    /// Taking and opening talk to etcd and Ceph, which may take seconds (or the cluster's
    /// timeouts when it is down), so they run without the admin lock and the API answers
    /// meanwhile; only the outcome is applied under it, if the pool is still known then.
    fn bring_rados_pool(&self, name: &str) {
        let _bringing = self.bringing.lock();
        if self.pools.read().contains_key(name) || self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let Some(placement) = self.rados.lock().get(name).map(|p| p.placement.clone()) else {
            return;
        };
        let started = Instant::now();
        // Just handed over: the gateway that asked takes it; this one only looks, unless
        // nobody took it within the grace (or the pool is moved back here).
        let handed_over = self
            .rados
            .lock()
            .get(name)
            .and_then(|p| p.handed_over)
            .filter(|t| t.elapsed() < HANDOVER_GRACE);
        // Whether the attempt failed (rather than found the pool owned elsewhere), and if so
        // whether for a reason that lasts.
        let mut failed = None;
        // Whether it was taken (its previous owner fenced off) and could not be opened.
        let mut opening_failed = false;
        let why = match &self.gateway {
            None => "the pool is on Ceph RADOS and this daemon is not a gateway: give it a [gateway] table in its configuration file".to_string(),
            Some(gw) => match match handed_over {
                // An administrator moves it here since: taken at once.
                Some(t) if !gw.moving(name).is_ok_and(|m| m.is_some_and(|(to, _)| to == gw.name())) => gw.other_owner(name).and_then(|o| {
                    o.map(Taking::Elsewhere).ok_or_else(|| {
                        format!(
                            "handed over {:.0} s ago to another gateway; waiting for it to take the pool",
                            t.elapsed().as_secs_f64()
                        )
                    })
                }),
                _ => gw.take_made(name, &placement),
            } {
                Err(e) => e,
                Ok(Taking::GaveBack { why, lasting }) => {
                    failed = Some(lasting);
                    // It was free: nobody owns it now.
                    if let Some(p) = self.rados.lock().get_mut(name) {
                        p.elsewhere = None;
                    }
                    why
                }
                Ok(Taking::Elsewhere(o)) => {
                    let why = match o.epoch {
                        // Handed over, not taken yet (`release_to`).
                        0 => format!(
                            "handed over to gateway {}, which takes it; this gateway takes it over only if neither that one nor the gateway that handed it over serves it",
                            o.gateway
                        ),
                        _ => format!(
                            "owned by gateway {} (epoch {}); this gateway takes it over once that one's lease lapses",
                            o.gateway, o.epoch
                        ),
                    };
                    if let Some(p) = self.rados.lock().get_mut(name) {
                        if o.epoch != 0 {
                            // Taken since it was handed over (by the gateway it was handed
                            // to, or by another once the handoff ended): nobody to blame.
                            p.handed_to = None;
                        }
                        p.elsewhere = Some(o.clone());
                        // A streak of failures ends where the pool is found served.
                        // (Not its count of failed openings: owned elsewhere may be
                        // another gateway's opening under way, which fails as well.)
                        p.retry = None;
                        p.passing_since = None;
                    }
                    self.present_standby(name, &o);
                    why
                }
                Ok(Taking::Mine(owned)) => match {
                    info!(pool = %name, epoch = owned.epoch, seconds = started.elapsed().as_secs_f64(), "pool taken, previous owner fenced off; opening it");
                    // Hosts are told to retry while it opens, not that the owner fenced off
                    // still has the active path.
                    self.set_pool_access(name, AccessState::Transitioning, None);
                    owned.open(&self.pool_dir(name), name)
                } {
                    Err(e) => {
                        self.release_or_later(gw, name, owned.epoch, None);
                        self.set_pool_access(name, AccessState::Standby, None);
                        failed = Some(true);
                        opening_failed = true;
                        e
                    }
                    Ok(engine) => {
                        let epoch = owned.epoch;
                        let _admin = self.admin.lock();
                        if !self.rados.lock().contains_key(name) || self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
                            // Exported or destroyed here while it was being opened, or the
                            // daemon is stopping: given up, not served. (Its disk waits
                            // for the writes it sent when it goes: not while the
                            // administration waits.)
                            drop(_admin);
                            drop(engine);
                            self.release_or_later(gw, name, epoch, None);
                            return;
                        }
                        if gw.lease() != Some(owned.lease) || !gw.alive() {
                            // The lease it was taken under lapsed while it was being opened
                            // (the tick has joined again since, or will): another gateway
                            // may own it already, and would fence this connection off.
                            drop(_admin);
                            drop(engine);
                            warn!(pool = %name, epoch, "this gateway's lease lapsed while the pool was being opened; it waits for the pool again");
                            return;
                        }
                        info!(pool = %name, epoch, seconds = started.elapsed().as_secs_f64(), "pool opened");
                        let mut moved_to = None;
                        if let Some(p) = self.rados.lock().get_mut(name) {
                            let handed_to = p.handed_to.take();
                            // A move whose handoff etcd never made is nobody's failure: it
                            // is carried out at a later tick.
                            moved_to = p.moved_to.take().filter(|_| handed_to.is_some());
                            if let Some(g) = handed_to {
                                // Handed over to it, never seen taken by it: taken back.
                                p.untaken_by = Some((g, Instant::now()));
                            }
                            p.ports.owned_under(owned.lease_check());
                            p.owned = Some(owned);
                            p.retry = None;
                            p.openings_failed = 0;
                            p.passing_since = None;
                            p.gave_back = None;
                            p.takeovers += 1;
                            p.elsewhere = None;
                            p.activity = (u64::MAX, Instant::now());
                            p.handed_over = None;
                            p.ports.set(AccessState::ActiveOptimized, Some(gw.name().to_string()));
                        }
                        self.pools.write().insert(name.to_string(), Arc::new(engine));
                        self.unavailable.write().remove(name);
                        self.events.record(
                            NewEvent::new(
                                Severity::Warning,
                                "pool.taken",
                                format!("pool {name} taken by gateway {} at epoch {epoch}: served here", gw.name()),
                            )
                            .pool(name),
                        );
                        self.settle_replicas(name);
                        // The real LUNs take the standby ones' places; but not a replica's
                        // working copy, which the gateway that received it may have left
                        // marked so after the LUN was set up here.
                        self.targets.serve_pool(name, &|vd| self.resolve_lun(vd));
                        self.nbd
                            .present_missing(&|vd| self.served_vdisk(vd), &|vd| self.may_export_writable(vd));
                        drop(_admin);
                        self.settle_move(gw, name, moved_to);
                        return;
                    }
                },
            },
        };
        let _admin = self.admin.lock();
        if let Some(p) = self.rados.lock().get_mut(name) {
            if let Some(mut lasting) = failed {
                if !lasting {
                    let since = *p.passing_since.get_or_insert_with(Instant::now);
                    lasting = since.elapsed() > PASSING_AT_MOST;
                }
                if opening_failed {
                    p.openings_failed += 1;
                }
                let most = retry_most(p.openings_failed);
                let (wait, streak) = next_retry(p.retry.map_or(Duration::ZERO, |(_, d)| d), lasting, most);
                p.retry = Some((Instant::now() + wait, streak));
                p.failed_takes += 1;
                if lasting {
                    p.gave_back = Some(Instant::now());
                }
                warn!(pool = %name, why, lasting, retry_seconds = wait.as_secs(), "cannot take the pool; trying again later");
            }
            self.unavailable.write().insert(name.to_string(), why);
        }
    }

    /// Sets the access state of pool `name`'s ports here, and tells its LUNs if it changed.
    fn set_pool_access(&self, name: &str, state: AccessState, owner: Option<String>) {
        let Some(ports) = self.rados.lock().get(name).map(|p| p.ports.clone()) else {
            return;
        };
        if ports.set(state, owner) {
            for lun in self.targets.luns_of_pool(name) {
                lun.access_state_changed();
            }
        }
    }

    /// Presents the configured LUNs of pool `name`, which gateway `owner` owns, as standby
    /// ports here, from what the pool's metadata records (read afresh every tick, so that a
    /// vdisk made or resized at the owner since shows as it is). A failure is logged and
    /// tried again at the next tick.
    fn present_standby(&self, name: &str, owner: &PoolOwner) {
        let Some(ports) = self.rados.lock().get(name).map(|p| p.ports.clone()) else {
            return;
        };
        self.set_pool_access(name, AccessState::Standby, Some(owner.name.clone()));
        // Every tick, the presented ones too: the owner may have resized a vdisk or a host
        // changed its mode settings there.
        let Some(units) = self.standby_units(name) else {
            return;
        };
        let _admin = self.admin.lock();
        if !self.rados.lock().get(name).is_some_and(|p| p.owned.is_none()) {
            return; // exported, destroyed or taken here meanwhile
        }
        self.targets.present_standby(name, &ports, &|vd| unit_of(&units, vd));
    }

    /// What the metadata of pool `name` records of the vdisks its configured LUNs present,
    /// for their standby LUNs; None (logged, tried again at the next tick) while it cannot be
    /// read.
    fn standby_units(&self, name: &str) -> Option<Vec<(String, StandbyUnit)>> {
        let (placement, reader) = self
            .rados
            .lock()
            .get(name)
            .map(|p| (p.placement.clone(), p.reader.clone()))?;
        let wanted: Vec<String> = self.targets.vdisks_of_pool(name);
        if wanted.is_empty() {
            return Some(Vec::new());
        }
        let reader = match reader {
            Some(r) => r,
            None => match Reader::connect(&placement, &self.data_paths()) {
                Ok(r) => {
                    let r = Arc::new(r);
                    if let Some(p) = self.rados.lock().get_mut(name) {
                        p.reader = Some(r.clone());
                    }
                    r
                }
                Err(e) => {
                    debug!(pool = %name, error = %e, "cannot read the pool's records for its standby LUNs yet");
                    return None;
                }
            },
        };
        reader
            .units(name, &wanted)
            .map_err(|e| debug!(pool = %name, error = %e, "cannot read the pool's records for its standby LUNs yet"))
            .ok()
    }

    /// The standby units of pool `name`'s LUNs as this gateway serves them now (its engine's
    /// vdisks, its LUNs' mode settings), for when the cluster does not give its records.
    fn standby_units_as_served(&self, name: &str) -> Option<Vec<(String, StandbyUnit)>> {
        let engine = self.pools.read().get(name).cloned()?;
        let wanted = self.targets.vdisks_of_pool(name);
        let luns = self.targets.luns_of_pool(name);
        let pool = engine.pool().id().as_u128();
        let units = engine
            .vdisks()
            .iter()
            .map(|v| v.config())
            .filter_map(|config| {
                let full = format!("{name}/{}", config.name);
                if !wanted.contains(&full) {
                    return None;
                }
                let uid = crate::targets::lun_uid_of(pool, config.id);
                let naa = tessera_scsi::naa_of(uid);
                let mode = luns.iter().find(|l| *l.naa() == naa).map(|l| l.mode());
                Some((full, StandbyUnit { uid, config, mode }))
            })
            .collect();
        Some(units)
    }

    /// Gives up pool `name`, owned here at `epoch`, as a handover and a reopening do: the
    /// pool's ports take the state given, standby LUNs take the real ones' places (each in
    /// one step, so that a host's path checker finds the LUN in standby or transitioning,
    /// never gone), the pool stops being served, `settle` runs on its engine (before etcd
    /// hears of it: a checkpoint, say), `mark` notes why on its entry, and its ownership is
    /// released in etcd. Returns its engine and its owned connection, for the caller to let
    /// go of once the administration no longer waits on it.
    fn give_up(
        &self,
        g: GivingUp<'_>,
        settle: impl FnOnce(&Engine),
        mark: impl FnOnce(&mut RadosPool),
    ) -> (Option<Arc<Engine>>, Option<crate::rados_pools::Owned>, bool) {
        let (state, owner) = g.access;
        g.ports.set(state, owner);
        // Records the cluster does not give now (the OSDs refuse or time out, most likely
        // when a pool is opened again): the units as served here, rather than no LUN at all
        // until they can be read.
        if let Some(units) = g.units.or_else(|| self.standby_units_as_served(g.name)) {
            self.targets.present_standby(g.name, g.ports, &|vd| unit_of(&units, vd));
        }
        let engine = self.stop_serving(g.name, g.why);
        if let Some(engine) = &engine {
            settle(engine);
        }
        let owned = self.rados.lock().get_mut(g.name).and_then(|p| {
            mark(p);
            p.owned.take()
        });
        // Should etcd fail it, the key would keep the pool this gateway's for as long as
        // its lease is renewed, and no other gateway could take it: tried again at the ticks
        // (for any gateway to take).
        let released = self.release_or_later(g.gw, g.name, g.epoch, g.to);
        (engine, owned, released)
    }

    /// Stops serving every pool on RADOS this gateway owned: its lease is lost, so another
    /// gateway may own them already. Their LUNs and exports are withdrawn (their
    /// configuration stays, for when the pool is taken again).
    fn lose_rados_pools(&self, why: &str) {
        // Let go of after the lock: the last reference to an engine flushes its disks as it
        // goes, waiting up to the cluster's timeout for writes in flight.
        let mut engines = Vec::new();
        let admin = self.admin.lock();
        let lost: Vec<(String, Arc<PoolPorts>)> = self
            .rados
            .lock()
            .iter_mut()
            .filter_map(|(n, p)| p.owned.take().map(|_| (n.clone(), p.ports.clone())))
            .collect();
        for (name, ports) in lost {
            // Its LUNs stay, transitioning (hosts retry, at the next owner once there is
            // one), as served here: with etcd away, nothing says who owns the pool, and a
            // LUN gone would have hosts fail the path. Nothing is asked of etcd or the
            // cluster here: either may be what is away.
            ports.set(AccessState::Transitioning, None);
            if let Some(units) = self.standby_units_as_served(&name) {
                self.targets.present_standby(&name, &ports, &|vd| unit_of(&units, vd));
            }
            engines.push(self.stop_serving(&name, why.to_string()));
            self.events.record(
                NewEvent::new(
                    Severity::Critical,
                    "pool.lost",
                    format!("pool {name} no longer served here: {why}"),
                )
                .pool(&name),
            );
        }
        drop(admin);
        drop(engines);
    }

    /// Notified when another gateway's keys change in etcd: the tick then runs at once.
    pub fn gateway_changes(&self) -> Arc<tokio::sync::Notify> {
        self.gateway.as_ref().map(|g| g.changes()).unwrap_or_default()
    }

    /// A watch of the commands other gateways forward to the owners, made before
    /// [`answer_asks`](Self::answer_asks) looks (None when this daemon is no gateway, has not
    /// joined yet, or etcd does not answer).
    pub async fn watch_asks(&self) -> Option<crate::rados_pools::AsksComing> {
        self.gateway.as_ref()?.watch_asks().await
    }

    /// The pools on RADOS this gateway owns now.
    fn rados_pools_owned(&self) -> Vec<String> {
        self.rados_pools_owned_where(|_| true)
    }

    /// The pools on RADOS this gateway owns now whose ownership `keep` accepts.
    fn rados_pools_owned_where(&self, keep: impl Fn(&crate::rados_pools::Owned) -> bool) -> Vec<String> {
        self.rados
            .lock()
            .iter()
            .filter(|(_, p)| p.owned.as_ref().is_some_and(&keep))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Once a second, and whenever a gateway's keys change: keeps this gateway's membership,
    /// takes the pools nobody owns, hands over those asked for.
    pub fn rados_tick(&self) {
        let Some(gw) = &self.gateway else { return };
        if self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            // What it owns is being given up (`release_rados_pools`): nothing more is taken.
            return;
        }
        if !gw.alive() {
            // Never joined (etcd did not answer at start): nothing to lose, and the failure
            // was logged once then.
            let joined_before = gw.joined();
            if joined_before {
                self.lose_rados_pools(
                    "this gateway's lease in etcd lapsed (it stalled, or lost etcd): another gateway may own the pool now",
                );
            }
            if let Err(e) = gw.rejoin() {
                if joined_before {
                    warn!(error = %e, "cannot join the gateways again; retrying");
                } else {
                    debug!(error = %e, "cannot join the gateways yet; retrying");
                }
                return;
            }
            info!(gateway = gw.name(), "joined the gateways");
        }
        let now = Instant::now();
        let waiting: Vec<String> = self
            .rados
            .lock()
            .iter()
            .filter(|(_, p)| p.owned.is_none() && p.retry.is_none_or(|(at, _)| now >= at))
            .map(|(n, _)| n.clone())
            .collect();
        // First: a handover etcd did not make then is made before the pool is looked at,
        // rather than taken back.
        self.release_forgotten_pools(gw);
        self.take_back_marks_left(gw);
        for name in waiting {
            if self.unavailable.read().contains_key(&name) {
                self.bring_rados_pool(&name);
            }
        }
        self.reopen_refused_pools(gw);
        self.hand_over_asked_pools(gw);
        self.ask_for_wanted_pools(gw);
        self.announce_presence(gw);
    }

    /// Opens again each pool served here whose disk had a write refused by the OSDs (a
    /// timeout, a blocklist) while this gateway still owns it: no flush on that opening can
    /// say "durable" again. The pool is given up and taken again at the next tick by a fresh
    /// connection that fences the old one off (or by another gateway), and served from what
    /// the cluster holds, its journal replayed; hosts find its LUNs transitioning meanwhile.
    /// A pool that another gateway owns in etcd by now is given up the same way, and found
    /// owned there at the next tick: with this gateway's lease lapsed, the lease's check
    /// gives it up first; with the lease still held, the key was taken from it (deleted by
    /// hand, or etcd restored from an older snapshot), and nothing else would give it up.
    fn reopen_refused_pools(&self, gw: &crate::rados_pools::Membership) {
        // Asked of the disks out of the lock: a disk answers once it has handed its writes
        // to librados, and the API and the tick's other steps wait for the lock.
        let opened: Vec<(String, i64, crate::rados_pools::Refusals)> = self
            .rados
            .lock()
            .iter()
            .filter(|(_, p)| p.reopened.is_none_or(|t| t.elapsed() >= REOPEN_EVERY))
            .filter_map(|(n, p)| {
                let o = p.owned.as_ref()?;
                Some((n.clone(), o.epoch, o.refusals()))
            })
            .collect();
        let refused = opened
            .into_iter()
            .filter_map(|(n, epoch, r)| Some((n, epoch, r.refused()?)));
        for (name, epoch, why) in refused {
            match gw.other_owner(&name) {
                Ok(None) => self.reopen(gw, &name, epoch, &why),
                Ok(Some(o)) => self.reopen(
                    gw,
                    &name,
                    epoch,
                    &format!(
                        "{why}; gateway {} owns the pool in etcd now (epoch {})",
                        o.gateway, o.epoch
                    ),
                ),
                Err(e) => {
                    debug!(pool = %name, error = %e, "cannot learn who owns the pool; it is opened again at a later tick")
                }
            }
        }
    }

    /// The epoch pool `name` is owned here at, and its target port groups; None unless it
    /// is owned here.
    fn owned_epoch_and_ports(&self, name: &str) -> Option<(i64, Arc<PoolPorts>)> {
        let rados = self.rados.lock();
        let p = rados.get(name)?;
        Some((p.owned.as_ref()?.epoch, p.ports.clone()))
    }

    /// Opens pool `name` again, if it is still served here under the opening at `refused_at`,
    /// the one that vouches for nothing more (not one made since).
    fn reopen(&self, gw: &crate::rados_pools::Membership, name: &str, refused_at: i64, why: &str) {
        // Read before the administration waits on this: the cluster may be slow to answer now.
        let units = self.standby_units(name);
        let admin = self.admin.lock();
        let Some((epoch, ports)) = self.owned_epoch_and_ports(name).filter(|(e, _)| *e == refused_at) else {
            return;
        };
        warn!(pool = %name, why, "this opening of the pool vouches for nothing more: opening it again");
        // Transitioning until the pool is served again. Nothing to settle: the disk's
        // writes are refused.
        let why = format!("being opened again: {why}");
        let (engine, owned, _) = self.give_up(
            GivingUp {
                gw,
                name,
                epoch,
                ports: &ports,
                units,
                access: (AccessState::Transitioning, None),
                why: why.clone(),
                to: None,
            },
            |_| {},
            |p| p.reopened = Some(Instant::now()),
        );
        self.events
            .record(NewEvent::new(Severity::Warning, "pool.reopened", format!("pool {name} {why}")).pool(name));
        // Its disk waits for the writes it sent when it goes: not while the administration
        // waits.
        drop(admin);
        drop(engine);
        drop(owned);
    }

    /// Says in etcd which pools this gateway presents LUNs of, and which it exports vdisks of
    /// over NBD (each once per lease: the gateways a pool may move to), and learns which
    /// gateways present each, for the target port groups its LUNs report.
    fn announce_presence(&self, gw: &crate::rados_pools::Membership) {
        let lease = gw.lease();
        let pools: Vec<(String, Option<i64>, Option<i64>, Arc<PoolPorts>)> = self
            .rados
            .lock()
            .iter()
            .map(|(n, p)| (n.clone(), p.announced, p.announced_exports, p.ports.clone()))
            .collect();
        for (name, announced, announced_exports, ports) in pools {
            let exports = !self.nbd.users_of(&format!("{name}/")).is_empty();
            self.say_whether(gw, &name, Serving::Exports, exports, announced_exports, lease);
            let luns = !self.targets.vdisks_of_pool(&name).is_empty();
            self.say_whether(gw, &name, Serving::Luns, luns, announced, lease);
            if !luns {
                continue;
            }
            match gw.presenting(&name) {
                Ok(list) => {
                    for (a, b) in ports.set_presenting(list) {
                        warn!(pool = %name, "gateways {a} and {b} present the pool under the same target port group ({}): hosts cannot tell their paths apart; rename one of them", crate::standby::group_of(&a));
                    }
                }
                Err(e) => debug!(pool = %name, error = %e, "cannot learn which gateways present the pool"),
            }
        }
    }

    /// Says in etcd that this gateway serves pool `name` the `way` it does (`now`), under
    /// `lease` if it did not yet (`said`: the lease it last said it under), or takes the word
    /// back once it no longer does.
    fn say_whether(
        &self,
        gw: &crate::rados_pools::Membership,
        name: &str,
        way: Serving,
        now: bool,
        said: Option<i64>,
        lease: Option<i64>,
    ) {
        let done = match (now, said) {
            (false, None) => return,
            (false, Some(_)) => way.take_back(gw, name).map(|()| None),
            (true, said) if said == lease => return,
            (true, _) => way.say(gw, name).map(|()| lease),
        };
        match done {
            Ok(l) => {
                let here = self.with_rados_pool(name, |p| *way.said_mut(p) = l);
                // Left here meanwhile (exported, destroyed): its leaving took back what it
                // found said, not this, which would stay on this gateway's lease.
                if !here && l.is_some() {
                    self.take_back_or_later(gw, name, Mark::Serving(way));
                }
            }
            Err(e) => debug!(pool = %name, error = %e, "cannot say in etcd how this gateway serves the pool yet"),
        }
    }

    /// Applies `change` to pool `name`'s entry if it is still a pool on RADOS here; false
    /// once it left (exported, destroyed), for what a tick did meanwhile to be undone.
    fn with_rados_pool(&self, name: &str, change: impl FnOnce(&mut RadosPool)) -> bool {
        self.rados.lock().get_mut(name).map(change).is_some()
    }

    /// Gives up pool `name` after it was exported here, or forgotten while unavailable: its
    /// objects stay for an import, here or at another gateway. (A destroyed pool's go:
    /// `destroy_pool`.)
    pub(super) fn forget_rados_pool(&self, name: &str) -> ApiResult<()> {
        match self.leave_rados_pool(name) {
            Some(p) => self.end_rados_pool(name, p, None),
            None => Ok(()),
        }
    }

    /// The first half of [`forget_rados_pool`](Self::forget_rados_pool), under the admin
    /// lock: pool `name` is no longer a pool on RADOS of this daemon (the ticks neither take,
    /// hand over nor open it again), and its LUNs and ports are withdrawn. Returns what this
    /// gateway held of it, its ownership among it: still held until
    /// [`end_rados_pool`](Self::end_rados_pool).
    pub(super) fn leave_rados_pool(&self, name: &str) -> Option<RadosPool> {
        let p = self.rados.lock().remove(name)?;
        // Its standby LUNs, if another gateway owned it (the configuration stays).
        self.targets.withdraw_pool(name);
        self.targets.set_pool_ports(name, None);
        Some(p)
    }

    /// The second half, which needs no lock of the daemon (each etcd request may wait for a
    /// taking's fence, seconds): the other gateways are no longer told that this one asks
    /// for the pool or serves it; with `capacity` (a destroyed pool's), its objects are
    /// removed from the cluster and its directory here, while still owned here; then its
    /// record of place is given up (for good once its objects are gone), and its ownership.
    pub(super) fn end_rados_pool(&self, name: &str, p: RadosPool, capacity: Option<u64>) -> ApiResult<()> {
        if let Some(gw) = &self.gateway {
            for (said, mark) in [
                (p.asking, Mark::Asking),
                (p.announced, Mark::Serving(Serving::Luns)),
                (p.announced_exports, Mark::Serving(Serving::Exports)),
            ] {
                if said.is_some() {
                    self.take_back_or_later(gw, name, mark);
                }
            }
        }
        let (Some(owned), Some(gw)) = (p.owned, &self.gateway) else {
            if let Some(gw) = &self.gateway {
                let _ = gw.forget_place(name, &p.placement, None);
            }
            return Ok(());
        };
        let Some(capacity) = capacity else {
            let _ = gw.forget_place(name, &p.placement, None);
            // Given up: this gateway no longer serves the pool, and kept, its key would say
            // so to the other gateways for as long as it runs.
            self.release_or_later(gw, name, owned.epoch, None);
            return Ok(());
        };
        self.remove_destroyed(gw, name, &p.placement, owned, capacity)
            .map_err(|e| {
                ApiError::internal(format!(
                    "pool {name} is no longer served here, but not all of it was removed from the cluster: {e}"
                ))
            })
    }

    /// Gives pool `name`, owned here at `epoch` and no longer served here, up in etcd; if
    /// etcd does not answer now, at a later tick ([`release_forgotten_pools`]): nothing else
    /// here would ever give it up.
    /// `to`: the gateway it is handed over to, which alone may take it for a while
    /// ([`HANDOFF_BARS_FOR`]).
    /// True if etcd gave it up (and made the handoff) now.
    pub(super) fn release_or_later(
        &self,
        gw: &crate::rados_pools::Membership,
        name: &str,
        epoch: i64,
        to: Option<&str>,
    ) -> bool {
        match release(gw, name, epoch, to) {
            Ok(done) => done,
            Err(e) => {
                warn!(pool = %name, error = %e, "cannot give the pool up in etcd now; trying again at the next ticks");
                self.unreleased
                    .lock()
                    .push((name.to_string(), epoch, to.map(String::from)));
                false
            }
        }
    }

    /// Takes back what this gateway said in etcd of pool `name`, which it has left (exported,
    /// destroyed); if etcd does not answer now, at the next ticks. Left on this gateway's
    /// lease, which lives as long as it runs, it would go on being read: an owner would hand
    /// the pool, idle, to this gateway that no longer has it, and take it back after the
    /// grace, every few minutes; a move to it would be accepted and given up.
    pub(super) fn take_back_or_later(&self, gw: &crate::rados_pools::Membership, name: &str, mark: Mark) {
        if let Err(e) = mark.take_back(gw, name) {
            warn!(pool = %name, error = %e, ?mark, "cannot take back in etcd what this gateway said of a pool it left; trying again at the next ticks");
            self.marks_left.lock().push((name.to_string(), mark));
        }
    }

    /// Takes back what [`take_back_or_later`](Self::take_back_or_later) could not, unless
    /// the pool, imported here again since, says it anew.
    fn take_back_marks_left(&self, gw: &crate::rados_pools::Membership) {
        let mut pending = std::mem::take(&mut *self.marks_left.lock()).into_iter();
        while let Some((name, mark)) = pending.next() {
            if self.rados.lock().get(&name).is_some_and(|p| mark.said_by(p)) {
                continue;
            }
            match mark.take_back(gw, &name) {
                Ok(()) => info!(pool = %name, ?mark, "taken back in etcd: this gateway no longer has the pool"),
                Err(e) => {
                    // The rest at a later tick too: each call may wait out etcd's bound, and
                    // this tick has pools to serve.
                    debug!(pool = %name, error = %e, ?mark, "cannot take back in etcd yet what this gateway said of a pool it left");
                    let mut left = self.marks_left.lock();
                    left.push((name, mark));
                    left.extend(pending);
                    return;
                }
            }
        }
    }

    /// Gives up in etcd the pools no longer served here (handed over, given up, exported or
    /// destroyed) whose ownership could not be given up then; not one owned here again
    /// since (its taking settled its key). Each only at the epoch it was owned at: a key
    /// of a later taking stays.
    fn release_forgotten_pools(&self, gw: &crate::rados_pools::Membership) {
        let pending = std::mem::take(&mut *self.unreleased.lock());
        for (name, epoch, to) in pending {
            if self.rados.lock().get(&name).is_some_and(|p| p.owned.is_some()) {
                // Owned here again: under this key, or a newer one.
                continue;
            }
            match release(gw, &name, epoch, to.as_deref()) {
                Ok(handed) => {
                    info!(pool = %name, "pool given up in etcd for the other gateways");
                    // Handed over only now: the gateway it goes to has its grace from now.
                    if let Some(to) = to.filter(|_| handed) {
                        if let Some(p) = self.rados.lock().get_mut(&name).filter(|p| p.owned.is_none()) {
                            p.handed_over_now(to);
                        }
                    }
                }
                Err(e) => {
                    debug!(pool = %name, error = %e, "cannot give the pool up in etcd yet");
                    self.unreleased.lock().push((name, epoch, to));
                }
            }
        }
    }

    /// At shutdown, after the pools were flushed: gives up what this gateway owns, so that
    /// another takes it at once instead of after the lease.
    pub(super) fn release_rados_pools(&self) {
        let Some(gw) = &self.gateway else { return };
        // Out of the lock: each release may wait on etcd.
        let owned: Vec<(String, i64)> = self
            .rados
            .lock()
            .iter()
            .filter_map(|(name, p)| Some((name.clone(), p.owned.as_ref()?.epoch)))
            .collect();
        for (name, epoch) in owned {
            match gw.release(&name, epoch) {
                Ok(()) => info!(pool = %name, "pool given up for other gateways"),
                Err(e) => {
                    warn!(pool = %name, error = %e, "cannot give the pool up; other gateways take it when the lease lapses")
                }
            }
        }
    }

    /// The owner of pool `name`, when it is a pool on RADOS that this gateway waits for
    /// (another gateway serves it, or nobody yet).
    pub(super) fn waiting_rados_pool(&self, name: &str) -> Option<String> {
        let rados = self.rados.lock();
        let p = rados.get(name)?;
        if p.owned.is_some() {
            return None;
        }
        Some(
            p.elsewhere
                .as_ref()
                .map_or_else(|| "nobody yet".to_string(), |o| o.gateway.clone()),
        )
    }

    /// Whether this gateway held its lease in etcd at the last tick; None for a daemon that
    /// is no gateway. Never waits (a taking under way holds the gateway).
    pub(crate) fn gateway_joined(&self) -> Option<bool> {
        self.gateway.as_ref().map(|g| g.seen_alive())
    }

    /// What `pool list` shows of a pool on RADOS.
    pub(super) fn rados_view(&self, name: &str) -> Option<RadosPoolView> {
        let rados = self.rados.lock();
        let p = rados.get(name)?;
        let (owner, owner_name, epoch, here) = match (&p.owned, &p.elsewhere, &self.gateway) {
            (Some(o), _, Some(gw)) => (
                Some(gw.name().to_string()),
                Some(gw.name().to_string()),
                Some(o.epoch),
                true,
            ),
            (None, Some(o), _) => (Some(o.gateway.clone()), Some(o.name.clone()), Some(o.epoch), false),
            _ => (None, None, None, false),
        };
        Some(RadosPoolView {
            rados_pool: p.placement.rados_pool.clone(),
            owner,
            owner_name,
            epoch,
            here,
            client: p.owned.as_ref().and_then(|o| o.client_address()),
            takeovers: p.takeovers,
            failed_takes: p.failed_takes,
        })
    }
}

/// What [`Daemon::give_up`] gives up, and how the pool's ports say so.
struct GivingUp<'a> {
    gw: &'a crate::rados_pools::Membership,
    name: &'a str,
    epoch: i64,
    ports: &'a Arc<PoolPorts>,
    /// The records of the standby LUNs to present; None when they could not be read (the
    /// next tick presents them).
    units: Option<Vec<(String, StandbyUnit)>>,
    access: (AccessState, Option<String>),
    /// Why the pool is listed as unavailable here meanwhile.
    why: String,
    /// The gateway it is handed over to, which alone may take it until this one takes it
    /// back; None when any gateway may.
    to: Option<&'a str>,
}

/// Gives pool `name`, owned here at `epoch`, up in etcd: for gateway `to` alone to take for
/// a while, if it is handed over. False when a handoff was not made (the pool was not owned
/// here at that epoch).
fn release(gw: &crate::rados_pools::Membership, name: &str, epoch: i64, to: Option<&str>) -> Result<bool, String> {
    match to {
        Some(to) => gw.release_to(name, epoch, to, HANDOFF_BARS_FOR),
        None => gw.release(name, epoch).map(|()| true),
    }
}

/// The record of vdisk `vd` ("pool/name") among `units`.
fn unit_of(units: &[(String, StandbyUnit)], vd: &str) -> Option<StandbyUnit> {
    units.iter().find(|(v, _)| v == vd).map(|(_, u)| u.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lasting_failures_wait_longer_each_time_and_passing_ones_a_tick() {
        let (wait, streak) = next_retry(Duration::ZERO, true, RETRY_MOST);
        assert_eq!((wait, streak), (RETRY_FIRST, RETRY_FIRST));
        // A passing failure within a streak waits a tick and leaves the streak's wait.
        let (wait, streak) = next_retry(streak, false, RETRY_MOST);
        assert_eq!((wait, streak), (RETRY_PASSING, RETRY_FIRST));
        let (wait, mut streak) = next_retry(streak, true, RETRY_MOST);
        assert_eq!(wait, RETRY_FIRST * 2);
        for _ in 0..10 {
            streak = next_retry(streak, true, RETRY_MOST).1;
        }
        assert_eq!(streak, RETRY_MOST);
        // Openings that fail after their taking fenced a connection off: tried as other
        // lasting failures for ten of them (a few minutes), then up to every 10 minutes,
        // about 160 of them a day rather than 2,880.
        let (mut streak, mut waited, mut tries) = (Duration::ZERO, Duration::ZERO, 0);
        while waited < Duration::from_secs(86_400) {
            tries += 1;
            streak = next_retry(streak, true, retry_most(tries)).1;
            match tries {
                ..=10 => assert!(streak <= RETRY_MOST, "{streak:?} after {tries} failed openings"),
                11 => assert!(streak > RETRY_MOST, "{streak:?} after {tries} failed openings"),
                _ => {}
            }
            waited += streak;
        }
        assert_eq!(streak, Duration::from_secs(600));
        assert!(tries <= 170, "{tries} tries a day");
        // Passing failures alone never lengthen the wait.
        let mut streak = Duration::ZERO;
        for _ in 0..10 {
            let (wait, next) = next_retry(streak, false, RETRY_MOST);
            assert_eq!(wait, RETRY_PASSING);
            streak = next;
        }
        assert_eq!(streak, Duration::ZERO);
    }
}
