//! Destructions of pools on RADOS that did not finish: the daemon stopped during one, or the
//! cluster did not let it end. A destruction is marked in the pool's directory before
//! anything of the pool is wiped (`destroying.json`), and the mark goes only once its
//! objects are gone; a gateway that finds the mark (at its start, or after a destruction
//! that failed half way) takes the pool again and finishes the removal, or, if the pool's
//! label was never wiped, leaves the pool as it is, no longer imported here.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};
use uuid::Uuid;

use super::Daemon;
use crate::error::ApiError;
use crate::events::{NewEvent, Severity};
use crate::rados_pools::{Placement, Reader, Taking};

/// The file in a pool's directory that says the pool is being destroyed.
pub(crate) const DESTROYING_FILE: &str = "destroying.json";

/// The wait before the first retry of a destruction, doubled at each failure up to
/// [`RETRY_AT_MOST`]: a cluster that does not answer is not asked every second, and an
/// attempt that takes the pool fences the connection of the one before it off (an entry in
/// the cluster's blocklist each time).
pub(super) const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_AT_MOST: Duration = Duration::from_secs(300);

/// What a destruction needs to finish without the pool opened: which pool's label it
/// wipes, how far its objects go, and the epoch it owned the pool at (a later owner fenced
/// off the connections the destruction wrote through).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DestroyMark {
    pub pool_id: Uuid,
    pub capacity: u64,
    pub epoch: i64,
}

impl DestroyMark {
    pub fn read(dir: &Path) -> Result<Option<DestroyMark>, String> {
        crate::statefile::read_json(
            &dir.join(DESTROYING_FILE),
            "remove it to leave the pool as it is (no longer imported here), or fix it",
        )
    }

    /// Written, and synced, before the pool's label is wiped.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        let p = dir.join(DESTROYING_FILE);
        crate::statefile::write_json(&p, self).map_err(|e| format!("cannot record {}: {e}", p.display()))
    }

    /// Removed, and the removal synced, before the pool's name is freed among the gateways:
    /// a mark that came back after a power cut would have the next start remove the objects
    /// of a new pool of the name.
    pub fn clear(dir: &Path) -> Result<(), String> {
        let p = dir.join(DESTROYING_FILE);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("cannot remove {}: {e}", p.display())),
        }
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("cannot sync {}: {e}", dir.display()))
    }
}

/// A destruction to finish, and when to try next.
pub(crate) struct UnfinishedDestroy {
    placement: Placement,
    mark: DestroyMark,
    next: Instant,
    wait: Duration,
    /// Where it stands, as `pool list` says it: why it is not finished yet.
    state: String,
    /// A try is on its way (the finisher's, or an administrator's abandonment): the other
    /// waits for it.
    trying: bool,
    /// The connection the tries read the pool through while another gateway holds it, kept
    /// from one try to the next (a few seconds apart while that gateway opens the pool)
    /// rather than made anew at each; dropped after a failed reading. Never dropped under
    /// the lock of the destructions: closing a connection may wait on the cluster.
    reader: Option<Arc<Reader>>,
}

/// A pool being destroyed here, as `pool list` shows it until its name is free.
pub(crate) struct DestroyProgress {
    /// Its id, where the destruction's mark says it (not for one going on now).
    pub pool_id: Option<Uuid>,
    /// The RADOS pool its objects are in, and the epoch it was destroyed at (if it was owned
    /// at one).
    pub placement: Option<(String, Option<i64>)>,
    pub problem: String,
}

/// A destruction claimed for a try (`trying`), released when dropped: for the next try, or
/// an abandonment.
struct Claim<'a> {
    daemon: &'a Daemon,
    name: &'a str,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Some(u) = self.daemon.unfinished_destroys.lock().get_mut(self.name) {
            u.trying = false;
            // A try that panicked is waited for as a failed one: each try may fence.
            if std::thread::panicking() {
                u.next = Instant::now() + u.wait;
                u.wait = (u.wait * 2).min(RETRY_AT_MOST);
                u.state = "the last try failed (the daemon's log says why)".to_string();
            }
        }
    }
}

