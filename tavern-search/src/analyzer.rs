//! The analyzer: text to tokens, the same way for documents and queries everywhere. Latin
//! words are case-folded, stop words dropped ([`crate::stopwords`]) and English words reduced
//! to their Snowball stem; CJK runs become character bigrams (and, for documents, unigrams).
//! `fears` finds "Kai fears deep water" and "Kai's fear of water", `the` and `的` find nothing
//! by themselves, `银色大门` finds a sentence containing it.

use std::cell::RefCell;

use rust_stemmers::{Algorithm, Stemmer};
use rustc_hash::FxHashMap;

use tavern_core::tokens::is_cjk;

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
        let token: Option<Box<str>> = if crate::stopwords::is_stop_word(word) {
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
pub(crate) fn for_each_index_token(text: &str, mut f: impl FnMut(&str)) {
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
                if !crate::stopwords::is_stop_word(&token) {
                    out.push(token);
                }
            }
        } else if cjk {
            let token: String = run.iter().collect();
            if !crate::stopwords::is_stop_word(&token) {
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

/// The length of a text for BM25: its words plus its CJK characters (each counts once), as
/// the analyzer splits it, without building the runs. `银色大门 opened` is 5 long.
pub fn word_len(text: &str) -> usize {
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
pub(crate) fn for_each_run(text: &str, mut f: impl FnMut(&[char], bool)) {
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
