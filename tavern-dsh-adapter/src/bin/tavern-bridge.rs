//! The AgentTavern sidecar for hosts in other languages: the bridge protocol (newline-delimited
//! JSON on stdio, `docs/HOST_INTEGRATION.md`), or MCP on stdio for one session fixed at launch.
//! Logs go to stderr (`RUST_LOG` sets the level); stdout carries only protocol frames.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use tavern_core::{
    CharacterName, ChatId, FixedOffset, SessionBinding, SessionId, TavernArchitecture, Timestamp,
    UtcOffsets,
};
use tavern_dsh_adapter::bridge::host::BridgeHost;
use tavern_dsh_adapter::bridge::{Bridge, BridgeConfig, DEFAULT_MAX_FRAME_BYTES};
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_runtime::mcp::McpServer;
use tavern_search::RankerRef;
use tavern_store::fs::{FsOptions, FsStore};
use tavern_store::{AllStores, SystemClock};
use tavern_tools::assets::provider::{
    AssetProvider, DirAssets, MemAssets, Persona, DEFAULT_MAX_ASSET_BYTES,
};

/// AgentTavern for agent hosts: SillyTavern-style roleplay tools, memories, variables and chat
/// projection behind a sidecar protocol or MCP.
#[derive(Debug, Parser)]
#[command(
    name = "tavern-bridge",
    version,
    about = "AgentTavern for agent hosts: SillyTavern-style roleplay tools, memories, variables and chat projection, over the bridge protocol on stdio (default) or MCP."
)]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// Largest frame read, in bytes; a longer one is answered with an error frame.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_FRAME_BYTES, global = true)]
    max_frame_bytes: usize,
    #[command(subcommand)]
    mode: Option<Mode>,
}

