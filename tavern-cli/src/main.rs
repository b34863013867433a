//! `tavern`: the command-line tool over AgentTavern's store. Parses the command line, sets up
//! logging (`RUST_LOG`, stderr) and the data directory, runs the command and exits with its
//! code; everything else lives in the library.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tavern_cli::cli::Cli;
use tavern_cli::{exit, output, Context};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(output::print_clap_error(&e)),
    };
    let stderr_tty = std::io::stderr().is_terminal();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(stderr_tty)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let (data, data_label) = match &cli.data {
        Some(dir) => (dir.clone(), dir.display().to_string()),
        None => match directories::ProjectDirs::from("", "", "agent-tavern") {
            Some(dirs) => (
                dirs.data_dir().to_path_buf(),
                "the per-user data directory".to_owned(),
            ),
            None => {
                let err = tavern_cli::CliError::Usage(
                    "no per-user data directory is known here; pass --data DIR".into(),
                );
                return ExitCode::from(output::print_error(&err));
            }
        },
    };
    let ctx = Context {
        data,
        data_label,
        progress: stderr_tty,
        // An empty TAVERN_STORE (common in env files) means no database.
        store: cli
            .store
            .clone()
            .filter(|s| !s.trim().is_empty())
            .map(|settings| tavern_cli::backend::StoreSettings {
                settings,
                password_file: cli.store_password_file.clone(),
                ca_file: cli.store_ca_file.clone(),
            }),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let err = tavern_cli::CliError::Failed(format!("cannot start the async runtime: {e}"));
            return ExitCode::from(output::print_error(&err));
        }
    };
    let code = match runtime.block_on(tavern_cli::run(cli.command, &ctx)) {
        Ok(report) => output::print_report(&report, cli.json),
        Err(e) => output::print_error(&e),
    };
    debug_assert!(code <= exit::CORRUPT);
    ExitCode::from(code)
}
