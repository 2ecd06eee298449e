//! Third-party copy against a real engine: POPULATE TOKEN / WRITE USING TOKEN across LUNs,
//! point in time, the zero token, refused tokens, overlapping ranges, EXTENDED COPY and
//! RECEIVE COPY RESULTS, and what discovery reports.

use std::sync::Arc;

use parking_lot::Mutex;
use tessera_disk::{DiskRef, FaultyDisk, MemDisk};
use tessera_scsi::sense::{self, key};
use tessera_scsi::{CopyManager, Lun, LunScope, Nexus, Response, Scope};
use tessera_test_support::cdbs;
use tessera_vdisk_lun::{vdisk_lun, vdisk_of};
use tessera_volume::{Engine, LayoutKind, VdiskSpec};

const MIB: u64 = 1 << 20;
const BS: u64 = 512;

/// The LUNs of one target, as an iSCSI session logged in to it can address them.
#[derive(Default)]
struct Target(Mutex<Vec<Arc<Lun>>>);

impl LunScope for Target {
    fn lun_by_naa(&self, naa: &[u8; 16]) -> Option<Arc<Lun>> {
        self.0.lock().iter().find(|l| l.naa() == naa).cloned()
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    engine: Engine,
    disks: Vec<Arc<MemDisk>>,
    cm: Arc<CopyManager>,
    /// The target every LUN made by `lun` belongs to.
    target: Arc<Target>,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let disks: Vec<Arc<MemDisk>> = (0..3)
            .map(|i| Arc::new(MemDisk::new(&format!("m{i}"), 128 * MIB)))
            .collect();
        let refs = disks.iter().map(|d| d.clone() as DiskRef).collect();
        let engine = Engine::create_pool(&dir.path().join("p"), "p", refs, MIB).unwrap();
        Rig {
            _dir: dir,
            engine,
            disks,
            cm: Arc::new(CopyManager::new()),
            target: Arc::default(),
        }
    }

    /// A LUN of the rig's target.
    fn lun(&self, name: &str, layout: LayoutKind, uid: u128) -> Arc<Lun> {
        let l = self.lun_elsewhere(name, layout, uid);
        self.target.0.lock().push(l.clone());
        l
    }

    /// A LUN of the same daemon (its copy manager) that the rig's target does not present.
    fn lun_elsewhere(&self, name: &str, layout: LayoutKind, uid: u128) -> Arc<Lun> {
        let mut spec = VdiskSpec::new(name, 16 * MIB, layout);
        spec.grain_size = Some(64 << 10);
        let v = self.engine.create_vdisk(&spec).unwrap();
        Arc::new(vdisk_lun(v, uid, false).with_copy_manager(self.cm.clone()))
    }

    /// The local nexus, logged in to the rig's target.
    fn nexus(&self) -> Nexus {
        Nexus::local().with_scope(Scope::of(&self.target))
    }

