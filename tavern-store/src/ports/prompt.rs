//! The per-session system prompt port (tavern mode): one custom prompt per session id.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tavern_core::{SessionId, Timestamp};

use crate::error::StoreError;

/// Longest custom prompt, in UTF-8 bytes.
pub const PROMPT_MAX_BYTES: usize = 32 * 1024;

/// A session's custom system prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionPrompt {
    /// The session.
    pub session_id: SessionId,
    /// The prompt text, kept literally (`{{char}}` stays `{{char}}`).
    pub text: String,
    /// When it was saved.
    pub updated_at: Timestamp,
}

impl SessionPrompt {
    /// What saving `text` for `session` means, for every adapter: over
    /// [`PROMPT_MAX_BYTES`] is refused, blank text is a reset (`None`: no empty record).
    ///
    /// # Errors
    /// [`StoreError::LimitExceeded`] over [`PROMPT_MAX_BYTES`].
    pub fn to_save(
        session: &SessionId,
        text: &str,
        now: Timestamp,
    ) -> Result<Option<Self>, StoreError> {
        if text.len() > PROMPT_MAX_BYTES {
            return Err(StoreError::LimitExceeded {
                limit: "system prompt bytes",
                max: PROMPT_MAX_BYTES,
                actual: text.len(),
            });
        }
        Ok((!text.trim().is_empty()).then(|| Self {
            session_id: session.clone(),
            text: text.to_owned(),
            updated_at: now,
        }))
    }
}

/// Custom prompts, one per session. Saving is durable before it becomes visible: a failed save
/// changes neither the disk nor what `get` returns.
#[async_trait]
pub trait PromptStore: Send + Sync {
    /// The session's custom prompt, if any.
    ///
    /// # Errors
    /// IO failures; invalid records are backed up and skipped (read as `None`).
    async fn get_prompt(&self, session: &SessionId) -> Result<Option<SessionPrompt>, StoreError>;

    /// Saves a prompt. Blank text resets to the default (no empty record) and returns `None`.
    ///
    /// # Errors
    /// [`StoreError::LimitExceeded`] over [`PROMPT_MAX_BYTES`], IO failures.
    async fn save_prompt(
        &self,
        session: &SessionId,
        text: &str,
    ) -> Result<Option<SessionPrompt>, StoreError>;

    /// Removes the custom prompt; returns whether there was one.
    ///
    /// # Errors
    /// IO failures.
    async fn reset_prompt(&self, session: &SessionId) -> Result<bool, StoreError>;
}
