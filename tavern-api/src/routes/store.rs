//! The store check: what the program serving the API can verify of its store (`tavern serve`
//! runs `tavern check`'s read-only check), shown to the user who wants to know their data is
//! whole. A server without one says so.

use std::sync::Arc;

use async_trait::async_trait;
use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::app::Api;
use crate::error::{ApiError, ErrorBody};

/// One finding of a check: a file (relative to the store, never absolute) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CheckFinding {
    /// The file, relative to the store root (with a line where it applies), or a table.
    pub file: String,
    /// What is wrong, in words.
    pub problem: String,
}

/// A finished check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CheckReport {
    /// Nothing is corrupt or set aside.
    pub ok: bool,
    /// Corrupt or set-aside data.
    pub problems: Vec<CheckFinding>,
    /// What is odd but not damage.
    pub warnings: Vec<CheckFinding>,
}

/// A read-only check of the store, as the serving program can run it.
#[async_trait]
pub trait StoreCheck: Send + Sync {
    /// Checks the store without changing it.
    ///
    /// # Errors
    /// Why the check could not run (in words, no absolute path).
    async fn check(&self) -> Result<CheckReport, String>;
}

/// A shared check.
pub type StoreCheckRef = Arc<dyn StoreCheck>;

/// Runs the store check.
#[utoipa::path(get, path = "/api/v1/store/check", tag = "settings",
    responses((status = 200, body = CheckReport),
        (status = 404, body = ErrorBody, description = "this server has no store check"),
        (status = 503, body = ErrorBody, description = "a check is already running"),
        (status = 500, body = ErrorBody, description = "the check could not run")))]
pub async fn check(State(api): State<Api>) -> Result<Json<CheckReport>, ApiError> {
    let Some(check) = api.store_check() else {
        return Err(ApiError::NotFound(
            "this server has no store check; run `tavern check` where the store lives".into(),
        ));
    };
    let Some(_running) = api.start_check() else {
        return Err(ApiError::Busy(
            "a store check is already running; its result comes first".into(),
        ));
    };
    check.check().await.map(Json).map_err(ApiError::Internal)
}

impl From<tavern_store::fs::CheckReport> for CheckReport {
    fn from(found: tavern_store::fs::CheckReport) -> Self {
        let findings = |items: Vec<tavern_store::fs::CheckFinding>| {
            items
                .into_iter()
                .map(|f| CheckFinding {
                    file: f.file,
                    problem: f.problem,
                })
                .collect()
        };
        Self {
            ok: found.problems.is_empty(),
            problems: findings(found.problems),
            warnings: findings(found.warnings),
        }
    }
}

/// The check of a file store (`tavern_store::fs::check_files` on its root, read-only, off the
/// executor): what `tavern serve --data DIR` and the DSH bridge with `--data DIR` run.
#[derive(Debug, Clone)]
pub struct FileStoreCheck {
    root: std::path::PathBuf,
}

impl FileStoreCheck {
    /// A check of the file store rooted at `root`.
    pub fn new(root: impl Into<std::path::PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

#[async_trait]
impl StoreCheck for FileStoreCheck {
    async fn check(&self) -> Result<CheckReport, String> {
        if !self.root.is_dir() {
            // No absolute path: an HTTP client reads this.
            return Err("the store's data directory does not exist".into());
        }
        let root = self.root.clone();
        let found = tavern_store::blocking::maybe_spawn_blocking(move || {
            Ok(tavern_store::fs::check_files(&root, |_, _| {}))
        })
        .await
        .map_err(|e| format!("the check stopped: {e}"))?;
        Ok(found.into())
    }
}
