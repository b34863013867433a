//! Sentence vectors through the ranker seam: where word vectors ([`crate::vectors`]) read a
//! text word by word, a sentence encoder reads it whole — "activities in the evening" is
//! close to "winding down by 9:30 pm" though no word is shared. An [`Encoder`] turns texts
//! into unit vectors (a small transformer, a table of vectors computed elsewhere, a host's
//! embedding service); [`SentenceRanker`] blends each lexical candidate's score with how
//! close its vector is to the query's, over the pool the lexical search found, so memory,
//! history and lore search gain it at once and its work stays bounded by the pool.
//!
//! Encoding is the expensive part (a transformer spends about a billion multiply-adds on a
//! paragraph), so the ranker keeps the vectors of recent texts and asks the encoder only for
//! the ones it has not seen, all of one call of the ranker (a search, or a tier of a memory
//! search) at once.

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use crate::rank::{best_score, Candidate, Ranker};

/// Bytes of a text an encoder is handed, at most: a long text's first ones (a sentence
/// encoder reads a few hundred words; the rest would be cut by it anyway).
pub const MAX_ENCODED_BYTES: usize = 4 * 1024;
/// Texts whose vectors a [`SentenceRanker`] keeps at most.
pub const CACHE_TEXTS: usize = 65_536;
/// Numbers a [`SentenceRanker`] keeps in all (64 MiB of `f32`): 43,690 texts at 384
/// dimensions.
pub const CACHE_VALUES: usize = 16 * 1024 * 1024;
/// The share of a candidate's final score that comes from its sentence vector, by default
/// (with all-MiniLM-L6-v2 the better of 0.5 and 0.6 on LongMemEval's memory search, holding
/// LoCoMo's floors; see `docs/PERFORMANCE.md`).
pub const DEFAULT_WEIGHT: f32 = 0.6;
/// Lexical candidates handed to the ranker together, by default.
pub const DEFAULT_POOL: usize = 100;

/// Why an encoder gave no vectors.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum EncodeError {
    /// The encoder cannot encode this text (a table that does not hold it); the encoder
    /// puts as much of the text here as it chooses (a few words name it).
    #[error("no sentence vector for the text {0:?}")]
    Unknown(String),
    /// The encoder failed.
    #[error("sentence encoder failed: {0}")]
    Failed(String),
}

/// Turns texts into vectors of one dimension each.
///
/// Contract: [`Encoder::encode`] returns one vector per text, in order, each of
/// [`Encoder::dims`] finite numbers (not necessarily unit length: the ranker normalizes);
/// it is deterministic for the same text and never panics. It is handed at most
/// [`crate::rank::POOL_MAX`] + 1 texts per call, each at most [`MAX_ENCODED_BYTES`].
pub trait Encoder: Send + Sync + fmt::Debug {
    /// A short name for logs and benchmarks (`all-minilm-l6-v2`).
    fn name(&self) -> &str;

    /// How many numbers each vector has.
    fn dims(&self) -> usize;

    /// The texts' vectors, in order.
    ///
    /// # Errors
    /// [`EncodeError`] when any text cannot be encoded; the ranker then keeps the lexical
    /// order for that search.
    fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncodeError>;
}

/// The first [`MAX_ENCODED_BYTES`] of `text` without surrounding white space, cut at a
/// character boundary.
pub fn encoded_part(text: &str) -> &str {
    let text = text.trim_start();
    let mut end = text.len().min(MAX_ENCODED_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].trim_end()
}

/// Kept vectors by (keyed hash, length) of the encoded text, and the numbers kept in all.
#[derive(Default)]
struct KeptVectors {
    vectors: FxHashMap<(u64, usize), Arc<[f32]>>,
    values: usize,
    /// Texts some call is encoding now: another call that needs one waits for that
    /// encoding instead of doing it again (a model asking two searches at once over the same
    /// new memories encodes them once).
    in_flight: HashSet<(u64, usize)>,
    /// How many calls found a text they need still being encoded by another, and waited
    /// (what the tests watch).
    waited: usize,
}

