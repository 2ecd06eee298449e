//! Two sites for replication tests: pools on memory disks, one of which takes replicas.

#![allow(dead_code)]

use std::sync::Arc;

use tessera_disk::{DiskRef, MemDisk, PowerSupply, VolatileDisk};
use tessera_replication::{Commit, ReceiveOptions, ReplicaSite};
use tessera_volume::{Engine, LayoutKind, Vdisk};

pub const MIB: u64 = 1 << 20;
pub const GRAIN: u64 = 64 << 10;

pub struct Site {
    pub dir: tempfile::TempDir,
    pub engine: Arc<Engine>,
    /// Shared by every connection the site takes, as a daemon's listener shares it.
    pub joins: Arc<tessera_replication::Joins>,
    /// The last cycle committed into each vdisk, as a daemon records it.
    pub committed: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// The source's ids of the snapshots those cycles were made from.
    pub committed_ids: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// The replicas a cycle was to make and could not, as the site was told.
    pub not_made: std::sync::Mutex<Vec<String>>,
    /// The cycle each working copy holds part of (set by `changing`, cleared by `committed`
    /// and `settled`), as a daemon records it in the pool.
    pub changing: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Set: every extra stream is refused as it joins (as a daemon refuses one whose key
    /// was taken out of its file meanwhile).
    pub refuse_joins: std::sync::atomic::AtomicBool,
    /// How many cycles failed once under way, as the site was told.
    pub failing: std::sync::atomic::AtomicUsize,
}

impl ReplicaSite for Site {
    fn engine(&self, pool: &str) -> Result<Arc<Engine>, String> {
        (pool == "p")
            .then(|| self.engine.clone())
            .ok_or_else(|| format!("no pool '{pool}'"))
    }
    fn may_write(&self, _pool: &str, vdisk: &str, exists: bool) -> Result<(), String> {
        if vdisk == "precious" && exists {
            return Err(format!("'{vdisk}' is not a replica"));
        }
        Ok(())
    }
    fn not_made(&self, pool: &str, vdisk: &str) {
        self.not_made.lock().unwrap().push(format!("{pool}/{vdisk}"));
    }
    fn last_committed(&self, pool: &str, vdisk: &str) -> Option<Commit> {
        let key = format!("{pool}/{vdisk}");
        let snapshot = self.committed.lock().unwrap().get(&key).cloned()?;
        let snapshot_id = self.committed_ids.lock().unwrap().get(&key).copied();
        Some(Commit { snapshot, snapshot_id })
    }
    fn changing(&self, pool: &str, vdisk: &str, snapshot: &str) -> Result<(), String> {
        self.changing
            .lock()
            .unwrap()
            .insert(format!("{pool}/{vdisk}"), snapshot.to_string());
        Ok(())
    }
    fn settled(&self, pool: &str, vdisk: &str, snapshot: &str) -> Result<(), String> {
        let mut changing = self.changing.lock().unwrap();
        let key = format!("{pool}/{vdisk}");
        if changing.get(&key).map(String::as_str) == Some(snapshot) {
            changing.remove(&key);
        }
        Ok(())
    }
    fn joining(&self, _pool: &str, _vdisk: &str) -> Result<(), String> {
        if self.refuse_joins.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("this site refuses the stream".into());
        }
        Ok(())
    }
    fn failing(&self) {
        self.failing.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn committed(&self, pool: &str, vdisk: &str, commit: &Commit) -> Result<(), String> {
        let key = format!("{pool}/{vdisk}");
        self.changing.lock().unwrap().remove(&key);
        self.committed
            .lock()
            .unwrap()
            .insert(key.clone(), commit.snapshot.clone());
        match commit.snapshot_id {
            Some(id) => self.committed_ids.lock().unwrap().insert(key, id),
            None => self.committed_ids.lock().unwrap().remove(&key),
        };
        Ok(())
    }
}

pub fn site(disks: usize, disk_size: u64) -> Site {
    let refs: Vec<DiskRef> = (0..disks)
        .map(|i| Arc::new(MemDisk::new(&format!("m{i}"), disk_size)) as DiskRef)
        .collect();
    site_on(refs)
}

/// A site whose disks have a volatile write cache that `PowerSupply::cut` loses part of, as
/// a power failure would; the disks' media, for [`reopened`].
pub fn volatile_site(disks: usize, disk_size: u64) -> (Site, Arc<PowerSupply>, Vec<DiskRef>) {
    let supply = PowerSupply::new();
    let media: Vec<DiskRef> = (0..disks)
        .map(|i| Arc::new(MemDisk::new(&format!("m{i}"), disk_size)) as DiskRef)
        .collect();
    let refs = media
        .iter()
        .map(|m| VolatileDisk::new(m.clone(), &supply) as DiskRef)
        .collect();
    (site_on(refs), supply, media)
}

/// Site `s` after its power was cut and came back: its pool opened again from its disks'
/// `media` and from a copy of its directory (the metadata store syncs each commit, which a
/// process's files keep as a power cut would), what the site recorded kept. The pool as it
/// was is let go of without a word: its disks answer nothing more.
pub fn reopened(s: Site, media: &[DiskRef]) -> Site {
    std::mem::forget(s.engine);
    let copy = tempfile::tempdir().unwrap();
    copy_dir(s.dir.path(), copy.path());
    let open = |path: &str| {
        Ok(media
            .iter()
            .find(|m| m.path() == path)
            .cloned()
            .unwrap_or_else(|| panic!("no disk {path}")))
    };
    let engine = Engine::open(&copy.path().join("pool"), &open).unwrap();
    Site {
        dir: copy,
        engine: Arc::new(engine),
        ..s
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

fn site_on(refs: Vec<DiskRef>) -> Site {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create_pool(&dir.path().join("pool"), "p", refs, 4 * MIB).unwrap();
    Site {
        dir,
        engine: Arc::new(engine),
        joins: Default::default(),
        committed: Default::default(),
        committed_ids: Default::default(),
        not_made: Default::default(),
        changing: Default::default(),
        refuse_joins: Default::default(),
        failing: Default::default(),
    }
}

pub fn options(s: &Site) -> ReceiveOptions {
    ReceiveOptions {
        layout: LayoutKind::Mirror,
        cycles_dir: s.dir.path().join("cycles"),
        joins: s.joins.clone(),
        opening: Default::default(),
        pace: Default::default(),
        identity: String::new(),
    }
}

/// Bytes that do not compress, different for each seed and place.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

pub fn image(v: &Vdisk) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; MIB as usize];
    let mut at = 0;
    while at < v.size() {
        let n = MIB.min(v.size() - at) as usize;
        v.read(at, &mut buf[..n]).unwrap();
        h.update(&buf[..n]);
        at += n as u64;
    }
    h.finalize()
}
