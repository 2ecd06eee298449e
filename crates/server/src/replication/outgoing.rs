//! The source side: replicas of local vdisks, their cycles (one job each) and schedule, the
//! RPO watch, and demotion (a source that hands its vdisk over to the peer it replicated to).

use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use tessera_replication::transport::{link_stats, Paced};
use tessera_replication::{send_streams, ReplError, Target, Transport};
use tessera_volume::Progress;
use tracing::{info, warn};

use super::{check_name, no_replica, now, Incoming, Outgoing, RETRY_SECS, SNAPSHOT_PREFIX};
use crate::error::{code, ApiError, ApiResult};
use crate::events::{NewEvent, Severity};
use crate::jobs::JobView;
use crate::model::{CreateReplica, LinkView, ReplicaCycleView, ReplicaView, SetReplica};
use crate::Daemon;

impl Daemon {
    pub fn create_replica(self: &Arc<Self>, req: CreateReplica) -> ApiResult<ReplicaView> {
        let (e, v) = self.vdisk(&req.pool, &req.vdisk)?;
        if v.is_snapshot() {
            return Err(ApiError::invalid(format!(
                "'{}' is a snapshot; replicate its vdisk (each cycle takes its own snapshot)",
                req.vdisk
            )));
        }
        if self.replication.is_incoming(&req.pool, &req.vdisk) {
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
            let last = e
                .snapshots_of(&req.vdisk)
                .into_iter()
                .rev()
                .map(|s| s.name())
                .filter_map(|n| n.split_once('@').map(|(_, s)| s.to_string()))
                .find(|s| s.starts_with(SNAPSHOT_PREFIX));
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
        } else if failing || (o.last_error_at.is_some() && o.last_error_at == o.last_attempt_at) {
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
        let users = self.users_of(&target);
        if !users.is_empty() {
            return Err(ApiError::busy(format!(
                "'{target}' is presented as {}; remove it there first: the peer is about to write it",
                users.join(", ")
            )));
        }
        self.replication.change(|s| {
            s.outgoing.remove(name).ok_or_else(|| no_replica(name))?;
            s.incoming.insert(
                target.clone(),
                Incoming {
                    source: o.to.clone(),
                    created_at: now(),
                    last_snapshot: Some(base.clone()),
                    last_cycle_at: o.base_at,
                    cycles: 0,
                },
            );
            Ok(())
        })?;
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

    fn running_cycle(&self, name: &str) -> Option<u64> {
        let id = *self.replication.live.lock().running.get(name)?;
        self.jobs.get(id).ok().filter(|j| !j.state().finished()).map(|j| j.id)
    }

    /// The replicas that cycle together with `name`: its consistency group, or itself.
    fn members(&self, name: &str, o: &Outgoing) -> Vec<String> {
        match &o.group {
            None => vec![name.to_string()],
            Some(g) => self
                .replication
                .saved
                .lock()
                .outgoing
                .iter()
                .filter(|(_, x)| x.group.as_ref() == Some(g))
                .map(|(n, _)| n.clone())
                .collect(),
        }
    }

    fn start_cycle(self: &Arc<Self>, name: &str, o: &Outgoing) -> ApiResult<JobView> {
        if self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ApiError::busy("the daemon is stopping"));
        }
        let members = self.members(name, o);
        let mut live = self.replication.live.lock();
        for m in &members {
            if let Some(j) = live.running.get(m).and_then(|id| self.jobs.get(*id).ok()) {
                if !j.state().finished() {
                    return Ok(j.view());
                }
            }
        }
        let vdisks: Vec<String> = {
            let saved = self.replication.saved.lock();
            members
                .iter()
                .filter_map(|m| saved.outgoing.get(m).map(|x| x.vdisk.clone()))
                .collect()
        };
        let d = self.clone();
        let names = members.clone();
        let job = self
            .jobs
            .spawn("replicate", &format!("{}/{}", o.pool, vdisks.join("+")), move |p| {
                d.round(&names, p)
            });
        for m in members {
            live.running.insert(m, job.id);
        }
        Ok(job.view())
    }

