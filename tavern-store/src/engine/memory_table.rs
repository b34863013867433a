//! The memory table: records by `(scope, id)`, their audit trail and the search index.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tavern_core::{
    AuditAction, AuditEntry, DefaultTokenEstimator, MemoryId, MemoryRecord, MemorySource,
    MemoryWrite, Revision, ScopeKey, Timestamp, TokenEstimator,
};

use crate::error::StoreError;
use crate::memory::{MemoryHit, MemoryQuery, MemorySearchResult, TagMatch};
use crate::search::{query_tokens, Bm25Index};

/// Hard cap on hits per search, whatever the caller asks.
pub(crate) const SEARCH_MAX_LIMIT: usize = 100;
/// Tokens counted per hit on top of its content (id, scores, source).
const HIT_OVERHEAD_TOKENS: usize = 16;
const DAY_MS: f64 = 86_400_000.0;

/// One durable change to the memory table (a log line in the file adapter).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub(crate) enum MemoryOp {
    /// A new version of a record with its audit entry.
    Put {
        record: Box<MemoryRecord>,
        audit: AuditEntry,
    },
    /// A read access (does not change the revision).
    Touch {
        scope: ScopeKey,
        id: MemoryId,
        at: Timestamp,
    },
}

#[derive(Debug, Default)]
pub(crate) struct MemoryTable {
    records: Vec<MemoryRecord>,
    slots: HashMap<(ScopeKey, MemoryId), u32>,
    audit: Vec<AuditEntry>,
    index: Bm25Index,
}

fn target(id: &MemoryId) -> String {
    format!("memory {id}")
}

impl MemoryTable {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    fn get(&self, scope: &ScopeKey, id: &MemoryId) -> Option<&MemoryRecord> {
        self.slots
            .get(&(scope.clone(), id.clone()))
            .map(|s| &self.records[*s as usize])
    }

    pub(crate) fn read_live(
        &self,
        scope: &ScopeKey,
        id: &MemoryId,
        now: Timestamp,
    ) -> Option<&MemoryRecord> {
        self.get(scope, id).filter(|r| r.is_live(now))
    }

    pub(crate) fn prepare_put(
        &self,
        write: MemoryWrite,
        expected: Option<&Revision>,
        restore: bool,
        now: Timestamp,
    ) -> Result<MemoryOp, StoreError> {
        write.validate()?;
        let current = self.get(&write.scope, &write.id);
        let conflict = |current: Option<&MemoryRecord>| StoreError::Conflict {
            target: target(&write.id),
            current: current.map(|r| r.revision.clone()),
        };
        let (record, action) = match (current, expected) {
            (None, None) => (
                MemoryRecord::create(write.clone(), now)?,
                AuditAction::Created,
            ),
            (None, Some(_)) | (Some(_), None) => return Err(conflict(current)),
            (Some(cur), Some(exp)) if &cur.revision != exp => return Err(conflict(current)),
            (Some(cur), Some(_)) => {
                if cur.deleted_at.is_some() && !restore {
                    return Err(StoreError::Forgotten {
                        id: cur.id.to_string(),
                    });
                }
                let action = if cur.deleted_at.is_some() {
                    AuditAction::Restored
                } else {
                    AuditAction::Updated
                };
                (cur.updated(write.clone(), now)?, action)
            }
        };
        let audit = AuditEntry {
            at: now,
            action,
            target: record.id.to_string(),
            scope: record.scope.clone(),
            revision: Some(record.revision.clone()),
            source: record.source.clone(),
        };
        Ok(MemoryOp::Put {
            record: Box::new(record),
            audit,
        })
    }

    pub(crate) fn prepare_forget(
        &self,
        id: &MemoryId,
        scope: &ScopeKey,
        expected: &Revision,
        source: MemorySource,
        now: Timestamp,
    ) -> Result<MemoryOp, StoreError> {
        let Some(cur) = self.get(scope, id).filter(|r| r.deleted_at.is_none()) else {
            return Err(StoreError::NotFound { target: target(id) });
        };
        if &cur.revision != expected {
            return Err(StoreError::Conflict {
                target: target(id),
                current: Some(cur.revision.clone()),
            });
        }
        let record = cur.forgotten(source.clone(), now);
        let audit = AuditEntry {
            at: now,
            action: AuditAction::Forgotten,
            target: id.to_string(),
            scope: scope.clone(),
            revision: Some(record.revision.clone()),
            source,
        };
        Ok(MemoryOp::Put {
            record: Box::new(record),
            audit,
        })
    }

