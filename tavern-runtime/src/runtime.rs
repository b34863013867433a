//! The AgentTavern runtime: wires the crates onto a [`HostPort`]. Agent created → resolve the
//! binding → mount kernel, persona and tools for agent-tavern sessions only; tool calls → the
//! tool registry with a context from the real agent id; events → the chat projector; turn end →
//! clear turn variables; mode switches at idle turn boundaries only, logged and persisted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{json, Value};
use tavern_core::chat::ChatDocument;
use tavern_core::{
    render_kernel, switch_context_mode, AgentId, AgentTavernCapabilities, BindingTarget,
    CharacterName, ChatId, ContextMode, IdentitySummary, KernelInput, MemorySource, ScopeKey,
    SessionBinding, SessionId, TavernArchitecture, TavernState, TurnState, VariableName,
    WritePolicy,
};
use tavern_projector::context::{project, Projection, ProjectionInput};
use tavern_projector::{lines, ChatProjector, EventKind, HostEvent, Outcome, ProjectorConfig};
use tavern_search::RankerRef;
use tavern_store::{AllStores, Clock, StateStoreExt, StateViewExt, StoreError, VariableChange};
use tavern_tools::assets::provider::AssetProvider;
use tavern_tools::{ToolContext, ToolLimits, ToolRegistry, ToolServices};

use crate::error::RuntimeError;
use crate::host::{
    AgentMount, HostPort, LoggedEvent, PromptSection, TavernLogEvent, ToolDefinition,
    UnreadableEvent,
};
use crate::speakers::ChatSpeakers;
use crate::tavern_mode::{TavernModePreset, PERSONA_SECTION};

/// The kernel's section name.
pub const KERNEL_SECTION: &str = "agent-tavern:kernel";
/// The preset mounted on agent-tavern agents.
pub const PRESET_ID: &str = "agent-tavern";

/// Runtime settings.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The user's display name.
    pub user_name: String,
    /// Tool limits.
    pub limits: ToolLimits,
    /// The tavern-mode preset (default persona prompt).
    pub tavern_mode: TavernModePreset,
    /// The ranker memory, history and lore searches go through (lexical by default): the one
    /// place another ranker plugs in.
    pub ranker: RankerRef,
    /// Save the projection checkpoint after every event, silent ones included (see
    /// [`tavern_projector::ProjectorConfig::checkpoint_every_event`]); off by default, on to
    /// measure the old behaviour.
    pub checkpoint_every_event: bool,
    /// The user's offset from UTC, for SillyTavern's time macros (UTC by default; a program
    /// passes the system's zone).
    pub zone: Arc<dyn tavern_core::UtcOffsets>,
    /// The architecture of the sessions this runtime binds, instead of the store's default
    /// for new sessions (`None`: the store's). A host that can run only one of them (an MCP
    /// server has no SillyTavern pipeline) names it, so a store whose default is `st` does not
    /// bind its sessions to a pipeline it cannot run. Group chats are `st` regardless.
    pub new_sessions: Option<TavernArchitecture>,
    /// Whether a new chat must find its card (a group chat its group) among the assets: a
    /// host whose assets are a real folder turns it on, so a mistyped character is refused by
    /// name instead of starting, for good, a chat with no card, greeting or description. A
    /// chat that already exists is continued either way (its card may be gone). Off by
    /// default: assets held in memory may be filled later.
    pub require_cards: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            user_name: "User".into(),
            limits: ToolLimits::default(),
            tavern_mode: TavernModePreset::default(),
            ranker: RankerRef::default(),
            checkpoint_every_event: false,
            zone: Arc::new(tavern_core::FixedOffset(0)),
            new_sessions: None,
            require_cards: false,
        }
    }
}

/// Actions only the SillyTavern pipeline has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StAction {
    /// `/generate`.
    Generate,
    /// Regenerate the last reply.
    Regenerate,
    /// Swipe to another reply.
    Swipe,
}

/// What happened when an agent was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountDecision {
    /// AgentTavern was mounted (preset, kernel, persona, tools).
    Mounted,
    /// Nothing was mounted: a plain host session or an `st` session.
    Untouched,
}

