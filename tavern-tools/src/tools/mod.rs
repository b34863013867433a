//! The fourteen tools: typed arguments and results side by side with their implementations
//! over the store ports, plus the argument and result types they share.

pub(crate) mod memory;
pub(crate) mod tavern;
pub(crate) mod variable;

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tavern_core::Scope;

use crate::context::ToolLimits;
use crate::error::ToolError;
use crate::tool::{Tool, Typed};

pub use crate::tool::ToolSpec;

/// Every tool, in registry order.
pub(crate) fn all(limits: &ToolLimits) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(Typed::new(tavern::CharacterGet, limits)),
        Arc::new(Typed::new(tavern::LoreSearch, limits)),
        Arc::new(Typed::new(tavern::HistorySearch, limits)),
        Arc::new(Typed::new(tavern::SceneGet, limits)),
        Arc::new(Typed::new(memory::Search, limits)),
        Arc::new(Typed::new(memory::Read, limits)),
        Arc::new(Typed::new(memory::Write, limits)),
        Arc::new(Typed::new(memory::Update, limits)),
        Arc::new(Typed::new(memory::Forget, limits)),
        Arc::new(Typed::new(variable::Get, limits)),
        Arc::new(Typed::new(variable::Set, limits)),
        Arc::new(Typed::new(variable::Patch, limits)),
        Arc::new(Typed::new(variable::Delete, limits)),
        Arc::new(Typed::new(variable::List, limits)),
    ]
}

/// Every tool's contract, in registry order.
pub fn specs(limits: &ToolLimits) -> Vec<ToolSpec> {
    all(limits).iter().map(|t| t.spec().clone()).collect()
}

// --- shared argument types -----------------------------------------------------------------

/// Scope kinds a memory can live in (turn-local memories make no sense; use variables). The
/// session decides which chat and character they mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum MemoryScope {
    #[default]
    Chat,
    Character,
    Agent,
    Global,
}

impl MemoryScope {
    pub(crate) const ALL: [Self; 4] = [Self::Chat, Self::Character, Self::Agent, Self::Global];

    pub(crate) fn scope(self) -> Scope {
        match self {
            Self::Chat => Scope::Chat,
            Self::Character => Scope::Character,
            Self::Agent => Scope::Agent,
            Self::Global => Scope::Global,
        }
    }
}

/// Every scope kind, for variables. The session decides which chat, character and agent they
/// mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AnyScope {
    Turn,
    #[default]
    Chat,
    Character,
    Agent,
    Global,
}

impl AnyScope {
    pub(crate) fn scope(self) -> Scope {
        match self {
            Self::Turn => Scope::Turn,
            Self::Chat => Scope::Chat,
            Self::Character => Scope::Character,
            Self::Agent => Scope::Agent,
            Self::Global => Scope::Global,
        }
    }
}

/// A revision as returned by a read (`r1-` and 32 hex digits).
pub(crate) type RevisionArg = String;

/// Parses a revision argument, naming the field on failure.
pub(crate) fn revision(field: &str, raw: &str) -> Result<tavern_core::Revision, ToolError> {
    tavern_core::Revision::parse(raw).map_err(|e| ToolError::invalid(field, e.to_string()))
}

// --- shared result types -------------------------------------------------------------------

/// Which limit cut a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub(crate) enum TruncatedBy {
    #[serde(rename = "limit")]
    Limit,
    #[serde(rename = "max-tokens")]
    MaxTokens,
    /// Lore key matching hit its per-search work budget.
    #[serde(rename = "work-budget")]
    WorkBudget,
}

impl From<tavern_store::Truncation> for TruncatedBy {
    fn from(t: tavern_store::Truncation) -> Self {
        match t {
            tavern_store::Truncation::MaxTokens => Self::MaxTokens,
            tavern_store::Truncation::WorkBudget => Self::WorkBudget,
            // A truncation a newer store names is at least a limit.
            _ => Self::Limit,
        }
    }
}

/// A ranked listing: items best first and honesty about what was left out.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Listing<T, S> {
    /// The results, best first.
    pub(crate) items: Vec<T>,
    /// How many matched before limit and budget.
    pub(crate) source_count: usize,
    /// Whether matches were left out.
    pub(crate) truncated: bool,
    /// Which limit left them out.
    pub(crate) truncated_by: Option<TruncatedBy>,
    /// Where the results come from.
    pub(crate) source: S,
}

/// Refuses a write the session's write policy does not allow (global writes, confirmation).
pub(crate) fn check_write(
    ctx: &crate::context::ToolContext,
    scope: Scope,
    confirmed: bool,
) -> Result<(), ToolError> {
    ctx.policy()
        .check_write(scope, confirmed)
        .map_err(|d| ToolError::ScopeDenied {
            scope: scope.to_string(),
            reason: d.to_string(),
        })
}

