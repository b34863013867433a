//! The strict in-memory adapter: every port, the same contracts as the file adapter (it shares
//! the engine), no persistence, plus fault injection so tests can exercise failure paths.
//! With the `testkit` feature it injects faults; one never triggered fails `assert_no_pending_faults`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tavern_core::chat::ChatLine;
use tavern_core::chat_digest::ChatDigest;
use tavern_core::{
    normalize_state, AuditEntry, CharacterName, ChatId, Diagnostic, MemoryId, MemoryRecord,
    MemorySource, MemoryWrite, Revision, ScopeKey, SessionBinding, SessionId, TavernState,
    VariableName, VariableRecord,
};

use crate::blocking::yield_once;
use crate::chat::{check_not_empty, ChatChange, ChatFile, ChatRevision, ChatStore};
use crate::checkpoint::{CheckpointStatus, CheckpointStore, ProjectorCheckpoint};
use crate::clock::{Clock, SystemClock};
use crate::engine::memory_table::{MemoryOp, MemoryTable};
use crate::engine::variable_table::VariableTable;
use crate::error::{StoreError, Target};
use crate::memory::{MemoryQuery, MemorySearchResult, MemoryStore};
use crate::prompt::{PromptStore, SessionPrompt};
use crate::state::{StateMutation, StateStore, StateView, Verdict};
use crate::variable::{PatchOutcome, VariableChange, VariableListing, VariableStore};

/// Locks a mutex, recovering the data if another thread panicked while holding it (the tables
/// are only mutated by `apply`, which leaves them consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Chats and the digest of each one's content (its revision, as every adapter issues it).
#[derive(Debug, Default)]
struct Chats {
    files: BTreeMap<(CharacterName, ChatId), (Vec<ChatLine>, ChatDigest)>,
}

/// In-memory implementation of every store port.
#[derive(Debug)]
pub struct MemStore {
    clock: Arc<dyn Clock>,
    memory: Mutex<MemoryTable>,
    variables: Mutex<VariableTable>,
    state: Mutex<TavernState>,
    chats: Mutex<Chats>,
    checkpoints: Mutex<BTreeMap<SessionId, ProjectorCheckpoint>>,
    prompts: Mutex<BTreeMap<SessionId, SessionPrompt>>,
    faults: Mutex<Vec<String>>,
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl MemStore {
    /// An empty store on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            memory: Mutex::new(MemoryTable::new()),
            variables: Mutex::new(VariableTable::new()),
            state: Mutex::default(),
            chats: Mutex::default(),
            checkpoints: Mutex::default(),
            prompts: Mutex::default(),
            faults: Mutex::default(),
        }
    }

    #[cfg(feature = "testkit")]
    /// Makes the next call of `op` (e.g. `chat.append`, `memory.put`, `prompt.save`) fail with
    /// [`StoreError::Injected`] without changing anything.
    pub fn fail_next(&self, op: &str) {
        lock(&self.faults).push(op.to_owned());
    }

    #[cfg(feature = "testkit")]
    /// Fails (returns `Err`) if an injected fault was never triggered: a test that set one up
    /// expected the code under test to reach it.
    ///
    /// # Errors
    /// The names of the faults still pending.
    pub fn assert_no_pending_faults(&self) -> Result<(), String> {
        let pending = lock(&self.faults);
        if pending.is_empty() {
            Ok(())
        } else {
            Err(format!("injected faults never reached: {pending:?}"))
        }
    }

    #[cfg(feature = "testkit")]
    /// Disarms every injected fault not triggered yet and returns them (for randomized tests
    /// where a fault may legitimately never be reached).
    pub fn clear_faults(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.faults))
    }

    #[cfg(feature = "testkit")]
    /// Simulates another program (a SillyTavern client) replacing a chat file behind the
    /// store's back.
    pub fn external_rewrite(&self, character: &CharacterName, chat: &ChatId, lines: Vec<ChatLine>) {
        let digest = digest_of(&lines);
        lock(&self.chats)
            .files
            .insert((character.clone(), chat.clone()), (lines, digest));
    }

    /// Runs a memory write: the injected fault for `op`, then the checked op, applied.
    fn write_memory(
        &self,
        op: &str,
        prepare: impl FnOnce(
            &MemoryTable,
            tavern_core::Timestamp,
        ) -> Result<(MemoryRecord, MemoryOp), StoreError>,
    ) -> Result<MemoryRecord, StoreError> {
        self.fault(op)?;
        let mut table = lock(&self.memory);
        let (record, op) = prepare(&table, self.clock.now())?;
        table.apply(op);
        Ok(record)
    }

    fn fault(&self, op: &str) -> Result<(), StoreError> {
        let mut faults = lock(&self.faults);
        if let Some(i) = faults.iter().position(|f| f == op) {
            faults.remove(i);
            return Err(StoreError::Injected(op.to_owned()));
        }
        Ok(())
    }
}

