//! Events from changes of state: every few seconds the daemon compares each imported pool's
//! health and its disks' states with what it saw last, and records what changed (a disk
//! failed, went missing, came back; the pool went degraded, failed, or is healthy again; it
//! lost data, or has none lost any more). A pool seen for the first time (at start, at
//! import) is reported only if it is not healthy, or has data lost.

use std::collections::BTreeMap;

use parking_lot::Mutex;
use tessera_pool::DiskState;

use crate::daemon::pool_health;
use crate::events::{NewEvent, Severity};
use crate::model::PoolHealth;
use crate::Daemon;

/// What the daemon last saw of a pool.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    health: PoolHealth,
    /// Per disk id: its path and state, and why it is out of service if it is.
    disks: BTreeMap<String, (String, DiskState, Option<String>)>,
    /// Bytes of data lost: beyond repair on the pool's disks, and with the write-back log.
    lost: u64,
}

#[derive(Default)]
pub struct HealthWatch {
    pools: Mutex<BTreeMap<String, Seen>>,
}

fn state_name(s: DiskState) -> &'static str {
    match s {
        DiskState::Healthy => "healthy",
        DiskState::Spare => "a spare",
        DiskState::Failed => "failed",
        DiskState::Missing => "missing",
        DiskState::Retired => "retired",
    }
}

/// The event of a disk entering `now` from `before` (None: a disk just added), with the
/// pool's reason for a disk out of service (`problem`): an alert that a disk failed says
/// whether it may come back, and how.
fn disk_event(path: &str, before: Option<DiskState>, now: DiskState, problem: Option<&str>) -> NewEvent {
    let why = problem.map(|p| format!(": {p}")).unwrap_or_default();
    let (severity, kind, message) = match (before, now) {
        (None, _) => (
            Severity::Info,
            "disk.added",
            format!("disk {path} joined the pool as {}", state_name(now)),
        ),
        (_, DiskState::Failed) => (Severity::Error, "disk.failed", format!("disk {path} failed{why}")),
        (_, DiskState::Missing) => (Severity::Error, "disk.missing", format!("disk {path} is missing{why}")),
        (_, DiskState::Retired) => (
            Severity::Warning,
            "disk.retired",
            format!("disk {path} was retired: no new data goes to it"),
        ),
        (Some(b), DiskState::Healthy | DiskState::Spare) => (
            Severity::Info,
            "disk.back",
            format!("disk {path} is {} again (it was {})", state_name(now), state_name(b)),
        ),
    };
    NewEvent::new(severity, kind, message).subject(path)
}

fn pool_event(name: &str, before: Option<PoolHealth>, now: PoolHealth, repair: u64) -> Option<NewEvent> {
    let first = before.is_none();
    let (severity, kind, message) = match now {
        PoolHealth::Healthy if first => return None,
        PoolHealth::Healthy => (
            Severity::Info,
            "pool.healthy",
            format!("pool {name} is healthy again: every slab set has its full redundancy"),
        ),
        PoolHealth::Degraded => (
            Severity::Error,
            "pool.degraded",
            format!(
                "pool {name} is degraded: {} to rebuild or move before it has its full redundancy again",
                crate::units::format_size(repair)
            ),
        ),
        PoolHealth::Failed => (
            Severity::Critical,
            "pool.failed",
            format!("pool {name} failed: some slab sets lost more disks than their layout tolerates, their data is unreadable until a disk comes back"),
        ),
        PoolHealth::Unavailable => (Severity::Critical, "pool.unavailable", format!("pool {name} is unavailable")),
        // Never an imported pool's: its destruction has events of its own.
        PoolHealth::Destroying => return None,
    };
    Some(NewEvent::new(severity, kind, message).pool(name))
}

/// The event of a pool whose lost data went from `before` bytes (None: first look) to `now`:
/// more lost is critical (reads of it fail until hosts write it again, and a backup is the
/// only other copy), none lost any more is good news; less but some is not news.
fn lost_event(name: &str, before: Option<u64>, now: u64) -> Option<NewEvent> {
    let was = before.unwrap_or(0);
    let ev = if now > was {
        NewEvent::new(
            Severity::Critical,
            "pool.data_lost",
            format!(
                "pool {name} lost {} of data ({} lost in all): rotten on a disk and on the parity at the same place, or lost with the write-back log's disks; reads of it fail until hosts write it again (restore it from a backup or a replica; 'tessera pool scan {name}' names the vdisks and bytes of what the pool's disks lost)",
                crate::units::format_size(now - was),
                crate::units::format_size(now)
            ),
        )
    } else if now == 0 && was > 0 {
        NewEvent::new(
            Severity::Info,
            "pool.data_lost_cleared",
            format!("pool {name} has no data lost any more: what was lost has been written again"),
        )
    } else {
        return None;
    };
    Some(ev.pool(name))
}

