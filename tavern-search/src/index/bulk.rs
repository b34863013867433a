//! Bulk indexing (opening a large store, an import): every document is tokenized once — two
//! threads each take half of the documents and sort each token into the stream of the shard
//! that owns it — then each shard interns its own streams on its own thread, in document order,
//! so the term ids (and the whole index) are those one-by-one inserts give. Tokenizing per
//! shard, as before, did the analyzer's work twice. A round can be tokenized ahead, apart from
//! the index ([`tokenize_round`], for [`Bm25Index::tokenize`]).

use super::{pack, shard_of, Bm25Index, Shard, SHARDS};
use crate::analyzer::{for_each_index_token_with, with_lent_stems, Stems};

/// Documents tokenized and interned per round: bounds the token streams held at once (a few
/// times the round's text) while each posting list still grows only once per round. Texts
/// are tokenized ahead only up to one round.
pub(super) const ROUND_DOCS: usize = 1 << 18;

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

/// A run of documents tokenized: each shard's tokens, and each document's length.
#[derive(Debug, Default)]
struct Streams {
    streams: [ShardTokens; SHARDS],
    /// Per document, in order: its [`crate::analyzer::word_len`], counted while tokenizing.
    lens: Vec<usize>,
}

/// Tokenizes `texts` once, each token into the stream of its shard (with a lent memo of
/// stems: the thread is new at every round).
fn tokenize(texts: &[&str]) -> Streams {
    with_lent_stems(|stems| tokenize_with(stems, texts))
}

fn tokenize_with(stems: &mut Stems, texts: &[&str]) -> Streams {
    let mut out = Streams::default();
    out.lens.reserve_exact(texts.len());
    // About what CJK text makes (a unigram and a bigram per 3-byte character, half of them
    // each shard's), above what Latin text does: streams grown token by token were copied
    // again and again.
    let bytes: usize = texts.iter().map(|text| text.len()).sum();
    for stream in &mut out.streams {
        stream.tokens.reserve(bytes / 4);
        stream.per_doc.reserve_exact(texts.len());
    }
    for text in texts {
        let mut counts = [0u32; SHARDS];
        let len = for_each_index_token_with(stems, text, |token| {
            let key = pack(token);
            let me = shard_of(token, key);
            let stream = &mut out.streams[me];
            match key {
                Some(key) => stream.tokens.push(key),
                None => {
                    stream.text.push_str(token);
                    stream.tokens.push(LONG | token.len() as u64);
                }
            }
            counts[me] = counts[me].saturating_add(1);
        });
        out.lens.push(len);
        for (stream, n) in out.streams.iter_mut().zip(counts) {
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
        docs: &[u32],
        groups: &[u32],
        generations: &[u32],
    ) {
        let mut group = groups.iter().copied();
        let tokens: usize = streams.iter().map(|s| s.tokens.len()).sum();
        let mut hits: Vec<(u32, u32)> = Vec::with_capacity(tokens);
        let mut k = 0u32;
        for stream in streams {
            let (mut start, mut next) = (0, 0);
            for &n in &stream.per_doc {
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
                    hits.push((id, k));
                }
                next = end;
                k += 1;
            }
        }
        self.push_all(docs, generations, hits);
    }
}

/// The texts of a round tokenized, its first half and its second (each on its thread).
#[derive(Debug)]
pub(super) struct Round([Streams; 2]);

/// Tokenizes the texts of one round (at most [`ROUND_DOCS`]), two threads.
pub(super) fn tokenize_round(texts: &[&str]) -> Round {
    let (front, back) = texts.split_at(texts.len() / 2);
    std::thread::scope(|s| {
        let second = s.spawn(|| tokenize(back));
        let first = tokenize(front);
        // A panicking tokenizer is a bug, not bad input: it unwinds here as it would have
        // on one thread.
        let second = second
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Round([first, second])
    })
}

/// Indexes `(doc, group, text)` documents, each document once (the caller keeps a document's
/// last text), into `index`: per round, tokenized once on two threads, each document begun
/// with the length counted there, then interned per shard on two threads.
pub(super) fn index_docs(index: &mut Bm25Index, docs: &[(u32, u32, &str)]) {
    index_in_rounds(index, docs, ROUND_DOCS);
}

fn index_in_rounds(index: &mut Bm25Index, docs: &[(u32, u32, &str)], round_docs: usize) {
    for round in docs.chunks(round_docs.max(1)) {
        let texts: Vec<&str> = round.iter().map(|(_, _, text)| *text).collect();
        let tokenized = tokenize_round(&texts);
        let docs: Vec<(u32, u32)> = round.iter().map(|(doc, group, _)| (*doc, *group)).collect();
        index_round(index, &docs, &tokenized);
    }
}

