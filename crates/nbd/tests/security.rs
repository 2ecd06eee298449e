//! Who may use an NBD listener, checked with libnbd's own tools (Debian libnbd-bin, built on
//! GnuTLS) where they apply: a listener that requires TLS refuses every option before
//! NBD_OPT_STARTTLS; TLS with a pre-shared key (`nbds://` with `tls-psk-file`) and with an
//! X.509 certificate serves; a wrong key does not; a unix socket serves local clients; and a
//! hostile client can make a connection hold only so many bytes, and a listener only so many
//! connections.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tessera_nbd::client::{Client, ClientError};
use tessera_nbd::proto::{self, opt, rep};
use tessera_nbd::{Export, Policy, Registry, TlsConfig, TlsServer};
use tessera_test_support::{Disks, TestPool};
use tessera_volume::{Engine, LayoutKind, VdiskSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream, UnixListener};

const MIB: u64 = 1 << 20;

struct Rig {
    dir: tempfile::TempDir,
    _engine: Engine,
    reg: Arc<Registry>,
}

fn rig() -> Rig {
    let TestPool { dir, engine } = TestPool::new(Disks::Files, 2, 160 * MIB);
    let v = engine
        .create_vdisk(&VdiskSpec::new("v", 64 * MIB, LayoutKind::Mirror))
        .unwrap();
    let reg = Registry::new();
    reg.add(Export::new("rw", "p/v", v, false));
    Rig {
        dir,
        _engine: engine,
        reg,
    }
}

async fn listen(reg: &Arc<Registry>, policy: Policy) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(tessera_nbd::serve_tcp(l, reg.clone(), policy));
    addr
}

fn psk(dir: &Path, user: &str, key_hex: &str) -> std::path::PathBuf {
    let p = dir.join(format!("{user}-{}.psk", &key_hex[..4]));
    std::fs::write(&p, format!("{user}:{key_hex}\n")).unwrap();
    p
}

const KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

fn tls_required(c: &TlsConfig) -> Policy {
    Policy {
        tls: Some(TlsServer::new(c).unwrap()),
        require_tls: true,
        ..Policy::plain()
    }
}

/// Runs a libnbd tool; (success, stdout + stderr). None when libnbd-bin is not installed.
fn tool(cmd: &str, args: &[&str]) -> Option<(bool, String)> {
    let o = match Command::new(cmd).args(args).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tessera_disk::skip(
                &format!("a step of this file's tests that runs {cmd}"),
                "not installed (Debian libnbd-bin)",
            );
            return None;
        }
        Err(e) => panic!("{cmd}: {e}"),
    };
    Some((
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    ))
}

/// The fixed newstyle greeting, then one option sent; the stream, for its reply.
async fn send_first_option(addr: &str, option: u32, data: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    s.write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).await.unwrap();
    let mut o = Vec::new();
    o.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    o.extend_from_slice(&option.to_be_bytes());
    o.extend_from_slice(&(data.len() as u32).to_be_bytes());
    o.extend_from_slice(data);
    s.write_all(&o).await.unwrap();
    s
}

