//! The index's and the analyzer's unit tests.

use super::*;
use crate::analyzer::*;

/// `(text, index tokens)`: case folding, punctuation, stop words, Snowball stems, CJK.
#[test]
fn index_tokens_table() {
    let cases: &[(&str, &[&str])] = &[
        ("The Silver-Gate, OPEN!", &["silver", "gate", "open"]),
        ("Kai fears deep water", &["kai", "fear", "deep", "water"]),
        ("running runs ran", &["run", "run", "ran"]),
        (
            "Caroline's adoption agencies",
            &["carolin", "adopt", "agenc"],
        ),
        ("It is what it is", &[]),
        ("2023 May 8", &["2023", "may", "8"]),
        ("über Straße", &["über", "straße"]),
        ("大门", &["大", "门", "大门"]),
        ("", &[]),
    ];
    for (text, want) in cases {
        assert_eq!(index_tokens(text), *want, "{text:?}");
    }
}

/// `(query, query tokens)`: what a query keeps to rank with.
#[test]
fn query_tokens_table() {
    let cases: &[(&str, &[&str])] = &[
        ("what is the forest", &["forest"]),
        ("The Shadowfang beasts", &["shadowfang", "beast"]),
        ("is it", &[]),
        ("这是什么", &[]),
        ("银色大门在哪里", &["银色", "色大", "大门", "门在"]),
        ("告诉我塔罗牌", &["诉我", "我塔", "塔罗", "罗牌"]),
        ("的", &[]),
        ("剑", &["剑"]),
        ("tell me about Eldoria", &["eldoria"]),
        ("What does Kai fear?", &["kai", "fear"]),
        ("fear fears feared", &["fear"]),
    ];
    for (query, want) in cases {
        assert_eq!(query_tokens(query), *want, "{query:?}");
    }
}

#[test]
fn a_stemmed_word_finds_its_other_forms() {
    let mut idx = Bm25Index::new();
    idx.insert(0, "Kai fears deep water");
    idx.insert(1, "Mira loves the sea");
    let hits = idx.score(&query_tokens("What is Kai's fear?"));
    assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), [0]);
    assert!(idx.score(&query_tokens("the")).is_empty());
}

#[test]
fn statistics_come_from_the_groups_searched() {
    let mut idx = Bm25Index::new();
    // Group 1 is full of "lantern"; in group 0 it is as rare as "river".
    idx.insert_fields(0, 0, &[("lantern by the river", 1.0)]);
    idx.insert_fields(1, 0, &[("an old map", 1.0)]);
    for d in 2..50 {
        idx.insert_fields(d, 1, &[("lantern lantern", 1.0)]);
    }
    let only0 = idx.score_in(&query_tokens("lantern"), Some(&[0]));
    let river = idx.score_in(&query_tokens("river"), Some(&[0]));
    assert_eq!(only0.len(), 1);
    assert_eq!(only0[0].1, river[0].1, "same df, same score within group 0");
    let all = idx.score(&query_tokens("lantern"));
    assert!(all.len() == 49 && all[0].1 < only0[0].1);
    assert_eq!(
        idx.score_in(&query_tokens("lantern"), Some(&[0, 1])),
        all,
        "every group is the whole index"
    );
    assert!(idx
        .score_in(&query_tokens("lantern"), Some(&[7]))
        .is_empty());
}

#[test]
fn weighted_fields_count_by_weight() {
    let mut idx = Bm25Index::new();
    idx.insert_fields(0, 0, &[("ember", 1.0)]);
    idx.insert_fields(1, 0, &[("ash", 1.0), ("ember", 0.5)]);
    idx.insert_fields(2, 0, &[("ash", 1.0)]);
    let hits = idx.score(&query_tokens("ember"));
    assert_eq!(hits.len(), 2);
    assert!(hits[0].1 > hits[1].1, "{hits:?}");
}

#[test]
fn cjk_runs_become_unigrams_and_bigrams_and_queries_bigrams() {
    assert_eq!(index_tokens("大门"), ["大", "门", "大门"]);
    assert_eq!(query_tokens("银色大门"), ["银色", "色大", "大门"]);
    assert_eq!(query_tokens("门"), ["门"]);
    assert_eq!(
        query_tokens("Mira的银色大门 gate"),
        ["mira", "的银", "银色", "色大", "大门", "gate"]
    );
    assert_eq!(raw_tokens("The 银色大门"), ["the", "银色", "色大", "大门"]);
}

#[test]
fn a_chinese_sentence_matches_the_words_inside_it() {
    let mut idx = Bm25Index::new();
    idx.insert(0, "她推开了银色大门");
    idx.insert(1, "河灵从不归还");
    idx.insert(2, "silver gate");
    let hits = idx.score(&query_tokens("银色大门"));
    assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), [0]);
    assert!(idx.score(&query_tokens("不存在的词")).is_empty());
}

