//! Slabs that one slab set gave back and another took still hold the first set's bytes. Those
//! bytes are no data of the new set: until something writes them, its copies need not agree
//! and its parity need not match, and scrub must not report (or "repair") them. Everything
//! the new set's vdisks wrote reads back, and scrubs clean.

mod common;

use common::{pattern, spec, Rig, MIB};
use tessera_volume::{LayoutKind, Provisioning};

fn scrub_findings(rig: &Rig) -> Vec<String> {
    let e = rig.engine();
    e.layouts()
        .sets()
        .iter()
        .flat_map(|set| e.layouts().scrub_set(set).unwrap())
        .map(|m| format!("{m:?}"))
        .collect()
}

#[test]
fn sets_made_of_slabs_other_sets_gave_back_scrub_clean() {
    let rig = Rig::new(5, 24 * MIB, MIB);
    let e = rig.engine();
    let turns = [
        (LayoutKind::Mirror, LayoutKind::Parity),
        (LayoutKind::Parity, LayoutKind::Mirror),
        (LayoutKind::Parity, LayoutKind::DualParity),
        (LayoutKind::DualParity, LayoutKind::Parity),
    ];
    for (n, (old, new)) in turns.into_iter().enumerate() {
        // The old vdisk fills its slabs, and gives them back.
        e.create_vdisk(&spec("old", 8 * MIB, old, Provisioning::Thin)).unwrap();
        let v = e.vdisk("old").unwrap();
        v.write(0, &pattern(n as u64, 0, (8 * MIB) as usize), false).unwrap();
        v.flush().unwrap();
        e.delete_vdisk("old").unwrap();
        // The new one takes them (the lowest free slabs) and writes a little here and there.
        e.create_vdisk(&spec("new", 8 * MIB, new, Provisioning::Thin)).unwrap();
        let w = e.vdisk("new").unwrap();
        let bits = pattern(100 + n as u64, 0, 64 << 10);
        for at in [0, 3 * MIB + 4096, 7 * MIB] {
            w.write(at, &bits, false).unwrap();
        }
        w.flush().unwrap();
        let found = scrub_findings(&rig);
        assert!(found.is_empty(), "{new:?} on slabs {old:?} gave back: {found:#?}");
        let mut back = vec![0u8; 64 << 10];
        w.read(3 * MIB + 4096, &mut back).unwrap();
        assert_eq!(back, bits);
        e.delete_vdisk("new").unwrap();
    }
    rig.assert_consistent();
}
