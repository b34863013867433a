//! `tavern_history_search` over an incremental index: each chat is indexed once, extended with
//! the lines appended since (read through [`ChatStore::read_chat_since`], so only the new tail
//! is read), and rebuilt only when the file was rewritten. Indexes live in a [`HistoryCache`]
//! bounded by a number of chats (least recently used go first); a query on a 10,000-message chat
//! costs about what it costs on a 100-message one.
//!
//! **Ranking.** BM25 ([`tavern_search`]: stop words, Snowball stems, CJK bigrams) where a
//! message's document is the speaker's name, the message text and the day it was sent (so "What
//! did Mira say in May 2023?" finds it), plus the texts of the previous and next message at a
//! lower weight (a question is often answered by the reply to it), a long neighbour's words
//! sharing a bounded weight. Ties go to the newer message.
//!
//! **Consistency.** An index is used only at the revision it was built or extended to: every
//! query asks the store for the chat's current revision first (cheap) and brings the index up to
//! date when it differs. Appends by another process are therefore seen by the next query;
//! a rewrite (an edited or deleted message) rebuilds the index.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{json, Value};
use tavern_core::calendar::{day_words as day_words_of, MONTHS};
use tavern_core::chat::{ChatLine, SendDate};
use tavern_core::{
    CharacterName, ChatId, DefaultTokenEstimator, Timestamp, TokenEstimator, UtcOffsets,
};
use tavern_search::rank::Candidate as RankCandidate;
use tavern_search::when::TIME_BOOST;
use tavern_search::{query_tokens, time_window_in, Bm25Index, RankerRef};
use tavern_store::{ChatChange, ChatFile, ChatStore, StoreError};

use schemars::JsonSchema;
use serde::Serialize;

use crate::context::ToolContext;
use crate::error::ToolError;
use crate::registry::ToolServices;
use crate::tools::{any_value, rounded, Listing, TruncatedBy};

/// Chats whose index a [`HistoryCache`] keeps by default.
pub const DEFAULT_CACHED_CHATS: usize = 8;

/// Weight of a neighbouring message's text in a message's document, per word, for a
/// neighbour of up to [`NEIGHBOUR_WORDS`] words; the words of a longer one share that many
/// words' weight ([`neighbour_weight`]).
const NEIGHBOUR_WEIGHT: f32 = 0.6;

/// The longest neighbour whose words each weigh [`NEIGHBOUR_WEIGHT`]. A long reply next to a
/// short message (an assistant's answer of several paragraphs) would otherwise outweigh the
/// message's own words and lift every message around a talkative turn; capped, it still adds
/// its topic. Measured on LoCoMo and LongMemEval together (`docs/PERFORMANCE.md`).
const NEIGHBOUR_WORDS: f32 = 30.0;

/// The field weight of a neighbour `words` long (see [`NEIGHBOUR_WORDS`]), in steps of
/// 1/1024: a term's frequency then sums exactly in `f32` (below 16,384) in whatever order its
/// fields are added, so a message whose next neighbour arrives in a later append scores bit for
/// bit as if indexed with it. The smallest step bounds the shared weight from below: past
/// about 18,000 words a neighbour weighs 1/1024 per word.
fn neighbour_weight(words: u32) -> f32 {
    let weight = NEIGHBOUR_WEIGHT * (NEIGHBOUR_WORDS / words.max(1) as f32).min(1.0);
    ((weight * 1024.0).round() / 1024.0).max(1.0 / 1024.0)
}

/// Matches a query that points at a time considers for [`TIME_BOOST`]: the best this many
/// by their words (or the limit, if more).
pub const TIME_POOL: usize = 100;

/// When a history search is asked, for queries that point at a time
/// ([`tavern_search::time_window`]).
#[derive(Debug, Clone, Copy)]
pub struct SearchTime<'a> {
    /// Now.
    pub now: Timestamp,
    /// The zone a message's text `send_date` is read in.
    pub zone: &'a dyn UtcOffsets,
}

/// Tokens counted per returned message on top of its text.
const ITEM_OVERHEAD_TOKENS: usize = 8;

/// What one message contributes to results, in one allocation: a long chat's hits lie far
/// apart in memory, and every separate string of a hit is one more cache miss to copy it
/// (on 10,000 messages, measured at about a fifth of the query).
#[derive(Debug, Clone, PartialEq)]
struct Message {
    /// The text, then the send date when it is text, then the speaker's name.
    body: Box<str>,
    /// Where the text ends in `body`.
    text_end: usize,
    /// Where the date ends in `body` (the name follows).
    date_end: usize,
    date: Date,
    /// The text's length in words (and CJK characters), for its weight as a neighbour.
    words: u32,
    is_user: bool,
    is_system: bool,
}

