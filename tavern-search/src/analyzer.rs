//! The analyzer: text to tokens, the same way for documents and queries everywhere. Latin
//! words are case-folded, stop words dropped ([`crate::stopwords`]) and English words reduced
//! to their Snowball stem; CJK runs become character bigrams (and, for documents, unigrams).
//! `fears` finds "Kai fears deep water" and "Kai's fear of water", `the` and `的` find nothing
//! by themselves, `银色大门` finds a sentence containing it.

use std::cell::RefCell;
use std::sync::{Mutex, PoisonError};

use rust_stemmers::{Algorithm, Stemmer};
use rustc_hash::FxHashMap;

use tavern_core::tokens::is_cjk;

/// Memoized word → index token (`None` for a stop word) entries per memo before it is
/// cleared: words repeat (Zipf), so most lookups skip the stemmer; the bound keeps memory flat.
const STEM_MEMO_MAX: usize = 1 << 16;

/// The English stemmer with a memo of its results (see [`STEM_MEMO_MAX`]).
pub(crate) struct Stems {
    stemmer: Stemmer,
    /// Case-folded word → its index token, `None` for a stop word.
    memo: FxHashMap<Box<str>, Option<Box<str>>>,
}

impl Stems {
    fn new() -> Self {
        Self {
            stemmer: Stemmer::create(Algorithm::English),
            memo: FxHashMap::default(),
        }
    }

    /// Calls `f` with the index token of a case-folded Latin word: its Snowball English stem
    /// (words with non-ASCII letters are kept as they are), nothing for a stop word.
    fn word_token(&mut self, word: &str, f: impl FnOnce(&str)) {
        if let Some(token) = self.memo.get(word) {
            if let Some(token) = token {
                f(token);
            }
            return;
        }
        let token: Option<Box<str>> = if crate::stopwords::is_stop_word(word) {
            None
        } else if word.is_ascii() {
            Some(self.stemmer.stem(word).into())
        } else {
            Some(word.into())
        };
        if self.memo.len() >= STEM_MEMO_MAX {
            self.memo.clear();
        }
        if let Some(token) = &token {
            f(token);
        }
        self.memo.insert(word.into(), token);
    }
}

thread_local! {
    /// This thread's stems (queries and one-by-one inserts).
    static STEMS: RefCell<Stems> = RefCell::new(Stems::new());
}

/// Warm memos lent to the short-lived threads of bulk indexing ([`with_lent_stems`]): a thread
/// spawned per import round started with an empty memo and stemmed most words again (the
/// spawned half tokenized 1.7× slower than the calling thread's).
static LENT_STEMS: Mutex<Vec<Stems>> = Mutex::new(Vec::new());

/// How many warm memos [`LENT_STEMS`] keeps (one per bulk-indexing thread).
const LENT_STEMS_MAX: usize = 2;

/// Runs `f` with a warm memo taken from [`LENT_STEMS`] (a new one when none is there), and
/// gives it back after.
pub(crate) fn with_lent_stems<R>(f: impl FnOnce(&mut Stems) -> R) -> R {
    let taken = LENT_STEMS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop();
    let mut stems = taken.unwrap_or_else(Stems::new);
    let out = f(&mut stems);
    let mut lent = LENT_STEMS.lock().unwrap_or_else(PoisonError::into_inner);
    if lent.len() < LENT_STEMS_MAX {
        lent.push(stems);
    }
    out
}

/// [`Stems::word_token`] with this thread's stems.
fn with_word_token(word: &str, f: impl FnOnce(&str)) {
    STEMS.with_borrow_mut(|stems| stems.word_token(word, f));
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
pub(crate) fn for_each_index_token(text: &str, f: impl FnMut(&str)) {
    each_index_token(text, f, |word, f| with_word_token(word, f));
}

/// [`for_each_index_token`] with the given `stems` rather than this thread's; returns the
/// text's [`word_len`], counted on the way.
pub(crate) fn for_each_index_token_with(
    stems: &mut Stems,
    text: &str,
    f: impl FnMut(&str),
) -> usize {
    each_index_token(text, f, |word, f| stems.word_token(word, f))
}

/// Calls `f` with each index token of `text`, `word_token` making a Latin word's; returns the
/// text's [`word_len`] (each Latin run a word, each CJK character one).
fn each_index_token(
    text: &str,
    mut f: impl FnMut(&str),
    mut word_token: impl FnMut(&str, &mut dyn FnMut(&str)),
) -> usize {
    let mut buf = String::with_capacity(32);
    let mut len = 0;
    for_each_run(text, |run, cjk| {
        if cjk {
            len += run.len();
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
            len += 1;
            buf.clear();
            buf.extend(run);
            word_token(&buf, &mut f);
        }
    });
    len
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
