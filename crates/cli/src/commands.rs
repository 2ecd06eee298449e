//! What each command does: build the request, call the API, print the answer.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use tessera_server::config::LogFormat;
use tessera_server::units::format_size;
use tessera_server::{Overrides, ServerConfig};

use crate::client::{encode_segment, Client, ClientError, Endpoint};
use crate::output::{kv, percent, s, size, table, when};
use crate::*;

pub fn run(cli: Cli) -> Result<(), String> {
    let Cli {
        api,
        client_state_dir,
        token,
        json,
        command,
    } = cli;
    if let Command::Serve(a) = command {
        return serve(a, client_state_dir);
    }
    if let Command::Bench(a) = command {
        return crate::bench::bench(*a, client_state_dir, json);
    }
    if let Command::Copy(a) = command {
        return crate::copy::copy(a, json);
    }
    let endpoint = endpoint(api.as_deref(), client_state_dir.as_deref())?;
    let token = match (&endpoint, token) {
        (Endpoint::Tcp(_), None) => token_from_state_dir(client_state_dir.as_deref()),
        (_, t) => t,
    };
    let c = Ctx {
        client: Client::new(endpoint, token)?,
        json,
    };
    let r = match command {
        Command::Serve(_) | Command::Bench(_) | Command::Copy(_) => unreachable!(),
        Command::Pool(p) => pool(&c, p),
        Command::Disk(d) => disk(&c, d),
        Command::Vdisk(v) => vdisk(&c, v),
        Command::Snapshot(v) => snapshot(&c, v),
        Command::Target(t) => target(&c, t),
        Command::Nbd(n) => nbd(&c, n),
        Command::Job(j) => job(&c, j),
    };
    r.map_err(|e| match e {
        ClientError::Api { message, code, .. } if code == "unauthorized" => message,
        e => e.to_string(),
    })
}

fn serve(a: ServeArgs, state_dir: Option<PathBuf>) -> Result<(), String> {
    let o = Overrides {
        state_dir,
        api_listen: a.api_listen,
        api_token: a.api_token,
        iscsi_listen: a.iscsi_listen,
        nbd_listen: a.nbd_listen,
        nbd_insecure: a.nbd_insecure,
        log_format: a.log_format.map(|f| match f {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }),
        demo: a.demo,
    };
    let cfg = ServerConfig::load(a.config.as_deref(), o)?;
    tessera_server::serve::run(cfg)
}

fn endpoint(api: Option<&str>, state_dir: Option<&Path>) -> Result<Endpoint, String> {
    if let Some(a) = api {
        return Endpoint::parse(a);
    }
    if let Some(d) = state_dir {
        return Ok(Endpoint::Unix(d.join("api.sock")));
    }
    let candidates = [
        PathBuf::from("/var/lib/tessera/api.sock"),
        PathBuf::from("tessera-demo/api.sock"),
    ];
    for p in &candidates {
        if p.exists() {
            return Ok(Endpoint::Unix(std::path::absolute(p).unwrap_or(p.clone())));
        }
    }
    Err(
        "no tessera daemon found: neither /var/lib/tessera/api.sock nor ./tessera-demo/api.sock exists. \
         Start one with 'tessera serve' (or 'make demo'), or point at it with --api or TESSERA_API"
            .into(),
    )
}

