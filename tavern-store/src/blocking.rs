//! The async model of the stores (see `docs/ARCHITECTURE.md`): ports are async; an adapter
//! whose work blocks (file locks, fsync) runs it through [`maybe_spawn_blocking`] so it never
//! stalls an executor thread; a test adapter yields through [`yield_once`] so callers that
//! assume "ready on first poll" are caught.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::StoreError;

/// Runs blocking `f` without stalling an executor: inside a multi-thread tokio runtime on the
/// calling worker after handing its other tasks to the rest of the pool (`block_in_place`:
/// no thread hand-off, so a fast read costs no extra wake-ups); inside a current-thread
/// runtime on tokio's blocking pool; with no runtime, inline. A panic in `f` becomes
/// [`StoreError::Internal`] on the blocking pool (and unwinds as any panic elsewhere); the
/// work is never cancelled half way, so an acknowledged write is never half done.
///
/// # Errors
/// Whatever `f` returns, or [`StoreError::Internal`] when it panicked.
pub async fn maybe_spawn_blocking<F, T>(f: F) -> Result<T, StoreError>
where
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    off_executor(f)
        .await
        .map_err(|e| StoreError::Internal(format!("a blocking store task failed: {e}")))?
}

/// Runs blocking `f` without stalling an executor, as [`maybe_spawn_blocking`] does, for any
/// result type (asset files, host logs).
///
/// # Errors
/// The reason when `f` panicked on the blocking pool.
pub async fn off_executor<F, T>(f: F) -> Result<T, String>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if multi_thread(&runtime) => Ok(tokio::task::block_in_place(f)),
        Ok(runtime) => runtime.spawn_blocking(f).await.map_err(|e| e.to_string()),
        Err(_) => Ok(f()),
    }
}

fn multi_thread(runtime: &tokio::runtime::Handle) -> bool {
    runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
}

/// Runs `work` — seconds of computation on borrowed state, so it cannot move to another
/// thread — in place, handing the worker's other tasks over meanwhile on a multi-thread
/// runtime (a current-thread runtime has no other worker: inline, as with no runtime).
#[cfg(feature = "postgres")]
pub(crate) fn off_the_worker<R>(work: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if multi_thread(&runtime) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// A future that is pending on its first poll (waking itself) and ready on the second, on any
/// executor.
#[derive(Debug, Default)]
#[must_use = "futures do nothing unless awaited"]
pub struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// Yields to the executor once.
pub fn yield_once() -> YieldOnce {
    YieldOnce(false)
}
