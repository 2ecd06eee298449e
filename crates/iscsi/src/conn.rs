//! A connection in the full feature phase: a reader that takes PDUs in, a writer that stamps
//! sequence numbers and sends, and a task per SCSI command that runs it on the LUN.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessera_scsi::{decode_lun, report_luns, sense, transfer_length, Lun, Nexus, Response, REPORT_LUNS};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::auth::Chap;
use crate::login::{login, LoggedIn, CMD_WINDOW};
use crate::params::Params;
use crate::pdu::{op, put32, Pdu, PduError};
use crate::target::{Registry, Target};
use crate::text;

/// Idle time before we ping the initiator with a NOP-In, and how long it has to answer.
const NOP_INTERVAL: Duration = Duration::from_secs(30);
const NOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Time a connection has to complete its login.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);

const NO_TAG: u32 = 0xFFFF_FFFF;

/// What the reader and command tasks hand the writer.
enum Out {
    /// A PDU; `status` says whether it carries status (and so takes a StatSN).
    Pdu(Pdu, bool),
    /// Send what is queued, then close.
    Close,
}

/// Counters the writer stamps into every PDU.
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
}

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
    seq: Arc<Seq>,
    tx: mpsc::Sender<Out>,
    writes: HashMap<u32, WriteTask>,
    next_ttt: u32,
}

pub async fn run(sock: TcpStream, local: SocketAddr, reg: Arc<Registry>) -> Result<(), String> {
    let (mut r, mut w) = sock.into_split();
    // A client that stalls in the login phase does not hold a connection for ever.
    let li = tokio::time::timeout(LOGIN_TIMEOUT, login(&mut r, &mut w, &reg))
        .await
        .map_err(|_| format!("login not finished within {}s", LOGIN_TIMEOUT.as_secs()))??;
    let Some(li) = li else {
        let _ = w.shutdown().await;
        return Ok(());
    };
    let LoggedIn {
        initiator,
        isid,
        tsih,
        target,
        authenticated,
        params,
        exp_cmd_sn,
        stat_sn,
        mut close,
    } = li;
    let seq = Arc::new(Seq {
        exp_cmd_sn: AtomicU32::new(exp_cmd_sn),
        outstanding: AtomicU32::new(0),
    });
    let (tx, mut rx) = mpsc::channel::<Out>(512);
    let (hd, dd) = (params.header_digest, params.data_digest);
    let wseq = seq.clone();
    let writer = tokio::spawn(async move {
        let mut stat_sn = stat_sn;
        let mut batch = Vec::with_capacity(1 << 16);
        while let Some(m) = rx.recv().await {
            let mut next = Some(m);
            // Gather what is ready into one write.
            while let Some(m) = next.take() {
                match m {
                    Out::Pdu(mut p, status) => {
                        put32(&mut p.bhs, 24, stat_sn);
                        if status {
                            stat_sn = stat_sn.wrapping_add(1);
                        }
                        put32(&mut p.bhs, 28, wseq.exp_cmd_sn.load(Ordering::Acquire));
                        put32(&mut p.bhs, 32, wseq.max_cmd_sn());
                        p.encode_into(&mut batch, hd, dd);
                    }
                    Out::Close => {
                        let _ = w.write_all(&batch).await;
                        let _ = w.shutdown().await;
                        return;
                    }
                }
                if batch.len() < (1 << 20) {
                    next = rx.try_recv().ok();
                }
            }
            if w.write_all(&batch).await.is_err() {
                return;
            }
            batch.clear();
        }
    });

    let tname = target.as_ref().map(|t| t.iqn.clone()).unwrap_or_default();
    let mut ctx = Ctx {
        reg: reg.clone(),
        nexus: Arc::new(Nexus {
            id: reg.new_nexus(),
            initiator: initiator.clone(),
            isid,
        }),
        target,
        initiator: initiator.clone(),
        authenticated,
        local,
        params,
        seq,
        tx: tx.clone(),
        writes: HashMap::new(),
        next_ttt: 1,
    };
    let max_data = ctx.params.max_recv_data_segment as usize;
    // PDUs are read on a task of their own: a read cancelled halfway would lose stream sync.
    let (in_tx, mut in_rx) = mpsc::channel::<Result<Pdu, PduError>>(64);
    let reader = tokio::spawn(async move {
        // Buffered: a PDU's header and data, and the PDUs queued behind it, in few reads.
        let mut r = tokio::io::BufReader::with_capacity(256 << 10, r);
        loop {
            let p = Pdu::read(&mut r, hd, dd, max_data).await;
            let fatal = matches!(
                p,
                Err(PduError::Io(_)) | Err(PduError::HeaderDigest) | Err(PduError::TooLong { .. })
            );
            if in_tx.send(p).await.is_err() || fatal {
                return;
            }
        }
    });
    let mut nop_sent: Option<tokio::time::Instant> = None;
    let result = loop {
        tokio::select! {
            p = in_rx.recv() => match p {
                None => break Err("connection closed".into()),
                Some(Ok(p)) => {
                    nop_sent = None;
                    match ctx.handle(p).await {
                        Ok(true) => {}
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                }
                Some(Err(PduError::DataDigest { bhs })) => {
                    // The header is sound: reject the PDU and carry on (RFC 7143 7.8).
                    let mut rej = Pdu::new(op::REJECT);
                    rej.bhs[1] = 0x80;
                    rej.bhs[2] = 0x02;
                    put32(&mut rej.bhs, 16, NO_TAG);
                    rej.data = bhs.to_vec();
                    let _ = ctx.tx.send(Out::Pdu(rej, true)).await;
                }
                Some(Err(e)) => break Err(e.to_string()),
            },
            _ = close.changed() => break Err("session reinstated by a new login".into()),
            _ = tokio::time::sleep(NOP_INTERVAL) => {
                match nop_sent {
                    Some(t) if t.elapsed() >= NOP_TIMEOUT => break Err("no answer to NOP-In".into()),
                    Some(_) => {}
                    None => {
                        let mut p = Pdu::new(op::NOP_IN);
                        p.bhs[1] = 0x80;
                        put32(&mut p.bhs, 16, NO_TAG);
                        put32(&mut p.bhs, 20, 0x7FFF_FFFF);
                        let _ = ctx.tx.send(Out::Pdu(p, false)).await;
                        nop_sent = Some(tokio::time::Instant::now());
                    }
                }
            }
        }
    };
    reader.abort();
    if let Some(t) = &ctx.target {
        for n in t.lun_numbers() {
            if let Some(l) = t.lun(n) {
                l.forget_nexus(ctx.nexus.id);
            }
        }
    }
    let _ = tx.send(Out::Close).await;
    drop(ctx);
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(10), writer).await;
    reg.close_session(&initiator, isid, &tname, tsih);
    info!(%initiator, target = %tname, tsih, "session closed");
    result
}

