//! Third-party copy against a real engine: POPULATE TOKEN / WRITE USING TOKEN across LUNs,
//! point in time, the zero token, refused tokens, overlapping ranges, EXTENDED COPY and
//! RECEIVE COPY RESULTS, and what discovery reports.

use std::sync::Arc;

use tessera_disk::{DiskRef, MemDisk};
use tessera_scsi::sense::{self, key};
use tessera_scsi::{CopyManager, Lun, Nexus, Response};
use tessera_volume::{Engine, LayoutKind, VdiskSpec};

const MIB: u64 = 1 << 20;
const BS: u64 = 512;

struct Rig {
    _dir: tempfile::TempDir,
    engine: Engine,
    cm: Arc<CopyManager>,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let disks: Vec<DiskRef> = (0..3)
            .map(|i| Arc::new(MemDisk::new(&format!("m{i}"), 128 * MIB)) as DiskRef)
            .collect();
        let engine = Engine::create_pool(&dir.path().join("p"), "p", disks, MIB).unwrap();
        Rig {
            _dir: dir,
            engine,
            cm: Arc::new(CopyManager::new()),
        }
    }

    fn lun(&self, name: &str, layout: LayoutKind, uid: u128) -> Arc<Lun> {
        let mut spec = VdiskSpec::new(name, 16 * MIB, layout);
        spec.grain_size = Some(64 << 10);
        let v = self.engine.create_vdisk(&spec).unwrap();
        let l = Arc::new(Lun::new(v, uid, false).with_copy_manager(self.cm.clone()));
        l.register_for_copy();
        l
    }
}

fn ok(r: Response) -> Vec<u8> {
    assert_eq!(r.status, sense::GOOD, "sense {:02x?}", r.sense);
    r.data.to_vec()
}

fn check(r: Response) -> (u8, u8, u8) {
    assert_eq!(r.status, sense::CHECK_CONDITION, "expected a check condition");
    (r.sense[2] & 0x0F, r.sense[12], r.sense[13])
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8).collect()
}

fn write(l: &Lun, lba: u64, data: &[u8]) {
    let mut c = vec![0x8A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&((data.len() as u64 / BS) as u32).to_be_bytes());
    ok(l.execute(&c, data));
}

fn read(l: &Lun, lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    ok(l.execute(&c, &[]))
}

fn ranges(list: &[(u64, u32)]) -> Vec<u8> {
    let mut b = Vec::new();
    for &(lba, n) in list {
        b.extend_from_slice(&lba.to_be_bytes());
        b.extend_from_slice(&n.to_be_bytes());
        b.extend_from_slice(&[0; 4]);
    }
    b
}

fn tpc_out(sa: u8, list_id: u32, params: &[u8]) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[1] = sa;
    c[6..10].copy_from_slice(&list_id.to_be_bytes());
    c[10..14].copy_from_slice(&(params.len() as u32).to_be_bytes());
    c
}

fn populate(l: &Lun, list_id: u32, timeout: u32, list: &[(u64, u32)]) -> Response {
    let r = ranges(list);
    let mut p = vec![0u8; 16];
    p[0..2].copy_from_slice(&((14 + r.len()) as u16).to_be_bytes());
    p[4..8].copy_from_slice(&timeout.to_be_bytes());
    p[14..16].copy_from_slice(&(r.len() as u16).to_be_bytes());
    p.extend_from_slice(&r);
    l.execute(&tpc_out(0x10, list_id, &p), &p)
}

fn wut_params(token: &[u8], offset: u64, delete: bool, list: &[(u64, u32)]) -> Vec<u8> {
    let r = ranges(list);
    let mut p = vec![0u8; 536];
    p[0..2].copy_from_slice(&((534 + r.len()) as u16).to_be_bytes());
    p[2] = if delete { 0x02 } else { 0 };
    p[8..16].copy_from_slice(&offset.to_be_bytes());
    p[16..16 + token.len().min(512)].copy_from_slice(&token[..token.len().min(512)]);
    p[534..536].copy_from_slice(&(r.len() as u16).to_be_bytes());
    p.extend_from_slice(&r);
    p
}

fn write_using_token(l: &Lun, list_id: u32, token: &[u8], offset: u64, delete: bool, list: &[(u64, u32)]) -> Response {
    let p = wut_params(token, offset, delete, list);
    l.execute(&tpc_out(0x11, list_id, &p), &p)
}

