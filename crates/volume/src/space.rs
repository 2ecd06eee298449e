//! Grain space: the grain-sized slots of the slab sets that hold vdisk data, with their
//! reference counts, free-slot search and fixed-provisioning reservations.
//!
//! A grain location packs (slab set id, slot) into a u64; 0 means "not allocated". Slab sets
//! are grouped by class (layout spec and grain size): a grain can only be shared between vdisks
//! of one class, so that a clone never silently changes a vdisk's resilience.
//!
//! Reference counts live here in memory (atomics, read on the hot path without a lock) and in
//! the metadata store as merge deltas. A reference is counted in memory before the batch that
//! adds it commits, and uncounted only after the batch that drops it is durable: a slot is
//! never handed out again while a durable grain entry may still point at it.
//!
//! New grains go to slab sets whose members are all on healthy disks: a set that lost a
//! member is read and overwritten in place, but new data goes elsewhere while the pool can
//! make a whole set, so a failed disk costs no new write its redundancy (and a set beyond its
//! tolerance, where every write fails, never stops the vdisks that share it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tessera_cache::WriteCache;
use tessera_layout::{LayoutSpec, Layouts, Placement, SlabSet};
use tessera_pool::{MetaBatch, CF_GRAINSETS};
use tracing::info;

use crate::error::{Result, VolumeError};

pub type Loc = u64;

pub fn loc(set: u32, slot: u32) -> Loc {
    ((set as u64) << 32) | slot as u64
}

/// The slab set and slot of a location; for a piece of a pack slot, those of the slot.
pub fn loc_parts(l: Loc) -> (u32, u32) {
    if is_packed(l) {
        (
            ((l >> 40) & PACK_MAX_SET as u64) as u32,
            ((l >> 16) & PACK_MAX_SLOT as u64) as u32,
        )
    } else {
        ((l >> 32) as u32, l as u32)
    }
}

/// A grain stored compressed is a piece of a pack slot: a slot of its class that holds the
/// compressed forms of several grains, each in whole units of 1/256 of the grain. Its
/// location says which slot and which units: bit 63 set, the set in bits 62..40, the slot in
/// 39..16, the first unit in 15..8 and the number of units in 7..0. A piece whose units run
/// past the end of its slot goes on at the start of the next slot of the set (packs written
/// together are neighbouring slots, filled end to end). References are counted per slot: a
/// grain that points at a piece holds one on every slot the piece lies in. A pack slot is
/// never overwritten: a write to a compressed grain copies it on write, whatever the count.
const PACKED: u64 = 1 << 63;
pub const PACK_MAX_SET: u32 = (1 << 23) - 1;
pub const PACK_MAX_SLOT: u32 = (1 << 24) - 1;
/// Units per pack slot.
pub const PACK_UNITS: u64 = 256;

/// The location of units [first, first + units) of slot `slot` of set `set` (on into the
/// next slot past its end); `None` when the set or a slot is beyond what a piece's location
/// can name (the grain then stays plain).
pub fn packed_loc(set: u32, slot: u32, first: u32, units: u32) -> Option<Loc> {
    let spans = first as u64 + units as u64 > PACK_UNITS;
    if set > PACK_MAX_SET
        || slot > PACK_MAX_SLOT
        || (spans && slot >= PACK_MAX_SLOT)
        || units == 0
        || first as u64 >= PACK_UNITS
        || units > 255
    {
        return None;
    }
    Some(PACKED | (set as u64) << 40 | (slot as u64) << 16 | (first as u64) << 8 | units as u64)
}

pub fn is_packed(l: Loc) -> bool {
    l & PACKED != 0
}

/// The slot a location is in: itself, or the pack slot of a piece.
pub fn slot_of(l: Loc) -> Loc {
    if is_packed(l) {
        let (set, slot) = loc_parts(l);
        loc(set, slot)
    } else {
        l
    }
}

/// The first unit and number of units of a piece.
pub fn piece_of(l: Loc) -> Option<(u32, u32)> {
    is_packed(l).then_some((((l >> 8) & 0xff) as u32, (l & 0xff) as u32))
}

