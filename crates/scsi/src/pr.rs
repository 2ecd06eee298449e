//! Reservations of a logical unit: SPC-2 RESERVE/RELEASE, and SPC-4 persistent reservations
//! (PERSISTENT RESERVE IN and OUT) with every service action and type. The state is a plain
//! value so that a LUN can persist it when an initiator asks for APTPL.

use serde::{Deserialize, Serialize};

use crate::bytes::{be16, be32, be64};
use crate::nexus::Nexus;
use crate::opcodes::*;
use crate::sense::{self, Sense};

/// How a command stands against a reservation held by another nexus (SPC-4 table 63, SBC-3
/// table 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Never in conflict: discovery, status and sense.
    Always,
    /// Reads the medium or state: allowed under the write-exclusive types.
    Read,
    /// Changes the medium or state.
    Write,
}

/// Persistent reservation types (SPC-4 6.16.3.4).
pub mod pr_type {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WRITE_EXCLUSIVE_REGISTRANTS_ONLY: u8 = 5;
    pub const EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: u8 = 6;
    pub const WRITE_EXCLUSIVE_ALL_REGISTRANTS: u8 = 7;
    pub const EXCLUSIVE_ACCESS_ALL_REGISTRANTS: u8 = 8;
}
use pr_type::*;

/// Unit attentions the reservation rules raise.
pub const RESERVATIONS_PREEMPTED: Sense = Sense::new(sense::key::UNIT_ATTENTION, 0x2A, 0x03);
pub const RESERVATIONS_RELEASED: Sense = Sense::new(sense::key::UNIT_ATTENTION, 0x2A, 0x04);
pub const REGISTRATIONS_PREEMPTED: Sense = Sense::new(sense::key::UNIT_ATTENTION, 0x2A, 0x05);
pub const INVALID_RELEASE: Sense = Sense::new(sense::key::ILLEGAL_REQUEST, 0x26, 0x04);

/// iSCSI's protocol identifier in TransportIDs.
const PROTOCOL_ISCSI: u8 = 5;
/// The relative target port of a LUN served by one daemon alone (VPD page 0x83 says so too).
pub const RELATIVE_TARGET_PORT: u16 = 1;
/// The target ports a LUN is reached through, as READ FULL STATUS and REGISTER AND MOVE
/// name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPorts {
    /// One port: a LUN served by one daemon alone.
    One(u16),
    /// The ports of the gateways known to present it now. A registration names the initiator
    /// port only, so it holds through every gateway's port, as with ALL_TG_PT.
    Gateways(Vec<u16>),
}

impl TargetPorts {
    fn contains(&self, port: u16) -> bool {
        match self {
            TargetPorts::One(p) => *p == port,
            TargetPorts::Gateways(ports) => ports.contains(&port),
        }
    }
}

/// Registrations a LUN keeps at most.
const MAX_REGISTRATIONS: usize = 1024;

/// Whether `name` may be an iSCSI name (RFC 7143 4.2.7.1): 1 to 223 bytes, none of them a
/// character RFC 3722's profile prohibits that could mislead whoever reads the name in a
/// listing or an event: a control character, white space, one that is invisible or changes
/// the direction of the text around it (so that a name looks like another host's), a private
/// use or tagging one. A login is refused a name that is not, and so is a TransportID naming
/// one.
pub fn is_iscsi_name(name: &str) -> bool {
    let prohibited = |c: char| {
        c.is_control()
            || c.is_whitespace()
            || matches!(c,
                '\u{0340}' | '\u{0341}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{e000}'..='\u{f8ff}'
                | '\u{e0000}'..='\u{e007f}' | '\u{f0000}'..='\u{10ffff}')
    };
    !name.is_empty() && name.len() <= 223 && !name.chars().any(prohibited)
}

/// An initiator port as reservations know it: the initiator's name and, unless the
/// registration was made by device name (TransportID format 0), the ISID of one port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortId {
    pub initiator: String,
    pub isid: Option<[u8; 6]>,
}