/// Rounds a score for display (three decimals keep results stable and readable).
pub(crate) fn rounded(score: f64) -> f64 {
    (score * 1000.0).round() / 1000.0
}

/// Any JSON value (schemars writes `true`, which hosts reject; an empty schema means the same).
pub(crate) fn any_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({})
}

/// Truncates to at most `max_tokens` by the default estimator, at a character boundary.
/// Returns the text and whether it was cut.
pub(crate) fn fit(text: &str, max_tokens: usize) -> (String, bool) {
    use tavern_core::{DefaultTokenEstimator, TokenEstimator};
    let e = DefaultTokenEstimator;
    // Every character costs at least a quarter token, so what fits is shorter than this: the
    // work and memory of a cut depend on the budget, never on the text (a 30 MiB field).
    let (head, long) = prefix_chars(text, max_tokens.saturating_add(1).saturating_mul(4));
    if !long && e.estimate(text) <= max_tokens {
        return (text.to_owned(), false);
    }
    // Binary search on the character count, over the head's character boundaries.
    let ends: Vec<usize> = head.char_indices().map(|(i, c)| i + c.len_utf8()).collect();
    let (mut lo, mut hi) = (0usize, ends.len());
    let end_of = |n: usize| if n == 0 { 0 } else { ends[n - 1] };
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if e.estimate(&head[..end_of(mid)]) <= max_tokens {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (head[..end_of(lo)].to_owned(), true)
}

/// The first `chars` characters of `text` (longer by the rest of a macro the cut would split,
/// when its `}}` is near: a head never ends inside `{{…}}`, whose raw text — a `{{// comment}}`
/// say — SillyTavern never shows), and whether anything was left out.
pub(crate) fn macro_head(text: &str, chars: usize) -> (&str, bool) {
    /// How far past the cut a macro's end is looked for.
    const MACRO_REACH: usize = 64 * 1024;
    let (head, long) = prefix_chars(text, chars);
    if !long {
        return (head, false);
    }
    let open = head.rfind("{{");
    let closed = head.rfind("}}");
    let Some(open) = open.filter(|o| closed.is_none_or(|c| c < *o)) else {
        return (head, true);
    };
    let rest = &text[head.len()..];
    let reach = rest
        .char_indices()
        .take_while(|(i, _)| *i <= MACRO_REACH)
        .last()
        .map_or(0, |(i, c)| i + c.len_utf8());
    match rest[..reach].find("}}") {
        Some(end) => {
            let end = head.len() + end + 2;
            (&text[..end], end < text.len())
        }
        // Too far to tell: leave the unclosed macro out.
        None => (&text[..open], true),
    }
}

/// The first `chars` characters of `text`, and whether anything was left out.
pub(crate) fn prefix_chars(text: &str, chars: usize) -> (&str, bool) {
    match text.char_indices().nth(chars) {
        Some((at, _)) => (&text[..at], true),
        None => (text, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cut keeps exactly what fits, however long the text: the same answer as cutting the
    /// whole text, found within a head of the budget's size.
    #[test]
    fn fit_cuts_long_texts_to_the_budget() {
        use tavern_core::{DefaultTokenEstimator, TokenEstimator};
        let long = format!("{}{}", "风".repeat(3), "a".repeat(4_000_000));
        let (kept, cut) = fit(&long, 10);
        assert!(cut);
        assert_eq!(kept, format!("风风风{}", "a".repeat(28)));
        assert!(DefaultTokenEstimator.estimate(&kept) <= 10);
        assert_eq!(fit("short", 10), ("short".to_owned(), false));
        assert_eq!(fit("", 0), (String::new(), false));
        assert_eq!(prefix_chars("风风风", 2), ("风风", true));
        assert_eq!(prefix_chars("风风", 2), ("风风", false));
    }

    /// A head never ends inside a macro: it takes the macro whole when its end is near, and
    /// leaves it out when it is not.
    #[test]
    fn macro_heads_do_not_split_a_macro() {
        assert_eq!(macro_head("ab{{// note}}cd", 4), ("ab{{// note}}", true));
        assert_eq!(macro_head("ab{{user}}", 4), ("ab{{user}}", false));
        assert_eq!(macro_head("ab{{x}}cd{{y}}", 7), ("ab{{x}}", true));
        let far = format!("ab{{{{// {}}}}}", "x".repeat(70_000));
        assert_eq!(macro_head(&far, 4), ("ab", true));
        assert_eq!(macro_head("short", 10), ("short", false));
    }
}
