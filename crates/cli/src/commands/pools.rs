//! `tessera pool` and `tessera disk`.

use super::*;

pub(super) fn pool(c: &Ctx, cmd: PoolCmd) -> R {
    match cmd {
        PoolCmd::Create {
            name,
            disks,
            cache_disks,
            slab_size,
            rados,
            capacity,
        } => {
            let disks: Vec<String> = disks.iter().map(|d| abs(d)).collect::<Result<_, _>>()?;
            let cache_disks: Vec<String> = cache_disks.iter().map(|d| abs(d)).collect::<Result<_, _>>()?;
            let req = CreatePool {
                name: name.clone(),
                disks,
                slab_size,
                cache_disks,
                rados: placement(&rados)?,
                capacity,
            };
            let v = c.client.post("/api/pools", body(&req))?;
            c.answer(v, |p: PoolSummary| {
                match &p.rados {
                    Some(r) => println!(
                        "pool {name} created in RADOS pool {}: {}, owned by gateway {} at epoch {}",
                        r.rados_pool,
                        opt_size(p.capacity.map(|c| c.total_bytes)),
                        r.owner.as_deref().unwrap_or("?"),
                        r.epoch.map(|e| e.to_string()).unwrap_or_else(|| "?".into())
                    ),
                    None => println!(
                        "pool {name} created: {} disk(s), {}",
                        p.disks,
                        opt_size(p.capacity.map(|c| c.total_bytes))
                    ),
                }
                Ok(())
            })?;
        }
        PoolCmd::List => {
            let v = c.client.get("/api/pools")?;
            c.answer(v, |pools: Vec<PoolSummary>| {
                pool_table(&pools);
                Ok(())
            })?;
        }
        PoolCmd::Show { name } => {
            let v = c.client.get(&format!("/api/pools/{}", encode_segment(&name)))?;
            c.answer(v, |p: PoolDetail| {
                show_pool(&p);
                Ok(())
            })?;
        }
        PoolCmd::Destroy { name, abandon: false } => {
            c.client.delete(&format!("/api/pools/{}", encode_segment(&name)))?;
            if !c.json {
                println!("pool {name} destroyed");
            }
        }
        PoolCmd::Destroy { name, abandon: true } => {
            c.client
                .post(&format!("/api/pools/{}/abandon-destroy", encode_segment(&name)), None)?;
            if !c.json {
                println!(
                    "the destruction of pool {name} is abandoned: what is left of it stays in the cluster, not imported here ('tessera pool import' lists it)"
                );
            }
        }
        PoolCmd::Import { name: None, .. } => {
            let v = c.client.get("/api/pools/importable")?;
            c.answer(v, |pools: Vec<ImportablePool>| {
                let rows = pools.into_iter().map(|p| vec![p.name, p.dir]).collect();
                table(&["NAME", "DIRECTORY"], rows);
                Ok(())
            })?;
        }
        PoolCmd::Import {
            name: Some(name),
            rados,
            without_log,
        } => {
            let req = ImportPool {
                name: name.clone(),
                rados: placement(&rados)?,
                without_log,
            };
            let v = c.client.post("/api/pools/import", body(&req))?;
            c.answer(v, |p: PoolSummary| {
                println!("pool {name} imported: {}", p.health);
                if let Some(problem) = p.problem {
                    println!("  {problem}");
                }
                Ok(())
            })?;
        }
        PoolCmd::Export { name } => {
            c.client
                .post(&format!("/api/pools/{}/export", encode_segment(&name)), None)?;
            if !c.json {
                println!("pool {name} exported; 'tessera pool import {name}' brings it back");
            }
        }
        PoolCmd::Move {
            name,
            to,
            wait,
            no_wait,
        } => {
            let path = format!("/api/pools/{}", encode_segment(&name));
            c.client
                .post(&format!("{path}/move"), body(&MovePool { to: to.clone() }))?;
            if no_wait {
                if !c.json {
                    println!("pool {name} to move to gateway {to}; 'tessera pool list' shows its owner");
                }
                return Ok(());
            }
            let asked = std::time::Instant::now();
            let mut owner;
            let epoch = loop {
                let detail = c.client.get(&path)?;
                owner = detail["rados"]["owner"].as_str().map(String::from);
                // A gateway that is neither end of the move shows it handed over (epoch 0)
                // before the other takes it, which may yet fail: taken is at an epoch.
                let epoch = detail["rados"]["epoch"].as_i64();
                if owner.as_deref() == Some(to.as_str()) && epoch.is_some_and(|e| e > 0) {
                    break epoch;
                }
                if asked.elapsed() >= std::time::Duration::from_secs(wait) {
                    return Err(ClientError::Transport(format!(
                        "pool {name} is not served by gateway {to} after {wait} s ({}); the move goes on: a job running on the pool at its owner keeps it there until the job ends ('tessera job list' there), and 'tessera events' at either gateway says what happened",
                        match &owner {
                            Some(o) if epoch == Some(0) => format!("handed over to gateway {o}, not taken yet"),
                            Some(o) => format!("owned by gateway {o}"),
                            None => "owned by no gateway now".to_string(),
                        }
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(250));
            };
            // Owned there: served once that gateway has opened it (its LUNs report transitioning
            // meanwhile, which hosts retry).
            let took = asked.elapsed().as_secs_f64();
            if c.json {
                println!(
                    "{}",
                    serde_json::json!({ "pool": name, "owner": to, "epoch": epoch, "seconds": took })
                );
            } else {
                println!(
                    "pool {name} moved to gateway {to}{} in {took:.1} s; it serves the pool once it has opened it",
                    epoch.map(|e| format!(" (epoch {e})")).unwrap_or_default()
                );
            }
        }
        PoolCmd::Repair {
            name,
            parallel,
            rate,
            no_wait,
        } => {
            let req = RepairPool {
                parallel,
                rate_limit: rate,
            };
            start_or_follow(c, "repair", &name, body(&req), no_wait)?;
        }
        PoolCmd::Scrub { name, pause: true, .. } => {
            let v = c
                .client
                .post(&format!("/api/pools/{}/scrub/pause", encode_segment(&name)), None)?;
            c.answer(v, |s: ScrubView| {
                println!("pool {name}: scrub paused; 'tessera pool scrub {name}' goes on from where it stopped");
                if let Some(p) = &s.current {
                    println!("  so far: {}", scrub_line(p));
                }
                Ok(())
            })?;
        }
        PoolCmd::Scrub {
            name, rate, no_wait, ..
        } => {
            let req = ScrubPool { rate_limit: rate };
            start_or_follow(c, "scrub", &name, body(&req), no_wait)?;
        }
        PoolCmd::Scan {
            name,
            no_wait,
            last,
            after,
            limit,
        } => {
            if last {
                show_findings(c, &name, after, limit)?;
            } else {
                metadata_job(c, "scan", &name, no_wait, after, limit)?;
            }
        }
        PoolCmd::Spotfix { name, no_wait } => {
            metadata_job(c, "spotfix", &name, no_wait, 0, 100)?;
        }
        PoolCmd::AutoRepair { name, state } => {
            let req = SetAutoRepair { enabled: state == "on" };
            let v = c
                .client
                .put(&format!("/api/pools/{}/auto-repair", encode_segment(&name)), body(&req))?;
            c.answer(v, |p: PoolSummary| {
                println!(
                    "pool {name}: automatic repair {}",
                    if p.auto_repair.enabled { "on" } else { "off" }
                );
                if let Some(s) = p.auto_repair.status {
                    println!("  {s}");
                }
                Ok(())
            })?;
        }
        PoolCmd::Check { name } => {
            let v = c
                .client
                .post(&format!("/api/pools/{}/check", encode_segment(&name)), None)?;
            c.answer(v, |r: tessera_volume::CheckReport| {
                println!(
                    "pool {name}: {} grain(s) mapped, {} slot(s) referenced, {} problem(s)",
                    r.grains_mapped,
                    r.slots_referenced,
                    r.problems.len()
                );
                for p in &r.problems {
                    println!("  {p}");
                }
                if r.problems.is_empty() {
                    Ok(())
                } else {
                    Err(ClientError::Transport(format!("pool {name} failed its check")))
                }
            })?;
        }
    }
    Ok(())
}

/// The placement `--rados` and its companions give, if any.
fn placement(a: &RadosArgs) -> Result<Option<RadosPlacement>, ClientError> {
    let Some(pool) = &a.rados else { return Ok(None) };
    Ok(Some(RadosPlacement {
        pool: pool.clone(),
        ceph_conf: a.ceph_conf.as_deref().map(abs).transpose()?,
        client_name: a.client_name.clone(),
    }))
}

/// One line on a pool on RADOS: where, and who serves it (none, once it is being destroyed
/// here).
fn rados_line(r: &RadosPoolView, health: PoolHealth) -> String {
    let owner = match (&r.owner, r.epoch) {
        (_, Some(e)) if health == PoolHealth::Destroying => format!("being destroyed here (owned at epoch {e})"),
        _ if health == PoolHealth::Destroying => "being destroyed here".to_string(),
        (Some(o), Some(e)) if r.here => format!("owned here (gateway {o}, epoch {e})"),
        // Handed over to it, not taken yet.
        (Some(o), Some(0)) => format!("handed over to gateway {o}"),
        (Some(o), Some(e)) => format!("owned by gateway {o} (epoch {e})"),
        _ => "owner not known yet".to_string(),
    };
    format!("in RADOS pool {}, {owner}", r.rados_pool)
}

pub(super) fn pool_table(pools: &[PoolSummary]) {
    let rows = pools
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.health.to_string(),
                format!("{}/{}", p.healthy_disks, p.disks),
                opt_size(p.capacity.map(|c| c.total_bytes)),
                opt_size(p.capacity.map(|c| c.used_bytes)),
                opt_size(p.capacity.map(|c| c.free_bytes)),
                p.vdisks.to_string(),
            ]
        })
        .collect();
    table(&["NAME", "HEALTH", "DISKS", "SIZE", "USED", "FREE", "VDISKS"], rows);
    for p in pools {
        if let Some(r) = &p.rados {
            println!("{}: {}", p.name, rados_line(r, p.health));
        }
        // What holds its destruction up: nothing else shows it.
        if let (PoolHealth::Destroying, Some(problem)) = (p.health, &p.problem) {
            println!("{}: {problem}", p.name);
        }
        for w in &p.warnings {
            println!("{}: warning: {w}", p.name);
        }
    }
}

