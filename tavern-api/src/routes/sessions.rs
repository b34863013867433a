//! Sessions: bindings with their architecture label, context mode (and why agent-managed is
//! unavailable), mode switches, forks, binding to an existing chat, projection status and
//! replay, and the tavern-mode prompt.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use tavern_core::capability::Availability;
use tavern_core::{
    CharacterName, ChatId, ContextMode, SessionBinding, SessionId, TavernArchitecture,
};
use tavern_store::{CheckpointStatus, ProjectorCheckpoint, PromptStore, StateViewExt};
use utoipa::{IntoParams, ToSchema};

use crate::app::{created, Api};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Body, Path, Query};
use crate::scope::session_id;

/// Most sessions a page lists.
pub const MAX_SESSIONS_PAGE: usize = 200;

/// A session's binding as a user sees it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    /// The host session id.
    pub session: String,
    /// The character.
    pub character: String,
    /// The chat id.
    pub chat: String,
    /// A group chat.
    pub group: bool,
    /// `agent-tavern` (the host's loop) or `st` (SillyTavern's pipeline).
    pub architecture: String,
    /// `dsh-native` or `agent-managed`; absent for `st` sessions.
    pub context_mode: Option<String>,
    /// Each context mode and whether this host can run it (agent-tavern sessions only).
    pub modes: Vec<ModeView>,
    /// The projection checkpoint, once anything was projected.
    pub projection: Option<ProjectionView>,
    /// What operators changed in this session (mode, fork, binding, prompt, replay), oldest
    /// first (the state keeps the newest 100 changes of all sessions and settings).
    pub changes: Vec<ChangeView>,
}

/// A change an operator made, as the state's change log keeps it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangeView {
    /// Epoch milliseconds.
    pub at: i64,
    /// What, in words.
    pub what: String,
    /// Who.
    pub source: crate::routes::memories::SourceView,
}

impl ChangeView {
    pub(crate) fn of(c: &tavern_core::StateChange) -> Self {
        Self {
            at: c.at.millis(),
            what: c.what.clone(),
            source: crate::routes::memories::SourceView::of(&c.source),
        }
    }
}

/// A context mode's availability on this host.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModeView {
    /// `dsh-native` or `agent-managed`.
    pub mode: String,
    /// Whether the host supports it.
    pub available: bool,
    /// Why not, when unavailable.
    pub reason: Option<String>,
}

/// How far a session's chat is projected.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionView {
    /// `ok` or `pending` (a gap that replay fills).
    pub status: String,
    /// The last event seq projected.
    pub cursor: Option<u64>,
    /// The first seq not projected, when pending.
    pub pending_cursor: Option<u64>,
    /// Why it is pending.
    pub pending_reason: Option<String>,
    /// Last change, epoch milliseconds.
    pub updated_at: i64,
}

impl ProjectionView {
    fn of(cp: &ProjectorCheckpoint) -> Self {
        Self {
            status: match cp.status {
                CheckpointStatus::Ok => "ok",
                CheckpointStatus::Pending => "pending",
            }
            .into(),
            cursor: cp.last_cursor,
            pending_cursor: cp.pending_cursor,
            pending_reason: cp.error.clone(),
            updated_at: cp.updated_at.millis(),
        }
    }
}

/// A page of sessions, with the host's capabilities and the defaults for new sessions.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionList {
    /// Sessions by id.
    pub sessions: Vec<SessionView>,
    /// How many sessions are bound in all.
    pub total: usize,
    /// Sessions whose projection is pending.
    pub pending_projections: usize,
    /// Architecture new sessions get.
    pub default_architecture: String,
    /// Context mode new agent-tavern sessions get.
    pub default_context_mode: String,
}

/// Paging.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Page {
    /// Most items (1–200, default 50).
    pub limit: Option<usize>,
    /// Items to skip.
    pub offset: Option<usize>,
}

/// Binds a session to a chat that already exists.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BindRequest {
    /// The character.
    pub character: String,
    /// The chat id (as SillyTavern names the file, without `.jsonl`).
    pub chat: String,
}

/// Switches a session's context mode.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModeRequest {
    /// `dsh-native` or `agent-managed`.
    pub mode: String,
}

/// Forks a session's chat into a new session.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkRequest {
    /// The new session's id.
    pub session: String,
    /// The new chat's id.
    pub chat: String,
    /// `agent-tavern` or `st`.
    pub architecture: String,
}

/// What a replay did.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayView {
    /// Lines appended to the chat.
    pub appended: usize,
    /// Lines found already present.
    pub already_present: usize,
    /// Events held back (a gap, or a step not finished).
    pub waiting: usize,
    /// The projection afterwards.
    pub projection: Option<ProjectionView>,
}

