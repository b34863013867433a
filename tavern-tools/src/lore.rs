//! Lore activation with SillyTavern's semantics (its `public/scripts/world-info.js`), plus
//! lexical ranking for free-text queries. The query plays the part of SillyTavern's scanned chat.
//!
//! **Which entries take part.** Disabled entries never do. An entry whose character filter
//! (`characterFilter` names/tags, `isExclude`) leaves this character out never reaches it, not
//! even lexically. An entry decorated `@@dont_activate` never activates (SillyTavern checks the
//! decorator before `constant`); `@@activate` makes an entry always-on like `constant`.
//! Decorator lines are not part of the returned content. When the same entry (same keys,
//! secondary keys and content) is reached through two books — a card's embedded book and the
//! world file SillyTavern's "import embedded lorebook" made from it — it is searched once, from
//! the earlier source (chat before embedded before card-linked before the character's extra
//! books before global); `duplicates` counts the rest.
//!
//! **Keys.** `{{char}}`, `{{user}}`, `<BOT>`, `<CHAR>` and `<USER>` (any case) are replaced by
//! the character's and the persona's names, then the key is trimmed; an empty key never
//! matches. A key is a regular expression only when it is `/pattern/flags` (flags from
//! `gimsuy`) with no unescaped `/` inside the pattern — `/a/b/` is the literal text `/a/b/` —
//! and it runs with JavaScript semantics (ASCII `\b`, `\d`, `\w`, so a full-width `１２` is not
//! `\d`; look-around; back-references), ignoring the entry's case and whole-word settings,
//! against the text prefixed with `\x01` as SillyTavern scans it (so `^` does not match at the
//! start). Its cost is bounded (`js_regex`): linear in the text, or for look-around and
//! back-references at most 100,000 backtracking steps per check — a key that gives up
//! does not match and is named in `warnings`. A key that does not compile or is longer than
//! [`MAX_REGEX_SOURCE`] bytes is matched as plain text, as SillyTavern does with keys it cannot
//! compile, and named in `warnings`. Compiled keys are cached. Plain keys match case-insensitively
//! unless the entry (or the options) say otherwise; whole-word matching treats ASCII letters,
//! digits and `_` as word characters — as JavaScript's `\W` does — so a CJK key inside CJK text
//! still matches, and keys with spaces match as substrings. For `selective` entries with
//! secondary keys `selectiveLogic` decides (AND_ANY 0, NOT_ALL 1, NOT_ANY 2, AND_ALL 3).
//!
//! **Recursion.** The content of activated entries is scanned again, at most
//! [`LoreOptions::recursion_depth`] more passes, each seeing the query plus the content of every
//! entry activated so far (at most [`MAX_RECURSION_TEXT`] bytes of it). `excludeRecursion`: the
//! entry can only be activated by the query, not in a recursion pass. `preventRecursion`: its
//! content activates nothing. `delayUntilRecursion` (`true` = level 1, or a level number): the
//! entry is activatable only in recursion passes whose level is at least its own. Passes start
//! at the lowest level; as in SillyTavern, when no new content would start another pass, a pass
//! is still run at the next pending level (admitting every entry delayed up to it), within the
//! depth.
//!
//! **Inclusion groups** (`group`, comma-separated names): among the entries a pass activates, at
//! most one per group survives, and none when an entry of that group was already activated by an
//! earlier pass. SillyTavern's rule, made deterministic: first, when group scoring is on (the
//! entry's `useGroupScoring`, else [`LoreOptions::use_group_scoring`]), scored entries whose
//! score — the number of their primary keys that match, plus the secondary matches under AND_ANY
//! (and AND_ALL when all match) — is below the group's best drop out; then an entry with
//! `groupOverride` wins (the highest `order` among them); otherwise, where SillyTavern rolls a
//! weighted die, the highest `groupWeight` wins; remaining ties go to the higher `order`, then
//! the earlier source and book, then the lower uid. A lexical match is never returned for a
//! group that has an activated entry, and at most one lexical match per group (the best) is.
//!
//! **Ranking.** Entries activated by the query (by `order`, higher first), then those activated
//! by recursion (pass by pass, by `order`), then lexical matches (BM25 over comment, keys and
//! content, ranked as memories and history are: stop words such as "the", "is", "的", "什么"
//! are ignored and English words match their other forms, see [`tavern_search`]),
//! then always-on entries when asked for; ties by source, book and uid. Always-on entries take
//! part in recursion like any activated entry (as in SillyTavern), so an empty query, which
//! activates and ranks nothing itself, returns the always-on entries when asked for, with what
//! their content activates.
//! Probability, sticky/cooldown/delay timers, scan depth and insertion position do not apply to
//! a tool that answers queries: results are deterministic.

use std::borrow::Borrow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tavern_core::{DefaultTokenEstimator, TokenEstimator};
use tavern_search::rank::Candidate as RankCandidate;
use tavern_search::{query_tokens, RankerRef};
use tavern_store::Truncation;

use crate::assets::world::{LoreEntry, SelectiveLogic, WorldBook};
use crate::js_regex::{self, JsRegex, StepLimit};

/// Longest regular-expression key source (the pattern between the slashes), in bytes.
pub const MAX_REGEX_SOURCE: usize = 256;