fn rrti(l: &Lun, list_id: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[2..6].copy_from_slice(&list_id.to_be_bytes());
    c[10..14].copy_from_slice(&4096u32.to_be_bytes());
    ok(l.execute(&c, &[]))
}

/// POPULATE TOKEN, then the token from RECEIVE ROD TOKEN INFORMATION.
fn token(l: &Lun, list_id: u32, timeout: u32, list: &[(u64, u32)]) -> Vec<u8> {
    ok(populate(l, list_id, timeout, list));
    let info = rrti(l, list_id);
    assert_eq!(info[4] & 0x1F, 0x10, "answers POPULATE TOKEN");
    assert_eq!(info[5], 0x01, "completed without errors");
    let blocks: u64 = list.iter().map(|r| r.1 as u64).sum();
    assert_eq!(u64::from_be_bytes(info[16..24].try_into().unwrap()), blocks);
    let sense_len = info[13] as usize;
    let at = 32 + sense_len;
    let tlen = u32::from_be_bytes(info[at..at + 4].try_into().unwrap()) as usize;
    assert_eq!(tlen, 514);
    let t = info[at + 6..at + 6 + 512].to_vec();
    assert_eq!(u32::from_be_bytes(t[0..4].try_into().unwrap()), 0x0080_0000);
    t
}

#[test]
fn tokens_copy_across_luns_at_the_point_in_time_of_populate() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    let b = rig.lun("b", LayoutKind::Mirror, 2);
    let data = pattern(7, (4 * MIB) as usize);
    write(&a, 0, &data);
    // Two ranges: 1 MiB at 0 and 1 MiB at 2 MiB.
    let t = token(&a, 1, 0, &[(0, 2048), (4096, 2048)]);
    // Changes after POPULATE TOKEN are not in the token.
    write(&a, 0, &vec![0xEE; MIB as usize]);
    ok(write_using_token(&b, 2, &t, 0, false, &[(1024, 4096)]));
    let back = read(&b, 1024, 4096);
    assert_eq!(&back[..MIB as usize], &data[..MIB as usize], "first range, as populated");
    assert_eq!(&back[MIB as usize..], &data[2 * MIB as usize..3 * MIB as usize], "second range");
    let info = rrti(&b, 2);
    assert_eq!((info[4] & 0x1F, info[5]), (0x11, 0x01));
    assert_eq!(u64::from_be_bytes(info[16..24].try_into().unwrap()), 4096);
    // Aligned with its grains: shared, not copied.
    assert!(b.vdisk().space_usage().shared_bytes >= MIB);
    // An offset into the ROD, and destination ranges longer than what is left: the copy
    // stops where the ROD ends.
    ok(write_using_token(&b, 3, &t, 3072, false, &[(0, 512), (8192, 4096)]));
    assert_eq!(read(&b, 0, 512), &data[(1536 * BS) as usize..(2048 * BS) as usize]);
    assert_eq!(read(&b, 8192, 512), &data[(4096 * BS) as usize..(4608 * BS) as usize]);
    assert_eq!(u64::from_be_bytes(rrti(&b, 3)[16..24].try_into().unwrap()), 1024);
    // An offset past the ROD's end.
    assert_eq!(
        check(write_using_token(&b, 4, &t, 4096, false, &[(0, 8)])),
        (key::ILLEGAL_REQUEST, 0x26, 0)
    );
    // Into a vdisk of another layout: copied inside the server.
    let c = rig.lun("c", LayoutKind::Parity, 3);
    ok(write_using_token(&c, 5, &t, 0, false, &[(0, 4096)]));
    assert_eq!(read(&c, 0, 2048), &data[..MIB as usize]);
    assert_eq!(c.vdisk().space_usage().shared_bytes, 0);
    assert!(rig.engine.check().unwrap().problems.is_empty());
}