/// The AgentTavern runtime on one host.
pub struct Runtime {
    host: Arc<dyn HostPort>,
    stores: Arc<dyn AllStores>,
    assets: Arc<dyn AssetProvider>,
    registry: ToolRegistry,
    projector: ChatProjector,
    speakers: Arc<ChatSpeakers>,
    clock: Arc<dyn Clock>,
    config: RuntimeConfig,
    /// The turn in progress per session (dropped at turn end and disposal, so it stays as
    /// small as the number of sessions mid-turn).
    turns: Mutex<HashMap<SessionId, u64>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A runtime over a host, stores and assets.
    pub fn new(
        host: Arc<dyn HostPort>,
        stores: Arc<dyn AllStores>,
        assets: Arc<dyn AssetProvider>,
        clock: Arc<dyn Clock>,
        config: RuntimeConfig,
    ) -> Self {
        let services = ToolServices {
            memory: stores.clone(),
            variables: stores.clone(),
            chats: stores.clone(),
            assets: assets.clone(),
            history: Default::default(),
            ranker: config.ranker.clone(),
            zone: config.zone.clone(),
        };
        let speakers = Arc::new(ChatSpeakers {
            stores: stores.clone(),
            assets: assets.clone(),
            user_name: config.user_name.clone(),
        });
        let projector = ChatProjector::new(
            stores.clone(),
            stores.clone(),
            clock.clone(),
            ProjectorConfig {
                user_name: config.user_name.clone(),
                checkpoint_every_event: config.checkpoint_every_event,
            },
        )
        .with_speaker_names(speakers.clone());
        Self {
            registry: ToolRegistry::new(services, config.limits),
            host,
            stores,
            assets,
            projector,
            speakers,
            clock,
            config,
            turns: Mutex::default(),
        }
    }

    /// The session an agent runs, as the host says.
    ///
    /// # Errors
    /// [`RuntimeError::Host`] when the agent names no session.
    pub fn session_of(&self, agent: &AgentId) -> Result<SessionId, RuntimeError> {
        Ok(self.host.session_of(agent)?)
    }

    /// Forgets per-agent bookkeeping when the host disposes of an agent (its turn and its
    /// per-turn tool counters); nothing durable changes.
    pub fn agent_disposed(&self, agent: &AgentId) {
        if let Ok(session) = self.session_of(agent) {
            self.end_turn(&session);
        }
    }

    /// How many sessions hold in-memory turn bookkeeping (bounded-memory checks).
    pub fn tracked_sessions(&self) -> usize {
        self.turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
            .max(self.registry.tracked_sessions())
    }

    fn end_turn(&self, session: &SessionId) {
        self.turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(session);
        self.registry.end_turn(session);
    }

    /// The agent that runs a session on this host (the host's rule).
    ///
    /// # Errors
    /// [`RuntimeError::Host`] when the session names no agent.
    pub fn agent_of(&self, session: &SessionId) -> Result<AgentId, RuntimeError> {
        Ok(self.host.agent_of(session)?)
    }

    /// AgentTavern's capabilities on this host.
    pub fn capabilities(&self) -> AgentTavernCapabilities {
        AgentTavernCapabilities::from_host(&self.host.facts())
    }

    /// The persisted state.
    ///
    /// # Errors
    /// Store failures.
    pub async fn state(&self) -> Result<TavernState, RuntimeError> {
        Ok(self.stores.load_state().await?.0)
    }

    async fn binding(&self, session: &SessionId) -> Result<Option<SessionBinding>, RuntimeError> {
        Ok(self.stores.binding(session).await?)
    }

    fn is_agent_tavern(b: &SessionBinding) -> bool {
        b.architecture() == TavernArchitecture::AgentTavern && !b.target().group
    }

