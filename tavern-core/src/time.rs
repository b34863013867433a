//! Timestamps as epoch milliseconds; the core never reads a clock.

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch (UTC), supplied by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The timestamp as epoch milliseconds.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// This timestamp moved forward by `ms` milliseconds (saturating).
    pub fn plus_millis(self, ms: i64) -> Self {
        Timestamp(self.0.saturating_add(ms))
    }
}
