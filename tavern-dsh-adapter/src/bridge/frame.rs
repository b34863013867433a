//! The bridge protocol's frames as types: one request enum tagged by `method`, with typed,
//! validated parameters. A frame that does not parse is answered with an error frame naming
//! what is wrong (see [`parse`]).

use serde::Deserialize;
use serde_json::Value;
use tavern_core::{AgentId, CharacterName, ChatId, ContextMode, HostFacts, SessionId};

/// A request or notification, by method.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "method", content = "params")]
pub enum Request {
    /// `handshake`: protocol version, host facts, where the host keeps its session logs.
    #[serde(rename = "handshake")]
    Handshake(Handshake),
    /// `agent/created`: mount AgentTavern if the session is agent-tavern (binding it first
    /// when `bind` is given and it has no binding).
    #[serde(rename = "agent/created")]
    AgentCreated(AgentCreated),
    /// `agent/disposed`.
    #[serde(rename = "agent/disposed")]
    AgentDisposed(AgentRef),
    /// `agent/status`: running or idle.
    #[serde(rename = "agent/status")]
    AgentStatus(AgentStatus),
    /// `event`: one appended session event (the host's envelope, decoded by the runtime).
    #[serde(rename = "event")]
    Event(EventFrame),
    /// `tool/call`: run a tool for the session in the host's execution context.
    #[serde(rename = "tool/call")]
    ToolCall(ToolCall),
    /// `tool/cancel`.
    #[serde(rename = "tool/cancel")]
    ToolCancel(CallRef),
    /// `prompt`: the section texts for one request of an agent.
    #[serde(rename = "prompt")]
    Prompt(AgentRef),
    /// `chat/bind`: bind a new chat to a session.
    #[serde(rename = "chat/bind")]
    ChatBind(ChatBind),
    /// `mode/switch`.
    #[serde(rename = "mode/switch")]
    ModeSwitch(ModeSwitch),
    /// `resume`: replay the host log into the projector.
    #[serde(rename = "resume")]
    Resume(SessionRef),
    /// `status`: pending projections and capabilities.
    #[serde(rename = "status")]
    Status(Empty),
    /// `tavern-mode/route`: the HTTP route, as a pure request.
    #[serde(rename = "tavern-mode/route")]
    Route(RouteFrame),
    /// `api/request`: a request to the management API the host's web server received and
    /// admitted.
    #[serde(rename = "api/request")]
    Api(ApiFrame),
    /// `shutdown`.
    #[serde(rename = "shutdown")]
    Shutdown(Empty),
}

/// Methods this bridge serves (for telling an unknown method from bad parameters).
pub const METHODS: [&str; 15] = [
    "handshake",
    "agent/created",
    "agent/disposed",
    "agent/status",
    "event",
    "tool/call",
    "tool/cancel",
    "prompt",
    "chat/bind",
    "mode/switch",
    "resume",
    "status",
    "tavern-mode/route",
    "api/request",
    "shutdown",
];

/// No parameters (any given are ignored).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Empty {}

/// `handshake` parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handshake {
    /// The protocol version the host speaks.
    #[serde(default)]
    pub protocol: u64,
    /// What the host supports; DSH rc.6's facts when absent.
    pub facts: Option<HostFacts>,
    /// The root of the host's on-disk session logs.
    pub sessions_root: Option<String>,
}

/// An agent.
#[derive(Debug, Clone, Deserialize)]
pub struct AgentRef {
    /// The host's agent id.
    pub agent: AgentId,
}

/// A session.
#[derive(Debug, Clone, Deserialize)]
pub struct SessionRef {
    /// The session.
    pub session: SessionId,
}

/// A tool call.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallRef {
    /// The host's call id.
    pub call_id: String,
    /// The session the call belongs to (as in its `tool/call`). Without it (hosts before
    /// issue 30) only a running call is cancelled, never a later one.
    #[serde(default)]
    pub session: Option<AgentId>,
}

