//! The transmission phase, server side. The vdisk does blocking disk I/O, so a connection is
//! served by its own threads, leader/follower style: one thread at a time reads the next
//! request off the socket, then runs it and writes the reply itself while another thread takes
//! over reading. No request changes threads, so a 4K read costs no hand-off between a reader,
//! a worker pool and a writer. Threads are added while every one is busy, up to
//! MAX_IN_FLIGHT, and all end with the connection.

use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tessera_disk::AlignedBuf;
use tessera_volume::VolumeError;
use tracing::{debug, warn};

use crate::export::{Export, MAX_PAYLOAD};
use crate::handshake::Negotiated;
use crate::proto::*;

/// Requests of one connection running at once (threads serving it, at most).
const MAX_IN_FLIGHT: usize = 64;

/// A piece of a reply: protocol bytes, or data read from the vdisk into a buffer aligned for
/// direct I/O (so the disk reads straight into it, and the socket writes straight from it).
enum Piece {
    Bytes(Vec<u8>),
    Data(AlignedBuf),
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        match self {
            Piece::Bytes(b) => b,
            Piece::Data(b) => b,
        }
    }
}

impl<const N: usize> From<[u8; N]> for Piece {
    fn from(b: [u8; N]) -> Piece {
        Piece::Bytes(b.to_vec())
    }
}

impl From<Vec<u8>> for Piece {
    fn from(b: Vec<u8>) -> Piece {
        Piece::Bytes(b)
    }
}

/// The reply to one request, in the pieces it is written in.
type Reply = Vec<Piece>;

struct Ctx {
    export: Arc<Export>,
    structured: bool,
    allocation_context: Option<u32>,
}

/// What the thread holding the read side does next.
enum Next {
    Run(Request, AlignedBuf),
    /// Refused before running (a write too large); the reply is ready.
    Answer(Reply),
    /// NBD_CMD_DISC, end of stream or a broken stream: no more requests.
    Stop,
}

struct Conn {
    ctx: Ctx,
    /// std's mutexes, not parking_lot's, for the two every request queues on: parking_lot
    /// spins with sched_yield before sleeping, which on two cores takes CPU from the thread
    /// doing the work (as on the iSCSI side).
    reader: std::sync::Mutex<Option<BufReader<TcpStream>>>,
    writer: std::sync::Mutex<TcpStream>,
    /// Threads serving the connection, and those among them waiting to read.
    threads: AtomicUsize,
    idle: AtomicUsize,
    handles: Mutex<Vec<std::thread::JoinHandle<()>>>,
    error: Mutex<Option<io::Error>>,
}

/// Serves a negotiated connection until the client leaves; blocking.
pub fn run(sock: TcpStream, n: Negotiated) -> io::Result<()> {
    n.export.connections.fetch_add(1, Ordering::Relaxed);
    let export = n.export.clone();
    let r = serve_requests(sock, n);
    export.connections.fetch_sub(1, Ordering::Relaxed);
    r
}

