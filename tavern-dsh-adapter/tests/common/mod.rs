//! Shared set-up for the adapter's tests: a fake host and a runtime on a file store.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tavern_core::{AgentId, CharacterName, ChatId, HostFacts, SessionId, Timestamp};
use tavern_dsh_adapter::fake::FakeHost;
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_store::clock::ManualClock;
use tavern_store::fs::FsStore;
use tavern_tools::assets::card::Card;
use tavern_tools::assets::provider::{MemAssets, Persona};
use tavern_tools::assets::world::WorldBook;

pub const T0: Timestamp = Timestamp(1_700_000_000_000);

pub fn fixture(rel: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures")
        .join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("../shared/fixtures/{rel} is needed ({e})"))
}

/// A SillyTavern assets folder under `root` holding Mira's card (`examples/assets`), for
/// tests that start a real bridge.
pub fn mira_assets(root: &Path) -> PathBuf {
    let assets = root.join("assets");
    std::fs::create_dir_all(assets.join("characters")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/assets/Mira.card.json"),
        assets.join("characters/Mira.json"),
    )
    .unwrap();
    assets
}

pub fn assets() -> Arc<MemAssets> {
    let mut a = MemAssets::default();
    a.cards.insert(
        "Seraphina".into(),
        Card::from_png("Seraphina", &fixture("cards/Seraphina.v2v3.book4.png"))
            .unwrap()
            .into(),
    );
    a.worlds.insert(
        "Eldoria".into(),
        WorldBook::from_json("Eldoria", &fixture("worlds/Eldoria.json"))
            .unwrap()
            .into(),
    );
    a.persona = Persona {
        name: "Kai".into(),
        description: "A traveler with a cracked compass.".into(),
    };
    Arc::new(a)
}

pub fn rc6() -> HostFacts {
    tavern_dsh_adapter::dsh::rc6_facts()
}

pub fn seam() -> HostFacts {
    HostFacts {
        host: "fake host with agent/context".into(),
        agent_context_seam: true,
        projection_aware_compaction: true,
        session_compaction_suppression: false,
    }
}

/// A world on disk: store root and host log folder under one temporary directory, so it can
/// be "restarted" by opening again.
pub struct World {
    pub dir: PathBuf,
    pub host: Arc<FakeHost>,
    pub store: Arc<FsStore>,
    pub runtime: Runtime,
    pub clock: Arc<ManualClock>,
}

impl World {
    pub fn open(dir: &Path, facts: HostFacts) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let store = Arc::new(FsStore::open(dir.join("store"), clock.clone()).unwrap());
        let host = Arc::new(FakeHost::open(dir.join("host"), facts).unwrap());
        let config = RuntimeConfig {
            user_name: "Kai".into(),
            ..RuntimeConfig::default()
        };
        let runtime = Runtime::new(host.clone(), store.clone(), assets(), clock.clone(), config);
        Self {
            dir: dir.to_path_buf(),
            host,
            store,
            runtime,
            clock,
        }
    }

    /// A bound, created agent-tavern session with the default binding.
    pub async fn session(&self, id: &str, chat: &str) -> AgentId {
        let session = SessionId::parse(id).unwrap();
        self.runtime
            .new_chat(
                &session,
                &CharacterName::parse("Seraphina").unwrap(),
                &ChatId::parse(chat).unwrap(),
                false,
            )
            .await
            .unwrap();
        let agent = AgentId::parse(id).unwrap();
        self.host.create_agent(&self.runtime, &agent).await.unwrap();
        agent
    }

    pub fn events(&self, id: &str) -> Vec<Value> {
        self.host.log(&SessionId::parse(id).unwrap())
    }

    /// The chat's message lines (header excluded) as `(is_user, text)`.
    pub async fn chat(&self, chat: &str) -> Vec<(bool, String)> {
        use tavern_store::ChatStore;
        let file = self
            .store
            .read_chat(
                &CharacterName::parse("Seraphina").unwrap(),
                &ChatId::parse(chat).unwrap(),
            )
            .await
            .unwrap()
            .unwrap();
        file.lines
            .iter()
            .skip(1)
            .map(|l| (l.is_user(), l.text().to_owned()))
            .collect()
    }
}
