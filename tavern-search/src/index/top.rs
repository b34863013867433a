//! The best `k` matches of a query and the exact number of matches, without scoring every
//! match: [`Bm25Index::top`], what history search runs.
//!
//! A question naming a speaker matches a third of a long chat (every message of that speaker,
//! and its neighbours), yet only the best ten are wanted, and the answer says how many matched.
//!
//! 1. When the rarest term is rare (at most one document in eight) and `k > 0`, its documents
//!    are scored first, completely: a common term's posting for a document is found through the
//!    term's [`BlockMap`] (one bit per document, and where each word of bits starts in the
//!    list) without reading the list. The best of them set a floor.
//! 2. Then the rest, one block of documents at a time. Which documents of the block each term
//!    holds is a row of bits: a mapped term's from its map, the others' from their postings
//!    in the block (a few: a list without a map is sparse). The terms' bits for 64 documents,
//!    side by side, tell without reading a posting how many terms each document matches and
//!    which. A document can reach the floor only if it matches enough terms (the best bounds
//!    of that many, coordinated, reach it), one of them a term that can lift a document to
//!    the floor by itself with the terms after it ("essential"), and its own bound — for the
//!    terms it matches, at its length — reaches it. Each term's contribution is bounded by the
//!    largest term frequency any of its postings ever had (for a mapped term, in that block).
//!    Only the few documents left are looked up and scored. A block where no number of
//!    matches reaches the floor is not walked at all.
//! 3. Every match is still counted, in one pass before the blocks: the union of every term's
//!    bits (a block map is already a term's bits in document order), counted.
//!
//! Scores are bit-identical to scoring every match: each document that is scored gets every
//! term, in the same order, and a bound only ever turns away a document that scores below the
//! floor. Indexes whose lists may be out of order, hold stale postings, or fit in one block are
//! scored in full.

use std::cell::Cell;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use super::score::{coordination, LengthNorm};
use super::{Bm25Index, Posting, QueryTerm};

/// Documents handled together: the query terms' bits for a block (128 bytes per term) stay in
/// the first-level cache while its candidates are found and scored.
pub(super) const BLOCK_DOCS: usize = 1024;

/// A list gets a block map from this many postings on, when it holds at least one document in
/// [`MAP_DENSITY`]: a map takes about 200 bytes per 1,024 documents and a byte per posting, a
/// list 12 bytes per posting, so a new map costs under the list's memory...
const MAP_MIN_POSTINGS: usize = 64;
/// ... see [`MAP_MIN_POSTINGS`]; a map is dropped again when the list falls below half that
/// density (a list growing slower than the chat), so a map's contents stay under about 1.9
/// times its list's (under twice that allocated, as vectors grow by doubling).
const MAP_DENSITY: usize = 48;

/// Which documents of blocks of `block` documents a long posting list holds (one bit each)
/// and where each block's postings start in the list: whether a document is in the list, and
/// at which posting, without reading the list. Only for lists in document order.
#[derive(Debug, Clone)]
pub(super) struct BlockMap {
    /// Documents per block: a power of two (a division per lookup costs more than the rest).
    block: usize,
    /// `log2(block)`.
    shift: u32,
    /// `words` words per block.
    bits: Vec<u64>,
    words: usize,
    /// Per word, the index in the list of its first posting (once it has one): finding a
    /// posting then counts the bits of one word, not of every word before it.
    word_starts: Vec<u32>,
    /// Per block, the largest term frequency of its postings (never lowered): a bound on the
    /// term's contribution block by block, tighter than the list's.
    block_max_tf: Vec<f32>,
    /// Per posting of the list, its term frequency coded by [`tf_code`] (0: read the list):
    /// a lookup reads a byte here instead of a twelve-byte posting, so the frequencies a long
    /// chat's queries look up stay in cache between queries (a list of 5,000 postings: 5 KB,
    /// not 60; on 10,000 messages, a fifth fewer cache misses per query).
    codes: Vec<u8>,
    /// The last document mapped.
    last: u32,
}

impl BlockMap {
    /// Keeps `term`'s map in `maps` in step with `list` after a posting was appended to it:
    /// extends it, creates it once the list is long enough, drops it once the list is too
    /// sparse for it or out of document order.
    pub(super) fn follow(
        maps: &mut FxHashMap<u32, BlockMap>,
        term: u32,
        list: &[Posting],
        block: usize,
    ) {
        let Some(&(doc, tf, _)) = list.last() else {
            return;
        };
        let len = list.len();
        if let Some(map) = maps.get_mut(&term) {
            // Too sparse now (checked before growing it), or out of order: dropped.
            if len.saturating_mul(MAP_DENSITY * 2) < doc as usize || !map.add(doc, len - 1, tf) {
                maps.remove(&term);
            }
        } else {
            Self::rebuild(maps, term, list, block);
        }
    }

    /// Keeps a map of `list` in `maps` when [`BlockMap::follow`] would create one for it as
    /// it stands (a read index image rebuilds its maps so).
    pub(super) fn rebuild(
        maps: &mut FxHashMap<u32, BlockMap>,
        term: u32,
        list: &[Posting],
        block: usize,
    ) {
        let Some(&(doc, _, _)) = list.last() else {
            return;
        };
        let len = list.len();
        if len >= MAP_MIN_POSTINGS && len.saturating_mul(MAP_DENSITY) > doc as usize {
            if let Some(map) = Self::of(list, block) {
                maps.insert(term, map);
            }
        }
    }

    /// The map of a whole list; `None` when it is out of document order.
    fn of(list: &[Posting], block: usize) -> Option<Self> {
        let block = block.max(1).next_power_of_two();
        let mut map = Self {
            block,
            shift: block.trailing_zeros(),
            bits: Vec::new(),
            words: block.div_ceil(64),
            word_starts: Vec::new(),
            block_max_tf: Vec::new(),
            codes: Vec::with_capacity(list.len()),
            last: 0,
        };
        for (at, &(doc, tf, _)) in list.iter().enumerate() {
            if at > 0 && doc <= map.last {
                return None;
            }
            map.set(doc, at, tf);
        }
        Some(map)
    }

