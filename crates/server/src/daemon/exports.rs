//! What the daemon serves: iSCSI targets with their LUNs, ACLs and CHAP, and NBD exports.

use super::*;

/// CHAP credentials as the API shows them: the user names, never the secrets.
fn chap_view(c: SetChap) -> ChapView {
    ChapView {
        user: c.user,
        mutual_user: c.mutual_user,
    }
}

impl Daemon {
    /// Where a vdisk (or, with a trailing '/', any vdisk of a pool) is served: LUNs and exports.
    pub(crate) fn users_of(&self, prefix_or_name: &str) -> Vec<String> {
        let mut u = self.targets.users_of(prefix_or_name);
        u.extend(self.nbd.users_of(prefix_or_name));
        u
    }

    pub fn target_view(&self, iqn: &str) -> ApiResult<TargetView> {
        let cfg = self.targets.get(iqn)?;
        let luns = cfg
            .luns
            .iter()
            .map(|(&lun, vd)| {
                let v = vd.split_once('/').and_then(|(p, n)| self.vdisk(p, n).ok());
                let presented = self.targets.registry.target(iqn).and_then(|t| t.lun(lun));
                let access = presented
                    .as_ref()
                    .and_then(|l| l.access())
                    .map(|a| a.name().to_string());
                LunView {
                    lun,
                    vdisk: vd.clone(),
                    // The vdisk is there but its LUN may still not be presented: its saved
                    // state could not be taken (the daemon's log says why).
                    online: v.is_some() && presented.is_some(),
                    size: v.map(|(_, v)| v.size()),
                    reservations: presented.map(|l| l.reservations()).and_then(reservations_view),
                    access,
                }
            })
            .collect();
        let sessions = self
            .targets
            .registry
            .sessions()
            .into_iter()
            .filter(|(_, t, _)| *t == cfg.iqn)
            .map(|(initiator, _, tsih)| SessionView { initiator, tsih })
            .collect();
        Ok(TargetView {
            sessions,
            iqn: cfg.iqn,
            luns,
            acl: cfg.acl,
            allow_any_initiator: cfg.allow_any_initiator,
            chap: cfg.chap.map(chap_view),
            initiator_chap: cfg.initiator_chap.into_iter().map(|(i, c)| (i, chap_view(c))).collect(),
        })
    }

    pub fn list_targets(&self) -> Vec<TargetView> {
        self.targets
            .list()
            .iter()
            .filter_map(|t| self.target_view(&t.iqn).ok())
            .collect()
    }

    pub fn create_target(&self, iqn: &str, allow_any_initiator: bool) -> ApiResult<TargetView> {
        self.targets.create(iqn, allow_any_initiator)?;
        self.target_view(iqn)
    }

    pub fn set_allow_any_initiator(&self, iqn: &str, allow: bool) -> ApiResult<TargetView> {
        self.targets.set_allow_any(iqn, allow)?;
        self.target_view(iqn)
    }

    pub fn delete_target(&self, iqn: &str) -> ApiResult<()> {
        self.targets.delete(iqn)
    }

    pub fn add_lun(&self, iqn: &str, req: AddLun) -> ApiResult<TargetView> {
        let (p, n) = req
            .vdisk
            .split_once('/')
            .ok_or_else(|| ApiError::invalid(format!("'{}' does not name a vdisk: write POOL/NAME", req.vdisk)))?;
        // Found and presented as one step for a delete of the vdisk or an export of its pool.
        let _users = self.users.lock();
        // A LUN of a replica's working copy would show cycles half applied: its snapshots are
        // the consistent, read-only images. Checked whether the pool is served here or not.
        self.refuse_if_replica(p, n, "presented as a LUN")?;
        let served = match self.vdisk(p, n) {
            Ok(served) => Some(served),
            // A pool on RADOS that another gateway serves: the LUN is made ready here, for
            // when this gateway takes the pool over.
            Err(e) => match self.waiting_rados_pool(p) {
                Some(owner) => {
                    info!(target = %iqn, vdisk = %req.vdisk, owner = %owner, "LUN recorded; presented once this gateway takes the pool");
                    None
                }
                None => return Err(e),
            },
        };
        self.targets.add_lun(iqn, req.lun, &req.vdisk, served)?;
        self.target_view(iqn)
    }

    pub fn remove_lun(&self, iqn: &str, lun: u64) -> ApiResult<TargetView> {
        self.targets.remove_lun(iqn, lun)?;
        self.target_view(iqn)
    }

