//! Blocks a slab set lost beyond repair: rotten on their member and on the parity at the same
//! place, found where a parity write or a rebuild had to read them. Recorded in the set's
//! descriptor ([`SlabSetDesc::lost`], saved first), and zeros written in their place with the
//! parity in step, so that the rest of their row can still be written and rebuilt (as md
//! keeps a bad-block list per member); reads of them fail until a write replaces them.
//!
//! [`SlabSetDesc::lost`]: crate::SlabSetDesc::lost

use tessera_disk::{AlignedBuf, SECTOR};
use tessera_pool::{DiskState, SlabRef};
use tracing::error;

use crate::codec;
use crate::error::{LayoutError, Result};
use crate::geometry::{data_members, parity_members, role_of, Role};
use crate::journal::REGION_BYTES;
use crate::layouts::Layouts;
use crate::slabset::{Registry, SlabSet};
use crate::sums::BLOCK;

impl Layouts {
    /// Fails a read that reaches bytes of `set` lost beyond repair: their member holds the
    /// zeros written there with the parity in step, which are not the data that was lost.
    pub(crate) fn refuse_lost(&self, set: &SlabSet, offset: u64, len: usize) -> Result<()> {
        let Some(&(a, b)) = set.lost_within(offset, offset + len as u64).first() else {
            return Ok(());
        };
        Err(LayoutError::Io {
            set: set.id,
            detail: format!(
                "bytes {a}..{b} are lost beyond repair: rotten on their disk and on the parity when a write to their stripe row or a rebuild of it had to read them, or lost already (there, or with the write-back log) where a copy on write copied them from; they read again once written again"
            ),
        })
    }

    /// Whether the disk of every member answers a read (of its first sector, the pool's
    /// label): a read error of a disk that answers none is no sign of what its medium holds.
    pub(crate) fn disks_answer(&self, members: &[SlabRef]) -> bool {
        let mut probe = AlignedBuf::zeroed(SECTOR);
        members
            .iter()
            .all(|&m| self.member_dev(m).is_some_and(|dev| dev.read_at(&mut probe, 0).is_ok()))
    }

    /// Records `ranges` of `set` lost, or (`lost` false) no longer lost, without writing
    /// anything there, saved before it returns: for a caller that moves data lost elsewhere
    /// here (a copy on write of a grain, part of which was lost, writes the rest and leaves
    /// those ranges unwritten), or takes back such a record of a place it did not use after
    /// all.
    pub fn mark_lost(&self, set: &SlabSet, ranges: &[(u64, u64)], lost: bool) -> Result<()> {
        let members = set.members.read();
        Registry::change_lost(&self.pool, set, &members, |rec| {
            let mut changed = false;
            for &(a, b) in ranges {
                if lost {
                    rec.insert(a, b);
                    changed = true;
                } else {
                    changed |= rec.cut(a, b);
                }
            }
            changed
        })
    }

    /// Records `ranges` of `set` (logical bytes of stripe row `row`) lost, saved before the
    /// zeros in their place reach a disk.
    pub(crate) fn record_lost(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        row: u64,
        ranges: &[(u64, u64)],
    ) -> Result<()> {
        Registry::change_lost(&self.pool, set, members, |rec| {
            for &(a, b) in ranges {
                rec.insert(a, b);
            }
            true
        })?;
        let bytes: u64 = ranges.iter().map(|(a, b)| b - a).sum();
        error!(pool = %self.pool.name(), set = set.id, row, bytes, "part of a stripe row reads neither from its disk nor from parity: it is lost, recorded so (reads of it fail until it is written again), and zeros are written there with the row's parity in step");
        Ok(())
    }

