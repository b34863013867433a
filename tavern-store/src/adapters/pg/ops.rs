//! The operation tables (`memory_ops`, `variable_ops`) and this process's mirror of each: how a
//! read catches up and how a write is checked and appended, in as few round trips as the
//! guarantees allow.
//!
//! A read is one round trip (the rows after the mirror's last sequence number), overlapped
//! with the work it serves: the answer is computed on the mirror while the query is in flight
//! and kept when no rows came back. A write prepares its operation against the mirror and
//! sends one message: the table lock and an insert that only happens when the table has no rows
//! the mirror lacks, one transaction the server runs without waiting for this process (so no
//! lock is ever held across a round trip: a host cut off mid-write holds nothing). When another
//! process wrote in between, nothing was inserted: the mirror catches up (no lock) and the write
//! is decided and sent again; only a write that keeps losing races decides under the lock held
//! across round trips (bounded by `idle_in_transaction`). Compare-and-set is always decided on
//! the whole table.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use deadpool_postgres::Client;
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use tavern_core::ScopeKey;

use super::{db, encode, Inner};
use crate::blocking::off_the_worker;
use crate::engine::memory_table::{MemoryOp, MemoryTable};
use crate::engine::oplog::{replay, Entry, OpTable};
use crate::engine::variable_table::{VariableOp, VariableTable};
use crate::error::StoreError;

/// Rows fetched per catch-up round trip: one literal for both the SQL `LIMIT` and the loop
/// that fetches again after a full batch, so they cannot disagree.
macro_rules! catch_up_batch {
    () => {
        2000
    };
}
const CATCH_UP_BATCH: usize = catch_up_batch!();

/// [`OpsTable::SCOPES`] of a table: a loose index scan, one `min(scope)` probe per scope.
macro_rules! scopes_select {
    ($table:literal) => {
        concat!(
            "WITH RECURSIVE s(scope) AS (SELECT min(scope) FROM ",
            $table,
            " WHERE scope > '' UNION ALL SELECT (SELECT min(o.scope) FROM ",
            $table,
            " o WHERE o.scope > s.scope) FROM s WHERE s.scope IS NOT NULL) \
             SELECT scope FROM s WHERE scope IS NOT NULL"
        )
    };
}

/// How a write's statements are planned: for their parameters (how long it waits for another
/// process's table lock is the connection's `lock_timeout`, [`super::PgLimits`]). A prepared statement's cached generic
/// plan is made once per connection, often while the table is still small, and a write's
/// `max(seq)` and catch-up would then scan the whole table until the next `ANALYZE` (0.4 ms per
/// write on 8,000 rows instead of one index probe). Reads keep the cheaper cached plans.
const WRITE_SETTINGS: &str = "SET LOCAL plan_cache_mode = force_custom_plan;";

/// An operation table in the database mirrored by an engine table in this process: the
/// PostgreSQL side of the [`OpTable`] seam.
pub(super) trait OpsTable: OpTable + Send + 'static {
    /// The database table.
    const NAME: &'static str;
    /// Locks the table against other writers until the transaction ends.
    const LOCK: &'static str;
    /// Rows after a sequence number (`seq`, `op`, `reset`, `scope`), in order, at most
    /// [`CATCH_UP_BATCH`]: memory per round trip stays bounded however far behind a mirror is,
    /// and the constant limit keeps the prepared statement's generic plan an index scan.
    const SELECT: &'static str;
    /// One scope's rows (`seq`, `op`) after `$2` up to `$3` (`$1` the scope), in order, at most
    /// [`CATCH_UP_BATCH`], reset rows left out: loading a scope into a mirror held by scope
    /// ([`Residency`]).
    const SCOPE_SELECT: &'static str;
    /// Every scope that has a row (reset rows' empty scope left out), one index probe each: a
    /// loose scan of `memory_ops_scope_seq (scope, seq)` (variable tables are never held by
    /// scope and have no such index).
    const SCOPES: &'static str;
    /// Inserts one operation row (`$1` scope, `$2` id, `$3` operation) and returns its
    /// sequence number, unless the table has rows after `$4` (the mirror was behind). The test
    /// is `max(seq)`, one index probe whatever the plan (a prepared `NOT EXISTS (… seq > $4)`
    /// gets a generic plan that scans the whole table).
    const INSERT: &'static str;
    /// The scope and record id an operation is about (columns for people reading the table).
    fn keys(op: &Self::Op) -> (String, Option<String>);
    /// This process's writer gate of the table.
    fn writers(inner: &Inner) -> &Mutex<()>;
    /// Where this process keeps the table's image, for a table that keeps one.
    fn image_dir(_inner: &Inner) -> Option<&Path> {
        None
    }
    /// How many operations of the table's snapshot each scope holds (records, for memories):
    /// what loading a scope costs this process ([`Residency`]).
    fn scope_lens(&self) -> Vec<(String, usize)> {
        let mut lens = std::collections::HashMap::<String, usize>::new();
        for op in self.snapshot() {
            *lens.entry(Self::keys(&op).0).or_default() += 1;
        }
        lens.into_iter().collect()
    }
    /// The table with only the scopes `keep` accepts (the others evicted), as replaying their
    /// snapshot would give it.
    fn retain_scopes(&self, keep: &dyn Fn(&str) -> bool) -> Self {
        let mut table = Self::default();
        let kept: Vec<Self::Op> = self
            .snapshot()
            .into_iter()
            .filter(|op| keep(&Self::keys(op).0))
            .collect();
        table.apply_ops(kept);
        table
    }
}

