//! Chat projection from recorded DSH-shaped event logs (as data): the right lines, exactly
//! once, under duplicates, reordering, restarts, failures and a concurrent SillyTavern writer.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::Value;
use tavern_core::{normalize_state, CharacterName, ChatId, SessionBinding, SessionId, Timestamp};
use tavern_projector::{ChatProjector, HostEvent, ProjectorConfig, ProjectorError};
use tavern_store::clock::ManualClock;
use tavern_store::fs::FsStore;
use tavern_store::mem::MemStore;
use tavern_store::{AllStores, CheckpointStatus, CheckpointStore};

const T0: Timestamp = Timestamp(1_700_000_000_000);

fn data(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/projection-data")
            .join(name),
    )
    .unwrap()
}

fn events(name: &str) -> Vec<HostEvent> {
    data(name)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("seq").is_some())
        .map(|v| tavern_dsh_adapter::dsh::event::decode(&v).unwrap())
        .collect()
}

/// `(seq, is_user, text, turn, step)` per expected line.
fn expected(name: &str) -> Vec<(u64, bool, String, u64, u64)> {
    let all: Value = serde_json::from_str(&data("expected.json")).unwrap();
    all[name]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e[0].as_u64().unwrap(),
                e[1].as_bool().unwrap(),
                e[2].as_str().unwrap().to_owned(),
                e[3].as_u64().unwrap(),
                e[4].as_u64().unwrap(),
            )
        })
        .collect()
}

fn session() -> SessionId {
    SessionId::parse("s1").unwrap()
}

fn binding() -> SessionBinding {
    let (state, _) = normalize_state(
        &serde_json::json!({"sessionBindings": {"s1": {"character": "Mira", "chatId": "Mira - 1", "architecture": "agent-tavern", "contextMode": "dsh-native"}}}),
    );
    state.binding(&session()).unwrap().clone()
}

fn projector(store: Arc<dyn AllStores>, clock: Arc<ManualClock>) -> ChatProjector {
    ChatProjector::new(store.clone(), store, clock, ProjectorConfig::new("Kai"))
}

fn mem() -> (Arc<MemStore>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    (Arc::new(MemStore::new(clock.clone())), clock)
}

