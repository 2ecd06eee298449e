//! `tessera vdisk` and `tessera snapshot`.

use super::*;

pub(super) fn vdisk_table(v: &Value) {
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
pub(super) fn pool_snapshot(s: &str) -> Result<(String, String, String), ClientError> {
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

pub(super) fn snapshot_path(p: &str, v: &str) -> String {
    format!(
        "/api/pools/{}/vdisks/{}/snapshots",
        encode_segment(p),
        encode_segment(v)
    )
}

pub(super) fn snapshot(c: &Ctx, cmd: SnapshotCmd) -> R {
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

pub(super) fn layout_body(name: &str, size: u64, l: &LayoutArgs) -> Value {
    json!({
        "name": name, "size": size, "layout": l.layout, "copies": l.copies, "columns": l.columns,
        "interleave": l.interleave, "provisioning": l.provisioning, "grain_size": l.grain, "block_size": l.block_size,
        "physical_block_size": l.physical_block_size,
    })
}

/// "512 (4096 physical, 512e)", "512 (512n)" or "4096 (4Kn)".
pub(super) fn block_sizes(v: &Value) -> String {
    let logical = v["block_size"].as_u64().unwrap_or(0);
    match v["physical_block_size"].as_u64().unwrap_or(logical) {
        p if p == logical && logical == 512 => "512 (512n)".to_string(),
        p if p == logical => format!("{logical} (4Kn)"),
        p => format!("{logical} ({p} physical, 512e)"),
    }
}

pub(super) fn vdisk(c: &Ctx, cmd: VdiskCmd) -> R {
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
