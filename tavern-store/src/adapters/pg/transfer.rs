//! [`Transfer`] for PostgreSQL: the tables are dumped from this process's caught-up mirrors and
//! loaded as snapshot rows in one transaction under both table locks; session documents are
//! listed from their tables.

use async_trait::async_trait;
use tavern_core::{CharacterName, SessionId};

use super::ops::{insert_ops, Need};
use super::{db, encode, PgStore};
use crate::engine::memory_table::MemoryTable;
use crate::engine::variable_table::VariableTable;
use crate::error::StoreError;
use crate::prompt::SessionPrompt;
use crate::transfer::{TableDump, Transfer};

impl PgStore {
    async fn sessions_of(
        &self,
        sql: &str,
        what: &'static str,
    ) -> Result<Vec<SessionId>, StoreError> {
        let client = self.inner.client(what).await?;
        let rows = client.query(sql, &[]).await.map_err(db(what))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let name: &str = row.try_get(0).map_err(db(what))?;
            out.push(SessionId::parse(name).map_err(|e| StoreError::Corrupt {
                file: what.to_owned(),
                reason: e.to_string(),
            })?);
        }
        out.sort();
        Ok(out)
    }
}

#[async_trait]
impl Transfer for PgStore {
    async fn dump_tables(&self) -> Result<TableDump, StoreError> {
        let memory = self
            .inner
            .read(&self.inner.memory, Need::All, MemoryTable::snapshot)
            .await?;
        let variables = self
            .inner
            .read(&self.inner.variables, Need::All, VariableTable::snapshot)
            .await?;
        Ok(TableDump { memory, variables })
    }

    async fn load_tables(&self, dump: TableDump) -> Result<(), StoreError> {
        let mut client = self.inner.client("load tables").await?;
        let tx = client.transaction().await.map_err(db("load tables"))?;
        tx.batch_execute(
            "SET LOCAL lock_timeout = '10s'; SET LOCAL statement_timeout = 0;
             LOCK TABLE memory_ops IN EXCLUSIVE MODE; LOCK TABLE variable_ops IN EXCLUSIVE MODE",
        )
        .await
        .map_err(db("load tables"))?;
        let row = tx
            .query_one(
                "SELECT (SELECT count(*) FROM memory_ops), (SELECT count(*) FROM variable_ops)",
                &[],
            )
            .await
            .map_err(db("load tables"))?;
        let (m, v): (i64, i64) = (
            row.try_get(0).map_err(db("load tables"))?,
            row.try_get(1).map_err(db("load tables"))?,
        );
        if m > 0 || v > 0 {
            return Err(StoreError::Invalid(tavern_core::CoreError::InvalidField {
                field: "target store",
                reason: format!(
                    "it holds {m} memory and {v} variable operations; copy only into an empty store"
                ),
            }));
        }
        // In the dump's order, so the copy replays as the source does.
        insert_ops::<MemoryTable>(&tx, &dump.memory, "load tables").await?;
        insert_ops::<VariableTable>(&tx, &dump.variables, "load tables").await?;
        // Filled anew: an image of whatever these tables held before is of another store.
        tx.batch_execute(super::schema::NEW_IDENTITY)
            .await
            .map_err(db("load tables"))?;
        tx.commit().await.map_err(db("load tables"))?;
        // Statistics for the tables just filled (autovacuum would take up to a minute): until
        // then every connection's plan for the catch-up query is the empty table's, a scan
        // of the whole table. Only a speed-up: bounded in time behind a conflicting lock (a
        // manual VACUUM, an index build), and a role that does not own the tables just gets
        // a warning; the data is committed either way.
        let analyzed = client
            .batch_execute(
                "BEGIN; SET LOCAL lock_timeout = '10s'; ANALYZE memory_ops, variable_ops; COMMIT",
            )
            .await;
        // A failure leaves the transaction open: closed here, or the connection is not
        // handed out again.
        if analyzed.is_err() && client.batch_execute("ROLLBACK").await.is_err() {
            drop(deadpool_postgres::Object::take(client));
        } else {
            drop(client);
        }
        // The mirrors catch up from the rows just committed.
        self.inner
            .read(&self.inner.memory, Need::Scopes(&[]), |_| ())
            .await?;
        self.inner
            .read(&self.inner.variables, Need::All, |_| ())
            .await
    }

    async fn chat_characters(&self) -> Result<Vec<CharacterName>, StoreError> {
        let client = self.inner.client("list chats").await?;
        let rows = client
            .query("SELECT DISTINCT character FROM chats", &[])
            .await
            .map_err(db("list chats"))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let name: &str = row.try_get(0).map_err(db("list chats"))?;
            out.push(CharacterName::parse(name).map_err(|e| StoreError::Corrupt {
                file: "chats".into(),
                reason: e.to_string(),
            })?);
        }
        out.sort();
        Ok(out)
    }

    async fn checkpoint_sessions(&self) -> Result<Vec<SessionId>, StoreError> {
        self.sessions_of("SELECT session FROM checkpoints", "list checkpoints")
            .await
    }

    async fn prompt_sessions(&self) -> Result<Vec<SessionId>, StoreError> {
        self.sessions_of("SELECT session FROM prompts", "list prompts")
            .await
    }

    async fn load_prompt(&self, prompt: &SessionPrompt) -> Result<(), StoreError> {
        let doc = encode(prompt, "a prompt")?;
        let client = self.inner.client("save prompt").await?;
        let written = client
            .execute(
                "INSERT INTO prompts (session, doc) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&prompt.session_id.as_str(), &doc],
            )
            .await
            .map_err(db("save prompt"))?;
        if written == 1 {
            Ok(())
        } else {
            Err(StoreError::Conflict {
                target: Box::new(crate::error::Target::Prompt(prompt.session_id.clone())),
                current: None,
            })
        }
    }
}
