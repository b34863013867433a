//! The file store against a hostile data folder: files replaced by directories or FIFOs,
//! folders replaced by files, a full disk. It opens, reports by relative name, keeps serving
//! what it can, and no error it returns shows an absolute path.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tavern_core::chat::ChatLine;
use tavern_core::{
    AgentId, CharacterName, ChatId, MemoryId, MemoryKind, MemorySource, MemoryWrite, ScopeKey,
    SessionId, Timestamp, VariableName,
};
use tavern_store::clock::ManualClock;
use tavern_store::fs::FsStore;
use tavern_store::{
    ChatStore, CheckpointStatus, CheckpointStore, MemoryStore, ProjectorCheckpoint, PromptStore,
    StateStore, StateStoreExt, StoreError, VariableStore,
};

fn open(root: &Path) -> FsStore {
    FsStore::open(
        root,
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .unwrap()
}

fn memory(id: &str) -> MemoryWrite {
    MemoryWrite {
        id: MemoryId::parse(id).unwrap(),
        scope: ScopeKey::Agent {
            agent: AgentId::parse("a").unwrap(),
        },
        kind: MemoryKind::Semantic,
        content: format!("fact {id}"),
        tags: Vec::new(),
        importance: 0.5,
        confidence: 0.5,
        source: MemorySource::system(),
        expires_at: None,
    }
}

fn checkpoint(session: &str) -> ProjectorCheckpoint {
    ProjectorCheckpoint {
        session_id: SessionId::parse(session).unwrap(),
        last_cursor: Some(1),
        status: CheckpointStatus::Pending,
        pending_cursor: Some(2),
        error: Some("x".into()),
        chat_revision: None,
        turn: 0,
        step: 0,
        updated_at: Timestamp(1),
    }
}

/// Replaces a directory of the store with a plain file.
fn block_dir(root: &Path, rel: &str) {
    std::fs::remove_dir_all(root.join(rel)).unwrap();
    std::fs::write(root.join(rel), b"in the way").unwrap();
}

/// Every error path that builds a file name — temporary files included — names the file
/// relative to the root and never shows where the root is.
#[tokio::test]
async fn errors_never_show_an_absolute_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let s = open(root);
    let abs = root.to_str().unwrap().to_owned();
    let mut errors: Vec<(&str, StoreError)> = Vec::new();

    block_dir(root, "prompts");
    errors.push((
        "prompts/",
        s.save_prompt(&SessionId::parse("s1").unwrap(), "hello")
            .await
            .unwrap_err(),
    ));
    block_dir(root, "checkpoints");
    errors.push((
        "checkpoints/",
        s.save_checkpoint(&checkpoint("s1"), None)
            .await
            .unwrap_err(),
    ));
    errors.push(("checkpoints", s.pending_checkpoints().await.unwrap_err()));
    block_dir(root, "chats");
    let line = ChatLine::parse(r#"{"user_name":"Kai"}"#).unwrap();
    errors.push((
        "chats/",
        s.rewrite_chat(
            &CharacterName::parse("Mira").unwrap(),
            &ChatId::parse("Mira - 1").unwrap(),
            &[line],
            None,
        )
        .await
        .unwrap_err(),
    ));
    std::fs::remove_file(root.join("state.lock")).ok();
    std::fs::create_dir(root.join("state.lock")).unwrap();
    errors.push((
        "state.lock",
        s.update(|_| Ok::<_, StoreError>(())).await.unwrap_err(),
    ));
    std::fs::remove_file(root.join("memory.log.lock")).ok();
    std::fs::create_dir(root.join("memory.log.lock")).unwrap();
    errors.push((
        "memory.log.lock",
        s.put(memory("m1"), None, false).await.unwrap_err(),
    ));
    for (name, e) in errors {
        let text = e.to_string();
        assert!(!text.contains(&abs), "{name}: {text}");
        assert!(text.contains(name), "{name} is named: {text}");
    }
}

/// Logs and documents that are directories or FIFOs are set aside and reported; the store
/// opens (promptly: a FIFO is never opened) and serves everything else.
#[tokio::test]
async fn special_files_are_set_aside_and_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    {
        let s = open(&root);
        s.put(memory("kept"), None, false).await.unwrap();
        s.save_checkpoint(&checkpoint("good"), None).await.unwrap();
    }
    // memory.log becomes a FIFO, variables.log a directory, state.json a directory, one
    // checkpoint a directory.
    std::fs::rename(root.join("memory.log"), root.join("memory.log.bak")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(root.join("memory.log"))
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo is needed for this test");
    std::fs::remove_file(root.join("variables.log")).unwrap();
    std::fs::create_dir(root.join("variables.log")).unwrap();
    std::fs::create_dir(root.join("state.json")).unwrap();
    std::fs::create_dir(root.join("checkpoints/_bad.json")).unwrap();

    // Opening must not block on the FIFO: it runs on its own thread, bounded by a timeout.
    let (tx, rx) = std::sync::mpsc::channel();
    let r = root.clone();
    std::thread::spawn(move || tx.send(open(&r)).unwrap());
    let s = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("opening a store with a FIFO for a log returned");
    let reported: Vec<String> = s.diagnostics().into_iter().map(|d| d.file).collect();
    for name in ["memory.log", "variables.log"] {
        assert!(reported.iter().any(|f| f == name), "{name} in {reported:?}");
    }
    // Everything else still works.
    s.put(memory("new"), None, false).await.unwrap();
    let var = VariableName::parse("hp").unwrap();
    s.set(
        &ScopeKey::Global,
        &var,
        serde_json::json!(1),
        None,
        MemorySource::system(),
    )
    .await
    .unwrap();
    let (state, diags) = s.load_state().await.unwrap();
    assert!(state.bindings.is_empty());
    assert!(
        diags.iter().any(|d| d.message.contains("state.json")),
        "{diags:?}"
    );
    let pending = s.pending_checkpoints().await.unwrap();
    assert_eq!(pending.len(), 1, "the readable checkpoint is still listed");
    assert_eq!(pending[0].session_id.as_str(), "good");
    assert!(s
        .diagnostics()
        .iter()
        .any(|d| d.file == "checkpoints/_bad.json"));
}

/// Reading a memory records its access time; on a full disk that record is skipped and the
/// read still answers.
#[tokio::test]
async fn a_read_works_on_a_full_disk() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let kept = s.put(memory("m1"), None, false).await.unwrap();
    s.fail_next_write();
    let read = s.read(&kept.id, &kept.scope).await.unwrap().unwrap();
    assert_eq!(read.content, kept.content);
    assert!(s
        .diagnostics()
        .iter()
        .any(|d| d.message.contains("access time not recorded")));
    s.fail_next_write();
    let failed = s.put(memory("m2"), None, false).await.unwrap_err();
    assert!(failed.to_string().contains("memory.log"), "{failed}");
    assert!(s
        .read(&MemoryId::parse("m2").unwrap(), &kept.scope)
        .await
        .unwrap()
        .is_none());
}
