//! The inverted index: a term dictionary in two shards (short tokens packed into integers),
//! posting lists per term and group with document generations (re-indexing a slot never leaves
//! old terms matching; a search of some groups reads only their lists), per-group statistics,
//! and block maps for the long lists of chat-like indexes.
//! Scoring is in [`score`], the pruned top-k collector in [`top`], the pruned matches near
//! the best (memory search) in [`best`].

mod best;
mod bulk;
mod image;
mod lists;
mod score;
mod terms;
#[cfg(test)]
mod tests;
mod top;

pub use best::BestMatches;
use rustc_hash::{FxHashMap, FxHashSet};
use std::borrow::Cow;
use tavern_core::tokens::is_cjk;

use crate::analyzer::{for_each_index_token, word_len};

/// Packs a token into a `u64` when it is short: one or two CJK characters (bit 63 set, 21 bits
/// each), or up to 7 bytes of other text (length in the top byte). `None` for longer tokens.
fn pack(token: &str) -> Option<u64> {
    let mut chars = token.chars();
    let first = chars.next()?;
    if is_cjk(first) {
        let second = chars.next().map_or(0, u64::from);
        if chars.next().is_none() {
            return Some(1 << 63 | u64::from(first) << 21 | second);
        }
    }
    let bytes = token.as_bytes();
    if bytes.len() > 7 {
        return None;
    }
    let mut key = (bytes.len() as u64) << 56;
    for (i, b) in bytes.iter().enumerate() {
        key |= u64::from(*b) << (8 * i);
    }
    Some(key)
}

/// Number of term shards; bulk indexing builds each on its own thread.
const SHARDS: usize = 2;

/// Which shard owns a token.
fn shard_of(token: &str, key: Option<u64>) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let h = match key {
        Some(k) => k ^ (k >> 29) ^ (k >> 47),
        None => {
            let mut hasher = rustc_hash::FxBuildHasher.build_hasher();
            hasher.write(token.as_bytes());
            hasher.finish() >> 7
        }
    };
    (h as usize) % SHARDS
}

/// A posting: document, term frequency (weighted: a token of a field with weight ½ counts ½),
/// and the document generation it belongs to.
type Posting = (u32, f32, u32);

/// One shard of the term dictionary with its postings.
#[derive(Debug, Default, Clone)]
struct Shard {
    /// Term ids by token; short tokens (CJK uni/bigrams, Latin words up to 7 bytes) packed
    /// into integers: most lookups compare a `u64` instead of strings.
    terms: terms::Terms,
    /// Per term: its posting lists, one per group that has it, so a search of some groups
    /// reads (and counts document frequencies from) their postings only, however many other
    /// groups the index holds.
    lists: Vec<GroupLists>,
    /// Posting lists by list id (a term in a group); those of an image decoded when first
    /// needed.
    postings: lists::Lists,
    /// Per list, the largest term frequency any of its postings ever had (never lowered, so
    /// always an upper bound): what bounds a term's contribution when pruning.
    max_tf: Vec<f32>,
    /// Documents per block of the long lists' block maps; 0: no block maps are kept.
    map_block: usize,
    /// Block maps of the long lists ([`top::BlockMap`]), by list id.
    maps: FxHashMap<u32, top::BlockMap>,
    /// Per document, how many postings of its current version this shard holds (saturating:
    /// at the most, unknown): taking a replaced version out is complete only when that many
    /// were found.
    doc_postings: Vec<u16>,
}

/// A term's posting lists by group: `(group, list id)` sorted by group; one group (every
/// chat index, most terms of a store) is kept without allocating, in 16 bytes per term.
#[derive(Debug, Clone, PartialEq, Default)]
enum GroupLists {
    #[default]
    Empty,
    One {
        group: u32,
        list: u32,
    },
    #[allow(clippy::box_collection)] // boxed: the enum stays 16 bytes for the common one list
    Many(Box<Vec<(u32, u32)>>),
}

