//! MCP mode: the same tools over stdio MCP (JSON-RPC 2.0, one message per line) for harnesses
//! that speak MCP. MCP's `tools/call` carries no caller identity, so one bridge serves exactly
//! one binding fixed at launch; identity never comes from tool arguments.

use serde_json::{json, Value};
use tavern_core::AgentId;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::runtime::Runtime;

/// The MCP protocol revision answered when the client does not name one.
pub const MCP_VERSION: &str = "2024-11-05";

/// An MCP server for one session.
#[derive(Debug)]
pub struct McpServer {
    runtime: Runtime,
    agent: AgentId,
    calls: std::sync::atomic::AtomicU64,
}

impl McpServer {
    /// Serves `agent`'s session (which must be an agent-tavern binding for tools to work).
    pub fn new(runtime: Runtime, agent: AgentId) -> Self {
        Self {
            runtime,
            agent,
            calls: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Handles one JSON-RPC message; `None` for notifications.
    pub async fn handle(&self, line: &str) -> Option<Value> {
        let msg: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                return Some(
                    json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": format!("parse error: {e}")}}),
                )
            }
        };
        let id = msg.get("id").cloned()?;
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let result = match method {
            "initialize" => Ok(json!({
                "protocolVersion": params.get("protocolVersion").and_then(Value::as_str).unwrap_or(MCP_VERSION),
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": "agent-tavern", "version": env!("CARGO_PKG_VERSION")},
            })),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(
                json!({"tools": self.runtime.tool_definitions().iter().map(|t| json!({
                "name": t.name, "description": t.description, "inputSchema": t.parameters,
            })).collect::<Vec<_>>()}),
            ),
            "tools/call" => {
                let name = params
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let args = params
                    .get("arguments")
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let out = self
                    .runtime
                    .call_tool(&self.agent, &format!("mcp-{n}"), name, &args)
                    .await;
                let is_error = out.get("error").is_some();
                Ok(
                    json!({"content": [{"type": "text", "text": out.to_string()}], "isError": is_error}),
                )
            }
            other => Err(json!({"code": -32601, "message": format!("method not found: {other}")})),
        };
        Some(match result {
            Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
            Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e}),
        })
    }

    /// Serves messages from `input` until it ends. A line that is not UTF-8 gets a parse
    /// error; the server keeps serving.
    ///
    /// # Errors
    /// IO errors on the streams.
    pub async fn serve(
        &self,
        mut input: impl AsyncBufRead + Unpin,
        mut output: impl AsyncWrite + Unpin,
    ) -> std::io::Result<()> {
        let mut buf = Vec::new();
        loop {
            buf.clear();
            if input.read_until(b'\n', &mut buf).await? == 0 {
                break;
            }
            let reply = match std::str::from_utf8(&buf) {
                Ok(line) if line.trim().is_empty() => continue,
                Ok(line) => self.handle(line).await,
                Err(_) => Some(
                    json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse error: not utf-8"}}),
                ),
            };
            if let Some(reply) = reply {
                output.write_all(format!("{reply}\n").as_bytes()).await?;
                output.flush().await?;
            }
        }
        Ok(())
    }
}
