//! Tavern mode (seed 004): a roleplay preset whose default persona prompt lives in the preset,
//! and a per-session override kept in the `PromptStore`. The text is used literally —
//! `{{char}}`/`{{user}}` stay as written (on DSH rc.6 it goes in as a variable value, which is
//! never re-scanned). The host route `POST /tavern-mode/system-prompt` is split into a pure
//! request parser and a handler over the store, so it is testable without a host.

use serde_json::{json, Value};
use tavern_core::SessionId;
use tavern_store::prompt::PROMPT_MAX_BYTES;
use tavern_store::PromptStore;

/// The section the persona prompt is registered under, on the agent's own scope.
pub const PERSONA_SECTION: &str = "deployment:persona-prefix";

/// The tavern-mode preset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TavernModePreset {
    /// Preset id.
    pub id: String,
    /// The persona prompt used when a session has none of its own.
    pub default_prompt: String,
}

impl Default for TavernModePreset {
    fn default() -> Self {
        Self {
            id: "tavern-mode".into(),
            default_prompt:
                "You are {{char}} in an ongoing roleplay with {{user}}. Stay in character, \
                write vivid but concise replies, never speak or act for {{user}}, and keep the \
                story consistent with what you know."
                    .into(),
        }
    }
}

impl TavernModePreset {
    /// The persona text for a session: its custom prompt, or the preset default.
    pub async fn persona_text(&self, prompts: &dyn PromptStore, session: &SessionId) -> String {
        match prompts.get_prompt(session).await {
            Ok(Some(p)) => p.text,
            _ => self.default_prompt.clone(),
        }
    }
}

/// An HTTP request as the route sees it.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// HTTP method.
    pub method: &'a str,
    /// Whether the host admitted the caller (authenticated).
    pub admitted: bool,
    /// The raw body.
    pub body: &'a [u8],
}

/// The route's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteResponse {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: Value,
}

impl RouteResponse {
    fn error(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: json!({"ok": false, "error": code, "message": message.into()}),
        }
    }
}

/// A valid route request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteAction {
    /// Read the effective prompt.
    Read(SessionId),
    /// Save a custom prompt (blank = reset).
    Save(SessionId, String),
    /// Drop the custom prompt.
    Reset(SessionId),
}

/// Parses a request: 405 `method-not-allowed`, 401 `unauthorized`, 400 `bad-request`
/// (not a JSON object, or `text` missing for save), 400 `unknown-action`, 400 `bad-session`,
/// 413 `too-long`, in that order.
///
/// # Errors
/// The error response to send.
pub fn parse_route(req: RouteRequest<'_>) -> Result<RouteAction, RouteResponse> {
    if !req.method.eq_ignore_ascii_case("POST") {
        return Err(RouteResponse::error(
            405,
            "method-not-allowed",
            format!("{} is not allowed; use POST", req.method),
        ));
    }
    if !req.admitted {
        return Err(RouteResponse::error(
            401,
            "unauthorized",
            "the caller is not admitted",
        ));
    }
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(req.body) else {
        return Err(RouteResponse::error(
            400,
            "bad-request",
            "the body must be a json object",
        ));
    };
    let action = body
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !matches!(action, "read" | "save" | "reset") {
        return Err(RouteResponse::error(
            400,
            "unknown-action",
            format!("unknown action {action:?}; use read, save or reset"),
        ));
    }
    let raw = body
        .get("sessionId")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let session = SessionId::parse(raw)
        .map_err(|e| RouteResponse::error(400, "bad-session", e.to_string()))?;
    match action {
        "read" => Ok(RouteAction::Read(session)),
        "reset" => Ok(RouteAction::Reset(session)),
        _ => {
            let Some(text) = body.get("text").and_then(Value::as_str) else {
                return Err(RouteResponse::error(
                    400,
                    "bad-request",
                    "save needs a text string",
                ));
            };
            if text.len() > PROMPT_MAX_BYTES {
                return Err(RouteResponse::error(
                    413,
                    "too-long",
                    format!("text has {} bytes; at most {PROMPT_MAX_BYTES}", text.len()),
                ));
            }
            Ok(RouteAction::Save(session, text.to_owned()))
        }
    }
}

/// Handles a request end to end. A save is on disk before it is visible; a failed save
/// changes nothing and answers 500 `save-failed` with the cause.
pub async fn handle_route(
    req: RouteRequest<'_>,
    prompts: &dyn PromptStore,
    preset: &TavernModePreset,
) -> RouteResponse {
    let action = match parse_route(req) {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let (session, result) = match action {
        RouteAction::Read(s) => {
            let r = prompts.get_prompt(&s).await.map(|_| ());
            (s, r)
        }
        RouteAction::Save(s, text) => {
            let r = prompts.save_prompt(&s, &text).await.map(|_| ());
            (s, r)
        }
        RouteAction::Reset(s) => {
            let r = prompts.reset_prompt(&s).await.map(|_| ());
            (s, r)
        }
    };
    if let Err(e) = result {
        return RouteResponse::error(500, "save-failed", e.to_string());
    }
    match prompts.get_prompt(&session).await {
        Ok(custom) => RouteResponse {
            status: 200,
            body: json!({
                "ok": true,
                "sessionId": session.as_str(),
                "custom": custom.is_some(),
                "text": custom.map_or_else(|| preset.default_prompt.clone(), |p| p.text),
            }),
        },
        Err(e) => RouteResponse::error(500, "save-failed", e.to_string()),
    }
}
