//! AgentTavern tool contracts (names, schemas, limits, structured errors), SillyTavern asset
//! formats (cards, world info) and lore activation.
//!
//! The model reaches everything beyond the kernel through these tools. Each runs in an
//! immutable `ToolContext` built from the host's agent id → binding; no tool accepts a session,
//! chat, character or scope id.
//!
//! # Example
//!
//! A host builds one [`ToolRegistry`] over its stores and assets, and for each model tool call a
//! [`ToolContext`] from the session's binding; the scope a memory lands in comes from that
//! binding, never from the model's arguments.
//!
//! ```
//! use std::sync::Arc;
//! use serde_json::json;
//! use tavern_core::{normalize_state, AgentId, FixedOffset, SessionId, Timestamp};
//! use tavern_store::{mem::MemStore, SystemClock};
//! use tavern_tools::assets::provider::MemAssets;
//! use tavern_tools::{ToolContext, ToolLimits, ToolRegistry, ToolServices};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(MemStore::new(Arc::new(SystemClock)));
//! let registry = ToolRegistry::new(
//!     ToolServices {
//!         memory: store.clone(),
//!         variables: store.clone(),
//!         chats: store.clone(),
//!         assets: Arc::new(MemAssets::default()),
//!         history: Default::default(),
//!         ranker: Default::default(),
//!         zone: Arc::new(FixedOffset(0)),
//!     },
//!     ToolLimits::default(),
//! );
//! let (state, _) = normalize_state(&json!({"sessionBindings": {
//!     "s1": {"character": "Mira", "chatId": "Mira - 1", "architecture": "agent-tavern"},
//! }}));
//! let (agent, session) = (AgentId::parse("s1")?, SessionId::parse("s1")?);
//! let call = |id: &str| {
//!     let now = Timestamp(1_700_000_000_000);
//!     ToolContext::for_session(&agent, &session, &state, 1, id, ToolLimits::default(), now)
//! };
//! let args = json!({"content": "Kai fears the dark forest."});
//! let written = registry.call(&call("c1")?, "memory_write", &args).await?;
//! assert_eq!(written["scope"], "chat");
//! let found = registry.call(&call("c2")?, "memory_search", &json!({"query": "forest"})).await?;
//! assert_eq!(found["items"][0]["content"], "Kai fears the dark forest.");
//! // A name the registry does not know is an error the model can read, not a panic.
//! assert!(registry.call(&call("c3")?, "shell", &json!({})).await.is_err());
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod assets;
pub mod context;
mod cpu;
pub mod docs;
pub mod error;
pub mod history;
mod js_regex;
pub mod lore;
pub mod registry;
pub mod schema;
pub mod tool;
pub mod tools;

pub use context::{ToolContext, ToolLimits};
pub use error::ToolError;
pub use registry::{ToolRegistry, ToolServices};
pub use tool::{Tool, ToolSpec};
