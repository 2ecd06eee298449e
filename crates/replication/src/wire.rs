//! The replication stream: frames of a type byte, a 4-byte big-endian length and a payload.
//! Control frames carry JSON; offers, wants and data are binary, since they are most of the
//! bytes. Anything malformed is an error that says what was wrong, never a panic or a guess.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::error::{ReplError, Result};

/// Sent first by the sender, checked first by the receiver.
pub const MAGIC: &[u8; 8] = b"TSRPL002";
/// Largest frame either side accepts: a batch of data for one grain of the largest size,
/// compressed or not, with room to spare.
pub const MAX_FRAME: usize = 8 << 20;
/// Length of a fingerprint (BLAKE3).
pub const HASH: usize = 32;
/// Grains are offered by the fingerprints of their 4 KiB blocks, so that a 4 KiB write costs
/// 4 KiB on the wire, not its grain (a file system's writes are of its blocks).
pub const BLOCK: u64 = 4096;
/// Most blocks a grain offered may have: those of the largest grain a vdisk may have.
pub const MAX_BLOCKS: usize = (tessera_volume::MAX_GRAIN / BLOCK) as usize;
/// Most blocks a replica asks for and waits to receive at once: twice what a sender's window
/// of offers can ask for, so that a sender that offers without ever sending cannot make the
/// replica hold fingerprints without end.
pub const MAX_WANTED_BLOCKS: usize = 2 * 16 * 32 * MAX_BLOCKS;
/// Most blocks the replica asks for and waits to receive across all the cycles it takes at
/// once (each fingerprint held costs about 50 bytes: some 200 MiB): a few peers each at their
/// cycle's bound cannot make the site hold them without end.
pub const MAX_SITE_WANTED_BLOCKS: usize = 4 * MAX_WANTED_BLOCKS;
/// Most connections one cycle may use.
pub const MAX_STREAMS: u32 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Begin = 1,
    Ready = 2,
    Offer = 3,
    Want = 4,
    Data = 5,
    Hole = 6,
    Commit = 7,
    Done = 8,
    Error = 9,
    /// First frame of a cycle's extra data stream.
    Join = 10,
    /// Last frame of an extra data stream: everything it carries was sent.
    End = 11,
}

impl Kind {
    fn from(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Begin,
            2 => Kind::Ready,
            3 => Kind::Offer,
            4 => Kind::Want,
            5 => Kind::Data,
            6 => Kind::Hole,
            7 => Kind::Commit,
            8 => Kind::Done,
            9 => Kind::Error,
            10 => Kind::Join,
            11 => Kind::End,
            _ => return None,
        })
    }
}

/// What a cycle replicates, as the sender states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Begin {
    /// The pool of the replica on the receiver.
    pub pool: String,
    /// The replica vdisk.
    pub vdisk: String,
    pub size: u64,
    pub grain: u64,
    pub block_size: u32,
    /// The snapshot this cycle makes on the replica (`VDISK@SNAPSHOT`).
    pub snapshot: String,
    /// The last snapshot both sides hold; None: a full cycle.
    pub base: Option<String>,
    /// The sender's snapshot, by its vdisk id, which its pool never gives twice: one deleted
    /// and taken again under the same name is another snapshot, and what a cut cycle of
    /// the first left in the working copy is not taken as part of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<u64>,
    /// Connections the cycle's data goes over: this one and `streams - 1` that join it
    /// with `token` (0 or 1: this one alone).
    #[serde(default)]
    pub streams: u32,
    #[serde(default)]
    pub token: Option<String>,
}

/// An extra data stream of the cycle whose Begin carried `token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Join {
    pub token: String,
    pub stream: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    /// False when the receiver does not hold the base: the sender offers everything.
    pub base_ok: bool,
    /// The replica already holds the cycle's snapshot (its commit was done and the answer
    /// lost): nothing more is sent.
    #[serde(default)]
    pub complete: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Done {
    pub snapshot: String,
    pub blocks_written: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub message: String,
}

