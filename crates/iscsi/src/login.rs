//! The login phase: security stage (AuthMethod), operational negotiation, and the transit to
//! the full feature phase, for discovery and normal sessions.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tracing::{debug, info};

use crate::params::{Answer, Params, OUR_MAX_RECV_DATA_SEGMENT};
use crate::pdu::{op, Pdu};
use crate::target::{Registry, Target};
use crate::text;

/// Login status classes and details (RFC 7143 11.13.5).
pub mod status {
    pub const SUCCESS: u16 = 0x0000;
    pub const INITIATOR_ERROR: u16 = 0x0200;
    pub const AUTH_FAILED: u16 = 0x0201;
    pub const NOT_FOUND: u16 = 0x0203;
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    pub const MISSING_PARAMETER: u16 = 0x0207;
    pub const SESSION_DOES_NOT_EXIST: u16 = 0x020A;
    pub const INVALID_DURING_LOGIN: u16 = 0x020B;
}

/// Window of commands an initiator may have outstanding.
pub const CMD_WINDOW: u32 = 128;

pub struct LoggedIn {
    pub initiator: String,
    pub isid: [u8; 6],
    pub tsih: u16,
    /// None for a discovery session.
    pub target: Option<Arc<Target>>,
    pub params: Params,
    pub exp_cmd_sn: u32,
    pub stat_sn: u32,
    pub close: tokio::sync::watch::Receiver<bool>,
}