impl Ctx {
    /// Handles one PDU; Ok(false) ends the connection cleanly.
    async fn handle(&mut self, p: Pdu) -> Result<bool, String> {
        match p.opcode() {
            op::SCSI_CMD => self.scsi_command(p).await?,
            op::DATA_OUT => self.data_out(p).await?,
            op::NOP_OUT => {
                self.advance(&p);
                if p.itt() != NO_TAG {
                    let mut r = Pdu::new(op::NOP_IN);
                    r.bhs[1] = 0x80;
                    r.bhs[8..16].copy_from_slice(&p.bhs[8..16]);
                    put32(&mut r.bhs, 16, p.itt());
                    put32(&mut r.bhs, 20, NO_TAG);
                    r.data = p.data;
                    self.send(r, true).await;
                }
            }
            op::TEXT_REQ => {
                self.advance(&p);
                self.text(p).await;
            }
            op::TASK_MGMT_REQ => {
                self.advance(&p);
                self.task_management(p).await;
            }
            op::LOGOUT_REQ => {
                self.advance(&p);
                let reason = p.flags() & 0x7F;
                let mut r = Pdu::new(op::LOGOUT_RESP);
                r.bhs[1] = 0x80;
                // Removing a connection for recovery needs ErrorRecoveryLevel 2.
                r.bhs[2] = if reason == 2 { 2 } else { 0 };
                put32(&mut r.bhs, 16, p.itt());
                r.bhs[40..42].copy_from_slice(&(self.params.default_time2wait as u16).to_be_bytes());
                r.bhs[42..44].copy_from_slice(&(self.params.default_time2retain as u16).to_be_bytes());
                self.send(r, true).await;
                return Ok(false);
            }
            _ => {
                self.reject(&p, 0x05).await;
            }
        }
        Ok(true)
    }