fn digest_of(lines: &[ChatLine]) -> ChatDigest {
    ChatDigest::of_lines(lines.iter().map(ChatLine::raw))
}

fn chat_target(character: &CharacterName, chat: &ChatId) -> Box<Target> {
    Box::new(Target::Chat {
        character: character.clone(),
        chat: chat.clone(),
    })
}

#[async_trait]
impl MemoryStore for MemStore {
    async fn search(&self, query: &MemoryQuery) -> Result<MemorySearchResult, StoreError> {
        yield_once().await;
        self.fault("memory.search")?;
        Ok(lock(&self.memory).search(query, self.clock.now()))
    }

    async fn read(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
    ) -> Result<Option<MemoryRecord>, StoreError> {
        yield_once().await;
        self.fault("memory.read")?;
        let now = self.clock.now();
        let mut table = lock(&self.memory);
        let found = table.read_live(scope, id, now).is_some();
        if !found {
            return Ok(None);
        }
        table.apply(MemoryOp::Touch {
            scope: scope.clone(),
            id: id.clone(),
            at: now,
        });
        Ok(table.read_live(scope, id, now).cloned())
    }

    async fn inspect(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
    ) -> Result<Option<MemoryRecord>, StoreError> {
        yield_once().await;
        self.fault("memory.inspect")?;
        Ok(lock(&self.memory).get(scope, id).cloned())
    }

    async fn put(
        &self,
        write: MemoryWrite,
        expected: Option<&Revision>,
        restore: bool,
    ) -> Result<MemoryRecord, StoreError> {
        yield_once().await;
        self.write_memory("memory.put", |t, now| {
            t.prepare_put(write, expected, restore, now)
        })
    }

    async fn forget(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
        expected: &Revision,
        source: MemorySource,
    ) -> Result<MemoryRecord, StoreError> {
        yield_once().await;
        self.write_memory("memory.forget", |t, now| {
            t.prepare_forget(id, scope, expected, source, now)
        })
    }

    async fn memory_audit(
        &self,
        scope: &ScopeKey,
        id: Option<&MemoryId>,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        yield_once().await;
        Ok(lock(&self.memory).audit(scope, id, self.clock.now()))
    }
}

#[async_trait]
impl VariableStore for MemStore {
    async fn get(
        &self,
        scope: &ScopeKey,
        name: &VariableName,
    ) -> Result<Option<VariableRecord>, StoreError> {
        yield_once().await;
        self.fault("variable.get")?;
        Ok(lock(&self.variables).get(scope, name).cloned())
    }

    async fn patch(
        &self,
        scope: &ScopeKey,
        changes: &[VariableChange],
        expected_scope: Option<&Revision>,
        source: MemorySource,
    ) -> Result<PatchOutcome, StoreError> {
        yield_once().await;
        self.fault("variable.write")?;
        let mut table = lock(&self.variables);
        let op = table.prepare_patch(scope, changes, expected_scope, &source, self.clock.now())?;
        let outcome = VariableTable::outcome(&op);
        table.apply(op);
        Ok(outcome)
    }

