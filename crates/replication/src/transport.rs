//! How cycles travel: TCP with a congestion control that keeps its rate through random loss
//! (BBR, set on the socket, where the kernel has it), inside TLS authenticated by a key both
//! sites hold (tessera-psk). Measured in docs/wan.md: on a 100 Mbit/s, 90 ms link with 1 %
//! loss one BBR stream keeps 91 % of the link, one cubic stream 1 %.

use std::collections::HashMap;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use openssl::ssl::{SslAcceptor, SslConnector, SslStream};
use tracing::warn;

/// How long a stream may stay silent before a cycle gives up on it (the link is down).
pub const SILENCE: Duration = Duration::from_secs(60);

/// The keys and the socket settings of one site.
pub struct Transport {
    identity: String,
    acceptor: SslAcceptor,
    connector: SslConnector,
    congestion: String,
    silence: Duration,
}

impl Transport {
    /// Keys from a psktool file shared by the sites: a peer holding any of them is let in;
    /// this site connects with the first by name. `congestion` is set on every socket
    /// ("bbr"; the kernel's default where it lacks it).
    pub fn from_psk_file(path: &Path, congestion: &str) -> Result<Transport, String> {
        let keys = tessera_psk::read_psk_file(path)?;
        Transport::with_keys(keys, congestion, SILENCE)
    }

    pub fn with_keys(keys: HashMap<String, Vec<u8>>, congestion: &str, silence: Duration) -> Result<Transport, String> {
        let (identity, key) = keys
            .iter()
            .min_by(|a, b| a.0.cmp(b.0))
            .map(|(i, k)| (i.clone(), k.clone()))
            .ok_or("no replication key")?;
        Ok(Transport {
            connector: tessera_psk::psk_connector(&identity, &key)?,
            acceptor: tessera_psk::psk_acceptor(keys)?,
            identity,
            congestion: congestion.to_string(),
            silence,
        })
    }

    /// The identity this site connects with.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Connects to the replica site at `addr` and proves the key.
    pub fn connect(&self, addr: &str) -> Result<SslStream<TcpStream>, String> {
        let to = addr
            .to_socket_addrs()
            .map_err(|e| format!("{addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("{addr}: no address"))?;
        let s = TcpStream::connect_timeout(&to, Duration::from_secs(15)).map_err(|e| format!("{addr}: {e}"))?;
        self.prepare(&s);
        tessera_psk::connect(&self.connector, s).map_err(|e| format!("{addr}: {e}"))
    }

    /// The server side: a peer that does not hold a key is refused here, before anything
    /// is read from it.
    pub fn accept(&self, s: TcpStream) -> Result<SslStream<TcpStream>, String> {
        self.prepare(&s);
        self.acceptor.accept(s).map_err(|e| format!("TLS handshake: {e}"))
    }

    fn prepare(&self, s: &TcpStream) {
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(self.silence));
        let _ = s.set_write_timeout(Some(self.silence));
        if let Err(e) = set_congestion(s, &self.congestion) {
            warn!(error = %e, "replication stream keeps the kernel's congestion control");
        }
    }
}

/// Sets a socket's congestion control (`bbr`, `cubic`, ...).
pub fn set_congestion(s: &TcpStream, name: &str) -> io::Result<()> {
    // SAFETY: a valid socket, and a buffer of the name's length.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("congestion control '{name}': {e}")));
    }
    Ok(())
}
