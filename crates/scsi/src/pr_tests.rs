//! The reservation rules, one service action and type at a time (pr.rs).

use super::*;

/// A LUN served by one daemon: one target port.
const ONE_PORT: &TargetPorts = &TargetPorts::One(RELATIVE_TARGET_PORT);

fn nexus(id: u64, name: &str, isid: u8) -> Nexus {
    Nexus::new(id, name, [0x40, 0, 0, 0, 0, isid])
}

fn out_cdb(sa: u8, kind: u8) -> [u8; 10] {
    [0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0]
}

fn params(key: u64, sa_key: u64, flags: u8) -> Vec<u8> {
    let mut d = vec![0u8; 24];
    d[0..8].copy_from_slice(&key.to_be_bytes());
    d[8..16].copy_from_slice(&sa_key.to_be_bytes());
    d[20] = flags;
    d
}

fn run(s: &mut PrState, n: &Nexus, sa: u8, kind: u8, key: u64, sa_key: u64) -> (Outcome, Notices) {
    let mut notes = Vec::new();
    let o = s.pr_out(n, &out_cdb(sa, kind), &params(key, sa_key, 0), ONE_PORT, &mut notes);
    (o, notes)
}

/// A REGISTER AND MOVE of the holder's reservation (WRITE EXCLUSIVE) to `dest` through
/// relative port `port`: its CDB and parameter list.
fn move_to(key: u64, sa_key: u64, flags: u8, port: u16, dest: &PortId) -> ([u8; 10], Vec<u8>) {
    let tid = dest.transport_id();
    let mut m = vec![0u8; 24];
    m[0..8].copy_from_slice(&key.to_be_bytes());
    m[8..16].copy_from_slice(&sa_key.to_be_bytes());
    m[17] = flags;
    m[18..20].copy_from_slice(&port.to_be_bytes());
    m[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
    m.extend_from_slice(&tid);
    let mut cdb = out_cdb(7, WRITE_EXCLUSIVE);
    cdb[5..9].copy_from_slice(&(m.len() as u32).to_be_bytes());
    (cdb, m)
}

#[test]
fn register_reserve_release_and_access() {
    let (a, b, c) = (nexus(1, "iqn.x:a", 1), nexus(2, "iqn.x:b", 1), nexus(3, "iqn.x:c", 1));
    let mut s = PrState::default();
    assert_eq!(
        run(&mut s, &a, 0, 0, 5, 0xA).0,
        Outcome::Conflict,
        "REGISTER with a key while unregistered"
    );
    assert_eq!(run(&mut s, &a, 0, 0, 0, 0xA).0, Outcome::Good);
    assert_eq!(run(&mut s, &b, 6, 0, 0, 0xB).0, Outcome::Good);
    assert_eq!(s.generation, 2);
    assert_eq!(
        run(&mut s, &a, 1, WRITE_EXCLUSIVE, 0xB, 0).0,
        Outcome::Conflict,
        "wrong key"
    );
    assert_eq!(
        run(&mut s, &c, 1, WRITE_EXCLUSIVE, 0, 0).0,
        Outcome::Conflict,
        "unregistered"
    );
    assert_eq!(run(&mut s, &a, 1, WRITE_EXCLUSIVE, 0xA, 0).0, Outcome::Good);
    assert_eq!(
        run(&mut s, &a, 1, WRITE_EXCLUSIVE, 0xA, 0).0,
        Outcome::Good,
        "same again"
    );
    assert_eq!(
        run(&mut s, &a, 1, EXCLUSIVE_ACCESS, 0xA, 0).0,
        Outcome::Conflict,
        "another type"
    );
    assert_eq!(run(&mut s, &b, 1, WRITE_EXCLUSIVE, 0xB, 0).0, Outcome::Conflict);
    assert_eq!(s.generation, 2, "RESERVE leaves the generation alone");
    assert!(s.allows(&a, Access::Write));
    assert!(s.allows(&b, Access::Read) && !s.allows(&b, Access::Write));
    assert!(s.allows(&c, Access::Always));
    // A release of the wrong type is an error; by a non-holder, a no-op.
    assert_eq!(
        run(&mut s, &a, 2, EXCLUSIVE_ACCESS, 0xA, 0).0,
        Outcome::Check(INVALID_RELEASE)
    );
    assert_eq!(run(&mut s, &b, 2, WRITE_EXCLUSIVE, 0xB, 0).0, Outcome::Good);
    assert!(s.reservation.is_some());
    assert_eq!(run(&mut s, &a, 2, WRITE_EXCLUSIVE, 0xA, 0).0, Outcome::Good);
    assert!(s.reservation.is_none() && s.allows(&c, Access::Write));
}

#[test]
fn access_by_type_matches_spc4() {
    // (type, registered non-holder read, write, unregistered read, write)
    let table = [
        (EXCLUSIVE_ACCESS, false, false, false, false),
        (WRITE_EXCLUSIVE, true, false, true, false),
        (EXCLUSIVE_ACCESS_REGISTRANTS_ONLY, true, true, false, false),
        (WRITE_EXCLUSIVE_REGISTRANTS_ONLY, true, true, true, false),
        (EXCLUSIVE_ACCESS_ALL_REGISTRANTS, true, true, false, false),
        (WRITE_EXCLUSIVE_ALL_REGISTRANTS, true, true, true, false),
    ];
    for (kind, rr, rw, ur, uw) in table {
        let (a, b, c) = (nexus(1, "iqn.x:a", 1), nexus(2, "iqn.x:b", 1), nexus(3, "iqn.x:c", 1));
        let mut s = PrState::default();
        run(&mut s, &a, 6, 0, 0, 1);
        run(&mut s, &b, 6, 0, 0, 2);
        assert_eq!(run(&mut s, &a, 1, kind, 1, 0).0, Outcome::Good);
        assert_eq!(s.allows(&b, Access::Read), rr, "type {kind}");
        assert_eq!(s.allows(&b, Access::Write), rw, "type {kind}");
        assert_eq!(s.allows(&c, Access::Read), ur, "type {kind}");
        assert_eq!(s.allows(&c, Access::Write), uw, "type {kind}");
        // The holder unregistering releases all but the all-registrants types.
        run(&mut s, &a, 0, 0, 1, 0);
        assert_eq!(s.reservation.is_some(), all_registrants(kind), "type {kind}");
    }
}

#[test]
fn preempt_clear_and_notices() {
    let (a, b) = (nexus(1, "iqn.x:a", 1), nexus(2, "iqn.x:b", 1));
    let mut s = PrState::default();
    run(&mut s, &a, 6, 0, 0, 1);
    run(&mut s, &b, 6, 0, 0, 2);
    // Without a reservation PREEMPT removes the registrations with the key.
    let (o, notes) = run(&mut s, &b, 4, EXCLUSIVE_ACCESS, 2, 1);
    assert_eq!(o, Outcome::Good);
    assert_eq!(s.registrations.len(), 1);
    assert_eq!(notes, vec![(PortId::of(&a), REGISTRATIONS_PREEMPTED)]);
    assert_eq!(
        run(&mut s, &b, 4, EXCLUSIVE_ACCESS, 2, 9).0,
        Outcome::Conflict,
        "no such key"
    );
    assert_eq!(
        run(&mut s, &b, 4, EXCLUSIVE_ACCESS, 2, 0).0,
        Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST)
    );
    // Preempting the holder takes its reservation.
    run(&mut s, &a, 6, 0, 0, 1);
    run(&mut s, &a, 1, WRITE_EXCLUSIVE, 1, 0);
    let (o, _) = run(&mut s, &b, 5, EXCLUSIVE_ACCESS, 2, 1);
    assert_eq!(o, Outcome::Good);
    assert_eq!(
        s.reservation,
        Some(Reservation {
            holder: PortId::of(&b),
            kind: EXCLUSIVE_ACCESS
        })
    );
    assert!(!s.allows(&a, Access::Read));
    // CLEAR drops everything and tells the others.
    run(&mut s, &a, 6, 0, 0, 1);
    let gen = s.generation;
    let (o, notes) = run(&mut s, &b, 3, 0, 2, 0);
    assert_eq!(o, Outcome::Good);
    assert!(s.registrations.is_empty() && s.reservation.is_none());
    assert_eq!(s.generation, gen + 1);
    assert_eq!(notes, vec![(PortId::of(&a), RESERVATIONS_PREEMPTED)]);
}