impl PortId {
    pub fn of(n: &Nexus) -> PortId {
        PortId {
            initiator: n.initiator.clone(),
            isid: Some(n.isid),
        }
    }

    /// Whether a nexus is reached through this port. iSCSI names compare case-insensitively.
    pub fn matches(&self, n: &Nexus) -> bool {
        self.initiator.eq_ignore_ascii_case(&n.initiator) && self.isid.is_none_or(|i| i == n.isid)
    }

    fn same(&self, o: &PortId) -> bool {
        self.initiator.eq_ignore_ascii_case(&o.initiator) && self.isid == o.isid
    }

    /// The iSCSI TransportID (SPC-4 7.6.4.6), padded to a multiple of 4 bytes.
    fn transport_id(&self) -> Vec<u8> {
        let (format, mut name) = match self.isid {
            Some(isid) => (
                0x40,
                format!(
                    "{},i,0x{}",
                    self.initiator,
                    isid.iter().map(|b| format!("{b:02x}")).collect::<String>()
                )
                .into_bytes(),
            ),
            None => (0x00, self.initiator.clone().into_bytes()),
        };
        name.push(0);
        while name.len() % 4 != 0 || name.len() < 20 {
            name.push(0);
        }
        let mut out = vec![format | PROTOCOL_ISCSI, 0];
        out.extend_from_slice(&(name.len() as u16).to_be_bytes());
        out.extend_from_slice(&name);
        out
    }

    /// Parses one iSCSI TransportID; returns it and the bytes it took.
    fn parse_transport_id(b: &[u8]) -> Result<(PortId, usize), Sense> {
        let bad = sense::INVALID_FIELD_IN_PARAMETER_LIST;
        if b.len() < 4 || b[0] & 0x0F != PROTOCOL_ISCSI {
            return Err(bad);
        }
        let len = be16(&b[2..4]) as usize;
        let total = 4 + len;
        if len < 4 || b.len() < total {
            return Err(bad);
        }
        let raw = &b[4..total];
        let text =
            std::str::from_utf8(&raw[..raw.iter().position(|&c| c == 0).unwrap_or(raw.len())]).map_err(|_| bad)?;
        let port = match b[0] >> 6 {
            0 => PortId {
                initiator: text.to_string(),
                isid: None,
            },
            1 => {
                let (name, isid) = text
                    .split_once(",i,0x")
                    .or_else(|| text.split_once(",I,0X"))
                    .ok_or(bad)?;
                // Twelve hex digits; checked as bytes first, so that a multi-byte character
                // cannot put a slice boundary inside itself.
                if isid.len() != 12 || !isid.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return Err(bad);
                }
                let mut id = [0u8; 6];
                for (i, v) in id.iter_mut().enumerate() {
                    *v = u8::from_str_radix(&isid[2 * i..2 * i + 2], 16).map_err(|_| bad)?;
                }
                PortId {
                    initiator: name.to_string(),
                    isid: Some(id),
                }
            }
            _ => return Err(bad),
        };
        // A name no login could have: refused before it reaches a listing or a saved record.
        if !is_iscsi_name(&port.initiator) {
            return Err(bad);
        }
        Ok((port, total))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub port: PortId,
    pub key: u64,
    pub all_tg_pt: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The nexus that holds it; for the all-registrants types every registrant holds it.
    pub holder: PortId,
    pub kind: u8,
}

/// The persistent reservation state of a logical unit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrState {
    pub generation: u32,
    pub registrations: Vec<Registration>,
    pub reservation: Option<Reservation>,
    /// Activate persist through power loss: the state survives restarts.
    pub aptpl: bool,
}

fn all_registrants(kind: u8) -> bool {
    matches!(kind, WRITE_EXCLUSIVE_ALL_REGISTRANTS | EXCLUSIVE_ACCESS_ALL_REGISTRANTS)
}

fn registrants_only(kind: u8) -> bool {
    matches!(
        kind,
        WRITE_EXCLUSIVE_REGISTRANTS_ONLY | EXCLUSIVE_ACCESS_REGISTRANTS_ONLY
    )
}

