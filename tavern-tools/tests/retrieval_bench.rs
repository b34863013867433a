//! `retrieval-bench` on small LongMemEval files written here: the official protocol's skips,
//! its metrics on a ranking known in advance, gzip'd and plain files alike, the `--json`
//! document's shape, and a clear error for a malformed file.
#![cfg(feature = "bench")]

use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

fn turn(role: &str, content: &str, has_answer: bool) -> Value {
    json!({"role": role, "content": content, "has_answer": has_answer})
}

/// A question whose haystack is `sessions` of `(id, user turns)`, one assistant reply each.
fn question(id: &str, kind: &str, text: &str, sessions: &[(&str, Vec<(&str, bool)>)]) -> Value {
    let haystack: Vec<Value> = sessions
        .iter()
        .map(|(_, turns)| {
            let mut out = Vec::new();
            for (content, evidence) in turns {
                out.push(turn("user", content, *evidence));
                out.push(turn("assistant", "Noted.", false));
            }
            Value::Array(out)
        })
        .collect();
    json!({
        "question_id": id, "question_type": kind, "question": text,
        "question_date": "2023/06/01 (Thu) 10:00", "answer": "-", "answer_session_ids": [],
        "haystack_session_ids": sessions.iter().map(|s| s.0).collect::<Vec<_>>(),
        "haystack_dates": (0..sessions.len()).map(|i| format!("2023/05/{:02} (Mon) 09:{:02}", i + 1, i)).collect::<Vec<_>>(),
        "haystack_sessions": haystack,
    })
}

fn file() -> Value {
    let found = question(
        "q1",
        "single-session-user",
        "Where did I buy the brass lantern?",
        &[
            ("s_a", vec![("I like green tea in the morning.", false)]),
            (
                "answer_x_1",
                vec![
                    ("I bought a brass lantern at the harbour market.", true),
                    ("Thanks for the help!", false),
                ],
            ),
            ("s_b", vec![("The weather is cold today.", false)]),
        ],
    );
    // The evidence shares no word with the question, and twelve later turns share one each:
    // no system can rank it in the first ten (the rest of the corpus follows in reverse).
    let fillers: Vec<(String, String)> = (0..12)
        .map(|i| (format!("s{i}"), format!("I bake bread number {i}.")))
        .collect();
    let mut sessions = vec![("answer_y_1", vec![("I made a chocolate torte.", true)])];
    for (id, text) in &fillers {
        sessions.push((id.as_str(), vec![(text.as_str(), false)]));
    }
    let missed = question(
        "q2",
        "temporal-reasoning",
        "Which cake did I bake?",
        &sessions,
    );
    let abstention = question(
        "q3_abs",
        "single-session-user",
        "Where is the lantern?",
        &[("answer_z_1", vec![("A brass lantern.", true)])],
    );
    let no_target = question(
        "q4",
        "single-session-assistant",
        "What did you tell me about lanterns?",
        &[("answer_w_1", vec![("Tell me about lanterns.", false)])],
    );
    // The answer session's other turn matches the question best, the evidence not at all:
    // at the session level that turn is not the answer session (the official ids rename it
    // `noans`), so the session is not found either.
    let fillers: Vec<(String, String)> = (0..12)
        .map(|i| (format!("f{i}"), format!("My bread recipe number {i}.")))
        .collect();
    let mut sessions = vec![(
        "answer_v_1",
        vec![
            ("I love my lantern collection, lanterns everywhere.", false),
            ("Copper, from the market.", true),
        ],
    )];
    for (id, text) in &fillers {
        sessions.push((id.as_str(), vec![(text.as_str(), false)]));
    }
    let renamed = question("q5", "multi-session", "Which lantern did I get?", &sessions);
    json!([found, missed, abstention, no_target, renamed])
}

fn bench(path: &Path) -> (bool, String, String) {
    bench_with(path, &[])
}