fn serve_requests(sock: TcpStream, n: Negotiated) -> io::Result<()> {
    let conn = Arc::new(Conn {
        ctx: Ctx {
            export: n.export,
            structured: n.structured,
            allocation_context: n.allocation_context,
        },
        reader: std::sync::Mutex::new(Some(BufReader::with_capacity(256 << 10, sock.try_clone()?))),
        writer: std::sync::Mutex::new(sock.try_clone()?),
        threads: AtomicUsize::new(1),
        idle: AtomicUsize::new(0),
        handles: Mutex::new(Vec::new()),
        error: Mutex::new(None),
    });
    serve_thread(&conn);
    // The first thread is the last to go: wait for the others, which finish what they took.
    loop {
        let hs: Vec<_> = std::mem::take(&mut *conn.handles.lock());
        if hs.is_empty() {
            break;
        }
        for h in hs {
            let _ = h.join();
        }
    }
    let _ = sock.shutdown(Shutdown::Both);
    let error = conn.error.lock().take();
    match error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn serve_thread(conn: &Arc<Conn>) {
    loop {
        conn.idle.fetch_add(1, Ordering::AcqRel);
        let next = {
            // A thread that panicked holding it was between requests or left the stream
            // broken, which the next read reports.
            let mut guard = conn.reader.lock().unwrap_or_else(|e| e.into_inner());
            conn.idle.fetch_sub(1, Ordering::AcqRel);
            let Some(r) = guard.as_mut() else {
                return;
            };
            let next = match next_request(r, &conn.ctx) {
                Ok(n) => n,
                Err(e) => {
                    if e.kind() != io::ErrorKind::UnexpectedEof {
                        *conn.error.lock() = Some(e);
                    }
                    Next::Stop
                }
            };
            if matches!(next, Next::Stop) {
                *guard = None;
                return;
            }
            next
        };
        // Nobody left to read the next request while this one runs: add a thread.
        if conn.idle.load(Ordering::Acquire) == 0 && conn.threads.load(Ordering::Acquire) < MAX_IN_FLIGHT {
            conn.threads.fetch_add(1, Ordering::AcqRel);
            let c = conn.clone();
            match std::thread::Builder::new()
                .name("nbd-conn".into())
                .spawn(move || serve_thread(&c))
            {
                Ok(h) => conn.handles.lock().push(h),
                Err(e) => {
                    conn.threads.fetch_sub(1, Ordering::AcqRel);
                    warn!(error = %e, "cannot start another NBD thread; the connection goes on with fewer");
                }
            }
        }
        let reply = match next {
            Next::Run(req, payload) => execute(&conn.ctx, &req, &payload),
            Next::Answer(reply) => reply,
            Next::Stop => unreachable!("returned above"),
        };
        if let Err(e) = send(&conn.writer, reply) {
            // The client is gone. Shutting the socket down (through the writer's handle: the
            // reader's lock may be held by a thread blocked in a read) ends that read too.
            debug!(error = %e, "NBD reply not sent");
            let _ = lock(&conn.writer).shutdown(Shutdown::Both);
        }
    }
}

/// Reads the next request and its data.
fn next_request(r: &mut BufReader<TcpStream>, ctx: &Ctx) -> io::Result<Next> {
    let mut head = [0u8; REQUEST_LEN];
    r.read_exact(&mut head)?;
    // Out of step with the client: nothing after this can be trusted.
    let req = Request::parse(&head).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    if req.kind == cmd::DISC {
        return Ok(Next::Stop);
    }
    let mut payload = AlignedBuf::zeroed(0);
    if req.kind == cmd::WRITE {
        if req.length > MAX_PAYLOAD {
            // Stay in step: swallow the data, then refuse.
            io::copy(&mut r.by_ref().take(req.length as u64), &mut io::sink())?;
            let msg = format!("a write of {} bytes exceeds the {MAX_PAYLOAD}-byte limit", req.length);
            return Ok(Next::Answer(error_reply(ctx, &req, errno::EOVERFLOW, &msg)));
        }
        payload = AlignedBuf::zeroed(req.length as usize);
        r.read_exact(&mut payload)?;
    }
    Ok(Next::Run(req, payload))
}

/// The send side; a thread that panicked while sending left at worst a torn reply, which the
/// client detects, so the lock is taken over rather than poisoned for good.
fn lock(w: &std::sync::Mutex<TcpStream>) -> std::sync::MutexGuard<'_, TcpStream> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

fn send(w: &std::sync::Mutex<TcpStream>, reply: Reply) -> io::Result<()> {
    let mut w = lock(w);
    let mut slices: Vec<io::IoSlice> = reply
        .iter()
        .map(|p| io::IoSlice::new(p.as_ref()))
        .filter(|p| !p.is_empty())
        .collect();
    let mut parts = &mut slices[..];
    // One writev for the whole reply, again for whatever a short write left.
    while !parts.is_empty() {
        match w.write_vectored(parts) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut parts, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
        vec![chunk_header(req.cookie, chunk::FLAG_DONE, chunk::NONE, 0).into()]
    } else {
        vec![simple_reply(req.cookie, 0).into()]
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
            chunk_header(req.cookie, chunk::FLAG_DONE, chunk::ERROR, p.len() as u32).into(),
            p.into(),
        ]
    } else {
        vec![simple_reply(req.cookie, code).into()]
    }
}

fn read(ctx: &Ctx, req: &Request) -> Result<Reply, Failure> {
    let v = &ctx.export.vdisk;
    let len = req.length as usize;
    if !ctx.structured {
        let mut buf = AlignedBuf::zeroed(len);
        if len > 0 {
            v.read(req.offset, &mut buf).map_err(volume_error)?;
        }
        warm(&buf);
        return Ok(vec![simple_reply(req.cookie, 0).into(), Piece::Data(buf)]);
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
            let mut data = AlignedBuf::zeroed(x.len as usize);
            v.read(x.offset, &mut data).map_err(volume_error)?;
            let mut head = chunk_header(req.cookie, flags, chunk::OFFSET_DATA, 8 + x.len as u32).to_vec();
            head.extend_from_slice(&x.offset.to_be_bytes());
            reply.push(head.into());
            warm(&data);
            reply.push(Piece::Data(data));
        } else {
            let mut p = x.offset.to_be_bytes().to_vec();
            p.extend_from_slice(&(x.len as u32).to_be_bytes());
            let mut head = chunk_header(req.cookie, flags, chunk::OFFSET_HOLE, 12).to_vec();
            head.extend_from_slice(&p);
            reply.push(head.into());
        }
    }
    Ok(reply)
}

/// Brings data the disk has just written into memory into this CPU's cache, one load per
/// cache line. The reply is copied into the socket under the send lock, which every reply of
/// the connection queues for; a cold 256 KiB copy made that lock the bottleneck of large
/// reads. Warmed here, the cache misses are paid outside the lock, in parallel.
fn warm(data: &[u8]) {
    let mut acc = 0u8;
    for line in data.chunks(64) {
        acc ^= line[0];
    }
    std::hint::black_box(acc);
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
        chunk_header(req.cookie, chunk::FLAG_DONE, chunk::BLOCK_STATUS, p.len() as u32).into(),
        p.into(),
    ])
}
