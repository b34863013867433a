//! Chats, state, checkpoints and prompts on PostgreSQL: rows and JSON documents written under
//! compare-and-set in transactions (`SELECT … FOR UPDATE`).

use async_trait::async_trait;
use serde_json::Value;
use tavern_core::chat::ChatLine;
use tavern_core::{normalize_state, CharacterName, ChatId, Diagnostic, SessionId, TavernState};
use tokio_postgres::Row;

use super::{db, encode, PgStore};
use crate::chat::{check_not_empty, ChatChange, ChatFile, ChatRevision, ChatStore};
use crate::checkpoint::{CheckpointStatus, CheckpointStore, ProjectorCheckpoint};
use crate::error::{StoreError, Target};
use crate::prompt::{PromptStore, SessionPrompt};
use crate::state::{StateMutation, StateStore, Verdict};

/// Where a chat's revision stands: its change number, the change number of its last rewrite,
/// and how many lines it has. Only lines were appended between two revisions with the same
/// rewrite number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChatPos {
    revision: i64,
    rewritten: i64,
    lines: i32,
}

impl ChatPos {
    fn of(row: &Row) -> Result<Self, StoreError> {
        Ok(Self {
            revision: row.try_get(0).map_err(db("read chat"))?,
            rewritten: row.try_get(1).map_err(db("read chat"))?,
            lines: row.try_get(2).map_err(db("read chat"))?,
        })
    }

    fn to_revision(self) -> ChatRevision {
        ChatRevision::new(format!(
            "p1-{}-{}-{}",
            self.revision, self.rewritten, self.lines
        ))
    }

