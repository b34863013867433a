//! Lore activation with SillyTavern's semantics, plus lexical ranking for free-text queries.
//!
//! Activation: disabled entries never activate; constant entries always do; otherwise any
//! primary key must match the scanned text, and for `selective` entries with secondary keys the
//! `selectiveLogic` decides (AND_ANY 0, NOT_ALL 1, NOT_ANY 2, AND_ALL 3). Keys written
//! `/pattern/flags` are regular expressions. Matching is case-insensitive unless the entry (or
//! the options) say otherwise; whole-word matching treats ASCII letters, digits and `_` as word
//! characters — as JavaScript's `\W` does in SillyTavern — so a CJK key inside CJK text still
//! matches, and keys with spaces match as substrings. Probability and recursion are not
//! applied: results must be deterministic.

use std::cmp::Reverse;

use regex::RegexBuilder;
use tavern_core::{DefaultTokenEstimator, TokenEstimator};
use tavern_store::search::{query_tokens, Bm25Index};

use crate::assets::world::{LoreEntry, SelectiveLogic, WorldBook};

/// Where a book comes from; earlier sources win ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LoreSource {
    /// The card's embedded `character_book`.
    Embedded,
    /// The book the card links by name (`extensions.world`).
    CardLinked,
    /// A globally active book.
    Global,
}

impl LoreSource {
    /// The label in tool results.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::CardLinked => "card-linked",
            Self::Global => "global",
        }
    }
}

/// Why an entry is in the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A key matched (the primary key, and the secondary one where logic required one).
    Keyword {
        /// The primary key that matched.
        key: String,
    },
    /// Lexically relevant to the query without a key match.
    Lexical,
    /// A constant entry (always active).
    Constant,
}

impl Reason {
    /// The label in tool results.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Keyword { .. } => "keyword",
            Self::Lexical => "lexical",
            Self::Constant => "constant",
        }
    }
}

/// Matching defaults and limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoreOptions {
    /// Default case sensitivity for entries that do not set it.
    pub case_sensitive: bool,
    /// Default whole-word matching for entries that do not set it.
    pub match_whole_words: bool,
    /// Include constant entries (after keyword and lexical matches).
    pub include_constant: bool,
    /// Rank entries that match the query lexically but by no key.
    pub lexical: bool,
    /// Most entries returned.
    pub limit: usize,
    /// Token budget for returned content; an entry that does not fit ends the list.
    pub max_tokens: usize,
}

impl Default for LoreOptions {
    fn default() -> Self {
        Self {
            case_sensitive: false,
            match_whole_words: false,
            include_constant: false,
            lexical: true,
            limit: 5,
            max_tokens: 1000,
        }
    }
}

/// One returned entry.
#[derive(Debug, Clone, PartialEq)]
pub struct LoreHit<'a> {
    /// The book's name.
    pub book: &'a str,
    /// The book's source.
    pub source: LoreSource,
    /// The entry.
    pub entry: &'a LoreEntry,
    /// Why it is here.
    pub reason: Reason,
    /// BM25 relevance to the query (0 when not lexically related).
    pub score: f64,
    /// Estimated tokens of the content.
    pub tokens: usize,
}

/// Entries in rank order, with honesty about what was left out.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoreResult<'a> {
    /// Returned entries: keyword matches by order (higher first), then lexical matches by
    /// score, then constants by order; ties by source, book, uid.
    pub hits: Vec<LoreHit<'a>>,
    /// How many entries qualified before the limit and budget.
    pub source_count: usize,
    /// Whether qualifying entries were left out.
    pub truncated: bool,
    /// Which limit left them out: `limit` or `max-tokens`.
    pub truncated_by: Option<&'static str>,
    /// Keys that could not be used (invalid regular expressions), named by book and uid.
    pub warnings: Vec<String>,
}

/// A key after parsing.
enum Key {
    Regex(regex::Regex),
    Text(String),
}

fn parse_key(key: &str) -> Result<Key, String> {
    if key.len() > 2 && key.starts_with('/') {
        if let Some(end) = key.rfind('/').filter(|e| *e > 0) {
            let (pattern, flags) = (&key[1..end], &key[end + 1..]);
            if flags.chars().all(|f| "gimsuyd".contains(f)) {
                return RegexBuilder::new(pattern)
                    .case_insensitive(flags.contains('i'))
                    .multi_line(flags.contains('m'))
                    .dot_matches_new_line(flags.contains('s'))
                    .size_limit(1 << 20)
                    .build()
                    .map(Key::Regex)
                    .map_err(|e| format!("invalid regular expression key {key:?}: {e}"));
            }
        }
    }
    Ok(Key::Text(key.to_owned()))
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `needle` occurs in `haystack` with non-word characters (or the ends) around it.
fn contains_whole_word(haystack: &str, needle: &str) -> bool {
    if needle.is_empty() {
        return false;
    }
    let h = haystack.as_bytes();
    haystack.match_indices(needle).any(|(i, m)| {
        let before = i.checked_sub(1).map(|j| h[j]);
        let after = h.get(i + m.len()).copied();
        !before.is_some_and(is_word_byte) && !after.is_some_and(is_word_byte)
    })
}

struct Matcher<'t> {
    text: &'t str,
    folded: String,
}

