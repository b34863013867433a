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
    }
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
    let state = api
        .runtime()
        .stores()
        .update(|s: &mut TavernState| {
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
            Ok::<_, tavern_store::StoreError>(view(s))
        })
        .await?;
    Ok(Json(state))
}
