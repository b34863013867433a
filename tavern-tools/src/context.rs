//! The immutable context a tool call runs in: identity and scopes come only from the host's
//! real agent id and the session's binding, never from arguments.

use serde::Serialize;
use tavern_core::{
    AgentId, ContextMode, Scope, ScopeKey, SessionBinding, SessionId, TavernState, Timestamp,
    WritePolicy,
};

use crate::error::ToolError;

/// Hard limits on arguments, results and calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolLimits {
    /// Longest query, in characters.
    pub max_query_chars: usize,
    /// Largest `limit` lore search accepts.
    pub max_results: usize,
    /// Largest `limit` `memory_search` and `tavern_history_search` accept (recall over long
    /// conversations needs more than the lore limit; `maxTokens` still bounds what returns).
    pub max_search_results: usize,
    /// Default `limit`.
    pub default_results: usize,
    /// Largest `maxTokens` a call accepts.
    pub max_tokens: usize,
    /// Default `maxTokens`.
    pub default_tokens: usize,
    /// Largest serialized result, in bytes.
    pub max_result_bytes: usize,
    /// Tool calls per session turn.
    pub calls_per_turn: usize,
    /// Writing tool calls per session turn.
    pub writes_per_turn: usize,
    /// Longest memory a tool may write, in bytes.
    pub max_memory_bytes: usize,
    /// Most tags on a memory written by a tool.
    pub max_tags: usize,
    /// Most changes in one `variable_patch`.
    pub max_patch_changes: usize,
    /// Timeout a host should apply to one call, in milliseconds.
    pub timeout_ms: u64,
}

impl Default for ToolLimits {
    fn default() -> Self {
        Self {
            max_query_chars: 500,
            max_results: 20,
            max_search_results: 50,
            default_results: 5,
            max_tokens: 4000,
            default_tokens: 1000,
            max_result_bytes: 64 * 1024,
            calls_per_turn: 32,
            writes_per_turn: 16,
            max_memory_bytes: 4096,
            max_tags: 8,
            max_patch_changes: 16,
            timeout_ms: 10_000,
        }
    }
}

/// Everything a tool call may know about who is calling. Built only by
/// [`ToolContext::for_session`] from the host's agent id, the session it runs and the persisted state.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolContext {
    session: SessionId,
    agent: AgentId,
    binding: SessionBinding,
    turn: u64,
    call_id: String,
    policy: WritePolicy,
    limits: ToolLimits,
    now: Timestamp,
}

impl ToolContext {
    /// Resolves the calling agent's binding. `session` is the session the host says the agent
    /// runs (never anything from tool arguments).
    ///
    /// # Errors
    /// [`ToolError::Unavailable`] when the session has no binding, is `st`, or is a group.
    pub fn for_session(
        agent: &AgentId,
        session: &SessionId,
        state: &TavernState,
        turn: u64,
        call_id: &str,
        limits: ToolLimits,
        now: Timestamp,
    ) -> Result<Self, ToolError> {
        let session = session.clone();
        let binding = state
            .binding(&session)
            .ok_or_else(|| ToolError::Unavailable {
                reason: format!("session {session} is not bound to a tavern chat"),
            })?;
        if !matches!(binding, SessionBinding::AgentTavern { .. }) || binding.target().group {
            return Err(ToolError::Unavailable {
                reason: format!("session {session} is not an agent-tavern session"),
            });
        }
        Ok(Self {
            session,
            agent: agent.clone(),
            binding: binding.clone(),
            turn,
            call_id: call_id.chars().take(128).collect(),
            policy: WritePolicy::from_state(state),
            limits,
            now,
        })
    }

    /// The host session.
    pub fn session(&self) -> &SessionId {
        &self.session
    }

    /// The host agent.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// The session's binding.
    pub fn binding(&self) -> &SessionBinding {
        &self.binding
    }

    /// The context mode.
    pub fn context_mode(&self) -> ContextMode {
        self.binding
            .context_mode()
            .unwrap_or(ContextMode::DshNative)
    }

    /// The turn number.
    pub fn turn(&self) -> u64 {
        self.turn
    }

    /// The host's tool call id.
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// The write policy.
    pub fn policy(&self) -> &WritePolicy {
        &self.policy
    }

    /// The limits.
    pub fn limits(&self) -> &ToolLimits {
        &self.limits
    }

    /// The time of the call.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// The concrete key for a scope kind, from the binding and the real agent id.
    pub fn scope(&self, scope: Scope) -> ScopeKey {
        ScopeKey::resolve(scope, &self.binding, &self.agent)
    }

    /// Where a tool write comes from.
    pub fn source(&self) -> tavern_core::MemorySource {
        tavern_core::MemorySource::tool(self.call_id.clone(), self.session.clone(), self.turn)
    }
}
