//! Word vectors and the ranker that reads with them: what a lexical engine cannot see — that
//! "photography" is about cameras, lenses and flashes, that "the evening" is "winding down
//! by 9:30 pm" — static word embeddings (GloVe, fastText, word2vec in their text format) see
//! as nearby vectors. [`VectorRanker`] plugs into the ranker seam ([`crate::rank`]): it
//! blends each lexical candidate's score with how close its text's vector is to the query's,
//! so memory, history and lore search all gain it at once, and only over the pool the
//! lexical search found (its work is bounded by the pool, not the corpus).
//!
//! No model is shipped and none is fetched: a program reads a vectors file it was given
//! ([`WordVectors::read`]) and hands the ranker to the services. Words are looked up
//! lower-cased; text in a script the vectors do not cover (Chinese in an English set) has no
//! vector and keeps its lexical order.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::{BufRead, Read};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use crate::rank::{Candidate, Ranker};
use crate::stopwords::is_stop_word;

/// The most dimensions a vector may have.
pub const MAX_DIMS: usize = 1_024;
/// The longest word a vectors file may hold, in bytes.
pub const MAX_WORD_BYTES: usize = 256;
/// How many words [`WordVectors::read`] keeps by default: the first ones of the file, which
/// in GloVe and fastText files are the commonest.
pub const DEFAULT_MAX_WORDS: usize = 400_000;
/// Words of a text (query or candidate) read for its vector: a long text's first ones.
pub const MAX_TEXT_WORDS: usize = 256;
/// Bytes of a text (query or candidate) read for its vector and its cache key: a long text's
/// first ones, whatever it is made of.
pub const MAX_TEXT_BYTES: usize = 8 * 1024;
/// The most numbers a vectors file may hold in all (256 MiB of `f32`): 400,000 words of 160
/// dimensions; a larger file names this limit (cut it with `head`, the commonest words first).
pub const MAX_VALUES: usize = 64 * 1024 * 1024;
/// The share of a candidate's final score that comes from its vector, by default.
pub const DEFAULT_WEIGHT: f32 = 0.5;
/// Lexical candidates handed to the ranker per search, by default.
pub const DEFAULT_POOL: usize = 100;

/// A vectors file that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum VectorsError {
    /// A line is not `word v1 v2 …` with as many finite numbers as the first vector has.
    #[error("word vectors line {line}: {reason}")]
    Malformed {
        /// The line, counted from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading failed.
    #[error("word vectors cannot be read: {0}")]
    Read(String),
    /// The file holds no vector.
    #[error("word vectors: the file holds no vector")]
    Empty,
    /// A weight outside what [`VectorRanker::with_weight`] takes.
    #[error("vector weight {0}: must be within 0 and 0.95")]
    Weight(f32),
}

/// Word vectors read from a text file: one word per line followed by its numbers, separated
/// by spaces (GloVe's format; fastText's and word2vec's, whose first line gives the word
/// count and the dimensions, too).
#[derive(Clone, PartialEq)]
pub struct WordVectors {
    dims: usize,
    /// Each word's row, in file order (a row's number is the word's frequency rank).
    rows: FxHashMap<String, u32>,
    values: Vec<f32>,
}

impl std::fmt::Debug for WordVectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WordVectors")
            .field("words", &self.rows.len())
            .field("dims", &self.dims)
            .finish()
    }
}

