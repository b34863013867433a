//! Chats, state, checkpoints and prompts on PostgreSQL: rows and JSON documents written under
//! compare-and-set in transactions (`SELECT … FOR UPDATE`).

use std::sync::{Arc, PoisonError};

use async_trait::async_trait;
use serde_json::Value;
use tavern_core::chat::ChatLine;
use tavern_core::chat_digest::ChatDigest;
use tavern_core::{
    normalize_state, CharacterName, ChatId, Diagnostic, SessionBinding, SessionId, TavernState,
};
use tokio_postgres::Row;

use super::{db, encode, PgStore};
use crate::chat::{check_not_empty, ChatChange, ChatFile, ChatRevision, ChatStore};
use crate::checkpoint::{CheckpointStatus, CheckpointStore, ProjectorCheckpoint};
use crate::error::{StoreError, Target};
use crate::prompt::{PromptStore, SessionPrompt};
use crate::state::{StateMutation, StateStore, StateView, Verdict};

/// A chat's row: its line count, byte length and content digest (the chain continues from
/// the digest, so an append digests only the new lines).
fn chat_digest(row: &Row) -> Result<ChatDigest, StoreError> {
    let lines: i32 = row.try_get(0).map_err(db("read chat"))?;
    let bytes: i64 = row.try_get(1).map_err(db("read chat"))?;
    let chain: &[u8] = row.try_get(2).map_err(db("read chat"))?;
    let chain: [u8; 32] = chain.try_into().map_err(|_| StoreError::Corrupt {
        file: "chats".into(),
        reason: format!("a chat digest of {} bytes, not 32", chain.len()),
    })?;
    Ok(ChatDigest::from_parts(
        chain,
        u64::try_from(lines).unwrap_or(0),
        u64::try_from(bytes).unwrap_or(0),
    ))
}

fn chat_target(character: &CharacterName, chat: &ChatId) -> Box<Target> {
    Box::new(Target::Chat {
        character: character.clone(),
        chat: chat.clone(),
    })
}

fn chat_name(character: &CharacterName, chat: &ChatId) -> String {
    format!("chat {chat} of {character}")
}

fn too_long(n: usize) -> StoreError {
    StoreError::LimitExceeded {
        limit: "chat lines",
        max: i32::MAX as usize,
        actual: n,
    }
}

/// Parses stored lines, naming the chat and line on failure.
fn parse_rows(
    rows: &[Row],
    column: usize,
    first: i32,
    name: &str,
) -> Result<Vec<ChatLine>, StoreError> {
    let mut lines = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let text: Option<&str> = row.try_get(column).map_err(db("read chat"))?;
        let Some(text) = text else { continue };
        lines.push(ChatLine::parse(text).map_err(|e| StoreError::Corrupt {
            file: format!("{name} line {}", i as i64 + i64::from(first) + 1),
            reason: e.to_string(),
        })?);
    }
    Ok(lines)
}

const SELECT_CHAT: &str = "SELECT line_count, bytes, digest FROM chats
    WHERE character = $1 AND chat = $2";

const LOCK_CHAT: &str = "SELECT line_count, bytes, digest FROM chats
    WHERE character = $1 AND chat = $2 FOR UPDATE";

const INSERT_LINES: &str = "INSERT INTO chat_lines (character, chat, n, line, digest)
    SELECT $1, $2, t.n, t.line, t.digest
    FROM unnest($3::integer[], $4::text[], $5::bytea[]) AS t(n, line, digest)";

const UPDATE_CHAT: &str = "UPDATE chats SET line_count = $3, bytes = $4, digest = $5
    WHERE character = $1 AND chat = $2";

