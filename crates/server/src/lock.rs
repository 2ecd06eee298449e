//! One daemon per state directory: an exclusive lock on `<state dir>/tessera.lock`, held for the
//! daemon's life and released by the kernel however it ends (a SIGKILL included).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

pub struct StateLock {
    _file: File,
}

impl StateLock {
    pub fn acquire(state_dir: &Path) -> Result<StateLock, String> {
        let path = state_dir.join("tessera.lock");
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut holder = String::new();
            let _ = f.read_to_string(&mut holder);
            let holder = holder.trim();
            let who = if holder.is_empty() {
                String::new()
            } else {
                format!(" (pid {holder})")
            };
            return Err(format!(
                "another tessera daemon{who} already serves the state directory {}; stop it first, or \
                 give this one another --state-dir",
                state_dir.display()
            ));
        }
        let _ = f.set_len(0);
        let _ = f.rewind();
        let _ = writeln!(f, "{}", std::process::id());
        let _ = f.sync_all();
        Ok(StateLock { _file: f })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(d.path()).unwrap();
        let e = StateLock::acquire(d.path()).err().unwrap();
        assert!(e.contains("another tessera daemon"), "{e}");
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        drop(first);
        // Another test of this process may be forking a child meanwhile, which holds a copy
        // of the descriptor (and so the lock) until it execs and closes it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while let Err(e) = StateLock::acquire(d.path()) {
            assert!(std::time::Instant::now() < deadline, "not released: {e}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