impl GroupLists {
    /// The list of `group`, if the term has one.
    fn get(&self, group: u32) -> Option<u32> {
        match self {
            Self::Empty => None,
            Self::One { group: g, list } => (*g == group).then_some(*list),
            Self::Many(all) => all
                .binary_search_by_key(&group, |(g, _)| *g)
                .ok()
                .map(|i| all[i].1),
        }
    }

    /// Every list id, by group.
    fn lists(&self) -> impl Iterator<Item = u32> + '_ {
        let (one, many) = match self {
            Self::Empty => (None, &[][..]),
            Self::One { list, .. } => (Some(*list), &[][..]),
            Self::Many(all) => (None, &all[..]),
        };
        one.into_iter().chain(many.iter().map(|(_, l)| *l))
    }

    /// Records `list` as `group`'s (which has none yet).
    fn insert(&mut self, group: u32, list: u32) {
        match self {
            Self::Empty => *self = Self::One { group, list },
            Self::One { group: g, list: l } => {
                let mut all = vec![(*g, *l), (group, list)];
                all.sort_unstable_by_key(|(g, _)| *g);
                *self = Self::Many(Box::new(all));
            }
            Self::Many(all) => {
                let at = all.partition_point(|(g, _)| *g < group);
                all.insert(at, (group, list));
            }
        }
    }
}

impl Shard {
    /// The posting list of `token` in `group`, interning the token and creating the list as
    /// needed.
    fn intern(&mut self, token: &str, key: Option<u64>, group: u32) -> u32 {
        let term = match self.terms.get(token, key) {
            Some(term) => term,
            None => {
                let next = u32::try_from(self.lists.len()).unwrap_or(u32::MAX);
                self.terms.insert(token, key, next);
                self.lists.push(GroupLists::default());
                next
            }
        };
        let lists = &mut self.lists[term as usize];
        if let Some(list) = lists.get(group) {
            return list;
        }
        let list = self.postings.push_empty();
        lists.insert(group, list);
        self.max_tf.push(0.0);
        list
    }

    /// Appends a posting to list `term` (and to its block map, keeping one while the list is
    /// long for how many documents there are).
    fn push(&mut self, term: u32, posting: Posting) {
        if let Some(count) = self.doc_postings.get_mut(posting.0 as usize) {
            *count = count.saturating_add(1);
        }
        self.raise_max_tf(term, posting.1);
        let Some(list) = self.postings.get_mut(term as usize) else {
            return;
        };
        list.push(posting);
        if self.map_block > 0 {
            top::BlockMap::follow(&mut self.maps, term, list, self.map_block);
        }
    }

    fn raise_max_tf(&mut self, term: u32, tf: f32) {
        if let Some(max) = self.max_tf.get_mut(term as usize) {
            *max = max.max(tf);
        }
    }

