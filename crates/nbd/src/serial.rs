//! A connection over TLS: the rest of the negotiation and the transmission phase on a thread
//! of its own, one request at a time, over a blocking stream. The connection loop of `conn`
//! drives a raw socket and an io_uring and cannot see through TLS; a TLS connection is paid
//! for in encryption anyway, and runs every request through the same code (`workers::run`).

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use tessera_disk::AlignedBuf;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::export::{Registry, MAX_PAYLOAD};
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

/// Serves the transmission phase until the client leaves.
pub(crate) fn serve<S: Read + Write>(mut s: S, n: Negotiated) -> io::Result<()> {
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

fn requests<S: Read + Write>(s: &mut S, ctx: &Ctx) -> io::Result<()> {
    let mut head = [0u8; REQUEST_LEN];
    loop {
        match s.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let req = Request::parse(&head).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        ctx.arrived(&req);
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