    /// Maps posting `at` of the list, document `doc`; `false` when `doc` is not after the
    /// last document mapped (the map no longer holds).
    fn add(&mut self, doc: u32, at: usize, tf: f32) -> bool {
        if doc <= self.last {
            return false;
        }
        self.set(doc, at, tf);
        true
    }

    /// Records that `doc`'s posting now has term frequency `tf` (grown in place).
    pub(super) fn raise(&mut self, doc: u32, tf: f32) {
        if let Some(max) = self.block_max_tf.get_mut(doc as usize >> self.shift) {
            *max = max.max(tf);
        }
        if let Some(code) = self.position(doc).and_then(|at| self.codes.get_mut(at)) {
            *code = tf_code(tf);
        }
    }

    /// The largest term frequency of block `block`'s postings (0 when it has none).
    fn block_max(&self, block: usize) -> f32 {
        self.block_max_tf.get(block).copied().unwrap_or(0.0)
    }

    fn set(&mut self, doc: u32, at: usize, tf: f32) {
        let (block, local) = (doc as usize >> self.shift, doc as usize & (self.block - 1));
        while self.block_max_tf.len() <= block {
            self.bits.extend(std::iter::repeat_n(0, self.words));
            self.word_starts.extend(std::iter::repeat_n(0, self.words));
            self.block_max_tf.push(0.0);
        }
        if let Some(max) = self.block_max_tf.get_mut(block) {
            *max = max.max(tf);
        }
        self.codes.resize(at, 0);
        self.codes.push(tf_code(tf));
        let w = block * self.words + local / 64;
        if let (Some(word), Some(start)) = (self.bits.get_mut(w), self.word_starts.get_mut(w)) {
            if *word == 0 {
                *start = u32::try_from(at).unwrap_or(u32::MAX);
            }
            *word |= 1 << (local % 64);
        }
        self.last = doc;
    }

    /// The bits of block `block` (document `block · size + i` is bit `i`).
    fn block_bits(&self, block: usize) -> Option<&[u64]> {
        self.bits.get(block * self.words..(block + 1) * self.words)
    }

    /// The term frequency of the document at bit `bit` of word `w` of block `block`, which
    /// holds `word` (that word of the map, read already) and has the bit set.
    fn tf_in_word(
        &self,
        block: usize,
        w: usize,
        word: u64,
        bit: u32,
        list: &[Posting],
    ) -> Option<f32> {
        let before = (word & ((1u64 << bit) - 1)).count_ones() as usize;
        let at = *self.word_starts.get(block * self.words + w)? as usize + before;
        self.tf_at(at, list)
    }

    /// The term frequency of `doc` in `list` (the list this maps), if it holds `doc`.
    fn tf(&self, doc: u32, list: &[Posting]) -> Option<f32> {
        self.tf_at(self.position(doc)?, list)
    }

    /// The term frequency of posting `at` of `list` (the list this maps).
    fn tf_at(&self, at: usize, list: &[Posting]) -> Option<f32> {
        match self.codes.get(at) {
            Some(&code) if code != 0 => Some(f32::from(code) / 2.0),
            _ => list.get(at).map(|p| p.1),
        }
    }

    /// The index in the list of `doc`'s posting, if the list has one.
    fn position(&self, doc: u32) -> Option<usize> {
        let (block, local) = (doc as usize >> self.shift, doc as usize & (self.block - 1));
        let w = block * self.words + local / 64;
        let word = *self.bits.get(w)?;
        let bit = local % 64;
        if word >> bit & 1 == 0 {
            return None;
        }
        let before = (word & ((1u64 << bit) - 1)).count_ones() as usize;
        Some(*self.word_starts.get(w)? as usize + before)
    }
}

/// A term frequency that is a multiple of ½ from ½ to 127½ (every frequency of fields
/// weighted 1 and ½, as history's) as the byte `2·tf`, which gives it back exactly; 0 for any
/// other.
fn tf_code(tf: f32) -> u8 {
    let twice = tf * 2.0;
    if (1.0..=255.0).contains(&twice) && twice.fract() == 0.0 {
        twice as u8
    } else {
        0
    }
}

/// Relative slack on every bound, far above the float rounding of a sum of a few terms, so a
/// bound computed in floats is never below the score it bounds.
const BOUND_SLACK: f32 = 1e-4;

/// A kept document, ordered so the heap's top is the worst of the best `k`.
struct Worst(u32, f32);

impl PartialEq for Worst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Worst {}

impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Worst {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: a lower score (then a lower slot) is "greater", i.e. on top.
        other.1.total_cmp(&self.1).then(other.0.cmp(&self.0))
    }
}

/// The best `k` documents offered so far (highest score, ties: higher slot).
struct Best {
    heap: BinaryHeap<Worst>,
    k: usize,
    /// Once `k` are kept, the worst kept score (a lower one cannot get in); before, −∞.
    floor: f32,
}

impl Best {
    fn new(k: usize) -> Self {
        Self {
            heap: BinaryHeap::with_capacity(k.saturating_add(1).min(1024)),
            k,
            floor: if k == 0 {
                f32::INFINITY
            } else {
                f32::NEG_INFINITY
            },
        }
    }

    fn offer(&mut self, doc: u32, score: f32) {
        // Most matches score below the floor: one float comparison turns them away.
        if score < self.floor || self.k == 0 {
            return;
        }
        let candidate = Worst(doc, score);
        if self.heap.len() < self.k {
            self.heap.push(candidate);
        } else if let Some(mut worst) = self.heap.peek_mut() {
            if candidate >= *worst {
                return;
            }
            // Replaced in place: one sift down, where a pop and a push took two.
            *worst = candidate;
        } else {
            return;
        }
        if self.heap.len() == self.k {
            self.floor = self.heap.peek().map_or(f32::NEG_INFINITY, |worst| worst.1);
        }
    }

    /// Best first.
    fn into_sorted(self) -> Vec<(u32, f32)> {
        // Ascending in `Worst`'s order is best first.
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|w| (w.0, w.1))
            .collect()
    }
}