pub(super) fn show_pool(p: &PoolDetail) {
    let s = &p.summary;
    let mut pairs = vec![
        ("name", s.name.clone()),
        ("id", s.id.clone()),
        ("health", s.health.to_string()),
        ("size", opt_size(s.capacity.map(|c| c.total_bytes))),
        ("used", opt_size(s.capacity.map(|c| c.used_bytes))),
        ("free", opt_size(s.capacity.map(|c| c.free_bytes))),
        ("hot spares", opt_size(s.capacity.map(|c| c.spare_bytes))),
        ("slab size", size(s.slab_size)),
        ("repair needed", size(s.repair_needed_bytes)),
    ];
    if let Some(r) = &s.rados {
        pairs.push(("placement", rados_line(r, s.health)));
    }
    if let Some(problem) = &s.problem {
        pairs.push(("problem", problem.clone()));
    }
    for w in &s.warnings {
        pairs.push(("warning", w.clone()));
    }
    pairs.push((
        "auto repair",
        match (&s.auto_repair.enabled, &s.auto_repair.status) {
            (true, None) => "on".to_string(),
            (true, Some(st)) => format!("on: {st}"),
            (false, st) => format!("off{}", st.as_ref().map(|s| format!(": {s}")).unwrap_or_default()),
        },
    ));
    pairs.push(("checksums", if s.scrub.checksums { "on" } else { "off" }.to_string()));
    pairs.push(("scrub", scrub_status(&s.scrub)));
    if let Some(scan) = &s.scan {
        let mut line = format!("{}: {} finding(s)", when(scan.started_at), scan.findings);
        if let Some(f) = &scan.spotfix {
            line += &format!(
                "; spot-fix {}: {} fixed, {} left",
                when(f.started_at),
                f.fixed,
                f.changed + f.failed
            );
        }
        if let Some(t) = s.scan_next_due {
            line += &format!("; next scheduled {}", when(t));
        }
        pairs.push(("last scan", line));
    } else if let Some(t) = s.scan_next_due {
        pairs.push(("last scan", format!("never; next scheduled {}", when(t))));
    }
    if let Some(last) = &s.scrub.last {
        pairs.push(("last scrub", scrub_line(last)));
    }
    if let Some(c) = &s.cache {
        pairs.push(("write-back cache", cache_line(c)));
    }
    if !s.jobs_running.is_empty() {
        pairs.push(("jobs running", format!("{:?}", s.jobs_running)));
    }
    let st = &p.stats;
    pairs.push((
        "I/O errors",
        format!(
            "{} read, {} write, {} checksum; {} reads reconstructed, {} blocks repaired",
            st.read_errors, st.write_errors, st.checksum_errors, st.reconstructed_reads, st.repaired_blocks
        ),
    ));
    kv(&pairs);
    println!();
    disk_table(&p.disk_list);
    println!();
    vdisk_table(&p.vdisk_list);
    if !p.unhealthy_sets.is_empty() {
        println!();
        let rows = p
            .unhealthy_sets
            .iter()
            .map(|x| {
                vec![
                    x.id.to_string(),
                    x.state.clone(),
                    format!(
                        "{}/{}{}",
                        x.unavailable,
                        x.tolerance,
                        if x.per_column { " per column" } else { "" }
                    ),
                    x.layout.clone(),
                ]
            })
            .collect();
        table(&["SLAB SET", "STATE", "LOST/TOLERATED", "LAYOUT"], rows);
    }
}

