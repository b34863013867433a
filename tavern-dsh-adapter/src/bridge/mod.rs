//! The sidecar bridge: the AgentTavern runtime behind a versioned newline-delimited JSON
//! protocol on stdio, for hosts written in other languages (the DSH plugin in
//! `integrations/dsh/` speaks it). Every frame is one JSON object on one line. Requests carry
//! an `id` and get exactly one response `{id, result}` or `{id, error: {code, message}}`;
//! notifications carry no `id` and get no response. A malformed frame gets an error frame
//! (`id: null`, code `bad-frame`) and the bridge keeps serving. Protocol reference:
//! `docs/HOST_INTEGRATION.md`.

pub mod frame;
pub mod host;
pub mod mcp;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{json, Value};
use tavern_core::ContextMode;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use self::frame::{Request, RunState};
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

    /// The runtime behind the bridge.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Whether a `shutdown` request was served.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// Handles one frame; returns the frames to send back (a response, and/or `log`
    /// notifications).
    pub async fn handle(&self, line: &str) -> Vec<Value> {
        let frame = match frame::parse(line) {
            Ok(f) => f,
            Err((id, e)) => return vec![error(&id.unwrap_or(Value::Null), e.code, e.message)],
        };
        let mut out = Vec::new();
        let result = self.dispatch(frame.request, &mut out).await;
        if let Some(id) = frame.id {
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
        request: Request,
        out: &mut Vec<Value>,
    ) -> Result<Value, (&'static str, String)> {
        let runtime_err = |e: crate::AdapterError| ("runtime", e.to_string());
        match request {
            Request::Handshake(h) => {
                if h.protocol != PROTOCOL_VERSION {
                    return Err((
                        "unsupported-protocol",
                        format!(
                            "this bridge speaks protocol {PROTOCOL_VERSION}, not {}",
                            h.protocol
                        ),
                    ));
                }
                let facts = h.facts.unwrap_or_else(crate::dsh::rc6_facts);
                self.host
                    .configure(facts, h.sessions_root.map(std::path::PathBuf::from));
                Ok(json!({
                    "protocol": PROTOCOL_VERSION,
                    "server": "agent-tavern",
                    "version": env!("CARGO_PKG_VERSION"),
                    "tools": self.runtime.tool_definitions(),
                    "sections": Runtime::sections(),
                    "capabilities": self.runtime.capabilities(),
                }))
            }
            Request::AgentCreated(created) => {
                // Optional: bind a session that has no binding yet (headless hosts create
                // sessions themselves, so the plugin binds them on creation).
                if let Some(bind) = created.bind {
                    let s = self
                        .runtime
                        .session_of(&created.agent)
                        .map_err(runtime_err)?;
                    let state = self.runtime.state().await.map_err(runtime_err)?;
                    if state.binding(&s).is_none() {
                        self.runtime
                            .new_chat(&s, &bind.character, &bind.chat_id, false)
                            .await
                            .map_err(runtime_err)?;
                    }
                }
                let decision = self
                    .runtime
                    .agent_created(&created.agent)
                    .await
                    .map_err(runtime_err)?;
                Ok(json!({"mounted": decision == crate::MountDecision::Mounted}))
            }
            Request::AgentDisposed(a) => {
                if let Ok(session) = self.runtime.session_of(&a.agent) {
                    self.host.dispose(&a.agent, &session);
                }
                self.runtime.agent_disposed(&a.agent);
                Ok(json!({}))
            }
            Request::AgentStatus(st) => {
                self.host
                    .set_running(&st.agent, st.status == RunState::Running);
                Ok(json!({}))
            }
            Request::Event(e) => {
                self.host.record(&e.session, &e.event);
                match self.runtime.on_event(&e.session, &e.event).await {
                    Ok(outcome) => {
                        if let Some(cursor) = outcome.as_ref().and_then(|o| o.cursor) {
                            self.host.projected_through(&e.session, cursor);
                        }
                        Ok(json!({"appended": outcome.map_or(0, |o| o.appended)}))
                    }
                    Err(err) => Err(("projection", err.to_string())),
                }
            }
            Request::ToolCall(call) => {
                if self
                    .cancelled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&call.call_id)
                {
                    return Ok(
                        json!({"error": {"code": "unavailable", "message": format!("call {} was cancelled", call.call_id)}}),
                    );
                }
                // The session comes from the host's execution context, never from arguments.
                Ok(self
                    .runtime
                    .call_tool(&call.session, &call.call_id, &call.tool, &call.args)
                    .await)
            }
            Request::ToolCancel(c) => {
                self.cancelled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(c.call_id);
                Ok(json!({}))
            }
            Request::Prompt(a) => {
                let mut parts = Vec::new();
                let mut sections = Runtime::sections();
                sections.sort_by_key(|s| s.order);
                for s in sections {
                    if let Some(text) = self
                        .runtime
                        .section_text(&a.agent, &s.name)
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
            Request::ChatBind(b) => {
                let binding = self
                    .runtime
                    .new_chat(&b.session, &b.character, &b.chat_id, b.group)
                    .await
                    .map_err(runtime_err)?;
                Ok(
                    json!({"architecture": binding.architecture().as_str(), "contextMode": binding.context_mode().map(ContextMode::as_str)}),
                )
            }
            Request::ModeSwitch(m) => {
                let b = self
                    .runtime
                    .switch_mode(&m.session, m.mode)
                    .await
                    .map_err(runtime_err)?;
                Ok(json!({"contextMode": b.context_mode().map(ContextMode::as_str)}))
            }
            Request::Resume(r) => {
                let o = self.runtime.resume(&r.session).await.map_err(runtime_err)?;
                Ok(json!({"appended": o.map_or(0, |o| o.appended)}))
            }
            Request::Status(_) => {
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
            Request::Route(r) => {
                let req = crate::tavern_mode::RouteRequest {
                    method: &r.method,
                    admitted: r.admitted,
                    body: r.body.as_bytes(),
                };
                let resp = self.runtime.tavern_mode_route(req).await;
                Ok(json!({"status": resp.status, "body": resp.body}))
            }
            Request::Shutdown(_) => {
                self.shut_down.store(true, Ordering::SeqCst);
                out.push(json!({"method": "log", "params": {"level": "info", "message": "agent-tavern bridge stopping; every write is already durable"}}));
                Ok(json!({"ok": true}))
            }
        }
    }

    /// Serves frames from `input` until end of input or `shutdown`, writing responses to
    /// `output` (one line each, flushed). A frame that is not UTF-8 gets an error frame; the
    /// bridge keeps serving.
    ///
    /// # Errors
    /// IO errors on the streams.
    pub async fn serve(
        &self,
        mut input: impl AsyncBufRead + Unpin,
        mut output: impl AsyncWrite + Unpin,
    ) -> std::io::Result<()> {
        let mut buf = Vec::new();
        loop {
            buf.clear();
            if input.read_until(b'\n', &mut buf).await? == 0 {
                break;
            }
            let frames = match std::str::from_utf8(&buf) {
                Ok(line) if line.trim().is_empty() => continue,
                Ok(line) => self.handle(line).await,
                Err(e) => vec![error(
                    &Value::Null,
                    "bad-frame",
                    format!("not utf-8 (byte {})", e.valid_up_to()),
                )],
            };
            for frame in frames {
                output.write_all(format!("{frame}\n").as_bytes()).await?;
            }
            output.flush().await?;
            if self.is_shut_down() {
                break;
            }
        }
        Ok(())
    }
}