fn bench_with(path: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut args = vec![path.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = run_bench(&args);
    (code == Some(0), stdout, stderr)
}

/// The benchmark's exit code, stdout and stderr with `args`.
fn run_bench(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_retrieval-bench"))
        .args(args)
        .output()
        .expect("the benchmark runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn longmemeval_files_are_scored_with_the_official_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("lme.json");
    std::fs::write(&plain, file().to_string()).unwrap();
    let gzipped = dir.path().join("lme.json.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(file().to_string().as_bytes()).unwrap();
    std::fs::write(&gzipped, gz.finish().unwrap()).unwrap();

    let (ok, stdout, stderr) = bench(&plain);
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["benchmark"], "longmemeval");
    assert_eq!(doc["meta"]["questions"], 3);
    assert_eq!(doc["meta"]["skippedAbstention"], 1);
    assert_eq!(doc["meta"]["skippedWithoutEvidenceTurn"], 1);
    let systems = doc["systems"].as_object().unwrap();
    assert_eq!(
        systems.keys().collect::<Vec<_>>(),
        ["memory", "history", "bm25"]
    );
    for (name, system) in systems {
        // q1 is found first by every system, q2 and q5 by none: a third of each recall.
        let turn = &system["turn"];
        for key in ["any@5", "any@10", "all@10", "ndcg@10"] {
            assert_eq!(turn[key], 33.3, "{name} {key}: {turn}");
        }
        assert_eq!(turn["n"], 3);
        let by_type = system["byType"].as_object().unwrap();
        assert_eq!(
            by_type.keys().collect::<Vec<_>>(),
            ["multi-session", "single-session-user", "temporal-reasoning"],
            "{name}"
        );
        let renamed = &by_type["multi-session"];
        assert_eq!(renamed["turn"]["any@10"], 0.0, "{name}");
        assert_eq!(renamed["session"]["any@5"], 0.0, "{name}: {renamed}");
        assert_eq!(renamed["session"]["any@10"], 0.0, "{name}: {renamed}");
        let user = &by_type["single-session-user"];
        assert_eq!(user["turn"]["any@5"], 100.0, "{name}");
        assert_eq!(user["turn"]["n"], 1);
        // Sessions from the turn ranking: q1's answer session comes first.
        assert_eq!(user["session"]["any@5"], 100.0, "{name}");
        // q2's twelve other sessions fill the first ten places at the session level too.
        let missed = &by_type["temporal-reasoning"];
        assert_eq!(missed["turn"]["any@10"], 0.0, "{name}");
        assert_eq!(missed["session"]["any@10"], 0.0, "{name}");
    }
    assert_eq!(doc["meta"]["bm25SessionDocuments"]["n"], 3);
    assert_eq!(doc["meta"]["ranker"], "lexical");
    assert_eq!(doc["meta"].get("rankerSettings"), Some(&Value::Null));

    let (ok, gz_stdout, stderr) = bench(&gzipped);
    assert!(ok, "{stderr}");
    let gz_doc: Value = serde_json::from_str(&gz_stdout).unwrap();
    assert_eq!(gz_doc["systems"], doc["systems"]);
}

/// `--word-vectors`: memory and history search rank through the vector ranker. The evidence
/// ties on words with twelve other turns ("bake"), and the newer ones come first lexically;
/// the vectors know a torte is a dessert.
#[test]
fn word_vectors_rank_memory_and_history_search_by_meaning() {
    let dir = tempfile::tempdir().unwrap();
    let fillers: Vec<(String, String)> = (0..12)
        .map(|i| (format!("s{i}"), format!("I bake bread loaves {i}.")))
        .collect();
    let mut sessions = vec![(
        "answer_t_1",
        vec![(
            "I bake chocolate tortes for the neighbours on long Sunday afternoons.",
            true,
        )],
    )];
    for (id, text) in &fillers {
        sessions.push((id.as_str(), vec![(text.as_str(), false)]));
    }
    let q = question(
        "q1",
        "single-session-user",
        "Which dessert did I bake?",
        &sessions,
    );
    let path = dir.path().join("lme.json");
    std::fs::write(&path, json!([q]).to_string()).unwrap();
    let vectors = dir.path().join("vectors.txt");
    std::fs::write(
        &vectors,
        "dessert 1 0 0\nchocolate 0.9 0.1 0\ntortes 0.95 0 0.1\nbread 0 1 0\nloaves 0.1 0.9 0\n",
    )
    .unwrap();
    let any5 = |doc: &Value, system: &str| doc["systems"][system]["turn"]["any@5"].clone();

    let (ok, stdout, stderr) = bench(&path);
    assert!(ok, "{stderr}");
    let lexical: Value = serde_json::from_str(&stdout).unwrap();
    let (ok, stdout, stderr) = bench_with(&path, &["--word-vectors", vectors.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let by_meaning: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(by_meaning["meta"]["ranker"], "word-vectors");
    for system in ["memory", "history"] {
        assert_eq!(any5(&lexical, system), 0.0, "{system}: {lexical}");
        assert_eq!(any5(&by_meaning, system), 100.0, "{system}: {by_meaning}");
    }
    // The plain BM25 reference is the same either way.
    assert_eq!(lexical["systems"]["bm25"], by_meaning["systems"]["bm25"]);

    let (ok, _, stderr) = bench_with(&path, &["--word-vectors", "no-such-file.txt"]);
    assert!(
        !ok && stderr.contains("no-such-file.txt: word vectors cannot be read"),
        "{stderr}"
    );
}

#[path = "../../tavern-search/tests/support/sentence_model.rs"]
mod support;

/// `--sentence-encoder`: memory and history search rank through the real all-MiniLM-L6-v2.
/// The evidence shares one word with the question ("evening"), as twelve other turns do,
/// and the newer ones come first lexically; only the sentence says it answers it.
#[test]
fn a_sentence_encoder_ranks_memory_and_history_search_by_meaning() {
    let dir = tempfile::tempdir().unwrap();
    let fillers: Vec<(String, String)> = (0..12)
        .map(|i| {
            (
                format!("s{i}"),
                format!("The evening bus number {i} was late again."),
            )
        })
        .collect();
    let mut sessions = vec![(
        "answer_t_1",
        vec![(
            "In the evening I like to wind down with a warm bath and a novel before bed.",
            true,
        )],
    )];
    for (id, text) in &fillers {
        sessions.push((id.as_str(), vec![(text.as_str(), false)]));
    }
    let q = question(
        "q1",
        "single-session-preference",
        "How do I relax in the evening?",
        &sessions,
    );
    let path = dir.path().join("lme.json");
    std::fs::write(&path, json!([q]).to_string()).unwrap();
    let model = support::sentence_model_dir();
    let any = |doc: &Value, system: &str, k: &str| doc["systems"][system]["turn"][k].clone();

    let (ok, stdout, stderr) = bench(&path);
    assert!(ok, "{stderr}");
    let lexical: Value = serde_json::from_str(&stdout).unwrap();
    let (ok, stdout, stderr) = bench_with(&path, &["--sentence-encoder", model.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let by_meaning: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(by_meaning["meta"]["ranker"], "sentence-vectors");
    assert_eq!(by_meaning["meta"]["rankerSettings"]["pool"], 100);
    let (ok, stdout, stderr) = bench_with(
        &path,
        &[
            "--sentence-encoder",
            model.to_str().unwrap(),
            "--vector-pool",
            "7",
        ],
    );
    assert!(ok, "{stderr}");
    let pooled: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(pooled["meta"]["rankerSettings"]["pool"], 7);
    for system in ["memory", "history"] {
        assert_eq!(any(&lexical, system, "any@5"), 0.0, "{system}: {lexical}");
        assert_eq!(
            any(&by_meaning, system, "ndcg@10"),
            100.0,
            "{system}: {by_meaning}"
        );
    }

    for (args, says) in [
        (
            vec!["--vector-weight", "0.5"],
            "--vector-weight needs --word-vectors or --sentence-encoder",
        ),
        (
            vec!["--sentence-encoder", "no-such-dir"],
            "no-such-dir: sentence encoder failed: config.json",
        ),
        (
            vec![
                "--sentence-encoder",
                model.to_str().unwrap(),
                "--vector-weight",
                "2",
            ],
            "--vector-weight \"2\": a number within 0 and 0.95",
        ),
        (
            vec![
                "--sentence-encoder",
                model.to_str().unwrap(),
                "--vector-closeness",
                "best",
            ],
            "--sentence-encoder and --vector-closeness: that option is the word vectors' own",
        ),
    ] {
        let (ok, _, stderr) = bench_with(&path, &args);
        assert!(!ok && stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn the_benchmark_file_is_never_a_flags_value() {
    let dir = tempfile::tempdir().unwrap();
    let q = question(
        "q1",
        "single-session-user",
        "Which dessert?",
        &[("answer_t_1", vec![("I bake tortes.", true)])],
    );
    let path = dir.path().join("lme.json");
    std::fs::write(&path, json!([q]).to_string()).unwrap();
    let vectors = dir.path().join("vectors.txt");
    std::fs::write(&vectors, "dessert 1 0\ntortes 0.9 0.1\n").unwrap();
    let run = run_bench;
    let (file, vectors) = (path.to_str().unwrap(), vectors.to_str().unwrap());
    // Flags and their values before the file: the file is still the file.
    let (code, stdout, stderr) = run(&[
        "--vector-weight",
        "0.3",
        "--word-vectors",
        vectors,
        file,
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["meta"]["ranker"], "word-vectors");
    let settings = &doc["meta"]["rankerSettings"];
    assert_eq!(
        settings["weight"].as_f64().map(|w| (w * 10.0).round()),
        Some(3.0)
    );
    assert_eq!(settings["closeness"], "Both", "{settings}");
    assert_eq!(settings["poolIdf"], true, "{settings}");
    let (code, _, stderr) = run(&["--jsn", file]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("\"--jsn\" is not an option"), "{stderr}");
    let (code, _, stderr) = run(&[file, file]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("one benchmark file, not 2"), "{stderr}");
    let (code, _, stderr) = run(&[
        file,
        "--word-vectors",
        vectors,
        "--vector-closeness",
        "sideways",
    ]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("\"sideways\": mean, best or both"),
        "{stderr}"
    );
    let (code, stdout, stderr) = run(&[
        file,
        "--json",
        "--word-vectors",
        vectors,
        "--vector-closeness",
        "mean",
        "--no-vector-pool-idf",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let meta = &serde_json::from_str::<Value>(&stdout).unwrap()["meta"];
    assert_eq!(meta["ranker"], "word-vectors");
    // The document says how the ranker ran, not only which.
    assert_eq!(meta["rankerSettings"]["closeness"], "Mean", "{meta}");
    assert_eq!(meta["rankerSettings"]["poolIdf"], false, "{meta}");
    assert_eq!(meta["rankerSettings"]["dims"], 2, "{meta}");
    let (code, _, stderr) = run(&[file, "--vector-pool"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--vector-pool needs a value"), "{stderr}");
}

#[test]
fn a_malformed_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.json");
    std::fs::write(&path, r#"[{"question_id": "q9", "question": "?"}]"#).unwrap();
    let (ok, stdout, stderr) = bench(&path);
    assert!(!ok);
    assert!(stdout.is_empty());
    assert!(stderr.contains("q9: no haystack_session_ids"), "{stderr}");
}

/// A LoCoMo file (the other benchmark) is scored by the same program; its JSON says how the
/// ranker ran too.
#[test]
fn locomo_files_are_scored_and_say_how_the_ranker_ran() {
    let dir = tempfile::tempdir().unwrap();
    let turns: Vec<Value> = (1..=8)
        .map(|i| {
            let text = if i == 3 {
                "I went to the pottery class yesterday and loved it.".to_owned()
            } else {
                format!("Just an ordinary chat about the weather, number {i}.")
            };
            json!({"speaker": if i % 2 == 1 { "Ana" } else { "Bo" }, "dia_id": format!("D1:{i}"), "text": text})
        })
        .collect();
    let conv = json!([{
        "sample_id": "conv-t",
        "conversation": {
            "speaker_a": "Ana", "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": turns,
        },
        "qa": [{"question": "When did Ana go to the pottery class?", "answer": "7 May 2023", "evidence": ["D1:3"], "category": 2}],
    }]);
    let path = dir.path().join("locomo.json");
    std::fs::write(&path, conv.to_string()).unwrap();
    let vectors = dir.path().join("vectors.txt");
    std::fs::write(&vectors, "pottery 1 0\nclass 0.9 0.1\nweather 0 1\n").unwrap();

    let (ok, stdout, stderr) = bench(&path);
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["memory_search"]["overall"]["5"], 100.0, "{doc}");
    assert_eq!(doc["meta"]["ranker"], "lexical");
    assert_eq!(doc["meta"].get("rankerSettings"), Some(&Value::Null));

    let (ok, stdout, stderr) = bench_with(
        &path,
        &[
            "--word-vectors",
            vectors.to_str().unwrap(),
            "--no-vector-pool-idf",
        ],
    );
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["meta"]["ranker"], "word-vectors");
    let settings = &doc["meta"]["rankerSettings"];
    assert_eq!(settings["poolIdf"], false, "{settings}");
    assert_eq!(settings["closeness"], "Both", "{settings}");
    assert_eq!(settings["words"], 3, "{settings}");
}
