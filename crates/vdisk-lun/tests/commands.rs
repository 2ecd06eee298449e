//! SCSI commands against a real engine on in-memory disks: what an initiator sends, what it
//! must get back.

use std::sync::Arc;

use tessera_scsi::sense::{self, key};
use tessera_scsi::{report_luns, Data, Lun, Nexus, Response};
use tessera_test_support::{Disks, TestPool};
use tessera_vdisk_lun::{vdisk_lun, vdisk_of};
use tessera_volume::{Engine, LayoutKind, Provisioning, VdiskSpec};

const MIB: u64 = 1 << 20;

struct Rig {
    _dir: tempfile::TempDir,
    _engine: Engine,
}

fn rig(block_size: u32, size: u64, fixed: bool) -> (Rig, Lun) {
    rig_with(block_size, size, |spec| {
        if fixed {
            spec.provisioning = Provisioning::Fixed;
        }
    })
}

fn rig_with(block_size: u32, size: u64, tweak: impl FnOnce(&mut VdiskSpec)) -> (Rig, Lun) {
    let TestPool { dir, engine } = TestPool::new(Disks::Memory, 3, 64 * MIB);
    let mut spec = VdiskSpec::new("v", size, LayoutKind::Mirror);
    spec.block_size = Some(block_size);
    spec.grain_size = Some(64 << 10);
    tweak(&mut spec);
    let v = engine.create_vdisk(&spec).unwrap();
    let lun = vdisk_lun(v, 0x1234_5678_9abc_def0_1122_3344_5566_7788, false);
    (
        Rig {
            _dir: dir,
            _engine: engine,
        },
        lun,
    )
}

fn ok(r: Response) -> Vec<u8> {
    assert_eq!(r.status, sense::GOOD, "sense {:02x?}", r.sense);
    r.data.to_vec()
}

/// Sense key, ASC, ASCQ of a CHECK CONDITION in fixed format.
fn check(r: Response) -> (u8, u8, u8) {
    assert_eq!(
        r.status,
        sense::CHECK_CONDITION,
        "expected a check condition, got data {:?}",
        r.data.len()
    );
    (r.sense[2] & 0x0F, r.sense[12], r.sense[13])
}

fn cdb16(op: u8, flags: u8, lba: u64, n: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&n.to_be_bytes());
    c
}

fn cdb10(op: u8, flags: u8, lba: u32, n: u16) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = op;
    c[1] = flags;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&n.to_be_bytes());
    c
}

#[test]
fn inquiry_and_vpd() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let d = ok(lun.execute(&[0x12, 0, 0, 0, 96, 0], &[]));
    assert_eq!(&d[8..16], b"TESSERA ");
    assert_eq!(d[4] as usize, d.len() - 5);
    assert_eq!(d[5] & 0x30, 0x10, "implicit ALUA");
    let pages = ok(lun.execute(&[0x12, 1, 0, 0, 255, 0], &[]));
    assert_eq!(&pages[4..], &[0x00, 0x80, 0x83, 0x8F, 0xB0, 0xB1, 0xB2]);
    for p in [0x80u8, 0x83, 0x8F, 0xB0, 0xB1, 0xB2] {
        let d = ok(lun.execute(&[0x12, 1, p, 0x10, 0, 0], &[]));
        assert_eq!(d[1], p);
        assert_eq!(u16::from_be_bytes([d[2], d[3]]) as usize, d.len() - 4);
    }
    let id = ok(lun.execute(&[0x12, 1, 0x83, 0, 255, 0], &[]));
    assert_eq!(
        (id[4] & 0x0F, id[5] & 0x0F, id[7]),
        (1, 3, 16),
        "first designator: binary NAA of 16 bytes"
    );
    assert_eq!(id[8] >> 4, 6);
    let b2 = ok(lun.execute(&[0x12, 1, 0xB2, 0, 255, 0], &[]));
    assert_eq!(b2[6], 2, "thin");
    assert_eq!(
        check(lun.execute(&[0x12, 1, 0x55, 0, 255, 0], &[])),
        (key::ILLEGAL_REQUEST, 0x24, 0)
    );
    assert_eq!(
        check(lun.execute(&[0x12, 0, 0x80, 0, 255, 0], &[])),
        (key::ILLEGAL_REQUEST, 0x24, 0)
    );
    // Allocation length truncates.
    assert_eq!(ok(lun.execute(&[0x12, 0, 0, 0, 5, 0], &[])).len(), 5);
}

