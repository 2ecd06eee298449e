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
//!
//! This file holds the session's state and its threads; `conn/` holds what they do: reader.rs
//! (the read side and the ring), writes.rs (R2T and Data-Out), commands.rs (admission and
//! execution of SCSI commands), control.rs (rejects, text, task management), send.rs (PDUs
//! out, and the Data-In and responses of an answered command).

use std::collections::HashMap;
use std::io::{self, IoSlice, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_disk::{IoOp, ReadRing};
use tessera_scsi::{
    decode_lun, io_op, is_read, report_luns, sense, transfer_length, Data, Lun, Nexus, PlannedRead, PlannedWrite,
    ReadStart, Response, Scope, WriteStart, MAX_TRANSFER_BYTES, REPORT_LUNS,
};
use tokio::io::AsyncWriteExt;
use tracing::{debug, info, warn};

use crate::auth::Chap;
use crate::inbox::Inbox;
use crate::limits::{Charge, WriteBudget};
use crate::login::{login, LoggedIn, CMD_WINDOW};
use crate::params::Params;
use crate::pdu::{at, data_segment_length, get32, op, put32, wire_len, Pdu, PduError, BHS_LEN};
use crate::target::{Registry, Target};
use crate::text;
use tessera_admission::{AddressPlace, ConnectionSlot};

mod commands;
mod control;
mod reader;
mod running;
mod send;
mod writes;

use commands::internal_failure;

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
    /// The highest MaxCmdSN told to the initiator (at login, ExpCmdSN + CMD_WINDOW - 1).
    max_told: AtomicU32,
}

