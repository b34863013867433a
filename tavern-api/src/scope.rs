//! Scopes as the API names them — `scope=chat&character=Mira&chat=Mira - 1` in a query,
//! `{"kind": "chat", "character": "Mira", "chat": "Mira - 1"}` in a body — and the rule that a
//! request naming a session sees only that session's scopes (the tools' rule: ids in another
//! chat are not found, whether they exist or not).

use serde::{Deserialize, Serialize};
use tavern_core::{AgentId, CharacterName, ChatId, ScopeKey, SessionId};
use utoipa::{IntoParams, ToSchema};

use crate::app::Api;
use crate::error::ApiError;

/// A concrete scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScopeRef {
    /// `chat`, `character`, `agent`, `turn` or `global`.
    pub kind: String,
    /// The character (`chat`, `character`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub character: Option<String>,
    /// The chat id (`chat`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<String>,
    /// The agent (`agent`, `turn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

impl ScopeRef {
    /// The reference of a key.
    pub fn of(key: &ScopeKey) -> Self {
        let (character, chat, agent) = match key {
            ScopeKey::Chat { character, chat } => {
                (Some(character.to_string()), Some(chat.to_string()), None)
            }
            ScopeKey::Character { character } => (Some(character.to_string()), None, None),
            ScopeKey::Agent { agent } | ScopeKey::Turn { agent } => {
                (None, None, Some(agent.to_string()))
            }
            ScopeKey::Global => (None, None, None),
        };
        Self {
            kind: key.scope().as_str().to_owned(),
            character,
            chat,
            agent,
        }
    }

    /// The key named, checked: each kind takes exactly its own ids.
    ///
    /// # Errors
    /// [`ApiError::BadRequest`] naming the missing, superfluous or invalid part.
    pub fn key(&self) -> Result<ScopeKey, ApiError> {
        let bad = |m: String| ApiError::BadRequest(m);
        let kind = self.kind.as_str();
        let allowed: &[&str] = match kind {
            "chat" => &["character", "chat"],
            "character" => &["character"],
            "agent" | "turn" => &["agent"],
            "global" => &[],
            other => {
                return Err(bad(format!(
                    "unknown scope {:?}: chat, character, agent, turn or global",
                    excerpt(other)
                )))
            }
        };
        for (name, given) in [
            ("character", self.character.is_some()),
            ("chat", self.chat.is_some()),
            ("agent", self.agent.is_some()),
        ] {
            if given && !allowed.contains(&name) {
                return Err(bad(format!("{name} does not apply to scope {kind}")));
            }
        }
        let need = |v: &Option<String>, name: &str| {
            v.clone()
                .ok_or_else(|| bad(format!("scope {kind} needs {name}")))
        };
        let invalid = |e: tavern_core::CoreError| bad(e.to_string());
        Ok(match kind {
            "chat" => ScopeKey::Chat {
                character: CharacterName::parse(need(&self.character, "character")?)
                    .map_err(invalid)?,
                chat: ChatId::parse(need(&self.chat, "chat")?).map_err(invalid)?,
            },
            "character" => ScopeKey::Character {
                character: CharacterName::parse(need(&self.character, "character")?)
                    .map_err(invalid)?,
            },
            "agent" => ScopeKey::Agent {
                agent: AgentId::parse(need(&self.agent, "agent")?).map_err(invalid)?,
            },
            "turn" => ScopeKey::Turn {
                agent: AgentId::parse(need(&self.agent, "agent")?).map_err(invalid)?,
            },
            _ => ScopeKey::Global,
        })
    }
}

/// A scope in a query string, optionally limited to what one session sees.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ScopeQuery {
    /// `chat`, `character`, `agent`, `turn` or `global`.
    pub scope: Option<String>,
    /// The character (`chat`, `character` scopes).
    pub character: Option<String>,
    /// The chat id (`chat` scope).
    pub chat: Option<String>,
    /// The agent (`agent`, `turn` scopes).
    pub agent: Option<String>,
    /// Only what this session sees: its chat, character, agent, turn and the global scope
    /// (another scope's records are not found).
    pub session: Option<String>,
}

impl ScopeQuery {
    /// The scope as named, unchecked (`kind` empty when none is named): for links back to it.
    pub fn scope_ref(&self) -> ScopeRef {
        ScopeRef {
            kind: self.scope.clone().unwrap_or_default(),
            character: self.character.clone(),
            chat: self.chat.clone(),
            agent: self.agent.clone(),
        }
    }

    /// The scope named, if any.
    ///
    /// # Errors
    /// [`ApiError::BadRequest`] for a bad or partial scope.
    pub fn named(&self) -> Result<Option<ScopeKey>, ApiError> {
        match &self.scope {
            Some(_) => self.scope_ref().key().map(Some),
            None => match [
                ("character", &self.character),
                ("chat", &self.chat),
                ("agent", &self.agent),
            ]
            .into_iter()
            .find(|(_, v)| v.is_some())
            {
                Some((name, _)) => Err(ApiError::BadRequest(format!("{name} needs scope"))),
                None => Ok(None),
            },
        }
    }

    /// The scopes a listing covers: the one named (which must be the session's, when a
    /// session is named), else the session's, else every scope (empty).
    ///
    /// # Errors
    /// [`ApiError::BadRequest`] for a bad scope or session id; [`ApiError::NotFound`] for a
    /// scope the session does not see, or a session that is not bound.
    pub async fn resolve(&self, api: &Api) -> Result<Vec<ScopeKey>, ApiError> {
        let named = self.named()?;
        let Some(session) = &self.session else {
            return Ok(named.into_iter().collect());
        };
        let visible = api.session_scopes(&session_id(session)?).await?;
        match named {
            None => Ok(visible),
            Some(key) if visible.contains(&key) => Ok(vec![key]),
            Some(key) => Err(ApiError::NotFound(format!(
                "scope {} is not one session {session} sees",
                excerpt(&key.to_string())
            ))),
        }
    }

    /// Exactly one scope (routes about one record).
    ///
    /// # Errors
    /// As [`Self::resolve`], and [`ApiError::BadRequest`] when no scope is named.
    pub async fn one(&self, api: &Api) -> Result<ScopeKey, ApiError> {
        if self.scope.is_none() {
            return Err(ApiError::BadRequest(
                "scope is required (chat, character, agent, turn or global)".into(),
            ));
        }
        let mut keys = self.resolve(api).await?;
        keys.pop()
            .ok_or_else(|| ApiError::BadRequest("scope is required".into()))
    }
}

/// Parses a session id from a path or query.
///
/// # Errors
/// [`ApiError::BadRequest`] naming it.
pub fn session_id(text: &str) -> Result<SessionId, ApiError> {
    SessionId::parse(text).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// User input shortened for a message.
pub(crate) fn excerpt(text: &str) -> String {
    const MAX: usize = 80;
    let mut out: String = text.chars().take(MAX).collect();
    if text.chars().count() > MAX {
        out.push('…');
    }
    out
}
