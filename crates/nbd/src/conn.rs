//! One NBD connection after the handshake, served by one thread that never waits on a disk.
//! It receives requests from the socket, submits the disk reads of each READ the engine can
//! plan ([`Vdisk::try_plan_read`](tessera_volume::Vdisk::try_plan_read)) to an io_uring of
//! its own, and sends each reply as soon as it is ready, sleeping in one poll on the socket,
//! the ring and the workers only when none of them has anything for it. Requests that may
//! block (writes, flushes, trims, block status, reads that cannot be planned, reads that
//! failed on the disk) go to worker threads, whose replies come back through the same loop.
//! Replies leave in the order they are ready, as the protocol allows.
//!
//! A READ thus costs no hand-off between threads: on two shared cores, each wake-up of
//! another thread waited for a CPU, and a 256 KiB read spent more on those waits than on
//! its own work. Where io_uring is unavailable, READs go to the workers too.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_disk::{AlignedBuf, ReadRing, RingRead, RingWrite};
use tessera_volume::{as_writer, ReadPlan, WritePlan};
use tracing::{debug, warn};

use crate::export::MAX_PAYLOAD;
use crate::handshake::Negotiated;
use crate::proto::*;
use crate::transmission::{
    charge, check, done, error_reply, read_reply, reply_parts, Buffers, Ctx, Part, Piece, Reply,
};
use crate::workers::{self, Job, Workers};

/// Requests of one connection in flight at once (reads on the ring, jobs at the workers and
/// replies not yet sent); beyond it the loop stops receiving until some are answered.
const MAX_IN_FLIGHT: usize = 64;
/// Submission queue entries of a connection's ring.
const RING_ENTRIES: u32 = 128;
/// The receive buffer: the headers of many requests come in one recv. A write's payload
/// beyond what came with its header is received straight into its own buffer.
const INBOX_BYTES: usize = 64 << 10;
/// Slices handed to one writev, at most (IOV_MAX is 1024).
const MAX_SLICES: usize = 256;
/// Bytes of request data a connection may hold (READ buffers, WRITE payloads and replies not
/// yet sent); past it the loop stops receiving until some are answered and taken, so a client
/// that queues huge READs and never reads the replies holds this much and one request more.
pub const MAX_HELD_BYTES: usize = 64 << 20;

/// A connected stream the loop can drive without blocking: TCP, or a unix socket.
pub(crate) trait Socket: AsRawFd + Send + 'static {
    fn set_nonblocking(&self, on: bool) -> io::Result<()>;
    fn shutdown(&self) -> io::Result<()>;
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn send_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize>;
}

macro_rules! socket {
    ($t:ty) => {
        impl Socket for $t {
            fn set_nonblocking(&self, on: bool) -> io::Result<()> {
                <$t>::set_nonblocking(self, on)
            }
            fn shutdown(&self) -> io::Result<()> {
                <$t>::shutdown(self, Shutdown::Both)
            }
            fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
                (&*self).read(buf)
            }
            fn send_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
                (&*self).write_vectored(bufs)
            }
        }
    };
}
socket!(TcpStream);
socket!(UnixStream);

/// Serves a negotiated connection until the client leaves; blocking.
pub(crate) fn run<S: Socket>(sock: S, n: Negotiated) -> io::Result<()> {
    n.export.connections.fetch_add(1, Ordering::Relaxed);
    let export = n.export.clone();
    let r = serve(sock, n);
    export.connections.fetch_sub(1, Ordering::Relaxed);
    r
}

