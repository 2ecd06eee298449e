//! The TCP accept loop of the management API and the metrics. `axum::serve` would serve a
//! connection as long as its client keeps it open and wait forever for a request's headers or
//! body, so a few hundred connections sending a byte a minute would hold the API from everyone
//! (and hold a file descriptor and a task each). Here every connection is counted against the
//! listener's limit and its source's, its request headers must arrive within
//! [`HEADER_TIMEOUT`] (an idle kept-alive connection is closed after as long), and its body
//! within [`BODY_TIMEOUT`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Bytes, HttpBody};
use axum::extract::Request;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tessera_admission::{BeingLetIn, ConnectionSlot};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;
use tracing::{debug, warn};

/// Connections a listener serves at once; past it, a new one is closed at once.
pub const CONNECTIONS: usize = 256;
/// Connections one source (an IPv4 address, an IPv6 /64) holds open at once: a browser opens
/// six or so per host, a CLI one per command.
pub const CONNECTIONS_PER_SOURCE: usize = 32;
/// How long a request's headers may take to arrive, counted from the moment the server waits
/// for them: a kept-alive connection with no request in this time is closed.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's body may take to arrive (API bodies are small JSON documents).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The bounds a listener applies; tests shorten them.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub connections: usize,
    pub per_source: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: CONNECTIONS,
            per_source: CONNECTIONS_PER_SOURCE,
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
        }
    }
}

/// Serves `router` on `listener` until `stop` turns true, then lets the requests in progress
/// finish (the caller bounds how long it waits) and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let open = Arc::new(AtomicUsize::new(0));
    let per_source = Arc::new(BeingLetIn::default());
    // Each connection's task holds a clone: when every clone is gone, every connection ended.
    let (alive, mut all_ended) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let (sock, peer) = tokio::select! {
            _ = stopped(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, most often: wait for some to be given back.
                    warn!(error = %e, "API accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(place) = per_source.take(peer.ip(), limits.per_source) else {
            warn!(%peer, limit = limits.per_source, "API connection refused: its source has its limit of connections open");
            continue;
        };
        let Some(slot) = ConnectionSlot::take(&open, limits.connections) else {
            warn!(%peer, limit = limits.connections, "API connection refused: the listener has its limit of connections open");
            continue;
        };
        let _ = sock.set_nodelay(true);
        let body_timeout = limits.body_timeout;
        let service = router.clone().map_request(move |r: Request<Incoming>| {
            r.map(|b| axum::body::Body::new(DeadlineBody::new(b, body_timeout)))
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        let mut stop = stop.clone();
        let alive = alive.clone();
        tokio::spawn(async move {
            let _held = (slot, place, alive);
            let conn = builder.serve_connection(TokioIo::new(sock), TowerToHyperService::new(service));
            let mut conn = std::pin::pin!(conn);
            let mut stopping = false;
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            debug!(%peer, error = %e, "API connection ended");
                        }
                        break;
                    }
                    _ = stopped(&mut stop), if !stopping => {
                        // Finish the request in progress, take no other.
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
    drop(alive);
    let _ = all_ended.recv().await;
    Ok(())
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A request body that fails once its deadline passes before its last byte arrived: the
/// handler reading it gets an error instead of waiting on a client that stopped sending.
struct DeadlineBody {
    inner: Incoming,
    within: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl DeadlineBody {
    fn new(inner: Incoming, within: Duration) -> DeadlineBody {
        DeadlineBody {
            inner,
            within,
            deadline: Box::pin(tokio::time::sleep(within)),
        }
    }
}

/// Why a request body was cut off.
#[derive(Debug)]
struct BodyTooSlow(Duration);

impl std::fmt::Display for BodyTooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body did not arrive within {} s", self.0.as_secs())
    }
}

impl std::error::Error for BodyTooSlow {}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTooSlow(self.within)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use std::net::SocketAddr;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const SHORT: Duration = Duration::from_millis(600);

    async fn start(
        limits: Limits,
    ) -> (
        SocketAddr,
        watch::Sender<bool>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        let router = Router::new()
            .route("/hello", get(|| async { "hello" }))
            .route("/echo", post(|b: Bytes| async move { b }));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (stop, rx) = watch::channel(false);
        (addr, stop, tokio::spawn(serve(l, router, limits, rx)))
    }

    fn limits() -> Limits {
        Limits {
            connections: 8,
            per_source: 4,
            header_timeout: SHORT,
            body_timeout: SHORT,
        }
    }

    /// Reads until the server closes the connection (or 5 s pass), returning what came.
    async fn until_closed(s: &mut TcpStream) -> Option<String> {
        let mut got = Vec::new();
        match tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await {
            Ok(_) => Some(String::from_utf8_lossy(&got).into_owned()),
            Err(_) => None,
        }
    }

    #[tokio::test]
    async fn requests_are_served_and_a_slow_client_is_let_go() {
        let (addr, stop, server) = start(limits()).await;
        // A whole request is answered, and the connection kept for the next one.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with("hello"));
        // ... but not forever: kept alive with no request, it is closed.
        let t = Instant::now();
        assert_eq!(
            until_closed(&mut s).await.as_deref(),
            Some(""),
            "an idle connection is closed"
        );
        assert!(t.elapsed() >= SHORT / 2);

        // Headers sent a piece at a time, never finished: closed once their time is up.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /hello HTTP/1.1\r\nHost").await.unwrap();
        let got = until_closed(&mut s)
            .await
            .expect("a request whose headers never end is cut off");
        assert!(!got.contains("hello"), "{got}");

        // A body that stops coming: the handler gets an error, not an endless wait.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\":")
            .await
            .unwrap();
        let got = until_closed(&mut s)
            .await
            .expect("a request whose body never ends is cut off");
        assert!(got.starts_with("HTTP/1.1 400"), "{got}");

        // Stopping ends the listener once its connections are done.
        stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn one_source_cannot_hold_every_connection() {
        let (addr, _stop, _server) = start(limits()).await;
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        // The fifth from this address is closed at once, without an answer.
        let mut fifth = TcpStream::connect(addr).await.unwrap();
        let _ = fifth.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let t = Instant::now();
        assert_eq!(until_closed(&mut fifth).await.as_deref(), Some(""));
        assert!(t.elapsed() < SHORT, "closed at once, not by the header timeout");
        // Once one ends, a new connection is served.
        drop(held.pop());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let got = until_closed(&mut s).await.unwrap();
        assert!(got.ends_with("hello"), "{got}");
    }

    async fn connect_from(ip: [u8; 4], to: SocketAddr) -> TcpStream {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::from((ip, 0))).unwrap();
        s.connect(to).await.unwrap()
    }

    #[tokio::test]
    async fn the_listener_holds_a_bounded_number_of_connections() {
        let (addr, _stop, _server) = start(Limits {
            connections: 6,
            ..limits()
        })
        .await;
        let mut held = Vec::new();
        for ip in [[127, 0, 0, 1], [127, 0, 0, 2]] {
            for _ in 0..3 {
                held.push(connect_from(ip, addr).await);
            }
        }
        let mut seventh = connect_from([127, 0, 0, 3], addr).await;
        let _ = seventh.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(until_closed(&mut seventh).await.as_deref(), Some(""));
    }
}
