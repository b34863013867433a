//! The API's state (the runtime it serves, its settings) and the router every route hangs on.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use tavern_core::{MemorySource, ScopeKey, SessionId, SourceKind};
use tavern_runtime::Runtime;

use crate::error::ApiError;
use crate::routes::{lore, memories, sessions, settings, variables};

/// The largest request body, in bytes (a whole scope of variables is 256 KiB at most).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// How the API admits callers.
#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    /// A bearer token every request must carry. Without one, only requests naming a loopback
    /// host are answered — a server on any other address must have a token.
    pub token: Option<String>,
}

/// The API over one runtime: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Api {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Arc<Runtime>,
    config: ApiConfig,
    /// The store check the serving program offers, if any.
    check: Option<crate::routes::store::StoreCheckRef>,
    /// Whether a store check is running (one at a time: it reads the whole store).
    checking: std::sync::atomic::AtomicBool,
    /// The token every panel form carries: random per process, so a page elsewhere cannot
    /// know it (it cannot read our pages).
    csrf: String,
    /// Browser sign-ins (`/panel/login`): random ids, newest last, at most
    /// [`MAX_PANEL_SESSIONS`]. The cookie carries one of these, never the token.
    sessions: std::sync::Mutex<std::collections::VecDeque<String>>,
    /// The chats the chat page read last, by revision (paging a long chat reads it once).
    pub(crate) chats: crate::routes::chat::ChatCache,
}

/// Browser sign-ins kept; the oldest is signed out when another signs in.
pub const MAX_PANEL_SESSIONS: usize = 64;

/// 32 random bytes as hex; empty without the system's randomness (then nothing matches it).
fn random_hex() -> String {
    let mut secret = [0u8; 32];
    match getrandom::fill(&mut secret) {
        Ok(()) => secret.iter().map(|b| format!("{b:02x}")).collect(),
        Err(_) => String::new(),
    }
}

