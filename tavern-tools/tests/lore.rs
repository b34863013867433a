//! Lore activation: SillyTavern semantics as data-driven cases, and Chinese keys against
//! Chinese text on a real world book.

use std::path::Path;

use serde_json::{json, Value};
use tavern_tools::assets::world::WorldBook;
use tavern_tools::lore::{search, LoreOptions, LoreSource};

#[test]
fn sillytavern_activation_semantics() {
    let cases: Vec<Value> = serde_json::from_str(include_str!("data/lore_cases.json")).unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let book =
            WorldBook::from_world_value("Book", &json!({"entries": case["entries"]})).unwrap();
        let o = &case["options"];
        let opts = LoreOptions {
            include_constant: o["includeConstant"].as_bool().unwrap_or(false),
            lexical: o["lexical"].as_bool().unwrap_or(true),
            limit: o["limit"].as_u64().map_or(10, |v| v as usize),
            max_tokens: o["maxTokens"].as_u64().map_or(10_000, |v| v as usize),
            ..LoreOptions::default()
        };
        let books = vec![(LoreSource::Global, book)];
        let res = search(&books, case["query"].as_str().unwrap(), &opts);
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
            res.truncated_by,
            case["truncatedBy"].as_str(),
            "case: {name}"
        );
    }
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
}
