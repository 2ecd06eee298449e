//! The log on the cache disks: where a batch goes in the ring, writing it to every disk of
//! the log, reading a range back with its checksums verified, the replay after a restart, and
//! the record in the pool's metadata that says where the live part of the log starts.

use serde::{Deserialize, Serialize};
use tessera_disk::{write_many, AlignedBuf, DiskRef, WriteReq, DATA_OFFSET};
use tessera_pool::{Pool, CF_POOL};
use tracing::warn;

use crate::error::{CacheError, Result};
use crate::format::{block_crcs, entry_crc, Header, BLOCK};

const RECORD_KEY: &[u8] = b"write-cache";

/// Where the live log starts, on which disks, and in which generation. Saved whenever the
/// start moves, before the space behind it is written again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LogRecord {
    pub generation: u64,
    /// Position of the oldest batch the log still needs (or of the next one, if none).
    pub tail: u64,
    /// Its sequence number.
    pub seq: u64,
    /// Pool positions of the disks that hold the log, each a full copy.
    pub devices: Vec<u32>,
    /// Size of the ring on each disk, from `DATA_OFFSET`.
    pub area: u64,
}

/// The pool positions of the disks that hold the write-back log, as the record in `meta`
/// says, read before the pool is opened (`ImportOptions::log_disks`); none without a log.
pub fn log_disks(meta: &tessera_pool::MetaStore) -> Result<Vec<u32>> {
    match meta.get(CF_POOL, RECORD_KEY)? {
        None => Ok(Vec::new()),
        Some(v) => serde_json::from_slice::<LogRecord>(&v)
            .map(|r| r.devices)
            .map_err(|e| CacheError::Log(format!("unreadable log record: {e}"))),
    }
}

pub(crate) fn load_record(pool: &Pool) -> Result<Option<LogRecord>> {
    match pool.meta().get(CF_POOL, RECORD_KEY)? {
        None => Ok(None),
        Some(v) => {
            let rec: LogRecord =
                serde_json::from_slice(&v).map_err(|e| CacheError::Log(format!("unreadable log record: {e}")))?;
            rec.check()
                .map_err(|e| CacheError::Log(format!("the log record holds {e}: it is damaged")))?;
            Ok(Some(rec))
        }
    }
}

/// Past any sequence number a log reaches (a batch a microsecond for a hundred thousand
/// years is below 2^62), so that counting on from a record never wraps around.
const MOST_SEQ: u64 = 1 << 62;

impl LogRecord {
    /// Refuses values no log is made with: a ring not in whole blocks, a tail outside it,
    /// a sequence number near the end of its range, a disk listed twice. Replayed from
    /// such a record, the log would be read and written where it is not.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if self.area % BLOCK as u64 != 0 {
            return Err(format!("a ring of {} bytes, not whole blocks", self.area));
        }
        if self.tail > self.area || self.tail % BLOCK as u64 != 0 {
            return Err(format!("a tail at {} in a ring of {} bytes", self.tail, self.area));
        }
        if self.seq >= MOST_SEQ {
            return Err(format!("sequence number {}", self.seq));
        }
        if let Some(p) = self
            .devices
            .iter()
            .enumerate()
            .find_map(|(i, p)| self.devices[..i].contains(p).then_some(p))
        {
            return Err(format!("disk {p} twice"));
        }
        Ok(())
    }
}

pub(crate) fn save_record(pool: &Pool, rec: &LogRecord) -> Result<()> {
    save_record_with(pool, rec, tessera_pool::MetaBatch::new())
}

/// Saves the record in one commit with the changes in `b`.
pub(crate) fn save_record_with(pool: &Pool, rec: &LogRecord, mut b: tessera_pool::MetaBatch) -> Result<()> {
    b.put(CF_POOL, RECORD_KEY, serde_json::to_vec(rec).expect("serialisable"));
    pool.meta().commit(b, true)?;
    Ok(())
}

/// Where a batch of `size` bytes can go in a ring of `area` bytes whose live part runs from
/// `tail` to `head` (`empty`: nothing is live). It goes at the head if it fits before the end
/// of the ring, else at the start; the replay looks in the same two places.
pub(crate) fn place(area: u64, head: u64, tail: u64, empty: bool, size: u64) -> Option<u64> {
    if empty {
        return Some(if head + size <= area { head } else { 0 });
    }
    if tail < head {
        if head + size <= area {
            Some(head)
        } else if size <= tail {
            Some(0)
        } else {
            None
        }
    } else if head + size <= tail {
        Some(head)
    } else {
        None
    }
}