#[test]
fn read_keys_reservation_caps_and_full_status() {
    let a = nexus(1, "iqn.x:a", 7);
    let mut s = PrState::default();
    run(&mut s, &a, 6, 0, 0, 0x1122);
    run(&mut s, &a, 1, EXCLUSIVE_ACCESS_REGISTRANTS_ONLY, 0x1122, 0);
    let keys = s.pr_in(&[0x5E, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], ONE_PORT).unwrap();
    assert_eq!(&keys[4..8], &8u32.to_be_bytes());
    assert_eq!(be64(&keys[8..16]), 0x1122);
    let res = s.pr_in(&[0x5E, 1, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], ONE_PORT).unwrap();
    assert_eq!(be64(&res[8..16]), 0x1122);
    assert_eq!(res[21], EXCLUSIVE_ACCESS_REGISTRANTS_ONLY);
    let caps = s.pr_in(&[0x5E, 2, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], ONE_PORT).unwrap();
    assert_eq!(caps.len(), 8);
    let full = s.pr_in(&[0x5E, 3, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], ONE_PORT).unwrap();
    assert_eq!(full[8 + 12] & 1, 1, "R_HOLDER");
    let tid = &full[8 + 24..];
    let (port, _) = PortId::parse_transport_id(tid).unwrap();
    assert_eq!(port, PortId::of(&a));
    assert_eq!(full[8 + 12] & 2, 0, "ALL_TG_PT: one target port");
    assert_eq!(be16(&full[8 + 18..8 + 20]), RELATIVE_TARGET_PORT as u64);
    // Through gateways the registration holds at each, even at a gateway that is alone
    // now: reported as ALL_TG_PT.
    for ports in [vec![0x11, 0x2345], vec![0x2345]] {
        let full = s
            .pr_in(&[0x5E, 3, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], &TargetPorts::Gateways(ports))
            .unwrap();
        assert_eq!(full[8 + 12] & 3, 3, "ALL_TG_PT and R_HOLDER");
        assert_eq!(be16(&full[8 + 18..8 + 20]), 0);
    }
    assert!(s.pr_in(&[0x5E, 4, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], ONE_PORT).is_err());
}

