//! Deterministic lexical search: a tokenizer for case-folded Latin words (stop words dropped,
//! English words reduced to their Snowball stem) and CJK character bigrams, and an in-memory
//! BM25 inverted index with weighted fields and per-group statistics. No vector database, no
//! randomness: the same texts and query always give the same scores.
//!
//! Memories, chat history and lore free text all rank with this module, so a word is found the
//! same way everywhere: `fears` finds "Kai fears deep water" and "Kai's fear of water", `the`
//! and `的` find nothing by themselves ([`stopwords`]), `银色大门` finds a sentence containing it.

pub mod stopwords;
mod top;

use std::cell::RefCell;

use rust_stemmers::{Algorithm, Stemmer};
use rustc_hash::FxHashMap;

use tavern_core::tokens::is_cjk;

/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// BM25 length normalization.
const B: f32 = 0.5;

/// Memoized word → index token (`None` for a stop word) entries per thread before the memo is
/// cleared: words repeat (Zipf), so most lookups skip the stemmer; the bound keeps memory flat.
const STEM_MEMO_MAX: usize = 1 << 16;

/// Case-folded word → its index token, `None` for a stop word.
type StemMemo = FxHashMap<Box<str>, Option<Box<str>>>;

thread_local! {
    /// The English stemmer and the memo of its results (see [`STEM_MEMO_MAX`]).
    static STEMS: RefCell<(Stemmer, StemMemo)> =
        RefCell::new((Stemmer::create(Algorithm::English), FxHashMap::default()));
}

/// Calls `f` with the index token of a case-folded Latin word: its Snowball English stem
/// (words with non-ASCII letters are kept as they are), nothing for a stop word.
fn with_word_token(word: &str, f: impl FnOnce(&str)) {
    STEMS.with_borrow_mut(|(stemmer, memo)| {
        if let Some(token) = memo.get(word) {
            if let Some(token) = token {
                f(token);
            }
            return;
        }
        let token: Option<Box<str>> = if stopwords::is_stop_word(word) {
            None
        } else if word.is_ascii() {
            Some(stemmer.stem(word).into())
        } else {
            Some(word.into())
        };
        if memo.len() >= STEM_MEMO_MAX {
            memo.clear();
        }
        if let Some(token) = &token {
            f(token);
        }
        memo.insert(word.into(), token);
    });
}

/// The index token of one case-folded Latin word: its stem, or `None` for a stop word.
pub fn word_token(word: &str) -> Option<String> {
    let mut out = None;
    with_word_token(word, |t| out = Some(t.to_owned()));
    out
}

/// Splits text into index tokens: stems of the case-folded Latin words that are not stop
/// words, and for CJK runs every character bigram plus every single character (so
/// one-character queries still match).
pub fn index_tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_index_token(text, |t| out.push(t.to_owned()));
    out
}

/// [`index_tokens`] without allocating: `f` sees each token in a reused buffer.
fn for_each_index_token(text: &str, mut f: impl FnMut(&str)) {
    let mut buf = String::with_capacity(32);
    for_each_run(text, |run, cjk| {
        if cjk {
            for c in run {
                buf.clear();
                buf.push(*c);
                f(&buf);
            }
            for pair in run.windows(2) {
                buf.clear();
                buf.extend(pair);
                f(&buf);
            }
        } else {
            buf.clear();
            buf.extend(run);
            with_word_token(&buf, &mut f);
        }
    });
}

/// Splits a query into tokens: Latin words as in [`index_tokens`]; a CJK run of two or more
/// characters becomes its bigrams (so `银色大门` matches text containing it), a lone CJK
/// character itself; CJK function words (`的`, `什么`) are dropped like English stop words.
/// Duplicates are removed, first occurrence kept. A query of only stop words has no tokens.
pub fn query_tokens(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for_each_run(text, |run, cjk| {
        if cjk && run.len() >= 2 {
            for pair in run.windows(2) {
                let token: String = pair.iter().collect();
                if !stopwords::is_stop_word(&token) {
                    out.push(token);
                }
            }
        } else if cjk {
            let token: String = run.iter().collect();
            if !stopwords::is_stop_word(&token) {
                out.push(token);
            }
        } else {
            let word: String = run.iter().collect();
            with_word_token(&word, |t| out.push(t.to_owned()));
        }
    });
    let mut seen = std::collections::HashSet::new();
    out.retain(|t| seen.insert(t.clone()));
    out
}

/// The words of a text as the tokenizer sees them before stop words and stemming: case-folded
/// Latin words and CJK bigrams (a lone CJK character itself). For reference rankings that
/// bring their own normalization (benchmarks).
pub fn raw_tokens(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for_each_run(text, |run, cjk| {
        if cjk && run.len() >= 2 {
            out.extend(run.windows(2).map(|p| p.iter().collect::<String>()));
        } else {
            out.push(run.iter().collect());
        }
    });
    out
}

