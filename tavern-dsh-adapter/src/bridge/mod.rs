//! The sidecar bridge: the AgentTavern runtime behind a versioned newline-delimited JSON
//! protocol on stdio, for hosts written in other languages (the DSH plugin in
//! `integrations/dsh/` speaks it). Every frame is one JSON object on one line. Requests carry
//! an `id` and get exactly one response `{id, result}` or `{id, error: {code, message}}`;
//! notifications carry no `id` and get no response. A malformed frame gets an error frame
//! (with its `id` when that is readable, else `id: null`) and the bridge keeps serving.
//! Frames of one session are served in order; different sessions are served concurrently, so
//! one slow call never stalls another session. Protocol reference: `docs/HOST_INTEGRATION.md`.

pub mod calls;
pub mod frame;
pub mod host;
mod serve;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{json, Value};
use tavern_core::{AgentId, ContextMode};

use self::calls::{Calls, CancelOutcome};
use self::frame::{Frame, Request, RunState};
use self::host::BridgeHost;
use tavern_runtime::tavern_mode::PERSONA_SECTION;
use tavern_runtime::{MountDecision, Runtime, RuntimeError};

use crate::dsh::event::decode_logged;

/// The protocol version this bridge speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// The largest frame a bridge reads by default (4 MiB): a bigger line is answered with an
/// error frame and skipped without being held in memory.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// Bridge settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BridgeConfig {
    /// The largest frame read, in bytes (the line terminator excluded).
    pub max_frame_bytes: usize,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        Self {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        }
    }
}

/// One bridge: a runtime on a [`BridgeHost`].
#[derive(Debug)]
pub struct Bridge {
    /// Shared with the tasks tool calls run on.
    runtime: Arc<Runtime>,
    /// The management API over the same runtime, for requests the host's web server forwards.
    api: tavern_api::Api,
    host: Arc<BridgeHost>,
    config: BridgeConfig,
    calls: Mutex<Calls>,
    /// Agents announced by `agent/created` and not disposed: only they may call tools.
    agents: Mutex<HashSet<AgentId>>,
    handshaken: AtomicBool,
    shut_down: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn error(id: &Value, code: &str, message: impl Into<String>) -> Value {
    json!({"id": id, "error": {"code": code, "message": message.into()}})
}

impl Bridge {
    /// A bridge over `runtime`, whose host must be `host`, with default settings.
    pub fn new(runtime: Runtime, host: Arc<BridgeHost>) -> Self {
        Self::with_config(runtime, host, BridgeConfig::default())
    }

    /// A bridge with explicit settings.
    pub fn with_config(runtime: Runtime, host: Arc<BridgeHost>, config: BridgeConfig) -> Self {
        let runtime = Arc::new(runtime);
        // The plugin admits callers (its token or loopback) before it forwards anything.
        let api = tavern_api::Api::new(runtime.clone(), tavern_api::ApiConfig::default());
        Self {
            runtime,
            api,
            host,
            config,
            calls: Mutex::default(),
            agents: Mutex::default(),
            handshaken: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
        }
    }

    /// The same bridge whose management API (the panel's store page) runs `check` — the
    /// bridge program gives the file store's check when it serves `--data`.
    #[must_use]
    pub fn with_store_check(mut self, check: tavern_api::routes::store::StoreCheckRef) -> Self {
        self.api = self.api.with_store_check(check);
        self
    }

    /// `(tool calls in flight, early cancels, finished call ids)` remembered, and announced
    /// agents (bounded-memory checks).
    pub fn bookkeeping(&self) -> ((usize, usize, usize), usize) {
        (lock(&self.calls).sizes(), lock(&self.agents).len())
    }

    /// The runtime behind the bridge.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Whether a `shutdown` request was served.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// Handles one frame's text; returns the frames to send back (a response, and/or `log`
    /// notifications).
    pub async fn handle(&self, line: &str) -> Vec<Value> {
        match frame::parse(line) {
            Ok(f) => self.handle_frame(f).await,
            Err((id, e)) => vec![error(&id.unwrap_or(Value::Null), e.code, e.message)],
        }
    }

