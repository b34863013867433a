//! The memory table: records by `(scope, id)`, their audit trail and the search index.

use hashbrown::HashTable;
use rustc_hash::FxHashMap;

use serde::{Deserialize, Serialize};
use tavern_core::{
    AuditAction, AuditEntry, DefaultTokenEstimator, MemoryId, MemoryKind, MemoryRecord,
    MemorySource, MemoryWrite, Revision, ScopeKey, Timestamp, TokenEstimator,
};

use crate::error::{StoreError, Target};
use crate::memory::{MemoryHit, MemoryQuery, MemorySearchResult, TagMatch, Truncation};
use tavern_search::when::TIME_BOOST;
use tavern_search::{query_tokens, BestMatches, Bm25Index, Candidate, Tokenized};

/// Hard cap on hits per search, whatever the caller asks.
pub(crate) const SEARCH_MAX_LIMIT: usize = 100;
/// Tokens counted per hit on top of its content (id, scores, source).
const HIT_OVERHEAD_TOKENS: usize = 16;
const DAY_MS: f64 = 86_400_000.0;

/// One durable change to the memory table (a log line in the file adapter).
///
/// Externally tagged (`{"put": …}`), not internally: serde buffers internally tagged enums,
/// which doubled the cost of opening a large store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum MemoryOp {
    /// A new version of a record; its audit entry is derived from it (the action, at the
    /// record's `updatedAt`, with its revision and source), so it is not stored twice.
    Put {
        record: Box<MemoryRecord>,
        action: AuditAction,
    },
    /// A read access (does not change the revision).
    Touch {
        scope: ScopeKey,
        id: MemoryId,
        at: Timestamp,
    },
    /// A record's current version with its whole audit history (written by compaction).
    Snapshot {
        record: Box<MemoryRecord>,
        history: Vec<AuditLine>,
        /// Whether the history says which earlier contents it kept (snapshots written before
        /// contents were kept read `false`: their earlier versions' texts are unknown, never
        /// taken for the current one).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        contents: bool,
    },
}

/// One audit entry of a record, as compaction keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct AuditLine {
    action: AuditAction,
    at: Timestamp,
    revision: Revision,
    source: MemorySource,
    /// The version's text, when the next version changed it and it is among the kept ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<String>,
    /// The version's text was let go (beyond [`KEPT_CONTENTS`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    dropped: bool,
}

use crate::memory::KEPT_CONTENTS;

mod columns;
mod image;
mod records;

use records::Records;

/// What an audit item knows of its version's text.
#[derive(Debug, Clone, PartialEq)]
enum VersionText {
    /// The same as the next version's (the newest version's is the record's own).
    Same,
    /// Changed by the next version; this was it.
    Kept(Box<str>),
    /// Changed later, and no longer kept.
    Dropped,
}

/// What search filters need of a record, kept compact and parallel to `records` so a query
/// over many candidates never touches the full records.
#[derive(Debug, Clone, Copy)]
struct Meta {
    scope: u32,
    kind: MemoryKind,
    deleted: bool,
    expires_at: Option<Timestamp>,
    updated_at: Timestamp,
    /// For a query that names a time, which favours what was written then.
    created_at: Timestamp,
    importance: f64,
    confidence: f64,
}

impl Meta {
    fn of(r: &MemoryRecord, scope: u32) -> Self {
        Self {
            scope,
            kind: r.kind,
            deleted: r.deleted_at.is_some(),
            expires_at: r.expires_at,
            updated_at: r.updated_at,
            created_at: r.created_at,
            importance: r.importance,
            confidence: r.confidence,
        }
    }

    fn expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|e| e <= now)
    }

    /// Whether a search may have to leave it out: forgotten, or with an expiry (past or not).
    fn maybe_hidden(&self) -> bool {
        self.deleted || self.expires_at.is_some()
    }
}

#[derive(Debug, Default)]
pub(crate) struct MemoryTable {
    records: Records,
    meta: Vec<Meta>,
    scope_ids: FxHashMap<ScopeKey, u32>,
    /// Per scope id: its key (ties in a ranking are broken by it, without a record).
    scope_keys: Vec<ScopeKey>,
    /// Per scope id: its slots, found by their record's id (hashed by [`id_hash`]); the ids
    /// themselves are the records' (those of records still in an image: one string of them
    /// all, taken at open).
    slots: Vec<HashTable<u32>>,
    /// Per scope id: how many of its records are forgotten or carry an expiry. A search of
    /// scopes where none does needs no per-match visibility check.
    maybe_hidden: Vec<u32>,
    /// A bit per slot that is forgotten or carries an expiry: a search that must leave hidden
    /// records out tells the others by this bit, without reading their metadata (on a large
    /// store each read is a cache miss, and a common word matches a tenth of it).
    hidden_slots: Vec<u64>,
    audit: Vec<AuditItem>,
    /// Per slot: where its newest audit item is in `audit` ([`NO_AUDIT`]: none); each item
    /// points to the one before it, so one record's history is read without walking the whole
    /// trail.
    last_audit: Vec<u32>,
    /// Per slot with kept earlier texts: the audit items holding them, oldest first (at most
    /// [`KEPT_CONTENTS`]). Only edited records are here.
    kept: FxHashMap<u32, std::collections::VecDeque<u32>>,
    /// The audit items' sources.
    sources: Sources,
    index: Bm25Index,
}

/// No audit item (the end of a record's chain).
const NO_AUDIT: u32 = u32::MAX;

/// An audit entry without the parts its record already knows (id and scope), so a large store
/// does not hold every scope twice: the revision as its digits, the source by number (those
/// read from an image are its dictionary's, shared with the records read from it).
#[derive(Debug)]
struct AuditItem {
    slot: u32,
    /// The same record's previous item in the trail ([`NO_AUDIT`]: none).
    prev: u32,
    action: AuditAction,
    at: Timestamp,
    /// [`Revision::to_u128`].
    revision: u128,
    /// In [`Sources`].
    source: u32,
    text: VersionText,
}

/// The sources of a table's audit items, by number: those of the image it was read from (its
/// dictionary, one copy shared with the records), then one per item added since (a tool
/// write's source names its own call, so most differ) unless it repeats the one before.
#[derive(Debug, Default)]
struct Sources {
    read: std::sync::Arc<[MemorySource]>,
    added: Vec<MemorySource>,
}

impl Sources {
    /// The sources an image numbers so.
    fn read(read: std::sync::Arc<[MemorySource]>) -> Self {
        Self {
            read,
            added: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        self.read.len() + self.added.len()
    }

    fn id(&mut self, source: MemorySource) -> u32 {
        let last = self.len().checked_sub(1);
        if last.and_then(|l| self.get(u32::try_from(l).ok()?)) == Some(&source) {
            return last.and_then(|l| u32::try_from(l).ok()).unwrap_or(0);
        }
        self.added.push(source);
        u32::try_from(self.len() - 1).unwrap_or(u32::MAX)
    }

    fn get(&self, id: u32) -> Option<&MemorySource> {
        let id = id as usize;
        match id.checked_sub(self.read.len()) {
            None => self.read.get(id),
            Some(added) => self.added.get(added),
        }
    }

    /// The source of `id`, as an audit entry names it.
    fn source(&self, id: u32) -> MemorySource {
        self.get(id).cloned().unwrap_or_else(MemorySource::system)
    }

    fn iter(&self) -> impl Iterator<Item = &MemorySource> {
        self.read.iter().chain(&self.added)
    }
}

/// A new version and the `put` op that records it.
fn put(record: MemoryRecord, action: AuditAction) -> (MemoryRecord, MemoryOp) {
    let op = MemoryOp::Put {
        record: Box::new(record.clone()),
        action,
    };
    (record, op)
}

fn target(scope: &ScopeKey, id: &MemoryId) -> Box<Target> {
    Box::new(Target::Memory {
        scope: scope.clone(),
        id: id.clone(),
    })
}

impl MemoryTable {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// How many records (live, forgotten or expired) each scope holds, by the scope's text.
    #[cfg(feature = "postgres")]
    pub(crate) fn records_per_scope(&self) -> Vec<(String, usize)> {
        self.scope_ids
            .iter()
            .map(|(scope, &i)| {
                let n = self.slots.get(i as usize).map_or(0, |s| s.len());
                (scope.to_string(), n)
            })
            .collect()
    }

