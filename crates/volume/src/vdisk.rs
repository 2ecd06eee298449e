//! A virtual disk: an array of grains, each either unmapped (reads as zeros) or pointing at a
//! grain slot. I/O on an exclusively owned slot goes straight to the layout with no metadata
//! write; a first write allocates, a write to a shared slot copies on write.

use crate::grain_map::GrainMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard};
use tessera_disk::{AlignedBuf, SECTOR};
use tessera_layout::ranges::{gaps, ByteRanges};
use tessera_layout::{SetRead, SlabSet};
use tessera_pool::CF_GRAINS;

use crate::change_count::ChangeCount;
use crate::commit::Op;
use crate::config::{Provisioning, VdiskConfig};
use crate::error::{Result, VolumeError};
use crate::hot_copies::fall_back;
use crate::keys::{grain_key, loc_value};
use crate::packed::{read_grains, read_grains_into};
use crate::shared::Shared;
use crate::space::{is_packed, Class, Loc};
use crate::unsynced::Unsynced;
use crate::write_clock::WriteClock;
use crate::writer::Writer;

/// Grains whose map entries one batch changes, at most (trim, delete, clone).
pub(crate) const BATCH_GRAINS: u64 = 512;

pub struct Vdisk {
    pub(crate) s: Arc<Shared>,
    pub(crate) id: u64,
    pub(crate) class: Class,
    pub(crate) cfg: RwLock<VdiskConfig>,
    pub(crate) map: RwLock<GrainMap>,
    /// Grains that point at a slot.
    pub(crate) mapped: AtomicU64,
    pub(crate) deleted: AtomicBool,
    /// Everything that changes the vdisk's data holds it shared ([`Vdisk::enter_change`]);
    /// freezing holds it exclusively, so that a frozen image is one instant of the vdisk, and
    /// so does a delete, so that no change is still under way when its grains go.
    pub(crate) gate: Arc<RwLock<()>>,
    /// A snapshot: never changes.
    read_only: bool,
    /// The slab sets written since the last flush, which that flush must vouch for.
    pub(crate) unsynced: Unsynced,
    /// When each region was last written, and whether dedup read it since.
    pub(crate) clock: WriteClock,
    /// The changes admitted through the gate: what tells dedup that nothing changed.
    pub(crate) changes: ChangeCount,
}

/// A change admitted through a vdisk's gate ([`Vdisk::enter_change`]), counted out when
/// dropped.
pub(crate) struct ChangeGuard<'a> {
    _gate: RwLockReadGuard<'a, ()>,
    counted: Option<&'a ChangeCount>,
}

impl Drop for ChangeGuard<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.counted {
            c.leave();
        }
    }
}

/// A part of a request inside one grain (its `unit` is the grain's index).
pub(crate) use tessera_disk::{unit_pieces as grain_pieces, UnitPiece as GrainPiece};

/// The whole sectors [a, b) that contain [off, off + len).
pub(crate) fn sector_envelope(off: u64, len: usize) -> (u64, u64) {
    let s = SECTOR as u64;
    (off / s * s, (off + len as u64).div_ceil(s) * s)
}

/// Keeps the first error of a request.
fn fail(result: &mut Result<()>, e: VolumeError) {
    if result.is_ok() {
        *result = Err(e);
    }
}

/// Reads part of a grain slot, widening to whole sectors when the request is not aligned.
pub(crate) fn read_loc(s: &Shared, l: Loc, off: u64, out: &mut [u8]) -> Result<()> {
    if is_packed(l) {
        let grain = s
            .space
            .class_of(l)
            .ok_or_else(|| VolumeError::Invalid(format!("grain location {l:#x} names no slab set")))?
            .grain as usize;
        let whole = read_grains(s, &[l], grain)?;
        out.copy_from_slice(&whole[off as usize..off as usize + out.len()]);
        return Ok(());
    }
    match read_plain(s, l, off, out) {
        Err(e) => fall_back(s, l, e, |alt| read_plain(s, alt, off, out)),
        ok => ok,
    }
}

