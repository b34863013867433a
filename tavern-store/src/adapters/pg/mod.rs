//! The PostgreSQL adapter: every port in one database that many processes and hosts share.
//!
//! Memories and variables are append-only operation tables (`memory_ops`, `variable_ops`)
//! holding the same serialized operations the file store logs. Each process keeps the shared
//! engine's tables (and so the one search index and ranking) in memory and catches up from the
//! last sequence number it has seen before every read and write, as `FsStore` catches up from
//! its logs. A write is decided against the caught-up table (compare-and-set) and sent as one
//! message that locks its operation table (`LOCK TABLE … IN EXCLUSIVE MODE`), inserts the
//! operation row only if no other row came first, and commits: the lock is held only while the
//! server runs that message, never across a round trip to this process. Writers are serialized,
//! so sequence numbers become visible in order and a reader never skips one. A variable patch is
//! one row (all or nothing) and carries its audit entries, as a memory operation carries its own.
//!
//! Chats are rows of lines (their exact text, so SillyTavern lines come back byte for byte);
//! state, checkpoints and prompts are JSON documents. Conditional writes run in transactions
//! under `SELECT … FOR UPDATE`. Everything is async on `tokio-postgres` with a
//! `deadpool-postgres` pool; nothing blocks an executor. Errors never contain the connection
//! string or credentials.

mod compact;
mod docs;
mod image;
mod ops;
mod schema;
mod settings;
mod tls;
mod transfer;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use deadpool_postgres::{Client, Hook, HookError, Manager, Pool, PoolError};
use ops::{Mirror, Need};
use serde::Serialize;
use tavern_core::{
    AuditEntry, MemoryId, MemoryRecord, MemorySource, MemoryWrite, Revision, ScopeKey,
    VariableName, VariableRecord,
};
use tokio::sync::Mutex;

pub use compact::PgCompactReport;
/// The file name of the memory image in [`PgOptions::memory_image_dir`].
pub use image::FILE as MEMORY_IMAGE_FILE;
pub use schema::SCHEMA_VERSION;
pub use settings::{load_settings, parse_settings, PgSetupError};
use tls::Connector;
pub use tls::PgTls;
/// A client connection, for callers that talk to the server directly (the benchmarks).
pub use tokio_postgres::Client as PgClient;
/// Connection settings (host, user, database, password…), parsed from a `postgres://` URL or a
/// `key=value` string.
pub use tokio_postgres::Config as PgConfig;
/// The client's error type, for callers that talk to the server directly (the benchmark).
pub use tokio_postgres::Error as PgError;
/// No TLS (unix sockets, loopback, or a network the deployment trusts).
pub use tokio_postgres::NoTls;

use crate::clock::Clock;
use crate::diagnostics::Diagnostics;
use crate::engine::memory_table::{MemoryOp, MemoryTable};
use crate::engine::variable_table::VariableTable;
use crate::error::StoreError;
use crate::memory::{MemoryQuery, MemorySearchResult, MemoryStore};
use crate::variable::{PatchOutcome, VariableChange, VariableListing, VariableStore};
use crate::StoreDiagnostic;

/// Connections kept by default.
pub const DEFAULT_POOL_SIZE: usize = 8;

/// Run once on every new pooled connection (and by the benchmark on its own), for every
/// statement on it: a prepared statement keeps one generic plan (PostgreSQL 12 or later).
/// What it is for is the catch-up query every read makes: under the default (`auto`), once a
/// table has statistics the planner finds its generic plan (estimated for any `seq > $1`)
/// dearer than a custom one for "after the last row" and plans it again on every read, which
/// costs more than the query itself (PostgreSQL 15 here: 0.33 ms per read, 0.18 ms with the
/// generic plan, an index scan). The other statements are prepared per call (planned fresh
/// anyway) or, for writes, planned per call by a `SET LOCAL` in their transaction, where a
/// plan made while the table was small would hurt. A kept plan is made again when `VACUUM` or
/// `ANALYZE` (autovacuum's, or the one after a bulk load) update the table's size: until a
/// table that grew fast from empty is first analyzed (within about a minute), its reads scan
/// it whole, as custom plans without statistics would too.
pub const SESSION_SETTINGS: &str = "SET plan_cache_mode = force_generic_plan";

