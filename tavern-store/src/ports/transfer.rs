//! Moving a whole store to another backend (the file store into PostgreSQL and back): every
//! memory with its audit trail (forgotten and expired ones too), every variable scope with its
//! tombstones and audit, every chat byte for byte, the state, every projector checkpoint and
//! session prompt — copied exactly (revisions and timestamps included) into an empty store,
//! then read back from both and compared.

use async_trait::async_trait;
use tavern_core::{CharacterName, SessionId};

use crate::engine::memory_table::MemoryOp;
use crate::engine::variable_table::VariableOp;
use crate::error::StoreError;
use crate::prompt::SessionPrompt;
use crate::state::Verdict;
use crate::wrappers::AllStores;

/// The memory and variable tables of a store, exactly: one snapshot operation per memory and
/// per variable scope, in the form both stores log them.
#[derive(Debug, Clone, Default)]
pub struct TableDump {
    pub(crate) memory: Vec<MemoryOp>,
    pub(crate) variables: Vec<VariableOp>,
}

impl TableDump {
    /// Memory records (live, forgotten and expired).
    pub fn memory_records(&self) -> usize {
        self.memory.len()
    }

    /// Variable scopes.
    pub fn variable_scopes(&self) -> usize {
        self.variables.len()
    }

    /// Whether both tables are empty.
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty() && self.variables.is_empty()
    }

    /// Whether the memory tables of the two dumps hold the same records (the variables are
    /// not compared), each compared by a 128-bit hash keyed at random for this comparison.
    ///
    /// # Errors
    /// [`StoreError::Internal`] when an operation cannot be encoded.
    pub fn same_memories(&self, other: &TableDump) -> Result<bool, StoreError> {
        let key = MemoryDigest::random_key();
        Ok(self.memory_digest(key)?.same(&other.memory_digest(key)?))
    }

    /// The memory table in 16 bytes a record, to compare with another's digest under the
    /// same `key` ([`MemoryDigest::same`]) after this dump is let go: the XXH3-128 of each
    /// record's encoded operation, seeded with `key`, sorted (stores keep records in their
    /// own order). Record texts are written by users and models: take the key from
    /// [`MemoryDigest::random_key`], so no text can be made to collide with another.
    ///
    /// # Errors
    /// [`StoreError::Internal`] when an operation cannot be encoded.
    pub fn memory_digest(&self, key: u64) -> Result<MemoryDigest, StoreError> {
        let mut hashes = self
            .memory
            .iter()
            .map(|op| {
                encode(op).map(|line| xxhash_rust::xxh3::xxh3_128_with_seed(line.as_bytes(), key))
            })
            .collect::<Result<Vec<_>, _>>()?;
        hashes.sort_unstable();
        Ok(MemoryDigest { key, hashes })
    }
}

/// A memory table's records, each as a keyed 128-bit hash of its exact form
/// ([`TableDump::memory_digest`]): what two stores' memories are compared by without holding
/// both whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryDigest {
    key: u64,
    hashes: Vec<u128>,
}

impl MemoryDigest {
    /// A key nobody can know in advance, for [`TableDump::memory_digest`].
    pub fn random_key() -> u64 {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one(0u8)
    }

    /// Whether both hold the same records (each compared by its hash); digests made under
    /// different keys are never the same.
    pub fn same(&self, other: &MemoryDigest) -> bool {
        self == other
    }
}

impl TableDump {
    /// The operations as sorted JSON lines (what two dumps are compared by: stores keep
    /// records in their own order).
    fn canonical(&self) -> Result<Vec<String>, StoreError> {
        let mut lines = Vec::with_capacity(self.memory.len() + self.variables.len());
        for op in &self.memory {
            lines.push(encode(op)?);
        }
        for op in &self.variables {
            lines.push(encode(op)?);
        }
        lines.sort_unstable();
        Ok(lines)
    }
}

fn encode<T: serde::Serialize>(op: &T) -> Result<String, StoreError> {
    serde_json::to_string(op)
        .map_err(|e| StoreError::Internal(format!("cannot encode an operation: {e}")))
}