    fn flushes(&self) -> u64 {
        self.disks.iter().map(|d| d.flush_count()).sum()
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
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8)
        .collect()
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

fn tpc_out(sa: u8, list_id: u32, params: &[u8]) -> Vec<u8> {
    cdbs::tpc_out(sa, list_id, params.len())
}

fn populate(l: &Lun, list_id: u32, timeout: u32, list: &[(u64, u32)]) -> Response {
    let (c, p) = cdbs::populate_token(list_id, timeout, list);
    l.execute(&c, &p)
}

fn write_using_token(l: &Lun, list_id: u32, token: &[u8], offset: u64, delete: bool, list: &[(u64, u32)]) -> Response {
    let (c, p) = cdbs::write_using_token(list_id, token, offset, delete, list);
    l.execute(&c, &p)
}

fn rrti(l: &Lun, list_id: u32) -> Vec<u8> {
    ok(l.execute(&cdbs::receive_rod_token_information(list_id), &[]))
}

/// POPULATE TOKEN, then the token from RECEIVE ROD TOKEN INFORMATION.
fn token(l: &Lun, list_id: u32, timeout: u32, list: &[(u64, u32)]) -> Vec<u8> {
    ok(populate(l, list_id, timeout, list));
    let info = rrti(l, list_id);
    let blocks: u64 = list.iter().map(|r| r.1 as u64).sum();
    assert_eq!(u64::from_be_bytes(info[16..24].try_into().unwrap()), blocks);
    cdbs::token_of(&info)
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
    assert_eq!(
        &back[..MIB as usize],
        &data[..MIB as usize],
        "first range, as populated"
    );
    assert_eq!(
        &back[MIB as usize..],
        &data[2 * MIB as usize..3 * MIB as usize],
        "second range"
    );
    let info = rrti(&b, 2);
    assert_eq!((info[4] & 0x1F, info[5]), (0x11, 0x01));
    assert_eq!(u64::from_be_bytes(info[16..24].try_into().unwrap()), 4096);
    // Aligned with its grains: shared, not copied.
    assert!(vdisk_of(&b).unwrap().space_usage().shared_bytes >= MIB);
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
    assert_eq!(vdisk_of(&c).unwrap().space_usage().shared_bytes, 0);
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
    assert_eq!(
        invalid(write_using_token(&b, 3, &f, 0, false, &[(0, 8)])),
        0x02,
        "not ours"
    );
    let mut f = t.clone();
    f[0..4].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    assert_eq!(invalid(write_using_token(&b, 3, &f, 0, false, &[(0, 8)])), 0x01);
    let mut f = t.clone();
    f[7] = 0x10;
    assert_eq!(invalid(write_using_token(&b, 3, &f, 0, false, &[(0, 8)])), 0x0A);
    // Truncated parameter lists.
    let p = cdbs::write_using_token_params(&t, 0, false, &[(0, 8)]);
    assert_eq!(
        check(b.execute(&tpc_out(0x11, 3, &p[..300]), &p[..300])),
        (key::ILLEGAL_REQUEST, 0x1A, 0)
    );
    assert_eq!(
        check(a.execute(&tpc_out(0x10, 3, &[0u8; 10]), &[0u8; 10])),
        (key::ILLEGAL_REQUEST, 0x1A, 0)
    );
    // Ranges past the end, none at all, too many.
    assert_eq!(
        check(populate(&a, 4, 0, &[(32760, 16)])),
        (key::ILLEGAL_REQUEST, 0x21, 0)
    );
    assert_eq!(check(populate(&a, 4, 0, &[])), (key::ILLEGAL_REQUEST, 0x26, 0));
    let many: Vec<(u64, u32)> = (0..65).map(|i| (i * 8, 8)).collect();
    assert_eq!(check(populate(&a, 4, 0, &many)).0, key::ILLEGAL_REQUEST);
    // A timeout over the maximum.
    assert_eq!(
        check(populate(&a, 4, 100_000, &[(0, 8)])),
        (key::ILLEGAL_REQUEST, 0x26, 0)
    );

    // DEL_TKN: the token works once more, then is gone.
    ok(write_using_token(&b, 5, &t, 0, true, &[(0, 64)]));
    assert_eq!(invalid(write_using_token(&b, 6, &t, 0, false, &[(0, 8)])), 0x09);
    // Expiry after the inactivity timeout.
    let t = token(&a, 7, 1, &[(0, 64)]);
    std::thread::sleep(std::time::Duration::from_millis(1300));
    assert_eq!(invalid(write_using_token(&b, 8, &t, 0, false, &[(0, 8)])), 0x07);
    // A write-protected destination.
    let ro = vdisk_lun(rig.engine.vdisk("b").unwrap(), 9, true).with_copy_manager(rig.cm.clone());
    let t = token(&a, 9, 0, &[(0, 64)]);
    assert_eq!(
        check(write_using_token(&ro, 10, &t, 0, false, &[(0, 8)])),
        (key::DATA_PROTECT, 0x27, 0)
    );
    // RRTI of an operation that never was.
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[5] = 99;
    c[13] = 255;
    assert_eq!(check(a.execute(&c, &[])).0, key::ILLEGAL_REQUEST);
    // Results are per nexus: another initiator does not see ours.
    let other = Nexus::new(77, "iqn.other", [0; 6]);
    c[5] = 9;
    assert_eq!(check(a.execute_for(&other, &c, &[])).0, key::ILLEGAL_REQUEST);
    assert!(rig.engine.check().unwrap().problems.is_empty());
}

fn report_all_rod_tokens(l: &Lun, n: &Nexus) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x08;
    c[10..14].copy_from_slice(&65536u32.to_be_bytes());
    let d = ok(l.execute_for(n, &c, &[]));
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize, d.len() - 4);
    d
}