#[test]
fn capacity() {
    let (_r, lun) = rig(4096, 8 * MIB, false);
    let d = ok(lun.execute(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 2047);
    assert_eq!(u32::from_be_bytes(d[4..8].try_into().unwrap()), 4096);
    let d = ok(lun.execute(&cdb16(0x9E, 0x10, 0, 32), &[]));
    assert_eq!(u64::from_be_bytes(d[0..8].try_into().unwrap()), 2047);
    assert_eq!(d[14] & 0xC0, 0xC0, "LBPME and LBPRZ");
    assert_eq!(d[13] & 0x0F, 0, "one logical block per physical block");
}

#[test]
fn physical_block_size_is_what_the_vdisk_presents() {
    let lbppbe = |lun: &Lun| ok(lun.execute(&cdb16(0x9E, 0x10, 0, 32), &[]))[13] & 0x0F;
    let (_r, lun) = rig(512, 8 * MIB, false);
    assert_eq!(lbppbe(&lun), 3, "512e: 8 logical blocks per 4 KiB physical block");
    let (_r, lun) = rig_with(512, 8 * MIB, |s| s.physical_block_size = Some(512));
    assert_eq!(lbppbe(&lun), 0, "512n");
}

#[test]
fn reads_writes_and_ranges() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let blocks = (8 * MIB / 512) as u64;
    let data: Vec<u8> = (0..8 * 512).map(|i| (i * 7 % 251) as u8).collect();
    ok(lun.execute(&cdb10(0x2A, 0x08, 100, 8), &data));
    assert_eq!(ok(lun.execute(&cdb10(0x28, 0, 100, 8), &[])), data);
    assert_eq!(ok(lun.execute(&cdb16(0x88, 0, 100, 8), &[])), data);
    let mut c12 = vec![0xA8, 0, 0, 0, 0, 100, 0, 0, 0, 8, 0, 0];
    assert_eq!(ok(lun.execute(&c12, &[])), data);
    c12[0] = 0xAA;
    ok(lun.execute(&c12, &data));
    // READ(6): 0 blocks means 256.
    assert_eq!(ok(lun.execute(&[0x08, 0, 0, 0, 0, 0], &[])).len(), 256 * 512);
    // Never written: zeros.
    assert!(ok(lun.execute(&cdb16(0x88, 0, 5000, 4), &[])).iter().all(|&b| b == 0));
    // Out of range, and wrapping around.
    assert_eq!(
        check(lun.execute(&cdb16(0x88, 0, blocks - 1, 2), &[])),
        (key::ILLEGAL_REQUEST, 0x21, 0)
    );
    assert_eq!(
        check(lun.execute(&cdb16(0x8A, 0, u64::MAX, 1), &[0; 512])),
        (key::ILLEGAL_REQUEST, 0x21, 0)
    );
    // Protection information is refused.
    assert_eq!(check(lun.execute(&cdb16(0x88, 0x20, 0, 1), &[])).1, 0x24);
    // A short data-out buffer writes the whole blocks that arrived, nothing more.
    ok(lun.execute(&cdb10(0x2A, 0, 100, 2), &[0x33; 512]));
    let back = ok(lun.execute(&cdb10(0x28, 0, 100, 2), &[]));
    assert!(back[..512].iter().all(|&b| b == 0x33));
    assert_eq!(&back[512..], &data[512..1024]);
    // WRITE SAME and COMPARE AND WRITE take exactly their data-out.
    assert_eq!(check(lun.execute(&cdb16(0x93, 0, 0, 1), &[0; 1024])).1, 0x24);
    let mut caw = cdb16(0x89, 0, 0, 0);
    caw[13] = 1;
    assert_eq!(check(lun.execute(&caw, &[0; 512])).1, 0x24);
    // Unknown opcode, truncated CDB.
    assert_eq!(
        check(lun.execute(&[0xC0, 0, 0, 0, 0, 0], &[])),
        (key::ILLEGAL_REQUEST, 0x20, 0)
    );
    assert_eq!(check(lun.execute(&[0x28, 0, 0], &[])).1, 0x24);
    ok(lun.execute(&cdb10(0x35, 0, 0, 0), &[]));
}

/// A READ's data comes in a buffer a file disk opened for direct I/O reads straight into (no
/// bounce buffer and copy), alone or in a batch.
#[test]
fn reads_come_in_buffers_aligned_for_direct_io() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let data: Vec<u8> = (0..8 * 512u32).map(|i| (i % 251) as u8).collect();
    ok(lun.execute(&cdb10(0x2A, 0, 8, 8), &data));
    let read = cdb10(0x28, 0, 8, 8);
    let single = lun.execute(&read, &[]);
    let batch = lun.execute_many_for(&nx(1), &[(&read[..], &[][..]), (&read[..], &[][..])]);
    for r in std::iter::once(&single).chain(&batch) {
        assert_eq!(r.status, sense::GOOD);
        assert!(matches!(r.data, Data::Blocks(_)), "{:?}", r.data);
        assert_eq!(r.data.as_ptr() as usize % tessera_disk::SECTOR, 0);
        assert_eq!(r.data[..], data[..]);
    }
    // Built data stays as built.
    assert!(matches!(lun.execute(&[0x12, 0, 0, 0, 96, 0], &[]).data, Data::Bytes(_)));
}

