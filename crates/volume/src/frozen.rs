//! Frozen images: a point-in-time view of ranges of a vdisk, held in memory by extra grain
//! references, and pasting such an image into a vdisk by sharing its grains.
//!
//! Freezing takes the source's write gate for as long as it takes to count one reference per
//! grain (microseconds per thousand grains), so the image is exactly the data of the moment:
//! a write that completed before is in it, a later one copies its grain on write and is not.
//! The references are never written to the metadata store; a crash drops them, which is
//! right, since nothing durable points at a frozen image. Snapshots, clones, ODX tokens and
//! clone_range are all a freeze followed by a paste.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_disk::AlignedBuf;
use tessera_pool::CF_GRAINS;

use crate::commit::Op;
use crate::error::{Result, VolumeError};
use crate::frozen_registry::Piece;
use crate::keys::{grain_key, loc_value};
use crate::shared::Shared;
use crate::space::{loc_parts, Class, Loc};
use crate::unsynced::Sets;
use crate::vdisk::{grain_pieces, Vdisk};
use crate::writer::Writer;
use tessera_layout::SlabSet;

/// Grains whose map entries one paste batch changes, at most: sharing a grain is three small
/// metadata records, so a batch can be larger than the write path's.
const PASTE_BATCH: u64 = 4096;

/// Bytes copied per read-write step when grains cannot be shared.
const COPY_CHUNK: u64 = 1 << 20;

/// How a clone_range was carried out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CloneStats {
    /// Bytes that now share the source's grains.
    pub shared_bytes: u64,
    /// Bytes copied (grain edges, or vdisks whose grains cannot be shared).
    pub copied_bytes: u64,
}

/// The references of one image; dropping it gives them back.
struct Held {
    id: u64,
    s: Arc<Shared>,
    pieces: Arc<Vec<Piece>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.s.frozen.forget(self.id);
        for p in self.pieces.iter() {
            for &l in &p.locs {
                if l != 0 {
                    self.s.space.decref(l);
                }
            }
        }
        if let Err(e) = self.s.space.reclaim_empty() {
            tracing::warn!(error = %e, "cannot give back empty slab sets");
        }
    }
}

/// A point-in-time image of ranges of one vdisk, laid end to end. Cheap to keep: it holds
/// grain references, not data. Cloning it shares the same references.
#[derive(Clone)]
pub struct Frozen {
    held: Arc<Held>,
    class: Class,
    block_size: u32,
    len: u64,
    source: String,
    /// The sets of the image's grains that held writes of the source no flush had made
    /// durable when it was frozen, with the loss count those writes noted: a vdisk the image
    /// is pasted into notes them as its own writes (`paste_into`).
    unsettled: Arc<Sets<Arc<SlabSet>>>,
}

impl std::fmt::Debug for Frozen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frozen")
            .field("source", &self.source)
            .field("len", &self.len)
            .field("ranges", &self.held.pieces.len())
            .finish()
    }
}

impl Vdisk {
    /// Freezes byte ranges `(offset, len)` of this vdisk into one image, in the order given.
    pub fn freeze(&self, ranges: &[(u64, u64)]) -> Result<Frozen> {
        for &(off, len) in ranges {
            self.check_range(off, len)?;
        }
        // No write is in flight while the references are counted.
        let gate = self.gate.write();
        let f = self.freeze_gated(ranges);
        drop(gate);
        f
    }

    /// Freezes whole vdisks at one instant: no write to any of them is in flight while their
    /// references are counted, so a write one of them acknowledged before another of them
    /// was written is in the images whenever that later write is (a database's log and
    /// data on two vdisks stay consistent). Gates are taken with a timeout and all let go
    /// on one that does not come, then taken again, so that an operation holding one gate
    /// while it waits for another cannot deadlock with this.
    pub fn freeze_together(vdisks: &[&Vdisk]) -> Result<Vec<Frozen>> {
        for v in vdisks {
            v.check_range(0, v.size())?;
        }
        let mut order: Vec<&Vdisk> = vdisks.to_vec();
        order.sort_by_key(|v| v.id);
        order.dedup_by_key(|v| v.id);
        if order.len() != vdisks.len() {
            return Err(VolumeError::Invalid("a vdisk is named twice in one group".into()));
        }
        loop {
            let mut gates = Vec::with_capacity(order.len());
            for v in &order {
                match v.gate.try_write_for(std::time::Duration::from_millis(200)) {
                    Some(g) => gates.push(g),
                    None => break,
                }
            }
            if gates.len() < order.len() {
                drop(gates);
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            }
            let frozen = vdisks.iter().map(|v| v.freeze_gated(&[(0, v.size())])).collect();
            drop(gates);
            return frozen;
        }
    }

