//! The OpenAPI 3.1 document served at `/api/openapi.json`. The route table below is the one
//! place that lists the routes for clients; a test checks that the router serves every entry.

use serde_json::{json, Map, Value};

pub struct RouteDoc {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    pub request: Option<&'static str>,
    /// Status and schema of the success response; `None` for 204 No Content.
    pub response: Option<(u16, &'static str)>,
}

const fn r(
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    request: Option<&'static str>,
    response: Option<(u16, &'static str)>,
) -> RouteDoc {
    RouteDoc {
        method,
        path,
        summary,
        request,
        response,
    }
}

pub const ROUTES: &[RouteDoc] = &[
    r(
        "get",
        "/api/health",
        "Daemon version, uptime and state directory",
        None,
        Some((200, "Health")),
    ),
    r("get", "/api/openapi.json", "This document", None, Some((200, "Any"))),
    r(
        "get",
        "/api/pools",
        "List pools, imported and unavailable",
        None,
        Some((200, "PoolSummaryList")),
    ),
    r(
        "post",
        "/api/pools",
        "Create a pool on blank disks",
        Some("CreatePool"),
        Some((201, "PoolSummary")),
    ),
    r(
        "get",
        "/api/pools/importable",
        "Pools in the state directory that are not imported",
        None,
        Some((200, "ImportablePoolList")),
    ),
    r(
        "post",
        "/api/pools/import",
        "Import a pool",
        Some("ImportPool"),
        Some((200, "PoolSummary")),
    ),
    r(
        "get",
        "/api/pools/{pool}",
        "A pool with its disks, vdisks and unhealthy slab sets",
        None,
        Some((200, "PoolDetail")),
    ),
    r(
        "delete",
        "/api/pools/{pool}",
        "Destroy an empty pool: wipe its disk labels and metadata",
        None,
        None,
    ),
    r(
        "post",
        "/api/pools/{pool}/export",
        "Flush and export a pool; it stays in the state directory",
        None,
        None,
    ),
    r(
        "post",
        "/api/pools/{pool}/repair",
        "Start a repair job: rebuild or move every slab on a failed, missing or retired disk",
        Some("RepairPool"),
        Some((202, "Job")),
    ),
    r(
        "post",
        "/api/pools/{pool}/check",
        "Check the pool's metadata: every map entry and reference count",
        None,
        Some((200, "CheckReport")),
    ),
    r(
        "get",
        "/api/pools/{pool}/disks",
        "The pool's disks",
        None,
        Some((200, "DiskList")),
    ),
    r(
        "post",
        "/api/pools/{pool}/disks",
        "Add a blank disk to the pool",
        Some("AddDisk"),
        Some((201, "Disk")),
    ),
    r(
        "post",
        "/api/pools/{pool}/disks/{disk}/{action}",
        "fail or retire a disk; {disk} is its id or its percent-encoded path",
        None,
        Some((200, "Disk")),
    ),
    r(
        "get",
        "/api/vdisks",
        "Every vdisk of every imported pool",
        None,
        Some((200, "VdiskList")),
    ),
    r(
        "get",
        "/api/pools/{pool}/vdisks",
        "The pool's vdisks",
        None,
        Some((200, "VdiskList")),
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks",
        "Create a vdisk",
        Some("CreateVdisk"),
        Some((201, "Vdisk")),
    ),
    r(
        "get",
        "/api/pools/{pool}/vdisks/{vdisk}",
        "A vdisk",
        None,
        Some((200, "Vdisk")),
    ),
    r(
        "delete",
        "/api/pools/{pool}/vdisks/{vdisk}",
        "Delete a vdisk and free its space",
        None,
        None,
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks/{vdisk}/clone",
        "A thin copy-on-write clone of the vdisk or snapshot (VDISK@NAME), sharing all its grains",
        Some("CloneVdisk"),
        Some((201, "CloneResult")),
    ),
    r(
        "get",
        "/api/snapshots",
        "Every snapshot of every imported pool",
        None,
        Some((200, "SnapshotList")),
    ),
    r(
        "get",
        "/api/pools/{pool}/snapshots",
        "The pool's snapshots",
        None,
        Some((200, "SnapshotList")),
    ),
    r(
        "get",
        "/api/pools/{pool}/vdisks/{vdisk}/snapshots",
        "The vdisk's snapshots, oldest first (also of a deleted vdisk, by its name)",
        None,
        Some((200, "SnapshotList")),
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks/{vdisk}/snapshots",
        "Take a read-only point-in-time snapshot VDISK@NAME, sharing every grain",
        Some("CreateSnapshot"),
        Some((201, "Snapshot")),
    ),
    r(
        "get",
        "/api/pools/{pool}/vdisks/{vdisk}/snapshots/{snapshot}",
        "A snapshot",
        None,
        Some((200, "Snapshot")),
    ),
    r(
        "delete",
        "/api/pools/{pool}/vdisks/{vdisk}/snapshots/{snapshot}",
        "Delete a snapshot and free the grains only it held",
        None,
        None,
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks/{vdisk}/resize",
        "Grow a vdisk",
        Some("ResizeVdisk"),
        Some((200, "Vdisk")),
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks/{vdisk}/import",
        "Start a job that copies a raw image into the vdisk, trimming zero runs",
        Some("ImportImage"),
        Some((202, "Job")),
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks/{vdisk}/export",
        "Start a job that writes the vdisk to a sparse raw image",
        Some("ExportImage"),
        Some((202, "Job")),
    ),
    r(
        "get",
        "/api/jobs",
        "Running and recently finished jobs",
        None,
        Some((200, "JobList")),
    ),
    r(
        "get",
        "/api/jobs/{id}",
        "A job and its progress",
        None,
        Some((200, "Job")),
    ),
    r(
        "post",
        "/api/jobs/{id}/cancel",
        "Ask a job to stop",
        None,
        Some((200, "Job")),
    ),
    r(
        "get",
        "/api/targets",
        "List iSCSI targets",
        None,
        Some((200, "TargetList")),
    ),
    r(
        "post",
        "/api/targets",
        "Create an iSCSI target",
        Some("CreateTarget"),
        Some((201, "Target")),
    ),
    r(
        "get",
        "/api/targets/{iqn}",
        "An iSCSI target",
        None,
        Some((200, "Target")),
    ),
    r("delete", "/api/targets/{iqn}", "Delete an iSCSI target", None, None),
    r(
        "post",
        "/api/targets/{iqn}/luns",
        "Present a vdisk as a LUN",
        Some("AddLun"),
        Some((201, "Target")),
    ),
    r(
        "delete",
        "/api/targets/{iqn}/luns/{lun}",
        "Stop presenting a LUN",
        None,
        Some((200, "Target")),
    ),
    r(
        "post",
        "/api/targets/{iqn}/acl",
        "Allow an initiator; a non-empty ACL keeps every other initiator out",
        Some("AclEntry"),
        Some((201, "Target")),
    ),
    r(
        "delete",
        "/api/targets/{iqn}/acl/{initiator}",
        "Remove an initiator from the ACL",
        None,
        Some((200, "Target")),
    ),
    r(
        "put",
        "/api/targets/{iqn}/allow-any-initiator",
        "Admit any initiator (true), or only those of the ACL (false)",
        Some("AllowAnyInitiator"),
        Some((200, "Target")),
    ),
    r(
        "put",
        "/api/targets/{iqn}/chap",
        "Require CHAP (one-way, or mutual with the mutual pair)",
        Some("SetChap"),
        Some((200, "Target")),
    ),
    r(
        "delete",
        "/api/targets/{iqn}/chap",
        "Stop requiring CHAP",
        None,
        Some((200, "Target")),
    ),
    r(
        "get",
        "/api/iscsi/portals",
        "List iSCSI portals: the configured one and those added",
        None,
        Some((200, "PortalList")),
    ),
    r(
        "post",
        "/api/iscsi/portals",
        "Listen on one more iSCSI portal, kept across restarts",
        Some("AddPortal"),
        Some((201, "Portal")),
    ),
    r(
        "delete",
        "/api/iscsi/portals/{address}",
        "Stop listening on an added portal; its sessions go on until they log out",
        None,
        None,
    ),
    r(
        "get",
        "/api/nbd/exports",
        "List NBD exports",
        None,
        Some((200, "NbdExportList")),
    ),
    r(
        "post",
        "/api/nbd/exports",
        "Export a vdisk over NBD",
        Some("CreateNbdExport"),
        Some((201, "NbdExport")),
    ),
    r(
        "get",
        "/api/nbd/exports/{name}",
        "An NBD export",
        None,
        Some((200, "NbdExport")),
    ),
    r(
        "delete",
        "/api/nbd/exports/{name}",
        "Stop exporting; open connections finish",
        None,
        None,
    ),
];

fn int() -> Value {
    json!({"type": "integer", "minimum": 0})
}
fn opt_int() -> Value {
    json!({"type": ["integer", "null"], "minimum": 0})
}
fn string() -> Value {
    json!({"type": "string"})
}
fn opt_string() -> Value {
    json!({"type": ["string", "null"]})
}
fn list(item: &str) -> Value {
    json!({"type": "array", "items": {"$ref": format!("#/components/schemas/{item}")}})
}
fn obj(required: &[&str], props: Value) -> Value {
    json!({"type": "object", "required": required, "properties": props})
}

fn schemas() -> Value {
    let layout_kind = json!({"type": "string", "enum": ["simple", "mirror", "parity", "dual-parity"]});
    let capacity = obj(
        &["total_bytes", "used_bytes", "free_bytes"],
        json!({"total_bytes": int(), "used_bytes": int(), "free_bytes": int()}),
    );
    let pool_summary_props = json!({
        "name": string(), "id": string(),
        "health": {"type": "string", "enum": ["healthy", "degraded", "failed", "unavailable"]},
        "problem": opt_string(), "disks": int(), "healthy_disks": int(),
        "capacity": {"oneOf": [{"$ref": "#/components/schemas/Capacity"}, {"type": "null"}]},
        "slab_size": int(), "vdisks": int(), "repair_needed_bytes": int(),
        "jobs_running": {"type": "array", "items": int()},
        "warnings": {"type": "array", "items": string(), "description": "e.g. space past the thin provisioning threshold"}
    });
    let mut detail_props = pool_summary_props.clone();
    let m = detail_props.as_object_mut().expect("object");
    m.insert("disk_list".into(), list("Disk"));
    m.insert("vdisk_list".into(), list("Vdisk"));
    m.insert(
        "unhealthy_sets".into(),
        json!({"type": "array", "items": obj(&["id", "layout", "state", "unavailable", "tolerance"], json!({
            "id": int(), "layout": string(), "state": string(), "unavailable": int(), "tolerance": int()}))}),
    );
    m.insert(
        "stats".into(),
        obj(&[], json!({"read_errors": int(), "write_errors": int(), "reconstructed_reads": int(), "repaired_blocks": int()})),
    );
    let create_vdisk = json!({
        "type": "object", "required": ["name", "size"], "additionalProperties": false,
        "properties": {
            "name": string(), "size": {"type": "integer", "minimum": 1, "description": "bytes, a multiple of the block size"},
            "layout": {"oneOf": [layout_kind.clone(), {"type": "null"}]},
            "copies": {"type": ["integer", "null"], "enum": [2, 3, null]},
            "columns": opt_int(), "interleave": opt_int(),
            "provisioning": {"type": ["string", "null"], "enum": ["thin", "fixed", null]},
            "grain_size": opt_int(),
            "block_size": {"type": ["integer", "null"], "enum": [512, 4096, null]},
            "physical_block_size": {"type": ["integer", "null"], "enum": [512, 4096, null],
                "description": "what initiators are told (READ CAPACITY); absent: 4096"}
        }
    });
    json!({
        "Any": {},
        "Error": obj(&["error"], json!({"error": obj(&["code", "message"], json!({
            "code": {"type": "string", "description": "stable: not_found, already_exists, invalid_argument, malformed_request, no_space, busy, unauthorized, data_unavailable, io_error, internal, no_such_route, method_not_allowed"},
            "message": {"type": "string", "description": "for a human: what was wrong and what to do"}
        }))})),
        "Health": obj(&["version", "state_dir", "uptime_seconds", "pools", "demo"], json!({
            "version": string(), "state_dir": string(), "uptime_seconds": {"type": "number"}, "pools": int(), "demo": {"type": "boolean"}})),
        "Capacity": capacity,
        "PoolSummary": obj(&["name", "health"], pool_summary_props),
        "PoolSummaryList": list("PoolSummary"),
        "PoolDetail": obj(&["name", "health", "disk_list", "vdisk_list"], detail_props),
        "CreatePool": {"type": "object", "required": ["name", "disks"], "additionalProperties": false, "properties": {
            "name": string(), "disks": {"type": "array", "minItems": 1, "items": {"type": "string", "description": "absolute path"}},
            "slab_size": opt_int()}},
        "ImportPool": {"type": "object", "required": ["name"], "additionalProperties": false, "properties": {"name": string()}},
        "ImportablePoolList": {"type": "array", "items": obj(&["name", "dir"], json!({"name": string(), "dir": string()}))},
        "RepairPool": {"type": "object", "additionalProperties": false, "properties": {
            "parallel": {"type": ["integer", "null"], "minimum": 1, "maximum": 64},
            "rate_limit": {"type": ["integer", "null"], "minimum": 1, "description": "bytes per second"}}},
        "CheckReport": obj(&["grains_mapped", "slots_referenced", "problems"], json!({
            "grains_mapped": int(), "slots_referenced": int(), "problems": {"type": "array", "items": string()}})),
        "Disk": obj(&["id", "position", "path", "size", "state"], json!({
            "id": string(), "position": int(), "path": string(), "size": int(),
            "state": {"type": "string", "enum": ["healthy", "failed", "retired", "missing"]},
            "slabs": int(), "slabs_used": int(), "used_bytes": int(), "problem": opt_string()})),
        "DiskList": list("Disk"),
        "AddDisk": {"type": "object", "required": ["path"], "additionalProperties": false, "properties": {"path": string()}},
        "CreateVdisk": create_vdisk,
        "Vdisk": obj(&["pool", "name", "size", "block_size", "grain_size", "layout", "provisioning", "allocated_bytes"], json!({
            "pool": string(), "name": string(), "size": int(), "block_size": int(), "physical_block_size": int(), "grain_size": int(),
            "layout": obj(&["kind", "copies", "columns", "interleave"], json!({
                "kind": layout_kind, "copies": int(), "columns": int(), "interleave": int()})),
            "layout_description": string(),
            "provisioning": {"type": "string", "enum": ["thin", "fixed"]},
            "allocated_bytes": int(),
            "exclusive_bytes": {"type": "integer", "description": "grains only this vdisk points at: what deleting it frees"},
            "shared_bytes": {"type": "integer", "description": "grains shared with clones, snapshots or copies in flight"},
            "snapshots": int()})),
        "VdiskList": list("Vdisk"),
        "CreateSnapshot": {"type": "object", "required": ["name"], "additionalProperties": false, "properties": {
            "name": {"type": "string", "description": "the snapshot is then VDISK@NAME"}}},
        "Snapshot": obj(&["pool", "vdisk", "name", "full_name", "size", "created", "allocated_bytes", "exclusive_bytes", "shared_bytes"], json!({
            "pool": string(), "vdisk": {"type": "string", "description": "the vdisk it was taken of"}, "name": string(),
            "full_name": {"type": "string", "description": "VDISK@NAME, as clone, nbd export and target lun add take it"},
            "size": int(), "created": {"type": "integer", "description": "seconds since the Unix epoch"},
            "allocated_bytes": int(), "exclusive_bytes": int(), "shared_bytes": int()})),
        "SnapshotList": list("Snapshot"),
        "CloneVdisk": {"type": "object", "required": ["name"], "additionalProperties": false, "properties": {
            "name": {"type": "string", "description": "the clone's name, in the same pool"}}},
        "CloneResult": obj(&["vdisk", "shared_bytes", "copied_bytes"], json!({
            "vdisk": {"$ref": "#/components/schemas/Vdisk"}, "shared_bytes": int(), "copied_bytes": int()})),
        "ResizeVdisk": {"type": "object", "required": ["size"], "additionalProperties": false, "properties": {"size": int()}},
        "ImportImage": {"type": "object", "required": ["path"], "additionalProperties": false, "properties": {
            "path": {"type": "string", "description": "absolute path of a raw image, as the daemon sees it"},
            "create": {"oneOf": [{"$ref": "#/components/schemas/CreateVdisk"}, {"type": "null"}]}}},
        "ExportImage": {"type": "object", "required": ["path"], "additionalProperties": false, "properties": {
            "path": string(), "overwrite": {"type": "boolean", "default": false}}},
        "Job": obj(&["id", "kind", "target", "state", "total_bytes", "done_bytes"], json!({
            "id": int(), "kind": {"type": "string", "enum": ["repair", "import", "export"]}, "target": string(),
            "state": {"type": "string", "enum": ["running", "succeeded", "failed", "cancelled"]},
            "total_bytes": int(), "done_bytes": int(), "rate": {"type": "number"},
            "eta_seconds": {"type": ["number", "null"]}, "started_at": int(), "finished_at": opt_int(),
            "elapsed_seconds": {"type": "number"}, "error": opt_string(), "result": {}})),
        "JobList": list("Job"),
        "CreateTarget": {"type": "object", "required": ["iqn"], "additionalProperties": false, "properties": {
            "iqn": {"type": "string", "description": "iqn.YYYY-MM.reversed.domain[:name], eui.<16 hex> or naa.<16|32 hex>"},
            "allow_any_initiator": {"type": "boolean", "description": "admit any initiator; default false: only the ACL's"}}},
        "AllowAnyInitiator": {"type": "object", "required": ["allow"], "additionalProperties": false, "properties": {
            "allow": {"type": "boolean"}}},
        "AddLun": {"type": "object", "required": ["vdisk"], "additionalProperties": false, "properties": {
            "lun": {"type": ["integer", "null"], "minimum": 0, "maximum": 16383}, "vdisk": {"type": "string", "description": "POOL/NAME"}}},
        "Target": obj(&["iqn", "luns", "acl", "allow_any_initiator"], json!({"iqn": string(), "luns": {"type": "array", "items": obj(&["lun", "vdisk", "online"], json!({
            "lun": int(), "vdisk": string(), "online": {"type": "boolean"}, "size": opt_int(),
            "reservations": {"description": "persistent reservations, when an initiator has registered", "type": "object", "properties": {
                "generation": int(), "registered": {"type": "array", "items": string()}, "holder": opt_string(),
                "kind": opt_string(), "aptpl": {"type": "boolean"}}}}))},
            "acl": {"type": "array", "items": string(), "description": "initiators allowed in"},
            "allow_any_initiator": {"type": "boolean", "description": "any initiator is admitted, the ACL notwithstanding"},
            "chap": {"oneOf": [{"type": "null"}, obj(&["user"], json!({"user": string(), "mutual_user": opt_string()}))]}})),
        "AclEntry": {"type": "object", "required": ["initiator"], "additionalProperties": false, "properties": {
            "initiator": {"type": "string", "description": "the initiator's iSCSI name"}}},
        "SetChap": {"type": "object", "required": ["user", "secret"], "additionalProperties": false, "properties": {
            "user": string(), "secret": {"type": "string", "minLength": 12, "maxLength": 255},
            "mutual_user": string(), "mutual_secret": {"type": "string", "minLength": 12, "maxLength": 255}}},
        "TargetList": list("Target"),
        "AddPortal": {"type": "object", "required": ["address"], "additionalProperties": false, "properties": {
            "address": {"type": "string", "description": "IP:PORT, [IPv6]:PORT, or an IP for port 3260"}}},
        "Portal": obj(&["address", "source"], json!({
            "address": string(), "source": {"type": "string", "enum": ["config", "api"]},
            "listening_on": opt_string(), "send_buffer": opt_int(), "recv_buffer": opt_int(),
            "warning": opt_string(), "error": opt_string()})),
        "PortalList": list("Portal"),
        "CreateNbdExport": {"type": "object", "required": ["vdisk"], "additionalProperties": false, "properties": {
            "vdisk": {"type": "string", "description": "POOL/NAME"},
            "name": {"type": ["string", "null"], "description": "export name; default: the vdisk's name", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
            "read_only": {"type": "boolean", "default": false}}},
        "NbdExport": obj(&["name", "vdisk", "read_only", "online", "connections"], json!({
            "name": string(), "vdisk": string(), "read_only": {"type": "boolean"}, "online": {"type": "boolean"},
            "size": opt_int(), "connections": int()})),
        "NbdExportList": list("NbdExport"),
    })
}

fn parameters(path: &str) -> Vec<Value> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
        .collect()
}

pub fn document() -> Value {
    let mut paths = Map::new();
    for route in ROUTES {
        let mut op = Map::new();
        op.insert("summary".into(), json!(route.summary));
        let params = parameters(route.path);
        if !params.is_empty() {
            op.insert("parameters".into(), json!(params));
        }
        if let Some(req) = route.request {
            op.insert(
                "requestBody".into(),
                json!({"required": route.path.ends_with("/repair").then_some(false).unwrap_or(true),
                       "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{req}")}}}}),
            );
        }
        let mut responses = Map::new();
        match route.response {
            Some((status, schema)) => responses.insert(
                status.to_string(),
                json!({"description": "success", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}}),
            ),
            None => responses.insert("204".into(), json!({"description": "done"})),
        };
        responses.insert(
            "default".into(),
            json!({"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
        );
        op.insert("responses".into(), Value::Object(responses));
        let entry = paths.entry(route.path.to_string()).or_insert_with(|| json!({}));
        entry
            .as_object_mut()
            .expect("object")
            .insert(route.method.to_string(), Value::Object(op));
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tessera management API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Served on <state dir>/api.sock and on TCP. On TCP, send 'Authorization: Bearer <token>' (the configured token, or <state dir>/api-token) and a Host that names the listener; browser requests from another origin are refused. Sizes are bytes. Errors are {\"error\": {\"code\", \"message\"}}."
        },
        "components": {
            "schemas": schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        },
        "paths": Value::Object(paths),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_referenced_exists() {
        let doc = document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for part in text.split("#/components/schemas/").skip(1) {
            let name: String = part.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            assert!(schemas.contains_key(&name), "missing schema {name}");
        }
        assert_eq!(
            doc["paths"]["/api/pools/{pool}/vdisks/{vdisk}"]["get"]["parameters"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }
}