/// Reads a whole grain held at `l` into `buf` around the bytes of it that are lost (zeros in
/// `buf`): lost beyond repair by its slab set, or lost with the write-back log before it was
/// destaged. Returns them as ranges of the grain; fails as `read_loc` does when anything else
/// of it does not read, or when it is stored compressed (a piece of a pack slot, lost whole).
pub(crate) fn read_grain_around_lost(s: &Shared, l: Loc, buf: &mut [u8]) -> Result<Vec<(u64, u64)>> {
    let Err(e) = read_loc(s, l, 0, buf) else {
        return Ok(Vec::new());
    };
    let Some((set, base)) = (!is_packed(l)).then(|| s.space.locate(l).ok()).flatten() else {
        return Err(e);
    };
    let len = buf.len() as u64;
    let mut lost = ByteRanges::default();
    for (a, b) in set
        .lost_within(base, base + len)
        .into_iter()
        .chain(s.cache.lost_within(set.id, base, len))
    {
        lost.insert(a - base, b - base);
    }
    if lost.is_empty() {
        return Err(e);
    }
    let lost: Vec<(u64, u64)> = lost.iter().collect();
    for (a, b) in gaps(lost.iter().copied(), 0, buf.len() as u64) {
        read_loc(s, l, a, &mut buf[a as usize..b as usize])?;
    }
    for &(a, b) in &lost {
        buf[a as usize..b as usize].fill(0);
    }
    Ok(lost)
}

fn read_plain(s: &Shared, l: Loc, off: u64, out: &mut [u8]) -> Result<()> {
    let (set, base) = s.space.locate(l)?;
    let (a, b) = sector_envelope(off, out.len());
    if a == off && b == off + out.len() as u64 {
        s.cache.read(&set, base + off, out)?;
    } else {
        let mut tmp = AlignedBuf::zeroed((b - a) as usize);
        s.cache.read(&set, base + a, &mut tmp)?;
        out.copy_from_slice(&tmp[(off - a) as usize..(off - a) as usize + out.len()]);
    }
    Ok(())
}

/// How much grain space a vdisk points at, and how much of it is shared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpaceUsage {
    pub allocated_bytes: u64,
    /// Grains no other vdisk, snapshot or copy in flight points at: what deleting this one
    /// gives back.
    pub exclusive_bytes: u64,
    pub shared_bytes: u64,
    /// Its share of the slots it points at: a slot that `n` grains point at counts `1/n` of
    /// its size. What sharing (clones, snapshots, dedup) saves is allocated - physical.
    pub physical_bytes: u64,
}

/// Which parts of a range are allocated, for GET LBA STATUS and sparse export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub mapped: bool,
}

impl std::fmt::Debug for Vdisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.cfg.read();
        f.debug_struct("Vdisk")
            .field("id", &self.id)
            .field("name", &c.name)
            .field("size", &c.size)
            .finish()
    }
}

impl Vdisk {
    pub(crate) fn new(s: Arc<Shared>, c: VdiskConfig, map: GrainMap, mapped: u64) -> Vdisk {
        Vdisk {
            s,
            id: c.id,
            class: Class {
                layout: c.layout,
                grain: c.grain_size,
            },
            map: RwLock::new(map),
            mapped: AtomicU64::new(mapped),
            deleted: AtomicBool::new(false),
            gate: Arc::new(RwLock::new(())),
            read_only: c.snapshot_of.is_some(),
            unsynced: Unsynced::default(),
            clock: WriteClock::new(c.size),
            changes: ChangeCount::new(),
            cfg: RwLock::new(c),
        }
    }

