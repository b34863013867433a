//! Variables: a scope's listing, one typed value, set, delete and atomic patches — each
//! compare-and-set on the revision, audited as the user's — and a variable's history.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tavern_core::{Revision, VariableName, VariableRecord};
use tavern_store::{VariableChange, VariableStore};
use utoipa::{IntoParams, ToSchema};

use crate::app::{user_source, Api};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Body, Path, Query};
use crate::routes::memories::{revision, AuditView};
use crate::routes::sessions::page_limit;
use crate::scope::{session_id, ScopeQuery, ScopeRef};

/// Most variables a listing holds.
pub const MAX_VARIABLES_PAGE: usize = 500;

/// A scope's variables.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariableList {
    /// The scope.
    pub scope: ScopeRef,
    /// The scope's revision (changes with every write in it); absent if never written.
    pub scope_revision: Option<String>,
    /// By name.
    pub items: Vec<VariableSummaryView>,
    /// How many matched.
    pub total: usize,
    /// Whether `limit` cut the listing.
    pub truncated: bool,
}

/// A variable in a listing.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariableSummaryView {
    /// The name.
    pub name: String,
    /// JSON type: `string`, `number`, `boolean`, `array`, `object`, `null`.
    pub kind: String,
    /// Up to 80 characters of the compact JSON.
    pub preview: String,
    /// Size of the compact JSON.
    pub bytes: usize,
    /// Its revision.
    pub revision: String,
}

/// One variable.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariableView {
    /// The scope.
    pub scope: ScopeRef,
    /// The name.
    pub name: String,
    /// The typed value.
    pub value: Value,
    /// Its revision.
    pub revision: String,
    /// Epoch milliseconds.
    pub updated_at: i64,
}

impl VariableView {
    fn of(r: &VariableRecord) -> Self {
        Self {
            scope: ScopeRef::of(&r.scope),
            name: r.name.to_string(),
            value: r.value.clone(),
            revision: r.revision.as_str().into(),
            updated_at: r.updated_at.millis(),
        }
    }
}

/// Listing filters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct VariableFilter {
    /// Only names starting with this.
    pub prefix: Option<String>,
    /// Most items (1–500, default 200).
    pub limit: Option<usize>,
}

/// A new value.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetVariable {
    /// The typed JSON value.
    pub value: Value,
    /// The current revision; absent creates (a conflict if it exists).
    pub revision: Option<String>,
}

/// The revision a delete acts on.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// The variable's current revision.
    pub revision: String,
}

/// Changes applied together or not at all.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchRequest {
    /// In order.
    pub changes: Vec<PatchChange>,
    /// When given, the scope's revision must still be this.
    pub scope_revision: Option<String>,
}

/// One change of a patch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "op", rename_all = "camelCase", deny_unknown_fields)]
pub enum PatchChange {
    /// Sets a value.
    #[serde(rename = "set")]
    Set {
        /// The name.
        name: String,
        /// The value.
        value: Value,
        /// Its current revision; absent creates.
        revision: Option<String>,
    },
    /// Deletes a variable.
    #[serde(rename = "delete")]
    Delete {
        /// The name.
        name: String,
        /// Its current revision.
        revision: String,
    },
}

/// What a patch wrote.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PatchView {
    /// The scope's revision after it.
    pub scope_revision: String,
    /// The records written (a deleted variable shows `null`), in change order.
    pub records: Vec<VariableView>,
}

/// A variable's audited history.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariableHistory {
    /// The name.
    pub name: String,
    /// Oldest first: the newest [`crate::routes::memories::MAX_HISTORY`] changes.
    pub entries: Vec<AuditView>,
    /// How many changes there are in all.
    pub total: usize,
}

fn name(text: &str) -> Result<VariableName, ApiError> {
    VariableName::parse(text).map_err(|e| ApiError::BadRequest(e.to_string()))
}

fn session_of(q: &ScopeQuery) -> Result<Option<tavern_core::SessionId>, ApiError> {
    q.session.as_deref().map(session_id).transpose()
}

/// A scope's variables by name.
#[utoipa::path(get, path = "/api/v1/variables", tag = "variables", params(ScopeQuery, VariableFilter),
    responses((status = 200, body = VariableList), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(api): State<Api>,
    Query(q): Query<ScopeQuery>,
    Query(f): Query<VariableFilter>,
) -> Result<Json<VariableList>, ApiError> {
    let key = q.one(&api).await?;
    let limit = page_limit(f.limit, 200, MAX_VARIABLES_PAGE)?;
    let listing = api
        .runtime()
        .stores()
        .list(&key, f.prefix.as_deref().unwrap_or(""), limit)
        .await?;
    Ok(Json(VariableList {
        scope: ScopeRef::of(&key),
        scope_revision: listing.scope_revision.map(|r| r.as_str().to_owned()),
        items: listing
            .items
            .into_iter()
            .map(|i| VariableSummaryView {
                name: i.name.to_string(),
                kind: i.kind.into(),
                preview: i.preview,
                bytes: i.bytes,
                revision: i.revision.as_str().into(),
            })
            .collect(),
        total: listing.total,
        truncated: listing.truncated,
    }))
}

