//! The host-neutral AgentTavern runtime: the [`HostPort`] a harness implements, the
//! [`Runtime`] that wires bindings, the kernel, tools, projection and mode switches onto it,
//! tavern mode (the per-session system prompt) and the MCP server for harnesses that speak MCP.
//! No host's wire format is known here: a host adapter (DSH's is `tavern-dsh-adapter`) decodes
//! its own events into [`tavern_projector::HostEvent`]s before they reach the runtime.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod error;
pub mod host;
pub mod line;
pub mod mcp;
pub mod runtime;
mod speakers;
pub mod tavern_mode;

pub use error::RuntimeError;
pub use host::{
    AgentMount, HostError, HostPort, LoggedEvent, PromptSection, TavernLogEvent, ToolDefinition,
    UnreadableEvent,
};
pub use runtime::{MountDecision, Runtime, RuntimeConfig, StAction};
