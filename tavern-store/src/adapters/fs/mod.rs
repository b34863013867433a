//! The file-system adapter: every port under one root directory, durable (fsync before
//! acknowledging), safe for several processes sharing the root (advisory file locks), and
//! tolerant of corrupt files (reported, set aside, never fatal).
//!
//! Layout (private to this adapter, documented in `docs/FORMATS.md`): `state.json`,
//! `memory.log`, `variables.log`, `chats/<character>/<chat>.jsonl`, `checkpoints/<session>.json`,
//! `prompts/<session>.json`, plus `*.lock` files. Every name derived from an id goes through
//! `names::encode`, or, for SillyTavern's chat folders and files, `names::encode_readable`.
//!
//! The port methods run their blocking work (locks, reads, fsync) through
//! [`crate::blocking::maybe_spawn_blocking`]: in place on a multi-thread runtime's worker
//! (`block_in_place`), on tokio's blocking pool in a current-thread runtime, inline elsewhere. [`FsStore::open`], [`FsStore::compact`] and
//! [`FsStore::import_memories`] are plain blocking calls for programs that manage threads
//! themselves.

pub(crate) mod atomic;
mod chat;
mod chat_digests;
mod chat_folder;
mod check;
pub(crate) mod image;
mod log;
mod names;
mod transfer;

pub use atomic::{dir_syncs_issued, stamp_of, syncs_issued, FileStamp};
pub use chat_folder::{FsOptions, CHAT_FOLDER_RECORD};
pub use check::{check_files, CheckFinding, CheckReport};
#[cfg(feature = "testkit")]
pub use image::change_unread_part;
pub use log::verify_line;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tavern_core::{
    normalize_state, AuditEntry, Diagnostic, MemoryId, MemoryRecord, MemorySource, MemoryWrite,
    Revision, ScopeKey, SessionBinding, SessionId, TavernState, VariableName, VariableRecord,
};

use self::atomic::{
    ensure_dir, io_err, read_optional, remove, set_aside, stamp, write_atomic, FileLock,
};
use self::log::{DurableLog, LogLines, NewLines, Payloads};
use crate::blocking::maybe_spawn_blocking;
use crate::checkpoint::{CheckpointStatus, CheckpointStore, ProjectorCheckpoint};
use crate::clock::Clock;
use crate::diagnostics::Diagnostics;
use crate::engine::memory_table::{MemoryOp, MemoryTable};
use crate::engine::oplog::{encode_snapshot, replay, Entry, OpTable};
use crate::engine::variable_table::{VariableOp, VariableTable};
use crate::error::StoreError;
use crate::mem::lock;
use crate::memory::{MemoryQuery, MemorySearchResult, MemoryStore};
use crate::prompt::{PromptStore, SessionPrompt};
use crate::state::{StateMutation, StateStore, StateView, Verdict};
use crate::variable::{PatchOutcome, VariableChange, VariableListing, VariableStore};
use crate::StoreDiagnostic;
use tavern_search::Bm25Index;

const STATE: &str = "state.json";
const STATE_LOCK: &str = "state.lock";
const MEMORY_LOG: &str = "memory.log";
/// The memory table's saved image ([`image`]).
const MEMORY_IMAGE: &str = "memory.image";
const VARIABLE_LOG: &str = "variables.log";

struct Logged<T> {
    log: DurableLog,
    table: T,
    /// Whether the log was read once (set aside if unreadable): until then `table` is empty
    /// and every use goes through [`Inner::first_load`] ([`FsOptions::defer_memory_load`]).
    loaded: bool,
    /// Where the table's image is saved (root-relative), for a table that keeps one.
    image: Option<&'static str>,
    /// Lines of the log the image on disk reflects, as far as this process knows (0: none
    /// or a stale one).
    image_lines: u64,
    /// Damaged lines and unreadable operations met since the log was last read from its
    /// start: an image is saved only of a log read whole, so the diagnostics it gave are given
    /// again by every open.
    damaged: u64,
    /// Log lines replayed into the table since the store opened (tests check that an image
    /// spares them).
    replayed: u64,
}

/// Imports smaller than this are prepared on the calling thread alone.
const PARALLEL_IMPORT_MIN: usize = 2048;

/// The operations of an import (new records: one already in `table` is refused) and their log
/// lines, in order. Each record's revision and line cost more than indexing it, and depend on
/// the record alone: a large import prepares its two halves on two threads, each writing its
/// lines (digests included) into a buffer of its own. The first refusal in the import's order
/// is returned, as preparing one by one would.
fn prepare_imports(
    table: &MemoryTable,
    mut writes: Vec<MemoryWrite>,
    now: tavern_core::Timestamp,
) -> Result<(Vec<MemoryOp>, Vec<LogLines>), StoreError> {
    let prepare = |writes: Vec<MemoryWrite>| -> Result<(Vec<MemoryOp>, LogLines), StoreError> {
        // A line is about its content's length (escapes aside) and 400 bytes besides.
        let bytes = writes.iter().map(|w| w.content.len() + 400).sum();
        let mut lines = LogLines::with_capacity(bytes);
        let mut ops = Vec::with_capacity(writes.len());
        for w in writes {
            let op = table.prepare_put_op(w, now)?;
            lines.push_json(&op)?;
            ops.push(op);
        }
        Ok((ops, lines))
    };
    if writes.len() < PARALLEL_IMPORT_MIN {
        let (ops, lines) = prepare(writes)?;
        return Ok((ops, vec![lines]));
    }
    let back = writes.split_off(writes.len() / 2);
    let (front, back) = std::thread::scope(|s| {
        let back = s.spawn(|| prepare(back));
        let front = prepare(writes);
        (front, back.join())
    });
    let (mut ops, lines) = front?;
    // A panic in the other half is a bug, not bad input: nothing is written.
    let (more_ops, more_lines) = back.map_err(|_| {
        StoreError::Internal("preparing an import panicked; nothing written".into())
    })??;
    ops.extend(more_ops);
    Ok((ops, vec![lines, more_lines]))
}

/// Logs shorter than this keep no image (they open fast enough from the log).
const IMAGE_MIN_LINES: u64 = 4096;
/// A new image is saved once the log has this many lines more than the last one reflects.
const IMAGE_MIN_NEW_LINES: u64 = 4096;

/// Logs shorter than this are never compacted automatically.
const COMPACT_MIN_LINES: u64 = 4096;

impl<T: OpTable> Logged<T> {
    fn catch_up(&mut self, diags: &Diagnostics) -> Result<(), StoreError> {
        self.read_on(diags, false)
    }