fn valid_type(kind: u8) -> bool {
    matches!(kind, 1 | 3 | 5..=8)
}

/// What a PERSISTENT RESERVE OUT (or RESERVE, RELEASE) comes to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Good,
    Check(Sense),
    Conflict,
}

/// Unit attentions to queue for the nexuses of these ports.
pub(crate) type Notices = Vec<(PortId, Sense)>;

impl PrState {
    /// Refuses a state read back (saved by an earlier run, or by the last gateway) that no
    /// sequence of commands makes: more registrations than are taken, a name no login could
    /// have (longer than iSCSI's 223 bytes, which READ FULL STATUS would cut at 65,535), one
    /// port registered twice, a reservation of no type, or one held by a port not
    /// registered. Such a state would answer hosts with what none of them set up.
    pub fn check(&self) -> Result<(), String> {
        if self.registrations.len() > MAX_REGISTRATIONS {
            return Err(format!(
                "{} registrations, more than the {MAX_REGISTRATIONS} a logical unit takes",
                self.registrations.len()
            ));
        }
        for (i, r) in self.registrations.iter().enumerate() {
            if !is_iscsi_name(&r.port.initiator) {
                return Err(format!(
                    "a registration names {:?}, which is no iSCSI name",
                    r.port.initiator.chars().take(64).collect::<String>()
                ));
            }
            if self.registrations[..i].iter().any(|o| o.port.same(&r.port)) {
                return Err(format!("the port {} is registered twice", r.port.initiator));
            }
        }
        if let Some(r) = &self.reservation {
            if !valid_type(r.kind) {
                return Err(format!("a reservation of type {}, which is none", r.kind));
            }
            let registered = match all_registrants(r.kind) {
                true => !self.registrations.is_empty(),
                false => self.registrations.iter().any(|g| g.port.same(&r.holder)),
            };
            if !registered {
                return Err("a reservation held by no registered port".into());
            }
        }
        Ok(())
    }

    fn registration(&self, n: &Nexus) -> Option<usize> {
        self.registrations.iter().position(|r| r.port.matches(n))
    }

    /// Whether `n` holds the reservation (every registrant does for the all-registrants types).
    fn holds(&self, n: &Nexus) -> bool {
        match &self.reservation {
            Some(r) if all_registrants(r.kind) => self.registration(n).is_some(),
            Some(r) => r.holder.matches(n),
            None => false,
        }
    }

    /// Whether a command of `access` from `n` may run.
    pub(crate) fn allows(&self, n: &Nexus, access: Access) -> bool {
        let Some(r) = &self.reservation else {
            return true;
        };
        if access == Access::Always || self.holds(n) {
            return true;
        }
        let registered = self.registration(n).is_some();
        match r.kind {
            WRITE_EXCLUSIVE => access == Access::Read,
            EXCLUSIVE_ACCESS => false,
            WRITE_EXCLUSIVE_REGISTRANTS_ONLY | WRITE_EXCLUSIVE_ALL_REGISTRANTS => registered || access == Access::Read,
            _ => registered,
        }
    }

    /// Unit attentions for every registrant but the ports in `except`.
    fn notify_registrants(&self, s: Sense, except: &[&PortId], out: &mut Notices) {
        for r in &self.registrations {
            if !except.iter().any(|e| e.same(&r.port)) {
                out.push((r.port.clone(), s));
            }
        }
    }

    /// Removes registration `i`, releasing the reservation it held.
    fn unregister(&mut self, i: usize, out: &mut Notices) {
        let gone = self.registrations.remove(i);
        let Some(r) = &self.reservation else {
            return;
        };
        if all_registrants(r.kind) {
            if self.registrations.is_empty() {
                self.reservation = None;
            }
        } else if r.holder.same(&gone.port) {
            let kind = r.kind;
            self.reservation = None;
            if registrants_only(kind) {
                self.notify_registrants(RESERVATIONS_RELEASED, &[], out);
            }
        }
    }

