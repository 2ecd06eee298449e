//! What a gateway presents of a pool on RADOS that another gateway owns: each configured LUN
//! of it as a standby port (implicit ALUA), so that a host with a path to every gateway sees
//! one logical unit (the same NAA id everywhere) through several target port groups, uses
//! the owner's (active/optimized), and finds the other path ready when the owner dies.
//!
//! A gateway's target port group and relative port are numbered from its name, so that every
//! gateway reports the same numbers for the same gateway without agreeing on a list. A standby
//! LUN answers discovery (INQUIRY, VPD pages, REPORT TARGET PORT GROUPS, REPORT LUNS) and MODE
//! SENSE from the records the owner keeps in the pool's metadata, and refuses everything else
//! with NOT READY, TARGET PORT IN STANDBY STATE (04h/0Bh); reservations and mode settings are
//! the owner's ([`Lun::with_state_at_owner`]). It never takes the pool from a live owner: the
//! gateway takes it as soon as the owner's lease lapsed (etcd tells it), and then presents the
//! real LUN in place of the standby one; the host's next command finds POWER ON OCCURRED and
//! an active/optimized port.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tessera_scsi::{
    AccessState, BackendError, BackendErrorKind, BackendResult, BlockBackend, Extent, FrozenImage, Lun, ModeState,
    OwnerForwarding, PortGroup, PortGroups, PortId, Sense,
};
use tessera_volume::{Provisioning, VdiskConfig};
use tokio::sync::Notify;

/// A host that keeps sending commands to a standby port wakes the gateway's tick at most
/// this often: the tick is what it would have waited for.
const ASKS_TOLD_EVERY: Duration = Duration::from_secs(1);

/// The target port group (and relative target port) of gateway `name`: a 16-bit FNV-1a hash
/// of its name, never 0 (the group of a LUN served by one daemon alone).
pub fn group_of(name: &str) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    match ((h >> 16) ^ (h & 0xFFFF)) as u16 {
        0 => 1,
        g => g,
    }
}

/// The target port groups of a pool's LUNs at this gateway: its own group, active/optimized
/// while it owns the pool and standby while another does; the owner's; and those of the
/// other gateways that present the pool's LUNs (standby).
pub struct PoolPorts {
    me: String,
    state: Mutex<Ports>,
    /// Told when a host first asks for the pool here, so that the gateway asks the owner at
    /// once rather than at its next tick.
    asks: Arc<Notify>,
    /// This gateway's way to the pool's other gateways (set once, by the daemon; none in a
    /// daemon that is no gateway).
    others: std::sync::OnceLock<OtherGateways>,
    /// Whether the lease the pool is owned under here holds, while it is: past it, another
    /// gateway may own the pool, and this one's ports are transitioning whatever its tick
    /// has made of it yet (a tick busy with another pool's taking may come to it seconds
    /// later), so that no host is answered reservations or port states from what it held.
    lease: Mutex<Option<LeaseCheck>>,
}

/// Whether the lease a pool is owned under surely holds still.
pub type LeaseCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// Sends the unit attentions a logical unit (by its NAA id) raised for initiator ports.
pub type AttentionsOut = Box<dyn Fn(&[u8; 16], &[(PortId, Sense)]) + Send + Sync>;

/// How the pool's logical units here reach its other gateways: its standby LUNs reach the
/// owner for the commands they pass on, and its LUNs, while owned here, send the unit
/// attentions they raise to the standby ports elsewhere.
pub struct OtherGateways {
    pub owner: Arc<dyn OwnerForwarding>,
    pub attentions_out: AttentionsOut,
}

#[derive(Clone)]
struct Ports {
    local: AccessState,
    owner: Option<String>,
    /// Every gateway that says it presents the pool's LUNs (etcd), this one included.
    presenting: Vec<String>,
    /// When a host last sent a command that reads or writes the medium to a standby port
    /// here: it wants the pool served here (its path to the owner may be gone).
    asked: Option<Instant>,
}

