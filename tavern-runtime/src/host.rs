//! The host port: what AgentTavern needs from an agent harness. The host owns the loop, model
//! requests, tool execution and the session log; it pushes events and tool calls into the
//! [`crate::runtime::Runtime`] and asks it for prompt text each request. Events cross this
//! port already decoded ([`HostEvent`]): each host adapter knows its own log format, the
//! runtime knows none.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tavern_core::{AgentId, ContextModeEvent, HostFacts, SessionId};
use tavern_projector::HostEvent;
use thiserror::Error;

/// A failure reported by the host.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("host: {0}")]
pub struct HostError(pub String);

/// A prompt section the host asks the runtime to fill on every request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptSection {
    /// Section name (`agent-tavern:kernel`, `deployment:persona-prefix`).
    pub name: String,
    /// Order in the system prompt (DSH: −100 identity, 0 persona, 100–199 tool guidance).
    pub order: i32,
}

/// A tool as the host registers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolDefinition {
    /// Name.
    pub name: String,
    /// Model-facing description.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
    /// JSON Schema of the result.
    pub output_schema: Value,
    /// Timeout the host applies.
    pub timeout_ms: u64,
    /// Whether it writes.
    pub writes: bool,
    /// Whether it removes something from view (forgetting, deleting; never from disk).
    pub destructive: bool,
    /// Whether a repeat with the same arguments changes nothing more.
    pub idempotent: bool,
}

/// What AgentTavern mounts on one agent: the preset id, agent-scoped prompt sections and tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentMount {
    /// Preset id (`agent-tavern`).
    pub preset: String,
    /// Agent-scoped prompt sections, filled per request by the runtime.
    pub sections: Vec<PromptSection>,
    /// Tools registered for this agent only.
    pub tools: Vec<ToolDefinition>,
}

/// The host, as the runtime drives it.
///
/// Events flow the other way: the host calls [`crate::runtime::Runtime::on_event`] for every
/// appended session event, in seq order, and
/// [`crate::runtime::Runtime::call_tool`] for every tool call of a mounted agent.
#[async_trait]
pub trait HostPort: Send + Sync {
    /// What the host supports (seams, compaction cooperation).
    fn facts(&self) -> HostFacts;

    /// The session an agent runs. The default is DSH's rule: an agent's id is its session's
    /// id (the only trustworthy identity a tool call carries).
    ///
    /// # Errors
    /// [`HostError`] when the agent id cannot name a session.
    fn session_of(&self, agent: &AgentId) -> Result<SessionId, HostError> {
        SessionId::parse(agent.as_str())
            .map_err(|e| HostError(format!("agent {agent} names no session: {e}")))
    }

    /// The agent that runs a session (the inverse of [`HostPort::session_of`]).
    ///
    /// # Errors
    /// [`HostError`] when the session id cannot name an agent.
    fn agent_of(&self, session: &SessionId) -> Result<AgentId, HostError> {
        AgentId::parse(session.as_str())
            .map_err(|e| HostError(format!("session {session} names no agent: {e}")))
    }

    /// Mounts prompt sections and tools on one agent before it is published. Other agents are
    /// never affected. Mounting the same agent again replaces its mount.
    ///
    /// # Errors
    /// [`HostError`] when the host refuses.
    async fn mount(&self, agent: &AgentId, mount: &AgentMount) -> Result<(), HostError>;

    /// Whether the agent is idle at a turn boundary.
    ///
    /// # Errors
    /// [`HostError`] for an unknown agent.
    async fn is_idle(&self, agent: &AgentId) -> Result<bool, HostError>;

    /// Appends one of AgentTavern's own events (a greeting, a context-mode change) to a
    /// session's log, marked skippable for readers that do not know it, and returns it as
    /// logged: with its seq, decoded like every other event (a context-mode change as
    /// [`tavern_projector::EventKind::ContextMode`]). The runtime feeds the returned event to
    /// itself; a host that also echoes it through its event stream is fine (the projector
    /// ignores repeats). A host that cannot append to its log says so with an error; the
    /// runtime then keeps the greeting in the chat only.
    ///
    /// # Errors
    /// [`HostError`] when the log cannot be written.
    async fn append_event(
        &self,
        session: &SessionId,
        event: &TavernLogEvent,
    ) -> Result<HostEvent, HostError>;

    /// The session's events with seq greater than `after`, in seq order, each decoded or
    /// marked unreadable (an entry whose envelope the host cannot read: projection stops at
    /// it and says why, never skipping it).
    ///
    /// # Errors
    /// [`HostError`] when the log cannot be read.
    async fn read_events(
        &self,
        session: &SessionId,
        after: Option<u64>,
    ) -> Result<Vec<LoggedEvent>, HostError>;
}

/// An entry of a session log that could not be decoded into a [`HostEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableEvent {
    /// Why, in lowercase words (never a path).
    pub reason: String,
    /// Its seq, when the entry names one (where in the log it stands).
    pub seq: Option<u64>,
}

/// One entry of a session log as a host reads it back.
pub type LoggedEvent = Result<HostEvent, UnreadableEvent>;

/// The events AgentTavern itself writes into a host's session log.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TavernLogEvent {
    /// The card's greeting, shown to the model as the chat's first assistant message.
    Greeting {
        /// The greeting's text.
        text: String,
    },
    /// A context-mode switch (the log is its source of truth).
    ContextMode(ContextModeEvent),
}

impl TavernLogEvent {
    /// The greeting's event type.
    pub const GREETING: &'static str = "agent-tavern/greeting";

    /// The event's type as logged (`agent-tavern/greeting`, `agent-tavern/context-mode`).
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::Greeting { .. } => Self::GREETING,
            Self::ContextMode(_) => ContextModeEvent::EVENT_TYPE,
        }
    }

    /// The event's payload as logged.
    pub fn data(&self) -> Value {
        match self {
            Self::Greeting { text } => json!({ "text": text }),
            Self::ContextMode(e) => serde_json::to_value(e).unwrap_or(Value::Null),
        }
    }
}
