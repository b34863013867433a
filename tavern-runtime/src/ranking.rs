//! The ranker a server hands its searches, as its operator chose it on the command line:
//! BM25 alone, word vectors ([`tavern_search::VectorRanker`]) or a sentence encoder
//! ([`tavern_search::SentenceRanker`] over [`tavern_search::bert::BertEncoder`], with the
//! `sentence-encoder` feature). `tavern-bridge` and `tavern serve` open theirs here, so both
//! take the same options and refuse the same mistakes in the same words.

use std::path::PathBuf;

use tavern_search::{RankerRef, VectorRanker};
use thiserror::Error;

/// What an operator chose: at most one of the two files, and a weight for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankerChoice {
    /// `--word-vectors FILE`: GloVe or fastText as text.
    pub word_vectors: Option<PathBuf>,
    /// `--sentence-encoder DIR`: a sentence-transformers BERT folder (all-MiniLM-L6-v2 as
    /// `scripts/sentence-encoder.sh` fetches it).
    pub sentence_encoder: Option<PathBuf>,
    /// `--vector-weight W`: the share of a result's score that comes from the vectors.
    pub weight: Option<f32>,
}

/// Why the chosen ranker could not be opened. Messages name the option and the file as the
/// operator gave them.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum RankingError {
    /// Both files were given.
    #[error("--word-vectors and --sentence-encoder: choose one")]
    Both,
    /// A weight without a file it applies to.
    #[error("--vector-weight {0}: it needs --word-vectors or --sentence-encoder")]
    WeightAlone(f32),
    /// A weight outside 0 to 0.95.
    #[error("--vector-weight {0}: must be within 0 and 0.95")]
    Weight(f32),
    /// The word vectors cannot be used.
    #[error("--word-vectors {path}: {reason}")]
    WordVectors {
        /// The file as given.
        path: String,
        /// Why.
        reason: String,
    },
    /// The sentence encoder cannot be used.
    #[error("--sentence-encoder {path}: {reason}")]
    SentenceEncoder {
        /// The folder as given.
        path: String,
        /// Why.
        reason: String,
    },
    /// The reading thread stopped before it finished.
    #[error("the ranker's files were not read: {0}")]
    Stopped(String),
}

/// The ranker `choice` names, read on the blocking pool (a second or so for GloVe's 400,000
/// words or a 90 MB model), not on a worker other tasks share; and a line for the log saying
/// what was read. BM25 alone when the choice names no file.
///
/// A sentence encoder's ranker prepares ([`tavern_search::Ranker::prepare`]): searches then
/// encode on the blocking pool with no lock held, two at a time
/// ([`tavern_store::prepared_ranker`]), so one player's first search by meaning holds up no
/// other player's memory, variable or chat calls.
///
/// # Errors
/// [`RankingError`] naming the option, the file and what is wrong.
pub async fn open_ranker(choice: RankerChoice) -> Result<(RankerRef, String), RankingError> {
    if choice.word_vectors.is_some() && choice.sentence_encoder.is_some() {
        return Err(RankingError::Both);
    }
    if let Some(w) = choice.weight {
        if choice.word_vectors.is_none() && choice.sentence_encoder.is_none() {
            return Err(RankingError::WeightAlone(w));
        }
        if !(0.0..=0.95).contains(&w) {
            return Err(RankingError::Weight(w));
        }
    }
    let RankerChoice {
        word_vectors,
        sentence_encoder,
        weight,
    } = choice;
    if let Some(path) = word_vectors {
        let read = tokio::task::spawn_blocking(move || {
            VectorRanker::open(&path, weight).map_err(|e| RankingError::WordVectors {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
        })
        .await
        .map_err(|e| RankingError::Stopped(e.to_string()))??;
        let said = format!(
            "word vectors read: {} words of {} dimensions",
            read.vectors().len(),
            read.vectors().dims()
        );
        return Ok((RankerRef::new(read), said));
    }
    if let Some(dir) = sentence_encoder {
        return tokio::task::spawn_blocking(move || sentence_ranker(&dir, weight))
            .await
            .map_err(|e| RankingError::Stopped(e.to_string()))?;
    }
    Ok((RankerRef::default(), "ranking by words alone (BM25)".into()))
}

/// What a sentence encoder is asked once at start, to find a model that reads but does not
/// work.
#[cfg(feature = "sentence-encoder")]
const PROBE: &str = "A lantern hangs by the silver gate.";

#[cfg(feature = "sentence-encoder")]
fn sentence_ranker(
    dir: &std::path::Path,
    weight: Option<f32>,
) -> Result<(RankerRef, String), RankingError> {
    // The option already says it is the sentence encoder: its errors' own prefix is dropped.
    let why = |e: tavern_search::sentences::EncodeError| match e {
        tavern_search::sentences::EncodeError::Failed(why) => why,
        other => other.to_string(),
    };
    let refused = |reason: String| RankingError::SentenceEncoder {
        path: dir.display().to_string(),
        reason,
    };
    let encoder = tavern_search::bert::BertEncoder::open(dir).map_err(|e| refused(why(e)))?;
    // A model that reads but computes nothing usable (damaged weights) would otherwise rank
    // every search by words alone, silently: it is refused now, by name.
    tavern_search::Encoder::encode(&encoder, &[PROBE]).map_err(|e| {
        refused(format!(
            "the model gives no usable vector for a test sentence ({})",
            why(e)
        ))
    })?;
    let name = tavern_search::Encoder::name(&encoder).to_owned();
    let mut ranker = tavern_search::SentenceRanker::new(std::sync::Arc::new(encoder));
    if let Some(w) = weight {
        ranker = ranker.with_weight(w);
    }
    let said = format!("sentence encoder read: {name}, weight {}", ranker.weight());
    Ok((RankerRef::new(ranker), said))
}

#[cfg(not(feature = "sentence-encoder"))]
fn sentence_ranker(
    dir: &std::path::Path,
    _weight: Option<f32>,
) -> Result<(RankerRef, String), RankingError> {
    Err(RankingError::SentenceEncoder {
        path: dir.display().to_string(),
        reason: "this build has no sentence encoder (build it with the `sentence-encoder` feature)"
            .into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(words: bool, sentences: bool, weight: Option<f32>) -> RankerChoice {
        RankerChoice {
            word_vectors: words.then(|| PathBuf::from("no-such-vectors.txt")),
            sentence_encoder: sentences.then(|| PathBuf::from("no-such-model")),
            weight,
        }
    }

    #[tokio::test]
    async fn mistakes_are_refused_by_name_before_anything_is_read() {
        let err = |c| async move { open_ranker(c).await.map(|_| ()).unwrap_err() };
        assert_eq!(err(choice(true, true, None)).await, RankingError::Both);
        assert_eq!(
            err(choice(false, false, Some(0.5))).await,
            RankingError::WeightAlone(0.5)
        );
        assert_eq!(
            err(choice(false, true, Some(2.0))).await,
            RankingError::Weight(2.0)
        );
        let missing = err(choice(false, true, None)).await.to_string();
        assert!(
            missing.starts_with("--sentence-encoder no-such-model: "),
            "{missing}"
        );
        let missing = err(choice(true, false, None)).await.to_string();
        assert!(
            missing.starts_with("--word-vectors no-such-vectors.txt: "),
            "{missing}"
        );
        let (lexical, said) = open_ranker(RankerChoice::default()).await.unwrap();
        assert!(!lexical.get().rescores() && said.contains("BM25"));
    }
}
