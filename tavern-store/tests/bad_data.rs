//! Corrupt, torn and foreign data in a file store: reported by relative name, set aside or
//! skipped, never fatal; hostile names never escape the root.

use std::io::Write;
use std::sync::Arc;

use serde_json::json;
use tavern_core::{AgentId, CharacterName, ChatId, MemoryId, ScopeKey, SessionId};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::{write, T0};
use tavern_store::fs::FsStore;
use tavern_store::{
    ChatStore, CheckpointStore, MemoryQuery, MemoryStore, PromptStore, StateStore, StoreError,
};

fn open(dir: &tempfile::TempDir) -> FsStore {
    FsStore::open(dir.path(), Arc::new(ManualClock::new(T0))).unwrap()
}

fn agent() -> ScopeKey {
    ScopeKey::Agent {
        agent: AgentId::parse("a1").unwrap(),
    }
}

fn append_raw(dir: &tempfile::TempDir, file: &str, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join(file))
        .unwrap();
    f.write_all(bytes).unwrap();
}

fn no_absolute_paths(dir: &tempfile::TempDir, text: &str) {
    assert!(
        !text.contains(dir.path().to_str().unwrap()),
        "absolute path leaked: {text}"
    );
}

#[tokio::test]
async fn a_torn_tail_is_terminated_skipped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    s.put(write("m1", agent(), "before the crash"), None, false)
        .await
        .unwrap();
    drop(s);
    append_raw(
        &dir,
        "memory.log",
        b"0123456789abcdef {\"op\":\"put\",\"rec",
    );

    let s = open(&dir);
    assert!(
        s.diagnostics().is_empty(),
        "an unterminated tail may still be in flight"
    );
    s.put(write("m2", agent(), "after the crash"), None, false)
        .await
        .unwrap();
    assert_eq!(s.diagnostics().len(), 1, "{:?}", s.diagnostics());
    drop(s);

    let s = open(&dir);
    for id in ["m1", "m2"] {
        assert!(
            s.read(&MemoryId::parse(id).unwrap(), &agent())
                .await
                .unwrap()
                .is_some(),
            "{id}"
        );
    }
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1);
    assert_eq!(diags[0].file, "memory.log line 2");
    assert!(
        diags[0].message.contains("checksum"),
        "{}",
        diags[0].message
    );
    no_absolute_paths(&dir, &format!("{diags:?}"));
}

#[tokio::test]
async fn edited_and_foreign_lines_are_skipped_and_search_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    s.put(write("m1", agent(), "lantern keeper"), None, false)
        .await
        .unwrap();
    s.put(write("m2", agent(), "river spirit"), None, false)
        .await
        .unwrap();
    s.put(write("m3", agent(), "silver gate"), None, false)
        .await
        .unwrap();
    drop(s);
    let path = dir.path().join("memory.log");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("river spirit", "river spirjt")).unwrap();
    append_raw(&dir, "memory.log", b"hello from another program\n");

    let s = open(&dir);
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 2, "{diags:?}");
    assert_eq!(diags[0].file, "memory.log line 2");
    assert_eq!(diags[1].file, "memory.log line 4");
    let hits = s
        .search(&MemoryQuery::new("", vec![agent()]))
        .await
        .unwrap();
    let ids: Vec<&str> = hits.hits.iter().map(|h| h.record.id.as_str()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&"m1") && ids.contains(&"m3"));
    assert_eq!(
        s.search(&MemoryQuery::new("gate", vec![agent()]))
            .await
            .unwrap()
            .hits
            .len(),
        1
    );
}

#[tokio::test]
async fn corrupt_documents_are_set_aside_with_relative_names() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    std::fs::write(dir.path().join("state.json"), b"{not json").unwrap();
    let (state, diags) = s.load_state().await.unwrap();
    assert!(state.bindings.is_empty());
    assert!(
        diags[0].message.starts_with("state.json unreadable"),
        "{diags:?}"
    );
    assert!(
        dir.path()
            .join(format!("state.json.corrupt-{}", T0.0))
            .exists(),
        "kept for inspection"
    );
    no_absolute_paths(&dir, &format!("{diags:?}"));

    let sid = SessionId::parse("s1").unwrap();
    s.save_prompt(&sid, "custom").await.unwrap();
    let other = SessionId::parse("s2").unwrap();
    let prompts = dir.path().join("prompts");
    let file = std::fs::read_dir(&prompts)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // A record copied under another session's name must not be served for it.
    std::fs::copy(&file, prompts.join("_s2.json")).unwrap();
    assert_eq!(s.get_prompt(&other).await.unwrap(), None);
    assert_eq!(s.get_prompt(&sid).await.unwrap().unwrap().text, "custom");
    std::fs::write(&file, b"[]").unwrap();
    assert_eq!(s.get_prompt(&sid).await.unwrap(), None);

    std::fs::write(dir.path().join("checkpoints/_s1.json"), b"\xff\xfe").unwrap();
    assert_eq!(s.load_checkpoint(&sid).await.unwrap(), None);
    assert!(s.pending_checkpoints().await.unwrap().is_empty());
    let files: Vec<String> = s.diagnostics().into_iter().map(|d| d.file).collect();
    assert_eq!(
        files,
        [
            "state.json",
            "prompts/_s2.json",
            "prompts/_s1.json",
            "checkpoints/_s1.json"
        ]
    );
}

