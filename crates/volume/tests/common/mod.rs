//! A test rig: an engine on in-memory disks behind fault injectors, that can be closed and
//! reopened as a restart would.

#![allow(dead_code)]

pub mod child;

use std::sync::Arc;

use tessera_disk::{BlockDevice, DiskError, DiskRef, FaultyDisk, MemDisk};
use tessera_volume::{
    Compression, DedupMode, DedupSettings, Engine, LayoutKind, PassOptions, PassReport, Progress, Provisioning,
    RebuildOptions, SlabRef, VdiskSpec,
};

pub const MIB: u64 = 1 << 20;

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub disks: Vec<Arc<FaultyDisk>>,
    pub engine: Option<Engine>,
}

impl Rig {
    pub fn new(n: usize, disk_size: u64, slab: u64) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let disks: Vec<Arc<FaultyDisk>> = (0..n)
            .map(|i| FaultyDisk::new(Arc::new(MemDisk::new(&format!("mem{i}"), disk_size)) as DiskRef))
            .collect();
        let refs: Vec<DiskRef> = disks.iter().map(|d| d.clone() as DiskRef).collect();
        let engine = Engine::create_pool(&dir.path().join("pool"), "test", refs, slab).unwrap();
        Rig {
            dir,
            disks,
            engine: Some(engine),
        }
    }

    /// A rig whose pool also has `cache` disks for the write-back cache log.
    pub fn with_cache(n: usize, disk_size: u64, slab: u64, cache: usize) -> Rig {
        let mut rig = Rig::new(n, disk_size, slab);
        for i in 0..cache {
            let d = FaultyDisk::new(Arc::new(MemDisk::new(&format!("cache{i}"), 66 * MIB)) as DiskRef);
            rig.engine().add_cache_disk(d.clone() as DiskRef).unwrap();
            rig.disks.push(d);
        }
        rig
    }

    pub fn engine(&self) -> &Engine {
        self.engine.as_ref().unwrap()
    }

    pub fn opener(&self) -> impl Fn(&str) -> Result<DiskRef, DiskError> + '_ {
        move |path: &str| {
            self.disks
                .iter()
                .find(|d| d.path() == path)
                .map(|d| d.clone() as DiskRef)
                .ok_or_else(|| DiskError::Open {
                    path: path.into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                })
        }
    }

    /// Closes the engine without a flush (a process crash loses nothing an in-memory disk
    /// holds) and opens the pool again.
    /// Why the pool cannot be opened again; None if it opens.
    pub fn open_error(&self) -> Option<String> {
        Engine::open(&self.dir.path().join("pool"), &self.opener())
            .err()
            .map(|e| e.to_string())
    }

    pub fn reopen(&mut self) {
        self.engine = None;
        let e = Engine::open(&self.dir.path().join("pool"), &self.opener()).unwrap();
        self.engine = Some(e);
    }

    /// Runs a repair (two slabs at a time, no rate limit), asserts that every slab it took
    /// was mended and that no repair is left needed, and returns how many slabs it rebuilt.
    pub fn repair(&self) -> usize {
        let r = self
            .engine()
            .repair(
                &RebuildOptions {
                    parallel: 2,
                    rate_limit: None,
                },
                &Progress::default(),
            )
            .unwrap();
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        let (left, _) = self.engine().layouts().repair_needed();
        assert!(left.is_empty(), "a repair is still needed: {left:?}");
        r.slabs_rebuilt
    }

    pub fn assert_consistent(&self) {
        let r = self.engine().check().unwrap();
        assert!(r.problems.is_empty(), "metadata check failed: {:#?}", r.problems);
    }
}

pub fn spec(name: &str, size: u64, kind: LayoutKind, prov: Provisioning) -> VdiskSpec {
    let mut s = VdiskSpec::new(name, size, kind);
    s.provisioning = prov;
    s.interleave = Some(16 << 10);
    s.grain_size = Some(16 << 10);
    s.block_size = Some(512);
    match kind {
        LayoutKind::Simple => s.columns = Some(2),
        LayoutKind::Mirror => s.columns = Some(1),
        LayoutKind::Parity => s.columns = Some(3),
        LayoutKind::DualParity => s.columns = Some(4),
    }
    s
}

