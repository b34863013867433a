//! The session events the projector reads, host-neutral: a host adapter decodes its own
//! envelope into these (DSH's lives in `tavern-dsh-adapter`). An event the adapter cannot
//! place but that may change what the model sees is [`EventKind::Unknown`]: projection stops
//! there rather than guess.

/// How a user message entered the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserSource {
    /// Typed by the user.
    User,
    /// Added by a plugin (runtime context, mirrors): never a chat line.
    Plugin,
}

/// Why a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEndReason {
    /// The model finished.
    Completed,
    /// Stopped, aborted, blocked, errored, cut by max tokens or interrupted: the label.
    Other(String),
}

/// What an event is.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// `turn/start`.
    TurnStart {
        /// Turn number.
        turn: u64,
    },
    /// `turn/end`.
    TurnEnd {
        /// Turn number.
        turn: u64,
        /// Why.
        reason: TurnEndReason,
    },
    /// `step/start`.
    StepStart {
        /// Turn.
        turn: u64,
        /// Step.
        step: u64,
    },
    /// `step/end`.
    StepEnd {
        /// Turn.
        turn: u64,
        /// Step.
        step: u64,
    },
    /// `user/message`.
    UserMessage {
        /// Who added it.
        source: UserSource,
        /// Its text parts joined.
        text: String,
    },
    /// `assistant/message`.
    AssistantMessage {
        /// Turn.
        turn: u64,
        /// Step.
        step: u64,
        /// Its text parts joined.
        text: String,
        /// It asked for tool calls (so it is not a final reply).
        has_tool_calls: bool,
        /// It was cut off.
        interrupted: bool,
    },
    /// `tool/call`.
    ToolCall {
        /// Turn.
        turn: u64,
        /// Step.
        step: u64,
    },
    /// AgentTavern's own context-mode change (`agent-tavern/context-mode`): never a line; the
    /// runtime reads the session's mode from the last one (the log is its source of truth).
    ContextMode {
        /// The mode from this event on.
        to: tavern_core::ContextMode,
    },
    /// Any other type this projector knows and never turns into lines (`assistant/chunk`,
    /// `tool/result`, `request/*`, `compaction/*`, AgentTavern's own events, …).
    Known(String),
    /// A type this projector does not know that changes the model-visible surface
    /// (`surfaceOp`), so it might carry a message: projection stops there.
    Unknown(String),
}

/// One event of the session log.
#[derive(Debug, Clone, PartialEq)]
pub struct HostEvent {
    /// Contiguous sequence number from 0.
    pub seq: u64,
    /// Epoch milliseconds.
    pub time: i64,
    /// What it is.
    pub kind: EventKind,
}
