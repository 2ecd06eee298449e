//! `tessera pool` and `tessera disk`.

use super::*;

pub(super) fn pool(c: &Ctx, cmd: PoolCmd) -> R {
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

pub(super) fn pool_table(v: &Value) {
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

pub(super) fn show_pool(v: &Value) {
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

pub(super) fn disk_table(v: &Value) {
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

pub(super) fn disk(c: &Ctx, cmd: DiskCmd) -> R {
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