    /// A query token's postings in `groups` (`None`: every group); `None` when it has none
    /// there.
    fn lookup_term(
        &self,
        token: &str,
        key: Option<u64>,
        groups: Option<&[u32]>,
    ) -> Option<QueryTerm<'_>> {
        let id = self.terms.get(token, key)?;
        let lists = self.lists.get(id as usize)?;
        let mut chosen: Vec<u32> = match groups {
            None => lists.lists().collect(),
            Some(groups) => groups.iter().filter_map(|g| lists.get(*g)).collect(),
        };
        // A group whose documents were all removed keeps empty lists after a compaction: the
        // term's postings must not hide behind one (`top` reads the first list alone).
        chosen.retain(|l| !self.postings.is_empty_list(*l as usize));
        let first = *chosen.first()?;
        let max_tf = chosen
            .iter()
            .map(|l| self.max_tf[*l as usize])
            .fold(0.0, f32::max);
        let rest = chosen
            .drain(1..)
            .map(|l| self.postings.get(l as usize))
            .collect::<Vec<_>>();
        Some(QueryTerm {
            list: self.postings.get(first as usize),
            map: rest.is_empty().then(|| self.maps.get(&first)).flatten(),
            rest,
            weight: 0.0,
            max_tf,
        })
    }

    /// The `(list id, weighted term frequency)` pairs of the tokens of `fields` this shard
    /// owns, in `group`'s lists, interning new terms.
    fn terms_of(
        &mut self,
        me: usize,
        group: u32,
        fields: &[(&str, f32)],
        ids: &mut Vec<(u32, f32)>,
        out: &mut Vec<(u32, f32)>,
    ) {
        ids.clear();
        for (text, weight) in fields {
            for_each_index_token(text, |token| {
                let key = pack(token);
                if shard_of(token, key) == me {
                    ids.push((self.intern(token, key, group), *weight));
                }
            });
        }
        ids.sort_unstable_by_key(|(id, _)| *id);
        for run in ids.chunk_by(|a, b| a.0 == b.0) {
            out.push((run[0].0, run.iter().map(|(_, w)| w).sum()));
        }
    }

    /// Takes `doc`'s postings of `generation` out of `group`'s lists of the tokens of `fields`
    /// this shard owns (`keep`: only looks for them); `false` when one of them is not there or
    /// the document has others (`fields` are not what it was indexed from).
    #[allow(clippy::too_many_arguments)]
    fn take_out(
        &mut self,
        me: usize,
        doc: u32,
        group: u32,
        generation: u32,
        fields: &[(&str, f32)],
        keep: bool,
        ids: &mut Vec<u32>,
    ) -> bool {
        ids.clear();
        let mut found = true;
        for (text, _) in fields {
            for_each_index_token(text, |token| {
                let key = pack(token);
                if shard_of(token, key) != me {
                    return;
                }
                let term = self.terms.get(token, key);
                match term.and_then(|t| self.lists.get(t as usize)?.get(group)) {
                    Some(list) => ids.push(list),
                    None => found = false,
                }
            });
        }
        ids.sort_unstable();
        ids.dedup();
        // Every posting of the version is named (a saturated count is unknown).
        found &= self
            .doc_postings
            .get(doc as usize)
            .is_some_and(|n| *n < u16::MAX && usize::from(*n) == ids.len());
        for &list in ids.iter() {
            let Some(postings) = self.postings.get_mut(list as usize) else {
                found = false;
                continue;
            };
            // Lists are in document order unless documents were indexed again: look where
            // the document would be, then (out of order) from the end.
            let guess = postings.partition_point(|p| p.0 < doc);
            let at = postings[guess..]
                .iter()
                .take_while(|p| p.0 == doc)
                .position(|p| p.2 == generation)
                .map(|i| guess + i)
                .or_else(|| {
                    postings
                        .iter()
                        .rposition(|p| p.0 == doc && p.2 == generation)
                });
            match at {
                Some(_) if keep => {}
                Some(at) => {
                    postings.remove(at);
                    // Positions moved: a block map of the list no longer holds.
                    self.maps.remove(&list);
                }
                None => found = false,
            }
        }
        found
    }

    /// Adds the postings of `doc` for the tokens of `fields` this shard owns; `false` when a
    /// term frequency is not finite (weights so large their sum overflows).
    #[allow(clippy::too_many_arguments)]
    fn index(
        &mut self,
        me: usize,
        doc: u32,
        group: u32,
        generation: u32,
        fields: &[(&str, f32)],
        ids: &mut Vec<(u32, f32)>,
    ) -> bool {
        let mut terms = Vec::new();
        self.terms_of(me, group, fields, ids, &mut terms);
        let mut finite = true;
        for (term, tf) in terms {
            finite &= tf.is_finite();
            self.push(term, (doc, tf, generation));
        }
        finite
    }

    /// Adds the postings of many documents, `hits` being one `(list, k)` per token of
    /// document `k` (`docs[k]`, `generations[k]`) in document order: a list's hits of one
    /// document make one posting, its term frequency their count. Hits are grouped by list,
    /// so each list is found, grown and raised once per call (hundreds of thousands of lists
    /// growing posting by posting dominated opening a store and importing).
    fn push_all(&mut self, docs: &[u32], generations: &[u32], hits: Vec<(u32, u32)>) {
        let hits = by_list(hits, self.postings.len());
        for run in hits.chunk_by(|a, b| a.0 == b.0) {
            let term = run[0].0;
            let Some(list) = self.postings.get_mut(term as usize) else {
                continue;
            };
            let n = run.chunk_by(|a, b| a.1 == b.1).count();
            // Exact for what a round mostly makes (an open's lists, each in one go);
            // amortized for a list growing a little at a time (imports of a few thousand
            // records each): exact there copied the whole list at every import.
            if n >= list.len() {
                list.reserve_exact(n);
            } else {
                list.reserve(n);
            }
            let mut max_tf = 0.0f32;
            for same in run.chunk_by(|a, b| a.1 == b.1) {
                let k = same[0].1 as usize;
                let (Some(doc), Some(generation)) = (docs.get(k), generations.get(k)) else {
                    continue;
                };
                // As `terms_of` sums a field's weights of 1: exact below 2^24.
                let tf = same.len() as f32;
                max_tf = max_tf.max(tf);
                list.push((*doc, tf, *generation));
                if let Some(count) = self.doc_postings.get_mut(*doc as usize) {
                    *count = count.saturating_add(1);
                }
                if self.map_block > 0 {
                    top::BlockMap::follow(&mut self.maps, term, list, self.map_block);
                }
            }
            self.raise_max_tf(term, max_tf);
        }
    }
}

