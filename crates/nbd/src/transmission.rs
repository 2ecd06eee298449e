//! The transmission phase, server side: what each request does and the reply it gets. The
//! connection loop that receives requests and sends replies is in `conn`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tessera_disk::AlignedBuf;
use tessera_disk::IoOp;
use tessera_volume::{as_writer, VolumeError};
use tracing::{debug, warn};

use crate::export::{Export, MAX_PAYLOAD};
use crate::proto::*;

/// A piece of a reply: protocol bytes, or data read from the vdisk into a buffer aligned for
/// direct I/O (so the disk reads straight into it, and the socket writes straight from it).
pub(crate) enum Piece {
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
pub(crate) type Reply = Vec<Piece>;

/// What every request of a connection needs: the export and what was negotiated.
pub(crate) struct Ctx {
    pub export: Arc<Export>,
    pub structured: bool,
    pub allocation_context: Option<u32>,
    pub buffers: Buffers,
    /// When each request in flight arrived, by cookie, while the export is metered.
    pub arrivals: Mutex<HashMap<u64, Instant>>,
}

impl Ctx {
    /// Notes a request's arrival, for its latency (DISC is never answered).
    pub fn arrived(&self, req: &Request) {
        if self.export.meter.is_some() && req.kind != cmd::DISC {
            self.arrivals.lock().insert(req.cookie, Instant::now());
        }
    }

    /// Reports a request answered to the export's meter: its operation, bytes and latency.
    fn answered(&self, req: &Request, ok: bool) {
        let Some(m) = &self.export.meter else { return };
        let Some(at) = self.arrivals.lock().remove(&req.cookie) else {
            return;
        };
        let op = match req.kind {
            cmd::READ => IoOp::Read,
            cmd::WRITE => IoOp::Write,
            cmd::FLUSH => IoOp::Flush,
            cmd::TRIM => IoOp::Unmap,
            cmd::WRITE_ZEROES => IoOp::Zero,
            _ => IoOp::Other,
        };
        let bytes = match op {
            IoOp::Read | IoOp::Write => req.length as u64,
            _ => 0,
        };
        m.done(op, bytes, at.elapsed(), ok);
    }
}

/// Data buffers the connection has used, for its next requests: a fresh buffer costs an
/// allocation and zeroing (7 % of the CPU of a 256K read), and a connection's requests tend
/// to be of few sizes. A buffer keeps the data of the request that used it last, which can
/// only be this export's; a read overwrites all of it before it is sent, a write's payload is
/// filled from the socket.
#[derive(Default)]
pub(crate) struct Buffers(Mutex<Vec<AlignedBuf>>);

/// Bytes of buffers kept per connection, at most.
const KEPT_BUFFER_BYTES: usize = 4 << 20;

impl Buffers {
    /// A buffer of `len` bytes; its contents are unspecified.
    pub fn take(&self, len: usize) -> AlignedBuf {
        let mut kept = self.0.lock();
        match kept.iter().rposition(|b| b.len() == len) {
            Some(i) => kept.swap_remove(i),
            None => AlignedBuf::zeroed(len),
        }
    }

    /// Keeps `b` for a later `take`; the longest kept give way when they would exceed the
    /// bound (sizes drift as the workload changes).
    pub fn give_back(&self, b: AlignedBuf) {
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

/// The bytes a request holds while it is served (its READ buffer or WRITE payload); a WRITE
/// too large to take is skipped, not held.
pub(crate) fn charge(req: &Request) -> usize {
    match req.kind {
        cmd::READ | cmd::WRITE if req.length <= MAX_PAYLOAD => req.length as usize,
        _ => 0,
    }
}

/// Runs one request and builds its reply.
pub(crate) fn execute(ctx: &Ctx, req: &Request, payload: &[u8]) -> Reply {
    match as_writer(ctx.export.writer, || try_execute(ctx, req, payload)) {
        Ok(reply) => reply,
        Err((code, msg)) => error_reply(ctx, req, code, &msg),
    }
}

pub(crate) type Failure = (u32, String);

pub(crate) fn volume_error(e: VolumeError) -> Failure {
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
pub(crate) fn check(ctx: &Ctx, req: &Request) -> Result<(), Failure> {
    let e = &ctx.export;
    if e.withdrawn() {
        return Err((errno::ESHUTDOWN, format!("export '{}' was removed", e.name)));
    }
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
        cmd::BLOCK_STATUS => {
            let reply = block_status(ctx, req)?;
            ctx.answered(req, true);
            Ok(reply)
        }
        other => Err((errno::EINVAL, format!("unknown command {other}"))),
    }
}

/// Success without payload.
pub(crate) fn done(ctx: &Ctx, req: &Request) -> Reply {
    ctx.answered(req, true);
    if ctx.structured {
        vec![chunk_header(req.cookie, chunk::FLAG_DONE, chunk::NONE, 0).into()]
    } else {
        vec![simple_reply(req.cookie, 0).into()]
    }
}

pub(crate) fn error_reply(ctx: &Ctx, req: &Request, code: u32, msg: &str) -> Reply {
    ctx.answered(req, false);
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
pub(crate) struct Part {
    pub extent: tessera_volume::Extent,
    pub data: Option<AlignedBuf>,
}

/// The parts a (checked) READ answers with, their buffers still to fill: the whole range for
/// simple replies, or mapped extents and holes for structured ones (one piece if the client
/// asked for DF).
pub(crate) fn reply_parts(ctx: &Ctx, req: &Request) -> Result<Vec<Part>, Failure> {
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
pub(crate) fn read_reply(ctx: &Ctx, req: &Request, parts: Vec<Part>) -> Reply {
    if !ctx.structured || !parts.is_empty() {
        ctx.answered(req, true);
    }
    if !ctx.structured {
        let mut reply = vec![simple_reply(req.cookie, 0).into()];
        reply.extend(parts.into_iter().filter_map(|p| p.data).map(Piece::Data));
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
pub(crate) fn read_batch(ctx: &Ctx, reqs: &[Request]) -> Reply {
    let mut plans: Vec<Result<Vec<Part>, Failure>> = reqs
        .iter()
        .map(|req| check(ctx, req).and_then(|()| reply_parts(ctx, req)))
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

/// The most of a vdisk one BLOCK_STATUS answers for: the extents of a longer request are
/// given for its start only (the protocol lets a reply cover less than asked; clients ask
/// again from where it ends), so that a request costs a bounded amount of memory whatever
/// the vdisk's grains (4 GiB of 4 KiB grains written one in two would be a million extents).
pub const MAX_BLOCK_STATUS_SPAN: u64 = 256 << 20;

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
        .extents(req.offset, (req.length as u64).min(MAX_BLOCK_STATUS_SPAN))
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
