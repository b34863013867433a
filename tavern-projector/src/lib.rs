//! Host events → SillyTavern JSONL chat projection (exactly once) and the pure per-request
//! context projection for `agent-managed` sessions.
//!
//! Skeleton: the projectors land with issue 5.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
