//! A plain socket copy across a link, the peer that replication is measured against: N TCP
//! streams with a chosen congestion control from side a to side b, goodput counted at the
//! receiver over a window after a warm-up, with each stream's RTT and retransmissions as the
//! kernel reports them (TCP_INFO).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::link::{Link, B_ADDR};
use crate::netns;

#[derive(Debug, Clone)]
pub struct Transfer {
    pub streams: usize,
    /// The congestion control of each sending socket: "cubic", "bbr", "reno".
    pub congestion: String,
    pub warmup: Duration,
    pub window: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    /// Bytes the receiver counted in the window.
    pub bytes: u64,
    /// Smoothed RTT at the end of the window, in milliseconds.
    pub rtt_ms: f64,
    /// Segments the sender retransmitted in all.
    pub retransmits: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TransferReport {
    pub streams: usize,
    pub congestion: String,
    /// Bits per second the receiver got in the window, all streams together.
    pub goodput_bps: f64,
    pub per_stream: Vec<StreamReport>,
}

/// TCP_INFO of a socket: (smoothed RTT in µs, segments retransmitted in all).
pub fn tcp_info(s: &TcpStream) -> io::Result<(u32, u64)> {
    // SAFETY: tcp_info is plain data; the kernel fills at most `len` bytes of it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid socket and a buffer of `len` bytes.
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
        return Err(io::Error::last_os_error());
    }
    Ok((info.tcpi_rtt, info.tcpi_total_retrans as u64))
}

/// Bytes received on a socket and not read yet (FIONREAD).
fn queued(s: &TcpStream) -> u64 {
    let mut n: libc::c_int = 0;
    // SAFETY: an open socket and a pointer to an int, as FIONREAD takes.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r == 0 {
        n.max(0) as u64
    } else {
        0
    }
}

/// Sets the congestion control of a socket.
pub fn set_congestion(s: &TcpStream, name: &str) -> io::Result<()> {
    socket2::SockRef::from(s)
        .set_tcp_congestion(name.as_bytes())
        .map_err(|e| io::Error::new(e.kind(), format!("congestion control '{name}': {e}")))
}

/// Runs the transfer from side a to side b of `link`.
pub fn measure(link: &Link, t: &Transfer) -> io::Result<TransferReport> {
    let streams = t.streams.max(1);
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..streams).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    // The receiving sockets, to see what has arrived but is not read yet: a reader the
    // scheduler held back reads a burst late, and counted alone it would look like a link
    // faster than its rate.
    let inbound: Arc<std::sync::Mutex<Vec<Option<TcpStream>>>> =
        Arc::new(std::sync::Mutex::new((0..streams).map(|_| None).collect()));

    // The receiver, in b.
    let b = link.b.name.clone();
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<SocketAddr>>();
    let (c, st, inb) = (counts.clone(), stop.clone(), inbound.clone());
    let receiver = std::thread::spawn(move || {
        let listener = netns::enter(&b).and_then(|_| TcpListener::bind((B_ADDR, 0)));
        let listener = match listener {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        let _ = tx.send(listener.local_addr());
        let mut readers = Vec::new();
        for _ in 0..c.len() {
            let Ok((mut s, _)) = listener.accept() else { break };
            // Each stream says which it is first, so counts go to the right one.
            let mut id = [0u8; 4];
            if s.read_exact(&mut id).is_err() {
                continue;
            }
            let i = (u32::from_be_bytes(id) as usize).min(c.len() - 1);
            if let (Ok(clone), Ok(mut inb)) = (s.try_clone(), inb.lock()) {
                inb[i] = Some(clone);
            }
            let (c, st) = (c.clone(), st.clone());
            readers.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 << 10];
                while !st.load(Ordering::Relaxed) {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            c[i].fetch_add(n as u64, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        for r in readers {
            let _ = r.join();
        }
    });
    let to = rx.recv().map_err(|_| io::Error::other("the receiver stopped"))??;

    // The senders, in a.
    let (stx, srx) = std::sync::mpsc::channel::<io::Result<TcpStream>>();
    let mut senders = Vec::new();
    for i in 0..streams {
        let (a, cc, st, stx) = (link.a.name.clone(), t.congestion.clone(), stop.clone(), stx.clone());
        senders.push(std::thread::spawn(move || {
            let connected = netns::enter(&a).and_then(|_| {
                let s = TcpStream::connect_timeout(&to, Duration::from_secs(10))?;
                set_congestion(&s, &cc)?;
                Ok(s)
            });
            let mut s = match connected {
                Ok(s) => s,
                Err(e) => {
                    let _ = stx.send(Err(e));
                    return;
                }
            };
            let _ = stx.send(s.try_clone());
            let _ = s.write_all(&(i as u32).to_be_bytes());
            let buf = vec![0x5au8; 256 << 10];
            while !st.load(Ordering::Relaxed) {
                if s.write_all(&buf).is_err() {
                    break;
                }
            }
        }));
    }
    drop(stx);
    let mut socks = Vec::new();
    let mut failed = None;
    for _ in 0..streams {
        match srx.recv() {
            Ok(Ok(s)) => socks.push(s),
            Ok(Err(e)) => failed = Some(e),
            Err(_) => failed = Some(io::Error::other("a sender stopped")),
        }
    }
    let finish = |socks: &[TcpStream]| {
        stop.store(true, Ordering::Relaxed);
        for s in socks {
            let _ = s.shutdown(Shutdown::Both);
        }
    };
    if let Some(e) = failed {
        finish(&socks);
        return Err(e);
    }

    // Bytes each stream has received: read, then waiting in the socket (read first, so that
    // a byte moving between the two is missed rather than counted twice).
    let arrived = || -> Vec<u64> {
        let inb = inbound.lock().unwrap_or_else(|e| e.into_inner());
        counts
            .iter()
            .zip(inb.iter())
            .map(|(c, s)| c.load(Ordering::SeqCst) + s.as_ref().map_or(0, queued))
            .collect()
    };
    std::thread::sleep(t.warmup);
    // The clock is read outside the two counts, so that a thread descheduled between a count
    // and the clock can only make the window longer than the bytes' (goodput too low by a
    // hair), never shorter (goodput above the link's rate).
    let start = Instant::now();
    let before = arrived();
    std::thread::sleep(t.window);
    let after = arrived();
    let took = start.elapsed().as_secs_f64();
    let per_stream = socks
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(s, (b, a))| {
            let (rtt, retrans) = tcp_info(s).unwrap_or((0, 0));
            StreamReport {
                bytes: a.saturating_sub(*b),
                rtt_ms: rtt as f64 / 1000.0,
                retransmits: retrans,
            }
        })
        .collect::<Vec<_>>();
    finish(&socks);
    for s in senders {
        let _ = s.join();
    }
    let _ = receiver.join();
    let bytes: u64 = per_stream.iter().map(|s| s.bytes).sum();
    Ok(TransferReport {
        streams,
        congestion: t.congestion.clone(),
        goodput_bps: bytes as f64 * 8.0 / took,
        per_stream,
    })
}
