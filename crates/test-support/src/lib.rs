//! What the tests of the crates above the engine share (the engine's own tests keep a richer
//! rig of their own, with fault injection and restarts, in crates/volume/tests/common): a pool
//! on memory or file disks in a temporary directory that lives as long as the pool.

use std::sync::Arc;

use tessera_disk::{DiskRef, FileDisk, MemDisk};
use tessera_volume::Engine;

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
        TestPool { dir, engine }
    }
}
