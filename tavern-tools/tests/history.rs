//! The incremental history index: appends (by us or another process) extend it, rewrites
//! rebuild it, and every query answers exactly as an index built from scratch would, on the
//! in-memory store (whole reads) and on the file store (tail reads).

use std::sync::Arc;

use proptest::prelude::*;
use tavern_core::chat::ChatLine;
use tavern_core::{CharacterName, ChatId, FixedOffset, Timestamp};
use tavern_search::RankerRef;
use tavern_store::clock::ManualClock;
use tavern_store::fs::FsStore;
use tavern_store::mem::MemStore;
use tavern_store::ChatStore;
use tavern_tools::history::{HistoryCache, HistoryHit, HistoryIndex, SearchTime};

const WORDS: [&str; 8] = [
    "lantern",
    "river",
    "fears",
    "feared",
    "water",
    "gate",
    "银色大门",
    "the",
];
const QUERIES: [&str; 5] = ["lantern", "fear water", "Kai", "银色", ""];

#[derive(Debug, Clone)]
enum Op {
    /// Append messages (word indexes per message).
    Append(Vec<Vec<usize>>),
    /// Rewrite the chat keeping the first `keep` lines, changing one, adding messages.
    Rewrite(usize, Vec<Vec<usize>>),
}

fn message(i: usize, words: &[usize]) -> ChatLine {
    let text: Vec<&str> = words.iter().map(|w| WORDS[*w % WORDS.len()]).collect();
    let user = i.is_multiple_of(2);
    let name = if user { "Kai" } else { "Mira" };
    ChatLine::parse(
        &serde_json::json!({"name": name, "is_user": user, "send_date": "May 8, 2023 1:56pm", "mes": text.join(" ")})
            .to_string(),
    )
    .unwrap()
}

fn header() -> ChatLine {
    ChatLine::parse(r#"{"user_name":"Kai","character_name":"Mira","chat_metadata":{}}"#).unwrap()
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let msgs = prop::collection::vec(prop::collection::vec(0usize..8, 1..5), 0..4);
    let op = prop_oneof![
        3 => msgs.clone().prop_map(Op::Append),
        1 => (0usize..6, msgs).prop_map(|(k, m)| Op::Rewrite(k, m)),
    ];
    prop::collection::vec(op, 1..8)
}

fn scratch(lines: &[ChatLine]) -> HistoryIndex {
    let mut idx = HistoryIndex::new();
    idx.extend(lines.iter().skip(1));
    idx
}

async fn check(store: Arc<dyn ChatStore>, ops: Vec<Op>) {
    let (who, chat) = (
        CharacterName::parse("Mira").unwrap(),
        ChatId::parse("c").unwrap(),
    );
    let cache = HistoryCache::new(2);
    let mut lines = vec![header(), message(0, &[0, 1])];
    let mut rev = store.rewrite_chat(&who, &chat, &lines, None).await.unwrap();
    for op in ops {
        match op {
            Op::Append(ms) => {
                let new: Vec<ChatLine> = ms
                    .iter()
                    .enumerate()
                    .map(|(i, w)| message(lines.len() + i, w))
                    .collect();
                rev = store.append_lines(&who, &chat, &new, &rev).await.unwrap();
                lines.extend(new);
            }
            Op::Rewrite(keep, ms) => {
                lines.truncate(keep.max(1).min(lines.len()));
                let n = lines.len();
                lines.push(message(n, &[7, 6, 5]));
                lines.extend(ms.iter().enumerate().map(|(i, w)| message(n + 1 + i, w)));
                rev = store
                    .rewrite_chat(&who, &chat, &lines, Some(&rev))
                    .await
                    .unwrap();
            }
        }
        let want = scratch(&lines);
        for q in QUERIES {
            let got: (Vec<HistoryHit>, usize) = cache
                .with_index(store.as_ref(), &who, &chat, |idx, _| idx.search(q, 50))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got, want.search(q, 50), "query {q:?}");
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn incremental_index_equals_a_fresh_one_in_memory(ops in ops()) {
        let store = Arc::new(MemStore::new(Arc::new(ManualClock::new(Timestamp(0)))));
        runtime().block_on(check(store, ops));
    }

    #[test]
    fn incremental_index_equals_a_fresh_one_on_files(ops in ops()) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::open(dir.path(), Arc::new(ManualClock::new(Timestamp(0)))).unwrap());
        runtime().block_on(check(store, ops));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_by_another_writer_are_read_as_a_tail_and_the_cache_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp(0)));
    let ours = Arc::new(FsStore::open(dir.path(), clock.clone()).unwrap());
    // Another process: a second store over the same directory.
    let other = FsStore::open(dir.path(), clock).unwrap();
    let who = CharacterName::parse("Mira").unwrap();
    let cache = HistoryCache::new(2);
    for c in ["a", "b", "c"] {
        let chat = ChatId::parse(c).unwrap();
        let rev = ours
            .rewrite_chat(&who, &chat, &[header(), message(0, &[0])], None)
            .await
            .unwrap();
        let n = cache
            .with_index(ours.as_ref(), &who, &chat, |idx, _| idx.len())
            .await
            .unwrap();
        assert_eq!(n, Some(1));
        other
            .append_lines(&who, &chat, &[message(1, &[2, 4])], &rev)
            .await
            .unwrap();
        let hits = cache
            .with_index(ours.as_ref(), &who, &chat, |idx, _| idx.search("fear", 5))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(hits.0[0].index, 1, "the appended message is found");
    }
    assert_eq!(cache.cached_chats(), 2, "least recently used chat dropped");
    let missing = ChatId::parse("none").unwrap();
    assert_eq!(
        cache
            .with_index(ours.as_ref(), &who, &missing, |idx, _| idx.len())
            .await
            .unwrap(),
        None
    );
}

