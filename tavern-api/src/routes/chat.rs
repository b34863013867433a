//! A session's chat, a page at a time: the lines a memory's source points to (`?turn=N`: the
//! lines AgentTavern projected for that turn, with a few before them), or any page by offset.
//! Message numbers are SillyTavern's (the header line is not a message), so `#m12` names the
//! same message as SillyTavern's `mesid` 12.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use tavern_core::chat::ChatLine;
use tavern_store::ChatStore;
use utoipa::{IntoParams, ToSchema};

use crate::app::Api;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Path, Query};
use crate::routes::sessions::page_limit;
use crate::scope::session_id;

/// Most messages a page holds.
pub const MAX_CHAT_PAGE: usize = 200;
/// Longest message text a page carries, in bytes (cut at a character boundary, and marked).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;
/// Messages shown before a turn's first one, for context.
const TURN_CONTEXT: usize = 3;

/// Chats the chat page keeps parsed (the last ones read), so paging through a long chat reads
/// it once: an entry is used only while the store's revision of the chat is still its own.
const CACHED_CHATS: usize = 4;

/// One cached chat: `(character, chat, revision, its messages without the header)`.
type CachedChat = (
    tavern_core::CharacterName,
    tavern_core::ChatId,
    tavern_store::ChatRevision,
    std::sync::Arc<Vec<ChatLine>>,
);

/// The chats the chat page read last (at most [`CACHED_CHATS`], newest last).
#[derive(Debug, Default)]
pub(crate) struct ChatCache(std::sync::Mutex<std::collections::VecDeque<CachedChat>>);

impl ChatCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<CachedChat>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The messages of `chat` at `revision`, if cached.
    fn get(
        &self,
        character: &tavern_core::CharacterName,
        chat: &tavern_core::ChatId,
        revision: &tavern_store::ChatRevision,
    ) -> Option<std::sync::Arc<Vec<ChatLine>>> {
        self.lock()
            .iter()
            .find(|(c, id, rev, _)| c == character && id == chat && rev == revision)
            .map(|e| e.3.clone())
    }

    fn put(&self, entry: CachedChat) {
        let mut chats = self.lock();
        chats.retain(|(c, id, _, _)| !(c == &entry.0 && id == &entry.1));
        chats.push_back(entry);
        while chats.len() > CACHED_CHATS {
            chats.pop_front();
        }
    }
}

/// The chat's messages (the header left out), from the cache while the chat is unchanged.
async fn messages_of(
    api: &Api,
    character: &tavern_core::CharacterName,
    chat: &tavern_core::ChatId,
) -> Result<std::sync::Arc<Vec<ChatLine>>, ApiError> {
    let stores = api.runtime().stores();
    let missing = || ApiError::NotFound(format!("chat {chat} of {character} is not in the store"));
    let revision = stores
        .chat_revision(character, chat)
        .await?
        .ok_or_else(missing)?;
    if let Some(hit) = api.chat_cache().get(character, chat, &revision) {
        return Ok(hit);
    }
    let file = stores
        .read_chat(character, chat)
        .await?
        .ok_or_else(missing)?;
    let messages: std::sync::Arc<Vec<ChatLine>> =
        std::sync::Arc::new(file.lines.into_iter().filter(|l| !l.is_header()).collect());
    api.chat_cache().put((
        character.clone(),
        chat.clone(),
        file.revision,
        messages.clone(),
    ));
    Ok(messages)
}

/// Which page of the chat.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ChatQuery {
    /// The turn whose messages to show (the page starts a few messages before its first).
    pub turn: Option<u64>,
    /// The first message of the page (ignored with `turn`).
    pub offset: Option<usize>,
    /// Most messages (1–200, default 30).
    pub limit: Option<usize>,
}

/// One message of a chat.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageView {
    /// Its number (SillyTavern's `mesid`: the header line is not counted).
    pub index: usize,
    /// Who wrote it.
    pub name: String,
    /// Written by the user.
    pub is_user: bool,
    /// A system or narrator message.
    pub is_system: bool,
    /// Its text (cut at 16 KiB).
    pub text: String,
    /// Whether the text was cut.
    pub truncated: bool,
    /// SillyTavern's `send_date`, as written.
    pub send_date: Option<String>,
    /// The turn of this session that wrote it (messages this session projected; lines a
    /// fork or a continued chat copied from another session have none).
    pub turn: Option<u64>,
}

