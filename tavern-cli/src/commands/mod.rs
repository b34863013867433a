//! The commands, one module each; every one returns a [`crate::Report`] and prints nothing.

pub mod card;
pub mod chat;
pub mod check;
pub mod copy;
pub mod export;
pub mod import;
pub mod memory;
pub mod serve;
pub mod var;

use tavern_core::{MemorySource, SourceKind};

/// The source of writes made with this command: the user, directly.
pub(crate) fn user_source() -> MemorySource {
    MemorySource {
        kind: SourceKind::User,
        tool_call_id: None,
        message_id: None,
        session: None,
        turn: None,
    }
}

/// Parses `--revision`.
pub(crate) fn revision(text: &str) -> Result<tavern_core::Revision, crate::CliError> {
    tavern_core::Revision::parse(text)
        .map_err(|e| crate::CliError::Usage(format!("--revision: {e}")))
}
