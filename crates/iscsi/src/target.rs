//! Targets and their LUNs, the sessions logged in to them, and the loop that accepts a
//! portal's connections.

use std::collections::{BTreeMap, HashMap};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use tessera_scsi::{Lun, LunScope};

use crate::auth::Access;
use crate::limits::{Limits, WriteBudget};
use tracing::{info, warn};

/// An iSCSI target: a name and the LUNs it presents.
pub struct Target {
    pub iqn: String,
    pub luns: RwLock<BTreeMap<u64, Arc<Lun>>>,
    /// Who may log in; read at each login. [`Registry::set_access`] changes it for a target
    /// that serves, and ends the sessions it no longer admits.
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

    /// Sets the access rules of a target no session can be logged in to yet (one being made).
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

/// A session's EXTENDED COPY may name the LUNs of its own target, and no other: the session
/// passed this target's ACL and CHAP at login.
impl LunScope for Target {
    fn lun_by_naa(&self, naa: &[u8; 16]) -> Option<Arc<Lun>> {
        self.luns.read().values().find(|l| l.naa() == naa).cloned()
    }
}

/// A logged-in session, as far as other logins need to know it: reinstating a session (same
/// initiator, ISID and target) closes the old one.
struct SessionEntry {
    tsih: u16,
    /// Its I_T nexus identifier.
    nexus: u64,
    close: Arc<Closer>,
}

/// A session registered at login.
pub(crate) struct Opened {
    pub tsih: u16,
    pub nexus: u64,
    pub close: Arc<Closer>,
}

/// Why a login's session was not registered.
pub(crate) enum NotOpened {
    /// Past the initiator's or the target's session limit (which, said here).
    Limit(String),
    /// The target's ACL changed during the login and no longer admits the initiator.
    NotAdmitted,
    /// The target was removed during the login.
    Gone,
}

/// Ends a session from outside (when a new login reinstates it) by shutting its socket down,
/// which ends the blocking read of whichever thread is reading it; and lets the session that
/// reinstated it wait until it has finished.
#[derive(Default)]
pub struct Closer {
    /// Shared with the session's nexus (`Nexus::ended_by`).
    closed: Arc<AtomicBool>,
    sock: Mutex<Option<TcpStream>>,
    /// The session is over: its commands have returned and its LUNs know the nexus is lost.
    finished: Mutex<bool>,
    finished_cv: Condvar,
    /// The session this one reinstated, until this one has waited for it.
    replaces: Mutex<Option<Arc<Closer>>>,
}

/// How long a reinstating session waits for the session it replaces to finish before it
/// runs commands anyway (a command of the old session stuck on a disk, say).
const REINSTATEMENT_WAIT: Duration = Duration::from_secs(20);

impl Closer {
    pub fn close(&self) {
        // The flag first: a socket attached after this sees it and is not served.
        self.closed.store(true, Ordering::SeqCst);
        if let Some(s) = self.sock.lock().as_ref() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// The flag `close` sets, for the session's nexus.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.closed.clone()
    }

    /// Hands over the session's socket; false if the session was closed before it arrived.
    pub fn attach(&self, s: &TcpStream) -> std::io::Result<bool> {
        let mut slot = self.sock.lock();
        if self.closed.load(Ordering::SeqCst) {
            return Ok(false);
        }
        *slot = Some(s.try_clone()?);
        Ok(true)
    }

    /// The session is over; a session that reinstated it may run its commands.
    pub fn finish(&self) {
        *self.finished.lock() = true;
        self.finished_cv.notify_all();
    }

