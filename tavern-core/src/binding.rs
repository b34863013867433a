//! Session bindings: which architecture and context mode a host session runs, and the state
//! that holds them together with the defaults for new sessions.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ids::{CharacterName, ChatId, SessionId};
use crate::record::MemorySource;
use crate::time::Timestamp;

/// Which generation architecture a session uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TavernArchitecture {
    /// The host's own agent loop with AgentTavern tools, kernel and projections.
    AgentTavern,
    /// The legacy SillyTavern pipeline; AgentTavern mounts nothing.
    St,
}

impl TavernArchitecture {
    /// The persisted label (`agent-tavern` / `st`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentTavern => "agent-tavern",
            Self::St => "st",
        }
    }

    /// Parses a persisted label; anything else is `None`.
    pub fn from_label(label: &str) -> Option<Self> {
        match label {
            "agent-tavern" => Some(Self::AgentTavern),
            "st" => Some(Self::St),
            _ => None,
        }
    }
}

impl fmt::Display for TavernArchitecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an AgentTavern session's request history is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContextMode {
    /// The host's own surface decides; AgentTavern projects nothing and compacts nothing.
    DshNative,
    /// AgentTavern selects history nodes per request through the host's `agent/context` seam.
    AgentManaged,
}

impl ContextMode {
    /// The persisted label (`dsh-native` / `agent-managed`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DshNative => "dsh-native",
            Self::AgentManaged => "agent-managed",
        }
    }

    /// Parses a persisted label; anything else is `None`.
    pub fn from_label(label: &str) -> Option<Self> {
        match label {
            "dsh-native" => Some(Self::DshNative),
            "agent-managed" => Some(Self::AgentManaged),
            _ => None,
        }
    }
}

impl fmt::Display for ContextMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a session is about: one character's chat, or a group chat.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BindingTarget {
    /// The character (card) name; for a group, the group's name.
    pub character: CharacterName,
    /// The chat file name (without `.jsonl`).
    pub chat_id: ChatId,
    /// Whether this is a group chat (always `st`).
    pub group: bool,
}

/// A session's binding. Only the AgentTavern variant can hold a context mode, so an `st` binding
/// with a mode is unrepresentable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SessionBinding {
    /// Runs in the host loop with AgentTavern mounted.
    AgentTavern {
        /// Character and chat.
        target: BindingTarget,
        /// The session's context mode.
        context_mode: ContextMode,
    },
    /// Runs the legacy SillyTavern pipeline.
    St {
        /// Character and chat.
        target: BindingTarget,
    },
}

impl SessionBinding {
    /// A binding for a new chat under the state's defaults: group chats are always `st`.
    pub fn new_for_chat(target: BindingTarget, state: &TavernState) -> Self {
        Self::with_architecture(
            target,
            state.default_architecture,
            state.default_context_mode,
        )
    }

    /// A binding with an explicit architecture (group → `st` regardless).
    pub fn with_architecture(
        target: BindingTarget,
        architecture: TavernArchitecture,
        context_mode: ContextMode,
    ) -> Self {
        match architecture {
            TavernArchitecture::AgentTavern if !target.group => Self::AgentTavern {
                target,
                context_mode,
            },
            _ => Self::St { target },
        }
    }

    /// The session's architecture.
    pub fn architecture(&self) -> TavernArchitecture {
        match self {
            Self::AgentTavern { .. } => TavernArchitecture::AgentTavern,
            Self::St { .. } => TavernArchitecture::St,
        }
    }

    /// The context mode, only for AgentTavern bindings.
    pub fn context_mode(&self) -> Option<ContextMode> {
        match self {
            Self::AgentTavern { context_mode, .. } => Some(*context_mode),
            Self::St { .. } => None,
        }
    }

    /// Character and chat.
    pub fn target(&self) -> &BindingTarget {
        match self {
            Self::AgentTavern { target, .. } | Self::St { target } => target,
        }
    }

