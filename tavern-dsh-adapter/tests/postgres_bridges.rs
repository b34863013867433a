//! Two `tavern-bridge` processes on one PostgreSQL database (`--store`), serving different
//! sessions of one character, driven over MCP by the `rmcp` client: what one writes to the
//! character's scope the other finds, a chat's memories stay in that chat, forged ids are still
//! refused, and eight writers across the two processes racing compare-and-set on one variable
//! lose no increment. One bridge reaches the database over a unix socket, the other over TCP
//! with TLS (`sslmode=require`, `--store-ca-file`). The database is a throwaway cluster the test
//! starts.

mod common;
#[path = "../../tavern-store/tests/support/pg.rs"]
mod pg;

use std::path::Path;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

const BRIDGE: &str = env!("CARGO_BIN_EXE_tavern-bridge");

async fn bridge(settings: &str, assets: &Path, session: &str) -> RunningService<RoleClient, ()> {
    bridge_trusting(settings, None, assets, session).await
}

/// A bridge that also trusts the CA in `ca` (for `sslmode=require` settings).
async fn bridge_trusting(
    settings: &str,
    ca: Option<&Path>,
    assets: &Path,
    session: &str,
) -> RunningService<RoleClient, ()> {
    let mut command = Command::new(BRIDGE);
    command.arg("mcp").arg("--store").arg(settings);
    if let Some(ca) = ca {
        command.arg("--store-ca-file").arg(ca);
    }
    command
        .arg("--assets")
        .arg(assets)
        .args(["--session", session, "--character", "Mira"])
        .arg("--chat")
        .arg(format!("Mira - {session}"))
        .env("RUST_LOG", "warn");
    ().serve(TokioChildProcess::new(command).unwrap())
        .await
        .unwrap()
}

async fn call(peer: &Peer<RoleClient>, tool: &'static str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    peer.call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await
        .unwrap()
}

/// Adds one to the character's `visits`, retrying on conflicts; the revision it wrote.
async fn increment(peer: &Peer<RoleClient>) -> String {
    loop {
        let got = call(
            peer,
            "variable_get",
            json!({"name": "visits", "scope": "character"}),
        )
        .await;
        let got = got.structured_content.unwrap_or_default();
        let (value, revision) = match got.get("value") {
            Some(v) if got.get("error").is_none() => (v.as_i64().unwrap(), got["revision"].clone()),
            _ => (0, Value::Null),
        };
        let mut args = json!({"name": "visits", "scope": "character", "value": value + 1});
        if !revision.is_null() {
            args["revision"] = revision;
        }
        let set = call(peer, "variable_set", args).await;
        if set.is_error != Some(true) {
            let set = set.structured_content.unwrap();
            return set["revision"].as_str().unwrap().to_owned();
        }
        let text = format!("{:?}", set.content);
        assert!(
            text.contains("conflict"),
            "only conflicts are retried: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bridges_share_one_postgres_store() {
    let cluster = pg::cluster();
    let db = cluster.fresh_database().await;
    let settings = cluster.settings(db.get_dbname().unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let assets = common::mira_assets(tmp.path());
    let a = bridge(&settings, &assets, "host-a").await;
    // The second host reaches the database over TCP with TLS, trusting the deployment's CA.
    let over_tls = cluster.tcp_settings(db.get_dbname().unwrap(), "require");
    let b = bridge_trusting(&over_tls, Some(&cluster.ca_file()), &assets, "host-b").await;

    let shared = call(
        &a,
        "memory_write",
        json!({"content": "城门是银色的。", "scope": "character"}),
    )
    .await;
    assert_ne!(shared.is_error, Some(true), "{shared:?}");
    let private = call(
        &a,
        "memory_write",
        json!({"content": "The vault code is 4471."}),
    )
    .await;
    assert_ne!(private.is_error, Some(true), "{private:?}");

    let found = call(
        &b,
        "memory_search",
        json!({"query": "城门", "scopes": ["character"]}),
    )
    .await;
    let found = found.structured_content.unwrap().to_string();
    assert!(
        found.contains("城门是银色的"),
        "the other host finds the character's memory: {found}"
    );
    let hidden = call(&b, "memory_search", json!({"query": "vault code"})).await;
    let hidden = hidden.structured_content.unwrap().to_string();
    assert!(
        !hidden.contains("4471"),
        "a chat's memory stays in that chat: {hidden}"
    );
    let forged = call(
        &b,
        "memory_search",
        json!({"query": "vault", "sessionId": "host-a"}),
    )
    .await;
    assert_eq!(
        forged.is_error,
        Some(true),
        "a forged session is refused: {forged:?}"
    );

    // Eight writers, four through each process, five increments each.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let peer = if i % 2 == 0 {
            a.peer().clone()
        } else {
            b.peer().clone()
        };
        tasks.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for _ in 0..5 {
                revisions.push(increment(&peer).await);
            }
            revisions
        }));
    }
    let mut revisions = Vec::new();
    for t in tasks {
        revisions.extend(t.await.unwrap());
    }
    let distinct: std::collections::HashSet<_> = revisions.iter().collect();
    assert_eq!(
        distinct.len(),
        40,
        "every acknowledged write has its own revision"
    );
    for peer in [a.peer(), b.peer()] {
        let got = call(
            peer,
            "variable_get",
            json!({"name": "visits", "scope": "character"}),
        )
        .await;
        assert_eq!(
            got.structured_content.unwrap()["value"],
            40,
            "no increment is lost"
        );
    }
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

