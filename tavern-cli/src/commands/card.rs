//! `tavern card validate FILE`: what a card holds, and what had to be repaired to read it.

use std::path::Path;

use base64::Engine as _;
use serde_json::{json, Value};
use tavern_tools::assets::card::Card;
use tavern_tools::assets::png::text_chunks;

use crate::{CliError, Report};

/// What reading a card found.
#[derive(Debug, Clone, PartialEq)]
pub struct CardInfo {
    /// The card.
    pub card: Card,
    /// Things that were repaired or look wrong, one line each.
    pub warnings: Vec<String>,
    /// `json` or `png`.
    pub container: &'static str,
    /// For PNGs: which text chunks hold a card (`chara`, `ccv3`).
    pub chunks: Vec<String>,
}

/// Reads a card from bytes and notes repairs (lone surrogates, invalid UTF-8) and oddities.
///
/// # Errors
/// The card's [`tavern_tools::assets::AssetError`] when it cannot be read at all.
pub fn inspect(label: &str, bytes: &[u8]) -> Result<CardInfo, CliError> {
    let card = Card::from_bytes(label, bytes)?;
    let mut warnings = Vec::new();
    let mut chunks = Vec::new();
    let (container, json_bytes) = if bytes.starts_with(b"\x89PNG") {
        let found = text_chunks(label, bytes)?;
        for key in ["chara", "ccv3"] {
            if found.iter().any(|(k, _)| k.eq_ignore_ascii_case(key)) {
                chunks.push(key.to_owned());
            }
        }
        let pick = |key: &str| found.iter().find(|(k, _)| k.eq_ignore_ascii_case(key));
        let text = pick("ccv3").or_else(|| pick("chara")).map(|(_, t)| {
            t.iter()
                .copied()
                .filter(|b| !b.is_ascii_whitespace())
                .collect::<Vec<u8>>()
        });
        let decoded = text.and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok());
        ("png", decoded.unwrap_or_default())
    } else {
        ("json", bytes.to_vec())
    };
    if std::str::from_utf8(&json_bytes).is_err() {
        warnings.push("invalid utf-8 in the card text was replaced with U+FFFD".to_owned());
    } else if serde_json::from_slice::<Value>(&json_bytes).is_err() {
        warnings.push("lone utf-16 surrogates in the card text were repaired as U+FFFD".to_owned());
    }
    if card.field("first_mes").is_none_or(|g| g.trim().is_empty()) {
        warnings.push("no greeting (first_mes is empty)".to_owned());
    }
    if card
        .data()
        .get("character_book")
        .is_some_and(Value::is_object)
        && card.embedded_book().is_none()
    {
        warnings.push("the embedded character_book is unreadable and is ignored".to_owned());
    }
    Ok(CardInfo {
        card,
        warnings,
        container,
        chunks,
    })
}

/// Validates a card file.
///
/// # Errors
/// [`CliError::Io`] for an unreadable file, the asset error for a broken card.
pub fn validate(file: &Path) -> Result<Report, CliError> {
    let label = file.display().to_string();
    let bytes = std::fs::read(file).map_err(CliError::io("read", label.clone()))?;
    let info = inspect(&label, &bytes)?;
    let card = &info.card;
    let spec_version = card.raw().get("spec_version").and_then(|v| {
        v.as_str()
            .map(str::to_owned)
            .or_else(|| v.as_f64().map(|f| f.to_string()))
    });
    let book = card.embedded_book();
    let entries = book.as_ref().map_or(0, |b| b.entries.len());
    let mut text = format!(
        "{label}: a valid character card\n  spec:            {}{}\n  container:       {}{}\n  name:            {}\n  embedded book:   {}\n  linked world:    {}\n  greetings:       {} (+{} alternate)\n  tags:            {}\n",
        card.version().as_str(),
        spec_version.as_ref().map_or(String::new(), |v| format!(" (spec_version {v})")),
        info.container,
        if info.chunks.is_empty() { String::new() } else { format!(" ({} chunk{})", info.chunks.join(" + "), if info.chunks.len() == 1 { "" } else { "s" }) },
        card.name(),
        book.as_ref().map_or_else(|| "none".to_owned(), |b| format!("{} ({entries} entries)", b.name)),
        card.linked_world().unwrap_or("none"),
        usize::from(card.field("first_mes").is_some_and(|g| !g.trim().is_empty())),
        card.alternate_greetings().len(),
        card.tags().len(),
    );
    let mut warnings = info.warnings.clone();
    if let Some(book) = &book {
        let ctx = tavern_tools::lore::LoreContext {
            character: card.name().to_owned(),
            user: "User".to_owned(),
            ..Default::default()
        };
        warnings.extend(tavern_tools::lore::key_warnings(book, &ctx));
    }
    for w in &warnings {
        text.push_str(&format!("  warning:         {w}\n"));
    }
    let json = json!({
        "file": label,
        "valid": true,
        "spec": card.version().as_str(),
        "specVersion": spec_version,
        "container": info.container,
        "chunks": info.chunks,
        "name": card.name(),
        "embeddedBook": book.as_ref().map(|b| json!({"name": b.name, "entries": entries})),
        "linkedWorld": card.linked_world(),
        "alternateGreetings": card.alternate_greetings().len(),
        "tags": card.tags(),
        "warnings": warnings,
    });
    Ok(Report::new(text, json))
}