#[test]
fn verify_and_compare_and_write() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let a = vec![0xAAu8; 1024];
    ok(lun.execute(&cdb16(0x8A, 0, 10, 2), &a));
    ok(lun.execute(&cdb16(0x8F, 0x02, 10, 2), &a));
    let mut b = a.clone();
    b[700] = 0;
    let r = lun.execute(&cdb16(0x8F, 0x02, 10, 2), &b);
    assert_eq!(r.sense[2] & 0x0F, key::MISCOMPARE);
    assert_eq!(u32::from_be_bytes(r.sense[3..7].try_into().unwrap()), 700);

    let mut caw = vec![0u8; 16];
    caw[0] = 0x89;
    caw[2..10].copy_from_slice(&10u64.to_be_bytes());
    caw[13] = 1;
    let mut good = vec![0xAAu8; 512];
    good.extend_from_slice(&[0x55; 512]);
    ok(lun.execute(&caw, &good));
    assert_eq!(ok(lun.execute(&cdb16(0x88, 0, 10, 1), &[])), vec![0x55; 512]);
    // The compare now fails and nothing is written.
    let r = lun.execute(&caw, &good);
    assert_eq!(r.sense[2] & 0x0F, key::MISCOMPARE);
    assert_eq!(ok(lun.execute(&cdb16(0x88, 0, 10, 1), &[])), vec![0x55; 512]);
}

#[test]
fn thin_provisioning_commands() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let grain_blocks = (64 << 10) / 512;
    let data = vec![0x11u8; 4 * grain_blocks * 512];
    ok(lun.execute(&cdb16(0x8A, 0, 0, (4 * grain_blocks) as u32), &data));
    assert_eq!(vdisk_of(&lun).unwrap().allocated_bytes(), 4 * (64 << 10));

    // UNMAP the middle two grains.
    let mut p = vec![0u8; 24];
    p[0..2].copy_from_slice(&22u16.to_be_bytes());
    p[2..4].copy_from_slice(&16u16.to_be_bytes());
    p[8..16].copy_from_slice(&(grain_blocks as u64).to_be_bytes());
    p[16..20].copy_from_slice(&(2 * grain_blocks as u32).to_be_bytes());
    let mut c = vec![0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    ok(lun.execute(&c, &p));
    assert_eq!(vdisk_of(&lun).unwrap().allocated_bytes(), 2 * (64 << 10));
    assert!(ok(lun.execute(&cdb16(0x88, 0, grain_blocks as u64, 8), &[]))
        .iter()
        .all(|&b| b == 0));

    // GET LBA STATUS: mapped, deallocated, mapped, then deallocated to the end.
    let d = ok(lun.execute(&cdb16(0x9E, 0x12, 0, 4096), &[]));
    let descs: Vec<(u64, u32, u8)> = d[8..]
        .chunks(16)
        .map(|x| {
            (
                u64::from_be_bytes(x[0..8].try_into().unwrap()),
                u32::from_be_bytes(x[8..12].try_into().unwrap()),
                x[12],
            )
        })
        .collect();
    let g = grain_blocks as u64;
    assert_eq!(
        &descs[..3],
        &[(0, g as u32, 0), (g, 2 * g as u32, 1), (3 * g, g as u32, 0)]
    );

    // UNMAP out of range changes nothing.
    p[8..16].copy_from_slice(&(lun.blocks() - 1).to_be_bytes());
    assert_eq!(check(lun.execute(&c, &p)).1, 0x21);
    // A descriptor length that overruns the list.
    p[2..4].copy_from_slice(&32u16.to_be_bytes());
    assert_eq!(check(lun.execute(&c, &p)).1, 0x1A);
    c[1] = 1; // ANCHOR
    assert_eq!(check(lun.execute(&c, &p)).1, 0x24);

    // WRITE SAME with UNMAP and zeros frees; with a pattern writes it.
    let mut ws = cdb16(0x93, 0x08, 0, g as u32);
    ok(lun.execute(&ws, &[0u8; 512]));
    assert_eq!(vdisk_of(&lun).unwrap().allocated_bytes(), 64 << 10);
    ws[1] = 0;
    ok(lun.execute(&ws, &[0x42u8; 512]));
    assert!(ok(lun.execute(&cdb16(0x88, 0, 0, g as u32), &[]))
        .iter()
        .all(|&b| b == 0x42));
    // UNMAP with a pattern deallocates all the same (SBC-4): the blocks read zeros.
    ws[1] = 0x08;
    ok(lun.execute(&ws, &[0x42u8; 512]));
    assert!(ok(lun.execute(&cdb16(0x88, 0, 0, g as u32), &[]))
        .iter()
        .all(|&b| b == 0));
    assert_eq!(vdisk_of(&lun).unwrap().allocated_bytes(), 64 << 10);
    ws[1] = 0x10; // ANCHOR: not supported
    assert_eq!(check(lun.execute(&ws, &[0u8; 512])).1, 0x24);
    ws[1] = 0x01; // NDOB: zeros without a data-out buffer
    ok(lun.execute(&ws, &[]));
    assert!(ok(lun.execute(&cdb16(0x88, 0, 0, 4), &[])).iter().all(|&b| b == 0));
    // Zero blocks: from the LBA to the end of the LUN (WSNZ is clear).
    let blocks = 8 * MIB / 512;
    ok(lun.execute(&cdb16(0x93, 0, blocks - 8, 0), &[0x5Au8; 512]));
    assert!(ok(lun.execute(&cdb16(0x88, 0, blocks - 8, 8), &[]))
        .iter()
        .all(|&b| b == 0x5A));
    assert_ne!(ok(lun.execute(&cdb16(0x88, 0, blocks - 9, 1), &[]))[0], 0x5A);
    ok(lun.execute(&cdb16(0x93, 0x08, blocks - 8, 0), &[0u8; 512]));
    assert!(ok(lun.execute(&cdb16(0x88, 0, blocks - 8, 8), &[]))
        .iter()
        .all(|&b| b == 0));
    // At or past the end there is nothing to write to.
    assert_eq!(check(lun.execute(&cdb16(0x93, 0, blocks, 0), &[0u8; 512])).1, 0x21);
    assert_eq!(check(lun.execute(&cdb16(0x93, 0, u64::MAX, 0), &[0u8; 512])).1, 0x21);
    let b0 = ok(lun.execute(&[0x12, 1, 0xB0, 0, 255, 0], &[]));
    assert_eq!(b0[4] & 0x01, 0, "WSNZ clear");
}

