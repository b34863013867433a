//! A second host, not DSH: a plain chat-completions loop over a scripted model, with its own
//! conversation log, its own agent naming and its own event shape. It implements
//! [`HostPort`] with no DSH type or JSON — what a harness author writes to move AgentTavern
//! into another loop. `tests/second_host.rs` runs the acceptance list on it.
//!
//! Its log is one JSON line per [`Entry`] in `<dir>/<conversation>.log`, numbered from 0
//! (the numbers are the seqs the runtime sees); reopening the folder is a restart. Agents are
//! named `agent-<conversation>`, so [`HostPort::session_of`] is this host's own rule. Every
//! logged entry is pushed to the runtime as it is written, unless delivery is switched off
//! (to play a host that logged and crashed before telling anyone).

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tavern_core::{AgentId, ContextMode, HostFacts, SessionId};
use tavern_projector::event::{EventKind, HostEvent, TurnEndReason, UserSource};
use tavern_runtime::{
    AgentMount, HostError, HostPort, LoggedEvent, MountDecision, Runtime, TavernLogEvent,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The prefix this host gives an agent's name: `agent-<conversation>`.
pub const AGENT_PREFIX: &str = "agent-";

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    /// The call's id.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments.
    pub arguments: Value,
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// The model answered.
    Stop,
    /// The model or a tool failed.
    Error,
}

/// One entry of this host's conversation log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// A turn begins.
    TurnBegan {
        /// Its number, from 1.
        turn: u64,
    },
    /// What the user typed.
    User {
        /// The text.
        content: String,
    },
    /// One model completion of a turn: text, tool calls, or both.
    Completion {
        /// The turn.
        turn: u64,
        /// Which completion of the turn, from 1.
        round: u64,
        /// Its text.
        content: String,
        /// The tools it asked for.
        calls: Vec<Call>,
    },
    /// A tool's output.
    ToolOutput {
        /// The turn.
        turn: u64,
        /// The completion that asked for it.
        round: u64,
        /// The call answered.
        call_id: String,
        /// The result as JSON.
        output: Value,
    },
    /// The turn is over.
    TurnFinished {
        /// The turn.
        turn: u64,
        /// How.
        finish: Finish,
    },
    /// Something a plugin asked the host to log (AgentTavern's greeting and mode changes).
    PluginNote {
        /// The note's type.
        name: String,
        /// Its payload.
        body: Value,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Logged {
    n: u64,
    at: i64,
    #[serde(flatten)]
    entry: Entry,
}

/// This host's own translation of its log into the runtime's events: the one place it meets
/// AgentTavern's vocabulary.
fn to_host_event(l: &Logged) -> HostEvent {
    let kind = match &l.entry {
        Entry::TurnBegan { turn } => EventKind::TurnStart { turn: *turn },
        Entry::User { content } => EventKind::UserMessage {
            source: UserSource::User,
            text: content.clone(),
        },
        Entry::Completion {
            turn,
            round,
            content,
            calls,
        } => EventKind::AssistantMessage {
            turn: *turn,
            step: *round,
            text: content.clone(),
            has_tool_calls: !calls.is_empty(),
            interrupted: false,
        },
        Entry::ToolOutput { .. } => EventKind::Known("tool-output".into()),
        Entry::TurnFinished { turn, finish } => EventKind::TurnEnd {
            turn: *turn,
            reason: match finish {
                Finish::Stop => TurnEndReason::Completed,
                Finish::Error => TurnEndReason::Other("error".into()),
            },
        },
        Entry::PluginNote { name, body } => {
            match body
                .get("to")
                .and_then(Value::as_str)
                .and_then(ContextMode::from_label)
            {
                Some(to) if name == tavern_core::ContextModeEvent::EVENT_TYPE => {
                    EventKind::ContextMode { to }
                }
                _ => EventKind::Known(name.clone()),
            }
        }
    };
    HostEvent {
        seq: l.n,
        time: l.at,
        kind,
    }
}

/// What the scripted model does in one completion.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Answer with text; the turn ends.
    Say(String),
    /// Ask for tools (`(name, arguments)`); the loop runs them and asks again.
    Use(Vec<(String, Value)>),
}

