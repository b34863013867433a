//! Serving the bridge over a byte stream: frames are read with a size cap (an oversized line
//! is answered and skipped without being held), decoded, and routed — frames of one session go
//! through that session's queue in order, sessions run concurrently, frames about no session
//! (handshake, status, cancel, the route, shutdown) are served as they are read. One writer
//! task owns the output, so response lines never interleave.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use tavern_runtime::line::{read_line, Line};

use super::frame::{self, Frame, Request};
use super::{error, lock, Bridge};

/// Frames read but not yet answered, across all sessions, before the reader waits: memory is
/// bounded (with the frame size cap), yet one busy session does not stall the others until
/// this many frames are queued.
const FRAMES_IN_FLIGHT: usize = 4096;

/// Answers queued for the writer before workers wait for the host to read them.
const OUTPUT_QUEUE: usize = 1024;

/// Where a frame is served.
enum Route {
    /// As it is read (no session, or it must overtake the session's queue: cancel).
    Inline,
    /// In the queue of this session.
    Session(String),
}

impl Bridge {
    fn route(&self, request: &Request) -> Route {
        let agent_session = |agent: &tavern_core::AgentId| {
            self.runtime
                .session_of(agent)
                .map_or_else(|_| agent.to_string(), |s| s.to_string())
        };
        match request {
            Request::AgentCreated(a) => Route::Session(agent_session(&a.agent)),
            Request::AgentDisposed(a) | Request::Prompt(a) => {
                Route::Session(agent_session(&a.agent))
            }
            Request::AgentStatus(a) => Route::Session(agent_session(&a.agent)),
            Request::ToolCall(c) => Route::Session(agent_session(&c.session)),
            Request::Event(e) => Route::Session(e.session.to_string()),
            Request::ChatBind(b) => Route::Session(b.session.to_string()),
            Request::ModeSwitch(m) => Route::Session(m.session.to_string()),
            Request::Resume(r) => Route::Session(r.session.to_string()),
            // Management requests queue among themselves (a search over a large store must not
            // hold up the frames read after it); the space keeps the key off every session id.
            Request::Api(_) => Route::Session(" api".into()),
            Request::Handshake(_)
            | Request::ToolCancel(_)
            | Request::Status(_)
            | Request::Route(_)
            | Request::Shutdown(_) => Route::Inline,
        }
    }

