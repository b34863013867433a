//! The ranker seam: lexical search finds candidates, a [`Ranker`] gives them their final
//! scores. Memory search, history search and lore ranking all hand their candidates through
//! the ranker they are given (`tavern_tools::ToolServices::ranker`), so another ranker — the
//! seeds' optional embedding adapter, a cross-encoder, a rule — plugs into all three in one
//! place. The default, [`Lexical`], keeps the BM25 scores and costs nothing: results are
//! bit-identical to searching without a seam.
//!
//! A ranker is handed at most [`Ranker::pool`] candidates per call (the best by lexical
//! score): history search calls it once per search; memory search once per tier of
//! `pool(100)` matches its page reaches, in order of relevance (times the time boost when
//! the query names a time), each tier ranked on its own (so that pages of one query
//! agree), at most [`POOL_MAX`] candidates in all; and no caller hands it more than
//! [`POOL_MAX`] at once (lore hands over every entry a query matched, bounded by the book,
//! and [`RankerRef::apply`] cuts that). Its work is bounded by what it asks for, not by the
//! corpus.

use std::fmt;
use std::sync::Arc;

/// The most candidates a ranker is handed per search, whatever its [`Ranker::pool`] asks:
/// the work a ranker does per call is bounded here, not by the corpus.
pub const POOL_MAX: usize = 1_000;

/// One candidate a lexical search found.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<'a> {
    /// The caller's id for it (a slot, a message position, an entry index).
    pub doc: u32,
    /// Its text as the ranker should read it.
    pub text: &'a str,
    /// Its score: the lexical (BM25) score going in, the final score coming out. Only finite
    /// scores are kept; a candidate whose score is not finite or not above zero is dropped.
    pub score: f32,
}

