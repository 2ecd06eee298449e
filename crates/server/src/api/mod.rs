//! The management API: HTTP + JSON, served on the state directory's unix socket and, if
//! configured, on TCP. Every capability of the CLI goes through it.

mod body;
mod handlers;
pub mod openapi;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;

use crate::daemon::Daemon;
use crate::error::{code, ApiError};

pub use body::Body;

/// The router for one listener. `token`, when given, is required as a bearer token.
pub fn router(daemon: Arc<Daemon>, token: Option<String>) -> Router {
    use handlers::*;
    let r = Router::new()
        .route("/api/health", get(health))
        .route("/api/openapi.json", get(openapi_doc))
        .route("/api/pools", get(list_pools).post(create_pool))
        .route("/api/pools/importable", get(importable_pools))
        .route("/api/pools/import", post(import_pool))
        .route("/api/pools/{pool}", get(show_pool).delete(destroy_pool))
        .route("/api/pools/{pool}/export", post(export_pool))
        .route("/api/pools/{pool}/repair", post(repair_pool))
        .route("/api/pools/{pool}/check", post(check_pool))
        .route("/api/pools/{pool}/disks", get(list_disks).post(add_disk))
        .route("/api/pools/{pool}/disks/{disk}/{action}", post(disk_action))
        .route("/api/vdisks", get(list_all_vdisks))
        .route("/api/pools/{pool}/vdisks", get(list_vdisks).post(create_vdisk))
        .route("/api/pools/{pool}/vdisks/{vdisk}", get(show_vdisk).delete(delete_vdisk))
        .route("/api/pools/{pool}/vdisks/{vdisk}/resize", post(resize_vdisk))
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
        .route("/api/targets/{iqn}/chap", put(chap_set).delete(chap_clear))
        .route("/api/iscsi/portals", get(list_portals).post(add_portal))
        .route("/api/iscsi/portals/{address}", delete(remove_portal))
        .route("/api/nbd/exports", get(list_nbd_exports).post(create_nbd_export))
        .route(
            "/api/nbd/exports/{name}",
            get(show_nbd_export).delete(delete_nbd_export),
        )
        .route("/api/jobs", get(list_jobs))
        .route("/api/jobs/{id}", get(show_job))
        .route("/api/jobs/{id}/cancel", post(cancel_job))
        .fallback(no_such_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(daemon);
    match token {
        Some(t) => r.layer(middleware::from_fn_with_state(Arc::new(t), require_token)),
        None => r,
    }
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

async fn require_token(State(token): State<Arc<String>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), token.as_bytes()) => next.run(req).await,
        _ => ApiError::unauthorized().into_response(),
    }
}

/// Compares without an early exit, so that timing does not tell how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_comparison() {
        assert!(super::constant_time_eq(b"abc", b"abc"));
        assert!(!super::constant_time_eq(b"abc", b"abd"));
        assert!(!super::constant_time_eq(b"abc", b"abcd"));
    }
}
