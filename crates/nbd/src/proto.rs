//! The NBD wire format (the protocol document of NetworkBlockDevice/nbd, `doc/proto.md`):
//! magic numbers, flags, option and command codes, and the parsing and encoding of the
//! messages both sides exchange. Pure functions over bytes: no I/O here.

use thiserror::Error;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub mod tflag {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Options of the handshake phase.
pub mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
    pub const LIST_META_CONTEXT: u32 = 9;
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types.
pub mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const META_CONTEXT: u32 = 4;
    pub const ERR_UNSUP: u32 = (1 << 31) + 1;
    pub const ERR_POLICY: u32 = (1 << 31) + 2;
    pub const ERR_INVALID: u32 = (1 << 31) + 3;
    pub const ERR_TLS_REQD: u32 = (1 << 31) + 5;
    pub const ERR_UNKNOWN: u32 = (1 << 31) + 6;
    pub const ERR_TOO_BIG: u32 = (1 << 31) + 9;
}

/// Information types in NBD_OPT_INFO / NBD_OPT_GO.
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Commands of the transmission phase.
pub mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const CACHE: u16 = 5;
    pub const WRITE_ZEROES: u16 = 6;
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cflag {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
    pub const REQ_ONE: u16 = 1 << 3;
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply chunk types and flags.
pub mod chunk {
    pub const FLAG_DONE: u16 = 1;
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const OFFSET_HOLE: u16 = 2;
    pub const BLOCK_STATUS: u16 = 5;
    pub const ERROR: u16 = (1 << 15) + 1;
    pub const ERROR_OFFSET: u16 = (1 << 15) + 2;
}

/// Error values of replies (errno numbers, fixed by the protocol whatever the platform).
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const ENOMEM: u32 = 12;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
    pub const ENOTSUP: u32 = 95;
    pub const ESHUTDOWN: u32 = 108;
}

/// `base:allocation` status flags.
pub const STATE_HOLE: u32 = 1;
pub const STATE_ZERO: u32 = 2;
pub const BASE_ALLOCATION: &str = "base:allocation";

/// Longest string the protocol allows (export names, queries, messages).
pub const MAX_STRING: usize = 4096;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("bad magic {0:#x}")]
    Magic(u64),
    #[error("{0} is truncated")]
    Truncated(&'static str),
    #[error("{what} is {len} bytes; at most {max} are allowed")]
    TooLong { what: &'static str, len: usize, max: usize },
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
}

/// A cursor over a message's bytes that fails cleanly instead of panicking.
pub struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { buf, what }
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError::Truncated(self.what));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    pub fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_be_bytes(self.bytes(2)?.try_into().unwrap()))
    }

    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_be_bytes(self.bytes(4)?.try_into().unwrap()))
    }

    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_be_bytes(self.bytes(8)?.try_into().unwrap()))
    }

    /// A string whose 32-bit length comes first.
    pub fn string32(&mut self) -> Result<String, ProtoError> {
        let n = self.u32()? as usize;
        if n > MAX_STRING {
            return Err(ProtoError::TooLong {
                what: self.what,
                len: n,
                max: MAX_STRING,
            });
        }
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::NotUtf8(self.what))
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

impl InfoRequest {
    pub fn parse(data: &[u8]) -> Result<InfoRequest, ProtoError> {
        let mut r = Reader::new(data, "NBD_OPT_INFO/GO data");
        let name = r.string32()?;
        let n = r.u16()? as usize;
        let mut requests = Vec::with_capacity(n.min(16));
        for _ in 0..n {
            requests.push(r.u16()?);
        }
        if !r.is_empty() {
            return Err(ProtoError::Truncated("NBD_OPT_INFO/GO data (trailing bytes)"));
        }
        Ok(InfoRequest { name, requests })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v.extend_from_slice(&(self.requests.len() as u16).to_be_bytes());
        for r in &self.requests {
            v.extend_from_slice(&r.to_be_bytes());
        }
        v
    }
}

/// The data of NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub name: String,
    pub queries: Vec<String>,
}

/// Queries per request we are willing to look at; more is ERR_TOO_BIG.
pub const MAX_META_QUERIES: usize = 128;

