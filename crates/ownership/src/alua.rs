//! Ownership as a host sees it through ALUA: each gateway presenting a vdisk is a target port
//! group of its own (gateway k of the list is group k + 1, with relative target port k + 1);
//! the owner's group is active/optimized, the others standby.
//!
//! The owner is kept current by an etcd watch on the vdisk's key, so the state SCSI asks for
//! on every command is a memory read. A command that needs the medium at a standby gateway
//! asks for the vdisk (implicit ALUA, as tcmu-runner does): the gateway takes it only if
//! nobody owns it, that is once the owner gave it up or its lease expired. A vdisk is never
//! taken from a live owner, so two hosts that prefer different gateways cannot make the vdisk
//! bounce between them; the cost is that a host cut off from a live owner waits for an
//! administrator to move the vdisk (`Gateway::release` on the owner).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use etcd_client::{Client, EventType};
use tessera_scsi::{AccessState, PortGroup, PortGroups};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::{owner_of, Gateway, Owner, OwnershipError, Result};

/// Fences the previous owner off before this gateway serves the vdisk: given the address the
/// previous owner recorded (none for the first owner, or when it was this gateway), true once
/// it can no longer write.
pub type Fencer = Box<dyn Fn(Option<&str>) -> bool + Send + Sync>;

/// Told when this gateway's access state for the vdisk changed (to raise ASYMMETRIC ACCESS
/// STATE CHANGED on the LUN).
pub type OnChange = Box<dyn Fn(AccessState) + Send + Sync>;

/// The owner as last seen: None before the first read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Unknown,
    Free,
    Owned(Owner),
}

struct Shared {
    seen: Mutex<Seen>,
    me: String,
    /// This run's lease: an owner of this name under another lease is an earlier run.
    lease: i64,
    lease_lost: AtomicBool,
    /// A taking under way: its key may be put (and seen) before the previous owner is fenced
    /// off, and this gateway must not report itself active until it is.
    taking: AtomicUsize,
    /// The epoch a taking of this run returned, its previous owner fenced off (0: none): a
    /// key of this run at another epoch (a taking that failed, whose key etcd kept) is not
    /// served.
    fenced_at: AtomicI64,
    on_change: Option<OnChange>,
}

impl Shared {
    /// Whether `o` is a key of this run: this gateway's name under this run's lease.
    fn is_mine(&self, o: &Owner) -> bool {
        o.gateway == self.me && o.lease == self.lease
    }

    fn state(&self) -> AccessState {
        match &*self.seen.lock().expect("not poisoned") {
            Seen::Unknown => AccessState::Transitioning,
            Seen::Owned(o) if self.is_mine(o) => {
                if self.lease_lost.load(Ordering::SeqCst) {
                    // What it owned may be another's by now: serve nothing.
                    AccessState::Unavailable
                } else if self.taking.load(Ordering::SeqCst) > 0 || self.fenced_at.load(Ordering::SeqCst) != o.epoch {
                    AccessState::Transitioning
                } else {
                    AccessState::ActiveOptimized
                }
            }
            _ => AccessState::Standby,
        }
    }

    /// Whether etcd holds a key of this run for the vdisk that no taking under way or done
    /// fenced behind (a taking failed, and its key stayed): taken again, it is given up and
    /// taken afresh, the previous owner fenced off.
    fn unfenced_key(&self) -> bool {
        let seen = self.seen.lock().expect("not poisoned");
        matches!(&*seen, Seen::Owned(o) if self.is_mine(o) && o.epoch != self.fenced_at.load(Ordering::SeqCst))
            && self.taking.load(Ordering::SeqCst) == 0
            && !self.lease_lost.load(Ordering::SeqCst)
    }

    /// The gateway's lease is gone, or may be: nothing it owned is its own any more.
    fn lose_lease(&self) {
        let before = self.state();
        if !self.lease_lost.swap(true, Ordering::SeqCst) {
            self.changed(before);
        }
    }

    fn changed(&self, before: AccessState) {
        let after = self.state();
        if before != after {
            if let Some(f) = &self.on_change {
                f(after);
            }
        }
    }

    fn set(&self, seen: Seen) {
        let before = self.state();
        *self.seen.lock().expect("not poisoned") = seen;
        self.changed(before);
    }
}

/// One vdisk's target port groups at this gateway.
pub struct VdiskPorts {
    vdisk: String,
    gateways: Vec<String>,
    me: usize,
    gateway: Arc<tokio::sync::Mutex<Gateway>>,
    fence_address: String,
    fencer: Fencer,
    rt: Handle,
    shared: Arc<Shared>,
    watcher: JoinHandle<()>,
}