/// A session's tavern-mode prompt.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromptView {
    /// The prompt in effect (`{{char}}` and `{{user}}` as written).
    pub text: String,
    /// Whether it is the session's own (else the preset's default).
    pub custom: bool,
    /// The preset's default.
    pub default_text: String,
    /// When the custom prompt was saved, epoch milliseconds.
    pub updated_at: Option<i64>,
    /// The longest prompt accepted, in UTF-8 bytes.
    pub max_bytes: usize,
}

/// A new prompt.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PromptRequest {
    /// The text; blank resets to the default.
    pub text: String,
}

fn mode_label(m: ContextMode) -> String {
    m.as_str().to_owned()
}

async fn view(api: &Api, session: &SessionId, b: &SessionBinding) -> Result<SessionView, ApiError> {
    let target = b.target();
    let agent_tavern = b.architecture() == TavernArchitecture::AgentTavern && !target.group;
    let modes = if agent_tavern {
        let caps = api.runtime().capabilities();
        [ContextMode::DshNative, ContextMode::AgentManaged]
            .into_iter()
            .map(|m| {
                let (available, reason) = match caps.for_mode(m) {
                    Availability::Available => (true, None),
                    Availability::Unavailable { reason } => (false, Some(reason.clone())),
                };
                ModeView {
                    mode: mode_label(m),
                    available,
                    reason,
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    let projection = if agent_tavern {
        api.runtime()
            .projection(session)
            .await?
            .as_ref()
            .map(ProjectionView::of)
    } else {
        None
    };
    let changes = api
        .runtime()
        .stores()
        .read_state(|s| s.changes_of(session).map(ChangeView::of).collect())
        .await?;
    Ok(SessionView {
        changes,
        session: session.to_string(),
        character: target.character.to_string(),
        chat: target.chat_id.to_string(),
        group: target.group,
        architecture: b.architecture().as_str().to_owned(),
        context_mode: b.context_mode().map(mode_label),
        modes,
        projection,
    })
}

pub(crate) async fn bound(api: &Api, session: &SessionId) -> Result<SessionBinding, ApiError> {
    api.runtime()
        .stores()
        .binding(session)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("session {session} is not bound")))
}

/// Lists bound sessions.
#[utoipa::path(get, path = "/api/v1/sessions", tag = "sessions", params(Page),
    responses((status = 200, body = SessionList), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(api): State<Api>,
    Query(page): Query<Page>,
) -> Result<Json<SessionList>, ApiError> {
    let limit = page_limit(page.limit, 50, MAX_SESSIONS_PAGE)?;
    let offset = page.offset.unwrap_or(0);
    let (entries, total, arch, mode) = api
        .runtime()
        .stores()
        .read_state(|state| {
            let entries: Vec<(SessionId, SessionBinding)> = state
                .bindings
                .iter()
                .skip(offset)
                .take(limit)
                .map(|(s, e)| (s.clone(), e.binding.clone()))
                .collect();
            (
                entries,
                state.bindings.len(),
                state.default_architecture,
                state.default_context_mode,
            )
        })
        .await?;
    let mut sessions = Vec::with_capacity(entries.len());
    for (session, binding) in &entries {
        sessions.push(view(&api, session, binding).await?);
    }
    Ok(Json(SessionList {
        sessions,
        total,
        pending_projections: api.runtime().pending_projections().await?.len(),
        default_architecture: arch.as_str().into(),
        default_context_mode: mode.as_str().into(),
    }))
}

/// `limit` checked against its range.
pub(crate) fn page_limit(
    limit: Option<usize>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    match limit {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::BadRequest(format!(
            "limit {n}: must be from 1 to {max}"
        ))),
    }
}

/// One session.
#[utoipa::path(get, path = "/api/v1/sessions/{session}", tag = "sessions",
    params(("session" = String, Path, description = "The session id")),
    responses((status = 200, body = SessionView), (status = 404, body = ErrorBody)))]
pub async fn show(
    State(api): State<Api>,
    Path(session): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    let session = session_id(&session)?;
    let b = bound(&api, &session).await?;
    Ok(Json(view(&api, &session, &b).await?))
}

/// Binds an unbound session to a chat that exists (a SillyTavern chat continued here).
#[utoipa::path(post, path = "/api/v1/sessions/{session}/bind", tag = "sessions",
    params(("session" = String, Path, description = "The session id")), request_body = BindRequest,
    responses((status = 201, body = SessionView), (status = 404, body = ErrorBody,
        description = "no such chat (`no_such_chat`, with the nearest ids)"),
        (status = 409, body = ErrorBody, description = "the session is already bound")))]