/// Runs the login phase. Ok(None) when the login was refused (the reply has been sent).
pub async fn login<R, W>(r: &mut R, w: &mut W, reg: &Registry) -> Result<Option<LoggedIn>, String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut params = Params::default();
    let mut initiator: Option<String> = None;
    let mut target: Option<Arc<Target>> = None;
    let mut discovery = false;
    let mut declared_mrdsl = false;
    let mut first = true;
    let mut stat_sn: u32 = 0;
    let mut pending = Vec::new();
    loop {
        let req = Pdu::read(r, false, false, 65536).await.map_err(|e| e.to_string())?;
        if req.opcode() != op::LOGIN_REQ {
            return Err(format!("PDU opcode {:#x} during login", req.opcode()));
        }
        let flags = req.flags();
        let (transit, cont) = (flags & 0x80 != 0, flags & 0x40 != 0);
        let (csg, nsg) = ((flags >> 2) & 3, flags & 3);
        let isid: [u8; 6] = req.bhs[8..14].try_into().expect("6 bytes");
        let tsih = u16::from_be_bytes([req.bhs[14], req.bhs[15]]);
        let cmd_sn = req.field24();
        if first {
            stat_sn = req.field28();
        }
        let reply = |status_code: u16, data: Vec<u8>, transit: bool, stat_sn: u32, tsih: u16| {
            let mut p = Pdu::new(op::LOGIN_RESP);
            p.bhs[1] = if transit { 0x80 | (csg << 2) | nsg } else { csg << 2 };
            p.bhs[8..14].copy_from_slice(&isid);
            p.bhs[14..16].copy_from_slice(&tsih.to_be_bytes());
            p.set(16, req.itt())
                .set(24, stat_sn)
                .set(28, cmd_sn)
                .set(32, cmd_sn.wrapping_add(CMD_WINDOW - 1));
            p.bhs[36] = (status_code >> 8) as u8;
            p.bhs[37] = status_code as u8;
            p.data = data;
            p
        };
        macro_rules! refuse {
            ($code:expr, $why:expr) => {{
                info!(initiator = ?initiator, reason = %$why, "login refused");
                let mut p = reply($code, Vec::new(), false, stat_sn, 0);
                p.write(w, false, false).await.map_err(|e| e.to_string())?;
                return Ok(None);
            }};
        }
        if req.bhs[3] > 0 {
            refuse!(status::UNSUPPORTED_VERSION, "version");
        }
        if tsih != 0 {
            refuse!(
                status::SESSION_DOES_NOT_EXIST,
                "adding a connection to a session (MaxConnections=1)"
            );
        }
        if csg == 2 || (transit && (nsg == 2 || nsg < csg || (csg == 0 && nsg == 0))) {
            refuse!(status::INITIATOR_ERROR, format!("bad stage transition {csg} -> {nsg}"));
        }
        pending.extend_from_slice(&req.data);
        if cont {
            // More text follows in the next PDU: acknowledge with an empty response.
            let mut p = reply(status::SUCCESS, Vec::new(), false, stat_sn, 0);
            p.write(w, false, false).await.map_err(|e| e.to_string())?;
            continue;
        }
        let keys = match text::parse(&std::mem::take(&mut pending)) {
            Ok(k) => k,
            Err(e) => refuse!(status::INITIATOR_ERROR, e),
        };
        let mut answers: Vec<(String, String)> = Vec::new();
        for (k, v) in &keys {
            match k.as_str() {
                "InitiatorName" => initiator = Some(v.clone()),
                "InitiatorAlias" => {}
                "SessionType" => match v.as_str() {
                    "Discovery" => discovery = true,
                    "Normal" => discovery = false,
                    _ => refuse!(status::INITIATOR_ERROR, format!("SessionType={v}")),
                },
                "TargetName" => match reg.target(v) {
                    Some(t) => target = Some(t),
                    None => refuse!(status::NOT_FOUND, format!("no target {v}")),
                },
                "AuthMethod" => {
                    if csg != 0 {
                        refuse!(status::INITIATOR_ERROR, "AuthMethod outside the security stage");
                    }
                    if !v.split(',').any(|m| m == "None") {
                        refuse!(status::AUTH_FAILED, format!("AuthMethod={v}: this target offers None"));
                    }
                    answers.push((k.clone(), "None".into()));
                }
                _ => match params.negotiate(k, v) {
                    Answer::Value(a) => answers.push((k.clone(), a)),
                    Answer::Silent => {}
                    Answer::NotUnderstood => answers.push((k.clone(), "NotUnderstood".into())),
                    Answer::Reject => answers.push((k.clone(), "Reject".into())),
                },
            }
        }
        if first {
            let Some(name) = &initiator else {
                refuse!(status::MISSING_PARAMETER, "no InitiatorName")
            };
            if !discovery && target.is_none() {
                refuse!(status::MISSING_PARAMETER, "no TargetName");
            }
            debug!(initiator = %name, discovery, "login");
            answers.push(("TargetPortalGroupTag".into(), "1".into()));
            first = false;
        }
        if (csg == 1 || (transit && nsg == 1)) && !declared_mrdsl {
            answers.push(("MaxRecvDataSegmentLength".into(), OUR_MAX_RECV_DATA_SEGMENT.to_string()));
            declared_mrdsl = true;
        }
        let to_ffp = transit && nsg == 3;
        if to_ffp {
            params.finish();
            if !declared_mrdsl {
                // The operational stage was skipped: the default holds for what we receive.
                params.max_recv_data_segment = 8192;
            }
            if discovery {
                params.immediate_data = false;
            }
            let initiator = initiator.clone().expect("checked at the first PDU");
            let tname = target.as_ref().map(|t| t.iqn.clone()).unwrap_or_default();
            let (tsih, close) = reg.open_session(&initiator, isid, &tname);
            let mut p = reply(status::SUCCESS, text::encode(&answers), true, stat_sn, tsih);
            p.write(w, false, false).await.map_err(|e| e.to_string())?;
            info!(%initiator, target = %tname, tsih, hd = params.header_digest, dd = params.data_digest, "logged in");
            return Ok(Some(LoggedIn {
                initiator,
                isid,
                tsih,
                target,
                params,
                exp_cmd_sn: cmd_sn,
                stat_sn: stat_sn.wrapping_add(1),
                close,
            }));
        }
        let mut p = reply(status::SUCCESS, text::encode(&answers), transit, stat_sn, 0);
        p.write(w, false, false).await.map_err(|e| e.to_string())?;
        stat_sn = stat_sn.wrapping_add(1);
    }
}
