//! `tavern`: the command-line tool over AgentTavern's store. Parses the command line, sets up
//! logging (`RUST_LOG`, stderr) and the data directory, runs the command and exits with its
//! code; everything else lives in the library.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tavern_cli::cli::Cli;
use tavern_cli::{exit, output, Context};

/// Where the store is when `--data` is not given: `TAVERN_DATA`; else the store the DSH plugin
/// writes (`$DSH_HOME/agent-tavern`, DSH's home being `~/.dsh` by default) when there is one
/// and the per-user data directory holds none; else the per-user data directory. Two stores
/// and no `--data` is a question only the user can answer.
fn default_data() -> Result<(std::path::PathBuf, String), tavern_cli::CliError> {
    use std::path::PathBuf;
    if let Some(dir) = std::env::var_os("TAVERN_DATA").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        let label = dir.display().to_string();
        return Ok((dir, label));
    }
    let holds_store = |d: &std::path::Path| {
        ["memory.log", "variables.log", "state.json"]
            .iter()
            .any(|f| d.join(f).is_file())
    };
    let dsh_home = std::env::var_os("DSH_HOME")
        .filter(|h| !h.to_string_lossy().trim().is_empty())
        .map(PathBuf::from)
        .or_else(|| directories::BaseDirs::new().map(|b| b.home_dir().join(".dsh")));
    let dsh = dsh_home.map(|h| h.join("agent-tavern"));
    let own =
        directories::ProjectDirs::from("", "", "agent-tavern").map(|d| d.data_dir().to_path_buf());
    match (dsh, own) {
        (Some(dsh), Some(own)) if holds_store(&dsh) && holds_store(&own) => {
            Err(tavern_cli::CliError::Usage(format!(
                "two stores: the DSH plugin's ({}) and the per-user one ({}); pass --data DIR to say which",
                dsh.display(),
                own.display()
            )))
        }
        (Some(dsh), _) if holds_store(&dsh) => {
            let label = format!("the DSH plugin's store ({})", dsh.display());
            Ok((dsh, label))
        }
        (_, Some(own)) => Ok((own, "the per-user data directory".to_owned())),
        (Some(dsh), None) => {
            let label = format!("the DSH plugin's store ({})", dsh.display());
            Ok((dsh, label))
        }
        (None, None) => Err(tavern_cli::CliError::Usage(
            "no per-user data directory is known here; pass --data DIR".into(),
        )),
    }
}

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
        None => match default_data() {
            Ok(found) => found,
            Err(err) => return ExitCode::from(output::print_error(&err)),
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
                image_dir: cli.store_image_dir.clone(),
                max_loaded_memories: cli.store_max_loaded_memories,
            }),
        opened: Default::default(),
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