/// #30 F7: a chat larger than history searches take is refused with the limit named — known
/// from its revision, before anything is read or indexed — and one within it is searched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_over_the_history_limit_is_refused_before_it_is_read() {
    use tavern_store::StoreError;
    use tavern_tools::history::MAX_CHAT_BYTES;
    let store = MemStore::new(Arc::new(ManualClock::new(Timestamp(0))));
    let who = CharacterName::parse("Mira").unwrap();
    let chat = ChatId::parse("long").unwrap();
    let big = "fear ".repeat(usize::try_from(MAX_CHAT_BYTES).unwrap() / 5 + 1);
    let line = ChatLine::parse(
        &serde_json::json!({"name": "Mira", "is_user": false, "send_date": "May 8, 2023 1:56pm", "mes": big})
            .to_string(),
    )
    .unwrap();
    let rev = store
        .rewrite_chat(&who, &chat, &[header(), line], None)
        .await
        .unwrap();
    let cache = HistoryCache::new(2);
    let err = cache
        .with_index(&store, &who, &chat, |idx, _| idx.len())
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::LimitExceeded { limit, .. } if limit.contains("history")),
        "{err}"
    );
    // A chat within the limit is searched as always.
    store
        .rewrite_chat(&who, &chat, &[header(), message(1, &[2])], Some(&rev))
        .await
        .unwrap();
    let n = cache
        .with_index(&store, &who, &chat, |idx, _| idx.len())
        .await
        .unwrap();
    assert_eq!(n, Some(1));
}

/// A question that names a time ("five days ago", "上个月") lifts the messages sent then —
/// dated in epoch milliseconds or in SillyTavern's text — above a better word match from
/// another day; the same question asked without a time, or with no clock, ranks by words.
#[test]
fn a_question_that_names_a_time_prefers_messages_sent_then() {
    const DAY: i64 = 86_400_000;
    // 2023-05-08 13:56 UTC, the date `message` writes as text.
    let may8 = (tavern_core::calendar::days_from_civil(2023, 5, 8) * 1440 + 13 * 60 + 56) * 60_000;
    let at = |date: serde_json::Value, text: &str| {
        ChatLine::parse(
            &serde_json::json!({"name": "Kai", "is_user": true, "send_date": date, "mes": text})
                .to_string(),
        )
        .unwrap()
    };
    let mut idx = HistoryIndex::new();
    idx.extend(&[
        at(
            serde_json::json!(may8 - 30 * DAY),
            "Tea at the harbour: green tea, jasmine tea.",
        ),
        at(
            serde_json::json!("May 8, 2023 1:56pm"),
            "Tea at the harbour.",
        ),
        at(serde_json::json!(may8 + 25 * DAY), "A walk by the river."),
    ]);
    let now = SearchTime {
        now: Timestamp(may8 + 5 * DAY),
        zone: &FixedOffset(0),
    };
    let top = |q: &str, at: Option<SearchTime<'_>>| -> Vec<usize> {
        let (hits, _) = idx.search_from(q, 10, 0, &RankerRef::default(), at);
        // The walk matches through its neighbour's words only, last.
        hits.iter().map(|h| h.index).take(2).collect()
    };
    assert_eq!(top("what tea at the harbour", Some(now)), [0, 1]);
    assert_eq!(
        top("what tea at the harbour five days ago", Some(now)),
        [1, 0]
    );
    assert_eq!(top("what tea at the harbour five days ago", None), [0, 1]);
    let month_later = SearchTime {
        now: Timestamp(may8 + 30 * DAY),
        zone: &FixedOffset(0),
    };
    assert_eq!(top("上个月 harbour tea", Some(month_later)), [1, 0]);
    // With one result asked, the message sent then is still found among the best matches.
    let (hits, _) = idx.search_from(
        "what tea at the harbour five days ago",
        1,
        0,
        &RankerRef::default(),
        Some(now),
    );
    assert_eq!(hits.iter().map(|h| h.index).collect::<Vec<_>>(), [1]);
}