/// English month names, January first.
pub const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `(year, month 1..=12, day)` of days since 1970-01-01 (proleptic Gregorian).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// The UTC day of epoch milliseconds as words, `May 8 2023`: what texts are indexed with so a
/// query naming a month or a year finds what was said or written then.
pub fn day_words(ms: i64) -> String {
    let (year, month, day) = civil_from_days(ms.div_euclid(86_400_000));
    let name = MONTHS[(month as usize).saturating_sub(1) % 12];
    format!("{name} {day} {year}")
}

/// The length of a text for BM25: its words plus its CJK characters (each counts once), as
/// [`for_each_run`] would split it, without building the runs.
fn word_len(text: &str) -> usize {
    let mut n = 0;
    let mut in_word = false;
    for c in text.chars() {
        if is_cjk(c) && c.is_alphanumeric() {
            n += 1;
            in_word = false;
        } else if c.is_alphanumeric() {
            if !in_word {
                n += 1;
            }
            in_word = true;
        } else {
            in_word = false;
        }
    }
    n
}

/// Calls `f` with each maximal run of word characters, lowercased, and whether it is CJK.
fn for_each_run(text: &str, mut f: impl FnMut(&[char], bool)) {
    let mut run: Vec<char> = Vec::new();
    let mut run_cjk = false;
    for c in text.chars() {
        let cjk = is_cjk(c) && c.is_alphanumeric();
        let word = cjk || c.is_alphanumeric();
        if !run.is_empty() && (!word || cjk != run_cjk) {
            f(&run, run_cjk);
            run.clear();
        }
        if word {
            run_cjk = cjk;
            if c.is_ascii() {
                run.push(c.to_ascii_lowercase());
            } else if cjk {
                run.push(c);
            } else {
                run.extend(c.to_lowercase());
            }
        }
    }
    if !run.is_empty() {
        f(&run, run_cjk);
    }
}

/// Packs a token into a `u64` when it is short: one or two CJK characters (bit 63 set, 21 bits
/// each), or up to 7 bytes of other text (length in the top byte). `None` for longer tokens.
fn pack(token: &str) -> Option<u64> {
    let mut chars = token.chars();
    let first = chars.next()?;
    if is_cjk(first) {
        let second = chars.next().map_or(0, u64::from);
        if chars.next().is_none() {
            return Some(1 << 63 | u64::from(first) << 21 | second);
        }
    }
    let bytes = token.as_bytes();
    if bytes.len() > 7 {
        return None;
    }
    let mut key = (bytes.len() as u64) << 56;
    for (i, b) in bytes.iter().enumerate() {
        key |= u64::from(*b) << (8 * i);
    }
    Some(key)
}

/// Number of term shards; bulk indexing builds each on its own thread.
const SHARDS: usize = 2;

/// Which shard owns a token.
fn shard_of(token: &str, key: Option<u64>) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let h = match key {
        Some(k) => k ^ (k >> 29) ^ (k >> 47),
        None => {
            let mut hasher = rustc_hash::FxBuildHasher.build_hasher();
            hasher.write(token.as_bytes());
            hasher.finish() >> 7
        }
    };
    (h as usize) % SHARDS
}

/// A posting: document, term frequency (weighted: a token of a field with weight ½ counts ½),
/// and the document generation it belongs to.
type Posting = (u32, f32, u32);

/// One shard of the term dictionary with its postings.
#[derive(Debug, Default, Clone)]
struct Shard {
    /// Short tokens (CJK uni/bigrams, Latin words up to 7 bytes) packed into integers: most
    /// lookups hash a `u64` instead of comparing strings.
    packed_ids: FxHashMap<u64, u32>,
    term_ids: FxHashMap<Box<str>, u32>,
    postings: Vec<Vec<Posting>>,
    /// Per term, the largest term frequency any of its postings ever had (never lowered, so
    /// always an upper bound): what bounds a term's contribution when pruning.
    max_tf: Vec<f32>,
    /// Documents per block of the long lists' block maps; 0: no block maps are kept.
    map_block: usize,
    /// Block maps of the long lists ([`top::BlockMap`]), by term.
    maps: FxHashMap<u32, top::BlockMap>,
}

impl Shard {
    fn intern(&mut self, token: &str, key: Option<u64>) -> u32 {
        let next = u32::try_from(self.postings.len()).unwrap_or(u32::MAX);
        let id = match key {
            Some(key) => *self.packed_ids.entry(key).or_insert(next),
            None => match self.term_ids.get(token) {
                Some(id) => *id,
                None => {
                    self.term_ids.insert(token.into(), next);
                    next
                }
            },
        };
        if id == next {
            self.postings.push(Vec::new());
            self.max_tf.push(0.0);
        }
        id
    }

    /// Appends a posting to `term`'s list (and to its block map, keeping one while the list is
    /// long for how many documents there are).
    fn push(&mut self, term: u32, posting: Posting) {
        self.raise_max_tf(term, posting.1);
        let list = &mut self.postings[term as usize];
        list.push(posting);
        if self.map_block > 0 {
            top::BlockMap::follow(&mut self.maps, term, list, self.map_block);
        }
    }