/// Writes `buf` at ring position `pos` of every disk, the copies in flight together; the
/// result per disk.
pub(crate) fn write_all(devices: &[(u32, DiskRef)], pos: u64, buf: &[u8]) -> Vec<(u32, Result<(), String>)> {
    let reqs: Vec<WriteReq> = devices
        .iter()
        .map(|(_, d)| WriteReq {
            disk: &**d,
            buf,
            offset: DATA_OFFSET + pos,
        })
        .collect();
    devices
        .iter()
        .zip(write_many(&reqs))
        .map(|((p, _), r)| (*p, r.map_err(|e| e.to_string())))
        .collect()
}

/// Reads `crcs.len()` blocks at ring position `pos`, from the first disk whose copy matches
/// its checksums.
pub(crate) fn read_verified(devices: &[(u32, DiskRef)], pos: u64, crcs: &[u32]) -> Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(crcs.len() * BLOCK);
    let mut why = Vec::new();
    for (p, d) in devices {
        match d.read_at(&mut buf, DATA_OFFSET + pos) {
            Ok(()) if block_crcs(&buf) == crcs => return Ok(buf),
            Ok(()) => why.push(format!("disk {p}: checksum mismatch")),
            Err(e) => why.push(format!("disk {p}: {e}")),
        }
    }
    Err(CacheError::Log(format!(
        "no copy of {} bytes at log position {pos} is readable ({})",
        buf.len(),
        if why.is_empty() {
            "no cache disk left".to_string()
        } else {
            why.join("; ")
        }
    )))
}

/// Reads `crcs.len()` blocks at `pos` one by one, each from the first copy that holds it
/// intact; returns the data (zeros where no copy does) and the blocks that every copy read
/// and none holds intact: rotten, so lost. A block that some copy could not read at all is
/// not known to be lost: that fails the call.
pub(crate) fn read_salvaging(devices: &[(u32, DiskRef)], pos: u64, crcs: &[u32]) -> Result<(AlignedBuf, Vec<usize>)> {
    let mut buf = AlignedBuf::zeroed(crcs.len() * BLOCK);
    let mut one = AlignedBuf::zeroed(BLOCK);
    let mut bad = Vec::new();
    'blocks: for (n, want) in crcs.iter().enumerate() {
        let at = DATA_OFFSET + pos + (n * BLOCK) as u64;
        let mut unreadable = None;
        for (p, d) in devices {
            match d.read_at(&mut one, at) {
                Ok(()) if block_crcs(&one)[..] == [*want] => {
                    buf[n * BLOCK..(n + 1) * BLOCK].copy_from_slice(&one);
                    continue 'blocks;
                }
                Ok(()) => {}
                Err(e) => unreadable = Some(format!("disk {p}: {e}")),
            }
        }
        if let Some(why) = unreadable {
            return Err(CacheError::Log(format!(
                "log block at position {} is rotten or unreadable on every copy ({why})",
                at - DATA_OFFSET
            )));
        }
        bad.push(n);
    }
    Ok((buf, bad))
}

/// A batch found by the replay: whole, or rotten.
pub(crate) struct Found {
    pub header: Header,
    pub pos: u64,
    /// Checksum of every data block, in order (none if rotten).
    pub crcs: Vec<u32>,
    /// No copy holds its data whole, and a later batch says a flush had made it durable: it
    /// was acknowledged and rotted since. What it held is lost; the batches after it are not.
    pub rotten: bool,
}

/// Why no whole batch was found where the replay looked.
struct NotFound {
    /// The disks that failed to read it, if it may be there all the same (none: it is not).
    failed: Vec<u32>,
    /// Where some copy holds the batch's own header, whole, but no copy the whole batch.
    header: Option<(u64, Header)>,
}