/// How long PgStore lets the database, or another host, hold it up. Every connection runs
/// under the server-side limits (set when it is opened, so they cover every statement —
/// prepares included); every port call is bounded by [`PgLimits::call_timeout`] on this side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgLimits {
    /// Longest wait for a lock another session holds (a write behind another host's table
    /// lock): past it the statement fails, the write is retryable.
    pub lock_timeout: std::time::Duration,
    /// Longest any one statement runs on the server.
    pub statement_timeout: std::time::Duration,
    /// Longest a transaction may sit idle between its statements: a host cut off between
    /// `LOCK TABLE` and `COMMIT` (only a write that kept losing races, a compaction or a copy
    /// hold the lock across round trips) loses its session (and its locks) after this long
    /// instead of holding every other host's writes forever.
    pub idle_in_transaction: std::time::Duration,
    /// Longest one port call may take on this side, waiting for a connection included. Past
    /// it the call fails, and the pool's idle connections are closed: a server that stopped
    /// answering (frozen, or a half-open connection) must not keep this process stuck on
    /// connections that will never answer, while new ones might.
    pub call_timeout: std::time::Duration,
    /// How many times a write that lost a race (another host wrote since this process's last
    /// catch-up) catches up and tries again in one message before it decides under a lock held
    /// across round trips. A write normally holds its table lock only while the server runs
    /// one message (lock, conditional insert, commit): a host cut off then holds nothing. Only
    /// a write that keeps losing races locks the table for its decision, and a host cut off
    /// there holds the lock until `idle_in_transaction`.
    pub unlocked_attempts: u32,
}

impl Default for PgLimits {
    fn default() -> Self {
        use std::time::Duration;
        Self {
            lock_timeout: Duration::from_secs(10),
            statement_timeout: Duration::from_secs(30),
            idle_in_transaction: Duration::from_secs(10),
            call_timeout: Duration::from_secs(40),
            unlocked_attempts: 4,
        }
    }
}

/// How a [`PgStore`] is opened ([`PgStore::open_with_options`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PgOptions {
    /// Connections kept (at least 1).
    pub pool_size: usize,
    /// How long the database, or another host, may hold the store up.
    pub limits: PgLimits,
    /// A local directory (created when missing) where this process keeps an image of its
    /// memory mirror (`memory.image`): opening reads it and fetches only the rows written
    /// since, instead of every memory. One directory per database (an image of another
    /// database, or of a table compacted since, is never trusted: the memories are read from
    /// the database); processes on one machine may share it. `None` (the default): no image.
    pub memory_image_dir: Option<std::path::PathBuf>,
    /// Open without reading the memories: the first memory call reads them, or
    /// [`PgStore::load_memories`] in a task the program chooses (`tavern-bridge` does, so a
    /// host's handshake never waits for a large database). Off by default.
    pub defer_memory_load: bool,
    /// Hold only the memories of the scopes calls touch, about this many records at most
    /// beyond what one call needs: a scope is read from the database on its first use (one
    /// index range), and when the scopes held pass the bound the least recently used are
    /// dropped, down to three quarters of it. A host serving a few sessions of a large shared
    /// database then holds their memories, not everyone's. A search of every scope, a
    /// compaction or an export loads them all for that call. `None` (the default): every
    /// memory is held. Not with [`PgOptions::memory_image_dir`] (an image is of the whole
    /// table).
    pub max_loaded_memories: Option<usize>,
    /// Read the memory image in [`PgOptions::memory_image_dir`] but never write one (not at
    /// open, after a compaction, nor on [`PgStore::save_memory_image`]): what a check that
    /// must change nothing opens with. Off by default.
    pub memory_image_read_only: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            pool_size: DEFAULT_POOL_SIZE,
            limits: PgLimits::default(),
            memory_image_dir: None,
            defer_memory_load: false,
            max_loaded_memories: None,
            memory_image_read_only: false,
        }
    }
}

