//! The host-neutral AgentTavern runtime: the [`HostPort`] a harness implements, the
//! [`Runtime`] that wires bindings, the kernel, tools, projection and mode switches onto it,
//! tavern mode (the per-session system prompt) and the MCP server for harnesses that speak MCP.
//! No host's wire format is known here: a host adapter (DSH's is `tavern-dsh-adapter`) decodes
//! its own events into [`tavern_projector::HostEvent`]s before they reach the runtime.
//!
//! # Example
//!
//! A harness implements [`HostPort`] (how to mount tools and prompt sections on its agents,
//! read its session log, report status) and hands it to a [`Runtime`] with stores and assets;
//! from then on it forwards its agents' lifecycle and tool calls. `tavern-dsh-adapter` is a
//! complete host; `docs/ARCHITECTURE.md` has the recipe for another.
//!
//! ```
//! use std::sync::Arc;
//! use tavern_core::{CharacterName, ChatId, SessionId};
//! use tavern_runtime::{HostPort, Runtime, RuntimeConfig, RuntimeError};
//! use tavern_store::{fs::FsStore, SystemClock};
//! use tavern_tools::assets::provider::MemAssets;
//!
//! /// Binds a new chat with Mira to `session`, on the embedded file store under `data`.
//! async fn start(host: Arc<dyn HostPort>, data: &std::path::Path) -> Result<Runtime, Box<dyn std::error::Error>> {
//!     let clock = Arc::new(SystemClock);
//!     let store = Arc::new(FsStore::open(data.join("store"), clock.clone())?);
//!     let config = RuntimeConfig { user_name: "Kai".into(), ..RuntimeConfig::default() };
//!     let runtime = Runtime::new(host, store, Arc::new(MemAssets::default()), clock, config);
//!     let session = SessionId::parse("s1")?;
//!     let binding = runtime
//!         .new_chat(&session, &CharacterName::parse("Mira")?, &ChatId::parse("Mira - 1")?, false)
//!         .await?;
//!     println!("bound as {}", binding.architecture().as_str());
//!     // A session can be bound once; binding it again is a conflict that names it.
//!     let again = runtime
//!         .new_chat(&session, &CharacterName::parse("Mira")?, &ChatId::parse("Mira - 2")?, false)
//!         .await;
//!     assert!(matches!(again, Err(RuntimeError::Conflict { .. })));
//!     Ok(runtime)
//! }
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod error;
pub mod host;
pub mod line;
pub mod mcp;
pub mod ranking;
pub mod runtime;
mod speakers;
pub mod tavern_mode;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use error::RuntimeError;
pub use host::{
    AgentMount, HostError, HostPort, LoggedEvent, PromptSection, TavernLogEvent, ToolDefinition,
    UnreadableEvent,
};
pub use ranking::{open_ranker, RankerChoice, RankingError};
pub use runtime::{MountDecision, Runtime, RuntimeConfig, StAction};
