//! Handing pools over between gateways: asked for by a gateway whose hosts want a pool
//! served there (never while hosts use it here), or moved by an administrator
//! (`tessera pool move`).

use super::*;

/// Why an owner hands a pool over.
#[derive(Clone, Copy)]
enum Handover {
    /// The other gateway's hosts asked for it, and none used it here for `idle`.
    Asked { idle: Duration },
    /// An administrator moves it there (`tessera pool move`), by the move etcd holds at
    /// `revision`.
    Moved { revision: i64 },
}

impl Handover {
    fn short(self) -> &'static str {
        match self {
            Handover::Asked { .. } => "whose hosts asked for it",
            Handover::Moved { .. } => "as an administrator asked",
        }
    }

    fn long(self) -> String {
        match self {
            Handover::Asked { idle } => {
                format!("whose hosts asked for it (none used it here for {} s)", idle.as_secs())
            }
            Handover::Moved { .. } => "as an administrator asked ('tessera pool move')".to_string(),
        }
    }
}

impl Daemon {
    /// Asks in etcd for each pool that a host wants served here (it sent a command for the
    /// medium to a standby port lately), and takes the word back once none does.
    pub(super) fn ask_for_wanted_pools(&self, gw: &crate::rados_pools::Membership) {
        let lease = gw.lease();
        let changes: Vec<(String, bool)> = self
            .rados
            .lock()
            .iter()
            .filter_map(|(n, p)| {
                // Not for a while after an attempt that gave the pool back: the owner would
                // hand it over to a gateway that gives it back again.
                let waiting = p.gave_back.is_some_and(|t| t.elapsed() < NO_ASK_AFTER_FAILURE)
                    || (p.moved_to.is_some() && p.handed_over.is_some_and(|t| t.elapsed() < NO_ASK_AFTER_MOVE));
                let wanted = p.owned.is_none() && p.elsewhere.is_some() && !waiting && p.ports.asked_within(ASK_WINDOW);
                let asking = p.asking.is_some() && p.asking == lease;
                (wanted != asking).then(|| (n.clone(), wanted))
            })
            .collect();
        for (name, wanted) in changes {
            let done = if wanted {
                gw.ask_for(&name)
            } else {
                gw.stop_asking(&name)
            };
            match done {
                Ok(()) => {
                    if wanted {
                        info!(pool = %name, "a host sends its I/O to this gateway's standby port: asking the owner for the pool");
                    }
                    let here = self.with_rados_pool(&name, |p| p.asking = if wanted { lease } else { None });
                    // Left here meanwhile: its leaving did not know of this ask.
                    if !here && wanted {
                        self.take_back_or_later(gw, &name, Mark::Asking);
                    }
                }
                Err(e) => debug!(pool = %name, error = %e, "cannot say in etcd whether this gateway asks for the pool"),
            }
        }
    }

    /// Hands over each pool this gateway owns that an administrator moves to another gateway
    /// (at once), or that no host has used here for `HANDOVER_IDLE` while another gateway
    /// asks for it.
    pub(super) fn hand_over_asked_pools(&self, gw: &crate::rados_pools::Membership) {
        let owned = self.rados_pools_owned();
        if owned.is_empty() {
            return;
        }
        // One request for every pool's moves, and one for every pool's asks once a pool is
        // idle, not one per pool: each may wait for an etcd that stalls as long as
        // `MEMBERSHIP_AT_MOST`.
        let mut moves = match gw.moves() {
            Ok(m) => m,
            Err(e) => {
                debug!(error = %e, "cannot learn which pools are to move");
                Default::default()
            }
        };
        let mut asked = None;
        for name in owned {
            let requests = self.io_metrics.requests_of_pool(&name);
            let (idle, untaken_by) = match self.rados.lock().get_mut(&name) {
                Some(p) => {
                    if p.activity.0 != requests {
                        p.activity = (requests, Instant::now());
                    }
                    let untaken_by = p
                        .untaken_by
                        .clone()
                        .filter(|(_, t)| t.elapsed() < NO_HANDOVER_AFTER_UNTAKEN)
                        .map(|(g, _)| g);
                    (p.activity.1.elapsed(), untaken_by)
                }
                None => continue,
            };
            if let Some((to, revision)) = self.moving_from_here(gw, &name, moves.remove(&name)) {
                self.hand_over(gw, &name, &to, Handover::Moved { revision });
                continue;
            }
            let to = if idle < HANDOVER_IDLE {
                None
            } else {
                let asked = asked.get_or_insert_with(|| {
                    gw.asked_for()
                        .inspect_err(|e| debug!(error = %e, "cannot learn which pools gateways ask for"))
                        .unwrap_or_default()
                });
                asked.remove(&name).and_then(|asking| {
                    asking
                        .into_iter()
                        .find(|g| g != gw.name() && untaken_by.as_ref() != Some(g))
                })
            };
            match to {
                Some(to) => self.hand_over(gw, &name, &to, Handover::Asked { idle }),
                // Hosts came back here, or nobody asks any more: a scrub stopped for a
                // handover goes on here.
                None => self.scrub_watch.release_after_handover(&name),
            }
        }
    }