impl PgOptions {
    /// The defaults, with the memory image kept in `dir`.
    pub fn with_memory_image_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.memory_image_dir = Some(dir.into());
        self
    }

    /// These options, holding only the memories of the scopes calls touch, about `bound`
    /// records ([`PgOptions::max_loaded_memories`]).
    pub fn with_max_loaded_memories(mut self, bound: usize) -> Self {
        self.max_loaded_memories = Some(bound);
        self
    }

    /// These options, reading the memory image but never writing one
    /// ([`PgOptions::memory_image_read_only`]).
    pub fn with_read_only_memory_image(mut self) -> Self {
        self.memory_image_read_only = true;
        self
    }

    /// These options, opening without reading the memories ([`PgOptions::defer_memory_load`]).
    pub fn with_deferred_memory_load(mut self) -> Self {
        self.defer_memory_load = true;
        self
    }
}

impl PgLimits {
    /// The `SET` statements that put a new connection under these limits.
    fn session_settings(&self) -> String {
        format!(
            "{SESSION_SETTINGS}; SET lock_timeout = '{}ms'; SET statement_timeout = '{}ms'; \
             SET idle_in_transaction_session_timeout = '{}ms'; \
             SET standard_conforming_strings = on",
            self.lock_timeout.as_millis().max(1),
            self.statement_timeout.as_millis().max(1),
            self.idle_in_transaction.as_millis().max(1),
        )
    }
}

/// A database error as a [`StoreError`], for `map_err`.
pub(crate) fn db(op: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::Database {
        op,
        reason: describe(&e),
    }
}

/// What went wrong, without the connection settings: the server's message and SQLSTATE, or the
/// client's description (which never includes the settings).
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} (sqlstate {})", d.message(), d.code().code()),
        // With its causes (a TLS handshake fails for a reason: an unknown issuer, a name
        // mismatch), which describe the connection, never its settings.
        None => {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                text.push_str(": ");
                text.push_str(&c.to_string());
                cause = c.source();
            }
            text
        }
    }
}

fn pool_err(op: &'static str) -> impl FnOnce(PoolError) -> StoreError {
    move |e| StoreError::Database {
        op,
        reason: match e {
            PoolError::Backend(e) => describe(&e),
            PoolError::Timeout(_) => {
                "the server did not answer in time (connect_timeout, 10 s by default)".to_owned()
            }
            PoolError::PostCreateHook(HookError::Backend(e)) => {
                format!("setting up a new connection: {}", describe(&e))
            }
            other => format!("connection pool: {}", other.to_string().trim_end()),
        },
    }
}

fn encode<T: Serialize>(value: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Internal(format!("cannot encode {what}: {e}")))
}

/// Every store port on one PostgreSQL database. Cheap to clone (one shared pool and mirror);
/// `Send + Sync`. Several processes (or several `PgStore`s with their own pools) may share the
/// database: each sees the others' acknowledged writes on its next read.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    limits: PgLimits,
    clock: Arc<dyn Clock>,
    memory: Mutex<Mirror<MemoryTable>>,
    variables: Mutex<Mirror<VariableTable>>,
    /// This process's writers of each table, one at a time: writes decided together at the same
    /// mirror would race each other for nothing (one wins per round trip).
    memory_writers: Mutex<()>,
    variable_writers: Mutex<()>,
    diagnostics: Diagnostics,
    /// The state as this process last read it, by the row version it read (`docs`).
    state: std::sync::Mutex<docs::CachedState>,
    /// Where the memory mirror's image is kept ([`PgOptions::memory_image_dir`]).
    image_dir: Option<std::path::PathBuf>,
    /// Whether images are written there (not with [`PgOptions::memory_image_read_only`]).
    image_saves: bool,
    /// Whether a search found a posting list of the image the mirror was read from damaged
    /// (and rebuilt the index) since: the image is saved again after that search.
    image_healed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the settings: they may hold a password.
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

