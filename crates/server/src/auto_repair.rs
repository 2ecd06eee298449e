//! Repair that starts by itself. Now and then the daemon looks at every imported pool: when a
//! disk has failed for good, or has stayed away longer than `auto_repair_delay` (missing, or
//! taken out by an I/O error: a cable pulled and put back must not start a rebuild), and the pool has the free space the repair needs, it
//! starts the same repair job `tessera pool repair` starts. A repair that fails is tried again
//! after [`RETRY_AFTER`], not in a loop. Hot spares count as free space here, and the repair
//! puts its replacement slabs on them first. Retired disks are the administrator's to empty: their
//! data moves when they run the repair; but a disk the daemon itself retired as failing (past
//! `disk_error_limit` read or checksum errors) is emptied by itself too, after a restart as
//! well. The switch per pool, the disks retired as failing and how long each disk has been
//! seen away (a restart goes on counting its delay) are kept in `auto-repair.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_pool::{DiskInfo, DiskState};
use tessera_volume::Engine;
use tracing::{info, warn};

use crate::error::{ApiError, ApiResult};
use crate::jobs::JobState;
use crate::model::{AutoRepairView, RepairPool};
use crate::statefile;
use crate::units::{format_duration, format_size};
use crate::Daemon;

/// How often the daemon looks.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// How long after a failed automatic repair the next one may start.
pub const RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Settings {
    /// Pools whose repairs wait for the administrator.
    off: BTreeSet<String>,
    /// Disks the daemon retired as failing, by pool and disk id, and why.
    #[serde(default)]
    failing: BTreeMap<String, BTreeMap<String, String>>,
    /// How long each disk out of service (by pool and disk id) has been seen so by the
    /// daemon, in seconds, as of the last save (every [`OUT_FOR_STEP`]): a restart goes on
    /// counting the disk's delay rather than starting it again, so that a daemon restarted
    /// more often than the delay still repairs. Only time the daemon watched counts (not
    /// the time it was stopped, while an enclosure was mended, say), and no wall clock:
    /// one set wrong at a boot would start a rebuild at once or put it off for good.
    #[serde(default)]
    out_for: BTreeMap<String, BTreeMap<String, u64>>,
}

/// How often the time a disk has been out of service is saved while it stays out.
const OUT_FOR_STEP: u64 = 10;

#[derive(Default)]
struct PoolWatch {
    /// Each out-of-service disk (by id): when this run first saw it out, and how long
    /// earlier runs had (`Settings::out_for`).
    out_since: BTreeMap<String, (Instant, Duration)>,
    /// The automatic repair running now, and whether it only resyncs stale members.
    job: Option<(u64, bool)>,
    /// When the last automatic repair failed, and why.
    failed: Option<(Instant, String)>,
    /// The same for the last resync of stale members alone: apart, so that one that cannot
    /// finish (a set whose other member is still away) holds back no repair a disk needs.
    resync_failed: Option<(Instant, String)>,
    /// What the daemon waits for, for `pool show`.
    status: Option<String>,
}

impl PoolWatch {
    /// How long each disk of `out` (out of service) that waits to come back as it was
    /// (missing, or taken out by an I/O error) has been seen waiting: by this run since it
    /// first saw it so, and by earlier runs (`saved`). The others are not timed: one failed
    /// for good is repaired at once, a retired one is the administrator's. So a disk they
    /// retired that an I/O error then takes out waits the whole delay from the error, as any
    /// other; before, the time it had spent retired counted, and it was rebuilt at once.
    fn time_out(
        &mut self,
        out: &[&DiskInfo],
        now: Instant,
        saved: impl Fn(&str) -> Duration,
    ) -> BTreeMap<String, Duration> {
        let waiting: Vec<String> = out
            .iter()
            .filter(|d| d.state == DiskState::Missing || d.may_come_back())
            .map(|d| d.id.to_string())
            .collect();
        self.out_since.retain(|id, _| waiting.contains(id));
        for id in waiting {
            let before = saved(&id);
            self.out_since.entry(id).or_insert((now, before));
        }
        self.out_since
            .iter()
            .map(|(id, (first, before))| (id.clone(), *before + now.duration_since(*first)))
            .collect()
    }

