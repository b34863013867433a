//! The store a command works on: every port as `Arc<dyn AllStores>`, the same store as a
//! [`CopyableStore`] (listings and whole-store copies), plus compaction and diagnostics. The
//! file store under `--data`, or PostgreSQL with `--store`.

use std::path::PathBuf;
use std::sync::Arc;

use tavern_store::fs::FsStore;
use tavern_store::pg::{PgOptions, PgStore};
use tavern_store::{AllStores, CopyableStore, StoreDiagnostic, SystemClock};

use crate::{CliError, Context};

/// Where a PostgreSQL store is: `postgres://` URL or `key=value` settings, and optionally a
/// file whose first line is the password. Never printed (its `Debug` hides the settings).
#[derive(Clone)]
pub struct StoreSettings {
    /// The connection settings.
    pub settings: String,
    /// A file holding the password.
    pub password_file: Option<PathBuf>,
    /// A PEM file of CA certificates trusted for `sslmode=require`.
    pub ca_file: Option<PathBuf>,
    /// Where the memory mirror's image is kept (`PgOptions::memory_image_dir`).
    pub image_dir: Option<PathBuf>,
    /// Hold only the memories of the scopes used, about this many records
    /// (`PgOptions::max_loaded_memories`).
    pub max_loaded_memories: Option<usize>,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings").finish_non_exhaustive()
    }
}

/// Lines (file store) or rows (PostgreSQL) of the memory and variable operations before and
/// after a compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// What holds the memory operations (`memory.log`, `memory_ops`).
    pub memory_name: &'static str,
    /// What holds the variable operations (`variables.log`, `variable_ops`).
    pub variables_name: &'static str,
    /// `lines` or `rows`.
    pub unit: &'static str,
    /// Memory operations `(before, after)`.
    pub memory: (u64, u64),
    /// Variable operations `(before, after)`.
    pub variables: (u64, u64),
}

/// A store backend.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Every store port.
    fn stores(&self) -> Arc<dyn AllStores>;

    /// The same store, with its listings and whole-store copies.
    fn copyable(&self) -> Arc<dyn CopyableStore>;

    /// Compacts the logs (safe while other processes use the store).
    ///
    /// # Errors
    /// Store failures; nothing changes then.
    async fn compact(&self) -> Result<Compacted, CliError>;

    /// Problems the store noticed in its data so far.
    fn diagnostics(&self) -> Vec<StoreDiagnostic>;
}

/// The embedded file store.
#[derive(Debug, Clone)]
pub struct FsBackend {
    store: FsStore,
}

#[async_trait::async_trait]
impl Backend for FsBackend {
    fn stores(&self) -> Arc<dyn AllStores> {
        Arc::new(self.store.clone())
    }

    fn copyable(&self) -> Arc<dyn CopyableStore> {
        Arc::new(self.store.clone())
    }

    async fn compact(&self) -> Result<Compacted, CliError> {
        let r = self.store.compact()?;
        Ok(Compacted {
            memory_name: "memory.log",
            variables_name: "variables.log",
            unit: "lines",
            memory: r.memory,
            variables: r.variables,
        })
    }

    fn diagnostics(&self) -> Vec<StoreDiagnostic> {
        self.store.diagnostics()
    }
}

/// A PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgBackend {
    store: PgStore,
}

#[async_trait::async_trait]
impl Backend for PgBackend {
    fn stores(&self) -> Arc<dyn AllStores> {
        Arc::new(self.store.clone())
    }

    fn copyable(&self) -> Arc<dyn CopyableStore> {
        Arc::new(self.store.clone())
    }

    async fn compact(&self) -> Result<Compacted, CliError> {
        let r = self.store.compact().await?;
        Ok(Compacted {
            memory_name: "memory_ops",
            variables_name: "variable_ops",
            unit: "rows",
            memory: r.memory,
            variables: r.variables,
        })
    }

    fn diagnostics(&self) -> Vec<StoreDiagnostic> {
        self.store.diagnostics()
    }
}

impl PgBackend {
    /// Whether the memories began from the image in `--store-image-dir`.
    pub async fn memory_image_read(&self) -> bool {
        self.store.memory_image_read().await
    }

    /// Whether the posting lists of the image the store began from pass their checksums.
    pub async fn memory_image_postings_whole(&self) -> bool {
        self.store.memory_image_postings_whole().await
    }
}

/// Whether the store the command line names holds data already (PostgreSQL: always assumed).
pub fn store_exists(ctx: &Context) -> bool {
    ctx.store.is_some()
        || ["memory.log", "variables.log", "state.json", "chats"]
            .iter()
            .any(|f| ctx.data.join(f).exists())
}

