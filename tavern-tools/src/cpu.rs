//! CPU-bound tool work (lore key matching) kept off the async executor's threads: it runs on
//! tokio's blocking pool, at most [`slots`] searches at once, so however many players search
//! hostile lore at the same time, the executor stays free for every other call, event and
//! `status`. Each search is itself bounded in time (`LoreOptions::max_match_time`), so a
//! search waiting for a slot waits a bounded time too.

use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

use crate::error::ToolError;

/// The process-wide slots: one per core the process may use (at least one).
fn slots() -> Arc<Semaphore> {
    static SLOTS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SLOTS
        .get_or_init(|| {
            let n = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
            Arc::new(Semaphore::new(n))
        })
        .clone()
}

/// Runs `work` on the blocking pool once a slot is free; inline when no tokio runtime runs
/// this call. The slot is held by the work itself, so a caller that gives up (a cancelled
/// call) does not let more searches run at once than there are slots.
pub(crate) async fn run_bounded<R, F>(work: F) -> Result<R, ToolError>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(work());
    }
    let slot = slots()
        .acquire_owned()
        .await
        .map_err(|_| ToolError::Unavailable {
            reason: "the search slots are closed".to_owned(),
        })?;
    tokio::task::spawn_blocking(move || {
        let out = work();
        drop(slot);
        out
    })
    .await
    .map_err(|e| ToolError::Unavailable {
        reason: format!("a search failed: {e}"),
    })
}
