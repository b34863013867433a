//! Ports and adapters for AgentTavern's durable state.
//!
//! Ports ([`MemoryStore`], [`VariableStore`], [`StateStore`], [`ChatStore`],
//! [`CheckpointStore`], [`PromptStore`]) are small object-safe `async-trait` traits whose
//! contracts are documented on each method. Two embedded adapters implement all of them:
//! [`fs::FsStore`] (the embedded default: one root directory, durable, multi-process safe) and
//! [`mem::MemStore`] (strict, in memory, for tests). With the `postgres` feature, `pg::PgStore`
//! keeps them in a PostgreSQL database shared by many processes and hosts. The `conformance` feature exposes the one
//! suite both must pass.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod blocking;
pub mod chat;
pub mod checkpoint;
pub mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
mod diagnostics;
mod engine;
pub mod error;
pub mod fs;
pub mod mem;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod prompt;
pub mod state;
pub mod transfer;
pub mod variable;
mod wrappers;

pub use chat::{ChatChange, ChatFile, ChatRevision, ChatStore};
pub use checkpoint::{CheckpointStatus, CheckpointStore, ProjectorCheckpoint};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{StoreError, Target};
pub use memory::{MemoryHit, MemoryQuery, MemorySearchResult, MemoryStore, TagMatch, Truncation};
pub use prompt::{PromptStore, SessionPrompt};
pub use state::{StateMutation, StateStore, StateStoreExt, StateView, StateViewExt, Verdict};
pub use transfer::{copy_store, CopyReport, CopyableStore, TableDump, Transfer};
pub use variable::{
    PatchOutcome, VariableChange, VariableEntry, VariableListing, VariableStore, VariableSummary,
};
pub use wrappers::AllStores;

/// A problem found in stored data that did not stop the store from working: a corrupt line or
/// file that was skipped or set aside. `file` is relative to the store root, never absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreDiagnostic {
    /// File name relative to the store root (with a line number where it applies).
    pub file: String,
    /// What was wrong and what was done about it.
    pub message: String,
}