/// Most bytes of activated content scanned by recursion passes.
pub const MAX_RECURSION_TEXT: usize = 16 * 1024;

/// Compiled regular-expression keys kept across searches.
const REGEX_CACHE_CAPACITY: usize = 512;

/// SillyTavern's scan buffer separator (`\x01` before each message).
const MATCHER: &str = "\u{1}";

/// Where a book comes from; earlier sources win ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LoreSource {
    /// The book bound to the chat (`chat_metadata.world_info`): SillyTavern puts it first.
    Chat,
    /// The card's embedded `character_book`.
    Embedded,
    /// The book the card links by name (`extensions.world`).
    CardLinked,
    /// One of the character's extra books (SillyTavern's `world_info.charLore`).
    CharacterExtra,
    /// A globally active book.
    Global,
}

impl LoreSource {
    /// The label in tool results.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Embedded => "embedded",
            Self::CardLinked => "card-linked",
            Self::CharacterExtra => "character",
            Self::Global => "global",
        }
    }
}

/// Why an entry is in the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A key matched the query (the primary key, and the secondary ones where logic required).
    Keyword {
        /// The primary key that matched (after `{{char}}`/`{{user}}` substitution).
        key: String,
    },
    /// A key matched the content of entries activated before (recursion).
    Recursion {
        /// The primary key that matched.
        key: String,
        /// The recursion pass (1 = the first pass over activated content).
        level: usize,
    },
    /// Lexically relevant to the query without a key match.
    Lexical,
    /// An always-on entry (`constant` or `@@activate`).
    Constant,
}

impl Reason {
    /// The label in tool results.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Keyword { .. } => "keyword",
            Self::Recursion { .. } => "recursion",
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
    /// Include always-on entries (after keyword, recursion and lexical matches).
    pub include_constant: bool,
    /// Rank entries that match the query lexically but by no key.
    pub lexical: bool,
    /// Most entries returned.
    pub limit: usize,
    /// Token budget for returned content; an entry that does not fit ends the list.
    pub max_tokens: usize,
    /// Default group scoring for entries that do not set `useGroupScoring`.
    pub use_group_scoring: bool,
    /// Most recursion passes over activated content (0: no recursion).
    pub recursion_depth: usize,
    /// Most text key matching may scan in one search, in bytes (each key checked against the
    /// scanned text counts its length): the cost of a search is bounded by us, not by how many
    /// keys a card has. Past it matching stops and the result is `truncated` by `work-budget`.
    pub max_scan_bytes: usize,
    /// Most time key matching may take in one search (`None`: no limit but the bytes). Past it
    /// matching stops and the result is `truncated` by `work-budget`: a search answers in
    /// about this long whatever a card's keys are.
    pub max_match_time: Option<std::time::Duration>,
}

/// The default [`LoreOptions::max_scan_bytes`]: 16 MiB of key checks (about 4,000 keys against
/// a 4 KiB query and recursion text).
pub const DEFAULT_MAX_SCAN_BYTES: usize = 16 * 1024 * 1024;

/// The default [`LoreOptions::max_match_time`]: ordinary books match in well under a
/// millisecond; this bounds what hostile keys can take.
pub const DEFAULT_MAX_MATCH_TIME: std::time::Duration = std::time::Duration::from_millis(50);

impl Default for LoreOptions {
    fn default() -> Self {
        Self {
            case_sensitive: false,
            match_whole_words: false,
            include_constant: false,
            lexical: true,
            limit: 5,
            max_tokens: 1000,
            use_group_scoring: false,
            recursion_depth: 3,
            max_scan_bytes: DEFAULT_MAX_SCAN_BYTES,
            max_match_time: Some(DEFAULT_MAX_MATCH_TIME),
        }
    }
}

/// Who the lore is searched for: the names macros in keys stand for, and what character filters
/// are checked against.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoreContext {
    /// The character's name, for `{{char}}`, `<BOT>` and `<CHAR>`.
    pub character: String,
    /// The persona's name, for `{{user}}` and `<USER>`.
    pub user: String,
    /// Names that identify the character to `characterFilter.names` (SillyTavern uses the card's
    /// file name; the card's name is accepted too).
    pub character_ids: Vec<String>,
    /// The card's tags, for `characterFilter.tags` (compared case-insensitively).
    pub tags: Vec<String>,
    /// What the other SillyTavern macros in returned content stand for (`{{persona}}`,
    /// `{{description}}`, `{{time}}`, `{{pick}}`…; `tavern_core::macros`). Keys use only the
    /// names above.
    pub macros: MacroValues,
}

/// Values of SillyTavern's macros beyond the two names, owned (see [`LoreContext::macros`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MacroValues {
    /// The persona's description.
    pub persona: String,
    /// The card's description.
    pub description: String,
    /// The card's scenario.
    pub scenario: String,
    /// The card's personality.
    pub personality: String,
    /// Now, in epoch milliseconds.
    pub now_ms: i64,
    /// The user's offset from UTC now, in minutes.
    pub utc_offset_minutes: i32,
    /// When the user wrote before the chat's newest message (`{{idle_duration}}`).
    pub last_user_ms: Option<i64>,
    /// The chat `{{pick}}` is stable in.
    pub chat: String,
}

