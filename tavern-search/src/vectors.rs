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

use crate::rank::{best_score, Candidate, Ranker};
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
/// Lexical candidates handed to the ranker together, by default (per search, or per tier of
/// a memory search).
pub const DEFAULT_POOL: usize = 100;
/// The query words [`Closeness::BestMatch`] matches, at most: the heaviest ones (a query
/// is rarely longer; a pasted page is matched by its rarest words).
pub const MAX_MATCH_WORDS: usize = 32;
/// Multiply-adds [`Closeness::BestMatch`] spends per call comparing candidate words with
/// the query's (64 Mi, tens of milliseconds; a memory search paging deep calls once per
/// tier of candidates, at most ten times with the default pool). Each distinct candidate
/// word costs the query's words (at most [`MAX_MATCH_WORDS`]) times the dimensions: at 50 dimensions and 32 query
/// words about 40,000 distinct words fit (a default pool of 100 texts has at most 25,600);
/// at 300 dimensions about 7,000. Past it, the candidates handed over last find words of
/// theirs left uncompared (counted as no match).
pub const MATCH_BUDGET: usize = 64 * 1024 * 1024;

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
    /// One over each row's length (0 for a vector of zeros): cosines without a square root.
    inv_norms: Vec<f32>,
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
    /// Each line is `word v1 … vN`, N set by the first vector. A line with more fields is a
    /// word with spaces (glove.840B's ". . .") when a field before the last N is not a
    /// number; when they all are, the line cannot be told from a vector with numbers too
    /// many and is refused ("route 66" among GloVe's words would be: cut such lines out).
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
            inv_norms: Vec::new(),
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
            // Only when something before them is not a number, though: a line with a number
            // too many is a broken vector, not a word.
            let split = match fields.len().checked_sub(out.dims) {
                Some(split)
                    if out.dims > 0
                        && split > 1
                        && fields[1..split].iter().any(|f| f.parse::<f32>().is_err()) =>
                {
                    split
                }
                _ => 1,
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
        out.inv_norms = out
            .values
            .chunks_exact(out.dims)
            .map(|v| {
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 && norm.is_finite() {
                    1.0 / norm
                } else {
                    0.0
                }
            })
            .collect();
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
        self.mean_vector(&self.weighted_rows(text))
    }

    /// The normalized weighted sum of the vectors of `rows`; `None` when there is none.
    fn mean_vector(&self, rows: &[(u32, f32)]) -> Option<Vec<f32>> {
        let mut sum = vec![0f32; self.dims];
        let mut found = false;
        for &(row, weight) in rows {
            let Some(vector) = self.row(row) else {
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

impl WordVectors {
    /// The vector of the word in `row`.
    fn row(&self, row: u32) -> Option<&[f32]> {
        let start = row as usize * self.dims;
        self.values.get(start..start + self.dims)
    }

    /// The rows of `text`'s words that have a vector (lower-cased, stop words left out, at
    /// most [`MAX_TEXT_WORDS`] words of its first [`MAX_TEXT_BYTES`] read) and each one's
    /// weight: the log of its rank in the file, which is by frequency, so rarer words weigh
    /// more.
    fn weighted_rows(&self, text: &str) -> Vec<(u32, f32)> {
        let mut out: Vec<(u32, f32)> = Vec::new();
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
            if let Some(&row) = self.rows.get(word) {
                out.push((row, (2.0 + row as f32 / 50.0).ln()));
            }
        }
        out
    }
}

/// The `most` heaviest of `rows` (all of them when there are no more), in their order.
fn heaviest(rows: &[(u32, f32)], most: usize) -> Vec<(u32, f32)> {
    if rows.len() <= most {
        return rows.to_vec();
    }
    let mut by_weight: Vec<usize> = (0..rows.len()).collect();
    by_weight.sort_by(|&a, &b| rows[b].1.total_cmp(&rows[a].1).then(a.cmp(&b)));
    by_weight.truncate(most);
    by_weight.sort_unstable();
    by_weight.into_iter().map(|i| rows[i]).collect()
}

/// The query side of [`Closeness::BestMatch`]: the query's distinct words as unit vectors
/// with their weights, and each candidate word's cosines with them, worked out once per
/// search (the pool's texts share many words).
struct BestMatch<'v> {
    vectors: &'v WordVectors,
    /// The query words' unit vectors, one after another.
    units: Vec<f32>,
    weights: Vec<f32>,
    /// A candidate word's row → where its cosines with the query words start in `cosines`.
    seen: FxHashMap<u32, usize>,
    cosines: Vec<f32>,
    /// Multiply-adds left for comparing new candidate words ([`MATCH_BUDGET`]).
    budget: usize,
}

impl<'v> BestMatch<'v> {
    fn new(vectors: &'v WordVectors, query: &[(u32, f32)], budget: usize) -> Self {
        let mut units = Vec::with_capacity(query.len() * vectors.dims);
        let mut weights = Vec::with_capacity(query.len());
        for &(row, weight) in query {
            let (Some(v), Some(&inv)) = (vectors.row(row), vectors.inv_norms.get(row as usize))
            else {
                continue;
            };
            units.extend(v.iter().map(|x| x * inv));
            weights.push(weight);
        }
        Self {
            vectors,
            units,
            weights,
            seen: FxHashMap::default(),
            cosines: Vec::new(),
            budget,
        }
    }

    /// For each query word the cosine of the closest of `words` (distinct rows), weighted:
    /// 0 to 1 (a word pointing away counts as no match). Past [`MATCH_BUDGET`] a word not
    /// compared yet counts as no match.
    fn score(&mut self, words: &[u32]) -> f32 {
        let n = self.weights.len();
        let total: f32 = self.weights.iter().sum();
        if n == 0 || words.is_empty() || total <= 0.0 {
            return 0.0;
        }
        let mut best = vec![0f32; n];
        for &word in words {
            let at = match self.seen.get(&word) {
                Some(&at) => at,
                None if self.budget < n * self.vectors.dims => continue,
                None => {
                    self.budget -= n * self.vectors.dims;
                    let at = self.cosines.len();
                    let dims = self.vectors.dims;
                    let inv = self
                        .vectors
                        .inv_norms
                        .get(word as usize)
                        .copied()
                        .unwrap_or(0.0);
                    match self.vectors.row(word) {
                        Some(v) => self.cosines.extend(
                            self.units
                                .chunks_exact(dims)
                                .map(|u| u.iter().zip(v).map(|(a, b)| a * b).sum::<f32>() * inv),
                        ),
                        None => self.cosines.extend(std::iter::repeat_n(0.0, n)),
                    }
                    self.seen.insert(word, at);
                    at
                }
            };
            for (b, c) in best.iter_mut().zip(&self.cosines[at..at + n]) {
                *b = b.max(*c);
            }
        }
        best.iter()
            .zip(&self.weights)
            .map(|(b, w)| b * w)
            .sum::<f32>()
            / total
    }
}

/// How a [`VectorRanker`] reads a candidate's closeness to the query from word vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Closeness {
    /// The cosine of the two texts' weighted mean vectors: the gist of a long text.
    Mean,
    /// For each query word, the cosine of the text's closest word, weighted: a text that
    /// answers each query word somewhere ("photography" → "lens"), however long it is.
    BestMatch,
    /// The mean of both (the default: with the pool's idf, the best of the three on
    /// LongMemEval's history search in every column and on memory NDCG; see
    /// `docs/PERFORMANCE.md`).
    #[default]
    Both,
}