#[test]
fn packed_tokens_never_collide() {
    let tokens = ["a", "ab", "abcdefg", "大", "大门", "门大", "a\u{0}", "ba"];
    let keys: std::collections::HashSet<u64> = tokens.iter().filter_map(|t| pack(t)).collect();
    assert_eq!(keys.len(), tokens.len());
    assert_eq!(pack("abcdefgh"), None);
    assert_eq!(pack("银色大"), None, "three CJK characters are not packed");
}

#[test]
fn bulk_indexing_equals_sequential_indexing() {
    let docs = [
        (0, 0, "银色大门 silver gate"),
        (1, 1, "river spirit 河灵"),
        (0, 1, "lantern keeper"),
        (2, 0, "gate keeper"),
    ];
    let mut one = Bm25Index::new();
    for (d, g, t) in docs {
        one.insert_fields(d, g, &[(t, 1.0)]);
    }
    let mut bulk = Bm25Index::new();
    bulk.insert_many(&docs);
    for q in [
        "gate",
        "keeper",
        "银色大门",
        "lantern",
        "河灵 spirit",
        "silver",
    ] {
        assert_eq!(
            one.score(&query_tokens(q)),
            bulk.score(&query_tokens(q)),
            "{q}"
        );
        assert_eq!(
            one.score_in(&query_tokens(q), Some(&[1])),
            bulk.score_in(&query_tokens(q), Some(&[1])),
            "{q}"
        );
    }
    assert!(
        bulk.score(&query_tokens("silver")).is_empty(),
        "slot 0 was re-indexed"
    );
}

#[test]
fn word_len_counts_words_and_cjk_characters() {
    for text in ["", "a b", "Mira的银色大门 gate!", "x1y2 z", "门", "ÄÖ über"] {
        let mut want = 0;
        for_each_run(text, |run, cjk| want += if cjk { run.len() } else { 1 });
        assert_eq!(word_len(text), want, "{text}");
    }
}

#[test]
fn removed_documents_never_match() {
    let mut idx = Bm25Index::new();
    idx.insert(0, "lantern");
    idx.insert(1, "lantern lantern");
    idx.remove(1);
    assert_eq!(idx.score(&query_tokens("lantern")).len(), 1);
    idx.insert(1, "nothing");
    assert_eq!(idx.score(&query_tokens("lantern")).len(), 1);
}

/// `top` keeps exactly the best `k` of scoring every match (same documents, same scores,
/// same order, ties to the higher slot) and counts every match.
mod top_is_the_best_of_all {
    use super::*;
    use proptest::prelude::*;

    const WORDS: &[&str] = &[
        "kai", "mira", "gate", "silver", "lantern", "river", "oak", "tea",
    ];

    proptest! {
        #[test]
        fn same_best_and_total(
            docs in prop::collection::vec(prop::collection::vec(0usize..8, 1..8), 1..120),
            query in prop::collection::vec(0usize..8, 1..5),
            k in 0usize..15,
        ) {
            let mut idx = Bm25Index::new();
            for (i, words) in docs.iter().enumerate() {
                let text: Vec<&str> = words.iter().map(|w| WORDS[*w]).collect();
                idx.insert(i as u32, &text.join(" "));
            }
            let text: Vec<&str> = query.iter().map(|w| WORDS[*w]).collect();
            let q = query_tokens(&text.join(" "));
            let mut all = idx.score(&q);
            let total = all.len();
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
            all.truncate(k);
            prop_assert_eq!(idx.top(&q, k), (all, total));
        }
    }
}

/// Each group keeps its own posting lists: searching some groups gives exactly what an index of
/// only their live documents gives (same documents, bit-identical scores), whatever the other
/// groups hold, after documents were indexed again (in another group or the same) or removed,
/// one by one or in bulk.
mod groups_are_searched_as_if_alone {
    use super::*;
    use proptest::prelude::*;

    const WORDS: &[&str] = &[
        "kai", "mira", "gate", "silver", "lantern", "river", "灯笼", "河灵",
    ];

    /// An edit: index document `doc` in `group` with `words`, or remove it (`None`).
    type Edit = (u32, u32, Option<Vec<usize>>);

    fn text(words: &[usize]) -> String {
        words
            .iter()
            .map(|w| WORDS[*w])
            .collect::<Vec<_>>()
            .join(" ")
    }