    /// Reads the table again from the whole log when it is *lost* ([`OpTable::lost`]: a
    /// record of the image it was read from is no longer the one the open checked, so what
    /// it answered or prepared since may lack it), reporting it; whether it did. The caller
    /// holds the log's lock, and uses nothing the lost table gave.
    fn recover(&mut self, diags: &Diagnostics) -> Result<bool, StoreError> {
        if !self.table.lost() {
            return Ok(false);
        }
        diags.push(
            self.image.unwrap_or(MEMORY_IMAGE).to_owned(),
            format!(
                "a record read from it was not the one its image described (the file changed \
                 since, or was written wrong); the table was read again from {}",
                self.log.rel()
            ),
        );
        self.log.restart();
        self.read_on(diags, true)?;
        Ok(true)
    }

    /// Reads the lines not read yet (from the start, the table emptied first, after a
    /// compaction elsewhere or when `again`).
    fn read_on(&mut self, diags: &Diagnostics, again: bool) -> Result<(), StoreError> {
        let mut found = Vec::new();
        let (replaced, payloads) = match self.log.read_new(&mut found)? {
            NewLines::Lines(lines) => (again, lines),
            NewLines::Replaced => {
                // Another process compacted the log: rebuild from the new file.
                self.log.restart();
                match self.log.read_new(&mut found)? {
                    NewLines::Lines(lines) => (true, lines),
                    NewLines::Replaced => (true, Payloads::default()),
                }
            }
        };
        let mut entries = Vec::with_capacity(payloads.len() + 1);
        if replaced {
            entries.push(Entry::Reset);
            self.damaged = 0;
            self.image_lines = 0;
        }
        entries.extend(payloads.iter().map(Entry::Op));
        self.replayed += payloads.len() as u64;
        let done = replay(&mut self.table, &entries)?;
        let file = self.log_name();
        found.extend(done.unreadable.into_iter().map(|u| StoreDiagnostic {
            file: file.clone(),
            message: format!("unreadable operation ({}); skipped", u.reason),
        }));
        self.damaged += found.len() as u64;
        diags.extend(found);
        Ok(())
    }

    /// Appends `op` durably, then applies it. The caller holds the exclusive lock and has
    /// caught up.
    fn commit(&mut self, op: T::Op, durable: bool, diags: &Diagnostics) -> Result<(), StoreError> {
        let payload = serde_json::to_string(&op)
            .map_err(|e| StoreError::Internal(format!("cannot encode an operation: {e}")))?;
        if self.log.append(&payload, durable)? {
            // A torn tail was terminated first: step over it; our line comes back in order.
            self.catch_up(diags)
        } else {
            self.table.apply_op(op);
            Ok(())
        }
    }

    fn log_name(&self) -> String {
        self.log.rel().to_owned()
    }

    /// Rewrites the log as one line per live state. The caller holds the exclusive lock and
    /// has caught up. Returns `(lines before, lines after)`.
    fn compact(&mut self, diags: &Diagnostics) -> Result<(u64, u64), StoreError> {
        let mut payloads = encode_snapshot(&self.table)?;
        // A record the snapshot could not read back would be missing from the new log: the
        // table is read again from the log, and its snapshot taken again.
        if self.recover(diags)? {
            payloads = encode_snapshot(&self.table)?;
        }
        let before = self.log.lines();
        self.log.replace_with(&payloads)?;
        // A new file, read whole: the image of the old one is stale.
        self.damaged = 0;
        self.image_lines = 0;
        Ok((before, payloads.len() as u64))
    }

    /// Whether an image of the table is worth saving now: the table keeps one, the log was
    /// read without damage and has grown enough since the last image (`force`: any growth).
    fn image_due(&self, force: bool) -> bool {
        let lines = self.log.lines();
        let enough = if force {
            lines > self.image_lines
        } else {
            lines >= IMAGE_MIN_LINES
                && lines >= self.image_lines.saturating_add(IMAGE_MIN_NEW_LINES)
        };
        self.image.is_some() && self.loaded && self.damaged == 0 && enough
    }

    /// Whether the log holds many more lines than the state it describes.
    fn bloated(&self) -> bool {
        let lines = self.log.lines();
        lines > COMPACT_MIN_LINES && lines > 2 * self.table.snapshot_len() as u64
    }
}

/// What a compaction did: `(lines before, lines after)` per log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactReport {
    /// `memory.log`.
    pub memory: (u64, u64),
    /// `variables.log`.
    pub variables: (u64, u64),
}

/// Whether an IO error will not go away by trying again (the file cannot be read as a log).
/// Permission errors are not among them: they are configuration (`StoreError::Access`),
/// reported, never set aside.
fn persistent(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(20 | 21 | 40))
}

/// Most checkpoints kept in the read cache; past it the cache starts over.
const CHECKPOINT_CACHE_MAX: usize = 4096;

/// A parsed document and the stamp of the file it was read from.
type Cached<T> = (Option<FileStamp>, T);

/// The normalized state and what the normalizer reported.
type LoadedState = (TavernState, Vec<Diagnostic>);

/// Every store port on one root directory. Cheap to clone (one shared handle).
#[derive(Clone)]
pub struct FsStore {
    inner: Arc<Inner>,
}

/// The store's state and its blocking operations.
struct Inner {
    root: PathBuf,
    /// Where `chats/` lives: the root, or a SillyTavern user folder ([`FsOptions::chat_folder`]).
    chat_root: PathBuf,
    clock: Arc<dyn Clock>,
    memory: Mutex<Logged<MemoryTable>>,
    variables: Mutex<Logged<VariableTable>>,
    diagnostics: Diagnostics,
    /// The normalized state and the stamp of `state.json` it came from.
    state: Mutex<Option<Cached<LoadedState>>>,
    /// Checkpoints by session, with the stamp of the file each came from.
    checkpoints: Mutex<HashMap<SessionId, Cached<Option<ProjectorCheckpoint>>>>,
    /// Digests of the chat versions this process saw (chat revisions without whole reads).
    chat_digests: chat_digests::ChatDigests,
    /// Whether `memory.log` has been read (mirrors the memory table's `loaded`, readable
    /// without waiting for a load in progress).
    memory_loaded: AtomicBool,
    /// Shared with both logs: make the next fsync fail (tests of failure paths).
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    fail_next_sync: Arc<AtomicBool>,
    /// Shared with both logs: make the next append fail before writing (a full disk).
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    fail_next_write: Arc<AtomicBool>,
}

