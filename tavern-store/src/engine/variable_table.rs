//! The variable table: per-scope variables (with tombstones), scope revisions and audit.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tavern_core::record::{check_scope_bytes, json_size};
use tavern_core::{
    AuditAction, AuditEntry, MemorySource, Revision, ScopeKey, Timestamp, VariableName,
    VariableRecord,
};

use crate::error::{StoreError, Target};
use crate::variable::{PatchOutcome, VariableChange, VariableListing, VariableSummary};

/// Most changes in one patch.
pub(crate) const PATCH_MAX_CHANGES: usize = 64;
/// Hard cap on a listing.
pub(crate) const LIST_MAX_LIMIT: usize = 200;

/// One durable change to one scope (a log line in the file adapter): all records written by
/// one set/patch/delete/clear, so a patch is one atomic line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VariableOp {
    pub(crate) scope: ScopeKey,
    pub(crate) records: Vec<VariableRecord>,
    pub(crate) scope_revision: Revision,
    pub(crate) audit: Vec<AuditEntry>,
}

#[derive(Debug, Default, Clone)]
struct ScopeVars {
    vars: BTreeMap<VariableName, VariableRecord>,
    revision: Option<Revision>,
    audit: Vec<AuditEntry>,
}

impl ScopeVars {
    fn live(&self, name: &VariableName) -> Option<&VariableRecord> {
        self.vars.get(name).filter(|r| r.is_live())
    }

    fn bytes(&self) -> usize {
        self.vars.values().map(VariableRecord::scope_bytes).sum()
    }
}

#[derive(Debug, Default)]
pub(crate) struct VariableTable {
    scopes: BTreeMap<ScopeKey, ScopeVars>,
}

fn var_target(scope: &ScopeKey, name: &VariableName) -> Box<Target> {
    Box::new(Target::Variable {
        scope: scope.clone(),
        name: name.clone(),
    })
}

impl VariableTable {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn get(&self, scope: &ScopeKey, name: &VariableName) -> Option<&VariableRecord> {
        self.scopes.get(scope).and_then(|s| s.live(name))
    }

    /// Checks every change against one snapshot of the scope and produces the op, or the first
    /// failure. Nothing is mutated.
    pub(crate) fn prepare_patch(
        &self,
        scope: &ScopeKey,
        changes: &[VariableChange],
        expected_scope: Option<&Revision>,
        source: &MemorySource,
        now: Timestamp,
    ) -> Result<VariableOp, StoreError> {
        if changes.is_empty() {
            return Err(StoreError::LimitExceeded {
                limit: "patch changes (at least one)",
                max: PATCH_MAX_CHANGES,
                actual: 0,
            });
        }
        if changes.len() > PATCH_MAX_CHANGES {
            return Err(StoreError::LimitExceeded {
                limit: "patch changes",
                max: PATCH_MAX_CHANGES,
                actual: changes.len(),
            });
        }
        let empty = ScopeVars::default();
        let current = self.scopes.get(scope).unwrap_or(&empty);
        if let Some(exp) = expected_scope {
            if current.revision.as_ref() != Some(exp) {
                return Err(StoreError::Conflict {
                    target: Box::new(Target::VariableScope(scope.clone())),
                    current: current.revision.clone(),
                });
            }
        }
        let mut next = current.clone();
        let mut seen = HashSet::new();
        let mut records = Vec::with_capacity(changes.len());
        let mut audit = Vec::with_capacity(changes.len());
        for change in changes {
            let name = match change {
                VariableChange::Set { name, .. } | VariableChange::Delete { name, .. } => name,
            };
            if !seen.insert(name.clone()) {
                return Err(StoreError::Invalid(tavern_core::CoreError::InvalidField {
                    field: "changes",
                    reason: format!("variable {name} appears twice in one patch"),
                }));
            }
            let live = current.live(name);
            let conflict = || StoreError::Conflict {
                target: var_target(scope, name),
                current: live.map(|r| r.revision.clone()),
            };
            let record = match change {
                VariableChange::Set {
                    value, expected, ..
                } => {
                    if live.map(|r| &r.revision) != expected.as_ref() {
                        return Err(conflict());
                    }
                    let previous = current.vars.get(name);
                    VariableRecord::next(scope.clone(), name.clone(), value.clone(), previous, now)?
                }
                VariableChange::Delete { expected, .. } => match live {
                    None => {
                        return Err(StoreError::NotFound {
                            target: var_target(scope, name),
                        })
                    }
                    Some(r) if &r.revision != expected => return Err(conflict()),
                    Some(r) => r.deleted(now),
                },
            };
            audit.push(AuditEntry {
                at: now,
                action: if record.is_live() {
                    AuditAction::Set
                } else {
                    AuditAction::Deleted
                },
                target: name.to_string(),
                scope: scope.clone(),
                revision: Some(record.revision.clone()),
                source: source.clone(),
                content: None,
                same_text: false,
            });
            next.vars.insert(name.clone(), record.clone());
            records.push(record);
        }
        check_scope_bytes(next.bytes())?;
        Ok(VariableOp {
            scope: scope.clone(),
            scope_revision: scope_revision(current.revision.as_ref(), &records),
            records,
            audit,
        })
    }