    proptest! {
        #[test]
        fn same_matches_and_scores(
            edits in prop::collection::vec(
                (0u32..40, 0u32..4, prop::option::weighted(0.85, prop::collection::vec(0usize..8, 1..7))),
                1..150,
            ),
            bulk in any::<bool>(),
            query in prop::collection::vec(0usize..8, 1..4),
            searched in prop::collection::vec(0u32..5, 1..3),
            // Slots far apart, so a term's lists of several groups are walked across windows.
            spread in prop::sample::select(vec![1u32, 97]),
        ) {
            // Documents of every group after the edits' (300: enough for the bulk path).
            let filler = (40..340u32).map(|d| (d, d % 5, Some(vec![d as usize % 8, d as usize * 3 % 8])));
            let edits: Vec<Edit> = edits
                .into_iter()
                .chain(filler)
                .map(|(doc, group, words)| (doc * spread, group, words))
                .collect();
            let mut idx = Bm25Index::new();
            if bulk {
                // Opening a store: the final texts in bulk (removals have no place there).
                let texts: Vec<(u32, u32, String)> = edits
                    .iter()
                    .filter_map(|(d, g, w)| w.as_ref().map(|w| (*d, *g, text(w))))
                    .collect();
                let refs: Vec<(u32, u32, &str)> =
                    texts.iter().map(|(d, g, t)| (*d, *g, t.as_str())).collect();
                idx.insert_many(&refs);
            } else {
                for (doc, group, words) in &edits {
                    match words {
                        Some(w) => idx.insert_fields(*doc, *group, &[(&text(w), 1.0)]),
                        None => idx.remove(*doc),
                    }
                }
            }
            // The live documents and their groups, as the edits leave them.
            let mut live: std::collections::BTreeMap<u32, (u32, String)> = Default::default();
            for (doc, group, words) in &edits {
                match words {
                    Some(w) => {
                        live.insert(*doc, (*group, text(w)));
                    }
                    None if !bulk => {
                        live.remove(doc);
                    }
                    None => {}
                }
            }
            let mut alone = Bm25Index::new();
            for (doc, (group, text)) in &live {
                if searched.contains(group) {
                    alone.insert_fields(*doc, 0, &[(text, 1.0)]);
                }
            }
            let q = query_tokens(&text(&query));
            prop_assert_eq!(idx.score_in(&q, Some(&searched)), alone.score(&q));
        }
    }
}

/// `best` keeps every visible match scoring at least the share of the `k`-th best visible
/// score, each bit-identical to scoring every match, and counts every visible match: over
/// groups, removals, documents indexed again, weighted fields, and words of very different
/// frequencies (so that common terms are only counted).
mod best_keeps_every_match_near_the_best {
    use super::*;
    use proptest::prelude::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    const WORDS: &[&str] = &[
        "kai", "mira", "gate", "silver", "lantern", "river", "灯笼", "河灵",
    ];
    /// Word choices, the first words far more common than the last.
    const SKEW: &[usize] = &[0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4, 5, 6, 7];

    fn text(words: &[usize]) -> String {
        words
            .iter()
            .map(|w| WORDS[SKEW[*w]])
            .collect::<Vec<_>>()
            .join(" ")
    }

    proptest! {
        #[test]
        fn same_scores_and_count(
            edits in prop::collection::vec(
                (
                    0u32..120,
                    0u32..3,
                    prop::option::weighted(0.9, prop::collection::vec(0usize..19, 1..9)),
                    prop::sample::select(vec![1.0f32, 0.5, 2.0]),
                    0usize..40,
                ),
                1..260,
            ),
            query in prop::collection::vec(0usize..19, 1..6),
            searched in prop::option::of(prop::collection::vec(0u32..4, 1..3)),
            k in 0usize..12,
            share in prop::sample::select(vec![0.0f32, 0.3, 0.7, 1.0]),
            hide in prop::option::of((2u32..5, 0u32..2)),
        ) {
            let mut idx = Bm25Index::new();
            for (doc, group, words, weight, filler) in &edits {
                // Lengths far apart (a filler word no query has), so scores spread widely.
                let filler = "oak ".repeat(*filler);
                match words {
                    Some(w) => idx.insert_fields(*doc, *group, &[(&text(w), *weight), (&filler, 1.0)]),
                    None => idx.remove(*doc),
                }
            }
            let visible = |doc: u32| hide.is_none_or(|(m, r)| doc % m != r);
            let q = query_tokens(&text(&query));
            let groups = searched.as_deref();
            let mut all: Vec<(u32, f32)> = idx
                .score_unordered(&q, groups)
                .into_iter()
                .filter(|(doc, _)| visible(*doc))
                .collect();
            let asked = RefCell::new(HashMap::<u32, usize>::new());
            let ask = |doc: u32| {
                *asked.borrow_mut().entry(doc).or_default() += 1;
                visible(doc)
            };
            let best = idx.best(&q, groups, k, share, hide.map(|_| &ask as &dyn Fn(u32) -> bool));
            prop_assert_eq!(best.matched, all.len());
            prop_assert!(asked.borrow().values().all(|n| *n == 1), "visible asked twice");
            let scores: HashMap<u32, u32> = all.iter().map(|(d, s)| (*d, s.to_bits())).collect();
            for (doc, score) in &best.hits {
                prop_assert_eq!(scores.get(doc), Some(&score.to_bits()), "doc {}", doc);
            }
            all.sort_by(|a, b| b.1.total_cmp(&a.1));
            let floor = match all.get(k.wrapping_sub(1)) {
                Some((_, kth)) if k > 0 => kth * share,
                _ => 0.0,
            };
            let kept: HashMap<u32, f32> = best.hits.iter().copied().collect();
            for (doc, score) in all.iter().filter(|(_, s)| *s >= floor) {
                prop_assert_eq!(kept.get(doc), Some(score), "doc {} dropped", doc);
            }
        }
    }
}