/// What a destruction's label says of it, the pool owned here again.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Wiped (or its first object gone): no gateway can open the pool, and its removal
    /// goes on.
    Wiped,
    /// Nothing of the pool was removed, or the disk is not the pool's: left as it is.
    Kept(String),
}

fn verdict(label: Result<tessera_disk::Label, tessera_disk::LabelError>, mark: &DestroyMark) -> Verdict {
    match label {
        Err(tessera_disk::LabelError::Missing { .. }) => Verdict::Wiped,
        Ok(l) if l.pool_id == mark.pool_id => {
            Verdict::Kept("its label was never wiped, so nothing of it was removed".to_string())
        }
        Ok(l) => Verdict::Kept(format!(
            "its disk carries the label of another pool, '{}' ({}), which is not removed",
            l.pool_name, l.pool_id
        )),
        // Never removed on a guess: what cannot be read as wiped stays for an administrator.
        Err(e) => Verdict::Kept(format!(
            "its label cannot be read as wiped ({e}), so nothing of it is removed"
        )),
    }
}

/// How an attempt to finish a destruction ended.
enum Finish {
    Done,
    LeftAsItWas(String),
    /// Failed: tried again later and later.
    Later(String),
    /// For something that ends by itself within a lease: tried again soon, not a failure.
    Waiting(String),
}

impl Daemon {
    /// At start: the pools whose directory holds a destruction's mark, to finish.
    pub(super) fn load_unfinished_destroys(&self) {
        let Ok(entries) = std::fs::read_dir(self.cfg.pools_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let dir = entry.path();
            if !dir.join(DESTROYING_FILE).exists() {
                continue;
            }
            let read = DestroyMark::read(&dir).and_then(|mark| {
                let placement = Placement::read(&dir)?.ok_or_else(|| {
                    format!(
                        "{} says where it lived no longer",
                        dir.join(crate::rados_pools::PLACEMENT_FILE).display()
                    )
                })?;
                Ok((mark, placement))
            });
            match read {
                Ok((Some(mark), placement)) => {
                    let (severity, what) = match self.gateway {
                        Some(_) => (
                            Severity::Warning,
                            "this gateway finishes it once it can take the pool (or leaves the pool whole if its label was never wiped)".to_string(),
                        ),
                        // Its name stays refused: the mark says the pool may be half removed.
                        None => (
                            Severity::Critical,
                            format!("it cannot be finished here, as this daemon is no longer a gateway (no [gateway] table in its configuration); 'tessera pool destroy {name} --abandon' abandons it"),
                        ),
                    };
                    self.events.record(
                        NewEvent::new(
                            severity,
                            "pool.destroy_unfinished",
                            format!("the destruction of pool {name} was cut short by a stop; {what}"),
                        )
                        .pool(&name),
                    );
                    let state = match self.gateway {
                        Some(_) => "it was cut short by a stop, and is finished once this gateway can take the pool",
                        None => "it was cut short by a stop, and cannot be finished here: this daemon is no longer a gateway",
                    };
                    self.finish_later(&name, placement, mark, Duration::ZERO, state.to_string());
                }
                Ok((None, _)) => {}
                Err(e) => {
                    self.events.record(
                        NewEvent::new(
                            Severity::Critical,
                            "pool.destroy_unfinished",
                            format!(
                                "the destruction of pool {name} was cut short by a stop and cannot be finished: {e}"
                            ),
                        )
                        .pool(&name),
                    );
                }
            }
        }
    }

    /// Whether pool `name`'s destruction is to be finished here.
    pub(super) fn destroy_unfinished(&self, name: &str) -> bool {
        self.unfinished_destroys.lock().contains_key(name)
    }

    /// Pool `name`'s destruction, marked in its directory, is finished by the ticks from
    /// `after` on; `state` says why it is not yet.
    pub(super) fn finish_later(
        &self,
        name: &str,
        placement: Placement,
        mark: DestroyMark,
        after: Duration,
        state: String,
    ) {
        let replaced = self.unfinished_destroys.lock().insert(
            name.to_string(),
            UnfinishedDestroy {
                placement,
                mark,
                next: Instant::now() + after,
                wait: RETRY_FIRST,
                state,
                trying: false,
                reader: None,
            },
        );
        drop(replaced);
    }

