//! Scope flags (`--scope chat --character C --chat ID`, …) into a validated [`ScopeKey`].

use tavern_core::{AgentId, CharacterName, ChatId, ScopeKey};

use crate::cli::{ScopeArgs, ScopeKind};
use crate::CliError;

fn usage(e: impl std::fmt::Display, flag: &str) -> CliError {
    CliError::Usage(format!("{flag}: {e}"))
}

impl ScopeArgs {
    /// The scope named, or `None` when no `--scope` was given (and no other scope flag).
    ///
    /// # Errors
    /// [`CliError::Usage`] for a missing or superfluous flag, or an invalid id.
    pub fn resolve(&self) -> Result<Option<ScopeKey>, CliError> {
        let Some(kind) = self.scope else {
            if let Some(flag) = self.extra_flags(&[]).first() {
                return Err(CliError::Usage(format!("{flag} needs --scope")));
            }
            return Ok(None);
        };
        let need = |v: &Option<String>, flag: &str| {
            v.clone().ok_or_else(|| {
                CliError::Usage(format!("--scope {} needs {flag}", scope_label(kind)))
            })
        };
        let allowed: &[&str] = match kind {
            ScopeKind::Chat => &["--character", "--chat"],
            ScopeKind::Character => &["--character"],
            ScopeKind::Agent | ScopeKind::Turn => &["--agent"],
            ScopeKind::Global => &[],
        };
        if let Some(flag) = self.extra_flags(allowed).first() {
            return Err(CliError::Usage(format!(
                "{flag} does not apply to --scope {}",
                scope_label(kind)
            )));
        }
        let character = |v: String| CharacterName::parse(v).map_err(|e| usage(e, "--character"));
        let agent = |v: String| AgentId::parse(v).map_err(|e| usage(e, "--agent"));
        Ok(Some(match kind {
            ScopeKind::Chat => ScopeKey::Chat {
                character: character(need(&self.character, "--character")?)?,
                chat: ChatId::parse(need(&self.chat, "--chat")?).map_err(|e| usage(e, "--chat"))?,
            },
            ScopeKind::Character => ScopeKey::Character {
                character: character(need(&self.character, "--character")?)?,
            },
            ScopeKind::Agent => ScopeKey::Agent {
                agent: agent(need(&self.agent, "--agent")?)?,
            },
            ScopeKind::Turn => ScopeKey::Turn {
                agent: agent(need(&self.agent, "--agent")?)?,
            },
            ScopeKind::Global => ScopeKey::Global,
        }))
    }

    /// The scope named; one is required.
    ///
    /// # Errors
    /// As [`ScopeArgs::resolve`], and [`CliError::Usage`] when no scope is given.
    pub fn require(&self) -> Result<ScopeKey, CliError> {
        self.resolve()?.ok_or_else(|| {
            CliError::Usage("--scope is required (chat, character, agent, turn or global)".into())
        })
    }

    fn extra_flags(&self, allowed: &[&str]) -> Vec<&'static str> {
        [
            ("--character", self.character.is_some()),
            ("--chat", self.chat.is_some()),
            ("--agent", self.agent.is_some()),
        ]
        .into_iter()
        .filter(|(flag, set)| *set && !allowed.contains(flag))
        .map(|(flag, _)| flag)
        .collect()
    }
}

fn scope_label(kind: ScopeKind) -> &'static str {
    match kind {
        ScopeKind::Chat => "chat",
        ScopeKind::Character => "character",
        ScopeKind::Agent => "agent",
        ScopeKind::Turn => "turn",
        ScopeKind::Global => "global",
    }
}
