//! BM25 scoring over the index: idf-weighted query terms (idf² overall), length
//! normalization, coordination (a document matching every query term beats one matching some),
//! per-group statistics, weighted fields. Every scorer adds a document's terms in one order, so
//! scores are bit-identical however they are computed.

use std::cell::RefCell;

use super::{pack, shard_of, top, Bm25Index, Posting, QueryTerm};

/// BM25 term-frequency saturation.
pub(super) const K1: f32 = 1.2;
/// BM25 length normalization.
pub(super) const B: f32 = 0.5;

/// BM25's length normalization for one query, `K1 · (1 − B + B · len / avg)` split into a
/// constant and a per-word factor, so scoring a posting takes one division.
pub(super) struct LengthNorm {
    pub(super) base: f32,
    pub(super) per_word: f32,
}

impl LengthNorm {
    pub(super) fn new(avg: f32) -> Self {
        Self {
            base: K1 * (1.0 - B),
            per_word: K1 * B / avg,
        }
    }

    /// A term of `weight`'s contribution at term frequency `tf` in a document of `len` words:
    /// one expression for scores and their bounds alike, so a bound computed at the largest
    /// frequency and the shortest length is never below a score.
    pub(super) fn term_score(&self, weight: f32, tf: f32, len: f32) -> f32 {
        weight * tf / (tf + self.base + self.per_word * len)
    }
}

/// The coordination factor for each number of matched tokens, 0 to all of a query of `tokens`
/// (a document matching `c` of them scores `c / tokens` of its sum).
pub(super) fn coordination(tokens: usize) -> impl Iterator<Item = f32> {
    let all = tokens as f32;
    (0..=tokens).map(move |c| c as f32 / all)
}

/// Documents per window when a term's lists of several groups are walked side by side
/// ([`Bm25Index::accumulate`]): their accumulators (8 bytes each) stay in the second-level
/// cache.
const WINDOW_DOCS: u32 = 8192;

/// What a search of some groups scores with: their statistics, and which lists to read.
pub(super) struct Searched {
    /// Live documents in the groups searched.
    pub(super) docs: f32,
    /// Their average length (at least 1).
    pub(super) avg: f32,
    /// The groups searched, sorted; `None` when they hold every live document.
    groups: Option<Vec<u32>>,
}

impl Searched {
    /// The groups whose lists are read (`None`: every group's).
    pub(super) fn filter(&self) -> Option<&[u32]> {
        self.groups.as_deref()
    }
}

impl QueryTerm<'_> {
    /// Calls `visit` with every posting of the term's lists. Several lists (one per group
    /// searched) are walked side by side a window of documents at a time: accumulators are
    /// visited about in order, as one list's would be, not swept end to end once per group.
    /// (A document has one current posting per term, so the order of its lists changes no
    /// sum.)
    pub(super) fn walk(&self, mut visit: impl FnMut(&Posting)) {
        if self.rest.is_empty() {
            self.list.iter().for_each(visit);
            return;
        }
        let mut lists: Vec<(&[Posting], usize)> = self.lists().map(|l| (l, 0)).collect();
        while let Some(next) = lists
            .iter()
            .filter_map(|(l, at)| l.get(*at))
            .map(|p| p.0)
            .min()
        {
            // The window holding the earliest posting left (lists out of document order are
            // still read exactly once: a cursor only moves forward).
            let end = (next / WINDOW_DOCS)
                .saturating_add(1)
                .saturating_mul(WINDOW_DOCS);
            for (list, at) in &mut lists {
                while let Some(p) = list.get(*at).filter(|p| p.0 < end || end == u32::MAX) {
                    visit(p);
                    *at += 1;
                }
            }
            lists.retain(|(l, at)| *at < l.len());
        }
    }
}

/// Per document (score, matched query tokens), and the documents touched by the query.
pub(super) type Scratch = (Vec<(f32, u32)>, Vec<u32>);