/// The best finite score among `candidates` (0 when none is above zero): what a blending
/// ranker divides a candidate's lexical score by.
pub fn best_score(candidates: &[Candidate<'_>]) -> f32 {
    candidates
        .iter()
        .map(|c| c.score)
        .filter(|s| s.is_finite())
        .fold(0f32, f32::max)
}

/// Gives lexical candidates their final scores.
///
/// Contract: [`Ranker::rescore`] changes only `score`s, never the slice's length or the
/// other fields; it must be deterministic for the same query and candidates, and must not
/// panic. Callers sort by the new scores (best first, ties kept in lexical order) and drop
/// candidates whose score is not finite or not above zero.
pub trait Ranker: Send + Sync + fmt::Debug {
    /// A short name for logs and benchmarks (`lexical`).
    fn name(&self) -> &str;

    /// Whether [`Ranker::rescore`] changes anything; a ranker that does not is skipped (the
    /// lexical results are then final, bit for bit).
    fn rescores(&self) -> bool {
        true
    }

    /// How many of the best lexical candidates to gather for `wanted` results; callers
    /// gather at least `wanted` and at most [`POOL_MAX`] (or `wanted`, if more). Memory
    /// search asks for `pool(100)` whatever its page size and hands them over a tier at a
    /// time (see the module's documentation).
    fn pool(&self, wanted: usize) -> usize {
        wanted
    }

    /// Sets each candidate's final score for `query`. Through [`RankerRef::apply`] it is
    /// handed only candidates with a finite score above zero, at most [`POOL_MAX`].
    fn rescore(&self, query: &str, candidates: &mut [Candidate<'_>]);

    /// Whether [`Ranker::prepare`] does anything: a ranker whose [`Ranker::rescore`] is slow
    /// for texts it has not seen (a sentence encoder) says so, and every search on a player's
    /// behalf — memory search inside a store (under its lock), history search (on the async
    /// executor), lore search (on the CPU threads) — first finds its candidates lexically
    /// through a [`Gatherer`], has them prepared on the blocking pool with no lock held, and
    /// then ranks with the ranker `prepare` returned.
    fn prepares(&self) -> bool {
        false
    }

    /// Does the slow part of rescoring `texts` for `query` beforehand (encodes them) and
    /// returns the ranker the search then ranks with: one that only looks up what was
    /// prepared and never does slow work (a text it was not handed — written in between —
    /// counts as not close; a failed preparation leaves the lexical order), or `None` to rank
    /// with this one. The texts are those a search expects to hand over, best first, each cut
    /// to its first [`GATHERED_TEXT_BYTES`] after its leading white space (a preparing ranker
    /// must read no more of a text than that). Through [`RankerRef::prepare`] it is handed at
    /// most [`POOL_MAX`] texts. Must not panic.
    fn prepare(&self, _query: &str, _texts: &[&str]) -> Option<Arc<dyn Ranker>> {
        None
    }

    /// [`Ranker::prepare`] when it needs no slow work (every text and the query kept from
    /// before, or nothing to prepare), else `None`: quick, so callers try it first, without
    /// waiting for a turn to prepare.
    fn prepare_kept(&self, _query: &str, _texts: &[&str]) -> Option<Arc<dyn Ranker>> {
        None
    }
}

/// Bytes of each candidate's text (after its leading white space) a [`Gatherer`] copies for
/// a ranker to prepare: what a sentence encoder reads (4 KiB) and word vectors read (8 KiB)
/// fit in it, so a memory of 64 KiB costs the copy no more than one of 8.
pub const GATHERED_TEXT_BYTES: usize = 8 * 1024;

/// The part of `text` a [`Gatherer`] keeps: its first [`GATHERED_TEXT_BYTES`] after its
/// leading white space, cut at a character boundary.
pub fn gathered_part(text: &str) -> &str {
    let text = text.trim_start();
    let mut end = text.len().min(GATHERED_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The first, lexical pass of a search whose ranker prepares ([`RankerRef::prepares`]): it
/// asks for the same pool as that ranker, keeps the lexical scores, and keeps a copy of the
/// texts it is handed (at most [`POOL_MAX`] in all, first come first kept, each its
/// [`gathered_part`]), which the caller
/// then hands to [`RankerRef::prepare`] outside its locks before it searches again with the
/// ranker itself.
#[derive(Debug)]
pub struct Gatherer {
    ranker: RankerRef,
    texts: std::sync::Mutex<Vec<String>>,
}

impl Gatherer {
    /// A first pass for `ranker`.
    pub fn new(ranker: RankerRef) -> Self {
        Self {
            ranker,
            texts: std::sync::Mutex::default(),
        }
    }

    /// The texts handed over so far, in order, leaving none behind.
    pub fn take_texts(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .texts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

impl Ranker for Gatherer {
    fn name(&self) -> &str {
        "gatherer"
    }

    fn pool(&self, wanted: usize) -> usize {
        self.ranker.pool(wanted)
    }

    fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
        let mut texts = self
            .texts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let room = POOL_MAX.saturating_sub(texts.len());
        texts.extend(
            candidates
                .iter()
                .take(room)
                .map(|c| gathered_part(c.text).to_owned()),
        );
    }
}

/// The default ranker: BM25's scores are final.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lexical;

impl Ranker for Lexical {
    fn name(&self) -> &str {
        "lexical"
    }

    fn rescores(&self) -> bool {
        false
    }

    fn rescore(&self, _query: &str, _candidates: &mut [Candidate<'_>]) {}
}

/// A shared ranker, as queries and services hold it: clonable, compared by identity, and
/// [`Lexical`] by default.
#[derive(Clone)]
pub struct RankerRef(pub Arc<dyn Ranker>);

impl RankerRef {
    /// How many lexical candidates to gather for `wanted` results: `wanted` for a ranker
    /// that does not rescore, else its [`Ranker::pool`] within `wanted..=POOL_MAX`.
    pub fn pool(&self, wanted: usize) -> usize {
        if self.0.rescores() {
            self.0.pool(wanted).min(POOL_MAX).max(wanted)
        } else {
            wanted
        }
    }

    /// Wraps a ranker.
    pub fn new(ranker: impl Ranker + 'static) -> Self {
        Self(Arc::new(ranker))
    }

    /// The ranker.
    pub fn get(&self) -> &dyn Ranker {
        &*self.0
    }

    /// Whether searches should call [`RankerRef::prepare`] before searching with this ranker
    /// (see [`Ranker::prepares`]).
    pub fn prepares(&self) -> bool {
        self.0.rescores() && self.0.prepares()
    }

    /// Hands the ranker the first [`POOL_MAX`] of `texts` to prepare for `query` (see
    /// [`Ranker::prepare`]) and returns the ranker to search with: what it prepared, or
    /// itself when it does not prepare. Slow by design: call it outside every lock and off
    /// the async executor.
    #[must_use]
    pub fn prepare(&self, query: &str, texts: &[&str]) -> RankerRef {
        if !self.prepares() {
            return self.clone();
        }
        match self.0.prepare(query, &texts[..texts.len().min(POOL_MAX)]) {
            Some(prepared) => Self(prepared),
            None => self.clone(),
        }
    }

    /// [`Ranker::prepare_kept`] through the same bounds as [`RankerRef::prepare`]: the ranker
    /// to search with when preparing needs no slow work, itself when it does not prepare.
    #[must_use]
    pub fn prepare_kept(&self, query: &str, texts: &[&str]) -> Option<RankerRef> {
        if !self.prepares() {
            return Some(self.clone());
        }
        self.0
            .prepare_kept(query, &texts[..texts.len().min(POOL_MAX)])
            .map(Self)
    }

    /// Rescores `candidates` (when the ranker rescores at all), then orders them best first —
    /// ties keep their order, which callers make the lexical one — and drops those whose
    /// score is not finite or not above zero. Returns whether anything was rescored.
    ///
    /// The ranker is handed at most [`POOL_MAX`] candidates, the best by lexical score,
    /// whoever gathered them (lore hands over every entry a query matched): any beyond follow
    /// them in lexical order, their scores scaled below half of every rescored one's (callers
    /// sort by score again), never rescored, and never dropped by the ranker (it only sees,
    /// and can only drop, what it is handed).
    pub fn apply(&self, query: &str, candidates: &mut Vec<Candidate<'_>>) -> bool {
        if !self.0.rescores() {
            return false;
        }
        candidates.retain(|c| c.score.is_finite() && c.score > 0.0);
        let head = if candidates.len() > POOL_MAX {
            // Stable: equal scores keep the caller's (lexical) order.
            candidates.sort_by(|a, b| b.score.total_cmp(&a.score));
            POOL_MAX
        } else {
            candidates.len()
        };
        let (rescored, tail) = candidates.split_at_mut(head);
        self.0.rescore(query, rescored);
        rescored.sort_by(|a, b| b.score.total_cmp(&a.score));
        if let Some(top) = tail.first().map(|c| c.score) {
            // Below the least rescored score kept (or 1 when none is), in the same order.
            let least = rescored
                .iter()
                .map(|c| c.score)
                .filter(|s| s.is_finite() && *s > 0.0)
                .fold(1.0f32, f32::min);
            for c in tail.iter_mut() {
                // Never rounded down to nothing: a score of 0 would be dropped.
                c.score = (least * 0.5 * (c.score / top)).max(f32::MIN_POSITIVE);
            }
        }
        let mut at = 0;
        candidates.retain(|c| {
            at += 1;
            at > head || (c.score.is_finite() && c.score > 0.0)
        });
        true
    }
}

impl Default for RankerRef {
    fn default() -> Self {
        Self::new(Lexical)
    }
}

impl fmt::Debug for RankerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RankerRef").field(&self.0.name()).finish()
    }
}

impl PartialEq for RankerRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || (!self.0.rescores() && !other.0.rescores())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefers shorter texts: reverses a length-biased lexical order.
    #[derive(Debug)]
    struct Shortest;

    impl Ranker for Shortest {
        fn name(&self) -> &str {
            "shortest"
        }
        fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
            for c in candidates {
                c.score = 1.0 / (1.0 + c.text.len() as f32);
            }
        }
    }

    fn candidates() -> Vec<Candidate<'static>> {
        vec![
            Candidate {
                doc: 0,
                text: "a long text about the gate",
                score: 3.0,
            },
            Candidate {
                doc: 1,
                text: "gate",
                score: 1.0,
            },
            Candidate {
                doc: 2,
                text: "the gate",
                score: 1.0,
            },
        ]
    }

    #[test]
    fn a_gatherer_keeps_lexical_scores_and_copies_what_it_is_handed_up_to_pool_max() {
        /// Prepares, and records what it was asked to prepare.
        #[derive(Debug, Default)]
        struct Preparing(std::sync::Mutex<Vec<(String, usize)>>);
        impl Ranker for Preparing {
            fn name(&self) -> &str {
                "preparing"
            }
            fn pool(&self, _wanted: usize) -> usize {
                40
            }
            fn rescore(&self, _query: &str, _candidates: &mut [Candidate<'_>]) {}
            fn prepares(&self) -> bool {
                true
            }
            fn prepare(&self, query: &str, texts: &[&str]) -> Option<Arc<dyn Ranker>> {
                self.0.lock().unwrap().push((query.to_owned(), texts.len()));
                Some(Arc::new(Lexical))
            }
        }
        let preparing = Arc::new(Preparing::default());
        let ranker = RankerRef(preparing.clone());
        assert!(ranker.prepares() && !RankerRef::default().prepares());
        let gatherer = Arc::new(Gatherer::new(ranker.clone()));
        let first = RankerRef(gatherer.clone());
        assert_eq!(first.pool(10), 40, "the ranker's own pool");
        let mut c = candidates();
        assert!(first.apply("gate", &mut c));
        assert_eq!(c, candidates(), "lexical scores and order kept");
        assert_eq!(
            gatherer.take_texts(),
            ["a long text about the gate", "gate", "the gate"]
        );
        assert!(gatherer.take_texts().is_empty(), "taken");
        // However often a search hands it tiers, it keeps POOL_MAX texts at most.
        let many: Vec<Candidate<'_>> = (0..600)
            .map(|doc| Candidate {
                doc,
                text: "gate",
                score: 1.0,
            })
            .collect();
        for _ in 0..3 {
            first.apply("gate", &mut many.clone());
        }
        let texts = gatherer.take_texts();
        assert_eq!(texts.len(), POOL_MAX);
        // And the ranker is handed POOL_MAX at most to prepare.
        let refs: Vec<&str> = vec!["gate"; POOL_MAX + 7];
        let prepared = ranker.prepare("gate", &refs);
        assert_eq!(
            *preparing.0.lock().unwrap(),
            [("gate".to_owned(), POOL_MAX)]
        );
        assert_eq!(prepared.get().name(), "lexical", "what prepare returned");
        // A long text is copied as far as a preparing ranker may read it.
        let long = format!("  {}", "梦".repeat(GATHERED_TEXT_BYTES));
        let mut c = vec![Candidate {
            doc: 0,
            text: &long,
            score: 1.0,
        }];
        first.apply("gate", &mut c);
        let kept = gatherer.take_texts();
        assert!(kept[0].len() <= GATHERED_TEXT_BYTES && kept[0].len() > GATHERED_TEXT_BYTES - 3);
        assert!(kept[0].chars().all(|c| c == '梦'));
    }

    #[test]
    fn the_lexical_ranker_leaves_candidates_as_they_are() {
        let mut c = candidates();
        assert!(!RankerRef::default().apply("gate", &mut c));
        assert_eq!(c, candidates());
    }

    #[test]
    fn a_ranker_reorders_and_drops_what_it_scores_out() {
        let mut c = candidates();
        assert!(RankerRef::new(Shortest).apply("gate", &mut c));
        assert_eq!(c.iter().map(|c| c.doc).collect::<Vec<_>>(), [1, 2, 0]);

        #[derive(Debug)]
        struct Nan;
        impl Ranker for Nan {
            fn name(&self) -> &str {
                "nan"
            }
            fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
                candidates[0].score = f32::NAN;
                candidates[1].score = 0.0;
            }
        }
        let mut c = candidates();
        RankerRef::new(Nan).apply("gate", &mut c);
        assert_eq!(c.iter().map(|c| c.doc).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn a_ranker_is_handed_the_best_pool_max_and_the_rest_follow_in_lexical_order() {
        /// Reverses the order it is handed, and records what it was handed.
        #[derive(Debug, Default)]
        struct Reverse(std::sync::Mutex<Vec<u32>>);
        impl Ranker for Reverse {
            fn name(&self) -> &str {
                "reverse"
            }
            fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
                let mut seen = self.0.lock().unwrap();
                for c in candidates {
                    seen.push(c.doc);
                    c.score = 1.0 / c.score;
                }
            }
        }
        // Lexical scores 1..=n in reverse of doc order, shuffled as a lore search gathers
        // them (by entry, not by score); one scored zero and one NaN are dropped unseen.
        let n = POOL_MAX as u32 + 500;
        let mut c: Vec<Candidate<'_>> = (0..n)
            .map(|doc| Candidate {
                doc: (doc * 7919) % n,
                text: "gate",
                score: (n - (doc * 7919) % n) as f32,
            })
            .collect();
        c.push(Candidate {
            doc: n,
            text: "gate",
            score: 0.0,
        });
        c.push(Candidate {
            doc: n + 1,
            text: "gate",
            score: f32::NAN,
        });
        let reverse = Arc::new(Reverse::default());
        assert!(RankerRef(reverse.clone()).apply("gate", &mut c));
        let mut handed = reverse.0.lock().unwrap().clone();
        handed.sort_unstable();
        assert_eq!(handed, (0..POOL_MAX as u32).collect::<Vec<_>>());
        let order: Vec<u32> = c.iter().map(|c| c.doc).collect();
        let rescored = (0..POOL_MAX as u32).rev();
        assert_eq!(
            order,
            rescored.chain(POOL_MAX as u32..n).collect::<Vec<_>>()
        );
        // Callers sort by score again: the scores say the same order, every one above zero.
        assert!(
            c.windows(2).all(|w| w[0].score > w[1].score),
            "scores out of order"
        );
        assert!(c.iter().all(|c| c.score > 0.0 && c.score.is_finite()));
    }

    #[test]
    fn rankers_compare_by_identity_and_lexical_ones_are_equal() {
        let shortest = RankerRef::new(Shortest);
        assert_eq!(shortest, shortest.clone());
        assert_ne!(shortest, RankerRef::new(Shortest));
        assert_eq!(RankerRef::default(), RankerRef::new(Lexical));
        assert_eq!(format!("{shortest:?}"), "RankerRef(\"shortest\")");
    }
}