#[derive(Debug, Args)]
struct Common {
    /// The store's data directory (created if missing).
    #[arg(long, value_name = "DIR", global = true)]
    data: Option<PathBuf>,
    /// Keep memories, variables and chats in PostgreSQL instead of --data: a `postgres://` URL
    /// or `key=value` settings, shared by every host that names the same database. Never logged.
    #[cfg(feature = "postgres")]
    #[arg(
        long,
        value_name = "SETTINGS",
        env = "TAVERN_STORE",
        hide_env_values = true,
        conflicts_with = "data",
        global = true
    )]
    store: Option<String>,
    /// A file whose first line is the database password, to keep it out of --store.
    #[cfg(feature = "postgres")]
    #[arg(long, value_name = "FILE", requires = "store", global = true)]
    store_password_file: Option<PathBuf>,
    /// A PEM file of CA certificates trusted (besides the Mozilla roots) when --store says
    /// `sslmode=require`; without that setting connections are not encrypted.
    #[cfg(feature = "postgres")]
    #[arg(long, value_name = "FILE", requires = "store", global = true)]
    store_ca_file: Option<PathBuf>,
    /// A local directory (created when missing) where an image of the memories read from
    /// --store is kept: the next start reads it and fetches only the memories written since.
    /// One directory per database; hosts on one machine may share it.
    #[cfg(feature = "postgres")]
    #[arg(long, value_name = "DIR", requires = "store", global = true)]
    store_image_dir: Option<PathBuf>,
    /// Hold only the memories of the scopes this host's sessions use, about N records at most
    /// beyond what one call needs; the least recently used scopes are dropped past it (hosts
    /// sharing a large database then each hold their players' memories, not everyone's).
    /// Default: every memory is held. Not with --store-image-dir.
    #[cfg(feature = "postgres")]
    #[arg(
        long,
        value_name = "N",
        requires = "store",
        conflicts_with = "store_image_dir",
        global = true
    )]
    store_max_loaded_memories: Option<usize>,
    /// A SillyTavern user folder (`characters/`, `worlds/`) to read cards and world books from.
    #[arg(long, value_name = "DIR", global = true)]
    assets: Option<PathBuf>,
    /// The user's display name (a `settings.json` in `--assets` with personas wins over it).
    #[arg(long, value_name = "NAME", default_value = "User", global = true)]
    user: String,
    /// The user's persona description, for a setup without a SillyTavern `settings.json`.
    #[arg(long, value_name = "TEXT", default_value = "", global = true)]
    persona_description: String,
    /// A world book that is active in every chat (repeatable); must exist under `--assets`.
    #[arg(long = "world", value_name = "NAME", global = true)]
    worlds: Vec<String>,
    /// Write chats into this SillyTavern user folder (`chats/<character>/<chat>.jsonl`, where
    /// SillyTavern opens them) instead of under --data; the store remembers it. Usually the
    /// same folder as --assets.
    #[arg(long, value_name = "DIR", global = true)]
    chat_folder: Option<PathBuf>,
    /// The user's time zone for SillyTavern's time macros (`{{time}}`, `{{date}}`,
    /// `{{idle_duration}}`): `local` (the system's zone, daylight saving time included) or a
    /// fixed offset such as `+08:00`, `-05:30`, `UTC`.
    #[arg(
        long,
        value_name = "ZONE",
        default_value = "local",
        allow_hyphen_values = true,
        global = true
    )]
    utc_offset: String,
    /// Word vectors (GloVe or fastText, as text: `word v1 v2 …` per line) to rank memory,
    /// history and lore search by meaning as well as words: what the lexical search found is
    /// reordered so that results near the query's sense rise ("photography" finds the camera
    /// and the lens). Read before the bridge answers (about 1.3 s for GloVe's 400,000 words).
    /// `scripts/word-vectors.sh` fetches GloVe 6B 50d.
    #[arg(long, value_name = "FILE", global = true)]
    word_vectors: Option<PathBuf>,
    /// A sentence encoder (a sentence-transformers BERT folder: all-MiniLM-L6-v2, as
    /// `scripts/sentence-encoder.sh` fetches it) to reorder what memory, history and lore
    /// search found by words by what whole sentences mean: of the memories that share only
    /// "setup" with "accessories for my photography setup", the camera one comes first (a
    /// text that shares no word with the query is still not found). Texts are encoded once
    /// each, with no lock held and two searches at a time (about 17 ms a short text on one
    /// core; a search waits 10 s at most for its turn, then ranks by words): a first search
    /// by meaning is slower, other calls are not. Read at start (0.2 s, about 100 MiB).
    /// English models read Chinese poorly. Instead of --word-vectors.
    #[arg(
        long,
        value_name = "DIR",
        global = true,
        conflicts_with = "word_vectors"
    )]
    sentence_encoder: Option<PathBuf>,
    /// The share of a result's score that comes from --word-vectors or --sentence-encoder,
    /// 0 to 0.95.
    #[arg(long, value_name = "W", global = true, allow_negative_numbers = true)]
    vector_weight: Option<f32>,
    /// The largest card or world book file read from `--assets`, in MiB; a larger one is
    /// refused by name, never read (the largest real card seen is about 2 MiB).
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_MAX_ASSET_BYTES / (1024 * 1024), global = true)]
    max_asset_mib: u64,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Serve the tools over MCP on stdio for one session fixed at launch.
    Mcp(McpArgs),
}

#[derive(Debug, Args)]
struct McpArgs {
    /// The session the tools act for.
    #[arg(long, value_name = "ID")]
    session: String,
    /// Bind the session to a chat of this character first (needs `--chat`): an existing chat
    /// is continued, a new one is created with the card's greeting. Needed unless the session
    /// is already bound (by an earlier start); a session bound to another chat is refused.
    #[arg(long, value_name = "NAME", requires = "chat")]
    character: Option<String>,
    /// The chat to bind the session to (needs `--character`).
    #[arg(long, value_name = "ID", requires = "character")]
    chat: Option<String>,
}

/// Checks what the command line names before anything starts, so a mistake is one clear line.
fn assets(common: &Common) -> Result<Arc<dyn AssetProvider>, String> {
    let persona = Persona {
        name: common.user.clone(),
        description: common.persona_description.clone(),
    };
    let Some(dir) = &common.assets else {
        if let Some(w) = common.worlds.first() {
            return Err(format!("--world {w} needs --assets DIR to find it in"));
        }
        return Ok(Arc::new(MemAssets {
            persona,
            ..MemAssets::default()
        }));
    };
    if !dir.is_dir() {
        return Err("--assets must name a readable directory".into());
    }
    for w in &common.worlds {
        let found = ["json"]
            .iter()
            .any(|ext| dir.join("worlds").join(format!("{w}.{ext}")).is_file());
        if !found {
            return Err(format!("--world {w}: no worlds/{w}.json under --assets"));
        }
    }
    Ok(Arc::new(
        DirAssets::new(dir, common.worlds.clone(), persona)
            .with_max_bytes(common.max_asset_mib.saturating_mul(1024 * 1024)),
    ))
}

