//! The listeners: each connection negotiates, then is served by a thread of its own. A TCP
//! listener may offer TLS (NBD_OPT_STARTTLS) or require it; a unix socket serves local clients
//! in plain, its file mode being the access control.

use std::io;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use tessera_admission::{AddressPlace, BeingLetIn, ConnectionSlot};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tracing::{debug, error, info, warn};

pub use crate::conn::MAX_HELD_BYTES;
use crate::export::Registry;
use crate::handshake::{negotiate, Handshake, Tls};
use crate::tls::TlsServer;

/// A client has this long to pick an export; one that stalls mid-negotiation is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a listener asks of its clients, and how many it serves at once.
#[derive(Clone)]
pub struct Policy {
    /// TLS offered through NBD_OPT_STARTTLS.
    pub tls: Option<Arc<TlsServer>>,
    /// Nothing but NBD_OPT_STARTTLS (and NBD_OPT_ABORT) before TLS.
    pub require_tls: bool,
    /// Connections open at once, negotiating or served; past it a connection is closed.
    pub max_connections: usize,
    /// Connections from one address that may be negotiating at once (TLS included: nothing
    /// is known of their client yet); past it a new one from there is closed. A client
    /// negotiates in milliseconds: without this bound, one address could hold every place of
    /// `max_connections` with connections that never finish, for the negotiation's timeout,
    /// again and again, and no one else could connect.
    pub max_negotiating_per_peer: usize,
}

/// Connections a listener serves at once unless told otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Connections one address may have negotiating at once unless told otherwise.
pub const DEFAULT_MAX_NEGOTIATING_PER_PEER: usize = 32;

impl Policy {
    /// Plain NBD for anyone who can connect: a unix socket, a test, or an operator's explicit
    /// choice.
    pub fn plain() -> Policy {
        Policy {
            tls: None,
            require_tls: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_negotiating_per_peer: DEFAULT_MAX_NEGOTIATING_PER_PEER,
        }
    }

    fn tls_state(&self) -> Tls {
        match &self.tls {
            // Required and not there to give: every export refused (STARTTLS then closes), not
            // served in the clear.
            None if self.require_tls => Tls::Offered { required: true },
            None => Tls::Off,
            Some(_) => Tls::Offered {
                required: self.require_tls,
            },
        }
    }
}

/// Serves plain NBD on `listener` until the process ends.
pub async fn serve(listener: TcpListener, reg: Arc<Registry>) {
    serve_tcp(listener, reg, Policy::plain()).await
}