/// A page of a session's chat.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatPage {
    /// The session.
    pub session: String,
    /// The character (or group).
    pub character: String,
    /// The chat id.
    pub chat: String,
    /// How many messages the chat has.
    pub total: usize,
    /// The first message's number on this page.
    pub offset: usize,
    /// The messages.
    pub messages: Vec<MessageView>,
    /// The numbers of the asked turn's messages on this page (empty without `turn`).
    pub turn_messages: Vec<usize>,
    /// How many messages the asked turn has in all.
    pub turn_total: usize,
}

/// The turn of `session` that projected `line` (`extra.agentTavern.{sessionId, turn}`): turns
/// count from 1 in every session, and a fork copies its origin's lines, so the session must
/// match too.
fn turn_of(line: &ChatLine, session: &str) -> Option<u64> {
    let at = line.extra()?.get("agentTavern")?;
    if at.get("sessionId")?.as_str()? != session {
        return None;
    }
    at.get("turn")?.as_u64()
}

fn cut(text: &str) -> (String, bool) {
    if text.len() <= MAX_MESSAGE_BYTES {
        return (text.to_owned(), false);
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

fn message(index: usize, line: &ChatLine, session: &str) -> MessageView {
    let (text, truncated) = cut(line.text());
    MessageView {
        index,
        name: line.name().unwrap_or_default().to_owned(),
        is_user: line.is_user(),
        is_system: line.is_system(),
        text,
        truncated,
        send_date: line
            .object()
            .get("send_date")
            .and_then(|v| v.as_str())
            .map(str::to_owned),
        turn: turn_of(line, session),
    }
}

/// A page of the session's chat.
#[utoipa::path(get, path = "/api/v1/sessions/{session}/chat", tag = "sessions",
    params(("session" = String, Path, description = "The session id"), ChatQuery),
    responses((status = 200, body = ChatPage),
        (status = 404, body = ErrorBody, description = "the session is not bound, its chat is gone, or the turn has no message in it")))]
pub async fn chat(
    State(api): State<Api>,
    Path(session): Path<String>,
    Query(q): Query<ChatQuery>,
) -> Result<Json<ChatPage>, ApiError> {
    let session = session_id(&session)?;
    let limit = page_limit(q.limit, 30, MAX_CHAT_PAGE)?;
    let binding = crate::routes::sessions::bound(&api, &session).await?;
    let target = binding.target();
    let messages = messages_of(&api, &target.character, &target.chat_id).await?;
    let total = messages.len();
    let me = session.as_str();
    let (offset, turn_messages, turn_total) = match q.turn {
        Some(turn) => {
            let mut hits = messages
                .iter()
                .enumerate()
                .filter(|(_, l)| turn_of(l, me) == Some(turn))
                .map(|(i, _)| i);
            let Some(first) = hits.next() else {
                return Err(ApiError::NotFound(format!(
                    "turn {turn} has no message in chat {}",
                    target.chat_id
                )));
            };
            // Context before the turn, but never so much that the turn falls off the page.
            let offset = first.saturating_sub(TURN_CONTEXT.min(limit - 1));
            let end = offset + limit;
            let mut on_page = vec![first];
            let mut total = 1;
            for i in hits {
                total += 1;
                if i < end {
                    on_page.push(i);
                }
            }
            (offset, on_page, total)
        }
        None => (q.offset.unwrap_or(0).min(total), Vec::new(), 0),
    };
    let page = messages
        .iter()
        .enumerate()
        .skip(offset)
        .take(limit)
        .map(|(i, l)| message(i, l, me))
        .collect();
    Ok(Json(ChatPage {
        session: session.to_string(),
        character: target.character.to_string(),
        chat: target.chat_id.to_string(),
        total,
        offset,
        messages: page,
        turn_messages,
        turn_total,
    }))
}
