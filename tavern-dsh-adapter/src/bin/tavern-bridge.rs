//! The AgentTavern sidecar for hosts in other languages.
//!
//! `tavern-bridge --data DIR [--assets DIR] [--user NAME] [--world NAME]…` speaks the
//! newline-delimited JSON protocol on stdio (see `docs/HOST_INTEGRATION.md`).
//! `tavern-bridge mcp --data DIR --session ID [--character NAME --chat ID] [--assets DIR]`
//! serves the tools over stdio MCP for one session fixed at launch (bound first if a
//! character and chat are given).
//!
//! Logs go to stderr; stdout carries only protocol frames.

use std::process::ExitCode;
use std::sync::Arc;

use tavern_core::{AgentId, CharacterName, ChatId, SessionId};
use tavern_dsh_adapter::bridge::host::BridgeHost;
use tavern_dsh_adapter::bridge::mcp::McpServer;
use tavern_dsh_adapter::bridge::Bridge;
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_store::fs::FsStore;
use tavern_store::SystemClock;
use tavern_tools::assets::provider::{AssetProvider, DirAssets, MemAssets, Persona};

struct Options {
    mcp: bool,
    data: Option<String>,
    assets: Option<String>,
    user: String,
    worlds: Vec<String>,
    session: Option<String>,
    character: Option<String>,
    chat: Option<String>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        mcp: false,
        data: None,
        assets: None,
        user: "User".into(),
        worlds: vec![],
        session: None,
        character: None,
        chat: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "mcp" => o.mcp = true,
            "--data" => o.data = Some(value()?),
            "--assets" => o.assets = Some(value()?),
            "--user" => o.user = value()?,
            "--world" => o.worlds.push(value()?),
            "--session" => o.session = Some(value()?),
            "--character" => o.character = Some(value()?),
            "--chat" => o.chat = Some(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

async fn run(o: Options) -> Result<(), String> {
    let data = o.data.ok_or("--data DIR is required")?;
    let clock = Arc::new(SystemClock);
    let store = Arc::new(FsStore::open(&data, clock.clone()).map_err(|e| e.to_string())?);
    for d in store.diagnostics() {
        eprintln!("tavern-bridge: {}: {}", d.file, d.message);
    }
    let persona = Persona {
        name: o.user.clone(),
        description: String::new(),
    };
    let assets: Arc<dyn AssetProvider> = match o.assets {
        Some(dir) => Arc::new(DirAssets::new(dir, o.worlds, persona)),
        None => Arc::new(MemAssets {
            persona,
            ..MemAssets::default()
        }),
    };
    let host = Arc::new(BridgeHost::default());
    let config = RuntimeConfig {
        user_name: o.user,
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::new(host.clone(), store, assets, clock, config);
    let (stdin, stdout) = (
        tokio::io::BufReader::new(tokio::io::stdin()),
        tokio::io::stdout(),
    );
    if o.mcp {
        let session = SessionId::parse(o.session.ok_or("mcp needs --session ID")?)
            .map_err(|e| e.to_string())?;
        if let (Some(c), Some(chat)) = (o.character, o.chat) {
            let character = CharacterName::parse(c).map_err(|e| e.to_string())?;
            let chat = ChatId::parse(chat).map_err(|e| e.to_string())?;
            let state = runtime.state().await.map_err(|e| e.to_string())?;
            if state.binding(&session).is_none() {
                runtime
                    .new_chat(&session, &character, &chat, false)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        let agent = AgentId::parse(session.as_str()).map_err(|e| e.to_string())?;
        McpServer::new(runtime, agent)
            .serve(stdin, stdout)
            .await
            .map_err(|e| e.to_string())
    } else {
        Bridge::new(runtime, host)
            .serve(stdin, stdout)
            .await
            .map_err(|e| e.to_string())
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Two workers (the machine's cores); the store moves blocking IO to the blocking pool.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_io()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tavern-bridge: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match parse(&args).and_then(|o| runtime.block_on(run(o))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tavern-bridge: {e}");
            ExitCode::FAILURE
        }
    }
}