impl Bm25Index {
    /// The best `k` documents of [`Bm25Index::score`] over every group (highest score first,
    /// ties: higher slot first — for a chat, the newer message), in that order, and how many
    /// documents match in all. Keeps `k` candidates, not every match, and scores only the
    /// matches that could be among the best (see the module documentation).
    pub fn top(&self, query: &[String], k: usize) -> (Vec<(u32, f32)>, usize) {
        let block = match self.shards[0].map_block {
            0 => BLOCK_DOCS,
            mapped => mapped,
        };
        // Within one block pruning has nothing to skip; lists out of order or with stale
        // postings cannot be walked in step, nor a term's several lists (one per group: with
        // nothing stale, a group without live documents has no postings).
        let groups = self.groups.iter().filter(|g| g.docs > 0).count();
        if self.stale || self.exact_only || self.alive.len() <= block || groups > 1 {
            let mut best = Best::new(k);
            let total = self.score_each(query, None, |doc, score| best.offer(doc, score));
            return (best.into_sorted(), total);
        }
        let walk = self.top_in_blocks(query, k, block);
        (walk.top, walk.total)
    }

    /// [`Bm25Index::top`] among the documents from `from` on (the rest are neither returned nor
    /// counted), scoring every match.
    pub fn top_from(&self, query: &[String], k: usize, from: u32) -> (Vec<(u32, f32)>, usize) {
        let mut best = Best::new(k);
        let mut total = 0;
        self.score_each(query, None, |doc, score| {
            if doc >= from {
                total += 1;
                best.offer(doc, score);
            }
        });
        (best.into_sorted(), total)
    }

    /// [`Bm25Index::top`] walking the lists in blocks of `block` documents, and the work that
    /// took. Requires every posting to be current and every list in document order.
    fn top_in_blocks(&self, query: &[String], k: usize, block: usize) -> Walk {
        // The statistics exactly as `score_each` takes them, so scores are bit-identical.
        let Some(searched) = self.searched(None).filter(|_| !query.is_empty()) else {
            return Walk::default();
        };
        let norm = LengthNorm::new(searched.avg);
        let mut terms = self.weighted_terms(query, searched.docs, None);
        if terms.is_empty() {
            return Walk::default();
        }
        let block = block.max(1);
        // Only a map of this block size gives a block's bits; the others are read as lists.
        for term in &mut terms {
            term.map = term.map.filter(|m| m.block == block);
        }
        let mut lent = Lent::take();
        let Buffers {
            first,
            union,
            columns,
            row,
            segments,
            coords,
            bounds,
        } = &mut lent.0;
        coords.clear();
        coords.extend(coordination(query.len()));
        let coords = &coords[..];
        bounds.reset(terms.len());
        let docs = self.alive.len();
        let words = block.div_ceil(64);
        let mut best = Best::new(k);
        let mut read = 0;
        // The rarest term's documents, scored first and completely: the best of them set a
        // floor the other documents must beat before any of those is read.
        let first = self.score_first(&terms, coords, &norm, &mut best, docs, &mut read, first);
        let done = usize::from(first.is_some());
        let nt = terms.len();
        let (total, listed) = count_matches(&terms[done..], first.as_ref(), docs, block, union);
        read += listed;
        // The block's documents of each term, one bit each, by word: word `w` of term `i` at
        // `w · nt + i`, so the terms' words for 64 documents lie together.
        columns.clear();
        columns.resize(nt * words, 0);
        row.clear();
        row.resize(words, 0);
        // Per term, where its postings in the current block start and end in its list.
        segments.clear();
        segments.resize(nt, (0, 0));
        let mut walked = 0;
        for start in (0..docs).step_by(block) {
            let stop = u32::try_from((start + block).min(docs)).unwrap_or(u32::MAX);
            let b = start / block;
            // Only documents that match enough terms (`least`), one of them essential, can
            // reach the floor; of those, only the ones whose own bound does are scored. In a
            // block where no number of matches can reach it, nothing is.
            let floor = best.floor;
            bounds.for_block(&terms, coords, b, self.bound_len(), &norm);
            let Some(least) = bounds.least_matches(done, floor, coords) else {
                continue;
            };
            let essential = bounds.essential(done, floor);
            walked += 1;
            for (i, term) in terms.iter().enumerate().skip(done) {
                let bits = match term.map {
                    Some(map) => map.block_bits(b).unwrap_or_default(),
                    None => {
                        // Read on from the last block read (not bisected: each probe into a
                        // list not in cache is a miss); a list without a map holds a few
                        // documents per block. Postings of skipped blocks are left out of
                        // the row and before any candidate of this one.
                        let from = segments[i].1.min(term.list.len());
                        let rest = term.list.get(from..).unwrap_or_default();
                        let to = from + rest.iter().take_while(|p| p.0 < stop).count();
                        let segment = term.list.get(from..to).unwrap_or_default();
                        segments[i] = (from, to);
                        read += segment.len();
                        fill_row(row, segment, start, block);
                        &row[..]
                    }
                };
                for (w, column) in columns.chunks_exact_mut(nt).enumerate() {
                    if let Some(x) = column.get_mut(i) {
                        *x = bits.get(w).copied().unwrap_or(0);
                    }
                }
            }
            for (w, word) in columns.chunks_exact(nt).enumerate() {
                let valid = valid_bits(block, w);
                let rarest = first.as_ref().map_or(0, |f| f.word(start, w));
                let others = word.get(done..).unwrap_or_default();
                let essentials = word.get(done..essential).unwrap_or(others);
                let mut candidates = essentials.iter().fold(0, |any, x| any | x) & !rarest & valid;
                if candidates == 0 {
                    continue;
                }
                candidates &= at_least(others, least);
                while candidates != 0 {
                    let bit = candidates.trailing_zeros();
                    candidates &= candidates - 1;
                    let Ok(doc) = u32::try_from(start + 64 * w + bit as usize) else {
                        continue;
                    };
                    // Its own bound: first for the terms it matches, then for its length.
                    if bounds.of_doc(word, done, bit, coords) < best.floor {
                        continue;
                    }
                    let len = self.doc_len.get(doc as usize).copied().unwrap_or(0.0);
                    if bounds.of_doc_at(word, done, bit, len, &norm, coords) < best.floor {
                        continue;
                    }
                    // Added in scoring order, as every scorer adds them: bit-identical sums.
                    let (mut sum, mut count) = (0.0, 0);
                    for (i, term) in terms.iter().enumerate().skip(done) {
                        let x = word.get(i).copied().unwrap_or(0);
                        if x >> bit & 1 == 0 {
                            continue;
                        }
                        let tf = match term.map {
                            Some(map) => map.tf_in_word(b, w, x, bit, &term.list),
                            None => {
                                let (from, to) = segments[i];
                                let segment = term.list.get(from..to).unwrap_or_default();
                                let at = segment.partition_point(|p| p.0 < doc);
                                segment.get(at).filter(|p| p.0 == doc).map(|p| p.1)
                            }
                        };
                        if let Some(tf) = tf {
                            read += 1;
                            count += 1;
                            sum += self.contribution(term.weight, tf, doc, &norm);
                        }
                    }
                    let coord = coord(coords, count);
                    best.offer(doc, sum * coord);
                }
            }
        }
        Walk {
            top: best.into_sorted(),
            total,
            read,
            walked,
        }
    }

