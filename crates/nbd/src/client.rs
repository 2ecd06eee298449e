//! An NBD client: fixed newstyle with structured replies and `base:allocation`, many requests
//! in flight on one connection. The tests and `tessera bench` use it.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::proto::*;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("the server refused option {option}: reply {reply:#x}: {message}")]
    Refused { option: u32, reply: u32, message: String },
    #[error("the server answered error {code}: {message}")]
    Nbd { code: u32, message: String },
    #[error("the connection is closed")]
    Closed,
}

impl From<ProtoError> for ClientError {
    fn from(e: ProtoError) -> Self {
        ClientError::Protocol(e.to_string())
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// What NBD_OPT_GO told us about the export.
#[derive(Debug, Clone, Default)]
pub struct ExportInfo {
    pub name: String,
    pub size: u64,
    pub flags: u16,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
    pub structured: bool,
    pub allocation_context: Option<u32>,
}

impl ExportInfo {
    pub fn read_only(&self) -> bool {
        self.flags & tflag::READ_ONLY != 0
    }
}

/// A finished request.
#[derive(Debug, Default)]
struct Done {
    data: Vec<u8>,
    extents: Vec<(u32, u32)>,
}

struct Pending {
    kind: u16,
    offset: u64,
    len: u32,
    done: Done,
    error: Option<(u32, String)>,
    tx: oneshot::Sender<Result<Done>>,
}

type PendingMap = Arc<Mutex<Option<HashMap<u64, Pending>>>>;

pub struct Client {
    pub info: ExportInfo,
    w: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: PendingMap,
    next_cookie: AtomicU64,
    reader: Option<tokio::task::JoinHandle<()>>,
}

async fn send_option(s: &mut TcpStream, option: u32, data: &[u8]) -> io::Result<()> {
    let mut v = Vec::with_capacity(16 + data.len());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    s.write_all(&v).await
}

/// One option reply: (type, data).
async fn read_option_reply(s: &mut TcpStream, option: u32) -> Result<(u32, Vec<u8>)> {
    let magic = s.read_u64().await?;
    if magic != OPTION_REPLY_MAGIC {
        return Err(ClientError::Protocol(format!("option reply magic {magic:#x}")));
    }
    let o = s.read_u32().await?;
    let kind = s.read_u32().await?;
    let len = s.read_u32().await? as usize;
    if o != option {
        return Err(ClientError::Protocol(format!("reply to option {o}, expected {option}")));
    }
    if len > 1 << 20 {
        return Err(ClientError::Protocol(format!("option reply of {len} bytes")));
    }
    let mut data = vec![0u8; len];
    s.read_exact(&mut data).await?;
    if kind & (1 << 31) != 0 {
        return Err(ClientError::Refused {
            option,
            reply: kind,
            message: String::from_utf8_lossy(&data).into_owned(),
        });
    }
    Ok((kind, data))
}

/// Opens a connection and does the greeting; returns the socket ready for options.
async fn greet(addr: &str) -> Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let magic = s.read_u64().await?;
    let opt_magic = s.read_u64().await?;
    if magic != NBDMAGIC || opt_magic != IHAVEOPT {
        return Err(ClientError::Protocol("not a newstyle NBD server".into()));
    }
    let flags = s.read_u16().await?;
    if flags & FLAG_FIXED_NEWSTYLE == 0 || flags & FLAG_NO_ZEROES == 0 {
        return Err(ClientError::Protocol(format!("server handshake flags {flags:#x}")));
    }
    s.write_u32(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).await?;
    Ok(s)
}

/// The exports a server lists: (name, description).
pub async fn list(addr: &str) -> Result<Vec<(String, String)>> {
    let mut s = greet(addr).await?;
    send_option(&mut s, opt::LIST, &[]).await?;
    let mut out = Vec::new();
    loop {
        let (kind, data) = read_option_reply(&mut s, opt::LIST).await?;
        match kind {
            rep::ACK => break,
            rep::SERVER => {
                let mut r = Reader::new(&data, "NBD_REP_SERVER");
                let name = r.string32()?;
                let desc = String::from_utf8_lossy(r.rest()).into_owned();
                out.push((name, desc));
            }
            k => return Err(ClientError::Protocol(format!("unexpected reply {k} to NBD_OPT_LIST"))),
        }
    }
    send_option(&mut s, opt::ABORT, &[]).await?;
    Ok(out)
}

impl Client {
    /// Connects to `export` on `addr` ("host:port"), negotiating structured replies and
    /// `base:allocation`.
    pub async fn connect(addr: &str, export: &str) -> Result<Client> {
        let mut s = greet(addr).await?;
        let mut info = ExportInfo {
            name: export.to_string(),
            min_block: 1,
            preferred_block: 4096,
            max_payload: 32 << 20,
            ..Default::default()
        };
        send_option(&mut s, opt::STRUCTURED_REPLY, &[]).await?;
        info.structured = match read_option_reply(&mut s, opt::STRUCTURED_REPLY).await {
            Ok((rep::ACK, _)) => true,
            Ok((k, _)) => return Err(ClientError::Protocol(format!("reply {k} to structured replies"))),
            Err(ClientError::Refused { .. }) => false,
            Err(e) => return Err(e),
        };
        if info.structured {
            let q = MetaContextRequest {
                name: export.to_string(),
                queries: vec![BASE_ALLOCATION.into()],
            };
            send_option(&mut s, opt::SET_META_CONTEXT, &q.encode()).await?;
            loop {
                let (kind, data) = read_option_reply(&mut s, opt::SET_META_CONTEXT).await?;
                match kind {
                    rep::ACK => break,
                    rep::META_CONTEXT => {
                        let mut r = Reader::new(&data, "NBD_REP_META_CONTEXT");
                        let id = r.u32()?;
                        if r.rest() == BASE_ALLOCATION.as_bytes() {
                            info.allocation_context = Some(id);
                        }
                    }
                    k => return Err(ClientError::Protocol(format!("reply {k} to SET_META_CONTEXT"))),
                }
            }
        }
        let go = InfoRequest {
            name: export.to_string(),
            requests: vec![info::BLOCK_SIZE, info::NAME],
        };
        send_option(&mut s, opt::GO, &go.encode()).await?;
        let mut got_export = false;
        loop {
            let (kind, data) = read_option_reply(&mut s, opt::GO).await?;
            match kind {
                rep::ACK => break,
                rep::INFO => {
                    let mut r = Reader::new(&data, "NBD_REP_INFO");
                    match r.u16()? {
                        info::EXPORT => {
                            info.size = r.u64()?;
                            info.flags = r.u16()?;
                            got_export = true;
                        }
                        info::NAME => info.name = String::from_utf8_lossy(r.rest()).into_owned(),
                        info::BLOCK_SIZE => {
                            info.min_block = r.u32()?;
                            info.preferred_block = r.u32()?;
                            info.max_payload = r.u32()?;
                        }
                        _ => {}
                    }
                }
                k => return Err(ClientError::Protocol(format!("reply {k} to NBD_OPT_GO"))),
            }
        }
        if !got_export {
            return Err(ClientError::Protocol(
                "NBD_OPT_GO succeeded without NBD_INFO_EXPORT".into(),
            ));
        }
        let (r, w) = s.into_split();
        let pending: PendingMap = Arc::new(Mutex::new(Some(HashMap::new())));
        let reader = tokio::spawn(read_replies(r, pending.clone()));
        Ok(Client {
            info,
            w: tokio::sync::Mutex::new(w),
            pending,
            next_cookie: AtomicU64::new(1),
            reader: Some(reader),
        })
    }

