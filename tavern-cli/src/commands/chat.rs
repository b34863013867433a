//! `tavern chat ls|show|status|replay`.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use tavern_core::{CharacterName, ChatId, SessionBinding, SessionId};
use tavern_dsh_adapter::bridge::host::BridgeHost;
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_store::{AllStores, CheckpointStatus, ProjectorCheckpoint, SystemClock};
use tavern_tools::assets::provider::{DirAssets, Persona};

use crate::cli::ChatCommand;
use crate::output::{excerpt, one_line, table, time};
use crate::{backend, exit, CliError, Context, Report};

fn character(name: &str) -> Result<CharacterName, CliError> {
    CharacterName::parse(name).map_err(|e| CliError::Usage(e.to_string()))
}

fn chat_id(id: &str) -> Result<ChatId, CliError> {
    ChatId::parse(id).map_err(|e| CliError::Usage(e.to_string()))
}

fn session_id(id: &str) -> Result<SessionId, CliError> {
    SessionId::parse(id).map_err(|e| CliError::Usage(e.to_string()))
}

/// Runs a chat command.
///
/// # Errors
/// Usage errors before anything is opened; a missing chat, session or session log; store or
/// projection failures.
pub async fn run(ctx: &Context, command: ChatCommand) -> Result<Report, CliError> {
    match command {
        ChatCommand::Ls { character: c } => {
            let only = c.as_deref().map(character).transpose()?;
            let backend = backend::open(ctx, false).await?;
            let characters = match only {
                Some(c) => vec![c],
                None => backend.copyable().chat_characters().await?,
            };
            ls(&*backend.stores(), &characters).await
        }
        ChatCommand::Show { character: c, chat } => {
            let (c, chat) = (character(&c)?, chat_id(&chat)?);
            let stores = backend::open(ctx, false).await?.stores();
            show(&*stores, &c, &chat).await
        }
        ChatCommand::Status { session } => {
            let session = session.as_deref().map(session_id).transpose()?;
            let stores = backend::open(ctx, false).await?.stores();
            status(&*stores, session.as_ref()).await
        }
        ChatCommand::Replay {
            session,
            sessions_root,
        } => {
            let session = session_id(&session)?;
            replay(ctx, &session, &sessions_root).await
        }
    }
}

async fn ls(stores: &dyn AllStores, characters: &[CharacterName]) -> Result<Report, CliError> {
    let mut rows = Vec::new();
    let mut items = Vec::new();
    for c in characters {
        for chat in stores.list_chats(c).await? {
            let Some(file) = stores.read_chat(c, &chat).await? else {
                continue;
            };
            let messages = file.lines.iter().filter(|l| !l.is_header()).count();
            let last = file
                .lines
                .iter()
                .rev()
                .find(|l| !l.is_header())
                .map(|l| excerpt(l.text(), 50))
                .unwrap_or_default();
            rows.push(vec![
                c.to_string(),
                chat.to_string(),
                messages.to_string(),
                last,
            ]);
            items.push(json!({
                "character": c,
                "chat": chat,
                "messages": messages,
                "lines": file.lines.len(),
                "revision": file.revision.as_str(),
            }));
        }
    }
    let text = if rows.is_empty() {
        "no chats\n".to_owned()
    } else {
        table(&["CHARACTER", "CHAT", "MESSAGES", "LAST MESSAGE"], &rows)
    };
    Ok(Report::new(text, json!({ "chats": items })))
}

async fn show(
    stores: &dyn AllStores,
    c: &CharacterName,
    chat: &ChatId,
) -> Result<Report, CliError> {
    let file = stores
        .read_chat(c, chat)
        .await?
        .ok_or_else(|| CliError::NotFound(format!("chat {chat} of {c} not found")))?;
    let mut text = format!("chat {chat} of {c} ({} lines)\n", file.lines.len());
    for (i, line) in file.lines.iter().enumerate() {
        if line.is_header() {
            let o = line.object();
            let field = |k: &str| {
                o.get(k)
                    .map(|v| one_line(&v.to_string()))
                    .unwrap_or_default()
            };
            text.push_str(&format!(
                "[header] user_name {} character_name {} create_date {}\n",
                field("user_name"),
                field("character_name"),
                field("create_date")
            ));
        } else {
            text.push_str(&format!(
                "[{i}] {}: {}\n",
                line.name()
                    .unwrap_or(if line.is_user() { "user" } else { "?" }),
                line.text()
            ));
        }
    }
    let lines: Vec<Value> = file
        .lines
        .iter()
        .map(|l| Value::Object(l.object().clone()))
        .collect();
    let json = json!({
        "character": c,
        "chat": chat,
        "revision": file.revision.as_str(),
        "lines": lines,
    });
    Ok(Report::new(text, json))
}

fn checkpoint_json(cp: Option<&ProjectorCheckpoint>) -> Value {
    cp.map_or(Value::Null, |cp| {
        serde_json::to_value(cp).unwrap_or(Value::Null)
    })
}

fn status_label(cp: Option<&ProjectorCheckpoint>) -> &'static str {
    match cp.map(|c| c.status) {
        None => "none",
        Some(CheckpointStatus::Ok) => "ok",
        Some(CheckpointStatus::Pending) => "pending",
    }
}

fn binding_label(b: &SessionBinding) -> String {
    match b.context_mode() {
        Some(mode) => format!("{}/{}", b.architecture().as_str(), mode.as_str()),
        None => b.architecture().as_str().to_owned(),
    }
}