    /// Scores every document of the rarest term completely (each other term's posting found
    /// through its block map, or by bisecting its list when it is short), offers them to
    /// `best`, and returns which they were — or `None` when the rarest term is itself common
    /// (its documents are then scored in the blocks like any other's). The set is kept in
    /// `words`.
    #[allow(clippy::too_many_arguments)]
    fn score_first<'w>(
        &self,
        terms: &[QueryTerm<'_>],
        coords: &[f32],
        norm: &LengthNorm,
        best: &mut Best,
        docs: usize,
        read: &mut usize,
        words: &'w mut Vec<u64>,
    ) -> Option<DocSet<'w>> {
        let first = terms.first()?;
        if best.k == 0 || first.list.len() > docs / 8 {
            return None;
        }
        let mut set = DocSet::empty(words, docs);
        for &(doc, tf, _) in first.list.iter() {
            set.insert(doc);
            // Added in scoring order, as the blocks add them: bit-identical sums.
            let mut sum = self.contribution(first.weight, tf, doc, norm);
            let mut matched = 1usize;
            for term in &terms[1..] {
                let found = match term.map {
                    Some(map) => map.tf(doc, &term.list),
                    None => term
                        .list
                        .binary_search_by_key(&doc, |p| p.0)
                        .ok()
                        .and_then(|at| term.list.get(at))
                        .map(|p| p.1),
                };
                if let Some(tf) = found {
                    sum += self.contribution(term.weight, tf, doc, norm);
                    matched += 1;
                }
            }
            *read += matched;
            let coord = coord(coords, matched);
            best.offer(doc, sum * coord);
        }
        Some(set)
    }

    /// A length no live document is shorter than.
    fn bound_len(&self) -> f32 {
        self.min_len.unwrap_or(0.0).max(0.0)
    }
}

/// What [`Bm25Index::top_in_blocks`] found, and the work it took.
#[derive(Debug, Default)]
struct Walk {
    /// The best `k`, best first.
    top: Vec<(u32, f32)>,
    /// How many documents match.
    total: usize,
    /// How many postings were read (block maps spare reading most of a common term's).
    #[cfg_attr(not(test), allow(dead_code))] // What tests measure the pruning by.
    read: usize,
    /// How many blocks were walked (the others could not hold one of the best `k`).
    #[cfg_attr(not(test), allow(dead_code))]
    walked: usize,
}

/// Bounds on what documents of a block matching some of the query's terms can score. Each
/// term's contribution is bounded by its largest term frequency (for a mapped term, in the
/// block) in a document of the shortest length, or of the document's own; the coordination
/// factor by how many terms a document matches.
#[derive(Default)]
struct Bounds {
    /// `tails[j]`: above the score of any document matching only `terms[j..]` (the last
    /// entry, for matching none of them, is 0).
    tails: Vec<f32>,
    /// `rests[j]`: the sum of the bounds of `terms[j..]`, without coordination.
    rests: Vec<f32>,
    /// `each[j]`: the bound of `terms[j]` alone, without coordination.
    each: Vec<f32>,
    /// `top_tf[j]`, `weight[j]`: the largest term frequency of `terms[j]` in the block, and
    /// its weight (for bounds at a document's own length).
    top_tf: Vec<f32>,
    weight: Vec<f32>,
    /// Scratch for [`Bounds::least_matches`].
    sorted: Vec<f32>,
}

impl Bounds {
    /// Room for the bounds of `terms` query terms; [`Bounds::for_block`] fills them.
    fn reset(&mut self, terms: usize) {
        for (bounds, len) in [
            (&mut self.tails, terms + 1),
            (&mut self.rests, terms + 1),
            (&mut self.each, terms),
            (&mut self.top_tf, terms),
            (&mut self.weight, terms),
        ] {
            bounds.clear();
            bounds.resize(len, 0.0);
        }
    }

