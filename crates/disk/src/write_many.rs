//! Writes to several disks in flight together: the copies of a mirror piece, the columns and
//! parity of a parity row. Written one after the other, each waits for the one before; on one
//! io_uring submission the disks work on them at once.

use crate::uring::{self, WriteOp};
use crate::{BlockDevice, DiskError};

/// One write of a [`write_many`] batch: all of `buf` at `offset` of `disk`.
pub struct WriteReq<'a> {
    pub disk: &'a dyn BlockDevice,
    pub buf: &'a [u8],
    pub offset: u64,
}

/// Writes every request, as [`BlockDevice::write_at`] would, with one result per request in
/// order. Requests to disks with a [`uring_fd`](BlockDevice::uring_fd) go to the kernel in
/// one submission; the others (disks in memory, fault injection, buffers direct I/O cannot
/// use) and any write the ring left short or failed are done with `write_at`, which finishes
/// them or says why not.
pub fn write_many(reqs: &[WriteReq<'_>]) -> Vec<Result<(), DiskError>> {
    let mut on_ring = Vec::with_capacity(reqs.len());
    let mut ops = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        if let Some(fd) = uring::ring_fd(r.disk, "write", r.buf.as_ptr(), r.buf.len(), r.offset) {
            on_ring.push(i);
            ops.push(WriteOp {
                fd,
                buf: r.buf,
                offset: r.offset,
            });
        }
    }
    let mut done = vec![false; reqs.len()];
    // A lone write gains nothing from the ring.
    if ops.len() > 1 {
        let start = std::time::Instant::now();
        if let Some(results) = uring::write_batch(&ops) {
            // In flight together: each write took as long as the batch. A write the ring left
            // short or failed is counted by `write_at` below, which finishes it.
            let took = start.elapsed();
            for (&i, res) in on_ring.iter().zip(results) {
                done[i] = matches!(res, Ok(n) if n == reqs[i].buf.len());
                if let (true, Some(io)) = (done[i], reqs[i].disk.io()) {
                    io.record(crate::DiskOp::Write, reqs[i].buf.len() as u64, took, true);
                }
            }
        }
    }
    reqs.iter()
        .zip(done)
        .map(|(r, done)| if done { Ok(()) } else { r.disk.write_at(r.buf, r.offset) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AlignedBuf, FileDisk, MemDisk};

    const MIB: u64 = 1 << 20;

    fn pattern(len: usize, seed: u8) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(len);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
        b
    }

    #[test]
    fn writes_to_files_and_memory_together_land_where_asked() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<FileDisk> = (0..3)
            .map(|i| FileDisk::create_file(dir.path().join(format!("d{i}")), 8 * MIB, false).unwrap())
            .collect();
        let mem = MemDisk::new("mem", 8 * MIB);
        let bufs: Vec<AlignedBuf> = (0..5).map(|i| pattern(64 << 10, i as u8)).collect();
        let mut reqs: Vec<WriteReq> = files
            .iter()
            .enumerate()
            .map(|(i, f)| WriteReq {
                disk: f,
                buf: &bufs[i],
                offset: (i as u64 + 1) * MIB,
            })
            .collect();
        reqs.push(WriteReq {
            disk: &mem,
            buf: &bufs[3],
            offset: 4096,
        });
        // A buffer direct I/O cannot take goes through write_at's bounce.
        reqs.push(WriteReq {
            disk: &files[0],
            buf: &bufs[4][..],
            offset: 4 * MIB,
        });
        let unaligned = {
            let mut v = vec![0u8; 8192 + 1];
            v[1..].copy_from_slice(&pattern(8192, 9));
            v
        };
        reqs.push(WriteReq {
            disk: &files[1],
            buf: &unaligned[1..],
            offset: 6 * MIB,
        });
        for r in write_many(&reqs) {
            r.unwrap();
        }
        for r in &reqs {
            let mut back = AlignedBuf::zeroed(r.buf.len());
            r.disk.read_at(&mut back, r.offset).unwrap();
            assert!(back[..] == *r.buf, "{} at {}", r.disk.path(), r.offset);
        }
    }

    #[test]
    fn a_bad_request_fails_alone_with_the_disk_error() {
        let dir = tempfile::tempdir().unwrap();
        let a = FileDisk::create_file(dir.path().join("a"), 4 * MIB, false).unwrap();
        let b = FileDisk::create_file(dir.path().join("b"), 4 * MIB, false).unwrap();
        let buf = pattern(8192, 3);
        let reqs = [
            WriteReq {
                disk: &a,
                buf: &buf,
                offset: 0,
            },
            WriteReq {
                disk: &b,
                buf: &buf,
                offset: 4 * MIB - 4096,
            },
            WriteReq {
                disk: &b,
                buf: &buf[..100],
                offset: 0,
            },
            WriteReq {
                disk: &b,
                buf: &buf,
                offset: MIB,
            },
        ];
        let res = write_many(&reqs);
        assert!(res[0].is_ok() && res[3].is_ok());
        assert!(matches!(res[1], Err(DiskError::OutOfRange { .. })), "{:?}", res[1]);
        assert!(matches!(res[2], Err(DiskError::Unaligned { .. })), "{:?}", res[2]);
        let mut back = AlignedBuf::zeroed(8192);
        b.read_at(&mut back, MIB).unwrap();
        assert!(back[..] == buf[..]);
    }
}
