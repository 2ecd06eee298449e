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
//! gateway takes it once the owner's lease lapsed (at its next tick), and then presents the
//! real LUN in place of the standby one; the host's next command finds POWER ON OCCURRED and
//! an active/optimized port.

use std::any::Any;
use std::sync::Arc;

use parking_lot::Mutex;
use tessera_scsi::{
    AccessState, BackendError, BackendErrorKind, BackendResult, BlockBackend, Extent, FrozenImage, Lun, ModeState,
    PortGroup, PortGroups,
};
use tessera_volume::{Provisioning, VdiskConfig};

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
}

#[derive(Clone)]
struct Ports {
    local: AccessState,
    owner: Option<String>,
    /// Every gateway that says it presents the pool's LUNs (etcd), this one included.
    presenting: Vec<String>,
}

impl PoolPorts {
    pub fn new(me: &str, local: AccessState, owner: Option<String>) -> Arc<PoolPorts> {
        Arc::new(PoolPorts {
            me: me.to_string(),
            state: Mutex::new(Ports {
                local,
                owner,
                presenting: Vec::new(),
            }),
        })
    }

    /// Records this gateway's state and the owner; true if either changed.
    pub fn set(&self, local: AccessState, owner: Option<String>) -> bool {
        let mut s = self.state.lock();
        let changed = s.local != local || s.owner != owner;
        s.local = local;
        s.owner = owner;
        changed
    }

    /// Records the gateways that present the pool's LUNs now.
    pub fn set_presenting(&self, gateways: Vec<String>) {
        self.state.lock().presenting = gateways;
    }
}

impl PortGroups for PoolPorts {
    fn groups(&self) -> Vec<PortGroup> {
        let Ports {
            local,
            owner,
            presenting,
        } = self.state.lock().clone();
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
        self.state.lock().local
    }

    /// A pool is never taken from a live owner (two hosts preferring different gateways
    /// would make it bounce); the gateway takes it within a second of the owner's lease
    /// lapsing, without being asked.
    fn request_access(&self) -> AccessState {
        self.local_state()
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

/// The block backend of a standby LUN: the vdisk's geometry as its record says, and no data
/// (the port's state keeps every command that would reach it away).
struct StandbyBackend(VdiskConfig);

fn not_here(c: &VdiskConfig) -> BackendError {
    BackendError::new(
        BackendErrorKind::Internal,
        format!("vdisk {} is served by the gateway that owns its pool, not here", c.name),
    )
}

impl BlockBackend for StandbyBackend {
    fn name(&self) -> String {
        self.0.name.clone()
    }
    fn size(&self) -> u64 {
        self.0.size
    }
    fn block_size(&self) -> u32 {
        self.0.block_size
    }
    fn physical_block_size(&self) -> u32 {
        self.0.physical_block_size
    }
    fn grain_size(&self) -> u64 {
        self.0.grain_size
    }
    fn thin(&self) -> bool {
        self.0.provisioning == Provisioning::Thin
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn read(&self, _: u64, _: &mut [u8]) -> BackendResult<()> {
        Err(not_here(&self.0))
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> BackendResult<()> {
        Err(not_here(&self.0))
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> BackendResult<()> {
        Err(not_here(&self.0))
    }
    fn trim(&self, _: u64, _: u64) -> BackendResult<()> {
        Err(not_here(&self.0))
    }
    fn flush(&self) -> BackendResult<()> {
        Err(not_here(&self.0))
    }
    fn extents(&self, _: u64, _: u64) -> BackendResult<Vec<Extent>> {
        Err(not_here(&self.0))
    }
    fn freeze(&self, _: &[(u64, u64)]) -> BackendResult<Box<dyn FrozenImage>> {
        Err(not_here(&self.0))
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

/// The standby LUN of `unit` behind `ports`.
pub fn standby_lun(unit: &StandbyUnit, ports: Arc<PoolPorts>) -> Lun {
    let read_only = unit.config.snapshot_of.is_some();
    Lun::new(Arc::new(StandbyBackend(unit.config.clone())), unit.uid, read_only)
        .with_port_groups(Arc::new(StandbyPorts(ports)))
        .with_state_at_owner()
        .with_mode(unit.mode.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways_have_groups_of_their_own_and_report_the_owners() {
        assert_ne!(group_of("gw-a"), group_of("gw-b"));
        assert_eq!(group_of("gw-a"), group_of("gw-a"));
        assert!(["", "a", "gw-a", "gateway-with-a-long-name"]
            .iter()
            .all(|n| group_of(n) != 0));
        let p = PoolPorts::new("gw-b", AccessState::Standby, Some("gw-a".into()));
        let standby = StandbyPorts(p.clone());
        assert_eq!(standby.local_state(), AccessState::Standby);
        let g = p.groups();
        assert_eq!(g.len(), 2);
        let a = g.iter().find(|g| g.id == group_of("gw-a")).unwrap();
        let b = g.iter().find(|g| g.id == group_of("gw-b")).unwrap();
        assert_eq!((a.state, b.state), (AccessState::ActiveOptimized, AccessState::Standby));
        assert_eq!(p.local(), (group_of("gw-b"), group_of("gw-b")));
        assert_eq!(
            p.request_access(),
            AccessState::Standby,
            "never taken from a live owner"
        );
        assert!(p.set(AccessState::ActiveOptimized, Some("gw-b".into())));
        assert!(!p.set(AccessState::ActiveOptimized, Some("gw-b".into())));
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
}