/// One grain offered: where it is, its length (the last grain may be short) and the
/// fingerprint of each of its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    pub offset: u64,
    pub len: u32,
    pub blocks: Vec<[u8; HASH]>,
}

impl Offered {
    pub fn of(offset: u64, data: &[u8]) -> Offered {
        Offered {
            offset,
            len: data.len() as u32,
            blocks: data
                .chunks(BLOCK as usize)
                .map(|b| *blake3::hash(b).as_bytes())
                .collect(),
        }
    }
}

/// Blocks of a grain of `len` bytes.
pub fn blocks_in(len: u32) -> usize {
    (len as u64).div_ceil(BLOCK) as usize
}

pub struct Frame {
    pub kind: Kind,
    pub body: Vec<u8>,
}

/// Writes one frame; returns the bytes it put on the wire.
pub fn write_frame(w: &mut impl Write, kind: Kind, body: &[u8]) -> Result<u64> {
    if body.len() > MAX_FRAME {
        return Err(ReplError::Protocol(format!(
            "a {kind:?} frame of {} bytes is too large",
            body.len()
        )));
    }
    let mut head = [0u8; 5];
    head[0] = kind as u8;
    head[1..].copy_from_slice(&(body.len() as u32).to_be_bytes());
    w.write_all(&head)?;
    w.write_all(body)?;
    Ok(5 + body.len() as u64)
}

pub fn write_json(w: &mut impl Write, kind: Kind, v: &impl Serialize) -> Result<u64> {
    write_frame(w, kind, &serde_json::to_vec(v).expect("serializable"))
}

/// How slowly a peer may send one frame: its header within `silence`, the whole within that
/// and a second for every `min_rate` bytes of its body. A socket's read timeout restarts with
/// every byte, so a peer sending a byte now and then would otherwise hold its connection (a
/// thread and a frame's buffer, and a place at the listener) for ever; a slow link still
/// carries the largest frame (8 MiB at 16 KiB/s is 512 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub silence: std::time::Duration,
    pub min_rate: u64,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace {
            silence: crate::transport::SILENCE,
            min_rate: 16 << 10,
        }
    }
}

impl Pace {
    /// How long a frame of `len` bytes may take to arrive.
    fn allows(&self, len: usize) -> std::time::Duration {
        self.silence + std::time::Duration::from_secs_f64(len as f64 / self.min_rate.max(1) as f64)
    }
}

/// A reader that refuses to read on past its deadline.
struct Paced<'a, R> {
    r: &'a mut R,
    started: std::time::Instant,
    allowed: Option<std::time::Duration>,
    min_rate: u64,
}

impl<R: Read> Read for Paced<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.allowed.is_some_and(|a| self.started.elapsed() > a) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the frame came slower than the peer must send ({} bytes a second, after {} s of silence at most)",
                    self.min_rate,
                    self.allowed.unwrap_or_default().as_secs()
                ),
            ));
        }
        self.r.read(buf)
    }
}

/// Reads one frame; None at a clean end of stream (between frames).
pub fn read_frame(r: &mut impl Read) -> Result<Option<Frame>> {
    read_frame_paced(r, None)
}

