//! Context-mode switching rules: AgentTavern bindings only, at an idle turn boundary only, and
//! only to a mode the host supports. The result must be persisted together with its event.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::binding::{ContextMode, SessionBinding};
use crate::capability::{AgentTavernCapabilities, Availability};
use crate::error::CoreError;
use crate::ids::SessionId;
use crate::time::Timestamp;

/// Whether the agent is between turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnState {
    /// Idle at a turn boundary.
    Idle,
    /// A turn is running (a step, tool call or request is in flight).
    Running,
}

/// The `agent-tavern/context-mode` session event, persisted with the new binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextModeEvent {
    /// The session whose mode changed.
    pub session_id: SessionId,
    /// The mode before.
    pub from: ContextMode,
    /// The mode after.
    pub to: ContextMode,
    /// When the switch was decided.
    pub at: Timestamp,
}

impl ContextModeEvent {
    /// The event type the host log records it under.
    pub const EVENT_TYPE: &'static str = "agent-tavern/context-mode";
}

/// Why a mode switch was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModeSwitchRefusal {
    /// `st` bindings have no context mode.
    NotAgentTavern,
    /// The agent is running a turn; switches happen only at idle turn boundaries.
    AgentBusy,
    /// The host cannot support the requested mode.
    Unavailable {
        /// The requested mode.
        mode: ContextMode,
        /// The capability's reason.
        reason: String,
    },
    /// The session already uses that mode.
    AlreadyInMode(ContextMode),
}

impl fmt::Display for ModeSwitchRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAgentTavern => f.write_str("only agent-tavern sessions have a context mode"),
            Self::AgentBusy => {
                f.write_str("the agent is running a turn; switch at an idle turn boundary")
            }
            Self::Unavailable { mode, reason } => write!(f, "{mode} is unavailable: {reason}"),
            Self::AlreadyInMode(mode) => write!(f, "the session already uses {mode}"),
        }
    }
}

/// Decides a context-mode switch.
///
/// # Errors
/// [`CoreError::ModeSwitchRefused`] with the rule that refused it.
pub fn switch_context_mode(
    session: &SessionId,
    binding: &SessionBinding,
    to: ContextMode,
    turn: TurnState,
    caps: &AgentTavernCapabilities,
    now: Timestamp,
) -> Result<(SessionBinding, ContextModeEvent), CoreError> {
    let refuse = |reason| CoreError::ModeSwitchRefused {
        session: session.to_string(),
        reason,
    };
    let Some(from) = binding.context_mode() else {
        return Err(refuse(ModeSwitchRefusal::NotAgentTavern));
    };
    if turn != TurnState::Idle {
        return Err(refuse(ModeSwitchRefusal::AgentBusy));
    }
    if let Availability::Unavailable { reason } = caps.for_mode(to) {
        return Err(refuse(ModeSwitchRefusal::Unavailable {
            mode: to,
            reason: reason.clone(),
        }));
    }
    if from == to {
        return Err(refuse(ModeSwitchRefusal::AlreadyInMode(to)));
    }
    let event = ContextModeEvent {
        session_id: session.clone(),
        from,
        to,
        at: now,
    };
    Ok((binding.with_mode(to), event))
}
