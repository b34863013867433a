//! The harness the API's and the panel's tests share: a real runtime over the strict
//! in-memory store and host, with real SillyTavern assets from `../shared/fixtures`.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tavern_api::{Api, ApiConfig};
use tavern_core::{CharacterName, ChatId, SessionId};
use tavern_projector::event::{TurnEndReason, UserSource};
use tavern_projector::EventKind;
use tavern_runtime::testkit::MemHost;
use tavern_runtime::{Runtime, RuntimeConfig};
use tavern_store::mem::MemStore;
use tavern_store::ManualClock;
use tavern_tools::assets::provider::MemAssets;
use tavern_tools::assets::{card::Card, world::WorldBook};
use tower::ServiceExt;

pub const T0: i64 = 1_750_000_000_000;

pub fn fixture(rel: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures")
        .join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("../shared/fixtures/{rel} is needed ({e})"))
}

pub struct Harness {
    pub api: Api,
    pub store: Arc<MemStore>,
    pub host: Arc<MemHost>,
    pub runtime: Arc<Runtime>,
}

pub fn assets() -> MemAssets {
    let mut assets = MemAssets::default();
    let sera = Card::from_png("Seraphina", &fixture("cards/Seraphina.v2v3.book4.png")).unwrap();
    assets.cards.insert("Seraphina".into(), sera.into());
    assets.worlds.insert(
        "Eldoria".into(),
        WorldBook::from_json("Eldoria", &fixture("worlds/Eldoria.json"))
            .unwrap()
            .into(),
    );
    assets
}

pub fn harness_on(host: MemHost, token: Option<&str>) -> Harness {
    let clock = Arc::new(ManualClock::new(tavern_core::Timestamp(T0)));
    let store = Arc::new(MemStore::new(clock.clone()));
    let host = Arc::new(host);
    let runtime = Arc::new(Runtime::new(
        host.clone(),
        store.clone(),
        Arc::new(assets()),
        clock,
        RuntimeConfig {
            user_name: "Kai".into(),
            ..RuntimeConfig::default()
        },
    ));
    let api = Api::new(
        runtime.clone(),
        ApiConfig {
            token: token.map(str::to_owned),
        },
    );
    Harness {
        api,
        store,
        host,
        runtime,
    }
}

pub fn harness() -> Harness {
    harness_on(MemHost::capable(), None)
}

pub fn sid(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

impl Harness {
    /// Starts a session on the host and binds a new chat with Seraphina to it.
    pub async fn session(&self, session: &str, chat: &str) {
        self.host.start(&sid(session));
        self.runtime
            .new_chat(
                &sid(session),
                &CharacterName::parse("Seraphina").unwrap(),
                &ChatId::parse(chat).unwrap(),
                false,
            )
            .await
            .unwrap();
    }

    pub async fn send(&self, req: Request<Body>) -> (StatusCode, Value) {
        let res = self.api.router().oneshot(req).await.unwrap();
        let status = res.status();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{status}: not json ({e}): {bytes:?}"))
        };
        (status, body)
    }

    pub async fn call(&self, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, "127.0.0.1:7300");
        if method != "GET" {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let body = match body {
            Some(v) => Body::from(v.to_string()),
            None => Body::empty(),
        };
        self.send(req.body(body).unwrap()).await
    }

    pub async fn get(&self, uri: &str) -> (StatusCode, Value) {
        self.call("GET", uri, None).await
    }

    /// Plays one turn of session `session` through the host and the runtime: the user's
    /// words, then (when `memory` is given) the model writes that memory with `memory_write`,
    /// then the character's reply. Returns the memory's id.
    pub async fn play_turn(
        &self,
        session: &str,
        turn: u64,
        user: &str,
        memory: Option<&str>,
        reply: &str,
    ) -> Option<String> {
        let s = sid(session);
        let mut written = None;
        let events = [
            EventKind::TurnStart { turn },
            EventKind::UserMessage {
                source: UserSource::User,
                text: user.into(),
            },
            EventKind::StepStart { turn, step: 1 },
            EventKind::AssistantMessage {
                turn,
                step: 1,
                text: reply.into(),
                has_tool_calls: false,
                interrupted: false,
            },
            EventKind::StepEnd { turn, step: 1 },
            EventKind::TurnEnd {
                turn,
                reason: TurnEndReason::Completed,
            },
        ];
        for (i, kind) in events.into_iter().enumerate() {
            if i == 2 {
                if let Some(content) = memory {
                    let agent = self.runtime.agent_of(&s).unwrap();
                    let out = self
                        .runtime
                        .call_tool(
                            &agent,
                            &format!("call-{turn}"),
                            "memory_write",
                            &json!({ "content": content }),
                        )
                        .await;
                    assert!(out.get("error").is_none(), "{out}");
                    written = Some(out["id"].as_str().unwrap().to_owned());
                }
            }
            let e = self.host.log(&s, kind).unwrap();
            self.runtime.on_event(&s, &e).await.unwrap();
        }
        written
    }

    /// Creates global memory `id` with text `{word} 0` and edits it to `{word} 1` … `{word}
    /// {edits}` through the API; returns the last version.
    pub async fn global_memory_edited(&self, id: &str, word: &str, edits: usize) -> Value {
        let (status, mut m) = self
            .call(
                "POST",
                "/api/v1/memories",
                Some(
                    json!({"scope": {"kind": "global"}, "id": id, "content": format!("{word} 0")}),
                ),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{m}");
        for i in 1..=edits {
            let (status, next) = self
                .call(
                    "PUT",
                    &format!("/api/v1/memories/{id}?scope=global"),
                    Some(json!({"revision": m["revision"], "content": format!("{word} {i}")})),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{next}");
            m = next;
        }
        m
    }

    /// A GET answered with text (a panel page).
    pub async fn get_text(&self, uri: &str) -> (StatusCode, String) {
        let req = Request::builder()
            .uri(uri)
            .header(header::HOST, "127.0.0.1:7300")
            .body(Body::empty())
            .unwrap();
        let res = self.api.router().oneshot(req).await.unwrap();
        let status = res.status();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }
}

pub fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no code>")
}
