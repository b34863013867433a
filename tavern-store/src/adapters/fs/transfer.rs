//! [`Transfer`] for the file store: its tables as snapshot operations (the lines a compacted
//! log holds) and its session documents listed from their folders.

use std::sync::Mutex;

use async_trait::async_trait;
use tavern_core::{CharacterName, SessionId};

use super::{lock, names, session_doc, FsStore, Inner, Logged};
use crate::engine::oplog::OpTable;
use crate::error::StoreError;
use crate::prompt::SessionPrompt;
use crate::transfer::{TableDump, Transfer};

impl<T: OpTable> Logged<T> {
    /// Appends every operation with one durable write into an empty table. The caller holds
    /// the exclusive lock and has caught up.
    fn load(&mut self, ops: Vec<T::Op>, diags: &super::Diagnostics) -> Result<(), StoreError> {
        if self.table.snapshot_len() > 0 {
            return Err(StoreError::Invalid(tavern_core::CoreError::InvalidField {
                field: "target store",
                reason: format!(
                    "{} is not empty; copy only into an empty store",
                    self.log_name()
                ),
            }));
        }
        if ops.is_empty() {
            return Ok(());
        }
        let payloads = ops
            .iter()
            .map(serde_json::to_string)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StoreError::Internal(format!("cannot encode an operation: {e}")))?;
        let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
        if self.log.append_many(&refs, true)? {
            self.catch_up(diags)
        } else {
            self.table.apply_ops(ops);
            Ok(())
        }
    }
}

impl Inner {
    fn snapshot_of<T: OpTable>(&self, logged: &Mutex<Logged<T>>) -> Result<Vec<T::Op>, StoreError> {
        let mut g = lock(logged);
        let _lock = g.log.lock(false)?;
        g.catch_up(&self.diagnostics)?;
        let snapshot = g.table.snapshot();
        // Taken of a table that could not read a record back: taken again of it whole.
        if g.recover(&self.diagnostics)? {
            return Ok(g.table.snapshot());
        }
        Ok(snapshot)
    }

    fn load_into<T: OpTable>(
        &self,
        logged: &Mutex<Logged<T>>,
        ops: Vec<T::Op>,
    ) -> Result<(), StoreError> {
        let mut g = lock(logged);
        let _lock = g.log.lock(true)?;
        g.catch_up(&self.diagnostics)?;
        g.load(ops, &self.diagnostics)
    }

    /// The sessions with a document in `dir`, sorted (names that do not decode are skipped:
    /// they are not ours).
    fn sessions_in(&self, dir: &str) -> Result<Vec<SessionId>, StoreError> {
        let path = super::atomic::under(&self.root, dir);
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(super::io_err("list", dir)(e)),
        };
        let mut out: Vec<SessionId> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix(".json").and_then(names::decode))
            .filter_map(|s| SessionId::parse(&s).ok())
            .collect();
        out.sort();
        Ok(out)
    }
}

#[async_trait]
impl Transfer for FsStore {
    async fn dump_tables(&self) -> Result<TableDump, StoreError> {
        self.run(|s| {
            // A deferred memory log is read (and set aside if unreadable) first.
            drop(s.memory()?);
            Ok(TableDump {
                memory: s.snapshot_of(&s.memory)?,
                variables: s.snapshot_of(&s.variables)?,
            })
        })
        .await
    }

    async fn load_tables(&self, dump: TableDump) -> Result<(), StoreError> {
        self.run(move |s| {
            drop(s.memory()?);
            s.load_into(&s.memory, dump.memory)?;
            s.load_into(&s.variables, dump.variables)
        })
        .await
    }

    async fn chat_characters(&self) -> Result<Vec<CharacterName>, StoreError> {
        self.run(Inner::chat_characters).await
    }

    async fn checkpoint_sessions(&self) -> Result<Vec<SessionId>, StoreError> {
        self.run(|s| s.sessions_in("checkpoints")).await
    }

    async fn prompt_sessions(&self) -> Result<Vec<SessionId>, StoreError> {
        self.run(|s| s.sessions_in("prompts")).await
    }

    async fn load_prompt(&self, prompt: &SessionPrompt) -> Result<(), StoreError> {
        let prompt = prompt.clone();
        self.run(move |s| {
            let rel = session_doc("prompts", &prompt.session_id);
            if super::atomic::under(&s.root, &rel).exists() {
                return Err(StoreError::Conflict {
                    target: Box::new(crate::error::Target::Prompt(prompt.session_id.clone())),
                    current: None,
                });
            }
            s.write_doc(&rel, &prompt)
        })
        .await
    }
}
