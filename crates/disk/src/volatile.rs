//! A disk with a volatile write cache, and the power supply that can cut it, for tests of what
//! survives a power failure.
//!
//! A process crash (SIGKILL) loses nothing a file disk was given: the page cache survives it,
//! so a missing flush never shows. Here writes land in a cache that reads see but that only
//! `flush` moves to the medium, as on a disk with its write cache on. A power cut keeps a
//! random subset of the cached writes, tears one of them (only some of its sectors reach the
//! medium) and drops the rest, in any order a disk might have destaged them: afterwards each
//! sector holds its last flushed content or one of the values written to it since.
//!
//! Every disk of one [`PowerSupply`] loses power at the same instant: the cut holds the supply
//! while it settles each disk's cache, and any I/O that comes after it never returns (the
//! thread parks), so nothing the upper layers do after the cut can reach a disk, or report an
//! error that would make them write something elsewhere.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use rand::{Rng, SeedableRng};

use crate::{check_request, BlockDevice, DiskError, DiskRef, SECTOR};

/// Bytes a disk's cache holds before it destages its oldest writes by itself, as a real
/// cache does when it fills up.
const CACHE_BYTES: usize = 32 << 20;

/// What a power cut did to one disk's cache.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CutReport {
    /// Cached writes that reached the medium whole.
    pub kept: usize,
    /// A write of which only some sectors reached the medium (0 or 1).
    pub torn: usize,
    /// Cached writes lost.
    pub dropped: usize,
}

/// A cut armed to happen at the I/O that reaches a count.
struct Armed {
    after_ops: u64,
    seed: u64,
    then: Option<Box<dyn FnOnce(Vec<CutReport>) + Send>>,
}

/// The power of a group of [`VolatileDisk`]s: cutting it cuts them all at one instant.
pub struct PowerSupply {
    /// True while the power is on. Every I/O holds it shared; the cut takes it exclusively.
    on: RwLock<bool>,
    disks: Mutex<Vec<Weak<VolatileDisk>>>,
    /// Writes and flushes issued to the supply's disks.
    ops: AtomicU64,
    armed: Mutex<Option<Armed>>,
}

impl PowerSupply {
    pub fn new() -> Arc<PowerSupply> {
        Arc::new(PowerSupply {
            on: RwLock::new(true),
            disks: Mutex::new(Vec::new()),
            ops: AtomicU64::new(0),
            armed: Mutex::new(None),
        })
    }

    /// Writes and flushes issued to the supply's disks so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    /// Cuts the power when the `after_ops`-th write or flush from now is issued, before that
    /// I/O takes effect, with the cache outcomes drawn from `seed`; `then` runs right after
    /// the cut, in the thread that issued the I/O (a test's child process exits there).
    pub fn arm(&self, after_ops: u64, seed: u64, then: impl FnOnce(Vec<CutReport>) + Send + 'static) {
        *self.armed.lock() = Some(Armed {
            after_ops: self.ops() + after_ops.max(1),
            seed,
            then: Some(Box::new(then)),
        });
    }

    /// Cuts the power now: every disk keeps a random subset of its cached writes (drawn from
    /// `seed`) and tears one; I/O issued from now on never returns. One report per disk, in
    /// the order the disks were made.
    pub fn cut(&self, seed: u64) -> Vec<CutReport> {
        let mut on = self.on.write();
        self.cut_locked(&mut on, seed)
    }

    pub fn is_on(&self) -> bool {
        *self.on.read()
    }

    fn cut_locked(&self, on: &mut bool, seed: u64) -> Vec<CutReport> {
        if !*on {
            return Vec::new();
        }
        *on = false;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        self.disks
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .map(|d| d.lose_cache(&mut rng))
            .collect()
    }

    /// Counts one write or flush and cuts the power first if it is the armed one.
    fn count_op(&self) {
        let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        let mut armed = self.armed.lock();
        if armed.as_ref().is_none_or(|a| n < a.after_ops) {
            return;
        }
        let mut a = armed.take().expect("armed");
        drop(armed);
        let reports = {
            let mut on = self.on.write();
            self.cut_locked(&mut on, a.seed)
        };
        if let Some(then) = a.then.take() {
            then(reports);
        }
    }

    /// Holds the power on for one I/O; after a cut the calling thread stops here for good.
    fn hold(&self) -> parking_lot::RwLockReadGuard<'_, bool> {
        let on = self.on.read();
        if !*on {
            drop(on);
            loop {
                std::thread::park();
            }
        }
        on
    }
}

/// A [`BlockDevice`] whose writes stay in a volatile cache until a flush. Its path is the
/// medium's path.
pub struct VolatileDisk {
    medium: DiskRef,
    supply: Arc<PowerSupply>,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    /// Writes not yet on the medium, oldest first.
    writes: Vec<(u64, Vec<u8>)>,
    bytes: usize,
}