/// A ranker that blends each lexical candidate's score (as a share of the best one's) with
/// its sentence vector's cosine to the query's: `(1 − weight) × lexical / best + weight ×
/// max(cosine, 0)`. A candidate scored zero or below is never lifted; when the encoder
/// fails, the search keeps its lexical order; a vector that breaks the contract (the wrong
/// length, a number that is not finite) counts as no closeness and is not kept.
///
/// Vectors of recent texts are kept (at most [`CACHE_TEXTS`] texts and [`CACHE_VALUES`]
/// numbers), found by the text's length and a hash keyed at random per ranker, so nobody
/// who can write a memory can make two texts share a vector.
pub struct SentenceRanker {
    encoder: Arc<dyn Encoder>,
    weight: f32,
    pool: usize,
    keys: RandomState,
    cache: Mutex<KeptVectors>,
    /// Signalled whenever encoded texts leave `in_flight`.
    encoded: Condvar,
}

impl fmt::Debug for SentenceRanker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentenceRanker")
            .field("encoder", &self.encoder)
            .field("weight", &self.weight)
            .field("pool", &self.pool)
            .finish()
    }
}

impl SentenceRanker {
    /// A ranker over `encoder` with [`DEFAULT_WEIGHT`] and [`DEFAULT_POOL`].
    pub fn new(encoder: Arc<dyn Encoder>) -> Self {
        Self {
            encoder,
            weight: DEFAULT_WEIGHT,
            pool: DEFAULT_POOL,
            keys: RandomState::new(),
            cache: Mutex::default(),
            encoded: Condvar::new(),
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

    /// How many lexical candidates to rank together (at most [`crate::rank::POOL_MAX`]).
    #[must_use]
    pub fn with_pool(mut self, pool: usize) -> Self {
        self.pool = pool.max(1);
        self
    }

    /// The encoder it reads with.
    pub fn encoder(&self) -> &dyn Encoder {
        &*self.encoder
    }

    /// The share of the final score that comes from the vectors.
    pub fn weight(&self) -> f32 {
        self.weight
    }

    /// The unit vectors of `texts` (kept ones reused, the rest encoded in one call); `None`
    /// when the encoder failed or gave the wrong number of vectors, and `None` for a text
    /// whose vector breaks the contract.
    fn vectors(&self, texts: &[&str]) -> Option<Vec<Option<Arc<[f32]>>>> {
        let keys: Vec<(u64, usize)> = texts
            .iter()
            .map(|t| (self.keys.hash_one(t), t.len()))
            .collect();
        let mut out: Vec<Option<Arc<[f32]>>> = vec![None; texts.len()];
        // Texts to encode here (claimed), and texts another call is encoding.
        let (mut missing, mut awaited) = (Vec::new(), Vec::new());
        {
            let mut cache = self.lock();
            for (i, key) in keys.iter().enumerate() {
                if let Some(v) = cache.vectors.get(key) {
                    out[i] = Some(v.clone());
                } else if cache.in_flight.contains(key) {
                    awaited.push(i);
                } else if cache.in_flight.insert(*key) {
                    missing.push(i);
                } else {
                    // The same text twice in one call: the first claim encodes it.
                    awaited.push(i);
                }
            }
        }
        let encoded = if missing.is_empty() {
            Some(())
        } else {
            let claims = Claims {
                ranker: self,
                keys: missing.iter().map(|&i| keys[i]).collect(),
            };
            let asked: Vec<&str> = missing.iter().map(|&i| texts[i]).collect();
            let vectors = self.encoder.encode(&asked).ok();
            let mut cache = self.lock();
            let kept = vectors
                .filter(|v| v.len() == asked.len())
                .map(|v| self.keep(&mut cache, &keys, &missing, v, &mut out));
            claims.release(&mut cache);
            kept
        };
        // This call's own encoding failed: it keeps the lexical order whatever others encode.
        encoded?;
        if !awaited.is_empty() {
            let mut cache = self.lock();
            if awaited.iter().any(|&i| cache.in_flight.contains(&keys[i])) {
                cache.waited += 1;
            }
            while awaited.iter().any(|&i| cache.in_flight.contains(&keys[i])) {
                cache = self
                    .encoded
                    .wait(cache)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            let mut again = Vec::new();
            for &i in &awaited {
                match cache.vectors.get(&keys[i]) {
                    Some(v) => out[i] = Some(v.clone()),
                    None if out[i].is_none() => again.push(i),
                    None => {}
                }
            }
            drop(cache);
            // The other call failed, or its vectors were let go already: encoded here (not
            // claimed: nothing waits for these).
            if !again.is_empty() {
                let asked: Vec<&str> = again.iter().map(|&i| texts[i]).collect();
                let vectors = self.encoder.encode(&asked).ok()?;
                if vectors.len() != asked.len() {
                    return None;
                }
                let mut cache = self.lock();
                self.keep(&mut cache, &keys, &again, vectors, &mut out);
            }
        }
        Some(out)
    }

    /// A poisoned lock only means another search panicked midway: the map is still whole.
    fn lock(&self) -> MutexGuard<'_, KeptVectors> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps the vectors encoded for `texts[at[k]]` and puts them in `out`.
    fn keep(
        &self,
        cache: &mut KeptVectors,
        keys: &[(u64, usize)],
        at: &[usize],
        encoded: Vec<Vec<f32>>,
        out: &mut [Option<Arc<[f32]>>],
    ) {
        let dims = self.encoder.dims();
        // Full: emptied before this call's vectors go in, never halfway through them.
        if cache.vectors.len() + at.len() > CACHE_TEXTS
            || cache.values + at.len() * dims > CACHE_VALUES
        {
            cache.vectors.clear();
            cache.values = 0;
        }
        for (&i, v) in at.iter().zip(encoded) {
            if v.len() != dims || v.iter().any(|x| !x.is_finite()) {
                continue;
            }
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let unit: Option<Arc<[f32]>> =
                (norm > 0.0).then(|| v.iter().map(|x| x / norm).collect());
            if let Some(unit) = &unit {
                if cache.vectors.len() < CACHE_TEXTS
                    && cache.values + dims <= CACHE_VALUES
                    && cache.vectors.insert(keys[i], unit.clone()).is_none()
                {
                    cache.values += dims;
                }
            }
            out[i] = unit;
        }
    }
}

/// Texts a call claimed to encode: released (and the waiting calls woken) when the call is
/// done with them, or when it unwinds, so a panicking encoder leaves no call waiting.
struct Claims<'a> {
    ranker: &'a SentenceRanker,
    keys: Vec<(u64, usize)>,
}

impl Claims<'_> {
    fn release(mut self, cache: &mut KeptVectors) {
        for key in std::mem::take(&mut self.keys) {
            cache.in_flight.remove(&key);
        }
        self.ranker.encoded.notify_all();
    }
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut cache = self.ranker.lock();
        for key in &self.keys {
            cache.in_flight.remove(key);
        }
        self.ranker.encoded.notify_all();
    }
}