    fn slot(&self, scope: &ScopeKey, id: &MemoryId) -> Option<u32> {
        let scope = *self.scope_ids.get(scope)?;
        let id = id.as_str();
        self.slots[scope as usize]
            .find(id_hash(id), |&slot| self.records.id(slot) == Some(id))
            .copied()
    }

    /// Adds `slot` (whose record is in place) to its scope's lookup by id.
    fn add_slot(&mut self, scope: u32, slot: u32) {
        let records = &self.records;
        let hash = id_hash(records.id(slot).unwrap_or_default());
        if let Some(slots) = self.slots.get_mut(scope as usize) {
            slots.insert_unique(hash, slot, |&s| id_hash(records.id(s).unwrap_or_default()));
        }
    }

    pub(crate) fn get(&self, scope: &ScopeKey, id: &MemoryId) -> Option<&MemoryRecord> {
        self.slot(scope, id).and_then(|s| self.records.get(s))
    }

    fn scope_id(&mut self, scope: &ScopeKey) -> u32 {
        if let Some(id) = self.scope_ids.get(scope) {
            return *id;
        }
        let id = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        self.scope_ids.insert(scope.clone(), id);
        self.scope_keys.push(scope.clone());
        self.slots.push(HashTable::new());
        self.maybe_hidden.push(0);
        id
    }

    pub(crate) fn read_live(
        &self,
        scope: &ScopeKey,
        id: &MemoryId,
        now: Timestamp,
    ) -> Option<&MemoryRecord> {
        self.get(scope, id).filter(|r| r.is_live(now))
    }

    /// Checks a put against the current state; returns the new version and the op to apply.
    pub(crate) fn prepare_put(
        &self,
        write: MemoryWrite,
        expected: Option<&Revision>,
        restore: bool,
        now: Timestamp,
    ) -> Result<(MemoryRecord, MemoryOp), StoreError> {
        let (record, action) = self.decide_put(write, expected, restore, now)?;
        Ok(put(record, action))
    }

    /// The op of a put checked against the current state, without a copy of the new version
    /// for the caller (an import's records go to the log and the table only).
    pub(crate) fn prepare_put_op(
        &self,
        write: MemoryWrite,
        now: Timestamp,
    ) -> Result<MemoryOp, StoreError> {
        let (record, action) = self.decide_put(write, None, false, now)?;
        Ok(MemoryOp::Put {
            record: Box::new(record),
            action,
        })
    }

    fn decide_put(
        &self,
        write: MemoryWrite,
        expected: Option<&Revision>,
        restore: bool,
        now: Timestamp,
    ) -> Result<(MemoryRecord, AuditAction), StoreError> {
        write.validate()?;
        let current = self.get(&write.scope, &write.id);
        let conflict = |current: Option<&MemoryRecord>| StoreError::Conflict {
            target: target(&write.scope, &write.id),
            current: current.map(|r| r.revision.clone()),
        };
        match (current, expected) {
            (None, None) => Ok((MemoryRecord::create(write, now)?, AuditAction::Created)),
            (None, Some(_)) | (Some(_), None) => Err(conflict(current)),
            (Some(cur), Some(exp)) if &cur.revision != exp => Err(conflict(current)),
            (Some(cur), Some(_)) => {
                if cur.deleted_at.is_some() && !restore {
                    return Err(StoreError::Forgotten { id: cur.id.clone() });
                }
                let action = if cur.deleted_at.is_some() {
                    AuditAction::Restored
                } else {
                    AuditAction::Updated
                };
                Ok((cur.updated(write, now)?, action))
            }
        }
    }

    pub(crate) fn prepare_forget(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
        expected: &Revision,
        source: MemorySource,
        now: Timestamp,
    ) -> Result<(MemoryRecord, MemoryOp), StoreError> {
        let Some(cur) = self.get(scope, id).filter(|r| r.deleted_at.is_none()) else {
            return Err(StoreError::NotFound {
                target: target(scope, id),
            });
        };
        if &cur.revision != expected {
            return Err(StoreError::Conflict {
                target: target(scope, id),
                current: Some(cur.revision.clone()),
            });
        }
        Ok(put(cur.forgotten(source, now), AuditAction::Forgotten))
    }

    /// Applies an operation; replaying the same log twice from empty yields the same table.
    pub(crate) fn apply(&mut self, op: MemoryOp) {
        // The index text of the version this replaces, if it replaces one.
        let replaced = match &op {
            MemoryOp::Put { record, .. } | MemoryOp::Snapshot { record, .. } => {
                self.get(&record.scope, &record.id).map(index_text)
            }
            MemoryOp::Touch { .. } => None,
        };
        if let Some(slot) = self.apply_record(op) {
            let text = self.records.get(slot).map(index_text).unwrap_or_default();
            let scope = self.meta[slot as usize].scope;
            match replaced {
                // An edit or a forget: the old version's postings are taken out (a forget
                // keeps the text, so nothing changes), none left stale.
                Some(old) => {
                    self.index
                        .replace_fields(slot, scope, &[(&old, 1.0)], &[(&text, 1.0)])
                }
                None => self.index.insert_fields(slot, scope, &[(&text, 1.0)]),
            }
        }
    }

    /// Applies many operations in order and indexes the changed records in bulk (opening a
    /// large store): same result as applying them one by one.
    pub(crate) fn apply_many(&mut self, ops: Vec<MemoryOp>) {
        let changed = self.apply_records(ops);
        self.index_slots(changed);
    }

    /// Applies many operations in order but indexes nothing: the slots of the records they
    /// put, in order, to index after ([`MemoryTable::index_tokenized`] or `index_slots`).
    pub(crate) fn apply_records(&mut self, ops: Vec<MemoryOp>) -> Vec<u32> {
        let n = ops.len();
        self.meta.reserve(n);
        self.audit.reserve(n);
        self.index.reserve(n);
        let mut changed = Vec::with_capacity(n);
        for op in ops {
            if let Some(slot) = self.apply_record(op) {
                changed.push(slot);
            }
        }
        changed
    }

    /// The index texts of the records `ops` put, one after another, and where each lies: what
    /// an import tokenizes ([`Bm25Index::tokenize`]) while its records are written and applied.
    pub(crate) fn index_texts(ops: &[MemoryOp]) -> (String, Vec<std::ops::Range<usize>>) {
        let mut text = String::new();
        let mut spans = Vec::with_capacity(ops.len());
        for op in ops {
            if let MemoryOp::Put { record, .. } | MemoryOp::Snapshot { record, .. } = op {
                let start = text.len();
                push_index_text(&mut text, record);
                spans.push(start..text.len());
            }
        }
        (text, spans)
    }

    /// Indexes the records at `slots` (new ones, as [`MemoryTable::apply_records`] returned
    /// them) from their texts tokenized in that order; from the records themselves when the
    /// texts are not as many (the texts and the slots come from the same ops: never expected).
    pub(crate) fn index_tokenized(&mut self, slots: Vec<u32>, tokenized: Tokenized<'_>) {
        let docs: Vec<(u32, u32)> = slots
            .iter()
            .map(|slot| (*slot, self.meta[*slot as usize].scope))
            .collect();
        if !self.index.insert_tokenized(&docs, tokenized) {
            debug_assert!(false, "an import's texts and records differ in number");
            self.index_slots(slots);
        }
    }

