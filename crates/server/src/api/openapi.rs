//! The OpenAPI 3.1 document served at `/api/openapi.json`. The route table below is the one
//! place that lists the routes for clients (a test checks that the router serves every entry);
//! the schemas are generated from the types in `model.rs` that the handlers return and the CLI
//! reads, so the document cannot drift from them.

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{json, Map, Value};
use tessera_volume::CheckReport;

use crate::jobs::JobView;
use crate::model::*;

/// Writes the schema of one body into the generator's definitions and returns a reference to
/// it (or an inline schema, for lists and scalars).
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

pub struct RouteDoc {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    pub request: Option<SchemaFn>,
    /// Status and schema of the success response; `None` for 204 No Content.
    pub response: Option<(u16, SchemaFn)>,
}

const fn r(
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    request: Option<SchemaFn>,
    response: Option<(u16, SchemaFn)>,
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
        Some((200, schema::<HealthView>)),
    ),
    r("get", "/api/openapi.json", "This document", None, Some((200, schema::<serde_json::Value>))),
    r(
        "get",
        "/api/pools",
        "List pools, imported and unavailable",
        None,
        Some((200, schema::<Vec<PoolSummary>>)),
    ),
    r(
        "post",
        "/api/pools",
        "Create a pool on blank disks",
        Some(schema::<CreatePool>),
        Some((201, schema::<PoolSummary>)),
    ),
    r(
        "get",
        "/api/pools/importable",
        "Pools in the state directory that are not imported",
        None,
        Some((200, schema::<Vec<ImportablePool>>)),
    ),
    r(
        "post",
        "/api/pools/import",
        "Import a pool",
        Some(schema::<ImportPool>),
        Some((200, schema::<PoolSummary>)),
    ),
    r(
        "get",
        "/api/pools/{pool}",
        "A pool with its disks, vdisks and unhealthy slab sets",
        None,
        Some((200, schema::<PoolDetail>)),
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
        "/api/pools/{pool}/abandon-destroy",
        "Abandon the destruction of a pool on RADOS that this gateway has not finished (health 'destroying', after a stop or a failure): what is left of the pool stays in the cluster as it is, and its name is no longer refused here",
        None,
        None,
    ),
    r(
        "post",
        "/api/pools/{pool}/move",
        "Move a pool on Ceph RADOS to another gateway (one that presents LUNs of it or exports its vdisks over NBD): its owner hands it over at its next tick, and that gateway takes it; answers once the move is asked for",
        Some(schema::<MovePool>),
        None,
    ),
    r(
        "post",
        "/api/pools/{pool}/repair",
        "Start a repair job: rebuild or move every slab on a failed, missing or retired disk",
        Some(schema::<RepairPool>),
        Some((202, schema::<JobView>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/scrub",
        "Start a scrub job (or go on with the one paused): read every block of every copy, check it against its checksum and the redundancy, repair from the good copies",
        Some(schema::<ScrubPool>),
        Some((202, schema::<JobView>)),
    ),
    r(
        "get",
        "/api/pools/{pool}/dedup",
        "Deduplication of the pool: its settings, logical, physical and saved bytes and the ratio for the vdisks in scope, each vdisk's share, the fingerprint index, the last run",
        None,
        Some((200, schema::<DedupStatus>)),
    ),
    r(
        "put",
        "/api/pools/{pool}/dedup",
        "Change the pool's dedup settings (enabled, vdisks in scope, exclusions, minimum age, schedule, background rate); fields left out keep their value",
        Some(schema::<SetDedup>),
        Some((200, schema::<DedupStatus>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/dedup/run",
        "Start an optimization run: fingerprint the grains of the vdisks in scope not written for the minimum age, share identical ones (compared byte for byte), unmap grains of zeros",
        Some(schema::<PassOptions>),
        Some((202, schema::<JobView>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/dedup/gc",
        "Start a garbage collection: drop fingerprint index entries whose slot is free, give empty slab sets back to the pool",
        None,
        Some((202, schema::<JobView>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/scan",
        "Start an online scan of the pool's metadata (grain maps, reference counts, slab sets, stripe journal); the findings replace the last scan's",
        None,
        Some((202, schema::<JobView>)),
    ),
    r(
        "get",
        "/api/pools/{pool}/scan",
        "The last scan's report and its findings, a page at a time (query: after=ID, limit=N, at most 10000)",
        None,
        Some((200, schema::<ScanResult>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/spotfix",
        "Start a spot-fix: apply the repair of each finding of the last scan that still holds, while the vdisks stay online",
        None,
        Some((202, schema::<JobView>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/scrub/pause",
        "Pause the scrub under way; it keeps its position",
        None,
        Some((200, schema::<ScrubView>)),
    ),
    r(
        "put",
        "/api/pools/{pool}/auto-repair",
        "Let the daemon repair the pool by itself when a disk fails or stays missing (true), or not",
        Some(schema::<SetAutoRepair>),
        Some((200, schema::<PoolSummary>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/check",
        "Check the pool's metadata: every map entry and reference count",
        None,
        Some((200, schema::<CheckReport>)),
    ),
    r(
        "get",
        "/api/pools/{pool}/disks",
        "The pool's disks",
        None,
        Some((200, schema::<Vec<DiskView>>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/disks",
        "Add a blank disk to the pool (usage cache: for the write-back cache log)",
        Some(schema::<AddDisk>),
        Some((201, schema::<DiskView>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/disks/{disk}/{action}",
        "fail or retire a disk, or take back (online) one missing since the import or failed by an I/O error; {disk} is its id or its percent-encoded path",
        None,
        Some((200, schema::<DiskView>)),
    ),
    r(
        "get",
        "/api/vdisks",
        "Every vdisk of every imported pool",
        None,
        Some((200, schema::<Vec<VdiskView>>)),
    ),
    r(
        "get",
        "/api/pools/{pool}/vdisks",
        "The pool's vdisks",
        None,
        Some((200, schema::<Vec<VdiskView>>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks",
        "Create a vdisk",
        Some(schema::<CreateVdisk>),
        Some((201, schema::<VdiskView>)),
    ),
    r(
        "get",
        "/api/pools/{pool}/vdisks/{vdisk}",
        "A vdisk",
        None,
        Some((200, schema::<VdiskView>)),
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
        Some(schema::<CloneVdisk>),
        Some((201, schema::<CloneView>)),
    ),
    r(
        "get",
        "/api/snapshots",
        "Every snapshot of every imported pool",
        None,
        Some((200, schema::<Vec<SnapshotView>>)),
    ),
    r(
        "get",
        "/api/pools/{pool}/snapshots",
        "The pool's snapshots",
        None,
        Some((200, schema::<Vec<SnapshotView>>)),
    ),
    r(
        "get",
        "/api/pools/{pool}/vdisks/{vdisk}/snapshots",
        "The vdisk's snapshots, oldest first (also of a deleted vdisk, by its name)",
        None,
        Some((200, schema::<Vec<SnapshotView>>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks/{vdisk}/snapshots",
        "Take a read-only point-in-time snapshot VDISK@NAME, sharing every grain",
        Some(schema::<CreateSnapshot>),
        Some((201, schema::<SnapshotView>)),
    ),
    r(
        "get",
        "/api/pools/{pool}/vdisks/{vdisk}/snapshots/{snapshot}",
        "A snapshot",
        None,
        Some((200, schema::<SnapshotView>)),
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
        Some(schema::<ResizeVdisk>),
        Some((200, schema::<VdiskView>)),
    ),
    r(
        "put",
        "/api/pools/{pool}/vdisks/{vdisk}/write-cache",
        "Set how much of the pool's write-back cache a vdisk may fill (0: none)",
        Some(schema::<SetWriteCache>),
        Some((200, schema::<VdiskView>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks/{vdisk}/import",
        "Start a job that copies a raw image into the vdisk, trimming zero runs",
        Some(schema::<ImportImage>),
        Some((202, schema::<JobView>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/vdisks/{vdisk}/export",
        "Start a job that writes the vdisk to a sparse raw image",
        Some(schema::<ExportImage>),
        Some((202, schema::<JobView>)),
    ),
    r(
        "get",
        "/api/stats/io",
        "The last hour (or `?minutes=N`) of I/O per vdisk, one point per 5 seconds: IOPS, bytes per second, latency p50 and p99",
        None,
        Some((200, schema::<crate::io_history::IoHistoryView>)),
    ),
    r(
        "get",
        "/api/replicas",
        "Replication both ways: local vdisks replicated to peers (state, lag, RPO, totals, last cycle and its link report) and replicas held here for peers",
        None,
        Some((200, schema::<ReplicaList>)),
    ),
    r(
        "post",
        "/api/replicas",
        "Replicate a vdisk to a peer's replication listener: a cycle per interval, each a snapshot sent as what changed since the last snapshot both sites hold",
        Some(schema::<CreateReplica>),
        Some((201, schema::<ReplicaView>)),
    ),
    r("get", "/api/replicas/{name}", "One replica of a local vdisk", None, Some((200, schema::<ReplicaView>))),
    r(
        "put",
        "/api/replicas/{name}",
        "Pause or resume a replica, or change its interval, bandwidth or RPO; fields left out keep their value",
        Some(schema::<SetReplica>),
        Some((200, schema::<ReplicaView>)),
    ),
    r(
        "delete",
        "/api/replicas/{name}",
        "Stop replicating: the source's replication snapshots go, the copy at the peer stays",
        None,
        None,
    ),
    r(
        "post",
        "/api/replicas/{name}/sync",
        "Start a cycle now (the one cut short, if any, goes on)",
        None,
        Some((202, schema::<JobView>)),
    ),
    r(
        "post",
        "/api/replicas/{name}/demote",
        "Hand the source vdisk over to the peer whose replica was promoted: it becomes a replica here, kept by the peer's cycles",
        None,
        Some((200, schema::<IncomingReplicaView>)),
    ),
    r(
        "post",
        "/api/replica-promotions",
        "Promote the replicas of a consistency group together, each at the newest snapshot all of them hold",
        Some(schema::<PromoteReplicas>),
        Some((200, schema::<Vec<PromotedView>>)),
    ),
    r(
        "get",
        "/api/pools/{pool}/replicas/{vdisk}",
        "A replica held here for a peer: its source, cycles and consistent snapshots",
        None,
        Some((200, schema::<IncomingReplicaView>)),
    ),
    r(
        "post",
        "/api/pools/{pool}/replicas/{vdisk}/promote",
        "Make a replica held here a writable vdisk at its last consistent snapshot; its source's cycles are refused from then on",
        None,
        Some((200, schema::<PromotedView>)),
    ),
    r(
        "get",
        "/api/events",
        "The event log, oldest first: the newest `limit` (default 100), or the oldest after `?after=SEQ`; `severity` (the least) and `pool` filter",
        None,
        Some((200, schema::<super::events::EventList>)),
    ),
    r(
        "get",
        "/api/events/stream",
        "Follow the event log as server-sent events (text/event-stream), each one's data an Event; `?after=SEQ` sends the backlog after SEQ first; `severity` and `pool` filter",
        None,
        Some((200, schema::<crate::events::Event>)),
    ),
    r(
        "get",
        "/api/jobs",
        "Running and recently finished jobs",
        None,
        Some((200, schema::<Vec<JobView>>)),
    ),
    r(
        "get",
        "/api/jobs/{id}",
        "A job and its progress; `?wait=SECONDS` (at most 30) answers once the job ended or after that long",
        None,
        Some((200, schema::<JobView>)),
    ),
    r(
        "post",
        "/api/jobs/{id}/cancel",
        "Ask a job to stop",
        None,
        Some((200, schema::<JobView>)),
    ),
    r(
        "get",
        "/api/targets",
        "List iSCSI targets",
        None,
        Some((200, schema::<Vec<TargetView>>)),
    ),
    r(
        "post",
        "/api/targets",
        "Create an iSCSI target",
        Some(schema::<CreateTarget>),
        Some((201, schema::<TargetView>)),
    ),
    r(
        "get",
        "/api/targets/{iqn}",
        "An iSCSI target",
        None,
        Some((200, schema::<TargetView>)),
    ),
    r("delete", "/api/targets/{iqn}", "Delete an iSCSI target", None, None),
    r(
        "post",
        "/api/targets/{iqn}/luns",
        "Present a vdisk as a LUN",
        Some(schema::<AddLun>),
        Some((201, schema::<TargetView>)),
    ),
    r(
        "delete",
        "/api/targets/{iqn}/luns/{lun}",
        "Stop presenting a LUN",
        None,
        Some((200, schema::<TargetView>)),
    ),
    r(
        "post",
        "/api/targets/{iqn}/acl",
        "Allow an initiator; a non-empty ACL keeps every other initiator out",
        Some(schema::<AclEntry>),
        Some((201, schema::<TargetView>)),
    ),
    r(
        "delete",
        "/api/targets/{iqn}/acl/{initiator}",
        "Remove an initiator from the ACL",
        None,
        Some((200, schema::<TargetView>)),
    ),
    r(
        "put",
        "/api/targets/{iqn}/allow-any-initiator",
        "Admit any initiator (true), or only those of the ACL (false)",
        Some(schema::<AllowAnyInitiator>),
        Some((200, schema::<TargetView>)),
    ),
    r(
        "put",
        "/api/targets/{iqn}/chap",
        "Require CHAP (one-way, or mutual with the mutual pair)",
        Some(schema::<SetChap>),
        Some((200, schema::<TargetView>)),
    ),
    r(
        "delete",
        "/api/targets/{iqn}/chap",
        "Stop requiring CHAP",
        None,
        Some((200, schema::<TargetView>)),
    ),
    r(
        "put",
        "/api/targets/{iqn}/acl/{initiator}/chap",
        "CHAP credentials this initiator alone logs in with, in place of the target's",
        Some(schema::<SetChap>),
        Some((200, schema::<TargetView>)),
    ),
    r(
        "delete",
        "/api/targets/{iqn}/acl/{initiator}/chap",
        "The initiator logs in with the target's CHAP credentials again (or none)",
        None,
        Some((200, schema::<TargetView>)),
    ),
    r(
        "get",
        "/api/iscsi/portals",
        "List iSCSI portals: the configured one and those added",
        None,
        Some((200, schema::<Vec<PortalView>>)),
    ),
    r(
        "post",
        "/api/iscsi/portals",
        "Listen on one more iSCSI portal, kept across restarts",
        Some(schema::<AddPortal>),
        Some((201, schema::<PortalView>)),
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
        Some((200, schema::<Vec<NbdExportView>>)),
    ),
    r(
        "post",
        "/api/nbd/exports",
        "Export a vdisk over NBD",
        Some(schema::<CreateNbdExport>),
        Some((201, schema::<NbdExportView>)),
    ),
    r(
        "get",
        "/api/nbd/exports/{name}",
        "An NBD export",
        None,
        Some((200, schema::<NbdExportView>)),
    ),
    r(
        "delete",
        "/api/nbd/exports/{name}",
        "Stop exporting; open connections finish",
        None,
        None,
    ),
];

fn parameters(path: &str) -> Vec<Value> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
        .collect()
}

/// Requests are described as the daemon reads them (a field with a default may be left out),
/// responses as it writes them (every field is there unless it is skipped when empty).
fn generator(for_requests: bool) -> SchemaGenerator {
    let settings = SchemaSettings::draft2020_12().with(|s| s.definitions_path = "/components/schemas".into());
    let settings = if for_requests {
        settings.for_deserialize()
    } else {
        settings.for_serialize()
    };
    settings.into_generator()
}

fn content(schema: Schema) -> Value {
    json!({"application/json": {"schema": schema}})
}

pub fn document() -> Value {
    build().0
}

/// The document, and the names of types described differently as requests and as responses
/// (none, which a test checks: one name must mean one shape).
fn build() -> (Value, Vec<String>) {
    let mut requests = generator(true);
    let mut responses_gen = generator(false);
    let error = responses_gen.subschema_for::<crate::error::ErrorBody>();
    let mut paths = Map::new();
    for route in ROUTES {
        let mut op = Map::new();
        op.insert("summary".into(), json!(route.summary));
        let params = parameters(route.path);
        if !params.is_empty() {
            op.insert("parameters".into(), json!(params));
        }
        if let Some(req) = route.request {
            // A repair may be started with no body: every field has a default.
            let required = !route.path.ends_with("/repair") && !route.path.ends_with("/scrub");
            op.insert(
                "requestBody".into(),
                json!({"required": required, "content": content(req(&mut requests))}),
            );
        }
        let mut responses = Map::new();
        match route.response {
            Some((status, resp)) if route.path.ends_with("/stream") => responses.insert(
                status.to_string(),
                json!({"description": "a stream of events", "content": {"text/event-stream": {"schema": resp(&mut responses_gen)}}}),
            ),
            Some((status, resp)) => responses.insert(
                status.to_string(),
                json!({"description": "success", "content": content(resp(&mut responses_gen))}),
            ),
            None => responses.insert("204".into(), json!({"description": "done"})),
        };
        responses.insert(
            "default".into(),
            json!({"description": "an error", "content": content(error.clone())}),
        );
        op.insert("responses".into(), Value::Object(responses));
        let entry = paths.entry(route.path.to_string()).or_insert_with(|| json!({}));
        entry
            .as_object_mut()
            .expect("object")
            .insert(route.method.to_string(), Value::Object(op));
    }
    let mut schemas = requests.take_definitions(true);
    let mut two_ways = Vec::new();
    for (name, schema) in responses_gen.take_definitions(true) {
        match schemas.get(&name) {
            Some(existing) if *existing != schema => two_ways.push(name),
            _ => {
                schemas.insert(name, schema);
            }
        }
    }
    let doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tessera management API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Served on <state dir>/api.sock and on TCP. On TCP, send 'Authorization: Bearer <token>' (the configured token, or <state dir>/api-token) and a Host that names the listener; browser requests from another origin are refused. Sizes are bytes. Errors are {\"error\": {\"code\", \"message\"}}."
        },
        "components": {
            "schemas": Value::Object(schemas),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        },
        "paths": Value::Object(paths),
    });
    (doc, two_ways)
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

    #[test]
    fn one_name_means_one_shape() {
        let (_, two_ways) = build();
        assert!(
            two_ways.is_empty(),
            "described differently as request and response: {two_ways:?}"
        );
    }

    fn schema_of<'a>(doc: &'a Value, name: &str) -> &'a Value {
        let s = &doc["components"]["schemas"][name];
        assert!(s.is_object(), "no schema {name}");
        s
    }

    fn strings(v: &Value) -> Vec<&str> {
        v.as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    #[test]
    fn requests_refuse_unknown_fields_and_need_only_what_has_no_default() {
        let doc = document();
        let create = schema_of(&doc, "CreateVdisk");
        assert_eq!(create["additionalProperties"], json!(false));
        assert_eq!(strings(&create["required"]), ["name", "size"]);
        assert_eq!(create["properties"]["size"]["minimum"], json!(1));
        assert_eq!(create["properties"]["block_size"]["enum"], json!([512, 4096, null]));
        let chap = schema_of(&doc, "SetChap");
        assert_eq!(strings(&chap["required"]), ["user", "secret"]);
        assert_eq!(chap["properties"]["secret"]["minLength"], json!(12));
        let repair = schema_of(&doc, "RepairPool");
        assert!(repair.get("required").is_none_or(|r| strings(r).is_empty()));
        assert_eq!(
            doc["paths"]["/api/pools/{pool}/repair"]["post"]["requestBody"]["required"],
            json!(false)
        );
    }

    #[test]
    fn responses_promise_every_field_they_always_write() {
        let doc = document();
        let vdisk = schema_of(&doc, "Vdisk");
        for f in [
            "pool",
            "name",
            "size",
            "layout",
            "allocated_bytes",
            "exclusive_bytes",
            "snapshots",
        ] {
            assert!(strings(&vdisk["required"]).contains(&f), "Vdisk does not promise {f}");
        }
        // Written only when there are reservations.
        let target = schema_of(&doc, "Target").to_string();
        assert!(target.contains("allow_any_initiator"));
        let lun = schema_of(&doc, "LunView");
        assert!(!strings(&lun["required"]).contains(&"reservations"));
        assert!(strings(&lun["required"]).contains(&"online"));
        let list = &doc["paths"]["/api/vdisks"]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
        assert_eq!(list["type"], json!("array"));
        assert_eq!(list["items"]["$ref"], json!("#/components/schemas/Vdisk"));
    }

    #[test]
    fn errors_list_every_stable_code() {
        let doc = document();
        let codes = &schema_of(&doc, "ErrorDetail")["properties"]["code"]["enum"];
        assert_eq!(strings(codes), crate::error::code::ALL);
        assert!(crate::error::code::ALL.contains(&crate::error::code::FORBIDDEN));
    }

    #[test]
    fn described_enums_are_the_values_serde_writes() {
        let doc = document();
        let text = schema_of(&doc, "DiskState").to_string();
        for state in [
            tessera_pool::DiskState::Healthy,
            tessera_pool::DiskState::Failed,
            tessera_pool::DiskState::Retired,
            tessera_pool::DiskState::Missing,
            tessera_pool::DiskState::Spare,
        ] {
            let written = serde_json::to_value(state).unwrap();
            assert_eq!(written, json!(state.as_str()));
            assert!(text.contains(&written.to_string()), "{written} is not in the document");
        }
    }
}
