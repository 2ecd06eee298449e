//! The transmission phase, server side: requests are read in order, run concurrently on the
//! blocking pool (the vdisk does disk I/O), and answered as they complete.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_volume::VolumeError;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, warn};

use crate::export::{Export, MAX_PAYLOAD};
use crate::handshake::Negotiated;
use crate::proto::*;

/// Requests of one connection running at once; the reader waits beyond that.
const MAX_IN_FLIGHT: u32 = 64;

/// The reply to one request, in the pieces it is written in.
type Reply = Vec<Vec<u8>>;

struct Ctx {
    export: Arc<Export>,
    structured: bool,
    allocation_context: Option<u32>,
}

pub async fn run(sock: TcpStream, n: Negotiated) -> io::Result<()> {
    n.export.connections.fetch_add(1, Ordering::Relaxed);
    let export = n.export.clone();
    let r = serve_requests(sock, n).await;
    export.connections.fetch_sub(1, Ordering::Relaxed);
    r
}

async fn serve_requests(sock: TcpStream, n: Negotiated) -> io::Result<()> {
    let ctx = Arc::new(Ctx {
        export: n.export,
        structured: n.structured,
        allocation_context: n.allocation_context,
    });
    let (mut r, w) = sock.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Reply>();
    let writer = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(256 << 10, w);
        while let Some(reply) = rx.recv().await {
            let mut next = Some(reply);
            // Gather the replies that are ready into one flush.
            while let Some(reply) = next.take() {
                for part in reply {
                    w.write_all(&part).await?;
                }
                next = rx.try_recv().ok();
            }
            w.flush().await?;
        }
        w.shutdown().await
    });
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT as usize));
    let mut head = [0u8; REQUEST_LEN];
    let result = loop {
        match r.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e),
        }
        let req = match Request::parse(&head) {
            Ok(q) => q,
            Err(e) => {
                // Out of step with the client: nothing after this can be trusted.
                break Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
            }
        };
        if req.kind == cmd::DISC {
            break Ok(());
        }
        let mut payload = Vec::new();
        if req.kind == cmd::WRITE {
            if req.length > MAX_PAYLOAD {
                // Stay in step: swallow the data, then refuse.
                let mut left = req.length as u64;
                let mut sink = vec![0u8; 1 << 20];
                while left > 0 {
                    let n = left.min(sink.len() as u64) as usize;
                    r.read_exact(&mut sink[..n]).await?;
                    left -= n as u64;
                }
                let msg = format!("a write of {} bytes exceeds the {MAX_PAYLOAD}-byte limit", req.length);
                let _ = tx.send(error_reply(&ctx, &req, errno::EOVERFLOW, &msg));
                continue;
            }
            payload = vec![0u8; req.length as usize];
            r.read_exact(&mut payload).await?;
        }
        let permit = slots.clone().acquire_owned().await.expect("semaphore is never closed");
        let ctx = ctx.clone();
        let tx = tx.clone();
        tokio::task::spawn_blocking(move || {
            let reply = execute(&ctx, &req, &payload);
            let _ = tx.send(reply);
            drop(permit);
        });
    };
    // Answer everything already accepted before closing (NBD_CMD_DISC requires it).
    let _ = slots.acquire_many(MAX_IN_FLIGHT).await;
    drop(tx);
    let w = writer.await.map_err(io::Error::other)?;
    result.and(w)
}

/// Runs one request and builds its reply.
fn execute(ctx: &Ctx, req: &Request, payload: &[u8]) -> Reply {
    match try_execute(ctx, req, payload) {
        Ok(reply) => reply,
        Err((code, msg)) => error_reply(ctx, req, code, &msg),
    }
}

type Failure = (u32, String);

fn volume_error(e: VolumeError) -> Failure {
    let code = if e.is_no_space() {
        errno::ENOSPC
    } else {
        match e {
            VolumeError::Invalid(_) => errno::EINVAL,
            VolumeError::Deleted(_) => errno::ESHUTDOWN,
            _ => errno::EIO,
        }
    };
    if code == errno::EIO {
        warn!(error = %e, "NBD request failed");
    }
    (code, e.to_string())
}