pub async fn bind(
    State(api): State<Api>,
    Path(session): Path<String>,
    Body(req): Body<BindRequest>,
) -> Result<(axum::http::StatusCode, Json<SessionView>), ApiError> {
    let session = session_id(&session)?;
    let character =
        CharacterName::parse(req.character).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let chat = ChatId::parse(req.chat).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let b = api
        .runtime()
        .bind_existing_chat(&session, &character, &chat)
        .await?;
    api.record_change(
        Some(&session),
        format!("bound to chat {chat} of {character}"),
    )
    .await?;
    Ok(created(view(&api, &session, &b).await?))
}

/// Switches the context mode, at an idle turn boundary, to a mode the host supports.
#[utoipa::path(post, path = "/api/v1/sessions/{session}/mode", tag = "sessions",
    params(("session" = String, Path, description = "The session id")), request_body = ModeRequest,
    responses((status = 200, body = SessionView),
        (status = 404, body = ErrorBody, description = "no such session"),
        (status = 409, body = ErrorBody, description = "`mode_refused`: the rule that refused"),
        (status = 503, body = ErrorBody, description = "the host cannot be asked")))]
pub async fn switch_mode(
    State(api): State<Api>,
    Path(session): Path<String>,
    Body(req): Body<ModeRequest>,
) -> Result<Json<SessionView>, ApiError> {
    let session = session_id(&session)?;
    let mode = ContextMode::from_label(&req.mode).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "unknown mode {:?}: dsh-native or agent-managed",
            crate::scope::excerpt(&req.mode)
        ))
    })?;
    let before = bound(&api, &session).await?;
    let b = api.runtime().switch_mode(&session, mode).await?;
    if before.context_mode() != b.context_mode() {
        let label = |m: Option<ContextMode>| m.map_or("none".to_owned(), mode_label);
        api.record_change(
            Some(&session),
            format!(
                "context mode {} → {}",
                label(before.context_mode()),
                label(b.context_mode())
            ),
        )
        .await?;
    }
    Ok(Json(view(&api, &session, &b).await?))
}

/// Forks the session's chat into a new session of either architecture.
#[utoipa::path(post, path = "/api/v1/sessions/{session}/fork", tag = "sessions",
    params(("session" = String, Path, description = "The session to fork")), request_body = ForkRequest,
    responses((status = 201, body = SessionView), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the new session or chat exists")))]
pub async fn fork(
    State(api): State<Api>,
    Path(session): Path<String>,
    Body(req): Body<ForkRequest>,
) -> Result<(axum::http::StatusCode, Json<SessionView>), ApiError> {
    let origin = session_id(&session)?;
    let new_session = session_id(&req.session)?;
    let chat = ChatId::parse(req.chat).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let architecture = TavernArchitecture::from_label(&req.architecture).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "unknown architecture {:?}: agent-tavern or st",
            crate::scope::excerpt(&req.architecture)
        ))
    })?;
    let from = bound(&api, &origin).await?;
    let stores = api.runtime().stores();
    if stores.binding(&new_session).await?.is_some() {
        return Err(ApiError::Conflict {
            message: format!("session {new_session} is already bound"),
            current: None,
        });
    }
    // A fork writes a new chat; it never replaces one.
    let character = &from.target().character;
    if stores.chat_revision(character, &chat).await?.is_some() {
        return Err(ApiError::Conflict {
            message: format!("chat {chat:?} of {character} exists; name a new chat"),
            current: None,
        });
    }
    let b = api
        .runtime()
        .fork(&origin, &new_session, &chat, architecture)
        .await?;
    api.record_change(
        Some(&origin),
        format!(
            "forked into session {new_session} (chat {chat}, {})",
            architecture.as_str()
        ),
    )
    .await?;
    api.record_change(Some(&new_session), format!("forked from session {origin}"))
        .await?;
    Ok(created(view(&api, &new_session, &b).await?))
}

/// The projection checkpoint.
#[utoipa::path(get, path = "/api/v1/sessions/{session}/projection", tag = "projection",
    params(("session" = String, Path, description = "The session id")),
    responses((status = 200, body = ProjectionView),
        (status = 404, body = ErrorBody, description = "not bound, or nothing projected yet")))]
pub async fn projection(
    State(api): State<Api>,
    Path(session): Path<String>,
) -> Result<Json<ProjectionView>, ApiError> {
    let session = session_id(&session)?;
    bound(&api, &session).await?;
    let cp = api.runtime().projection(&session).await?.ok_or_else(|| {
        ApiError::NotFound(format!("nothing of session {session} is projected yet"))
    })?;
    Ok(Json(ProjectionView::of(&cp)))
}