/// A pool with a mirror vdisk `a`, its snapshot `a@s1` (then partly overwritten, so that both
/// hold exclusive and shared grains) and a parity vdisk `b`; 16 KiB grains.
pub fn populated() -> Rig {
    let rig = Rig::new(5, 64 * MIB, MIB);
    let e = rig.engine();
    let a = e
        .create_vdisk(&spec("a", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    a.write(0, &pattern(1, 0, (2 * MIB) as usize), false).unwrap();
    e.snapshot("a", "s1").unwrap();
    a.write(MIB, &pattern(2, MIB, MIB as usize), false).unwrap();
    let b = e
        .create_vdisk(&spec("b", 4 * MIB, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    b.write(0, &pattern(3, 0, (3 * MIB) as usize), false).unwrap();
    rig
}

/// Every vdisk's whole content, by name.
pub fn contents(e: &Engine) -> std::collections::BTreeMap<String, Vec<u8>> {
    e.vdisks()
        .iter()
        .map(|v| {
            let mut buf = vec![0u8; v.size() as usize];
            v.read(0, &mut buf).unwrap();
            (v.name(), buf)
        })
        .collect()
}

/// Deterministic, position-dependent bytes, so that misplaced data never compares equal.
/// Lines of text, numbered from `offset / 64`: each 4 KiB block differs from every other, and
/// compresses to a fraction of its size.
pub fn compressible(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut line = offset / 64;
    let skip = (offset % 64) as usize;
    while out.len() < len + skip {
        let text = format!(
            "{seed:012x} {line:010} {:<39}\n",
            "the same words on every line of a file"
        );
        out.extend_from_slice(&text.as_bytes()[..64]);
        line += 1;
    }
    out.drain(..skip);
    out.truncate(len);
    out
}

pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (offset + i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93);
            (x >> 29) as u8
        })
        .collect()
}

/// Dedup on for every vdisk of the pool, with no minimum age.
pub fn enable_dedup(e: &Engine, compression: Compression) {
    e.set_dedup_settings(DedupSettings {
        enabled: true,
        min_age_secs: 0,
        compression,
        ..Default::default()
    })
    .unwrap();
}

/// A dedup run now, as fast as the disks allow, whatever the regions' age.
pub fn run_dedup(e: &Engine) -> PassReport {
    let opts = PassOptions {
        mode: DedupMode::Throughput,
        ignore_min_age: true,
        ..Default::default()
    };
    e.dedup_run(&opts, &Progress::default()).unwrap()
}

/// A block of a vdisk found on a member by its content: the member, the offset in it, and the
/// block's offset in the vdisk.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub slab: SlabRef,
    pub mo: u64,
    pub at: u64,
}

/// Where each `block`-byte block of `data` (what the pool's vdisk holds from offset 0, each
/// block different) lies on the members of the pool's first slab set, found by reading the
/// members through `disk` (by disk index: bypass any fault injector) and matching content.
pub fn placed_blocks(e: &Engine, disk: impl Fn(usize) -> DiskRef, data: &[u8], block: u64) -> Vec<Placed> {
    let by_content: std::collections::HashMap<&[u8], u64> = (0..data.len() as u64)
        .step_by(block as usize)
        .map(|at| (&data[at as usize..(at + block) as usize], at))
        .collect();
    let set = e.layouts().sets()[0].clone();
    let slab_size = e.pool().slab_size();
    let mut placed = Vec::new();
    for slab in set.desc().members {
        let mut b = tessera_disk::AlignedBuf::zeroed(slab_size as usize);
        disk(slab.disk as usize)
            .read_at(&mut b, e.pool().slab_offset(slab))
            .unwrap();
        for (k, chunk) in b.chunks(block as usize).enumerate() {
            if let Some(&at) = by_content.get(chunk) {
                placed.push(Placed {
                    slab,
                    mo: k as u64 * block,
                    at,
                });
            }
        }
    }
    placed
}
