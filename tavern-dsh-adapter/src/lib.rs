//! The `Host` port, the AgentTavern runtime on top of it, a strict fake AgentLoop for tests and
//! examples, and tavern mode (the per-session system prompt). This is the only crate that knows
//! a host or a wire protocol.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod bridge;
pub mod dsh;
pub mod error;
#[cfg(feature = "testkit")]
pub mod fake;
pub mod host;
pub mod runtime;
pub mod tavern_mode;

pub use error::AdapterError;
pub use host::{AgentMount, HostError, HostPort, PromptSection, ToolDefinition};
pub use runtime::{MountDecision, Runtime, RuntimeConfig, StAction};