    /// Waits until the session this one reinstated (if any) has finished, so that what its
    /// end does to the LUNs (releasing its SPC-2 reservation, the unit attention of the nexus
    /// loss) comes before this session's first command, as RFC 7143 has a reinstatement end
    /// the old session's tasks first.
    pub fn wait_for_replaced(&self) {
        let Some(old) = self.replaces.lock().take() else {
            return;
        };
        let mut finished = old.finished.lock();
        let deadline = Instant::now() + REINSTATEMENT_WAIT;
        while !*finished {
            if old.finished_cv.wait_until(&mut finished, deadline).timed_out() {
                warn!("the reinstated session has not finished; the new one goes on");
                return;
            }
        }
    }
}

#[derive(Default)]
pub struct Registry {
    targets: RwLock<BTreeMap<String, Arc<Target>>>,
    sessions: Mutex<HashMap<(String, [u8; 6], String), SessionEntry>>,
    next_tsih: AtomicU16,
    next_nexus: std::sync::atomic::AtomicU64,
    /// Every portal the target listens on, for SendTargets.
    portals: RwLock<Vec<SocketAddr>>,
    limits: RwLock<Limits>,
    /// Write buffers held by every session together.
    write_total: Arc<WriteBudget>,
    /// Told of each login refused for who the initiator is (outside a target's ACL, CHAP not
    /// passed): the daemon makes events of them.
    refusals: RwLock<Option<RefusalObserver>>,
}

/// A login refused for the initiator's identity.
#[derive(Debug, Clone, PartialEq)]
pub struct LoginRefusal {
    pub peer: SocketAddr,
    pub initiator: Option<String>,
    pub target: Option<String>,
    pub reason: String,
}

pub type RefusalObserver = Arc<dyn Fn(&LoginRefusal) + Send + Sync>;

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    pub fn add_target(&self, t: Target) -> Arc<Target> {
        let t = Arc::new(t);
        self.targets.write().insert(t.iqn.clone(), t.clone());
        t
    }

    /// Removes target `iqn` and ends the sessions logged in to it: a session keeps its own
    /// reference to its target, and would otherwise go on reading and writing its LUNs.
    pub fn remove_target(&self, iqn: &str) -> Option<Arc<Target>> {
        let sessions = self.sessions.lock();
        let removed = self.targets.write().remove(iqn);
        for ((_, _, target), e) in sessions.iter() {
            if target == iqn {
                e.close.close();
            }
        }
        removed
    }

    pub fn target(&self, iqn: &str) -> Option<Arc<Target>> {
        self.targets.read().get(iqn).cloned()
    }

    pub fn targets(&self) -> Vec<Arc<Target>> {
        self.targets.read().values().cloned().collect()
    }

    pub fn limits(&self) -> Limits {
        *self.limits.read()
    }

    /// Who is told of refused logins.
    pub fn on_refusal(&self, observer: RefusalObserver) {
        *self.refusals.write() = Some(observer);
    }

    pub(crate) fn refused(&self, r: &LoginRefusal) {
        if let Some(o) = self.refusals.read().as_ref() {
            o(r);
        }
    }

    /// Applies to the connections, logins and writes that come next.
    pub fn set_limits(&self, l: Limits) {
        *self.limits.write() = l;
    }

    /// Bytes of write buffers all sessions hold now.
    pub fn write_bytes_in_use(&self) -> usize {
        self.write_total.used()
    }

    pub(crate) fn write_total(&self) -> &Arc<WriteBudget> {
        &self.write_total
    }

    /// Registers a new session, closing one with the same identity; returns its TSIH, its
    /// nexus and what closes it. A normal session past the limit of its initiator or its
    /// target is refused (which, said); one that reinstates a session takes its place. The
    /// target (None: a discovery session) is checked again here, under the lock that
    /// [`Registry::set_access`] and [`Registry::remove_target`] take: a login that passed an
    /// ACL changed since, or whose target was removed (or replaced by one of the same name),
    /// is either refused here or ended there.
    pub(crate) fn open_session(
        &self,
        initiator: &str,
        isid: [u8; 6],
        login_target: Option<&Arc<Target>>,
    ) -> Result<Opened, NotOpened> {
        let target = login_target.map_or("", |t| t.iqn.as_str());
        let mut sessions = self.sessions.lock();
        if let Some(t) = login_target {
            if !self.target(target).is_some_and(|now| Arc::ptr_eq(&now, t)) {
                return Err(NotOpened::Gone);
            }
            if !t.access().admits(initiator) {
                return Err(NotOpened::NotAdmitted);
            }
            let limits = self.limits();
            let reinstates = sessions.contains_key(&(initiator.to_string(), isid, target.to_string()));
            let of_initiator = sessions
                .keys()
                .filter(|(i, _, t)| !t.is_empty() && i.eq_ignore_ascii_case(initiator))
                .count();
            let of_target = sessions.keys().filter(|(_, _, t)| t == target).count();
            if !reinstates && of_initiator >= limits.sessions_per_initiator {
                return Err(NotOpened::Limit(format!(
                    "the initiator has {of_initiator} sessions, its limit (iscsi_sessions_per_initiator)"
                )));
            }
            if !reinstates && of_target >= limits.sessions_per_target {
                return Err(NotOpened::Limit(format!(
                    "the target has {of_target} sessions, its limit (iscsi_sessions_per_target)"
                )));
            }
        }
        let mut tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if tsih == 0 {
            tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        }
        let close = Arc::new(Closer::default());
        let nexus = self.new_nexus();
        let key = (initiator.to_string(), isid, target.to_string());
        let entry = SessionEntry {
            tsih,
            nexus,
            close: close.clone(),
        };
        if let Some(old) = sessions.insert(key, entry) {
            info!(initiator, tsih = old.tsih, "session reinstated: closing the old one");
            old.close.close();
            *close.replaces.lock() = Some(old.close);
        }
        Ok(Opened { tsih, nexus, close })
    }

