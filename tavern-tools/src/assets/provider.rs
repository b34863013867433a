//! Where tools get assets from: a small port, an in-memory implementation and one that reads a
//! SillyTavern-style data folder (`characters/*.png|json`, `worlds/*.json`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use tavern_core::CharacterName;
use tavern_store::fs::{stamp_of, FileStamp};

use super::card::Card;
use super::group::{Group, MAX_GROUP_FILE_BYTES};
use super::personas::Personas;
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
    /// The card of a character, if there is one (shared: a card is parsed once per change,
    /// not once per request).
    ///
    /// # Errors
    /// [`AssetError`] when the card exists but cannot be read.
    async fn card(&self, character: &CharacterName) -> Result<Option<Arc<Card>>, AssetError>;

    /// A world book by name, if there is one (shared: a book is parsed once per change, and a
    /// large one is never copied per request).
    ///
    /// # Errors
    /// [`AssetError`] when the book exists but cannot be read.
    async fn world(&self, name: &str) -> Result<Option<Arc<WorldBook>>, AssetError>;

    /// Names of the globally active world books, in activation order.
    async fn global_worlds(&self) -> Vec<String>;

    /// A group by name (the name its chats are filed under), if there is one; none by default.
    ///
    /// # Errors
    /// [`AssetError`] when the group's file exists but cannot be read.
    async fn group(&self, name: &str) -> Result<Option<Arc<Group>>, AssetError> {
        let _ = name;
        Ok(None)
    }

    /// Names of a character's extra world books (SillyTavern's `charLore`), beside the one
    /// its card links; none by default.
    async fn character_worlds(&self, character: &CharacterName) -> Vec<String> {
        let _ = character;
        Vec::new()
    }

    /// The active persona.
    async fn persona(&self) -> Persona;

    /// The persona of a chat locked to `locked` (its header's `chat_metadata.persona`, an
    /// avatar file name), as SillyTavern picks it; a provider without personas answers
    /// [`AssetProvider::persona`].
    async fn chat_persona(&self, locked: Option<&str>) -> Persona {
        let _ = locked;
        self.persona().await
    }
}

/// Assets held in memory (tests, embedding hosts that load assets themselves).
#[derive(Debug, Clone, Default)]
pub struct MemAssets {
    /// Cards by character name.
    pub cards: BTreeMap<String, Arc<Card>>,
    /// World books by name.
    pub worlds: BTreeMap<String, Arc<WorldBook>>,
    /// Globally active book names.
    pub global: Vec<String>,
    /// The persona.
    pub persona: Persona,
}

#[async_trait]
impl AssetProvider for MemAssets {
    async fn card(&self, character: &CharacterName) -> Result<Option<Arc<Card>>, AssetError> {
        Ok(self.cards.get(character.as_str()).cloned())
    }
    async fn world(&self, name: &str) -> Result<Option<Arc<WorldBook>>, AssetError> {
        Ok(self.worlds.get(name).cloned())
    }
    async fn global_worlds(&self) -> Vec<String> {
        self.global.clone()
    }
    async fn persona(&self) -> Persona {
        self.persona.clone()
    }
}

/// Most parsed cards and world books [`DirAssets`] keeps; past it the cache starts over.
pub const DIR_ASSETS_CACHED: usize = 256;

/// The default largest card or world book file [`DirAssets`] reads: 32 MiB (the largest real
/// card seen is about 2 MiB).
pub const DEFAULT_MAX_ASSET_BYTES: u64 = 32 * 1024 * 1024;