impl Drop for Inner {
    /// A store closed after many log lines since its last image saves one, so the next open
    /// reads it and only what is written after. This blocks the thread dropping the last
    /// handle for as long as the save takes (0.4 s at 100,000 records, ~5 s at a million);
    /// a program that closes a large store on an async worker can call
    /// [`FsStore::save_memory_image`] on a blocking thread first.
    fn drop(&mut self) {
        let mut g = lock(&self.memory);
        self.save_image(&mut g, false);
    }
}

impl std::fmt::Debug for FsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsStore").finish_non_exhaustive()
    }
}

impl FsStore {
    /// Opens (creating if needed) a store rooted at `root` and loads its logs. Damaged lines
    /// and files are reported through [`FsStore::diagnostics`], never fatal. Blocking.
    ///
    /// # Errors
    /// IO failures creating or reading the root.
    pub fn open(root: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        Self::open_with(root, clock, FsOptions::default())
    }

    /// [`FsStore::open`] with options: chats kept in a SillyTavern user folder.
    ///
    /// # Errors
    /// IO failures creating or reading the root; [`StoreError::Setup`] when the chat
    /// folder named (or the one the store recorded earlier) is not a directory.
    pub fn open_with(
        root: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
        options: FsOptions,
    ) -> Result<Self, StoreError> {
        let root = root.as_ref().to_path_buf();
        std::fs::create_dir_all(&root).map_err(io_err("create", "store root"))?;
        for dir in ["chats", "checkpoints", "prompts"] {
            ensure_dir(&root, dir)?;
        }
        let chat_root = chat_folder::resolve(&root, options.chat_folder.as_deref())?;
        if chat_root != root {
            ensure_dir(&chat_root, "chats")?;
        }
        let fail_next_sync = Arc::new(AtomicBool::new(false));
        let fail_next_write = Arc::new(AtomicBool::new(false));
        let mut early = Vec::new();
        for log in [MEMORY_LOG, VARIABLE_LOG] {
            // A log that is a directory, a FIFO or a device is set aside, never opened.
            if atomic::is_special(&root, log) {
                let aside = set_aside(&root, log, clock.now().0)?;
                early.push(StoreDiagnostic {
                    file: log.to_owned(),
                    message: format!("not a regular file; set aside as {aside}, starting empty"),
                });
            }
        }
        let inner = Inner {
            memory: Mutex::new(Logged {
                log: DurableLog::open(
                    &root,
                    MEMORY_LOG,
                    fail_next_sync.clone(),
                    fail_next_write.clone(),
                )?,
                table: MemoryTable::new(),
                loaded: false,
                image: Some(MEMORY_IMAGE),
                image_lines: 0,
                damaged: 0,
                replayed: 0,
            }),
            variables: Mutex::new(Logged {
                log: DurableLog::open(
                    &root,
                    VARIABLE_LOG,
                    fail_next_sync.clone(),
                    fail_next_write.clone(),
                )?,
                table: VariableTable::new(),
                loaded: false,
                image: None,
                image_lines: 0,
                damaged: 0,
                replayed: 0,
            }),
            root,
            chat_root,
            clock,
            diagnostics: Diagnostics::new(early),
            state: Mutex::default(),
            checkpoints: Mutex::default(),
            chat_digests: chat_digests::ChatDigests::default(),
            memory_loaded: AtomicBool::new(false),
            fail_next_sync,
            fail_next_write,
        };
        inner.remove_stale_temp_files();
        // The earlier escaped layout was only ever written under the store's own root; a
        // SillyTavern folder's names are never touched.
        if inner.chat_root == inner.root {
            inner.migrate_legacy_chat_names();
        }
        if !options.defer_memory_load {
            inner.first_load(&mut lock(&inner.memory), MEMORY_LOG)?;
            inner.memory_loaded.store(true, Ordering::SeqCst);
        }
        inner.first_load(&mut lock(&inner.variables), VARIABLE_LOG)?;
        // A log that has grown far beyond its state (updates, access times) is compacted so
        // opening stays proportional to what is stored, not to its history (a deferred memory
        // log when it is read).
        if options.defer_memory_load {
            if lock(&inner.variables).bloated() {
                inner.compact_variables()?;
            }
        } else if lock(&inner.memory).bloated() || lock(&inner.variables).bloated() {
            inner.compact()?;
        } else {
            inner.save_image(&mut lock(&inner.memory), false);
        }
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Rewrites both logs as one line per record (memories, with their whole audit trail) and
    /// per scope (variables, with tombstones and audit): nothing is lost, history lines and
    /// access-time lines are folded. Atomic and durable (temp + fsync + rename + directory
    /// fsync); other processes sharing the root notice and reload. Runs automatically at open
    /// when a log has more than twice the lines its state needs. Blocking.
    ///
    /// # Errors
    /// IO failures; the old logs stay in place then.
    pub fn compact(&self) -> Result<CompactReport, StoreError> {
        self.inner.compact()
    }

    /// Creates many memories with one durable append (imports, benchmarks). All or nothing:
    /// every write is checked first (each must be new, ids unique within the batch), then all
    /// are appended and fsynced once. Blocking.
    ///
    /// # Errors
    /// The first failing write's error; nothing is written then.
    pub fn import_memories(&self, writes: Vec<MemoryWrite>) -> Result<usize, StoreError> {
        self.inner.import_memories(writes)
    }

    /// Saves the memory table's image (`memory.image`) now, when the log has lines the last
    /// image does not reflect and was read without a damaged line: the next open reads it and
    /// replays only the lines written after. A store saves one by itself when it opens or
    /// compacts a log of thousands of lines and when it is dropped after thousands more; this
    /// is for a program that wants one at a point of its choosing (after a large import).
    /// Blocking. Returns whether an image was written.
    ///
    /// # Errors
    /// IO failures reading the log or writing the image (the old image, if any, stays).
    pub fn save_memory_image(&self) -> Result<bool, StoreError> {
        let mut g = self.inner.memory()?;
        self.inner.try_save_image(&mut g, true)
    }

    /// Problems found in stored data so far (file names relative to the root).
    pub fn diagnostics(&self) -> Vec<StoreDiagnostic> {
        self.inner.diagnostics.snapshot()
    }

    /// The characters that have chats (a folder under `chats/`), sorted: what
    /// [`crate::ChatStore::list_chats`] can be asked about. Blocking.
    ///
    /// # Errors
    /// IO failures listing `chats/`.
    pub fn chat_characters(&self) -> Result<Vec<tavern_core::CharacterName>, StoreError> {
        self.inner.chat_characters()
    }

    /// Reads `memory.log` now if the store was opened with
    /// [`FsOptions::defer_memory_load`] and no call has read it yet (a no-op otherwise):
    /// what a program runs on a thread of its own after opening, so the first memory call
    /// does not wait for the whole log. Damaged lines are reported through
    /// [`FsStore::diagnostics`]; a log grown far beyond its records is compacted. Blocking.
    ///
    /// # Errors
    /// A passing IO failure reading the log (the next memory call tries again).
    pub fn load_memories(&self) -> Result<(), StoreError> {
        self.inner.memory().map(drop)
    }

    /// Whether `memory.log` has been read (always, unless the store was opened with
    /// [`FsOptions::defer_memory_load`] and no memory call nor [`FsStore::load_memories`]
    /// has finished reading it yet). Never waits for a load in progress.
    pub fn memories_loaded(&self) -> bool {
        self.inner.memory_loaded.load(Ordering::SeqCst)
    }

    /// How many memory records (live, forgotten or expired) are stored, reading the log
    /// first if it was not read yet (0 if that fails). Blocking.
    pub fn memory_len(&self) -> usize {
        self.inner.memory().map_or(0, |g| g.table.len())
    }

    /// How many times this store read and digested a whole chat file to learn its revision or
    /// what changed (tests check that keeping up with appends does not).
    #[cfg(feature = "testkit")]
    pub fn chat_whole_reads(&self) -> u64 {
        self.inner.chat_digests.whole_reads()
    }

    /// How many `memory.log` lines were replayed into the memory table since the store
    /// opened (an image read at open spares the lines it reflects).
    pub fn memory_lines_replayed(&self) -> u64 {
        lock(&self.inner.memory).replayed
    }

    /// Makes the next durable log append fail at its fsync, as a failing disk would (tests of
    /// "a failed write changes nothing").
    #[cfg(feature = "testkit")]
    pub fn fail_next_sync(&self) {
        self.inner.fail_next_sync.store(true, Ordering::SeqCst);
    }

    /// Makes the next log append fail before writing anything, as a full disk would.
    #[cfg(feature = "testkit")]
    pub fn fail_next_write(&self) {
        self.inner.fail_next_write.store(true, Ordering::SeqCst);
    }

    /// Runs blocking `f` on the store off the executor (see the module docs).
    async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&Inner) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let inner = self.inner.clone();
        maybe_spawn_blocking(move || f(&inner)).await
    }
}

