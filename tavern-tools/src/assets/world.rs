//! World info (lorebooks): SillyTavern world files (`entries` keyed by uid, in the current
//! ~31-field shape, the older 8/10-field shapes and KoboldAI's `folders` shape) and books
//! embedded in cards (`character_book`, with SillyTavern's fields under `extensions`), all read
//! into one entry model.

use serde_json::{Map, Value};

use super::lenient::parse_lenient;
use super::AssetError;

/// How secondary keys combine with the primary match (`selectiveLogic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SelectiveLogic {
    /// 0: primary and any secondary.
    #[default]
    AndAny,
    /// 1: primary and not all secondaries.
    NotAll,
    /// 2: primary and no secondary.
    NotAny,
    /// 3: primary and every secondary.
    AndAll,
}

impl SelectiveLogic {
    fn from_value(v: Option<&Value>) -> Self {
        match v.and_then(Value::as_i64) {
            Some(1) => Self::NotAll,
            Some(2) => Self::NotAny,
            Some(3) => Self::AndAll,
            _ => Self::AndAny,
        }
    }
}

/// One lore entry, normalized across shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct LoreEntry {
    /// The entry's uid (or `id` in embedded books).
    pub uid: i64,
    /// Primary keys; `/pattern/flags` keys are regular expressions.
    pub keys: Vec<String>,
    /// Secondary keys (used when `selective`).
    pub secondary_keys: Vec<String>,
    /// Title/memo (`comment`, `name` or KoboldAI `title`).
    pub comment: String,
    /// The lore text.
    pub content: String,
    /// Always active.
    pub constant: bool,
    /// Secondary keys apply.
    pub selective: bool,
    /// How secondaries combine.
    pub selective_logic: SelectiveLogic,
    /// Insertion order; higher is more important when the budget is tight.
    pub order: i64,
    /// Disabled entries never activate.
    pub disabled: bool,
    /// Per-entry case sensitivity (`None`: the book's default).
    pub case_sensitive: Option<bool>,
    /// Per-entry whole-word matching (`None`: the book's default).
    pub match_whole_words: Option<bool>,
    /// The entry as read, for fields this model does not use.
    pub raw: Map<String, Value>,
}

/// A world book.
#[derive(Debug, Clone, PartialEq)]
pub struct WorldBook {
    /// Its name (file name without extension, or the embedded book's name).
    pub name: String,
    /// Entries by uid.
    pub entries: Vec<LoreEntry>,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        // Some old files store keys as one comma-separated string.
        Some(Value::String(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

fn text(obj: &Map<String, Value>, keys: &[&str]) -> String {
    keys.iter()
        .find_map(|k| {
            obj.get(*k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_default()
        .to_owned()
}

fn flag(v: Option<&Value>) -> Option<bool> {
    v.and_then(Value::as_bool)
}

impl WorldBook {
    /// Reads a SillyTavern world file.
    ///
    /// # Errors
    /// [`AssetError::BadJson`] / [`AssetError::WrongShape`] naming the book.
    pub fn from_json(name: &str, bytes: &[u8]) -> Result<Self, AssetError> {
        let v = parse_lenient(bytes).map_err(|reason| AssetError::BadJson {
            name: name.to_owned(),
            reason,
        })?;
        Self::from_world_value(name, &v)
    }

    /// Reads a parsed world file value.
    ///
    /// # Errors
    /// [`AssetError::WrongShape`] when `entries` is missing.
    pub fn from_world_value(name: &str, v: &Value) -> Result<Self, AssetError> {
        let entries: Vec<&Value> = match v.get("entries") {
            Some(Value::Object(m)) => m.values().collect(),
            Some(Value::Array(a)) => a.iter().collect(),
            _ => {
                return Err(AssetError::WrongShape {
                    name: name.to_owned(),
                    kind: "world book",
                    reason: "no entries".into(),
                })
            }
        };
        let mut out: Vec<LoreEntry> = entries
            .into_iter()
            .filter_map(Value::as_object)
            .enumerate()
            .map(|(i, e)| world_entry(i, e))
            .collect();
        out.sort_by_key(|e| e.uid);
        Ok(Self {
            name: name.to_owned(),
            entries: out,
        })
    }

    /// Reads a card's embedded `character_book`.
    ///
    /// # Errors
    /// [`AssetError::WrongShape`] when `entries` is not a list.
    pub fn from_character_book(name: &str, book: &Value) -> Result<Self, AssetError> {
        let Some(entries) = book.get("entries").and_then(Value::as_array) else {
            return Err(AssetError::WrongShape {
                name: name.to_owned(),
                kind: "character book",
                reason: "entries is not a list".into(),
            });
        };
        let mut out: Vec<LoreEntry> = entries
            .iter()
            .filter_map(Value::as_object)
            .enumerate()
            .map(|(i, e)| book_entry(i, e))
            .collect();
        out.sort_by_key(|e| e.uid);
        Ok(Self {
            name: name.to_owned(),
            entries: out,
        })
    }
}

fn world_entry(index: usize, e: &Map<String, Value>) -> LoreEntry {
    LoreEntry {
        uid: e.get("uid").and_then(Value::as_i64).unwrap_or(index as i64),
        keys: strings(e.get("key")),
        secondary_keys: strings(e.get("keysecondary")),
        comment: text(e, &["comment", "title"]),
        content: text(e, &["content"]),
        constant: flag(e.get("constant")).unwrap_or(false),
        selective: flag(e.get("selective")).unwrap_or(false),
        selective_logic: SelectiveLogic::from_value(e.get("selectiveLogic")),
        order: e.get("order").and_then(Value::as_i64).unwrap_or(100),
        disabled: flag(e.get("disable")).unwrap_or(false),
        case_sensitive: flag(e.get("caseSensitive")),
        match_whole_words: flag(e.get("matchWholeWords")),
        raw: e.clone(),
    }
}

fn book_entry(index: usize, e: &Map<String, Value>) -> LoreEntry {
    let ext = e.get("extensions").and_then(Value::as_object);
    let ext_get = |k: &str| ext.and_then(|x| x.get(k));
    LoreEntry {
        uid: e.get("id").and_then(Value::as_i64).unwrap_or(index as i64),
        keys: strings(e.get("keys")),
        secondary_keys: strings(e.get("secondary_keys")),
        comment: text(e, &["comment", "name"]),
        content: text(e, &["content"]),
        constant: flag(e.get("constant")).unwrap_or(false),
        selective: flag(e.get("selective")).unwrap_or(false),
        selective_logic: SelectiveLogic::from_value(ext_get("selectiveLogic")),
        order: e
            .get("insertion_order")
            .and_then(Value::as_i64)
            .unwrap_or(100),
        disabled: !flag(e.get("enabled")).unwrap_or(true),
        case_sensitive: flag(e.get("case_sensitive")).or_else(|| flag(ext_get("case_sensitive"))),
        match_whole_words: flag(ext_get("match_whole_words")),
        raw: e.clone(),
    }
}