    /// The bounds for the documents of block `b`: a term with a block map (of the blocks
    /// walked) is bounded by the block's largest term frequency.
    fn for_block(
        &mut self,
        terms: &[QueryTerm<'_>],
        coords: &[f32],
        b: usize,
        len: f32,
        norm: &LengthNorm,
    ) {
        // How many of `terms[j..]` have postings in the block: a document matches no more.
        let mut held = 0;
        for j in (0..terms.len()).rev() {
            let t = &terms[j];
            let tf = match t.map {
                Some(map) => map.block_max(b),
                None => t.max_tf,
            };
            held += usize::from(tf != 0.0);
            self.top_tf[j] = tf;
            self.weight[j] = t.weight;
            self.each[j] = norm.term_score(t.weight, tf, len);
            self.rests[j] = self.rests[j + 1] + self.each[j];
            let coord = coord(coords, held);
            self.tails[j] = self.rests[j] * coord * (1.0 + BOUND_SLACK);
        }
    }

    /// The first term, from `from` on, whose documents need not be found: a document matching
    /// only it and later terms stays below `floor`.
    fn essential(&self, from: usize, floor: f32) -> usize {
        let last = self.tails.len() - 1;
        (from..=last)
            .find(|&j| self.tails[j] < floor)
            .unwrap_or(last)
    }

    /// Above the score of the document at bit `bit` of `words` (per term, a word of its
    /// documents; those before `from` it does not match) for the terms it matches, at the
    /// shortest length.
    #[inline]
    fn of_doc(&self, words: &[u64], from: usize, bit: u32, coords: &[f32]) -> f32 {
        let (mut sum, mut count) = (0.0, 0);
        let words = words.get(from..).unwrap_or_default();
        let each = self.each.get(from..).unwrap_or_default();
        // Without branches: a candidate matches about half of the terms, unpredictably.
        for (word, each) in words.iter().zip(each) {
            let hit = word >> bit & 1;
            sum += each * hit as f32;
            count += hit as usize;
        }
        let coord = coord(coords, count);
        sum * coord * (1.0 + BOUND_SLACK)
    }

    /// [`Bounds::of_doc`] at the document's own length `len`.
    fn of_doc_at(
        &self,
        words: &[u64],
        from: usize,
        bit: u32,
        len: f32,
        norm: &LengthNorm,
        coords: &[f32],
    ) -> f32 {
        let (mut sum, mut count) = (0.0, 0);
        let terms = words.iter().zip(self.top_tf.iter().zip(&self.weight));
        for (word, (tf, weight)) in terms.skip(from) {
            if word >> bit & 1 == 1 {
                count += 1;
                sum += norm.term_score(*weight, *tf, len);
            }
        }
        let coord = coord(coords, count);
        sum * coord * (1.0 + BOUND_SLACK)
    }

    /// The fewest of the terms from `from` on a document must match to reach `floor` (the
    /// best bounds of that many, coordinated, reach it); `None` when no number of them does.
    fn least_matches(&mut self, from: usize, floor: f32, coords: &[f32]) -> Option<usize> {
        let terms = self.tails.len() - 1;
        let each = &mut self.sorted;
        each.clear();
        // A term without postings in the block (largest frequency 0) is no match to count
        // on: otherwise the coordination factor of matching it too would keep a block whose
        // documents can only match the others (a date's words, outside its sessions).
        let held = (from..terms).filter(|&j| self.top_tf[j] != 0.0);
        each.extend(held.map(|j| self.each[j]));
        each.sort_unstable_by(|a, b| b.total_cmp(a));
        let mut sum = 0.0;
        for (m, bound) in each.iter().enumerate() {
            sum += bound;
            let coord = coord(coords, m + 1);
            // Not `>=`: a bound that is not a number keeps the documents.
            let bound = sum * coord * (1.0 + BOUND_SLACK);
            if bound.partial_cmp(&floor) != Some(Ordering::Less) {
                return Some(m + 1);
            }
        }
        None
    }
}

/// The coordination factor of a document matching `matched` of the query's tokens (`coords`
/// holds it for 0 to all of them; a document never matches more than all, and 1 bounds it).
pub(super) fn coord(coords: &[f32], matched: usize) -> f32 {
    coords.get(matched).copied().unwrap_or(1.0)
}

/// Sets the bits of `row` (a block from document `start`, `block` documents) of the
/// documents of `postings`, clearing the others.
fn fill_row(row: &mut [u64], postings: &[Posting], start: usize, block: usize) {
    row.fill(0);
    for &(doc, _, _) in postings {
        let local = (doc as usize).wrapping_sub(start);
        if local < block {
            if let Some(word) = row.get_mut(local / 64) {
                *word |= 1 << (local % 64);
            }
        }
    }
}

/// How many of `docs` documents hold any of `terms` or are in `first` (their bits OR-ed in
/// `union`, counted), and how many postings that read. A block map of whole words (blocks
/// of a multiple of 64 documents) is already the term's bits in document order; other lists
/// set theirs posting by posting.
fn count_matches(
    terms: &[QueryTerm<'_>],
    first: Option<&DocSet<'_>>,
    docs: usize,
    block: usize,
    union: &mut Vec<u64>,
) -> (usize, usize) {
    let mut read = 0;
    union.clear();
    if let Some(first) = first {
        union.extend_from_slice(first.0);
    }
    union.resize(docs.div_ceil(64), 0);
    for term in terms {
        match term.map {
            Some(map) if block.is_multiple_of(64) => {
                for (into, bits) in union.iter_mut().zip(&map.bits) {
                    *into |= bits;
                }
            }
            _ => {
                read += term.list.len();
                for &(doc, _, _) in term.list.iter() {
                    if let Some(word) = union.get_mut(doc as usize / 64) {
                        *word |= 1 << (doc % 64);
                    }
                }
            }
        }
    }
    let total = union.iter().map(|word| word.count_ones() as usize).sum();
    (total, read)
}

/// The bits of word `w` of a block of `block` documents that are documents (the block may
/// end inside it).
fn valid_bits(block: usize, w: usize) -> u64 {
    let valid = block.saturating_sub(64 * w).min(64);
    u64::MAX.checked_shr(64 - valid as u32).unwrap_or(0)
}

/// The most matches [`at_least`] counts: a document matching this many terms passes whatever
/// more were asked (its test only has to be necessary).
const MAX_COUNT: usize = 8;

/// Of 64 documents, those at least `least` of `terms` (one word of bits each) hold, counted
/// bit-sliced up to [`MAX_COUNT`].
fn at_least(terms: &[u64], least: usize) -> u64 {
    match least {
        0 | 1 => terms.iter().fold(0, |any, x| any | x),
        2 => {
            let (mut one, mut two) = (0, 0);
            for &x in terms {
                two |= one & x;
                one |= x;
            }
            two
        }
        3 => {
            let (mut one, mut two, mut three) = (0, 0, 0);
            for &x in terms {
                three |= two & x;
                two |= one & x;
                one |= x;
            }
            three
        }
        _ => {
            let need = least.min(MAX_COUNT);
            let mut counts = [0u64; MAX_COUNT];
            for &x in terms {
                for m in (1..need).rev() {
                    counts[m] |= counts[m - 1] & x;
                }
                counts[0] |= x;
            }
            counts[need - 1]
        }
    }
}

/// A set of documents, one bit each, in words kept between queries.
struct DocSet<'w>(&'w mut Vec<u64>);

impl<'w> DocSet<'w> {
    /// The empty set of `docs` documents, in `words`.
    fn empty(words: &'w mut Vec<u64>, docs: usize) -> Self {
        words.clear();
        words.resize(docs.div_ceil(64), 0);
        Self(words)
    }