/// The fixed newstyle greeting, then one option; the option reply's type.
async fn first_option_reply(addr: &str, option: u32, data: &[u8]) -> Option<u32> {
    let mut s = send_first_option(addr, option, data).await;
    let mut head = [0u8; 20];
    match tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head)).await {
        Ok(Ok(_)) => Some(u32::from_be_bytes(head[12..16].try_into().unwrap())),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_requires_tls_refuses_every_option_before_starttls() {
    let r = rig();
    let c = TlsConfig {
        psk_file: Some(psk(r.dir.path(), "alice", KEY)),
        ..Default::default()
    };
    let addr = listen(&r.reg, tls_required(&c)).await;
    for option in [
        opt::GO,
        opt::INFO,
        opt::LIST,
        opt::STRUCTURED_REPLY,
        opt::LIST_META_CONTEXT,
    ] {
        assert_eq!(
            first_option_reply(&addr, option, &[]).await,
            Some(rep::ERR_TLS_REQD),
            "option {option}"
        );
    }
    // A plain client gets no export, and no data.
    match Client::connect(&addr, "rw").await {
        Err(ClientError::Refused { reply, .. }) => assert_eq!(reply, rep::ERR_TLS_REQD),
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("a plain client was served by a listener that requires TLS"),
    }
    // The old NBD_OPT_EXPORT_NAME has no error reply: the connection closes.
    assert_eq!(first_option_reply(&addr, opt::EXPORT_NAME, b"rw").await, None);
    // STARTTLS is acknowledged.
    assert_eq!(first_option_reply(&addr, opt::STARTTLS, &[]).await, Some(rep::ACK));
}

/// A policy that requires TLS with no TLS to offer (a configuration mistake) serves no export
/// in the clear: every option is refused as requiring TLS, and STARTTLS ends the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_requires_tls_it_cannot_offer_serves_nothing_in_the_clear() {
    let r = rig();
    let policy = Policy {
        tls: None,
        require_tls: true,
        ..Policy::plain()
    };
    let addr = listen(&r.reg, policy).await;
    for option in [opt::GO, opt::INFO, opt::LIST] {
        assert_eq!(
            first_option_reply(&addr, option, &[]).await,
            Some(rep::ERR_TLS_REQD),
            "option {option}"
        );
    }
    match Client::connect(&addr, "rw").await {
        Err(ClientError::Refused { reply, .. }) => assert_eq!(reply, rep::ERR_TLS_REQD),
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("served in the clear by a listener that requires TLS"),
    }
    assert_eq!(first_option_reply(&addr, opt::EXPORT_NAME, b"rw").await, None);
    // Acknowledged, then closed: there is no TLS to start.
    let mut s = send_first_option(&addr, opt::STARTTLS, &[]).await;
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("the connection stays open")
        .unwrap();
    assert!(rest.len() <= 20, "more than the STARTTLS reply: {} bytes", rest.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libnbd_over_tls_with_a_pre_shared_key() {
    let r = rig();
    let keys = psk(r.dir.path(), "alice", KEY);
    let c = TlsConfig {
        psk_file: Some(keys.clone()),
        ..Default::default()
    };
    let addr = listen(&r.reg, tls_required(&c)).await;
    let uri = |user: &str, file: &Path| format!("nbds://{user}@{addr}/rw?tls-psk-file={}", file.display());
    let Some((ok, out)) = tool("nbdinfo", &["--json", &uri("alice", &keys)]) else {
        return;
    };
    assert!(ok, "{out}");
    assert!(out.contains(&(64 * MIB).to_string()), "{out}");
    // Data both ways through TLS.
    let src = r.dir.path().join("src.img");
    let data: Vec<u8> = (0..4 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let dst = r.dir.path().join("dst.img");
    let (ok, out) = tool("nbdcopy", &[src.to_str().unwrap(), &uri("alice", &keys)]).unwrap();
    assert!(ok, "{out}");
    let (ok, out) = tool("nbdcopy", &[&uri("alice", &keys), dst.to_str().unwrap()]).unwrap();
    assert!(ok, "{out}");
    assert_eq!(&std::fs::read(&dst).unwrap()[..4 * MIB as usize], &data[..]);
    // A wrong key, or a user the server does not know: refused.
    let wrong = psk(r.dir.path(), "alice", &KEY.replace('0', "1"));
    let (ok, out) = tool("nbdinfo", &[&uri("alice", &wrong)]).unwrap();
    assert!(!ok, "a wrong key was accepted: {out}");
    let mallory = psk(r.dir.path(), "mallory", KEY);
    let (ok, out) = tool("nbdinfo", &[&uri("mallory", &mallory)]).unwrap();
    assert!(!ok, "an unknown user was accepted: {out}");
    // And plain NBD is refused by libnbd's view too.
    let (ok, _) = tool("nbdinfo", &[&format!("nbd://{addr}/rw")]).unwrap();
    assert!(!ok, "plain NBD was served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libnbd_over_tls_with_an_x509_certificate() {
    let r = rig();
    let certs = r.dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let (cert, key) = (certs.join("server-cert.pem"), certs.join("server-key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .args(["-keyout", key.to_str().unwrap(), "-out", cert.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    // libnbd trusts the CA in DIR/ca-cert.pem: the self-signed certificate is its own CA,
    // and it signs the client's certificate, which libnbd shows from DIR/client-cert.pem.
    std::fs::copy(&cert, certs.join("ca-cert.pem")).unwrap();
    let sign_client = |dir: &Path, ca: &Path, ca_key: &Path| {
        let (ck, csr) = (dir.join("client-key.pem"), dir.join("client.csr"));
        let made = Command::new("openssl")
            .args(["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=client"])
            .args(["-keyout", ck.to_str().unwrap(), "-out", csr.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let signed = Command::new("openssl")
            .args(["x509", "-req", "-days", "1", "-in", csr.to_str().unwrap()])
            .args([
                "-CA",
                ca.to_str().unwrap(),
                "-CAkey",
                ca_key.to_str().unwrap(),
                "-CAcreateserial",
            ])
            .args(["-out", dir.join("client-cert.pem").to_str().unwrap()])
            .output()
            .unwrap();
        assert!(signed.status.success(), "{}", String::from_utf8_lossy(&signed.stderr));
    };
    // Without a CA for the clients, a certificate lets in anyone who completes TLS: refused.
    let no_ca = TlsConfig {
        cert: Some(cert.clone()),
        key: Some(key.clone()),
        ..Default::default()
    };
    let e = TlsServer::new(&no_ca)
        .err()
        .expect("a certificate without a CA was taken");
    assert!(e.contains("CA"), "{e}");
    let c = TlsConfig {
        ca: Some(cert.clone()),
        ..no_ca
    };
    let addr = listen(&r.reg, tls_required(&c)).await;
    let uri = format!("nbds://{addr}/rw?tls-certificates={}", certs.display());
    // A client with no certificate of its own: refused.
    let Some((ok, out)) = tool("nbdinfo", &["--json", &uri]) else {
        return;
    };
    assert!(!ok, "a client without a certificate was let in: {out}");
    // Then with one the CA signed.
    sign_client(&certs, &cert, &key);
    let (ok, out) = tool("nbdinfo", &["--json", &uri]).unwrap();
    assert!(ok, "{out}");
    assert!(out.contains(&(64 * MIB).to_string()), "{out}");
    // A client that trusts another CA refuses this server.
    let other = r.dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let o = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=other",
        ])
        .args(["-keyout", other.join("k.pem").to_str().unwrap()])
        .args(["-out", other.join("ca-cert.pem").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success());
    let (ok, out) = tool(
        "nbdinfo",
        &[&format!("nbds://{addr}/rw?tls-certificates={}", other.display())],
    )
    .unwrap();
    assert!(!ok, "a server the client cannot verify was accepted: {out}");
}

/// A client over TLS with a pre-shared key, blocking: greeting, STARTTLS, the handshake, then
/// NBD_OPT_GO for `export` over TLS; the stream in the transmission phase.
fn tls_client(addr: &str, key_hex: &str, export: &str) -> openssl::ssl::SslStream<std::net::TcpStream> {
    use std::io::{Read, Write};
    fn option(s: &mut impl Write, option: u32, data: &[u8]) {
        let mut o = Vec::new();
        o.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
        o.extend_from_slice(&option.to_be_bytes());
        o.extend_from_slice(&(data.len() as u32).to_be_bytes());
        o.extend_from_slice(data);
        s.write_all(&o).unwrap();
    }
    /// Option replies up to the final one; its type.
    fn replies(s: &mut impl Read) -> u32 {
        loop {
            let mut head = [0u8; 20];
            s.read_exact(&mut head).unwrap();
            let kind = u32::from_be_bytes(head[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(head[16..20].try_into().unwrap());
            std::io::copy(&mut s.take(len as u64), &mut std::io::sink()).unwrap();
            if kind != rep::INFO {
                return kind;
            }
        }
    }
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    let mut hello = [0u8; 18];
    tcp.read_exact(&mut hello).unwrap();
    tcp.write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
    option(&mut tcp, opt::STARTTLS, &[]);
    assert_eq!(replies(&mut tcp), rep::ACK);
    let key: Vec<u8> = (0..key_hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&key_hex[i..i + 2], 16).unwrap())
        .collect();
    let connector = tessera_psk::psk_connector("alice", &key).unwrap();
    let mut s = tessera_psk::connect(&connector, tcp).unwrap();
    let mut go = (export.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(export.as_bytes());
    go.extend_from_slice(&0u16.to_be_bytes());
    option(&mut s, opt::GO, &go);
    assert_eq!(replies(&mut s), rep::ACK);
    s
}

/// A TLS connection to an export ends when the export is removed while the connection is
/// idle, as a plain one does (`an_idle_connection_to_a_removed_export_ends_at_once` in
/// protocol.rs), rather than at its client's next request: until then it held the vdisk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tls_connection_to_a_removed_export_ends_at_once() {
    use std::io::{Read, Write};
    let r = rig();
    let c = TlsConfig {
        psk_file: Some(psk(r.dir.path(), "alice", KEY)),
        ..Default::default()
    };
    let addr = listen(&r.reg, tls_required(&c)).await;
    let reg = r.reg.clone();
    tokio::task::spawn_blocking(move || {
        let mut s = tls_client(&addr, KEY, "rw");
        // One read served, so the connection is in its transmission phase and idle after.
        s.write_all(&request(proto::cmd::READ, 1, 0, 4096)).unwrap();
        let mut reply = vec![0u8; 16 + 4096];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[..4], &proto::SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&reply[4..8], &[0; 4], "the read failed");
        let export = reg.get("rw").unwrap();
        assert_eq!(export.connections(), 1);
        reg.remove("rw").expect("it was offered");
        s.get_ref().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut more = [0u8; 1];
        match s.read(&mut more) {
            Ok(0) => {}
            Ok(_) => panic!("the server sent bytes nobody asked for"),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("the idle TLS connection stays open after its export was removed")
            }
            Err(e) => panic!("the connection ended without TLS's close_notify: {e}"),
        }
        for _ in 0..100 {
            if export.connections() == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(export.connections(), 0, "the connection still counts");
    })
    .await
    .unwrap();
}

/// A TLS client that keeps requests coming is never idle when its export is removed: the
/// first request that comes after the removal is refused (ESHUTDOWN), its payload read whole,
/// and the connection ends there, as a plain one does, so that such a client cannot go on
/// holding the vdisk of an export that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_tls_connection_to_a_removed_export_is_refused_its_next_request() {
    use std::io::{Read, Write};
    let r = rig();
    let c = TlsConfig {
        psk_file: Some(psk(r.dir.path(), "alice", KEY)),
        ..Default::default()
    };
    let addr = listen(&r.reg, tls_required(&c)).await;
    let reg = r.reg.clone();
    tokio::task::spawn_blocking(move || {
        let mut s = tls_client(&addr, KEY, "rw");
        const BIG: u32 = 16 << 20;
        // A long read, and a write behind it. The export is removed once the read's reply
        // has begun, while the server is still sending it (more than the socket's buffers
        // hold), so before it looks at the write.
        let mut both = request(proto::cmd::READ, 1, 0, BIG);
        both.extend_from_slice(&request(proto::cmd::WRITE, 2, 0, 4096));
        both.extend_from_slice(&[0x5a; 4096]);
        s.write_all(&both).unwrap();
        s.get_ref().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reply = vec![0u8; 16 + BIG as usize];
        s.read_exact(&mut reply[..16]).unwrap();
        assert_eq!(&reply[4..8], &[0; 4], "the read failed");
        reg.remove("rw").expect("it was offered");
        s.read_exact(&mut reply[16..]).unwrap();
        let mut head = [0u8; 16];
        s.read_exact(&mut head).expect("no answer to the write");
        assert_eq!(u64::from_be_bytes(head[8..16].try_into().unwrap()), 2);
        assert_eq!(
            u32::from_be_bytes(head[4..8].try_into().unwrap()),
            proto::errno::ESHUTDOWN,
            "a write that came after its export was removed was served"
        );
        let mut more = [0u8; 1];
        assert!(matches!(s.read(&mut more), Ok(0)), "the connection goes on");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_serves_local_clients() {
    let r = rig();
    let path = r.dir.path().join("nbd.sock");
    let l = UnixListener::bind(&path).unwrap();
    tokio::spawn(tessera_nbd::serve_unix(l, r.reg.clone(), 16));
    let uri = format!("nbd+unix:///rw?socket={}", path.display());
    let Some((ok, out)) = tool("nbdinfo", &["--json", &uri]) else {
        return;
    };
    assert!(ok, "{out}");
    let src = r.dir.path().join("src.img");
    std::fs::write(&src, vec![0x5Au8; MIB as usize]).unwrap();
    let (ok, out) = tool("nbdcopy", &[src.to_str().unwrap(), &uri]).unwrap();
    assert!(ok, "{out}");
}

/// A request header (28 bytes).
fn request(kind: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(28);
    h.extend_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
    h.extend_from_slice(&0u16.to_be_bytes());
    h.extend_from_slice(&kind.to_be_bytes());
    h.extend_from_slice(&cookie.to_be_bytes());
    h.extend_from_slice(&offset.to_be_bytes());
    h.extend_from_slice(&len.to_be_bytes());
    h
}

/// A client of export "rw" that sends 200 READs of 32 MiB in one go and never reads their
/// replies: the read half (to drop when done) and the task writing the requests.
async fn never_reading(addr: &str) -> (OwnedReadHalf, tokio::task::JoinHandle<OwnedWriteHalf>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    s.write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).await.unwrap();
    let mut go = Vec::new();
    go.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    go.extend_from_slice(&opt::GO.to_be_bytes());
    go.extend_from_slice(&8u32.to_be_bytes());
    go.extend_from_slice(&2u32.to_be_bytes());
    go.extend_from_slice(b"rw");
    go.extend_from_slice(&0u16.to_be_bytes());
    s.write_all(&go).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        for i in 0..200u64 {
            if wr.write_all(&request(proto::cmd::READ, i, 0, 32 << 20)).await.is_err() {
                break;
            }
        }
        wr
    });
    // Read the negotiation's replies only, then nothing.
    let mut some = [0u8; 512];
    let _ = tokio::time::timeout(Duration::from_secs(2), rd.read(&mut some)).await;
    (rd, writer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_holds_a_bounded_number_of_bytes() {
    let r = rig();
    let addr = listen(&r.reg, Policy::plain()).await;
    let export = r.reg.get("rw").unwrap();
    let (rd, writer) = never_reading(&addr).await;
    let mut peak = 0;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(export.held_bytes());
    }
    let bound = tessera_nbd::server::MAX_HELD_BYTES + (32 << 20) + (1 << 20);
    assert!(peak > 0, "the reads were not served at all");
    assert!(peak <= bound, "one connection holds {peak} bytes, over {bound}");
    // The client goes: everything is given back.
    drop(rd);
    drop(writer.await.unwrap());
    for _ in 0..100 {
        if export.held_bytes() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(export.held_bytes(), 0);
}

/// Clients that never read hold at most the daemon's bound together, and one request more
/// each; and each of them is still served, however much the others hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connections_together_hold_a_bounded_number_of_bytes() {
    let r = rig();
    let limit = 40 << 20;
    r.reg.held().set_limit(limit);
    let addr = listen(&r.reg, Policy::plain()).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(never_reading(&addr).await);
    }
    let mut peak = 0;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(r.reg.held().used());
    }
    let bound = limit + clients.len() * ((32 << 20) + (1 << 20));
    assert!(
        peak >= limit,
        "the clients were not served up to the bound: {peak} bytes"
    );
    assert!(
        peak <= bound,
        "the connections hold {peak} bytes together, over {bound}"
    );
    // A fifth client is served while the four hold everything.
    let c = Client::connect(&addr, "rw").await.unwrap();
    let data = tokio::time::timeout(Duration::from_secs(10), c.read(0, 4096)).await;
    assert_eq!(data.expect("served").unwrap().len(), 4096);
    c.disconnect().await.unwrap();
    for (rd, writer) in clients {
        drop(rd);
        drop(writer.await.unwrap());
    }
    for _ in 0..100 {
        if r.reg.held().used() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(r.reg.held().used(), 0, "everything is given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_serves_a_bounded_number_of_connections() {
    let r = rig();
    let addr = listen(
        &r.reg,
        Policy {
            max_connections: 3,
            ..Policy::plain()
        },
    )
    .await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).await.unwrap();
        open.push(s);
    }
    // The fourth is closed at once: no greeting, end of stream.
    let mut extra = TcpStream::connect(&addr).await.unwrap();
    let mut b = [0u8; 18];
    let n = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut b))
        .await
        .expect("closed, not left hanging")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // Greeted once there is room (the server notices the close when it is next scheduled: a
    // connection closed at once is tried again, for 10 s at most).
    drop(open.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = TcpStream::connect(&addr).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), again.read_exact(&mut b))
            .await
            .expect("closed or greeted, not left hanging")
            .map_or(0, |_| b.len());
        if n == 18 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not greeted once there is room");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A connection to `addr` from local address `from`, greeted (the first 18 bytes read) or
/// closed at once (None).
async fn greeted_from(addr: &str, from: &str) -> Option<TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = sock.connect(addr.parse().unwrap()).await.unwrap();
    let mut b = [0u8; 18];
    match tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b))
        .await
        .expect("closed or greeted, not left hanging")
    {
        Ok(_) => Some(s),
        Err(_) => None,
    }
}

