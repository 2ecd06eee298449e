//! The source side's administration: replicas of local vdisks made, shown, changed, paused,
//! synced and deleted, and demotion (a source that hands its vdisk over to the peer it
//! replicated to, after a failover). Cycles are in cycle.rs, the schedule in schedule.rs.

use std::sync::Arc;

use axum::http::StatusCode;

use super::{check_name, no_replica, now, replication_snapshots, Incoming, Outgoing};
use crate::error::{code, ApiError, ApiResult};
use crate::events::{NewEvent, Severity};
use crate::jobs::JobView;
use crate::model::{CreateReplica, ReplicaView, SetReplica};
use crate::Daemon;

impl Daemon {
    pub fn create_replica(self: &Arc<Self>, req: CreateReplica) -> ApiResult<ReplicaView> {
        check_schedule(req.interval_secs, req.rpo_secs)?;
        let (e, v) = self.vdisk(&req.pool, &req.vdisk)?;
        if v.is_snapshot() {
            return Err(ApiError::invalid(format!(
                "'{}' is a snapshot; replicate its vdisk (each cycle takes its own snapshot)",
                req.vdisk
            )));
        }
        if self.is_replica(&req.pool, &req.vdisk)? {
            return Err(ApiError::invalid(format!(
                "'{}/{}' is a replica held for a peer; promote it before replicating it",
                req.pool, req.vdisk
            )));
        }
        let name = req
            .name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", req.pool, req.vdisk));
        check_name(&name)?;
        let target_vdisk = req.target_vdisk.clone().unwrap_or_else(|| req.vdisk.clone());
        tessera_pool::validate_name("pool", &req.target_pool).map_err(ApiError::invalid)?;
        tessera_pool::validate_name("vdisk", &target_vdisk).map_err(ApiError::invalid)?;
        check_address(&req.to)?;
        if let Some(g) = &req.group {
            check_name(g)?;
        }
        check_streams(req.streams)?;
        if req.bandwidth.is_some_and(|b| b < 4096) {
            return Err(ApiError::invalid(
                "bandwidth must be at least 4 KiB per second (leave it out for no limit)",
            ));
        }
        // Reversing: the last snapshot this vdisk received as a replica is the common point.
        let base = if req.reverse {
            let last = replication_snapshots(&e, &req.vdisk).pop();
            match last {
                Some(s) => Some(s),
                None => {
                    return Err(ApiError::invalid(format!(
                        "'{}/{}' has no replication snapshot to reverse from: it was never a replica",
                        req.pool, req.vdisk
                    )))
                }
            }
        } else {
            None
        };
        let base_at = base
            .as_ref()
            .and_then(|b| e.vdisk(&format!("{}@{b}", req.vdisk)).ok())
            .map(|s| s.config().created);
        let o = Outgoing {
            pool: req.pool.clone(),
            vdisk: req.vdisk.clone(),
            to: req.to.clone(),
            target_pool: req.target_pool.clone(),
            target_vdisk,
            interval_secs: req.interval_secs.unwrap_or(super::DEFAULT_INTERVAL_SECS),
            bandwidth: req.bandwidth,
            rpo_secs: req.rpo_secs,
            streams: req.streams.unwrap_or(1),
            group: req.group.clone(),
            created_at: now(),
            base,
            base_at,
            ..Default::default()
        };
        self.replication.change(|s| {
            if s.outgoing.contains_key(&name) {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    code::ALREADY_EXISTS,
                    format!("replica '{name}' already exists"),
                ));
            }
            if let Some((other, _)) = s.outgoing.iter().find(|(_, x)| {
                (x.to.as_str(), x.target_pool.as_str(), x.target_vdisk.as_str())
                    == (o.to.as_str(), o.target_pool.as_str(), o.target_vdisk.as_str())
            }) {
                return Err(ApiError::invalid(format!(
                    "replica '{other}' already writes {}/{} at {}",
                    o.target_pool, o.target_vdisk, o.to
                )));
            }
            if let Some(g) = &o.group {
                // A group cycles at one instant, to one peer, on one schedule.
                if let Some((other, x)) = s.outgoing.iter().find(|(_, x)| x.group.as_ref() == Some(g)) {
                    if (x.pool.as_str(), x.to.as_str()) != (o.pool.as_str(), o.to.as_str()) {
                        return Err(ApiError::invalid(format!(
                            "group '{g}' replicates pool {} to {} (as '{other}'): its replicas share both",
                            x.pool, x.to
                        )));
                    }
                    if x.pending.is_some() {
                        return Err(ApiError::busy(format!(
                            "group '{g}' has a round under way; let it end ('tessera replica sync {other}')"
                        )));
                    }
                    let mut o = o.clone();
                    o.interval_secs = x.interval_secs;
                    o.paused = x.paused;
                    o.seq = x.seq;
                    s.outgoing.insert(name.clone(), o);
                    return Ok(());
                }
            }
            s.outgoing.insert(name.clone(), o.clone());
            Ok(())
        })?;
        self.changed(
            "replica.created",
            &req.pool,
            Some(format!("{}/{}", req.pool, req.vdisk)),
            format!(
                "replica {name}: {}/{} to {}/{} at {}{}",
                req.pool,
                req.vdisk,
                req.target_pool,
                o.target_vdisk,
                req.to,
                if req.reverse { ", reversed" } else { "" }
            ),
        );
        self.replica_view(&name)
    }

    pub fn replica_view(&self, name: &str) -> ApiResult<ReplicaView> {
        let o = self.replication.outgoing(name)?;
        Ok(self.outgoing_view(name, &o))
    }

    pub(super) fn outgoing_view(&self, name: &str, o: &Outgoing) -> ReplicaView {
        let live = self.replication.live.lock();
        let job = live
            .running
            .get(name)
            .copied()
            .filter(|&id| self.jobs.get(id).map(|j| !j.state().finished()).unwrap_or(false));
        let failing = live.failing.contains(name);
        drop(live);
        let state = if job.is_some() {
            "syncing"
        } else if o.paused {
            "paused"
        } else if failing || o.last_attempt_failed() {
            "failing"
        } else if o.base.is_none() {
            "new"
        } else {
            "idle"
        };
        let t = now();
        let rpo = o.rpo();
        ReplicaView {
            name: name.to_string(),
            pool: o.pool.clone(),
            vdisk: o.vdisk.clone(),
            to: o.to.clone(),
            target_pool: o.target_pool.clone(),
            target_vdisk: o.target_vdisk.clone(),
            group: o.group.clone(),
            state: state.to_string(),
            interval_secs: o.interval_secs,
            streams: o.streams.max(1),
            bandwidth: o.bandwidth,
            rpo_secs: (rpo > 0).then_some(rpo),
            last_snapshot: o.base.clone(),
            last_consistent_at: o.base_at,
            lag_seconds: o.lag(t) as f64,
            rpo_exceeded: rpo > 0 && o.lag(t) > rpo,
            pending_snapshot: o.pending.clone(),
            cycles: o.cycles,
            failures: o.failures,
            changed_bytes: o.changed_bytes,
            sent_bytes: o.sent_bytes,
            wire_bytes: o.wire_bytes,
            saved_bytes: o.changed_bytes.saturating_sub(o.wire_bytes),
            last_cycle: o.last_cycle.clone(),
            last_error: o.last_error.clone(),
            last_error_at: o.last_error_at,
            job,
        }
    }

    pub fn set_replica(&self, name: &str, req: SetReplica) -> ApiResult<ReplicaView> {
        check_streams(req.streams)?;
        check_schedule(req.interval_secs, req.rpo_secs)?;
        if req.bandwidth.is_some_and(|b| b > 0 && b < 4096) {
            return Err(ApiError::invalid(
                "bandwidth below 4 KiB per second would never end a cycle",
            ));
        }
        let paused = self.replication.change(|s| {
            let o = s.outgoing.get(name).ok_or_else(|| no_replica(name))?;
            let (was, pool, group) = (o.paused, o.pool.clone(), o.group.clone());
            // A group's replicas pause, resume and keep time together.
            for (n, o) in s.outgoing.iter_mut() {
                let together = n == name || (group.is_some() && o.group == group);
                if !together {
                    continue;
                }
                if let Some(p) = req.paused {
                    o.paused = p;
                }
                if let Some(i) = req.interval_secs {
                    o.interval_secs = i;
                }
                if n == name {
                    if let Some(k) = req.streams {
                        o.streams = k;
                    }
                    if let Some(b) = req.bandwidth {
                        o.bandwidth = (b > 0).then_some(b);
                    }
                    if let Some(r) = req.rpo_secs {
                        o.rpo_secs = Some(r);
                    }
                }
            }
            Ok((was, req.paused.unwrap_or(was), pool))
        })?;
        if paused.0 != paused.1 {
            // A pause stops the cycle under way; its snapshot stays pending, and the next
            // cycle, once resumed, goes on from what the replica holds.
            if paused.1 {
                if let Some(&id) = self.replication.live.lock().running.get(name) {
                    let _ = self.jobs.cancel(id);
                }
            }
            let what = if paused.1 { "paused" } else { "resumed" };
            self.changed(
                &format!("replica.{what}"),
                &paused.2,
                Some(name.to_string()),
                format!("replica {name} {what}"),
            );
        }
        self.replica_view(name)
    }

    /// Starts a cycle now.
    pub fn sync_replica(self: &Arc<Self>, name: &str) -> ApiResult<JobView> {
        let o = self.replication.outgoing(name)?;
        if o.paused {
            return Err(ApiError::invalid(format!(
                "replica '{name}' is paused; 'tessera replica resume {name}' first"
            )));
        }
        self.start_cycle(name, &o)
    }

    /// Deletes a replica: no more cycles. The source's replication snapshots go; the replica
    /// at the peer stays, as the last consistent copy, until its site deletes or promotes it.
    pub fn delete_replica(&self, name: &str) -> ApiResult<()> {
        let o = self.replication.outgoing(name)?;
        if let Some(id) = self.running_cycle(name) {
            return Err(ApiError::busy(format!(
                "replica '{name}' is in a cycle (job {id}); pause it first ('tessera replica pause {name}')"
            )));
        }
        self.replication
            .change(|s| s.outgoing.remove(name).map(|_| ()).ok_or_else(|| no_replica(name)))?;
        for snap in [o.base.as_ref(), o.pending.as_ref()].into_iter().flatten() {
            self.drop_replication_snapshot(&o.pool, &o.vdisk, snap);
        }
        self.changed(
            "replica.deleted",
            &o.pool,
            Some(name.to_string()),
            format!("replica {name} deleted (the copy at {} stays)", o.to),
        );
        Ok(())
    }

    /// Hands the source vdisk over to the peer it replicated to, whose replica has been
    /// promoted: the vdisk becomes a replica here, put back to the last snapshot both sites
    /// hold by the peer's first cycle, and then kept by its cycles. What was written here
    /// since that snapshot is given up.
    pub fn demote_replica(&self, name: &str) -> ApiResult<crate::model::IncomingReplicaView> {
        let o = self.replication.outgoing(name)?;
        if let Some(id) = self.running_cycle(name) {
            return Err(ApiError::busy(format!(
                "replica '{name}' is in a cycle (job {id}); pause it first"
            )));
        }
        let Some(base) = o.base.clone() else {
            return Err(ApiError::invalid(format!(
                "replica '{name}' has no cycle done: its peer holds nothing this vdisk could be put back to"
            )));
        };
        let target = format!("{}/{}", o.pool, o.vdisk);
        // Not presented between the question and its marking as a replica.
        let presenting = self.users.lock();
        let users = self.users_of(&target);
        if !users.is_empty() {
            return Err(ApiError::busy(format!(
                "'{target}' is presented as {}; remove it there first: the peer is about to write it",
                users.join(", ")
            )));
        }
        // Marked in the pool's metadata first, for every gateway that opens the pool.
        self.mark_replica(&o.pool, &o.vdisk, &o.to, None, true)?;
        let v = self.vdisk(&o.pool, &o.vdisk)?.1;
        self.replication.change(|s| {
            s.outgoing.remove(name).ok_or_else(|| no_replica(name))?;
            s.incoming.insert(
                target.clone(),
                Incoming {
                    source: o.to.clone(),
                    created_at: now(),
                    last_snapshot: Some(base.clone()),
                    last_snapshot_id: None,
                    last_cycle_at: o.base_at,
                    cycles: 0,
                    marked: true,
                    vdisk_id: Some(v.id()),
                    // The peer's cycles back bring its key; the first one's is kept.
                    key: None,
                },
            );
            Ok(())
        })?;
        drop(presenting);
        if let Some(p) = &o.pending {
            self.drop_replication_snapshot(&o.pool, &o.vdisk, p);
        }
        self.events.record(
            NewEvent::new(
                Severity::Warning,
                "replica.demoted",
                format!(
                    "{target} is now a replica kept by {}: writes here since {base} are given up at its next cycle",
                    o.to
                ),
            )
            .pool(&o.pool)
            .subject(&target),
        );
        self.incoming_view(&o.pool, &o.vdisk)
    }

    /// The replicas of a local vdisk.
    pub fn replicas_of(&self, pool: &str, vdisk: &str) -> Vec<String> {
        let s = self.replication.saved.lock();
        s.outgoing
            .iter()
            .filter(|(_, o)| o.pool == pool && o.vdisk == vdisk)
            .map(|(n, _)| n.clone())
            .collect()
    }
}