#[test]
fn report_all_rod_tokens_shows_a_nexus_only_its_own_tokens() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    let b = rig.lun("b", LayoutKind::Mirror, 2);
    write(&a, 0, &pattern(4, MIB as usize));
    let mine = token(&a, 1, 0, &[(0, 64)]);
    let listed = report_all_rod_tokens(&a, &Nexus::local());
    assert_eq!(listed.len(), 8 + 512, "the creator sees its one token");
    assert_eq!(&listed[8..], &mine[..]);
    // A host of another target (another nexus) sees no token: the bytes are the secret that
    // would let it paste a's data into a LUN of its own.
    let other = Nexus::new(77, "iqn.2026-11.io.example:intruder", [0x40, 0, 0, 0, 0, 1]);
    assert_eq!(report_all_rod_tokens(&b, &other).len(), 8, "header only");
    assert_eq!(
        report_all_rod_tokens(&a, &other).len(),
        8,
        "nor through the creator's LUN"
    );
}

/// A LUN whose write cache is off (MODE SELECT of the caching page with WCE clear).
fn write_cache_off(l: &Lun) {
    let sense = ok(l.execute(&[0x1A, 0x08, 0x08, 0, 255, 0], &[]));
    let page = &sense[4 + sense[3] as usize..];
    let mut p = vec![0u8; 4];
    p.extend_from_slice(&page[..2 + page[1] as usize]);
    p[4] &= 0x7F; // PS is reserved in MODE SELECT
    p[6] &= !0x04;
    ok(l.execute(&[0x15, 0x10, 0, 0, p.len() as u8, 0], &p));
    assert!(!l.mode().wce);
}

#[test]
fn extended_copy_reaches_only_luns_the_nexus_can_address() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    let b = rig.lun("b", LayoutKind::Mirror, 2);
    // A LUN of another target, whose ACL or CHAP the initiator did not pass.
    let secret = rig.lun_elsewhere("secret", LayoutKind::Mirror, 3);
    let hidden = pattern(0x5E, MIB as usize);
    write(&secret, 0, &hidden);
    let mine = pattern(0x11, MIB as usize);
    write(&a, 0, &mine);
    let n = rig.nexus();
    let unreachable = (key::COPY_ABORTED, 0x08, 0x04);
    // Read the other target's LUN into ours: refused, nothing written.
    assert_eq!(
        check(xcopy_for(
            &n,
            &a,
            1,
            &[cscd(&secret), cscd(&a)],
            &[segment(0, 1, 64, 0, 0)]
        )),
        unreachable
    );
    assert_eq!(read(&a, 0, 2048), mine);
    // Overwrite it from ours: refused, nothing written.
    assert_eq!(
        check(xcopy_for(
            &n,
            &a,
            2,
            &[cscd(&a), cscd(&secret)],
            &[segment(0, 1, 64, 0, 0)]
        )),
        unreachable
    );
    assert_eq!(read(&secret, 0, 2048), hidden);
    // The same list sent to the other LUN of its own target is refused too: the scope is
    // the nexus's, not the LUN's.
    assert_eq!(
        check(xcopy_for(
            &n,
            &b,
            3,
            &[cscd(&secret), cscd(&b)],
            &[segment(0, 1, 64, 0, 0)]
        )),
        unreachable
    );
    // A nexus with no target (a local tool) reaches only the LUN it sends to.
    assert_eq!(
        check(xcopy(&a, 4, &[cscd(&a), cscd(&b)], &[segment(0, 1, 64, 0, 0)])),
        unreachable
    );
    // Within its target, the copy works.
    ok(xcopy_for(
        &n,
        &a,
        5,
        &[cscd(&a), cscd(&b)],
        &[segment(0, 1, 2048, 0, 0)],
    ));
    assert_eq!(read(&b, 0, 2048), mine);
}

