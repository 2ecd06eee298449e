//! The command table is the one place a command is described: these tests hold dispatch,
//! the reservation rules, REPORT SUPPORTED OPERATION CODES and VPD page 0x8F to it, on a RAM
//! backend (no engine needed).

use std::sync::Arc;

use tessera_scsi::{cdb_len, lookup, sense, Access, Lun, Nexus, RamBackend, COMMANDS};

const MIB: u64 = 1 << 20;

fn lun() -> Lun {
    Lun::new(Arc::new(RamBackend::new("ram", 4 * MIB, 512)), 7, false)
}

fn nexus(id: u64) -> Nexus {
    Nexus::new(
        id,
        &format!("iqn.2026-11.io.example:host{id}"),
        [0x40, 0, 0, 0, 0, id as u8],
    )
}

/// A CDB of the row's size naming its operation code and service action, every other field
/// zero (no blocks, no allocation length, no parameter list).
fn bare_cdb(op: u8, sa: Option<u8>) -> Vec<u8> {
    let mut c = vec![0u8; cdb_len(op).unwrap_or(16)];
    c[0] = op;
    if let Some(sa) = sa {
        c[1] = sa;
    }
    c
}

fn is_reservation_command(op: u8) -> bool {
    matches!(op, 0x16 | 0x17 | 0x56 | 0x57 | 0x5E | 0x5F)
}

/// The sense key and additional sense code of a CHECK CONDITION (fixed format).
fn asc(r: &tessera_scsi::Response) -> Option<(u8, u8)> {
    (r.status == sense::CHECK_CONDITION).then(|| (r.sense[2] & 0x0F, r.sense[12]))
}

/// Takes the unit attentions waiting for a nexus (REQUEST SENSE returns one each, whatever
/// reservation another nexus holds).
fn settle(lun: &Lun, n: &Nexus) {
    for _ in 0..16 {
        let r = lun.execute_for(n, &[0x03, 0, 0, 0, 18, 0], &[]);
        assert_eq!(r.status, sense::GOOD);
        if r.data[2] & 0x0F != sense::key::UNIT_ATTENTION {
            return;
        }
    }
    panic!("unit attentions without end");
}

#[test]
fn every_row_is_dispatched_and_every_other_opcode_is_refused() {
    let lun = lun();
    let n = nexus(1);
    settle(&lun, &n);
    for c in COMMANDS {
        let r = lun.execute_for(&n, &bare_cdb(c.op, c.sa), &[]);
        // REPORT LUNS is the transport's: a LUN alone cannot answer it.
        let refused = asc(&r) == Some((sense::key::ILLEGAL_REQUEST, 0x20));
        assert_eq!(refused, c.op == tessera_scsi::REPORT_LUNS, "{}: {r:?}", c.name);
    }
    for op in 0..=255u8 {
        if COMMANDS.iter().any(|c| c.op == op) {
            continue;
        }
        let r = lun.execute_for(&n, &bare_cdb(op, None), &[]);
        assert_eq!(asc(&r), Some((sense::key::ILLEGAL_REQUEST, 0x20)), "opcode {op:#04x}");
        assert!(lookup(&bare_cdb(op, None)).is_err(), "opcode {op:#04x}");
    }
}

