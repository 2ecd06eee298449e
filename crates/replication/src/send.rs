//! The sending side of a cycle: offers the fingerprints of the blocks of every grain that
//! changed since the base snapshot, and sends, compressed, only the blocks the replica says it
//! lacks. Offers
//! run ahead of the answers by a window of batches, so that a long round trip costs one wait
//! per cycle, not one per batch.

use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use std::sync::atomic::Ordering;

use tessera_volume::{Progress, Vdisk};

use crate::error::{ReplError, Result};
use crate::wire::{self, Begin, Done, Frame, Join, Kind, Offered, Ready, BLOCK, MAGIC};

/// Grains per offer, at most.
const BATCH: usize = 32;
/// Bytes of grains per offer, at most (one grain larger than this is offered alone): the
/// sender holds what it offered until it is answered, and 16 batches of 32 grains of 4 MiB
/// would be 2 GiB per cycle.
const BATCH_BYTES: usize = 2 << 20;
/// Offer batches in flight before the sender waits for an answer (the replica accepts up to
/// twice what they can ask for: `wire::MAX_WANTED_BLOCKS`).
const WINDOW: usize = 16;

/// Whether `batch` is offered now.
fn batch_full(batch: &Batch) -> bool {
    batch.len() == BATCH || batch.iter().map(|(_, d)| d.len()).sum::<usize>() >= BATCH_BYTES
}

/// What a cycle took.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SendReport {
    /// True when every grain was offered (no base, or the replica lacked it).
    pub full: bool,
    pub offered_grains: u64,
    /// Bytes of the grains that changed since the base (every mapped grain, for a full cycle).
    pub changed_bytes: u64,
    /// Grains of which some blocks were sent.
    pub sent_grains: u64,
    /// Bytes of the blocks sent, before compression.
    pub sent_bytes: u64,
    /// Everything written to the stream: frames, headers, compressed data.
    pub wire_bytes: u64,
    pub holes: u64,
    pub snapshot: String,
    /// The replica already held the snapshot (an earlier attempt's commit).
    pub complete: bool,
}

/// Replicates `newer` (a snapshot) to the replica vdisk `pool/replica` of the peer at the
/// other end of `conn`, as the replica's snapshot `snapshot`, sending what changed since
/// `base` (an older snapshot the replica also holds, under the given name).
///
/// One thread does it all: answers are read only once a window of offers is out, and an
/// answer is small, so neither side can fill the other's buffers while it waits. A stream that
/// fails is read once more for the replica's reason (give `conn` a read timeout, so that a
/// silent peer cannot hold the sender).
pub fn send<S: Read + Write>(
    conn: S,
    newer: &Vdisk,
    base: Option<(&Vdisk, &str)>,
    pool: &str,
    replica: &str,
    snapshot: &str,
) -> Result<SendReport> {
    send_watched(conn, newer, base, pool, replica, snapshot, &Progress::default())
}

/// [`send`], counting in `progress` the bytes of the changed grains dealt with: offered,
/// and what the replica lacked of them sent (out of all of them), and stopping with
/// [`ReplError::Cancelled`] once its cancel flag is set.
pub fn send_watched<S: Read + Write>(
    conn: S,
    newer: &Vdisk,
    base: Option<(&Vdisk, &str)>,
    pool: &str,
    replica: &str,
    snapshot: &str,
    progress: &Progress,
) -> Result<SendReport> {
    let mut none = || -> Result<std::io::Sink> { Err(ReplError::Invalid("one stream".into())) };
    let to = Target {
        pool,
        replica,
        snapshot,
    };
    send_streams(conn, 1, &mut none, newer, base, &to, progress)
}

/// Where a cycle goes: the replica's pool, vdisk and the snapshot it makes.
pub struct Target<'a> {
    pub pool: &'a str,
    pub replica: &'a str,
    pub snapshot: &'a str,
}