/// The batch at `pos` if the disks hold it whole between them (a header, and each entry whole
/// on some copy), with the expected generation and sequence; else, if it may be there all the
/// same, the disks that failed to read it (none: it is not there), and its header if some
/// copy holds that whole. It may be where every disk failed to read; or where one did and
/// another holds the batch's header (or a header that does not read whole, which may be it)
/// but not the whole batch, which is no log's end: an acknowledged batch was made whole on
/// every copy, and that copy may have lost it to rot since (a batch a crash tore on the way
/// is taken for lost too then: its writes are refused, not read as older data). A copy that
/// holds nothing of this batch there says it never was written, so never acknowledged,
/// whatever another could not read.
fn batch_at(
    devices: &[(u32, DiskRef)],
    area: u64,
    pool: [u8; 16],
    gen: u64,
    seq: u64,
    pos: u64,
) -> Result<Found, NotFound> {
    if pos + BLOCK as u64 > area {
        return Err(NotFound {
            failed: Vec::new(),
            header: None,
        });
    }
    let mut unreadable = Vec::new();
    let mut header = None;
    // Some copy holds this batch's header, and not the whole batch.
    let mut partial = false;
    // The block checksums of each copy's data, where its header is this batch's; and the
    // copies whose header does not read whole (this batch's, rotten, or never written).
    let mut datas: Vec<Vec<u32>> = Vec::new();
    let mut headless: Vec<(u32, &DiskRef)> = Vec::new();
    for (p, d) in devices {
        let mut hb = AlignedBuf::zeroed(BLOCK);
        if d.read_at(&mut hb, DATA_OFFSET + pos).is_err() {
            unreadable.push(*p);
            continue;
        }
        let Some(h) = Header::decode(&hb) else {
            // A header that does not read whole may be this batch's, rotten since.
            partial |= Header::looks_like(&hb);
            headless.push((*p, d));
            continue;
        };
        if h.pool != pool || h.generation != gen || h.seq != seq {
            continue;
        }
        partial = true;
        let end = pos + BLOCK as u64 + h.data_len as u64;
        if end > area {
            continue;
        }
        header.get_or_insert_with(|| (pos, h.clone()));
        let mut data = AlignedBuf::zeroed(h.data_len as usize);
        if !data.is_empty() && d.read_at(&mut data, DATA_OFFSET + pos + BLOCK as u64).is_err() {
            unreadable.push(*p);
            continue;
        }
        let crcs = block_crcs(&data);
        if let Some(crcs) = assemble(&h, std::slice::from_ref(&crcs)) {
            return Ok(Found {
                header: h,
                pos,
                crcs,
                rotten: false,
            });
        }
        datas.push(crcs);
    }
    // No copy holds the whole batch; each of its entries may still be whole on one copy (rot
    // on both, in different places), which the destager reads it from, entry by entry. A copy
    // whose header rotted may hold its data whole.
    if let Some((_, h)) = &header {
        for (p, d) in headless {
            let mut data = AlignedBuf::zeroed(h.data_len as usize);
            if d.read_at(&mut data, DATA_OFFSET + pos + BLOCK as u64).is_err() {
                unreadable.push(p);
                continue;
            }
            datas.push(block_crcs(&data));
        }
        if let Some(crcs) = assemble(h, &datas) {
            return Ok(Found {
                header: h.clone(),
                pos,
                crcs,
                rotten: false,
            });
        }
    }
    let maybe_there = unreadable.len() == devices.len() || partial;
    Err(NotFound {
        failed: if maybe_there { unreadable } else { Vec::new() },
        header,
    })
}

/// The checksums of a batch's blocks, each entry's from the first copy (given by the block
/// checksums of its data) that holds that entry whole; None if some entry is whole on none.
fn assemble(h: &Header, copies: &[Vec<u32>]) -> Option<Vec<u32>> {
    let mut out = Vec::with_capacity(h.data_len as usize / BLOCK);
    let mut at = 0;
    for e in &h.entries {
        let n = e.len as usize / BLOCK;
        let whole = copies
            .iter()
            .find(|c| c.len() >= at + n && entry_crc(&c[at..at + n]) == e.crc)?;
        out.extend_from_slice(&whole[at..at + n]);
        at += n;
    }
    Some(out)
}

