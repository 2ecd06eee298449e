//! The file system behind a pool's disks fills up, as it does under sparse file disks: a write
//! that needs space nobody has reserved fails with the pool's out-of-space error (which hosts
//! see as a thin pool out of space), nothing of it is written, no disk is failed for it, and
//! once there is room again the same write goes through and everything reads back.

mod common;

use common::*;
use tessera_volume::{DiskState, LayoutKind, Provisioning};

fn all_healthy(rig: &Rig) -> bool {
    rig.engine()
        .pool()
        .disks()
        .iter()
        .all(|d| d.info.state == DiskState::Healthy)
}

#[test]
fn a_full_file_system_refuses_new_space_as_out_of_space_and_fails_no_disk() {
    for kind in [LayoutKind::Simple, LayoutKind::Mirror, LayoutKind::Parity] {
        let rig = Rig::new(4, 64 * MIB, 4 * MIB);
        let v = rig
            .engine()
            .create_vdisk(&spec("v", 24 * MIB, kind, Provisioning::Thin))
            .unwrap();
        let first = pattern(1, 0, (2 * MIB) as usize);
        v.write(0, &first, true).unwrap();
        for d in &rig.disks {
            d.faults().fill(true);
        }

        // Where the data lies already, its space is held: overwrites go through.
        let over = pattern(2, 0, 64 << 10);
        v.write(0, &over, true).unwrap();

        // New space cannot be had: refused as out of space, before anything is written.
        let writes_before: u64 = rig.disks.iter().map(|d| d.faults().writes()).sum();
        let far = pattern(3, 16 * MIB, (1 * MIB) as usize);
        let err = v.write(16 * MIB, &far, true).unwrap_err();
        assert!(err.is_no_space(), "{kind:?}: {err}");
        assert!(err.to_string().contains("is full"), "{kind:?}: {err}");
        let writes_after: u64 = rig.disks.iter().map(|d| d.faults().writes()).sum();
        assert_eq!(writes_before, writes_after, "{kind:?}: a refused write reached a disk");
        assert!(all_healthy(&rig), "{kind:?}: a full file system failed a disk");

        // What was written reads back, old and overwritten alike.
        let mut b = vec![0u8; first.len()];
        v.read(0, &mut b).unwrap();
        assert_eq!(&b[..over.len()], &over[..], "{kind:?}");
        assert_eq!(&b[over.len()..], &first[over.len()..], "{kind:?}");

        // Room again: the same write goes through.
        for d in &rig.disks {
            d.faults().fill(false);
        }
        v.write(16 * MIB, &far, true).unwrap();
        let mut b = vec![0u8; far.len()];
        v.read(16 * MIB, &mut b).unwrap();
        assert_eq!(b, far, "{kind:?}");
        assert!(all_healthy(&rig), "{kind:?}");
        rig.engine().flush().unwrap();
        rig.assert_consistent();
    }
}
