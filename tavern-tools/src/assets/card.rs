//! Character cards V1, V2 and V3, from JSON or PNG. The card stays a JSON value (every field,
//! known or not, survives); typed accessors read V2/V3 fields under `data` and V1 fields flat.

use base64::Engine as _;
use serde_json::Value;

use super::lenient::parse_lenient;
use super::png::text_chunks;
use super::world::WorldBook;
use super::AssetError;

/// Which card specification a card follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CardVersion {
    /// No `spec`: flat fields (2023 and earlier).
    V1,
    /// `chara_card_v2`.
    V2,
    /// `chara_card_v3`.
    V3,
}

impl CardVersion {
    /// The label used in tool results.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
            Self::V3 => "v3",
        }
    }
}

/// A character card.
#[derive(Debug, Clone)]
pub struct Card {
    raw: Value,
    version: CardVersion,
    /// The embedded book, parsed on first use and shared: a shared card is not parsed again
    /// per lore search.
    embedded: std::sync::OnceLock<Option<std::sync::Arc<WorldBook>>>,
}

impl PartialEq for Card {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw && self.version == other.version
    }
}

/// Card text fields a tool may ask for.
pub const CARD_TEXT_FIELDS: [&str; 10] = [
    "name",
    "nickname",
    "description",
    "personality",
    "scenario",
    "first_mes",
    "mes_example",
    "creator_notes",
    "system_prompt",
    "post_history_instructions",
];

impl Card {
    /// What SillyTavern's macros stand for in this card's text (`tavern_core::macros`), with
    /// `persona` as the user, `chat` for `{{pick}}` and `seed` for `{{random}}`.
    pub fn macros<'a>(
        &'a self,
        persona: &'a super::provider::Persona,
        chat: &'a str,
        now: tavern_core::Timestamp,
        seed: u64,
    ) -> tavern_core::macros::MacroContext<'a> {
        tavern_core::macros::MacroContext {
            character: self.name(),
            user: &persona.name,
            persona: &persona.description,
            description: self.field("description").unwrap_or(""),
            scenario: self.field("scenario").unwrap_or(""),
            personality: self.field("personality").unwrap_or(""),
            now,
            utc_offset_minutes: 0,
            last_user_message: None,
            chat,
            seed,
        }
    }

    /// Reads a card from JSON bytes.
    ///
    /// # Errors
    /// [`AssetError::BadJson`] or [`AssetError::WrongShape`] (no name).
    pub fn from_json(name: &str, bytes: &[u8]) -> Result<Self, AssetError> {
        let raw = parse_lenient(bytes).map_err(|reason| AssetError::BadJson {
            name: name.to_owned(),
            reason,
        })?;
        Self::from_value(name, raw)
    }

    /// Reads a card from a PNG: the `ccv3` chunk wins over `chara`; either may hold any version.
    ///
    /// # Errors
    /// [`AssetError::NotACard`] when neither chunk exists; [`AssetError::BadPng`],
    /// [`AssetError::BadJson`] for damaged data.
    pub fn from_png(name: &str, bytes: &[u8]) -> Result<Self, AssetError> {
        let chunks = text_chunks(name, bytes)?;
        let pick = |key: &str| chunks.iter().find(|(k, _)| k.eq_ignore_ascii_case(key));
        let Some((_, text)) = pick("ccv3").or_else(|| pick("chara")) else {
            return Err(AssetError::NotACard(name.to_owned()));
        };
        let clean: Vec<u8> = text
            .iter()
            .copied()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        let json = base64::engine::general_purpose::STANDARD
            .decode(&clean)
            .map_err(|e| AssetError::BadJson {
                name: name.to_owned(),
                reason: format!("card chunk is not base64: {e}"),
            })?;
        Self::from_json(name, &json)
    }

    /// Reads a card from bytes, by content: PNG signature or JSON.
    ///
    /// # Errors
    /// As [`Card::from_png`] / [`Card::from_json`].
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<Self, AssetError> {
        if bytes.starts_with(b"\x89PNG") {
            Self::from_png(name, bytes)
        } else {
            Self::from_json(name, bytes)
        }
    }

    /// Wraps an already parsed card value.
    ///
    /// # Errors
    /// [`AssetError::WrongShape`] when it is not an object with a name.
    pub fn from_value(name: &str, raw: Value) -> Result<Self, AssetError> {
        let version = match raw.get("spec").and_then(Value::as_str) {
            Some("chara_card_v3") => CardVersion::V3,
            Some("chara_card_v2") => CardVersion::V2,
            _ if raw.get("data").is_some_and(Value::is_object) => CardVersion::V2,
            _ => CardVersion::V1,
        };
        let card = Self {
            raw,
            version,
            embedded: std::sync::OnceLock::new(),
        };
        if card.field("name").is_none_or(|n| n.trim().is_empty()) {
            return Err(AssetError::WrongShape {
                name: name.to_owned(),
                kind: "character card",
                reason: "it has no name".into(),
            });
        }
        Ok(card)
    }

    /// The card's spec version.
    pub fn version(&self) -> CardVersion {
        self.version
    }

    /// The whole card as read (unknown fields included).
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// The object holding the card fields: `data` for V2/V3, the card itself for V1.
    pub fn data(&self) -> &Value {
        match self.version {
            CardVersion::V1 => &self.raw,
            _ => self.raw.get("data").unwrap_or(&self.raw),
        }
    }

    /// A text field by its card name (`description`, `first_mes`, …).
    pub fn field(&self, key: &str) -> Option<&str> {
        self.data().get(key).and_then(Value::as_str)
    }

    /// The character's name.
    pub fn name(&self) -> &str {
        self.field("name").unwrap_or_default()
    }

    /// Alternate greetings.
    pub fn alternate_greetings(&self) -> Vec<&str> {
        self.str_list("alternate_greetings")
    }

    /// Tags.
    pub fn tags(&self) -> Vec<&str> {
        self.str_list("tags")
    }

    fn str_list(&self, key: &str) -> Vec<&str> {
        self.data()
            .get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    /// The world book linked by name (`extensions.world`).
    pub fn linked_world(&self) -> Option<&str> {
        self.data()
            .pointer("/extensions/world")
            .and_then(Value::as_str)
            .filter(|w| !w.trim().is_empty())
    }

    /// The embedded `character_book`, if any (parsed once per card, then shared).
    pub fn embedded_book(&self) -> Option<std::sync::Arc<WorldBook>> {
        self.embedded
            .get_or_init(|| {
                let book = self
                    .data()
                    .get("character_book")
                    .filter(|b| b.is_object())?;
                let name = book
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.trim().is_empty())
                    .map_or_else(|| format!("{} (embedded)", self.name()), str::to_owned);
                WorldBook::from_character_book(&name, book)
                    .ok()
                    .map(std::sync::Arc::new)
            })
            .clone()
    }
}
