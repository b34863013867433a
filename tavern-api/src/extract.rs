//! Extractors whose rejections are [`ApiError`]s: a malformed body, query or path answers in
//! the same JSON shape, with the same codes, as every other error.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Self(v)),
            Err(e) => Err(json_rejection(&e)),
        }
    }
}

fn json_rejection(e: &JsonRejection) -> ApiError {
    match e.status() {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(
            "the body must be json (content-type: application/json)".into(),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge {
            limit: "request body bytes".into(),
            max: crate::app::MAX_BODY_BYTES,
            // The exact size is unknown: reading stopped at the limit.
            actual: crate::app::MAX_BODY_BYTES + 1,
        },
        _ => ApiError::BadRequest(format!(
            "invalid json body: {}",
            short(&e.body_text().to_lowercase())
        )),
    }
}

/// A query string.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| Self(v))
            .map_err(|e: QueryRejection| {
                ApiError::BadRequest(format!(
                    "invalid query: {}",
                    short(&e.body_text().to_lowercase())
                ))
            })
    }
}

/// Path parameters.
#[derive(Debug)]
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| Self(v))
            .map_err(|e: PathRejection| {
                ApiError::BadRequest(format!(
                    "invalid path: {}",
                    short(&e.body_text().to_lowercase())
                ))
            })
    }
}

/// A parser's message, which may quote the input, cut to a readable length.
fn short(message: &str) -> String {
    const MAX: usize = 200;
    let mut out: String = message.chars().take(MAX).collect();
    if message.chars().count() > MAX {
        out.push('…');
    }
    out
}
