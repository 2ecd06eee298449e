//! The server and the client of this crate over TCP: negotiation, data, holes and block
//! status, refusals, malformed traffic, and a crowd of verifying clients. The vdisks lie on
//! file disks, whose reads the server submits to its own ring; memory disks, which it cannot
//! read that way, take the worker threads' path, and one test runs there too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, RngCore, SeedableRng};
use tessera_nbd::client::{list, Client, ClientError};
use tessera_nbd::proto::{self, cflag, cmd, errno};
use tessera_nbd::{Export, Registry};
use tessera_test_support::{Disks, TestPool};
use tessera_volume::{Engine, LayoutKind, VdiskSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MIB: u64 = 1 << 20;

struct Rig {
    _dir: tempfile::TempDir,
    _engine: Engine,
    addr: String,
    reg: Arc<Registry>,
}

/// Connections are served on threads of their own, and each holds its export's vdisk. The
/// engine must close here, on the test's thread, and not on a connection's thread that is
/// still letting go while the test process exits and tears down the statics RocksDB uses.
impl Drop for Rig {
    fn drop(&mut self) {
        for e in self.reg.list() {
            self.reg.remove(&e.name);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for v in self._engine.vdisks() {
            // One reference is the engine's, one is `v`: any other is a connection's.
            while Arc::strong_count(&v) > 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Exports "rw" (a 64 MiB thin mirrored vdisk on two file disks) and "ro" (the same vdisk,
/// read-only).
async fn rig() -> Rig {
    rig_on(Disks::Files).await
}

async fn rig_on(kind: Disks) -> Rig {
    let TestPool { dir, engine } = TestPool::new(kind, 2, 160 * MIB);
    let v = engine
        .create_vdisk(&VdiskSpec::new("v", 64 * MIB, LayoutKind::Mirror))
        .unwrap();
    let reg = Registry::new();
    reg.add(Export::new("rw", "p/v", v.clone(), false));
    reg.add(Export::new("ro", "p/v read-only", v, true));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(tessera_nbd::serve(listener, reg.clone()));
    Rig {
        _dir: dir,
        _engine: engine,
        addr,
        reg,
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn code(e: ClientError) -> u32 {
    match e {
        ClientError::Nbd { code, .. } => code,
        other => panic!("expected an NBD error, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiation_reports_the_export() {
    let rig = rig().await;
    let c = Client::connect(&rig.addr, "rw").await.unwrap();
    assert_eq!(c.info.size, 64 * MIB);
    assert!(c.info.structured);
    assert!(c.info.allocation_context.is_some());
    assert_eq!(c.info.min_block, 512);
    assert_eq!(c.info.preferred_block, 4096, "512e");
    assert_eq!(c.info.max_payload, 32 << 20);
    assert!(!c.info.read_only());
    let f = c.info.flags;
    for flag in [
        proto::tflag::SEND_FLUSH,
        proto::tflag::SEND_FUA,
        proto::tflag::SEND_TRIM,
        proto::tflag::SEND_WRITE_ZEROES,
        proto::tflag::CAN_MULTI_CONN,
    ] {
        assert_ne!(f & flag, 0, "flag {flag:#x} missing from {f:#x}");
    }
    let ro = Client::connect(&rig.addr, "ro").await.unwrap();
    assert!(ro.info.read_only());
    assert_eq!(ro.info.flags & proto::tflag::SEND_TRIM, 0);

    let mut names: Vec<_> = list(&rig.addr).await.unwrap();
    names.sort();
    assert_eq!(
        names,
        vec![
            ("ro".to_string(), "p/v read-only".to_string()),
            ("rw".to_string(), "p/v".to_string())
        ]
    );
    match Client::connect(&rig.addr, "nope").await {
        Err(ClientError::Refused { reply, message, .. }) => {
            assert_eq!(reply, proto::rep::ERR_UNKNOWN);
            assert!(message.contains("nope"), "{message}");
        }
        other => panic!("unknown export accepted: {:?}", other.map(|c| c.info.clone())),
    }
    // Two exports: the empty name is not a default.
    assert!(Client::connect(&rig.addr, "").await.is_err());
    rig.reg.remove("ro");
    let d = Client::connect(&rig.addr, "").await.unwrap();
    assert_eq!(d.info.name, "rw");
    c.disconnect().await.unwrap();
    // A vdisk that presents 512-byte physical blocks prefers them over NBD too.
    let mut spec = VdiskSpec::new("n", MIB, LayoutKind::Mirror);
    spec.physical_block_size = Some(512);
    let v = rig._engine.create_vdisk(&spec).unwrap();
    rig.reg.add(Export::new("512n", "p/n", v, false));
    let n = Client::connect(&rig.addr, "512n").await.unwrap();
    assert_eq!((n.info.min_block, n.info.preferred_block), (512, 512));
}

/// A BLOCK_STATUS over more than the span one reply answers for covers its start, and the
/// client asks again from where it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_block_status_is_answered_for_its_start() {
    let rig = rig().await;
    let big = rig
        ._engine
        .create_vdisk(&VdiskSpec::new("big", 1 << 30, LayoutKind::Mirror))
        .unwrap();
    rig.reg.add(Export::new("big", "p/big", big, false));
    let c = Client::connect(&rig.addr, "big").await.unwrap();
    let span = tessera_nbd::MAX_BLOCK_STATUS_SPAN;
    c.write(span + MIB, &pattern(3, 64 << 10), false).await.unwrap();
    let ext = c.block_status(0, (1u64 << 30) as u32 - 512).await.unwrap();
    let covered: u64 = ext.iter().map(|e| e.0 as u64).sum();
    assert_eq!(covered, span, "{ext:?}");
    let ext = c.block_status(span, MIB as u32 * 2).await.unwrap();
    assert_eq!(ext[0], (MIB as u32, proto::STATE_HOLE | proto::STATE_ZERO), "{ext:?}");
    assert_eq!(ext[1].1, 0, "{ext:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_holes_and_block_status() {
    let rig = rig().await;
    let c = Client::connect(&rig.addr, "rw").await.unwrap();
    // Never written: all hole.
    assert_eq!(c.read(0, 8192).await.unwrap(), vec![0u8; 8192]);
    let ext = c.block_status(0, 64 * MIB as u32).await.unwrap();
    assert_eq!(ext, vec![(64 * MIB as u32, proto::STATE_HOLE | proto::STATE_ZERO)]);

    let a = pattern(1, 3 * MIB as usize);
    c.write(MIB, &a, false).await.unwrap();
    c.flush().await.unwrap();
    assert_eq!(c.read(MIB, a.len() as u32).await.unwrap(), a);
    // A read that straddles data and holes comes back whole, in chunks or not.
    let mut want = vec![0u8; 6 * MIB as usize];
    want[MIB as usize..4 * MIB as usize].copy_from_slice(&a);
    assert_eq!(c.read(0, 6 * MIB as u32).await.unwrap(), want);
    assert_eq!(c.read_unfragmented(0, 6 * MIB as u32).await.unwrap(), want);
    let ext = c.block_status(0, 8 * MIB as u32).await.unwrap();
    assert_eq!(ext[0], (MIB as u32, 3));
    assert_eq!(ext[1], (3 * MIB as u32, 0));
    assert_eq!(ext.iter().map(|e| e.0 as u64).sum::<u64>(), 8 * MIB);

    // TRIM and WRITE_ZEROES read back as zeros; whole grains become holes again.
    c.trim(MIB, MIB as u32).await.unwrap();
    c.write_zeroes(2 * MIB, 4096, 0).await.unwrap();
    c.write_zeroes(3 * MIB, MIB as u32, cflag::NO_HOLE | cflag::FUA)
        .await
        .unwrap();
    let back = c.read(MIB, 3 * MIB as u32).await.unwrap();
    assert!(back[..MIB as usize + 4096].iter().all(|&b| b == 0));
    assert_eq!(
        &back[MIB as usize + 4096..2 * MIB as usize],
        &a[MIB as usize + 4096..2 * MIB as usize]
    );
    assert!(back[2 * MIB as usize..].iter().all(|&b| b == 0));
    let ext = c.block_status(MIB, MIB as u32).await.unwrap();
    assert_eq!(ext[0].1, 3, "a trimmed grain is a hole: {ext:?}");
    let ext = c.block_status(3 * MIB, MIB as u32).await.unwrap();
    assert_eq!(ext[0].1, 0, "NO_HOLE zeros stay allocated: {ext:?}");
    // FAST_ZERO with NO_HOLE cannot be fast: refused at once.
    let e = c
        .write_zeroes(0, MIB as u32, cflag::NO_HOLE | cflag::FAST_ZERO)
        .await
        .unwrap_err();
    assert_eq!(code(e), errno::ENOTSUP);
    c.write_zeroes(0, MIB as u32, cflag::FAST_ZERO).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_errors_and_the_connection_goes_on() {
    let rig = rig().await;
    let c = Client::connect(&rig.addr, "rw").await.unwrap();
    let ro = Client::connect(&rig.addr, "ro").await.unwrap();
    let data = pattern(2, 4096);
    c.write(0, &data, false).await.unwrap();

    assert_eq!(code(ro.write(0, &data, false).await.unwrap_err()), errno::EPERM);
    assert_eq!(code(ro.trim(0, 4096).await.unwrap_err()), errno::EPERM);
    assert_eq!(code(ro.write_zeroes(0, 4096, 0).await.unwrap_err()), errno::EPERM);
    assert_eq!(ro.read(0, 4096).await.unwrap(), data, "a read-only export still reads");

    // Unaligned, beyond the end, overflowing the offset, too long, unknown command.
    assert_eq!(code(c.write(100, &data, false).await.unwrap_err()), errno::EINVAL);
    assert_eq!(code(c.read(0, 100).await.unwrap_err()), errno::EINVAL);
    assert_eq!(code(c.read(64 * MIB - 512, 1024).await.unwrap_err()), errno::EINVAL);
    assert_eq!(code(c.read(u64::MAX - 511, 512).await.unwrap_err()), errno::EINVAL);
    assert_eq!(code(c.read(0, (32 << 20) + 512).await.unwrap_err()), errno::EINVAL);
    assert_eq!(code(c.raw(42, 0, 0, 0, &[]).await.unwrap_err()), errno::EINVAL);
    let big = vec![7u8; (32 << 20) + 512];
    assert_eq!(code(c.write(0, &big, false).await.unwrap_err()), errno::EOVERFLOW);
    // Still in step after all that, and nothing changed.
    assert_eq!(c.read(0, 4096).await.unwrap(), data);
    assert_eq!(c.raw(cmd::CACHE, 0, 0, 4096, &[]).await.unwrap(), Vec::<u8>::new());
}

/// A connection to an export that is removed while it is idle ends at once, not at its
/// client's next request (a client that reconnects when its connection closes, as qemu's
/// with reconnect-delay, does so then); the other exports' connections go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_to_a_removed_export_ends_at_once() {
    let rig = rig().await;
    let idle = Client::connect(&rig.addr, "rw").await.unwrap();
    let other = Client::connect(&rig.addr, "ro").await.unwrap();
    idle.read(0, 4096).await.unwrap();
    rig.reg.remove("rw").expect("it was offered");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !idle.is_closed() {
        assert!(std::time::Instant::now() < deadline, "the idle connection stays open");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!other.is_closed());
    other.read(0, 4096).await.unwrap();
}

/// An export added under the name of one still offered takes its place whole: the
/// connections to the one it replaces end as if it had been removed, so that nothing writes
/// through an export no registry lists (a later removal would not reach it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_added_in_place_of_another_ends_the_connections_to_it() {
    let rig = rig().await;
    let rw = Client::connect(&rig.addr, "rw").await.unwrap();
    rw.write(0, &pattern(3, 4096), false).await.unwrap();
    let old = rig.reg.get("rw").unwrap();
    rig.reg.add(Export::new("rw", "p/v again", old.vdisk.clone(), false));
    assert!(old.withdrawn(), "the export replaced is still in use");
    match rw.write(0, &pattern(4, 4096), false).await {
        Err(ClientError::Nbd { code, .. }) => assert_eq!(code, errno::ESHUTDOWN),
        Err(ClientError::Closed | ClientError::Io(_)) => {}
        other => panic!("a write through a replaced export was served: {other:?}"),
    }
    let again = Client::connect(&rig.addr, "rw").await.unwrap();
    assert_eq!(again.read(0, 4096).await.unwrap(), pattern(3, 4096));
}

/// An export's writes are its name's: offered again (its pool served again), a loss of what
/// its clients wrote before is told at their next flush through it, not kept for an object
/// gone; another export's are another writer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_offered_again_is_the_same_writer() {
    let rig = rig().await;
    let old = rig.reg.get("rw").unwrap();
    let again = Export::new("rw", "p/v again", old.vdisk.clone(), false);
    assert_eq!(again.writer(), old.writer());
    assert_ne!(rig.reg.get("ro").unwrap().writer(), old.writer());
}

/// Removing an export ends its use by the connections open to it: a request that reaches one
/// is refused with ESHUTDOWN and the connection closes (an idle one closes at once), even
/// when an export of the same name, read-only this time, took its place; the other exports'
/// connections go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_export_is_not_used_by_the_connections_made_before() {
    let rig = rig().await;
    let rw = Client::connect(&rig.addr, "rw").await.unwrap();
    let ro = Client::connect(&rig.addr, "ro").await.unwrap();
    rw.write(0, &pattern(1, 4096), false).await.unwrap();
    let v = rig.reg.get("rw").unwrap().vdisk.clone();
    let gone = rig.reg.remove("rw").expect("it was offered");
    assert!(gone.withdrawn());
    rig.reg.add(Export::new("rw", "p/v read-only now", v, true));
    // Refused: by the connection's end, which comes at once for one idle at the removal, or
    // with ESHUTDOWN if the request reaches the connection before it ends (its payload read
    // first, as for the EOVERFLOW refusal of `bad_requests_get_errors_and_the_connection_goes_on`,
    // which takes the same path).
    let write = rw.write(0, &pattern(2, 4096), false).await.map(drop);
    for attempt in [write, rw.read(0, 4096).await.map(drop), rw.flush().await] {
        match attempt {
            Err(ClientError::Nbd { code, .. }) => assert_eq!(code, errno::ESHUTDOWN),
            Err(ClientError::Closed | ClientError::Io(_)) => {}
            other => panic!("a request to a removed export was served: {other:?}"),
        }
    }
    assert!(
        matches!(rw.read(0, 4096).await, Err(ClientError::Closed | ClientError::Io(_))),
        "the connection stays open"
    );
    assert_eq!(
        ro.read(0, 4096).await.unwrap(),
        pattern(1, 4096),
        "the write before is kept, the one after refused"
    );
    let again = Client::connect(&rig.addr, "rw").await.unwrap();
    assert!(again.info.read_only());
    assert_eq!(
        code(again.write(0, &pattern(3, 4096), false).await.unwrap_err()),
        errno::EPERM
    );
}

/// Raw handshake up to the options phase.
async fn greet(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    assert_eq!(&hello[8..16], b"IHAVEOPT");
    s.write_u32(3).await.unwrap();
    s
}

/// Sends an option request.
async fn send_option(s: &mut TcpStream, option: u32, data: &[u8]) {
    let mut v = proto::IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    s.write_all(&v).await.unwrap();
}

/// Sends an option request and reads its (one) reply: type and data.
async fn option(s: &mut TcpStream, option: u32, data: &[u8]) -> (u32, Vec<u8>) {
    send_option(s, option, data).await;
    assert_eq!(s.read_u64().await.unwrap(), proto::OPTION_REPLY_MAGIC);
    assert_eq!(s.read_u32().await.unwrap(), option);
    let kind = s.read_u32().await.unwrap();
    let len = s.read_u32().await.unwrap();
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d).await.unwrap();
    (kind, d)
}

/// True when the server has closed the connection.
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_negotiation_and_requests() {
    let rig = rig().await;
    // Options with lying lengths, unknown options, meta contexts before structured replies.
    let mut s = greet(&rig.addr).await;
    let (k, msg) = option(&mut s, proto::opt::GO, &[0, 0, 0, 50, b'r']).await;
    assert_eq!(k, proto::rep::ERR_INVALID);
    assert!(!msg.is_empty(), "errors carry a message");
    assert_eq!(option(&mut s, 99, b"xyz").await.0, proto::rep::ERR_UNSUP);
    assert_eq!(option(&mut s, proto::opt::STARTTLS, &[]).await.0, proto::rep::ERR_UNSUP);
    assert_eq!(option(&mut s, proto::opt::LIST, b"x").await.0, proto::rep::ERR_INVALID);
    let q = proto::MetaContextRequest {
        name: "rw".into(),
        queries: vec![proto::BASE_ALLOCATION.into()],
    };
    assert_eq!(
        option(&mut s, proto::opt::SET_META_CONTEXT, &q.encode()).await.0,
        proto::rep::ERR_INVALID
    );
    assert_eq!(
        option(&mut s, proto::opt::STRUCTURED_REPLY, &[]).await.0,
        proto::rep::ACK
    );
    let (k, d) = option(
        &mut s,
        proto::opt::LIST_META_CONTEXT,
        &proto::MetaContextRequest {
            name: "rw".into(),
            queries: vec![],
        }
        .encode(),
    )
    .await;
    assert_eq!(k, proto::rep::META_CONTEXT);
    assert_eq!(&d[4..], proto::BASE_ALLOCATION.as_bytes());
    assert_eq!(s.read_u64().await.unwrap(), proto::OPTION_REPLY_MAGIC);
    let mut rest = [0u8; 12];
    s.read_exact(&mut rest).await.unwrap();
    assert_eq!(u32::from_be_bytes(rest[4..8].try_into().unwrap()), proto::rep::ACK);
    assert_eq!(option(&mut s, proto::opt::ABORT, &[]).await.0, proto::rep::ACK);
    assert!(closed(&mut s).await);

    // Bad option magic, unknown client flags, an export name that does not exist, an
    // oversized option: the server hangs up.
    let mut s = greet(&rig.addr).await;
    s.write_all(&[0u8; 16]).await.unwrap();
    assert!(closed(&mut s).await);
    let mut s = TcpStream::connect(&rig.addr).await.unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    s.write_u32(0x80).await.unwrap();
    assert!(closed(&mut s).await);
    let mut s = greet(&rig.addr).await;
    send_option(&mut s, proto::opt::EXPORT_NAME, b"nope").await;
    assert!(closed(&mut s).await);
    let mut s = greet(&rig.addr).await;
    let mut v = proto::IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&proto::opt::GO.to_be_bytes());
    v.extend_from_slice(&u32::MAX.to_be_bytes());
    s.write_all(&v).await.unwrap();
    assert!(closed(&mut s).await);

    // The old way in (NBD_OPT_EXPORT_NAME) works, with simple replies; a request with a bad
    // magic ends the connection.
    let mut s = greet(&rig.addr).await;
    send_option(&mut s, proto::opt::EXPORT_NAME, b"rw").await;
    assert_eq!(s.read_u64().await.unwrap(), 64 * MIB);
    let _flags = s.read_u16().await.unwrap();
    let req = proto::Request {
        flags: 0,
        kind: cmd::READ,
        cookie: 77,
        offset: 0,
        length: 512,
    };
    s.write_all(&req.encode()).await.unwrap();
    assert_eq!(s.read_u32().await.unwrap(), proto::SIMPLE_REPLY_MAGIC);
    assert_eq!(s.read_u32().await.unwrap(), 0);
    assert_eq!(s.read_u64().await.unwrap(), 77);
    let mut d = [1u8; 512];
    s.read_exact(&mut d).await.unwrap();
    assert_eq!(d, [0u8; 512]);
    let mut bad = req.encode();
    bad[1] ^= 0xff;
    s.write_all(&bad).await.unwrap();
    assert!(closed(&mut s).await);

    // Through it all, the healthy client is served.
    let c = Client::connect(&rig.addr, "rw").await.unwrap();
    c.write(0, &[9u8; 4096], true).await.unwrap();
    assert_eq!(c.read(0, 4096).await.unwrap(), vec![9u8; 4096]);
}

/// Clients on separate connections write disjoint regions with many requests in flight and
/// verify each other's data; a disconnect answers every request already sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_verify_their_data() {
    clients_verify_their_data(Disks::Files).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_verify_their_data_on_disks_read_by_workers() {
    clients_verify_their_data(Disks::Memory).await;
}

async fn clients_verify_their_data(kind: Disks) {
    let rig = rig_on(kind).await;
    let mut tasks = Vec::new();
    for id in 0..8u64 {
        let addr = rig.addr.clone();
        tasks.push(tokio::spawn(async move {
            let c = Arc::new(Client::connect(&addr, "rw").await.unwrap());
            let base = id * 8 * MIB;
            let mut rng = rand::rngs::StdRng::seed_from_u64(id);
            let mut writes = Vec::new();
            for i in 0..64u64 {
                let len = 4096 * rng.random_range(1..=16) as usize;
                let off = base + i * 128 * 1024;
                let data = pattern(id * 1000 + i, len);
                let c = c.clone();
                writes.push(tokio::spawn(async move {
                    c.write(off, &data, false).await.unwrap();
                    (off, data)
                }));
            }
            let mut expect = Vec::new();
            for w in writes {
                expect.push(w.await.unwrap());
            }
            c.flush().await.unwrap();
            for (off, data) in &expect {
                assert_eq!(&c.read(*off, data.len() as u32).await.unwrap(), data);
            }
            expect
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    // Another connection sees everything (CAN_MULTI_CONN).
    let c = Arc::new(Client::connect(&rig.addr, "rw").await.unwrap());
    for (off, data) in &all {
        assert_eq!(&c.read(*off, data.len() as u32).await.unwrap(), data);
    }
    let c = Arc::try_unwrap(c).ok().unwrap();
    c.disconnect().await.unwrap();
}

/// A client that sends a burst of large reads and hangs up without reading the answers: the
/// connection's threads all end (the export's connection count drops to zero), and others are
/// served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_burst_releases_its_connection() {
    let rig = rig().await;
    let export = rig.reg.get("rw").unwrap();
    for round in 0..3 {
        let mut s = greet(&rig.addr).await;
        send_option(&mut s, proto::opt::EXPORT_NAME, b"rw").await;
        let mut info = [0u8; 10];
        s.read_exact(&mut info).await.unwrap();
        for i in 0..64u64 {
            let req = proto::Request {
                flags: 0,
                kind: cmd::READ,
                cookie: i,
                offset: (i % 16) * MIB,
                length: MIB as u32,
            };
            s.write_all(&req.encode()).await.unwrap();
        }
        drop(s);
        let c = Client::connect(&rig.addr, "rw").await.unwrap();
        assert_eq!(c.read(0, 4096).await.unwrap().len(), 4096, "round {round}");
        c.disconnect().await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while export.connections() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(export.connections(), 0, "connections still held open");
}

/// Reads sent back to back arrive together and are answered as a batch: each gets its own
/// data or its own error, matched by cookie; a write among them ends a batch and is answered
/// too. (Requests in flight together are unordered, so reads of the written range may see
/// the old or the new data.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_reads_are_each_answered() {
    let rig = rig().await;
    let c = Client::connect(&rig.addr, "rw").await.unwrap();
    let data = pattern(9, 2 * MIB as usize);
    c.write(0, &data, true).await.unwrap();
    let mut disk = data.clone();
    disk.resize(64 * MIB as usize, 0);

    let mut s = greet(&rig.addr).await;
    send_option(&mut s, proto::opt::EXPORT_NAME, b"rw").await;
    assert_eq!(s.read_u64().await.unwrap(), 64 * MIB);
    let _flags = s.read_u16().await.unwrap();
    // cookie -> the data expected, or the error.
    let mut expect: std::collections::HashMap<u64, Result<Vec<u8>, u32>> = Default::default();
    let mut wire = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let written = vec![0x5Au8; 8192];
    for cookie in 0..60u64 {
        let (kind, offset, length) = match cookie {
            7 => (cmd::READ, 100, 4096),              // unaligned
            13 => (cmd::READ, 64 * MIB - 4096, 8192), // past the end
            30 => (cmd::WRITE, 3 * MIB, 8192),        // a write among the reads
            _ => {
                let len = 4096 * rng.random_range(1..=8u32);
                // Data, holes, and reads straddling both.
                let off = 4096 * rng.random_range(0..(4 * MIB / 4096));
                (cmd::READ, off, len)
            }
        };
        let req = proto::Request {
            flags: 0,
            kind,
            cookie,
            offset,
            length,
        };
        wire.extend_from_slice(&req.encode());
        if kind == cmd::WRITE {
            wire.extend_from_slice(&written);
            expect.insert(cookie, Ok(Vec::new()));
            continue;
        }
        let end = offset as usize + length as usize;
        expect.insert(
            cookie,
            match cookie {
                7 | 13 => Err(errno::EINVAL),
                _ => Ok(disk[offset as usize..end].to_vec()),
            },
        );
    }
    s.write_all(&wire).await.unwrap();
    for _ in 0..expect.len() {
        assert_eq!(s.read_u32().await.unwrap(), proto::SIMPLE_REPLY_MAGIC);
        let error = s.read_u32().await.unwrap();
        let cookie = s.read_u64().await.unwrap();
        match expect.remove(&cookie).expect("a reply per cookie, once") {
            Err(code) => assert_eq!(error, code, "cookie {cookie}"),
            Ok(want) => {
                assert_eq!(error, 0, "cookie {cookie}");
                let mut got = vec![0u8; want.len()];
                s.read_exact(&mut got).await.unwrap();
                let off = u64::from_be_bytes(wire_offset(&wire, cookie));
                let overlaps_write = off < 3 * MIB + 8192 && off + want.len() as u64 > 3 * MIB;
                if !overlaps_write {
                    assert!(got == want, "cookie {cookie}: wrong data");
                }
            }
        }
    }
    assert!(expect.is_empty());
}

/// The offset field of the request with this cookie in a stream of requests.
fn wire_offset(wire: &[u8], cookie: u64) -> [u8; 8] {
    let mut at = 0;
    loop {
        let req: &[u8; proto::REQUEST_LEN] = wire[at..at + proto::REQUEST_LEN].try_into().unwrap();
        let r = proto::Request::parse(req).unwrap();
        if r.cookie == cookie {
            return r.offset.to_be_bytes();
        }
        at += proto::REQUEST_LEN + if r.kind == cmd::WRITE { r.length as usize } else { 0 };
    }
}

/// A read that fails on the ring (here: past the end of a member file cut short behind the
/// engine's back) is read again the synchronous way, which reads the other copy of the
/// mirror: the client gets its data, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_fails_on_the_ring_is_answered_from_the_other_copy() {
    let rig = rig().await;
    let c = Client::connect(&rig.addr, "rw").await.unwrap();
    let data = pattern(21, 4 * MIB as usize);
    c.write(0, &data, true).await.unwrap();
    // Both members' data begins after the 1 MiB reserved area; keep only that area of m0.
    let m0 = rig._dir.path().join("m0.img");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m0)
        .unwrap()
        .set_len(MIB)
        .unwrap();
    for (off, len) in [(0, 4 * MIB), (MIB + 4096, 8192), (3 * MIB, MIB)] {
        let got = c.read(off, len as u32).await.unwrap();
        assert!(got == data[off as usize..(off + len) as usize], "{len} bytes at {off}");
    }
    // The reads that failed on m0 were read again from it, failed, and it was repaired
    // with the other copy's data.
    assert!(std::fs::metadata(&m0).unwrap().len() > MIB, "m0 was not repaired");
    c.disconnect().await.unwrap();
}
