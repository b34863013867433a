//! The pure part of chat projection: which events become which chat lines, and how far the
//! log has been decided. A final assistant message is only known to be final once its step
//! ends without a tool call, so planning stops before an undecided one and the cursor stays
//! there; the next batch re-reads it.

use crate::event::{EventKind, HostEvent, UserSource};

/// A chat line to write, with the event it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedLine {
    /// The event's seq (with the session id, the idempotency key).
    pub seq: u64,
    /// Turn number.
    pub turn: u64,
    /// Step number.
    pub step: u64,
    /// User (true) or character (false).
    pub is_user: bool,
    /// Message text.
    pub text: String,
    /// Event time (epoch ms).
    pub time: i64,
}

/// Where in the log a batch starts or ends: the turn and step in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    /// Turn in progress (0: none seen yet).
    pub turn: u64,
    /// Step in progress (0: none).
    pub step: u64,
}

/// What a batch of events yields.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Lines in log order.
    pub lines: Vec<PlannedLine>,
    /// The last seq fully decided (`None`: nothing yet).
    pub cursor: Option<u64>,
    /// The position right after `cursor`, to start the next batch from.
    pub position: Position,
    /// Set when an unknown, non-ignorable event stopped planning.
    pub blocked: Option<String>,
}

/// Whether the final-looking assistant message at `i` is final: its step ends (or the turn
/// moves on) before any tool call of the same step. `None`: not decided within `events`.
fn decided_final(events: &[HostEvent], i: usize, turn: u64, step: u64) -> Option<bool> {
    for e in &events[i + 1..] {
        match &e.kind {
            EventKind::ToolCall { turn: t, step: s } if (*t, *s) == (turn, step) => {
                return Some(false)
            }
            EventKind::StepEnd { turn: t, step: s } if (*t, *s) == (turn, step) => {
                return Some(true)
            }
            EventKind::StepStart { .. }
            | EventKind::TurnEnd { .. }
            | EventKind::TurnStart { .. }
            | EventKind::UserMessage { .. }
            | EventKind::AssistantMessage { .. } => return Some(true),
            _ => {}
        }
    }
    None
}

/// The turn and step a user message belongs to when the position is not known yet (a log
/// read from its middle): the next event that names them.
fn position_ahead(events: &[HostEvent], i: usize) -> (u64, u64) {
    for e in &events[i + 1..] {
        match e.kind {
            EventKind::StepStart { turn, step }
            | EventKind::StepEnd { turn, step }
            | EventKind::AssistantMessage { turn, step, .. }
            | EventKind::ToolCall { turn, step } => return (turn, step),
            EventKind::TurnStart { turn } | EventKind::TurnEnd { turn, .. } => return (turn, 0),
            _ => {}
        }
    }
    (0, 0)
}

/// Plans lines for `events`, which must be contiguous by seq and start right after the
/// checkpoint cursor. Only user-typed `user/message`s and final, complete `assistant/message`s
/// become lines; tool calls and results, chunks, reasoning and plugin messages never do.
pub fn plan(events: &[HostEvent], start: Position) -> Plan {
    let mut out = Plan {
        position: start,
        ..Plan::default()
    };
    let mut pos = start;
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            EventKind::TurnStart { turn } => pos = Position { turn, step: 0 },
            EventKind::StepStart { turn, step } => pos = Position { turn, step },
            _ => {}
        }
        match &e.kind {
            EventKind::Unknown(t) => {
                out.blocked = Some(format!("unknown event type {t} at seq {}", e.seq));
                return out;
            }
            EventKind::UserMessage {
                source: UserSource::User,
                text,
            } if !text.trim().is_empty() => {
                let (turn, step) = if pos.turn == 0 {
                    position_ahead(events, i)
                } else {
                    (pos.turn, pos.step)
                };
                out.lines.push(PlannedLine {
                    seq: e.seq,
                    turn,
                    step,
                    is_user: true,
                    text: text.clone(),
                    time: e.time,
                });
            }
            EventKind::AssistantMessage {
                turn,
                step,
                text,
                has_tool_calls: false,
                interrupted: false,
            } if !text.trim().is_empty() => match decided_final(events, i, *turn, *step) {
                None => return out,
                Some(false) => {}
                Some(true) => out.lines.push(PlannedLine {
                    seq: e.seq,
                    turn: *turn,
                    step: *step,
                    is_user: false,
                    text: text.clone(),
                    time: e.time,
                }),
            },
            _ => {}
        }
        out.cursor = Some(e.seq);
        out.position = pos;
    }
    out
}
