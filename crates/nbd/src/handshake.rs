//! The handshake phase, server side: fixed newstyle negotiation, option by option, until the
//! client picks an export (NBD_OPT_GO or NBD_OPT_EXPORT_NAME), asks for TLS (NBD_OPT_STARTTLS,
//! after which the negotiation goes on over TLS), or leaves.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::debug;

use crate::export::{Export, Registry, MAX_PAYLOAD};
use crate::proto::*;

/// Option data we read; a client sending more is disconnected (names and queries are at most
/// 4096 bytes each).
const MAX_OPTION_DATA: usize = 64 << 10;

/// The context id we give `base:allocation`.
pub const ALLOCATION_CONTEXT: u32 = 1;

/// What the client and the server agreed on.
pub struct Negotiated {
    pub export: Arc<Export>,
    pub structured: bool,
    /// The id of `base:allocation` when the client selected it for this export.
    pub allocation_context: Option<u32>,
}

/// TLS on this connection, as the negotiation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// The listener offers none: NBD_OPT_STARTTLS is unsupported.
    Off,
    /// Offered and not started yet. `required`: every option but NBD_OPT_STARTTLS and
    /// NBD_OPT_ABORT is refused with NBD_REP_ERR_TLS_REQD, and NBD_OPT_EXPORT_NAME closes.
    Offered { required: bool },
    /// Started: the rest of the negotiation and the transmission are encrypted.
    Active,
}

/// Where a negotiation ended.
pub enum Handshake {
    /// The client picked an export.
    Go(Negotiated),
    /// The client asked for TLS and was told yes: start it on the stream, then go on with
    /// [`options`] (with [`Tls::Active`] and these flags).
    StartTls { fixed: bool, no_zeroes: bool },
    /// The client aborted, or the negotiation cannot go on.
    Closed,
}

/// Runs the handshake: the greeting, then the options.
pub async fn negotiate<S>(s: &mut S, reg: &Registry, tls: Tls) -> io::Result<Handshake>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello).await?;
    let client_flags = s.read_u32().await?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        debug!(client_flags, "unknown client flags; closing");
        return Ok(Handshake::Closed);
    }
    let fixed = client_flags & FLAG_C_FIXED_NEWSTYLE != 0;
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    options(s, reg, tls, fixed, no_zeroes).await
}

/// The option haggling, from its start or from where STARTTLS left it. What was negotiated
/// before TLS started is forgotten, as the protocol asks.
pub async fn options<S>(s: &mut S, reg: &Registry, tls: Tls, fixed: bool, no_zeroes: bool) -> io::Result<Handshake>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut st = State::default();
    loop {
        let magic = s.read_u64().await?;
        if magic != IHAVEOPT {
            debug!(magic, "bad option magic; closing");
            return Ok(Handshake::Closed);
        }
        let option = s.read_u32().await?;
        let len = s.read_u32().await? as usize;
        if len > MAX_OPTION_DATA {
            debug!(option, len, "option data too long; closing");
            return Ok(Handshake::Closed);
        }
        let mut data = vec![0u8; len];
        s.read_exact(&mut data).await?;

        let tls_required = tls == Tls::Offered { required: true };
        if option == opt::EXPORT_NAME {
            if tls_required {
                debug!("NBD_OPT_EXPORT_NAME before TLS on a listener that requires it; closing");
                return Ok(Handshake::Closed);
            }
            let Ok(name) = String::from_utf8(data) else {
                return Ok(Handshake::Closed);
            };
            // No way to report an error here but closing.
            let Some(export) = reg.resolve(&name) else {
                debug!(%name, "NBD_OPT_EXPORT_NAME for an unknown export; closing");
                return Ok(Handshake::Closed);
            };
            let mut reply = Vec::with_capacity(134);
            reply.extend_from_slice(&export.vdisk.size().to_be_bytes());
            reply.extend_from_slice(&export.transmission_flags().to_be_bytes());
            if !no_zeroes {
                reply.extend_from_slice(&[0u8; 124]);
            }
            s.write_all(&reply).await?;
            let allocation_context = st.allocation_for(&name, &export);
            return Ok(Handshake::Go(Negotiated {
                export,
                structured: st.structured,
                allocation_context,
            }));
        }
        if !fixed {
            // Plain newstyle knows only NBD_OPT_EXPORT_NAME.
            return Ok(Handshake::Closed);
        }
        let mut out = Vec::new();
        let go = if option == opt::STARTTLS {
            match tls {
                Tls::Off => {
                    out.extend_from_slice(&option_reply(option, rep::ERR_UNSUP, b"this listener offers no TLS"));
                    Step::Continue
                }
                Tls::Active => {
                    out.extend_from_slice(&option_reply(option, rep::ERR_INVALID, b"TLS is already on"));
                    Step::Continue
                }
                Tls::Offered { .. } if !data.is_empty() => {
                    out.extend_from_slice(&option_reply(
                        option,
                        rep::ERR_INVALID,
                        b"NBD_OPT_STARTTLS takes no data",
                    ));
                    Step::Continue
                }
                Tls::Offered { .. } => {
                    out.extend_from_slice(&option_reply(option, rep::ACK, &[]));
                    s.write_all(&out).await?;
                    return Ok(Handshake::StartTls { fixed, no_zeroes });
                }
            }
        } else if tls_required && option != opt::ABORT {
            out.extend_from_slice(&option_reply(
                option,
                rep::ERR_TLS_REQD,
                b"this listener requires TLS: send NBD_OPT_STARTTLS first (nbds:// URIs)",
            ));
            Step::Continue
        } else {
            st.option(reg, option, &data, &mut out)
        };
        s.write_all(&out).await?;
        match go {
            Step::Continue => {}
            Step::Close => return Ok(Handshake::Closed),
            Step::Go(n) => return Ok(Handshake::Go(n)),
        }
    }
}

