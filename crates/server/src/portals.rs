//! iSCSI portals as the daemon keeps them: the one the configuration names (`iscsi_listen`)
//! and those added through the API, persisted in `<state dir>/portals.json`. Every target is
//! reachable through every portal (one portal group), and SendTargets lists them all, so an
//! MPIO initiator discovers its second path from the first.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_iscsi::{portal, Registry, SocketBuffers};
use tokio::runtime::Handle;
use tracing::{info, warn};

use crate::error::{ApiError, ApiResult};
use crate::model::PortalView;
use crate::statefile;

/// iSCSI's well-known port (RFC 7143 13.1), used when a portal is given without one.
pub const ISCSI_PORT: u16 = 3260;

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortalsFile {
    portals: Vec<SocketAddr>,
}

/// Reads "IP:PORT", "[IPv6]:PORT" or a bare IP (port 3260).
pub fn parse_portal(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bare = s.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(s);
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, ISCSI_PORT))
        .map_err(|_| {
            format!("'{s}' is not a portal address: write IP[:PORT], e.g. 0.0.0.0:3260, 192.168.10.5 or [::]:3260")
        })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `iscsi_listen` in the configuration file or `--iscsi-listen`.
    Config,
    /// Added through the API; persisted.
    Api,
}

enum State {
    Listening {
        local: SocketAddr,
        task: tokio::task::AbortHandle,
        /// TCP connections open through the portal (logging in, in a session, or ending).
        connections: Arc<AtomicUsize>,
        /// As the kernel granted them; None: left to autotuning.
        send_buffer: Option<u32>,
        recv_buffer: Option<u32>,
        capped: Option<String>,
    },
    Failed(String),
}

struct Portal {
    source: Source,
    state: State,
}

pub struct Portals {
    file: PathBuf,
    config: Option<SocketAddr>,
    buffers: SocketBuffers,
    registry: Arc<Registry>,
    /// By the address asked for; the runtime handle is set by `start`.
    inner: Mutex<(BTreeMap<SocketAddr, Portal>, Option<Handle>)>,
}

impl Portals {
    pub fn load(
        file: PathBuf,
        config: Option<SocketAddr>,
        buffers: SocketBuffers,
        registry: Arc<Registry>,
    ) -> Result<Portals, String> {
        let list: PortalsFile = statefile::read_json(&file, "fix it or move it away")?;
        let mut map = BTreeMap::new();
        for a in list.portals {
            if a.port() == 0 {
                return Err(format!("{}: portal {a} has no port", file.display()));
            }
            let failed = State::Failed("not started".into());
            map.insert(
                a,
                Portal {
                    source: Source::Api,
                    state: failed,
                },
            );
        }
        Ok(Portals {
            file,
            config,
            buffers,
            registry,
            inner: Mutex::new((map, None)),
        })
    }

    /// Starts every portal on the current runtime. The configured one must bind: the daemon
    /// refuses to start on an address it cannot serve, as it always has. One added through the
    /// API that cannot bind any more (an address gone from the host) is reported in the
    /// portal list and the log; the others serve.
    pub fn start(&self) -> Result<(), String> {
        let handle = Handle::current();
        let mut inner = self.inner.lock();
        inner.1 = Some(handle.clone());
        if let Some(a) = self.config {
            let state = self.listen(&handle, a).map_err(|e| {
                format!(
                    "cannot listen for iSCSI on {a}: {e}; is another target using it? Choose another with --iscsi-listen"
                )
            })?;
            inner.0.insert(
                a,
                Portal {
                    source: Source::Config,
                    state,
                },
            );
        }
        for (&a, p) in inner.0.iter_mut().filter(|(_, p)| p.source == Source::Api) {
            p.state = match self.listen(&handle, a) {
                Ok(s) => s,
                Err(e) => {
                    warn!(portal = %a, error = %e, "cannot listen on an iSCSI portal; the others serve");
                    State::Failed(e)
                }
            };
        }
        self.publish(&inner.0);
        Ok(())
    }