impl Daemon {
    /// Looks at every imported pool once and records what changed since the last look.
    pub fn health_events_tick(&self) {
        let engines = self.engines();
        let mut seen = self.health_watch.pools.lock();
        seen.retain(|name, _| engines.iter().any(|(n, _)| n == name));
        for (name, e) in engines {
            let (health, repair) = pool_health(&e);
            let disks: BTreeMap<String, (String, DiskState, Option<String>)> = e
                .pool()
                .disks()
                .into_iter()
                .map(|d| (d.info.id.to_string(), (d.info.path, d.info.state, d.problem)))
                .collect();
            let before = seen.get(&name);
            for (id, (path, state, problem)) in &disks {
                let prev = before.map(|b| b.disks.get(id));
                let was = prev.map(|p| p.map(|(_, s, _)| *s));
                let problem = problem.as_deref();
                match was {
                    // First look at the pool: only what is out of service.
                    None if matches!(state, DiskState::Healthy | DiskState::Spare) => {}
                    None => {
                        self.events
                            .record(disk_event(path, Some(DiskState::Healthy), *state, problem).pool(&name));
                    }
                    // The same state (out of service, for the same reason): nothing new. A disk
                    // an error took out that is then given up with `disk fail` is told again,
                    // with why: the first event said it could come back.
                    Some(w)
                        if w == Some(*state)
                            && (!matches!(state, DiskState::Failed | DiskState::Missing)
                                || prev.flatten().map(|(_, _, p)| p.as_deref()) == Some(problem)) => {}
                    Some(w) => {
                        self.events.record(disk_event(path, w, *state, problem).pool(&name));
                    }
                }
            }
            if let Some(b) = before {
                for (id, (path, _, _)) in &b.disks {
                    if !disks.contains_key(id) {
                        self.events.record(
                            NewEvent::new(Severity::Info, "disk.removed", format!("disk {path} left the pool"))
                                .pool(&name)
                                .subject(path.clone()),
                        );
                    }
                }
            }
            if before.map(|b| b.health) != Some(health) {
                if let Some(ev) = pool_event(&name, before.map(|b| b.health), health, repair) {
                    self.events.record(ev);
                }
            }
            let lost = e.lost_bytes() + e.cache_status().lost_bytes;
            if let Some(ev) = lost_event(&name, before.map(|b| b.lost), lost) {
                self.events.record(ev);
            }
            seen.insert(name, Seen { health, disks, lost });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_name_the_change() {
        let e = disk_event("/d/1", Some(DiskState::Healthy), DiskState::Failed, None);
        assert_eq!((e.kind.as_str(), e.severity), ("disk.failed", Severity::Error));
        assert_eq!(e.message, "disk /d/1 failed");
        // Why, and whether it may come back, as the pool says it.
        let e = disk_event(
            "/d/1",
            Some(DiskState::Healthy),
            DiskState::Failed,
            Some("write error: EIO; 'tessera disk online' takes it back"),
        );
        assert_eq!(
            e.message,
            "disk /d/1 failed: write error: EIO; 'tessera disk online' takes it back"
        );
        let e = disk_event("/d/1", Some(DiskState::Missing), DiskState::Healthy, None);
        assert_eq!(e.kind, "disk.back");
        assert!(e.message.contains("was missing"), "{}", e.message);
        assert_eq!(disk_event("/d/2", None, DiskState::Spare, None).kind, "disk.added");
        assert!(pool_event("p", None, PoolHealth::Healthy, 0).is_none());
        let e = pool_event("p", Some(PoolHealth::Healthy), PoolHealth::Degraded, 1 << 30).unwrap();
        assert_eq!((e.kind.as_str(), e.severity), ("pool.degraded", Severity::Error));
        assert!(
            e.message.contains("1.0 GiB") || e.message.contains("1 GiB"),
            "{}",
            e.message
        );
        let e = pool_event("p", Some(PoolHealth::Degraded), PoolHealth::Healthy, 0).unwrap();
        assert_eq!(e.kind, "pool.healthy");
        assert_eq!(
            pool_event("p", None, PoolHealth::Failed, 0).unwrap().severity,
            Severity::Critical
        );
    }

    /// Data lost is told when more is lost (at the first look too), and when none is lost
    /// any more; not while it stays, nor when some of it is written again.
    #[test]
    fn data_lost_is_told_when_it_grows_and_when_it_is_gone() {
        let e = lost_event("p", None, 4096).unwrap();
        assert_eq!((e.kind.as_str(), e.severity), ("pool.data_lost", Severity::Critical));
        assert!(
            e.message.contains("lost 4.0 KiB of data (4.0 KiB lost in all)"),
            "{}",
            e.message
        );
        let e = lost_event("p", Some(4096), 12288).unwrap();
        assert!(
            e.message.contains("lost 8.0 KiB of data (12.0 KiB lost in all)"),
            "{}",
            e.message
        );
        assert!(lost_event("p", Some(4096), 4096).is_none());
        assert!(lost_event("p", Some(8192), 4096).is_none());
        assert!(lost_event("p", None, 0).is_none());
        assert!(lost_event("p", Some(0), 0).is_none());
        let e = lost_event("p", Some(4096), 0).unwrap();
        assert_eq!(
            (e.kind.as_str(), e.severity),
            ("pool.data_lost_cleared", Severity::Info)
        );
    }
}