    fn raise_max_tf(&mut self, term: u32, tf: f32) {
        if let Some(max) = self.max_tf.get_mut(term as usize) {
            *max = max.max(tf);
        }
    }

    fn lookup_term(&self, token: &str, key: Option<u64>) -> Option<QueryTerm<'_>> {
        let id = *match key {
            Some(key) => self.packed_ids.get(&key),
            None => self.term_ids.get(token),
        }?;
        Some(QueryTerm {
            list: &self.postings[id as usize],
            weight: 0.0,
            max_tf: self.max_tf[id as usize],
            map: self.maps.get(&id),
        })
    }

    /// The `(term id, weighted term frequency)` pairs of the tokens of `fields` this shard
    /// owns, interning new terms.
    fn terms_of(
        &mut self,
        me: usize,
        fields: &[(&str, f32)],
        ids: &mut Vec<(u32, f32)>,
        out: &mut Vec<(u32, f32)>,
    ) {
        ids.clear();
        for (text, weight) in fields {
            for_each_index_token(text, |token| {
                let key = pack(token);
                if shard_of(token, key) == me {
                    ids.push((self.intern(token, key), *weight));
                }
            });
        }
        ids.sort_unstable_by_key(|(id, _)| *id);
        for run in ids.chunk_by(|a, b| a.0 == b.0) {
            out.push((run[0].0, run.iter().map(|(_, w)| w).sum()));
        }
    }

    /// Adds the postings of `doc` for the tokens of `fields` this shard owns; `false` when a
    /// term frequency is not finite (weights so large their sum overflows).
    fn index(
        &mut self,
        me: usize,
        doc: u32,
        generation: u32,
        fields: &[(&str, f32)],
        ids: &mut Vec<(u32, f32)>,
    ) -> bool {
        let mut terms = Vec::new();
        self.terms_of(me, fields, ids, &mut terms);
        let mut finite = true;
        for (term, tf) in terms {
            finite &= tf.is_finite();
            self.push(term, (doc, tf, generation));
        }
        finite
    }

    /// Adds many documents: terms first, then every posting list grown once to its final size
    /// (hundreds of thousands of small lists growing step by step dominated opening a store).
    fn index_many(&mut self, me: usize, docs: &[(u32, &str)], generations: &[u32]) {
        let mut ids = Vec::with_capacity(64);
        let mut terms: Vec<(u32, f32)> = Vec::new();
        let mut bounds = Vec::with_capacity(docs.len() + 1);
        bounds.push(0);
        for (_, text) in docs {
            self.terms_of(me, &[(text, 1.0)], &mut ids, &mut terms);
            bounds.push(terms.len());
        }
        let mut extra = vec![0usize; self.postings.len()];
        for (term, _) in &terms {
            extra[*term as usize] += 1;
        }
        for (list, n) in self.postings.iter_mut().zip(extra) {
            list.reserve_exact(n);
        }
        for (k, ((doc, _), generation)) in docs.iter().zip(generations).enumerate() {
            for (term, tf) in &terms[bounds[k]..bounds[k + 1]] {
                self.push(*term, (*doc, *tf, *generation));
            }
        }
    }
}

/// BM25's length normalization for one query, `K1 · (1 − B + B · len / avg)` split into a
/// constant and a per-word factor, so scoring a posting takes one division.
struct LengthNorm {
    base: f32,
    per_word: f32,
}

impl LengthNorm {
    fn new(avg: f32) -> Self {
        Self {
            base: K1 * (1.0 - B),
            per_word: K1 * B / avg,
        }
    }
}

/// Document count and total length of one group of documents (a memory scope).
#[derive(Debug, Default, Clone, Copy)]
struct GroupStats {
    docs: u32,
    len: f64,
}

/// An inverted index over documents identified by `u32` slots the caller assigns, each in a
/// group (a memory scope; `0` when the caller has none). Terms are interned into two shards by
/// hash. Postings count only while their generation is the document's current one, so
/// re-indexing a slot never leaves old terms matching.
///
/// Scores are BM25 over the documents of the groups searched: document count, average length
/// and document frequencies are those of the searched groups, so a busy scope elsewhere does
/// not change how rare a word is here.
#[derive(Debug, Default, Clone)]
pub struct Bm25Index {
    shards: [Shard; SHARDS],
    generation: Vec<u32>,
    doc_len: Vec<f32>,
    group: Vec<u32>,
    alive: Vec<bool>,
    live_docs: u32,
    total_len: f64,
    groups: Vec<GroupStats>,
    dead_docs: usize,
    /// Whether any posting may be stale (a document removed or re-indexed since the last
    /// compaction); while none is, document frequencies are just list lengths.
    stale: bool,
    /// The document indexed last, while it is live: its postings end every list it is in.
    last: Option<u32>,
    /// One past the highest document ever indexed.
    next_doc: u32,
    /// Whether [`Bm25Index::top`] must score every match: a document was indexed at or below
    /// an earlier one (a posting list may be out of document order), or a field weight was not
    /// positive and finite (no term-frequency bound holds).
    exact_only: bool,
    /// The shortest length any document ever had (never raised, so a lower bound for every
    /// live document); `None` before the first.
    min_len: Option<f32>,
}