impl WordVectors {
    /// Reads the first `max_words` vectors of `reader` (a word met again keeps its first
    /// vector). Memory is bounded by `max_words` and [`MAX_DIMS`], whatever the file holds.
    ///
    /// # Errors
    /// [`VectorsError::Malformed`] naming the first bad line (too long, a number that is not
    /// one or not finite, a different dimension count), [`VectorsError::Read`] when reading
    /// fails, [`VectorsError::Empty`] when there is no vector.
    pub fn read(mut reader: impl BufRead, max_words: usize) -> Result<Self, VectorsError> {
        let longest = MAX_WORD_BYTES + 1 + MAX_DIMS * 32;
        let mut out = Self {
            dims: 0,
            rows: FxHashMap::default(),
            values: Vec::new(),
        };
        let mut line = Vec::new();
        let mut number = 0;
        // Lines, not distinct words, bound the read: a file of one word repeated ends too.
        while out.rows.len() < max_words && number < max_words.saturating_mul(2) {
            line.clear();
            let read = reader
                .by_ref()
                .take(longest as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| VectorsError::Read(e.kind().to_string()))?;
            if read == 0 {
                break;
            }
            number += 1;
            let malformed = |reason: String| VectorsError::Malformed {
                line: number,
                reason,
            };
            if line.len() > longest {
                return Err(malformed(format!("longer than {longest} bytes")));
            }
            let text = std::str::from_utf8(&line)
                .map_err(|_| malformed("not UTF-8".into()))?
                .trim_end_matches(['\n', '\r']);
            // A file saved by some editors starts with a byte-order mark.
            let text = if number == 1 {
                text.trim_start_matches('\u{feff}')
            } else {
                text
            };
            if text.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = text.split(' ').filter(|f| !f.is_empty()).collect();
            // Once the dimensions are known, the numbers are the last `dims` fields and the
            // word is all before them: glove.840B has "words" with spaces in them (". . .").
            let split = if out.dims > 0 && fields.len() > out.dims + 1 {
                fields.len() - out.dims
            } else {
                1
            };
            let spaced;
            let word = if split == 1 {
                fields.first().copied().unwrap_or_default()
            } else {
                spaced = fields[..split].join(" ");
                spaced.as_str()
            };
            let numbers = &fields[split..];
            // fastText's and word2vec's first line: "<words> <dims>".
            if number == 1 && numbers.len() == 1 && word.parse::<u64>().is_ok() {
                continue;
            }
            if word.len() > MAX_WORD_BYTES {
                return Err(malformed(format!(
                    "the word is longer than {MAX_WORD_BYTES} bytes"
                )));
            }
            if out.dims == 0 {
                if numbers.is_empty() || numbers.len() > MAX_DIMS {
                    return Err(malformed(format!(
                        "{} numbers; a vector has 1 to {MAX_DIMS}",
                        numbers.len()
                    )));
                }
                out.dims = numbers.len();
            } else if numbers.len() != out.dims {
                return Err(malformed(format!(
                    "{} numbers where the first vector has {}",
                    numbers.len(),
                    out.dims
                )));
            }
            let start = out.values.len();
            if start + out.dims > MAX_VALUES {
                return Err(malformed(format!(
                    "more than {MAX_VALUES} numbers in all; keep fewer words"
                )));
            }
            for n in numbers {
                match n.parse::<f32>() {
                    Ok(v) if v.is_finite() => out.values.push(v),
                    _ => {
                        out.values.truncate(start);
                        return Err(malformed(format!("{n:?} is not a finite number")));
                    }
                }
            }
            let row = u32::try_from(out.rows.len()).unwrap_or(u32::MAX);
            if out.rows.contains_key(word) {
                out.values.truncate(start);
            } else {
                out.rows.insert(word.to_owned(), row);
            }
        }
        if out.rows.is_empty() {
            return Err(VectorsError::Empty);
        }
        out.values.shrink_to_fit();
        Ok(out)
    }

    /// Reads the vectors file at `path` ([`WordVectors::read`] over a buffered file).
    ///
    /// # Errors
    /// As [`WordVectors::read`]; [`VectorsError::Read`] when the file cannot be opened (the
    /// message names the failure, not the path: the caller names the file as it was given).
    pub fn open(path: &std::path::Path, max_words: usize) -> Result<Self, VectorsError> {
        let file =
            std::fs::File::open(path).map_err(|e| VectorsError::Read(e.kind().to_string()))?;
        Self::read(std::io::BufReader::new(file), max_words)
    }

