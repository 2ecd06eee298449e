//! The schedule of replicas of local vdisks: the cycles that are due, and the RPO watch.

use std::sync::Arc;

use tracing::warn;

use super::{now, Outgoing, RETRY_SECS};
use crate::events::{NewEvent, Severity};
use crate::Daemon;

impl Daemon {
    /// Starts the cycles that are due, and tells of replicas past their RPO and back.
    pub fn replication_tick(self: &Arc<Self>) {
        if self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        self.reread_replication_keys();
        let t = now();
        let all: Vec<(String, Outgoing)> = self
            .replication
            .saved
            .lock()
            .outgoing
            .iter()
            .map(|(n, o)| (n.clone(), o.clone()))
            .collect();
        for (name, o) in all {
            self.watch_rpo(&name, &o, t);
            if o.paused || o.interval_secs == 0 && o.pending.is_none() || self.running_cycle(&name).is_some() {
                continue;
            }
            let failed = o.last_attempt_failed();
            let due = match o.last_attempt_at {
                None => true,
                Some(a) if failed => {
                    let retry = match o.interval_secs {
                        0 => RETRY_SECS,
                        i => RETRY_SECS.min(i),
                    };
                    t >= a.saturating_add(retry)
                }
                // A cycle cut short by a restart goes on at once.
                Some(_) if o.pending.is_some() => true,
                Some(a) => t >= a.saturating_add(o.interval_secs),
            };
            if due {
                if let Err(e) = self.start_cycle(&name, &o) {
                    warn!(replica = %name, error = %e.message, "cannot start a replication cycle");
                }
            }
        }
    }

    fn watch_rpo(&self, name: &str, o: &Outgoing, t: u64) {
        let rpo = o.rpo();
        let over = rpo > 0 && !o.paused && o.lag(t) > rpo;
        let mut live = self.replication.live.lock();
        let changed = if over {
            live.rpo_exceeded.insert(name.to_string())
        } else {
            live.rpo_exceeded.remove(name)
        };
        drop(live);
        if !changed {
            return;
        }
        let (severity, kind, msg) = if over {
            (
                Severity::Warning,
                "replica.rpo_exceeded",
                format!(
                    "replica {name}: the copy at {} is {} s old, beyond its RPO of {rpo} s",
                    o.to,
                    o.lag(t)
                ),
            )
        } else {
            (
                Severity::Info,
                "replica.rpo_met",
                format!(
                    "replica {name}: the copy at {} is within its RPO of {rpo} s again",
                    o.to
                ),
            )
        };
        self.events.record(
            NewEvent::new(severity, kind, msg)
                .pool(&o.pool)
                .subject(format!("{}/{}", o.pool, o.vdisk)),
        );
    }
}
