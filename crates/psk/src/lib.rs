//! Pre-shared keys as GnuTLS's psktool writes them (`user:hexkey` lines; libnbd's
//! `tls-psk-file` reads the same), and OpenSSL TLS endpoints that prove to each other they
//! hold one: both sides authenticated, the traffic encrypted (TLS 1.2 ECDHE-PSK suites, with
//! forward secrecy), no certificate to manage. NBD's TLS and replication use them.

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use openssl::ssl::{SslAcceptor, SslAcceptorBuilder, SslConnector, SslMethod, SslStream, SslVerifyMode, SslVersion};

/// Reads a psktool file: `user:hexkey` lines; blank lines and `#` comments are skipped.
pub fn read_psk_file(path: &Path) -> Result<HashMap<String, Vec<u8>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut keys = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("{} line {}: {why}", path.display(), n + 1);
        let (user, hex) = line.split_once(':').ok_or_else(|| bad("not user:hexkey"))?;
        if user.is_empty() || hex.len() % 2 != 0 || hex.len() < 32 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad("the key must be at least 16 bytes of hex digits"));
        }
        let key = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digits"))
            .collect::<Vec<u8>>();
        if key.len() > 256 {
            return Err(bad("the key is longer than 256 bytes"));
        }
        keys.insert(user.to_string(), key);
    }
    if keys.is_empty() {
        return Err(format!("{} holds no key", path.display()));
    }
    Ok(keys)
}

/// Makes a psktool file with one random 32-byte key for `user`, owner-only; an existing file
/// is left as it is.
pub fn create_psk_file(path: &Path, user: &str) -> Result<bool, String> {
    if path.exists() {
        let mode = std::fs::metadata(path).map_err(|e| e.to_string())?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
        }
        return Ok(false);
    }
    let mut key = [0u8; 32];
    openssl::rand::rand_bytes(&mut key).map_err(|e| e.to_string())?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    f.write_all(format!("{user}:{hex}\n").as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(true)
}

/// Lets a server's handshake finish only with a client that holds one of `keys`, by identity.
pub fn set_server_keys(b: &mut SslAcceptorBuilder, keys: HashMap<String, Vec<u8>>) {
    b.set_psk_server_callback(move |_ssl, identity, out| {
        let key = identity
            .and_then(|i| std::str::from_utf8(i).ok())
            .and_then(|i| keys.get(i));
        match key {
            Some(k) if k.len() <= out.len() => {
                out[..k.len()].copy_from_slice(k);
                Ok(k.len())
            }
            // An unknown identity: no key, and the handshake fails.
            _ => Ok(0),
        }
    });
}

/// A TLS server that accepts a client holding any of `keys` (by identity), and nothing else.
/// With `hint`, it names that identity in the handshake (OpenSSL's PSK identity hint): a
/// client that holds several keys answers with that one ([`psk_connector_choosing`]).
pub fn psk_acceptor(keys: HashMap<String, Vec<u8>>, hint: Option<&str>) -> Result<SslAcceptor, String> {
    let ssl = |e: openssl::error::ErrorStack| format!("TLS: {e}");
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(ssl)?;
    // TLS 1.3 takes external keys only through session callbacks: 1.2 with ECDHE-PSK.
    b.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(ssl)?;
    b.set_max_proto_version(Some(SslVersion::TLS1_2)).map_err(ssl)?;
    b.set_cipher_list("ECDHE-PSK-CHACHA20-POLY1305").map_err(ssl)?;
    set_server_keys(&mut b, keys);
    if let Some(h) = hint {
        set_identity_hint(&mut b, h)?;
    }
    Ok(b.build())
}

/// Sends `hint` to clients in the handshake (the identity a server names; not a secret: a
/// client sends its own identity in clear).
fn set_identity_hint(b: &mut SslAcceptorBuilder, hint: &str) -> Result<(), String> {
    // Not bound by the openssl crate; in libssl since OpenSSL 1.0.
    extern "C" {
        fn SSL_CTX_use_psk_identity_hint(ctx: *mut std::ffi::c_void, hint: *const std::ffi::c_char) -> std::ffi::c_int;
    }
    let c = std::ffi::CString::new(hint).map_err(|_| format!("a key identity with a zero byte: {hint:?}"))?;
    // SAFETY: the builder owns a live context; OpenSSL copies the string.
    let ok = unsafe { SSL_CTX_use_psk_identity_hint(b.as_ptr().cast(), c.as_ptr()) };
    if ok == 1 {
        Ok(())
    } else {
        Err(format!("TLS: cannot name the key identity {hint:?}"))
    }
}