/// A bridge on a database of 5,000 memories answers its handshake before it reads them (in
/// the background, from `--store-image-dir` when an image is there), saves their image, and
/// the next bridge starts from it.
/// A fresh database holding 5,000 memories of Mira's (`第N盏灯笼… lantern N`), copied in
/// from a file store under `tmp`; its settings.
async fn database_of_lanterns(tmp: &Path) -> String {
    use tavern_core::{CharacterName, MemoryId, MemoryKind, MemorySource, MemoryWrite, ScopeKey};
    let cluster = pg::cluster();
    let db = cluster.fresh_database().await;
    let mira = ScopeKey::Character {
        character: CharacterName::parse("Mira").unwrap(),
    };
    let writes = (0..5000)
        .map(|i| MemoryWrite {
            id: MemoryId::parse(format!("m{i}")).unwrap(),
            scope: mira.clone(),
            kind: MemoryKind::Semantic,
            content: format!("第{i}盏灯笼挂在城门边 lantern {i}"),
            tags: Vec::new(),
            importance: 0.5,
            confidence: 0.9,
            source: MemorySource::system(),
            expires_at: None,
        })
        .collect();
    let clock = std::sync::Arc::new(tavern_store::SystemClock);
    let files = tavern_store::fs::FsStore::open(tmp.join("files"), clock.clone()).unwrap();
    files.import_memories(writes).unwrap();
    let target = cluster.open(&db, clock).await;
    tavern_store::copy_store(&files, &target).await.unwrap();
    cluster.settings(db.get_dbname().unwrap())
}

/// Starts a bridge over MCP with `flags` for `session` with Mira, its log on a pipe.
async fn mira_bridge(
    settings: &str,
    assets: &Path,
    session: &str,
    flags: &[&std::ffi::OsStr],
) -> (
    RunningService<RoleClient, ()>,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
) {
    let mut command = Command::new(BRIDGE);
    command
        .args(["mcp", "--store", settings])
        .args(flags)
        .arg("--assets")
        .arg(assets)
        .args(["--session", session, "--character", "Mira"])
        .arg("--chat")
        .arg(format!("Mira - {session}"))
        .env("RUST_LOG", "info");
    let (process, stderr) = TokioChildProcess::builder(command)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let b = ().serve(process).await.unwrap();
    (b, tokio::io::BufReader::new(stderr.unwrap()).lines())
}

/// The bridge's log up to its line saying the memories are loaded.
async fn log_until_loaded(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
) -> String {
    let mut log = String::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        log.push_str(&line);
        log.push('\n');
        if line.contains("memories loaded") {
            break;
        }
    }
    assert!(log.contains("memories loaded"), "{log}");
    log
}

