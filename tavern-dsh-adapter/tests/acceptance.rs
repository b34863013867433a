//! Acceptance tests mirroring the seeds' lists (proposal 0004 §14 items 1–9, construction plan
//! §6 items 1–10), each a named test on the fake AgentLoop host.

mod common;

use tavern_dsh_adapter::dsh::event::decode_logged;

use common::{rc6, seam, World};
use serde_json::{json, Value};
use tavern_core::{
    normalize_state, AgentId, CharacterName, ChatId, ContextMode, SessionId, TavernArchitecture,
};
use tavern_dsh_adapter::fake::{ModelStep, ToolCallPlan};
use tavern_dsh_adapter::{MountDecision, RuntimeError, StAction};
use tavern_store::StateStoreExt as _;
use tavern_store::{MemoryStore, StateStore};

fn sid(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

/// 0004 §14.1, plan §6.1–2: new chats default to agent-tavern + dsh-native, groups to st,
/// legacy bindings keep their meaning.
#[tokio::test]
async fn a01_new_chats_default_to_agent_tavern_native_groups_and_legacy_to_st() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let b = w
        .runtime
        .new_chat(
            &sid("s1"),
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("c1").unwrap(),
            false,
        )
        .await
        .unwrap();
    assert_eq!(
        (b.architecture(), b.context_mode()),
        (
            TavernArchitecture::AgentTavern,
            Some(ContextMode::DshNative)
        )
    );
    let g = w
        .runtime
        .new_chat(
            &sid("g1"),
            &CharacterName::parse("Party").unwrap(),
            &ChatId::parse("p").unwrap(),
            true,
        )
        .await
        .unwrap();
    assert_eq!(g.architecture(), TavernArchitecture::St);
    let (legacy, _) = normalize_state(&json!({"sessionBindings": {
        "old": {"character": "A", "chatId": "c"},
        "mid": {"character": "A", "chatId": "d", "architecture": "agent-tavern"}}}));
    assert_eq!(
        legacy.binding(&sid("old")).unwrap().architecture(),
        TavernArchitecture::St
    );
    assert_eq!(
        legacy.binding(&sid("mid")).unwrap().context_mode(),
        Some(ContextMode::DshNative)
    );
    // Rebinding an existing session is refused rather than silently changing it.
    let again = w
        .runtime
        .new_chat(
            &sid("s1"),
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("c2").unwrap(),
            false,
        )
        .await;
    assert!(matches!(again, Err(RuntimeError::Conflict { .. })));
}

/// 0004 §14.2, plan §6.8: one set of native events per turn; AgentTavern calls no model.
#[tokio::test]
async fn a02_one_set_of_native_events_per_turn() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let agent = w.session("s1", "c1").await;
    w.host.script([
        ModelStep::Tools(vec![ToolCallPlan::new(
            "tavern_lore_search",
            json!({"query": "eldoria forest"}),
        )]),
        ModelStep::Reply("The forest of Eldoria shelters you.".into()),
    ]);
    let report = w
        .host
        .run_turn(&w.runtime, &agent, "What is this place?")
        .await
        .unwrap();
    assert_eq!(
        report.reply.as_deref(),
        Some("The forest of Eldoria shelters you.")
    );
    assert!(!report.tool_results[0]["items"]
        .as_array()
        .unwrap()
        .is_empty());
    let events = w.events("s1");
    let t = types(&events);
    assert_eq!(t.iter().filter(|x| *x == "turn/start").count(), 1);
    assert_eq!(t.iter().filter(|x| *x == "turn/end").count(), 1);
    assert_eq!(t.iter().filter(|x| *x == "tool/call").count(), 1);
    assert!(
        events.iter().enumerate().all(|(i, e)| e["seq"] == i as u64),
        "contiguous seqs"
    );
    assert_eq!(
        w.host.model_calls(),
        2,
        "only the host loop calls the model, once per step"
    );
    // Greeting, user line, final reply: each once.
    let chat = w.chat("c1").await;
    assert_eq!(chat.len(), 3);
    assert_eq!(chat[1], (true, "What is this place?".to_owned()));
    assert_eq!(
        chat[2],
        (false, "The forest of Eldoria shelters you.".to_owned())
    );
}

/// 0004 §14.3, plan §6.9: dsh-native registers no projection, and capacity follows the model
/// route in force for each request (nothing cached).
#[tokio::test]
async fn a03_native_registers_no_projection_and_follows_the_route() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), seam());
    let agent = w.session("s1", "c1").await;
    w.host.script([ModelStep::Reply("one".into())]);
    w.host.run_turn(&w.runtime, &agent, "first").await.unwrap();
    w.host.set_context_window(8_000);
    w.host.script([ModelStep::Reply("two".into())]);
    w.host.run_turn(&w.runtime, &agent, "second").await.unwrap();
    assert!(!types(&w.events("s1")).contains(&"request/projection".to_owned()));
    let reqs = w.host.requests();
    assert!(reqs.iter().all(|r| r.projection.is_none()));
    assert_eq!(
        (reqs[0].context_window, reqs[1].context_window),
        (64_000, 8_000)
    );
    assert!(
        !types(&w.events("s1"))
            .iter()
            .any(|t| t.starts_with("compaction/")),
        "no compaction of our own"
    );
}

