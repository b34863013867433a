//! Fuzzing both wire protocols in process (a proptest harness, bounded in cases so CI time is
//! bounded): arbitrary bytes and mutated well-formed frames never panic the bridge or the MCP
//! server, every request that has a readable id gets exactly one answer carrying that id, and
//! the server keeps answering afterwards.

mod common;

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{json, Value};
use tavern_core::AgentId;
use tavern_dsh_adapter::bridge::host::BridgeHost;
use tavern_dsh_adapter::bridge::Bridge;
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_runtime::mcp::McpServer;
use tavern_store::clock::ManualClock;
use tavern_store::mem::MemStore;

use common::{assets, T0};

fn runtime() -> (Runtime, Arc<BridgeHost>) {
    let clock = Arc::new(ManualClock::new(T0));
    let host = Arc::new(BridgeHost::default());
    let rt = Runtime::new(
        host.clone(),
        Arc::new(MemStore::new(clock.clone())),
        assets(),
        clock,
        RuntimeConfig::default(),
    );
    (rt, host)
}

/// Well-formed frames of every method, to mutate.
fn seeds() -> Vec<Value> {
    vec![
        json!({"id": 1, "method": "handshake", "params": {"protocol": 1}}),
        json!({"id": 2, "method": "chat/bind", "params": {"session": "s1", "character": "Seraphina", "chatId": "c1"}}),
        json!({"id": 3, "method": "agent/created", "params": {"agent": "s1"}}),
        json!({"id": 4, "method": "tool/call", "params": {"tool": "memory_write", "args": {"content": "x"}, "callId": "c", "session": "s1"}}),
        json!({"id": 5, "method": "event", "params": {"session": "s1", "event": {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}}}),
        json!({"id": 6, "method": "prompt", "params": {"agent": "s1"}}),
        json!({"id": 7, "method": "tool/cancel", "params": {"callId": "c"}}),
        json!({"id": 8, "method": "status"}),
        json!({"id": 9, "method": "tavern-mode/route", "params": {"method": "POST", "admitted": true, "body": "{\"action\":\"read\",\"sessionId\":\"s1\"}"}}),
        json!({"id": 10, "method": "mode/switch", "params": {"session": "s1", "mode": "agent-managed"}}),
        json!({"id": 11, "method": "resume", "params": {"session": "s1"}}),
        json!({"method": "agent/status", "params": {"agent": "s1", "status": "running"}}),
    ]
}

/// A mutation of a frame's text: cut it, flip a byte, splice in a hostile fragment.
fn mutate(text: &str, how: u8, at: usize, fragment: &str) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    let at = at % (b.len() + 1);
    match how % 4 {
        0 => b.truncate(at),
        1 => {
            if let Some(x) = b.get_mut(at) {
                *x ^= 0x5a;
            }
        }
        2 => {
            b.splice(at..at, fragment.bytes());
        }
        _ => b = fragment.as_bytes().to_vec(),
    }
    b
}

const FRAGMENTS: [&str; 8] = [
    "\\ud83d",
    "\u{0}",
    "\"id\": null",
    "{\"id\": 99}",
    "[[[[[[[[",
    "\"session\": \"../../etc\"",
    "\u{feff}",
    "\"args\": {\"sessionId\": \"s2\"}",
];

/// The ids a reply set answers.
fn answered(out: &[Value]) -> Vec<Value> {
    out.iter()
        .filter(|f| f.get("result").is_some() || f.get("error").is_some())
        .map(|f| f["id"].clone())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn bridge_frames_never_panic_and_answer_once(
        picks in prop::collection::vec((0..12usize, any::<u8>(), any::<usize>(), 0..8usize), 1..12),
        raw in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (runtime, host) = runtime();
            let bridge = Bridge::new(runtime, host);
            let seeds = seeds();
            // The well-formed prefix gets the bridge into a bound, mounted state.
            for s in &seeds[..3] {
                bridge.handle(&s.to_string()).await;
            }
            let mut frames: Vec<Vec<u8>> = picks
                .iter()
                .map(|(i, how, at, f)| mutate(&seeds[*i].to_string(), *how, *at, FRAGMENTS[*f]))
                .collect();
            frames.push(raw.clone());
            for bytes in frames {
                let Ok(text) = std::str::from_utf8(&bytes) else { continue };
                let out = bridge.handle(text).await;
                let id = serde_json::from_str::<Value>(text).ok().and_then(|v| v.get("id").cloned());
                let ids = answered(&out);
                prop_assert!(ids.len() <= 1, "one answer at most: {out:?}");
                if let Some(id) = id {
                    prop_assert_eq!(ids, vec![id], "the answer carries the request's id");
                }
            }
            // Still serving.
            let out = bridge.handle(&json!({"id": 500, "method": "status"}).to_string()).await;
            prop_assert_eq!(answered(&out), vec![json!(500)]);
            Ok(())
        })?;
    }

    #[test]
    fn mcp_messages_never_panic_and_answer_requests(
        picks in prop::collection::vec((0..4usize, any::<u8>(), any::<usize>(), 0..8usize), 1..10),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
            let (runtime, _) = runtime();
            let server = McpServer::new(runtime, AgentId::parse("s1").unwrap());
            let (client, server_io) = tokio::io::duplex(1 << 16);
            let (server_read, server_write) = tokio::io::split(server_io);
            let serving = tokio::spawn(server.serve(BufReader::new(server_read), server_write));
            let (client_read, mut client_write) = tokio::io::split(client);
            let mut lines = BufReader::new(client_read).lines();
            let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "1"}}});
            client_write.write_all(format!("{init}\n").as_bytes()).await.unwrap();
            client_write.write_all(b"{\"jsonrpc\": \"2.0\", \"method\": \"notifications/initialized\"}\n").await.unwrap();
            let seeds = [
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
                json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "variable_set", "arguments": {"name": "hp", "value": 3}}}),
                json!({"jsonrpc": "2.0", "id": 4, "method": "ping"}),
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}}),
            ];
            for (i, how, at, f) in picks {
                let mut bytes = mutate(&seeds[i].to_string(), how, at, FRAGMENTS[f]);
                bytes.retain(|b| *b != b'\n');
                bytes.push(b'\n');
                client_write.write_all(&bytes).await.unwrap();
            }
            client_write.write_all(b"{\"jsonrpc\": \"2.0\", \"id\": 77, \"method\": \"ping\"}\n").await.unwrap();
            // The server keeps answering after whatever came before: the ping is answered.
            let answered = tokio::time::timeout(std::time::Duration::from_secs(30), async {
                while let Some(line) = lines.next_line().await.unwrap() {
                    let v: Value = serde_json::from_str(&line).expect("every line the server writes is JSON");
                    if v["id"] == json!(77) {
                        return true;
                    }
                }
                false
            })
            .await
            .expect("the server answered in time");
            prop_assert!(answered, "the ping after the fuzzed messages is answered");
            drop(client_write);
            drop(lines);
            let _ = serving.await;
            Ok(())
        })?;
    }
}