    /// A revision this adapter issued; anything else is `None`.
    fn parse(revision: &ChatRevision) -> Option<Self> {
        let mut parts = revision.as_str().strip_prefix("p1-")?.split('-');
        let pos = Self {
            revision: parts.next()?.parse().ok()?,
            rewritten: parts.next()?.parse().ok()?,
            lines: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(pos)
    }
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

const SELECT_CHAT: &str = "SELECT revision, rewritten, line_count FROM chats
    WHERE character = $1 AND chat = $2";

const INSERT_LINES: &str = "INSERT INTO chat_lines (character, chat, n, line)
    SELECT $1, $2, t.n, t.line FROM unnest($3::integer[], $4::text[]) AS t(n, line)";

impl PgStore {
    async fn insert_lines(
        tx: &deadpool_postgres::Transaction<'_>,
        character: &CharacterName,
        chat: &ChatId,
        first: i32,
        lines: &[ChatLine],
    ) -> Result<i32, StoreError> {
        let count = i32::try_from(lines.len()).map_err(|_| too_long(lines.len()))?;
        let end = first
            .checked_add(count)
            .ok_or_else(|| too_long(lines.len()))?;
        let ns: Vec<i32> = (first..end).collect();
        let texts: Vec<&str> = lines.iter().map(ChatLine::raw).collect();
        tx.execute(
            INSERT_LINES,
            &[&character.as_str(), &chat.as_str(), &ns, &texts],
        )
        .await
        .map_err(db("write chat"))?;
        Ok(end)
    }
}

#[async_trait]
impl ChatStore for PgStore {
    async fn list_chats(&self, character: &CharacterName) -> Result<Vec<ChatId>, StoreError> {
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
    }

    async fn read_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatFile>, StoreError> {
        let client = self.inner.client("read chat").await?;
        // One statement: one snapshot of the header row and its lines.
        let rows = client
            .query(
                "SELECT c.revision, c.rewritten, c.line_count, l.line FROM chats c
                 LEFT JOIN chat_lines l ON l.character = c.character AND l.chat = c.chat
                 WHERE c.character = $1 AND c.chat = $2 ORDER BY l.n",
                &[&character.as_str(), &chat.as_str()],
            )
            .await
            .map_err(db("read chat"))?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let pos = ChatPos::of(first)?;
        let lines = parse_rows(&rows, 3, 0, &chat_name(character, chat))?;
        Ok(Some(ChatFile {
            lines,
            revision: pos.to_revision(),
        }))
    }

    async fn chat_revision(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatRevision>, StoreError> {
        let client = self.inner.client("read chat").await?;
        let row = client
            .query_opt(SELECT_CHAT, &[&character.as_str(), &chat.as_str()])
            .await
            .map_err(db("read chat"))?;
        row.map(|r| ChatPos::of(&r).map(ChatPos::to_revision))
            .transpose()
    }

    async fn read_chat_since(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        since: &ChatRevision,
    ) -> Result<Option<ChatChange>, StoreError> {
        let Some(before) = ChatPos::parse(since) else {
            return Ok(self
                .read_chat(character, chat)
                .await?
                .map(ChatChange::Whole));
        };
        let mut client = self.inner.client("read chat").await?;
        // Repeatable read: the position and the lines after it from one snapshot.
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
        let now = ChatPos::of(&row)?;
        let name = chat_name(character, chat);
        if now == before {
            return Ok(Some(ChatChange::Unchanged));
        }
        let appended_only = now.rewritten == before.rewritten && now.lines >= before.lines;
        let first = if appended_only { before.lines } else { 0 };
        let rows = tx
            .query(
                "SELECT line FROM chat_lines WHERE character = $1 AND chat = $2 AND n >= $3
                 ORDER BY n",
                &[&character.as_str(), &chat.as_str(), &first],
            )
            .await
            .map_err(db("read chat"))?;
        tx.commit().await.map_err(db("read chat"))?;
        let lines = parse_rows(&rows, 0, first, &name)?;
        let revision = now.to_revision();
        Ok(Some(if appended_only {
            ChatChange::Appended { lines, revision }
        } else {
            ChatChange::Whole(ChatFile { lines, revision })
        }))
    }

    async fn append_lines(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: &ChatRevision,
    ) -> Result<ChatRevision, StoreError> {
        let mut client = self.inner.client("write chat").await?;
        let tx = client.transaction().await.map_err(db("write chat"))?;
        let Some(row) = tx
            .query_opt(
                "SELECT revision, rewritten, line_count FROM chats
                 WHERE character = $1 AND chat = $2 FOR UPDATE",
                &[&character.as_str(), &chat.as_str()],
            )
            .await
            .map_err(db("write chat"))?
        else {
            return Err(StoreError::NotFound {
                target: chat_target(character, chat),
            });
        };
        let pos = ChatPos::of(&row)?;
        if &pos.to_revision() != expected {
            return Err(StoreError::Conflict {
                target: chat_target(character, chat),
                current: None,
            });
        }
        // Nothing to append: nothing changed, so the revision stays (as FsStore's does).
        if lines.is_empty() {
            return Ok(expected.clone());
        }
        let end = Self::insert_lines(&tx, character, chat, pos.lines, lines).await?;
        let row = tx
            .query_one(
                "UPDATE chats SET revision = nextval('chat_revisions'), line_count = $3
                 WHERE character = $1 AND chat = $2 RETURNING revision, rewritten, line_count",
                &[&character.as_str(), &chat.as_str(), &end],
            )
            .await
            .map_err(db("write chat"))?;
        let next = ChatPos::of(&row)?;
        tx.commit().await.map_err(db("write chat"))?;
        Ok(next.to_revision())
    }

    async fn rewrite_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: Option<&ChatRevision>,
    ) -> Result<ChatRevision, StoreError> {
        check_not_empty(lines)?;
        let conflict = || StoreError::Conflict {
            target: chat_target(character, chat),
            current: None,
        };
        let mut client = self.inner.client("write chat").await?;
        let tx = client.transaction().await.map_err(db("write chat"))?;
        let current = tx
            .query_opt(
                "SELECT revision, rewritten, line_count FROM chats
                 WHERE character = $1 AND chat = $2 FOR UPDATE",
                &[&character.as_str(), &chat.as_str()],
            )
            .await
            .map_err(db("write chat"))?
            .map(|row| ChatPos::of(&row))
            .transpose()?;
        match (current, expected) {
            (None, None) => {
                // Two creators racing: the second insert finds the first one's row.
                let created = tx
                    .execute(
                        "INSERT INTO chats (character, chat, revision, rewritten, line_count)
                         VALUES ($1, $2, 0, 0, 0) ON CONFLICT DO NOTHING",
                        &[&character.as_str(), &chat.as_str()],
                    )
                    .await
                    .map_err(db("write chat"))?;
                if created != 1 {
                    return Err(conflict());
                }
            }
            (Some(pos), Some(expected)) if &pos.to_revision() == expected => {
                tx.execute(
                    "DELETE FROM chat_lines WHERE character = $1 AND chat = $2",
                    &[&character.as_str(), &chat.as_str()],
                )
                .await
                .map_err(db("write chat"))?;
            }
            _ => return Err(conflict()),
        }
        let end = Self::insert_lines(&tx, character, chat, 0, lines).await?;
        let row = tx
            .query_one(
                "UPDATE chats SET revision = nextval('chat_revisions'), line_count = $3
                 WHERE character = $1 AND chat = $2 RETURNING revision, revision, line_count",
                &[&character.as_str(), &chat.as_str(), &end],
            )
            .await
            .map_err(db("write chat"))?;
        let next = ChatPos::of(&row)?;
        tx.execute(
            "UPDATE chats SET rewritten = revision WHERE character = $1 AND chat = $2",
            &[&character.as_str(), &chat.as_str()],
        )
        .await
        .map_err(db("write chat"))?;
        tx.commit().await.map_err(db("write chat"))?;
        Ok(next.to_revision())
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

#[async_trait]
impl StateStore for PgStore {
    async fn load_state(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError> {
        let client = self.inner.client("load state").await?;
        let row = client
            .query_opt("SELECT doc FROM state WHERE id = 1", &[])
            .await
            .map_err(db("load state"))?;
        let doc: Option<&str> = match &row {
            Some(row) => row.try_get(0).map_err(db("load state"))?,
            None => None,
        };
        Ok(state_of(doc))
    }

    async fn update_state(&self, mutate: StateMutation<'_>) -> Result<TavernState, StoreError> {
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
        tx.execute(
            "INSERT INTO state (id, doc) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET doc = EXCLUDED.doc",
            &[&text],
        )
        .await
        .map_err(db("update state"))?;
        tx.commit().await.map_err(db("update state"))?;
        Ok(normalize_state(&json).0)
    }
}

#[async_trait]
impl CheckpointStore for PgStore {
    async fn load_checkpoint(
        &self,
        session: &SessionId,
    ) -> Result<Option<ProjectorCheckpoint>, StoreError> {
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
    }

    async fn save_checkpoint(
        &self,
        checkpoint: &ProjectorCheckpoint,
        expected: Option<&ProjectorCheckpoint>,
    ) -> Result<(), StoreError> {
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
    }

    async fn pending_checkpoints(&self) -> Result<Vec<ProjectorCheckpoint>, StoreError> {
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
    }

    async fn save_prompt(
        &self,
        session: &SessionId,
        text: &str,
    ) -> Result<Option<SessionPrompt>, StoreError> {
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
    }

    async fn reset_prompt(&self, session: &SessionId) -> Result<bool, StoreError> {
        let client = self.inner.client("reset prompt").await?;
        let n = client
            .execute(
                "DELETE FROM prompts WHERE session = $1",
                &[&session.as_str()],
            )
            .await
            .map_err(db("reset prompt"))?;
        Ok(n > 0)
    }
}
