//! Bulk indexing (opening a large store): every document is tokenized once — two threads
//! each take half of the documents and sort each token into the stream of the shard that owns
//! it — then each shard interns its own streams on its own thread, in document order, so the
//! term ids (and the whole index) are those one-by-one inserts give. Tokenizing per shard, as
//! before, did the analyzer's work twice.

use super::{pack, shard_of, Shard, SHARDS};
use crate::analyzer::for_each_index_token;

/// Documents tokenized and interned per round: bounds the token streams held at once (about
/// three times the round's text) while each posting list still grows only once per round.
const ROUND_DOCS: usize = 1 << 18;

/// One shard's tokens of a run of documents: 8 bytes per token (most are packed into their
/// key, which is all interning needs), plus the bytes of the few longer ones. The streams of
/// a round are the largest thing an open holds besides the store itself.
#[derive(Debug, Default)]
pub(super) struct ShardTokens {
    /// The bytes of the tokens too long to pack, one after another.
    text: String,
    /// Per token: its packed key, or [`LONG`] with its length for one whose bytes are next in
    /// `text`.
    tokens: Vec<u64>,
    /// Per document, in order: how many of `tokens` are its.
    per_doc: Vec<u32>,
}

/// Marks a token of [`ShardTokens::tokens`] that is not packed (its length below): no packed
/// key has this top byte (a CJK key's is `0x80`, a short word's its length, at most 7).
const LONG: u64 = 0xFF << 56;

/// The packed key of a stream entry, or the length of a long token's bytes.
fn entry(token: u64) -> Result<u64, usize> {
    if token & LONG == LONG {
        Err(usize::try_from(token & !LONG).unwrap_or(usize::MAX))
    } else {
        Ok(token)
    }
}

/// Tokenizes `docs` once, each token into the stream of its shard.
fn tokenize(docs: &[(u32, &str)]) -> [ShardTokens; SHARDS] {
    let mut out: [ShardTokens; SHARDS] = Default::default();
    for (_, text) in docs {
        let mut counts = [0u32; SHARDS];
        for_each_index_token(text, |token| {
            let key = pack(token);
            let me = shard_of(token, key);
            let stream = &mut out[me];
            match key {
                Some(key) => stream.tokens.push(key),
                None => {
                    stream.text.push_str(token);
                    stream.tokens.push(LONG | token.len() as u64);
                }
            }
            counts[me] = counts[me].saturating_add(1);
        });
        for (stream, n) in out.iter_mut().zip(counts) {
            stream.per_doc.push(n);
        }
    }
    out
}

impl Shard {
    /// Interns the tokens of `streams` (consecutive runs of `docs`, in order) and adds their
    /// postings with each list grown once.
    fn index_streams(
        &mut self,
        streams: [&ShardTokens; 2],
        docs: &[(u32, &str)],
        groups: &[u32],
        generations: &[u32],
    ) {
        let mut group = groups.iter().copied();
        let mut ids: Vec<(u32, f32)> = Vec::with_capacity(64);
        let mut terms: Vec<(u32, f32)> = Vec::new();
        let mut bounds = Vec::with_capacity(docs.len() + 1);
        bounds.push(0);
        for stream in streams {
            let (mut start, mut next) = (0, 0);
            for &n in &stream.per_doc {
                ids.clear();
                let group = group.next().unwrap_or(0);
                let end = next + n as usize;
                for &token in stream.tokens.get(next..end).unwrap_or_default() {
                    let id = match entry(token) {
                        // A packed token is interned by its key alone.
                        Ok(key) => self.intern("", Some(key), group),
                        Err(len) => {
                            let stop = start + len;
                            let text = stream.text.get(start..stop).unwrap_or_default();
                            start = stop;
                            self.intern(text, None, group)
                        }
                    };
                    ids.push((id, 1.0));
                }
                next = end;
                // As `terms_of` sums a field's weights: same order, same floats.
                ids.sort_unstable_by_key(|(id, _)| *id);
                for run in ids.chunk_by(|a, b| a.0 == b.0) {
                    terms.push((run[0].0, run.iter().map(|(_, w)| w).sum()));
                }
                bounds.push(terms.len());
            }
        }
        self.push_all(docs, generations, &terms, &bounds);
    }
}

/// Indexes `docs` (in their `groups`, with their new `generations`) into `shards`: per round,
/// tokenized once on two threads, then interned per shard on two threads.
pub(super) fn index_docs(
    shards: &mut [Shard; SHARDS],
    docs: &[(u32, &str)],
    groups: &[u32],
    generations: &[u32],
) {
    index_in_rounds(shards, docs, groups, generations, ROUND_DOCS);
}