/// [`send_watched`] with the data spread over `streams` connections: `conn`, which carries
/// the cycle's control (offers, answers, commit) and its share of the data, and `streams - 1`
/// that `open` makes once the replica is ready, which carry data only. Each is written by a
/// thread of its own, so that one stream's losses do not hold the others.
pub fn send_streams<S: Read + Write, X: Write + Send>(
    conn: S,
    streams: u32,
    open: &mut dyn FnMut() -> Result<X>,
    newer: &Vdisk,
    base: Option<(&Vdisk, &str)>,
    to: &Target,
    progress: &Progress,
) -> Result<SendReport> {
    let snapshot = to.snapshot;
    if streams == 0 || streams > wire::MAX_STREAMS {
        return Err(ReplError::Invalid(format!(
            "{streams} streams: 1 to {} are possible",
            wire::MAX_STREAMS
        )));
    }
    if !newer.is_snapshot() {
        return Err(ReplError::Invalid(format!(
            "'{}' is not a snapshot: a cycle sends a point-in-time image",
            newer.name()
        )));
    }
    let mut c = Conn {
        w: BufWriter::with_capacity(1 << 20, conn),
        pace: wire::Pace::default(),
    };
    let mut report = SendReport {
        snapshot: snapshot.to_string(),
        ..Default::default()
    };
    let cycle = Cycle {
        newer,
        base,
        to,
        streams,
        progress,
    };
    match run(&mut c, &cycle, open, &mut report) {
        Ok(()) => Ok(report),
        Err(e @ (ReplError::Io(_) | ReplError::Protocol(_))) => {
            // A replica that refuses says why and closes: the write that then failed is not
            // the reason.
            let mut reason = None;
            // What is buffered goes first: a replica whose extra stream failed finds out why
            // at the next frame of this connection.
            let _ = c.w.flush();
            // Answers to offers may come first; looked for while the silence lasts (each frame
            // at the pace, so a minute and the time of one frame, at most).
            let t0 = std::time::Instant::now();
            for _ in 0..4 * WINDOW {
                if t0.elapsed() > c.pace.silence {
                    break;
                }
                match wire::read_frame_paced(c.w.get_mut(), Some(c.pace)) {
                    Ok(Some(f)) if f.kind == Kind::Error => {
                        reason = f.expect(Kind::Done).err();
                        break;
                    }
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
            Err(reason.unwrap_or(e))
        }
        Err(e) => Err(e),
    }
}

/// The connection, written through a buffer that is flushed before every read.
struct Conn<S: Read + Write> {
    w: BufWriter<S>,
    /// How fast the replica's answers must come (as fast as the replica site asks of the
    /// sender's frames): a replica sending a byte now and then would hold the cycle's job.
    pace: wire::Pace,
}

impl<S: Read + Write> Conn<S> {
    fn next(&mut self) -> Result<Frame> {
        self.w.flush()?;
        wire::read_frame_paced(self.w.get_mut(), Some(self.pace))?
            .ok_or_else(|| ReplError::Protocol("the replica closed the stream".into()))
    }
}

type Batch = Vec<(u64, Vec<u8>)>;

/// What one cycle sends, and where.
struct Cycle<'a> {
    newer: &'a Vdisk,
    base: Option<(&'a Vdisk, &'a str)>,
    to: &'a Target<'a>,
    streams: u32,
    progress: &'a Progress,
}

/// Where data frames go: the control connection and the extra streams' writers, in turn.
struct Sink {
    extra: Vec<SyncSender<Vec<u8>>>,
    next: usize,
}

impl Sink {
    fn data<W: Write>(&mut self, control: &mut W, body: &[u8]) -> Result<u64> {
        let k = self.next % (self.extra.len() + 1);
        self.next += 1;
        if k == 0 {
            return wire::write_frame(control, Kind::Data, body);
        }
        let mut frame = Vec::with_capacity(body.len() + 5);
        let n = wire::write_frame(&mut frame, Kind::Data, body)?;
        self.extra[k - 1]
            .send(frame)
            .map_err(|_| ReplError::Protocol("a data stream failed".into()))?;
        Ok(n)
    }
}

/// An extra stream's writer: frames until the sender is done, then End.
fn write_stream<X: Write>(mut x: X, frames: Receiver<Vec<u8>>) -> Result<()> {
    for f in frames {
        x.write_all(&f)?;
    }
    wire::write_frame(&mut x, Kind::End, &[])?;
    x.flush()?;
    Ok(())
}

fn run<S: Read + Write, X: Write + Send>(
    c: &mut Conn<S>,
    cy: &Cycle,
    open: &mut dyn FnMut() -> Result<X>,
    report: &mut SendReport,
) -> Result<()> {
    let newer = cy.newer;
    let Target {
        pool,
        replica,
        snapshot,
    } = *cy.to;
    let token = (cy.streams > 1).then(|| {
        let mut t = [0u8; 16];
        openssl::rand::rand_bytes(&mut t).expect("the system's random numbers");
        t.iter().map(|b| format!("{b:02x}")).collect::<String>()
    });
    c.w.write_all(MAGIC)?;
    report.wire_bytes += MAGIC.len() as u64;
    let begin = Begin {
        pool: pool.to_string(),
        vdisk: replica.to_string(),
        size: newer.size(),
        grain: newer.grain_size(),
        block_size: newer.block_size(),
        snapshot: snapshot.to_string(),
        base: cy.base.map(|(_, name)| name.to_string()),
        snapshot_id: Some(newer.id()),
        streams: cy.streams,
        token: token.clone(),
    };
    report.wire_bytes += wire::write_json(&mut c.w, Kind::Begin, &begin)?;
    let ready: Ready = c.next()?.json(Kind::Ready)?;
    if ready.complete {
        report.complete = true;
        return Ok(());
    }
    // The extra streams join now that the replica waits for them.
    let mut extra = Vec::new();
    for k in 1..cy.streams {
        let mut x = open()?;
        x.write_all(MAGIC)?;
        let join = Join {
            token: token.clone().expect("a token with several streams"),
            stream: k,
        };
        report.wire_bytes += MAGIC.len() as u64 + wire::write_json(&mut x, Kind::Join, &join)?;
        x.flush()?;
        extra.push(x);
    }
    std::thread::scope(|sc| {
        let mut sink = Sink {
            extra: Vec::new(),
            next: 0,
        };
        let mut writers = Vec::new();
        let mut started = Ok(());
        for x in extra {
            let (tx, rx) = sync_channel(4);
            match std::thread::Builder::new()
                .name("repl-stream".into())
                .spawn_scoped(sc, move || write_stream(x, rx))
            {
                Ok(w) => {
                    sink.extra.push(tx);
                    writers.push(w);
                }
                Err(e) => {
                    started = Err(ReplError::Protocol(format!("cannot start a stream's writer: {e}")));
                    break;
                }
            }
        }
        let sent = started.and_then(|()| send_data(c, cy, ready.base_ok, &mut sink, report));
        // Closing the channels ends each writer with its End.
        drop(sink);
        let mut ended = Ok(());
        for w in writers {
            let r = w
                .join()
                .unwrap_or_else(|_| Err(ReplError::Protocol("a data stream's writer failed".into())));
            ended = ended.and(r);
        }
        // A writer's own failure is the reason; the sender only saw its channel close.
        ended.and(sent)
    })?;
    report.wire_bytes += wire::write_frame(&mut c.w, Kind::Commit, &[])?;
    let done: Done = c.next()?.json(Kind::Done)?;
    if done.snapshot != snapshot {
        return Err(ReplError::Protocol(format!(
            "the replica made snapshot '{}', not '{snapshot}'",
            wire::peer_text(&done.snapshot)
        )));
    }
    Ok(())
}

/// Holes, then offers a window ahead of the answers, then the data each answer asks for.
fn send_data<S: Read + Write>(
    c: &mut Conn<S>,
    cy: &Cycle,
    base_ok: bool,
    sink: &mut Sink,
    report: &mut SendReport,
) -> Result<()> {
    let (newer, progress) = (cy.newer, cy.progress);
    let base = cy.base.filter(|_| base_ok);
    report.full = base.is_none();
    let extents = match base {
        Some((b, _)) => newer.changed_since(b)?,
        None => newer.extents(0, newer.size())?,
    };
    let total: u64 = extents.iter().filter(|e| e.mapped).map(|e| e.len).sum();
    report.changed_bytes = total;
    // Added, so that one job can follow the cycles of a group one after the other.
    progress.total_bytes.fetch_add(total, Ordering::Relaxed);
    for e in extents.iter().filter(|e| !e.mapped) {
        report.wire_bytes += wire::write_frame(&mut c.w, Kind::Hole, &wire::encode_hole(e.offset, e.len))?;
        report.holes += 1;
    }

    let grain = newer.grain_size();
    let mut outstanding: HashMap<u64, Batch> = HashMap::new();
    let mut batch: Batch = Vec::with_capacity(BATCH);
    let mut batch_no = 0u64;
    let grains = extents.iter().filter(|e| e.mapped).flat_map(|e| {
        let end = e.offset + e.len;
        (e.offset..end)
            .step_by(grain as usize)
            .map(move |o| (o, grain.min(end - o)))
    });
    for (offset, len) in grains {
        if progress.cancel.load(Ordering::Relaxed) {
            return Err(ReplError::Cancelled);
        }
        let mut data = vec![0u8; len as usize];
        newer.read(offset, &mut data)?;
        batch.push((offset, data));
        if batch_full(&batch) {
            offer(&mut c.w, batch_no, std::mem::take(&mut batch), &mut outstanding, report)?;
            batch_no += 1;
            while outstanding.len() >= WINDOW {
                answer(c, &mut outstanding, sink, progress, report)?;
            }
        }
    }
    if !batch.is_empty() {
        offer(&mut c.w, batch_no, batch, &mut outstanding, report)?;
    }
    while !outstanding.is_empty() {
        answer(c, &mut outstanding, sink, progress, report)?;
    }
    Ok(())
}

fn offer<W: Write>(
    w: &mut W,
    no: u64,
    batch: Batch,
    outstanding: &mut HashMap<u64, Batch>,
    report: &mut SendReport,
) -> Result<()> {
    let offers: Vec<Offered> = batch.iter().map(|(offset, data)| Offered::of(*offset, data)).collect();
    report.offered_grains += offers.len() as u64;
    report.wire_bytes += wire::write_frame(w, Kind::Offer, &wire::encode_offer(no, &offers))?;
    outstanding.insert(no, batch);
    Ok(())
}

/// Takes one answer and sends the blocks it asks for, neighbours in one frame.
/// The batch's bytes count as done once what it asks for is sent.
fn answer<S: Read + Write>(
    c: &mut Conn<S>,
    outstanding: &mut HashMap<u64, Batch>,
    sink: &mut Sink,
    progress: &Progress,
    report: &mut SendReport,
) -> Result<()> {
    let f = c.next()?;
    f.expect(Kind::Want)?;
    let (no, wanted) = wire::decode_want(&f.body)?;
    let batch = outstanding
        .remove(&no)
        .ok_or_else(|| ReplError::Protocol(format!("an answer to batch {no}, which is not outstanding")))?;
    for (i, bits) in wanted {
        let (offset, data) = batch
            .get(i as usize)
            .ok_or_else(|| ReplError::Protocol(format!("batch {no} has no grain {i}")))?;
        let blocks = wire::blocks_in(data.len() as u32);
        let mut run: Option<usize> = None;
        let mut any = false;
        for k in 0..=blocks {
            let want = k < blocks && wire::wanted(&bits, k);
            match (want, run) {
                (true, None) => run = Some(k),
                (false, Some(start)) => {
                    let (from, to) = (start * BLOCK as usize, (k * BLOCK as usize).min(data.len()));
                    let frame = wire::encode_data(offset + from as u64, &data[from..to]);
                    report.wire_bytes += sink.data(&mut c.w, &frame)?;
                    report.sent_bytes += (to - from) as u64;
                    any = true;
                    run = None;
                }
                _ => {}
            }
        }
        report.sent_grains += any as u64;
    }
    let bytes: usize = batch.iter().map(|(_, d)| d.len()).sum();
    progress.done_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica that answers a byte every 10 ms, each within any read timeout.
    struct Trickle(std::collections::VecDeque<u8>);

    impl Read for Trickle {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            std::thread::sleep(std::time::Duration::from_millis(10));
            match (self.0.pop_front(), b.first_mut()) {
                (Some(x), Some(to)) => {
                    *to = x;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The sender reads the replica's answers at the pace the replica site asks of it: an
    /// answer that trickles in is given up once later than the pace allows, not read on for
    /// as long as the replica likes.
    #[test]
    fn a_replica_that_trickles_its_answer_is_given_up() {
        let mut frame = Vec::new();
        wire::write_frame(&mut frame, Kind::Want, &[0u8; 1000]).unwrap();
        let mut c = Conn {
            w: BufWriter::new(Trickle(frame.into())),
            pace: wire::Pace {
                silence: std::time::Duration::from_millis(200),
                min_rate: 1 << 20,
            },
        };
        // Read whole, it would take 10 s.
        let e = match c.next() {
            Ok(f) => panic!("a {:?} frame read whole", f.kind),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("slower than the peer must send"), "{e}");
    }

    /// What the sender holds of the grains it offered and that are not answered yet, at
    /// most, for each grain size a vdisk may have: within 64 MiB (2 GiB with 4 MiB grains
    /// until 2026-12-07).
    #[test]
    fn the_offers_in_flight_hold_a_bounded_number_of_bytes_whatever_the_grain() {
        let mut grain = 4096u64;
        while grain <= tessera_volume::MAX_GRAIN {
            let mut batch: Batch = Vec::new();
            while !batch_full(&batch) {
                batch.push((0, vec![0; grain as usize]));
            }
            let held = WINDOW * batch.iter().map(|(_, d)| d.len()).sum::<usize>();
            assert!(held <= 64 << 20, "{held} bytes held with {grain} byte grains");
            assert!(batch.len() <= BATCH);
            grain *= 2;
        }
    }
}
