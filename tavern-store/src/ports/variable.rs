//! The variable port: exact typed values per scope with per-variable and per-scope revisions.

use async_trait::async_trait;
use serde_json::Value;
use tavern_core::{AuditEntry, MemorySource, Revision, ScopeKey, VariableName, VariableRecord};

use crate::error::StoreError;

/// One change of an atomic patch.
#[derive(Debug, Clone, PartialEq)]
pub enum VariableChange {
    /// Set a value; `expected` as in [`VariableStore::set`].
    Set {
        /// The variable.
        name: VariableName,
        /// The new value.
        value: Value,
        /// The variable's current revision, or `None` to create it.
        expected: Option<Revision>,
    },
    /// Delete a variable at its current revision.
    Delete {
        /// The variable.
        name: VariableName,
        /// Its current revision.
        expected: Revision,
    },
}

/// A live variable.
pub type VariableEntry = VariableRecord;

/// A short description of a variable for listings.
#[derive(Debug, Clone, PartialEq)]
pub struct VariableSummary {
    /// Name.
    pub name: VariableName,
    /// JSON type: `string`, `number`, `boolean`, `array`, `object`, `null`.
    pub kind: &'static str,
    /// Up to 80 characters of the compact JSON value, `…` when cut.
    pub preview: String,
    /// Size of the compact JSON value.
    pub bytes: usize,
    /// Current revision.
    pub revision: Revision,
}

/// A listing of one scope.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VariableListing {
    /// The scope's revision (changes with every write in the scope); `None` if never written.
    pub scope_revision: Option<Revision>,
    /// Matching variables by name.
    pub items: Vec<VariableSummary>,
    /// How many matched before `limit`.
    pub total: usize,
    /// Whether `limit` cut the listing.
    pub truncated: bool,
}

/// The outcome of an atomic patch.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchOutcome {
    /// The scope's revision after the patch.
    pub scope_revision: Revision,
    /// The records written (tombstones for deletes), in change order.
    pub records: Vec<VariableRecord>,
}

/// Durable, scoped variables.
///
/// Revisions chain per variable (A→B→A gets a fresh revision; deleting leaves a tombstone so a
/// re-created variable never revives an old revision). Every change is audited.
#[async_trait]
pub trait VariableStore: Send + Sync {
    /// A live variable.
    ///
    /// # Errors
    /// IO failures only.
    async fn get(
        &self,
        scope: &ScopeKey,
        name: &VariableName,
    ) -> Result<Option<VariableRecord>, StoreError>;

    /// Sets a variable: `expected = None` creates (conflict if it exists), otherwise it must be
    /// the current revision. Provided as a one-change [`VariableStore::patch`].
    ///
    /// # Errors
    /// [`StoreError::Conflict`] with the current revision; [`StoreError::Invalid`] for a value
    /// over its limits or a scope over its total.
    async fn set(
        &self,
        scope: &ScopeKey,
        name: &VariableName,
        value: Value,
        expected: Option<&Revision>,
        source: MemorySource,
    ) -> Result<VariableRecord, StoreError> {
        let change = VariableChange::Set {
            name: name.clone(),
            value,
            expected: expected.cloned(),
        };
        let out = self.patch(scope, &[change], None, source).await?;
        out.records
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Internal("a one-change patch wrote no record".into()))
    }

    /// Applies several changes to one scope atomically: all or nothing. `expected_scope`, when
    /// given, must equal the scope's current revision; each change is also checked on its own.
    ///
    /// # Errors
    /// The first failing check ([`StoreError::Conflict`] naming the variable or scope,
    /// [`StoreError::Invalid`]); nothing is written then.
    async fn patch(
        &self,
        scope: &ScopeKey,
        changes: &[VariableChange],
        expected_scope: Option<&Revision>,
        source: MemorySource,
    ) -> Result<PatchOutcome, StoreError>;

    /// Deletes a variable at its current revision (leaving an audited tombstone). Provided as a
    /// one-change [`VariableStore::patch`].
    ///
    /// # Errors
    /// [`StoreError::NotFound`] if absent, [`StoreError::Conflict`] for a stale revision.
    async fn delete(
        &self,
        scope: &ScopeKey,
        name: &VariableName,
        expected: &Revision,
        source: MemorySource,
    ) -> Result<(), StoreError> {
        let change = VariableChange::Delete {
            name: name.clone(),
            expected: expected.clone(),
        };
        self.patch(scope, &[change], None, source).await.map(|_| ())
    }

    /// Lists live variables whose names start with `prefix`, by name, at most `limit`.
    ///
    /// # Errors
    /// IO failures only.
    async fn list(
        &self,
        scope: &ScopeKey,
        prefix: &str,
        limit: usize,
    ) -> Result<VariableListing, StoreError>;

    /// Deletes every live variable of a scope (turn end); returns how many.
    ///
    /// # Errors
    /// IO failures only.
    async fn clear_scope(
        &self,
        scope: &ScopeKey,
        source: MemorySource,
    ) -> Result<usize, StoreError>;

    /// The audit trail of a scope, oldest first.
    ///
    /// # Errors
    /// IO failures only.
    async fn variable_audit(&self, scope: &ScopeKey) -> Result<Vec<AuditEntry>, StoreError>;
}
