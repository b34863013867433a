//! `PgStore` against a real PostgreSQL (feature `postgres`): several stores with their own
//! pools on one database behave as several processes would — writes through one are seen by
//! the next read through another, racing CAS writers lose nothing and win once per revision —
//! plus what only a database adapter has: schema versions, credentials kept out of errors,
//! chat lines byte for byte, and the same search ranking as the file store.

#[path = "support/pg.rs"]
mod pg_support;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use serde_json::json;
use tavern_core::chat::ChatLine;
use tavern_core::{
    AgentId, AuditAction, CharacterName, ChatId, MemoryId, MemorySource, Revision, ScopeKey,
    SessionId, VariableName,
};
use tavern_store::clock::{Clock, ManualClock};
use tavern_store::conformance::{write, T0};
use tavern_store::fs::FsStore;
use tavern_store::pg::{PgConfig, PgLimits, PgStore, PgTls, SCHEMA_VERSION};
use tavern_store::{
    ChatChange, ChatRevision, ChatStore, CheckpointStatus, CheckpointStore, MemoryQuery,
    MemoryStore, ProjectorCheckpoint, PromptStore, StateStore, StoreError, Transfer, VariableStore,
};

fn agent(id: &str) -> ScopeKey {
    ScopeKey::Agent {
        agent: AgentId::parse(id).unwrap(),
    }
}

fn var(n: &str) -> VariableName {
    VariableName::parse(n).unwrap()
}

/// Two stores on one fresh database, the second deciding every write that lost a race under
/// the table lock at once (`unlocked_attempts: 0`): racing writers take both paths.
async fn two_racing_stores() -> (PgStore, PgStore) {
    let (a, _, config, clock) = two_stores().await;
    let locked = PgLimits {
        unlocked_attempts: 0,
        ..PgLimits::default()
    };
    let b = PgStore::open_with_limits(config, &PgTls::default(), clock, 8, locked)
        .await
        .unwrap();
    (a, b)
}