    /// Serves frames from `input` until end of input or `shutdown`, writing responses to
    /// `output` (one line each, flushed). A frame that is too long, not UTF-8 or not a frame
    /// gets an error frame (with its id when readable); the bridge keeps serving. On
    /// `shutdown`, end of input or an input error every queued frame is finished before it
    /// returns.
    ///
    /// # Errors
    /// IO errors on the streams.
    pub async fn serve(
        self: &Arc<Self>,
        mut input: impl AsyncBufRead + Unpin,
        mut output: impl AsyncWrite + Unpin + Send + 'static,
    ) -> std::io::Result<()> {
        // Bounded: a host that stops reading our output stops us, it does not grow us.
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<Value>>(OUTPUT_QUEUE);
        let writer = tokio::spawn(async move {
            while let Some(frames) = out_rx.recv().await {
                for frame in frames {
                    output.write_all(format!("{frame}\n").as_bytes()).await?;
                }
                output.flush().await?;
            }
            Ok::<(), std::io::Error>(())
        });
        let queues: Queues = Arc::default();
        let in_flight = Arc::new(Semaphore::new(FRAMES_IN_FLIGHT));
        let mut workers = JoinSet::new();
        let max = self.config.max_frame_bytes;
        let mut shutdown = None;
        let mut read_error = None;
        loop {
            let line = match read_line(&mut input, max).await {
                Ok(l) => l,
                Err(e) => {
                    // Finish what was read before giving up on the input.
                    read_error = Some(e);
                    break;
                }
            };
            let bytes = match line {
                Line::End => break,
                Line::TooLong { head, len } => {
                    let id = frame::readable_id(&head).unwrap_or(Value::Null);
                    let _ = out_tx
                        .send(vec![error(
                            &id,
                            "frame-too-large",
                            format!("a frame of {len} bytes is over the limit of {max} bytes"),
                        )])
                        .await;
                    continue;
                }
                Line::Frame(bytes) => bytes,
            };
            let text = match std::str::from_utf8(&bytes) {
                Ok(t) if t.trim().is_empty() => continue,
                Ok(t) => t,
                Err(e) => {
                    let id = frame::readable_id(&bytes).unwrap_or(Value::Null);
                    let _ = out_tx
                        .send(vec![error(
                            &id,
                            "bad-frame",
                            format!("not utf-8 (invalid byte at {})", e.valid_up_to()),
                        )])
                        .await;
                    continue;
                }
            };
            let parsed = match frame::parse(text) {
                Ok(f) => f,
                Err((id, e)) => {
                    let _ = out_tx
                        .send(vec![error(&id.unwrap_or(Value::Null), e.code, e.message)])
                        .await;
                    continue;
                }
            };
            if matches!(parsed.request, Request::Shutdown(_)) {
                shutdown = Some(parsed);
                break;
            }
            // Decided as frames are read, so nothing queued can overtake the handshake.
            if !self.handshaken.load(std::sync::atomic::Ordering::SeqCst)
                && !matches!(parsed.request, Request::Handshake(_))
            {
                let _ = out_tx.send(self.handle_frame(parsed).await).await;
                continue;
            }
            match self.route(&parsed.request) {
                Route::Inline => {
                    let _ = out_tx.send(self.handle_frame(parsed).await).await;
                }
                Route::Session(key) => {
                    let Ok(permit) = in_flight.clone().acquire_owned().await else {
                        break;
                    };
                    self.enqueue(&queues, &mut workers, &out_tx, key, (parsed, permit));
                }
            }
        }
        // Finish what is queued, then answer a shutdown last: every write is durable by then.
        while workers.join_next().await.is_some() {}
        if let Some(frame) = shutdown {
            let _ = out_tx.send(self.handle_frame(frame).await).await;
        }
        drop(out_tx);
        writer.await.map_err(std::io::Error::other)??;
        read_error.map_or(Ok(()), Err)
    }

    /// Puts a frame in its session's queue, starting the session's worker if it has none.
    /// The send happens under the map's lock, where a worker also retires: a frame either
    /// reaches a live worker or starts a new one, and two workers of one session never run
    /// at once.
    fn enqueue(
        self: &Arc<Self>,
        queues: &Queues,
        workers: &mut JoinSet<()>,
        out: &mpsc::Sender<Vec<Value>>,
        key: String,
        job: Job,
    ) {
        // Reap finished workers so the set stays as small as the sessions in flight.
        while workers.try_join_next().is_some() {}
        let mut map = lock(queues);
        let job = match map.get(&key) {
            Some(sender) => match sender.send(job) {
                Ok(()) => return,
                // Its worker retired (it removes its entry first, so this is a stale one).
                Err(mpsc::error::SendError(back)) => back,
            },
            None => job,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(job);
        map.insert(key.clone(), tx);
        workers.spawn(self.clone().work(key, rx, queues.clone(), out.clone()));
    }

    /// Serves one session's frames in order; retires (and forgets its queue) when the queue
    /// runs empty, so idle sessions hold nothing. It decides to retire under the map's lock,
    /// where frames are sent, so no frame can arrive after it looked.
    async fn work(
        self: Arc<Self>,
        key: String,
        mut rx: mpsc::UnboundedReceiver<Job>,
        queues: Queues,
        out: mpsc::Sender<Vec<Value>>,
    ) {
        loop {
            let job = {
                let mut map = lock(&queues);
                match rx.try_recv() {
                    Ok(job) => job,
                    Err(_) => {
                        map.remove(&key);
                        return;
                    }
                }
            };
            let (frame, permit) = job;
            let answer = self.handle_frame(frame).await;
            drop(permit);
            let _ = out.send(answer).await;
        }
    }
}

/// A queued frame and its place among the frames in flight.
type Job = (Frame, OwnedSemaphorePermit);

/// Each session's queue.
type Queues = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Job>>>>;