/// The system's zone (the `TZ` variable, else `/etc/localtime`), asked per moment so
/// daylight saving time comes out right.
#[derive(Debug)]
struct SystemZone;

impl UtcOffsets for SystemZone {
    fn minutes_at(&self, at: Timestamp) -> i32 {
        use chrono::{Offset, TimeZone};
        chrono::DateTime::from_timestamp_millis(at.0).map_or(0, |utc| {
            chrono::Local
                .offset_from_utc_datetime(&utc.naive_utc())
                .fix()
                .local_minus_utc()
                / 60
        })
    }
}

/// `--utc-offset`: `local` or a fixed offset.
fn zone(text: &str) -> Result<Arc<dyn UtcOffsets>, String> {
    if text.trim().eq_ignore_ascii_case("local") {
        return Ok(Arc::new(SystemZone));
    }
    FixedOffset::parse(text)
        .map(|z| Arc::new(z) as Arc<dyn UtcOffsets>)
        .ok_or_else(|| {
            format!(
                "--utc-offset {text:?}: expected `local` or an offset such as +08:00, -05:30, UTC"
            )
        })
}

/// The store the command line names: PostgreSQL with `--store`, else the files under `--data`.
struct Opened {
    store: Arc<dyn AllStores>,
    /// The task reading a database's memories in the background (awaited for a while at exit
    /// so that the image it saves is not cut short).
    load: Option<tokio::task::JoinHandle<()>>,
    /// What the store found, logged as it comes (and once more at exit).
    reported: Arc<Reported>,
    /// The task looking for it while the bridge serves.
    watcher: tokio::task::JoinHandle<()>,
}

/// How long an exiting bridge waits for the background read of a database's memories (and
/// the image saved after it) to finish.
#[cfg(feature = "postgres")]
const EXIT_WAIT_FOR_LOAD: std::time::Duration = std::time::Duration::from_secs(10);

async fn open_store(
    common: &Common,
    clock: Arc<dyn tavern_store::clock::Clock>,
) -> Result<Opened, String> {
    #[cfg(feature = "postgres")]
    // An empty TAVERN_STORE (common in env files) means no database.
    if let Some(settings) = common.store.as_ref().filter(|s| !s.trim().is_empty()) {
        if common.chat_folder.is_some() {
            return Err(
                "--chat-folder keeps chats in files; it cannot be used with --store".into(),
            );
        }
        return open_postgres(
            settings,
            common.store_password_file.as_deref(),
            common.store_ca_file.as_deref(),
            common.store_image_dir.clone(),
            common.store_max_loaded_memories,
            clock,
        )
        .await;
    }
    let data = common.data.as_ref().ok_or(
        "--data DIR (or --store postgres://…) is required: where memories, variables and chats are kept",
    )?;
    // The memory log (a million records take seconds to read) is read on a thread of its
    // own, so the host's handshake is answered at once; a memory call made before it is done
    // waits for it.
    let mut options = FsOptions::default().with_deferred_memory_load();
    if let Some(dir) = &common.chat_folder {
        options = options.with_chat_folder(dir);
    }
    if data.exists() && !data.is_dir() {
        return Err(format!("--data {}: not a directory", data.display()));
    }
    let store = FsStore::open_with(data, clock, options).map_err(|e| format!("--data: {e}"))?;
    let watched = store.clone();
    let reported = Reported::logging(move || watched.diagnostics());
    let watcher = reported.watch();
    let loading = store.clone();
    let loaded = reported.clone();
    // A thread of its own, not the runtime's blocking pool: the bridge can exit (shutdown,
    // the host gone) while a large log is still being read.
    std::thread::spawn(move || {
        let started = std::time::Instant::now();
        match loading.load_memories() {
            Ok(()) => tracing::info!(
                records = loading.memory_len(),
                ms = started.elapsed().as_millis() as u64,
                "memories loaded"
            ),
            // The next memory call tries again (and fails with this error if it persists).
            Err(e) => tracing::error!(
                "memory.log cannot be read yet; memory calls fail until it can: {e}"
            ),
        }
        loaded.warn_new();
    });
    Ok(Opened {
        store: Arc::new(store),
        load: None,
        reported,
        watcher,
    })
}

