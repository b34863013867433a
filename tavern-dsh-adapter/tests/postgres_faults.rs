//! Faults around a PostgreSQL store (`--store`), in their own test process so the throwaway
//! cluster can be stopped without disturbing other tests: a bridge killed with SIGKILL in the
//! middle of writing loses no acknowledged write and leaves nothing half-applied, and a
//! database restarted under a running bridge gives clear errors while it is down, works again
//! without restarting the bridge, and a retried write does not duplicate the memory.

mod common;
#[path = "../../tavern-store/tests/support/pg.rs"]
mod pg;

use std::path::Path;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::process::Command;
use tokio::sync::mpsc;

const BRIDGE: &str = env!("CARGO_BIN_EXE_tavern-bridge");

/// The tests share this process's cluster and one of them stops it: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A bridge in MCP mode on `settings`, and its process id.
async fn bridge(settings: &str, assets: &Path) -> (RunningService<RoleClient, ()>, u32) {
    let mut command = Command::new(BRIDGE);
    command
        .arg("mcp")
        .arg("--store")
        .arg(settings)
        .arg("--assets")
        .arg(assets)
        .args([
            "--session",
            "s-1",
            "--character",
            "Mira",
            "--chat",
            "Mira - s-1",
        ])
        .env("RUST_LOG", "warn");
    let transport = TokioChildProcess::new(command).unwrap();
    let pid = transport.id().unwrap();
    (().serve(transport).await.unwrap(), pid)
}

async fn call(
    peer: &Peer<RoleClient>,
    tool: &'static str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    peer.call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await
}

async fn database() -> String {
    let cluster = pg::cluster();
    let db = cluster.fresh_database().await;
    cluster.settings(db.get_dbname().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_killed_mid_write_loses_no_acknowledged_write() {
    let _serial = SERIAL.lock().await;
    let settings = database().await;
    let tmp = tempfile::tempdir().unwrap();
    let assets = common::mira_assets(tmp.path());
    let (a, pid) = bridge(&settings, &assets).await;

    // A writer that reports every acknowledged memory; it stops at the first failed call.
    let (acks, mut acked) = mpsc::unbounded_channel();
    let peer = a.peer().clone();
    let writer = tokio::spawn(async move {
        for i in 0..10_000 {
            let content = format!("note {i}: the lantern burned for {i} nights");
            match call(&peer, "memory_write", json!({ "content": content })).await {
                Ok(r) if r.is_error != Some(true) => {
                    let id = r.structured_content.unwrap()["id"]
                        .as_str()
                        .unwrap()
                        .to_owned();
                    if acks.send((id, content)).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    let mut acknowledged = Vec::new();
    while acknowledged.len() < 30 {
        acknowledged.push(acked.recv().await.expect("the writer stopped early"));
    }
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    while let Some(ack) = acked.recv().await {
        acknowledged.push(ack);
    }
    writer.await.unwrap();
    drop(a);

    let (b, _) = bridge(&settings, &assets).await;
    for (id, content) in &acknowledged {
        let read = call(&b, "memory_read", json!({ "id": id })).await.unwrap();
        let read = read.structured_content.unwrap();
        assert_eq!(
            read["content"],
            content.as_str(),
            "acknowledged write {id} is lost"
        );
    }
    // Nothing half-applied: every stored note is whole, and at most the write in flight when
    // the process died is there beyond the acknowledged ones.
    let all = call(
        &b,
        "memory_search",
        json!({"query": "lantern burned", "limit": 50, "maxTokens": 4000}),
    )
    .await
    .unwrap();
    let items = all.structured_content.unwrap()["items"]
        .as_array()
        .unwrap()
        .clone();
    for item in &items {
        let text = item["content"].as_str().unwrap();
        assert!(
            text.starts_with("note ") && text.ends_with(" nights"),
            "{text}"
        );
    }
    assert!(
        items.len() <= acknowledged.len() + 1 || items.len() == 50,
        "{}",
        items.len()
    );
    b.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_is_survived_without_restarting_the_bridge() {
    let _serial = SERIAL.lock().await;
    let settings = database().await;
    let tmp = tempfile::tempdir().unwrap();
    let assets = common::mira_assets(tmp.path());
    let (a, _) = bridge(&settings, &assets).await;
    let before = call(
        &a,
        "memory_write",
        json!({"content": "Before the restart."}),
    )
    .await
    .unwrap();
    assert_ne!(before.is_error, Some(true), "{before:?}");

    let cluster = pg::cluster();
    cluster.stop_server();
    let down = call(
        &a,
        "memory_write",
        json!({"content": "The gate is silver."}),
    )
    .await
    .unwrap();
    assert_eq!(
        down.is_error,
        Some(true),
        "a write while the database is down fails: {down:?}"
    );
    let text = format!("{:?}", down.content);
    assert!(
        text.contains("database"),
        "the error says what failed: {text}"
    );
    assert!(
        !text.contains("/tmp"),
        "no path in what the model sees: {text}"
    );

    cluster.start_server();
    // Pooled connections died with the server: a call may fail once more while the pool
    // replaces them, then the same bridge works again.
    let mut attempts = 0;
    let again = loop {
        attempts += 1;
        let r = call(
            &a,
            "memory_write",
            json!({"content": "The gate is silver."}),
        )
        .await
        .unwrap();
        if r.is_error != Some(true) || attempts == 5 {
            break r;
        }
    };
    assert_ne!(
        again.is_error,
        Some(true),
        "after {attempts} attempts: {again:?}"
    );
    // The model retries the write it saw fail: the same memory, not a second one.
    let retried = call(
        &a,
        "memory_write",
        json!({"content": "The gate is silver."}),
    )
    .await
    .unwrap();
    let retried = retried.structured_content.unwrap();
    assert_eq!(retried["deduplicated"], true, "{retried}");
    assert_eq!(retried["id"], again.structured_content.unwrap()["id"]);
    let found = call(&a, "memory_search", json!({"query": "gate silver"}))
        .await
        .unwrap();
    let items = found.structured_content.unwrap()["items"]
        .as_array()
        .unwrap()
        .clone();
    let gates = items
        .iter()
        .filter(|m| m["content"] == "The gate is silver.")
        .count();
    assert_eq!(gates, 1, "{items:?}");
    a.cancel().await.unwrap();
}