#[test]
fn mode_pages_and_write_protect() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let d = ok(lun.execute(&[0x1A, 0, 0x08, 0, 255, 0], &[]));
    assert_eq!(d[0] as usize, d.len() - 1);
    assert_eq!(d[3], 8, "one block descriptor");
    assert_eq!(d[12], 0x08);
    assert_eq!(d[14] & 0x04, 0x04, "WCE reported");
    let all = ok(lun.execute(&[0x5A, 0x08, 0x3F, 0, 0, 0, 0, 0x10, 0, 0], &[]));
    assert_eq!(u16::from_be_bytes([all[0], all[1]]) as usize, all.len() - 2);
    assert_eq!(check(lun.execute(&[0x1A, 0, 0x35, 0, 255, 0], &[])).1, 0x24);

    // Turn on SWP and D_SENSE through MODE SELECT(6) with the control page.
    let ctl = ok(lun.execute(&[0x1A, 0x08, 0x0A, 0, 255, 0], &[]));
    let mut page = ctl[4..].to_vec();
    page[2] |= 0x04;
    page[4] |= 0x08;
    let mut list = vec![0, 0, 0, 0];
    list.extend_from_slice(&page);
    ok(lun.execute(&[0x15, 0x10, 0, 0, list.len() as u8, 0], &list));
    let r = lun.execute(&cdb16(0x8A, 0, 0, 1), &[0u8; 512]);
    assert_eq!(r.status, sense::CHECK_CONDITION);
    assert_eq!(
        &r.sense[..4],
        &[0x72, key::DATA_PROTECT, 0x27, 0x00],
        "descriptor sense, write protected"
    );
    // A change to a bit that cannot change is refused.
    list[4 + 3] ^= 0x01;
    assert_eq!(
        lun.execute(&[0x15, 0x10, 0, 0, list.len() as u8, 0], &list).sense[2],
        0x26
    );
}

