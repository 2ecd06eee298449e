//! Deleting a vdisk while writes are in flight: the delete waits for them (or they fail), so no
//! grain is mapped to the vdisk after it is gone, and a vdisk made later, even after a restart,
//! never shows the deleted one's data.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{pattern, spec, Rig, MIB};
use tessera_volume::{LayoutKind, Provisioning, VolumeError};

const SIZE: u64 = 16 * MIB;
const GRAIN: u64 = 16 << 10;

#[test]
fn a_delete_fences_the_writes_in_flight_and_ids_are_never_reused() {
    let mut rig = Rig::new(3, 256 * MIB, MIB);
    for round in 0..8u64 {
        let v = rig
            .engine()
            .create_vdisk(&spec("victim", SIZE, LayoutKind::Mirror, Provisioning::Thin))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let (v, stop) = (v.clone(), stop.clone());
                sc.spawn(move || {
                    // First writes of fresh grains: each allocates and commits a map entry.
                    let mut g = t;
                    while !stop.load(Ordering::Relaxed) && g < SIZE / GRAIN {
                        match v.write(g * GRAIN, &pattern(round + 1, g * GRAIN, GRAIN as usize), false) {
                            Ok(()) => {}
                            Err(VolumeError::Deleted(_)) => break,
                            Err(e) => panic!("write failed with {e}"),
                        }
                        g += 4;
                    }
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(5 + round * 3));
            rig.engine().delete_vdisk("victim").unwrap();
            stop.store(true, Ordering::Relaxed);
        });
        let victim_id = v.id();
        drop(v);
        let report = rig.engine().check().unwrap();
        assert!(
            report.problems.is_empty(),
            "round {round}: a write mapped a grain after the delete: {:#?}",
            report.problems
        );
        // Restart, and make a vdisk of the same size: it must read as zeros everywhere.
        rig.reopen();
        let fresh = rig
            .engine()
            .create_vdisk(&spec("fresh", SIZE, LayoutKind::Mirror, Provisioning::Thin))
            .unwrap();
        let mut b = vec![0u8; SIZE as usize];
        fresh.read(0, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == 0),
            "round {round}: a new vdisk shows a deleted vdisk's data"
        );
        assert_eq!(fresh.allocated_bytes(), 0, "round {round}");
        assert!(
            fresh.id() > victim_id,
            "round {round}: id {} of a deleted vdisk given again after a restart",
            victim_id
        );
        drop(fresh);
        rig.engine().delete_vdisk("fresh").unwrap();
    }
}