/// One completion request, recorded for assertions.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The conversation.
    pub conversation: String,
    /// The system prompt the host assembled from the mounted sections.
    pub system: String,
    /// The tools offered.
    pub tools: Vec<String>,
    /// `(role, content)` of every message sent, oldest first.
    pub messages: Vec<(String, String)>,
}

/// The chat-completions host.
pub struct ChatLoopHost {
    dir: PathBuf,
    facts: HostFacts,
    script: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Request>>,
    logs: Mutex<HashMap<SessionId, Vec<Logged>>>,
    mounts: Mutex<HashMap<AgentId, AgentMount>>,
    running: Mutex<HashMap<AgentId, bool>>,
    deliver: AtomicBool,
}

impl std::fmt::Debug for ChatLoopHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatLoopHost")
            .field("facts", &self.facts)
            .finish_non_exhaustive()
    }
}

impl Drop for ChatLoopHost {
    fn drop(&mut self) {
        let left = lock(&self.script).len();
        if left > 0 && !std::thread::panicking() {
            panic!("ChatLoopHost dropped with {left} unused scripted replies");
        }
    }
}

fn io_error(what: &str, e: &std::io::Error) -> HostError {
    HostError(format!("{what}: {}", e.kind()))
}

impl ChatLoopHost {
    /// Opens the host over `dir` (existing conversation logs are read back).
    ///
    /// # Errors
    /// [`HostError`] when the folder or a log cannot be read.
    pub fn open(dir: impl AsRef<Path>, facts: HostFacts) -> Result<Self, HostError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| io_error("log folder", &e))?;
        let mut logs = HashMap::new();
        for item in std::fs::read_dir(&dir).map_err(|e| io_error("log folder", &e))? {
            let path = item.map_err(|e| io_error("log folder", &e))?.path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".log"))
            else {
                continue;
            };
            let session = SessionId::parse(name).map_err(|e| HostError(e.to_string()))?;
            let text = std::fs::read_to_string(&path).map_err(|e| io_error(name, &e))?;
            let entries = text
                .lines()
                .map(serde_json::from_str::<Logged>)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| HostError(format!("log {name}: {e}")))?;
            logs.insert(session, entries);
        }
        Ok(Self {
            dir,
            facts,
            script: Mutex::default(),
            requests: Mutex::default(),
            logs: Mutex::new(logs),
            mounts: Mutex::default(),
            running: Mutex::default(),
            deliver: AtomicBool::new(true),
        })
    }

    /// The agent that runs a conversation.
    ///
    /// # Errors
    /// [`HostError`] when the name makes no agent id.
    pub fn agent(conversation: &str) -> Result<AgentId, HostError> {
        AgentId::parse(format!("{AGENT_PREFIX}{conversation}"))
            .map_err(|e| HostError(e.to_string()))
    }

    /// Queues the model's next replies.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.script).extend(replies);
    }

    /// Every completion request so far.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.requests).clone()
    }

    /// A conversation's log.
    pub fn log(&self, session: &SessionId) -> Vec<Entry> {
        lock(&self.logs)
            .get(session)
            .map(|l| l.iter().map(|e| e.entry.clone()).collect())
            .unwrap_or_default()
    }

    /// What is mounted on an agent.
    pub fn mount_of(&self, agent: &AgentId) -> Option<AgentMount> {
        lock(&self.mounts).get(agent).cloned()
    }

    /// Whether logged entries are pushed to the runtime (on by default). Off plays a host that
    /// logs and crashes before it tells anyone; a restart's resume must catch up.
    pub fn set_delivery(&self, on: bool) {
        self.deliver.store(on, Ordering::SeqCst);
    }

    /// Starts a conversation's agent: the runtime decides whether to mount AgentTavern.
    ///
    /// # Errors
    /// The runtime's error, as text.
    pub async fn start(
        &self,
        runtime: &Runtime,
        conversation: &str,
    ) -> Result<MountDecision, HostError> {
        let agent = Self::agent(conversation)?;
        lock(&self.running).insert(agent.clone(), false);
        runtime
            .agent_created(&agent)
            .await
            .map_err(|e| HostError(e.to_string()))
    }

    fn append(&self, session: &SessionId, entry: Entry) -> Result<Logged, HostError> {
        let mut logs = lock(&self.logs);
        let log = logs.entry(session.clone()).or_default();
        let n = log.len() as u64;
        let logged = Logged {
            n,
            at: 1_800_000_000_000 + i64::try_from(n).unwrap_or(0) * 1_000,
            entry,
        };
        let line = serde_json::to_string(&logged).map_err(|e| HostError(e.to_string()))?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{session}.log")))
            .map_err(|e| io_error("log", &e))?;
        writeln!(file, "{line}")
            .and_then(|()| file.sync_data())
            .map_err(|e| io_error("log", &e))?;
        log.push(logged.clone());
        Ok(logged)
    }

    /// Logs an entry and, when delivery is on, pushes it to the runtime. Projection errors are
    /// the runtime's to report; the turn goes on.
    async fn emit(
        &self,
        runtime: &Runtime,
        session: &SessionId,
        entry: Entry,
    ) -> Result<(), HostError> {
        let logged = self.append(session, entry)?;
        if self.deliver.load(Ordering::SeqCst) {
            let _ = runtime.on_event(session, &to_host_event(&logged)).await;
        }
        Ok(())
    }

    /// The messages the model sees: user text, completions, tool outputs and greetings.
    fn messages(&self, session: &SessionId) -> Vec<(String, String)> {
        self.log(session)
            .into_iter()
            .filter_map(|e| match e {
                Entry::User { content } => Some(("user".into(), content)),
                Entry::Completion { content, .. } => Some(("assistant".into(), content)),
                Entry::ToolOutput { output, .. } => Some(("tool".into(), output.to_string())),
                Entry::PluginNote { name, body } if name == TavernLogEvent::GREETING => {
                    Some(("assistant".into(), body["text"].as_str()?.to_owned()))
                }
                _ => None,
            })
            .collect()
    }

    /// Runs one turn of a conversation: the user's text, then completions until the model
    /// answers; every tool call goes through the runtime with this host's agent id.
    ///
    /// # Errors
    /// [`HostError`] when the log cannot be written, the script has no reply left, or the
    /// model asks for a tool that is not mounted (the turn is then finished as an error).
    pub async fn run_turn(
        &self,
        runtime: &Runtime,
        conversation: &str,
        text: &str,
    ) -> Result<String, HostError> {
        let agent = Self::agent(conversation)?;
        let session = self.session_of(&agent)?;
        let turn = 1 + self
            .log(&session)
            .iter()
            .filter(|e| matches!(e, Entry::TurnBegan { .. }))
            .count() as u64;
        lock(&self.running).insert(agent.clone(), true);
        let outcome = self.turn(runtime, &agent, &session, turn, text).await;
        let finish = if outcome.is_ok() {
            Finish::Stop
        } else {
            Finish::Error
        };
        let ended = self
            .emit(runtime, &session, Entry::TurnFinished { turn, finish })
            .await;
        lock(&self.running).insert(agent, false);
        let reply = outcome?;
        ended.map(|()| reply)
    }

    async fn turn(
        &self,
        runtime: &Runtime,
        agent: &AgentId,
        session: &SessionId,
        turn: u64,
        text: &str,
    ) -> Result<String, HostError> {
        self.emit(runtime, session, Entry::TurnBegan { turn })
            .await?;
        self.emit(
            runtime,
            session,
            Entry::User {
                content: text.into(),
            },
        )
        .await?;
        let mount = self.mount_of(agent);
        for round in 1.. {
            let mut sections = mount
                .as_ref()
                .map(|m| m.sections.clone())
                .unwrap_or_default();
            sections.sort_by_key(|s| s.order);
            let mut system = Vec::new();
            for s in &sections {
                if let Some(t) = runtime
                    .section_text(agent, &s.name)
                    .await
                    .map_err(|e| HostError(e.to_string()))?
                {
                    system.push(t);
                }
            }
            let tools: Vec<String> = mount
                .as_ref()
                .map(|m| m.tools.iter().map(|t| t.name.clone()).collect())
                .unwrap_or_default();
            lock(&self.requests).push(Request {
                conversation: session.to_string(),
                system: system.join("\n\n"),
                tools: tools.clone(),
                messages: self.messages(session),
            });
            let reply = lock(&self.script)
                .pop_front()
                .ok_or_else(|| HostError(format!("no scripted reply left for {session}")))?;
            match reply {
                Reply::Say(content) => {
                    self.emit(
                        runtime,
                        session,
                        Entry::Completion {
                            turn,
                            round,
                            content: content.clone(),
                            calls: Vec::new(),
                        },
                    )
                    .await?;
                    return Ok(content);
                }
                Reply::Use(wanted) => {
                    let calls: Vec<Call> = wanted
                        .into_iter()
                        .enumerate()
                        .map(|(i, (name, arguments))| Call {
                            id: format!("{session}-{turn}-{round}-{i}"),
                            name,
                            arguments,
                        })
                        .collect();
                    self.emit(
                        runtime,
                        session,
                        Entry::Completion {
                            turn,
                            round,
                            content: String::new(),
                            calls: calls.clone(),
                        },
                    )
                    .await?;
                    for call in calls {
                        if !tools.contains(&call.name) {
                            return Err(HostError(format!(
                                "the model called {}, which is not mounted",
                                call.name
                            )));
                        }
                        let output = runtime
                            .call_tool(agent, &call.id, &call.name, &call.arguments)
                            .await;
                        self.emit(
                            runtime,
                            session,
                            Entry::ToolOutput {
                                turn,
                                round,
                                call_id: call.id,
                                output,
                            },
                        )
                        .await?;
                    }
                }
            }
        }
        Err(HostError("the loop ended without a reply".into()))
    }
}