/// Replays the host's log into the chat: fills a pending gap, appends nothing twice.
#[utoipa::path(post, path = "/api/v1/sessions/{session}/projection/replay", tag = "projection",
    params(("session" = String, Path, description = "The session id")),
    responses((status = 200, body = ReplayView), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "an st session: nothing is projected"),
        (status = 503, body = ErrorBody, description = "the host's log cannot be read")))]
pub async fn replay(
    State(api): State<Api>,
    Path(session): Path<String>,
) -> Result<Json<ReplayView>, ApiError> {
    let session = session_id(&session)?;
    bound(&api, &session).await?;
    let outcome = api
        .runtime()
        .resume(&session)
        .await?
        .ok_or_else(|| ApiError::Conflict {
            message: format!("session {session} is an st session: its chat is not projected"),
            current: None,
        })?;
    if outcome.appended > 0 {
        api.record_change(
            Some(&session),
            format!(
                "projection replayed: {} appended, {} already present",
                outcome.appended, outcome.already_present
            ),
        )
        .await?;
    }
    let projection = api
        .runtime()
        .projection(&session)
        .await?
        .as_ref()
        .map(ProjectionView::of);
    Ok(Json(ReplayView {
        appended: outcome.appended,
        already_present: outcome.already_present,
        waiting: outcome.waiting,
        projection,
    }))
}

async fn prompt_view(api: &Api, session: &SessionId) -> Result<PromptView, ApiError> {
    let default_text = api.runtime().config().tavern_mode.default_prompt.clone();
    let custom = api.runtime().stores().get_prompt(session).await?;
    Ok(PromptView {
        text: custom
            .as_ref()
            .map_or_else(|| default_text.clone(), |p| p.text.clone()),
        custom: custom.is_some(),
        default_text,
        updated_at: custom.map(|p| p.updated_at.millis()),
        max_bytes: tavern_store::prompt::PROMPT_MAX_BYTES,
    })
}

/// The session's tavern-mode prompt.
#[utoipa::path(get, path = "/api/v1/sessions/{session}/prompt", tag = "prompt",
    params(("session" = String, Path, description = "The session id")),
    responses((status = 200, body = PromptView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn prompt(
    State(api): State<Api>,
    Path(session): Path<String>,
) -> Result<Json<PromptView>, ApiError> {
    let session = session_id(&session)?;
    // Prompts belong to bound sessions: an unknown id creates no record.
    bound(&api, &session).await?;
    Ok(Json(prompt_view(&api, &session).await?))
}

/// Saves the session's prompt (blank text resets it).
#[utoipa::path(put, path = "/api/v1/sessions/{session}/prompt", tag = "prompt",
    params(("session" = String, Path, description = "The session id")), request_body = PromptRequest,
    responses((status = 200, body = PromptView), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn save_prompt(
    State(api): State<Api>,
    Path(session): Path<String>,
    Body(req): Body<PromptRequest>,
) -> Result<Json<PromptView>, ApiError> {
    let session = session_id(&session)?;
    // Prompts belong to bound sessions: an unknown id creates no record.
    bound(&api, &session).await?;
    let stores = api.runtime().stores();
    let before = stores.get_prompt(&session).await?.map(|p| p.text);
    let saved = stores.save_prompt(&session, &req.text).await?;
    // Only what changed is recorded: the same text again, or a blank one where there was
    // none, changed nothing.
    let what = match (saved, before) {
        (Some(p), before) if before.as_deref() != Some(p.text.as_str()) => {
            Some(format!("tavern-mode prompt saved ({} bytes)", p.text.len()))
        }
        (None, Some(_)) => Some("tavern-mode prompt reset to the default (blank text)".to_owned()),
        _ => None,
    };
    if let Some(what) = what {
        api.record_change(Some(&session), what).await?;
    }
    Ok(Json(prompt_view(&api, &session).await?))
}

/// Resets the session's prompt to the preset's default.
#[utoipa::path(delete, path = "/api/v1/sessions/{session}/prompt", tag = "prompt",
    params(("session" = String, Path, description = "The session id")),
    responses((status = 200, body = PromptView), (status = 404, body = ErrorBody)))]
pub async fn reset_prompt(
    State(api): State<Api>,
    Path(session): Path<String>,
) -> Result<Json<PromptView>, ApiError> {
    let session = session_id(&session)?;
    // Prompts belong to bound sessions: an unknown id creates no record.
    bound(&api, &session).await?;
    if api.runtime().stores().reset_prompt(&session).await? {
        api.record_change(
            Some(&session),
            "tavern-mode prompt reset to the default".to_owned(),
        )
        .await?;
    }
    Ok(Json(prompt_view(&api, &session).await?))
}
