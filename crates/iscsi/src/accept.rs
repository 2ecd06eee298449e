//! The accept loop of a portal: each connection logs in on a task of its own (conn.rs), within
//! the portal's limit of connections.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::target::Registry;
use tessera_admission::{BeingLetIn, ConnectionSlot};

/// Accepts connections on `listener` until the process ends; each logs in on a task of its
/// own, then is served by threads of its own. A connection past the portal's limit, or past
/// its address's limit of connections logging in, is closed at once.
pub async fn serve(listener: TcpListener, reg: Arc<Registry>) {
    serve_counted(listener, reg, Default::default()).await
}

/// [`serve`], keeping the number of connections open through the portal in `open`, for
/// whoever reports on it.
pub async fn serve_counted(listener: TcpListener, reg: Arc<Registry>, open: Arc<std::sync::atomic::AtomicUsize>) {
    let logging_in = Arc::new(BeingLetIn::default());
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => {
                let per_address = reg.limits().logins_per_address;
                let Some(place) = logging_in.take(peer.ip(), per_address) else {
                    warn!(%peer, limit = per_address, "connection refused: its address has its limit of connections logging in");
                    drop(sock);
                    continue;
                };
                let limit = reg.limits().connections_per_portal;
                let Some(slot) = ConnectionSlot::take(&open, limit) else {
                    warn!(%peer, limit, "connection refused: the portal has its limit of connections (iscsi_connections_per_portal)");
                    drop(sock);
                    continue;
                };
                let _ = sock.set_nodelay(true);
                let local = sock
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                let reg = reg.clone();
                tokio::spawn(async move {
                    if let Err(e) = crate::conn::run(sock, local, reg, slot, place).await {
                        info!(%peer, error = %e, "iSCSI login ended");
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
