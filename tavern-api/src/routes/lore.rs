//! The lore tester: which entries a text activates for a session, why, and from which book —
//! answered by the same `tavern_lore_search` the model calls, so what the panel shows is what
//! the model gets.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use crate::app::Api;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Body, Path};
use crate::scope::session_id;

/// Longest text tested, in UTF-8 bytes.
pub const MAX_LORE_TEXT_BYTES: usize = 16 * 1024;

/// A text to test.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoreTest {
    /// The text keys are matched in (a chat message, say).
    pub text: String,
    /// Most entries (default 10).
    pub limit: Option<u64>,
}

/// Tests which lore entries a text activates in a session's books.
#[utoipa::path(post, path = "/api/v1/sessions/{session}/lore/test", tag = "lore",
    params(("session" = String, Path, description = "The session whose books are searched")),
    request_body = LoreTest,
    responses((status = 200, description = "`tavern_lore_search`'s result: entries with their book, reasons and text",
        body = Object), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn test(
    State(api): State<Api>,
    Path(session): Path<String>,
    Body(req): Body<LoreTest>,
) -> Result<Json<Value>, ApiError> {
    let session = session_id(&session)?;
    if req.text.len() > MAX_LORE_TEXT_BYTES {
        return Err(ApiError::TooLarge {
            limit: "lore test text bytes".into(),
            max: MAX_LORE_TEXT_BYTES,
            actual: req.text.len(),
        });
    }
    api.session_scopes(&session).await?;
    let agent = api.runtime().agent_of(&session)?;
    let mut args = json!({ "query": req.text });
    if let Some(limit) = req.limit {
        args["limit"] = json!(limit);
    }
    let out = api
        .runtime()
        .call_tool(&agent, "panel-lore-test", "tavern_lore_search", &args)
        .await;
    match out.get("error") {
        Some(e) => Err(ApiError::BadRequest(
            e.get("message")
                .and_then(Value::as_str)
                .unwrap_or("the lore search failed")
                .to_owned(),
        )),
        None => Ok(Json(out)),
    }
}
