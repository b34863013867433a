//! The command's one error type and the exit codes scripts can rely on.

use tavern_dsh_adapter::RuntimeError;
use tavern_store::{StoreError, Target};
use tavern_tools::assets::AssetError;
use thiserror::Error;

/// Exit codes (also in `tavern --help` and the README).
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// A failure: something not found, unreadable input, a refused operation, an IO error.
    pub const FAILURE: u8 = 1;
    /// A usage error: a bad option, scope, id, revision or JSON value (clap uses it too).
    pub const USAGE: u8 = 2;
    /// A revision conflict: the record changed since the revision given; nothing was written.
    pub const CONFLICT: u8 = 3;
    /// `tavern check` found corrupt or set-aside data.
    pub const CORRUPT: u8 = 4;
}

/// Everything a command can fail with. Messages are one lowercase line naming the offending
/// value; paths appear as the user gave them, never made absolute.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CliError {
    /// The command line names something invalid (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Something named does not exist (exit 1).
    #[error("{0}")]
    NotFound(String),
    /// The operation was refused or failed (exit 1).
    #[error("{0}")]
    Failed(String),
    /// A file could not be read or written (exit 1).
    #[error("cannot {op} {file}: {source}")]
    Io {
        /// What was being done (`read`, `write`, `list`, …).
        op: &'static str,
        /// The file, as the user named it (or relative to a folder they named).
        file: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A store operation failed; a revision conflict exits 3.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A SillyTavern card or world book could not be read (exit 1).
    #[error(transparent)]
    Asset(#[from] AssetError),
    /// The runtime failed replaying a session (exit 1).
    #[error(transparent)]
    Adapter(#[from] RuntimeError),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => exit::USAGE,
            Self::Store(e) if e.is_conflict() => exit::CONFLICT,
            Self::Adapter(RuntimeError::Store(e)) if e.is_conflict() => exit::CONFLICT,
            _ => exit::FAILURE,
        }
    }

    /// What the user can do about it, when the message alone leaves that to guess: a revision
    /// conflict on a memory or variable names the `--revision` to pass.
    pub fn hint(&self) -> Option<String> {
        let Self::Store(StoreError::Conflict {
            target, current, ..
        }) = self
        else {
            return None;
        };
        match (&**target, current) {
            (Target::Memory { .. } | Target::Variable { .. }, Some(current)) => Some(format!(
                "read it again, then pass --revision {current} to change it"
            )),
            (Target::Variable { .. }, None) => {
                Some("it does not exist: leave out --revision to create it".to_owned())
            }
            _ => None,
        }
    }

    /// An IO error on `file` (as the user named it).
    pub fn io(op: &'static str, file: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let file = file.into();
        move |source| Self::Io { op, file, source }
    }
}
