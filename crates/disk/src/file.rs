//! Disks backed by a regular file or a block device, using direct I/O where the
//! filesystem allows it so that acknowledged writes do not linger in the page cache.

use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::warn;

use crate::uring::{self, Op};
use crate::{check_request, round_down_to_sector, AlignedBuf, BlockDevice, DiskError, ReadReq, DATA_OFFSET, SECTOR};

/// A disk must be larger than this: the reserved header area plus at least 1 MiB of data.
const MIN_SIZE_EXCLUSIVE: u64 = DATA_OFFSET + (1 << 20);
/// Unaligned caller buffers are copied through a bounce buffer of at most this size.
const BOUNCE_CHUNK: usize = 1 << 20;
/// A regular file is reserved (fallocate) in pieces of this size, the first time a write
/// reaches each: small enough that a thin pool's files grow about as their data does.
const RESERVE_CHUNK: u64 = 8 << 20;
/// `_IOR(0x12, 114, u64)`: size of a block device in bytes.
const BLKGETSIZE64: u64 = 0x8008_1272;
/// `_IO(0x12, 104)`: logical sector size of a block device.
const BLKSSZGET: u64 = 0x1268;

pub struct FileDisk {
    path: String,
    file: File,
    size: u64,
    direct: bool,
    block_device: bool,
    /// One bit per [`RESERVE_CHUNK`] of a regular file: reserved since the disk was opened.
    /// (After a restart the first reservation of each chunk asks the file system again,
    /// which costs little where it is allocated already.)
    reserved: Vec<AtomicU64>,
}

impl FileDisk {
    /// Opens an existing regular file or block device read-write with O_DIRECT, falling
    /// back to buffered I/O if the filesystem refuses O_DIRECT.
    pub fn open(path: impl AsRef<Path>) -> Result<FileDisk, DiskError> {
        let path = path.as_ref();
        Self::open_with(path, &path.display().to_string(), open_rw)
    }

    /// Opens the file or device that `open` reaches (a `/proc/self/fd/N` link to one found
    /// and checked before, say) as [`open`](Self::open) does, known by `name` (the name the
    /// caller gave, which a pool records).
    pub fn open_as(open: &Path, name: &str) -> Result<FileDisk, DiskError> {
        Self::open_with(open, name, open_rw)
    }

