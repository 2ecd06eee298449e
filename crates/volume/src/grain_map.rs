//! A vdisk's grain map in memory (one word per grain) and what all of them may take. A
//! vdisk's size is bounded by its pool's disks only when written; its map is made whole when
//! it is created or opened. A size whose map this machine cannot hold is refused when the
//! vdisk is made or grown, with what it would take, rather than abort the daemon then and at
//! every start after (a host's request, or a replication peer's, could otherwise ask for it).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, VolumeError};

/// Bytes of grain maps alive in this process, across pools.
static IN_USE: AtomicU64 = AtomicU64::new(0);

/// The share of this machine's memory the grain maps may take together: half.
fn budget() -> u64 {
    // SAFETY: sysconf takes no pointers.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || page <= 0 {
        return u64::MAX;
    }
    (pages as u64).saturating_mul(page as u64) / 2
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Counts `grains` more map entries for `what` against the budget, or says why not.
fn admit(grains: u64, what: &dyn Fn() -> String) -> Result<u64> {
    admit_within(grains, budget(), what)
}

fn admit_within(grains: u64, limit: u64, what: &dyn Fn() -> String) -> Result<u64> {
    let bytes = grains.saturating_mul(8);
    IN_USE
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(bytes).filter(|&after| after <= limit)
        })
        .map(|_| bytes)
        .map_err(|used| {
            VolumeError::Invalid(format!(
                "{} needs {} of grain map in memory, and the grain maps of all vdisks may take {} \
                 (half this machine's memory; {} taken): give it larger grains or a smaller size",
                what(),
                gib(bytes),
                gib(limit),
                gib(used)
            ))
        })
}

/// A vdisk's map: `grains` entries, each 0 (unmapped) until set.
pub(crate) struct GrainMap(Vec<AtomicU64>);

impl GrainMap {
    /// A map of `grains` unmapped entries, counted against the budget; `what` names the
    /// vdisk and its size for the refusal.
    pub(crate) fn new(grains: u64, what: &dyn Fn() -> String) -> Result<GrainMap> {
        Self::made(grains, admit(grains, what)?, what)
    }

    /// The map of a vdisk that exists (a pool opening): counted, not refused for the budget
    /// (it was admitted when made; refusing it now would depend on what else is open), but
    /// an allocation that fails is still an error, not an abort.
    pub(crate) fn loaded(grains: u64, what: &dyn Fn() -> String) -> Result<GrainMap> {
        Self::made(grains, admit_within(grains, u64::MAX, what)?, what)
    }

    fn made(grains: u64, bytes: u64, what: &dyn Fn() -> String) -> Result<GrainMap> {
        let mut v = Vec::new();
        if v.try_reserve_exact(grains as usize).is_err() {
            IN_USE.fetch_sub(bytes, Ordering::AcqRel);
            return Err(VolumeError::Invalid(format!(
                "{}: no memory for its grain map of {}",
                what(),
                gib(bytes)
            )));
        }
        v.resize_with(grains as usize, || AtomicU64::new(0));
        Ok(GrainMap(v))
    }

    /// `added` more unmapped entries at the end (the vdisk grew).
    pub(crate) fn grow(&mut self, added: u64, what: &dyn Fn() -> String) -> Result<()> {
        let bytes = admit(added, what)?;
        if self.0.try_reserve_exact(added as usize).is_err() {
            IN_USE.fetch_sub(bytes, Ordering::AcqRel);
            return Err(VolumeError::Invalid(format!(
                "{}: no memory for {} more of grain map",
                what(),
                gib(bytes)
            )));
        }
        let len = self.0.len() + added as usize;
        self.0.resize_with(len, || AtomicU64::new(0));
        Ok(())
    }
}

impl GrainMap {
    /// Back to `grains` entries (a growth whose size could not be recorded).
    pub(crate) fn shrink(&mut self, grains: u64) {
        let len = self.0.len();
        if (grains as usize) < len {
            self.0.truncate(grains as usize);
            IN_USE.fetch_sub((len - grains as usize) as u64 * 8, Ordering::AcqRel);
        }
    }
}

impl std::ops::Deref for GrainMap {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        &self.0
    }
}

impl Drop for GrainMap {
    fn drop(&mut self) {
        IN_USE.fetch_sub(self.0.len() as u64 * 8, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_larger_than_the_budget_is_refused_and_counts_nothing() {
        let what = || "vdisk 'big' of 1 PiB".to_string();
        let e = match GrainMap::new(budget() / 8 + 1, &what) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a map past the budget was made"),
        };
        assert!(
            e.contains("vdisk 'big' of 1 PiB needs") && e.contains("larger grains"),
            "{e}"
        );
        let mut m = GrainMap::new(1000, &what).unwrap();
        assert!(m.grow(budget() / 8, &what).is_err());
        m.grow(24, &what).unwrap();
        assert_eq!(m.len(), 1024);
        m.shrink(1000);
        assert_eq!(m.len(), 1000);
        m.grow(24, &what).unwrap();
        // A map that exists is counted, never refused for the budget.
        let loaded = GrainMap::loaded(16, &what).unwrap();
        assert_eq!(loaded.len(), 16);
        // Other tests of this crate make and drop maps meanwhile: only this one's share
        // is certain.
        assert!(IN_USE.load(Ordering::Acquire) >= 1024 * 8);
    }
}
