//! One handler per route. Each runs the daemon's blocking work on a blocking thread.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use super::body::{Body, Path};
use crate::daemon::Daemon;
use crate::error::{ApiError, ApiResult};
use crate::jobs::JobView;
use crate::model::*;

type D = State<Arc<Daemon>>;

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> ApiResult<T> + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await?
}

async fn json<T: Serialize + Send + 'static>(f: impl FnOnce() -> ApiResult<T> + Send + 'static) -> ApiResult<Json<T>> {
    blocking(f).await.map(Json)
}

async fn created<T: Serialize + Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<(StatusCode, Json<T>)> {
    blocking(f).await.map(|v| (StatusCode::CREATED, Json(v)))
}

async fn accepted(f: impl FnOnce() -> ApiResult<JobView> + Send + 'static) -> ApiResult<(StatusCode, Json<JobView>)> {
    blocking(f).await.map(|v| (StatusCode::ACCEPTED, Json(v)))
}

async fn done(f: impl FnOnce() -> ApiResult<()> + Send + 'static) -> ApiResult<StatusCode> {
    blocking(f).await.map(|()| StatusCode::NO_CONTENT)
}

/// The metrics in the Prometheus text exposition format.
pub async fn metrics(State(d): D) -> ApiResult<([(axum::http::header::HeaderName, &'static str); 1], String)> {
    let text = blocking(move || Ok(crate::metrics::render(&d))).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    ))
}

pub async fn health(State(d): D) -> Json<HealthView> {
    Json(d.health())
}

pub async fn openapi_doc() -> Json<serde_json::Value> {
    Json(super::openapi::document())
}

pub async fn list_pools(State(d): D) -> ApiResult<Json<Vec<PoolSummary>>> {
    json(move || Ok(d.list_pools())).await
}

pub async fn create_pool(State(d): D, Body(req): Body<CreatePool>) -> ApiResult<(StatusCode, Json<PoolSummary>)> {
    created(move || d.create_pool(req)).await
}

pub async fn importable_pools(State(d): D) -> ApiResult<Json<Vec<ImportablePool>>> {
    json(move || d.importable()).await
}

pub async fn import_pool(State(d): D, Body(req): Body<ImportPool>) -> ApiResult<Json<PoolSummary>> {
    json(move || d.import_pool(&req.name, req.rados.as_ref(), req.without_log)).await
}

pub async fn show_pool(State(d): D, Path(pool): Path<String>) -> ApiResult<Json<PoolDetail>> {
    json(move || d.pool_detail(&pool)).await
}

pub async fn destroy_pool(State(d): D, Path(pool): Path<String>) -> ApiResult<StatusCode> {
    done(move || d.destroy_pool(&pool)).await
}

pub async fn abandon_destroy(State(d): D, Path(pool): Path<String>) -> ApiResult<StatusCode> {
    done(move || d.abandon_destroy(&pool)).await
}

pub async fn export_pool(State(d): D, Path(pool): Path<String>) -> ApiResult<StatusCode> {
    done(move || d.export_pool(&pool)).await
}

pub async fn move_pool(State(d): D, Path(pool): Path<String>, Body(req): Body<MovePool>) -> ApiResult<StatusCode> {
    done(move || d.move_pool(&pool, &req.to)).await
}

pub async fn repair_pool(
    State(d): D,
    Path(pool): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<JobView>)> {
    let req: RepairPool = optional_body(&body)?;
    accepted(move || d.repair_pool(&pool, req)).await
}

pub async fn scrub_pool(
    State(d): D,
    Path(pool): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<JobView>)> {
    let req: ScrubPool = optional_body(&body)?;
    accepted(move || d.scrub_pool(&pool, req)).await
}

/// A request body a route may go without: none (or only whitespace) means the defaults.
fn optional_body<T: Default + serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::malformed(format!("the request body is not what this route takes: {e}")))
}