    /// Creates a new file of `size` bytes and opens it like [`open`](Self::open). Fails if
    /// the path exists: an existing file is never truncated. With `preallocate` the space is
    /// reserved up front (fallocate); otherwise the file is sparse.
    pub fn create_file(path: impl AsRef<Path>, size: u64, preallocate: bool) -> Result<FileDisk, DiskError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        check_min_size(&name, round_down_to_sector(size))?;
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| DiskError::Open {
                path: name.clone(),
                source,
            })?;
        // From here on the file is ours: remove it again if it cannot be made usable.
        let made = size_new_file(&name, &file, size, preallocate).and_then(|()| {
            drop(file);
            FileDisk::open(path)
        });
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    /// Whether I/O bypasses the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether the disk is a block device rather than a regular file.
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// The open path, with `opener(path, direct)` producing the file so that tests can
    /// simulate a filesystem that refuses O_DIRECT.
    fn open_with(
        path: &Path,
        name: &str,
        opener: impl Fn(&Path, bool) -> io::Result<File>,
    ) -> Result<FileDisk, DiskError> {
        let name = name.to_string();
        // Classify before opening: opening a directory or a character device read-write
        // fails oddly or has side effects.
        let meta = std::fs::metadata(path).map_err(|source| DiskError::Open {
            path: name.clone(),
            source,
        })?;
        kind_of(&name, meta.file_type())?;

        let (file, direct) = open_with_fallback(&name, |direct| opener(path, direct))?;

        // Classify again on the descriptor, in case the path changed in between.
        let meta = file.metadata().map_err(|source| DiskError::Open {
            path: name.clone(),
            source,
        })?;
        let block_device = kind_of(&name, meta.file_type())?;
        let raw_size = if block_device {
            let logical = logical_sector_size(&file).map_err(|source| DiskError::Open {
                path: name.clone(),
                source,
            })?;
            if logical as usize > SECTOR {
                return Err(DiskError::Unusable {
                    path: name,
                    reason: format!("logical sector size {logical} is larger than the {SECTOR}-byte I/O unit"),
                });
            }
            block_device_size(&file).map_err(|source| DiskError::Open {
                path: name.clone(),
                source,
            })?
        } else {
            meta.len()
        };
        let size = round_down_to_sector(raw_size);
        check_min_size(&name, size)?;
        let chunks = if block_device { 0 } else { size.div_ceil(RESERVE_CHUNK) };
        Ok(FileDisk {
            path: name,
            file,
            size,
            direct,
            block_device,
            reserved: (0..chunks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn io_error(&self, op: &'static str, offset: u64, len: usize) -> impl FnOnce(io::Error) -> DiskError + '_ {
        move |source| DiskError::Io {
            path: self.path.clone(),
            op,
            offset,
            len,
            source,
        }
    }

    fn needs_bounce(&self, ptr: *const u8) -> bool {
        self.direct && !(ptr as usize).is_multiple_of(SECTOR)
    }
}

impl BlockDevice for FileDisk {
    fn path(&self) -> &str {
        &self.path
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        let len = buf.len();
        check_request(&self.path, "read", offset, len, self.size)?;
        if !self.needs_bounce(buf.as_ptr()) {
            return self
                .file
                .read_exact_at(buf, offset)
                .map_err(self.io_error("read", offset, len));
        }
        let mut bounce = AlignedBuf::zeroed(len.min(BOUNCE_CHUNK));
        let mut pos = offset;
        for piece in buf.chunks_mut(BOUNCE_CHUNK) {
            let b = &mut bounce[..piece.len()];
            self.file
                .read_exact_at(b, pos)
                .map_err(self.io_error("read", offset, len))?;
            piece.copy_from_slice(b);
            pos += piece.len() as u64;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        let len = buf.len();
        check_request(&self.path, "write", offset, len, self.size)?;
        if !self.needs_bounce(buf.as_ptr()) {
            return self
                .file
                .write_all_at(buf, offset)
                .map_err(self.io_error("write", offset, len));
        }
        let mut bounce = AlignedBuf::zeroed(len.min(BOUNCE_CHUNK));
        let mut pos = offset;
        for piece in buf.chunks(BOUNCE_CHUNK) {
            let b = &mut bounce[..piece.len()];
            b.copy_from_slice(piece);
            self.file
                .write_all_at(b, pos)
                .map_err(self.io_error("write", offset, len))?;
            pos += piece.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), DiskError> {
        self.file.sync_data().map_err(self.io_error("flush", 0, 0))
    }

    fn reserve(&self, offset: u64, len: u64) -> Result<(), DiskError> {
        if self.block_device || len == 0 {
            return Ok(());
        }
        let end = offset.saturating_add(len).min(self.size);
        for chunk in offset / RESERVE_CHUNK..end.div_ceil(RESERVE_CHUNK) {
            let (word, bit) = (&self.reserved[(chunk / 64) as usize], 1u64 << (chunk % 64));
            if word.load(Ordering::Acquire) & bit != 0 {
                continue;
            }
            let start = chunk * RESERVE_CHUNK;
            let n = RESERVE_CHUNK.min(self.size - start);
            loop {
                // SAFETY: plain syscall on a descriptor we own; mode 0 allocates the range
                // and leaves the file's size (which covers it) as it is.
                let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, start as libc::off_t, n as libc::off_t) };
                if rc == 0 {
                    break;
                }
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // A file system that cannot allocate ahead (or a copy-on-write one that
                    // would not keep it): nothing to reserve, writes take their chances.
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) => break,
                    _ => return Err(self.io_error("reserve", start, n as usize)(err)),
                }
            }
            word.fetch_or(bit, Ordering::AcqRel);
        }
        Ok(())
    }

    fn uring_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.file.as_raw_fd())
    }

    /// The whole batch in one io_uring submission, then whatever came back short read with
    /// pread. Buffers that direct I/O cannot use are read into aligned ones and copied.
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> Vec<Result<(), DiskError>> {
        let mut results: Vec<Result<(), DiskError>> = reqs
            .iter()
            .map(|r| check_request(&self.path, "read", r.offset, r.buf.len(), self.size))
            .collect();
        let mut bounces: Vec<Option<AlignedBuf>> = reqs
            .iter()
            .map(|r| {
                self.needs_bounce(r.buf.as_ptr())
                    .then(|| AlignedBuf::zeroed(r.buf.len()))
            })
            .collect();
        let mut which = Vec::with_capacity(reqs.len());
        let mut ops = Vec::with_capacity(reqs.len());
        for (i, (r, b)) in reqs.iter_mut().zip(bounces.iter_mut()).enumerate() {
            if results[i].is_ok() {
                let buf: &mut [u8] = match b {
                    Some(b) => b,
                    None => r.buf,
                };
                which.push(i);
                ops.push(Op { buf, offset: r.offset });
            }
        }
        let Some(done) = uring::read_batch(self.file.as_raw_fd(), &mut ops) else {
            drop(ops);
            for i in which {
                results[i] = self.read_at(reqs[i].buf, reqs[i].offset);
            }
            return results;
        };
        for ((op, res), &i) in ops.iter_mut().zip(done).zip(&which) {
            let (offset, len) = (op.offset, op.buf.len());
            results[i] = match res {
                Ok(n) if n == len => Ok(()),
                // Short (a signal, or the end of the file): pread finishes it, or says why not.
                Ok(n) => self
                    .file
                    .read_exact_at(&mut op.buf[n..], offset + n as u64)
                    .map_err(self.io_error("read", offset, len)),
                Err(e) => Err(self.io_error("read", offset, len)(e)),
            };
        }
        drop(ops);
        for (r, b) in reqs.iter_mut().zip(bounces) {
            if let Some(b) = b {
                r.buf.copy_from_slice(&b);
            }
        }
        results
    }
}

