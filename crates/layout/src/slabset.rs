//! Slab sets: one column group of a layout, `width` slabs on distinct disks, and the registry
//! that persists their descriptors.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use tessera_pool::{DiskState, DiskUsage, MetaBatch, Pool, SlabRef, CF_SLABSETS};

use crate::error::{LayoutError, Result};
use crate::ranges::ByteRanges;
use crate::spec::LayoutSpec;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlabSetDesc {
    pub id: u32,
    pub spec: LayoutSpec,
    pub members: Vec<SlabRef>,
    /// Members a write went around while their disk was missing: stale should that disk come
    /// back, neither read nor written until a repair resyncs them. Recorded before the first
    /// such write reaches any disk.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missed: Vec<SlabRef>,
    /// Members taken back as their disk held them after an I/O error took it out (nothing
    /// could resync them: `record_stale_slabs`): their blocks the disk's volatile cache lost
    /// read as checksum mismatches until written again, which are not counted against the
    /// disk, after a restart as before it, until a scrub finds the member clean (or a repair
    /// moves or resyncs it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<SlabRef>,
    /// Bytes of the set's logical space lost beyond repair: a parity write had to read them
    /// (to compute its row's parity) and neither their member nor the others could give
    /// them back (rot in two members at the same place, with nothing waiting to come back).
    /// Zeros were written there with the parity in step, recorded here first: reads of them
    /// fail until they are written again.
    #[serde(default, skip_serializing_if = "ByteRanges::is_empty")]
    pub lost: ByteRanges,
}

pub struct SlabSet {
    pub id: u32,
    pub spec: LayoutSpec,
    /// Held shared by every I/O for its whole duration, so a rebuild can swap a member only
    /// when no I/O still uses the old slab.
    /// In an Arc so that a read submitted to a caller's own io_uring can keep it held until
    /// the read completes ([`MembersGuard`]).
    pub(crate) members: Arc<RwLock<Vec<SlabRef>>>,
    /// The member being rebuilt and the slab it is rebuilt onto: writes go to both.
    pub(crate) replacement: RwLock<Option<(usize, SlabRef)>>,
    /// What the descriptor's `missed` holds (see [`SlabSetDesc::missed`]); changed with the
    /// descriptor saved first.
    pub(crate) missed: parking_lot::Mutex<Vec<SlabRef>>,
    /// What the descriptor's `held` holds (see [`SlabSetDesc::held`]).
    pub(crate) held: parking_lot::Mutex<Vec<SlabRef>>,
    /// What the descriptor's `lost` holds (see [`SlabSetDesc::lost`]), and whether it holds
    /// anything (most sets never lose a block, and their I/O skips the lookup).
    pub(crate) lost: parking_lot::Mutex<ByteRanges>,
    pub(crate) any_lost: AtomicBool,
}

/// A set's members held shared, owned, for as long as reads planned against them are in
/// flight.
pub type MembersGuard = parking_lot::ArcRwLockReadGuard<parking_lot::RawRwLock, Vec<SlabRef>>;

impl SlabSet {
    /// The members held shared, or None when a rebuild holds or waits for them (it swaps
    /// a member only when no I/O uses the old slab): never blocks.
    pub fn try_members(&self) -> Option<MembersGuard> {
        self.members.try_read_arc()
    }

    pub fn desc(&self) -> SlabSetDesc {
        SlabSetDesc {
            id: self.id,
            spec: self.spec,
            members: self.members.read().clone(),
            missed: self.missed.lock().clone(),
            held: self.held.lock().clone(),
            lost: self.lost.lock().clone(),
        }
    }

    /// A set as its descriptor describes it, with no repair under way.
    fn from_desc(d: SlabSetDesc) -> SlabSet {
        SlabSet {
            id: d.id,
            spec: d.spec,
            members: Arc::new(RwLock::new(d.members)),
            replacement: RwLock::new(None),
            missed: parking_lot::Mutex::new(d.missed),
            held: parking_lot::Mutex::new(d.held),
            any_lost: AtomicBool::new(!d.lost.is_empty()),
            lost: parking_lot::Mutex::new(d.lost),
        }
    }