/// A ranker that gives every candidate the same score keeps the lexical order at the cut: the
/// best match by words, not the newest message, when one result is asked.
#[test]
fn ties_a_ranker_leaves_are_cut_in_lexical_order() {
    #[derive(Debug)]
    struct Flat;
    impl tavern_search::Ranker for Flat {
        fn name(&self) -> &str {
            "flat"
        }
        fn pool(&self, wanted: usize) -> usize {
            wanted * 4
        }
        fn rescore(&self, _query: &str, candidates: &mut [tavern_search::Candidate<'_>]) {
            for c in candidates {
                c.score = 1.0;
            }
        }
    }
    let mut idx = HistoryIndex::new();
    idx.extend(&[
        message(0, &[0, 0, 0]),
        message(1, &[1]),
        message(2, &[0, 1, 2]),
        message(3, &[5]),
        message(4, &[0, 3]),
    ]);
    let (plain, _) = idx.search("lantern", 1);
    let (flat, _) = idx.search_from("lantern", 1, 0, &RankerRef::new(Flat), None);
    assert_eq!(plain.len(), 1);
    assert_eq!(flat[0].index, plain[0].index);
    assert_ne!(flat[0].index, 4, "not the newest match");
}

/// A search runs on the chat's shared index after the cache's lock is let go: while one
/// search is still running (here: held inside its closure until the others are done), the same
/// chat, another chat and a chat that changed meanwhile are all searched. Before, the cache's
/// lock was held through the search, so every other history search waited for the slowest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_search_holds_up_no_other() {
    let store = Arc::new(MemStore::new(Arc::new(ManualClock::new(Timestamp(0)))));
    let who = CharacterName::parse("Mira").unwrap();
    let (a, b) = (ChatId::parse("a").unwrap(), ChatId::parse("b").unwrap());
    let mut revs = Vec::new();
    let mut lines = vec![header(), message(0, &[0]), message(1, &[1])];
    for chat in [&a, &b] {
        revs.push(store.rewrite_chat(&who, chat, &lines, None).await.unwrap());
    }
    let count = |lines: &[ChatLine], q: &str| Some(scratch(lines).search(q, 5).1);
    let before = (count(&lines, "lantern"), count(&lines, "river"));
    lines.push(message(2, &[0, 5]));
    let after = count(&lines, "lantern");
    assert!(after > before.0, "the appended message matches");
    let cache = HistoryCache::new(4);
    for chat in [&a, &b] {
        cache
            .with_index(store.as_ref(), &who, chat, |idx, _| idx.len())
            .await
            .unwrap();
    }
    let (entered, inside) = std::sync::mpsc::channel::<()>();
    let (finished, others_done) = std::sync::mpsc::channel::<()>();
    let others_done = std::sync::Mutex::new(others_done);
    let slow = {
        let (cache, store, who, a) = (cache.clone(), store.clone(), who.clone(), a.clone());
        tokio::spawn(async move {
            cache
                .with_index(store.as_ref(), &who, &a, |idx, _| {
                    entered.send(()).unwrap();
                    // Fails the test instead of hanging if the others cannot run meanwhile.
                    let waited = others_done
                        .lock()
                        .unwrap()
                        .recv_timeout(std::time::Duration::from_secs(60));
                    (idx.search("lantern", 5).1, waited.is_ok())
                })
                .await
        })
    };
    tokio::task::spawn_blocking(move || inside.recv().unwrap())
        .await
        .unwrap();
    let same = cache
        .with_index(store.as_ref(), &who, &a, |idx, _| {
            idx.search("lantern", 5).1
        })
        .await
        .unwrap();
    let other = cache
        .with_index(store.as_ref(), &who, &b, |idx, _| idx.search("river", 5).1)
        .await
        .unwrap();
    // Chat `a` grows while the slow search still holds its index: brought up to date on a
    // copy, the slow search's index untouched.
    store
        .append_lines(&who, &a, &[message(2, &[0, 5])], &revs[0])
        .await
        .unwrap();
    let grown = cache
        .with_index(store.as_ref(), &who, &a, |idx, _| {
            idx.search("lantern", 5).1
        })
        .await
        .unwrap();
    finished.send(()).unwrap();
    drop(finished);
    let (slow_total, waited) = slow.await.unwrap().unwrap().unwrap();
    assert!(waited, "the slow search was never let go of");
    assert_eq!((same, other, grown), (before.0, before.1, after));
    assert_eq!(
        Some(slow_total),
        before.0,
        "the index a running search reads never changes under it"
    );
}