pub async fn dedup_status(State(d): D, Path(pool): Path<String>) -> ApiResult<Json<DedupStatus>> {
    json(move || d.dedup_status(&pool)).await
}

pub async fn set_dedup(
    State(d): D,
    Path(pool): Path<String>,
    Body(req): Body<SetDedup>,
) -> ApiResult<Json<DedupStatus>> {
    json(move || d.set_dedup(&pool, req)).await
}

pub async fn dedup_run(
    State(d): D,
    Path(pool): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<JobView>)> {
    let req: PassOptions = optional_body(&body)?;
    accepted(move || d.dedup_run(&pool, req)).await
}

pub async fn dedup_gc(State(d): D, Path(pool): Path<String>) -> ApiResult<(StatusCode, Json<JobView>)> {
    accepted(move || d.dedup_gc(&pool)).await
}

pub async fn scan_pool(State(d): D, Path(pool): Path<String>) -> ApiResult<(StatusCode, Json<JobView>)> {
    accepted(move || d.scan_pool(&pool)).await
}

pub async fn spotfix_pool(State(d): D, Path(pool): Path<String>) -> ApiResult<(StatusCode, Json<JobView>)> {
    accepted(move || d.spotfix_pool(&pool)).await
}

/// `?after=ID&limit=N`, both optional.
pub async fn scan_result(
    State(d): D,
    Path(pool): Path<String>,
    axum::extract::RawQuery(q): axum::extract::RawQuery,
) -> ApiResult<Json<ScanResult>> {
    let (mut after, mut limit) = (0u64, None);
    for pair in q.as_deref().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let bad = |what: &str| ApiError::invalid(format!("query parameter {k}={v}: {what}"));
        match k {
            "after" => after = v.parse().map_err(|_| bad("not a finding id"))?,
            "limit" => limit = Some(v.parse().map_err(|_| bad("not a number"))?),
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{k}' (after, limit)"
                )))
            }
        }
    }
    json(move || d.scan_result(&pool, after, limit)).await
}

pub async fn pause_scrub(State(d): D, Path(pool): Path<String>) -> ApiResult<Json<ScrubView>> {
    json(move || d.pause_scrub(&pool)).await
}

pub async fn set_auto_repair(
    State(d): D,
    Path(pool): Path<String>,
    Body(req): Body<SetAutoRepair>,
) -> ApiResult<Json<PoolSummary>> {
    json(move || d.set_auto_repair(&pool, req)).await
}

pub async fn check_pool(State(d): D, Path(pool): Path<String>) -> ApiResult<Json<tessera_volume::CheckReport>> {
    json(move || d.check_pool(&pool)).await
}

pub async fn list_disks(State(d): D, Path(pool): Path<String>) -> ApiResult<Json<Vec<DiskView>>> {
    json(move || Ok(d.pool_detail(&pool)?.disk_list)).await
}

pub async fn add_disk(
    State(d): D,
    Path(pool): Path<String>,
    Body(req): Body<AddDisk>,
) -> ApiResult<(StatusCode, Json<DiskView>)> {
    created(move || d.add_disk(&pool, &req.path, req.spare, req.usage)).await
}

pub async fn disk_action(
    State(d): D,
    Path((pool, disk, action)): Path<(String, String, String)>,
) -> ApiResult<Json<DiskView>> {
    json(move || d.set_disk(&pool, &disk, &action)).await
}

pub async fn list_all_vdisks(State(d): D) -> ApiResult<Json<Vec<VdiskView>>> {
    json(move || d.list_vdisks(None)).await
}

pub async fn list_vdisks(State(d): D, Path(pool): Path<String>) -> ApiResult<Json<Vec<VdiskView>>> {
    json(move || d.list_vdisks(Some(&pool))).await
}

pub async fn create_vdisk(
    State(d): D,
    Path(pool): Path<String>,
    Body(req): Body<CreateVdisk>,
) -> ApiResult<(StatusCode, Json<VdiskView>)> {
    created(move || d.create_vdisk(&pool, req)).await
}