    /// The bytes of `[a, b)` lost beyond repair (see [`SlabSetDesc::lost`]), in order.
    pub fn lost_within(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        if !self.any_lost.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.lost.lock().within(a, b)
    }

    /// The bytes the set lost beyond repair.
    pub fn lost_bytes(&self) -> u64 {
        if !self.any_lost.load(Ordering::Acquire) {
            return 0;
        }
        self.lost.lock().bytes()
    }
}

pub(crate) fn set_key(id: u32) -> [u8; 4] {
    id.to_be_bytes()
}

/// Whether descriptor `d`, kept under `key`, is one a set can have in a pool of `slab_size`
/// byte slabs: its layout one that could be made, a member per column and copy, its key its
/// own.
fn sensible(d: &SlabSetDesc, key: &[u8], slab_size: u64) -> std::result::Result<(), String> {
    if key != set_key(d.id) {
        return Err(format!("it is kept under the key {key:02x?}, not its own"));
    }
    // Whether the pool has the disks is not asked here: a member's disk may be away.
    d.spec.validate(slab_size, usize::MAX)?;
    if d.members.len() != d.spec.width() {
        return Err(format!(
            "its layout needs {} members and it lists {}",
            d.spec.width(),
            d.members.len()
        ));
    }
    Ok(())
}

/// Every slab set of a pool.
pub(crate) struct Registry {
    pub sets: RwLock<BTreeMap<u32, Arc<SlabSet>>>,
    next_id: AtomicU32,
    /// Held by a removal and a rewrite of a descriptor: a rewrite never brings back the
    /// record of a set removed meanwhile.
    records: parking_lot::Mutex<()>,
}

impl Registry {
    pub fn load(pool: &Pool) -> Result<Registry> {
        let mut sets = BTreeMap::new();
        let mut max_id = 0;
        pool.meta().for_each_prefix(CF_SLABSETS, &[], |k, v| {
            let d: SlabSetDesc = serde_json::from_slice(v)
                .map_err(|e| pool.meta().error(format!("unreadable slab set descriptor: {e}")))?;
            // One that reads but that no set can have (no columns, an interleave of 0, fewer
            // members than its layout's width, under another set's key) is as unreadable:
            // taken as it is, the first I/O on it divides by zero or indexes past its members.
            sensible(&d, k, pool.slab_size()).map_err(|why| {
                pool.meta()
                    .error(format!("unreadable slab set descriptor (set {}): {why}", d.id))
            })?;
            for s in &d.members {
                if !pool.mark_slab_used(*s) {
                    return Err(pool.meta().error(format!(
                        "slab {} of disk {} is claimed twice or is no slab of the pool (slab set {})",
                        s.slab, s.disk, d.id
                    )));
                }
            }
            max_id = max_id.max(d.id);
            let missed = d.missed.iter().filter(|s| d.members.contains(s)).copied().collect();
            let held = d.held.iter().filter(|s| d.members.contains(s)).copied().collect();
            let lost = d.lost.merged().map_err(|(a, b)| {
                pool.meta().error(format!(
                    "unreadable slab set descriptor (set {}): a lost range ends at {b}, before it starts at {a}",
                    d.id
                ))
            })?;
            sets.insert(
                d.id,
                Arc::new(SlabSet::from_desc(SlabSetDesc {
                    missed,
                    held,
                    lost,
                    ..d
                })),
            );
            Ok(())
        })?;
        Ok(Registry {
            sets: RwLock::new(sets),
            next_id: AtomicU32::new(max_id + 1),
            records: parking_lot::Mutex::new(()),
        })
    }

    pub fn get(&self, id: u32) -> Result<Arc<SlabSet>> {
        self.sets.read().get(&id).cloned().ok_or(LayoutError::NoSuchSet(id))
    }

    pub fn all(&self) -> Vec<Arc<SlabSet>> {
        self.sets.read().values().cloned().collect()
    }

    pub fn persist(pool: &Pool, desc: &SlabSetDesc) -> Result<()> {
        Self::persist_with(pool, desc, MetaBatch::new())
    }