/// The token a daemon made for its TCP listener, if this user can read it: in --state-dir,
/// else in the default state directories.
fn token_from_state_dir(state_dir: Option<&Path>) -> Option<String> {
    let dirs: Vec<PathBuf> = match state_dir {
        Some(d) => vec![d.to_path_buf()],
        None => vec![PathBuf::from("/var/lib/tessera"), PathBuf::from("tessera-demo")],
    };
    dirs.iter()
        .find_map(|d| std::fs::read_to_string(tessera_server::api::auth::token_path(d)).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

struct Ctx {
    client: Client,
    json: bool,
}

type R = Result<(), ClientError>;

impl Ctx {
    fn print_json(&self, v: &Value) {
        println!("{}", serde_json::to_string_pretty(v).expect("serializable"));
    }
}

/// Splits POOL/NAME.
fn pool_vdisk(s: &str) -> Result<(String, String), ClientError> {
    match s.split_once('/') {
        Some((p, v)) if !p.is_empty() && !v.is_empty() && !v.contains('/') => Ok((p.to_string(), v.to_string())),
        _ => Err(ClientError::Transport(format!(
            "'{s}' does not name a vdisk: write POOL/NAME, e.g. demo/vol1"
        ))),
    }
}

/// The daemon resolves paths itself: send them absolute.
fn abs(p: &Path) -> Result<String, ClientError> {
    std::path::absolute(p)
        .map(|p| p.display().to_string())
        .map_err(|e| ClientError::Transport(format!("{}: {e}", p.display())))
}

fn pool(c: &Ctx, cmd: PoolCmd) -> R {
    match cmd {
        PoolCmd::Create { name, disks, slab_size } => {
            let disks: Vec<String> = disks.iter().map(|d| abs(d)).collect::<Result<_, _>>()?;
            let v = c.client.post(
                "/api/pools",
                Some(json!({"name": name, "disks": disks, "slab_size": slab_size})),
            )?;
            if c.json {
                c.print_json(&v);
            } else {
                println!(
                    "pool {} created: {} disk(s), {}",
                    name,
                    s(&v["disks"]),
                    size(&v["capacity"]["total_bytes"])
                );
            }
        }
        PoolCmd::List => {
            let v = c.client.get("/api/pools")?;
            if c.json {
                c.print_json(&v);
            } else {
                pool_table(&v);
            }
        }
        PoolCmd::Show { name } => {
            let v = c.client.get(&format!("/api/pools/{}", encode_segment(&name)))?;
            if c.json {
                c.print_json(&v);
            } else {
                show_pool(&v);
            }
        }
        PoolCmd::Destroy { name } => {
            c.client.delete(&format!("/api/pools/{}", encode_segment(&name)))?;
            if !c.json {
                println!("pool {name} destroyed");
            }
        }
        PoolCmd::Import { name: None } => {
            let v = c.client.get("/api/pools/importable")?;
            if c.json {
                c.print_json(&v);
            } else {
                let rows = arr(&v).iter().map(|p| vec![s(&p["name"]), s(&p["dir"])]).collect();
                table(&["NAME", "DIRECTORY"], rows);
            }
        }
        PoolCmd::Import { name: Some(name) } => {
            let v = c.client.post("/api/pools/import", Some(json!({"name": name})))?;
            if c.json {
                c.print_json(&v);
            } else {
                println!("pool {name} imported: {}", s(&v["health"]));
                if let Some(p) = v["problem"].as_str() {
                    println!("  {p}");
                }
            }
        }
        PoolCmd::Export { name } => {
            c.client
                .post(&format!("/api/pools/{}/export", encode_segment(&name)), None)?;
            if !c.json {
                println!("pool {name} exported; 'tessera pool import {name}' brings it back");
            }
        }
        PoolCmd::Repair {
            name,
            parallel,
            rate,
            no_wait,
        } => {
            let v = c.client.post(
                &format!("/api/pools/{}/repair", encode_segment(&name)),
                Some(json!({"parallel": parallel, "rate_limit": rate})),
            )?;
            follow(c, v, no_wait)?;
        }
        PoolCmd::Check { name } => {
            let v = c
                .client
                .post(&format!("/api/pools/{}/check", encode_segment(&name)), None)?;
            if c.json {
                c.print_json(&v);
            } else {
                let problems = arr(&v["problems"]);
                println!(
                    "pool {name}: {} grain(s) mapped, {} slot(s) referenced, {} problem(s)",
                    s(&v["grains_mapped"]),
                    s(&v["slots_referenced"]),
                    problems.len()
                );
                for p in problems {
                    println!("  {}", s(p));
                }
                if !problems.is_empty() {
                    return Err(ClientError::Transport(format!("pool {name} failed its check")));
                }
            }
        }
    }
    Ok(())
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(|a| a.as_slice()).unwrap_or(&[])
}

fn pool_table(v: &Value) {
    let rows = arr(v)
        .iter()
        .map(|p| {
            vec![
                s(&p["name"]),
                s(&p["health"]),
                format!("{}/{}", s(&p["healthy_disks"]), s(&p["disks"])),
                size(&p["capacity"]["total_bytes"]),
                size(&p["capacity"]["used_bytes"]),
                size(&p["capacity"]["free_bytes"]),
                s(&p["vdisks"]),
            ]
        })
        .collect();
    table(&["NAME", "HEALTH", "DISKS", "SIZE", "USED", "FREE", "VDISKS"], rows);
    for p in arr(v) {
        for w in arr(&p["warnings"]) {
            println!("{}: warning: {}", s(&p["name"]), s(w));
        }
    }
}

fn show_pool(v: &Value) {
    let mut pairs = vec![
        ("name", s(&v["name"])),
        ("id", s(&v["id"])),
        ("health", s(&v["health"])),
        ("size", size(&v["capacity"]["total_bytes"])),
        ("used", size(&v["capacity"]["used_bytes"])),
        ("free", size(&v["capacity"]["free_bytes"])),
        ("slab size", size(&v["slab_size"])),
        ("repair needed", size(&v["repair_needed_bytes"])),
    ];
    if let Some(p) = v["problem"].as_str() {
        pairs.push(("problem", p.to_string()));
    }
    for w in arr(&v["warnings"]) {
        pairs.push(("warning", s(w)));
    }
    if !arr(&v["jobs_running"]).is_empty() {
        pairs.push(("jobs running", s(&v["jobs_running"])));
    }
    let st = &v["stats"];
    pairs.push((
        "I/O errors",
        format!(
            "{} read, {} write; {} reads reconstructed, {} blocks repaired",
            s(&st["read_errors"]),
            s(&st["write_errors"]),
            s(&st["reconstructed_reads"]),
            s(&st["repaired_blocks"])
        ),
    ));
    kv(&pairs);
    println!();
    disk_table(&v["disk_list"]);
    println!();
    vdisk_table(&v["vdisk_list"]);
    let sets = arr(&v["unhealthy_sets"]);
    if !sets.is_empty() {
        println!();
        let rows = sets
            .iter()
            .map(|x| {
                vec![
                    s(&x["id"]),
                    s(&x["state"]),
                    format!("{}/{}", s(&x["unavailable"]), s(&x["tolerance"])),
                    s(&x["layout"]),
                ]
            })
            .collect();
        table(&["SLAB SET", "STATE", "LOST/TOLERATED", "LAYOUT"], rows);
    }
}

fn disk_table(v: &Value) {
    let rows = arr(v)
        .iter()
        .map(|d| {
            vec![
                s(&d["position"]),
                s(&d["id"]),
                s(&d["state"]),
                size(&d["size"]),
                size(&d["used_bytes"]),
                s(&d["path"]),
                d["problem"].as_str().unwrap_or("").to_string(),
            ]
        })
        .collect();
    table(&["#", "ID", "STATE", "SIZE", "USED", "PATH", "PROBLEM"], rows);
}

fn vdisk_table(v: &Value) {
    let rows = arr(v)
        .iter()
        .map(|x| {
            vec![
                format!("{}/{}", s(&x["pool"]), s(&x["name"])),
                size(&x["size"]),
                size(&x["allocated_bytes"]),
                size(&x["exclusive_bytes"]),
                s(&x["snapshots"]),
                s(&x["provisioning"]),
                s(&x["layout_description"]),
            ]
        })
        .collect();
    table(
        &[
            "VDISK",
            "SIZE",
            "ALLOCATED",
            "EXCLUSIVE",
            "SNAPSHOTS",
            "PROVISIONING",
            "LAYOUT",
        ],
        rows,
    );
}

/// POOL/VDISK@NAME
fn pool_snapshot(s: &str) -> Result<(String, String, String), ClientError> {
    let bad = || {
        ClientError::Transport(format!(
            "'{s}' does not name a snapshot: write POOL/VDISK@NAME, e.g. demo/vol1@before-upgrade"
        ))
    };
    let (p, rest) = pool_vdisk(s).map_err(|_| bad())?;
    match rest.split_once('@') {
        Some((v, n)) if !v.is_empty() && !n.is_empty() && !n.contains('@') => Ok((p, v.to_string(), n.to_string())),
        _ => Err(bad()),
    }
}

fn snapshot_path(p: &str, v: &str) -> String {
    format!(
        "/api/pools/{}/vdisks/{}/snapshots",
        encode_segment(p),
        encode_segment(v)
    )
}

fn snapshot(c: &Ctx, cmd: SnapshotCmd) -> R {
    match cmd {
        SnapshotCmd::Create { snapshot } => {
            let (p, v, n) = pool_snapshot(&snapshot)?;
            let started = std::time::Instant::now();
            let r = c.client.post(&snapshot_path(&p, &v), Some(json!({"name": n})))?;
            if c.json {
                c.print_json(&r);
            } else {
                println!(
                    "snapshot {snapshot} taken in {:.3} s: {} of data, all shared with {p}/{v}",
                    started.elapsed().as_secs_f64(),
                    size(&r["allocated_bytes"])
                );
            }
        }
        SnapshotCmd::List { of } => {
            let r = match of.as_deref() {
                None => c.client.get("/api/snapshots")?,
                Some(x) if x.contains('/') => {
                    let (p, v) = pool_vdisk(x)?;
                    c.client.get(&snapshot_path(&p, &v))?
                }
                Some(p) => c.client.get(&format!("/api/pools/{}/snapshots", encode_segment(p)))?,
            };
            if c.json {
                c.print_json(&r);
            } else {
                let rows = arr(&r)
                    .iter()
                    .map(|x| {
                        vec![
                            format!("{}/{}", s(&x["pool"]), s(&x["full_name"])),
                            size(&x["size"]),
                            size(&x["allocated_bytes"]),
                            size(&x["exclusive_bytes"]),
                            when(&x["created"]),
                        ]
                    })
                    .collect();
                table(&["SNAPSHOT", "SIZE", "ALLOCATED", "EXCLUSIVE", "CREATED"], rows);
            }
        }
        SnapshotCmd::Show { snapshot } => {
            let (p, v, n) = pool_snapshot(&snapshot)?;
            let r = c
                .client
                .get(&format!("{}/{}", snapshot_path(&p, &v), encode_segment(&n)))?;
            if c.json {
                c.print_json(&r);
            } else {
                kv(&[
                    ("snapshot", snapshot.clone()),
                    ("of", format!("{p}/{}", s(&r["vdisk"]))),
                    ("size", format!("{} ({} bytes)", size(&r["size"]), s(&r["size"]))),
                    ("allocated", size(&r["allocated_bytes"])),
                    ("exclusive", size(&r["exclusive_bytes"])),
                    ("shared", size(&r["shared_bytes"])),
                    ("created", when(&r["created"])),
                ]);
            }
        }
        SnapshotCmd::Delete { snapshot } => {
            let (p, v, n) = pool_snapshot(&snapshot)?;
            c.client
                .delete(&format!("{}/{}", snapshot_path(&p, &v), encode_segment(&n)))?;
            if !c.json {
                println!("snapshot {snapshot} deleted");
            }
        }
    }
    Ok(())
}

fn disk(c: &Ctx, cmd: DiskCmd) -> R {
    let (v, what) = match cmd {
        DiskCmd::List { pool } => {
            let v = c.client.get(&format!("/api/pools/{}/disks", encode_segment(&pool)))?;
            if c.json {
                c.print_json(&v);
            } else {
                disk_table(&v);
            }
            return Ok(());
        }
        DiskCmd::Add { pool, path } => {
            let v = c.client.post(
                &format!("/api/pools/{}/disks", encode_segment(&pool)),
                Some(json!({"path": abs(&path)?})),
            )?;
            (v, "added")
        }
        DiskCmd::Retire { pool, disk } => (disk_action(c, &pool, &disk, "retire")?, "retired"),
        DiskCmd::Fail { pool, disk } => (disk_action(c, &pool, &disk, "fail")?, "failed"),
    };
    if c.json {
        c.print_json(&v);
    } else {
        println!(
            "disk {} ({}) {what}; its state is now {}",
            s(&v["path"]),
            s(&v["id"]),
            s(&v["state"])
        );
        if what != "added" {
            println!("'tessera pool repair POOL' rebuilds what it held onto the other disks");
        }
    }
    Ok(())
}

fn disk_action(c: &Ctx, pool: &str, disk: &str, action: &str) -> Result<Value, ClientError> {
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

fn layout_body(name: &str, size: u64, l: &LayoutArgs) -> Value {
    json!({
        "name": name, "size": size, "layout": l.layout, "copies": l.copies, "columns": l.columns,
        "interleave": l.interleave, "provisioning": l.provisioning, "grain_size": l.grain, "block_size": l.block_size,
        "physical_block_size": l.physical_block_size,
    })
}

/// "512 (4096 physical, 512e)", "512 (512n)" or "4096 (4Kn)".
fn block_sizes(v: &Value) -> String {
    let logical = v["block_size"].as_u64().unwrap_or(0);
    match v["physical_block_size"].as_u64().unwrap_or(logical) {
        p if p == logical && logical == 512 => "512 (512n)".to_string(),
        p if p == logical => format!("{logical} (4Kn)"),
        p => format!("{logical} ({p} physical, 512e)"),
    }
}

fn vdisk(c: &Ctx, cmd: VdiskCmd) -> R {
    match cmd {
        VdiskCmd::Create {
            vdisk,
            size: sz,
            layout,
        } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            let v = c.client.post(
                &format!("/api/pools/{}/vdisks", encode_segment(&p)),
                Some(layout_body(&n, sz, &layout)),
            )?;
            if c.json {
                c.print_json(&v);
            } else {
                println!(
                    "vdisk {vdisk} created: {}, {}, {}",
                    size(&v["size"]),
                    s(&v["layout_description"]),
                    s(&v["provisioning"])
                );
            }
        }
        VdiskCmd::List { pool } => {
            let v = match pool {
                Some(p) => c.client.get(&format!("/api/pools/{}/vdisks", encode_segment(&p)))?,
                None => c.client.get("/api/vdisks")?,
            };
            if c.json {
                c.print_json(&v);
            } else {
                vdisk_table(&v);
            }
        }
        VdiskCmd::Show { vdisk } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            let v = c.client.get(&format!(
                "/api/pools/{}/vdisks/{}",
                encode_segment(&p),
                encode_segment(&n)
            ))?;
            if c.json {
                c.print_json(&v);
            } else {
                kv(&[
                    ("vdisk", vdisk.clone()),
                    ("size", format!("{} ({} bytes)", size(&v["size"]), s(&v["size"]))),
                    ("allocated", size(&v["allocated_bytes"])),
                    ("exclusive", size(&v["exclusive_bytes"])),
                    ("shared", size(&v["shared_bytes"])),
                    ("snapshots", s(&v["snapshots"])),
                    ("provisioning", s(&v["provisioning"])),
                    ("layout", s(&v["layout_description"])),
                    ("block size", block_sizes(&v)),
                    ("grain size", size(&v["grain_size"])),
                ]);
            }
        }
        VdiskCmd::Clone { source, name } => {
            let (p, n) = pool_vdisk(&source)?;
            let name = name.strip_prefix(&format!("{p}/")).unwrap_or(&name).to_string();
            let v = c.client.post(
                &format!("/api/pools/{}/vdisks/{}/clone", encode_segment(&p), encode_segment(&n)),
                Some(json!({"name": name})),
            )?;
            if c.json {
                c.print_json(&v);
            } else {
                println!(
                    "vdisk {p}/{name} cloned from {source}: {} shared, {} copied",
                    size(&v["shared_bytes"]),
                    size(&v["copied_bytes"])
                );
            }
        }
        VdiskCmd::Resize { vdisk, size: sz } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            let v = c.client.post(
                &format!("/api/pools/{}/vdisks/{}/resize", encode_segment(&p), encode_segment(&n)),
                Some(json!({"size": sz})),
            )?;
            if c.json {
                c.print_json(&v);
            } else {
                println!("vdisk {vdisk} is now {}", size(&v["size"]));
            }
        }
        VdiskCmd::Delete { vdisk } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            c.client.delete(&format!(
                "/api/pools/{}/vdisks/{}",
                encode_segment(&p),
                encode_segment(&n)
            ))?;
            if !c.json {
                println!("vdisk {vdisk} deleted");
            }
        }
        VdiskCmd::Import {
            vdisk,
            image,
            size: sz,
            layout,
            no_wait,
        } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            let v = c.client.post(
                &format!("/api/pools/{}/vdisks/{}/import", encode_segment(&p), encode_segment(&n)),
                Some(json!({"path": abs(&image)?, "create": layout_body(&n, sz.unwrap_or(0), &layout)})),
            )?;
            follow(c, v, no_wait)?;
        }
        VdiskCmd::Export {
            vdisk,
            image,
            overwrite,
            no_wait,
        } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            let v = c.client.post(
                &format!("/api/pools/{}/vdisks/{}/export", encode_segment(&p), encode_segment(&n)),
                Some(json!({"path": abs(&image)?, "overwrite": overwrite})),
            )?;
            follow(c, v, no_wait)?;
        }
    }
    Ok(())
}