impl OpsTable for MemoryTable {
    const NAME: &'static str = "memory_ops";
    const LOCK: &'static str = "LOCK TABLE memory_ops IN EXCLUSIVE MODE";
    const SELECT: &'static str = concat!(
        "SELECT seq, op::text, reset, scope FROM memory_ops WHERE seq > $1 ORDER BY seq LIMIT ",
        catch_up_batch!()
    );
    const SCOPE_SELECT: &'static str = concat!(
        "SELECT seq, op::text FROM memory_ops WHERE scope = $1 AND seq > $2 AND seq <= $3 \
         AND NOT reset ORDER BY seq LIMIT ",
        catch_up_batch!()
    );
    const SCOPES: &'static str = scopes_select!("memory_ops");
    const INSERT: &'static str =
        "INSERT INTO memory_ops (scope, id, op) SELECT $1, $2, $3::text::json
         WHERE coalesce((SELECT max(seq) FROM memory_ops), 0) <= $4 RETURNING seq";
    fn writers(inner: &Inner) -> &Mutex<()> {
        &inner.memory_writers
    }
    fn image_dir(inner: &Inner) -> Option<&Path> {
        inner.image_dir.as_deref()
    }
    fn scope_lens(&self) -> Vec<(String, usize)> {
        self.records_per_scope()
    }
    fn retain_scopes(&self, keep: &dyn Fn(&str) -> bool) -> Self {
        self.keep_scopes(keep)
    }
    fn keys(op: &MemoryOp) -> (String, Option<String>) {
        match op {
            MemoryOp::Put { record, .. } | MemoryOp::Snapshot { record, .. } => {
                (record.scope.to_string(), Some(record.id.to_string()))
            }
            MemoryOp::Touch { scope, id, .. } => (scope.to_string(), Some(id.to_string())),
        }
    }
}

impl OpsTable for VariableTable {
    const NAME: &'static str = "variable_ops";
    const LOCK: &'static str = "LOCK TABLE variable_ops IN EXCLUSIVE MODE";
    const SELECT: &'static str = concat!(
        "SELECT seq, op::text, reset, scope FROM variable_ops WHERE seq > $1 ORDER BY seq LIMIT ",
        catch_up_batch!()
    );
    const SCOPE_SELECT: &'static str = concat!(
        "SELECT seq, op::text FROM variable_ops WHERE scope = $1 AND seq > $2 AND seq <= $3 \
         AND NOT reset ORDER BY seq LIMIT ",
        catch_up_batch!()
    );
    const SCOPES: &'static str = scopes_select!("variable_ops");
    const INSERT: &'static str =
        "INSERT INTO variable_ops (scope, id, op) SELECT $1, $2, $3::text::json
         WHERE coalesce((SELECT max(seq) FROM variable_ops), 0) <= $4 RETURNING seq";
    fn writers(inner: &Inner) -> &Mutex<()> {
        &inner.variable_writers
    }
    fn keys(op: &VariableOp) -> (String, Option<String>) {
        (op.scope.to_string(), None)
    }
}

/// This process's copy of an operation table: the engine table and the last row applied.
#[derive(Default)]
pub(super) struct Mirror<T> {
    pub(super) table: T,
    pub(super) seq: i64,
    /// The sequence numbers of the rows since the last compaction that could not be read
    /// (skipped with a diagnostic, once each: a mirror held by scope may read a row again when
    /// it loads a dropped scope again).
    pub(super) unreadable: std::collections::BTreeSet<i64>,
    /// The last row of the newest image saved or read here (0: none).
    pub(super) image_seq: i64,
    /// Whether the mirror began from an image.
    pub(super) image_read: bool,
    /// Whether it may not begin from an image again: one it began from could not give a
    /// record back ([`Inner::reset_if_lost`]).
    pub(super) image_refused: bool,
    /// Rows applied from catch-ups since the store opened.
    pub(super) replayed: u64,
    /// Whether the mirror was started (from the table's image, when there is one): see
    /// [`Inner::lock_mirror`].
    pub(super) started: bool,
    /// Which scopes the mirror holds, when it holds only some ([`Residency`]); `None`: all.
    pub(super) residency: Option<Residency>,
    /// A scope was loaded since the last catch-up: it may hold less than the table (a
    /// compaction elsewhere deleted rows while it loaded), so nothing but a successful insert
    /// is decided on it until a catch-up.
    pub(super) loaded: bool,
}

impl<T> Mirror<T> {
    /// An empty mirror that will hold only the scopes calls need, about `bound` operations
    /// (records, for memories) at most beyond what one call needs ([`Residency`]).
    pub(super) fn by_scope(bound: usize) -> Self
    where
        T: Default,
    {
        Self {
            residency: Some(Residency {
                bound,
                ..Residency::default()
            }),
            ..Self::default()
        }
    }

