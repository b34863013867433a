//! AgentTavern tool contracts (names, schemas, limits, structured errors), SillyTavern asset
//! formats (cards, world info) and lore activation.
//!
//! The model reaches everything beyond the kernel through these tools. Each runs in an
//! immutable `ToolContext` built from the host's agent id → binding; no tool accepts a session,
//! chat, character or scope id.
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
