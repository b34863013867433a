//! The OpenAPI 3.1 document, generated from the handlers' types (`utoipa`): served at
//! `/api/v1/openapi.json` and checked in as `docs/openapi.json`, which a test keeps equal.

use axum::Json;
use utoipa::OpenApi;

use crate::routes::{lore, memories, sessions, settings, store, variables};

/// The document's source: every route and schema.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "AgentTavern management API",
        description = "See, correct and steer a roleplay: sessions, projection, memories, variables, lore and the tavern-mode prompt. Every write to a memory or variable names the revision it read; a stale one is `409` with the current revision (settings, prompts and modes are last-write-wins). Errors are `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "MIT OR Apache-2.0")
    ),
    paths(
        sessions::list, sessions::show, sessions::bind, sessions::switch_mode, sessions::fork,
        sessions::projection, sessions::replay, sessions::prompt, sessions::save_prompt,
        sessions::reset_prompt, lore::test,
        memories::list, memories::create, memories::show, memories::edit, memories::forget,
        memories::restore, memories::history,
        variables::list, variables::show, variables::set, variables::delete, variables::patch,
        variables::history,
        settings::show, settings::update, store::check,
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "sessions", description = "Bindings, architecture, context mode, fork, bind"),
        (name = "projection", description = "How far each chat is projected; replay"),
        (name = "prompt", description = "The tavern-mode prompt per session"),
        (name = "lore", description = "Which lore a text activates"),
        (name = "memories", description = "Memories and their history"),
        (name = "variables", description = "Typed variables and their history"),
        (name = "settings", description = "Defaults and write policy"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
        };
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        doc.security = Some(vec![SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

/// The document as pretty JSON (what `docs/openapi.json` holds).
pub fn pretty() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// `GET /api/v1/openapi.json`.
pub(crate) async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
