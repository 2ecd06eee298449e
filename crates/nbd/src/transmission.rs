//! The transmission phase, server side. The vdisk does blocking disk I/O, so a connection is
//! served by its own threads, leader/follower style: one thread at a time reads the next
//! request off the socket, then runs it and writes the reply itself while another thread takes
//! over reading. No request changes threads, so a 4K read costs no hand-off between a reader,
//! a worker pool and a writer. Threads are added while every one is busy, up to
//! MAX_IN_FLIGHT, and all end with the connection. A READ is taken with the READs already
//! received behind it and they run as one batch (one disk submission, one writev).

use std::io::{self, BufRead, BufReader, Read, Write};
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
/// READs already in the receive buffer behind a READ are taken with it, up to this many
/// requests and bytes, and run as one batch: one submission to the disks, one writev for
/// the replies. The byte bound keeps large reads apart, so that they overlap each other.
const MAX_BATCH: usize = 32;
const MAX_BATCH_BYTES: u64 = 256 << 10;

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
    buffers: Buffers,
}

/// Data buffers the connection has used, for its next requests: a fresh buffer costs an
/// allocation and zeroing (7 % of the CPU of a 256K read), and a connection's requests tend
/// to be of few sizes. A buffer keeps the data of the request that used it last, which can
/// only be this export's; a read overwrites all of it before it is sent, a write's payload is
/// filled from the socket.
#[derive(Default)]
struct Buffers(Mutex<Vec<AlignedBuf>>);

/// Bytes of buffers kept per connection, at most.
const KEPT_BUFFER_BYTES: usize = 4 << 20;

impl Buffers {
    /// A buffer of `len` bytes; its contents are unspecified.
    fn take(&self, len: usize) -> AlignedBuf {
        let mut kept = self.0.lock();
        match kept.iter().rposition(|b| b.len() == len) {
            Some(i) => kept.swap_remove(i),
            None => AlignedBuf::zeroed(len),
        }
    }

    /// Keeps `b` for a later `take`; the longest kept give way when they would exceed the
    /// bound (sizes drift as the workload changes).
    fn give_back(&self, b: AlignedBuf) {
        if b.is_empty() || b.len() > KEPT_BUFFER_BYTES {
            return;
        }
        let mut kept = self.0.lock();
        let mut bytes = kept.iter().map(|k| k.len()).sum::<usize>() + b.len();
        while bytes > KEPT_BUFFER_BYTES {
            bytes -= kept.remove(0).len();
        }
        kept.push(b);
    }
}

/// What the thread holding the read side does next.
enum Next {
    Run(Request, AlignedBuf),
    /// A READ and those that arrived with it, run as one batch.
    Reads(Vec<Request>),
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
            buffers: Buffers::default(),
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
            Next::Run(req, payload) => {
                let reply = execute(&conn.ctx, &req, &payload);
                conn.ctx.buffers.give_back(payload);
                reply
            }
            Next::Reads(reqs) => read_batch(&conn.ctx, &reqs),
            Next::Answer(reply) => reply,
            Next::Stop => unreachable!("returned above"),
        };
        if let Err(e) = send(&conn.writer, &conn.ctx.buffers, reply) {
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
    if req.kind == cmd::READ {
        return Ok(queued_reads(r, req));
    }
    let mut payload = AlignedBuf::zeroed(0);
    if req.kind == cmd::WRITE {
        if req.length > MAX_PAYLOAD {
            // Stay in step: swallow the data, then refuse.
            io::copy(&mut r.by_ref().take(req.length as u64), &mut io::sink())?;
            let msg = format!("a write of {} bytes exceeds the {MAX_PAYLOAD}-byte limit", req.length);
            return Ok(Next::Answer(error_reply(ctx, &req, errno::EOVERFLOW, &msg)));
        }
        payload = ctx.buffers.take(req.length as usize);
        r.read_exact(&mut payload)?;
    }
    Ok(Next::Run(req, payload))
}

/// The send side; a thread that panicked while sending left at worst a torn reply, which the
/// client detects, so the lock is taken over rather than poisoned for good.
fn lock(w: &std::sync::Mutex<TcpStream>) -> std::sync::MutexGuard<'_, TcpStream> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// A READ, with the READs already whole in the receive buffer behind it (no socket read).
fn queued_reads(r: &mut BufReader<TcpStream>, first: Request) -> Next {
    let mut bytes = first.length as u64;
    let mut reqs = vec![first];
    while reqs.len() < MAX_BATCH {
        let Some(head) = r.buffer().first_chunk::<REQUEST_LEN>() else {
            break;
        };
        // Anything else, or anything malformed, is left for the next read to handle.
        match Request::parse(head) {
            Ok(q) if q.kind == cmd::READ && bytes + q.length as u64 <= MAX_BATCH_BYTES => {
                bytes += q.length as u64;
                r.consume(REQUEST_LEN);
                reqs.push(q);
            }
            _ => break,
        }
    }
    Next::Reads(reqs)
}

/// Writes the reply, then keeps its data buffers for the next requests.
fn send(w: &std::sync::Mutex<TcpStream>, buffers: &Buffers, reply: Reply) -> io::Result<()> {
    let sent = write_reply(w, &reply);
    for p in reply {
        if let Piece::Data(b) = p {
            buffers.give_back(b);
        }
    }
    sent
}

