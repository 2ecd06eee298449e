//! WRITEs a transport starts on its own ring (`Lun::start_write`): a plain WRITE the backend
//! can plan is admitted without blocking and answered GOOD once its disk writes are done;
//! everything the ordinary path must decide (a unit attention to report, a reservation in
//! the way, a write-protected LUN, a standby port's takeover, data short of the CDB, a
//! backend that cannot plan) runs the ordinary way, with nothing written and no takeover
//! asked for. A write that must be durable when answered (FUA, the write cache off) is
//! planned too: the backend's disks complete a planned write once it is.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tessera_disk::{AsyncWriter, ReadDone};
use tessera_scsi::{
    sense, AccessState, BackendResult, BlockBackend, DirectWrite, Extent, FrozenImage, Lun, Nexus, PortGroup,
    PortGroups, RamBackend, WriteHold, WritePlan, WriteStart,
};

const MIB: u64 = 1 << 20;
const BS: usize = 512;

/// A RAM backend whose writes can also be planned: one disk write straight into it, at the
/// same offset.
struct Plannable {
    ram: Arc<RamBackend>,
    finished: Arc<AtomicUsize>,
}

struct IntoRam(Arc<RamBackend>);

impl AsyncWriter for IntoRam {
    unsafe fn start_write(&self, at: *const u8, len: u32, offset: u64, done: ReadDone) {
        // SAFETY: as the caller promises.
        let data = unsafe { std::slice::from_raw_parts(at, len as usize) };
        done.complete(self.0.write(offset, data, false).is_ok());
    }
}

struct Finished(Arc<AtomicUsize>);

impl WriteHold for Finished {
    fn finish(self: Box<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl BlockBackend for Plannable {
    fn name(&self) -> String {
        self.ram.name()
    }
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn physical_block_size(&self) -> u32 {
        self.ram.physical_block_size()
    }
    fn grain_size(&self) -> u64 {
        self.ram.grain_size()
    }
    fn thin(&self) -> bool {
        self.ram.thin()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> BackendResult<()> {
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], durable: bool) -> BackendResult<()> {
        self.ram.write(offset, data, durable)
    }
    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool, durable: bool) -> BackendResult<()> {
        self.ram.write_zeroes(offset, len, unmap, durable)
    }
    fn trim(&self, offset: u64, len: u64) -> BackendResult<()> {
        self.ram.trim(offset, len)
    }
    fn flush(&self) -> BackendResult<()> {
        self.ram.flush()
    }
    fn extents(&self, offset: u64, len: u64) -> BackendResult<Vec<Extent>> {
        self.ram.extents(offset, len)
    }
    fn freeze(&self, ranges: &[(u64, u64)]) -> BackendResult<Box<dyn FrozenImage>> {
        self.ram.freeze(ranges)
    }
    fn try_plan_write(&self, offset: u64, len: usize) -> Option<WritePlan> {
        Some(WritePlan {
            writes: vec![DirectWrite {
                writer: Arc::new(IntoRam(self.ram.clone())),
                offset,
                buf_off: 0,
                len,
                io: None,
            }],
            hold: Box::new(Finished(self.finished.clone())),
        })
    }
}

fn lun(read_only: bool) -> (Lun, Arc<AtomicUsize>, Arc<RamBackend>) {
    let finished = Arc::new(AtomicUsize::new(0));
    let ram = Arc::new(RamBackend::new("ram", 16 * MIB, BS as u32));
    let b = Plannable {
        ram: ram.clone(),
        finished: finished.clone(),
    };
    (Lun::new(Arc::new(b), 0x42, read_only), finished, ram)
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
    let (l, finished, ram) = lun(false);
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
    run(&w, &d, &ram);
    assert_eq!(finished.load(Ordering::SeqCst), 0, "finished before it was answered");
    let resp = w.into_response();
    assert_eq!(resp.status, sense::GOOD);
    assert_eq!(finished.load(Ordering::SeqCst), 1);
    let back = l.execute(&read10(16, 8), &[]);
    assert_eq!(back.status, sense::GOOD);
    assert_eq!(back.data.to_vec(), d);
}

/// FUA, and every WRITE while the write cache is off, must be durable when answered: a
/// planned write is answered once its disk writes complete, which a backend plans only on
/// disks whose completions say the data is as durable as a flush makes it.
#[test]
fn writes_that_must_be_durable_when_answered_are_planned_too() {
    let (l, finished, ram) = lun(false);
    let n = Nexus::new(7, "iqn.2026-11.test:host", [0, 2, 0, 0, 0, 1]);
    let d = data(4, 8);
    let start = |l: &Lun, cdb: &[u8]| match l.start_write(&n, cdb, &d) {
        WriteStart::Planned(w) => w,
        WriteStart::Execute => panic!("not planned: {cdb:02x?}"),
    };
    let w = start(&l, &write10(16, 8, true));
    run(&w, &d, &ram);
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
    run(&w, &d, &ram);
    assert_eq!(w.into_response().status, sense::GOOD);
    assert_eq!(finished.load(Ordering::SeqCst), 2);
    assert_eq!(l.execute(&read10(32, 8), &[]).data.to_vec(), d);
}

#[test]
fn what_the_ordinary_path_must_decide_is_not_planned() {
    let n = Nexus::new(7, "iqn.2026-11.test:host", [0, 2, 0, 0, 0, 1]);
    let d = data(2, 8);
    let execute = |l: &Lun, cdb: &[u8], d: &[u8]| matches!(l.start_write(&n, cdb, d), WriteStart::Execute);
    let (l, _, _) = lun(false);
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
    let (l, _, _) = lun(false);
    let other = Nexus::new(8, "iqn.2026-11.test:other", [0, 2, 0, 0, 0, 2]);
    assert_eq!(l.execute_for(&other, &[0x16, 0, 0, 0, 0, 0], &[]).status, sense::GOOD);
    assert!(
        execute(&l, &write10(16, 8, false), &d),
        "a reservation conflict was planned"
    );
    // Write-protected.
    let (l, finished, _) = lun(true);
    assert!(execute(&l, &write10(16, 8, false), &d));
    assert_eq!(finished.load(Ordering::SeqCst), 0);
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
    let (l, _, _) = lun(false);
    let l = l.with_port_groups(groups.clone());
    let n = Nexus::new(7, "iqn.2026-11.test:host", [0, 2, 0, 0, 0, 1]);
    let d = data(3, 8);
    assert!(matches!(
        l.start_write(&n, &write10(16, 8, false), &d),
        WriteStart::Execute
    ));
    assert_eq!(groups.0.load(Ordering::SeqCst), 0, "the planned path asked for access");
}