#[test]
fn iscsi_names_that_could_mislead_are_not_names() {
    assert!(is_iscsi_name("iqn.2026-12.io.example:host-a"));
    assert!(is_iscsi_name("eui.02004567A425678D"));
    assert!(
        is_iscsi_name("iqn.2026-12.jp.example:ホスト"),
        "other scripts are names"
    );
    for bad in [
        "",
        "iqn.x:a b",
        "iqn.x:a\tb",
        "iqn.x:\u{200b}a",
        "iqn.x:\u{2066}a",
        "iqn.x:\u{feff}",
    ] {
        assert!(!is_iscsi_name(bad), "{bad:?}");
    }
    assert!(!is_iscsi_name(&"n".repeat(224)));
}

#[test]
fn register_and_move_and_spec_i_pt() {
    let (a, b) = (nexus(1, "iqn.x:a", 1), nexus(2, "iqn.x:b", 2));
    let mut s = PrState::default();
    // SPEC_I_PT registers another port in the same command.
    let mut d = params(0, 0x10, 0x08);
    let tid = PortId::of(&b).transport_id();
    d.extend_from_slice(&(tid.len() as u32).to_be_bytes());
    d.extend_from_slice(&tid);
    let mut cdb = out_cdb(0, 0);
    cdb[5..9].copy_from_slice(&(d.len() as u32).to_be_bytes());
    let mut notes = Vec::new();
    assert_eq!(s.pr_out(&a, &cdb, &d, ONE_PORT, &mut notes), Outcome::Good);
    assert_eq!(s.registrations.len(), 2);
    assert!(s.registration(&b).is_some());
    // a reserves, then moves the reservation to b with a new key, unregistering itself.
    run(&mut s, &a, 1, WRITE_EXCLUSIVE, 0x10, 0);
    let (cdb, m) = move_to(0x10, 0x20, 0x02, RELATIVE_TARGET_PORT, &PortId::of(&b));
    // The relative port must be one the LUN is reached through.
    let gateways = &TargetPorts::Gateways(vec![0x11, 0x2345]);
    assert_eq!(
        s.pr_out(&a, &cdb, &m, gateways, &mut notes),
        Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST)
    );
    assert!(s.holds(&a));
    let (cdb, m) = move_to(0x10, 0x20, 0x02, 0x2345, &PortId::of(&b));
    assert_eq!(
        s.pr_out(&a, &cdb, &m, ONE_PORT, &mut notes),
        Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST)
    );
    assert_eq!(s.pr_out(&a, &cdb, &m, gateways, &mut notes), Outcome::Good);
    assert!(s.registration(&a).is_none());
    assert_eq!(s.registrations[s.registration(&b).unwrap()].key, 0x20);
    assert!(s.holds(&b) && !s.allows(&a, Access::Write));
}

