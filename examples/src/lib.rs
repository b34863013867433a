//! Shared set-up for the runnable examples in `src/bin/`: the bundled sample card, a data
//! directory that starts fresh on every run, and a world on the file store and fake host; and
//! [`chat_loop`], a second host that is not DSH.

pub mod chat_loop;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tavern_core::HostFacts;
use tavern_dsh_adapter::fake::FakeHost;
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_store::fs::FsStore;
use tavern_store::SystemClock;
use tavern_tools::assets::card::Card;
use tavern_tools::assets::provider::{MemAssets, Persona};

/// The bundled sample card (written for these examples).
pub const MIRA_CARD: &str = include_str!("../assets/Mira.card.json");

/// `examples/data/<name>`, emptied first so every run starts from the same state.
///
/// # Errors
/// IO errors removing or creating the directory.
pub fn fresh_data_dir(name: &str) -> std::io::Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Cards and persona for the examples.
///
/// # Errors
/// The bundled card failing to parse (it is tested not to).
pub fn assets() -> Result<Arc<MemAssets>, Box<dyn std::error::Error>> {
    let mut a = MemAssets::default();
    a.cards.insert(
        "Mira".into(),
        Card::from_json("Mira", MIRA_CARD.as_bytes())?.into(),
    );
    a.persona = Persona {
        name: "Kai".into(),
        description: "A traveler carrying a cracked compass.".into(),
    };
    Ok(Arc::new(a))
}

/// A runtime on the embedded file store under `dir/store`, with a fake host logging under
/// `dir/host`. Opening the same `dir` again is a restart.
pub struct World {
    /// The fake AgentLoop host.
    pub host: Arc<FakeHost>,
    /// The file store.
    pub store: Arc<FsStore>,
    /// The AgentTavern runtime.
    pub runtime: Runtime,
}

impl World {
    /// Opens (or reopens) a world in `dir`.
    ///
    /// # Errors
    /// Store or host failures.
    pub fn open(dir: &Path, facts: HostFacts) -> Result<Self, Box<dyn std::error::Error>> {
        let clock = Arc::new(SystemClock);
        let store = Arc::new(FsStore::open(dir.join("store"), clock.clone())?);
        let host = Arc::new(FakeHost::open(dir.join("host"), facts)?);
        let config = RuntimeConfig {
            user_name: "Kai".into(),
            ..RuntimeConfig::default()
        };
        let runtime = Runtime::new(host.clone(), store.clone(), assets()?, clock, config);
        Ok(Self {
            host,
            store,
            runtime,
        })
    }
}
