//! A file made beside the one asked for, and put at that name only once it is whole: an
//! export that fails, is cancelled or dies with the daemon leaves no file at the name that
//! looks like an image (a sparse file has its full size from the start), and an image it was
//! to replace stays as it was until the new one is complete.
//!
//! The file is made without a name where the file system allows it (`O_TMPFILE`: ext4, XFS,
//! Btrfs, tmpfs), so that nothing is left behind even by a daemon that dies; elsewhere (NFS)
//! under a hidden temporary name, which a daemon that dies leaves. To replace a file it is
//! given a hidden name just before the exchange.
//!
//! Every name is looked up through the directory's descriptor, checked when the export
//! began: no rename of a directory above leads elsewhere. The file the export was allowed to
//! replace (checked then: no pool's disk, no file of the daemon's) is the only one it
//! replaces: the two are exchanged in one step and, if what went out is not that file, put
//! back.

use std::ffi::{CStr, CString, OsStr};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::data_paths::through;

/// The temporary names' prefix: hidden, and saying whose they are.
pub const STAGED_PREFIX: &str = ".tessera-partial-";

/// A device and inode number: which file a name leads to.
pub type FileId = (u64, u64);

#[derive(Debug)]
pub struct StagedFile {
    /// The directory, as checked when the export began (`O_PATH`).
    dir: OwnedFd,
    /// The file made (a descriptor of its own: the caller's may be closed first).
    file: OwnedFd,
    /// Its hidden name in the directory, whether it has it yet or not (`named`).
    temp: CString,
    named: bool,
    name: CString,
    /// The file found at the name when it was checked, which may be replaced (held open: its
    /// inode number cannot be given to another file meanwhile); None: the name must still
    /// be free.
    replaces: Option<(OwnedFd, FileId)>,
    /// The file that goes with the temporary name when this is dropped: the one made, or,
    /// once exchanged, the one it replaced.
    ours: FileId,
}

impl StagedFile {
    /// Makes a new file (mode 0600) under a temporary name in `dir`, to be put at `name`, in
    /// place of `replaces` (the file found there, open) if given. `shown` names the target in
    /// messages.
    pub fn create(
        dir: OwnedFd,
        name: &OsStr,
        replaces: Option<OwnedFd>,
        shown: &Path,
    ) -> Result<(File, StagedFile), String> {
        Self::create_as(dir, name, replaces, shown, true)
    }

