//! The sending side of a cycle: offers the fingerprint of every grain that changed since the
//! base snapshot, and sends, compressed, only the grains the replica says it lacks. Offers
//! run ahead of the answers by a window of batches, so that a long round trip costs one wait
//! per cycle, not one per batch.

use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};
use std::sync::mpsc;
use std::time::Duration;

use tessera_volume::Vdisk;

use crate::error::{ReplError, Result};
use crate::wire::{self, Begin, Done, Frame, Kind, Offered, Ready, MAGIC};

/// Grains per offer.
const BATCH: usize = 32;
/// Offer batches in flight before the sender waits for an answer.
const WINDOW: usize = 16;

/// What a cycle took.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SendReport {
    /// True when every grain was offered (no base, or the replica lacked it).
    pub full: bool,
    pub offered_grains: u64,
    pub sent_grains: u64,
    /// Bytes of the grains sent, before compression.
    pub sent_bytes: u64,
    /// Everything written to the stream: frames, headers, compressed data.
    pub wire_bytes: u64,
    pub holes: u64,
    pub snapshot: String,
}

/// Replicates `newer` (a snapshot) to the replica vdisk `replica` of the peer behind
/// `reader`/`writer` (two halves of one connection; `shutdown` closes it, so that a reader
/// blocked on it returns), as the replica's snapshot `snapshot`, sending what changed since
/// `base` (an older snapshot the replica also holds under the given name).
pub fn send<R: Read + Send, W: Write>(
    reader: R,
    writer: W,
    shutdown: &(dyn Fn() + Sync),
    newer: &Vdisk,
    base: Option<(&Vdisk, &str)>,
    replica: &str,
    snapshot: &str,
) -> Result<SendReport> {
    if !newer.is_snapshot() {
        return Err(ReplError::Invalid(format!(
            "'{}' is not a snapshot: a cycle sends a point-in-time image",
            newer.name()
        )));
    }
    let mut w = BufWriter::with_capacity(1 << 20, writer);
    let mut report = SendReport {
        snapshot: snapshot.to_string(),
        ..Default::default()
    };
    let (tx, rx) = mpsc::channel::<Result<Frame>>();
    std::thread::scope(|scope| {
        // Answers come back on their own thread, so that the sender never stops writing to
        // read, and the peer never stops reading to write.
        scope.spawn(move || {
            let mut r = reader;
            loop {
                let f = wire::read_frame(&mut r);
                let last = !matches!(&f, Ok(Some(f)) if f.kind == Kind::Want || f.kind == Kind::Ready);
                let _ = tx
                    .send(f.and_then(|f| f.ok_or_else(|| ReplError::Protocol("the replica closed the stream".into()))));
                if last {
                    return;
                }
            }
        });
        let r = run(&mut w, &rx, newer, base, replica, snapshot, &mut report);
        if let Err(e) = r {
            // A replica that refuses says why and closes; the write that failed on the
            // closed stream is not the reason. Wait a moment for the reason, then close, so
            // that the answering thread returns even from a peer that says nothing.
            let reason = refusal(&rx, Duration::from_secs(2));
            shutdown();
            return Err(reason.unwrap_or(e));
        }
        r
    })?;
    Ok(report)
}

/// The peer's refusal, if it sends one within `wait`.
fn refusal(rx: &mpsc::Receiver<Result<Frame>>, wait: Duration) -> Option<ReplError> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(f)) if f.kind == Kind::Error => return f.expect(Kind::Done).err(),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

fn next(rx: &mpsc::Receiver<Result<Frame>>) -> Result<Frame> {
    rx.recv()
        .map_err(|_| ReplError::Protocol("the replica closed the stream".into()))?
}

