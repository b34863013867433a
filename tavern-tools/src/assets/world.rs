//! World info (lorebooks): SillyTavern world files (`entries` keyed by uid, in the current
//! ~31-field shape, the older 8/10-field shapes and KoboldAI's `folders` shape) and books
//! embedded in cards (`character_book`, with SillyTavern's fields under `extensions`), all read
//! into one entry model.
//!
//! Content decorators (`@@activate`, `@@dont_activate` on the first lines, as SillyTavern's
//! `parseDecorators` reads them) are taken out of the content into [`LoreEntry::decorators`].

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

/// Which characters an entry is for (`characterFilter` in world files, `character_filter` in a
/// card's book extensions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CharacterFilter {
    /// Character (file) names.
    pub names: Vec<String>,
    /// Tags.
    pub tags: Vec<String>,
    /// When set, the entry is for every character **except** those named or tagged.
    pub is_exclude: bool,
}

impl CharacterFilter {
    fn from_value(v: Option<&Value>) -> Option<Self> {
        let o = v?.as_object()?;
        let f = Self {
            names: strings(o.get("names")),
            tags: strings(o.get("tags")),
            is_exclude: flag(o.get("isExclude").or_else(|| o.get("is_exclude"))).unwrap_or(false),
        };
        (!f.names.is_empty() || !f.tags.is_empty()).then_some(f)
    }
}

/// The decorators SillyTavern knows.
const KNOWN_DECORATORS: [&str; 2] = ["@@activate", "@@dont_activate"];

/// Splits leading decorator lines off `content`, as SillyTavern's `parseDecorators` does: when
/// the content starts with `@@`, every leading line starting with `@@` is a decorator line
/// (known ones — `@@activate`, `@@dont_activate`, or the escaped `@@@` form after an unknown
/// one — are returned, unknown ones dropped) and the content is what follows. Unlike SillyTavern,
/// content made only of decorator lines becomes empty instead of keeping them.
pub fn parse_decorators(content: &str) -> (Vec<String>, String) {
    if !content.starts_with("@@") {
        return (Vec::new(), content.to_owned());
    }
    let mut decorators = Vec::new();
    let mut fallback = false;
    let lines: Vec<&str> = content.split('\n').collect();
    for (i, raw) in lines.iter().enumerate() {
        let line = raw.trim_end();
        if !line.starts_with("@@") {
            return (decorators, lines[i..].join("\n"));
        }
        if line.starts_with("@@@") && !fallback {
            continue;
        }
        let name = line
            .strip_prefix('@')
            .filter(|l| l.starts_with("@@"))
            .unwrap_or(line);
        if KNOWN_DECORATORS.iter().any(|d| name.starts_with(d)) {
            decorators.push(name.to_owned());
            fallback = false;
        } else {
            fallback = true;
        }
    }
    (decorators, String::new())
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
    /// The lore text, without its decorator lines.
    pub content: String,
    /// Decorators from the first lines of the content (`@@activate`, `@@dont_activate`).
    pub decorators: Vec<String>,
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
    /// Inclusion groups (`group`, comma-separated names); empty: none.
    pub groups: Vec<String>,
    /// Wins its inclusion group over entries without it (`groupOverride`).
    pub group_override: bool,
    /// Weight within an inclusion group (`groupWeight`, default 100).
    pub group_weight: i64,
    /// Per-entry group scoring (`useGroupScoring`; `None`: the search's default).
    pub use_group_scoring: Option<bool>,
    /// Cannot be activated by other entries' content, only by the scanned text
    /// (`excludeRecursion`).
    pub exclude_recursion: bool,
    /// Its content does not activate other entries (`preventRecursion`).
    pub prevent_recursion: bool,
    /// Activatable only in a recursion pass of at least this level (`delayUntilRecursion`:
    /// `true` is 1, a number is its level; 0: not delayed).
    pub delay_until_recursion: u32,
    /// Which characters the entry is for (`None`: every character).
    pub character_filter: Option<CharacterFilter>,
}

/// A world book.
#[derive(Debug, Clone)]
pub struct WorldBook {
    /// Its name (file name without extension, or the embedded book's name).
    pub name: String,
    /// Entries by uid.
    pub entries: Vec<LoreEntry>,
    /// The lexical index of the entries, built on the first search that needs it and kept
    /// with the book: a shared book is indexed once per version, not per search.
    lexical: std::sync::OnceLock<std::sync::Arc<tavern_search::Bm25Index>>,
}

impl PartialEq for WorldBook {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.entries == other.entries
    }
}

/// `text` without SillyTavern's macros (`{{…}}`, `<USER>`, `<BOT>`, `<CHAR>`), for indexing:
/// what they stand for differs per chat, and their names are not words of the entry.
fn without_macros(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        match rest[open + 2..].find("}}") {
            Some(close) => {
                out.push(' ');
                rest = &rest[open + 2 + close + 2..];
            }
            None => {
                rest = &rest[open..];
                break;
            }
        }
    }
    out.push_str(rest);
    for tag in ["<USER>", "<BOT>", "<CHAR>", "<user>", "<bot>", "<char>"] {
        if out.contains(tag) {
            out = out.replace(tag, " ");
        }
    }
    out
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