#[test]
fn report_supported_opcodes_and_luns() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let all = ok(lun.execute(&[0xA3, 0x0C, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0], &[]));
    let n = u32::from_be_bytes(all[0..4].try_into().unwrap()) as usize;
    assert_eq!(n, all.len() - 4);
    assert_eq!(n % 8, 0);
    let one = ok(lun.execute(&[0xA3, 0x0C, 0x01, 0x28, 0, 0, 0, 0, 1, 0, 0, 0], &[]));
    assert_eq!(one[1] & 0x07, 0x03);
    assert_eq!(one[4], 0x28);
    let rctd = ok(lun.execute(&[0xA3, 0x0C, 0x82, 0x9E, 0, 0x10, 0, 0, 1, 0, 0, 0], &[]));
    assert_eq!(rctd[1], 0x83);
    assert_eq!(rctd.len(), 4 + 16 + 12);
    let none = ok(lun.execute(&[0xA3, 0x0C, 0x01, 0xC5, 0, 0, 0, 0, 1, 0, 0, 0], &[]));
    assert_eq!(none[1] & 0x07, 0x01);

    let r = ok(report_luns(&[0xA0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[3, 0, 300]));
    assert_eq!(u32::from_be_bytes(r[0..4].try_into().unwrap()), 24);
    assert_eq!(&r[8..16], &[0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&r[16..18], &[0, 3]);
    assert_eq!(&r[24..26], &[0x41, 0x2C]);
}

#[test]
fn full_pool_is_space_allocation_failed_never_silent() {
    let TestPool { dir: _dir, engine } = TestPool::new(Disks::Memory, 2, 8 * MIB);
    let v = engine
        .create_vdisk(&VdiskSpec::new("big", 64 * MIB, LayoutKind::Simple))
        .unwrap();
    let lun = vdisk_lun(v, 1, false);
    let chunk = vec![0x5Au8; 1 << 20];
    let mut failed = None;
    for i in 0..64u64 {
        let r = lun.execute(&cdb16(0x8A, 0, i * 2048, 2048), &chunk);
        if r.status != sense::GOOD {
            failed = Some((r.sense[2] & 0x0F, r.sense[12], r.sense[13]));
            break;
        }
    }
    assert_eq!(failed, Some((key::DATA_PROTECT, 0x27, 0x07)));
    drop(engine);
}

#[test]
fn target_port_groups_and_twelve_byte_verify() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let d = ok(lun.execute(&[0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]));
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize, d.len() - 4);
    assert_eq!(d[4] & 0x0F, 0, "active/optimized");
    assert_eq!(d[11], 1, "one port");
    assert_eq!(&d[14..16], &[0, 1], "relative target port 1, as VPD 0x83 says");
    let ext = ok(lun.execute(&[0xA3, 0x2A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]));
    assert_eq!(ext[4], 0x10);

    let data = vec![0x5Cu8; 1024];
    let mut wv12 = vec![0xAE, 0, 0, 0, 0, 7, 0, 0, 0, 2, 0, 0];
    ok(lun.execute(&wv12, &data));
    let mut v12 = wv12.clone();
    v12[0] = 0xAF;
    v12[1] = 0x02;
    ok(lun.execute(&v12, &data));
    wv12[5] = 8;
    ok(lun.execute(&wv12, &vec![0u8; 1024]));
    assert_eq!(lun.execute(&v12, &data).sense[2] & 0x0F, key::MISCOMPARE);
}

fn nx(id: u64) -> Nexus {
    Nexus::new(
        id,
        &format!("iqn.2026-11.io.example:host{id}"),
        [0x40, 0, 0, 0, 0, id as u8],
    )
}

/// The nexus registers key 7 (REGISTER AND IGNORE) and takes EXCLUSIVE ACCESS with it.
fn take_exclusive_access(lun: &Lun, nexus: u64) {
    let mut p = vec![0u8; 24];
    p[8..16].copy_from_slice(&7u64.to_be_bytes());
    ok(lun.execute_for(&nx(nexus), &[0x5F, 6, 0, 0, 0, 0, 0, 0, 24, 0], &p));
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&7u64.to_be_bytes());
    ok(lun.execute_for(&nx(nexus), &[0x5F, 1, 3, 0, 0, 0, 0, 0, 24, 0], &p));
}

#[test]
fn unit_attentions_reach_the_other_nexuses_once() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let tur = [0u8; 6];
    // Two nexuses use the LUN; nexus 1 resets it.
    ok(lun.execute_for(&nx(1), &tur, &[]));
    ok(lun.execute_for(&nx(2), &tur, &[]));
    lun.reset(1);
    assert_eq!(
        check(lun.execute_for(&nx(1), &tur, &[])),
        (key::UNIT_ATTENTION, 0x29, 0x03)
    );
    ok(lun.execute_for(&nx(1), &tur, &[]));
    // INQUIRY is not held up by it; the next command reports it, once.
    ok(lun.execute_for(&nx(2), &[0x12, 0, 0, 0, 36, 0], &[]));
    assert_eq!(
        check(lun.execute_for(&nx(2), &tur, &[])),
        (key::UNIT_ATTENTION, 0x29, 0x03)
    );
    ok(lun.execute_for(&nx(2), &tur, &[]));
    // A capacity change reaches everyone; REQUEST SENSE returns it as data and clears it.
    lun.capacity_changed();
    let d = ok(lun.execute_for(&nx(1), &[0x03, 0, 0, 0, 18, 0], &[]));
    assert_eq!((d[2] & 0x0F, d[12], d[13]), (key::UNIT_ATTENTION, 0x2A, 0x09));
    ok(lun.execute_for(&nx(1), &tur, &[]));
    assert_eq!(check(lun.execute_for(&nx(2), &tur, &[])).1, 0x2A);
}

/// Another session of the port `n` (same initiator name and ISID, new session id).
fn next_session(n: &Nexus, id: u64) -> Nexus {
    Nexus::new(id, &n.initiator, n.isid).with_scope(n.scope.clone())
}

