//! The persistent reservation and MODE SELECT commands a standby port receives, run by the
//! gateway that owns the pool (SPC-4 5.16.2.4.4 has a standby port serve PERSISTENT RESERVE
//! IN and OUT and MODE SELECT; Linux's mpathpersist registers down every path, standby ones
//! included). The reservations and mode settings live in the owner's memory, which enforces
//! them on every command, and in the pool's metadata, which only the owner may write: the
//! standby gateway asks the owner through etcd
//! ([`tessera_ownership::Courier`]) and answers the host with what the owner answered.
//!
//! The other way, the unit attentions that a change of the reservations raises at the owner
//! for initiator ports (REGISTRATIONS PREEMPTED, say) are sent to every other gateway as
//! notices, and their standby ports queue them for their sessions of those ports.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessera_scsi::{sense, Data, Lun, ModeState, Nexus, OwnerAnswer, OwnerForwarding, PortId, Response, Sense};
use tracing::warn;

use crate::rados_pools::Membership;
use crate::standby::{is_standby, AttentionsOut, OtherGateways};

/// How long a standby port waits for the owner's answer before it tells the host to try
/// again (ALUA transition): about a lease, so that an owner that stalled is replaced by then.
pub const OWNER_ANSWERS_WITHIN: Duration = Duration::from_secs(10);

/// The largest parameter list or answer passed on (PERSISTENT RESERVE IN answers at most
/// 64 KiB; a PERSISTENT RESERVE OUT list is 24 bytes and its TransportIDs).
const MAX_DATA: usize = 1 << 16;

/// The most sense data a command's answer carries (SPC-4 4.5.1).
const MAX_SENSE: usize = 252;

/// A command a standby port received, as the owner runs it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Forwarded {
    /// The logical unit (VPD page 0x83's NAA designator), in hex.
    naa: String,
    /// The initiator port it came from: registrations are kept by it.
    initiator: String,
    isid: [u8; 6],
    cdb: Vec<u8>,
    data: Vec<u8>,
}

/// What the owner answered. Fields it may add later are passed over: the command ran there
/// (a request, refused whole when not understood, never runs).
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Answered {
    status: u8,
    sense: Vec<u8>,
    data: Vec<u8>,
    /// The owner's mode settings after a MODE SELECT it ran ([`OwnerAnswer::mode`]). Read
    /// leniently: settings this gateway cannot read (a later owner's, say) are none, and
    /// the standby port works them out itself, rather than fail a command that ran.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "mode_if_readable"
    )]
    mode: Option<ModeState>,
}

fn mode_if_readable<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<ModeState>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

