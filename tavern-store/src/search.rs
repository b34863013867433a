//! Deterministic lexical search: a tokenizer for case-folded Latin words and CJK character
//! bigrams, and an in-memory BM25 inverted index. No vector database, no randomness.

use rustc_hash::FxHashMap;

use tavern_core::tokens::is_cjk;

/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// BM25 length normalization.
const B: f32 = 0.75;

/// Splits text into index tokens: lowercase alphanumeric runs of non-CJK text, and for CJK runs
/// every character bigram plus every single character (so one-character queries still match).
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
            f(&buf);
        }
    });
}

/// Splits a query into tokens: Latin words as in [`index_tokens`]; a CJK run of two or more
/// characters becomes its bigrams (so `银色大门` matches text containing it), a lone CJK
/// character itself. Duplicates are removed, first occurrence kept.
pub fn query_tokens(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for_each_run(text, |run, cjk| {
        if cjk && run.len() >= 2 {
            for pair in run.windows(2) {
                out.push(pair.iter().collect());
            }
        } else {
            out.push(run.iter().collect());
        }
    });
    let mut seen = std::collections::HashSet::new();
    out.retain(|t| seen.insert(t.clone()));
    out
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

/// One shard of the term dictionary with its postings: `(doc, term frequency, doc generation)`.
#[derive(Debug, Default, Clone)]
struct Shard {
    /// Short tokens (CJK uni/bigrams, Latin words up to 7 bytes) packed into integers: most
    /// lookups hash a `u64` instead of comparing strings.
    packed_ids: FxHashMap<u64, u32>,
    term_ids: FxHashMap<Box<str>, u32>,
    postings: Vec<Vec<(u32, u32, u32)>>,
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
        }
        id
    }

    fn lookup(&self, token: &str, key: Option<u64>) -> Option<&[(u32, u32, u32)]> {
        let id = match key {
            Some(key) => self.packed_ids.get(&key),
            None => self.term_ids.get(token),
        }?;
        Some(&self.postings[*id as usize])
    }

    /// The `(term id, term frequency)` pairs of the tokens of `text` this shard owns, interning
    /// new terms.
    fn terms_of(&mut self, me: usize, text: &str, ids: &mut Vec<u32>, out: &mut Vec<(u32, u32)>) {
        ids.clear();
        for_each_index_token(text, |token| {
            let key = pack(token);
            if shard_of(token, key) == me {
                ids.push(self.intern(token, key));
            }
        });
        ids.sort_unstable();
        for run in ids.chunk_by(|a, b| a == b) {
            out.push((run[0], u32::try_from(run.len()).unwrap_or(u32::MAX)));
        }
    }

    /// Adds the postings of `doc` for the tokens of `text` this shard owns.
    fn index(&mut self, me: usize, doc: u32, generation: u32, text: &str, ids: &mut Vec<u32>) {
        let mut terms = Vec::new();
        self.terms_of(me, text, ids, &mut terms);
        for (term, tf) in terms {
            self.postings[term as usize].push((doc, tf, generation));
        }
    }

    /// Adds many documents: terms first, then every posting list grown once to its final size
    /// (hundreds of thousands of small lists growing step by step dominated opening a store).
    fn index_many(&mut self, me: usize, docs: &[(u32, &str)], generations: &[u32]) {
        let mut ids = Vec::with_capacity(64);
        let mut terms: Vec<(u32, u32)> = Vec::new();
        let mut bounds = Vec::with_capacity(docs.len() + 1);
        bounds.push(0);
        for (_, text) in docs {
            self.terms_of(me, text, &mut ids, &mut terms);
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
                self.postings[*term as usize].push((*doc, *tf, *generation));
            }
        }
    }
}

/// An inverted index over documents identified by `u32` slots the caller assigns. Terms are
/// interned into two shards by hash. Postings count only while their generation is the
/// document's current one, so re-indexing a slot never leaves old terms matching.
#[derive(Debug, Default, Clone)]
pub struct Bm25Index {
    shards: [Shard; SHARDS],
    generation: Vec<u32>,
    doc_len: Vec<u32>,
    alive: Vec<bool>,
    live_docs: u32,
    total_len: u64,
    dead_docs: usize,
    /// Whether any posting may be stale (a document removed or re-indexed since the last
    /// compaction); while none is, document frequencies are just list lengths.
    stale: bool,
}

