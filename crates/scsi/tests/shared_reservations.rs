//! Persistent reservations of a LUN that several gateways present in turn: every change is
//! saved before the command completes, with or without APTPL, so that the LUN built on the
//! next gateway from what was saved goes on where the last one stopped; a change that cannot
//! be saved fails and leaves the reservations as they were. Each host's first command at the
//! new gateway is told the logical unit was started there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tessera_scsi::{sense, Lun, Nexus, PrState, PrStore, RamBackend};
use tessera_test_support::cdbs::pr_out;

const MIB: u64 = 1 << 20;

fn nexus(id: u64) -> Nexus {
    Nexus::new(
        id,
        &format!("iqn.2026-11.io.example:node{id}"),
        [0x40, 0, 0, 0, 0, id as u8],
    )
}

const REGISTER_AND_IGNORE: u8 = 6;
const RESERVE: u8 = 1;
const WRITE_EXCLUSIVE_REGISTRANTS_ONLY: u8 = 5;

/// What a gateway's store holds: the last state saved (None once forgotten), and whether
/// saving fails.
#[derive(Default)]
struct Saved {
    state: Mutex<Option<PrState>>,
    saves: Mutex<usize>,
    failing: AtomicBool,
}

fn store(saved: &Arc<Saved>) -> PrStore {
    let saved = saved.clone();
    Box::new(move |s| {
        if saved.failing.load(Ordering::SeqCst) {
            return Err("the cluster refused the write".into());
        }
        *saved.state.lock().unwrap() = s.cloned();
        *saved.saves.lock().unwrap() += 1;
        Ok(())
    })
}

/// The LUN as a gateway presents it, from what the last one saved.
fn presented(saved: &Arc<Saved>) -> Lun {
    let state = saved.state.lock().unwrap().clone().unwrap_or_default();
    Lun::new(Arc::new(RamBackend::new("ram", 4 * MIB, 512)), 7, false).with_shared_reservations(state, store(saved))
}

fn write10(lba: u32) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = 0x2A;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[8] = 1;
    c
}

#[test]
fn every_change_is_saved_without_aptpl_and_the_next_gateway_goes_on_from_it() {
    let saved = Arc::new(Saved::default());
    let a = presented(&saved);
    let (n1, n2) = (nexus(1), nexus(2));
    let (cdb, p) = pr_out(REGISTER_AND_IGNORE, 0, 0, 0x1111, false);
    assert_eq!(a.execute_for(&n1, &cdb, &p).status, 0);
    assert_eq!(*saved.saves.lock().unwrap(), 1, "saved though APTPL is off");
    let (cdb, p) = pr_out(RESERVE, WRITE_EXCLUSIVE_REGISTRANTS_ONLY, 0x1111, 0, false);
    assert_eq!(a.execute_for(&n1, &cdb, &p).status, 0);
    let kept = saved.state.lock().unwrap().clone().expect("saved");
    assert_eq!(kept.registrations.len(), 1);
    assert_eq!(
        kept.reservation.as_ref().map(|r| r.kind),
        Some(WRITE_EXCLUSIVE_REGISTRANTS_ONLY)
    );
    assert!(!kept.aptpl);
    // PTPL_C: the LUN can keep its reservations.
    let caps = a.execute_for(&n1, &[0x5E, 2, 0, 0, 0, 0, 0, 0, 8, 0], &[]);
    assert_eq!(caps.data[2] & 0x01, 0x01, "{:?}", caps.data);

    // The gateway is gone; the next one presents the LUN from what was saved.
    drop(a);
    let b = presented(&saved);
    assert_eq!(
        b.execute_for(&n2, &write10(3), &[0; 512]).status,
        sense::RESERVATION_CONFLICT,
        "an unregistered node is kept out on the new gateway"
    );
    assert_eq!(
        b.execute_for(&n1, &write10(3), &[0; 512]).status,
        0,
        "the holder writes"
    );
    let keys = b.execute_for(&n2, &[0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]);
    assert_eq!(&keys.data[8..16], &0x1111u64.to_be_bytes());

    // A change the store refuses fails and changes nothing, here or on the next gateway.
    saved.failing.store(true, Ordering::SeqCst);
    let (cdb, p) = pr_out(REGISTER_AND_IGNORE, 0, 0, 0x2222, false);
    let r = b.execute_for(&n2, &cdb, &p);
    assert_eq!(r.status, sense::CHECK_CONDITION);
    assert_eq!(
        (r.sense[2] & 0x0F, r.sense[12]),
        (0x04, 0x44),
        "internal target failure"
    );
    saved.failing.store(false, Ordering::SeqCst);
    let keys = b.execute_for(&n2, &[0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]);
    assert_eq!(&keys.data[4..8], &8u32.to_be_bytes(), "still one key here");
    assert_eq!(saved.state.lock().unwrap().as_ref().unwrap().registrations.len(), 1);

    // Unregistering (REGISTER with a zero key) and releasing are saved too: nothing is left.
    let (cdb, p) = pr_out(REGISTER_AND_IGNORE, 0, 0, 0, false);
    assert_eq!(b.execute_for(&n1, &cdb, &p).status, 0);
    let left = saved.state.lock().unwrap().clone().expect("saved, not forgotten");
    assert!(left.registrations.is_empty() && left.reservation.is_none(), "{left:?}");
    assert_eq!(presented(&saved).execute_for(&n2, &write10(3), &[0; 512]).status, 0);
}

