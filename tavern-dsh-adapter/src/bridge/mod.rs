//! The sidecar bridge: the AgentTavern runtime behind a versioned newline-delimited JSON
//! protocol on stdio, for hosts written in other languages (the DSH plugin in
//! `integrations/dsh/` speaks it). Every frame is one JSON object on one line. Requests carry
//! an `id` and get exactly one response `{id, result}` or `{id, error: {code, message}}`;
//! notifications carry no `id` and get no response. A malformed frame gets an error frame
//! (`id: null`, code `bad-frame`) and the bridge keeps serving. Protocol reference:
//! `docs/HOST_INTEGRATION.md`.

pub mod host;
pub mod mcp;

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{json, Value};
use tavern_core::{AgentId, CharacterName, ChatId, ContextMode, HostFacts, SessionId};

use self::host::BridgeHost;
use crate::runtime::Runtime;
use crate::tavern_mode::PERSONA_SECTION;

/// The protocol version this bridge speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// One bridge: a runtime on a [`BridgeHost`].
#[derive(Debug)]
pub struct Bridge {
    runtime: Runtime,
    host: Arc<BridgeHost>,
    cancelled: Mutex<HashSet<String>>,
    shut_down: AtomicBool,
}

fn error(id: &Value, code: &str, message: impl Into<String>) -> Value {
    json!({"id": id, "error": {"code": code, "message": message.into()}})
}

fn param<'a>(params: &'a Value, key: &str) -> Result<&'a str, String> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("params.{key} must be a string"))
}

impl Bridge {
    /// A bridge over `runtime`, whose host must be `host`.
    pub fn new(runtime: Runtime, host: Arc<BridgeHost>) -> Self {
        Self {
            runtime,
            host,
            cancelled: Mutex::default(),
            shut_down: AtomicBool::new(false),
        }
    }