/// The batch `seq`, at `pos` or else at the start of the ring (where a batch goes that does
/// not fit before the end).
fn next_batch(
    devices: &[(u32, DiskRef)],
    rec: &LogRecord,
    pool: [u8; 16],
    seq: u64,
    pos: u64,
) -> Result<Found, NotFound> {
    batch_at(devices, rec.area, pool, rec.generation, seq, pos).or_else(|mut here| {
        if pos == 0 {
            return Err(here);
        }
        // Unknown if either place could not be read: the next batch may be there.
        batch_at(devices, rec.area, pool, rec.generation, seq, 0).map_err(|start| {
            for p in start.failed {
                if !here.failed.contains(&p) {
                    here.failed.push(p);
                }
            }
            here.header = here.header.take().or(start.header);
            here
        })
    })
}

/// Whether a batch after `seq` (the next one at `pos`, and on) says that a flush completed
/// over `seq`: then `seq` was acknowledged, and a copy that is not whole has rotted since.
fn vouched_for(devices: &[(u32, DiskRef)], rec: &LogRecord, pool: [u8; 16], seq: u64, mut pos: u64) -> bool {
    let mut next = seq + 1;
    for _ in 0..=rec.area / BLOCK as u64 {
        match next_batch(devices, rec, pool, next, pos) {
            Ok(f) if f.header.flushed_below > seq => return true,
            Ok(f) => {
                pos = f.pos + BLOCK as u64 + f.header.data_len as u64;
                next += 1;
            }
            // A header made whole says what was flushed when it was made, torn data or not.
            Err(nf) => return nf.header.is_some_and(|(_, h)| h.flushed_below > seq),
        }
    }
    false
}

/// What the replay found.
pub(crate) struct Replayed {
    pub found: Vec<Found>,
    /// Where the next batch goes.
    pub head: u64,
    /// The replay stopped where the next batch may be all the same (`batch_at`), or the log
    /// has no disk: what the log held from there on is unknown.
    pub unreadable: bool,
    /// The disks whose reads failed where the replay stopped.
    pub failed_reads: Vec<u32>,
}

/// Follows the log from the record's tail: each batch at the end of the one before, or at
/// the start of the ring, until the first one that no disk holds whole. A batch torn by a
/// crash was never acknowledged as durable: every batch before a durable one was flushed with
/// it. But a batch whose header some copy holds whole, and that a later batch says was
/// flushed, was acknowledged: not whole now, it rotted. The log does not end there: that
/// batch is found rotten (what it held is lost), and the replay goes on past it.
pub(crate) fn replay(devices: &[(u32, DiskRef)], rec: &LogRecord, pool: [u8; 16]) -> Replayed {
    let mut found = Vec::new();
    let (mut pos, mut seq) = (rec.tail, rec.seq);
    let failed_reads = loop {
        let f = match next_batch(devices, rec, pool, seq, pos) {
            Ok(f) => f,
            Err(NotFound {
                failed,
                header: Some((at, header)),
            }) if failed.is_empty()
                && vouched_for(devices, rec, pool, seq, at + BLOCK as u64 + header.data_len as u64) =>
            {
                warn!(
                    seq,
                    position = at,
                    "a batch of the write-back log that a flush made durable is rotten on every copy: what it held is lost"
                );
                Found {
                    header,
                    pos: at,
                    crcs: Vec::new(),
                    rotten: true,
                }
            }
            Err(nf) => break nf.failed,
        };
        pos = f.pos + BLOCK as u64 + f.header.data_len as u64;
        seq += 1;
        found.push(f);
        if found.len() as u64 > rec.area / BLOCK as u64 {
            warn!("the write-back log loops on itself; its replay stops here");
            break Vec::new();
        }
    };
    Replayed {
        found,
        head: pos,
        unreadable: devices.is_empty() || !failed_reads.is_empty(),
        failed_reads,
    }
}

