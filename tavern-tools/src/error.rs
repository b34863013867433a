//! Structured tool errors the model can act on. Each has a stable `code`, a lowercase message
//! naming the offending field, id or limit, and nothing internal (no paths).

use serde_json::{json, Value};
use tavern_store::StoreError;
use thiserror::Error;

/// Why a tool call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ToolError {
    /// An argument is missing, of the wrong type, out of range, or not allowed.
    #[error("invalid argument {field}: {reason}")]
    InvalidArguments {
        /// JSON path of the argument, e.g. `changes[1].name`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The record does not exist (or is forgotten or expired).
    #[error("{what} not found")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// The revision sent is not the current one; re-read and retry with `current`.
    #[error("revision conflict on {what}: current revision is {}", current.as_deref().unwrap_or("none (it does not exist)"))]
    RevisionConflict {
        /// The record.
        what: String,
        /// Its current revision.
        current: Option<String>,
    },
    /// The scope may not be written (settings, or confirmation needed).
    #[error("scope {scope} denied: {reason}")]
    ScopeDenied {
        /// The scope kind.
        scope: String,
        /// Why.
        reason: String,
    },
    /// A limit was hit.
    #[error("{limit} exceeded: {actual} > {max}")]
    LimitExceeded {
        /// Which limit.
        limit: String,
        /// The maximum.
        max: usize,
        /// What was asked or reached.
        actual: usize,
    },
    /// The tool cannot run here (not an AgentTavern session, no card, storage failure).
    #[error("unavailable: {reason}")]
    Unavailable {
        /// Why.
        reason: String,
    },
    /// No tool has this name.
    #[error("unknown tool {0}")]
    UnknownTool(String),
}

impl ToolError {
    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidArguments { .. } => "invalid-arguments",
            Self::NotFound { .. } => "not-found",
            Self::RevisionConflict { .. } => "revision-conflict",
            Self::ScopeDenied { .. } => "scope-denied",
            Self::LimitExceeded { .. } => "limit-exceeded",
            Self::Unavailable { .. } => "unavailable",
            Self::UnknownTool(_) => "unknown-tool",
        }
    }

    /// The error as the model sees it: `{"error": {"code", "message", …details}}`.
    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code(), "message": self.to_string()});
        match self {
            Self::InvalidArguments { field, .. } => e["field"] = json!(field),
            Self::RevisionConflict { current, .. } => e["currentRevision"] = json!(current),
            Self::LimitExceeded { limit, max, actual } => {
                e["limit"] = json!(limit);
                e["max"] = json!(max);
                e["actual"] = json!(actual);
            }
            _ => {}
        }
        json!({ "error": e })
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArguments {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<StoreError> for ToolError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict { target, current } => Self::RevisionConflict {
                what: target.to_string(),
                current: current.map(|r| r.to_string()),
            },
            StoreError::NotFound { target } => Self::NotFound {
                what: target.to_string(),
            },
            StoreError::Forgotten { id } => Self::NotFound {
                what: format!("memory {id} (forgotten)"),
            },
            StoreError::Invalid(core) => match core {
                tavern_core::CoreError::LimitExceeded { limit, max, actual } => {
                    Self::LimitExceeded {
                        limit: limit.to_owned(),
                        max,
                        actual,
                    }
                }
                tavern_core::CoreError::InvalidField { field, reason } => {
                    Self::invalid(field, reason)
                }
                other => Self::invalid("arguments", other.to_string()),
            },
            StoreError::LimitExceeded { limit, max, actual } => Self::LimitExceeded {
                limit: limit.to_owned(),
                max,
                actual,
            },
            other => Self::Unavailable {
                reason: format!("storage failed: {other}"),
            },
        }
    }
}