    /// Whether the mirror holds `scope` (every row of it up to `seq` applied).
    fn holds(&self, scope: &str) -> bool {
        self.residency
            .as_ref()
            .is_none_or(|r| r.all || r.scopes.contains_key(scope))
    }
}

/// A mirror that holds the scopes calls touch, not the whole table
/// ([`super::PgOptions::max_loaded_memories`]). One sequence number (`Mirror::seq`) stands for
/// every scope held: a scope is loaded with its rows up to it (one index range, `(scope,
/// seq)`), catch-ups apply the rows of held scopes and skip the others', and a write's
/// compare-and-set stays decided on the whole table (its insert still requires that no row
/// follows `seq`). When the scopes held pass the bound, the least recently used ones are
/// dropped (never one the current call needs) until three quarters of it are left, in one
/// rebuild of what stays.
#[derive(Default)]
pub(super) struct Residency {
    /// Operations (records) held at most, beyond what one call needs.
    bound: usize,
    /// The scopes held, by the use count of their last use.
    scopes: std::collections::HashMap<String, u64>,
    /// Uses so far (the clock of `scopes`).
    uses: u64,
    /// Every scope is held (a call needed all of them: a search of every scope, a compaction,
    /// an export); the next call over the bound drops the least recently used.
    all: bool,
}

/// Which scopes a call reads or writes: what a mirror held by scope must hold for it.
#[derive(Clone, Copy)]
pub(super) enum Need<'a> {
    /// Every scope (a search without scopes, a compaction, an export).
    All,
    /// These scopes.
    Scopes(&'a [ScopeKey]),
}