/// `hits` (`(list, k)` pairs, `k` ascending) grouped by list, each list's in their order:
/// counted into place over every list when the hits are many (an open's rounds), sorted
/// when they are few beside the `lists` (a small import into a large index touches few).
fn by_list(mut hits: Vec<(u32, u32)>, lists: usize) -> Vec<(u32, u32)> {
    if hits.len().saturating_mul(4) < lists {
        // `k` ascending within a list, as the hits came.
        hits.sort_unstable();
        return hits;
    }
    let mut starts = vec![0usize; lists + 1];
    for (list, _) in &hits {
        if let Some(n) = starts.get_mut(*list as usize + 1) {
            *n += 1;
        }
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut out = vec![(0u32, 0u32); starts[lists]];
    for hit in hits {
        if let Some(at) = starts.get_mut(hit.0 as usize) {
            if let Some(slot) = out.get_mut(*at) {
                *slot = hit;
                *at += 1;
            }
        }
    }
    out
}

/// Texts tokenized by [`Bm25Index::tokenize`], for [`Bm25Index::insert_tokenized`].
#[derive(Debug)]
pub struct Tokenized<'a> {
    texts: Vec<&'a str>,
    /// `None` when the texts are too few to index in bulk, or more than a round.
    round: Option<bulk::Round>,
}

/// Document count and total length of one group of documents (a memory scope).
#[derive(Debug, Default, Clone, Copy)]
struct GroupStats {
    docs: u32,
    len: f64,
}

/// An inverted index over documents identified by `u32` slots the caller assigns, each in a
/// group (a memory scope; `0` when the caller has none). Terms are interned into two shards by
/// hash. Postings count only while their generation is the document's current one, so
/// re-indexing a slot never leaves old terms matching.
///
/// Scores are BM25 over the documents of the groups searched: document count, average length
/// and document frequencies are those of the searched groups, so a busy scope elsewhere does
/// not change how rare a word is here. Each group has its own posting list per term, so a
/// search of a few groups reads their postings only: its work follows the size of the scopes
/// searched, not of the store (a group costs a list header per term it uses).
#[derive(Debug, Default, Clone)]
pub struct Bm25Index {
    shards: [Shard; SHARDS],
    generation: Vec<u32>,
    doc_len: Vec<f32>,
    group: Vec<u32>,
    alive: Vec<bool>,
    live_docs: u32,
    total_len: f64,
    groups: Vec<GroupStats>,
    dead_docs: usize,
    /// Whether any posting may be stale (a document removed or re-indexed since the last
    /// compaction); while none is, document frequencies are just list lengths.
    stale: bool,
    /// A bit per document removed or indexed again since the last compaction: only those can
    /// have stale postings, and the bits (a sixty-fourth of the memory of the lookups that
    /// tell) stay in cache while a common term's postings are checked.
    dirty: Vec<u64>,
    /// The document indexed last, while it is live: its postings end every list it is in.
    last: Option<u32>,
    /// One past the highest document ever indexed.
    next_doc: u32,
    /// Whether [`Bm25Index::top`] must score every match: a document was indexed at or below
    /// an earlier one (a posting list may be out of document order), or a field weight was not
    /// positive and finite (no term-frequency bound holds).
    exact_only: bool,
    /// Whether a weight, length or term frequency was not a positive finite number, so the
    /// bounds pruning relies on may not hold ([`Bm25Index::best`] then scores every match;
    /// it walks lists in any order, so documents indexed out of order do not matter to it).
    bounds_broken: bool,
    /// The shortest length any document ever had (never raised, so a lower bound for every
    /// live document); `None` before the first.
    min_len: Option<f32>,
}

