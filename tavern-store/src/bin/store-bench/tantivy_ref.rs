//! The tantivy reference: the same records indexed by tantivy under *our* analyzer (each
//! record's index tokens, joined by spaces, split again by tantivy's whitespace tokenizer),
//! queried with our query tokens as a disjunction of term queries scored by tantivy's BM25 —
//! what adopting tantivy as the index under our analyzer would give. The record number is a
//! fast field, so a hit is named without reading the document store.

use std::path::Path;

use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{TextAnalyzer, WhitespaceTokenizer};
use tantivy::{Index, IndexReader, ReloadPolicy, Searcher, TantivyDocument, Term};
use tavern_search::{index_tokens, query_tokens};

/// The tokenizer name the schema's text field uses.
const TOKENS: &str = "tavern_tokens";

/// An opened tantivy index with its reader.
pub struct Reference {
    reader: IndexReader,
    content: Field,
}

fn schema() -> (Schema, Field, Field) {
    let mut builder = Schema::builder();
    let indexing = TextFieldIndexing::default()
        .set_tokenizer(TOKENS)
        .set_index_option(IndexRecordOption::WithFreqs);
    let content = builder.add_text_field(
        "content",
        TextOptions::default().set_indexing_options(indexing),
    );
    let number = builder.add_u64_field("n", NumericOptions::default().set_fast());
    (builder.build(), content, number)
}

fn register(index: &Index) {
    index
        .tokenizers()
        .register(TOKENS, TextAnalyzer::from(WhitespaceTokenizer::default()));
}

/// Indexes `records` (record number = position) into a new index in `dir`, with tantivy's
/// default writer on two threads (this machine's cores) and one commit.
pub fn build(dir: &Path, records: &[(String, String)]) -> tantivy::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (schema, content, number) = schema();
    let index = Index::create_in_dir(dir, schema)?;
    register(&index);
    let mut writer = index.writer_with_num_threads(2, 400_000_000)?;
    for (n, (_, text)) in records.iter().enumerate() {
        let mut doc = TantivyDocument::default();
        doc.add_text(content, index_tokens(text).join(" "));
        doc.add_u64(number, n as u64);
        writer.add_document(doc)?;
    }
    writer.commit()?;
    writer.wait_merging_threads()?;
    Ok(())
}

impl Reference {
    /// Opens the index `build` wrote.
    pub fn open(dir: &Path) -> tantivy::Result<Self> {
        let index = Index::open_in_dir(dir)?;
        register(&index);
        let schema = index.schema();
        let content = schema.get_field("content")?;
        // The record number's fast field must be there (`search` reads it by name).
        schema.get_field("n")?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        Ok(Self { reader, content })
    }

    /// The record numbers of the best 10 matches of `text`.
    pub fn search(&self, text: &str) -> tantivy::Result<Vec<usize>> {
        let mut tokens = query_tokens(text);
        tokens.sort();
        tokens.dedup();
        let clauses: Vec<(Occur, Box<dyn Query>)> = tokens
            .iter()
            .map(|t| {
                let term = Term::from_field_text(self.content, t);
                let q: Box<dyn Query> =
                    Box::new(TermQuery::new(term, IndexRecordOption::WithFreqs));
                (Occur::Should, q)
            })
            .collect();
        let searcher: Searcher = self.reader.searcher();
        let top = searcher.search(
            &BooleanQuery::new(clauses),
            &TopDocs::with_limit(10).order_by_score(),
        )?;
        let mut out = Vec::with_capacity(top.len());
        for (_, addr) in top {
            let column = searcher
                .segment_reader(addr.segment_ord)
                .fast_fields()
                .u64("n")?;
            if let Some(n) = column.first(addr.doc_id) {
                out.push(n as usize);
            }
        }
        Ok(out)
    }
}