/// "log on disks 4, 5 (2.0 GiB each): 12.0 MiB dirty, 40.0 MiB used; ..." and what to do.
fn cache_line(c: &tessera_volume::CacheStatus) -> String {
    let lost = if c.lost_bytes > 0 {
        format!(
            "; DATA LOST: {} the log held were lost (its disks failed, or every copy rotted) before reaching the pool's disks: reads of it fail until the host writes it again (restore it from a backup or a replica)",
            size(c.lost_bytes)
        )
    } else {
        String::new()
    };
    let parked = if c.parked_bytes > 0 {
        format!(
            "; WAITING: {} the log held for slab sets beyond their tolerance is kept in the pool's metadata for disks that are away and may come back, and written to those sets once they are back ('disk online POOL DISK'); reads and writes of it are refused until then; failing such a disk loses it",
            size(c.parked_bytes)
        )
    } else {
        String::new()
    };
    let lost = format!("{parked}{lost}");
    if c.devices.is_empty() {
        return format!("off: no healthy cache disk (add one with 'disk add POOL PATH --usage cache'){lost}");
    }
    let disks: Vec<String> = c.devices.iter().map(|d| d.to_string()).collect();
    let mut line = format!(
        "log on disk(s) {} ({} each): {} dirty, {} of the log in use; {} destaged, {} merged away, {} writes waited",
        disks.join(", "),
        size(c.log_bytes),
        size(c.dirty_bytes),
        size(c.log_used_bytes),
        size(c.destaged_bytes),
        size(c.overwritten_bytes),
        c.throttled_writes
    );
    if !c.redundant {
        line += "; NOT redundant (one cache disk): vdisks that tolerate a failure write through until a second cache disk is added";
    }
    line + &lost
}