    /// Sets the access rules of target `iqn` and ends the sessions of the initiators they no
    /// longer admit: an initiator taken out of the ACL (or out of demo mode) loses the target
    /// now, not at its next login. A CHAP change applies from the next login, as a host that
    /// is still admitted keeps its sessions through a change of secret. Returns the nexuses
    /// of the sessions ended.
    pub fn set_access(&self, iqn: &str, access: Access) -> Vec<u64> {
        let Some(t) = self.target(iqn) else {
            return Vec::new();
        };
        let sessions = self.sessions.lock();
        let mut ended = Vec::new();
        for ((initiator, _, target), e) in sessions.iter() {
            // A session closed already (by an earlier change, a reinstatement) is ending.
            if target == iqn && !access.admits(initiator) && !e.close.closed.load(Ordering::SeqCst) {
                info!(%initiator, target = iqn, tsih = e.tsih, "the ACL no longer admits the initiator: session ended");
                e.close.close();
                ended.push(e.nexus);
            }
        }
        t.set_access(access);
        ended
    }

    pub(crate) fn close_session(&self, initiator: &str, isid: [u8; 6], target: &str, tsih: u16) {
        let key = (initiator.to_string(), isid, target.to_string());
        let mut s = self.sessions.lock();
        if s.get(&key).map(|e| e.tsih) == Some(tsih) {
            s.remove(&key);
        }
    }

    /// A new I_T nexus identifier, never reused while the daemon runs.
    fn new_nexus(&self) -> u64 {
        self.next_nexus.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Sets the portals SendTargets reports (the listeners themselves are the caller's).
    pub fn set_portals(&self, portals: Vec<SocketAddr>) {
        *self.portals.write() = portals;
    }

    pub fn portals(&self) -> Vec<SocketAddr> {
        self.portals.read().clone()
    }

    /// The I_T nexuses of the sessions logged in to target `iqn`.
    pub fn nexuses_of(&self, iqn: &str) -> Vec<u64> {
        self.sessions
            .lock()
            .iter()
            .filter(|((_, _, target), _)| target == iqn)
            .map(|(_, e)| e.nexus)
            .collect()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.lock().len()
    }

    /// The sessions logged in now: (initiator, target, TSIH); discovery sessions have an
    /// empty target.
    pub fn sessions(&self) -> Vec<(String, String, u16)> {
        let mut v: Vec<_> = self
            .sessions
            .lock()
            .iter()
            .map(|((i, _, t), e)| (i.clone(), t.clone(), e.tsih))
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_scsi::Nexus;

    /// What ends a session from outside also tells its nexus, so that a copy operation still
    /// running in it makes no token that outlives it (tessera-scsi's `create_token`).
    #[test]
    fn closing_a_session_marks_its_nexus_ended() {
        let close = Closer::default();
        let nexus = Nexus::new(1, "iqn.2026-11.test:a", [0; 6]).ended_by(close.flag());
        assert!(!nexus.ended());
        close.close();
        assert!(nexus.ended());
    }
}