/// A document first met at a common term, whose contribution there is below the floor, is
/// still scored when the terms after it can lift it to the floor (and coordination with them).
#[test]
fn best_keeps_a_document_that_later_terms_lift() {
    for filler in 0..40 {
        let mut idx = Bm25Index::new();
        // "silver" is rare (two long documents), "lantern" and "river" are common.
        for doc in 0..200u32 {
            let text = match doc {
                0 | 1 => format!("silver {}", "oak ".repeat(filler)),
                2 => "lantern lantern lantern river river river".to_owned(),
                _ if doc % 10 == 0 => "lantern tea".to_owned(),
                _ if doc % 10 == 5 => "river tea".to_owned(),
                _ => "tea cup".to_owned(),
            };
            idx.insert(doc, &text);
        }
        let q = query_tokens("silver lantern river");
        let all = idx.score_unordered(&q, None);
        let top = all.iter().map(|h| h.1).fold(0.0, f32::max);
        let best = idx.best(&q, None, 1, 1.0, None);
        for (doc, score) in all.iter().filter(|h| h.1 >= top) {
            assert!(
                best.hits.contains(&(*doc, *score)),
                "filler {filler}: doc {doc}"
            );
        }
    }
}

/// On a large index, a rare term's few matches are scored and a common term's many are only
/// counted: what `best` is for.
#[test]
fn best_only_counts_the_matches_of_a_common_term() {
    let mut idx = Bm25Index::new();
    for doc in 0..5_000u32 {
        let text = match doc % 1000 {
            0 => "silver lantern gate",
            _ if doc % 2 == 0 => "the gate stands open",
            _ => "a river runs past the gate",
        };
        idx.insert(doc, text);
    }
    let q = query_tokens("silver gate");
    let best = idx.best(&q, None, 3, 0.7, None);
    assert_eq!(best.matched, 5_000);
    let mut docs: Vec<u32> = best.hits.iter().map(|h| h.0).collect();
    docs.sort_unstable();
    assert_eq!(docs, [0, 1000, 2000, 3000, 4000]);
    // Without a floor every match is a hit.
    assert_eq!(idx.best(&q, None, 0, 0.7, None).hits.len(), 5_000);
}

/// Replacing a document's fields takes its old postings out: the index scores exactly as one
/// holding only the final versions, and nothing goes stale — unless the old fields given are
/// wrong, when the postings left behind go stale as with `insert_fields`.
mod replaced_documents_leave_nothing_behind {
    use super::*;
    use proptest::prelude::*;

    const WORDS: &[&str] = &["kai", "mira", "gate", "silver", "灯笼", "河灵"];

    fn text(words: &[usize]) -> String {
        words
            .iter()
            .map(|w| WORDS[*w])
            .collect::<Vec<_>>()
            .join(" ")
    }

    proptest! {
        #[test]
        fn same_scores_as_the_final_versions(
            edits in prop::collection::vec(
                (0u32..30, 0u32..2, prop::collection::vec(0usize..6, 1..6), prop::sample::select(vec![1.0f32, 0.5])),
                1..120,
            ),
            wrong_old in prop::option::of(0usize..120),
            query in prop::collection::vec(0usize..6, 1..4),
            group in 0u32..2,
        ) {
            let mut idx = Bm25Index::new();
            let mut live: std::collections::BTreeMap<u32, (u32, String, f32)> = Default::default();
            for (i, (doc, g, words, weight)) in edits.iter().enumerate() {
                let new = text(words);
                match live.get(doc) {
                    Some((_, old, old_w)) => {
                        let old = if wrong_old == Some(i) { "mira silver".to_owned() } else { old.clone() };
                        idx.replace_fields(*doc, *g, &[(&old, *old_w)], &[(&new, *weight)]);
                    }
                    None => idx.insert_fields(*doc, *g, &[(&new, *weight)]),
                }
                live.insert(*doc, (*g, new, *weight));
            }
            // A document indexed again in another group leaves stale postings (its old
            // group's lists are not given).
            let mut seen = std::collections::HashMap::new();
            let moved = edits
                .iter()
                .any(|(d, g, _, _)| seen.insert(*d, *g).is_some_and(|old| old != *g));
            if wrong_old.is_none_or(|w| w >= edits.len()) && !moved {
                prop_assert!(!idx.stale, "a replacement left stale postings");
            }
            let mut alone = Bm25Index::new();
            for (doc, (g, text, weight)) in &live {
                if *g == group {
                    alone.insert_fields(*doc, 0, &[(text, *weight)]);
                }
            }
            let q = query_tokens(&text(&query));
            prop_assert_eq!(idx.score_in(&q, Some(&[group])), alone.score(&q));
        }
    }
}