    /// The table with only the records of the scopes `keep` accepts (by the scope's text), in
    /// the same order as here — slots, and the audit trail item by item — so that what a
    /// caller sees of those scopes (rankings, audit trails with equal times) is unchanged.
    #[cfg(feature = "postgres")]
    pub(crate) fn keep_scopes(&self, keep: &dyn Fn(&str) -> bool) -> Self {
        let mut kept_scope = vec![false; self.slots.len()];
        for (scope, &id) in &self.scope_ids {
            if let Some(k) = kept_scope.get_mut(id as usize) {
                *k = keep(&scope.to_string());
            }
        }
        let mut table = Self::new();
        let mut moved = vec![NO_AUDIT; self.records.len()];
        for (slot, record) in self.records.iter() {
            let slot = slot as usize;
            let scope = self.meta[slot].scope as usize;
            if kept_scope.get(scope).copied().unwrap_or(false) {
                moved[slot] = table.place(record.into_owned());
            }
        }
        for a in &self.audit {
            let slot = moved.get(a.slot as usize).copied().unwrap_or(NO_AUDIT);
            if slot != NO_AUDIT {
                let (revision, source) = (
                    Revision::from_u128(a.revision),
                    self.sources.source(a.source),
                );
                table.push_audit(slot, a.action, a.at, revision, source, a.text.clone());
            }
        }
        let slots = (0..table.records.len())
            .filter_map(|s| u32::try_from(s).ok())
            .collect();
        table.index_slots(slots);
        table
    }

    /// Indexes the texts of `slots` (new records) in bulk.
    pub(crate) fn index_slots(&mut self, changed: Vec<u32>) {
        // Every indexed text in one string: one block freed after, not a small string per
        // record left as holes in the heap of a store that was just opened.
        let mut text = String::new();
        let mut spans = Vec::with_capacity(changed.len());
        for slot in changed {
            let start = text.len();
            // Read, not kept: a record still the image's bytes (a rebuilt index) stays bytes.
            if let Some(record) = self.records.read(slot) {
                push_index_text(&mut text, &record);
            }
            spans.push((slot, self.meta[slot as usize].scope, start, text.len()));
        }
        self.index_spans(&text, &spans);
    }

    /// Indexes each `(slot, scope, start, end)`'s text, `text[start..end]`, in bulk.
    fn index_spans(&mut self, text: &str, spans: &[(u32, u32, usize, usize)]) {
        let refs: Vec<(u32, u32, &str)> = spans
            .iter()
            .map(|&(slot, scope, start, end)| (slot, scope, text.get(start..end).unwrap_or("")))
            .collect();
        self.index.insert_many(&refs);
    }

    /// Appends an audit item of `slot`, chained to the slot's previous one.
    fn push_audit(
        &mut self,
        slot: u32,
        action: AuditAction,
        at: Timestamp,
        revision: Revision,
        source: MemorySource,
        text: VersionText,
    ) {
        let at_slot = slot as usize;
        if self.last_audit.len() <= at_slot {
            self.last_audit.resize(at_slot + 1, NO_AUDIT);
        }
        let here = u32::try_from(self.audit.len()).unwrap_or(NO_AUDIT);
        if matches!(text, VersionText::Kept(_)) {
            self.keep(slot, here);
        }
        let source = self.sources.id(source);
        self.audit.push(AuditItem {
            slot,
            prev: self.last_audit[at_slot],
            action,
            at,
            revision: revision.to_u128(),
            source,
            text,
        });
        self.last_audit[at_slot] = here;
    }

    /// Notes that audit item `item` of `slot` keeps an earlier text, letting the oldest go past
    /// [`KEPT_CONTENTS`].
    fn keep(&mut self, slot: u32, item: u32) {
        let queue = self.kept.entry(slot).or_default();
        queue.push_back(item);
        if queue.len() > KEPT_CONTENTS {
            if let Some(old) = queue.pop_front() {
                if let Some(a) = self.audit.get_mut(old as usize) {
                    a.text = VersionText::Dropped;
                }
            }
        }
    }

    /// A new version of `slot` changed its text from `old_content`: the slot's newest audit
    /// item (the version being replaced) keeps that text.
    fn keep_replaced_text(&mut self, slot: u32, old_content: String) {
        let Some(&last) = self.last_audit.get(slot as usize) else {
            return;
        };
        if let Some(item) = self.audit.get_mut(last as usize) {
            if item.text == VersionText::Same {
                item.text = VersionText::Kept(old_content.into_boxed_str());
                self.keep(slot, last);
            }
        }
    }

    /// Stores a record version in its slot (a new slot for a new key); access times survive.
    fn place(&mut self, record: MemoryRecord) -> u32 {
        let slot = self.place_record(record);
        let hidden = self.meta[slot as usize].maybe_hidden();
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        if self.hidden_slots.len() <= word {
            self.hidden_slots.resize(word + 1, 0);
        }
        if hidden {
            self.hidden_slots[word] |= bit;
        } else {
            self.hidden_slots[word] &= !bit;
        }
        slot
    }

    /// Whether a slot may be hidden from a search (forgotten, or with an expiry).
    fn maybe_hidden_slot(&self, slot: u32) -> bool {
        self.hidden_slots
            .get(slot as usize / 64)
            .is_none_or(|w| w & (1 << (slot % 64)) != 0)
    }

    fn place_record(&mut self, mut record: MemoryRecord) -> u32 {
        let scope = self.scope_id(&record.scope);
        let meta = Meta::of(&record, scope);
        let found = self.slot(&record.scope, &record.id);
        let was_hidden = found.is_some_and(|slot| self.meta[slot as usize].maybe_hidden());
        let hidden = &mut self.maybe_hidden[scope as usize];
        *hidden += u32::from(meta.maybe_hidden());
        *hidden -= u32::from(was_hidden);
        match found {
            Some(slot) => {
                let accessed = self.records.get(slot).and_then(|r| r.last_accessed_at);
                record.last_accessed_at = record.last_accessed_at.max(accessed);
                let content_changed = self
                    .records
                    .get(slot)
                    .is_some_and(|old| old.content != record.content);
                let old = self.records.replace(slot, record);
                self.meta[slot as usize] = meta;
                if let Some(old) = old.filter(|_| content_changed) {
                    self.keep_replaced_text(slot, old.content);
                }
                slot
            }
            None => {
                let slot = u32::try_from(self.records.len()).unwrap_or(u32::MAX);
                self.records.push(record);
                self.add_slot(scope, slot);
                self.meta.push(meta);
                slot
            }
        }
    }

    /// The whole table as one snapshot operation per record (for log compaction): replaying
    /// them yields the same records, access times and audit trails.
    pub(crate) fn snapshot(&self) -> Vec<MemoryOp> {
        let mut history: Vec<Vec<AuditLine>> = vec![Vec::new(); self.records.len()];
        for a in &self.audit {
            history[a.slot as usize].push(AuditLine {
                action: a.action,
                at: a.at,
                revision: Revision::from_u128(a.revision),
                source: self.sources.source(a.source),
                content: match &a.text {
                    VersionText::Kept(text) => Some(text.to_string()),
                    VersionText::Same | VersionText::Dropped => None,
                },
                dropped: a.text == VersionText::Dropped,
            });
        }
        // By slot: a record that could not be read (the table lost, see `lost`: no
        // compaction writes this snapshot) takes no other's history.
        self.records
            .iter()
            .map(|(slot, r)| MemoryOp::Snapshot {
                record: Box::new(r.into_owned()),
                history: history
                    .get_mut(slot as usize)
                    .map(std::mem::take)
                    .unwrap_or_default(),
                contents: true,
            })
            .collect()
    }

    /// Applies an operation to the records and audit; returns the slot whose text changed.
    fn apply_record(&mut self, op: MemoryOp) -> Option<u32> {
        match op {
            MemoryOp::Put { record, action } => {
                let (at, revision, source) = (
                    record.updated_at,
                    record.revision.clone(),
                    record.source.clone(),
                );
                let slot = self.place(*record);
                self.push_audit(slot, action, at, revision, source, VersionText::Same);
                Some(slot)
            }
            MemoryOp::Snapshot {
                record,
                history,
                contents,
            } => {
                let slot = self.place(*record);
                let newest = history.len().saturating_sub(1);
                for (i, h) in history.into_iter().enumerate() {
                    let text = match (h.content, h.dropped) {
                        (Some(text), _) => VersionText::Kept(text.into()),
                        (None, true) => VersionText::Dropped,
                        // A snapshot from before texts were kept: an earlier version's text
                        // is unknown, not the current one.
                        (None, false) if !contents && i < newest => VersionText::Dropped,
                        (None, false) => VersionText::Same,
                    };
                    self.push_audit(slot, h.action, h.at, h.revision, h.source, text);
                }
                Some(slot)
            }
            MemoryOp::Touch { scope, id, at } => {
                if let Some(rec) = self
                    .slot(&scope, &id)
                    .and_then(|slot| self.records.get_mut(slot))
                {
                    rec.last_accessed_at = Some(rec.last_accessed_at.map_or(at, |t| t.max(at)));
                }
                None
            }
        }
    }