impl PgStore {
    /// Inserts `lines` after the chat's first `digest.segments()` lines, each with the digest
    /// of the chat up to it, and records the chat's new length and digest (which it returns).
    async fn insert_lines(
        tx: &deadpool_postgres::Transaction<'_>,
        character: &CharacterName,
        chat: &ChatId,
        mut digest: ChatDigest,
        lines: &[ChatLine],
    ) -> Result<ChatDigest, StoreError> {
        let first = i32::try_from(digest.segments()).map_err(|_| too_long(lines.len()))?;
        let count = i32::try_from(lines.len()).map_err(|_| too_long(lines.len()))?;
        let end = first
            .checked_add(count)
            .ok_or_else(|| too_long(lines.len()))?;
        let ns: Vec<i32> = (first..end).collect();
        let texts: Vec<&str> = lines.iter().map(ChatLine::raw).collect();
        let chains: Vec<Vec<u8>> = lines
            .iter()
            .map(|line| {
                digest.push_segment(line.raw().as_bytes());
                digest.chain().to_vec()
            })
            .collect();
        let (character, chat) = (character.as_str(), chat.as_str());
        tx.execute(INSERT_LINES, &[&character, &chat, &ns, &texts, &chains])
            .await
            .map_err(db("write chat"))?;
        let bytes = i64::try_from(digest.bytes()).map_err(|_| too_long(lines.len()))?;
        tx.execute(
            UPDATE_CHAT,
            &[&character, &chat, &end, &bytes, &digest.chain().as_slice()],
        )
        .await
        .map_err(db("write chat"))?;
        Ok(digest)
    }
}

#[async_trait]
impl ChatStore for PgStore {
    async fn list_chats(&self, character: &CharacterName) -> Result<Vec<ChatId>, StoreError> {
        self.inner
            .bounded("list chats", async move {
                let client = self.inner.client("list chats").await?;
                let rows = client
                    .query(
                        "SELECT chat FROM chats WHERE character = $1",
                        &[&character.as_str()],
                    )
                    .await
                    .map_err(db("list chats"))?;
                let mut out = Vec::with_capacity(rows.len());
                for row in &rows {
                    let name: &str = row.try_get(0).map_err(db("list chats"))?;
                    out.push(ChatId::parse(name).map_err(|e| StoreError::Corrupt {
                        file: format!("chats of {character}"),
                        reason: e.to_string(),
                    })?);
                }
                // Sorted as ids sort (the database's collation may differ).
                out.sort();
                Ok(out)
            })
            .await
    }

    async fn read_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatFile>, StoreError> {
        self.inner
            .bounded("read chat", async move {
                let client = self.inner.client("read chat").await?;
                // One statement: one snapshot of the header row and its lines.
                let rows = client
                    .query(
                        "SELECT c.line_count, c.bytes, c.digest, l.line FROM chats c
                 LEFT JOIN chat_lines l ON l.character = c.character AND l.chat = c.chat
                 WHERE c.character = $1 AND c.chat = $2 ORDER BY l.n",
                        &[&character.as_str(), &chat.as_str()],
                    )
                    .await
                    .map_err(db("read chat"))?;
                let Some(first) = rows.first() else {
                    return Ok(None);
                };
                let digest = chat_digest(first)?;
                let lines = parse_rows(&rows, 3, 0, &chat_name(character, chat))?;
                Ok(Some(ChatFile {
                    lines,
                    revision: ChatRevision::of_content(&digest),
                }))
            })
            .await
    }