/// How a message's send date was written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Date {
    None,
    Millis(i64),
    /// Text, in the message's body.
    Text,
}

impl Message {
    fn of(line: &ChatLine) -> Self {
        let (text, name) = (line.text(), line.name().unwrap_or(""));
        let (date, date_text) = match line.send_date() {
            Some(SendDate::Millis(ms)) => (Date::Millis(ms), None),
            Some(SendDate::Text(t)) => (Date::Text, Some(t)),
            None => (Date::None, None),
        };
        let date_text = date_text.unwrap_or_default();
        let body = [text, date_text.as_str(), name].concat();
        Self {
            body: body.into_boxed_str(),
            text_end: text.len(),
            date_end: text.len() + date_text.len(),
            date,
            words: u32::try_from(tavern_search::word_len(text)).unwrap_or(u32::MAX),
            is_user: line.is_user(),
            is_system: line.is_system(),
        }
    }

    fn text(&self) -> &str {
        self.body.get(..self.text_end).unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.body.get(self.date_end..).unwrap_or_default()
    }

    /// The send date's text, when it was written as text.
    fn date_text(&self) -> &str {
        self.body
            .get(self.text_end..self.date_end)
            .unwrap_or_default()
    }

    /// The send date as the chat file had it: epoch milliseconds, text, or null.
    fn send_date(&self) -> Value {
        match self.date {
            Date::None => Value::Null,
            Date::Millis(ms) => json!(ms),
            Date::Text => json!(self.date_text()),
        }
    }

    /// When the message was sent, if its date can be read.
    fn millis(&self, zone: &dyn UtcOffsets) -> Option<i64> {
        match self.date {
            Date::None => None,
            Date::Millis(ms) => Some(ms),
            Date::Text => SendDate::Text(self.date_text().to_owned()).millis(zone),
        }
    }

    /// The day the message was sent, as words (`May 8 2023`), if its date can be read.
    fn day_words(&self) -> String {
        let date = match self.date {
            Date::None => None,
            Date::Millis(ms) => Some(SendDate::Millis(ms)),
            Date::Text => Some(SendDate::Text(self.date_text().to_owned())),
        };
        date.as_ref().and_then(day_words).unwrap_or_default()
    }
}

/// The day of a send date as words: `May 8 2023`. Epoch milliseconds are read as UTC; text is
/// SillyTavern's `May 8, 2023 1:56pm` or ISO `2023-05-08T13:56:00Z`; anything else is `None`.
fn day_words(date: &SendDate) -> Option<String> {
    let (year, month, day) = match date {
        SendDate::Millis(ms) => return Some(day_words_of(*ms)),
        SendDate::Text(text) => {
            let text = text.trim();
            if let Some((y, rest)) = text.split_once('-') {
                let mut parts = rest.splitn(2, '-');
                let month: u32 = parts.next()?.parse().ok()?;
                let day: u32 = parts
                    .next()?
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .ok()?;
                (y.parse().ok()?, month, day)
            } else {
                let mut words = text.split([' ', ',']).filter(|w| !w.is_empty());
                let month_word = words.next()?;
                let month = MONTHS
                    .iter()
                    .position(|m| m.eq_ignore_ascii_case(month_word))?;
                let day: u32 = words.next()?.parse().ok()?;
                let year: i64 = words.next()?.parse().ok()?;
                (year, u32::try_from(month + 1).ok()?, day)
            }
        }
    };
    let name = MONTHS.get(usize::try_from(month).ok()?.checked_sub(1)?)?;
    (1..=31)
        .contains(&day)
        .then(|| format!("{name} {day} {year}"))
}

/// A chat's messages and their BM25 index. Appending messages one by one and building from all
/// of them at once give the same index (the proptest in this module checks it).
#[derive(Debug, Clone)]
pub struct HistoryIndex {
    messages: Vec<Message>,
    index: Bm25Index,
}

impl Default for HistoryIndex {
    fn default() -> Self {
        Self {
            messages: Vec::new(),
            // Messages are indexed in order, so common words keep block maps: a question
            // naming a speaker reads that speaker's postings only for the messages a rarer
            // word found (see `Bm25Index::top`).
            index: Bm25Index::for_top(),
        }
    }
}

/// One ranked message.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryHit {
    /// Position among the chat's messages (0 = first message after the header).
    pub index: usize,
    /// BM25 score (0 for an empty query).
    pub score: f32,
}

