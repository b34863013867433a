//! A data folder written by a version whose chat revisions were not content digests (`c1-…`,
//! persisted in projector checkpoints): the session goes on after the upgrade and its chat gets
//! the next turn's lines exactly once — the unknown revision makes the projector read the chat
//! once, nothing doubled, nothing lost — and the checkpoint then names a content revision.

mod common;

use common::{rc6, World};
use tavern_core::{CharacterName, ChatId, SessionId};
use tavern_dsh_adapter::fake::ModelStep;
use tavern_store::{ChatRevision, ChatStore, CheckpointStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_with_an_old_revision_format_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let agent = w.session("s1", "c1").await;
    w.host
        .script([ModelStep::Reply("The lantern is blue.".into())]);
    w.host
        .run_turn(&w.runtime, &agent, "What colour is my lantern?")
        .await
        .unwrap();
    let before = w.chat("c1").await;
    // The greeting, the question, the answer.
    assert_eq!(before.len(), 3, "{before:?}");

    // What the earlier version persisted: an inode/mtime revision of the same file.
    let session = SessionId::parse("s1").unwrap();
    let saved = w.store.load_checkpoint(&session).await.unwrap().unwrap();
    let mut old = saved.clone();
    old.chat_revision = Some("c1-1234-5678-1764583200000000000-0123456789abcdef".into());
    w.store.save_checkpoint(&old, Some(&saved)).await.unwrap();

    // The upgraded version starts on that folder.
    drop(w);
    let w = World::open(dir.path(), rc6());
    w.host.create_agent(&w.runtime, &agent).await.unwrap();
    w.host.script([ModelStep::Reply("Still blue.".into())]);
    let r = w
        .host
        .run_turn(&w.runtime, &agent, "And now?")
        .await
        .unwrap();
    assert!(r.projection_errors.is_empty(), "{:?}", r.projection_errors);
    let after = w.chat("c1").await;
    assert_eq!(after[..3], before[..], "the earlier lines, once");
    let added: Vec<&str> = after[3..].iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(added, ["And now?", "Still blue."]);

    let (seraphina, c1) = (
        CharacterName::parse("Seraphina").unwrap(),
        ChatId::parse("c1").unwrap(),
    );
    let file = w.store.read_chat(&seraphina, &c1).await.unwrap().unwrap();
    assert_eq!(file.revision, ChatRevision::of_lines(&file.lines));
    let now = w.store.load_checkpoint(&session).await.unwrap().unwrap();
    assert_eq!(now.chat_revision.as_deref(), Some(file.revision.as_str()));
}
