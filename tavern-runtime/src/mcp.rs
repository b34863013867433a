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
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode, ErrorData,
    Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
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
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<String>();
        let writer = tokio::spawn(async move {
            while let Some(line) = out_rx.recv().await {
                output.write_all(line.as_bytes()).await?;
                output.write_all(b"\n").await?;
                output.flush().await?;
            }
            Ok::<(), std::io::Error>(())
        });
        let (in_tx, in_rx) = mpsc::channel::<RxJsonRpcMessage<RoleServer>>(64);
        let direct = out_tx.clone();
        let reader = tokio::spawn(async move {
            let error = |id: Value, code: i32, message: String| {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
                    .to_string()
            };
            loop {
                let bytes = match read_line(&mut input, MAX_MESSAGE_BYTES).await? {
                    Line::End => break,
                    Line::TooLong { len, .. } => {
                        let _ = direct.send(error(
                            Value::Null,
                            -32700,
                            format!("a message of {len} bytes is over the limit of {MAX_MESSAGE_BYTES} bytes"),
                        ));
                        continue;
                    }
                    Line::Frame(b) => b,
                };
                let Ok(text) = std::str::from_utf8(&bytes) else {
                    let _ =
                        direct.send(error(Value::Null, -32700, "parse error: not utf-8".into()));
                    continue;
                };
                if text.trim().is_empty() {
                    continue;
                }
                let value: Value = match serde_json::from_str(text) {
                    Ok(v) => v,
                    Err(e) => {
                        let _ =
                            direct.send(error(Value::Null, -32700, format!("parse error: {e}")));
                        continue;
                    }
                };
                if value.is_array() {
                    let _ = direct.send(error(
                        Value::Null,
                        -32600,
                        "batches are not supported: send one message a line".into(),
                    ));
                    continue;
                }
                let id = value.get("id").cloned().unwrap_or(Value::Null);
                match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value) {
                    Ok(message) => {
                        if in_tx.send(message).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = direct.send(error(id, -32600, format!("invalid request: {e}")));
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
            out_tx,
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
            return CallToolResult::error(vec![ContentBlock::text(e.to_string())]);
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let call_id = format!("{}-{n}", self.call_prefix);
        let out = self
            .runtime
            .call_tool_in_turn(&self.agent, &call_id, name, &args, n + 1)
            .await;
        if out.get("error").is_some() {
            // An error the model can act on: a tool error, not a protocol one.
            CallToolResult::error(vec![ContentBlock::text(out.to_string())])
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
