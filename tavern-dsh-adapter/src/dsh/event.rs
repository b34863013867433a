//! DSH's session-log envelope, decoded into the projector's host-neutral events. Core types
//! (`turn/*`, `step/*`, `user/message`, `assistant/message`, `tool/call`) become their
//! [`EventKind`]s; types known to carry no chat message are [`EventKind::Known`]; an unknown
//! type that changes the model-visible surface (`surfaceOp`) is [`EventKind::Unknown`] and
//! stops projection, never guessed at; other unknown types are bookkeeping and skipped.

use serde_json::Value;
use tavern_core::{ContextMode, ContextModeEvent};
use tavern_projector::event::{EventKind, HostEvent, TurnEndReason, UserSource};
use tavern_runtime::{LoggedEvent, UnreadableEvent};

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

/// Decodes one DSH session-log envelope `{type, seq, time, data, ignorable?, surfaceOp?}`.
///
/// # Errors
/// A lowercase description when the envelope itself (type, seq) is missing.
pub fn decode(v: &Value) -> Result<HostEvent, String> {
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
        ContextModeEvent::EVENT_TYPE => match data
            .get("to")
            .and_then(Value::as_str)
            .and_then(ContextMode::from_label)
        {
            Some(to) => EventKind::ContextMode { to },
            None => EventKind::Known(ty.to_owned()),
        },
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
        t if v.get("surfaceOp").is_some_and(|op| !op.is_null()) => EventKind::Unknown(t.to_owned()),
        t => EventKind::Known(t.to_owned()),
    };
    Ok(HostEvent { seq, time, kind })
}

/// Decodes one envelope as the runtime reads a log entry: decoded, or unreadable with why.
pub fn decode_logged(v: &Value) -> LoggedEvent {
    decode(v).map_err(|reason| UnreadableEvent {
        reason,
        seq: v.get("seq").and_then(Value::as_u64),
    })
}
