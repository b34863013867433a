//! Lore activation: SillyTavern semantics as data-driven cases, and Chinese keys against
//! Chinese text on a real world book.

use std::path::Path;
use tavern_store::Truncation;

use serde_json::{json, Value};
use tavern_tools::assets::world::WorldBook;
use tavern_tools::lore::{search, search_with, LoreContext, LoreOptions, LoreSource};

/// Runs one file of cases: each has `entries` (world-file shape), `query`, optional `options`
/// (`includeConstant`, `lexical`, `limit`, `maxTokens`, `recursionDepth`, `useGroupScoring`),
/// optional `context` (`character`, `user`, `characterIds`, `tags`), and the expected
/// `[uid, reason]` list, warning count, `truncatedBy` and returned `contents` by uid.
fn run_cases(cases: &str, min: usize) {
    let cases: Vec<Value> = serde_json::from_str(cases).unwrap();
    assert!(cases.len() >= min);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let book =
            WorldBook::from_world_value("Book", &json!({"entries": case["entries"]})).unwrap();
        let o = &case["options"];
        let defaults = LoreOptions::default();
        let opts = LoreOptions {
            include_constant: o["includeConstant"].as_bool().unwrap_or(false),
            lexical: o["lexical"].as_bool().unwrap_or(true),
            limit: o["limit"].as_u64().map_or(10, |v| v as usize),
            max_tokens: o["maxTokens"].as_u64().map_or(10_000, |v| v as usize),
            recursion_depth: o["recursionDepth"]
                .as_u64()
                .map_or(defaults.recursion_depth, |v| v as usize),
            use_group_scoring: o["useGroupScoring"].as_bool().unwrap_or(false),
            ..defaults
        };
        let c = &case["context"];
        let strs = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let ctx = LoreContext {
            character: c["character"].as_str().unwrap_or("").to_owned(),
            user: c["user"].as_str().unwrap_or("").to_owned(),
            character_ids: strs(&c["characterIds"]),
            tags: strs(&c["tags"]),
            ..LoreContext::default()
        };
        let books = vec![(LoreSource::Global, book)];
        let res = search_with(&books, case["query"].as_str().unwrap(), &opts, &ctx);
        let got: Vec<Value> = res
            .hits
            .iter()
            .map(|h| json!([h.entry.uid, h.reason.label()]))
            .collect();
        assert_eq!(Value::Array(got), case["expect"], "case: {name}");
        assert_eq!(
            res.warnings.len() as u64,
            case["warnings"].as_u64().unwrap_or(0),
            "case: {name}: {:?}",
            res.warnings
        );
        assert_eq!(
            res.truncated_by.map(Truncation::label),
            case["truncatedBy"].as_str(),
            "case: {name}"
        );
        if let Some(contents) = case["contents"].as_object() {
            for (uid, want) in contents {
                let hit = res
                    .hits
                    .iter()
                    .find(|h| h.entry.uid.to_string() == *uid)
                    .unwrap_or_else(|| panic!("case: {name}: uid {uid} not returned"));
                assert_eq!(
                    hit.content,
                    want.as_str().unwrap(),
                    "case: {name}: uid {uid}"
                );
            }
        }
    }
}

#[test]
fn sillytavern_activation_semantics() {
    run_cases(include_str!("data/lore_cases.json"), 20);
}

/// Regex keys with JavaScript semantics, macros in keys, character filters, inclusion groups,
/// decorators, recursion and stop words: cases derived from SillyTavern's `world-info.js`
/// (`parseRegexFromString`, `WorldInfoBuffer.matchKeys`/`getScore`, `checkWorldInfo`,
/// `filterByInclusionGroups`, `parseDecorators`).
#[test]
fn sillytavern_fidelity_cases() {
    run_cases(include_str!("data/lore_fidelity_cases.json"), 40);
}