impl PoolPorts {
    pub fn new(me: &str, local: AccessState, owner: Option<String>, asks: Arc<Notify>) -> Arc<PoolPorts> {
        Arc::new(PoolPorts {
            me: me.to_string(),
            state: Mutex::new(Ports {
                local,
                owner,
                presenting: Vec::new(),
                asked: None,
            }),
            asks,
            others: std::sync::OnceLock::new(),
            lease: Mutex::new(None),
        })
    }

    /// Records that the pool is owned here under the lease `holds` tells of: its ports are
    /// active only while that lease holds.
    pub fn owned_under(&self, holds: LeaseCheck) {
        *self.lease.lock() = Some(holds);
    }

    /// This gateway's state `local` as hosts are told it: transitioning once the lease the
    /// pool is owned under may have lapsed.
    fn as_told(&self, local: AccessState) -> AccessState {
        match local.active() && self.lease.lock().as_ref().is_some_and(|holds| !holds()) {
            true => AccessState::Transitioning,
            false => local,
        }
    }

    /// Connects the pool's logical units here to its other gateways through `others`.
    pub fn connect(&self, others: OtherGateways) {
        let _ = self.others.set(others);
    }

    /// Records this gateway's state and the owner; true if either changed.
    pub fn set(&self, local: AccessState, owner: Option<String>) -> bool {
        let mut s = self.state.lock();
        let changed = s.local != local || s.owner != owner;
        s.local = local;
        s.owner = owner;
        if local.active() {
            s.asked = None;
        }
        changed
    }

    /// Whether a host sent a command for the medium to a standby port here within `window`.
    pub fn asked_within(&self, window: Duration) -> bool {
        self.state.lock().asked.is_some_and(|t| t.elapsed() < window)
    }

    /// Records the gateways that present the pool's LUNs now. Returns the pairs among them
    /// and this gateway whose names give the same target port group, when the list changed:
    /// hosts would see one group for the two, and could not tell the owner's (one of them
    /// must be renamed).
    pub fn set_presenting(&self, gateways: Vec<String>) -> Vec<(String, String)> {
        let mut s = self.state.lock();
        if s.presenting == gateways {
            return Vec::new();
        }
        let mut names: Vec<&String> = gateways.iter().filter(|g| **g != self.me).collect();
        names.insert(0, &self.me);
        let mut collide = Vec::new();
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                if group_of(a) == group_of(b) {
                    collide.push((a.to_string(), b.to_string()));
                }
            }
        }
        s.presenting = gateways;
        collide
    }
}

impl PortGroups for PoolPorts {
    fn attentions_raised(&self, naa: &[u8; 16], notices: &[(PortId, Sense)]) {
        if let Some(o) = self.others.get() {
            (o.attentions_out)(naa, notices);
        }
    }

    fn groups(&self) -> Vec<PortGroup> {
        let Ports {
            local,
            owner,
            presenting,
            ..
        } = self.state.lock().clone();
        let local = self.as_told(local);
        let mine = group_of(&self.me);
        let mut groups = vec![PortGroup {
            id: mine,
            state: local,
            preferred: local.active(),
            ports: vec![mine],
        }];
        // The owner first, so that a name whose group collides with another's reports it
        // active.
        let others = owner.iter().chain(presenting.iter()).filter(|g| **g != self.me);
        for g in others {
            let id = group_of(g);
            if groups.iter().any(|x| x.id == id) {
                continue;
            }
            let active = owner.as_deref() == Some(g.as_str());
            groups.push(PortGroup {
                id,
                state: if active {
                    AccessState::ActiveOptimized
                } else {
                    AccessState::Standby
                },
                preferred: active,
                ports: vec![id],
            });
        }
        groups.sort_by_key(|g| g.id);
        groups
    }

    fn local(&self) -> (u16, u16) {
        let g = group_of(&self.me);
        (g, g)
    }

    fn local_state(&self) -> AccessState {
        self.as_told(self.state.lock().local)
    }