    /// Binds a session to a chat that already exists — a SillyTavern chat the user continues
    /// from this host — with the defaults for new sessions. Nothing is written: the chat's
    /// lines, header and persona lock stay as they are, and the session's messages are
    /// appended after them. Several sessions may continue one chat; their lines interleave
    /// in the order they are projected, each exactly once.
    ///
    /// # Errors
    /// [`RuntimeError::NoSuchChat`] (with the nearest chat ids) when the chat does not exist;
    /// a session that is already bound is a conflict; store failures.
    pub async fn bind_existing_chat(
        &self,
        session: &SessionId,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<SessionBinding, RuntimeError> {
        if self.stores.chat_revision(character, chat).await?.is_none() {
            let chats = self.stores.list_chats(character).await?;
            return Err(RuntimeError::NoSuchChat {
                character: character.to_string(),
                chat: chat.to_string(),
                nearest: nearest_chats(chat.as_str(), &chats),
            });
        }
        let target = BindingTarget {
            character: character.clone(),
            chat_id: chat.clone(),
            group: false,
        };
        self.bind_unbound(session, target).await
    }

    /// Records a new binding for a session that has none; a bound session is a conflict.
    async fn bind_unbound(
        &self,
        session: &SessionId,
        target: BindingTarget,
    ) -> Result<SessionBinding, RuntimeError> {
        self.stores
            .update(|state: &mut TavernState| {
                if state.binding(session).is_some() {
                    return Err(RuntimeError::Conflict {
                        session: session.to_string(),
                        reason: "the session is already bound".into(),
                    });
                }
                let b = match self.config.new_sessions {
                    Some(architecture) => SessionBinding::with_architecture(
                        target.clone(),
                        architecture,
                        state.default_context_mode,
                    ),
                    None => SessionBinding::new_for_chat(target.clone(), state),
                };
                state.set_binding(session.clone(), b.clone());
                Ok(b)
            })
            .await
    }

    /// Binds a new chat to a session with the defaults for new sessions (group chats: `st`)
    /// and, for agent-tavern, records the card's greeting in the chat and the host log without
    /// counting it as a model turn.
    ///
    /// # Errors
    /// Store or host failures; a session that is already bound is a conflict.
    pub async fn new_chat(
        &self,
        session: &SessionId,
        character: &CharacterName,
        chat: &ChatId,
        group: bool,
    ) -> Result<SessionBinding, RuntimeError> {
        // A session bound already is refused as such below, whatever it names.
        if self.config.require_cards
            && self.state().await?.binding(session).is_none()
            && self.stores.chat_revision(character, chat).await?.is_none()
        {
            self.check_card(character, group).await?;
        }
        let target = BindingTarget {
            character: character.clone(),
            chat_id: chat.clone(),
            group,
        };
        let binding = self.bind_unbound(session, target).await?;
        if Self::is_agent_tavern(&binding) {
            let now = self.clock.now();
            let persona = self.speakers.persona(&binding).await;
            let greeting = match self.assets.card(character).await {
                Ok(Some(card)) => match card.field("first_mes").filter(|g| !g.trim().is_empty()) {
                    // Written substituted, as SillyTavern saves a greeting.
                    Some(text) => {
                        let mut macros =
                            card.macros(&persona, chat.as_str(), now, now.0.unsigned_abs());
                        macros.utc_offset_minutes = self.config.zone.minutes_at(now);
                        Some(tavern_core::macros::substitute(text, &macros))
                    }
                    None => None,
                },
                _ => None,
            };
            let mut lines = vec![lines::header(&persona.name, character, now)];
            if let Some(text) = &greeting {
                let name = self.speakers.character_name(&binding).await;
                lines.push(lines::greeting(session, &name, text, now));
            }
            if self.stores.chat_revision(character, chat).await?.is_none() {
                self.stores
                    .rewrite_chat(character, chat, &lines, None)
                    .await?;
            }
            if let Some(text) = &greeting {
                // Hosts that cannot append logged events (DSH rc.6) still get the greeting in
                // the chat; only the model's view of it depends on the host.
                let logged = self
                    .host
                    .append_event(session, &TavernLogEvent::Greeting { text: text.clone() })
                    .await;
                if let Ok(event) = logged {
                    self.on_event(session, &event).await?;
                }
            }
        }
        Ok(binding)
    }

    /// Whether the assets hold the card of `character` (a group of that name for a group
    /// chat), for [`RuntimeConfig::require_cards`]. A card wins over a group of the same name.
    async fn check_card(&self, character: &CharacterName, group: bool) -> Result<(), RuntimeError> {
        let name = character.as_str();
        let reason = if group {
            match self.assets.group(name).await {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => "no group of that name among the assets".to_owned(),
                Err(e) => e.to_string(),
            }
        } else {
            match self.assets.card(character).await {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if matches!(self.assets.group(name).await, Ok(Some(_))) => {
                    "it is a group: start it as a group chat".to_owned()
                }
                Ok(None) => format!(
                    "no card of that name among the assets (characters/{name}.png or .json: \
                     the card's file name, not the name it shows)"
                ),
                Err(e) => e.to_string(),
            }
        };
        Err(RuntimeError::NoCard {
            character: name.to_owned(),
            reason,
        })
    }

    /// Called by the host when an agent is created, before it is published: mounts the
    /// AgentTavern preset for agent-tavern sessions only, after reconciling the binding's mode
    /// with the last `agent-tavern/context-mode` event in the log (the log wins).
    ///
    /// # Errors
    /// Store or host failures.
    pub async fn agent_created(&self, agent: &AgentId) -> Result<MountDecision, RuntimeError> {
        let session = self.session_of(agent)?;
        let Some(binding) = self.binding(&session).await? else {
            return Ok(MountDecision::Untouched);
        };
        if !Self::is_agent_tavern(&binding) {
            return Ok(MountDecision::Untouched);
        }
        // One read of the log serves both the mode reconciliation and the catch-up below.
        let log = self.host.read_events(&session, None).await?;
        self.reconcile_mode(&session, &binding, &log).await?;
        let mount = AgentMount {
            preset: PRESET_ID.into(),
            sections: Self::sections(),
            tools: self.tool_definitions(),
        };
        self.host.mount(agent, &mount).await?;
        // Events the host logged before the session was bound (DSH logs its policies at
        // session creation) were not projected yet: catch up from the log. A failure here
        // leaves the projection pending and visible; it must not stop the agent.
        let _ = self.resume_from(&session, Some(log)).await;
        Ok(MountDecision::Mounted)
    }

    /// The prompt sections AgentTavern fills: the persona (order 0) and the kernel (order 50).
    pub fn sections() -> Vec<PromptSection> {
        vec![
            PromptSection {
                name: PERSONA_SECTION.into(),
                order: 0,
            },
            PromptSection {
                name: KERNEL_SECTION.into(),
                order: 50,
            },
        ]
    }

    /// Every tool as the host registers it.
    pub fn tool_definitions(&self) -> Vec<ToolDefinition> {
        self.registry
            .specs()
            .iter()
            .map(|s| ToolDefinition {
                name: s.name.into(),
                description: s.description.into(),
                parameters: s.parameters.clone(),
                output_schema: s.result.clone(),
                timeout_ms: self.config.limits.timeout_ms,
                writes: s.writes,
                destructive: s.destructive,
                idempotent: s.idempotent,
            })
            .collect()
    }

    async fn reconcile_mode(
        &self,
        session: &SessionId,
        binding: &SessionBinding,
        log: &[LoggedEvent],
    ) -> Result<(), RuntimeError> {
        let last = log.iter().rev().find_map(|e| match e {
            Ok(HostEvent {
                kind: EventKind::ContextMode { to },
                ..
            }) => Some(*to),
            _ => None,
        });
        if let Some(mode) = last.filter(|m| Some(*m) != binding.context_mode()) {
            let fixed = SessionBinding::AgentTavern {
                target: binding.target().clone(),
                context_mode: mode,
            };
            self.stores
                .update(|state: &mut TavernState| {
                    state.set_binding(session.clone(), fixed.clone());
                    Ok::<_, StoreError>(())
                })
                .await?;
        }
        Ok(())
    }

    /// The text of one mounted prompt section, evaluated on every request: the kernel, or the
    /// persona (the session's custom prompt or the preset default, braces kept literally).
    /// `None` for sessions AgentTavern did not mount and for unknown sections.
    ///
    /// # Errors
    /// Store failures.
    pub async fn section_text(
        &self,
        agent: &AgentId,
        section: &str,
    ) -> Result<Option<String>, RuntimeError> {
        let session = self.session_of(agent)?;
        // A look at the state, not a copy of it: hosts ask on every request.
        let found = self
            .stores
            .read_state(|state| {
                state
                    .binding(&session)
                    .filter(|b| Self::is_agent_tavern(b))
                    .cloned()
                    .map(|b| (b, WritePolicy::from_state(state)))
            })
            .await?;
        let Some((binding, policy)) = found else {
            return Ok(None);
        };
        match section {
            PERSONA_SECTION => Ok(Some(
                self.config
                    .tavern_mode
                    .persona_text(&*self.stores, &session)
                    .await,
            )),
            KERNEL_SECTION => {
                let character = binding.target().character.clone();
                let card = self.assets.card(&character).await.ok().flatten();
                let identity = card.as_ref().map_or_else(
                    || IdentitySummary::from_card(&json!({"name": character.as_str()})),
                    |c| IdentitySummary::from_card(c.raw()),
                );
                // The chat's persona (its lock, else the user's default), as SillyTavern
                // picks it; the configured user name when there is none.
                let persona = self.speakers.persona(&binding).await;
                let input = KernelInput {
                    character,
                    identity,
                    user_name: persona.name,
                    persona_summary: Some(persona.description).filter(|d| !d.trim().is_empty()),
                    session,
                    binding,
                    tools: self
                        .registry
                        .specs()
                        .iter()
                        .map(|s| s.name.to_owned())
                        .collect(),
                    policy,
                };
                Ok(Some(render_kernel(&input)))
            }
            _ => Ok(None),
        }
    }

    /// Runs a tool call for an agent. Identity comes only from `agent` (the host's real agent
    /// id); the result is the tool's JSON or `{"error": …}` for the model.
    pub async fn call_tool(
        &self,
        agent: &AgentId,
        call_id: &str,
        name: &str,
        args: &Value,
    ) -> Value {
        let session = match self.session_of(agent) {
            Ok(s) => s,
            Err(e) => return json!({"error": {"code": "unavailable", "message": e.to_string()}}),
        };
        let turn = self
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&session)
            .copied()
            .unwrap_or(0);
        self.call_tool_in_turn(agent, call_id, name, args, turn)
            .await
    }

