//! Reads from several disks in flight together: the columns of a parity row that a small
//! write must read to compute the row's new parity, each on its own member disk. Read one
//! after the other, each waits for the one before; on one io_uring submission the disks work
//! on them at once.

use crate::uring::{self, SpreadOp};
use crate::{BlockDevice, DiskError};

/// One read of a [`read_spread`] batch: `buf.len()` bytes at `offset` of `disk`.
pub struct SpreadRead<'a> {
    pub disk: &'a dyn BlockDevice,
    pub buf: &'a mut [u8],
    pub offset: u64,
}

/// Reads every request, as [`BlockDevice::read_at`] would, with one result per request in
/// order. Requests to disks with a [`uring_fd`](BlockDevice::uring_fd) go to the kernel in one
/// submission; the others (disks in memory, fault injection, buffers direct I/O cannot use)
/// and any read the ring left short or failed are done with `read_at`, which finishes them or
/// says why not.
pub fn read_spread(reqs: &mut [SpreadRead<'_>]) -> Vec<Result<(), DiskError>> {
    let mut done = vec![false; reqs.len()];
    // Per read on the ring: its request, length and where its disk counts it.
    let mut on_ring = Vec::with_capacity(reqs.len());
    let mut ops = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter_mut().enumerate() {
        if let Some(fd) = uring::ring_fd(r.disk, "read", r.buf.as_ptr(), r.buf.len(), r.offset) {
            on_ring.push((i, r.buf.len(), r.disk.io().cloned()));
            ops.push(SpreadOp {
                fd,
                buf: &mut *r.buf,
                offset: r.offset,
            });
        }
    }
    // A lone read gains nothing from the ring.
    if ops.len() > 1 {
        let start = std::time::Instant::now();
        if let Some(results) = uring::read_spread_batch(&mut ops) {
            // In flight together: each read took as long as the batch. A read the ring left
            // short or failed is counted by `read_at` below, which finishes it.
            let took = start.elapsed();
            for ((i, len, io), res) in on_ring.iter().zip(results) {
                done[*i] = matches!(res, Ok(n) if n == *len);
                if let (true, Some(io)) = (done[*i], io) {
                    io.record(crate::DiskOp::Read, *len as u64, took, true);
                }
            }
        }
    }
    reqs.iter_mut()
        .zip(done)
        .map(|(r, done)| if done { Ok(()) } else { r.disk.read_at(r.buf, r.offset) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AlignedBuf, FaultOp, FaultyDisk, FileDisk, MemDisk};
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;

    fn pattern(len: usize, seed: u8) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(len);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
        b
    }

    #[test]
    fn reads_from_files_and_memory_together_return_what_each_holds() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<FileDisk> = (0..3)
            .map(|i| FileDisk::create_file(dir.path().join(format!("d{i}")), 8 * MIB, false).unwrap())
            .collect();
        let mem = MemDisk::new("mem", 8 * MIB);
        let want: Vec<AlignedBuf> = (0..4).map(|i| pattern(64 << 10, i as u8 + 1)).collect();
        for (i, f) in files.iter().enumerate() {
            f.write_at(&want[i], (i as u64 + 1) * MIB).unwrap();
        }
        mem.write_at(&want[3], 2 * MIB).unwrap();
        let mut got: Vec<AlignedBuf> = (0..4).map(|_| AlignedBuf::zeroed(64 << 10)).collect();
        let mut it = got.iter_mut();
        let mut reqs: Vec<SpreadRead> = files
            .iter()
            .enumerate()
            .map(|(i, f)| SpreadRead {
                disk: f,
                buf: it.next().unwrap(),
                offset: (i as u64 + 1) * MIB,
            })
            .collect();
        reqs.push(SpreadRead {
            disk: &mem,
            buf: it.next().unwrap(),
            offset: 2 * MIB,
        });
        let results = read_spread(&mut reqs);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(&g[..], &w[..]);
        }
    }

    #[test]
    fn a_failing_or_out_of_range_read_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let a = FileDisk::create_file(dir.path().join("a"), 8 * MIB, false).unwrap();
        let b = FileDisk::create_file(dir.path().join("b"), 8 * MIB, false).unwrap();
        let want = pattern(4096, 7);
        a.write_at(&want, 0).unwrap();
        let bad = FaultyDisk::new(Arc::new(MemDisk::new("bad", 8 * MIB)));
        bad.faults().fail_range(0, 8 * MIB, FaultOp::Read);
        let (mut g1, mut g2, mut g3, mut g4) = (
            AlignedBuf::zeroed(4096),
            AlignedBuf::zeroed(4096),
            AlignedBuf::zeroed(4096),
            AlignedBuf::zeroed(4096),
        );
        let mut reqs = vec![
            SpreadRead {
                disk: &a,
                buf: &mut g1,
                offset: 0,
            },
            SpreadRead {
                disk: &*bad,
                buf: &mut g2,
                offset: 0,
            },
            SpreadRead {
                disk: &b,
                buf: &mut g3,
                offset: 8 * MIB,
            },
            SpreadRead {
                disk: &b,
                buf: &mut g4,
                offset: 4096,
            },
        ];
        let results = read_spread(&mut reqs);
        assert!(results[0].is_ok());
        assert!(results[1].is_err(), "the faulty disk's read fails");
        assert!(results[2].is_err(), "a read past the end fails");
        assert!(results[3].is_ok());
        assert_eq!(&g1[..], &want[..]);
    }
}