impl Ranker for SentenceRanker {
    fn name(&self) -> &str {
        "sentence-vectors"
    }

    /// A weight of 0 leaves the lexical results as they are, bit for bit.
    fn rescores(&self) -> bool {
        self.weight > 0.0
    }

    fn pool(&self, wanted: usize) -> usize {
        self.pool.max(wanted)
    }

    fn prepares(&self) -> bool {
        true
    }

    /// Encodes the query and those of `texts` not kept yet, in one call of the encoder, and
    /// returns a ranker that ranks with these vectors alone and never calls the encoder: a
    /// candidate it was not handed counts as not close, and when the encoder failed (or no
    /// text was handed) it keeps the lexical order.
    fn prepare_kept(&self, query: &str, texts: &[&str]) -> Option<Arc<dyn Ranker>> {
        let mut prepared = self.prepared();
        if texts.is_empty() {
            return Some(Arc::new(prepared));
        }
        let cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let kept = |text: &str| {
            let key = (self.keys.hash_one(text), text.len());
            cache.vectors.get(&key).map(|v| (key, v.clone()))
        };
        prepared.query = Some(kept(encoded_part(query))?.1);
        for text in texts {
            let (key, v) = kept(encoded_part(text))?;
            prepared.vectors.insert(key, v);
        }
        Some(Arc::new(prepared))
    }