/// True for a piece that runs on into the slot after its own.
pub fn spans_slots(l: Loc) -> bool {
    piece_of(l).is_some_and(|(f, n)| (f + n) as u64 > PACK_UNITS)
}

/// The slots a location holds a reference on: itself, or the pack slot of a piece and, for
/// a piece that runs on, the next slot too.
pub fn slots_of(l: Loc) -> impl Iterator<Item = Loc> {
    let first = slot_of(l);
    std::iter::once(first).chain(spans_slots(l).then_some(first + 1))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Class {
    pub layout: LayoutSpec,
    pub grain: u64,
}

pub struct SetSlots {
    pub set: Arc<SlabSet>,
    pub class: Class,
    pub refs: Vec<AtomicU32>,
}

#[derive(Default)]
struct SetAlloc {
    free: u32,
    cursor: u32,
}

#[derive(Default)]
struct AllocState {
    per_set: HashMap<u32, SetAlloc>,
    /// Slots reserved for fixed vdisks, per class.
    reserved: HashMap<Class, u64>,
}

/// The slab sets of `class` with at least `free` free slots, in id order: where an
/// allocation looks, lowest set first.
fn candidate_sets(a: &AllocState, sets: &HashMap<u32, Arc<SetSlots>>, class: Class, free: u32) -> Vec<u32> {
    let mut ids: Vec<u32> = a
        .per_set
        .iter()
        .filter(|(id, sa)| sa.free >= free && sets[*id].class == class)
        .map(|(id, _)| *id)
        .collect();
    ids.sort_unstable();
    ids
}

pub struct GrainSpace {
    layouts: Arc<Layouts>,
    /// Told before a slab set is freed: what it holds for the set is dropped.
    cache: Arc<WriteCache>,
    sets: RwLock<HashMap<u32, Arc<SetSlots>>>,
    alloc: Mutex<AllocState>,
    /// Held while a slab set is added: allocations that find the class full at the same
    /// moment wait for one new set instead of each making their own (and running the pool
    /// out of slabs).
    growing: Mutex<()>,
}

impl GrainSpace {
    pub fn new(cache: Arc<WriteCache>) -> GrainSpace {
        GrainSpace {
            layouts: cache.layouts().clone(),
            cache,
            sets: RwLock::new(HashMap::new()),
            alloc: Mutex::new(AllocState::default()),
            growing: Mutex::new(()),
        }
    }

    /// Registers a slab set found at open, with its reference counts.
    pub fn load_set(&self, set: Arc<SlabSet>, grain: u64, counts: &HashMap<u32, i64>) {
        let slots = (set.spec.set_capacity(self.layouts.pool().slab_size()) / grain) as u32;
        let refs: Vec<AtomicU32> = (0..slots)
            .map(|s| AtomicU32::new(counts.get(&s).copied().unwrap_or(0).max(0) as u32))
            .collect();
        let free = refs.iter().filter(|r| r.load(Ordering::Relaxed) == 0).count() as u32;
        let id = set.id;
        let class = Class {
            layout: set.spec,
            grain,
        };
        self.sets.write().insert(id, Arc::new(SetSlots { set, class, refs }));
        self.alloc.lock().per_set.insert(id, SetAlloc { free, cursor: 0 });
    }

    pub fn slots(&self, set: u32) -> Option<Arc<SetSlots>> {
        self.sets.read().get(&set).cloned()
    }

    /// The slab set and byte offset in it of a grain location.
    pub fn locate(&self, l: Loc) -> Result<(Arc<SlabSet>, u64)> {
        let (set, slot) = loc_parts(l);
        let s = self
            .slots(set)
            .ok_or_else(|| VolumeError::Invalid(format!("grain location {l:#x} names no slab set")))?;
        Ok((s.set.clone(), slot as u64 * s.class.grain))
    }

    /// The count of the slot `l` is in (the first, for a piece that runs on).
    pub fn refcount(&self, l: Loc) -> u32 {
        let (set, slot) = loc_parts(l);
        self.sets
            .read()
            .get(&set)
            .and_then(|s| s.refs.get(slot as usize).map(|r| r.load(Ordering::Acquire)))
            .unwrap_or(0)
    }

    /// Adds a reference to an allocated slot (a grain becoming shared), or to every slot of
    /// a piece.
    pub fn incref(&self, l: Loc) {
        for l in slots_of(l) {
            let (set, slot) = loc_parts(l);
            if let Some(r) = self.sets.read().get(&set).and_then(|s| s.refs.get(slot as usize)) {
                r.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Adds a reference to a slot that two references or more point at already, and says
    /// whether it did. Writers overwrite a slot in place only while it has one reference (and
    /// only under the lock of the grain that holds it), and a slot goes from one reference to
    /// two only while that grain's writers are kept out: so a slot this finds shared is not
    /// being overwritten, and cannot be while the reference is held. Dedup compares such a
    /// slot and points a grain at it without knowing which grains hold it.
    /// A piece that runs on into a second slot is never taken this way: the count of its
    /// first slot says nothing of whether the second still holds it.
    pub fn incref_if_shared(&self, l: Loc) -> bool {
        if spans_slots(l) {
            return false;
        }
        let (set, slot) = loc_parts(l);
        let sets = self.sets.read();
        let Some(r) = sets.get(&set).and_then(|s| s.refs.get(slot as usize)) else {
            return false;
        };
        r.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (c >= 2).then_some(c + 1))
            .is_ok()
    }

    /// The class of the slab set a location is in.
    pub fn class_of(&self, l: Loc) -> Option<Class> {
        self.slots(loc_parts(l).0).map(|s| s.class)
    }

    /// Drops a reference, after the batch recording the drop is durable: a slot that reaches
    /// zero is free at once. (References are added before their batch commits and dropped
    /// after theirs, so the in-memory count never falls below the durable one.)
    pub fn decref(&self, l: Loc) {
        for l in slots_of(l) {
            let (set, slot) = loc_parts(l);
            let Some(s) = self.slots(set) else { return };
            let Some(r) = s.refs.get(slot as usize) else { return };
            let mut a = self.alloc.lock();
            if r.fetch_sub(1, Ordering::AcqRel) == 1 {
                if let Some(sa) = a.per_set.get_mut(&set) {
                    sa.free += 1;
                }
            }
        }
    }

    /// True if `l` is a slot of a slab set that holds grains, or a piece of one.
    pub fn is_slot(&self, l: Loc) -> bool {
        let (set, slot) = loc_parts(l);
        let piece_fits = piece_of(l)
            .map(|(f, n)| n > 0 && (f as u64) < PACK_UNITS)
            .unwrap_or(true);
        let last = slot as usize + spans_slots(l) as usize;
        piece_fits && self.slots(set).map(|s| last < s.refs.len()).unwrap_or(false)
    }

    /// Where the compressed form of a packed grain lies: its slab set, the byte offset of
    /// the piece in the set and its length.
    pub fn locate_piece(&self, l: Loc) -> Result<(Arc<SlabSet>, u64, usize)> {
        let (first, units) =
            piece_of(l).ok_or_else(|| VolumeError::Invalid(format!("grain location {l:#x} is no piece")))?;
        if !self.is_slot(l) {
            return Err(VolumeError::Invalid(format!(
                "grain location {l:#x} names no piece of a slot"
            )));
        }
        let (set, base) = self.locate(l)?;
        let unit = self.class_of(l).map(|c| c.grain / PACK_UNITS).unwrap_or(0);
        Ok((set, base + first as u64 * unit, (units as u64 * unit) as usize))
    }

    /// Moves a slot's count by `delta` (never below 0), as a spot-fix of a wrong count does,
    /// keeping the set's free slots right (each slot's, for a piece that runs on). A place
    /// that is no slot is ignored.
    pub fn adjust(&self, l: Loc, delta: i64) {
        for slot in slots_of(l) {
            self.adjust_slot(slot, delta);
        }
    }

    fn adjust_slot(&self, l: Loc, delta: i64) {
        let (set, slot) = loc_parts(l);
        let Some(s) = self.slots(set) else { return };
        let Some(r) = s.refs.get(slot as usize) else { return };
        // Under the allocation lock, which every change between 0 and not 0 takes.
        let mut a = self.alloc.lock();
        let old = r
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some((c as i64 + delta).clamp(0, u32::MAX as i64) as u32)
            })
            .expect("always Some");
        let new = (old as i64 + delta).clamp(0, u32::MAX as i64);
        if let Some(sa) = a.per_set.get_mut(&set) {
            match (old == 0, new == 0) {
                (true, false) => sa.free = sa.free.saturating_sub(1),
                (false, true) => sa.free += 1,
                _ => {}
            }
        }
    }

    fn class_free(&self, a: &AllocState, class: Class) -> u64 {
        let sets = self.sets.read();
        a.per_set
            .iter()
            .filter(|(id, _)| sets.get(id).map(|s| s.class == class).unwrap_or(false))
            .map(|(_, sa)| sa.free as u64)
            .sum()
    }

    /// Takes a free slot of the class (count set to 1). `from_reservation`: a fixed vdisk
    /// spending one of its reserved slots; otherwise reserved slots are off limits and a new
    /// slab set is made when the class is full.
    pub fn allocate(&self, class: Class, from_reservation: bool) -> Result<Loc> {
        self.records_whole()?;
        // A new slab set made for this call may be raced away by other allocations; try
        // again for as long as the class can grow. Each round either takes a slot, adds a set,
        // or finds that other callers took the slots a set added, so it ends when the pool is
        // full (`grow` fails) at the latest. A fixed number of rounds gave writers a false
        // "no space" when many allocate at once and sets are small.
        let mut misses = 0;
        loop {
            let mut a = self.alloc.lock();
            let reserved = a.reserved.get(&class).copied().unwrap_or(0);
            if !from_reservation && self.class_free(&a, class) <= reserved {
                drop(a);
                self.grow(class, reserved)?;
                continue;
            }
            if let Some(l) = self.take_slot(&mut a, class, Placement::Whole) {
                Self::spend_reservation(&mut a, class, from_reservation);
                return Ok(l);
            }
            // The free slots the class counted lie in sets that lost a member, or nowhere
            // (a fixed vdisk's reservation spent elsewhere): a new whole set helps, but not
            // for ever; when the pool cannot make one, a degraded set still takes the write.
            drop(a);
            misses += 1;
            let grown = if misses < 4 {
                self.grow_whole(class)
            } else {
                Err(VolumeError::NoSpace(format!(
                    "no free grain in the {} class on healthy disks",
                    class.layout.describe()
                )))
            };
            match grown {
                Ok(()) => continue,
                // Too few healthy disks for a whole set, or a full pool.
                Err(e) => {
                    let mut a = self.alloc.lock();
                    return match self.take_slot(&mut a, class, Placement::Degraded) {
                        Some(l) => {
                            Self::spend_reservation(&mut a, class, from_reservation);
                            Ok(l)
                        }
                        None => Err(e),
                    };
                }
            }
        }
    }

    /// Takes a free slot of the class in a slab set that shares no disk with set `away`
    /// (a second copy of a slot there, which a failed disk should not take with the first),
    /// or, when no such set has room, wherever [`allocate`](Self::allocate) would.
    pub fn allocate_apart(&self, class: Class, away: u32) -> Result<Loc> {
        self.records_whole()?;
        let avoid: Vec<u32> = match self.slots(away) {
            Some(s) => s.set.desc().members.iter().map(|m| m.disk).collect(),
            None => Vec::new(),
        };
        let apart = |set: &SlabSet| set.id != away && set.desc().members.iter().all(|m| !avoid.contains(&m.disk));
        // Once in the sets there are, once more in a new one (the pool puts a new set on the
        // disks with the most room, which is seldom where the full one is).
        for round in 0..2 {
            if round == 1 {
                let _g = self.growing.lock();
                if self.add_set(class).is_err() {
                    break;
                }
            }
            let mut a = self.alloc.lock();
            let reserved = a.reserved.get(&class).copied().unwrap_or(0);
            if self.class_free(&a, class) > reserved {
                if let Some(l) = self.take_slot_where(&mut a, class, Placement::Whole, apart) {
                    return Ok(l);
                }
            }
        }
        self.allocate(class, false)
    }

    fn spend_reservation(a: &mut AllocState, class: Class, from_reservation: bool) {
        if from_reservation {
            if let Some(r) = a.reserved.get_mut(&class) {
                *r = r.saturating_sub(1);
            }
        }
    }

    /// True if new data may go to `set` when `accept` is the worst placement allowed.
    fn accepts(&self, set: &SlabSet, accept: Placement) -> bool {
        match (self.layouts.placement(set), accept) {
            (Placement::Whole, _) => true,
            (Placement::Degraded, Placement::Degraded) => true,
            _ => false,
        }
    }

    /// Takes `n` free slots of the class that follow each other in one slab set, for a write
    /// of `n` neighbouring grains: read back, they are one disk request instead of `n`, and a
    /// sequential write stays sequential on the disk when other writers allocate at the same
    /// time. None when no such run lies near a set's cursor, or the class cannot grow; the
    /// caller then allocates slot by slot. Accounted as `n` calls of `allocate`.
    pub fn allocate_run(&self, class: Class, n: usize, from_reservation: bool) -> Option<Vec<Loc>> {
        /// Slots looked at past the cursor, at most: the search stays cheap on a full set.
        const SEARCH: u32 = 4096;
        if n < 2 || self.records_whole().is_err() {
            return None;
        }
        let mut a = self.alloc.lock();
        let reserved = a.reserved.get(&class).copied().unwrap_or(0);
        if from_reservation && reserved < n as u64 {
            return None;
        }
        if !from_reservation && self.class_free(&a, class) < reserved + n as u64 {
            // Grow as `allocate` would (a new pool's first writes come here); if the pool is
            // full, slot by slot finds what is left or says why not.
            drop(a);
            self.grow(class, reserved + n as u64 - 1).ok()?;
            a = self.alloc.lock();
            let reserved = a.reserved.get(&class).copied().unwrap_or(0);
            if self.class_free(&a, class) < reserved + n as u64 {
                return None;
            }
        }
        let sets = self.sets.read();
        for id in candidate_sets(&a, &sets, class, u32::try_from(n).unwrap_or(u32::MAX)) {
            let s = &sets[&id];
            if !self.accepts(&s.set, Placement::Whole) {
                continue;
            }
            let slots = s.refs.len() as u32;
            let cursor = a.per_set[&id].cursor.min(slots);
            let end = slots.min(cursor.saturating_add(SEARCH));
            let mut start = cursor;
            for slot in cursor..end {
                if s.refs[slot as usize].load(Ordering::Acquire) != 0 {
                    start = slot + 1;
                } else if (slot - start + 1) as usize == n {
                    for r in &s.refs[start as usize..=slot as usize] {
                        r.store(1, Ordering::Release);
                    }
                    let sa = a.per_set.get_mut(&id).expect("listed above");
                    sa.free -= n as u32;
                    sa.cursor = slot + 1;
                    if from_reservation {
                        *a.reserved.get_mut(&class).expect("checked above") -= n as u64;
                    }
                    return Some((start..=slot).map(|i| loc(id, i)).collect());
                }
            }
        }
        None
    }

    /// Takes the first free slot, lowest set first, in a set that `accept` allows.
    fn take_slot(&self, a: &mut AllocState, class: Class, accept: Placement) -> Option<Loc> {
        self.take_slot_where(a, class, accept, |_| true)
    }

    /// [`take_slot`](Self::take_slot) in a set that `fits` too.
    fn take_slot_where(
        &self,
        a: &mut AllocState,
        class: Class,
        accept: Placement,
        fits: impl Fn(&SlabSet) -> bool,
    ) -> Option<Loc> {
        let sets = self.sets.read();
        for id in candidate_sets(a, &sets, class, 1) {
            let s = &sets[&id];
            if !self.accepts(&s.set, accept) || !fits(&s.set) {
                continue;
            }
            let n = s.refs.len() as u32;
            let cursor = a.per_set[&id].cursor;
            for i in 0..n {
                let slot = (cursor + i) % n;
                let l = loc(id, slot);
                if s.refs[slot as usize].load(Ordering::Acquire) == 0 {
                    s.refs[slot as usize].store(1, Ordering::Release);
                    let sa = a.per_set.get_mut(&id).unwrap();
                    sa.free -= 1;
                    sa.cursor = slot + 1;
                    return Some(l);
                }
            }
        }
        None
    }

    /// Gives back a slot taken by `allocate` whose write or commit failed.
    pub fn unallocate(&self, l: Loc, to_reservation: Option<Class>) {
        let (set, slot) = loc_parts(l);
        let Some(s) = self.slots(set) else { return };
        let mut a = self.alloc.lock();
        s.refs[slot as usize].store(0, Ordering::Release);
        if let Some(sa) = a.per_set.get_mut(&set) {
            sa.free += 1;
        }
        if let Some(c) = to_reservation {
            *a.reserved.entry(c).or_default() += 1;
        }
    }

    /// Adds a slab set to the class unless, by the time this caller's turn comes, the class
    /// has more than `keep` free slots (another caller grew it).
    fn grow(&self, class: Class, keep: u64) -> Result<()> {
        let _g = self.growing.lock();
        if self.class_free(&self.alloc.lock(), class) > keep {
            return Ok(());
        }
        self.add_set(class)
    }

    /// Adds a slab set to the class unless, by the time this caller's turn comes, a set on
    /// healthy disks has a free slot (another caller grew it).
    fn grow_whole(&self, class: Class) -> Result<()> {
        let _g = self.growing.lock();
        {
            let a = self.alloc.lock();
            let sets = self.sets.read();
            if candidate_sets(&a, &sets, class, 1)
                .iter()
                .any(|id| self.accepts(&sets[id].set, Placement::Whole))
            {
                return Ok(());
            }
        }
        self.add_set(class)
    }

    /// Makes a new slab set for the class and records its grain size.
    /// No slot is handed out once a change of the metadata may or may not be applied
    /// (`MetaStore::whole`): a slot its failed allocation gave back is free in memory, but
    /// the records may give it to that grain, and data written to it now would be read there
    /// (another vdisk's, perhaps) once the pool is opened again from them.
    fn records_whole(&self) -> Result<()> {
        Ok(self.layouts.pool().meta().whole()?)
    }

    fn add_set(&self, class: Class) -> Result<()> {
        let set = self.layouts.create_set(class.layout).map_err(|e| match e {
            tessera_layout::LayoutError::Pool(p @ tessera_pool::PoolError::NoSpace { .. }) => {
                VolumeError::NoSpace(p.to_string())
            }
            e => e.into(),
        })?;
        let meta = self.layouts.pool().meta();
        let mut b = MetaBatch::new();
        b.put(CF_GRAINSETS, set.id.to_be_bytes(), class.grain.to_le_bytes());
        if let Err(e) = meta.commit(b, true) {
            self.cache.forget_set(set.id);
            let _ = self.layouts.free_set(set.id);
            return Err(e.into());
        }
        info!(set = set.id, layout = %class.layout.describe(), grain = class.grain, "new slab set");
        self.load_set(set, class.grain, &HashMap::new());
        Ok(())
    }

    /// Reserves `n` slots of the class for a fixed vdisk, making slab sets as needed.
    /// All or nothing: on failure the sets made here are freed again.
    pub fn reserve(&self, class: Class, n: u64) -> Result<()> {
        // No other set appears meanwhile: the sets new since `before` are ours to undo.
        let _g = self.growing.lock();
        let mut made = Vec::new();
        loop {
            {
                let mut a = self.alloc.lock();
                let reserved = a.reserved.get(&class).copied().unwrap_or(0);
                if self.class_free(&a, class) >= reserved + n {
                    *a.reserved.entry(class).or_default() += n;
                    return Ok(());
                }
            }
            let before: Vec<u32> = self.sets.read().keys().copied().collect();
            if let Err(e) = self.add_set(class) {
                for id in made {
                    self.drop_set(id);
                }
                return Err(e);
            }
            made.extend(self.sets.read().keys().copied().filter(|k| !before.contains(k)));
        }
    }

    /// Returns reserved slots (a fixed vdisk deleted, or spending them).
    pub fn unreserve(&self, class: Class, n: u64) {
        let mut a = self.alloc.lock();
        if let Some(r) = a.reserved.get_mut(&class) {
            *r = r.saturating_sub(n);
        }
    }

    /// Reservation set at open from the fixed vdisks' unmapped grains.
    pub fn set_reserved(&self, class: Class, n: u64) {
        *self.alloc.lock().reserved.entry(class).or_default() += n;
    }

    /// Frees slab sets that hold no grain, as long as the class keeps enough free slots for
    /// its reservations. Their slabs go back to the pool.
    pub fn reclaim_empty(&self) -> Result<usize> {
        let victims: Vec<u32> = {
            let mut a = self.alloc.lock();
            let sets = self.sets.read();
            let mut victims = Vec::new();
            let mut ids: Vec<u32> = a.per_set.keys().copied().collect();
            ids.sort_unstable();
            for id in ids {
                let s = &sets[&id];
                let sa = &a.per_set[&id];
                if sa.free as usize == s.refs.len() {
                    let reserved = a.reserved.get(&s.class).copied().unwrap_or(0);
                    let free_after = self.class_free(&a, s.class) - sa.free as u64;
                    if free_after >= reserved {
                        a.per_set.remove(&id);
                        victims.push(id);
                    }
                }
            }
            victims
        };
        for &id in &victims {
            self.drop_set(id);
        }
        Ok(victims.len())
    }

    fn drop_set(&self, id: u32) {
        self.alloc.lock().per_set.remove(&id);
        self.sets.write().remove(&id);
        let meta = self.layouts.pool().meta();
        let mut b = MetaBatch::new();
        b.delete(CF_GRAINSETS, id.to_be_bytes());
        let _ = meta.commit(b, true);
        self.cache.forget_set(id);
        if let Err(e) = self.layouts.free_set(id) {
            tracing::warn!(set = id, error = %e, "cannot free an empty slab set");
        }
    }

    pub fn all_sets(&self) -> Vec<Arc<SetSlots>> {
        self.sets.read().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_past_the_end_of_its_slot_holds_the_next_one_too() {
        let inside = packed_loc(3, 7, 100, 156).unwrap();
        assert!(!spans_slots(inside));
        assert_eq!(slots_of(inside).collect::<Vec<_>>(), vec![loc(3, 7)]);
        let on = packed_loc(3, 7, 200, 100).unwrap();
        assert!(spans_slots(on));
        assert_eq!(slots_of(on).collect::<Vec<_>>(), vec![loc(3, 7), loc(3, 8)]);
        assert_eq!(piece_of(on), Some((200, 100)));
        assert_eq!(slots_of(loc(3, 9)).collect::<Vec<_>>(), vec![loc(3, 9)]);
        // The next slot must be one a location can name; a piece starts inside its slot.
        assert_eq!(packed_loc(3, PACK_MAX_SLOT, 200, 100), None);
        assert!(packed_loc(3, PACK_MAX_SLOT, 0, 100).is_some());
        assert_eq!(packed_loc(3, 7, 256, 1), None);
        assert_eq!(packed_loc(3, 7, 0, 0), None);
    }
}