#[test]
fn a_ports_next_session_learns_what_it_missed() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let tur = [0u8; 6];
    let (one, two) = (nx(1), nx(2));
    ok(lun.execute_for(&one, &tur, &[]));
    ok(lun.execute_for(&two, &tur, &[]));
    // Nexus 1 holds an SPC-2 reservation when its session ends: the reservation ends with it.
    ok(lun.execute_for(&one, &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(lun.execute_for(&two, &tur, &[]).status, 0x18);
    lun.nexus_lost(&one);
    ok(lun.execute_for(&two, &tur, &[]));
    // A reset while the port has no session still reaches it, after the loss itself.
    lun.reset(2);
    assert_eq!(check(lun.execute_for(&two, &tur, &[])).2, 0x03);
    let again = next_session(&one, 11);
    assert_eq!(
        check(lun.execute_for(&again, &tur, &[])),
        (key::UNIT_ATTENTION, 0x29, 0x07)
    );
    assert_eq!(check(lun.execute_for(&again, &tur, &[])).2, 0x03);
    ok(lun.execute_for(&again, &tur, &[]));
    // A reinstatement: the new session is in before the old one is torn down. The new one
    // is told, and the port is not taken for lost.
    let new = next_session(&two, 12);
    ok(lun.execute_for(&new, &tur, &[]));
    lun.nexus_lost(&two);
    assert_eq!(check(lun.execute_for(&new, &tur, &[])).2, 0x07);
    lun.reset(1);
    assert_eq!(check(lun.execute_for(&new, &tur, &[])).2, 0x03);
    ok(lun.execute_for(&new, &tur, &[]));
}

#[test]
fn a_port_hears_of_its_lost_sessions_once() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let tur = [0u8; 6];
    let inquiry = [0x12, 0, 0, 0, 36, 0];
    // Sessions that only ask INQUIRY (which reports no unit attention) and end, one after the
    // other, as a tool run again and again does: the loss is pending once, not per session.
    let mut s = nx(1);
    ok(lun.execute_for(&s, &tur, &[]));
    for id in 20..40 {
        lun.nexus_lost(&s);
        s = next_session(&s, id);
        ok(lun.execute_for(&s, &inquiry, &[]));
    }
    assert_eq!(check(lun.execute_for(&s, &tur, &[])), (key::UNIT_ATTENTION, 0x29, 0x07));
    ok(lun.execute_for(&s, &tur, &[]));
}

#[test]
fn ports_that_never_come_back_are_forgotten() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let tur = [0u8; 6];
    // Initiators that take a new ISID for every session leave a lost nexus each; the
    // longest lost give way, the recent ones are remembered.
    let ports: Vec<Nexus> = (0..2000u64)
        .map(|i| {
            Nexus::new(
                100 + i,
                "iqn.2026-11.io.example:many",
                [0x80, 0, 0, 0, (i >> 8) as u8, i as u8],
            )
        })
        .collect();
    for p in &ports {
        ok(lun.execute_for(p, &tur, &[]));
        lun.nexus_lost(p);
    }
    ok(lun.execute_for(&next_session(&ports[0], 5000), &tur, &[]));
    let last = next_session(&ports[1999], 5001);
    assert_eq!(check(lun.execute_for(&last, &tur, &[])).2, 0x07);
}

#[test]
fn malformed_cdbs_get_sense_even_under_a_reservation() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    assert_eq!(check(lun.execute(&[], &[])), (key::ILLEGAL_REQUEST, 0x20, 0x00));
    assert_eq!(
        check(lun.execute(&[0x28, 0, 0], &[])),
        (key::ILLEGAL_REQUEST, 0x24, 0x00)
    );
    take_exclusive_access(&lun, 1);
    // Another nexus: a short PR OUT, an empty CDB and a NACA bit are errors, not conflicts.
    assert_eq!(
        check(lun.execute_for(&nx(2), &[0x5F, 1, 3], &[])),
        (key::ILLEGAL_REQUEST, 0x24, 0x00)
    );
    assert_eq!(
        check(lun.execute_for(&nx(2), &[], &[])),
        (key::ILLEGAL_REQUEST, 0x20, 0x00)
    );
    let naca = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0x04];
    assert_eq!(
        check(lun.execute_for(&nx(2), &naca, &[])),
        (key::ILLEGAL_REQUEST, 0x24, 0x00)
    );
    let read = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    assert_eq!(lun.execute_for(&nx(2), &read, &[]).status, sense::RESERVATION_CONFLICT);
    ok(lun.execute_for(&nx(1), &read, &[]));
}

