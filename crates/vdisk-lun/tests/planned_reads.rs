//! READs a transport runs on a ring of its own (`Lun::start_read`): admitted as an ordinary
//! READ is, never blocking, holding what an ordinary READ holds until the data has arrived.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_disk::{io_uring_available, skip, ReadRing};
use tessera_scsi::sense::{self, key};
use tessera_scsi::{Lun, Nexus, PlannedRead, ReadStart, Response};
use tessera_test_support::{Disks, TestPool};
use tessera_vdisk_lun::vdisk_lun;
use tessera_volume::{Engine, LayoutKind, VdiskSpec};

const MIB: u64 = 1 << 20;
const BS: u64 = 4096;

struct Rig {
    _dir: tempfile::TempDir,
    _engine: Engine,
    lun: Arc<Lun>,
}

/// A 16 MiB mirrored LUN of 4 KiB blocks, on file disks or in memory.
fn rig(files: bool) -> Rig {
    let kind = if files { Disks::Files } else { Disks::Memory };
    let TestPool { dir, engine } = TestPool::new(kind, 3, 64 * MIB);
    let mut spec = VdiskSpec::new("v", 16 * MIB, LayoutKind::Mirror);
    spec.block_size = Some(BS as u32);
    spec.grain_size = Some(64 << 10);
    let v = engine.create_vdisk(&spec).unwrap();
    Rig {
        _dir: dir,
        _engine: engine,
        lun: Arc::new(vdisk_lun(v, 0x77, false)),
    }
}

fn nexus(id: u64) -> Nexus {
    Nexus::new(
        id,
        &format!("iqn.2026-11.io.example:host-{id}"),
        [0, 0, 0, 0, 0, id as u8],
    )
}