/// One variable.
#[utoipa::path(get, path = "/api/v1/variables/{name}", tag = "variables",
    params(("name" = String, Path, description = "The variable"), ScopeQuery),
    responses((status = 200, body = VariableView), (status = 404, body = ErrorBody)))]
pub async fn show(
    State(api): State<Api>,
    Path(n): Path<String>,
    Query(q): Query<ScopeQuery>,
) -> Result<Json<VariableView>, ApiError> {
    let key = q.one(&api).await?;
    let n = name(&n)?;
    let rec = api
        .runtime()
        .stores()
        .get(&key, &n)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("variable {n} not found in scope {key}")))?;
    Ok(Json(VariableView::of(&rec)))
}

/// Sets a variable: creates it without a revision, else replaces the revision named.
#[utoipa::path(put, path = "/api/v1/variables/{name}", tag = "variables",
    params(("name" = String, Path, description = "The variable"), ScopeQuery), request_body = SetVariable,
    responses((status = 200, body = VariableView), (status = 201, body = VariableView),
        (status = 404, body = ErrorBody, description = "a scope the named session does not see"),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn set(
    State(api): State<Api>,
    Path(n): Path<String>,
    Query(q): Query<ScopeQuery>,
    Body(req): Body<SetVariable>,
) -> Result<(StatusCode, Json<VariableView>), ApiError> {
    let key = q.one(&api).await?;
    let n = name(&n)?;
    let expected = req.revision.as_deref().map(revision).transpose()?;
    let rec = api
        .runtime()
        .stores()
        .set(
            &key,
            &n,
            req.value,
            expected.as_ref(),
            user_source(session_of(&q)?),
        )
        .await?;
    let status = if expected.is_none() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(VariableView::of(&rec))))
}

/// Deletes a variable at its revision (an audited tombstone stays).
#[utoipa::path(delete, path = "/api/v1/variables/{name}", tag = "variables",
    params(("name" = String, Path, description = "The variable"), ScopeQuery, DeleteQuery),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete(
    State(api): State<Api>,
    Path(n): Path<String>,
    Query(q): Query<ScopeQuery>,
    Query(d): Query<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    let key = q.one(&api).await?;
    let n = name(&n)?;
    let expected: Revision = revision(&d.revision)?;
    api.runtime()
        .stores()
        .delete(&key, &n, &expected, user_source(session_of(&q)?))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Applies several changes to one scope atomically.
#[utoipa::path(patch, path = "/api/v1/variables", tag = "variables", params(ScopeQuery),
    request_body = PatchRequest,
    responses((status = 200, body = PatchView),
        (status = 404, body = ErrorBody, description = "a scope the named session does not see"),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn patch(
    State(api): State<Api>,
    Query(q): Query<ScopeQuery>,
    Body(req): Body<PatchRequest>,
) -> Result<Json<PatchView>, ApiError> {
    let key = q.one(&api).await?;
    let mut changes = Vec::with_capacity(req.changes.len());
    for c in req.changes {
        changes.push(match c {
            PatchChange::Set {
                name: n,
                value,
                revision: r,
            } => VariableChange::Set {
                name: name(&n)?,
                value,
                expected: r.as_deref().map(revision).transpose()?,
            },
            PatchChange::Delete {
                name: n,
                revision: r,
            } => VariableChange::Delete {
                name: name(&n)?,
                expected: revision(&r)?,
            },
        });
    }
    let scope_rev = req.scope_revision.as_deref().map(revision).transpose()?;
    let out = api
        .runtime()
        .stores()
        .patch(
            &key,
            &changes,
            scope_rev.as_ref(),
            user_source(session_of(&q)?),
        )
        .await?;
    Ok(Json(PatchView {
        scope_revision: out.scope_revision.as_str().into(),
        records: out.records.iter().map(VariableView::of).collect(),
    }))
}

/// A variable's audited history (it may be deleted now).
#[utoipa::path(get, path = "/api/v1/variables/{name}/history", tag = "variables",
    params(("name" = String, Path, description = "The variable"), ScopeQuery),
    responses((status = 200, body = VariableHistory), (status = 404, body = ErrorBody)))]
pub async fn history(
    State(api): State<Api>,
    Path(n): Path<String>,
    Query(q): Query<ScopeQuery>,
) -> Result<Json<VariableHistory>, ApiError> {
    let key = q.one(&api).await?;
    let n = name(&n)?;
    let entries: Vec<AuditView> = api
        .runtime()
        .stores()
        .variable_audit(&key)
        .await?
        .iter()
        .filter(|e| e.target == n.as_str())
        .map(AuditView::of)
        .collect();
    if entries.is_empty() {
        return Err(ApiError::NotFound(format!(
            "variable {n} was never written in scope {key}"
        )));
    }
    let (entries, total) = crate::routes::memories::newest(entries);
    Ok(Json(VariableHistory {
        name: n.to_string(),
        entries,
        total,
    }))
}
