//! Memories: a page or a search, one record in any state, its history, and the user's own
//! writes — create, edit, forget, restore — each compare-and-set on the revision and audited
//! as the user's.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use tavern_core::{
    AuditEntry, MemoryId, MemoryKind, MemoryRecord, MemorySource, MemoryWrite, Revision, ScopeKey,
    SessionId, Tag, Timestamp,
};
use tavern_store::{MemoryQuery, MemorySearchExt};
use utoipa::{IntoParams, ToSchema};

use crate::app::{created, user_source, Api};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Body, Path, Query};
use crate::routes::sessions::page_limit;
use crate::scope::{excerpt, session_id, ScopeQuery, ScopeRef};

/// Most memories a page holds (the store's most per search).
pub const MAX_MEMORIES_PAGE: usize = 100;
/// The longest search text, in characters (the tools' limit).
pub const MAX_QUERY_CHARS: usize = 500;
/// The deepest offset a listing pages to (deeper pages would order every match).
pub const MAX_OFFSET: usize = 10_000;

/// A memory as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryView {
    /// The id, unique in its scope.
    pub id: String,
    /// Where it lives.
    pub scope: ScopeRef,
    /// `semantic` (a lasting fact) or `episodic` (something that happened).
    pub kind: String,
    /// The text.
    pub content: String,
    /// Tags.
    pub tags: Vec<String>,
    /// 0 to 1.
    pub importance: f64,
    /// 0 to 1.
    pub confidence: f64,
    /// `live`, `forgotten` or `expired`.
    pub state: String,
    /// Who wrote this version.
    pub source: SourceView,
    /// Epoch milliseconds.
    pub created_at: i64,
    /// Epoch milliseconds.
    pub updated_at: i64,
    /// Epoch milliseconds.
    pub expires_at: Option<i64>,
    /// Epoch milliseconds.
    pub deleted_at: Option<i64>,
    /// The revision every write must name.
    pub revision: String,
}

/// Who wrote something.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceView {
    /// `tool` (the model), `user`, `import` or `system`.
    pub kind: String,
    /// The host session.
    pub session: Option<String>,
    /// The turn in that session.
    pub turn: Option<u64>,
    /// The tool call, for the model's writes.
    pub tool_call_id: Option<String>,
    /// The chat message the write is about.
    pub message_id: Option<String>,
}

impl SourceView {
    /// What a request naming `session` may see of who wrote something: another session's
    /// ids (its session, turn, tool call, message) are left out, as a shared scope's record
    /// may come from another chat.
    pub(crate) fn seen_by(mut self, session: Option<&str>) -> Self {
        if let Some(viewer) = session {
            if self.session.as_deref() != Some(viewer) {
                self.session = None;
                self.turn = None;
                self.tool_call_id = None;
                self.message_id = None;
            }
        }
        self
    }

    pub(crate) fn of(s: &MemorySource) -> Self {
        Self {
            kind: serde_json::to_value(s.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            session: s.session.as_ref().map(ToString::to_string),
            turn: s.turn,
            tool_call_id: s.tool_call_id.clone(),
            message_id: s.message_id.clone(),
        }
    }
}

impl MemoryView {
    fn seen_by(mut self, session: Option<&str>) -> Self {
        self.source = self.source.seen_by(session);
        self
    }

    fn of(r: &MemoryRecord, now: Timestamp) -> Self {
        let state = if r.deleted_at.is_some() {
            "forgotten"
        } else if r.is_expired(now) {
            "expired"
        } else {
            "live"
        };
        Self {
            id: r.id.to_string(),
            scope: ScopeRef::of(&r.scope),
            kind: r.kind.as_str().into(),
            content: r.content.clone(),
            tags: r.tags.iter().map(ToString::to_string).collect(),
            importance: r.importance,
            confidence: r.confidence,
            state: state.into(),
            source: SourceView::of(&r.source),
            created_at: r.created_at.millis(),
            updated_at: r.updated_at.millis(),
            expires_at: r.expires_at.map(Timestamp::millis),
            deleted_at: r.deleted_at.map(Timestamp::millis),
            revision: r.revision.as_str().into(),
        }
    }
}

/// A page of memories.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryPage {
    /// Best first for a search, newest first for a listing.
    pub items: Vec<MemoryHitView>,
    /// How many matched in all.
    pub total: usize,
    /// The offset of the first item.
    pub offset: usize,
    /// The page size asked for.
    pub limit: usize,
}