    async fn chat_revision(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatRevision>, StoreError> {
        self.inner
            .bounded("chat revision", async move {
                let client = self.inner.client("read chat").await?;
                let row = client
                    .query_opt(SELECT_CHAT, &[&character.as_str(), &chat.as_str()])
                    .await
                    .map_err(db("read chat"))?;
                row.map(|r| chat_digest(&r).map(|d| ChatRevision::of_content(&d)))
                    .transpose()
            })
            .await
    }

    /// One row: the chat's first line.
    async fn read_chat_head(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatLine>, StoreError> {
        self.inner
            .bounded("read chat head", async move {
                let client = self.inner.client("read chat head").await?;
                let row = client
                    .query_opt(
                        "SELECT line FROM chat_lines WHERE character = $1 AND chat = $2
                         ORDER BY n LIMIT 1",
                        &[&character.as_str(), &chat.as_str()],
                    )
                    .await
                    .map_err(db("read chat head"))?;
                let Some(row) = row else { return Ok(None) };
                Ok(parse_rows(
                    std::slice::from_ref(&row),
                    0,
                    0,
                    &chat_name(character, chat),
                )?
                .into_iter()
                .next())
            })
            .await
    }

    async fn read_chat_since(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        since: &ChatRevision,
    ) -> Result<Option<ChatChange>, StoreError> {
        self.inner
            .bounded("read chat since", async move {
                let Some(before) = since.content() else {
                    return Ok(self
                        .read_chat(character, chat)
                        .await?
                        .map(ChatChange::Whole));
                };
                let mut client = self.inner.client("read chat").await?;
                // Repeatable read: the chat's row, the digest at `since`'s length and the lines after
                // it from one snapshot.
                let tx = client
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .await
                    .map_err(db("read chat"))?;
                let Some(row) = tx
                    .query_opt(SELECT_CHAT, &[&character.as_str(), &chat.as_str()])
                    .await
                    .map_err(db("read chat"))?
                else {
                    return Ok(None);
                };
                let now = chat_digest(&row)?;
                if before.names(&now) {
                    return Ok(Some(ChatChange::Unchanged));
                }
                // Lines were only appended when the chat's first lines are `since`'s content: the
                // digest stored with its last line is the one `since` names.
                let old_lines = i32::try_from(before.segments)
                    .ok()
                    .filter(|n| u64::try_from(*n).is_ok_and(|n| n <= now.segments()));
                let appended_only = match old_lines {
                    Some(0) => before.names(&ChatDigest::empty()),
                    Some(n) => {
                        let row = tx
                            .query_opt(
                                "SELECT digest FROM chat_lines WHERE character = $1 AND chat = $2
                         AND n = $3",
                                &[&character.as_str(), &chat.as_str(), &(n - 1)],
                            )
                            .await
                            .map_err(db("read chat"))?;
                        let chain: Option<&[u8]> = match &row {
                            Some(row) => row.try_get(0).map_err(db("read chat"))?,
                            None => None,
                        };
                        chain
                            .and_then(|c| <[u8; 32]>::try_from(c).ok())
                            .is_some_and(|c| before.matches_chain(&c))
                    }
                    None => false,
                };
                let first = if appended_only {
                    old_lines.unwrap_or(0)
                } else {
                    0
                };
                let rows = tx
                    .query(
                        "SELECT line FROM chat_lines WHERE character = $1 AND chat = $2 AND n >= $3
                 ORDER BY n",
                        &[&character.as_str(), &chat.as_str(), &first],
                    )
                    .await
                    .map_err(db("read chat"))?;
                tx.commit().await.map_err(db("read chat"))?;
                let lines = parse_rows(&rows, 0, first, &chat_name(character, chat))?;
                let revision = ChatRevision::of_content(&now);
                Ok(Some(if appended_only {
                    ChatChange::Appended { lines, revision }
                } else {
                    ChatChange::Whole(ChatFile { lines, revision })
                }))
            })
            .await
    }

    async fn append_lines(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: &ChatRevision,
    ) -> Result<ChatRevision, StoreError> {
        self.inner
            .bounded("append lines", async move {
                let mut client = self.inner.client("write chat").await?;
                let tx = client.transaction().await.map_err(db("write chat"))?;
                let Some(row) = tx
                    .query_opt(LOCK_CHAT, &[&character.as_str(), &chat.as_str()])
                    .await
                    .map_err(db("write chat"))?
                else {
                    return Err(StoreError::NotFound {
                        target: chat_target(character, chat),
                    });
                };
                let digest = chat_digest(&row)?;
                if !expected.names(&digest) {
                    return Err(StoreError::Conflict {
                        target: chat_target(character, chat),
                        current: None,
                    });
                }
                // Nothing to append: nothing changed, so the revision stays (as FsStore's does).
                if lines.is_empty() {
                    return Ok(expected.clone());
                }
                let next = Self::insert_lines(&tx, character, chat, digest, lines).await?;
                tx.commit().await.map_err(db("write chat"))?;
                Ok(ChatRevision::of_content(&next))
            })
            .await
    }

    async fn rewrite_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: Option<&ChatRevision>,
    ) -> Result<ChatRevision, StoreError> {
        self.inner
            .bounded("rewrite chat", async move {
                check_not_empty(lines)?;
                let conflict = || StoreError::Conflict {
                    target: chat_target(character, chat),
                    current: None,
                };
                let mut client = self.inner.client("write chat").await?;
                let tx = client.transaction().await.map_err(db("write chat"))?;
                let current = tx
                    .query_opt(LOCK_CHAT, &[&character.as_str(), &chat.as_str()])
                    .await
                    .map_err(db("write chat"))?
                    .map(|row| chat_digest(&row))
                    .transpose()?;
                match (current, expected) {
                    (None, None) => {
                        // Two creators racing: the second insert finds the first one's row.
                        let created = tx
                            .execute(
                                "INSERT INTO chats (character, chat, line_count, bytes, digest)
                         VALUES ($1, $2, 0, 0, $3) ON CONFLICT DO NOTHING",
                                &[
                                    &character.as_str(),
                                    &chat.as_str(),
                                    &ChatDigest::empty().chain().as_slice(),
                                ],
                            )
                            .await
                            .map_err(db("write chat"))?;
                        if created != 1 {
                            return Err(conflict());
                        }
                    }
                    (Some(digest), Some(expected)) if expected.names(&digest) => {
                        tx.execute(
                            "DELETE FROM chat_lines WHERE character = $1 AND chat = $2",
                            &[&character.as_str(), &chat.as_str()],
                        )
                        .await
                        .map_err(db("write chat"))?;
                    }
                    _ => return Err(conflict()),
                }
                let next =
                    Self::insert_lines(&tx, character, chat, ChatDigest::empty(), lines).await?;
                tx.commit().await.map_err(db("write chat"))?;
                Ok(ChatRevision::of_content(&next))
            })
            .await
    }
}

/// The stored state document as the normalizer reads it; `None` (never written) is the
/// default state. An unreadable document reads as the default with a diagnostic.
fn state_of(doc: Option<&str>) -> (TavernState, Vec<Diagnostic>) {
    let Some(doc) = doc else {
        return (TavernState::default(), Vec::new());
    };
    match serde_json::from_str::<Value>(doc) {
        Ok(raw) => normalize_state(&raw),
        Err(e) => (
            TavernState::default(),
            vec![Diagnostic {
                path: String::new(),
                message: format!("stored state unreadable ({e}); using defaults"),
            }],
        ),
    }
}

/// The state as a process last read it: the row version it read (`xmin`, which every update
/// of the row changes) and the state normalized from that version.
pub(super) type CachedState = Option<(String, Arc<(TavernState, Vec<Diagnostic>)>)>;

impl PgStore {
    /// The current state in one round trip that carries the document only when the row changed
    /// since this process last read it: a host asks per event and per request, and the state
    /// holds every session's binding.
    async fn current_state(&self) -> Result<Arc<(TavernState, Vec<Diagnostic>)>, StoreError> {
        let known = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(version, _)| version.clone());
        let client = self.inner.client("load state").await?;
        let row = client
            .query_opt(
                "SELECT xmin::text, xmin::text = $1, CASE WHEN xmin::text = $1 THEN NULL ELSE doc END
                 FROM state WHERE id = 1",
                &[&known.as_deref().unwrap_or("")],
            )
            .await
            .map_err(db("load state"))?;
        let Some(row) = row else {
            return Ok(Arc::new(state_of(None)));
        };
        let version: String = row.try_get(0).map_err(db("load state"))?;
        let unchanged: bool = row.try_get(1).map_err(db("load state"))?;
        let mut cache = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if unchanged {
            if let Some((_, state)) = cache.as_ref().filter(|(v, _)| *v == version) {
                return Ok(state.clone());
            }
        }
        let doc: Option<&str> = row.try_get(2).map_err(db("load state"))?;
        let state = Arc::new(state_of(doc));
        *cache = Some((version, state.clone()));
        Ok(state)
    }
}

