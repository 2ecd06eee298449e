//! Metadata damage made on purpose, for drills, tests and benchmarks of the scan and
//! spot-fix (as ZFS has zinject). Each function leaves the store and memory as an import of a
//! pool with that damage would hold them, on a running engine. Nothing calls them in service.
//!
//! Also a fill of the grain map without data, for benchmarks that need millions of mapped
//! grains quickly: the slots are taken and counted as a write would, but never written.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_pool::{MetaBatch, CF_GRAINS, CF_GRAINSETS, CF_REFCOUNTS, CF_SLABSETS};

use crate::engine::Engine;
use crate::error::{Result, VolumeError};
use crate::keys::{grain_key, loc_value, refcount_key};
use crate::space::{loc, Loc};
use crate::vdisk::Vdisk;

/// Grains (or slots) per batch.
const BATCH: u64 = 4096;

/// A record [`Engine::damage_unreadable`] makes unreadable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// The grain map entry of a vdisk's grain: its value cut short.
    GrainEntry,
    /// A record under a grain map key of the wrong length (the grain's own entry stays).
    GrainKey,
    /// The reference count of the slot under the grain.
    Count,
    /// The reference count of the slot under the grain, readable and impossible: below zero.
    NegativeCount,
    /// The reference count of the slot under the grain, readable and impossible: past what a
    /// slot's count holds (2^32, which a count cut to 32 bits would read as 0).
    HugeCount,
    /// A record under a count key of the wrong length.
    CountKey,
    /// The grain size record of the slab set under the grain.
    GrainSize,
    /// The descriptor of the slab set under the grain.
    SetDescriptor,
    /// The grain size record of the slab set under the grain, holding another size a set
    /// can have (readable, and wrong).
    WrongGrainSize,
    /// The grain size record of the slab set that holds the hot copy of the grain's slot.
    HotCopyGrainSize,
}

impl Engine {
    /// Leaves snapshot `snapshot` of `vdisk` half made, as a snapshot whose fill stopped
    /// (a crash, a commit that failed) leaves it until the next start deletes it: its record
    /// marked `Creating`, nothing of the image in it.
    pub fn damage_half_made_snapshot(&self, vdisk: &str, snapshot: &str) -> Result<Arc<Vdisk>> {
        let s = self.vdisk(vdisk)?;
        let spec = Self::thin_spec_like(&s, &format!("{vdisk}@{snapshot}"));
        self.create_with(&spec, Some(vdisk.to_string()), crate::config::VdiskState::Creating)
    }

    /// Makes a record about `vdisk`'s (mapped) grain unreadable, in the store only: memory
    /// keeps what it had, as when a store is damaged under a running pool, and an import
    /// reads what is left.
    pub fn damage_unreadable(&self, vdisk: &str, grain: u64, what: Unreadable) -> Result<()> {
        let v = self.vdisk(vdisk)?;
        let l = self.mapped_slot(&v, grain)?;
        let set = crate::space::loc_parts(l).0;
        let mut b = MetaBatch::new();
        match what {
            Unreadable::GrainEntry => b.put(CF_GRAINS, grain_key(v.id, grain), &loc_value(l)[..5]),
            Unreadable::GrainKey => b.put(CF_GRAINS, &grain_key(v.id, grain)[..12], loc_value(l)),
            Unreadable::Count => b.put(CF_REFCOUNTS, refcount_key(l), [1u8, 2, 3]),
            Unreadable::NegativeCount => b.put(CF_REFCOUNTS, refcount_key(l), (-1i64).to_le_bytes()),
            Unreadable::HugeCount => b.put(CF_REFCOUNTS, refcount_key(l), (1i64 << 32).to_le_bytes()),
            Unreadable::CountKey => b.put(CF_REFCOUNTS, [0xffu8; 5], 1i64.to_le_bytes()),
            Unreadable::GrainSize => b.put(CF_GRAINSETS, set.to_be_bytes(), [7u8, 7, 7]),
            Unreadable::SetDescriptor => b.put(CF_SLABSETS, set.to_be_bytes(), &b"{\"id\": "[..]),
            Unreadable::WrongGrainSize => {
                let g = self
                    .shared()
                    .space
                    .slots(set)
                    .expect("a mapped grain's set")
                    .class
                    .grain;
                let other = if g * 2 <= crate::config::MAX_GRAIN {
                    g * 2
                } else {
                    g / 2
                };
                b.put(CF_GRAINSETS, set.to_be_bytes(), other.to_le_bytes())
            }
            Unreadable::HotCopyGrainSize => {
                let slot = crate::space::slot_of(l);
                let Some((_, copy)) = self.shared().hot.pairs().into_iter().find(|&(p, _)| p == slot) else {
                    return Err(VolumeError::Invalid(format!(
                        "{vdisk} grain {grain}'s slot has no hot copy"
                    )));
                };
                let set = crate::space::loc_parts(copy).0;
                b.put(CF_GRAINSETS, set.to_be_bytes(), [7u8, 7, 7])
            }
        }
        self.damage_commit(b)
    }

    fn mapped_slot(&self, v: &Vdisk, grain: u64) -> Result<Loc> {
        match v.entry(grain) {
            0 => Err(VolumeError::Invalid(format!(
                "{} grain {grain} is not mapped",
                v.name()
            ))),
            l => Ok(l),
        }
    }

    fn damage_commit(&self, b: MetaBatch) -> Result<()> {
        self.pool().meta().commit(b, true)?;
        Ok(())
    }

