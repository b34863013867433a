//! Host events → SillyTavern JSONL chat projection (exactly once) and the pure per-request
//! context projection for `agent-managed` sessions.
//!
//! # Example
//!
//! Events are fed as the host delivers them; replaying the host's log after a crash writes only
//! what is missing, so every chat line lands exactly once.
//!
//! ```
//! use std::sync::Arc;
//! use tavern_core::{normalize_state, CharacterName, ChatId, SessionId};
//! use tavern_projector::event::{EventKind, TurnEndReason, UserSource};
//! use tavern_projector::{ChatProjector, HostEvent, ProjectorConfig};
//! use tavern_store::{mem::MemStore, ChatStore, SystemClock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(MemStore::new(Arc::new(SystemClock)));
//! let projector =
//!     ChatProjector::new(store.clone(), store.clone(), Arc::new(SystemClock), ProjectorConfig::new("Kai"));
//! let session = SessionId::parse("s1")?;
//! let (state, _) = normalize_state(&serde_json::json!({"sessionBindings": {
//!     "s1": {"character": "Mira", "chatId": "Mira - 1", "architecture": "agent-tavern"},
//! }}));
//! let binding = state.binding(&session).expect("bound").clone();
//! let turn: Vec<HostEvent> = [
//!     EventKind::TurnStart { turn: 1 },
//!     EventKind::UserMessage { source: UserSource::User, text: "Hello, Mira.".into() },
//!     EventKind::StepStart { turn: 1, step: 1 },
//!     EventKind::AssistantMessage {
//!         turn: 1,
//!         step: 1,
//!         text: "Welcome to the glade.".into(),
//!         has_tool_calls: false,
//!         interrupted: false,
//!     },
//!     EventKind::StepEnd { turn: 1, step: 1 },
//!     EventKind::TurnEnd { turn: 1, reason: TurnEndReason::Completed },
//! ]
//! .into_iter()
//! .enumerate()
//! .map(|(seq, kind)| HostEvent { seq: seq as u64, time: 1_700_000_000_000, kind })
//! .collect();
//!
//! let live = projector.replay(&session, &binding, turn.clone()).await?;
//! assert_eq!(live.appended, 2);
//! // The same log again (a restart): nothing is written twice.
//! let again = projector.replay(&session, &binding, turn).await?;
//! assert_eq!(again.appended, 0);
//! let chat = store
//!     .read_chat(&CharacterName::parse("Mira")?, &ChatId::parse("Mira - 1")?)
//!     .await?
//!     .expect("the chat exists");
//! assert_eq!(chat.lines.len(), 3, "a header and two messages");
//! # Ok(())
//! # }
//! ```
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