/// A query token found in the index: its postings (in the groups searched), its BM25 weight
/// and the largest term frequency among its postings.
struct QueryTerm<'a> {
    /// Its postings in the first group searched that has it (borrowed from the index, or
    /// decoded for this query when the index keeps no more decoded lists).
    list: Cow<'a, [Posting]>,
    /// Its postings in the other groups searched that have it (each list a group's).
    rest: Vec<Cow<'a, [Posting]>>,
    weight: f32,
    max_tf: f32,
    /// The list's block map, when it is the term's only list and long enough to keep one.
    map: Option<&'a top::BlockMap>,
}

impl QueryTerm<'_> {
    /// Every list of the term in the groups searched.
    fn lists(&self) -> impl Iterator<Item = &[Posting]> + '_ {
        std::iter::once(&*self.list).chain(self.rest.iter().map(|l| &**l))
    }
}

/// The length of weighted fields: each field's [`word_len`] times its weight.
fn fields_len(fields: &[(&str, f32)]) -> f32 {
    fields
        .iter()
        .map(|(text, weight)| word_len(text) as f32 * weight)
        .sum()
}

/// From this many documents on, [`Bm25Index::insert_many`] indexes them in bulk (`bulk`:
/// tokenized once on two threads, interned per shard on two threads).
const BULK_DOCS: usize = 256;

impl Bm25Index {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index that keeps, for its long posting lists, a map of which documents they
    /// hold (one bit per document), so [`Bm25Index::top`] finds a document's posting in a
    /// common term's list without reading the list. For indexes queried with
    /// [`Bm25Index::top`] whose documents are added in slot order (a chat's messages); a map
    /// holds under about 1.9 times what the list it maps holds. Once a document is indexed out
    /// of order, the maps are dropped and no longer kept.
    pub fn for_top() -> Self {
        Self::with_block_maps(top::BLOCK_DOCS)
    }

    fn with_block_maps(block: usize) -> Self {
        let mut index = Self::default();
        for shard in &mut index.shards {
            shard.map_block = block.max(1).next_power_of_two();
        }
        index
    }

    /// Makes room for about `docs` more documents.
    pub fn reserve(&mut self, docs: usize) {
        self.doc_len.reserve(docs);
        self.alive.reserve(docs);
        self.generation.reserve(docs);
        self.group.reserve(docs);
        for shard in &mut self.shards {
            shard.terms.reserve(docs * 2);
            shard.postings.reserve(docs * 2);
        }
    }

    /// The number of live documents.
    pub fn len(&self) -> usize {
        self.live_docs as usize
    }

    /// Whether some postings are of documents removed or indexed again since the last
    /// compaction (searches then check each posting of their terms): never after only
    /// [`Bm25Index::insert_fields`] of new documents and [`Bm25Index::replace_fields`].
    pub fn has_stale_postings(&self) -> bool {
        self.stale
    }

    /// Whether no document is live.
    pub fn is_empty(&self) -> bool {
        self.live_docs == 0
    }

