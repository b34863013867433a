//! Runtime behaviour beyond the acceptance lists: greetings, forks, turn variables, tavern
//! mode prompts, projection failure and recovery, and the fake host's strictness.

mod common;

use tavern_dsh_adapter::dsh::event::decode_logged;

use common::{rc6, World};
use serde_json::json;
use tavern_core::{AgentId, CharacterName, ChatId, SessionId, TavernArchitecture};
use tavern_dsh_adapter::fake::{FakeHost, ModelStep, ToolCallPlan};
use tavern_runtime::runtime::KERNEL_SECTION;
use tavern_runtime::tavern_mode::{handle_route, RouteRequest, TavernModePreset, PERSONA_SECTION};
use tavern_store::{ChatStore, PromptStore};

fn sid(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

#[tokio::test]
async fn the_greeting_is_recorded_without_counting_as_a_model_turn() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let agent = w.session("s1", "c1").await;
    let events = w.events("s1");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "agent-tavern/greeting");
    assert_eq!(w.host.model_calls(), 0);
    let chat = w.chat("c1").await;
    assert_eq!(chat.len(), 1);
    assert!(!chat[0].0 && chat[0].1.contains("Seraphina"));
    w.host.script([ModelStep::Reply("Rest now.".into())]);
    let r = w
        .host
        .run_turn(&w.runtime, &agent, "thank you")
        .await
        .unwrap();
    assert_eq!(r.turn, 1, "the greeting is not turn 1");
    assert_eq!(
        w.host.requests()[0].messages[0].role,
        "assistant",
        "the model sees the greeting"
    );
}

#[tokio::test]
async fn forking_into_the_other_architecture_keeps_a_back_link() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let agent = w.session("s1", "c1").await;
    w.host.script([ModelStep::Reply("Welcome.".into())]);
    w.host.run_turn(&w.runtime, &agent, "hello").await.unwrap();
    let b = w
        .runtime
        .fork(
            &sid("s1"),
            &sid("s2"),
            &ChatId::parse("c1 fork").unwrap(),
            TavernArchitecture::St,
        )
        .await
        .unwrap();
    assert_eq!(b.architecture(), TavernArchitecture::St);
    let file = w
        .store
        .read_chat(
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("c1 fork").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(file.parent_chat(), Some(ChatId::parse("c1").unwrap()));
    assert_eq!(file.lines.len(), 4, "header, greeting, user, reply copied");
    assert_eq!(w.chat("c1").await.len(), 3, "the origin is untouched");
}