    /// Sends `bytes` as they are, outside any request (a test's way to leave part of a
    /// request on the connection).
    pub async fn send_raw(&self, bytes: &[u8]) -> Result<()> {
        self.w.lock().await.write_all(bytes).await?;
        Ok(())
    }

    /// Whether the server closed the connection (no request can be sent any more).
    pub fn is_closed(&self) -> bool {
        self.pending.lock().is_none()
    }

    async fn request(&self, kind: u16, flags: u16, offset: u64, len: u32, data: &[u8]) -> Result<Done> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock();
            let map = p.as_mut().ok_or(ClientError::Closed)?;
            map.insert(
                cookie,
                Pending {
                    kind,
                    offset,
                    len,
                    done: Done::default(),
                    error: None,
                    tx,
                },
            );
        }
        let head = Request {
            flags,
            kind,
            cookie,
            offset,
            length: len,
        }
        .encode();
        {
            let mut w = self.w.lock().await;
            let sent = async {
                w.write_all(&head).await?;
                if !data.is_empty() {
                    w.write_all(data).await?;
                }
                io::Result::Ok(())
            }
            .await;
            if let Err(e) = sent {
                if let Some(m) = self.pending.lock().as_mut() {
                    m.remove(&cookie);
                }
                return Err(e.into());
            }
        }
        rx.await.map_err(|_| ClientError::Closed)?
    }

    pub async fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>> {
        Ok(self.request(cmd::READ, 0, offset, len, &[]).await?.data)
    }

    /// A read answered in one piece (NBD_CMD_FLAG_DF).
    pub async fn read_unfragmented(&self, offset: u64, len: u32) -> Result<Vec<u8>> {
        Ok(self.request(cmd::READ, cflag::DF, offset, len, &[]).await?.data)
    }

    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let flags = if fua { cflag::FUA } else { 0 };
        self.request(cmd::WRITE, flags, offset, data.len() as u32, data).await?;
        Ok(())
    }

    pub async fn flush(&self) -> Result<()> {
        self.request(cmd::FLUSH, 0, 0, 0, &[]).await?;
        Ok(())
    }

    pub async fn trim(&self, offset: u64, len: u32) -> Result<()> {
        self.request(cmd::TRIM, 0, offset, len, &[]).await?;
        Ok(())
    }

    /// NBD_CMD_WRITE_ZEROES with the given command flags (NO_HOLE, FAST_ZERO, FUA).
    pub async fn write_zeroes(&self, offset: u64, len: u32, flags: u16) -> Result<()> {
        self.request(cmd::WRITE_ZEROES, flags, offset, len, &[]).await?;
        Ok(())
    }

    /// `base:allocation` extents from `offset`: (length, NBD_STATE_* flags).
    pub async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<(u32, u32)>> {
        Ok(self.request(cmd::BLOCK_STATUS, 0, offset, len, &[]).await?.extents)
    }

    /// A raw request, for tests of how the server treats odd ones.
    pub async fn raw(&self, kind: u16, flags: u16, offset: u64, len: u32, data: &[u8]) -> Result<Vec<u8>> {
        Ok(self.request(kind, flags, offset, len, data).await?.data)
    }

    /// NBD_CMD_DISC: the server answers what it has accepted, then closes.
    pub async fn disconnect(mut self) -> Result<()> {
        let head = Request {
            flags: 0,
            kind: cmd::DISC,
            cookie: 0,
            offset: 0,
            length: 0,
        }
        .encode();
        let mut w = self.w.lock().await;
        w.write_all(&head).await?;
        w.shutdown().await?;
        drop(w);
        if let Some(r) = self.reader.take() {
            let _ = r.await;
        }
        Ok(())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(r) = &self.reader {
            r.abort();
        }
    }
}