pub(super) fn disk_table(disks: &[DiskView]) {
    let rows = disks
        .iter()
        .map(|d| {
            vec![
                d.position.to_string(),
                d.id.clone(),
                match d.usage {
                    DiskUsage::Cache => format!("{} (cache)", d.state.as_str()),
                    DiskUsage::Data => d.state.as_str().to_string(),
                },
                size(d.size),
                size(d.used_bytes),
                format!("{}/{}", d.errors.read, d.errors.checksum),
                d.io.map(|io| format!("{}/{}", ms(io.read_p99_us, io.reads), ms(io.write_p99_us, io.writes)))
                    .unwrap_or_else(|| "-".into()),
                d.path.clone(),
                d.problem.clone().unwrap_or_default(),
            ]
        })
        .collect();
    // ERRORS: read errors / blocks that failed their checksum, since the pool was imported.
    // P99 R/W: the disk's 99th percentile read and write latency since then.
    table(
        &[
            "#", "ID", "STATE", "SIZE", "USED", "ERRORS", "P99 R/W", "PATH", "PROBLEM",
        ],
        rows,
    );
}

/// A latency in microseconds as milliseconds; "-" without operations.
fn ms(us: u64, ops: u64) -> String {
    if ops == 0 {
        "-".into()
    } else {
        format!("{:.2}ms", us as f64 / 1000.0)
    }
}