    fn listen(&self, handle: &Handle, a: SocketAddr) -> Result<State, String> {
        let _rt = handle.enter();
        let b = portal::bind(a, self.buffers).map_err(|e| e.to_string())?;
        if let Some(why) = &b.capped {
            warn!(portal = %a, "{why}");
        }
        let connections: Arc<AtomicUsize> = Default::default();
        let task = handle
            .spawn(tessera_iscsi::serve_counted(
                b.listener,
                self.registry.clone(),
                connections.clone(),
            ))
            .abort_handle();
        info!(portal = %b.local, "iSCSI portal listening");
        Ok(State::Listening {
            local: b.local,
            task,
            connections,
            send_buffer: self.buffers.send.map(|_| b.send_buffer),
            recv_buffer: self.buffers.recv.map(|_| b.recv_buffer),
            capped: b.capped,
        })
    }

    /// Tells the protocol which portals SendTargets reports: those listening, the configured
    /// one first.
    fn publish(&self, map: &BTreeMap<SocketAddr, Portal>) {
        let mut live: Vec<(Source, SocketAddr)> = map
            .values()
            .filter_map(|p| match p.state {
                State::Listening { local, .. } => Some((p.source, local)),
                State::Failed(_) => None,
            })
            .collect();
        live.sort_by_key(|&(source, _)| source != Source::Config);
        self.registry.set_portals(live.into_iter().map(|(_, a)| a).collect());
    }

    fn save(&self, map: &BTreeMap<SocketAddr, Portal>) -> ApiResult<()> {
        let list = PortalsFile {
            portals: map
                .iter()
                .filter(|(_, p)| p.source == Source::Api)
                .map(|(&a, _)| a)
                .collect(),
        };
        statefile::write_json(&self.file, &list)
            .map_err(|e| ApiError::io(format!("cannot save {}: {e}", self.file.display())))
    }

    /// The addresses actually listened on (a configured port 0 resolved).
    pub fn listening(&self) -> Vec<SocketAddr> {
        self.registry.portals()
    }

    pub fn list(&self) -> Vec<PortalView> {
        self.inner.lock().0.iter().map(|(&a, p)| view(a, p)).collect()
    }

    /// Starts listening on `address` and keeps it across restarts.
    pub fn add(&self, address: &str) -> ApiResult<PortalView> {
        let a = parse_portal(address).map_err(ApiError::invalid)?;
        if a.port() == 0 {
            return Err(ApiError::invalid(format!(
                "portal {a} needs a port that stays the same across restarts, e.g. {ISCSI_PORT}"
            )));
        }
        let mut inner = self.inner.lock();
        let (map, handle) = &mut *inner;
        if let Some(k) = find(map, a) {
            return Err(ApiError::exists(if k == a {
                format!("portal {a} exists")
            } else {
                format!("portal {a} exists (configured as {k})")
            }));
        }
        let Some(handle) = handle.clone() else {
            return Err(ApiError::busy("the iSCSI service is not running yet"));
        };
        let state = self
            .listen(&handle, a)
            .map_err(|e| ApiError::busy(format!("cannot listen on {a}: {e}")))?;
        map.insert(
            a,
            Portal {
                source: Source::Api,
                state,
            },
        );
        if let Err(e) = self.save(map) {
            if let Some(Portal {
                state: State::Listening { task, .. },
                ..
            }) = map.remove(&a)
            {
                task.abort();
            }
            return Err(e);
        }
        self.publish(map);
        Ok(view(a, &map[&a]))
    }

