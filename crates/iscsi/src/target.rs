//! Targets and their LUNs, the sessions logged in to them, and the portal that accepts
//! connections.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tessera_scsi::Lun;

use crate::auth::Access;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

/// An iSCSI target: a name and the LUNs it presents.
pub struct Target {
    pub iqn: String,
    pub luns: RwLock<BTreeMap<u64, Arc<Lun>>>,
    /// Who may log in; read at each login, so a change applies to the next one.
    access: RwLock<Access>,
}

impl Target {
    pub fn new(iqn: &str) -> Target {
        Target {
            iqn: iqn.to_string(),
            luns: RwLock::new(BTreeMap::new()),
            access: RwLock::new(Access::default()),
        }
    }

    pub fn access(&self) -> Access {
        self.access.read().clone()
    }

    pub fn set_access(&self, a: Access) {
        *self.access.write() = a;
    }

    pub fn lun(&self, n: u64) -> Option<Arc<Lun>> {
        self.luns.read().get(&n).cloned()
    }

    pub fn lun_numbers(&self) -> Vec<u64> {
        self.luns.read().keys().copied().collect()
    }
}

/// A logged-in session, as far as other logins need to know it: reinstating a session (same
/// initiator, ISID and target) closes the old one.
struct SessionEntry {
    tsih: u16,
    close: watch::Sender<bool>,
}

#[derive(Default)]
pub struct Registry {
    targets: RwLock<BTreeMap<String, Arc<Target>>>,
    sessions: Mutex<HashMap<(String, [u8; 6], String), SessionEntry>>,
    next_tsih: AtomicU16,
    next_nexus: std::sync::atomic::AtomicU64,
}

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    pub fn add_target(&self, t: Target) -> Arc<Target> {
        let t = Arc::new(t);
        self.targets.write().insert(t.iqn.clone(), t.clone());
        t
    }

    pub fn remove_target(&self, iqn: &str) -> Option<Arc<Target>> {
        self.targets.write().remove(iqn)
    }

    pub fn target(&self, iqn: &str) -> Option<Arc<Target>> {
        self.targets.read().get(iqn).cloned()
    }

    pub fn targets(&self) -> Vec<Arc<Target>> {
        self.targets.read().values().cloned().collect()
    }

    /// Registers a new session, closing one with the same identity; returns its TSIH and the
    /// receiver that tells it to close.
    pub(crate) fn open_session(&self, initiator: &str, isid: [u8; 6], target: &str) -> (u16, watch::Receiver<bool>) {
        let mut tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if tsih == 0 {
            tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        }
        let (tx, rx) = watch::channel(false);
        let key = (initiator.to_string(), isid, target.to_string());
        if let Some(old) = self.sessions.lock().insert(key, SessionEntry { tsih, close: tx }) {
            info!(initiator, tsih = old.tsih, "session reinstated: closing the old one");
            let _ = old.close.send(true);
        }
        (tsih, rx)
    }

    pub(crate) fn close_session(&self, initiator: &str, isid: [u8; 6], target: &str, tsih: u16) {
        let key = (initiator.to_string(), isid, target.to_string());
        let mut s = self.sessions.lock();
        if s.get(&key).map(|e| e.tsih) == Some(tsih) {
            s.remove(&key);
        }
    }

    /// A new I_T nexus identifier, never reused while the daemon runs.
    pub(crate) fn new_nexus(&self) -> u64 {
        self.next_nexus.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn session_count(&self) -> usize {
        self.sessions.lock().len()
    }
}

/// Accepts connections on `listener` until the process ends; each runs on its own task.
pub async fn serve(listener: TcpListener, reg: Arc<Registry>) {
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => {
                let _ = sock.set_nodelay(true);
                let local = sock
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                let reg = reg.clone();
                tokio::spawn(async move {
                    if let Err(e) = crate::conn::run(sock, local, reg).await {
                        info!(%peer, error = %e, "iSCSI connection ended");
                    }
                });
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}