    /// Handles one parsed frame.
    async fn handle_frame(&self, frame: Frame) -> Vec<Value> {
        let mut out = Vec::new();
        if frame.repaired {
            out.push(json!({"method": "log", "params": {"level": "warn", "code": "repaired", "message": "the frame held lone utf-16 surrogates (half characters); they were read as U+FFFD"}}));
        }
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

    /// Refuses what must not run before the handshake, and tool calls and prompts of agents
    /// the host never announced (or disposed of).
    fn admit(&self, request: &Request) -> Result<(), (&'static str, String)> {
        if !matches!(request, Request::Handshake(_) | Request::Shutdown(_))
            && !self.handshaken.load(Ordering::SeqCst)
        {
            return Err((
                "handshake-required",
                "send handshake before anything else".into(),
            ));
        }
        let agent = match request {
            Request::ToolCall(c) => &c.session,
            Request::Prompt(a) => &a.agent,
            _ => return Ok(()),
        };
        if lock(&self.agents).contains(agent) {
            Ok(())
        } else {
            Err((
                "unknown-agent",
                format!("agent {agent} was not announced with agent/created, or was disposed"),
            ))
        }
    }

    async fn dispatch(
        &self,
        request: Request,
        out: &mut Vec<Value>,
    ) -> Result<Value, (&'static str, String)> {
        let runtime_err = |e: RuntimeError| ("runtime", e.to_string());
        self.admit(&request)?;
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
                self.handshaken.store(true, Ordering::SeqCst);
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
                        if bind.existing {
                            self.runtime
                                .bind_existing_chat(&s, &bind.character, &bind.chat_id)
                                .await
                                .map_err(runtime_err)?;
                        } else {
                            self.runtime
                                .new_chat(&s, &bind.character, &bind.chat_id, false)
                                .await
                                .map_err(runtime_err)?;
                        }
                    }
                }
                let decision = self
                    .runtime
                    .agent_created(&created.agent)
                    .await
                    .map_err(runtime_err)?;
                lock(&self.agents).insert(created.agent.clone());
                Ok(json!({"mounted": decision == MountDecision::Mounted}))
            }
            Request::AgentDisposed(a) => {
                lock(&self.agents).remove(&a.agent);
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
                // DSH's envelope is decoded here, at the edge; the runtime sees neutral events.
                let result = self
                    .runtime
                    .on_logged_event(&e.session, &decode_logged(&e.event))
                    .await;
                // Mirrored for a replay that cannot read the host's log: a bound session's
                // events until they are projected, an unbound one's only a few (DSH logs a
                // few before it binds), so memory follows the sessions, not the traffic. An
                // event this call already projected is not copied at all.
                let bound = matches!(&result, Ok(Some(_)) | Err(_));
                let projected = match (&result, e.event.get("seq").and_then(Value::as_u64)) {
                    (Ok(Some(o)), Some(seq)) => o.cursor.is_some_and(|c| c >= seq),
                    _ => false,
                };
                if !projected {
                    self.host.record(&e.session, &e.event, bound);
                }
                match result {
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
                if !lock(&self.calls).admit(call.session.as_str(), &call.call_id) {
                    return Ok(
                        json!({"error": {"code": "unavailable", "message": format!("call {} was cancelled", call.call_id)}}),
                    );
                }
                // The session comes from the host's execution context, never from arguments.
                Ok(self.run_call(call).await)
            }
            Request::ToolCancel(c) => {
                let outcome =
                    lock(&self.calls).cancel(c.session.as_ref().map(AgentId::as_str), &c.call_id);
                Ok(json!({"cancelled": match outcome {
                    CancelOutcome::Aborted => "aborted",
                    CancelOutcome::Early => "before-start",
                    CancelOutcome::Late => "already-finished",
                }}))
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
                let req = tavern_runtime::tavern_mode::RouteRequest {
                    method: &r.method,
                    admitted: r.admitted,
                    body: r.body.as_bytes(),
                };
                let resp = self.runtime.tavern_mode_route(req).await;
                Ok(json!({"status": resp.status, "body": resp.body}))
            }
            Request::Api(a) => {
                let resp = self
                    .api
                    .forward(tavern_api::Forwarded {
                        method: a.method,
                        path_and_query: a.path,
                        content_type: a.content_type,
                        body: a.body.into_bytes(),
                        base: a.base,
                        cookie: a.cookie,
                        accept_language: a.accept_language,
                        sign_in_token: a.sign_in_token,
                    })
                    .await;
                Ok(json!({
                    "status": resp.status,
                    "contentType": resp.content_type,
                    "location": resp.location,
                    "setCookie": resp.set_cookie,
                    "body": String::from_utf8_lossy(&resp.body),
                }))
            }
            Request::Shutdown(_) => {
                self.shut_down.store(true, Ordering::SeqCst);
                out.push(json!({"method": "log", "params": {"level": "info", "message": "agent-tavern bridge stopping; every write is already durable"}}));
                Ok(json!({"ok": true}))
            }
        }
    }

    /// Runs a tool call that `tool/cancel` can stop while it runs.
    async fn run_call(&self, call: frame::ToolCall) -> Value {
        let id = call.call_id.clone();
        let cancelled = || json!({"error": {"code": "unavailable", "message": format!("call {id} was cancelled")}});
        let session = call.session.as_str().to_owned();
        let stop = lock(&self.calls).started(&session, &id);
        // The call runs on a task of its own, so a cancel is answered at once even while the
        // call blocks its thread in a store or file operation; the task is then aborted at its
        // next await (a store write under way completes durably, but the model is told the
        // call was cancelled). Without a tokio runtime the call runs here.
        let out = match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let runtime = self.runtime.clone();
                let mut task = rt.spawn(async move {
                    runtime
                        .call_tool(&call.session, &call.call_id, &call.tool, &call.args)
                        .await
                });
                tokio::select! {
                    out = &mut task => out.unwrap_or_else(|e| json!({"error": {"code": "unavailable", "message": format!("call {id} failed: {e}")}})),
                    () = stop.notified() => {
                        task.abort();
                        cancelled()
                    }
                }
            }
            Err(_) => match tokio::select! {
                out = self.runtime.call_tool(&call.session, &call.call_id, &call.tool, &call.args) => Some(out),
                () = stop.notified() => None,
            } {
                Some(out) => out,
                None => cancelled(),
            },
        };
        lock(&self.calls).finished(&session, &id);
        out
    }
}
