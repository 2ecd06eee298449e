//! A connection in the full feature phase.
//!
//! Login runs on a tokio task; then the session is served by threads of its own, leader/
//! follower style. One thread at a time holds the read side: it receives PDUs without
//! blocking, takes in Data-Out and answers NOP-Out, text and task management itself, and
//! starts the READs the LUN can plan on an io_uring of the read side's own, answering each as
//! its disk reads complete; it sleeps in one poll on the socket and that ring. Any other
//! SCSI command (and a READ that cannot be planned) it runs itself, after leaving the read
//! side, with the reads in flight on its ring, to another thread. So a queue of small READs
//! costs no hand-off between threads at all, and a command that blocks never holds up
//! reading. Sending takes one lock, which stamps StatSN, ExpCmdSN and MaxCmdSN in the order
//! PDUs reach the socket.

use std::collections::HashMap;
use std::io::{self, IoSlice, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_disk::ReadRing;
use tessera_scsi::{
    decode_lun, is_read, report_luns, sense, transfer_length, Data, Lun, Nexus, PlannedRead, ReadStart, Response,
    Scope, REPORT_LUNS,
};
use tokio::io::AsyncWriteExt;
use tracing::{debug, info, warn};

use crate::auth::Chap;
use crate::inbox::Inbox;
use crate::limits::{Charge, ConnectionSlot, WriteBudget};
use crate::login::{login, LoggedIn, CMD_WINDOW};
use crate::params::Params;
use crate::pdu::{data_segment_length, op, put32, wire_len, Pdu, PduError, BHS_LEN};
use crate::target::{Registry, Target};
use crate::text;

/// Idle time before we ping the initiator with a NOP-In, and how long it has to answer.
const NOP_INTERVAL: Duration = Duration::from_secs(30);
const NOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a reader waiting on a quiet socket wakes to see whether a NOP-In is due.
const NOP_TICK: Duration = Duration::from_secs(1);
/// Submission queue entries of a session's read ring.
const RING_ENTRIES: u32 = 128;
/// An initiator that takes nothing we send for this long is disconnected: a blocked send
/// would otherwise hold the session's threads for ever.
const SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Time a connection has to complete its login.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Commands of one session running at once (threads serving it, at most).
const MAX_THREADS: usize = 64;
/// Slices per writev: Linux refuses more than IOV_MAX (1024).
const MAX_IOV: usize = 1024;
/// READs that go the ordinary way (no ring, or none the LUN could plan) take the READs
/// already received behind them, up to this many commands and bytes, and run as one batch:
/// their blocks are read with one submission and their Data-In sent with one writev. The
/// byte bound keeps large reads apart, so that one thread's disk reads overlap another's
/// sending.
const MAX_BATCH: usize = 32;
const MAX_BATCH_BYTES: usize = 256 << 10;
/// Bytes of READ data a session may have in flight on its ring.
const MAX_RING_BYTES: usize = 64 << 20;

const NO_TAG: u32 = 0xFFFF_FFFF;

/// Counters stamped into every PDU sent.
struct Seq {
    exp_cmd_sn: AtomicU32,
    /// Commands received and not yet answered.
    outstanding: AtomicU32,
}

impl Seq {
    fn max_cmd_sn(&self) -> u32 {
        let window = CMD_WINDOW
            .saturating_sub(self.outstanding.load(Ordering::Acquire))
            .max(1);
        self.exp_cmd_sn.load(Ordering::Acquire).wrapping_add(window - 1)
    }
}

/// A PDU on its way out: its header, and data borrowed from wherever it lies (a read's data
/// is sent from the buffer the LUN filled, with no copy into the PDU).
struct Out<'a> {
    bhs: [u8; BHS_LEN],
    data: &'a [u8],
    /// Carries status, so takes a StatSN of its own.
    status: bool,
}

impl<'a> Out<'a> {
    fn of(p: &'a Pdu, status: bool) -> Out<'a> {
        Out {
            bhs: p.bhs,
            data: &p.data,
            status,
        }
    }
}

/// The send side of a connection.
struct Writer {
    /// std's mutex (see Session::reader): threads queue here while one sends.
    side: std::sync::Mutex<WriteSide>,
    seq: Seq,
    header_digest: bool,
    data_digest: bool,
}

struct WriteSide {
    sock: TcpStream,
    stat_sn: u32,
    /// False after a Logout response: nothing may follow it.
    open: bool,
}

impl Writer {
    /// The send side; a thread that panicked while sending left at worst a torn PDU, which
    /// the initiator detects, so the lock is taken over rather than poisoned for good.
    fn side(&self) -> std::sync::MutexGuard<'_, WriteSide> {
        self.side.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stamps the PDUs' sequence numbers and lengths and sends them in as few writes as the
    /// kernel allows.
    fn send(&self, pdus: &mut [Out]) -> io::Result<()> {
        let mut w = self.side();
        if !w.open {
            return Err(io::ErrorKind::NotConnected.into());
        }
        // Headers with their digests, and padding with data digests, side by side in one
        // buffer; the data stays where it is.
        let mut meta = Vec::with_capacity(pdus.len() * (BHS_LEN + 12));
        let mut spans = Vec::with_capacity(pdus.len());
        for p in pdus.iter_mut() {
            put32(&mut p.bhs, 24, w.stat_sn);
            if p.status {
                w.stat_sn = w.stat_sn.wrapping_add(1);
            }
            put32(&mut p.bhs, 28, self.seq.exp_cmd_sn.load(Ordering::Acquire));
            put32(&mut p.bhs, 32, self.seq.max_cmd_sn());
            let n = p.data.len();
            p.bhs[4] = 0;
            p.bhs[5] = (n >> 16) as u8;
            p.bhs[6] = (n >> 8) as u8;
            p.bhs[7] = n as u8;
            let head = meta.len();
            meta.extend_from_slice(&p.bhs);
            if self.header_digest {
                meta.extend_from_slice(&crc32c::crc32c(&p.bhs).to_le_bytes());
            }
            let tail = meta.len();
            let pad = [0u8; 3];
            let pad = &pad[..n.div_ceil(4) * 4 - n];
            meta.extend_from_slice(pad);
            if self.data_digest && n > 0 {
                let crc = crc32c::crc32c_append(crc32c::crc32c(p.data), pad);
                meta.extend_from_slice(&crc.to_le_bytes());
            }
            spans.push((head, tail, meta.len()));
        }
        let mut parts: Vec<IoSlice> = Vec::with_capacity(pdus.len() * 3);
        for (p, &(head, tail, end)) in pdus.iter().zip(&spans) {
            parts.push(IoSlice::new(&meta[head..tail]));
            parts.push(IoSlice::new(p.data));
            parts.push(IoSlice::new(&meta[tail..end]));
        }
        parts.retain(|p| !p.is_empty());
        write_all_vectored(&mut w.sock, &mut parts)
    }