    async fn send(&self, p: Pdu, status: bool) {
        let _ = self.tx.send(Out::Pdu(p, status)).await;
    }

    async fn reject(&self, p: &Pdu, reason: u8) {
        debug!(opcode = p.opcode(), reason, "reject");
        let mut r = Pdu::new(op::REJECT);
        r.bhs[1] = 0x80;
        r.bhs[2] = reason;
        put32(&mut r.bhs, 16, NO_TAG);
        r.data = p.bhs.to_vec();
        self.send(r, true).await;
    }

    /// Moves ExpCmdSN past a non-immediate command.
    fn advance(&self, p: &Pdu) {
        if !p.immediate() {
            let sn = p.field24();
            let exp = self.seq.exp_cmd_sn.load(Ordering::Acquire);
            if sn == exp {
                self.seq.exp_cmd_sn.store(exp.wrapping_add(1), Ordering::Release);
            }
        }
    }

    async fn text(&self, p: Pdu) {
        let keys = text::parse(&p.data).unwrap_or_default();
        let mut out: Vec<(String, String)> = Vec::new();
        for (k, v) in keys {
            if k == "SendTargets" {
                let targets: Vec<Arc<Target>> = match v.as_str() {
                    "All" if self.target.is_none() => self.reg.targets(),
                    "" | "All" => self.target.iter().cloned().collect(),
                    name => self.reg.target(name).into_iter().collect(),
                };
                // A target the initiator may not log in to is not revealed either.
                let visible = |t: &Arc<Target>| t.access().visible_to(&self.initiator, self.authenticated.as_ref());
                for t in targets.iter().filter(|t| visible(t)) {
                    out.push(("TargetName".into(), t.iqn.clone()));
                    out.push(("TargetAddress".into(), format!("{},1", addr_text(self.local))));
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
        self.send(r, true).await;
    }

    async fn task_management(&mut self, p: Pdu) {
        let function = p.flags() & 0x7F;
        let luns: Vec<Arc<Lun>> = match (&self.target, function) {
            (Some(t), 5) => t.lun(decode_lun(&p.lun())).into_iter().collect(),
            (Some(t), 6 | 7) => t.lun_numbers().into_iter().filter_map(|n| t.lun(n)).collect(),
            _ => Vec::new(),
        };
        let response = match function {
            // ABORT TASK: a write still waiting for data is dropped; a running command
            // finishes (it is short), and the initiator ignores its answer.
            1 => {
                self.writes.remove(&p.ttt());
                0
            }
            2 | 4 => {
                self.writes.clear();
                0
            }
            // LUN RESET, TARGET WARM and COLD RESET: the other nexuses get a unit attention.
            5 | 6 | 7 => {
                self.writes.clear();
                for l in &luns {
                    l.reset(self.nexus.id);
                }
                0
            }
            _ => 5, // not supported
        };
        let mut r = Pdu::new(op::TASK_MGMT_RESP);
        r.bhs[1] = 0x80;
        r.bhs[2] = response;
        put32(&mut r.bhs, 16, p.itt());
        self.send(r, true).await;
    }

    /// True if a non-immediate command's CmdSN is inside [ExpCmdSN, MaxCmdSN].
    fn in_window(&self, p: &Pdu) -> bool {
        if p.immediate() {
            return true;
        }
        let exp = self.seq.exp_cmd_sn.load(Ordering::Acquire);
        let ahead = p.field24().wrapping_sub(exp);
        ahead <= self.seq.max_cmd_sn().wrapping_sub(exp)
    }

    async fn scsi_command(&mut self, p: Pdu) -> Result<(), String> {
        if !self.in_window(&p) {
            // RFC 7143 3.2.2.1: a command outside the window is silently ignored.
            debug!(cmd_sn = p.field24(), "command outside the CmdSN window dropped");
            return Ok(());
        }
        self.advance(&p);
        let Some(target) = self.target.clone() else {
            // A discovery session carries no SCSI commands.
            self.reject(&p, 0x04).await;
            return Ok(());
        };
        let flags = p.flags();
        let (read, write) = (flags & 0x40 != 0, flags & 0x20 != 0);
        let edtl = p.field20() as usize;
        let cdb = p.bhs[32..48].to_vec();
        let lun_field = p.lun();
        let lun = target.lun(decode_lun(&lun_field));
        self.seq.outstanding.fetch_add(1, Ordering::AcqRel);
        if write && edtl > p.data.len() {
            if p.data.len() > edtl || edtl > tessera_scsi::MAX_TRANSFER_BYTES as usize + (1 << 20) {
                self.reject(&p, 0x09).await;
                self.seq.outstanding.fetch_sub(1, Ordering::AcqRel);
                return Ok(());
            }
            let mut buf = vec![0u8; edtl];
            buf[..p.data.len()].copy_from_slice(&p.data);
            let unsolicited_end = if self.params.initial_r2t || flags & 0x80 != 0 {
                p.data.len()
            } else {
                (self.params.first_burst as usize).min(edtl).max(p.data.len())
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
            };
            if t.received >= t.unsolicited_end {
                self.next_r2t(p.itt(), &mut t).await;
            }
            self.writes.insert(p.itt(), t);
            return Ok(());
        }
        let itt = p.itt();
        let mut data = p.data;
        data.truncate(edtl);
        self.execute(itt, lun_field, lun, target, cdb, data, edtl, read);
        Ok(())
    }

    /// Sends the next R2T of a write, if data remains to be asked for.
    async fn next_r2t(&mut self, itt: u32, t: &mut WriteTask) {
        if t.r2t.is_some() || t.next_offset >= t.buf.len() {
            return;
        }
        let len = (t.buf.len() - t.next_offset).min(self.params.max_burst as usize);
        let ttt = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1).max(1);
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
        self.send(r, false).await;
    }

    async fn data_out(&mut self, p: Pdu) -> Result<(), String> {
        let itt = p.itt();
        let Some(mut t) = self.writes.remove(&itt) else {
            // Data for a task we do not have (aborted, say): drop it.
            debug!(itt, "Data-Out for an unknown task");
            return Ok(());
        };
        let offset = p.field40() as usize;
        let end = offset + p.data.len();
        let in_window = match t.r2t {
            Some((ttt, o, l)) if p.ttt() == ttt => offset >= o && end <= o + l,
            _ => p.ttt() == NO_TAG && end <= t.unsolicited_end,
        };
        if !in_window || end > t.buf.len() {
            warn!(itt, offset, len = p.data.len(), "Data-Out outside what was asked for");
            self.reject(&p, 0x09).await;
            return Err("protocol error: Data-Out outside the solicited range".into());
        }
        if p.field36() != t.data_sn {
            warn!(
                itt,
                data_sn = p.field36(),
                expected = t.data_sn,
                "Data-Out out of sequence"
            );
            self.reject(&p, 0x09).await;
            return Err("protocol error: Data-Out with a wrong DataSN".into());
        }
        t.data_sn += 1;
        t.buf[offset..end].copy_from_slice(&p.data);
        t.received += p.data.len();
        if p.final_bit() {
            if let Some((ttt, _, _)) = t.r2t {
                if p.ttt() == ttt {
                    t.r2t = None;
                }
            }
        }
        if t.received >= t.buf.len() {
            let target = self.target.clone().expect("normal session");
            let WriteTask {
                lun_field,
                cdb,
                lun,
                buf,
                edtl,
                ..
            } = t;
            self.execute(itt, lun_field, lun, target, cdb, buf, edtl, false);
        } else {
            if p.final_bit() {
                self.next_r2t(itt, &mut t).await;
            }
            self.writes.insert(itt, t);
        }
        Ok(())
    }

    /// Runs a command on its own task and sends its data and status.
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        itt: u32,
        lun_field: [u8; 8],
        lun: Option<Arc<Lun>>,
        target: Arc<Target>,
        cdb: Vec<u8>,
        data_out: Vec<u8>,
        edtl: usize,
        read: bool,
    ) {
        let tx = self.tx.clone();
        let seq = self.seq.clone();
        let nexus = self.nexus.clone();
        let max_seg = self.params.max_xmit_data_segment as usize;
        // What the CDB asks to move, for the residual of a write.
        let wanted = if read {
            None
        } else {
            lun.as_ref().and_then(|l| transfer_length(&cdb, l.block_size()))
        };
        tokio::spawn(async move {
            let resp = if cdb[0] == REPORT_LUNS {
                report_luns(&cdb, &target.lun_numbers())
            } else {
                match lun {
                    Some(l) => tokio::task::spawn_blocking(move || l.execute_for(&nexus, &cdb, &data_out))
                        .await
                        .unwrap_or_else(|_| Response {
                            status: sense::CHECK_CONDITION,
                            data: vec![],
                            sense: sense::INTERNAL_TARGET_FAILURE.encode(false),
                        }),
                    None => no_such_lun(&cdb),
                }
            };
            seq.outstanding.fetch_sub(1, Ordering::AcqRel);
            for p in response_pdus(itt, lun_field, resp, edtl, read, wanted.map(|w| w as usize), max_seg) {
                let status = p.bhs[0] == op::SCSI_RESP || p.bhs[1] & 0x01 != 0;
                if tx.send(Out::Pdu(p, status)).await.is_err() {
                    return;
                }
            }
        });
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
            data: d,
            sense: vec![],
        };
    }
    Response {
        status: sense::CHECK_CONDITION,
        data: vec![],
        sense: sense::LUN_NOT_SUPPORTED.encode(false),
    }
}

