//! The one error type of the runtime boundary.

use tavern_core::CoreError;
use tavern_projector::ProjectorError;
use tavern_store::StoreError;
use thiserror::Error;

use crate::host::HostError;

/// Why a runtime operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The host failed.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A domain rule refused (mode switch, invalid id).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// Projection failed (the turn itself is unaffected; replay fills the gap).
    #[error(transparent)]
    Projection(#[from] ProjectorError),
    /// The action conflicts with the session's architecture (HTTP 409 in a host route).
    #[error("conflict for session {session}: {reason}")]
    Conflict {
        /// The session.
        session: String,
        /// Why.
        reason: String,
    },
    /// The host could not decode an event of its own log (its envelope lacks type or seq).
    #[error("invalid event for session {session}: {reason}")]
    InvalidEvent {
        /// The session.
        session: String,
        /// What is missing.
        reason: String,
    },
    /// The session has no binding.
    #[error("session {0} is not bound to a tavern chat")]
    NotBound(String),
    /// A new chat names a character (or group) the assets have no card (or group) of, or
    /// whose card cannot be read (see `RuntimeConfig::require_cards`).
    #[error("no new chat of {character:?}: {reason}")]
    NoCard {
        /// The character or group named.
        character: String,
        /// Why, in lowercase words.
        reason: String,
    },
    /// An existing chat was asked for and there is none by that id.
    #[error(
        "no chat {chat:?} of character {character:?}{}",
        nearest_names(nearest)
    )]
    NoSuchChat {
        /// The character.
        character: String,
        /// The chat id asked for.
        chat: String,
        /// The character's chats nearest to it (at most three), for "did you mean".
        nearest: Vec<String>,
    },
}

fn nearest_names(nearest: &[String]) -> String {
    if nearest.is_empty() {
        " (the character has no chats)".to_owned()
    } else {
        format!("; nearest: {}", nearest.join(", "))
    }
}