    /// When the last repair of the kind failed, and why: a resync of stale members alone, or
    /// a whole repair.
    fn failed_of(&mut self, resync: bool) -> &mut Option<(Instant, String)> {
        if resync {
            &mut self.resync_failed
        } else {
            &mut self.failed
        }
    }
}

pub struct AutoRepair {
    path: PathBuf,
    settings: Mutex<Settings>,
    pools: Mutex<BTreeMap<String, PoolWatch>>,
}

impl AutoRepair {
    pub fn load(path: PathBuf) -> Result<AutoRepair, String> {
        let settings = statefile::read_json(
            &path,
            "fix or remove it to switch automatic repair back on for every pool",
        )?;
        Ok(AutoRepair {
            path,
            settings: Mutex::new(settings),
            pools: Mutex::new(BTreeMap::new()),
        })
    }

    /// A disk the daemon retired for its errors: repair moves its data off by itself, now and
    /// after a restart. Kept in memory if it cannot be saved (and said so).
    pub fn mark_failing(&self, pool: &str, disk_id: &str, why: String) {
        let r = self.change(|s| {
            s.failing
                .entry(pool.to_string())
                .or_default()
                .insert(disk_id.to_string(), why.clone());
            Ok(())
        });
        if let Err(e) = r {
            warn!(pool, disk = disk_id, error = %e.message, "cannot save that the disk is failing; a restart forgets it");
            self.settings
                .lock()
                .failing
                .entry(pool.to_string())
                .or_default()
                .insert(disk_id.to_string(), why);
        }
    }

    fn failing_reason(&self, pool: &str, disk_id: &str) -> Option<String> {
        self.settings
            .lock()
            .failing
            .get(pool)
            .and_then(|d| d.get(disk_id))
            .cloned()
    }

    /// How long earlier runs had seen `disk` of `pool` out of service.
    fn saved_out_for(&self, pool: &str, disk: &str) -> Duration {
        let secs = self
            .settings
            .lock()
            .out_for
            .get(pool)
            .and_then(|d| d.get(disk))
            .copied();
        Duration::from_secs(secs.unwrap_or(0))
    }

    /// Keeps how long each of the pool's disks has been out of service (in steps of
    /// [`OUT_FOR_STEP`], saved when that changed). Kept in memory if it cannot be saved (and
    /// said so): a restart then counts the delays from the start.
    fn keep_out_for(&self, pool: &str, out_for: &BTreeMap<String, Duration>) {
        let secs: BTreeMap<String, u64> = out_for
            .iter()
            .map(|(id, d)| (id.clone(), d.as_secs() / OUT_FOR_STEP * OUT_FOR_STEP))
            .collect();
        let apply = |s: &mut Settings| {
            if secs.is_empty() {
                s.out_for.remove(pool);
            } else {
                s.out_for.insert(pool.to_string(), secs.clone());
            }
        };
        let same = self
            .settings
            .lock()
            .out_for
            .get(pool)
            .map_or(secs.is_empty(), |kept| *kept == secs);
        if same {
            return;
        }
        if let Err(e) = self.change(|s| {
            apply(s);
            Ok(())
        }) {
            warn!(pool, error = %e.message, "cannot save how long disks are out of service; a restart starts their delays again");
            apply(&mut self.settings.lock());
        }
    }

    /// Changes the settings and saves them; on failure they stay as they were.
    fn change(&self, f: impl FnOnce(&mut Settings) -> ApiResult<()>) -> ApiResult<()> {
        let mut s = self.settings.lock();
        statefile::change_saved(&mut *s, f, |s| {
            statefile::write_json(&self.path, s)
                .map_err(|e| ApiError::internal(format!("cannot save {}: {e}", self.path.display())))
        })
    }

