//! Where a caller of the API may point the daemon at data: the files and block devices it
//! makes pools' disks of, the images it reads into vdisks or writes them to, and the Ceph
//! configuration file of a pool on RADOS.
//!
//! Found without being opened for I/O, then checked on the file found (the name the kernel
//! keeps for its descriptor), which is the one then used: no symbolic link,
//! `/proc/self/fd/N` or directory renamed meanwhile leads anywhere else. The daemon's own state (pools' metadata, keys, configuration) is never one
//! of them, except `<state dir>/disks`, where the demo makes its disks; and where the
//! configuration lists `data_paths`, nothing outside those is either, so that the API's token
//! no longer reaches every file the daemon could open.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

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

    /// Refuses the open file `f`, which the caller named `named`, for `what`. Where the
    /// kernel says it is must be that very file (the same device and inode): a name seen from
    /// another mount namespace (`/proc/PID/root/...`), or a file deleted since, is refused.
    pub fn check(&self, f: &impl AsFd, named: &Path, what: DataUse) -> Result<(), String> {
        let real = where_is(f, named)?;
        self.check_real(&real, named, what)
    }

    /// Finds `named` without opening it for I/O (`O_PATH`: no device is woken, no FIFO
    /// waited on) and checks it for `what`: with `data_paths`, as named inside them first, so
    /// that nothing outside is even looked at; then the file found as `check` does, and its
    /// kind (a regular file or, for a disk or an image, a block device). The caller opens
    /// the file for I/O through the descriptor (`through`), so that no name leads elsewhere
    /// in between.
    pub fn locate(&self, named: &Path, what: DataUse) -> Result<OwnedFd, String> {
        self.check_named(named, what)?;
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(named)
            .map_err(|e| format!("cannot open {}: {e}", named.display()))?;
        let kind = f
            .metadata()
            .map_err(|e| format!("cannot read what {} is: {e}", named.display()))?
            .file_type();
        let device = what != DataUse::CephConf && kind.is_block_device();
        if !kind.is_file() && !device {
            return Err(format!(
                "{} is not a regular file{}",
                named.display(),
                if what == DataUse::CephConf {
                    ""
                } else {
                    " or a block device"
                }
            ));
        }
        self.check(&f, named, what)?;
        Ok(f.into())
    }

    /// For a file to be made at `named`: its directory found (`O_PATH`) and checked as
    /// `locate` checks a file, and the path to create it by, through that directory's
    /// descriptor (kept alive by the one returned), so that no link or rename between the
    /// check and the creation leads elsewhere.
    pub fn locate_new(&self, named: &Path, what: DataUse) -> Result<(OwnedFd, PathBuf), String> {
        self.check_named(named, what)?;
        let (Some(dir), Some(name)) = (named.parent(), named.file_name()) else {
            return Err(format!("{} names no file", named.display()));
        };
        let d = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)
            .map_err(|e| format!("cannot open the directory {}: {e}", dir.display()))?;
        let real = where_is(&d, dir)?;
        self.check_real(&real.join(name), named, what)?;
        let through = through(&d).join(name);
        Ok((d.into(), through))
    }

    /// `named` must be absolute; with `data_paths`, as given (without `..`) inside one of
    /// them, or a name the system gives a device (`/dev/disk/...`, `/dev/mapper/...`, whose
    /// names say nothing one could not list; the device it leads to must then be inside
    /// them). Not any name under /dev: `/dev/fd/N` leads to the daemon's own open files.
    pub fn check_named(&self, named: &Path, what: DataUse) -> Result<(), String> {
        if !named.is_absolute() {
            return Err(format!("{} must be an absolute path", named.display()));
        }
        if !self.confined() {
            return Ok(());
        }
        if named.components().any(|c| c == Component::ParentDir) {
            return Err(format!(
                "{} must be a path without '..' where data_paths are configured",
                named.display()
            ));
        }
        let device = what != DataUse::CephConf && (named.starts_with("/dev/disk") || named.starts_with("/dev/mapper"));
        if device
            || self
                .allowed
                .iter()
                .any(|a| named.starts_with(a) || named.starts_with(canonical(a)))
        {
            return Ok(());
        }
        Err(self.outside(named, named, what))
    }

    /// Refuses what a Ceph configuration file the API named (`conf`) sets of the files its
    /// client reads, writes or loads code from (`changed`: option, value as the client would
    /// use it): keyrings must be where a configuration file may be, and where `data_paths`
    /// are configured, where the client makes files (a log, an admin socket) and loads
    /// plugins from are left as they are; without them, files are not made in the daemon's
    /// state. Otherwise a file the token's holder can write would have the daemon read,
    /// append to or load whatever it names.
    ///
    /// The keys' files it sets are returned found: the client is to read the one it would
    /// use through its descriptor ([`PinnedOption::value`]), so that no link put in its
    /// place after this check leads it elsewhere.
    pub fn vet_ceph_options(&self, conf: &str, changed: &[(&str, String)]) -> Result<Vec<PinnedOption>, String> {
        let mut pinned = Vec::new();
        for (option, value) in changed {
            let why = |e: String| format!("the Ceph configuration file {conf} sets {option} = {value}: {e}");
            match *option {
                "keyring" | "keyfile" => {
                    // As librados splits a list of files to search (`=` among them), and
                    // reads the first there is.
                    let mut first = None;
                    for p in value.split([',', ';', '=', ' ', '\t']).filter(|p| !p.is_empty()) {
                        let p = Path::new(p);
                        self.check_named(p, DataUse::CephConf).map_err(why)?;
                        if p.symlink_metadata().is_ok() {
                            let found = self.locate(p, DataUse::CephConf).map_err(why)?;
                            first.get_or_insert(found);
                        }
                    }
                    pinned.push(PinnedOption {
                        option: option.to_string(),
                        file: first,
                    });
                }
                "plugin_dir" | "erasure_code_dir" if self.confined() => {
                    return Err(why(format!(
                        "the client loads code from there; where data_paths are configured, only {} may change it",
                        crate::rados_pools::DEFAULT_CEPH_CONF
                    )));
                }
                "plugin_dir" | "erasure_code_dir" => {}
                // Whoever may write to the socket may `config set` the options vetted here.
                "admin_socket_mode" => match u32::from_str_radix(value, 8) {
                    Ok(mode) if mode & 0o022 == 0 => {}
                    _ => {
                        return Err(why(
                            "the client's admin socket would let other users than the daemon's change its \
                             options (its log, its keyrings): leave it unset, or give no write permission \
                             to group or others"
                                .into(),
                        ))
                    }
                },
                _ if value.is_empty() => {}
                // The client makes these by name, following a link in its place: one put
                // there between this check and its open would lead anywhere (a log appended
                // to /etc/cron.d). Without data_paths the API may name any file anyway.
                _ if self.confined() => {
                    return Err(why(format!(
                        "the client makes that file by its name; where data_paths are configured, only {} \
                         may say where (leave it unset in a file named through the API)",
                        crate::rados_pools::DEFAULT_CEPH_CONF
                    )));
                }
                _ => {
                    self.locate_new(Path::new(value), DataUse::CephConf).map_err(why)?;
                }
            }
        }
        Ok(pinned)
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
        Err(self.outside(named, real, what))
    }

    fn outside(&self, named: &Path, real: &Path, what: DataUse) -> String {
        let is = if named == real {
            " is".to_string()
        } else {
            format!(" is {},", real.display())
        };
        format!(
            "{}{is} outside the places this daemon's configuration lets the API name as {} \
             (data_paths: {}); a block device counts by its kernel name, whatever link named it",
            named.display(),
            what.noun(),
            self.allowed
                .iter()
                .map(|a| a.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// A Ceph option naming files to read, kept to the file checked.
#[derive(Debug)]
pub struct PinnedOption {
    pub option: String,
    /// The first of the files it names that there was, found and checked (`O_PATH`); none
    /// if there was none, so that none made later is read either.
    pub file: Option<OwnedFd>,
}

impl PinnedOption {
    /// The value to give the option instead, valid while this lives: the file through its
    /// descriptor, or nothing.
    pub fn value(&self) -> String {
        self.file
            .as_ref()
            .map(|f| through(f).display().to_string())
            .unwrap_or_default()
    }
}

/// Where the open file `f` (named `named`) is, as the kernel names it, once that name is
/// known to lead to this very file (the same device and inode): not a name seen from another
/// mount namespace (`/proc/PID/root/...`), nor one of a file deleted since.
fn where_is(f: &impl AsFd, named: &Path) -> Result<PathBuf, String> {
    let unknown = || format!("cannot tell where {} is", named.display());
    let real = real_path(f).ok_or_else(unknown)?;
    let opened = File::from(f.as_fd().try_clone_to_owned().map_err(|_| unknown())?)
        .metadata()
        .map_err(|_| unknown())?;
    match std::fs::metadata(&real) {
        Ok(m) if (m.dev(), m.ino()) == (opened.dev(), opened.ino()) => Ok(real),
        _ => Err(format!(
            "{} is not where the kernel names it ({}): give a path this daemon sees",
            named.display(),
            real.display()
        )),
    }
}

/// The name through which an open descriptor (an `O_PATH` one included) reaches its file.
pub fn through(f: &impl AsFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_fd().as_raw_fd()))
}

/// Where an open file really is (the link the kernel keeps for its descriptor): whatever
/// names led to it, symbolic links, `/proc/self/fd/N` or a directory renamed meanwhile.
pub fn real_path(f: &impl AsFd) -> Option<PathBuf> {
    std::fs::read_link(through(f)).ok()
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
    fn a_ceph_configuration_file_may_name_files_only_where_it_may_be() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        let data = t.path().join("data");
        let elsewhere = t.path().join("elsewhere");
        for d in [&state, &data, &elsewhere] {
            std::fs::create_dir_all(d).unwrap();
        }
        let keyring = data.join("client.keyring");
        std::fs::write(&keyring, b"[client.admin]").unwrap();
        let secret = elsewhere.join("secret");
        std::fs::write(&secret, b"x").unwrap();
        let link = data.join("link.keyring");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let paths = DataPaths::new(&state, std::slice::from_ref(&data));
        let at = |p: &Path| p.display().to_string();
        let vet = |o: &str, v: String| paths.vet_ceph_options("/data/ceph.conf", &[(o, v)]);

        // Inside the data paths, or not there yet but for the places searched: taken, and
        // kept to the file checked, the first there is, whatever takes its name later.
        let pinned = vet(
            "keyring",
            format!(
                "{},{},{}",
                at(&data.join("none")),
                at(&keyring),
                at(&data.join("ceph.conf"))
            ),
        )
        .unwrap();
        assert_eq!(pinned.len(), 1);
        assert_eq!(pinned[0].option, "keyring");
        std::fs::rename(&keyring, data.join("moved")).unwrap();
        std::os::unix::fs::symlink(&secret, &keyring).unwrap();
        assert_eq!(std::fs::read(pinned[0].value()).unwrap(), b"[client.admin]");
        std::fs::remove_file(&keyring).unwrap();
        std::fs::rename(data.join("moved"), &keyring).unwrap();
        // None there: none read, even one made later.
        let pinned = vet("keyfile", at(&data.join("none"))).unwrap();
        assert_eq!(pinned[0].value(), "");
        assert!(vet("log_file", String::new()).unwrap().is_empty());
        // A list split on '=' too, as librados splits it.
        let e = vet("keyring", format!("{}={}", at(&data.join("none")), at(&secret))).unwrap_err();
        assert!(e.contains("outside the places"), "{e}");
        // Files the client makes, even inside: a link could take their place before it does.
        for (o, f) in [
            ("admin_socket", "client.asok"),
            ("log_file", "client.log"),
            ("heartbeat_file", "client.heartbeat"),
            ("run_dir", "run"),
        ] {
            let e = vet(o, at(&data.join(f))).unwrap_err();
            assert!(e.contains("makes that file by its name"), "{o}: {e}");
        }
        // Elsewhere, through a link, in the daemon's state, or code: refused, saying which.
        let e = vet("keyring", format!("{},{}", at(&keyring), at(&secret))).unwrap_err();
        assert!(e.contains("sets keyring") && e.contains("outside the places"), "{e}");
        let e = vet("keyfile", at(&link)).unwrap_err();
        assert!(e.contains("outside the places"), "{e}");
        let e = vet("admin_socket", at(&elsewhere.join("a.asok"))).unwrap_err();
        assert!(e.contains("sets admin_socket"), "{e}");
        let e = vet("log_file", "/etc/cron.d/tessera".into()).unwrap_err();
        assert!(e.contains("makes that file"), "{e}");
        let e = vet("keyring", at(&data.join("../elsewhere/secret"))).unwrap_err();
        assert!(e.contains("without '..'"), "{e}");
        let e = vet("plugin_dir", at(&data)).unwrap_err();
        assert!(e.contains("loads code"), "{e}");
        let e = vet("heartbeat_file", "/etc/nologin".into()).unwrap_err();
        assert!(e.contains("sets heartbeat_file"), "{e}");
        vet("admin_socket_mode", "0750".into()).unwrap();
        for mode in ["0777", "0660", "0602", "rw-rw-rw-", "-1"] {
            let e = vet("admin_socket_mode", mode.into()).unwrap_err();
            assert!(e.contains("other users"), "{mode}: {e}");
        }
        let unconfined = DataPaths::new(&state, &[]);
        let e = unconfined
            .vet_ceph_options("/c", &[("log_file", at(&state.join("x.log")))])
            .unwrap_err();
        assert!(e.contains("inside the daemon's state directory"), "{e}");
        let e = unconfined
            .vet_ceph_options("/c", &[("log_file", at(&elsewhere.join("../state/x.log")))])
            .unwrap_err();
        assert!(e.contains("inside the daemon's state directory"), "{e}");
        unconfined
            .vet_ceph_options(
                "/c",
                &[("plugin_dir", at(&elsewhere)), ("log_file", at(&elsewhere.join("x")))],
            )
            .unwrap();
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

    /// Finding a file opens it for no I/O: a FIFO is refused without waiting for a writer,
    /// and with data_paths, a name outside them is refused before it is even looked up.
    #[test]
    fn locating_opens_nothing_and_looks_nowhere_outside() {
        let t = tempfile::tempdir().unwrap();
        let san = t.path().join("san");
        std::fs::create_dir_all(&san).unwrap();
        let fifo = san.join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let paths = DataPaths::new(&t.path().join("state"), &[san.clone()]);
        for what in [DataUse::Disk, DataUse::Image, DataUse::CephConf] {
            let e = paths.locate(&fifo, what).unwrap_err();
            assert!(e.contains("is not a regular file"), "{e}");
        }
        // Missing or not, a name outside is refused the same way: nothing is told of it.
        for outside in ["/etc/shadow", "/no/such/file"] {
            let e = paths.locate(Path::new(outside), DataUse::Image).unwrap_err();
            assert!(e.contains("outside the places"), "{e}");
        }
        let e = paths.locate(&san.join("../state/x"), DataUse::Image).unwrap_err();
        assert!(e.contains("without '..'"), "{e}");
        // Without data_paths, '..' is the kernel's business (the checks follow the file).
        let anywhere = DataPaths::new(&t.path().join("state"), &[]);
        let up = san.join("../san/new.img");
        assert!(anywhere.locate_new(&up, DataUse::Image).is_ok());
        // A device is named as the system names it (/dev/disk/by-id links): the name passes,
        // and the device it leads to is checked; a Ceph configuration is never one.
        paths
            .check_named(Path::new("/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"), DataUse::Disk)
            .unwrap();
        assert!(paths
            .check_named(Path::new("/dev/disk/by-id/x"), DataUse::CephConf)
            .unwrap_err()
            .contains("outside the places"));
        // Nor does any other name under /dev: /dev/fd/N is one of the daemon's own files.
        assert!(paths
            .check_named(Path::new("/dev/fd/3"), DataUse::Image)
            .unwrap_err()
            .contains("outside the places"));
        // A file made inside, through its directory; not one outside, nor through a link
        // inside to a directory outside.
        let (_d, by) = paths.locate_new(&san.join("new.img"), DataUse::Image).unwrap();
        std::fs::write(&by, b"x").unwrap();
        assert!(san.join("new.img").exists());
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, san.join("out")).unwrap();
        let e = paths
            .locate_new(&san.join("out").join("x.img"), DataUse::Image)
            .unwrap_err();
        assert!(e.contains("outside the places"), "{e}");
    }

    /// A file whose name the kernel gives is not that file (deleted since; or seen from
    /// another mount namespace) is refused.
    #[test]
    fn a_file_not_where_the_kernel_names_it_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("gone.img");
        std::fs::write(&f, b"x").unwrap();
        let open = std::fs::File::open(&f).unwrap();
        std::fs::remove_file(&f).unwrap();
        let e = DataPaths::new(&t.path().join("state"), &[])
            .check(&open, &f, DataUse::Image)
            .unwrap_err();
        assert!(e.contains("is not where the kernel names it"), "{e}");
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