    /// The memory [`freeze`](Self::freeze) of `ranges` would hold: one grain location per
    /// grain each range covers, mapped or not, and its piece.
    pub fn freeze_footprint(&self, ranges: &[(u64, u64)]) -> u64 {
        let g = self.class.grain;
        ranges
            .iter()
            .map(|&(off, len)| {
                let grains = off.saturating_add(len).div_ceil(g) - off / g;
                grains.saturating_mul(std::mem::size_of::<Loc>() as u64) + std::mem::size_of::<Piece>() as u64
            })
            .fold(0, u64::saturating_add)
    }

    /// [`Vdisk::freeze`] with the gate held by the caller.
    fn freeze_gated(&self, ranges: &[(u64, u64)]) -> Result<Frozen> {
        // Asked again under the gate: a delete marks the vdisk before it waits for the gate,
        // and unmaps its grains once it has had it. A freeze that found the vdisk alive,
        // then had the gate after the delete, would count references on slots the delete
        // is freeing (some freed already, their slab set perhaps given back under the image).
        if self.deleted.load(Ordering::Acquire) {
            return Err(VolumeError::Deleted(self.name()));
        }
        let g = self.class.grain;
        let mut pieces = Vec::with_capacity(ranges.len());
        let mut at = 0u64;
        // Usually none: looked up per grain only when some are.
        let candidates = self.unsynced.unsettled();
        let mut unsettled = Sets::new();
        {
            let map = self.map.read();
            for &(off, len) in ranges {
                let first_grain = off / g;
                let end_grain = (off + len).div_ceil(g);
                let locs: Vec<Loc> = (first_grain..end_grain)
                    .map(|i| map[i as usize].load(Ordering::Acquire))
                    .collect();
                for &l in &locs {
                    if l != 0 {
                        self.s.space.incref(l);
                        if !candidates.is_empty() {
                            let set = loc_parts(l).0;
                            if let Some(e) = candidates.get(&set) {
                                unsettled.entry(set).or_insert_with(|| e.clone());
                            }
                        }
                    }
                }
                pieces.push(Piece {
                    at,
                    src_off: off,
                    len,
                    first_grain,
                    locs,
                });
                at += len;
            }
        }
        let pieces = Arc::new(pieces);
        let held = Arc::new(Held {
            id: self.s.frozen.register(&pieces),
            s: self.s.clone(),
            pieces,
        });
        Ok(Frozen {
            held,
            class: self.class,
            block_size: self.block_size(),
            len: at,
            source: self.name(),
            unsettled: Arc::new(unsettled),
        })
    }

    /// Makes [dst_off, dst_off + len) of this vdisk read as [img_off, img_off + len) of the
    /// image. Whole grains are shared when the image comes from this pool, the classes match
    /// and the offsets line up within a grain; everything else is copied inside the server.
    pub fn paste(&self, dst_off: u64, img: &Frozen, img_off: u64, len: u64) -> Result<CloneStats> {
        self.check_writable()?;
        self.paste_into(dst_off, img, img_off, len)
    }

    /// `paste`, for a snapshot being filled as well.
    pub(crate) fn paste_into(&self, dst_off: u64, img: &Frozen, img_off: u64, len: u64) -> Result<CloneStats> {
        self.check_range(dst_off, len)?;
        img.check_range(img_off, len)?;
        self.clock.touch(dst_off, len);
        let same_pool = Arc::ptr_eq(&self.s, &img.held.s);
        if same_pool {
            // Data of the image not durable yet is this vdisk's from now on: its flush must
            // fail if that data is lost before it is, as the source's would (shared or
            // copied, what this vdisk reads is what those sets hold).
            let writer = Writer::current();
            for (&id, (set, noted)) in img.unsettled.iter() {
                self.unsynced.note(writer, id, set, *noted);
            }
        }
        let g = self.class.grain;
        let mut stats = CloneStats::default();
        for (p, from, n) in img.pieces_in(img_off, len) {
            let src = p.src_off + (from - p.at);
            let dst = dst_off + (from - img_off);
            let shareable = same_pool && self.class == img.class && src % g == dst % g;
            if !shareable {
                self.copy_from(img, from, dst, n)?;
                stats.copied_bytes += n;
                continue;
            }
            let head = ((g - src % g) % g).min(n);
            let body = (n - head) / g * g;
            let tail = n - head - body;
            if head > 0 {
                self.copy_from(img, from, dst, head)?;
            }
            if body > 0 {
                let first = ((src + head) / g - p.first_grain) as usize;
                let locs = &p.locs[first..first + (body / g) as usize];
                self.share_locs((dst + head) / g, locs)?;
            }
            if tail > 0 {
                self.copy_from(img, from + head + body, dst + head + body, tail)?;
            }
            stats.shared_bytes += body;
            stats.copied_bytes += head + tail;
        }
        self.s.space.reclaim_empty()?;
        Ok(stats)
    }