    /// Whether a posting list the index read from its image's file could not be read there or
    /// failed its checksum (it was taken as empty): then rebuilds the index from the records,
    /// as an open from the log would, and returns `true`. The caller reports it and saves no
    /// image of the damaged index (its [`MemoryTable::write_image`] says `false`).
    pub(crate) fn heal(&mut self) -> bool {
        if !self.index.damaged() {
            return false;
        }
        self.index = Bm25Index::default();
        self.index.reserve(self.records.len());
        let mut text = String::new();
        let mut spans = Vec::with_capacity(self.records.len());
        // Every record, those still in the image read from it in one go.
        for (slot, record) in self.records.iter() {
            let start = text.len();
            push_index_text(&mut text, &record);
            spans.push((slot, self.meta[slot as usize].scope, start, text.len()));
        }
        self.index_spans(&text, &spans);
        true
    }

    /// Whether a record could not be read back from the image the table was read from (the
    /// file changed since it was opened): what the table answered or prepared since may lack
    /// it, so its owner reads the table again from its log before using any of it.
    pub(crate) fn lost(&self) -> bool {
        self.records.lost()
    }

    /// Whether the index found a posting list of its image damaged ([`MemoryTable::heal`]
    /// would rebuild it): cheap, for callers that heal off their thread only when needed.
    #[cfg(feature = "postgres")]
    pub(crate) fn needs_heal(&self) -> bool {
        self.index.damaged()
    }

    /// Whether some records still lie in the image the table was read from (so a call may
    /// find the table [`MemoryTable::lost`] and have to be decided again).
    pub(crate) fn may_lose(&self) -> bool {
        self.records.in_image()
    }

    /// Whether every posting list of the index is whole (reading those it read from an image
    /// and never needed since): what `tavern check` asks.
    pub(crate) fn postings_whole(&self) -> bool {
        self.index.postings_whole()
    }

    /// Whether every record reads back whole from the image it lies in (each read in one go,
    /// checked and decoded, none kept): what `tavern check` asks of the file store's image.
    pub(crate) fn records_whole(&self) -> bool {
        self.records.iter().count() == self.records.len() && !self.records.lost()
    }

    /// [`MemoryTable::search`], again after [`MemoryTable::heal`] when the first found the
    /// index damaged (so no answer comes from missing postings); whether it healed.
    pub(crate) fn search_healing(
        &mut self,
        q: &MemoryQuery,
        now: Timestamp,
    ) -> (MemorySearchResult, bool) {
        let found = self.search(q, now);
        if self.heal() {
            (self.search(q, now), true)
        } else {
            (found, false)
        }
    }

    pub(crate) fn search(&self, q: &MemoryQuery, now: Timestamp) -> MemorySearchResult {
        let estimator = DefaultTokenEstimator;
        // Scopes the table has never seen cannot match anything.
        let scope_filter: Vec<u32> = q
            .scopes
            .iter()
            .filter_map(|s| self.scope_ids.get(s).copied())
            .collect();
        if !q.scopes.is_empty() && scope_filter.is_empty() {
            return MemorySearchResult::default();
        }
        let visible = |slot: u32| {
            let m = &self.meta[slot as usize];
            (q.include_deleted || !m.deleted)
                && (q.include_expired || !m.expired(now))
                && (q.scopes.is_empty() || scope_filter.contains(&m.scope))
                && (q.kinds.is_empty() || q.kinds.contains(&m.kind))
                && q.updated_from.is_none_or(|t| m.updated_at >= t)
                && q.updated_to.is_none_or(|t| m.updated_at <= t)
                && (q.tags.is_empty() || {
                    // Read, not kept: a tag filter looks at every match, and keeping each
                    // decoded would hold the store decoded for good.
                    let record = self.records.read(slot);
                    let tags = record.as_ref().map_or(&[][..], |r| &r.tags[..]);
                    match q.tag_match {
                        TagMatch::Any => q.tags.iter().any(|t| tags.contains(t)),
                        TagMatch::All => q.tags.iter().all(|t| tags.contains(t)),
                    }
                })
        };
        let mut source_count = 0;
        let mut hits: Vec<Ranked> = if q.text.trim().is_empty() {
            (0..self.records.len())
                .filter_map(|s| u32::try_from(s).ok())
                .filter(|s| visible(*s))
                .map(|slot| Ranked::new(0.0, 0.0, slot))
                .collect()
        } else {
            // Statistics (document count, lengths, document frequencies) come from the scopes
            // searched, so how rare a word is does not depend on other chats' memories.
            let groups = (!q.scopes.is_empty()).then_some(&scope_filter[..]);
            // The index already keeps to the searched scopes; the other conditions need a look
            // at each match only when a filter is set or a searched scope holds a forgotten or
            // expiring record (the common search has neither: on a large store the look costs
            // more than the scoring).
            let scoped = |id: &u32| self.maybe_hidden.get(*id as usize).copied().unwrap_or(0);
            let hidden = if q.scopes.is_empty() {
                self.maybe_hidden.iter().sum::<u32>()
            } else {
                scope_filter.iter().map(scoped).sum::<u32>()
            };
            let check = !q.kinds.is_empty()
                || !q.tags.is_empty()
                || q.updated_from.is_some()
                || q.updated_to.is_some()
                || (hidden > 0 && !(q.include_deleted && q.include_expired));
            let limit = q.limit.clamp(1, SEARCH_MAX_LIMIT).saturating_add(q.offset);
            // A query that points at a time ("four weeks ago", "上个月") favours the memories
            // written then.
            let window = tavern_search::time_window(&q.text, now.0);
            let most = if window.is_some() { TIME_BOOST } else { 1.0 };
            let boost = |slot: u32| match (&window, self.meta.get(slot as usize)) {
                (Some(w), Some(m)) if w.contains(m.created_at.0) => TIME_BOOST,
                _ => 1.0,
            };
            // Only hidden records to leave out: the others are told by a bit.
            let only_hidden = q.kinds.is_empty()
                && q.tags.is_empty()
                && q.updated_from.is_none()
                && q.updated_to.is_none();
            let shown = |slot: u32| (only_hidden && !self.maybe_hidden_slot(slot)) || visible(slot);
            let tokens = query_tokens(&q.text);
            let best = |k: usize, share: f32| {
                self.index.best(
                    &tokens,
                    groups,
                    k,
                    share,
                    check.then_some(&shown as &dyn Fn(u32) -> bool),
                )
            };
            if q.ranker.get().rescores() {
                // Ranked tier by tier, so every page of a query agrees (see `tiers`): the
                // matches of the tiers that reach the page.
                let tier = q.ranker.pool(SEARCH_MAX_LIMIT);
                // Tiers follow relevance times the time boost: a match with less than its
                // share of the k-th best relevance cannot be among the best k so lifted.
                let ranked;
                (ranked, source_count) =
                    self.tiers(q, &|k| best(k, 1.0 / most), limit, tier, &boost, now);
                ranked
            } else {
                // Only the matches that can reach the page are scored (the others are
                // counted): every match whose relevance is at least the share of the
                // limit-th best's that the blend and the time boost could still lift to it.
                let found = best(limit, BLEND_MIN / most);
                source_count = found.matched;
                let mut matches = found.hits;
                if matches.len() > limit {
                    // The blend scales relevance by 0.7 to 1.0 (and the time boost by up to
                    // `TIME_BOOST`), so a match whose relevance is below that share of the
                    // limit-th best relevance can never reach the results: skip blending it.
                    matches.select_nth_unstable_by(limit - 1, |a, b| b.1.total_cmp(&a.1));
                    // Tighter: the best `limit` by relevance, blended, make the limit-th best
                    // blended score at least the least of theirs, and the blend never lifts a
                    // relevance above itself (times the boost): a match below that is never
                    // shown, and is not looked up (on a large store each look is a cache
                    // miss).
                    let sure = matches[..limit]
                        .iter()
                        .map(|(slot, rel)| {
                            blend(f64::from(*rel), &self.meta[*slot as usize], now)
                                * f64::from(boost(*slot))
                        })
                        .fold(f64::INFINITY, f64::min);
                    let floor = matches[limit - 1].1 * BLEND_MIN / most;
                    matches.retain(|(_, rel)| {
                        *rel >= floor && f64::from(*rel) * f64::from(most) * (1.0 + 1e-9) >= sure
                    });
                }
                matches
                    .into_iter()
                    .map(|(slot, rel)| {
                        let rel = f64::from(rel);
                        let score =
                            blend(rel, &self.meta[slot as usize], now) * f64::from(boost(slot));
                        Ranked::new(score, rel, slot)
                    })
                    .collect()
            }
        };
        let order = |a: &Ranked, b: &Ranked| {
            let (ra, rb) = (&self.meta[a.slot as usize], &self.meta[b.slot as usize]);
            a.tier
                .cmp(&b.tier)
                .then(b.score.total_cmp(&a.score))
                .then(rb.updated_at.cmp(&ra.updated_at))
                .then_with(|| self.by_scope_and_id(a.slot, b.slot))
        };
        source_count = source_count.max(hits.len());
        let limit = q.limit.clamp(1, SEARCH_MAX_LIMIT);
        // Only the best `offset + limit` can matter: select them, sort just those, skip
        // `offset`.
        let wanted = limit.saturating_add(q.offset);
        if hits.len() > wanted {
            hits.select_nth_unstable_by(wanted - 1, order);
            hits.truncate(wanted);
        }
        hits.sort_by(order);
        let skipped = q.offset.min(hits.len());
        hits.drain(..skipped);
        let mut out = MemorySearchResult {
            source_count,
            ..Default::default()
        };
        let mut used = 0usize;
        for Ranked {
            score,
            relevance,
            slot,
            ..
        } in hits
        {
            let Some(r) = self.records.get(slot) else {
                continue;
            };
            let tokens = estimator.estimate(&r.content) + HIT_OVERHEAD_TOKENS;
            if let Some(budget) = q.max_tokens {
                if used + tokens > budget {
                    out.truncated = true;
                    out.truncated_by = Some(Truncation::MaxTokens);
                    break;
                }
            }
            used += tokens;
            out.hits.push(MemoryHit {
                record: r.clone(),
                score,
                relevance,
                tokens,
                expired: r.is_expired(now),
            });
        }
        if !out.truncated && skipped + out.hits.len() < source_count {
            out.truncated = true;
            out.truncated_by = Some(Truncation::Limit);
        }
        out
    }