/// The projected lines of the chat: `(seq, is_user, text, turn, step)`, checking every line's
/// AgentTavern keys and that no key appears twice.
async fn projected(store: &dyn AllStores) -> Vec<(u64, bool, String, u64, u64)> {
    let file = store
        .read_chat(
            &CharacterName::parse("Mira").unwrap(),
            &ChatId::parse("Mira - 1").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    let mut out = Vec::new();
    for line in file.lines.iter().skip(1) {
        let Some(at) = line.extra().and_then(|x| x.get("agentTavern")) else {
            continue;
        };
        assert_eq!(at["sessionId"], "s1");
        assert_eq!(at["architecture"], "agent-tavern");
        assert_eq!(at["contextMode"], "dsh-native");
        assert_eq!(
            line.name(),
            Some(if line.is_user() { "Kai" } else { "Mira" })
        );
        out.push((
            at["eventSeq"].as_u64().unwrap(),
            line.is_user(),
            line.text().to_owned(),
            at["turn"].as_u64().unwrap(),
            at["step"].as_u64().unwrap(),
        ));
    }
    let mut keys: Vec<u64> = out.iter().map(|l| l.0).collect();
    keys.dedup();
    assert_eq!(keys.len(), out.len(), "a line was projected twice: {out:?}");
    out
}

const RECORDED: [&str; 5] = [
    "one_tool_turn.jsonl",
    "multi_step_turn.jsonl",
    "cancelled_turn.jsonl",
    "provider_error.jsonl",
    "compaction_replace.jsonl",
];

#[tokio::test]
async fn recorded_logs_become_exactly_the_user_and_final_assistant_lines() {
    for name in RECORDED {
        let (store, clock) = mem();
        let p = projector(store.clone(), clock);
        for e in events(name) {
            p.on_event(&session(), &binding(), e).await.unwrap();
        }
        assert_eq!(projected(&*store).await, expected(name), "{name}");
        let cp = store.load_checkpoint(&session()).await.unwrap().unwrap();
        assert_eq!(cp.status, CheckpointStatus::Ok);
        assert_eq!(cp.last_cursor, events(name).last().map(|e| e.seq), "{name}");
    }
}

#[tokio::test]
async fn a_final_message_waits_for_its_step_to_end() {
    let (store, clock) = mem();
    let p = projector(store.clone(), clock);
    let evs = events("one_tool_turn.jsonl");
    for e in evs.iter().take(12).cloned() {
        p.on_event(&session(), &binding(), e).await.unwrap();
    }
    // Up to the final assistant message (seq 11), but its step has not ended yet.
    assert_eq!(projected(&*store).await.len(), 1);
    let out = p
        .on_event(&session(), &binding(), evs[12].clone())
        .await
        .unwrap();
    assert_eq!(out.appended, 1);
    assert_eq!(projected(&*store).await, expected("one_tool_turn.jsonl"));
}

#[tokio::test]
async fn duplicates_and_out_of_order_delivery_project_once() {
    let (store, clock) = mem();
    let p = projector(store.clone(), clock);
    let mut evs = events("compaction_replace.jsonl");
    evs.reverse();
    let twice: Vec<HostEvent> = evs.iter().flat_map(|e| [e.clone(), e.clone()]).collect();
    for e in twice {
        p.on_event(&session(), &binding(), e).await.unwrap();
    }
    assert_eq!(
        projected(&*store).await,
        expected("compaction_replace.jsonl")
    );
    // Replaying the whole log afterwards changes nothing.
    let out = p
        .replay(&session(), &binding(), events("compaction_replace.jsonl"))
        .await
        .unwrap();
    assert_eq!(out.appended, 0);
    assert_eq!(
        projected(&*store).await,
        expected("compaction_replace.jsonl")
    );
}

#[tokio::test]
async fn a_restart_between_the_line_and_the_checkpoint_does_not_duplicate() {
    let (store, clock) = mem();
    let evs = events("compaction_replace.jsonl");
    let p = projector(store.clone(), clock.clone());
    for e in evs.iter().take(6).cloned() {
        p.on_event(&session(), &binding(), e).await.unwrap();
    }
    let before = store.load_checkpoint(&session()).await.unwrap();
    for e in evs.iter().skip(6).cloned() {
        p.on_event(&session(), &binding(), e).await.unwrap();
    }
    // Simulate a crash after the lines were written but before the checkpoint was saved.
    let after = store.load_checkpoint(&session()).await.unwrap();
    store
        .save_checkpoint(&before.unwrap(), after.as_ref())
        .await
        .unwrap();
    drop(p);
    let restarted = projector(store.clone(), clock);
    let out = restarted.replay(&session(), &binding(), evs).await.unwrap();
    assert_eq!((out.appended, out.already_present), (0, 2));
    assert_eq!(
        projected(&*store).await,
        expected("compaction_replace.jsonl")
    );
}

#[tokio::test]
async fn a_failed_append_is_pending_visible_and_replay_fills_only_the_gap() {
    let (store, clock) = mem();
    let p = projector(store.clone(), clock);
    let evs = events("one_tool_turn.jsonl");
    for e in evs.iter().take(3).cloned() {
        p.on_event(&session(), &binding(), e).await.unwrap();
    }
    store.fail_next("chat.append");
    let mut failure = None;
    // Up to the end of step 2, where the final assistant line is due; the turn/end is not
    // delivered (the host died), so nothing retries on its own.
    for e in evs.iter().skip(3).take(10).cloned() {
        if let Err(err) = p.on_event(&session(), &binding(), e).await {
            failure.get_or_insert(err);
        }
    }
    store.assert_no_pending_faults().unwrap();
    let err = failure.expect("the injected failure surfaces");
    assert!(matches!(err, ProjectorError::Store { .. }), "{err}");
    let pending = p.pending().await.unwrap();
    assert_eq!(pending.len(), 1);
    assert!(
        pending[0].error.as_deref().unwrap().contains("injected"),
        "{:?}",
        pending[0].error
    );
    assert_eq!(
        pending[0].pending_cursor,
        Some(11),
        "the final assistant message is the gap"
    );
    assert_eq!(
        projected(&*store).await.len(),
        1,
        "the user line written before the failure stays"
    );
    let out = p.replay(&session(), &binding(), evs).await.unwrap();
    assert_eq!(out.appended, 1);
    assert_eq!(projected(&*store).await, expected("one_tool_turn.jsonl"));
    assert!(p.pending().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_unknown_event_type_blocks_instead_of_being_guessed_at() {
    let (store, clock) = mem();
    let p = projector(store.clone(), clock);
    let mut evs = events("compaction_replace.jsonl");
    evs.truncate(6);
    evs.push(
        tavern_dsh_adapter::dsh::event::decode(
            &serde_json::json!({"type": "assistant/message-v2", "seq": 6, "time": 1, "data": {}, "surfaceOp": "append"}),
        )
        .unwrap(),
    );
    evs.push(tavern_dsh_adapter::dsh::event::decode(&serde_json::json!({"type": "ui/hint", "seq": 7, "time": 1, "data": {}, "ignorable": true})).unwrap());
    // Host bookkeeping of unknown types without a surface change is skipped, not blocking.
    let bookkeeping = tavern_dsh_adapter::dsh::event::decode(
        &serde_json::json!({"type": "sandbox/mode", "seq": 0, "time": 1, "data": {"mode": "x"}}),
    )
    .unwrap();
    assert_eq!(
        bookkeeping.kind,
        tavern_projector::EventKind::Known("sandbox/mode".into())
    );
    let res = p.replay(&session(), &binding(), evs).await;
    let err = res.unwrap_err().to_string();
    assert!(
        err.contains("unknown event type assistant/message-v2 at seq 6"),
        "{err}"
    );
    let cp = store.load_checkpoint(&session()).await.unwrap().unwrap();
    assert_eq!(
        (cp.status, cp.last_cursor, cp.pending_cursor),
        (CheckpointStatus::Pending, Some(5), Some(6))
    );
    assert_eq!(
        projected(&*store).await.len(),
        2,
        "lines before the unknown event are kept"
    );
}

/// A SillyTavern-style client rewrites the whole file (write temp + rename) between turns:
/// its lines survive and ours are neither lost nor doubled.
#[tokio::test]
async fn a_concurrent_whole_file_rewrite_loses_no_line() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(FsStore::open(dir.path(), clock.clone()).unwrap());
    let p = projector(store.clone(), clock);
    let evs = events("compaction_replace.jsonl");
    for e in evs.iter().take(6).cloned() {
        p.on_event(&session(), &binding(), e).await.unwrap();
    }
    let chat_path = walk(dir.path())
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .unwrap();
    let mut text = std::fs::read_to_string(&chat_path).unwrap();
    text.push_str(
        "\n{\"name\":\"Kai\",\"is_user\":true,\"send_date\":5,\"mes\":\"(typed in SillyTavern)\"}",
    );
    let tmp = chat_path.with_extension("tmp");
    std::fs::write(&tmp, &text).unwrap();
    std::fs::rename(&tmp, &chat_path).unwrap();
    for e in evs.iter().skip(6).cloned() {
        p.on_event(&session(), &binding(), e).await.unwrap();
    }
    assert_eq!(
        projected(&*store).await,
        expected("compaction_replace.jsonl")
    );
    let final_text = std::fs::read_to_string(&chat_path).unwrap();
    assert!(final_text.contains("(typed in SillyTavern)"));
    assert!(
        !final_text.ends_with('\n'),
        "SillyTavern style: no trailing newline"
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any delivery order, any duplicates, failures injected at random appends, then one replay
    /// of the full log: every expected line is in the chat exactly once, in log order.
    #[test]
    fn exactly_once_under_any_delivery(
        file in 0..RECORDED.len(),
        order in prop::collection::vec(any::<u16>(), 1..60),
        fail_at in prop::collection::btree_set(0..60usize, 0..4),
    ) {
        let name = RECORDED[file];
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (store, clock) = mem();
            let p = projector(store.clone(), clock);
            let evs = events(name);
            let deliveries: Vec<HostEvent> = order.iter().map(|i| evs[*i as usize % evs.len()].clone()).collect();
            for (i, e) in deliveries.into_iter().enumerate() {
                if fail_at.contains(&i) {
                    store.fail_next("chat.append");
                }
                let _ = p.on_event(&session(), &binding(), e).await;
            }
            // A fault armed when no append followed was never reached; it must not fire now.
            store.clear_faults();
            p.replay(&session(), &binding(), evs).await.unwrap();
            let got = projected(&*store).await;
            let want = expected(name);
            assert_eq!(got, want);
            let by_seq: BTreeMap<u64, usize> = got.iter().enumerate().map(|(i, l)| (l.0, i)).collect();
            assert!(by_seq.values().zip(by_seq.values().skip(1)).all(|(a, b)| a < b), "log order");
        });
    }
}

/// `turns` DSH-shaped turns, six events each (seqs from 0).
fn many_turns(turns: u64) -> Vec<HostEvent> {
    (0..turns)
        .flat_map(|t| {
            let (s, turn) = (t * 6, t + 1);
            [
                serde_json::json!({"type": "turn/start", "seq": s, "time": 1, "data": {"turn": turn}}),
                serde_json::json!({"type": "user/message", "seq": s + 1, "time": 1, "data": {"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": format!("question {turn}")}]}}),
                serde_json::json!({"type": "step/start", "seq": s + 2, "time": 1, "data": {"turn": turn, "step": 1}}),
                serde_json::json!({"type": "assistant/message", "seq": s + 3, "time": 1, "data": {"turn": turn, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": format!("answer {turn}")}]}}}),
                serde_json::json!({"type": "step/end", "seq": s + 4, "time": 1, "data": {"turn": turn, "step": 1}}),
                serde_json::json!({"type": "turn/end", "seq": s + 5, "time": 1, "data": {"turn": turn, "reason": {"kind": "completed"}}}),
            ]
        })
        .map(|v| tavern_dsh_adapter::dsh::event::decode(&v).unwrap())
        .collect()
}

/// Every turn's two lines, exactly once and in order, and a checkpoint at the last event.
async fn assert_all_projected(store: &dyn AllStores, turns: u64) {
    let got: Vec<(bool, String)> = projected(store)
        .await
        .into_iter()
        .map(|(_, user, text, _, _)| (user, text))
        .collect();
    let want: Vec<(bool, String)> = (1..=turns)
        .flat_map(|t| {
            [
                (true, format!("question {t}")),
                (false, format!("answer {t}")),
            ]
        })
        .collect();
    assert_eq!(got, want);
    let cp = store.load_checkpoint(&session()).await.unwrap().unwrap();
    assert_eq!(cp.last_cursor, Some(turns * 6 - 1));
    assert_eq!(cp.status, CheckpointStatus::Ok);
}

/// A deterministic shuffle (no randomness in tests beyond proptest's).
fn shuffled(mut v: Vec<HostEvent>, seed: u64) -> Vec<HostEvent> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// Several threads deliver one session's events at once (each its own order, with repeats):
/// every line lands exactly once and nothing stays pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_delivery_from_threads_projects_every_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store: Arc<dyn AllStores> = Arc::new(FsStore::open(dir.path(), clock.clone()).unwrap());
    let p = Arc::new(projector(store.clone(), clock));
    const TURNS: u64 = 30;
    let mut tasks = Vec::new();
    for feeder in 0..6u64 {
        let p = p.clone();
        let evs = shuffled(many_turns(TURNS), feeder);
        tasks.push(tokio::spawn(async move {
            for e in evs {
                let _ = p.on_event(&session(), &binding(), e).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_all_projected(&*store, TURNS).await;
}

/// Two runtimes on one data directory (two file stores on one root, as two processes have),
/// each delivering part of the events interleaved with the other: every line once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_projectors_on_one_root_project_every_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let a: Arc<dyn AllStores> = Arc::new(FsStore::open(dir.path(), clock.clone()).unwrap());
    let b: Arc<dyn AllStores> = Arc::new(FsStore::open(dir.path(), clock.clone()).unwrap());
    const TURNS: u64 = 30;
    let all = many_turns(TURNS);
    let mut tasks = Vec::new();
    for (i, store) in [a.clone(), b.clone()].into_iter().enumerate() {
        let p = projector(store, clock.clone());
        // Each gets every other event in its own order, then all of them again (a host that
        // retries).
        let mine: Vec<HostEvent> = shuffled(
            all.iter()
                .enumerate()
                .filter(|(n, _)| n % 2 == i)
                .map(|(_, e)| e.clone())
                .collect(),
            i as u64 + 3,
        )
        .into_iter()
        .chain(shuffled(all.clone(), i as u64 + 7))
        .collect();
        tasks.push(tokio::spawn(async move {
            for e in mine {
                let _ = p.on_event(&session(), &binding(), e).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_all_projected(&*a, TURNS).await;
    assert_all_projected(&*b, TURNS).await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any split of the events among 1–4 concurrent feeders of two projectors on one store, any
    /// order within each: every line exactly once, in log order, checkpoint at the end,
    /// nothing pending.
    #[test]
    fn concurrent_feeders_project_exactly_once(
        assignment in prop::collection::vec(0..4usize, 30),
        seeds in prop::collection::vec(any::<u64>(), 4),
        also_all in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(3).build().unwrap();
        rt.block_on(async {
            let (store, clock) = mem();
            // Two projectors on one store (two processes on one data folder), two feeders each.
            let projectors = [
                Arc::new(projector(store.clone(), clock.clone())),
                Arc::new(projector(store.clone(), clock)),
            ];
            let all = many_turns(5);
            let mut tasks = Vec::new();
            // Each process receives every event (as a host delivers them), split between its
            // two feeders by `assignment`.
            for (feeder, seed) in seeds.iter().enumerate() {
                let p = projectors[feeder % 2].clone();
                let mut mine: Vec<HostEvent> = all
                    .iter()
                    .zip(&assignment)
                    .filter(|(_, f)| **f % 2 == feeder / 2)
                    .map(|(e, _)| e.clone())
                    .collect();
                if also_all && feeder == 0 {
                    mine.extend(all.clone());
                }
                let mine = shuffled(mine, *seed);
                tasks.push(tokio::spawn(async move {
                    for e in mine {
                        let _ = p.on_event(&session(), &binding(), e).await;
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            assert_all_projected(&*store, 5).await;
        });
    }
}