#[test]
fn register_and_move_to_a_new_port_counts_it_among_the_registrations() {
    let a = nexus(1, "iqn.x:a", 1);
    let mut s = PrState::default();
    run(&mut s, &a, 0, 0, 0, 0x10);
    run(&mut s, &a, 1, WRITE_EXCLUSIVE, 0x10, 0);
    let r = s.registrations[0].clone();
    s.registrations.extend((1..MAX_REGISTRATIONS).map(|i| Registration {
        port: PortId::of(&nexus(9, &format!("iqn.x:other{i}"), 9)),
        ..r.clone()
    }));
    s.check().unwrap();
    let port = |name: &str| PortId::of(&nexus(9, name, 9));
    let mut notes = Vec::new();
    // Full: a move to a port not registered, the holder staying, would be one too many.
    let (cdb, m) = move_to(0x10, 0x20, 0, RELATIVE_TARGET_PORT, &port("iqn.x:new"));
    assert_eq!(
        s.pr_out(&a, &cdb, &m, ONE_PORT, &mut notes),
        Outcome::Check(INSUFFICIENT_REGISTRATION_RESOURCES)
    );
    assert!(s.holds(&a));
    s.check().unwrap();
    // To a port already registered, or leaving (UNREG): as many as before.
    let (cdb, m) = move_to(0x10, 0x20, 0, RELATIVE_TARGET_PORT, &port("iqn.x:other7"));
    assert_eq!(s.pr_out(&a, &cdb, &m, ONE_PORT, &mut notes), Outcome::Good);
    s.check().unwrap();
    let b = nexus(9, "iqn.x:other7", 9);
    let (cdb, m) = move_to(0x20, 0x30, 0x02, RELATIVE_TARGET_PORT, &port("iqn.x:new"));
    assert_eq!(s.pr_out(&b, &cdb, &m, ONE_PORT, &mut notes), Outcome::Good);
    assert_eq!(s.registrations.len(), MAX_REGISTRATIONS);
    s.check().unwrap();
}

#[test]
fn malformed_parameter_lists_change_nothing() {
    let a = nexus(1, "iqn.x:a", 1);
    let mut s = PrState::default();
    let mut notes = Vec::new();
    let mut cdb = out_cdb(0, 0);
    cdb[8] = 16;
    assert_eq!(
        s.pr_out(&a, &cdb, &[0; 16], ONE_PORT, &mut notes),
        Outcome::Check(sense::PARAMETER_LIST_LENGTH_ERROR)
    );
    assert_eq!(
        s.pr_out(&a, &out_cdb(9, 0), &params(0, 1, 0), ONE_PORT, &mut notes),
        Outcome::Check(sense::INVALID_FIELD_IN_CDB)
    );
    // SPEC_I_PT naming ports no login could have: a name too long, with a line break, empty,
    // one written right to left from its middle (to look like another).
    for name in [
        "iqn.x:".to_string() + &"n".repeat(300),
        "iqn.x:b\nforged".into(),
        String::new(),
        "iqn.x:\u{202e}a:x.nqi".into(),
    ] {
        let b = Nexus::new(2, &name, [0x40, 0, 0, 0, 0, 2]);
        let mut d = params(0, 0x10, 0x08);
        let tid = PortId::of(&b).transport_id();
        d.extend_from_slice(&(tid.len() as u32).to_be_bytes());
        d.extend_from_slice(&tid);
        let mut cdb = out_cdb(0, 0);
        cdb[5..9].copy_from_slice(&(d.len() as u32).to_be_bytes());
        assert_eq!(
            s.pr_out(&a, &cdb, &d, ONE_PORT, &mut notes),
            Outcome::Check(sense::INVALID_FIELD_IN_PARAMETER_LIST),
            "{name:?}"
        );
        assert!(s.registrations.is_empty());
    }
    // SPEC_I_PT with a truncated TransportID.
    let mut d = params(0, 1, 0x08);
    d.extend_from_slice(&[0, 0, 0, 30, 0x45, 0, 0, 26]);
    let mut cdb = out_cdb(0, 0);
    cdb[8] = d.len() as u8;
    assert_ne!(s.pr_out(&a, &cdb, &d, ONE_PORT, &mut notes), Outcome::Good);
    // A reservation with a bad scope or type.
    run(&mut s, &a, 6, 0, 0, 1);
    let gen = s.generation;
    assert_eq!(
        run(&mut s, &a, 1, 0x12, 1, 0).0,
        Outcome::Check(sense::INVALID_FIELD_IN_CDB)
    );
    assert_eq!(
        run(&mut s, &a, 1, 2, 1, 0).0,
        Outcome::Check(sense::INVALID_FIELD_IN_CDB)
    );
    assert_eq!(s.generation, gen);
    assert!(s.reservation.is_none());
}