/// Two stores (separate pools, separate in-process tables) on one fresh database.
async fn two_stores() -> (PgStore, PgStore, PgConfig, Arc<ManualClock>) {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let clock = Arc::new(ManualClock::new(T0));
    let a = cluster.open(&config, clock.clone()).await;
    let b = cluster.open(&config, clock.clone()).await;
    (a, b, config, clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_through_one_store_is_seen_by_the_next_read_through_the_other() {
    let (a, b, _, _) = two_stores().await;
    let scope = agent("a1");
    // Memory: found by search through the other store immediately, then updated through it.
    let m = a
        .put(
            write("gate", scope.clone(), "the silver gate opens at dawn"),
            None,
            false,
        )
        .await
        .unwrap();
    let q = MemoryQuery::new("silver gate", vec![scope.clone()]);
    let hits = b.search(&q).await.unwrap().hits;
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].record.revision, m.revision);
    let m2 = b
        .put(
            write("gate", scope.clone(), "the silver gate is shut"),
            Some(&m.revision),
            false,
        )
        .await
        .unwrap();
    // A stale write through the first store now conflicts with the second store's revision.
    let stale = a
        .put(
            write("gate", scope.clone(), "stale"),
            Some(&m.revision),
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(stale.conflict_revision(), Some(&m2.revision));
    assert_eq!(
        a.read(&m.id, &scope).await.unwrap().unwrap().content,
        "the silver gate is shut"
    );
    // Variables.
    let v = b
        .set(&scope, &var("hp"), json!(7), None, MemorySource::system())
        .await
        .unwrap();
    assert_eq!(a.get(&scope, &var("hp")).await.unwrap(), Some(v));
    // Chats, state, checkpoints, prompts.
    let ch = CharacterName::parse("Mira").unwrap();
    let id = ChatId::parse("Mira - 1").unwrap();
    let header = ChatLine::parse(r#"{"user_name":"Kai","chat_metadata":{}}"#).unwrap();
    let rev = a
        .rewrite_chat(&ch, &id, std::slice::from_ref(&header), None)
        .await
        .unwrap();
    assert_eq!(b.chat_revision(&ch, &id).await.unwrap(), Some(rev));
    let session = SessionId::parse("s1").unwrap();
    b.save_prompt(&session, "be brief").await.unwrap();
    assert_eq!(
        a.get_prompt(&session).await.unwrap().unwrap().text,
        "be brief"
    );
    let cp = ProjectorCheckpoint {
        session_id: session.clone(),
        last_cursor: Some(3),
        status: CheckpointStatus::Pending,
        pending_cursor: Some(4),
        error: Some("x".into()),
        chat_revision: None,
        turn: 1,
        step: 0,
        updated_at: T0,
    };
    a.save_checkpoint(&cp, None).await.unwrap();
    assert_eq!(
        b.pending_checkpoints().await.unwrap(),
        std::slice::from_ref(&cp)
    );
    assert!(b
        .save_checkpoint(&cp, None)
        .await
        .unwrap_err()
        .is_conflict());
}

/// A store far behind catches up in bounded batches (2,000 rows per round trip) and misses
/// nothing, whether it is reading, writing or opening.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_far_behind_catches_up_in_batches() {
    let (a, b, config, clock) = two_stores().await;
    let scope = agent("a1");
    let n = 4_100;
    for i in 0..n {
        a.put(
            write(&format!("m{i}"), scope.clone(), &format!("note {i}")),
            None,
            false,
        )
        .await
        .unwrap();
    }
    // Reading: every row, the last one included.
    let q = MemoryQuery::new(format!("note {}", n - 1), vec![scope.clone()]);
    assert_eq!(
        b.search(&q).await.unwrap().hits[0].record.id.as_str(),
        format!("m{}", n - 1)
    );
    assert_eq!(b.memory_len().await, n);
    // Writing: a store that has read nothing yet decides on the whole table.
    let c = pg_support::cluster().open(&config, clock.clone()).await;
    assert_eq!(c.memory_len().await, n);
    let d = pg_support::cluster().open(&config, clock).await;
    let last = a
        .put(
            write("m0", scope.clone(), "note zero, again"),
            Some(
                &b.read(&MemoryId::parse("m0").unwrap(), &scope)
                    .await
                    .unwrap()
                    .unwrap()
                    .revision,
            ),
            false,
        )
        .await
        .unwrap();
    for i in 0..n {
        a.put(write(&format!("x{i}"), scope.clone(), "more"), None, false)
            .await
            .unwrap();
    }
    let err = d
        .put(write("m0", scope.clone(), "stale"), None, false)
        .await
        .unwrap_err();
    assert_eq!(err.conflict_revision(), Some(&last.revision));
    assert_eq!(d.memory_len().await, 2 * n);
}

/// A store decides a write on its own copy of the tables first and keeps that decision only
/// when the copy was current: every verdict below is made while the deciding store has not
/// yet seen the other store's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_are_decided_on_the_whole_table_not_on_a_stale_copy() {
    let (a, b, _, _) = two_stores().await;
    let scope = agent("a1");
    // Created through B, unseen by A: A's update with B's revision is right, not a conflict
    // (A's copy has no such record).
    let made = b
        .put(write("key", scope.clone(), "a brass key"), None, false)
        .await
        .unwrap();
    let updated = a
        .put(
            write("key", scope.clone(), "a rusty brass key"),
            Some(&made.revision),
            false,
        )
        .await
        .unwrap();
    // Created again through A on a copy where it did not exist: a conflict naming the
    // current revision, written by nobody.
    let again = b
        .put(write("coin", scope.clone(), "a coin"), None, false)
        .await
        .unwrap();
    let dup = a
        .put(write("coin", scope.clone(), "another coin"), None, false)
        .await
        .unwrap_err();
    assert_eq!(dup.conflict_revision(), Some(&again.revision));
    // Updated through B after A's update: A's next update with its own (now stale) revision
    // conflicts, although A's copy still holds that revision.
    let later = b
        .put(
            write("key", scope.clone(), "a key turned to dust"),
            Some(&updated.revision),
            false,
        )
        .await
        .unwrap();
    let stale = a
        .put(
            write("key", scope.clone(), "lost"),
            Some(&updated.revision),
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(stale.conflict_revision(), Some(&later.revision));
    // Variables: a patch expecting the scope revision B just made, decided by A.
    let first = b
        .set(&scope, &var("hp"), json!(3), None, MemorySource::system())
        .await
        .unwrap();
    let second = a
        .set(
            &scope,
            &var("hp"),
            json!(4),
            Some(&first.revision),
            MemorySource::system(),
        )
        .await
        .unwrap();
    assert_eq!(b.get(&scope, &var("hp")).await.unwrap(), Some(second));
    // A clear decided by A of a scope only B wrote to clears it.
    let other = agent("a2");
    b.set(&other, &var("mp"), json!(1), None, MemorySource::system())
        .await
        .unwrap();
    assert_eq!(
        a.clear_scope(&other, MemorySource::system()).await.unwrap(),
        1
    );
    assert_eq!(b.get(&other, &var("mp")).await.unwrap(), None);
    // The audit holds every acknowledged write once, in order.
    let audit = b.memory_audit(&scope, Some(&made.id)).await.unwrap();
    let revisions: Vec<&Revision> = audit.iter().filter_map(|e| e.revision.as_ref()).collect();
    assert_eq!(
        revisions,
        [&made.revision, &updated.revision, &later.revision]
    );
}

/// Writes are sent as literals in one message: quotes, backslashes, JSON escapes and
/// non-ASCII text come back exactly, through the other store too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_text_round_trips_through_the_one_message_write() {
    let (a, b, _, _) = two_stores().await;
    let scope = agent("a1");
    let text =
        "it's C:\\new \\' ''; DROP TABLE memory_ops; -- \"quoted\" \\u0000 $$ E'x' 银色大门 🗝️";
    a.put(write("hostile", scope.clone(), text), None, false)
        .await
        .unwrap();
    a.set(
        &scope,
        &var("note"),
        json!(text),
        None,
        MemorySource::system(),
    )
    .await
    .unwrap();
    for s in [&a, &b] {
        let m = s
            .read(&MemoryId::parse("hostile").unwrap(), &scope)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(m.content, text);
        let v = s.get(&scope, &var("note")).await.unwrap().unwrap();
        assert_eq!(v.value, json!(text));
    }
}