impl VolatileDisk {
    /// A disk caching writes for `medium`, powered by `supply`.
    pub fn new(medium: DiskRef, supply: &Arc<PowerSupply>) -> Arc<VolatileDisk> {
        let d = Arc::new(VolatileDisk {
            medium,
            supply: supply.clone(),
            cache: Mutex::new(Cache::default()),
        });
        supply.disks.lock().push(Arc::downgrade(&d));
        d
    }

    /// The medium: what survives a power cut.
    pub fn medium(&self) -> &DiskRef {
        &self.medium
    }

    /// Bytes written and not flushed.
    pub fn cached_bytes(&self) -> usize {
        self.cache.lock().bytes
    }

    /// Settles the cache at a power cut: each write reaches the medium or not, one of those
    /// that do (if any) only in part.
    fn lose_cache(&self, rng: &mut impl Rng) -> CutReport {
        let writes = std::mem::take(&mut *self.cache.lock()).writes;
        let mut report = CutReport::default();
        let torn = (!writes.is_empty()).then(|| rng.random_range(0..writes.len()));
        for (i, (offset, data)) in writes.into_iter().enumerate() {
            if Some(i) == torn {
                report.torn += 1;
                for (s, sector) in data.chunks(SECTOR).enumerate() {
                    if rng.random_bool(0.5) {
                        // A medium that fails here fails the test that reads it back.
                        let _ = self.medium.write_at(sector, offset + (s * SECTOR) as u64);
                    }
                }
            } else if rng.random_bool(0.5) {
                report.kept += 1;
                let _ = self.medium.write_at(&data, offset);
            } else {
                report.dropped += 1;
            }
        }
        report
    }

    /// Writes the oldest cached writes to the medium until the cache is within its size.
    fn destage(&self, cache: &mut Cache) -> Result<(), DiskError> {
        let mut n = 0;
        let mut bytes = cache.bytes;
        while bytes > CACHE_BYTES && n < cache.writes.len() {
            let (offset, data) = &cache.writes[n];
            self.medium.write_at(data, *offset)?;
            bytes -= data.len();
            n += 1;
        }
        cache.writes.drain(..n);
        cache.bytes = bytes;
        Ok(())
    }
}

fn overlap(a: u64, alen: usize, b: u64, blen: usize) -> Option<(u64, u64)> {
    let start = a.max(b);
    let end = (a + alen as u64).min(b + blen as u64);
    (start < end).then_some((start, end))
}

impl BlockDevice for VolatileDisk {
    fn path(&self) -> &str {
        self.medium.path()
    }

