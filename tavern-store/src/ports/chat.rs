//! The SillyTavern chat port: JSONL files of typed lines (header first), read and written
//! under compare-and-set so concurrent writers never lose each other's lines.

use std::fmt;

use async_trait::async_trait;
use tavern_core::chat::ChatLine;
use tavern_core::chat_digest::{ChatDigest, DigestLabel};
use tavern_core::{CharacterName, ChatId};

use crate::error::StoreError;

/// A chat revision: changes whenever the chat's bytes change, whoever wrote them, and is the
/// same for the same bytes in every adapter ([`ChatRevision::of_content`]), so a chat moved
/// from one store to another keeps its revision. Callers compare and store it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChatRevision(String);

/// The prefix of content revisions (`c2-<segments>-<bytes>-<chain>`).
const CONTENT_PREFIX: &str = "c2-";

impl ChatRevision {
    /// Wraps revision text as persisted (e.g. read back from a checkpoint).
    pub fn new(opaque: impl Into<String>) -> Self {
        Self(opaque.into())
    }

    /// The revision of a chat whose content has `digest`: what every adapter issues.
    pub fn of_content(digest: &ChatDigest) -> Self {
        Self(format!("{CONTENT_PREFIX}{}", digest.label()))
    }

    /// The revision of a chat made of `lines` joined by `\n`, as SillyTavern writes it.
    pub fn of_lines(lines: &[ChatLine]) -> Self {
        Self::of_content(&ChatDigest::of_lines(lines.iter().map(ChatLine::raw)))
    }

    /// What a content revision says about its chat (segments, bytes, chain); `None` for any
    /// other text (e.g. a revision persisted by an older version).
    pub fn content(&self) -> Option<DigestLabel> {
        DigestLabel::parse(self.0.strip_prefix(CONTENT_PREFIX)?)
    }

    /// Whether this revision was issued for content with `digest`.
    pub fn names(&self, digest: &ChatDigest) -> bool {
        self.0.strip_prefix(CONTENT_PREFIX) == Some(digest.label().as_str())
    }

    /// The revision as text (what checkpoints persist).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ChatRevision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A chat as stored: its lines (the header first, where the chat has one), each keeping its
/// exact original text, and the revision they were read at.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatFile {
    /// The lines in file order.
    pub lines: Vec<ChatLine>,
    /// The revision these lines were read at.
    pub revision: ChatRevision,
}

impl ChatFile {
    /// The branch back-link: SillyTavern records a branch's origin as
    /// `chat_metadata.main_chat` in the header line.
    pub fn parent_chat(&self) -> Option<ChatId> {
        let header = self.lines.first().filter(|l| l.is_header())?;
        ChatId::parse(header.main_chat()?).ok()
    }
}

/// What changed in a chat since a revision it was read at ([`ChatStore::read_chat_since`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ChatChange {
    /// The chat is still at that revision.
    Unchanged,
    /// Lines were only appended since: the new lines, in file order, and the revision the chat
    /// is at with them.
    Appended {
        /// The lines after those of the earlier revision.
        lines: Vec<ChatLine>,
        /// The revision these lines bring the chat to.
        revision: ChatRevision,
    },
    /// Anything else (rewritten, or the adapter cannot tell): the whole chat as it is now.
    Whole(ChatFile),
}

/// SillyTavern chats, grouped by character.
///
/// Lines are [`ChatLine`]s: one JSON object each, on one line, valid by construction; an
/// adapter writes their exact text, so unchanged lines round-trip byte for byte.
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
    /// IO failures; [`StoreError::Corrupt`] naming the line for a line that is not one JSON
    /// object.
    async fn read_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatFile>, StoreError>;

    /// The chat's first line (a SillyTavern header: the chat's metadata — its persona lock,
    /// author's note, chat lorebook), or `None` if the chat does not exist or has no line.
    /// Blank lines before it are skipped, as [`ChatStore::read_chat`] skips them. An adapter
    /// that can reads only that line, so the cost does not grow with the chat; the default
    /// reads the chat.
    ///
    /// # Errors
    /// As [`ChatStore::read_chat`]; [`StoreError::LimitExceeded`] for a first line over
    /// [`MAX_CHAT_HEAD_BYTES`] when the adapter reads only the head.
    async fn read_chat_head(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatLine>, StoreError> {
        Ok(self
            .read_chat(character, chat)
            .await?
            .and_then(|f| f.lines.into_iter().next()))
    }

    /// The chat's current revision without reading its lines (cheap for long chats).
    ///
    /// # Errors
    /// IO failures.
    async fn chat_revision(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatRevision>, StoreError>;

    /// What changed since the chat was read at `since` (a revision from any store, since
    /// revisions name content): nothing, only appended lines (never when the lines `since`
    /// names were changed; an adapter that can tell cheaply reads just the new ones, so the
    /// cost does not grow with the chat), or the whole chat. `None` if the chat does not exist.
    ///
    /// The default reads the whole chat and answers [`ChatChange::Unchanged`] or
    /// [`ChatChange::Whole`]; callers compare lines themselves when they need to know more.
    ///
    /// # Errors
    /// As [`ChatStore::read_chat`].
    async fn read_chat_since(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        since: &ChatRevision,
    ) -> Result<Option<ChatChange>, StoreError> {
        Ok(self.read_chat(character, chat).await?.map(|file| {
            if &file.revision == since {
                ChatChange::Unchanged
            } else {
                ChatChange::Whole(file)
            }
        }))
    }

    /// Appends lines if the chat is still at `expected`; cost does not grow with the chat.
    /// Appending no lines changes nothing and returns `expected`.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] (with no revision: chat revisions are not
    /// [`tavern_core::Revision`]s) when the file changed, [`StoreError::NotFound`] for a missing
    /// chat.
    async fn append_lines(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: &ChatRevision,
    ) -> Result<ChatRevision, StoreError>;

    /// Replaces the whole chat. `expected = None` creates a new chat and conflicts if it
    /// exists.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] on a revision mismatch; [`StoreError::Invalid`] for no lines.
    async fn rewrite_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: Option<&ChatRevision>,
    ) -> Result<ChatRevision, StoreError>;
}

/// Refuses an empty rewrite: a chat file always has at least one line.
pub(crate) fn check_not_empty(lines: &[ChatLine]) -> Result<(), StoreError> {
    if lines.is_empty() {
        return Err(StoreError::Invalid(tavern_core::CoreError::InvalidField {
            field: "chat",
            reason: "a chat needs at least one line".into(),
        }));
    }
    Ok(())
}

/// Parses stored chat text into lines (`\n` or `\r\n`, blank lines skipped).
///
/// # Errors
/// [`StoreError::Corrupt`] naming `file` and the 1-based line.
/// The longest first line [`ChatStore::read_chat_head`] reads: 4 MiB (a header holds the
/// chat's metadata; SillyTavern's are a few KiB).
pub const MAX_CHAT_HEAD_BYTES: usize = 4 * 1024 * 1024;

pub(crate) fn parse_lines(file: &str, text: &str) -> Result<Vec<ChatLine>, StoreError> {
    text.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            ChatLine::parse(l).map_err(|e| StoreError::Corrupt {
                file: format!("{file} line {}", i + 1),
                reason: e.to_string(),
            })
        })
        .collect()
}
