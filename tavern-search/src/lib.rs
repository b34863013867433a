//! Deterministic lexical search, split as search engines split it: the [`analyzer`] (text to
//! tokens: case-folded words without [`stopwords`], Snowball stems, CJK bigrams), the index
//! (a sharded inverted index with weighted fields, per-group statistics and block maps), its
//! BM25 scoring and its exact pruned top-k collector ([`Bm25Index::top`]), and the [`rank`]
//! seam every search of AgentTavern — memories, chat history, lore — hands its candidates
//! through, where another ranker plugs in. No vector database, no randomness: the same texts
//! and query always give the same scores.
//!
//! # Example
//!
//! ```
//! use tavern_search::{query_tokens, Bm25Index};
//!
//! let mut index = Bm25Index::new();
//! index.insert(0, "Mira keeps a cracked compass in her coat.");
//! index.insert(1, "The village gate closes at dusk.");
//! index.insert(2, "米拉在雨夜里点亮了灯笼。");
//! let (hits, matched) = index.top(&query_tokens("where is the compass"), 10);
//! assert_eq!(hits.first().map(|&(doc, _)| doc), Some(0));
//! assert_eq!(matched, 1);
//! // CJK text is indexed as bigrams, so a phrase inside a sentence is found.
//! let (hits, _) = index.top(&query_tokens("灯笼"), 10);
//! assert_eq!(hits.first().map(|&(doc, _)| doc), Some(2));
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod analyzer;
#[cfg(feature = "bert")]
pub mod bert;
pub mod bytes;
mod index;
pub mod rank;
pub mod region;
pub mod sentences;
pub mod stopwords;
pub mod vectors;
pub mod when;

pub use analyzer::{index_tokens, query_tokens, raw_tokens, word_len, word_token};
pub use bytes::{ImageError, Put, Take};
pub use index::{BestMatches, Bm25Index, Tokenized};
pub use rank::{Candidate, Gatherer, Lexical, Ranker, RankerRef};
pub use region::{ReadAt, Region};
pub use sentences::{Encoder, SentenceRanker};
pub use vectors::{Closeness, VectorRanker, VectorsError, WordVectors};
pub use when::{time_window, time_window_in, TimeWindow};