/// `agent/created` parameters.
#[derive(Debug, Clone, Deserialize)]
pub struct AgentCreated {
    /// The agent.
    pub agent: AgentId,
    /// Bind the session to this chat first, if it has no binding.
    pub bind: Option<Bind>,
}

/// A chat to bind a new session to.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bind {
    /// The card.
    pub character: CharacterName,
    /// The chat.
    pub chat_id: ChatId,
    /// Continue this chat, which must exist (a SillyTavern chat the user goes on with):
    /// nothing is written to it at binding, and a missing chat is an error naming the
    /// nearest ones. `false` (the default): a new chat, created with the card's greeting.
    #[serde(default)]
    pub existing: bool,
}

/// `agent/status` parameters.
#[derive(Debug, Clone, Deserialize)]
pub struct AgentStatus {
    /// The agent.
    pub agent: AgentId,
    /// `running` or `idle`.
    pub status: RunState,
}

/// An agent's run state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// In a turn.
    Running,
    /// At a turn boundary.
    Idle,
}

/// `event` parameters.
#[derive(Debug, Clone, Deserialize)]
pub struct EventFrame {
    /// The session whose log the event was appended to.
    pub session: SessionId,
    /// The event envelope as the host logged it.
    pub event: Value,
}

/// `tool/call` parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// The host's call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The model's arguments (validated by the tool).
    #[serde(default = "empty_object")]
    pub args: Value,
    /// The calling agent, from the host's execution context (never from arguments).
    pub session: AgentId,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// `chat/bind` parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatBind {
    /// The session.
    pub session: SessionId,
    /// The card.
    pub character: CharacterName,
    /// The chat.
    pub chat_id: ChatId,
    /// A group chat (always `st`).
    #[serde(default)]
    pub group: bool,
}

/// `mode/switch` parameters.
#[derive(Debug, Clone, Deserialize)]
pub struct ModeSwitch {
    /// The session.
    pub session: SessionId,
    /// `dsh-native` or `agent-managed`.
    pub mode: ContextMode,
}

/// `tavern-mode/route` parameters.
#[derive(Debug, Clone, Deserialize)]
pub struct RouteFrame {
    /// The HTTP method.
    pub method: String,
    /// Whether the host admitted the caller.
    #[serde(default)]
    pub admitted: bool,
    /// The request body.
    #[serde(default)]
    pub body: String,
}

/// `api/request` parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiFrame {
    /// The HTTP method.
    pub method: String,
    /// The path under the API's root with its query (`/api/v1/memories?scope=global`).
    pub path: String,
    /// The `Content-Type` header.
    #[serde(default)]
    pub content_type: Option<String>,
    /// The request body (UTF-8: JSON, or the panel's forms).
    #[serde(default)]
    pub body: String,
    /// The prefix the host serves these routes under (`/agent-tavern`).
    #[serde(default)]
    pub base: String,
    /// The `Cookie` header.
    #[serde(default)]
    pub cookie: Option<String>,
    /// The `Accept-Language` header.
    #[serde(default)]
    pub accept_language: Option<String>,
    /// Set when the host has not admitted the caller (its `routeToken` is configured and the
    /// request carries none): the host's token, against which only the panel's sign-in (and the
    /// session cookie it gives) opens the panel.
    #[serde(default)]
    pub sign_in_token: Option<String>,
}

/// Why a frame could not be read: the error code and message of the error frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    /// `bad-frame`, `unknown-method` or `invalid-params`.
    pub code: &'static str,
    /// What is wrong, naming the field.
    pub message: String,
}

/// A parsed frame: its id (requests) and what it asks.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The request id; `None` for notifications.
    pub id: Option<Value>,
    /// The request.
    pub request: Request,
    /// Lone UTF-16 surrogate escapes (what JavaScript writes for half an emoji) were read as
    /// U+FFFD.
    pub repaired: bool,
}

