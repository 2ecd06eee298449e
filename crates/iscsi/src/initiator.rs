//! An iSCSI initiator: login (with CHAP, one-way or mutual, and digests), discovery, and SCSI
//! commands with many in flight on one session. Tessera's tools and tests use it to speak to
//! any iSCSI target, Tessera's or another's.

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Mutex, Notify, Semaphore};

use crate::auth;
use crate::pdu::{at, get32, op, put32, Pdu};
use crate::text;

const NO_TAG: u32 = 0xFFFF_FFFF;
/// What we accept in one data segment.
const OUR_MRDSL: u32 = 256 << 10;
/// Commands one session keeps in flight at most.
const MAX_IN_FLIGHT: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum InitiatorError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("login refused: status {class:#04x}/{detail:#04x} ({})", login_status_text(*.class, *.detail))]
    LoginRefused { class: u8, detail: u8 },
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("the session ended")]
    SessionEnded,
}

/// The Status-Class and Status-Detail of a Login Response, as RFC 7143 11.13.5 names them.
fn login_status_text(class: u8, detail: u8) -> &'static str {
    match (class, detail) {
        (2, 1) => "authentication failed",
        (2, 2) => "authorization failed",
        (2, 3) => "target not found",
        (2, 4) => "target removed",
        (2, 5) => "unsupported version",
        (2, 6) => "too many connections",
        (2, 7) => "missing parameter",
        (2, 8) => "cannot include the connection in the session",
        (2, 9) => "session type not supported",
        (2, 0x0A) => "session does not exist",
        (2, 0x0B) => "invalid request during login",
        (2, _) => "initiator error",
        (3, 1) => "service unavailable",
        // What a target answers past its session limits (Tessera: 16 per initiator name).
        (3, 2) => "out of resources: the target may limit the sessions of one initiator name",
        (3, _) => "target error",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::login_status_text;

    #[test]
    fn login_statuses_are_named() {
        assert_eq!(login_status_text(2, 1), "authentication failed");
        assert!(login_status_text(3, 2).starts_with("out of resources"));
        assert_eq!(login_status_text(3, 0), "target error");
        assert_eq!(login_status_text(2, 0x7F), "initiator error");
        assert_eq!(login_status_text(1, 1), "other");
    }
}

/// How to log in.
#[derive(Clone, Debug)]
pub struct LoginConfig {
    pub initiator: String,
    /// None for a discovery session.
    pub target: Option<String>,
    pub isid: [u8; 6],
    /// CHAP user and secret.
    pub chap: Option<(String, String)>,
    /// For mutual CHAP: the user and secret the target must answer with.
    pub mutual: Option<(String, String)>,
    pub header_digest: bool,
    pub data_digest: bool,
}

impl LoginConfig {
    pub fn new(initiator: &str, target: Option<&str>) -> LoginConfig {
        LoginConfig {
            initiator: initiator.to_string(),
            target: target.map(str::to_string),
            isid: [0x80, 0x00, 0x54, 0x53, 0x00, 0x01],
            chap: None,
            mutual: None,
            header_digest: false,
            data_digest: false,
        }
    }
}

/// The outcome of a SCSI command.
#[derive(Clone, Debug, Default)]
pub struct ScsiResult {
    pub status: u8,
    pub data: Vec<u8>,
    pub sense: Vec<u8>,
    /// Residual count and whether it is an underflow (true) or overflow.
    pub residual: Option<(u32, bool)>,
}

impl ScsiResult {
    /// Sense key, ASC and ASCQ, if the command returned sense (fixed or descriptor format).
    pub fn sense_key(&self) -> Option<(u8, u8, u8)> {
        let s = &self.sense;
        match s.first()? & 0x7F {
            0x70 | 0x71 if s.len() >= 14 => Some((s[2] & 0x0F, s[12], s[13])),
            0x72 | 0x73 if s.len() >= 4 => Some((s[1] & 0x0F, s[2], s[3])),
            _ => None,
        }
    }
}

