//! `tessera target`, `tessera portal` and `tessera nbd`: what the daemon serves.

use super::*;

/// The API answers a listing with a list and a change with the object changed; the tables
/// take either.
fn one_or_many<T: DeserializeOwned>(v: Value) -> Result<Vec<T>, ClientError> {
    if v.is_array() {
        read(v)
    } else {
        read(v).map(|t| vec![t])
    }
}

fn online(online: bool) -> String {
    if online {
        "online".into()
    } else {
        "offline: vdisk unavailable".into()
    }
}

pub(super) fn target_table(targets: &[TargetView]) {
    let mut rows = Vec::new();
    for t in targets {
        if t.luns.is_empty() {
            rows.push(vec![
                t.iqn.clone(),
                "-".into(),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        for l in &t.luns {
            rows.push(vec![
                t.iqn.clone(),
                l.lun.to_string(),
                l.vdisk.clone(),
                opt_size(l.size),
                match l.access.as_deref() {
                    Some("standby") => "standby: another gateway owns the pool".into(),
                    Some(a) if l.online => format!("online ({a})"),
                    _ => online(l.online),
                },
            ]);
        }
    }
    table(&["TARGET", "LUN", "VDISK", "SIZE", "STATE"], rows);
    for t in targets {
        let who = match (t.allow_any_initiator, t.acl.is_empty()) {
            (true, _) => "any initiator".to_string(),
            (false, true) => "no initiator (empty ACL)".to_string(),
            (false, false) => t.acl.join(", "),
        };
        let chap = match &t.chap {
            None => "no CHAP".to_string(),
            Some(c) => chap_words(c),
        };
        println!("{}: {who}; {chap}", t.iqn);
        for (initiator, c) in &t.initiator_chap {
            println!("  {initiator} logs in with its own {}", chap_words(c));
        }
        for l in &t.luns {
            let Some(r) = &l.reservations else { continue };
            let held = match &r.holder {
                None => "not reserved".to_string(),
                Some(h) => format!("reserved by {h} ({})", opt(&r.kind)),
            };
            println!(
                "  LUN {}: {held}; registered: {}{}",
                l.lun,
                r.registered.join(", "),
                if r.aptpl { "; kept across restarts" } else { "" }
            );
        }
    }
}

pub(super) fn portal(c: &Ctx, cmd: PortalCmd) -> R {
    let v = match cmd {
        PortalCmd::Add { address } => c.client.post("/api/iscsi/portals", body(&AddPortal { address }))?,
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
    c.answer(v, |v: Value| {
        let list: Vec<PortalView> = one_or_many(v)?;
        let buffer = |b: Option<u32>| match b {
            // The kernel reports twice what was asked for.
            Some(n) => format_size(u64::from(n) / 2),
            None => "auto".into(),
        };
        let rows = list
            .iter()
            .map(|p| {
                vec![
                    p.address.clone(),
                    p.source.clone(),
                    match &p.listening_on {
                        Some(a) => format!("listening on {a}"),
                        None => format!("not listening: {}", opt(&p.error)),
                    },
                    buffer(p.send_buffer),
                    buffer(p.recv_buffer),
                ]
            })
            .collect();
        table(&["PORTAL", "FROM", "STATE", "SNDBUF", "RCVBUF"], rows);
        for p in &list {
            if let Some(w) = &p.warning {
                println!("{}: {w}", p.address);
            }
        }
        Ok(())
    })
}

pub(super) fn target(c: &Ctx, cmd: TargetCmd) -> R {
    let path = |iqn: &str| format!("/api/targets/{}", encode_segment(iqn));
    let v = match cmd {
        TargetCmd::Create {
            iqn,
            allow_any_initiator,
        } => c.client.post(
            "/api/targets",
            body(&CreateTarget {
                iqn,
                allow_any_initiator,
            }),
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
        TargetCmd::Lun(LunCmd::Add { iqn, vdisk, lun }) => c
            .client
            .post(&format!("{}/luns", path(&iqn)), body(&AddLun { lun, vdisk }))?,
        TargetCmd::Lun(LunCmd::Remove { iqn, lun }) => c.client.delete(&format!("{}/luns/{lun}", path(&iqn)))?,
        TargetCmd::Acl(AclCmd::Add { iqn, initiator }) => c
            .client
            .post(&format!("{}/acl", path(&iqn)), body(&AclEntry { initiator }))?,
        TargetCmd::Acl(AclCmd::AllowAny { iqn, off }) => c.client.put(
            &format!("{}/allow-any-initiator", path(&iqn)),
            body(&AllowAnyInitiator { allow: !off }),
        )?,
        TargetCmd::Acl(AclCmd::Remove { iqn, initiator }) => {
            c.client
                .delete(&format!("{}/acl/{}", path(&iqn), encode_segment(&initiator)))?
        }
        TargetCmd::Chap(ChapCmd::Set {
            iqn,
            initiator,
            user,
            secret,
            mutual_user,
            mutual_secret,
        }) => c.client.put(
            &chap_path(&iqn, initiator.as_deref()),
            body(&SetChap {
                user,
                secret,
                mutual_user,
                mutual_secret,
            }),
        )?,
        TargetCmd::Chap(ChapCmd::Clear { iqn, initiator }) => {
            c.client.delete(&chap_path(&iqn, initiator.as_deref()))?
        }
        TargetCmd::Portal(p) => return portal(c, p),
    };
    c.answer(v, |v: Value| {
        target_table(&one_or_many(v)?);
        Ok(())
    })
}

/// The API path of a target's CHAP credentials, or of one initiator's.
fn chap_path(iqn: &str, initiator: Option<&str>) -> String {
    match initiator {
        Some(i) => format!("/api/targets/{}/acl/{}/chap", encode_segment(iqn), encode_segment(i)),
        None => format!("/api/targets/{}/chap", encode_segment(iqn)),
    }
}

fn chap_words(c: &ChapView) -> String {
    match &c.mutual_user {
        None => format!("CHAP user {}", c.user),
        Some(m) => format!("mutual CHAP, user {}, target user {m}", c.user),
    }
}

pub(super) fn nbd_table(exports: &[NbdExportView]) {
    let rows = exports
        .iter()
        .map(|e| {
            vec![
                e.name.clone(),
                e.vdisk.clone(),
                opt_size(e.size),
                if e.read_only { "read-only" } else { "read-write" }.to_string(),
                online(e.online),
                e.connections.to_string(),
            ]
        })
        .collect();
    table(&["EXPORT", "VDISK", "SIZE", "ACCESS", "STATE", "CONNECTIONS"], rows);
}

pub(super) fn nbd(c: &Ctx, cmd: NbdCmd) -> R {
    let path = |name: &str| format!("/api/nbd/exports/{}", encode_segment(name));
    let v = match cmd {
        NbdCmd::Export { vdisk, name, read_only } => c
            .client
            .post("/api/nbd/exports", body(&CreateNbdExport { vdisk, name, read_only }))?,
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
    c.answer(v, |v: Value| {
        nbd_table(&one_or_many(v)?);
        Ok(())
    })
}