    pub fn name(&self) -> String {
        self.cfg.read().name.clone()
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn config(&self) -> VdiskConfig {
        self.cfg.read().clone()
    }

    pub fn size(&self) -> u64 {
        self.cfg.read().size
    }

    pub fn block_size(&self) -> u32 {
        self.cfg.read().block_size
    }

    /// The physical block size presented to initiators (512 or 4096).
    pub fn physical_block_size(&self) -> u32 {
        self.cfg.read().physical_block_size
    }

    pub fn grain_size(&self) -> u64 {
        self.class.grain
    }

    /// Bytes of pool grain space this vdisk points at (shared grains included).
    pub fn allocated_bytes(&self) -> u64 {
        self.mapped.load(Ordering::Relaxed) * self.class.grain
    }

    /// A snapshot: read-only, named `VDISK@SNAPSHOT`.
    pub fn is_snapshot(&self) -> bool {
        self.read_only
    }

    /// Refuses changes to a snapshot.
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.is_snapshot() {
            return Err(VolumeError::ReadOnly(self.name()));
        }
        Ok(())
    }

    /// Mapped grain space, split into what only this vdisk points at and what it shares with
    /// other vdisks, snapshots or copies in flight.
    pub fn space_usage(&self) -> SpaceUsage {
        let g = self.class.grain;
        let (mut exclusive, mut shared, mut physical) = (0u64, 0u64, 0f64);
        for e in self.map.read().iter() {
            let l = e.load(Ordering::Acquire);
            if l == 0 {
                continue;
            }
            let refs = self.s.space.refcount(l);
            if refs > 1 {
                shared += g;
            } else {
                exclusive += g;
            }
            physical += g as f64 / refs.max(1) as f64;
        }
        SpaceUsage {
            allocated_bytes: exclusive + shared,
            exclusive_bytes: exclusive,
            shared_bytes: shared,
            physical_bytes: (physical.round() as u64).min(exclusive + shared),
        }
    }

    pub(crate) fn fixed(&self) -> bool {
        self.cfg.read().provisioning == Provisioning::Fixed
    }