impl LoreContext {
    /// The macro context of returned content.
    fn macro_context(&self) -> tavern_core::macros::MacroContext<'_> {
        let m = &self.macros;
        tavern_core::macros::MacroContext {
            character: &self.character,
            user: &self.user,
            persona: &m.persona,
            description: &m.description,
            scenario: &m.scenario,
            personality: &m.personality,
            now: tavern_core::Timestamp(m.now_ms),
            utc_offset_minutes: m.utc_offset_minutes,
            last_user_message: m.last_user_ms.map(tavern_core::Timestamp),
            chat: &m.chat,
            seed: u64::try_from(m.now_ms).unwrap_or(0),
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
    /// The content as returned: without decorator lines, `{{char}}`/`{{user}}` replaced.
    pub content: String,
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
    /// Returned entries: keyword matches by order (higher first), then recursion matches, then
    /// lexical matches by score, then always-on entries by order; ties by source, book, uid.
    pub hits: Vec<LoreHit<'a>>,
    /// How many entries qualified before the limit and budget.
    pub source_count: usize,
    /// Whether qualifying entries were left out.
    pub truncated: bool,
    /// Which limit left them out: `limit` or `max-tokens`.
    pub truncated_by: Option<Truncation>,
    /// Keys that could not be used as regular expressions, named by book and uid.
    pub warnings: Vec<String>,
    /// Entries skipped because the same entry came earlier from another book.
    pub duplicates: usize,
}

/// Replaces SillyTavern's name macros (case-insensitively).
fn substitute(text: &str, ctx: &LoreContext) -> String {
    if !text.contains(['{', '<']) {
        return text.to_owned();
    }
    let macros: [(&str, &str); 5] = [
        ("{{char}}", &ctx.character),
        ("{{user}}", &ctx.user),
        ("<bot>", &ctx.character),
        ("<char>", &ctx.character),
        ("<user>", &ctx.user),
    ];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'outer: while !rest.is_empty() {
        for (m, name) in &macros {
            if rest.len() >= m.len()
                && rest.is_char_boundary(m.len())
                && rest[..m.len()].eq_ignore_ascii_case(m)
            {
                out.push_str(name);
                rest = &rest[m.len()..];
                continue 'outer;
            }
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The pattern and flags of a `/pattern/flags` key, as SillyTavern's `parseRegexFromString`
/// reads it: the shortest pattern followed by `/` and only `gimsuy` flags up to the end, with no
/// unescaped `/` inside.
fn split_regex(key: &str) -> Option<(&str, &str)> {
    let body = key.strip_prefix('/')?;
    let (pattern, flags) = body
        .match_indices('/')
        .map(|(i, _)| (&body[..i], &body[i + 1..]))
        .find(|(p, f)| !p.is_empty() && f.chars().all(|c| "gimsuy".contains(c)))?;
    let mut escaped = false;
    for c in pattern.chars() {
        match c {
            '\\' => escaped = !escaped,
            '/' if !escaped => return None,
            _ => escaped = false,
        }
    }
    Some((pattern, flags))
}

type Compiled = Result<Arc<JsRegex>, String>;

fn regex_cache() -> &'static Mutex<HashMap<(String, String), Compiled>> {
    static CACHE: OnceLock<Mutex<HashMap<(String, String), Compiled>>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// Compiles a regex key with JavaScript semantics (cached); `Err` explains why it cannot be used.
fn compile(pattern: &str, flags: &str) -> Compiled {
    let cache_key = (pattern.to_owned(), flags.to_owned());
    if let Some(hit) = regex_cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&cache_key)
    {
        return hit.clone();
    }
    let compiled = if pattern.len() > MAX_REGEX_SOURCE {
        Err(format!("longer than {MAX_REGEX_SOURCE} bytes"))
    } else {
        JsRegex::new(pattern, flags).map(Arc::new)
    };
    let mut cache = regex_cache().lock().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= REGEX_CACHE_CAPACITY {
        cache.clear();
    }
    cache.insert(cache_key, compiled.clone());
    compiled
}

/// A key after substitution and parsing.
#[derive(Clone)]
enum Key {
    Regex {
        re: Arc<JsRegex>,
        sticky: bool,
    },
    /// Plain text, as written and lowercased (folded once, not on every check).
    Text {
        text: String,
        folded: String,
    },
}

fn text_key(shown: &str) -> Key {
    Key::Text {
        text: shown.to_owned(),
        folded: shown.to_lowercase(),
    }
}

/// A parsed key and the text it was written as (after substitution).
#[derive(Clone)]
struct ParsedKey {
    shown: String,
    key: Key,
}

fn parse_key(raw: &str, ctx: &LoreContext, warn: &mut dyn FnMut(String)) -> Option<ParsedKey> {
    let shown = substitute(raw, ctx).trim().to_owned();
    if shown.is_empty() {
        return None;
    }
    let key = match split_regex(&shown) {
        Some((pattern, flags)) => match compile(pattern, flags) {
            Ok(re) => Key::Regex {
                re,
                sticky: flags.contains('y'),
            },
            Err(why) => {
                warn(format!(
                    "regular expression key {shown:?} cannot be used ({why}); matched as plain text"
                ));
                text_key(&shown)
            }
        },
        None => text_key(&shown),
    };
    Some(ParsedKey { shown, key })
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

/// What key matching may still do in this search: bytes to scan (see
/// [`LoreOptions::max_scan_bytes`]) and time (see [`LoreOptions::max_match_time`]).
struct Budget {
    left: std::cell::Cell<usize>,
    deadline: Option<std::time::Instant>,
    /// Why matching stopped, once it has.
    exhausted: std::cell::Cell<Option<Exhausted>>,
    /// Regex keys that gave up on a text (their step limit), as written.
    gave_up: std::cell::RefCell<Vec<String>>,
}

/// Which part of a search's budget ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exhausted {
    Bytes,
    Time,
}

/// What a check by a backtracking key costs in bytes of the budget at least: such checks
/// can each take up to [`js_regex::BACKTRACK_LIMIT`] steps, so one search makes at most a few
/// hundred of them whatever the text's length.
const BACKTRACKING_CHECK_BYTES: usize = 64 * 1024;

impl Budget {
    fn new(bytes: usize, time: Option<std::time::Duration>) -> Self {
        Self {
            left: std::cell::Cell::new(bytes),
            deadline: time.and_then(|t| std::time::Instant::now().checked_add(t)),
            exhausted: std::cell::Cell::new(None),
            gave_up: std::cell::RefCell::default(),
        }
    }

    /// Takes `cost` bytes; `false` (and exhausted from then on) when they or the time are
    /// not left.
    fn take(&self, cost: usize) -> bool {
        if self.exhausted.get().is_some() {
            return false;
        }
        if self
            .deadline
            .is_some_and(|d| std::time::Instant::now() >= d)
        {
            self.exhausted.set(Some(Exhausted::Time));
            return false;
        }
        match self.left.get().checked_sub(cost) {
            Some(rest) => {
                self.left.set(rest);
                true
            }
            None => {
                self.exhausted.set(Some(Exhausted::Bytes));
                false
            }
        }
    }
}

/// A scan buffer: the text as written and case-folded, and the search's work budget.
struct Buffer<'b> {
    text: String,
    folded: String,
    budget: &'b Budget,
}

impl<'b> Buffer<'b> {
    fn new(text: String, budget: &'b Budget) -> Self {
        let folded = text.to_lowercase();
        Self {
            text,
            folded,
            budget,
        }
    }

