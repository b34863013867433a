//! AgentTavern tool contracts (names, schemas, limits, structured errors), SillyTavern asset
//! formats (cards, world info, chats) and lore activation.
//!
//! Skeleton: the contracts land with issue 4; this crate already sits at its place in the
//! dependency graph (core ← store ← tools).
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
