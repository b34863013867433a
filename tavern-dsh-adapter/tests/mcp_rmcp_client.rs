//! MCP mode driven by the Rust `rmcp` client over a child process, as a Rust harness would:
//! the handshake, every tool with an output schema, structured results that match it, more
//! calls than any per-turn limit allows, a forget with the revision the write returned, and an
//! unknown tool refused at the protocol level.

use std::path::Path;

use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Map, Value};
use tokio::process::Command;

const BRIDGE: &str = env!("CARGO_BIN_EXE_tavern-bridge");

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments must be an object, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rmcp_client_works_against_mcp_mode() {
    let dir = tempfile::tempdir().unwrap();
    let assets = dir.path().join("assets");
    std::fs::create_dir_all(assets.join("characters")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/assets/Mira.card.json"),
        assets.join("characters/Mira.json"),
    )
    .unwrap();
    let mut command = Command::new(BRIDGE);
    command
        .arg("mcp")
        .arg("--data")
        .arg(dir.path().join("data"))
        .arg("--assets")
        .arg(&assets)
        .args([
            "--session",
            "rs-1",
            "--character",
            "Mira",
            "--chat",
            "Mira - rs",
        ])
        .env("RUST_LOG", "warn");
    let client = ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap();

    let info = client.peer_info().expect("the server answered initialize");
    let server = info
        .server_info
        .as_ref()
        .expect("initialize names the server");
    assert_eq!(server.name, "agent-tavern");

    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(
        tools.len(),
        14,
        "{:?}",
        tools.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    for tool in &tools {
        assert!(
            tool.output_schema.is_some(),
            "{} has no outputSchema",
            tool.name
        );
        assert!(
            tool.annotations.is_some(),
            "{} has no annotations",
            tool.name
        );
    }

    let wrote = client
        .call_tool(
            CallToolRequestParams::new("memory_write")
                .with_arguments(args(json!({"content": "灯笼是蓝色的。"}))),
        )
        .await
        .unwrap();
    assert_ne!(wrote.is_error, Some(true), "{wrote:?}");
    let memory = wrote
        .structured_content
        .expect("memory_write has structuredContent");
    assert!(
        memory["id"].is_string() && memory["revision"].is_string(),
        "{memory}"
    );

    let forgot = client
        .call_tool(
            CallToolRequestParams::new("memory_forget").with_arguments(args(
                json!({"id": memory["id"], "revision": memory["revision"]}),
            )),
        )
        .await
        .unwrap();
    assert_ne!(forgot.is_error, Some(true), "{forgot:?}");

    // Far past the per-turn limit (32): MCP mode has no turns, so no call may be refused for it.
    for i in 0..100 {
        let listed = client
            .call_tool(CallToolRequestParams::new("variable_list"))
            .await
            .unwrap();
        assert_ne!(listed.is_error, Some(true), "call {i}: {listed:?}");
    }

    let unknown = client
        .call_tool(CallToolRequestParams::new("no_such_tool"))
        .await;
    assert!(
        unknown.is_err(),
        "an unknown tool must be a protocol error: {unknown:?}"
    );

    client.cancel().await.unwrap();
}