fn check_streams(streams: Option<u32>) -> ApiResult<()> {
    match streams {
        Some(k) if k == 0 || k > tessera_replication::wire::MAX_STREAMS => Err(ApiError::invalid(format!(
            "streams must be 1 to {}",
            tessera_replication::wire::MAX_STREAMS
        ))),
        _ => Ok(()),
    }
}

/// An interval between cycles and a recovery point objective of a year at most: longer ones
/// mean nothing for a replica, and the sums of times the schedule makes must not overflow.
fn check_schedule(interval: Option<u64>, rpo: Option<u64>) -> ApiResult<()> {
    for (what, secs) in [("interval", interval), ("recovery point objective", rpo)] {
        if secs.is_some_and(|s| s > super::MAX_SCHEDULE_SECS) {
            return Err(ApiError::invalid(format!(
                "a replica's {what} of {} s is longer than a year ({} s)",
                secs.unwrap_or_default(),
                super::MAX_SCHEDULE_SECS
            )));
        }
    }
    Ok(())
}

/// HOST:PORT, as `to` must be.
fn check_address(to: &str) -> ApiResult<()> {
    let ok = to
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0) && !h.contains(['/', ' ', '@']));
    if !ok {
        return Err(ApiError::invalid(format!("'{to}' is not HOST:PORT")));
    }
    Ok(())
}
