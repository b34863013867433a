//! The command line: every command, option and help text (`clap` derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Exit codes, shown under `tavern --help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  failure: not found, unreadable input, refused, IO error
  2  usage error: bad option, scope, id, revision or JSON value
  3  revision conflict: the record changed since the revision given; nothing was written
  4  `tavern check` found corrupt or set-aside data

Data directory (--data; default: $TAVERN_DATA, else the DSH plugin's store $DSH_HOME/agent-tavern
(~/.dsh/agent-tavern) when it holds one, else the per-user data directory, e.g.
~/.local/share/agent-tavern):
  the store (memory.log, variables.log, state.json, chats/, checkpoints/, prompts/) plus
  assets/characters and assets/worlds, where `tavern import-st` puts cards and world books.
  Run `tavern-bridge --data DIR --assets DIR/assets` to use them in sessions.";

/// Look at and correct what AgentTavern remembers: import a SillyTavern folder, list, search and
/// export memories, variables and chats, validate cards, check and compact the store.
#[derive(Debug, Parser)]
#[command(name = "tavern", version, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// The data directory (the store, plus `assets/`); default: `TAVERN_DATA`, else the DSH
    /// plugin's store when there is one, else the per-user data directory.
    #[arg(long, value_name = "DIR", global = true)]
    pub data: Option<PathBuf>,
    /// Keep memories, variables and chats in PostgreSQL instead of the data directory (which
    /// then holds only `assets/`): a `postgres://` URL or `key=value` settings. Never printed.
    #[arg(
        long,
        value_name = "SETTINGS",
        env = "TAVERN_STORE",
        hide_env_values = true,
        global = true
    )]
    pub store: Option<String>,
    /// A file whose first line is the database password, to keep it out of --store.
    #[arg(long, value_name = "FILE", requires = "store", global = true)]
    pub store_password_file: Option<PathBuf>,
    /// A PEM file of CA certificates trusted (besides the Mozilla roots) when --store says
    /// `sslmode=require`; without that setting connections are not encrypted.
    #[arg(long, value_name = "FILE", requires = "store", global = true)]
    pub store_ca_file: Option<PathBuf>,
    /// A local directory (created when missing) where an image of the memories read from
    /// --store is kept: the next run reads it and fetches only the memories written since.
    /// One directory per database.
    #[arg(long, value_name = "DIR", requires = "store", global = true)]
    pub store_image_dir: Option<PathBuf>,
    /// Hold only the memories of the scopes used (sessions, characters…) read from --store,
    /// about N records at most beyond what one call needs; the least recently used scopes
    /// are dropped past it. Default: every memory is held. Not with --store-image-dir.
    #[arg(
        long,
        value_name = "N",
        requires = "store",
        conflicts_with = "store_image_dir",
        global = true
    )]
    pub store_max_loaded_memories: Option<usize>,
    /// Print one JSON document on stdout instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Import a SillyTavern user folder: cards and world books into `assets/`, chats into the
    /// store (byte-exact); re-running skips what is already imported.
    #[command(name = "import-st", after_help = IMPORT_HELP)]
    ImportSt(ImportArgs),
    /// Memories: list, search, show, history, forget, restore.
    #[command(subcommand)]
    Memory(MemoryCommand),
    /// Variables: typed JSON values with revisions, by scope.
    #[command(subcommand)]
    Var(VarCommand),
    /// Chats: list, show, projector status, replay from the host's session log.
    #[command(subcommand)]
    Chat(ChatCommand),
    /// Export memories as a SillyTavern world book, or a chat as SillyTavern JSONL.
    #[command(subcommand)]
    Export(ExportCommand),
    /// Character cards.
    #[command(subcommand)]
    Card(CardCommand),
    /// Verify every log and document of the store (checksums, parse, revisions) without
    /// changing anything; exits 4 when something is corrupt or set aside.
    Check,
    /// Compact the memory and variable operations into one snapshot per record (the logs of
    /// the file store, the operation tables of PostgreSQL); safe while other processes use the
    /// store.
    Compact,
    /// Copy the whole store (the data directory, or the database of --store) into an empty
    /// file store or PostgreSQL database, exactly, then read both back and compare them.
    #[command(after_help = COPY_HELP)]
    Copy(CopyArgs),
    /// Serve the management API (sessions, memories, variables, lore, prompt) over HTTP, on
    /// loopback unless a token is given; Ctrl-C stops.
    #[command(after_help = SERVE_HELP)]
    Serve(ServeArgs),
}