    /// The matches `gather` finds (given how many of the best it must hold, by relevance times
    /// `boost`), ranked tier by tier: the best by BM25 times the time boost (so a query that
    /// names a time brings what was written then into the first tiers, as it lifts it in a
    /// lexical search; ties by scope and id) `tier` at a time, each tier handed to
    /// the query's ranker on its own (the tiers within [`tavern_search::rank::POOL_MAX`];
    /// past it the lexical relevance stands), blended, time-boosted, and ordered after every
    /// match of the tiers before it (its scores scaled below theirs). Whole tiers are ranked
    /// until `wanted` (at least 1) are kept or the matches run out; returns them and how many
    /// matches there are, less those the ranker dropped from the tiers ranked (a page that
    /// ends within `POOL_MAX` may say more follow when the ranker would drop all of them).
    ///
    /// A tier's ranking depends only on its own matches, and `tier` depends on neither the
    /// page nor its size, so the pages of one query never repeat or skip a match: a single
    /// ranked pool as large as the page reaches (page 2's is twice page 1's) lets the blend
    /// lift a match of the larger pool over one page 1 showed already. A page deep in the
    /// results costs a ranker call per tier before it: at most `POOL_MAX / tier`, each
    /// within the ranker's own bounds.
    ///
    /// Ties are never broken by slot: slots follow load order, which differs between stores
    /// holding the same memories (a PostgreSQL store held by scope loads scopes as calls use
    /// them), and a tie at a tier's edge would then pick different matches.
    fn tiers(
        &self,
        q: &MemoryQuery,
        gather: &dyn Fn(usize) -> BestMatches,
        wanted: usize,
        tier: usize,
        boost: &dyn Fn(u32) -> f32,
        now: Timestamp,
    ) -> (Vec<Ranked>, usize) {
        // (slot, BM25, BM25 times the time boost)
        let best_first = |a: &(u32, f32, f32), b: &(u32, f32, f32)| {
            b.2.total_cmp(&a.2)
                .then_with(|| self.by_scope_and_id(a.0, b.0))
        };
        let mut out: Vec<Ranked> = Vec::new();
        // The least score of the tiers so far: the next tier stays below it.
        let mut floor = f64::INFINITY;
        let (mut done, mut dropped) = (0, 0);
        let (wanted, tier) = (wanted.max(1), tier.max(1));
        let mut k = wanted.div_ceil(tier).saturating_mul(tier);
        loop {
            let found = gather(k);
            let mut matches: Vec<(u32, f32, f32)> = found
                .hits
                .iter()
                .map(|&(slot, score)| (slot, score, score * boost(slot)))
                .collect();
            if matches.len() > k {
                matches.select_nth_unstable_by(k - 1, best_first);
                matches.truncate(k);
            }
            // Fewer than asked for: every match is here.
            let all = matches.len() < k;
            matches.sort_by(best_first);
            // A larger gathering begins with the same tiers: those ranked already are kept.
            for (i, chunk) in matches.chunks(tier).enumerate().skip(done) {
                let mut candidates: Vec<Candidate<'_>> = chunk
                    .iter()
                    .filter_map(|&(slot, score, _)| {
                        Some(Candidate {
                            doc: slot,
                            text: &self.records.get(slot)?.content,
                            score,
                        })
                    })
                    .collect();
                if (i + 1).saturating_mul(tier) <= tavern_search::rank::POOL_MAX {
                    q.ranker.apply(&q.text, &mut candidates);
                } else {
                    // What the seam would drop (an index whose bounds broke).
                    candidates.retain(|c| c.score.is_finite() && c.score > 0.0);
                }
                dropped += chunk.len() - candidates.len();
                let tier_no = u32::try_from(i).unwrap_or(u32::MAX);
                let mut scored: Vec<Ranked> = candidates
                    .iter()
                    .map(|c| {
                        let rel = f64::from(c.score);
                        let score =
                            blend(rel, &self.meta[c.doc as usize], now) * f64::from(boost(c.doc));
                        Ranked {
                            tier: tier_no,
                            ..Ranked::new(score, rel, c.doc)
                        }
                    })
                    .collect();
                // The order is the tier's first (`Ranked::tier`); the scores say so too, for
                // readers that sort by score (never rounded down to nothing, so tiers far
                // down may tie at the least positive score, and stay in order by tier).
                let top = scored.iter().map(|s| s.score).fold(0.0, f64::max);
                if top >= floor {
                    let factor = floor * 0.5 / top;
                    for s in &mut scored {
                        s.score = (s.score * factor).max(f64::MIN_POSITIVE);
                    }
                }
                floor = scored.iter().map(|s| s.score).fold(floor, f64::min);
                out.extend(scored);
                done = i + 1;
            }
            if all || out.len() >= wanted {
                return (out, found.matched.saturating_sub(dropped));
            }
            // The ranker dropped some: the tiers after them fill the page. At least twice as
            // many each time, so that however many are dropped (an index whose bounds broke
            // drops what it scores), the gatherings stay few.
            let short = (wanted - out.len()).div_ceil(tier);
            k = k
                .saturating_add(short.saturating_mul(tier))
                .max(k.saturating_mul(2));
        }
    }