    /// [`create`](Self::create), without a name first only if `unnamed`.
    fn create_as(
        dir: OwnedFd,
        name: &OsStr,
        replaces: Option<OwnedFd>,
        shown: &Path,
        unnamed: bool,
    ) -> Result<(File, StagedFile), String> {
        let made = |name: &CString| -> std::io::Result<File> {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(through(&dir).join(OsStr::from_bytes(name.as_bytes())))
        };
        let unnamed = if unnamed {
            OpenOptions::new()
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
                .open(through(&dir))
        } else {
            Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
        };
        let (f, temp, named) = match unnamed {
            Ok(f) => (f, fresh_name(), false),
            // No unnamed files on this file system (or this kernel): a hidden name.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)) => {
                let (f, temp) =
                    at_fresh_name(made).map_err(|e| format!("cannot create a file beside {}: {e}", shown.display()))?;
                (f, temp, true)
            }
            Err(e) => return Err(format!("cannot create a file beside {}: {e}", shown.display())),
        };
        let id = |f: &File| {
            use std::os::unix::fs::MetadataExt;
            f.metadata()
                .map(|m| (m.dev(), m.ino()))
                .map_err(|e| format!("cannot read what is at {}: {e}", shown.display()))
        };
        let ours = id(&f)?;
        let replaces = match replaces {
            Some(fd) => {
                let held = File::from(fd.try_clone().map_err(|e| e.to_string())?);
                keep_access(&held, &f).map_err(|e| {
                    format!(
                        "cannot give the new image the owner and mode of {}: {e}",
                        shown.display()
                    )
                })?;
                Some((fd, id(&held)?))
            }
            None => None,
        };
        let staged = StagedFile {
            dir,
            file: f.try_clone().map_err(|e| e.to_string())?.into(),
            temp,
            named,
            name: CString::new(name.as_bytes()).map_err(|_| format!("{} holds a NUL byte", shown.display()))?,
            replaces,
            ours,
        };
        Ok((f, staged))
    }

    /// Whether the file has a name yet (its hidden one): an unnamed file is in the directory
    /// by the way it was made, and the kernel names it nowhere.
    pub fn named(&self) -> bool {
        self.named
    }

    /// Puts the file (written and synced by the caller) at its name, durably: replacing only
    /// the file that was there when checked, and only if `replaceable` (given a path to that
    /// file, through the descriptor held) still says so just before and just after; or
    /// taking a name still free.
    pub fn place(mut self, shown: &Path, replaceable: impl Fn(&Path) -> Result<(), String>) -> Result<(), String> {
        let taken = match self.replaces.as_ref().map(|(fd, was)| (through(fd), *was)) {
            Some((held, was)) => {
                self.name_it()
                    .map_err(|e| format!("cannot name the image beside {}: {e}", shown.display()))?;
                self.exchange(&held, was, shown, &replaceable)?
            }
            None => false,
        };
        if !taken {
            self.take_free_name().map_err(|e| {
                if e.raw_os_error() == Some(libc::EEXIST) {
                    format!(
                        "{} appeared while the export ran and is left as it is; the image was not kept",
                        shown.display()
                    )
                } else {
                    format!("cannot put the image at {}: {e}", shown.display())
                }
            })?;
        }
        // The new name must survive a power cut as the data does.
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(through(&self.dir))
            .and_then(|d| d.sync_all())
            .map_err(|e| {
                format!(
                    "the image is at {}, but syncing its directory failed ({e}): the name may not survive a power cut",
                    shown.display()
                )
            })
    }

    /// Gives the file the name, which must be free (`EEXIST` if not). Where the file system
    /// has no rename that refuses to replace (NFS), a hard link does the same.
    fn take_free_name(&self) -> std::io::Result<()> {
        if !self.named {
            return self.link_unnamed(&self.name);
        }
        match self.rename(libc::RENAME_NOREPLACE) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.link_in(),
            done => done,
        }
    }

    /// Gives the unnamed file its hidden name (another if one is taken).
    fn name_it(&mut self) -> std::io::Result<()> {
        if !self.named {
            let ((), temp) = at_fresh_name(|temp| self.link_unnamed(temp))?;
            self.temp = temp;
            self.named = true;
        }
        Ok(())
    }

    /// Links the unnamed file at `name` in the directory (`EEXIST` if taken).
    fn link_unnamed(&self, name: &CStr) -> std::io::Result<()> {
        // Through /proc, which needs no capability (`AT_EMPTY_PATH` would).
        let by = CString::new(format!("/proc/self/fd/{}", self.file.as_raw_fd())).expect("no NUL");
        // SAFETY: NUL-terminated names and a live directory descriptor.
        let rc = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                by.as_ptr(),
                self.dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Links the file at the name (`EEXIST` if taken), then drops the temporary name.
    fn link_in(&self) -> std::io::Result<()> {
        let d = self.dir.as_raw_fd();
        // SAFETY: a live directory descriptor and NUL-terminated names.
        if unsafe { libc::linkat(d, self.temp.as_ptr(), d, self.name.as_ptr(), 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above; the file keeps its new name.
        unsafe { libc::unlinkat(d, self.temp.as_ptr(), 0) };
        Ok(())
    }

    /// Puts the file in place of the one at the name, which must be `was` (held open as
    /// `held`) and still `replaceable`; true once done, false if the name is free by now.
    fn exchange(
        &mut self,
        held: &Path,
        was: FileId,
        shown: &Path,
        replaceable: &impl Fn(&Path) -> Result<(), String>,
    ) -> Result<bool, String> {
        replaceable(held)?;
        match self.rename(libc::RENAME_EXCHANGE) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && self.id_of(&self.temp) == Some(self.ours) => {
                return Ok(false)
            }
            // No exchange on this file system (NFS): the name is checked, then replaced.
            // Between the two, a file put there by someone with write access to the
            // directory would be replaced; the exchange leaves no such moment.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return self.replace_if_still(was, shown),
            Err(e) => return Err(format!("cannot put the image at {}: {e}", shown.display())),
        }
        // What went out is under the temporary name now, and goes when this is dropped,
        // if it is the file checked and still may be replaced; else it goes back, untouched.
        if self.id_of(&self.temp) == Some(was) && replaceable(held).is_ok() {
            self.ours = was;
            return Ok(true);
        }
        let back = self.rename(libc::RENAME_EXCHANGE);
        Err(match back {
            Ok(()) => self.not_kept(shown),
            Err(e) => format!(
                "{} was replaced by another file while the export ran, and putting it back failed ({e}): it is at {}",
                shown.display(),
                shown.with_file_name(self.temp.to_string_lossy().as_ref()).display()
            ),
        })
    }

    /// Replaces the file at the name if it is `was`; false if the name is free.
    fn replace_if_still(&self, was: FileId, shown: &Path) -> Result<bool, String> {
        match self.id_of(&self.name) {
            Some(at) if at == was => self
                .rename(0)
                .map(|()| true)
                .map_err(|e| format!("cannot put the image at {}: {e}", shown.display())),
            Some(_) => Err(self.not_kept(shown)),
            None => Ok(false),
        }
    }

    fn not_kept(&self, shown: &Path) -> String {
        format!(
            "{} was replaced by another file while the export ran (or may no longer be replaced); it is left as it is and the image was not kept",
            shown.display()
        )
    }

    fn rename(&self, flags: libc::c_uint) -> std::io::Result<()> {
        let d = self.dir.as_raw_fd();
        // SAFETY: a live directory descriptor and NUL-terminated names.
        let rc = unsafe { libc::renameat2(d, self.temp.as_ptr(), d, self.name.as_ptr(), flags) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn id_of(&self, name: &CStr) -> Option<FileId> {
        // SAFETY: a zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a live directory descriptor, a NUL-terminated name, a valid out-pointer.
        let rc = unsafe { libc::fstatat(self.dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        (rc == 0).then_some((st.st_dev, st.st_ino))
    }
}

/// Gives `new` the owner and permission bits of `old` (the image it replaces): a host that
/// could open the old image opens the new one.
fn keep_access(old: &File, new: &File) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = old.metadata()?;
    // SAFETY: a live descriptor.
    if unsafe { libc::fchown(new.as_raw_fd(), m.uid(), m.gid()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // After the owner: a change of owner clears set-user-ID bits.
    // SAFETY: as above.
    if unsafe { libc::fchmod(new.as_raw_fd(), m.mode() & 0o7777) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A hidden name nobody is likely to hold.
fn fresh_name() -> CString {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = format!(
        "{STAGED_PREFIX}{}-{nanos:09}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    CString::new(name).expect("no NUL in a made-up name")
}

/// Runs `make` with fresh hidden names until one is not taken: one left by a daemon that
/// died (the same process number in a container after a restart) or made by someone else is
/// passed over, never opened.
fn at_fresh_name<T>(mut make: impl FnMut(&CString) -> std::io::Result<T>) -> std::io::Result<(T, CString)> {
    let mut tries = 0;
    loop {
        let name = fresh_name();
        match make(&name) {
            Ok(t) => return Ok((t, name)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

impl Drop for StagedFile {
    /// What is under the temporary name goes: a partial image not placed, or (once
    /// placed over one) the image it replaced. Only the file known to be there.
    fn drop(&mut self) {
        // An unnamed file goes with its last descriptor.
        if self.named && self.id_of(&self.temp) == Some(self.ours) {
            // SAFETY: a live directory descriptor and a NUL-terminated name.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.temp.as_ptr(), 0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn dir_of(p: &Path) -> OwnedFd {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(p)
            .unwrap()
            .into()
    }

    fn id(p: &Path) -> FileId {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.dev(), m.ino())
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn stage(d: &Path, name: &str, replaces: Option<&Path>, data: &[u8]) -> StagedFile {
        stage_as(d, name, replaces, data, unnamed_ways()[0])
    }

    /// Unnamed files where the test's temporary directory has them, and hidden names.
    fn unnamed_ways() -> Vec<bool> {
        let d = tempfile::tempdir().unwrap();
        let probe = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(d.path());
        if probe.is_ok() {
            vec![true, false]
        } else {
            tessera_disk::skip(
                "unnamed staged files",
                "this file system makes no unnamed files (O_TMPFILE)",
            );
            vec![false]
        }
    }

    fn stage_as(d: &Path, name: &str, replaces: Option<&Path>, data: &[u8], unnamed: bool) -> StagedFile {
        let replaces = replaces.map(|p| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
                .open(p)
                .unwrap()
                .into()
        });
        let (f, s) = StagedFile::create_as(dir_of(d), OsStr::new(name), replaces, &d.join(name), unnamed).unwrap();
        assert_eq!(s.named(), !unnamed, "this file system makes unnamed files");
        std::os::unix::fs::FileExt::write_all_at(&f, data, 0).unwrap();
        s
    }

    #[test]
    fn nothing_is_at_the_name_until_placed_and_nothing_is_left_if_never() {
        for unnamed in unnamed_ways() {
            let d = tempfile::tempdir().unwrap();
            let s = stage_as(d.path(), "new.img", None, b"image", unnamed);
            // Unnamed: nothing in the directory at all (nothing for a daemon that dies to
            // leave); else a hidden name.
            if unnamed {
                assert!(names(d.path()).is_empty(), "{:?}", names(d.path()));
            } else {
                assert_eq!(names(d.path()).len(), 1);
                assert!(names(d.path())[0].starts_with(STAGED_PREFIX));
            }
            assert!(!d.path().join("new.img").exists());
            drop(s);
            assert!(names(d.path()).is_empty(), "{:?}", names(d.path()));
            stage_as(d.path(), "new.img", None, b"image", unnamed)
                .place(&d.path().join("new.img"), |_| Ok(()))
                .unwrap();
            assert_eq!(names(d.path()), ["new.img"]);
            assert_eq!(std::fs::read(d.path().join("new.img")).unwrap(), b"image");
            // A name taken by then is left as it is.
            let s = stage_as(d.path(), "new.img", None, b"other", unnamed);
            assert!(s
                .place(&d.path().join("new.img"), |_| Ok(()))
                .unwrap_err()
                .contains("appeared"));
            assert_eq!(names(d.path()), ["new.img"]);
            assert_eq!(std::fs::read(d.path().join("new.img")).unwrap(), b"image");
        }
    }

    /// Where renames take no flags (NFS): a hard link takes a free name, and a name is
    /// replaced only while it leads to the file checked.
    #[test]
    fn without_exchange_a_link_or_a_checked_rename_does_the_same() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("n.img");
        let s = stage_as(d.path(), "n.img", None, b"image", false);
        s.link_in().unwrap();
        assert_eq!(names(d.path()), ["n.img"]);
        assert_eq!(std::fs::read(&p).unwrap(), b"image");
        drop(s);
        assert_eq!(std::fs::read(&p).unwrap(), b"image", "dropped once placed");
        let s = stage_as(d.path(), "n.img", None, b"other", false);
        assert_eq!(s.link_in().unwrap_err().raw_os_error(), Some(libc::EEXIST));
        drop(s);
        assert_eq!(names(d.path()), ["n.img"]);
        assert_eq!(std::fs::read(&p).unwrap(), b"image");
        // Replaced while it is the file checked; not once it is another.
        let s = stage_as(d.path(), "n.img", Some(&p), b"new", false);
        let was = s.replaces.as_ref().unwrap().1;
        assert!(s.replace_if_still(was, &p).unwrap());
        drop(s);
        assert_eq!(names(d.path()), ["n.img"]);
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let s = stage_as(d.path(), "n.img", Some(&p), b"newer", false);
        let was = s.replaces.as_ref().unwrap().1;
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"someone else's").unwrap();
        assert!(s
            .replace_if_still(was, &p)
            .unwrap_err()
            .contains("replaced by another file"));
        drop(s);
        assert_eq!(names(d.path()), ["n.img"]);
        assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
    }

    #[test]
    fn an_image_to_replace_stays_as_it_was_until_the_new_one_is_placed() {
        // Made unnamed or under a hidden name: the same exchange either way.
        for unnamed in unnamed_ways() {
            let d = tempfile::tempdir().unwrap();
            let old = d.path().join("old.img");
            std::fs::write(&old, b"old image").unwrap();
            // A host's user may open it: so may they the new one.
            std::os::unix::fs::chown(&old, Some(4321), Some(4322)).unwrap();
            std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
            drop(stage_as(d.path(), "old.img", Some(&old), b"new", unnamed));
            assert_eq!(std::fs::read(&old).unwrap(), b"old image");
            assert_eq!(names(d.path()), ["old.img"]);
            // One that may no longer be replaced (it became a pool's disk meanwhile) is not.
            let e = stage_as(d.path(), "old.img", Some(&old), b"new image", unnamed)
                .place(&old, |_| Err("a disk of pool 'tank'".to_string()))
                .unwrap_err();
            assert!(e.contains("pool 'tank'"), "{e}");
            assert_eq!(std::fs::read(&old).unwrap(), b"old image");
            assert_eq!(names(d.path()), ["old.img"]);
            stage_as(d.path(), "old.img", Some(&old), b"new image", unnamed)
                .place(&old, |_| Ok(()))
                .unwrap();
            assert_eq!(std::fs::read(&old).unwrap(), b"new image");
            assert_eq!(names(d.path()), ["old.img"], "the replaced image is gone");
            let m = std::fs::metadata(&old).unwrap();
            assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (4321, 4322, 0o640));
        }
    }

    #[test]
    fn a_name_taken_meanwhile_is_never_replaced() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.img");
        // Free when checked, a file there by the end.
        let s = stage(d.path(), "x.img", None, b"image");
        std::fs::write(&p, b"someone else's").unwrap();
        let e = s.place(&p, |_| Ok(())).unwrap_err();
        assert!(e.contains("appeared while the export ran"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
        assert_eq!(names(d.path()), ["x.img"]);
        // Another file put in place of the one checked (a pool's disk, say): removed and made
        // again, where a file system would give the new one the same inode number if the
        // old one were not held.
        let checked = id(&p);
        let s = stage(d.path(), "x.img", Some(&p), b"image");
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"a pool's disk").unwrap();
        assert_ne!(id(&p), checked);
        let e = s.place(&p, |_| Ok(())).unwrap_err();
        assert!(e.contains("replaced by another file"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"a pool's disk");
        assert_eq!(names(d.path()), ["x.img"]);
        // The file checked removed meanwhile: the name is free, and taken.
        let y = d.path().join("y.img");
        std::fs::write(&y, b"old").unwrap();
        let s = stage(d.path(), "y.img", Some(&y), b"image");
        std::fs::remove_file(&y).unwrap();
        s.place(&y, |_| Ok(())).unwrap();
        assert_eq!(std::fs::read(d.path().join("y.img")).unwrap(), b"image");
    }
}
