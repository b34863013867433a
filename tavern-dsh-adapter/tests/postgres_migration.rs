//! A deployment moving from the file store to PostgreSQL mid-conversation (`copy_store`, as
//! `tavern copy` does): the session goes on against the database with the projector
//! checkpoints copied from the file store — whose chat revisions are the database's for the
//! same bytes — and the chat gets the next turn's lines exactly once, nothing lost, nothing
//! doubled; the memory written before the move is found after it.

mod common;
#[path = "../../tavern-store/tests/support/pg.rs"]
mod pg;

use std::sync::Arc;

use common::{rc6, World};
use serde_json::json;
use tavern_core::{AgentId, CharacterName, ChatId};
use tavern_dsh_adapter::fake::{FakeHost, ModelStep, ToolCallPlan};
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_store::{copy_store, ChatStore, CheckpointStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_goes_on_after_its_store_moved_to_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let agent = w.session("s1", "c1").await;
    w.host.script([
        ModelStep::Tools(vec![ToolCallPlan::new(
            "memory_write",
            json!({"content": "Kai keeps a blue lantern."}),
        )]),
        ModelStep::Reply("I will remember the lantern.".into()),
    ]);
    w.host
        .run_turn(&w.runtime, &agent, "My lantern is blue.")
        .await
        .unwrap();
    let before = w.chat("c1").await;
    assert!(
        before.iter().any(|(_, t)| t == "My lantern is blue."),
        "{before:?}"
    );

    // The move: everything copied and verified, then the host restarts on the database.
    let cluster = pg::cluster();
    let config = cluster.fresh_database().await;
    let db = Arc::new(cluster.open(&config, w.clock.clone()).await);
    copy_store(w.store.as_ref(), db.as_ref()).await.unwrap();
    // The checkpoint names the file store's revision of the chat: the database's too.
    let (seraphina, c1) = (
        CharacterName::parse("Seraphina").unwrap(),
        ChatId::parse("c1").unwrap(),
    );
    let checkpoint = db
        .load_checkpoint(&tavern_core::SessionId::parse("s1").unwrap())
        .await
        .unwrap()
        .unwrap();
    let moved = db.chat_revision(&seraphina, &c1).await.unwrap().unwrap();
    assert_eq!(checkpoint.chat_revision.as_deref(), Some(moved.as_str()));
    assert_eq!(
        w.store.chat_revision(&seraphina, &c1).await.unwrap(),
        Some(moved)
    );
    let host = Arc::new(FakeHost::open(dir.path().join("host"), rc6()).unwrap());
    let runtime = Runtime::new(
        host.clone(),
        db.clone(),
        common::assets(),
        w.clock.clone(),
        RuntimeConfig {
            user_name: "Kai".into(),
            ..RuntimeConfig::default()
        },
    );
    let agent = AgentId::parse("s1").unwrap();
    host.create_agent(&runtime, &agent).await.unwrap();
    host.script([
        ModelStep::Tools(vec![ToolCallPlan::new(
            "memory_search",
            json!({"query": "lantern"}),
        )]),
        ModelStep::Reply("Your lantern is blue.".into()),
    ]);
    let r = host
        .run_turn(&runtime, &agent, "What colour is my lantern?")
        .await
        .unwrap();
    assert!(r.projection_errors.is_empty(), "{:?}", r.projection_errors);
    let found = host.log(&tavern_core::SessionId::parse("s1").unwrap());
    assert!(
        found
            .iter()
            .any(|e| e.to_string().contains("Kai keeps a blue lantern.")),
        "the memory written before the move is found after it"
    );

    let file = db
        .read_chat(
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("c1").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    let after: Vec<(bool, String)> = file
        .lines
        .iter()
        .skip(1)
        .map(|l| (l.is_user(), l.text().to_owned()))
        .collect();
    assert_eq!(
        after[..before.len()],
        before[..],
        "the copied lines, unchanged"
    );
    let added: Vec<&str> = after[before.len()..]
        .iter()
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(
        added,
        ["What colour is my lantern?", "Your lantern is blue."]
    );
}