impl PgStore {
    /// Saves the memory image again when a call healed the mirror of a damaged one or read it
    /// again from the rows (the file on disk is the damaged one: the next process to open it
    /// would meet the same damage), once the call's answer is computed, within a time limit
    /// of its own (the caller waits for it: seconds for a large table, once).
    async fn save_if_healed(&self) {
        if self.inner.image_healed.swap(false, Ordering::Relaxed) {
            if let Err(e) = self.save_memory_image().await {
                self.inner
                    .diag(image::FILE.into(), format!("not saved again: {e}"));
            }
        }
    }

    /// Connects with `settings` (a `postgres://` URL or a `key=value` string), migrates the
    /// schema and loads the memory and variable tables, with [`DEFAULT_POOL_SIZE`] connections.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for settings that cannot be parsed ([`parse_settings`]); [`StoreError::Database`] when the server cannot be reached, refuses, or holds a
    /// schema newer than [`SCHEMA_VERSION`].
    pub async fn connect(settings: &str, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        Self::open(parse_settings(settings)?, clock, DEFAULT_POOL_SIZE).await
    }

    /// Opens the database described by `config` with a pool of `pool_size` connections (at
    /// least 1), migrates it and loads the memory and variable tables. TLS when `config` says
    /// `sslmode=require`, trusting the Mozilla roots ([`PgStore::open_with_tls`] adds more).
    ///
    /// # Errors
    /// As [`PgStore::connect`].
    pub async fn open(
        config: PgConfig,
        clock: Arc<dyn Clock>,
        pool_size: usize,
    ) -> Result<Self, StoreError> {
        Self::open_with_tls(config, &PgTls::default(), clock, pool_size).await
    }

    /// [`PgStore::open`], trusting the certificates of `tls` when `config` says
    /// `sslmode=require`.
    ///
    /// # Errors
    /// As [`PgStore::connect`]; a server certificate that does not verify is a
    /// [`StoreError::Database`] naming the reason.
    pub async fn open_with_tls(
        config: PgConfig,
        tls: &PgTls,
        clock: Arc<dyn Clock>,
        pool_size: usize,
    ) -> Result<Self, StoreError> {
        Self::open_with_limits(config, tls, clock, pool_size, PgLimits::default()).await
    }

    /// As [`PgStore::open_with_tls`], under `limits` instead of the defaults.
    ///
    /// # Errors
    /// As [`PgStore::open_with_tls`].
    pub async fn open_with_limits(
        config: PgConfig,
        tls: &PgTls,
        clock: Arc<dyn Clock>,
        pool_size: usize,
        limits: PgLimits,
    ) -> Result<Self, StoreError> {
        let options = PgOptions {
            pool_size,
            limits,
            ..PgOptions::default()
        };
        Self::open_with_options(config, tls, clock, options).await
    }