    /// Runs a read-only tool call for an operator (the management API's lore tester) in the
    /// session's current turn without spending the model's per-turn calls; a writing tool is
    /// refused.
    pub async fn call_tool_for_operator(
        &self,
        agent: &AgentId,
        call_id: &str,
        name: &str,
        args: &Value,
    ) -> Value {
        if self.registry.writes(name) != Some(false) {
            let message = format!("{name} is not a read-only tool");
            return json!({"error": {"code": "invalid-arguments", "message": message}});
        }
        let ctx = match self.context_of(agent, call_id, 0).await {
            Ok(ctx) => ctx,
            Err(e) => return e,
        };
        match self.registry.call_unmetered(&ctx, name, args).await {
            Ok(v) => v,
            Err(e) => e.to_json(),
        }
    }

    /// Runs a tool call as part of `turn` (hosts without turns, such as MCP, give each call its
    /// own, so per-turn limits are per call there).
    pub async fn call_tool_in_turn(
        &self,
        agent: &AgentId,
        call_id: &str,
        name: &str,
        args: &Value,
        turn: u64,
    ) -> Value {
        let ctx = match self.context_of(agent, call_id, turn).await {
            Ok(ctx) => ctx,
            Err(e) => return e,
        };
        match self.registry.call(&ctx, name, args).await {
            Ok(v) => v,
            Err(e) => e.to_json(),
        }
    }