/// Reads replies until the connection ends, completing the pending requests.
async fn read_replies(mut r: OwnedReadHalf, pending: PendingMap) {
    let err = read_loop(&mut r, &pending).await;
    let map = pending.lock().take().unwrap_or_default();
    for (_, p) in map {
        let e = match &err {
            Some(e) => ClientError::Protocol(e.clone()),
            None => ClientError::Closed,
        };
        let _ = p.tx.send(Err(e));
    }
}

async fn read_loop(r: &mut OwnedReadHalf, pending: &PendingMap) -> Option<String> {
    loop {
        let magic = match r.read_u32().await {
            Ok(m) => m,
            Err(_) => return None,
        };
        let step = match magic {
            SIMPLE_REPLY_MAGIC => simple(r, pending).await,
            STRUCTURED_REPLY_MAGIC => structured(r, pending).await,
            m => Err(format!("reply magic {m:#x}")),
        };
        if let Err(e) = step {
            return Some(e);
        }
    }
}

fn take(pending: &PendingMap, cookie: u64) -> Result<Pending, String> {
    pending
        .lock()
        .as_mut()
        .and_then(|m| m.remove(&cookie))
        .ok_or_else(|| format!("reply for unknown cookie {cookie}"))
}

async fn simple(r: &mut OwnedReadHalf, pending: &PendingMap) -> Result<(), String> {
    let error = r.read_u32().await.map_err(|e| e.to_string())?;
    let cookie = r.read_u64().await.map_err(|e| e.to_string())?;
    let mut p = take(pending, cookie)?;
    if error != 0 {
        let _ = p.tx.send(Err(ClientError::Nbd {
            code: error,
            message: String::new(),
        }));
        return Ok(());
    }
    if p.kind == cmd::READ {
        let mut data = vec![0u8; p.len as usize];
        r.read_exact(&mut data).await.map_err(|e| e.to_string())?;
        p.done.data = data;
    }
    let _ = p.tx.send(Ok(p.done));
    Ok(())
}