/// `replace_fields` with an `old` that is not what the document was indexed from but equals
/// the new fields still replaces it: the document no longer matches its real previous text.
#[test]
fn a_wrong_old_equal_to_the_new_fields_still_replaces() {
    let mut idx = Bm25Index::new();
    idx.insert_fields(0, 0, &[("kai", 1.0)]);
    idx.insert_fields(1, 0, &[("gate", 1.0)]);
    idx.replace_fields(0, 0, &[("mira silver", 1.0)], &[("mira silver", 1.0)]);
    let mut want = Bm25Index::new();
    want.insert_fields(0, 0, &[("mira silver", 1.0)]);
    want.insert_fields(1, 0, &[("gate", 1.0)]);
    for q in ["kai", "mira", "silver"] {
        let q = query_tokens(q);
        assert_eq!(idx.score(&q), want.score(&q), "{q:?}");
    }
}

/// With a weight that is not positive the bounds are broken: every visible match is a hit,
/// whatever its score (negative, or not a number).
#[test]
fn without_bounds_every_match_is_a_hit_whatever_its_score() {
    for weight in [f32::NAN, -1.0f32] {
        let mut idx = Bm25Index::new();
        idx.insert_fields(0, 0, &[("kai", weight), ("oak oak oak", 1.0)]);
        idx.insert_fields(1, 0, &[("kai gate", 1.0)]);
        let q = query_tokens("kai");
        let all = idx.score_unordered(&q, None);
        assert_eq!(all.len(), 2);
        for k in [0, 1, 5] {
            let best = idx.best(&q, None, k, 0.7, None);
            assert_eq!(best.matched, 2);
            let mut docs: Vec<u32> = best.hits.iter().map(|h| h.0).collect();
            docs.sort_unstable();
            assert_eq!(docs, [0, 1], "weight {weight}, k {k}: all {all:?}");
        }
    }
}

/// `best` against scoring every match, and the index against one built from the final
/// versions, after bulk indexing, edits in place and across groups, wrong old fields,
/// additions to the last document and removals.
mod best_after_every_kind_of_edit {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const WORDS: &[&str] = &[
        "kai", "mira", "gate", "silver", "lantern", "river", "灯笼", "河灵",
    ];
    const SKEW: &[usize] = &[0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4, 5, 6, 7];

    fn text(words: &[usize]) -> String {
        words
            .iter()
            .map(|w| WORDS[SKEW[*w]])
            .collect::<Vec<_>>()
            .join(" ")
    }

