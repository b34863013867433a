//! Where tools get assets from: a small port, an in-memory implementation and one that reads a
//! SillyTavern-style data folder (`characters/*.png|json`, `worlds/*.json`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
use tavern_core::CharacterName;

use super::card::Card;
use super::world::WorldBook;
use super::AssetError;

/// The user's persona as SillyTavern keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Persona {
    /// Display name.
    pub name: String,
    /// Persona description.
    pub description: String,
}

/// Read access to cards, world books and the persona.
#[async_trait]
pub trait AssetProvider: Send + Sync {
    /// The card of a character, if there is one.
    ///
    /// # Errors
    /// [`AssetError`] when the card exists but cannot be read.
    async fn card(&self, character: &CharacterName) -> Result<Option<Card>, AssetError>;

    /// A world book by name, if there is one.
    ///
    /// # Errors
    /// [`AssetError`] when the book exists but cannot be read.
    async fn world(&self, name: &str) -> Result<Option<WorldBook>, AssetError>;

    /// Names of the globally active world books, in activation order.
    async fn global_worlds(&self) -> Vec<String>;

    /// The active persona.
    async fn persona(&self) -> Persona;
}

/// Assets held in memory (tests, embedding hosts that load assets themselves).
#[derive(Debug, Clone, Default)]
pub struct MemAssets {
    /// Cards by character name.
    pub cards: BTreeMap<String, Card>,
    /// World books by name.
    pub worlds: BTreeMap<String, WorldBook>,
    /// Globally active book names.
    pub global: Vec<String>,
    /// The persona.
    pub persona: Persona,
}

#[async_trait]
impl AssetProvider for MemAssets {
    async fn card(&self, character: &CharacterName) -> Result<Option<Card>, AssetError> {
        Ok(self.cards.get(character.as_str()).cloned())
    }
    async fn world(&self, name: &str) -> Result<Option<WorldBook>, AssetError> {
        Ok(self.worlds.get(name).cloned())
    }
    async fn global_worlds(&self) -> Vec<String> {
        self.global.clone()
    }
    async fn persona(&self) -> Persona {
        self.persona.clone()
    }
}

/// A SillyTavern-style data folder: `characters/<name>.png` or `.json`, `worlds/<name>.json`.
/// Names are matched against existing file names only, never joined as paths, so no name can
/// reach outside the folder.
#[derive(Debug, Clone)]
pub struct DirAssets {
    root: PathBuf,
    global: Vec<String>,
    persona: Persona,
}

impl DirAssets {
    /// Assets under `root`, with the given globally active books and persona.
    pub fn new(root: impl Into<PathBuf>, global: Vec<String>, persona: Persona) -> Self {
        Self {
            root: root.into(),
            global,
            persona,
        }
    }

    /// The file in `dir` whose stem is exactly `stem` with one of `exts`.
    fn find(root: &std::path::Path, dir: &str, stem: &str, exts: &[&str]) -> Option<PathBuf> {
        let entries = std::fs::read_dir(root.join(dir)).ok()?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_stem().and_then(|s| s.to_str()) == Some(stem)
                    && p.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| exts.contains(&e.to_ascii_lowercase().as_str()))
            })
            .collect();
        found.sort();
        found.into_iter().next()
    }
}

#[async_trait]
impl AssetProvider for DirAssets {
    async fn card(&self, character: &CharacterName) -> Result<Option<Card>, AssetError> {
        let (root, stem) = (self.root.clone(), character.to_string());
        // Directory listing and file reads are blocking work: off the executor.
        let found = tavern_store::blocking::off_executor(move || {
            let path = Self::find(&root, "characters", &stem, &["png", "json"])?;
            Some(std::fs::read(path))
        })
        .await
        .map_err(|reason| AssetError::BadPng {
            name: format!("card {character}"),
            reason,
        })?;
        let Some(read) = found else {
            return Ok(None);
        };
        let bytes = read.map_err(|e| AssetError::BadPng {
            name: format!("card {character}"),
            reason: e.kind().to_string(),
        })?;
        Card::from_bytes(&format!("card {character}"), &bytes).map(Some)
    }

    async fn world(&self, name: &str) -> Result<Option<WorldBook>, AssetError> {
        let (root, stem) = (self.root.clone(), name.to_owned());
        let found = tavern_store::blocking::off_executor(move || {
            let path = Self::find(&root, "worlds", &stem, &["json"])?;
            Some(std::fs::read(path))
        })
        .await
        .map_err(|reason| AssetError::BadJson {
            name: format!("world {name}"),
            reason,
        })?;
        let Some(read) = found else {
            return Ok(None);
        };
        let bytes = read.map_err(|e| AssetError::BadJson {
            name: format!("world {name}"),
            reason: e.kind().to_string(),
        })?;
        WorldBook::from_json(name, &bytes).map(Some)
    }

    async fn global_worlds(&self) -> Vec<String> {
        self.global.clone()
    }

    async fn persona(&self) -> Persona {
        self.persona.clone()
    }
}