/// SillyTavern's chat variables (`chat_metadata.variables`, what `/setvar` writes) cross
/// architectures with a fork: into agent-tavern they become chat-scope variables, back into
/// `st` they are written in SillyTavern's shape. Chat ids as real users have them.
#[tokio::test]
async fn forks_carry_sillytavern_variables_across_architectures() {
    use tavern_core::{BindingTarget, MemorySource, ScopeKey, SessionBinding, VariableName};
    use tavern_store::{StateStoreExt, VariableStore};
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let sera = CharacterName::parse("Seraphina").unwrap();
    let st_chat = ChatId::parse("七大姑 - 2024-10-05@21h59m30s").unwrap();
    let header = r#"{"user_name":"Kai","character_name":"Seraphina","create_date":"2024-10-05@21h59m30s","chat_metadata":{"note_prompt":"","variables":{"好感度":"50","hp":10,"inventory":"[\"lantern\"]","my var":"kept as is"}}}"#;
    let lines = vec![
        tavern_core::chat::ChatLine::parse(header).unwrap(),
        tavern_core::chat::ChatLine::parse(r#"{"name":"Seraphina","is_user":false,"send_date":"October 5, 2024 9:59pm","mes":"Welcome back."}"#).unwrap(),
    ];
    w.store
        .rewrite_chat(&sera, &st_chat, &lines, None)
        .await
        .unwrap();
    let target = BindingTarget {
        character: sera.clone(),
        chat_id: st_chat.clone(),
        group: false,
    };
    w.store
        .update(|s: &mut tavern_core::TavernState| {
            s.set_binding(
                sid("st1"),
                SessionBinding::St {
                    target: target.clone(),
                },
            );
            Ok::<_, tavern_store::StoreError>(())
        })
        .await
        .unwrap();

    // st → agent-tavern: the variables become chat-scope variables of the new chat.
    let at_chat = ChatId::parse("Branch #38 - 2024-1-5@16h52m07s").unwrap();
    let b = w
        .runtime
        .fork(
            &sid("st1"),
            &sid("at1"),
            &at_chat,
            TavernArchitecture::AgentTavern,
        )
        .await
        .unwrap();
    assert_eq!(b.architecture(), TavernArchitecture::AgentTavern);
    let scope = ScopeKey::Chat {
        character: sera.clone(),
        chat: at_chat.clone(),
    };
    let var = |n: &str| VariableName::parse(n).unwrap();
    // `(name, value)`: values keep SillyTavern's types.
    for (name, value) in [
        ("好感度", json!("50")),
        ("hp", json!(10)),
        ("inventory", json!("[\"lantern\"]")),
    ] {
        let got = w.store.get(&scope, &var(name)).await.unwrap().unwrap();
        assert_eq!(got.value, value, "{name}");
    }
    let at_file = w.store.read_chat(&sera, &at_chat).await.unwrap().unwrap();
    let at_header = serde_json::Value::Object(at_file.lines[0].object().clone());
    assert_eq!(
        at_header["chat_metadata"]["variables"],
        json!({"my var": "kept as is"}),
        "a name that is no variable name stays in the metadata"
    );
    assert_eq!(
        at_header["chat_metadata"]["main_chat"],
        "七大姑 - 2024-10-05@21h59m30s"
    );
    assert_eq!(
        w.store
            .read_chat(&sera, &st_chat)
            .await
            .unwrap()
            .unwrap()
            .lines,
        lines,
        "the origin is untouched"
    );

    // The agent-tavern session changes its variables; forking back writes them in ST's shape.
    let hp = w.store.get(&scope, &var("hp")).await.unwrap().unwrap();
    w.store
        .set(
            &scope,
            &var("hp"),
            json!(7),
            Some(&hp.revision),
            MemorySource::system(),
        )
        .await
        .unwrap();
    w.store
        .set(
            &scope,
            &var("flags"),
            json!({"met": true}),
            None,
            MemorySource::system(),
        )
        .await
        .unwrap();
    w.store
        .set(
            &scope,
            &var("brave"),
            json!(true),
            None,
            MemorySource::system(),
        )
        .await
        .unwrap();
    let back = ChatId::parse("七大姑 (back), 2024-10-06@08h00m00s").unwrap();
    let b = w
        .runtime
        .fork(&sid("at1"), &sid("st2"), &back, TavernArchitecture::St)
        .await
        .unwrap();
    assert_eq!(b.architecture(), TavernArchitecture::St);
    let file = w.store.read_chat(&sera, &back).await.unwrap().unwrap();
    let h = serde_json::Value::Object(file.lines[0].object().clone());
    assert_eq!(
        h["chat_metadata"]["variables"],
        json!({
            "my var": "kept as is",
            "brave": "true",
            "flags": "{\"met\":true}",
            "hp": 7,
            "inventory": "[\"lantern\"]",
            "好感度": "50"
        })
    );
    assert_eq!(
        file.parent_chat(),
        Some(ChatId::parse("Branch #38 - 2024-1-5@16h52m07s").unwrap())
    );
    // Nothing else touched either side: the agent-tavern chat's variables are as they were.
    assert_eq!(
        w.store
            .get(&scope, &var("hp"))
            .await
            .unwrap()
            .unwrap()
            .value,
        json!(7)
    );
}

#[tokio::test]
async fn turn_variables_are_cleared_when_the_turn_ends() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let agent = w.session("s1", "c1").await;
    w.host.script([
        ModelStep::Tools(vec![
            ToolCallPlan::new(
                "variable_set",
                json!({"name": "scratch", "value": 1, "scope": "turn"}),
            ),
            ToolCallPlan::new("variable_set", json!({"name": "kept", "value": 1})),
        ]),
        ModelStep::Tools(vec![ToolCallPlan::new(
            "variable_get",
            json!({"name": "scratch", "scope": "turn"}),
        )]),
        ModelStep::Reply("done".into()),
        ModelStep::Tools(vec![
            ToolCallPlan::new("variable_get", json!({"name": "scratch", "scope": "turn"})),
            ToolCallPlan::new("variable_get", json!({"name": "kept"})),
        ]),
        ModelStep::Reply("later".into()),
    ]);
    let r = w.host.run_turn(&w.runtime, &agent, "one").await.unwrap();
    assert_eq!(r.tool_results[2]["value"], 1, "visible within the turn");
    let r = w.host.run_turn(&w.runtime, &agent, "two").await.unwrap();
    assert_eq!(
        r.tool_results[0]["error"]["code"], "not-found",
        "gone after the turn"
    );
    assert_eq!(r.tool_results[1]["value"], 1);
}