/// A SillyTavern-style data folder: `characters/<name>.png` or `.json`, `worlds/<name>.json`,
/// `groups/<id>.json`, and a `settings.json` with the user's personas and active books.
/// Names are matched against existing file names only, never joined as paths, so no name can
/// reach outside the folder.
///
/// A card or book is parsed once per version of its file: each call compares the folder's and
/// the file's stamps (two `stat`s) with what was parsed last, and only lists the folder again
/// when the folder changed, and only reads and parses the file when the file changed. A file
/// replaced within the file system's clock tick with the same length is the one change this
/// can miss until its next change.
#[derive(Debug, Clone)]
pub struct DirAssets {
    root: PathBuf,
    global: Vec<String>,
    persona: Persona,
    cache: Arc<Mutex<Parsed>>,
    /// Held while a changed file is read and parsed: calls that miss the cache together parse
    /// it once, not once each (16 calls on a large card held 16 copies).
    parsing: Arc<Mutex<()>>,
    max_bytes: u64,
}

/// What [`DirAssets`] has read: the folders' listings and the parsed files, by stamp.
#[derive(Debug, Default)]
struct Parsed {
    listings: HashMap<&'static str, (FileStamp, Vec<PathBuf>)>,
    cards: HashMap<PathBuf, (FileStamp, Arc<Card>)>,
    /// The groups of `groups/` by name, by the folder's stamp (SillyTavern replaces a group
    /// file by renaming, which changes the folder).
    groups: Option<(FileStamp, Arc<GroupsByName>)>,
    /// `settings.json`'s personas by the file's stamp (`None`: unreadable, or no personas).
    settings: Option<(FileStamp, Option<Arc<Personas>>)>,
    worlds: HashMap<PathBuf, (FileStamp, Arc<WorldBook>)>,
}

/// How one asset file turned out.
enum Found<T> {
    /// No file has the name.
    Missing,
    /// Parsed (now or earlier).
    Parsed(T),
    /// Found but unreadable or invalid: why.
    Failed(AssetError),
}

impl DirAssets {
    /// Assets under `root`, with the given globally active books and persona.
    pub fn new(root: impl Into<PathBuf>, global: Vec<String>, persona: Persona) -> Self {
        Self {
            root: root.into(),
            global,
            persona,
            cache: Arc::default(),
            parsing: Arc::default(),
            max_bytes: DEFAULT_MAX_ASSET_BYTES,
        }
    }

    /// The largest asset file read (default [`DEFAULT_MAX_ASSET_BYTES`]); a larger one is
    /// [`AssetError::TooLarge`], never read.
    #[must_use]
    pub fn with_max_bytes(mut self, max: u64) -> Self {
        self.max_bytes = max;
        self
    }

    /// The file in `dir` whose stem is exactly `stem` with one of `exts`, from the folder's
    /// listing (read again only when the folder's stamp changed).
    fn find(&self, dir: &'static str, stem: &str, exts: &[&str]) -> Option<PathBuf> {
        let folder = self.root.join(dir);
        let stamp = stamp_of(&std::fs::metadata(&folder).ok()?);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let listing = match cache.listings.get(dir) {
            Some((seen, files)) if *seen == stamp => files,
            _ => {
                let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
                    .ok()?
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .collect();
                files.sort();
                &cache
                    .listings
                    .entry(dir)
                    .insert_entry((stamp, files))
                    .into_mut()
                    .1
            }
        };
        listing
            .iter()
            .find(|p| {
                p.file_stem().and_then(|s| s.to_str()) == Some(stem)
                    && p.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| exts.contains(&e.to_ascii_lowercase().as_str()))
            })
            .cloned()
    }

    /// Finds, stamps and (when changed) reads and parses one asset file. Blocking.
    fn load<T: Clone>(
        &self,
        label: &str,
        dir: &'static str,
        stem: &str,
        exts: &[&str],
        slot: fn(&mut Parsed) -> &mut HashMap<PathBuf, (FileStamp, T)>,
        parse: impl FnOnce(Result<Vec<u8>, String>) -> Result<T, AssetError>,
    ) -> Found<T> {
        let Some(path) = self.find(dir, stem, exts) else {
            return Found::Missing;
        };
        let stamp = match std::fs::metadata(&path) {
            Ok(m) if m.len() > self.max_bytes => {
                return Found::Failed(AssetError::TooLarge {
                    name: label.to_owned(),
                    size: m.len(),
                    max: self.max_bytes,
                })
            }
            Ok(m) => stamp_of(&m),
            // Gone since the listing: the parser names the asset in its error.
            Err(e) => {
                return match parse(Err(e.kind().to_string())) {
                    Ok(_) => Found::Missing,
                    Err(e) => Found::Failed(e),
                }
            }
        };
        let cached = || {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            slot(&mut cache)
                .get(&path)
                .filter(|(seen, _)| *seen == stamp)
                .map(|(_, parsed)| parsed.clone())
        };
        if let Some(parsed) = cached() {
            return Found::Parsed(parsed);
        }
        let _parsing = self.parsing.lock().unwrap_or_else(PoisonError::into_inner);
        // Another call may have parsed it while this one waited.
        if let Some(parsed) = cached() {
            return Found::Parsed(parsed);
        }
        match parse(read_at_most(&path, self.max_bytes)) {
            Ok(parsed) => {
                let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
                let map = slot(&mut cache);
                if map.len() >= DIR_ASSETS_CACHED {
                    map.clear();
                }
                map.insert(path, (stamp, parsed.clone()));
                Found::Parsed(parsed)
            }
            Err(e) => Found::Failed(e),
        }
    }
}