/// 8 writers, half through each store, race CAS updates of one variable: every acknowledged
/// write is found (in the value and the audit), and each revision has exactly one successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_writers_across_two_stores_race_cas_on_one_variable() {
    let (a, b) = two_racing_stores().await;
    let scope = ScopeKey::Global;
    let base = a
        .set(&scope, &var("n"), json!(0), None, MemorySource::system())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let s = if w % 2 == 0 { a.clone() } else { b.clone() };
        let scope = scope.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked: Vec<(Revision, Revision)> = Vec::new();
            let mut conflicts = 0;
            while acked.len() < 5 {
                let cur = s.get(&scope, &var("n")).await.unwrap().unwrap();
                let n = cur.value.as_i64().unwrap();
                match s
                    .set(
                        &scope,
                        &var("n"),
                        json!(n + 1),
                        Some(&cur.revision),
                        MemorySource::system(),
                    )
                    .await
                {
                    Ok(rec) => acked.push((cur.revision, rec.revision)),
                    Err(StoreError::Conflict { current, .. }) => {
                        assert!(current.is_some());
                        conflicts += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            (acked, conflicts)
        }));
    }
    let mut successor: HashMap<Revision, Revision> = HashMap::new();
    for t in tasks {
        let (acked, _) = t.await.unwrap();
        for (from, to) in acked {
            assert!(
                successor.insert(from, to).is_none(),
                "two writers won on one revision"
            );
        }
    }
    assert_eq!(successor.len(), 40);
    // The acknowledged writes form one chain from the base to the current revision.
    let mut at = base.revision.clone();
    let mut steps = 0;
    while let Some(next) = successor.get(&at) {
        at = next.clone();
        steps += 1;
    }
    assert_eq!(steps, 40, "every acknowledged write is on the chain");
    for s in [&a, &b] {
        let now = s.get(&scope, &var("n")).await.unwrap().unwrap();
        assert_eq!(now.value, json!(40));
        assert_eq!(now.revision, at);
        let audit = s.variable_audit(&scope).await.unwrap();
        assert_eq!(audit.len(), 41, "one audit entry per acknowledged write");
    }
}

/// The same race on one memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_writers_across_two_stores_race_cas_on_one_memory() {
    let (a, b) = two_racing_stores().await;
    let scope = agent("a1");
    let id = MemoryId::parse("race").unwrap();
    let base = a
        .put(write("race", scope.clone(), "v0"), None, false)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let s = if w % 2 == 0 { a.clone() } else { b.clone() };
        let (scope, id) = (scope.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..4 {
                let rev = match s.read(&id, &scope).await.unwrap() {
                    Some(r) => r.revision,
                    None => panic!("memory vanished"),
                };
                let text = format!("writer {w} round {i}");
                if let Ok(rec) = s
                    .put(write("race", scope.clone(), &text), Some(&rev), false)
                    .await
                {
                    acked.push((rev, rec.revision, text));
                }
            }
            acked
        }));
    }
    let mut successor = HashMap::new();
    for t in tasks {
        for (from, to, text) in t.await.unwrap() {
            assert!(
                successor.insert(from, (to, text)).is_none(),
                "two writers won on one revision"
            );
        }
    }
    assert!(!successor.is_empty());
    let mut at = base.revision.clone();
    let mut last_text = "v0".to_owned();
    let mut steps = 0;
    while let Some((next, text)) = successor.get(&at) {
        at = next.clone();
        last_text = text.clone();
        steps += 1;
    }
    assert_eq!(steps, successor.len(), "every acknowledged write is found");
    for s in [&a, &b] {
        let now = s.read(&id, &scope).await.unwrap().unwrap();
        assert_eq!(
            (now.revision.clone(), now.content.clone()),
            (at.clone(), last_text.clone())
        );
        let updates = s
            .memory_audit(&scope, Some(&id))
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.action == AuditAction::Updated)
            .count();
        assert_eq!(updates, successor.len());
    }
}