/// Candidate texts whose vectors a [`VectorRanker`] keeps at most; past this (or past
/// [`CACHE_VALUES`]) the kept ones are let go.
pub const CACHE_TEXTS: usize = 65_536;

/// Numbers a [`VectorRanker`] keeps in all (64 MiB): a kept text's mean vector (one number
/// per dimension) and its distinct words (one each). At 50 dimensions [`CACHE_TEXTS`]
/// texts of up to 206 distinct words fit; at 1,024 about 16,000 texts.
pub const CACHE_VALUES: usize = 16 * 1024 * 1024;

/// The first [`MAX_TEXT_BYTES`] of `text`, cut at a character boundary.
fn prefix(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What a ranker keeps of a candidate text.
#[derive(Clone)]
struct Kept {
    /// Its weighted mean vector, normalized; `None` when no word has a vector.
    mean: Option<Arc<[f32]>>,
    /// Its distinct words' rows, sorted.
    words: Arc<[u32]>,
}

/// Candidate texts by (keyed hash, length) of the text, and the numbers kept in all.
#[derive(Default)]
struct KeptTexts {
    texts: FxHashMap<(u64, usize), Kept>,
    values: usize,
}

/// A ranker that blends each lexical candidate's score (as a share of the best one's) with
/// how close its text is to the query: `(1 − weight) × lexical / best + weight ×
/// closeness`, where closeness (0 to 1) is read as [`Closeness`] says — by default the mean
/// of the mean vectors' cosine (at least 0) and the weighted best match of each query word.
/// Query words are weighted by their rank in the vectors file and, with
/// [`VectorRanker::with_pool_idf`] (the default), by how few of the candidates hold them.
/// A query with no vector keeps the lexical order; a candidate scored zero or below is
/// never lifted.
///
/// The same messages and memories come back as candidates search after search, so what a
/// text needs (its mean vector and distinct words) is kept for recent texts (at most
/// [`CACHE_TEXTS`] texts and [`CACHE_VALUES`] numbers), found by the text's length and a hash
/// keyed at random per ranker, so nobody who can write a memory can make two texts share a
/// vector. A search then costs, per candidate, a lookup, a dot product and a pass over its
/// words; each distinct candidate word is compared with at most [`MAX_MATCH_WORDS`] query
/// words once per call, within [`MATCH_BUDGET`]; and the ranker is handed at most
/// [`crate::rank::POOL_MAX`] candidates per search.
pub struct VectorRanker {
    vectors: Arc<WordVectors>,
    weight: f32,
    pool: usize,
    closeness: Closeness,
    pool_idf: bool,
    /// [`MATCH_BUDGET`] (a test makes it small).
    match_budget: usize,
    keys: RandomState,
    cache: Mutex<KeptTexts>,
}

impl std::fmt::Debug for VectorRanker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the kept vectors: thousands of them.
        f.debug_struct("VectorRanker")
            .field("vectors", &self.vectors)
            .field("weight", &self.weight)
            .field("pool", &self.pool)
            .field("closeness", &self.closeness)
            .field("pool_idf", &self.pool_idf)
            .finish()
    }
}