/// Constant-time equality of two secrets (an empty one never matches).
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    !a.is_empty() && a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("token", &self.inner.config.token.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

impl Api {
    /// The API over `runtime`.
    pub fn new(runtime: Arc<Runtime>, config: ApiConfig) -> Self {
        // Without the system's randomness, a fixed token would be guessable: no form then
        // passes (every write through the panel is refused; the JSON API is unaffected).
        let csrf = random_hex();
        Self {
            inner: Arc::new(Inner {
                runtime,
                config,
                csrf,
                check: None,
                checking: Default::default(),
                sessions: Default::default(),
                chats: Default::default(),
            }),
        }
    }

    /// The runtime served.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// The settings.
    pub fn config(&self) -> &ApiConfig {
        &self.inner.config
    }

    /// The same API offering a store check (`GET /api/v1/store/check`, the panel's store page).
    pub fn with_store_check(self, check: crate::routes::store::StoreCheckRef) -> Self {
        let inner = Inner {
            runtime: self.inner.runtime.clone(),
            config: self.inner.config.clone(),
            csrf: self.inner.csrf.clone(),
            check: Some(check),
            checking: Default::default(),
            sessions: Default::default(),
            chats: Default::default(),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Marks a store check as running; `None` when one already is. The guard ends it.
    pub(crate) fn start_check(&self) -> Option<CheckGuard<'_>> {
        use std::sync::atomic::Ordering;
        self.inner
            .checking
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| CheckGuard(&self.inner.checking))
    }

    /// The store check, if the serving program offers one.
    pub(crate) fn store_check(&self) -> Option<&crate::routes::store::StoreCheckRef> {
        self.inner.check.as_ref()
    }

    /// The token panel forms carry (empty when the system had no randomness: then no form
    /// passes).
    pub(crate) fn csrf_token(&self) -> &str {
        &self.inner.csrf
    }

    /// Whether `offered` is the server's token (constant time); false when it has none.
    pub(crate) fn chat_cache(&self) -> &crate::routes::chat::ChatCache {
        &self.inner.chats
    }

    pub(crate) fn token_matches(&self, offered: &str) -> bool {
        self.config()
            .token
            .as_deref()
            .is_some_and(|token| same_secret(offered, token))
    }

    /// Signs a browser in: a new random session id for its cookie (`None` without the
    /// system's randomness). The oldest sign-in past [`MAX_PANEL_SESSIONS`] is dropped.
    pub(crate) fn open_panel_session(&self) -> Option<String> {
        let id = random_hex();
        if id.is_empty() {
            return None;
        }
        let mut sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sessions.len() >= MAX_PANEL_SESSIONS {
            sessions.pop_front();
        }
        sessions.push_back(id.clone());
        Some(id)
    }

    /// Whether `offered` is a signed-in browser's session id (constant time per id).
    pub(crate) fn panel_session_matches(&self, offered: &str) -> bool {
        let sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions
            .iter()
            .fold(false, |found, id| found | same_secret(offered, id))
    }

    /// Every route — `/api/v1` and the panel at `/panel` — behind the token or loopback
    /// check, with the body limit.
    pub fn router(&self) -> Router {
        let v1 = Router::new()
            .route("/sessions", get(sessions::list))
            .route("/sessions/{session}", get(sessions::show))
            .route("/sessions/{session}/bind", post(sessions::bind))
            .route("/sessions/{session}/mode", post(sessions::switch_mode))
            .route("/sessions/{session}/fork", post(sessions::fork))
            .route("/sessions/{session}/chat", get(crate::routes::chat::chat))
            .route("/sessions/{session}/projection", get(sessions::projection))
            .route(
                "/sessions/{session}/projection/replay",
                post(sessions::replay),
            )
            .route(
                "/sessions/{session}/prompt",
                get(sessions::prompt)
                    .put(sessions::save_prompt)
                    .delete(sessions::reset_prompt),
            )
            .route("/sessions/{session}/lore/test", post(lore::test))
            .route("/memories", get(memories::list).post(memories::create))
            .route("/memories/{id}", get(memories::show).put(memories::edit))
            .route("/memories/{id}/forget", post(memories::forget))
            .route("/memories/{id}/restore", post(memories::restore))
            .route("/memories/{id}/history", get(memories::history))
            .route("/variables", get(variables::list).patch(variables::patch))
            .route(
                "/variables/{name}",
                get(variables::show)
                    .put(variables::set)
                    .delete(variables::delete),
            )
            .route("/variables/{name}/history", get(variables::history))
            .route("/settings", get(settings::show).put(settings::update))
            .route("/store/check", get(crate::routes::store::check))
            .route("/openapi.json", get(crate::openapi::document))
            .fallback(not_found);
        Router::new()
            .nest("/api/v1", v1)
            .nest("/panel", crate::panel::routes())
            // `/panel` is the overview; `/panel/` too, as people type it.
            .route("/panel/", get(crate::panel::overview))
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                crate::auth::admit,
            ))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(self.clone())
    }

    /// The scopes a session sees, as its tools resolve them: its chat, its character, its
    /// agent and turn, and the global scope.
    ///
    /// # Errors
    /// [`ApiError::NotFound`] when the session is not bound.
    pub async fn session_scopes(&self, session: &SessionId) -> Result<Vec<ScopeKey>, ApiError> {
        let binding = self
            .runtime()
            .stores()
            .binding(session)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("session {session} is not bound")))?;
        let target = binding.target();
        let mut scopes = vec![
            ScopeKey::Chat {
                character: target.character.clone(),
                chat: target.chat_id.clone(),
            },
            ScopeKey::Character {
                character: target.character.clone(),
            },
        ];
        if let Ok(agent) = self.runtime().agent_of(session) {
            scopes.push(ScopeKey::Agent {
                agent: agent.clone(),
            });
            scopes.push(ScopeKey::Turn { agent });
        }
        scopes.push(ScopeKey::Global);
        Ok(scopes)
    }
}

/// The source recorded for a write made through the API: the user, and the session the
/// request named, if any.
impl Api {
    /// Records an operator's change to the settings or a session in the state's change log
    /// (after the change itself, which stands whatever happens here: a failure says so).
    pub(crate) async fn record_change(
        &self,
        session: Option<&SessionId>,
        what: String,
    ) -> Result<(), ApiError> {
        use tavern_store::StateStoreExt;
        let change = tavern_core::StateChange {
            at: self.runtime().clock().now(),
            what,
            session: session.cloned(),
            source: user_source(None),
        };
        self.runtime()
            .stores()
            .update(|s: &mut tavern_core::TavernState| {
                s.record_change(change.clone());
                Ok::<_, tavern_store::StoreError>(())
            })
            .await
            .map_err(|e| {
                ApiError::Internal(format!(
                    "the change was made, but recording it in the change log failed: {e}"
                ))
            })
    }
}

pub(crate) fn user_source(session: Option<SessionId>) -> MemorySource {
    MemorySource {
        kind: SourceKind::User,
        tool_call_id: None,
        message_id: None,
        session,
        turn: None,
    }
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("no route {}", crate::scope::excerpt(uri.path())))
}

/// `201 Created` with a JSON body.
pub(crate) fn created<T: serde::Serialize>(value: T) -> (StatusCode, axum::Json<T>) {
    (StatusCode::CREATED, axum::Json(value))
}

/// A running store check; dropping it (finished or abandoned) lets the next one start.
pub(crate) struct CheckGuard<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for CheckGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}