#[async_trait]
impl StateStore for PgStore {
    async fn load_state(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError> {
        self.inner
            .bounded("load state", async move {
                Ok((*self.current_state().await?).clone())
            })
            .await
    }

    async fn view_state(&self, view: StateView<'_>) -> Result<(), StoreError> {
        self.inner
            .bounded("view state", async move {
                view(&self.current_state().await?.0);
                Ok(())
            })
            .await
    }

    async fn binding(&self, session: &SessionId) -> Result<Option<SessionBinding>, StoreError> {
        self.inner
            .bounded("binding", async move {
                Ok(self.current_state().await?.0.binding(session).cloned())
            })
            .await
    }

    async fn update_state(&self, mutate: StateMutation<'_>) -> Result<TavernState, StoreError> {
        self.inner
            .bounded("update state", async move {
                let mut client = self.inner.client("update state").await?;
                let tx = client.transaction().await.map_err(db("update state"))?;
                // The row is created by the first migration; locking it serializes every update.
                let row = tx
                    .query_opt("SELECT doc FROM state WHERE id = 1 FOR UPDATE", &[])
                    .await
                    .map_err(db("update state"))?;
                let doc: Option<&str> = match &row {
                    Some(row) => row.try_get(0).map_err(db("update state"))?,
                    None => None,
                };
                let (before, _) = state_of(doc);
                // The mutation borrows from the caller, so it runs here, on the caller's task, with
                // the row locked; dropping this future rolls back and writes nothing.
                let mut state = before.clone();
                if mutate(&mut state) == Verdict::Keep {
                    return Ok(before);
                }
                let json = state.to_json();
                let text = encode(&json, "the state")?;
                let written = tx
                    .query_one(
                        "INSERT INTO state (id, doc) VALUES (1, $1)
                 ON CONFLICT (id) DO UPDATE SET doc = EXCLUDED.doc RETURNING xmin::text",
                        &[&text],
                    )
                    .await
                    .map_err(db("update state"))?;
                let version: String = written.try_get(0).map_err(db("update state"))?;
                tx.commit().await.map_err(db("update state"))?;
                let after = normalize_state(&json);
                let state = after.0.clone();
                *self
                    .inner
                    .state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some((version, Arc::new(after)));
                Ok(state)
            })
            .await
    }
}

#[async_trait]
impl CheckpointStore for PgStore {
    async fn load_checkpoint(
        &self,
        session: &SessionId,
    ) -> Result<Option<ProjectorCheckpoint>, StoreError> {
        self.inner
            .bounded("load checkpoint", async move {
                let client = self.inner.client("load checkpoint").await?;
                let row = client
                    .query_opt(
                        "SELECT doc FROM checkpoints WHERE session = $1",
                        &[&session.as_str()],
                    )
                    .await
                    .map_err(db("load checkpoint"))?;
                Ok(match row {
                    Some(row) => self.checkpoint_of(&row, session)?,
                    None => None,
                })
            })
            .await
    }

