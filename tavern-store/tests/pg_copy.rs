//! Copying a whole store between backends (`tavern_store::copy_store`): a file store with
//! every kind of data — updated, forgotten and expiring memories, variables with tombstones
//! and cleared scopes, SillyTavern chats (Chinese, emoji, a swipe array), state bindings,
//! projector checkpoints and prompts — copied into PostgreSQL and back into a new file store
//! is identical in each, revisions and audit trails included; a target that is not empty is
//! refused before anything is written.

#[path = "support/pg.rs"]
mod pg_support;

use std::sync::Arc;

use serde_json::json;
use tavern_core::chat::ChatLine;
use tavern_core::{
    AgentId, CharacterName, ChatId, MemoryId, MemorySource, ScopeKey, SessionId, VariableName,
};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::{write, T0};
use tavern_store::fs::FsStore;
use tavern_store::{
    copy_store, ChatStore, CheckpointStatus, CheckpointStore, MemoryQuery, MemoryStore,
    ProjectorCheckpoint, PromptStore, StateStore, Transfer, VariableStore,
};

const CHAT: &[&str] = &[
    r#"{"user_name":"Kai","character_name":"Mira","create_date":"2024-05-01@12h00m00s","chat_metadata":{"note_prompt":""}}"#,
    r#"{"name":"Mira","is_user":false,"send_date":"May 1, 2024 12:00pm","mes":"门开了。✨ The gate opens.","swipes":["门开了。✨ The gate opens.","Nothing moves."],"swipe_id":0}"#,
    r#"{"name":"Kai","is_user":true,"send_date":"May 1, 2024 12:01pm","mes":"I step through \"carefully\"\n— slowly."}"#,
];

fn agent(id: &str) -> ScopeKey {
    ScopeKey::Agent {
        agent: AgentId::parse(id).unwrap(),
    }
}

