//! The `Host` port, the AgentTavern runtime on top of it, a strict fake AgentLoop for tests and
//! examples, and the integration with the real DeepSeek Harness 0.1.0-rc.6.
//!
//! Skeleton: the runtime lands with issue 6, the real-host bridge with issue 7. This is the only
//! crate that may know a host or a wire protocol.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