    proptest! {
        #[test]
        fn same_scores_and_count(
            bulk in prop::collection::vec((0u32..60, 0u32..3, prop::collection::vec(0usize..19, 1..6)), 0..300),
            edits in prop::collection::vec(
                (0u32..80, 0u32..3, 0u8..6, prop::collection::vec(0usize..19, 1..8),
                 prop::sample::select(vec![1.0f32, 0.5, 2.0]), 0usize..30),
                1..150,
            ),
            query in prop::collection::vec(0usize..19, 1..6),
            searched in prop::option::of(prop::collection::vec(0u32..4, 1..3)),
            k in 0usize..8,
            share in prop::sample::select(vec![0.3f32, 0.7, 1.0]),
        ) {
            let mut idx = Bm25Index::new();
            // what each live doc was indexed from: (group, fields)
            let mut known: HashMap<u32, (u32, Vec<(String, f32)>)> = HashMap::new();
            let texts: Vec<(u32, u32, String)> = bulk.iter().map(|(d, g, w)| (*d, *g, text(w))).collect();
            let refs: Vec<(u32, u32, &str)> = texts.iter().map(|(d, g, t)| (*d, *g, t.as_str())).collect();
            idx.insert_many(&refs);
            for (d, g, t) in &texts { known.insert(*d, (*g, vec![(t.clone(), 1.0)])); }
            for (doc, group, action, words, weight, filler) in &edits {
                let mut fields = vec![(text(words), *weight)];
                if *filler > 0 { fields.push(("oak ".repeat(*filler), 1.0)); }
                let f: Vec<(&str, f32)> = fields.iter().map(|(t, w)| (t.as_str(), *w)).collect();
                match action {
                    0 => { idx.insert_fields(*doc, *group, &f); known.insert(*doc, (*group, fields)); }
                    1 | 2 => {
                        match known.get(doc).cloned() {
                            Some((g0, old)) => {
                                let o: Vec<(&str, f32)> = old.iter().map(|(t, w)| (t.as_str(), *w)).collect();
                                // action 2 moves it to `group`
                                let g = if *action == 1 { g0 } else { *group };
                                idx.replace_fields(*doc, g, &o, &f);
                                known.insert(*doc, (g, fields));
                            }
                            None => { idx.insert_fields(*doc, *group, &f); known.insert(*doc, (*group, fields)); }
                        }
                    }
                    3 => {
                        // wrong old
                        if let Some((g0, _)) = known.get(doc).cloned().filter(|_| f != [("mira gate", 1.0)]) {
                            idx.replace_fields(*doc, g0, &[("mira gate", 1.0)], &f);
                            known.insert(*doc, (g0, fields));
                        }
                    }
                    4 => {
                        if idx.add_fields_to_last(*doc, &f) {
                            known.get_mut(doc).unwrap().1.extend(fields);
                        }
                    }
                    _ => { idx.remove(*doc); known.remove(doc); }
                }
            }
            let q = query_tokens(&text(&query));
            let groups = searched.as_deref();
            let mut all = idx.score_unordered(&q, groups);
            let best = idx.best(&q, groups, k, share, None);
            prop_assert_eq!(best.matched, all.len());
            let scores: HashMap<u32, u32> = all.iter().map(|(d, s)| (*d, s.to_bits())).collect();
            for (doc, score) in &best.hits {
                prop_assert_eq!(scores.get(doc), Some(&score.to_bits()), "doc {}", doc);
            }
            all.sort_by(|a, b| b.1.total_cmp(&a.1));
            let floor = match all.get(k.wrapping_sub(1)) { Some((_, kth)) if k > 0 => kth * share, _ => 0.0 };
            let kept: HashMap<u32, f32> = best.hits.iter().copied().collect();
            for (doc, score) in all.iter().filter(|(_, s)| *s >= floor) {
                prop_assert_eq!(kept.get(doc), Some(score), "doc {} dropped", doc);
            }
            // And the index matches one built from the final versions alone (per group).
            let mut alone = Bm25Index::new();
            let mut docs: Vec<_> = known.iter().collect();
            docs.sort_by_key(|(d, _)| **d);
            for (d, (g, fields)) in docs {
                let f: Vec<(&str, f32)> = fields.iter().map(|(t, w)| (t.as_str(), *w)).collect();
                alone.insert_fields(*d, *g, &f);
            }
            for g in 0..3u32 {
                let a = idx.score_in(&q, Some(&[g]));
                let b = alone.score_in(&q, Some(&[g]));
                prop_assert_eq!(a.len(), b.len());
                for ((da, sa), (db, sb)) in a.iter().zip(&b) {
                    prop_assert_eq!(da, db);
                    prop_assert!((sa - sb).abs() <= 1e-4 * sa.abs().max(1e-6), "{} {} {}", da, sa, sb);
                }
            }
        }
    }
}

/// A term's lists by group cost 16 bytes when it has one (most terms of most indexes).
#[test]
fn a_terms_group_lists_take_sixteen_bytes() {
    assert_eq!(std::mem::size_of::<super::GroupLists>(), 16);
}

/// A group whose documents were all removed keeps empty lists after the compaction that
/// removal triggers: `top` still finds the other group's postings (it read a term's first list
/// alone, and that was the empty one).
#[test]
fn top_finds_matches_after_a_group_emptied_by_compaction() {
    let mut idx = Bm25Index::for_top();
    // The last removal is the one that compacts (more than 1,024 dead and more dead than
    // live), so nothing is stale after it.
    for d in 0..2201u32 {
        let group = u32::from(d >= 1101);
        idx.insert_fields(d, group, &[(&format!("lantern {}", d % 7), 1.0)]);
    }
    for d in 0..1101 {
        idx.remove(d);
    }
    let q = query_tokens("lantern");
    let mut all = idx.score(&q);
    assert_eq!(all.len(), 1100);
    let total = all.len();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
    all.truncate(5);
    assert_eq!(idx.top(&q, 5), (all, total));
}