    /// Starts a new version of `doc` in `group`: drops the old one and records the new length.
    fn begin(&mut self, doc: u32, group: u32, len: f32) -> u32 {
        self.remove(doc);
        let idx = doc as usize;
        if self.doc_len.len() <= idx {
            self.doc_len.resize(idx + 1, 0.0);
            self.alive.resize(idx + 1, false);
            self.generation.resize(idx + 1, 0);
            self.group.resize(idx + 1, 0);
        }
        let g = group as usize;
        if self.groups.len() <= g {
            self.groups.resize(g + 1, GroupStats::default());
        }
        self.generation[idx] = self.generation[idx].wrapping_add(1);
        for shard in &mut self.shards {
            if shard.doc_postings.len() <= idx {
                shard.doc_postings.resize(idx + 1, 0);
            }
            shard.doc_postings[idx] = 0;
        }
        self.last = Some(doc);
        if !len.is_finite() {
            self.unbounded();
        } else if doc < self.next_doc {
            self.score_in_full();
        } else {
            self.next_doc = doc.saturating_add(1);
        }
        self.min_len = Some(self.min_len.map_or(len, |m| m.min(len)));
        self.doc_len[idx] = len;
        self.group[idx] = group;
        self.alive[idx] = true;
        self.live_docs += 1;
        self.total_len += f64::from(len);
        self.groups[g].docs += 1;
        self.groups[g].len += f64::from(len);
        self.generation[idx]
    }

    /// Indexes `text` as document `doc` of group 0 (replacing an earlier version of it).
    pub fn insert(&mut self, doc: u32, text: &str) {
        self.insert_fields(doc, 0, &[(text, 1.0)]);
    }

    /// Indexes document `doc` of `group` (replacing an earlier version of it) from weighted
    /// fields: a token of a field of weight `w` adds `w` to its term frequency and the field's
    /// words add `w` each to the document length. Weights should be positive; multiples of ½
    /// keep every sum exact, so an index built in any order scores exactly alike.
    pub fn insert_fields(&mut self, doc: u32, group: u32, fields: &[(&str, f32)]) {
        self.check_weights(fields);
        // Length counts words and CJK characters once; the auxiliary CJK unigrams would
        // otherwise make Chinese records look twice as long as they are.
        let generation = self.begin(doc, group, fields_len(fields));
        let mut ids = Vec::with_capacity(64);
        let mut finite = true;
        for (me, shard) in self.shards.iter_mut().enumerate() {
            finite &= shard.index(me, doc, group, generation, fields, &mut ids);
        }
        // A term frequency summed past the largest float breaks the bounds as an infinite
        // length does (a length is rounded once, so it can stay finite).
        if !finite {
            self.unbounded();
        }
    }

    /// Indexes document `doc` of `group` from `fields` as [`Bm25Index::insert_fields`] does,
    /// when it is live and was indexed last from `old` in the same group: its old postings are
    /// taken out of their lists instead of being left behind as stale postings that every
    /// search of their terms must check and count past (a store's records are edited and
    /// forgotten all the time). When `old` equals `fields` (and they are what the document
    /// holds), nothing changes. If `old` is not
    /// what the document was indexed from, the postings it names are not all found: the ones
    /// left are then dropped as [`Bm25Index::insert_fields`] drops them.
    pub fn replace_fields(
        &mut self,
        doc: u32,
        group: u32,
        old: &[(&str, f32)],
        fields: &[(&str, f32)],
    ) {
        let idx = doc as usize;
        let live_here = self.alive.get(idx).copied().unwrap_or(false) && self.group[idx] == group;
        if !live_here {
            self.insert_fields(doc, group, fields);
            return;
        }
        let generation = self.generation[idx];
        let mut ids = Vec::with_capacity(64);
        // The same fields again (a forget keeps the text): nothing changes, once the
        // document is seen to hold exactly their postings.
        let same = old == fields;
        let mut all_found = true;
        for (me, shard) in self.shards.iter_mut().enumerate() {
            all_found &= shard.take_out(me, doc, group, generation, old, same, &mut ids);
        }
        if same && all_found {
            return;
        }
        if !all_found {
            // Some old postings are still in their lists: they go stale as usual.
            self.insert_fields(doc, group, fields);
            return;
        }
        // Nothing of the old version is left in a list: its statistics go, and the new
        // version comes in under the next generation, without marking anything stale.
        let len = self.doc_len[idx];
        self.alive[idx] = false;
        self.live_docs -= 1;
        self.total_len -= f64::from(len);
        let g = &mut self.groups[group as usize];
        g.docs -= 1;
        g.len -= f64::from(len);
        if self.last == Some(doc) {
            self.last = None;
        }
        self.insert_fields(doc, group, fields);
    }

