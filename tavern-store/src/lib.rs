//! Ports and adapters for AgentTavern's durable state, in folders that show the hexagon:
//! `ports/` (the traits), `engine/` (the record logic every adapter shares, and the op-log seam
//! `engine::oplog`), `adapters/` (file system, memory, PostgreSQL).
//!
//! Ports ([`MemoryStore`], [`VariableStore`], [`StateStore`], [`ChatStore`],
//! [`CheckpointStore`], [`PromptStore`]) are small object-safe `async-trait` traits whose
//! contracts are documented on each method. Two embedded adapters implement all of them:
//! [`fs::FsStore`] (the embedded default: one root directory, durable, multi-process safe) and
//! [`mem::MemStore`] (strict, in memory, for tests). With the `postgres` feature, `pg::PgStore`
//! keeps them in a PostgreSQL database shared by many processes and hosts. The `conformance` feature exposes the one
//! suite both must pass.
//!
//! # Example
//!
//! Every write names the revision it expects; a stale one is a conflict, never a lost update.
//!
//! ```
//! use std::sync::Arc;
//! use tavern_core::scope::ScopeKey;
//! use tavern_core::{CharacterName, MemoryId, MemoryKind, MemorySource, MemoryWrite, SessionId};
//! use tavern_store::{mem::MemStore, MemoryQuery, MemoryStore, StoreError, SystemClock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemStore::new(Arc::new(SystemClock));
//! let scope = ScopeKey::Character { character: CharacterName::parse("Mira")? };
//! let write = MemoryWrite {
//!     id: MemoryId::parse("compass")?,
//!     scope: scope.clone(),
//!     kind: MemoryKind::Semantic,
//!     content: "Kai carries a cracked compass.".into(),
//!     tags: Vec::new(),
//!     importance: 0.7,
//!     confidence: 0.9,
//!     source: MemorySource::tool("call-1", SessionId::parse("s1")?, 1),
//!     expires_at: None,
//! };
//! let first = store.put(write.clone(), None, false).await?;
//! // Creating it again (no expected revision) conflicts with the record that exists.
//! let again = store.put(write, None, false).await;
//! assert!(matches!(again, Err(StoreError::Conflict { .. })));
//!
//! let found = store.search(&MemoryQuery::new("compass", vec![scope])).await?;
//! assert_eq!(found.hits[0].record.revision, first.revision);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod adapters;
pub mod blocking;
pub mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
mod diagnostics;
mod engine;
pub mod error;
pub mod ports;

// The ports and adapters at the crate root too, where they have always been named.
#[cfg(feature = "postgres")]
pub use adapters::pg;
pub use adapters::{fs, mem};
use ports::wrappers;
pub use ports::{chat, checkpoint, memory, prompt, state, transfer, variable};

pub use chat::{ChatChange, ChatFile, ChatRevision, ChatStore};
pub use checkpoint::{CheckpointStatus, CheckpointStore, ProjectorCheckpoint};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{StoreError, Target};
pub use memory::{
    prepared_ranker, MemoryHit, MemoryQuery, MemorySearchExt, MemorySearchResult, MemoryStore,
    TagMatch, Truncation,
};
pub use prompt::{PromptStore, SessionPrompt};
pub use state::{StateMutation, StateStore, StateStoreExt, StateView, StateViewExt, Verdict};
pub use transfer::{copy_store, CopyReport, CopyableStore, MemoryDigest, TableDump, Transfer};
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