    pub fn enabled(&self, pool: &str) -> bool {
        !self.settings.lock().off.contains(pool)
    }

    /// Switches automatic repair on or off for one pool, persisted.
    /// A disk's delay counts only while repair is on for its pool: switched back on, it
    /// starts again (a disk that came back and went out meanwhile is not taken as out all
    /// that time).
    pub fn set(&self, pool: &str, on: bool) -> ApiResult<()> {
        self.change(|s| {
            if on {
                s.off.remove(pool);
            } else {
                s.off.insert(pool.to_string());
            }
            s.out_for.remove(pool);
            Ok(())
        })?;
        if let Some(w) = self.pools.lock().get_mut(pool) {
            w.out_since.clear();
        }
        Ok(())
    }

    /// A destroyed pool's name may be used again: it starts with the defaults.
    pub fn forget(&self, pool: &str) -> ApiResult<()> {
        self.pools.lock().remove(pool);
        self.change(|s| {
            s.off.remove(pool);
            s.failing.remove(pool);
            s.out_for.remove(pool);
            Ok(())
        })
    }

    pub fn view(&self, daemon_wide: bool, pool: &str) -> AutoRepairView {
        let enabled = daemon_wide && self.enabled(pool);
        let status = if !daemon_wide {
            Some("off for every pool (auto_repair = false in the configuration)".to_string())
        } else if !enabled {
            Some(format!(
                "off for this pool: 'tessera pool auto-repair {pool} on' switches it on"
            ))
        } else {
            self.pools.lock().get(pool).and_then(|w| w.status.clone())
        };
        AutoRepairView { enabled, status }
    }
}

impl Daemon {
    /// Looks at every pool once and starts the repairs that are due. Called every
    /// [`CHECK_INTERVAL`] by the daemon.
    pub fn auto_repair_tick(&self) {
        // Nothing new starts while the daemon stops: its last checkpoint and seal run then.
        if !self.cfg.auto_repair || self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        for (name, e) in self.engines_in_turn() {
            if !self.auto_repair.enabled(&name) {
                continue;
            }
            let mut pools = self.auto_repair.pools.lock();
            let w = pools.entry(name.clone()).or_default();
            self.watch(&name, &e, w);
        }
    }