    /// Removes every registration with `key` but that of `keep`; returns the ports removed.
    fn remove_key(&mut self, key: u64, keep: &PortId) -> Vec<PortId> {
        let mut removed = Vec::new();
        self.registrations.retain(|r| {
            let drop = r.key == key && !r.port.same(keep);
            if drop {
                removed.push(r.port.clone());
            }
            !drop
        });
        removed
    }

    /// PERSISTENT RESERVE IN.
    /// PERSISTENT RESERVE IN through a LUN reached through `ports`.
    pub(crate) fn pr_in(&self, cdb: &[u8], ports: &TargetPorts) -> Result<Vec<u8>, Sense> {
        let sa = cdb[1] & 0x1F;
        let mut out = Vec::new();
        out.extend_from_slice(&self.generation.to_be_bytes());
        match sa {
            // READ KEYS
            0 => {
                out.extend_from_slice(&((8 * self.registrations.len()) as u32).to_be_bytes());
                for r in &self.registrations {
                    out.extend_from_slice(&r.key.to_be_bytes());
                }
            }
            // READ RESERVATION
            1 => match &self.reservation {
                None => out.extend_from_slice(&0u32.to_be_bytes()),
                Some(r) => {
                    out.extend_from_slice(&16u32.to_be_bytes());
                    let key = if all_registrants(r.kind) {
                        0
                    } else {
                        self.registrations
                            .iter()
                            .find(|g| g.port.same(&r.holder))
                            .map_or(0, |g| g.key)
                    };
                    out.extend_from_slice(&key.to_be_bytes());
                    out.extend_from_slice(&[0, 0, 0, 0, 0, r.kind, 0, 0]);
                }
            },
            // REPORT CAPABILITIES
            2 => {
                out.clear();
                // Length 8; SIP_C, ATP_C, PTPL_C; TMV and PTPL_A; the type mask.
                out.extend_from_slice(&[0, 8, 0x08 | 0x04 | 0x01, 0x80 | self.aptpl as u8]);
                out.extend_from_slice(&[0x80 | 0x40 | 0x20 | 0x08 | 0x02, 0x01, 0, 0]);
            }
            // READ FULL STATUS
            3 => {
                let mut descs = Vec::new();
                for r in &self.registrations {
                    let holder = match &self.reservation {
                        Some(res) if all_registrants(res.kind) || res.holder.same(&r.port) => Some(res.kind),
                        _ => None,
                    };
                    descs.extend_from_slice(&r.key.to_be_bytes());
                    descs.extend_from_slice(&[0; 4]);
                    let (all_ports, port) = match ports {
                        TargetPorts::One(one) if !r.all_tg_pt => (false, *one),
                        _ => (true, 0),
                    };
                    descs.push(((all_ports as u8) << 1) | holder.is_some() as u8);
                    descs.push(holder.unwrap_or(0));
                    descs.extend_from_slice(&[0; 4]);
                    descs.extend_from_slice(&port.to_be_bytes());
                    let tid = r.port.transport_id();
                    descs.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    descs.extend_from_slice(&tid);
                }
                out.extend_from_slice(&(descs.len() as u32).to_be_bytes());
                out.extend_from_slice(&descs);
            }
            _ => return Err(sense::INVALID_FIELD_IN_CDB),
        }
        Ok(out)
    }