    /// The op that tombstones every live variable of a scope, or `None` if there are none.
    pub(crate) fn prepare_clear(
        &self,
        scope: &ScopeKey,
        source: &MemorySource,
        now: Timestamp,
    ) -> Option<VariableOp> {
        let current = self.scopes.get(scope)?;
        let records: Vec<VariableRecord> = current
            .vars
            .values()
            .filter(|r| r.is_live())
            .map(|r| r.deleted(now))
            .collect();
        if records.is_empty() {
            return None;
        }
        let audit = vec![AuditEntry {
            at: now,
            action: AuditAction::Cleared,
            target: format!("{} variables", records.len()),
            scope: scope.clone(),
            revision: None,
            source: source.clone(),
            content: None,
            same_text: false,
        }];
        Some(VariableOp {
            scope: scope.clone(),
            scope_revision: scope_revision(current.revision.as_ref(), &records),
            records,
            audit,
        })
    }

    pub(crate) fn apply(&mut self, op: VariableOp) {
        let scope = self.scopes.entry(op.scope).or_default();
        for r in op.records {
            scope.vars.insert(r.name.clone(), r);
        }
        scope.revision = Some(op.scope_revision);
        scope.audit.extend(op.audit);
    }

    /// How many scopes have ever been written.
    pub(crate) fn scope_count(&self) -> usize {
        self.scopes.len()
    }

    /// The whole table as one operation per scope (for log compaction): every variable with
    /// its tombstones, the scope revision and the audit trail.
    pub(crate) fn snapshot(&self) -> Vec<VariableOp> {
        self.scopes
            .iter()
            .filter_map(|(scope, vars)| {
                Some(VariableOp {
                    scope: scope.clone(),
                    records: vars.vars.values().cloned().collect(),
                    scope_revision: vars.revision.clone()?,
                    audit: vars.audit.clone(),
                })
            })
            .collect()
    }

    pub(crate) fn outcome(op: &VariableOp) -> PatchOutcome {
        PatchOutcome {
            scope_revision: op.scope_revision.clone(),
            records: op.records.clone(),
        }
    }

    pub(crate) fn list(&self, scope: &ScopeKey, prefix: &str, limit: usize) -> VariableListing {
        let Some(vars) = self.scopes.get(scope) else {
            return VariableListing::default();
        };
        let matching: Vec<&VariableRecord> = vars
            .vars
            .values()
            .filter(|r| r.is_live() && r.name.as_str().starts_with(prefix))
            .collect();
        let limit = limit.clamp(1, LIST_MAX_LIMIT);
        VariableListing {
            scope_revision: vars.revision.clone(),
            total: matching.len(),
            truncated: matching.len() > limit,
            items: matching.into_iter().take(limit).map(summary).collect(),
        }
    }

    pub(crate) fn audit(&self, scope: &ScopeKey) -> Vec<AuditEntry> {
        self.scopes
            .get(scope)
            .map(|s| s.audit.clone())
            .unwrap_or_default()
    }
}

fn scope_revision(previous: Option<&Revision>, records: &[VariableRecord]) -> Revision {
    let revs: Vec<&str> = records.iter().map(|r| r.revision.as_str()).collect();
    Revision::compute("variable-scope", previous, &json!(revs))
}

fn summary(r: &VariableRecord) -> VariableSummary {
    let text = serde_json::to_string(&r.value).unwrap_or_default();
    let preview = if text.chars().count() > 80 {
        let mut p: String = text.chars().take(79).collect();
        p.push('…');
        p
    } else {
        text
    };
    VariableSummary {
        name: r.name.clone(),
        kind: match &r.value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        },
        preview,
        bytes: json_size(&r.value),
        revision: r.revision.clone(),
    }
}
