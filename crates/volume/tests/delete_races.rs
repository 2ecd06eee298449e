//! Deleting a vdisk while writes are in flight: the delete waits for them (or they fail), so no
//! grain is mapped to the vdisk after it is gone, and a vdisk made later, even after a restart,
//! never shows the deleted one's data.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{pattern, spec, Rig, MIB};
use tessera_volume::{LayoutKind, Provisioning, VolumeError};

const SIZE: u64 = 16 * MIB;
const GRAIN: u64 = 16 << 10;

/// A freeze (of a snapshot, a clone, a POPULATE TOKEN) that found the vdisk alive, then waited
/// for a write in flight while the vdisk was deleted, is refused once it has the gate: the
/// delete unmaps the grains once it has had the gate, and the freeze would count references
/// on slots being freed, some freed already, their slab set perhaps given back under the
/// image. Before, it went on, and whether it had the gate before or after the delete, made
/// an image of a deleted vdisk.
#[test]
fn a_freeze_that_waited_for_a_write_while_its_vdisk_was_deleted_is_refused() {
    let rig = Rig::new(3, 256 * MIB, MIB);
    let v = rig
        .engine()
        .create_vdisk(&spec("victim", SIZE, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    v.write(0, &pattern(1, 0, SIZE as usize), false).unwrap();
    for d in &rig.disks {
        d.faults().set_latency(Duration::from_millis(600));
    }
    let pause = || std::thread::sleep(Duration::from_millis(100));
    std::thread::scope(|sc| {
        // Holds the vdisk's gate (shared) while its disks take their time.
        let slow = sc.spawn(|| v.write(0, &pattern(2, 0, GRAIN as usize), false));
        pause();
        let freeze = sc.spawn(|| v.freeze(&[(0, SIZE)]).map(drop));
        pause();
        let delete = sc.spawn(|| rig.engine().delete_vdisk("victim"));
        slow.join().unwrap().unwrap();
        let frozen = freeze.join().unwrap();
        assert!(matches!(frozen, Err(VolumeError::Deleted(_))), "{frozen:?}");
        delete.join().unwrap().unwrap();
    });
    for d in &rig.disks {
        d.faults().set_latency(Duration::ZERO);
    }
    drop(v);
    let report = rig.engine().check().unwrap();
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
}

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