/// 0004 §14.4: the same tools in both modes; switching clears nothing.
#[tokio::test]
async fn a04_tools_in_both_modes_and_switching_keeps_the_stores() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), seam());
    let agent = w.session("s1", "c1").await;
    let native_tools: Vec<String> = w
        .host
        .mount_of(&agent)
        .unwrap()
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(native_tools.len(), 14);
    w.host.script([
        ModelStep::Tools(vec![ToolCallPlan::new(
            "memory_write",
            json!({"content": "Kai fears water"}),
        )]),
        ModelStep::Reply("Noted.".into()),
    ]);
    w.host
        .run_turn(&w.runtime, &agent, "I fear water.")
        .await
        .unwrap();
    w.runtime
        .switch_mode(&sid("s1"), ContextMode::AgentManaged)
        .await
        .unwrap();
    w.host.create_agent(&w.runtime, &agent).await.unwrap();
    let managed_tools: Vec<String> = w
        .host
        .mount_of(&agent)
        .unwrap()
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(native_tools, managed_tools);
    w.host.script([
        ModelStep::Tools(vec![ToolCallPlan::new(
            "memory_search",
            json!({"query": "water"}),
        )]),
        ModelStep::Reply("I remember.".into()),
    ]);
    let r = w
        .host
        .run_turn(&w.runtime, &agent, "What do I fear?")
        .await
        .unwrap();
    assert_eq!(r.tool_results[0]["items"][0]["content"], "Kai fears water");
}

/// 0004 §14.5: agent-managed excludes history only through the projection, logs each one,
/// and the request can be rebuilt from the log; the chat keeps everything.
#[tokio::test]
async fn a05_managed_projection_is_logged_rebuildable_and_non_destructive() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), seam());
    let agent = w.session("s1", "c1").await;
    w.runtime
        .switch_mode(&sid("s1"), ContextMode::AgentManaged)
        .await
        .unwrap();
    w.host.set_context_window(1_700);
    for i in 0..6 {
        w.host.script([ModelStep::Reply(format!(
            "reply {i} {}",
            "words ".repeat(60)
        ))]);
        w.host
            .run_turn(
                &w.runtime,
                &agent,
                &format!("message {i} {}", "talk ".repeat(60)),
            )
            .await
            .unwrap();
    }
    let events = w.events("s1");
    let projections: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "request/projection")
        .collect();
    assert_eq!(projections.len(), 6, "one projection per request");
    let last_req = w.host.requests().pop().unwrap();
    let logged: Vec<u64> = projections.last().unwrap()["data"]["include"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let sent: Vec<u64> = last_req.messages.iter().map(|m| m.seq).collect();
    assert_eq!(
        logged, sent,
        "the request is rebuilt exactly from the logged projection"
    );
    assert!(
        sent.len()
            < events
                .iter()
                .filter(|e| e["type"] == "user/message"
                    || e["type"] == "assistant/message"
                    || e["type"] == "agent-tavern/greeting")
                .count(),
        "older history was left out"
    );
    assert!(projections.last().unwrap()["data"]["revision"]
        .as_str()
        .unwrap()
        .starts_with("r1-"));
    assert_eq!(
        w.chat("c1").await.len(),
        13,
        "greeting + 6 × (user, reply): nothing deleted"
    );
}

/// 0004 §14.6, plan M6.4: mode changes only at idle turn boundaries; the event and binding
/// are persisted; managed → native stops projecting.
#[tokio::test]
async fn a06_mode_switch_only_when_idle_and_persisted_with_its_event() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), seam());
    let agent = w.session("s1", "c1").await;
    {
        let _busy = w.host.hold_running(&agent);
        let err = w
            .runtime
            .switch_mode(&sid("s1"), ContextMode::AgentManaged)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("idle turn boundary"), "{err}");
    }
    let b = w
        .runtime
        .switch_mode(&sid("s1"), ContextMode::AgentManaged)
        .await
        .unwrap();
    assert_eq!(b.context_mode(), Some(ContextMode::AgentManaged));
    let ev = w
        .events("s1")
        .into_iter()
        .find(|e| e["type"] == "agent-tavern/context-mode")
        .unwrap();
    assert_eq!(
        (ev["data"]["from"].clone(), ev["data"]["to"].clone()),
        (json!("dsh-native"), json!("agent-managed"))
    );
    assert_eq!(
        w.store
            .load_state()
            .await
            .unwrap()
            .0
            .binding(&sid("s1"))
            .unwrap()
            .context_mode(),
        Some(ContextMode::AgentManaged)
    );
    w.runtime
        .switch_mode(&sid("s1"), ContextMode::DshNative)
        .await
        .unwrap();
    w.host.script([ModelStep::Reply("plain".into())]);
    w.host.run_turn(&w.runtime, &agent, "hi").await.unwrap();
    assert!(w.host.requests().last().unwrap().projection.is_none());
}