/// PERSISTENT RESERVE OUT from `n`: REGISTER key 9, then RESERVE with `kind`.
fn reserve(l: &Lun, n: &Nexus, kind: u8) {
    let mut p = vec![0u8; 24];
    p[8..16].copy_from_slice(&9u64.to_be_bytes());
    ok(l.execute_for(n, &[0x5F, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p));
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&9u64.to_be_bytes());
    ok(l.execute_for(n, &[0x5F, 1, kind, 0, 0, 0, 0, 0, 24, 0], &p));
}

#[test]
fn extended_copy_obeys_the_reservations_of_the_luns_it_names() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    let b = rig.lun("b", LayoutKind::Mirror, 2);
    let c = rig.lun("c", LayoutKind::Mirror, 3);
    for (l, seed) in [(&a, 1), (&b, 2), (&c, 3)] {
        write(l, 0, &pattern(seed, MIB as usize));
    }
    let n = rig.nexus();
    let holder = Nexus::new(9, "iqn.2026-11.io.example:holder", [0x40, 0, 0, 0, 0, 9]);
    // b: EXCLUSIVE ACCESS held by another host. c: WRITE EXCLUSIVE, which lets others read.
    reserve(&b, &holder, 3);
    reserve(&c, &holder, 1);
    let unreachable = (key::COPY_ABORTED, 0x08, 0x04);
    assert_eq!(
        check(xcopy_for(&n, &a, 1, &[cscd(&b), cscd(&a)], &[segment(0, 1, 64, 0, 0)])),
        unreachable,
        "reading b is refused"
    );
    assert_eq!(
        check(xcopy_for(&n, &a, 2, &[cscd(&a), cscd(&c)], &[segment(0, 1, 64, 0, 0)])),
        unreachable,
        "writing c is refused"
    );
    assert_eq!(read(&a, 0, 2048), pattern(1, MIB as usize));
    assert_eq!(read(&c, 0, 2048), pattern(3, MIB as usize));
    // A list whose second segment is refused moves nothing, not even its first.
    assert_eq!(
        check(xcopy_for(
            &n,
            &a,
            3,
            &[cscd(&c), cscd(&a), cscd(&b)],
            &[segment(0, 1, 64, 0, 0), segment(1, 2, 64, 0, 0)]
        )),
        unreachable
    );
    assert_eq!(read(&a, 0, 2048), pattern(1, MIB as usize));
    // Reading c is allowed under WRITE EXCLUSIVE.
    ok(xcopy_for(
        &n,
        &a,
        4,
        &[cscd(&c), cscd(&a)],
        &[segment(0, 1, 2048, 0, 0)],
    ));
    assert_eq!(read(&a, 0, 2048), pattern(3, MIB as usize));
    // The holder itself may copy into b.
    let holder = holder.with_scope(Scope::of(&rig.target));
    ok(xcopy_for(
        &holder,
        &a,
        5,
        &[cscd(&a), cscd(&b)],
        &[segment(0, 1, 64, 0, 0)],
    ));
}

/// A session ended from outside (its host taken out of the ACL) while its EXTENDED COPY runs
/// writes no further segment.
#[test]
fn extended_copy_stops_once_its_session_was_ended() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    let b = rig.lun("b", LayoutKind::Mirror, 2);
    write(&a, 0, &pattern(1, MIB as usize));
    write(&b, 0, &pattern(2, MIB as usize));
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let n = rig.nexus().ended_by(ended.clone());
    let segs = [segment(0, 1, 64, 0, 0), segment(0, 1, 64, 64, 64)];
    ok(xcopy_for(&n, &a, 1, &[cscd(&a), cscd(&b)], &segs));
    write(&b, 0, &pattern(2, MIB as usize));
    ended.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        check(xcopy_for(&n, &a, 2, &[cscd(&a), cscd(&b)], &segs)),
        (key::COPY_ABORTED, 0x08, 0x04)
    );
    assert_eq!(read(&b, 0, 2048), pattern(2, MIB as usize), "nothing copied");
}