    /// A pool is never taken from a live owner at once (two hosts preferring different
    /// gateways would make it bounce): the command is refused as at any standby port, and
    /// the gateway asks the owner to hand the pool over (its tick is woken for that, at most
    /// once a second however often hosts retry), which the owner does once no host has used
    /// it for a while (daemon/rados.rs). The gateway takes it without being asked as soon as
    /// the owner's lease lapses.
    fn request_access(&self) -> AccessState {
        let mut s = self.state.lock();
        if s.local == AccessState::Standby {
            let now = Instant::now();
            if s.asked.is_none_or(|t| now.duration_since(t) >= ASKS_TOLD_EVERY) {
                self.asks.notify_one();
            }
            s.asked = Some(now);
        }
        let local = s.local;
        drop(s);
        self.as_told(local)
    }

    fn transition_seconds(&self) -> u8 {
        // The owner's lease, then a second at most to take the pool and fence the old owner.
        15
    }
}

/// The port groups a standby LUN reports: the pool's, except that its own port is never
/// active. When this gateway takes the pool, the pool's groups turn active before the
/// standby LUN is out of every path's hands; a command that reaches it then is told the
/// port is transitioning (and sent again, to the real LUN), never let through to a backend
/// with no data.
struct StandbyPorts(Arc<PoolPorts>);

fn never_active(s: AccessState) -> AccessState {
    if s.active() {
        AccessState::Transitioning
    } else {
        s
    }
}

impl PortGroups for StandbyPorts {
    fn groups(&self) -> Vec<PortGroup> {
        let mine = self.0.local().0;
        let mut groups = self.0.groups();
        for g in groups.iter_mut().filter(|g| g.id == mine) {
            g.state = never_active(g.state);
            g.preferred = false;
        }
        groups
    }

    fn local(&self) -> (u16, u16) {
        self.0.local()
    }

    fn local_state(&self) -> AccessState {
        never_active(self.0.local_state())
    }

    fn request_access(&self) -> AccessState {
        never_active(self.0.request_access())
    }

    fn transition_seconds(&self) -> u8 {
        self.0.transition_seconds()
    }
}

/// The block backend of a standby LUN: the vdisk's geometry as its record says (read again
/// every tick: the owner may resize it), and no data (the port's state keeps every command
/// that would reach it away); beside it, the logical unit's id the LUN was made with.
struct StandbyBackend(RwLock<VdiskConfig>, u128);

fn not_here(c: &VdiskConfig) -> BackendError {
    BackendError::new(
        BackendErrorKind::Internal,
        format!("vdisk {} is served by the gateway that owns its pool, not here", c.name),
    )
}