/// How often a running bridge looks for problems its store found while serving — a record
/// changed in the memory image (the log read again), a damaged posting list rebuilt — to log
/// them: the store handles them by itself and only lists them (a line can come a little
/// later when the workers are busy).
const DIAGNOSTICS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The store's problems already logged, so each is logged once, when first seen: at open,
/// after the background load of the memories, while serving, or at exit. A problem worded as
/// one the store still lists (same file, same words) is not logged again.
struct Reported {
    /// The store's problems now (its list: bounded, newest last).
    diagnostics: Box<dyn Fn() -> Vec<tavern_store::StoreDiagnostic> + Send + Sync>,
    seen: std::sync::Mutex<Vec<tavern_store::StoreDiagnostic>>,
}

impl Reported {
    /// Logs what the store found so far (at open) and remembers it.
    fn logging(
        diagnostics: impl Fn() -> Vec<tavern_store::StoreDiagnostic> + Send + Sync + 'static,
    ) -> Arc<Self> {
        let reported = Arc::new(Self {
            diagnostics: Box::new(diagnostics),
            seen: std::sync::Mutex::new(Vec::new()),
        });
        reported.warn_new();
        reported
    }

    /// Logs the store's problems not logged yet. The list is read under the lock, so two
    /// callers (the load, the watcher) never log one twice.
    fn warn_new(&self) {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = (self.diagnostics)();
        for d in now.iter().filter(|d| !seen.contains(d)) {
            tracing::warn!(file = %d.file, "{}", d.message);
        }
        *seen = now;
    }

    /// Looks every [`DIAGNOSTICS_EVERY`] until aborted (at exit), and logs what is new.
    fn watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let reported = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(DIAGNOSTICS_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                every.tick().await;
                reported.warn_new();
            }
        })
    }
}

/// Connects to PostgreSQL; no message repeats the settings or the password.
#[cfg(feature = "postgres")]
async fn open_postgres(
    settings: &str,
    password_file: Option<&std::path::Path>,
    ca_file: Option<&std::path::Path>,
    image_dir: Option<PathBuf>,
    max_loaded_memories: Option<usize>,
    clock: Arc<dyn tavern_store::clock::Clock>,
) -> Result<Opened, String> {
    use tavern_store::pg::{PgOptions, PgStore};
    let (config, tls) = tavern_store::pg::load_settings(settings, password_file, ca_file)
        .map_err(|e| format!("--store{}: {e}", e.option_suffix()))?;
    // The memories (a million take seconds to read, even from an image) are read in a task
    // of their own, so the host's handshake is answered at once; a memory call made before
    // they are read waits for them.
    let mut options = PgOptions::default().with_deferred_memory_load();
    options.memory_image_dir = image_dir;
    options.max_loaded_memories = max_loaded_memories;
    let store = PgStore::open_with_options(config, &tls, clock, options)
        .await
        .map_err(|e| e.to_string())?;
    let watched = store.clone();
    let reported = Reported::logging(move || watched.diagnostics());
    let watcher = reported.watch();
    tracing::info!("store: postgresql");
    let loading = store.clone();
    let loaded = reported.clone();
    let load = tokio::spawn(async move {
        let started = std::time::Instant::now();
        match loading.load_memories().await {
            Ok(()) => {
                let records = loading.memory_len().await;
                // Rows fetched from the database: those after the image, when one was read.
                let rows = loading.memory_rows_replayed().await;
                tracing::info!(
                    records,
                    rows,
                    ms = started.elapsed().as_millis() as u64,
                    "memories loaded"
                );
            }
            // The next memory call tries again (and fails with this error if it persists).
            Err(e) => tracing::error!(
                "the memories cannot be read yet; memory calls fail until they can: {e}"
            ),
        }
        loaded.warn_new();
    });
    Ok(Opened {
        store: Arc::new(store),
        load: Some(load),
        reported,
        watcher,
    })
}