/// An index read back from its image is the index: the same image again, the same scores,
/// matches and counts bit for bit, and it goes on alike under more edits of every kind.
mod an_index_read_from_its_image {
    use super::*;
    use crate::bytes::Take;
    use crate::region::Region;
    use proptest::prelude::*;

    const WORDS: &[&str] = &[
        "kai",
        "mira",
        "gate",
        "silver",
        "lantern",
        "river",
        "灯笼",
        "河灵",
        "waterfall",
    ];

    fn text(words: &[usize]) -> String {
        words
            .iter()
            .map(|w| WORDS[*w % WORDS.len()])
            .collect::<Vec<_>>()
            .join(" ")
    }

    type Edit = (u32, u32, u8, Vec<usize>);

    fn edit(idx: &mut Bm25Index, known: &mut std::collections::HashMap<u32, String>, e: &Edit) {
        let (doc, group, action, words) = e;
        let t = text(words);
        match action {
            0 | 1 => {
                // A weight that makes frequencies no whole halves (kept as raw floats).
                let weight = if *action == 1 { 0.3 } else { 1.0 };
                idx.insert_fields(*doc, *group, &[(&t, weight)]);
                known.insert(*doc, t);
            }
            2 => match known.get(doc).cloned() {
                Some(old) => {
                    idx.replace_fields(*doc, *group, &[(&old, 1.0)], &[(&t, 1.0)]);
                    known.insert(*doc, t);
                }
                None => {
                    idx.insert_fields(*doc, *group, &[(&t, 1.0)]);
                    known.insert(*doc, t);
                }
            },
            3 => {
                let _ = idx.add_fields_to_last(*doc, &[(&t, 0.5)]);
            }
            _ => {
                idx.remove(*doc);
                known.remove(doc);
            }
        }
    }

    /// The index's image and its postings.
    fn image(idx: &Bm25Index) -> (Vec<u8>, Vec<u8>) {
        let (mut out, mut postings) = (Vec::new(), Vec::new());
        assert!(idx.write_image(&mut out, &mut postings));
        (out, postings)
    }

    fn read(bytes: &[u8], postings: &[u8]) -> Result<Bm25Index, crate::ImageError> {
        let mut take = Take::new(bytes);
        let index = Bm25Index::read_image(&mut take, &Region::in_memory(postings.to_vec()))?;
        match take.left() {
            0 => Ok(index),
            n => Err(crate::ImageError::Invalid(format!("{n} bytes left"))),
        }
    }

    fn same_answers(a: &Bm25Index, b: &Bm25Index, query: &[usize]) -> Result<(), TestCaseError> {
        let q = query_tokens(&text(query));
        prop_assert_eq!(a.len(), b.len());
        prop_assert_eq!(a.has_stale_postings(), b.has_stale_postings());
        for groups in [None, Some(&[0u32][..]), Some(&[1, 2][..])] {
            let bits = |v: Vec<(u32, f32)>| {
                v.into_iter()
                    .map(|(d, s)| (d, s.to_bits()))
                    .collect::<Vec<_>>()
            };
            prop_assert_eq!(bits(a.score_in(&q, groups)), bits(b.score_in(&q, groups)));
            let (x, y) = (
                a.best(&q, groups, 3, 0.7, None),
                b.best(&q, groups, 3, 0.7, None),
            );
            prop_assert_eq!(x.matched, y.matched);
            let mut x = bits(x.hits);
            let mut y = bits(y.hits);
            x.sort_unstable();
            y.sort_unstable();
            prop_assert_eq!(x, y);
        }
        let (x, nx) = a.top(&q, 5);
        let (y, ny) = b.top(&q, 5);
        prop_assert_eq!(nx, ny);
        prop_assert_eq!(
            x.iter().map(|(d, s)| (*d, s.to_bits())).collect::<Vec<_>>(),
            y.iter().map(|(d, s)| (*d, s.to_bits())).collect::<Vec<_>>()
        );
        Ok(())
    }