fn job(c: &Ctx, cmd: JobCmd) -> R {
    match cmd {
        JobCmd::List => {
            let v = c.client.get("/api/jobs")?;
            if c.json {
                c.print_json(&v);
            } else {
                let rows = arr(&v)
                    .iter()
                    .map(|j| {
                        vec![
                            s(&j["id"]),
                            s(&j["kind"]),
                            s(&j["target"]),
                            s(&j["state"]),
                            percent(
                                j["done_bytes"].as_u64().unwrap_or(0),
                                j["total_bytes"].as_u64().unwrap_or(0),
                            ),
                            size(&j["total_bytes"]),
                            format!("{:.1}s", j["elapsed_seconds"].as_f64().unwrap_or(0.0)),
                            j["error"].as_str().unwrap_or("").to_string(),
                        ]
                    })
                    .collect();
                table(
                    &["ID", "KIND", "TARGET", "STATE", "DONE", "BYTES", "ELAPSED", "ERROR"],
                    rows,
                );
            }
        }
        JobCmd::Show { id } => {
            let v = c.client.get(&format!("/api/jobs/{id}"))?;
            if c.json {
                c.print_json(&v);
            } else {
                show_job(&v);
            }
        }
        JobCmd::Wait { id } => {
            let v = c.client.get(&format!("/api/jobs/{id}"))?;
            follow(c, v, false)?;
        }
        JobCmd::Cancel { id } => {
            let v = c.client.post(&format!("/api/jobs/{id}/cancel"), None)?;
            if c.json {
                c.print_json(&v);
            } else {
                println!("job {id}: cancel requested");
            }
        }
    }
    Ok(())
}