    /// As [`PgStore::open_with_tls`], with every option: the pool's size, the limits and
    /// where the memory mirror's image is kept ([`PgOptions`]).
    ///
    /// # Errors
    /// As [`PgStore::open_with_tls`]. An image that cannot be read is not an error: it is
    /// reported ([`PgStore::diagnostics`]) and the memories are read from the database.
    pub async fn open_with_options(
        config: PgConfig,
        tls: &PgTls,
        clock: Arc<dyn Clock>,
        options: PgOptions,
    ) -> Result<Self, StoreError> {
        let PgOptions {
            pool_size,
            limits,
            memory_image_dir,
            defer_memory_load,
            max_loaded_memories,
            memory_image_read_only,
        } = options;
        if max_loaded_memories.is_some() && memory_image_dir.is_some() {
            return Err(StoreError::Invalid(tavern_core::CoreError::InvalidField {
                field: "max_loaded_memories",
                reason: "a memory image is of every memory: hold them by scope or keep an \
                         image, not both"
                    .into(),
            }));
        }
        // Connecting (TCP, TLS, authentication) is bounded by the settings' `connect_timeout`,
        // else 10 s: a server that accepts and never answers must fail the call, not hang it.
        let connect = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(std::time::Duration::from_secs(10));
        let manager = match tls.connector(&config)? {
            Connector::Plain => Manager::new(config, NoTls),
            Connector::Tls(connector) => Manager::new(config, connector),
        };
        // The default recycling (`Fast`) runs no SQL, so the session settings stay for the
        // connection's life (`Clean` would `RESET ALL` them away).
        let settings = Arc::new(limits.session_settings());
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(connect))
            .wait_timeout(Some(limits.call_timeout))
            .post_create(Hook::async_fn(move |client, _| {
                let settings = settings.clone();
                Box::pin(async move {
                    client
                        .batch_execute(&settings)
                        .await
                        .map_err(HookError::Backend)
                })
            }))
            .build()
            .map_err(|e| StoreError::Database {
                op: "open",
                reason: format!("cannot build the connection pool: {e}"),
            })?;
        let store = Self {
            inner: Arc::new(Inner {
                pool,
                limits,
                clock,
                memory: Mutex::new(
                    max_loaded_memories.map_or_else(Mirror::default, Mirror::by_scope),
                ),
                variables: Mutex::default(),
                memory_writers: Mutex::default(),
                variable_writers: Mutex::default(),
                diagnostics: Diagnostics::default(),
                state: std::sync::Mutex::default(),
                image_dir: memory_image_dir,
                image_saves: !memory_image_read_only,
                image_healed: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        let mut client = store.inner.client("open").await?;
        schema::migrate(&mut client).await?;
        drop(client);
        // A process killed while saving an image leaves its temporary file (as large as the
        // image) behind; nothing else would ever remove it. Only the image's own temp names
        // (the directory is the operator's), on the blocking pool (unlinking gigabytes takes
        // a while); a read-only open changes nothing.
        if let Some(dir) = store
            .inner
            .image_dir
            .clone()
            .filter(|_| store.inner.image_saves)
        {
            let removed = tokio::task::spawn_blocking(move || {
                crate::adapters::fs::atomic::remove_stale_temps(&dir, image::TEMP_PREFIX)
            })
            .await
            .unwrap_or_default();
            for name in removed {
                store.inner.diag(
                    name,
                    "temporary file of an interrupted image save removed".into(),
                );
            }
        }
        if !defer_memory_load {
            store.load_memories().await?;
        }
        store
            .inner
            .read(&store.inner.variables, Need::All, |_| ())
            .await?;
        Ok(store)
    }

    /// Reads the memories (from the image in [`PgOptions::memory_image_dir`] and the rows
    /// after it, or every row) when the store was opened with
    /// [`PgOptions::defer_memory_load`] and no call has read them yet, else catches up; then
    /// saves an image when that read many rows. What a program runs in a task of its own
    /// after opening, so that the first memory call does not wait for every memory (memory
    /// calls made meanwhile wait for it, each within its own time limit). A large database
    /// may take longer than [`PgLimits::call_timeout`]: each attempt is bounded by it, and
    /// another follows as long as the last one got further (read an image or applied rows:
    /// rows are applied batch by batch),
    /// so a database that stops answering fails the load within that bound of its last
    /// answer, never holding the memories up for good.
    ///
    /// # Errors
    /// The database cannot be read, or did not answer within the bound (the next memory call
    /// tries again from where this got to).
    pub async fn load_memories(&self) -> Result<(), StoreError> {
        let progress = |m: &ops::Mirror<MemoryTable>| m.seq;
        loop {
            let before = progress(&*self.inner.memory.lock().await);
            let attempt = self
                .inner
                .bounded(
                    "load memories",
                    self.inner
                        .read(&self.inner.memory, Need::Scopes(&[]), |_| ()),
                )
                .await;
            match attempt {
                Ok(()) => break,
                Err(e) if progress(&*self.inner.memory.lock().await) == before => return Err(e),
                Err(_) => {}
            }
        }
        // Many rows read: the next open spares them.
        self.inner.save_memory_image_quietly(false).await;
        Ok(())
    }

    /// Saves the memory mirror's image now (in [`PgOptions::memory_image_dir`]), when the
    /// mirror has rows the last image lacks and every row could be read: the next process
    /// opening the database with that directory reads it and fetches only the rows written
    /// after. Also done by the store itself at open (after reading
    /// 4,096 rows or more) and after a compaction. The table is encoded while this process's
    /// memory calls wait (about 0.3 s per 100,000 memories), on the calling task's thread — on
    /// a multi-threaded runtime that worker's other tasks move to another meanwhile.
    /// Returns whether an image was written.
    ///
    /// # Errors
    /// The database cannot be asked which row the mirror ends at; the file cannot be written
    /// (the old image, if any, stays).
    pub async fn save_memory_image(&self) -> Result<bool, StoreError> {
        self.inner
            .bounded("memory image", self.inner.save_memory_image(true))
            .await
    }

    /// Whether the memory mirror began from the image in [`PgOptions::memory_image_dir`] (one
    /// that matched the database and could be read), not from the rows alone. False, too,
    /// while the memories are not read yet ([`PgOptions::defer_memory_load`]).
    pub async fn memory_image_read(&self) -> bool {
        self.inner.memory.lock().await.image_read
    }

    /// Whether every posting list the memory mirror's index still reads from the image it
    /// began from passes its checksum (read in one go, decoding none): what `tavern check`
    /// asks, since an open reads the lists only when a search first needs them.
    pub async fn memory_image_postings_whole(&self) -> bool {
        self.inner.memory.lock().await.table.postings_whole()
    }

    /// Memory operation rows this process has applied from the database since it opened:
    /// catch-ups and, holding memories by scope, each scope's load (an image read at open
    /// spares the rows it holds).
    pub async fn memory_rows_replayed(&self) -> u64 {
        self.inner.memory.lock().await.replayed
    }

    /// Problems found in stored data so far (unreadable operation rows, documents), newest
    /// last.
    pub fn diagnostics(&self) -> Vec<StoreDiagnostic> {
        self.inner.diagnostics.snapshot()
    }

    /// The value of a server setting on one of the store's pooled connections (`SHOW`).
    ///
    /// # Errors
    /// [`StoreError::Database`] when the server cannot be asked or knows no such setting.
    #[cfg(feature = "testkit")]
    pub async fn setting(&self, name: &str) -> Result<String, StoreError> {
        let client = self.inner.client("show").await?;
        let row = client
            .query_one("SELECT current_setting($1)", &[&name])
            .await
            .map_err(db("show"))?;
        row.try_get(0).map_err(db("show"))
    }

    /// The plan a pooled connection runs to load one scope of a store holding memories by
    /// scope ([`PgOptions::max_loaded_memories`]): `EXPLAIN` of the very statement, prepared
    /// as the store prepares it (generic plans, [`SESSION_SETTINGS`]).
    ///
    /// # Errors
    /// [`StoreError::Database`] when the server cannot be asked; a scope holding a NUL.
    #[cfg(feature = "testkit")]
    pub async fn memory_scope_plan(&self, scope: &str) -> Result<String, StoreError> {
        use ops::OpsTable;
        let client = self.inner.client("show").await?;
        let sql = format!(
            "PREPARE scope_plan AS {}; EXPLAIN EXECUTE scope_plan({}, 0, 9223372036854775807)",
            MemoryTable::SCOPE_SELECT,
            ops::literal(scope)?
        );
        let answer = client.simple_query(&sql).await.map_err(db("show"));
        let _ = client.batch_execute("DEALLOCATE scope_plan").await;
        Ok(answer?
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"))
    }

    /// The statements prepared on one of the store's pooled connections, with how many times
    /// each ran on a generic and on a custom plan (`pg_prepared_statements`): with a pool of
    /// one, what every call so far did.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the server cannot be asked.
    #[cfg(feature = "testkit")]
    pub async fn prepared_plans(&self) -> Result<Vec<(String, i64, i64)>, StoreError> {
        let client = self.inner.client("show").await?;
        let rows = client
            .query(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements
                 WHERE statement NOT LIKE '%pg_prepared_statements%'",
                &[],
            )
            .await
            .map_err(db("show"))?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(db("show"))
    }

    /// How many memory records (live, forgotten or expired) this process has loaded (waits for
    /// a load in progress; 0 before a deferred load).
    pub async fn memory_len(&self) -> usize {
        self.inner.memory.lock().await.table.len()
    }

    /// Whether the memories were read (always, unless the store was opened with
    /// [`PgOptions::defer_memory_load`] and no memory call nor [`PgStore::load_memories`] has
    /// started them yet). Never waits for a load in progress.
    pub fn memories_loaded(&self) -> bool {
        self.inner.memory.try_lock().is_ok_and(|m| m.started)
    }
}

impl Inner {
    async fn client(&self, op: &'static str) -> Result<Client, StoreError> {
        self.pool.get().await.map_err(pool_err(op))
    }

    /// Runs one port call within [`PgLimits::call_timeout`]. A call past it is dropped where
    /// it waits — its transaction, if one was open, is discarded with its connection
    /// (`ops::OpenTransaction`) — and every idle pooled connection is closed, the dropped
    /// call's among them: on a server that stopped answering they would all hang the next
    /// call too, and new connections are what recovers.
    async fn bounded<R>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<R, StoreError>>,
    ) -> Result<R, StoreError> {
        match tokio::time::timeout(self.limits.call_timeout, call).await {
            Ok(out) => out,
            Err(_) => {
                self.pool.retain(|_, _| false);
                Err(StoreError::Database {
                    op,
                    reason: format!(
                        "the database did not answer within {} ms; this process's idle \
                         connections were closed and new ones will be opened",
                        self.limits.call_timeout.as_millis()
                    ),
                })
            }
        }
    }

    fn diag(&self, file: String, message: String) {
        self.diagnostics.push(file, message);
    }

    async fn write_memory(
        &self,
        need: Need<'_>,
        prepare: impl Fn(&MemoryTable) -> Result<(MemoryRecord, MemoryOp), StoreError> + Send + Sync,
    ) -> Result<MemoryRecord, StoreError> {
        self.write(&self.memory, need, |t| prepare(t).map(Some))
            .await?
            .ok_or_else(|| StoreError::Internal("a memory write produced no operation".into()))
    }
}

/// What a call on the memories of `scopes` needs held (every scope when none is named).
fn scopes(scopes: &[tavern_core::ScopeKey]) -> Need<'_> {
    if scopes.is_empty() {
        Need::All
    } else {
        Need::Scopes(scopes)
    }
}

/// What a call on the memories of one scope needs held.
fn one(scope: &tavern_core::ScopeKey) -> Need<'_> {
    Need::Scopes(std::slice::from_ref(scope))
}

