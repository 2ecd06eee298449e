//! Replication across an emulated WAN (tessera-linkem: two network namespaces, 20 Mbit/s,
//! 40 ms RTT, 1 % loss each way), over TLS with a pre-shared key and BBR: a cycle arrives
//! bit-exact; a peer without the key gets nothing and writes nothing; a link that drops
//! mid-cycle costs the cycle, not what it had sent, once the link is back.

mod common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::time::Duration;

use common::*;
use tessera_linkem::{netns, Link, Shape, B_ADDR};
use tessera_replication::{receive, send, ReceiveReport, ReplError, SendReport, Transport};
use tessera_volume::{LayoutKind, VdiskSpec};

fn keys(key: u8) -> HashMap<String, Vec<u8>> {
    [("sites".to_string(), vec![key; 32])].into()
}

fn transport(key: u8) -> Transport {
    Transport::with_keys(keys(key), "bbr", Duration::from_secs(3)).unwrap()
}

/// One cycle from `src` (in namespace a) to `dst` (in b), with the given key on the sender;
/// `during` runs on the test's thread while the cycle is under way.
fn cycle_across(
    link: &Link,
    src: &Site,
    dst: &Site,
    sender_key: u8,
    snap: &str,
    during: impl FnOnce(),
) -> (Result<SendReport, ReplError>, Result<ReceiveReport, String>) {
    let b = link.b.name.clone();
    let a = link.a.name.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            netns::enter(&b).unwrap();
            let l = TcpListener::bind((B_ADDR, 0)).unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            let (c, _) = l.accept().unwrap();
            let t = transport(1);
            let tls = t.accept(c)?;
            receive(tls, dst, &options(dst)).map_err(|e| e.to_string())
        });
        let to = rx.recv().unwrap();
        let sender = s.spawn(move || {
            netns::enter(&a).unwrap();
            let t = transport(sender_key);
            let conn = t.connect(&to.to_string()).map_err(ReplError::Invalid)?;
            let newer = src.engine.vdisk(&format!("vol@{snap}")).unwrap();
            send(conn, &newer, None, "p", "vol", snap)
        });
        during();
        (sender.join().unwrap(), receiver.join().unwrap())
    })
}

#[test]
fn a_cycle_crosses_a_lossy_wan_only_with_the_key_and_survives_a_drop() {
    if let Some(why) = tessera_linkem::unavailable() {
        tessera_disk::skip(
            "a_cycle_crosses_a_lossy_wan_only_with_the_key_and_survives_a_drop",
            &why,
        );
        return;
    }
    let mut shape = Shape::new(20_000_000, Duration::from_millis(40));
    shape.loss = 0.01;
    let link = Link::start(&format!("rw{}", std::process::id()), shape, shape).unwrap();
    let src = site(2, 128 * MIB);
    let dst = site(2, 128 * MIB);
    let mut spec = VdiskSpec::new("vol", 32 * MIB, LayoutKind::Mirror);
    spec.grain_size = Some(GRAIN);
    let v = src.engine.create_vdisk(&spec).unwrap();
    v.write(0, &noise(1, (6 * MIB) as usize), false).unwrap();
    let s1 = src.engine.snapshot("vol", "s1").unwrap();

    // Without the key: the handshake fails, the replica pool is untouched.
    let (sent, got) = cycle_across(&link, &src, &dst, 9, "s1", || {});
    assert!(sent.is_err() && got.is_err(), "{sent:?} {got:?}");
    assert!(dst.engine.vdisk("vol").is_err(), "nothing was created");

    // The link drops a moment into the cycle and comes back: the cycle fails (the sides give
    // up after 3 s of silence), and the next one sends only what did not get through.
    let (sent, got) = cycle_across(&link, &src, &dst, 1, "s1", || {
        // Once a couple of MiB are across (data is flowing, the cycle has begun).
        let start = std::time::Instant::now();
        while link.stats()[0].bytes < 2 << 20 && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
        link.set_cut(true);
        std::thread::sleep(Duration::from_secs(5));
        link.set_cut(false);
    });
    assert!(sent.is_err() && got.is_err(), "{sent:?} {got:?}");
    let (sent, got) = cycle_across(&link, &src, &dst, 1, "s1", || {});
    let (sent, got) = (sent.unwrap(), got.unwrap());
    assert!(got.resumed, "{got:?}");
    assert!(sent.sent_bytes < 6 * MIB, "{sent:?}");
    assert_eq!(image(&dst.engine.vdisk("vol@s1").unwrap()), image(&s1));
    let [ab, _] = link.stats();
    assert!(ab.lost > 0 && ab.cut > 0, "{ab:?}");
}