/// One memory of a page.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryHitView {
    /// The memory.
    pub memory: MemoryView,
    /// Relevance blended with importance, confidence and recency (and lifted when the query
    /// names the time the memory was written). Never rises from one hit to the next, page
    /// after page.
    pub score: f64,
    /// Relevance before that blend (0 for a listing): BM25's, or, when the server ranks with
    /// word vectors, the ranker's (BM25's past the first 1,000 matches).
    pub relevance: f64,
}

/// Filters of a listing or search.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MemoryFilter {
    /// Search text; empty lists by recency.
    pub q: Option<String>,
    /// `semantic` or `episodic`.
    pub kind: Option<String>,
    /// Only memories with this tag.
    pub tag: Option<String>,
    /// Include forgotten memories.
    pub forgotten: Option<bool>,
    /// Include expired memories.
    pub expired: Option<bool>,
    /// Most items (1–100, default 20).
    pub limit: Option<usize>,
    /// Items to skip.
    pub offset: Option<usize>,
}

/// A new memory.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateMemory {
    /// Where it lives.
    pub scope: ScopeRef,
    /// Its id, unique in the scope.
    pub id: String,
    /// `semantic` (default) or `episodic`.
    pub kind: Option<String>,
    /// The text.
    pub content: String,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// 0 to 1 (default 0.5).
    pub importance: Option<f64>,
    /// 0 to 1 (default 1: the user says so).
    pub confidence: Option<f64>,
    /// Expiry, epoch milliseconds.
    pub expires_at: Option<i64>,
}

/// An edit: what is absent stays as it is.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EditMemory {
    /// The revision edited (from the last read).
    pub revision: String,
    /// New text.
    pub content: Option<String>,
    /// New kind.
    pub kind: Option<String>,
    /// New tags.
    pub tags: Option<Vec<String>>,
    /// New importance.
    pub importance: Option<f64>,
    /// New confidence.
    pub confidence: Option<f64>,
}

/// The revision a forget or restore acts on.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevisionRequest {
    /// The revision (from the last read).
    pub revision: String,
}

/// A memory and every change to it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryHistory {
    /// The memory now.
    pub memory: MemoryView,
    /// Oldest first: the newest [`MAX_HISTORY`] changes.
    pub entries: Vec<AuditView>,
    /// How many changes there are in all (more than `entries` when older ones were left out).
    pub total: usize,
}

/// Most history entries an answer holds (the newest are kept).
pub const MAX_HISTORY: usize = 1000;

/// The newest [`MAX_HISTORY`] of `entries` (oldest first), and how many there were.
pub(crate) fn newest(entries: Vec<AuditView>) -> (Vec<AuditView>, usize) {
    let total = entries.len();
    let skip = total.saturating_sub(MAX_HISTORY);
    (entries.into_iter().skip(skip).collect(), total)
}

/// One audited change.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditView {
    /// Epoch milliseconds.
    pub at: i64,
    /// `created`, `updated`, `restored`, `forgotten`, `expired`, `set`, `deleted`.
    pub action: String,
    /// The revision after it.
    pub revision: Option<String>,
    /// Who.
    pub source: SourceView,
    /// A memory's text as of this version, when this version set it (the first, or another
    /// text than the one before) and the store still keeps it (the current text and those of
    /// the last 8 content changes); absent for variables, older versions and versions that
    /// kept the text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// This version kept the text of the one before (an importance change, a forget, a
    /// restore).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub same_text: bool,
}