#[async_trait]
impl MemoryStore for PgStore {
    async fn search(&self, query: &MemoryQuery) -> Result<MemorySearchResult, StoreError> {
        let found = self
            .inner
            .bounded("search", async move {
                let now = self.inner.clock.now();
                self.inner
                    .read(&self.inner.memory, scopes(&query.scopes), |t| {
                        t.search(query, now)
                    })
                    .await
            })
            .await;
        self.save_if_healed().await;
        found
    }

    async fn read(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
    ) -> Result<Option<MemoryRecord>, StoreError> {
        let found = self
            .inner
            .bounded("read", async move {
                let now = self.inner.clock.now();
                let touched = self
                    .inner
                    .write(&self.inner.memory, one(scope), |t| {
                        Ok(t.read_live(scope, id, now).map(|_| {
                            let touch = MemoryOp::Touch {
                                scope: scope.clone(),
                                id: id.clone(),
                                at: now,
                            };
                            ((), touch)
                        }))
                    })
                    .await;
                match touched {
                    Ok(None) => Ok(None),
                    // Read again with a catch-up: a mirror held by scope may have dropped
                    // and reloaded the scope since.
                    Ok(Some(())) => {
                        self.inner
                            .read(&self.inner.memory, one(scope), |t| {
                                t.read_live(scope, id, now).cloned()
                            })
                            .await
                    }
                    // Recording the access time is bookkeeping: a read still answers when it cannot be
                    // written (a read-only role, a standby, a lock timeout), as FsStore's does.
                    Err(e) => {
                        self.inner.diag(
                            "memory_ops".into(),
                            format!("the access time of memory {id} was not recorded: {e}"),
                        );
                        self.inner
                            .read(&self.inner.memory, one(scope), |t| {
                                t.read_live(scope, id, now).cloned()
                            })
                            .await
                    }
                }
            })
            .await;
        self.save_if_healed().await;
        found
    }