/// One ranking implementation: the same data and queries give the same hits, in the same
/// order, with the same scores, as the file store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_ranks_exactly_as_the_file_store() {
    let (pg, other, _, clock) = two_stores().await;
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStore::open(dir.path(), clock.clone()).unwrap();
    let texts = [
        "the silver gate opens at dawn",
        "a river spirit guards the silver bridge",
        "她推开了银色大门，月光洒在石阶上。",
        "lanterns along the river, gate after gate",
        "the gate keeper remembers every name",
    ];
    for (i, text) in texts.iter().enumerate() {
        clock.advance(1000);
        let mut w = write(&format!("m{i}"), agent("a1"), text);
        w.importance = 0.2 + 0.15 * i as f64;
        pg.put(w.clone(), None, false).await.unwrap();
        fs.put(w, None, false).await.unwrap();
    }
    for q in ["gate", "silver river", "银色大门", "gate keeper dawn", ""] {
        let query = MemoryQuery::new(q, vec![agent("a1")]);
        let want = fs.search(&query).await.unwrap();
        for s in [&pg, &other] {
            let got = s.search(&query).await.unwrap();
            let key = |r: &tavern_store::MemorySearchResult| {
                r.hits
                    .iter()
                    .map(|h| (h.record.id.to_string(), h.score, h.relevance))
                    .collect::<Vec<_>>()
            };
            assert_eq!(key(&got), key(&want), "query {q:?}");
            assert_eq!(got.source_count, want.source_count);
        }
    }
}

/// Chat lines come back byte for byte; appends are read incrementally; revisions change with
/// every change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_lines_round_trip_byte_for_byte() {
    let (a, b, _, _) = two_stores().await;
    let ch = CharacterName::parse("Mira").unwrap();
    let id = ChatId::parse("Mira - 2026-11-30@10h00m00s").unwrap();
    let raw = [
        r#"{"user_name":"Kai",  "character_name":"Mira","chat_metadata":{"k":1.50}}"#,
        r#"{ "name" : "Kai", "is_user":true,"mes":"caf\u00e9 é 你好 \"q\""}"#,
    ];
    let lines: Vec<ChatLine> = raw.iter().map(|r| ChatLine::parse(r).unwrap()).collect();
    let r0 = a.rewrite_chat(&ch, &id, &lines[..1], None).await.unwrap();
    let r1 = b.append_lines(&ch, &id, &lines[1..], &r0).await.unwrap();
    assert_ne!(r0, r1);
    let file = a.read_chat(&ch, &id).await.unwrap().unwrap();
    let back: Vec<&str> = file.lines.iter().map(ChatLine::raw).collect();
    assert_eq!(back, raw);
    assert_eq!(file.revision, r1);
    match a.read_chat_since(&ch, &id, &r0).await.unwrap().unwrap() {
        ChatChange::Appended {
            lines: new,
            revision,
        } => {
            assert_eq!(new.iter().map(ChatLine::raw).collect::<Vec<_>>(), raw[1..]);
            assert_eq!(revision, r1);
        }
        other => panic!("expected an append, got {other:?}"),
    }
    assert_eq!(
        a.read_chat_since(&ch, &id, &r1).await.unwrap(),
        Some(ChatChange::Unchanged)
    );
    let r2 = a
        .rewrite_chat(&ch, &id, &lines[..1], Some(&r1))
        .await
        .unwrap();
    match b.read_chat_since(&ch, &id, &r1).await.unwrap().unwrap() {
        ChatChange::Whole(f) => {
            assert_eq!(f.lines.len(), 1);
            assert_eq!(f.revision, r2);
        }
        other => panic!("a rewrite is not an append: {other:?}"),
    }
    // Appending after the rewrite brings back r1's content, so r1's revision: revisions name
    // content, not history.
    let r3 = b.append_lines(&ch, &id, &lines[1..], &r2).await.unwrap();
    assert_eq!(r3, r1);
    assert_eq!(
        a.read_chat_since(&ch, &id, &r1).await.unwrap(),
        Some(ChatChange::Unchanged)
    );
    assert!(matches!(
        a.append_lines(&ch, &id, &lines[1..], &r2).await,
        Err(StoreError::Conflict { .. })
    ));
    let missing = ChatId::parse("nope").unwrap();
    assert!(matches!(
        a.append_lines(&ch, &missing, &lines[1..], &r2).await,
        Err(StoreError::NotFound { .. })
    ));
}

/// State updates through two stores compose; the state survives in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_updates_through_two_stores_compose() {
    let (a, b, _, _) = two_stores().await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let mut m = |st: &mut tavern_core::TavernState| {
                let target = tavern_core::BindingTarget {
                    character: CharacterName::parse("Mira").unwrap(),
                    chat_id: ChatId::parse(format!("chat {i}")).unwrap(),
                    group: false,
                };
                let bnd = tavern_core::SessionBinding::new_for_chat(target, st);
                st.set_binding(SessionId::parse(format!("s{i}")).unwrap(), bnd);
                tavern_store::Verdict::Write
            };
            s.update_state(&mut m).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(a.load_state().await.unwrap().0.bindings.len(), 8);
    assert_eq!(
        b.load_state().await.unwrap().0,
        a.load_state().await.unwrap().0
    );
}

