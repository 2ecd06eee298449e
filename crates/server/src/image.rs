//! Raw image import and export, sparse-aware: runs of zeros in an image are trimmed on import
//! (so a thin vdisk stays thin), and unmapped or zero ranges of a vdisk become holes on export.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use tessera_disk::{AlignedBuf, Label, LabelError, Pace};
use tessera_volume::{Progress, Vdisk};

use crate::data_paths::{through, DataPaths, DataUse};
use crate::staged_file::{StagedFile, STAGED_PREFIX};

/// Bytes moved per step; also how often cancel is checked.
const CHUNK: usize = 4 << 20;
/// Unit of zero detection: a run of zeros this long or longer is a hole.
const ZERO_UNIT: usize = 4096;
/// Alignment of offset, length and memory for a write with O_DIRECT.
const DIRECT_ALIGN: usize = 4096;
/// Chunks an import or export moves at the same time.
const WORKERS: usize = 4;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ImageReport {
    pub bytes: u64,
    /// Bytes written as data.
    pub data_bytes: u64,
    /// Bytes that were zero or holes, trimmed on import or left as holes on export.
    pub zero_bytes: u64,
}

/// The size of the image open as `f` (opened from `path`, which names it in errors).
pub fn size_of(f: &File, path: &Path) -> Result<u64, String> {
    let md = f.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    if md.is_dir() {
        return Err(format!("{} is a directory, not an image", path.display()));
    }
    if md.file_type().is_block_device() {
        let mut size: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x8008_1272, &mut size) };
        if r != 0 {
            return Err(format!("{}: cannot read the device size", path.display()));
        }
        return Ok(size);
    }
    Ok(md.len())
}

/// The data segments of a file, from SEEK_DATA/SEEK_HOLE; one segment for the whole file when
/// the file system cannot say.
fn data_segments(f: &File, size: u64) -> Vec<(u64, u64)> {
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    while (pos as u64) < size {
        // SAFETY: lseek on a descriptor we own.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            return vec![(0, size)];
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return vec![(0, size)];
        }
        let end = (hole as u64).min(size);
        if end > data as u64 {
            out.push((data as u64, end));
        }
        pos = hole;
    }
    out
}