/// A file where the data folder should be is that, not "no store yet" (which would send the
/// user to import into it).
///
/// # Errors
/// [`CliError::Failed`] naming the data directory.
pub fn data_is_a_folder(ctx: &Context) -> Result<(), CliError> {
    if ctx.data.exists() && !ctx.data.is_dir() {
        return Err(CliError::Failed(format!(
            "{} is not a directory",
            ctx.data_label
        )));
    }
    Ok(())
}

/// Opens the store the command line names: PostgreSQL with `--store`, else the data
/// directory. With `create = false` a data directory without a store is an error (reading
/// commands never create one).
///
/// # Errors
/// [`CliError::NotFound`] for a missing store; store failures.
pub async fn open(ctx: &Context, create: bool) -> Result<Arc<dyn Backend>, CliError> {
    let backend: Arc<dyn Backend> = match &ctx.store {
        Some(settings) => Arc::new(open_postgres(settings, "--store").await?),
        None => {
            data_is_a_folder(ctx)?;
            if !create && !store_exists(ctx) {
                return Err(CliError::NotFound(format!(
                    "no store in {} yet: import a SillyTavern folder with `tavern import-st DIR` or run a session first",
                    ctx.data_label
                )));
            }
            Arc::new(open_files(&ctx.data, &ctx.data_label)?)
        }
    };
    ctx.opened.watch(backend.clone());
    Ok(backend)
}

/// The backends a command opened, each with how many diagnostics its open had found (warned
/// of then): [`Opened::warn_of_the_rest`] warns of what the stores found while the command ran
/// — a record changed in the memory image and read again from the log, a damaged posting list
/// rebuilt — which a one-shot command would otherwise never show.
#[derive(Default, Clone)]
pub struct Opened(Arc<std::sync::Mutex<Vec<Watched>>>);

/// A backend opened, and how many diagnostics it had then.
type Watched = (Arc<dyn Backend>, usize);

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened").finish_non_exhaustive()
    }
}

impl Opened {
    fn watch(&self, backend: Arc<dyn Backend>) {
        let seen = backend.diagnostics().len();
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((backend, seen));
    }

    /// Warns of every diagnostic the watched stores found since their open, and lets them go.
    pub fn warn_of_the_rest(&self) {
        let opened = std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for (backend, seen) in opened {
            for d in backend.diagnostics().iter().skip(seen) {
                tracing::warn!(file = %d.file, "{}", d.message);
            }
        }
    }
}

/// Opens (creating) the file store in `dir`, named `label` in messages.
///
/// # Errors
/// `dir` exists and is not a directory; store failures.
pub fn open_files(dir: &std::path::Path, label: &str) -> Result<FsBackend, CliError> {
    if dir.exists() && !dir.is_dir() {
        return Err(CliError::Failed(format!("{label} is not a directory")));
    }
    let store = FsStore::open(dir, Arc::new(SystemClock))?;
    for d in store.diagnostics() {
        tracing::warn!(file = %d.file, "{}", d.message);
    }
    Ok(FsBackend { store })
}

/// Connects to PostgreSQL (`option` names the flag in messages, which never repeat the
/// settings or the password).
///
/// # Errors
/// [`CliError::Usage`] for settings that cannot be parsed or a password file that cannot be
/// read; store failures (an unreachable server, a newer schema).
pub async fn open_postgres(settings: &StoreSettings, option: &str) -> Result<PgBackend, CliError> {
    open_postgres_with(settings, option, PgOptions::default()).await
}

/// [`open_postgres`] reading the memory image in `settings.image_dir` without ever writing
/// one: what `check` opens.
///
/// # Errors
/// As [`open_postgres`].
pub async fn open_postgres_reading_image(settings: &StoreSettings) -> Result<PgBackend, CliError> {
    open_postgres_with(
        settings,
        "--store",
        PgOptions::default().with_read_only_memory_image(),
    )
    .await
}

async fn open_postgres_with(
    settings: &StoreSettings,
    option: &str,
    mut options: PgOptions,
) -> Result<PgBackend, CliError> {
    let (config, tls) = tavern_store::pg::load_settings(
        &settings.settings,
        settings.password_file.as_deref(),
        settings.ca_file.as_deref(),
    )
    .map_err(|e| CliError::Usage(format!("{option}{}: {e}", e.option_suffix())))?;
    options.memory_image_dir.clone_from(&settings.image_dir);
    options.max_loaded_memories = settings.max_loaded_memories;
    let store = PgStore::open_with_options(config, &tls, Arc::new(SystemClock), options).await?;
    for d in store.diagnostics() {
        tracing::warn!(file = %d.file, "{}", d.message);
    }
    Ok(PgBackend { store })
}