    /// Orders two slots by their records' scope, then id: ties in a ranking are broken so,
    /// never by slot (see [`MemoryTable::tiers`]), and without decoding either record.
    fn by_scope_and_id(&self, a: u32, b: u32) -> std::cmp::Ordering {
        let scope = |slot: u32| {
            let m = self.meta.get(slot as usize)?;
            self.scope_keys.get(m.scope as usize)
        };
        scope(a)
            .cmp(&scope(b))
            .then_with(|| self.records.id(a).cmp(&self.records.id(b)))
    }

    pub(crate) fn audit(
        &self,
        scope: &ScopeKey,
        id: Option<&MemoryId>,
        now: Timestamp,
    ) -> Vec<AuditEntry> {
        // Told by the slot's scope id: a whole scope's trail decodes none of its records.
        let scope_no = self.scope_ids.get(scope).copied();
        let in_scope = |slot: u32| {
            scope_no.is_some_and(|s| self.meta.get(slot as usize).is_some_and(|m| m.scope == s))
        };
        // One record: follow its chain (newest first), not the whole trail, and name each
        // version's text while it is known.
        // (item, its text when it changed — the first version or another text than the one
        // before — and whether it kept the text of the one before)
        let items: Vec<(&AuditItem, Option<String>, bool)> = match id {
            Some(id) => {
                let mut chain: Vec<(&AuditItem, Option<&str>)> = Vec::new();
                let slot = self.slot(scope, id);
                let mut at = slot
                    .and_then(|slot| self.last_audit.get(slot as usize).copied())
                    .unwrap_or(NO_AUDIT);
                let mut text: Option<&str> = slot
                    .and_then(|s| self.records.get(s))
                    .map(|r| r.content.as_str());
                while let Some(item) = self.audit.get(at as usize) {
                    match &item.text {
                        VersionText::Same => {}
                        VersionText::Kept(kept) => text = text.map(|_| &**kept),
                        // This and every older version's text is no longer known.
                        VersionText::Dropped => text = None,
                    }
                    chain.push((item, text));
                    at = item.prev;
                }
                chain.reverse();
                // Only a version that changed the text carries it: a record saved thousands
                // of times with one text costs one copy, not thousands.
                let mut before: Option<&str> = None;
                chain
                    .into_iter()
                    .map(|(item, text)| {
                        let same = text.is_some() && text == before;
                        before = text;
                        (item, text.filter(|_| !same).map(str::to_owned), same)
                    })
                    .collect()
            }
            None => self
                .audit
                .iter()
                .filter(|a| in_scope(a.slot))
                .map(|a| (a, None, false))
                .collect(),
        };
        let mut out: Vec<AuditEntry> = items
            .into_iter()
            .map(|(a, content, same_text)| AuditEntry {
                at: a.at,
                action: a.action,
                target: self.records.id(a.slot).unwrap_or_default().to_owned(),
                scope: scope.clone(),
                revision: Some(Revision::from_u128(a.revision)),
                source: self.sources.source(a.source),
                content,
                same_text,
            })
            .collect();
        let slots: Vec<u32> = match (id, scope_no) {
            (Some(id), _) => self.slot(scope, id).into_iter().collect(),
            (None, Some(s)) => self
                .slots
                .get(s as usize)
                .map(|slots| {
                    let mut slots: Vec<u32> = slots.iter().copied().collect();
                    slots.sort_unstable();
                    slots
                })
                .unwrap_or_default(),
            (None, None) => Vec::new(),
        };
        // Only an expired record is decoded (for its revision).
        let expired = slots
            .into_iter()
            .filter(|&slot| self.meta.get(slot as usize).is_some_and(|m| m.expired(now)))
            .filter_map(|slot| self.records.get(slot));
        for r in expired {
            {
                if let Some(at) = r.expires_at {
                    out.push(AuditEntry {
                        at,
                        action: AuditAction::Expired,
                        target: r.id.to_string(),
                        scope: r.scope.clone(),
                        revision: Some(r.revision.clone()),
                        source: MemorySource::system(),
                        content: None,
                        same_text: false,
                    });
                }
            }
        }
        out.sort_by_key(|a| a.at);
        out
    }
}

/// The hash a scope's lookup files a memory id under.
fn id_hash(id: &str) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one(id)
}

/// What a record is found by: its content, its tags and the day it was written (so "what
/// happened in May 2023" finds what was remembered then).
fn index_text(r: &MemoryRecord) -> String {
    let mut text = String::new();
    push_index_text(&mut text, r);
    text
}

/// [`index_text`], appended to `text`.
fn push_index_text(text: &mut String, r: &MemoryRecord) {
    text.push_str(&r.content);
    text.push(' ');
    text.push_str(&tavern_core::calendar::day_words(r.created_at.0));
    for t in &r.tags {
        text.push(' ');
        text.push_str(t.as_str());
    }
}

/// The smallest factor [`blend`] applies to relevance.
const BLEND_MIN: f32 = 0.7;

/// A match on its way to the page: ordered by `tier` first (0 but for a rescored search's
/// later tiers, see [`MemoryTable::tiers`]), then by `score`.
#[derive(Debug, Clone, Copy)]
struct Ranked {
    tier: u32,
    score: f64,
    relevance: f64,
    slot: u32,
}

impl Ranked {
    fn new(score: f64, relevance: f64, slot: u32) -> Self {
        Self {
            tier: 0,
            score,
            relevance,
            slot,
        }
    }
}