    /// Records `desc` durably, with `also` in the same batch.
    fn persist_with(pool: &Pool, desc: &SlabSetDesc, also: MetaBatch) -> Result<()> {
        let mut b = also;
        b.put(
            CF_SLABSETS,
            set_key(desc.id),
            serde_json::to_vec(desc).expect("serializable"),
        );
        pool.meta().commit(b, true)?;
        Ok(())
    }

    /// Allocates slabs on `spec.width()` distinct disks and records the new set durably.
    pub fn create(&self, pool: &Pool, spec: LayoutSpec) -> Result<Arc<SlabSet>> {
        let healthy = pool.free_slabs().len();
        spec.validate(pool.slab_size(), healthy)
            .map_err(|e| LayoutError::Invalid(with_lost_disks(pool, e)))?;
        let members = pool.allocate_slabs(spec.width(), &[])?;
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let desc = SlabSetDesc {
            id,
            spec,
            members: members.clone(),
            missed: Vec::new(),
            held: Vec::new(),
            lost: ByteRanges::default(),
        };
        if let Err(e) = Self::persist(pool, &desc) {
            for s in members {
                pool.release_slab(s);
            }
            return Err(e);
        }
        let set = Arc::new(SlabSet::from_desc(desc));
        self.sets.write().insert(id, set.clone());
        Ok(set)
    }

    /// Deletes a set's descriptor and forgets it; its slabs are the caller's to give back.
    pub fn remove(&self, pool: &Pool, id: u32) -> Result<()> {
        let _records = self.records.lock();
        let mut b = MetaBatch::new();
        b.delete(CF_SLABSETS, set_key(id));
        pool.meta().commit(b, true)?;
        self.sets.write().remove(&id);
        Ok(())
    }

    /// Writes a set's descriptor again from memory, with `also` in the same batch, unless
    /// the set is gone: false then. Its members are held meanwhile, so that no repair moves
    /// one and has its own descriptor overwritten by this older one.
    pub fn rewrite(&self, pool: &Pool, id: u32, also: MetaBatch) -> Result<bool> {
        let _records = self.records.lock();
        let Some(set) = self.sets.read().get(&id).cloned() else {
            return Ok(false);
        };
        let members = set.members.read();
        let missed = set.missed.lock();
        let desc = SlabSetDesc {
            id,
            spec: set.spec,
            members: members.clone(),
            missed: missed.clone(),
            held: set.held.lock().clone(),
            lost: set.lost.lock().clone(),
        };
        Self::persist_with(pool, &desc, also)?;
        Ok(true)
    }
}

impl Registry {
    /// Records durably, as members of `set` that missed writes, those of `members` that
    /// `pick` picks and `missed` (the set's record, held by the caller) lacks, and adds them
    /// to it. Returns them.
    pub(crate) fn persist_missed(
        pool: &Pool,
        set: &SlabSet,
        members: &[SlabRef],
        missed: &mut Vec<SlabRef>,
        pick: impl Fn(&SlabRef) -> bool,
    ) -> Result<Vec<SlabRef>> {
        let new: Vec<SlabRef> = members
            .iter()
            .filter(|s| pick(s) && !missed.contains(s))
            .copied()
            .collect();
        if new.is_empty() {
            return Ok(new);
        }
        let mut all = missed.clone();
        all.extend(&new);
        Self::persist(
            pool,
            &SlabSetDesc {
                id: set.id,
                spec: set.spec,
                members: members.to_vec(),
                missed: all.clone(),
                held: set.held.lock().clone(),
                lost: set.lost.lock().clone(),
            },
        )?;
        *missed = all;
        Ok(new)
    }

    /// Records durably, as members of set `id` that missed writes, those of its members
    /// `stale` picks (and not recorded yet), unless the set is gone; `recorded` is told of
    /// them while the set's records are still held, so that no repair of the set can forget
    /// them in between. Returns them.
    pub fn add_missed(
        &self,
        pool: &Pool,
        id: u32,
        stale: impl Fn(&SlabRef) -> bool,
        recorded: impl FnOnce(&[SlabRef]),
    ) -> Result<Vec<SlabRef>> {
        let _records = self.records.lock();
        let Some(set) = self.sets.read().get(&id).cloned() else {
            return Ok(Vec::new());
        };
        let members = set.members.read();
        let mut missed = set.missed.lock();
        let new = Self::persist_missed(pool, &set, &members, &mut missed, stale)?;
        if !new.is_empty() {
            recorded(&new);
        }
        Ok(new)
    }