    /// How many words have a vector.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no word has a vector (never, for vectors that were read).
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The dimensions of each vector.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// The vector of `text`: its words' vectors (lower-cased, stop words left out), the
    /// rarer words weighing more (a word's weight grows with the log of its rank in the
    /// file, which is by frequency), normalized; `None` when no word has one.
    pub fn text_vector(&self, text: &str) -> Option<Vec<f32>> {
        let mut sum = vec![0f32; self.dims];
        let mut found = false;
        let words = prefix(text)
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .take(MAX_TEXT_WORDS);
        let mut lower = String::new();
        for word in words {
            let word = if word
                .bytes()
                .any(|b| !b.is_ascii_lowercase() && !b.is_ascii_digit())
            {
                lower.clear();
                lower.extend(word.chars().flat_map(char::to_lowercase));
                lower.as_str()
            } else {
                word
            };
            if is_stop_word(word) {
                continue;
            }
            let Some(&row) = self.rows.get(word) else {
                continue;
            };
            let weight = (2.0 + row as f32 / 50.0).ln();
            let start = row as usize * self.dims;
            let Some(vector) = self.values.get(start..start + self.dims) else {
                continue;
            };
            for (s, v) in sum.iter_mut().zip(vector) {
                *s += weight * v;
            }
            found = true;
        }
        let norm = sum.iter().map(|v| v * v).sum::<f32>().sqrt();
        (found && norm > 0.0 && norm.is_finite()).then(|| sum.iter().map(|v| v / norm).collect())
    }
}

/// Candidate texts whose vectors a [`VectorRanker`] keeps at most; past this (or past
/// [`CACHE_VALUES`]) the kept ones are let go.
pub const CACHE_TEXTS: usize = 65_536;

/// Numbers a [`VectorRanker`] keeps in all (64 MiB): at 50 dimensions [`CACHE_TEXTS`] texts
/// fit, at 1,024 about 16,000.
pub const CACHE_VALUES: usize = 16 * 1024 * 1024;

/// The first [`MAX_TEXT_BYTES`] of `text`, cut at a character boundary.
fn prefix(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Candidate texts' vectors by (keyed hash, length) of the text; `None` for a text without
/// one.
type KeptVectors = FxHashMap<(u64, usize), Option<Arc<[f32]>>>;

/// A ranker that blends each lexical candidate's score (as a share of the best one's) with
/// the cosine of its text's vector and the query's: `(1 − weight) × lexical / best +
/// weight × max(cosine, 0)`. A query with no vector keeps the lexical order.
///
/// The same messages and memories come back as candidates search after search, so the
/// vectors of recent texts are kept (at most [`CACHE_TEXTS`] texts and [`CACHE_VALUES`]
/// numbers), found by the text's length and a hash keyed at random per ranker, so nobody who
/// can write a memory can make two texts share a vector: a search then costs a lookup and a
/// dot product per candidate.
pub struct VectorRanker {
    vectors: Arc<WordVectors>,
    weight: f32,
    pool: usize,
    keys: RandomState,
    cache: Mutex<KeptVectors>,
}

impl std::fmt::Debug for VectorRanker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the kept vectors: thousands of them.
        f.debug_struct("VectorRanker")
            .field("vectors", &self.vectors)
            .field("weight", &self.weight)
            .field("pool", &self.pool)
            .finish()
    }
}

impl Clone for VectorRanker {
    fn clone(&self) -> Self {
        Self {
            vectors: self.vectors.clone(),
            weight: self.weight,
            pool: self.pool,
            keys: RandomState::new(),
            cache: Mutex::default(),
        }
    }
}

impl VectorRanker {
    /// A ranker over `vectors` with [`DEFAULT_WEIGHT`] and [`DEFAULT_POOL`].
    pub fn new(vectors: Arc<WordVectors>) -> Self {
        Self {
            vectors,
            weight: DEFAULT_WEIGHT,
            pool: DEFAULT_POOL,
            keys: RandomState::new(),
            cache: Mutex::default(),
        }
    }

    /// The share of the final score that comes from the vectors, within 0 and 0.95 (some
    /// lexical share always stays, so every candidate keeps a score above zero).
    #[must_use]
    pub fn with_weight(mut self, weight: f32) -> Self {
        self.weight = if weight.is_finite() {
            weight.clamp(0.0, 0.95)
        } else {
            DEFAULT_WEIGHT
        };
        self
    }

    /// How many lexical candidates to rank per search (at most [`crate::rank::POOL_MAX`]
    /// are handed over whatever this says).
    #[must_use]
    pub fn with_pool(mut self, pool: usize) -> Self {
        self.pool = pool.max(1);
        self
    }
}