impl HistoryIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of messages.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether there are no messages.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Indexes message `i` from its own fields and its neighbours' texts.
    fn index_message(&mut self, i: usize) {
        let m = &self.messages[i];
        let day = m.day_words();
        let mut fields: Vec<(&str, f32)> = vec![(m.name(), 1.0), (m.text(), 1.0), (&day, 1.0)];
        if let Some(prev) = i.checked_sub(1).and_then(|p| self.messages.get(p)) {
            fields.push((prev.text(), neighbour_weight(prev.words)));
        }
        if let Some(next) = self.messages.get(i + 1) {
            fields.push((next.text(), neighbour_weight(next.words)));
        }
        let doc = u32::try_from(i).unwrap_or(u32::MAX);
        self.index.insert_fields(doc, 0, &fields);
    }

    /// When the user last wrote before the chat's newest message — what SillyTavern's
    /// `{{idle_duration}}` counts from: skipping system messages, the newest user message
    /// older than the newest message. `None` (SillyTavern says "just now") when there is
    /// none or its date cannot be read.
    pub fn previous_user_message(&self, zone: &dyn tavern_core::UtcOffsets) -> Option<Timestamp> {
        let mut past_newest = false;
        for m in self.messages.iter().rev() {
            if m.is_system {
                continue;
            }
            if m.is_user && past_newest {
                let date = match m.date {
                    Date::None => return None,
                    Date::Millis(ms) => SendDate::Millis(ms),
                    Date::Text => SendDate::Text(m.date_text().to_owned()),
                };
                return date.millis(zone).map(Timestamp);
            }
            past_newest = true;
        }
        None
    }

    /// Appends messages (chat lines other than the header), re-indexing the message before
    /// them (its next neighbour changed).
    pub fn extend<'a>(&mut self, lines: impl IntoIterator<Item = &'a ChatLine>) {
        let start = self.messages.len();
        self.messages.extend(lines.into_iter().map(Message::of));
        if self.messages.len() == start {
            return;
        }
        self.index.reserve(self.messages.len() - start);
        // The message before gains its next neighbour: added where its postings stand (it was
        // indexed last), so no posting goes stale and queries keep the fast path.
        if let Some(before) = start.checked_sub(1) {
            let doc = u32::try_from(before).unwrap_or(u32::MAX);
            let next = &self.messages[start];
            if !self
                .index
                .add_fields_to_last(doc, &[(next.text(), neighbour_weight(next.words))])
            {
                self.index_message(before);
            }
        }
        for i in start..self.messages.len() {
            self.index_message(i);
        }
    }

    /// Messages matching `query`, best first (ties: newer first), at most `limit`, and how many
    /// matched in all. An empty query lists the newest messages.
    pub fn search(&self, query: &str, limit: usize) -> (Vec<HistoryHit>, usize) {
        self.search_from(query, limit, 0, &RankerRef::default(), None)
    }

    /// [`HistoryIndex::search`] among the messages from position `from` on (a parent chat's
    /// messages after those a branch copied), the best [`tavern_search::Ranker::pool`] lexical
    /// matches ranked through `ranker`. With `at`, a query that points at a time ("five days
    /// ago", "上个月") lifts the messages sent then among its best [`TIME_POOL`] matches by
    /// [`TIME_BOOST`].
    pub fn search_from(
        &self,
        query: &str,
        limit: usize,
        from: usize,
        ranker: &RankerRef,
        at: Option<SearchTime<'_>>,
    ) -> (Vec<HistoryHit>, usize) {
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0));
        let len = self.messages.len();
        let (mut found, total): (Vec<(u32, f32)>, usize) = if query.trim().is_empty() {
            let newest = len.saturating_sub(limit).max(from);
            let found = (newest..len)
                .map(|i| (u32::try_from(i).unwrap_or(u32::MAX), 0.0))
                .collect();
            (found, len.saturating_sub(from))
        } else {
            let rescores = ranker.get().rescores();
            let window = at.and_then(|t| {
                let offset = t.zone.minutes_at(t.now);
                Some((time_window_in(query, t.now.0, offset)?, t.zone))
            });
            let wanted = if window.is_some() {
                ranker.pool(limit).max(TIME_POOL)
            } else {
                ranker.pool(limit)
            };
            let (found, total) = if from == 0 {
                // Only the best `wanted` are kept while scoring, not every match.
                self.index.top(&query_tokens(query), wanted)
            } else {
                let from = u32::try_from(from).unwrap_or(u32::MAX);
                self.index.top_from(&query_tokens(query), wanted, from)
            };
            let (mut found, total) = if rescores {
                let mut pool: Vec<RankCandidate<'_>> = found
                    .into_iter()
                    .filter_map(|(doc, score)| {
                        Some(RankCandidate {
                            doc,
                            text: self.messages.get(doc as usize)?.text(),
                            score,
                        })
                    })
                    .collect();
                pool.sort_by(|a, b| b.score.total_cmp(&a.score).then(b.doc.cmp(&a.doc)));
                ranker.apply(query, &mut pool);
                (pool.into_iter().map(|c| (c.doc, c.score)).collect(), total)
            } else {
                (found, total)
            };
            if let Some((window, zone)) = window {
                for (doc, score) in &mut found {
                    let sent = self
                        .messages
                        .get(*doc as usize)
                        .and_then(|m| m.millis(zone));
                    if sent.is_some_and(|ms| window.contains(ms)) {
                        *score *= TIME_BOOST;
                    }
                }
                // The best `limit` by the lifted scores; ties keep the order they came in.
                found.sort_by(|a, b| b.1.total_cmp(&a.1));
            }
            // The ranker's (or the index's) best `limit`, ties in the order it gave them.
            found.truncate(limit);
            (found, total)
        };
        found.sort_by(order);
        let hits = found
            .into_iter()
            .map(|(doc, score)| HistoryHit {
                index: doc as usize,
                score,
            })
            .collect();
        (hits, total)
    }
}

