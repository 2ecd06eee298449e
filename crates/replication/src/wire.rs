//! The replication stream: frames of a type byte, a 4-byte big-endian length and a payload.
//! Control frames carry JSON; offers, wants and data are binary, since they are most of the
//! bytes. Anything malformed is an error that says what was wrong, never a panic or a guess.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::error::{ReplError, Result};

/// Sent first by the sender, checked first by the receiver.
pub const MAGIC: &[u8; 8] = b"TSRPL001";
/// Largest frame either side accepts: a batch of data for one grain of the largest size,
/// compressed or not, with room to spare.
pub const MAX_FRAME: usize = 8 << 20;
/// Length of a grain's fingerprint (BLAKE3).
pub const HASH: usize = 32;

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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    /// False when the receiver does not hold the base: the sender offers everything.
    pub base_ok: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Done {
    pub snapshot: String,
    pub grains_written: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub message: String,
}

/// One grain offered: where it is, its length (the last grain may be short) and its
/// fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered {
    pub offset: u64,
    pub len: u32,
    pub hash: [u8; HASH],
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

/// Reads one frame; None at a clean end of stream (between frames).
pub fn read_frame(r: &mut impl Read) -> Result<Option<Frame>> {
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
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)
        .map_err(|e| ReplError::Protocol(format!("the stream ended inside a {kind:?} frame: {e}")))?;
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
            return Err(ReplError::Refused(r.message));
        }
        Err(ReplError::Protocol(format!(
            "expected a {kind:?} frame, got {:?}",
            self.kind
        )))
    }
}

/// A batch of offers: its number, then each grain.
pub fn encode_offer(batch: u64, grains: &[Offered]) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + grains.len() * (12 + HASH));
    b.extend_from_slice(&batch.to_be_bytes());
    b.extend_from_slice(&(grains.len() as u32).to_be_bytes());
    for g in grains {
        b.extend_from_slice(&g.offset.to_be_bytes());
        b.extend_from_slice(&g.len.to_be_bytes());
        b.extend_from_slice(&g.hash);
    }
    b
}

pub fn decode_offer(b: &[u8]) -> Result<(u64, Vec<Offered>)> {
    let bad = || ReplError::Protocol("a malformed Offer frame".into());
    let (batch, n) = head(b).ok_or_else(bad)?;
    let rest = &b[12..];
    if rest.len() != n * (12 + HASH) {
        return Err(bad());
    }
    Ok((
        batch,
        rest.chunks_exact(12 + HASH)
            .map(|c| Offered {
                offset: u64::from_be_bytes(c[..8].try_into().expect("8")),
                len: u32::from_be_bytes(c[8..12].try_into().expect("4")),
                hash: c[12..].try_into().expect("32"),
            })
            .collect(),
    ))
}

/// The answer to an offer batch: its number, then the indexes (in the batch) of the grains
/// the receiver lacks.
pub fn encode_want(batch: u64, wanted: &[u32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + wanted.len() * 4);
    b.extend_from_slice(&batch.to_be_bytes());
    b.extend_from_slice(&(wanted.len() as u32).to_be_bytes());
    for w in wanted {
        b.extend_from_slice(&w.to_be_bytes());
    }
    b
}

pub fn decode_want(b: &[u8]) -> Result<(u64, Vec<u32>)> {
    let bad = || ReplError::Protocol("a malformed Want frame".into());
    let (batch, n) = head(b).ok_or_else(bad)?;
    let rest = &b[12..];
    if rest.len() != n * 4 {
        return Err(bad());
    }
    Ok((
        batch,
        rest.chunks_exact(4)
            .map(|c| u32::from_be_bytes(c.try_into().expect("4")))
            .collect(),
    ))
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
        let offers = vec![
            Offered {
                offset: 0,
                len: 65536,
                hash: [1; HASH],
            },
            Offered {
                offset: 65536,
                len: 512,
                hash: [2; HASH],
            },
        ];
        assert_eq!(decode_offer(&encode_offer(7, &offers)).unwrap(), (7, offers.clone()));
        assert_eq!(decode_want(&encode_want(9, &[0, 3])).unwrap(), (9, vec![0, 3]));
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
    }
}