impl VectorRanker {
    /// The ranker over the vectors file at `path` (its first [`DEFAULT_MAX_WORDS`] words),
    /// with `weight` when given: what a program's `--word-vectors FILE --vector-weight W`
    /// become.
    ///
    /// # Errors
    /// As [`WordVectors::open`]; [`VectorsError::Weight`] for a weight outside 0 to 0.95.
    pub fn open(path: &std::path::Path, weight: Option<f32>) -> Result<Self, VectorsError> {
        if let Some(w) = weight.filter(|w| !(0.0..=0.95).contains(w)) {
            return Err(VectorsError::Weight(w));
        }
        let ranker = Self::new(Arc::new(WordVectors::open(path, DEFAULT_MAX_WORDS)?));
        Ok(match weight {
            Some(w) => ranker.with_weight(w),
            None => ranker,
        })
    }

    /// The vectors it reads with.
    pub fn vectors(&self) -> &WordVectors {
        &self.vectors
    }
}

impl Ranker for VectorRanker {
    fn name(&self) -> &str {
        "word-vectors"
    }

    /// A weight of 0 leaves the lexical results as they are, bit for bit.
    fn rescores(&self) -> bool {
        self.weight > 0.0
    }

    fn pool(&self, wanted: usize) -> usize {
        self.pool.max(wanted)
    }

    fn rescore(&self, query: &str, candidates: &mut [Candidate<'_>]) {
        let Some(q) = self.vectors.text_vector(query) else {
            return;
        };
        let best = candidates
            .iter()
            .map(|c| c.score)
            .filter(|s| s.is_finite())
            .fold(0f32, f32::max);
        if best <= 0.0 {
            return;
        }
        // Only candidates the words found: one scored zero or below is not lifted by meaning.
        for c in candidates
            .iter_mut()
            .filter(|c| c.score > 0.0 && c.score.is_finite())
        {
            let cosine = self.text_vector(c.text).map_or(0.0, |d| {
                q.iter()
                    .zip(d.iter())
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    .max(0.0)
            });
            c.score = (1.0 - self.weight) * c.score / best + self.weight * cosine;
        }
    }
}

impl VectorRanker {
    /// How many texts' vectors are kept: [`CACHE_TEXTS`], fewer when their numbers would
    /// pass [`CACHE_VALUES`].
    fn cache_texts(&self) -> usize {
        (CACHE_VALUES / self.vectors.dims.max(1)).clamp(1, CACHE_TEXTS)
    }

