//! The replication listener's keys, read again whenever their file changes (looked at before
//! each connection is taken, and at every tick): a key taken out of the file lets no peer in
//! from then on, and the cycles under way with it are cut, without a restart of the daemon
//! (which would end every host's iSCSI and NBD sessions too).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_replication::Transport;

/// What tells a file's versions apart without reading it: its inode, size and change time
/// (an editor that writes in place, one that renames a new file over it, a copy).
type Stamp = (u64, u64, i64, i64);

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.size(), m.ctime(), m.ctime_nsec()))
}

pub(crate) struct ListenerKeys {
    path: PathBuf,
    congestion: String,
    now: parking_lot::Mutex<Keys>,
}

struct Keys {
    stamp: Option<Stamp>,
    transport: Arc<Transport>,
    identities: BTreeSet<String>,
}

/// The keys read again: identities no longer in the file, or why the file was not taken.
pub(crate) enum Reread {
    Same,
    Revoked(Vec<String>),
    Refused(String),
}

impl ListenerKeys {
    pub(crate) fn load(path: &Path, congestion: &str) -> Result<ListenerKeys, String> {
        let before = stamp(path);
        let (transport, identities) = read(path, congestion)?;
        Ok(ListenerKeys {
            path: path.to_path_buf(),
            congestion: congestion.to_string(),
            now: parking_lot::Mutex::new(Keys {
                stamp: before,
                transport,
                identities,
            }),
        })
    }

    /// The transport new connections are taken with.
    pub(crate) fn transport(&self) -> Arc<Transport> {
        self.now.lock().transport.clone()
    }

    /// Whether the key of `identity` is still in the file (as last read).
    pub(crate) fn holds(&self, identity: &str) -> bool {
        self.now.lock().identities.contains(identity)
    }

    /// Reads the file again if it changed since it was last read. A file that cannot be read
    /// or holds no valid key is not taken: the keys stay as they were (refusing every peer
    /// because of a half-written file would stop replication), and the caller says why.
    pub(crate) fn reread(&self) -> Reread {
        let now = stamp(&self.path);
        let mut k = self.now.lock();
        if now == k.stamp {
            return Reread::Same;
        }
        k.stamp = now;
        match read(&self.path, &self.congestion) {
            Ok((transport, identities)) => {
                let revoked = k.identities.difference(&identities).cloned().collect();
                k.transport = transport;
                k.identities = identities;
                Reread::Revoked(revoked)
            }
            Err(e) => Reread::Refused(e),
        }
    }
}

fn read(path: &Path, congestion: &str) -> Result<(Arc<Transport>, BTreeSet<String>), String> {
    let keys = tessera_psk::read_psk_file(path)?;
    let identities = keys.keys().cloned().collect();
    let transport = Transport::with_keys(keys, congestion, tessera_replication::transport::SILENCE)?;
    Ok((Arc::new(transport), identities))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_taken_out_of_the_file_is_known_revoked_and_a_broken_file_is_not_taken() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("keys");
        let (a, c) = (
            format!("site-a:{}\n", "a1".repeat(32)),
            format!("site-c:{}\n", "c3".repeat(32)),
        );
        std::fs::write(&p, format!("{a}{c}")).unwrap();
        let k = ListenerKeys::load(&p, "cubic").unwrap();
        assert!(k.holds("site-a") && k.holds("site-c"));
        assert!(matches!(k.reread(), Reread::Same));
        std::fs::write(&p, &a).unwrap();
        match k.reread() {
            Reread::Revoked(r) => assert_eq!(r, vec!["site-c".to_string()]),
            _ => panic!("not read again"),
        }
        assert!(k.holds("site-a") && !k.holds("site-c"));
        std::fs::write(&p, "site-a:not-hex\n").unwrap();
        assert!(matches!(k.reread(), Reread::Refused(e) if e.contains("line 1")));
        assert!(k.holds("site-a"), "the keys stay as they were");
        std::fs::write(&p, format!("{a}{c}")).unwrap();
        assert!(matches!(k.reread(), Reread::Revoked(r) if r.is_empty()));
        assert!(k.holds("site-c"));
    }
}