fn run<W: Write>(
    w: &mut BufWriter<W>,
    rx: &mpsc::Receiver<Result<Frame>>,
    newer: &Vdisk,
    base: Option<(&Vdisk, &str)>,
    replica: &str,
    snapshot: &str,
    report: &mut SendReport,
) -> Result<()> {
    w.write_all(MAGIC)?;
    report.wire_bytes += MAGIC.len() as u64;
    let begin = Begin {
        vdisk: replica.to_string(),
        size: newer.size(),
        grain: newer.grain_size(),
        block_size: newer.block_size(),
        snapshot: snapshot.to_string(),
        base: base.map(|(_, name)| name.to_string()),
    };
    report.wire_bytes += wire::write_json(w, Kind::Begin, &begin)?;
    w.flush()?;
    let ready: Ready = next(rx)?.json(Kind::Ready)?;
    let base = base.filter(|_| ready.base_ok);
    report.full = base.is_none();
    let extents = match base {
        Some((b, _)) => newer.changed_since(b)?,
        None => newer.extents(0, newer.size())?,
    };
    for e in extents.iter().filter(|e| !e.mapped) {
        report.wire_bytes += wire::write_frame(w, Kind::Hole, &wire::encode_hole(e.offset, e.len))?;
        report.holes += 1;
    }

    let grain = newer.grain_size();
    let mut outstanding: HashMap<u64, Vec<(u64, Vec<u8>)>> = HashMap::new();
    let mut batch: Vec<(u64, Vec<u8>)> = Vec::with_capacity(BATCH);
    let mut batch_no = 0u64;
    let grains = extents.iter().filter(|e| e.mapped).flat_map(|e| {
        let end = e.offset + e.len;
        (e.offset..end)
            .step_by(grain as usize)
            .map(move |o| (o, grain.min(end - o)))
    });
    for (offset, len) in grains {
        let mut data = vec![0u8; len as usize];
        newer.read(offset, &mut data)?;
        batch.push((offset, data));
        if batch.len() == BATCH {
            offer(w, batch_no, std::mem::take(&mut batch), &mut outstanding, report)?;
            batch_no += 1;
            while outstanding.len() >= WINDOW {
                answer(w, rx, &mut outstanding, report)?;
            }
        }
    }
    if !batch.is_empty() {
        offer(w, batch_no, batch, &mut outstanding, report)?;
    }
    while !outstanding.is_empty() {
        answer(w, rx, &mut outstanding, report)?;
    }
    report.wire_bytes += wire::write_frame(w, Kind::Commit, &[])?;
    w.flush()?;
    let done: Done = next(rx)?.json(Kind::Done)?;
    if done.snapshot != snapshot {
        return Err(ReplError::Protocol(format!(
            "the replica made snapshot '{}', not '{snapshot}'",
            done.snapshot
        )));
    }
    Ok(())
}

fn offer<W: Write>(
    w: &mut BufWriter<W>,
    no: u64,
    batch: Vec<(u64, Vec<u8>)>,
    outstanding: &mut HashMap<u64, Vec<(u64, Vec<u8>)>>,
    report: &mut SendReport,
) -> Result<()> {
    let offers: Vec<Offered> = batch
        .iter()
        .map(|(offset, data)| Offered {
            offset: *offset,
            len: data.len() as u32,
            hash: *blake3::hash(data).as_bytes(),
        })
        .collect();
    report.offered_grains += offers.len() as u64;
    report.wire_bytes += wire::write_frame(w, Kind::Offer, &wire::encode_offer(no, &offers))?;
    outstanding.insert(no, batch);
    Ok(())
}

/// Takes one answer and sends the grains it asks for.
fn answer<W: Write>(
    w: &mut BufWriter<W>,
    rx: &mpsc::Receiver<Result<Frame>>,
    outstanding: &mut HashMap<u64, Vec<(u64, Vec<u8>)>>,
    report: &mut SendReport,
) -> Result<()> {
    // What is buffered must reach the replica before waiting for its answer to it.
    w.flush()?;
    let f = next(rx)?;
    f.expect(Kind::Want)?;
    let (no, wanted) = wire::decode_want(&f.body)?;
    let batch = outstanding
        .remove(&no)
        .ok_or_else(|| ReplError::Protocol(format!("an answer to batch {no}, which is not outstanding")))?;
    for i in wanted {
        let (offset, data) = batch
            .get(i as usize)
            .ok_or_else(|| ReplError::Protocol(format!("batch {no} has no grain {i}")))?;
        report.wire_bytes += wire::write_frame(w, Kind::Data, &wire::encode_data(*offset, data))?;
        report.sent_grains += 1;
        report.sent_bytes += data.len() as u64;
    }
    Ok(())
}
