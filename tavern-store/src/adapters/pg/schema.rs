//! The PostgreSQL schema and its versioned migrations, applied at open under an advisory lock
//! so several processes opening one database at once migrate it exactly once.

use deadpool_postgres::Client;
use tavern_core::chat_digest::ChatDigest;

use super::db;
use crate::error::StoreError;

/// Advisory lock key serializing migrations (any constant unique to this program).
const MIGRATION_LOCK: i64 = 0x7461_7665_726e_0001;

/// The migrations, in order: `MIGRATIONS[i]` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE memory_ops (
        seq bigserial PRIMARY KEY,
        scope text NOT NULL,
        id text,
        op json NOT NULL
    );
    CREATE TABLE variable_ops (
        seq bigserial PRIMARY KEY,
        scope text NOT NULL,
        id text,
        op json NOT NULL
    );
    CREATE SEQUENCE chat_revisions;
    CREATE TABLE chats (
        character text NOT NULL,
        chat text NOT NULL,
        revision bigint NOT NULL,
        rewritten bigint NOT NULL,
        line_count integer NOT NULL,
        PRIMARY KEY (character, chat)
    );
    CREATE TABLE chat_lines (
        character text NOT NULL,
        chat text NOT NULL,
        n integer NOT NULL,
        line text NOT NULL,
        PRIMARY KEY (character, chat, n),
        FOREIGN KEY (character, chat) REFERENCES chats ON DELETE CASCADE
    );
    CREATE TABLE state (
        id integer PRIMARY KEY CHECK (id = 1),
        doc text
    );
    INSERT INTO state (id, doc) VALUES (1, NULL);
    CREATE TABLE checkpoints (
        session text PRIMARY KEY,
        doc text NOT NULL,
        pending boolean NOT NULL
    );
    CREATE TABLE prompts (
        session text PRIMARY KEY,
        doc text NOT NULL
    );",
    // 2: compaction. A `reset` row starts a snapshot: a process catching up clears its
    // table there and rebuilds it from the rows that follow (the rows before are deleted).
    "ALTER TABLE memory_ops ADD COLUMN reset boolean NOT NULL DEFAULT false;
    ALTER TABLE variable_ops ADD COLUMN reset boolean NOT NULL DEFAULT false;",
    // 3: content revisions. A chat's revision is the digest of its bytes (the same as the file
    // store's for the same chat); each line keeps the digest of the chat up to it, so an
    // append is told from a rewrite exactly. [`backfill_chat_digests`] fills the new columns.
    "ALTER TABLE chats ADD COLUMN bytes bigint NOT NULL DEFAULT 0,
        ADD COLUMN digest bytea;
    ALTER TABLE chat_lines ADD COLUMN digest bytea;
    ALTER TABLE chats DROP COLUMN revision, DROP COLUMN rewritten;
    DROP SEQUENCE chat_revisions;",
    // 4: the store's identity, a random token made with it (and made again when a copy fills
    // it): a process's saved image of the memories names it, so an image is never taken for
    // that of another store whose object ids and rows happen to match (a cluster made again
    // from scratch hands out the same object ids).
    "CREATE TABLE store_identity (
        id integer PRIMARY KEY CHECK (id = 1),
        token text NOT NULL
    );
    INSERT INTO store_identity (id, token) VALUES (1, md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text));",
    // 5: a scope's memory rows in order, one index range: a process that holds memories by
    // scope (`PgOptions::max_loaded_memories`) loads a scope on its first use. Built in the
    // migration's transaction without the statement limit (a large table takes a while; other
    // hosts' writes wait for it, at most their lock timeout).
    "SET LOCAL statement_timeout = 0;
    CREATE INDEX IF NOT EXISTS memory_ops_scope_seq ON memory_ops (scope, seq);",
];

/// A new random identity token, as SQL (see migration 4).
pub(super) const NEW_IDENTITY: &str = "UPDATE store_identity SET token = md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text)";

/// Runs after the SQL of migration `version` (the version it brings the schema to).
async fn after_migration(
    tx: &deadpool_postgres::Transaction<'_>,
    version: usize,
) -> Result<(), StoreError> {
    if version == 3 {
        backfill_chat_digests(tx).await?;
        tx.batch_execute(
            "ALTER TABLE chats ALTER COLUMN digest SET NOT NULL;
            ALTER TABLE chat_lines ALTER COLUMN digest SET NOT NULL;",
        )
        .await
        .map_err(db("migrate"))?;
    }
    Ok(())
}

