//! The host's session events (DSH rc.6 envelope and core types) as the projector reads them.
//! An unknown type that changes the model-visible surface (`surfaceOp`) is reported, never
//! guessed at; other unknown types are host bookkeeping and skipped.

use serde_json::Value;

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

/// Event types that exist and never become chat lines.
const KNOWN_SILENT: [&str; 13] = [
    "session",
    "assistant/chunk",
    "assistant/reasoning",
    "tool/result",
    "request/header",
    "request/context",
    "request/projection",
    "agent-tavern/context-mode",
    "agent-tavern/binding",
    "agent-tavern/greeting",
    "usage",
    "system/prompt",
    "runtime/context",
];

fn text_of(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn has_tool_calls(message: &Value) -> bool {
    let listed = ["tool_calls", "toolCalls"].iter().any(|k| {
        message
            .get(*k)
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    });
    let parts = message
        .get("content")
        .and_then(Value::as_array)
        .is_some_and(|parts| {
            parts.iter().any(|p| {
                matches!(
                    p.get("type").and_then(Value::as_str),
                    Some("tool-call" | "tool_call" | "toolCall" | "tool_use" | "tool-use")
                )
            })
        });
    listed || parts
}

fn num(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

impl HostEvent {
    /// Reads an envelope `{type, seq, time, data, ignorable?, …}`.
    ///
    /// # Errors
    /// A lowercase description when the envelope itself (type, seq) is missing.
    pub fn from_json(v: &Value) -> Result<Self, String> {
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or("event without a type")?;
        let seq = v
            .get("seq")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("{ty} event without a seq"))?;
        let time = v.get("time").and_then(Value::as_i64).unwrap_or(0);
        let data = v.get("data").cloned().unwrap_or(Value::Null);
        let ignorable = v.get("ignorable").and_then(Value::as_bool).unwrap_or(false);
        let kind = match ty {
            "turn/start" => EventKind::TurnStart {
                turn: num(&data, "turn"),
            },
            "turn/end" => {
                let reason = data
                    .pointer("/reason/kind")
                    .or_else(|| data.get("reason"))
                    .and_then(Value::as_str)
                    .unwrap_or("completed");
                EventKind::TurnEnd {
                    turn: num(&data, "turn"),
                    reason: if reason == "completed" {
                        TurnEndReason::Completed
                    } else {
                        TurnEndReason::Other(reason.to_owned())
                    },
                }
            }
            "step/start" => EventKind::StepStart {
                turn: num(&data, "turn"),
                step: num(&data, "step"),
            },
            "step/end" => EventKind::StepEnd {
                turn: num(&data, "turn"),
                step: num(&data, "step"),
            },
            "user/message" => {
                let msg = data
                    .get("message")
                    .filter(|m| m.is_object())
                    .unwrap_or(&data);
                let source = match msg.pointer("/source/kind").and_then(Value::as_str) {
                    Some("user") | None => UserSource::User,
                    Some(_) => UserSource::Plugin,
                };
                EventKind::UserMessage {
                    source,
                    text: text_of(msg),
                }
            }
            "assistant/message" => {
                let msg = data.get("message").unwrap_or(&Value::Null);
                EventKind::AssistantMessage {
                    turn: num(&data, "turn"),
                    step: num(&data, "step"),
                    text: text_of(msg),
                    has_tool_calls: has_tool_calls(msg),
                    interrupted: data
                        .get("interrupted")
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                        || msg
                            .get("interrupted")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                }
            }
            "tool/call" => EventKind::ToolCall {
                turn: num(&data, "turn"),
                step: num(&data, "step"),
            },
            t if KNOWN_SILENT.contains(&t) || t.starts_with("compaction/") || ignorable => {
                EventKind::Known(t.to_owned())
            }
            // A type this projector does not know can only carry a chat message if it changes
            // what the model sees (`surfaceOp`). Those are refused, never guessed at; the
            // host's bookkeeping events (policies, inbox, titles, …) are skipped.
            t if v.get("surfaceOp").is_some_and(|op| !op.is_null()) => {
                EventKind::Unknown(t.to_owned())
            }
            t => EventKind::Known(t.to_owned()),
        };
        Ok(Self { seq, time, kind })
    }
}
