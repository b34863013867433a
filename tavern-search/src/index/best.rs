//! The matches of a query that can rank near the best `k`, with the exact number of matches,
//! without scoring the matches that cannot: [`Bm25Index::best`], what memory search runs.
//!
//! Memory search blends relevance with importance and recency, which can lower a score to a
//! share of itself (70 %), so it needs every match scoring at least that share of the `k`-th
//! best, not only the best `k`. On a large store a query's commonest term matches a tenth of
//! it; scoring, and then blending, every one of those matches was most of a query's time.
//!
//! Terms are walked one at a time, rarest first, as [`Bm25Index::score_unordered`] walks them.
//! A document already scored gets every later term's contribution, so its score is exact and
//! bit-identical to scoring every match. A document first met at term `j` can score at most
//! its contribution there plus the bounds of the terms after `j` (their largest term frequency
//! at the shortest length), coordinated as if it matched every one of them. Below the floor —
//! the share times the `k`-th best score the documents scored so far are sure to reach — it is
//! only counted — without computing its contribution when its term frequency is too low to
//! reach it at the shortest length, and without marking it when no later term could meet it
//! again. The floor only rises, so a document turned away can never reach it.

use super::score::{coordination, LengthNorm, SCRATCH};
use super::{top, Bm25Index};

thread_local! {
    /// Per thread, a bit per document: set while a search has met it (its accumulator is in
    /// use), cleared behind each search.
    static MARKS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most documents met for which the floor is worked out again between terms.
const RESET_MAX: usize = 4096;

/// An accumulator's matched-term count flags: counted as a match but not scored (it cannot
/// reach the floor) ...
const COUNTED: u32 = 1 << 31;
/// ... or not a match at all (the caller's `visible` said no).
const HIDDEN: u32 = 1 << 30;
/// A bound is raised by at least this share before it turns a document away, so a float
/// rounding in the bound (computed in another order than the score) never turns away one that
/// reaches the floor; more for long queries (see [`slack()`]).
const BOUND_SLACK: f32 = 1.0 + 1e-4;

/// The share bounds are raised by for a query of `terms` terms: a sum of that many floats is
/// off by at most about `terms` roundings, each within [`f32::EPSILON`].
fn slack(terms: usize) -> f32 {
    BOUND_SLACK.max(1.0 + 4.0 * terms as f32 * f32::EPSILON)
}

/// The matches [`Bm25Index::best`] scored, and how many matched.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BestMatches {
    /// Every visible match scoring at least the share of the `k`-th best visible match's
    /// score, and perhaps others above some lower floor; each with its exact score, in no
    /// particular order.
    pub hits: Vec<(u32, f32)>,
    /// How many visible documents match the query at all.
    pub matched: usize,
}

/// The `k` highest lower bounds seen, as a min-heap: its least is the floor's base.
struct Floor {
    k: usize,
    share: f32,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<Ordered>>,
}

/// An `f32` ordered by [`f32::total_cmp`].
#[derive(PartialEq)]
struct Ordered(f32);

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl Floor {
    fn new(k: usize, share: f32) -> Self {
        // A share that is not a positive number prunes nothing.
        let share = if share.is_finite() && share > 0.0 {
            share.min(1.0)
        } else {
            0.0
        };
        Self {
            k,
            share,
            heap: std::collections::BinaryHeap::with_capacity(k.min(4096) + 1),
        }
    }

    /// Offers a lower bound of one document's final score (each document at most once).
    fn offer(&mut self, bound: f32) {
        if self.k == 0 || self.share == 0.0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(std::cmp::Reverse(Ordered(bound)));
        } else if self.heap.peek().is_some_and(|least| bound > least.0 .0) {
            self.heap.pop();
            self.heap.push(std::cmp::Reverse(Ordered(bound)));
        }
    }

    /// Below this, a match cannot be among what is asked for; 0 until `k` are known.
    fn value(&self) -> f32 {
        match self.heap.peek() {
            Some(least) if self.heap.len() >= self.k => (least.0 .0 * self.share).max(0.0),
            _ => 0.0,
        }
    }

    /// Starts again from the bounds of the documents scored so far.
    fn reset(&mut self, bounds: impl Iterator<Item = f32>) {
        self.heap.clear();
        for bound in bounds {
            self.offer(bound);
        }
    }
}