/// Groups by the name their chats are filed under.
type GroupsByName = HashMap<String, Arc<Group>>;

/// Most group files [`DirAssets`] reads from `groups/`.
pub const DIR_ASSETS_GROUPS: usize = 1024;

impl DirAssets {
    /// The folder's groups by name (at most [`DIR_ASSETS_GROUPS`] files of at most 1 MiB
    /// each; unreadable ones are left out), read again only when the folder changed. Blocking.
    fn groups(&self) -> Arc<GroupsByName> {
        let folder = self.root.join("groups");
        let Some(stamp) = std::fs::metadata(&folder).ok().map(|m| stamp_of(&m)) else {
            return Arc::default();
        };
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((seen, groups)) = &cache.groups {
                if *seen == stamp {
                    return groups.clone();
                }
            }
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
            .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        let mut groups = HashMap::new();
        for path in files.iter().take(DIR_ASSETS_GROUPS) {
            // Regular files only: a link or a device is never read.
            let regular = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file());
            if !regular || path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let label = format!(
                "group {}",
                path.file_stem().and_then(|s| s.to_str()).unwrap_or("?")
            );
            if let Some(g) = read_at_most(path, MAX_GROUP_FILE_BYTES)
                .ok()
                .and_then(|b| Group::from_json(&label, &b).ok())
            {
                groups.entry(g.name.clone()).or_insert_with(|| Arc::new(g));
            }
        }
        let groups = Arc::new(groups);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.groups = Some((stamp, groups.clone()));
        groups
    }

    /// [`DirAssets::personas`], off the executor.
    async fn settings(&self) -> Option<Arc<Personas>> {
        let me = self.clone();
        tavern_store::blocking::off_executor(move || me.personas())
            .await
            .ok()
            .flatten()
    }

    /// The personas and world book selection of the folder's `settings.json` (a SillyTavern
    /// user folder's, or the part of it `tavern import-st` keeps), read again only when the
    /// file changed. Blocking.
    fn personas(&self) -> Option<Arc<Personas>> {
        let path = self.root.join("settings.json");
        let meta = std::fs::metadata(&path).ok().filter(|m| m.is_file())?;
        let stamp = stamp_of(&meta);
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((seen, parsed)) = &cache.settings {
                if *seen == stamp {
                    return parsed.clone();
                }
            }
        }
        let parsed = read_at_most(&path, self.max_bytes)
            .ok()
            .and_then(|bytes| Personas::from_settings(&bytes).ok())
            .map(Arc::new);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.settings = Some((stamp, parsed.clone()));
        parsed
    }
}