/// What a store offers beyond its ports so that it can be copied whole. Object safe.
#[async_trait]
pub trait Transfer: Send + Sync {
    /// The memory and variable tables as they are now.
    ///
    /// # Errors
    /// Store failures.
    async fn dump_tables(&self) -> Result<TableDump, StoreError>;

    /// Loads `dump` into this store, whose memory and variable tables must both be empty; all
    /// of it durably or (on an error) none of a table.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] when a table is not empty; store failures.
    async fn load_tables(&self, dump: TableDump) -> Result<(), StoreError>;

    /// The characters that have chats, sorted.
    ///
    /// # Errors
    /// Store failures.
    async fn chat_characters(&self) -> Result<Vec<CharacterName>, StoreError>;

    /// The sessions that have a projector checkpoint, sorted.
    ///
    /// # Errors
    /// Store failures.
    async fn checkpoint_sessions(&self) -> Result<Vec<SessionId>, StoreError>;

    /// The sessions that have a prompt, sorted.
    ///
    /// # Errors
    /// Store failures.
    async fn prompt_sessions(&self) -> Result<Vec<SessionId>, StoreError>;

    /// Stores `prompt` exactly as given (its time included) for a session that has none.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when the session has a prompt; store failures.
    async fn load_prompt(&self, prompt: &SessionPrompt) -> Result<(), StoreError>;
}

/// A store that can be copied: every port plus [`Transfer`].
pub trait CopyableStore: AllStores + Transfer {}

impl<T: AllStores + Transfer + ?Sized> CopyableStore for T {}

/// What [`copy_store`] copied (and then found identical in both stores).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Memory records, with their audit trails.
    pub memories: usize,
    /// Variable scopes, with their audit trails.
    pub variable_scopes: usize,
    /// Chats.
    pub chats: usize,
    /// Chat lines.
    pub chat_lines: usize,
    /// Projector checkpoints.
    pub checkpoints: usize,
    /// Session prompts.
    pub prompts: usize,
    /// What the source holds but could not be copied: chats without a single line (a store
    /// cannot hold an empty chat), checkpoints and prompts the source could not read (its
    /// diagnostics say why). Not silently: the caller reports them.
    pub skipped: Vec<String>,
    /// Chats whose bytes the target keeps as their lines joined by `\n` (the source had
    /// `\r\n` line ends, blank lines or a final newline): same lines, another revision, so a
    /// session's projector reads that chat once more.
    pub reformatted: Vec<String>,
}

fn not_empty(what: String) -> StoreError {
    StoreError::Invalid(tavern_core::CoreError::InvalidField {
        field: "target store",
        reason: format!("{what}; copy only into an empty store"),
    })
}

/// Copies everything in `from` into `to`, which must be empty, then reads both back and
/// compares them. Nothing in `from` changes. Writes to `from` while the copy runs may or may
/// not be copied (stop the hosts first); the verification then reports the difference.
///
/// # Errors
/// [`StoreError::Invalid`] when `to` is not empty (nothing is written then); store failures
/// (the target may then hold part of the copy: empty it and copy again);
/// [`StoreError::Internal`] naming what differs when the verification fails.
pub async fn copy_store(
    from: &dyn CopyableStore,
    to: &dyn CopyableStore,
) -> Result<CopyReport, StoreError> {
    check_empty(to).await?;
    let tables = from.dump_tables().await?;
    let mut report = CopyReport {
        memories: tables.memory_records(),
        variable_scopes: tables.variable_scopes(),
        ..CopyReport::default()
    };
    let expected_tables = tables.canonical()?;
    to.load_tables(tables).await?;
    for character in from.chat_characters().await? {
        for chat in from.list_chats(&character).await? {
            let Some(file) = from.read_chat(&character, &chat).await? else {
                continue;
            };
            if file.lines.is_empty() {
                report
                    .skipped
                    .push(format!("chat {chat} of {character} (no lines)"));
                continue;
            }
            let revision = to
                .rewrite_chat(&character, &chat, &file.lines, None)
                .await?;
            if revision != file.revision {
                report.reformatted.push(format!(
                    "chat {chat} of {character} (line ends, blank lines or a final newline \
                     not kept; its revision changed)"
                ));
            }
            report.chats += 1;
            report.chat_lines += file.lines.len();
        }
    }
    let (state, _) = from.load_state().await?;
    let default = tavern_core::TavernState::default().to_json();
    let mut replaced_other = false;
    to.update_state(&mut |s| {
        // Only over the default state: something else wrote the target meanwhile.
        if s.to_json() != default {
            replaced_other = true;
            return Verdict::Keep;
        }
        *s = state.clone();
        Verdict::Write
    })
    .await?;
    if replaced_other {
        return Err(not_empty("its state was written while the copy ran".into()));
    }
    for session in from.checkpoint_sessions().await? {
        match from.load_checkpoint(&session).await? {
            Some(cp) => {
                to.save_checkpoint(&cp, None).await?;
                report.checkpoints += 1;
            }
            None => report
                .skipped
                .push(format!("checkpoint of session {session} (unreadable)")),
        }
    }
    for session in from.prompt_sessions().await? {
        match from.get_prompt(&session).await? {
            Some(p) => {
                to.load_prompt(&p).await?;
                report.prompts += 1;
            }
            None => report
                .skipped
                .push(format!("prompt of session {session} (unreadable)")),
        }
    }
    verify(from, to, &expected_tables, &report).await?;
    Ok(report)
}