async fn fill(store: &FsStore) {
    let a = agent("a1");
    let m = store
        .put(
            write("gate", a.clone(), "the silver gate opens at dawn"),
            None,
            false,
        )
        .await
        .unwrap();
    store
        .put(
            write("gate", a.clone(), "the silver gate is shut"),
            Some(&m.revision),
            false,
        )
        .await
        .unwrap();
    let gone = store
        .put(write("coin", a.clone(), "a copper coin"), None, false)
        .await
        .unwrap();
    store
        .forget(&gone.id, &a, &gone.revision, MemorySource::system())
        .await
        .unwrap();
    store
        .put(write("moon", a.clone(), "月亮很亮"), None, false)
        .await
        .unwrap();
    let hp = VariableName::parse("hp").unwrap();
    let v = store
        .set(&a, &hp, json!(7), None, MemorySource::system())
        .await
        .unwrap();
    store
        .set(
            &a,
            &hp,
            json!({"now": 6, "max": 9}),
            Some(&v.revision),
            MemorySource::system(),
        )
        .await
        .unwrap();
    let b = agent("a2");
    store
        .set(
            &b,
            &VariableName::parse("mp").unwrap(),
            json!(1),
            None,
            MemorySource::system(),
        )
        .await
        .unwrap();
    store.clear_scope(&b, MemorySource::system()).await.unwrap();
    let lines: Vec<ChatLine> = CHAT.iter().map(|l| ChatLine::parse(l).unwrap()).collect();
    let mira = CharacterName::parse("Mira").unwrap();
    store
        .rewrite_chat(
            &mira,
            &ChatId::parse("Mira - 2024-05-01@12h00m00s").unwrap(),
            &lines,
            None,
        )
        .await
        .unwrap();
    let session = SessionId::parse("s1").unwrap();
    store
        .update_state(&mut |st| {
            let target = tavern_core::BindingTarget {
                character: mira.clone(),
                chat_id: ChatId::parse("Mira - 2024-05-01@12h00m00s").unwrap(),
                group: false,
            };
            let bnd = tavern_core::SessionBinding::new_for_chat(target, st);
            st.set_binding(session.clone(), bnd);
            tavern_store::Verdict::Write
        })
        .await
        .unwrap();
    let cp = ProjectorCheckpoint {
        session_id: session.clone(),
        last_cursor: Some(3),
        status: CheckpointStatus::Ok,
        pending_cursor: None,
        error: None,
        chat_revision: None,
        turn: 2,
        step: 1,
        updated_at: T0,
    };
    store.save_checkpoint(&cp, None).await.unwrap();
    store
        .save_prompt(&session, "扮演 Mira，简洁。")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_store_copied_into_postgres_and_back_is_identical() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    let source = FsStore::open(dir.path().join("a"), clock.clone()).unwrap();
    fill(&source).await;

    let pg = cluster.open(&config, clock.clone()).await;
    let there = copy_store(&source, &pg).await.unwrap();
    assert_eq!(
        (
            there.memories,
            there.variable_scopes,
            there.chats,
            there.chat_lines
        ),
        (3, 2, 1, 3)
    );
    assert_eq!((there.checkpoints, there.prompts), (1, 1));

    // What the copy holds, seen through the ports of another process on that database.
    let other = cluster.open(&config, clock.clone()).await;
    let a = agent("a1");
    let hits = other
        .search(&MemoryQuery::new("silver gate", vec![a.clone()]))
        .await
        .unwrap()
        .hits;
    assert_eq!(hits[0].record.content, "the silver gate is shut");
    let gate = MemoryId::parse("gate").unwrap();
    assert_eq!(
        other.memory_audit(&a, Some(&gate)).await.unwrap(),
        source.memory_audit(&a, Some(&gate)).await.unwrap()
    );
    let mira = CharacterName::parse("Mira").unwrap();
    let chat = ChatId::parse("Mira - 2024-05-01@12h00m00s").unwrap();
    let raw: Vec<String> = other
        .read_chat(&mira, &chat)
        .await
        .unwrap()
        .unwrap()
        .lines
        .iter()
        .map(|l| l.raw().to_owned())
        .collect();
    assert_eq!(raw, CHAT);
    // The same bytes, the same revision: checkpoints naming it stay current.
    assert!(there.reformatted.is_empty(), "{:?}", there.reformatted);
    assert_eq!(
        other.chat_revision(&mira, &chat).await.unwrap(),
        source.chat_revision(&mira, &chat).await.unwrap()
    );

    // And back into a new file store: identical to the original.
    let back = FsStore::open(dir.path().join("b"), clock.clone()).unwrap();
    let again = copy_store(&other, &back).await.unwrap();
    assert_eq!(again, there);
    let bytes = |p: std::path::PathBuf| std::fs::read(p).unwrap();
    assert_eq!(
        bytes(
            dir.path()
                .join("a/chats/Mira/Mira - 2024-05-01@12h00m00s.jsonl")
        ),
        bytes(
            dir.path()
                .join("b/chats/Mira/Mira - 2024-05-01@12h00m00s.jsonl")
        )
    );
    let session = SessionId::parse("s1").unwrap();
    assert_eq!(
        back.get_prompt(&session).await.unwrap(),
        source.get_prompt(&session).await.unwrap()
    );
    assert_eq!(
        back.load_state().await.unwrap().0,
        source.load_state().await.unwrap().0
    );
    let hp = VariableName::parse("hp").unwrap();
    assert_eq!(
        back.get(&a, &hp).await.unwrap(),
        source.get(&a, &hp).await.unwrap()
    );
    assert_eq!(
        back.variable_audit(&agent("a2")).await.unwrap(),
        source.variable_audit(&agent("a2")).await.unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_is_not_empty_is_refused_untouched() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    let source = FsStore::open(dir.path().join("a"), clock.clone()).unwrap();
    fill(&source).await;
    let pg = cluster.open(&config, clock.clone()).await;
    let mine = pg
        .put(write("mine", agent("a9"), "already here"), None, false)
        .await
        .unwrap();
    let err = copy_store(&source, &pg).await.unwrap_err();
    assert!(
        err.to_string().contains("not empty") || err.to_string().contains("empty store"),
        "{err}"
    );
    let dump = pg.dump_tables().await.unwrap();
    assert_eq!((dump.memory_records(), dump.variable_scopes()), (1, 0));
    assert_eq!(
        pg.read(&mine.id, &agent("a9"))
            .await
            .unwrap()
            .unwrap()
            .content,
        "already here"
    );
    // A file store with a chat only is not empty either.
    let target = FsStore::open(dir.path().join("c"), clock).unwrap();
    let header = ChatLine::parse(CHAT[0]).unwrap();
    target
        .rewrite_chat(
            &CharacterName::parse("Kai").unwrap(),
            &ChatId::parse("x").unwrap(),
            &[header],
            None,
        )
        .await
        .unwrap();
    let err = copy_store(&source, &target).await.unwrap_err();
    assert!(err.to_string().contains("chats of Kai"), "{err}");
    assert!(target.dump_tables().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_copied_is_reported_and_a_prompt_is_never_overwritten() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    let source = FsStore::open(dir.path().join("a"), clock.clone()).unwrap();
    fill(&source).await;
    // A chat file without a single line (a store cannot hold one) and an unreadable
    // checkpoint: both named in the report, the rest copied and verified.
    std::fs::write(dir.path().join("a/chats/Mira/empty.jsonl"), "").unwrap();
    // A chat saved with Windows line ends: copied as its lines, and said so.
    std::fs::write(
        dir.path().join("a/chats/Mira/crlf.jsonl"),
        "{\"user_name\":\"Kai\"}\r\n{\"name\":\"Kai\",\"mes\":\"hi\"}\r\n",
    )
    .unwrap();
    let broken = SessionId::parse("s2").unwrap();
    source
        .save_checkpoint(
            &ProjectorCheckpoint {
                session_id: broken.clone(),
                last_cursor: None,
                status: CheckpointStatus::Ok,
                pending_cursor: None,
                error: None,
                chat_revision: None,
                turn: 0,
                step: 0,
                updated_at: T0,
            },
            None,
        )
        .await
        .unwrap();
    let cp_files: Vec<_> = std::fs::read_dir(dir.path().join("a/checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("s2.json"))
        .collect();
    std::fs::write(&cp_files[0], "{ not json").unwrap();
    let pg = cluster.open(&config, clock.clone()).await;
    let report = copy_store(&source, &pg).await.unwrap();
    assert_eq!(report.chats, 2);
    assert_eq!(report.checkpoints, 1);
    assert_eq!(report.reformatted.len(), 1, "{:?}", report.reformatted);
    assert!(
        report.reformatted[0].starts_with("chat crlf of Mira (line ends"),
        "{:?}",
        report.reformatted
    );
    assert_eq!(
        report.skipped,
        [
            "chat empty of Mira (no lines)".to_owned(),
            "checkpoint of session s2 (unreadable)".to_owned()
        ]
    );
    // Loading a prompt over an existing one is a conflict, never an overwrite.
    let session = SessionId::parse("s1").unwrap();
    let mut other = pg.get_prompt(&session).await.unwrap().unwrap();
    other.text = "something else".into();
    assert!(pg.load_prompt(&other).await.unwrap_err().is_conflict());
    assert_eq!(
        pg.get_prompt(&session).await.unwrap().unwrap().text,
        "扮演 Mira，简洁。"
    );
    assert!(source.load_prompt(&other).await.unwrap_err().is_conflict());
}