    /// The content member `m` of a parity set should hold over [mo, mo + len) (one row's
    /// part), for a rebuild, where `member_content` failed with `why`: block by block, and a
    /// block that cannot be rebuilt (its row's other members do not give it back: rot on
    /// another member and on the parity at the same place) is lost. Every data column of its
    /// row that does not read there (and `m`'s own, when `m` holds data) is recorded lost,
    /// and zeros written there with the parity in step on the other members; `m` gets its
    /// part of that. Only where nothing is waiting: every other member on a healthy disk
    /// that missed nothing and answers reads, `m` resynced where it is (its copy missed
    /// writes, and is no source) or on a disk that cannot come back, and no region left for
    /// a resync. Failing instead, the rebuild would fail at every try, the member would stay
    /// stale or on its failed disk, and with it a write-back log's pieces for the row. The
    /// caller holds the row lock and the members.
    pub(crate) fn member_content_around_lost(
        &self,
        set: &SlabSet,
        members: &[SlabRef],
        m: usize,
        mo: u64,
        len: usize,
        why: LayoutError,
    ) -> Result<(Vec<u8>, Vec<(u64, u32)>)> {
        let spec = &set.spec;
        let (il, dc) = (spec.interleave, spec.data_columns() as u64);
        let row = mo / il;
        let others: Vec<SlabRef> = (0..members.len()).filter(|&i| i != m).map(|i| members[i]).collect();
        let waiting = spec.parity_columns() == 0
            || !matches!(why, LayoutError::Io { .. })
            || mo % BLOCK != 0
            || len as u64 % BLOCK != 0
            || (mo + len as u64).div_ceil(il) != row + 1
            || others
                .iter()
                .any(|s| self.member_dev(*s).is_none() || self.pool.disk_state(s.disk) != DiskState::Healthy)
            || (self.pool.disk_state(members[m].disk) != DiskState::Healthy && self.pool.may_return(members[m].disk))
            || self.journal.is_unsynced(set.id, mo / REGION_BYTES)
            || !self.disks_answer(&others);
        if waiting {
            return Err(why);
        }
        let mut out = vec![0u8; len];
        let mut kept = Vec::new();
        let _epoch = self.journal.enter();
        for (k, part) in out.chunks_mut(BLOCK as usize).enumerate() {
            let at = mo + k as u64 * BLOCK;
            match self.member_content(set, members, m, at, BLOCK as usize) {
                Ok((bytes, refused)) => {
                    part.copy_from_slice(&bytes);
                    kept.extend(refused);
                    continue;
                }
                Err(LayoutError::Io { .. }) => {}
                Err(e) => return Err(e),
            }
            let mut data = Vec::with_capacity(dc as usize);
            let mut lost = Vec::new();
            for d in 0..dc as usize {
                let dm = data_members(spec, row, d)[0];
                let mut b = AlignedBuf::zeroed(BLOCK as usize);
                if dm == m || self.member_read(members[dm], at, &mut b).is_err() {
                    b.fill(0);
                    lost.push(d);
                }
                data.push(b);
            }
            if lost.is_empty() {
                return Err(why);
            }
            let in_unit = at - row * il;
            let ranges: Vec<(u64, u64)> = lost
                .iter()
                .map(|&d| {
                    let x = (row * dc + d as u64) * il + in_unit;
                    (x, x + BLOCK)
                })
                .collect();
            self.record_lost(set, members, row, &ranges)?;
            // Covered as a write's rows are: a crash before both are on the disks leaves the
            // row to the restart's resync.
            self.journal.ensure_dirty(set.id, at / REGION_BYTES)?;
            let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            let parity = codec::encode(spec.parity_columns(), &refs)?;
            let zeros = AlignedBuf::zeroed(BLOCK as usize);
            let writes = lost
                .iter()
                .map(|&d| (data_members(spec, row, d)[0], &zeros[..]))
                .chain(parity_members(spec, row).into_iter().zip(parity.iter().map(|p| &p[..])));
            for (w, bytes) in writes.filter(|(w, _)| *w != m) {
                self.member_write(members[w], at, bytes).map_err(|_| LayoutError::Io {
                    set: set.id,
                    detail: format!(
                        "row {row}: zeros could not be written where data is lost, on disk {}",
                        members[w].disk
                    ),
                })?;
            }
            match role_of(spec, row, m) {
                Role::Data(_) => part.fill(0),
                Role::Parity(i) => part.copy_from_slice(&parity[i]),
            }
        }
        Ok((out, kept))
    }
}