#[tokio::test]
async fn tavern_mode_prompts_are_per_session_literal_and_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let w = World::open(dir.path(), rc6());
        let a = w.session("s1", "c1").await;
        let b = w.session("s2", "c2").await;
        let custom = "You are {{char}}; speak in riddles to {{user}}.";
        w.store.save_prompt(&sid("s1"), custom).await.unwrap();
        assert_eq!(
            w.runtime
                .section_text(&a, PERSONA_SECTION)
                .await
                .unwrap()
                .as_deref(),
            Some(custom)
        );
        assert_eq!(
            w.runtime.section_text(&b, PERSONA_SECTION).await.unwrap(),
            Some(TavernModePreset::default().default_prompt)
        );
        w.host.script([ModelStep::Reply("A riddle.".into())]);
        w.host.run_turn(&w.runtime, &a, "hi").await.unwrap();
        let system = &w.host.requests()[0].system;
        assert!(system.contains(custom), "braces stay literal: {system}");
        assert!(
            system.find(custom) < system.find("AgentTavern roleplay kernel"),
            "persona (order 0) before the kernel (order 50)"
        );
    }
    let w = World::open(dir.path(), rc6());
    let a = AgentId::parse("s1").unwrap();
    assert!(w
        .runtime
        .section_text(&a, PERSONA_SECTION)
        .await
        .unwrap()
        .unwrap()
        .contains("riddles"));
    let kernel = w
        .runtime
        .section_text(&a, KERNEL_SECTION)
        .await
        .unwrap()
        .unwrap();
    assert!(kernel.contains("You are Seraphina"));
    // The user is the chat's persona (the assets' "Kai"), not the configured fallback name.
    assert!(kernel.contains("in a roleplay with Kai"), "{kernel}");
    assert!(
        !kernel.contains(dir.path().to_str().unwrap()),
        "no paths in the kernel"
    );
    assert_eq!(
        w.runtime
            .section_text(&AgentId::parse("nobody").unwrap(), KERNEL_SECTION)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn the_route_contract_answers_every_case() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let preset = TavernModePreset::default();
    let store = w.store.clone();
    let call = |method: &'static str, admitted: bool, body: String| {
        let store = store.clone();
        async move {
            let req = RouteRequest {
                method,
                admitted,
                body: body.as_bytes(),
            };
            handle_route(req, &*store, &TavernModePreset::default()).await
        }
    };
    let cases = [
        (
            "GET",
            true,
            json!({"action": "read", "sessionId": "s1"}).to_string(),
            405,
            "method-not-allowed",
        ),
        (
            "POST",
            false,
            json!({"action": "read", "sessionId": "s1"}).to_string(),
            401,
            "unauthorized",
        ),
        ("POST", true, "not json".to_owned(), 400, "bad-request"),
        (
            "POST",
            true,
            json!({"action": "delete", "sessionId": "s1"}).to_string(),
            400,
            "unknown-action",
        ),
        (
            "POST",
            true,
            json!({"action": "read", "sessionId": "../x"}).to_string(),
            400,
            "bad-session",
        ),
        (
            "POST",
            true,
            json!({"action": "save", "sessionId": "s1"}).to_string(),
            400,
            "bad-request",
        ),
        (
            "POST",
            true,
            json!({"action": "save", "sessionId": "s1", "text": "x".repeat(40_000)}).to_string(),
            413,
            "too-long",
        ),
    ];
    for (method, admitted, body, status, code) in cases {
        let r = call(method, admitted, body).await;
        assert_eq!((r.status, r.body["error"].as_str()), (status, Some(code)));
    }
    let r = call(
        "POST",
        true,
        json!({"action": "read", "sessionId": "s1"}).to_string(),
    )
    .await;
    assert_eq!(
        (r.status, r.body["custom"].clone(), r.body["text"].as_str()),
        (200, json!(false), Some(preset.default_prompt.as_str()))
    );
    let r = call(
        "POST",
        true,
        json!({"action": "save", "sessionId": "s1", "text": "Be {{char}}."}).to_string(),
    )
    .await;
    assert_eq!(
        (r.status, r.body["text"].as_str()),
        (200, Some("Be {{char}}."))
    );
    let r = call(
        "POST",
        true,
        json!({"action": "save", "sessionId": "s1", "text": "  "}).to_string(),
    )
    .await;
    assert_eq!(r.body["custom"], false, "empty save resets");
    assert_eq!(
        w.store.get_prompt(&sid("s1")).await.unwrap(),
        None,
        "no empty record"
    );
    call(
        "POST",
        true,
        json!({"action": "save", "sessionId": "s1", "text": "x"}).to_string(),
    )
    .await;
    let r = call(
        "POST",
        true,
        json!({"action": "reset", "sessionId": "s1"}).to_string(),
    )
    .await;
    assert_eq!(r.body["custom"], false);
}