/// The open file, for callers that check where it really is (the name the kernel keeps for it).
impl std::os::fd::AsFd for FileDisk {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl std::fmt::Debug for FileDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDisk")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("direct", &self.direct)
            .field("block_device", &self.block_device)
            .finish()
    }
}

fn open_rw(path: &Path, direct: bool) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    opts.open(path)
}

/// Opens with O_DIRECT; if the filesystem refuses it (EINVAL), opens buffered instead.
fn open_with_fallback(name: &str, opener: impl Fn(bool) -> io::Result<File>) -> Result<(File, bool), DiskError> {
    let open_err = |source| DiskError::Open {
        path: name.to_string(),
        source,
    };
    match opener(true) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            warn!(
                path = name,
                "direct I/O is unavailable on this file (the filesystem refuses O_DIRECT); \
                 writes go through the page cache, flush still makes them durable"
            );
            opener(false).map(|f| (f, false)).map_err(open_err)
        }
        Err(e) => Err(open_err(e)),
    }
}

/// Ok(true) for a block device, Ok(false) for a regular file, Unusable otherwise.
fn kind_of(name: &str, ft: FileType) -> Result<bool, DiskError> {
    let what = if ft.is_file() {
        return Ok(false);
    } else if ft.is_block_device() {
        return Ok(true);
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "of an unknown file type"
    };
    Err(DiskError::Unusable {
        path: name.to_string(),
        reason: format!("is {what}, not a regular file or block device"),
    })
}

fn check_min_size(name: &str, size: u64) -> Result<(), DiskError> {
    if size > MIN_SIZE_EXCLUSIVE {
        return Ok(());
    }
    Err(DiskError::Unusable {
        path: name.to_string(),
        reason: format!(
            "too small: {size} bytes, but a disk needs more than {MIN_SIZE_EXCLUSIVE} bytes \
             ({DATA_OFFSET} reserved for the label and header plus at least 1 MiB of data)"
        ),
    })
}

fn size_new_file(name: &str, file: &File, size: u64, preallocate: bool) -> Result<(), DiskError> {
    let io_err = |op, source| DiskError::Io {
        path: name.to_string(),
        op,
        offset: 0,
        len: size as usize,
        source,
    };
    if preallocate {
        let len = libc::off_t::try_from(size).map_err(|_| DiskError::Unusable {
            path: name.to_string(),
            reason: format!("size {size} is too large for this platform"),
        })?;
        // SAFETY: plain syscall on a descriptor we own.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        if rc != 0 {
            return Err(io_err("preallocate", io::Error::from_raw_os_error(rc)));
        }
    } else {
        file.set_len(size).map_err(|e| io_err("set length", e))?;
    }
    // Make the new file and its directory entry durable before anyone labels it.
    file.sync_all().map_err(|e| io_err("sync", e))?;
    let path = Path::new(name);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("sync directory", e))
}

