//! `tessera vdisk` and `tessera snapshot`.

use super::*;

pub(super) fn vdisk_table(vdisks: &[VdiskView]) {
    let rows = vdisks
        .iter()
        .map(|x| {
            vec![
                format!("{}/{}", x.pool, x.name),
                size(x.size),
                size(x.allocated_bytes),
                size(x.exclusive_bytes),
                if x.dedup {
                    format!(
                        "{} ({})",
                        size(x.saved_bytes),
                        percent(x.saved_bytes, x.allocated_bytes)
                    )
                } else {
                    size(x.saved_bytes)
                },
                x.snapshots.to_string(),
                x.provisioning.as_str().to_string(),
                x.layout_description.clone(),
            ]
        })
        .collect();
    table(
        &[
            "VDISK",
            "SIZE",
            "ALLOCATED",
            "EXCLUSIVE",
            "SAVED",
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
            let r = c
                .client
                .post(&snapshot_path(&p, &v), body(&CreateSnapshot { name: n }))?;
            c.answer(r, |snap: SnapshotView| {
                println!(
                    "snapshot {snapshot} taken in {:.3} s: {} of data, all shared with {p}/{v}",
                    started.elapsed().as_secs_f64(),
                    size(snap.allocated_bytes)
                );
                Ok(())
            })?;
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
            c.answer(r, |snaps: Vec<SnapshotView>| {
                let rows = snaps
                    .iter()
                    .map(|x| {
                        vec![
                            format!("{}/{}", x.pool, x.full_name),
                            size(x.size),
                            size(x.allocated_bytes),
                            size(x.exclusive_bytes),
                            when(x.created),
                        ]
                    })
                    .collect();
                table(&["SNAPSHOT", "SIZE", "ALLOCATED", "EXCLUSIVE", "CREATED"], rows);
                Ok(())
            })?;
        }
        SnapshotCmd::Show { snapshot } => {
            let (p, v, n) = pool_snapshot(&snapshot)?;
            let r = c
                .client
                .get(&format!("{}/{}", snapshot_path(&p, &v), encode_segment(&n)))?;
            c.answer(r, |x: SnapshotView| {
                kv(&[
                    ("snapshot", snapshot.clone()),
                    ("of", format!("{p}/{}", x.vdisk)),
                    ("size", format!("{} ({} bytes)", size(x.size), x.size)),
                    ("allocated", size(x.allocated_bytes)),
                    ("exclusive", size(x.exclusive_bytes)),
                    ("shared", size(x.shared_bytes)),
                    ("created", when(x.created)),
                ]);
                Ok(())
            })?;
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

pub(super) fn create_vdisk(name: &str, size: u64, l: &LayoutArgs) -> CreateVdisk {
    CreateVdisk {
        name: name.to_string(),
        size,
        layout: l.layout,
        copies: l.copies,
        columns: l.columns,
        interleave: l.interleave,
        provisioning: l.provisioning,
        grain_size: l.grain,
        block_size: l.block_size,
        physical_block_size: l.physical_block_size,
        write_cache_size: l.write_cache_size,
    }
}

/// "512 (4096 physical, 512e)", "512 (512n)" or "4096 (4Kn)".
pub(super) fn block_sizes(v: &VdiskView) -> String {
    let logical = v.block_size;
    match v.physical_block_size {
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
                body(&create_vdisk(&n, sz, &layout)),
            )?;
            c.answer(v, |x: VdiskView| {
                println!(
                    "vdisk {vdisk} created: {}, {}, {}",
                    size(x.size),
                    x.layout_description,
                    x.provisioning.as_str()
                );
                Ok(())
            })?;
        }
        VdiskCmd::List { pool } => {
            let v = match pool {
                Some(p) => c.client.get(&format!("/api/pools/{}/vdisks", encode_segment(&p)))?,
                None => c.client.get("/api/vdisks")?,
            };
            c.answer(v, |vdisks: Vec<VdiskView>| {
                vdisk_table(&vdisks);
                Ok(())
            })?;
        }
        VdiskCmd::Show { vdisk } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            let v = c.client.get(&format!(
                "/api/pools/{}/vdisks/{}",
                encode_segment(&p),
                encode_segment(&n)
            ))?;
            c.answer(v, |x: VdiskView| {
                kv(&[
                    ("vdisk", vdisk.clone()),
                    ("size", format!("{} ({} bytes)", size(x.size), x.size)),
                    ("allocated", size(x.allocated_bytes)),
                    ("exclusive", size(x.exclusive_bytes)),
                    ("shared", size(x.shared_bytes)),
                    ("snapshots", x.snapshots.to_string()),
                    ("provisioning", x.provisioning.as_str().to_string()),
                    ("layout", x.layout_description.clone()),
                    ("block size", block_sizes(&x)),
                    ("grain size", size(x.grain_size)),
                    (
                        "write-back cache",
                        if x.write_cache_size == 0 {
                            "off".to_string()
                        } else {
                            format!(
                                "up to {} ({} dirty; used only in a pool with cache disks)",
                                size(x.write_cache_size),
                                size(x.cache_dirty_bytes)
                            )
                        },
                    ),
                ]);
                Ok(())
            })?;
        }
        VdiskCmd::Clone { source, name } => {
            let (p, n) = pool_vdisk(&source)?;
            let name = name.strip_prefix(&format!("{p}/")).unwrap_or(&name).to_string();
            let v = c.client.post(
                &format!("/api/pools/{}/vdisks/{}/clone", encode_segment(&p), encode_segment(&n)),
                body(&CloneVdisk { name: name.clone() }),
            )?;
            c.answer(v, |x: CloneView| {
                println!(
                    "vdisk {p}/{name} cloned from {source}: {} shared, {} copied",
                    size(x.shared_bytes),
                    size(x.copied_bytes)
                );
                Ok(())
            })?;
        }
        VdiskCmd::Resize { vdisk, size: sz } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            let v = c.client.post(
                &format!("/api/pools/{}/vdisks/{}/resize", encode_segment(&p), encode_segment(&n)),
                body(&ResizeVdisk { size: sz }),
            )?;
            c.answer(v, |x: VdiskView| {
                println!("vdisk {vdisk} is now {}", size(x.size));
                Ok(())
            })?;
        }
        VdiskCmd::WriteCache { vdisk, size: sz } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            let v = c.client.put(
                &format!(
                    "/api/pools/{}/vdisks/{}/write-cache",
                    encode_segment(&p),
                    encode_segment(&n)
                ),
                body(&SetWriteCache { size: sz }),
            )?;
            c.answer(v, |x: VdiskView| {
                if x.write_cache_size == 0 {
                    println!("vdisk {vdisk}: write-back cache off (its writes go straight to the layout)");
                } else {
                    println!("vdisk {vdisk}: write-back cache of {}", size(x.write_cache_size));
                }
                Ok(())
            })?;
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
                body(&ImportImage {
                    path: abs(&image)?,
                    create: Some(create_vdisk(&n, sz.unwrap_or(0), &layout)),
                }),
            )?;
            follow(c, v, no_wait)?;
        }
        VdiskCmd::Export {
            vdisk,
            image,
            overwrite,
            rate,
            no_wait,
        } => {
            let (p, n) = pool_vdisk(&vdisk)?;
            let v = c.client.post(
                &format!("/api/pools/{}/vdisks/{}/export", encode_segment(&p), encode_segment(&n)),
                body(&ExportImage {
                    path: abs(&image)?,
                    overwrite,
                    rate_limit: rate,
                }),
            )?;
            follow(c, v, no_wait)?;
        }
    }
    Ok(())
}
