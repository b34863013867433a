//! Deterministic lexical search: a tokenizer for case-folded Latin words and CJK character
//! bigrams, and an in-memory BM25 inverted index. No vector database, no randomness.

use std::collections::HashMap;

use tavern_core::tokens::is_cjk;

/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// BM25 length normalization.
const B: f32 = 0.75;

/// Splits text into index tokens: lowercase alphanumeric runs of non-CJK text, and for CJK runs
/// every character bigram plus every single character (so one-character queries still match).
pub fn index_tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_run(text, |run, cjk| {
        if cjk {
            for c in run {
                out.push(c.to_string());
            }
            for pair in run.windows(2) {
                out.push(pair.iter().collect());
            }
        } else {
            out.push(run.iter().collect());
        }
    });
    out
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
            run.extend(c.to_lowercase());
        }
    }
    if !run.is_empty() {
        f(&run, run_cjk);
    }
}

/// An inverted index over documents identified by `u32` slots the caller assigns.
#[derive(Debug, Default, Clone)]
pub struct Bm25Index {
    /// `(doc, term frequency, doc generation)`; a posting counts only while its generation is
    /// the document's current one, so re-indexing a slot never leaves old terms matching.
    postings: HashMap<String, Vec<(u32, u32, u32)>>,
    generation: Vec<u32>,
    doc_len: Vec<u32>,
    alive: Vec<bool>,
    live_docs: u32,
    total_len: u64,
    dead_postings: usize,
}

impl Bm25Index {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Indexes `text` as document `doc` (replacing an earlier version of it).
    pub fn insert(&mut self, doc: u32, text: &str) {
        self.remove(doc);
        let tokens = index_tokens(text);
        let idx = doc as usize;
        if self.doc_len.len() <= idx {
            self.doc_len.resize(idx + 1, 0);
            self.alive.resize(idx + 1, false);
            self.generation.resize(idx + 1, 0);
        }
        let mut tf: HashMap<String, u32> = HashMap::new();
        for t in &tokens {
            *tf.entry(t.clone()).or_default() += 1;
        }
        let mut terms: Vec<(String, u32)> = tf.into_iter().collect();
        terms.sort();
        self.generation[idx] = self.generation[idx].wrapping_add(1);
        let generation = self.generation[idx];
        for (term, n) in terms {
            self.postings
                .entry(term)
                .or_default()
                .push((doc, n, generation));
        }
        let len = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        self.doc_len[idx] = len;
        self.alive[idx] = true;
        self.live_docs += 1;
        self.total_len += u64::from(len);
    }

    /// Drops document `doc` from results (its postings are skipped until the next rebuild).
    pub fn remove(&mut self, doc: u32) {
        let idx = doc as usize;
        if self.alive.get(idx).copied().unwrap_or(false) {
            self.alive[idx] = false;
            self.live_docs -= 1;
            self.total_len -= u64::from(self.doc_len[idx]);
            self.dead_postings += 1;
            if self.dead_postings > 1024 && self.dead_postings > self.live_docs as usize {
                self.compact();
            }
        }
    }

    fn compact(&mut self) {
        let (alive, generation) = (&self.alive, &self.generation);
        self.postings.retain(|_, list| {
            list.retain(|(d, _, g)| alive[*d as usize] && generation[*d as usize] == *g);
            !list.is_empty()
        });
        self.dead_postings = 0;
    }

    /// BM25 scores of every live document matching at least one query token, as
    /// `(doc, score)` in ascending doc order. Only documents that contain a query token appear.
    pub fn score(&self, query: &[String]) -> Vec<(u32, f32)> {
        if self.live_docs == 0 || query.is_empty() {
            return Vec::new();
        }
        let n = self.live_docs as f32;
        let avg = (self.total_len as f32 / n).max(1.0);
        let mut acc: HashMap<u32, f32> = HashMap::new();
        for term in query {
            let Some(list) = self.postings.get(term) else {
                continue;
            };
            // Postings of removed documents linger until compaction, so clamp df to the live
            // count; the floor keeps every real match's score positive.
            let df = (list.len() as f32).min(n);
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln().max(1e-6);
            for &(doc, tf, generation) in list {
                let idx = doc as usize;
                if !self.alive[idx] || self.generation[idx] != generation {
                    continue;
                }
                let tf = tf as f32;
                let len = self.doc_len[idx] as f32;
                let s = idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avg));
                *acc.entry(doc).or_default() += s;
            }
        }
        let mut out: Vec<(u32, f32)> = acc.into_iter().filter(|(_, s)| *s > 0.0).collect();
        out.sort_by_key(|(d, _)| *d);
        out
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