fn write_reply(w: &std::sync::Mutex<TcpStream>, reply: &Reply) -> io::Result<()> {
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

/// What every request is checked for before it runs: its range, its alignment, and that a
/// write goes to a writable export.
fn check(ctx: &Ctx, req: &Request) -> Result<(), Failure> {
    let e = &ctx.export;
    let v = &e.vdisk;
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
    if req.kind == cmd::READ && req.length > MAX_PAYLOAD {
        return Err((
            errno::EINVAL,
            format!("a read of {} bytes exceeds the {MAX_PAYLOAD}-byte limit", req.length),
        ));
    }
    Ok(())
}

/// Every command but READ, which runs through `read_batch`.
fn try_execute(ctx: &Ctx, req: &Request, payload: &[u8]) -> Result<Reply, Failure> {
    check(ctx, req)?;
    let v = &ctx.export.vdisk;
    let fua = req.flags & cflag::FUA != 0;
    match req.kind {
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

/// A piece of a read's reply: an extent, with its data unless it is a hole.
struct Part {
    extent: tessera_volume::Extent,
    data: Option<AlignedBuf>,
}

/// The parts a (checked) READ answers with, their buffers still to fill: the whole range for
/// simple replies, or mapped extents and holes for structured ones (one piece if the client
/// asked for DF).
fn plan_read(ctx: &Ctx, req: &Request) -> Result<Vec<Part>, Failure> {
    let len = req.length as u64;
    if len == 0 {
        return Ok(Vec::new());
    }
    let whole = tessera_volume::Extent {
        offset: req.offset,
        len,
        mapped: true,
    };
    let extents = if !ctx.structured || req.flags & cflag::DF != 0 {
        vec![whole]
    } else {
        ctx.export.vdisk.extents(req.offset, len).map_err(volume_error)?
    };
    Ok(extents
        .into_iter()
        .map(|x| Part {
            extent: x,
            data: x.mapped.then(|| ctx.buffers.take(x.len as usize)),
        })
        .collect())
}

/// The reply to a READ whose parts are filled.
fn read_reply(ctx: &Ctx, req: &Request, parts: Vec<Part>) -> Reply {
    if !ctx.structured {
        let mut reply = vec![simple_reply(req.cookie, 0).into()];
        reply.extend(parts.into_iter().filter_map(|p| p.data).map(|d| {
            warm(&d);
            Piece::Data(d)
        }));
        return reply;
    }
    if parts.is_empty() {
        return done(ctx, req);
    }
    let mut reply = Vec::with_capacity(parts.len() * 2);
    let last = parts.len() - 1;
    for (i, p) in parts.into_iter().enumerate() {
        let flags = if i == last { chunk::FLAG_DONE } else { 0 };
        let x = p.extent;
        match p.data {
            Some(data) => {
                let mut head = chunk_header(req.cookie, flags, chunk::OFFSET_DATA, 8 + x.len as u32).to_vec();
                head.extend_from_slice(&x.offset.to_be_bytes());
                warm(&data);
                reply.push(head.into());
                reply.push(Piece::Data(data));
            }
            None => {
                let mut head = chunk_header(req.cookie, flags, chunk::OFFSET_HOLE, 12).to_vec();
                head.extend_from_slice(&x.offset.to_be_bytes());
                head.extend_from_slice(&(x.len as u32).to_be_bytes());
                reply.push(head.into());
            }
        }
    }
    reply
}

/// Runs READs as one batch: each is checked and planned as if alone, the data of all of them
/// is read with one `Vdisk::read_many`, and the replies follow in request order.
fn read_batch(ctx: &Ctx, reqs: &[Request]) -> Reply {
    let mut plans: Vec<Result<Vec<Part>, Failure>> = reqs
        .iter()
        .map(|req| check(ctx, req).and_then(|()| plan_read(ctx, req)))
        .collect();
    let mut io: Vec<(u64, &mut [u8])> = Vec::new();
    let mut owner = Vec::new();
    for (i, plan) in plans.iter_mut().enumerate() {
        let Ok(parts) = plan else { continue };
        for p in parts.iter_mut() {
            if let Some(d) = &mut p.data {
                io.push((p.extent.offset, &mut d[..]));
                owner.push(i);
            }
        }
    }
    let done = ctx.export.vdisk.read_many(&mut io);
    drop(io);
    let mut failed: Vec<Option<Failure>> = reqs.iter().map(|_| None).collect();
    for (i, r) in owner.into_iter().zip(done) {
        if let (Err(e), None) = (r, &failed[i]) {
            failed[i] = Some(volume_error(e));
        }
    }
    let mut reply = Vec::new();
    for ((req, plan), fail) in reqs.iter().zip(plans).zip(failed) {
        reply.extend(match (plan, fail) {
            (Err((code, msg)), _) | (Ok(_), Some((code, msg))) => error_reply(ctx, req, code, &msg),
            (Ok(parts), None) => read_reply(ctx, req, parts),
        });
    }
    reply
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

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(b: &Buffers) -> Vec<usize> {
        b.0.lock().iter().map(|k| k.len()).collect()
    }

    #[test]
    fn buffers_are_reused_by_size_within_a_bound() {
        let b = Buffers::default();
        let first = b.take(256 << 10);
        let at = first.as_ptr();
        b.give_back(first);
        b.give_back(AlignedBuf::zeroed(4096));
        // The same size comes back (the latest kept); another size is made anew.
        assert_eq!(b.take(256 << 10).as_ptr(), at);
        assert_eq!(kept(&b), vec![4096]);
        assert_eq!(b.take(8192).len(), 8192);
        // Empty and oversized buffers are not kept; past the bound the oldest give way.
        b.give_back(AlignedBuf::zeroed(0));
        b.give_back(AlignedBuf::zeroed(KEPT_BUFFER_BYTES + 4096));
        assert_eq!(kept(&b), vec![4096]);
        for _ in 0..20 {
            b.give_back(AlignedBuf::zeroed(256 << 10));
        }
        let k = kept(&b);
        assert_eq!(k.iter().sum::<usize>(), KEPT_BUFFER_BYTES);
        assert!(k.iter().all(|&n| n == 256 << 10), "the 4 KiB buffer was the oldest");
    }
}