#[test]
fn chinese_keys_activate_on_chinese_text_in_a_real_world_book() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/worlds");
    assert!(
        dir.is_dir(),
        "../shared/fixtures is missing beside the checkout"
    );
    let book =
        WorldBook::from_json("tarot", &std::fs::read(dir.join("tarot.zh.json")).unwrap()).unwrap();
    let books = vec![(LoreSource::Global, book)];
    let opts = LoreOptions {
        limit: 20,
        max_tokens: 100_000,
        lexical: false,
        recursion_depth: 0,
        ..LoreOptions::default()
    };
    let uids = |q: &str| -> Vec<i64> {
        search(&books, q, &opts)
            .hits
            .iter()
            .map(|h| h.entry.uid)
            .collect()
    };
    assert_eq!(uids("帮我洗牌，然后抽牌"), [2, 3]);
    assert_eq!(uids("今天的圣杯和宝剑"), [6, 7]);
    assert_eq!(uids("draw from the Pentacles suit"), [8]);
    assert_eq!(uids("用塔罗牌占卜一下"), [0]);
    assert!(uids("天气很好").is_empty());
    // The constant status-bar entry (no keys) comes only on request.
    let with_constants = LoreOptions {
        include_constant: true,
        ..opts
    };
    let all: Vec<i64> = search(&books, "天气很好", &with_constants)
        .hits
        .iter()
        .map(|h| h.entry.uid)
        .collect();
    assert_eq!(all, [0, 1, 2, 3, 4]);
    // With recursion (the default), the shuffling and drawing entries mention 塔罗牌 and
    // 大阿卡纳, which activate the divination and card-meaning entries in turn.
    let recursive = LoreOptions {
        recursion_depth: 3,
        ..opts
    };
    let got: Vec<(i64, &str)> = search(&books, "帮我洗牌，然后抽牌", &recursive)
        .hits
        .iter()
        .map(|h| (h.entry.uid, h.reason.label()))
        .collect();
    assert_eq!(
        got,
        [
            (2, "keyword"),
            (3, "keyword"),
            (0, "recursion"),
            (1, "recursion")
        ]
    );
}

/// A card cannot make lore search cost what it likes: key matching has a per-search budget
/// (deterministic: bytes scanned, not time); past it the result says `truncated` by
/// `work-budget` with a warning, and what was matched before still comes back.
#[test]
fn key_matching_stops_at_the_work_budget_and_says_so() {
    let entries: serde_json::Map<String, Value> = (0..2000)
        .map(|i| {
            (
                i.to_string(),
                json!({"uid": i, "key": [format!("/lantern{i}\\b/i"), format!("gate{i}")], "content": format!("entry {i}"), "order": 100}),
            )
        })
        .collect();
    let book = WorldBook::from_world_value("Big", &json!({"entries": entries})).unwrap();
    let books = vec![(LoreSource::Global, book)];
    let query = "the LANTERN0 glows by gate1";
    // Within the default budget every key is checked.
    let full = search(&books, query, &LoreOptions::default());
    assert!(!full.truncated, "{:?}", full.truncated_by);
    let uids: Vec<i64> = full.hits.iter().map(|h| h.entry.uid).collect();
    assert_eq!(&uids[..2], &[0, 1]);
    // A small budget: matching stops early, honestly.
    let opts = LoreOptions {
        max_scan_bytes: 100 * query.len(),
        ..LoreOptions::default()
    };
    let cut = search(&books, query, &opts);
    assert!(cut.truncated);
    assert_eq!(cut.truncated_by, Some(Truncation::WorkBudget));
    assert!(
        cut.warnings.iter().any(|w| w.contains("budget")),
        "{:?}",
        cut.warnings
    );
    assert_eq!(
        cut.hits.first().map(|h| h.entry.uid),
        Some(0),
        "matched before the cut"
    );
}

fn regex_book(keys: &[(i64, &str, &str)]) -> Vec<(LoreSource, WorldBook)> {
    let entries: serde_json::Map<String, Value> = keys
        .iter()
        .map(|(uid, key, content)| {
            (
                uid.to_string(),
                json!({"uid": uid, "key": [key], "content": content, "order": 100 - uid}),
            )
        })
        .collect();
    let book = WorldBook::from_world_value("Hostile", &json!({ "entries": entries })).unwrap();
    vec![(LoreSource::Global, book)]
}