    fn send_pdu(&self, p: &Pdu, status: bool) {
        let _ = self.send(&mut [Out::of(p, status)]);
    }

    /// Sends nothing after this, and tells the initiator so.
    fn close(&self) {
        let mut w = self.side();
        w.open = false;
        let _ = w.sock.shutdown(Shutdown::Write);
    }

    /// Ends the connection both ways: a thread blocked reading it wakes with an error.
    fn abort(&self) {
        let _ = self.side().sock.shutdown(Shutdown::Both);
    }
}

/// Writes every byte of `parts` (none of them empty), IOV_MAX slices at a time, again for
/// what a short write left.
fn write_all_vectored(sock: &mut TcpStream, mut parts: &mut [IoSlice]) -> io::Result<()> {
    while !parts.is_empty() {
        let end = parts.len().min(MAX_IOV);
        match sock.write_vectored(&parts[..end]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut parts, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A write waiting for its data.
struct WriteTask {
    lun_field: [u8; 8],
    cdb: Vec<u8>,
    lun: Option<Arc<Lun>>,
    buf: Vec<u8>,
    received: usize,
    /// End of the unsolicited part (immediate data and unsolicited Data-Out).
    unsolicited_end: usize,
    /// The open R2T: its tag, offset and length.
    r2t: Option<(u32, usize, usize)>,
    r2t_sn: u32,
    next_offset: usize,
    /// DataSN the next Data-Out of the current sequence must carry.
    data_sn: u32,
    edtl: usize,
    /// A Data-Out of this write was lost (wrong DataSN or data digest), or its buffer could
    /// not be had: its data is dropped until the sequence ends, then the command fails
    /// without running, as this says.
    lost_data: Option<Fail>,
    /// The buffer's bytes, charged to the session's and the daemon's budgets.
    charge: Option<Charge>,
}

/// Why a command is answered without running.
#[derive(Debug, Clone, Copy)]
enum Fail {
    /// CHECK CONDITION with this sense.
    Sense(sense::Sense),
    /// TASK SET FULL: no room for its data now; the initiator retries.
    TaskSetFull,
}

impl WriteTask {
    /// The write as a command to run with its data, or, when a Data-Out was lost, to fail
    /// with PROTOCOL SERVICE CRC ERROR without running.
    fn into_job(self, itt: u32) -> Job {
        let fail = self.lost_data;
        Job {
            itt,
            lun_field: self.lun_field,
            lun: self.lun,
            cdb: self.cdb,
            data_out: if fail.is_some() { Vec::new() } else { self.buf },
            edtl: self.edtl,
            read: false,
            fail,
            _charge: self.charge,
        }
    }
}

/// A SCSI command with all its data, ready to run.
struct Job {
    itt: u32,
    lun_field: [u8; 8],
    lun: Option<Arc<Lun>>,
    cdb: Vec<u8>,
    data_out: Vec<u8>,
    edtl: usize,
    read: bool,
    /// Fail the command with this instead of running it.
    fail: Option<Fail>,
    /// The write buffer's charge, given back when the job is done with.
    _charge: Option<Charge>,
}

/// What the session is, fixed at login.
struct Ctx {
    reg: Arc<Registry>,
    /// This session's I_T nexus: unit attentions and reservations are kept by it.
    nexus: Arc<Nexus>,
    target: Option<Arc<Target>>,
    /// The initiator's name and CHAP identity: what SendTargets may reveal.
    initiator: String,
    authenticated: Option<Chap>,
    local: SocketAddr,
    params: Params,
}

/// The read side, held by one thread at a time, with the state only the reader touches.
struct ReadSide {
    sock: TcpStream,
    inbox: Inbox,
    /// READs whose disk reads are in flight; None where io_uring is unavailable.
    ring: Option<ReadRing<(Job, PlannedRead)>>,
    /// Bytes the READs on the ring will return: their buffers are allocated up front.
    ring_bytes: usize,
    writes: HashMap<u32, WriteTask>,
    next_ttt: u32,
    /// Keepalive: when the initiator last sent a byte, and when we pinged it since.
    last_heard: Instant,
    pinged: Option<Instant>,
}

/// What the thread holding the read side does next.
enum Next {
    /// Commands to run: one, or a batch of READs.
    Run(Vec<Job>),
    /// Logout, end of stream or a broken stream: no more PDUs.
    Stop,
}

struct Session {
    ctx: Ctx,
    writer: Arc<Writer>,
    /// Bytes of write buffers this session holds (limits.rs).
    write_budget: Arc<WriteBudget>,
    /// std's mutex, not parking_lot's: followers wait here all the time, and parking_lot spins
    /// with sched_yield before sleeping, which on two cores steals the CPU the leader needs.
    reader: std::sync::Mutex<Option<ReadSide>>,
    /// Threads serving the session, and those among them waiting to read.
    threads: AtomicUsize,
    idle: AtomicUsize,
    handles: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Why the session ended, if not by logout.
    ended: Mutex<Option<String>>,
}

/// Logs a connection in, then hands it to threads of its own for the full feature phase.
/// `slot` counts the connection against its portal's limit until the session ends.
pub async fn run(
    sock: tokio::net::TcpStream,
    local: SocketAddr,
    reg: Arc<Registry>,
    slot: ConnectionSlot,
) -> Result<(), String> {
    let (mut r, mut w) = sock.into_split();
    // A client that stalls in the login phase does not hold a connection for ever.
    let li = tokio::time::timeout(LOGIN_TIMEOUT, login(&mut r, &mut w, &reg))
        .await
        .map_err(|_| format!("login not finished within {}s", LOGIN_TIMEOUT.as_secs()))??;
    let Some(li) = li else {
        let _ = w.shutdown().await;
        return Ok(());
    };
    // Login reads PDUs unbuffered, so nothing the initiator sent after it is lost here.
    let close = li.close.clone();
    let sock = r
        .reunite(w)
        .map_err(|e| e.to_string())
        .and_then(|s| {
            s.into_std()
                .and_then(|s| s.set_nonblocking(false).map(|_| s))
                .map_err(|e| format!("cannot hand the connection over: {e}"))
        })
        .inspect_err(|_| close.finish())?;
    let (initiator, isid, tsih) = (li.initiator.clone(), li.isid, li.tsih);
    let tname = li.target.as_ref().map(|t| t.iqn.clone()).unwrap_or_default();
    let (who, what, reg2) = (initiator.clone(), tname.clone(), reg.clone());
    let spawned = std::thread::Builder::new().name("iscsi-conn".into()).spawn(move || {
        let _slot = slot;
        match serve(sock, local, reg2, li) {
            Ok(()) => info!(initiator = %who, target = %what, tsih, "session closed"),
            Err(e) => info!(initiator = %who, target = %what, tsih, error = %e, "session closed"),
        }
    });
    if let Err(e) = spawned {
        reg.close_session(&initiator, isid, &tname, tsih);
        close.finish();
        return Err(format!("cannot start a thread for the session: {e}"));
    }
    Ok(())
}

/// Serves a logged-in session until it ends; blocking.
fn serve(sock: TcpStream, local: SocketAddr, reg: Arc<Registry>, li: LoggedIn) -> Result<(), String> {
    let LoggedIn {
        initiator,
        isid,
        tsih,
        target,
        authenticated,
        params,
        exp_cmd_sn,
        stat_sn,
        close,
    } = li;
    let tname = target.as_ref().map(|t| t.iqn.clone()).unwrap_or_default();
    close.wait_for_replaced();
    let result = (|| {
        if !close.attach(&sock).map_err(|e| e.to_string())? {
            return Err("session reinstated by a new login".to_string());
        }
        sock.set_write_timeout(Some(SEND_TIMEOUT)).map_err(|e| e.to_string())?;
        let writer = Arc::new(Writer {
            side: std::sync::Mutex::new(WriteSide {
                sock: sock.try_clone().map_err(|e| e.to_string())?,
                stat_sn,
                open: true,
            }),
            seq: Seq {
                exp_cmd_sn: AtomicU32::new(exp_cmd_sn),
                outstanding: AtomicU32::new(0),
            },
            header_digest: params.header_digest,
            data_digest: params.data_digest,
        });
        let ring = match ReadRing::new(RING_ENTRIES) {
            Ok(r) => Some(r),
            Err(e) => {
                debug!(error = %e, "io_uring unavailable: iSCSI reads run on the session's threads");
                None
            }
        };
        let inbox = Inbox::new(
            params.header_digest,
            params.data_digest,
            params.max_recv_data_segment as usize,
        );
        let s = Arc::new(Session {
            ctx: Ctx {
                reg: reg.clone(),
                nexus: Arc::new(
                    Nexus::new(reg.new_nexus(), &initiator, isid)
                        .with_scope(target.as_ref().map_or_else(Scope::none, Scope::of)),
                ),
                target: target.clone(),
                initiator: initiator.clone(),
                authenticated,
                local,
                params,
            },
            writer,
            reader: std::sync::Mutex::new(Some(ReadSide {
                sock: sock.try_clone().map_err(|e| e.to_string())?,
                inbox,
                ring,
                ring_bytes: 0,
                writes: HashMap::new(),
                next_ttt: 1,
                last_heard: Instant::now(),
                pinged: None,
            })),
            threads: AtomicUsize::new(1),
            idle: AtomicUsize::new(0),
            handles: Mutex::new(Vec::new()),
            write_budget: Arc::default(),
            ended: Mutex::new(None),
        });
        serve_thread(&s);
        // The first thread is the last to go: wait for the others, which finish what they took.
        loop {
            let hs: Vec<_> = std::mem::take(&mut *s.handles.lock());
            if hs.is_empty() {
                break;
            }
            for h in hs {
                let _ = h.join();
            }
        }
        if let Some(t) = &s.ctx.target {
            for n in t.lun_numbers() {
                if let Some(l) = t.lun(n) {
                    l.nexus_lost(&s.ctx.nexus);
                }
            }
        }
        let ended = s.ended.lock().take();
        match ended {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })();
    let _ = sock.shutdown(Shutdown::Both);
    reg.close_session(&initiator, isid, &tname, tsih);
    close.finish();
    result
}

fn serve_thread(s: &Arc<Session>) {
    loop {
        s.idle.fetch_add(1, Ordering::AcqRel);
        let jobs = {
            // A thread that panicked holding it left the read side consistent: PDUs are
            // handled whole or the connection ends.
            let mut guard = s.reader.lock().unwrap_or_else(|e| e.into_inner());
            s.idle.fetch_sub(1, Ordering::AcqRel);
            let Some(rs) = guard.as_mut() else {
                return;
            };
            match s.next_jobs(rs) {
                Ok(Next::Run(jobs)) => jobs,
                Ok(Next::Stop) => {
                    *guard = None;
                    return;
                }
                Err(e) => {
                    *s.ended.lock() = Some(e);
                    *guard = None;
                    // Threads running commands find the socket closed when they answer.
                    s.writer.abort();
                    return;
                }
            }
        };
        s.run_jobs(jobs);
    }
}

impl Session {
    /// Receives PDUs and handles those that need no LUN, and starts READs on the ring and
    /// answers them as their reads complete, until a command is ready to run on this thread
    /// or the connection ends; Err says why it ended abnormally. A READ that runs here comes
    /// with the READs already received behind it (MAX_BATCH), when they do too.
    fn next_jobs(self: &Arc<Self>, rs: &mut ReadSide) -> Result<Next, String> {
        let mut batch: Vec<Job> = Vec::new();
        let mut done = Vec::new();
        loop {
            let mut progress = false;
            if let Some(ring) = rs.ring.as_mut() {
                if ring.reap(&mut done) {
                    progress = true;
                    rs.ring_bytes -= done.iter().map(|((j, _), _)| j.edtl).sum::<usize>();
                    batch.extend(self.answer_reads(&mut done));
                }
            }
            if !batch.is_empty() && !self.batch_grows(rs, &batch) {
                break;
            }
            if let Some(pdu) = rs.inbox.next_pdu() {
                match self.take(rs, pdu)? {
                    Some(Next::Run(jobs)) => {
                        for job in jobs {
                            if let Some(job) = self.start_on_ring(rs, job) {
                                batch.push(job);
                            }
                        }
                    }
                    Some(Next::Stop) => return Ok(Next::Stop),
                    None => {}
                }
                continue;
            }
            if let Some(ring) = rs.ring.as_mut() {
                progress |= ring.submit();
            }
            if !batch.is_empty() {
                break;
            }
            match rs.inbox.receive(&rs.sock) {
                Ok(0) => return Err("connection closed".into()),
                Ok(_) => {
                    rs.last_heard = Instant::now();
                    rs.pinged = None;
                    progress = true;
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(e.to_string()),
            }
            if !progress {
                self.keepalive(rs)?;
                wait(rs);
            }
        }
        if let Some(ring) = rs.ring.as_mut() {
            ring.submit();
        }
        if !self.successor() {
            // Nobody would reap the reads in flight while this thread runs its commands,
            // which may wait for the grains those reads hold.
            self.drain(rs, &mut batch);
        }
        Ok(Next::Run(batch))
    }

    /// Whether the batch of commands to run here should take the next PDU too: a READ
    /// already received behind READs, within the batch's bounds.
    fn batch_grows(&self, rs: &ReadSide, batch: &[Job]) -> bool {
        let p = &self.ctx.params;
        if batch.len() >= MAX_BATCH || !batch.iter().all(|j| is_read(j.cdb[0])) {
            return false;
        }
        let buf = rs.inbox.available();
        match wire_len(buf, p.header_digest, p.data_digest) {
            Some(n) if n <= buf.len() && buf[0] & 0x3F == op::SCSI_CMD && is_read(buf[32]) => {
                let edtl = u32::from_be_bytes([buf[20], buf[21], buf[22], buf[23]]) as usize;
                batch.iter().map(|j| j.edtl).sum::<usize>() + edtl <= MAX_BATCH_BYTES
            }
            _ => false,
        }
    }

    /// Starts a command's disk reads on the ring if it is a READ the LUN can plan, or answers
    /// it if it needs none; the command back if it must run the ordinary way.
    fn start_on_ring(&self, rs: &mut ReadSide, job: Job) -> Option<Job> {
        let Some(ring) = rs.ring.as_mut() else {
            return Some(job);
        };
        let lun = match &job.lun {
            Some(l) if job.read && job.fail.is_none() && is_read(job.cdb[0]) => l,
            _ => return Some(job),
        };
        // Past this much read data in flight the READ runs on this thread, which stops
        // receiving meanwhile: a client that queues huge READs (immediate ones skip the
        // CmdSN window) is slowed down, and the buffers stay bounded.
        if rs.ring_bytes + job.edtl > MAX_RING_BYTES {
            return Some(job);
        }
        // A bug in one command fails that command, not the session.
        let start = catch_unwind(AssertUnwindSafe(|| lun.start_read(&self.ctx.nexus, &job.cdb))).unwrap_or_else(|_| {
            warn!(opcode = job.cdb[0], "command panicked");
            ReadStart::Answer(internal_failure())
        });
        match start {
            ReadStart::Execute => Some(job),
            ReadStart::Answer(resp) => {
                self.respond(&[job], &[resp]);
                None
            }
            ReadStart::Planned(mut read) => {
                let reads = read.submissions();
                // SAFETY: the reads fill the PlannedRead's own buffer, which travels with it
                // in the ring until they have completed.
                rs.ring_bytes += job.edtl;
                unsafe { ring.start((job, read), &reads) };
                None
            }
        }
    }

    /// Answers the READs whose disk reads have completed; those with a read that failed or
    /// came back short are returned, to run the ordinary way, which reads around a failing
    /// member and repairs it.
    fn answer_reads(&self, done: &mut Vec<((Job, PlannedRead), bool)>) -> Vec<Job> {
        let mut jobs = Vec::with_capacity(done.len());
        let mut resps = Vec::with_capacity(done.len());
        let mut failed = Vec::new();
        for ((job, read), ok) in done.drain(..) {
            if ok {
                resps.push(read.into_response());
                jobs.push(job);
            } else {
                debug!(itt = job.itt, "a read on the ring failed; read again");
                drop(read);
                failed.push(job);
            }
        }
        if !jobs.is_empty() {
            self.respond(&jobs, &resps);
        }
        failed
    }

    /// Waits for every READ on the ring, answering them.
    fn drain(&self, rs: &mut ReadSide, batch: &mut Vec<Job>) {
        let Some(ring) = rs.ring.as_mut() else { return };
        let mut done = Vec::new();
        while ring.in_flight() > 0 {
            ring.submit();
            if !ring.reap(&mut done) {
                ring.wait();
            }
            rs.ring_bytes -= done.iter().map(|((j, _), _)| j.edtl).sum::<usize>();
            batch.extend(self.answer_reads(&mut done));
        }
    }

    /// Makes sure a thread will take the read side once this one leaves it to run commands:
    /// one waiting for it already, or a new one. False when neither can be had.
    fn successor(self: &Arc<Self>) -> bool {
        if self.idle.load(Ordering::Acquire) > 0 {
            return true;
        }
        if self.threads.load(Ordering::Acquire) >= MAX_THREADS {
            return false;
        }
        self.threads.fetch_add(1, Ordering::AcqRel);
        let c = self.clone();
        match std::thread::Builder::new()
            .name("iscsi-conn".into())
            .spawn(move || serve_thread(&c))
        {
            Ok(h) => {
                self.handles.lock().push(h);
                true
            }
            Err(e) => {
                self.threads.fetch_sub(1, Ordering::AcqRel);
                warn!(error = %e, "cannot start another iSCSI thread; the session goes on with fewer");
                false
            }
        }
    }

    /// After NOP_INTERVAL without a byte from the initiator, sends it a NOP-In; Err if
    /// nothing came NOP_TIMEOUT after that.
    fn keepalive(&self, rs: &mut ReadSide) -> Result<(), String> {
        match rs.pinged {
            Some(t) if t.elapsed() >= NOP_TIMEOUT => Err("no answer to NOP-In".into()),
            Some(_) => Ok(()),
            None if rs.last_heard.elapsed() >= NOP_INTERVAL => {
                let mut p = Pdu::new(op::NOP_IN);
                p.bhs[1] = 0x80;
                put32(&mut p.bhs, 16, NO_TAG);
                put32(&mut p.bhs, 20, 0x7FFF_FFFF);
                self.writer.send_pdu(&p, false);
                rs.pinged = Some(Instant::now());
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Handles a PDU as read (or its read error): Some when it completes a command to run or
    /// ends the session, Err when the connection must end.
    fn take(&self, rs: &mut ReadSide, pdu: Result<Pdu, PduError>) -> Result<Option<Next>, String> {
        match pdu {
            Ok(p) => self.handle(rs, p),
            Err(PduError::DataDigest { bhs }) => {
                // The header is sound: reject the PDU and carry on (RFC 7143 7.8). A
                // Data-Out's write then fails, as for a missing PDU.
                let mut rej = Pdu::new(op::REJECT);
                rej.bhs[1] = 0x80;
                rej.bhs[2] = 0x02;
                put32(&mut rej.bhs, 16, NO_TAG);
                rej.data = bhs.to_vec();
                self.writer.send_pdu(&rej, true);
                let mut lost = Pdu::new(op::DATA_OUT);
                lost.bhs = *bhs;
                if lost.opcode() == op::DATA_OUT {
                    lost.data = vec![0; data_segment_length(&lost.bhs)];
                    return Ok(self.data_out(rs, lost, false)?.map(|job| Next::Run(vec![job])));
                }
                Ok(None)
            }
            Err(PduError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Err("connection closed".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Handles one PDU: Some when it completes a command to run, or ends the session.
    fn handle(&self, rs: &mut ReadSide, p: Pdu) -> Result<Option<Next>, String> {
        match p.opcode() {
            op::SCSI_CMD => return Ok(self.scsi_command(rs, p).map(|job| Next::Run(vec![job]))),
            op::DATA_OUT => return Ok(self.data_out(rs, p, true)?.map(|job| Next::Run(vec![job]))),
            op::NOP_OUT => {
                self.advance(&p);
                if p.itt() != NO_TAG {
                    let mut r = Pdu::new(op::NOP_IN);
                    r.bhs[1] = 0x80;
                    r.bhs[8..16].copy_from_slice(&p.bhs[8..16]);
                    put32(&mut r.bhs, 16, p.itt());
                    put32(&mut r.bhs, 20, NO_TAG);
                    r.data = p.data;
                    self.writer.send_pdu(&r, true);
                }
            }
            op::TEXT_REQ => {
                self.advance(&p);
                self.text(p);
            }
            op::TASK_MGMT_REQ => {
                self.advance(&p);
                self.task_management(rs, p);
            }
            op::LOGOUT_REQ => {
                self.advance(&p);
                let reason = p.flags() & 0x7F;
                let mut r = Pdu::new(op::LOGOUT_RESP);
                r.bhs[1] = 0x80;
                // Removing a connection for recovery needs ErrorRecoveryLevel 2.
                r.bhs[2] = if reason == 2 { 2 } else { 0 };
                put32(&mut r.bhs, 16, p.itt());
                let p = &self.ctx.params;
                r.bhs[40..42].copy_from_slice(&(p.default_time2wait as u16).to_be_bytes());
                r.bhs[42..44].copy_from_slice(&(p.default_time2retain as u16).to_be_bytes());
                self.writer.send_pdu(&r, true);
                self.writer.close();
                return Ok(Some(Next::Stop));
            }
            _ => self.reject(&p, 0x05),
        }
        Ok(None)
    }

    fn reject(&self, p: &Pdu, reason: u8) {
        debug!(opcode = p.opcode(), reason, "reject");
        let mut r = Pdu::new(op::REJECT);
        r.bhs[1] = 0x80;
        r.bhs[2] = reason;
        put32(&mut r.bhs, 16, NO_TAG);
        r.data = p.bhs.to_vec();
        self.writer.send_pdu(&r, true);
    }

    /// Moves ExpCmdSN past a non-immediate command. Only the reader calls this, so commands
    /// arrive in order and a load then a store is enough.
    fn advance(&self, p: &Pdu) {
        if !p.immediate() {
            let seq = &self.writer.seq;
            let exp = seq.exp_cmd_sn.load(Ordering::Acquire);
            if p.field24() == exp {
                seq.exp_cmd_sn.store(exp.wrapping_add(1), Ordering::Release);
            }
        }
    }

    fn text(&self, p: Pdu) {
        let keys = text::parse(&p.data).unwrap_or_default();
        let mut out: Vec<(String, String)> = Vec::new();
        let ctx = &self.ctx;
        for (k, v) in keys {
            if k == "SendTargets" {
                let targets: Vec<Arc<Target>> = match v.as_str() {
                    "All" if ctx.target.is_none() => ctx.reg.targets(),
                    "" | "All" => ctx.target.iter().cloned().collect(),
                    name => ctx.reg.target(name).into_iter().collect(),
                };
                // A target the initiator may not log in to is not revealed either.
                let visible = |t: &Arc<Target>| t.access().visible_to(&ctx.initiator, ctx.authenticated.as_ref());
                let addresses = crate::portal::target_addresses(&ctx.reg.portals(), ctx.local);
                for t in targets.iter().filter(|t| visible(t)) {
                    out.push(("TargetName".into(), t.iqn.clone()));
                    for a in &addresses {
                        out.push(("TargetAddress".into(), a.clone()));
                    }
                }
            } else {
                out.push((k, "NotUnderstood".into()));
            }
        }
        let mut r = Pdu::new(op::TEXT_RESP);
        r.bhs[1] = 0x80;
        put32(&mut r.bhs, 16, p.itt());
        put32(&mut r.bhs, 20, NO_TAG);
        r.data = text::encode(&out);
        self.writer.send_pdu(&r, true);
    }

    /// Drops writes still waiting for data; they are no longer outstanding.
    fn drop_writes(&self, rs: &mut ReadSide, which: impl Fn(u32) -> bool) {
        let before = rs.writes.len();
        rs.writes.retain(|&itt, _| !which(itt));
        let dropped = (before - rs.writes.len()) as u32;
        self.writer.seq.outstanding.fetch_sub(dropped, Ordering::AcqRel);
    }

    fn task_management(&self, rs: &mut ReadSide, p: Pdu) {
        let function = p.flags() & 0x7F;
        let luns: Vec<Arc<Lun>> = match (&self.ctx.target, function) {
            (Some(t), 5) => t.lun(decode_lun(&p.lun())).into_iter().collect(),
            (Some(t), 6 | 7) => t.lun_numbers().into_iter().filter_map(|n| t.lun(n)).collect(),
            _ => Vec::new(),
        };
        let response = match function {
            // ABORT TASK: a write still waiting for data is dropped; a running command
            // finishes (it is short), and the initiator ignores its answer.
            1 => {
                let tag = p.ttt();
                self.drop_writes(rs, |itt| itt == tag);
                0
            }
            2 | 4 => {
                self.drop_writes(rs, |_| true);
                0
            }
            // LUN RESET, TARGET WARM and COLD RESET: the other nexuses get a unit attention.
            5 | 6 | 7 => {
                self.drop_writes(rs, |_| true);
                for l in &luns {
                    l.reset(self.ctx.nexus.id);
                }
                0
            }
            _ => 5, // not supported
        };
        let mut r = Pdu::new(op::TASK_MGMT_RESP);
        r.bhs[1] = 0x80;
        r.bhs[2] = response;
        put32(&mut r.bhs, 16, p.itt());
        self.writer.send_pdu(&r, true);
    }

    /// True if a non-immediate command's CmdSN is inside [ExpCmdSN, MaxCmdSN].
    fn in_window(&self, p: &Pdu) -> bool {
        if p.immediate() {
            return true;
        }
        let seq = &self.writer.seq;
        let exp = seq.exp_cmd_sn.load(Ordering::Acquire);
        let ahead = p.field24().wrapping_sub(exp);
        ahead <= seq.max_cmd_sn().wrapping_sub(exp)
    }

    /// A SCSI Command PDU: the command to run, or None while its data is still to come.
    fn scsi_command(&self, rs: &mut ReadSide, p: Pdu) -> Option<Job> {
        if !self.in_window(&p) {
            // RFC 7143 3.2.2.1: a command outside the window is silently ignored.
            debug!(cmd_sn = p.field24(), "command outside the CmdSN window dropped");
            return None;
        }
        self.advance(&p);
        let Some(target) = &self.ctx.target else {
            // A discovery session carries no SCSI commands.
            self.reject(&p, 0x04);
            return None;
        };
        let flags = p.flags();
        let (read, write) = (flags & 0x40 != 0, flags & 0x20 != 0);
        let edtl = p.field20() as usize;
        let cdb = p.bhs[32..48].to_vec();
        let lun_field = p.lun();
        let lun = target.lun(decode_lun(&lun_field));
        let seq = &self.writer.seq;
        seq.outstanding.fetch_add(1, Ordering::AcqRel);
        if write && edtl > p.data.len() {
            if edtl > tessera_scsi::MAX_TRANSFER_BYTES as usize + (1 << 20) {
                self.reject(&p, 0x09);
                seq.outstanding.fetch_sub(1, Ordering::AcqRel);
                return None;
            }
            let unsolicited_end = if self.ctx.params.initial_r2t || flags & 0x80 != 0 {
                p.data.len()
            } else {
                (self.ctx.params.first_burst as usize).min(edtl).max(p.data.len())
            };
            // The buffer is paid for before it exists; without room, the command ends with
            // TASK SET FULL once its unsolicited data (which cannot be refused) has passed.
            let limits = self.ctx.reg.limits();
            let charge = Charge::take(&self.write_budget, self.ctx.reg.write_total(), edtl, &limits);
            let buf = match &charge {
                Some(_) => {
                    let mut buf = vec![0u8; edtl];
                    buf[..p.data.len()].copy_from_slice(&p.data);
                    buf
                }
                None => {
                    debug!(
                        itt = p.itt(),
                        edtl,
                        session = self.write_budget.used(),
                        "no room for a write's data: TASK SET FULL"
                    );
                    Vec::new()
                }
            };
            let mut t = WriteTask {
                lun_field,
                cdb,
                lun,
                buf,
                received: p.data.len(),
                unsolicited_end,
                r2t: None,
                r2t_sn: 0,
                next_offset: unsolicited_end,
                data_sn: 0,
                edtl,
                lost_data: charge.is_none().then_some(Fail::TaskSetFull),
                charge,
            };
            if t.lost_data.is_some() {
                if t.received >= t.unsolicited_end {
                    return Some(t.into_job(p.itt()));
                }
                // Its buffer is empty: nothing is solicited, unsolicited data is dropped.
                t.next_offset = edtl;
            } else if t.received >= t.unsolicited_end {
                self.next_r2t(rs, p.itt(), &mut t);
            }
            rs.writes.insert(p.itt(), t);
            return None;
        }
        let itt = p.itt();
        let mut data_out = p.data;
        data_out.truncate(edtl);
        Some(Job {
            itt,
            lun_field,
            lun,
            cdb,
            data_out,
            edtl,
            read,
            fail: None,
            _charge: None,
        })
    }

    /// Sends the next R2T of a write, if data remains to be asked for.
    fn next_r2t(&self, rs: &mut ReadSide, itt: u32, t: &mut WriteTask) {
        if t.r2t.is_some() || t.next_offset >= t.buf.len() {
            return;
        }
        let len = (t.buf.len() - t.next_offset).min(self.ctx.params.max_burst as usize);
        let ttt = rs.next_ttt;
        rs.next_ttt = rs.next_ttt.wrapping_add(1).max(1);
        let mut r = Pdu::new(op::R2T);
        r.bhs[1] = 0x80;
        r.bhs[8..16].copy_from_slice(&t.lun_field);
        put32(&mut r.bhs, 16, itt);
        put32(&mut r.bhs, 20, ttt);
        put32(&mut r.bhs, 36, t.r2t_sn);
        put32(&mut r.bhs, 40, t.next_offset as u32);
        put32(&mut r.bhs, 44, len as u32);
        t.r2t = Some((ttt, t.next_offset, len));
        t.r2t_sn += 1;
        t.data_sn = 0;
        t.next_offset += len;
        self.writer.send_pdu(&r, false);
    }

    /// A Data-Out PDU: the write it completes, if it does; Err for a protocol error that ends
    /// the connection. `intact` is false when its data digest was wrong.
    fn data_out(&self, rs: &mut ReadSide, p: Pdu, intact: bool) -> Result<Option<Job>, String> {
        let itt = p.itt();
        let Some(mut t) = rs.writes.remove(&itt) else {
            // Data for a task we do not have (aborted, or failed for lost data): drop it.
            debug!(itt, "Data-Out for an unknown task");
            return Ok(None);
        };
        let offset = p.field40() as usize;
        let end = offset + p.data.len();
        let in_window = match t.r2t {
            Some((ttt, o, l)) if p.ttt() == ttt => offset >= o && end <= o + l,
            _ => p.ttt() == NO_TAG && end <= t.unsolicited_end,
        };
        if !in_window || end > t.edtl {
            warn!(itt, offset, len = p.data.len(), "Data-Out outside what was asked for");
            self.writer.seq.outstanding.fetch_sub(1, Ordering::AcqRel);
            self.reject(&p, 0x09);
            return Err("protocol error: Data-Out outside the solicited range".into());
        }
        // A wrong DataSN means a PDU went missing, an implied digest error (RFC 7143 7.9).
        // At ErrorRecoveryLevel 0 the data cannot be asked for again: the task ends with
        // PROTOCOL SERVICE CRC ERROR once the initiator has sent the rest of the sequence
        // (7.8), and the connection goes on.
        if t.lost_data.is_none() && (!intact || p.field36() != t.data_sn) {
            warn!(
                itt,
                data_sn = p.field36(),
                expected = t.data_sn,
                intact,
                "Data-Out lost: the command will fail"
            );
            t.lost_data = Some(Fail::Sense(sense::PROTOCOL_SERVICE_CRC_ERROR));
        }
        t.data_sn = t.data_sn.wrapping_add(1);
        if p.final_bit() {
            if let Some((ttt, _, _)) = t.r2t {
                if p.ttt() == ttt {
                    t.r2t = None;
                }
            }
        }
        if t.lost_data.is_some() {
            t.received += p.data.len();
            // The end of the sequence, or of the unsolicited data of a write refused for
            // want of room (no R2T follows for it).
            let done = p.final_bit()
                && (matches!(t.lost_data, Some(Fail::Sense(_))) || t.r2t.is_none() && end >= t.unsolicited_end);
            if !done {
                rs.writes.insert(itt, t);
                return Ok(None);
            }
            return Ok(Some(t.into_job(itt)));
        }
        t.buf[offset..end].copy_from_slice(&p.data);
        t.received += p.data.len();
        if t.received >= t.buf.len() {
            return Ok(Some(t.into_job(itt)));
        }
        if p.final_bit() {
            self.next_r2t(rs, itt, &mut t);
        }
        rs.writes.insert(itt, t);
        Ok(None)
    }

    /// Runs the commands and sends their data and status, all in one write.
    fn run_jobs(&self, jobs: Vec<Job>) {
        let resps = self.execute(&jobs);
        self.respond(&jobs, &resps);
    }

    /// Sends the commands' data and status, all in one write; they are no longer outstanding.
    fn respond(&self, jobs: &[Job], resps: &[Response]) {
        self.writer
            .seq
            .outstanding
            .fetch_sub(jobs.len() as u32, Ordering::AcqRel);
        let senses: Vec<Vec<u8>> = resps.iter().map(|r| sense_segment(&r.sense)).collect();
        let max_seg = self.ctx.params.max_xmit_data_segment as usize;
        let mut pdus = Vec::with_capacity(jobs.len());
        for ((job, resp), sense) in jobs.iter().zip(resps).zip(&senses) {
            // What the CDB asks to move, for the residual of a write.
            let wanted = if job.read {
                None
            } else {
                job.lun
                    .as_ref()
                    .and_then(|l| transfer_length(&job.cdb, l.block_size()))
                    .map(|w| w as usize)
            };
            pdus.extend(response_pdus(
                job.itt,
                job.lun_field,
                resp,
                sense,
                job.edtl,
                job.read,
                wanted,
                max_seg,
            ));
        }
        if let Err(e) = self.writer.send(&mut pdus) {
            // The initiator is gone; ending the socket ends the reader's wait too.
            debug!(error = %e, itt = jobs[0].itt, "response not sent");
            self.writer.abort();
        }
    }

    /// Each command's response. Consecutive commands for one LUN go to it as one batch.
    fn execute(&self, jobs: &[Job]) -> Vec<Response> {
        let mut out = Vec::with_capacity(jobs.len());
        let mut rest = jobs;
        while let Some(first) = rest.first() {
            // Commands the LUN itself runs, on the same LUN as the first.
            let same = |j: &Job| {
                j.fail.is_none()
                    && j.cdb[0] != REPORT_LUNS
                    && matches!((&first.lun, &j.lun), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
            };
            let n = rest.iter().take_while(|j| same(j)).count().max(1);
            let (group, tail) = rest.split_at(n);
            rest = tail;
            match (&first.lun, n) {
                (Some(l), 2..) => {
                    let cmds: Vec<(&[u8], &[u8])> = group.iter().map(|j| (&j.cdb[..], &j.data_out[..])).collect();
                    // A bug in one command fails those it ran with, not the session.
                    match catch_unwind(AssertUnwindSafe(|| l.execute_many_for(&self.ctx.nexus, &cmds))) {
                        Ok(r) => out.extend(r),
                        Err(_) => {
                            warn!(opcode = first.cdb[0], "command batch panicked");
                            out.extend(group.iter().map(|_| internal_failure()));
                        }
                    }
                }
                _ => out.push(self.execute_one(first)),
            }
        }
        out
    }

    fn execute_one(&self, job: &Job) -> Response {
        if let Some(Fail::TaskSetFull) = job.fail {
            return Response {
                status: sense::TASK_SET_FULL,
                data: Data::default(),
                sense: Vec::new(),
            };
        }
        if let Some(Fail::Sense(sense)) = job.fail {
            return Response {
                status: sense::CHECK_CONDITION,
                data: Data::default(),
                sense: match &job.lun {
                    Some(l) => l.sense_bytes(sense),
                    None => sense.encode(false),
                },
            };
        }
        if job.cdb[0] == REPORT_LUNS {
            let numbers = self.ctx.target.as_ref().map(|t| t.lun_numbers()).unwrap_or_default();
            return report_luns(&job.cdb, &numbers);
        }
        match &job.lun {
            // A bug in one command fails that command, not the session.
            Some(l) => catch_unwind(AssertUnwindSafe(|| {
                l.execute_for(&self.ctx.nexus, &job.cdb, &job.data_out)
            }))
            .unwrap_or_else(|_| {
                warn!(opcode = job.cdb[0], "command panicked");
                internal_failure()
            }),
            None => no_such_lun(&job.cdb),
        }
    }
}

/// Sleeps until the socket has bytes or a read on the ring completes, NOP_TICK at most (for
/// the keepalive).
fn wait(rs: &ReadSide) {
    let ring = rs.ring.as_ref().filter(|r| r.in_flight() > 0);
    let mut fds = [
        libc::pollfd {
            fd: rs.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            // A negative descriptor is skipped.
            fd: ring.map_or(-1, |r| r.fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let tick = NOP_TICK.as_millis() as libc::c_int;
    // SAFETY: fds is a valid array of pollfd for the duration of the call. An error (EINTR)
    // just ends the wait early: the caller looks again.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, tick) };
}

fn internal_failure() -> Response {
    Response {
        status: sense::CHECK_CONDITION,
        data: Data::default(),
        sense: sense::INTERNAL_TARGET_FAILURE.encode(false),
    }
}

/// A LUN that does not exist: INQUIRY answers "no device here", everything else fails.
fn no_such_lun(cdb: &[u8]) -> Response {
    if cdb[0] == 0x12 && cdb[1] & 0x01 == 0 {
        let mut d = vec![0u8; 36];
        d[0] = 0x7F;
        d[2] = 0x06;
        d[3] = 0x02;
        d[4] = 31;
        let len = u16::from_be_bytes([cdb[3], cdb[4]]) as usize;
        d.truncate(len);
        return Response {
            status: sense::GOOD,
            data: d.into(),
            sense: vec![],
        };
    }
    Response {
        status: sense::CHECK_CONDITION,
        data: Data::default(),
        sense: sense::LUN_NOT_SUPPORTED.encode(false),
    }
}

/// The data segment of a SCSI Response that carries sense: its length, then the sense.
fn sense_segment(sense: &[u8]) -> Vec<u8> {
    if sense.is_empty() {
        return Vec::new();
    }
    let mut d = (sense.len() as u16).to_be_bytes().to_vec();
    d.extend_from_slice(sense);
    d
}

/// Data-In PDUs (the last one carrying status when there is no sense) or a SCSI Response,
/// with their data borrowed from `resp`.
#[allow(clippy::too_many_arguments)]
fn response_pdus<'a>(
    itt: u32,
    lun: [u8; 8],
    resp: &'a Response,
    sense_segment: &'a [u8],
    edtl: usize,
    read: bool,
    wanted: Option<usize>,
    max_seg: usize,
) -> Vec<Out<'a>> {
    let (mut over, mut under) = (0usize, 0usize);
    let mut data: &[u8] = &resp.data;
    if read {
        if data.len() > edtl {
            over = data.len() - edtl;
            data = &data[..edtl];
        } else if edtl > data.len() {
            under = edtl - data.len();
        }
    } else if let Some(w) = wanted {
        if w > edtl {
            over = w - edtl;
        } else {
            under = edtl - w;
        }
    }
    let residual_flags = if over > 0 {
        0x04
    } else if under > 0 {
        0x02
    } else {
        0
    };
    let residual = (over + under) as u32;
    let collapse = resp.status == sense::GOOD && !data.is_empty();
    let n = data.len();
    let mut out = Vec::with_capacity(n.div_ceil(max_seg.max(1)) + 1);
    let mut offset = 0;
    let mut data_sn = 0;
    while offset < n {
        let len = max_seg.min(n - offset);
        let last = offset + len == n;
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = op::DATA_IN;
        bhs[8..16].copy_from_slice(&lun);
        put32(&mut bhs, 16, itt);
        put32(&mut bhs, 20, NO_TAG);
        put32(&mut bhs, 36, data_sn);
        put32(&mut bhs, 40, offset as u32);
        let mut status = false;
        if last {
            bhs[1] = 0x80;
            if collapse {
                bhs[1] |= 0x01 | residual_flags;
                bhs[3] = resp.status;
                put32(&mut bhs, 44, residual);
                status = true;
            }
        }
        out.push(Out {
            bhs,
            data: &data[offset..offset + len],
            status,
        });
        offset += len;
        data_sn += 1;
    }
    if !collapse {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = op::SCSI_RESP;
        bhs[1] = 0x80 | residual_flags;
        bhs[3] = resp.status;
        put32(&mut bhs, 16, itt);
        // ExpDataSN: how many Data-In PDUs went before.
        put32(&mut bhs, 36, data_sn);
        put32(&mut bhs, 44, residual);
        out.push(Out {
            bhs,
            data: sense_segment,
            status: true,
        });
    }
    out
}
