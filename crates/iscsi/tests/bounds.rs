//! A hostile initiator cannot make the target hold more than its limits allow: login text,
//! write buffers per session and in all, sessions per initiator, connections per portal. Each
//! bound answers the way the protocol says (a login refused, TASK SET FULL, a connection
//! closed), and what the daemon holds is read from its own accounting.

use std::sync::Arc;
use std::time::Duration;

use tessera_iscsi::initiator::{InitiatorError, LoginConfig, Session};
use tessera_iscsi::pdu::Pdu;
use tessera_iscsi::{Access, Limits, Registry, Target};
use tessera_test_support::{Disks, TestPool};
use tessera_vdisk_lun::vdisk_lun;
use tessera_volume::{Engine, LayoutKind, VdiskSpec};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

const MIB: u64 = 1 << 20;
const TARGET: &str = "iqn.2026-11.io.tessera:bounds";
const HOST: &str = "iqn.2026-11.io.example:hostile";

struct Rig {
    _dir: tempfile::TempDir,
    _engine: Engine,
    addr: String,
    reg: Arc<Registry>,
}

/// An open target with one 64 MiB LUN, under `limits`.
async fn rig(limits: Limits) -> Rig {
    let TestPool { dir, engine } = TestPool::new(Disks::Memory, 2, 128 * MIB);
    let v = engine
        .create_vdisk(&VdiskSpec::new("v", 64 * MIB, LayoutKind::Mirror))
        .unwrap();
    let reg = Registry::new();
    reg.set_limits(limits);
    let t = reg.add_target(Target::new(TARGET));
    t.set_access(Access::open());
    t.luns.write().insert(0, Arc::new(vdisk_lun(v, 0x77, false)));
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

/// A Login Request (RFC 7143 11.12) with `text`, the C bit as given, in the operational stage.
fn login_pdu(text: &[u8], cont: bool, transit: bool, isid: u8) -> Pdu {
    let mut p = Pdu::new(0x43); // immediate | LOGIN_REQ
    p.bhs[1] = if transit { 0x87 } else { 0x04 } | if cont { 0x40 } else { 0 };
    p.bhs[8..14].copy_from_slice(&[0x80, 0, 0, 0, 0x12, isid]);
    p.data = text.to_vec();
    p
}

async fn read_pdu(s: &mut TcpStream) -> Option<Pdu> {
    match tokio::time::timeout(Duration::from_secs(5), Pdu::read(s, false, false, 1 << 20)).await {
        Ok(Ok(p)) => Some(p),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_text_is_bounded_before_authentication() {
    let r = rig(Limits::default()).await;
    let mut s = TcpStream::connect(&r.addr).await.unwrap();
    // Text that never ends: 8 KiB at a time, always with the C bit.
    let chunk = vec![b'x'; 8192];
    let mut refused = None;
    for i in 0..64 {
        if login_pdu(&chunk, true, false, 1)
            .write(&mut s, false, false)
            .await
            .is_err()
        {
            break;
        }
        match read_pdu(&mut s).await {
            Some(p) if p.bhs[36] == 0 => continue,
            Some(p) => {
                refused = Some((i, p.bhs[36], p.bhs[37]));
                break;
            }
            None => break,
        }
    }
    let (at, class, _) = refused.expect("64 × 8 KiB of login text were taken without a refusal");
    assert_eq!(class, 0x02, "an initiator error");
    assert!(at * 8192 <= 64 << 10, "refused only after {} KiB", at * 8);
    // And the connection is gone.
    let mut b = [0u8; 1];
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .unwrap()
            .unwrap_or(0),
        0
    );
}

/// Logs in by raw PDUs with InitialR2T=Yes and ImmediateData=No, so that a write's data
/// comes only when asked for.
async fn raw_login(addr: &str, isid: u8) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let text = format!(
        "InitiatorName={HOST}\0TargetName={TARGET}\0SessionType=Normal\0InitialR2T=Yes\0ImmediateData=No\0\
         MaxRecvDataSegmentLength=262144\0"
    );
    login_pdu(text.as_bytes(), false, true, isid)
        .write(&mut s, false, false)
        .await
        .unwrap();
    let p = read_pdu(&mut s).await.expect("a login response");
    assert_eq!((p.bhs[36], p.bhs[37]), (0, 0), "logged in");
    assert_ne!(p.flags() & 0x80, 0, "to the full feature phase");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_buffers_are_bounded_per_session_and_in_all() {
    let limits = Limits {
        write_bytes_per_session: 64 << 20,
        write_bytes_total: 96 << 20,
        ..Limits::default()
    };
    let r = rig(limits).await;
    let mut a = raw_login(&r.addr, 1).await;
    // 200 immediate WRITE(16)s of 32 MiB each (immediate commands skip the CmdSN window),
    // whose data never comes.
    let send = |itt: u32| {
        let mut p = Pdu::new(0x41); // immediate | SCSI_CMD
        p.bhs[1] = 0x80 | 0x20; // F, W
        p.set(16, itt).set(20, 32 << 20).set(24, 1).set(28, 1);
        let mut cdb = [0u8; 16];
        cdb[0] = 0x8A;
        cdb[10..14].copy_from_slice(&(65536u32).to_be_bytes());
        p.bhs[32..48].copy_from_slice(&cdb);
        p
    };
    for itt in 1..=200 {
        send(itt).write(&mut a, false, false).await.unwrap();
    }
    let (mut r2t, mut full) = (0, 0);
    while r2t + full < 200 {
        let p = read_pdu(&mut a)
            .await
            .expect("every write is answered: an R2T or TASK SET FULL");
        match p.opcode() & 0x3F {
            0x31 => r2t += 1,
            0x21 => {
                assert_eq!(p.bhs[3], 0x28, "TASK SET FULL");
                full += 1;
            }
            op => panic!("unexpected PDU {op:#x}"),
        }
    }
    assert_eq!(r2t, 2, "64 MiB of buffers: two 32 MiB writes");
    assert_eq!(
        r.reg.write_bytes_in_use(),
        64 << 20,
        "the two accepted writes hold their buffers"
    );
    // A second session (another ISID: the same one would reinstate the first) gets what is
    // left of the daemon's budget, no more.
    let mut b = raw_login(&r.addr, 2).await;
    for itt in 1..=4 {
        send(itt).write(&mut b, false, false).await.unwrap();
    }
    let mut r2t_b = 0;
    for _ in 0..4 {
        let p = read_pdu(&mut b).await.expect("an answer");
        if p.opcode() & 0x3F == 0x31 {
            r2t_b += 1;
        }
    }
    assert_eq!(r2t_b, 1, "96 MiB in all");
    assert!(r.reg.write_bytes_in_use() <= 96 << 20);
    // The sessions end: their buffers are given back.
    drop(a);
    drop(b);
    for _ in 0..100 {
        if r.reg.write_bytes_in_use() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(r.reg.write_bytes_in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_per_initiator_and_connections_per_portal_are_bounded() {
    let limits = Limits {
        sessions_per_initiator: 2,
        connections_per_portal: 4,
        ..Limits::default()
    };
    let r = rig(limits).await;
    let cfg = |isid: u8| {
        let mut c = LoginConfig::new(HOST, Some(TARGET));
        c.isid = [0x80, 0, 0, 0, 0, isid];
        c
    };
    let one = Session::login(&r.addr, &cfg(1)).await.unwrap();
    let two = Session::login(&r.addr, &cfg(2)).await.unwrap();
    match Session::login(&r.addr, &cfg(3)).await {
        Err(InitiatorError::LoginRefused { class, detail }) => {
            assert_eq!((class, detail), (0x03, 0x02), "out of resources")
        }
        other => panic!("a third session was not refused: {:?}", other.map(|_| ())),
    }
    // Reinstating a session (same ISID) is not a new one.
    let again = Session::login(&r.addr, &cfg(2)).await.unwrap();
    drop((one, two, again));
    // Connections that never log in: four hold the portal, the fifth is closed at once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(&r.addr).await.unwrap());
    }
    let mut extra = TcpStream::connect(&r.addr).await.unwrap();
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut b))
        .await
        .expect("the fifth connection is closed, not left open")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // One goes away: there is room again.
    // (The target notices the close when it is next scheduled: a busy machine may take a
    // while, so a connection closed at once is tried again, for 10 s at most.)
    drop(idle.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let _next = loop {
        let mut next = TcpStream::connect(&r.addr).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(500), next.read(&mut b)).await {
            // Left open, waiting for a login: served.
            Err(_) => break next,
            Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(_) => panic!("a connection within the limit is not served"),
        }
    };
}

/// A connection to `addr` from local address `from`, and whether the target left it open,
/// waiting for a login (true), or closed it at once.
async fn left_open_from(addr: &str, from: &str) -> (TcpStream, bool) {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = sock.connect(addr.parse().unwrap()).await.unwrap();
    let mut b = [0u8; 1];
    let open = tokio::time::timeout(Duration::from_millis(500), s.read(&mut b))
        .await
        .is_err();
    (s, open)
}

/// One address cannot hold the portal with connections that never log in: past its bound of
/// connections logging in, its next one is closed at once, while another address is still
/// served; and a connection whose login is over no longer counts against its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_the_portal_with_logins_that_never_end() {
    let limits = Limits {
        logins_per_address: 2,
        ..Limits::default()
    };
    let r = rig(limits).await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        let (s, open) = left_open_from(&r.addr, "127.0.0.1").await;
        assert!(open, "a connection within its address's bound was closed");
        idle.push(s);
    }
    let (_third, open) = left_open_from(&r.addr, "127.0.0.1").await;
    assert!(!open, "a third connection logging in from one address was left open");
    let (_other, open) = left_open_from(&r.addr, "127.0.0.2").await;
    assert!(open, "another address was refused for the first one's logins");
    // Those two end; two sessions log in from the same address, and are past their logins.
    drop(idle);
    let cfg = |isid: u8| {
        let mut c = LoginConfig::new(HOST, Some(TARGET));
        c.isid = [0x80, 0, 0, 0, 0, isid];
        c
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut sessions = Vec::new();
    while sessions.len() < 2 {
        match Session::login(&r.addr, &cfg(sessions.len() as u8 + 1)).await {
            Ok(s) => sessions.push(s),
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no room again: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let (_next, open) = left_open_from(&r.addr, "127.0.0.1").await;
    assert!(open, "connections logged in still count as logging in");
}
