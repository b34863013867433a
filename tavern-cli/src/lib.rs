//! The `tavern` command as a library, so the binary and the tests share it: command-line
//! definitions ([`cli`]), the commands ([`commands`]) over a store [`backend`], and the output
//! layer ([`output`], [`progress`]) — the only code that prints.
//!
//! Commands work on the store ports (`Arc<dyn AllStores>`) plus a few operations only the file
//! store has ([`backend::Backend`]), so another store backend can be plugged in later. They
//! return a [`Report`] (text and JSON); `main` decides how to show it.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod backend;
pub mod cli;
pub mod commands;
pub mod error;
pub mod output;
pub mod progress;
pub mod scope;

use std::path::PathBuf;

use serde_json::Value;

pub use error::{exit, CliError};

/// What every command runs with.
#[derive(Debug, Clone)]
pub struct Context {
    /// The data directory: the store's root, with `assets/` inside.
    pub data: PathBuf,
    /// How messages name the data directory (as the user gave it).
    pub data_label: String,
    /// Whether progress bars are drawn (stderr is a terminal).
    pub progress: bool,
    /// The PostgreSQL store named by `--store` (then the data directory holds only `assets/`).
    pub store: Option<backend::StoreSettings>,
    /// The stores the command opened, to warn after it of what they found meanwhile.
    pub opened: backend::Opened,
}

impl Context {
    /// The folder cards and world books are imported into (`<data>/assets`), the folder to
    /// give `tavern-bridge --assets`.
    pub fn assets_dir(&self) -> PathBuf {
        self.data.join("assets")
    }
}

/// What a command produced: text for people, JSON for scripts, warnings for stderr, and the
/// exit code (0 unless the command found a problem it reports rather than fails on).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Human-readable output (stdout).
    pub text: String,
    /// The `--json` document (stdout).
    pub json: Value,
    /// Warnings (stderr, one line each).
    pub warnings: Vec<String>,
    /// Exit code.
    pub exit: u8,
}

impl Report {
    /// A successful report.
    pub fn new(text: impl Into<String>, json: Value) -> Self {
        Self {
            text: text.into(),
            json,
            warnings: Vec::new(),
            exit: exit::OK,
        }
    }
}

/// Runs one command.
///
/// # Errors
/// The command's [`CliError`]; nothing was changed by a command that failed on its input.
pub async fn run(command: cli::Command, ctx: &Context) -> Result<Report, CliError> {
    let result = run_command(command, ctx).await;
    ctx.opened.warn_of_the_rest();
    result
}

async fn run_command(command: cli::Command, ctx: &Context) -> Result<Report, CliError> {
    use cli::Command;
    match command {
        Command::ImportSt(args) => commands::import::run(ctx, &args).await,
        Command::Memory(c) => commands::memory::run(ctx, c).await,
        Command::Var(c) => commands::var::run(ctx, c).await,
        Command::Chat(c) => commands::chat::run(ctx, c).await,
        Command::Export(c) => commands::export::run(ctx, c).await,
        Command::Card(cli::CardCommand::Validate { file }) => commands::card::validate(&file),
        Command::Check if ctx.store.is_some() => commands::check::run_database(ctx).await,
        Command::Check => commands::check::run(ctx),
        Command::Compact => commands::check::compact(ctx).await,
        Command::Copy(args) => commands::copy::run(ctx, &args).await,
        Command::Serve(args) => commands::serve::run(ctx, &args, &output::announce).await,
    }
}