impl Answered {
    /// Whether a host may be given this as a command's outcome: a status a persistent
    /// reservation or MODE SELECT command ends with, sense data where (and only as much as)
    /// SCSI has it, and no more data than asked for at most.
    fn sound(&self) -> bool {
        let status = match self.status {
            sense::GOOD | sense::RESERVATION_CONFLICT | sense::TASK_SET_FULL => self.sense.is_empty(),
            sense::CHECK_CONDITION => !self.sense.is_empty(),
            _ => false,
        };
        status && self.sense.len() <= MAX_SENSE && self.data.len() <= MAX_DATA
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A nexus the owner runs a forwarded command for: its initiator port, and an id no session
/// here has (ids key SPC-2 reservations and copy results, which a forwarded command neither
/// holds nor makes; a unit attention it raises reaches every nexus kept here).
fn forwarded_nexus(initiator: &str, isid: [u8; 6]) -> Nexus {
    Nexus::new(u64::MAX, initiator, isid)
}

/// A standby LUN's way to its pool's owner.
struct PoolForwarding {
    gateway: Arc<Membership>,
    pool: String,
}

impl OwnerForwarding for PoolForwarding {
    fn forward(&self, naa: &[u8; 16], nexus: &Nexus, cdb: &[u8], data: &[u8]) -> Option<OwnerAnswer> {
        if data.len() > MAX_DATA {
            return Some(check_condition(sense::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        let request = Forwarded {
            naa: hex(naa),
            initiator: nexus.initiator.clone(),
            isid: nexus.isid,
            cdb: cdb.to_vec(),
            data: data.to_vec(),
        };
        let request = serde_json::to_vec(&request).expect("plain data");
        let answer = self.gateway.ask_owner(&self.pool, request, OWNER_ANSWERS_WITHIN)?;
        Some(response_to_host(&self.pool, &answer))
    }
}

/// What a standby port answers its host for the owner's `answer` to a command it forwarded.
/// One that cannot be read (or holds what no SCSI answer holds) is a command that may have
/// run, or not: INTERNAL TARGET FAILURE, which the host reports, rather than an ALUA
/// transition, which it would send again, and which a command that ran (a REGISTER) then
/// meets as a RESERVATION CONFLICT.
fn response_to_host(pool: &str, answer: &[u8]) -> OwnerAnswer {
    match serde_json::from_slice::<Answered>(answer) {
        Ok(a) if a.sound() => OwnerAnswer {
            response: Response {
                status: a.status,
                data: a.data.into(),
                sense: a.sense,
            },
            mode: a.mode,
        },
        _ => {
            warn!(pool = %pool, "the owner's answer to a forwarded command cannot be read: the host is told the command failed (it may have run at the owner)");
            check_condition(sense::INTERNAL_TARGET_FAILURE).into()
        }
    }
}

/// How long after an owner took a forwarded command it may still start running it: its
/// asker waits `ASK_MUST_LAST` less four seconds at least after the taking, and the owner
/// must have renewed the ask's lease by then (`Courier::keep_running`, as it starts it) for
/// its asker to wait on while it runs. One taken earlier (others before it ran long) is
/// answered with [`not_run`] instead, so that it never runs after its host was told to try
/// again.
pub const RUN_TAKEN_WITHIN: Duration = Duration::from_secs(4);

/// How long the ask of a forwarded command must still live in etcd when the owner takes it
/// ([`Ask::lasts_for`](crate::rados_pools::Ask)) for the owner to run it: the time to start
/// it ([`RUN_TAKEN_WITHIN`]) and to answer (5 s at most; the run itself the owner makes time
/// for by keeping the ask alive), the asker's head start (it counts
/// its ask's lease from before etcd granted it, up to 2 s sooner, and stops waiting a second
/// before it lapses), and a second for etcd's whole seconds. An ask that lives less (taken
/// after its asker's first wait, which the asker could not take it back at, etcd failing
/// it) is answered with [`not_run`]: its asker may give up before any answer reaches it.
/// With [`OWNER_ANSWERS_WITHIN`] of 10 s an ask lives 23 s: about its asker's first wait
/// for the owner to take it (less the steps before that wait, and etcd's rounding of the
/// time left down to whole seconds).
pub const ASK_MUST_LAST: Duration = Duration::from_secs(RUN_TAKEN_WITHIN.as_secs() + 5 + 3 + 1);

/// What an owner answers for a forwarded command it did not run (its lease may have lapsed,
/// the pool was given up, it was taken too long ago): an ALUA transition, which the host
/// retries, at once rather than after its asker's waits.
pub fn not_run() -> Vec<u8> {
    check(sense::ALUA_TRANSITION)
}

/// What an owner answers for a forwarded command that failed here, having maybe run in
/// part: INTERNAL TARGET FAILURE, which the host reports rather than sends again.
pub fn failed() -> Vec<u8> {
    check(sense::INTERNAL_TARGET_FAILURE)
}

fn answer(a: OwnerAnswer) -> Vec<u8> {
    let r = a.response;
    serde_json::to_vec(&Answered {
        status: r.status,
        sense: r.sense,
        data: r.data.to_vec(),
        mode: a.mode,
    })
    .expect("plain data")
}

fn check(s: sense::Sense) -> Vec<u8> {
    answer(check_condition(s).into())
}

/// CHECK CONDITION with sense `s` (fixed format), as a port answers its host.
fn check_condition(s: sense::Sense) -> Response {
    Response {
        status: sense::CHECK_CONDITION,
        data: Data::default(),
        sense: s.encode(false),
    }
}

/// Runs at the owner a command that a standby port of one of `luns` (the LUNs presented
/// here of the pool asked) forwarded, and says what to answer. A request that cannot be read
/// is answered with INTERNAL TARGET FAILURE; a logical unit not presented here (the owner's
/// configuration differs) with an ALUA transition, so that the host tries again; one whose
/// targets here do not admit the initiator (`admits`: their ACLs) with LOGICAL UNIT NOT
/// SUPPORTED, as a target answers for a logical unit it does not present to that initiator.
pub fn run_forwarded(luns: &[Arc<Lun>], admits: &dyn Fn(&Lun, &str) -> bool, request: &[u8]) -> Vec<u8> {
    let f = match serde_json::from_slice::<Forwarded>(request) {
        Ok(f) if f.data.len() <= MAX_DATA && tessera_scsi::is_iscsi_name(&f.initiator) => f,
        _ => {
            warn!("a command forwarded by a standby gateway cannot be read: refused");
            return failed();
        }
    };
    let Some(lun) = luns.iter().find(|l| !is_standby(l) && hex(l.naa()) == f.naa) else {
        warn!(naa = %f.naa, "a standby gateway forwarded a command for a logical unit this owner does not present: the host is told to try again");
        return check(sense::ALUA_TRANSITION);
    };
    if !admits(lun, &f.initiator) {
        warn!(naa = %f.naa, initiator = %f.initiator, "a standby gateway forwarded a command for an initiator this owner's targets do not admit: refused");
        return check(sense::LUN_NOT_SUPPORTED);
    }
    answer(lun.execute_forwarded(&forwarded_nexus(&f.initiator, f.isid), &f.cdb, &f.data))
}

/// Unit attentions an owner's logical unit raised for initiator ports, as sent to the
/// other gateways.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Attentions {
    naa: String,
    /// Each initiator port, with the sense key, ASC and ASCQ of its unit attention.
    raised: Vec<(PortId, [u8; 3])>,
}

/// How the logical units of pool `pool` here reach its other gateways through `gateway`.
pub fn other_gateways(gateway: Arc<Membership>, pool: &str) -> OtherGateways {
    OtherGateways {
        owner: Arc::new(PoolForwarding {
            gateway: gateway.clone(),
            pool: pool.to_string(),
        }),
        attentions_out: attentions_out(gateway, pool.to_string()),
    }
}

/// How the owner of pool `pool` sends the unit attentions its logical units raise.
fn attentions_out(gateway: Arc<Membership>, pool: String) -> AttentionsOut {
    Box::new(move |naa, notices| {
        let a = Attentions {
            naa: hex(naa),
            raised: notices
                .iter()
                .map(|(p, s)| (p.clone(), [s.key, s.asc, s.ascq]))
                .collect(),
        };
        gateway.notify(&pool, serde_json::to_vec(&a).expect("plain data"));
    })
}

/// Queues at the standby ports among `luns` (the LUNs presented here of the pool the notice
/// is about) the unit attentions the owner's logical unit raised, as the owner sent them.
/// A notice that cannot be read, or whose attentions are no unit attentions, is dropped.
pub fn attentions_in(luns: &[Arc<Lun>], notice: &[u8]) {
    let a = match serde_json::from_slice::<Attentions>(notice) {
        Ok(a) if a.raised.len() <= 1024 && a.raised.iter().all(|(_, s)| s[0] == sense::key::UNIT_ATTENTION) => a,
        _ => {
            warn!("unit attentions another gateway sent cannot be read: dropped");
            return;
        }
    };
    let notices: Vec<(PortId, Sense)> = a
        .raised
        .into_iter()
        .map(|(p, [key, asc, ascq])| (p, Sense::new(key, asc, ascq)))
        .collect();
    for lun in luns.iter().filter(|l| is_standby(l) && hex(l.naa()) == a.naa) {
        lun.attentions_from_owner(&notices);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_scsi::RamBackend;

    /// An owner has the asker's whole first wait to take an ask and still run it, and an
    /// ask it runs is answered before its asker stops waiting.
    #[cfg(feature = "rados")]
    #[test]
    fn an_owner_runs_what_it_took_in_its_askers_first_wait_and_no_later() {
        let lives = tessera_ownership::courier::ask_lifetime(OWNER_ANSWERS_WITHIN);
        assert!(lives >= ASK_MUST_LAST + OWNER_ANSWERS_WITHIN, "{lives:?}");
        // Its asker waits until a second before the lease lapses on its clock, which may
        // run up to `ASKING_AT_MOST` ahead of etcd's: taken with `ASK_MUST_LAST` left,
        // started within `RUN_TAKEN_WITHIN`, answered within 5 s, the answer lands first.
        let asker_waits_after_taking = ASK_MUST_LAST
            .saturating_sub(tessera_ownership::courier::ASKING_AT_MOST + Duration::from_secs(1))
            .saturating_sub(Duration::from_secs(1));
        assert!(asker_waits_after_taking >= RUN_TAKEN_WITHIN + Duration::from_secs(5));
    }

    fn lun(uid: u128) -> Arc<Lun> {
        Arc::new(Lun::new(Arc::new(RamBackend::new("ram", 1 << 20, 512)), uid, false))
    }

    fn request(naa: &[u8; 16], initiator: &str, cdb: &[u8], data: &[u8]) -> Vec<u8> {
        serde_json::to_vec(&Forwarded {
            naa: hex(naa),
            initiator: initiator.into(),
            isid: [0x40, 0, 0, 0, 0, 2],
            cdb: cdb.to_vec(),
            data: data.to_vec(),
        })
        .unwrap()
    }

    fn answered(a: &[u8]) -> Answered {
        serde_json::from_slice(a).unwrap()
    }

    #[test]
    fn the_owner_runs_a_forwarded_registration_on_the_logical_unit_named_and_refuses_the_rest() {
        let (one, two) = (lun(1), lun(2));
        let luns = [one.clone(), two.clone()];
        let host = "iqn.2026-12.io.example:host2";
        let any = |_: &Lun, _: &str| true;
        let mut p = vec![0u8; 24];
        p[8..16].copy_from_slice(&0x2222u64.to_be_bytes());
        let register = [0x5F, 0, 0, 0, 0, 0, 0, 0, 24, 0];
        let a = answered(&run_forwarded(&luns, &any, &request(two.naa(), host, &register, &p)));
        assert_eq!((a.status, a.sense.len(), a.mode), (0, 0, None));
        let read_keys = [0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
        let keys = |l: &Lun| l.execute(&read_keys, &[]).data.to_vec();
        assert_eq!(&keys(&two)[4..16], &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x22, 0x22]);
        assert_eq!(&keys(&one)[4..8], &[0, 0, 0, 0], "the other logical unit untouched");
        // Read back through the owner, as the standby port's host sees it.
        let a = answered(&run_forwarded(&luns, &any, &request(two.naa(), host, &read_keys, &[])));
        assert_eq!(&a.data[8..16], &0x2222u64.to_be_bytes());
        // Not a reservation command; a logical unit not presented here; no iSCSI name;
        // nothing readable.
        let write = [0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        let a = answered(&run_forwarded(
            &luns,
            &any,
            &request(two.naa(), host, &write, &[0; 512]),
        ));
        assert_eq!((a.status, a.sense[2] & 0x0F, a.sense[12]), (2, 0x5, 0x20));
        let a = answered(&run_forwarded(
            &luns,
            &any,
            &request(lun(3).naa(), host, &read_keys, &[]),
        ));
        assert_eq!((a.sense[2] & 0x0F, a.sense[12], a.sense[13]), (0x2, 0x04, 0x0A));
        let a = answered(&run_forwarded(&luns, &any, &request(two.naa(), "", &read_keys, &[])));
        assert_eq!((a.sense[2] & 0x0F, a.sense[12]), (0x4, 0x44));
        let a = answered(&run_forwarded(&luns, &any, b"{\"naa\": 1}"));
        assert_eq!((a.sense[2] & 0x0F, a.sense[12]), (0x4, 0x44));
        assert_eq!(&keys(&two)[4..8], &[0, 0, 0, 8], "still the one key");

        // An initiator the owner's targets do not admit: refused, whatever the standby
        // gateway let in.
        let only_host2 = |_: &Lun, i: &str| i == host;
        let stranger = "iqn.2026-12.io.example:stranger";
        let mut p = vec![0u8; 24];
        p[8..16].copy_from_slice(&0x6666u64.to_be_bytes());
        for (cdb, data) in [(&register[..], &p[..]), (&read_keys[..], &[][..])] {
            let a = answered(&run_forwarded(
                &luns,
                &only_host2,
                &request(two.naa(), stranger, cdb, data),
            ));
            assert_eq!((a.status, a.sense[2] & 0x0F, a.sense[12]), (2, 0x5, 0x25));
        }
        assert_eq!(&keys(&two)[4..8], &[0, 0, 0, 8], "the stranger registered nothing");
        let a = answered(&run_forwarded(
            &luns,
            &only_host2,
            &request(two.naa(), host, &read_keys, &[]),
        ));
        assert_eq!((a.status, a.sense.len()), (0, 0));

        // A MODE SELECT (the write cache turned off) comes back with the settings it made.
        let caching = two.execute(&[0x1A, 0x08, 0x08, 0, 255, 0], &[]).data.to_vec();
        let mut off = vec![0u8; 4];
        off.extend_from_slice(&caching[4..]);
        off[4 + 2] &= !0x04;
        let select = [0x15, 0x10, 0, 0, off.len() as u8, 0];
        let a = answered(&run_forwarded(&luns, &any, &request(two.naa(), host, &select, &off)));
        assert_eq!((a.status, a.mode.map(|m| m.wce)), (0, Some(false)));
        assert!(!two.mode().wce);
    }

    /// An owner's answer is passed to the host as it is, fields a later owner may add
    /// passed over; one that cannot be read, or holds what no SCSI answer holds, is a
    /// command that may have run: INTERNAL TARGET FAILURE, never a transition the host
    /// would send it again for.
    #[test]
    fn an_answer_that_cannot_be_read_fails_the_command_rather_than_have_it_sent_again() {
        let conflict = response_to_host("tank", br#"{"status": 24, "sense": [], "data": [], "later": 1}"#);
        assert_eq!(
            (conflict.response.status, conflict.response.sense.len(), conflict.mode),
            (sense::RESERVATION_CONFLICT, 0, None)
        );
        let off = ModeState {
            wce: false,
            ..ModeState::default()
        };
        let good = response_to_host(
            "tank",
            &answer(OwnerAnswer {
                response: Response {
                    status: sense::GOOD,
                    data: vec![1, 2, 3].into(),
                    sense: Vec::new(),
                },
                mode: Some(off),
            }),
        );
        assert_eq!(
            (good.response.status, good.response.data.to_vec(), good.mode),
            (sense::GOOD, vec![1, 2, 3], Some(off))
        );
        // Settings that cannot be read are none: the command's answer stands.
        let unreadable_mode = response_to_host(
            "tank",
            br#"{"status": 0, "sense": [], "data": [], "mode": {"wce": "perhaps"}}"#,
        );
        assert_eq!(
            (unreadable_mode.response.status, unreadable_mode.mode),
            (sense::GOOD, None)
        );
        let failed = check(sense::INTERNAL_TARGET_FAILURE);
        let failed = serde_json::from_slice::<Answered>(&failed).unwrap();
        let huge_sense = format!(r#"{{"status": 2, "sense": {:?}, "data": []}}"#, vec![0x70u8; 300]);
        let huge_data = format!(r#"{{"status": 0, "sense": [], "data": {:?}}}"#, vec![0u8; MAX_DATA + 1]);
        for bad in [
            &b"not json"[..],
            br#"{"status": 2, "sense": [], "data": []}"#,
            br#"{"status": 0, "sense": [112, 0, 5], "data": []}"#,
            br#"{"status": 129, "sense": [], "data": []}"#,
            huge_sense.as_bytes(),
            huge_data.as_bytes(),
        ] {
            let r = response_to_host("tank", bad).response;
            assert_eq!(
                (r.status, &r.sense),
                (failed.status, &failed.sense),
                "{}",
                String::from_utf8_lossy(&bad[..bad.len().min(80)])
            );
        }
    }

    /// What the owner sends of the unit attentions it raised reaches the standby LUN of that
    /// logical unit only, for the sessions of the initiator port named only; a notice that
    /// names something other than a unit attention, or cannot be read, changes nothing.
    #[test]
    fn unit_attentions_an_owner_sent_reach_the_sessions_of_the_port_named_at_the_standby_lun() {
        use crate::standby::{standby_lun, tests::unit, PoolPorts};
        use tessera_scsi::AccessState;
        let ports = PoolPorts::new("gw-b", AccessState::Standby, Some("gw-a".into()), Arc::default());
        let standby = Arc::new(standby_lun(&unit(1 << 30, None), ports));
        let other = lun(9);
        let luns = [standby.clone(), other.clone()];
        let host = |i: u8| {
            Nexus::new(
                i as u64,
                &format!("iqn.2026-12.io.example:host{i}"),
                [0x40, 0, 0, 0, 0, i],
            )
        };
        let (h2, h3) = (host(2), host(3));
        let inquiry = [0x12, 0, 0, 0, 36, 0];
        let sense_at = |l: &Lun, n: &Nexus| {
            let r = l.execute_for(n, &[0u8; 6], &[]);
            (r.sense[2] & 0x0F, r.sense[12], r.sense[13])
        };
        for n in [&h2, &h3] {
            standby.execute_for(n, &inquiry, &[]);
            other.execute_for(n, &inquiry, &[]);
        }
        let notice = |naa: &[u8; 16], s: [u8; 3]| {
            serde_json::to_vec(&Attentions {
                naa: hex(naa),
                raised: vec![(PortId::of(&h2), s)],
            })
            .unwrap()
        };
        // Not a unit attention; unreadable; another logical unit's: nothing queued.
        attentions_in(&luns, &notice(standby.naa(), [0x5, 0x20, 0]));
        attentions_in(&luns, b"{}");
        attentions_in(&luns, &notice(lun(5).naa(), [0x6, 0x2A, 0x05]));
        assert_eq!(sense_at(&standby, &h2), (0x2, 0x04, 0x0B), "standby, nothing else");
        // REGISTRATIONS PREEMPTED for host 2: its session at the standby LUN hears it, once.
        attentions_in(&luns, &notice(standby.naa(), [0x6, 0x2A, 0x05]));
        assert_eq!(sense_at(&standby, &h2), (0x6, 0x2A, 0x05));
        assert_eq!(sense_at(&standby, &h2), (0x2, 0x04, 0x0B));
        assert_eq!(sense_at(&standby, &h3), (0x2, 0x04, 0x0B), "host 3 hears nothing");
        // A LUN served here (not standby) with that NAA id raises its own: none taken.
        attentions_in(&luns, &notice(other.naa(), [0x6, 0x2A, 0x05]));
        assert_eq!(other.execute_for(&h2, &[0u8; 6], &[]).status, 0);
    }
}
