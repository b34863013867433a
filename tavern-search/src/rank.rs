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