/// A stable 64-bit digest of a line's text (to tell whether the lines already indexed are
/// still the chat's first lines when a store can only hand back the whole chat).
fn line_digest(line: &ChatLine) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    line.raw().hash(&mut h);
    h.finish()
}

/// The index of one chat at one revision.
#[derive(Debug, Clone)]
struct ChatEntry {
    revision: tavern_store::ChatRevision,
    /// Digest of every line indexed, header included, in file order.
    lines: Vec<u64>,
    header: bool,
    parent: Option<ChatId>,
    history: HistoryIndex,
}

impl ChatEntry {
    fn build(file: ChatFile) -> Self {
        let mut entry = Self {
            revision: file.revision,
            lines: Vec::new(),
            header: false,
            parent: None,
            history: HistoryIndex::new(),
        };
        entry.append(&file.lines);
        entry
    }

    /// The digests of the chat's messages (its lines after the header), in order.
    fn message_digests(&self) -> &[u64] {
        self.lines
            .get(usize::from(self.header)..)
            .unwrap_or_default()
    }

    fn append(&mut self, lines: &[ChatLine]) {
        let mut messages = lines;
        if self.lines.is_empty() {
            if let Some(first) = lines.first().filter(|l| l.is_header()) {
                self.header = true;
                self.parent = first.main_chat().and_then(|p| ChatId::parse(p).ok());
                messages = &lines[1..];
            }
        }
        self.lines.extend(lines.iter().map(line_digest));
        self.history.extend(messages);
    }

    /// Brings the entry to what `change` says the chat is now.
    fn apply(self, change: ChatChange) -> Self {
        match change {
            ChatChange::Unchanged => self,
            ChatChange::Appended { lines, revision } => {
                let mut entry = self;
                entry.append(&lines);
                entry.revision = revision;
                entry
            }
            ChatChange::Whole(file) => {
                let n = self.lines.len();
                let prefix_kept = file.lines.len() >= n
                    && file.lines[..n]
                        .iter()
                        .zip(&self.lines)
                        .all(|(l, d)| line_digest(l) == *d);
                if prefix_kept {
                    let mut entry = self;
                    entry.append(&file.lines[n..]);
                    entry.revision = file.revision;
                    entry
                } else {
                    Self::build(file)
                }
            }
        }
    }
}

/// The largest chat (in bytes of its file) a tool reads — history searches it, `tavern_scene_get`
/// describes it: 64 MiB (the largest real chat seen is about 20 MB). A larger one is refused
/// with the limit named, known from its revision before anything is read, rather than read and
/// indexed whole on a call (a 200 MB chat took 13.6 s and 1.45 GB).
pub const MAX_CHAT_BYTES: u64 = 64 * 1024 * 1024;

/// Cached history indexes, one per `(character, chat)`, at most a fixed number of chats (the
/// least recently used is dropped first). Cheap to clone: clones share the cache.
#[derive(Debug, Clone)]
pub struct HistoryCache {
    inner: Arc<Mutex<CacheInner>>,
}