#[test]
fn every_nexus_first_hears_that_the_unit_was_started_here_and_then_finds_the_reservation() {
    let saved = Arc::new(Saved::default());
    let a = presented(&saved);
    let (n1, n2) = (nexus(1), nexus(2));
    let (cdb, p) = pr_out(REGISTER_AND_IGNORE, 0, 0, 0x1111, false);
    assert_eq!(a.execute_for(&n1, &cdb, &p).status, 0);
    let (cdb, p) = pr_out(RESERVE, WRITE_EXCLUSIVE_REGISTRANTS_ONLY, 0x1111, 0, false);
    assert_eq!(a.execute_for(&n1, &cdb, &p).status, 0);
    drop(a);
    let b = presented(&saved).with_first_contact_attention(sense::POWER_ON_OCCURRED);
    let tur = [0u8; 6];
    for n in [&n1, &n2] {
        let r = b.execute_for(n, &tur, &[]);
        assert_eq!(
            (r.status, r.sense[2] & 0x0F, r.sense[12], r.sense[13]),
            (sense::CHECK_CONDITION, 0x06, 0x29, 0x00),
            "the first command of nexus {}",
            n.id
        );
        assert_eq!(b.execute_for(n, &tur, &[]).status, 0, "told once");
    }
    assert_eq!(
        b.execute_for(&n2, &write10(1), &[0; 512]).status,
        sense::RESERVATION_CONFLICT
    );
    assert_eq!(b.execute_for(&n1, &write10(1), &[0; 512]).status, 0);
}

/// A LUN taken out of one target while another still presents it: the sessions of the first
/// can no longer address it, so the SPC-2 reservation one of them held there ends (no
/// command of it could release it), and the other target's hosts are not refused for ever.
#[test]
fn a_reservation_held_through_a_target_that_no_longer_presents_the_lun_ends() {
    let lun = Lun::new(Arc::new(RamBackend::new("ram", 4 * MIB, 512)), 7, false);
    let (through_removed, through_other) = (nexus(1), nexus(2));
    const RESERVE_6: [u8; 6] = [0x16, 0, 0, 0, 0, 0];
    assert_eq!(lun.execute_for(&through_removed, &RESERVE_6, &[]).status, 0);
    assert_eq!(
        lun.execute_for(&through_other, &write10(3), &[0; 512]).status,
        sense::RESERVATION_CONFLICT
    );
    // Another session's being cut off changes nothing.
    lun.unreachable_from(through_other.id);
    assert_eq!(
        lun.execute_for(&through_other, &write10(3), &[0; 512]).status,
        sense::RESERVATION_CONFLICT
    );
    lun.unreachable_from(through_removed.id);
    assert_eq!(lun.execute_for(&through_other, &write10(3), &[0; 512]).status, 0);
    assert_eq!(lun.execute_for(&through_other, &RESERVE_6, &[]).status, 0);
}