    proptest! {
        #[test]
        fn same_index(
            for_top in any::<bool>(),
            bulk in prop::collection::vec((0u32..300, 0u32..3, prop::collection::vec(0usize..9, 1..6)), 0..400),
            before in prop::collection::vec((0u32..320, 0u32..3, 0u8..5, prop::collection::vec(0usize..9, 1..6)), 0..80),
            after in prop::collection::vec((0u32..320, 0u32..3, 0u8..5, prop::collection::vec(0usize..9, 1..6)), 0..80),
            query in prop::collection::vec(0usize..9, 1..4),
            keep in prop::option::of(0usize..60),
        ) {
            let mut idx = if for_top { Bm25Index::for_top() } else { Bm25Index::new() };
            let mut known = std::collections::HashMap::new();
            let texts: Vec<(u32, u32, String)> = bulk.iter().map(|(d, g, w)| (*d, *g, text(w))).collect();
            let refs: Vec<(u32, u32, &str)> = texts.iter().map(|(d, g, t)| (*d, *g, t.as_str())).collect();
            idx.insert_many(&refs);
            for (d, _, t) in &texts { known.insert(*d, t.clone()); }
            for e in &before { edit(&mut idx, &mut known, e); }
            let (bytes, postings) = image(&idx);
            let mut read = read(&bytes, &postings).unwrap();
            // Lists past a few postings decoded for each search, not kept: the same answers.
            if let Some(keep) = keep {
                for shard in &mut read.shards {
                    shard.postings.keep_at_most(keep);
                }
            }
            prop_assert_eq!(image(&read), (bytes, postings));
            same_answers(&idx, &read, &query)?;
            let mut known_read = known.clone();
            for e in &after {
                edit(&mut idx, &mut known, e);
                edit(&mut read, &mut known_read, e);
            }
            prop_assert_eq!(image(&read), image(&idx));
            same_answers(&idx, &read, &query)?;
        }

        /// A cut or damaged image is refused or read, never a panic; a cut one is always
        /// refused.
        #[test]
        fn a_damaged_image_is_an_error_not_a_panic(
            bulk in prop::collection::vec((0u32..50, 0u32..3, prop::collection::vec(0usize..9, 1..6)), 1..40),
            cut in any::<prop::sample::Index>(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut idx = Bm25Index::new();
            for (d, g, w) in &bulk { idx.insert_fields(*d, *g, &[(&text(w), 1.0)]); }
            let (bytes, postings) = image(&idx);
            let short = &bytes[..cut.index(bytes.len())];
            prop_assert!(read(short, &postings).is_err());
            // Postings cut short: the lists run past their region.
            prop_assert!(read(&bytes, &postings[..cut.index(postings.len())]).is_err());
            // Damaged postings: read, and marked damaged once a search reads the list.
            let mut bad = postings.clone();
            let (at, x) = flips[0];
            let i = at.index(bad.len());
            bad[i] ^= x | 1;
            let taken = read(&bytes, &bad).unwrap();
            prop_assert!(!taken.damaged(), "nothing read yet");
            for shard in &taken.shards {
                for l in 0..shard.postings.len() {
                    let _ = shard.postings.get(l);
                }
            }
            prop_assert!(taken.damaged());
            let mut damaged = bytes.clone();
            for (at, x) in &flips { let i = at.index(damaged.len()); damaged[i] ^= x | 1; }
            if let Ok(read) = read(&damaged, &postings) {
                // Whatever it holds, searching and editing it stay within bounds.
                let q = query_tokens("kai gate 灯笼");
                let _ = read.score_in(&q, None);
                let _ = read.best(&q, Some(&[0, 1]), 3, 0.7, None);
                let mut read = read;
                read.insert_fields(7, 1, &[("mira river", 1.0)]);
                read.remove(3);
            }
        }
    }
}

proptest::proptest! {
    /// Hits are grouped by list alike counted into place over every list (many hits) and
    /// sorted (few): lists ascending, each list's hits in the order they came, none lost.
    #[test]
    fn hits_are_grouped_alike_either_way(lists in proptest::collection::vec(0u32..50, 13..200)) {
        // Several hits a document, documents ascending, as index_streams makes them.
        let hits: Vec<(u32, u32)> = lists.iter().zip(0u32..).map(|(l, i)| (*l, i / 3)).collect();
        // 13 hits or more, 4 × 13 ≥ 50 lists: counted over every list.
        let dense = super::by_list(hits.clone(), 50);
        let sorted = super::by_list(hits.clone(), hits.len() * 4 + 1);
        proptest::prop_assert_eq!(&dense, &sorted);
        let mut expected = hits;
        expected.sort_by_key(|(list, _)| *list);
        proptest::prop_assert_eq!(dense, expected);
    }
}

proptest::proptest! {
    /// Tokenizing with lent stems gives the tokens this thread's stems give, and the length it
    /// counts on the way is [`word_len`]'s (bulk indexing takes both from it).
    #[test]
    fn lent_stems_tokenize_alike_and_count_the_word_len(
        text in "[a-zA-Z0-9 ,.'éÄ银色大门河灵的了\\-]{0,60}",
    ) {
        let mut here = Vec::new();
        for_each_index_token(&text, |t| here.push(t.to_owned()));
        let mut lent = Vec::new();
        let len = with_lent_stems(|stems| {
            for_each_index_token_with(stems, &text, |t| lent.push(t.to_owned()))
        });
        proptest::prop_assert_eq!(here, lent);
        proptest::prop_assert_eq!(len, word_len(&text));
    }
}
