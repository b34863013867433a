//! What AgentTavern knows about DeepSeek Harness (npm `@deepseek-ai/dsh`): its session-log
//! envelope and the facts of the releases it runs on. Nothing outside this crate knows them.

pub mod event;
pub mod session_log;

use tavern_core::HostFacts;

/// DSH 0.1.0-rc.6 (on the rc.8 runtime): no `agent/context` seam and no compaction
/// cooperation, so `agent-managed` is unavailable there.
pub fn rc6_facts() -> HostFacts {
    HostFacts::bare("dsh 0.1.0-rc.6")
}