    /// A candidate text's vector, kept for the next search.
    fn text_vector(&self, text: &str) -> Option<Arc<[f32]>> {
        let text = prefix(text);
        let key = (self.keys.hash_one(text), text.len());
        // A poisoned lock only means another search panicked midway: the map is still whole.
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(vector) = cached {
            return vector;
        }
        let vector: Option<Arc<[f32]>> = self.vectors.text_vector(text).map(Arc::from);
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= self.cache_texts() {
            cache.clear();
        }
        cache.insert(key, vector.clone());
        vector
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::RankerRef;

    /// Four words on two axes: cameras, and cooking.
    const SMALL: &str = "\
camera 1.0 0.0 0.1
photography 0.9 0.1 0.0
lens 0.95 0.0 0.2
recipe 0.0 1.0 0.1
soup 0.1 0.9 0.0
";

    fn vectors() -> Arc<WordVectors> {
        Arc::new(WordVectors::read(SMALL.as_bytes(), DEFAULT_MAX_WORDS).unwrap())
    }

    #[test]
    fn a_candidate_about_the_querys_topic_rises_above_a_lexically_better_one() {
        let ranker = RankerRef::new(VectorRanker::new(vectors()));
        let mut pool = vec![
            Candidate {
                doc: 0,
                text: "my soup recipe for the setup party",
                score: 2.0,
            },
            Candidate {
                doc: 1,
                text: "cleaning my camera lens",
                score: 1.0,
            },
        ];
        assert!(ranker.apply("accessories for my photography setup", &mut pool));
        assert_eq!(pool.iter().map(|c| c.doc).collect::<Vec<_>>(), [1, 0]);
        assert!(pool.iter().all(|c| c.score > 0.0));
    }

    #[test]
    fn text_without_vectors_keeps_the_lexical_order() {
        let ranker = RankerRef::new(VectorRanker::new(vectors()));
        let lexical = vec![
            Candidate {
                doc: 0,
                text: "米拉的灯笼",
                score: 3.0,
            },
            Candidate {
                doc: 1,
                text: "灯笼在门口",
                score: 1.0,
            },
        ];
        // The query has no vector: the scores stay.
        let mut pool = lexical.clone();
        ranker.apply("灯笼在哪里", &mut pool);
        assert_eq!(pool, lexical);
        // The candidates have none: the lexical shares decide, in the same order.
        let mut pool = lexical.clone();
        ranker.apply("camera 灯笼", &mut pool);
        assert_eq!(pool.iter().map(|c| c.doc).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn the_first_vector_of_a_word_is_kept_and_rarer_words_weigh_more() {
        let v = WordVectors::read("a 1 0\nb 0 1\na 5 5\n".as_bytes(), 10).unwrap();
        assert_eq!((v.len(), v.dims()), (2, 2));
        // "a" is a stop word; "b" alone gives its own direction.
        assert_eq!(v.text_vector("a b"), Some(vec![0.0, 1.0]));
        assert_eq!(v.text_vector("nothing known"), None);
    }

    #[test]
    fn fasttext_headers_and_word_limits_are_read() {
        let text = "3 2\nlantern 1 0\ncompass 0 1\nrope 1 1\n";
        let v = WordVectors::read(text.as_bytes(), 2).unwrap();
        assert_eq!(v.len(), 2, "only the first two words");
        assert!(v.text_vector("rope").is_none());
        assert!(v.text_vector("compass").is_some());
    }

    #[test]
    fn bad_files_name_the_line_and_never_panic() {
        let err = |text: &str| WordVectors::read(text.as_bytes(), 10).unwrap_err();
        assert_eq!(
            err("a 1 2\nb 1\n"),
            VectorsError::Malformed {
                line: 2,
                reason: "1 numbers where the first vector has 2".into()
            }
        );
        assert!(err("a 1 NaN\n")
            .to_string()
            .contains("\"NaN\" is not a finite"));
        assert!(err("a 1 x\n")
            .to_string()
            .starts_with("word vectors line 1:"));
        assert_eq!(err(""), VectorsError::Empty);
        assert_eq!(err("\n\n"), VectorsError::Empty);
        assert!(err("word\n").to_string().contains("0 numbers"));
        let long = format!("w {}\n", "1 ".repeat(MAX_DIMS * 20));
        assert!(err(&long).to_string().contains("longer than"));
        let wide = format!("w {}\n", "1 ".repeat(MAX_DIMS + 1));
        assert!(err(&wide).to_string().contains("a vector has 1 to 1024"));
        assert!(WordVectors::read(&[0xff, b' ', b'1', b'\n'][..], 10)
            .unwrap_err()
            .to_string()
            .contains("not UTF-8"));
    }

    #[test]
    fn kept_vectors_give_the_same_scores_and_the_cache_stays_bounded() {
        let ranker = VectorRanker::new(vectors());
        let texts: Vec<String> = (0..CACHE_TEXTS + 10)
            .map(|i| format!("camera {i}"))
            .collect();
        let run = || {
            let mut pool: Vec<Candidate<'_>> = texts
                .iter()
                .enumerate()
                .map(|(i, t)| Candidate {
                    doc: i as u32,
                    text: t,
                    score: 1.0 + i as f32,
                })
                .collect();
            ranker.rescore("photography", &mut pool);
            pool.iter().map(|c| c.score.to_bits()).collect::<Vec<_>>()
        };
        let first = run();
        assert!(ranker.cache.lock().unwrap().len() <= CACHE_TEXTS);
        assert_eq!(run(), first, "scores from kept vectors are the same bits");
        let fresh = VectorRanker::new(vectors());
        let mut one = vec![Candidate {
            doc: 0,
            text: &texts[0],
            score: 1.0,
        }];
        fresh.rescore("photography", &mut one);
        let mut again = one.clone();
        again[0].score = 1.0;
        ranker.rescore("photography", &mut again);
        assert_eq!(one, again);
    }

    #[test]
    fn reading_and_texts_are_bounded_by_us() {
        // One word repeated forever: the read stops after twice the words it may keep.
        let repeated = "w 1 0\n".repeat(1_000);
        let v = WordVectors::read(repeated.as_bytes(), 10).unwrap();
        assert_eq!(v.len(), 1);
        // A text's vector reads only its first bytes: a known word past them is not seen.
        let far = format!("{} camera", ".".repeat(MAX_TEXT_BYTES));
        assert_eq!(vectors().text_vector(&far), None);
        assert!(vectors().text_vector(&far[MAX_TEXT_BYTES - 2..]).is_some());
        assert_eq!(prefix("é"), "é");
        assert_eq!(prefix(&"é".repeat(MAX_TEXT_BYTES)).len(), MAX_TEXT_BYTES);
        // The ranker's Debug does not print what it keeps.
        let r = VectorRanker::new(vectors());
        let mut pool = vec![Candidate {
            doc: 0,
            text: "camera",
            score: 1.0,
        }];
        r.rescore("photography", &mut pool);
        assert!(!format!("{r:?}").contains("cache"));
    }

    #[test]
    fn a_byte_order_mark_and_words_with_spaces_are_read() {
        // glove.840B's ". . ." is a word with spaces; an editor's BOM opens the file.
        let v = WordVectors::read("\u{feff}a 1 0\n. . . 0 1\nb  c 1 1 \n".as_bytes(), 10).unwrap();
        assert_eq!(v.dims(), 2);
        assert!(
            v.rows.contains_key("a"),
            "the BOM is not part of the first word"
        );
        assert!(v.rows.contains_key(". . ."));
        assert!(v.rows.contains_key("b c"));
        // A word with spaces still needs all its numbers: a short line is named.
        assert!(WordVectors::read("a 1 0\nb c 1\n".as_bytes(), 10)
            .unwrap_err()
            .to_string()
            .starts_with("word vectors line 2: \"c\" is not a finite number"));
    }

    #[test]
    fn kept_vectors_are_bounded_by_their_numbers_and_keyed_per_ranker() {
        let wide = format!("w {}\n", "1 ".repeat(MAX_DIMS));
        let wide = VectorRanker::new(Arc::new(WordVectors::read(wide.as_bytes(), 1).unwrap()));
        assert_eq!(wide.cache_texts(), CACHE_VALUES / MAX_DIMS);
        assert_eq!(VectorRanker::new(vectors()).cache_texts(), CACHE_TEXTS);
        let texts: Vec<String> = (0..wide.cache_texts() + 5)
            .map(|i| format!("w {i}"))
            .collect();
        let mut pool: Vec<Candidate<'_>> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| Candidate {
                doc: i as u32,
                text: t,
                score: 1.0,
            })
            .collect();
        wide.rescore("w", &mut pool);
        assert!(wide.cache.lock().unwrap().len() <= wide.cache_texts());
        // Two rankers key their kept texts differently: a collision cannot be planned.
        let (a, b) = (VectorRanker::new(vectors()), VectorRanker::new(vectors()));
        assert_ne!(a.keys.hash_one("camera"), b.keys.hash_one("camera"));
    }

    #[test]
    fn a_candidate_the_words_did_not_score_is_not_lifted_by_meaning() {
        let mut pool = vec![
            Candidate {
                doc: 0,
                text: "cooking",
                score: 2.0,
            },
            Candidate {
                doc: 1,
                text: "camera lens",
                score: 0.0,
            },
            Candidate {
                doc: 2,
                text: "camera",
                score: -1.0,
            },
        ];
        VectorRanker::new(vectors()).rescore("photography", &mut pool);
        assert_eq!(pool[1].score, 0.0);
        assert_eq!(pool[2].score, -1.0);
        assert!(pool[0].score > 0.0);
    }

    #[test]
    fn weights_are_kept_within_bounds() {
        let r = VectorRanker::new(vectors()).with_weight(f32::NAN);
        assert_eq!(r.weight, DEFAULT_WEIGHT);
        assert_eq!(VectorRanker::new(vectors()).with_weight(7.0).weight, 0.95);
        assert_eq!(VectorRanker::new(vectors()).with_pool(0).pool(10), 10);
    }
}