impl Inner {
    /// Reads a log the first time (at open, or at the first use of a deferred one). One that
    /// cannot be read (permissions, a bad disk sector) is set aside with a diagnostic and the
    /// store goes on without it, rather than not at all.
    fn first_load<T: OpTable>(&self, g: &mut Logged<T>, rel: &str) -> Result<(), StoreError> {
        // From the start of the log every time: an attempt cut short (an error, or a panic
        // the caller's thread survived) may have left part of it applied.
        g.table = T::default();
        g.log.restart();
        g.damaged = 0;
        g.image_lines = 0;
        let first = {
            // Read under the shared lock, as every reader does: a writer's failed append is
            // cut back before anyone can read it. The image is checked against the log under
            // it too, so the file it matched is the one read on from its anchor.
            let _lock = g.log.lock(false)?;
            self.restore_image(g);
            g.catch_up(&self.diagnostics)
        };
        match first {
            Ok(()) => {}
            Err(StoreError::Io { op, source, .. }) if persistent(&source) => {
                // Under the exclusive lock, so no other process is writing it meanwhile.
                let _lock = g.log.lock(true)?;
                let aside = set_aside(&self.root, rel, self.clock.now().0)?;
                self.diag(
                    rel,
                    format!("unreadable ({op}: {source}); set aside as {aside}, starting empty"),
                );
                g.table = T::default();
                g.log.restart();
                g.image_lines = 0;
                g.log = DurableLog::open(
                    &self.root,
                    rel,
                    self.fail_next_sync.clone(),
                    self.fail_next_write.clone(),
                )?;
            }
            // A passing failure (no descriptors left, an interrupted read): fail the open (or
            // this call), never set a good log aside.
            Err(other) => return Err(other),
        }
        g.loaded = true;
        Ok(())
    }

