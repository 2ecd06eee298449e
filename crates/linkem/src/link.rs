//! Two network namespaces, `a` and `b`, joined by a TUN device in each and two threads per
//! direction in this process: one reads what a side sends and decides its fate
//! ([`Shaper`]), the other writes it into the other side when it is due.

use std::collections::BinaryHeap;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::netns::{ip, Netns};
use crate::shape::{Fate, Shape, Shaper};
use crate::tun;

/// The addresses of the two sides.
pub const A_ADDR: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const B_ADDR: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

/// What one direction did.
#[derive(Debug, Default)]
pub struct DirCounters {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub lost: AtomicU64,
    pub overflow: AtomicU64,
    /// Dropped while the link was cut.
    pub cut: AtomicU64,
    pub delivered: AtomicU64,
    /// The most a packet was delivered after its time (µs): a delivering thread the
    /// scheduler held back hands over a burst of late packets at once.
    pub late_us: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DirStats {
    pub packets: u64,
    pub bytes: u64,
    pub lost: u64,
    pub overflow: u64,
    pub cut: u64,
    pub delivered: u64,
    pub late_us: u64,
}

impl DirCounters {
    fn stats(&self) -> DirStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DirStats {
            packets: l(&self.packets),
            bytes: l(&self.bytes),
            lost: l(&self.lost),
            overflow: l(&self.overflow),
            cut: l(&self.cut),
            delivered: l(&self.delivered),
            late_us: l(&self.late_us),
        }
    }
}

struct Due {
    at: Instant,
    seq: u64,
    packet: Vec<u8>,
}

impl PartialEq for Due {
    fn eq(&self, o: &Due) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Due) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    /// Earliest first in a max-heap.
    fn cmp(&self, o: &Due) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Packets on their way in one direction.
#[derive(Default)]
struct InFlight {
    queue: Mutex<BinaryHeap<Due>>,
    wake: Condvar,
}

/// A running link. Dropping it stops the threads and removes the devices and namespaces.
pub struct Link {
    pub a: Netns,
    pub b: Netns,
    stop: Arc<AtomicBool>,
    cut: Arc<AtomicBool>,
    counters: [Arc<DirCounters>; 2],
    threads: Vec<JoinHandle<()>>,
    // Closed after the threads stop: the devices go with them.
    _fds: [Arc<OwnedFd>; 2],
}

impl Link {
    /// Makes namespaces `PREFIX-a` and `PREFIX-b` (`A_ADDR` and `B_ADDR`) joined by a link
    /// shaped `a_to_b` one way and `b_to_a` the other. Needs root (CAP_NET_ADMIN) and
    /// /dev/net/tun.
    pub fn start(prefix: &str, a_to_b: Shape, b_to_a: Shape) -> io::Result<Link> {
        let a = Netns::create(&format!("{prefix}-a"))?;
        let b = Netns::create(&format!("{prefix}-b"))?;
        let mut fds = Vec::new();
        for (ns, side, addr) in [(&a, 'a', A_ADDR), (&b, 'b', B_ADDR)] {
            // Made here and moved: the descriptor keeps working in the namespace.
            let dev = device_name(side);
            let fd = tun::open(&dev)?;
            ip(&["link", "set", &dev, "netns", &ns.name])?;
            ip(&["-n", &ns.name, "addr", "add", &format!("{addr}/24"), "dev", &dev])?;
            ip(&["-n", &ns.name, "link", "set", &dev, "up"])?;
            fds.push(Arc::new(fd));
        }
        let (fa, fb) = (fds[0].clone(), fds[1].clone());
        let stop = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let counters = [Arc::new(DirCounters::default()), Arc::new(DirCounters::default())];
        let mut threads = Vec::new();
        for (i, (from, to, shape)) in [(fa.clone(), fb.clone(), a_to_b), (fb, fa, b_to_a)]
            .into_iter()
            .enumerate()
        {
            let flight = Arc::new(InFlight::default());
            let (st, c, k, f) = (stop.clone(), counters[i].clone(), cut.clone(), flight.clone());
            let seed = 0x5eed_0000 + i as u64 + std::process::id() as u64;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("linkem-in-{i}"))
                    .spawn(move || receive(from.as_raw_fd(), Shaper::new(shape, seed), &f, &c, &k, &st))?,
            );
            let (st, c) = (stop.clone(), counters[i].clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("linkem-out-{i}"))
                    .spawn(move || deliver(to.as_raw_fd(), &flight, &c, &st))?,
            );
        }
        Ok(Link {
            a,
            b,
            stop,
            cut,
            counters,
            threads,
            _fds: [fds[0].clone(), fds[1].clone()],
        })
    }

    /// Cuts the link (every packet dropped, both ways) or mends it.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::Relaxed);
    }

    /// What each direction did: a to b, then b to a.
    pub fn stats(&self) -> [DirStats; 2] {
        [self.counters[0].stats(), self.counters[1].stats()]
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A device name no other link of this machine uses now.
fn device_name(side: char) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("lk{}x{n}{side}", std::process::id())
}

const POLL_MS: i32 = 50;

fn receive(fd: RawFd, mut shaper: Shaper, flight: &InFlight, c: &DirCounters, cut: &AtomicBool, stop: &AtomicBool) {
    let mut buf = vec![0u8; 65536];
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, POLL_MS) } <= 0 {
            continue;
        }
        // SAFETY: reads into the buffer, at most its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            continue;
        }
        let n = n as usize;
        c.packets.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if cut.load(Ordering::Relaxed) {
            c.cut.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        match shaper.admit(Instant::now(), n) {
            Fate::Lost => {
                c.lost.fetch_add(1, Ordering::Relaxed);
            }
            Fate::Overflow => {
                c.overflow.fetch_add(1, Ordering::Relaxed);
            }
            Fate::Deliver(at) => {
                seq += 1;
                let mut q = flight.queue.lock().expect("not poisoned");
                let first = q.peek().is_none_or(|d| at < d.at);
                q.push(Due {
                    at,
                    seq,
                    packet: buf[..n].to_vec(),
                });
                drop(q);
                if first {
                    flight.wake.notify_one();
                }
            }
        }
    }
    flight.wake.notify_one();
}

fn deliver(fd: RawFd, flight: &InFlight, c: &DirCounters, stop: &AtomicBool) {
    let mut q = flight.queue.lock().expect("not poisoned");
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let wait = match q.peek() {
            Some(d) if d.at <= now => {
                let d = q.pop().expect("peeked");
                drop(q);
                c.late_us.fetch_max((now - d.at).as_micros() as u64, Ordering::Relaxed);
                // SAFETY: writes one whole packet from its buffer.
                if unsafe { libc::write(fd, d.packet.as_ptr().cast(), d.packet.len()) } > 0 {
                    c.delivered.fetch_add(1, Ordering::Relaxed);
                }
                q = flight.queue.lock().expect("not poisoned");
                continue;
            }
            Some(d) => d.at - now,
            None => Duration::from_millis(POLL_MS as u64),
        };
        q = flight.wake.wait_timeout(q, wait).expect("not poisoned").0;
    }
}