async fn run(cli: Cli) -> Result<(), String> {
    let assets = assets(&cli.common)?;
    // Read before the store opens, so a bad file stops the start at once.
    let ranker = ranker(&cli.common).await?;
    if let Some(Mode::Mcp(m)) = &cli.mode {
        SessionId::parse(m.session.as_str()).map_err(|e| format!("--session: {e}"))?;
    }
    let clock = Arc::new(SystemClock);
    let Opened {
        store,
        load,
        reported,
        watcher,
    } = open_store(&cli.common, clock.clone()).await?;
    let served = serve(cli, store, assets, clock, ranker).await;
    // The host is done; the memories may still be being read, or their image written: given
    // a while, the next start reads that image instead of every row.
    if let Some(load) = load.filter(|l| !l.is_finished()) {
        #[cfg(feature = "postgres")]
        if tokio::time::timeout(EXIT_WAIT_FOR_LOAD, load)
            .await
            .is_err()
        {
            tracing::warn!(
                "the memories were still being read at exit; the next start reads them again"
            );
        }
        #[cfg(not(feature = "postgres"))]
        drop(load);
    }
    // What the last calls found, said before the bridge goes (and the watcher's hold on the
    // store let go here, not while the runtime shuts down).
    watcher.abort();
    let _ = watcher.await;
    reported.warn_new();
    served
}

/// The ranker the tools hand their candidates to: the lexical one, or one over
/// `--word-vectors` or `--sentence-encoder`, read on the blocking pool.
async fn ranker(common: &Common) -> Result<RankerRef, String> {
    let (ranker, said) = tavern_runtime::open_ranker(tavern_runtime::RankerChoice {
        word_vectors: common.word_vectors.clone(),
        sentence_encoder: common.sentence_encoder.clone(),
        weight: common.vector_weight,
    })
    .await
    .map_err(|e| e.to_string())?;
    tracing::info!("{said}");
    Ok(ranker)
}

/// Binds the MCP session to the chat `named` (character, chat), or checks the binding an
/// earlier start made: every tool acts on an agent-tavern session's chat, and nothing over MCP
/// binds one, so a session the tools cannot serve is refused here, in one line.
async fn bind_mcp_session(
    runtime: &Runtime,
    store: &dyn AllStores,
    cards: Option<&dyn AssetProvider>,
    session: &SessionId,
    named: Option<(String, String)>,
) -> Result<(), String> {
    let state = runtime.state().await.map_err(|e| e.to_string())?;
    let bound = state.binding(session);
    if let Some(b) = bound {
        let target = b.target();
        let unservable = if target.group {
            Some("a group chat")
        } else if b.architecture() != TavernArchitecture::AgentTavern {
            Some("a SillyTavern (st) session")
        } else {
            None
        };
        if let Some(kind) = unservable {
            return Err(format!(
                "--session {session} is bound to chat {:?} of {:?} as {kind}, which MCP cannot \
                 serve (its tools act on agent-tavern sessions): name a new session",
                target.chat_id.as_str(),
                target.character.as_str()
            ));
        }
    }
    let Some((character, chat)) = named else {
        return match bound {
            Some(_) => Ok(()),
            None => Err(format!(
                "--session {session} is not bound to a chat yet: name one with --character \
                 NAME --chat ID (an existing chat is continued, a new one is created)"
            )),
        };
    };
    let character = CharacterName::parse(character).map_err(|e| format!("--character: {e}"))?;
    let chat = ChatId::parse(chat).map_err(|e| format!("--chat: {e}"))?;
    match bound.map(SessionBinding::target) {
        // Serving the old chat under the new names would write the player's lines into a
        // chat they did not ask for.
        Some(target) if target.character != character || target.chat_id != chat => Err(format!(
            "--session {session} is bound to chat {:?} of {:?}, not {:?} of {:?}: leave out \
                 --character and --chat to serve the chat it is bound to, or name a new session \
                 to open that one",
            target.chat_id.as_str(),
            target.character.as_str(),
            chat.as_str(),
            character.as_str()
        )),
        Some(_) => Ok(()),
        None => {
            // An existing chat (an imported or SillyTavern one) is continued as it is; only a
            // new one is created with the card's greeting.
            let exists = store
                .chat_revision(&character, &chat)
                .await
                .map_err(|e| e.to_string())?
                .is_some();
            if let Some(cards) = cards {
                check_card(cards, &character, exists).await?;
            }
            if exists {
                runtime.bind_existing_chat(session, &character, &chat).await
            } else {
                runtime.new_chat(session, &character, &chat, false).await
            }
            .map(drop)
            .map_err(|e| e.to_string())
        }
    }
}

