//! A connection that cannot start a worker thread runs the request itself, on its own thread,
//! and must first finish what it has on its ring: a planned write there holds its grains
//! until this very thread reaps it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tessera_test_support::held::HeldWrites;
use tessera_volume::{Engine, LayoutKind, VdiskSpec};
use tokio::net::TcpListener;

use crate::client::Client;
use crate::workers::NO_WORKER_THREADS;
use crate::{Export, Registry};

const MIB: u64 = 1 << 20;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_run_inline_waits_for_the_ring_that_holds_its_grains() {
    if !tessera_disk::io_uring_available() {
        tessera_disk::skip(
            "inline_tests::a_request_run_inline_waits_for_the_ring_that_holds_its_grains",
            "io_uring unavailable: no ring to plan writes on",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (disk, held) = HeldWrites::new("m", 64 * MIB);
    let engine = Engine::create_pool_with_checksums(&dir.path().join("pool"), "p", vec![disk], 4 * MIB, false).unwrap();
    let v = engine
        .create_vdisk(&VdiskSpec::new("v", 16 * MIB, LayoutKind::Simple))
        .unwrap();
    // Mapped first (the engine's own synchronous write), so that an overwrite is planned.
    v.write(0, &pattern(1, 64 << 10), false).unwrap();
    let reg = Registry::new();
    reg.add(Export::new("v", "p/v", v.clone(), false));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(crate::serve(listener, reg.clone()));

    NO_WORKER_THREADS.store(true, Ordering::SeqCst);
    let c = Arc::new(Client::connect(&addr, "v").await.unwrap());
    // A whole-block overwrite goes on the ring, and its disk write is held...
    let a = pattern(2, 4096);
    let first = tokio::spawn({
        let (c, a) = (c.clone(), a.clone());
        async move { c.write(0, &a, false).await }
    });
    for _ in 0..500 {
        if held.started() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(held.started(), 1, "the 4 KiB overwrite was not planned");
    // ...while WRITE ZEROES in the same grain (never planned) must run on the connection's
    // thread, no worker being had.
    let second = tokio::spawn({
        let c = c.clone();
        async move { c.write_zeroes(512, 1024, 0).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!first.is_finished() && !second.is_finished());
    // The disk completes the held write: the connection reaps it, then runs the second.
    held.release();
    let within = Duration::from_secs(10);
    tokio::time::timeout(within, first)
        .await
        .expect("the ring's write answered")
        .unwrap()
        .unwrap();
    tokio::time::timeout(within, second)
        .await
        .expect("the inline write answered")
        .unwrap()
        .unwrap();
    NO_WORKER_THREADS.store(false, Ordering::SeqCst);
    let mut want = a;
    want[512..1536].fill(0);
    assert_eq!(c.read(0, 4096).await.unwrap(), want);
    let Ok(c) = Arc::try_unwrap(c) else {
        panic!("the client is still shared")
    };
    c.disconnect().await.unwrap();
    reg.remove("v");
    // The engine closes here, on the test's thread, once the connection's thread has let go
    // of the vdisk (the engine's reference and `v` remain), not while the process exits.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&v) > 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(engine);
}
