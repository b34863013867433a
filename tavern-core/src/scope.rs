//! Memory and variable scopes, their resolution from a binding, and the write policy.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::binding::{SessionBinding, TavernState};
use crate::error::CoreError;
use crate::ids::{AgentId, CharacterName, ChatId};

/// A scope as the model names it. The model names only the *kind*; the concrete key always comes
/// from the session's binding (see [`ScopeKey::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Lives until the current turn ends.
    Turn,
    /// The current chat.
    Chat,
    /// Every chat with the current character.
    Character,
    /// The current agent (host session).
    Agent,
    /// Everything; writes need explicit enabling.
    Global,
}

impl Scope {
    /// All scopes, narrowest first.
    pub const ALL: [Scope; 5] = [
        Scope::Turn,
        Scope::Chat,
        Scope::Character,
        Scope::Agent,
        Scope::Global,
    ];

    /// The label (`turn`, `chat`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Turn => "turn",
            Self::Chat => "chat",
            Self::Character => "character",
            Self::Agent => "agent",
            Self::Global => "global",
        }
    }

    /// Parses a label.
    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == label)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A concrete scope: the kind plus the ids that make it unique. Serialized as its segments,
/// e.g. `["chat", "Mira", "Mira - 1"]` (compact, and fast to parse in large logs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScopeKey {
    /// Turn-local data of one agent.
    Turn {
        /// The agent.
        agent: AgentId,
    },
    /// One chat of one character (SillyTavern keeps chats per character).
    Chat {
        /// The character.
        character: CharacterName,
        /// The chat.
        chat: ChatId,
    },
    /// One character.
    Character {
        /// The character.
        character: CharacterName,
    },
    /// One agent (host session).
    Agent {
        /// The agent.
        agent: AgentId,
    },
    /// Shared by everything.
    Global,
}

impl ScopeKey {
    /// Resolves a scope kind against the session's binding and the host's real agent id.
    pub fn resolve(scope: Scope, binding: &SessionBinding, agent: &AgentId) -> Self {
        let target = binding.target();
        match scope {
            Scope::Turn => Self::Turn {
                agent: agent.clone(),
            },
            Scope::Chat => Self::Chat {
                character: target.character.clone(),
                chat: target.chat_id.clone(),
            },
            Scope::Character => Self::Character {
                character: target.character.clone(),
            },
            Scope::Agent => Self::Agent {
                agent: agent.clone(),
            },
            Scope::Global => Self::Global,
        }
    }

    /// The kind of this key.
    pub fn scope(&self) -> Scope {
        match self {
            Self::Turn { .. } => Scope::Turn,
            Self::Chat { .. } => Scope::Chat,
            Self::Character { .. } => Scope::Character,
            Self::Agent { .. } => Scope::Agent,
            Self::Global => Scope::Global,
        }
    }

    /// The validated id segments that identify this key, kind first. Storage adapters encode
    /// these into names; they are never used as paths unencoded.
    pub fn segments(&self) -> Vec<&str> {
        match self {
            Self::Turn { agent } => vec!["turn", agent.as_str()],
            Self::Chat { character, chat } => vec!["chat", character.as_str(), chat.as_str()],
            Self::Character { character } => vec!["character", character.as_str()],
            Self::Agent { agent } => vec!["agent", agent.as_str()],
            Self::Global => vec!["global"],
        }
    }
}

impl ScopeKey {
    /// Parses segments made by [`ScopeKey::segments`].
    ///
    /// # Errors
    /// [`CoreError::InvalidId`] for an unknown kind, a wrong segment count or an invalid id.
    pub fn from_segments(segments: &[&str]) -> Result<Self, CoreError> {
        let bad = |reason| CoreError::InvalidId {
            kind: "scope",
            value: crate::error::excerpt(&segments.join(":")),
            reason,
        };
        match segments {
            ["turn", agent] => Ok(Self::Turn {
                agent: AgentId::parse(*agent)?,
            }),
            ["chat", character, chat] => Ok(Self::Chat {
                character: CharacterName::parse(*character)?,
                chat: ChatId::parse(*chat)?,
            }),
            ["character", character] => Ok(Self::Character {
                character: CharacterName::parse(*character)?,
            }),
            ["agent", agent] => Ok(Self::Agent {
                agent: AgentId::parse(*agent)?,
            }),
            ["global"] => Ok(Self::Global),
            [kind, ..] if Scope::from_label(kind).is_some() => {
                Err(bad("wrong number of segments for this scope"))
            }
            _ => Err(bad("unknown scope kind")),
        }
    }
}

impl Serialize for ScopeKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.segments().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ScopeKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let segments: Vec<std::borrow::Cow<'de, str>> = Vec::deserialize(deserializer)?;
        let refs: Vec<&str> = segments.iter().map(|s| s.as_ref()).collect();
        Self::from_segments(&refs).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for ScopeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.segments().join(":"))
    }
}