/// One address cannot hold the listener's places with connections that never finish their
/// negotiation: past its bound of connections negotiating, its next one is closed at once,
/// while another address is still greeted; and a connection past its negotiation (a client
/// attached to an export) no longer counts against its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_the_listener_with_negotiations_that_never_end() {
    let r = rig();
    let addr = listen(
        &r.reg,
        Policy {
            max_negotiating_per_peer: 2,
            ..Policy::plain()
        },
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(greeted_from(&addr, "127.0.0.1").await.expect("greeted"));
    }
    assert!(
        greeted_from(&addr, "127.0.0.1").await.is_none(),
        "a third connection negotiating from one address was greeted"
    );
    assert!(
        greeted_from(&addr, "127.0.0.2").await.is_some(),
        "another address was refused for the first one's negotiations"
    );
    // Those two end; two clients attach to the export, past their negotiations.
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut clients = Vec::new();
    while clients.len() < 2 {
        match Client::connect(&addr, "rw").await {
            Ok(c) => clients.push(c),
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no place again: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(
        greeted_from(&addr, "127.0.0.1").await.is_some(),
        "connections past their negotiation still count as negotiating"
    );
}

/// Is a connection to `addr` greeted, or closed at once (the listener at its limit)?
async fn greeted(addr: &str) -> bool {
    greeted_from(addr, "127.0.0.1").await.is_some()
}

/// A connection keeps its place of the listener's limit past the negotiation: served by a
/// thread of its own (a client connected to an export, one that asked for TLS and sends
/// nothing more), it counts until it ends. Before, it was counted only while it negotiated,
/// and any number of connections that had sent STARTTLS held a thread and a descriptor each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_their_negotiation_keep_their_place() {
    let r = rig();
    let c = TlsConfig {
        psk_file: Some(psk(r.dir.path(), "alice", KEY)),
        ..Default::default()
    };
    let policy = Policy {
        max_connections: 2,
        tls: Some(TlsServer::new(&c).unwrap()),
        ..Policy::plain()
    };
    let addr = listen(&r.reg, policy).await;
    let client = Client::connect(&addr, "rw").await.unwrap();
    assert_eq!(client.read(0, 4096).await.unwrap().len(), 4096);
    let mut starttls = TcpStream::connect(&addr).await.unwrap();
    let mut hello = [0u8; 18];
    starttls.read_exact(&mut hello).await.unwrap();
    starttls
        .write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
        .await
        .unwrap();
    let mut o = Vec::new();
    o.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    o.extend_from_slice(&opt::STARTTLS.to_be_bytes());
    o.extend_from_slice(&0u32.to_be_bytes());
    starttls.write_all(&o).await.unwrap();
    let mut ack = [0u8; 20];
    starttls.read_exact(&mut ack).await.unwrap();
    assert_eq!(u32::from_be_bytes(ack[12..16].try_into().unwrap()), rep::ACK);
    // Both past their negotiation's async part: the listener is full.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !greeted(&addr).await,
        "a third connection was served past the limit of 2"
    );
    // Each gives its place back when it ends.
    client.disconnect().await.unwrap();
    drop(starttls);
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while !greeted(&addr).await {
        assert!(std::time::Instant::now() < deadline, "places not given back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