fn show_job(v: &Value) {
    let mut pairs = vec![
        ("job", s(&v["id"])),
        ("kind", s(&v["kind"])),
        ("target", s(&v["target"])),
        ("state", s(&v["state"])),
        (
            "progress",
            format!(
                "{} of {} ({})",
                size(&v["done_bytes"]),
                size(&v["total_bytes"]),
                percent(
                    v["done_bytes"].as_u64().unwrap_or(0),
                    v["total_bytes"].as_u64().unwrap_or(0)
                )
            ),
        ),
        (
            "rate",
            format!("{}/s", format_size(v["rate"].as_f64().unwrap_or(0.0) as u64)),
        ),
        (
            "elapsed",
            format!("{:.1}s", v["elapsed_seconds"].as_f64().unwrap_or(0.0)),
        ),
    ];
    if let Some(e) = v["eta_seconds"].as_f64() {
        pairs.push(("eta", format!("{e:.0}s")));
    }
    if let Some(e) = v["error"].as_str() {
        pairs.push(("error", e.to_string()));
    }
    if !v["result"].is_null() {
        pairs.push(("result", v["result"].to_string()));
    }
    kv(&pairs);
}

/// Follows a job to its end with a progress bar (on a terminal), unless `no_wait`. A job that
/// fails or is cancelled makes the command fail.
fn follow(c: &Ctx, job: Value, no_wait: bool) -> R {
    let id = job["id"]
        .as_u64()
        .ok_or_else(|| ClientError::Transport("the daemon did not return a job".into()))?;
    if no_wait {
        if c.json {
            c.print_json(&job);
        } else {
            println!(
                "job {id} started ({} of {}); 'tessera job wait {id}' follows it",
                s(&job["kind"]),
                s(&job["target"])
            );
        }
        return Ok(());
    }
    let bar = if std::io::stderr().is_terminal() && !c.json {
        let b = ProgressBar::new(job["total_bytes"].as_u64().unwrap_or(0));
        b.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} ")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_message(format!("job {id} {} {}", s(&job["kind"]), s(&job["target"])));
        Some(b)
    } else {
        None
    };
    let mut v = job;
    loop {
        if let Some(b) = &bar {
            b.set_length(v["total_bytes"].as_u64().unwrap_or(0));
            b.set_position(v["done_bytes"].as_u64().unwrap_or(0));
        }
        if v["state"] != "running" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        v = c.client.get(&format!("/api/jobs/{id}"))?;
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if c.json {
        c.print_json(&v);
    }
    match v["state"].as_str() {
        Some("succeeded") => {
            if !c.json {
                println!(
                    "job {id} ({} of {}) succeeded: {} in {:.1}s",
                    s(&v["kind"]),
                    s(&v["target"]),
                    size(&v["total_bytes"]),
                    v["elapsed_seconds"].as_f64().unwrap_or(0.0)
                );
            }
            Ok(())
        }
        _ => Err(ClientError::Transport(format!(
            "job {id} ({} of {}) {}: {}",
            s(&v["kind"]),
            s(&v["target"]),
            s(&v["state"]),
            v["error"].as_str().unwrap_or("no reason given")
        ))),
    }
}