fn try_execute(ctx: &Ctx, req: &Request, payload: &[u8]) -> Result<Reply, Failure> {
    let e = &ctx.export;
    let v = &e.vdisk;
    let fua = req.flags & cflag::FUA != 0;
    let ranged = matches!(
        req.kind,
        cmd::READ | cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES | cmd::CACHE | cmd::BLOCK_STATUS
    );
    if ranged {
        let size = v.size();
        let end = req.offset.checked_add(req.length as u64);
        if end.is_none_or(|end| end > size) {
            return Err((
                errno::EINVAL,
                format!(
                    "{} bytes at offset {} go beyond the end of the export ({size} bytes)",
                    req.length, req.offset
                ),
            ));
        }
        let bs = e.min_block() as u64;
        if req.offset % bs != 0 || req.length as u64 % bs != 0 {
            return Err((
                errno::EINVAL,
                format!(
                    "{} bytes at offset {} are not aligned to the {bs}-byte minimum block size",
                    req.length, req.offset
                ),
            ));
        }
    }
    let writes = matches!(req.kind, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);
    if writes && e.read_only {
        return Err((errno::EPERM, format!("export '{}' is read-only", e.name)));
    }
    match req.kind {
        cmd::READ => {
            if req.length > MAX_PAYLOAD {
                return Err((
                    errno::EINVAL,
                    format!("a read of {} bytes exceeds the {MAX_PAYLOAD}-byte limit", req.length),
                ));
            }
            read(ctx, req)
        }
        cmd::WRITE => {
            if !payload.is_empty() {
                v.write(req.offset, payload, fua).map_err(volume_error)?;
            }
            Ok(done(ctx, req))
        }
        cmd::FLUSH => {
            v.flush().map_err(volume_error)?;
            Ok(done(ctx, req))
        }
        cmd::TRIM => {
            if req.length > 0 {
                v.trim(req.offset, req.length as u64).map_err(volume_error)?;
            }
            if fua {
                v.flush().map_err(volume_error)?;
            }
            Ok(done(ctx, req))
        }
        cmd::WRITE_ZEROES => {
            let no_hole = req.flags & cflag::NO_HOLE != 0;
            if no_hole && req.flags & cflag::FAST_ZERO != 0 {
                // Allocated zeros are written block by block: not faster than a write.
                return Err((errno::ENOTSUP, "allocated zeroes are not fast here".into()));
            }
            if req.length > 0 {
                v.write_zeroes(req.offset, req.length as u64, !no_hole, fua)
                    .map_err(volume_error)?;
            }
            Ok(done(ctx, req))
        }
        // Advisory; the engine keeps no cache to warm.
        cmd::CACHE => Ok(done(ctx, req)),
        cmd::BLOCK_STATUS => block_status(ctx, req),
        other => Err((errno::EINVAL, format!("unknown command {other}"))),
    }
}

/// Success without payload.
fn done(ctx: &Ctx, req: &Request) -> Reply {
    if ctx.structured {
        vec![chunk_header(req.cookie, chunk::FLAG_DONE, chunk::NONE, 0).to_vec()]
    } else {
        vec![simple_reply(req.cookie, 0).to_vec()]
    }
}

fn error_reply(ctx: &Ctx, req: &Request, code: u32, msg: &str) -> Reply {
    debug!(
        cookie = req.cookie,
        command = req.kind,
        code,
        msg,
        "NBD request refused"
    );
    if ctx.structured {
        let p = error_payload(code, msg, None);
        vec![
            chunk_header(req.cookie, chunk::FLAG_DONE, chunk::ERROR, p.len() as u32).to_vec(),
            p,
        ]
    } else {
        vec![simple_reply(req.cookie, code).to_vec()]
    }
}

fn read(ctx: &Ctx, req: &Request) -> Result<Reply, Failure> {
    let v = &ctx.export.vdisk;
    let len = req.length as usize;
    if !ctx.structured {
        let mut buf = vec![0u8; len];
        if len > 0 {
            v.read(req.offset, &mut buf).map_err(volume_error)?;
        }
        return Ok(vec![simple_reply(req.cookie, 0).to_vec(), buf]);
    }
    if len == 0 {
        return Ok(done(ctx, req));
    }
    // Unmapped extents go back as holes, unless the client wants one piece.
    let extents = if req.flags & cflag::DF != 0 {
        vec![tessera_volume::Extent {
            offset: req.offset,
            len: len as u64,
            mapped: true,
        }]
    } else {
        v.extents(req.offset, len as u64).map_err(volume_error)?
    };
    let mut reply = Vec::with_capacity(extents.len() * 2);
    let last = extents.len() - 1;
    for (i, x) in extents.iter().enumerate() {
        let flags = if i == last { chunk::FLAG_DONE } else { 0 };
        if x.mapped {
            let mut data = vec![0u8; 8 + x.len as usize];
            data[..8].copy_from_slice(&x.offset.to_be_bytes());
            v.read(x.offset, &mut data[8..]).map_err(volume_error)?;
            reply.push(chunk_header(req.cookie, flags, chunk::OFFSET_DATA, data.len() as u32).to_vec());
            reply.push(data);
        } else {
            let mut p = x.offset.to_be_bytes().to_vec();
            p.extend_from_slice(&(x.len as u32).to_be_bytes());
            reply.push(chunk_header(req.cookie, flags, chunk::OFFSET_HOLE, 12).to_vec());
            reply.push(p);
        }
    }
    Ok(reply)
}

fn block_status(ctx: &Ctx, req: &Request) -> Result<Reply, Failure> {
    let Some(id) = ctx.allocation_context.filter(|_| ctx.structured) else {
        return Err((
            errno::EINVAL,
            "no metadata context was selected (NBD_OPT_SET_META_CONTEXT base:allocation)".into(),
        ));
    };
    if req.length == 0 {
        return Err((errno::EINVAL, "a block status request needs a length".into()));
    }
    let extents = ctx
        .export
        .vdisk
        .extents(req.offset, req.length as u64)
        .map_err(volume_error)?;
    let take = if req.flags & cflag::REQ_ONE != 0 {
        1
    } else {
        extents.len()
    };
    let mut p = Vec::with_capacity(4 + 8 * take);
    p.extend_from_slice(&id.to_be_bytes());
    for x in extents.iter().take(take) {
        let flags = if x.mapped { 0 } else { STATE_HOLE | STATE_ZERO };
        p.extend_from_slice(&(x.len as u32).to_be_bytes());
        p.extend_from_slice(&flags.to_be_bytes());
    }
    Ok(vec![
        chunk_header(req.cookie, chunk::FLAG_DONE, chunk::BLOCK_STATUS, p.len() as u32).to_vec(),
        p,
    ])
}