/// Indexes the `(doc, group)` documents of a round (as many as it tokenized, each once) from
/// their tokens: each begun with its length, then interned per shard on two threads.
pub(super) fn index_round(index: &mut Bm25Index, round: &[(u32, u32)], tokenized: &Round) {
    let [first, second] = &tokenized.0;
    let lens = first.lens.iter().chain(&second.lens);
    let generations: Vec<u32> = round
        .iter()
        .zip(lens)
        .map(|((doc, group), len)| index.begin(*doc, *group, *len as f32))
        .collect();
    let docs: Vec<u32> = round.iter().map(|(doc, _)| *doc).collect();
    let groups: Vec<u32> = round.iter().map(|(_, group)| *group).collect();
    let [a0, a1] = &first.streams;
    let [b0, b1] = &second.streams;
    let [s0, s1] = &mut index.shards;
    let (docs, groups, gens) = (&docs[..], &groups[..], &generations[..]);
    std::thread::scope(|s| {
        s.spawn(|| s1.index_streams([a1, b1], docs, groups, gens));
        s0.index_streams([a0, b0], docs, groups, gens);
    });
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

    /// Texts tokenized ahead and inserted with their documents give the index `insert_many`
    /// gives — the same shards, lengths and generations — whether tokenized ahead (unique
    /// documents, enough of them) or not (a document named twice keeps its last text; texts
    /// too few for bulk indexing); documents not as many as the texts are refused.
    #[test]
    fn tokenized_ahead_gives_the_index_insert_many_gives() {
        let docs = docs();
        let texts: Vec<&str> = docs.iter().map(|(_, _, t)| t.as_str()).collect();
        let unique: Vec<(u32, u32)> = (0..docs.len() as u32).map(|d| (d, d % 4)).collect();
        let twice: Vec<(u32, u32)> = docs.iter().map(|(d, g, _)| (*d, *g)).collect();
        let small = &unique[..10];
        for (name, pairs) in [
            ("unique", &unique[..]),
            ("twice", &twice[..]),
            ("small", small),
        ] {
            let with_texts: Vec<(u32, u32, &str)> = pairs
                .iter()
                .zip(&texts)
                .map(|((d, g), t)| (*d, *g, *t))
                .collect();
            let mut many = Bm25Index::new();
            many.insert_many(&with_texts);
            let tokenized = Bm25Index::tokenize(&texts[..pairs.len()]);
            assert_eq!(tokenized.round.is_some(), name != "small", "{name}");
            let mut ahead = Bm25Index::new();
            assert!(ahead.insert_tokenized(pairs, tokenized), "{name}");
            same_shards(&many, &ahead, name);
            assert_eq!(many.doc_len, ahead.doc_len, "{name}");
            assert_eq!(many.generation, ahead.generation, "{name}");
            for q in ["silver gate", "银色大门", "keeper12"] {
                let q = query_tokens(q);
                assert_eq!(many.score(&q), ahead.score(&q), "{name} {q:?}");
            }
        }
        let mut refused = Bm25Index::new();
        assert!(!refused.insert_tokenized(&unique[1..], Bm25Index::tokenize(&texts)));
        assert!(refused.is_empty(), "nothing indexed");
    }

    fn same_shards(a: &Bm25Index, b: &Bm25Index, name: &str) {
        for (a, b) in a.shards.iter().zip(&b.shards) {
            assert_eq!(a.lists, b.lists, "{name}");
            assert_eq!(a.postings, b.postings, "{name}");
            assert_eq!(a.max_tf, b.max_tf, "{name}");
            assert_eq!(a.doc_postings, b.doc_postings, "{name}");
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

    /// Bulk indexing in rounds of any size builds the index one-by-one inserts build: shards
    /// (term ids, postings, term frequencies, counts), lengths, generations; an index keeping
    /// block maps answers its pruned top-k alike.
    #[test]
    fn any_round_size_builds_the_same_shards() {
        let docs = docs();
        // Each slot once, as `insert_many` hands them over.
        let refs: Vec<(u32, u32, &str)> = docs
            .iter()
            .take(600)
            .map(|(d, g, t)| (*d, *g, t.as_str()))
            .collect();
        for (kind, new) in [
            ("plain", Bm25Index::new as fn() -> Bm25Index),
            ("mapped", Bm25Index::for_top),
        ] {
            let mut one = new();
            for (d, g, t) in &refs {
                one.insert_fields(*d, *g, &[(t, 1.0)]);
            }
            for round in [1, 7, 256, usize::MAX] {
                let mut parts = new();
                index_in_rounds(&mut parts, &refs, round);
                let name = format!("{kind}, round {round}");
                same_shards(&one, &parts, &name);
                assert_eq!(one.doc_len, parts.doc_len, "{name}");
                assert_eq!(one.generation, parts.generation, "{name}");
                for q in ["silver gate", "银色大门", "keeper12 water"] {
                    let q = query_tokens(q);
                    assert_eq!(one.top(&q, 5), parts.top(&q, 5), "{name} {q:?}");
                }
            }
        }
    }
}
