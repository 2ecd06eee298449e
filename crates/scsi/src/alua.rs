//! Asymmetric logical unit access (SPC-4 5.16), implicit only: the target port groups a LUN is
//! reached through, the access state of each, and what a port in each state lets through.
//!
//! One daemon serving a LUN alone has one group, always active/optimized ([`SinglePort`]).
//! Several gateways presenting the same vdisk each have a group of their own: the owner's is
//! active/optimized, the others' standby. Who owns the vdisk is decided outside SCSI (a lease
//! in etcd, say); the LUN asks its [`PortGroups`] for the local state on every command and, for
//! a command that needs the medium at a standby port, asks it for access (implicit ALUA: the
//! host chose this path, so the gateway takes the vdisk over, as tcmu-runner does).

use crate::opcodes::*;
use crate::pr::PortId;
use crate::sense::{self, Sense};

/// The asymmetric access state of a target port group (SPC-4 table 64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    /// Between two of the states above; commands that need the medium are retried.
    Transitioning,
}

impl AccessState {
    /// The code REPORT TARGET PORT GROUPS gives it.
    pub fn code(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x0,
            AccessState::ActiveNonOptimized => 0x1,
            AccessState::Standby => 0x2,
            AccessState::Unavailable => 0x3,
            AccessState::Transitioning => 0xF,
        }
    }

    pub fn active(self) -> bool {
        matches!(self, AccessState::ActiveOptimized | AccessState::ActiveNonOptimized)
    }

    pub fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active/optimized",
            AccessState::ActiveNonOptimized => "active/non-optimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
            AccessState::Transitioning => "transitioning",
        }
    }

    /// The sense a port in this state answers a command it does not let through with.
    pub(crate) fn refusal(self) -> Sense {
        match self {
            AccessState::Standby => sense::PORT_IN_STANDBY,
            AccessState::Unavailable => sense::PORT_UNAVAILABLE,
            _ => sense::ALUA_TRANSITION,
        }
    }
}

/// One target port group: its id, state, and the relative ids of its target ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortGroup {
    pub id: u16,
    pub state: AccessState,
    /// The group the LUN's owner prefers hosts to use (the PREF bit).
    pub preferred: bool,
    pub ports: Vec<u16>,
}

/// Where a LUN learns the target port groups and their states.
pub trait PortGroups: Send + Sync {
    /// Every group the LUN is reached through, this daemon's and the other gateways'.
    fn groups(&self) -> Vec<PortGroup>;
    /// This daemon's group and the relative id of its port (VPD page 0x83).
    fn local(&self) -> (u16, u16);
    /// The state of this daemon's group now; asked on every command, so cheap.
    fn local_state(&self) -> AccessState;
    /// A command that reads or writes the medium arrived while this daemon's group is not
    /// active: implicit ALUA, the host chose this path. Returns the state afterwards (active
    /// if this daemon took the LUN over, transitioning while it still is).
    fn request_access(&self) -> AccessState;
    /// Seconds an implicit transition may take, for the extended header of REPORT TARGET PORT
    /// GROUPS (0: unspecified).
    fn transition_seconds(&self) -> u8 {
        0
    }
    /// The unit attentions a change of the persistent reservations at this (active) port
    /// raised for initiator ports (REGISTRATIONS PREEMPTED, RESERVATIONS RELEASED...), once
    /// the change is kept: the other gateways queue them for their own sessions of those
    /// ports ([`Lun::attentions_from_owner`](crate::Lun::attentions_from_owner)), whose
    /// hosts would otherwise not learn of them on their standby paths.
    fn attentions_raised(&self, _naa: &[u8; 16], _notices: &[(PortId, Sense)]) {}
}

/// One group (0) of one port (relative id 1), always active/optimized: a LUN served by one
/// daemon alone.
pub struct SinglePort;

impl PortGroups for SinglePort {
    fn groups(&self) -> Vec<PortGroup> {
        vec![PortGroup {
            id: 0,
            state: AccessState::ActiveOptimized,
            preferred: true,
            ports: vec![1],
        }]
    }

    fn local(&self) -> (u16, u16) {
        (0, 1)
    }

    fn local_state(&self) -> AccessState {
        AccessState::ActiveOptimized
    }

    fn request_access(&self) -> AccessState {
        AccessState::ActiveOptimized
    }
}

