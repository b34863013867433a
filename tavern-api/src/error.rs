//! The one error type of the HTTP boundary: every failure is a JSON body
//! `{"error": {"code", "message", …}}` with a stable `code` and a status that says what to do.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tavern_core::CoreError;
use tavern_runtime::RuntimeError;
use tavern_store::StoreError;
use thiserror::Error;
use utoipa::ToSchema;

/// Why a request failed. Messages are lowercase, name the offending value and never hold an
/// absolute path (store errors carry paths relative to the store root).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The request is malformed: a bad id, scope, revision, query or JSON body (400).
    #[error("{0}")]
    BadRequest(String),
    /// No valid bearer token (401).
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// Served on loopback without a token, the request named another host (403): a page on
    /// another site pointing a name at 127.0.0.1 (DNS rebinding) is refused.
    #[error("host {0:?} is not a loopback name; serve with a token to answer other names")]
    ForbiddenHost(String),
    /// What a page on another site made a browser send (403), refused before it runs.
    #[error("cross-site request refused: {0}")]
    CrossSite(String),
    /// A panel form without this server's CSRF token (403): a page elsewhere tried to write.
    #[error("the form does not carry this panel's token; reload the page and try again")]
    Csrf,
    /// Nothing by that name, or nothing the caller may see (404).
    #[error("{0}")]
    NotFound(String),
    /// A chat asked for by id does not exist (404), with the nearest ids.
    #[error("{message}")]
    NoSuchChat {
        /// What was asked for.
        message: String,
        /// Up to three chat ids near the one asked for.
        nearest: Vec<String>,
    },
    /// The record changed since the revision given, or the action conflicts with the
    /// session (409). `current` is the revision to re-read and retry against.
    #[error("{message}")]
    Conflict {
        /// What conflicted.
        message: String,
        /// The current revision (absent: the record does not exist).
        current: Option<String>,
    },
    /// The memory is forgotten: restore it first (409).
    #[error("{0}")]
    Forgotten(String),
    /// A context-mode switch was refused by a rule (409); `rule` names it.
    #[error("{message}")]
    ModeRefused {
        /// The refusal in words.
        message: String,
        /// `not-agent-tavern`, `agent-busy`, `unavailable` or `already-in-mode`.
        rule: &'static str,
    },
    /// A size or count limit (413), named.
    #[error("{limit} exceeded: {actual} > {max}")]
    TooLarge {
        /// The limit's name.
        limit: String,
        /// The maximum.
        max: usize,
        /// What was offered.
        actual: usize,
    },
    /// The body is not JSON (`Content-Type: application/json` is required for every write,
    /// which also keeps plain cross-site form posts out) (415).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The host that runs the session cannot be reached or cannot do this (503).
    #[error("{0}")]
    HostUnavailable(String),
    /// The same costly work is already running (503); try again when it is done.
    #[error("{0}")]
    Busy(String),
    /// The store failed (500); nothing was half-written.
    #[error("{0}")]
    Internal(String),
}

/// The JSON body of every error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable code: `bad_request`, `unauthorized`, `forbidden_host`, `not_found`,
    /// `csrf`, `cross_site`, `no_such_chat`, `conflict`, `forgotten`, `mode_refused`, `too_large`,
    /// `unsupported_media_type`, `host_unavailable`, `busy`, `internal`.
    pub code: &'static str,
    /// The reason, in words.
    pub message: String,
    /// On `conflict`: the current revision (null: the record does not exist).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<Option<String>>,
    /// On `no_such_chat`: the nearest chat ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nearest: Option<Vec<String>>,
    /// On `mode_refused`: the rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<&'static str>,
    /// On `too_large`: the limit's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::ForbiddenHost(_) | Self::Csrf | Self::CrossSite(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) | Self::NoSuchChat { .. } => StatusCode::NOT_FOUND,
            Self::Conflict { .. } | Self::Forgotten(_) | Self::ModeRefused { .. } => {
                StatusCode::CONFLICT
            }
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::HostUnavailable(_) | Self::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::Unauthorized => "unauthorized",
            Self::ForbiddenHost(_) => "forbidden_host",
            Self::Csrf => "csrf",
            Self::CrossSite(_) => "cross_site",
            Self::NotFound(_) => "not_found",
            Self::NoSuchChat { .. } => "no_such_chat",
            Self::Conflict { .. } => "conflict",
            Self::Forgotten(_) => "forgotten",
            Self::ModeRefused { .. } => "mode_refused",
            Self::TooLarge { .. } => "too_large",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::HostUnavailable(_) => "host_unavailable",
            Self::Busy(_) => "busy",
            Self::Internal(_) => "internal",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
                current: match self {
                    Self::Conflict { current, .. } => Some(current.clone()),
                    _ => None,
                },
                nearest: match self {
                    Self::NoSuchChat { nearest, .. } => Some(nearest.clone()),
                    _ => None,
                },
                rule: match self {
                    Self::ModeRefused { rule, .. } => Some(rule),
                    _ => None,
                },
                limit: match self {
                    Self::TooLarge { limit, .. } => Some(limit.clone()),
                    _ => None,
                },
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        if matches!(self, Self::Unauthorized) {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::ModeSwitchRefused { ref reason, .. } => {
                use tavern_core::mode_switch::ModeSwitchRefusal as R;
                let rule = match reason {
                    R::NotAgentTavern => "not-agent-tavern",
                    R::AgentBusy => "agent-busy",
                    R::Unavailable { .. } => "unavailable",
                    R::AlreadyInMode(_) => "already-in-mode",
                    _ => "refused",
                };
                Self::ModeRefused {
                    message: e.to_string(),
                    rule,
                }
            }
            CoreError::LimitExceeded { limit, max, actual } => Self::TooLarge {
                limit: limit.into(),
                max,
                actual,
            },
            other => Self::BadRequest(other.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict { ref current, .. } => Self::Conflict {
                current: current.as_ref().map(|r| r.as_str().to_owned()),
                message: e.to_string(),
            },
            StoreError::NotFound { .. } => Self::NotFound(e.to_string()),
            StoreError::Forgotten { .. } => Self::Forgotten(e.to_string()),
            StoreError::Invalid(core) => core.into(),
            StoreError::LimitExceeded { limit, max, actual } => Self::TooLarge {
                limit: limit.into(),
                max,
                actual,
            },
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Host(h) => Self::HostUnavailable(h.to_string()),
            RuntimeError::Store(s) => s.into(),
            RuntimeError::Core(c) => c.into(),
            RuntimeError::Conflict { .. } => Self::Conflict {
                message: e.to_string(),
                current: None,
            },
            RuntimeError::NotBound(_) | RuntimeError::NoCard { .. } => {
                Self::NotFound(e.to_string())
            }
            RuntimeError::NoSuchChat { ref nearest, .. } => Self::NoSuchChat {
                nearest: nearest.clone(),
                message: e.to_string(),
            },
            other => Self::Internal(other.to_string()),
        }
    }
}