pub async fn show_vdisk(State(d): D, Path((pool, vdisk)): Path<(String, String)>) -> ApiResult<Json<VdiskView>> {
    json(move || d.show_vdisk(&pool, &vdisk)).await
}

pub async fn delete_vdisk(State(d): D, Path((pool, vdisk)): Path<(String, String)>) -> ApiResult<StatusCode> {
    done(move || d.delete_vdisk(&pool, &vdisk)).await
}

pub async fn clone_vdisk(
    State(d): D,
    Path((pool, vdisk)): Path<(String, String)>,
    Body(req): Body<CloneVdisk>,
) -> ApiResult<(StatusCode, Json<CloneView>)> {
    created(move || d.clone_vdisk(&pool, &vdisk, req)).await
}

pub async fn create_snapshot(
    State(d): D,
    Path((pool, vdisk)): Path<(String, String)>,
    Body(req): Body<CreateSnapshot>,
) -> ApiResult<(StatusCode, Json<SnapshotView>)> {
    created(move || d.create_snapshot(&pool, &vdisk, req)).await
}

pub async fn list_all_snapshots(State(d): D) -> ApiResult<Json<Vec<SnapshotView>>> {
    json(move || d.list_snapshots(None, None)).await
}

pub async fn list_pool_snapshots(State(d): D, Path(pool): Path<String>) -> ApiResult<Json<Vec<SnapshotView>>> {
    json(move || d.list_snapshots(Some(&pool), None)).await
}

pub async fn list_snapshots(
    State(d): D,
    Path((pool, vdisk)): Path<(String, String)>,
) -> ApiResult<Json<Vec<SnapshotView>>> {
    json(move || d.list_snapshots(Some(&pool), Some(&vdisk))).await
}

pub async fn show_snapshot(
    State(d): D,
    Path((pool, vdisk, snapshot)): Path<(String, String, String)>,
) -> ApiResult<Json<SnapshotView>> {
    json(move || d.show_snapshot(&pool, &vdisk, &snapshot)).await
}

pub async fn delete_snapshot(
    State(d): D,
    Path((pool, vdisk, snapshot)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    done(move || d.delete_snapshot(&pool, &vdisk, &snapshot)).await
}

pub async fn resize_vdisk(
    State(d): D,
    Path((pool, vdisk)): Path<(String, String)>,
    Body(req): Body<ResizeVdisk>,
) -> ApiResult<Json<VdiskView>> {
    json(move || d.resize_vdisk(&pool, &vdisk, req.size)).await
}

pub async fn set_write_cache(
    State(d): D,
    Path((pool, vdisk)): Path<(String, String)>,
    Body(req): Body<SetWriteCache>,
) -> ApiResult<Json<VdiskView>> {
    json(move || d.set_write_cache(&pool, &vdisk, req.size)).await
}

pub async fn import_image(
    State(d): D,
    Path((pool, vdisk)): Path<(String, String)>,
    Body(req): Body<ImportImage>,
) -> ApiResult<(StatusCode, Json<JobView>)> {
    accepted(move || d.import_image(&pool, &vdisk, req)).await
}

pub async fn export_image(
    State(d): D,
    Path((pool, vdisk)): Path<(String, String)>,
    Body(req): Body<ExportImage>,
) -> ApiResult<(StatusCode, Json<JobView>)> {
    accepted(move || d.export_image(&pool, &vdisk, req)).await
}

pub async fn list_jobs(State(d): D) -> Json<Vec<JobView>> {
    Json(d.jobs.list())
}

fn job_id(s: &str) -> ApiResult<u64> {
    s.parse()
        .map_err(|_| ApiError::invalid(format!("'{s}' is not a job id: job ids are numbers")))
}

/// The longest `?wait=SECONDS` a request for a job may hold.
const MAX_JOB_WAIT: f64 = 30.0;

/// `?wait=SECONDS`, optional: answers once the job ended or after that long, whichever
/// comes first (a client following a job learns of its end at once).
pub async fn show_job(
    State(d): D,
    Path(id): Path<String>,
    axum::extract::RawQuery(q): axum::extract::RawQuery,
) -> ApiResult<Json<JobView>> {
    let mut wait = 0.0;
    for pair in q.as_deref().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "wait" => {
                wait = v
                    .parse::<f64>()
                    .ok()
                    .filter(|w| w.is_finite() && (0.0..=MAX_JOB_WAIT).contains(w))
                    .ok_or_else(|| {
                        ApiError::invalid(format!("query parameter wait={v}: seconds from 0 to {MAX_JOB_WAIT}"))
                    })?
            }
            _ => return Err(ApiError::invalid(format!("unknown query parameter '{k}' (wait)"))),
        }
    }
    let job = d.jobs.get(job_id(&id)?)?;
    if wait > 0.0 {
        job.wait(std::time::Duration::from_secs_f64(wait)).await;
    }
    Ok(Json(job.view()))
}

