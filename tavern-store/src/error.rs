//! The one error type of the store crate boundary.

use tavern_core::{CoreError, Revision};
use thiserror::Error;

/// Everything a store operation can fail with. Messages are lowercase, name the offending
/// record, and never contain absolute paths.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The expected revision did not match. `current` is what the caller should re-read and retry
    /// against (`None`: the record does not exist).
    #[error("revision conflict on {target}: current revision is {}", current.as_ref().map(Revision::as_str).unwrap_or("none (absent)"))]
    Conflict {
        /// The record, e.g. `memory m1` or `variable chat:A:c/hp`.
        target: String,
        /// The current revision, if the record exists.
        current: Option<Revision>,
    },
    /// The record does not exist (or is not visible).
    #[error("{target} not found")]
    NotFound {
        /// The record.
        target: String,
    },
    /// The memory was forgotten; putting it again needs `restore = true`.
    #[error("memory {id} was forgotten; put it again with restore to bring it back")]
    Forgotten {
        /// The memory id.
        id: String,
    },
    /// Input failed domain validation or a limit.
    #[error(transparent)]
    Invalid(#[from] CoreError),
    /// A store-level limit was hit.
    #[error("{limit} exceeded: {actual} > {max}")]
    LimitExceeded {
        /// Which limit.
        limit: &'static str,
        /// The maximum.
        max: usize,
        /// What was offered.
        actual: usize,
    },
    /// The disk failed. `file` is relative to the store root.
    #[error("io error during {op} on {file}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The file, relative to the root.
        file: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A stored file could not be understood and could not be skipped.
    #[error("corrupt data in {file}: {reason}")]
    Corrupt {
        /// The file, relative to the root.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A fault injected by the strict in-memory adapter (tests of failure paths).
    #[error("injected failure: {0}")]
    Injected(String),
}

impl StoreError {
    /// The current revision carried by a conflict.
    pub fn conflict_revision(&self) -> Option<&Revision> {
        match self {
            Self::Conflict { current, .. } => current.as_ref(),
            _ => None,
        }
    }
}