/// Data-In PDUs (the last one carrying status when there is no sense) or a SCSI Response.
fn response_pdus(
    itt: u32,
    lun: [u8; 8],
    mut resp: Response,
    edtl: usize,
    read: bool,
    wanted: Option<usize>,
    max_seg: usize,
) -> Vec<Pdu> {
    let (mut over, mut under) = (0usize, 0usize);
    if read {
        if resp.data.len() > edtl {
            over = resp.data.len() - edtl;
            resp.data.truncate(edtl);
        } else if edtl > resp.data.len() {
            under = edtl - resp.data.len();
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
    let mut out = Vec::new();
    let collapse = resp.status == sense::GOOD && !resp.data.is_empty();
    let n = resp.data.len();
    let mut offset = 0;
    let mut data_sn = 0;
    while offset < n {
        let len = max_seg.min(n - offset);
        let last = offset + len == n;
        let mut p = Pdu::new(op::DATA_IN);
        p.bhs[8..16].copy_from_slice(&lun);
        put32(&mut p.bhs, 16, itt);
        put32(&mut p.bhs, 20, NO_TAG);
        put32(&mut p.bhs, 36, data_sn);
        put32(&mut p.bhs, 40, offset as u32);
        if last {
            p.bhs[1] = 0x80;
            if collapse {
                p.bhs[1] |= 0x01 | residual_flags;
                p.bhs[3] = resp.status;
                put32(&mut p.bhs, 44, residual);
            }
        }
        p.data = resp.data[offset..offset + len].to_vec();
        out.push(p);
        offset += len;
        data_sn += 1;
    }
    if !collapse {
        let mut p = Pdu::new(op::SCSI_RESP);
        p.bhs[1] = 0x80 | residual_flags;
        p.bhs[3] = resp.status;
        put32(&mut p.bhs, 16, itt);
        // ExpDataSN: how many Data-In PDUs went before.
        put32(&mut p.bhs, 36, data_sn);
        put32(&mut p.bhs, 44, residual);
        if !resp.sense.is_empty() {
            let mut d = (resp.sense.len() as u16).to_be_bytes().to_vec();
            d.extend_from_slice(&resp.sense);
            p.data = d;
        }
        out.push(p);
    }
    out
}

fn addr_text(a: SocketAddr) -> String {
    match a {
        SocketAddr::V4(v) => format!("{}:{}", v.ip(), v.port()),
        SocketAddr::V6(v) => format!("[{}]:{}", v.ip(), v.port()),
    }
}