    /// Adds weighted fields to document `doc` as [`Bm25Index::insert_fields`] would have
    /// indexed them with its other fields, when `doc` is the document indexed last (its
    /// postings then end every list they are in, so each is updated where it stands and none
    /// goes stale). Returns `false`, changing nothing, for any other document: the caller
    /// indexes it again with all its fields.
    pub fn add_fields_to_last(&mut self, doc: u32, fields: &[(&str, f32)]) -> bool {
        let idx = doc as usize;
        if self.last != Some(doc) || !self.alive.get(idx).copied().unwrap_or(false) {
            return false;
        }
        self.check_weights(fields);
        let added = fields_len(fields);
        if !(self.doc_len[idx] + added).is_finite() {
            self.unbounded();
        }
        self.doc_len[idx] += added;
        self.total_len += f64::from(added);
        let group = self.group[idx] as usize;
        if let Some(g) = self.groups.get_mut(group) {
            g.len += f64::from(added);
        }
        let generation = self.generation[idx];
        let (mut ids, mut terms) = (Vec::with_capacity(64), Vec::new());
        let mut finite = true;
        for (me, shard) in self.shards.iter_mut().enumerate() {
            terms.clear();
            shard.terms_of(me, group as u32, fields, &mut ids, &mut terms);
            for &(term, tf) in &terms {
                let Some(list) = shard.postings.get_mut(term as usize) else {
                    continue;
                };
                match list.last_mut() {
                    Some(p) if p.0 == doc && p.2 == generation => {
                        p.1 += tf;
                        let grown = p.1;
                        finite &= grown.is_finite();
                        shard.raise_max_tf(term, grown);
                        if let Some(map) = shard.maps.get_mut(&term) {
                            map.raise(doc, grown);
                        }
                    }
                    _ => {
                        finite &= tf.is_finite();
                        shard.push(term, (doc, tf, generation));
                    }
                }
            }
        }
        if !finite {
            self.unbounded();
        }
        true
    }

    /// Turns pruning off for good when a weight breaks the bounds it relies on.
    fn check_weights(&mut self, fields: &[(&str, f32)]) {
        if fields.iter().any(|(_, w)| !(w.is_finite() && *w > 0.0)) {
            self.unbounded();
        }
    }

    /// From now on no term-frequency or length bound is trusted: [`Bm25Index::top`] and
    /// [`Bm25Index::best`] score every match.
    fn unbounded(&mut self) {
        self.bounds_broken = true;
        self.score_in_full();
    }

    /// From now on [`Bm25Index::top`] scores every match (its bounds or its walk in document
    /// order no longer hold): the block maps, of no more use, are dropped and no longer kept
    /// (rebuilding them on every append to a list out of order would cost the whole list).
    fn score_in_full(&mut self) {
        self.exact_only = true;
        for shard in &mut self.shards {
            shard.map_block = 0;
            shard.maps = FxHashMap::default();
        }
    }

