//! The web panel: server-rendered pages (askama templates compiled in, one stylesheet served
//! here, no script) over the API's own handlers, so a page shows and writes exactly what the
//! API does — the same scope rules, the same compare-and-set, the same audit. Every write is a
//! plain form (it works with JavaScript off) carrying the per-process CSRF token; a successful
//! write redirects (303) to the page it changed, a conflict shows both versions.

mod chat;
pub(crate) mod ctx;
pub mod i18n;
mod pages;

use axum::routing::{get, post};
use axum::Router;

use crate::app::Api;
pub(crate) use ctx::base_of;
pub use ctx::BASE_HEADER;
pub(crate) use pages::overview;

/// The panel's routes, mounted under `/panel`.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/", get(pages::overview))
        .route("/assets/panel.css", get(pages::stylesheet))
        .route("/login", get(pages::login_form).post(pages::login))
        .route("/bind", post(pages::bind))
        .route("/sessions/{session}", get(pages::session))
        .route("/sessions/{session}/chat", get(chat::page))
        .route("/sessions/{session}/mode", post(pages::switch_mode))
        .route("/sessions/{session}/fork", post(pages::fork))
        .route("/sessions/{session}/replay", post(pages::replay))
        .route("/sessions/{session}/prompt", post(pages::prompt))
        .route("/memories", get(pages::memories))
        .route("/memories/new", post(pages::create_memory))
        .route("/memories/{id}", get(pages::memory))
        .route("/memories/{id}/edit", post(pages::edit_memory))
        .route("/memories/{id}/forget", post(pages::forget_memory))
        .route("/memories/{id}/restore", post(pages::restore_memory))
        .route("/variables", get(pages::variables))
        .route("/variables/new", post(pages::new_variable))
        .route("/variables/{name}/set", post(pages::set_variable))
        .route("/variables/{name}/delete", post(pages::delete_variable))
        .route("/variables/{name}/history", get(pages::variable_history))
        .route("/lore", get(pages::lore).post(pages::test_lore))
        .route("/settings", get(pages::settings).post(pages::save_settings))
        .route("/store", get(pages::store).post(pages::check_store))
}