impl Inner {
    /// Locks `mirror`; on its first use, starts it from the table's image when one matches
    /// the database (`image`). Every use of a mirror goes through here, so a store opened
    /// without reading its memories ([`super::PgOptions::defer_memory_load`]) reads the image
    /// before any row, whichever call comes first. A mirror held by scope ([`Residency`])
    /// starts at the table's last row holding nothing, and loads the scopes `need` names
    /// before it is handed out.
    pub(super) async fn lock_mirror<'a, T: OpsTable>(
        &self,
        mirror: &'a Mutex<Mirror<T>>,
        need: Need<'_>,
    ) -> Result<MutexGuard<'a, Mirror<T>>, StoreError> {
        let mut m = mirror.lock().await;
        self.reset_if_lost(&mut m);
        if !m.started {
            if let Some(dir) = T::image_dir(self).filter(|_| !m.image_refused) {
                self.restore_image(dir.to_path_buf(), &mut m).await?;
            }
            if m.residency.is_some() {
                m.seq = self.last_seq::<T>().await?;
            }
            m.started = true;
        }
        if m.residency.is_some() {
            self.hold(&mut m, need).await?;
        }
        Ok(m)
    }

    /// When the mirror could not read a record back from the image it began from (the file
    /// changed since: [`OpTable::lost`], so what it answered or decided since may lack it),
    /// empties it to start again from the rows alone — never from an image again in this
    /// process — and reports it; whether it did.
    pub(super) fn reset_if_lost<T: OpsTable>(&self, m: &mut Mirror<T>) -> bool {
        if !m.table.lost() {
            return false;
        }
        self.diag(
            super::image::FILE.into(),
            "a record read from it was not the one checked when it was opened (the file \
             changed since); the memories are read again from the database"
                .into(),
        );
        let fresh = match &m.residency {
            Some(r) => Mirror::by_scope(r.bound),
            None => Mirror::default(),
        };
        *m = Mirror {
            image_refused: true,
            ..fresh
        };
        // The file on disk is the changed one: saved again from the rows after this call.
        self.image_healed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// The table's last sequence number (0 when empty).
    async fn last_seq<T: OpsTable>(&self) -> Result<i64, StoreError> {
        let client = self.client("load").await?;
        let row = client
            .query_one(
                &format!("SELECT coalesce(max(seq), 0) FROM {}", T::NAME),
                &[],
            )
            .await
            .map_err(db("load"))?;
        row.try_get(0).map_err(db("load"))
    }

    /// Makes a mirror held by scope hold what `need` names, then drops the least recently
    /// used scopes when it holds more than its bound.
    async fn hold<T: OpsTable>(&self, m: &mut Mirror<T>, need: Need<'_>) -> Result<(), StoreError> {
        let Some(r) = m.residency.as_mut() else {
            return Ok(());
        };
        r.uses += 1;
        let now = r.uses;
        match need {
            Need::All if !r.all => {
                // The scopes not held yet, each loaded as a scoped call loads it, up to the
                // mirror's sequence number (which stays: the caller's catch-up brings the
                // rest). A call cut off halfway keeps the scopes it loaded, so the next call
                // that needs every scope loads only the others.
                for scope in self.scopes::<T>().await? {
                    if !m.holds(&scope) {
                        self.load_scope(m, &scope).await?;
                    }
                }
                if let Some(r) = m.residency.as_mut() {
                    r.all = true;
                }
            }
            Need::All => {}
            Need::Scopes(scopes) => {
                for scope in scopes {
                    let key = scope.to_string();
                    if !m.holds(&key) {
                        self.load_scope(m, &key).await?;
                    }
                    if let Some(r) = m.residency.as_mut() {
                        r.scopes.insert(key, now);
                    }
                }
            }
        }
        evict(m, need);
        Ok(())
    }

    /// Every scope that has a row in `T`'s table, in the order of their names.
    async fn scopes<T: OpsTable>(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client("load").await?;
        let list = client
            .prepare_cached(T::SCOPES)
            .await
            .map_err(db("list scopes"))?;
        let rows = client.query(&list, &[]).await.map_err(db("list scopes"))?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(db("list scopes")))
            .collect()
    }

    /// Loads one scope's rows up to the mirror's sequence number, all of them before any is
    /// applied (a failure halfway applies nothing). A compaction that commits meanwhile
    /// deletes the rows not yet read: the scope is then loaded partly, but the compaction's
    /// reset row follows the mirror's sequence number, so the next catch-up (every read
    /// makes one before it answers; a write's insert fails until it has) rebuilds every
    /// scope held from the snapshot.
    async fn load_scope<T: OpsTable>(
        &self,
        m: &mut Mirror<T>,
        scope: &str,
    ) -> Result<(), StoreError> {
        let client = self.client("load").await?;
        let select = client
            .prepare_cached(T::SCOPE_SELECT)
            .await
            .map_err(db("load scope"))?;
        let mut texts: Vec<(i64, String)> = Vec::new();
        let mut after = 0i64;
        loop {
            let rows = client
                .query(&select, &[&scope, &after, &m.seq])
                .await
                .map_err(db("load scope"))?;
            for row in &rows {
                let seq: i64 = row.try_get(0).map_err(db("load scope"))?;
                let text: String = row.try_get(1).map_err(db("load scope"))?;
                texts.push((seq, text));
            }
            match texts.last() {
                Some(&(seq, _)) if rows.len() >= CATCH_UP_BATCH => after = seq,
                _ => break,
            }
        }
        let entries: Vec<Entry<'_>> = texts.iter().map(|(_, t)| Entry::Op(t)).collect();
        let done = replay(&mut m.table, &entries)?;
        m.replayed += texts.len() as u64;
        for u in done.unreadable {
            let seq = texts.get(u.index).map_or(0, |t| t.0);
            self.unreadable(&mut m.unreadable, seq, &u.reason, T::NAME);
        }
        if let Some(r) = m.residency.as_mut() {
            r.scopes.insert(scope.to_owned(), r.uses);
        }
        m.loaded = true;
        Ok(())
    }

    /// Applies catch-up rows (sequence number, operation) in order. Unreadable rows are skipped
    /// with a diagnostic (never fatal, as a corrupt log line in the file store).
    fn apply_rows<T: OpsTable>(
        &self,
        rows: &[Row],
        mirror: &mut Mirror<T>,
    ) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut seqs = Vec::with_capacity(rows.len());
        let mut entries = Vec::with_capacity(rows.len());
        let mut last = mirror.seq;
        for row in rows {
            let seq: i64 = row.try_get(0).map_err(db("catch up"))?;
            last = seq;
            let reset: bool = row.try_get(2).map_err(db("catch up"))?;
            // A mirror held by scope skips the rows of the scopes it does not hold.
            if !reset && mirror.residency.is_some() {
                let scope: &str = row.try_get(3).map_err(db("catch up"))?;
                if !mirror.holds(scope) {
                    continue;
                }
            }
            let text: &str = row.try_get(1).map_err(db("catch up"))?;
            seqs.push(seq);
            // A reset row is a compaction: what follows is the whole table.
            entries.push(if reset { Entry::Reset } else { Entry::Op(text) });
        }
        let done = replay(&mut mirror.table, &entries)?;
        if done.reset {
            mirror.unreadable.clear();
        }
        for u in done.unreadable {
            let seq = seqs.get(u.index).copied().unwrap_or_default();
            self.unreadable(&mut mirror.unreadable, seq, &u.reason, T::NAME);
        }
        mirror.seq = last;
        mirror.replayed += rows.len() as u64;
        Ok(())
    }

    /// Counts an unreadable row and reports it, once per row.
    fn unreadable(
        &self,
        seen: &mut std::collections::BTreeSet<i64>,
        seq: i64,
        why: &str,
        table: &str,
    ) {
        if seen.insert(seq) {
            self.diag(
                format!("{table} seq {seq}"),
                format!("unreadable operation ({why}); skipped"),
            );
        }
    }

    /// Catches the mirror up and runs `f` on it.
    pub(super) async fn read<T: OpsTable, R>(
        &self,
        mirror: &Mutex<Mirror<T>>,
        need: Need<'_>,
        f: impl Fn(&T) -> R + Send + Sync,
    ) -> Result<R, StoreError> {
        // An answer of a mirror that could not read a record back from its image is not
        // used: the mirror, emptied, reads every row again and answers (read from rows
        // alone, it cannot be lost again).
        if let Some(answer) = self.read_once(mirror, need, &f).await? {
            return Ok(answer);
        }
        self.read_once(mirror, need, &f)
            .await?
            .ok_or_else(|| StoreError::Internal("a mirror read from rows was lost".into()))
    }

    /// [`Inner::read`] once: `None` when the mirror turned out lost (and was emptied).
    async fn read_once<T: OpsTable, R>(
        &self,
        mirror: &Mutex<Mirror<T>>,
        need: Need<'_>,
        f: &(impl Fn(&T) -> R + Send + Sync),
    ) -> Result<Option<R>, StoreError> {
        // The mirror first, then a connection: a task waiting for the mirror holds no
        // connection, so a full pool never waits on itself.
        let mut m = self.lock_mirror(mirror, need).await?;
        let client = self.client("read").await?;
        // A prepared statement (cached per connection): one round trip. One statement, one
        // snapshot: every row it returns was committed, and (writers being serialized) so was
        // every row before it.
        let select = client
            .prepare_cached(T::SELECT)
            .await
            .map_err(db("catch up"))?;
        let seq = m.seq;
        let (early, rows) = {
            let after: [&(dyn ToSql + Sync); 1] = [&seq];
            let mut query = std::pin::pin!(client.query(&select, &after));
            // Send the query, then compute the answer on the mirror while the server replies:
            // when nothing new came back (almost always) that answer stands.
            let sent = std::future::poll_fn(|cx| Poll::Ready(query.as_mut().poll(cx))).await;
            // The first poll only queued the request for the connection's task, which tokio
            // runs next on this thread: let it write the request to the socket before the
            // mirror is searched, or the server would only hear of it afterwards.
            if sent.is_pending() {
                tokio::task::yield_now().await;
            }
            let early = sent.is_pending().then(|| f(&m.table));
            let rows = match sent {
                Poll::Ready(rows) => rows,
                Poll::Pending => query.await,
            };
            (early, rows.map_err(db("catch up"))?)
        };
        if let Some(answer) = early.filter(|_| rows.is_empty()) {
            m.loaded = false;
            let answer = self.healed(&mut m, answer, f);
            return Ok((!self.reset_if_lost(&mut m)).then_some(answer));
        }
        self.apply_batch(&client, &select, &rows, &mut m).await?;
        m.loaded = false;
        drop(client);
        let answer = f(&m.table);
        let answer = self.healed(&mut m, answer, f);
        Ok((!self.reset_if_lost(&mut m)).then_some(answer))
    }

    /// `answer`; or, when computing it found a posting list of the image the mirror was read
    /// from damaged, the answer computed again on the index rebuilt from the records (the
    /// damage reported, and the image due to be saved again).
    fn healed<T: OpsTable, R>(&self, m: &mut Mirror<T>, answer: R, f: &impl Fn(&T) -> R) -> R {
        // Rebuilding a large index takes seconds: on a multi-threaded runtime the worker hands
        // its other tasks over meanwhile (only then: handing them over costs every call).
        if !m.table.needs_heal() || !off_the_worker(|| m.table.heal()) {
            return answer;
        }
        self.diag(
            super::image::FILE.into(),
            "a posting list read from it was damaged; the search index was rebuilt from the \
             records"
                .into(),
        );
        m.image_seq = 0;
        self.image_healed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        f(&m.table)
    }

    /// Applies a catch-up batch and, when it was full, fetches and applies the rest.
    pub(super) async fn apply_batch<T: OpsTable>(
        &self,
        client: &Client,
        select: &tokio_postgres::Statement,
        rows: &[Row],
        m: &mut Mirror<T>,
    ) -> Result<(), StoreError> {
        self.apply_rows(rows, m)?;
        let mut full = rows.len() >= CATCH_UP_BATCH;
        while full {
            let rows = client
                .query(select, &[&m.seq])
                .await
                .map_err(db("catch up"))?;
            self.apply_rows(&rows, m)?;
            full = rows.len() >= CATCH_UP_BATCH;
        }
        Ok(())
    }

    /// Runs a write: `prepare` checks the change against the table and produces its operation
    /// (or nothing to write, or a refusal); the operation is inserted and committed, then
    /// applied here. The decision is only ever kept when it was made on the whole table: the
    /// insert is conditional on the mirror having been current, under the table lock.
    ///
    /// The lock is held only while the server runs one message (lock, conditional insert,
    /// commit): a host cut off at any point holds nothing. A write that lost a race catches
    /// up (no lock) and tries again, [`super::PgLimits::unlocked_attempts`] times; after that
    /// it decides under the lock across round trips ([`Inner::write_locked`]), so a write
    /// that keeps losing races still gets its turn.
    ///
    /// Every row commits durably, access times too: a row that other processes saw and a
    /// crash then lost would let its sequence number be reused, and a mirror that already
    /// moved past it would never see the row that reuses it.
    pub(super) async fn write<T: OpsTable, R: Send>(
        &self,
        mirror: &Mutex<Mirror<T>>,
        need: Need<'_>,
        prepare: impl Fn(&T) -> Result<Option<(R, T::Op)>, StoreError> + Send + Sync,
    ) -> Result<Option<R>, StoreError> {
        // Decided on a mirror that may be behind, nothing is final but a success (the insert
        // checks the mirror was current): a refusal, or nothing to write (a turn's end with no
        // turn variables), is only the answer once decided on a mirror caught up since this
        // call began — without any lock, as of that read (a write that lands after it is
        // simply later).
        // One writer of this table at a time in this process (held across the server's answer,
        // unlike the mirror): only other hosts make a write lose a race.
        let _writer = T::writers(self).lock().await;
        let mut caught_up = false;
        for _ in 0..=self.limits.unlocked_attempts {
            // The mirror is held only to decide and to apply, never while the server runs
            // the write (or waits for another host's lock): this process's reads and other
            // writes go on meanwhile. Whoever holds both takes the mirror first, so a full
            // pool never waits on itself.
            let decided = {
                let mut m = self.lock_mirror(mirror, need).await?;
                // Decided on a scope just loaded, only a success is final.
                if m.loaded {
                    caught_up = false;
                }
                let decision = prepare(&m.table);
                (!self.reset_if_lost(&mut m)).then_some((decision, m.seq))
            };
            let Some((decision, after)) = decided else {
                // Decided on a mirror that could not read a record back: not used; the
                // mirror, emptied, reads the rows again before deciding again.
                self.read(mirror, need, |_| ()).await?;
                caught_up = true;
                continue;
            };
            match decision {
                Ok(Some((out, op))) => {
                    // Dropped before the answer (a cancelled call), the connection is discarded,
                    // not pooled with a write in flight that may wait for another host's lock.
                    let tx = OpenTransaction::new(self.client("write").await?);
                    tx.begin();
                    let appended = self.append_if_current::<T>(tx.client()?, after, &op).await;
                    tx.ended();
                    tx.closed();
                    let appended = appended?;
                    if let Some(seq) = appended {
                        let mut m = mirror.lock().await;
                        // No row lies between `after` and `seq` (the insert required none after
                        // `after`, under the lock), so the row is applied only onto the very
                        // state it was decided on. Otherwise a catch-up since applied it; in a
                        // mirror held by scope, the op's scope may also have been dropped
                        // since (its next load reads the row).
                        if m.seq == after {
                            if m.holds(&T::keys(&op).0) {
                                m.table.apply_ops(vec![op]);
                            }
                            m.seq = seq;
                        }
                        return Ok(Some(out));
                    }
                    // Another process (or another write here) came first: catch up, decide again.
                }
                other if caught_up => return other.map(|_| None),
                _ => {}
            }
            self.read(mirror, need, |_| ()).await?;
            caught_up = true;
        }
        let mut m = self.lock_mirror(mirror, need).await?;
        let client = self.client("write").await?;
        let statements = Statements::prepare::<T>(&client).await?;
        // Until it is closed cleanly, the transaction's connection is discarded rather than
        // returned to the pool mid-transaction (an error, or this future being dropped).
        self.write_locked(OpenTransaction::new(client), &statements, &mut m, prepare)
            .await
    }

    /// One message, one round trip: lock, insert `op` if the table has no row after the
    /// mirror's, commit — the simple protocol runs a message's statements as one transaction,
    /// and the server reads a message whole before it runs any of it, so the lock is never
    /// held waiting for this process. The sequence number of the inserted row, or `None` when
    /// the mirror was behind and nothing was inserted.
    async fn append_if_current<T: OpsTable>(
        &self,
        client: &Client,
        after: i64,
        op: &T::Op,
    ) -> Result<Option<i64>, StoreError> {
        let text = encode(op, "an operation")?;
        let (scope, id) = T::keys(op);
        let id = match &id {
            Some(id) => literal(id)?,
            None => "NULL".to_owned(),
        };
        // Built in one pass, values last: no value's text is ever read as SQL.
        let sql = format!(
            "{lock}; INSERT INTO {table} (scope, id, op) SELECT {scope}, {id}, {text}::json \
             WHERE coalesce((SELECT max(seq) FROM {table}), 0) <= {after} RETURNING seq",
            lock = T::LOCK,
            table = T::NAME,
            scope = literal(&scope)?,
            text = literal(&text)?,
        );
        // If the outcome is unknown (the connection dropped), nothing is applied here: the
        // next catch-up finds the row if it was committed.
        let answer = client.simple_query(&sql).await.map_err(db("write"))?;
        let Some(seq) = answer.iter().find_map(|a| match a {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row.get(0)),
            _ => None,
        }) else {
            return Ok(None);
        };
        let seq: i64 = seq.and_then(|s| s.parse().ok()).ok_or_else(|| {
            StoreError::Internal(format!("{} returned no sequence number", T::NAME))
        })?;
        newer(seq, after, T::NAME)?;
        Ok(Some(seq))
    }

    /// Two round trips: (begin, lock, catch up), decide on the caught-up table, then (insert,
    /// commit). Writers are serialized by the lock, so the decision stands until the commit.
    async fn write_locked<T: OpsTable, R: Send>(
        &self,
        tx: OpenTransaction,
        statements: &Statements,
        m: &mut Mirror<T>,
        prepare: impl Fn(&T) -> Result<Option<(R, T::Op)>, StoreError> + Send + Sync,
    ) -> Result<Option<R>, StoreError> {
        let c = tx.client()?;
        let after: [&(dyn ToSql + Sync); 1] = [&m.seq];
        let begin = begin::<T>();
        tx.begin();
        let (begun, rows) = tokio::join!(
            biased;
            c.batch_execute(&begin),
            c.query(&statements.select, &after)
        );
        let caught_up = match (begun, rows) {
            (Ok(()), Ok(rows)) => self.apply_batch(c, &statements.select, &rows, m).await,
            (Err(e), _) => Err(db("write")(e)),
            (_, Err(e)) => Err(db("catch up")(e)),
        };
        if let Err(e) = caught_up {
            // Nothing was written: end the transaction and keep the connection if that works.
            tx.rollback().await;
            return Err(e);
        }
        let decision = prepare(&m.table);
        if self.reset_if_lost(m) {
            tx.rollback().await;
            return Err(StoreError::Corrupt {
                file: super::image::FILE.into(),
                reason: "a record read from it changed since it was opened; the memories are \
                         read again from the database: try again"
                    .into(),
            });
        }
        let (out, op) = match decision {
            Ok(Some(prepared)) => prepared,
            // Refused or nothing to do: roll back and keep the connection.
            other => {
                tx.rollback().await;
                return other.map(|_| None);
            }
        };
        let text = encode(&op, "an operation")?;
        let (scope, id) = T::keys(&op);
        let values: [&(dyn ToSql + Sync); 4] = [&scope, &id, &text, &m.seq];
        let (inserted, committed) = tokio::join!(
            biased;
            c.query(&statements.insert, &values),
            c.batch_execute("COMMIT")
        );
        committed.map_err(db("commit"))?;
        tx.ended();
        tx.closed();
        let inserted = inserted.map_err(db("write"))?;
        let row = inserted
            .first()
            .ok_or_else(|| StoreError::Internal(format!("{} changed under its lock", T::NAME)))?;
        let seq: i64 = row.try_get(0).map_err(db("write"))?;
        newer(seq, m.seq, T::NAME)?;
        // Every row before `seq` is applied already (gaps are rolled-back inserts).
        m.table.apply_ops(vec![op]);
        m.seq = seq;
        Ok(Some(out))
    }
}

