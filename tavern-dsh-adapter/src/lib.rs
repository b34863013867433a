//! Everything DSH-specific: DSH's session-log envelope and release facts (`dsh`), the sidecar
//! bridge the DSH plugin speaks to (`bridge`, with the `tavern-bridge` executable), and a strict
//! fake of DSH's AgentLoop for tests and examples (`fake`, feature `testkit`). The host-neutral
//! runtime it drives is `tavern-runtime`; this is the only crate that knows DSH.
//!
//! # Example
//!
//! The runtime on the strict fake AgentLoop (feature `testkit`), as the examples and tests
//! drive it: a scripted model answers one turn and the chat gets the SillyTavern lines.
//!
//! ```
//! use std::sync::Arc;
//! use tavern_core::{AgentId, CharacterName, ChatId, SessionId};
//! use tavern_dsh_adapter::fake::{FakeHost, ModelStep};
//! use tavern_dsh_adapter::{dsh, Runtime, RuntimeConfig};
//! use tavern_store::{fs::FsStore, ChatStore, SystemClock};
//! use tavern_tools::assets::provider::MemAssets;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let clock = Arc::new(SystemClock);
//! let store = Arc::new(FsStore::open(dir.path().join("store"), clock.clone())?);
//! let host = Arc::new(FakeHost::open(dir.path().join("host"), dsh::rc6_facts())?);
//! let assets = Arc::new(MemAssets::default());
//! let runtime = Runtime::new(host.clone(), store.clone(), assets, clock, RuntimeConfig::default());
//!
//! let (mira, chat) = (CharacterName::parse("Mira")?, ChatId::parse("Mira - 1")?);
//! runtime.new_chat(&SessionId::parse("s1")?, &mira, &chat, false).await?;
//! let agent = AgentId::parse("s1")?;
//! host.create_agent(&runtime, &agent).await?;
//! host.script([ModelStep::Reply("The lanterns are lit.".into())]);
//! host.run_turn(&runtime, &agent, "Is it dark yet?").await?;
//!
//! let lines = store.read_chat(&mira, &chat).await?.expect("the chat exists").lines;
//! assert!(lines.iter().any(|l| l.text() == "The lanterns are lit."));
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod bridge;
pub mod dsh;
#[cfg(feature = "testkit")]
pub mod fake;

pub use tavern_runtime::{
    AgentMount, HostError, HostPort, MountDecision, PromptSection, Runtime, RuntimeConfig,
    RuntimeError, StAction, ToolDefinition,
};
