//! WRITEs a transport starts on its own ring (`Lun::start_write`): a plain WRITE the backend
//! can plan is admitted without blocking and answered GOOD once its disk writes are done;
//! everything the ordinary path must decide (a unit attention to report, a reservation in
//! the way, a write-protected LUN, a standby port's takeover, data short of the CDB, a
//! backend that cannot plan) runs the ordinary way, with nothing written and no takeover
//! asked for. A write that must be durable when answered (FUA, the write cache off) is
//! planned too: the backend's disks complete a planned write once it is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tessera_scsi::{sense, AccessState, BlockBackend, Lun, Nexus, PortGroup, PortGroups, RamBackend, WriteStart};
use tessera_test_support::gated_ram::{Gated, GatedRam};

const MIB: u64 = 1 << 20;
const BS: usize = 512;

/// A LUN on a RAM backend whose writes can also be planned: one disk write straight into it,
/// at the same offset. Its gate stays open.
fn lun(read_only: bool) -> (Lun, Arc<GatedRam>) {
    let b = Arc::new(GatedRam::new("ram", 16 * MIB, BS as u32, Gated::Writes).planning_writes());
    (Lun::new(b.clone(), 0x42, read_only), b)
}

fn write10(lba: u32, blocks: u16, fua: bool) -> Vec<u8> {
    let mut c = vec![0x2A, if fua { 0x08 } else { 0 }, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = write10(lba, blocks, false);
    c[0] = 0x28;
    c
}

fn data(seed: u8, blocks: usize) -> Vec<u8> {
    (0..blocks * BS)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Does what a ring would: every submission's bytes to the backend's disk.
fn run(w: &tessera_scsi::PlannedWrite, data: &[u8], ram: &RamBackend) {
    for s in w.submissions(data) {
        // SAFETY: the submission points into `data`, which lives.
        let bytes = unsafe { std::slice::from_raw_parts(s.at, s.len as usize) };
        ram.write(s.offset, bytes, false).unwrap();
    }
}

#[test]
fn a_plain_write_is_planned_and_answered_once_its_disk_writes_are_done() {
    let (l, b) = lun(false);
    let n = Nexus::new(7, "iqn.2026-11.test:host", [0, 2, 0, 0, 0, 1]);
    let d = data(1, 8);
    let w = match l.start_write(&n, &write10(16, 8, false), &d) {
        WriteStart::Planned(w) => w,
        WriteStart::Execute => panic!("a plain WRITE(10) was not planned"),
    };
    let subs = w.submissions(&d);
    assert_eq!(subs.len(), 1);
    assert_eq!((subs[0].offset, subs[0].len as usize), (16 * BS as u64, d.len()));
    assert_eq!(
        subs[0].at,
        d.as_ptr(),
        "the submission does not read the command's data"
    );
    run(&w, &d, b.ram());
    assert_eq!(b.planned_finished(), 0, "finished before it was answered");
    let resp = w.into_response();
    assert_eq!(resp.status, sense::GOOD);
    assert_eq!(b.planned_finished(), 1);
    let back = l.execute(&read10(16, 8), &[]);
    assert_eq!(back.status, sense::GOOD);
    assert_eq!(back.data.to_vec(), d);
}

/// FUA, and every WRITE while the write cache is off, must be durable when answered: a
/// planned write is answered once its disk writes complete, which a backend plans only on
/// disks whose completions say the data is as durable as a flush makes it.
#[test]
fn writes_that_must_be_durable_when_answered_are_planned_too() {
    let (l, b) = lun(false);
    let n = Nexus::new(7, "iqn.2026-11.test:host", [0, 2, 0, 0, 0, 1]);
    let d = data(4, 8);
    let start = |l: &Lun, cdb: &[u8]| match l.start_write(&n, cdb, &d) {
        WriteStart::Planned(w) => w,
        WriteStart::Execute => panic!("not planned: {cdb:02x?}"),
    };
    let w = start(&l, &write10(16, 8, true));
    run(&w, &d, b.ram());
    assert_eq!(w.into_response().status, sense::GOOD);
    // The caching page with WCE off (MODE SELECT(6), from the page MODE SENSE gives).
    let page = l.execute_for(&n, &[0x1A, 0x08, 0x08, 0, 255, 0], &[]);
    assert_eq!(page.status, sense::GOOD);
    let mut list = vec![0u8; 4];
    list.extend_from_slice(&page.data.to_vec()[4..]);
    list[4] &= 0x3F;
    list[6] &= !0x04;
    let set = l.execute_for(&n, &[0x15, 0x10, 0, 0, list.len() as u8, 0], &list);
    assert_eq!(set.status, sense::GOOD);
    assert!(!l.mode().wce);
    let w = start(&l, &write10(32, 8, false));
    run(&w, &d, b.ram());
    assert_eq!(w.into_response().status, sense::GOOD);
    assert_eq!(b.planned_finished(), 2);
    assert_eq!(l.execute(&read10(32, 8), &[]).data.to_vec(), d);
}

#[test]
fn what_the_ordinary_path_must_decide_is_not_planned() {
    let n = Nexus::new(7, "iqn.2026-11.test:host", [0, 2, 0, 0, 0, 1]);
    let d = data(2, 8);
    let execute = |l: &Lun, cdb: &[u8], d: &[u8]| matches!(l.start_write(&n, cdb, d), WriteStart::Execute);
    let (l, _) = lun(false);
    assert!(
        execute(&l, &write10(16, 8, false), &d[..4 * BS]),
        "data short of the CDB"
    );
    assert!(execute(&l, &write10(16, 0, false), &[]), "no blocks");
    assert!(execute(&l, &write10(u32::MAX - 2, 8, false), &d), "past the end");
    let mut verify = write10(16, 8, false);
    verify[0] = 0x2E; // WRITE AND VERIFY (10)
    assert!(execute(&l, &verify, &d));
    // A unit attention waits for the nexus: reported by the ordinary path first.
    assert!(!execute(&l, &write10(16, 8, false), &d));
    l.unit_attention(sense::BUS_DEVICE_RESET_OCCURRED, None);
    assert!(execute(&l, &write10(16, 8, false), &d), "a unit attention was skipped");
    // A reservation of another nexus.
    let (l, _) = lun(false);
    let other = Nexus::new(8, "iqn.2026-11.test:other", [0, 2, 0, 0, 0, 2]);
    assert_eq!(l.execute_for(&other, &[0x16, 0, 0, 0, 0, 0], &[]).status, sense::GOOD);
    assert!(
        execute(&l, &write10(16, 8, false), &d),
        "a reservation conflict was planned"
    );
    // Write-protected.
    let (l, b) = lun(true);
    assert!(execute(&l, &write10(16, 8, false), &d));
    assert_eq!(b.planned_finished(), 0);
    // A backend that plans nothing.
    let ram = Lun::new(Arc::new(RamBackend::new("ram", 16 * MIB, BS as u32)), 0x43, false);
    assert!(execute(&ram, &write10(16, 8, false), &d));
}

/// A port in standby: the write must ask for the LUN, which only the ordinary path does.
#[test]
fn a_standby_port_plans_no_write_and_asks_for_nothing() {
    struct Standby(AtomicUsize);
    impl PortGroups for Standby {
        fn groups(&self) -> Vec<PortGroup> {
            vec![PortGroup {
                id: 1,
                state: AccessState::Standby,
                preferred: false,
                ports: vec![1],
            }]
        }
        fn local(&self) -> (u16, u16) {
            (1, 1)
        }
        fn local_state(&self) -> AccessState {
            AccessState::Standby
        }
        fn request_access(&self) -> AccessState {
            self.0.fetch_add(1, Ordering::SeqCst);
            AccessState::Standby
        }
    }
    let groups = Arc::new(Standby(AtomicUsize::new(0)));
    let (l, _) = lun(false);
    let l = l.with_port_groups(groups.clone());
    let n = Nexus::new(7, "iqn.2026-11.test:host", [0, 2, 0, 0, 0, 1]);
    let d = data(3, 8);
    assert!(matches!(
        l.start_write(&n, &write10(16, 8, false), &d),
        WriteStart::Execute
    ));
    assert_eq!(groups.0.load(Ordering::SeqCst), 0, "the planned path asked for access");
}