pub(super) fn disk(c: &Ctx, cmd: DiskCmd) -> R {
    let (v, what) = match cmd {
        DiskCmd::List { pool } => {
            let v = c.client.get(&format!("/api/pools/{}/disks", encode_segment(&pool)))?;
            return c.answer(v, |disks: Vec<DiskView>| {
                disk_table(&disks);
                Ok(())
            });
        }
        DiskCmd::Add {
            pool,
            path,
            spare,
            usage,
        } => {
            let v = c.client.post(
                &format!("/api/pools/{}/disks", encode_segment(&pool)),
                body(&AddDisk {
                    path: abs(&path)?,
                    spare,
                    usage,
                }),
            )?;
            let what = match (spare, usage) {
                (true, _) => "added as a hot spare",
                (false, DiskUsage::Cache) => "added as a write-back cache disk",
                (false, DiskUsage::Data) => "added",
            };
            (v, what)
        }
        DiskCmd::Retire { pool, disk } => (disk_action(c, &pool, &disk, "retire")?, "retired"),
        DiskCmd::Fail { pool, disk } => (disk_action(c, &pool, &disk, "fail")?, "failed"),
        DiskCmd::Online { pool, disk } => (disk_action(c, &pool, &disk, "online")?, "taken back"),
    };
    c.answer(v, |d: DiskView| {
        println!(
            "disk {} ({}) {what}; its state is now {}",
            d.path,
            d.id,
            d.state.as_str()
        );
        if what == "taken back" {
            println!("what was written around it while it was away is resynced by a repair (the daemon's own, if automatic repair is on)");
        } else if !what.starts_with("added") {
            println!("'tessera pool repair POOL' rebuilds what it held onto the other disks");
        }
        Ok(())
    })
}

pub(super) fn disk_action(c: &Ctx, pool: &str, disk: &str, action: &str) -> Result<Value, ClientError> {
    // A relative path names the disk as the daemon knows it: absolute.
    let disk = if disk.contains('/') {
        abs(Path::new(disk))?
    } else {
        disk.to_string()
    };
    c.client.post(
        &format!(
            "/api/pools/{}/disks/{}/{action}",
            encode_segment(pool),
            encode_segment(&disk)
        ),
        None,
    )
}

/// One line for a scrub pass: what it checked, repaired and could not.
fn scrub_line(p: &ScrubPassView) -> String {
    let mut line = format!(
        "{} blocks checked, {} repaired, {} unrecoverable",
        p.blocks_checked, p.repaired, p.unrecoverable
    );
    let per_disk: Vec<String> = p
        .per_disk
        .iter()
        .map(|d| {
            format!(
                "disk {}: {} repaired, {} unrecoverable",
                d.disk, d.repaired, d.unrecoverable
            )
        })
        .collect();
    if !per_disk.is_empty() {
        line += &format!(" ({})", per_disk.join("; "));
    }
    if p.hot_copies_checked > 0 {
        line += &format!(
            "; {} hot block copies checked, {} repaired, {} with no good copy",
            p.hot_copies_checked, p.hot_copies_repaired, p.hot_copies_lost
        );
    }
    match p.finished_at {
        Some(t) => line + &format!(", finished {}", when(t)),
        None => line + &format!(", started {}", when(p.started_at)),
    }
}

fn scrub_status(s: &ScrubView) -> String {
    let state = match s.state {
        ScrubRunState::Idle => "idle".to_string(),
        ScrubRunState::Running => format!("running (job {})", s.job.unwrap_or_default()),
        ScrubRunState::Paused => "paused: 'tessera pool scrub' goes on from where it stopped".to_string(),
        ScrubRunState::Interrupted => "interrupted: the daemon goes on with it".to_string(),
    };
    let mut out = state;
    if let Some(p) = &s.current {
        out += &format!("; so far {}", scrub_line(p));
    }
    if let Some(t) = s.next_due {
        out += &format!("; next scheduled {}", when(t));
    }
    out
}

/// Starts a pool job (`POST /api/pools/NAME/KIND`) and follows it; if one of that kind is
/// running already (the daemon starts repairs and scrubs by itself), follows that one.
fn start_or_follow(c: &Ctx, kind: &str, name: &str, req: Option<Value>, no_wait: bool) -> R {
    let v = start_or_join(c, kind, name, req)?;
    follow(c, v, no_wait)
}