/// Reads one frame, which must come at `pace` (if given); None at a clean end of stream.
pub fn read_frame_paced(r: &mut impl Read, pace: Option<Pace>) -> Result<Option<Frame>> {
    let mut r = Paced {
        r,
        started: std::time::Instant::now(),
        allowed: pace.map(|p| p.silence),
        min_rate: pace.map_or(0, |p| p.min_rate),
    };
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ReplError::Protocol("the stream ended inside a frame header".into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let kind = Kind::from(head[0]).ok_or_else(|| ReplError::Protocol(format!("unknown frame type {}", head[0])))?;
    let len = u32::from_be_bytes(head[1..].try_into().expect("4 bytes")) as usize;
    if len > MAX_FRAME {
        return Err(ReplError::Protocol(format!(
            "a {kind:?} frame of {len} bytes is too large"
        )));
    }
    r.allowed = pace.map(|p| p.allows(len));
    // Grown as the body comes, not sized by the header: a header alone holds no 8 MiB.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    let got = r
        .by_ref()
        .take(len as u64)
        .read_to_end(&mut body)
        .map_err(|e| ReplError::Protocol(format!("the stream ended inside a {kind:?} frame: {e}")))?;
    if got < len {
        return Err(ReplError::Protocol(format!(
            "the stream ended inside a {kind:?} frame ({got} of {len} bytes)"
        )));
    }
    Ok(Some(Frame { kind, body }))
}

impl Frame {
    /// The frame's JSON body, if the frame is of `kind`.
    pub fn json<T: for<'de> Deserialize<'de>>(&self, kind: Kind) -> Result<T> {
        self.expect(kind)?;
        serde_json::from_slice(&self.body).map_err(|e| ReplError::Protocol(format!("a {kind:?} frame: {e}")))
    }

    /// An error unless the frame is of `kind` (a refusal from the peer becomes its message).
    pub fn expect(&self, kind: Kind) -> Result<()> {
        if self.kind == kind {
            return Ok(());
        }
        if self.kind == Kind::Error {
            let r: Refusal = serde_json::from_slice(&self.body).unwrap_or_else(|_| Refusal {
                message: String::from_utf8_lossy(&self.body).into_owned(),
            });
            return Err(ReplError::Refused(peer_text(&r.message)));
        }
        Err(ReplError::Protocol(format!(
            "expected a {kind:?} frame, got {:?}",
            self.kind
        )))
    }
}

/// Longest text of the peer's (a refusal's message, a name it sent) kept, in characters.
pub const MAX_PEER_TEXT: usize = 1024;

/// Text the peer sent, made fit to keep and show: a replica's last error is saved, listed by
/// the API and printed by the CLI, and an error frame may carry 8 MiB of anything. Control
/// characters, and the invisible ones that reorder or hide text, are written escaped, and the
/// text cut to [`MAX_PEER_TEXT`] characters.
pub fn peer_text(text: &str) -> String {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}')
    };
    let mut s = String::new();
    for c in text.chars().take(MAX_PEER_TEXT) {
        if hidden(c) {
            s.extend(c.escape_default());
        } else {
            s.push(c);
        }
    }
    if text.chars().nth(MAX_PEER_TEXT).is_some() {
        s.push('…');
    }
    s
}

/// A batch of offers: its number, then each grain with its blocks' fingerprints.
pub fn encode_offer(batch: u64, grains: &[Offered]) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + grains.iter().map(|g| 12 + g.blocks.len() * HASH).sum::<usize>());
    b.extend_from_slice(&batch.to_be_bytes());
    b.extend_from_slice(&(grains.len() as u32).to_be_bytes());
    for g in grains {
        b.extend_from_slice(&g.offset.to_be_bytes());
        b.extend_from_slice(&g.len.to_be_bytes());
        for h in &g.blocks {
            b.extend_from_slice(h);
        }
    }
    b
}

pub fn decode_offer(b: &[u8]) -> Result<(u64, Vec<Offered>)> {
    let bad = || ReplError::Protocol("a malformed Offer frame".into());
    let (batch, n) = head(b).ok_or_else(bad)?;
    let mut rest = &b[12..];
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        if rest.len() < 12 {
            return Err(bad());
        }
        let offset = u64::from_be_bytes(rest[..8].try_into().expect("8"));
        let len = u32::from_be_bytes(rest[8..12].try_into().expect("4"));
        let k = blocks_in(len);
        if len == 0 || k > MAX_BLOCKS || rest.len() < 12 + k * HASH {
            return Err(bad());
        }
        let blocks = rest[12..12 + k * HASH]
            .chunks_exact(HASH)
            .map(|c| c.try_into().expect("32"))
            .collect();
        out.push(Offered { offset, len, blocks });
        rest = &rest[12 + k * HASH..];
    }
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok((batch, out))
}

