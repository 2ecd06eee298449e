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
/// How long a peer has for its TLS handshake and its opening (a PSK handshake is two round
/// trips; its opening, a frame, follows at once): a stranger who never finishes holds a place
/// at the listener this long, not the whole silence.
pub const HANDSHAKE: Duration = Duration::from_secs(20);

/// An authenticated, encrypted connection between two sites.
pub type Connection = SslStream<TcpStream>;

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
    /// this site connects with the key the peer names (the first of its own file by name),
    /// if it holds it, else with the first of its file, and names that one to its peers.
    /// `congestion` is set on every socket ("bbr"; the kernel's default where it lacks it).
    pub fn from_psk_file(path: &Path, congestion: &str) -> Result<Transport, String> {
        let keys = tessera_psk::read_psk_file(path)?;
        Transport::with_keys(keys, congestion, SILENCE)
    }

    pub fn with_keys(keys: HashMap<String, Vec<u8>>, congestion: &str, silence: Duration) -> Result<Transport, String> {
        let identity = keys.keys().min().cloned().ok_or("no replication key")?;
        Ok(Transport {
            connector: tessera_psk::psk_connector_choosing(keys.clone(), &identity)?,
            acceptor: tessera_psk::psk_acceptor(keys, Some(&identity))?,
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
    pub fn connect(&self, addr: &str) -> Result<Connection, String> {
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
    pub fn accept(&self, s: TcpStream) -> Result<Connection, String> {
        self.accept_until_opened(s).map(|(conn, deadline)| {
            deadline.met();
            conn
        })
    }

    /// [`accept`](Self::accept), the deadline still running: the peer's opening (the magic
    /// and its first frame, [`ReceiveOptions::opening`](crate::ReceiveOptions)) must come
    /// within the same time as the handshake ([`HANDSHAKE`]).
    pub fn accept_until_opened(&self, s: TcpStream) -> Result<(Connection, tessera_psk::Deadline), String> {
        self.prepare(&s);
        // The whole handshake within its time, however slowly a peer sends its bytes: the
        // read timeout alone starts again with each one, and a few such peers would keep
        // every place of the listener. Without the watchdog a slow peer could hold the place
        // for ever: refused instead.
        let deadline = tessera_psk::Deadline::start(&s, self.silence.min(HANDSHAKE))?;
        match self.acceptor.accept(s) {
            Ok(conn) => Ok((conn, deadline)),
            Err(e) => Err(format!("TLS handshake: {e}")),
        }
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
    socket2::SockRef::from(s)
        .set_tcp_congestion(name.as_bytes())
        .map_err(|e| io::Error::new(e.kind(), format!("congestion control '{name}': {e}")))
}

/// What the kernel knows of a stream's link, from `TCP_INFO`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkStats {
    /// Smoothed round trip time, in microseconds.
    pub rtt_us: u32,
    /// Segments sent again, over the stream's life.
    pub retransmits: u32,
    /// Segments sent, retransmissions included.
    pub segments_out: u32,
    /// Bytes the peer acknowledged.
    pub bytes_acked: u64,
    /// The kernel's last estimate of the delivery rate, in bytes per second.
    pub delivery_rate: u64,
}

/// The link report of a socket (zeros where the kernel does not say).
pub fn link_stats(s: &TcpStream) -> LinkStats {
    // SAFETY: plain integers; all zeros is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the buffer is as long as `len` says; the kernel writes at most that much.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return LinkStats::default();
    }
    // An older kernel fills less of it; the rest stays zero.
    LinkStats {
        rtt_us: info.tcpi_rtt,
        retransmits: info.tcpi_total_retrans,
        segments_out: info.tcpi_segs_out,
        bytes_acked: info.tcpi_bytes_acked,
        delivery_rate: info.tcpi_delivery_rate,
    }
}

/// A stream whose writes keep under a rate, so that replication leaves room on a shared link:
/// a token bucket holding at most a quarter of a second's worth.
pub struct Paced<S> {
    inner: S,
    rate: f64,
    allowance: f64,
    last: std::time::Instant,
}

impl<S> Paced<S> {
    /// `rate` in bytes per second; None: not limited.
    pub fn new(inner: S, rate: Option<u64>) -> Paced<S> {
        let rate = rate.map(|r| r.max(1) as f64).unwrap_or(f64::INFINITY);
        Paced {
            inner,
            rate,
            allowance: 0.0,
            last: std::time::Instant::now(),
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn burst(&self) -> f64 {
        (self.rate / 4.0).max(64.0 * 1024.0)
    }
}

impl<S: io::Read> io::Read for Paced<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<S: io::Write> io::Write for Paced<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.rate.is_infinite() {
            return self.inner.write(buf);
        }
        let now = std::time::Instant::now();
        self.allowance = (self.allowance + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.burst());
        self.last = now;
        if self.allowance < 0.0 {
            std::thread::sleep(Duration::from_secs_f64(-self.allowance / self.rate));
        }
        let n = self.inner.write(&buf[..buf.len().min(self.burst() as usize)])?;
        self.allowance -= n as f64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_handshake_sent_a_byte_at_a_time_ends_within_the_silence() {
        let keys = HashMap::from([("site".to_string(), vec![7u8; 32])]);
        let t = Transport::with_keys(keys, "cubic", Duration::from_secs(2)).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        // A peer that begins a TLS record of 512 bytes, then sends them a byte a second,
        // under the read timeout.
        let dripping = std::thread::spawn(move || {
            let mut c = TcpStream::connect(a).unwrap();
            c.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).unwrap();
            for _ in 0..30 {
                if c.write_all(&[0]).is_err() {
                    return true;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            false
        });
        let (s, _) = l.accept().unwrap();
        let started = std::time::Instant::now();
        assert!(t.accept(s).is_err());
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the handshake went on for {:?}",
            started.elapsed()
        );
        assert!(dripping.join().unwrap(), "the peer was never cut off");
    }

    #[test]
    fn a_paced_stream_takes_at_least_its_rate() {
        let mut p = Paced::new(Vec::new(), Some(4 << 20));
        let t = std::time::Instant::now();
        for _ in 0..32 {
            p.write_all(&[7u8; 64 << 10]).unwrap();
        }
        // 2 MiB at 4 MiB/s, less the first quarter second's burst: 0.25 s at the least.
        assert!(t.elapsed() >= Duration::from_millis(240), "{:?}", t.elapsed());
        assert_eq!(p.get_ref().len(), 2 << 20);
    }

    #[test]
    fn link_stats_count_what_a_socket_sent() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut sink = Vec::new();
            s.read_to_end(&mut sink).unwrap();
            sink.len()
        });
        let mut c = TcpStream::connect(a).unwrap();
        c.write_all(&vec![1u8; 1 << 20]).unwrap();
        // Until the peer has acknowledged it all (at once on an idle machine; a busy one may
        // take a while to schedule the reader).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let st = loop {
            let st = link_stats(&c);
            if st.bytes_acked >= 1 << 20 || std::time::Instant::now() > deadline {
                break st;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        drop(c);
        assert_eq!(reader.join().unwrap(), 1 << 20);
        assert!(st.segments_out > 0, "{st:?}");
        assert!(st.bytes_acked >= 1 << 20, "{st:?}");
    }
}
