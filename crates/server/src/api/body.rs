//! A JSON request body whose rejections are API errors (JSON, stable code) rather than the
//! framework's plain-text ones.

use axum::extract::{FromRequest, Request};
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