/// Most scopes a mirror held by scope keeps when they hold nothing (scopes searched that have
/// no memories yet cost no records, but their names add up).
const MAX_HELD_SCOPES: usize = 4096;

/// Drops the least recently used scopes of a mirror held by scope when it holds more than its
/// bound (never one `need` names), down to three quarters of it, in one rebuild of the rest.
fn evict<T: OpsTable>(m: &mut Mirror<T>, need: Need<'_>) {
    let Mirror {
        table, residency, ..
    } = m;
    let (Some(r), Need::Scopes(needed)) = (residency.as_mut(), need) else {
        // A call that needs every scope keeps them all; the next one that does not drops.
        return;
    };
    let lens = table.scope_lens();
    let mut total: usize = lens.iter().map(|(_, n)| n).sum();
    if total <= r.bound && r.scopes.len() <= MAX_HELD_SCOPES {
        return;
    }
    let needed: std::collections::HashSet<String> =
        needed.iter().map(ToString::to_string).collect();
    // Every scope held: those with records, and those loaded empty.
    let mut sizes: std::collections::HashMap<String, usize> = lens.into_iter().collect();
    for scope in r.scopes.keys() {
        sizes.entry(scope.clone()).or_insert(0);
    }
    // Every scope held, the needed ones too (while every scope is held, `r.scopes` may lack
    // those that came with catch-ups).
    let mut held = sizes.len();
    let mut order: Vec<(u64, String, usize)> = sizes
        .into_iter()
        .filter(|(scope, _)| !needed.contains(scope))
        .map(|(scope, n)| (r.scopes.get(&scope).copied().unwrap_or(0), scope, n))
        .collect();
    order.sort_unstable();
    let target = r.bound - r.bound / 4;
    let mut gone = std::collections::HashSet::new();
    let mut rebuild = false;
    for (_, scope, n) in order {
        if total <= target && held <= MAX_HELD_SCOPES - MAX_HELD_SCOPES / 4 {
            break;
        }
        total -= n;
        held = held.saturating_sub(1);
        rebuild |= n > 0;
        gone.insert(scope);
    }
    if rebuild {
        let kept = table.retain_scopes(&|scope| !gone.contains(scope));
        // A record it could not read back would be missing from the rebuilt table, which
        // nothing would mark: the lost one stays, for the caller to empty and read again.
        if table.lost() {
            return;
        }
        *table = kept;
    }
    if r.all {
        // What was held as "every scope" is now named one by one (least recent first).
        for (scope, _) in table.scope_lens() {
            r.scopes.entry(scope).or_insert(0);
        }
        r.all = false;
    }
    r.scopes.retain(|scope, _| !gone.contains(scope));
}