#[tokio::test]
async fn a_disk_failure_on_save_answers_500_and_changes_nothing() {
    let clock = std::sync::Arc::new(tavern_store::clock::ManualClock::new(common::T0));
    let store = tavern_store::mem::MemStore::new(clock);
    store.save_prompt(&sid("s1"), "old").await.unwrap();
    store.fail_next("prompt.save");
    let body = json!({"action": "save", "sessionId": "s1", "text": "new"}).to_string();
    let r = handle_route(
        RouteRequest {
            method: "POST",
            admitted: true,
            body: body.as_bytes(),
        },
        &store,
        &TavernModePreset::default(),
    )
    .await;
    assert_eq!(
        (r.status, r.body["error"].as_str()),
        (500, Some("save-failed"))
    );
    assert!(r.body["message"].as_str().unwrap().contains("injected"));
    assert_eq!(
        store.get_prompt(&sid("s1")).await.unwrap().unwrap().text,
        "old"
    );
}

#[tokio::test]
async fn the_fake_host_is_strict() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    let agent = w.session("s1", "c1").await;
    let err = w
        .host
        .run_turn(&w.runtime, &agent, "hello?")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unscripted model call"), "{err}");
    // A tool the agent was not given is refused by the host, not run.
    let plain = AgentId::parse("plain").unwrap();
    w.host.create_agent(&w.runtime, &plain).await.unwrap();
    w.host.script([
        ModelStep::Tools(vec![ToolCallPlan::new(
            "memory_write",
            json!({"content": "x"}),
        )]),
        ModelStep::Reply("ok".into()),
    ]);
    let r = w.host.run_turn(&w.runtime, &plain, "write").await.unwrap();
    assert_eq!(r.tool_results[0]["error"]["code"], "unknown-tool");
    let st = tempfile::tempdir().unwrap();
    let host = FakeHost::open(st.path(), rc6()).unwrap();
    host.script([ModelStep::Reply("unused".into())]);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(host)));
    let message = dropped.unwrap_err().downcast::<String>().unwrap();
    assert!(message.contains("1 unused model script step"), "{message}");
}

#[tokio::test]
async fn the_host_log_survives_a_restart_with_contiguous_seqs() {
    let dir = tempfile::tempdir().unwrap();
    {
        let w = World::open(dir.path(), rc6());
        let agent = w.session("s1", "c1").await;
        w.host.script([ModelStep::Reply("one".into())]);
        w.host.run_turn(&w.runtime, &agent, "first").await.unwrap();
    }
    let w = World::open(dir.path(), rc6());
    let agent = AgentId::parse("s1").unwrap();
    w.host.create_agent(&w.runtime, &agent).await.unwrap();
    w.host.script([ModelStep::Reply("two".into())]);
    let r = w.host.run_turn(&w.runtime, &agent, "second").await.unwrap();
    assert_eq!(r.turn, 2);
    let events = w.events("s1");
    assert!(events.iter().enumerate().all(|(i, e)| e["seq"] == i as u64));
    assert_eq!(w.chat("c1").await.len(), 5);
}

#[tokio::test]
async fn a_projection_failure_never_fails_the_turn_and_resume_fills_the_gap() {
    let clock = std::sync::Arc::new(tavern_store::clock::ManualClock::new(common::T0));
    let store = std::sync::Arc::new(tavern_store::mem::MemStore::new(clock.clone()));
    let dir = tempfile::tempdir().unwrap();
    let host = std::sync::Arc::new(FakeHost::open(dir.path(), rc6()).unwrap());
    let runtime = tavern_dsh_adapter::Runtime::new(
        host.clone(),
        store.clone(),
        common::assets(),
        clock,
        tavern_dsh_adapter::RuntimeConfig::default(),
    );
    runtime
        .new_chat(
            &sid("s1"),
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("c1").unwrap(),
            false,
        )
        .await
        .unwrap();
    let agent = AgentId::parse("s1").unwrap();
    host.create_agent(&runtime, &agent).await.unwrap();
    // Every append of this turn fails (user message, assistant message, step end, turn end).
    for _ in 0..4 {
        store.fail_next("chat.append");
    }
    host.script([ModelStep::Reply("still here".into())]);
    let r = host.run_turn(&runtime, &agent, "hello").await.unwrap();
    assert_eq!(r.reply.as_deref(), Some("still here"));
    assert_eq!(r.projection_errors.len(), 4, "{:?}", r.projection_errors);
    store.assert_no_pending_faults().unwrap();
    assert_eq!(runtime.pending_projections().await.unwrap().len(), 1);
    runtime.resume(&sid("s1")).await.unwrap();
    assert!(runtime.pending_projections().await.unwrap().is_empty());
    let file = store
        .read_chat(
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("c1").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    let texts: Vec<String> = file
        .lines
        .iter()
        .skip(1)
        .map(|l| l.text().to_owned())
        .collect();
    assert_eq!(texts[1..], ["hello", "still here"]);
}

#[tokio::test]
async fn an_event_without_an_envelope_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), rc6());
    w.session("s1", "c1").await;
    let err = w
        .runtime
        .on_logged_event(
            &sid("s1"),
            &decode_logged(&json!({"type": "turn/start", "data": {}})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid event for session s1: turn/start event without a seq"
    );
}