    async fn inspect(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
    ) -> Result<Option<MemoryRecord>, StoreError> {
        let found = self
            .inner
            .bounded("inspect", async move {
                self.inner
                    .read(&self.inner.memory, one(scope), |t| {
                        t.get(scope, id).cloned()
                    })
                    .await
            })
            .await;
        self.save_if_healed().await;
        found
    }

    async fn put(
        &self,
        write: MemoryWrite,
        expected: Option<&Revision>,
        restore: bool,
    ) -> Result<MemoryRecord, StoreError> {
        self.inner
            .bounded("put", async move {
                let now = self.inner.clock.now();
                self.inner
                    .write_memory(one(&write.scope), |t| {
                        t.prepare_put(write.clone(), expected, restore, now)
                    })
                    .await
            })
            .await
    }

    async fn forget(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
        expected: &Revision,
        source: MemorySource,
    ) -> Result<MemoryRecord, StoreError> {
        self.inner
            .bounded("forget", async move {
                let now = self.inner.clock.now();
                self.inner
                    .write_memory(one(scope), |t| {
                        t.prepare_forget(id, scope, expected, source.clone(), now)
                    })
                    .await
            })
            .await
    }

    async fn memory_audit(
        &self,
        scope: &ScopeKey,
        id: Option<&MemoryId>,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let found = self
            .inner
            .bounded("memory audit", async move {
                let now = self.inner.clock.now();
                self.inner
                    .read(&self.inner.memory, one(scope), |t| t.audit(scope, id, now))
                    .await
            })
            .await;
        self.save_if_healed().await;
        found
    }
}