    /// The context a tool call of `agent` runs in, or the error to answer with.
    async fn context_of(
        &self,
        agent: &AgentId,
        call_id: &str,
        turn: u64,
    ) -> Result<ToolContext, Value> {
        let session = self
            .session_of(agent)
            .map_err(|e| json!({"error": {"code": "unavailable", "message": e.to_string()}}))?;
        let (limits, now) = (self.config.limits, self.clock.now());
        // A look at the state, not a copy: hosts with thousands of sessions call per request.
        let ctx = self
            .stores
            .read_state(|state| {
                ToolContext::for_session(agent, &session, state, turn, call_id, limits, now)
            })
            .await;
        match ctx {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(e.to_json()),
            Err(e) => Err(
                json!({"error": {"code": "unavailable", "message": format!("state unavailable: {e}")}}),
            ),
        }
    }

    /// Feeds one host event (the host calls this for every appended event, in order). For
    /// agent-tavern sessions: tracks the turn, clears turn variables at `turn/end`, and projects
    /// the chat. Other sessions are ignored. A projection error is returned for the host to
    /// log; the turn itself is never affected.
    ///
    /// # Errors
    /// [`RuntimeError::Projection`] (the checkpoint is pending; [`Self::resume`] replays).
    pub async fn on_event(
        &self,
        session: &SessionId,
        event: &HostEvent,
    ) -> Result<Option<Outcome>, RuntimeError> {
        let Some(binding) = self.binding(session).await?.filter(Self::is_agent_tavern) else {
            return Ok(None);
        };
        match event.kind {
            EventKind::TurnStart { turn } => {
                let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
                // A repeated or late start of an earlier turn changes nothing.
                if turns.get(session).is_none_or(|current| turn >= *current) {
                    turns.insert(session.clone(), turn);
                }
            }
            EventKind::TurnEnd { turn, .. } => {
                // Only the end of the turn in progress (or of one we never saw start, after a
                // restart) clears turn variables: a repeated end of an earlier turn must not
                // wipe the next turn's.
                let current = self
                    .turns
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(session)
                    .copied();
                if current.is_none_or(|c| c == turn) {
                    let agent = self.host.agent_of(session)?;
                    self.end_turn(session);
                    self.stores
                        .clear_scope(&ScopeKey::Turn { agent }, MemorySource::system())
                        .await?;
                }
            }
            _ => {}
        }
        Ok(Some(
            self.projector
                .on_event(session, &binding, event.clone())
                .await?,
        ))
    }

