//! The login phase: security stage (AuthMethod), operational negotiation, and the transit to
//! the full feature phase, for discovery and normal sessions.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tracing::{debug, info};

use crate::auth::{self, Chap};
use crate::limits::MAX_LOGIN_TEXT;
use crate::params::{Answer, Params, OUR_MAX_RECV_DATA_SEGMENT};
use crate::pdu::{at, op, Pdu};
use crate::target::{LoginRefusal, NotOpened, Opened, Registry, Target};
use crate::text;

/// Login status classes and details (RFC 7143 11.13.5).
pub mod status {
    pub const SUCCESS: u16 = 0x0000;
    pub const INITIATOR_ERROR: u16 = 0x0200;
    pub const AUTH_FAILED: u16 = 0x0201;
    pub const FORBIDDEN: u16 = 0x0202;
    pub const NOT_FOUND: u16 = 0x0203;
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    pub const MISSING_PARAMETER: u16 = 0x0207;
    pub const SESSION_DOES_NOT_EXIST: u16 = 0x020A;
    pub const INVALID_DURING_LOGIN: u16 = 0x020B;
    pub const OUT_OF_RESOURCES: u16 = 0x0302;
}

/// Window of commands an initiator may have outstanding.
pub const CMD_WINDOW: u32 = 128;

pub struct LoggedIn {
    pub initiator: String,
    pub isid: [u8; 6],
    pub tsih: u16,
    /// The session's I_T nexus identifier.
    pub nexus: u64,
    /// None for a discovery session.
    pub target: Option<Arc<Target>>,
    /// The CHAP credentials the initiator proved it holds, if it used CHAP: a discovery
    /// session sees the targets these open.
    pub authenticated: Option<Chap>,
    pub params: Params,
    pub exp_cmd_sn: u32,
    pub stat_sn: u32,
    pub close: Arc<crate::target::Closer>,
}

/// Where the security stage stands.
enum Auth {
    /// AuthMethod not settled yet.
    Pending,
    /// CHAP chosen; waiting for CHAP_A.
    ChapAlgorithm,
    /// Challenge sent; waiting for CHAP_N and CHAP_R.
    ChapResponse { id: u8, challenge: Vec<u8> },
    /// Authenticated, or no authentication needed.
    Done,
}

/// The value of `key` in `keys`, if present.
fn key<'a>(keys: &'a [(String, String)], key: &str) -> Option<&'a str> {
    keys.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The CHAP credentials that may authenticate this login: those the target asks of this
/// initiator (its own, else the target's), or for a discovery session those of every target
/// the initiator's name is allowed to.
fn chap_candidates(reg: &Registry, target: Option<&Arc<Target>>, initiator: &str) -> Vec<Chap> {
    match target {
        Some(t) => t.access().chap_for(initiator).cloned().into_iter().collect(),
        None => reg
            .targets()
            .iter()
            .map(|t| t.access())
            .filter(|a| a.admits(initiator))
            .filter_map(|a| a.chap_for(initiator).cloned())
            .collect(),
    }
}

/// Longest reason for a refusal that is logged and recorded, in characters.
const MAX_REASON_CHARS: usize = 256;

/// A refusal's reason made safe to log and record: it may quote what the initiator sent
/// before anyone knew who it was (a target name, a key's value: up to 64 KiB of any text),
/// which must not start a forged line in the journal nor reach a terminal as escapes.
fn loggable(why: &str) -> String {
    // Control characters, and the invisible ones that reorder or hide text, written escaped.
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}')
    };
    let mut s = String::new();
    for c in why.chars().take(MAX_REASON_CHARS) {
        if hidden(c) {
            s.extend(c.escape_default());
        } else {
            s.push(c);
        }
    }
    if why.chars().nth(MAX_REASON_CHARS).is_some() {
        s.push('…');
    }
    s
}