    /// A round of cycles of replicas that go together: each goes on with the snapshot of a
    /// cycle cut short, or, when none was cut short, all take new snapshots at one instant.
    /// The result is the cycle's report, or the list of them for a group.
    fn round(&self, members: &[String], progress: &Progress) -> Result<serde_json::Value, String> {
        self.take_round_snapshots(members).inspect_err(|e| {
            for m in members {
                let _ = self.record_cycle(m, now(), &Err(e.clone()));
            }
        })?;
        let mut views = Vec::new();
        for m in members {
            let started_at = now();
            let Ok(o) = self.replication.outgoing(m) else { continue };
            if o.pending.is_none() {
                continue; // done in this round already, before a cut
            }
            let out = self.run_cycle(&o, started_at, progress);
            if out.is_err() && progress.cancel.load(std::sync::atomic::Ordering::Relaxed) {
                // Paused, or the daemon stops: not a failure. The snapshot stays pending.
                self.replication
                    .change(|s| {
                        if let Some(x) = s.outgoing.get_mut(m) {
                            x.last_attempt_at = Some(started_at);
                        }
                        Ok(())
                    })
                    .map_err(|e| e.message)?;
                return out.map(|_| serde_json::Value::Null);
            }
            let view = self.record_cycle(m, started_at, &out)?;
            views.push(view);
        }
        Ok(match (members.len(), views.pop()) {
            (1, Some(v)) => serde_json::to_value(v).expect("serializable"),
            (_, last) => {
                views.extend(last);
                serde_json::to_value(views).expect("serializable")
            }
        })
    }