/// Relevance scaled by importance, confidence and recency (a factor from [`BLEND_MIN`] to 1);
/// relevance dominates so an unrelated but important record never outranks a clearly matching
/// one by much.
fn blend(relevance: f64, m: &Meta, now: Timestamp) -> f64 {
    let age_days = ((now.0 - m.updated_at.0).max(0) as f64) / DAY_MS;
    let recency = (-age_days / 30.0).exp2();
    // Clamped, so the factor stays within its bounds (search skips matches by them) even for
    // a record written before its values were checked.
    let unit = |x: f64| if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
    relevance
        * (f64::from(BLEND_MIN)
            + 0.15 * unit(m.importance)
            + 0.05 * unit(m.confidence)
            + 0.1 * recency)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tavern_core::{AgentId, MemoryKind, MemorySource};

    fn scope(i: usize) -> ScopeKey {
        ScopeKey::Agent {
            agent: AgentId::parse(format!("a{i}")).unwrap(),
        }
    }

    fn write(id: usize, scope_no: usize, expires: Option<i64>) -> MemoryWrite {
        MemoryWrite {
            id: MemoryId::parse(format!("m{id}")).unwrap(),
            scope: scope(scope_no),
            kind: MemoryKind::Semantic,
            content: format!("the silver gate {id}"),
            tags: Vec::new(),
            importance: 0.5,
            confidence: 0.5,
            source: MemorySource::system(),
            expires_at: expires.map(Timestamp),
        }
    }

    /// A query that names a time ("five days ago") lifts what was written then above a
    /// better word match from another day; without one, the better match wins.
    #[test]
    fn a_query_that_names_a_time_prefers_memories_written_then() {
        const DAY: i64 = 86_400_000;
        let now = 100 * DAY;
        let mut t = MemoryTable::new();
        for (id, content, at) in [
            (
                1,
                "tea at the harbour, green tea, jasmine tea",
                now - 20 * DAY,
            ),
            (
                2,
                "tea at the harbour, then a long walk home along the quiet grey road",
                now - 5 * DAY,
            ),
            (3, "a walk by the river", now - 5 * DAY),
        ] {
            let mut w = write(id, 0, None);
            w.content = content.to_owned();
            let (_, op) = t.prepare_put(w, None, false, Timestamp(at)).unwrap();
            t.apply(op);
        }
        let ids = |q: &str| -> Vec<String> {
            let hits = t
                .search(&MemoryQuery::new(q, vec![scope(0)]), Timestamp(now))
                .hits;
            hits.iter().map(|h| h.record.id.to_string()).collect()
        };
        assert_eq!(ids("what tea did I have at the harbour"), ["m1", "m2"]);
        assert_eq!(
            ids("what tea did I have at the harbour five days ago"),
            ["m2", "m1"]
        );
        assert_eq!(ids("我五天前在 harbour 喝了什么 tea"), ["m2", "m1"]);
        // Only matches are lifted: the walk shares no word and stays out.
        assert_eq!(ids("tea 5 days ago"), ["m2", "m1"]);
        // A match whose relevance is below the share of the best that blending alone could
        // lift (0.7) is not pruned before the time lift when one result is asked: it wins.
        let words = "harbour tea";
        let all = t
            .search(&MemoryQuery::new(words, vec![scope(0)]), Timestamp(now))
            .hits;
        assert_eq!(all[0].record.id.as_str(), "m1");
        assert!(
            all[1].relevance < all[0].relevance * f64::from(BLEND_MIN),
            "{all:?}"
        );
        let mut q = MemoryQuery::new(format!("{words} five days ago"), vec![scope(0)]);
        q.limit = 1;
        let hits = t.search(&q, Timestamp(now)).hits;
        assert_eq!(hits[0].record.id.as_str(), "m2");
    }

    /// A ranker that gives every candidate the same score: which candidates it is handed
    /// decides the page.
    #[derive(Debug)]
    struct Flat;

    impl tavern_search::Ranker for Flat {
        fn name(&self) -> &str {
            "flat"
        }
        fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
            for c in candidates {
                c.score = 1.0;
            }
        }
    }

    /// Tables holding the same memories loaded in different orders (as PostgreSQL stores
    /// held by scope load them) hand a ranker the same candidates when lexical scores tie at
    /// the edge of its pool.
    #[test]
    fn ties_at_the_edge_of_a_rankers_pool_do_not_depend_on_load_order() {
        let writes: Vec<MemoryWrite> = (0..12)
            .map(|i| {
                let mut w = write(i, i % 3, None);
                w.content = "the silver gate".to_owned();
                w
            })
            .collect();
        let load = |order: Vec<&MemoryWrite>| {
            let mut t = MemoryTable::new();
            for w in order {
                let (_, op) = t.prepare_put(w.clone(), None, false, Timestamp(1)).unwrap();
                t.apply(op);
            }
            t
        };
        let forward = load(writes.iter().collect());
        let backward = load(writes.iter().rev().collect());
        let mut q = MemoryQuery::new("silver gate", vec![]);
        q.limit = 4;
        q.ranker = tavern_search::RankerRef::new(Flat);
        let page = |t: &MemoryTable| {
            let hits = t.search(&q, Timestamp(2)).hits;
            hits.iter()
                .map(|h| format!("{}/{}", h.record.scope, h.record.id))
                .collect::<Vec<_>>()
        };
        assert_eq!(page(&forward).len(), 4);
        assert_eq!(page(&forward), page(&backward));
    }

    /// A table of `n` records in scope 0 whose texts match "silver gate" less well the longer
    /// they are: record `i` is `"silver gate"` and `moss_words(i)` words more, written at
    /// `written(i)`.
    fn growing(
        n: usize,
        moss_words: impl Fn(usize) -> usize,
        written: impl Fn(usize) -> i64,
    ) -> MemoryTable {
        let mut t = MemoryTable::new();
        for i in 0..n {
            let mut w = write(i, 0, None);
            w.content = format!("silver gate {}", "moss ".repeat(moss_words(i)));
            let (_, op) = t
                .prepare_put(w, None, false, Timestamp(written(i)))
                .unwrap();
            t.apply(op);
        }
        t
    }

    /// A ranker that keeps the lexical order on a scale of its own, far below BM25's (as a
    /// blend of shares can be below a long tail's raw scores).
    #[derive(Debug)]
    struct Share;

    impl tavern_search::Ranker for Share {
        fn name(&self) -> &str {
            "share"
        }
        fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
            let best = candidates.iter().map(|c| c.score).fold(0f32, f32::max);
            for c in candidates {
                c.score = c.score / best * 1e-9;
            }
        }
    }

    /// A ranker that keeps the lexical order and drops every seventh candidate it is handed.
    #[derive(Debug)]
    struct Dropper;

    impl tavern_search::Ranker for Dropper {
        fn name(&self) -> &str {
            "dropper"
        }
        fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
            for (i, c) in candidates.iter_mut().enumerate() {
                if i % 7 == 3 {
                    c.score = 0.0;
                }
            }
        }
    }

    /// Every page of a rescored search goes on where the one before stopped, whatever the page
    /// size and however the pages are asked for, though the blend reorders what the ranker
    /// ranked: here the best matches by relevance are old and the next ones new, which the
    /// blend (weighing recency) lifts over them. A single pool as large as the page reaches
    /// (100 for page 1, 200 for page 2) showed old records again on page 2 and never showed
    /// some new ones. Also: equal relevance across the first tier's edge, a forgotten record
    /// (the filtered path), a query that names a time, and a ranker that drops candidates
    /// (pages asked at fixed offsets then still meet).
    #[test]
    fn pages_of_a_rescored_search_never_repeat_or_skip_a_record() {
        const DAY: i64 = 86_400_000;
        let now = 400 * DAY;
        let n = 250;
        // Every record its own relevance, but for ten of the same length around the 100th.
        let mut t = growing(
            n,
            |i| if (95..105).contains(&i) { 195 } else { 100 + i },
            |i| now - if i < 100 { 300 } else { 3 * (i as i64 % 2) } * DAY,
        );
        let forgotten = t
            .get(&scope(0), &MemoryId::parse("m150").unwrap())
            .unwrap()
            .clone();
        let (_, op) = t
            .prepare_forget(
                &forgotten.id,
                &forgotten.scope,
                &forgotten.revision,
                MemorySource::system(),
                Timestamp(now),
            )
            .unwrap();
        t.apply(op);
        let rankers = [
            tavern_search::RankerRef::new(Share),
            tavern_search::RankerRef::new(Dropper),
        ];
        for ranker in rankers {
            for text in ["silver gate", "silver gate three days ago"] {
                let mut q = MemoryQuery::new(text, vec![scope(0)]);
                q.ranker = ranker.clone();
                // Pages asked where the last one stopped, their sizes cycling through `sizes`;
                // or, `fixed`, at offsets that are multiples of the page size.
                let pages = |sizes: &[usize], fixed: bool| {
                    let mut q = q.clone();
                    let mut shown = Vec::new();
                    for page in 0.. {
                        q.limit = sizes[page % sizes.len()];
                        q.offset = if fixed { page * q.limit } else { shown.len() };
                        let found = t.search(&q, Timestamp(now));
                        if found.hits.is_empty() {
                            assert!(!found.truncated, "{text:?}: an empty page says more follow");
                            break;
                        }
                        shown.extend(found.hits.into_iter().map(|h| h.record.id));
                    }
                    shown
                };
                let reference = pages(&[100], false);
                let distinct: std::collections::HashSet<_> = reference.iter().collect();
                assert_eq!(distinct.len(), reference.len(), "{text:?}: a record twice");
                assert!(
                    !distinct.contains(&forgotten.id),
                    "{text:?}: a forgotten record"
                );
                let dropped = if ranker.get().name() == "dropper" {
                    35
                } else {
                    0
                };
                assert_eq!(reference.len(), n - 1 - dropped, "{text:?}");
                for sizes in [&[1][..], &[7], &[30], &[30, 7, 1, 100, 13]] {
                    assert_eq!(
                        pages(sizes, false),
                        reference,
                        "{text:?}, pages of {sizes:?}"
                    );
                }
                for size in [7, 20, 100] {
                    assert_eq!(
                        pages(&[size], true),
                        reference,
                        "{text:?}, fixed pages of {size}"
                    );
                }
            }
        }
    }

    /// With a ranker, a query that names a time still brings what was written then to the
    /// first page, as it does without one, even when a hundred better word matches from
    /// other days come first by relevance alone (tiers follow relevance times the boost).
    #[test]
    fn a_ranked_query_that_names_a_time_reaches_past_the_first_hundred() {
        const DAY: i64 = 86_400_000;
        let now = 100 * DAY;
        let t = growing(300, |i| i, |i| now - if i >= 200 { 3 } else { 40 } * DAY);
        for ranker in [
            tavern_search::RankerRef::default(),
            tavern_search::RankerRef::new(Share),
        ] {
            let mut q = MemoryQuery::new("silver gate three days ago", vec![scope(0)]);
            q.ranker = ranker.clone();
            q.limit = 10;
            let hits = t.search(&q, Timestamp(now)).hits;
            assert_eq!(hits.len(), 10);
            for h in &hits {
                assert_eq!(
                    h.record.created_at,
                    Timestamp(now - 3 * DAY),
                    "{}: {} from another day",
                    ranker.get().name(),
                    h.record.id
                );
            }
        }
    }

    /// A ranker whose scores fall off a cliff: the first candidate it is handed 1, the rest
    /// almost nothing (positive, finite).
    #[derive(Debug)]
    struct Cliff;

    impl tavern_search::Ranker for Cliff {
        fn name(&self) -> &str {
            "cliff"
        }
        fn rescore(&self, _query: &str, candidates: &mut [Candidate<'_>]) {
            for (i, c) in candidates.iter_mut().enumerate() {
                c.score = if i == 0 { 1.0 } else { 1e-38 };
            }
        }
    }

    /// Tiers far down keep their order when their scaled scores reach the least positive
    /// number and tie (and a tie would otherwise be broken by the newest first, which here
    /// is the reverse of the tiers' order).
    #[test]
    fn tiers_stay_in_order_when_their_scores_bottom_out() {
        let now = 1_000_000;
        let n = 1_000;
        let t = growing(n, |i| i, |i| now - 1_000 + i as i64);
        let mut q = MemoryQuery::new("silver gate", vec![scope(0)]);
        q.ranker = tavern_search::RankerRef::new(Cliff);
        q.limit = 100;
        let (mut shown, mut scores) = (Vec::new(), Vec::new());
        loop {
            q.offset = shown.len();
            let hits = t.search(&q, Timestamp(now)).hits;
            if hits.is_empty() {
                break;
            }
            scores.extend(hits.iter().map(|h| h.score));
            shown.extend(hits.into_iter().map(|h| h.record.id));
        }
        let distinct: std::collections::HashSet<_> = shown.iter().collect();
        assert_eq!((shown.len(), distinct.len()), (n, n));
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "scores rise");
        assert_eq!(
            scores.last(),
            Some(&f64::MIN_POSITIVE),
            "the scores bottomed out"
        );
    }

    /// Pages past the ranker's [`tavern_search::rank::POOL_MAX`] candidates go on where the
    /// ones before stopped: the tiers past it (not rescored) follow those it rescored, with
    /// or without a query that names the time some were written (which forms the tiers by
    /// relevance times the boost).
    #[test]
    fn pages_past_the_rankers_pool_go_on_in_order() {
        const DAY: i64 = 86_400_000;
        let now = 100 * DAY;
        let n = tavern_search::rank::POOL_MAX + 200;
        // Those past the pool written five days ago, the rest before (so that the blend,
        // which weighs recency, keeps the order within each part).
        let past = |i| i >= tavern_search::rank::POOL_MAX;
        let t = growing(n, |i| i, |i| now - if past(i) { 5 } else { 20 } * DAY);
        for text in ["silver gate", "silver gate five days ago"] {
            let mut seen = std::collections::HashSet::new();
            for offset in (0..n).step_by(100) {
                let mut q = MemoryQuery::new(text, vec![scope(0)]);
                (q.limit, q.offset) = (100, offset);
                q.ranker = tavern_search::RankerRef::new(Share);
                let hits = t.search(&q, Timestamp(now)).hits;
                assert_eq!(hits.len(), 100, "{text:?} offset {offset}");
                for h in hits {
                    assert!(
                        seen.insert(h.record.id.clone()),
                        "{text:?}: {} twice",
                        h.record.id
                    );
                }
            }
            assert_eq!(seen.len(), n);
        }
    }

    proptest! {
        /// Whatever is written, forgotten, restored, given or cleared of an expiry, a search
        /// finds exactly the records a per-record check finds (the per-scope counters that let
        /// common searches skip that check never drift).
        #[test]
        fn searches_skip_checks_only_when_nothing_is_hidden(
            ops in prop::collection::vec((0usize..6, 0usize..2, 0u8..4, prop::option::of(0i64..20)), 1..40),
            now in 0i64..20,
        ) {
            let mut t = MemoryTable::new();
            for (id, sc, action, expires) in ops {
                let current = t.get(&scope(sc), &MemoryId::parse(format!("m{id}")).unwrap()).cloned();
                // Two texts, so that puts over a record edit it.
                let mut w = write(id, sc, expires);
                w.content.push_str(if action == 0 { " by the river" } else { " lantern" });
                let prepared = match (action, current) {
                    (0 | 1, None) => t.prepare_put(w, None, false, Timestamp(1)),
                    (0 | 1, Some(cur)) => t.prepare_put(w, Some(&cur.revision), true, Timestamp(1)),
                    (2, Some(cur)) if cur.deleted_at.is_none() => t.prepare_forget(
                        &cur.id, &cur.scope, &cur.revision, MemorySource::system(), Timestamp(1)),
                    _ => continue,
                };
                if let Ok((_, op)) = prepared {
                    t.apply(op);
                }
            }
            for sc in 0..2 {
                let q = MemoryQuery::new("silver gate", vec![scope(sc)]);
                let mut q = q;
                q.limit = 50;
                let got: Vec<String> = t.search(&q, Timestamp(now)).hits.iter().map(|h| h.record.id.to_string()).collect();
                let mut want: Vec<String> = t.records.iter().map(|(_, r)| r).filter(|r| r.scope == scope(sc) && r.deleted_at.is_none() && r.expires_at.is_none_or(|e| e.0 > now)).map(|r| r.id.to_string()).collect();
                let mut got_sorted = got.clone();
                got_sorted.sort();
                want.sort();
                prop_assert_eq!(got_sorted, want);
                // One record's history (read through its chain) is the scope's trail
                // filtered to it.
                let whole = t.audit(&scope(sc), None, Timestamp(now));
                for id in 0..6 {
                    let id = MemoryId::parse(format!("m{id}")).unwrap();
                    let want: Vec<_> = whole.iter().filter(|a| a.target == id.as_str()).cloned().collect();
                    let mut one = t.audit(&scope(sc), Some(&id), Timestamp(now));
                    // The one-record trail adds the texts: followed version by version, the
                    // newest is the record's own.
                    let mut text: Option<&str> = None;
                    for a in one.iter().filter(|a| a.action != AuditAction::Expired) {
                        if !a.same_text {
                            text = a.content.as_deref();
                        }
                    }
                    if let (false, Some(r)) = (one.is_empty(), t.get(&scope(sc), &id)) {
                        prop_assert_eq!(text, Some(r.content.as_str()));
                    }
                    for a in &mut one {
                        a.content = None;
                        a.same_text = false;
                    }
                    prop_assert_eq!(one, want);
                }
                let Some(&id) = t.scope_ids.get(&scope(sc)) else { continue };
                let counted = t.maybe_hidden[id as usize] as usize;
                let actual = t.meta.iter().filter(|m| m.scope == id && m.maybe_hidden()).count();
                prop_assert_eq!(counted, actual);
            }
            // Edits and forgets took their old postings out of the index.
            prop_assert!(!t.index.has_stale_postings());
            for (slot, m) in t.meta.iter().enumerate() {
                prop_assert_eq!(t.maybe_hidden_slot(slot as u32), m.maybe_hidden(), "slot {}", slot);
            }
        }
    }
}
