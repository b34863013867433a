//! The runtime on a real multi-thread executor: several sessions' events and tool calls at
//! once, and bookkeeping that stays bounded over thousands of turns.

mod common;

use tavern_dsh_adapter::dsh::event::decode_logged;

use std::sync::Arc;

use serde_json::{json, Value};
use tavern_core::{AgentId, CharacterName, ChatId, SessionId};
use tavern_dsh_adapter::bridge::host::BridgeHost;
use tavern_dsh_adapter::bridge::Bridge;
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_store::clock::ManualClock;
use tavern_store::mem::MemStore;
use tavern_store::{MemoryQuery, MemoryStore};

use common::{assets, World, T0};

/// One DSH-shaped turn: start, the user's message, the final reply, end.
fn turn_events(first_seq: u64, turn: u64, who: &str) -> Vec<Value> {
    let s = first_seq;
    vec![
        json!({"type": "turn/start", "seq": s, "time": 1, "data": {"turn": turn}}),
        json!({"type": "user/message", "seq": s + 1, "time": 1, "data": {"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": format!("{who} says hello {turn}")}]}}),
        json!({"type": "step/start", "seq": s + 2, "time": 1, "data": {"turn": turn, "step": 1}}),
        json!({"type": "assistant/message", "seq": s + 3, "time": 1, "data": {"turn": turn, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": format!("reply {turn} to {who}")}]}}}),
        json!({"type": "step/end", "seq": s + 4, "time": 1, "data": {"turn": turn, "step": 1}}),
        json!({"type": "turn/end", "seq": s + 5, "time": 1, "data": {"turn": turn, "reason": {"kind": "completed"}}}),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_run_concurrently_on_a_multi_thread_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let world = Arc::new(World::open(
        dir.path(),
        tavern_dsh_adapter::dsh::rc6_facts(),
    ));
    const SESSIONS: usize = 6;
    const TURNS: u64 = 4;
    for i in 0..SESSIONS {
        world.session(&format!("s{i}"), &format!("chat {i}")).await;
    }
    let mut tasks = Vec::new();
    for i in 0..SESSIONS {
        // One task delivers a session's events in order (as a host does)...
        let w = world.clone();
        tasks.push(tokio::spawn(async move {
            let session = SessionId::parse(format!("s{i}")).unwrap();
            let base = w.events(&format!("s{i}")).len() as u64;
            for turn in 1..=TURNS {
                for e in turn_events(base + (turn - 1) * 6, turn, &format!("s{i}")) {
                    w.runtime
                        .on_logged_event(&session, &decode_logged(&e))
                        .await
                        .unwrap();
                }
            }
        }));
        // ...while others call tools for the same session at the same time.
        for k in 0..3 {
            let w = world.clone();
            tasks.push(tokio::spawn(async move {
                let agent = AgentId::parse(format!("s{i}")).unwrap();
                let out = w
                    .runtime
                    .call_tool(
                        &agent,
                        &format!("call-{i}-{k}"),
                        "memory_write",
                        &json!({"content": format!("session {i} remembers lantern number {k}")}),
                    )
                    .await;
                assert!(out.get("error").is_none(), "{out}");
                let out = w
                    .runtime
                    .call_tool(&agent, &format!("get-{i}-{k}"), "variable_list", &json!({}))
                    .await;
                assert!(out.get("error").is_none(), "{out}");
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    // A tool call that ran after a session's last turn ended counts toward the next turn (as
    // it would on a host): one more, empty turn per session ends them all.
    for i in 0..SESSIONS {
        let session = SessionId::parse(format!("s{i}")).unwrap();
        let base = world.events(&format!("s{i}")).len() as u64 + TURNS * 6;
        let turn = TURNS + 1;
        for e in [
            json!({"type": "turn/start", "seq": base, "time": 1, "data": {"turn": turn}}),
            json!({"type": "turn/end", "seq": base + 1, "time": 1, "data": {"turn": turn, "reason": {"kind": "completed"}}}),
        ] {
            world
                .runtime
                .on_logged_event(&session, &decode_logged(&e))
                .await
                .unwrap();
        }
    }
    for i in 0..SESSIONS {
        let lines = world.chat(&format!("chat {i}")).await;
        // The greeting, then exactly one user line and one reply per turn, in order.
        let expected: Vec<(bool, String)> = (1..=TURNS)
            .flat_map(|t| {
                [
                    (true, format!("s{i} says hello {t}")),
                    (false, format!("reply {t} to s{i}")),
                ]
            })
            .collect();
        assert_eq!(lines[1..], expected[..], "chat {i}");
        let chat = tavern_core::ScopeKey::Chat {
            character: CharacterName::parse("Seraphina").unwrap(),
            chat: ChatId::parse(format!("chat {i}")).unwrap(),
        };
        let found = world
            .store
            .search(&MemoryQuery::new("lantern", vec![chat]))
            .await
            .unwrap();
        assert_eq!(found.hits.len(), 3, "session {i}: every write found");
    }
    assert_eq!(world.runtime.tracked_sessions(), 0, "every turn ended");
}

/// 10,000 turns over 100 sessions through the bridge: what the runtime, the tool registry
/// and the bridge's event mirror keep in memory stays bounded by the sessions in flight.
#[tokio::test]
async fn bookkeeping_stays_bounded_over_ten_thousand_turns() {
    const SESSIONS: usize = 100;
    const TURNS: u64 = 100;
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(MemStore::new(clock.clone()));
    let host = Arc::new(BridgeHost::default());
    let runtime = Runtime::new(
        host.clone(),
        store.clone(),
        assets(),
        clock,
        RuntimeConfig::default(),
    );
    let bridge = Bridge::new(runtime, host.clone());
    let frame = |v: Value| v.to_string();
    let ok = |out: Vec<Value>| {
        let last = out.last().cloned().unwrap_or(Value::Null);
        assert!(last.get("error").is_none(), "{last}");
        last
    };
    ok(bridge
        .handle(&frame(
            json!({"id": 0, "method": "handshake", "params": {"protocol": 1}}),
        ))
        .await);
    for i in 0..SESSIONS {
        ok(bridge.handle(&frame(json!({"id": 1, "method": "chat/bind", "params": {"session": format!("s{i}"), "character": "Seraphina", "chatId": format!("chat {i}")}}))).await);
        ok(bridge
            .handle(&frame(
                json!({"id": 1, "method": "agent/created", "params": {"agent": format!("s{i}")}}),
            ))
            .await);
    }
    let mut peak_tracked = 0;
    let mut peak_mirror = 0;
    for turn in 1..=TURNS {
        for i in 0..SESSIONS {
            let events = turn_events((turn - 1) * 6, turn, "user");
            for (n, e) in events.into_iter().enumerate() {
                ok(bridge.handle(&frame(json!({"id": 2, "method": "event", "params": {"session": format!("s{i}"), "event": e}}))).await);
                if n == 2 {
                    // A tool call mid-turn counts against the session's per-turn limits.
                    let out = ok(bridge.handle(&frame(json!({"id": 3, "method": "tool/call", "params": {"session": format!("s{i}"), "callId": format!("c{turn}-{i}"), "tool": "variable_list", "args": {}}}))).await);
                    assert!(out["result"].get("error").is_none(), "{out}");
                }
            }
            peak_tracked = peak_tracked.max(bridge.runtime().tracked_sessions());
            peak_mirror = peak_mirror.max(host.mirrored_events());
        }
    }
    // Only sessions mid-turn hold counters; projected events are not mirrored.
    assert!(peak_tracked <= 1, "peak tracked sessions {peak_tracked}");
    assert!(peak_mirror <= 6, "peak mirrored events {peak_mirror}");
    assert_eq!(bridge.runtime().tracked_sessions(), 0);
    assert_eq!(host.mirrored_events(), 0);
    // 10,000 finished calls: the bridge remembers a bounded number of their ids.
    let ((in_flight, early, done), agents) = bridge.bookkeeping();
    assert_eq!((in_flight, early), (0, 0));
    assert_eq!(done, tavern_dsh_adapter::bridge::calls::REMEMBERED_CALLS);
    assert_eq!(agents, SESSIONS);
    // Every turn was projected: 2 lines per turn in every chat.
    let status = ok(bridge
        .handle(&frame(json!({"id": 4, "method": "status"})))
        .await);
    assert_eq!(status["result"]["pending"], json!([]));
    use tavern_store::ChatStore;
    let file = store
        .read_chat(
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("chat 7").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        file.lines
            .iter()
            .filter(|l| l.extra().is_some_and(
                |x| x.contains_key("agentTavern") && x["agentTavern"].get("eventSeq").is_some()
            ))
            .count(),
        2 * TURNS as usize
    );
    // Unbound sessions keep nothing: events for a session nobody bound are not mirrored
    // beyond the per-session cap, and disposal frees it.
    for seq in 0..3000u64 {
        ok(bridge.handle(&frame(json!({"id": 5, "method": "event", "params": {"session": "stranger", "event": {"type": "turn/start", "seq": seq, "time": 1, "data": {"turn": 1}}}}))).await);
    }
    assert!(host.mirrored_events() <= tavern_dsh_adapter::bridge::host::MIRROR_MAX_EVENTS);
    ok(bridge
        .handle(&frame(
            json!({"id": 6, "method": "agent/disposed", "params": {"agent": "stranger"}}),
        ))
        .await);
    assert_eq!(host.mirrored_events(), 0);
}

/// A repeated `turn/end` of an earlier turn (hosts retry, deliveries race) must not clear the
/// turn variables of the turn in progress.
#[tokio::test]
async fn a_repeated_turn_end_keeps_the_next_turns_variables() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(MemStore::new(clock.clone()));
    let host = Arc::new(BridgeHost::default());
    let runtime = Runtime::new(host, store, assets(), clock, RuntimeConfig::default());
    let s1 = SessionId::parse("s1").unwrap();
    runtime
        .new_chat(
            &s1,
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("c1").unwrap(),
            false,
        )
        .await
        .unwrap();
    let agent = AgentId::parse("s1").unwrap();
    let end_1 = json!({"type": "turn/end", "seq": 1, "time": 1, "data": {"turn": 1, "reason": {"kind": "completed"}}});
    for e in [
        json!({"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}),
        end_1.clone(),
        json!({"type": "turn/start", "seq": 2, "time": 1, "data": {"turn": 2}}),
    ] {
        runtime
            .on_logged_event(&s1, &decode_logged(&e))
            .await
            .unwrap();
    }
    let set = runtime
        .call_tool(
            &agent,
            "c1",
            "variable_set",
            &json!({"name": "x", "value": 1, "scope": "turn"}),
        )
        .await;
    assert_eq!(set["value"], 1, "{set}");
    runtime
        .on_logged_event(&s1, &decode_logged(&end_1))
        .await
        .unwrap();
    let got = runtime
        .call_tool(
            &agent,
            "c2",
            "variable_get",
            &json!({"name": "x", "scope": "turn"}),
        )
        .await;
    assert_eq!(
        got["value"], 1,
        "turn 2's variable survived a late end of turn 1: {got}"
    );
    // The real end of turn 2 clears it.
    runtime
        .on_logged_event(&s1, &decode_logged(&json!({"type": "turn/end", "seq": 3, "time": 1, "data": {"turn": 2, "reason": {"kind": "completed"}}})))
        .await
        .unwrap();
    let gone = runtime
        .call_tool(
            &agent,
            "c3",
            "variable_get",
            &json!({"name": "x", "scope": "turn"}),
        )
        .await;
    assert_eq!(gone["error"]["code"], "not-found", "{gone}");
}
