//! The memory port: lexical search, read, conditional put and soft forget, with an audit trail.

use async_trait::async_trait;
use tavern_core::{
    AuditEntry, MemoryId, MemoryKind, MemoryRecord, MemorySource, MemoryWrite, Revision, ScopeKey,
    Tag, Timestamp,
};
use tavern_search::RankerRef;

use crate::error::StoreError;

/// How many earlier texts of a memory its audit keeps (those of its last content changes), so
/// a history shows what each recent edit changed while a record edited for years stays bounded.
pub const KEPT_CONTENTS: usize = 8;

/// How tag filters combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TagMatch {
    /// A record matches if it has any of the tags.
    #[default]
    Any,
    /// A record matches only if it has all of the tags.
    All,
}

/// A memory search. An empty `text` lists matching records by recency.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryQuery {
    /// Free text; only records sharing a token with it are returned.
    pub text: String,
    /// Scopes to search; empty means every scope (trusted callers only — tools always pass the
    /// scopes resolved from their binding).
    pub scopes: Vec<ScopeKey>,
    /// Kinds to include; empty means both.
    pub kinds: Vec<MemoryKind>,
    /// Tag filter.
    pub tags: Vec<Tag>,
    /// How `tags` combine.
    pub tag_match: TagMatch,
    /// Only records updated at or after this time.
    pub updated_from: Option<Timestamp>,
    /// Only records updated at or before this time.
    pub updated_to: Option<Timestamp>,
    /// Include forgotten records.
    pub include_deleted: bool,
    /// Include expired records.
    pub include_expired: bool,
    /// Most hits to return (at least 1; at most 100 a page).
    pub limit: usize,
    /// Hits to skip before the first one returned, in rank order: pages through a listing
    /// longer than one search returns (trusted callers such as the `tavern` command).
    pub offset: usize,
    /// Token budget for the hits' content; a hit that does not fit is not cut but left out, and
    /// the result says `truncated`.
    pub max_tokens: Option<usize>,
    /// The ranker the lexical matches go through before they are blended with importance,
    /// confidence and recency: it sees them a tier of [`tavern_search::Ranker::pool`]`(100)`
    /// at a time, best first, and gives their relevance (lexical by default: BM25's).
    pub ranker: RankerRef,
}

impl MemoryQuery {
    /// A query for `text` in `scopes` with defaults (10 hits from the first, no budget, live
    /// records only).
    pub fn new(text: impl Into<String>, scopes: Vec<ScopeKey>) -> Self {
        Self {
            text: text.into(),
            scopes,
            kinds: Vec::new(),
            tags: Vec::new(),
            tag_match: TagMatch::Any,
            updated_from: None,
            updated_to: None,
            include_deleted: false,
            include_expired: false,
            limit: 10,
            offset: 0,
            max_tokens: None,
            ranker: RankerRef::default(),
        }
    }
}

/// One search hit with its scores.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryHit {
    /// The record.
    pub record: MemoryRecord,
    /// Final score: relevance blended with importance, confidence and recency (times the
    /// time boost). Never rises from one hit to the next, page after page of one query.
    pub score: f64,
    /// Relevance before the blend (0 for an empty query): BM25's, or the query's ranker's
    /// score when it rescores (within the first [`tavern_search::rank::POOL_MAX`] matches;
    /// BM25's past them).
    pub relevance: f64,
    /// Estimated tokens of the content.
    pub tokens: usize,
    /// Whether the record has expired (only with `include_expired`).
    pub expired: bool,
}

/// Which limit left matches out of a search's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Truncation {
    /// The most results asked for.
    Limit,
    /// The token budget: a result that did not fit was left out whole.
    MaxTokens,
    /// A per-search work budget (lore key matching).
    WorkBudget,
}

impl Truncation {
    /// The label results carry (`limit`, `max-tokens`, `work-budget`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Limit => "limit",
            Self::MaxTokens => "max-tokens",
            Self::WorkBudget => "work-budget",
        }
    }

    /// The truncation a label names.
    pub fn from_label(label: &str) -> Option<Self> {
        [Self::Limit, Self::MaxTokens, Self::WorkBudget]
            .into_iter()
            .find(|t| t.label() == label)
    }
}

/// Search results: hits in rank order plus honesty about what was left out.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemorySearchResult {
    /// Hits, best first, ties broken by newer update, then scope and id.
    pub hits: Vec<MemoryHit>,
    /// How many records matched before the limit and budget were applied.
    pub source_count: usize,
    /// Whether matching records were left out.
    pub truncated: bool,
    /// Which limit left them out.
    pub truncated_by: Option<Truncation>,
}

/// Durable, scoped memories.
///
/// Records are keyed by `(scope, id)`. Every write is compare-and-set on the record's revision
/// and appends an audit entry. Nothing is physically deleted.
#[async_trait]
pub trait MemoryStore: Send + Sync {
    /// Searches live records (and, on request, forgotten or expired ones).
    ///
    /// # Errors
    /// Only IO failures; an empty result is not an error.
    async fn search(&self, query: &MemoryQuery) -> Result<MemorySearchResult, StoreError>;

    /// Reads a live record and marks it accessed (without changing its revision). Forgotten and
    /// expired records read as `None`.
    ///
    /// # Errors
    /// IO failures only.
    async fn read(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
    ) -> Result<Option<MemoryRecord>, StoreError>;

    /// Reads a record in whatever state it is — live, forgotten or expired — without marking it
    /// accessed: what a user looking for a lost memory needs (the panel, the `tavern` command),
    /// never what a model sees. `None` only when the scope never held that id.
    ///
    /// # Errors
    /// IO failures only.
    async fn inspect(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
    ) -> Result<Option<MemoryRecord>, StoreError>;