/// A query token found in the index: its postings, its BM25 weight and the largest term
/// frequency among its postings.
struct QueryTerm<'a> {
    list: &'a [Posting],
    weight: f32,
    max_tf: f32,
    /// The list's block map, when it is long enough to keep one.
    map: Option<&'a top::BlockMap>,
}

/// Per document (score, matched query tokens), and the documents touched by the query.
type Scratch = (Vec<(f32, u32)>, Vec<u32>);

thread_local! {
    /// Per-thread accumulators (score, matched query tokens) per document, reset after each
    /// query (only the touched entries), so a query over a large index does not allocate and
    /// zero a dense array; one array of pairs, so a posting touches one cache line.
    static SCRATCH: RefCell<Scratch> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The length of weighted fields: each field's [`word_len`] times its weight.
fn fields_len(fields: &[(&str, f32)]) -> f32 {
    fields
        .iter()
        .map(|(text, weight)| word_len(text) as f32 * weight)
        .sum()
}

/// From this many documents on, [`Bm25Index::insert_many`] indexes them in bulk, each shard on
/// its own thread.
const BULK_DOCS: usize = 256;

impl Bm25Index {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index that keeps, for its long posting lists, a map of which documents they
    /// hold (one bit per document), so [`Bm25Index::top`] finds a document's posting in a
    /// common term's list without reading the list. For indexes queried with
    /// [`Bm25Index::top`] whose documents are added in slot order (a chat's messages); a map
    /// holds under about 1.9 times what the list it maps holds. Once a document is indexed out
    /// of order, the maps are dropped and no longer kept.
    pub fn for_top() -> Self {
        Self::with_block_maps(top::BLOCK_DOCS)
    }

    fn with_block_maps(block: usize) -> Self {
        let mut index = Self::default();
        for shard in &mut index.shards {
            shard.map_block = block.max(1).next_power_of_two();
        }
        index
    }

    /// Makes room for about `docs` more documents.
    pub fn reserve(&mut self, docs: usize) {
        self.doc_len.reserve(docs);
        self.alive.reserve(docs);
        self.generation.reserve(docs);
        self.group.reserve(docs);
        for shard in &mut self.shards {
            shard.packed_ids.reserve(docs * 2);
            shard.postings.reserve(docs * 2);
        }
    }

    /// The number of live documents.
    pub fn len(&self) -> usize {
        self.live_docs as usize
    }

    /// Whether no document is live.
    pub fn is_empty(&self) -> bool {
        self.live_docs == 0
    }

    /// Starts a new version of `doc` in `group`: drops the old one and records the new length.
    fn begin(&mut self, doc: u32, group: u32, len: f32) -> u32 {
        self.remove(doc);
        let idx = doc as usize;
        if self.doc_len.len() <= idx {
            self.doc_len.resize(idx + 1, 0.0);
            self.alive.resize(idx + 1, false);
            self.generation.resize(idx + 1, 0);
            self.group.resize(idx + 1, 0);
        }
        let g = group as usize;
        if self.groups.len() <= g {
            self.groups.resize(g + 1, GroupStats::default());
        }
        self.generation[idx] = self.generation[idx].wrapping_add(1);
        self.last = Some(doc);
        if doc < self.next_doc || !len.is_finite() {
            self.score_in_full();
        } else {
            self.next_doc = doc.saturating_add(1);
        }
        self.min_len = Some(self.min_len.map_or(len, |m| m.min(len)));
        self.doc_len[idx] = len;
        self.group[idx] = group;
        self.alive[idx] = true;
        self.live_docs += 1;
        self.total_len += f64::from(len);
        self.groups[g].docs += 1;
        self.groups[g].len += f64::from(len);
        self.generation[idx]
    }

    /// Indexes `text` as document `doc` of group 0 (replacing an earlier version of it).
    pub fn insert(&mut self, doc: u32, text: &str) {
        self.insert_fields(doc, 0, &[(text, 1.0)]);
    }

    /// Indexes document `doc` of `group` (replacing an earlier version of it) from weighted
    /// fields: a token of a field of weight `w` adds `w` to its term frequency and the field's
    /// words add `w` each to the document length. Weights should be positive; multiples of ½
    /// keep every sum exact, so an index built in any order scores exactly alike.
    pub fn insert_fields(&mut self, doc: u32, group: u32, fields: &[(&str, f32)]) {
        self.check_weights(fields);
        // Length counts words and CJK characters once; the auxiliary CJK unigrams would
        // otherwise make Chinese records look twice as long as they are.
        let generation = self.begin(doc, group, fields_len(fields));
        let mut ids = Vec::with_capacity(64);
        let mut finite = true;
        for (me, shard) in self.shards.iter_mut().enumerate() {
            finite &= shard.index(me, doc, generation, fields, &mut ids);
        }
        // A term frequency summed past the largest float breaks the bounds as an infinite
        // length does (a length is rounded once, so it can stay finite).
        if !finite {
            self.score_in_full();
        }
    }

    /// Adds weighted fields to document `doc` as [`Bm25Index::insert_fields`] would have
    /// indexed them with its other fields, when `doc` is the document indexed last (its
    /// postings then end every list they are in, so each is updated where it stands and none
    /// goes stale). Returns `false`, changing nothing, for any other document: the caller
    /// indexes it again with all its fields.
    pub fn add_fields_to_last(&mut self, doc: u32, fields: &[(&str, f32)]) -> bool {
        let idx = doc as usize;
        if self.last != Some(doc) || !self.alive.get(idx).copied().unwrap_or(false) {
            return false;
        }
        self.check_weights(fields);
        let added = fields_len(fields);
        if !(self.doc_len[idx] + added).is_finite() {
            self.score_in_full();
        }
        self.doc_len[idx] += added;
        self.total_len += f64::from(added);
        let group = self.group[idx] as usize;
        if let Some(g) = self.groups.get_mut(group) {
            g.len += f64::from(added);
        }
        let generation = self.generation[idx];
        let (mut ids, mut terms) = (Vec::with_capacity(64), Vec::new());
        let mut finite = true;
        for (me, shard) in self.shards.iter_mut().enumerate() {
            terms.clear();
            shard.terms_of(me, fields, &mut ids, &mut terms);
            for &(term, tf) in &terms {
                let list = &mut shard.postings[term as usize];
                match list.last_mut() {
                    Some(p) if p.0 == doc && p.2 == generation => {
                        p.1 += tf;
                        let grown = p.1;
                        finite &= grown.is_finite();
                        shard.raise_max_tf(term, grown);
                        if let Some(map) = shard.maps.get_mut(&term) {
                            map.raise(doc, grown);
                        }
                    }
                    _ => {
                        finite &= tf.is_finite();
                        shard.push(term, (doc, tf, generation));
                    }
                }
            }
        }
        if !finite {
            self.score_in_full();
        }
        true
    }

    /// Turns pruning off for good when a weight breaks the bounds it relies on.
    fn check_weights(&mut self, fields: &[(&str, f32)]) {
        if fields.iter().any(|(_, w)| !(w.is_finite() && *w > 0.0)) {
            self.score_in_full();
        }
    }

    /// From now on [`Bm25Index::top`] scores every match (its bounds or its walk in document
    /// order no longer hold): the block maps, of no more use, are dropped and no longer kept
    /// (rebuilding them on every append to a list out of order would cost the whole list).
    fn score_in_full(&mut self) {
        self.exact_only = true;
        for shard in &mut self.shards {
            shard.map_block = 0;
            shard.maps = FxHashMap::default();
        }
    }

    /// Indexes many `(doc, group, text)` documents at once, each shard on its own thread
    /// (opening a large store). Equivalent to calling [`Bm25Index::insert_fields`] for each
    /// with weight 1, in order.
    pub fn insert_many(&mut self, docs: &[(u32, u32, &str)]) {
        // A slot indexed twice keeps only its last text, as sequential inserts would.
        let mut last: FxHashMap<u32, usize> = FxHashMap::default();
        for (i, (doc, _, _)) in docs.iter().enumerate() {
            last.insert(*doc, i);
        }
        let docs: Vec<(u32, u32, &str)> = docs
            .iter()
            .enumerate()
            .filter(|(i, (doc, _, _))| last.get(doc) == Some(i))
            .map(|(_, d)| *d)
            .collect();
        // A few documents (a catch-up, one write): threads and exact per-list reservations
        // cost more than they save, and each call would touch every posting list.
        if docs.len() < BULK_DOCS {
            for (doc, group, text) in docs {
                self.insert_fields(doc, group, &[(text, 1.0)]);
            }
            return;
        }
        let generations: Vec<u32> = docs
            .iter()
            .map(|(doc, group, text)| self.begin(*doc, *group, word_len(text) as f32))
            .collect();
        let texts: Vec<(u32, &str)> = docs.iter().map(|(d, _, t)| (*d, *t)).collect();
        std::thread::scope(|s| {
            for (me, shard) in self.shards.iter_mut().enumerate() {
                let (texts, generations) = (&texts, &generations);
                s.spawn(move || shard.index_many(me, texts, generations));
            }
        });
    }

    /// Drops document `doc` from results (its postings are skipped until the next compaction).
    pub fn remove(&mut self, doc: u32) {
        let idx = doc as usize;
        if self.alive.get(idx).copied().unwrap_or(false) {
            if self.last == Some(doc) {
                self.last = None;
            }
            self.alive[idx] = false;
            self.stale = true;
            self.live_docs -= 1;
            self.total_len -= f64::from(self.doc_len[idx]);
            let g = &mut self.groups[self.group[idx] as usize];
            g.docs -= 1;
            g.len -= f64::from(self.doc_len[idx]);
            self.dead_docs += 1;
            if self.dead_docs > 1024 && self.dead_docs > self.live_docs as usize {
                self.compact();
            }
        }
    }

    fn compact(&mut self) {
        let (alive, generation) = (&self.alive, &self.generation);
        for shard in &mut self.shards {
            // Positions move: the maps are built again as their lists grow.
            shard.maps.clear();
            for list in &mut shard.postings {
                list.retain(|(d, _, g)| alive[*d as usize] && generation[*d as usize] == *g);
            }
        }
        self.dead_docs = 0;
        self.stale = false;
    }

    /// BM25 scores of every live document matching at least one query token, as
    /// `(doc, score)` in ascending doc order. Only documents that contain a query token appear.
    pub fn score(&self, query: &[String]) -> Vec<(u32, f32)> {
        self.score_in(query, None)
    }

    /// [`Bm25Index::score`] over the documents of `groups` only (`None`: every group), with
    /// the statistics of those groups.
    pub fn score_in(&self, query: &[String], groups: Option<&[u32]>) -> Vec<(u32, f32)> {
        let mut out = self.score_unordered(query, groups);
        out.sort_unstable_by_key(|(doc, _)| *doc);
        out
    }

    /// [`Bm25Index::score_in`] in no particular order (for callers that select the best few
    /// themselves and need not pay for sorting every match).
    pub fn score_unordered(&self, query: &[String], groups: Option<&[u32]>) -> Vec<(u32, f32)> {
        let mut out = Vec::new();
        self.score_each(query, groups, |doc, score| out.push((doc, score)));
        out
    }

    /// Calls `sink` with every matching document and its score, in no particular order;
    /// returns how many there were.
    fn score_each(
        &self,
        query: &[String],
        groups: Option<&[u32]>,
        mut sink: impl FnMut(u32, f32),
    ) -> usize {
        // Statistics of the searched groups; `filter` is `None` when they hold every document.
        let mut selected: Vec<u32> = groups.map(<[u32]>::to_vec).unwrap_or_default();
        selected.sort_unstable();
        selected.dedup();
        let (n, total, filter) = match groups {
            None => (self.live_docs, self.total_len, None),
            Some(_) => {
                let stats = selected
                    .iter()
                    .filter_map(|g| self.groups.get(*g as usize))
                    .fold((0u32, 0f64), |(d, l), s| (d + s.docs, l + s.len));
                let all = stats.0 == self.live_docs;
                (stats.0, stats.1, (!all).then_some(&selected[..]))
            }
        };
        if n == 0 || query.is_empty() {
            return 0;
        }
        let avg = ((total / f64::from(n)) as f32).max(1.0);
        // Dense accumulators beat a hash map by far on long posting lists.
        SCRATCH.with_borrow_mut(|(acc, touched)| {
            if acc.len() < self.alive.len() {
                acc.resize(self.alive.len(), (0.0, 0));
            }
            touched.clear();
            self.accumulate(query, n as f32, avg, filter, acc, touched, &mut sink);
            touched.len()
        })
    }

    /// The query's terms that have current postings, with their BM25 weights, heaviest
    /// (rarest) first, ties in query order: the one order every scorer adds them in, so sums
    /// are bit-identical however they are computed.
    fn weighted_terms<'a>(
        &'a self,
        query: &[String],
        n: f32,
        filter: Option<&[u32]>,
    ) -> Vec<QueryTerm<'a>> {
        let mut terms = Vec::with_capacity(query.len());
        for term in query {
            let key = pack(term);
            let Some(mut found) = self.shards[shard_of(term, key)].lookup_term(term, key) else {
                continue;
            };
            let list = found.list;
            let df = if self.stale || filter.is_some() {
                list.iter().filter(|p| self.current(p, filter)).count() as f32
            } else {
                list.len() as f32
            };
            if df == 0.0 {
                continue;
            }
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln().max(1e-6);
            // The query side weighs each term by its idf too (idf² overall, as in the classic
            // vector-space model): a rare word in the query must dominate a common one even in
            // a long document.
            found.weight = idf * idf * (K1 + 1.0);
            terms.push(found);
        }
        terms.sort_by(|a, b| b.weight.total_cmp(&a.weight));
        terms
    }

    /// Whether a posting counts: postings of removed or re-indexed documents linger until
    /// compaction, and only the searched groups count, so scores do not depend on history
    /// (or on a restart).
    fn current(&self, &(doc, _, generation): &Posting, filter: Option<&[u32]>) -> bool {
        let idx = doc as usize;
        self.alive[idx]
            && self.generation[idx] == generation
            && filter.is_none_or(|f| f.contains(&self.group[idx]))
    }

    /// One posting's BM25 contribution for a term of `weight`.
    fn contribution(&self, weight: f32, tf: f32, doc: u32, norm: &LengthNorm) -> f32 {
        let len = self.doc_len.get(doc as usize).copied().unwrap_or(0.0);
        weight * tf / (tf + norm.base + norm.per_word * len)
    }

    /// Scores every match into the accumulators, then hands each to `sink` with its
    /// coordination applied, clearing the accumulators behind it.
    #[allow(clippy::too_many_arguments)]
    fn accumulate(
        &self,
        query: &[String],
        n: f32,
        avg: f32,
        filter: Option<&[u32]>,
        acc: &mut [(f32, u32)],
        touched: &mut Vec<u32>,
        sink: &mut impl FnMut(u32, f32),
    ) {
        let norm = LengthNorm::new(avg);
        // With nothing stale and no group filter every posting counts: skip the two lookups
        // per posting that tell (they dominate on long lists).
        let check = self.stale || filter.is_some();
        for QueryTerm { list, weight, .. } in self.weighted_terms(query, n, filter) {
            for p in list.iter().filter(|p| !check || self.current(p, filter)) {
                let idx = p.0 as usize;
                let Some(slot) = acc.get_mut(idx) else {
                    continue;
                };
                if slot.1 == 0 {
                    touched.push(p.0);
                }
                slot.0 += self.contribution(weight, p.1, p.0, &norm);
                slot.1 += 1;
            }
        }
        // Coordination: a document containing all query tokens (for CJK: every bigram of the
        // phrase) must beat a shorter one that contains only some of them.
        let terms = query.len() as f32;
        // The factor for each count of matched terms, computed once instead of per match.
        let coords: Vec<f32> = (0..=query.len()).map(|c| c as f32 / terms).collect();
        for &doc in touched.iter() {
            let idx = doc as usize;
            let Some(slot) = acc.get_mut(idx) else {
                continue;
            };
            let coord = coords
                .get(slot.1 as usize)
                .copied()
                .unwrap_or_else(|| slot.1 as f32 / terms);
            sink(doc, slot.0 * coord * coord);
            *slot = (0.0, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(text, index tokens)`: case folding, punctuation, stop words, Snowball stems, CJK.
    #[test]
    fn index_tokens_table() {
        let cases: &[(&str, &[&str])] = &[
            ("The Silver-Gate, OPEN!", &["silver", "gate", "open"]),
            ("Kai fears deep water", &["kai", "fear", "deep", "water"]),
            ("running runs ran", &["run", "run", "ran"]),
            (
                "Caroline's adoption agencies",
                &["carolin", "adopt", "agenc"],
            ),
            ("It is what it is", &[]),
            ("2023 May 8", &["2023", "may", "8"]),
            ("über Straße", &["über", "straße"]),
            ("大门", &["大", "门", "大门"]),
            ("", &[]),
        ];
        for (text, want) in cases {
            assert_eq!(index_tokens(text), *want, "{text:?}");
        }
    }

    /// `(query, query tokens)`: what a query keeps to rank with.
    #[test]
    fn query_tokens_table() {
        let cases: &[(&str, &[&str])] = &[
            ("what is the forest", &["forest"]),
            ("The Shadowfang beasts", &["shadowfang", "beast"]),
            ("is it", &[]),
            ("这是什么", &[]),
            ("银色大门在哪里", &["银色", "色大", "大门", "门在"]),
            ("告诉我塔罗牌", &["诉我", "我塔", "塔罗", "罗牌"]),
            ("的", &[]),
            ("剑", &["剑"]),
            ("tell me about Eldoria", &["eldoria"]),
            ("What does Kai fear?", &["kai", "fear"]),
            ("fear fears feared", &["fear"]),
        ];
        for (query, want) in cases {
            assert_eq!(query_tokens(query), *want, "{query:?}");
        }
    }

    #[test]
    fn a_stemmed_word_finds_its_other_forms() {
        let mut idx = Bm25Index::new();
        idx.insert(0, "Kai fears deep water");
        idx.insert(1, "Mira loves the sea");
        let hits = idx.score(&query_tokens("What is Kai's fear?"));
        assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), [0]);
        assert!(idx.score(&query_tokens("the")).is_empty());
    }

    #[test]
    fn statistics_come_from_the_groups_searched() {
        let mut idx = Bm25Index::new();
        // Group 1 is full of "lantern"; in group 0 it is as rare as "river".
        idx.insert_fields(0, 0, &[("lantern by the river", 1.0)]);
        idx.insert_fields(1, 0, &[("an old map", 1.0)]);
        for d in 2..50 {
            idx.insert_fields(d, 1, &[("lantern lantern", 1.0)]);
        }
        let only0 = idx.score_in(&query_tokens("lantern"), Some(&[0]));
        let river = idx.score_in(&query_tokens("river"), Some(&[0]));
        assert_eq!(only0.len(), 1);
        assert_eq!(only0[0].1, river[0].1, "same df, same score within group 0");
        let all = idx.score(&query_tokens("lantern"));
        assert!(all.len() == 49 && all[0].1 < only0[0].1);
        assert_eq!(
            idx.score_in(&query_tokens("lantern"), Some(&[0, 1])),
            all,
            "every group is the whole index"
        );
        assert!(idx
            .score_in(&query_tokens("lantern"), Some(&[7]))
            .is_empty());
    }

    #[test]
    fn weighted_fields_count_by_weight() {
        let mut idx = Bm25Index::new();
        idx.insert_fields(0, 0, &[("ember", 1.0)]);
        idx.insert_fields(1, 0, &[("ash", 1.0), ("ember", 0.5)]);
        idx.insert_fields(2, 0, &[("ash", 1.0)]);
        let hits = idx.score(&query_tokens("ember"));
        assert_eq!(hits.len(), 2);
        assert!(hits[0].1 > hits[1].1, "{hits:?}");
    }

    #[test]
    fn cjk_runs_become_unigrams_and_bigrams_and_queries_bigrams() {
        assert_eq!(index_tokens("大门"), ["大", "门", "大门"]);
        assert_eq!(query_tokens("银色大门"), ["银色", "色大", "大门"]);
        assert_eq!(query_tokens("门"), ["门"]);
        assert_eq!(
            query_tokens("Mira的银色大门 gate"),
            ["mira", "的银", "银色", "色大", "大门", "gate"]
        );
        assert_eq!(raw_tokens("The 银色大门"), ["the", "银色", "色大", "大门"]);
    }

    #[test]
    fn a_chinese_sentence_matches_the_words_inside_it() {
        let mut idx = Bm25Index::new();
        idx.insert(0, "她推开了银色大门");
        idx.insert(1, "河灵从不归还");
        idx.insert(2, "silver gate");
        let hits = idx.score(&query_tokens("银色大门"));
        assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), [0]);
        assert!(idx.score(&query_tokens("不存在的词")).is_empty());
    }

    #[test]
    fn packed_tokens_never_collide() {
        let tokens = ["a", "ab", "abcdefg", "大", "大门", "门大", "a\u{0}", "ba"];
        let keys: std::collections::HashSet<u64> = tokens.iter().filter_map(|t| pack(t)).collect();
        assert_eq!(keys.len(), tokens.len());
        assert_eq!(pack("abcdefgh"), None);
        assert_eq!(pack("银色大"), None, "three CJK characters are not packed");
    }

    #[test]
    fn bulk_indexing_equals_sequential_indexing() {
        let docs = [
            (0, 0, "银色大门 silver gate"),
            (1, 1, "river spirit 河灵"),
            (0, 1, "lantern keeper"),
            (2, 0, "gate keeper"),
        ];
        let mut one = Bm25Index::new();
        for (d, g, t) in docs {
            one.insert_fields(d, g, &[(t, 1.0)]);
        }
        let mut bulk = Bm25Index::new();
        bulk.insert_many(&docs);
        for q in [
            "gate",
            "keeper",
            "银色大门",
            "lantern",
            "河灵 spirit",
            "silver",
        ] {
            assert_eq!(
                one.score(&query_tokens(q)),
                bulk.score(&query_tokens(q)),
                "{q}"
            );
            assert_eq!(
                one.score_in(&query_tokens(q), Some(&[1])),
                bulk.score_in(&query_tokens(q), Some(&[1])),
                "{q}"
            );
        }
        assert!(
            bulk.score(&query_tokens("silver")).is_empty(),
            "slot 0 was re-indexed"
        );
    }

    #[test]
    fn word_len_counts_words_and_cjk_characters() {
        for text in ["", "a b", "Mira的银色大门 gate!", "x1y2 z", "门", "ÄÖ über"] {
            let mut want = 0;
            for_each_run(text, |run, cjk| want += if cjk { run.len() } else { 1 });
            assert_eq!(word_len(text), want, "{text}");
        }
    }

    #[test]
    fn removed_documents_never_match() {
        let mut idx = Bm25Index::new();
        idx.insert(0, "lantern");
        idx.insert(1, "lantern lantern");
        idx.remove(1);
        assert_eq!(idx.score(&query_tokens("lantern")).len(), 1);
        idx.insert(1, "nothing");
        assert_eq!(idx.score(&query_tokens("lantern")).len(), 1);
    }

    /// `top` keeps exactly the best `k` of scoring every match (same documents, same scores,
    /// same order, ties to the higher slot) and counts every match.
    mod top_is_the_best_of_all {
        use super::*;
        use proptest::prelude::*;

        const WORDS: &[&str] = &[
            "kai", "mira", "gate", "silver", "lantern", "river", "oak", "tea",
        ];

        proptest! {
            #[test]
            fn same_best_and_total(
                docs in prop::collection::vec(prop::collection::vec(0usize..8, 1..8), 1..120),
                query in prop::collection::vec(0usize..8, 1..5),
                k in 0usize..15,
            ) {
                let mut idx = Bm25Index::new();
                for (i, words) in docs.iter().enumerate() {
                    let text: Vec<&str> = words.iter().map(|w| WORDS[*w]).collect();
                    idx.insert(i as u32, &text.join(" "));
                }
                let text: Vec<&str> = query.iter().map(|w| WORDS[*w]).collect();
                let q = query_tokens(&text.join(" "));
                let mut all = idx.score(&q);
                let total = all.len();
                all.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
                all.truncate(k);
                prop_assert_eq!(idx.top(&q, k), (all, total));
            }
        }
    }
}