    async fn save_checkpoint(
        &self,
        checkpoint: &ProjectorCheckpoint,
        expected: Option<&ProjectorCheckpoint>,
    ) -> Result<(), StoreError> {
        self.inner
            .bounded("save checkpoint", async move {
                let session = &checkpoint.session_id;
                let conflict = || StoreError::Conflict {
                    target: Box::new(Target::Checkpoint(session.clone())),
                    current: None,
                };
                let doc = encode(checkpoint, "a checkpoint")?;
                let pending = checkpoint.status == CheckpointStatus::Pending;
                let mut client = self.inner.client("save checkpoint").await?;
                let tx = client.transaction().await.map_err(db("save checkpoint"))?;
                let row = tx
                    .query_opt(
                        "SELECT doc FROM checkpoints WHERE session = $1 FOR UPDATE",
                        &[&session.as_str()],
                    )
                    .await
                    .map_err(db("save checkpoint"))?;
                let written = match row {
                    None if expected.is_none() => tx
                        .execute(
                            "INSERT INTO checkpoints (session, doc, pending) VALUES ($1, $2, $3)
                     ON CONFLICT DO NOTHING",
                            &[&session.as_str(), &doc, &pending],
                        )
                        .await
                        .map_err(db("save checkpoint"))?,
                    None => return Err(conflict()),
                    Some(row) => {
                        if self.checkpoint_of(&row, session)?.as_ref() != expected {
                            return Err(conflict());
                        }
                        tx.execute(
                            "UPDATE checkpoints SET doc = $2, pending = $3 WHERE session = $1",
                            &[&session.as_str(), &doc, &pending],
                        )
                        .await
                        .map_err(db("save checkpoint"))?
                    }
                };
                if written != 1 {
                    return Err(conflict());
                }
                tx.commit().await.map_err(db("save checkpoint"))
            })
            .await
    }

