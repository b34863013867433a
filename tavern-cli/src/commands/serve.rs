//! `tavern serve`: the management API (`tavern-api`) on the data directory or database, for a
//! panel, a script or a curl. Loopback by default; any other address needs a token. No host
//! runs here, so what needs one says so: a mode switch answers `503` (switch it where the
//! session runs), replay reads DSH's session logs when `--sessions` names them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use tavern_api::routes::store::{CheckFinding, CheckReport, StoreCheck};
use tavern_core::{AgentId, HostFacts, SessionId};
use tavern_dsh_adapter::bridge::host::BridgeHost;
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_projector::HostEvent;
use tavern_runtime::{AgentMount, HostError, HostPort, LoggedEvent, TavernLogEvent};
use tavern_store::SystemClock;
use tavern_tools::assets::provider::{DirAssets, Persona};

use crate::cli::ServeArgs;
use crate::{backend, CliError, Context, Report};

/// The shortest token accepted: long enough that guessing is hopeless.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Serves until interrupted (Ctrl-C or SIGTERM); `announce` tells the user where.
///
/// # Errors
/// A non-loopback address without a token, a short or unreadable token file, an address in
/// use, store failures at open.
pub async fn run(
    ctx: &Context,
    args: &ServeArgs,
    announce: &dyn Fn(&str),
) -> Result<Report, CliError> {
    let token = match &args.token_file {
        Some(file) => Some(read_token(file)?),
        None => None,
    };
    if token.is_none() && !args.listen.ip().is_loopback() {
        return Err(CliError::Usage(format!(
            "--listen {}: not a loopback address; serving other addresses needs --token-file",
            args.listen
        )));
    }
    // Read before the store opens, so a bad file stops the start at once.
    let (ranker, said) = args.ranking.open().await?;
    let stores = backend::open(ctx, false).await?.stores();
    let host = Arc::new(ServeHost::new(args.sessions.clone()));
    let assets = Arc::new(DirAssets::new(
        ctx.assets_dir(),
        Vec::new(),
        Persona::default(),
    ));
    let runtime = Runtime::new(
        host,
        stores,
        assets,
        Arc::new(SystemClock),
        RuntimeConfig {
            ranker,
            ..RuntimeConfig::default()
        },
    );
    let api = tavern_api::Api::new(
        Arc::new(runtime),
        tavern_api::ApiConfig {
            token: token.clone(),
        },
    )
    .with_store_check(if ctx.store.is_some() {
        Arc::new(CliCheck::new(ctx))
    } else {
        // The same check the DSH bridge runs on its `--data`.
        Arc::new(tavern_api::routes::store::FileStoreCheck::new(&ctx.data))
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Failed(format!("cannot listen on {}: {e}", args.listen)))?;
    let bound: SocketAddr = listener
        .local_addr()
        .map_err(|e| CliError::Failed(format!("cannot listen on {}: {e}", args.listen)))?;
    announce(&format!(
        "serving the AgentTavern API for {} on http://{bound}/api/v1/ ({}); {said}; Ctrl-C stops",
        ctx.data_label,
        if token.is_some() {
            "bearer token required"
        } else {
            "loopback only"
        }
    ));
    axum::serve(listener, api.router())
        .with_graceful_shutdown(stopped())
        .await
        .map_err(|e| CliError::Failed(format!("serving on {bound}: {e}")))?;
    Ok(Report::new(
        format!("stopped serving on {bound}"),
        json!({ "stopped": bound.to_string() }),
    ))
}

fn read_token(file: &std::path::Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(file).map_err(|source| CliError::Io {
        op: "read",
        file: file.display().to_string(),
        source,
    })?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    if token.chars().count() < MIN_TOKEN_CHARS || token.chars().any(char::is_whitespace) {
        return Err(CliError::Usage(format!(
            "--token-file {}: the first line must be a token of at least {MIN_TOKEN_CHARS} characters without spaces",
            file.display()
        )));
    }
    Ok(token)
}

/// Resolves on Ctrl-C or SIGTERM.
async fn stopped() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

/// The host as `tavern serve` sees it: none runs here. Session logs are read from DSH's
/// folder when one is named (replay works); what needs a live host — a mode switch, which must
/// be logged by the host that runs the session — is refused with where to do it instead.
struct ServeHost {
    logs: BridgeHost,
}

impl ServeHost {
    fn new(sessions: Option<PathBuf>) -> Self {
        let logs = BridgeHost::default();
        logs.configure(Self::facts_here(), sessions);
        Self { logs }
    }

    fn facts_here() -> HostFacts {
        HostFacts::bare("tavern serve (no host attached)")
    }

    fn absent(what: &str) -> HostError {
        HostError(format!(
            "no host runs here: {what} where the session runs (the panel inside DSH)"
        ))
    }
}

#[async_trait]
impl HostPort for ServeHost {
    fn facts(&self) -> HostFacts {
        Self::facts_here()
    }

    async fn mount(&self, _agent: &AgentId, _mount: &AgentMount) -> Result<(), HostError> {
        Err(Self::absent("mount tools"))
    }

    async fn is_idle(&self, _agent: &AgentId) -> Result<bool, HostError> {
        Err(Self::absent("switch the context mode"))
    }

    async fn append_event(
        &self,
        _session: &SessionId,
        _event: &TavernLogEvent,
    ) -> Result<HostEvent, HostError> {
        Err(Self::absent("log events"))
    }

    async fn read_events(
        &self,
        session: &SessionId,
        after: Option<u64>,
    ) -> Result<Vec<LoggedEvent>, HostError> {
        self.logs.read_events(session, after).await
    }
}

/// `tavern check` of a database for the panel's store page: read-only, no progress bars, and
/// messages that name "the data directory" rather than its path (an HTTP client sees them).
struct CliCheck {
    ctx: Context,
}

impl CliCheck {
    fn new(ctx: &Context) -> Self {
        let mut ctx = ctx.clone();
        ctx.progress = false;
        ctx.data_label = "the data directory".into();
        Self { ctx }
    }
}

#[async_trait]
impl StoreCheck for CliCheck {
    async fn check(&self) -> Result<CheckReport, String> {
        let report = super::check::run_database(&self.ctx)
            .await
            .map_err(|e| e.to_string())?;
        let findings = |key: &str| -> Vec<CheckFinding> {
            report.json[key]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .map(|f| CheckFinding {
                            file: f["file"].as_str().unwrap_or("").to_owned(),
                            problem: f["problem"].as_str().unwrap_or("").to_owned(),
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(CheckReport {
            ok: report.json["ok"].as_bool().unwrap_or(false),
            problems: findings("problems"),
            warnings: findings("warnings"),
        })
    }
}