/// Each store keeps the state it read and fetches the document again only when the row
/// changed: a binding changed through the other store, or by hand in the database, is seen by
/// the very next read, through every way of reading the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_state_sees_every_change_made_elsewhere() {
    use tavern_store::{StateStoreExt, StateViewExt};
    let (a, b, config, _) = two_stores().await;
    let session = SessionId::parse("s1").unwrap();
    let bind = |chat: &'static str| {
        let session = session.clone();
        move |st: &mut tavern_core::TavernState| {
            let target = tavern_core::BindingTarget {
                character: CharacterName::parse("Mira").unwrap(),
                chat_id: ChatId::parse(chat).unwrap(),
                group: false,
            };
            let bnd = tavern_core::SessionBinding::new_for_chat(target, st);
            st.set_binding(session.clone(), bnd);
            Ok::<_, StoreError>(())
        }
    };
    let chat_of =
        |b: Option<tavern_core::SessionBinding>| b.map(|b| b.target().chat_id.to_string());
    a.update(bind("first")).await.unwrap();
    assert_eq!(
        chat_of(b.binding(&session).await.unwrap()).as_deref(),
        Some("first")
    );
    // Read again, unchanged: the same answer (from the cache).
    assert_eq!(
        chat_of(b.binding(&session).await.unwrap()).as_deref(),
        Some("first")
    );
    // Changed through the other store: the next read of each kind sees it.
    a.update(bind("second")).await.unwrap();
    assert_eq!(
        chat_of(b.binding(&session).await.unwrap()).as_deref(),
        Some("second")
    );
    a.update(bind("third")).await.unwrap();
    let seen = b
        .read_state(|st| st.binding(&session).map(|b| b.target().chat_id.to_string()))
        .await
        .unwrap();
    assert_eq!(seen.as_deref(), Some("third"));
    // Changed by hand in the database (another program, a restore): seen too.
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .execute(
            "UPDATE state SET doc = '{\"sessionBindings\": {}}' WHERE id = 1",
            &[],
        )
        .await
        .unwrap();
    assert!(b.binding(&session).await.unwrap().is_none());
    assert!(a.load_state().await.unwrap().0.bindings.is_empty());
}

/// A database migrated by a newer program is refused with a clear error; the current version
/// opens again and again (migrations run once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() {
    let (a, _, config, clock) = two_stores().await;
    drop(a);
    let again = PgStore::open(config.clone(), clock.clone(), 2).await;
    assert!(again.is_ok(), "reopening the current schema works");
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    tokio::spawn(conn);
    let newer = SCHEMA_VERSION + 1;
    client
        .execute("UPDATE schema_version SET version = $1", &[&newer])
        .await
        .unwrap();
    let err = PgStore::open(config, clock as Arc<dyn Clock>, 2)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Database { .. }), "{msg}");
    assert!(
        msg.contains(&format!("version {newer}")) && msg.contains("newer"),
        "{msg}"
    );
}

/// A database written by the first schema (before compaction and content revisions) is
/// brought to the current one when a store opens it, its rows kept and its chats digested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_database_is_upgraded_with_its_rows() {
    let (a, _, config, clock) = two_stores().await;
    let scope = agent("a1");
    a.put(write("gate", scope.clone(), "the old gate"), None, false)
        .await
        .unwrap();
    drop(a);
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    tokio::spawn(conn);
    // Back to version 1's tables, holding a chat as version 1 wrote it.
    client
        .batch_execute(
            "ALTER TABLE memory_ops DROP COLUMN reset; ALTER TABLE variable_ops DROP COLUMN reset;
             ALTER TABLE chats DROP COLUMN bytes, DROP COLUMN digest,
                 ADD COLUMN revision bigint NOT NULL DEFAULT 0,
                 ADD COLUMN rewritten bigint NOT NULL DEFAULT 0;
             ALTER TABLE chat_lines DROP COLUMN digest;
             CREATE SEQUENCE chat_revisions;
             DROP TABLE store_identity;
             DROP INDEX memory_ops_scope_seq;
             INSERT INTO chats (character, chat, revision, rewritten, line_count)
                 VALUES ('Mira', 'old', 7, 7, 2);
             INSERT INTO chat_lines (character, chat, n, line) VALUES
                 ('Mira', 'old', 0, '{\"user_name\":\"Kai\"}'),
                 ('Mira', 'old', 1, '{\"name\":\"Kai\",\"mes\":\"旧的门\"}');
             UPDATE schema_version SET version = 1",
        )
        .await
        .unwrap();
    let upgraded = PgStore::open(config, clock as Arc<dyn Clock>, 2)
        .await
        .unwrap();
    let hits = upgraded
        .search(&MemoryQuery::new("gate", vec![scope]))
        .await
        .unwrap()
        .hits;
    assert_eq!(hits[0].record.content, "the old gate");
    let version: i32 = client
        .query_one("SELECT version FROM schema_version", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    let (ch, old) = (
        CharacterName::parse("Mira").unwrap(),
        ChatId::parse("old").unwrap(),
    );
    let file = upgraded.read_chat(&ch, &old).await.unwrap().unwrap();
    assert_eq!(file.revision, ChatRevision::of_lines(&file.lines));
    assert_eq!(file.lines[1].raw(), r#"{"name":"Kai","mes":"旧的门"}"#);
    // The backfilled line digests tell an append from a rewrite.
    let more = ChatLine::parse(r#"{"name":"Mira","mes":"new"}"#).unwrap();
    upgraded
        .append_lines(&ch, &old, std::slice::from_ref(&more), &file.revision)
        .await
        .unwrap();
    assert_eq!(
        upgraded
            .read_chat_since(&ch, &old, &file.revision)
            .await
            .unwrap(),
        Some(ChatChange::Appended {
            lines: vec![more.clone()],
            revision: ChatRevision::of_lines(&[file.lines[0].clone(), file.lines[1].clone(), more]),
        })
    );
    upgraded.compact().await.unwrap();
}

/// Connection failures say what failed, never the settings or the password.
#[tokio::test(flavor = "current_thread")]
async fn errors_never_show_the_settings_or_password() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let settings =
        "host=/nonexistent-tavern-socket-dir user=kai password=hunter2-secret dbname=tavern";
    let err = PgStore::connect(settings, clock.clone()).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Database { .. }), "{msg}");
    assert!(!msg.contains("hunter2"), "{msg}");
    assert!(!msg.contains("nonexistent-tavern-socket-dir"), "{msg}");
    assert!(
        msg.starts_with("database error during open: error connecting to server"),
        "{msg}"
    );
    let bad = "postgres://kai:hunter2-secret@[::1:5432/x?bogus";
    let err = PgStore::connect(bad, clock).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Invalid(_)), "{msg}");
    assert!(!msg.contains("hunter2"), "{msg}");
    assert!(!format!("{err:?}").contains("hunter2"));
}