    /// The same binding pointing at a renamed chat; architecture and mode are kept.
    pub fn renamed(&self, chat_id: ChatId) -> Self {
        let mut next = self.clone();
        match &mut next {
            Self::AgentTavern { target, .. } | Self::St { target } => target.chat_id = chat_id,
        }
        next
    }

    /// The same binding with another context mode (AgentTavern only; `st` is returned unchanged).
    pub(crate) fn with_mode(&self, mode: ContextMode) -> Self {
        match self {
            Self::AgentTavern { target, .. } => Self::AgentTavern {
                target: target.clone(),
                context_mode: mode,
            },
            Self::St { .. } => self.clone(),
        }
    }
}

/// A binding as persisted: the typed binding plus fields this version does not know, kept so a
/// round trip through an older or newer writer loses nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingEntry {
    /// The typed binding.
    pub binding: SessionBinding,
    /// Unknown fields of the persisted object, in their original order.
    pub extra: Map<String, Value>,
}

/// All persisted AgentTavern state: bindings per session and the defaults for new sessions.
#[derive(Debug, Clone, PartialEq)]
pub struct TavernState {
    /// Bindings keyed by host session id.
    pub bindings: BTreeMap<SessionId, BindingEntry>,
    /// Architecture for **new** sessions (existing bindings never change with it).
    pub default_architecture: TavernArchitecture,
    /// Context mode for **new** AgentTavern sessions.
    pub default_context_mode: ContextMode,
    /// Whether tools may write the `global` scope.
    pub allow_global_writes: bool,
    /// Whether `memory_forget` needs the user's confirmation.
    pub require_forget_confirmation: bool,
    /// Whether writes visible to other characters (`global`) need the user's confirmation.
    pub require_cross_character_confirmation: bool,
    /// The newest changes an operator made to settings and sessions (the panel, the API),
    /// oldest first: at most [`MAX_CHANGES_PER_SUBJECT`] for the settings and for each session,
    /// [`MAX_STATE_CHANGES`] in all. Memories and variables have their own audit.
    pub changes: Vec<StateChange>,
    /// Unknown top-level fields, kept for round trips.
    pub extra: Map<String, Value>,
}

/// Most changes [`TavernState::changes`] keeps in all (the oldest go first).
pub const MAX_STATE_CHANGES: usize = 200;

/// Most changes kept for the settings and for each session, so a busy session does not push
/// the settings' or another session's changes out.
pub const MAX_CHANGES_PER_SUBJECT: usize = 20;

/// Longest [`StateChange::what`], in characters (longer ones are cut).
pub const MAX_CHANGE_WORDS: usize = 300;

/// A change an operator made to the settings or a session — a mode switch, a fork, a binding,
/// a prompt saved or reset, a replay: what, when, by whom (memories and variables keep their
/// own audit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateChange {
    /// When.
    pub at: Timestamp,
    /// What, in words (`context mode dsh-native → agent-managed`).
    pub what: String,
    /// The session it concerns, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionId>,
    /// Who (the user through the panel or the API).
    pub source: MemorySource,
}

impl Default for TavernState {
    fn default() -> Self {
        Self {
            bindings: BTreeMap::new(),
            default_architecture: TavernArchitecture::AgentTavern,
            default_context_mode: ContextMode::DshNative,
            allow_global_writes: false,
            require_forget_confirmation: false,
            require_cross_character_confirmation: true,
            changes: Vec::new(),
            extra: Map::new(),
        }
    }
}

