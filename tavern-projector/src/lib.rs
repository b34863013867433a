//! Host events → SillyTavern JSONL chat projection (exactly once) and the pure per-request
//! context projection for `agent-managed` sessions.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod context;
pub mod event;
pub mod lines;
pub mod plan;
pub mod projector;

pub use event::{EventKind, HostEvent};
pub use projector::{
    ChatProjector, Outcome, ProjectorConfig, ProjectorError, SpeakerNames, Speakers,
};