    /// `pool destroy NAME --abandon`, for a pool whose destruction is to be finished here:
    /// the destruction is abandoned, and what is left of the pool stays in the cluster as it
    /// is, no longer anything of this gateway's (listed by `pool import`). For a destruction
    /// that cannot end (the RADOS pool or the Ceph configuration gone), without restarting
    /// the gateway, which would move every pool it serves.
    /// Without the administration lock, which a command waiting on a stalled cluster may
    /// hold for long: a create, an import or an export of the name is refused until the
    /// destruction is no more, and each looks at it once.
    pub fn abandon_destroy(&self, name: &str) -> Result<(), ApiError> {
        // One lock at a time, in the order `destroy_progress` reads them.
        let going = self.destroying.lock().contains(name);
        let rados_pool = {
            let mut unfinished = self.unfinished_destroys.lock();
            let Some(u) = unfinished.get_mut(name) else {
                return Err(match going {
                    true => ApiError::busy(format!(
                        "pool '{name}' is being destroyed now; it can be abandoned only once that fails \
                         ('tessera pool list' says so)"
                    )),
                    false => ApiError::not_found(format!("no destruction of pool '{name}' is to be finished here")),
                });
            };
            if u.trying {
                return Err(ApiError::busy(format!(
                    "a try to finish the destruction of pool '{name}' is on its way (the events say how it ends); \
                     ask again once it has ended"
                )));
            }
            u.trying = true;
            u.placement.rados_pool.clone()
        };
        if let Err(e) = DestroyMark::clear(&self.pool_dir(name)) {
            if let Some(u) = self.unfinished_destroys.lock().get_mut(name) {
                u.trying = false;
            }
            return Err(ApiError::io(e));
        }
        let abandoned = self.unfinished_destroys.lock().remove(name);
        drop(abandoned);
        self.events.record(
            NewEvent::new(
                Severity::Warning,
                "pool.destroy_abandoned",
                format!(
                    "the destruction of pool {name} is abandoned at an administrator's request: what is left of it \
                     stays in RADOS pool '{rados_pool}' as it is, not imported here ('tessera pool import' lists it; \
                     if its label was wiped, no gateway opens it, and its objects stay until removed by hand)"
                ),
            )
            .pool(name),
        );
        Ok(())
    }

    /// Pool `name`'s destruction here, going on or to be finished, as `pool list` shows it;
    /// None if it is not being destroyed here.
    pub(super) fn destroy_progress(&self, name: &str) -> Option<DestroyProgress> {
        // Going on first: one that fails is to be finished before it is no longer going on
        // (`destroy_rados_pool`), so that it is found in one or the other.
        let going = self.destroying.lock().contains(name);
        if let Some(u) = self.unfinished_destroys.lock().get(name) {
            let next = u.next.saturating_duration_since(Instant::now());
            return Some(DestroyProgress {
                pool_id: Some(u.mark.pool_id),
                // The epoch is unknown where it owned the pool at none.
                placement: Some((u.placement.rados_pool.clone(), Some(u.mark.epoch).filter(|&e| e != i64::MAX))),
                problem: format!(
                    "being destroyed here, not finished yet: {}; {}; its name is refused until the destruction ends \
                     ('tessera pool destroy {name} --abandon' abandons it, leaving what is left of the pool in the cluster)",
                    u.state,
                    match &self.gateway {
                        None => "give the daemon its [gateway] table back and restart it to finish it".to_string(),
                        Some(_) if u.trying => "a try is on its way".to_string(),
                        Some(_) if next.is_zero() => "the next try is due".to_string(),
                        Some(_) => format!("next try in {} s", next.as_secs() + u64::from(next.subsec_nanos() > 0)),
                    }
                ),
            });
        }
        going.then(|| DestroyProgress {
            pool_id: None,
            placement: None,
            problem: "being destroyed here: its labels and objects are being removed from the cluster".to_string(),
        })
    }

