//! What changed between two snapshots of a vdisk, from their grain maps alone: the grains
//! whose entries differ. Replication sends those and nothing else.
//!
//! Why entries are enough: a grain a snapshot shares is never written in place (a write to it
//! copies on write, to a new slot), so two snapshots whose entries for a grain are equal read
//! the same data there. The converse does not hold, and need not: dedup re-pointing a grain
//! to an identical slot, or a repair moving it, makes an entry differ with the data the same,
//! and the grain is then offered again (replication offers fingerprints before data, so such
//! a grain costs a hash on the wire, not its bytes).

use std::sync::atomic::Ordering;

use crate::error::{Result, VolumeError};
use crate::vdisk::{Extent, Vdisk};

impl Vdisk {
    /// The extents of this snapshot that may read differently from `base`, an older snapshot
    /// of the same vdisk: `mapped` extents hold data to send, unmapped ones became holes
    /// (trimmed since `base`). Ranges past `base`'s end count as changed where mapped. Both
    /// must be snapshots: a live vdisk may overwrite a grain it alone holds in place, which
    /// the map does not show.
    pub fn changed_since(&self, base: &Vdisk) -> Result<Vec<Extent>> {
        for (v, what) in [(self, "the newer image"), (base, "the base")] {
            if !v.is_snapshot() {
                return Err(VolumeError::Invalid(format!(
                    "{what} '{}' is not a snapshot: only snapshots can be compared",
                    v.name()
                )));
            }
        }
        if self.class.grain != base.class.grain {
            return Err(VolumeError::Invalid(format!(
                "'{}' has {} byte grains and '{}' {}: they are not snapshots of one vdisk",
                self.name(),
                self.class.grain,
                base.name(),
                base.class.grain
            )));
        }
        let gone = |v: &Vdisk| v.deleted.load(Ordering::Acquire);
        let deleted = |v: &Vdisk| {
            VolumeError::Invalid(format!(
                "'{}' was deleted while it was being compared: what changed since it cannot be told",
                v.name()
            ))
        };
        for v in [self, base] {
            if gone(v) {
                return Err(deleted(v));
            }
        }
        let grain = self.class.grain;
        let size = self.size();
        let base_grains = base.size().div_ceil(grain);
        let mut out: Vec<Extent> = Vec::new();
        for g in 0..size.div_ceil(grain) {
            let now = self.entry(g);
            let then = if g < base_grains { base.entry(g) } else { 0 };
            // A grain past the base's end that is a hole needs nothing: it reads as zeros on
            // a replica grown to the new size.
            if now == then {
                continue;
            }
            let offset = g * grain;
            let len = grain.min(size - offset);
            let mapped = now != 0;
            match out.last_mut() {
                Some(e) if e.mapped == mapped && e.offset + e.len == offset => e.len += len,
                _ => out.push(Extent { offset, len, mapped }),
            }
        }
        // Asked again after: a delete marks a snapshot before it clears its entries, so one
        // cleared under the walk (read as holes) is seen here. Compared with a cleared base,
        // a grain trimmed since it would look unchanged, and the replica keep its old data.
        for v in [self, base] {
            if gone(v) {
                return Err(deleted(v));
            }
        }
        Ok(out)
    }
}