    pub(crate) fn entry(&self, g: u64) -> Loc {
        self.map
            .read()
            .get(g as usize)
            .map(|e| e.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    pub(crate) fn set_entry(&self, g: u64, l: Loc) {
        let old = self.map.read()[g as usize].swap(l, Ordering::AcqRel);
        match (old != 0, l != 0) {
            (false, true) => {
                self.mapped.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.mapped.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Admits a change of the vdisk's data: holds the gate shared, refuses a vdisk that was
    /// deleted (which a request may have found alive before it got here), and counts the
    /// change in (and out when the guard is dropped).
    pub(crate) fn enter_change(&self) -> Result<ChangeGuard<'_>> {
        let g = self.enter(true)?;
        self.changes.enter();
        Ok(g)
    }

    /// Admits a change that leaves every grain's data as it is (dedup's remapping, which
    /// points grains at slots holding the same bytes; a record of the vdisk's logical unit):
    /// as `enter_change`, but not counted.
    pub(crate) fn enter_unchanged(&self) -> Result<ChangeGuard<'_>> {
        self.enter(false)
    }

    fn enter(&self, counted: bool) -> Result<ChangeGuard<'_>> {
        let gate = self.gate.read();
        if self.deleted.load(Ordering::Acquire) {
            return Err(VolumeError::Deleted(self.name()));
        }
        Ok(ChangeGuard {
            _gate: gate,
            counted: counted.then_some(&self.changes),
        })
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        if self.deleted.load(Ordering::Acquire) {
            return Err(VolumeError::Deleted(self.name()));
        }
        let (bs, size) = {
            let c = self.cfg.read();
            (c.block_size as u64, c.size)
        };
        if len == 0 {
            return Err(VolumeError::Invalid(format!(
                "{}: zero-length request at byte {offset}",
                self.name()
            )));
        }
        if offset % bs != 0 || len % bs != 0 {
            return Err(VolumeError::Invalid(format!(
                "{}: request of {len} bytes at byte {offset} is not aligned to the {bs} byte block size",
                self.name()
            )));
        }
        if offset.checked_add(len).map(|e| e > size).unwrap_or(true) {
            return Err(VolumeError::Invalid(format!(
                "{}: request of {len} bytes at byte {offset} goes beyond the end of the disk ({size} bytes)",
                self.name()
            )));
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at byte `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        // Through the batch path, so that the disk reads of a request spanning several grains
        // are in flight together (and merged by the block layer where they are adjacent).
        self.read_many(&mut [(offset, buf)])
            .pop()
            .expect("one result per request")
    }

    /// Reads every `(offset, buf)` as [`read`](Self::read) would, with one result per
    /// request. The grains' locks are taken together and the disk reads go down as one batch
    /// ([`Layouts::read_many`](tessera_layout::Layouts::read_many)), so a queue of small
    /// reads costs one submission rather than one per read.
    pub fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = reqs
            .iter()
            .map(|(offset, buf)| self.check_range(*offset, buf.len() as u64))
            .collect();
        let grain = self.class.grain;
        let grains: Vec<(u64, u64)> = reqs
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .flat_map(|((offset, buf), _)| grain_pieces(grain, *offset, buf.len() as u64))
            .map(|p| (self.id, p.unit))
            .collect();
        let _locks = self.s.locks.read_many(grains);
        // Each mapped, whole-sector piece of each request, where it lies.
        let mut planned: Vec<(usize, Arc<SlabSet>, u64, &mut [u8], Loc, u64)> = Vec::new();
        // Pieces of compressed grains: read and decompressed whole.
        let mut packed: Vec<(usize, Loc, usize, &mut [u8])> = Vec::new();
        for (i, (offset, buf)) in reqs.iter_mut().enumerate() {
            if results[i].is_err() {
                continue;
            }
            let mut rest: &mut [u8] = buf;
            for p in grain_pieces(grain, *offset, rest.len() as u64) {
                let (out, tail) = std::mem::take(&mut rest).split_at_mut(p.len);
                rest = tail;
                let l = self.entry(p.unit);
                if l == 0 {
                    out.fill(0);
                    continue;
                }
                if is_packed(l) {
                    packed.push((i, l, p.off as usize, out));
                    continue;
                }
                let (a, b) = sector_envelope(p.off, out.len());
                let located = if a == p.off && b == p.off + out.len() as u64 {
                    self.s.space.locate(l)
                } else {
                    // Part of a sector (512-byte blocks): read on its own, widened.
                    if let Err(e) = read_loc(&self.s, l, p.off, out) {
                        fail(&mut results[i], e);
                    }
                    continue;
                };
                match located {
                    Ok((set, base)) => planned.push((i, set, base + p.off, out, l, p.off)),
                    Err(e) => fail(&mut results[i], e),
                }
            }
        }
        let mut io: Vec<SetRead> = planned
            .iter_mut()
            .map(|(_, set, offset, buf, ..)| SetRead {
                set: &**set,
                offset: *offset,
                buf: &mut **buf,
            })
            .collect();
        let done = self.s.cache.read_many(&mut io);
        for ((i, _, _, out, l, off), res) in planned.iter_mut().zip(done) {
            if let Err(e) = res {
                // A hot slot's second copy, if it has one.
                let s = &self.s;
                if let Err(e) = fall_back(s, *l, e.into(), |alt| read_plain(s, alt, *off, out)) {
                    fail(&mut results[*i], e);
                }
            }
        }
        if !packed.is_empty() {
            self.read_packed(&mut packed, &mut results);
        }
        results
    }

    /// Reads the pieces of compressed grains of a `read_many`, together; a grain that cannot
    /// be read fails only the requests that want it.
    fn read_packed(&self, packed: &mut [(usize, Loc, usize, &mut [u8])], results: &mut [Result<()>]) {
        let g = self.class.grain as usize;
        let locs: Vec<Loc> = packed.iter().map(|(_, l, ..)| *l).collect();
        // A grain read whole is decompressed straight into the request's buffer; a part of
        // one, into a grain of its own first.
        let is_part = |off: usize, out: &[u8]| off != 0 || out.len() != g;
        let parts = packed.iter().filter(|(_, _, off, out)| is_part(*off, out)).count();
        let mut whole = AlignedBuf::zeroed(parts * g);
        let done = {
            let mut spare = whole.chunks_mut(g);
            let mut outs: Vec<&mut [u8]> = packed
                .iter_mut()
                .map(|(_, _, off, out)| match is_part(*off, out) {
                    true => spare.next().expect("a grain for each part"),
                    false => &mut **out,
                })
                .collect();
            read_grains_into(&self.s, &locs, &mut outs)
        };
        let mut spare = whole.chunks(g);
        for ((i, _, off, out), r) in packed.iter_mut().zip(done) {
            let from = is_part(*off, out).then(|| spare.next().expect("a grain for each part"));
            match (r, from) {
                (Ok(()), Some(grain)) => out.copy_from_slice(&grain[*off..*off + out.len()]),
                (Ok(()), None) => {}
                (Err(e), _) => fail(&mut results[*i], e),
            }
        }
    }

    /// Writes `data` at byte `offset`. With `fua` the data is durable when this returns.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_writable()?;
        self.write_data(offset, data, fua)
    }

    /// A write that a snapshot being filled may take too.
    pub(crate) fn write_data(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        let _gate = self.enter_change()?;
        self.clock.touch(offset, data.len() as u64);
        let pieces: Vec<GrainPiece> = grain_pieces(self.class.grain, offset, data.len() as u64).collect();
        if !(pieces.len() > 1 && self.overwrite_in_place(&pieces, data)?) {
            self.write_allocating(&pieces, data)?;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// A write that may need new slots: its unmapped grains take neighbouring slots, taken
    /// together. When none of its grains is mapped, they are written together
    /// (`write_fresh`); otherwise grain by grain.
    fn write_allocating(&self, pieces: &[GrainPiece], data: &[u8]) -> Result<()> {
        let unmapped = pieces.iter().filter(|p| self.entry(p.unit) == 0).count();
        let mut run = self
            .s
            .space
            .allocate_run(self.class, unmapped, self.fixed())
            .unwrap_or_default();
        let fresh = pieces.len() > 1 && run.len() == pieces.len();
        let written = match fresh.then(|| self.write_fresh(pieces, data, &run)) {
            Some(Ok(true)) => {
                run.clear(); // every slot is mapped now
                Ok(())
            }
            Some(Err(e)) => Err(e),
            // Another writer mapped one of the grains first, or there was no run for all.
            _ => {
                run.reverse();
                pieces
                    .iter()
                    .map(|p| self.write_grain(p.unit, p.off, &data[p.buf_off..p.buf_off + p.len], &mut run))
                    .collect::<Result<()>>()
            }
        };
        // Slots the write did not map (another writer mapped the grain, or the write failed).
        for l in run {
            self.s.space.unallocate(l, self.fixed().then_some(self.class));
        }
        written
    }

    /// A write of several grains that only overwrites: every grain mapped, held by this vdisk
    /// alone, and written in whole sectors. It is written under all its grains' locks, grains
    /// that continue each other in a slab set as one layout write: a 256 KiB write of four
    /// neighbouring 64 KiB grains is one disk write, not four in a row. False, having written
    /// nothing, when a grain needs more (a new slot, a copy, a read-modify-write).
    fn overwrite_in_place(&self, pieces: &[GrainPiece], data: &[u8]) -> Result<bool> {
        let _locks = self.s.locks.lock_many(pieces.iter().map(|p| (self.id, p.unit)));
        let mut located = Vec::with_capacity(pieces.len());
        for p in pieces {
            let l = self.entry(p.unit);
            let (a, b) = sector_envelope(p.off, p.len);
            if l == 0 || is_packed(l) || self.s.space.refcount(l) != 1 || a != p.off || b != p.off + p.len as u64 {
                return Ok(false);
            }
            let (set, base) = self.s.space.locate(l)?;
            located.push((set, base + p.off, p.buf_off..p.buf_off + p.len));
        }
        self.write_merged(data, located)?;
        Ok(true)
    }

    /// A write of several grains none of which is mapped, with a slot taken for each
    /// (`allocate_run`: neighbours in one slab set). Their data goes to the disk as one layout
    /// write per run of neighbouring slots, and their map entries and reference counts as one
    /// commit: grain by grain, each grain waits for a group commit of its own, one after
    /// another. As for a single grain, the commit flushes the data before it writes the
    /// entries. False, having written nothing, when another writer mapped a grain first.
    fn write_fresh(&self, pieces: &[GrainPiece], data: &[u8], slots: &[Loc]) -> Result<bool> {
        let _locks = self.s.locks.lock_many(pieces.iter().map(|p| (self.id, p.unit)));
        if pieces.iter().any(|p| self.entry(p.unit) != 0) {
            return Ok(false);
        }
        let grain = self.class.grain as usize;
        // Whole grains: zeros around the data of the first and last. A write of whole grains
        // (an image import's, a sequential stream's) is its own content, with no copy.
        let whole = pieces.iter().all(|p| p.off == 0 && p.len == grain);
        let assembled;
        let content: &[u8] = if whole {
            data
        } else {
            let mut c = AlignedBuf::zeroed(grain * pieces.len());
            for (i, p) in pieces.iter().enumerate() {
                let at = i * grain + p.off as usize;
                c[at..at + p.len].copy_from_slice(&data[p.buf_off..p.buf_off + p.len]);
            }
            assembled = c;
            &assembled
        };
        let mut located = Vec::with_capacity(slots.len());
        for (i, &l) in slots.iter().enumerate() {
            let (set, base) = self.s.space.locate(l)?;
            located.push((set, base, i * grain..(i + 1) * grain));
        }
        self.write_merged(content, located)?;
        let mut ops = Vec::with_capacity(2 * pieces.len());
        for (p, &l) in pieces.iter().zip(slots) {
            ops.push(Op::Put(CF_GRAINS, grain_key(self.id, p.unit), loc_value(l)));
            ops.push(Op::count(l, 1));
        }
        self.s.committer.commit(ops)?;
        for (p, &l) in pieces.iter().zip(slots) {
            self.set_entry(p.unit, l);
        }
        Ok(true)
    }

    /// Writes each `(set, offset in the set, range of data)`, in order; pieces that continue
    /// the one before both in its slab set and in `data` go with it as one layout write.
    fn write_merged(&self, data: &[u8], pieces: Vec<(Arc<SlabSet>, u64, Range<usize>)>) -> Result<()> {
        let mut runs: Vec<(Arc<SlabSet>, u64, Range<usize>)> = Vec::with_capacity(pieces.len());
        for (set, at, bytes) in pieces {
            match runs.last_mut() {
                Some((s, start, run))
                    if Arc::ptr_eq(s, &set) && *start + run.len() as u64 == at && run.end == bytes.start =>
                {
                    run.end = bytes.end
                }
                _ => runs.push((set, at, bytes)),
            }
        }
        for (set, at, bytes) in runs {
            self.write_to_set(&set, at, &data[bytes])?;
        }
        Ok(())
    }

    /// Writes `data` at `off` in grain `g`. An unmapped grain takes the last slot of `run`
    /// (taken in advance for it) if there is one.
    pub(crate) fn write_grain(&self, g: u64, off: u64, data: &[u8], run: &mut Vec<Loc>) -> Result<()> {
        let _l = self.s.locks.write(self.id, g);
        let old = self.entry(g);
        // A pack slot is never overwritten, whatever its count: it holds other grains too.
        if old != 0 && !is_packed(old) && self.s.space.refcount(old) == 1 {
            return self.write_in_place(old, off, data);
        }
        // A new slot, filled with the old grain (shared or compressed) or zeros (unmapped),
        // then the new data.
        let grain = self.class.grain as usize;
        let mut buf = AlignedBuf::zeroed(grain);
        // Not for a write of the whole grain: nothing of the old one is kept (and an old one
        // that cannot be read, lost in the write-back log, is replaced rather than in the way).
        // Bytes of the old one that are lost (beyond repair, or with the write-back log) stay
        // lost in the new one, less what the write replaces: the rest of the grain can still
        // be written.
        let mut lost = ByteRanges::default();
        if old != 0 && data.len() < grain {
            for (a, b) in read_grain_around_lost(&self.s, old, &mut buf)? {
                lost.insert(a, b);
            }
        }
        buf[off as usize..off as usize + data.len()].copy_from_slice(data);
        lost.cut(off, off + data.len() as u64);
        let taken = if old == 0 { run.pop() } else { None };
        self.replace_slot(g, old, &buf, taken, &lost.iter().collect::<Vec<_>>())
    }

    fn write_in_place(&self, l: Loc, off: u64, data: &[u8]) -> Result<()> {
        let (set, base) = self.s.space.locate(l)?;
        let (a, b) = sector_envelope(off, data.len());
        if a == off && b == off + data.len() as u64 {
            self.write_to_set(&set, base + off, data)?;
        } else {
            // Sub-sector write (512-byte blocks): read-modify-write under the grain lock.
            let mut tmp = AlignedBuf::zeroed((b - a) as usize);
            self.s.cache.read(&set, base + a, &mut tmp)?;
            tmp[(off - a) as usize..(off - a) as usize + data.len()].copy_from_slice(data);
            self.write_to_set(&set, base + a, &tmp)?;
        }
        Ok(())
    }

    /// Points grain `g` (currently at `old`, 0 if unmapped) at a new slot holding `content`:
    /// `taken` if the caller allocated one, accounted as `allocate` would have. `lost`: ranges
    /// of the grain lost beyond repair, which are recorded lost in the new slot (first) and
    /// not written. The caller holds the grain lock.
    pub(crate) fn replace_slot(
        &self,
        g: u64,
        old: Loc,
        content: &[u8],
        taken: Option<Loc>,
        lost: &[(u64, u64)],
    ) -> Result<()> {
        let from_reservation = old == 0 && self.fixed();
        let new = match taken {
            Some(l) => l,
            None => self.s.space.allocate(self.class, from_reservation)?,
        };
        let undo = |e: VolumeError| {
            self.s.space.unallocate(new, from_reservation.then_some(self.class));
            e
        };
        let (set, base) = self.s.space.locate(new).map_err(undo)?;
        if lost.is_empty() {
            self.write_to_set(&set, base, content).map_err(undo)?;
        } else {
            let at: Vec<(u64, u64)> = lost.iter().map(|&(a, b)| (base + a, base + b)).collect();
            self.s.layouts.mark_lost(&set, &at, true).map_err(|e| undo(e.into()))?;
            let written = gaps(lost.iter().copied(), 0, content.len() as u64)
                .into_iter()
                .try_for_each(|(a, b)| self.write_to_set(&set, base + a, &content[a as usize..b as usize]));
            if let Err(e) = written {
                // The slot goes back to the free ones: not lost any more.
                if let Err(why) = self.s.layouts.mark_lost(&set, &at, false) {
                    tracing::warn!(error = %why, "a free slot stays recorded as holding lost data until it is written");
                }
                return Err(undo(e));
            }
        }
        let mut ops = vec![
            Op::Put(CF_GRAINS, grain_key(self.id, g), loc_value(new)),
            Op::count(new, 1),
        ];
        if old != 0 {
            ops.push(Op::count(old, -1));
        }
        self.s.committer.commit(ops).map_err(undo)?;
        self.set_entry(g, new);
        if old != 0 {
            self.s.space.decref(old);
        }
        Ok(())
    }

    /// Unmaps whole grains and zeroes the partial ones at the edges. Never-written and
    /// trimmed blocks read as zeros.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        self.check_range(offset, len)?;
        let _gate = self.enter_change()?;
        self.trim_gated(offset, len)
    }

    fn trim_gated(&self, offset: u64, len: u64) -> Result<()> {
        let grain = self.class.grain;
        // Unmapped a batch at a time as the range is walked: a range over a whole large
        // vdisk (a replication cycle's hole) holds hundreds of millions of grains.
        let mut whole = Vec::with_capacity(BATCH_GRAINS as usize);
        for p in grain_pieces(grain, offset, len) {
            let last_grain_end = self.size().min((p.unit + 1) * grain) - p.unit * grain;
            if p.off == 0 && (p.len as u64 == grain || p.len as u64 == last_grain_end) {
                whole.push(p.unit);
                if whole.len() == BATCH_GRAINS as usize {
                    self.unmap_grains(&whole, true)?;
                    whole.clear();
                }
            } else if self.entry(p.unit) != 0 {
                let zeros = vec![0u8; p.len];
                self.write_grain(p.unit, p.off, &zeros, &mut Vec::new())?;
            }
        }
        if !whole.is_empty() {
            self.unmap_grains(&whole, true)?;
        }
        self.s.space.reclaim_empty()?;
        Ok(())
    }

    /// Unmaps a set of grains in one durable batch. `keep_reservation`: a fixed vdisk keeps
    /// the space of the unmapped grains reserved (a trim), rather than letting it go (a delete).
    pub(crate) fn unmap_grains(&self, grains: &[u64], keep_reservation: bool) -> Result<()> {
        let _locks = self.s.locks.lock_many(grains.iter().map(|&g| (self.id, g)));
        let mut ops = Vec::new();
        let mut dropped = Vec::new();
        for &g in grains {
            let l = self.entry(g);
            if l != 0 {
                ops.push(Op::Delete(CF_GRAINS, grain_key(self.id, g)));
                ops.push(Op::count(l, -1));
                dropped.push((g, l));
            }
        }
        if dropped.is_empty() {
            return Ok(());
        }
        self.s.committer.commit(ops)?;
        for &(g, l) in &dropped {
            self.set_entry(g, 0);
            self.s.space.decref(l);
        }
        if keep_reservation && self.fixed() {
            // The space stays the vdisk's: a later write to these grains must not fail.
            if let Err(e) = self.s.space.reserve(self.class, dropped.len() as u64) {
                tracing::warn!(vdisk = %self.name(), error = %e, "cannot keep the reservation of trimmed grains");
            }
        }
        Ok(())
    }

    /// Writes zeros. With `unmap`, whole grains are unmapped instead (thin semantics of
    /// WRITE SAME with UNMAP / NBD WRITE_ZEROES without NO_HOLE); without, the range is
    /// allocated and written.
    pub fn write_zeroes(&self, offset: u64, len: u64, unmap: bool, fua: bool) -> Result<()> {
        self.check_writable()?;
        self.check_range(offset, len)?;
        let _gate = self.enter_change()?;
        if unmap {
            self.trim_gated(offset, len)?;
        } else {
            self.clock.touch(offset, len);
            let zeros = AlignedBuf::zeroed(self.class.grain as usize);
            for p in grain_pieces(self.class.grain, offset, len) {
                self.write_grain(p.unit, p.off, &zeros[..p.len], &mut Vec::new())?;
            }
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Makes every write completed so far durable; fails if some of it may be lost (a disk
    /// it went to was lost, beyond what its slab set tolerates, before it was flushed).
    pub fn flush(&self) -> Result<()> {
        self.unsynced.flush(
            Writer::current(),
            || {
                self.s.cache.flush()?;
                // A change of the metadata whose outcome is not known: what this vdisk's
                // writes relied on in memory may not be what the records say.
                self.s.pool.meta().whole()?;
                Ok(())
            },
            |set, noted| self.s.cache.lost_since(set, noted),
        )
    }

    /// Writes `data` at `offset` of `set`, through the write-back cache, and notes the set for
    /// the next flush.
    pub(crate) fn write_to_set(&self, set: &Arc<SlabSet>, offset: u64, data: &[u8]) -> Result<()> {
        // Taken before the write reaches any disk: a disk lost after this may have taken it.
        let noted = self.s.pool.losses();
        self.s.cache.write(self.id, set, offset, data)?;
        self.unsynced.note(Writer::current(), set.id, set, noted);
        Ok(())
    }

    /// Mapped and unmapped extents over a range, merged where adjacent.
    pub fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.check_range(offset, len)?;
        let mut out: Vec<Extent> = Vec::new();
        for p in grain_pieces(self.class.grain, offset, len) {
            let mapped = self.entry(p.unit) != 0;
            match out.last_mut() {
                Some(e) if e.mapped == mapped => e.len += p.len as u64,
                _ => out.push(Extent {
                    offset: offset + p.buf_off as u64,
                    len: p.len as u64,
                    mapped,
                }),
            }
        }
        Ok(out)
    }
}