#[test]
fn extended_copy_refuses_lbas_that_overflow_instead_of_wrapping() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    let b = rig.lun("b", LayoutKind::Mirror, 2);
    write(&a, 0, &pattern(1, MIB as usize));
    write(&b, 0, &pattern(2, MIB as usize));
    let n = rig.nexus();
    // 2^55 blocks of 512 bytes is 2^64 bytes: multiplied without a check, it wraps to 0.
    let wrap = 1u64 << 55;
    for (slba, dlba) in [(0, wrap), (wrap, 0), (0, u64::MAX), (u64::MAX - 3, 0)] {
        assert_eq!(
            check(xcopy_for(
                &n,
                &a,
                1,
                &[cscd(&a), cscd(&b)],
                &[segment(0, 1, 8, slba, dlba)]
            )),
            (key::COPY_ABORTED, 0, 0),
            "source LBA {slba:#x}, destination LBA {dlba:#x}"
        );
    }
    assert_eq!(read(&b, 0, 2048), pattern(2, MIB as usize), "LBA 0 untouched");
}

#[test]
fn extended_copy_into_a_lun_with_its_write_cache_off_is_flushed_before_it_completes() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Simple, 1);
    let b = rig.lun("b", LayoutKind::Mirror, 2);
    write(&a, 0, &pattern(1, MIB as usize));
    write(&b, 0, &pattern(2, MIB as usize));
    rig.engine.flush().unwrap();
    let n = rig.nexus();
    // Between layouts and within allocated, unshared grains: data is written in place, and
    // no metadata commit (which would flush on its own) is involved.
    let before = rig.flushes();
    ok(xcopy_for(&n, &a, 1, &[cscd(&a), cscd(&b)], &[segment(0, 1, 8, 3, 5)]));
    assert_eq!(rig.flushes(), before, "with the write cache on, no flush is owed");
    write_cache_off(&b);
    let before = rig.flushes();
    ok(xcopy_for(&n, &a, 2, &[cscd(&a), cscd(&b)], &[segment(0, 1, 8, 3, 13)]));
    assert!(
        rig.flushes() > before,
        "with the write cache off, the copy is durable when it completes"
    );
    assert_eq!(read(&b, 13, 8), &pattern(1, MIB as usize)[3 * 512..11 * 512]);
}

/// WRITE USING TOKEN into a LUN whose write cache is off, whose flush fails: the command
/// fails, and RECEIVE ROD TOKEN INFORMATION says so too, with nothing transferred (before,
/// the result was recorded as completed, whole, ahead of the flush).
#[test]
fn a_write_using_token_whose_flush_fails_is_reported_with_nothing_transferred() {
    let dir = tempfile::tempdir().unwrap();
    let disks: Vec<Arc<FaultyDisk>> = (0..2)
        .map(|i| FaultyDisk::new(Arc::new(MemDisk::new(&format!("f{i}"), 128 * MIB)) as DiskRef))
        .collect();
    let refs = disks.iter().map(|d| d.clone() as DiskRef).collect();
    let engine = Engine::create_pool(&dir.path().join("p"), "p", refs, MIB).unwrap();
    let cm = Arc::new(CopyManager::new());
    let lun = |name: &str, layout, uid| {
        let mut spec = VdiskSpec::new(name, 16 * MIB, layout);
        spec.grain_size = Some(64 << 10);
        let v = engine.create_vdisk(&spec).unwrap();
        vdisk_lun(v, uid, false).with_copy_manager(cm.clone())
    };
    // Between layouts into allocated grains: written in place, no metadata commit (which
    // would flush, and fail, on its own).
    let a = lun("a", LayoutKind::Simple, 1);
    let b = lun("b", LayoutKind::Mirror, 2);
    write(&a, 0, &pattern(1, MIB as usize));
    write(&b, 0, &pattern(2, MIB as usize));
    engine.flush().unwrap();
    let t = token(&a, 1, 30, &[(0, 8)]);
    write_cache_off(&b);
    for d in &disks {
        d.faults().fail_flushes(true);
    }
    let r = write_using_token(&b, 2, &t, 0, false, &[(16, 8)]);
    assert_eq!(r.status, sense::CHECK_CONDITION, "a copy whose flush failed was GOOD");
    let info = rrti(&b, 2);
    assert_eq!((info[4] & 0x1F, info[5]), (0x11, 0x02), "completed with errors");
    assert_eq!(u64::from_be_bytes(info[16..24].try_into().unwrap()), 0);
}

