//! `tessera target`, `tessera portal` and `tessera nbd`: what the daemon serves.

use super::*;

pub(super) fn target_table(v: &Value) {
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

pub(super) fn portal(c: &Ctx, cmd: PortalCmd) -> R {
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

pub(super) fn target(c: &Ctx, cmd: TargetCmd) -> R {
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

pub(super) fn nbd_table(v: &Value) {
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

pub(super) fn nbd(c: &Ctx, cmd: NbdCmd) -> R {
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