impl VdiskPorts {
    /// Starts following the ownership of `vdisk` for gateway `gateway` (whose name must be in
    /// `gateways`, the gateways presenting the vdisk, in group order). `fence_address` is
    /// this gateway's client address in the storage, recorded when it takes the vdisk so that
    /// the next owner can fence it; `fencer` fences the previous owner's. Call from outside
    /// the runtime `rt`; commands call the [`PortGroups`] methods from their own threads.
    pub fn start(
        rt: Handle,
        gateway: Arc<tokio::sync::Mutex<Gateway>>,
        gateways: Vec<String>,
        vdisk: &str,
        fence_address: &str,
        fencer: Fencer,
        on_change: Option<OnChange>,
    ) -> Result<VdiskPorts> {
        let (me, lease, client, key) = rt.block_on(async {
            let g = gateway.lock().await;
            (g.name().to_string(), g.lease(), g.client.clone(), g.key(vdisk))
        });
        let index = gateways.iter().position(|g| *g == me).ok_or_else(|| {
            OwnershipError::new(format!(
                "gateway {me} is not among the gateways of {vdisk}: {gateways:?}"
            ))
        })?;
        if gateways.len() > u16::MAX as usize - 1 {
            return Err(OwnershipError::new(format!(
                "{} gateways are more than ALUA can number",
                gateways.len()
            )));
        }
        let shared = Arc::new(Shared {
            seen: Mutex::new(Seen::Unknown),
            me,
            lease,
            lease_lost: AtomicBool::new(false),
            taking: AtomicUsize::new(0),
            fenced_at: AtomicI64::new(0),
            on_change,
        });
        let watcher = rt.block_on(follow(client, key, shared.clone(), gateway.clone()))?;
        Ok(VdiskPorts {
            vdisk: vdisk.to_string(),
            gateways,
            me: index,
            gateway,
            fence_address: fence_address.to_string(),
            fencer,
            rt,
            shared,
            watcher,
        })
    }

    /// Takes the vdisk if nobody owns it, fencing the previous owner off first
    /// (`Gateway::take_fenced`).
    fn take(&self) -> Result<AccessState> {
        // Counted: two commands may take at once, and one failing must not make the
        // other's key look fenced.
        self.shared.taking.fetch_add(1, Ordering::SeqCst);
        let taken = self.rt.block_on(async {
            let mut g = self.gateway.lock().await;
            // Taken by another command while this one waited for the gateway: taking it
            // again would give it up and take it afresh, a moment in which another gateway
            // could take it.
            let fenced_at = self.shared.fenced_at.load(Ordering::SeqCst);
            if fenced_at != 0 {
                if let Some(o) = g
                    .owner(&self.vdisk)
                    .await?
                    .filter(|o| g.holds(o) && o.epoch == fenced_at)
                {
                    return Ok(o);
                }
            }
            let taken = g
                .take_fenced(&self.vdisk, &self.fence_address, TAKING_CALL_AT_MOST, |previous| {
                    let fenced = if previous.is_empty() {
                        (self.fencer)(None)
                    } else {
                        previous.iter().all(|a| (self.fencer)(Some(a)))
                    };
                    if fenced {
                        Ok(())
                    } else {
                        Err(crate::FenceError::lasting("the fencer refused"))
                    }
                })
                .await;
            // Before the gateway is let go: a command waiting for it finds the vdisk taken.
            // (`state` says transitioning until this taking is counted out, below.)
            if let Ok(o) = &taken {
                self.shared.fenced_at.store(o.epoch, Ordering::SeqCst);
            }
            taken
        });
        // The state reported while it ran (transitioning, once the key was seen) is the
        // one to tell a change from.
        let before = self.shared.state();
        {
            // Under the lock `state` reads both under: no command sees the taking ended
            // and a failed one's key as this gateway's.
            let mut seen = self.shared.seen.lock().expect("not poisoned");
            self.shared.taking.fetch_sub(1, Ordering::SeqCst);
            match &taken {
                Ok(owner) => *seen = Seen::Owned(owner.clone()),
                // Failed, the key it put was given back: not this gateway's, whatever the
                // watch saw of it meanwhile (what it sees of another's since stands).
                Err(_) => {
                    if matches!(&*seen, Seen::Owned(o) if self.shared.is_mine(o)) {
                        *seen = Seen::Free;
                    }
                }
            }
        }
        let taken = taken.map(|_| ());
        self.shared.changed(before);
        taken.map(|()| self.shared.state())
    }

    /// The owner as last seen, if any.
    pub fn owner(&self) -> Option<Owner> {
        match &*self.shared.seen.lock().expect("not poisoned") {
            Seen::Owned(o) => Some(o.clone()),
            _ => None,
        }
    }
}

