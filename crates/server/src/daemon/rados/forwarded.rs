//! The commands that standby ports forward to the owner of their pool, run and answered
//! here, and the unit attentions owners send back (crate::forwarding).

use super::*;

impl Daemon {
    /// Connects the logical units of pool `name` here (behind `ports`) to its other
    /// gateways: its standby LUNs pass reservation commands and MODE SELECT to the owner, and
    /// its LUNs, while owned here, send the unit attentions they raise to the standby ports
    /// elsewhere (docs/scale-out.md, *Reservations at a standby port*).
    pub(super) fn connect_to_other_gateways(&self, name: &str, ports: &crate::standby::PoolPorts) {
        if let Some(g) = &self.gateway {
            ports.connect(crate::forwarding::other_gateways(g.clone(), name));
        }
    }

    /// A watch of the notices other gateways send after revision `after`, where an earlier
    /// watch stopped, or from now on (None when this daemon is no gateway, has not joined
    /// yet, or etcd does not answer).
    pub async fn watch_notices(&self, after: Option<i64>) -> Option<crate::rados_pools::PoolNotices> {
        self.gateway.as_ref()?.watch_notices(after).await
    }

    /// Queues at the standby ports here the unit attentions that owners of pools sent
    /// (pool, notice), each at the standby LUNs of its pool.
    pub fn attentions_from_owners(&self, notices: Vec<(String, Vec<u8>)>) {
        for (pool, notice) in notices {
            crate::forwarding::attentions_in(&self.targets.luns_of_pool(&pool), &notice);
        }
    }

    /// Whether this gateway owns pool `name` under a lease that surely holds.
    fn owns_under_lease(&self, name: &str) -> bool {
        self.rados
            .lock()
            .get(name)
            .and_then(|p| p.owned.as_ref())
            .is_some_and(|o| o.lease_holds())
    }

    /// Runs the commands that standby ports of other gateways forwarded to the pools this
    /// gateway owns, and answers them (each once: taking one deletes it in etcd). One for a
    /// pool given up meanwhile, or taken too long before its turn, is answered without being
    /// run (an ALUA transition), and the host tries again, at the new owner if there is one.
    pub fn answer_asks(&self) {
        let Some(gw) = &self.gateway else { return };
        // Only those whose lease surely holds: an owner that stalled past it, replaced, would
        // answer from what it held before (its ticks have not given the pool up yet).
        let owned = self.rados_pools_owned_where(|o| o.lease_holds());
        if owned.is_empty() {
            return;
        }
        // Before the taking, which takes the asks one by one: the first may be the oldest.
        let taken = Instant::now();
        let asks = match gw.take_asks(&owned) {
            Ok(a) => a,
            Err(e) => {
                debug!(error = %e, "cannot look for commands forwarded by standby gateways");
                return;
            }
        };
        for (name, ask) in asks {
            let mut kept = None;
            // Checked again for each: one before it may have taken long. Not run, the ask
            // is answered so, and its host tries again at once.
            let answer = if taken.elapsed() > crate::forwarding::RUN_TAKEN_WITHIN {
                debug!(pool = %name, "a forwarded command is not run: it was taken too long ago, and its asker may give up before it is answered");
                crate::forwarding::not_run()
            } else if ask.lasts_for() < crate::forwarding::ASK_MUST_LAST {
                warn!(pool = %name, seconds_left = ask.lasts_for().as_secs(), "a forwarded command is not run: its asker stops waiting before an answer could surely reach it (it was taken late, its asker could not take it back)");
                crate::forwarding::not_run()
            } else if !self.owns_under_lease(&name) {
                debug!(pool = %name, "a forwarded command is not run: this gateway no longer owns the pool, or its lease on it may have lapsed");
                crate::forwarding::not_run()
            } else {
                // Kept alive while it runs and is answered, however long that takes: its
                // asker waits for as long.
                kept = gw.keep_running(&ask);
                let admits = |lun: &tessera_scsi::Lun, initiator: &str| self.targets.admits(lun, initiator);
                let run = std::panic::AssertUnwindSafe(|| {
                    crate::forwarding::run_forwarded(&self.targets.luns_of_pool(&name), &admits, &ask.request)
                });
                // A command that panicked is answered as failed, and the asks after it run:
                // taken, they are no other gateway's to run.
                std::panic::catch_unwind(run).unwrap_or_else(|_| {
                    tracing::error!(pool = %name, "a forwarded command panicked here: its host is told it failed");
                    crate::forwarding::failed()
                })
            };
            let answered = gw.answer(&ask, &answer);
            drop(kept);
            match answered {
                Ok(true) => {}
                Ok(false) => {
                    warn!(pool = %name, "a standby gateway no longer waits for a command it forwarded, which ran here: it gave up (its host sends the command again), or it had the answer from a try that etcd applied late")
                }
                Err(e) => {
                    warn!(pool = %name, error = %e, "cannot answer a command a standby gateway forwarded: it tells its host to try again")
                }
            }
        }
    }
}