    /// Stops listening on `address`. Sessions that came in through it go on until they log
    /// out; new ones must use another portal.
    pub fn remove(&self, address: &str) -> ApiResult<()> {
        let a = parse_portal(address).map_err(ApiError::invalid)?;
        let mut inner = self.inner.lock();
        let map = &mut inner.0;
        let a = find(map, a).unwrap_or(a);
        match map.get(&a).map(|p| p.source) {
            None => return Err(ApiError::not_found(format!("no portal {a}"))),
            Some(Source::Config) => {
                return Err(ApiError::invalid(format!(
                    "portal {a} comes from the configuration (iscsi_listen or --iscsi-listen); change it there"
                )))
            }
            Some(Source::Api) => {}
        }
        let p = map.remove(&a).expect("checked above");
        if let Err(e) = self.save(map) {
            map.insert(a, p);
            return Err(e);
        }
        if let State::Listening { task, .. } = &p.state {
            task.abort();
        }
        info!(portal = %a, "iSCSI portal removed");
        self.publish(map);
        drop(inner);
        // The listener closes when its task is dropped, on a runtime thread: answered once
        // it has (within a few seconds at most), so that whoever hears the portal is removed
        // finds its address refusing connections.
        if let State::Listening { task, .. } = &p.state {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !task.is_finished() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        Ok(())
    }
}

/// The portal configured as `a`, or listening on `a` (a configured port 0 resolved).
fn find(map: &BTreeMap<SocketAddr, Portal>, a: SocketAddr) -> Option<SocketAddr> {
    if map.contains_key(&a) {
        return Some(a);
    }
    map.iter().find_map(|(&k, p)| match p.state {
        State::Listening { local, .. } if local == a => Some(k),
        _ => None,
    })
}

fn view(a: SocketAddr, p: &Portal) -> PortalView {
    let mut v = PortalView {
        address: portal::addr_text(a),
        source: match p.source {
            Source::Config => "config",
            Source::Api => "api",
        }
        .into(),
        listening_on: None,
        send_buffer: None,
        recv_buffer: None,
        warning: None,
        error: None,
        connections: 0,
    };
    match &p.state {
        State::Listening {
            local,
            send_buffer,
            recv_buffer,
            capped,
            connections,
            ..
        } => {
            v.listening_on = Some(portal::addr_text(*local));
            v.connections = connections.load(Ordering::Relaxed);
            v.send_buffer = *send_buffer;
            v.recv_buffer = *recv_buffer;
            v.warning = capped.clone();
        }
        State::Failed(e) => v.error = Some(e.clone()),
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portal_addresses() {
        assert_eq!(parse_portal("10.0.0.5").unwrap(), "10.0.0.5:3260".parse().unwrap());
        assert_eq!(parse_portal("[::1]").unwrap(), "[::1]:3260".parse().unwrap());
        assert_eq!(parse_portal("::").unwrap(), "[::]:3260".parse().unwrap());
        assert_eq!(parse_portal(" 0.0.0.0:3261 ").unwrap(), "0.0.0.0:3261".parse().unwrap());
        assert!(parse_portal("localhost:3260").unwrap_err().contains("IP[:PORT]"));
        assert!(parse_portal("10.0.0.5:99999").is_err());
    }

    #[tokio::test]
    async fn added_portals_listen_persist_and_go() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("portals.json");
        let reg = Registry::new();
        let cfg = Some("127.0.0.1:0".parse().unwrap());
        let p = Portals::load(file.clone(), cfg, SocketBuffers::default(), reg.clone()).unwrap();
        p.start().unwrap();
        let configured = p.listening()[0];
        assert_ne!(configured.port(), 0);

        // A free port, found by binding and letting go.
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let v = p.add(&free.to_string()).unwrap();
        assert_eq!(v.source, "api");
        assert_eq!(v.listening_on.as_deref(), Some(free.to_string().as_str()));
        assert!(std::net::TcpStream::connect(free).is_ok());
        assert_eq!(reg.portals().len(), 2);
        assert_eq!(p.add(&free.to_string()).unwrap_err().code, "already_exists");
        // Taken by someone else: refused with the reason, nothing saved.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = p.add(&taken.local_addr().unwrap().to_string()).unwrap_err();
        assert!(e.message.contains("cannot listen"), "{}", e.message);
        assert!(p.add("127.0.0.1:0").unwrap_err().message.contains("needs a port"));
        // The configured portal is not the API's to remove, by either name.
        for name in ["127.0.0.1:0".to_string(), configured.to_string()] {
            let e = p.remove(&name).unwrap_err();
            assert!(e.message.contains("configuration"), "{}", e.message);
        }
        assert!(p
            .add(&configured.to_string())
            .unwrap_err()
            .message
            .contains("configured as"));

        // After a restart, the added portal is back.
        drop(p);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains(&free.to_string()), "{text}");
        let reg2 = Registry::new();
        let p2 = Portals::load(file.clone(), None, SocketBuffers::default(), reg2.clone()).unwrap();
        // The old listener still holds the port until its task ends with the runtime; a
        // portal that cannot bind at start is reported, not fatal.
        p2.start().unwrap();
        assert_eq!(p2.list().len(), 1);
        p2.remove(&free.to_string()).unwrap();
        assert!(p2.list().is_empty());
        assert!(reg2.portals().is_empty());
        assert!(!std::fs::read_to_string(&file).unwrap().contains(&free.to_string()));
        assert_eq!(p2.remove(&free.to_string()).unwrap_err().code, "not_found");
    }
}
