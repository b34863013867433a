//! The SillyTavern chat port: JSONL files of raw lines (header first), read and written under
//! compare-and-set so concurrent writers never lose each other's lines.

use std::fmt;

use async_trait::async_trait;
use tavern_core::{CharacterName, ChatId};

use crate::error::StoreError;

/// An opaque chat revision; changes whenever the file changes, whoever wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChatRevision(pub String);

impl fmt::Display for ChatRevision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A chat as stored: its raw lines (the header first), byte-exact, and its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatFile {
    /// Raw JSON lines without line terminators; `lines[0]` is the header.
    pub lines: Vec<String>,
    /// The revision these lines were read at.
    pub revision: ChatRevision,
}

/// SillyTavern chats, grouped by character.
#[async_trait]
pub trait ChatStore: Send + Sync {
    /// The character's chats, sorted by id.
    ///
    /// # Errors
    /// IO failures.
    async fn list_chats(&self, character: &CharacterName) -> Result<Vec<ChatId>, StoreError>;

    /// A chat's lines and revision, or `None` if it does not exist.
    ///
    /// # Errors
    /// IO failures.
    async fn read_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatFile>, StoreError>;

    /// The chat's current revision without reading its lines (cheap for long chats).
    ///
    /// # Errors
    /// IO failures.
    async fn chat_revision(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatRevision>, StoreError>;

    /// Appends lines if the chat is still at `expected`; cost does not grow with the chat.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] (with no revision: chat revisions are not [`tavern_core::Revision`]s)
    /// when the file changed, [`StoreError::NotFound`] for a missing chat,
    /// [`StoreError::Invalid`]-style [`StoreError::Corrupt`] for a line that is not one JSON object.
    async fn append_lines(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[String],
        expected: &ChatRevision,
    ) -> Result<ChatRevision, StoreError>;

    /// Replaces the whole chat (`lines[0]` is the header). `expected = None` creates a new chat
    /// and conflicts if it exists.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] on a revision mismatch; invalid lines as for `append`.
    async fn rewrite_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[String],
        expected: Option<&ChatRevision>,
    ) -> Result<ChatRevision, StoreError>;
}

/// The branch back-link of a chat: SillyTavern records a branch's origin as
/// `chat_metadata.main_chat` in the header line.
pub fn parent_chat(file: &ChatFile) -> Option<ChatId> {
    let header = tavern_core::chat::ChatLine::parse(file.lines.first()?).ok()?;
    ChatId::parse(header.main_chat()?).ok()
}

/// How errors name a chat: `chat <id> of <character>`.
pub(crate) fn chat_target(character: &CharacterName, chat: &ChatId) -> String {
    format!("chat {chat} of {character}")
}

/// Checks that every line is exactly one JSON object without line breaks.
///
/// # Errors
/// [`StoreError::Corrupt`] naming the chat and the line index.
pub fn validate_lines(chat: &ChatId, lines: &[String]) -> Result<(), StoreError> {
    for (i, line) in lines.iter().enumerate() {
        let ok = !line.contains('\n')
            && !line.contains('\r')
            && serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.is_object());
        if !ok {
            return Err(StoreError::Corrupt {
                file: format!("chat {chat}"),
                reason: format!("line {i} is not one json object on one line"),
            });
        }
    }
    Ok(())
}