fn serve<S: Socket>(sock: S, n: Negotiated) -> io::Result<()> {
    sock.set_nonblocking(true)?;
    let ctx = Arc::new(Ctx {
        export: n.export,
        structured: n.structured,
        allocation_context: n.allocation_context,
        buffers: Buffers::default(),
        arrivals: Default::default(),
    });
    let ring = match ReadRing::new(RING_ENTRIES) {
        Ok(r) => Some(r),
        Err(e) => {
            debug!(error = %e, "io_uring unavailable: NBD reads go to worker threads");
            None
        }
    };
    let mut l = Loop {
        workers: Workers::new(ctx.clone())?,
        ctx,
        sock,
        ring,
        inbox: Inbox::new(),
        inline: VecDeque::new(),
        at_workers: 0,
        outbox: Outbox::default(),
        receiving: true,
        broken: false,
        error: None,
        held: 0,
    };
    l.run();
    l.release(l.held);
    let _ = l.sock.shutdown();
    match l.error.take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A request whose disk I/O is on the ring.
enum OnRing {
    Read(InFlight),
    Write(WriteInFlight),
}

/// A WRITE whose disk writes are on the ring: they read its payload, and the plan holds its
/// grains until they have completed.
struct WriteInFlight {
    req: Request,
    payload: AlignedBuf,
    plan: WritePlan,
}

/// A READ whose disk reads are on the ring.
struct InFlight {
    req: Request,
    parts: Vec<Part>,
    /// Held until every read has completed: they keep the grains and sets read from.
    plans: Vec<ReadPlan>,
}

/// Why a request is refused before it runs.
#[derive(Clone, Copy, PartialEq)]
enum Refusal {
    /// A WRITE larger than the protocol's portable maximum.
    TooLarge,
    /// Its export was removed.
    Withdrawn,
}

/// What the bytes after the last whole request belong to.
enum Partial {
    /// A WRITE's payload, `filled` bytes of it received.
    Payload {
        req: Request,
        buf: AlignedBuf,
        filled: usize,
    },
    /// The payload of a WRITE refused (too large, or its export removed), `left` bytes of it
    /// still to skip before the refusal is answered.
    Discard { req: Request, left: usize, why: Refusal },
}

struct Inbox {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    partial: Option<Partial>,
}

impl Inbox {
    fn new() -> Inbox {
        Inbox {
            buf: vec![0; INBOX_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            partial: None,
        }
    }

    fn available(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }

    /// Room to receive into, moving what is left to the front first.
    fn room(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        &mut self.buf[self.end..]
    }
}

/// Replies ready to send, in order, each with the bytes it holds; `sent` bytes of the first
/// have left.
#[derive(Default)]
struct Outbox {
    replies: VecDeque<(Reply, usize)>,
    sent: usize,
}

/// What a receive step ended on.
enum Received {
    /// Nothing more to read now.
    Drained,
    /// Progress was made; go on.
    More,
}

struct Loop<S> {
    ctx: Arc<Ctx>,
    sock: S,
    /// READs whose disk reads are in flight; None where io_uring is unavailable.
    ring: Option<ReadRing<OnRing>>,
    workers: Workers,
    /// Requests no worker could take (none could be started), to run on this thread from the
    /// top of the loop, where it holds no plan (`run_inline`).
    inline: VecDeque<Job>,
    inbox: Inbox,
    /// Requests at the workers or waiting in `inline`.
    at_workers: usize,
    outbox: Outbox,
    /// False after NBD_CMD_DISC, the end of the stream or a broken stream.
    receiving: bool,
    /// The socket cannot be written: replies are dropped.
    broken: bool,
    error: Option<io::Error>,
    /// Bytes of request data held (MAX_HELD_BYTES); the export's count includes them.
    held: usize,
}

impl<S: Socket> Loop<S> {
    fn charge(&mut self, n: usize) {
        self.held += n;
        self.ctx.export.held.fetch_add(n, Ordering::Relaxed);
        self.ctx.export.all_held.charge(n);
    }

    fn release(&mut self, n: usize) {
        self.held -= n;
        self.ctx.export.held.fetch_sub(n, Ordering::Relaxed);
        self.ctx.export.all_held.release(n);
    }

    /// Whether another request may be received now: within the connection's bounds, and the
    /// daemon's unless it holds nothing (held.rs). A connection held back by the daemon's
    /// holds something, and wakes when that is answered.
    fn room(&self) -> bool {
        self.in_flight() < MAX_IN_FLIGHT
            && self.held < MAX_HELD_BYTES
            && (self.held == 0 || !self.ctx.export.all_held.full())
    }

    fn run(&mut self) {
        loop {
            let mut progress = self.receive();
            // Withdrawn while idle (the socket drained above, nothing sent or on its way):
            // the connection ends now rather than at the client's next request, so that a
            // client that reconnects does so at once.
            if !progress && self.receiving && self.ctx.export.withdrawn() && self.idle_at_rest() {
                self.stop(None);
            }
            progress |= self.submit();
            progress |= self.reap();
            progress |= self.run_inline();
            progress |= self.collect();
            progress |= self.send();
            let idle = self.on_ring() == 0 && self.at_workers == 0;
            if !self.receiving && idle && (self.outbox.replies.is_empty() || self.broken) {
                return;
            }
            if !progress {
                self.wait();
            }
        }
    }

    /// Nothing received in part, nothing running, nothing left to send.
    fn idle_at_rest(&self) -> bool {
        self.inbox.partial.is_none() && self.inbox.available().is_empty() && self.in_flight() == 0
    }

    /// Requests accepted and not yet answered: running, or with a reply the client has not
    /// taken yet (one that sends and never reads must not make the outbox grow unbounded).
    fn in_flight(&self) -> usize {
        self.on_ring() + self.at_workers + self.outbox.replies.len()
    }

    fn on_ring(&self) -> usize {
        self.ring.as_ref().map_or(0, |r| r.in_flight())
    }

    fn stop(&mut self, error: Option<io::Error>) {
        self.receiving = false;
        if let Some(e) = error {
            if self.error.is_none() {
                self.error = Some(e);
            }
        }
    }

    /// Receives and starts requests until the socket has no more or enough are in flight.
    fn receive(&mut self) -> bool {
        let mut progress = false;
        // A write's payload is always taken in full: only new requests wait for room.
        while self.receiving && (self.inbox.partial.is_some() || self.room()) {
            let step = if self.inbox.partial.is_some() {
                self.receive_payload()
            } else if let Some(head) = self.inbox.available().first_chunk::<REQUEST_LEN>() {
                match Request::parse(head) {
                    Ok(req) => {
                        self.inbox.consume(REQUEST_LEN);
                        self.start(req);
                        Ok(Received::More)
                    }
                    // Out of step with the client: nothing after this can be trusted.
                    Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
                }
            } else {
                let room = self.inbox.room();
                match self.sock.recv(room) {
                    Ok(0) if self.inbox.available().is_empty() => {
                        self.stop(None);
                        Ok(Received::Drained)
                    }
                    Ok(0) => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the client left in the middle of a request",
                    )),
                    Ok(n) => {
                        self.inbox.end += n;
                        Ok(Received::More)
                    }
                    Err(e) => would_block(e),
                }
            };
            match step {
                Ok(Received::More) => progress = true,
                Ok(Received::Drained) => break,
                Err(e) => {
                    self.stop(Some(e));
                    break;
                }
            }
        }
        progress
    }

    /// Fills the payload of the write being received, or skips that of a refused one.
    fn receive_payload(&mut self) -> io::Result<Received> {
        let Inbox {
            buf: ibuf,
            start,
            end,
            partial,
        } = &mut self.inbox;
        let held = &ibuf[*start..*end];
        let from_inbox = !held.is_empty();
        let n = match partial.as_mut().expect("called with a partial request") {
            Partial::Payload { buf, filled, .. } => {
                let want = &mut buf[*filled..];
                let n = if from_inbox {
                    let n = want.len().min(held.len());
                    want[..n].copy_from_slice(&held[..n]);
                    n
                } else {
                    match self.sock.recv(want) {
                        Ok(n) => n,
                        Err(e) => return would_block(e),
                    }
                };
                *filled += n;
                n
            }
            Partial::Discard { left, .. } => {
                let n = if from_inbox {
                    (*left).min(held.len())
                } else {
                    match self.sock.recv(&mut ibuf[..(*left).min(INBOX_BYTES)]) {
                        Ok(n) => n,
                        Err(e) => return would_block(e),
                    }
                };
                *left -= n;
                n
            }
        };
        if from_inbox {
            self.inbox.consume(n);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the client left in the middle of a write's data",
            ));
        }
        let whole = match &self.inbox.partial {
            Some(Partial::Payload { buf, filled, .. }) => *filled == buf.len(),
            Some(Partial::Discard { left, .. }) => *left == 0,
            None => false,
        };
        if whole {
            match self.inbox.partial.take().expect("checked above") {
                Partial::Payload { req, buf, .. } => self.start_write(req, buf),
                Partial::Discard { req, why, .. } => self.refuse(&req, why),
            }
        }
        Ok(Received::More)
    }

    /// Starts a request whose header was just received; it holds its charge until answered.
    fn start(&mut self, req: Request) {
        self.ctx.arrived(&req);
        self.charge(charge(&req));
        let withdrawn = self.ctx.export.withdrawn() && req.kind != cmd::DISC;
        match req.kind {
            // Stay in step: skip the data, then refuse (the refused write's payload read
            // whole, so that closing the connection does not reset it under the reply).
            cmd::WRITE if req.length > 0 && (withdrawn || req.length > MAX_PAYLOAD) => {
                self.inbox.partial = Some(Partial::Discard {
                    req,
                    left: req.length as usize,
                    why: if withdrawn {
                        Refusal::Withdrawn
                    } else {
                        Refusal::TooLarge
                    },
                });
            }
            _ if withdrawn => self.refuse(&req, Refusal::Withdrawn),
            cmd::DISC => self.stop(None),
            cmd::READ => self.start_read(req),
            cmd::WRITE if req.length > 0 => {
                self.inbox.partial = Some(Partial::Payload {
                    req,
                    buf: self.ctx.buffers.take(req.length as usize),
                    filled: 0,
                });
            }
            _ => self.to_workers(Job {
                req,
                payload: AlignedBuf::zeroed(0),
            }),
        }
    }

    /// Answers a request refused before it ran. Once its export is removed, the connection
    /// ends after what it sent before is answered.
    fn refuse(&mut self, req: &Request, why: Refusal) {
        let reply = match why {
            Refusal::TooLarge => {
                let msg = format!("a write of {} bytes exceeds the {MAX_PAYLOAD}-byte limit", req.length);
                error_reply(&self.ctx, req, errno::EOVERFLOW, &msg)
            }
            Refusal::Withdrawn => error_reply(&self.ctx, req, errno::ESHUTDOWN, "the export was removed"),
        };
        self.answer(req, reply);
        if why == Refusal::Withdrawn {
            self.stop(None);
        }
    }

    fn to_workers(&mut self, job: Job) {
        self.at_workers += 1;
        if let Some(job) = self.workers.submit(job) {
            // No worker can take it: it runs on this thread, but not here, where plans of
            // this thread may still be held (a read's first parts, the requests settled
            // after this one): the engine's locks they hold may be the ones it needs.
            self.inline.push_back(job);
        }
    }

    /// Runs the requests no worker could take, once what is on the ring is done: the plans
    /// of those requests may hold grains they need, and only this thread lets them go.
    fn run_inline(&mut self) -> bool {
        if self.inline.is_empty() {
            return false;
        }
        // Ring I/O that failed comes back here to be run again.
        self.drain_ring();
        while let Some(job) = self.inline.pop_front() {
            self.at_workers -= 1;
            let charged = charge(&job.req);
            let reply = workers::run(&self.ctx, job);
            self.release(charged);
            self.reply(reply);
        }
        true
    }

    /// Queues a reply to send; it holds its own bytes until sent. The request it answers has
    /// given back its charge.
    fn reply(&mut self, reply: Reply) {
        let bytes = reply.iter().map(|p| p.as_ref().len()).sum();
        self.charge(bytes);
        self.outbox.replies.push_back((reply, bytes));
    }

    /// Answers a charged request here, giving back its charge.
    fn answer(&mut self, req: &Request, reply: Reply) {
        self.release(charge(req));
        self.reply(reply);
    }

    /// A READ: its disk reads go on the ring when the engine can plan them all; otherwise,
    /// or when nothing needs the disk, it is answered here or by a worker.
    fn start_read(&mut self, req: Request) {
        if self.ring.is_none() {
            return self.to_workers(Job {
                req,
                payload: AlignedBuf::zeroed(0),
            });
        }
        let mut parts = match check(&self.ctx, &req).and_then(|()| reply_parts(&self.ctx, &req)) {
            Ok(parts) => parts,
            Err((code, msg)) => {
                let reply = error_reply(&self.ctx, &req, code, &msg);
                return self.answer(&req, reply);
            }
        };
        let vdisk = &self.ctx.export.vdisk;
        let mut plans = Vec::new();
        for p in &mut parts {
            let Some(data) = &mut p.data else { continue };
            match vdisk.try_plan_read(p.extent.offset, data.len()) {
                Some(plan) => {
                    for z in &plan.zeros {
                        data[z.clone()].fill(0);
                    }
                    plans.push(plan);
                }
                None => {
                    give_back_parts(&self.ctx.buffers, parts);
                    return self.to_workers(Job {
                        req,
                        payload: AlignedBuf::zeroed(0),
                    });
                }
            }
        }
        // Where each read goes: data parts and plans pair up in order.
        let mut reads = Vec::new();
        let data = parts.iter_mut().filter_map(|p| p.data.as_mut());
        for (buf, plan) in data.zip(&mut plans) {
            let scratch = plan.scratch_ptr();
            for r in &plan.reads {
                reads.push(RingRead {
                    via: r.via.clone(),
                    // SAFETY (scratch): the plan made its scratch buffer for these reads;
                    // it travels with the plan in the InFlight, as the parts' buffers do.
                    at: if r.scratch {
                        unsafe { scratch.add(r.buf_off) }
                    } else {
                        buf[r.buf_off..r.buf_off + r.len].as_mut_ptr()
                    },
                    len: r.len as u32,
                    offset: r.offset,
                    io: r.disk.io().cloned(),
                });
            }
        }
        if reads.is_empty() {
            // Holes and unmapped grains only.
            drop(plans);
            let reply = read_reply(&self.ctx, &req, parts);
            return self.answer(&req, reply);
        }
        let ring = self.ring.as_mut().expect("checked above");
        // SAFETY: the reads fill the parts' buffers, which travel with the InFlight in the
        // ring until they have completed (dropping the ring waits for them).
        unsafe { ring.start(OnRing::Read(InFlight { req, parts, plans }), &reads) };
    }

    /// Hands the queued reads to the kernel.
    fn submit(&mut self) -> bool {
        self.ring.as_mut().is_some_and(|r| r.submit())
    }

    /// Takes the completed disk reads; replies to each READ whose reads are all done.
    fn reap(&mut self) -> bool {
        let Some(ring) = self.ring.as_mut() else {
            return false;
        };
        let mut done = Vec::new();
        if !ring.reap(&mut done) {
            return false;
        }
        self.settle(done);
        true
    }

    /// Waits for every request on the ring and answers them.
    fn drain_ring(&mut self) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let mut done = Vec::new();
        ring.drain(&mut done);
        self.settle(done);
    }

    /// Answers the requests whose disk I/O on the ring completed.
    fn settle(&mut self, done: Vec<(OnRing, bool)>) {
        for (f, ok) in done {
            match f {
                OnRing::Read(f) => self.finish(f, ok),
                OnRing::Write(w) => self.finish_write(w, ok),
            }
        }
    }

    fn finish(&mut self, mut f: InFlight, ok: bool) {
        // Data parts and plans pair up in order, as when they were started.
        let data = f.parts.iter_mut().filter_map(|p| p.data.as_mut());
        let ok = ok && data.zip(&f.plans).all(|(buf, plan)| plan.finish(buf));
        drop(f.plans);
        if !ok {
            // The synchronous path reads around a failing member (or a block that does not
            // match its checksum) and repairs it.
            debug!(
                cookie = f.req.cookie,
                "a read on the ring failed or did not match its checksums; read again"
            );
            give_back_parts(&self.ctx.buffers, f.parts);
            return self.to_workers(Job {
                req: f.req,
                payload: AlignedBuf::zeroed(0),
            });
        }
        let reply = read_reply(&self.ctx, &f.req, f.parts);
        self.answer(&f.req, reply);
    }

    /// A WRITE whose payload has arrived: its disk writes go on the ring when the engine can
    /// plan them (an overwrite in place on disks that write in the background, a pool on
    /// RADOS); otherwise it goes to a worker. FUA needs nothing more: the disks complete a
    /// planned write once it is as durable as a flush makes it.
    fn start_write(&mut self, req: Request, payload: AlignedBuf) {
        let plan = match self.ring {
            Some(_) if check(&self.ctx, &req).is_ok() => {
                // The plan finishes on this thread, but notes the writer it was made for.
                as_writer(self.ctx.export.writer, || {
                    self.ctx.export.vdisk.try_plan_write(req.offset, payload.len())
                })
            }
            _ => None,
        };
        let Some(plan) = plan else {
            return self.to_workers(Job { req, payload });
        };
        let writes: Vec<RingWrite> = plan.writes.iter().map(|w| w.write.on(&payload)).collect();
        let ring = self.ring.as_mut().expect("checked above");
        // SAFETY: the writes read the payload, which travels with the request in the ring,
        // unchanged, until they have completed (dropping the ring waits for them).
        unsafe { ring.start_writes(OnRing::Write(WriteInFlight { req, payload, plan }), &writes) };
    }

    fn finish_write(&mut self, w: WriteInFlight, ok: bool) {
        let WriteInFlight { req, payload, plan } = w;
        if !ok {
            // Nothing was answered: the synchronous path writes it again, and tells the
            // client why it fails if it does.
            drop(plan);
            debug!(cookie = req.cookie, "a write on the ring failed; write again");
            return self.to_workers(Job { req, payload });
        }
        plan.finish();
        self.ctx.buffers.give_back(payload);
        let reply = done(&self.ctx, &req);
        self.answer(&req, reply);
    }

    /// Takes the replies the workers have finished.
    fn collect(&mut self) -> bool {
        if self.at_workers == 0 {
            return false;
        }
        let replies = self.workers.collect();
        self.at_workers -= replies.len();
        let progress = !replies.is_empty();
        for (reply, charged) in replies {
            self.release(charged);
            self.reply(reply);
        }
        progress
    }

    /// Writes ready replies until the socket takes no more.
    fn send(&mut self) -> bool {
        let mut progress = false;
        while !self.outbox.replies.is_empty() {
            if self.broken {
                let mut freed = 0;
                for (r, bytes) in self.outbox.replies.drain(..) {
                    give_back(&self.ctx.buffers, r);
                    freed += bytes;
                }
                self.release(freed);
                return true;
            }
            let mut slices = Vec::with_capacity(MAX_SLICES);
            let mut skip = self.outbox.sent;
            'all: for (r, _) in &self.outbox.replies {
                for p in r {
                    let b = p.as_ref();
                    if skip >= b.len() {
                        skip -= b.len();
                        continue;
                    }
                    slices.push(io::IoSlice::new(&b[skip..]));
                    skip = 0;
                    if slices.len() == MAX_SLICES {
                        break 'all;
                    }
                }
            }
            let written = self.sock.send_vectored(&slices);
            drop(slices);
            match written {
                Ok(0) => self.broken_pipe(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    progress = true;
                    self.sent(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.broken_pipe(e),
            }
        }
        progress
    }

    /// The client is gone: no more requests, and replies are dropped.
    fn broken_pipe(&mut self, e: io::Error) {
        debug!(error = %e, "NBD reply not sent");
        self.broken = true;
        self.stop(None);
    }

    /// Drops the first `n` bytes of the outbox, giving back the buffers of whole replies.
    fn sent(&mut self, mut n: usize) {
        while n > 0 {
            let o = &mut self.outbox;
            let Some((_, bytes)) = o.replies.front() else { break };
            let left = bytes - o.sent;
            if n < left {
                o.sent += n;
                return;
            }
            n -= left;
            o.sent = 0;
            let (r, bytes) = o.replies.pop_front().expect("front exists");
            give_back(&self.ctx.buffers, r);
            self.release(bytes);
        }
    }

    /// Sleeps until the socket, the ring or the workers have something for the loop.
    fn wait(&mut self) {
        let mut sock_events = 0;
        if self.receiving && (self.inbox.partial.is_some() || self.room()) {
            sock_events |= libc::POLLIN;
        }
        if !self.outbox.replies.is_empty() && !self.broken {
            sock_events |= libc::POLLOUT;
        }
        // A negative descriptor is skipped: a hung-up socket would otherwise wake the loop
        // again and again while it waits for reads to finish.
        let watch = |fd: RawFd, events: i16| libc::pollfd {
            fd: if events != 0 { fd } else { -1 },
            events,
            revents: 0,
        };
        let ring_fd = self.ring.as_ref().map_or(-1, |r| r.fd());
        // Watched while idle, withdrawn or not (a removal between the loop's look and this
        // poll is then still seen); a withdrawn idle connection stops at the next turn, so
        // the descriptor, readable for good once written, never spins the loop.
        let withdrawal = match self.receiving && self.idle_at_rest() {
            true => self.ctx.export.withdrawal_fd().unwrap_or(-1),
            false => -1,
        };
        let mut fds = [
            watch(self.sock.as_raw_fd(), sock_events),
            watch(
                self.workers.ready_fd(),
                if self.at_workers > 0 { libc::POLLIN } else { 0 },
            ),
            watch(ring_fd, if self.on_ring() > 0 { libc::POLLIN } else { 0 }),
            watch(withdrawal, libc::POLLIN),
        ];
        // SAFETY: fds is a valid array of pollfd for the duration of the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                warn!(error = %e, "poll failed on an NBD connection");
                self.stop(Some(e));
                self.broken = true;
            }
        }
    }
}

fn would_block(e: io::Error) -> io::Result<Received> {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Received::Drained),
        _ => Err(e),
    }
}

/// Keeps the data buffers of a reply for the next requests.
fn give_back(buffers: &Buffers, reply: Reply) {
    for p in reply {
        if let Piece::Data(b) = p {
            buffers.give_back(b);
        }
    }
}

/// Keeps the data buffers of a read that will not be answered from them.
fn give_back_parts(buffers: &Buffers, parts: Vec<Part>) {
    for b in parts.into_iter().filter_map(|p| p.data) {
        buffers.give_back(b);
    }
}