    /// PERSISTENT RESERVE OUT from `n`. Changes the state only when it succeeds.
    /// `ports` as for [`PrState::pr_in`].
    pub(crate) fn pr_out(
        &mut self,
        n: &Nexus,
        cdb: &[u8],
        d: &[u8],
        ports: &TargetPorts,
        out: &mut Notices,
    ) -> Outcome {
        let sa = cdb[1] & 0x1F;
        let (scope, kind) = (cdb[2] >> 4, cdb[2] & 0x0F);
        let len = be32(&cdb[5..9]) as usize;
        if sa > 7 {
            return Outcome::Check(sense::INVALID_FIELD_IN_CDB);
        }
        if len < 24 || d.len() < len {
            return Outcome::Check(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let d = &d[..len];
        if sa == 7 {
            return self.register_and_move(n, d, ports);
        }
        let (key, sa_key) = (be64(&d[0..8]), be64(&d[8..16]));
        let (spec_i_pt, all_tg_pt, aptpl) = (d[20] & 0x08 != 0, d[20] & 0x04 != 0, d[20] & 0x01 != 0);
        if !spec_i_pt && len != 24 {
            return Outcome::Check(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let me = self.registration(n);
        let needs_reservation = matches!(sa, 1 | 2 | 4 | 5);
        if needs_reservation && (scope != 0 || !valid_type(kind)) && sa != 2 {
            return Outcome::Check(sense::INVALID_FIELD_IN_CDB);
        }
        match sa {
            // REGISTER, REGISTER AND IGNORE EXISTING KEY
            0 | 6 => {
                match me {
                    None => {
                        if sa == 0 && key != 0 {
                            return Outcome::Conflict;
                        }
                        if spec_i_pt && sa == 6 {
                            return Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST);
                        }
                        if sa_key == 0 {
                            return Outcome::Good;
                        }
                        let mut ports = vec![PortId::of(n)];
                        if spec_i_pt {
                            match parse_transport_id_list(&d[24..]) {
                                Ok(listed) => ports.extend(listed),
                                Err(s) => return Outcome::Check(s),
                            }
                            for (i, p) in ports.iter().enumerate() {
                                let dup = ports[..i].iter().any(|q| q.same(p));
                                if dup || self.registrations.iter().any(|r| r.port.same(p)) {
                                    return Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST);
                                }
                            }
                        }
                        if self.registrations.len() + ports.len() > MAX_REGISTRATIONS {
                            return Outcome::Check(INSUFFICIENT_REGISTRATION_RESOURCES);
                        }
                        for port in ports {
                            self.registrations.push(Registration {
                                port,
                                key: sa_key,
                                all_tg_pt,
                            });
                        }
                    }
                    Some(i) => {
                        if sa == 0 && key != self.registrations[i].key {
                            return Outcome::Conflict;
                        }
                        if spec_i_pt {
                            return Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST);
                        }
                        if sa_key == 0 {
                            self.unregister(i, out);
                        } else {
                            self.registrations[i].key = sa_key;
                        }
                    }
                }
                self.aptpl = aptpl;
                self.generation = self.generation.wrapping_add(1);
                Outcome::Good
            }
            _ => {
                // Every other service action needs a registration with the right key.
                let Some(i) = me else {
                    return Outcome::Conflict;
                };
                if key != self.registrations[i].key {
                    return Outcome::Conflict;
                }
                // ALL_TG_PT only means something to the register actions; SPEC_I_PT is an error.
                if spec_i_pt {
                    return Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST);
                }
                let mine = self.registrations[i].port.clone();
                match sa {
                    1 => self.reserve(n, mine, kind),
                    2 => self.release(n, &mine, scope, kind, out),
                    3 => {
                        self.notify_registrants(RESERVATIONS_PREEMPTED, &[&mine], out);
                        self.registrations.clear();
                        self.reservation = None;
                        self.generation = self.generation.wrapping_add(1);
                        Outcome::Good
                    }
                    _ => self.preempt(mine, sa_key, kind, out),
                }
            }
        }
    }

    fn reserve(&mut self, n: &Nexus, mine: PortId, kind: u8) -> Outcome {
        match &self.reservation {
            Some(r) if self.holds(n) && r.kind == kind => Outcome::Good,
            Some(_) => Outcome::Conflict,
            None => {
                self.reservation = Some(Reservation { holder: mine, kind });
                Outcome::Good
            }
        }
    }