    fn watch(&self, name: &str, e: &Engine, w: &mut PoolWatch) {
        let now = Instant::now();
        // The last automatic repair: still running, or how it ended.
        if let Some((id, resync)) = w.job {
            let failed = w.failed_of(resync);
            match self.jobs.get(id).map(|j| j.view()) {
                Ok(j) if j.state == JobState::Running => return,
                Ok(j) if j.state == JobState::Failed => {
                    let why = j.error.unwrap_or_default();
                    warn!(pool = name, job = id, error = %why, "automatic repair failed; trying again later");
                    *failed = Some((now, why));
                }
                Ok(j) if j.state == JobState::Succeeded => {
                    info!(pool = name, job = id, "automatic repair finished");
                    *failed = None;
                }
                _ => {}
            }
            w.job = None;
        }
        let counts = e.layouts().repair_counts();
        let needed = counts.moves as u64 * e.pool().slab_size();
        let disks = e.pool().disks();
        let out: Vec<_> = disks
            .iter()
            .filter(|d| !matches!(d.info.state, DiskState::Healthy | DiskState::Spare))
            .collect();
        if counts.moves + counts.stale == 0 {
            w.out_since.clear();
            self.auto_repair.keep_out_for(name, &BTreeMap::new());
            w.status = None;
            return;
        }
        let infos: Vec<&DiskInfo> = out.iter().map(|d| &d.info).collect();
        let out_for = w.time_out(&infos, now, |id| self.auto_repair.saved_out_for(name, id));
        self.auto_repair.keep_out_for(name, &out_for);
        // A repair the administrator started does the work.
        if self.jobs.running("repair", name).is_some() {
            w.status = None;
            return;
        }
        let delay = self.cfg.auto_repair_delay;
        let mut reason = None;
        let mut waiting: Option<(Duration, String)> = None;
        for d in &out {
            let out_for = out_for.get(&d.info.id.to_string()).copied().unwrap_or_default();
            let failing = self.auto_repair.failing_reason(name, &d.info.id.to_string());
            match disk_call(&d.info, out_for, delay, failing) {
                DiskCall::Repair(why) => reason = Some(why),
                DiskCall::Wait(left, status) => {
                    if waiting.as_ref().is_none_or(|(l, _)| left < *l) {
                        waiting = Some((left, status));
                    }
                }
                DiskCall::Nothing => {}
            }
        }
        // A disk that is back has members that missed writes while it was away: they are read
        // around until resynced where they are, which needs no free space and waits for
        // nothing (and leaves alone the members of a disk still within its delay).
        let stale = counts.stale;
        let stale_reason = format!("{stale} slab(s) missed writes while their disk was away");
        let mut resync_only = reason.is_none() && stale > 0;
        if resync_only {
            reason = Some(stale_reason.clone());
        }
        let Some(mut reason) = reason else {
            w.status = waiting.map(|(_, status)| status);
            return;
        };
        let capacity = e.pool().capacity();
        let free = capacity.free_bytes + capacity.spare_bytes;
        let mut short = None;
        if !resync_only && free < needed {
            let status = format!(
                "{reason}, but the repair needs {} and the pool has {} free: add a disk",
                format_size(needed),
                format_size(free)
            );
            if w.status.as_deref().is_none_or(|s| !s.starts_with(status.as_str())) {
                warn!(
                    pool = name,
                    needed, free, "cannot repair by itself: not enough free space"
                );
            }
            if stale == 0 {
                w.status = Some(status);
                return;
            }
            // The stale members need no space: they are resynced meanwhile.
            (resync_only, reason, short) = (true, stale_reason, Some(status));
        }
        if let Some((at, why)) = w.failed_of(resync_only).clone() {
            let since = now.duration_since(at);
            if since < RETRY_AFTER {
                w.status = Some(format!(
                    "the last automatic repair failed ({why}); the next starts in {}",
                    format_duration(RETRY_AFTER - since)
                ));
                return;
            }
        }
        let started = if resync_only {
            self.resync_stale_members(name)
        } else {
            self.repair_pool(name, RepairPool::default())
        };
        match started {
            Ok(job) => {
                info!(pool = name, job = job.id, reason = %reason, needed, "repair started by itself");
                w.job = Some((job.id, resync_only));
                let started = format!("{reason}: repair job {} started by itself", job.id);
                w.status = Some(match short {
                    Some(s) => format!("{s}; meanwhile {started}"),
                    None => started,
                });
            }
            Err(err) => {
                warn!(pool = name, error = %err.message, "cannot start an automatic repair");
                *w.failed_of(resync_only) = Some((now, err.message));
            }
        }
    }
}

/// What one disk out of service asks of the automatic repair.
#[derive(Debug, PartialEq)]
enum DiskCall {
    /// A repair, for this reason.
    Repair(String),
    /// Nothing yet: a repair is due in this long unless the disk comes back (what `pool show`
    /// says meanwhile).
    Wait(Duration, String),
    /// Nothing: the administrator's to act on (a disk they retired).
    Nothing,
}