/// A grain the replica lacks some blocks of: its index in the offer batch, and a bitmap of
/// the blocks it lacks (bit k of byte k / 8 for block k).
pub type Wanted = (u32, Vec<u8>);

/// The answer to an offer batch: its number, then each grain the replica lacks some of.
pub fn encode_want(batch: u64, wanted: &[Wanted]) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + wanted.iter().map(|w| 8 + w.1.len()).sum::<usize>());
    b.extend_from_slice(&batch.to_be_bytes());
    b.extend_from_slice(&(wanted.len() as u32).to_be_bytes());
    for (i, bits) in wanted {
        b.extend_from_slice(&i.to_be_bytes());
        b.extend_from_slice(&(bits.len() as u32).to_be_bytes());
        b.extend_from_slice(bits);
    }
    b
}

pub fn decode_want(b: &[u8]) -> Result<(u64, Vec<Wanted>)> {
    let bad = || ReplError::Protocol("a malformed Want frame".into());
    let (batch, n) = head(b).ok_or_else(bad)?;
    let mut rest = &b[12..];
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        if rest.len() < 8 {
            return Err(bad());
        }
        let i = u32::from_be_bytes(rest[..4].try_into().expect("4"));
        let len = u32::from_be_bytes(rest[4..8].try_into().expect("4")) as usize;
        if len > MAX_BLOCKS / 8 || rest.len() < 8 + len {
            return Err(bad());
        }
        out.push((i, rest[8..8 + len].to_vec()));
        rest = &rest[8 + len..];
    }
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok((batch, out))
}

/// Whether block `k` is set in a want bitmap.
pub fn wanted(bits: &[u8], k: usize) -> bool {
    bits.get(k / 8).is_some_and(|b| b & (1 << (k % 8)) != 0)
}

fn head(b: &[u8]) -> Option<(u64, usize)> {
    if b.len() < 12 {
        return None;
    }
    Some((
        u64::from_be_bytes(b[..8].try_into().ok()?),
        u32::from_be_bytes(b[8..12].try_into().ok()?) as usize,
    ))
}

/// Codec of a Data frame's bytes.
pub const RAW: u8 = 0;
pub const ZSTD: u8 = 1;

/// One grain's data: where, its length, how it is coded, the bytes.
pub fn encode_data(offset: u64, raw: &[u8]) -> Vec<u8> {
    let packed = zstd::bulk::compress(raw, 1).ok().filter(|c| c.len() < raw.len());
    let (codec, bytes) = match &packed {
        Some(c) => (ZSTD, c.as_slice()),
        None => (RAW, raw),
    };
    let mut b = Vec::with_capacity(13 + bytes.len());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&(raw.len() as u32).to_be_bytes());
    b.push(codec);
    b.extend_from_slice(bytes);
    b
}

pub fn decode_data(b: &[u8]) -> Result<(u64, Vec<u8>)> {
    if b.len() < 13 {
        return Err(ReplError::Protocol("a malformed Data frame".into()));
    }
    let offset = u64::from_be_bytes(b[..8].try_into().expect("8"));
    let len = u32::from_be_bytes(b[8..12].try_into().expect("4")) as usize;
    if len > MAX_FRAME {
        return Err(ReplError::Protocol(format!("a Data frame of {len} bytes is too large")));
    }
    let data = match b[12] {
        RAW => b[13..].to_vec(),
        ZSTD => zstd::bulk::decompress(&b[13..], len)
            .map_err(|e| ReplError::Protocol(format!("a Data frame does not decompress: {e}")))?,
        c => return Err(ReplError::Protocol(format!("a Data frame with unknown codec {c}"))),
    };
    if data.len() != len {
        return Err(ReplError::Protocol(format!(
            "a Data frame said {len} bytes and holds {}",
            data.len()
        )));
    }
    Ok((offset, data))
}

/// A range that became a hole.
pub fn encode_hole(offset: u64, len: u64) -> Vec<u8> {
    let mut b = offset.to_be_bytes().to_vec();
    b.extend_from_slice(&len.to_be_bytes());
    b
}