#[test]
fn overlapping_destination_reads_as_the_source_did() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Simple, 1);
    let data = pattern(3, (2 * MIB) as usize);
    write(&a, 0, &data);
    // Copy [0, 2 MiB) onto [1 MiB, 3 MiB) of the same LUN.
    let t = token(&a, 1, 0, &[(0, 4096)]);
    ok(write_using_token(&a, 2, &t, 0, false, &[(2048, 4096)]));
    assert_eq!(read(&a, 2048, 4096), data);
    assert_eq!(read(&a, 0, 2048), &data[..MIB as usize]);
    // Not grain aligned: 3 blocks off.
    let t = token(&a, 3, 0, &[(2048, 4096)]);
    ok(write_using_token(&a, 4, &t, 0, false, &[(2051, 4096)]));
    assert_eq!(read(&a, 2051, 4096), data);
}

#[test]
fn zero_token_deleted_expired_forged_and_truncated_tokens() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    let b = rig.lun("b", LayoutKind::Mirror, 2);
    write(&a, 0, &pattern(1, MIB as usize));
    write(&b, 0, &pattern(2, MIB as usize));

    // The block device zero token needs no POPULATE TOKEN.
    let mut zero = vec![0u8; 512];
    zero[0..4].copy_from_slice(&0xFFFF_0001u32.to_be_bytes());
    ok(write_using_token(&b, 1, &zero, 0, false, &[(8, 16)]));
    assert!(read(&b, 8, 16).iter().all(|&x| x == 0));
    assert_eq!(read(&b, 0, 8), &pattern(2, MIB as usize)[..4096]);

    let t = token(&a, 2, 0, &[(0, 64)]);
    let invalid = |r: Response| {
        let (k, asc, ascq) = check(r);
        assert_eq!((k, asc), (key::ILLEGAL_REQUEST, 0x23), "INVALID TOKEN OPERATION");
        ascq
    };
    // Forged: the secret part changed (unknown), or another part (corrupt), or made by
    // another copy manager, or of a type we do not make, or with a wrong length.
    let mut f = t.clone();
    f[150] ^= 1;
    assert_eq!(invalid(write_using_token(&b, 3, &f, 0, false, &[(0, 8)])), 0x04);
    let mut f = t.clone();
    f[20] ^= 1;
    assert_eq!(invalid(write_using_token(&b, 3, &f, 0, false, &[(0, 8)])), 0x05);
    let mut f = t.clone();
    f[130] ^= 1;
    f[160] ^= 1;
    assert_eq!(invalid(write_using_token(&b, 3, &f, 0, false, &[(0, 8)])), 0x02, "not ours");
    let mut f = t.clone();
    f[0..4].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    assert_eq!(invalid(write_using_token(&b, 3, &f, 0, false, &[(0, 8)])), 0x01);
    let mut f = t.clone();
    f[7] = 0x10;
    assert_eq!(invalid(write_using_token(&b, 3, &f, 0, false, &[(0, 8)])), 0x0A);
    // Truncated parameter lists.
    let p = wut_params(&t, 0, false, &[(0, 8)]);
    assert_eq!(
        check(b.execute(&tpc_out(0x11, 3, &p[..300]), &p[..300])),
        (key::ILLEGAL_REQUEST, 0x1A, 0)
    );
    assert_eq!(
        check(a.execute(&tpc_out(0x10, 3, &[0u8; 10]), &[0u8; 10])),
        (key::ILLEGAL_REQUEST, 0x1A, 0)
    );
    // Ranges past the end, none at all, too many.
    assert_eq!(check(populate(&a, 4, 0, &[(32760, 16)])), (key::ILLEGAL_REQUEST, 0x21, 0));
    assert_eq!(check(populate(&a, 4, 0, &[])), (key::ILLEGAL_REQUEST, 0x26, 0));
    let many: Vec<(u64, u32)> = (0..65).map(|i| (i * 8, 8)).collect();
    assert_eq!(check(populate(&a, 4, 0, &many)).0, key::ILLEGAL_REQUEST);
    // A timeout over the maximum.
    assert_eq!(check(populate(&a, 4, 100_000, &[(0, 8)])), (key::ILLEGAL_REQUEST, 0x26, 0));

    // DEL_TKN: the token works once more, then is gone.
    ok(write_using_token(&b, 5, &t, 0, true, &[(0, 64)]));
    assert_eq!(invalid(write_using_token(&b, 6, &t, 0, false, &[(0, 8)])), 0x09);
    // Expiry after the inactivity timeout.
    let t = token(&a, 7, 1, &[(0, 64)]);
    std::thread::sleep(std::time::Duration::from_millis(1300));
    assert_eq!(invalid(write_using_token(&b, 8, &t, 0, false, &[(0, 8)])), 0x07);
    // A write-protected destination.
    let ro = Lun::new(rig.engine.vdisk("b").unwrap(), 9, true).with_copy_manager(rig.cm.clone());
    let t = token(&a, 9, 0, &[(0, 64)]);
    assert_eq!(check(write_using_token(&ro, 10, &t, 0, false, &[(0, 8)])), (key::DATA_PROTECT, 0x27, 0));
    // RRTI of an operation that never was.
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[5] = 99;
    c[13] = 255;
    assert_eq!(check(a.execute(&c, &[])).0, key::ILLEGAL_REQUEST);
    // Results are per nexus: another initiator does not see ours.
    let other = Nexus {
        id: 77,
        initiator: "iqn.other".into(),
        isid: [0; 6],
    };
    c[5] = 9;
    assert_eq!(check(a.execute_for(&other, &c, &[])).0, key::ILLEGAL_REQUEST);
    // REPORT ALL ROD TOKENS lists the live ones.
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x08;
    c[10..14].copy_from_slice(&65536u32.to_be_bytes());
    let d = ok(a.execute(&c, &[]));
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize, d.len() - 4);
    assert!(d.len() >= 8 + 512);
    assert!(rig.engine.check().unwrap().problems.is_empty());
}

