//! The web dashboard: one page and its script and style, compiled into the binary (no build
//! step, nothing fetched from elsewhere), served at `/` on the API listeners behind the same
//! guard as the API (api/auth.rs: the login form, then a session cookie). The page draws
//! everything from the API itself, and `GET /api/stats/io` gives it the last hour of I/O.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::body::Path;
use crate::daemon::Daemon;
use crate::error::{ApiError, ApiResult};
use crate::io_history::IoHistoryView;

const INDEX: &str = include_str!("../dashboard/index.html");
const SCRIPT: &str = include_str!("../dashboard/app.js");
const STYLE: &str = include_str!("../dashboard/app.css");

/// A page that runs only its own script, talks only to its own origin, and is never framed by
/// another site (clickjacking).
pub fn secure_page_headers(h: &mut HeaderMap) {
    h.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    secure_page_headers(r.headers_mut());
    r
}

pub async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}

pub async fn ui_file(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "app.js" => asset(SCRIPT, "text/javascript; charset=utf-8"),
        "app.css" => asset(STYLE, "text/css; charset=utf-8"),
        _ => ApiError::not_found(format!("the dashboard has no file '{name}'")).into_response(),
    }
}

/// `GET /api/stats/io?minutes=N` (default and most: 60).
pub async fn io_stats(State(d): State<Arc<Daemon>>, RawQuery(q): RawQuery) -> ApiResult<Json<IoHistoryView>> {
    let mut minutes = 60.0;
    for pair in q.as_deref().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("minutes", v)) => {
                minutes = v
                    .parse::<f64>()
                    .ok()
                    .filter(|m| *m > 0.0 && *m <= 60.0)
                    .ok_or_else(|| ApiError::invalid(format!("minutes={v}: a number of minutes from 1 to 60")))?
            }
            _ => return Err(ApiError::invalid(format!("unknown query parameter '{pair}' (minutes)"))),
        }
    }
    Ok(Json(d.io_history.view(minutes * 60.0)))
}
