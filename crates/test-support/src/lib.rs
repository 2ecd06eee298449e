//! What the tests of the crates above the engine share (the engine's own tests keep a richer
//! rig of their own, with fault injection and restarts, in crates/volume/tests/common): a pool
//! on memory or file disks in a temporary directory that lives as long as the pool, and a RAM
//! backend whose writes or copies stall until the test lets them go on ([`gated_ram`]).

pub mod cdbs;
pub mod cunit;
pub mod etcd_cluster;
pub mod gated_ram;
pub mod held;
pub mod password_etcd;
pub mod tls_etcd;

use std::sync::{Arc, Mutex, Once, Weak};

use tessera_disk::{DiskRef, FileDisk, MemDisk};
use tessera_volume::{Engine, Layouts};

pub const MIB: u64 = 1 << 20;

/// What a test pool's disks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disks {
    /// In memory: fast, no io_uring reads.
    Memory,
    /// Sparse files in the pool's directory: read with direct I/O, and on an io_uring by the
    /// transports that plan their reads.
    Files,
}

/// A pool "p" with 1 MiB slabs. Keep it whole while the engine is in use: the directory goes
/// with it.
pub struct TestPool {
    pub dir: tempfile::TempDir,
    pub engine: Engine,
}

impl TestPool {
    /// `count` disks of `size` bytes each.
    pub fn new(kind: Disks, count: usize, size: u64) -> TestPool {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let disks: Vec<DiskRef> = (0..count)
            .map(|i| match kind {
                Disks::Memory => Arc::new(MemDisk::new(&format!("m{i}"), size)) as DiskRef,
                Disks::Files => Arc::new(
                    FileDisk::create_file(dir.path().join(format!("m{i}.img")), size, false).expect("a file disk"),
                ) as DiskRef,
            })
            .collect();
        let engine = Engine::create_pool(&dir.path().join("p"), "p", disks, MIB).expect("a pool");
        quiesce_at_exit(engine.layouts());
        TestPool { dir, engine }
    }
}

/// The pools of this process, to quiesce at its exit.
static OPEN: Mutex<Vec<Weak<Layouts>>> = Mutex::new(Vec::new());

/// A test that ends while a server task or a session thread still holds its pool leaves the
/// pool's RocksDB stores open when the process exits, and a background flush or compaction
/// running into RocksDB's static destructors aborts the process ("pthread lock: Invalid
/// argument"). Handlers registered with atexit run before the destructors of the statics
/// constructed before them, and the stores' statics are constructed when the first pool
/// opens, before this registers: so the handler stops the background work of every pool
/// still open first.
fn quiesce_at_exit(layouts: &Arc<Layouts>) {
    static HOOK: Once = Once::new();
    extern "C" fn quiesce() {
        let open = OPEN.lock().map(|o| o.clone()).unwrap_or_default();
        for l in open.iter().filter_map(Weak::upgrade) {
            l.stop_background_work();
        }
    }
    let mut open = OPEN.lock().expect("not poisoned");
    open.retain(|w| w.strong_count() > 0);
    open.push(Arc::downgrade(layouts));
    drop(open);
    HOOK.call_once(|| {
        // SAFETY: registers a plain function with no captured state.
        unsafe { libc::atexit(quiesce) };
    });
}