thread_local! {
    /// Per-thread accumulators (score, matched query tokens) per document, reset after each
    /// query (only the touched entries), so a query over a large index does not allocate and
    /// zero a dense array; one array of pairs, so a posting touches one cache line.
    pub(super) static SCRATCH: RefCell<Scratch> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl Bm25Index {
    /// BM25 scores of every live document matching at least one query token, as
    /// `(doc, score)` in ascending doc order. Only documents that contain a query token appear.
    pub fn score(&self, query: &[String]) -> Vec<(u32, f32)> {
        self.score_in(query, None)
    }

    /// [`Bm25Index::score`] over the documents of `groups` only (`None`: every group), with
    /// the statistics of those groups.
    pub fn score_in(&self, query: &[String], groups: Option<&[u32]>) -> Vec<(u32, f32)> {
        let mut out = self.score_unordered(query, groups);
        out.sort_unstable_by_key(|(doc, _)| *doc);
        out
    }

    /// [`Bm25Index::score_in`] in no particular order (for callers that select the best few
    /// themselves and need not pay for sorting every match).
    pub fn score_unordered(&self, query: &[String], groups: Option<&[u32]>) -> Vec<(u32, f32)> {
        let mut out = Vec::new();
        self.score_each(query, groups, |doc, score| out.push((doc, score)));
        out
    }

    /// Calls `sink` with every matching document and its score, in no particular order;
    /// returns how many there were.
    pub(super) fn score_each(
        &self,
        query: &[String],
        groups: Option<&[u32]>,
        mut sink: impl FnMut(u32, f32),
    ) -> usize {
        let Some(searched) = self.searched(groups) else {
            return 0;
        };
        if query.is_empty() {
            return 0;
        }
        let (n, avg, filter) = (searched.docs, searched.avg, searched.filter());
        // Dense accumulators beat a hash map by far on long posting lists.
        SCRATCH.with_borrow_mut(|(acc, touched)| {
            if acc.len() < self.alive.len() {
                acc.resize(self.alive.len(), (0.0, 0));
            }
            touched.clear();
            self.accumulate(query, n, avg, filter, acc, touched, &mut sink);
            touched.len()
        })
    }

    /// The document count, average length and group filter of a search of `groups` (`None`:
    /// every group); `None` when those groups hold no live document.
    pub(super) fn searched(&self, groups: Option<&[u32]>) -> Option<Searched> {
        let mut selected: Vec<u32> = groups.map(<[u32]>::to_vec).unwrap_or_default();
        selected.sort_unstable();
        selected.dedup();
        let (n, total, all) = match groups {
            None => (self.live_docs, self.total_len, true),
            Some(_) => {
                let stats = selected
                    .iter()
                    .filter_map(|g| self.groups.get(*g as usize))
                    .fold((0u32, 0f64), |(d, l), s| (d + s.docs, l + s.len));
                (stats.0, stats.1, stats.0 == self.live_docs)
            }
        };
        (n > 0).then(|| Searched {
            docs: n as f32,
            avg: ((total / f64::from(n)) as f32).max(1.0),
            groups: (!all).then_some(selected),
        })
    }

    /// The query's terms that have current postings, with their BM25 weights, heaviest
    /// (rarest) first, ties in query order: the one order every scorer adds them in, so sums
    /// are bit-identical however they are computed.
    pub(super) fn weighted_terms<'a>(
        &'a self,
        query: &[String],
        n: f32,
        filter: Option<&[u32]>,
    ) -> Vec<QueryTerm<'a>> {
        let mut terms = Vec::with_capacity(query.len());
        for term in query {
            let key = pack(term);
            let Some(mut found) = self.shards[shard_of(term, key)].lookup_term(term, key, filter)
            else {
                continue;
            };
            // The lists are the searched groups' own: only postings gone stale need a look.
            let df = if self.stale {
                found
                    .lists()
                    .map(|list| list.iter().filter(|p| self.current(p)).count())
                    .sum::<usize>() as f32
            } else {
                found.lists().map(<[Posting]>::len).sum::<usize>() as f32
            };
            if df == 0.0 {
                continue;
            }
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln().max(1e-6);
            // The query side weighs each term by its idf too (idf² overall, as in the classic
            // vector-space model): a rare word in the query must dominate a common one even in
            // a long document.
            found.weight = idf * idf * (K1 + 1.0);
            terms.push(found);
        }
        terms.sort_by(|a, b| b.weight.total_cmp(&a.weight));
        terms
    }

    /// Whether a posting counts: postings of removed or re-indexed documents linger until
    /// compaction, so scores do not depend on history (or on a restart). (A document indexed
    /// again in another group has its new postings in that group's lists, under a new
    /// generation.)
    pub(super) fn current(&self, &(doc, _, generation): &Posting) -> bool {
        let idx = doc as usize;
        let dirty = self
            .dirty
            .get(idx / 64)
            .is_some_and(|w| w & (1 << (idx % 64)) != 0);
        !dirty || (self.alive[idx] && self.generation[idx] == generation)
    }

    /// One posting's BM25 contribution for a term of `weight`.
    pub(super) fn contribution(&self, weight: f32, tf: f32, doc: u32, norm: &LengthNorm) -> f32 {
        let len = self.doc_len.get(doc as usize).copied().unwrap_or(0.0);
        norm.term_score(weight, tf, len)
    }

    /// Scores every match into the accumulators, then hands each to `sink` with its
    /// coordination applied, clearing the accumulators behind it.
    #[allow(clippy::too_many_arguments)]
    fn accumulate(
        &self,
        query: &[String],
        n: f32,
        avg: f32,
        filter: Option<&[u32]>,
        acc: &mut [(f32, u32)],
        touched: &mut Vec<u32>,
        sink: &mut impl FnMut(u32, f32),
    ) {
        let norm = LengthNorm::new(avg);
        // With nothing stale every posting of the searched groups' lists counts: skip the two
        // lookups per posting that tell (they dominate on long lists).
        let check = self.stale;
        let mut add = |p: &Posting, weight: f32| {
            if check && !self.current(p) {
                return;
            }
            let idx = p.0 as usize;
            let Some(slot) = acc.get_mut(idx) else {
                return;
            };
            if slot.1 == 0 {
                touched.push(p.0);
            }
            slot.0 += self.contribution(weight, p.1, p.0, &norm);
            slot.1 += 1;
        };
        for term in self.weighted_terms(query, n, filter) {
            let weight = term.weight;
            term.walk(|p| add(p, weight));
        }
        // Coordination: a document containing all query tokens (for CJK: every bigram of the
        // phrase) must beat a shorter one that contains only some of them.
        // The factor for each count of matched terms, computed once instead of per match.
        let coords: Vec<f32> = coordination(query.len()).collect();
        for &doc in touched.iter() {
            let idx = doc as usize;
            let Some(slot) = acc.get_mut(idx) else {
                continue;
            };
            sink(doc, slot.0 * top::coord(&coords, slot.1 as usize));
            *slot = (0.0, 0);
        }
    }
}
