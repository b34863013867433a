//! The OpenAPI 3.1 document, generated from the handlers' types (`utoipa`): served at
//! `/api/v1/openapi.json` and checked in as `docs/openapi.json`, which a test keeps equal.

use axum::Json;
use utoipa::OpenApi;

use crate::routes::{chat, lore, memories, sessions, settings, store, variables};

/// The document's source: every route and schema.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "AgentTavern management API",
        description = "See, correct and steer a roleplay: sessions, projection, memories, variables, lore and the tavern-mode prompt. Every write to a memory or variable names the revision it read; a stale one is `409` with the current revision (settings, prompts and modes are last-write-wins, each change recorded with its source in the session's or the settings' `changes`). Errors are `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "MIT OR Apache-2.0")
    ),
    paths(
        sessions::list, sessions::show, sessions::bind, sessions::switch_mode, sessions::fork,
        sessions::projection, sessions::replay, sessions::prompt, sessions::save_prompt,
        sessions::reset_prompt, chat::chat, lore::test,
        memories::list, memories::create, memories::show, memories::edit, memories::forget,
        memories::restore, memories::history,
        variables::list, variables::show, variables::set, variables::delete, variables::patch,
        variables::history,
        settings::show, settings::update, store::check,
    ),
    modifiers(&BearerAuth, &CommonResponses, &UniqueOperationIds),
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

/// The answers every route can give besides its own: a malformed id, scope or query (400),
/// the token check (401), a cross-site request or a non-loopback `Host` without a token (403),
/// a failed store (500); and for writes, a body over the limit (413) or not JSON (415). Added
/// where a route does not describe them itself, so the document lists every status a client
/// can meet.
struct CommonResponses;

impl utoipa::Modify for CommonResponses {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
        // (status, shared response's name, description)
        const ALL: [(&str, &str, &str); 4] = [
            ("400", "BadRequest", "A malformed id, scope, query or body (`bad_request`)"),
            ("401", "Unauthorized", "No valid bearer token, on a server with one (`unauthorized`)"),
            (
                "403",
                "Forbidden",
                "A cross-site request (`cross_site`), or a non-loopback `Host` on a server without a token (`forbidden_host`)",
            ),
            ("500", "Internal", "The store failed; nothing was half-written (`internal`)"),
        ];
        const WRITES: [(&str, &str, &str); 2] = [
            (
                "413",
                "TooLarge",
                "The body is over 1 MiB, or a named limit is exceeded (`too_large`)",
            ),
            (
                "415",
                "UnsupportedMediaType",
                "The body is not `application/json` (`unsupported_media_type`)",
            ),
        ];
        let components = doc.components.get_or_insert_with(Default::default);
        for (_, name, description) in ALL.iter().chain(&WRITES) {
            let response = ResponseBuilder::new()
                .description(*description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build();
            components
                .responses
                .insert((*name).to_owned(), RefOr::T(response));
        }
        for item in doc.paths.paths.values_mut() {
            let reads = [&mut item.get].into_iter().flatten();
            let writes = [
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ]
            .into_iter()
            .flatten();
            for (op, write) in reads
                .map(|op| (op, false))
                .chain(writes.map(|op| (op, true)))
            {
                let extra = if write { &WRITES[..] } else { &[] };
                for (code, name, _) in ALL.iter().chain(extra) {
                    op.responses
                        .responses
                        .entry((*code).to_owned())
                        .or_insert_with(|| {
                            RefOr::Ref(Ref::new(format!("#/components/responses/{name}")))
                        });
                }
            }
        }
    }
}

/// Operation ids are the handlers' names by default, and several resources have a `list`, a
/// `show`, a `history`: OpenAPI wants them unique (generated clients name methods by them), so
/// each is prefixed with its tag (`memories_list`, `variables_list`).
struct UniqueOperationIds;

impl utoipa::Modify for UniqueOperationIds {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for item in doc.paths.paths.values_mut() {
            let ops = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for op in ops.into_iter().flatten() {
                if let (Some(tag), Some(id)) =
                    (op.tags.as_ref().and_then(|t| t.first()), &op.operation_id)
                {
                    op.operation_id = Some(format!("{tag}_{id}"));
                }
            }
        }
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