/// Zeroes (unmapping) what of `[off, off+len)` is mapped; an unmapped range already reads as
/// zeros and costs nothing.
fn zero_range(v: &Vdisk, off: u64, len: u64) -> Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    for x in v.extents(off, len).map_err(|e| e.to_string())? {
        if x.mapped {
            v.write_zeroes(x.offset, x.len, true, false)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// An export's pace ([`Pace`]: its rate at every moment, shared by its workers) and why a
/// worker failed: the others stop waiting for their turn, and say the same (whichever of
/// them the job's report takes).
struct ExportPace {
    pace: Pace,
    stopped: parking_lot::Mutex<Option<String>>,
}

impl ExportPace {
    fn new(rate: Option<u64>) -> ExportPace {
        ExportPace {
            pace: Pace::new(rate),
            stopped: parking_lot::Mutex::new(None),
        }
    }

    fn take(&self, bytes: u64, p: &Progress) -> Result<(), String> {
        self.pace.take(bytes, || {
            cancelled(p)?;
            self.stopped.lock().clone().map_or(Ok(()), Err)
        })
    }

    fn stop(&self, why: &str) {
        self.stopped.lock().get_or_insert_with(|| why.to_string());
    }
}

fn cancelled(p: &Progress) -> Result<(), String> {
    if p.cancel.load(Ordering::Relaxed) {
        Err("cancelled".into())
    } else {
        Ok(())
    }
}

/// Copies the image open as `f` (from `path`, which names it in errors) into `v` from byte 0:
/// the file that was checked, not whatever the path names by then. A last partial block is
/// padded with zeros.
pub fn import(v: &Vdisk, f: File, path: &Path, p: &Progress) -> Result<ImageReport, String> {
    let size = size_of(&f, path)?;
    let bs = v.block_size() as u64;
    let padded = size.div_ceil(bs) * bs;
    if padded > v.size() {
        return Err(format!(
            "the image ({size} bytes) is larger than the vdisk ({} bytes)",
            v.size()
        ));
    }
    p.total_bytes.store(padded, Ordering::Relaxed);
    // The work, in order: holes to unmap and data chunks to copy.
    let mut work: Vec<(u64, u64, bool)> = Vec::new();
    let mut pos = 0u64;
    for (start, end) in data_segments(&f, size) {
        let hole_end = start / bs * bs;
        if hole_end > pos {
            work.push((pos, hole_end - pos, true));
            pos = hole_end;
        }
        let end = end.div_ceil(bs) * bs;
        while pos < end {
            let n = (CHUNK as u64).min(end - pos);
            work.push((pos, n, false));
            pos += n;
        }
    }
    if padded > pos {
        work.push((pos, padded - pos, true));
    }
    // A few chunks in flight: first writes allocate grains, and the metadata commits of
    // concurrent writers are batched together.
    let (data_bytes, zero_bytes) = on_workers(work.len(), |buf, r, i| {
        let (off, len, hole) = work[i];
        cancelled(p)?;
        if hole {
            zero_range(v, off, len)?;
            r.zero_bytes += len;
        } else {
            let n = len as usize;
            let avail = (size - off).min(len) as usize;
            buf[avail..n].fill(0);
            f.read_exact_at(&mut buf[..avail], off)
                .map_err(|e| format!("reading the image at byte {off}: {e}"))?;
            write_nonzero(v, off, &buf[..n], r)?;
        }
        p.done_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    })?;
    let report = ImageReport {
        bytes: size,
        data_bytes,
        zero_bytes,
    };
    v.flush().map_err(|e| e.to_string())?;
    p.done_bytes.store(padded, Ordering::Relaxed);
    Ok(report)
}

/// Writes the non-zero runs of `data` at `off`, and zeroes (unmapping) the zero runs.
fn write_nonzero(v: &Vdisk, off: u64, data: &[u8], r: &mut ImageReport) -> Result<(), String> {
    let unit = ZERO_UNIT.max(v.block_size() as usize);
    for (a, b, zero) in zero_runs(data, unit) {
        let (o, len) = (off + a as u64, (b - a) as u64);
        if zero {
            zero_range(v, o, len)?;
            r.zero_bytes += len;
        } else {
            v.write(o, &data[a..b], false).map_err(|e| e.to_string())?;
            r.data_bytes += len;
        }
    }
    Ok(())
}

/// Splits `data` into maximal runs `[a, b)` of `unit`-sized pieces that are all zero or not.
fn zero_runs(data: &[u8], unit: usize) -> Vec<(usize, usize, bool)> {
    let mut out: Vec<(usize, usize, bool)> = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let j = (i + unit).min(data.len());
        let zero = is_zero(&data[i..j]);
        match out.last_mut() {
            Some(last) if last.2 == zero => last.1 = j,
            _ => out.push((i, j, zero)),
        }
        i = j;
    }
    out
}

fn is_zero(b: &[u8]) -> bool {
    // SAFETY: any bit pattern is a valid u128.
    let (pre, words, post) = unsafe { b.align_to::<u128>() };
    pre.iter().all(|&x| x == 0) && words.iter().all(|&x| x == 0) && post.iter().all(|&x| x == 0)
}

/// Where an export writes: an existing block device, in place; or a new regular file, sparse
/// and sized to the vdisk, made beside the name asked for and put there only once whole
/// ([`StagedFile`]; with `overwrite`, over the file found there, which stays as it was until
/// then).
#[derive(Debug)]
pub struct ExportTarget {
    file: File,
    staged: Option<StagedFile>,
}

impl ExportTarget {
    /// Puts a finished image at its name (a device is written in place: nothing to do),
    /// over the file found there only if it is still no pool's disk.
    fn place(self, path: &Path) -> Result<(), String> {
        self.staged
            .map_or(Ok(()), |s| s.place(path, |held| refuse_pool_disk(held, path)))
    }
}

/// Opens the export destination: a new file (with `overwrite`, to replace an existing one),
/// sized to the vdisk and sparse; or an existing block device at least that large. A file or
/// device that carries a Tessera disk label (a disk of a pool, data or cache, here or
/// elsewhere) is never written over, `overwrite` or not; nor is anything `paths` refuses for
/// an image, found and checked before anything opens it for I/O (a FIFO would hang, a device
/// be woken) and checked again on the file opened; and a regular file is never reached
/// through a symbolic link (a device may be: /dev/disk/by-id names are links).
pub fn create_target(path: &Path, overwrite: bool, size: u64, paths: &DataPaths) -> Result<ExportTarget, String> {
    // Nothing is looked up where it would be refused.
    paths.check_named(path, DataUse::Image)?;
    // The file found, when there is one, held open: the only one an image may replace.
    let mut was = None;
    if std::fs::symlink_metadata(path).is_ok() {
        if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            return Err(format!("{} is a directory", path.display()));
        }
        let found = paths.locate(path, DataUse::Image)?;
        let by = through(&found);
        refuse_pool_disk(&by, path)?;
        let device = std::fs::metadata(&by).is_ok_and(|m| m.file_type().is_block_device());
        if device {
            if !overwrite {
                return Err(format!(
                    "{} is a block device; pass --overwrite to write over it",
                    path.display()
                ));
            }
            let f = OpenOptions::new()
                .write(true)
                .open(&by)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
            let have = size_of(&f, path)?;
            if have < size {
                return Err(format!(
                    "{} holds {have} bytes, less than the vdisk's {size}",
                    path.display()
                ));
            }
            return Ok(ExportTarget { file: f, staged: None });
        }
        if !overwrite {
            return Err(format!(
                "{} already exists; pass --overwrite to replace it",
                path.display()
            ));
        }
        // A link to a file would be replaced by the image, not the file it leads to.
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink()) {
            return Err(format!(
                "{} is a symbolic link: give the path of the file itself",
                path.display()
            ));
        }
        was = Some(found);
    }
    // Made through its directory's descriptor, checked first: no link or rename in between
    // leads elsewhere, and nothing is made where it would be refused.
    let (dir, by) = paths.locate_new(path, DataUse::Image)?;
    if was.is_none() && std::fs::symlink_metadata(&by).is_ok() {
        return Err(format!(
            "{} appeared while it was checked; nothing was written",
            path.display()
        ));
    }
    // Written beside its name first: nothing is made where it would be refused.
    if paths
        .check_named(&path.with_file_name(STAGED_PREFIX), DataUse::Image)
        .is_err()
    {
        return Err(format!(
            "an image is written beside its name and put there once whole: the directory of {} must be inside data_paths, not only the file",
            path.display()
        ));
    }
    let name = path.file_name().expect("locate_new names a file");
    let (f, staged) = StagedFile::create(dir, name, was, path)?;
    // A named file is checked again where the kernel says it is; an unnamed one is in the
    // directory checked, by the way it was made.
    if staged.named() {
        paths.check(&f, path, DataUse::Image)?;
    }
    f.set_len(size)
        .map_err(|e| format!("cannot size {}: {e}", path.display()))?;
    Ok(ExportTarget {
        file: f,
        staged: Some(staged),
    })
}