    fn matches(&self, parsed: &ParsedKey, case_sensitive: bool, whole_words: bool) -> bool {
        let cost = match &parsed.key {
            Key::Regex { re, .. } if re.backtracks() => {
                self.text.len().max(BACKTRACKING_CHECK_BYTES)
            }
            _ => self.text.len().max(1),
        };
        if !self.budget.take(cost) {
            return false;
        }
        match &parsed.key {
            Key::Regex { re, sticky } => match re.find_start(&self.text) {
                Ok(Some(start)) => !sticky || start == 0,
                Ok(None) => false,
                Err(StepLimit) => {
                    self.budget.gave_up.borrow_mut().push(parsed.shown.clone());
                    false
                }
            },
            Key::Text { text, folded } => {
                let (hay, needle) = if case_sensitive {
                    (self.text.as_str(), text.as_str())
                } else {
                    (self.folded.as_str(), folded.as_str())
                };
                if whole_words && needle.split_whitespace().count() <= 1 {
                    contains_whole_word(hay, needle)
                } else {
                    hay.contains(needle)
                }
            }
        }
    }
}

/// An entry taking part in a search.
struct Candidate<'a> {
    source: LoreSource,
    book: &'a str,
    entry: &'a LoreEntry,
    content: std::borrow::Cow<'a, str>,
    primary: Vec<ParsedKey>,
    secondary: Vec<ParsedKey>,
    always_on: bool,
}

impl Candidate<'_> {
    fn case_sensitive(&self, opts: &LoreOptions) -> bool {
        self.entry.case_sensitive.unwrap_or(opts.case_sensitive)
    }

    fn whole_words(&self, opts: &LoreOptions) -> bool {
        self.entry
            .match_whole_words
            .unwrap_or(opts.match_whole_words)
    }

    fn tie(&self) -> (LoreSource, &str, i64) {
        (self.source, self.book, self.entry.uid)
    }

    /// The primary key that activates this entry on `buf`, if its keys say so.
    fn activation(&self, buf: &Buffer, opts: &LoreOptions) -> Option<String> {
        let (case, whole) = (self.case_sensitive(opts), self.whole_words(opts));
        let primary = self.primary.iter().find(|k| buf.matches(k, case, whole))?;
        if !self.entry.selective || self.secondary.is_empty() {
            return Some(primary.shown.clone());
        }
        let hits = self
            .secondary
            .iter()
            .filter(|k| buf.matches(k, case, whole))
            .count();
        let all = self.secondary.len();
        let ok = match self.entry.selective_logic {
            SelectiveLogic::AndAny => hits > 0,
            SelectiveLogic::NotAll => hits < all,
            SelectiveLogic::NotAny => hits == 0,
            SelectiveLogic::AndAll => hits == all,
        };
        ok.then(|| primary.shown.clone())
    }

    /// SillyTavern's group score: matching primary keys, plus matching secondary keys under
    /// AND_ANY, or under AND_ALL when all match.
    fn score(&self, buf: &Buffer, opts: &LoreOptions) -> usize {
        let (case, whole) = (self.case_sensitive(opts), self.whole_words(opts));
        let count =
            |keys: &[ParsedKey]| keys.iter().filter(|k| buf.matches(k, case, whole)).count();
        if self.primary.is_empty() {
            return 0;
        }
        let primary = count(&self.primary);
        if self.secondary.is_empty() {
            return primary;
        }
        let secondary = count(&self.secondary);
        match self.entry.selective_logic {
            SelectiveLogic::AndAny => primary + secondary,
            SelectiveLogic::AndAll if secondary == self.secondary.len() => primary + secondary,
            _ => primary,
        }
    }
}

