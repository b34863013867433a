//! Compacting the operation tables: under the table lock, the whole table is written as one
//! snapshot row per memory (or variable scope) after a `reset` row, and every row before it is
//! deleted, in one transaction. Processes that catch up later meet the `reset` row, clear
//! their copy and rebuild it from the snapshot (`ops::apply_rows`), so compaction is safe while
//! other hosts use the database — they may wait for the lock, at most its timeout.

use tokio::sync::Mutex;
use tokio_postgres::types::ToSql;

use super::ops::{begin, insert_ops, Mirror, Need, OpenTransaction, OpsTable, Statements};
use super::{db, Inner, PgStore};
use crate::error::StoreError;

/// What a compaction did: operation rows `(before, after)` per table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgCompactReport {
    /// `memory_ops`.
    pub memory: (u64, u64),
    /// `variable_ops`.
    pub variables: (u64, u64),
}

impl PgStore {
    /// Rewrites both operation tables as snapshots of their current state (every record with
    /// its audit trail; access times kept), deleting the history before. Other processes keep
    /// working: they wait for the table lock (at most 10 s, then their write fails and can be
    /// retried) and rebuild their copy when they next catch up.
    ///
    /// # Errors
    /// Store failures; nothing changes in a table whose transaction failed.
    pub async fn compact(&self) -> Result<PgCompactReport, StoreError> {
        let memory = self.inner.compact_table(&self.inner.memory).await?;
        // The rows the last image ended at are gone: a new image, or the next open reads
        // every memory again.
        self.inner.save_memory_image_quietly(true).await;
        Ok(PgCompactReport {
            memory,
            variables: self.inner.compact_table(&self.inner.variables).await?,
        })
    }
}

fn count(row: &tokio_postgres::Row) -> Result<u64, StoreError> {
    let n: i64 = row.try_get(0).map_err(db("compact"))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

impl Inner {
    async fn compact_table<T: OpsTable>(
        &self,
        mirror: &Mutex<Mirror<T>>,
    ) -> Result<(u64, u64), StoreError> {
        let mut m = self.lock_mirror(mirror, Need::All).await?;
        let client = self.client("compact").await?;
        let statements = Statements::prepare::<T>(&client).await?;
        let tx = OpenTransaction::new(client);
        let c = tx.client()?;
        tx.begin();
        // A large table's snapshot may take longer than one statement is otherwise allowed.
        c.batch_execute(&format!(
            "{} SET LOCAL statement_timeout = 0;",
            begin::<T>()
        ))
        .await
        .map_err(db("compact"))?;
        let after: [&(dyn ToSql + Sync); 1] = [&m.seq];
        let rows = c
            .query(&statements.select, &after)
            .await
            .map_err(db("catch up"))?;
        self.apply_batch(c, &statements.select, &rows, &mut m)
            .await?;
        let table = T::NAME;
        if !m.unreadable.is_empty() {
            // A snapshot holds what could be read: the unreadable rows would be gone for good.
            let n = m.unreadable.len();
            tx.rollback().await;
            return Err(StoreError::Invalid(tavern_core::CoreError::InvalidField {
                field: "compaction",
                reason: format!(
                    "{n} rows of {table} cannot be read (see `tavern check`); compacting would \
                     delete them, so nothing was compacted: repair or remove them first"
                ),
            }));
        }
        let before = count(
            &c.query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await
                .map_err(db("compact"))?,
        )?;
        let reset: i64 = c
            .query_one(
                &format!(
                    "INSERT INTO {table} (scope, id, op, reset) VALUES ('', NULL, '{{}}', true) \
                     RETURNING seq"
                ),
                &[],
            )
            .await
            .map_err(db("compact"))?
            .try_get(0)
            .map_err(db("compact"))?;
        let snapshot = m.table.snapshot();
        // A record the snapshot could not read back would be deleted with its rows.
        if self.reset_if_lost(&mut m) {
            tx.rollback().await;
            return Err(StoreError::Corrupt {
                file: super::image::FILE.into(),
                reason: "a record read from it changed since it was opened; nothing was \
                         compacted (the memories are read again from the database)"
                    .into(),
            });
        }
        insert_ops::<T>(c, &snapshot, "compact").await?;
        let last: i64 = c
            .query_one(&format!("SELECT max(seq) FROM {table}"), &[])
            .await
            .map_err(db("compact"))?
            .try_get(0)
            .map_err(db("compact"))?;
        let reset_param: [&(dyn ToSql + Sync); 1] = [&reset];
        c.execute(&format!("DELETE FROM {table} WHERE seq < $1"), &reset_param)
            .await
            .map_err(db("compact"))?;
        c.batch_execute("COMMIT").await.map_err(db("commit"))?;
        tx.ended();
        tx.closed();
        // This process's copy is the very state just written; it moves past the snapshot.
        m.seq = last;
        Ok((before, u64::try_from(last - reset + 1).unwrap_or(0)))
    }
}