async fn status(stores: &dyn AllStores, only: Option<&SessionId>) -> Result<Report, CliError> {
    let state = stores.load_state().await?.0;
    let mut sessions: Vec<(SessionId, Option<SessionBinding>)> = match only {
        Some(s) => vec![(s.clone(), state.binding(s).cloned())],
        None => state
            .bindings
            .iter()
            .map(|(s, e)| (s.clone(), Some(e.binding.clone())))
            .collect(),
    };
    if only.is_none() {
        // Pending projections of sessions no longer bound are shown too.
        for cp in stores.pending_checkpoints().await? {
            if !sessions.iter().any(|(s, _)| s == &cp.session_id) {
                sessions.push((cp.session_id.clone(), None));
            }
        }
    }
    let mut rows = Vec::new();
    let mut items = Vec::new();
    let mut found_any = false;
    for (session, binding) in &sessions {
        let cp = stores.load_checkpoint(session).await?;
        found_any |= binding.is_some() || cp.is_some();
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        rows.push(vec![
            session.to_string(),
            binding
                .as_ref()
                .map_or_else(|| "-".to_owned(), |b| b.target().character.to_string()),
            binding
                .as_ref()
                .map_or_else(|| "-".to_owned(), |b| b.target().chat_id.to_string()),
            binding
                .as_ref()
                .map_or_else(|| "unbound".to_owned(), binding_label),
            status_label(cp.as_ref()).to_owned(),
            opt(cp.as_ref().and_then(|c| c.last_cursor)),
            opt(cp.as_ref().and_then(|c| c.pending_cursor)),
            cp.as_ref().map_or_else(String::new, |c| {
                let mut s = time(c.updated_at);
                if let Some(e) = &c.error {
                    s.push_str(&format!(" {}", excerpt(e, 80)));
                }
                s
            }),
        ]);
        items.push(json!({
            "session": session,
            "character": binding.as_ref().map(|b| b.target().character.to_string()),
            "chat": binding.as_ref().map(|b| b.target().chat_id.to_string()),
            "group": binding.as_ref().map(|b| b.target().group),
            "architecture": binding.as_ref().map(|b| b.architecture().as_str()),
            "contextMode": binding.as_ref().and_then(|b| b.context_mode()).map(|m| m.as_str()),
            "status": status_label(cp.as_ref()),
            "checkpoint": checkpoint_json(cp.as_ref()),
        }));
    }
    if let Some(s) = only {
        if !found_any {
            return Err(CliError::NotFound(format!(
                "session {s} has no binding and no projector checkpoint"
            )));
        }
    }
    let text = if rows.is_empty() {
        "no sessions\n".to_owned()
    } else {
        table(
            &[
                "SESSION",
                "CHARACTER",
                "CHAT",
                "BINDING",
                "STATUS",
                "CURSOR",
                "PENDING",
                "UPDATED / ERROR",
            ],
            &rows,
        )
    };
    Ok(Report::new(text, json!({ "sessions": items })))
}

/// The host's log of `session`: `<root>/<any>/<session>/session.jsonl[.zstd]`.
fn session_log_exists(root: &Path, session: &SessionId) -> bool {
    tavern_dsh_adapter::dsh::session_log::find(root, session.as_str()).is_some()
}

async fn replay(ctx: &Context, session: &SessionId, root: &Path) -> Result<Report, CliError> {
    let label = root.display().to_string();
    if !root.is_dir() {
        return Err(CliError::NotFound(format!("{label}: no such directory")));
    }
    if !session_log_exists(root, session) {
        return Err(CliError::NotFound(format!(
            "no session log of {session} under {label} (looked for {label}/*/{session}/session.jsonl and session.jsonl.zstd)"
        )));
    }
    let stores = backend::open(ctx, false).await?.stores();
    match stores.binding(session).await? {
        None => {
            return Err(CliError::NotFound(format!(
                "session {session} is not bound to a chat in this store"
            )))
        }
        Some(b) if b.context_mode().is_none() || b.target().group => {
            return Err(CliError::Failed(format!(
                "session {session} is an st session: AgentTavern does not project its chat"
            )))
        }
        Some(_) => {}
    }
    let host = Arc::new(BridgeHost::default());
    host.configure(
        tavern_dsh_adapter::dsh::rc6_facts(),
        Some(root.to_path_buf()),
    );
    let assets = Arc::new(DirAssets::new(
        ctx.assets_dir(),
        Vec::new(),
        Persona::default(),
    ));
    let runtime = Runtime::new(
        host,
        stores.clone(),
        assets,
        Arc::new(SystemClock),
        RuntimeConfig::default(),
    );
    let outcome = runtime.resume(session).await?.ok_or_else(|| {
        CliError::Failed(format!("session {session} is not an agent-tavern session"))
    })?;
    let cp = stores.load_checkpoint(session).await?;
    let mut text =
        format!(
        "session {session}: {} lines appended, {} already present, cursor {}, {} events waiting\n",
        outcome.appended,
        outcome.already_present,
        outcome.cursor.map_or_else(|| "-".to_owned(), |c| c.to_string()),
        outcome.waiting,
    );
    let pending = cp
        .as_ref()
        .filter(|c| c.status == CheckpointStatus::Pending);
    if let Some(p) = pending {
        text.push_str(&format!(
            "still pending at event {}: {}\n",
            p.pending_cursor
                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
            p.error.as_deref().unwrap_or("unknown error")
        ));
    }
    let json = json!({
        "session": session,
        "appended": outcome.appended,
        "alreadyPresent": outcome.already_present,
        "cursor": outcome.cursor,
        "waiting": outcome.waiting,
        "status": status_label(cp.as_ref()),
        "checkpoint": checkpoint_json(cp.as_ref()),
    });
    let mut report = Report::new(text, json);
    if pending.is_some() {
        report.exit = exit::FAILURE;
    }
    Ok(report)
}