    /// Feeds an entry of the session log the host could not decode: for agent-tavern sessions
    /// the projection stops there, visible in its status and replayable from the host's log,
    /// never skipped.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidEvent`] naming the reason (after recording it), or store
    /// failures.
    pub async fn on_unreadable_event(
        &self,
        session: &SessionId,
        unreadable: &UnreadableEvent,
    ) -> Result<(), RuntimeError> {
        if self
            .binding(session)
            .await?
            .filter(Self::is_agent_tavern)
            .is_none()
        {
            return Ok(());
        }
        self.projector
            .report_unreadable(session, &unreadable.reason)
            .await?;
        Err(RuntimeError::InvalidEvent {
            session: session.to_string(),
            reason: unreadable.reason.clone(),
        })
    }

    /// Feeds one entry as a host read it: [`Self::on_event`] or [`Self::on_unreadable_event`].
    ///
    /// # Errors
    /// As those two.
    pub async fn on_logged_event(
        &self,
        session: &SessionId,
        logged: &LoggedEvent,
    ) -> Result<Option<Outcome>, RuntimeError> {
        match logged {
            Ok(event) => self.on_event(session, event).await,
            Err(unreadable) => self
                .on_unreadable_event(session, unreadable)
                .await
                .map(|()| None),
        }
    }

    /// Replays the host log into the projector (after a restart, or to fill a pending gap).
    ///
    /// # Errors
    /// Host, store or projection failures.
    pub async fn resume(&self, session: &SessionId) -> Result<Option<Outcome>, RuntimeError> {
        self.resume_from(session, None).await
    }

    /// [`Self::resume`] over `log` (the whole log, already read) or, when `None`, what the
    /// host reads after the projection's cursor.
    async fn resume_from(
        &self,
        session: &SessionId,
        log: Option<Vec<LoggedEvent>>,
    ) -> Result<Option<Outcome>, RuntimeError> {
        let Some(binding) = self.binding(session).await?.filter(Self::is_agent_tavern) else {
            return Ok(None);
        };
        // What is decided, saved or not, needs no second reading.
        let after = self.projector.cursor(session).await?;
        let logged = match log {
            Some(all) => all
                .into_iter()
                .filter(|entry| {
                    let seq = match entry {
                        Ok(e) => Some(e.seq),
                        Err(u) => u.seq,
                    };
                    after.is_none_or(|a| seq.is_some_and(|s| s > a))
                })
                .collect(),
            None => self.host.read_events(session, after).await?,
        };
        let mut events: Vec<HostEvent> = Vec::with_capacity(logged.len());
        let mut unreadable = None;
        for entry in logged {
            match entry {
                Ok(e) => events.push(e),
                Err(u) => {
                    unreadable.get_or_insert(u.reason);
                }
            }
        }
        if let Some(turn) = events.iter().rev().find_map(|e| match e.kind {
            EventKind::TurnStart { turn } => Some(turn),
            _ => None,
        }) {
            self.turns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(session.clone(), turn);
        }
        let outcome = self.projector.replay(session, &binding, events).await?;
        if let Some(reason) = unreadable {
            // The log itself holds an event we cannot read: projection stops at its gap, and
            // says so.
            self.projector.report_unreadable(session, &reason).await?;
        }
        Ok(Some(outcome))
    }

    /// Switches a session's context mode: agent-tavern only, idle only, available modes only.
    /// The `agent-tavern/context-mode` event is logged first (the log is the source of truth),
    /// then the binding is saved; should the save fail, the next [`Self::agent_created`]
    /// reconciles the binding from the log.
    ///
    /// # Errors
    /// [`RuntimeError::Core`] naming the rule that refused; host or store failures.
    pub async fn switch_mode(
        &self,
        session: &SessionId,
        to: ContextMode,
    ) -> Result<SessionBinding, RuntimeError> {
        let binding = self
            .binding(session)
            .await?
            .ok_or_else(|| RuntimeError::NotBound(session.to_string()))?;
        let agent = self.host.agent_of(session)?;
        let idle = if self.host.is_idle(&agent).await? {
            TurnState::Idle
        } else {
            TurnState::Running
        };
        let (next, event) = switch_context_mode(
            session,
            &binding,
            to,
            idle,
            &self.capabilities(),
            self.clock.now(),
        )?;
        let logged = self
            .host
            .append_event(session, &TavernLogEvent::ContextMode(event))
            .await?;
        self.stores
            .update(|state: &mut TavernState| {
                state.set_binding(session.clone(), next.clone());
                Ok::<_, StoreError>(())
            })
            .await?;
        self.on_event(session, &logged).await?;
        Ok(next)
    }

