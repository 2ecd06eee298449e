//! The management API: HTTP + JSON, served on the state directory's unix socket and, if
//! configured, on TCP. Every capability of the CLI goes through it.

pub mod auth;
mod body;
pub mod dashboard;
pub mod events;
mod handlers;
pub mod listener;
pub mod openapi;

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware;
use axum::routing::{delete, get, post, put};
use axum::Router;

use crate::daemon::Daemon;
use crate::error::{code, ApiError};

pub use body::Body;

/// The router for one listener. `guard`, for a TCP listener, says what each request must
/// show (the token, a Host that names the listener, no foreign Origin).
pub fn router(daemon: Arc<Daemon>, guard: Option<Arc<auth::Guard>>) -> Router {
    use handlers::*;
    let r = Router::new()
        .route("/", get(dashboard::index))
        .route("/ui/{file}", get(dashboard::ui_file))
        .route("/api/stats/io", get(dashboard::io_stats))
        .route("/api/health", get(health))
        .route("/metrics", get(metrics))
        .route("/api/openapi.json", get(openapi_doc))
        .route("/api/pools", get(list_pools).post(create_pool))
        .route("/api/pools/importable", get(importable_pools))
        .route("/api/pools/import", post(import_pool))
        .route("/api/pools/{pool}", get(show_pool).delete(destroy_pool))
        .route("/api/pools/{pool}/export", post(export_pool))
        .route("/api/pools/{pool}/abandon-destroy", post(abandon_destroy))
        .route("/api/pools/{pool}/move", post(move_pool))
        .route("/api/pools/{pool}/repair", post(repair_pool))
        .route("/api/pools/{pool}/check", post(check_pool))
        .route("/api/pools/{pool}/scrub", post(scrub_pool))
        .route("/api/pools/{pool}/scrub/pause", post(pause_scrub))
        .route("/api/pools/{pool}/scan", get(scan_result).post(scan_pool))
        .route("/api/pools/{pool}/spotfix", post(spotfix_pool))
        .route("/api/pools/{pool}/auto-repair", put(set_auto_repair))
        .route("/api/pools/{pool}/dedup", get(dedup_status).put(set_dedup))
        .route("/api/pools/{pool}/dedup/run", post(dedup_run))
        .route("/api/pools/{pool}/dedup/gc", post(dedup_gc))
        .route("/api/pools/{pool}/disks", get(list_disks).post(add_disk))
        .route("/api/pools/{pool}/disks/{disk}/{action}", post(disk_action))
        .route("/api/vdisks", get(list_all_vdisks))
        .route("/api/pools/{pool}/vdisks", get(list_vdisks).post(create_vdisk))
        .route("/api/pools/{pool}/vdisks/{vdisk}", get(show_vdisk).delete(delete_vdisk))
        .route("/api/pools/{pool}/vdisks/{vdisk}/resize", post(resize_vdisk))
        .route("/api/pools/{pool}/vdisks/{vdisk}/write-cache", put(set_write_cache))
        .route("/api/pools/{pool}/vdisks/{vdisk}/clone", post(clone_vdisk))
        .route("/api/snapshots", get(list_all_snapshots))
        .route("/api/pools/{pool}/snapshots", get(list_pool_snapshots))
        .route(
            "/api/pools/{pool}/vdisks/{vdisk}/snapshots",
            get(list_snapshots).post(create_snapshot),
        )
        .route(
            "/api/pools/{pool}/vdisks/{vdisk}/snapshots/{snapshot}",
            get(show_snapshot).delete(delete_snapshot),
        )
        .route("/api/pools/{pool}/vdisks/{vdisk}/import", post(import_image))
        .route("/api/pools/{pool}/vdisks/{vdisk}/export", post(export_image))
        .route("/api/targets", get(list_targets).post(create_target))
        .route("/api/targets/{iqn}", get(show_target).delete(delete_target))
        .route("/api/targets/{iqn}/luns", post(add_lun))
        .route("/api/targets/{iqn}/luns/{lun}", delete(remove_lun))
        .route("/api/targets/{iqn}/acl", post(acl_add))
        .route("/api/targets/{iqn}/acl/{initiator}", delete(acl_remove))
        .route(
            "/api/targets/{iqn}/acl/{initiator}/chap",
            put(initiator_chap_set).delete(initiator_chap_clear),
        )
        .route("/api/targets/{iqn}/chap", put(chap_set).delete(chap_clear))
        .route("/api/targets/{iqn}/allow-any-initiator", put(set_allow_any_initiator))
        .route("/api/iscsi/portals", get(list_portals).post(add_portal))
        .route("/api/iscsi/portals/{address}", delete(remove_portal))
        .route("/api/nbd/exports", get(list_nbd_exports).post(create_nbd_export))
        .route(
            "/api/nbd/exports/{name}",
            get(show_nbd_export).delete(delete_nbd_export),
        )
        .route("/api/replicas", get(list_replicas).post(create_replica))
        .route(
            "/api/replicas/{name}",
            get(show_replica).put(set_replica).delete(delete_replica),
        )
        .route("/api/replicas/{name}/sync", post(sync_replica))
        .route("/api/replica-promotions", post(promote_replicas))
        .route("/api/replicas/{name}/demote", post(demote_replica))
        .route("/api/pools/{pool}/replicas/{vdisk}", get(show_incoming_replica))
        .route("/api/pools/{pool}/replicas/{vdisk}/promote", post(promote_replica))
        .route("/api/events", get(events::list_events))
        .route("/api/events/stream", get(events::stream_events))
        .route("/api/jobs", get(list_jobs))
        .route("/api/jobs/{id}", get(show_job))
        .route("/api/jobs/{id}/cancel", post(cancel_job))
        .fallback(no_such_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(daemon);
    match guard {
        Some(g) => r.layer(middleware::from_fn_with_state(g, auth::check)),
        None => r,
    }
}

/// The router of `metrics_listen`: GET /metrics only, behind the same guard as the API.
pub fn metrics_router(daemon: Arc<Daemon>, guard: Arc<auth::Guard>) -> Router {
    Router::new()
        .route("/metrics", get(handlers::metrics))
        .fallback(no_such_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(daemon)
        .layer(middleware::from_fn_with_state(guard, auth::check))
}

async fn no_such_route(req: Request) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        code::NO_SUCH_ROUTE,
        format!(
            "no API route {} {}; GET /api/openapi.json lists them",
            req.method(),
            req.uri().path()
        ),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        code::METHOD_NOT_ALLOWED,
        format!(
            "{} is not allowed on {}; GET /api/openapi.json lists the routes",
            req.method(),
            req.uri().path()
        ),
    )
}