/// UNMAP zeroes parts of grains in place; with the write cache off it is flushed before it
/// completes, so that the blocks read as zeros (LBPRZ) after a power cut too.
#[test]
fn an_unmap_into_a_lun_with_its_write_cache_off_is_flushed_before_it_completes() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    write(&a, 0, &pattern(1, MIB as usize));
    rig.engine.flush().unwrap();
    let unmap = |lba: u64, n: u32| {
        let mut p = vec![0u8; 24];
        p[1] = 22;
        p[3] = 16;
        p[8..16].copy_from_slice(&lba.to_be_bytes());
        p[16..20].copy_from_slice(&n.to_be_bytes());
        ok(a.execute(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p));
    };
    // Within one 64 KiB grain: zeroed in place, no metadata commit.
    let before = rig.flushes();
    unmap(3, 5);
    assert_eq!(rig.flushes(), before, "with the write cache on, no flush is owed");
    write_cache_off(&a);
    let before = rig.flushes();
    unmap(13, 5);
    assert!(
        rig.flushes() > before,
        "with the write cache off, the UNMAP is durable when it completes"
    );
    assert_eq!(read(&a, 13, 5), vec![0u8; 5 * 512]);
}

/// A POPULATE TOKEN on a LUN its nexus's target no longer presents (taken out after the
/// command looked it up: its data held back meanwhile) makes no token: the revocation that
/// followed the removal has already run.
#[test]
fn a_populate_token_on_a_lun_taken_out_of_its_target_makes_no_token() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    write(&a, 0, &pattern(1, MIB as usize));
    let n = rig.nexus();
    let (c, p) = cdbs::populate_token(1, 30, &[(0, 8)]);
    ok(a.execute_for(&n, &c, &p));
    rig.target.0.lock().clear();
    let (c, p) = cdbs::populate_token(2, 30, &[(0, 8)]);
    let r = a.execute_for(&n, &c, &p);
    assert_eq!(
        (r.sense[2] & 0x0F, r.sense[12], r.sense[13]),
        (
            sense::COPY_TARGET_DEVICE_NOT_REACHABLE.key,
            sense::COPY_TARGET_DEVICE_NOT_REACHABLE.asc,
            sense::COPY_TARGET_DEVICE_NOT_REACHABLE.ascq
        )
    );
    assert_eq!(rig.cm.tokens_of(n.id).len(), 1, "only the token made while presented");
}

/// Nor does one on a LUN its target replaced meanwhile by another of the same designator:
/// a gateway that gives its pool to another puts a standby LUN of the vdisk in the real
/// one's place, then revokes the pool's tokens. Asking only whether the target still has a
/// LUN of that designator, the POPULATE TOKEN that was making its image then would make a
/// token after the revocation, holding grains the pool's next owner may free and reuse.
#[test]
fn a_populate_token_on_a_lun_replaced_in_its_target_makes_no_token() {
    let rig = Rig::new();
    let a = rig.lun("a", LayoutKind::Mirror, 1);
    write(&a, 0, &pattern(1, MIB as usize));
    let n = rig.nexus();
    let in_its_place = rig.lun_elsewhere("b", LayoutKind::Mirror, 1);
    assert_eq!(in_its_place.naa(), a.naa());
    *rig.target.0.lock() = vec![in_its_place];
    let (c, p) = cdbs::populate_token(1, 30, &[(0, 8)]);
    let s = sense::COPY_TARGET_DEVICE_NOT_REACHABLE;
    assert_eq!(check(a.execute_for(&n, &c, &p)), (s.key, s.asc, s.ascq));
    assert!(rig.cm.tokens_of(n.id).is_empty());
}