impl Clone for VectorRanker {
    fn clone(&self) -> Self {
        Self {
            vectors: self.vectors.clone(),
            weight: self.weight,
            pool: self.pool,
            closeness: self.closeness,
            pool_idf: self.pool_idf,
            match_budget: self.match_budget,
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
            closeness: Closeness::Both,
            pool_idf: true,
            match_budget: MATCH_BUDGET,
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

    /// How closeness is read ([`Closeness::Both`] by default).
    #[must_use]
    pub fn with_closeness(mut self, closeness: Closeness) -> Self {
        self.closeness = closeness;
        self
    }

    /// Whether query words weigh less the more of the pool's candidates hold them (on by
    /// default): the words every candidate shares ("suggest", "recommend") are what the
    /// lexical search already found them by, so the vectors listen to the rest.
    #[must_use]
    pub fn with_pool_idf(mut self, on: bool) -> Self {
        self.pool_idf = on;
        self
    }

    /// How many lexical candidates to rank together (at most [`crate::rank::POOL_MAX`] are
    /// handed over whatever this says): per search for history search, per tier for memory
    /// search, whose tiers are never smaller than 100.
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

    /// The share of the final score that comes from the vectors.
    pub fn weight(&self) -> f32 {
        self.weight
    }

    /// How closeness is read.
    pub fn closeness(&self) -> Closeness {
        self.closeness
    }

    /// Whether query words are weighted by the pool's idf.
    pub fn pool_idf(&self) -> bool {
        self.pool_idf
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
        let best = best_score(candidates);
        if best <= 0.0 {
            return;
        }
        let mut query_rows = self.vectors.weighted_rows(query);
        if query_rows.is_empty() {
            return;
        }
        query_rows.sort_unstable_by_key(|&(row, _)| row);
        query_rows.dedup_by(|next, first| {
            let same = next.0 == first.0;
            if same {
                first.1 += next.1;
            }
            same
        });
        // Only candidates the words found: one scored zero or below is not lifted by meaning.
        let kept: Vec<Option<Kept>> = candidates
            .iter()
            .map(|c| (c.score > 0.0 && c.score.is_finite()).then(|| self.kept(c.text)))
            .collect();
        if self.pool_idf {
            let n = kept.iter().flatten().count() as f32;
            for (row, weight) in &mut query_rows {
                let df = kept
                    .iter()
                    .flatten()
                    .filter(|k| k.words.binary_search(row).is_ok())
                    .count() as f32;
                *weight *= ((n + 1.0) / (df + 0.5)).ln().max(0.1);
            }
        }
        let Some(q) = self.vectors.mean_vector(&query_rows) else {
            return;
        };
        let mut matcher = BestMatch::new(
            &self.vectors,
            &heaviest(&query_rows, MAX_MATCH_WORDS),
            self.match_budget,
        );
        for (c, kept) in candidates.iter_mut().zip(kept) {
            let Some(kept) = kept else { continue };
            let mean = || {
                kept.mean.as_ref().map_or(0.0, |d| {
                    q.iter()
                        .zip(d.iter())
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        .max(0.0)
                })
            };
            let mut matched = || matcher.score(&kept.words);
            let cosine = match self.closeness {
                Closeness::Mean => mean(),
                Closeness::BestMatch => matched(),
                Closeness::Both => (mean() + matched()) / 2.0,
            };
            c.score = (1.0 - self.weight) * c.score / best + self.weight * cosine;
        }
    }
}

impl VectorRanker {
    /// What is kept of a candidate text (for the next search too).
    fn kept(&self, text: &str) -> Kept {
        let text = prefix(text);
        let key = (self.keys.hash_one(text), text.len());
        // A poisoned lock only means another search panicked midway: the map is still whole.
        let lock = || {
            self.cache
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some(kept) = lock().texts.get(&key).cloned() {
            return kept;
        }
        let rows = self.vectors.weighted_rows(text);
        let mut words: Vec<u32> = rows.iter().map(|&(row, _)| row).collect();
        words.sort_unstable();
        words.dedup();
        let kept = Kept {
            mean: self.vectors.mean_vector(&rows).map(Arc::from),
            words: Arc::from(words),
        };
        let size = kept.mean.as_ref().map_or(0, |m| m.len()) + kept.words.len();
        let mut cache = lock();
        if cache.texts.len() >= CACHE_TEXTS || cache.values + size > CACHE_VALUES {
            cache.texts.clear();
            cache.values = 0;
        }
        if cache.texts.insert(key, kept.clone()).is_none() {
            cache.values += size;
        }
        kept
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

    /// A pool over `texts`, the i-th scored `score(i)`.
    fn candidates<S: AsRef<str>>(texts: &[S], score: impl Fn(usize) -> f32) -> Vec<Candidate<'_>> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| Candidate {
                doc: i as u32,
                text: t.as_ref(),
                score: score(i),
            })
            .collect()
    }

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
            let mut pool = candidates(&texts, |i| 1.0 + i as f32);
            ranker.rescore("photography", &mut pool);
            pool.iter().map(|c| c.score.to_bits()).collect::<Vec<_>>()
        };
        let first = run();
        assert!(ranker.cache.lock().unwrap().texts.len() <= CACHE_TEXTS);
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
        let debug = format!("{r:?}");
        assert!(!debug.contains("cache"), "{debug}");
        assert!(debug.contains("closeness: Both, pool_idf: true"), "{debug}");
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
        // A line with a number too many is broken, not a word "b 1".
        assert!(WordVectors::read("a 1 0\nb 1 1 1\n".as_bytes(), 10)
            .unwrap_err()
            .to_string()
            .starts_with("word vectors line 2: 3 numbers where the first vector has 2"));
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
        let fit = CACHE_VALUES / (MAX_DIMS + 1);
        let texts: Vec<String> = (0..fit + 5).map(|i| format!("w {i}")).collect();
        let mut pool = candidates(&texts, |_| 1.0);
        wide.rescore("w", &mut pool);
        let cache = wide.cache.lock().unwrap();
        assert!(cache.values <= CACHE_VALUES, "{}", cache.values);
        assert!(cache.texts.len() <= fit, "{}", cache.texts.len());
        assert!(!cache.texts.is_empty());
        drop(cache);
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
    fn best_match_reads_each_query_word_against_the_texts_closest_word() {
        let v = vectors();
        let cosine = |a: &str, b: &str| {
            let (a, b) = (v.row(v.rows[a]).unwrap(), v.row(v.rows[b]).unwrap());
            let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            let norm = |x: &[f32]| x.iter().map(|y| y * y).sum::<f32>().sqrt();
            dot / (norm(a) * norm(b))
        };
        let words = |text: &str| {
            let mut w: Vec<u32> = v.weighted_rows(text).iter().map(|r| r.0).collect();
            w.sort_unstable();
            w.dedup();
            w
        };
        let mut m = BestMatch::new(&v, &v.weighted_rows("photography"), MATCH_BUDGET);
        // A long text about soup holding one lens: the lens answers "photography" whole.
        let long = words("soup recipe soup recipe lens");
        let got = m.score(&long);
        assert!((got - cosine("photography", "lens")).abs() < 1e-5, "{got}");
        assert!(got > 0.9);
        // Its gist is soup: the mean vector sees little of the lens.
        let q = v.text_vector("photography").unwrap();
        let d = v.text_vector("soup recipe soup recipe lens").unwrap();
        let mean: f32 = q.iter().zip(&d).map(|(a, b)| a * b).sum();
        assert!(mean < got, "{mean} {got}");
        // Cosines of a word seen before are reused: the same score again.
        assert_eq!(m.score(&long).to_bits(), got.to_bits());
        assert_eq!(m.score(&[]), 0.0);
        assert_eq!(BestMatch::new(&v, &[], MATCH_BUDGET).score(&long), 0.0);
        // Past the budget a word not yet compared counts as no match; one compared before
        // still counts.
        let mut m = BestMatch::new(&v, &v.weighted_rows("photography"), MATCH_BUDGET);
        m.budget = v.dims();
        let soup = m.score(&words("soup"));
        assert!(soup > 0.0 && soup < 0.3, "{soup}");
        assert_eq!(m.score(&words("lens")), 0.0);
        assert_eq!(m.score(&words("soup lens")), soup);
        let mut m = BestMatch::new(&v, &v.weighted_rows("photography"), MATCH_BUDGET);
        m.budget = 2 * v.dims();
        assert!(m.score(&words("soup lens")) > 0.9);
    }

