//! The ports: what AgentTavern asks of durable storage, one small object-safe `async-trait`
//! trait per concern, each method's contract documented on it. Every adapter (`crate::adapters`)
//! implements all of them and passes the one conformance suite.

pub mod chat;
pub mod checkpoint;
pub mod memory;
pub mod prompt;
pub mod state;
pub mod transfer;
pub mod variable;
pub(crate) mod wrappers;