impl Drop for VdiskPorts {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// Reads the owner, then follows every change of the key (and the gateway's own lease) until
/// aborted. A watch that ends (etcd restarted, a member died) leaves the state unknown
/// (transitioning) until the owner is read and watched again, tried every `REWATCH`.
async fn follow(
    client: Client,
    key: String,
    shared: Arc<Shared>,
    gateway: Arc<tokio::sync::Mutex<Gateway>>,
) -> Result<JoinHandle<()>> {
    let first = watch_from_now(client.clone(), &key, &shared).await?;
    Ok(tokio::spawn(async move {
        let mut watching = Some(first);
        let mut lease = tokio::time::interval(std::time::Duration::from_millis(200));
        let mut rewatch = tokio::time::interval(REWATCH);
        loop {
            tokio::select! {
                msg = async {
                    match watching.as_mut() {
                        Some((w, _)) => w.next(crate::watching::FOLLOWING).await,
                        None => std::future::pending().await,
                    }
                } => match msg {
                    Some(r) if !r.canceled() => {
                        // Those at the read's revision were read (a take since must stand).
                        let after = watching.as_ref().map_or(0, |w| w.1);
                        for e in r.events().iter().filter(|e| e.kv().is_some_and(|kv| kv.mod_revision() > after)) {
                            match e.event_type() {
                                EventType::Put => shared.set(seen_in(e.kv())),
                                EventType::Delete => shared.set(Seen::Free),
                            }
                        }
                    }
                    // The watch ended (or its member stalled): nothing this gateway believes
                    // about the owner holds until it has read it again.
                    _ => {
                        shared.set(Seen::Unknown);
                        watching = None;
                        rewatch.reset();
                    }
                },
                _ = rewatch.tick(), if watching.is_none() => {
                    watching = watch_from_now(client.clone(), &key, &shared).await.ok();
                }
                _ = lease.tick() => {
                    if !gateway.lock().await.alive() {
                        shared.lose_lease();
                    }
                }
            }
        }
    }))
}

/// How soon a watch of the owner that ended is made again.
const REWATCH: std::time::Duration = std::time::Duration::from_millis(500);

/// How long each call to etcd of a taking may go unanswered (a member that stalls answers
/// nothing): the taking then fails, and is tried again by the next command.
const TAKING_CALL_AT_MOST: std::time::Duration = std::time::Duration::from_secs(10);

/// The owner a key's value names; a key without a lease is nobody's (`Gateway::owner`): free,
/// for a taking to delete.
fn seen_in(kv: Option<&etcd_client::KeyValue>) -> Seen {
    kv.filter(|kv| kv.lease() != 0)
        .map(owner_of)
        .map_or(Seen::Free, Seen::Owned)
}

/// Reads the owner of `key` into `shared`, and watches the key from that read's revision
/// (returned: its events there were read, and are passed over).
async fn watch_from_now(mut client: Client, key: &str, shared: &Shared) -> Result<(crate::watching::Watch, i64)> {
    let now = client.get(key, None).await?;
    shared.set(seen_in(now.kvs().first()));
    // From the read's revision, not the one after, which may be ahead of etcd's newest (see
    // `NoticesComing::watch_after_seen`).
    let from = now.header().map(|h| h.revision()).unwrap_or(0);
    let watch = crate::watching::watch(
        &mut client,
        key,
        Some(etcd_client::WatchOptions::new().with_start_revision(from)),
    )
    .await?;
    Ok((watch, from))
}

impl PortGroups for VdiskPorts {
    fn groups(&self) -> Vec<PortGroup> {
        let owner = self.owner().map(|o| o.gateway);
        self.gateways
            .iter()
            .enumerate()
            .map(|(k, name)| {
                let state = if k == self.me {
                    self.shared.state()
                } else if owner.as_deref() == Some(name.as_str()) {
                    AccessState::ActiveOptimized
                } else {
                    AccessState::Standby
                };
                PortGroup {
                    id: k as u16 + 1,
                    state,
                    preferred: state.active(),
                    ports: vec![k as u16 + 1],
                }
            })
            .collect()
    }

    fn local(&self) -> (u16, u16) {
        (self.me as u16 + 1, self.me as u16 + 1)
    }

    fn local_state(&self) -> AccessState {
        self.shared.state()
    }

    fn request_access(&self) -> AccessState {
        let state = self.shared.state();
        if state != AccessState::Standby && !self.shared.unfenced_key() {
            return state;
        }
        self.take().unwrap_or_else(|e| {
            tracing::warn!(vdisk = %self.vdisk, error = %e, "cannot take the vdisk over");
            self.shared.state()
        })
    }

    fn transition_seconds(&self) -> u8 {
        // A takeover waits for etcd and the fencing, a few seconds at most.
        10
    }
}