fn target_table(v: &Value) {
    let mut rows = Vec::new();
    for t in arr(v) {
        if arr(&t["luns"]).is_empty() {
            rows.push(vec![
                s(&t["iqn"]),
                "-".into(),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        for l in arr(&t["luns"]) {
            rows.push(vec![
                s(&t["iqn"]),
                s(&l["lun"]),
                s(&l["vdisk"]),
                size(&l["size"]),
                if l["online"] == true {
                    "online"
                } else {
                    "offline: vdisk unavailable"
                }
                .to_string(),
            ]);
        }
    }
    table(&["TARGET", "LUN", "VDISK", "SIZE", "STATE"], rows);
    for t in arr(v) {
        let acl = arr(&t["acl"]);
        let who = match (t["allow_any_initiator"] == true, acl.is_empty()) {
            (true, _) => "any initiator".to_string(),
            (false, true) => "no initiator (empty ACL)".to_string(),
            (false, false) => acl.iter().map(s).collect::<Vec<_>>().join(", "),
        };
        let chap = match (&t["chap"]["user"], &t["chap"]["mutual_user"]) {
            (Value::Null, _) => "no CHAP".to_string(),
            (u, Value::Null) => format!("CHAP user {}", s(u)),
            (u, m) => format!("mutual CHAP, user {}, target user {}", s(u), s(m)),
        };
        println!("{}: {who}; {chap}", s(&t["iqn"]));
        for l in arr(&t["luns"]) {
            let r = &l["reservations"];
            if r.is_null() {
                continue;
            }
            let held = match (&r["holder"], &r["kind"]) {
                (Value::Null, _) => "not reserved".to_string(),
                (h, k) => format!("reserved by {} ({})", s(h), s(k)),
            };
            println!(
                "  LUN {}: {held}; registered: {}{}",
                s(&l["lun"]),
                arr(&r["registered"]).iter().map(s).collect::<Vec<_>>().join(", "),
                if r["aptpl"] == true {
                    "; kept across restarts"
                } else {
                    ""
                }
            );
        }
    }
}

fn portal(c: &Ctx, cmd: PortalCmd) -> R {
    let v = match cmd {
        PortalCmd::Add { address } => c.client.post("/api/iscsi/portals", Some(json!({"address": address})))?,
        PortalCmd::List => c.client.get("/api/iscsi/portals")?,
        PortalCmd::Remove { address } => {
            c.client
                .delete(&format!("/api/iscsi/portals/{}", encode_segment(&address)))?;
            if !c.json {
                println!("portal {address} removed");
            }
            return Ok(());
        }
    };
    if c.json {
        c.print_json(&v);
        return Ok(());
    }
    let list = if v.is_array() { arr(&v).to_vec() } else { vec![v] };
    let buffer = |b: &Value| match b.as_u64() {
        // The kernel reports twice what was asked for.
        Some(n) => format_size(n / 2),
        None => "auto".into(),
    };
    let rows = list
        .iter()
        .map(|p| {
            vec![
                s(&p["address"]),
                s(&p["source"]),
                match (&p["listening_on"], &p["error"]) {
                    (Value::String(a), _) => format!("listening on {a}"),
                    (_, e) => format!("not listening: {}", s(e)),
                },
                buffer(&p["send_buffer"]),
                buffer(&p["recv_buffer"]),
            ]
        })
        .collect();
    table(&["PORTAL", "FROM", "STATE", "SNDBUF", "RCVBUF"], rows);
    for p in &list {
        if let Value::String(w) = &p["warning"] {
            println!("{}: {w}", s(&p["address"]));
        }
    }
    Ok(())
}

fn target(c: &Ctx, cmd: TargetCmd) -> R {
    let path = |iqn: &str| format!("/api/targets/{}", encode_segment(iqn));
    let v = match cmd {
        TargetCmd::Create {
            iqn,
            allow_any_initiator,
        } => c.client.post(
            "/api/targets",
            Some(json!({"iqn": iqn, "allow_any_initiator": allow_any_initiator})),
        )?,
        TargetCmd::List => c.client.get("/api/targets")?,
        TargetCmd::Show { iqn } => c.client.get(&path(&iqn))?,
        TargetCmd::Delete { iqn } => {
            c.client.delete(&path(&iqn))?;
            if !c.json {
                println!("target {iqn} deleted");
            }
            return Ok(());
        }
        TargetCmd::Lun(LunCmd::Add { iqn, vdisk, lun }) => c.client.post(
            &format!("{}/luns", path(&iqn)),
            Some(json!({"lun": lun, "vdisk": vdisk})),
        )?,
        TargetCmd::Lun(LunCmd::Remove { iqn, lun }) => c.client.delete(&format!("{}/luns/{lun}", path(&iqn)))?,
        TargetCmd::Acl(AclCmd::Add { iqn, initiator }) => c
            .client
            .post(&format!("{}/acl", path(&iqn)), Some(json!({"initiator": initiator})))?,
        TargetCmd::Acl(AclCmd::AllowAny { iqn, off }) => c.client.put(
            &format!("{}/allow-any-initiator", path(&iqn)),
            Some(json!({"allow": !off})),
        )?,
        TargetCmd::Acl(AclCmd::Remove { iqn, initiator }) => {
            c.client
                .delete(&format!("{}/acl/{}", path(&iqn), encode_segment(&initiator)))?
        }
        TargetCmd::Chap(ChapCmd::Set {
            iqn,
            user,
            secret,
            mutual_user,
            mutual_secret,
        }) => c.client.call(
            "PUT",
            &format!("{}/chap", path(&iqn)),
            Some(json!({"user": user, "secret": secret, "mutual_user": mutual_user, "mutual_secret": mutual_secret})),
        )?,
        TargetCmd::Chap(ChapCmd::Clear { iqn }) => c.client.delete(&format!("{}/chap", path(&iqn)))?,
        TargetCmd::Portal(p) => return portal(c, p),
    };
    if c.json {
        c.print_json(&v);
    } else if v.is_array() {
        target_table(&v);
    } else {
        target_table(&Value::Array(vec![v]));
    }
    Ok(())
}

fn nbd_table(v: &Value) {
    let rows = arr(v)
        .iter()
        .map(|e| {
            vec![
                s(&e["name"]),
                s(&e["vdisk"]),
                size(&e["size"]),
                if e["read_only"] == true {
                    "read-only"
                } else {
                    "read-write"
                }
                .to_string(),
                if e["online"] == true {
                    "online"
                } else {
                    "offline: vdisk unavailable"
                }
                .to_string(),
                s(&e["connections"]),
            ]
        })
        .collect();
    table(&["EXPORT", "VDISK", "SIZE", "ACCESS", "STATE", "CONNECTIONS"], rows);
}

fn nbd(c: &Ctx, cmd: NbdCmd) -> R {
    let path = |name: &str| format!("/api/nbd/exports/{}", encode_segment(name));
    let v = match cmd {
        NbdCmd::Export { vdisk, name, read_only } => c.client.post(
            "/api/nbd/exports",
            Some(json!({"vdisk": vdisk, "name": name, "read_only": read_only})),
        )?,
        NbdCmd::List => c.client.get("/api/nbd/exports")?,
        NbdCmd::Show { name } => c.client.get(&path(&name))?,
        NbdCmd::Remove { name } => {
            c.client.delete(&path(&name))?;
            if !c.json {
                println!("NBD export {name} removed");
            }
            return Ok(());
        }
    };
    if c.json {
        c.print_json(&v);
    } else if v.is_array() {
        nbd_table(&v);
    } else {
        nbd_table(&Value::Array(vec![v]));
    }
    Ok(())
}