/// What a new binding's character must be when the cards come from `--assets`: not a group
/// (MCP serves one character's chat), and a card there unless the chat exists already (a typo
/// or a display name instead of the card's file name would bind, for good, a new chat that
/// has no card, no greeting and no description).
async fn check_card(
    cards: &dyn AssetProvider,
    character: &CharacterName,
    chat_exists: bool,
) -> Result<(), String> {
    let name = character.as_str();
    // The card first: a character whose card's file name is also a group's name is a
    // character.
    let card = cards.card(character).await;
    if matches!(card, Ok(Some(_))) {
        return Ok(());
    }
    if matches!(cards.group(name).await, Ok(Some(_))) {
        return Err(format!(
            "--character {name:?} is a group: MCP serves one character's chat"
        ));
    }
    match card {
        // A chat whose card is gone or unreadable is still the player's to continue.
        _ if chat_exists => Ok(()),
        Ok(_) => Err(format!(
            "--character {name:?}: no card of that name under --assets (characters/{name}.png \
             or .json: the card's file name, not the name it shows)"
        )),
        Err(e) => Err(format!("--character {name:?}: {e}")),
    }
}

/// Serves the host on stdio until it is done.
async fn serve(
    cli: Cli,
    store: Arc<dyn AllStores>,
    assets: Arc<dyn AssetProvider>,
    clock: Arc<SystemClock>,
    ranker: RankerRef,
) -> Result<(), String> {
    let host = Arc::new(BridgeHost::default());
    let config = RuntimeConfig {
        user_name: cli.common.user.clone(),
        zone: zone(&cli.common.utc_offset)?,
        ranker,
        // MCP has no SillyTavern pipeline: its sessions are agent-tavern whatever the store's
        // default for new sessions says.
        new_sessions: matches!(cli.mode, Some(Mode::Mcp(_)))
            .then_some(TavernArchitecture::AgentTavern),
        // A folder's cards are there to be found: a new chat of a name it has no card of is
        // refused (the plugin's `character` setting, `chat/bind`), not started empty.
        require_cards: cli.common.assets.is_some(),
        ..RuntimeConfig::default()
    };
    // The cards a new MCP binding is checked against, when they come from a folder.
    let cards = cli.common.assets.is_some().then(|| assets.clone());
    let runtime = Runtime::new(host.clone(), store.clone(), assets, clock, config);
    let (stdin, stdout) = (
        tokio::io::BufReader::new(tokio::io::stdin()),
        tokio::io::stdout(),
    );
    match cli.mode {
        Some(Mode::Mcp(m)) => {
            let session = SessionId::parse(m.session).map_err(|e| format!("--session: {e}"))?;
            let named = m.character.zip(m.chat);
            bind_mcp_session(&runtime, &*store, cards.as_deref(), &session, named).await?;
            let agent = tavern_core::AgentId::parse(session.as_str()).map_err(|e| e.to_string())?;
            tracing::info!(%session, "serving MCP on stdio");
            McpServer::new(runtime, agent)
                .serve(stdin, stdout)
                .await
                .map_err(|e| e.to_string())
        }
        None => {
            tracing::info!("serving the bridge protocol on stdio");
            let config = BridgeConfig {
                max_frame_bytes: cli.max_frame_bytes,
            };
            let mut bridge = Bridge::with_config(runtime, host, config);
            // The panel's store page checks the file store the bridge serves (a database is
            // checked with `tavern check --store` where it is reachable).
            // (`--data` and `--store` exclude each other.)
            if let Some(data) = &cli.common.data {
                bridge = bridge.with_store_check(Arc::new(
                    tavern_api::routes::store::FileStoreCheck::new(data),
                ));
            }
            Arc::new(bridge)
                .serve(stdin, stdout)
                .await
                .map_err(|e| e.to_string())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // Two workers (the machine's cores); the store moves blocking IO to the blocking pool.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Store IO is short; a few blocking threads serve it, and memory stays small.
        .max_blocking_threads(16)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
