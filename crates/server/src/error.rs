//! The errors the management API returns: an HTTP status, a stable machine-readable code and a
//! message for a human that says what was wrong and what to do about it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tessera_disk::DiskError;
use tessera_layout::LayoutError;
use tessera_pool::PoolError;
use tessera_volume::VolumeError;

/// The stable codes; clients branch on these, never on the message.
pub mod code {
    pub const NOT_FOUND: &str = "not_found";
    pub const ALREADY_EXISTS: &str = "already_exists";
    pub const INVALID_ARGUMENT: &str = "invalid_argument";
    pub const MALFORMED_REQUEST: &str = "malformed_request";
    pub const NO_SPACE: &str = "no_space";
    pub const BUSY: &str = "busy";
    pub const UNAUTHORIZED: &str = "unauthorized";
    pub const FORBIDDEN: &str = "forbidden";
    pub const DATA_UNAVAILABLE: &str = "data_unavailable";
    pub const IO_ERROR: &str = "io_error";
    pub const INTERNAL: &str = "internal";
    pub const NO_SUCH_ROUTE: &str = "no_such_route";
    pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";

    /// Every code, for the API document.
    pub const ALL: &[&str] = &[
        NOT_FOUND,
        ALREADY_EXISTS,
        INVALID_ARGUMENT,
        MALFORMED_REQUEST,
        NO_SPACE,
        BUSY,
        UNAUTHORIZED,
        FORBIDDEN,
        DATA_UNAVAILABLE,
        IO_ERROR,
        INTERNAL,
        NO_SUCH_ROUTE,
        METHOD_NOT_ALLOWED,
    ];
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// The JSON body of an error: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorDetail {
    /// Stable, for programs to branch on.
    #[schemars(extend("enum" = code::ALL))]
    pub code: String,
    /// For a human: what was wrong and what to do.
    pub message: String,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, code::NOT_FOUND, message)
    }
    pub fn exists(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, code::ALREADY_EXISTS, message)
    }
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code::INVALID_ARGUMENT, message)
    }
    pub fn malformed(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code::MALFORMED_REQUEST, message)
    }
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, code::BUSY, message)
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL, message)
    }
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            code::UNAUTHORIZED,
            "a valid bearer token is required on this listener: send 'Authorization: Bearer <token>' \
             (the CLI reads it from --token or TESSERA_TOKEN, or from <state dir>/api-token when it can)",
        )
    }
    /// A service the request needs (etcd, the Ceph cluster) did not answer or refused.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code::DATA_UNAVAILABLE, message)
    }
    pub fn io(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, code::IO_ERROR, message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<DiskError> for ApiError {
    fn from(e: DiskError) -> ApiError {
        match e {
            DiskError::Open { .. } => ApiError::invalid(e.to_string()),
            DiskError::Io { .. } => ApiError::io(e.to_string()),
            DiskError::Unavailable { .. } => ApiError::unavailable(e.to_string()),
            _ => ApiError::invalid(e.to_string()),
        }
    }
}

impl From<PoolError> for ApiError {
    fn from(e: PoolError) -> ApiError {
        match e {
            PoolError::Disk(d) => d.into(),
            PoolError::Label(_) | PoolError::Invalid(_) => ApiError::invalid(e.to_string()),
            PoolError::Meta { .. } | PoolError::MetaRefused { .. } => ApiError::io(e.to_string()),
            PoolError::NoSuchDisk { .. } => ApiError::not_found(e.to_string()),
            PoolError::NoSpace { .. } => ApiError::new(StatusCode::INSUFFICIENT_STORAGE, code::NO_SPACE, e.to_string()),
            PoolError::Exists(_) => ApiError::exists(e.to_string()),
        }
    }
}

impl From<LayoutError> for ApiError {
    fn from(e: LayoutError) -> ApiError {
        match e {
            LayoutError::Pool(p) => p.into(),
            LayoutError::Invalid(_) => ApiError::invalid(e.to_string()),
            LayoutError::TooManyFailures { .. } | LayoutError::Refused { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code::DATA_UNAVAILABLE, e.to_string())
            }
            LayoutError::Io { .. } | LayoutError::FlushFailed { .. } | LayoutError::Journal(_) => {
                ApiError::io(e.to_string())
            }
            LayoutError::NoSuchSet(_) => ApiError::internal(e.to_string()),
            LayoutError::Cancelled => ApiError::busy("the operation was cancelled"),
        }
    }
}

impl From<VolumeError> for ApiError {
    fn from(e: VolumeError) -> ApiError {
        if e.is_no_space() {
            return ApiError::new(StatusCode::INSUFFICIENT_STORAGE, code::NO_SPACE, e.to_string());
        }
        match e {
            VolumeError::Layout(l) => l.into(),
            VolumeError::Pool(p) => p.into(),
            VolumeError::Invalid(_) | VolumeError::ReadOnly(_) => ApiError::invalid(e.to_string()),
            VolumeError::NoSuchVdisk(_) | VolumeError::Deleted(_) => ApiError::not_found(e.to_string()),
            VolumeError::Exists(_) => ApiError::exists(e.to_string()),
            VolumeError::NoSpace(_) => ApiError::new(StatusCode::INSUFFICIENT_STORAGE, code::NO_SPACE, e.to_string()),
            VolumeError::Cache(_) | VolumeError::Lost(_) | VolumeError::Corrupt(_) => ApiError::internal(e.to_string()),
        }
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> ApiError {
        ApiError::internal(format!("an internal task failed: {e}"))
    }
}
