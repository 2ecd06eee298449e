//! Cycles of replicas of local vdisks: each a job that takes (or goes on with) a snapshot,
//! sends it over one stream or several, and records how it went; a consistency group's
//! replicas cycle in one job, their snapshots taken at one instant.

use std::sync::Arc;
use std::time::Instant;

use tessera_replication::transport::{link_stats, Paced};
use tessera_replication::{send_streams, ReplError, Target, Transport};
use tessera_volume::Progress;
use tracing::{info, warn};

use super::{no_replica, now, Outgoing, Saved, SNAPSHOT_PREFIX};
use crate::error::{ApiError, ApiResult};
use crate::events::{NewEvent, Severity};
use crate::jobs::JobView;
use crate::model::{LinkView, ReplicaCycleView};
use crate::Daemon;

impl Daemon {
    pub(super) fn running_cycle(&self, name: &str) -> Option<u64> {
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

    pub(super) fn start_cycle(self: &Arc<Self>, name: &str, o: &Outgoing) -> ApiResult<JobView> {
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
        // Those whose last delivered round is older go first: a round stops at its first
        // failure, so a member never gets two rounds ahead of another at the replica, whose
        // pruning would then leave the group no snapshot in common to promote to.
        let mut order: Vec<&String> = members.iter().collect();
        order.sort_by_key(|m| {
            self.replication
                .outgoing(m)
                .ok()
                .and_then(|o| o.base.as_deref().and_then(round_number))
        });
        for m in order {
            let started_at = now();
            let Ok(o) = self.replication.outgoing(m) else { continue };
            if o.pending.is_none() {
                continue; // done in this round already, before a cut
            }
            let out = self.run_cycle(&o, started_at, progress);
            if let (Err(e), true) = (&out, progress.cancel.load(std::sync::atomic::Ordering::Relaxed)) {
                // Paused, or the daemon stops: not a failure. The snapshot stays pending.
                self.replication
                    .change(|s| {
                        if let Some(x) = s.outgoing.get_mut(m) {
                            x.last_attempt_at = Some(started_at);
                        }
                        Ok(())
                    })
                    .map_err(|e| e.message)?;
                return Err(e.clone());
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
                number_new_round(s, members, at);
                Ok(())
            })
            .map_err(|e| e.message)?;
        // Pending snapshots that do not exist yet: a new round, or one whose snapshots a
        // crash kept from being taken (a round's are taken together).
        let (mut missing, mut present, mut done) = (Vec::new(), Vec::new(), false);
        for m in members {
            let Ok(o) = self.replication.outgoing(m) else { continue };
            let Some(p) = o.pending else {
                done = true; // its cycle of this round is over
                continue;
            };
            let e = self.engine(&o.pool).map_err(|e| e.message)?;
            let pair = (o.pool.clone(), o.vdisk.clone(), p.clone());
            if e.vdisk(&format!("{}@{p}", o.vdisk)).is_err() {
                missing.push(pair);
            } else {
                present.push(pair);
            }
        }
        // A round torn (some of its snapshots there, some not: a crash between the members'
        // fills, or a rollback that could not delete): taken now, the missing ones would be
        // of a later instant than the others under the same name, and a promotion at the
        // replica would put the two instants together. The round is given up and taken
        // again whole under a new number.
        if !missing.is_empty() && (!present.is_empty() || done) {
            // Numbered anew before anything goes: a failure between leaves a snapshot of the
            // old number behind (deleted by hand), never a round whose number is taken twice.
            let at = now();
            self.replication
                .change(|s| {
                    number_new_round(s, members, at);
                    Ok(())
                })
                .map_err(|e| e.message)?;
            warn!(members = ?members, "a round of a consistency group lacked some of its snapshots: taken again whole, under a new number");
            for (pool, vdisk, p) in &present {
                self.drop_replication_snapshot(pool, vdisk, p);
            }
            missing.clear();
            for m in members {
                let Ok(o) = self.replication.outgoing(m) else { continue };
                if let Some(p) = o.pending {
                    missing.push((o.pool.clone(), o.vdisk.clone(), p));
                }
            }
        }
        let mut by_pool: std::collections::BTreeMap<String, Vec<(String, String)>> = Default::default();
        for (pool, vdisk, p) in missing {
            by_pool.entry(pool).or_default().push((vdisk, p));
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
        // Nothing presents it between the question and its delete.
        let _users = self.users.lock();
        if e.vdisk(&full).is_err() || !self.users_of(&format!("{pool}/{full}")).is_empty() {
            return;
        }
        if let Err(err) = e.delete_vdisk(&full) {
            warn!(pool, snapshot = %full, error = %err, "cannot delete an old replication snapshot");
        }
    }
}

/// Gives every member of a round the next round number (after the highest any of them had)
/// and its snapshot's name, pending since `at`.
fn number_new_round(s: &mut Saved, members: &[String], at: u64) {
    let seq = members
        .iter()
        .filter_map(|m| s.outgoing.get(m))
        .map(|o| o.seq)
        .max()
        .unwrap_or(0)
        + 1;
    for m in members {
        if let Some(x) = s.outgoing.get_mut(m) {
            let key = x.group.clone().unwrap_or_else(|| m.clone());
            x.seq = seq;
            x.pending = Some(format!("{SNAPSHOT_PREFIX}{key}-{seq}"));
            x.pending_at = Some(at);
        }
    }
}

/// The round number of a replication snapshot's name (`repl-KEY-N`).
fn round_number(snapshot: &str) -> Option<u64> {
    snapshot.rsplit_once('-')?.1.parse().ok()
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