    fn prepare(&self, query: &str, texts: &[&str]) -> Option<Arc<dyn Ranker>> {
        let mut prepared = self.prepared();
        if texts.is_empty() {
            return Some(Arc::new(prepared));
        }
        let mut all = Vec::with_capacity(texts.len() + 1);
        all.push(encoded_part(query));
        all.extend(texts.iter().map(|t| encoded_part(t)));
        if let Some(vectors) = self.vectors(&all) {
            prepared.query = vectors[0].clone();
            for (text, v) in all[1..].iter().zip(&vectors[1..]) {
                if let Some(v) = v {
                    prepared
                        .vectors
                        .insert((self.keys.hash_one(text), text.len()), v.clone());
                }
            }
        }
        Some(Arc::new(prepared))
    }

    fn rescore(&self, query: &str, candidates: &mut [Candidate<'_>]) {
        let found = found(candidates);
        if found.is_empty() {
            return;
        }
        let mut texts = vec![encoded_part(query)];
        texts.extend(found.iter().map(|&i| encoded_part(candidates[i].text)));
        let Some(vectors) = self.vectors(&texts) else {
            return;
        };
        if let Some(q) = &vectors[0] {
            blend(self.weight, q, candidates, &found, &vectors[1..]);
        }
    }
}

/// The candidates a blend rescores: those the words found (a finite score above zero); one
/// scored zero or below is not lifted by meaning, and never encoded.
fn found(candidates: &[Candidate<'_>]) -> Vec<usize> {
    if best_score(candidates) <= 0.0 {
        return Vec::new();
    }
    (0..candidates.len())
        .filter(|&i| candidates[i].score > 0.0 && candidates[i].score.is_finite())
        .collect()
}

/// `(1 − weight) × lexical / best + weight × max(cosine, 0)` for each of `found`, whose
/// unit vectors are `vectors` in order (`None`: no closeness).
fn blend(
    weight: f32,
    query: &[f32],
    candidates: &mut [Candidate<'_>],
    found: &[usize],
    vectors: &[Option<Arc<[f32]>>],
) {
    let best = best_score(candidates);
    for (&i, v) in found.iter().zip(vectors) {
        let cosine = v.as_ref().map_or(0.0, |v| {
            query
                .iter()
                .zip(v.iter())
                .map(|(a, b)| a * b)
                .sum::<f32>()
                .max(0.0)
        });
        let c = &mut candidates[i];
        c.score = (1.0 - weight) * c.score / best + weight * cosine;
    }
}

impl SentenceRanker {
    /// A prepared ranker with no vectors yet (which keeps the lexical order).
    fn prepared(&self) -> Prepared {
        Prepared {
            weight: self.weight,
            pool: self.pool,
            keys: self.keys.clone(),
            query: None,
            vectors: FxHashMap::default(),
        }
    }
}

// A prepared ranker finds a candidate by the part of its text an encoder reads: the part a
// gatherer copies must hold all of it.
const _: () = assert!(MAX_ENCODED_BYTES <= crate::rank::GATHERED_TEXT_BYTES);

/// What [`SentenceRanker::prepare`] returns: the vectors of one search's query and
/// candidates, ranked with as `SentenceRanker` ranks, never encoding.
struct Prepared {
    weight: f32,
    pool: usize,
    keys: RandomState,
    /// `None` when the encoder failed or nothing was handed: the lexical order stays.
    query: Option<Arc<[f32]>>,
    vectors: FxHashMap<(u64, usize), Arc<[f32]>>,
}

impl fmt::Debug for Prepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("weight", &self.weight)
            .field("texts", &self.vectors.len())
            .finish_non_exhaustive()
    }
}

impl Ranker for Prepared {
    fn name(&self) -> &str {
        "sentence-vectors"
    }