/// Whether a content chunk of `n` bytes at `off` lies inside a read of `len` at `offset`; a
/// server's offset near the end of the 64-bit range does not wrap around into it.
fn within(off: u64, n: u64, offset: u64, len: u32) -> bool {
    off >= offset && off.checked_add(n).is_some_and(|end| end <= offset + len as u64)
}

async fn structured(r: &mut OwnedReadHalf, pending: &PendingMap) -> Result<(), String> {
    let mut head = [0u8; 16];
    r.read_exact(&mut head).await.map_err(|e| e.to_string())?;
    let h = parse_chunk_header(&head);
    if h.length > (64 << 20) {
        return Err(format!("chunk of {} bytes", h.length));
    }
    let mut payload = vec![0u8; h.length as usize];
    r.read_exact(&mut payload).await.map_err(|e| e.to_string())?;
    let mut guard = pending.lock();
    let p = guard
        .as_mut()
        .and_then(|m| m.get_mut(&h.cookie))
        .ok_or_else(|| format!("chunk for unknown cookie {}", h.cookie))?;
    let mut rd = Reader::new(&payload, "reply chunk");
    let bad = |e: ProtoError| e.to_string();
    match h.kind {
        chunk::NONE => {}
        chunk::OFFSET_DATA | chunk::OFFSET_HOLE => {
            let off = rd.u64().map_err(bad)?;
            let n = if h.kind == chunk::OFFSET_DATA {
                payload.len() as u64 - 8
            } else {
                rd.u32().map_err(bad)? as u64
            };
            if p.kind != cmd::READ || !within(off, n, p.offset, p.len) {
                return Err(format!("content chunk outside the read at {off}+{n}"));
            }
            if p.done.data.is_empty() {
                p.done.data = vec![0u8; p.len as usize];
            }
            let at = (off - p.offset) as usize;
            if h.kind == chunk::OFFSET_DATA {
                p.done.data[at..at + n as usize].copy_from_slice(&payload[8..]);
            }
        }
        chunk::BLOCK_STATUS => {
            let _id = rd.u32().map_err(bad)?;
            while !rd.is_empty() {
                let len = rd.u32().map_err(bad)?;
                let flags = rd.u32().map_err(bad)?;
                p.done.extents.push((len, flags));
            }
        }
        k if k & 0x8000 != 0 => {
            let code = rd.u32().map_err(bad)?;
            let mlen = rd.u16().map_err(bad)? as usize;
            let msg = rd.bytes(mlen).map_err(bad)?;
            p.error = Some((code, String::from_utf8_lossy(msg).into_owned()));
        }
        k => return Err(format!("unknown chunk type {k}")),
    }
    if h.flags & chunk::FLAG_DONE != 0 {
        let p = guard.as_mut().and_then(|m| m.remove(&h.cookie)).expect("present above");
        drop(guard);
        let res = match p.error {
            Some((code, message)) => Err(ClientError::Nbd { code, message }),
            None => {
                let mut d = p.done;
                if p.kind == cmd::READ && d.data.is_empty() {
                    d.data = vec![0u8; p.len as usize];
                }
                Ok(d)
            }
        };
        let _ = p.tx.send(res);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn content_chunks_must_lie_inside_their_read() {
        assert!(within(4096, 512, 4096, 4096));
        assert!(within(8192 - 512, 512, 4096, 4096));
        assert!(!within(4095, 512, 4096, 4096));
        assert!(!within(8192 - 511, 512, 4096, 4096));
        assert!(
            !within(u64::MAX - 8, 4096, 4096, 4096),
            "wraps past the end of the range"
        );
    }
}