    async fn list(
        &self,
        scope: &ScopeKey,
        prefix: &str,
        limit: usize,
    ) -> Result<VariableListing, StoreError> {
        yield_once().await;
        Ok(lock(&self.variables).list(scope, prefix, limit))
    }

    async fn clear_scope(
        &self,
        scope: &ScopeKey,
        source: MemorySource,
    ) -> Result<usize, StoreError> {
        yield_once().await;
        self.fault("variable.write")?;
        let mut table = lock(&self.variables);
        match table.prepare_clear(scope, &source, self.clock.now()) {
            None => Ok(0),
            Some(op) => {
                let n = op.records.len();
                table.apply(op);
                Ok(n)
            }
        }
    }

    async fn variable_audit(&self, scope: &ScopeKey) -> Result<Vec<AuditEntry>, StoreError> {
        yield_once().await;
        Ok(lock(&self.variables).audit(scope))
    }
}

#[async_trait]
impl StateStore for MemStore {
    async fn load_state(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError> {
        yield_once().await;
        self.fault("state.load")?;
        Ok((lock(&self.state).clone(), Vec::new()))
    }

    async fn view_state(&self, view: StateView<'_>) -> Result<(), StoreError> {
        yield_once().await;
        self.fault("state.load")?;
        view(&lock(&self.state));
        Ok(())
    }

    async fn binding(&self, session: &SessionId) -> Result<Option<SessionBinding>, StoreError> {
        yield_once().await;
        self.fault("state.load")?;
        Ok(lock(&self.state).binding(session).cloned())
    }

    async fn update_state(&self, mutate: StateMutation<'_>) -> Result<TavernState, StoreError> {
        yield_once().await;
        self.fault("state.update")?;
        let mut current = lock(&self.state);
        // What a durable adapter would persist and read back: the normalized JSON form.
        let mut state = current.clone();
        if mutate(&mut state) == Verdict::Keep {
            return Ok(current.clone());
        }
        let (stored, _) = normalize_state(&state.to_json());
        *current = stored.clone();
        Ok(stored)
    }
}

#[async_trait]
impl ChatStore for MemStore {
    async fn list_chats(&self, character: &CharacterName) -> Result<Vec<ChatId>, StoreError> {
        yield_once().await;
        Ok(lock(&self.chats)
            .files
            .keys()
            .filter(|(c, _)| c == character)
            .map(|(_, id)| id.clone())
            .collect())
    }

    async fn read_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatFile>, StoreError> {
        yield_once().await;
        self.fault("chat.read")?;
        Ok(lock(&self.chats)
            .files
            .get(&(character.clone(), chat.clone()))
            .map(|(lines, digest)| ChatFile {
                lines: lines.clone(),
                revision: ChatRevision::of_content(digest),
            }))
    }

    async fn read_chat_since(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        since: &ChatRevision,
    ) -> Result<Option<ChatChange>, StoreError> {
        yield_once().await;
        self.fault("chat.read")?;
        let chats = lock(&self.chats);
        let Some((lines, digest)) = chats.files.get(&(character.clone(), chat.clone())) else {
            return Ok(None);
        };
        let revision = ChatRevision::of_content(digest);
        if &revision == since {
            return Ok(Some(ChatChange::Unchanged));
        }
        // An append when the first lines are the content `since` was issued for.
        let kept = since
            .content()
            .and_then(|label| usize::try_from(label.segments).ok())
            .filter(|&n| n <= lines.len() && since.names(&digest_of(&lines[..n])));
        Ok(Some(match kept {
            Some(n) => ChatChange::Appended {
                lines: lines[n..].to_vec(),
                revision,
            },
            None => ChatChange::Whole(ChatFile {
                lines: lines.clone(),
                revision,
            }),
        }))
    }