/// Refuses `path` if its first block carries a Tessera disk label, valid or not: an export
/// over it would destroy a pool (a wrong device name is an easy mistake to make).
fn refuse_pool_disk(by: &Path, path: &Path) -> Result<(), String> {
    let mut first = vec![0u8; tessera_disk::LABEL_SIZE];
    let read = File::open(by)
        .and_then(|f| f.read_at(&mut first, 0))
        .map_err(|e| format!("cannot read {} to check it is no pool's disk: {e}", path.display()))?;
    first.truncate(read);
    match Label::decode(&path.display().to_string(), &first) {
        Err(LabelError::Missing { .. }) => Ok(()),
        Ok(l) => Err(format!(
            "{} is a disk of Tessera pool '{}': an export would destroy it; export elsewhere, or remove the disk from its pool first",
            path.display(),
            l.pool_name
        )),
        Err(e) => Err(format!(
            "{} carries a Tessera disk label ({e}): it may be a pool's disk, and is not written over; wipe its first 4 KiB yourself if it is no longer one",
            path.display()
        )),
    }
}

/// Writes the whole vdisk to `f`, a few chunks at a time. Unmapped grains and zero blocks are
/// skipped: in a fresh regular file they are holes. A block device gets them written as zeros.
/// With `rate`, the vdisk's data is read at that many bytes per second at most.
pub fn export(
    v: &Vdisk,
    to: ExportTarget,
    path: &Path,
    rate: Option<u64>,
    p: &Progress,
) -> Result<ImageReport, String> {
    let f = &to.file;
    let size = v.size();
    let pace = ExportPace::new(rate);
    let sparse_ok = f.metadata().map(|m| m.is_file()).unwrap_or(false);
    p.total_bytes.store(size, Ordering::Relaxed);
    let chunks = size.div_ceil(CHUNK as u64) as usize;
    let zeros = AlignedBuf::zeroed(CHUNK);
    // Whole aligned blocks go around the page cache, as `dd oflag=direct` writes: written
    // through it, a gigabyte waits for write-back at the final sync. The same file opened
    // again with O_DIRECT; where the file system refuses it (tmpfs), every write is buffered.
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .ok();
    let write_at = |bytes: &[u8], at: u64| {
        let aligned = |x: usize| x.is_multiple_of(DIRECT_ALIGN);
        let out = match &direct {
            Some(d) if aligned(at as usize) && aligned(bytes.len()) && aligned(bytes.as_ptr() as usize) => d,
            _ => f,
        };
        out.write_all_at(bytes, at)
            .map_err(|e| format!("writing {} at byte {at}: {e}", path.display()))
    };
    // One chunk: its mapped extents read and their non-zero runs written; the rest left as
    // holes (or written as zeros to a device).
    let chunk = |buf: &mut AlignedBuf, r: &mut ImageReport, pos: u64| -> Result<(), String> {
        cancelled(p)?;
        let len = (CHUNK as u64).min(size - pos);
        for x in v.extents(pos, len).map_err(|e| e.to_string())? {
            let (o, n) = (x.offset, x.len as usize);
            if !x.mapped {
                r.zero_bytes += n as u64;
                if !sparse_ok {
                    write_at(&zeros[..n], o)?;
                }
                continue;
            }
            pace.take(n as u64, p)?;
            v.read(o, &mut buf[..n]).map_err(|e| e.to_string())?;
            for (a, b, zero) in zero_runs(&buf[..n], ZERO_UNIT) {
                let at = o + a as u64;
                if zero {
                    r.zero_bytes += (b - a) as u64;
                    if sparse_ok {
                        continue;
                    }
                } else {
                    r.data_bytes += (b - a) as u64;
                }
                write_at(&buf[a..b], at)?;
            }
        }
        p.done_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    };
    let (data_bytes, zero_bytes) = on_workers(chunks, |buf, r, i| {
        // The other workers, waiting for their turn to read, stop too.
        chunk(buf, r, i as u64 * CHUNK as u64).inspect_err(|e| pace.stop(e))
    })?;
    f.sync_all().map_err(|e| format!("syncing {}: {e}", path.display()))?;
    to.place(path)?;
    p.done_bytes.store(size, Ordering::Relaxed);
    Ok(ImageReport {
        bytes: size,
        data_bytes,
        zero_bytes,
    })
}

