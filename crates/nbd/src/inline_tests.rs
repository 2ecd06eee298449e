//! A connection that cannot start a worker thread runs the request itself, on its own thread,
//! and must first finish what it has on its ring: a planned write there holds its grains
//! until this very thread reaps it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tessera_test_support::held::HeldWrites;
use tessera_volume::{Engine, LayoutKind, Vdisk, VdiskSpec};
use tokio::net::TcpListener;

use crate::client::Client;
use crate::workers::NO_WORKER_THREADS;
use crate::{Export, Registry};

const MIB: u64 = 1 << 20;
const G: u64 = 64 << 10;

/// `NO_WORKER_THREADS` is the process's: one of these tests at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A simple vdisk "v" of 64 KiB grains on a disk whose writes can be held, served over NBD
/// by a connection that gets no worker thread (while this lives, one test at a time).
struct Served {
    _dir: tempfile::TempDir,
    held: HeldWrites,
    engine: Engine,
    v: Arc<Vdisk>,
    reg: Arc<Registry>,
    addr: String,
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl Served {
    async fn start() -> Served {
        let dir = tempfile::tempdir().unwrap();
        let (disk, held) = HeldWrites::new("m", 64 * MIB);
        let engine =
            Engine::create_pool_with_checksums(&dir.path().join("pool"), "p", vec![disk], 4 * MIB, false).unwrap();
        let mut spec = VdiskSpec::new("v", 16 * MIB, LayoutKind::Simple);
        spec.grain_size = Some(G);
        let v = engine.create_vdisk(&spec).unwrap();
        let reg = Registry::new();
        reg.add(Export::new("v", "p/v", v.clone(), false));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(crate::serve(listener, reg.clone()));
        let alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        NO_WORKER_THREADS.store(true, Ordering::SeqCst);
        Served {
            _dir: dir,
            held,
            engine,
            v,
            reg,
            addr,
            _alone: alone,
        }
    }

    /// Waits until the one write sent has reached the disk, where it is held.
    async fn wait_for_the_held_write(&self) {
        for _ in 0..500 {
            if self.held.started() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(self.held.started(), 1, "the 4 KiB overwrite was not planned");
    }

    /// Disconnects `c` and closes the engine here, on the test's thread, once the
    /// connection's thread has let go of the vdisk (the engine's reference and `v` remain),
    /// not while the process exits.
    async fn close(self, c: Arc<Client>) {
        NO_WORKER_THREADS.store(false, Ordering::SeqCst);
        let Ok(c) = Arc::try_unwrap(c) else {
            panic!("the client is still shared")
        };
        c.disconnect().await.unwrap();
        self.reg.remove("v");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&self.v) > 2 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(self.engine);
    }
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
    let s = Served::start().await;
    // Mapped first (the engine's own synchronous write), so that an overwrite is planned.
    s.v.write(0, &pattern(1, G as usize), false).unwrap();
    let c = Arc::new(Client::connect(&s.addr, "v").await.unwrap());
    // A whole-block overwrite goes on the ring, and its disk write is held...
    let a = pattern(2, 4096);
    let first = tokio::spawn({
        let (c, a) = (c.clone(), a.clone());
        async move { c.write(0, &a, false).await }
    });
    s.wait_for_the_held_write().await;
    // ...while WRITE ZEROES in the same grain (never planned) must run on the connection's
    // thread, no worker being had.
    let second = tokio::spawn({
        let c = c.clone();
        async move { c.write_zeroes(512, 1024, 0).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!first.is_finished() && !second.is_finished());
    // The disk completes the held write: the connection reaps it, then runs the second.
    s.held.release();
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
    let mut want = a;
    want[512..1536].fill(0);
    assert_eq!(c.read(0, 4096).await.unwrap(), want);
    s.close(c).await;
}

/// A READ whose first part is planned and whose last part is not (its grain held by a write
/// on the ring) goes whole to a worker; with none to be had it runs on the connection's
/// thread once the ring's write is done, and reads what that write left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_planned_in_part_runs_inline_after_the_ring_that_holds_its_last_grain() {
    if !tessera_disk::io_uring_available() {
        tessera_disk::skip(
            "inline_tests::a_read_planned_in_part_runs_inline_after_the_ring_that_holds_its_last_grain",
            "io_uring unavailable: no ring to plan reads and writes on",
        );
        return;
    }
    let s = Served::start().await;
    // Grains 0 and 2 mapped, grain 1 a hole: a structured READ of the three has two data parts.
    s.v.write(0, &pattern(1, G as usize), false).unwrap();
    s.v.write(2 * G, &pattern(3, G as usize), false).unwrap();
    let c = Arc::new(Client::connect(&s.addr, "v").await.unwrap());
    assert!(c.info.structured, "structured replies were not negotiated");
    // An overwrite in grain 2 goes on the ring, its disk write held...
    let new = pattern(4, 4096);
    let write = tokio::spawn({
        let (c, new) = (c.clone(), new.clone());
        async move { c.write(2 * G + 8192, &new, false).await }
    });
    s.wait_for_the_held_write().await;
    // ...so a READ of grains 0 to 2 plans its first part and not its last.
    let read = tokio::spawn({
        let c = c.clone();
        async move { c.read(0, 3 * G as u32).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!write.is_finished() && !read.is_finished());
    s.held.release();
    let within = Duration::from_secs(10);
    tokio::time::timeout(within, write)
        .await
        .expect("the ring's write answered")
        .unwrap()
        .unwrap();
    let got = tokio::time::timeout(within, read)
        .await
        .expect("the inline read answered")
        .unwrap()
        .unwrap();
    let mut want = pattern(1, G as usize);
    want.extend(vec![0u8; G as usize]);
    want.extend(pattern(3, G as usize));
    want[2 * G as usize + 8192..2 * G as usize + 8192 + 4096].copy_from_slice(&new);
    assert!(got == want, "the read does not hold what the write left");
    s.close(c).await;
}
