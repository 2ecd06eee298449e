//! An in-memory disk for fast tests. Storage is sparse: only chunks that were written hold
//! memory, so a test can use a disk of hundreds of MiB cheaply.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::{check_request, round_down_to_sector, BlockDevice, DiskError};

const CHUNK: usize = 64 * 1024;

pub struct MemDisk {
    path: String,
    size: u64,
    chunks: RwLock<HashMap<u64, Box<[u8]>>>,
    flushes: AtomicU64,
}

impl MemDisk {
    /// A zero-filled disk of `size` bytes (rounded down to whole sectors), named `path_label`
    /// in messages.
    pub fn new(path_label: &str, size: u64) -> MemDisk {
        MemDisk {
            path: path_label.to_string(),
            size: round_down_to_sector(size),
            chunks: RwLock::new(HashMap::new()),
            flushes: AtomicU64::new(0),
        }
    }

    /// How many times [`BlockDevice::flush`] was called.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// A copy of the current contents, as a disk would look after power loss at this instant.
    /// The copy has the same path and size and a flush count of zero.
    pub fn snapshot(&self) -> MemDisk {
        MemDisk {
            path: self.path.clone(),
            size: self.size,
            chunks: RwLock::new(self.chunks.read().clone()),
            flushes: AtomicU64::new(0),
        }
    }

    /// Bytes of memory held by written chunks.
    pub fn allocated_bytes(&self) -> u64 {
        (self.chunks.read().len() * CHUNK) as u64
    }

    /// Splits `[offset, offset + len)` into per-chunk pieces: (chunk index, offset within the
    /// chunk, offset within the caller's buffer, length).
    fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
        crate::unit_pieces(CHUNK as u64, offset, len as u64).map(|p| (p.unit, p.off as usize, p.buf_off, p.len))
    }
}

impl BlockDevice for MemDisk {
    fn path(&self) -> &str {
        &self.path
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        check_request(&self.path, "read", offset, buf.len(), self.size)?;
        let chunks = self.chunks.read();
        for (idx, within, at, n) in Self::pieces(offset, buf.len()) {
            let dst = &mut buf[at..at + n];
            match chunks.get(&idx) {
                Some(c) => dst.copy_from_slice(&c[within..within + n]),
                None => dst.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        check_request(&self.path, "write", offset, buf.len(), self.size)?;
        let mut chunks = self.chunks.write();
        for (idx, within, at, n) in Self::pieces(offset, buf.len()) {
            let c = chunks.entry(idx).or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice());
            c[within..within + n].copy_from_slice(&buf[at..at + n]);
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), DiskError> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl std::fmt::Debug for MemDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemDisk")
            .field("path", &self.path)
            .field("size", &self.size)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SECTOR;

    const MIB: u64 = 1 << 20;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn unwritten_space_reads_as_zero() {
        let d = MemDisk::new("mem0", 256 * MIB);
        assert_eq!(d.size(), 256 * MIB);
        let mut buf = vec![0xEEu8; 2 * SECTOR];
        d.read_at(&mut buf, 100 * MIB).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(d.allocated_bytes(), 0);
    }

    #[test]
    fn round_trip_across_chunk_boundaries() {
        let d = MemDisk::new("mem0", 16 * MIB);
        // Starts one sector before a chunk boundary and spans several chunks.
        let off = CHUNK as u64 - SECTOR as u64;
        let data = pattern(3 * CHUNK, 5);
        d.write_at(&data, off).unwrap();
        let mut back = vec![0u8; data.len()];
        d.read_at(&mut back, off).unwrap();
        assert_eq!(back, data);
        // Neighbours are untouched.
        let mut before = vec![1u8; SECTOR];
        d.read_at(&mut before, off - SECTOR as u64).unwrap();
        assert!(before.iter().all(|&b| b == 0));
        assert_eq!(d.allocated_bytes(), 4 * CHUNK as u64);
    }

    #[test]
    fn overwrite_replaces_only_the_written_sectors() {
        let d = MemDisk::new("mem0", 4 * MIB);
        d.write_at(&vec![1u8; 4 * SECTOR], 0).unwrap();
        d.write_at(&vec![2u8; SECTOR], SECTOR as u64).unwrap();
        let mut back = vec![0u8; 4 * SECTOR];
        d.read_at(&mut back, 0).unwrap();
        assert!(back[..SECTOR].iter().all(|&b| b == 1));
        assert!(back[SECTOR..2 * SECTOR].iter().all(|&b| b == 2));
        assert!(back[2 * SECTOR..].iter().all(|&b| b == 1));
    }

    #[test]
    fn validates_requests() {
        let d = MemDisk::new("mem0", 4 * MIB);
        let mut buf = vec![0u8; SECTOR];
        assert!(matches!(d.read_at(&mut buf, 512), Err(DiskError::Unaligned { .. })));
        assert!(matches!(d.write_at(&buf[..100], 0), Err(DiskError::Unaligned { .. })));
        assert!(matches!(d.write_at(&[], 0), Err(DiskError::Unaligned { len: 0, .. })));
        assert!(matches!(
            d.read_at(&mut buf, 4 * MIB),
            Err(DiskError::OutOfRange { .. })
        ));
        assert!(matches!(d.write_at(&buf, 4 * MIB), Err(DiskError::OutOfRange { .. })));
        assert_eq!(d.allocated_bytes(), 0, "rejected writes must not allocate");
    }

    #[test]
    fn size_is_rounded_down_to_sectors() {
        let d = MemDisk::new("odd", 3 * SECTOR as u64 + 100);
        assert_eq!(d.size(), 3 * SECTOR as u64);
    }

    #[test]
    fn flush_counts() {
        let d = MemDisk::new("mem0", MIB);
        assert_eq!(d.flush_count(), 0);
        d.flush().unwrap();
        d.flush().unwrap();
        assert_eq!(d.flush_count(), 2);
    }

    #[test]
    fn snapshot_is_an_independent_copy() {
        let d = MemDisk::new("mem0", 4 * MIB);
        d.write_at(&vec![7u8; SECTOR], 0).unwrap();
        let snap = d.snapshot();
        d.write_at(&vec![8u8; SECTOR], 0).unwrap();
        d.write_at(&vec![9u8; SECTOR], MIB).unwrap();

        let mut buf = vec![0u8; SECTOR];
        snap.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 7));
        snap.read_at(&mut buf, MIB).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!((snap.path(), snap.size()), ("mem0", 4 * MIB));

        snap.write_at(&vec![1u8; SECTOR], 0).unwrap();
        d.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 8));
    }

    #[test]
    fn concurrent_writers_to_distinct_sectors() {
        let d = std::sync::Arc::new(MemDisk::new("mem0", 16 * MIB));
        let handles: Vec<_> = (0..4u8)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for i in 0..64u64 {
                        let off = (i * 4 + t as u64) * SECTOR as u64;
                        d.write_at(&vec![t + 1; SECTOR], off).unwrap();
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        let mut buf = vec![0u8; SECTOR];
        for s in 0..256u64 {
            d.read_at(&mut buf, s * SECTOR as u64).unwrap();
            assert!(buf.iter().all(|&b| b == (s % 4) as u8 + 1), "sector {s}");
        }
    }
}
