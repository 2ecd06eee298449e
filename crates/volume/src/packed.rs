//! Grains stored compressed: reading them back, and laying the compressed forms of a batch
//! of grains out in pack slots. Where a piece lies is in its location
//! ([`packed_loc`](crate::space::packed_loc)); a pack slot is written once, before the
//! batch that points grains at it commits, and never overwritten: a write to one of its
//! grains copies that grain on write, and the slot is freed when its last grain goes.

use std::sync::Arc;

use tessera_disk::AlignedBuf;
use tessera_layout::{SetRead, SlabSet};

use crate::error::{Result, VolumeError};
use crate::hot_copies::fall_back;
use crate::shared::Shared;
use crate::space::{is_packed, slot_of, Loc, PACK_UNITS};
use crate::vdisk::sector_envelope;

/// Pieces this close (in bytes of a slab set) are read in one span, the gap with them.
const SPAN_GAP: u64 = 64 << 10;
/// A span read for pieces is this long at most.
const MAX_SPAN: u64 = 1 << 20;

/// Grains larger than this are never packed: a piece's unit count must fit in a byte.
pub(crate) const MAX_PACKED_GRAIN: u64 = 128 << 10;

/// Decompresses a piece's stored form into a whole grain.
pub(crate) fn unpack(l: Loc, stored: &[u8], out: &mut [u8]) -> Result<()> {
    tessera_dedup::decompress(stored, out)
        .map_err(|e| VolumeError::Corrupt(format!("compressed grain at {l:#x} cannot be read back: {e}")))
}

/// Reads the whole grain at each location, plain or packed, into consecutive `grain`-sized
/// parts of one buffer, with every disk read in one batch, and says per location whether
/// its part is good: a location that names no slot, a read that failed or a piece that does
/// not decompress fails only the grains that wanted it. Slots and pieces that lie near each
/// other are read as one span.
pub(crate) fn read_grains_each(s: &Shared, locs: &[Loc], grain: usize) -> (AlignedBuf, Vec<Result<()>>) {
    let mut out = AlignedBuf::zeroed(locs.len() * grain);
    let results = read_grains_into(s, locs, &mut out.chunks_mut(grain).collect::<Vec<_>>());
    (out, results)
}

/// [`read_grains_each`] into the caller's buffers, one whole grain each: a read of
/// compressed grains then decompresses each straight into its place.
pub(crate) fn read_grains_into(s: &Shared, locs: &[Loc], outs: &mut [&mut [u8]]) -> Vec<Result<()>> {
    debug_assert_eq!(locs.len(), outs.len());
    let grain = outs.first().map_or(0, |o| o.len());
    let mut results: Vec<Result<()>> = Vec::with_capacity(locs.len());
    // Where each slot or piece lies, then the spans to read: those near each other in a set
    // (a batch's packs are neighbouring slots, filled in grain order; a vdisk written in order
    // has its grains in neighbouring slots) are read as one span rather than one small read
    // each. The gap between two pieces is read too when it lies in their pack slots (the same
    // slot, or two neighbouring ones), which are never overwritten in place. No other gap is:
    // a slot the caller holds no lock or reference on may be being rewritten, and a read
    // racing that write would see a block that fails its checksum, and "repair" it.
    let mut located: Vec<(Arc<SlabSet>, u64, usize, usize)> = Vec::new(); // set, offset, length, loc
    for (k, &l) in locs.iter().enumerate() {
        let found = if is_packed(l) {
            s.space.locate_piece(l)
        } else {
            s.space.locate(l).map(|(set, base)| (set, base, grain))
        };
        results.push(found.map(|(set, off, len)| located.push((set, off, len, k))));
    }
    located.sort_by_key(|(set, off, ..)| (set.id, *off));
    // Set, start, end, and the slot of its last piece (None once it holds a plain slot).
    let mut spans: Vec<(Arc<SlabSet>, u64, u64, Option<Loc>)> = Vec::new();
    let mut parts: Vec<Option<(usize, usize, usize)>> = vec![None; locs.len()];
    for (set, off, len, k) in located {
        let (a, b) = sector_envelope(off, len);
        let piece = is_packed(locs[k]).then(|| slot_of(locs[k]));
        match spans.last_mut() {
            Some((s, start, end, last))
                if s.id == set.id && b.max(*end) - *start <= MAX_SPAN && {
                    let packs_only = matches!((*last, piece), (Some(x), Some(y)) if y == x || y == x + 1);
                    a <= *end || (packs_only && a <= *end + SPAN_GAP)
                } =>
            {
                *end = b.max(*end);
                *last = last.and(piece);
            }
            _ => spans.push((set, a, b, piece)),
        }
        let i = spans.len() - 1;
        parts[k] = Some((i, (off - spans[i].1) as usize, len));
    }
    let mut stored: Vec<(Arc<SlabSet>, u64, AlignedBuf)> = spans
        .into_iter()
        .map(|(set, a, b, _)| (set, a, AlignedBuf::zeroed((b - a) as usize)))
        .collect();
    let stored_ok: Vec<bool> = {
        let mut io: Vec<SetRead> = stored
            .iter_mut()
            .map(|(set, a, buf)| SetRead {
                set,
                offset: *a,
                buf: &mut buf[..],
            })
            .collect();
        s.cache.read_many(&mut io).into_iter().map(|r| r.is_ok()).collect()
    };
    for (k, (chunk, p)) in outs.iter_mut().zip(&parts).enumerate() {
        if let Some((i, skip, len)) = *p {
            let l = locs[k];
            results[k] = match (stored_ok[i], is_packed(l)) {
                (true, true) => unpack(l, &stored[i].2[skip..skip + len], chunk),
                (true, false) => {
                    chunk.copy_from_slice(&stored[i].2[skip..skip + len]);
                    Ok(())
                }
                // A span fails as a whole when any block of it does: the grain alone may
                // read well.
                (false, true) => read_piece(s, l, chunk),
                (false, false) => read_slot(s, l).map(|b| chunk.copy_from_slice(&b)),
            };
        }
    }
    // A hot slot's second copy, for what could not be read from the first.
    for (k, chunk) in outs.iter_mut().enumerate() {
        if let Err(e) = std::mem::replace(&mut results[k], Ok(())) {
            results[k] = fall_back(s, locs[k], e, |alt| {
                let (again, r) = read_grains_each(s, &[alt], grain);
                r.into_iter().next().unwrap_or(Ok(()))?;
                chunk.copy_from_slice(&again);
                Ok(())
            });
        }
    }
    results
}