    /// The memory table, read from its log first when that was deferred at open (and
    /// compacted then if its log has grown far beyond it, as an eager open does).
    fn memory(&self) -> Result<std::sync::MutexGuard<'_, Logged<MemoryTable>>, StoreError> {
        let mut g = lock(&self.memory);
        if !g.loaded {
            self.first_load(&mut g, MEMORY_LOG)?;
            self.memory_loaded.store(true, Ordering::SeqCst);
            if g.bloated() {
                let compacted = (|| {
                    let _lock = g.log.lock(true)?;
                    g.catch_up(&self.diagnostics)?;
                    g.compact(&self.diagnostics)
                })();
                // The records are loaded either way; the log stays long until the next open.
                if let Err(e) = compacted {
                    self.diag(MEMORY_LOG, format!("not compacted after loading: {e}"));
                }
            }
            self.save_image(&mut g, false);
        }
        self.recovered(&mut *g)?;
        Ok(g)
    }

    /// Starts `g`'s table from its saved image when one matches the log (the caller holds the
    /// log's lock and reads on from the image's anchor). A damaged image is reported; a stale
    /// or missing one, or one that cannot be checked, leaves the table to the log.
    fn restore_image<T: OpTable>(&self, g: &mut Logged<T>) {
        let Some(name) = g.image else {
            return;
        };
        match image::load::<T>(&self.root, name, g.log.rel()) {
            Ok(image::Found::Fresh(table, anchor)) => {
                g.table = table;
                g.image_lines = anchor.lines;
                g.log.resume(anchor);
            }
            Ok(image::Found::Damaged(why)) => {
                let log = g.log.rel().to_owned();
                self.diag(name, format!("{why}; the table is read from {log} instead"));
            }
            // Whatever keeps the log from being checked, reading it reports.
            Ok(image::Found::Absent | image::Found::Stale) | Err(_) => {}
        }
    }

    /// Saves `g`'s table image when one is due ([`Logged::image_due`]), without locking the log
    /// (writers in other processes never wait for an image; `image` says why that is safe).
    /// Returns whether one was written.
    fn try_save_image<T: OpTable>(
        &self,
        g: &mut Logged<T>,
        force: bool,
    ) -> Result<bool, StoreError> {
        let Some(name) = g.image.filter(|_| g.image_due(force)) else {
            return Ok(false);
        };
        // A panic while applying an operation may have left the table half-changed: it is
        // never written down as an image (the next open reads the log).
        if self.memory.is_poisoned() || self.variables.is_poisoned() {
            return Ok(false);
        }
        let mut saved = image::save(&self.root, name, &g.log, &g.table)?;
        // Writing it found a posting list damaged in the image the table was read from.
        // (A lost table is read again from the log by the next call, not healed.)
        if !saved && !g.table.lost() && g.table.heal() {
            let log = g.log.rel().to_owned();
            self.diag(
                name,
                format!(
                    "a posting list read from it was damaged; the search index was rebuilt \
                     from {log}'s records"
                ),
            );
            saved = image::save(&self.root, name, &g.log, &g.table)?;
        }
        if saved {
            g.image_lines = g.log.lines();
        }
        Ok(saved)
    }

    /// [`Inner::try_save_image`] on its own initiative: a failure is reported, never fatal
    /// (the next open reads the log).
    fn save_image<T: OpTable>(&self, g: &mut Logged<T>, force: bool) {
        if let Err(e) = self.try_save_image(g, force) {
            self.diag(g.image.unwrap_or(MEMORY_IMAGE), format!("not saved: {e}"));
        }
    }

    /// Compacts `variables.log` alone (an open that defers the memory log).
    fn compact_variables(&self) -> Result<(), StoreError> {
        let mut g = lock(&self.variables);
        let _lock = g.log.lock(true)?;
        g.catch_up(&self.diagnostics)?;
        g.compact(&self.diagnostics).map(drop)
    }

    fn compact(&self) -> Result<CompactReport, StoreError> {
        let memory = {
            let mut g = self.memory()?;
            let report = {
                let _lock = g.log.lock(true)?;
                g.catch_up(&self.diagnostics)?;
                g.compact(&self.diagnostics)?
            };
            self.save_image(&mut g, false);
            report
        };
        let variables = {
            let mut g = lock(&self.variables);
            let _lock = g.log.lock(true)?;
            g.catch_up(&self.diagnostics)?;
            g.compact(&self.diagnostics)?
        };
        Ok(CompactReport { memory, variables })
    }

    /// Removes temporary files an interrupted atomic write left behind (a crash between
    /// creating the temp file and renaming it). Only files older than an hour: a younger one
    /// may belong to another process writing right now.
    fn remove_stale_temp_files(&self) {
        let mut dirs: Vec<(&Path, String)> = vec![
            (&self.root, String::new()),
            (&self.root, "prompts".to_owned()),
            (&self.root, "checkpoints".to_owned()),
        ];
        if let Ok(chats) = std::fs::read_dir(self.chat_root.join("chats")) {
            dirs.extend(
                chats
                    .filter_map(Result::ok)
                    .filter_map(|e| e.file_name().into_string().ok())
                    .map(|n| (self.chat_root.as_path(), format!("chats/{n}"))),
            );
        }
        for (base, rel_dir) in dirs {
            for name in
                atomic::remove_stale_temps(&atomic::under(base, &rel_dir), atomic::TEMP_PREFIX)
            {
                let rel = if rel_dir.is_empty() {
                    name
                } else {
                    format!("{rel_dir}/{name}")
                };
                self.diag(
                    &rel,
                    "temporary file of an interrupted write removed".into(),
                );
            }
        }
    }

    fn diag(&self, file: &str, message: String) {
        self.diagnostics.push(file.to_owned(), message);
    }

    /// Reads a JSON document; a corrupt one is set aside with a diagnostic and reads as `None`.
    fn read_doc<T: DeserializeOwned>(&self, rel: &str) -> Result<Option<T>, StoreError> {
        if atomic::is_special(&self.root, rel) {
            let aside = set_aside(&self.root, rel, self.clock.now().0)?;
            self.diag(rel, format!("not a regular file; set aside as {aside}"));
            return Ok(None);
        }
        let Some(bytes) = read_optional(&self.root, rel)? else {
            return Ok(None);
        };
        match serde_json::from_slice::<T>(&bytes) {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                let aside = set_aside(&self.root, rel, self.clock.now().0)?;
                self.diag(rel, format!("unreadable ({e}); set aside as {aside}"));
                Ok(None)
            }
        }
    }

    fn write_doc<T: Serialize>(&self, rel: &str, value: &T) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(value)
            .map_err(|e| StoreError::Internal(format!("cannot encode {rel}: {e}")))?;
        write_atomic(&self.root, rel, &bytes)
    }

    /// The normalized state; re-read only when `state.json` changed (by any process). The
    /// caller holds the state lock.
    fn read_state_locked(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError> {
        let now = stamp(&self.root, STATE)?;
        if let Some((at, cached)) = lock(&self.state).as_ref() {
            if *at == now {
                return Ok(cached.clone());
            }
        }
        let loaded = self.read_state_file()?;
        if stamp(&self.root, STATE)? == now {
            *lock(&self.state) = Some((now, loaded.clone()));
        }
        Ok(loaded)
    }

    fn read_state_file(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError> {
        if atomic::is_special(&self.root, STATE) {
            let aside = set_aside(&self.root, STATE, self.clock.now().0)?;
            let message = format!("not a regular file; set aside as {aside}, using defaults");
            self.diag(STATE, message.clone());
            return Ok((
                TavernState::default(),
                vec![Diagnostic {
                    path: String::new(),
                    message: format!("{STATE} {message}"),
                }],
            ));
        }
        let Some(bytes) = read_optional(&self.root, STATE)? else {
            return Ok((TavernState::default(), Vec::new()));
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(raw) => Ok(normalize_state(&raw)),
            Err(e) => {
                let aside = set_aside(&self.root, STATE, self.clock.now().0)?;
                let message = format!("unreadable ({e}); set aside as {aside}, using defaults");
                self.diag(STATE, message.clone());
                Ok((
                    TavernState::default(),
                    vec![Diagnostic {
                        path: String::new(),
                        message: format!("{STATE} {message}"),
                    }],
                ))
            }
        }
    }

    fn load_state(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError> {
        let _lock = FileLock::acquire(&self.root, STATE_LOCK, false)?;
        self.read_state_locked()
    }

    fn binding(&self, session: &SessionId) -> Result<Option<SessionBinding>, StoreError> {
        self.refresh_state()?;
        Ok(lock(&self.state)
            .as_ref()
            .and_then(|(_, (state, _))| state.binding(session).cloned()))
    }

    /// Makes the cached state current (re-reading `state.json` only if it changed).
    fn refresh_state(&self) -> Result<(), StoreError> {
        let _lock = FileLock::acquire(&self.root, STATE_LOCK, false)?;
        let now = stamp(&self.root, STATE)?;
        if lock(&self.state).as_ref().is_some_and(|(at, _)| *at == now) {
            return Ok(());
        }
        self.read_state_locked().map(|_| ())
    }

    /// Persists a mutated state and caches it. The caller holds the exclusive state lock.
    fn write_state_locked(&self, state: &TavernState) -> Result<(), StoreError> {
        self.write_doc(STATE, &state.to_json())?;
        *lock(&self.state) = Some((stamp(&self.root, STATE)?, (state.clone(), Vec::new())));
        Ok(())
    }

    fn load_checkpoint(
        &self,
        session: &SessionId,
    ) -> Result<Option<ProjectorCheckpoint>, StoreError> {
        let rel = session_doc("checkpoints", session);
        let now = stamp(&self.root, &rel)?;
        if let Some((at, cached)) = lock(&self.checkpoints).get(session) {
            if *at == now {
                return Ok(cached.clone());
            }
        }
        let loaded = self.read_doc::<ProjectorCheckpoint>(&rel)?;
        // Cached only if the file did not change while it was read (its stamp before and
        // after agree), so a cached copy always belongs to its stamp.
        if stamp(&self.root, &rel)? == now {
            self.cache_checkpoint(session, now, loaded.clone());
        }
        Ok(loaded)
    }

    fn save_checkpoint(
        &self,
        checkpoint: &ProjectorCheckpoint,
        expected: Option<&ProjectorCheckpoint>,
    ) -> Result<(), StoreError> {
        let session = &checkpoint.session_id;
        let rel = session_doc("checkpoints", session);
        // Compare and write under the checkpoint's lock: other processes save through it too.
        let _lock = FileLock::acquire(
            &self.root,
            &format!("checkpoints/{}.lock", names::encode(session.as_str())),
            true,
        )?;
        // Compared with what is on disk now, never a cached copy: a file stamp could match a
        // replaced file on coarse-timestamp file systems, and a stale compare loses updates.
        let on_disk = self.read_doc::<ProjectorCheckpoint>(&rel)?;
        self.cache_checkpoint(session, stamp(&self.root, &rel)?, on_disk.clone());
        if on_disk.as_ref() != expected {
            return Err(StoreError::Conflict {
                target: Box::new(crate::error::Target::Checkpoint(session.clone())),
                current: None,
            });
        }
        self.write_doc(&rel, checkpoint)?;
        self.cache_checkpoint(
            &checkpoint.session_id,
            stamp(&self.root, &rel)?,
            Some(checkpoint.clone()),
        );
        Ok(())
    }

    fn cache_checkpoint(
        &self,
        session: &SessionId,
        at: Option<FileStamp>,
        checkpoint: Option<ProjectorCheckpoint>,
    ) {
        let mut cache = lock(&self.checkpoints);
        if cache.len() >= CHECKPOINT_CACHE_MAX && !cache.contains_key(session) {
            cache.clear();
        }
        cache.insert(session.clone(), (at, checkpoint));
    }

    fn pending_checkpoints(&self) -> Result<Vec<ProjectorCheckpoint>, StoreError> {
        let dir = atomic::under(&self.root, "checkpoints");
        let mut out = Vec::new();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map_err(io_err("list", "checkpoints"))?
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with('_') && n.ends_with(".json"))
            .collect();
        names.sort();
        for name in names {
            let rel = format!("checkpoints/{name}");
            match self.read_doc::<ProjectorCheckpoint>(&rel) {
                Ok(Some(cp)) if cp.status == CheckpointStatus::Pending => out.push(cp),
                Ok(_) => {}
                // One unreadable checkpoint does not hide every other session's state.
                Err(e) => self.diag(&rel, format!("skipped: {e}")),
            }
        }
        Ok(out)
    }

    fn write_memory_op(
        &self,
        prepare: impl Fn(&MemoryTable) -> Result<(MemoryRecord, MemoryOp), StoreError>,
    ) -> Result<MemoryRecord, StoreError> {
        let mut g = self.memory()?;
        let _lock = g.log.lock(true)?;
        g.catch_up(&self.diagnostics)?;
        let mut prepared = prepare(&g.table);
        // Decided on a table that could not read a record back: decided again on it whole.
        if g.recover(&self.diagnostics)? {
            prepared = prepare(&g.table);
        }
        let (record, op) = prepared?;
        g.commit(op, true, &self.diagnostics)?;
        Ok(record)
    }

    fn import_memories(&self, writes: Vec<MemoryWrite>) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let mut g = self.memory()?;
        let _lock = g.log.lock(true)?;
        g.catch_up(&self.diagnostics)?;
        let mut seen = std::collections::HashSet::with_capacity(writes.len());
        if let Some(w) = writes.iter().find(|w| !seen.insert((&w.scope, &w.id))) {
            return Err(StoreError::Invalid(tavern_core::CoreError::InvalidField {
                field: "memories",
                reason: format!("memory {} appears twice in one import", w.id),
            }));
        }
        drop(seen);
        // Kept for deciding again only while some record lies in the image (only then can
        // the table turn out lost): an import can be large.
        let again = g.table.may_lose().then(|| writes.clone());
        let mut prepared = prepare_imports(&g.table, writes, now);
        // Decided on a table that could not read a record back: decided again on it whole.
        if g.recover(&self.diagnostics)? {
            prepared = match again {
                Some(writes) => prepare_imports(&g.table, writes, now),
                None => Err(StoreError::Internal(
                    "a table with no record in its image was lost".into(),
                )),
            };
        }
        let (ops, lines) = prepared?;
        let n = ops.len();
        // The records' texts are tokenized (most of indexing's work, and needing neither the
        // log nor the table) on other threads while the lines are appended and the records
        // applied; the index takes the tokens after.
        let (text, spans) = MemoryTable::index_texts(&ops);
        let texts: Vec<&str> = spans
            .into_iter()
            .map(|span| text.get(span).unwrap_or_default())
            .collect();
        let g = &mut *g;
        std::thread::scope(|s| {
            let tokenizing = s.spawn(|| Bm25Index::tokenize(&texts));
            let torn = g.log.append_lines(&lines, true)?;
            // The lines are on disk: not held while indexing.
            drop(lines);
            if torn {
                // Its own lines come back through the catch-up (the tokens are not used).
                return g.catch_up(&self.diagnostics);
            }
            let slots = g.table.apply_records(ops);
            match tokenizing.join() {
                Ok(tokenized) => g.table.index_tokenized(slots, tokenized),
                // A panicking tokenizer is a bug, not bad input; the records are applied
                // already: indexed here from themselves rather than left out of the index.
                Err(_) => g.table.index_slots(slots),
            }
            Ok(())
        })?;
        Ok(n)
    }

    fn write_variable_op(
        &self,
        prepare: impl FnOnce(&VariableTable) -> Result<Option<VariableOp>, StoreError>,
    ) -> Result<Option<PatchOutcome>, StoreError> {
        let mut g = lock(&self.variables);
        let _lock = g.log.lock(true)?;
        g.catch_up(&self.diagnostics)?;
        let Some(op) = prepare(&g.table)? else {
            return Ok(None);
        };
        let outcome = VariableTable::outcome(&op);
        g.commit(op, true, &self.diagnostics)?;
        Ok(Some(outcome))
    }

    fn read_memory<R>(&self, f: impl Fn(&mut MemoryTable) -> R) -> Result<R, StoreError> {
        let mut g = self.memory()?;
        {
            let _lock = g.log.lock(false)?;
            g.catch_up(&self.diagnostics)?;
        }
        // Answered without the log's lock (writers elsewhere go on meanwhile).
        let answer = f(&mut g.table);
        // Answered by a table that could not read a record back: answered again by it whole.
        if self.recovered(&mut *g)? {
            return Ok(f(&mut g.table));
        }
        Ok(answer)
    }

    /// [`Logged::recover`] under the log's shared lock, when the table is lost.
    fn recovered<T: OpTable>(&self, g: &mut Logged<T>) -> Result<bool, StoreError> {
        if !g.table.lost() {
            return Ok(false);
        }
        let _lock = g.log.lock(false)?;
        g.recover(&self.diagnostics)
    }

    /// Searches the memory table; when the search found a posting list of its image damaged
    /// (the index rebuilt from the records and the search run again), reports it and saves
    /// the image again, so the next open does not meet the same damage.
    fn search_memory(
        &self,
        query: &MemoryQuery,
        now: tavern_core::Timestamp,
    ) -> Result<MemorySearchResult, StoreError> {
        let mut g = self.memory()?;
        {
            let _lock = g.log.lock(false)?;
            g.catch_up(&self.diagnostics)?;
        }
        // Answered (and healed) without the log's lock: writers elsewhere go on meanwhile.
        let (mut found, mut healed) = g.table.search_healing(query, now);
        // Answered by a table that could not read a record back: answered again by it whole.
        if self.recovered(&mut *g)? {
            (found, healed) = g.table.search_healing(query, now);
        }
        if healed {
            self.healed(&mut g);
        }
        Ok(found)
    }

    /// Reports a table healed of a damaged image and saves its image again (when one may be
    /// saved: not of a log with damaged lines).
    fn healed<T: OpTable>(&self, g: &mut Logged<T>) {
        let name = g.image.unwrap_or(MEMORY_IMAGE);
        self.diag(
            name,
            "a posting list read from it was damaged; the search index was rebuilt from the \
             records"
                .into(),
        );
        // Whatever its age, the image on disk is the damaged one.
        g.image_lines = 0;
        self.save_image(g, true);
    }

    fn read_variables<R>(&self, f: impl FnOnce(&VariableTable) -> R) -> Result<R, StoreError> {
        let mut g = lock(&self.variables);
        {
            let _lock = g.log.lock(false)?;
            g.catch_up(&self.diagnostics)?;
        }
        Ok(f(&g.table))
    }

    fn read_and_touch(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
    ) -> Result<Option<MemoryRecord>, StoreError> {
        let now = self.clock.now();
        let mut g = self.memory()?;
        let _lock = g.log.lock(true)?;
        g.catch_up(&self.diagnostics)?;
        let mut live = g.table.read_live(scope, id, now).is_some();
        // Looked up in a table that could not read a record back: looked up in it whole.
        if g.recover(&self.diagnostics)? {
            live = g.table.read_live(scope, id, now).is_some();
        }
        if !live {
            return Ok(None);
        }
        // Access times are bookkeeping: appended without fsync, so a crash may lose the latest.
        let touch = MemoryOp::Touch {
            scope: scope.clone(),
            id: id.clone(),
            at: now,
        };
        // A read must work on a full disk: if the access time cannot be appended, the record
        // is returned with the access time it had.
        // (Still under the same guard: letting go of the mutex while holding the file lock
        // could deadlock with a caller that takes them in order.)
        if let Err(e) = g.commit(touch, false, &self.diagnostics) {
            self.diag(MEMORY_LOG, format!("access time not recorded: {e}"));
        }
        let record = g.table.read_live(scope, id, now).cloned();
        if g.recover(&self.diagnostics)? {
            return Ok(g.table.read_live(scope, id, now).cloned());
        }
        Ok(record)
    }
}