/// An identification CSCD descriptor naming a LUN by its NAA designator (VPD page 0x83).
fn cscd(l: &Lun) -> Vec<u8> {
    let id = ok(l.execute(&[0x12, 1, 0x83, 0, 255, 0], &[]));
    let mut d = vec![0u8; 32];
    d[0] = 0xE4;
    d[4] = id[4];
    d[5] = id[5];
    d[7] = id[7];
    d[8..8 + id[7] as usize].copy_from_slice(&id[8..8 + id[7] as usize]);
    d[30] = 0x02; // block length 512
    d
}

fn segment(src: u16, dst: u16, blocks: u16, slba: u64, dlba: u64) -> Vec<u8> {
    let mut s = vec![0u8; 28];
    s[0] = 0x02;
    s[2..4].copy_from_slice(&0x18u16.to_be_bytes());
    s[4..6].copy_from_slice(&src.to_be_bytes());
    s[6..8].copy_from_slice(&dst.to_be_bytes());
    s[10..12].copy_from_slice(&blocks.to_be_bytes());
    s[12..20].copy_from_slice(&slba.to_be_bytes());
    s[20..28].copy_from_slice(&dlba.to_be_bytes());
    s
}

fn xcopy(l: &Lun, list_id: u8, cscds: &[Vec<u8>], segs: &[Vec<u8>]) -> Response {
    let t: Vec<u8> = cscds.concat();
    let s: Vec<u8> = segs.concat();
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[2..4].copy_from_slice(&(t.len() as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(s.len() as u32).to_be_bytes());
    p.extend_from_slice(&t);
    p.extend_from_slice(&s);
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(p.len() as u32).to_be_bytes());
    l.execute(&c, &p)
}

fn rcr(l: &Lun, sa: u8, list_id: u8) -> Response {
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = sa;
    c[2] = list_id;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    l.execute(&c, &[])
}