/// The call for a disk `out_for` out of service, with the pool's `delay`, and why the daemon
/// retired it as failing (if it did). A disk that may come back as it was waits the delay, so
/// that a cable pulled and put back, or an enclosure that blinked, does not start a rebuild:
/// one missing since the import, and one an I/O error took out while the pool ran (which is
/// how a pulled cable shows then). A disk failed for good (`disk fail`, an older copy) is
/// repaired at once: it never comes back.
fn disk_call(info: &DiskInfo, out_for: Duration, delay: Duration, failing: Option<String>) -> DiskCall {
    let path = &info.path;
    let (away, back) = match info.state {
        DiskState::Missing => ("is missing", "it comes back"),
        // One the daemon retired as failing before the error is not waited for.
        DiskState::Failed if info.may_come_back() && failing.is_none() => (
            "failed on an I/O error",
            "it is taken back ('tessera disk online' once the cause is mended)",
        ),
        DiskState::Failed => return DiskCall::Repair(format!("disk {path} failed")),
        DiskState::Retired => {
            return match failing {
                Some(why) => DiskCall::Repair(format!("disk {path} is {why}")),
                None => DiskCall::Nothing,
            }
        }
        DiskState::Healthy | DiskState::Spare => return DiskCall::Nothing,
    };
    if out_for >= delay {
        return DiskCall::Repair(match info.state {
            DiskState::Missing => format!("disk {path} has been missing for {}", format_duration(delay)),
            _ => format!(
                "disk {path} has been out after an I/O error for {}",
                format_duration(delay)
            ),
        });
    }
    let left = delay - out_for;
    DiskCall::Wait(
        left,
        format!(
            "disk {path} {away}; repair starts by itself in {} unless {back}",
            format_duration(left)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_pool::{DiskInfo, DiskUsage};

    fn disk(state: DiskState, back_after_error: bool) -> DiskInfo {
        let mut info: DiskInfo = serde_json::from_value(serde_json::json!({
            "id": "00000000-0000-0000-0000-000000000001",
            "path": "/dev/sdb",
            "position": 1,
            "size": 1u64 << 30,
            "slabs": 16,
            "state": "healthy",
        }))
        .expect("a disk record");
        info.state = state;
        info.usage = DiskUsage::Data;
        info.back_after_error = back_after_error;
        info.returns_as = (state == DiskState::Missing || back_after_error).then_some(DiskState::Healthy);
        info
    }

    const DELAY: Duration = Duration::from_secs(300);

    #[test]
    fn a_disk_an_error_took_out_waits_the_delay_like_a_missing_one() {
        for state in [DiskState::Missing, DiskState::Failed] {
            let d = disk(state, state == DiskState::Failed);
            let DiskCall::Wait(left, status) = disk_call(&d, Duration::from_secs(60), DELAY, None) else {
                panic!("{state:?} did not wait");
            };
            assert_eq!(left, Duration::from_secs(240));
            assert!(status.contains("/dev/sdb") && status.contains("4 min"), "{status}");
            if state == DiskState::Failed {
                assert!(
                    status.contains("I/O error") && status.contains("disk online"),
                    "{status}"
                );
            }
            let DiskCall::Repair(why) = disk_call(&d, DELAY, DELAY, None) else {
                panic!("{state:?} not repaired after the delay");
            };
            assert!(why.contains("/dev/sdb"), "{why}");
        }
    }

    #[test]
    fn a_disk_failed_for_good_is_repaired_at_once_and_a_retired_one_only_if_failing() {
        let failed = disk(DiskState::Failed, false);
        assert_eq!(
            disk_call(&failed, Duration::ZERO, DELAY, None),
            DiskCall::Repair("disk /dev/sdb failed".into())
        );
        let retired = disk(DiskState::Retired, false);
        assert_eq!(disk_call(&retired, DELAY, DELAY, None), DiskCall::Nothing);
        assert_eq!(
            disk_call(&retired, Duration::ZERO, DELAY, Some("failing".into())),
            DiskCall::Repair("disk /dev/sdb is failing".into())
        );
        // Retired by the daemon as failing, then taken out by an I/O error: not waited for.
        let failing = disk(DiskState::Failed, true);
        assert!(matches!(
            disk_call(&failing, Duration::ZERO, DELAY, Some("failing".into())),
            DiskCall::Repair(_)
        ));
        for state in [DiskState::Healthy, DiskState::Spare] {
            assert_eq!(disk_call(&disk(state, false), DELAY, DELAY, None), DiskCall::Nothing);
        }
    }

    #[test]
    fn a_retired_disk_an_error_takes_out_waits_the_whole_delay_from_the_error() {
        let mut w = PoolWatch::default();
        let t0 = Instant::now();
        let retired = disk(DiskState::Retired, false);
        let id = retired.id.to_string();
        // Retired for longer than the delay: not timed (the administrator's to empty).
        assert!(w.time_out(&[&retired], t0, |_| Duration::ZERO).is_empty());
        let later = t0 + 2 * DELAY;
        assert!(w.time_out(&[&retired], later, |_| Duration::ZERO).is_empty());
        // Then an I/O error takes it out: it may come back as it was, and waits from now.
        let mut out = disk(DiskState::Failed, true);
        out.id = retired.id;
        let out_for = w.time_out(&[&out], later, |_| Duration::ZERO);
        assert_eq!(out_for.get(&id), Some(&Duration::ZERO));
        assert!(matches!(disk_call(&out, out_for[&id], DELAY, None), DiskCall::Wait(left, _) if left == DELAY));
        let out_for = w.time_out(&[&out], later + DELAY / 2, |_| Duration::ZERO);
        assert_eq!(out_for[&id], DELAY / 2);
        // A missing disk counts what earlier runs saw too, and one failed for good is not timed.
        let missing = disk(DiskState::Missing, false);
        let mut gone = disk(DiskState::Failed, false);
        gone.id = uuid::Uuid::from_u128(2);
        let mut w = PoolWatch::default();
        let out_for = w.time_out(&[&missing, &gone], t0, |_| Duration::from_secs(60));
        assert_eq!(out_for.len(), 1);
        assert_eq!(out_for[&missing.id.to_string()], Duration::from_secs(60));
    }

    #[test]
    fn how_long_a_disk_is_out_is_kept_across_a_restart_and_dropped_once_it_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auto-repair.json");
        let first = AutoRepair::load(path.clone()).unwrap();
        let four_min = Duration::from_secs(247);
        let mut out = BTreeMap::from([("d1".to_string(), four_min)]);
        first.keep_out_for("p", &out);
        first.set("q", false).unwrap();

        let again = AutoRepair::load(path.clone()).unwrap();
        assert_eq!(
            again.saved_out_for("p", "d1"),
            Duration::from_secs(240),
            "kept across the restart, in steps"
        );
        assert_eq!(again.saved_out_for("p", "d2"), Duration::ZERO);
        assert_eq!(again.saved_out_for("q", "d1"), Duration::ZERO);
        assert!(!again.enabled("q"), "the other settings are kept beside it");

        // Back (or repaired): dropped, so that the next time out counts from then.
        out.clear();
        again.keep_out_for("p", &out);
        assert_eq!(
            AutoRepair::load(path.clone()).unwrap().saved_out_for("p", "d1"),
            Duration::ZERO
        );
        // Repair switched off and on: counted again from then.
        again.keep_out_for("p", &BTreeMap::from([("d3".to_string(), four_min)]));
        again.set("p", false).unwrap();
        again.set("p", true).unwrap();
        assert_eq!(
            AutoRepair::load(path.clone()).unwrap().saved_out_for("p", "d3"),
            Duration::ZERO
        );
        // A destroyed pool's disks are forgotten with it.
        again.keep_out_for("p", &BTreeMap::from([("d4".to_string(), four_min)]));
        again.forget("p").unwrap();
        assert_eq!(AutoRepair::load(path).unwrap().saved_out_for("p", "d4"), Duration::ZERO);
    }
}