    /// Applies an operation; replaying the same log twice from empty yields the same table.
    pub(crate) fn apply(&mut self, op: MemoryOp) {
        match op {
            MemoryOp::Put { record, audit } => {
                let key = (record.scope.clone(), record.id.clone());
                let text = index_text(&record);
                let slot = match self.slots.get(&key) {
                    Some(slot) => {
                        let mut record = *record;
                        // Access times survive content updates.
                        record.last_accessed_at = record
                            .last_accessed_at
                            .max(self.records[*slot as usize].last_accessed_at);
                        self.records[*slot as usize] = record;
                        *slot
                    }
                    None => {
                        let slot = u32::try_from(self.records.len()).unwrap_or(u32::MAX);
                        self.records.push(*record);
                        self.slots.insert(key, slot);
                        slot
                    }
                };
                self.index.insert(slot, &text);
                self.audit.push(audit);
            }
            MemoryOp::Touch { scope, id, at } => {
                if let Some(slot) = self.slots.get(&(scope, id)) {
                    let rec = &mut self.records[*slot as usize];
                    rec.last_accessed_at = Some(rec.last_accessed_at.map_or(at, |t| t.max(at)));
                }
            }
        }
    }

    pub(crate) fn search(&self, q: &MemoryQuery, now: Timestamp) -> MemorySearchResult {
        let estimator = DefaultTokenEstimator;
        let visible = |r: &MemoryRecord| {
            (q.include_deleted || r.deleted_at.is_none())
                && (q.include_expired || !r.is_expired(now))
                && (q.scopes.is_empty() || q.scopes.contains(&r.scope))
                && (q.kinds.is_empty() || q.kinds.contains(&r.kind))
                && q.updated_from.is_none_or(|t| r.updated_at >= t)
                && q.updated_to.is_none_or(|t| r.updated_at <= t)
                && (q.tags.is_empty()
                    || match q.tag_match {
                        TagMatch::Any => q.tags.iter().any(|t| r.tags.contains(t)),
                        TagMatch::All => q.tags.iter().all(|t| r.tags.contains(t)),
                    })
        };
        let mut hits: Vec<(f64, f64, &MemoryRecord)> = if q.text.trim().is_empty() {
            self.records
                .iter()
                .filter(|r| visible(r))
                .map(|r| (0.0, 0.0, r))
                .collect()
        } else {
            self.index
                .score(&query_tokens(&q.text))
                .into_iter()
                .map(|(slot, rel)| (&self.records[slot as usize], f64::from(rel)))
                .filter(|(r, _)| visible(r))
                .map(|(r, rel)| (blend(rel, r, now), rel, r))
                .collect()
        };
        hits.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then(b.2.updated_at.cmp(&a.2.updated_at))
                .then_with(|| a.2.scope.cmp(&b.2.scope))
                .then_with(|| a.2.id.cmp(&b.2.id))
        });
        let source_count = hits.len();
        let limit = q.limit.clamp(1, SEARCH_MAX_LIMIT);
        let mut out = MemorySearchResult {
            source_count,
            ..Default::default()
        };
        let mut used = 0usize;
        for (score, relevance, r) in hits {
            if out.hits.len() == limit {
                out.truncated = true;
                out.truncated_by = Some("limit");
                break;
            }
            let tokens = estimator.estimate(&r.content) + HIT_OVERHEAD_TOKENS;
            if let Some(budget) = q.max_tokens {
                if used + tokens > budget {
                    out.truncated = true;
                    out.truncated_by = Some("max-tokens");
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
        out
    }

    pub(crate) fn audit(
        &self,
        scope: &ScopeKey,
        id: Option<&MemoryId>,
        now: Timestamp,
    ) -> Vec<AuditEntry> {
        let mut out: Vec<AuditEntry> = self
            .audit
            .iter()
            .filter(|a| &a.scope == scope && id.is_none_or(|id| a.target == id.as_str()))
            .cloned()
            .collect();
        for r in &self.records {
            if &r.scope == scope && id.is_none_or(|id| &r.id == id) && r.is_expired(now) {
                if let Some(at) = r.expires_at {
                    out.push(AuditEntry {
                        at,
                        action: AuditAction::Expired,
                        target: r.id.to_string(),
                        scope: r.scope.clone(),
                        revision: Some(r.revision.clone()),
                        source: MemorySource::system(),
                    });
                }
            }
        }
        out.sort_by_key(|a| a.at);
        out
    }
}

fn index_text(r: &MemoryRecord) -> String {
    let mut text = r.content.clone();
    for t in &r.tags {
        text.push(' ');
        text.push_str(t.as_str());
    }
    text
}

/// Relevance scaled by importance, confidence and recency; relevance dominates so an unrelated
/// but important record never outranks a clearly matching one by much.
fn blend(relevance: f64, r: &MemoryRecord, now: Timestamp) -> f64 {
    let age_days = ((now.0 - r.updated_at.0).max(0) as f64) / DAY_MS;
    let recency = 0.5f64.powf(age_days / 30.0);
    relevance * (0.7 + 0.15 * r.importance + 0.05 * r.confidence + 0.1 * recency)
}