    /// Indexes many `(doc, group, text)` documents at once, each shard on its own thread
    /// (opening a large store). Equivalent to calling [`Bm25Index::insert_fields`] for each
    /// with weight 1, in order.
    pub fn insert_many(&mut self, docs: &[(u32, u32, &str)]) {
        // A slot indexed twice keeps only its last text, as sequential inserts would.
        let mut last: FxHashMap<u32, usize> = FxHashMap::default();
        for (i, (doc, _, _)) in docs.iter().enumerate() {
            last.insert(*doc, i);
        }
        let docs: Vec<(u32, u32, &str)> = docs
            .iter()
            .enumerate()
            .filter(|(i, (doc, _, _))| last.get(doc) == Some(i))
            .map(|(_, d)| *d)
            .collect();
        // A few documents (a catch-up, one write): threads and exact per-list reservations
        // cost more than they save, and each call would touch every posting list.
        if docs.len() < BULK_DOCS {
            for (doc, group, text) in docs {
                self.insert_fields(doc, group, &[(text, 1.0)]);
            }
            return;
        }
        bulk::index_docs(self, &docs);
    }

    /// Tokenizes `texts` for [`Bm25Index::insert_tokenized`] without the index: the analyzer's
    /// work (most of indexing's), on two threads of its own, can run while the caller does
    /// something else with the index (a store appends and applies the records of an import
    /// meanwhile). Only texts enough for bulk indexing and few enough for one round are
    /// tokenized ahead (a round's tokens take a few times its text); others are only kept, to
    /// be indexed as [`Bm25Index::insert_many`] does.
    pub fn tokenize<'a>(texts: &[&'a str]) -> Tokenized<'a> {
        let ahead = (BULK_DOCS..=bulk::ROUND_DOCS).contains(&texts.len());
        Tokenized {
            texts: texts.to_vec(),
            round: ahead.then(|| bulk::tokenize_round(texts)),
        }
    }

    /// Indexes `docs[i]` (`(doc, group)`) with the text `tokenized` holds at `i`: what
    /// [`Bm25Index::insert_many`] does with those texts (tokenized ahead or not, and a
    /// document named twice keeping its last text). `false`, and nothing indexed, when `docs`
    /// are not as many as the texts.
    #[must_use]
    pub fn insert_tokenized(&mut self, docs: &[(u32, u32)], tokenized: Tokenized<'_>) -> bool {
        if docs.len() != tokenized.texts.len() {
            return false;
        }
        let distinct = || {
            let mut seen = FxHashSet::default();
            docs.iter().all(|(doc, _)| seen.insert(*doc))
        };
        match tokenized.round {
            Some(round) if distinct() => bulk::index_round(self, docs, &round),
            _ => {
                let all: Vec<(u32, u32, &str)> = docs
                    .iter()
                    .zip(&tokenized.texts)
                    .map(|((doc, group), text)| (*doc, *group, *text))
                    .collect();
                self.insert_many(&all);
            }
        }
        true
    }

    /// Drops document `doc` from results (its postings are skipped until the next compaction).
    pub fn remove(&mut self, doc: u32) {
        let idx = doc as usize;
        if self.alive.get(idx).copied().unwrap_or(false) {
            if self.last == Some(doc) {
                self.last = None;
            }
            self.alive[idx] = false;
            self.stale = true;
            let word = idx / 64;
            if self.dirty.len() <= word {
                self.dirty.resize(word + 1, 0);
            }
            self.dirty[word] |= 1 << (idx % 64);
            self.live_docs -= 1;
            self.total_len -= f64::from(self.doc_len[idx]);
            let g = &mut self.groups[self.group[idx] as usize];
            g.docs -= 1;
            g.len -= f64::from(self.doc_len[idx]);
            self.dead_docs += 1;
            if self.dead_docs > 1024 && self.dead_docs > self.live_docs as usize {
                self.compact();
            }
        }
    }

    fn compact(&mut self) {
        let (alive, generation) = (&self.alive, &self.generation);
        for shard in &mut self.shards {
            // Positions move: the maps are built again as their lists grow.
            shard.maps.clear();
            for list in shard.postings.all_mut() {
                list.retain(|(d, _, g)| alive[*d as usize] && generation[*d as usize] == *g);
            }
        }
        self.dead_docs = 0;
        self.stale = false;
        self.dirty = Vec::new();
    }
}