fn index_in_rounds(
    shards: &mut [Shard; SHARDS],
    docs: &[(u32, &str)],
    groups: &[u32],
    generations: &[u32],
    round_docs: usize,
) {
    let round_docs = round_docs.max(1);
    let rounds = docs
        .chunks(round_docs)
        .zip(groups.chunks(round_docs))
        .zip(generations.chunks(round_docs));
    for ((round, groups), gens) in rounds {
        let (front, back) = round.split_at(round.len() / 2);
        let (first, second) = std::thread::scope(|s| {
            let second = s.spawn(|| tokenize(back));
            let first = tokenize(front);
            // A panicking tokenizer is a bug, not bad input: it unwinds here as it would have
            // on one thread.
            let second = second
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (first, second)
        });
        let [a0, a1] = &first;
        let [b0, b1] = &second;
        let [s0, s1] = shards;
        std::thread::scope(|s| {
            s.spawn(|| s1.index_streams([a1, b1], round, groups, gens));
            s0.index_streams([a0, b0], round, groups, gens);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Bm25Index;
    use crate::query_tokens;

    /// Documents in both scripts, some slots indexed twice, enough to take the bulk path.
    fn docs() -> Vec<(u32, u32, String)> {
        let words = [
            "silver", "gate", "lantern", "keeper", "river", "spirit", "fears", "water",
        ];
        let zh = ["银色大门", "河灵", "灯笼", "守门人", "雨夜", "北方的旅人"];
        (0..700u32)
            .map(|i| {
                let n = i as usize;
                let text = format!(
                    "{} {} {}{} {}",
                    words[n % words.len()],
                    zh[n % zh.len()],
                    words[(n * 7) % words.len()],
                    n % 13,
                    zh[(n * 5) % zh.len()]
                );
                // Slots 0..600, the last 100 documents re-index earlier slots.
                (i % 600, i % 5, text)
            })
            .collect()
    }

    #[test]
    fn bulk_indexing_gives_the_index_one_by_one_inserts_give() {
        let docs = docs();
        let refs: Vec<(u32, u32, &str)> =
            docs.iter().map(|(d, g, t)| (*d, *g, t.as_str())).collect();
        let mut one = Bm25Index::new();
        for (d, g, t) in &refs {
            one.insert_fields(*d, *g, &[(t, 1.0)]);
        }
        let mut bulk = Bm25Index::new();
        bulk.insert_many(&refs);
        for q in [
            "silver gate",
            "银色大门",
            "lantern 灯笼",
            "keeper12",
            "北方 travel",
            "fear water",
        ] {
            let q = query_tokens(q);
            assert_eq!(one.score(&q), bulk.score(&q), "{q:?}");
            assert_eq!(
                one.score_in(&q, Some(&[2, 3])),
                bulk.score_in(&q, Some(&[2, 3])),
                "{q:?}"
            );
        }
    }

    /// A stream entry is read back as the packed key it is, never as a long token's length.
    #[test]
    fn no_packed_key_reads_as_a_long_token() {
        let tokens = [
            "a",
            "lantern",
            "\u{7f}\u{7f}\u{7f}\u{7f}\u{7f}\u{7f}\u{7f}",
            "é",
            "银",
            "银色",
            "\u{3134A}\u{3134A}",
            "\u{2FA1D}",
            "ㄅ",
        ];
        for token in tokens {
            let key = pack(token).unwrap_or_else(|| panic!("{token:?} is packed"));
            assert_eq!(entry(key), Ok(key), "{token:?}");
        }
        assert_eq!(entry(LONG | 9), Err(9));
        assert_eq!(pack("lanterns"), None, "eight bytes are a long token");
    }

    #[test]
    fn any_round_size_builds_the_same_shards() {
        let docs = docs();
        let texts: Vec<(u32, &str)> = docs.iter().map(|(d, _, t)| (*d, t.as_str())).collect();
        let groups: Vec<u32> = docs.iter().map(|(_, g, _)| *g).collect();
        let generations: Vec<u32> = (0..texts.len() as u32).map(|i| i % 3 + 1).collect();
        let build = |round: usize| {
            let mut shards: [Shard; SHARDS] = Default::default();
            index_in_rounds(&mut shards, &texts, &groups, &generations, round);
            shards
        };
        let whole = build(usize::MAX);
        for round in [1, 7, 256] {
            let parts = build(round);
            for (a, b) in whole.iter().zip(&parts) {
                assert_eq!(a.lists, b.lists, "round {round}");
                assert_eq!(a.postings, b.postings, "round {round}");
                assert_eq!(a.max_tf, b.max_tf, "round {round}");
            }
        }
    }
}