    /// Records durably that `slab`, a member of set `id`, is no longer taken as its disk
    /// held it, unless the set is gone.
    pub fn drop_held(&self, pool: &Pool, id: u32, slab: SlabRef) -> Result<()> {
        self.change_held(pool, id, |_, held| {
            held.contains(&slab)
                .then(|| held.iter().copied().filter(|s| *s != slab).collect())
        })
    }

    /// Records durably, as members of set `id` taken as their disk holds them, those of
    /// `slabs` that are its members and not recorded yet, unless the set is gone.
    pub fn add_held(&self, pool: &Pool, id: u32, slabs: &[SlabRef]) -> Result<()> {
        self.change_held(pool, id, |members, held| {
            let new: Vec<SlabRef> = slabs
                .iter()
                .filter(|s| members.contains(s) && !held.contains(s))
                .copied()
                .collect();
            (!new.is_empty()).then(|| held.iter().chain(&new).copied().collect())
        })
    }

    /// Saves set `id`'s descriptor with the list of members taken as held that `change`
    /// makes of (its members, that list), then keeps it; nothing if `change` makes none, or
    /// the set is gone.
    fn change_held(
        &self,
        pool: &Pool,
        id: u32,
        change: impl FnOnce(&[SlabRef], &[SlabRef]) -> Option<Vec<SlabRef>>,
    ) -> Result<()> {
        let _records = self.records.lock();
        let Some(set) = self.sets.read().get(&id).cloned() else {
            return Ok(());
        };
        let members = set.members.read();
        // `missed` before `held`, as everywhere (a writer's record takes them so).
        let missed = set.missed.lock();
        let mut held = set.held.lock();
        let Some(new) = change(&members, &held) else {
            return Ok(());
        };
        Self::persist(
            pool,
            &SlabSetDesc {
                id,
                spec: set.spec,
                members: members.clone(),
                missed: missed.clone(),
                held: new.clone(),
                lost: set.lost.lock().clone(),
            },
        )?;
        *held = new;
        Ok(())
    }
}

impl Registry {
    /// Saves `set`'s descriptor with its lost ranges as `change` leaves them (`members`: the
    /// set's members, held by the caller), then keeps them; nothing if `change` says it
    /// changed nothing.
    pub(crate) fn change_lost(
        pool: &Pool,
        set: &SlabSet,
        members: &[SlabRef],
        change: impl FnOnce(&mut ByteRanges) -> bool,
    ) -> Result<()> {
        // `missed` before `held` before `lost`, as everywhere: whoever saves the descriptor
        // holds `missed`, so that two saves cannot undo each other's change.
        let missed = set.missed.lock();
        let held = set.held.lock();
        let mut lost = set.lost.lock();
        let mut new = lost.clone();
        if !change(&mut new) {
            return Ok(());
        }
        Self::persist(
            pool,
            &SlabSetDesc {
                id: set.id,
                spec: set.spec,
                members: members.to_vec(),
                missed: missed.clone(),
                held: held.clone(),
                lost: new.clone(),
            },
        )?;
        set.any_lost.store(!new.is_empty(), Ordering::Release);
        *lost = new;
        Ok(())
    }
}

/// `why` a layout cannot be placed, with the data disks the pool lost and why: "the pool has
/// 2" alone does not say that two of its four disks failed a moment ago (a full file system
/// under sparse file disks, say).
pub fn with_lost_disks(pool: &Pool, why: String) -> String {
    let lost: Vec<String> = pool
        .disks()
        .into_iter()
        .filter(|d| d.info.usage != DiskUsage::Cache && matches!(d.info.state, DiskState::Failed | DiskState::Missing))
        .map(|d| match d.problem {
            Some(p) => format!("{} ({})", d.info.path, p),
            None => d.info.path.clone(),
        })
        .collect();
    if lost.is_empty() {
        why
    } else {
        format!("{why}; failed or missing: {}", lost.join("; "))
    }
}