#[async_trait]
impl MemoryStore for FsStore {
    async fn search(&self, query: &MemoryQuery) -> Result<MemorySearchResult, StoreError> {
        let query = query.clone();
        self.run(move |s| {
            let now = s.clock.now();
            s.search_memory(&query, now)
        })
        .await
    }

    async fn read(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
    ) -> Result<Option<MemoryRecord>, StoreError> {
        let (id, scope) = (id.clone(), scope.clone());
        self.run(move |s| s.read_and_touch(&id, &scope)).await
    }

    async fn inspect(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
    ) -> Result<Option<MemoryRecord>, StoreError> {
        let (id, scope) = (id.clone(), scope.clone());
        self.run(move |s| s.read_memory(|t| t.get(&scope, &id).cloned()))
            .await
    }

    async fn put(
        &self,
        write: MemoryWrite,
        expected: Option<&Revision>,
        restore: bool,
    ) -> Result<MemoryRecord, StoreError> {
        let expected = expected.cloned();
        self.run(move |s| {
            let now = s.clock.now();
            s.write_memory_op(|t| t.prepare_put(write.clone(), expected.as_ref(), restore, now))
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
        let (id, scope, expected) = (id.clone(), scope.clone(), expected.clone());
        self.run(move |s| {
            let now = s.clock.now();
            s.write_memory_op(|t| t.prepare_forget(&id, &scope, &expected, source.clone(), now))
        })
        .await
    }

    async fn memory_audit(
        &self,
        scope: &ScopeKey,
        id: Option<&MemoryId>,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let (scope, id) = (scope.clone(), id.cloned());
        self.run(move |s| {
            let now = s.clock.now();
            s.read_memory(|t| t.audit(&scope, id.as_ref(), now))
        })
        .await
    }
}

#[async_trait]
impl VariableStore for FsStore {
    async fn get(
        &self,
        scope: &ScopeKey,
        name: &VariableName,
    ) -> Result<Option<VariableRecord>, StoreError> {
        let (scope, name) = (scope.clone(), name.clone());
        self.run(move |s| s.read_variables(|t| t.get(&scope, &name).cloned()))
            .await
    }

    async fn patch(
        &self,
        scope: &ScopeKey,
        changes: &[VariableChange],
        expected_scope: Option<&Revision>,
        source: MemorySource,
    ) -> Result<PatchOutcome, StoreError> {
        let (scope, changes, expected_scope) =
            (scope.clone(), changes.to_vec(), expected_scope.cloned());
        self.run(move |s| {
            let now = s.clock.now();
            s.write_variable_op(|t| {
                t.prepare_patch(&scope, &changes, expected_scope.as_ref(), &source, now)
                    .map(Some)
            })?
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
        let (scope, prefix) = (scope.clone(), prefix.to_owned());
        self.run(move |s| s.read_variables(|t| t.list(&scope, &prefix, limit)))
            .await
    }

    async fn clear_scope(
        &self,
        scope: &ScopeKey,
        source: MemorySource,
    ) -> Result<usize, StoreError> {
        let scope = scope.clone();
        self.run(move |s| {
            let now = s.clock.now();
            let out = s.write_variable_op(|t| Ok(t.prepare_clear(&scope, &source, now)))?;
            Ok(out.map_or(0, |o| o.records.len()))
        })
        .await
    }

    async fn variable_audit(&self, scope: &ScopeKey) -> Result<Vec<AuditEntry>, StoreError> {
        let scope = scope.clone();
        self.run(move |s| s.read_variables(|t| t.audit(&scope)))
            .await
    }
}

#[async_trait]
impl StateStore for FsStore {
    async fn load_state(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError> {
        self.run(Inner::load_state).await
    }

    async fn binding(&self, session: &SessionId) -> Result<Option<SessionBinding>, StoreError> {
        let session = session.clone();
        self.run(move |s| s.binding(&session)).await
    }

    async fn view_state(&self, view: StateView<'_>) -> Result<(), StoreError> {
        // The file work (lock, stat, maybe a read) off the executor; the look itself is a
        // short borrow of the cached state here.
        self.run(Inner::refresh_state).await?;
        match lock(&self.inner.state).as_ref() {
            Some((_, (state, _))) => view(state),
            None => view(&TavernState::default()),
        }
        Ok(())
    }

    async fn update_state(&self, mutate: StateMutation<'_>) -> Result<TavernState, StoreError> {
        // The mutation borrows from the caller, so it runs here, between two blocking steps
        // that hold the exclusive lock across it: lock and read, then write and unlock. If
        // this future is dropped in between, the lock is released and nothing is written.
        let inner = self.inner.clone();
        let (guard, before) = maybe_spawn_blocking(move || {
            let guard = FileLock::acquire(&inner.root, STATE_LOCK, true)?;
            // The file itself, not the cache, under the exclusive lock: a read-modify-write
            // must start from what is on disk.
            let fresh = inner.read_state_file()?;
            *lock(&inner.state) = Some((stamp(&inner.root, STATE)?, fresh.clone()));
            Ok((guard, fresh.0))
        })
        .await?;
        let mut state = before.clone();
        if mutate(&mut state) == Verdict::Keep {
            return Ok(before);
        }
        let inner = self.inner.clone();
        maybe_spawn_blocking(move || {
            inner.write_state_locked(&state)?;
            drop(guard);
            Ok(state)
        })
        .await
    }
}

fn session_doc(dir: &str, session: &SessionId) -> String {
    format!("{dir}/{}.json", names::encode(session.as_str()))
}

#[async_trait]
impl CheckpointStore for FsStore {
    async fn load_checkpoint(
        &self,
        session: &SessionId,
    ) -> Result<Option<ProjectorCheckpoint>, StoreError> {
        let session = session.clone();
        self.run(move |s| s.load_checkpoint(&session)).await
    }

    async fn save_checkpoint(
        &self,
        checkpoint: &ProjectorCheckpoint,
        expected: Option<&ProjectorCheckpoint>,
    ) -> Result<(), StoreError> {
        let (checkpoint, expected) = (checkpoint.clone(), expected.cloned());
        self.run(move |s| s.save_checkpoint(&checkpoint, expected.as_ref()))
            .await
    }

    async fn pending_checkpoints(&self) -> Result<Vec<ProjectorCheckpoint>, StoreError> {
        self.run(Inner::pending_checkpoints).await
    }
}

impl Inner {
    fn get_prompt(&self, session: &SessionId) -> Result<Option<SessionPrompt>, StoreError> {
        let rel = session_doc("prompts", session);
        let prompt = self.read_doc::<SessionPrompt>(&rel)?;
        match prompt {
            Some(p) if &p.session_id != session || p.text.trim().is_empty() => {
                let aside = set_aside(&self.root, &rel, self.clock.now().0)?;
                self.diag(
                    &rel,
                    format!("record for another session or empty; set aside as {aside}"),
                );
                Ok(None)
            }
            other => Ok(other),
        }
    }

    fn save_prompt(
        &self,
        session: &SessionId,
        text: &str,
    ) -> Result<Option<SessionPrompt>, StoreError> {
        let prompt = SessionPrompt::to_save(session, text, self.clock.now())?;
        let rel = session_doc("prompts", session);
        match &prompt {
            Some(p) => self.write_doc(&rel, p)?,
            None => {
                remove(&self.root, &rel)?;
            }
        }
        Ok(prompt)
    }
}

#[async_trait]
impl PromptStore for FsStore {
    async fn get_prompt(&self, session: &SessionId) -> Result<Option<SessionPrompt>, StoreError> {
        let session = session.clone();
        self.run(move |s| s.get_prompt(&session)).await
    }

    async fn save_prompt(
        &self,
        session: &SessionId,
        text: &str,
    ) -> Result<Option<SessionPrompt>, StoreError> {
        let (session, text) = (session.clone(), text.to_owned());
        self.run(move |s| s.save_prompt(&session, &text)).await
    }

    async fn reset_prompt(&self, session: &SessionId) -> Result<bool, StoreError> {
        let rel = session_doc("prompts", session);
        self.run(move |s| remove(&s.root, &rel)).await
    }
}