/// Stores opening one new database at the same time migrate it exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_opening_a_new_database_at_once_migrate_it_once() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let (config, clock) = (config.clone(), clock.clone());
            tokio::spawn(async move { PgStore::open(config, clock, 2).await })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().unwrap());
    }
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    tokio::spawn(conn);
    let rows = client
        .query("SELECT version FROM schema_version", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i32>(0), SCHEMA_VERSION);
    // And they all work on the one schema.
    stores[0]
        .set(
            &ScopeKey::Global,
            &var("x"),
            json!(1),
            None,
            MemorySource::system(),
        )
        .await
        .unwrap();
    assert!(stores[3]
        .get(&ScopeKey::Global, &var("x"))
        .await
        .unwrap()
        .is_some());
}

/// A role that may read but not write (a reporting role, a standby): reads still answer —
/// recording the access time fails and is reported — and a failed write does not cost a new
/// connection (the failed transaction is ended on the connection, which stays pooled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_role_reads_without_reconnecting() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let dbname = config.get_dbname().unwrap().to_owned();
    let clock = Arc::new(ManualClock::new(T0));
    let writer = cluster.open(&config, clock.clone()).await;
    let scope = agent("a1");
    let m = writer
        .put(write("gate", scope.clone(), "the silver gate"), None, false)
        .await
        .unwrap();
    let admin = |sql: String| {
        let config = config.clone();
        async move {
            let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
            let task = tokio::spawn(conn);
            let rows = client.simple_query(&sql).await.unwrap();
            drop(client);
            let _ = task.await;
            rows
        }
    };
    admin(format!(
        "CREATE ROLE reader LOGIN; GRANT CONNECT ON DATABASE {dbname} TO reader; \
         GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader"
    ))
    .await;
    let mut as_reader = config.clone();
    as_reader.user("reader");
    let reader = PgStore::open(as_reader, clock, 2).await.unwrap();
    let sessions = || async {
        let rows = admin(format!(
            "SELECT sessions FROM pg_stat_database WHERE datname = '{dbname}'"
        ))
        .await;
        rows.iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap()
            .parse::<i64>()
            .unwrap()
    };
    let before = sessions().await;
    for _ in 0..20 {
        let found = reader.read(&m.id, &scope).await.unwrap().unwrap();
        assert_eq!(found.content, "the silver gate");
    }
    let refused = reader
        .put(write("new", scope.clone(), "not allowed"), None, false)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("permission denied"),
        "{refused}"
    );
    // Our own admin connections count too: one per `sessions()` call.
    let opened = sessions().await - before;
    assert!(
        opened <= 2 + 1,
        "{opened} new sessions for 20 reads and a refused write"
    );
    assert!(reader
        .diagnostics()
        .iter()
        .any(|d| d.message.contains("access time")));
}