impl AuditView {
    pub(crate) fn of(e: &AuditEntry) -> Self {
        Self {
            at: e.at.millis(),
            action: serde_json::to_value(e.action)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            revision: e.revision.as_ref().map(|r| r.as_str().to_owned()),
            source: SourceView::of(&e.source),
            content: e.content.clone(),
            same_text: e.same_text,
        }
    }
}

fn bad(e: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

fn kind(label: &str) -> Result<MemoryKind, ApiError> {
    match label {
        "semantic" => Ok(MemoryKind::Semantic),
        "episodic" => Ok(MemoryKind::Episodic),
        other => Err(bad(format!(
            "unknown kind {:?}: semantic or episodic",
            excerpt(other)
        ))),
    }
}

fn tags(list: &[String]) -> Result<Vec<Tag>, ApiError> {
    list.iter()
        .map(|t| Tag::parse(t.as_str()).map_err(bad))
        .collect()
}

pub(crate) fn revision(text: &str) -> Result<Revision, ApiError> {
    Revision::parse(text).map_err(bad)
}

fn memory_id(text: &str) -> Result<MemoryId, ApiError> {
    MemoryId::parse(text).map_err(bad)
}

fn session_of(q: &ScopeQuery) -> Result<Option<SessionId>, ApiError> {
    q.session.as_deref().map(session_id).transpose()
}

/// Lists or searches memories, by scope or across every scope, paged.
#[utoipa::path(get, path = "/api/v1/memories", tag = "memories", params(ScopeQuery, MemoryFilter),
    responses((status = 200, body = MemoryPage), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "a scope the named session does not see")))]
pub async fn list(
    State(api): State<Api>,
    Query(scope): Query<ScopeQuery>,
    Query(filter): Query<MemoryFilter>,
) -> Result<Json<MemoryPage>, ApiError> {
    let scopes = scope.resolve(&api).await?;
    let limit = page_limit(filter.limit, 20, MAX_MEMORIES_PAGE)?;
    let offset = filter.offset.unwrap_or(0);
    if offset > MAX_OFFSET {
        return Err(ApiError::BadRequest(format!(
            "offset {offset}: at most {MAX_OFFSET}; narrow the search instead"
        )));
    }
    if let Some(q) = &filter.q {
        let chars = q.chars().count();
        if chars > MAX_QUERY_CHARS {
            return Err(ApiError::TooLarge {
                limit: "search text characters".into(),
                max: MAX_QUERY_CHARS,
                actual: chars,
            });
        }
    }
    let mut query = MemoryQuery::new(filter.q.clone().unwrap_or_default(), scopes);
    query.kinds = filter
        .kind
        .as_deref()
        .map(kind)
        .transpose()?
        .into_iter()
        .collect();
    query.tags = filter
        .tag
        .as_deref()
        .map(|t| tags(&[t.to_owned()]))
        .transpose()?
        .unwrap_or_default();
    query.include_deleted = filter.forgotten.unwrap_or(false);
    query.include_expired = filter.expired.unwrap_or(false);
    query.limit = limit;
    query.offset = offset;
    query.ranker = api.runtime().config().ranker.clone();
    let found = api.runtime().stores().search_prepared(&query).await?;
    let now = api.runtime().clock().now();
    Ok(Json(MemoryPage {
        items: found
            .hits
            .iter()
            .map(|h| MemoryHitView {
                memory: MemoryView::of(&h.record, now).seen_by(scope.session.as_deref()),
                score: h.score,
                relevance: h.relevance,
            })
            .collect(),
        total: found.source_count,
        offset,
        limit,
    }))
}

/// Creates a memory (the id must be new in its scope).
#[utoipa::path(post, path = "/api/v1/memories", tag = "memories", request_body = CreateMemory,
    params(("session" = Option<String>, Query, description = "Only a scope this session sees")),
    responses((status = 201, body = MemoryView), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "a scope the named session does not see"),
        (status = 409, body = ErrorBody, description = "the id exists in the scope (`current` names its revision)"),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody)))]