#[test]
fn a_persistent_reservation_lets_through_what_the_table_says() {
    let lun = lun();
    let (holder, other) = (nexus(1), nexus(2));
    settle(&lun, &holder);
    settle(&lun, &other);
    let mut key = vec![0u8; 24];
    key[8..16].copy_from_slice(&0xABu64.to_be_bytes());
    let register = [0x5F, 0x00, 0, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(lun.execute_for(&holder, &register, &key).status, sense::GOOD);
    let mut reserve_key = vec![0u8; 24];
    reserve_key[0..8].copy_from_slice(&0xABu64.to_be_bytes());
    // WRITE EXCLUSIVE: others may read, not write.
    let reserve = [0x5F, 0x01, 0x01, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(lun.execute_for(&holder, &reserve, &reserve_key).status, sense::GOOD);
    settle(&lun, &other);
    for c in COMMANDS.iter().filter(|c| !is_reservation_command(c.op)) {
        settle(&lun, &other);
        let r = lun.execute_for(&other, &bare_cdb(c.op, c.sa), &[]);
        let conflict = r.status == sense::RESERVATION_CONFLICT;
        assert_eq!(conflict, c.access == Access::Write, "{} ({:?})", c.name, c.access);
        let r = lun.execute_for(&holder, &bare_cdb(c.op, c.sa), &[]);
        assert_ne!(r.status, sense::RESERVATION_CONFLICT, "{} for the holder", c.name);
    }
}

#[test]
fn an_spc2_reservation_lets_through_what_the_table_says() {
    let lun = lun();
    let (holder, other) = (nexus(1), nexus(2));
    settle(&lun, &holder);
    settle(&lun, &other);
    assert_eq!(
        lun.execute_for(&holder, &[0x16, 0, 0, 0, 0, 0], &[]).status,
        sense::GOOD
    );
    for c in COMMANDS.iter().filter(|c| !is_reservation_command(c.op)) {
        settle(&lun, &other);
        let r = lun.execute_for(&other, &bare_cdb(c.op, c.sa), &[]);
        assert_eq!(r.status == sense::RESERVATION_CONFLICT, !c.legacy_ok, "{}", c.name);
    }
}

#[test]
fn report_supported_operation_codes_lists_the_table() {
    let lun = lun();
    let n = nexus(1);
    settle(&lun, &n);
    // All commands, no timeouts descriptors: 8 bytes per command after a 4-byte header.
    let r = lun.execute_for(&n, &[0xA3, 0x0C, 0x00, 0, 0, 0, 0, 0, 0x40, 0, 0, 0], &[]);
    assert_eq!(r.status, sense::GOOD);
    let d = r.data.to_vec();
    let listed: Vec<(u8, Option<u8>, usize)> = d[4..]
        .chunks_exact(8)
        .map(|e| {
            (
                e[0],
                (e[5] & 1 != 0).then_some(e[3]),
                u16::from_be_bytes([e[6], e[7]]) as usize,
            )
        })
        .collect();
    let table: Vec<(u8, Option<u8>, usize)> = COMMANDS.iter().map(|c| (c.op, c.sa, c.usage.len())).collect();
    assert_eq!(listed, table);
    // One command: its usage data is the row's mask.
    for c in COMMANDS {
        let (options, sa) = match c.sa {
            Some(sa) => (2, sa),
            None => (1, 0),
        };
        let cdb = [0xA3, 0x0C, options, c.op, 0, sa, 0, 0, 1, 0, 0, 0];
        let d = lun.execute_for(&n, &cdb, &[]).data.to_vec();
        assert_eq!(d[1] & 0x07, 0x03, "{} supported", c.name);
        assert_eq!(&d[4..], c.usage, "{}", c.name);
        // The service action is 16 bits: one past 0xFF is none of ours, whatever its low byte.
        if let Some(sa) = c.sa {
            let cdb = [0xA3, 0x0C, 2, c.op, 1, sa, 0, 0, 1, 0, 0, 0];
            let d = lun.execute_for(&n, &cdb, &[]).data.to_vec();
            assert_eq!(
                d[1] & 0x07,
                0x01,
                "{} with service action {:#x}",
                c.name,
                0x100 | sa as u16
            );
        }
    }
}

#[test]
fn vpd_third_party_copy_lists_the_tables_copy_commands() {
    let lun = lun();
    let n = nexus(1);
    settle(&lun, &n);
    let page = lun.execute_for(&n, &[0x12, 0x01, 0x8F, 0x10, 0, 0], &[]).data.to_vec();
    // Find the Supported Commands descriptor (type 0x0001).
    let mut at = 4;
    let body = loop {
        let kind = u16::from_be_bytes([page[at], page[at + 1]]);
        let len = u16::from_be_bytes([page[at + 2], page[at + 3]]) as usize;
        if kind == 0x0001 {
            break &page[at + 4..at + 4 + len];
        }
        at += 4 + len;
    };
    let mut listed = Vec::new();
    let list = &body[1..1 + body[0] as usize];
    let mut i = 0;
    while i < list.len() {
        let (op, n) = (list[i], list[i + 1] as usize);
        listed.extend(list[i + 2..i + 2 + n].iter().map(|&sa| (op, sa)));
        i += 2 + n;
    }
    let table: Vec<(u8, u8)> = COMMANDS
        .iter()
        .filter(|c| c.third_party_copy())
        .map(|c| (c.op, c.sa.expect("copy commands have service actions")))
        .collect();
    assert_eq!(listed, table);
}

#[test]
fn report_timestamp_gives_the_hosts_clock_and_honours_the_allocation_length() {
    let lun = lun();
    let n = nexus(1);
    settle(&lun, &n);
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let before = now();
    let r = lun.execute_for(&n, &[0xA3, 0x0F, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0], &[]);
    let after = now();
    assert_eq!(r.status, sense::GOOD);
    let d = r.data.to_vec();
    assert_eq!(d.len(), 12);
    assert_eq!(u16::from_be_bytes([d[0], d[1]]), 10, "parameter data length");
    assert_eq!(d[2] & 0x07, 0b011, "set outside SCSI");
    let mut ms = [0u8; 8];
    ms[2..].copy_from_slice(&d[4..10]);
    let ms = u64::from_be_bytes(ms);
    assert!((before..=after).contains(&ms), "{before} <= {ms} <= {after}");
    // A short allocation length truncates; none returns nothing.
    let r = lun.execute_for(&n, &[0xA3, 0x0F, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0], &[]);
    assert_eq!((r.status, r.data.len()), (sense::GOOD, 4));
    let r = lun.execute_for(&n, &[0xA3, 0x0F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!((r.status, r.data.len()), (sense::GOOD, 0));
}