/// Whether a character filter lets the entry reach this character.
fn passes_filter(entry: &LoreEntry, ctx: &LoreContext) -> bool {
    let Some(f) = &entry.character_filter else {
        return true;
    };
    if !f.names.is_empty() {
        let named = f.names.iter().any(|n| ctx.character_ids.contains(n));
        if named == f.is_exclude {
            return false;
        }
    }
    if !f.tags.is_empty() {
        let tagged = f
            .tags
            .iter()
            .any(|t| ctx.tags.iter().any(|c| c.eq_ignore_ascii_case(t)));
        if tagged == f.is_exclude {
            return false;
        }
    }
    true
}

/// Keeps at most one entry per inclusion group among `new` (indices into `cands`), dropping
/// groups that earlier passes already filled (see the module doc for the rule).
fn filter_groups(
    new: &mut Vec<usize>,
    cands: &[Candidate<'_>],
    taken: &HashSet<&str>,
    buf: &Buffer,
    opts: &LoreOptions,
) {
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for &i in new.iter() {
        for g in &cands[i].entry.groups {
            groups.entry(g.as_str()).or_default().push(i);
        }
    }
    let mut removed: HashSet<usize> = HashSet::new();
    for (name, members) in groups {
        let mut live: Vec<usize> = members
            .into_iter()
            .filter(|i| !removed.contains(i))
            .collect();
        if taken.contains(name) {
            removed.extend(live);
            continue;
        }
        if live.len() <= 1 {
            continue;
        }
        let scored = |i: usize| {
            cands[i]
                .entry
                .use_group_scoring
                .unwrap_or(opts.use_group_scoring)
        };
        if live.iter().any(|&i| scored(i)) {
            let scores: Vec<(usize, usize)> = live
                .iter()
                .map(|&i| (i, cands[i].score(buf, opts)))
                .collect();
            let best = scores.iter().map(|s| s.1).max().unwrap_or(0);
            for (i, s) in scores {
                if scored(i) && s < best {
                    removed.insert(i);
                }
            }
            live.retain(|i| !removed.contains(i));
        }
        let overrides: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&i| cands[i].entry.group_override)
            .collect();
        let pool = if overrides.is_empty() {
            &live
        } else {
            &overrides
        };
        let winner = pool.iter().copied().min_by(|&a, &b| {
            let (ea, eb) = (cands[a].entry, cands[b].entry);
            let weight = |e: &LoreEntry| {
                if overrides.is_empty() {
                    e.group_weight
                } else {
                    0
                }
            };
            weight(eb)
                .cmp(&weight(ea))
                .then(eb.order.cmp(&ea.order))
                .then_with(|| cands[a].tie().cmp(&cands[b].tie()))
        });
        removed.extend(live.into_iter().filter(|&i| Some(i) != winner));
    }
    new.retain(|i| !removed.contains(i));
}

/// Length of the texts [`key_warnings`] tries backtracking keys on.
const PROBE_CHARS: usize = 2000;

/// What is wrong with a book's keys, one line each, before any search: regular-expression keys
/// that cannot be used (matched as plain text) and keys that give up on a test text made of
/// their own characters (such a key costs a search its step limit whenever it meets such text,
/// and does not match it). Keys are read with `ctx`'s names for their macros.
pub fn key_warnings(book: &WorldBook, ctx: &LoreContext) -> Vec<String> {
    let mut out = Vec::new();
    for entry in &book.entries {
        for raw in entry.keys.iter().chain(&entry.secondary_keys) {
            let shown = substitute(raw, ctx).trim().to_owned();
            let Some((pattern, flags)) = split_regex(&shown) else {
                continue;
            };
            match compile(pattern, flags) {
                Err(why) => out.push(format!(
                    "entry {}: regular expression key {shown:?} cannot be used ({why}); it is matched as plain text",
                    entry.uid
                )),
                Ok(re) if re.backtracks() => {
                    let gives_up = probes(pattern)
                        .iter()
                        .any(|text| re.find_start(text) == Err(StepLimit));
                    if gives_up {
                        out.push(format!(
                            "entry {}: regular expression key {shown:?} gives up after {} backtracking steps on a {PROBE_CHARS}-character text; it will not match such text",
                            entry.uid,
                            js_regex::BACKTRACK_LIMIT
                        ));
                    }
                }
                Ok(_) => {}
            }
        }
    }
    out
}

/// Test texts for a key: each letter or digit it names repeated, and its letters in turn.
fn probes(pattern: &str) -> Vec<String> {
    let mut letters: Vec<char> = pattern
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .chain(['a', '1', ' '])
        .collect();
    letters.sort_unstable();
    letters.dedup();
    let mut out: Vec<String> = letters
        .iter()
        .map(|c| std::iter::repeat_n(*c, PROBE_CHARS).collect())
        .collect();
    out.push(letters.iter().cycle().take(PROBE_CHARS).collect());
    out
}

