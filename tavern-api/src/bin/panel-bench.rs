//! `panel-bench`: the panel's and the API's server time on a store of 100,000 memories (the
//! embedded file store, bulk-imported), beside the store's own search for the same query — the
//! floor no page can beat — in the same run. `cargo run --release -p tavern-api --features bench
//! --bin panel-bench -- [--records N] [--rounds N]`.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request};
use http_body_util::BodyExt;
use tavern_api::{Api, ApiConfig};
use tavern_core::{
    CharacterName, ChatId, MemoryId, MemoryKind, MemorySource, MemoryWrite, ScopeKey, SessionId,
};
use tavern_runtime::testkit::MemHost;
use tavern_runtime::{Runtime, RuntimeConfig};
use tavern_store::fs::FsStore;
use tavern_store::{ChatStore, MemoryQuery, MemoryStore, SystemClock};
use tavern_tools::assets::provider::MemAssets;
use tower::ServiceExt;

const WORDS_EN: [&str; 16] = [
    "lantern", "river", "gate", "silver", "forest", "oath", "blade", "tavern", "letter", "storm",
    "harbor", "bell", "mask", "garden", "tower", "ember",
];
const WORDS_ZH: [&str; 12] = [
    "灯笼", "河流", "大门", "银色", "森林", "誓言", "长剑", "酒馆", "书信", "风暴", "港口", "钟声",
];

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn text(i: usize) -> String {
    let mut x = i.wrapping_mul(2_654_435_761) % 1_000_003;
    let mut next = || {
        x = (x * 48_271 + 11) % 2_147_483_647;
        x
    };
    let mut s = String::new();
    for k in 0..12 {
        if k % 3 == 0 {
            s.push_str(WORDS_ZH[next() % WORDS_ZH.len()]);
        } else {
            s.push_str(WORDS_EN[next() % WORDS_EN.len()]);
            s.push(' ');
        }
    }
    s
}

fn p(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

async fn time<F, Fut>(rounds: usize, mut f: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut t = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        f().await;
        t.push(start.elapsed());
    }
    t.sort();
    (p(&t, 0.5), p(&t, 0.95))
}

/// Messages of the long chat the chat page is measured on.
const CHAT_MESSAGES: usize = 10_000;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let records = arg("--records", 100_000);
    let rounds = arg("--rounds", 100);
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(SystemClock);
    let store = Arc::new(FsStore::open(dir.path(), clock.clone())?);
    let characters: Vec<CharacterName> = (0..50)
        .map(|i| CharacterName::parse(format!("Character {i}")))
        .collect::<Result<_, _>>()?;
    let writes = (0..records)
        .map(|i| {
            Ok(MemoryWrite {
                id: MemoryId::parse(format!("m{i}"))?,
                scope: if i % 10 == 0 {
                    ScopeKey::Global
                } else {
                    ScopeKey::Character {
                        character: characters[i % characters.len()].clone(),
                    }
                },
                kind: MemoryKind::Semantic,
                content: text(i),
                tags: Vec::new(),
                importance: 0.5,
                confidence: 0.8,
                source: MemorySource::system(),
                expires_at: None,
            })
        })
        .collect::<Result<Vec<_>, tavern_core::CoreError>>()?;
    let t = Instant::now();
    store.import_memories(writes)?;
    println!(
        "{records} memories imported in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let host = Arc::new(MemHost::capable());
    let runtime = Arc::new(Runtime::new(
        host.clone(),
        store.clone(),
        Arc::new(MemAssets::default()),
        clock,
        RuntimeConfig::default(),
    ));
    for (i, character) in characters.iter().enumerate().take(20) {
        let s = SessionId::parse(format!("s{i}"))?;
        host.start(&s);
        runtime
            .new_chat(&s, character, &ChatId::parse(format!("chat {i}"))?, false)
            .await?;
    }
    // Session s0's chat grows to 10,000 messages (5,000 turns), as a long roleplay's does.
    let chat0 = ChatId::parse("chat 0")?;
    let revision = store
        .chat_revision(&characters[0], &chat0)
        .await?
        .ok_or("chat 0 was just created")?;
    let lines = (0..CHAT_MESSAGES)
        .map(|i| {
            let line = serde_json::json!({
                "name": if i % 2 == 0 { "User" } else { "Character 0" },
                "is_user": i % 2 == 0,
                "send_date": "2026-12-04T10:00:00.000Z",
                "mes": text(i),
                "extra": {"agentTavern": {"sessionId": "s0", "turn": i / 2 + 1}},
            });
            tavern_core::chat::ChatLine::parse(&line.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    store
        .append_lines(&characters[0], &chat0, &lines, &revision)
        .await?;
    let router = Api::new(runtime, ApiConfig::default()).router();
    let get = |uri: String| {
        let router = router.clone();
        async move {
            let req = Request::get(uri.as_str())
                .header(header::HOST, "localhost")
                .body(Body::empty())
                .expect("a request");
            let res = router.oneshot(req).await.expect("an answer");
            assert!(res.status().is_success(), "{uri}: {}", res.status());
            let _ = res.into_body().collect().await;
        }
    };
    let c3 = "scope=character&character=Character%203";
    let pages = [
        ("overview", "/panel".to_owned()),
        (
            "memories, newest first (all scopes)",
            "/panel/memories".to_owned(),
        ),
        (
            "memories, page 50 of a character",
            format!("/panel/memories?{c3}&page=50"),
        ),
        (
            "search \"lantern 灯笼\" (all scopes)",
            "/panel/memories?q=lantern%20%E7%81%AF%E7%AC%BC".to_owned(),
        ),
        (
            "search in one character",
            format!("/panel/memories?{c3}&q=silver%20gate"),
        ),
        (
            "one memory with its history",
            format!("/panel/memories/m3?{c3}"),
        ),
        (
            "variables of a scope",
            "/panel/variables?scope=global".to_owned(),
        ),
        (
            "a 10,000-message chat at a turn",
            "/panel/sessions/s0/chat?turn=2500".to_owned(),
        ),
        (
            "a 10,000-message chat, last page",
            format!("/panel/sessions/s0/chat?offset={}", CHAT_MESSAGES - 30),
        ),
        (
            "API: search (JSON)",
            "/api/v1/memories?q=lantern%20%E7%81%AF%E7%AC%BC".to_owned(),
        ),
    ];
    println!("\n{:<40} {:>9} {:>9}", "server time, ms", "p50", "p95");
    let floor = time(rounds, || async {
        let q = MemoryQuery {
            limit: 20,
            ..MemoryQuery::new("lantern 灯笼", Vec::new())
        };
        store.search(&q).await.expect("search");
    })
    .await;
    println!(
        "{:<40} {:>9.2} {:>9.2}",
        "store search alone (the floor)", floor.0, floor.1
    );
    for (name, uri) in pages {
        let (p50, p95) = time(rounds, || get(uri.clone())).await;
        println!("{name:<40} {p50:>9.2} {p95:>9.2}");
    }
    println!("\ntarget: every page p50 < 50 ms at 100,000 memories");
    Ok(())
}