thread_local! {
    /// Per-thread score accumulators, reset after each query (only the touched entries), so a
    /// query over a large index does not allocate and zero two dense arrays.
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<u16>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl Bm25Index {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes room for about `docs` more documents.
    pub fn reserve(&mut self, docs: usize) {
        self.doc_len.reserve(docs);
        self.alive.reserve(docs);
        self.generation.reserve(docs);
        for shard in &mut self.shards {
            shard.packed_ids.reserve(docs * 2);
            shard.postings.reserve(docs * 2);
        }
    }

    /// Starts a new version of `doc`: drops the old one and records the new length.
    fn begin(&mut self, doc: u32, text: &str) -> u32 {
        self.remove(doc);
        let idx = doc as usize;
        if self.doc_len.len() <= idx {
            self.doc_len.resize(idx + 1, 0);
            self.alive.resize(idx + 1, false);
            self.generation.resize(idx + 1, 0);
        }
        self.generation[idx] = self.generation[idx].wrapping_add(1);
        // Length counts words and CJK characters once; the auxiliary CJK unigrams would
        // otherwise make Chinese records look twice as long as they are.
        let len = u32::try_from(word_len(text)).unwrap_or(u32::MAX);
        self.doc_len[idx] = len;
        self.alive[idx] = true;
        self.live_docs += 1;
        self.total_len += u64::from(len);
        self.generation[idx]
    }

    /// Indexes `text` as document `doc` (replacing an earlier version of it).
    pub fn insert(&mut self, doc: u32, text: &str) {
        let generation = self.begin(doc, text);
        let mut ids = Vec::with_capacity(64);
        for (me, shard) in self.shards.iter_mut().enumerate() {
            shard.index(me, doc, generation, text, &mut ids);
        }
    }

    /// Indexes many documents at once, each shard on its own thread (opening a large store).
    /// Equivalent to calling [`Bm25Index::insert`] for each, in order.
    pub fn insert_many(&mut self, docs: &[(u32, &str)]) {
        // A slot indexed twice keeps only its last text, as sequential inserts would.
        let mut last: FxHashMap<u32, usize> = FxHashMap::default();
        for (i, (doc, _)) in docs.iter().enumerate() {
            last.insert(*doc, i);
        }
        let docs: Vec<(u32, &str)> = docs
            .iter()
            .enumerate()
            .filter(|(i, (doc, _))| last.get(doc) == Some(i))
            .map(|(_, d)| *d)
            .collect();
        let generations: Vec<u32> = docs
            .iter()
            .map(|(doc, text)| self.begin(*doc, text))
            .collect();
        std::thread::scope(|s| {
            for (me, shard) in self.shards.iter_mut().enumerate() {
                let (docs, generations) = (&docs, &generations);
                s.spawn(move || shard.index_many(me, docs, generations));
            }
        });
    }

    /// Drops document `doc` from results (its postings are skipped until the next compaction).
    pub fn remove(&mut self, doc: u32) {
        let idx = doc as usize;
        if self.alive.get(idx).copied().unwrap_or(false) {
            self.alive[idx] = false;
            self.stale = true;
            self.live_docs -= 1;
            self.total_len -= u64::from(self.doc_len[idx]);
            self.dead_docs += 1;
            if self.dead_docs > 1024 && self.dead_docs > self.live_docs as usize {
                self.compact();
            }
        }
    }

    fn compact(&mut self) {
        let (alive, generation) = (&self.alive, &self.generation);
        for shard in &mut self.shards {
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
        if self.live_docs == 0 || query.is_empty() {
            return Vec::new();
        }
        let n = self.live_docs as f32;
        let avg = (self.total_len as f32 / n).max(1.0);
        // Dense accumulators beat a hash map by far on long posting lists.
        SCRATCH.with_borrow_mut(|(score, matched)| {
            if score.len() < self.alive.len() {
                score.resize(self.alive.len(), 0.0);
                matched.resize(self.alive.len(), 0);
            }
            let out = self.accumulate(query, n, avg, score, matched);
            for (doc, _) in &out {
                score[*doc as usize] = 0.0;
                matched[*doc as usize] = 0;
            }
            out
        })
    }

    fn accumulate(
        &self,
        query: &[String],
        n: f32,
        avg: f32,
        score: &mut [f32],
        matched: &mut [u16],
    ) -> Vec<(u32, f32)> {
        let mut touched: Vec<u32> = Vec::new();
        for term in query {
            let key = pack(term);
            let Some(list) = self.shards[shard_of(term, key)].lookup(term, key) else {
                continue;
            };
            // Postings of removed or re-indexed documents linger until compaction; count only
            // current ones so scores do not depend on history (or on a restart). The floor
            // keeps every real match's score positive.
            let current = |&&(doc, _, generation): &&(u32, u32, u32)| {
                self.alive[doc as usize] && self.generation[doc as usize] == generation
            };
            let df = if self.stale {
                list.iter().filter(current).count() as f32
            } else {
                list.len() as f32
            };
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln().max(1e-6);
            // The query side weighs each term by its idf too (idf² overall, as in the classic
            // vector-space model): a rare word in the query must dominate a common one even in
            // a long document.
            let weight = idf * idf * (K1 + 1.0);
            for &(doc, tf, _) in list.iter().filter(current) {
                let idx = doc as usize;
                let tf = tf as f32;
                let len = self.doc_len[idx] as f32;
                if matched[idx] == 0 {
                    touched.push(doc);
                }
                score[idx] += weight * tf / (tf + K1 * (1.0 - B + B * len / avg));
                matched[idx] = matched[idx].saturating_add(1);
            }
        }
        // Coordination: a document containing all query tokens (for CJK: every bigram of the
        // phrase) must beat a shorter one that contains only some of them.
        let terms = query.len() as f32;
        touched.sort_unstable();
        touched
            .into_iter()
            .map(|doc| {
                let idx = doc as usize;
                let coord = f32::from(matched[idx]) / terms;
                (doc, score[idx] * coord * coord)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin_is_case_folded_and_split_on_punctuation() {
        assert_eq!(
            index_tokens("The Silver-Gate, OPEN!"),
            ["the", "silver", "gate", "open"]
        );
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
            (0, "银色大门 silver gate"),
            (1, "river spirit 河灵"),
            (0, "lantern keeper"),
            (2, "gate keeper"),
        ];
        let mut one = Bm25Index::new();
        for (d, t) in docs {
            one.insert(d, t);
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
}