/// Starts a pool job, or finds the one of that kind running already. Returns its view.
fn start_or_join(c: &Ctx, kind: &str, name: &str, req: Option<Value>) -> Result<Value, ClientError> {
    let v = match c
        .client
        .post(&format!("/api/pools/{}/{kind}", encode_segment(name)), req)
    {
        Err(ClientError::Api { code, message }) if code == "busy" => {
            let jobs: Vec<Value> = read(c.client.get("/api/jobs")?)?;
            let running = jobs.into_iter().find(|j| {
                read::<JobView>(j.clone())
                    .is_ok_and(|j| j.kind == kind && j.target == name && j.state == JobState::Running)
            });
            match running {
                Some(j) => {
                    if !c.json {
                        eprintln!("{message}; following it");
                    }
                    j
                }
                None => return Err(ClientError::Api { code, message }),
            }
        }
        r => r?,
    };
    Ok(v)
}

/// Runs a scan or spot-fix job to its end (or only starts it), then shows the findings.
fn metadata_job(c: &Ctx, kind: &str, name: &str, no_wait: bool, after: u64, limit: usize) -> R {
    let raw = start_or_join(c, kind, name, None)?;
    if no_wait {
        return follow(c, raw, true);
    }
    let (job, _) = super::jobs::wait_for(c, raw)?;
    if job.state != JobState::Succeeded {
        return Err(ClientError::Transport(format!(
            "job {} ({kind} of {name}) {}: {}",
            job.id,
            job.state.as_str(),
            job.error.as_deref().unwrap_or("no reason given")
        )));
    }
    show_findings(c, name, after, limit)
}

/// The last scan of a pool: its summary, the last spot-fix, and a page of findings.
fn show_findings(c: &Ctx, name: &str, after: u64, limit: usize) -> R {
    let v = c.client.get(&format!(
        "/api/pools/{}/scan?after={after}&limit={limit}",
        encode_segment(name)
    ))?;
    c.answer(v, |r: ScanResult| {
        let next = r
            .next_due
            .map(|t| format!("next scheduled scan: {}", when(t)))
            .unwrap_or_else(|| "no scan scheduled (scan_interval is off)".into());
        let Some(rep) = &r.report else {
            println!("pool {name} has not been scanned; 'tessera pool scan {name}' scans it; {next}");
            return Ok(());
        };
        println!(
            "pool {name}: scan of {}: {} grain entries, {} counted slots, {} slab sets, {} vdisks in {:.1}s: {} finding(s)",
            when(rep.started_at),
            rep.grains,
            rep.counted_slots,
            rep.slab_sets,
            rep.vdisks,
            rep.seconds,
            rep.findings
        );
        for (kind, n) in &rep.by_kind {
            println!("  {}: {n}", finding_kind(*kind));
        }
        if let Some(f) = &rep.spotfix {
            println!(
                "spot-fix of {}: {} fixed, {} changed since the scan (left alone), {} failed, in {:.1}s",
                when(f.started_at),
                f.fixed,
                f.changed,
                f.failed,
                f.seconds
            );
        }
        println!("{next}");
        if !r.findings.is_empty() {
            let rows = r
                .findings
                .iter()
                .map(|f| {
                    let status = match (&f.status, &f.note) {
                        (tessera_volume::FindingStatus::Open, _) => "open".to_string(),
                        (s, note) => format!("{}: {}", serde_json::to_value(s).unwrap().as_str().unwrap_or("?"), note.as_deref().unwrap_or("")),
                    };
                    vec![f.id.to_string(), finding_kind(f.kind).to_string(), f.object.clone(), f.problem.clone(), f.repair.clone(), status]
                })
                .collect();
            table(&["ID", "KIND", "OBJECT", "PROBLEM", "REPAIR", "STATUS"], rows);
            if let Some(next) = r.next_after {
                println!("more: 'tessera pool scan {name} --last --after {next}'");
            }
            println!("'tessera pool spotfix {name}' applies these repairs; the vdisks stay online");
        }
        Ok(())
    })
}

fn finding_kind(k: tessera_volume::FindingKind) -> &'static str {
    use tessera_volume::FindingKind::*;
    match k {
        GrainOutsideSpace => "grain outside space",
        GrainBeyondEnd => "grain past the end",
        GrainWrongClass => "grain in the wrong class",
        RefcountWrong => "wrong count",
        OrphanSlot => "orphan slot",
        DanglingGrains => "entries of no vdisk",
        SetMemberLost => "set member lost",
        JournalStale => "stale journal record",
        RegionUnsynced => "unsynced region",
        RecordMalformed => "unreadable record",
        DataLost => "data lost",
    }
}