    /// Whether a `shutdown` request was served.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// Handles one frame; returns the frames to send back (a response, and/or `log`
    /// notifications).
    pub async fn handle(&self, line: &str) -> Vec<Value> {
        let frame: Value = match serde_json::from_str(line) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return vec![error(
                    &Value::Null,
                    "bad-frame",
                    "a frame must be a json object",
                )]
            }
            Err(e) => return vec![error(&Value::Null, "bad-frame", format!("not json: {e}"))],
        };
        let id = frame.get("id").cloned();
        let Some(method) = frame.get("method").and_then(Value::as_str) else {
            return vec![error(
                &id.unwrap_or(Value::Null),
                "bad-frame",
                "a frame needs a method",
            )];
        };
        let params = frame.get("params").cloned().unwrap_or(Value::Null);
        let mut out = Vec::new();
        let result = self.dispatch(method, &params, &mut out).await;
        if let Some(id) = id {
            out.push(match result {
                Ok(v) => json!({"id": id, "result": v}),
                Err((code, message)) => error(&id, code, message),
            });
        } else if let Err((code, message)) = result {
            out.push(json!({"method": "log", "params": {"level": "warn", "code": code, "message": message}}));
        }
        out
    }

    async fn dispatch(
        &self,
        method: &str,
        p: &Value,
        out: &mut Vec<Value>,
    ) -> Result<Value, (&'static str, String)> {
        let invalid = |m: String| ("invalid-params", m);
        let runtime_err = |e: crate::AdapterError| ("runtime", e.to_string());
        let agent = |key: &str| -> Result<AgentId, (&'static str, String)> {
            AgentId::parse(param(p, key).map_err(invalid)?).map_err(|e| invalid(e.to_string()))
        };
        let session = |key: &str| -> Result<SessionId, (&'static str, String)> {
            SessionId::parse(param(p, key).map_err(invalid)?).map_err(|e| invalid(e.to_string()))
        };
        match method {
            "handshake" => {
                let version = p.get("protocol").and_then(Value::as_u64).unwrap_or(0);
                if version != PROTOCOL_VERSION {
                    return Err((
                        "unsupported-protocol",
                        format!("this bridge speaks protocol {PROTOCOL_VERSION}, not {version}"),
                    ));
                }
                let facts = match p.get("facts") {
                    Some(f) => serde_json::from_value(f.clone())
                        .map_err(|e| invalid(format!("params.facts: {e}")))?,
                    None => HostFacts::dsh_rc6(),
                };
                let root = p
                    .get("sessionsRoot")
                    .and_then(Value::as_str)
                    .map(std::path::PathBuf::from);
                self.host.configure(facts, root);
                Ok(json!({
                    "protocol": PROTOCOL_VERSION,
                    "server": "agent-tavern",
                    "version": env!("CARGO_PKG_VERSION"),
                    "tools": self.runtime.tool_definitions(),
                    "sections": Runtime::sections(),
                    "capabilities": self.runtime.capabilities(),
                }))
            }
            "agent/created" => {
                let a = agent("agent")?;
                // Optional: bind a session that has no binding yet (headless hosts create
                // sessions themselves, so the plugin binds them on creation).
                if let Some(bind) = p.get("bind").filter(|b| b.is_object()) {
                    let s = SessionId::parse(a.as_str()).map_err(|e| invalid(e.to_string()))?;
                    if self
                        .runtime
                        .state()
                        .await
                        .map_err(runtime_err)?
                        .binding(&s)
                        .is_none()
                    {
                        let character =
                            CharacterName::parse(param(bind, "character").map_err(invalid)?)
                                .map_err(|e| invalid(e.to_string()))?;
                        let chat = ChatId::parse(param(bind, "chatId").map_err(invalid)?)
                            .map_err(|e| invalid(e.to_string()))?;
                        self.runtime
                            .new_chat(&s, &character, &chat, false)
                            .await
                            .map_err(runtime_err)?;
                    }
                }
                let decision = self.runtime.agent_created(&a).await.map_err(runtime_err)?;
                Ok(json!({"mounted": decision == crate::MountDecision::Mounted}))
            }
            "agent/disposed" => {
                self.host.set_running(&agent("agent")?, false);
                Ok(json!({}))
            }
            "agent/status" => {
                self.host.set_running(
                    &agent("agent")?,
                    param(p, "status").map_err(invalid)? == "running",
                );
                Ok(json!({}))
            }
            "event" => {
                let s = session("session")?;
                let event = p
                    .get("event")
                    .ok_or_else(|| invalid("params.event is required".into()))?;
                self.host.record(&s, event);
                match self.runtime.on_event(&s, event).await {
                    Ok(outcome) => Ok(json!({"appended": outcome.map_or(0, |o| o.appended)})),
                    Err(e) => Err(("projection", e.to_string())),
                }
            }
            "tool/call" => {
                let call_id = param(p, "callId").map_err(invalid)?.to_owned();
                if self
                    .cancelled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&call_id)
                {
                    return Ok(
                        json!({"error": {"code": "unavailable", "message": format!("call {call_id} was cancelled")}}),
                    );
                }
                let tool = param(p, "tool").map_err(invalid)?;
                let args = p.get("args").cloned().unwrap_or_else(|| json!({}));
                // The session comes from the host's execution context, never from arguments.
                Ok(self
                    .runtime
                    .call_tool(&agent("session")?, &call_id, tool, &args)
                    .await)
            }
            "tool/cancel" => {
                let call_id = param(p, "callId").map_err(invalid)?;
                self.cancelled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(call_id.to_owned());
                Ok(json!({}))
            }
            "prompt" => {
                let a = agent("agent")?;
                let mut parts = Vec::new();
                let mut sections = Runtime::sections();
                sections.sort_by_key(|s| s.order);
                for s in sections {
                    if let Some(text) = self
                        .runtime
                        .section_text(&a, &s.name)
                        .await
                        .map_err(runtime_err)?
                    {
                        parts.push(json!({"name": s.name, "order": s.order, "text": text}));
                    }
                }
                let text = parts
                    .iter()
                    .filter_map(|s| s["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n\n");
                Ok(
                    json!({"text": if parts.is_empty() { Value::Null } else { json!(text) }, "sections": parts, "personaSection": PERSONA_SECTION}),
                )
            }
            "chat/bind" => {
                let s = session("session")?;
                let character = CharacterName::parse(param(p, "character").map_err(invalid)?)
                    .map_err(|e| invalid(e.to_string()))?;
                let chat = ChatId::parse(param(p, "chatId").map_err(invalid)?)
                    .map_err(|e| invalid(e.to_string()))?;
                let group = p.get("group").and_then(Value::as_bool).unwrap_or(false);
                let b = self
                    .runtime
                    .new_chat(&s, &character, &chat, group)
                    .await
                    .map_err(runtime_err)?;
                Ok(
                    json!({"architecture": b.architecture().as_str(), "contextMode": b.context_mode().map(ContextMode::as_str)}),
                )
            }
            "mode/switch" => {
                let s = session("session")?;
                let mode = ContextMode::from_label(param(p, "mode").map_err(invalid)?).ok_or_else(
                    || invalid("params.mode must be dsh-native or agent-managed".into()),
                )?;
                let b = self
                    .runtime
                    .switch_mode(&s, mode)
                    .await
                    .map_err(runtime_err)?;
                Ok(json!({"contextMode": b.context_mode().map(ContextMode::as_str)}))
            }
            "resume" => {
                let o = self
                    .runtime
                    .resume(&session("session")?)
                    .await
                    .map_err(runtime_err)?;
                Ok(json!({"appended": o.map_or(0, |o| o.appended)}))
            }
            "status" => {
                let pending = self
                    .runtime
                    .pending_projections()
                    .await
                    .map_err(runtime_err)?;
                Ok(
                    json!({"pending": pending.iter().map(|c| json!({"session": c.session_id.as_str(), "error": c.error, "pendingCursor": c.pending_cursor})).collect::<Vec<_>>(),
                    "capabilities": self.runtime.capabilities()}),
                )
            }
            "tavern-mode/route" => {
                let req = crate::tavern_mode::RouteRequest {
                    method: param(p, "method").map_err(invalid)?,
                    admitted: p.get("admitted").and_then(Value::as_bool).unwrap_or(false),
                    body: p
                        .get("body")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .as_bytes(),
                };
                let resp = self.runtime.tavern_mode_route(req).await;
                Ok(json!({"status": resp.status, "body": resp.body}))
            }
            "shutdown" => {
                self.shut_down.store(true, Ordering::SeqCst);
                out.push(json!({"method": "log", "params": {"level": "info", "message": "agent-tavern bridge stopping; every write is already durable"}}));
                Ok(json!({"ok": true}))
            }
            other => Err(("unknown-method", format!("unknown method {other}"))),
        }
    }

    /// Serves frames from `input` until end of input or `shutdown`, writing responses to
    /// `output` (one line each, flushed).
    ///
    /// # Errors
    /// IO errors on the streams.
    pub fn serve(&self, input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
        for line in input.lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            for frame in tavern_store::fs::block_on(self.handle(&line)) {
                writeln!(output, "{frame}")?;
            }
            output.flush()?;
            if self.is_shut_down() {
                break;
            }
        }
        Ok(())
    }
}