/// What the session's negotiation settled.
#[derive(Clone, Copy, Debug)]
struct Negotiated {
    header_digest: bool,
    data_digest: bool,
    /// The target's MaxRecvDataSegmentLength: our Data-Out segments stay under it.
    max_xmit: u32,
    first_burst: u32,
    immediate_data: bool,
    initial_r2t: bool,
}

/// A command waiting for its answer.
struct Pending {
    done: oneshot::Sender<Result<ScsiResult, InitiatorError>>,
    data_out: Arc<Vec<u8>>,
    lun: [u8; 8],
    /// The bytes the command may read (its expected data transfer length).
    read_len: usize,
    data_in: Vec<u8>,
}

struct Shared {
    writer: Mutex<OwnedWriteHalf>,
    pending: parking_lot::Mutex<HashMap<u32, Pending>>,
    /// Set, under the pending lock, when the reader stops: nothing more will be answered.
    ended: std::sync::atomic::AtomicBool,
    neg: Negotiated,
    cmd_sn: AtomicU32,
    max_cmd_sn: AtomicU32,
    exp_stat_sn: AtomicU32,
    window: Notify,
    next_itt: AtomicU32,
    slots: Semaphore,
}

/// A logged-in session, usable from many tasks at once.
pub struct Session {
    shared: Arc<Shared>,
    reader: tokio::task::JoinHandle<()>,
    pub tsih: u16,
}

/// Serial number comparison (RFC 1982) for 32-bit sequence numbers.
fn sn_le(a: u32, b: u32) -> bool {
    a == b || (b.wrapping_sub(a) as i32) > 0
}

impl Session {
    /// Connects to `addr` and logs in.
    pub async fn login(addr: &str, cfg: &LoginConfig) -> Result<Session, InitiatorError> {
        let sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let (mut r, mut w) = sock.into_split();
        let (neg, tsih, cmd_sn, max_cmd_sn, exp_stat_sn) = login(&mut r, &mut w, cfg).await?;
        let shared = Arc::new(Shared {
            writer: Mutex::new(w),
            pending: parking_lot::Mutex::new(HashMap::new()),
            ended: std::sync::atomic::AtomicBool::new(false),
            neg,
            cmd_sn: AtomicU32::new(cmd_sn),
            max_cmd_sn: AtomicU32::new(max_cmd_sn),
            exp_stat_sn: AtomicU32::new(exp_stat_sn),
            window: Notify::new(),
            next_itt: AtomicU32::new(1),
            slots: Semaphore::new(MAX_IN_FLIGHT),
        });
        let reader = tokio::spawn(read_loop(r, shared.clone()));
        Ok(Session { shared, reader, tsih })
    }

