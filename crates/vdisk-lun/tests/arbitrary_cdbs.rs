//! Whatever CDB and data an initiator sends, the logical unit answers with a well-formed
//! response and stays usable: every supported operation code, with fields inside and outside
//! what the command allows, CDBs cut short or padded, and garbage operation codes, on a
//! vdisk of the engine. (cargo fuzz drives the same decoders on a RAM backend: fuzz/, target
//! scsi_cdb.)

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tessera_scsi::sense;
use tessera_scsi::{cdb_len, Nexus, COMMANDS};
use tessera_test_support::{Disks, TestPool};
use tessera_vdisk_lun::vdisk_lun;
use tessera_volume::{LayoutKind, VdiskSpec};

const MIB: u64 = 1 << 20;

fn cases() -> u32 {
    std::env::var("TESSERA_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map(|n| n * 20)
        .unwrap_or(500)
}

/// A CDB for a supported operation: its usage mask applied or not, its length right or not.
fn cdb() -> impl Strategy<Value = Vec<u8>> {
    (
        0..COMMANDS.len() + 1,
        proptest::collection::vec(any::<u8>(), 32),
        any::<bool>(),
        0usize..4,
        any::<u8>(),
    )
        .prop_map(|(i, bytes, masked, len_kind, garbage_op)| {
            let (op, sa, usage) = match COMMANDS.get(i) {
                Some(o) => (o.op, o.sa, o.usage),
                None => (garbage_op, None, &[][..]),
            };
            let n = cdb_len(op).unwrap_or(16);
            let len = match len_kind {
                0 | 1 => n,
                2 => bytes[0] as usize % (n + 1),
                _ => n + 1 + bytes[1] as usize % 16,
            };
            let mut c: Vec<u8> = bytes.into_iter().cycle().take(len).collect();
            if masked {
                for (b, m) in c.iter_mut().zip(usage) {
                    *b &= m;
                }
                // Small transfers: the point is decoding, not moving megabytes.
                if n >= 10 && len >= n {
                    let at = if n == 10 {
                        7
                    } else if n == 12 {
                        6
                    } else {
                        10
                    };
                    c[at..at + 2.min(n - at)].fill(0);
                }
            }
            if let Some(first) = c.first_mut() {
                *first = op;
            }
            if let (Some(sa), Some(b)) = (sa, c.get_mut(1)) {
                *b = (*b & 0xE0) | sa;
            }
            c
        })
}

#[test]
fn arbitrary_cdbs_get_well_formed_answers() {
    let TestPool { dir: _dir, engine } = TestPool::new(Disks::Memory, 2, 96 * MIB);
    let v = engine
        .create_vdisk(&VdiskSpec::new("v", 16 * MIB, LayoutKind::Mirror))
        .unwrap();
    let lun = vdisk_lun(v, 0x42, false);
    let nexuses = [
        Nexus::local(),
        Nexus::new(7, "iqn.2026-11.io.example:other", [0, 0, 0, 0, 0, 1]),
    ];
    let good = std::cell::Cell::new(0u32);
    let check = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(cdb(), proptest::collection::vec(any::<u8>(), 0..9000), any::<bool>()),
            |(cdb, data, other)| {
                let r = lun.execute_for(&nexuses[other as usize], &cdb, &data);
                match r.status {
                    sense::GOOD => good.set(good.get() + 1),
                    sense::CHECK_CONDITION => check.set(check.get() + 1),
                    _ => {}
                }
                prop_assert!(
                    [sense::GOOD, sense::CHECK_CONDITION, sense::RESERVATION_CONFLICT].contains(&r.status),
                    "status {:#x} for {cdb:02x?}",
                    r.status
                );
                if r.status == sense::CHECK_CONDITION {
                    prop_assert!(!r.sense.is_empty(), "no sense for {cdb:02x?}");
                    prop_assert!([0x70, 0x72].contains(&(r.sense[0] & 0x7F)), "sense {:02x?}", r.sense);
                    prop_assert!(r.data.is_empty() || r.data.len() <= 16 << 20);
                } else {
                    prop_assert!(r.sense.is_empty());
                }
                Ok(())
            },
        )
        .unwrap();
    let (good, check) = (good.into_inner(), check.into_inner());
    eprintln!("{good} GOOD, {check} CHECK CONDITION");
    assert!(
        good > 0 && check > 0,
        "{good} GOOD and {check} CHECK CONDITION: the strategy misses one side"
    );
    // Still a working device: once the unit attentions the commands raised are read, it
    // answers TEST UNIT READY.
    let tur = [0x00, 0, 0, 0, 0, 0];
    let answered = (0..16).any(|_| {
        let r = lun.execute(&tur, &[]);
        r.status == sense::GOOD || r.status == sense::RESERVATION_CONFLICT
    });
    assert!(answered, "TEST UNIT READY keeps failing after the random commands");
}