/// Compaction while another store is behind: the history becomes one snapshot row per
/// memory and variable scope; the store that was behind rebuilds its copy from it (same
/// records, same audit trails, same search), writes on, and a store opened afterwards reads
/// the compacted tables alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compaction_keeps_every_record_and_audit_for_every_process() {
    let (a, b, config, clock) = two_stores().await;
    let scope = agent("a1");
    // B has seen the first version only.
    let mut m = a
        .put(write("gate", scope.clone(), "the gate v0"), None, false)
        .await
        .unwrap();
    b.search(&MemoryQuery::new("gate", vec![scope.clone()]))
        .await
        .unwrap();
    for i in 1..30 {
        m = a
            .put(
                write("gate", scope.clone(), &format!("the gate v{i}")),
                Some(&m.revision),
                false,
            )
            .await
            .unwrap();
        a.read(&m.id, &scope).await.unwrap();
    }
    let hp = var("hp");
    let mut v = a
        .set(&scope, &hp, json!(0), None, MemorySource::system())
        .await
        .unwrap();
    for i in 1..20 {
        v = a
            .set(
                &scope,
                &hp,
                json!(i),
                Some(&v.revision),
                MemorySource::system(),
            )
            .await
            .unwrap();
    }
    let audit_before = a.memory_audit(&scope, Some(&m.id)).await.unwrap();
    let vars_before = a.variable_audit(&scope).await.unwrap();

    let report = a.compact().await.unwrap();
    // One snapshot row per memory and scope, after the reset row that starts them.
    assert_eq!(report.memory, (59, 2), "{report:?}");
    assert_eq!(report.variables, (20, 2), "{report:?}");

    // B (behind since the first version) sees exactly what A sees.
    let hits = b
        .search(&MemoryQuery::new("gate", vec![scope.clone()]))
        .await
        .unwrap()
        .hits;
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].record.content, "the gate v29");
    assert_eq!(
        b.memory_audit(&scope, Some(&m.id)).await.unwrap(),
        audit_before
    );
    assert_eq!(b.variable_audit(&scope).await.unwrap(), vars_before);
    assert_eq!(b.get(&scope, &hp).await.unwrap(), Some(v.clone()));
    // Both write on, compare-and-set against the revisions from before the compaction.
    let next = b
        .put(
            write("gate", scope.clone(), "the gate v30"),
            Some(&m.revision),
            false,
        )
        .await
        .unwrap();
    a.set(
        &scope,
        &hp,
        json!(20),
        Some(&v.revision),
        MemorySource::system(),
    )
    .await
    .unwrap();
    assert_eq!(
        a.read(&m.id, &scope).await.unwrap().unwrap().revision,
        next.revision
    );
    // A store opened now replays the snapshot and what came after.
    let c = pg_support::cluster().open(&config, clock).await;
    assert_eq!(c.memory_audit(&scope, Some(&m.id)).await.unwrap().len(), 31);
    assert_eq!(c.get(&scope, &hp).await.unwrap().unwrap().value, json!(20));
    // Compacting again leaves one row per record and scope (plus the reset row).
    let again = c.compact().await.unwrap();
    assert_eq!((again.memory.1, again.variables.1), (2, 2));
}

/// A server that accepts connections and never answers fails the open after the settings'
/// `connect_timeout`, with a message saying so — never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_fails_the_open() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let config: PgConfig =
        format!("host=127.0.0.1 port={port} user=kai password=hunter2 dbname=x connect_timeout=1")
            .parse()
            .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let opened = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        PgStore::open(config, clock, 2),
    )
    .await
    .expect("the open must give up by itself");
    let err = opened.unwrap_err().to_string();
    assert!(err.contains("did not answer"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    drop(silent);
}

/// Compaction never deletes what could not be read: with an unreadable operation row it
/// refuses, naming the count, and the table stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_refuses_to_drop_unreadable_rows() {
    let (a, _, config, clock) = two_stores().await;
    let scope = agent("a1");
    a.put(write("gate", scope.clone(), "the gate"), None, false)
        .await
        .unwrap();
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(
            "INSERT INTO memory_ops (scope, id, op) VALUES ('agent:a1', 'x', '{\"bogus\": 1}')",
        )
        .await
        .unwrap();
    let fresh = pg_support::cluster().open(&config, clock).await;
    assert!(fresh
        .diagnostics()
        .iter()
        .any(|d| d.message.contains("unreadable")));
    let err = fresh.compact().await.unwrap_err().to_string();
    assert!(err.contains("1 rows of memory_ops cannot be read"), "{err}");
    let rows: i64 = client
        .query_one("SELECT count(*) FROM memory_ops", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 2, "nothing was compacted");
}