/// Digests every chat stored before content revisions, one chat at a time.
async fn backfill_chat_digests(tx: &deadpool_postgres::Transaction<'_>) -> Result<(), StoreError> {
    let chats = tx
        .query("SELECT character, chat FROM chats", &[])
        .await
        .map_err(db("migrate"))?;
    for chat in &chats {
        let character: &str = chat.try_get(0).map_err(db("migrate"))?;
        let name: &str = chat.try_get(1).map_err(db("migrate"))?;
        let lines = tx
            .query(
                "SELECT n, line FROM chat_lines WHERE character = $1 AND chat = $2 ORDER BY n",
                &[&character, &name],
            )
            .await
            .map_err(db("migrate"))?;
        let mut digest = ChatDigest::empty();
        let mut ns = Vec::with_capacity(lines.len());
        let mut chains = Vec::with_capacity(lines.len());
        for line in &lines {
            let n: i32 = line.try_get(0).map_err(db("migrate"))?;
            let text: &str = line.try_get(1).map_err(db("migrate"))?;
            digest.push_segment(text.as_bytes());
            ns.push(n);
            chains.push(digest.chain().to_vec());
        }
        tx.execute(
            "UPDATE chat_lines l SET digest = t.digest
             FROM unnest($3::integer[], $4::bytea[]) AS t(n, digest)
             WHERE l.character = $1 AND l.chat = $2 AND l.n = t.n",
            &[&character, &name, &ns, &chains],
        )
        .await
        .map_err(db("migrate"))?;
        let bytes = i64::try_from(digest.bytes()).unwrap_or(i64::MAX);
        tx.execute(
            "UPDATE chats SET bytes = $3, digest = $4 WHERE character = $1 AND chat = $2",
            &[&character, &name, &bytes, &digest.chain().as_slice()],
        )
        .await
        .map_err(db("migrate"))?;
    }
    Ok(())
}

/// The schema version this code writes and understands.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Brings the database to [`SCHEMA_VERSION`]; refuses one whose schema is newer.
pub(super) async fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(db("migrate"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(db("migrate"))?;
    // A database at this version needs no DDL: a role that may only read and write rows (or
    // only read) can open it.
    let exists: Option<String> = tx
        .query_one("SELECT to_regclass('schema_version')::text", &[])
        .await
        .map_err(db("migrate"))?
        .try_get(0)
        .map_err(db("migrate"))?;
    if exists.is_some() {
        let row = tx
            .query_opt("SELECT version FROM schema_version WHERE id = 1", &[])
            .await
            .map_err(db("migrate"))?;
        if let Some(row) = row {
            let current: i32 = row.try_get(0).map_err(db("migrate"))?;
            if current == SCHEMA_VERSION {
                return tx.commit().await.map_err(db("migrate"));
            }
        }
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_version (
            id integer PRIMARY KEY CHECK (id = 1),
            version integer NOT NULL
        )",
    )
    .await
    .map_err(db("migrate"))?;
    let row = tx
        .query_opt("SELECT version FROM schema_version WHERE id = 1", &[])
        .await
        .map_err(db("migrate"))?;
    let current: i32 = match row {
        Some(row) => row.try_get(0).map_err(db("migrate"))?,
        None => 0,
    };
    if current > SCHEMA_VERSION {
        return Err(StoreError::Database {
            op: "open",
            reason: format!(
                "the database schema is version {current}, newer than version \
                 {SCHEMA_VERSION} that this program knows; upgrade AgentTavern to use it"
            ),
        });
    }
    let start = usize::try_from(current.max(0)).unwrap_or(0);
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(start) {
        tx.batch_execute(sql).await.map_err(db("migrate"))?;
        after_migration(&tx, i + 1).await?;
    }
    tx.execute(
        "INSERT INTO schema_version (id, version) VALUES (1, $1)
         ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version",
        &[&SCHEMA_VERSION],
    )
    .await
    .map_err(db("migrate"))?;
    tx.commit().await.map_err(db("migrate"))
}