pub fn decode_hole(b: &[u8]) -> Result<(u64, u64)> {
    if b.len() != 16 {
        return Err(ReplError::Protocol("a malformed Hole frame".into()));
    }
    Ok((
        u64::from_be_bytes(b[..8].try_into().expect("8")),
        u64::from_be_bytes(b[8..].try_into().expect("8")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused_with_a_reason() {
        let offers = vec![Offered::of(0, &[1u8; 65536]), Offered::of(65536, &[2u8; 512])];
        assert_eq!(offers[0].blocks.len(), 16);
        assert_eq!(offers[1].blocks.len(), 1);
        assert_eq!(decode_offer(&encode_offer(7, &offers)).unwrap(), (7, offers.clone()));
        // The largest grain a vdisk may have is offered whole.
        let largest = vec![Offered::of(0, &vec![3u8; tessera_volume::MAX_GRAIN as usize])];
        assert_eq!(decode_offer(&encode_offer(8, &largest)).unwrap(), (8, largest.clone()));
        let want = vec![(0, vec![0b1000_0001, 0]), (1, vec![1])];
        assert_eq!(decode_want(&encode_want(9, &want)).unwrap(), (9, want.clone()));
        assert!(wanted(&want[0].1, 0) && wanted(&want[0].1, 7) && !wanted(&want[0].1, 1) && !wanted(&want[0].1, 99));
        let text = b"abc".repeat(1000);
        let d = encode_data(4096, &text);
        assert!(d.len() < text.len(), "compressible data is sent compressed");
        assert_eq!(decode_data(&d).unwrap(), (4096, text));
        assert_eq!(decode_hole(&encode_hole(1, 2)).unwrap(), (1, 2));

        let mut wire = Vec::new();
        write_frame(&mut wire, Kind::Commit, &[]).unwrap();
        let mut r = &wire[..];
        assert_eq!(read_frame(&mut r).unwrap().unwrap().kind, Kind::Commit);
        assert!(read_frame(&mut r).unwrap().is_none(), "a clean end");

        let err = |b: &[u8]| read_frame(&mut &b[..]).err().unwrap().to_string();
        assert!(err(&[42, 0, 0, 0, 0]).contains("unknown frame type"));
        assert!(err(&[5, 0xff, 0, 0, 0]).contains("too large"));
        assert!(err(&[5, 0, 0, 0, 9, 1]).contains("ended inside"));
        assert!(err(&[5, 0]).contains("inside a frame header"));
        assert!(decode_offer(&[0; 11]).is_err());
        assert!(decode_offer(&encode_offer(1, &offers)[..50]).is_err());
        let mut long = encode_offer(1, &offers);
        long.push(0);
        assert!(decode_offer(&long).is_err(), "trailing bytes");
        assert!(decode_want(&encode_want(1, &want)[..20]).is_err());
        assert!(decode_data(&[0; 12]).is_err());
        let mut bad = encode_data(0, &[5u8; 100]);
        bad[12] = 9;
        assert!(decode_data(&bad).unwrap_err().to_string().contains("codec"));
        let refusal = Frame {
            kind: Kind::Error,
            body: serde_json::to_vec(&Refusal {
                message: "pool full".into(),
            })
            .unwrap(),
        };
        assert!(refusal
            .expect(Kind::Done)
            .unwrap_err()
            .to_string()
            .contains("pool full"));
        // A peer's refusal is kept as one bounded line.
        let flood = Frame {
            kind: Kind::Error,
            body: serde_json::to_vec(&Refusal {
                message: format!("full\n\x1b[2J\u{202e}{}", "x".repeat(MAX_FRAME / 2)),
            })
            .unwrap(),
        };
        let e = flood.expect(Kind::Done).unwrap_err().to_string();
        assert!(e.len() < MAX_PEER_TEXT + 100, "{} bytes", e.len());
        assert!(
            !e.contains('\n') && !e.contains('\x1b') && !e.contains('\u{202e}') && e.contains("full\\n"),
            "{}",
            &e[..40]
        );
    }
}