    async fn pending_checkpoints(&self) -> Result<Vec<ProjectorCheckpoint>, StoreError> {
        self.inner
            .bounded("pending checkpoints", async move {
                let client = self.inner.client("list checkpoints").await?;
                let rows = client
                    .query(
                        "SELECT doc, session FROM checkpoints WHERE pending ORDER BY session",
                        &[],
                    )
                    .await
                    .map_err(db("list checkpoints"))?;
                let mut out = Vec::new();
                for row in &rows {
                    let doc: &str = row.try_get(0).map_err(db("list checkpoints"))?;
                    let session: &str = row.try_get(1).map_err(db("list checkpoints"))?;
                    match serde_json::from_str::<ProjectorCheckpoint>(doc) {
                        Ok(cp) if cp.status == CheckpointStatus::Pending => out.push(cp),
                        Ok(_) => {}
                        // One unreadable checkpoint does not hide every other session's state.
                        Err(e) => self.inner.diag(
                            format!("checkpoint of session {session}"),
                            format!("unreadable ({e}); skipped"),
                        ),
                    }
                }
                out.sort_by(|a, b| a.session_id.cmp(&b.session_id));
                Ok(out)
            })
            .await
    }
}

impl PgStore {
    /// A stored checkpoint; an unreadable one (or one for another session) reads as `None`
    /// with a diagnostic.
    fn checkpoint_of(
        &self,
        row: &Row,
        session: &SessionId,
    ) -> Result<Option<ProjectorCheckpoint>, StoreError> {
        let doc: &str = row.try_get(0).map_err(db("load checkpoint"))?;
        match serde_json::from_str::<ProjectorCheckpoint>(doc) {
            Ok(cp) if &cp.session_id == session => Ok(Some(cp)),
            Ok(_) => {
                self.inner.diag(
                    format!("checkpoint of session {session}"),
                    "record for another session; ignored".into(),
                );
                Ok(None)
            }
            Err(e) => {
                self.inner.diag(
                    format!("checkpoint of session {session}"),
                    format!("unreadable ({e}); ignored"),
                );
                Ok(None)
            }
        }
    }
}

#[async_trait]
impl PromptStore for PgStore {
    async fn get_prompt(&self, session: &SessionId) -> Result<Option<SessionPrompt>, StoreError> {
        self.inner
            .bounded("get prompt", async move {
                let client = self.inner.client("read prompt").await?;
                let row = client
                    .query_opt(
                        "SELECT doc FROM prompts WHERE session = $1",
                        &[&session.as_str()],
                    )
                    .await
                    .map_err(db("read prompt"))?;
                let Some(row) = row else { return Ok(None) };
                let doc: &str = row.try_get(0).map_err(db("read prompt"))?;
                match serde_json::from_str::<SessionPrompt>(doc) {
                    Ok(p) if &p.session_id == session && !p.text.trim().is_empty() => Ok(Some(p)),
                    Ok(_) => {
                        self.inner.diag(
                            format!("prompt of session {session}"),
                            "record for another session or empty; ignored".into(),
                        );
                        Ok(None)
                    }
                    Err(e) => {
                        self.inner.diag(
                            format!("prompt of session {session}"),
                            format!("unreadable ({e}); ignored"),
                        );
                        Ok(None)
                    }
                }
            })
            .await
    }

    async fn save_prompt(
        &self,
        session: &SessionId,
        text: &str,
    ) -> Result<Option<SessionPrompt>, StoreError> {
        self.inner
            .bounded("save prompt", async move {
                let prompt = SessionPrompt::to_save(session, text, self.inner.clock.now())?;
                let client = self.inner.client("save prompt").await?;
                match &prompt {
                    Some(p) => {
                        let doc = encode(p, "a prompt")?;
                        client
                            .execute(
                                "INSERT INTO prompts (session, doc) VALUES ($1, $2)
                         ON CONFLICT (session) DO UPDATE SET doc = EXCLUDED.doc",
                                &[&session.as_str(), &doc],
                            )
                            .await
                            .map_err(db("save prompt"))?;
                    }
                    None => {
                        client
                            .execute(
                                "DELETE FROM prompts WHERE session = $1",
                                &[&session.as_str()],
                            )
                            .await
                            .map_err(db("save prompt"))?;
                    }
                }
                Ok(prompt)
            })
            .await
    }

    async fn reset_prompt(&self, session: &SessionId) -> Result<bool, StoreError> {
        self.inner
            .bounded("reset prompt", async move {
                let client = self.inner.client("reset prompt").await?;
                let n = client
                    .execute(
                        "DELETE FROM prompts WHERE session = $1",
                        &[&session.as_str()],
                    )
                    .await
                    .map_err(db("reset prompt"))?;
                Ok(n > 0)
            })
            .await
    }
}