/// Reads a file, failing past `max` bytes (it may have grown since it was measured).
fn read_at_most(path: &std::path::Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max.saturating_add(1)).read_to_end(&mut bytes))
        .map_err(|e| e.kind().to_string())?;
    if bytes.len() as u64 > max {
        return Err(format!("over the limit of {max} bytes for an asset"));
    }
    Ok(bytes)
}

#[async_trait]
impl AssetProvider for DirAssets {
    async fn card(&self, character: &CharacterName) -> Result<Option<Arc<Card>>, AssetError> {
        let (me, stem) = (self.clone(), character.to_string());
        let name = format!("card {character}");
        let bad = name.clone();
        // Stats, listings and file reads are blocking work: off the executor.
        let label = name.clone();
        let found = tavern_store::blocking::off_executor(move || {
            me.load(
                &label,
                "characters",
                &stem,
                &["png", "json"],
                |p| &mut p.cards,
                |bytes| {
                    let bytes = bytes.map_err(|reason| AssetError::BadPng {
                        name: name.clone(),
                        reason,
                    })?;
                    Card::from_bytes(&name, &bytes).map(Arc::new)
                },
            )
        })
        .await
        .map_err(|reason| AssetError::BadPng { name: bad, reason })?;
        match found {
            Found::Missing => Ok(None),
            Found::Parsed(card) => Ok(Some(card)),
            Found::Failed(e) => Err(e),
        }
    }

    async fn world(&self, name: &str) -> Result<Option<Arc<WorldBook>>, AssetError> {
        let (me, stem) = (self.clone(), name.to_owned());
        let label = format!("world {name}");
        let shown = label.clone();
        let found = tavern_store::blocking::off_executor(move || {
            let book = stem.clone();
            me.load(
                &shown,
                "worlds",
                &stem,
                &["json"],
                |p| &mut p.worlds,
                move |bytes| {
                    let bytes = bytes.map_err(|reason| AssetError::BadJson {
                        name: format!("world {book}"),
                        reason,
                    })?;
                    WorldBook::from_json(&book, &bytes).map(Arc::new)
                },
            )
        })
        .await
        .map_err(|reason| AssetError::BadJson {
            name: label,
            reason,
        })?;
        match found {
            Found::Missing => Ok(None),
            Found::Parsed(book) => Ok(Some(book)),
            Found::Failed(e) => Err(e),
        }
    }

    /// The books given when this provider was made, then the folder's `settings.json`
    /// selection (`globalSelect`), each once.
    async fn global_worlds(&self) -> Vec<String> {
        let mut out = self.global.clone();
        if let Some(settings) = self.settings().await {
            for name in &settings.lore.global {
                if !out.contains(name) {
                    out.push(name.clone());
                }
            }
        }
        out
    }

    async fn group(&self, name: &str) -> Result<Option<Arc<Group>>, AssetError> {
        let me = self.clone();
        let groups = tavern_store::blocking::off_executor(move || me.groups())
            .await
            .map_err(|reason| AssetError::BadJson {
                name: format!("group {name}"),
                reason,
            })?;
        Ok(groups.get(name).cloned())
    }

    async fn character_worlds(&self, character: &CharacterName) -> Vec<String> {
        self.settings()
            .await
            .and_then(|s| s.lore.extra.get(character.as_str()).cloned())
            .unwrap_or_default()
    }

    async fn persona(&self) -> Persona {
        self.chat_persona(None).await
    }

    /// The folder's `settings.json` decides when it names a persona (the user's own choice in
    /// SillyTavern); the persona this provider was made with otherwise.
    async fn chat_persona(&self, locked: Option<&str>) -> Persona {
        self.settings()
            .await
            .and_then(|p| p.resolve(locked))
            .unwrap_or_else(|| self.persona.clone())
    }
}