    fn size(&self) -> u64 {
        self.medium.size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        check_request(self.path(), "read", offset, buf.len(), self.size())?;
        let _on = self.supply.hold();
        let cache = self.cache.lock();
        self.medium.read_at(buf, offset)?;
        for (at, data) in &cache.writes {
            if let Some((s, e)) = overlap(offset, buf.len(), *at, data.len()) {
                buf[(s - offset) as usize..(e - offset) as usize]
                    .copy_from_slice(&data[(s - at) as usize..(e - at) as usize]);
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        check_request(self.path(), "write", offset, buf.len(), self.size())?;
        self.supply.count_op();
        let _on = self.supply.hold();
        let mut cache = self.cache.lock();
        cache.writes.push((offset, buf.to_vec()));
        cache.bytes += buf.len();
        self.destage(&mut cache)
    }

    fn flush(&self) -> Result<(), DiskError> {
        self.supply.count_op();
        let _on = self.supply.hold();
        let mut cache = self.cache.lock();
        for (offset, data) in &cache.writes {
            self.medium.write_at(data, *offset)?;
        }
        cache.writes.clear();
        cache.bytes = 0;
        drop(cache);
        self.medium.flush()
    }
}

impl std::fmt::Debug for VolatileDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolatileDisk").field("path", &self.path()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;

    const MIB: u64 = 1 << 20;
    const S: u64 = SECTOR as u64;

    fn setup(n: usize) -> (Arc<PowerSupply>, Vec<Arc<VolatileDisk>>) {
        let supply = PowerSupply::new();
        let disks = (0..n)
            .map(|i| VolatileDisk::new(Arc::new(MemDisk::new(&format!("mem{i}"), 4 * MIB)), &supply))
            .collect();
        (supply, disks)
    }

    fn read(d: &dyn BlockDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        d.read_at(&mut b, offset).unwrap();
        b
    }

    #[test]
    fn reads_see_cached_writes_and_the_medium_only_flushed_ones() {
        let (_supply, d) = setup(1);
        let d = &d[0];
        d.write_at(&vec![1; 4 * SECTOR], 0).unwrap();
        d.flush().unwrap();
        d.write_at(&vec![2; SECTOR], S).unwrap();
        d.write_at(&vec![3; 2 * SECTOR], 2 * S).unwrap();
        let got = read(&**d, 0, 4 * SECTOR);
        assert_eq!(got[..SECTOR], [1; SECTOR]);
        assert_eq!(got[SECTOR..2 * SECTOR], [2; SECTOR]);
        assert_eq!(got[2 * SECTOR..], [3; 2 * SECTOR]);
        assert_eq!(read(&**d.medium(), 0, 4 * SECTOR), vec![1; 4 * SECTOR]);
        assert_eq!(d.cached_bytes(), 3 * SECTOR);
        d.flush().unwrap();
        assert_eq!(read(&**d.medium(), 0, 4 * SECTOR), got);
        assert_eq!(d.cached_bytes(), 0);
    }

    #[test]
    fn a_cut_leaves_each_sector_flushed_or_one_of_its_later_values() {
        let mut outcomes = std::collections::HashSet::new();
        let mut torn_seen = false;
        for seed in 0..200 {
            let (supply, d) = setup(2);
            for disk in &d {
                disk.write_at(&vec![9; 2 * SECTOR], 0).unwrap();
                disk.flush().unwrap();
                disk.write_at(&vec![1; 2 * SECTOR], 0).unwrap();
                disk.write_at(&vec![2; SECTOR], 0).unwrap();
            }
            let reports = supply.cut(seed);
            assert_eq!(reports.len(), 2);
            for (disk, r) in d.iter().zip(&reports) {
                assert_eq!(r.kept + r.torn + r.dropped, 2);
                let got = read(&**disk.medium(), 0, 2 * SECTOR);
                let (a, b) = (got[0], got[SECTOR]);
                assert!(got[..SECTOR].iter().all(|&x| x == a) && got[SECTOR..].iter().all(|&x| x == b));
                assert!([9, 1, 2].contains(&a), "sector 0 holds {a}");
                assert!([9, 1].contains(&b), "sector 1 holds {b}");
                outcomes.insert((a, b));
                torn_seen |= r.torn == 1 && a != b;
            }
        }
        // Every combination a disk may leave shows up: old, new and torn.
        for want in [(9, 9), (1, 1), (2, 1), (2, 9), (1, 9), (9, 1)] {
            assert!(outcomes.contains(&want), "never saw {want:?} in {outcomes:?}");
        }
        assert!(torn_seen);
    }

    #[test]
    fn flushed_data_survives_every_cut() {
        for seed in 0..50 {
            let (supply, d) = setup(1);
            d[0].write_at(&vec![5; SECTOR], 3 * S).unwrap();
            d[0].flush().unwrap();
            d[0].write_at(&vec![6; SECTOR], 4 * S).unwrap();
            supply.cut(seed);
            assert_eq!(read(&**d[0].medium(), 3 * S, SECTOR), vec![5; SECTOR]);
        }
    }

    #[test]
    fn an_armed_cut_happens_before_the_counted_io_and_stops_the_ones_after() {
        let (supply, d) = setup(1);
        d[0].write_at(&vec![1; SECTOR], 0).unwrap();
        d[0].flush().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        supply.arm(2, 7, move |reports| tx.send(reports).unwrap());
        d[0].write_at(&vec![2; SECTOR], S).unwrap(); // op 1: cached
        let disk = d[0].clone();
        // Op 2 triggers the cut; the flush never takes effect, and the thread stays parked.
        std::thread::spawn(move || {
            let _ = disk.flush();
            unreachable!("I/O after a power cut returned");
        });
        let reports = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        assert_eq!(reports[0].kept + reports[0].torn + reports[0].dropped, 1);
        assert!(!supply.is_on());
        assert_eq!(read(&**d[0].medium(), 0, SECTOR), vec![1; SECTOR]);
    }

    #[test]
    fn a_full_cache_destages_its_oldest_writes() {
        let supply = PowerSupply::new();
        let d = [VolatileDisk::new(Arc::new(MemDisk::new("mem0", 64 * MIB)), &supply)];
        let big = vec![4u8; CACHE_BYTES / 2];
        d[0].write_at(&big, 0).unwrap();
        d[0].write_at(&big, 0).unwrap();
        assert_eq!(d[0].cached_bytes(), CACHE_BYTES);
        d[0].write_at(&vec![7; SECTOR], 0).unwrap();
        assert!(d[0].cached_bytes() <= CACHE_BYTES);
        supply.cut(1);
        assert_eq!(
            read(&**d[0].medium(), S, SECTOR),
            vec![4; SECTOR],
            "destaged writes are on the medium"
        );
    }
}
