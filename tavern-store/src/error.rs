//! The one error type of the store crate boundary, and the typed name of the record an error
//! is about.

use std::fmt;

use tavern_core::{
    CharacterName, ChatId, CoreError, MemoryId, Revision, ScopeKey, SessionId, VariableName,
};
use thiserror::Error;

/// The record an error is about. Typed, so callers can act on it (re-read that memory, that
/// variable) without parsing a message; its `Display` is what messages show.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// One memory.
    Memory {
        /// Its scope.
        scope: ScopeKey,
        /// Its id.
        id: MemoryId,
    },
    /// One variable.
    Variable {
        /// Its scope.
        scope: ScopeKey,
        /// Its name.
        name: VariableName,
    },
    /// A whole variable scope (its scope revision).
    VariableScope(ScopeKey),
    /// A SillyTavern chat.
    Chat {
        /// The character whose chat it is.
        character: CharacterName,
        /// The chat.
        chat: ChatId,
    },
    /// A session's binding in the persisted state.
    Binding(SessionId),
    /// A session's projector checkpoint.
    Checkpoint(SessionId),
    /// A session's prompt.
    Prompt(SessionId),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory { id, .. } => write!(f, "memory {id}"),
            Self::Variable { scope, name } => write!(f, "variable {name} in scope {scope}"),
            Self::VariableScope(scope) => write!(f, "variable scope {scope}"),
            Self::Chat { character, chat } => write!(f, "chat {chat} of {character}"),
            Self::Binding(session) => write!(f, "binding of session {session}"),
            Self::Checkpoint(session) => write!(f, "projector checkpoint of session {session}"),
            Self::Prompt(session) => write!(f, "prompt of session {session}"),
        }
    }
}

/// Everything a store operation can fail with. Messages are lowercase, name the offending
/// record, and never contain absolute paths.
///
/// Three kinds of "something is wrong" are kept apart: [`StoreError::Invalid`] (the caller's
/// input breaks a rule), [`StoreError::Corrupt`] (bytes on disk that cannot be understood) and
/// [`StoreError::Internal`] (an invariant of this crate broke — a bug, never input).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The expected revision did not match. `current` is what the caller should re-read and retry
    /// against (`None`: the record does not exist, or — for chats — revisions of another kind).
    #[error("revision conflict on {target}: current revision is {}", current.as_ref().map(Revision::as_str).unwrap_or("none (absent)"))]
    Conflict {
        /// The record (boxed: errors stay small on the happy path).
        target: Box<Target>,
        /// The current revision, if the record exists.
        current: Option<Revision>,
    },
    /// The record does not exist (or is not visible).
    #[error("{target} not found")]
    NotFound {
        /// The record.
        target: Box<Target>,
    },
    /// The memory was forgotten; putting it again needs `restore = true`.
    #[error("memory {id} was forgotten; put it again with restore to bring it back")]
    Forgotten {
        /// The memory id.
        id: MemoryId,
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
    /// A stored file cannot be opened by this process (its owner or mode): a configuration
    /// problem, not damage — nothing was set aside or changed.
    #[error("no access to {file} ({reason}): check its owner and mode; nothing was set aside")]
    Access {
        /// The file, relative to the root.
        file: String,
        /// What the system said.
        reason: String,
    },
    /// A stored file could not be understood and could not be skipped.
    #[error("corrupt data in {file}: {reason}")]
    Corrupt {
        /// The file, relative to the root.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The database could not be reached or refused an operation (the PostgreSQL adapter).
    /// The reason never contains the connection string or credentials.
    #[error("database error during {op}: {reason}")]
    Database {
        /// The operation.
        op: &'static str,
        /// What the database or the connection said.
        reason: String,
    },
    /// The store cannot be set up as asked (a chat folder that is not a directory).
    #[error("store setup: {reason}")]
    Setup {
        /// What is wrong, naming the setting (never an absolute path).
        reason: String,
    },
    /// An invariant of the store broke (a bug, not bad input or bad data): a worker thread
    /// panicked, an encoder failed on our own types, an operation produced nothing.
    #[error("internal store error: {0}")]
    Internal(String),
    /// A fault injected by a test adapter (tests of failure paths).
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

    /// Whether this is a revision conflict (re-read and retry).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }
}