/// The id of a frame that could not be parsed, when it is readable (from the frame as far as
/// it is JSON, lone surrogates and bad bytes repaired).
pub fn readable_id(bytes: &[u8]) -> Option<Value> {
    match tavern_tools::assets::lenient::parse_lenient(bytes) {
        Ok(v) => v.get("id").cloned(),
        Err(_) => id_in_prefix(bytes),
    }
}

/// The top-level `"id"` of a frame cut short (an oversized frame keeps only its start): scans
/// the start as JSON tokens, outside nested values and strings, for `"id": <number|string>`.
fn id_in_prefix(bytes: &[u8]) -> Option<Value> {
    let text = String::from_utf8_lossy(bytes);
    let b = text.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    while i < b.len() {
        match b[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let start = i;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                if depth == 1 && &text[start..(i + 1).min(b.len())] == "\"id\"" {
                    let rest = text[(i + 1).min(b.len())..]
                        .trim_start()
                        .strip_prefix(':')?;
                    // The value ends at the next top-level comma or brace.
                    let mut de = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
                    return match de.next()? {
                        Ok(v @ (Value::Number(_) | Value::String(_))) => Some(v),
                        _ => None,
                    };
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Parses one frame's text.
///
/// # Errors
/// A [`FrameError`] and the id, when it was readable, for the error frame.
pub fn parse(line: &str) -> Result<Frame, (Option<Value>, FrameError)> {
    let bad = |code, message: String| FrameError { code, message };
    let mut repaired = false;
    let parsed = serde_json::from_str::<Value>(line).or_else(|e| {
        // JavaScript writes half an emoji as a lone surrogate escape, which is not JSON text
        // serde accepts; read it as U+FFFD rather than lose the whole frame.
        let fixed = tavern_tools::assets::lenient::repair_surrogates(line);
        if fixed == line {
            return Err(e);
        }
        repaired = true;
        serde_json::from_str::<Value>(&fixed).map_err(|_| e)
    });
    let mut frame = match parsed {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            return Err((
                None,
                bad("bad-frame", "a frame must be a json object".into()),
            ))
        }
        Err(e) => {
            return Err((
                readable_id(line.as_bytes()),
                bad("bad-frame", format!("not json: {e}")),
            ))
        }
    };
    let id = frame.get("id").cloned();
    let method = match frame.get("method") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err((id, bad("bad-frame", "a frame needs a method".into()))),
    };
    if !METHODS.contains(&method.as_str()) {
        return Err((
            id,
            bad("unknown-method", format!("unknown method {method}")),
        ));
    }
    frame.remove("id");
    if frame.get("params").is_none_or(Value::is_null) {
        frame.insert("params".into(), empty_object());
    }
    match serde_json::from_value::<Request>(Value::Object(frame)) {
        Ok(request) => Ok(Frame {
            id,
            request,
            repaired,
        }),
        Err(e) => Err((
            id,
            bad("invalid-params", format!("params of {method}: {e}")),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_id_of_a_cut_frame_is_found_at_the_top_level_only() {
        // `(the start of a frame, the id found)`
        let cases: [(&str, Option<Value>); 6] = [
            (
                r#"{"id": 8, "method": "status", "params": {"pad": "xxx"#,
                Some(json!(8)),
            ),
            (
                r#"{"method": "x", "id": "r-1", "params": {"#,
                Some(json!("r-1")),
            ),
            (
                r#"{"params": {"id": 3}, "method": "x", "id": 4, "pad": "#,
                Some(json!(4)),
            ),
            (r#"{"params": {"id": 3}, "pad": "yy"#, None),
            (r#"{"pad": "\"id\": 5", "id": 6"#, Some(json!(6))),
            (r#"{"id": {"nested": 1}, "x"#, None),
        ];
        for (start, want) in cases {
            assert_eq!(readable_id(start.as_bytes()), want, "{start}");
        }
    }
}
