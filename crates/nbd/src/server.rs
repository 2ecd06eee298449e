//! The listener: each connection negotiates, then serves requests on its own task.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::export::Registry;

/// A client has this long to pick an export; one that stalls mid-negotiation is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts connections on `listener` until the process ends.
pub async fn serve(listener: TcpListener, reg: Arc<Registry>) {
    loop {
        match listener.accept().await {
            Ok((mut sock, peer)) => {
                let _ = sock.set_nodelay(true);
                let reg = reg.clone();
                tokio::spawn(async move {
                    let n = match tokio::time::timeout(HANDSHAKE_TIMEOUT, crate::handshake::negotiate(&mut sock, &reg))
                        .await
                    {
                        Ok(Ok(Some(n))) => n,
                        Ok(Ok(None)) => return,
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "NBD handshake ended");
                            return;
                        }
                        Err(_) => {
                            info!(%peer, "NBD handshake timed out");
                            return;
                        }
                    };
                    let export = n.export.name.clone();
                    debug!(%peer, %export, structured = n.structured, "NBD client connected");
                    // From here the connection is served by a thread of its own (and its workers).
                    let sock = match sock.into_std().and_then(|s| s.set_nonblocking(false).map(|_| s)) {
                        Ok(s) => s,
                        Err(e) => {
                            warn!(%peer, error = %e, "cannot hand the NBD connection over");
                            return;
                        }
                    };
                    let spawned = std::thread::Builder::new().name("nbd-conn".into()).spawn(move || {
                        if let Err(e) = crate::conn::run(sock, n) {
                            info!(%peer, %export, error = %e, "NBD connection ended");
                        }
                    });
                    if let Err(e) = spawned {
                        warn!(%peer, error = %e, "cannot start a thread for the NBD connection");
                    }
                });
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