/// Checks the initiator's CHAP answer and, for mutual CHAP, computes ours. On success returns
/// the credentials that matched and the keys to send back.
fn chap_verify(
    keys: &[(String, String)],
    id: u8,
    challenge: &[u8],
    candidates: &[Chap],
) -> Result<(Chap, Vec<(String, String)>), String> {
    let name = key(keys, "CHAP_N").ok_or("CHAP_N missing")?;
    let resp = auth::decode_binary(key(keys, "CHAP_R").ok_or("CHAP_R missing")?)?;
    let matched = candidates
        .iter()
        .find(|c| c.user == name && auth::same(&resp, &auth::response(id, c.secret.as_bytes(), challenge)))
        .ok_or_else(|| format!("CHAP: wrong user name or secret for user '{name}'"))?;
    let mut answers = Vec::new();
    match (key(keys, "CHAP_I"), key(keys, "CHAP_C")) {
        (None, None) => {}
        (Some(i), Some(c)) => {
            let their_id: u8 = i.parse().map_err(|_| format!("CHAP_I={i} is not 0..255"))?;
            let their_challenge = auth::decode_binary(c)?;
            if their_challenge.is_empty() || their_challenge.len() > 1024 {
                return Err("mutual CHAP challenge of a bad length".into());
            }
            // An initiator sending back our own challenge would have us compute its answer.
            if their_challenge == challenge {
                return Err("mutual CHAP challenge equals ours".into());
            }
            let (user, secret) = matched
                .mutual
                .as_ref()
                .ok_or("the initiator asks for mutual CHAP but the target has no mutual secret")?;
            answers.push(("CHAP_N".into(), user.clone()));
            let ours = auth::response(their_id, secret.as_bytes(), &their_challenge);
            answers.push(("CHAP_R".into(), auth::encode_hex(&ours)));
        }
        _ => return Err("mutual CHAP needs both CHAP_I and CHAP_C".into()),
    }
    Ok((matched.clone(), answers))
}

