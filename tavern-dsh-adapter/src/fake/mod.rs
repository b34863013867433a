//! A strict fake AgentLoop host for tests and examples. It runs the ReAct loop the way DSH
//! does (user message → steps with tool calls → tool results → final assistant message),
//! logs every event with contiguous seqs to an on-disk JSONL file per session (reloaded on
//! open, so a "restart" is dropping and reopening it), and pushes each event to the runtime.
//!
//! The model is a script: each step replies, calls tools, fails like a provider, or is
//! stopped mid-stream. A model call with no script step left fails the turn; script steps
//! left unused when the host is dropped fail the test (a panic in `Drop`, as strict mocks do).
//! With [`HostFacts::agent_context_seam`] it also offers the `agent/context` seam, so
//! `agent-managed` sessions can be exercised end to end.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use serde_json::{json, Value};
use tavern_core::{AgentId, DefaultTokenEstimator, HostFacts, SessionId, TokenEstimator};
use tavern_projector::context::{Budget, NodeRole, ProjectionInput, SurfaceNode};

use tavern_projector::HostEvent;
use tavern_runtime::{
    AgentMount, HostError, HostPort, LoggedEvent, MountDecision, Runtime, TavernLogEvent,
};

use crate::dsh::event::{decode, decode_logged};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One planned tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallPlan {
    /// Tool name.
    pub name: String,
    /// Arguments.
    pub args: Value,
}

impl ToolCallPlan {
    /// A call of `name` with `args`.
    pub fn new(name: &str, args: Value) -> Self {
        Self {
            name: name.into(),
            args,
        }
    }
}

/// A function choosing tool calls from what the model sees (e.g. a revision read earlier).
pub type ToolPlanner = Box<dyn FnOnce(&ModelRequest) -> Vec<ToolCallPlan> + Send>;

/// What the scripted model does in one step.
pub enum ModelStep {
    /// Reply with final text.
    Reply(String),
    /// Call tools.
    Tools(Vec<ToolCallPlan>),
    /// Call tools chosen from the request.
    ToolsWith(ToolPlanner),
    /// Fail like a provider (the turn ends with an error).
    ProviderError(String),
    /// The user stops the reply mid-stream after `partial`.
    Stop {
        /// Text streamed before the stop.
        partial: String,
    },
}

impl std::fmt::Debug for ModelStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Reply(t) => write!(f, "Reply({t:?})"),
            Self::Tools(c) => write!(f, "Tools({c:?})"),
            Self::ToolsWith(_) => f.write_str("ToolsWith(..)"),
            Self::ProviderError(e) => write!(f, "ProviderError({e:?})"),
            Self::Stop { partial } => write!(f, "Stop({partial:?})"),
        }
    }
}

/// A message as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMessage {
    /// The event seq it comes from.
    pub seq: u64,
    /// `user`, `assistant` or `tool`.
    pub role: &'static str,
    /// Its text (for tools: the result JSON).
    pub text: String,
    /// Tool call ids (assistant messages).
    pub tool_calls: Vec<String>,
    /// The call answered (tool messages).
    pub call_id: Option<String>,
}

/// One request to the model, recorded for assertions.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The agent.
    pub agent: AgentId,
    /// Turn.
    pub turn: u64,
    /// Step.
    pub step: u64,
    /// The assembled system prompt (sections in order).
    pub system: String,
    /// Tool names offered.
    pub tools: Vec<String>,
    /// The messages sent.
    pub messages: Vec<ModelMessage>,
    /// The context window of the model route in force for this request.
    pub context_window: usize,
    /// The seqs a context projection selected, when one ran.
    pub projection: Option<Vec<u64>>,
}

impl ModelRequest {
    /// The parsed results of the tool calls made in this turn so far, oldest first.
    pub fn tool_results(&self) -> Vec<Value> {
        self.messages
            .iter()
            .filter(|m| m.role == "tool")
            .filter_map(|m| serde_json::from_str(&m.text).ok())
            .collect()
    }
}

/// How a turn went.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnReport {
    /// The turn number.
    pub turn: u64,
    /// The final assistant text, if the turn completed.
    pub reply: Option<String>,
    /// `completed`, `aborted` or `error`.
    pub reason: String,
    /// Every tool result of the turn, in order.
    pub tool_results: Vec<Value>,
    /// Projection errors the runtime reported (the turn is unaffected).
    pub projection_errors: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Idle,
    Running,
}

