//! MCP mode: the tools over stdio MCP, on the official Rust SDK (`rmcp`), for harnesses that
//! speak MCP. MCP's `tools/call` carries no caller identity, so one server serves exactly one
//! binding fixed at launch; identity never comes from tool arguments.
//!
//! What the SDK gives: version negotiation (an unknown requested version is answered with one
//! we support), `tools/list` with input and output schemas, protocol errors for unknown methods,
//! cancellation (`notifications/cancelled` stops the call), logging (`logging/setLevel`,
//! `notifications/message`). What is ours: the tools with `title`, `annotations` and
//! `structuredContent`; a protocol error for an unknown tool; batches answered with -32600;
//! bad bytes and oversized lines answered with a parse error instead of closing the session;
//! limits per call and per minute instead of per turn (MCP has no turns); call ids unique across
//! processes (a memory written, forgotten and written again from a new process is new).
//!
//! What MCP mode does not do: there are no host events, so no chat projection, no turn
//! variables and no history of this conversation (history search reads the bound chat as it is
//! on disk).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::StreamExt;
// Logging is deprecated by the newest MCP revision (SEP-2577) but still what clients of the
// revisions we negotiate read.
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorCode, ErrorData, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam, SetLevelRequestParams};
use rmcp::service::{NotificationContext, RequestContext, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tavern_core::AgentId;
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::host::ToolDefinition;
use crate::line::{read_line, Line};
use crate::runtime::Runtime;

/// Tool calls allowed per minute in MCP mode (a rate, since there are no turns to count in).
pub const CALLS_PER_MINUTE: u32 = 1200;

/// Largest message read, in bytes; a longer line is answered with a parse error and skipped.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// A token bucket: `CALLS_PER_MINUTE` calls a minute, all of them at once at most.
#[derive(Debug)]
struct Rate {
    tokens: f64,
    at: Instant,
}

impl Rate {
    fn new() -> Self {
        Self {
            tokens: f64::from(CALLS_PER_MINUTE),
            at: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        let per_second = f64::from(CALLS_PER_MINUTE) / 60.0;
        let refill = now.duration_since(self.at).as_secs_f64() * per_second;
        self.tokens = (self.tokens + refill).min(f64::from(CALLS_PER_MINUTE));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// An MCP server for one session.
pub struct McpServer {
    runtime: Runtime,
    agent: AgentId,
    /// Unique to this process: start time and process id.
    call_prefix: String,
    calls: AtomicU64,
    tools: Vec<Tool>,
    rate: Mutex<Rate>,
    /// The least severe log level the client wants (`logging/setLevel`), as a severity rank.
    log_level: AtomicU8,
}

#[allow(deprecated)]
fn severity_info() -> u8 {
    severity(LoggingLevel::Info)
}

/// A log level's severity, least severe first (RFC 5424 order, as MCP defines them).
#[allow(deprecated)]
fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// The title and behaviour hints of a tool, from the tool's own facts.
fn annotations(tool: &ToolDefinition) -> ToolAnnotations {
    let title = tool
        .name
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ");
    ToolAnnotations::with_title(title)
        .read_only(!tool.writes)
        .destructive(tool.destructive)
        .idempotent(tool.idempotent)
        .open_world(false)
}

fn object(v: &Value) -> Arc<JsonObject> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

impl McpServer {
    /// Serves `agent`'s session (which must be an agent-tavern binding for tools to work).
    pub fn new(runtime: Runtime, agent: AgentId) -> Self {
        let tools = runtime
            .tool_definitions()
            .into_iter()
            .map(|t| {
                let a = annotations(&t);
                let title = a.title.clone().unwrap_or_default();
                Tool::new(t.name, t.description, object(&t.parameters))
                    .with_title(title)
                    .with_raw_output_schema(object(&t.output_schema))
                    .with_annotations(a)
            })
            .collect();
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Self {
            runtime,
            agent,
            call_prefix: format!("mcp-{started:x}-{:x}", std::process::id()),
            calls: AtomicU64::new(0),
            tools,
            rate: Mutex::new(Rate::new()),
            log_level: AtomicU8::new(severity_info()),
        }
    }

    /// Serves MCP on `input`/`output` until the client closes its side.
    ///
    /// # Errors
    /// IO errors on the streams.
    pub async fn serve(
        self,
        mut input: impl AsyncBufRead + Unpin + Send + 'static,
        mut output: impl AsyncWrite + Unpin + Send + 'static,
    ) -> std::io::Result<()> {
        // Our own line transport: what the SDK must not see (batches, bad bytes, lines too
        // long) is answered here and the session goes on.
        // Bounded: while OUTPUT_QUEUE answers wait for a client that does not read them, no
        // more input is read (every answer is caused by input), instead of this process
        // growing without limit.
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<String>();
        let backlog = Arc::new(Backlog::default());
        let writer = {
            let backlog = backlog.clone();
            tokio::spawn(async move {
                while let Some(line) = out_rx.recv().await {
                    output.write_all(line.as_bytes()).await?;
                    output.write_all(b"\n").await?;
                    output.flush().await?;
                    backlog.written();
                }
                Ok::<(), std::io::Error>(())
            })
        };
        let (in_tx, in_rx) = mpsc::channel::<RxJsonRpcMessage<RoleServer>>(64);
        let direct = Queued {
            tx: out_tx.clone(),
            backlog: backlog.clone(),
        };
        let read_backlog = backlog.clone();
        let reader = tokio::spawn(async move {
            let backlog = read_backlog;
            let error = |id: Value, code: i32, message: String| {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
                    .to_string()
            };
            let mut initialize_seen = false;
            loop {
                backlog.below(OUTPUT_QUEUE).await;
                let bytes = match read_line(&mut input, MAX_MESSAGE_BYTES).await? {
                    Line::End => break,
                    Line::TooLong { len, .. } => {
                        let message = format!(
                            "a message of {len} bytes is over the limit of {MAX_MESSAGE_BYTES} bytes"
                        );
                        if direct.send(error(Value::Null, -32700, message)).is_err() {
                            break;
                        }
                        continue;
                    }
                    Line::Frame(b) => b,
                };
                let answer = match decode(&bytes) {
                    Decoded::Skip => None,
                    Decoded::Answer(id, code, message) => Some(error(id, code, message)),
                    Decoded::Message(id, message) => {
                        let is_request = id.is_some();
                        let is_initialize = matches!(
                            message.as_ref(),
                            rmcp::model::JsonRpcMessage::Request(r)
                                if matches!(r.request, rmcp::model::ClientRequest::InitializeRequest(_))
                        );
                        if !initialize_seen && !is_initialize {
                            // Before `initialize` a notification is ignored and a request
                            // refused; the session starts when `initialize` comes.
                            id.filter(|_| is_request).map(|id| {
                                error(
                                    id,
                                    -32600,
                                    "the session is not initialized: send initialize first".into(),
                                )
                            })
                        } else {
                            initialize_seen = true;
                            if in_tx.send(*message).await.is_err() {
                                break;
                            }
                            None
                        }
                    }
                };
                if let Some(line) = answer {
                    if direct.send(line).is_err() {
                        break;
                    }
                }
            }
            Ok::<(), std::io::Error>(())
        });
        let stream =
            futures::stream::unfold(
                in_rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            )
            .boxed();
        let sink = futures::sink::unfold(
            Queued {
                tx: out_tx,
                backlog,
            },
            |tx, message: TxJsonRpcMessage<RoleServer>| async move {
                let line = serde_json::to_string(&message).map_err(std::io::Error::other)?;
                tx.send(line)
                    .map_err(|_| std::io::Error::other("the output is closed"))?;
                Ok::<_, std::io::Error>(tx)
            },
        );
        let sink = Box::pin(sink);
        let running = ServiceExt::serve(self, (sink, stream))
            .await
            .map_err(std::io::Error::other)?;
        let _ = running.waiting().await;
        reader.await.map_err(std::io::Error::other)??;
        writer.await.map_err(std::io::Error::other)?
    }

    /// Runs one call: its own turn (limits are per call), a rate, a process-unique call id.
    async fn run(&self, name: &str, args: Value) -> CallToolResult {
        if !self
            .rate
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let e = json!({"error": {"code": "limit-exceeded", "message": format!("more than {CALLS_PER_MINUTE} tool calls a minute"), "limit": "tool calls per minute", "max": CALLS_PER_MINUTE}});
            return CallToolResult::structured_error(e);
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let call_id = format!("{}-{n}", self.call_prefix);
        let out = self
            .runtime
            .call_tool_in_turn(&self.agent, &call_id, name, &args, n + 1)
            .await;
        if out.get("error").is_some() {
            // An error the model can act on: a tool error, not a protocol one, structured as
            // every tool's outputSchema declares it.
            CallToolResult::structured_error(out)
        } else {
            CallToolResult::structured(out)
        }
    }
}

impl ServerHandler for McpServer {
    #[allow(deprecated)]
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        );
        info.server_info = Implementation::new("agent-tavern", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(format!(
            "AgentTavern tools for session {}: character, lore, chat history, scene, memories and variables. Identity and scope come from the session; never pass ids in arguments.",
            self.agent
        ));
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.tools.iter().any(|t| t.name == request.name) {
            return Err(ErrorData::new(
                ErrorCode::INVALID_PARAMS,
                format!("unknown tool {}", request.name),
                None,
            ));
        }
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        tokio::select! {
            result = self.run(&request.name, args) => Ok(result.into()),
            () = context.ct.cancelled() => Err(ErrorData::new(
                ErrorCode::INTERNAL_ERROR,
                "the call was cancelled",
                None,
            )),
        }
    }

    /// Clients that see the logging capability set a level first (the MCP Inspector does, and
    /// gives up when it is refused); later log messages below it are not sent.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.log_level
            .store(severity(request.level), Ordering::SeqCst);
        Ok(())
    }

    #[allow(deprecated)]
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if severity(LoggingLevel::Info) < self.log_level.load(Ordering::SeqCst) {
            return;
        }
        let _ = context
            .peer
            .notify_logging_message(LoggingMessageNotificationParam::new(
                LoggingLevel::Info,
                json!(format!("agent-tavern serving session {}", self.agent)),
            ))
            .await;
    }
}

/// Most answers waiting for a client that does not read them.
const OUTPUT_QUEUE: usize = 256;

/// Request methods this server knows: a message naming one with parameters the SDK cannot read
/// is answered "invalid params" (-32602), not "invalid request".
const KNOWN_METHODS: [&str; 5] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "logging/setLevel",
];