/// Rows per statement when many operations are inserted at once (a copy, a compaction).
const INSERT_BATCH: usize = 1000;

/// Inserts `ops` as rows of `T`'s table in their order (sequence numbers follow it), a batch
/// per statement. The caller holds the table lock in an open transaction.
pub(super) async fn insert_ops<T: OpsTable>(
    client: &impl deadpool_postgres::GenericClient,
    ops: &[T::Op],
    op: &'static str,
) -> Result<(), StoreError> {
    let insert = format!(
        "INSERT INTO {} (scope, id, op)
         SELECT t.scope, t.id, t.op::json
         FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS t(scope, id, op, n)
         ORDER BY t.n",
        T::NAME
    );
    for chunk in ops.chunks(INSERT_BATCH) {
        let mut scopes = Vec::with_capacity(chunk.len());
        let mut ids = Vec::with_capacity(chunk.len());
        let mut texts = Vec::with_capacity(chunk.len());
        for o in chunk {
            let (scope, id) = T::keys(o);
            scopes.push(scope);
            ids.push(id);
            texts.push(encode(o, "an operation")?);
        }
        let params: [&(dyn ToSql + Sync); 3] = [&scopes, &ids, &texts];
        client.execute(&insert, &params).await.map_err(db(op))?;
    }
    Ok(())
}

