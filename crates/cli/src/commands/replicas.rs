//! `tessera replica`: replication of local vdisks to peers, and the replicas held here.

use tessera_server::units::format_duration;

use super::*;

pub(super) fn replica(c: &Ctx, cmd: ReplicaCmd) -> R {
    let path = |name: &str, what: &str| format!("/api/replicas/{}{what}", encode_segment(name));
    match cmd {
        ReplicaCmd::Create { replica, group } => create(c, replica, false, group),
        ReplicaCmd::Reverse { replica } => create(c, replica, true, None),
        ReplicaCmd::List => {
            let v = c.client.get("/api/replicas")?;
            c.answer(v, |l: ReplicaList| {
                print_list(&l);
                Ok(())
            })
        }
        ReplicaCmd::Show { name } => {
            if name.contains('/') {
                let (p, v) = pool_vdisk(&name)?;
                let r = c.client.get(&format!(
                    "/api/pools/{}/replicas/{}",
                    encode_segment(&p),
                    encode_segment(&v)
                ))?;
                return c.answer(r, |i: IncomingReplicaView| {
                    print_incoming(&i);
                    Ok(())
                });
            }
            let v = c.client.get(&path(&name, ""))?;
            c.answer(v, |r: ReplicaView| {
                print_replica(&r);
                Ok(())
            })
        }
        ReplicaCmd::Sync { name, no_wait } => {
            let v = c.client.post(&path(&name, "/sync"), None)?;
            sync_and_report(c, v, no_wait)
        }
        ReplicaCmd::Pause { name } => set(
            c,
            &name,
            SetReplica {
                paused: Some(true),
                ..Default::default()
            },
        ),
        ReplicaCmd::Resume { name } => set(
            c,
            &name,
            SetReplica {
                paused: Some(false),
                ..Default::default()
            },
        ),
        ReplicaCmd::Set {
            name,
            interval,
            bandwidth,
            rpo,
            streams,
        } => set(
            c,
            &name,
            SetReplica {
                paused: None,
                interval_secs: interval,
                bandwidth,
                rpo_secs: rpo,
                streams,
            },
        ),
        ReplicaCmd::Delete { name } => {
            let v = c.client.delete(&path(&name, ""))?;
            if c.json {
                c.print_json(&v);
            } else {
                println!("replica {name} deleted; the copy at the peer stays");
            }
            Ok(())
        }
        ReplicaCmd::Promote { vdisks } => {
            let mut req = PromoteReplicas::default();
            for v in &vdisks {
                let (p, v) = pool_vdisk(v)?;
                if !req.pool.is_empty() && req.pool != p {
                    return Err(ClientError::Transport(
                        "replicas promoted together are in one pool".into(),
                    ));
                }
                req.pool = p;
                req.vdisks.push(v);
            }
            let r = c.client.post("/api/replica-promotions", body(&req))?;
            c.answer(r, |ps: Vec<PromotedView>| {
                for p in ps {
                    println!(
                        "{}/{} promoted: writable, at snapshot {}; 'tessera replica reverse {}/{} --to OLD-SOURCE ...' replicates it back",
                        p.pool, p.vdisk, p.snapshot, p.pool, p.vdisk
                    );
                }
                Ok(())
            })
        }
        ReplicaCmd::Demote { name } => {
            let v = c.client.post(&path(&name, "/demote"), None)?;
            c.answer(v, |i: IncomingReplicaView| {
                println!(
                    "{}/{} is now a replica kept by {}; its next cycle puts it back to {}",
                    i.pool,
                    i.vdisk,
                    i.source,
                    i.last_snapshot.as_deref().unwrap_or("-")
                );
                Ok(())
            })
        }
    }
}