impl TavernState {
    /// Records an operator's change, keeping the newest [`MAX_CHANGES_PER_SUBJECT`] of its
    /// subject (the settings, or its session) and the newest [`MAX_STATE_CHANGES`] in all.
    pub fn record_change(&mut self, mut change: StateChange) {
        if let Some((cut, _)) = change.what.char_indices().nth(MAX_CHANGE_WORDS) {
            change.what.truncate(cut);
        }
        let subject = change.session.clone();
        self.changes.push(change);
        let same: Vec<usize> = self
            .changes
            .iter()
            .enumerate()
            .filter(|(_, c)| c.session == subject)
            .map(|(i, _)| i)
            .collect();
        if let Some(&oldest) = same
            .first()
            .filter(|_| same.len() > MAX_CHANGES_PER_SUBJECT)
        {
            self.changes.remove(oldest);
        }
        let over = self.changes.len().saturating_sub(MAX_STATE_CHANGES);
        self.changes.drain(..over);
    }

    /// The recorded changes concerning `session`, oldest first.
    pub fn changes_of<'a>(
        &'a self,
        session: &'a SessionId,
    ) -> impl Iterator<Item = &'a StateChange> {
        self.changes
            .iter()
            .filter(move |c| c.session.as_ref() == Some(session))
    }

    /// The binding of a session, if any.
    pub fn binding(&self, session: &SessionId) -> Option<&SessionBinding> {
        self.bindings.get(session).map(|e| &e.binding)
    }

    /// Inserts or replaces a session's binding, keeping unknown fields of an existing entry.
    pub fn set_binding(&mut self, session: SessionId, binding: SessionBinding) {
        match self.bindings.get_mut(&session) {
            Some(entry) => entry.binding = binding,
            None => {
                self.bindings.insert(
                    session,
                    BindingEntry {
                        binding,
                        extra: Map::new(),
                    },
                );
            }
        }
    }

    /// Renames a chat in every binding that points at it; architecture and mode are kept.
    /// Returns how many bindings changed.
    pub fn rename_chat(&mut self, character: &CharacterName, from: &ChatId, to: &ChatId) -> usize {
        let mut changed = 0;
        for entry in self.bindings.values_mut() {
            let t = entry.binding.target();
            if &t.character == character && &t.chat_id == from {
                entry.binding = entry.binding.renamed(to.clone());
                changed += 1;
            }
        }
        changed
    }

    /// The persisted JSON shape (camelCase, unknown fields re-emitted). Feeding it back through
    /// [`crate::normalize_state`] yields this state with no diagnostics.
    pub fn to_json(&self) -> Value {
        let mut bindings = Map::new();
        for (id, entry) in &self.bindings {
            bindings.insert(id.to_string(), binding_to_json(entry));
        }
        let mut out = Map::new();
        out.insert("sessionBindings".into(), Value::Object(bindings));
        out.insert(
            "defaultArchitecture".into(),
            self.default_architecture.as_str().into(),
        );
        out.insert(
            "defaultContextMode".into(),
            self.default_context_mode.as_str().into(),
        );
        out.insert("allowGlobalWrites".into(), self.allow_global_writes.into());
        out.insert(
            "requireForgetConfirmation".into(),
            self.require_forget_confirmation.into(),
        );
        out.insert(
            "requireCrossCharacterConfirmation".into(),
            self.require_cross_character_confirmation.into(),
        );
        if !self.changes.is_empty() {
            out.insert(
                "changes".into(),
                serde_json::to_value(&self.changes).unwrap_or(Value::Null),
            );
        }
        for (k, v) in &self.extra {
            out.entry(k.clone()).or_insert_with(|| v.clone());
        }
        Value::Object(out)
    }
}

fn binding_to_json(entry: &BindingEntry) -> Value {
    let target = entry.binding.target();
    let mut obj = Map::new();
    obj.insert("character".into(), target.character.as_str().into());
    obj.insert("chatId".into(), target.chat_id.as_str().into());
    if target.group {
        obj.insert("group".into(), true.into());
    }
    obj.insert(
        "architecture".into(),
        entry.binding.architecture().as_str().into(),
    );
    if let Some(mode) = entry.binding.context_mode() {
        obj.insert("contextMode".into(), mode.as_str().into());
    }
    for (k, v) in &entry.extra {
        obj.entry(k.clone()).or_insert_with(|| v.clone());
    }
    Value::Object(obj)
}