/// Whether a port in `state` lets a command through (SPC-4 5.16.2.4): every command in an
/// active state; in standby, discovery, sense, mode and log pages and persistent reservations;
/// in unavailable and transitioning, discovery and sense only. Err with the sense to answer.
pub fn admits(state: AccessState, op: u8, sa: Option<u8>) -> Result<(), Sense> {
    let discovery = matches!(op, INQUIRY | REPORT_LUNS | REQUEST_SENSE)
        || (op == MAINTENANCE_IN
            && matches!(
                sa,
                Some(SA_REPORT_TARGET_PORT_GROUPS) | Some(SA_REPORT_SUPPORTED_OPCODES)
            ));
    let ok = match state {
        AccessState::ActiveOptimized | AccessState::ActiveNonOptimized => true,
        AccessState::Standby => {
            discovery
                || matches!(
                    op,
                    MODE_SENSE_6
                        | MODE_SENSE_10
                        | MODE_SELECT_6
                        | MODE_SELECT_10
                        | PERSISTENT_RESERVE_IN
                        | PERSISTENT_RESERVE_OUT
                )
        }
        AccessState::Unavailable | AccessState::Transitioning => discovery,
    };
    if ok {
        Ok(())
    } else {
        Err(state.refusal())
    }
}

/// REPORT TARGET PORT GROUPS parameter data (SPC-4 6.36), length header included; with
/// `extended`, the extended header that carries the implicit transition time.
pub fn report(groups: &[PortGroup], extended: bool, transition_seconds: u8) -> Vec<u8> {
    let mut d = vec![0u8; 4];
    if extended {
        d.extend_from_slice(&[0x10, transition_seconds, 0, 0]);
    }
    // The states a group may be put in: one group alone is always active/optimized; groups
    // of several gateways move between all of them.
    let supported = if groups.len() > 1 {
        0x80 | 0x08 | 0x04 | 0x02 | 0x01 // T_SUP, U_SUP, S_SUP, AN_SUP, AO_SUP
    } else {
        0x01
    };
    for g in groups {
        d.push(if g.preferred { 0x80 } else { 0 } | g.state.code());
        d.push(supported);
        d.extend_from_slice(&g.id.to_be_bytes());
        d.push(0);
        d.push(0); // status: none available
        d.push(0);
        d.push(g.ports.len() as u8);
        for p in &g.ports {
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&p.to_be_bytes());
        }
    }
    let n = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&n.to_be_bytes());
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_port_answers_discovery_and_refuses_the_medium() {
        for op in [
            INQUIRY,
            REPORT_LUNS,
            REQUEST_SENSE,
            MODE_SENSE_10,
            PERSISTENT_RESERVE_IN,
        ] {
            assert!(admits(AccessState::Standby, op, None).is_ok(), "{op:#x}");
        }
        assert!(admits(AccessState::Standby, MAINTENANCE_IN, Some(SA_REPORT_TARGET_PORT_GROUPS)).is_ok());
        for op in [
            READ_10,
            WRITE_10,
            READ_16,
            WRITE_16,
            TEST_UNIT_READY,
            READ_CAPACITY_10,
            SYNCHRONIZE_CACHE_10,
            UNMAP,
        ] {
            assert_eq!(
                admits(AccessState::Standby, op, None),
                Err(sense::PORT_IN_STANDBY),
                "{op:#x}"
            );
        }
        assert_eq!(
            admits(AccessState::Unavailable, MODE_SENSE_6, None),
            Err(sense::PORT_UNAVAILABLE)
        );
        assert_eq!(
            admits(AccessState::Transitioning, WRITE_10, None),
            Err(sense::ALUA_TRANSITION)
        );
        for state in [AccessState::ActiveOptimized, AccessState::ActiveNonOptimized] {
            assert!(admits(state, WRITE_16, None).is_ok());
        }
    }

    #[test]
    fn the_report_lists_every_group_with_its_state_and_ports() {
        let groups = vec![
            PortGroup {
                id: 1,
                state: AccessState::ActiveOptimized,
                preferred: true,
                ports: vec![1],
            },
            PortGroup {
                id: 2,
                state: AccessState::Standby,
                preferred: false,
                ports: vec![2, 3],
            },
        ];
        let d = report(&groups, true, 15);
        assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize, d.len() - 4);
        assert_eq!(&d[4..8], &[0x10, 15, 0, 0]);
        let g1 = &d[8..20];
        assert_eq!(g1[0], 0x80);
        assert_eq!(u16::from_be_bytes([g1[2], g1[3]]), 1);
        assert_eq!(g1[7], 1);
        assert_eq!(u16::from_be_bytes([g1[10], g1[11]]), 1);
        let g2 = &d[20..];
        assert_eq!(g2[0], 0x02);
        assert_eq!(u16::from_be_bytes([g2[2], g2[3]]), 2);
        assert_eq!(g2[1], 0x8F, "several groups: every state supported");
        assert_eq!(g2[7], 2);
        assert_eq!(g2.len(), 8 + 2 * 4);
        assert_eq!(u16::from_be_bytes([g2[14], g2[15]]), 3);
        // One daemon alone: what REPORT TARGET PORT GROUPS always said.
        let one = report(&SinglePort.groups(), false, 0);
        assert_eq!(one, vec![0, 0, 0, 12, 0x80, 0x01, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]);
    }
}