#[async_trait]
impl VariableStore for PgStore {
    async fn get(
        &self,
        scope: &ScopeKey,
        name: &VariableName,
    ) -> Result<Option<VariableRecord>, StoreError> {
        self.inner
            .bounded("get", async move {
                self.inner
                    .read(&self.inner.variables, Need::All, |t| {
                        t.get(scope, name).cloned()
                    })
                    .await
            })
            .await
    }

    async fn patch(
        &self,
        scope: &ScopeKey,
        changes: &[VariableChange],
        expected_scope: Option<&Revision>,
        source: MemorySource,
    ) -> Result<PatchOutcome, StoreError> {
        self.inner
            .bounded("patch", async move {
                let now = self.inner.clock.now();
                self.inner
                    .write(&self.inner.variables, Need::All, |t| {
                        let op = t.prepare_patch(scope, changes, expected_scope, &source, now)?;
                        Ok(Some((VariableTable::outcome(&op), op)))
                    })
                    .await?
                    .ok_or_else(|| StoreError::Internal("a patch produced no operation".into()))
            })
            .await
    }

    async fn list(
        &self,
        scope: &ScopeKey,
        prefix: &str,
        limit: usize,
    ) -> Result<VariableListing, StoreError> {
        self.inner
            .bounded("list", async move {
                self.inner
                    .read(&self.inner.variables, Need::All, |t| {
                        t.list(scope, prefix, limit)
                    })
                    .await
            })
            .await
    }

    async fn clear_scope(
        &self,
        scope: &ScopeKey,
        source: MemorySource,
    ) -> Result<usize, StoreError> {
        self.inner
            .bounded("clear scope", async move {
                let now = self.inner.clock.now();
                let cleared = self
                    .inner
                    .write(&self.inner.variables, Need::All, |t| {
                        Ok(t.prepare_clear(scope, &source, now)
                            .map(|op| (op.records.len(), op)))
                    })
                    .await?;
                Ok(cleared.unwrap_or(0))
            })
            .await
    }

    async fn variable_audit(&self, scope: &ScopeKey) -> Result<Vec<AuditEntry>, StoreError> {
        self.inner
            .bounded("variable audit", async move {
                self.inner
                    .read(&self.inner.variables, Need::All, |t| t.audit(scope))
                    .await
            })
            .await
    }
}