enum Step {
    Continue,
    Close,
    Go(Negotiated),
}

#[derive(Default)]
struct State {
    structured: bool,
    /// The export name `base:allocation` was selected for.
    allocation_for: Option<String>,
}

impl State {
    fn allocation_for(&self, name: &str, export: &Export) -> Option<u32> {
        match &self.allocation_for {
            Some(n) if n == name || n == &export.name => Some(ALLOCATION_CONTEXT),
            _ => None,
        }
    }

    /// Answers one option of fixed newstyle negotiation into `out`.
    fn option(&mut self, reg: &Registry, option: u32, data: &[u8], out: &mut Vec<u8>) -> Step {
        let mut err = |kind: u32, msg: &str| {
            out.extend_from_slice(&option_reply(option, kind, msg.as_bytes()));
            Step::Continue
        };
        match option {
            opt::ABORT => {
                out.extend_from_slice(&option_reply(option, rep::ACK, &[]));
                Step::Close
            }
            opt::LIST => {
                if !data.is_empty() {
                    return err(rep::ERR_INVALID, "NBD_OPT_LIST takes no data");
                }
                for e in reg.list() {
                    let mut d = Vec::new();
                    d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    d.extend_from_slice(e.name.as_bytes());
                    d.extend_from_slice(e.description.as_bytes());
                    out.extend_from_slice(&option_reply(option, rep::SERVER, &d));
                }
                out.extend_from_slice(&option_reply(option, rep::ACK, &[]));
                Step::Continue
            }
            opt::STRUCTURED_REPLY => {
                if !data.is_empty() {
                    return err(rep::ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data");
                }
                if self.structured {
                    return err(rep::ERR_INVALID, "structured replies are already negotiated");
                }
                self.structured = true;
                out.extend_from_slice(&option_reply(option, rep::ACK, &[]));
                Step::Continue
            }
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                let set = option == opt::SET_META_CONTEXT;
                if set {
                    // A SET replaces the selection, even when it fails.
                    self.allocation_for = None;
                }
                if !self.structured {
                    return err(rep::ERR_INVALID, "negotiate structured replies first");
                }
                let req = match MetaContextRequest::parse(data) {
                    Ok(r) => r,
                    Err(e @ ProtoError::TooLong { .. }) => return err(rep::ERR_TOO_BIG, &e.to_string()),
                    Err(e) => return err(rep::ERR_INVALID, &e.to_string()),
                };
                let Some(export) = reg.resolve(&req.name) else {
                    return err(rep::ERR_UNKNOWN, &format!("no export named '{}'", req.name));
                };
                let matches = |q: &str| {
                    if set {
                        q == BASE_ALLOCATION
                    } else {
                        q == BASE_ALLOCATION || q == "base:"
                    }
                };
                let selected = if req.queries.is_empty() {
                    !set
                } else {
                    req.queries.iter().any(|q| matches(q))
                };
                if selected {
                    let id = if set { ALLOCATION_CONTEXT } else { 0 };
                    let mut d = id.to_be_bytes().to_vec();
                    d.extend_from_slice(BASE_ALLOCATION.as_bytes());
                    out.extend_from_slice(&option_reply(option, rep::META_CONTEXT, &d));
                    if set {
                        self.allocation_for = Some(export.name.clone());
                    }
                }
                out.extend_from_slice(&option_reply(option, rep::ACK, &[]));
                Step::Continue
            }
            opt::INFO | opt::GO => {
                let req = match InfoRequest::parse(data) {
                    Ok(r) => r,
                    Err(e) => return err(rep::ERR_INVALID, &e.to_string()),
                };
                let Some(export) = reg.resolve(&req.name) else {
                    let msg = if req.name.is_empty() {
                        "there is no default export: name one ('nbdinfo --list' shows them)".to_string()
                    } else {
                        format!("no export named '{}'", req.name)
                    };
                    return err(rep::ERR_UNKNOWN, &msg);
                };
                let mut d = info::EXPORT.to_be_bytes().to_vec();
                d.extend_from_slice(&export.vdisk.size().to_be_bytes());
                d.extend_from_slice(&export.transmission_flags().to_be_bytes());
                out.extend_from_slice(&option_reply(option, rep::INFO, &d));
                if req.requests.contains(&info::NAME) {
                    let mut d = info::NAME.to_be_bytes().to_vec();
                    d.extend_from_slice(export.name.as_bytes());
                    out.extend_from_slice(&option_reply(option, rep::INFO, &d));
                }
                if req.requests.contains(&info::DESCRIPTION) {
                    let mut d = info::DESCRIPTION.to_be_bytes().to_vec();
                    d.extend_from_slice(export.description.as_bytes());
                    out.extend_from_slice(&option_reply(option, rep::INFO, &d));
                }
                // Sent whether asked or not: a client that did not ask may still honour it,
                // and one that sends unaligned requests gets EINVAL, never a corrupted block.
                let mut d = info::BLOCK_SIZE.to_be_bytes().to_vec();
                d.extend_from_slice(&export.min_block().to_be_bytes());
                d.extend_from_slice(&export.preferred_block().to_be_bytes());
                d.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
                out.extend_from_slice(&option_reply(option, rep::INFO, &d));
                out.extend_from_slice(&option_reply(option, rep::ACK, &[]));
                if option == opt::GO {
                    let allocation_context = self.allocation_for(&req.name, &export);
                    return Step::Go(Negotiated {
                        export,
                        structured: self.structured,
                        allocation_context,
                    });
                }
                Step::Continue
            }
            _ => err(rep::ERR_UNSUP, &format!("option {option} is not supported")),
        }
    }
}