const SERVE_HELP: &str = "\
The API's routes are under /api/v1/ (the OpenAPI document: /api/v1/openapi.json). Every write
names the revision it read; a stale one answers 409 with the current revision.

Examples:
  tavern serve                                   # http://127.0.0.1:7300/api/v1/
  tavern serve --listen 0.0.0.0:7300 --token-file ~/.config/agent-tavern/token
  curl -s 'http://127.0.0.1:7300/api/v1/memories?scope=global'";

/// `tavern serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on; anything but loopback needs --token-file.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7300")]
    pub listen: std::net::SocketAddr,
    /// A file whose first line is the bearer token every request must carry (at least 16
    /// characters).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// DSH's session folder (e.g. ~/.dsh/sessions), so replay can read the host's logs.
    #[arg(long, value_name = "DIR")]
    pub sessions: Option<PathBuf>,
    /// How the panel's memory search ranks.
    #[command(flatten)]
    pub ranking: RankingArgs,
}

/// How a memory search ranks what the words found (`tavern serve`, `tavern memory search`):
/// by words alone, or blended with word vectors or a sentence encoder, as `tavern-bridge`'s
/// options of the same names do for the model's searches.
#[derive(Debug, Clone, Default, Args)]
pub struct RankingArgs {
    /// Word vectors (GloVe or fastText as text) to rank memory search by meaning as well as
    /// words, as `tavern-bridge --word-vectors` does for the model's searches.
    #[arg(long, value_name = "FILE")]
    pub word_vectors: Option<PathBuf>,
    /// A sentence encoder (a sentence-transformers BERT folder, as
    /// `scripts/sentence-encoder.sh` fetches it) to rank memory search by what whole
    /// sentences mean, as `tavern-bridge --sentence-encoder` does. Instead of
    /// --word-vectors.
    #[arg(long, value_name = "DIR", conflicts_with = "word_vectors")]
    pub sentence_encoder: Option<PathBuf>,
    /// The share of a result's score that comes from --word-vectors or --sentence-encoder,
    /// 0 to 0.95.
    #[arg(long, value_name = "W", allow_negative_numbers = true)]
    pub vector_weight: Option<f32>,
}

impl RankingArgs {
    /// The ranker these options name, read (a bad file or weight is a usage error naming it)
    /// and what was read, in words.
    ///
    /// # Errors
    /// [`crate::CliError::Usage`] naming the option and its value.
    pub async fn open(&self) -> Result<(tavern_search::RankerRef, String), crate::CliError> {
        tavern_runtime::open_ranker(tavern_runtime::RankerChoice {
            word_vectors: self.word_vectors.clone(),
            sentence_encoder: self.sentence_encoder.clone(),
            weight: self.vector_weight,
        })
        .await
        .map_err(|e| crate::CliError::Usage(e.to_string()))
    }
}

const COPY_HELP: &str = "\
Copies every memory with its audit trail (forgotten ones too), every variable scope with its
history, every chat byte for byte, the state, projector checkpoints and session prompts, with
their revisions and times. The target must be empty; the source is never changed. Stop the
hosts using the source first: writes made while the copy runs may be missed (the verification
then fails). Examples:
  tavern --data ~/tavern copy --to-store 'postgres://tavern@db/tavern' --to-store-password-file pw
  tavern --store 'postgres://tavern@db/tavern' copy --to-data ~/tavern-backup";

/// `tavern copy`.
#[derive(Debug, Args)]
pub struct CopyArgs {
    /// Copy into the file store in DIR (created; must hold no store yet).
    #[arg(long, value_name = "DIR", conflicts_with = "to_store")]
    pub to_data: Option<PathBuf>,
    /// Copy into this PostgreSQL database (`postgres://` URL or `key=value`; must be empty).
    #[arg(long, value_name = "SETTINGS")]
    pub to_store: Option<String>,
    /// A file whose first line is the target database's password.
    #[arg(long, value_name = "FILE", requires = "to_store")]
    pub to_store_password_file: Option<PathBuf>,
    /// A PEM file of CA certificates trusted for the target when it says `sslmode=require`.
    #[arg(long, value_name = "FILE", requires = "to_store")]
    pub to_store_ca_file: Option<PathBuf>,
}