/// 0004 §14.7, plan §6.3 and §6.8: st sessions keep their pipeline and get nothing from
/// AgentTavern; ST-only actions are refused for agent-tavern sessions.
#[tokio::test]
async fn a07_st_sessions_untouched_and_st_actions_refused_for_agent_tavern() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    w.store
        .update(|state: &mut tavern_core::TavernState| {
            state.default_architecture = TavernArchitecture::St;
            Ok::<_, tavern_store::StoreError>(())
        })
        .await
        .unwrap();
    w.runtime
        .new_chat(
            &sid("st1"),
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("c-st").unwrap(),
            false,
        )
        .await
        .unwrap();
    let st_agent = AgentId::parse("st1").unwrap();
    assert_eq!(
        w.host.create_agent(&w.runtime, &st_agent).await.unwrap(),
        MountDecision::Untouched
    );
    assert!(w.host.mount_of(&st_agent).is_none());
    let plain = AgentId::parse("plain").unwrap();
    assert_eq!(
        w.host.create_agent(&w.runtime, &plain).await.unwrap(),
        MountDecision::Untouched
    );
    w.host.script([
        ModelStep::Reply("hello".into()),
        ModelStep::Reply("hi".into()),
    ]);
    w.host.run_turn(&w.runtime, &st_agent, "hey").await.unwrap();
    w.host.run_turn(&w.runtime, &plain, "hey").await.unwrap();
    for r in w.host.requests() {
        assert!(
            r.tools.is_empty() && !r.system.contains("AgentTavern"),
            "nothing mounted on {}",
            r.agent
        );
    }
    w.runtime
        .check_st_action(&sid("st1"), StAction::Swipe)
        .await
        .unwrap();
    w.store
        .update(|state: &mut tavern_core::TavernState| {
            state.default_architecture = TavernArchitecture::AgentTavern;
            Ok::<_, tavern_store::StoreError>(())
        })
        .await
        .unwrap();
    w.session("s1", "c1").await;
    for action in [StAction::Generate, StAction::Regenerate, StAction::Swipe] {
        let err = w
            .runtime
            .check_st_action(&sid("s1"), action)
            .await
            .unwrap_err();
        assert!(matches!(err, RuntimeError::Conflict { .. }), "{err}");
    }
}

/// 0004 §14.8, plan §6.4: forged ids, global writes and over-limit calls are refused with
/// reasons the model can act on.
#[tokio::test]
async fn a08_forged_ids_global_writes_and_limits_refused() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let a = w.session("s1", "c1").await;
    let b = w.session("s2", "c2").await;
    w.host.script([
        ModelStep::Tools(vec![ToolCallPlan::new(
            "memory_write",
            json!({"content": "the key is under the stone"}),
        )]),
        ModelStep::Reply("ok".into()),
    ]);
    let r = w
        .host
        .run_turn(&w.runtime, &a, "hide the key")
        .await
        .unwrap();
    let id = r.tool_results[0]["id"].as_str().unwrap().to_owned();
    w.host.script([
        ModelStep::Tools(vec![
            ToolCallPlan::new("memory_read", json!({"id": id, "sessionId": "s1"})),
            ToolCallPlan::new("memory_read", json!({"id": id})),
            ToolCallPlan::new("memory_write", json!({"content": "x", "scope": "global"})),
            ToolCallPlan::new("memory_search", json!({"query": "k".repeat(600)})),
        ]),
        ModelStep::Reply("nothing".into()),
    ]);
    let r = w
        .host
        .run_turn(&w.runtime, &b, "find the key")
        .await
        .unwrap();
    let codes: Vec<&str> = r
        .tool_results
        .iter()
        .map(|v| v["error"]["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        [
            "invalid-arguments",
            "not-found",
            "scope-denied",
            "invalid-arguments"
        ]
    );
}

/// 0004 §14.9, plan §6.10: without the agent/context seam, agent-managed is refused with a
/// reason and the binding stays dsh-native.
#[tokio::test]
async fn a09_agent_managed_refused_without_the_seam() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    w.session("s1", "c1").await;
    assert!(!w.runtime.capabilities().managed.is_available());
    let err = w
        .runtime
        .switch_mode(&sid("s1"), ContextMode::AgentManaged)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no agent/context seam"), "{err}");
    assert_eq!(
        w.store
            .load_state()
            .await
            .unwrap()
            .0
            .binding(&sid("s1"))
            .unwrap()
            .context_mode(),
        Some(ContextMode::DshNative)
    );
    assert!(!types(&w.events("s1")).contains(&"agent-tavern/context-mode".to_owned()));
}