    pub fn acl_add(&self, iqn: &str, initiator: &str) -> ApiResult<TargetView> {
        self.targets.acl_add(iqn, initiator)?;
        self.target_view(iqn)
    }

    pub fn acl_remove(&self, iqn: &str, initiator: &str) -> ApiResult<TargetView> {
        self.targets.acl_remove(iqn, initiator)?;
        self.target_view(iqn)
    }

    pub fn chap_set(&self, iqn: &str, initiator: Option<&str>, chap: SetChap) -> ApiResult<TargetView> {
        self.targets.chap_set(iqn, initiator, chap)?;
        self.target_view(iqn)
    }

    pub fn chap_clear(&self, iqn: &str, initiator: Option<&str>) -> ApiResult<TargetView> {
        self.targets.chap_clear(iqn, initiator)?;
        self.target_view(iqn)
    }

    // ---- NBD exports ----

    fn nbd_view(&self, c: NbdExportConfig) -> NbdExportView {
        let v = c.vdisk.split_once('/').and_then(|(p, n)| self.vdisk(p, n).ok());
        NbdExportView {
            connections: self.nbd.connections(&c.name),
            online: v.is_some(),
            size: v.map(|(_, v)| v.size()),
            name: c.name,
            vdisk: c.vdisk,
            read_only: c.read_only,
        }
    }

    pub fn list_nbd_exports(&self) -> Vec<NbdExportView> {
        self.nbd.list().into_iter().map(|c| self.nbd_view(c)).collect()
    }

    pub fn show_nbd_export(&self, name: &str) -> ApiResult<NbdExportView> {
        Ok(self.nbd_view(self.nbd.get(name)?))
    }

    /// Exports a vdisk over NBD, by default under its own name.
    pub fn add_nbd_export(&self, req: CreateNbdExport) -> ApiResult<NbdExportView> {
        let (p, n) = req
            .vdisk
            .split_once('/')
            .ok_or_else(|| ApiError::invalid(format!("'{}' does not name a vdisk: write POOL/NAME", req.vdisk)))?;
        let cfg = NbdExportConfig {
            name: req.name.unwrap_or_else(|| n.to_string()),
            vdisk: req.vdisk.clone(),
            read_only: req.read_only,
        };
        let name = cfg.name.clone();
        // Found and offered as one step for a delete of the vdisk or an export of its pool.
        let _users = self.users.lock();
        if !req.read_only {
            self.refuse_if_replica(p, n, "exported writable (export it read-only)")?;
        }
        let v = match self.vdisk(p, n) {
            Ok((_, v)) => v,
            // A pool on RADOS that another gateway serves: the export is made ready here, for
            // when this gateway takes the pool over.
            Err(e) => match self.waiting_rados_pool(p) {
                Some(owner) => {
                    self.nbd.add_waiting(cfg)?;
                    info!(export = %name, vdisk = %req.vdisk, owner = %owner, "NBD export recorded; offered once this gateway takes the pool");
                    return self.show_nbd_export(&name);
                }
                None => return Err(e),
            },
        };
        self.nbd.add(cfg, v)?;
        self.show_nbd_export(&name)
    }

    pub fn remove_nbd_export(&self, name: &str) -> ApiResult<()> {
        self.nbd.remove(name)
    }
}

fn port_name(p: &tessera_scsi::pr::PortId) -> String {
    match p.isid {
        Some(i) => format!(
            "{},i,0x{}",
            p.initiator,
            i.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
        None => p.initiator.clone(),
    }
}

/// What `target show` says of a LUN's persistent reservations; None when nobody registered.
fn reservations_view(pr: tessera_scsi::PrState) -> Option<ReservationsView> {
    if pr.registrations.is_empty() && pr.reservation.is_none() {
        return None;
    }
    let (holder, kind) = match &pr.reservation {
        Some(r) => {
            let all = matches!(r.kind, 7 | 8);
            let kind = match r.kind {
                1 => "write exclusive",
                3 => "exclusive access",
                5 => "write exclusive, registrants only",
                6 => "exclusive access, registrants only",
                7 => "write exclusive, all registrants",
                8 => "exclusive access, all registrants",
                _ => "unknown",
            };
            let holder = if all {
                "all registrants".to_string()
            } else {
                port_name(&r.holder)
            };
            (Some(holder), Some(kind.to_string()))
        }
        None => (None, None),
    };
    Some(ReservationsView {
        generation: pr.generation,
        registered: pr.registrations.iter().map(|r| port_name(&r.port)).collect(),
        holder,
        kind,
        aptpl: pr.aptpl,
    })
}
