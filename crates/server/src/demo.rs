//! The embedded demo: four sparse 8 GiB file disks in `<state dir>/disks`, the pool `demo` and
//! a thin two-way mirror `demo/vol1` of 16 GiB, created on first start and reopened after,
//! presented as LUN 0 of an iSCSI target and as the NBD export `vol1`.

use std::path::PathBuf;

use tessera_disk::FileDisk;
use tessera_volume::{LayoutKind, Provisioning};
use tracing::info;

use crate::daemon::Daemon;
use crate::model::{CreatePool, CreateVdisk};

pub const POOL: &str = "demo";
pub const VDISK: &str = "vol1";
pub const TARGET: &str = "iqn.2026-11.io.tessera:demo";
const DISKS: usize = 4;
/// Four disks hold the mirrored vdisk twice over (32 GiB) with room for a repair onto three.
const DISK_SIZE: u64 = 12 << 30;
const VDISK_SIZE: u64 = 16 << 30;

pub fn prepare(d: &Daemon) -> Result<(), String> {
    if d.engine(POOL).is_err() {
        if d.cfg.pools_dir().join(POOL).join("meta").is_dir() {
            d.import_pool(POOL, None, false)
                .map_err(|e| format!("cannot reopen the demo pool: {}", e.message))?;
        } else {
            let dir = d.cfg.state_dir.join("disks");
            std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let mut disks = Vec::new();
            for i in 0..DISKS {
                let p: PathBuf = dir.join(format!("disk{i}.img"));
                if !p.exists() {
                    FileDisk::create_file(&p, DISK_SIZE, false).map_err(|e| e.to_string())?;
                }
                disks.push(p.display().to_string());
            }
            d.create_pool(CreatePool {
                name: POOL.into(),
                disks,
                slab_size: None,
                cache_disks: Vec::new(),
                rados: None,
                capacity: None,
            })
            .map_err(|e| {
                format!(
                    "cannot create the demo pool: {}. If {} holds an older demo, remove that directory and start again",
                    e.message,
                    d.cfg.state_dir.display()
                )
            })?;
            info!("demo pool created");
        }
    }
    let engine = d.engine(POOL).map_err(|e| e.message)?;
    if engine.vdisk(VDISK).is_err() {
        d.create_vdisk(
            POOL,
            CreateVdisk {
                name: VDISK.into(),
                size: VDISK_SIZE,
                layout: Some(LayoutKind::Mirror),
                copies: Some(2),
                provisioning: Some(Provisioning::Thin),
                ..Default::default()
            },
        )
        .map_err(|e| format!("cannot create the demo vdisk: {}", e.message))?;
    }
    // The demo's target admits any initiator, which a target does only when asked: the demo
    // asks, for its portal on loopback (the banner says so).
    match d.targets.get(TARGET) {
        Err(_) => {
            d.create_target(TARGET, true)
                .map_err(|e| format!("cannot create the demo target: {}", e.message))?;
        }
        Ok(t) if t.acl.is_empty() && !t.allow_any_initiator => {
            d.set_allow_any_initiator(TARGET, true)
                .map_err(|e| format!("cannot open the demo target: {}", e.message))?;
        }
        Ok(_) => {}
    }
    if d.targets.get(TARGET).map(|t| t.luns.is_empty()).unwrap_or(false) {
        d.add_lun(
            TARGET,
            crate::model::AddLun {
                lun: Some(0),
                vdisk: format!("{POOL}/{VDISK}"),
            },
        )
        .map_err(|e| format!("cannot export the demo vdisk: {}", e.message))?;
    }
    if d.nbd.get(VDISK).is_err() {
        d.add_nbd_export(crate::model::CreateNbdExport {
            vdisk: format!("{POOL}/{VDISK}"),
            name: Some(VDISK.into()),
            read_only: false,
        })
        .map_err(|e| format!("cannot export the demo vdisk over NBD: {}", e.message))?;
    }
    Ok(())
}