impl BlockBackend for StandbyBackend {
    fn name(&self) -> String {
        self.0.read().name.clone()
    }
    fn size(&self) -> u64 {
        self.0.read().size
    }
    fn block_size(&self) -> u32 {
        self.0.read().block_size
    }
    fn physical_block_size(&self) -> u32 {
        self.0.read().physical_block_size
    }
    fn grain_size(&self) -> u64 {
        self.0.read().grain_size
    }
    fn thin(&self) -> bool {
        self.0.read().provisioning == Provisioning::Thin
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn read(&self, _: u64, _: &mut [u8]) -> BackendResult<()> {
        Err(not_here(&self.0.read()))
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> BackendResult<()> {
        Err(not_here(&self.0.read()))
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> BackendResult<()> {
        Err(not_here(&self.0.read()))
    }
    fn trim(&self, _: u64, _: u64) -> BackendResult<()> {
        Err(not_here(&self.0.read()))
    }
    fn flush(&self) -> BackendResult<()> {
        Err(not_here(&self.0.read()))
    }
    fn extents(&self, _: u64, _: u64) -> BackendResult<Vec<Extent>> {
        Err(not_here(&self.0.read()))
    }
    fn freeze(&self, _: &[(u64, u64)]) -> BackendResult<Box<dyn FrozenImage>> {
        Err(not_here(&self.0.read()))
    }
    /// Nothing: no image is made here, and the refusal says why.
    fn freeze_footprint(&self, _: &[(u64, u64)]) -> u64 {
        0
    }
}

/// What a gateway knows of a vdisk of a pool it does not own, from the pool's metadata.
#[derive(Clone, Debug)]
pub struct StandbyUnit {
    pub uid: u128,
    pub config: VdiskConfig,
    /// The mode settings the owner keeps for the LUN, for MODE SENSE.
    pub mode: Option<ModeState>,
}

/// The standby LUN of `unit` behind `ports`; the persistent reservation and MODE SELECT
/// commands it receives run at the owner when `ports` reach the other gateways (refused
/// otherwise).
pub fn standby_lun(unit: &StandbyUnit, ports: Arc<PoolPorts>) -> Lun {
    let read_only = unit.config.snapshot_of.is_some();
    let owner = ports.others.get().map(|o| o.owner.clone());
    let lun = Lun::new(
        Arc::new(StandbyBackend(RwLock::new(unit.config.clone()), unit.uid)),
        unit.uid,
        read_only,
    )
    .with_port_groups(Arc::new(StandbyPorts(ports)))
    .with_state_at_owner()
    .with_mode(unit.mode.unwrap_or_default());
    match owner {
        Some(f) => lun.with_owner_forwarding(f),
        None => lun,
    }
}

/// Whether `lun` is a standby LUN (its pool served by another gateway).
pub fn is_standby(lun: &Lun) -> bool {
    lun.backend().as_any().is::<StandbyBackend>()
}

/// Brings standby LUN `lun` up to date with what the owner now records of its vdisk: a new
/// size (CAPACITY DATA HAS CHANGED for every host) and new mode settings (MODE PARAMETERS
/// CHANGED), as the owner's own hosts were told. False if `lun` is not a standby LUN of that
/// very logical unit: a vdisk deleted and made again under its name is another (another id,
/// maybe read-only where the first was not), whose standby LUN replaces this one.
pub fn refresh_standby(lun: &Lun, unit: &StandbyUnit) -> bool {
    let Some(backend) = lun.backend().as_any().downcast_ref::<StandbyBackend>() else {
        return false;
    };
    if backend.1 != unit.uid || backend.0.read().snapshot_of.is_some() != unit.config.snapshot_of.is_some() {
        return false;
    }
    let resized = {
        let mut config = backend.0.write();
        let resized = config.size != unit.config.size;
        *config = unit.config.clone();
        resized
    };
    if resized {
        lun.capacity_changed();
    }
    lun.mode_changed_elsewhere(unit.mode.unwrap_or_default());
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tessera_layout::{LayoutKind, LayoutSpec};
    use tessera_scsi::{ModeState, Nexus};
    use tessera_volume::VdiskState;

    pub(crate) fn unit(size: u64, mode: Option<ModeState>) -> StandbyUnit {
        StandbyUnit {
            uid: 0x1234,
            config: VdiskConfig {
                id: 7,
                name: "vm".into(),
                size,
                block_size: 512,
                physical_block_size: 4096,
                grain_size: 64 << 10,
                layout: LayoutSpec::with_defaults(LayoutKind::Simple, None, None, None, 1),
                provisioning: Provisioning::Thin,
                state: VdiskState::Online,
                snapshot_of: None,
                created: 0,
                write_cache_size: None,
            },
            mode,
        }
    }

    /// Sense key, ASC and ASCQ of a CHECK CONDITION (fixed format), None for GOOD.
    fn sense_of(r: &tessera_scsi::Response) -> Option<(u8, u8, u8)> {
        (r.status == 2).then(|| (r.sense[2] & 0x0F, r.sense[12], r.sense[13]))
    }

    #[test]
    fn a_standby_lun_follows_what_the_owner_records() {
        let ports = PoolPorts::new("gw-b", AccessState::Standby, Some("gw-a".into()), Arc::default());
        let lun = standby_lun(&unit(1 << 30, None), ports);
        let host = Nexus::new(1, "iqn.2026-01.test:host", [0x40, 0, 0, 0, 0, 1]);
        let tur = [0u8; 6];
        let mode_sense = [0x1A, 0x08, 0x08, 0, 0xFF, 0];
        assert_eq!(
            sense_of(&lun.execute_for(&host, &tur, &[])),
            Some((2, 0x04, 0x0B)),
            "standby"
        );
        // Nothing changed at the owner: nothing to tell.
        assert!(refresh_standby(&lun, &unit(1 << 30, None)));
        assert_eq!(sense_of(&lun.execute_for(&host, &mode_sense, &[])), None);
        // The owner grew the vdisk and a host turned its write cache off there.
        let off = ModeState {
            wce: false,
            ..ModeState::default()
        };
        assert!(refresh_standby(&lun, &unit(2 << 30, Some(off))));
        assert_eq!(lun.backend().size(), 2 << 30);
        assert_eq!(lun.mode(), off);
        let told: Vec<_> = (0..2)
            .map(|_| sense_of(&lun.execute_for(&host, &mode_sense, &[])).expect("a unit attention"))
            .collect();
        assert!(told.contains(&(6, 0x2A, 0x09)), "CAPACITY DATA HAS CHANGED: {told:?}");
        assert!(told.contains(&(6, 0x2A, 0x01)), "MODE PARAMETERS CHANGED: {told:?}");
        let page = lun.execute_for(&host, &mode_sense, &[]);
        assert_eq!(sense_of(&page), None);
        assert_eq!(page.data.to_vec()[4 + 2] & 0x04, 0, "WCE off in the caching page");
    }

    #[test]
    fn gateways_have_groups_of_their_own_and_report_the_owners() {
        assert_ne!(group_of("gw-a"), group_of("gw-b"));
        assert_eq!(group_of("gw-a"), group_of("gw-a"));
        assert!(["", "a", "gw-a", "gateway-with-a-long-name"]
            .iter()
            .all(|n| group_of(n) != 0));
        let p = PoolPorts::new("gw-b", AccessState::Standby, Some("gw-a".into()), Arc::default());
        let standby = StandbyPorts(p.clone());
        assert_eq!(standby.local_state(), AccessState::Standby);
        let g = p.groups();
        assert_eq!(g.len(), 2);
        let a = g.iter().find(|g| g.id == group_of("gw-a")).unwrap();
        let b = g.iter().find(|g| g.id == group_of("gw-b")).unwrap();
        assert_eq!((a.state, b.state), (AccessState::ActiveOptimized, AccessState::Standby));
        assert_eq!(p.local(), (group_of("gw-b"), group_of("gw-b")));
        assert!(!p.asked_within(Duration::from_secs(10)));
        assert_eq!(
            p.request_access(),
            AccessState::Standby,
            "never taken from a live owner at once"
        );
        assert!(p.asked_within(Duration::from_secs(10)), "but asked for");
        assert!(p.set(AccessState::ActiveOptimized, Some("gw-b".into())));
        assert!(!p.set(AccessState::ActiveOptimized, Some("gw-b".into())));
        assert!(!p.asked_within(Duration::from_secs(10)), "served here now");
        // A standby LUN left behind by the taking never lets the medium through.
        assert_eq!(standby.local_state(), AccessState::Transitioning);
        assert_eq!(standby.request_access(), AccessState::Transitioning);
        assert_eq!(standby.groups()[0].state, AccessState::Transitioning);
        let g = p.groups();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].state, AccessState::ActiveOptimized);
        // The other gateways that present the pool are standby groups of the owner's LUNs.
        p.set_presenting(vec!["gw-a".into(), "gw-b".into(), "gw-c".into()]);
        let g = p.groups();
        assert_eq!(g.len(), 3);
        for (name, state) in [
            ("gw-a", AccessState::Standby),
            ("gw-b", AccessState::ActiveOptimized),
            ("gw-c", AccessState::Standby),
        ] {
            let found = g.iter().find(|x| x.id == group_of(name)).unwrap();
            assert_eq!((found.state, found.preferred), (state, state.active()), "{name}");
        }
    }

    /// An owner whose lease may have lapsed (it stalled, and another gateway may own the
    /// pool now) answers no reservation, and reports its port transitioning, before its tick
    /// has given the pool up: until 2026-12-06 it answered PERSISTENT RESERVE IN from what it
    /// held, and REPORT TARGET PORT GROUPS named it active, for as long as its tick was busy.
    #[test]
    fn an_owner_whose_lease_lapsed_answers_no_reservation_from_what_it_held() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let p = PoolPorts::new(
            "gw-a",
            AccessState::ActiveOptimized,
            Some("gw-a".into()),
            Arc::default(),
        );
        let holds = Arc::new(AtomicBool::new(true));
        p.owned_under({
            let holds = holds.clone();
            Arc::new(move || holds.load(Ordering::Relaxed))
        });
        let lun = Lun::new(Arc::new(tessera_scsi::RamBackend::new("ram", 1 << 20, 512)), 9, false)
            .with_port_groups(p.clone());
        let host = Nexus::new(1, "iqn.2026-01.test:host", [0x40, 0, 0, 0, 0, 1]);
        let read_keys = [0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
        let rtpg = [0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0];
        // Its first command finds what a new nexus is owed.
        let _ = lun.execute_for(&host, &read_keys, &[]);
        assert_eq!(sense_of(&lun.execute_for(&host, &read_keys, &[])), None);
        holds.store(false, Ordering::Relaxed);
        assert_eq!(
            sense_of(&lun.execute_for(&host, &read_keys, &[])),
            Some((2, 0x04, 0x0A)),
            "answered from what it held"
        );
        assert_eq!(p.local_state(), AccessState::Transitioning);
        assert_eq!(p.request_access(), AccessState::Transitioning);
        assert_eq!(p.groups()[0].state, AccessState::Transitioning);
        assert!(!p.groups()[0].preferred);
        let report = lun.execute_for(&host, &rtpg, &[]);
        assert_eq!(sense_of(&report), None);
        assert_eq!(report.data.to_vec()[4] & 0x0F, 0xF, "its group reported transitioning");
        // Taken again under a lease that holds: served.
        holds.store(true, Ordering::Relaxed);
        assert_eq!(sense_of(&lun.execute_for(&host, &read_keys, &[])), None);
        // Standby, it answers reservations through the owner whatever its old lease says.
        holds.store(false, Ordering::Relaxed);
        p.set(AccessState::Standby, Some("gw-b".into()));
        assert_eq!(p.local_state(), AccessState::Standby);
    }

    #[test]
    fn gateways_whose_names_give_one_port_group_are_told_once() {
        // Two names with the same 16-bit group, found by search.
        let (a, b) = (0..100_000)
            .map(|i| format!("gw-{i}"))
            .scan(std::collections::HashMap::new(), |seen, n| {
                Some(seen.insert(group_of(&n), n.clone()).map(|first| (first, n)))
            })
            .flatten()
            .next()
            .unwrap();
        assert_eq!(group_of(&a), group_of(&b));
        let p = PoolPorts::new(&a, AccessState::Standby, Some("gw-a".into()), Arc::default());
        assert!(p.set_presenting(vec!["gw-a".into(), a.clone()]).is_empty());
        assert_eq!(
            p.set_presenting(vec!["gw-a".into(), a.clone(), b.clone()]),
            vec![(a.clone(), b.clone())]
        );
        assert!(
            p.set_presenting(vec!["gw-a".into(), a.clone(), b.clone()]).is_empty(),
            "told again while nothing changed"
        );
    }

    #[test]
    fn a_host_asking_at_a_standby_port_wakes_the_gateway_once_not_at_every_retry() {
        use futures_util::FutureExt;
        let asks = Arc::new(Notify::new());
        let told = || asks.notified().now_or_never().is_some();
        let p = PoolPorts::new("gw-b", AccessState::Standby, Some("gw-a".into()), asks.clone());
        assert!(!told());
        assert_eq!(p.request_access(), AccessState::Standby);
        assert!(told(), "the first ask wakes the gateway");
        for _ in 0..100 {
            assert_eq!(p.request_access(), AccessState::Standby);
        }
        assert!(!told(), "a host retrying at once wakes nothing more");
        // An ask a while after the last one wakes it again.
        p.state.lock().asked = Some(Instant::now() - ASKS_TOLD_EVERY);
        p.request_access();
        assert!(told());
        // Served here: asking is moot.
        p.set(AccessState::ActiveOptimized, Some("gw-b".into()));
        assert_eq!(p.request_access(), AccessState::ActiveOptimized);
        assert!(!told());
    }
}
