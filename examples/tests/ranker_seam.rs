//! The ranker seam: one setting (`RuntimeConfig::ranker`) reorders memory search, history
//! search and lore ranking alike, and the default leaves BM25's order as it is.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use tavern_core::{CharacterName, ChatId, HostFacts, SessionId};
use tavern_examples::chat_loop::{ChatLoopHost, Reply};
use tavern_runtime::{Runtime, RuntimeConfig};
use tavern_search::rank::{Candidate, Ranker, RankerRef};
use tavern_store::fs::FsStore;
use tavern_store::SystemClock;
use tavern_tools::assets::world::WorldBook;

const STAR: &str = "★";

/// Puts texts with a star first, whatever their lexical score.
#[derive(Debug)]
struct StarsFirst;

impl Ranker for StarsFirst {
    fn name(&self) -> &str {
        "stars-first"
    }

    fn pool(&self, wanted: usize) -> usize {
        wanted * 4
    }

    fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
        for c in candidates {
            if c.text.contains(STAR) {
                c.score += 1000.0;
            }
        }
    }
}

const WORLD: &str = r#"{"entries": {
  "0": {"uid": 0, "key": ["zzz-one"], "comment": "portal lore", "content": "The portal, the portal: the portal of the north."},
  "1": {"uid": 1, "key": ["zzz-two"], "comment": "star lore", "content": "★ A portal."}
}}"#;

struct World {
    host: Arc<ChatLoopHost>,
    runtime: Runtime,
}

fn open(dir: &Path, ranker: RankerRef) -> World {
    let clock = Arc::new(SystemClock);
    let store = Arc::new(FsStore::open(dir.join("store"), clock.clone()).unwrap());
    let host =
        Arc::new(ChatLoopHost::open(dir.join("host"), HostFacts::bare("chat loop")).unwrap());
    let mut assets = Arc::try_unwrap(tavern_examples::assets().unwrap()).unwrap();
    assets.worlds.insert(
        "Gates".into(),
        WorldBook::from_json("Gates", WORLD.as_bytes())
            .unwrap()
            .into(),
    );
    assets.global = vec!["Gates".into()];
    let config = RuntimeConfig {
        ranker,
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::new(host.clone(), store, Arc::new(assets), clock, config);
    World { host, runtime }
}

async fn call(w: &World, name: &str, args: Value) -> Value {
    let agent = ChatLoopHost::agent("c1").unwrap();
    let out = w.runtime.call_tool(&agent, "call", name, &args).await;
    assert!(out.get("error").is_none(), "{name}: {out}");
    out
}

/// The first result's text of each search, memory / history / lore.
async fn firsts(w: &World) -> [String; 3] {
    let text = |v: &Value, field: &str| v["items"][0][field].as_str().unwrap_or("").to_owned();
    let memory = call(w, "memory_search", json!({"query": "portal"})).await;
    let history = call(w, "tavern_history_search", json!({"query": "portal"})).await;
    let lore = call(w, "tavern_lore_search", json!({"query": "portal"})).await;
    [
        text(&memory, "content"),
        text(&history, "text"),
        text(&lore, "content"),
    ]
}

#[tokio::test]
async fn one_ranker_setting_reorders_memory_history_and_lore() {
    let dir = tempfile::tempdir().unwrap();
    let lexical = {
        let w = open(dir.path(), RankerRef::default());
        w.runtime
            .new_chat(
                &SessionId::parse("c1").unwrap(),
                &CharacterName::parse("Mira").unwrap(),
                &ChatId::parse("Mira - gates").unwrap(),
                false,
            )
            .await
            .unwrap();
        w.host.start(&w.runtime, "c1").await.unwrap();
        w.host.script([
            Reply::Use(vec![
                (
                    "memory_write".into(),
                    json!({"content": "The portal, the portal, the portal stands north."}),
                ),
                (
                    "memory_write".into(),
                    json!({"content": "★ Kai passed a portal."}),
                ),
            ]),
            Reply::Say("★ Perhaps a portal, somewhere far to the east, past the old mill.".into()),
        ]);
        w.host
            .run_turn(&w.runtime, "c1", "The portal, the portal, the portal?")
            .await
            .unwrap();
        firsts(&w).await
    };
    // BM25 puts the thrice-said phrase first everywhere.
    for first in &lexical {
        assert!(
            first.contains("portal") && !first.contains(STAR),
            "{lexical:?}"
        );
    }
    let w = open(dir.path(), RankerRef::new(StarsFirst));
    w.host.start(&w.runtime, "c1").await.unwrap();
    let ranked = firsts(&w).await;
    for first in &ranked {
        assert!(first.contains(STAR), "{ranked:?}");
    }
}