fn groups(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_str)
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `delayUntilRecursion`: `true` → level 1, a positive number → that level, else 0.
fn delay_level(v: Option<&Value>) -> u32 {
    match v {
        Some(Value::Bool(true)) => 1,
        Some(Value::Number(n)) => n
            .as_u64()
            .map_or(0, |l| u32::try_from(l).unwrap_or(u32::MAX)),
        _ => 0,
    }
}

impl WorldBook {
    /// A book of `entries`.
    #[must_use]
    pub fn new(name: &str, entries: Vec<LoreEntry>) -> Self {
        Self {
            name: name.to_owned(),
            entries,
            lexical: std::sync::OnceLock::new(),
        }
    }

    /// The lexical index of the entries (entry `i` is document `i`: its comment, keys and
    /// content as written, macros left out — `{{user}}` is nobody's word), built once per book.
    pub fn lexical_index(&self) -> std::sync::Arc<tavern_search::Bm25Index> {
        self.lexical
            .get_or_init(|| {
                let texts: Vec<String> = self
                    .entries
                    .iter()
                    .map(|e| {
                        without_macros(&format!("{} {} {}", e.comment, e.keys.join(" "), e.content))
                    })
                    .collect();
                let docs: Vec<(u32, u32, &str)> = texts
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (u32::try_from(i).unwrap_or(u32::MAX), 0, t.as_str()))
                    .collect();
                let mut index = tavern_search::Bm25Index::new();
                index.insert_many(&docs);
                std::sync::Arc::new(index)
            })
            .clone()
    }

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
        Ok(Self::new(name, out))
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
        Ok(Self::new(name, out))
    }
}

fn world_entry(index: usize, e: &Map<String, Value>) -> LoreEntry {
    let (decorators, content) = parse_decorators(&text(e, &["content"]));
    LoreEntry {
        uid: e.get("uid").and_then(Value::as_i64).unwrap_or(index as i64),
        keys: strings(e.get("key")),
        secondary_keys: strings(e.get("keysecondary")),
        comment: text(e, &["comment", "title"]),
        content,
        decorators,
        constant: flag(e.get("constant")).unwrap_or(false),
        selective: flag(e.get("selective")).unwrap_or(false),
        selective_logic: SelectiveLogic::from_value(e.get("selectiveLogic")),
        order: e.get("order").and_then(Value::as_i64).unwrap_or(100),
        disabled: flag(e.get("disable")).unwrap_or(false),
        case_sensitive: flag(e.get("caseSensitive")),
        match_whole_words: flag(e.get("matchWholeWords")),
        groups: groups(e.get("group")),
        group_override: flag(e.get("groupOverride")).unwrap_or(false),
        group_weight: e.get("groupWeight").and_then(Value::as_i64).unwrap_or(100),
        use_group_scoring: flag(e.get("useGroupScoring")),
        exclude_recursion: flag(e.get("excludeRecursion")).unwrap_or(false),
        prevent_recursion: flag(e.get("preventRecursion")).unwrap_or(false),
        delay_until_recursion: delay_level(e.get("delayUntilRecursion")),
        character_filter: CharacterFilter::from_value(e.get("characterFilter")),
    }
}

fn book_entry(index: usize, e: &Map<String, Value>) -> LoreEntry {
    let ext = e.get("extensions").and_then(Value::as_object);
    let ext_get = |k: &str| ext.and_then(|x| x.get(k));
    let (decorators, content) = parse_decorators(&text(e, &["content"]));
    LoreEntry {
        uid: e.get("id").and_then(Value::as_i64).unwrap_or(index as i64),
        keys: strings(e.get("keys")),
        secondary_keys: strings(e.get("secondary_keys")),
        comment: text(e, &["comment", "name"]),
        content,
        decorators,
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
        groups: groups(ext_get("group")),
        group_override: flag(ext_get("group_override")).unwrap_or(false),
        group_weight: ext_get("group_weight")
            .and_then(Value::as_i64)
            .unwrap_or(100),
        use_group_scoring: flag(ext_get("use_group_scoring")),
        exclude_recursion: flag(ext_get("exclude_recursion")).unwrap_or(false),
        prevent_recursion: flag(ext_get("prevent_recursion")).unwrap_or(false),
        delay_until_recursion: delay_level(ext_get("delay_until_recursion")),
        character_filter: CharacterFilter::from_value(
            ext_get("character_filter").or_else(|| e.get("characterFilter")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(content, decorators, content after)`, following SillyTavern's `parseDecorators`.
    #[test]
    fn decorators_are_split_off_the_content() {
        let cases: &[(&str, &[&str], &str)] = &[
            ("plain text", &[], "plain text"),
            ("@@activate\nThe lore.", &["@@activate"], "The lore."),
            ("@@dont_activate\r\nText", &["@@dont_activate"], "Text"),
            (
                "@@activate\n@@dont_activate\nA\nB",
                &["@@activate", "@@dont_activate"],
                "A\nB",
            ),
            ("@@unknown\nText", &[], "Text"),
            ("@@@activate\nText", &[], "Text"),
            ("@@unknown\n@@@activate\nText", &["@@activate"], "Text"),
            ("@@activate", &["@@activate"], ""),
            ("Text\n@@activate", &[], "Text\n@@activate"),
            (" @@activate\nText", &[], " @@activate\nText"),
        ];
        for (content, decorators, rest) in cases {
            let (d, c) = parse_decorators(content);
            assert_eq!(d, *decorators, "{content:?}");
            assert_eq!(c, *rest, "{content:?}");
        }
    }
}