pub async fn create(
    State(api): State<Api>,
    Query(sq): Query<SessionOnly>,
    Body(req): Body<CreateMemory>,
) -> Result<(StatusCode, Json<MemoryView>), ApiError> {
    let key = req.scope.key()?;
    let session = sq.session.as_deref().map(session_id).transpose()?;
    if let Some(s) = &session {
        check_visible(&api, s, &key).await?;
    }
    let write = MemoryWrite {
        id: memory_id(&req.id)?,
        scope: key,
        kind: req
            .kind
            .as_deref()
            .map(kind)
            .transpose()?
            .unwrap_or(MemoryKind::Semantic),
        content: req.content,
        tags: tags(&req.tags)?,
        importance: req.importance.unwrap_or(0.5),
        confidence: req.confidence.unwrap_or(1.0),
        source: user_source(session),
        expires_at: req.expires_at.map(Timestamp),
    };
    let rec = api.runtime().stores().put(write, None, false).await?;
    Ok(created(MemoryView::of(&rec, api.runtime().clock().now())))
}

/// Only a session filter.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SessionOnly {
    /// Only what this session sees.
    pub session: Option<String>,
}

async fn check_visible(api: &Api, session: &SessionId, key: &ScopeKey) -> Result<(), ApiError> {
    if api.session_scopes(session).await?.contains(key) {
        Ok(())
    } else {
        Err(ApiError::NotFound(format!(
            "scope {} is not one session {session} sees",
            excerpt(&key.to_string())
        )))
    }
}

async fn find(api: &Api, q: &ScopeQuery, id: &str) -> Result<MemoryRecord, ApiError> {
    let key = q.one(api).await?;
    let id = memory_id(id)?;
    api.runtime()
        .stores()
        .inspect(&id, &key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("memory {id} not found in scope {key}")))
}

/// One memory, live, forgotten or expired.
#[utoipa::path(get, path = "/api/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "The memory id"), ScopeQuery),
    responses((status = 200, body = MemoryView), (status = 404, body = ErrorBody)))]
pub async fn show(
    State(api): State<Api>,
    Path(id): Path<String>,
    Query(q): Query<ScopeQuery>,
) -> Result<Json<MemoryView>, ApiError> {
    let rec = find(&api, &q, &id).await?;
    Ok(Json(
        MemoryView::of(&rec, api.runtime().clock().now()).seen_by(q.session.as_deref()),
    ))
}

/// Edits a live memory at the revision last read.
#[utoipa::path(put, path = "/api/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "The memory id"), ScopeQuery), request_body = EditMemory,
    responses((status = 200, body = MemoryView), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "changed since (`current`), or forgotten (`forgotten`)")))]
pub async fn edit(
    State(api): State<Api>,
    Path(id): Path<String>,
    Query(q): Query<ScopeQuery>,
    Body(req): Body<EditMemory>,
) -> Result<Json<MemoryView>, ApiError> {
    let expected = revision(&req.revision)?;
    let rec = find(&api, &q, &id).await?;
    let write = MemoryWrite {
        id: rec.id.clone(),
        scope: rec.scope.clone(),
        kind: req
            .kind
            .as_deref()
            .map(kind)
            .transpose()?
            .unwrap_or(rec.kind),
        content: req.content.unwrap_or(rec.content),
        tags: match &req.tags {
            Some(t) => tags(t)?,
            None => rec.tags,
        },
        importance: req.importance.unwrap_or(rec.importance),
        confidence: req.confidence.unwrap_or(rec.confidence),
        source: user_source(session_of(&q)?),
        expires_at: rec.expires_at,
    };
    let after = api
        .runtime()
        .stores()
        .put(write, Some(&expected), false)
        .await?;
    Ok(Json(MemoryView::of(&after, api.runtime().clock().now())))
}

