//! Where a caller of the API may point the daemon at data: the files and block devices it
//! makes pools' disks of, and the images it reads into vdisks or writes them to.
//!
//! Checked on the file opened (the name the kernel keeps for its descriptor), which is the
//! one then used: no symbolic link, `/proc/self/fd/N` or directory renamed meanwhile leads
//! anywhere else. The daemon's own state (pools' metadata, keys, configuration) is never one
//! of them, except `<state dir>/disks`, where the demo makes its disks; and where the
//! configuration lists `data_paths`, nothing outside those is either, so that the API's token
//! no longer reaches every file the daemon could open.

use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

/// What a path is named for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataUse {
    /// A disk of a pool, data or cache: written over.
    Disk,
    /// An image read into a vdisk or written from one.
    Image,
    /// The Ceph configuration file of a pool on RADOS (read by librados).
    CephConf,
}

impl DataUse {
    fn noun(self) -> &'static str {
        match self {
            DataUse::Disk => "a pool's disk",
            DataUse::Image => "an image",
            DataUse::CephConf => "a Ceph configuration file",
        }
    }
}

/// The rules, from the daemon's configuration.
#[derive(Debug, Clone)]
pub struct DataPaths {
    state_dir: PathBuf,
    allowed: Vec<PathBuf>,
}

impl DataPaths {
    /// `allowed` empty: anywhere but the daemon's own state.
    pub fn new(state_dir: &Path, allowed: &[PathBuf]) -> DataPaths {
        DataPaths {
            state_dir: state_dir.to_path_buf(),
            allowed: allowed.to_vec(),
        }
    }

    /// Whether anything outside the state directory is refused too.
    pub fn confined(&self) -> bool {
        !self.allowed.is_empty()
    }

    /// Refuses the open file `f`, which the caller named `named`, for `what`.
    pub fn check(&self, f: &impl AsFd, named: &Path, what: DataUse) -> Result<(), String> {
        let Some(real) = real_path(f) else {
            return Err(format!("cannot tell where {} is", named.display()));
        };
        self.check_real(&real, named, what)
    }

    fn check_real(&self, real: &Path, named: &Path, what: DataUse) -> Result<(), String> {
        let state = canonical(&self.state_dir);
        let own_disks = what == DataUse::Disk && real.starts_with(state.join("disks"));
        if real.starts_with(&state) && !own_disks {
            return Err(format!(
                "{} is {}, inside the daemon's state directory {}: use a file elsewhere",
                named.display(),
                real.display(),
                state.display()
            ));
        }
        if self.allowed.is_empty() || self.allowed.iter().any(|a| real.starts_with(canonical(a))) {
            return Ok(());
        }
        Err(format!(
            "{} is {}, outside the places this daemon's configuration lets the API name as {} \
             (data_paths: {}); a block device counts by its kernel name, whatever link named it",
            named.display(),
            real.display(),
            what.noun(),
            self.allowed
                .iter()
                .map(|a| a.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// Where an open file really is (the link the kernel keeps for its descriptor): whatever
/// names led to it, symbolic links, `/proc/self/fd/N` or a directory renamed meanwhile.
pub fn real_path(f: &impl AsFd) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_fd().as_raw_fd())).ok()
}

/// A configured directory as the kernel names it (links resolved); as given if it cannot be
/// resolved (then nothing opened is inside it).
fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(p: &Path) -> std::fs::File {
        std::fs::File::open(p).unwrap()
    }

    #[test]
    fn the_state_directory_is_refused_but_for_the_demos_disks() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        std::fs::create_dir_all(state.join("disks")).unwrap();
        std::fs::create_dir_all(state.join("pools")).unwrap();
        let disk = state.join("disks").join("d0.img");
        let meta = state.join("pools").join("meta.sst");
        let outside = t.path().join("d1.img");
        for f in [&disk, &meta, &outside] {
            std::fs::write(f, b"x").unwrap();
        }
        let paths = DataPaths::new(&state, &[]);
        paths.check(&open(&disk), &disk, DataUse::Disk).unwrap();
        let e = paths.check(&open(&disk), &disk, DataUse::Image).unwrap_err();
        assert!(e.contains("inside the daemon's state directory"), "{e}");
        let e = paths.check(&open(&meta), &meta, DataUse::Disk).unwrap_err();
        assert!(e.contains("inside the daemon's state directory"), "{e}");
        paths.check(&open(&outside), &outside, DataUse::Disk).unwrap();
        paths.check(&open(&outside), &outside, DataUse::Image).unwrap();
        // Reached through a link from outside: the file opened counts.
        let link = t.path().join("link.img");
        std::os::unix::fs::symlink(&meta, &link).unwrap();
        let e = paths.check(&open(&link), &link, DataUse::Disk).unwrap_err();
        assert!(e.contains("inside the daemon's state directory"), "{e}");
    }

    #[test]
    fn with_data_paths_only_files_inside_them_are_taken_whatever_link_names_them() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        let allowed = t.path().join("san");
        let other = t.path().join("other");
        for d in [&state, &allowed, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        let inside = allowed.join("a.img");
        let outside = other.join("b.img");
        std::fs::write(&inside, b"x").unwrap();
        std::fs::write(&outside, b"x").unwrap();
        // A directory given through a link counts as where it leads.
        let allowed_link = t.path().join("san-link");
        std::os::unix::fs::symlink(&allowed, &allowed_link).unwrap();
        let paths = DataPaths::new(&state, &[allowed_link]);
        for what in [DataUse::Disk, DataUse::Image] {
            paths.check(&open(&inside), &inside, what).unwrap();
            let e = paths.check(&open(&outside), &outside, what).unwrap_err();
            assert!(e.contains("outside the places") && e.contains("data_paths"), "{e}");
            // A link inside an allowed directory to a file outside it leads nowhere.
            let link = allowed.join(format!("link-{what:?}"));
            std::os::unix::fs::symlink(&outside, &link).unwrap();
            let e = paths.check(&open(&link), &link, what).unwrap_err();
            assert!(e.contains("outside the places"), "{e}");
            // Nor does a sibling whose name merely begins like an allowed directory's.
            let sibling = t.path().join(format!("san2-{what:?}.img"));
            std::fs::write(&sibling, b"x").unwrap();
            assert!(paths.check(&open(&sibling), &sibling, what).is_err());
        }
        // The demo's disks are not allowed by themselves once data_paths is set.
        std::fs::create_dir_all(state.join("disks")).unwrap();
        let demo = state.join("disks").join("d0.img");
        std::fs::write(&demo, b"x").unwrap();
        assert!(paths.check(&open(&demo), &demo, DataUse::Disk).is_err());
    }
}