#[derive(Debug)]
struct CacheInner {
    capacity: usize,
    clock: u64,
    /// Each chat's entry and when it was last used. Shared: a search runs on its own handle
    /// after the lock is let go, so one long search never holds up another chat's.
    entries: HashMap<(CharacterName, ChatId), (Arc<ChatEntry>, u64)>,
}

impl Default for HistoryCache {
    fn default() -> Self {
        Self::new(DEFAULT_CACHED_CHATS)
    }
}

impl HistoryCache {
    /// A cache keeping at most `capacity` chats' indexes (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(CacheInner {
                capacity: capacity.max(1),
                clock: 0,
                entries: HashMap::new(),
            })),
        }
    }

    /// How many chats are indexed now.
    pub fn cached_chats(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the chat's index brought up to the chat's current revision; `None` when the
    /// chat does not exist.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn with_index<R>(
        &self,
        chats: &dyn ChatStore,
        character: &CharacterName,
        chat: &ChatId,
        f: impl FnOnce(&HistoryIndex, Option<&ChatId>) -> R,
    ) -> Result<Option<R>, StoreError> {
        self.with_entry(chats, character, chat, |e| f(&e.history, e.parent.as_ref()))
            .await
    }

    /// [`HistoryCache::with_index`], with the whole cached entry.
    async fn with_entry<R>(
        &self,
        chats: &dyn ChatStore,
        character: &CharacterName,
        chat: &ChatId,
        f: impl FnOnce(&ChatEntry) -> R,
    ) -> Result<Option<R>, StoreError> {
        let key = (character.clone(), chat.clone());
        let Some(revision) = chats.chat_revision(character, chat).await? else {
            self.lock().entries.remove(&key);
            return Ok(None);
        };
        // The entry is taken out while it is brought up to date (no lock is held across the
        // store's IO); a concurrent query meanwhile builds its own. A current entry is shared
        // and searched outside the lock.
        let taken = {
            let mut inner = self.lock();
            inner.clock += 1;
            let now = inner.clock;
            match inner.entries.get_mut(&key) {
                Some((e, used)) if e.revision == revision => {
                    *used = now;
                    Some(Ok(e.clone()))
                }
                Some(_) => inner.entries.remove(&key).map(|(e, _)| Err(e)),
                None => None,
            }
        };
        let taken = match taken {
            Some(Ok(current)) => return Ok(Some(f(&current))),
            Some(Err(stale)) => Some(stale),
            None => None,
        };
        // The revision says how large the chat is: too large, and it is not read at all.
        if let Some(bytes) = revision.content().map(|c| c.bytes) {
            if bytes > MAX_CHAT_BYTES {
                self.lock().entries.remove(&key);
                return Err(StoreError::LimitExceeded {
                    limit: "chat bytes for a history search",
                    max: usize::try_from(MAX_CHAT_BYTES).unwrap_or(usize::MAX),
                    actual: usize::try_from(bytes).unwrap_or(usize::MAX),
                });
            }
        }
        let entry = match taken {
            Some(entry) => match chats
                .read_chat_since(character, chat, &entry.revision)
                .await?
            {
                // Still searched by another query: that one keeps its copy.
                Some(change) => Arc::unwrap_or_clone(entry).apply(change),
                None => return Ok(None),
            },
            None => match chats.read_chat(character, chat).await? {
                Some(file) => ChatEntry::build(file),
                None => return Ok(None),
            },
        };
        let entry = Arc::new(entry);
        {
            let mut inner = self.lock();
            inner.clock += 1;
            let now = inner.clock;
            inner.entries.insert(key, (entry.clone(), now));
            while inner.entries.len() > inner.capacity {
                let oldest = inner
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => inner.entries.remove(&k),
                    None => break,
                };
            }
        }
        Ok(Some(f(&entry)))
    }
}

/// The arguments of `tavern_history_search`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryArgs {
    /// Words to look for; empty lists the newest messages.
    pub query: String,
    /// Most messages to return.
    pub limit: usize,
    /// Token budget for the returned texts.
    pub max_tokens: usize,
    /// Also search the chat this one was branched from (its messages after those this chat
    /// copied).
    pub include_parent: bool,
}

/// Ranked messages of one chat, copied out of its index.
struct ChatHits {
    label: WhichChat,
    messages: usize,
    total: usize,
    hits: Vec<(HistoryHit, Message)>,
}

/// A chat's parent to search too (with `includeParent`), and the digests of the chat's own
/// messages: those its parent shares with it are its copies, searched once, in the branch.
type ParentToSearch = (ChatId, Vec<u64>);