/// POPULATE TOKEN takes its share of the tokens' budget before it makes the image, and the
/// share counts the image's memory: 8 bytes per grain covered, mapped or not. 64 ranges over
/// the whole of a 1 GiB vdisk of 4 KiB grains (overlapping ranges are allowed) are 64 GiB of
/// data, well within the byte budget, but an image of 128 MiB, more than one initiator's
/// quarter of the memory: refused before the image is made. Before, the image was made
/// first (holding the vdisk's writes meanwhile), and a session running dozens of such
/// commands at once could make the daemon allocate gigabytes before any was refused.
#[test]
fn a_populate_token_whose_image_would_take_too_much_memory_is_refused_before_it_is_made() {
    let rig = Rig::new();
    let mut spec = VdiskSpec::new("small-grains", 1 << 30, LayoutKind::Mirror);
    spec.grain_size = Some(4096);
    let v = rig.engine.create_vdisk(&spec).unwrap();
    let l = Arc::new(vdisk_lun(v, 9, false).with_copy_manager(rig.cm.clone()));
    rig.target.0.lock().push(l.clone());
    let n = rig.nexus();
    let whole = ((1u64 << 30) / BS) as u32;
    let (c, p) = cdbs::populate_token(1, 30, &[(0, whole); 64]);
    let s = sense::INSUFFICIENT_RESOURCES_TO_CREATE_ROD_TOKEN;
    assert_eq!(check(l.execute_for(&n, &c, &p)), (s.key, s.asc, s.ascq));
    assert!(rig.cm.tokens_of(n.id).is_empty());
    // A quarter of it is within the share.
    let (c, p) = cdbs::populate_token(2, 30, &[(0, whole); 16]);
    ok(l.execute_for(&n, &c, &p));
    assert_eq!(rig.cm.tokens_of(n.id).len(), 1);
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
    xcopy_for(&Nexus::local(), l, list_id, cscds, segs)
}

fn xcopy_for(n: &Nexus, l: &Lun, list_id: u8, cscds: &[Vec<u8>], segs: &[Vec<u8>]) -> Response {
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
    l.execute_for(n, &c, &p)
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
    ok(xcopy_for(
        &rig.nexus(),
        &a,
        7,
        &[cscd(&a), cscd(&b)],
        &[segment(0, 1, 4096, 0, 0), segment(1, 1, 100, 0, 10_001)],
    ));
    assert_eq!(read(&b, 0, 4096), data);
    assert_eq!(read(&b, 10_001, 100), &data[..51_200]);
    assert!(
        vdisk_of(&b).unwrap().space_usage().shared_bytes >= MIB,
        "shared, not copied"
    );
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
        check(xcopy_for(
            &rig.nexus(),
            &a,
            8,
            &[cscd(&a), ghost],
            &[segment(0, 1, 8, 0, 0)]
        )),
        (key::COPY_ABORTED, 0x08, 0x04)
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
        check(xcopy_for(&rig.nexus(), &a, 8, &[cscd(&a), cscd(&b)], &[seg])),
        (key::ILLEGAL_REQUEST, 0x26, 0x09)
    );
    assert_eq!(
        check(xcopy(&a, 8, &[cscd(&a)], &[segment(0, 3, 8, 0, 0)])),
        (key::COPY_ABORTED, 0x0D, 0x02)
    );
    assert_eq!(
        check(xcopy_for(
            &rig.nexus(),
            &a,
            9,
            &[cscd(&a), cscd(&b)],
            &[segment(0, 1, 8, 0, 32_765)]
        )),
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
            assert!(
                u64::from_be_bytes(d[16..24].try_into().unwrap()) >= (10u64 << 30) / BS,
                "10 GiB in one token"
            );
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
