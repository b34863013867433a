//! Serving the bridge over a byte stream: frames are read with a size cap (an oversized line
//! is answered and skipped without being held), decoded, and routed — frames of one session go
//! through that session's queue in order, sessions run concurrently, frames about no session
//! (handshake, status, cancel, the route, shutdown) are served as they are read. One writer
//! task owns the output, so response lines never interleave.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::frame::{self, Frame, Request};
use super::{error, lock, Bridge};

/// Frames queued per session before the reader waits (back-pressure on the host).
const SESSION_QUEUE: usize = 256;

/// One line read from the input.
pub(crate) enum Line {
    /// A complete frame (terminator removed).
    Frame(Vec<u8>),
    /// A line longer than the limit, skipped; `head` is its start (for the id).
    TooLong { head: Vec<u8>, len: usize },
    /// End of input.
    End,
}

/// Reads one line of at most `max` bytes; a longer one is consumed to its end without being
/// kept beyond its first `max` bytes.
pub(crate) async fn read_line(
    input: &mut (impl AsyncBufRead + Unpin),
    max: usize,
) -> std::io::Result<Line> {
    let mut buf = Vec::new();
    let mut len = 0usize;
    loop {
        let chunk = input.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if len == 0 {
                Line::End
            } else if len > max {
                Line::TooLong { head: buf, len }
            } else {
                Line::Frame(buf)
            });
        }
        let (part, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        len += part.len();
        if buf.len() < max {
            let room = max - buf.len();
            buf.extend_from_slice(&part[..part.len().min(room)]);
        }
        let used = done.unwrap_or(part.len());
        input.consume(used);
        if done.is_some() {
            return Ok(if len > max {
                Line::TooLong { head: buf, len }
            } else {
                Line::Frame(buf)
            });
        }
    }
}

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
    /// `shutdown` or end of input every queued frame is finished before it returns.
    ///
    /// # Errors
    /// IO errors on the streams.
    pub async fn serve(
        self: &Arc<Self>,
        mut input: impl AsyncBufRead + Unpin,
        mut output: impl AsyncWrite + Unpin + Send + 'static,
    ) -> std::io::Result<()> {
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Vec<Value>>();
        let writer = tokio::spawn(async move {
            while let Some(frames) = out_rx.recv().await {
                for frame in frames {
                    output.write_all(format!("{frame}\n").as_bytes()).await?;
                }
                output.flush().await?;
            }
            Ok::<(), std::io::Error>(())
        });
        let queues: Arc<Mutex<HashMap<String, mpsc::Sender<Frame>>>> = Arc::default();
        let mut workers = JoinSet::new();
        let max = self.config.max_frame_bytes;
        let mut shutdown = None;
        loop {
            let bytes = match read_line(&mut input, max).await? {
                Line::End => break,
                Line::TooLong { head, len } => {
                    let id = frame::readable_id(&head).unwrap_or(Value::Null);
                    let _ = out_tx.send(vec![error(
                        &id,
                        "frame-too-large",
                        format!("a frame of {len} bytes is over the limit of {max} bytes"),
                    )]);
                    continue;
                }
                Line::Frame(bytes) => bytes,
            };
            let text = match std::str::from_utf8(&bytes) {
                Ok(t) if t.trim().is_empty() => continue,
                Ok(t) => t,
                Err(e) => {
                    let id = frame::readable_id(&bytes).unwrap_or(Value::Null);
                    let _ = out_tx.send(vec![error(
                        &id,
                        "bad-frame",
                        format!("not utf-8 (invalid byte at {})", e.valid_up_to()),
                    )]);
                    continue;
                }
            };
            let parsed = match frame::parse(text) {
                Ok(f) => f,
                Err((id, e)) => {
                    let _ = out_tx.send(vec![error(&id.unwrap_or(Value::Null), e.code, e.message)]);
                    continue;
                }
            };
            if matches!(parsed.request, Request::Shutdown(_)) {
                shutdown = Some(parsed);
                break;
            }
            match self.route(&parsed.request) {
                Route::Inline => {
                    let _ = out_tx.send(self.handle_frame(parsed).await);
                }
                Route::Session(key) => {
                    self.enqueue(&queues, &mut workers, &out_tx, key, parsed)
                        .await;
                }
            }
        }
        // Finish what is queued, then answer a shutdown last: every write is durable by then.
        lock(&queues).clear();
        while workers.join_next().await.is_some() {}
        if let Some(frame) = shutdown {
            let _ = out_tx.send(self.handle_frame(frame).await);
        }
        drop(out_tx);
        writer.await.map_err(std::io::Error::other)?
    }

    /// Puts a frame in its session's queue, starting the session's worker if it has none.
    async fn enqueue(
        self: &Arc<Self>,
        queues: &Arc<Mutex<HashMap<String, mpsc::Sender<Frame>>>>,
        workers: &mut JoinSet<()>,
        out: &mpsc::UnboundedSender<Vec<Value>>,
        key: String,
        mut frame: Frame,
    ) {
        // Reap finished workers so the set stays as small as the sessions in flight.
        while workers.try_join_next().is_some() {}
        loop {
            let sender = {
                let mut map = lock(queues);
                match map.get(&key) {
                    Some(s) => s.clone(),
                    None => {
                        let (tx, rx) = mpsc::channel(SESSION_QUEUE);
                        map.insert(key.clone(), tx.clone());
                        workers.spawn(self.clone().work(
                            key.clone(),
                            rx,
                            queues.clone(),
                            out.clone(),
                        ));
                        tx
                    }
                }
            };
            match sender.send(frame).await {
                Ok(()) => return,
                // The worker ended between our lookup and the send: start a new one.
                Err(mpsc::error::SendError(back)) => {
                    let mut map = lock(queues);
                    if map.get(&key).is_some_and(|s| s.same_channel(&sender)) {
                        map.remove(&key);
                    }
                    frame = back;
                }
            }
        }
    }

    /// Serves one session's frames in order; retires (and forgets its queue) when the queue
    /// runs empty, so idle sessions hold nothing. Retiring closes the queue under the map's
    /// lock: a frame sent just before is still served, one sent after is refused and the
    /// reader starts a new worker for it.
    async fn work(
        self: Arc<Self>,
        key: String,
        mut rx: mpsc::Receiver<Frame>,
        queues: Arc<Mutex<HashMap<String, mpsc::Sender<Frame>>>>,
        out: mpsc::UnboundedSender<Vec<Value>>,
    ) {
        while let Some(frame) = rx.recv().await {
            let _ = out.send(self.handle_frame(frame).await);
            let retire = {
                let mut map = lock(&queues);
                if rx.is_empty() {
                    map.remove(&key);
                    rx.close();
                    true
                } else {
                    false
                }
            };
            if retire {
                while let Some(frame) = rx.recv().await {
                    let _ = out.send(self.handle_frame(frame).await);
                }
                return;
            }
        }
    }
}