fn block_device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

fn logical_sector_size(file: &File) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET as _, &mut size as *mut libc::c_int) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::os::unix::fs::MetadataExt;

    const MIB: u64 = 1 << 20;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| ((i / 7) as u8).wrapping_add(seed)).collect()
    }

    /// Whether the filesystem under `path` accepts O_DIRECT, probed independently.
    fn accepts_direct(path: &Path) -> bool {
        open_rw(path, true).is_ok()
    }

    #[test]
    fn reserving_allocates_a_sparse_file_s_blocks_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse.img");
        let d = FileDisk::create_file(&path, 64 * MIB, false).unwrap();
        let blocks = || std::fs::metadata(&path).unwrap().blocks() * 512;
        let before = blocks();
        // One sector at 20 MiB reserves the chunk around it, and only that.
        d.reserve(20 * MIB, SECTOR as u64).unwrap();
        let after = blocks();
        assert!(
            after >= before + RESERVE_CHUNK && after < before + 2 * RESERVE_CHUNK,
            "{before} -> {after} bytes allocated"
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            64 * MIB,
            "the size is unchanged"
        );
        // Reserved already: asked again, nothing more is allocated.
        d.reserve(16 * MIB, RESERVE_CHUNK).unwrap();
        assert_eq!(blocks(), after);
        // Up to the end of the file, not past it.
        d.reserve(63 * MIB, 8 * MIB).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 * MIB);
        d.reserve(0, 0).unwrap();
    }

    #[test]
    fn create_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0.img");
        let d = FileDisk::create_file(&path, 8 * MIB, false).unwrap();
        assert_eq!(d.size(), 8 * MIB);
        assert_eq!(d.path(), path.display().to_string());
        assert!(!d.is_block_device());
        assert_eq!(d.is_direct(), accepts_direct(&path));

        let mut data = AlignedBuf::zeroed(3 * SECTOR);
        data.copy_from_slice(&pattern(3 * SECTOR, 1));
        d.write_at(&data, DATA_OFFSET).unwrap();
        d.write_at(&AlignedBuf::from_slice(&[0x5A; SECTOR]), 8 * MIB - SECTOR as u64)
            .unwrap();
        d.flush().unwrap();
        drop(d);

        let d = FileDisk::open(&path).unwrap();
        let mut back = AlignedBuf::zeroed(3 * SECTOR);
        d.read_at(&mut back, DATA_OFFSET).unwrap();
        assert_eq!(back, data);
        let mut last = AlignedBuf::zeroed(SECTOR);
        d.read_at(&mut last, 8 * MIB - SECTOR as u64).unwrap();
        assert!(last.iter().all(|&b| b == 0x5A));
        let mut hole = AlignedBuf::zeroed(SECTOR);
        d.read_at(&mut hole, 4 * MIB).unwrap();
        assert!(hole.iter().all(|&b| b == 0));
    }

    #[test]
    fn ext4_tmp_uses_direct_io() {
        // The development and CI machines keep /tmp on a disk filesystem, which accepts O_DIRECT.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.img");
        let d = FileDisk::create_file(&path, 4 * MIB, false).unwrap();
        if !accepts_direct(&path) {
            eprintln!("skipping: {} refuses O_DIRECT", dir.path().display());
            return;
        }
        assert!(d.is_direct());
    }

    #[test]
    fn unaligned_buffer_pointer_is_bounced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0.img");
        let d = FileDisk::create_file(&path, 8 * MIB, false).unwrap();
        // Larger than one bounce chunk, so the chunking is exercised too.
        let len = 2 * BOUNCE_CHUNK + SECTOR;
        let mut backing = vec![0u8; len + 1];
        let ptr_off = if (backing.as_ptr() as usize).is_multiple_of(SECTOR) {
            1
        } else {
            0
        };
        let src = &mut backing[ptr_off..ptr_off + len];
        src.copy_from_slice(&pattern(len, 9));
        assert_ne!(src.as_ptr() as usize % SECTOR, 0);
        d.write_at(src, DATA_OFFSET).unwrap();

        let mut out_backing = vec![0u8; len + 1];
        let optr = if (out_backing.as_ptr() as usize).is_multiple_of(SECTOR) {
            1
        } else {
            0
        };
        let out = &mut out_backing[optr..optr + len];
        d.read_at(out, DATA_OFFSET).unwrap();
        assert_eq!(out, &pattern(len, 9)[..]);

        // And an aligned read sees the same bytes, so the bounce wrote to the right place.
        let mut aligned = AlignedBuf::zeroed(SECTOR);
        d.read_at(&mut aligned, DATA_OFFSET + 2 * BOUNCE_CHUNK as u64).unwrap();
        assert_eq!(&aligned[..], &pattern(len, 9)[2 * BOUNCE_CHUNK..]);
    }

    #[test]
    fn neighbouring_reads_are_merged_and_land_in_their_own_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0.img");
        let d = FileDisk::create_file(&path, 8 * MIB, false).unwrap();
        let data = AlignedBuf::from_slice(&pattern(6 * MIB as usize, 5));
        d.write_at(&data, DATA_OFFSET).unwrap();
        // Neighbours on the disk as a sequential read's grains come: of mixed sizes, some
        // bounced, more than one merged read may cover, and a gap that starts a new run.
        let lens: Vec<usize> = (0..40).map(|i| if i % 7 == 3 { 4096 } else { 64 << 10 }).collect();
        let mut aligned: Vec<AlignedBuf> = lens.iter().map(|&n| AlignedBuf::zeroed(n)).collect();
        let mut plain: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0u8; n + 1]).collect();
        let mut reqs: Vec<ReadReq> = Vec::new();
        let mut offset = DATA_OFFSET;
        for (i, (a, p)) in aligned.iter_mut().zip(plain.iter_mut()).enumerate() {
            let buf: &mut [u8] = if i % 5 == 2 {
                let skew = usize::from((p.as_ptr() as usize).is_multiple_of(SECTOR));
                &mut p[skew..skew + lens[i]]
            } else {
                a
            };
            if i == 30 {
                offset += 4096; // a gap: a new run
            }
            reqs.push(ReadReq { buf, offset });
            offset += lens[i] as u64;
        }
        let results = d.read_many(&mut reqs);
        for (i, (r, res)) in reqs.iter().zip(&results).enumerate() {
            assert!(res.is_ok(), "{i}: {res:?}");
            let at = (r.offset - DATA_OFFSET) as usize;
            assert_eq!(&r.buf[..], &data[at..at + r.buf.len()], "request {i}");
        }
    }

    #[test]
    fn read_many_matches_read_at_and_fails_only_bad_requests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0.img");
        let d = FileDisk::create_file(&path, 8 * MIB, false).unwrap();
        let data = AlignedBuf::from_slice(&pattern(6 * MIB as usize, 3));
        d.write_at(&data, DATA_OFFSET).unwrap();
        // More requests than one ring holds, of several sizes, some into unaligned buffers,
        // and among them an unaligned, an empty and an out-of-range request.
        let n = 150;
        let len_of = |i: usize| SECTOR * (1 + i % 5);
        let off_of = |i: usize| DATA_OFFSET + ((i * 7919) % 1000) as u64 * SECTOR as u64;
        let mut aligned: Vec<AlignedBuf> = (0..n).map(|i| AlignedBuf::zeroed(len_of(i))).collect();
        let mut plain: Vec<Vec<u8>> = (0..n).map(|i| vec![0u8; len_of(i) + 1]).collect();
        let mut reqs: Vec<ReadReq> = Vec::new();
        for (i, (a, p)) in aligned.iter_mut().zip(plain.iter_mut()).enumerate() {
            let buf: &mut [u8] = if i % 3 == 0 {
                let skew = if (p.as_ptr() as usize).is_multiple_of(SECTOR) {
                    1
                } else {
                    0
                };
                &mut p[skew..skew + len_of(i)]
            } else {
                a
            };
            let offset = match i {
                10 => off_of(i) + 512,
                20 => 8 * MIB,
                _ => off_of(i),
            };
            reqs.push(ReadReq { buf, offset });
        }
        let mut empty = [0u8; 0];
        reqs.push(ReadReq {
            buf: &mut empty,
            offset: 0,
        });
        let results = d.read_many(&mut reqs);
        assert_eq!(results.len(), n + 1);
        for (i, (r, res)) in reqs.iter().zip(&results).enumerate() {
            match i {
                10 | 150 => assert!(
                    matches!(res, Err(DiskError::Unaligned { op: "read", .. })),
                    "{i}: {res:?}"
                ),
                20 => assert!(matches!(res, Err(DiskError::OutOfRange { .. })), "{i}: {res:?}"),
                _ => {
                    assert!(res.is_ok(), "{i}: {res:?}");
                    let at = (r.offset - DATA_OFFSET) as usize;
                    assert_eq!(&r.buf[..], &data[at..at + r.buf.len()], "request {i}");
                }
            }
        }
    }

    #[test]
    fn validates_requests_before_io() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0.img");
        let d = FileDisk::create_file(&path, 4 * MIB, false).unwrap();
        let mut buf = AlignedBuf::zeroed(SECTOR);
        assert!(matches!(
            d.read_at(&mut buf, 100),
            Err(DiskError::Unaligned { op: "read", .. })
        ));
        assert!(matches!(
            d.write_at(&buf[..512], 0),
            Err(DiskError::Unaligned { op: "write", .. })
        ));
        assert!(matches!(d.write_at(&[], 0), Err(DiskError::Unaligned { len: 0, .. })));
        assert!(matches!(d.read_at(&mut buf, 4 * MIB), Err(DiskError::OutOfRange { size, .. }) if size == 4 * MIB));
        assert!(matches!(d.write_at(&buf, 4 * MIB), Err(DiskError::OutOfRange { .. })));
        // Nothing was written past the end.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * MIB);
    }

    #[test]
    fn create_file_refuses_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("taken.img");
        std::fs::write(&path, b"precious").unwrap();
        match FileDisk::create_file(&path, 8 * MIB, true) {
            Err(DiskError::Open { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::AlreadyExists)
            }
            other => panic!("expected Open error, got {other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }

    #[test]
    fn create_file_preallocates_or_stays_sparse() {
        let dir = tempfile::tempdir().unwrap();
        let sparse = dir.path().join("sparse.img");
        let full = dir.path().join("full.img");
        FileDisk::create_file(&sparse, 16 * MIB, false).unwrap();
        FileDisk::create_file(&full, 16 * MIB, true).unwrap();
        let sparse_bytes = std::fs::metadata(&sparse).unwrap().blocks() * 512;
        let full_bytes = std::fs::metadata(&full).unwrap().blocks() * 512;
        assert_eq!(std::fs::metadata(&full).unwrap().len(), 16 * MIB);
        assert!(full_bytes >= 16 * MIB, "preallocated only {full_bytes} bytes");
        assert!(sparse_bytes < MIB, "sparse file holds {sparse_bytes} bytes");
    }

    #[test]
    fn too_small_is_unusable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("small.img");
        match FileDisk::create_file(&path, DATA_OFFSET + MIB, false) {
            Err(DiskError::Unusable { reason, .. }) => {
                assert!(reason.contains("too small"), "{reason}")
            }
            other => panic!("expected Unusable, got {other:?}"),
        }
        assert!(!path.exists(), "a refused create must not leave a file behind");

        std::fs::write(&path, vec![0u8; (DATA_OFFSET + MIB) as usize]).unwrap();
        match FileDisk::open(&path) {
            Err(DiskError::Unusable { reason, .. }) => {
                assert!(reason.contains("2097152 bytes"), "{reason}")
            }
            other => panic!("expected Unusable, got {other:?}"),
        }
        // One sector more is enough.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(DATA_OFFSET + MIB + SECTOR as u64).unwrap();
        assert_eq!(FileDisk::open(&path).unwrap().size(), DATA_OFFSET + MIB + SECTOR as u64);
    }

    #[test]
    fn size_is_rounded_down_to_sectors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("odd.img");
        let d = FileDisk::create_file(&path, 4 * MIB + 1000, false).unwrap();
        assert_eq!(d.size(), 4 * MIB);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * MIB + 1000);
    }

    #[test]
    fn missing_path_directory_and_char_device() {
        let dir = tempfile::tempdir().unwrap();
        match FileDisk::open(dir.path().join("nope")) {
            Err(DiskError::Open { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::NotFound)
            }
            other => panic!("expected Open, got {other:?}"),
        }
        match FileDisk::open(dir.path()) {
            Err(DiskError::Unusable { reason, .. }) => {
                assert!(reason.contains("directory"), "{reason}")
            }
            other => panic!("expected Unusable, got {other:?}"),
        }
        if Path::new("/dev/null").exists() {
            match FileDisk::open("/dev/null") {
                Err(DiskError::Unusable { reason, .. }) => {
                    assert!(reason.contains("character device"), "{reason}")
                }
                other => panic!("expected Unusable, got {other:?}"),
            }
        }
    }

    #[test]
    fn falls_back_to_buffered_when_direct_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0.img");
        drop(FileDisk::create_file(&path, 4 * MIB, false).unwrap());
        let attempts = Cell::new(Vec::new());
        let opener = |p: &Path, direct: bool| {
            let mut a = attempts.take();
            a.push(direct);
            attempts.set(a);
            if direct {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                open_rw(p, false)
            }
        };
        let d = FileDisk::open_with(&path, "d", opener).unwrap();
        assert_eq!(attempts.take(), vec![true, false]);
        assert!(!d.is_direct());
        // Unaligned pointers need no bounce here and must still work.
        let mut backing = vec![0u8; SECTOR + 1];
        backing[1..].copy_from_slice(&pattern(SECTOR, 3));
        d.write_at(&backing[1..], DATA_OFFSET).unwrap();
        d.flush().unwrap();
        let mut back = vec![0u8; SECTOR];
        d.read_at(&mut back, DATA_OFFSET).unwrap();
        assert_eq!(back, pattern(SECTOR, 3));
    }

    #[test]
    fn other_open_errors_do_not_fall_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0.img");
        drop(FileDisk::create_file(&path, 4 * MIB, false).unwrap());
        let calls = Cell::new(0);
        let r = FileDisk::open_with(&path, "d", |_, _| {
            calls.set(calls.get() + 1);
            Err(io::Error::from_raw_os_error(libc::EACCES))
        });
        assert!(matches!(r, Err(DiskError::Open { ref source, .. }) if source.raw_os_error() == Some(libc::EACCES)));
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn works_on_shm_whatever_it_supports() {
        // tmpfs refused O_DIRECT before Linux 6.6; either way the disk must work.
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            eprintln!("skipping: no /dev/shm");
            return;
        }
        let dir = tempfile::tempdir_in(shm).unwrap();
        let path = dir.path().join("d0.img");
        let d = FileDisk::create_file(&path, 4 * MIB, false).unwrap();
        assert_eq!(d.is_direct(), accepts_direct(&path));
        let data = AlignedBuf::from_slice(&pattern(2 * SECTOR, 4));
        d.write_at(&data, DATA_OFFSET).unwrap();
        d.flush().unwrap();
        let mut back = AlignedBuf::zeroed(2 * SECTOR);
        d.read_at(&mut back, DATA_OFFSET).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn short_read_at_eof_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0.img");
        let d = FileDisk::create_file(&path, 8 * MIB, false).unwrap();
        // Someone shrinks the file behind our back.
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4 * MIB)
            .unwrap();
        let mut buf = AlignedBuf::zeroed(SECTOR);
        match d.read_at(&mut buf, 6 * MIB) {
            Err(DiskError::Io {
                op: "read",
                source,
                offset,
                ..
            }) => {
                assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof);
                assert_eq!(offset, 6 * MIB);
            }
            other => panic!("expected Io error, got {other:?}"),
        }
    }

    #[test]
    fn block_device_size_matches_sysfs() {
        // Only reads the size of an existing block device; never opens it for writing.
        let Ok(entries) = std::fs::read_dir("/sys/block") else {
            eprintln!("skipping: no /sys/block");
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let dev = Path::new("/dev").join(&name);
            let Ok(sectors) = std::fs::read_to_string(e.path().join("size")) else {
                continue;
            };
            let Ok(sectors) = sectors.trim().parse::<u64>() else {
                continue;
            };
            let Ok(f) = File::open(&dev) else { continue };
            if !f.metadata().map(|m| m.file_type().is_block_device()).unwrap_or(false) {
                continue;
            }
            assert_eq!(block_device_size(&f).unwrap(), sectors * 512, "{}", dev.display());
            let logical = logical_sector_size(&f).unwrap();
            assert!(logical >= 512 && logical.is_power_of_two(), "{logical}");
            return;
        }
        eprintln!("skipping: no readable block device");
    }
}