    /// Refuses SillyTavern-only actions (generate, regenerate, swipe) for agent-tavern sessions
    /// with a conflict; `st` sessions may proceed in their own pipeline.
    ///
    /// # Errors
    /// [`RuntimeError::Conflict`] for agent-tavern sessions, [`RuntimeError::NotBound`].
    pub async fn check_st_action(
        &self,
        session: &SessionId,
        action: StAction,
    ) -> Result<(), RuntimeError> {
        let binding = self
            .binding(session)
            .await?
            .ok_or_else(|| RuntimeError::NotBound(session.to_string()))?;
        if binding.architecture() == TavernArchitecture::AgentTavern {
            return Err(RuntimeError::Conflict {
                session: session.to_string(),
                reason: format!("{action:?} belongs to the st pipeline; agent-tavern sessions run in the host loop (fork the chat into st to use it)").to_lowercase(),
            });
        }
        Ok(())
    }

    /// Forks a session's chat into a new session of the given architecture: the messages are
    /// copied into a new chat whose header links back to the origin (`chat_metadata.main_chat`);
    /// a headerless (older group) chat gets SillyTavern's group header for that link.
    ///
    /// SillyTavern variables cross architectures with the fork, and only with it: forking an
    /// `st` chat into agent-tavern imports its `chat_metadata.variables` as the new chat's
    /// chat-scope variables (names that are not variable names, and oversized values, stay in
    /// the new header's metadata); forking an agent-tavern chat into `st` writes the origin's
    /// chat-scope variables into the new chat's `chat_metadata.variables` in SillyTavern's shape
    /// ([`tavern_core::chat::to_st_variable_value`]).
    ///
    /// # Errors
    /// Store failures; a missing origin chat is [`RuntimeError::NotBound`].
    pub async fn fork(
        &self,
        origin: &SessionId,
        new_session: &SessionId,
        new_chat: &ChatId,
        architecture: TavernArchitecture,
    ) -> Result<SessionBinding, RuntimeError> {
        let from = self
            .binding(origin)
            .await?
            .ok_or_else(|| RuntimeError::NotBound(origin.to_string()))?;
        let target = from.target();
        let file = self
            .stores
            .read_chat(&target.character, &target.chat_id)
            .await?
            .ok_or_else(|| RuntimeError::NotBound(origin.to_string()))?;
        let doc = ChatDocument::from_lines(file.lines)?;
        let mut meta = doc.metadata().cloned().unwrap_or_default();
        let new_target = BindingTarget {
            character: target.character.clone(),
            chat_id: new_chat.clone(),
            group: target.group,
        };
        let new_scope = ScopeKey::Chat {
            character: new_target.character.clone(),
            chat: new_chat.clone(),
        };
        let into_agent_tavern = from.architecture() == TavernArchitecture::St
            && architecture == TavernArchitecture::AgentTavern
            && !target.group;
        let into_st = Self::is_agent_tavern(&from) && architecture == TavernArchitecture::St;
        let mut imports = Vec::new();
        if into_agent_tavern {
            if let Some(vars) = meta.get("variables").and_then(Value::as_object) {
                let split = tavern_core::chat::split_st_variables(vars);
                imports = split.importable;
                meta.insert("variables".into(), Value::Object(split.kept));
            }
        } else if into_st {
            let origin_scope = ScopeKey::Chat {
                character: target.character.clone(),
                chat: target.chat_id.clone(),
            };
            let mut vars = meta
                .get("variables")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let listing = self.stores.list(&origin_scope, "", usize::MAX).await?;
            let mut names: Vec<VariableName> = listing.items.into_iter().map(|i| i.name).collect();
            if listing.truncated {
                // Listings are capped; the audit trail names every variable ever written.
                names = self
                    .stores
                    .variable_audit(&origin_scope)
                    .await?
                    .into_iter()
                    .filter_map(|a| VariableName::parse(a.target).ok())
                    .collect();
                names.sort();
                names.dedup();
            }
            for name in names {
                if let Some(rec) = self.stores.get(&origin_scope, &name).await? {
                    vars.insert(
                        rec.name.to_string(),
                        tavern_core::chat::to_st_variable_value(&rec.value),
                    );
                }
            }
            if !vars.is_empty() {
                meta.insert("variables".into(), Value::Object(vars));
            }
        }
        let mut lines = vec![lines::fork_header(
            doc.header.as_ref(),
            &target.chat_id,
            meta,
        )];
        lines.extend(doc.messages);
        self.stores
            .rewrite_chat(&target.character, new_chat, &lines, None)
            .await?;
        if !imports.is_empty() {
            let mut changes = Vec::with_capacity(imports.len());
            for (name, value) in imports {
                let expected = self
                    .stores
                    .get(&new_scope, &name)
                    .await?
                    .map(|r| r.revision);
                changes.push(VariableChange::Set {
                    name,
                    value,
                    expected,
                });
            }
            // One patch per chunk: a patch has a size limit, a chat's variables do not.
            for chunk in changes.chunks(32) {
                self.stores
                    .patch(&new_scope, chunk, None, MemorySource::system())
                    .await?;
            }
        }
        self.stores
            .update(|state: &mut TavernState| {
                // Checked where the binding is written: two forks racing for one new session
                // id get one binding and one conflict, never a silent replacement.
                if state.binding(new_session).is_some() {
                    return Err(RuntimeError::Conflict {
                        session: new_session.to_string(),
                        reason: "the session is already bound".into(),
                    });
                }
                let b = SessionBinding::with_architecture(
                    new_target.clone(),
                    architecture,
                    state.default_context_mode,
                );
                state.set_binding(new_session.clone(), b.clone());
                Ok(b)
            })
            .await
    }