    fn release(&mut self, n: &Nexus, mine: &PortId, scope: u8, kind: u8, out: &mut Notices) -> Outcome {
        let Some(r) = &self.reservation else {
            return Outcome::Good;
        };
        if !self.holds(n) {
            return Outcome::Good;
        }
        if scope != 0 || r.kind != kind {
            return Outcome::Check(INVALID_RELEASE);
        }
        let kind = r.kind;
        self.reservation = None;
        if registrants_only(kind) || all_registrants(kind) {
            self.notify_registrants(RESERVATIONS_RELEASED, &[mine], out);
        }
        Outcome::Good
    }

    /// PREEMPT and PREEMPT AND ABORT (SPC-4 5.13.11.4). Commands run to completion as they
    /// arrive here, so there are no tasks of the preempted nexuses left to abort.
    fn preempt(&mut self, mine: PortId, sa_key: u64, kind: u8, out: &mut Notices) -> Outcome {
        let res = self.reservation.clone();
        let removed = match &res {
            Some(r) if all_registrants(r.kind) && sa_key == 0 => {
                // Every other registration goes, and the preempter holds a new reservation.
                let removed: Vec<PortId> = self
                    .registrations
                    .iter()
                    .filter(|g| !g.port.same(&mine))
                    .map(|g| g.port.clone())
                    .collect();
                self.registrations.retain(|g| g.port.same(&mine));
                self.reservation = Some(Reservation {
                    holder: mine.clone(),
                    kind,
                });
                removed
            }
            Some(r) if !all_registrants(r.kind) && self.holder_key() == Some(sa_key) => {
                let removed = self.remove_key(sa_key, &mine);
                let changed = r.kind != kind;
                self.reservation = Some(Reservation {
                    holder: mine.clone(),
                    kind,
                });
                if changed {
                    let except: Vec<&PortId> = std::iter::once(&mine).chain(removed.iter()).collect();
                    self.notify_registrants(RESERVATIONS_RELEASED, &except, out);
                }
                removed
            }
            _ => {
                // No reservation to take: only registrations are removed.
                if sa_key == 0 {
                    return Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST);
                }
                let removed = self.remove_key(sa_key, &mine);
                if removed.is_empty() {
                    return Outcome::Conflict;
                }
                if let Some(r) = &self.reservation {
                    if all_registrants(r.kind) && self.registrations.is_empty() {
                        self.reservation = None;
                    }
                }
                removed
            }
        };
        for p in removed {
            out.push((p, REGISTRATIONS_PREEMPTED));
        }
        self.generation = self.generation.wrapping_add(1);
        Outcome::Good
    }

    fn holder_key(&self) -> Option<u64> {
        let r = self.reservation.as_ref()?;
        self.registrations
            .iter()
            .find(|g| g.port.same(&r.holder))
            .map(|g| g.key)
    }

    /// REGISTER AND MOVE: the holder hands its reservation to another port.
    fn register_and_move(&mut self, n: &Nexus, d: &[u8], ports: &TargetPorts) -> Outcome {
        let (key, sa_key) = (be64(&d[0..8]), be64(&d[8..16]));
        let (unreg, aptpl) = (d[17] & 0x02 != 0, d[17] & 0x01 != 0);
        let port = be16(&d[18..20]) as u16;
        let tid_len = be32(&d[20..24]) as usize;
        let Some(i) = self.registration(n) else {
            return Outcome::Conflict;
        };
        if key != self.registrations[i].key {
            return Outcome::Conflict;
        }
        let kind = match &self.reservation {
            Some(r) if !all_registrants(r.kind) && self.holds(n) => r.kind,
            _ => return Outcome::Conflict,
        };
        if sa_key == 0 || d.len() < 24 + tid_len {
            return Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        let dest = match PortId::parse_transport_id(&d[24..24 + tid_len]) {
            Ok((p, _)) => p,
            Err(s) => return Outcome::Check(s),
        };
        if dest.same(&self.registrations[i].port) || dest.matches(n) || !ports.contains(port) {
            return Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        let new = !self.registrations.iter().any(|g| g.port.same(&dest));
        // Unless the holder leaves, the port it moves to is one registration more.
        if new && !unreg && self.registrations.len() >= MAX_REGISTRATIONS {
            return Outcome::Check(INSUFFICIENT_REGISTRATION_RESOURCES);
        }
        match self.registrations.iter_mut().find(|g| g.port.same(&dest)) {
            Some(g) => g.key = sa_key,
            None => self.registrations.push(Registration {
                port: dest.clone(),
                key: sa_key,
                all_tg_pt: false,
            }),
        }
        self.reservation = Some(Reservation { holder: dest, kind });
        if unreg {
            let i = self.registration(n).expect("still registered");
            self.registrations.remove(i);
        }
        self.aptpl = aptpl;
        self.generation = self.generation.wrapping_add(1);
        Outcome::Good
    }
}

pub const INSUFFICIENT_REGISTRATION_RESOURCES: Sense = Sense::new(sense::key::ILLEGAL_REQUEST, 0x55, 0x04);

/// The TransportID list that follows the basic parameter list when SPEC_I_PT is set.
fn parse_transport_id_list(b: &[u8]) -> Result<Vec<PortId>, Sense> {
    if b.len() < 4 {
        return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let len = be32(&b[0..4]) as usize;
    if b.len() < 4 + len {
        return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let mut rest = &b[4..4 + len];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (p, used) = PortId::parse_transport_id(rest)?;
        out.push(p);
        rest = &rest[used..];
    }
    Ok(out)
}

/// SPC-2 RESERVE and RELEASE (6 and 10), held per I_T nexus and lost with it. With persistent
/// registrations present they conflict (we do not claim compatible reservation handling).
pub(crate) fn legacy(state: &PrState, holder: &mut Option<u64>, n: &Nexus, cdb: &[u8]) -> Outcome {
    let reserve = matches!(cdb[0], RESERVE_6 | RESERVE_10);
    // Third-party reservations (RESERVE(10) 3RDPTY/LONGID) and extents are not supported.
    let third_party = match cdb[0] {
        RESERVE_10 | RELEASE_10 => cdb[1] & 0x12 != 0,
        _ => cdb[1] & 0x01 != 0,
    };
    if third_party {
        return Outcome::Check(sense::INVALID_FIELD_IN_CDB);
    }
    if !state.registrations.is_empty() || state.reservation.is_some() {
        return Outcome::Conflict;
    }
    match (*holder, reserve) {
        (Some(h), true) if h != n.id => Outcome::Conflict,
        (_, true) => {
            *holder = Some(n.id);
            Outcome::Good
        }
        (Some(h), false) if h == n.id => {
            *holder = None;
            Outcome::Good
        }
        // Releasing what one does not hold is no error.
        (_, false) => Outcome::Good,
    }
}

#[cfg(test)]
#[path = "pr_tests.rs"]
mod tests;

#[cfg(test)]
mod transport_id_tests {
    use super::*;

    fn tid(text: &[u8]) -> Vec<u8> {
        let mut name = text.to_vec();
        name.push(0);
        while name.len() % 4 != 0 {
            name.push(0);
        }
        let mut b = vec![0x40 | PROTOCOL_ISCSI, 0];
        b.extend_from_slice(&(name.len() as u16).to_be_bytes());
        b.extend_from_slice(&name);
        b
    }

    #[test]
    fn an_isid_of_multi_byte_characters_is_refused_not_a_panic() {
        // Twelve bytes, but "é" puts a character boundary where a hex pair would be cut.
        for isid in ["aéééééb", "éééééé", "4000000000é", "40000000000g"] {
            let b = tid(format!("iqn.x:a,i,0x{isid}").as_bytes());
            assert_eq!(
                PortId::parse_transport_id(&b).map(|_| ()),
                Err(sense::INVALID_FIELD_IN_PARAMETER_LIST),
                "{isid}"
            );
        }
        let (p, used) = PortId::parse_transport_id(&tid(b"iqn.x:a,i,0x40000000002a")).unwrap();
        assert_eq!(p.isid, Some([0x40, 0, 0, 0, 0, 0x2a]));
        assert_eq!(used, tid(b"iqn.x:a,i,0x40000000002a").len());
    }
}
