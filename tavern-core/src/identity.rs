//! The character's short identity summary: the only part of a card that goes into the fixed
//! kernel prompt. Everything else is fetched through tools.

use serde_json::Value;

/// Longest identity summary, in characters.
pub const IDENTITY_SUMMARY_MAX_CHARS: usize = 600;
/// Longest description excerpt used when deriving a summary.
const DERIVED_DESCRIPTION_MAX_CHARS: usize = 160;

/// A short, length-limited identity summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentitySummary {
    text: String,
    derived: bool,
}

impl IdentitySummary {
    /// Reads `data.extensions.agentTavern.identitySummary` from a card (V2/V3 under `data`, V1
    /// flat), or derives one from name, nickname and a very short description. The card is only
    /// read, never changed.
    pub fn from_card(card: &Value) -> Self {
        let data = card.get("data").filter(|d| d.is_object()).unwrap_or(card);
        let explicit = data
            .pointer("/extensions/agentTavern/identitySummary")
            .and_then(Value::as_str)
            .map(clean)
            .filter(|s| !s.is_empty());
        if let Some(text) = explicit {
            return Self {
                text: truncate(&text, IDENTITY_SUMMARY_MAX_CHARS),
                derived: false,
            };
        }
        let field = |k: &str| {
            data.get(k)
                .and_then(Value::as_str)
                .map(clean)
                .filter(|s| !s.is_empty())
        };
        let name = field("name").unwrap_or_else(|| "the character".into());
        let mut text = name.clone();
        if let Some(nick) = field("nickname").filter(|n| n != &name) {
            text.push_str(&format!(" (also called {nick})"));
        }
        if let Some(desc) = field("description") {
            text.push_str(": ");
            text.push_str(&truncate(
                first_sentence(&desc),
                DERIVED_DESCRIPTION_MAX_CHARS,
            ));
        }
        Self {
            text: truncate(&text, IDENTITY_SUMMARY_MAX_CHARS),
            derived: true,
        }
    }

    /// The summary text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether it was derived (the card has no explicit summary; a panel should suggest one).
    pub fn is_derived(&self) -> bool {
        self.derived
    }
}

/// Collapses whitespace runs (including newlines) to single spaces and drops control characters.
pub(crate) fn clean(s: &str) -> String {
    s.split_whitespace()
        .map(|w| w.chars().filter(|c| !c.is_control()).collect::<String>())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Truncates to `max` characters, marking the cut with `…`.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn first_sentence(s: &str) -> &str {
    let end = s
        .char_indices()
        .find(|(_, c)| matches!(c, '.' | '!' | '?' | '。' | '！' | '？'))
        .map(|(i, c)| i + c.len_utf8())
        .unwrap_or(s.len());
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn explicit_summary_wins_and_is_limited() {
        let card = json!({"data": {"name": "A", "extensions": {"agentTavern": {"identitySummary": "x".repeat(900)}}}});
        let s = IdentitySummary::from_card(&card);
        assert!(!s.is_derived());
        assert_eq!(s.as_str().chars().count(), IDENTITY_SUMMARY_MAX_CHARS);
    }

    #[test]
    fn derived_from_name_nickname_and_first_sentence() {
        let card = json!({"data": {"name": "Seraphina", "nickname": "Sera",
            "description": "A guardian of the forest.\nShe heals travelers. Long text follows."}});
        let before = card.clone();
        let s = IdentitySummary::from_card(&card);
        assert!(s.is_derived());
        assert_eq!(
            s.as_str(),
            "Seraphina (also called Sera): A guardian of the forest."
        );
        assert_eq!(card, before);
    }

    #[test]
    fn v1_flat_cards_and_cjk_descriptions() {
        let card = json!({"name": "门之主", "description": "写卡助手。其余内容"});
        assert_eq!(
            IdentitySummary::from_card(&card).as_str(),
            "门之主: 写卡助手。"
        );
    }
}
