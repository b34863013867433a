//! Pure AgentTavern domain: ids, bindings, the state normalizer, capabilities, scopes, records,
//! revisions, the kernel prompt text and token estimates.
//!
//! Nothing in this crate performs IO, reads the clock or the environment, or prints. Callers pass
//! time in as [`Timestamp`] values so every function here is deterministic.
//!
//! # Example
//!
//! A host's stored state is normalized before use: a legacy binding keeps the SillyTavern
//! pipeline, a binding that names `agent-tavern` gets that architecture and its default context
//! mode, and every repair is reported.
//!
//! ```
//! use serde_json::json;
//! use tavern_core::{normalize_state, SessionId, TavernArchitecture};
//!
//! let (state, diagnostics) = normalize_state(&json!({"sessionBindings": {
//!     "old": {"character": "Mira", "chatId": "Mira - 2024-01-01"},
//!     "new": {"character": "Mira", "chatId": "Mira - 1", "architecture": "agent-tavern"},
//! }}));
//! let new = state.binding(&SessionId::parse("new")?).expect("the state binds `new`");
//! assert_eq!(new.architecture(), TavernArchitecture::AgentTavern);
//! let old = state.binding(&SessionId::parse("old")?).expect("the state binds `old`");
//! assert_eq!(old.architecture(), TavernArchitecture::St);
//! assert!(diagnostics.iter().all(|d| !d.message.is_empty()));
//! # Ok::<(), tavern_core::CoreError>(())
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod binding;
pub mod calendar;
pub mod capability;
pub mod chat;
pub mod chat_digest;
pub mod error;
pub mod identity;
pub mod ids;
pub mod kernel;
pub mod macros;
pub mod mode_switch;
pub mod normalize;
pub mod record;
pub mod revision;
pub mod scope;
pub mod time;
pub mod tokens;

pub use binding::{
    BindingTarget, ContextMode, SessionBinding, StateChange, TavernArchitecture, TavernState,
    MAX_CHANGES_PER_SUBJECT, MAX_STATE_CHANGES,
};
pub use capability::{AgentTavernCapabilities, Availability, HostFacts};
pub use error::CoreError;
pub use identity::IdentitySummary;
pub use ids::{AgentId, CharacterName, ChatId, MemoryId, SessionId, Tag, VariableName};
pub use kernel::{render_kernel, KernelInput};
pub use mode_switch::{switch_context_mode, ContextModeEvent, ModeSwitchRefusal, TurnState};
pub use normalize::{normalize_state, Diagnostic, INVALID_BINDINGS};
pub use record::{
    AuditAction, AuditEntry, MemoryKind, MemoryRecord, MemorySource, MemoryWrite, SourceKind,
    VariableRecord,
};
pub use revision::Revision;
pub use scope::{Scope, ScopeKey, WritePolicy};
pub use time::{FixedOffset, Timestamp, UtcOffsets};
pub use tokens::{DefaultTokenEstimator, TokenEstimator};