/// `text` as an SQL escape-string literal (`E'…'`, backslashes and quotes doubled), which reads
/// the same whatever `standard_conforming_strings` says (a pooler may not keep the session's
/// setting). The server refuses NUL in text whichever way it is sent.
pub(super) fn literal(text: &str) -> Result<String, StoreError> {
    if text.contains('\0') {
        return Err(StoreError::Database {
            op: "write",
            reason: "text with a NUL character cannot be stored".into(),
        });
    }
    Ok(format!(
        "E'{}'",
        text.replace('\\', "\\\\").replace('\'', "''")
    ))
}

/// A row just inserted must come after every row the mirror has: a smaller sequence number
/// means the database was restored or renumbered under this process (or its sequence caches
/// values), and the mirror can no longer be trusted to have every row.
fn newer(seq: i64, mirror: i64, table: &str) -> Result<(), StoreError> {
    if seq > mirror {
        Ok(())
    } else {
        Err(StoreError::Database {
            op: "write",
            reason: format!(
                "{table} handed out sequence number {seq}, not after {mirror} which this process \
                 has already seen: was the database restored under a running process? restart it"
            ),
        })
    }
}

/// Opens a write transaction on `T`'s table: a writer stalled in another process (a partition
/// before its commit) must not hold every reader and writer here forever, so waiting for the
/// lock is bounded.
pub(super) fn begin<T: OpsTable>() -> String {
    format!("BEGIN; {WRITE_SETTINGS} {};", T::LOCK)
}

