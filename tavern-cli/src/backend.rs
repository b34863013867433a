//! The store a command works on: every port as `Arc<dyn AllStores>`, plus the few operations
//! only the embedded file store has (which characters have chats, compaction, diagnostics).
//! Another backend plugs in by implementing [`Backend`].

use std::sync::Arc;

use tavern_core::CharacterName;
use tavern_store::fs::FsStore;
use tavern_store::{AllStores, StoreDiagnostic, SystemClock};

use crate::{CliError, Context};

/// Lines of one log before and after a compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// Memory log `(before, after)`.
    pub memory: (u64, u64),
    /// Variable log `(before, after)`.
    pub variables: (u64, u64),
}

/// A store backend.
pub trait Backend: Send + Sync {
    /// Every store port.
    fn stores(&self) -> Arc<dyn AllStores>;

    /// The characters that have chats, sorted.
    ///
    /// # Errors
    /// Store failures.
    fn chat_characters(&self) -> Result<Vec<CharacterName>, CliError>;

    /// Compacts the logs (safe while other processes use the store).
    ///
    /// # Errors
    /// Store failures; nothing changes then.
    fn compact(&self) -> Result<Compacted, CliError>;

    /// Problems the store noticed in its data so far.
    fn diagnostics(&self) -> Vec<StoreDiagnostic>;
}

/// The embedded file store.
#[derive(Debug, Clone)]
pub struct FsBackend {
    store: FsStore,
}

impl Backend for FsBackend {
    fn stores(&self) -> Arc<dyn AllStores> {
        Arc::new(self.store.clone())
    }

    fn chat_characters(&self) -> Result<Vec<CharacterName>, CliError> {
        Ok(self.store.chat_characters()?)
    }

    fn compact(&self) -> Result<Compacted, CliError> {
        let r = self.store.compact()?;
        Ok(Compacted {
            memory: r.memory,
            variables: r.variables,
        })
    }

    fn diagnostics(&self) -> Vec<StoreDiagnostic> {
        self.store.diagnostics()
    }
}

/// Whether the data directory holds a store already.
pub fn store_exists(ctx: &Context) -> bool {
    ["memory.log", "variables.log", "state.json", "chats"]
        .iter()
        .any(|f| ctx.data.join(f).exists())
}

/// Opens the store in the data directory. With `create = false` a data directory without a
/// store is an error (reading commands never create one).
///
/// # Errors
/// [`CliError::NotFound`] for a missing store; store failures.
pub fn open(ctx: &Context, create: bool) -> Result<Arc<dyn Backend>, CliError> {
    if !create && !store_exists(ctx) {
        return Err(CliError::NotFound(format!(
            "no store in {} yet: import a SillyTavern folder with `tavern import-st DIR` or run a session first",
            ctx.data_label
        )));
    }
    if ctx.data.exists() && !ctx.data.is_dir() {
        return Err(CliError::Failed(format!(
            "{} is not a directory",
            ctx.data_label
        )));
    }
    let store = FsStore::open(&ctx.data, Arc::new(SystemClock))?;
    for d in store.diagnostics() {
        tracing::warn!(file = %d.file, "{}", d.message);
    }
    Ok(Arc::new(FsBackend { store }))
}
