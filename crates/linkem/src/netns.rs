//! Network namespaces by name, as `ip netns` keeps them (`/run/netns/NAME`): made and removed
//! with `ip`, entered by one thread with setns(2) so that the sockets it opens live there.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;

/// A network namespace this process made; removed when dropped.
pub struct Netns {
    pub name: String,
}

/// Runs `ip ARGS`, turning a failure into an error that says what was run.
pub fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run 'ip' (Debian iproute2): {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Netns {
    /// Makes the namespace `name` with its loopback up. One left by an earlier run that
    /// died is removed first.
    pub fn create(name: &str) -> io::Result<Netns> {
        if std::path::Path::new("/run/netns").join(name).exists() {
            let _ = ip(&["netns", "del", name]);
        }
        ip(&["netns", "add", name])?;
        let ns = Netns { name: name.to_string() };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Moves the calling thread into the namespace: sockets it opens from now on are there.
    pub fn enter(&self) -> io::Result<()> {
        enter(&self.name)
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

/// Moves the calling thread into the namespace `name`.
pub fn enter(name: &str) -> io::Result<()> {
    let f = File::open(std::path::Path::new("/run/netns").join(name))
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {name}: {e}")))?;
    // SAFETY: a valid descriptor of a network namespace; affects this thread only.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}