#[tokio::test]
async fn hostile_names_stay_inside_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let chat = ChatId::parse("chat 1").unwrap();
    let long = "名".repeat(128);
    for name in ["CON", "nul", "a:b", "<x>|?*", ".x", long.as_str()] {
        let ch = CharacterName::parse(name).unwrap();
        let line = tavern_core::chat::ChatLine::parse(&json!({"n": name}).to_string()).unwrap();
        s.rewrite_chat(&ch, &chat, std::slice::from_ref(&line), None)
            .await
            .unwrap();
        let back = s.read_chat(&ch, &chat).await.unwrap().unwrap();
        assert_eq!(back.lines, [line]);
        assert_eq!(
            s.list_chats(&ch).await.unwrap(),
            std::slice::from_ref(&chat)
        );
    }
    for entry in std::fs::read_dir(dir.path().join("chats")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        // Readable names with the unsafe parts escaped: nothing a file system refuses.
        assert!(name.len() <= 240, "{name}");
        assert!(
            !name.contains(['/', '\\', ':', '*', '?', '"', '<', '>', '|']),
            "{name}"
        );
        assert!(!name.starts_with('.') && !name.ends_with('.'), "{name}");
        let base = name.split('.').next().unwrap().to_lowercase();
        assert!(
            !["con", "nul", "prn", "aux"].contains(&base.as_str()),
            "{name}"
        );
    }
}

#[tokio::test]
async fn io_errors_name_files_relative_to_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let ch = CharacterName::parse("Mira").unwrap();
    let chat = ChatId::parse("c").unwrap();
    std::fs::create_dir_all(dir.path().join("chats/Mira/c.jsonl")).unwrap();
    let err = s.read_chat(&ch, &chat).await.unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(err.to_string().contains("chats/Mira/c.jsonl"), "{err}");
    no_absolute_paths(&dir, &err.to_string());
}

#[tokio::test]
async fn a_bulk_import_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    s.put(write("taken", agent(), "already here"), None, false)
        .await
        .unwrap();
    let batch = vec![
        write("new1", agent(), "one"),
        write("taken", agent(), "clash"),
    ];
    let err = s.import_memories(batch).unwrap_err();
    assert!(err.conflict_revision().is_some(), "{err}");
    let twice = vec![write("dup", agent(), "a"), write("dup", agent(), "b")];
    assert!(s
        .import_memories(twice)
        .unwrap_err()
        .to_string()
        .contains("twice"));
    drop(s);
    let s = open(&dir);
    assert_eq!(
        s.memory_len(),
        1,
        "nothing of the failed batches was written"
    );
    let ok = (0..5000)
        .map(|i| write(&format!("bulk{i}"), agent(), &format!("record {i} 记录")))
        .collect();
    assert_eq!(s.import_memories(ok).unwrap(), 5000);
    drop(s);
    // Reopening replays 5001 lines through the parallel parse and bulk index path.
    let s = open(&dir);
    assert_eq!(s.memory_len(), 5001);
    let hits = s
        .search(&MemoryQuery::new("记录 4999", vec![agent()]))
        .await
        .unwrap();
    assert_eq!(hits.hits[0].record.id.as_str(), "bulk4999");
    assert!(s.diagnostics().is_empty());
}