#[test]
fn a_batch_answers_as_its_commands_one_by_one() {
    // The same history on two LUNs: one runs each batch with execute_many_for, the other
    // command by command; every answer must be the same.
    let (_ra, a) = rig(512, 8 * MIB, false);
    let (_rb, b) = rig(512, 8 * MIB, false);
    let data: Vec<u8> = (0..MIB as usize).map(|i| (i * 31 / 7) as u8).collect();
    for l in [&a, &b] {
        ok(l.execute(&cdb10(0x2A, 0, 0, (MIB / 512) as u16), &data));
        ok(l.execute_for(&nx(2), &[0u8; 6], &[]));
    }
    let blocks = 8 * MIB / 512;
    let write_data = vec![0x5Au8; 4096];
    let batches: Vec<Vec<(Vec<u8>, Vec<u8>)>> = vec![
        vec![
            (cdb10(0x28, 0, 0, 8), vec![]),
            (cdb16(0x88, 0, 1000, 100), vec![]),
            (cdb16(0x88, 0, blocks - 4, 8), vec![]),     // past the end
            (cdb10(0x28, 0x20, 0, 1), vec![]),           // RDPROTECT
            (cdb10(0x28, 0, 5, 0), vec![]),              // nothing to read
            (vec![0x28, 0, 0], vec![]),                  // short CDB
            (cdb16(0x88, 0, 2040, 16), vec![]),          // mapped and unmapped grains
            (cdb10(0x2A, 0, 16, 8), write_data.clone()), // a write between reads
            (cdb10(0x28, 0, 12, 16), vec![]),            // sees it
            (vec![0u8; 6], vec![]),
            (vec![0x08, 0, 0, 3, 2, 0], vec![]), // READ(6)
        ],
        // Nexus 1 resets the LUN between batches: the first read reports the unit attention
        // and the others run.
        vec![(cdb10(0x28, 0, 0, 1), vec![]), (cdb10(0x28, 0, 1, 1), vec![])],
    ];
    for (n, batch) in batches.iter().enumerate() {
        if n == 1 {
            a.reset(1);
            b.reset(1);
        }
        let cmds: Vec<(&[u8], &[u8])> = batch.iter().map(|(c, d)| (&c[..], &d[..])).collect();
        let got = a.execute_many_for(&nx(2), &cmds);
        assert_eq!(got.len(), cmds.len());
        for (i, (g, (cdb, d))) in got.into_iter().zip(&cmds).enumerate() {
            let want = b.execute_for(&nx(2), cdb, d);
            assert_eq!(
                (g.status, &g.sense, g.data.len()),
                (want.status, &want.sense, want.data.len()),
                "batch {n}, command {i}"
            );
            assert!(g.data == want.data, "batch {n}, command {i}: data differs");
        }
    }
    // The reads really read: the batch's first answer is the data written at LBA 0.
    let cmds: Vec<(&[u8], &[u8])> = vec![(&[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0], &[])];
    assert_eq!(ok(a.execute_many_for(&nx(2), &cmds).remove(0)), data[..4096]);
}

#[test]
fn a_batch_of_reads_respects_reservations() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    take_exclusive_access(&lun, 1);
    let read = cdb10(0x28, 0, 0, 1);
    let cmds: Vec<(&[u8], &[u8])> = vec![(&read, &[]), (&read, &[])];
    for r in lun.execute_many_for(&nx(2), &cmds) {
        assert_eq!(r.status, sense::RESERVATION_CONFLICT);
    }
    for r in lun.execute_many_for(&nx(1), &cmds) {
        assert_eq!(ok(r).len(), 512);
    }
}

/// MODE SELECT(6) of the caching page with WCE as given, from nexus `n`.
fn set_write_cache(lun: &Lun, n: &Nexus, on: bool) -> Response {
    let sense = ok(lun.execute_for(n, &[0x1A, 0x08, 0x08, 0, 255, 0], &[]));
    let mut list = vec![0u8; 4];
    list.extend_from_slice(&sense[4..]);
    list[4] &= 0x3F; // PS is reserved in MODE SELECT
    if on {
        list[6] |= 0x04;
    } else {
        list[6] &= !0x04;
    }
    lun.execute_for(n, &[0x15, 0x10, 0, 0, list.len() as u8, 0], &list)
}

#[test]
fn a_mode_change_by_one_nexus_is_a_unit_attention_for_the_others() {
    let (_r, lun) = rig(512, 8 * MIB, false);
    let tur = [0u8; 6];
    for id in [1, 2, 3] {
        ok(lun.execute_for(&nx(id), &tur, &[]));
    }
    ok(set_write_cache(&lun, &nx(1), false));
    assert!(!lun.mode().wce);
    ok(lun.execute_for(&nx(1), &tur, &[]));
    for id in [2, 3] {
        assert_eq!(
            check(lun.execute_for(&nx(id), &tur, &[])),
            (key::UNIT_ATTENTION, 0x2A, 0x01),
            "nexus {id}: MODE PARAMETERS CHANGED"
        );
        ok(lun.execute_for(&nx(id), &tur, &[]));
    }
    // Selecting what is already set changes nothing, and tells nobody.
    ok(set_write_cache(&lun, &nx(1), false));
    ok(lun.execute_for(&nx(2), &tur, &[]));
}