impl Seq {
    /// MaxCmdSN: the window's end as the commands outstanding leave it, but never below one
    /// told before. An initiator ignores a lower MaxCmdSN (RFC 7143 4.2.2.1) and may send up
    /// to the one it had; while a gap in CmdSN holds ExpCmdSN, every command received past
    /// it would otherwise lower the end, and commands the window admitted be dropped.
    fn max_cmd_sn(&self) -> u32 {
        let window = CMD_WINDOW
            .saturating_sub(self.outstanding.load(Ordering::Acquire))
            .max(1);
        let end = self.exp_cmd_sn.load(Ordering::Acquire).wrapping_add(window - 1);
        let later = |a: u32, b: u32| a != b && a.wrapping_sub(b) < 1 << 31;
        match self.max_told.fetch_update(Ordering::AcqRel, Ordering::Acquire, |told| {
            later(end, told).then_some(end)
        }) {
            Ok(_) => end,
            Err(told) => told,
        }
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

/// A write waiting for its data.
struct WriteTask {
    /// When its command arrived.
    arrived: Instant,
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
            arrived: self.arrived,
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

/// A command whose disk I/O is on the ring.
enum OnRing {
    Read(PlannedRead),
    Write(PlannedWrite),
}

/// READ data the commands on the ring will return (their buffers are allocated up front).
fn read_bytes(done: &[((Job, OnRing), bool)]) -> usize {
    done.iter()
        .filter(|((_, on), _)| matches!(on, OnRing::Read(_)))
        .map(|((j, _), _)| j.read_bytes())
        .sum()
}

/// A SCSI command with all its data, ready to run.
struct Job {
    itt: u32,
    /// When its command arrived (its first PDU), for its latency.
    arrived: Instant,
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

impl Job {
    /// The buffer a READ takes: what its CDB asks for (up to the largest transfer), which an
    /// initiator's EDTL may understate, or its EDTL if that is more.
    fn read_bytes(&self) -> usize {
        let asked = self
            .lun
            .as_ref()
            .and_then(|l| transfer_length(&self.cdb, l.block_size()))
            .unwrap_or(0)
            .min(MAX_TRANSFER_BYTES);
        self.edtl.max(asked as usize)
    }
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

// The commands received past a gap are kept as bits of one u128.
const _: () = assert!(CMD_WINDOW <= u128::BITS);

/// The read side, held by one thread at a time, with the state only the reader touches.
struct ReadSide {
    sock: TcpStream,
    inbox: Inbox,
    /// READs and WRITEs whose disk I/O is in flight; None where io_uring is unavailable.
    ring: Option<ReadRing<(Job, OnRing)>>,
    /// Bytes the READs on the ring will return: their buffers are allocated up front.
    ring_bytes: usize,
    writes: HashMap<u32, WriteTask>,
    next_ttt: u32,
    /// Keepalive: when the initiator last sent a byte, and when we pinged it since.
    last_heard: Instant,
    pinged: Option<Instant>,
    /// The non-immediate commands received past a gap in CmdSN: bit k is ExpCmdSN + k. A
    /// command discarded for its data digest leaves such a gap until the initiator sends it
    /// again (RFC 7143 7.8); ExpCmdSN then moves past the ones that came meanwhile.
    cmd_sn_ahead: u128,
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
    /// Commands received and not answered yet, and those a task management function
    /// aborted (running.rs).
    running: Arc<running::Running>,
    /// Why the session ended, if not by logout.
    ended: Mutex<Option<String>>,
    /// The answer to a Logout request, sent when the session has wound down.
    logout: Mutex<Option<Pdu>>,
}

/// Logs a connection in, then hands it to threads of its own for the full feature phase.
/// `slot` counts the connection against its portal's limit until the session ends; `place`
/// against its address's connections logging in, until the login is over.
pub async fn run(
    sock: tokio::net::TcpStream,
    local: SocketAddr,
    reg: Arc<Registry>,
    slot: ConnectionSlot,
    place: AddressPlace,
) -> Result<(), String> {
    let peer = sock.peer_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let (mut r, mut w) = sock.into_split();
    // A client that stalls in the login phase does not hold a connection for ever.
    let li = tokio::time::timeout(LOGIN_TIMEOUT, login(&mut r, &mut w, &reg, peer))
        .await
        .map_err(|_| format!("login not finished within {}s", LOGIN_TIMEOUT.as_secs()))??;
    drop(place);
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
        nexus,
        target,
        authenticated,
        params,
        exp_cmd_sn,
        stat_sn,
        close,
    } = li;
    let host = sock.peer_addr().ok().map(|a| a.ip());
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
                max_told: AtomicU32::new(exp_cmd_sn.wrapping_add(CMD_WINDOW - 1)),
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
                    host.into_iter()
                        .fold(Nexus::new(nexus, &initiator, isid), Nexus::from_host)
                        .with_scope(target.as_ref().map_or_else(Scope::none, Scope::of))
                        .ended_by(close.flag()),
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
                cmd_sn_ahead: 0,
            })),
            threads: AtomicUsize::new(1),
            idle: AtomicUsize::new(0),
            handles: Mutex::new(Vec::new()),
            running: Arc::default(),
            write_budget: Arc::default(),
            ended: Mutex::new(None),
            logout: Mutex::new(None),
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
        if let Some(r) = s.logout.lock().take() {
            s.writer.send_pdu(&r, true);
            s.writer.close();
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
            // A panic below ends the session before the lock is let go (poisoned or not).
            let mut guard = s.reader.lock().unwrap_or_else(|e| e.into_inner());
            s.idle.fetch_sub(1, Ordering::AcqRel);
            let Some(rs) = guard.as_mut() else {
                return;
            };
            // A failure inside the target (a panic: commands it had taken dropped, the read
            // side's counts off) ends the session as a broken connection would, and the
            // initiator sends its commands again, where they would otherwise wait for ever.
            let next = catch_unwind(AssertUnwindSafe(|| s.next_jobs(rs)))
                .unwrap_or_else(|_| Err("a failure inside the target's read side".to_string()));
            match next {
                Ok(Next::Run(jobs)) => jobs,
                Ok(Next::Stop) => {
                    *guard = None;
                    return;
                }
                Err(e) => {
                    s.ended.lock().get_or_insert(e);
                    *guard = None;
                    // Threads running commands find the socket closed when they answer.
                    s.writer.abort();
                    return;
                }
            }
        };
        // Each command's own failure is answered (execute); a failure answering them ends the
        // session, as above: the reader finds the socket shut.
        if catch_unwind(AssertUnwindSafe(|| s.run_jobs(jobs))).is_err() {
            s.ended
                .lock()
                .get_or_insert_with(|| "a failure inside the target answering commands".to_string());
            s.writer.abort();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_scsi::RamBackend;

    fn read_job(cdb: &[u8], edtl: usize) -> Job {
        Job {
            itt: 1,
            arrived: Instant::now(),
            lun_field: [0; 8],
            lun: Some(Arc::new(Lun::new(
                Arc::new(RamBackend::new("ram", 1 << 30, 4096)),
                1,
                false,
            ))),
            cdb: cdb.to_vec(),
            data_out: Vec::new(),
            edtl,
            read: edtl > 0,
            fail: None,
            _charge: None,
        }
    }

    /// READ buffers are counted by what the CDB asks, not by the EDTL a host may set to 0.
    #[test]
    fn a_read_is_counted_by_the_blocks_it_asks_for() {
        let read10 = |blocks: u16| {
            let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            c[7..9].copy_from_slice(&blocks.to_be_bytes());
            c
        };
        assert_eq!(read_job(&read10(8), 0).read_bytes(), 8 * 4096);
        assert_eq!(read_job(&read10(8), 4096).read_bytes(), 8 * 4096);
        assert_eq!(read_job(&read10(1), 10_000).read_bytes(), 10_000);
        assert_eq!(
            read_job(&read10(u16::MAX), 0).read_bytes(),
            MAX_TRANSFER_BYTES as usize,
            "past the largest transfer the READ is refused before it reads"
        );
        // INQUIRY: its EDTL.
        assert_eq!(read_job(&[0x12, 0, 0, 0, 96, 0], 96).read_bytes(), 96);
    }
}