    /// Takes `n` free slots of the class of `vdisk` and counts them as used, with nothing
    /// referring to them: space that never comes back. Returns them.
    pub fn damage_orphan_slots(&self, vdisk: &str, n: u64) -> Result<Vec<Loc>> {
        let v = self.vdisk(vdisk)?;
        let s = self.shared();
        let mut taken = Vec::with_capacity(n as usize);
        while (taken.len() as u64) < n {
            let want = (n - taken.len() as u64).min(BATCH) as usize;
            let part = match s.space.allocate_run(v.class, want, false) {
                Some(run) => run,
                None => vec![s.space.allocate(v.class, false)?],
            };
            let mut b = MetaBatch::new();
            for &l in &part {
                b.count(CF_REFCOUNTS, refcount_key(l), 1);
            }
            self.damage_commit(b)?;
            taken.extend(part);
        }
        Ok(taken)
    }

    /// Adds `delta` to the count of the slot under a grain, in the store and in memory.
    /// Minus the count makes the grain point into a slot that is free to be taken.
    pub fn damage_count(&self, vdisk: &str, grain: u64, delta: i64) -> Result<Loc> {
        let v = self.vdisk(vdisk)?;
        let l = self.mapped_slot(&v, grain)?;
        let mut b = MetaBatch::new();
        b.count(CF_REFCOUNTS, refcount_key(l), delta);
        self.damage_commit(b)?;
        self.shared().space.adjust(l, delta);
        Ok(l)
    }

    /// Frees the slot under a grain (its count goes to 0) while the grain, and whatever
    /// shares it, still point at it.
    pub fn damage_free_under(&self, vdisk: &str, grain: u64) -> Result<Loc> {
        let v = self.vdisk(vdisk)?;
        let l = self.mapped_slot(&v, grain)?;
        let count = self.shared().space.refcount(l) as i64;
        self.damage_count(vdisk, grain, -count)
    }

    /// Points a grain at a slab set that does not exist, as a snapshot left pointing into a
    /// set freed under it would; its old slot loses the reference. Returns the place.
    pub fn damage_dangle(&self, vdisk: &str, grain: u64) -> Result<Loc> {
        let v = self.vdisk(vdisk)?;
        let s = self.shared();
        let old = self.mapped_slot(&v, grain)?;
        let gone = s.space.all_sets().iter().map(|x| x.set.id).max().unwrap_or(0) + 1000;
        let l = loc(gone, (grain % 1000) as u32);
        let mut b = MetaBatch::new();
        b.put(CF_GRAINS, grain_key(v.id, grain), loc_value(l));
        b.count(CF_REFCOUNTS, refcount_key(old), -1);
        self.damage_commit(b)?;
        v.set_entry(grain, l);
        s.space.adjust(old, -1);
        Ok(l)
    }

    /// Copies every map entry of `vdisk`, with its reference, under an id no vdisk has: what
    /// a delete cut short would leave. Returns the id.
    pub fn damage_leftover_entries(&self, vdisk: &str) -> Result<u64> {
        let v = self.vdisk(vdisk)?;
        let s = self.shared();
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let entries: Vec<(u64, Loc)> = (0..v.map.read().len() as u64)
            .map(|g| (g, v.entry(g)))
            .filter(|e| e.1 != 0)
            .collect();
        for part in entries.chunks(BATCH as usize) {
            let mut b = MetaBatch::new();
            for &(g, l) in part {
                s.space.adjust(l, 1);
                b.put(CF_GRAINS, grain_key(id, g), loc_value(l));
                b.count(CF_REFCOUNTS, refcount_key(l), 1);
            }
            self.damage_commit(b)?;
        }
        Ok(id)
    }

    /// Maps the unmapped grains of `range` to new slots, counted, without writing them: they
    /// read as whatever the disks hold there. For benchmarks of metadata work only.
    pub fn fill_metadata_only(&self, vdisk: &str, range: Range<u64>) -> Result<u64> {
        let v = self.vdisk(vdisk)?;
        v.check_writable()?;
        let s = self.shared();
        let meta = s.pool.meta();
        let end = range.end.min(v.map.read().len() as u64);
        let mut mapped = 0;
        let mut g = range.start;
        while g < end {
            let grains: Vec<u64> = (g..(g + BATCH).min(end)).filter(|&i| v.entry(i) == 0).collect();
            g = (g + BATCH).min(end);
            if grains.is_empty() {
                continue;
            }
            let _gate = v.enter_change()?;
            let _locks = s.locks.lock_many(grains.iter().map(|&i| (v.id, i)));
            let slots = match s.space.allocate_run(v.class, grains.len(), v.fixed()) {
                Some(run) => run,
                None => grains
                    .iter()
                    .map(|_| s.space.allocate(v.class, v.fixed()))
                    .collect::<Result<Vec<Loc>>>()?,
            };
            let mut b = MetaBatch::new();
            for (&i, &l) in grains.iter().zip(&slots) {
                b.put(CF_GRAINS, grain_key(v.id, i), loc_value(l));
                b.count(CF_REFCOUNTS, refcount_key(l), 1);
            }
            meta.commit(b, false)?;
            for (&i, &l) in grains.iter().zip(&slots) {
                v.set_entry(i, l);
            }
            mapped += grains.len() as u64;
        }
        meta.sync()?;
        Ok(mapped)
    }
}