/// A TLS client holding several `keys`: it proves the one the server names in its hint, if
/// it holds it, else the one of identity `default`. A site that takes replicas from several
/// sources, each with a key of its own, so reaches each with that source's key.
pub fn psk_connector_choosing(keys: HashMap<String, Vec<u8>>, default: &str) -> Result<SslConnector, String> {
    let fallback = keys
        .get(default)
        .map(|k| (default.as_bytes().to_vec(), k.clone()))
        .ok_or_else(|| format!("no key of identity {default:?}"))?;
    let ssl = |e: openssl::error::ErrorStack| format!("TLS: {e}");
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(ssl)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(ssl)?;
    b.set_max_proto_version(Some(SslVersion::TLS1_2)).map_err(ssl)?;
    b.set_cipher_list("ECDHE-PSK-CHACHA20-POLY1305").map_err(ssl)?;
    // No certificates: the key authenticates the server.
    b.set_verify(SslVerifyMode::NONE);
    b.set_psk_client_callback(move |_ssl, hint, id_out, key_out| {
        let named = hint
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| keys.get(h).map(|k| (h.as_bytes().to_vec(), k.clone())));
        let (identity, key) = named.as_ref().unwrap_or(&fallback);
        if identity.len() >= id_out.len() || key.len() > key_out.len() {
            return Ok(0);
        }
        id_out[..identity.len()].copy_from_slice(identity);
        id_out[identity.len()] = 0;
        key_out[..key.len()].copy_from_slice(key);
        Ok(key.len())
    });
    Ok(b.build())
}

/// A TLS client that proves it holds `key` under `identity` (and so checks that the server
/// holds it too: a server without it cannot finish the handshake).
pub fn psk_connector(identity: &str, key: &[u8]) -> Result<SslConnector, String> {
    psk_connector_choosing(HashMap::from([(identity.to_string(), key.to_vec())]), identity)
}

/// The client side of the handshake on `s`.
pub fn connect(c: &SslConnector, s: TcpStream) -> Result<SslStream<TcpStream>, String> {
    let cfg = c
        .configure()
        .map_err(|e| format!("TLS: {e}"))?
        .use_server_name_indication(false)
        .verify_hostname(false);
    cfg.connect("tessera", s).map_err(|e| format!("TLS handshake: {e}"))
}

/// A deadline on the whole of a handshake, however slowly a peer sends its bytes (a read
/// timeout starts again with each one, so a peer sending a byte now and then would hold its
/// connection, and a place of the listener, for ever): past it, the socket is shut down and
/// whatever reads it fails. `met` (or dropping it) calls it off.
pub struct Deadline {
    done: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

impl Deadline {
    pub fn start(s: &TcpStream, limit: std::time::Duration) -> Result<Deadline, String> {
        let done = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let sock = s.try_clone().map_err(|e| format!("cannot watch the handshake: {e}"))?;
        let watched = done.clone();
        let watchdog = std::thread::Builder::new()
            .name("handshake-deadline".into())
            .spawn(move || {
                let (flag, told) = &*watched;
                let over = told
                    .wait_timeout_while(flag.lock().expect("not poisoned"), limit, |d| !*d)
                    .expect("not poisoned");
                if !*over.0 {
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                }
            })
            .map_err(|e| format!("cannot watch the handshake: {e}"))?;
        Ok(Deadline {
            done,
            watchdog: Some(watchdog),
        })
    }