    /// Creates (`expected = None`) or updates (`expected` = current revision) a record.
    ///
    /// # Errors
    /// - [`StoreError::Conflict`] with the current revision when `expected` does not match
    ///   (creating over an existing record, updating a missing one, or a stale revision);
    /// - [`StoreError::Forgotten`] when the record was forgotten and `restore` is false;
    /// - [`StoreError::Invalid`] when the write breaks a limit.
    async fn put(
        &self,
        write: MemoryWrite,
        expected: Option<&Revision>,
        restore: bool,
    ) -> Result<MemoryRecord, StoreError>;

    /// Soft-deletes a record at `expected` revision, recording `source` in the audit.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for a missing or already forgotten record,
    /// [`StoreError::Conflict`] for a stale revision.
    async fn forget(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
        expected: &Revision,
        source: MemorySource,
    ) -> Result<MemoryRecord, StoreError>;

    /// The audit trail of a scope (or of one record in it), oldest first. Expired records
    /// appear as `expired` entries at their expiry time; nothing is purged. One record's trail
    /// names each version's text ([`AuditEntry::content`]) while it is kept: its current text
    /// and the last [`KEPT_CONTENTS`] texts it changed from; older versions' texts are `None`,
    /// never another version's.
    ///
    /// # Errors
    /// IO failures only.
    async fn memory_audit(
        &self,
        scope: &ScopeKey,
        id: Option<&MemoryId>,
    ) -> Result<Vec<AuditEntry>, StoreError>;
}

/// How many rankers prepare at once in the process (each encoder call spreads over a few
/// threads of its own): more searches that need one wait their turn before they leave the
/// async executor, holding no thread and no lock meanwhile.
pub const PREPARES_AT_ONCE: usize = 2;

/// The longest a search waits for its turn to prepare; past it, it ranks by words alone
/// (BM25), so a burst of first searches by meaning delays another by this much at most.
pub const PREPARE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Has `ranker` prepare `texts` for `query` and returns the ranker to search with (see
/// [`tavern_search::Ranker::prepare`]): one that never does slow work. What the ranker has
/// kept already is prepared at once ([`tavern_search::Ranker::prepare_kept`]); the rest on
/// the blocking pool, at most [`PREPARES_AT_ONCE`] at a time in the process, a turn held
/// until the work ends even when the search is cancelled. BM25 alone when the turn does not
/// come within [`PREPARE_WAIT`], when the preparing thread panics, or outside a tokio
/// runtime's reach. Call it with no lock held.
pub async fn prepared_ranker(ranker: &RankerRef, query: &str, texts: Vec<String>) -> RankerRef {
    static PREPARING: std::sync::OnceLock<std::sync::Arc<tokio::sync::Semaphore>> =
        std::sync::OnceLock::new();
    if !ranker.prepares() {
        return ranker.clone();
    }
    {
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        if let Some(kept) = ranker.prepare_kept(query, &texts) {
            return kept;
        }
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return RankerRef::default();
    };
    let turns = PREPARING
        .get_or_init(|| std::sync::Arc::new(tokio::sync::Semaphore::new(PREPARES_AT_ONCE)))
        .clone();
    let Ok(Ok(turn)) = tokio::time::timeout(PREPARE_WAIT, turns.acquire_owned()).await else {
        return RankerRef::default();
    };
    let (ranker, query) = (ranker.clone(), query.to_owned());
    runtime
        .spawn_blocking(move || {
            // Held by the work itself: a cancelled search does not free its turn early.
            let _turn = turn;
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            ranker.prepare(&query, &texts)
        })
        .await
        .unwrap_or_default()
}

/// Memory search with a ranker that prepares ([`tavern_search::RankerRef::prepares`]: a
/// sentence encoder), its slow part done outside the store's locks — what every caller that
/// searches on a player's behalf uses.
#[async_trait]
pub trait MemorySearchExt: MemoryStore {
    /// [`MemoryStore::search`], in three steps when the query's ranker prepares: a lexical
    /// first pass through a [`tavern_search::Gatherer`] copies out the texts the ranker will
    /// be handed; [`prepared_ranker`] encodes them on the blocking pool with no lock held;
    /// then the search runs with the prepared ranker, which only looks up what was encoded
    /// (a memory written between the passes counts as not close). So a slow or stuck
    /// encoder holds no lock: another player's memory calls go on (their own searches by
    /// meaning wait [`PREPARE_WAIT`] at most for a turn to encode). A blank query
    /// lists by recency and needs no ranker. With any other ranker, one plain search.
    ///
    /// # Errors
    /// Those of [`MemoryStore::search`].
    async fn search_prepared(&self, query: &MemoryQuery) -> Result<MemorySearchResult, StoreError> {
        if !query.ranker.prepares() {
            return self.search(query).await;
        }
        let mut second = query.clone();
        if query.text.trim().is_empty() {
            second.ranker = RankerRef::default();
            return self.search(&second).await;
        }
        let gatherer = std::sync::Arc::new(tavern_search::Gatherer::new(query.ranker.clone()));
        let mut first = query.clone();
        first.ranker = RankerRef(gatherer.clone());
        // The hits are not needed: the gatherer kept the texts the ranker will be handed.
        self.search(&first).await?;
        second.ranker = prepared_ranker(&query.ranker, &query.text, gatherer.take_texts()).await;
        self.search(&second).await
    }
}

impl<T: MemoryStore + ?Sized> MemorySearchExt for T {}