impl MetaContextRequest {
    pub fn parse(data: &[u8]) -> Result<MetaContextRequest, ProtoError> {
        let mut r = Reader::new(data, "meta context request");
        let name = r.string32()?;
        let n = r.u32()? as usize;
        if n > MAX_META_QUERIES {
            return Err(ProtoError::TooLong {
                what: "meta context query list",
                len: n,
                max: MAX_META_QUERIES,
            });
        }
        let mut queries = Vec::with_capacity(n);
        for _ in 0..n {
            queries.push(r.string32()?);
        }
        if !r.is_empty() {
            return Err(ProtoError::Truncated("meta context request (trailing bytes)"));
        }
        Ok(MetaContextRequest { name, queries })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            v.extend_from_slice(&(q.len() as u32).to_be_bytes());
            v.extend_from_slice(q.as_bytes());
        }
        v
    }
}

/// An option reply header followed by its data.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// A transmission request header (28 bytes; a WRITE's data follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

pub const REQUEST_LEN: usize = 28;

impl Request {
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Result<Request, ProtoError> {
        let mut r = Reader::new(b, "request");
        let magic = r.u32()?;
        if magic != REQUEST_MAGIC {
            return Err(ProtoError::Magic(magic as u64));
        }
        Ok(Request {
            flags: r.u16()?,
            kind: r.u16()?,
            cookie: r.u64()?,
            offset: r.u64()?,
            length: r.u32()?,
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// A simple reply header (16 bytes; a successful READ's data follows it).
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk header (20 bytes) for a payload of `len` bytes.
pub fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// The payload of an error chunk: the errno and a message for people.
pub fn error_payload(error: u32, message: &str, offset: Option<u64>) -> Vec<u8> {
    let mut m = message.as_bytes();
    if m.len() > MAX_STRING {
        m = &m[..MAX_STRING];
    }
    let mut v = Vec::with_capacity(14 + m.len());
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&(m.len() as u16).to_be_bytes());
    v.extend_from_slice(m);
    if let Some(o) = offset {
        v.extend_from_slice(&o.to_be_bytes());
    }
    v
}

/// A structured reply chunk as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub length: u32,
}

/// What follows the 4-byte magic of a reply: the rest of a simple reply (12 bytes) or of a
/// structured chunk header (16 bytes).
pub fn parse_chunk_header(rest: &[u8; 16]) -> ChunkHeader {
    ChunkHeader {
        flags: u16::from_be_bytes([rest[0], rest[1]]),
        kind: u16::from_be_bytes([rest[2], rest[3]]),
        cookie: u64::from_be_bytes(rest[4..12].try_into().unwrap()),
        length: u32::from_be_bytes(rest[12..16].try_into().unwrap()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_round_trips() {
        let r = Request {
            flags: cflag::FUA,
            kind: cmd::WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        assert_eq!(Request::parse(&r.encode()).unwrap(), r);
        let mut bad = r.encode();
        bad[0] ^= 1;
        assert!(matches!(Request::parse(&bad), Err(ProtoError::Magic(_))));
    }

    #[test]
    fn info_request_rejects_lies_about_lengths() {
        let good = InfoRequest {
            name: "vol1".into(),
            requests: vec![info::BLOCK_SIZE, info::NAME],
        };
        assert_eq!(InfoRequest::parse(&good.encode()).unwrap(), good);
        let mut long_name = good.encode();
        long_name[3] = 200; // name length beyond the data
        assert!(InfoRequest::parse(&long_name).is_err());
        let mut extra = good.encode();
        extra.push(0);
        assert!(InfoRequest::parse(&extra).is_err());
        let mut huge = good.encode();
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(InfoRequest::parse(&huge), Err(ProtoError::TooLong { .. })));
    }

    #[test]
    fn meta_context_requests_round_trip_and_are_bounded() {
        let m = MetaContextRequest {
            name: "".into(),
            queries: vec!["base:allocation".into(), "qemu:dirty-bitmap:x".into()],
        };
        assert_eq!(MetaContextRequest::parse(&m.encode()).unwrap(), m);
        let mut many = m.encode();
        many[4..8].copy_from_slice(&(MAX_META_QUERIES as u32 + 1).to_be_bytes());
        assert!(matches!(
            MetaContextRequest::parse(&many),
            Err(ProtoError::TooLong { .. })
        ));
    }

    #[test]
    fn error_payload_layout() {
        let p = error_payload(errno::EIO, "bad", Some(512));
        assert_eq!(&p[0..4], &5u32.to_be_bytes());
        assert_eq!(&p[4..6], &3u16.to_be_bytes());
        assert_eq!(&p[6..9], b"bad");
        assert_eq!(&p[9..17], &512u64.to_be_bytes());
    }

    proptest! {
        /// No byte string makes the option parsers panic.
        #[test]
        fn option_parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = InfoRequest::parse(&data);
            let _ = MetaContextRequest::parse(&data);
        }
    }
}