    async fn chat_revision(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatRevision>, StoreError> {
        yield_once().await;
        Ok(lock(&self.chats)
            .files
            .get(&(character.clone(), chat.clone()))
            .map(|(_, digest)| ChatRevision::of_content(digest)))
    }

    async fn append_lines(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: &ChatRevision,
    ) -> Result<ChatRevision, StoreError> {
        yield_once().await;
        self.fault("chat.append")?;
        let mut chats = lock(&self.chats);
        let Some((current, digest)) = chats.files.get_mut(&(character.clone(), chat.clone()))
        else {
            return Err(StoreError::NotFound {
                target: chat_target(character, chat),
            });
        };
        if !expected.names(digest) {
            return Err(StoreError::Conflict {
                target: chat_target(character, chat),
                current: None,
            });
        }
        // Appending nothing changes nothing, so the revision stays (the port's contract).
        if lines.is_empty() {
            return Ok(expected.clone());
        }
        current.extend(lines.iter().cloned());
        for line in lines {
            digest.push_segment(line.raw().as_bytes());
        }
        Ok(ChatRevision::of_content(digest))
    }

    async fn rewrite_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: Option<&ChatRevision>,
    ) -> Result<ChatRevision, StoreError> {
        yield_once().await;
        self.fault("chat.rewrite")?;
        check_not_empty(lines)?;
        let mut chats = lock(&self.chats);
        let key = (character.clone(), chat.clone());
        let current = chats
            .files
            .get(&key)
            .map(|(_, digest)| ChatRevision::of_content(digest));
        if current.as_ref() != expected {
            return Err(StoreError::Conflict {
                target: chat_target(character, chat),
                current: None,
            });
        }
        let digest = digest_of(lines);
        chats.files.insert(key, (lines.to_vec(), digest));
        Ok(ChatRevision::of_content(&digest))
    }
}

#[async_trait]
impl CheckpointStore for MemStore {
    async fn load_checkpoint(
        &self,
        session: &SessionId,
    ) -> Result<Option<ProjectorCheckpoint>, StoreError> {
        yield_once().await;
        Ok(lock(&self.checkpoints).get(session).cloned())
    }

    async fn save_checkpoint(
        &self,
        checkpoint: &ProjectorCheckpoint,
        expected: Option<&ProjectorCheckpoint>,
    ) -> Result<(), StoreError> {
        yield_once().await;
        self.fault("checkpoint.save")?;
        let mut all = lock(&self.checkpoints);
        if all.get(&checkpoint.session_id) != expected {
            return Err(StoreError::Conflict {
                target: Box::new(Target::Checkpoint(checkpoint.session_id.clone())),
                current: None,
            });
        }
        all.insert(checkpoint.session_id.clone(), checkpoint.clone());
        Ok(())
    }

    async fn pending_checkpoints(&self) -> Result<Vec<ProjectorCheckpoint>, StoreError> {
        yield_once().await;
        Ok(lock(&self.checkpoints)
            .values()
            .filter(|c| c.status == CheckpointStatus::Pending)
            .cloned()
            .collect())
    }
}

#[async_trait]
impl PromptStore for MemStore {
    async fn get_prompt(&self, session: &SessionId) -> Result<Option<SessionPrompt>, StoreError> {
        yield_once().await;
        Ok(lock(&self.prompts).get(session).cloned())
    }

    async fn save_prompt(
        &self,
        session: &SessionId,
        text: &str,
    ) -> Result<Option<SessionPrompt>, StoreError> {
        yield_once().await;
        let prompt = SessionPrompt::to_save(session, text, self.clock.now())?;
        self.fault("prompt.save")?;
        let mut prompts = lock(&self.prompts);
        match &prompt {
            Some(p) => prompts.insert(session.clone(), p.clone()),
            None => prompts.remove(session),
        };
        Ok(prompt)
    }

    async fn reset_prompt(&self, session: &SessionId) -> Result<bool, StoreError> {
        yield_once().await;
        self.fault("prompt.save")?;
        Ok(lock(&self.prompts).remove(session).is_some())
    }
}
