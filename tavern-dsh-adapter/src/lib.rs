//! Everything DSH-specific: DSH's session-log envelope and release facts (`dsh`), the sidecar
//! bridge the DSH plugin speaks to (`bridge`, with the `tavern-bridge` executable), and a strict
//! fake of DSH's AgentLoop for tests and examples (`fake`, feature `testkit`). The host-neutral
//! runtime it drives is `tavern-runtime`; this is the only crate that knows DSH.
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