    /// Makes sure every replica of the round has its snapshot: a new round when none has one
    /// pending, named and saved before it is taken (so that a crash between leaves none
    /// unnamed), and taken together.
    fn take_round_snapshots(&self, members: &[String]) -> Result<(), String> {
        let at = now();
        self.replication
            .change(|s| {
                let all: Vec<&Outgoing> = members.iter().filter_map(|m| s.outgoing.get(m)).collect();
                if all.iter().any(|o| o.pending.is_some()) {
                    return Ok(());
                }
                let seq = all.iter().map(|o| o.seq).max().unwrap_or(0) + 1;
                for m in members {
                    if let Some(x) = s.outgoing.get_mut(m) {
                        let key = x.group.clone().unwrap_or_else(|| m.clone());
                        x.seq = seq;
                        x.pending = Some(format!("{SNAPSHOT_PREFIX}{key}-{seq}"));
                        x.pending_at = Some(at);
                    }
                }
                Ok(())
            })
            .map_err(|e| e.message)?;
        // Pending snapshots that do not exist yet: a new round, or one whose snapshots a
        // crash kept from being taken (all or none of a round are).
        let mut by_pool: std::collections::BTreeMap<String, Vec<(String, String)>> = Default::default();
        for m in members {
            let Ok(o) = self.replication.outgoing(m) else { continue };
            let Some(p) = o.pending else { continue };
            let e = self.engine(&o.pool).map_err(|e| e.message)?;
            if e.vdisk(&format!("{}@{p}", o.vdisk)).is_err() {
                by_pool.entry(o.pool.clone()).or_default().push((o.vdisk.clone(), p));
            }
        }
        for (pool, pairs) in by_pool {
            let e = self.engine(&pool).map_err(|e| e.message)?;
            let refs: Vec<(&str, &str)> = pairs.iter().map(|(v, s)| (v.as_str(), s.as_str())).collect();
            e.snapshot_group(&refs).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Records how a cycle ended, drops the snapshot it made old, and tells of failures
    /// (once a streak) and of recoveries.
    fn record_cycle(
        &self,
        name: &str,
        started_at: u64,
        out: &Result<(String, u64, ReplicaCycleView), String>,
    ) -> Result<ReplicaCycleView, String> {
        let o = self.replication.outgoing(name).map_err(|e| e.message)?;
        let outcome = self.replication.change(|s| {
            let x = s.outgoing.get_mut(name).ok_or_else(|| no_replica(name))?;
            x.last_attempt_at = Some(started_at);
            match out {
                Ok((snap, snap_at, view)) => {
                    x.cycles += 1;
                    let old = x.base.replace(snap.clone()).filter(|b| b != snap);
                    x.base_at = Some(*snap_at);
                    x.pending = None;
                    x.pending_at = None;
                    x.changed_bytes += view.changed_bytes;
                    x.sent_bytes += view.sent_bytes;
                    x.wire_bytes += view.wire_bytes;
                    x.last_cycle = Some(view.clone());
                    x.last_error = None;
                    Ok(old)
                }
                Err(e) => {
                    x.failures += 1;
                    x.last_error = Some(e.clone());
                    x.last_error_at = Some(started_at);
                    Ok(None)
                }
            }
        });
        let old_base = outcome.map_err(|e| e.message)?;
        let subject = format!("{}/{}", o.pool, o.vdisk);
        match out {
            Ok((_, _, view)) => {
                if let Some(old) = old_base {
                    self.drop_replication_snapshot(&o.pool, &o.vdisk, &old);
                }
                if self.replication.live.lock().failing.remove(name) {
                    self.events.record(
                        NewEvent::new(
                            Severity::Info,
                            "replica.recovered",
                            format!("replica {name} to {} completed a cycle again", o.to),
                        )
                        .pool(&o.pool)
                        .subject(&subject),
                    );
                }
                info!(replica = name, snapshot = %view.snapshot, sent = view.sent_bytes, wire = view.wire_bytes, "replication cycle done");
                Ok(view.clone())
            }
            Err(e) => {
                if self.replication.live.lock().failing.insert(name.to_string()) {
                    self.events.record(
                        NewEvent::new(
                            Severity::Warning,
                            "replica.cycle_failed",
                            format!("replica {name} to {}: {e}", o.to),
                        )
                        .pool(&o.pool)
                        .subject(&subject),
                    );
                }
                warn!(replica = name, error = %e, "replication cycle failed");
                Err(e.clone())
            }
        }
    }

    /// Sends the replica's pending snapshot.
    fn run_cycle(
        &self,
        o: &Outgoing,
        started_at: u64,
        progress: &Progress,
    ) -> Result<(String, u64, ReplicaCycleView), String> {
        let (e, _) = self.vdisk(&o.pool, &o.vdisk).map_err(|e| e.message)?;
        let (Some(snap), Some(snap_at)) = (o.pending.clone(), o.pending_at) else {
            return Err("no snapshot to send".into());
        };
        let newer = e.vdisk(&format!("{}@{snap}", o.vdisk)).map_err(|e| e.to_string())?;
        let base = o
            .base
            .as_ref()
            .and_then(|b| e.vdisk(&format!("{}@{b}", o.vdisk)).ok().map(|v| (v, b.clone())));
        let transport = Transport::from_psk_file(&self.cfg.replication_psk_file, &self.cfg.replication_congestion)
            .map_err(|e| format!("replication keys: {e}"))?;
        let streams = o.streams.max(1);
        // The bandwidth cap is shared out between the streams.
        let rate = o.bandwidth.map(|b| (b / streams as u64).max(1));
        let started = Instant::now();
        let conn = transport.connect(&o.to)?;
        let mut sockets = vec![conn.get_ref().try_clone().map_err(|e| e.to_string())?];
        let mut paced = Paced::new(conn, rate);
        let mut open = || {
            let c = transport
                .connect(&o.to)
                .map_err(|e| ReplError::Io(std::io::Error::other(e)))?;
            sockets.push(c.get_ref().try_clone()?);
            Ok(Paced::new(c, rate))
        };
        let to = Target {
            pool: &o.target_pool,
            replica: &o.target_vdisk,
            snapshot: &snap,
        };
        let sent = send_streams(
            &mut paced,
            streams,
            &mut open,
            &newer,
            base.as_ref().map(|(v, n)| (&**v, n.as_str())),
            &to,
            progress,
        );
        let seconds = started.elapsed().as_secs_f64();
        let r = sent.map_err(|e| match e {
            ReplError::Cancelled if self.stopping.load(std::sync::atomic::Ordering::Relaxed) => {
                "stopped with the daemon; the next cycle goes on from what the replica holds".to_string()
            }
            e => e.to_string(),
        })?;
        let per_stream: Vec<LinkView> = sockets
            .iter()
            .map(|s| {
                let l = link_stats(s);
                link_view(
                    l.rtt_us as f64 / 1000.0,
                    l.retransmits as u64,
                    l.segments_out as u64,
                    l.bytes_acked as f64 / seconds.max(1e-9),
                    l.delivery_rate,
                )
            })
            .collect();
        // The cycle as a whole: the control stream's round trip, every stream's segments, the
        // cycle's bytes over its time.
        let link = link_view(
            per_stream.first().map(|l| l.rtt_ms).unwrap_or(0.0),
            per_stream.iter().map(|l| l.retransmits).sum(),
            per_stream.iter().map(|l| l.segments_out).sum(),
            if seconds > 0.0 {
                r.wire_bytes as f64 / seconds
            } else {
                0.0
            },
            per_stream.iter().map(|l| l.delivery_rate).sum(),
        );
        let view = ReplicaCycleView {
            snapshot: snap.clone(),
            started_at,
            seconds,
            full: r.full && !r.complete,
            changed_bytes: r.changed_bytes,
            sent_bytes: r.sent_bytes,
            wire_bytes: r.wire_bytes,
            link,
            streams: if per_stream.len() > 1 { per_stream } else { Vec::new() },
        };
        Ok((snap, snap_at, view))
    }

    /// Deletes a snapshot a cycle took, unless something presents it (then it stays, and is
    /// the administrator's to delete).
    pub(super) fn drop_replication_snapshot(&self, pool: &str, vdisk: &str, snap: &str) {
        let full = format!("{vdisk}@{snap}");
        let Ok(e) = self.engine(pool) else { return };
        if e.vdisk(&full).is_err() || !self.users_of(&format!("{pool}/{full}")).is_empty() {
            return;
        }
        if let Err(err) = e.delete_vdisk(&full) {
            warn!(pool, snapshot = %full, error = %err, "cannot delete an old replication snapshot");
        }
    }

    /// Starts the cycles that are due, and tells of replicas past their RPO and back.
    pub fn replication_tick(self: &Arc<Self>) {
        if self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
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
            let failed = o.last_error_at.is_some() && o.last_error_at == o.last_attempt_at;
            let due = match o.last_attempt_at {
                None => true,
                Some(a) if failed => {
                    let retry = match o.interval_secs {
                        0 => RETRY_SECS,
                        i => RETRY_SECS.min(i),
                    };
                    t >= a + retry
                }
                // A cycle cut short by a restart goes on at once.
                Some(_) if o.pending.is_some() => true,
                Some(a) => t >= a + o.interval_secs,
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

fn check_streams(streams: Option<u32>) -> ApiResult<()> {
    match streams {
        Some(k) if k == 0 || k > tessera_replication::wire::MAX_STREAMS => Err(ApiError::invalid(format!(
            "streams must be 1 to {}",
            tessera_replication::wire::MAX_STREAMS
        ))),
        _ => Ok(()),
    }
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

fn link_view(rtt_ms: f64, retransmits: u64, segments_out: u64, goodput: f64, delivery_rate: u64) -> LinkView {
    LinkView {
        rtt_ms,
        retransmits,
        segments_out,
        retransmit_percent: if segments_out > 0 {
            100.0 * retransmits as f64 / segments_out as f64
        } else {
            0.0
        },
        goodput,
        delivery_rate,
    }
}