    /// Runs a SCSI command on `lun`: `data_out` is written, up to `read_len` bytes are read.
    pub async fn command(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: Vec<u8>,
        read_len: usize,
    ) -> Result<ScsiResult, InitiatorError> {
        if cdb.len() > 16 {
            return Err(InitiatorError::Protocol("CDBs over 16 bytes need an AHS".into()));
        }
        let s = &self.shared;
        let _slot = s.slots.acquire().await.map_err(|_| InitiatorError::SessionEnded)?;
        let itt = s.next_itt.fetch_add(1, Ordering::Relaxed) & 0x7FFF_FFFF;
        let lun_field = lun_bytes(lun);
        let data_out = Arc::new(data_out);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = s.pending.lock();
            if s.ended.load(Ordering::Acquire) {
                return Err(InitiatorError::SessionEnded);
            }
            pending.insert(
                itt,
                Pending {
                    done: tx,
                    data_out: data_out.clone(),
                    lun: lun_field,
                    read_len,
                    data_in: Vec::new(),
                },
            );
        }
        let mut p = Pdu::new(op::SCSI_CMD);
        let write = !data_out.is_empty();
        let immediate = if write && s.neg.immediate_data {
            data_out
                .len()
                .min(s.neg.first_burst as usize)
                .min(s.neg.max_xmit as usize)
        } else {
            0
        };
        // F: no unsolicited Data-Out follows (InitialR2T=Yes, or everything went immediately).
        let final_bit = !write || s.neg.initial_r2t || immediate == data_out.len();
        p.bhs[1] = (final_bit as u8) << 7 | ((read_len > 0) as u8) << 6 | (write as u8) << 5 | 0x01;
        p.bhs[8..16].copy_from_slice(&lun_field);
        put32(&mut p.bhs, at::ITT, itt);
        put32(
            &mut p.bhs,
            at::EDTL,
            if write { data_out.len() } else { read_len } as u32,
        );
        p.bhs[32..32 + cdb.len()].copy_from_slice(cdb);
        let mut w = s.writer.lock().await;
        // Wait for room in the target's command window.
        loop {
            let notified = s.window.notified();
            if sn_le(s.cmd_sn.load(Ordering::Acquire), s.max_cmd_sn.load(Ordering::Acquire)) {
                break;
            }
            drop(w);
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            w = s.writer.lock().await;
        }
        let sn = s.cmd_sn.fetch_add(1, Ordering::AcqRel);
        put32(&mut p.bhs, at::CMD_SN, sn);
        put32(&mut p.bhs, at::EXP_STAT_SN, s.exp_stat_sn.load(Ordering::Acquire));
        // The immediate data goes from the caller's buffer, framed, not copied into the PDU.
        let (head, head_len, trailer) = p.frame(&data_out[..immediate], s.neg.header_digest, s.neg.data_digest);
        let mut unsolicited = Vec::new();
        if !s.neg.initial_r2t && immediate < data_out.len() {
            // Unsolicited Data-Out up to FirstBurstLength.
            let end = data_out.len().min(s.neg.first_burst as usize);
            unsolicited = data_out_pdus(&s.neg, lun_field, itt, NO_TAG, &data_out, immediate, end);
        }
        let mut parts = [
            IoSlice::new(&head[..head_len]),
            IoSlice::new(&data_out[..immediate]),
            IoSlice::new(trailer.as_slice()),
            IoSlice::new(&unsolicited),
        ];
        if let Err(e) = write_all_vectored(&mut *w, &mut parts).await {
            s.pending.lock().remove(&itt);
            return Err(e.into());
        }
        drop(w);
        rx.await.map_err(|_| InitiatorError::SessionEnded)?
    }

    /// Logs out and closes the connection; commands still running are answered first (or
    /// fail if the target ends the session without answering them).
    pub async fn logout(&self) -> Result<(), InitiatorError> {
        let s = &self.shared;
        let mut p = Pdu::new(op::LOGOUT_REQ);
        p.bhs[0] |= 0x40;
        p.bhs[1] = 0x80;
        let itt = s.next_itt.fetch_add(1, Ordering::Relaxed) & 0x7FFF_FFFF;
        put32(&mut p.bhs, at::ITT, itt);
        put32(&mut p.bhs, at::CMD_SN, s.cmd_sn.load(Ordering::Acquire));
        put32(&mut p.bhs, at::EXP_STAT_SN, s.exp_stat_sn.load(Ordering::Acquire));
        let bytes = p.encode(s.neg.header_digest, s.neg.data_digest);
        s.writer.lock().await.write_all(&bytes).await?;
        // The target answers and closes; the reader ends with the connection.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while !s.ended.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Sends SendTargets=All on a discovery session: (target name, address) pairs.
pub async fn discover(addr: &str, cfg: &LoginConfig) -> Result<Vec<(String, String)>, InitiatorError> {
    let sock = TcpStream::connect(addr).await?;
    let (mut r, mut w) = sock.into_split();
    let mut cfg = cfg.clone();
    cfg.target = None;
    let (neg, _, cmd_sn, _, exp_stat_sn) = login(&mut r, &mut w, &cfg).await?;
    let mut p = Pdu::new(op::TEXT_REQ);
    p.bhs[0] |= 0x40;
    p.bhs[1] = 0x80;
    put32(&mut p.bhs, at::ITT, 1);
    put32(&mut p.bhs, at::TTT, NO_TAG);
    put32(&mut p.bhs, at::CMD_SN, cmd_sn);
    put32(&mut p.bhs, at::EXP_STAT_SN, exp_stat_sn);
    p.data = text::encode(&[("SendTargets".into(), "All".into())]);
    p.write(&mut w, neg.header_digest, neg.data_digest).await?;
    let resp = Pdu::read(&mut r, neg.header_digest, neg.data_digest, 1 << 20)
        .await
        .map_err(|e| InitiatorError::Protocol(e.to_string()))?;
    if resp.opcode() != op::TEXT_RESP {
        return Err(InitiatorError::Protocol(format!(
            "opcode {:#x} answering SendTargets",
            resp.opcode()
        )));
    }
    let keys = text::parse(&resp.data).map_err(InitiatorError::Protocol)?;
    let mut out = Vec::new();
    let mut name: Option<String> = None;
    for (k, v) in keys {
        match k.as_str() {
            "TargetName" => name = Some(v),
            "TargetAddress" => {
                if let Some(n) = &name {
                    out.push((n.clone(), v));
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

fn lun_bytes(lun: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else {
        b[0] = 0x40 | ((lun >> 8) as u8 & 0x3F);
        b[1] = lun as u8;
    }
    b
}

/// Writes all of `bufs`, in as few system calls as the socket takes them.
async fn write_all_vectored<W: AsyncWrite + Unpin>(w: &mut W, mut bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = w.write_vectored(bufs).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// Data-Out PDUs carrying `data[from..to]` in segments the target accepts.
fn data_out_pdus(neg: &Negotiated, lun: [u8; 8], itt: u32, ttt: u32, data: &[u8], from: usize, to: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut off = from;
    let mut data_sn = 0u32;
    while off < to {
        let n = (to - off).min(neg.max_xmit as usize);
        let mut p = Pdu::new(op::DATA_OUT);
        p.bhs[1] = if off + n == to { 0x80 } else { 0 };
        p.bhs[8..16].copy_from_slice(&lun);
        put32(&mut p.bhs, at::ITT, itt);
        put32(&mut p.bhs, at::TTT, ttt);
        put32(&mut p.bhs, at::DATA_SN, data_sn);
        put32(&mut p.bhs, at::BUFFER_OFFSET, off as u32);
        p.data = data[off..off + n].to_vec();
        out.extend(p.encode(neg.header_digest, neg.data_digest));
        off += n;
        data_sn += 1;
    }
    out
}

/// Takes the target's answers: completes commands, answers R2Ts and NOP-Ins.
async fn read_loop(mut r: OwnedReadHalf, s: Arc<Shared>) {
    let fail_all = |s: &Shared| {
        let mut pending = s.pending.lock();
        s.ended.store(true, Ordering::Release);
        for (_, p) in pending.drain() {
            let _ = p.done.send(Err(InitiatorError::SessionEnded));
        }
    };
    loop {
        let mut p = match Pdu::read(&mut r, s.neg.header_digest, s.neg.data_digest, OUR_MRDSL as usize).await {
            Ok(p) => p,
            Err(_) => break,
        };
        let opcode = p.opcode();
        if matches!(
            opcode,
            op::SCSI_RESP | op::DATA_IN | op::R2T | op::NOP_IN | op::LOGOUT_RESP | op::REJECT
        ) {
            let max = p.max_cmd_sn();
            if sn_le(s.max_cmd_sn.load(Ordering::Acquire), max) {
                s.max_cmd_sn.store(max, Ordering::Release);
                s.window.notify_waiters();
            }
        }
        let status_carrier = opcode == op::SCSI_RESP
            || opcode == op::NOP_IN && p.itt() != NO_TAG
            || opcode == op::LOGOUT_RESP
            || opcode == op::DATA_IN && p.bhs[1] & 0x01 != 0;
        if status_carrier {
            s.exp_stat_sn.store(p.stat_sn().wrapping_add(1), Ordering::Release);
        }
        match opcode {
            op::DATA_IN => {
                let itt = p.itt();
                let offset = p.buffer_offset() as usize;
                let mut pending = s.pending.lock();
                if let Some(c) = pending.get_mut(&itt) {
                    let end = offset.saturating_add(p.data.len());
                    if end > c.read_len {
                        // More than the command asked for: a target's error, never kept.
                        let c = pending.remove(&itt).expect("present");
                        let _ = c.done.send(Err(InitiatorError::Protocol(format!(
                            "Data-In for bytes {offset}..{end} of a command that reads {}",
                            c.read_len
                        ))));
                        continue;
                    }
                    if c.data_in.is_empty() && offset == 0 {
                        // The first segment (often the only one) is the answer's start: kept
                        // as it was received, not copied.
                        c.data_in = std::mem::take(&mut p.data);
                    } else {
                        if c.data_in.len() < end {
                            c.data_in.reserve_exact(c.read_len - c.data_in.len());
                            c.data_in.resize(end, 0);
                        }
                        c.data_in[offset..end].copy_from_slice(&p.data);
                    }
                    if p.bhs[1] & 0x01 != 0 {
                        let c = pending.remove(&itt).expect("present");
                        let res = ScsiResult {
                            status: p.bhs[3],
                            data: c.data_in,
                            sense: Vec::new(),
                            residual: residual(&p),
                        };
                        let _ = c.done.send(Ok(res));
                    }
                }
            }
            op::SCSI_RESP => {
                if let Some(c) = s.pending.lock().remove(&p.itt()) {
                    let sense = if p.data.len() >= 2 {
                        let n = u16::from_be_bytes([p.data[0], p.data[1]]) as usize;
                        p.data[2..(2 + n).min(p.data.len())].to_vec()
                    } else {
                        Vec::new()
                    };
                    let res = if p.bhs[2] != 0 {
                        Err(InitiatorError::Protocol(format!("iSCSI response {:#x}", p.bhs[2])))
                    } else {
                        Ok(ScsiResult {
                            status: p.bhs[3],
                            data: c.data_in,
                            sense,
                            residual: residual(&p),
                        })
                    };
                    let _ = c.done.send(res);
                }
            }
            op::R2T => {
                let itt = p.itt();
                let (ttt, off, len) = (p.ttt(), p.buffer_offset() as usize, p.desired_length() as usize);
                let job = s.pending.lock().get(&itt).map(|c| (c.lun, c.data_out.clone()));
                if let Some((lun, data)) = job {
                    let end = (off + len).min(data.len());
                    let bytes = data_out_pdus(&s.neg, lun, itt, ttt, &data, off.min(end), end);
                    if s.writer.lock().await.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
            }
            op::NOP_IN if p.ttt() != NO_TAG => {
                // The target pings: answer with its tag.
                let mut o = Pdu::new(op::NOP_OUT);
                o.bhs[0] |= 0x40;
                o.bhs[1] = 0x80;
                o.bhs[8..16].copy_from_slice(&p.bhs[8..16]);
                put32(&mut o.bhs, at::ITT, NO_TAG);
                put32(&mut o.bhs, at::TTT, p.ttt());
                put32(&mut o.bhs, at::CMD_SN, s.cmd_sn.load(Ordering::Acquire));
                put32(&mut o.bhs, at::EXP_STAT_SN, s.exp_stat_sn.load(Ordering::Acquire));
                let bytes = o.encode(s.neg.header_digest, s.neg.data_digest);
                if s.writer.lock().await.write_all(&bytes).await.is_err() {
                    break;
                }
            }
            op::REJECT => {
                // The rejected PDU's header is the data: fail the command it belonged to.
                if p.data.len() >= 48 {
                    let itt = get32(&p.data, 16);
                    if let Some(c) = s.pending.lock().remove(&itt) {
                        let _ = c.done.send(Err(InitiatorError::Protocol(format!(
                            "the target rejected a PDU (reason {:#x})",
                            p.bhs[2]
                        ))));
                    }
                }
            }
            op::LOGOUT_RESP => break,
            _ => {}
        }
    }
    fail_all(&s);
}

fn residual(p: &Pdu) -> Option<(u32, bool)> {
    let count = p.desired_length();
    match p.bhs[1] & 0x06 {
        0x02 => Some((count, true)),
        0x04 => Some((count, false)),
        _ => None,
    }
}

/// The login phase from the initiator's side. Returns what was negotiated, the TSIH, the next
/// CmdSN, MaxCmdSN and ExpStatSN.
async fn login(
    r: &mut OwnedReadHalf,
    w: &mut OwnedWriteHalf,
    cfg: &LoginConfig,
) -> Result<(Negotiated, u16, u32, u32, u32), InitiatorError> {
    let proto = |m: String| InitiatorError::Protocol(m);
    let mut neg = Negotiated {
        header_digest: false,
        data_digest: false,
        max_xmit: 8192,
        first_burst: 65536,
        immediate_data: true,
        initial_r2t: true,
    };
    let cmd_sn = 1u32;
    let mut exp_stat_sn = 0u32;
    let mut stage = 0u8; // 0 security, 1 operational
    let mut keys: Vec<(String, String)> = vec![
        ("InitiatorName".into(), cfg.initiator.clone()),
        (
            "SessionType".into(),
            if cfg.target.is_some() { "Normal" } else { "Discovery" }.into(),
        ),
    ];
    if let Some(t) = &cfg.target {
        keys.push(("TargetName".into(), t.clone()));
    }
    keys.push((
        "AuthMethod".into(),
        if cfg.chap.is_some() { "CHAP,None" } else { "None" }.into(),
    ));
    let mut chap_step = 0u8; // 0: none yet, 1: CHAP_A sent, 2: response sent
    let mut our_challenge: Option<(u8, Vec<u8>)> = None;
    let mut sent_operational = false;
    // The security stage is over once the target picked None or CHAP succeeded.
    let mut auth_done = cfg.chap.is_none();
    let digest = |on: bool| if on { "CRC32C,None" } else { "None" }.to_string();
    for _round in 0..16 {
        let transit_to = if stage == 0 { 1 } else { 3 };
        let mut p = Pdu::new(op::LOGIN_REQ);
        p.bhs[0] |= 0x40;
        let want_transit = stage == 1 || auth_done || chap_step == 2;
        p.bhs[1] = ((want_transit as u8) << 7) | (stage << 2) | if want_transit { transit_to } else { 0 };
        p.bhs[8..14].copy_from_slice(&cfg.isid);
        put32(&mut p.bhs, at::ITT, 0);
        put32(&mut p.bhs, at::CMD_SN, cmd_sn);
        put32(&mut p.bhs, at::EXP_STAT_SN, exp_stat_sn);
        if stage == 1 && !sent_operational {
            keys.extend([
                ("HeaderDigest".to_string(), digest(cfg.header_digest)),
                ("DataDigest".to_string(), digest(cfg.data_digest)),
                ("MaxRecvDataSegmentLength".to_string(), OUR_MRDSL.to_string()),
                ("ImmediateData".to_string(), "Yes".to_string()),
                ("InitialR2T".to_string(), "Yes".to_string()),
                ("MaxBurstLength".to_string(), (1u32 << 20).to_string()),
                ("FirstBurstLength".to_string(), (256u32 << 10).to_string()),
                ("MaxOutstandingR2T".to_string(), "1".to_string()),
                ("ErrorRecoveryLevel".to_string(), "0".to_string()),
                ("DefaultTime2Wait".to_string(), "0".to_string()),
                ("DefaultTime2Retain".to_string(), "0".to_string()),
                ("MaxConnections".to_string(), "1".to_string()),
            ]);
            if cfg.target.is_some() {
                keys.extend([
                    ("DataPDUInOrder".to_string(), "Yes".to_string()),
                    ("DataSequenceInOrder".to_string(), "Yes".to_string()),
                ]);
            }
            sent_operational = true;
        }
        p.data = text::encode(&std::mem::take(&mut keys));
        p.write(w, false, false).await?;
        let resp = Pdu::read(r, false, false, 65536)
            .await
            .map_err(|e| proto(e.to_string()))?;
        if resp.opcode() != op::LOGIN_RESP {
            return Err(proto(format!("opcode {:#x} during login", resp.opcode())));
        }
        let (class, detail) = (resp.bhs[36], resp.bhs[37]);
        if class != 0 {
            return Err(InitiatorError::LoginRefused { class, detail });
        }
        exp_stat_sn = resp.stat_sn().wrapping_add(1);
        let answers = text::parse(&resp.data).map_err(proto)?;
        let get = |k: &str| answers.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone());
        for (k, v) in &answers {
            match k.as_str() {
                "HeaderDigest" => neg.header_digest = v == "CRC32C",
                "DataDigest" => neg.data_digest = v == "CRC32C",
                "MaxRecvDataSegmentLength" => neg.max_xmit = v.parse().map_err(|_| proto(format!("{k}={v}")))?,
                "FirstBurstLength" => neg.first_burst = v.parse().map_err(|_| proto(format!("{k}={v}")))?,
                "ImmediateData" => neg.immediate_data = v == "Yes",
                "InitialR2T" => neg.initial_r2t = v == "Yes",
                _ => {}
            }
        }
        if stage == 0 {
            if let Some(m) = get("AuthMethod") {
                if m == "None" {
                    auth_done = true;
                } else if m == "CHAP" && chap_step == 0 {
                    keys.push(("CHAP_A".into(), auth::CHAP_MD5.into()));
                    chap_step = 1;
                } else if m != "None" && m != "CHAP" {
                    return Err(proto(format!("AuthMethod={m}")));
                }
            }
            if chap_step == 1 && get("CHAP_C").is_some() {
                let (user, secret) = cfg
                    .chap
                    .clone()
                    .ok_or_else(|| proto("the target asks for CHAP".into()))?;
                let id: u8 = get("CHAP_I")
                    .and_then(|i| i.parse().ok())
                    .ok_or_else(|| proto("CHAP_I missing".into()))?;
                let challenge = auth::decode_binary(&get("CHAP_C").expect("checked")).map_err(proto)?;
                keys.push(("CHAP_N".into(), user));
                let resp = auth::response(id, secret.as_bytes(), &challenge);
                keys.push(("CHAP_R".into(), auth::encode_hex(&resp)));
                if cfg.mutual.is_some() {
                    let (i, c) = auth::new_challenge();
                    keys.push(("CHAP_I".into(), i.to_string()));
                    keys.push(("CHAP_C".into(), auth::encode_hex(&c)));
                    our_challenge = Some((i, c));
                }
                chap_step = 2;
                continue;
            }
            if chap_step == 2 {
                if let (Some((id, c)), Some((user, secret))) = (&our_challenge, &cfg.mutual) {
                    // The target must prove it knows the mutual secret.
                    let name = get("CHAP_N").unwrap_or_default();
                    let resp = get("CHAP_R")
                        .map(|r| auth::decode_binary(&r))
                        .transpose()
                        .map_err(proto)?
                        .unwrap_or_default();
                    if name != *user || !auth::same(&resp, &auth::response(*id, secret.as_bytes(), c)) {
                        return Err(InitiatorError::LoginRefused { class: 2, detail: 1 });
                    }
                }
            }
        }
        if resp.bhs[1] & 0x80 != 0 {
            let nsg = resp.bhs[1] & 3;
            if nsg == 3 {
                let tsih = u16::from_be_bytes([resp.bhs[14], resp.bhs[15]]);
                let max_cmd_sn = resp.max_cmd_sn();
                if cfg.target.is_none() {
                    neg.immediate_data = false;
                }
                return Ok((neg, tsih, cmd_sn, max_cmd_sn, exp_stat_sn));
            }
            stage = nsg;
        }
    }
    Err(proto("login did not finish in 16 exchanges".into()))
}