/// A read abandoned while its query is in flight (its future dropped; here the query waits
/// behind a lock, so it surely is in flight) leaves nothing behind that a later read could take
/// for its own reply, whichever connection that read gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_read_does_not_confuse_the_next() {
    let (_, b, config, clock) = two_stores().await;
    // One connection: the next read gets the very connection the abandoned one used.
    let a = PgStore::open(config.clone(), clock, 1).await.unwrap();
    let scope = agent("a1");
    let (locker, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    tokio::spawn(conn);
    let q = |text: &str| MemoryQuery::new(text.to_owned(), vec![scope.clone()]);
    for round in 0..4 {
        let id = format!("m{round}");
        b.put(
            write(&id, scope.clone(), &format!("word{round}")),
            None,
            false,
        )
        .await
        .unwrap();
        locker
            .batch_execute("BEGIN; LOCK TABLE memory_ops IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        {
            let query = q(&format!("word{round}"));
            let mut search = std::pin::pin!(a.search(&query));
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(search.as_mut().poll(cx).is_ready())
            })
            .await;
            assert!(!first, "round {round}: answered behind the lock");
        }
        locker.batch_execute("COMMIT").await.unwrap();
        let found = a.search(&q(&format!("word{round}"))).await.unwrap();
        let ids: Vec<&str> = found.hits.iter().map(|h| h.record.id.as_str()).collect();
        assert_eq!(ids, [id.as_str()], "round {round}");
    }
    assert!(a.diagnostics().is_empty(), "{:?}", a.diagnostics());
}

/// Runs the prepared catch-up query ten times, then tells how often this session has planned
/// it generically and custom.
async fn ten_reads(
    client: &tokio_postgres::Client,
    select: &tokio_postgres::Statement,
) -> (i64, i64) {
    for _ in 0..10 {
        client.query(select, &[&1_000_000i64]).await.unwrap();
    }
    let row = client
        .query_one(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements
             WHERE statement LIKE '%FROM memory_ops WHERE seq > $1%'
               AND statement NOT LIKE '%pg_prepared_statements%'",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Every pooled connection keeps one generic plan per prepared statement: with the default,
/// once a table has statistics the catch-up query would be planned again on every read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_keep_their_generic_plans() {
    let (_, _, config, clock) = two_stores().await;
    // One connection, so it holds every statement the store prepared.
    let a = PgStore::open(config.clone(), clock, 1).await.unwrap();
    assert_eq!(
        a.setting("plan_cache_mode").await.unwrap(),
        "force_generic_plan"
    );
    let scope = agent("a1");
    for i in 0..3 {
        a.put(write(&format!("m{i}"), scope.clone(), "note"), None, false)
            .await
            .unwrap();
    }
    for _ in 0..10 {
        a.search(&MemoryQuery::new("note", vec![scope.clone()]))
            .await
            .unwrap();
    }
    let plans = a.prepared_plans().await.unwrap();
    let of = |prefix: &str| {
        plans
            .iter()
            .find(|p| p.0.trim_start().starts_with(prefix))
            .map(|p| (p.1, p.2))
            .unwrap_or_else(|| panic!("no statement {prefix}: {plans:?}"))
    };
    let (generic, custom) = of("SELECT seq, op::text, reset, scope FROM memory_ops");
    assert!(
        generic >= 10 && custom == 0,
        "reads keep one plan: {plans:?}"
    );
    // Writes are one simple-query message each (lock, insert, commit): planned per call,
    // never a prepared statement with a plan made while the table was small.
    assert!(
        plans
            .iter()
            .all(|p| !p.0.trim_start().starts_with("INSERT INTO memory_ops")),
        "writes plan per call: {plans:?}"
    );
    // What that buys, on this server: an analyzed table's catch-up query under the default
    // is re-planned every time; under the setting it is planned once. (Rows no store reads
    // again: only their number matters to the planner.)
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(
            "INSERT INTO memory_ops (scope, id, op)
             SELECT 'agent:filler', 'x', '{}'::json FROM generate_series(1, 5000);
             ANALYZE memory_ops",
        )
        .await
        .unwrap();
    let select = client
        .prepare(
            "SELECT seq, op::text, reset, scope FROM memory_ops WHERE seq > $1 ORDER BY seq LIMIT 2000",
        )
        .await
        .unwrap();
    assert_eq!(
        ten_reads(&client, &select).await,
        (0, 10),
        "the default re-plans every read"
    );
    client
        .batch_execute(tavern_store::pg::SESSION_SETTINGS)
        .await
        .unwrap();
    assert_eq!(
        ten_reads(&client, &select).await,
        (10, 10),
        "the setting plans once and keeps it"
    );
}

/// A bulk load (`tavern copy` into PostgreSQL) leaves the tables with statistics, so plans made
/// from then on are an analyzed table's, not the empty table's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_load_leaves_statistics() {
    let (a, _, config, clock) = two_stores().await;
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStore::open(dir.path(), clock.clone()).unwrap();
    for i in 0..30 {
        fs.put(write(&format!("m{i}"), agent("a1"), "note"), None, false)
            .await
            .unwrap();
    }
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    tokio::spawn(conn);
    let analyzed = || async {
        client
            .query_one(
                "SELECT reltuples FROM pg_class WHERE relname = 'memory_ops'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, f32>(0)
    };
    assert!(analyzed().await < 0.0, "never analyzed before the load");
    a.load_tables(fs.dump_tables().await.unwrap())
        .await
        .unwrap();
    assert_eq!(analyzed().await, 30.0, "analyzed after it");
}