/// The prepared statements of one table on one connection (cached by the pool per connection).
pub(super) struct Statements {
    pub(super) select: tokio_postgres::Statement,
    pub(super) insert: tokio_postgres::Statement,
}

impl Statements {
    pub(super) async fn prepare<T: OpsTable>(client: &Client) -> Result<Self, StoreError> {
        Ok(Self {
            select: client
                .prepare_cached(T::SELECT)
                .await
                .map_err(db("write"))?,
            insert: client
                .prepare_cached(T::INSERT)
                .await
                .map_err(db("write"))?,
        })
    }
}

/// A connection for transactions begun by hand (so that `BEGIN` can share a round trip with
/// what follows). Dropped while a transaction may be open on it — after [`OpenTransaction::begin`]
/// and before an answered `COMMIT`/`ROLLBACK` ([`OpenTransaction::ended`]) — the connection
/// leaves the pool and closes: a pooled connection is never handed out mid-transaction. (If the
/// future was dropped after the `COMMIT` was queued, the server may still commit it; the row is
/// then found by the next catch-up, as after any commit whose answer was lost.)
pub(super) struct OpenTransaction {
    client: Option<Client>,
    idle: AtomicBool,
}

impl OpenTransaction {
    pub(super) fn new(client: Client) -> Self {
        Self {
            client: Some(client),
            idle: AtomicBool::new(true),
        }
    }

    pub(super) fn client(&self) -> Result<&Client, StoreError> {
        // Set from `new` until `closed`/`rollback`/drop, which all consume `self`.
        self.client
            .as_ref()
            .ok_or_else(|| StoreError::Internal("a closed transaction was used".into()))
    }

    /// A transaction is about to be opened: until [`OpenTransaction::ended`] the connection
    /// is not reusable.
    pub(super) fn begin(&self) {
        self.idle.store(false, Ordering::SeqCst);
    }

    /// The server answered the transaction's `COMMIT` or `ROLLBACK` (whatever else failed):
    /// the connection is idle again.
    pub(super) fn ended(&self) {
        self.idle.store(true, Ordering::SeqCst);
    }

    /// Done with it: back to the pool if idle, else closed.
    pub(super) fn closed(self) {
        drop(self);
    }

    /// Rolls back; the connection goes back to the pool if that worked.
    pub(super) async fn rollback(self) {
        let Ok(client) = self.client() else { return };
        if client.batch_execute("ROLLBACK").await.is_ok() {
            self.ended();
        }
    }
}

impl Drop for OpenTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if !self.idle.load(Ordering::SeqCst) {
                drop(deadpool_postgres::Object::take(client));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::literal;

    #[test]
    fn literals_escape_quotes_and_backslashes_and_refuse_nul() {
        assert_eq!(literal("it's").unwrap(), "E'it''s'");
        assert_eq!(literal(r"C:\new").unwrap(), r"E'C:\\new'");
        assert_eq!(
            literal(r"\'; DROP TABLE x; --").unwrap(),
            r"E'\\''; DROP TABLE x; --'"
        );
        assert!(literal("a\0b").is_err());
    }
}
