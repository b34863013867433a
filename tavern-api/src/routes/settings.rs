//! Settings: the defaults new sessions get and the write policy the tools enforce.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use tavern_core::{ContextMode, TavernArchitecture, TavernState};
use tavern_store::{StateStoreExt, StateViewExt};
use utoipa::ToSchema;

use crate::app::Api;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Body;
use crate::scope::excerpt;

/// The settings.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SettingsView {
    /// `agent-tavern` or `st`, for new sessions.
    pub default_architecture: String,
    /// `dsh-native` or `agent-managed`, for new agent-tavern sessions.
    pub default_context_mode: String,
    /// Whether the model may write the global scope at all.
    pub allow_global_writes: bool,
    /// Whether `memory_forget` needs the user's confirmation.
    pub require_forget_confirmation: bool,
    /// Whether writes other characters can see need the user's confirmation.
    pub require_cross_character_confirmation: bool,
    /// What operators changed in the settings, oldest first (of the state's newest 100
    /// changes).
    pub changes: Vec<crate::routes::sessions::ChangeView>,
}

/// Settings to change; what is absent stays.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SettingsUpdate {
    /// `agent-tavern` or `st`.
    pub default_architecture: Option<String>,
    /// `dsh-native` or `agent-managed`.
    pub default_context_mode: Option<String>,
    /// Allow global writes.
    pub allow_global_writes: Option<bool>,
    /// Require forget confirmation.
    pub require_forget_confirmation: Option<bool>,
    /// Require cross-character confirmation.
    pub require_cross_character_confirmation: Option<bool>,
}

fn view(s: &TavernState) -> SettingsView {
    SettingsView {
        default_architecture: s.default_architecture.as_str().into(),
        default_context_mode: s.default_context_mode.as_str().into(),
        allow_global_writes: s.allow_global_writes,
        require_forget_confirmation: s.require_forget_confirmation,
        require_cross_character_confirmation: s.require_cross_character_confirmation,
        changes: s
            .changes
            .iter()
            .filter(|c| c.session.is_none())
            .map(crate::routes::sessions::ChangeView::of)
            .collect(),
    }
}

/// What an update changed, in words (`default context mode dsh-native → agent-managed`).
fn described(before: &TavernState, after: &TavernState) -> Vec<String> {
    let mut out = Vec::new();
    let mut note = |name: &str, a: String, b: String| {
        if a != b {
            out.push(format!("{name} {a} → {b}"));
        }
    };
    note(
        "default architecture",
        before.default_architecture.as_str().into(),
        after.default_architecture.as_str().into(),
    );
    note(
        "default context mode",
        before.default_context_mode.as_str().into(),
        after.default_context_mode.as_str().into(),
    );
    note(
        "allow global writes",
        before.allow_global_writes.to_string(),
        after.allow_global_writes.to_string(),
    );
    note(
        "require forget confirmation",
        before.require_forget_confirmation.to_string(),
        after.require_forget_confirmation.to_string(),
    );
    note(
        "require cross-character confirmation",
        before.require_cross_character_confirmation.to_string(),
        after.require_cross_character_confirmation.to_string(),
    );
    out
}

/// The settings.
#[utoipa::path(get, path = "/api/v1/settings", tag = "settings",
    responses((status = 200, body = SettingsView), (status = 500, body = ErrorBody)))]
pub async fn show(State(api): State<Api>) -> Result<Json<SettingsView>, ApiError> {
    Ok(Json(api.runtime().stores().read_state(view).await?))
}

/// Changes settings (for sessions bound from now on; bound sessions keep theirs).
#[utoipa::path(put, path = "/api/v1/settings", tag = "settings", request_body = SettingsUpdate,
    responses((status = 200, body = SettingsView), (status = 400, body = ErrorBody)))]
pub async fn update(
    State(api): State<Api>,
    Body(req): Body<SettingsUpdate>,
) -> Result<Json<SettingsView>, ApiError> {
    let arch = req
        .default_architecture
        .as_deref()
        .map(|l| {
            TavernArchitecture::from_label(l).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "unknown architecture {:?}: agent-tavern or st",
                    excerpt(l)
                ))
            })
        })
        .transpose()?;
    let mode = req
        .default_context_mode
        .as_deref()
        .map(|l| {
            ContextMode::from_label(l).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "unknown mode {:?}: dsh-native or agent-managed",
                    excerpt(l)
                ))
            })
        })
        .transpose()?;
    let now = api.runtime().clock().now();
    let state = api
        .runtime()
        .stores()
        .update(|s: &mut TavernState| {
            let before = s.clone();
            if let Some(a) = arch {
                s.default_architecture = a;
            }
            if let Some(m) = mode {
                s.default_context_mode = m;
            }
            if let Some(v) = req.allow_global_writes {
                s.allow_global_writes = v;
            }
            if let Some(v) = req.require_forget_confirmation {
                s.require_forget_confirmation = v;
            }
            if let Some(v) = req.require_cross_character_confirmation {
                s.require_cross_character_confirmation = v;
            }
            // Recorded in the same write as the change itself.
            let what = described(&before, s);
            if !what.is_empty() {
                s.record_change(tavern_core::StateChange {
                    at: now,
                    what: what.join("; "),
                    session: None,
                    source: crate::app::user_source(None),
                });
            }
            Ok::<_, tavern_store::StoreError>(view(s))
        })
        .await?;
    Ok(Json(state))
}