    #[test]
    fn a_search_keeps_within_its_budget_and_the_querys_heaviest_words() {
        let best_match = |budget: usize| {
            let mut r = VectorRanker::new(vectors())
                .with_closeness(Closeness::BestMatch)
                .with_pool_idf(false);
            r.match_budget = budget;
            let mut pool = candidates(&["soup", "lens"], |_| 1.0);
            r.rescore("photography", &mut pool);
            pool[1].score
        };
        // The lens answers "photography" — unless the soup before it spent the budget.
        assert!(best_match(MATCH_BUDGET) > 0.9);
        assert_eq!(best_match(3), 0.5, "the lexical share alone");

        // Forty words on forty axes; the query names them all, the first (lightest) eight
        // are left out of best match.
        let file: String = (0..40)
            .map(|i| {
                let axis: Vec<&str> = (0..40).map(|j| if i == j { "1" } else { "0" }).collect();
                format!("w{i} {}\n", axis.join(" "))
            })
            .collect();
        let v = Arc::new(WordVectors::read(file.as_bytes(), DEFAULT_MAX_WORDS).unwrap());
        let query: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
        let r = VectorRanker::new(v)
            .with_closeness(Closeness::BestMatch)
            .with_pool_idf(false);
        let mut pool = candidates(&["w0", "w39"], |_| 1.0);
        r.rescore(&query.join(" "), &mut pool);
        assert_eq!(pool[0].score, 0.5, "w0 is not among the heaviest");
        assert!(pool[1].score > 0.5);
    }