/// Plan §6.5: concurrent CAS writes through the tools: exactly one wins, the loser is told the
/// current revision.
#[tokio::test]
async fn b05_concurrent_memory_and_variable_cas() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let agent = w.session("s1", "c1").await;
    let set = w
        .runtime
        .call_tool(
            &agent,
            "c0",
            "variable_set",
            &json!({"name": "hp", "value": 10}),
        )
        .await;
    let rev = set["revision"].clone();
    let (nine, eight) = (
        json!({"name": "hp", "value": 9, "revision": rev}),
        json!({"name": "hp", "value": 8, "revision": rev}),
    );
    let (x, y) = tokio::join!(
        w.runtime.call_tool(&agent, "c1", "variable_set", &nine),
        w.runtime.call_tool(&agent, "c2", "variable_set", &eight),
    );
    let (win, lose) = if x.get("error").is_none() {
        (x, y)
    } else {
        (y, x)
    };
    assert!(win.get("error").is_none());
    assert_eq!(lose["error"]["code"], "revision-conflict");
    assert_eq!(lose["error"]["currentRevision"], win["revision"]);
    let m = w
        .runtime
        .call_tool(&agent, "c3", "memory_write", &json!({"content": "a fact"}))
        .await;
    let args = json!({"id": m["id"], "revision": m["revision"], "content": "changed"});
    let (p, q) = tokio::join!(
        w.runtime.call_tool(&agent, "c4", "memory_update", &args),
        w.runtime.call_tool(&agent, "c5", "memory_update", &args),
    );
    assert_eq!(
        [&p, &q].iter().filter(|v| v.get("error").is_none()).count(),
        1
    );
}

/// Plan §6.6: the same event twice is projected once; after a restart the projection
/// continues from the checkpoint.
#[tokio::test]
async fn b06_duplicate_events_project_once_and_restart_continues() {
    let dir = tempfile::tempdir().unwrap();
    {
        let w = World::open(dir.path(), rc6());
        let agent = w.session("s1", "c1").await;
        w.host.script([ModelStep::Reply("first reply".into())]);
        w.host.run_turn(&w.runtime, &agent, "first").await.unwrap();
        for e in w.events("s1") {
            w.runtime
                .on_logged_event(&sid("s1"), &decode_logged(&e))
                .await
                .unwrap();
        }
    }
    let w = World::open(dir.path(), rc6());
    let agent = AgentId::parse("s1").unwrap();
    w.host.create_agent(&w.runtime, &agent).await.unwrap();
    w.runtime.resume(&sid("s1")).await.unwrap();
    w.host.script([ModelStep::Reply("second reply".into())]);
    w.host.run_turn(&w.runtime, &agent, "second").await.unwrap();
    let texts: Vec<String> = w.chat("c1").await.into_iter().map(|l| l.1).collect();
    assert_eq!(
        &texts[1..],
        ["first", "first reply", "second", "second reply"]
    );
}

/// Plan §6.7: Stop and provider errors leave no half assistant line; tool writes made before
/// remain, audited with their tool call.
#[tokio::test]
async fn b07_stop_and_provider_error_leave_no_half_message_but_keep_audited_writes() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let agent = w.session("s1", "c1").await;
    w.host.script([
        ModelStep::Tools(vec![ToolCallPlan::new(
            "memory_write",
            json!({"content": "Kai paid the ferryman"}),
        )]),
        ModelStep::Stop {
            partial: "The ferryman nods and".into(),
        },
    ]);
    let r = w
        .host
        .run_turn(&w.runtime, &agent, "pay the ferryman")
        .await
        .unwrap();
    assert_eq!(r.reason, "aborted");
    w.host
        .script([ModelStep::ProviderError("STREAM_CLOSED".into())]);
    let r = w
        .host
        .run_turn(&w.runtime, &agent, "are you there?")
        .await
        .unwrap();
    assert_eq!(r.reason, "error");
    let chat = w.chat("c1").await;
    assert_eq!(
        chat[1..],
        [
            (true, "pay the ferryman".to_owned()),
            (true, "are you there?".to_owned())
        ]
    );
    let scope = tavern_core::ScopeKey::Chat {
        character: CharacterName::parse("Seraphina").unwrap(),
        chat: ChatId::parse("c1").unwrap(),
    };
    let audit = w.store.memory_audit(&scope, None).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].source.tool_call_id.as_deref(), Some("call-1-1-0"));
}
