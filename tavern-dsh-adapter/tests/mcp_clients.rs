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
const TOOLS: [&str; 2] = ["jsonschema==4.26.0", "regress==2026.9.1"];

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