/// Runs `step(buffer, tally, i)` for every `i` in `0..items`, on [`WORKERS`] threads that each
/// have a [`CHUNK`] buffer of their own; the first error stops them all and is returned.
/// Returns the data and zero bytes the steps tallied.
fn on_workers(
    items: usize,
    step: impl Fn(&mut AlignedBuf, &mut ImageReport, usize) -> Result<(), String> + Sync,
) -> Result<(u64, u64), String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let data_bytes = std::sync::atomic::AtomicU64::new(0);
    let zero_bytes = std::sync::atomic::AtomicU64::new(0);
    let failure: parking_lot::Mutex<Option<String>> = parking_lot::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                let mut buf = AlignedBuf::zeroed(CHUNK);
                let mut r = ImageReport::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= items || failure.lock().is_some() {
                        break;
                    }
                    if let Err(e) = step(&mut buf, &mut r, i) {
                        failure.lock().get_or_insert(e);
                        break;
                    }
                }
                data_bytes.fetch_add(r.data_bytes, Ordering::Relaxed);
                zero_bytes.fetch_add(r.zero_bytes, Ordering::Relaxed);
            });
        }
    });
    match failure.into_inner() {
        Some(e) => Err(e),
        None => Ok((data_bytes.into_inner(), zero_bytes.into_inner())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_runs_split_and_merge() {
        let mut d = vec![0u8; 5 * 4096 + 100];
        d[4096 + 7] = 1;
        d[2 * 4096] = 1;
        d[5 * 4096 + 99] = 1;
        assert_eq!(
            zero_runs(&d, 4096),
            vec![
                (0, 4096, true),
                (4096, 3 * 4096, false),
                (3 * 4096, 5 * 4096, true),
                (5 * 4096, 5 * 4096 + 100, false)
            ]
        );
        assert!(zero_runs(&[], 4096).is_empty());
    }

    #[test]
    fn segments_of_a_sparse_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("img");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[1u8; 4096], 16 << 20).unwrap();
        let segs = data_segments(&f, 64 << 20);
        assert!(!segs.is_empty());
        // Whatever the file system's granularity, the data is inside a segment and most of the
        // file is not.
        assert!(segs.iter().any(|&(a, b)| a <= 16 << 20 && b >= (16 << 20) + 4096));
        assert!(segs.iter().map(|(a, b)| b - a).sum::<u64>() < 32 << 20);
        let size = |p: &Path| size_of(&File::open(p).unwrap(), p);
        assert_eq!(size(&p).unwrap(), 64 << 20);
        assert!(size(d.path()).unwrap_err().contains("directory"));
    }

    /// The rules of a daemon whose state directory is elsewhere and that sets no data_paths.
    fn anywhere() -> DataPaths {
        DataPaths::new(Path::new("/nonexistent-state"), &[])
    }

    #[test]
    fn export_target_is_never_overwritten_by_accident() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.img");
        create_target(&p, false, 1 << 20, &anywhere())
            .unwrap()
            .place(&p)
            .unwrap();
        assert!(create_target(&p, false, 1 << 20, &anywhere())
            .unwrap_err()
            .contains("--overwrite"));
        // Replaced only once the new image is whole.
        let t = create_target(&p, true, 2 << 20, &anywhere()).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 1 << 20);
        t.place(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 2 << 20);
        // A link to it is refused, not replaced by the image.
        let link = d.path().join("link.img");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        let e = create_target(&link, true, 1 << 20, &anywhere()).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 2 << 20);
    }

    /// No name leads an export into the daemon's own files: not a symbolic link to one, nor
    /// the link /proc keeps for a descriptor the daemon holds open, nor a path inside the
    /// state directory itself; and what was there is left as it was.
    #[test]
    fn an_export_never_lands_in_the_state_directory_whatever_the_name() {
        let d = tempfile::tempdir().unwrap();
        let state = d.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let state = std::fs::canonicalize(&state).unwrap();
        let paths = DataPaths::new(&state, &[]);
        let precious = state.join("events.jsonl");
        std::fs::write(&precious, b"the daemon's own").unwrap();
        let link = d.path().join("out.img");
        std::os::unix::fs::symlink(&precious, &link).unwrap();
        let e = create_target(&link, true, 1 << 20, &paths).unwrap_err();
        assert!(e.contains("symbolic link") || e.contains("state directory"), "{e}");
        let held = std::fs::File::open(&precious).unwrap();
        let magic = Path::new("/proc/self/fd").join(held.as_raw_fd().to_string());
        let e = create_target(&magic, true, 1 << 20, &paths).unwrap_err();
        assert!(e.contains("symbolic link") || e.contains("state directory"), "{e}");
        let e = create_target(&state.join("new.img"), false, 1 << 20, &paths).unwrap_err();
        assert!(e.contains("inside the daemon's state directory"), "{e}");
        assert!(!state.join("new.img").exists(), "the refused file was left behind");
        assert_eq!(std::fs::read(&precious).unwrap(), b"the daemon's own");
        // A plain file elsewhere is made as asked.
        let plain = d.path().join("plain.img");
        create_target(&plain, false, 1 << 20, &paths)
            .unwrap()
            .place(&plain)
            .unwrap();
        assert_eq!(std::fs::metadata(&plain).unwrap().len(), 1 << 20);
    }

    /// With data_paths, a name outside them is refused as given: nothing there is looked at
    /// (a directory is not told from a file).
    #[test]
    fn an_export_outside_the_data_paths_looks_at_nothing_there() {
        let d = tempfile::tempdir().unwrap();
        let san = d.path().join("san");
        std::fs::create_dir_all(&san).unwrap();
        let paths = DataPaths::new(&d.path().join("state"), &[san.clone()]);
        for outside in [d.path().to_path_buf(), d.path().join("x.img")] {
            let e = create_target(&outside, true, 1 << 20, &paths).unwrap_err();
            assert!(e.contains("outside the places"), "{e}");
        }
        let x = san.join("x.img");
        create_target(&x, false, 1 << 20, &paths).unwrap().place(&x).unwrap();
        // A file allowed alone: the image is written beside it first, which is refused.
        let alone = d.path().join("alone.img");
        let only = DataPaths::new(&d.path().join("state"), &[alone.clone()]);
        let e = create_target(&alone, false, 1 << 20, &only).unwrap_err();
        assert!(e.contains("must be inside data_paths"), "{e}");
        assert!(std::fs::read_dir(d.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(STAGED_PREFIX)));
    }

    /// A FIFO (or anything but a regular file or a block device) is refused before anything
    /// opens it: opening a FIFO to write would wait for a reader for ever.
    #[test]
    fn an_export_never_opens_a_fifo() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let at = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(create_target(&at, true, 1 << 20, &anywhere()).map(drop));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the export waits on the FIFO")
            .unwrap_err();
        assert!(e.contains("not a regular file or a block device"), "{e}");
    }

    #[test]
    fn a_pool_disk_is_never_an_export_target_even_with_overwrite() {
        let d = tempfile::tempdir().unwrap();
        let disk = d.path().join("disk0.img");
        std::fs::File::create(&disk).unwrap().set_len(256 << 20).unwrap();
        let dev: tessera_disk::DiskRef = std::sync::Arc::new(tessera_disk::FileDisk::open(&disk).unwrap());
        let dir = d.path().join("pool");
        let e = tessera_volume::Engine::create_pool(&dir, "tank", vec![dev], 64 << 20).unwrap();
        drop(e);
        let before = std::fs::read(&disk).unwrap();
        let err = create_target(&disk, true, 1 << 20, &anywhere()).unwrap_err();
        assert!(err.contains("a disk of Tessera pool 'tank'"), "{err}");
        assert!(std::fs::read(&disk).unwrap() == before, "the refusal changed the disk");
        // A label that no longer reads (its checksum broken) is refused all the same.
        let mut bytes = before.clone();
        bytes[100] ^= 0xFF;
        std::fs::write(&disk, &bytes).unwrap();
        let err = create_target(&disk, true, 1 << 20, &anywhere()).unwrap_err();
        assert!(err.contains("carries a Tessera disk label"), "{err}");
        // A file of anything else is replaced, as asked.
        let other = d.path().join("other.img");
        std::fs::write(&other, vec![7u8; 8192]).unwrap();
        create_target(&other, true, 1 << 20, &anywhere())
            .unwrap()
            .place(&other)
            .unwrap();
        assert_eq!(std::fs::metadata(&other).unwrap().len(), 1 << 20);
        // As is one shorter than a label.
        std::fs::write(&other, b"x").unwrap();
        create_target(&other, true, 1 << 20, &anywhere())
            .unwrap()
            .place(&other)
            .unwrap();
        assert_eq!(std::fs::metadata(&other).unwrap().len(), 1 << 20);
        // But not one that became a pool's disk while the export ran.
        let t = create_target(&other, true, 1 << 20, &anywhere()).unwrap();
        std::fs::write(&other, &before[..8192]).unwrap();
        let held = std::fs::read(&other).unwrap();
        let err = t.place(&other).unwrap_err();
        assert!(err.contains("a disk of Tessera pool 'tank'"), "{err}");
        assert!(std::fs::read(&other).unwrap() == held, "the pool's disk was replaced");
    }
}