#[test]
fn mode_settings_are_saved_and_come_back() {
    use parking_lot::Mutex;
    use tessera_scsi::ModeState;
    let saved: Arc<Mutex<Option<ModeState>>> = Arc::default();
    let store = |saved: &Arc<Mutex<Option<ModeState>>>| -> tessera_scsi::ModeStore {
        let saved = saved.clone();
        Box::new(move |m| {
            *saved.lock() = Some(*m);
            Ok(())
        })
    };
    let (_r, lun) = rig(512, 8 * MIB, false);
    let backend = lun.backend().clone();
    let lun = lun.with_saved_mode(None, store(&saved));
    ok(set_write_cache(&lun, &nx(1), false));
    assert_eq!(saved.lock().map(|m| m.wce), Some(false), "saved when selected");
    // Saved values (page control 3) are readable, and the pages say they can be saved.
    let s = ok(lun.execute(&[0x1A, 0x08, 0xC8, 0, 255, 0], &[]));
    assert_eq!(s[4] & 0x3F, 0x08);
    assert_ne!(s[4] & 0x80, 0, "PS");
    assert_eq!(s[6] & 0x04, 0, "saved WCE off");
    // Defaults (page control 2) are the defaults.
    let d = ok(lun.execute(&[0x1A, 0x08, 0x88, 0, 255, 0], &[]));
    assert_eq!(d[6] & 0x04, 0x04, "default WCE on");
    // A restart: the LUN is made again from what was saved.
    drop(lun);
    let again = Lun::new(backend, 0x42, false).with_saved_mode(*saved.lock(), store(&saved));
    assert!(!again.mode().wce, "the write cache stays off across a restart");
    let m = ok(again.execute(&[0x1A, 0x08, 0x08, 0, 255, 0], &[]));
    assert_eq!(m[6] & 0x04, 0);
    // A store that fails leaves the setting as it was: never reported changed and then lost.
    let failing =
        Lun::new(again.backend().clone(), 0x43, false).with_saved_mode(None, Box::new(|_| Err("disk full".into())));
    assert_eq!(check(set_write_cache(&failing, &nx(1), false)).0, key::HARDWARE_ERROR);
    assert!(failing.mode().wce);
}

/// Two hosts write one LUN (a cluster's shared volume). Host A's WRITE, in place and not yet
/// flushed, is lost with its disk, and host B's SYNCHRONIZE CACHE is the one that finds it:
/// B is told, and A's next SYNCHRONIZE CACHE fails too, on whichever of its paths it comes,
/// since the data was A's. Each is told once.
#[test]
fn a_write_lost_before_another_hosts_synchronize_cache_fails_the_writers_own() {
    use tessera_disk::{DiskRef, FaultyDisk, MemDisk};
    let dir = tempfile::tempdir().unwrap();
    let disks: Vec<Arc<FaultyDisk>> = (0..2)
        .map(|i| FaultyDisk::new(Arc::new(MemDisk::new(&format!("f{i}"), 128 * MIB)) as DiskRef))
        .collect();
    let refs = disks.iter().map(|d| d.clone() as DiskRef).collect();
    let engine = Engine::create_pool(&dir.path().join("p"), "p", refs, MIB).unwrap();
    let mut spec = VdiskSpec::new("shared", 16 * MIB, LayoutKind::Simple);
    spec.grain_size = Some(64 << 10);
    let lun = vdisk_lun(engine.create_vdisk(&spec).unwrap(), 1, false);
    let host_a = "iqn.2026-12.io.example:host-a";
    let a = Nexus::new(1, host_a, [0x80, 0, 0, 0, 0, 1]);
    let a_other_path = Nexus::new(3, host_a, [0x80, 0, 0, 0, 0, 3]);
    let b = Nexus::new(2, "iqn.2026-12.io.example:host-b", [0x80, 0, 0, 0, 0, 2]);
    let sync = cdb10(0x35, 0, 0, 0);
    let write = |n: &Nexus, fill: u8| ok(lun.execute_for(n, &cdb16(0x8A, 0, 0, 128), &vec![fill; 128 * 512]));
    write(&a, 1);
    ok(lun.execute_for(&a, &sync, &[]));
    // Allocated now: the next write goes in place, with no metadata commit to flush it.
    write(&a, 2);
    for d in &disks {
        d.faults().fail_flushes(true);
    }
    assert_eq!(
        lun.execute_for(&b, &sync, &[]).status,
        sense::CHECK_CONDITION,
        "B's flush covered the lost data"
    );
    for d in &disks {
        d.faults().fail_flushes(false);
    }
    assert_eq!(
        lun.execute_for(&a_other_path, &sync, &[]).status,
        sense::CHECK_CONDITION,
        "host A's lost write was called durable at A's SYNCHRONIZE CACHE"
    );
    ok(lun.execute_for(&a, &sync, &[]));
    ok(lun.execute_for(&b, &sync, &[]));
}