impl Matcher<'_> {
    fn matches(&self, key: &Key, case_sensitive: bool, whole_words: bool) -> bool {
        match key {
            Key::Regex(re) => re.is_match(self.text),
            Key::Text(k) => {
                let (hay, needle) = if case_sensitive {
                    (self.text, k.clone())
                } else {
                    (self.folded.as_str(), k.to_lowercase())
                };
                if whole_words && !needle.contains(char::is_whitespace) {
                    contains_whole_word(hay, &needle)
                } else {
                    hay.contains(&needle)
                }
            }
        }
    }
}

/// Whether an entry activates on `text`, and by which primary key.
fn activation(
    entry: &LoreEntry,
    m: &Matcher<'_>,
    opts: &LoreOptions,
    warn: &mut dyn FnMut(String),
) -> Option<String> {
    let case = entry.case_sensitive.unwrap_or(opts.case_sensitive);
    let whole = entry.match_whole_words.unwrap_or(opts.match_whole_words);
    let mut test = |k: &String| match parse_key(k) {
        Ok(key) => m.matches(&key, case, whole),
        Err(w) => {
            warn(w);
            false
        }
    };
    let primary = entry.keys.iter().find(|k| test(k))?.clone();
    if !entry.selective || entry.secondary_keys.is_empty() {
        return Some(primary);
    }
    let hits = entry.secondary_keys.iter().filter(|k| test(k)).count();
    let all = entry.secondary_keys.len();
    let ok = match entry.selective_logic {
        SelectiveLogic::AndAny => hits > 0,
        SelectiveLogic::NotAll => hits < all,
        SelectiveLogic::NotAny => hits == 0,
        SelectiveLogic::AndAll => hits == all,
    };
    ok.then_some(primary)
}

/// Activates and ranks entries of `books` for `query`.
pub fn search<'a>(
    books: &'a [(LoreSource, WorldBook)],
    query: &str,
    opts: &LoreOptions,
) -> LoreResult<'a> {
    let matcher = Matcher {
        text: query,
        folded: query.to_lowercase(),
    };
    let mut warnings = Vec::new();
    let all: Vec<(LoreSource, &'a str, &'a LoreEntry)> = books
        .iter()
        .flat_map(|(src, b)| b.entries.iter().map(move |e| (*src, b.name.as_str(), e)))
        .filter(|(_, _, e)| !e.disabled)
        .collect();

    let mut index = Bm25Index::new();
    if opts.lexical {
        for (i, (_, _, e)) in all.iter().enumerate() {
            let text = format!("{} {} {}", e.comment, e.keys.join(" "), e.content);
            index.insert(u32::try_from(i).unwrap_or(u32::MAX), &text);
        }
    }
    let mut scores = vec![0f64; all.len()];
    for (doc, s) in index.score(&query_tokens(query)) {
        scores[doc as usize] = f64::from(s);
    }

    let mut keyword = Vec::new();
    let mut lexical = Vec::new();
    let mut constant = Vec::new();
    for (i, (src, book, e)) in all.iter().enumerate() {
        let mut warn = |w: String| warnings.push(format!("{book} entry {}: {w}", e.uid));
        let hit = |reason| LoreHit {
            book,
            source: *src,
            entry: e,
            reason,
            score: scores[i],
            tokens: DefaultTokenEstimator.estimate(&e.content),
        };
        if let Some(key) = activation(e, &matcher, opts, &mut warn) {
            keyword.push(hit(Reason::Keyword { key }));
        } else if scores[i] > 0.0 {
            lexical.push(hit(Reason::Lexical));
        } else if e.constant && opts.include_constant {
            constant.push(hit(Reason::Constant));
        }
    }
    warnings.sort();
    warnings.dedup();
    let tie = |h: &LoreHit<'_>| (h.source, h.book.to_owned(), h.entry.uid);
    keyword.sort_by_key(|h| (Reverse(h.entry.order), tie(h)));
    lexical.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| tie(a).cmp(&tie(b)))
    });
    constant.sort_by_key(|h| (Reverse(h.entry.order), tie(h)));

    let ranked: Vec<LoreHit<'a>> = keyword.into_iter().chain(lexical).chain(constant).collect();
    let mut out = LoreResult {
        source_count: ranked.len(),
        warnings,
        ..LoreResult::default()
    };
    let mut used = 0;
    for hit in ranked {
        if out.hits.len() >= opts.limit {
            out.truncated = true;
            out.truncated_by = Some("limit");
            break;
        }
        if used + hit.tokens > opts.max_tokens {
            out.truncated = true;
            out.truncated_by = Some("max-tokens");
            break;
        }
        used += hit.tokens;
        out.hits.push(hit);
    }
    out
}
