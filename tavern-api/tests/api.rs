//! The management API's handlers over a real runtime, strict in-memory store and host, with
//! real SillyTavern assets: one test per status code the API answers, and the flows a user
//! who lost a memory walks through.

mod common;

use std::path::Path;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::{code, harness, harness_on, sid};
use serde_json::{json, Value};
use tavern_core::{CharacterName, ChatId, HostFacts};
use tavern_projector::event::{TurnEndReason, UserSource};
use tavern_projector::EventKind;
use tavern_runtime::testkit::MemHost;
use tavern_store::ChatStore;
use tower::ServiceExt;

const CHAT_Q: &str = "scope=chat&character=Seraphina&chat=Seraphina%20-%201";

#[tokio::test]
async fn sessions_list_with_architecture_mode_and_why_managed_is_unavailable() {
    // DSH rc.6: no agent/context seam.
    let h = harness_on(MemHost::new(HostFacts::bare("dsh 0.1.0-rc.6")), None);
    h.session("s1", "Seraphina - 1").await;
    let (status, body) = h.get("/api/v1/sessions").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["total"], 1);
    let s = &body["sessions"][0];
    assert_eq!(s["session"], "s1");
    assert_eq!(s["architecture"], "agent-tavern");
    assert_eq!(s["contextMode"], "dsh-native");
    let managed = s["modes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mode"] == "agent-managed")
        .unwrap();
    assert_eq!(managed["available"], false);
    assert!(
        managed["reason"]
            .as_str()
            .unwrap()
            .contains("agent/context"),
        "{managed}"
    );
    let (status, one) = h.get("/api/v1/sessions/s1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one["chat"], "Seraphina - 1");
    assert_eq!(
        h.get("/api/v1/sessions?limit=0").await.0,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn a_memory_is_created_audited_as_the_users_and_found_by_search() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    let (status, created) = h
        .call(
            "POST",
            "/api/v1/memories?session=s1",
            Some(json!({
                "scope": {"kind": "chat", "character": "Seraphina", "chat": "Seraphina - 1"},
                "id": "silver-gate", "content": "银色大门在北方, past the river spirits.",
                "tags": ["place"], "kind": "semantic"
            })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["state"], "live");
    assert_eq!(created["source"]["kind"], "user");
    assert_eq!(created["source"]["session"], "s1");
    let (status, page) = h
        .get(&format!("/api/v1/memories?{CHAT_Q}&q=%E5%A4%A7%E9%97%A8"))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["total"], 1);
    assert_eq!(page["items"][0]["memory"]["id"], "silver-gate");
    let (_, hist) = h
        .get(&format!("/api/v1/memories/silver-gate/history?{CHAT_Q}"))
        .await;
    assert_eq!(hist["entries"][0]["action"], "created");
    assert_eq!(hist["entries"][0]["source"]["kind"], "user");
    // Creating it again is a conflict naming the revision that exists.
    let (status, again) = h
        .call(
            "POST",
            "/api/v1/memories",
            Some(json!({
                "scope": {"kind": "chat", "character": "Seraphina", "chat": "Seraphina - 1"},
                "id": "silver-gate", "content": "x"
            })),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(again["error"]["current"], created["revision"]);
}

#[tokio::test]
async fn bad_requests_name_what_is_wrong() {
    let h = harness();
    for (uri, needle) in [
        (
            "/api/v1/memories?scope=chat&character=Seraphina",
            "scope chat needs chat",
        ),
        ("/api/v1/memories?scope=planet", "unknown scope \"planet\""),
        ("/api/v1/memories?chat=x", "chat needs scope"),
        (
            "/api/v1/memories?scope=global&agent=a",
            "agent does not apply to scope global",
        ),
        ("/api/v1/memories?kind=dream", "unknown kind \"dream\""),
        (
            "/api/v1/memories?limit=101",
            "limit 101: must be from 1 to 100",
        ),
        ("/api/v1/memories?limit=lots", "invalid query"),
        ("/api/v1/memories/m1", "scope is required"),
    ] {
        let (status, body) = h.get(uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert_eq!(code(&body), "bad_request");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{uri}: {msg}");
    }
    let (status, body) = h
        .call(
            "PUT",
            &format!("/api/v1/memories/m1?{CHAT_Q}"),
            Some(json!({"revision": "not a revision!"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = h
        .call("POST", "/api/v1/memories", Some(json!({"unexpected": 1})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("invalid json body"));
}

#[tokio::test]
async fn a_token_is_required_when_the_server_has_one() {
    let h = harness_on(MemHost::capable(), Some("s3cret-token"));
    for auth in [
        None,
        Some("Bearer wrong-token!"),
        Some("Bearer s3cret-toke"),
        Some("s3cret-token"),
    ] {
        let mut req = Request::get("/api/v1/settings").header(header::HOST, "tavern.example:443");
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        let res = h
            .api
            .router()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        assert_eq!(res.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
    let req = Request::get("/api/v1/settings")
        .header(header::HOST, "tavern.example:443")
        .header(header::AUTHORIZATION, "Bearer s3cret-token")
        .body(Body::empty())
        .unwrap();
    let (status, body) = h.send(req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn without_a_token_only_loopback_names_are_answered() {
    let h = harness();
    let req = Request::get("/api/v1/settings")
        .header(header::HOST, "evil.example")
        .body(Body::empty())
        .unwrap();
    let (status, body) = h.send(req).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(code(&body), "forbidden_host");
    let req = Request::get("/api/v1/settings")
        .header(header::HOST, "localhost:7300")
        .body(Body::empty())
        .unwrap();
    assert_eq!(h.send(req).await.0, StatusCode::OK);
}

#[tokio::test]
async fn another_sessions_records_are_not_found_through_a_session() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    h.session("s2", "Seraphina - 2").await;
    let scope2 = json!({"kind": "chat", "character": "Seraphina", "chat": "Seraphina - 2"});
    let (status, _) = h
        .call(
            "POST",
            "/api/v1/memories",
            Some(json!({"scope": scope2, "id": "secret", "content": "s2 only"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let q2 = "scope=chat&character=Seraphina&chat=Seraphina%20-%202";
    // Through s2 it is there; through s1 the same id in s2's chat is not found.
    assert_eq!(
        h.get(&format!("/api/v1/memories/secret?{q2}&session=s2"))
            .await
            .0,
        StatusCode::OK
    );
    let (status, body) = h
        .get(&format!("/api/v1/memories/secret?{q2}&session=s1"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (_, page) = h.get("/api/v1/memories?session=s1").await;
    assert_eq!(page["total"], 0, "s1 sees none of s2's chat: {page}");
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/memories?session=s1",
            Some(json!({"scope": scope2, "id": "planted", "content": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = h.get("/api/v1/nothing-here").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(code(&body), "not_found");
}

#[tokio::test]
async fn a_stale_edit_is_a_conflict_with_the_current_revision_and_resolves_by_rereading() {
    let h = harness();
    let scope = json!({"kind": "global"});
    let (_, first) = h
        .call(
            "POST",
            "/api/v1/memories",
            Some(json!({"scope": scope, "id": "compass", "content": "Kai carries a compass."})),
        )
        .await;
    let uri = "/api/v1/memories/compass?scope=global";
    let (status, second) = h
        .call(
            "PUT",
            uri,
            Some(
                json!({"revision": first["revision"], "content": "Kai carries a cracked compass."}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(
        second["importance"], first["importance"],
        "absent fields stay"
    );
    // A second tab still holding the first revision.
    let (status, stale) = h
        .call(
            "PUT",
            uri,
            Some(json!({"revision": first["revision"], "content": "lost edit"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(code(&stale), "conflict");
    assert_eq!(stale["error"]["current"], second["revision"]);
    let (_, now) = h.get(uri).await;
    assert_eq!(
        now["content"], "Kai carries a cracked compass.",
        "nothing lost"
    );
    let (status, merged) = h
        .call(
            "PUT",
            uri,
            Some(json!({"revision": now["revision"], "content": "Kai carries a cracked compass (lost edit merged)."})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{merged}");
}

#[tokio::test]
async fn forget_then_restore_brings_the_memory_back_whole() {
    let h = harness();
    let (_, m) = h
        .call(
            "POST",
            "/api/v1/memories",
            Some(
                json!({"scope": {"kind": "character", "character": "Seraphina"}, "id": "fear",
                "content": "Seraphina fears deep water.", "tags": ["fear"], "importance": 0.9}),
            ),
        )
        .await;
    let q = "scope=character&character=Seraphina";
    let (status, gone) = h
        .call(
            "POST",
            &format!("/api/v1/memories/fear/forget?{q}"),
            Some(json!({"revision": m["revision"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{gone}");
    assert_eq!(gone["state"], "forgotten");
    let (_, live) = h.get(&format!("/api/v1/memories?{q}")).await;
    assert_eq!(live["total"], 0);
    let (_, all) = h.get(&format!("/api/v1/memories?{q}&forgotten=true")).await;
    assert_eq!(all["items"][0]["memory"]["state"], "forgotten");
    let (status, twice) = h
        .call(
            "POST",
            &format!("/api/v1/memories/fear/forget?{q}"),
            Some(json!({"revision": gone["revision"]})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(code(&twice), "forgotten");
    let (status, edit) = h
        .call(
            "PUT",
            &format!("/api/v1/memories/fear?{q}"),
            Some(json!({"revision": gone["revision"], "content": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{edit}");
    assert_eq!(code(&edit), "forgotten");
    let (status, back) = h
        .call(
            "POST",
            &format!("/api/v1/memories/fear/restore?{q}"),
            Some(json!({"revision": gone["revision"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{back}");
    assert_eq!(back["state"], "live");
    assert_eq!(back["content"], m["content"]);
    assert_eq!(back["tags"], json!(["fear"]));
    assert_eq!(back["importance"], 0.9);
    let (_, hist) = h.get(&format!("/api/v1/memories/fear/history?{q}")).await;
    let actions: Vec<&str> = hist["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["created", "forgotten", "restored"]);
    // Each version names its text; forgetting and restoring left it as it was.
    let entries = hist["entries"].as_array().unwrap();
    assert_eq!(entries[0]["content"], m["content"], "{hist}");
    for e in &entries[1..] {
        assert_eq!(e["sameText"], true, "{e}");
        assert!(e.get("content").is_none(), "{e}");
    }
    let (status, _) = h
        .call(
            "POST",
            &format!("/api/v1/memories/fear/restore?{q}"),
            Some(json!({"revision": back["revision"]})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "restoring a live memory");
}

#[tokio::test]
async fn bodies_and_values_over_their_limits_are_413_naming_the_limit() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    let huge = "x".repeat(tavern_api::MAX_BODY_BYTES + 10);
    let (status, body) = h
        .call(
            "PUT",
            "/api/v1/sessions/s1/prompt",
            Some(json!({"text": huge})),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["limit"], "request body bytes");
    let (status, body) = h
        .call(
            "PUT",
            "/api/v1/sessions/s1/prompt",
            Some(json!({"text": "词".repeat(20_000)})),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["limit"], "system prompt bytes");
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/memories",
            Some(json!({"scope": {"kind": "global"}, "id": "big", "content": "y".repeat(70_000)})),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("70000"),
        "{body}"
    );
}

#[tokio::test]
async fn writes_must_be_json() {
    let h = harness();
    let req = Request::post("/api/v1/memories")
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("id=x&content=y"))
        .unwrap();
    let (status, body) = h.send(req).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(code(&body), "unsupported_media_type");
}

#[tokio::test]
async fn a_store_failure_is_500_and_writes_nothing() {
    let h = harness();
    h.store.fail_next("memory.search");
    let (status, body) = h.get("/api/v1/memories").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(code(&body), "internal");
    h.store.assert_no_pending_faults().unwrap();
}

#[tokio::test]
async fn mode_switches_follow_the_rules_and_are_logged() {
    // A host without the seam: agent-managed is refused with the host's reason.
    let h = harness_on(MemHost::new(HostFacts::bare("dsh 0.1.0-rc.6")), None);
    h.session("s1", "Seraphina - 1").await;
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/mode",
            Some(json!({"mode": "agent-managed"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["rule"], "unavailable");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("agent/context"));

    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    h.host.set_running(&sid("s1"), true).unwrap();
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/mode",
            Some(json!({"mode": "agent-managed"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["rule"], "agent-busy");
    h.host.set_running(&sid("s1"), false).unwrap();
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/mode",
            Some(json!({"mode": "agent-managed"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["contextMode"], "agent-managed");
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/mode",
            Some(json!({"mode": "agent-managed"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["rule"], "already-in-mode");
    let (status, _) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/mode",
            Some(json!({"mode": "warp"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_host_that_cannot_answer_is_503() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    // The store has the binding; the host lost the session (restarted without it).
    let fresh = harness_on(MemHost::capable(), None);
    let state = h.runtime.state().await.unwrap();
    tavern_store::StateStoreExt::update(&*fresh.store, |s: &mut tavern_core::TavernState| {
        *s = state.clone();
        Ok::<_, tavern_store::StoreError>(())
    })
    .await
    .unwrap();
    let (status, body) = fresh
        .call(
            "POST",
            "/api/v1/sessions/s1/mode",
            Some(json!({"mode": "agent-managed"})),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(code(&body), "host_unavailable");
}

#[tokio::test]
async fn fork_into_st_makes_a_new_session_and_never_overwrites_a_chat() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    h.session("s2", "Seraphina - 2").await;
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/fork",
            Some(json!({"session": "s1-st", "chat": "Seraphina - 1 (st)", "architecture": "st"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["architecture"], "st");
    assert_eq!(body["contextMode"], Value::Null);
    let forked = h
        .store
        .read_chat(
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("Seraphina - 1 (st)").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    let header = forked.lines[0].raw();
    assert!(
        header.contains("\"main_chat\":\"Seraphina - 1\""),
        "{header}"
    );
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/fork",
            Some(json!({"session": "s9", "chat": "Seraphina - 2", "architecture": "st"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, _) = h
        .call(
            "POST",
            "/api/v1/sessions/nobody/fork",
            Some(json!({"session": "s9", "chat": "new", "architecture": "st"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_pending_projection_shows_why_and_replay_fills_it() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    let s1 = sid("s1");
    let events = [
        EventKind::TurnStart { turn: 1 },
        EventKind::UserMessage {
            source: UserSource::User,
            text: "我们去银色大门吧。".into(),
        },
        EventKind::StepStart { turn: 1, step: 1 },
        EventKind::AssistantMessage {
            turn: 1,
            step: 1,
            text: "Then north we go.".into(),
            has_tool_calls: false,
            interrupted: false,
        },
        EventKind::StepEnd { turn: 1, step: 1 },
        EventKind::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
        },
    ];
    h.store.fail_next("chat.append");
    // The host logs every event; the runtime sees them until the chat write fails, and the
    // host's later deliveries are lost (a crash): the log holds what the chat lacks.
    let mut failed = false;
    for kind in events {
        let e = h.host.log(&s1, kind).unwrap();
        if !failed {
            failed = h.runtime.on_event(&s1, &e).await.is_err();
        }
    }
    assert!(failed, "the injected append failure reached the projector");
    let (status, p) = h.get("/api/v1/sessions/s1/projection").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(p["status"], "pending", "{p}");
    assert!(
        p["pendingReason"].as_str().is_some_and(|r| !r.is_empty()),
        "{p}"
    );
    let (_, list) = h.get("/api/v1/sessions").await;
    assert_eq!(list["pendingProjections"], 1, "{list}");
    let (status, r) = h
        .call("POST", "/api/v1/sessions/s1/projection/replay", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["projection"]["status"], "ok", "{r}");
    let chat = h
        .store
        .read_chat(
            &CharacterName::parse("Seraphina").unwrap(),
            &ChatId::parse("Seraphina - 1").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    let text: Vec<&str> = chat.lines.iter().map(|l| l.raw()).collect();
    let text = text.join("\n");
    assert_eq!(text.matches("我们去银色大门吧").count(), 1, "{text}");
    assert_eq!(text.matches("Then north we go.").count(), 1, "{text}");
    // Again: nothing twice.
    let (_, again) = h
        .call("POST", "/api/v1/sessions/s1/projection/replay", None)
        .await;
    assert_eq!(again["appended"], 0, "{again}");
    h.store.assert_no_pending_faults().unwrap();
}

#[tokio::test]
async fn binding_to_an_existing_chat_names_the_nearest_when_it_is_missing() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    h.host.start(&sid("s2"));
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/sessions/s2/bind",
            Some(json!({"character": "Seraphina", "chat": "Seraphina - l"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(code(&body), "no_such_chat");
    assert_eq!(body["error"]["nearest"], json!(["Seraphina - 1"]));
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/sessions/s2/bind",
            Some(json!({"character": "Seraphina", "chat": "Seraphina - 1"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _) = h
        .call(
            "POST",
            "/api/v1/sessions/s2/bind",
            Some(json!({"character": "Seraphina", "chat": "Seraphina - 1"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn the_prompt_is_edited_kept_literally_and_reset() {
    let h = harness();
    // Only bound sessions have prompts: an unknown id creates no record.
    let (status, _) = h
        .call(
            "PUT",
            "/api/v1/sessions/ghost/prompt",
            Some(json!({"text": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    h.session("s1", "Seraphina - 1").await;
    let (_, p) = h.get("/api/v1/sessions/s1/prompt").await;
    assert_eq!(p["custom"], false);
    assert_eq!(p["text"], p["defaultText"]);
    let text = "你是{{char}}，和{{user}}在月下相遇。";
    let (status, p) = h
        .call(
            "PUT",
            "/api/v1/sessions/s1/prompt",
            Some(json!({"text": text})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{p}");
    assert_eq!(p["text"], text);
    assert_eq!(p["custom"], true);
    let (_, p) = h.call("DELETE", "/api/v1/sessions/s1/prompt", None).await;
    assert_eq!(p["custom"], false);
}

#[tokio::test]
async fn variables_are_typed_compare_and_set_and_patched_atomically() {
    let h = harness();
    let q = "scope=global";
    let (status, v) = h
        .call(
            "PUT",
            &format!("/api/v1/variables/gold?{q}"),
            Some(json!({"value": 12})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (status, v2) = h
        .call(
            "PUT",
            &format!("/api/v1/variables/gold?{q}"),
            Some(json!({"value": {"coins": 13}, "revision": v["revision"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v2}");
    let (status, stale) = h
        .call(
            "PUT",
            &format!("/api/v1/variables/gold?{q}"),
            Some(json!({"value": 0, "revision": v["revision"]})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(stale["error"]["current"], v2["revision"]);
    // One bad change: nothing of the patch is written.
    let (status, _) = h
        .call(
            "PATCH",
            &format!("/api/v1/variables?{q}"),
            Some(json!({"changes": [
                {"op": "set", "name": "hp", "value": 10},
                {"op": "set", "name": "gold", "value": 1, "revision": v["revision"]}
            ]})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        h.get(&format!("/api/v1/variables/hp?{q}")).await.0,
        StatusCode::NOT_FOUND
    );
    let (status, patched) = h
        .call(
            "PATCH",
            &format!("/api/v1/variables?{q}"),
            Some(json!({"changes": [
                {"op": "set", "name": "hp", "value": 10},
                {"op": "delete", "name": "gold", "revision": v2["revision"]}
            ]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    let (_, list) = h.get(&format!("/api/v1/variables?{q}")).await;
    assert_eq!(list["items"][0]["name"], "hp");
    assert_eq!(list["items"][0]["kind"], "number");
    assert_eq!(list["total"], 1);
    let (_, hist) = h.get(&format!("/api/v1/variables/gold/history?{q}")).await;
    let actions: Vec<&str> = hist["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["set", "set", "deleted"]);
    let (_, hp) = h.get(&format!("/api/v1/variables/hp?{q}")).await;
    let (status, _) = h
        .call(
            "DELETE",
            &format!(
                "/api/v1/variables/hp?{q}&revision={}",
                hp["revision"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn the_lore_tester_shows_what_a_text_activates_and_from_which_book() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    let (status, v) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/lore/test",
            Some(json!({"text": "tell me about the forest of eldoria"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["items"][0]["reason"], "keyword", "{v}");
    assert!(!v["source"]["books"].as_array().unwrap().is_empty(), "{v}");
    // The operator's tests do not spend the model's per-turn tool calls (32).
    for _ in 0..40 {
        let (status, v) = h
            .call(
                "POST",
                "/api/v1/sessions/s1/lore/test",
                Some(json!({"text": "eldoria"})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let agent = h.runtime.agent_of(&sid("s1")).unwrap();
    let model = h
        .runtime
        .call_tool(
            &agent,
            "c1",
            "tavern_lore_search",
            &json!({"query": "eldoria"}),
        )
        .await;
    assert!(model.get("error").is_none(), "{model}");
    // The operator's unmetered path runs read-only tools only.
    let write = h
        .runtime
        .call_tool_for_operator(&agent, "c2", "memory_write", &json!({"content": "x"}))
        .await;
    assert_eq!(write["error"]["code"], "invalid-arguments", "{write}");
    // Longer than the tool's query limit: 413 naming the limit, not the tool's 400.
    let (status, v) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/lore/test",
            Some(json!({"text": "森".repeat(501)})),
        )
        .await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("501 > 500"),
        "{v}"
    );
    let (status, v) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/lore/test",
            Some(json!({"text": "eldoria", "limit": 21})),
        )
        .await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{v}"
    );
    let (status, _) = h
        .call(
            "POST",
            "/api/v1/sessions/ghost/lore/test",
            Some(json!({"text": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn settings_change_for_new_sessions() {
    let h = harness();
    let (status, s) = h
        .call(
            "PUT",
            "/api/v1/settings",
            Some(json!({"defaultArchitecture": "st", "allowGlobalWrites": false})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(s["defaultArchitecture"], "st");
    h.session("s1", "Seraphina - 1").await;
    let (_, one) = h.get("/api/v1/sessions/s1").await;
    assert_eq!(one["architecture"], "st");
    let (status, _) = h
        .call(
            "PUT",
            "/api/v1/settings",
            Some(json!({"defaultContextMode": "warp"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_checked_in_openapi_document_is_the_generated_one() {
    let generated = tavern_api::openapi::pretty();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is not the generated document; run \
         `UPDATE_OPENAPI=1 cargo test -p tavern-api --test api openapi` and commit it"
    );
    let doc: Value = serde_json::from_str(&generated).unwrap();
    assert!(doc["paths"]["/api/v1/memories/{id}/restore"]["post"].is_object());
    // Operation ids are unique (OpenAPI requires it; clients name their methods by them), and
    // every operation lists the statuses any route can answer.
    let mut ids = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap();
            assert!(ids.insert(id.to_owned()), "{method} {path}: {id} again");
            for status in ["400", "401", "403", "500"] {
                assert!(
                    op["responses"][status].is_object(),
                    "{method} {path}: {status}"
                );
            }
            if method != "get" {
                assert!(op["responses"]["413"].is_object(), "{method} {path}: 413");
                assert!(op["responses"]["415"].is_object(), "{method} {path}: 415");
            }
        }
    }
    // Served too.
    let h = harness();
    let (status, served) = h.get("/api/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(served, doc);
}

fn forwarded() -> tavern_api::Forwarded {
    tavern_api::Forwarded {
        method: "GET".into(),
        path_and_query: "/".into(),
        content_type: None,
        body: Vec::new(),
        base: String::new(),
        cookie: None,
        accept_language: None,
        sign_in_token: None,
    }
}

#[tokio::test]
async fn a_forwarded_request_gets_the_same_answers_as_a_served_one() {
    let h = harness();
    let created = h
        .api
        .forward(tavern_api::Forwarded {
            method: "POST".into(),
            path_and_query: "/api/v1/memories".into(),
            content_type: Some("application/json".into()),
            body: json!({"scope": {"kind": "global"}, "id": "bell", "content": "钟声在午夜响起。"})
                .to_string()
                .into_bytes(),
            ..forwarded()
        })
        .await;
    assert_eq!(created.status, 201);
    assert_eq!(created.content_type, "application/json");
    let (_, listed) = h.get("/api/v1/memories?scope=global").await;
    assert_eq!(listed["items"][0]["memory"]["id"], "bell");
    let bad = h
        .api
        .forward(tavern_api::Forwarded {
            method: "POST".into(),
            path_and_query: "/api/v1/memories".into(),
            content_type: Some("text/plain".into()),
            body: b"id=x".to_vec(),
            ..forwarded()
        })
        .await;
    assert_eq!(bad.status, 415);
    let huge = h
        .api
        .forward(tavern_api::Forwarded {
            method: "PUT".into(),
            path_and_query: "/api/v1/sessions/s1/prompt".into(),
            content_type: Some("application/json".into()),
            body: vec![b' '; tavern_api::MAX_BODY_BYTES + 1],
            ..forwarded()
        })
        .await;
    assert_eq!(huge.status, 413);
    let nonsense = h
        .api
        .forward(tavern_api::Forwarded {
            method: "GET".into(),
            path_and_query: "not a path".into(),
            ..forwarded()
        })
        .await;
    assert_eq!(
        nonsense.status,
        400,
        "{}",
        String::from_utf8_lossy(&nonsense.body)
    );
}

#[tokio::test]
async fn a_long_history_keeps_the_newest_entries_and_says_how_many() {
    let h = harness();
    let max = tavern_api::routes::memories::MAX_HISTORY;
    let m = h.global_memory_edited("diary", "day", max + 4).await;
    let (_, hist) = h.get("/api/v1/memories/diary/history?scope=global").await;
    assert_eq!(hist["total"], max + 5);
    let entries = hist["entries"].as_array().unwrap();
    assert_eq!(entries.len(), max);
    assert_eq!(
        entries.last().unwrap()["revision"],
        m["revision"],
        "the newest is kept"
    );
}

#[tokio::test]
async fn a_server_without_a_store_check_says_so() {
    let h = harness();
    let (status, body) = h.get("/api/v1/store/check").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tavern check"));
}

#[tokio::test]
async fn what_a_page_on_another_site_can_send_is_refused_before_it_runs() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], StatusCode);
    let cases: [Case; 5] = [
        // `fetch(…, {method: "POST", mode: "no-cors"})`: no JSON type.
        ("POST", &[], StatusCode::UNSUPPORTED_MEDIA_TYPE),
        (
            "POST",
            &[("content-type", "text/plain")],
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "POST",
            &[
                ("content-type", "application/json"),
                ("origin", "http://evil.example"),
            ],
            StatusCode::FORBIDDEN,
        ),
        (
            "POST",
            &[
                ("content-type", "application/json"),
                ("sec-fetch-site", "cross-site"),
            ],
            StatusCode::FORBIDDEN,
        ),
        (
            "POST",
            &[("content-type", "application/json"), ("origin", "null")],
            StatusCode::FORBIDDEN,
        ),
    ];
    for (method, headers, want) in cases {
        let mut req = Request::builder()
            .method(method)
            .uri("/api/v1/sessions/s1/projection/replay")
            .header(header::HOST, "127.0.0.1:7300");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (status, body) = h.send(req.body(Body::empty()).unwrap()).await;
        assert_eq!(status, want, "{headers:?}: {body}");
    }
    // The same request from the server's own page is served.
    let req = Request::post("/api/v1/sessions/s1/projection/replay")
        .header(header::HOST, "127.0.0.1:7300")
        .header("origin", "http://127.0.0.1:7300")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::empty())
        .unwrap();
    assert_eq!(h.send(req).await.0, StatusCode::OK);
}

#[tokio::test]
async fn searches_and_pages_are_bounded_by_us_not_by_the_query() {
    let h = harness();
    let long = "the%20".repeat(600);
    let (status, body) = h.get(&format!("/api/v1/memories?q={long}")).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["limit"], "search text characters");
    let (status, _) = h.get("/api/v1/memories?offset=10001").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // A huge unknown field is named, not echoed whole.
    let key = "k".repeat(100_000);
    let (status, body) = h
        .call("POST", "/api/v1/memories", Some(json!({ key: 1 })))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]["message"].as_str().unwrap().len() < 1000,
        "{}",
        body["error"]["message"].as_str().unwrap().len()
    );
    // The panel clamps its page number.
    let req = Request::get("/panel/memories?page=18446744073709551615")
        .header(header::HOST, "localhost")
        .body(Body::empty())
        .unwrap();
    let res = h.api.router().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn two_forks_racing_for_one_new_session_get_one_binding_and_one_conflict() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    let a = h.call(
        "POST",
        "/api/v1/sessions/s1/fork",
        Some(json!({"session": "n", "chat": "c1", "architecture": "st"})),
    );
    let b = h.call(
        "POST",
        "/api/v1/sessions/s1/fork",
        Some(json!({"session": "n", "chat": "c2", "architecture": "st"})),
    );
    let ((sa, _), (sb, _)) = tokio::join!(a, b);
    let mut got = [sa, sb];
    got.sort();
    assert_eq!(got, [StatusCode::CREATED, StatusCode::CONFLICT]);
}

#[tokio::test]
async fn through_a_session_another_chats_writer_ids_are_left_out() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    h.session("s2", "Seraphina - 2").await;
    // s2's own write in the character scope both sessions share.
    let (status, _) = h
        .call(
            "POST",
            "/api/v1/memories?session=s2",
            Some(json!({"scope": {"kind": "character", "character": "Seraphina"}, "id": "shared", "content": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let q = "scope=character&character=Seraphina";
    let (_, own) = h
        .get(&format!("/api/v1/memories/shared?{q}&session=s2"))
        .await;
    assert_eq!(own["source"]["session"], "s2");
    let (_, other) = h
        .get(&format!("/api/v1/memories/shared?{q}&session=s1"))
        .await;
    assert_eq!(other["source"]["session"], Value::Null, "{other}");
    let (_, listed) = h.get("/api/v1/memories?session=s1").await;
    assert_eq!(
        listed["items"][0]["memory"]["source"]["session"],
        Value::Null
    );
    let (_, hist) = h
        .get(&format!("/api/v1/memories/shared/history?{q}&session=s1"))
        .await;
    assert_eq!(hist["entries"][0]["source"]["session"], Value::Null);
    assert_eq!(
        hist["entries"][0]["source"]["kind"], "user",
        "who wrote it stays"
    );
}

#[tokio::test]
async fn a_memory_history_names_each_versions_text_while_it_is_kept() {
    let h = harness();
    h.global_memory_edited("lantern", "text", 10).await;
    let (status, hist) = h.get("/api/v1/memories/lantern/history?scope=global").await;
    assert_eq!(status, StatusCode::OK);
    let texts: Vec<Option<&str>> = hist["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["content"].as_str())
        .collect();
    // The current text and the last 8 it changed from; the two oldest are no longer kept
    // (absent, never another version's text).
    let mut expected: Vec<Option<String>> = vec![None, None];
    expected.extend((2..=10).map(|i| Some(format!("text {i}"))));
    let expected: Vec<Option<&str>> = expected.iter().map(|t| t.as_deref()).collect();
    assert_eq!(texts, expected);
}

#[tokio::test]
async fn a_memory_links_to_the_chat_lines_of_the_turn_that_wrote_it() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    h.play_turn("s1", 1, "Hello there.", None, "Welcome, traveller.")
        .await;
    // In turn 2, after the user's words, the model writes a memory about them.
    let gift = h
        .play_turn(
            "s1",
            2,
            "我把灯笼送给你。",
            Some("Kai gave Seraphina a lantern."),
            "Thank you for the lantern.",
        )
        .await
        .unwrap();
    h.play_turn("s1", 3, "Goodbye.", None, "Farewell.").await;
    let (_, m) = h.get(&format!("/api/v1/memories/{gift}?{CHAT_Q}")).await;
    assert_eq!(m["source"]["turn"], 2, "{m}");
    assert_eq!(m["source"]["session"], "s1", "{m}");
    let (status, page) = h.get("/api/v1/sessions/s1/chat?turn=2").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let texts: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    let marked: Vec<usize> = page["turnMessages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as usize)
        .collect();
    let marked_texts: Vec<&str> = marked
        .iter()
        .map(|i| texts[i - page["offset"].as_u64().unwrap() as usize])
        .collect();
    assert_eq!(
        marked_texts,
        ["我把灯笼送给你。", "Thank you for the lantern."],
        "{page}"
    );
    // A few messages before the turn come with it, for context; numbers are SillyTavern's.
    assert!(texts.contains(&"Welcome, traveller."), "{page}");
    assert_eq!(page["messages"][0]["index"], page["offset"]);
    assert_eq!(
        page["total"].as_u64(),
        Some(texts.len() as u64 + page["offset"].as_u64().unwrap())
    );
    // Paging by offset, bounded.
    let (_, tail) = h.get("/api/v1/sessions/s1/chat?offset=4&limit=2").await;
    assert_eq!(tail["offset"], 4);
    assert_eq!(tail["messages"].as_array().unwrap().len(), 2);
    assert_eq!(tail["messages"][0]["index"], 4);
    let (status, body) = h.get("/api/v1/sessions/s1/chat?limit=201").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = h.get("/api/v1/sessions/s1/chat?turn=9").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("turn 9"),
        "{body}"
    );
    let (status, _) = h.get("/api/v1/sessions/nobody/chat").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The page reads a chat once while it is unchanged, and sees what is appended next.
    h.play_turn("s1", 4, "One more thing.", None, "Yes?").await;
    let (status, later) = h.get("/api/v1/sessions/s1/chat?turn=4").await;
    assert_eq!(status, StatusCode::OK, "{later}");
    assert_eq!(later["turnTotal"], 2, "{later}");
    // A page too short for the context still holds the turn's first message.
    let (_, short) = h.get("/api/v1/sessions/s1/chat?turn=2&limit=1").await;
    assert_eq!(short["messages"][0]["text"], "我把灯笼送给你。", "{short}");
    assert_eq!(short["turnMessages"].as_array().unwrap().len(), 1);
    assert_eq!(short["turnTotal"], 2);
    // A fork copies its origin's lines, turn numbers and all; its own turn 1 is its own.
    let (status, body) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/fork",
            Some(json!({"session": "s1-b", "chat": "Seraphina - 1 (b)", "architecture": "agent-tavern"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    h.host.start(&sid("s1-b"));
    h.play_turn("s1-b", 1, "Fork words.", None, "Fork reply.")
        .await;
    let (_, forked) = h.get("/api/v1/sessions/s1-b/chat?turn=1&limit=50").await;
    let marked: Vec<&str> = forked["turnMessages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let i = i.as_u64().unwrap() - forked["offset"].as_u64().unwrap();
            forked["messages"][i as usize]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(marked, ["Fork words.", "Fork reply."], "{forked}");
    let (_, whole) = h.get("/api/v1/sessions/s1-b/chat?offset=0&limit=50").await;
    let copied = whole["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["text"] == "Hello there.")
        .expect("the origin's lines were copied");
    assert!(
        copied["turn"].is_null(),
        "a copied line is not the fork's turn: {copied}"
    );
    // The panel's memory page links to those lines, and the chat page marks them.
    let (_, html) = h
        .get_text(&format!("/panel/memories/{gift}?{CHAT_Q}"))
        .await;
    assert!(
        html.contains("/panel/sessions/s1/chat?turn=2#turn-2"),
        "{html}"
    );
    // After the user edits the memory, it still links to where it came from.
    let (status, edited) = h
        .call(
            "PUT",
            &format!("/api/v1/memories/{gift}?{CHAT_Q}"),
            Some(json!({"revision": m["revision"], "content": "Kai gave Seraphina a brass lantern."})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{edited}");
    assert_eq!(edited["source"]["kind"], "user");
    let (_, html) = h
        .get_text(&format!("/panel/memories/{gift}?{CHAT_Q}"))
        .await;
    assert!(
        html.contains("/panel/sessions/s1/chat?turn=2#turn-2"),
        "{html}"
    );
    let (status, html) = h.get_text("/panel/sessions/s1/chat?turn=2").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("id=\"turn-2\""), "{html}");
    assert_eq!(html.matches("aria-current=\"true\"").count(), 2, "{html}");
    assert!(html.contains("我把灯笼送给你。"), "{html}");
}

#[tokio::test]
async fn every_settings_and_session_write_is_recorded_with_its_source() {
    let h = harness();
    h.session("s1", "Seraphina - 1").await;
    let whats = |v: &Value| -> Vec<String> {
        v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                assert_eq!(c["source"]["kind"], "user", "{c}");
                assert!(c["at"].as_i64().unwrap() > 0, "{c}");
                c["what"].as_str().unwrap().to_owned()
            })
            .collect()
    };
    let (status, s) = h
        .call(
            "PUT",
            "/api/v1/settings",
            Some(json!({"defaultContextMode": "agent-managed", "allowGlobalWrites": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(
        whats(&s),
        ["default context mode dsh-native → agent-managed; allow global writes false → true"]
    );
    // Saving what is already there changes nothing and records nothing.
    let (_, s) = h
        .call(
            "PUT",
            "/api/v1/settings",
            Some(json!({"allowGlobalWrites": true})),
        )
        .await;
    assert_eq!(whats(&s).len(), 1);
    let (status, _) = h
        .call(
            "PUT",
            "/api/v1/sessions/s1/prompt",
            Some(json!({"text": "Speak in riddles."})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = h.call("DELETE", "/api/v1/sessions/s1/prompt", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/mode",
            Some(json!({"mode": "agent-managed"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = h
        .call(
            "POST",
            "/api/v1/sessions/s1/fork",
            Some(json!({"session": "s1-st", "chat": "Seraphina - 1 (st)", "architecture": "st"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, s1) = h.get("/api/v1/sessions/s1").await;
    assert_eq!(
        whats(&s1),
        [
            "tavern-mode prompt saved (17 bytes)",
            "tavern-mode prompt reset to the default",
            "context mode dsh-native → agent-managed",
            "forked into session s1-st (chat Seraphina - 1 (st), st)",
        ]
    );
    let (_, forked) = h.get("/api/v1/sessions/s1-st").await;
    assert_eq!(whats(&forked), ["forked from session s1"]);
    // Settings changes are not a session's, and a session's are not the settings'.
    let (_, s) = h.get("/api/v1/settings").await;
    assert_eq!(whats(&s).len(), 1);
    // The panel shows them, newest first.
    let (_, page) = h.get_text("/panel/sessions/s1").await;
    let table = &page[page.find("id=\"changes\"").expect("a changes table")..];
    let fork = table.find("forked into session s1-st").unwrap();
    let saved = table.find("tavern-mode prompt saved").unwrap();
    assert!(fork < saved, "newest first");
    let (_, page) = h.get_text("/panel/settings").await;
    assert!(page.contains("allow global writes false → true"), "{page}");
}

#[tokio::test]
async fn the_file_store_check_reads_a_real_store_and_says_when_there_is_none() {
    let h = harness();
    let dir = tempfile::tempdir().unwrap();
    let store =
        tavern_store::fs::FsStore::open(dir.path(), std::sync::Arc::new(tavern_store::SystemClock))
            .unwrap();
    drop(store);
    let ask = |api: tavern_api::Api| async move {
        let req = Request::get("/api/v1/store/check")
            .header(header::HOST, "127.0.0.1:7300")
            .body(Body::empty())
            .unwrap();
        let res = api.router().oneshot(req).await.unwrap();
        let status = res.status();
        let bytes = http_body_util::BodyExt::collect(res.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, serde_json::from_slice::<Value>(&bytes).unwrap())
    };
    let check = tavern_api::routes::store::FileStoreCheck::new(dir.path());
    let (status, body) = ask(h.api.clone().with_store_check(std::sync::Arc::new(check))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ok"], true, "{body}");
    let gone = dir.path().join("not-here");
    let check = tavern_api::routes::store::FileStoreCheck::new(&gone);
    let (status, body) = ask(h.api.clone().with_store_check(std::sync::Arc::new(check))).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("does not exist"), "{message}");
    assert!(
        !message.contains(dir.path().to_str().unwrap()),
        "no absolute path: {message}"
    );
}