impl Bm25Index {
    /// The matches of `query` in `groups` (`None`: every group) that `visible` keeps (`None`:
    /// every match) and that may score at least `share` (at most 1) times the `k`-th best of
    /// them: [`BestMatches::hits`] holds every one that does, each with the score
    /// [`Bm25Index::score_unordered`] gives it, bit for bit, and possibly others below that
    /// with theirs; [`BestMatches::matched`] counts every visible match. With `k == 0` or a `share`
    /// that is not positive, every visible match is a hit. `visible` is asked once per
    /// matching document at most.
    pub fn best(
        &self,
        query: &[String],
        groups: Option<&[u32]>,
        k: usize,
        share: f32,
        visible: Option<&dyn Fn(u32) -> bool>,
    ) -> BestMatches {
        let Some(searched) = self.searched(groups) else {
            return BestMatches::default();
        };
        if query.is_empty() {
            return BestMatches::default();
        }
        let norm = LengthNorm::new(searched.avg);
        let terms = self.weighted_terms(query, searched.docs, searched.filter());
        let min_len = self.min_len.unwrap_or(0.0).max(0.0);
        // Each term's contribution bound, and the sum of the bounds of the terms after each.
        let each: Vec<f32> = terms
            .iter()
            .map(|t| norm.term_score(t.weight, t.max_tf.max(0.0), min_len))
            .collect();
        let mut after = vec![0.0f32; terms.len() + 1];
        for j in (0..terms.len()).rev() {
            after[j] = after[j + 1] + each[j];
        }
        let coords: Vec<f32> = coordination(query.len()).collect();
        let coord = |matched: u32| top::coord(&coords, matched as usize);
        // A bound is only trusted when it is a number (a weight or length that breaks it
        // scores everything).
        let bounded = !self.bounds_broken && each.iter().all(|b| b.is_finite());
        let mut floor = Floor::new(if bounded { k } else { 0 }, share);
        // Without a floor nothing is turned away: every match is a hit, whatever its score
        // (a weight that broke the bounds can make one negative, or not a number).
        let prunes = floor.k > 0 && floor.share > 0.0;
        let slack = slack(query.len());
        let check = self.stale;
        SCRATCH.with_borrow_mut(|(acc, touched)| {
            MARKS.with_borrow_mut(|marks| {
                if acc.len() < self.alive.len() {
                    acc.resize(self.alive.len(), (0.0, 0));
                }
                // A bit per document met (on a large store the accumulators are megabytes, the
                // marks a sixty-fourth of that: most postings of a common term are of documents
                // never met, told by the marks alone).
                let words = self.alive.len().div_ceil(64);
                if marks.len() < words {
                    marks.resize(words, 0);
                }
                let marks = &mut marks[..words];
                touched.clear();
                let mut counted = 0usize;
                for (j, term) in terms.iter().enumerate() {
                    // The most terms a document first met here can match, and the most it can
                    // score, coordinated as if it matched them all.
                    let reach = coord((terms.len() - j) as u32);
                    let rest = after[j + 1];
                    let weight = term.weight;
                    let last = j + 1 == terms.len();
                    // Below this term frequency a document first met here cannot reach the floor
                    // even at the shortest length: turned away without computing its contribution.
                    let tf_cut = |floor: f32| {
                        let need = floor / (reach * slack) - rest * slack;
                        let len_part = norm.base + norm.per_word * min_len;
                        if need <= 0.0 {
                            0.0
                        } else if need >= weight {
                            f32::INFINITY
                        } else {
                            need * len_part / (weight - need) / slack
                        }
                    };
                    // The floor, read once per change rather than per posting.
                    let mut now = floor.value();
                    let mut cut = if prunes { tf_cut(now) } else { 0.0 };
                    term.walk(|p| {
                        if check && !self.current(p) {
                            return;
                        }
                        let idx = p.0 as usize;
                        let (word, bit) = (idx / 64, 1u64 << (idx % 64));
                        let Some(mark) = marks.get_mut(word).filter(|_| idx < acc.len()) else {
                            return;
                        };
                        if *mark & bit != 0 {
                            let slot = &mut acc[idx];
                            if slot.1 & (COUNTED | HIDDEN) == 0 {
                                slot.0 += self.contribution(weight, p.1, p.0, &norm);
                                slot.1 += 1;
                            }
                            return;
                        }
                        // Its contribution, when it may reach the floor.
                        let made = if prunes {
                            (p.1 >= cut)
                                .then(|| self.contribution(weight, p.1, p.0, &norm))
                                .filter(|c| (c + rest) * reach * slack >= now)
                        } else {
                            Some(self.contribution(weight, p.1, p.0, &norm))
                        };
                        if last && made.is_none() {
                            // No later term looks at it: counted (if visible) without a
                            // mark (a document has one current posting per term).
                            counted += usize::from(visible.is_none_or(|v| v(p.0)));
                            return;
                        }
                        touched.push(p.0);
                        *mark |= bit;
                        let slot = &mut acc[idx];
                        if visible.is_some_and(|v| !v(p.0)) {
                            slot.1 = HIDDEN;
                        } else if let Some(c) = made {
                            *slot = (c, 1);
                            floor.offer(c * coord(1));
                            if floor.value() != now {
                                now = floor.value();
                                cut = tf_cut(now);
                            }
                        } else {
                            slot.1 = COUNTED;
                            counted += 1;
                        }
                    });
                    // The documents scored so far are sure of their partial score, coordinated by
                    // what they matched: the floor starts again from those (a higher base than
                    // the bounds offered when each was first met).
                    // (Only while that is cheap: over many documents met, the bounds offered as
                    // they were met already make a floor, and a pass over all of them per term
                    // cost more than it saved when few could be turned away.)
                    if j + 1 < terms.len() && floor.k > 0 && touched.len() <= RESET_MAX {
                        floor.reset(touched.iter().filter_map(|d| {
                            let (score, matched) = acc[*d as usize];
                            (matched & (COUNTED | HIDDEN) == 0).then(|| score * coord(matched))
                        }));
                    }
                }
                let cut = floor.value();
                let mut best = BestMatches {
                    hits: Vec::new(),
                    matched: counted,
                };
                for &doc in touched.iter() {
                    let slot = &mut acc[doc as usize];
                    if slot.1 & (COUNTED | HIDDEN) == 0 {
                        best.matched += 1;
                        let score = slot.0 * coord(slot.1);
                        if !prunes || score * slack >= cut {
                            best.hits.push((doc, score));
                        }
                    }
                    *slot = (0.0, 0);
                    marks[doc as usize / 64] = 0;
                }
                best
            })
        })
    }
}