/// Reads a whole slot on its own.
pub(crate) fn read_slot(s: &Shared, l: Loc) -> Result<AlignedBuf> {
    let grain = s.space.class_of(l).map(|c| c.grain).unwrap_or(0) as usize;
    let (set, base) = s.space.locate(l)?;
    let mut buf = AlignedBuf::zeroed(grain);
    s.cache.read(&set, base, &mut buf)?;
    Ok(buf)
}

/// Reads one compressed grain on its own and decompresses it into `out`.
fn read_piece(s: &Shared, l: Loc, out: &mut [u8]) -> Result<()> {
    let (set, off, len) = s.space.locate_piece(l)?;
    let (a, b) = sector_envelope(off, len);
    let mut stored = AlignedBuf::zeroed((b - a) as usize);
    s.cache
        .read(&set, a, &mut stored)
        .map_err(|e| VolumeError::Corrupt(format!("compressed grain at {l:#x} cannot be read: {e}")))?;
    let skip = (off - a) as usize;
    unpack(l, &stored[skip..skip + len], out)
}

/// [`read_grains_each`], failing if any grain cannot be read.
pub(crate) fn read_grains(s: &Shared, locs: &[Loc], grain: usize) -> Result<AlignedBuf> {
    let (out, results) = read_grains_each(s, locs, grain);
    results.into_iter().collect::<Result<()>>()?;
    Ok(out)
}

/// Where one grain's compressed form goes: the pack (an index into the packs laid out) and
/// its first unit and number of units there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub pack: usize,
    pub first: u32,
    pub units: u32,
}

/// Packs a form may go into: the last this many opened (64 KiB of 4 KiB packs).
const PACK_WINDOW: usize = 16;

/// Lays compressed forms out end to end, in the order given, each in whole units of
/// `grain / PACK_UNITS`: a form that does not fit in what is left of a pack goes on into the
/// next, so that only the last pack has room left. For packs written to neighbouring slots
/// of one slab set (a piece's location names its first slot, the next slot follows). On the
/// OS images of `bench/dedup.sh` this stores the pieces in 0.1 % more than their size, where
/// packs that each hold whole pieces (`lay_out`) took 20 % more. Returns the packs, one after
/// the other in one buffer (the free end zeros), and where each form went.
pub(crate) fn lay_out_end_to_end(forms: &[&[u8]], grain: usize) -> (AlignedBuf, Vec<Placed>) {
    let unit = grain / PACK_UNITS as usize;
    let mut at_unit = 0usize;
    let mut placed = Vec::with_capacity(forms.len());
    for f in forms {
        let n = f.len().div_ceil(unit);
        assert!(n > 0 && n < PACK_UNITS as usize, "a form that fits in a pack");
        placed.push(Placed {
            pack: at_unit / PACK_UNITS as usize,
            first: (at_unit % PACK_UNITS as usize) as u32,
            units: n as u32,
        });
        at_unit += n;
    }
    let mut buf = AlignedBuf::zeroed((at_unit * unit).div_ceil(grain) * grain);
    for (f, p) in forms.iter().zip(&placed) {
        let at = p.pack * grain + p.first as usize * unit;
        buf[at..at + f.len()].copy_from_slice(f);
    }
    (buf, placed)
}