    /// Gives pool `name` up to gateway `to`, which asked for it or an administrator moves it
    /// to: standby LUNs take its LUNs' places, its exports are withdrawn (their configuration
    /// stays), the pool is flushed with a checkpoint so that the next owner has nothing to
    /// replay, and its ownership is released in etcd. Maintenance jobs on it give way first
    /// (see [`YIELDS_TO_HOSTS`]); any other job keeps the pool here until it ends.
    fn hand_over(&self, gw: &crate::rados_pools::Membership, name: &str, to: &str, why: Handover) {
        if self.owned_epoch_and_ports(name).is_none() {
            return;
        }
        // Read before the administration waits on this: the cluster may be slow to answer
        // now. (Those LUNs whose records cannot be read now come at the end, or at the next
        // tick.) Not while jobs hold the handover back, as they may for hours: each tick
        // would read them for nothing.
        let units = match self.jobs.running_on(name).is_empty() {
            true => self.standby_units(name),
            false => None,
        };
        let (engine, owned) = {
            let _admin = self.admin.lock();
            let Some((epoch, ports)) = self.owned_epoch_and_ports(name) else {
                return;
            };
            let jobs = self.jobs.running_on(name);
            if !jobs.is_empty() {
                let kinds = jobs.into_iter().map(|id| (id, self.jobs.kind(id).unwrap_or_default()));
                let (yielding, kept): (Vec<_>, Vec<_>) =
                    kinds.partition(|(_, kind)| YIELDS_TO_HOSTS.contains(&kind.as_str()));
                if !kept.is_empty() {
                    debug!(pool = %name, jobs = ?kept, "pool to be handed over to gateway {to}, {}; kept while these jobs run on it", why.short());
                    return;
                }
                let cancelled = format!("pool {name} is handed over to gateway {to}, {}", why.short());
                for (id, kind) in yielding {
                    if kind == "scrub" {
                        self.scrub_watch.hold_for_handover(name);
                    }
                    self.jobs.cancel_because(id, &cancelled);
                }
                // Handed over at a later tick, once they have stopped.
                return;
            }
            info!(pool = %name, to, "handing the pool over to gateway {to}, {}", why.long());
            let moved_to = match why {
                Handover::Moved { revision } => Some((to.to_string(), revision)),
                Handover::Asked { .. } => None,
            };
            let (engine, owned, handed) = self.give_up(
                GivingUp {
                    gw,
                    name,
                    epoch,
                    ports: &ports,
                    units,
                    access: (AccessState::Standby, Some(to.to_string())),
                    why: format!("handed over to gateway {to}, {}", why.long()),
                    to: Some(to),
                },
                |engine| {
                    if let Err(e) = engine.checkpoint() {
                        // Nothing acknowledged waits on it: a write on RADOS is answered once
                        // the OSDs applied it (the stripe journal is this gateway's, and the
                        // next owner starts without it).
                        warn!(pool = %name, error = %e, "cannot checkpoint the pool before handing it over");
                    }
                },
                |p| {
                    p.handed_over = Some(Instant::now());
                    p.moved_to = moved_to;
                    p.elsewhere = None;
                },
            );
            // Only a handover etcd made: one it failed is no fault of the gateway's.
            if handed {
                if let Some(p) = self.rados.lock().get_mut(name) {
                    p.handed_over_now(to.to_string());
                }
            }
            // Only now: this daemon no longer has the pool to go on with its scrub.
            self.scrub_watch.release_after_handover(name);
            self.events.record(
                NewEvent::new(
                    Severity::Warning,
                    "pool.handed_over",
                    match why {
                        Handover::Asked { idle } => format!(
                            "pool {name} handed over to gateway {to}: hosts send their I/O there, and none used it here for {} s",
                            idle.as_secs()
                        ),
                        Handover::Moved { .. } => format!("pool {name} handed over to gateway {to}, {}", why.long()),
                    },
                )
                .pool(name),
            );
            (engine, owned)
        };
        // Its disk waits for the writes it sent, and its connection to the cluster closes,
        // when they go: not while the administration waits.
        drop(engine);
        drop(owned);
        // Any standby LUN not presented yet, at once.
        self.present_standby(
            name,
            &PoolOwner {
                gateway: to.to_string(),
                name: to.to_string(),
                epoch: 0,
            },
        );
    }