/// #30 F4: the keys that froze a bridge — exponential on a backtracking engine — answer, also
/// when recursion feeds them the text they are slowest on, and activate what they should.
#[test]
fn exponential_regex_keys_answer_with_the_right_activations() {
    let a60 = "a".repeat(60);
    let books = regex_book(&[
        (1, "/(a|a)*c/", "one"),
        (2, r"/(\w|\d)+!/", "two"),
        (3, "/(?:a|aa)+z/", "three"),
        (4, "/a*a*a*a*a*a*a*a*a*a*b/", "four"),
        (5, "/(a?){28}a{28}/", "five"),
        (6, "spark", &a60),
        (7, r"/(a1)+\d+!$/", "seven"),
    ]);
    let opts = LoreOptions {
        limit: 10,
        lexical: false,
        ..LoreOptions::default()
    };
    // The query names only the spark; recursion scans its 60 a's with every key.
    let found = search(&books, "a spark", &opts);
    let mut uids: Vec<i64> = found.hits.iter().map(|h| h.entry.uid).collect();
    uids.sort_unstable();
    assert_eq!(uids, vec![5, 6], "{:?}", found.warnings);
    assert!(!found.truncated, "{:?}", found.warnings);
    assert!(found.warnings.is_empty(), "{:?}", found.warnings);
    // A query that ends the way the keys want activates them.
    let found = search(&books, &format!("{a60}c {a60}z a1a1a19!"), &opts);
    let mut uids: Vec<i64> = found.hits.iter().map(|h| h.entry.uid).collect();
    uids.sort_unstable();
    assert_eq!(uids, vec![1, 2, 3, 5, 7]);
}

/// A key only a backtracking machine runs (a back-reference) gives up at its step limit: it
/// does not match, the search answers, and the warning names the key.
#[test]
fn a_key_past_its_step_limit_is_named_and_does_not_match() {
    let books = regex_book(&[(1, r"/(a|a)*\1c/", "never"), (2, "/aaa/", "plain")]);
    let opts = LoreOptions {
        lexical: false,
        ..LoreOptions::default()
    };
    let found = search(&books, &"a".repeat(40), &opts);
    let uids: Vec<i64> = found.hits.iter().map(|h| h.entry.uid).collect();
    assert_eq!(uids, vec![2]);
    assert!(
        found
            .warnings
            .iter()
            .any(|w| w.contains("(a|a)*") && w.contains("backtracking steps")),
        "{:?}",
        found.warnings
    );
    // `tavern card validate` reads the same warnings before any search.
    let warnings = tavern_tools::lore::key_warnings(&books[0].1, &LoreContext::default());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].starts_with("entry 1:"), "{warnings:?}");
}

/// The time budget cuts key matching as the byte budget does: honestly, with a warning.
#[test]
fn the_time_budget_stops_matching_honestly() {
    let books = regex_book(&[(1, "lantern", "light")]);
    let opts = LoreOptions {
        lexical: false,
        max_match_time: Some(std::time::Duration::ZERO),
        ..LoreOptions::default()
    };
    let found = search(&books, "a lantern", &opts);
    assert!(found.hits.is_empty());
    assert_eq!(found.truncated_by, Some(Truncation::WorkBudget));
    assert!(
        found.warnings.iter().any(|w| w.contains("time budget")),
        "{:?}",
        found.warnings
    );
    let unlimited = LoreOptions {
        lexical: false,
        max_match_time: None,
        ..LoreOptions::default()
    };
    assert_eq!(search(&books, "a lantern", &unlimited).hits.len(), 1);
}

/// #29 item 4: returned content has SillyTavern's macros substituted as everywhere else —
/// the names, the persona, the card's text, comments removed — while keys use the names only.
#[test]
fn returned_content_has_sillytavern_macros_substituted() {
    let books = regex_book(&[(
        1,
        "lantern",
        "{{char}} lends {{user}} a lantern.{{// for the author}} {{scenario}} ({{persona}}) {{unknown}}",
    )]);
    let ctx = LoreContext {
        character: "Seraphina".into(),
        user: "白羽".into(),
        macros: tavern_tools::lore::MacroValues {
            persona: "a traveler".into(),
            scenario: "{{user}} is lost in the glade.".into(),
            ..Default::default()
        },
        ..LoreContext::default()
    };
    let found = search_with(&books, "a lantern", &LoreOptions::default(), &ctx);
    assert_eq!(
        found.hits[0].content,
        "Seraphina lends 白羽 a lantern. 白羽 is lost in the glade. (a traveler) {{unknown}}"
    );
}