/// Searches `chat`; when it is a branch whose parent is to be searched (`branch` holds the
/// digests of the branch's messages), only the parent's messages after those the branch
/// copied. Also returns the chat's parent to search, when `args` asks for it and there is one
/// (never the chat itself).
async fn chat_hits(
    svc: &ToolServices,
    character: &CharacterName,
    chat: &ChatId,
    label: WhichChat,
    args: &HistoryArgs,
    branch: Option<&[u64]>,
    now: Timestamp,
) -> Result<Option<(ChatHits, Option<ParentToSearch>)>, ToolError> {
    let ranker = if !svc.ranker.prepares() {
        svc.ranker.clone()
    } else if args.query.trim().is_empty() {
        // The newest messages, by time: no ranker reads them.
        RankerRef::default()
    } else {
        prepare_ranker(svc, character, chat, args, branch, now).await?
    };
    let found = svc
        .history
        .with_entry(svc.chats.as_ref(), character, chat, |entry| {
            let index = &entry.history;
            let (hits, total) = search_entry(svc, entry, args, branch, now, &ranker);
            let hits = hits
                .into_iter()
                .map(|h| {
                    let m = index.messages[h.index].clone();
                    (h, m)
                })
                .collect();
            let hits = ChatHits {
                label,
                messages: index.len(),
                total,
                hits,
            };
            let parent = match &entry.parent {
                Some(parent) if args.include_parent && parent != chat => {
                    Some((parent.clone(), entry.message_digests().to_vec()))
                }
                _ => None,
            };
            (hits, parent)
        })
        .await?;
    Ok(found)
}

/// For a ranker that prepares (a sentence encoder): a lexical first pass over the chat finds
/// the messages the ranker will be handed, and the ranker prepares them on the blocking pool,
/// off the async executor (see [`tavern_store::prepared_ranker`]); returns the prepared
/// ranker the search then ranks with, which never encodes (a message added in between
/// counts as not close).
async fn prepare_ranker(
    svc: &ToolServices,
    character: &CharacterName,
    chat: &ChatId,
    args: &HistoryArgs,
    branch: Option<&[u64]>,
    now: Timestamp,
) -> Result<RankerRef, ToolError> {
    let gatherer = Arc::new(tavern_search::Gatherer::new(svc.ranker.clone()));
    let first_pass = RankerRef(gatherer.clone());
    svc.history
        .with_entry(svc.chats.as_ref(), character, chat, |entry| {
            search_entry(svc, entry, args, branch, now, &first_pass);
        })
        .await?;
    Ok(tavern_store::prepared_ranker(&svc.ranker, &args.query, gatherer.take_texts()).await)
}

/// Searches one chat's cached entry with `ranker`: when it is a branch's parent (`branch`
/// holds the branch's message digests), only the messages after those the branch copied.
fn search_entry(
    svc: &ToolServices,
    entry: &ChatEntry,
    args: &HistoryArgs,
    branch: Option<&[u64]>,
    now: Timestamp,
    ranker: &RankerRef,
) -> (Vec<HistoryHit>, usize) {
    let copied = branch.map_or(0, |mine| {
        let theirs = entry.message_digests();
        mine.iter().zip(theirs).take_while(|(a, b)| a == b).count()
    });
    let at = SearchTime {
        now,
        zone: svc.zone.as_ref(),
    };
    entry
        .history
        .search_from(&args.query, args.limit, copied, ranker, Some(at))
}

/// The start of `text` that fits `max_tokens` with the marker saying how much is shown.
fn cut(text: &str, max_tokens: usize) -> String {
    let total = text.chars().count();
    // The marker's own cost, at its longest.
    let marker = |shown: usize| format!(" […cut: {shown} of {total} characters shown]");
    let room = max_tokens.saturating_sub(DefaultTokenEstimator.estimate(&marker(total)));
    let (start, _) = crate::tools::fit(text, room);
    let shown = start.chars().count();
    format!("{start}{}", marker(shown))
}