    /// The gateway an administrator moves pool `name`, owned here, to (`asked`: the move
    /// etcd holds for it, and its revision), if that gateway presents the pool's LUNs or
    /// exports its vdisks over NBD now. A move to this gateway is done already; a move to one
    /// that does neither (it left, its lease lapsed, its LUNs and exports were removed) is
    /// given up, and the event log says so.
    fn moving_from_here(
        &self,
        gw: &crate::rados_pools::Membership,
        name: &str,
        asked: Option<(String, i64)>,
    ) -> Option<(String, i64)> {
        let (to, revision) = asked?;
        if to == gw.name() {
            let _ = gw.end_move(name, revision);
            return None;
        }
        match gw.serving(name) {
            Ok(serving) if serving.contains(&to) => Some((to, revision)),
            Ok(_) => {
                self.end_move_saying(
                    gw,
                    name,
                    revision,
                    Severity::Warning,
                    "pool.move_given_up",
                    format!("the move of pool {name} to gateway {to} is given up: that gateway presents no LUN of the pool and exports none of its vdisks over NBD now (it left, or its lease lapsed); the pool stays here"),
                );
                None
            }
            Err(e) => {
                debug!(pool = %name, error = %e, "cannot learn which gateways present the pool");
                None
            }
        }
    }

    /// Once this gateway has taken pool `name`: a move to it is done; the move it handed
    /// the pool over for (`moved_to`: the gateway, and the move's revision in etcd), if the
    /// gateway moved to did not take it in time (it could not fence, or open the pool), is
    /// given up, so that the pool is not handed over to it again and again. Only that move:
    /// one asked since (after the gateway took the pool, and lost it) is carried out, or given
    /// up for a reason of its own, at a later tick.
    pub(super) fn settle_move(&self, gw: &crate::rados_pools::Membership, name: &str, moved_to: Option<(String, i64)>) {
        let Ok(Some((to, revision))) = gw.moving(name) else {
            return;
        };
        if to == gw.name() {
            let moved = format!("pool {name} moved to gateway {to}");
            self.end_move_saying(gw, name, revision, Severity::Info, "pool.moved", moved);
        } else if moved_to == Some((to.clone(), revision)) {
            self.end_move_saying(
                gw,
                name,
                revision,
                Severity::Warning,
                "pool.move_given_up",
                format!("the move of pool {name} to gateway {to} is given up: that gateway did not take the pool within {} s of its handover (its log says why); the pool is served here again", HANDOVER_GRACE.as_secs()),
            );
        }
    }

    /// Ends the move of pool `name` asked at `revision`, and once etcd has said it ended it
    /// (not a move asked since, nor one another gateway ended first), records why in the
    /// event log.
    fn end_move_saying(
        &self,
        gw: &crate::rados_pools::Membership,
        name: &str,
        revision: i64,
        severity: Severity,
        kind: &'static str,
        message: String,
    ) {
        if gw.end_move(name, revision) == Ok(true) {
            self.events.record(NewEvent::new(severity, kind, message).pool(name));
        }
    }

    /// Moves pool `name`, on RADOS, to gateway `to`, for an administrator: its owner hands
    /// it over to `to` at its next tick (jobs that give way to hosts are cancelled; an import,
    /// an export, a spot-fix or a repair keeps it until it ends), and `to` takes it. `to`
    /// must present LUNs of the pool, or export vdisks of it over NBD. Returns once the move is asked for, not done.
    pub fn move_pool(&self, name: &str, to: &str) -> ApiResult<()> {
        let Some(gw) = &self.gateway else {
            return Err(ApiError::invalid(format!(
                "this daemon is not a gateway: pools move between gateways (give it a [gateway] table in its configuration file)"
            )));
        };
        if !self.rados.lock().contains_key(name) {
            return Err(if self.pools.read().contains_key(name) {
                ApiError::invalid(format!(
                    "pool '{name}' is on this machine's disks: only a pool on Ceph RADOS moves between gateways"
                ))
            } else {
                ApiError::not_found(format!("no pool '{name}'"))
            });
        }
        let owner = if self.rados.lock().get(name).is_some_and(|p| p.owned.is_some()) {
            Some(gw.name().to_string())
        } else {
            gw.other_owner(name).map_err(ApiError::unavailable)?.map(|o| o.name)
        };
        if owner.as_deref() == Some(to) {
            // Nothing to do; a move asked before goes no further.
            if let Some((_, revision)) = gw.moving(name).map_err(ApiError::unavailable)? {
                gw.end_move(name, revision).map_err(ApiError::unavailable)?;
                // False: another command or gateway ended it first, which is as good.
            }
            return Ok(());
        }
        let serving = gw.serving(name).map_err(ApiError::unavailable)?;
        if !serving.iter().any(|g| g == to) {
            return Err(ApiError::invalid(format!(
                "gateway '{to}' presents no LUN of pool '{name}' and exports none of its vdisks over NBD now, so it could not serve the pool's hosts{}; import the pool there and add a LUN of it to a target, or an NBD export of one of its vdisks, first",
                if serving.is_empty() {
                    String::new()
                } else {
                    format!(" (gateways that do: {})", serving.join(", "))
                }
            )));
        }
        gw.move_to(name, to).map_err(ApiError::unavailable)?;
        self.events.record(
            NewEvent::new(
                Severity::Info,
                "pool.move_asked",
                format!(
                    "pool {name} to move to gateway {to}{}",
                    owner.map(|o| format!(" from gateway {o}")).unwrap_or_default()
                ),
            )
            .pool(name),
        );
        Ok(())
    }
}