    /// The handshake is over in time: the socket is left alone.
    pub fn met(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        *self.done.0.lock().expect("not poisoned") = true;
        self.done.1.notify_all();
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client holding several keys proves the one the server names; without a name, its
    /// default (which a server without it refuses).
    #[test]
    fn a_client_of_several_keys_proves_the_one_the_server_names() {
        let keys = |ids: &[&str]| -> HashMap<String, Vec<u8>> {
            ids.iter().map(|i| (i.to_string(), i.as_bytes().repeat(8))).collect()
        };
        let serve = |acceptor: SslAcceptor| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = std::thread::spawn(move || {
                let (s, _) = listener.accept().unwrap();
                acceptor.accept(s).map(|t| t.ssl().psk_identity().map(|i| i.to_vec()))
            });
            (addr, server)
        };
        let hub = psk_connector_choosing(keys(&["site-a", "site-c"]), "site-a").unwrap();
        let (addr, server) = serve(psk_acceptor(keys(&["site-c"]), Some("site-c")).unwrap());
        assert!(connect(&hub, TcpStream::connect(addr).unwrap()).is_ok());
        assert_eq!(server.join().unwrap().unwrap().as_deref(), Some(&b"site-c"[..]));
        let (addr, server) = serve(psk_acceptor(keys(&["site-c"]), None).unwrap());
        assert!(connect(&hub, TcpStream::connect(addr).unwrap()).is_err());
        assert!(server.join().unwrap().is_err(), "no name: the default, which it lacks");
    }

    /// A peer that sends a byte now and then is cut at the deadline; one met leaves the
    /// socket open.
    #[test]
    fn a_deadline_cuts_a_slow_handshake_and_leaves_a_finished_one() {
        use std::io::Read;
        use std::time::{Duration, Instant};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            for _ in 0..40 {
                if c.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let t = Instant::now();
        let d = Deadline::start(&s, Duration::from_millis(300)).unwrap();
        let mut b = [0u8; 1];
        while matches!(s.read(&mut b), Ok(1)) {}
        let cut = t.elapsed();
        assert!(cut < Duration::from_millis(1500), "read on for {cut:?}");
        d.met();
        peer.join().unwrap();

        let peer = std::thread::spawn(move || TcpStream::connect(addr).unwrap());
        let (s, _) = l.accept().unwrap();
        let mut c = peer.join().unwrap();
        Deadline::start(&s, Duration::from_millis(100)).unwrap().met();
        std::thread::sleep(Duration::from_millis(300));
        c.write_all(b"y").unwrap();
        let mut s = s;
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(
            s.read(&mut b).unwrap(),
            1,
            "the socket was cut after the deadline was met"
        );
    }

    #[test]
    fn psk_files() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("keys.psk");
        assert!(create_psk_file(&p, "tessera").unwrap());
        assert!(!create_psk_file(&p, "tessera").unwrap(), "kept");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let keys = read_psk_file(&p).unwrap();
        assert_eq!(keys["tessera"].len(), 32);
        for bad in [
            "alice",
            "alice:abc",
            "alice:zz00112233445566778899aabbccddeeff",
            ":00112233445566778899aabbccddeeff",
            "",
        ] {
            std::fs::write(&p, bad).unwrap();
            assert!(read_psk_file(&p).is_err(), "{bad}");
        }
        std::fs::write(&p, "# keys\n\nalice:00112233445566778899aabbccddeeff\n").unwrap();
        assert_eq!(read_psk_file(&p).unwrap()["alice"].len(), 16);
    }

    #[test]
    fn only_a_peer_with_the_key_gets_through() {
        let key = vec![7u8; 32];
        let keys: HashMap<String, Vec<u8>> = [("site-a".to_string(), key.clone())].into();
        let acceptor = psk_acceptor(keys, Some("site-a")).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut results = Vec::new();
            for _ in 0..3 {
                let (s, _) = listener.accept().unwrap();
                results.push(match acceptor.accept(s) {
                    Ok(mut t) => {
                        use std::io::Read;
                        let mut b = [0u8; 5];
                        t.read_exact(&mut b).map(|_| b.to_vec()).map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                });
            }
            results
        });
        let attempt = |identity: &str, key: &[u8]| {
            let c = psk_connector(identity, key).unwrap();
            let s = TcpStream::connect(addr).unwrap();
            connect(&c, s).map(|mut t| t.write_all(b"hello").unwrap())
        };
        assert!(attempt("site-a", &key).is_ok());
        assert!(attempt("site-a", &[8u8; 32]).is_err(), "wrong key");
        assert!(attempt("mallory", &key).is_err(), "unknown identity");
        let r = server.join().unwrap();
        assert_eq!(r[0].as_deref(), Ok(&b"hello"[..]));
        assert!(r[1].is_err() && r[2].is_err());
    }
}