/// Who may write where. Built from [`TavernState`]; tools check every write against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WritePolicy {
    /// `global` writes are allowed at all.
    pub allow_global_writes: bool,
    /// `memory_forget` needs the user's confirmation.
    pub require_forget_confirmation: bool,
    /// Writes other characters can see (`global`) need the user's confirmation.
    pub require_cross_character_confirmation: bool,
}

/// Why a write was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteDenial {
    /// Global writes are disabled in the settings.
    GlobalDisabled,
    /// The action needs the user's confirmation first.
    NeedsConfirmation(&'static str),
}

impl fmt::Display for WriteDenial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::GlobalDisabled => f.write_str("global writes are disabled in the settings"),
            Self::NeedsConfirmation(what) => write!(f, "{what} needs the user's confirmation"),
        }
    }
}

impl WritePolicy {
    /// The policy stored in the state.
    pub fn from_state(state: &TavernState) -> Self {
        Self {
            allow_global_writes: state.allow_global_writes,
            require_forget_confirmation: state.require_forget_confirmation,
            require_cross_character_confirmation: state.require_cross_character_confirmation,
        }
    }

    /// Checks a write (set, put, patch, delete) into `scope`.
    ///
    /// # Errors
    /// The [`WriteDenial`] that applies.
    pub fn check_write(&self, scope: Scope, confirmed: bool) -> Result<(), WriteDenial> {
        if scope == Scope::Global {
            if !self.allow_global_writes {
                return Err(WriteDenial::GlobalDisabled);
            }
            if self.require_cross_character_confirmation && !confirmed {
                return Err(WriteDenial::NeedsConfirmation(
                    "a global write (visible to every character)",
                ));
            }
        }
        Ok(())
    }

    /// Checks a `memory_forget` in `scope`.
    ///
    /// # Errors
    /// The [`WriteDenial`] that applies.
    pub fn check_forget(&self, scope: Scope, confirmed: bool) -> Result<(), WriteDenial> {
        self.check_write(scope, confirmed)?;
        if self.require_forget_confirmation && !confirmed {
            return Err(WriteDenial::NeedsConfirmation("forgetting a memory"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::BindingTarget;
    use crate::ContextMode;

    fn binding() -> SessionBinding {
        SessionBinding::AgentTavern {
            target: BindingTarget {
                character: CharacterName::parse("Seraphina").unwrap(),
                chat_id: ChatId::parse("Seraphina - 1").unwrap(),
                group: false,
            },
            context_mode: ContextMode::DshNative,
        }
    }

    #[test]
    fn scopes_resolve_from_binding_and_agent() {
        let agent = AgentId::parse("a1").unwrap();
        let b = binding();
        let got: Vec<String> = Scope::ALL
            .iter()
            .map(|s| ScopeKey::resolve(*s, &b, &agent).to_string())
            .collect();
        assert_eq!(
            got,
            [
                "turn:a1",
                "chat:Seraphina:Seraphina - 1",
                "character:Seraphina",
                "agent:a1",
                "global"
            ]
        );
    }

    #[test]
    fn scope_keys_serialize_as_segments_and_round_trip() {
        let agent = AgentId::parse("a1").unwrap();
        for scope in Scope::ALL {
            let key = ScopeKey::resolve(scope, &binding(), &agent);
            let json = serde_json::to_string(&key).unwrap();
            assert_eq!(
                serde_json::from_str::<ScopeKey>(&json).unwrap(),
                key,
                "{json}"
            );
        }
        assert_eq!(
            serde_json::to_string(&ScopeKey::resolve(Scope::Chat, &binding(), &agent)).unwrap(),
            r#"["chat","Seraphina","Seraphina - 1"]"#
        );
        for bad in [
            r#"["chat","A"]"#,
            r#"["planet","x"]"#,
            r#"["chat","A","../x"]"#,
            "[]",
        ] {
            assert!(serde_json::from_str::<ScopeKey>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn global_writes_are_off_by_default_and_forget_can_need_confirmation() {
        let state = TavernState::default();
        let policy = WritePolicy::from_state(&state);
        assert_eq!(
            policy.check_write(Scope::Global, true),
            Err(WriteDenial::GlobalDisabled)
        );
        for s in [Scope::Turn, Scope::Chat, Scope::Character, Scope::Agent] {
            assert_eq!(policy.check_write(s, false), Ok(()));
        }
        let open = WritePolicy {
            allow_global_writes: true,
            require_forget_confirmation: true,
            require_cross_character_confirmation: true,
        };
        assert!(matches!(
            open.check_write(Scope::Global, false),
            Err(WriteDenial::NeedsConfirmation(_))
        ));
        assert_eq!(open.check_write(Scope::Global, true), Ok(()));
        assert!(open.check_forget(Scope::Chat, false).is_err());
        assert_eq!(open.check_forget(Scope::Chat, true), Ok(()));
    }
}