/// Runs `tavern_history_search` for the calling session's chat.
///
/// # Errors
/// Store failures.
pub(crate) async fn search(
    svc: &ToolServices,
    ctx: &ToolContext,
    args: &HistoryArgs,
) -> Result<Listing<HistoryItem, ChatSources>, ToolError> {
    let target = ctx.binding().target();
    let mut chats: Vec<ChatHits> = Vec::new();
    if let Some((current, parent)) = chat_hits(
        svc,
        &target.character,
        &target.chat_id,
        WhichChat::Current,
        args,
        None,
        ctx.now(),
    )
    .await?
    {
        chats.push(current);
        if let Some((pid, mine)) = parent {
            let parent = chat_hits(
                svc,
                &target.character,
                &pid,
                WhichChat::Parent,
                args,
                Some(&mine),
                ctx.now(),
            )
            .await?;
            if let Some((p, _)) = parent {
                chats.push(p);
            }
        }
    }
    // Best first; ties (and an empty query) newest first, current chat before parent.
    let mut found: Vec<(usize, &HistoryHit, &Message)> = chats
        .iter()
        .enumerate()
        .flat_map(|(c, ch)| ch.hits.iter().map(move |(h, m)| (c, h, m)))
        .collect();
    found.sort_by(|x, y| {
        y.1.score
            .total_cmp(&x.1.score)
            .then(x.0.cmp(&y.0))
            .then(y.1.index.cmp(&x.1.index))
    });
    let total: usize = chats.iter().map(|c| c.total).sum();
    let mut items = Vec::new();
    let (mut used, mut truncated_by) = (0usize, None);
    for (c, hit, m) in found {
        if items.len() == args.limit {
            break;
        }
        let tokens = DefaultTokenEstimator.estimate(m.text()) + ITEM_OVERHEAD_TOKENS;
        let text = if used + tokens <= args.max_tokens {
            used += tokens;
            m.text().to_owned()
        } else if items.is_empty() {
            // The first message alone is over the budget: its start, marked as cut, rather
            // than nothing while the chat has messages.
            truncated_by = Some(TruncatedBy::MaxTokens);
            cut(
                m.text(),
                args.max_tokens.saturating_sub(ITEM_OVERHEAD_TOKENS),
            )
        } else {
            truncated_by = Some(TruncatedBy::MaxTokens);
            break;
        };
        items.push(HistoryItem {
            chat: chats[c].label,
            index: hit.index,
            name: m.name().to_owned(),
            is_user: m.is_user,
            send_date: m.send_date(),
            text,
            score: rounded(f64::from(hit.score)),
        });
        if truncated_by.is_some() {
            break;
        }
    }
    if truncated_by.is_none() && items.len() < total {
        truncated_by = Some(TruncatedBy::Limit);
    }
    Ok(Listing {
        items,
        source_count: total,
        truncated: truncated_by.is_some(),
        truncated_by,
        source: ChatSources {
            kind: "chat",
            chats: chats
                .iter()
                .map(|c| ChatSize {
                    chat: c.label,
                    messages: c.messages,
                })
                .collect(),
        },
    })
}

/// Which chat a message is from.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum WhichChat {
    Current,
    Parent,
}

/// One message found.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HistoryItem {
    chat: WhichChat,
    /// Position among the chat's messages, from 0.
    index: usize,
    name: String,
    is_user: bool,
    /// Epoch milliseconds (older chats) or SillyTavern's text date.
    #[schemars(schema_with = "any_value")]
    send_date: Value,
    text: String,
    score: f64,
}

/// The chats searched.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct ChatSources {
    /// Always `chat`.
    kind: &'static str,
    chats: Vec<ChatSize>,
}

