//! Whole commands as an initiator sends them after login, into two logical units of one
//! target on RAM backends: every row of the command table (its usage mask applied or not, its
//! CDB cut short or padded) and garbage operation codes, with any data-out, from four
//! initiator ports in turn, so that reservations, tokens and copies made by one command meet
//! the next. Nothing may panic, every answer is a well-formed status, and the units answer
//! INQUIRY afterwards.
//!
//! An input is a sequence of commands, each 19 bytes and its data-out: the row (an index into
//! the table; past its end, the CDB's own first byte), flags (bit 0: apply the usage mask;
//! bits 1-2: the CDB length; bit 3: small transfer lengths; bits 4-5: the initiator port;
//! bit 6: the LUN), the data-out length in units of 8 bytes, then 16 CDB bytes.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tessera_scsi::{cdb_len, sense, CopyManager, Lun, LunScope, Nexus, RamBackend, Scope, COMMANDS};

const MIB: u64 = 1 << 20;

struct Target(Vec<Arc<Lun>>);

impl LunScope for Target {
    fn lun_by_naa(&self, naa: &[u8; 16]) -> Option<Arc<Lun>> {
        self.0.iter().find(|l| l.naa() == naa).cloned()
    }
}

fn cdb(row: u8, flags: u8, bytes: &[u8]) -> Vec<u8> {
    let (op, sa, usage) = match COMMANDS.get(row as usize) {
        Some(c) => (c.op, c.sa, c.usage),
        None => (bytes[0], None, &[][..]),
    };
    let n = cdb_len(op).unwrap_or(16);
    let len = match flags >> 1 & 3 {
        0 | 1 => n,
        2 => bytes[15] as usize % (n + 1),
        _ => 16,
    };
    let mut c = bytes[..len].to_vec();
    if flags & 1 != 0 {
        for (b, m) in c.iter_mut().zip(usage) {
            *b &= m;
        }
    }
    // Transfer lengths of a few blocks at most: the point is decoding and state, not moving
    // megabytes.
    if flags & 8 != 0 && len >= n && n >= 10 {
        let at = match n {
            10 => 7,
            12 => 6,
            _ => 10,
        };
        c[at..at + 2.min(n - at)].fill(0);
    }
    if let Some(first) = c.first_mut() {
        *first = op;
    }
    if let (Some(sa), Some(b)) = (sa, c.get_mut(1)) {
        *b = (*b & 0xE0) | sa;
    }
    c
}

fuzz_target!(|data: &[u8]| {
    let cm = Arc::new(CopyManager::new());
    let luns: Vec<Arc<Lun>> = (0..2)
        .map(|i| {
            let backend = Arc::new(RamBackend::new(&format!("ram{i}"), 4 * MIB, 512));
            Arc::new(Lun::new(backend, 0x100 + i as u128, false).with_copy_manager(cm.clone()))
        })
        .collect();
    let target = Arc::new(Target(luns.clone()));
    let nexuses: Vec<Nexus> = (0..4u8)
        .map(|i| {
            Nexus::new(1 + i as u64, &format!("iqn.2026-11.io.example:fuzz{}", i / 2), [0x40, 0, 0, 0, 0, i])
                .with_scope(Scope::of(&target))
        })
        .collect();
    let mut rest = data;
    while rest.len() >= 19 {
        let (head, tail) = rest.split_at(19);
        let (row, flags, len) = (head[0], head[1], head[2] as usize * 8);
        let data_out = &tail[..len.min(tail.len())];
        rest = &tail[data_out.len()..];
        let cdb = cdb(row, flags, &head[3..]);
        let lun = &luns[(flags >> 6 & 1) as usize];
        let resp = lun.execute_for(&nexuses[(flags >> 4 & 3) as usize], &cdb, data_out);
        match resp.status {
            sense::GOOD | sense::RESERVATION_CONFLICT => {}
            sense::CHECK_CONDITION => assert!(resp.sense.len() >= 8, "CHECK CONDITION without sense"),
            s => panic!("status {s:#x} for {cdb:02x?}"),
        }
    }
    // Still usable: INQUIRY is answered whatever reservations and attentions are pending.
    let fresh = Nexus::new(99, "iqn.2026-11.io.example:after", [0x40, 0, 0, 0, 0, 9]);
    for lun in &luns {
        let r = lun.execute_for(&fresh, &[0x12, 0, 0, 0, 36, 0], &[]);
        assert_eq!(r.status, sense::GOOD, "INQUIRY after the sequence");
    }
});