/// The fake host.
pub struct FakeHost {
    dir: PathBuf,
    facts: HostFacts,
    script: Mutex<VecDeque<ModelStep>>,
    requests: Mutex<Vec<ModelRequest>>,
    agents: Mutex<HashMap<AgentId, (Status, Option<AgentMount>)>>,
    logs: Mutex<HashMap<SessionId, Vec<Value>>>,
    context_window: AtomicUsize,
    model_calls: AtomicUsize,
}

impl std::fmt::Debug for FakeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeHost")
            .field("facts", &self.facts)
            .finish_non_exhaustive()
    }
}

/// Marks an agent as running a turn until dropped (to exercise idle-only rules).
#[derive(Debug)]
pub struct RunningGuard<'a> {
    host: &'a FakeHost,
    agent: AgentId,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.host.set_status(&self.agent, Status::Idle);
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        let left = lock(&self.script).len();
        if left > 0 && !std::thread::panicking() {
            panic!("FakeHost dropped with {left} unused model script step(s): the test expected more model calls");
        }
    }
}

impl FakeHost {
    /// Opens a fake host whose session logs live in `dir` (existing logs are reloaded).
    ///
    /// # Errors
    /// [`HostError`] when the directory or a log cannot be read.
    pub fn open(dir: impl AsRef<Path>, facts: HostFacts) -> Result<Self, HostError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir)
            .map_err(|e| HostError(format!("cannot create the log directory: {e}")))?;
        let mut logs = HashMap::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| HostError(e.to_string()))? {
            let path = entry.map_err(|e| HostError(e.to_string()))?.path();
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
                continue;
            }
            let Ok(session) = SessionId::parse(stem) else {
                continue;
            };
            let text = std::fs::read_to_string(&path)
                .map_err(|e| HostError(format!("log {stem}: {e}")))?;
            let events: Vec<Value> = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            logs.insert(session, events);
        }
        Ok(Self {
            dir,
            facts,
            script: Mutex::default(),
            requests: Mutex::default(),
            agents: Mutex::default(),
            logs: Mutex::new(logs),
            context_window: AtomicUsize::new(64_000),
            model_calls: AtomicUsize::new(0),
        })
    }

    /// Appends steps to the model script.
    pub fn script(&self, steps: impl IntoIterator<Item = ModelStep>) {
        lock(&self.script).extend(steps);
    }

    /// Every model request so far.
    pub fn requests(&self) -> Vec<ModelRequest> {
        lock(&self.requests).clone()
    }

    /// How many times the model was called.
    pub fn model_calls(&self) -> usize {
        self.model_calls.load(Ordering::SeqCst)
    }

    /// Changes the model route's context window (a provider/model switch).
    pub fn set_context_window(&self, tokens: usize) {
        self.context_window.store(tokens, Ordering::SeqCst);
    }

    /// A session's log.
    pub fn log(&self, session: &SessionId) -> Vec<Value> {
        lock(&self.logs).get(session).cloned().unwrap_or_default()
    }

    /// What is mounted on an agent.
    pub fn mount_of(&self, agent: &AgentId) -> Option<AgentMount> {
        lock(&self.agents).get(agent).and_then(|a| a.1.clone())
    }

    /// Marks the agent as running a turn until the guard is dropped.
    pub fn hold_running(&self, agent: &AgentId) -> RunningGuard<'_> {
        self.set_status(agent, Status::Running);
        RunningGuard {
            host: self,
            agent: agent.clone(),
        }
    }

    fn set_status(&self, agent: &AgentId, status: Status) {
        lock(&self.agents)
            .entry(agent.clone())
            .or_insert((Status::Idle, None))
            .0 = status;
    }

    /// Creates an agent (for the session of the same id) and lets the runtime mount on it
    /// before it is "published".
    ///
    /// # Errors
    /// The runtime's error, as text.
    pub async fn create_agent(
        &self,
        runtime: &Runtime,
        agent: &AgentId,
    ) -> Result<MountDecision, HostError> {
        self.set_status(agent, Status::Idle);
        runtime
            .agent_created(agent)
            .await
            .map_err(|e| HostError(e.to_string()))
    }

    fn append(
        &self,
        session: &SessionId,
        ty: &str,
        data: Value,
        ignorable: bool,
    ) -> Result<Value, HostError> {
        let mut logs = lock(&self.logs);
        let log = logs.entry(session.clone()).or_default();
        let seq = log.len() as u64;
        let time = 1_700_000_000_000_i64 + i64::try_from(seq).unwrap_or(0) * 1000;
        let mut event = json!({"type": ty, "seq": seq, "time": time, "data": data});
        if ignorable {
            event["ignorable"] = json!(true);
        }
        let path = self.dir.join(format!("{session}.jsonl"));
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| HostError(format!("log {session}: {e}")))?;
        writeln!(file, "{event}")
            .and_then(|()| file.sync_data())
            .map_err(|e| HostError(format!("log {session}: {e}")))?;
        log.push(event.clone());
        Ok(event)
    }

    async fn emit(
        &self,
        runtime: &Runtime,
        report: &mut TurnReport,
        session: &SessionId,
        ty: &str,
        data: Value,
        ignorable: bool,
    ) -> Result<u64, HostError> {
        let event = self.append(session, ty, data, ignorable)?;
        // The fake logs DSH's envelope and, like the bridge, decodes it at its edge.
        if let Err(e) = runtime
            .on_logged_event(session, &decode_logged(&event))
            .await
        {
            report.projection_errors.push(e.to_string());
        }
        Ok(event["seq"].as_u64().unwrap_or(0))
    }

    /// Ends the step and the turn with `reason`.
    async fn finish(
        &self,
        runtime: &Runtime,
        report: &mut TurnReport,
        session: &SessionId,
        turn: u64,
        step: u64,
        reason: Value,
    ) -> Result<(), HostError> {
        self.emit(
            runtime,
            report,
            session,
            "step/end",
            json!({"turn": turn, "step": step}),
            false,
        )
        .await?;
        self.emit(
            runtime,
            report,
            session,
            "turn/end",
            json!({"turn": turn, "reason": reason}),
            false,
        )
        .await?;
        Ok(())
    }

    /// The messages the model sees, derived from the log as DSH derives them.
    fn messages(&self, session: &SessionId) -> Vec<ModelMessage> {
        let mut out = Vec::new();
        for e in self.log(session) {
            let seq = e["seq"].as_u64().unwrap_or(0);
            let data = &e["data"];
            let text_of = |m: &Value| -> String {
                m["content"]
                    .as_array()
                    .map(|parts| {
                        parts
                            .iter()
                            .filter_map(|p| p["text"].as_str())
                            .collect::<Vec<_>>()
                            .join("")
                    })
                    .unwrap_or_default()
            };
            match e["type"].as_str().unwrap_or_default() {
                "user/message" => out.push(ModelMessage {
                    seq,
                    role: "user",
                    text: text_of(data),
                    tool_calls: vec![],
                    call_id: None,
                }),
                "agent-tavern/greeting" => out.push(ModelMessage {
                    seq,
                    role: "assistant",
                    text: data["text"].as_str().unwrap_or_default().into(),
                    tool_calls: vec![],
                    call_id: None,
                }),
                "assistant/message" => {
                    let m = &data["message"];
                    let calls = m["toolCalls"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|c| c["id"].as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    out.push(ModelMessage {
                        seq,
                        role: "assistant",
                        text: text_of(m),
                        tool_calls: calls,
                        call_id: None,
                    });
                }
                "tool/result" => {
                    let m = &data["message"];
                    out.push(ModelMessage {
                        seq,
                        role: "tool",
                        text: text_of(m),
                        tool_calls: vec![],
                        call_id: m["toolCallId"].as_str().map(str::to_owned),
                    });
                }
                _ => {}
            }
        }
        out
    }

    /// Runs one turn of the ReAct loop for `agent` with the user's `text`.
    ///
    /// # Errors
    /// [`HostError`] when the log cannot be written or the model was called with no script
    /// step left (the strict fake's way of failing a test).
    pub async fn run_turn(
        &self,
        runtime: &Runtime,
        agent: &AgentId,
        text: &str,
    ) -> Result<TurnReport, HostError> {
        let session = SessionId::parse(agent.as_str()).map_err(|e| HostError(e.to_string()))?;
        let turn = self
            .log(&session)
            .iter()
            .filter(|e| e["type"] == "turn/start")
            .count() as u64
            + 1;
        let mut report = TurnReport {
            turn,
            reply: None,
            reason: "completed".into(),
            tool_results: vec![],
            projection_errors: vec![],
        };
        self.set_status(agent, Status::Running);
        let result = self
            .react(runtime, agent, &session, text, &mut report)
            .await;
        self.set_status(agent, Status::Idle);
        result.map(|()| report)
    }

    async fn react(
        &self,
        runtime: &Runtime,
        agent: &AgentId,
        session: &SessionId,
        text: &str,
        report: &mut TurnReport,
    ) -> Result<(), HostError> {
        let turn = report.turn;
        self.emit(
            runtime,
            report,
            session,
            "turn/start",
            json!({"turn": turn}),
            false,
        )
        .await?;
        let mut step = 1u64;
        self.emit(
            runtime,
            report,
            session,
            "step/start",
            json!({"turn": turn, "step": step}),
            false,
        )
        .await?;
        let user_seq = self
            .emit(runtime, report, session, "user/message", json!({"role": "user", "id": format!("u{turn}"), "source": {"kind": "user"}, "content": [{"type": "text", "text": text}]}), false)
            .await?;
        let mount = self.mount_of(agent);
        loop {
            let request = self
                .request(
                    runtime,
                    report,
                    agent,
                    session,
                    turn,
                    step,
                    user_seq,
                    mount.as_ref(),
                )
                .await?;
            self.model_calls.fetch_add(1, Ordering::SeqCst);
            lock(&self.requests).push(request.clone());
            let Some(next) = lock(&self.script).pop_front() else {
                self.finish(
                    runtime,
                    report,
                    session,
                    turn,
                    step,
                    json!({"kind": "error", "message": "unscripted model call"}),
                )
                .await?;
                return Err(HostError(format!(
                    "unscripted model call in turn {turn} step {step}"
                )));
            };
            let calls = match next {
                ModelStep::Reply(text) => {
                    let message =
                        json!({"role": "assistant", "content": [{"type": "text", "text": text}]});
                    self.emit(
                        runtime,
                        report,
                        session,
                        "assistant/message",
                        json!({"turn": turn, "step": step, "message": message}),
                        false,
                    )
                    .await?;
                    self.finish(
                        runtime,
                        report,
                        session,
                        turn,
                        step,
                        json!({"kind": "completed"}),
                    )
                    .await?;
                    report.reply = Some(text);
                    return Ok(());
                }
                ModelStep::ProviderError(message) => {
                    self.finish(
                        runtime,
                        report,
                        session,
                        turn,
                        step,
                        json!({"kind": "error", "message": message}),
                    )
                    .await?;
                    report.reason = "error".into();
                    return Ok(());
                }
                ModelStep::Stop { partial } => {
                    self.emit(
                        runtime,
                        report,
                        session,
                        "assistant/chunk",
                        json!({"turn": turn, "step": step, "delta": partial}),
                        true,
                    )
                    .await?;
                    let message = json!({"role": "assistant", "content": [{"type": "text", "text": partial}]});
                    self.emit(runtime, report, session, "assistant/message", json!({"turn": turn, "step": step, "message": message, "interrupted": true}), false).await?;
                    self.finish(
                        runtime,
                        report,
                        session,
                        turn,
                        step,
                        json!({"kind": "aborted"}),
                    )
                    .await?;
                    report.reason = "aborted".into();
                    return Ok(());
                }
                ModelStep::Tools(calls) => calls,
                ModelStep::ToolsWith(plan) => plan(&request),
            };
            let ids: Vec<String> = (0..calls.len())
                .map(|i| format!("call-{turn}-{step}-{i}"))
                .collect();
            let listed: Vec<Value> = calls
                .iter()
                .zip(&ids)
                .map(|(c, id)| json!({"id": id, "name": c.name}))
                .collect();
            self.emit(runtime, report, session, "assistant/message", json!({"turn": turn, "step": step, "message": {"role": "assistant", "content": [], "toolCalls": listed}}), false).await?;
            for (call, id) in calls.iter().zip(&ids) {
                self.emit(runtime, report, session, "tool/call", json!({"turn": turn, "step": step, "callId": id, "name": call.name, "arguments": call.args}), false).await?;
                let offered = mount
                    .as_ref()
                    .is_some_and(|m| m.tools.iter().any(|t| t.name == call.name));
                let result = if offered {
                    runtime.call_tool(agent, id, &call.name, &call.args).await
                } else {
                    json!({"error": {"code": "unknown-tool", "message": format!("the host has no tool {} for this agent", call.name)}})
                };
                report.tool_results.push(result.clone());
                self.emit(runtime, report, session, "tool/result", json!({"turn": turn, "step": step, "message": {"role": "tool", "toolCallId": id, "content": [{"type": "text", "text": result.to_string()}]}, "error": result.get("error").is_some()}), false).await?;
            }
            self.emit(
                runtime,
                report,
                session,
                "step/end",
                json!({"turn": turn, "step": step}),
                false,
            )
            .await?;
            step += 1;
            self.emit(
                runtime,
                report,
                session,
                "step/start",
                json!({"turn": turn, "step": step}),
                false,
            )
            .await?;
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn request(
        &self,
        runtime: &Runtime,
        report: &mut TurnReport,
        agent: &AgentId,
        session: &SessionId,
        turn: u64,
        step: u64,
        user_seq: u64,
        mount: Option<&AgentMount>,
    ) -> Result<ModelRequest, HostError> {
        let mut system =
            String::from("You are a helpful assistant running in the host's agent loop.");
        if let Some(m) = mount {
            let mut sections = m.sections.clone();
            sections.sort_by_key(|s| s.order);
            for s in sections {
                if let Some(text) = runtime
                    .section_text(agent, &s.name)
                    .await
                    .map_err(|e| HostError(e.to_string()))?
                {
                    system.push_str("\n\n");
                    system.push_str(&text);
                }
            }
        }
        let mut messages = self.messages(session);
        let context_window = self.context_window.load(Ordering::SeqCst);
        let mut projection = None;
        if self.facts.agent_context_seam {
            let words: Vec<String> = messages
                .iter()
                .rfind(|m| m.role == "user")
                .map(|m| {
                    m.text
                        .to_lowercase()
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let nodes: Vec<SurfaceNode> = messages
                .iter()
                .map(|m| {
                    let lower = m.text.to_lowercase();
                    let hits = words.iter().filter(|w| lower.contains(w.as_str())).count();
                    SurfaceNode {
                        seq: m.seq,
                        role: match m.role {
                            "user" => NodeRole::User,
                            "tool" => NodeRole::Tool {
                                call_id: m.call_id.clone().unwrap_or_default(),
                            },
                            _ => NodeRole::Assistant {
                                tool_calls: m.tool_calls.clone(),
                            },
                        },
                        tokens: DefaultTokenEstimator.estimate(&m.text) + 4,
                        relevance: if words.is_empty() {
                            0.0
                        } else {
                            hits as f64 / words.len() as f64
                        },
                        importance: 0.5,
                        trusted: m.role != "tool",
                    }
                })
                .collect();
            // The current step's user message and this turn's unfinished tool units.
            let required: Vec<u64> = messages
                .iter()
                .filter(|m| m.seq >= user_seq)
                .map(|m| m.seq)
                .collect();
            let input = ProjectionInput {
                nodes,
                required,
                budget: Budget {
                    total: context_window,
                    kernel: DefaultTokenEstimator.estimate(&system),
                    reply: 1024,
                    recent_share: 0.6,
                },
                surface_generation: 0,
            };
            if let Some(p) = runtime
                .project_context(agent, &input)
                .await
                .map_err(|e| HostError(e.to_string()))?
            {
                self.emit(runtime, report, session, "request/projection", json!({"turn": turn, "step": step, "surfaceGeneration": 0, "include": p.include, "revision": p.revision.as_str()}), false).await?;
                messages.retain(|m| p.include.contains(&m.seq));
                projection = Some(p.include);
            }
        }
        Ok(ModelRequest {
            agent: agent.clone(),
            turn,
            step,
            system,
            tools: mount
                .map(|m| m.tools.iter().map(|t| t.name.clone()).collect())
                .unwrap_or_default(),
            messages,
            context_window,
            projection,
        })
    }
}

#[async_trait]
impl HostPort for FakeHost {
    fn facts(&self) -> HostFacts {
        self.facts.clone()
    }

    async fn mount(&self, agent: &AgentId, mount: &AgentMount) -> Result<(), HostError> {
        lock(&self.agents)
            .entry(agent.clone())
            .or_insert((Status::Idle, None))
            .1 = Some(mount.clone());
        Ok(())
    }

    async fn is_idle(&self, agent: &AgentId) -> Result<bool, HostError> {
        lock(&self.agents)
            .get(agent)
            .map(|a| a.0 == Status::Idle)
            .ok_or_else(|| HostError(format!("unknown agent {agent}")))
    }

    async fn append_event(
        &self,
        session: &SessionId,
        event: &TavernLogEvent,
    ) -> Result<HostEvent, HostError> {
        let logged = self.append(session, event.event_type(), event.data(), true)?;
        decode(&logged).map_err(HostError)
    }

    async fn read_events(
        &self,
        session: &SessionId,
        after: Option<u64>,
    ) -> Result<Vec<LoggedEvent>, HostError> {
        Ok(self
            .log(session)
            .iter()
            .filter(|e| after.is_none_or(|a| e["seq"].as_u64().is_some_and(|s| s > a)))
            .map(decode_logged)
            .collect())
    }
}