    fn insert(&mut self, doc: u32) {
        if let Some(word) = self.0.get_mut(doc as usize / 64) {
            *word |= 1 << (doc % 64);
        }
    }

    /// Bits `64·w .. 64·w + 64` of the block starting at document `start`.
    fn word(&self, start: usize, w: usize) -> u64 {
        let bit = start + 64 * w;
        let (i, shift) = (bit / 64, bit % 64);
        let low = self.0.get(i).copied().unwrap_or(0) >> shift;
        let high = match shift {
            0 => 0,
            s => self.0.get(i + 1).copied().unwrap_or(0) << (64 - s),
        };
        low | high
    }
}

/// What a block pass needs per query besides its terms, kept per thread for the next:
/// allocating them (zeroed, most of them) for every query made the allocator sweep its
/// lists of small free chunks, cold memory, on a long chat's every query.
#[derive(Default)]
struct Buffers {
    /// The rarest term's documents ([`DocSet`]): a long chat's is over a kilobyte.
    first: Vec<u64>,
    /// Every term's documents, for [`count_matches`].
    union: Vec<u64>,
    /// Per word of a block, each term's bits (see [`Bm25Index::top`]).
    columns: Vec<u64>,
    /// One term's bits in a block, filled from its postings.
    row: Vec<u64>,
    /// Per term, where its postings in the block start and end in its list.
    segments: Vec<(usize, usize)>,
    /// The coordination factor for each number of matched terms.
    coords: Vec<f32>,
    bounds: Bounds,
}

thread_local! {
    /// The last query's [`Buffers`], for the next.
    static SPARE: Cell<Buffers> = Cell::new(Buffers::default());
}

/// [`Buffers`] lent to one query, given back to the thread when dropped.
struct Lent(Buffers);

impl Lent {
    fn take() -> Self {
        // (Not after the thread's locals are gone, as in another local's destructor: then
        // new buffers.)
        Self(SPARE.try_with(Cell::take).unwrap_or_default())
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let buffers = std::mem::take(&mut self.0);
        // Kept for the next query, unless the thread's locals are gone already.
        let _ = SPARE.try_with(|spare| spare.set(buffers));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query_tokens;
    use proptest::prelude::*;

    const WORDS: &[&str] = &[
        "kai", "mira", "gate", "silver", "lantern", "river", "oak", "tea",
    ];

    /// Every match scored, best `k` first (ties to the higher slot), and the match count.
    fn best_of_all(idx: &Bm25Index, q: &[String], k: usize) -> (Vec<(u32, f32)>, usize) {
        best_from(idx, q, k, 0)
    }

    /// [`best_of_all`] among the documents from `from` on.
    fn best_from(idx: &Bm25Index, q: &[String], k: usize, from: u32) -> (Vec<(u32, f32)>, usize) {
        let mut rest: Vec<(u32, f32)> = idx
            .score(q)
            .into_iter()
            .filter(|(doc, _)| *doc >= from)
            .collect();
        let total = rest.len();
        rest.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
        rest.truncate(k);
        (rest, total)
    }

    fn text(words: &[usize]) -> String {
        let words: Vec<&str> = words.iter().map(|w| WORDS[*w]).collect();
        words.join(" ")
    }

    proptest! {
        /// Whatever the block size, `top` keeps exactly the best `k` of scoring every match
        /// (same documents, same scores to the bit, same order) and counts every match — on
        /// documents with weighted fields, as history indexes them.
        #[test]
        fn same_best_and_total(
            docs in prop::collection::vec(
                (prop::collection::vec(0usize..8, 1..8), prop::collection::vec(0usize..8, 0..4)),
                1..200,
            ),
            query in prop::collection::vec(0usize..8, 1..6),
            k in 0usize..15,
            block in 1usize..70,
        ) {
            let mut plain = Bm25Index::new();
            let mut mapped = Bm25Index::with_block_maps(block);
            for (i, (own, neighbour)) in docs.iter().enumerate() {
                let (own, neighbour) = (text(own), text(neighbour));
                let fields = [(own.as_str(), 1.0), (neighbour.as_str(), 0.5)];
                plain.insert_fields(i as u32, 0, &fields);
                mapped.insert_fields(i as u32, 0, &fields);
            }
            let q = query_tokens(&text(&query));
            let want = best_of_all(&plain, &q, k);
            let walk = plain.top_in_blocks(&q, k, block);
            prop_assert_eq!(&(walk.top, walk.total), &want);
            prop_assert_eq!(&plain.top(&q, k), &want);
            prop_assert_eq!(&mapped.top(&q, k), &want);
        }

        /// `top_from` keeps the best `k` of the documents from `from` on, and counts only
        /// those, exactly as scoring every match and dropping the rest.
        #[test]
        fn top_from_is_the_best_of_the_rest(
            docs in prop::collection::vec(prop::collection::vec(0usize..8, 1..8), 1..120),
            query in prop::collection::vec(0usize..8, 1..5),
            k in 0usize..12,
            from in 0u32..130,
        ) {
            let mut idx = Bm25Index::for_top();
            for (i, own) in docs.iter().enumerate() {
                idx.insert(i as u32, &text(own));
            }
            let q = query_tokens(&text(&query));
            prop_assert_eq!(idx.top_from(&q, k, from), best_from(&idx, &q, k, from));
        }

        /// Grown as a chat grows (each message indexed, then given its next neighbour in place),
        /// a mapped index still ranks exactly as scoring every match.
        #[test]
        fn grown_like_a_chat(
            messages in prop::collection::vec(prop::collection::vec(0usize..8, 1..6), 1..300),
            query in prop::collection::vec(0usize..8, 1..5),
            k in 1usize..12,
            block in 1usize..40,
        ) {
            let mut idx = Bm25Index::with_block_maps(block);
            let texts: Vec<String> = messages.iter().map(|m| text(m)).collect();
            for (i, own) in texts.iter().enumerate() {
                if let Some(before) = i.checked_sub(1) {
                    prop_assert!(idx.add_fields_to_last(before as u32, &[(own, 0.5)]));
                }
                let prev = i.checked_sub(1).map_or("", |p| texts[p].as_str());
                idx.insert_fields(i as u32, 0, &[(own, 1.0), (prev, 0.5)]);
            }
            prop_assert!(!idx.exact_only && !idx.stale);
            let q = query_tokens(&text(&query));
            prop_assert_eq!(idx.top(&q, k), best_of_all(&idx, &q, k));
        }

        /// A block map gives every document's term frequency exactly as its list holds it —
        /// frequencies it can code in a byte and ones it cannot (a third, above 127½), after
        /// growing in place as a chat's do.
        #[test]
        fn block_map_frequencies_are_the_lists(
            // Enough messages that the commonest word's list is long enough for a map.
            messages in prop::collection::vec(prop::collection::vec(0usize..8, 1..6), 200..300),
            weight in prop::sample::select(vec![0.5f32, 1.0, 1.0 / 3.0, 40.0]),
            block in 1usize..40,
        ) {
            let mut idx = Bm25Index::with_block_maps(block);
            let texts: Vec<String> = messages.iter().map(|m| text(m)).collect();
            for (i, own) in texts.iter().enumerate() {
                if let Some(before) = i.checked_sub(1) {
                    prop_assert!(idx.add_fields_to_last(before as u32, &[(own, weight)]));
                }
                idx.insert_fields(i as u32, 0, &[(own, 1.0)]);
            }
            let words: Vec<String> = WORDS.iter().map(|w| (*w).to_owned()).collect();
            let q = query_tokens(&words.join(" "));
            let mut checked = 0;
            for term in idx.weighted_terms(&q, messages.len() as f32, None) {
                let Some(map) = term.map else { continue };
                for doc in 0..messages.len() as u32 + 3 {
                    let want = term.list.iter().find(|p| p.0 == doc).map(|p| p.1.to_bits());
                    prop_assert_eq!(map.tf(doc, &term.list).map(f32::to_bits), want, "doc {}", doc);
                }
                checked += 1;
            }
            prop_assert!(checked > 0, "no list was long enough for a map");
        }

        /// A block map says exactly which documents its list holds and where.
        #[test]
        fn block_maps_find_every_posting(
            gaps in prop::collection::vec(1u32..40, 0..300),
            block in 1usize..200,
        ) {
            let mut doc = 0;
            let list: Vec<Posting> = gaps
                .iter()
                .map(|g| {
                    doc += g;
                    (doc, 1.0, 1)
                })
                .collect();
            let map = BlockMap::of(&list, block).expect("in order");
            for d in 0..doc + 50 {
                prop_assert_eq!(map.position(d), list.iter().position(|p| p.0 == d), "doc {}", d);
            }
        }
    }

    /// Frequencies a byte codes come back to the bit; every other one is coded 0 ("read the
    /// list").
    #[test]
    fn frequency_codes_are_exact_or_absent() {
        for step in 1..=255u8 {
            let tf = f32::from(step) / 2.0;
            assert_eq!(tf_code(tf), step, "{tf}");
        }
        for tf in [
            0.0,
            -0.0,
            -0.5,
            0.25,
            1.0 / 3.0,
            127.75,
            128.0,
            f32::MIN_POSITIVE / 2.0,
            f32::MAX,
            f32::INFINITY,
            f32::NAN,
        ] {
            assert_eq!(tf_code(tf), 0, "{tf}");
        }
    }

    /// A term frequency grown in place (a message gaining its next neighbour) raises its
    /// block's bound: the block where it is the best document is not skipped.
    #[test]
    fn a_frequency_grown_in_place_raises_its_blocks_bound() {
        let mut idx = Bm25Index::with_block_maps(64);
        for i in 0..200u32 {
            // The first block's documents score higher than the rest, so their floor would
            // skip the later blocks if a bound did not see the growth below.
            idx.insert(i, if i < 64 { "kai kai" } else { "kai" });
            if i == 130 {
                assert!(idx.add_fields_to_last(i, &[("kai kai kai kai", 0.5)]));
            }
        }
        let q = query_tokens("kai");
        let want = best_of_all(&idx, &q, 3);
        assert_eq!(want.0.first().map(|d| d.0), Some(130));
        assert_eq!(idx.top(&q, 3), want);
    }

    /// A weight so large a document's length is infinite breaks the bounds: scored in full,
    /// whether the length overflows at once or by growing in place.
    #[test]
    fn an_infinite_length_falls_back_to_scoring_all() {
        let mut grown = Bm25Index::for_top();
        grown.insert(0, "kai");
        for _ in 0..4 {
            assert!(grown.add_fields_to_last(0, &[("x", 3e38)]));
        }
        assert!(grown.exact_only);
        let mut idx = Bm25Index::for_top();
        for i in 0..3000u32 {
            idx.insert(i, if i % 300 == 0 { "kai river" } else { "kai" });
        }
        idx.insert_fields(3000, 0, &[("kai oak", 3e38)]);
        assert!(idx.exact_only);
        let q = query_tokens("kai river");
        // Compared bit for bit: that document's score is not a number.
        let bits = |(top, total): (Vec<(u32, f32)>, usize)| {
            (
                top.iter()
                    .map(|(d, s)| (*d, s.to_bits()))
                    .collect::<Vec<_>>(),
                total,
            )
        };
        assert_eq!(bits(idx.top(&q, 5)), bits(best_of_all(&idx, &q, 5)));
    }

    /// With several common terms, a document is looked up only when it matches enough of them
    /// and its own bound reaches the floor — even when the rarest term holds fewer documents
    /// than are wanted, so the floor starts at nothing.
    #[test]
    fn documents_matching_too_few_terms_are_not_looked_up() {
        let mut idx = Bm25Index::with_block_maps(256);
        for i in 0..5000u32 {
            // Lengths differ, so few documents tie for the best.
            let mut text = ["river"; 97][..(i as usize / 6) % 97].join(" ");
            text.push_str(" kai");
            if i % 2 == 0 {
                text.push_str(" oak");
            }
            if i % 3 == 0 {
                text.push_str(" tea");
            }
            if i % 2000 == 7 {
                text.push_str(" lantern");
            }
            idx.insert(i, &text);
        }
        let q = query_tokens("lantern kai oak tea");
        let walk = idx.top_in_blocks(&q, 5, 256);
        assert_eq!((walk.top, walk.total), best_of_all(&idx, &q, 5));
        assert_eq!(walk.total, 5000);
        // Reading every posting of an essential common term (as this did before) read 2,096.
        assert!(walk.read < 200, "{} of 9,170 postings read", walk.read);
    }

    /// A term frequency summed or grown past the largest float, in a document whose length
    /// (rounded once) stays finite, breaks the bounds as an infinite length does: scored in
    /// full, with or without block maps (review finding).
    #[test]
    fn an_infinite_term_frequency_falls_back_to_scoring_all() {
        // Ten times this is the largest float; adding it up ten times overflows.
        const W: f32 = 3.402_823_5e37;
        let kai10 = ["kai"; 10].join(" ");
        let q = query_tokens("kai river");
        let mut grown = Bm25Index::new();
        for i in 0..3000u32 {
            grown.insert(i, if i % 3 == 0 { "kai river" } else { "kai" });
        }
        assert!(grown.add_fields_to_last(2999, &[(&kai10, W)]));
        assert!(grown.exact_only);
        assert_eq!(grown.top(&q, 3), best_of_all(&grown, &q, 3));
        let mut mapped = Bm25Index::for_top();
        for i in 0..3000u32 {
            mapped.insert(i, if i % 3 == 0 { "kai river" } else { "kai" });
        }
        mapped.insert_fields(3000, 0, &[(&kai10, W)]);
        assert!(mapped.exact_only);
        assert_eq!(mapped.top(&q, 3), best_of_all(&mapped, &q, 3));
    }

    /// The pruning is real: with one rare and one very common term, the common term is read
    /// only for the documents the rare one found, and counted from its block map.
    #[test]
    fn common_terms_are_looked_up_not_read() {
        let mut idx = Bm25Index::with_block_maps(256);
        for i in 0..5000u32 {
            let text = if i % 50 == 7 { "kai lantern" } else { "kai" };
            idx.insert(i, text);
        }
        let q = query_tokens("kai lantern");
        let walk = idx.top_in_blocks(&q, 5, 256);
        assert_eq!((walk.top.clone(), walk.total), best_of_all(&idx, &q, 5));
        assert_eq!(walk.total, 5000);
        // The rare term's 100 postings, and the common term's for those documents only.
        assert_eq!(walk.read, 200, "of 5100 postings");
        // Walked in blocks the maps were not made for, the common term is read whole (to
        // count it) on top of those 200.
        let unmapped = idx.top_in_blocks(&q, 5, 100);
        assert_eq!((unmapped.top, unmapped.read), (walk.top, 5200));
    }

    /// A block where no number of matches reaches the floor is skipped; a list without a map
    /// is then read on from the last block walked, past the skipped ones, and still looked
    /// up right.
    #[test]
    fn blocks_that_cannot_reach_the_floor_are_skipped() {
        let mut idx = Bm25Index::with_block_maps(256);
        for i in 0..4096u32 {
            let mut text = String::from("river");
            if i % 1024 == 100 {
                text.push_str(" lantern");
            }
            // Sparse (1 in 256, below a map's density), once in every block; rare enough that
            // `oak tea` outscores the rarer lantern alone.
            if i % 256 == 3 {
                text.push_str(" oak");
            }
            // Common, so mapped, in the last four blocks only.
            if i >= 3072 {
                text.push_str(" tea");
            }
            idx.insert(i, &text);
        }
        let q = query_tokens("lantern oak tea");
        let walk = idx.top_in_blocks(&q, 3, 256);
        assert_eq!((walk.top.clone(), walk.total), best_of_all(&idx, &q, 3));
        // The lantern's four documents set the floor; only `oak tea` beats it, and only the
        // last four blocks hold `tea`.
        assert_eq!(walk.walked, 4, "of 16 blocks");
        assert!(
            walk.top.iter().any(|&(doc, _)| doc % 256 == 3),
            "{:?}",
            walk.top
        );
    }

    /// Lists out of document order (a document indexed again) or stale postings fall back to
    /// scoring every match, with the same results; the block maps are dropped for good (kept,
    /// a list out of order would rebuild its map on every append).
    #[test]
    fn reindexed_documents_fall_back_to_scoring_all() {
        let mut idx = Bm25Index::for_top();
        for i in 0..3000u32 {
            idx.insert(i, if i % 3 == 0 { "kai river" } else { "kai" });
        }
        assert!(idx.shards.iter().any(|s| !s.maps.is_empty()));
        idx.insert(10, "river river oak");
        idx.remove(11);
        assert!(idx.stale && idx.exact_only);
        for i in 3000..3100u32 {
            idx.insert(i, "kai river");
        }
        assert!(idx
            .shards
            .iter()
            .all(|s| s.maps.is_empty() && s.map_block == 0));
        for query in ["kai river", "oak", "river kai oak"] {
            let q = query_tokens(query);
            assert_eq!(idx.top(&q, 7), best_of_all(&idx, &q, 7), "{query}");
        }
    }
}
