//! `store-bench --json` on a small corpus: the document carries every measurement the issue
//! names (records, the search ratios against tantivy and FTS5, recall, cold open, resident
//! set), each engine's recall is that of a working index, and nothing written was lost.
#![cfg(feature = "bench")]

use std::process::Command;

use serde_json::Value;

#[test]
fn store_bench_json_names_every_measurement_of_all_three_engines() {
    let work = tempfile::tempdir().expect("a temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_store-bench"))
        .args([
            "--records",
            "3000",
            "--queries",
            "40",
            "--puts",
            "10",
            "--json",
            "--work",
        ])
        .arg(work.path())
        .output()
        .expect("store-bench runs");
    assert!(
        out.status.success(),
        "store-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document on stdout");
    assert_eq!(doc["records"], 3000);
    assert_eq!(doc["queries"], 40);
    let number = |key: &str| {
        doc[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a number in {doc}"))
    };
    for key in [
        "searchP50RatioTantivy",
        "searchP50RatioFts5",
        "coldOpenMs",
        "coldOpenMsTantivy",
        "coldOpenMsFromLog",
        "imageSaveMs",
        "imageMiB",
        "rssMiB",
        "rssMiBTantivy",
        "buildRatioTantivy",
    ] {
        let v = number(key);
        assert!(v.is_finite() && v > 0.0, "{key} = {v}");
    }
    // The planted records are found: every engine really indexed and searched the corpus.
    assert!(number("recallAt10") >= 0.95, "{doc}");
    assert!(number("recallAt10Tantivy") >= 0.5, "{doc}");
    assert!(number("recallAt10Fts5") >= 0.5, "{doc}");
    for engine in ["ours", "tantivy", "fts5"] {
        let p50 = doc["searchP50Ms"][engine]
            .as_f64()
            .expect("a p50 per engine");
        let p99 = doc["searchP99Ms"][engine]
            .as_f64()
            .expect("a p99 per engine");
        assert!(p50 > 0.0 && p50 <= p99, "{engine}: {p50} / {p99}");
    }
    assert_eq!(doc["casLost"], 0);
    // The resident set is that of a process holding the store, not of an empty one.
    assert!(number("rssMiB") >= 2.0, "{doc}");
    // The work went where it was told to, and was cleaned up.
    assert_eq!(
        std::fs::read_dir(work.path()).expect("readable").count(),
        0,
        "store-bench leaves nothing behind without --keep"
    );
}

#[test]
fn a_child_with_an_unknown_engine_fails_with_its_name() {
    let work = tempfile::tempdir().expect("a temp dir");
    let queries = work.path().join("q.txt");
    std::fs::write(&queries, "one\n").expect("writes");
    let out = Command::new(env!("CARGO_BIN_EXE_store-bench"))
        .arg("--child")
        .arg("lucene")
        .arg(work.path())
        .arg(&queries)
        .output()
        .expect("store-bench runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown engine lucene"), "{err}");
}
