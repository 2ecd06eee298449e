//! The target and the initiator of this crate, speaking to each other over TCP: login and
//! CHAP, ACLs and discovery, data transfer, reservations across sessions, and a crowd of
//! sessions doing verified I/O while misbehaving clients come and go.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tessera_test_support::cdbs::pr_out;

use rand::{Rng, RngCore, SeedableRng};
use tessera_iscsi::initiator::{discover, InitiatorError, LoginConfig, ScsiResult, Session};
use tessera_iscsi::{Access, Chap, Registry, Target};
use tessera_test_support::{Disks, TestPool};
use tessera_vdisk_lun::vdisk_lun;
use tessera_volume::{Engine, LayoutKind, Pool, VdiskSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MIB: u64 = 1 << 20;
const OPEN: &str = "iqn.2026-11.io.tessera:open";
const SECURE: &str = "iqn.2026-11.io.tessera:secure";
const HOST_A: &str = "iqn.2026-11.io.example:host-a";
const HOST_B: &str = "iqn.2026-11.io.example:host-b";

struct Rig {
    _dir: tempfile::TempDir,
    _engine: Engine,
    addr: String,
    reg: Arc<Registry>,
}

/// What the rig's pool is made of. On files, READs the LUN can plan have their disk reads on
/// the session's ring; in memory, every command runs on the session's threads.

async fn rig() -> Rig {
    rig_on(Disks::Memory).await
}

/// A target with a 64 MiB mirrored LUN 0 behind two target names: OPEN (no rules) and SECURE
/// (ACL with HOST_A, mutual CHAP).
async fn rig_on(kind: Disks) -> Rig {
    let TestPool { dir, engine } = TestPool::new(kind, 3, 128 * MIB);
    let v = engine
        .create_vdisk(&VdiskSpec::new("v", 64 * MIB, LayoutKind::Mirror))
        .unwrap();
    let lun = Arc::new(vdisk_lun(v, 0x55, false));
    let reg = Registry::new();
    // The crowd test logs in far more sessions per initiator name than a host would.
    reg.set_limits(tessera_iscsi::Limits {
        sessions_per_initiator: 256,
        ..Default::default()
    });
    for iqn in [OPEN, SECURE] {
        let t = reg.add_target(Target::new(iqn));
        t.luns.write().insert(0, lun.clone());
    }
    reg.target(OPEN).unwrap().set_access(Access::open());
    reg.target(SECURE).unwrap().set_access(Access {
        acl: vec![HOST_A.into()],
        allow_any: false,
        chap: Some(Chap {
            user: "alice".into(),
            secret: "alice-secret-1".into(),
            mutual: Some(("tgt".into(), "target-secret-9".into())),
        }),
        initiator_chap: Vec::new(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(tessera_iscsi::serve(listener, reg.clone()));
    Rig {
        _dir: dir,
        _engine: engine,
        addr,
        reg,
    }
}

impl Rig {
    /// The pool, to see when it is closed.
    fn pool(&self) -> Weak<Pool> {
        Arc::downgrade(self._engine.pool())
    }
}

/// Runs a test on a runtime of its own and returns once the pool its rig made is closed. The
/// sessions' tasks and ring threads hold the LUN, so a pool on files can still be open when
/// the last test ends, and a metadata store still open when the process exits can abort it
/// (RocksDB's background threads against its static destructors: "pthread lock: Invalid
/// argument").
fn closing_the_pool(test: impl std::future::Future<Output = Weak<Pool>>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pool = rt.block_on(test);
    // Every task goes with the runtime, and the sessions' ring threads then end.
    drop(rt);
    let t = Instant::now();
    while pool.strong_count() > 0 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(pool.strong_count(), 0, "the pool is still open 30 s after its test");
}

fn cfg(initiator: &str, target: &str, isid: u8) -> LoginConfig {
    let mut c = LoginConfig::new(initiator, Some(target));
    c.isid[5] = isid;
    c
}

fn rw16(op: u8, lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

async fn write(s: &Session, lba: u64, data: &[u8]) -> ScsiResult {
    s.command(0, &rw16(0x8A, lba, (data.len() / 512) as u32), data.to_vec(), 0)
        .await
        .unwrap()
}

async fn read(s: &Session, lba: u64, blocks: u32) -> ScsiResult {
    s.command(0, &rw16(0x88, lba, blocks), Vec::new(), blocks as usize * 512)
        .await
        .unwrap()
}

/// Whether the target ended the session: its next command fails (within 10 s) instead of
/// being answered.
async fn ended(s: &Session) -> bool {
    let after = tokio::time::timeout(
        Duration::from_secs(10),
        s.command(0, &rw16(0x88, 0, 8), Vec::new(), 8 * 512),
    )
    .await;
    matches!(after, Ok(Err(_)))
}

fn refused(r: Result<Session, InitiatorError>) -> (u8, u8) {
    match r {
        Err(InitiatorError::LoginRefused { class, detail }) => (class, detail),
        Err(e) => panic!("login failed otherwise: {e}"),
        Ok(_) => panic!("login succeeded"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_chap_acl_discovery_and_data() {
    let r = rig().await;
    let mut data = vec![0u8; 3 * MIB as usize + 4096];
    rand::rngs::StdRng::seed_from_u64(1).fill_bytes(&mut data);

    // Open target, with and without digests: a write larger than a burst goes by R2T.
    for (i, digests) in [false, true].into_iter().enumerate() {
        let mut c = cfg(HOST_B, OPEN, i as u8);
        c.header_digest = digests;
        c.data_digest = digests;
        let s = Session::login(&r.addr, &c).await.unwrap();
        let lba = 2048 * i as u64;
        assert_eq!(write(&s, lba, &data).await.status, 0);
        let back = read(&s, lba, (data.len() / 512) as u32).await;
        assert_eq!(back.status, 0);
        assert!(back.data == data, "read back differs (digests {digests})");
        s.logout().await.unwrap();
    }

    // SECURE: ACL and mutual CHAP.
    let chap = |user: &str, secret: &str| Some((user.to_string(), secret.to_string()));
    let mut c = cfg(HOST_A, SECURE, 9);
    assert_eq!(refused(Session::login(&r.addr, &c).await), (2, 1), "no CHAP");
    c.chap = chap("alice", "alice-secret-2");
    assert_eq!(refused(Session::login(&r.addr, &c).await), (2, 1), "wrong secret");
    c.chap = chap("mallory", "alice-secret-1");
    assert_eq!(refused(Session::login(&r.addr, &c).await), (2, 1), "wrong user");
    let mut outsider = cfg(HOST_B, SECURE, 9);
    outsider.chap = chap("alice", "alice-secret-1");
    assert_eq!(
        refused(Session::login(&r.addr, &outsider).await),
        (2, 2),
        "outside the ACL"
    );
    c.chap = chap("alice", "alice-secret-1");
    Session::login(&r.addr, &c).await.unwrap().logout().await.unwrap();
    c.mutual = chap("tgt", "target-secret-9");
    let s = Session::login(&r.addr, &c).await.unwrap();
    assert_eq!(read(&s, 0, 8).await.data, data[..4096]);
    s.logout().await.unwrap();
    c.mutual = chap("tgt", "not-the-secret");
    assert_eq!(
        refused(Session::login(&r.addr, &c).await),
        (2, 1),
        "the target failed mutual CHAP"
    );

    // A name that is not an iSCSI name (control characters, over 223 bytes) is refused as
    // the initiator's error, whatever the target.
    for bad in [
        "iqn.2026-01.x:\x1b[2Jowned",
        "iqn.2026-01.x:a b",
        &format!("iqn.2026-01.x:{}", "a".repeat(220)),
    ] {
        assert_eq!(
            refused(Session::login(&r.addr, &cfg(bad, OPEN, 3)).await),
            (2, 0),
            "{bad:?}"
        );
    }

    // Discovery shows what each initiator may log in to.
    let names = |v: Vec<(String, String)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    let mut d = LoginConfig::new(HOST_A, None);
    assert_eq!(names(discover(&r.addr, &d).await.unwrap()), vec![OPEN]);
    d.chap = chap("alice", "alice-secret-1");
    assert_eq!(names(discover(&r.addr, &d).await.unwrap()), vec![OPEN, SECURE]);
    d.chap = chap("alice", "wrong-secret-00");
    assert!(discover(&r.addr, &d).await.is_err());
    let mut d = LoginConfig::new(HOST_B, None);
    d.chap = chap("alice", "alice-secret-1");
    assert_eq!(names(discover(&r.addr, &d).await.unwrap()), vec![OPEN]);
    // Refused logins and ended sessions leave nothing behind once the target has seen the
    // connections close (which it may do a moment after the initiator returns).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while r.reg.session_count() > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(r.reg.session_count() <= 1, "{} sessions left", r.reg.session_count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_are_shared_by_the_paths_to_a_lun() {
    let r = rig().await;
    // Two initiators, and the same LUN reached through two target names.
    let a = Session::login(&r.addr, &cfg(HOST_A, OPEN, 1)).await.unwrap();
    let b = Session::login(&r.addr, &cfg(HOST_B, OPEN, 2)).await.unwrap();
    let mut ca = cfg(HOST_A, SECURE, 3);
    ca.chap = Some(("alice".into(), "alice-secret-1".into()));
    let a2 = Session::login(&r.addr, &ca).await.unwrap();
    for (s, key) in [(&a, 0xA), (&b, 0xB), (&a2, 0xA2)] {
        let (cdb, d) = pr_out(6, 0, 0, key, false);
        assert_eq!(s.command(0, &cdb, d, 0).await.unwrap().status, 0);
    }
    let (cdb, d) = pr_out(1, 3, 0xA, 0, false); // EXCLUSIVE ACCESS
    assert_eq!(a.command(0, &cdb, d, 0).await.unwrap().status, 0);
    assert_eq!(read(&a, 0, 8).await.status, 0);
    assert_eq!(read(&b, 0, 8).await.status, 0x18, "RESERVATION CONFLICT");
    assert_eq!(
        read(&a2, 0, 8).await.status,
        0x18,
        "another I_T nexus of the same initiator"
    );
    let keys = a2
        .command(0, &[0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0], Vec::new(), 4096)
        .await
        .unwrap();
    assert_eq!(
        &keys.data[4..8],
        &24u32.to_be_bytes(),
        "three keys, seen through either target"
    );
    // b preempts a: a's registration goes, and a learns of it by a unit attention.
    let (cdb, d) = pr_out(5, 1, 0xB, 0xA, false);
    assert_eq!(b.command(0, &cdb, d, 0).await.unwrap().status, 0);
    let ua = read(&a, 0, 8).await;
    assert_eq!(ua.sense_key(), Some((6, 0x2A, 0x05)), "REGISTRATIONS PREEMPTED");
    assert_eq!(read(&a, 0, 8).await.status, 0, "WRITE EXCLUSIVE lets others read");
    assert_eq!(write(&a, 0, &[0u8; 512]).await.status, 0x18);
    assert_eq!(write(&b, 0, &[0u8; 512]).await.status, 0);
    let (cdb, d) = pr_out(3, 0, 0xB, 0, false); // CLEAR
    assert_eq!(b.command(0, &cdb, d, 0).await.unwrap().status, 0);
    // a2 was still registered: it heard that the preempt changed the reservation's type, then
    // of the CLEAR; a, preempted before, hears of neither.
    assert_eq!(write(&a2, 0, &[0u8; 512]).await.sense_key(), Some((6, 0x2A, 0x04)));
    assert_eq!(write(&a2, 0, &[0u8; 512]).await.sense_key(), Some((6, 0x2A, 0x03)));
    assert_eq!(write(&a2, 0, &[0u8; 512]).await.status, 0);
    assert_eq!(write(&a, 0, &[0u8; 512]).await.status, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reinstated_session_takes_over_its_nexus() {
    let r = rig().await;
    let tur = [0u8; 6];
    let a = Session::login(&r.addr, &cfg(HOST_A, OPEN, 1)).await.unwrap();
    let b = Session::login(&r.addr, &cfg(HOST_B, OPEN, 2)).await.unwrap();
    for (s, key) in [(&a, 0xA), (&b, 0xB)] {
        let (cdb, d) = pr_out(6, 0, 0, key, false);
        assert_eq!(s.command(0, &cdb, d, 0).await.unwrap().status, 0);
    }
    // b preempts a's registration; before a hears of it, a's host logs in again with the same
    // ISID (a reinstatement). The new session hears of the preemption, then of the loss of
    // the old session.
    let (cdb, d) = pr_out(4, 1, 0xB, 0xA, false);
    assert_eq!(b.command(0, &cdb, d, 0).await.unwrap().status, 0);
    let a2 = Session::login(&r.addr, &cfg(HOST_A, OPEN, 1)).await.unwrap();
    let told = |r: ScsiResult| r.sense_key();
    assert_eq!(
        told(a2.command(0, &tur, Vec::new(), 0).await.unwrap()),
        Some((6, 0x2A, 0x05))
    );
    assert_eq!(
        told(a2.command(0, &tur, Vec::new(), 0).await.unwrap()),
        Some((6, 0x29, 0x07))
    );
    assert_eq!(a2.command(0, &tur, Vec::new(), 0).await.unwrap().status, 0);
    let old = tokio::time::timeout(Duration::from_secs(10), a.command(0, &tur, Vec::new(), 0)).await;
    assert!(matches!(old, Ok(Err(_))), "the old session is closed: {old:?}");
    // An SPC-2 reservation belongs to the session that took it and ends with it. (None is
    // taken while a persistent registration exists: b unregisters.)
    let (cdb, d) = pr_out(0, 0, 0xB, 0, false);
    assert_eq!(b.command(0, &cdb, d, 0).await.unwrap().status, 0);
    assert_eq!(
        a2.command(0, &[0x16, 0, 0, 0, 0, 0], Vec::new(), 0)
            .await
            .unwrap()
            .status,
        0
    );
    assert_eq!(read(&b, 0, 8).await.status, 0x18);
    let a3 = Session::login(&r.addr, &cfg(HOST_A, OPEN, 1)).await.unwrap();
    let mut freed = false;
    for _ in 0..1500 {
        // The old session is torn down in the background (within 30 s however busy the machine).
        if read(&b, 0, 8).await.status == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the reservation ended with the session");
    assert_eq!(
        told(a3.command(0, &tur, Vec::new(), 0).await.unwrap()),
        Some((6, 0x29, 0x07))
    );
    assert_eq!(read(&a3, 0, 8).await.status, 0);
    a3.logout().await.unwrap();
    b.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_target_ends_the_sessions_logged_in_to_it() {
    let r = rig().await;
    let a = Session::login(&r.addr, &cfg(HOST_A, OPEN, 1)).await.unwrap();
    let other = Session::login(&r.addr, &cfg(HOST_B, OPEN, 2)).await.unwrap();
    assert_eq!(read(&a, 0, 8).await.status, 0);
    // Both hosts' sessions to OPEN end with it.
    let kept = r.reg.remove_target(OPEN).expect("the target was there");
    assert_eq!(kept.iqn, OPEN);
    for s in [&a, &other] {
        assert!(ended(s).await, "a session of the removed target goes on");
    }
    assert!(
        Session::login(&r.addr, &cfg(HOST_A, OPEN, 1)).await.is_err(),
        "a removed target took a login"
    );
}

/// Taking an initiator out of a target's ACL ends its sessions there at once (every one of
/// them, whatever the case of its name), keeps the others', and refuses its next login; the
/// nexuses ended are the ones its sessions had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_an_initiator_out_of_the_acl_ends_its_sessions() {
    let r = rig().await;
    let both = Access {
        acl: vec![HOST_A.into(), HOST_B.into()],
        ..Access::default()
    };
    r.reg.set_access(OPEN, both);
    let a1 = Session::login(&r.addr, &cfg(HOST_A, OPEN, 1)).await.unwrap();
    let a2 = Session::login(&r.addr, &cfg(&HOST_A.to_uppercase(), OPEN, 2))
        .await
        .unwrap();
    let b = Session::login(&r.addr, &cfg(HOST_B, OPEN, 3)).await.unwrap();
    for s in [&a1, &a2, &b] {
        assert_eq!(write(s, 0, &[7u8; 4096]).await.status, 0);
    }
    let only_b = Access {
        acl: vec![HOST_B.into()],
        ..Access::default()
    };
    let gone = r.reg.set_access(OPEN, only_b);
    assert_eq!(gone.len(), 2, "both of host A's sessions end: {gone:?}");
    assert_ne!(gone[0], gone[1]);
    for s in [&a1, &a2] {
        assert!(ended(s).await, "a session of an initiator out of the ACL goes on");
    }
    assert_eq!(read(&b, 0, 8).await.data, vec![7u8; 4096], "host B's session is kept");
    assert_eq!(
        refused(Session::login(&r.addr, &cfg(HOST_A, OPEN, 1)).await),
        (2, 2),
        "host A logs in again"
    );
    // Nothing else ends: the same rules again, or rules that admit more.
    let again = Access {
        acl: vec![HOST_B.into()],
        ..Access::default()
    };
    assert!(r.reg.set_access(OPEN, again).is_empty());
    assert!(r.reg.set_access(OPEN, Access::open()).is_empty());
    assert_eq!(read(&b, 0, 8).await.status, 0);
    assert!(r
        .reg
        .set_access("iqn.2026-11.io.tessera:none", Access::default())
        .is_empty());
}

/// An initiator that logs out and at once uses another path must find the reservation its
/// session held already gone: the target answers the logout once the session has let go of
/// its I_T nexus state, not before (libiscsi's Reserve6.Logout, which failed now and then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logout_is_answered_after_the_session_lets_go_of_its_reservation() {
    let r = rig().await;
    let (reserve, release) = ([0x16u8, 0, 0, 0, 0, 0], [0x17u8, 0, 0, 0, 0, 0]);
    let b = Session::login(&r.addr, &cfg(HOST_B, OPEN, 2)).await.unwrap();
    for round in 0..200 {
        let a = Session::login(&r.addr, &cfg(HOST_A, OPEN, 1)).await.unwrap();
        // A new nexus first hears its unit attentions (reset, the last session's loss).
        let mut ready = false;
        for _ in 0..4 {
            ready = a.command(0, &[0u8; 6], Vec::new(), 0).await.unwrap().status == 0;
            if ready {
                break;
            }
        }
        assert!(ready, "round {round}: TEST UNIT READY never succeeded");
        assert_eq!(a.command(0, &reserve, Vec::new(), 0).await.unwrap().status, 0);
        assert_eq!(read(&a, round * 8, 8).await.status, 0);
        assert_eq!(b.command(0, &reserve, Vec::new(), 0).await.unwrap().status, 0x18);
        a.logout().await.unwrap();
        let after = b.command(0, &reserve, Vec::new(), 0).await.unwrap();
        assert_eq!(after.status, 0, "round {round}: the reservation outlived the logout");
        assert_eq!(b.command(0, &release, Vec::new(), 0).await.unwrap().status, 0);
    }
    b.logout().await.unwrap();
}

/// A logout while a WRITE is on the session's ring (planned, its disk write not completed):
/// the WRITE is answered, GOOD, once its write completes, and only then the logout.
#[test]
fn a_logout_answers_the_writes_on_the_ring_first() {
    if !tessera_disk::io_uring_available() {
        tessera_disk::skip(
            "a_logout_answers_the_writes_on_the_ring_first",
            "io_uring unavailable: no ring to plan writes on",
        );
        return;
    }
    closing_the_pool(async {
        let dir = tempfile::tempdir().unwrap();
        let (disk, held) = tessera_test_support::held::HeldWrites::new("m", 64 * MIB);
        let engine =
            Engine::create_pool_with_checksums(&dir.path().join("pool"), "p", vec![disk], 4 * MIB, false).unwrap();
        let v = engine
            .create_vdisk(&VdiskSpec::new("v", 16 * MIB, LayoutKind::Simple))
            .unwrap();
        // Mapped first, so that an overwrite is planned.
        v.write(0, &vec![7u8; 64 << 10], false).unwrap();
        let reg = Registry::new();
        let t = reg.add_target(Target::new(OPEN));
        t.luns.write().insert(0, Arc::new(vdisk_lun(v, 0x56, false)));
        t.set_access(Access::open());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(tessera_iscsi::serve(listener, reg.clone()));
        let s = Session::login(&addr, &cfg(HOST_A, OPEN, 1)).await.unwrap();
        let data = vec![9u8; 4096];
        let written = async { s.command(0, &rw16(0x8A, 0, 8), data.clone(), 0).await };
        let logout = async {
            for _ in 0..1000 {
                if held.started() > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            assert_eq!(held.started(), 1, "the WRITE was not planned");
            s.logout().await.unwrap();
        };
        let release = async {
            // The logout is on its way when the disk completes the write.
            tokio::time::sleep(Duration::from_millis(300)).await;
            held.release();
        };
        let (written, (), ()) = tokio::join!(written, logout, release);
        let r = written.expect("the WRITE on the ring was not answered before the logout");
        assert_eq!(r.status, 0);
        let mut back = vec![0u8; 4096];
        engine.vdisks()[0].read(0, &mut back).unwrap();
        assert_eq!(back, data);
        drop(s);
        reg.remove_target(OPEN);
        Arc::downgrade(engine.pool())
    });
}

/// Sends `bytes` on a fresh connection, then reads until the target closes it; returns whether
/// it did within the timeout.
async fn poke(addr: &str, bytes: &[u8]) -> bool {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let mut buf = vec![0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    closed.is_ok()
}

fn login_pdu(initiator: &str, target: &str) -> Vec<u8> {
    let mut p = tessera_iscsi::pdu::Pdu::new(tessera_iscsi::pdu::op::LOGIN_REQ);
    p.bhs[0] |= 0x40;
    p.bhs[1] = 0x87;
    p.bhs[8] = 0x80;
    p.data = tessera_iscsi::text::encode(&[
        ("InitiatorName".into(), initiator.into()),
        ("TargetName".into(), target.into()),
        ("AuthMethod".into(), "None".into()),
    ]);
    p.encode(false, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sessions_keep_their_data_while_others_misbehave() {
    let _ = hundred_sessions(Disks::Memory).await;
}

#[test]
fn a_hundred_sessions_keep_their_data_while_others_misbehave_on_file_disks() {
    closing_the_pool(hundred_sessions(Disks::Files))
}

async fn hundred_sessions(disks: Disks) -> Weak<Pool> {
    let r = rig_on(disks).await;
    let sessions = 100usize;
    // Each session owns 64 KiB of the LUN and checks every write by reading it back.
    let region_blocks = 128u64;
    let mut healthy = Vec::new();
    for i in 0..sessions {
        let addr = r.addr.clone();
        healthy.push(tokio::spawn(async move {
            let mut c = cfg(&format!("iqn.2026-11.io.example:crowd-{i}"), OPEN, i as u8);
            c.header_digest = i % 3 == 0;
            let s = Session::login(&addr, &c).await.unwrap();
            let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
            let base = i as u64 * region_blocks;
            let mut image = vec![0u8; (region_blocks * 512) as usize];
            for _ in 0..12 {
                let start = rng.random_range(0..region_blocks);
                let n = rng.random_range(1..=region_blocks - start);
                let mut buf = vec![0u8; (n * 512) as usize];
                rng.fill_bytes(&mut buf);
                assert_eq!(write(&s, base + start, &buf).await.status, 0, "session {i}");
                image[(start * 512) as usize..((start + n) * 512) as usize].copy_from_slice(&buf);
                let back = read(&s, base, region_blocks as u32).await;
                assert_eq!(back.status, 0, "session {i}");
                assert!(back.data == image, "session {i}: data differs");
            }
            s.logout().await.unwrap();
            image
        }));
    }
    // Meanwhile: failed CHAP, garbage, truncated PDUs and connections dropped mid-command.
    let mut chaos = Vec::new();
    for i in 0..20u8 {
        let addr = r.addr.clone();
        chaos.push(tokio::spawn(async move {
            let mut c = cfg(HOST_A, SECURE, i);
            c.chap = Some(("alice".into(), format!("guess-{i:08}")));
            assert!(Session::login(&addr, &c).await.is_err());
            let mut junk = vec![0u8; 48 + i as usize * 7];
            rand::rngs::StdRng::seed_from_u64(1000 + i as u64).fill_bytes(&mut junk);
            assert!(poke(&addr, &junk).await, "the target kept a garbage connection open");
            // A login PDU cut short, then the connection closes.
            let pdu = login_pdu(HOST_B, OPEN);
            let mut s = TcpStream::connect(&addr).await.unwrap();
            let _ = s.write_all(&pdu[..pdu.len() / 2]).await;
            drop(s);
            // A write announced for 1 MiB whose data never comes: the connection drops.
            let s = Session::login(&addr, &cfg(HOST_B, OPEN, 100 + i)).await.unwrap();
            let cdb = rw16(0x8A, 60_000, 2048);
            let cmd = s.command(0, &cdb, vec![0xEE; 2048 * 512], 0);
            let _ = tokio::time::timeout(Duration::from_millis(1), cmd).await;
            drop(s);
        }));
    }
    for c in chaos {
        c.await.unwrap();
    }
    let mut images = Vec::new();
    for h in healthy {
        images.push(h.await.unwrap());
    }
    // A new session still logs in and sees every region as its owner left it.
    let s = Session::login(&r.addr, &cfg(HOST_B, OPEN, 250)).await.unwrap();
    for (i, image) in images.iter().enumerate() {
        let back = read(&s, i as u64 * region_blocks, region_blocks as u32).await;
        assert!(back.data == *image, "region {i} differs after the crowd left");
    }
    s.logout().await.unwrap();
    r.pool()
}

#[test]
fn reads_racing_writes_of_the_same_blocks_see_whole_writes_on_file_disks() {
    closing_the_pool(reads_racing_writes())
}

async fn reads_racing_writes() -> Weak<Pool> {
    let r = rig_on(Disks::Files).await;
    let s = Arc::new(Session::login(&r.addr, &cfg(HOST_B, OPEN, 1)).await.unwrap());
    // 64 KiB writes, each of one byte value, over blocks that READs keep asking for: a READ
    // on the ring that saw part of a write would show two values.
    let blocks = 128u32;
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            for v in 1..=150u8 {
                let data = vec![v; blocks as usize * 512];
                assert_eq!(write(&s, 0, &data).await.status, 0);
            }
        })
    };
    let mut readers = Vec::new();
    for _ in 0..6 {
        let s = s.clone();
        readers.push(tokio::spawn(async move {
            let mut last = 0u8;
            for _ in 0..150 {
                let back = read(&s, 0, blocks).await;
                assert_eq!(back.status, 0);
                let v = back.data[0];
                assert!(back.data.iter().all(|&b| b == v), "a torn read: {v} and others");
                assert!(v >= last, "a read went back in time: {v} after {last}");
                last = v;
            }
        }));
    }
    writer.await.unwrap();
    for t in readers {
        t.await.unwrap();
    }
    let back = read(&s, 0, blocks).await;
    assert!(back.data.iter().all(|&b| b == 150));
    Arc::try_unwrap(s).ok().unwrap().logout().await.unwrap();
    r.pool()
}

#[test]
fn a_read_that_fails_on_the_ring_is_answered_from_the_other_copy() {
    closing_the_pool(read_failing_on_the_ring())
}

async fn read_failing_on_the_ring() -> Weak<Pool> {
    let r = rig_on(Disks::Files).await;
    let s = Session::login(&r.addr, &cfg(HOST_B, OPEN, 2)).await.unwrap();
    let mut data = vec![0u8; 4 * MIB as usize];
    rand::rngs::StdRng::seed_from_u64(21).fill_bytes(&mut data);
    for (i, chunk) in data.chunks(MIB as usize).enumerate() {
        assert_eq!(write(&s, i as u64 * 2048, chunk).await.status, 0);
    }
    // Every member's data begins after its 1 MiB reserved area: keep only that area of m0,
    // so that each read of m0 comes back short.
    let m0 = r._dir.path().join("m0.img");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m0)
        .unwrap()
        .set_len(MIB)
        .unwrap();
    for (lba, blocks) in [(0u64, 8192u32), (2056, 16), (6144, 2048)] {
        let back = read(&s, lba, blocks).await;
        assert_eq!(back.status, 0, "{blocks} blocks at {lba}");
        let at = lba as usize * 512;
        assert!(
            back.data == data[at..at + blocks as usize * 512],
            "{blocks} blocks at {lba}"
        );
    }
    // The reads that failed on m0 were read again the ordinary way, which read the other
    // copy and repaired m0 with it.
    assert!(std::fs::metadata(&m0).unwrap().len() > MIB, "m0 was not repaired");
    s.logout().await.unwrap();
    r.pool()
}
