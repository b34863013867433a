//! CPU-bound tool work (lore key matching) kept off the async executor's threads: it runs on
//! this module's own threads, one per core the process may use, so however many players search
//! hostile lore at the same time, at most that many searches run at once and the executor stays
//! free for every other call, event and `status`. Each search is itself bounded in time
//! (`LoreOptions::max_match_time`), so a search waiting for a thread waits a bounded time too.
//!
//! Why not tokio's blocking pool: a search allocates its working set and frees it; spread over
//! up to 16 blocking threads, each with its own allocator arena, freed memory stayed resident
//! per thread (16 searches at once in a 100,000-entry world grew the process by 0.7–0.9 GiB,
//! where one arena held 4 MiB more). A few long-lived threads keep as few arenas.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::error::ToolError;

type Job = Box<dyn FnOnce() + Send>;

/// The process-wide queue of the CPU threads, started on first use; `None` if no thread could
/// be started.
fn queue() -> Option<&'static Sender<Job>> {
    static QUEUE: OnceLock<Option<Sender<Job>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let n = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
            let (tx, rx) = channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            let started = (0..n)
                .filter(|i| {
                    let rx = rx.clone();
                    std::thread::Builder::new()
                        .name(format!("tavern-cpu-{i}"))
                        .spawn(move || work_loop(&rx))
                        .is_ok()
                })
                .count();
            (started > 0).then_some(tx)
        })
        .as_ref()
}

/// One CPU thread: runs jobs in turn until the queue is gone.
fn work_loop(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

/// Runs `work` on a CPU thread once one is free; inline when no tokio runtime runs this call.
/// Work whose caller gave up (a cancelled call) before a thread took it is skipped; once
/// started it runs to its own bound.
pub(crate) async fn run_bounded<R, F>(work: F) -> Result<R, ToolError>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(work());
    }
    let failed = |reason: &str| ToolError::Unavailable {
        reason: reason.to_owned(),
    };
    let queue = queue().ok_or_else(|| failed("no thread could be started for the search"))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        if tx.is_closed() {
            return;
        }
        let _ = tx.send(catch_unwind(AssertUnwindSafe(work)));
    });
    queue
        .send(job)
        .map_err(|_| failed("the search threads are gone"))?;
    match rx.await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(_)) => Err(failed("a search failed unexpectedly")),
        Err(_) => Err(failed("the search was dropped")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At most one search per thread at once, and a search that panics fails only its call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn searches_run_on_the_cpu_threads_and_a_panic_fails_only_its_call() {
        let n = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let calls: Vec<_> = (0..4 * n)
            .map(|_| {
                let (running, most) = (running.clone(), most.clone());
                tokio::spawn(run_bounded(move || {
                    use std::sync::atomic::Ordering::SeqCst;
                    let now = running.fetch_add(1, SeqCst) + 1;
                    most.fetch_max(now, SeqCst);
                    // Some work, so that searches overlap if they could.
                    let mut x = 0u64;
                    for i in 0..200_000u64 {
                        x = x.wrapping_mul(31).wrapping_add(i);
                    }
                    running.fetch_sub(1, SeqCst);
                    (std::thread::current().name().map(str::to_owned), x)
                }))
            })
            .collect();
        for c in calls {
            let (name, _) = c.await.unwrap().unwrap();
            assert!(name.unwrap_or_default().starts_with("tavern-cpu-"));
        }
        assert!(most.load(std::sync::atomic::Ordering::SeqCst) <= n);
        let e = run_bounded(|| -> u8 { panic!("boom") }).await.unwrap_err();
        assert!(e.to_string().contains("failed unexpectedly"), "{e}");
        assert_eq!(run_bounded(|| 7).await.unwrap(), 7, "the threads live on");
    }
}