    /// The names of the pools being destroyed here, going on or to be finished (read in the
    /// order of [`destroy_progress`](Self::destroy_progress)).
    pub(super) fn destroy_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.destroying.lock().iter().cloned().collect();
        names.extend(self.unfinished_destroys.lock().keys().cloned());
        names
    }

    /// Every second, beside the gateway's tick (a removal may take minutes): tries to finish
    /// the destructions due.
    pub fn finish_destroys(&self) {
        let Some(gw) = &self.gateway else { return };
        if self.stopping.load(std::sync::atomic::Ordering::Relaxed) || !gw.alive() {
            return;
        }
        let due: Vec<String> = self
            .unfinished_destroys
            .lock()
            .iter()
            .filter(|(_, u)| u.next <= Instant::now())
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            // Released when this try ends, however it ends (a panic included).
            let Some((placement, mark, _claim)) = self.claim_try(&name) else {
                continue;
            };
            // Ended, the event says so before the name is free.
            let ended = |name: &str| {
                let gone = self.unfinished_destroys.lock().remove(name);
                drop(gone);
            };
            match self.finish_destroy(gw, &name, &placement, &mark) {
                Finish::Done => {
                    self.pool_destroyed(
                        &name,
                        format!("pool {name} destroyed: the removal of its objects, cut short before, is finished"),
                    );
                    ended(&name);
                }
                Finish::LeftAsItWas(why) => {
                    self.events.record(
                        NewEvent::new(
                            Severity::Warning,
                            "pool.destroy_abandoned",
                            format!(
                                "pool {name} is not destroyed: {why}; it is left in the cluster as it is, not imported here ('tessera pool import {name}' tries it again)"
                            ),
                        )
                        .pool(&name),
                    );
                    ended(&name);
                }
                Finish::Waiting(why) => {
                    debug!(pool = %name, why = %why, "the pool's destruction waits");
                    if let Some(u) = self.unfinished_destroys.lock().get_mut(&name) {
                        u.next = Instant::now() + RETRY_FIRST;
                        u.state = format!("it waits: {why}");
                    }
                }
                Finish::Later(why) => {
                    let first = self.unfinished_destroys.lock().get_mut(&name).map(|u| {
                        let first = u.wait == RETRY_FIRST;
                        u.next = Instant::now() + u.wait;
                        u.wait = (u.wait * 2).min(RETRY_AT_MOST);
                        u.state = format!("the last try failed: {why}");
                        first
                    });
                    match first {
                        // Said once a streak: the first failure may last (a cluster gone, the
                        // name recorded at another place since).
                        Some(true) => {
                            self.events.record(
                                NewEvent::new(
                                    Severity::Error,
                                    "pool.destroy_unfinished",
                                    format!(
                                        "the destruction of pool {name} cannot be finished yet: {why}; this gateway tries again, less and less often (up to every {} s), and refuses the name meanwhile",
                                        RETRY_AT_MOST.as_secs()
                                    ),
                                )
                                .pool(&name),
                            );
                        }
                        Some(false) => debug!(pool = %name, error = %why, "cannot finish the pool's destruction yet"),
                        None => {}
                    }
                }
            }
        }
    }

    /// Claims pool `name`'s destruction for a try, as it is now: a removal before it may
    /// have taken minutes, during which this one may have been abandoned (and another
    /// destruction of a pool of the name begun), or be being abandoned. None unless it is
    /// due and no other try, nor an abandonment, is on its way.
    fn claim_try<'a>(&'a self, name: &'a str) -> Option<(Placement, DestroyMark, Claim<'a>)> {
        let (placement, mark) = self.unfinished_destroys.lock().get_mut(name).and_then(|u| {
            (!u.trying && u.next <= Instant::now()).then(|| {
                u.trying = true;
                (u.placement.clone(), u.mark)
            })
        })?;
        Some((placement, mark, Claim { daemon: self, name }))
    }

    /// One attempt at finishing pool `name`'s destruction: the pool taken again (fencing off
    /// whoever held it), its label looked at, and its objects removed if it was wiped.
    fn finish_destroy(
        &self,
        gw: &crate::rados_pools::Membership,
        name: &str,
        placement: &Placement,
        mark: &DestroyMark,
    ) -> Finish {
        let owned = match gw.take(name, placement) {
            Ok(Taking::Mine(o)) => o,
            // Taken since the destruction (not only handed over, nor still held at its epoch
            // by an earlier run of this gateway) and opened, so every connection the
            // destruction could have wiped the label through was fenced off first: a label
            // still there stays, and the pool is that gateway's.
            Ok(Taking::Elsewhere(o)) if o.epoch > mark.epoch => {
                let label = self.destroy_reader(name, placement).and_then(|r| {
                    Ok(match r.opened_since(name, o.epoch)? {
                        true => Some(r.label(name)?),
                        false => None,
                    })
                });
                if label.is_err() {
                    // Made anew at the next try: this one may be what failed.
                    let failed = self
                        .unfinished_destroys
                        .lock()
                        .get_mut(name)
                        .and_then(|u| u.reader.take());
                    drop(failed);
                }
                return match label.map(|l| l.map(|l| verdict(l, mark))) {
                    Ok(None) => Finish::Waiting(format!("gateway {} took the pool and is opening it", o.gateway)),
                    Ok(Some(Verdict::Kept(why))) => match DestroyMark::clear(&self.pool_dir(name)) {
                        Ok(()) => Finish::LeftAsItWas(format!("gateway {} took it, and {why}", o.gateway)),
                        Err(e) => Finish::Later(e),
                    },
                    Ok(Some(Verdict::Wiped)) => Finish::Later(format!(
                        "gateway {} holds the pool (it cannot open it); waiting for it to let go",
                        o.gateway
                    )),
                    Err(e) => Finish::Later(e),
                };
            }
            // An earlier run of this gateway, until its lease lapses.
            Ok(Taking::Elsewhere(o)) if o.name == gw.name() => {
                return Finish::Waiting(format!("{} holds the pool", o.gateway))
            }
            Ok(Taking::Elsewhere(o)) => {
                return Finish::Later(format!(
                    "gateway {} holds the pool; waiting for it to let go",
                    o.gateway
                ))
            }
            Ok(Taking::GaveBack { why, .. }) => return Finish::Later(why),
            Err(e) => return Finish::Later(e),
        };
        let label = match owned.label(name, mark.capacity) {
            Ok(l) => l,
            Err(e) => {
                self.release_or_later(gw, name, owned.epoch, None);
                return Finish::Later(e);
            }
        };
        match verdict(label, mark) {
            Verdict::Wiped => {
                info!(pool = %name, "finishing the pool's destruction: its objects are removed from the cluster");
                match self.remove_destroyed(gw, name, placement, owned, mark.capacity) {
                    Ok(()) => Finish::Done,
                    Err(e) => Finish::Later(e),
                }
            }
            Verdict::Kept(why) => {
                let cleared = DestroyMark::clear(&self.pool_dir(name));
                self.release_or_later(gw, name, owned.epoch, None);
                match cleared {
                    Ok(()) => Finish::LeftAsItWas(why),
                    Err(e) => Finish::Later(e),
                }
            }
        }
    }

    /// The read-only connection pool `name`'s destruction reads the pool through while
    /// another gateway holds it: the one kept from an earlier try, or a new one, kept.
    fn destroy_reader(&self, name: &str, placement: &Placement) -> Result<Arc<Reader>, String> {
        if let Some(r) = self.unfinished_destroys.lock().get(name).and_then(|u| u.reader.clone()) {
            return Ok(r);
        }
        let r = Arc::new(Reader::connect(placement, &self.data_paths())?);
        if let Some(u) = self.unfinished_destroys.lock().get_mut(name) {
            u.reader = Some(r.clone());
        }
        Ok(r)
    }

    /// Removes the objects of pool `name`, destroyed here and owned here as `owned`, then its
    /// directory here (the mark of its destruction first), and only then its record of
    /// place among the gateways, which frees its name for a pool elsewhere: nothing here
    /// would then remove that pool's objects. Its ownership is given up whatever comes of it.
    pub(super) fn remove_destroyed(
        &self,
        gw: &crate::rados_pools::Membership,
        name: &str,
        placement: &Placement,
        owned: crate::rados_pools::Owned,
        capacity: u64,
    ) -> Result<(), String> {
        let dir = self.pool_dir(name);
        let removed = owned.remove_objects(name, capacity).and_then(|()| {
            // The name is freed below as this gateway's: not if another may own it by now,
            // and may have made a pool of the name where this one lived.
            if !owned.lease_holds() {
                return Err(
                    "this gateway's lease on the pool may have lapsed before its name could be freed".to_string(),
                );
            }
            DestroyMark::clear(&dir)?;
            let _ = std::fs::remove_dir_all(&dir);
            Ok(())
        });
        // Only while still owned here at its epoch (checked in etcd's transaction), so that no
        // taker comes between.
        if let Err(e) = gw.forget_place(name, placement, removed.is_ok().then_some(owned.epoch)) {
            warn!(pool = %name, error = %e, "the gateways' record of where the destroyed pool lived stays in etcd");
            // Nothing tries it again (the pool's mark and directory are gone): said where an
            // administrator looks.
            if removed.is_ok() {
                self.events.record(
                    NewEvent::new(
                        Severity::Warning,
                        "pool.records_left",
                        format!("pool {name} is destroyed, but {e}"),
                    )
                    .pool(name),
                );
            }
        }
        // A move asked for it and not done would apply to the next pool of the name.
        if removed.is_ok() {
            if let Ok(Some((_, revision))) = gw.moving(name) {
                let _ = gw.end_move(name, revision);
            }
        }
        self.release_or_later(gw, name, owned.epoch, None);
        removed
    }
}

