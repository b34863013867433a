//! Requests a host carries itself: a host whose web server is not ours (DSH's, through its
//! plugin and the bridge's frames) hands the API the method, path, type and body it received
//! and writes back what comes out — the same handlers `tavern serve` runs, without a socket.

use axum::body::Body;
use axum::http::{header, Request};
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::app::Api;
use crate::error::ApiError;

/// A request as a host received it. The host has admitted the caller already (its own token
/// or loopback rule) — then it is answered as if it came from loopback — or, for the panel,
/// names the host's token in [`Forwarded::sign_in_token`]: a browser cannot send a bearer
/// header with a link, so it signs in with that token and the panel's session cookie opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path under the API's root, with its query: `/api/v1/memories?scope=global`.
    pub path_and_query: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The body.
    pub body: Vec<u8>,
    /// The path prefix the host serves these routes under (`/agent-tavern`), so the panel's
    /// links and redirects point back through the host; empty when served at the root.
    pub base: String,
    /// The `Cookie` header (the panel keeps its language there).
    pub cookie: Option<String>,
    /// The `Accept-Language` header.
    pub accept_language: Option<String>,
    /// `None`: the host admitted the caller. `Some(token)`: it did not (the caller sent no
    /// valid bearer token); the request is answered as `tavern serve --token` answers one
    /// without a token — only the panel's sign-in page (checking this token) and the pages its
    /// session cookie opens; every other route is `401`.
    pub sign_in_token: Option<String>,
}

/// The token a forwarded request must sign in with (a request extension: set here only, never
/// from the network).
#[derive(Debug, Clone)]
pub(crate) struct HostToken(pub(crate) String);

/// What to send back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedResponse {
    /// HTTP status.
    pub status: u16,
    /// The `Content-Type` header.
    pub content_type: String,
    /// The `Location` header of a redirect (the panel's answer to a form).
    pub location: Option<String>,
    /// The `Set-Cookie` header (the panel's language choice).
    pub set_cookie: Option<String>,
    /// The body.
    pub body: Vec<u8>,
}

impl Api {
    /// Answers a forwarded request with the same handlers as the served router.
    pub async fn forward(&self, req: Forwarded) -> ForwardedResponse {
        match self.try_forward(req).await {
            Ok(r) => r,
            Err(e) => ForwardedResponse {
                status: e.status().as_u16(),
                content_type: "application/json".into(),
                location: None,
                set_cookie: None,
                body: serde_json::to_vec(&e.body()).unwrap_or_default(),
            },
        }
    }

    async fn try_forward(&self, req: Forwarded) -> Result<ForwardedResponse, ApiError> {
        if req.body.len() > crate::MAX_BODY_BYTES {
            return Err(ApiError::TooLarge {
                limit: "request body bytes".into(),
                max: crate::MAX_BODY_BYTES,
                actual: req.body.len(),
            });
        }
        let mut builder = Request::builder()
            .method(req.method.as_str())
            .uri(req.path_and_query.as_str())
            .header(header::HOST, "localhost");
        if !req.base.is_empty() {
            builder = builder.header(crate::panel::BASE_HEADER, req.base.as_str());
        }
        for (name, value) in [
            (header::COOKIE, &req.cookie),
            (header::ACCEPT_LANGUAGE, &req.accept_language),
        ] {
            if let Some(v) = value {
                builder = builder.header(name, v.as_str());
            }
        }
        if let Some(t) = &req.content_type {
            builder = builder.header(header::CONTENT_TYPE, t.as_str());
        }
        if let Some(token) = req.sign_in_token {
            builder = builder.extension(HostToken(token));
        }
        let request = builder
            .body(Body::from(req.body))
            .map_err(|e| ApiError::BadRequest(format!("invalid forwarded request: {e}")))?;
        let response = self
            .router()
            .oneshot(request)
            .await
            .map_err(|e| ApiError::Internal(format!("routing failed: {e}")))?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/octet-stream")
            .to_owned();
        let (location, set_cookie) = {
            let header = |name| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            (header(header::LOCATION), header(header::SET_COOKIE))
        };
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| ApiError::Internal(format!("reading the response failed: {e}")))?
            .to_bytes()
            .to_vec();
        Ok(ForwardedResponse {
            status,
            content_type,
            location,
            set_cookie,
            body,
        })
    }
}