    fn rescores(&self) -> bool {
        self.weight > 0.0
    }

    fn pool(&self, wanted: usize) -> usize {
        self.pool.max(wanted)
    }

    fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
        let Some(q) = &self.query else {
            return;
        };
        let found = found(candidates);
        let vectors: Vec<Option<Arc<[f32]>>> = found
            .iter()
            .map(|&i| {
                let text = encoded_part(candidates[i].text);
                self.vectors
                    .get(&(self.keys.hash_one(text), text.len()))
                    .cloned()
            })
            .collect();
        blend(self.weight, q, candidates, &found, &vectors);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::RankerRef;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A strict fake: each text's vector is given by the test (an unknown text is an
    /// error), and every text it is asked for is counted.
    #[derive(Debug, Default)]
    struct Fixed {
        vectors: Vec<(&'static str, Vec<f32>)>,
        asked: AtomicUsize,
        calls: AtomicUsize,
    }

    impl Encoder for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn dims(&self) -> usize {
            2
        }
        fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncodeError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.asked.fetch_add(texts.len(), Ordering::SeqCst);
            texts
                .iter()
                .map(|t| {
                    self.vectors
                        .iter()
                        .find(|(k, _)| k == t)
                        .map(|(_, v)| v.clone())
                        .ok_or_else(|| EncodeError::Unknown((*t).to_owned()))
                })
                .collect()
        }
    }