#[cfg(test)]
mod tests {
    use tessera_disk::{read_label, wipe_label, write_new_label, BlockDevice, Label, MemDisk, LABEL_SIZE};

    use super::*;

    fn label(pool_id: Uuid) -> Label {
        Label {
            pool_id,
            pool_name: "tank".to_string(),
            disk_id: Uuid::new_v4(),
            position: 0,
            generation: 1,
            disk_size: 64 << 20,
            slab_size: 4 << 20,
            exported: false,
            resync_pending: false,
        }
    }

    /// Only a wiped label lets a destruction cut short go on: a label still there means the
    /// pool was never wiped (the stop came first), and one of another pool, or one that
    /// cannot be read, is never removed on a guess.
    #[test]
    fn only_a_wiped_label_has_the_removal_go_on() {
        let id = Uuid::new_v4();
        let mark = DestroyMark {
            pool_id: id,
            capacity: 64 << 20,
            epoch: 7,
        };
        let d = MemDisk::new("mem0", 64 << 20);
        assert_eq!(verdict(read_label(&d), &mark), Verdict::Wiped, "a blank disk");
        write_new_label(&d, &label(id)).unwrap();
        assert!(matches!(verdict(read_label(&d), &mark), Verdict::Kept(w) if w.contains("never wiped")));
        wipe_label(&d, id).unwrap();
        assert_eq!(verdict(read_label(&d), &mark), Verdict::Wiped);
        let other = MemDisk::new("mem1", 64 << 20);
        write_new_label(&other, &label(Uuid::new_v4())).unwrap();
        assert!(matches!(verdict(read_label(&other), &mark), Verdict::Kept(w) if w.contains("another pool")));
        let torn = MemDisk::new("mem2", 64 << 20);
        write_new_label(&torn, &label(id)).unwrap();
        let mut block = tessera_disk::AlignedBuf::zeroed(LABEL_SIZE);
        torn.read_at(&mut block, 0).unwrap();
        block[100] ^= 0xff;
        torn.write_at(&block, 0).unwrap();
        assert!(matches!(verdict(read_label(&torn), &mark), Verdict::Kept(w) if w.contains("cannot be read")));
    }