pub async fn cancel_job(State(d): D, Path(id): Path<String>) -> ApiResult<Json<JobView>> {
    Ok(Json(d.jobs.cancel(job_id(&id)?)?))
}

pub async fn list_targets(State(d): D) -> ApiResult<Json<Vec<TargetView>>> {
    json(move || Ok(d.list_targets())).await
}

pub async fn create_target(State(d): D, Body(req): Body<CreateTarget>) -> ApiResult<(StatusCode, Json<TargetView>)> {
    created(move || d.create_target(&req.iqn, req.allow_any_initiator)).await
}

pub async fn set_allow_any_initiator(
    State(d): D,
    Path(iqn): Path<String>,
    Body(req): Body<AllowAnyInitiator>,
) -> ApiResult<Json<TargetView>> {
    json(move || d.set_allow_any_initiator(&iqn, req.allow)).await
}

pub async fn show_target(State(d): D, Path(iqn): Path<String>) -> ApiResult<Json<TargetView>> {
    json(move || d.target_view(&iqn)).await
}

pub async fn delete_target(State(d): D, Path(iqn): Path<String>) -> ApiResult<StatusCode> {
    done(move || d.delete_target(&iqn)).await
}

pub async fn add_lun(
    State(d): D,
    Path(iqn): Path<String>,
    Body(req): Body<AddLun>,
) -> ApiResult<(StatusCode, Json<TargetView>)> {
    created(move || d.add_lun(&iqn, req)).await
}

pub async fn acl_add(
    State(d): D,
    Path(iqn): Path<String>,
    Body(req): Body<AclEntry>,
) -> ApiResult<(StatusCode, Json<TargetView>)> {
    created(move || d.acl_add(&iqn, &req.initiator)).await
}

pub async fn acl_remove(State(d): D, Path((iqn, initiator)): Path<(String, String)>) -> ApiResult<Json<TargetView>> {
    json(move || d.acl_remove(&iqn, &initiator)).await
}

pub async fn chap_set(State(d): D, Path(iqn): Path<String>, Body(req): Body<SetChap>) -> ApiResult<Json<TargetView>> {
    json(move || d.chap_set(&iqn, None, req)).await
}

pub async fn initiator_chap_set(
    State(d): D,
    Path((iqn, initiator)): Path<(String, String)>,
    Body(req): Body<SetChap>,
) -> ApiResult<Json<TargetView>> {
    json(move || d.chap_set(&iqn, Some(&initiator), req)).await
}

pub async fn initiator_chap_clear(
    State(d): D,
    Path((iqn, initiator)): Path<(String, String)>,
) -> ApiResult<Json<TargetView>> {
    json(move || d.chap_clear(&iqn, Some(&initiator))).await
}