/// Activates and ranks entries of `books` for `query`, with no character context (macros in
/// keys become empty, character filters see no name or tag).
pub fn search<'a, B: Borrow<WorldBook>>(
    books: &'a [(LoreSource, B)],
    query: &str,
    opts: &LoreOptions,
) -> LoreResult<'a> {
    search_with(books, query, opts, &LoreContext::default())
}

/// Activates and ranks entries of `books` for `query` on behalf of `ctx` (see the module doc).
pub fn search_with<'a, B: Borrow<WorldBook>>(
    books: &'a [(LoreSource, B)],
    query: &str,
    opts: &LoreOptions,
    ctx: &LoreContext,
) -> LoreResult<'a> {
    search_ranked(books, query, opts, ctx, &RankerRef::default())
}

/// [`search_with`], the entries no key activated ranked through `ranker` (which sees each
/// lexical match's comment, keys and content, and gives its final score).
pub fn search_ranked<'a, B: Borrow<WorldBook>>(
    books: &'a [(LoreSource, B)],
    query: &str,
    opts: &LoreOptions,
    ctx: &LoreContext,
    ranker: &RankerRef,
) -> LoreResult<'a> {
    let mut warnings = Vec::new();
    let mut duplicates = 0;
    let mut seen: rustc_hash::FxHashSet<(&[String], &[String], &str)> =
        rustc_hash::FxHashSet::default();
    let mut cands: Vec<Candidate<'a>> = Vec::new();
    let mut order: Vec<(usize, usize, &'a str, &'a LoreEntry)> = books
        .iter()
        .enumerate()
        .flat_map(|(i, (_, b))| {
            let b: &WorldBook = b.borrow();
            b.entries
                .iter()
                .enumerate()
                .map(move |(at, e)| (i, at, b.name.as_str(), e))
        })
        .collect();
    // Earlier sources first, so a duplicate keeps its earliest source.
    order.sort_by_key(|(i, _, _, _)| (books[*i].0, *i));
    // Which candidate each entry of each book became, for the books' lexical indexes.
    let mut candidate_of: Vec<Vec<Option<usize>>> = books
        .iter()
        .map(|(_, b)| vec![None; b.borrow().entries.len()])
        .collect();
    let macro_ctx = ctx.macro_context();
    for (i, at, book, e) in order {
        if e.disabled || !passes_filter(e, ctx) {
            continue;
        }
        if !seen.insert((&e.keys, &e.secondary_keys, &e.content)) {
            duplicates += 1;
            continue;
        }
        if e.decorators.iter().any(|d| d == "@@dont_activate") {
            continue;
        }
        let mut warn = |w: String| warnings.push(format!("{book} entry {}: {w}", e.uid));
        let primary = e
            .keys
            .iter()
            .filter_map(|k| parse_key(k, ctx, &mut warn))
            .collect();
        let secondary = e
            .secondary_keys
            .iter()
            .filter_map(|k| parse_key(k, ctx, &mut warn))
            .collect();
        candidate_of[i][at] = Some(cands.len());
        cands.push(Candidate {
            source: books[i].0,
            book,
            entry: e,
            content: tavern_core::macros::substitute_cow(&e.content, &macro_ctx),
            primary,
            secondary,
            always_on: e.constant || e.decorators.iter().any(|d| d == "@@activate"),
        });
    }

    // Activation passes: pass 0 scans the query, later passes add activated content.
    let mut reasons: Vec<Option<Reason>> = vec![None; cands.len()];
    let budget = Budget::new(opts.max_scan_bytes, opts.max_match_time);
    let mut taken_groups: HashSet<&str> = HashSet::new();
    let mut recursion_text = String::new();
    let mut levels: Vec<u32> = cands
        .iter()
        .map(|c| c.entry.delay_until_recursion)
        .filter(|l| *l > 0)
        .collect();
    levels.sort_unstable();
    levels.dedup();
    let mut levels = levels.into_iter();
    let mut delay_level = levels.next().unwrap_or(0);
    let mut pass = 0usize;
    loop {
        let recursive = pass > 0;
        let mut text = format!("{MATCHER}{query}");
        if recursive && !recursion_text.is_empty() {
            text.push('\n');
            text.push_str(MATCHER);
            text.push_str(&recursion_text);
        }
        let buf = Buffer::new(text, &budget);
        let mut new: Vec<usize> = Vec::new();
        for (i, c) in cands.iter().enumerate() {
            if reasons[i].is_some() {
                continue;
            }
            let delay = c.entry.delay_until_recursion;
            let held_back = if recursive {
                delay > delay_level || c.entry.exclude_recursion
            } else {
                delay > 0
            };
            if held_back {
                continue;
            }
            if let Some(key) = c.activation(&buf, opts) {
                reasons[i] = Some(if recursive {
                    Reason::Recursion { key, level: pass }
                } else {
                    Reason::Keyword { key }
                });
                new.push(i);
            } else if c.always_on && opts.include_constant {
                reasons[i] = Some(Reason::Constant);
                new.push(i);
            }
        }
        new.sort_by(|&a, &b| {
            Reverse(cands[a].entry.order)
                .cmp(&Reverse(cands[b].entry.order))
                .then_with(|| cands[a].tie().cmp(&cands[b].tie()))
        });
        let before: Vec<usize> = new.clone();
        filter_groups(&mut new, &cands, &taken_groups, &buf, opts);
        for i in before {
            if !new.contains(&i) {
                reasons[i] = None;
            }
        }
        let mut added = false;
        for &i in &new {
            taken_groups.extend(cands[i].entry.groups.iter().map(String::as_str));
            if !cands[i].entry.prevent_recursion && recursion_text.len() < MAX_RECURSION_TEXT {
                if !recursion_text.is_empty() {
                    recursion_text.push('\n');
                }
                recursion_text.push_str(&cands[i].content);
                added = true;
            }
        }
        if recursion_text.len() > MAX_RECURSION_TEXT {
            let mut cut = MAX_RECURSION_TEXT;
            while !recursion_text.is_char_boundary(cut) {
                cut -= 1;
            }
            recursion_text.truncate(cut);
        }
        if pass >= opts.recursion_depth {
            break;
        }
        pass += 1;
        if !added {
            // SillyTavern still runs a pass for each pending delayed-recursion level.
            match levels.next() {
                Some(l) => delay_level = l,
                None => break,
            }
        }
    }

    // Lexical ranking over entries no key activated.
    let mut scores = vec![0f64; cands.len()];
    if opts.lexical {
        // Each book's index, kept with the book (its entries as written); only the matches
        // are then shown to the ranker, as the model would see them.
        let tokens = query_tokens(query);
        let mut matched: Vec<(usize, f32)> = Vec::new();
        for (b, (_, book)) in books.iter().enumerate() {
            let index = book.borrow().lexical_index();
            for (doc, score) in index.score(&tokens) {
                let c = candidate_of.get(b).and_then(|of| of.get(doc as usize));
                if let Some(&Some(c)) = c {
                    matched.push((c, score));
                }
            }
        }
        let texts: Vec<String> = matched
            .iter()
            .map(|&(c, _)| {
                let c = &cands[c];
                format!(
                    "{} {} {}",
                    c.entry.comment,
                    c.entry.keys.join(" "),
                    c.content
                )
            })
            .collect();
        let mut found: Vec<RankCandidate<'_>> = matched
            .iter()
            .zip(&texts)
            .map(|(&(c, score), text)| RankCandidate {
                doc: u32::try_from(c).unwrap_or(u32::MAX),
                text,
                score,
            })
            .collect();
        // The ranker sees every lexical match (a book's entries, bounded by the book).
        found.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.doc.cmp(&b.doc)));
        ranker.apply(query, &mut found);
        for c in found {
            if let Some(slot) = scores.get_mut(c.doc as usize) {
                *slot = f64::from(c.score);
            }
        }
    }
    let mut lexical: Vec<usize> = (0..cands.len())
        .filter(|&i| reasons[i].is_none() && scores[i] > 0.0)
        .filter(|&i| {
            !cands[i]
                .entry
                .groups
                .iter()
                .any(|g| taken_groups.contains(g.as_str()))
        })
        .collect();
    lexical.sort_by(|&a, &b| {
        scores[b]
            .total_cmp(&scores[a])
            .then_with(|| cands[a].tie().cmp(&cands[b].tie()))
    });
    let mut lexical_groups: HashSet<&str> = HashSet::new();
    lexical.retain(|&i| {
        let gs = &cands[i].entry.groups;
        let free = !gs.iter().any(|g| lexical_groups.contains(g.as_str()));
        if free {
            lexical_groups.extend(gs.iter().map(String::as_str));
        }
        free
    });
    let mut lexical_rank = vec![0usize; cands.len()];
    for (r, &i) in lexical.iter().enumerate() {
        reasons[i] = Some(Reason::Lexical);
        lexical_rank[i] = r;
    }

    let rank = |i: usize| -> (u8, usize, Reverse<i64>) {
        let e = cands[i].entry;
        match &reasons[i] {
            Some(Reason::Keyword { .. }) => (0, 0, Reverse(e.order)),
            Some(Reason::Recursion { level, .. }) => (1, *level, Reverse(e.order)),
            Some(Reason::Lexical) => (2, lexical_rank[i], Reverse(0)),
            _ => (3, 0, Reverse(e.order)),
        }
    };
    let mut ranked: Vec<usize> = (0..cands.len()).filter(|&i| reasons[i].is_some()).collect();
    ranked.sort_by(|&a, &b| {
        rank(a)
            .cmp(&rank(b))
            .then_with(|| cands[a].tie().cmp(&cands[b].tie()))
    });

    let exhausted = budget.exhausted.get();
    match exhausted {
        Some(Exhausted::Bytes) => warnings.push(format!(
            "key matching stopped after scanning {} bytes (the per-search budget): entries whose keys were not checked may be missing",
            opts.max_scan_bytes
        )),
        Some(Exhausted::Time) => warnings.push(format!(
            "key matching stopped after {} ms (the per-search time budget): entries whose keys were not checked may be missing",
            opts.max_match_time.map_or(0, |t| t.as_millis())
        )),
        None => {}
    }
    for key in budget.gave_up.take() {
        warnings.push(format!(
            "regular expression key {key:?} gave up after {} backtracking steps; it did not match",
            js_regex::BACKTRACK_LIMIT
        ));
    }
    let exhausted = exhausted.is_some();
    warnings.sort();
    warnings.dedup();
    let mut out = LoreResult {
        source_count: ranked.len(),
        warnings,
        duplicates,
        truncated: exhausted,
        truncated_by: exhausted.then_some(Truncation::WorkBudget),
        ..LoreResult::default()
    };
    let mut used = 0;
    for i in ranked {
        let c = &cands[i];
        let tokens = DefaultTokenEstimator.estimate(&c.content);
        if out.hits.len() >= opts.limit {
            out.truncated = true;
            out.truncated_by = Some(Truncation::Limit);
            break;
        }
        if used + tokens > opts.max_tokens {
            out.truncated = true;
            out.truncated_by = Some(Truncation::MaxTokens);
            break;
        }
        used += tokens;
        out.hits.push(LoreHit {
            book: c.book,
            source: c.source,
            entry: c.entry,
            content: c.content.clone().into_owned(),
            reason: reasons[i].clone().unwrap_or(Reason::Lexical),
            score: scores[i],
            tokens,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(key, regex pattern and flags)`, following SillyTavern's `parseRegexFromString`.
    #[test]
    fn regex_keys_are_slash_delimited_without_inner_slashes() {
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            ("/dragon/", Some(("dragon", ""))),
            ("/dragon/gi", Some(("dragon", "gi"))),
            ("/a\\/b/", Some(("a\\/b", ""))),
            ("/a/b/", None),
            ("/a/x", None),
            ("//", None),
            ("/", None),
            ("dragon", None),
            ("/ab/ig/", None),
            ("/ab/d", None),
        ];
        for (key, want) in cases {
            assert_eq!(split_regex(key), *want, "{key:?}");
        }
    }

    /// `(text, substituted)` with character `Seraphina` and user `白羽`.
    #[test]
    fn name_macros_are_substituted_in_any_case() {
        let ctx = LoreContext {
            character: "Seraphina".into(),
            user: "白羽".into(),
            ..LoreContext::default()
        };
        let cases: &[(&str, &str)] = &[
            ("{{char}}", "Seraphina"),
            ("{{CHAR}}'s glade", "Seraphina's glade"),
            ("{{user}} and {{char}}", "白羽 and Seraphina"),
            ("<USER>, <BOT>, <char>", "白羽, Seraphina, Seraphina"),
            ("{{charx}} {{", "{{charx}} {{"),
            ("森林{{user}}", "森林白羽"),
        ];
        for (text, want) in cases {
            assert_eq!(substitute(text, &ctx), *want, "{text:?}");
        }
    }

    /// A book is indexed once and the index is kept with it: every search of that book (and
    /// every clone of it) uses the same index; a changed book is a new book, indexed anew.
    #[test]
    fn a_book_is_indexed_once_and_a_changed_book_anew() {
        let book = |tag: &str| {
            WorldBook::from_world_value(
                "Gates",
                &serde_json::json!({"entries": {
                    "0": {"uid": 0, "key": ["gate"], "content": format!("{tag} the silver gate of the north")},
                    "1": {"uid": 1, "key": ["lantern"], "content": format!("{tag} the keeper's blue lantern")},
                }}),
            )
            .unwrap()
        };
        let first = Arc::new(book("unique"));
        let books = [(LoreSource::Global, first.clone())];
        let hits = |books: &[(LoreSource, Arc<WorldBook>)]| {
            search(
                books,
                "where is the blue lantern kept",
                &LoreOptions::default(),
            )
            .hits
            .iter()
            .map(|h| h.entry.uid)
            .collect::<Vec<_>>()
        };
        assert_eq!(hits(&books), [1]);
        let index = first.lexical_index();
        assert_eq!(hits(&books), [1]);
        assert!(Arc::ptr_eq(&index, &first.lexical_index()), "built once");
        let changed = Arc::new(book("changed"));
        assert!(!Arc::ptr_eq(&index, &changed.lexical_index()));
        assert_eq!(
            changed
                .lexical_index()
                .score(&query_tokens("changed"))
                .len(),
            2,
            "the new entries are what is indexed"
        );
    }

    /// Macros are not words of an entry: `{{user}}` does not make an entry a lexical match for
    /// "user", nor `<BOT>` for "bot".
    #[test]
    fn macros_are_left_out_of_the_lexical_index() {
        let book = WorldBook::from_world_value(
            "Gates",
            &serde_json::json!({"entries": {
                "0": {"uid": 0, "key": ["gate"], "content": "{{user}} waits by the gate with <BOT>."},
                "1": {"uid": 1, "key": ["lantern"], "content": "The user manual of the lantern."},
            }}),
        )
        .unwrap();
        let index = book.lexical_index();
        let docs = |q: &str| {
            let mut d: Vec<u32> = index
                .score(&query_tokens(q))
                .into_iter()
                .map(|h| h.0)
                .collect();
            d.sort_unstable();
            d
        };
        assert_eq!(docs("user"), [1]);
        assert!(docs("bot").is_empty());
        assert_eq!(docs("waits"), [0]);
    }
}
