//! Deterministic lexical search, split as search engines split it: the [`analyzer`] (text to
//! tokens: case-folded words without [`stopwords`], Snowball stems, CJK bigrams), the index
//! (a sharded inverted index with weighted fields, per-group statistics and block maps), its
//! BM25 scoring and its exact pruned top-k collector ([`Bm25Index::top`]), and the [`rank`]
//! seam every search of AgentTavern — memories, chat history, lore — hands its candidates
//! through, where another ranker plugs in. No vector database, no randomness: the same texts
//! and query always give the same scores.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod analyzer;
mod index;
pub mod rank;
pub mod stopwords;

pub use analyzer::{index_tokens, query_tokens, raw_tokens, word_token};
pub use index::Bm25Index;
pub use rank::{Candidate, Lexical, Ranker, RankerRef};