    /// What [`Gated`]'s first call does once let go.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum FirstCall {
        Encodes,
        Fails,
        Panics,
    }

    /// An encoder whose first call waits until the test lets it go (a slow model, as a
    /// second search meets it), then encodes, fails or panics; every call and text is counted.
    /// "lantern" and the gate are close, the silver lantern is not.
    #[derive(Debug)]
    struct Gated {
        entered: std::sync::mpsc::SyncSender<()>,
        release: Mutex<std::sync::mpsc::Receiver<()>>,
        first: FirstCall,
        calls: AtomicUsize,
        asked: AtomicUsize,
    }

    impl Encoder for Gated {
        fn name(&self) -> &str {
            "gated"
        }
        fn dims(&self) -> usize {
            2
        }
        fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncodeError> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            self.asked.fetch_add(texts.len(), Ordering::SeqCst);
            if call == 0 {
                self.entered.send(()).unwrap();
                self.release.lock().unwrap().recv().unwrap();
                match self.first {
                    FirstCall::Encodes => {}
                    FirstCall::Fails => return Err(EncodeError::Failed("let go".into())),
                    FirstCall::Panics => panic!("the encoder broke"),
                }
            }
            Ok(texts
                .iter()
                .map(|t| match *t {
                    "lantern" | "a lantern by the gate" => vec![1.0, 0.0],
                    _ => vec![0.0, 1.0],
                })
                .collect())
        }
    }

    /// Two searches at once over the same new texts (a model asking two memory searches in
    /// one step): the second waits for the first's encoding instead of encoding them again,
    /// and ranks with those vectors; when the first fails or panics, the second encodes them
    /// itself.
    #[test]
    fn a_search_over_texts_another_is_encoding_waits_for_that_encoding() {
        // Words alone put the silver lantern first; meaning, the gate.
        const POOL: [(&str, f32); 2] = [("a silver lantern", 2.0), ("a lantern by the gate", 1.0)];
        for first_call in [FirstCall::Encodes, FirstCall::Fails, FirstCall::Panics] {
            let (entered, entered_rx) = std::sync::mpsc::sync_channel(1);
            let (release_tx, release) = std::sync::mpsc::channel();
            let encoder = Arc::new(Gated {
                entered,
                release: Mutex::new(release),
                first: first_call,
                calls: AtomicUsize::new(0),
                asked: AtomicUsize::new(0),
            });
            let ranker = Arc::new(SentenceRanker::new(encoder.clone()));
            let search = || {
                let ranker = ranker.clone();
                std::thread::spawn(move || {
                    let texts: Vec<&str> = POOL.iter().map(|(t, _)| *t).collect();
                    let prepared = ranker.prepare("lantern", &texts).unwrap();
                    ranked(&RankerRef(prepared), "lantern", &POOL)
                })
            };
            let first = search();
            entered_rx.recv().unwrap();
            let second = search();
            // The second either waits for the first (counted) or encodes on its own and ends.
            while ranker.lock().waited == 0 {
                assert!(
                    !second.is_finished(),
                    "the second search encoded the texts again"
                );
                std::thread::yield_now();
            }
            release_tx.send(()).unwrap();
            let first = first.join();
            assert_eq!(second.join().unwrap(), [1, 0], "{first_call:?}");
            let counted = (
                encoder.calls.load(Ordering::SeqCst),
                encoder.asked.load(Ordering::SeqCst),
            );
            match first_call {
                FirstCall::Encodes => {
                    assert_eq!(first.unwrap(), [1, 0]);
                    assert_eq!(counted, (1, 3), "encoded once for both");
                }
                FirstCall::Fails => {
                    assert_eq!(
                        first.unwrap(),
                        [0, 1],
                        "a failed encoding keeps the words' order"
                    );
                    assert_eq!(counted, (2, 6), "the second encoded after the failure");
                }
                FirstCall::Panics => {
                    assert!(first.is_err());
                    assert_eq!(counted, (2, 6), "the second encoded after the panic");
                }
            }
            let cache = ranker.lock();
            assert_eq!(cache.vectors.len(), 3);
            assert!(cache.in_flight.is_empty(), "no claim is left behind");
        }
    }

    fn fixed() -> Arc<Fixed> {
        Arc::new(Fixed {
            vectors: vec![
                ("photography accessories", vec![1.0, 0.0]),
                ("a flash and a lens bag for my camera", vec![0.9, 0.1]),
                ("accessories for the kitchen", vec![0.0, 1.0]),
                ("broken", vec![f32::NAN, 0.0]),
            ],
            ..Fixed::default()
        })
    }

    fn ranked(ranker: &RankerRef, query: &str, texts: &[(&'static str, f32)]) -> Vec<u32> {
        let mut pool: Vec<Candidate<'_>> = texts
            .iter()
            .enumerate()
            .map(|(doc, &(text, score))| Candidate {
                doc: doc as u32,
                text,
                score,
            })
            .collect();
        ranker.apply(query, &mut pool);
        pool.iter().map(|c| c.doc).collect()
    }

    const POOL: [(&str, f32); 2] = [
        ("accessories for the kitchen", 2.0),
        ("a flash and a lens bag for my camera", 1.0),
    ];

    #[test]
    fn a_candidate_close_in_meaning_rises_above_a_lexically_better_one() {
        let encoder = fixed();
        let ranker = RankerRef::new(SentenceRanker::new(encoder.clone()));
        assert_eq!(ranked(&ranker, "photography accessories", &POOL), [1, 0]);
        // Lexical order when the vectors take no share.
        let lexical = RankerRef::new(SentenceRanker::new(encoder).with_weight(0.0));
        assert_eq!(ranked(&lexical, "photography accessories", &POOL), [0, 1]);
    }

    #[test]
    fn vectors_are_encoded_once_and_kept_for_the_next_search() {
        let encoder = fixed();
        let ranker = RankerRef::new(SentenceRanker::new(encoder.clone()));
        ranked(&ranker, "photography accessories", &POOL);
        assert_eq!(encoder.asked.load(Ordering::SeqCst), 3);
        assert_eq!(
            encoder.calls.load(Ordering::SeqCst),
            1,
            "one call per search"
        );
        ranked(&ranker, "photography accessories", &POOL);
        assert_eq!(encoder.calls.load(Ordering::SeqCst), 1, "all kept");
        // A text is encoded, and kept, without its surrounding white space.
        let padded = [("  accessories for the kitchen\n", 2.0)];
        ranked(&ranker, " photography accessories ", &padded);
        assert_eq!(encoder.calls.load(Ordering::SeqCst), 1, "the same texts");
    }

    #[test]
    fn a_failing_encoder_leaves_the_lexical_order_and_a_broken_vector_counts_as_no_closeness() {
        let ranker = RankerRef::new(SentenceRanker::new(fixed()));
        // A text the encoder does not know: the call fails, and no score changes (the
        // camera text would otherwise rise above the kitchen).
        let unknown = [
            ("accessories for the kitchen", 2.0),
            ("a flash and a lens bag for my camera", 1.0),
            ("unheard of", 0.5),
        ];
        assert_eq!(
            ranked(&ranker, "photography accessories", &unknown),
            [0, 1, 2]
        );
        // A vector that is not finite breaks the contract: that text alone counts as no
        // closeness (its lexical share stays), the others are ranked by meaning.
        let broken = [
            ("broken", 2.0),
            ("accessories for the kitchen", 1.9),
            ("a flash and a lens bag for my camera", 1.0),
        ];
        let mut pool: Vec<Candidate<'_>> = broken
            .iter()
            .enumerate()
            .map(|(doc, &(text, score))| Candidate {
                doc: doc as u32,
                text,
                score,
            })
            .collect();
        ranker.apply("photography accessories", &mut pool);
        let order: Vec<u32> = pool.iter().map(|c| c.doc).collect();
        assert_eq!(order, [2, 0, 1]);
        let broken_score = pool.iter().find(|c| c.doc == 0).map(|c| c.score);
        assert_eq!(
            broken_score,
            Some(1.0 - DEFAULT_WEIGHT),
            "its lexical share alone"
        );
    }

    #[test]
    fn a_candidate_scored_zero_is_not_lifted_and_is_never_encoded() {
        let encoder = fixed();
        let ranker = SentenceRanker::new(encoder.clone());
        let mut pool = vec![
            Candidate {
                doc: 0,
                text: "accessories for the kitchen",
                score: 2.0,
            },
            Candidate {
                doc: 1,
                text: "a flash and a lens bag for my camera",
                score: 0.0,
            },
        ];
        ranker.rescore("photography accessories", &mut pool);
        assert_eq!(pool[1].score, 0.0);
        assert_eq!(
            encoder.asked.load(Ordering::SeqCst),
            2,
            "query and the one found"
        );
    }

    #[test]
    fn a_prepared_search_never_asks_the_encoder_and_ranks_the_same() {
        let encoder = fixed();
        let ranker = RankerRef::new(SentenceRanker::new(encoder.clone()));
        assert!(ranker.prepares());
        let texts: Vec<&str> = POOL.iter().map(|(t, _)| *t).collect();
        // Padded as a search hands them over; kept by what is encoded.
        let prepared = ranker.prepare(" photography accessories", &texts);
        assert_eq!(encoder.calls.load(Ordering::SeqCst), 1, "one call for all");
        assert_eq!(encoder.asked.load(Ordering::SeqCst), 3, "query and texts");
        assert_eq!(prepared.get().name(), "sentence-vectors");
        assert_eq!(prepared.pool(5), ranker.pool(5), "the same pool");
        assert_eq!(ranked(&prepared, "photography accessories", &POOL), [1, 0]);
        assert_eq!(ranked(&ranker, "photography accessories", &POOL), [1, 0]);
        assert_eq!(
            encoder.calls.load(Ordering::SeqCst),
            1,
            "both only looked up"
        );
        // A text the preparation did not see (written in between) counts as not close, and
        // the prepared ranker still asks nothing.
        let more = [
            ("accessories for the kitchen", 2.0),
            ("broken", 1.5),
            ("a flash and a lens bag for my camera", 1.0),
        ];
        assert_eq!(
            ranked(&prepared, "photography accessories", &more),
            [2, 0, 1]
        );
        assert_eq!(encoder.calls.load(Ordering::SeqCst), 1);
        // Nothing is prepared for a ranker whose vectors take no share.
        let off = RankerRef::new(SentenceRanker::new(encoder.clone()).with_weight(0.0));
        assert!(!off.prepares());
        let same = off.prepare("a query never seen", &texts);
        assert_eq!(same, off);
        assert_eq!(encoder.calls.load(Ordering::SeqCst), 1);
        // Kept from the preparation: prepared again at once, without the encoder; a text not
        // kept (or a query) cannot be.
        let again = ranker.prepare_kept("photography accessories", &texts);
        assert_eq!(
            ranked(&again.unwrap(), "photography accessories", &POOL),
            [1, 0]
        );
        assert!(ranker
            .prepare_kept("photography accessories", &["broken"])
            .is_none());
        assert!(ranker.prepare_kept("a query never seen", &texts).is_none());
        assert_eq!(encoder.calls.load(Ordering::SeqCst), 1);
        // Nothing handed: nothing encoded, and the lexical order.
        let empty = ranker.prepare("a query never seen", &[]);
        assert_eq!(ranked(&empty, "a query never seen", &POOL), [0, 1]);
        assert_eq!(encoder.calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_failed_preparation_keeps_the_lexical_order_and_asks_nothing_more() {
        let encoder = fixed();
        let ranker = RankerRef::new(SentenceRanker::new(encoder.clone()));
        // The whole call fails on the unknown text; nothing is kept, nothing panics.
        let prepared = ranker.prepare("photography accessories", &["unheard of", POOL[1].0]);
        assert_eq!(encoder.calls.load(Ordering::SeqCst), 1);
        assert_eq!(ranked(&prepared, "photography accessories", &POOL), [0, 1]);
        assert_eq!(
            encoder.calls.load(Ordering::SeqCst),
            1,
            "the search encoded nothing"
        );
    }

    /// Gives any text a vector of its own (its length and first byte).
    #[derive(Debug)]
    struct Any;

    impl Encoder for Any {
        fn name(&self) -> &str {
            "any"
        }
        fn dims(&self) -> usize {
            2
        }
        fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncodeError> {
            Ok(texts
                .iter()
                .map(|t| vec![t.len() as f32, f32::from(t.bytes().next().unwrap_or(1))])
                .collect())
        }
    }

    #[test]
    fn the_kept_vectors_stay_within_bounds_and_a_full_cache_keeps_the_latest_call() {
        let ranker = SentenceRanker::new(Arc::new(Any));
        let texts: Vec<String> = (0..CACHE_TEXTS + 500).map(|i| format!("t{i}")).collect();
        for chunk in texts.chunks(1_000) {
            let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let got = ranker.vectors(&chunk).unwrap();
            assert!(got.iter().all(Option::is_some));
        }
        let cache = ranker.cache.lock().unwrap();
        assert!(
            cache.vectors.len() <= CACHE_TEXTS,
            "{}",
            cache.vectors.len()
        );
        assert_eq!(cache.values, cache.vectors.len() * 2);
        // Emptied before the call that did not fit, which is kept whole.
        let last = &texts[texts.len() - 1];
        assert!(cache
            .vectors
            .contains_key(&(ranker.keys.hash_one(last.as_str()), last.len())));
        // 65 calls of 1,000 fit (65,000); the 66th would not, so it went into an empty
        // cache, and the last call's 36 joined it.
        assert_eq!(CACHE_TEXTS, 65_536, "the arithmetic below");
        assert_eq!(cache.vectors.len(), 1_036);
    }

    #[test]
    fn the_encoded_part_is_cut_at_a_character_boundary() {
        let long = "梦".repeat(MAX_ENCODED_BYTES);
        let part = encoded_part(&long);
        assert!(part.len() <= MAX_ENCODED_BYTES && part.len() > MAX_ENCODED_BYTES - 3);
        assert!(part.chars().all(|c| c == '梦'));
    }
}