pub async fn chap_clear(State(d): D, Path(iqn): Path<String>) -> ApiResult<Json<TargetView>> {
    json(move || d.chap_clear(&iqn, None)).await
}

pub async fn remove_lun(State(d): D, Path((iqn, lun)): Path<(String, String)>) -> ApiResult<Json<TargetView>> {
    let lun: u64 = lun
        .parse()
        .map_err(|_| ApiError::invalid(format!("'{lun}' is not a LUN number")))?;
    json(move || d.remove_lun(&iqn, lun)).await
}

pub async fn list_portals(State(d): D) -> ApiResult<Json<Vec<PortalView>>> {
    json(move || Ok(d.portals.list())).await
}

pub async fn add_portal(State(d): D, Body(req): Body<AddPortal>) -> ApiResult<(StatusCode, Json<PortalView>)> {
    created(move || d.portals.add(&req.address)).await
}

pub async fn remove_portal(State(d): D, Path(address): Path<String>) -> ApiResult<StatusCode> {
    done(move || d.portals.remove(&address)).await
}

pub async fn list_nbd_exports(State(d): D) -> ApiResult<Json<Vec<NbdExportView>>> {
    json(move || Ok(d.list_nbd_exports())).await
}

pub async fn create_nbd_export(
    State(d): D,
    Body(req): Body<CreateNbdExport>,
) -> ApiResult<(StatusCode, Json<NbdExportView>)> {
    created(move || d.add_nbd_export(req)).await
}

pub async fn show_nbd_export(State(d): D, Path(name): Path<String>) -> ApiResult<Json<NbdExportView>> {
    json(move || d.show_nbd_export(&name)).await
}

pub async fn delete_nbd_export(State(d): D, Path(name): Path<String>) -> ApiResult<StatusCode> {
    done(move || d.remove_nbd_export(&name)).await
}

pub async fn list_replicas(State(d): D) -> ApiResult<Json<ReplicaList>> {
    json(move || Ok(d.list_replicas())).await
}

pub async fn create_replica(State(d): D, Body(req): Body<CreateReplica>) -> ApiResult<(StatusCode, Json<ReplicaView>)> {
    created(move || d.create_replica(req)).await
}

pub async fn show_replica(State(d): D, Path(name): Path<String>) -> ApiResult<Json<ReplicaView>> {
    json(move || d.replica_view(&name)).await
}

pub async fn set_replica(
    State(d): D,
    Path(name): Path<String>,
    Body(req): Body<SetReplica>,
) -> ApiResult<Json<ReplicaView>> {
    json(move || d.set_replica(&name, req)).await
}

pub async fn delete_replica(State(d): D, Path(name): Path<String>) -> ApiResult<StatusCode> {
    done(move || d.delete_replica(&name)).await
}

pub async fn sync_replica(State(d): D, Path(name): Path<String>) -> ApiResult<(StatusCode, Json<JobView>)> {
    accepted(move || d.sync_replica(&name)).await
}

pub async fn demote_replica(State(d): D, Path(name): Path<String>) -> ApiResult<Json<IncomingReplicaView>> {
    json(move || d.demote_replica(&name)).await
}

pub async fn show_incoming_replica(
    State(d): D,
    Path((pool, vdisk)): Path<(String, String)>,
) -> ApiResult<Json<IncomingReplicaView>> {
    json(move || d.incoming_view(&pool, &vdisk)).await
}

pub async fn promote_replica(
    State(d): D,
    Path((pool, vdisk)): Path<(String, String)>,
) -> ApiResult<Json<PromotedView>> {
    json(move || d.promote_replica(&pool, &vdisk)).await
}

pub async fn promote_replicas(State(d): D, Body(req): Body<PromoteReplicas>) -> ApiResult<Json<Vec<PromotedView>>> {
    json(move || d.promote_replicas(&req.pool, &req.vdisks)).await
}