/// Forgets a memory (nothing is deleted: restore brings it back).
#[utoipa::path(post, path = "/api/v1/memories/{id}/forget", tag = "memories",
    params(("id" = String, Path, description = "The memory id"), ScopeQuery), request_body = RevisionRequest,
    responses((status = 200, body = MemoryView), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "changed since, or already forgotten")))]
pub async fn forget(
    State(api): State<Api>,
    Path(id): Path<String>,
    Query(q): Query<ScopeQuery>,
    Body(req): Body<RevisionRequest>,
) -> Result<Json<MemoryView>, ApiError> {
    let expected = revision(&req.revision)?;
    let rec = find(&api, &q, &id).await?;
    if rec.deleted_at.is_some() {
        return Err(ApiError::Forgotten(format!(
            "memory {} is already forgotten (revision {})",
            rec.id, rec.revision
        )));
    }
    let after = api
        .runtime()
        .stores()
        .forget(&rec.id, &rec.scope, &expected, user_source(session_of(&q)?))
        .await
        .map_err(|e| match e {
            // The store says "not found" for a record that turned forgotten meanwhile.
            tavern_store::StoreError::NotFound { .. } => ApiError::Conflict {
                message: format!("memory {} changed since revision {expected}", rec.id),
                current: None,
            },
            other => other.into(),
        })?;
    Ok(Json(MemoryView::of(&after, api.runtime().clock().now())))
}

/// Restores a forgotten memory, as it was, at its forgotten revision.
#[utoipa::path(post, path = "/api/v1/memories/{id}/restore", tag = "memories",
    params(("id" = String, Path, description = "The memory id"), ScopeQuery), request_body = RevisionRequest,
    responses((status = 200, body = MemoryView), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "changed since, or not forgotten")))]
pub async fn restore(
    State(api): State<Api>,
    Path(id): Path<String>,
    Query(q): Query<ScopeQuery>,
    Body(req): Body<RevisionRequest>,
) -> Result<Json<MemoryView>, ApiError> {
    let expected = revision(&req.revision)?;
    let rec = find(&api, &q, &id).await?;
    if rec.deleted_at.is_none() {
        return Err(ApiError::Conflict {
            message: format!("memory {} is not forgotten", rec.id),
            current: Some(rec.revision.as_str().into()),
        });
    }
    let write = MemoryWrite {
        id: rec.id.clone(),
        scope: rec.scope.clone(),
        kind: rec.kind,
        content: rec.content.clone(),
        tags: rec.tags.clone(),
        importance: rec.importance,
        confidence: rec.confidence,
        source: user_source(session_of(&q)?),
        expires_at: rec.expires_at,
    };
    let after = api
        .runtime()
        .stores()
        .put(write, Some(&expected), true)
        .await?;
    Ok(Json(MemoryView::of(&after, api.runtime().clock().now())))
}

/// A memory's audited history, oldest first.
#[utoipa::path(get, path = "/api/v1/memories/{id}/history", tag = "memories",
    params(("id" = String, Path, description = "The memory id"), ScopeQuery),
    responses((status = 200, body = MemoryHistory), (status = 404, body = ErrorBody)))]
pub async fn history(
    State(api): State<Api>,
    Path(id): Path<String>,
    Query(q): Query<ScopeQuery>,
) -> Result<Json<MemoryHistory>, ApiError> {
    let rec = find(&api, &q, &id).await?;
    let entries = api
        .runtime()
        .stores()
        .memory_audit(&rec.scope, Some(&rec.id))
        .await?;
    let viewer = q.session.as_deref();
    let (entries, total) = newest(
        entries
            .iter()
            .map(|e| {
                let mut v = AuditView::of(e);
                v.source = v.source.seen_by(viewer);
                v
            })
            .collect(),
    );
    Ok(Json(MemoryHistory {
        memory: MemoryView::of(&rec, api.runtime().clock().now()).seen_by(viewer),
        entries,
        total,
    }))
}