/// What one line of input is.
enum Decoded {
    /// Nothing to do (a blank line).
    Skip,
    /// Answer with this error: `(id, code, message)`.
    Answer(Value, i32, String),
    /// A message for the SDK, with its id when it is a request.
    Message(Option<Value>, Box<RxJsonRpcMessage<RoleServer>>),
}

/// Decodes one line as JSON-RPC: bad bytes, bad JSON, batches and bad messages get their
/// JSON-RPC error codes; lone surrogate escapes (what JavaScript writes for half an emoji) are
/// read as U+FFFD, as the bridge does.
fn decode(bytes: &[u8]) -> Decoded {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Decoded::Answer(Value::Null, -32700, "parse error: not utf-8".into());
    };
    if text.trim().is_empty() {
        return Decoded::Skip;
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(first) => {
            match serde_json::from_str(&tavern_tools::assets::lenient::repair_surrogates(text)) {
                Ok(v) => v,
                Err(_) => {
                    return Decoded::Answer(Value::Null, -32700, format!("parse error: {first}"))
                }
            }
        }
    };
    if value.is_array() {
        return Decoded::Answer(
            Value::Null,
            -32600,
            "batches are not supported: send one message a line".into(),
        );
    }
    let id = value.get("id").cloned();
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_owned);
    match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value) {
        // The SDK reads a known method whose parameters it cannot read as a custom request,
        // and would answer "method not found".
        Ok(rmcp::model::JsonRpcMessage::Request(r))
            if matches!(&r.request, rmcp::model::ClientRequest::CustomRequest(c)
                if KNOWN_METHODS.contains(&c.method.as_str())) =>
        {
            Decoded::Answer(
                id.unwrap_or(Value::Null),
                -32602,
                format!(
                    "invalid params for {}",
                    method.as_deref().unwrap_or_default()
                ),
            )
        }
        Ok(message) => Decoded::Message(id, Box::new(message)),
        // A notification is never answered, not even with an error.
        Err(_) if id.is_none() => Decoded::Skip,
        Err(e) => {
            let code = match &method {
                Some(m) if KNOWN_METHODS.contains(&m.as_str()) => -32602,
                _ => -32600,
            };
            let what = if code == -32602 {
                "invalid params"
            } else {
                "invalid request"
            };
            Decoded::Answer(id.unwrap_or(Value::Null), code, format!("{what}: {e}"))
        }
    }
}

/// How many answers wait for the client, and a wake-up when one is written.
#[derive(Default)]
struct Backlog {
    queued: std::sync::atomic::AtomicUsize,
    written: tokio::sync::Notify,
}

impl Backlog {
    fn written(&self) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
        self.written.notify_waiters();
    }

    /// Waits until fewer than `limit` answers wait.
    async fn below(&self, limit: usize) {
        loop {
            let written = self.written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            if self.queued.load(Ordering::SeqCst) < limit {
                return;
            }
            written.await;
        }
    }
}

/// The output queue, counting what it holds.
#[derive(Clone)]
struct Queued {
    tx: mpsc::UnboundedSender<String>,
    backlog: Arc<Backlog>,
}

impl Queued {
    fn send(&self, line: String) -> Result<(), mpsc::error::SendError<String>> {
        self.backlog.queued.fetch_add(1, Ordering::SeqCst);
        self.tx.send(line).inspect_err(|_| {
            self.backlog.queued.fetch_sub(1, Ordering::SeqCst);
        })
    }
}
