//! The one error type of the core crate boundary.

use thiserror::Error;

/// Everything that can go wrong when parsing or validating domain input.
///
/// Messages are lowercase and name the offending value (truncated, never a path).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CoreError {
    /// An id or name failed validation.
    #[error("invalid {kind} {value:?}: {reason}")]
    InvalidId {
        /// Which kind of id (`chat id`, `variable name`, …).
        kind: &'static str,
        /// The offending input, truncated to a readable length.
        value: String,
        /// The rule that refused it.
        reason: &'static str,
    },
    /// A record field is out of its allowed range.
    #[error("invalid {field}: {reason}")]
    InvalidField {
        /// The field name as the caller knows it.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A context-mode switch was refused.
    #[error("context mode switch refused for session {session}: {reason}")]
    ModeSwitchRefused {
        /// The session.
        session: String,
        /// Which rule refused it.
        reason: crate::mode_switch::ModeSwitchRefusal,
    },
    /// A size or count limit was exceeded.
    #[error("{limit} exceeded: {actual} > {max}")]
    LimitExceeded {
        /// The name of the limit that was hit.
        limit: &'static str,
        /// The allowed maximum.
        max: usize,
        /// What was offered.
        actual: usize,
    },
}

/// Shortens user input for inclusion in an error message.
pub(crate) fn excerpt(value: &str) -> String {
    const MAX: usize = 80;
    if value.chars().count() <= MAX {
        value.to_owned()
    } else {
        let mut s: String = value.chars().take(MAX).collect();
        s.push('…');
        s
    }
}
