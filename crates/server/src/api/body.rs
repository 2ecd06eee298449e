//! A JSON request body and path parameters whose rejections are API errors (JSON, stable
//! code) rather than the framework's plain-text ones.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::{code, ApiError};

pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Body(v)),
            Err(rej) => Err(ApiError::new(
                rej.status(),
                code::MALFORMED_REQUEST,
                format!("the request body is not what this route takes: {}", rej.body_text()),
            )),
        }
    }
}

/// Path parameters: a name that is not valid UTF-8 once percent-decoded (`%FF`) is refused as
/// a malformed request, in JSON like every other refusal.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(rej) => Err(ApiError::new(
                rej.status(),
                code::MALFORMED_REQUEST,
                format!("the request's path is not what this route takes: {}", rej.body_text()),
            )),
        }
    }
}
