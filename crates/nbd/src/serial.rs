//! A connection over TLS: the rest of the negotiation and the transmission phase on a thread
//! of its own, one request at a time, over a blocking stream. The connection loop of `conn`
//! drives a raw socket and an io_uring and cannot see through TLS; a TLS connection is paid
//! for in encryption anyway, and runs every request through the same code (`workers::run`).
//! Between requests it waits on its socket and on its export's withdrawal at once, so that an
//! idle connection ends with the export as `conn`'s do, not at its client's next request.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use openssl::ssl::SslStream;
use tessera_disk::AlignedBuf;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::export::{Export, Registry, MAX_PAYLOAD};
use crate::handshake::{options, Handshake, Negotiated, Tls};
use crate::proto::*;
use crate::transmission::{error_reply, Buffers, Ctx};
use crate::workers::{self, Job};

/// A blocking stream seen as an async one: every poll does the call and is ready. Only for a
/// thread of its own, where blocking is what is wanted.
struct Blocking<'a, S>(&'a mut S);

impl<S: Read> AsyncRead for Blocking<'_, S> {
    fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let n = self.0.read(buf.initialize_unfilled())?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: Write> AsyncWrite for Blocking<'_, S> {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(self.0.write(buf))
    }
    fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.0.flush())
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A blocking stream over a socket that may hold input of its own: bytes read from the
/// socket and not yet taken (decrypted, for TLS), which polling the socket does not show.
pub(crate) trait Watched: Read + Write {
    fn socket(&self) -> RawFd;
    fn holds_input(&self) -> bool;
    /// Tells the client the server ends the connection (TLS's close_notify).
    fn close(&mut self);
}

impl Watched for SslStream<TcpStream> {
    fn socket(&self) -> RawFd {
        self.get_ref().as_raw_fd()
    }
    fn holds_input(&self) -> bool {
        self.ssl().pending() > 0
    }
    fn close(&mut self) {
        let _ = self.shutdown();
    }
}

/// Waits for the client's next request or the export's withdrawal; true if the export was
/// withdrawn while the connection had nothing of the client's to read. Bytes that came with
/// the withdrawal are read first: their request is refused with ESHUTDOWN, as `conn` does,
/// and one begun before holds the connection until it is whole.
fn withdrawn_while_idle<S: Watched>(s: &S, export: &Export) -> io::Result<bool> {
    let Some(withdrawal) = export.withdrawal_fd() else {
        return Ok(false);
    };
    if s.holds_input() {
        return Ok(false);
    }
    let watch = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [watch(s.socket()), watch(withdrawal)];
    loop {
        // SAFETY: `fds` is an array of two pollfd we own, and both descriptors stay open
        // (the stream's socket, and the export's eventfd, which the export holds).
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(fds[0].revents == 0 && fds[1].revents & libc::POLLIN != 0)
}

/// Finishes the negotiation on a stream where TLS has just started; the export, if the
/// client picked one.
pub(crate) fn negotiate<S: Read + Write>(
    s: &mut S,
    reg: &Registry,
    fixed: bool,
    no_zeroes: bool,
) -> io::Result<Option<Negotiated>> {
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    match rt.block_on(options(&mut Blocking(s), reg, Tls::Active, fixed, no_zeroes))? {
        Handshake::Go(n) => Ok(Some(n)),
        Handshake::StartTls { .. } | Handshake::Closed => Ok(None),
    }
}

/// Serves the transmission phase until the client leaves or the export is withdrawn.
pub(crate) fn serve<S: Watched>(mut s: S, n: Negotiated) -> io::Result<()> {
    let export = n.export.clone();
    export.connections.fetch_add(1, Ordering::Relaxed);
    let ctx = Arc::new(Ctx {
        export: n.export,
        structured: n.structured,
        allocation_context: n.allocation_context,
        buffers: Buffers::default(),
        arrivals: Default::default(),
    });
    let r = requests(&mut s, &ctx);
    export.connections.fetch_sub(1, Ordering::Relaxed);
    r
}

fn requests<S: Watched>(s: &mut S, ctx: &Ctx) -> io::Result<()> {
    let mut head = [0u8; REQUEST_LEN];
    loop {
        if withdrawn_while_idle(s, &ctx.export)? {
            s.close();
            return Ok(());
        }
        match s.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let req = Request::parse(&head).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        ctx.arrived(&req);
        // A client that keeps requests coming is never idle when its export is removed: each
        // request is asked, as `conn` does. Refused, its payload read whole (so that closing
        // does not reset the connection under the reply), and the connection ends.
        if ctx.export.withdrawn() && req.kind != cmd::DISC {
            if req.kind == cmd::WRITE {
                io::copy(&mut Read::by_ref(s).take(req.length as u64), &mut io::sink())?;
            }
            for p in error_reply(ctx, &req, errno::ESHUTDOWN, "the export was removed") {
                s.write_all(p.as_ref())?;
            }
            s.flush()?;
            s.close();
            return Ok(());
        }
        let reply = match req.kind {
            cmd::DISC => return Ok(()),
            cmd::WRITE if req.length > MAX_PAYLOAD => {
                // Stay in step: skip the data, then refuse.
                io::copy(&mut Read::by_ref(s).take(req.length as u64), &mut io::sink())?;
                let msg = format!("a write of {} bytes exceeds the {MAX_PAYLOAD}-byte limit", req.length);
                error_reply(ctx, &req, errno::EOVERFLOW, &msg)
            }
            cmd::WRITE => {
                let mut payload = ctx.buffers.take(req.length as usize);
                s.read_exact(&mut payload)?;
                workers::run(ctx, Job { req, payload })
            }
            _ => workers::run(
                ctx,
                Job {
                    req,
                    payload: AlignedBuf::zeroed(0),
                },
            ),
        };
        for p in &reply {
            s.write_all(p.as_ref())?;
        }
        s.flush()?;
        for p in reply {
            if let crate::transmission::Piece::Data(b) = p {
                ctx.buffers.give_back(b);
            }
        }
    }
}