/// A large import is prepared in two halves on two threads: it refuses with the first bad
/// record in its own order (whichever half it is in), writes nothing then, and otherwise stores
/// exactly the records (revisions included) that writing them one by one stores.
#[tokio::test]
async fn a_large_import_refuses_in_order_and_stores_what_puts_store() {
    let writes = |bad: &[usize]| -> Vec<_> {
        (0..6000)
            .map(|i| {
                let mut w = write(&format!("m{i}"), agent(), &format!("record {i} 记录"));
                if bad.contains(&i) {
                    w.importance = 1.0 + i as f64;
                }
                w
            })
            .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    for bad in [vec![4500, 10], vec![4500], vec![2999, 3000]] {
        let err = s.import_memories(writes(&bad)).unwrap_err().to_string();
        let first = bad.iter().min().unwrap();
        // Each refusal names the value it refused; the first bad record is the one refused.
        let want = s
            .import_memories(vec![writes(&bad).remove(*first)])
            .unwrap_err();
        assert_eq!(err, want.to_string(), "{bad:?}");
    }
    assert_eq!(
        s.memory_len(),
        0,
        "nothing of the refused imports was written"
    );
    assert_eq!(s.import_memories(writes(&[])).unwrap(), 6000);

    let one_by_one = tempfile::tempdir().unwrap();
    let p = open(&one_by_one);
    for w in writes(&[]) {
        p.put(w, None, false).await.unwrap();
    }
    for i in [0, 2999, 3000, 5999] {
        let id = MemoryId::parse(format!("m{i}")).unwrap();
        assert_eq!(
            s.inspect(&id, &agent()).await.unwrap(),
            p.inspect(&id, &agent()).await.unwrap()
        );
    }
    let page = |r: tavern_store::MemorySearchResult| {
        r.hits
            .iter()
            .map(|h| format!("{}@{}/{}", h.record.id, h.score, h.record.revision))
            .collect::<Vec<_>>()
    };
    let q = MemoryQuery::new("记录 record 4321", vec![agent()]);
    assert_eq!(
        page(s.search(&q).await.unwrap()),
        page(p.search(&q).await.unwrap())
    );
}

#[tokio::test]
async fn temp_files_of_interrupted_writes_are_removed_when_stale() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(&dir));
    let stale = dir.path().join("prompts/.tmp-crashed");
    let fresh = dir.path().join(".tmp-in-flight");
    for p in [&stale, &fresh] {
        std::fs::write(p, b"partial").unwrap();
    }
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();
    let s = open(&dir);
    assert!(!stale.exists(), "a stale temp file is removed");
    assert!(
        fresh.exists(),
        "a fresh one may belong to another process and stays"
    );
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1);
    assert_eq!(diags[0].file, "prompts/.tmp-crashed");
}

/// A chat's head is read without the rest: blank lines before it are skipped as a whole read
/// skips them; a first line past the cap is refused with the limit named, not read whole; a
/// first line that is not one JSON object is corrupt, named by its line.
#[tokio::test]
async fn a_chat_head_is_read_alone_within_its_cap() {
    use tavern_store::chat::MAX_CHAT_HEAD_BYTES;
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (mira, id) = (
        CharacterName::parse("Mira").unwrap(),
        ChatId::parse("head").unwrap(),
    );
    let line =
        tavern_core::chat::ChatLine::parse(r#"{"name":"Kai","is_user":true,"mes":"hi"}"#).unwrap();
    store.rewrite_chat(&mira, &id, &[line], None).await.unwrap();
    let path = std::fs::read_dir(dir.path().join("chats").join("Mira"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .unwrap();
    std::fs::write(
        &path,
        "\n\r\n{\"chat_metadata\":{\"persona\":\"k.png\"}}\n{\"mes\":\"x\"}\n",
    )
    .unwrap();
    let head = store.read_chat_head(&mira, &id).await.unwrap().unwrap();
    assert_eq!(head.object()["chat_metadata"]["persona"], "k.png");
    assert_eq!(
        Some(head),
        store
            .read_chat(&mira, &id)
            .await
            .unwrap()
            .unwrap()
            .lines
            .into_iter()
            .next()
    );
    let mut huge = format!("{{\"mes\":\"{}", "a".repeat(MAX_CHAT_HEAD_BYTES));
    huge.push_str("\"}\n");
    std::fs::write(&path, huge).unwrap();
    let e = store.read_chat_head(&mira, &id).await.unwrap_err();
    assert!(matches!(e, StoreError::LimitExceeded { .. }), "{e}");
    std::fs::write(&path, "not json\n").unwrap();
    let e = store.read_chat_head(&mira, &id).await.unwrap_err();
    assert!(e.to_string().contains("line 1"), "{e}");
    no_absolute_paths(&dir, &e.to_string());
}