const IMPORT_HELP: &str = "\
Reads DIR/characters/*.png|json (cards), DIR/worlds/*.json (world books),
DIR/chats/<character>/*.jsonl and DIR/group chats/*.jsonl (group chats are stored under the
group's name from DIR/groups/*.json, or under `group chats` when no group lists them).
Every file is validated first. An item that already exists identically is skipped as already
imported; one that exists with other content is a conflict and left alone.";

/// `tavern import-st`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The SillyTavern user folder (e.g. `SillyTavern/data/default-user`).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Report what would be imported; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Largest file imported, in MiB; a larger one is reported and skipped (the largest real
    /// card seen is about 2 MiB, the largest chat about 20 MiB).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub max_file_mib: u64,
}

/// A scope kind on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScopeKind {
    /// One chat of one character (needs --character and --chat).
    Chat,
    /// Every chat with one character (needs --character).
    Character,
    /// One agent (needs --agent).
    Agent,
    /// Turn-local variables of one agent (needs --agent).
    Turn,
    /// Shared by everything.
    Global,
}

/// Which scope a command works on.
#[derive(Debug, Clone, Default, Args)]
pub struct ScopeArgs {
    /// The scope kind.
    #[arg(long, value_enum, value_name = "SCOPE")]
    pub scope: Option<ScopeKind>,
    /// The character (for --scope chat or character).
    #[arg(long, value_name = "NAME")]
    pub character: Option<String>,
    /// The chat id, its file name without `.jsonl` (for --scope chat).
    #[arg(long, value_name = "ID")]
    pub chat: Option<String>,
    /// The agent (host session) id (for --scope agent or turn).
    #[arg(long, value_name = "ID")]
    pub agent: Option<String>,
}

/// Filters of memory listings.
#[derive(Debug, Clone, Default, Args)]
pub struct MemoryFilter {
    /// Include forgotten (soft-deleted) memories.
    #[arg(long)]
    pub include_deleted: bool,
    /// Include expired memories.
    #[arg(long)]
    pub include_expired: bool,
}

/// `tavern memory …`.
#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// List memories (all scopes unless --scope), newest first, with revision, state, source
    /// and expiry.
    Ls {
        /// The scope (all scopes when omitted).
        #[command(flatten)]
        scope: ScopeArgs,
        /// Which records.
        #[command(flatten)]
        filter: MemoryFilter,
        /// At most this many.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
    },
    /// Search memories by text (BM25 blended with importance, confidence and recency).
    Search {
        /// What to look for.
        #[arg(value_name = "QUERY")]
        query: String,
        /// The scope (all scopes when omitted).
        #[command(flatten)]
        scope: ScopeArgs,
        /// Which records.
        #[command(flatten)]
        filter: MemoryFilter,
        /// At most this many hits (1 to 100).
        #[arg(long, value_name = "N", default_value_t = 10)]
        limit: usize,
        /// Skip this many hits first (0 to 10,000): the next page starts where the last one
        /// ended (the output names it); while the store is unchanged, pages of one query
        /// never repeat or skip a hit.
        #[arg(long, value_name = "N", default_value_t = 0)]
        offset: usize,
        /// How the hits are ranked.
        #[command(flatten)]
        ranking: RankingArgs,
    },
    /// Show one memory, forgotten or expired ones included.
    Show {
        /// The memory id.
        #[arg(value_name = "ID")]
        id: String,
        /// Its scope (needed only when the id exists in several scopes).
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// The audit trail of one memory: every create, update, forget, restore and expiry.
    History {
        /// The memory id.
        #[arg(value_name = "ID")]
        id: String,
        /// Its scope (needed only when the id exists in several scopes).
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Forget (soft-delete) a memory at its current revision; nothing is deleted physically.
    Forget {
        /// The memory id.
        #[arg(value_name = "ID")]
        id: String,
        /// The memory's current revision (as `ls` or `show` print it).
        #[arg(long, value_name = "REV")]
        revision: String,
        /// Its scope (needed only when the id exists in several scopes).
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Bring back a forgotten memory at its current revision (audited as `restored`).
    Restore {
        /// The memory id.
        #[arg(value_name = "ID")]
        id: String,
        /// The memory's current revision (the forgotten version's, as `show` prints it).
        #[arg(long, value_name = "REV")]
        revision: String,
        /// Its scope (needed only when the id exists in several scopes).
        #[command(flatten)]
        scope: ScopeArgs,
    },
}

/// `tavern var …`.
#[derive(Debug, Subcommand)]
pub enum VarCommand {
    /// List a scope's variables with types, previews and revisions.
    Ls {
        /// The scope.
        #[command(flatten)]
        scope: ScopeArgs,
        /// Only names starting with this.
        #[arg(long, value_name = "PREFIX", default_value = "")]
        prefix: String,
    },
    /// Print a variable's value and revision.
    Get {
        /// The variable.
        #[arg(value_name = "NAME")]
        name: String,
        /// The scope.
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Set a variable to a JSON value (`'"text"'`, `3`, `'{"a":1}'`); creating needs no
    /// revision, changing needs the current one.
    Set {
        /// The variable.
        #[arg(value_name = "NAME")]
        name: String,
        /// The value, as JSON.
        #[arg(value_name = "JSON")]
        value: String,
        /// The variable's current revision (omit to create it).
        #[arg(long, value_name = "REV")]
        revision: Option<String>,
        /// The scope.
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Delete a variable at its current revision (an audited tombstone stays).
    Rm {
        /// The variable.
        #[arg(value_name = "NAME")]
        name: String,
        /// The variable's current revision.
        #[arg(long, value_name = "REV")]
        revision: String,
        /// The scope.
        #[command(flatten)]
        scope: ScopeArgs,
    },
}

/// `tavern chat …`.
#[derive(Debug, Subcommand)]
pub enum ChatCommand {
    /// List chats per character.
    Ls {
        /// Only this character's chats.
        #[arg(long, value_name = "NAME")]
        character: Option<String>,
    },
    /// Print a chat's lines.
    Show {
        /// The character.
        #[arg(value_name = "CHARACTER")]
        character: String,
        /// The chat id (file name without `.jsonl`).
        #[arg(value_name = "CHAT")]
        chat: String,
    },
    /// Sessions' bindings and projector checkpoints: cursor, pending gap, error.
    Status {
        /// Only this session.
        #[arg(value_name = "SESSION")]
        session: Option<String>,
    },
    /// Fill a session's projection gap from the host's on-disk session log
    /// (`DIR/<any>/<SESSION>/session.jsonl`); only what is missing is written.
    Replay {
        /// The session.
        #[arg(value_name = "SESSION")]
        session: String,
        /// The host's sessions folder (DSH: its sessions root).
        #[arg(long, value_name = "DIR")]
        sessions_root: PathBuf,
    },
}

/// `tavern export …`.
#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// Live memories as a SillyTavern world book (keys from tags and salient words, content,
    /// provenance in each entry's comment).
    Memories {
        /// The world file to write.
        #[arg(long, value_name = "FILE")]
        world: PathBuf,
        /// Only this scope (all scopes when omitted).
        #[command(flatten)]
        scope: ScopeArgs,
        /// Replace FILE if it exists.
        #[arg(long)]
        force: bool,
    },
    /// A chat as the `.jsonl` SillyTavern reads (byte-exact lines).
    Chat {
        /// The character.
        #[arg(value_name = "CHARACTER")]
        character: String,
        /// The chat id.
        #[arg(value_name = "CHAT")]
        chat: String,
        /// The file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Replace FILE if it exists.
        #[arg(long)]
        force: bool,
    },
}

/// `tavern card …`.
#[derive(Debug, Subcommand)]
pub enum CardCommand {
    /// Read a V1/V2/V3 card (JSON or PNG) and print what it holds; exits 1 on a broken card.
    Validate {
        /// The card file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}