    /// The context projection for an agent-managed request, or `None` when the session is
    /// `dsh-native` (which registers no projection) or not AgentTavern's.
    ///
    /// # Errors
    /// Store failures.
    pub async fn project_context(
        &self,
        agent: &AgentId,
        input: &ProjectionInput,
    ) -> Result<Option<Projection>, RuntimeError> {
        let session = self.session_of(agent)?;
        let managed = self
            .binding(&session)
            .await?
            .filter(Self::is_agent_tavern)
            .is_some_and(|b| b.context_mode() == Some(ContextMode::AgentManaged));
        Ok(managed.then(|| project(input)))
    }

    /// Sessions whose projection is pending.
    ///
    /// # Errors
    /// Store failures.
    pub async fn pending_projections(
        &self,
    ) -> Result<Vec<tavern_store::ProjectorCheckpoint>, RuntimeError> {
        Ok(self.projector.pending().await?)
    }

    /// A session's projection checkpoint, counting what is projected but not saved yet;
    /// `None` before its first projected event.
    ///
    /// # Errors
    /// Store failures.
    pub async fn projection(
        &self,
        session: &SessionId,
    ) -> Result<Option<tavern_store::ProjectorCheckpoint>, RuntimeError> {
        Ok(self.projector.checkpoint(session).await?)
    }

    /// Answers the tavern-mode route `POST /tavern-mode/system-prompt` over this runtime's
    /// prompt store and preset (see [`crate::tavern_mode::handle_route`]).
    pub async fn tavern_mode_route(
        &self,
        req: crate::tavern_mode::RouteRequest<'_>,
    ) -> crate::tavern_mode::RouteResponse {
        crate::tavern_mode::handle_route(req, &*self.stores, &self.config.tavern_mode).await
    }

    /// The stores this runtime uses.
    pub fn stores(&self) -> &Arc<dyn AllStores> {
        &self.stores
    }

    /// The settings this runtime was built with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// The clock this runtime reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }
}

/// The three chat ids nearest to `wanted` (case-insensitive edit distance), for an error
/// message. Chat ids are at most a few hundred bytes, so this is bounded by the chat count.
fn nearest_chats(wanted: &str, chats: &[ChatId]) -> Vec<String> {
    let wanted = wanted.to_lowercase();
    let mut scored: Vec<(usize, &str)> = chats
        .iter()
        .map(|c| {
            (
                strsim::levenshtein(&wanted, &c.as_str().to_lowercase()),
                c.as_str(),
            )
        })
        .collect();
    scored.sort();
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_owned())
        .collect()
}