    #[test]
    fn best_match_takes_the_querys_heaviest_words() {
        let rows: Vec<(u32, f32)> = (0..40).map(|i| (i, (i % 7) as f32)).collect();
        let kept = heaviest(&rows, MAX_MATCH_WORDS);
        assert_eq!(kept.len(), MAX_MATCH_WORDS);
        // The 8 lightest are left out (the six of weight 0, two of weight 1); the rest keep
        // their order.
        assert!(kept.iter().all(|r| r.1 >= 1.0));
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(heaviest(&rows[..5], MAX_MATCH_WORDS), rows[..5].to_vec());
    }

    #[test]
    fn a_query_word_every_candidate_holds_weighs_less_with_pool_idf() {
        // Every candidate was found by "soup"; one also holds a lens, which the query's
        // "camera" is about.
        let texts = ["soup recipe", "soup lens", "soup", "soup recipe again"];
        let rescored = |pool_idf: bool| {
            let mut pool = candidates(&texts, |_| 1.0);
            VectorRanker::new(vectors())
                .with_closeness(Closeness::Mean)
                .with_pool_idf(pool_idf)
                .rescore("soup camera", &mut pool);
            pool
        };
        let (plain, idf) = (rescored(false), rescored(true));
        let lead = |pool: &[Candidate<'_>]| pool[1].score - pool[0].score;
        assert!(lead(&idf) > lead(&plain), "{plain:?} {idf:?}");
        assert!(idf[1].score > idf[0].score);
    }

    #[test]
    fn weights_are_kept_within_bounds() {
        let r = VectorRanker::new(vectors()).with_weight(f32::NAN);
        assert_eq!(r.weight, DEFAULT_WEIGHT);
        assert_eq!(VectorRanker::new(vectors()).with_weight(7.0).weight, 0.95);
        assert_eq!(VectorRanker::new(vectors()).with_pool(0).pool(10), 10);
    }
}
