//! The emulated link does what it is set to: a TCP copy gets no more than its rate and sees
//! its delay; datagrams are lost and reordered as often as asked; a cut link carries nothing
//! until mended.

use std::net::UdpSocket;
use std::time::Duration;

use tessera_linkem::{measure, netns, Link, Shape, Transfer, B_ADDR};

fn available(test: &str) -> bool {
    match tessera_linkem::unavailable() {
        None => true,
        Some(why) => {
            tessera_disk::skip(test, &why);
            false
        }
    }
}

fn prefix(tag: &str) -> String {
    format!("lt{}{tag}", std::process::id())
}

#[test]
fn a_tcp_copy_gets_the_rate_and_the_delay_and_no_more() {
    if !available("a_tcp_copy_gets_the_rate_and_the_delay_and_no_more") {
        return;
    }
    let shape = Shape::new(20_000_000, Duration::from_millis(40));
    let link = Link::start(&prefix("r"), shape, shape).unwrap();
    let window = Duration::from_secs(2);
    let r = measure(
        &link,
        &Transfer {
            streams: 1,
            congestion: "cubic".into(),
            warmup: Duration::from_secs(1),
            window,
        },
    )
    .unwrap();
    let ratio = r.goodput_bps / 20e6;
    let [ab, ba] = link.stats();
    // Payload only: headers take ~3.5 % of the link's bits. Packets delivered late (the
    // delivering thread held back by a busy machine) arrive together: those due before the
    // window may land in it, as much as the link carries in the longest lateness; and the
    // receiver, itself held back, may read at the window's start bytes its kernel took in
    // before (0.992 of the rate was seen once, with packets 4 ms late). What this checks is
    // that the link shapes at all: unshaped, loopback carries tens of times the rate.
    let late = ab.late_us as f64 / 1e6;
    assert!(
        ratio <= 1.05 * (1.0 + late / window.as_secs_f64()),
        "faster than the link: {r:?}, packets up to {late} s late"
    );
    assert!(ratio >= 0.5, "the link carries far less than its rate: {r:?}");
    assert!(r.per_stream[0].rtt_ms >= 40.0, "{r:?}");
    assert!(ab.delivered > 1000 && ba.delivered > 100, "{ab:?} {ba:?}");
    assert_eq!((ab.lost, ab.cut), (0, 0));
}

#[test]
fn datagrams_are_lost_reordered_and_cut_as_asked() {
    if !available("datagrams_are_lost_reordered_and_cut_as_asked") {
        return;
    }
    let mut shape = Shape::new(0, Duration::from_millis(10));
    shape.loss = 0.05;
    shape.reorder = 0.1;
    // Held back far longer than the sender takes between two datagrams, even on a machine busy
    // with other tests (held back 5 ms, a slowly scheduled sender's next datagram came after it).
    shape.reorder_delay = Duration::from_millis(100);
    let link = Link::start(&prefix("l"), shape, Shape::new(0, Duration::from_millis(10))).unwrap();
    let b = link.b.name.clone();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let receiver = std::thread::spawn(move || {
        netns::enter(&b).unwrap();
        let s = UdpSocket::bind((B_ADDR, 9999)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        // Room for every datagram of the test, so that a receiver the machine is slow to
        // schedule loses none of them itself (root may exceed rmem_max; this test needs root).
        let room: libc::c_int = 16 << 20;
        // SAFETY: a valid socket and an int-sized option value.
        unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&room as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        ready_tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while let Ok(n) = s.recv(&mut buf) {
            if n == 4 && buf[..4] == *b"stop" {
                break;
            }
            got.push(u32::from_be_bytes(buf[..4].try_into().unwrap()));
        }
        got
    });
    netns::enter(&link.a.name).unwrap();
    let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
    ready.recv().unwrap();
    // Waits until the link has read `count` packets from the sender's side (the link drops
    // what its device queue cannot hold, which a busy machine would turn into extra loss).
    let read_from_a = |count: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while link.stats()[0].packets < count && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let base = link.stats()[0].packets;
    let n = 4000u32;
    for k in 0..n {
        s.send_to(&k.to_be_bytes(), (B_ADDR, 9999)).unwrap();
        if k % 100 == 99 {
            read_from_a(base + k as u64 + 1);
        }
    }
    // Everything sent is delivered (10 ms, or 110 ms for the held back) before the "stop".
    std::thread::sleep(Duration::from_millis(400));
    // Cut: nothing gets through.
    link.set_cut(true);
    for k in 0..100u32 {
        s.send_to(&(1_000_000 + k).to_be_bytes(), (B_ADDR, 9999)).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while link.stats()[0].cut < 100 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    link.set_cut(false);
    for _ in 0..50 {
        s.send_to(b"stop", (B_ADDR, 9999)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = receiver.join().unwrap();
    assert!(got.iter().all(|&k| k < n), "a datagram sent while cut got through");
    let lost = 1.0 - got.len() as f64 / n as f64;
    // 5 % of 4000: the standard deviation is 0.35 %.
    assert!((0.035..0.065).contains(&lost), "lost {lost}");
    // Held back: arrived after a datagram sent later than it. (Counting neighbours out of order
    // would not do: when the sender is quicker than the hold, the held ones arrive together, in
    // order among themselves.)
    let mut latest = 0;
    let overtaken = got
        .iter()
        .filter(|&&k| {
            latest = latest.max(k);
            k < latest
        })
        .count();
    let held = overtaken as f64 / got.len() as f64;
    // 10 % of ~3,800: the standard deviation is 0.5 %.
    assert!(
        (0.07..0.13).contains(&held),
        "{overtaken} of {} came out of order",
        got.len()
    );
    let [ab, _] = link.stats();
    assert_eq!(ab.cut, 100, "{ab:?}");
}