    /// The mark is written and read back, and clearing it twice is no error (a retry after
    /// the directory went).
    #[test]
    fn a_mark_round_trips_and_clears_once_or_twice() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(DestroyMark::read(t.path()).unwrap(), None);
        let mark = DestroyMark {
            pool_id: Uuid::new_v4(),
            capacity: 4 << 30,
            epoch: 7,
        };
        mark.write(t.path()).unwrap();
        assert_eq!(DestroyMark::read(t.path()).unwrap(), Some(mark));
        DestroyMark::clear(t.path()).unwrap();
        assert_eq!(DestroyMark::read(t.path()).unwrap(), None);
        DestroyMark::clear(t.path()).unwrap();
        std::fs::write(t.path().join(DESTROYING_FILE), b"{").unwrap();
        assert!(DestroyMark::read(t.path()).unwrap_err().contains("is corrupt"));
    }

    fn daemon() -> (tempfile::TempDir, Daemon) {
        let dir = tempfile::tempdir().unwrap();
        let o = crate::config::Overrides {
            state_dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        };
        let cfg = crate::config::ServerConfig::resolve(crate::config::parse_file("").unwrap(), o).unwrap();
        let d = Daemon::start(cfg).unwrap();
        (dir, d)
    }

    /// An administrator's abandonment and the finisher's tries never run at once: each is
    /// answered "busy" (or skipped) while the other is on its way, a try that panics is
    /// waited for as a failed one, and the abandonment, once free, clears the mark and
    /// ends the destruction.
    #[test]
    fn an_abandonment_and_a_try_wait_for_each_other() {
        let (_t, d) = daemon();
        let name = "tank";
        let e = d.abandon_destroy(name).unwrap_err();
        assert_eq!(e.code, crate::error::code::NOT_FOUND, "{}", e.message);

        // A destruction going on now (not cut short) cannot be abandoned.
        d.destroying.lock().insert(name.to_string());
        let e = d.abandon_destroy(name).unwrap_err();
        assert_eq!(e.code, crate::error::code::BUSY, "{}", e.message);
        assert!(e.message.contains("is being destroyed now"), "{}", e.message);
        d.destroying.lock().remove(name);

        let dir = d.pool_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mark = DestroyMark {
            pool_id: Uuid::new_v4(),
            capacity: 64 << 20,
            epoch: 7,
        };
        mark.write(&dir).unwrap();
        let placement = Placement {
            rados_pool: "rbd".to_string(),
            ceph_conf: "/etc/ceph/ceph.conf".to_string(),
            client_name: "admin".to_string(),
        };
        d.finish_later(name, placement, mark, Duration::ZERO, "cut short".to_string());

        // A try on its way: no second try, and the abandonment is refused without touching
        // the mark.
        let (_, claimed_mark, claim) = d.claim_try(name).expect("a try is due");
        assert_eq!(claimed_mark, mark);
        assert!(d.claim_try(name).is_none(), "two tries at once");
        let e = d.abandon_destroy(name).unwrap_err();
        assert_eq!(e.code, crate::error::code::BUSY, "{}", e.message);
        assert!(e.message.contains("a try to finish the destruction"), "{}", e.message);
        assert_eq!(
            DestroyMark::read(&dir).unwrap(),
            Some(mark),
            "a refused abandonment cleared the mark"
        );
        drop(claim);

        // A try that panics: released, and tried again only after the wait of a failed one.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _claim = d.claim_try(name).expect("a try is due again once the last one ended");
            panic!("a try that panics");
        }));
        assert!(panicked.is_err());
        {
            let unfinished = d.unfinished_destroys.lock();
            let u = unfinished.get(name).expect("still to be finished");
            assert!(!u.trying, "a try that panicked still holds the destruction");
            assert!(u.next > Instant::now(), "a try that panicked is tried again at once");
            assert_eq!(u.wait, RETRY_FIRST * 2);
            assert!(u.state.contains("the last try failed"), "{}", u.state);
        }
        assert!(d.claim_try(name).is_none(), "a try before the wait of a failed one");

        // Free now: abandoned, the mark cleared, and the name no longer being destroyed.
        d.abandon_destroy(name).unwrap();
        assert_eq!(DestroyMark::read(&dir).unwrap(), None);
        assert!(d.destroy_progress(name).is_none());
        let e = d.abandon_destroy(name).unwrap_err();
        assert_eq!(e.code, crate::error::code::NOT_FOUND, "{}", e.message);
        let events = d.events.list(&Default::default(), 100);
        assert!(
            events.iter().any(|e| e.kind == "pool.destroy_abandoned"),
            "no event says the destruction was abandoned"
        );
    }
}