/// A chat searched.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct ChatSize {
    chat: WhichChat,
    messages: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str, text: &str, date: &str) -> ChatLine {
        ChatLine::parse(
            &json!({"name": name, "is_user": name == "Kai", "send_date": date, "mes": text})
                .to_string(),
        )
        .unwrap()
    }

    /// A message packed into one allocation gives back its name, text, send date (text,
    /// milliseconds or none, exactly as the line had it) and who sent it.
    #[test]
    fn a_packed_message_gives_back_its_fields() {
        let cases = [
            json!({"name": "Seraphina", "is_user": false, "send_date": "May 8, 2023 1:56pm", "mes": "The gate."}),
            json!({"name": "白羽", "is_user": true, "send_date": 1_683_554_160_000_i64, "mes": "银色大门在北方。"}),
            json!({"name": "Kai", "is_user": true, "mes": ""}),
            json!({"name": "七大姑", "is_user": false, "send_date": "2023年5月8日 下午", "mes": "银色大门。"}),
            json!({"is_user": false, "send_date": "", "mes": "no name"}),
        ];
        for case in cases {
            let line = ChatLine::parse(&case.to_string()).unwrap();
            let m = Message::of(&line);
            assert_eq!(m.text(), case["mes"].as_str().unwrap(), "{case}");
            assert_eq!(m.name(), case["name"].as_str().unwrap_or(""), "{case}");
            assert_eq!(m.send_date(), case["send_date"], "{case}");
            assert_eq!(m.is_user, case["is_user"].as_bool().unwrap(), "{case}");
        }
        let m = Message::of(&line("Kai", "hello", "May 8, 2023 1:56pm"));
        assert_eq!(m.day_words(), "May 8 2023");
    }

    /// `(send date, day words)`.
    #[test]
    fn send_dates_become_day_words() {
        let cases: &[(SendDate, Option<&str>)] = &[
            (
                SendDate::Text("May 8, 2023 1:56pm".into()),
                Some("May 8 2023"),
            ),
            (
                SendDate::Text("September 19, 2024 8:03pm".into()),
                Some("September 19 2024"),
            ),
            (
                SendDate::Text("2023-05-08T13:56:00.000Z".into()),
                Some("May 8 2023"),
            ),
            (SendDate::Millis(0), Some("January 1 1970")),
            (SendDate::Millis(1_683_554_160_000), Some("May 8 2023")),
            (SendDate::Millis(-86_400_000), Some("December 31 1969")),
            (SendDate::Text("yesterday".into()), None),
            (SendDate::Text("Smarch 3, 2020".into()), None),
            (SendDate::Text(String::new()), None),
        ];
        for (date, want) in cases {
            assert_eq!(day_words(date).as_deref(), *want, "{date:?}");
        }
    }

    #[test]
    fn speaker_names_dates_and_stems_find_messages() {
        let mut idx = HistoryIndex::new();
        let lines = [
            line("Kai", "I never learned to swim.", "May 8, 2023 1:56pm"),
            line("Mira", "The lantern is lit.", "May 8, 2023 1:57pm"),
            line("Kai", "Deep water scares me.", "June 2, 2023 9:00am"),
        ];
        idx.extend(&lines);
        let top = |q: &str| idx.search(q, 1).0.first().map(|h| h.index);
        assert_eq!(top("What did Mira say?"), Some(1));
        assert_eq!(top("lanterns"), Some(1));
        assert_eq!(top("What happened in June 2023?"), Some(2));
        assert_eq!(idx.search("the", 5).1, 0, "stop words alone match nothing");
        let (all, total) = idx.search("", 2);
        assert_eq!((all[0].index, all[1].index, total), (2, 1, 3));
    }

    /// A chat indexed as it grows, in appends of any sizes, ranks exactly as the same chat
    /// indexed at once (the message before each append gains its neighbour in place).
    mod growing_equals_whole {
        use super::*;
        use proptest::prelude::*;

        const WORDS: &[&str] = &["water", "deep", "tea", "gate", "Kai", "lantern", "blue"];

        proptest! {
            #[test]
            fn same_hits_and_scores(
                messages in prop::collection::vec(prop::collection::vec(0usize..7, 1..6), 1..40),
                cuts in prop::collection::vec(1usize..6, 0..20),
            ) {
                let lines: Vec<ChatLine> = messages
                    .iter()
                    .enumerate()
                    .map(|(i, words)| {
                        let text: Vec<&str> = words.iter().map(|w| WORDS[*w]).collect();
                        line(if i % 2 == 0 { "Kai" } else { "Mira" }, &text.join(" "), "x")
                    })
                    .collect();
                let mut whole = HistoryIndex::new();
                whole.extend(&lines);
                let mut growing = HistoryIndex::new();
                let mut at = 0;
                for cut in cuts.iter().chain(std::iter::repeat(&1)) {
                    if at >= lines.len() {
                        break;
                    }
                    let end = (at + cut).min(lines.len());
                    growing.extend(&lines[at..end]);
                    at = end;
                }
                for query in WORDS.iter().chain(&["deep water", "Mira tea", "blue gate Kai"]) {
                    let key = |(hits, total): (Vec<HistoryHit>, usize)| {
                        (hits.iter().map(|h| (h.index, h.score.to_bits())).collect::<Vec<_>>(), total)
                    };
                    prop_assert_eq!(key(growing.search(query, 50)), key(whole.search(query, 50)));
                }
            }
        }
    }

    #[test]
    fn neighbours_count_at_half_weight() {
        let mut idx = HistoryIndex::new();
        idx.extend(&[
            line("Kai", "What scares you most?", "x"),
            line("Mira", "Deep water.", "x"),
            line("Kai", "Me too.", "x"),
            line("Mira", "Tea?", "x"),
        ]);
        let (hits, _) = idx.search("water", 10);
        let order: Vec<usize> = hits.iter().map(|h| h.index).collect();
        assert_eq!(order, [1, 2, 0], "the message first, then its neighbours");
    }
}
