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

/// A text to test.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoreTest {
    /// The text keys are matched in (a chat message, say), at most the tools' query length
    /// (500 characters by default; longer is `413`).
    pub text: String,
    /// Most entries (default: the tools' default result count, 5; at most their lore limit,
    /// 20).
    pub limit: Option<u64>,
}

/// Tests which lore entries a text activates in a session's books. The test is the model's own
/// `tavern_lore_search`, run for the operator: it does not spend the session's per-turn calls.
#[utoipa::path(post, path = "/api/v1/sessions/{session}/lore/test", tag = "lore",
    params(("session" = String, Path, description = "The session whose books are searched")),
    request_body = LoreTest,
    responses((status = 200, description = "`tavern_lore_search`'s result: entries with their book, reasons and text",
        body = Object), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn test(
    State(api): State<Api>,
    Path(session): Path<String>,
    Body(req): Body<LoreTest>,
) -> Result<Json<Value>, ApiError> {
    let session = session_id(&session)?;
    let max = api.runtime().config().limits.max_query_chars;
    let chars = req.text.chars().count();
    if chars > max {
        return Err(ApiError::TooLarge {
            limit: "lore test text characters".into(),
            max,
            actual: chars,
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
        .call_tool_for_operator(&agent, "panel-lore-test", "tavern_lore_search", &args)
        .await;
    match out.get("error") {
        Some(e) => Err(tool_error(e)),
        None => Ok(Json(out)),
    }
}

/// The API's answer to a tool's error object: limits are `413`, an unavailable store or host
/// `503`, a missing thing `404`, anything else the caller's mistake (`400`).
fn tool_error(e: &Value) -> ApiError {
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the lore search failed")
        .to_owned();
    let number = |key: &str| {
        e.get(key)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
    };
    match e.get("code").and_then(Value::as_str) {
        Some("limit-exceeded") => ApiError::TooLarge {
            limit: e
                .get("limit")
                .and_then(Value::as_str)
                .unwrap_or("a tool limit")
                .to_owned(),
            max: number("max").unwrap_or(0),
            actual: number("actual").unwrap_or(0),
        },
        Some("unavailable") => ApiError::HostUnavailable(message),
        Some("not-found") => ApiError::NotFound(message),
        _ => ApiError::BadRequest(message),
    }
}