/// Lays compressed forms out in pack slots of `grain` bytes, each form in whole units of
/// `grain / PACK_UNITS`, in the order given, each into the first of the last `PACK_WINDOW`
/// packs with room (else a new one). Filling packs strictly in order left a quarter of each
/// empty (forms average 40 % of a grain); filling them by decreasing size scattered the grains
/// of a sequential read over the whole batch's packs. The window keeps both: packs nearly
/// full, and neighbouring grains within a few slots of each other. Returns the packs, one
/// after the other in one buffer (their free ends zeros), and where each form went.
pub(crate) fn lay_out(forms: &[&[u8]], grain: usize) -> (AlignedBuf, Vec<Placed>) {
    let unit = grain / PACK_UNITS as usize;
    let mut used: Vec<u32> = Vec::new();
    let mut placed = Vec::with_capacity(forms.len());
    for f in forms {
        let n = f.len().div_ceil(unit) as u32;
        assert!(n > 0 && n as u64 <= PACK_UNITS, "a form that fits in a pack");
        let window = used.len().saturating_sub(PACK_WINDOW);
        let pack = match (window..used.len()).find(|&p| used[p] + n <= PACK_UNITS as u32) {
            Some(p) => p,
            None => {
                used.push(0);
                used.len() - 1
            }
        };
        placed.push(Placed {
            pack,
            first: used[pack],
            units: n,
        });
        used[pack] += n;
    }
    let mut buf = AlignedBuf::zeroed(used.len() * grain);
    for (f, p) in forms.iter().zip(&placed) {
        let at = p.pack * grain + p.first as usize * unit;
        buf[at..at + f.len()].copy_from_slice(f);
    }
    (buf, placed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn forms_laid_end_to_end_follow_each_other_with_no_gap(lens in proptest::collection::vec(1usize..4000, 0..60)) {
            let forms: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n]).collect();
            let refs: Vec<&[u8]> = forms.iter().map(|f| &f[..]).collect();
            let (packs, placed) = lay_out_end_to_end(&refs, 4096);
            prop_assert_eq!(packs.len() % 4096, 0);
            let mut next = 0usize;
            for (i, p) in placed.iter().enumerate() {
                let start = p.pack * PACK_UNITS as usize + p.first as usize;
                prop_assert_eq!(start, next, "each form starts where the one before ended");
                prop_assert!((p.first as u64) < PACK_UNITS);
                next = start + p.units as usize;
                let at = p.pack * 4096 + p.first as usize * 16;
                prop_assert_eq!(&packs[at..at + forms[i].len()], &forms[i][..]);
                prop_assert!(packs[at + forms[i].len()..at + p.units as usize * 16].iter().all(|&b| b == 0));
            }
            prop_assert_eq!(packs.len() / 4096, next.div_ceil(PACK_UNITS as usize));
        }

        #[test]
        fn forms_lie_inside_their_packs_without_overlap(lens in proptest::collection::vec(1usize..4096, 0..60)) {
            let forms: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n]).collect();
            let refs: Vec<&[u8]> = forms.iter().map(|f| &f[..]).collect();
            let (packs, placed) = lay_out(&refs, 4096);
            prop_assert_eq!(packs.len() % 4096, 0);
            let mut taken = vec![vec![false; PACK_UNITS as usize]; packs.len() / 4096];
            for (i, p) in placed.iter().enumerate() {
                prop_assert!(p.first + p.units <= PACK_UNITS as u32);
                for u in p.first..p.first + p.units {
                    prop_assert!(!taken[p.pack][u as usize], "units overlap");
                    taken[p.pack][u as usize] = true;
                }
                let at = p.pack * 4096 + p.first as usize * 16;
                prop_assert_eq!(&packs[at..at + forms[i].len()], &forms[i][..]);
            }
            // Each form lies within the window of the packs open when it came, and a pack was
            // opened only when none of the window had room.
            let mut opened = 0usize;
            let mut fill = vec![0u32; packs.len() / 4096];
            for p in &placed {
                if p.pack == opened {
                    let window = opened.saturating_sub(PACK_WINDOW)..opened;
                    prop_assert!(window.clone().all(|w| fill[w] + p.units > PACK_UNITS as u32), "a pack opened needlessly");
                    opened += 1;
                } else {
                    prop_assert!(p.pack + PACK_WINDOW >= opened, "a form put far behind the packs open");
                }
                fill[p.pack] += p.units;
            }
        }
    }
}