/// A bridge on a database of 5,000 memories answers its handshake before it reads them (in
/// the background, from `--store-image-dir` when an image is there), saves their image, and
/// the next bridge starts from it.
#[tokio::test]
async fn bridges_keep_an_image_of_the_memories_in_the_image_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let assets = common::mira_assets(tmp.path());
    let settings = database_of_lanterns(tmp.path()).await;
    let images = tmp.path().join("images");
    for (session, first) in [("host-a", true), ("host-b", false)] {
        let flags = ["--store-image-dir".as_ref(), images.as_os_str()];
        let (b, mut lines) = mira_bridge(&settings, &assets, session, &flags).await;
        let found = call(
            &b,
            "memory_search",
            json!({"query": "lantern 4321", "scopes": ["character"]}),
        )
        .await;
        let found = found.structured_content.unwrap().to_string();
        assert!(found.contains("第4321盏灯笼"), "{found}");
        // The memories are read in the background after the handshake: the bridge says when
        // they are, and how long it took; by then the first start saved their image.
        let log = log_until_loaded(&mut lines).await;
        assert!(log.contains("records=5000"), "{log}");
        // The second start read the first one's image: no row was fetched.
        let rows = if first { "rows=5000" } else { "rows=0" };
        assert!(log.contains(rows), "{log}");
        assert!(!log.contains("WARN") && !log.contains("ERROR"), "{log}");
        assert!(images.join("memory.image").is_file(), "{first} {log}");
        b.cancel().await.unwrap();
    }

    // A host that leaves at once (stdin closed before anything is asked): the bridge exits
    // only once the memories it was reading in the background are read and imaged.
    std::fs::remove_file(images.join("memory.image")).unwrap();
    let quick = std::process::Command::new(BRIDGE)
        .args(["--store", &settings, "--store-image-dir"])
        .arg(&images)
        .arg("--assets")
        .arg(&assets)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        quick.status.success(),
        "{}",
        String::from_utf8_lossy(&quick.stderr)
    );
    assert!(
        images.join("memory.image").is_file(),
        "{}",
        String::from_utf8_lossy(&quick.stderr)
    );
}

/// A bridge told to hold memories by scope reads none at start, loads the scope a call needs
/// (far more than its bound: the call still gets every one of them), and refuses an image
/// directory beside it.
#[tokio::test]
async fn a_bridge_holding_memories_by_scope_loads_what_its_session_uses() {
    let tmp = tempfile::tempdir().unwrap();
    let assets = common::mira_assets(tmp.path());
    let settings = database_of_lanterns(tmp.path()).await;
    let flags = ["--store-max-loaded-memories".as_ref(), "100".as_ref()];
    let (b, mut lines) = mira_bridge(&settings, &assets, "host-a", &flags).await;
    let log = log_until_loaded(&mut lines).await;
    assert!(log.contains("records=0"), "{log}");
    for n in [4321, 7] {
        let found = call(
            &b,
            "memory_search",
            json!({"query": format!("lantern {n}"), "scopes": ["character"]}),
        )
        .await;
        let found = found.structured_content.unwrap().to_string();
        assert!(found.contains(&format!("第{n}盏灯笼")), "{found}");
    }
    b.cancel().await.unwrap();

    let both = std::process::Command::new(BRIDGE)
        .args(["--store", &settings, "--store-max-loaded-memories", "10"])
        .args(["--store-image-dir", "images"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!both.status.success());
    let err = String::from_utf8_lossy(&both.stderr);
    assert!(
        err.contains("--store-max-loaded-memories") && err.contains("--store-image-dir"),
        "{err}"
    );
}

#[test]
fn an_unreachable_store_is_one_clear_line_without_the_password() {
    for settings in [
        "postgres://tavern:s3cret-pw@127.0.0.1:1/tavern",
        "not a url s3cret-pw=",
    ] {
        let out = std::process::Command::new(BRIDGE)
            .args(["mcp", "--session", "s-1", "--store", settings])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.to_lowercase().contains("error"), "{stderr}");
        assert!(
            !stderr.contains("s3cret-pw"),
            "the password leaked: {stderr}"
        );
    }
}