fn create(c: &Ctx, a: ReplicaArgs, reverse: bool, group: Option<String>) -> R {
    let (pool, vdisk) = pool_vdisk(&a.vdisk)?;
    let req = CreateReplica {
        pool,
        vdisk,
        to: a.to,
        target_pool: a.target_pool,
        target_vdisk: a.target_vdisk,
        name: a.name,
        interval_secs: a.interval,
        bandwidth: a.bandwidth,
        rpo_secs: a.rpo,
        streams: a.streams,
        reverse,
        group,
    };
    let v = c.client.post("/api/replicas", body(&req))?;
    c.answer(v, |r: ReplicaView| {
        println!(
            "replica {}: {}/{} to {}/{} at {}, {}{}",
            r.name,
            r.pool,
            r.vdisk,
            r.target_pool,
            r.target_vdisk,
            r.to,
            every(r.interval_secs),
            r.last_snapshot
                .as_deref()
                .map(|s| format!(", from the common snapshot {s}"))
                .unwrap_or_default()
        );
        Ok(())
    })
}

fn set(c: &Ctx, name: &str, req: SetReplica) -> R {
    let v = c
        .client
        .put(&format!("/api/replicas/{}", encode_segment(name)), body(&req))?;
    c.answer(v, |r: ReplicaView| {
        println!(
            "replica {}: {}, {}, bandwidth {}, RPO {}",
            r.name,
            r.state,
            every(r.interval_secs),
            r.bandwidth
                .map(|b| format!("{}/s", size(b)))
                .unwrap_or_else(|| "unlimited".into()),
            r.rpo_secs.map(format_duration_secs).unwrap_or_else(|| "none".into())
        );
        Ok(())
    })
}

/// Follows a cycle, then prints what crossed the wire.
fn sync_and_report(c: &Ctx, v: Value, no_wait: bool) -> R {
    if no_wait || c.json {
        return follow(c, v, no_wait);
    }
    let (job, _) = super::jobs::wait_for(c, v)?;
    if job.state != JobState::Succeeded {
        return Err(ClientError::Transport(format!(
            "job {} (replication of {}) {}: {}",
            job.id,
            job.target,
            job.state.as_str(),
            job.error.as_deref().unwrap_or("no reason given")
        )));
    }
    let result = job.result.clone().unwrap_or_default();
    if result.is_array() {
        let cycles: Vec<ReplicaCycleView> = read(result)?;
        for (k, r) in cycles.iter().enumerate() {
            if k > 0 {
                println!();
            }
            print_cycle(r);
        }
        return Ok(());
    }
    let r: ReplicaCycleView = read(result)?;
    print_cycle(&r);
    Ok(())
}

fn every(secs: u64) -> String {
    if secs == 0 {
        "cycles when asked".into()
    } else {
        format!("a cycle every {}", format_duration_secs(secs))
    }
}

fn format_duration_secs(s: u64) -> String {
    format_duration(std::time::Duration::from_secs(s))
}

fn link_line(l: &LinkView) -> String {
    format!(
        "RTT {:.1} ms, {} of {} segments retransmitted ({:.2}%), goodput {}/s",
        l.rtt_ms,
        l.retransmits,
        l.segments_out,
        l.retransmit_percent,
        size(l.goodput as u64)
    )
}

fn print_cycle(r: &ReplicaCycleView) {
    let mut streams: Vec<(String, String)> = r
        .streams
        .iter()
        .enumerate()
        .map(|(k, l)| (format!("  stream {k}"), link_line(l)))
        .collect();
    if !streams.is_empty() {
        streams.insert(0, ("streams".into(), r.streams.len().to_string()));
    }
    kv(&[
        ("snapshot", r.snapshot.clone()),
        ("kind", if r.full { "full" } else { "incremental" }.into()),
        ("took", format!("{:.1}s", r.seconds)),
        ("changed", size(r.changed_bytes)),
        ("sent", format!("{} (blocks the replica lacked)", size(r.sent_bytes))),
        (
            "on the wire",
            format!("{} (compressed, with fingerprints)", size(r.wire_bytes)),
        ),
        ("link", link_line(&r.link)),
    ]);
    if !streams.is_empty() {
        let pairs: Vec<(&str, String)> = streams.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        kv(&pairs);
    }
}