/// Serves NBD on a TCP listener under `policy` until the process ends.
pub async fn serve_tcp(listener: TcpListener, reg: Arc<Registry>, policy: Policy) {
    if policy.require_tls && policy.tls.is_none() {
        error!("this NBD listener requires TLS and has none to offer: it serves no export");
    }
    let open = Arc::new(AtomicUsize::new(0));
    let negotiating = Arc::new(BeingLetIn::default());
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => {
                let Some(negotiation) = negotiating.take(peer.ip(), policy.max_negotiating_per_peer) else {
                    warn!(%peer, limit = policy.max_negotiating_per_peer, "NBD connection refused: its address has its limit of connections negotiating");
                    continue;
                };
                let Some(slot) = ConnectionSlot::take(&open, policy.max_connections) else {
                    warn!(%peer, limit = policy.max_connections, "NBD connection refused: the listener has its limit of connections");
                    continue;
                };
                let _ = sock.set_nodelay(true);
                let (reg, policy) = (reg.clone(), policy.clone());
                tokio::spawn(async move {
                    connection(sock, peer.to_string(), &reg, &policy, slot, Some(negotiation)).await;
                });
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves plain NBD on a unix socket until the process ends.
pub async fn serve_unix(listener: UnixListener, reg: Arc<Registry>, max_connections: usize) {
    let open = Arc::new(AtomicUsize::new(0));
    let policy = Policy {
        max_connections,
        ..Policy::plain()
    };
    loop {
        match listener.accept().await {
            Ok((sock, _)) => {
                let Some(slot) = ConnectionSlot::take(&open, max_connections) else {
                    warn!(
                        limit = max_connections,
                        "NBD connection on the unix socket refused: at its limit of connections"
                    );
                    continue;
                };
                let (reg, policy) = (reg.clone(), policy.clone());
                tokio::spawn(async move {
                    connection(sock, "unix socket".into(), &reg, &policy, slot, None).await;
                });
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A stream the negotiation runs on and the connection loop then takes over.
trait Accepted: AsyncRead + AsyncWrite + Unpin + Send + Sized + 'static {
    type Std: crate::conn::Socket;
    fn into_blocking(self) -> io::Result<Self::Std>;
    /// The TCP stream under it, for TLS; None for a unix socket.
    fn into_tcp(self) -> Option<io::Result<std::net::TcpStream>>;
}

impl Accepted for tokio::net::TcpStream {
    type Std = std::net::TcpStream;
    fn into_blocking(self) -> io::Result<std::net::TcpStream> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        Ok(s)
    }
    fn into_tcp(self) -> Option<io::Result<std::net::TcpStream>> {
        Some(self.into_blocking())
    }
}

impl Accepted for tokio::net::UnixStream {
    type Std = std::os::unix::net::UnixStream;
    fn into_blocking(self) -> io::Result<std::os::unix::net::UnixStream> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        Ok(s)
    }
    fn into_tcp(self) -> Option<io::Result<std::net::TcpStream>> {
        None
    }
}

/// One connection, from its negotiation to its end: its `slot` of the listener's limit goes
/// with it to the thread that serves it, and is given back only when the connection ends; its
/// `negotiation` (a TCP one's) ends with its negotiation, over TLS too.
async fn connection<S: Accepted>(
    mut sock: S,
    peer: String,
    reg: &Arc<Registry>,
    policy: &Policy,
    slot: ConnectionSlot,
    negotiation: Option<AddressPlace>,
) {
    let outcome = match tokio::time::timeout(HANDSHAKE_TIMEOUT, negotiate(&mut sock, reg, policy.tls_state())).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "NBD handshake ended");
            return;
        }
        Err(_) => {
            info!(%peer, "NBD handshake timed out");
            return;
        }
    };
    match outcome {
        Handshake::Closed => {}
        Handshake::Go(n) => {
            drop(negotiation);
            let export = n.export.name.clone();
            debug!(%peer, %export, structured = n.structured, "NBD client connected");
            // From here the connection is served by a thread of its own (and its workers).
            let sock = match sock.into_blocking() {
                Ok(s) => s,
                Err(e) => {
                    warn!(%peer, error = %e, "cannot hand the NBD connection over");
                    return;
                }
            };
            let spawned = std::thread::Builder::new().name("nbd-conn".into()).spawn(move || {
                let _slot = slot;
                if let Err(e) = crate::conn::run(sock, n) {
                    info!(%peer, %export, error = %e, "NBD connection ended");
                }
            });
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start a thread for the NBD connection");
            }
        }
        Handshake::StartTls { fixed, no_zeroes } => {
            let (Some(tls), Some(Ok(tcp))) = (policy.tls.clone(), sock.into_tcp()) else {
                warn!(%peer, "cannot start TLS on this connection");
                return;
            };
            let reg = reg.clone();
            let spawned = std::thread::Builder::new().name("nbd-tls".into()).spawn(move || {
                let _slot = slot;
                tls_connection(tcp, peer, &reg, &tls, fixed, no_zeroes, negotiation)
            });
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start a thread for the NBD connection");
            }
        }
    }
}

/// The TLS handshake, the rest of the negotiation and the transmission phase, on this thread.
fn tls_connection(
    tcp: std::net::TcpStream,
    peer: String,
    reg: &Registry,
    tls: &TlsServer,
    fixed: bool,
    no_zeroes: bool,
    negotiation: Option<AddressPlace>,
) {
    // The negotiation's deadline goes on through the TLS handshake and the options after it:
    // a whole deadline, not only one on each read, so that a client sending a byte now and
    // then cannot keep the connection negotiating (and its place) for ever.
    let _ = tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
    let _ = tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT));
    let deadline = match tessera_psk::Deadline::start(&tcp, HANDSHAKE_TIMEOUT) {
        Ok(d) => d,
        Err(e) => {
            warn!(%peer, error = %e, "NBD TLS refused");
            return;
        }
    };
    let raw = match tcp.try_clone() {
        Ok(r) => r,
        Err(e) => {
            warn!(%peer, error = %e, "cannot keep the NBD connection's socket");
            return;
        }
    };
    let mut s = match tls.accept(tcp) {
        Ok(s) => s,
        Err(e) => {
            info!(%peer, error = %e, "NBD TLS refused");
            return;
        }
    };
    let n = match crate::serial::negotiate(&mut s, reg, fixed, no_zeroes) {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => {
            debug!(%peer, error = %e, "NBD handshake over TLS ended");
            return;
        }
    };
    deadline.met();
    drop(negotiation);
    let _ = raw.set_read_timeout(None);
    let _ = raw.set_write_timeout(None);
    let export = n.export.name.clone();
    debug!(%peer, %export, structured = n.structured, "NBD client connected over TLS");
    if let Err(e) = crate::serial::serve(s, n) {
        info!(%peer, %export, error = %e, "NBD connection ended");
    }
}