/// Copies the live part of the ring, `[tail, head)` (wrapping), from one disk to another.
/// Called only while batches are live: `tail == head` is then a full ring (a batch may end
/// exactly at the tail), the whole of it.
pub(crate) fn copy_live(from: &DiskRef, to: &DiskRef, area: u64, tail: u64, head: u64) -> Result<()> {
    const CHUNK: u64 = 4 << 20;
    let ranges = if tail < head {
        vec![(tail, head)]
    } else {
        vec![(tail, area), (0, head)]
    };
    let mut buf = AlignedBuf::zeroed(CHUNK as usize);
    for (a, b) in ranges {
        let mut at = a;
        while at < b {
            let n = (b - at).min(CHUNK) as usize;
            from.read_at(&mut buf[..n], DATA_OFFSET + at)
                .map_err(|e| CacheError::Log(format!("copying the log from {}: {e}", from.path())))?;
            to.write_at(&buf[..n], DATA_OFFSET + at)
                .map_err(|e| CacheError::Log(format!("copying the log to {}: {e}", to.path())))?;
            at += n as u64;
        }
    }
    to.flush()
        .map_err(|e| CacheError::Log(format!("copying the log to {}: {e}", to.path())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_batch_goes_at_the_head_or_wraps_to_the_start() {
        // Empty ring: at the head, or at the start when it does not fit before the end.
        assert_eq!(place(100, 40, 40, true, 50), Some(40));
        assert_eq!(place(100, 80, 80, true, 50), Some(0));
        // Live [20, 60): after it, or before it at the start.
        assert_eq!(place(100, 60, 20, false, 40), Some(60));
        assert_eq!(place(100, 60, 20, false, 41), None);
        assert_eq!(place(100, 90, 20, false, 20), Some(0));
        assert_eq!(place(100, 90, 20, false, 21), None);
        // Live [70, 100) and [0, 30): only between them.
        assert_eq!(place(100, 30, 70, false, 40), Some(30));
        assert_eq!(place(100, 30, 70, false, 41), None);
        // Full.
        assert_eq!(place(100, 50, 50, false, 1), None);
    }

    /// A batch rotten on every copy that a later batch says a flush made durable is rot: found
    /// rotten (what it held is lost), and the replay goes on past it. Where none says so, it
    /// may be a batch a crash tore, and the log ends there.
    #[test]
    fn a_rotten_batch_is_no_logs_end_only_when_a_later_one_vouches_for_it() {
        use crate::format::{Entry, Header};
        let pool = [9u8; 16];
        let area = 64 * 1024u64;
        let batch = |seq: u64, flushed_below: u64, fill: u8| {
            let data = vec![fill; BLOCK];
            let mut buf = vec![0u8; 2 * BLOCK];
            Header {
                pool,
                generation: 5,
                seq,
                data_len: BLOCK as u32,
                entries: vec![Entry {
                    set: 1,
                    offset: seq * BLOCK as u64,
                    len: BLOCK as u32,
                    vdisk: 1,
                    crc: entry_crc(&block_crcs(&data)),
                }],
                flushed_below,
            }
            .encode(&mut buf);
            buf[BLOCK..].copy_from_slice(&data);
            buf
        };
        let rec = LogRecord {
            generation: 5,
            tail: 0,
            seq: 10,
            devices: vec![0],
            area,
        };
        for (second_claims, rotten) in [(11, false), (12, true)] {
            let disk: DiskRef = Arc::new(tessera_disk::MemDisk::new("log", DATA_OFFSET + area));
            disk.write_at(&batch(10, 0, 1), DATA_OFFSET).unwrap();
            disk.write_at(&batch(11, 11, 2), DATA_OFFSET + 2 * BLOCK as u64)
                .unwrap();
            disk.write_at(&batch(12, second_claims, 3), DATA_OFFSET + 4 * BLOCK as u64)
                .unwrap();
            let devices = vec![(0u32, disk.clone())];
            let whole = replay(&devices, &rec, pool);
            assert_eq!(whole.found.len(), 3);
            assert!(!whole.unreadable);
            // The second batch's data rots.
            disk.write_at(&vec![0xEE; BLOCK], DATA_OFFSET + 3 * BLOCK as u64)
                .unwrap();
            let r = replay(&devices, &rec, pool);
            assert!(!r.unreadable, "claim {second_claims}");
            assert!(r.failed_reads.is_empty());
            if rotten {
                // Found rotten, and the replay goes on past it.
                let kinds: Vec<(u64, bool)> = r.found.iter().map(|f| (f.header.seq, f.rotten)).collect();
                assert_eq!(kinds, [(10, false), (11, true), (12, false)]);
                assert_eq!(r.head, 6 * BLOCK as u64);
            } else {
                // The log's end, as a batch a crash tore would be.
                assert_eq!(r.found.len(), 1, "claim {second_claims}");
                assert_eq!(r.head, 2 * BLOCK as u64);
            }
        }
    }

    /// Two copies rotten in different places hold a batch whole between them: each entry is
    /// taken from a copy that holds it whole, and a copy whose header rotted gives its data.
    #[test]
    fn a_batch_rotten_on_both_copies_in_different_places_is_whole_between_them() {
        use crate::format::{Entry, Header};
        let pool = [9u8; 16];
        let area = 64 * 1024u64;
        let (one, two) = (vec![1u8; BLOCK], vec![2u8; BLOCK]);
        let mut buf = vec![0u8; 3 * BLOCK];
        let entry = |offset: u64, data: &[u8]| Entry {
            set: 1,
            offset,
            len: BLOCK as u32,
            vdisk: 1,
            crc: entry_crc(&block_crcs(data)),
        };
        Header {
            pool,
            generation: 5,
            seq: 10,
            data_len: 2 * BLOCK as u32,
            entries: vec![entry(0, &one), entry(8192, &two)],
            flushed_below: 0,
        }
        .encode(&mut buf);
        buf[BLOCK..2 * BLOCK].copy_from_slice(&one);
        buf[2 * BLOCK..].copy_from_slice(&two);
        let rec = LogRecord {
            generation: 5,
            tail: 0,
            seq: 10,
            devices: vec![0, 1],
            area,
        };
        let rot = |d: &DiskRef, block: u64| {
            d.write_at(&vec![0xEE; BLOCK], DATA_OFFSET + block * BLOCK as u64)
                .unwrap()
        };
        for case in [
            "each copy one entry rotten",
            "one copy's header, the other's data rotten",
        ] {
            let disks: Vec<DiskRef> = (0..2)
                .map(|i| Arc::new(tessera_disk::MemDisk::new(&format!("log{i}"), DATA_OFFSET + area)) as DiskRef)
                .collect();
            for d in &disks {
                d.write_at(&buf, DATA_OFFSET).unwrap();
            }
            match case {
                "each copy one entry rotten" => {
                    rot(&disks[0], 1);
                    rot(&disks[1], 2);
                }
                _ => {
                    rot(&disks[0], 0);
                    rot(&disks[1], 2);
                }
            }
            let devices: Vec<(u32, DiskRef)> = disks.into_iter().enumerate().map(|(i, d)| (i as u32, d)).collect();
            let r = replay(&devices, &rec, pool);
            assert_eq!(r.found.len(), 1, "{case}");
            assert!(!r.found[0].rotten, "{case}");
            assert_eq!(r.found[0].crcs, block_crcs(&buf[BLOCK..]), "{case}");
            assert_eq!(r.head, 3 * BLOCK as u64, "{case}");
        }
    }

    /// A full ring (its head back at its tail) is copied whole to a disk that joins the log;
    /// a wrapped one from the tail to the end, then from the start to the head.
    #[test]
    fn the_live_ring_is_copied_whole_when_full() {
        let area = 64 * 1024u64;
        let size = DATA_OFFSET + area;
        let from: DiskRef = Arc::new(tessera_disk::MemDisk::new("from", size));
        let ring: Vec<u8> = (0..area).map(|i| (i % 251) as u8 + 1).collect();
        from.write_at(&ring, DATA_OFFSET).unwrap();
        let copied = |tail, head| {
            let to: DiskRef = Arc::new(tessera_disk::MemDisk::new("to", size));
            copy_live(&from, &to, area, tail, head).unwrap();
            let mut got = vec![0u8; area as usize];
            to.read_at(&mut got, DATA_OFFSET).unwrap();
            got
        };
        assert_eq!(copied(16384, 16384), ring, "a full ring");
        let wrapped = copied(49152, 8192);
        assert_eq!(&wrapped[49152..], &ring[49152..]);
        assert_eq!(&wrapped[..8192], &ring[..8192]);
        assert!(wrapped[8192..49152].iter().all(|&b| b == 0));
        let plain = copied(4096, 12288);
        assert_eq!(&plain[4096..12288], &ring[4096..12288]);
        assert!(plain[..4096].iter().chain(&plain[12288..]).all(|&b| b == 0));
    }
}