#[async_trait]
impl HostPort for ChatLoopHost {
    fn facts(&self) -> HostFacts {
        self.facts.clone()
    }

    fn session_of(&self, agent: &AgentId) -> Result<SessionId, HostError> {
        agent
            .as_str()
            .strip_prefix(AGENT_PREFIX)
            .and_then(|c| SessionId::parse(c).ok())
            .ok_or_else(|| HostError(format!("agent {agent} is not one of this host's")))
    }

    fn agent_of(&self, session: &SessionId) -> Result<AgentId, HostError> {
        Self::agent(session.as_str())
    }

    async fn mount(&self, agent: &AgentId, mount: &AgentMount) -> Result<(), HostError> {
        lock(&self.mounts).insert(agent.clone(), mount.clone());
        Ok(())
    }

    async fn is_idle(&self, agent: &AgentId) -> Result<bool, HostError> {
        lock(&self.running)
            .get(agent)
            .map(|running| !running)
            .ok_or_else(|| HostError(format!("unknown agent {agent}")))
    }

    async fn append_event(
        &self,
        session: &SessionId,
        event: &TavernLogEvent,
    ) -> Result<HostEvent, HostError> {
        let logged = self.append(
            session,
            Entry::PluginNote {
                name: event.event_type().into(),
                body: event.data(),
            },
        )?;
        Ok(to_host_event(&logged))
    }

    async fn read_events(
        &self,
        session: &SessionId,
        after: Option<u64>,
    ) -> Result<Vec<LoggedEvent>, HostError> {
        Ok(lock(&self.logs)
            .get(session)
            .map(|log| {
                log.iter()
                    .filter(|l| after.is_none_or(|a| l.n > a))
                    .map(|l| Ok(to_host_event(l)))
                    .collect()
            })
            .unwrap_or_default())
    }
}