async fn check_empty(to: &dyn CopyableStore) -> Result<(), StoreError> {
    let tables = to.dump_tables().await?;
    if !tables.is_empty() {
        return Err(not_empty(format!(
            "it holds {} memories and {} variable scopes",
            tables.memory_records(),
            tables.variable_scopes()
        )));
    }
    if let Some(c) = to.chat_characters().await?.first() {
        return Err(not_empty(format!("it holds chats of {c}")));
    }
    if !to.checkpoint_sessions().await?.is_empty() || !to.prompt_sessions().await?.is_empty() {
        return Err(not_empty("it holds session checkpoints or prompts".into()));
    }
    let (state, _) = to.load_state().await?;
    if state.to_json() != tavern_core::TavernState::default().to_json() {
        return Err(not_empty("its state is not the default".into()));
    }
    Ok(())
}

fn differs(what: String) -> StoreError {
    StoreError::Internal(format!("the copy differs from its source: {what}"))
}

/// Reads both stores back and compares everything copied.
async fn verify(
    from: &dyn CopyableStore,
    to: &dyn CopyableStore,
    expected_tables: &[String],
    report: &CopyReport,
) -> Result<(), StoreError> {
    if to.dump_tables().await?.canonical()? != expected_tables {
        return Err(differs("memories or variables".into()));
    }
    // And the source still holds what was copied (a write to it meanwhile would be missing).
    if from.dump_tables().await?.canonical()? != expected_tables {
        return Err(differs(
            "the source's memories or variables changed while the copy ran".into(),
        ));
    }
    let mut chats = 0;
    for character in from.chat_characters().await? {
        for chat in from.list_chats(&character).await? {
            let a = from.read_chat(&character, &chat).await?;
            let b = to.read_chat(&character, &chat).await?;
            let raw = |f: Option<crate::ChatFile>| -> Vec<String> {
                f.map(|f| f.lines.iter().map(|l| l.raw().to_owned()).collect())
                    .unwrap_or_default()
            };
            let (a, b) = (raw(a), raw(b));
            if a != b {
                return Err(differs(format!("chat {chat} of {character}")));
            }
            chats += usize::from(!a.is_empty());
        }
    }
    if chats != report.chats {
        return Err(differs("the number of chats".into()));
    }
    let (a, _) = from.load_state().await?;
    let (b, _) = to.load_state().await?;
    if a.to_json() != b.to_json() {
        return Err(differs("the state".into()));
    }
    if to.checkpoint_sessions().await?.len() != report.checkpoints
        || to.prompt_sessions().await?.len() != report.prompts
    {
        return Err(differs("the number of checkpoints or prompts".into()));
    }
    for session in from.checkpoint_sessions().await? {
        if from.load_checkpoint(&session).await? != to.load_checkpoint(&session).await? {
            return Err(differs(format!("the checkpoint of session {session}")));
        }
    }
    for session in from.prompt_sessions().await? {
        if from.get_prompt(&session).await? != to.get_prompt(&session).await? {
            return Err(differs(format!("the prompt of session {session}")));
        }
    }
    Ok(())
}