    fn copy_from(&self, img: &Frozen, from: u64, dst: u64, len: u64) -> Result<()> {
        let mut buf = AlignedBuf::zeroed(COPY_CHUNK.min(len) as usize);
        let mut done = 0;
        while done < len {
            let n = COPY_CHUNK.min(len - done) as usize;
            img.read(from + done, &mut buf[..n])?;
            self.write_data(dst + done, &buf[..n], false)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Points grains `first..` at `locs` (one each), in durable batches.
    fn share_locs(&self, first: u64, locs: &[Loc]) -> Result<()> {
        let _gate = self.enter_change()?;
        for (b, batch) in locs.chunks(PASTE_BATCH as usize).enumerate() {
            let base = first + b as u64 * PASTE_BATCH;
            let _locks = self
                .s
                .locks
                .lock_many((0..batch.len() as u64).map(|k| (self.id, base + k)));
            let mut ops = Vec::new();
            let mut changes = Vec::new(); // (grain, new loc, old loc)
            for (k, &new) in batch.iter().enumerate() {
                let gi = base + k as u64;
                let old = self.entry(gi);
                if new == old {
                    continue;
                }
                if new != 0 {
                    ops.push(Op::Put(CF_GRAINS, grain_key(self.id, gi), loc_value(new)));
                    ops.push(Op::count(new, 1));
                } else {
                    ops.push(Op::Delete(CF_GRAINS, grain_key(self.id, gi)));
                }
                if old != 0 {
                    ops.push(Op::count(old, -1));
                }
                changes.push((gi, new, old));
            }
            // References are counted before the batch commits, and uncounted after.
            for &(_, new, _) in &changes {
                if new != 0 {
                    self.s.space.incref(new);
                }
            }
            if let Err(e) = self.s.committer.commit(ops) {
                for &(_, new, _) in &changes {
                    if new != 0 {
                        self.s.space.decref(new);
                    }
                }
                return Err(e);
            }
            let (mut gained, mut lost) = (0u64, 0u64);
            for &(gi, new, old) in &changes {
                self.set_entry(gi, new);
                if old != 0 {
                    self.s.space.decref(old);
                }
                match (old != 0, new != 0) {
                    (false, true) => gained += 1,
                    (true, false) => lost += 1,
                    _ => {}
                }
            }
            if self.fixed() {
                // A fixed vdisk keeps space reserved for exactly its unmapped grains.
                self.s.space.unreserve(self.class, gained);
                if lost > 0 {
                    if let Err(e) = self.s.space.reserve(self.class, lost) {
                        tracing::warn!(vdisk = %self.name(), error = %e, "cannot keep the reservation of unmapped grains");
                    }
                }
            }
        }
        Ok(())
    }
}

impl Frozen {
    /// Bytes in the image.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The name of the vdisk the image was frozen from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The name of the pool the image's grains are in.
    pub fn pool(&self) -> String {
        self.held.s.pool.name()
    }

    /// Bytes of the image that point at allocated grains (the rest reads as zeros).
    pub fn mapped_bytes(&self) -> u64 {
        let g = self.class.grain;
        self.held
            .pieces
            .iter()
            .map(|p| {
                p.locs
                    .iter()
                    .enumerate()
                    .filter(|(_, &l)| l != 0)
                    .map(|(i, _)| {
                        let a = (p.first_grain + i as u64) * g;
                        let (s, e) = (a.max(p.src_off), (a + g).min(p.src_off + p.len));
                        e.saturating_sub(s)
                    })
                    .sum::<u64>()
            })
            .sum()
    }

    fn check_range(&self, off: u64, len: u64) -> Result<()> {
        if len == 0 || off.checked_add(len).map(|e| e > self.len).unwrap_or(true) {
            return Err(VolumeError::Invalid(format!(
                "{len} bytes at byte {off} of a frozen image of {} bytes",
                self.len
            )));
        }
        if off % self.block_size as u64 != 0 || len % self.block_size as u64 != 0 {
            return Err(VolumeError::Invalid(format!(
                "{len} bytes at byte {off} of a frozen image are not aligned to its {} byte blocks",
                self.block_size
            )));
        }
        Ok(())
    }

    /// The pieces overlapping [off, off + len): (piece, first image byte, bytes).
    fn pieces_in(&self, off: u64, len: u64) -> impl Iterator<Item = (&Piece, u64, u64)> {
        let end = off + len;
        self.held.pieces.iter().filter_map(move |p| {
            let (s, e) = (off.max(p.at), end.min(p.at + p.len));
            (s < e).then(|| (p, s, e - s))
        })
    }

    /// Reads image bytes at `off`.
    pub fn read(&self, off: u64, out: &mut [u8]) -> Result<()> {
        self.check_range(off, out.len() as u64)?;
        let g = self.class.grain;
        for (p, from, n) in self.pieces_in(off, out.len() as u64) {
            let src = p.src_off + (from - p.at);
            let base = (from - off) as usize;
            for gp in grain_pieces(g, src, n) {
                let l = p.locs[(gp.unit - p.first_grain) as usize];
                let o = &mut out[base + gp.buf_off..base + gp.buf_off + gp.len];
                if l == 0 {
                    o.fill(0);
                } else {
                    crate::vdisk::read_loc(&self.held.s, l, gp.off, o)?;
                }
            }
        }
        Ok(())
    }
}