#[test]
fn spc2_reservations() {
    let (a, b) = (nexus(1, "iqn.x:a", 1), nexus(2, "iqn.x:b", 1));
    let s = PrState::default();
    let mut holder = None;
    assert_eq!(legacy(&s, &mut holder, &a, &[RESERVE_6, 0, 0, 0, 0, 0]), Outcome::Good);
    assert_eq!(legacy(&s, &mut holder, &a, &[RESERVE_6, 0, 0, 0, 0, 0]), Outcome::Good);
    assert_eq!(
        legacy(&s, &mut holder, &b, &[RESERVE_6, 0, 0, 0, 0, 0]),
        Outcome::Conflict
    );
    assert_eq!(legacy(&s, &mut holder, &b, &[RELEASE_6, 0, 0, 0, 0, 0]), Outcome::Good);
    assert_eq!(holder, Some(1));
    assert_eq!(legacy(&s, &mut holder, &a, &[RELEASE_6, 0, 0, 0, 0, 0]), Outcome::Good);
    assert_eq!(holder, None);
    let mut r10 = [RESERVE_10, 0x10, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(
        legacy(&s, &mut holder, &a, &r10),
        Outcome::Check(sense::INVALID_FIELD_IN_CDB)
    );
    r10[1] = 0;
    assert_eq!(legacy(&s, &mut holder, &b, &r10), Outcome::Good);
    // Persistent registrations and SPC-2 reservations do not mix.
    let mut p = PrState::default();
    run(&mut p, &a, 6, 0, 0, 1);
    let mut none = None;
    assert_eq!(
        legacy(&p, &mut none, &a, &[RESERVE_6, 0, 0, 0, 0, 0]),
        Outcome::Conflict
    );
}

#[test]
fn a_state_no_commands_make_is_refused_when_read_back() {
    let a = nexus(1, "iqn.x:a", 1);
    let mut s = PrState::default();
    let mut notes = Vec::new();
    s.pr_out(&a, &out_cdb(6, 0), &params(0, 7, 0x01), ONE_PORT, &mut notes);
    run(&mut s, &a, 1, EXCLUSIVE_ACCESS, 7, 0);
    s.check().unwrap();
    let broken = |f: &dyn Fn(&mut PrState)| {
        let mut b = s.clone();
        f(&mut b);
        b.check().unwrap_err()
    };
    let e = broken(&|b| b.registrations[0].port.initiator = format!("iqn.x:{}", "a".repeat(70_000)));
    assert!(e.contains("no iSCSI name"), "{e}");
    let e = broken(&|b| b.registrations.push(b.registrations[0].clone()));
    assert!(e.contains("registered twice"), "{e}");
    let e = broken(&|b| b.reservation.as_mut().unwrap().kind = 2);
    assert!(e.contains("type 2"), "{e}");
    let e = broken(&|b| b.reservation.as_mut().unwrap().holder.initiator = "iqn.x:b".into());
    assert!(e.contains("no registered port"), "{e}");
    let e = broken(&|b| {
        let r = b.registrations[0].clone();
        b.registrations = (0..=MAX_REGISTRATIONS)
            .map(|i| Registration {
                port: PortId {
                    initiator: format!("iqn.x:{i}"),
                    ..r.port.clone()
                },
                ..r.clone()
            })
            .collect();
    });
    assert!(e.contains("more than"), "{e}");
    PrState::default().check().unwrap();
}

#[test]
fn state_round_trips_through_json() {
    let a = nexus(1, "iqn.x:a", 1);
    let mut s = PrState::default();
    let mut notes = Vec::new();
    s.pr_out(&a, &out_cdb(6, 0), &params(0, 7, 0x01), ONE_PORT, &mut notes);
    run(&mut s, &a, 1, EXCLUSIVE_ACCESS, 7, 0);
    let j = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<PrState>(&j).unwrap(), s);
    assert!(s.aptpl);
}