fn cdb16(op: u8, lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read16(lba: u64, blocks: u32) -> Vec<u8> {
    cdb16(0x88, lba, blocks)
}

fn good(r: &Response) {
    assert_eq!(r.status, sense::GOOD, "sense {:02x?}", r.sense);
}

/// Runs a planned READ's disk reads on a ring and answers it.
fn complete(mut p: PlannedRead) -> Response {
    let mut ring = ReadRing::new(8).expect("io_uring");
    let reads = p.submissions();
    // SAFETY: the reads fill p's buffer, which the ring holds until they complete.
    unsafe { ring.start(p, &reads) };
    let mut done = Vec::new();
    ring.drain(&mut done);
    let (p, ok) = done.pop().unwrap();
    assert!(ok, "a disk read failed");
    p.into_response()
}

#[test]
fn a_planned_read_returns_what_an_ordinary_read_does() {
    if !io_uring_available() {
        skip(
            "a_planned_read_returns_what_an_ordinary_read_does",
            "io_uring unavailable",
        );
        return;
    }
    let r = rig(true);
    let n = nexus(1);
    // Data in grains 1 and 3 of four; grains 0 and 2 stay unmapped.
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
    for grain in [1u64, 3] {
        good(&r.lun.execute_for(&n, &cdb16(0x8A, grain * 16, 16), &data));
    }
    for (lba, blocks) in [(0u64, 64u32), (16, 16), (20, 3), (8, 40)] {
        let cdb = read16(lba, blocks);
        let ReadStart::Planned(p) = r.lun.start_read(&n, &cdb) else {
            panic!("{blocks} blocks at {lba}: not planned");
        };
        let planned = complete(p);
        let ordinary = r.lun.execute_for(&n, &cdb, &[]);
        good(&planned);
        assert_eq!(planned, ordinary, "{blocks} blocks at {lba}");
    }
}

#[test]
fn reads_that_need_no_disk_are_answered_at_once() {
    let r = rig(true);
    let n = nexus(1);
    let answer = |cdb: Vec<u8>| match r.lun.start_read(&n, &cdb) {
        ReadStart::Answer(resp) => resp,
        ReadStart::Planned(_) => panic!("planned"),
        ReadStart::Execute => panic!("sent the ordinary way"),
    };
    // Past the end: LBA OUT OF RANGE, as the ordinary path says.
    let past = answer(read16(16 * MIB / BS - 1, 2));
    assert_eq!(past.status, sense::CHECK_CONDITION);
    assert_eq!(past, r.lun.execute_for(&n, &read16(16 * MIB / BS - 1, 2), &[]));
    assert_eq!((past.sense[2] & 0x0F, past.sense[12]), (key::ILLEGAL_REQUEST, 0x21));
    // No blocks, and unmapped blocks only.
    let none = answer(read16(0, 0));
    good(&none);
    assert!(none.data.is_empty());
    let zeros = answer(read16(100, 8));
    good(&zeros);
    assert_eq!(&zeros.data[..], &vec![0u8; 8 * BS as usize][..]);
}

#[test]
fn what_would_wait_or_must_be_reported_goes_the_ordinary_way() {
    let r = rig(true);
    let n = nexus(1);
    good(&r.lun.execute_for(&n, &cdb16(0x8A, 0, 1), &[5u8; BS as usize]));
    // A unit attention waiting for the nexus is reported by the ordinary path.
    r.lun.reset(2);
    assert!(matches!(r.lun.start_read(&n, &read16(0, 1)), ReadStart::Execute));
    let ua = r.lun.execute_for(&n, &read16(0, 1), &[]);
    assert_eq!(ua.status, sense::CHECK_CONDITION);
    assert_eq!(ua.sense[2] & 0x0F, key::UNIT_ATTENTION);
    // Disks in memory take no reads from a caller's ring.
    let m = rig(false);
    good(&m.lun.execute_for(&n, &cdb16(0x8A, 0, 1), &[5u8; BS as usize]));
    assert!(matches!(m.lun.start_read(&n, &read16(0, 1)), ReadStart::Execute));
}

/// PERSISTENT RESERVE OUT, REGISTER with `key`: it takes the LUN's fence exclusively.
fn register(lun: &Lun, n: &Nexus, key: u64) -> Response {
    let mut cdb = vec![0u8; 10];
    cdb[0] = 0x5F;
    cdb[8] = 24;
    let mut params = vec![0u8; 24];
    params[8..16].copy_from_slice(&key.to_be_bytes());
    lun.execute_for(n, &cdb, &params)
}

#[test]
fn a_reservation_change_waits_for_planned_reads_and_new_ones_wait_for_it() {
    if !io_uring_available() {
        skip(
            "a_reservation_change_waits_for_planned_reads_and_new_ones_wait_for_it",
            "io_uring unavailable",
        );
        return;
    }
    let r = rig(true);
    let n = nexus(1);
    good(&r.lun.execute_for(&n, &cdb16(0x8A, 0, 1), &[9u8; BS as usize]));
    let ReadStart::Planned(held) = r.lun.start_read(&n, &read16(0, 1)) else {
        panic!("not planned");
    };
    let changer = {
        let lun = r.lun.clone();
        std::thread::spawn(move || register(&lun, &nexus(2), 0xABC))
    };
    // While the change waits for the fence, a new READ is not admitted on the ring (it
    // would make the change wait longer); it goes the ordinary way, which waits its turn.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match r.lun.start_read(&n, &read16(0, 1)) {
            ReadStart::Execute => break,
            ReadStart::Planned(p) => drop(p),
            ReadStart::Answer(a) => panic!("answered: {a:?}"),
        }
        assert!(Instant::now() < deadline, "the reservation change never waited");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !changer.is_finished(),
        "the change ran while a planned read held the fence"
    );
    let resp = complete(held);
    good(&resp);
    assert_eq!(&resp.data[..], &[9u8; BS as usize][..]);
    good(&changer.join().unwrap());
    assert!(matches!(r.lun.start_read(&n, &read16(0, 1)), ReadStart::Planned(_)));
}