/// Runs the login phase. Ok(None) when the login was refused (the reply has been sent).
pub async fn login<R, W>(r: &mut R, w: &mut W, reg: &Registry, peer: SocketAddr) -> Result<Option<LoggedIn>, String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut params = Params::default();
    let mut initiator: Option<String> = None;
    // The target the initiator asked for, found or not.
    let mut asked: Option<String> = None;
    let mut target: Option<Arc<Target>> = None;
    let mut discovery = false;
    let mut declared_mrdsl = false;
    let mut first = true;
    let mut stat_sn: u32 = 0;
    // Every byte of text the login sends, in all its PDUs: bounded before authentication as
    // after it.
    let mut pending = text::Accumulator::new(MAX_LOGIN_TEXT);
    let mut auth_state = Auth::Pending;
    let mut authenticated: Option<Chap> = None;
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
        let cmd_sn = req.cmd_sn();
        if first {
            stat_sn = req.exp_stat_sn();
        }
        let reply = |status_code: u16, data: Vec<u8>, transit: bool, stat_sn: u32, tsih: u16| {
            let mut p = Pdu::new(op::LOGIN_RESP);
            p.bhs[1] = if transit { 0x80 | (csg << 2) | nsg } else { csg << 2 };
            p.bhs[8..14].copy_from_slice(&isid);
            p.bhs[14..16].copy_from_slice(&tsih.to_be_bytes());
            p.set(at::ITT, req.itt())
                .set(at::STAT_SN, stat_sn)
                .set(at::EXP_CMD_SN, cmd_sn)
                .set(at::MAX_CMD_SN, cmd_sn.wrapping_add(CMD_WINDOW - 1));
            p.bhs[36] = (status_code >> 8) as u8;
            p.bhs[37] = status_code as u8;
            p.data = data;
            p
        };
        macro_rules! refuse {
            ($code:expr, $why:expr) => {{
                let why = loggable(&$why.to_string());
                info!(initiator = ?initiator, reason = %why, "login refused");
                if matches!($code, status::FORBIDDEN | status::AUTH_FAILED) {
                    reg.refused(&LoginRefusal {
                        peer,
                        initiator: initiator.clone(),
                        target: asked.clone(),
                        reason: why,
                    });
                }
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
        let keys = match pending.push(&req.data, cont) {
            Ok(Some(k)) => k,
            Ok(None) => {
                // More text follows in the next PDU: acknowledge with an empty response.
                let mut p = reply(status::SUCCESS, Vec::new(), false, stat_sn, 0);
                p.write(w, false, false).await.map_err(|e| e.to_string())?;
                continue;
            }
            Err(e) => refuse!(status::INITIATOR_ERROR, format!("login text: {e}")),
        };
        let mut answers: Vec<(String, String)> = Vec::new();
        if first {
            // Who is logging in to what, before any other key is looked at.
            initiator = key(&keys, "InitiatorName").map(str::to_string);
            let Some(name) = initiator.clone() else {
                refuse!(status::MISSING_PARAMETER, "no InitiatorName")
            };
            // RFC 7143 4.2.7.1: a name is at most 223 bytes of printable characters. Anything
            // else is refused before the name reaches a log, an ACL or an event.
            if !tessera_scsi::is_iscsi_name(&name) {
                initiator = Some(name.escape_debug().take(240).collect());
                refuse!(status::INITIATOR_ERROR, "InitiatorName is not a valid iSCSI name")
            }
            match key(&keys, "SessionType").unwrap_or("Normal") {
                "Discovery" => discovery = true,
                "Normal" => discovery = false,
                v => refuse!(status::INITIATOR_ERROR, format!("SessionType={v}")),
            }
            if !discovery {
                let Some(tname) = key(&keys, "TargetName") else {
                    refuse!(status::MISSING_PARAMETER, "no TargetName")
                };
                asked = Some(tname.to_string());
                match reg.target(tname) {
                    // An initiator outside the ACL learns no more than for a missing target.
                    Some(t) if t.access().admits(&name) => target = Some(t),
                    Some(_) => refuse!(status::FORBIDDEN, format!("{name} is not in the ACL of {tname}")),
                    None => refuse!(status::NOT_FOUND, format!("no target {tname}")),
                }
            }
            debug!(initiator = %name, discovery, "login");
            answers.push(("TargetPortalGroupTag".into(), "1".into()));
            first = false;
        }
        let name = initiator.clone().expect("set at the first PDU");
        let chap_required = target.as_ref().is_some_and(|t| t.access().chap_for(&name).is_some());
        if csg != 0 && matches!(auth_state, Auth::Pending) {
            if chap_required {
                refuse!(
                    status::AUTH_FAILED,
                    "the target requires CHAP; the security stage was skipped"
                );
            }
            auth_state = Auth::Done;
        }
        if csg != 0 && !matches!(auth_state, Auth::Done) {
            refuse!(status::AUTH_FAILED, "CHAP left unfinished");
        }
        for (k, v) in &keys {
            match k.as_str() {
                "InitiatorName" | "InitiatorAlias" | "SessionType" | "TargetName" => {}
                k if k.starts_with("CHAP_") => {}
                "AuthMethod" => {
                    if csg != 0 || !matches!(auth_state, Auth::Pending) {
                        refuse!(status::INITIATOR_ERROR, "AuthMethod outside the security stage");
                    }
                    let offered: Vec<&str> = v.split(',').collect();
                    // A discovery session may use CHAP to see the targets that need it.
                    let chap_useful = chap_required || (discovery && !chap_candidates(reg, None, &name).is_empty());
                    let chosen = if offered.contains(&"CHAP") && chap_useful {
                        "CHAP"
                    } else if offered.contains(&"None") && !chap_required {
                        "None"
                    } else if chap_required {
                        refuse!(status::AUTH_FAILED, format!("AuthMethod={v}: the target requires CHAP"))
                    } else {
                        refuse!(
                            status::AUTH_FAILED,
                            format!("AuthMethod={v}: no CHAP secret is configured here")
                        )
                    };
                    auth_state = if chosen == "CHAP" {
                        Auth::ChapAlgorithm
                    } else {
                        Auth::Done
                    };
                    answers.push((k.to_string(), chosen.into()));
                }
                _ => match params.negotiate(k, v) {
                    Answer::Value(a) => answers.push((k.clone(), a)),
                    Answer::Silent => {}
                    Answer::NotUnderstood => answers.push((k.clone(), "NotUnderstood".into())),
                    Answer::Reject => answers.push((k.clone(), "Reject".into())),
                },
            }
        }
        // After AuthMethod, which may share the PDU with CHAP_A.
        let chap_keys = keys.iter().filter(|(k, _)| k.starts_with("CHAP_")).count();
        if chap_keys > 0 {
            if csg != 0 {
                refuse!(status::INITIATOR_ERROR, "CHAP keys outside the security stage");
            }
            match std::mem::replace(&mut auth_state, Auth::Pending) {
                Auth::ChapAlgorithm => {
                    let Some(algs) = key(&keys, "CHAP_A") else {
                        refuse!(status::AUTH_FAILED, "CHAP_A expected")
                    };
                    if !algs.split(',').any(|a| a == auth::CHAP_MD5) {
                        refuse!(status::AUTH_FAILED, format!("CHAP_A={algs}: only MD5 (5) is offered"));
                    }
                    let (id, challenge) = auth::new_challenge();
                    answers.push(("CHAP_A".into(), auth::CHAP_MD5.into()));
                    answers.push(("CHAP_I".into(), id.to_string()));
                    answers.push(("CHAP_C".into(), auth::encode_hex(&challenge)));
                    auth_state = Auth::ChapResponse { id, challenge };
                }
                Auth::ChapResponse { id, challenge } => {
                    let candidates = chap_candidates(reg, target.as_ref(), &name);
                    match chap_verify(&keys, id, &challenge, &candidates) {
                        Ok((who, mut back)) => {
                            answers.append(&mut back);
                            authenticated = Some(who);
                            auth_state = Auth::Done;
                        }
                        Err(e) => refuse!(status::AUTH_FAILED, e),
                    }
                }
                _ => refuse!(status::INITIATOR_ERROR, "CHAP keys out of turn"),
            }
        }
        if transit && matches!(auth_state, Auth::Pending) {
            // Leaving the security stage without AuthMethod: allowed only when none is needed.
            if chap_required {
                refuse!(
                    status::AUTH_FAILED,
                    "the target requires CHAP; no AuthMethod was offered"
                );
            }
            auth_state = Auth::Done;
        }
        // The target may not leave the security stage before authentication is complete.
        let transit = transit && matches!(auth_state, Auth::Done);
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
            let tname = target.as_ref().map(|t| t.iqn.clone()).unwrap_or_default();
            let Opened { tsih, nexus, close } = match reg.open_session(&name, isid, target.as_ref()) {
                Ok(s) => s,
                Err(NotOpened::Limit(why)) => refuse!(status::OUT_OF_RESOURCES, why),
                Err(NotOpened::NotAdmitted) => {
                    refuse!(status::FORBIDDEN, format!("{name} is not in the ACL of {tname}"))
                }
                Err(NotOpened::Gone) => refuse!(status::NOT_FOUND, format!("no target {tname}")),
            };
            let mut p = reply(status::SUCCESS, text::encode(&answers), true, stat_sn, tsih);
            p.write(w, false, false).await.map_err(|e| e.to_string())?;
            info!(initiator = %name, target = %tname, tsih, chap = authenticated.is_some(), hd = params.header_digest, dd = params.data_digest, "logged in");
            return Ok(Some(LoggedIn {
                initiator: name,
                isid,
                tsih,
                nexus,
                target,
                authenticated,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_quoting_the_initiator_is_one_bounded_line_of_printable_text() {
        let why = loggable("no target iqn.x\ninfo forged: login of admin accepted\x1b[2J\u{202e}");
        assert!(
            !why.contains('\n') && !why.contains('\x1b') && !why.contains('\u{202e}'),
            "{why}"
        );
        assert!(why.starts_with("no target iqn.x\\ninfo forged"), "{why}");
        let long = loggable(&"t".repeat(64 << 10));
        assert_eq!(long.chars().count(), MAX_REASON_CHARS + 1);
        assert_eq!(loggable("a plain reason: 'name'"), "a plain reason: 'name'");
    }
}
