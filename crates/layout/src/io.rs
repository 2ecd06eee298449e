//! Reads and writes of a slab set's logical space, healthy or degraded.

use std::sync::atomic::Ordering;

use tessera_disk::SECTOR;
use tessera_pool::SlabRef;
use tracing::warn;

use crate::codec;
use crate::error::{LayoutError, Result};
use crate::gather::RowWrite;
use crate::geometry::{data_members, parity_members, read_order, role_of, split, Piece, Role};
use crate::journal::{Record, RecordBody, REGION_BYTES};
use crate::layouts::{Layouts, MemberFault, MemberWrite};
use crate::ranges::{covers, gaps};
use crate::slabset::{Registry, SlabSet};
use crate::spec::LayoutKind;
use crate::sums::{block_sum, sums_of, BLOCK};

impl Layouts {
    pub(crate) fn check(&self, set: &SlabSet, offset: u64, len: usize) -> Result<()> {
        let cap = set.spec.set_capacity(self.pool.slab_size());
        if len == 0 || offset % SECTOR as u64 != 0 || len % SECTOR != 0 || offset + len as u64 > cap {
            return Err(LayoutError::Invalid(format!(
                "slab set {}: request of {len} bytes at {offset} must be non-empty, {SECTOR}-byte aligned and within {cap} bytes",
                set.id
            )));
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` of the set's logical space. Lost or failing members
    /// are read around (other copies, or reconstruction from parity); a member that returned
    /// a read error is rewritten with the good data.
    pub fn read(&self, set: &SlabSet, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(set, offset, buf.len())?;
        self.refuse_lost(set, offset, buf.len())?;
        let members = set.members.read();
        for p in split(&set.spec, offset, buf.len()) {
            self.read_piece(set, &members, &p, &mut buf[p.buf_off..p.buf_off + p.len], false)?;
        }
        Ok(())
    }

    /// Whether what does not read of `[offset, offset + len)` of `set` is lost for good rather
    /// than waiting for a disk: every member on a healthy disk that missed no write, no
    /// rebuild under way, and no region of the range left for a resync that a restart could
    /// not finish. A block there that reads neither from its member nor from the others (rot
    /// in two members at the same place) will not read later.
    pub fn unreadable_is_final(&self, set: &SlabSet, offset: u64, len: u64) -> bool {
        self.placement(set) == crate::layouts::Placement::Whole
            && split(&set.spec, offset, len as usize).iter().all(|p| {
                !self
                    .journal
                    .is_unsynced(set.id, p.member_offset(&set.spec) / REGION_BYTES)
            })
    }

    /// `row_locked`: the caller holds the row lock exclusively (a parity write reading the
    /// old data of its row), so neither reconstruction nor spot repair takes it again.
    pub(crate) fn read_piece(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        p: &Piece,
        out: &mut [u8],
        row_locked: bool,
    ) -> Result<()> {
        let spec = &set.spec;
        let mo = p.member_offset(spec);
        let mut failed = Vec::new();
        let mut last_err = String::from("no member available");
        // Whether every copy tried was refused by the storage behind it (none read, none
        // failing of its own).
        let mut refused = None;
        for m in read_order(spec, p.row, p.data_col) {
            match self.member_read(members[m], mo, out) {
                Ok(()) => {
                    for bad in failed {
                        self.spot_repair(set, members, p.row, bad, mo, out, row_locked);
                    }
                    return Ok(());
                }
                Err(MemberFault::Unavailable) => {}
                Err(MemberFault::Io(e)) => {
                    last_err = e;
                    failed.push(m);
                    refused = Some(false);
                }
                // Nothing to repair: the storage refused, the copy is as it was.
                Err(MemberFault::Refused(e)) => {
                    last_err = e;
                    refused.get_or_insert(true);
                }
            }
        }
        if spec.parity_columns() > 0 {
            // Reconstruction reads the whole row: a parity write to another column of it must
            // not be half done meanwhile, or the result is neither old nor new data.
            let guard = (!row_locked).then(|| self.row_lock(set.id, p.row).read());
            let data = self.reconstruct_column(set, members, p.row, p.data_col, mo, out.len())?;
            // Under the row lock too: a write to the block since would change its checksum.
            if let Some(&m) = failed.first() {
                self.check_reconstruction(set, members[m], p.row, mo, &data)?;
            }
            drop(guard);
            out.copy_from_slice(&data);
            self.stats.reconstructed_reads.fetch_add(1, Ordering::Relaxed);
            for bad in failed {
                self.spot_repair(set, members, p.row, bad, mo, out, row_locked);
            }
            return Ok(());
        }
        if self.beyond_tolerance(spec, members) {
            return Err(self.too_many(set, members));
        }
        if refused == Some(true) {
            return Err(LayoutError::Refused {
                set: set.id,
                detail: last_err,
            });
        }
        Err(LayoutError::Io {
            set: set.id,
            detail: last_err,
        })
    }

    /// Rewrites a range that a member failed to read with data read from elsewhere. Under the
    /// row lock, so it cannot overwrite a newer concurrent write with older data.
    fn spot_repair(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        row: u64,
        bad: usize,
        mo: u64,
        good: &[u8],
        row_locked: bool,
    ) {
        let fresh;
        let data: &[u8] = if row_locked {
            good
        } else {
            let _g = self.row_lock(set.id, row).write();
            let Role::Data(d) = role_of(&set.spec, row, bad) else {
                return;
            };
            let p = Piece {
                row,
                data_col: d,
                in_unit: mo - row * set.spec.interleave,
                len: good.len(),
                buf_off: 0,
            };
            let mut buf = vec![0u8; good.len()];
            // Read again inside the lock, from the other members.
            if self.read_piece_no_repair(set, members, &p, bad, &mut buf).is_err() {
                return;
            }
            fresh = buf;
            &fresh
        };
        if self.member_write(members[bad], mo, data).is_ok() {
            self.stats
                .repaired_blocks
                .fetch_add((data.len() / SECTOR) as u64, Ordering::Relaxed);
            self.count_for(members[bad].disk, |c| c.repaired_bytes += data.len() as u64);
            warn!(
                set = set.id,
                member = bad,
                offset = mo,
                len = data.len(),
                "rewrote a range that failed to read"
            );
        }
    }

    fn read_piece_no_repair(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        p: &Piece,
        bad: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let mo = p.member_offset(&set.spec);
        for m in data_members(&set.spec, p.row, p.data_col) {
            if m != bad && self.member_read(members[m], mo, out).is_ok() {
                return Ok(());
            }
        }
        if set.spec.parity_columns() > 0 {
            let data = self.reconstruct_column(set, members, p.row, p.data_col, mo, out.len())?;
            self.check_reconstruction(set, members[bad], p.row, mo, &data)?;
            out.copy_from_slice(&data);
            return Ok(());
        }
        Err(LayoutError::Io {
            set: set.id,
            detail: "no readable copy".into(),
        })
    }

    /// Refuses `data`, rebuilt for member `slab` at `mo`, if it does not match that member's
    /// checksums. Asked only of a member that answered (a read error, a block not matching
    /// its checksum): it took every write, so its checksums are those of what it should
    /// hold (a member away missed the checksums of the writes that went around it). A
    /// mismatch means another member fed the rebuild something wrong, rot in a block whose
    /// checksum is not known: returned, and written over the member by the spot repair, it
    /// would be wrong data vouched for by a new checksum.
    fn check_reconstruction(&self, set: &SlabSet, slab: SlabRef, row: u64, mo: u64, data: &[u8]) -> Result<()> {
        if !self.sums().enabled() || mo % BLOCK != 0 || data.len() as u64 % BLOCK != 0 {
            return Ok(());
        }
        match self.sums().verify(slab, mo, data) {
            Ok(bad) if !bad.is_empty() => Err(LayoutError::Io {
                set: set.id,
                detail: format!(
                    "cannot reconstruct row {row}: what the other members hold does not match the checksum of \
                     {} block(s) (the first at byte {} of slab {} of disk {}); a block whose checksum is not known rotted",
                    bad.len(),
                    bad[0],
                    slab.slab,
                    slab.disk
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Rebuilds data column `col` of a row over [mo, mo + len) of the members from the others.
    /// Should that fail, a block at a time: blocks that fail their checksums on several
    /// members at different offsets leave each block enough good shards.
    pub(crate) fn reconstruct_column(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        row: u64,
        col: usize,
        mo: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        self.refuse_unsynced(set, row, mo)?;
        let whole = self.reconstruct_range(set, members, row, col, mo, len);
        let by_block = self.sums().enabled() && len as u64 > BLOCK && mo % BLOCK == 0 && len as u64 % BLOCK == 0;
        match whole {
            Err(_) if by_block => {
                let mut out = Vec::with_capacity(len);
                for b in (0..len as u64).step_by(BLOCK as usize) {
                    out.extend(self.reconstruct_range(set, members, row, col, mo + b, BLOCK as usize)?);
                }
                Ok(out)
            }
            r => r,
        }
    }

    fn reconstruct_range(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        row: u64,
        col: usize,
        mo: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        let (mut data, parity) = self.read_row_shards(members, &set.spec, row, mo, len, Some(col), true);
        codec::reconstruct(&mut data, &parity).map_err(|_| {
            if self.beyond_tolerance(&set.spec, members) {
                self.too_many(set, members)
            } else {
                LayoutError::Io {
                    set: set.id,
                    detail: format!("cannot reconstruct row {row}: too many read errors"),
                }
            }
        })?;
        Ok(data.swap_remove(col).expect("reconstructed"))
    }

    /// Reads every data and parity shard of a row over [mo, mo + len); None where unreadable
    /// (or, with `verify`, not matching its checksums) or skipped.
    #[allow(clippy::too_many_arguments)]
    fn read_row_shards(
        &self,
        members: &[SlabRef],
        spec: &crate::spec::LayoutSpec,
        row: u64,
        mo: u64,
        len: usize,
        skip: Option<usize>,
        verify: bool,
    ) -> (Vec<Option<Vec<u8>>>, Vec<Option<Vec<u8>>>) {
        let read = |m: usize| {
            let mut b = tessera_disk::AlignedBuf::zeroed(len);
            let r = if verify {
                self.member_read(members[m], mo, &mut b)
            } else {
                self.member_read_raw(members[m], mo, &mut b)
            };
            r.ok().map(|_| b.to_vec())
        };
        let data = (0..spec.data_columns())
            .map(|d| {
                if Some(d) == skip {
                    None
                } else {
                    read(data_members(spec, row, d)[0])
                }
            })
            .collect();
        let parity = parity_members(spec, row).into_iter().map(read).collect();
        (data, parity)
    }

    /// Makes every row of a journal region consistent again after a crash: parity recomputed
    /// from the data, mirror copies set to the first readable copy. A row that cannot be
    /// made consistent (no readable copy, an unreadable data member) does not stop the rows
    /// after it; the error names how many failed, and the caller keeps the region marked.
    pub(crate) fn resync_region(&self, set: &SlabSet, members: &[SlabRef], region: u64) -> Result<()> {
        let spec = &set.spec;
        let il = spec.interleave;
        let end = ((region + 1) * REGION_BYTES).min(self.pool.slab_size());
        if self.unavailable(members) > 0 {
            // Nothing to make consistent from; the region waits for its members.
            if self.beyond_tolerance(spec, members) {
                return Err(self.too_many(set, members));
            }
            // Copies called equal without one that may be back later holding another version
            // of what a crash tore (a parity row waits for its members: `resync_row`).
            if spec.parity_columns() == 0 {
                self.note_missed(set, members)?;
            }
        }
        let mut failed = Vec::new();
        for row in (region * REGION_BYTES) / il..end.div_ceil(il) {
            let _g = self.row_lock(set.id, row).write();
            let r = if spec.parity_columns() > 0 {
                self.resync_row(set, members, row)
            } else {
                self.resync_mirror_row(set, members, row)
            };
            if let Err(e) = r {
                failed.push((row, e));
            }
        }
        match failed.first() {
            None => {
                // Consistent: it is not resynced again before the next open.
                let rows = region * REGION_BYTES..end;
                self.settled_by_resync
                    .lock()
                    .retain(|(slab, mo)| !(rows.contains(mo) && members.contains(slab)));
                Ok(())
            }
            Some((row, e)) => Err(LayoutError::Io {
                set: set.id,
                detail: format!(
                    "{} row(s) of region {region} could not be made consistent, the first ({row}): {e}",
                    failed.len()
                ),
            }),
        }
    }

    /// Sets every copy of a mirror row (the one copy of a simple one) to one content: block by
    /// block, the first copy whose checksum matches, else the first readable copy, whose
    /// checksum is then recorded as it is. After a crash a copy the interrupted write reached
    /// only in part, or rot, does not match; a block no copy of which matches is one the
    /// write reached on the disks but not in the checksums (both are durable only at the
    /// next checkpoint), and reads as written.
    fn resync_mirror_row(&self, set: &SlabSet, members: &[SlabRef], row: u64) -> Result<()> {
        let spec = &set.spec;
        let il = spec.interleave;
        let mo = row * il;
        for d in 0..spec.data_columns() {
            let copies = data_members(spec, row, d);
            let bufs: Vec<Option<tessera_disk::AlignedBuf>> = copies
                .iter()
                .map(|&m| {
                    let mut b = tessera_disk::AlignedBuf::zeroed(il as usize);
                    self.member_read_raw(members[m], mo, &mut b).ok().map(|_| b)
                })
                .collect();
            let Some(src) = bufs.iter().position(Option::is_some) else {
                return Err(LayoutError::Io {
                    set: set.id,
                    detail: format!("row {row}: no readable copy"),
                });
            };
            let mut chosen = bufs[src].clone().expect("readable");
            if self.sums().enabled() {
                for (i, block) in chosen.chunks_mut(BLOCK as usize).enumerate() {
                    let bmo = mo + i as u64 * BLOCK;
                    let good = copies.iter().zip(&bufs).find_map(|(&m, b)| {
                        let b = &b.as_ref()?[i * BLOCK as usize..(i + 1) * BLOCK as usize];
                        let want = self.sums().get(members[m], bmo).ok()??;
                        (block_sum(b) == want).then_some(b)
                    });
                    if let Some(g) = good {
                        block.copy_from_slice(g);
                    }
                }
            }
            for (&m, b) in copies.iter().zip(&bufs) {
                if b.as_deref() == Some(&chosen[..]) {
                    // Nothing to write: its checksums may still have to be recorded.
                    if self.sums().enabled() {
                        self.settle_sums(set, members[m], row, mo, &chosen)?;
                    }
                } else {
                    let _ = self.member_write(members[m], mo, &chosen);
                }
            }
        }
        Ok(())
    }

    /// Records the checksums of a member's row from what it holds, the first time a resync
    /// comes to it since the pool was opened; at a later try (the region could not be made
    /// consistent the first time) they are those the write path has kept since, and a block
    /// that no longer matches them is rot: the row is not settled over it (a read or a scrub
    /// rebuilds the block from its redundancy).
    fn settle_sums(&self, set: &SlabSet, slab: SlabRef, row: u64, mo: u64, bytes: &[u8]) -> Result<()> {
        if self.settled_by_resync.lock().insert((slab, mo)) {
            let _ = self.sums().record(slab, mo, &sums_of(bytes));
            return Ok(());
        }
        let bad = self.sums().verify(slab, mo, bytes)?;
        if bad.is_empty() {
            return Ok(());
        }
        self.count_against_disk(slab, bad.len() as u64);
        Err(LayoutError::Io {
            set: set.id,
            detail: format!(
                "row {row}: {} block(s) no longer match the checksums recorded when the row was first resynced",
                bad.len()
            ),
        })
    }

    /// Recomputes a row's parity from its data. The data members' checksums are recorded
    /// from what they hold, as a mirror's are when no copy matches: after a crash the data
    /// reads as before or after the interrupted write, and parity follows it.
    pub(crate) fn resync_row(&self, set: &SlabSet, members: &[SlabRef], row: u64) -> Result<()> {
        let spec = &set.spec;
        let il = spec.interleave as usize;
        let mo = row * spec.interleave;
        let (data, _) = self.read_row_shards(members, spec, row, mo, il, None, false);
        if self.sums().enabled() {
            for (d, bytes) in data.iter().enumerate() {
                if let Some(b) = bytes {
                    self.settle_sums(set, members[data_members(spec, row, d)[0]], row, mo, b)?;
                }
            }
        }
        let data: Vec<Vec<u8>> = data
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| LayoutError::Io {
                set: set.id,
                detail: format!("row {row}: a data member is unreadable"),
            })?;
        // A parity member whose disk is away is not written around: the row waits for it (the
        // region stays recorded), and is settled with it when it is back rather than leave it
        // stale. One on a failed disk, or stale already, is written around as ever.
        if members.iter().any(|s| self.pool.may_return(s.disk)) {
            return Err(LayoutError::Io {
                set: set.id,
                detail: format!("row {row}: a parity member's disk is missing"),
            });
        }
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let parity = codec::encode(spec.parity_columns(), &refs)?;
        for (i, pm) in parity_members(spec, row).into_iter().enumerate() {
            let _ = self.member_write(members[pm], row * spec.interleave, &parity[i]);
        }
        Ok(())
    }

    /// Writes `data` at `offset` of the set's logical space. Returns once every available
    /// member holds it (not necessarily durably: see `flush`).
    pub fn write(&self, set: &SlabSet, offset: u64, data: &[u8]) -> Result<()> {
        self.check(set, offset, data.len())?;
        let members = set.members.read();
        let unavailable = self.unavailable(&members);
        // A set with every member is within its tolerance: the count, already taken, spares
        // every write the second look at its members.
        if unavailable > 0 {
            if self.beyond_tolerance(&set.spec, &members) {
                return Err(self.too_many(set, &members));
            }
            // Should a missing member's disk come back, it must be known stale here.
            self.note_missed(set, &members)?;
        }
        let pieces = split(&set.spec, offset, data.len());
        let epoch = self.journal.enter();
        // Mirrors resync from any readable copy, so a degraded 3-way mirror still records its
        // regions; a degraded parity set cannot resync and journals its rows instead.
        // With checksums, a simple set records its regions too: a replay settles the checksums
        // of the blocks a crash caught between their data and their checksum.
        let resyncable = set.spec.tolerance() > 0 || self.sums().enabled();
        if resyncable && (unavailable == 0 || set.spec.kind == LayoutKind::Mirror) {
            let mut regions: Vec<u64> = pieces
                .iter()
                .map(|p| p.member_offset(&set.spec) / REGION_BYTES)
                .collect();
            regions.dedup();
            for r in regions {
                self.journal.ensure_dirty(set.id, r)?;
            }
        }
        let parity = matches!(set.spec.kind, LayoutKind::Parity | LayoutKind::DualParity);
        let rows = pieces[0].row..pieces[pieces.len() - 1].row + 1;
        let end = offset + data.len() as u64;
        let mut announced = parity.then(|| self.gather.announce(set.id, offset, end, rows, set.spec.interleave));
        let mut i = 0;
        while i < pieces.len() {
            let row = pieces[i].row;
            let mut j = i;
            while j < pieces.len() && pieces[j].row == row {
                j += 1;
            }
            match set.spec.kind {
                LayoutKind::Simple | LayoutKind::Mirror => self.write_copies(set, &members, &pieces[i..j], data)?,
                LayoutKind::Parity | LayoutKind::DualParity => {
                    // The row's pieces with their own copy of their bytes (consecutive in
                    // `data`), so that another writer of the row can write them with its own
                    // (gather.rs).
                    let first = pieces[i].buf_off;
                    let end = pieces[j - 1].buf_off + pieces[j - 1].len;
                    let mine = RowWrite {
                        pieces: pieces[i..j]
                            .iter()
                            .map(|p| Piece {
                                buf_off: p.buf_off - first,
                                ..*p
                            })
                            .collect(),
                        data: tessera_disk::AlignedBuf::from_slice(&data[first..end]),
                    };
                    let announced = announced.as_mut().expect("parity writes announce their rows");
                    self.gather.write(
                        announced,
                        row,
                        mine,
                        |ws| covers_row(&set.spec, ws),
                        |ws| self.write_parity_row(set, &members, row, ws),
                    )?
                }
            }
            i = j;
        }
        drop(announced);
        drop(epoch);
        if !set.lost_within(offset, end).is_empty() {
            // Bytes lost beyond repair written again: durable first, then no longer recorded
            // lost. A crash in between leaves them refused, never read as the zeros written
            // around them.
            self.flush_members_holding(Some((set.id, &members)))?;
            Registry::change_lost(&self.pool, set, &members, |lost| lost.cut(offset, end))?;
        }
        drop(members);
        if self.journal.wants_checkpoint() {
            self.journal.checkpoint_if_due(|| self.flush_members())?;
        }
        Ok(())
    }

    /// The pieces of one row of a mirror (or simple) set, every copy of every piece in flight
    /// together.
    fn write_copies(&self, set: &SlabSet, members: &[SlabRef], pieces: &[Piece], data: &[u8]) -> Result<()> {
        let _g = self.row_lock(set.id, pieces[0].row).read();
        let placed: Vec<(u64, &[u8])> = pieces
            .iter()
            .map(|p| (p.member_offset(&set.spec), &data[p.buf_off..p.buf_off + p.len]))
            .collect();
        // Every copy holds the same bytes: their checksums are computed once.
        let sums: Vec<Option<Vec<Option<u32>>>> = placed.iter().map(|(mo, b)| self.sums_for(*mo, b)).collect();
        let mut writes = Vec::new();
        let mut of_piece = Vec::new();
        for (i, (p, (mo, bytes))) in pieces.iter().zip(&placed).enumerate() {
            for m in data_members(&set.spec, p.row, p.data_col) {
                writes.push(MemberWrite {
                    m,
                    mo: *mo,
                    buf: bytes,
                    sums: sums[i].as_deref(),
                });
                of_piece.push(i);
            }
        }
        let took = self.write_members(set, members, &writes)?;
        for i in 0..pieces.len() {
            let copies = || {
                of_piece
                    .iter()
                    .zip(&writes)
                    .zip(&took)
                    .filter(move |((&p, _), _)| p == i)
                    .map(|((_, w), t)| (w, t))
            };
            if !copies().any(|(_, t)| t.is_ok()) {
                return Err(if self.beyond_tolerance(&set.spec, members) {
                    self.too_many(set, members)
                } else {
                    // Why each copy failed: a disk's storage that refuses writes for now
                    // (fenced off, unreachable) is not a failed disk, and says so.
                    let why: Vec<String> = copies()
                        .filter_map(|(w, t)| match t {
                            Ok(()) => None,
                            Err(MemberFault::Unavailable) => {
                                Some(format!("disk {} is not available", members[w.m].disk))
                            }
                            Err(MemberFault::Io(e) | MemberFault::Refused(e)) => Some(e.clone()),
                        })
                        .collect();
                    let detail = why.join("; ");
                    // Refused wherever it could go (a copy on a disk not available counts
                    // neither way, as for a read): nothing was written, and the host may send
                    // it again (through another gateway, or here once the pool is opened
                    // again).
                    let refused = copies().any(|(_, t)| matches!(t, Err(MemberFault::Refused(_))));
                    if refused && !copies().any(|(_, t)| matches!(t, Err(MemberFault::Io(_)))) {
                        LayoutError::Refused { set: set.id, detail }
                    } else {
                        LayoutError::Io { set: set.id, detail }
                    }
                });
            }
        }
        Ok(())
    }

    /// One parity row: the pieces of every gathered write merged (in arrival order, so a later
    /// write wins where two overlap), the new parity computed over the touched range, the
    /// change journalled if the set is degraded, then written in place. A data column whose
    /// touched range the pieces cover whole is not read: a row the writes cover whole is a
    /// full-stripe write, with no read at all.
    fn write_parity_row(&self, set: &SlabSet, members: &[SlabRef], row: u64, writes: &[RowWrite]) -> Result<()> {
        let spec = &set.spec;
        let il = spec.interleave;
        let dc = spec.data_columns();
        let _g = self.row_lock(set.id, row).write();
        let parts: Vec<(&Piece, &[u8])> = writes.iter().flat_map(|w| w.parts()).collect();
        let lo = parts.iter().map(|(p, _)| p.in_unit).min().expect("a write has pieces");
        let hi = parts.iter().map(|(p, _)| p.in_unit + p.len as u64).max().unwrap();
        let rl = (hi - lo) as usize;
        // Per data column, its new content over [lo, hi): borrowed from the write when one
        // piece covers it (a full row of a stream costs no copy), else assembled here.
        let mut borrowed: Vec<Option<&[u8]>> = Vec::with_capacity(dc);
        let mut owned: Vec<Option<tessera_disk::AlignedBuf>> = Vec::with_capacity(dc);
        // Per data column, the span its pieces touch (None: untouched).
        let mut spans: Vec<Option<(u64, u64)>> = Vec::with_capacity(dc);
        // Per data column: its pieces, and whether the old bytes of [lo, hi) must be read (the
        // pieces leave a gap in it). Those reads go to their members in flight together.
        let mut mine_of: Vec<Vec<&(&Piece, &[u8])>> = Vec::with_capacity(dc);
        let mut olds: Vec<Option<tessera_disk::AlignedBuf>> = Vec::with_capacity(dc);
        // Per data column, the parts of [lo, hi) its pieces leave uncovered.
        let mut uncovered: Vec<Vec<(u64, u64)>> = Vec::with_capacity(dc);
        for d in 0..dc {
            let mine: Vec<&(&Piece, &[u8])> = parts.iter().filter(|(p, _)| p.data_col == d).collect();
            spans.push(
                mine.iter()
                    .map(|(p, _)| (p.in_unit, p.in_unit + p.len as u64))
                    .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1))),
            );
            let whole = match mine[..] {
                [(p, bytes)] if p.in_unit == lo && p.len == rl => Some(*bytes),
                _ => None,
            };
            let left = gaps(mine.iter().map(|(p, _)| (p.in_unit, p.in_unit + p.len as u64)), lo, hi);
            olds.push((whole.is_none() && !left.is_empty()).then(|| tessera_disk::AlignedBuf::zeroed(rl)));
            uncovered.push(left);
            borrowed.push(whole);
            mine_of.push(mine);
        }
        let read_any = olds.iter().any(|o| o.is_some());
        let lost = self.read_old_columns(set, members, row, lo, &uncovered, &mut olds)?;
        if !lost.is_empty() {
            // Saved before the zeros in their place reach a disk; written with the row (the
            // parity is computed from them), so that the parity is in step with what the
            // members hold, and rebuilds what they hold.
            let ranges: Vec<(u64, u64)> = lost
                .iter()
                .map(|&(d, a, b)| {
                    let at = (row * dc as u64 + d as u64) * il;
                    (at + a, at + b)
                })
                .collect();
            self.record_lost(set, members, row, &ranges)?;
            for &(d, a, b) in &lost {
                spans[d] = Some(spans[d].map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
            }
        }
        for ((mine, old), whole) in mine_of.into_iter().zip(olds).zip(&borrowed) {
            if whole.is_some() {
                owned.push(None);
                continue;
            }
            let mut col = old.unwrap_or_else(|| tessera_disk::AlignedBuf::zeroed(rl));
            for (p, bytes) in &mine {
                let at = (p.in_unit - lo) as usize;
                col[at..at + p.len].copy_from_slice(bytes);
            }
            owned.push(Some(col));
        }
        let counter = if read_any {
            &self.stats.partial_row_writes
        } else {
            &self.stats.full_row_writes
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let cols: Vec<&[u8]> = borrowed
            .iter()
            .zip(&owned)
            .map(|(b, o)| b.unwrap_or_else(|| o.as_deref().expect("a column not borrowed is assembled")))
            .collect();
        let parity = codec::encode_aligned(spec.parity_columns(), &cols)?;
        let pms = parity_members(spec, row);
        let mo = row * il + lo;
        // A healthy set is covered by the region's Dirty record (a resync fixes the row after
        // a crash). A degraded one cannot be resynced: journal the new contents of the range.
        let degraded = self.unavailable(members) > 0;
        if !degraded && !self.journal.is_dirty(set.id, mo / REGION_BYTES) {
            // Writes that found the set degraded made no Dirty record, and its missing
            // member's disk came back since (`bring_back_disk`): the row takes every member,
            // covered as a healthy write's (an Update record here would be replayed over later
            // writes to the row, which only Dirty records cover).
            self.journal.ensure_dirty(set.id, mo / REGION_BYTES)?;
        }
        let seq = if degraded {
            let mut writes: Vec<(u16, Vec<u8>)> = (0..dc)
                .map(|d| (data_members(spec, row, d)[0] as u16, cols[d].to_vec()))
                .collect();
            writes.extend(pms.iter().zip(&parity).map(|(&m, p)| (m as u16, p.to_vec())));
            let seq = self.journal.append(&Record {
                set: set.id,
                row,
                body: RecordBody::Update { offset: mo, writes },
            })?;
            self.stats.journal_records.fetch_add(1, Ordering::Relaxed);
            Some(seq)
        } else {
            None
        };
        // Each touched column over the span its pieces touch: one member write, which holds
        // the old bytes (read above) wherever the pieces leave a gap. Columns and parity are
        // in flight together.
        let mut writes: Vec<MemberWrite> = spans
            .iter()
            .enumerate()
            .filter_map(|(d, span)| {
                let (a, b) = (*span)?;
                Some(MemberWrite {
                    m: data_members(spec, row, d)[0],
                    mo: row * il + a,
                    buf: &cols[d][(a - lo) as usize..(b - lo) as usize],
                    sums: None,
                })
            })
            .collect();
        writes.extend(pms.iter().zip(&parity).map(|(&pm, p)| MemberWrite {
            m: pm,
            mo,
            buf: &p[..],
            sums: None,
        }));
        let wrote = self.write_members(set, members, &writes);
        if let Some(seq) = seq {
            // Nothing was written if the space could not be had: the row is as it was.
            self.journal.done(seq);
        }
        wrote?;
        if self.beyond_tolerance(spec, members) {
            return Err(self.too_many(set, members));
        }
        Ok(())
    }

    /// Reads the old bytes of [lo, lo + len) of each data column of `row` that has a buffer in
    /// `olds`, from the member a read tries first, all in flight together. A column whose read
    /// fails or does not match its checksums is read again by `read_piece`, which reads around
    /// the fault (the other copy, or reconstruction from parity) and repairs it; if that fails
    /// too, only the parts `uncovered` says the new pieces leave are read, so that a block
    /// beyond repair that the write covers (a host writing over what a scan reported lost)
    /// does not keep the write from replacing it. A part that still does not read is lost
    /// already when nothing is waiting (`unreadable_is_final`): read block by block, what does
    /// not read is left zeros and returned (column, start and end in the stripe unit), to be
    /// recorded lost and written with zeros by the caller.
    /// Failing instead, the write would fail at every try, and so would every write that
    /// does not cover it whole, for as long as the set lives. Where a disk may come back and
    /// the block read from it, the write fails as before. The caller holds the row lock.
    fn read_old_columns(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        row: u64,
        lo: u64,
        uncovered: &[Vec<(u64, u64)>],
        olds: &mut [Option<tessera_disk::AlignedBuf>],
    ) -> Result<Vec<(usize, u64, u64)>> {
        let spec = &set.spec;
        let piece = |d: usize, len: usize| Piece {
            row,
            data_col: d,
            in_unit: lo,
            len,
            buf_off: 0,
        };
        let mut reqs: Vec<(usize, (SlabRef, u64, &mut [u8]))> = olds
            .iter_mut()
            .enumerate()
            .filter_map(|(d, old)| {
                let old = old.as_mut()?;
                let m = read_order(spec, row, d)[0];
                Some((d, (members[m], piece(d, old.len()).member_offset(spec), &mut old[..])))
            })
            .collect();
        let read = {
            let mut batch: Vec<(SlabRef, u64, &mut [u8])> =
                reqs.iter_mut().map(|(_, (s, mo, b))| (*s, *mo, &mut **b)).collect();
            self.member_reads_together(&mut batch)
        };
        let mut lost = Vec::new();
        let row_bytes = spec.row_bytes();
        for ((d, (_, _, buf)), read) in reqs.into_iter().zip(read) {
            if read {
                continue;
            }
            let whole = piece(d, buf.len());
            let Err(e) = self.read_piece(set, members, &whole, buf, true) else {
                continue;
            };
            let left = &uncovered[d];
            // Read whole already when nothing of it is covered.
            let mut failed = (left.as_slice() == [(lo, lo + buf.len() as u64)]).then_some(e);
            for &(a, b) in left {
                let part = |x: u64, y: u64| Piece {
                    in_unit: x,
                    ..piece(d, (y - x) as usize)
                };
                let at = |x: u64, y: u64| (x - lo) as usize..(y - lo) as usize;
                let e = match failed.take() {
                    Some(e) => e,
                    None => match self.read_piece(set, members, &part(a, b), &mut buf[at(a, b)], true) {
                        Ok(()) => continue,
                        Err(e) => e,
                    },
                };
                if !matches!(e, LayoutError::Io { .. }) || !self.unreadable_is_final(set, row * row_bytes, row_bytes) {
                    return Err(e);
                }
                let mut unread = None;
                for blk in (a / BLOCK * BLOCK..b).step_by(BLOCK as usize) {
                    let (x, y) = (blk.max(a), (blk + BLOCK).min(b));
                    match self.read_piece(set, members, &part(x, y), &mut buf[at(x, y)], true) {
                        Ok(()) => {}
                        Err(e @ LayoutError::Io { .. }) => {
                            buf[at(x, y)].fill(0);
                            lost.push((d, x, y));
                            unread.get_or_insert(e);
                        }
                        Err(e) => return Err(e),
                    }
                }
                // A member's disk taken out by these reads' errors, or that answers no read
                // at all (pulled, its link down: read errors do not take a disk out), makes
                // what they could not read unreadable for now only.
                if let Some(e) = unread {
                    if !self.unreadable_is_final(set, row * row_bytes, row_bytes) || !self.disks_answer(members) {
                        return Err(e);
                    }
                }
            }
        }
        Ok(lost)
    }

    /// Fails if `mo` lies in a region the restart could not resync: parity there may belong
    /// to a write the crash cut short, so what it would rebuild could be neither the old data
    /// nor the new. An error, never wrong data.
    fn refuse_unsynced(&self, set: &SlabSet, row: u64, mo: u64) -> Result<()> {
        let region = mo / REGION_BYTES;
        if !self.journal.is_unsynced(set.id, region) {
            return Ok(());
        }
        Err(LayoutError::Io {
            set: set.id,
            detail: format!(
                "row {row} lies in region {region}, which was being written when the pool stopped and could not be made consistent at the restart (a member missing or unreadable): its data cannot be rebuilt from parity until that member is readable again"
            ),
        })
    }

    /// The content member `m` should hold over [mo, mo + len), computed from the others
    /// (for a rebuild), with the checksums to record for blocks copied as they are although
    /// they do not match theirs (`copy_around_refused`). The caller holds the row lock.
    pub(crate) fn member_content(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        m: usize,
        mo: u64,
        len: usize,
    ) -> Result<(Vec<u8>, Vec<(u64, u32)>)> {
        let spec = &set.spec;
        let row = mo / spec.interleave;
        let mut buf = vec![0u8; len];
        if self.member_read(members[m], mo, &mut buf).is_ok() {
            return Ok((buf, Vec::new()));
        }
        match role_of(spec, row, m) {
            Role::Data(d) => {
                if spec.kind == LayoutKind::Mirror {
                    let others: Vec<SlabRef> = data_members(spec, row, d)
                        .into_iter()
                        .filter(|&o| o != m)
                        .map(|o| members[o])
                        .collect();
                    for &other in &others {
                        if self.member_read(other, mo, &mut buf).is_ok() {
                            return Ok((buf, Vec::new()));
                        }
                    }
                    // Block by block, the member itself first: one moved off a retired disk
                    // may hold right what the others do not.
                    let all: Vec<SlabRef> = std::iter::once(members[m]).chain(others).collect();
                    if let Some(kept) = self.copy_around_refused(&all, mo, &mut buf) {
                        return Ok((buf, kept));
                    }
                    return Err(LayoutError::Io {
                        set: set.id,
                        detail: "no readable copy to rebuild from".into(),
                    });
                }
                if spec.parity_columns() == 0 {
                    return Err(LayoutError::Io {
                        set: set.id,
                        detail: "a simple layout has no redundancy to rebuild from".into(),
                    });
                }
                Ok((self.reconstruct_column(set, members, row, d, mo, len)?, Vec::new()))
            }
            Role::Parity(i) => {
                let (mut data, parity) = self.read_row_shards(members, spec, row, mo, len, None, true);
                if data.iter().any(Option::is_none) {
                    // Missing data would come from the other parity, which may be torn there.
                    self.refuse_unsynced(set, row, mo)?;
                }
                codec::reconstruct(&mut data, &parity).map_err(|e| LayoutError::Io {
                    set: set.id,
                    detail: format!("row {row}: {e}"),
                })?;
                let data: Vec<Vec<u8>> = data.into_iter().map(|d| d.expect("reconstructed")).collect();
                let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                Ok((codec::encode(spec.parity_columns(), &refs)?.swap_remove(i), Vec::new()))
            }
        }
    }

    /// A mirror's copies (`copies`, in the order tried) over [mo, mo + buf.len()) block by
    /// block, where no copy reads whole:
    /// each block from a copy that matches its checksum, and a block no copy matches (one a
    /// copy taken back as its disk held it lost with the disk's cache) as a copy holds it,
    /// with the checksum it must match, returned to be recorded for the rebuilt member, so
    /// that the block stays refused there too until written again (recorded from what is
    /// copied, the checksum would vouch for what nobody wrote). None if a block cannot be
    /// read from any copy, or without checksums (nothing was refused then). Every copy was
    /// read whole before, which counted its faults against its disk: the blocks read again
    /// here count nothing, or each rotten block would count twice, and a disk reach
    /// `disk_error_limit` (and be retired) at half its errors.
    fn copy_around_refused(&self, copies: &[SlabRef], mo: u64, buf: &mut [u8]) -> Option<Vec<(u64, u32)>> {
        if !self.sums().enabled() || mo % BLOCK != 0 || buf.len() as u64 % BLOCK != 0 {
            return None;
        }
        let mut kept = Vec::new();
        for (i, block) in buf.chunks_mut(BLOCK as usize).enumerate() {
            let at = mo + i as u64 * BLOCK;
            if copies
                .iter()
                .any(|&o| self.member_read_uncounted(o, at, block) && self.verified(o, at, block))
            {
                continue;
            }
            let sum = copies.iter().find_map(|&o| {
                let want = self.sums().get(o, at).ok().flatten()?;
                self.member_read_uncounted(o, at, block).then_some(want)
            })?;
            kept.push((at, sum));
        }
        Some(kept)
    }

    /// Reads member bytes as the disk returns them, counting and logging nothing: true if
    /// the disk returned them.
    fn member_read_uncounted(&self, slab: SlabRef, mo: u64, buf: &mut [u8]) -> bool {
        self.member_dev(slab)
            .is_some_and(|dev| dev.read_at(buf, self.pool.slab_offset(slab) + mo).is_ok())
    }
}

/// True if the writes together cover every data column of their row whole.
fn covers_row(spec: &crate::spec::LayoutSpec, writes: &[&RowWrite]) -> bool {
    (0..spec.data_columns()).all(|d| {
        let spans = writes
            .iter()
            .flat_map(|w| &w.pieces)
            .filter(|p| p.data_col == d)
            .map(|p| (p.in_unit, p.in_unit + p.len as u64));
        covers(spans, 0, spec.interleave)
    })
}