fn print_replica(r: &ReplicaView) {
    kv(&[
        ("replica", r.name.clone()),
        ("source", format!("{}/{}", r.pool, r.vdisk)),
        ("group", opt(&r.group)),
        ("to", format!("{}/{} at {}", r.target_pool, r.target_vdisk, r.to)),
        ("state", r.state.clone()),
        ("schedule", every(r.interval_secs)),
        ("streams", r.streams.to_string()),
        (
            "bandwidth",
            r.bandwidth
                .map(|b| format!("{}/s", size(b)))
                .unwrap_or_else(|| "unlimited".into()),
        ),
        ("last consistent", opt(&r.last_snapshot)),
        (
            "lag",
            format!(
                "{}{}",
                format_duration_secs(r.lag_seconds as u64),
                match (r.rpo_secs, r.rpo_exceeded) {
                    (Some(rpo), true) => format!(" (beyond the RPO of {})", format_duration_secs(rpo)),
                    (Some(rpo), false) => format!(" (RPO {})", format_duration_secs(rpo)),
                    (None, _) => String::new(),
                }
            ),
        ),
        ("pending", opt(&r.pending_snapshot)),
        ("cycles", format!("{} done, {} failed", r.cycles, r.failures)),
        ("changed", size(r.changed_bytes)),
        ("sent", size(r.sent_bytes)),
        ("on the wire", size(r.wire_bytes)),
        ("saved", size(r.saved_bytes)),
        (
            "last error",
            r.last_error
                .as_ref()
                .map(|e| format!("{e} ({})", when(r.last_error_at.unwrap_or(0))))
                .unwrap_or_else(|| "-".into()),
        ),
    ]);
    if let Some(l) = &r.last_cycle {
        println!("last cycle ({}):", when(l.started_at));
        print_cycle(l);
    }
}

fn print_incoming(i: &IncomingReplicaView) {
    kv(&[
        (
            "replica",
            format!("{}/{} (read-only: kept by its source)", i.pool, i.vdisk),
        ),
        ("source", i.source.clone()),
        ("last consistent", opt(&i.last_snapshot)),
        ("last cycle", i.last_cycle_at.map(when).unwrap_or_else(|| "-".into())),
        ("cycles", i.cycles.to_string()),
        ("receiving", if i.receiving { "yes" } else { "no" }.into()),
        ("snapshots", i.snapshots.join(", ")),
    ]);
}

fn print_list(l: &ReplicaList) {
    let t = tessera_server::jobs::unix_now();
    if !l.outgoing.is_empty() {
        let rows = l
            .outgoing
            .iter()
            .map(|r| {
                vec![
                    r.name.clone(),
                    format!("{}/{}", r.pool, r.vdisk),
                    format!("{}/{}@{}", r.target_pool, r.target_vdisk, r.to),
                    r.state.clone(),
                    format_duration_secs(r.lag_seconds as u64) + if r.rpo_exceeded { " !" } else { "" },
                    opt(&r.last_snapshot),
                    size(r.wire_bytes),
                ]
            })
            .collect();
        table(
            &["NAME", "SOURCE", "REPLICA", "STATE", "LAG", "LAST SNAPSHOT", "WIRE"],
            rows,
        );
    }
    if !l.incoming.is_empty() {
        if !l.outgoing.is_empty() {
            println!();
        }
        let rows = l
            .incoming
            .iter()
            .map(|i| {
                vec![
                    format!("{}/{}", i.pool, i.vdisk),
                    i.source.clone(),
                    opt(&i.last_snapshot),
                    i.last_cycle_at
                        .map(|a| format!("{} ago", format_duration_secs(t.saturating_sub(a))))
                        .unwrap_or_else(|| "-".into()),
                    if i.receiving { "receiving" } else { "idle" }.into(),
                ]
            })
            .collect();
        table(
            &["HELD FOR A PEER", "FROM", "LAST SNAPSHOT", "LAST CYCLE", "STATE"],
            rows,
        );
    }
    if l.outgoing.is_empty() && l.incoming.is_empty() {
        println!("no replicas; 'tessera replica create POOL/VDISK --to HOST:PORT --target-pool P' makes one");
    }
    match &l.listen {
        Some(a) => println!("replication listener: {a}"),
        None => println!("replication listener: off (replication_listen)"),
    }
}