#[test]
fn extended_copy_between_luns_and_its_results() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    let b = rig.lun("b", LayoutKind::Mirror, 2);
    let data = pattern(9, (2 * MIB) as usize);
    write(&a, 0, &data);
    // Two segments: a to b (grain aligned), and within b (not aligned).
    ok(xcopy(
        &a,
        7,
        &[cscd(&a), cscd(&b)],
        &[segment(0, 1, 4096, 0, 0), segment(1, 1, 100, 0, 10_001)],
    ));
    assert_eq!(read(&b, 0, 4096), data);
    assert_eq!(read(&b, 10_001, 100), &data[..51_200]);
    assert!(b.vdisk().space_usage().shared_bytes >= MIB, "shared, not copied");
    let st = ok(rcr(&a, 0x00, 7));
    assert_eq!(st[4], 0x01, "completed without errors");
    assert_eq!(u16::from_be_bytes([st[5], st[6]]), 2, "segments processed");
    let op = ok(rcr(&a, 0x03, 0));
    assert_eq!(u32::from_be_bytes(op[0..4].try_into().unwrap()) as usize, op.len() - 4);
    assert!(u16::from_be_bytes([op[8], op[9]]) >= 2, "CSCD descriptors");
    assert_eq!(op[43] as usize, op.len() - 44, "implemented descriptor types");
    assert!(op[44..].contains(&0x02) && op[44..].contains(&0xE4));

    // A designator nobody presents.
    let mut ghost = cscd(&b);
    ghost[20] ^= 0xFF;
    assert_eq!(
        check(xcopy(&a, 8, &[cscd(&a), ghost], &[segment(0, 1, 8, 0, 0)])),
        (key::COPY_ABORTED, 0x0D, 0x02)
    );
    // Unsupported descriptors, an index past the list, and a range past the end.
    let mut odd = cscd(&b);
    odd[0] = 0xE5;
    assert_eq!(
        check(xcopy(&a, 8, &[odd], &[segment(0, 0, 8, 0, 0)])),
        (key::ILLEGAL_REQUEST, 0x26, 0x07)
    );
    let mut seg = segment(0, 1, 8, 0, 0);
    seg[0] = 0x0B;
    assert_eq!(
        check(xcopy(&a, 8, &[cscd(&a), cscd(&b)], &[seg])),
        (key::ILLEGAL_REQUEST, 0x26, 0x09)
    );
    assert_eq!(
        check(xcopy(&a, 8, &[cscd(&a)], &[segment(0, 3, 8, 0, 0)])),
        (key::COPY_ABORTED, 0x0D, 0x02)
    );
    assert_eq!(
        check(xcopy(&a, 9, &[cscd(&a), cscd(&b)], &[segment(0, 1, 8, 0, 32_765)])),
        (key::COPY_ABORTED, 0, 0)
    );
    let failed = ok(rcr(&a, 0x00, 9));
    assert_eq!(failed[4], 0x02, "completed with errors");
    let details = ok(rcr(&a, 0x04, 9));
    assert_eq!(details[60], sense::CHECK_CONDITION);
    assert!(u16::from_be_bytes([details[62], details[63]]) >= 14);
    // A zero-length parameter list is no copy and no error.
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    ok(a.execute(&c, &[]));
    assert!(rig.engine.check().unwrap().problems.is_empty());
}

#[test]
fn discovery_reports_third_party_copy() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    let std = ok(a.execute(&[0x12, 0, 0, 0, 96, 0], &[]));
    assert_ne!(std[5] & 0x08, 0, "3PC");
    let p = ok(a.execute(&[0x12, 1, 0x8F, 0x10, 0, 0], &[]));
    assert_eq!(p[1], 0x8F);
    assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, p.len() - 4);
    // Walk the descriptors: each (type, length) and the ROD token limits.
    let mut at = 4;
    let mut types = Vec::new();
    while at < p.len() {
        let t = u16::from_be_bytes([p[at], p[at + 1]]);
        let len = u16::from_be_bytes([p[at + 2], p[at + 3]]) as usize;
        if t == 0 {
            let d = &p[at + 4..at + 4 + len];
            assert!(u16::from_be_bytes([d[6], d[7]]) >= 8, "range descriptors");
            assert!(u64::from_be_bytes(d[16..24].try_into().unwrap()) >= (10u64 << 30) / BS, "10 GiB in one token");
        }
        types.push(t);
        at += 4 + len;
    }
    assert_eq!(at, p.len());
    for t in [0x0000, 0x0001, 0x0004, 0x0008, 0x000C, 0x0106, 0x0108, 0x8001] {
        assert!(types.contains(&t), "descriptor {t:#06x} missing from {types:x?}");
    }
    // REPORT SUPPORTED OPERATION CODES knows them.
    for (op, sa) in [(0x83u8, 0x10u8), (0x83, 0x11), (0x84, 0x07), (0x83, 0x00), (0x84, 0x03)] {
        let mut c = vec![0xA3, 0x0C, 0x02, op, 0, sa, 0, 0, 0, 64, 0, 0];
        c[4..6].copy_from_slice(&(sa as u16).to_be_bytes());
        let d = ok(a.execute(&c, &[]));
        assert_eq!(d[1] & 0x07, 0x03, "{op:#x}/{sa:#x} supported");
    }
}
