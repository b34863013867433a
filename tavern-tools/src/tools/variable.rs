//! `variable_get`, `variable_set`, `variable_patch`, `variable_delete`, `variable_list`.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tavern_core::{VariableName, VariableRecord};
use tavern_store::VariableChange;

use super::{any_value, check_write, revision, AnyScope, RevisionArg};
use crate::context::ToolContext;
use crate::error::ToolError;
use crate::registry::ToolServices;
use crate::tool::TypedTool;

// What a variable name may be is `VariableName`'s rule: letters of any script (Unicode
// `Alphabetic`, so Hindi or Thai names with their vowel signs work), digits, `_`, `.`, `-`,
// starting with a letter or `_`, at most 64 characters. The schemas say it in words and bound
// the length; they carry no `pattern`, because the rule needs `\p{…}`, which Python's `re`
// (what the official Python SDK's validator uses) and other engines refuse, breaking every
// call on the client. The server checks the full rule and names it in the error.

// --- argument types ------------------------------------------------------------------------

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct GetArgs {
    /// Variable name: letters (any script), digits, '_', '.', '-'; starts with a letter or
    /// '_' (e.g. hp, basic.好感度).
    #[schemars(length(min = 1, max = 64))]
    name: String,
    /// Scope kind (default chat); the session decides which chat and character it means.
    #[serde(default)]
    scope: AnyScope,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SetArgs {
    /// Variable name: letters (any script), digits, '_', '.', '-'; starts with a letter or
    /// '_' (e.g. hp, basic.好感度).
    #[schemars(length(min = 1, max = 64))]
    name: String,
    /// Any JSON value: string, finite number, boolean, array, object or null (at most 32 KiB).
    #[schemars(schema_with = "any_value")]
    value: Value,
    /// Scope kind (default chat); the session decides which chat and character it means.
    #[serde(default)]
    scope: AnyScope,
    /// The variable's current revision, as last read (omit to create it).
    #[schemars(length(min = 35, max = 35))]
    revision: Option<RevisionArg>,
    /// Set only after the user confirmed a global write.
    #[serde(default)]
    confirmed: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Change {
    /// Variable name: letters (any script), digits, '_', '.', '-'; starts with a letter or
    /// '_'.
    #[schemars(length(min = 1, max = 64))]
    name: String,
    /// The new value (any JSON value); required unless `delete` is true.
    #[schemars(schema_with = "any_value")]
    #[serde(default, deserialize_with = "present")]
    value: Option<Value>,
    /// Delete the variable instead (needs its revision).
    #[serde(default)]
    delete: bool,
    /// The variable's current revision (omit to create it).
    #[schemars(length(min = 35, max = 35))]
    revision: Option<RevisionArg>,
}

/// A present `value` (even `null`) is `Some`; only an absent one is `None`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct PatchArgs {
    /// Scope kind (default chat); the session decides which chat and character it means.
    #[serde(default)]
    scope: AnyScope,
    /// The scope's current revision from variable_list, to pin the whole scope.
    #[schemars(length(min = 35, max = 35))]
    scope_revision: Option<RevisionArg>,
    /// The changes, applied all or none.
    #[schemars(length(min = 1))]
    changes: Vec<Change>,
    /// Set only after the user confirmed a global write.
    #[serde(default)]
    confirmed: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct DeleteArgs {
    /// Variable name.
    #[schemars(length(min = 1, max = 64))]
    name: String,
    /// Scope kind (default chat); the session decides which chat and character it means.
    #[serde(default)]
    scope: AnyScope,
    /// The variable's current revision, as last read.
    #[schemars(length(min = 35, max = 35))]
    revision: RevisionArg,
    /// Set only after the user confirmed a global write.
    #[serde(default)]
    confirmed: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ListArgs {
    /// Scope kind (default chat); the session decides which chat and character it means.
    #[serde(default)]
    scope: AnyScope,
    /// Only names starting with this.
    #[serde(default)]
    #[schemars(length(max = 64))]
    prefix: String,
    limit: Option<usize>,
}

// --- result types --------------------------------------------------------------------------

/// A variable as the model sees it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VariableOut {
    name: String,
    scope: &'static str,
    /// The exact value.
    #[schemars(schema_with = "any_value")]
    value: Value,
    revision: String,
    updated_at: i64,
    /// Set on a patch's deletions.
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted: Option<bool>,
}

impl VariableOut {
    fn of(r: &VariableRecord) -> Self {
        Self {
            name: r.name.to_string(),
            scope: r.scope.scope().as_str(),
            value: r.value.clone(),
            revision: r.revision.to_string(),
            updated_at: r.updated_at.0,
            deleted: (!r.is_live()).then_some(true),
        }
    }
}

/// The outcome of a patch.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PatchOut {
    /// The scope's revision after the patch.
    scope_revision: String,
    /// What was written, in change order.
    items: Vec<VariableOut>,
}

/// A deleted variable.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct DeleteOut {
    name: String,
    deleted: bool,
}

/// One variable of a listing.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct SummaryOut {
    name: String,
    /// JSON type of the value.
    #[serde(rename = "type")]
    kind: &'static str,
    /// Up to 80 characters of the compact value.
    preview: String,
    bytes: usize,
    revision: String,
}

/// A listing of one scope.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListOut {
    scope: &'static str,
    /// For variable_patch's scopeRevision; null when nothing was ever written.
    scope_revision: Option<String>,
    items: Vec<SummaryOut>,
    total: usize,
    truncated: bool,
}

// --- the tools -----------------------------------------------------------------------------

fn var_name(raw: &str, field: &str) -> Result<VariableName, ToolError> {
    VariableName::parse(raw).map_err(|e| ToolError::invalid(field, e.to_string()))
}

/// `variable_get`.
pub(crate) struct Get;

#[async_trait]
impl TypedTool for Get {
    type Args = GetArgs;
    type Output = VariableOut;
    const NAME: &'static str = "variable_get";
    const DESCRIPTION: &'static str =
        "Read one variable's exact value and revision (default scope: this chat).";
    const WRITES: bool = false;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: GetArgs,
    ) -> Result<VariableOut, ToolError> {
        let scope = a.scope.scope();
        let n = var_name(&a.name, "name")?;
        match svc.variables.get(&ctx.scope(scope), &n).await? {
            Some(r) => Ok(VariableOut::of(&r)),
            None => Err(ToolError::NotFound {
                what: format!("variable {n} in scope {scope}"),
            }),
        }
    }
}

/// `variable_set`.
pub(crate) struct Set;

#[async_trait]
impl TypedTool for Set {
    type Args = SetArgs;
    type Output = VariableOut;
    const NAME: &'static str = "variable_set";
    const DESCRIPTION: &'static str = "Set a variable. Creating needs no revision; changing an existing one needs its current revision (on a conflict, read again and retry).";
    const WRITES: bool = true;
    // Setting a value to what it already is changes nothing.
    const IDEMPOTENT: bool = true;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: SetArgs,
    ) -> Result<VariableOut, ToolError> {
        let scope = a.scope.scope();
        check_write(ctx, scope, a.confirmed)?;
        let n = var_name(&a.name, "name")?;
        let expected = a
            .revision
            .as_deref()
            .map(|r| revision("revision", r))
            .transpose()?;
        let r = svc
            .variables
            .set(
                &ctx.scope(scope),
                &n,
                a.value,
                expected.as_ref(),
                ctx.source(),
            )
            .await?;
        Ok(VariableOut::of(&r))
    }
}

/// `variable_patch`.
pub(crate) struct Patch;

#[async_trait]
impl TypedTool for Patch {
    type Args = PatchArgs;
    type Output = PatchOut;
    const NAME: &'static str = "variable_patch";
    const DESCRIPTION: &'static str = "Change several variables of one scope at once: all changes apply or none. Each change sets a value or deletes; existing variables need their revision. Optionally pin the whole scope with scopeRevision from variable_list.";
    const WRITES: bool = true;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: PatchArgs,
    ) -> Result<PatchOut, ToolError> {
        let scope = a.scope.scope();
        check_write(ctx, scope, a.confirmed)?;
        let mut changes = Vec::with_capacity(a.changes.len());
        for (i, c) in a.changes.into_iter().enumerate() {
            let field = |k: &str| format!("changes[{i}].{k}");
            let name = var_name(&c.name, &field("name"))?;
            let rev = c
                .revision
                .as_deref()
                .map(|r| revision(&field("revision"), r))
                .transpose()?;
            changes.push(match (c.delete, c.value) {
                (true, Some(_)) => {
                    return Err(ToolError::invalid(
                        field("value"),
                        "a change either deletes or sets a value, not both",
                    ))
                }
                (true, None) => VariableChange::Delete {
                    name,
                    expected: rev.ok_or_else(|| {
                        ToolError::invalid(field("revision"), "deleting needs the current revision")
                    })?,
                },
                (false, Some(value)) => VariableChange::Set {
                    name,
                    value,
                    expected: rev,
                },
                (false, None) => {
                    return Err(ToolError::invalid(
                        field("value"),
                        "is required unless delete is true",
                    ))
                }
            });
        }
        let pinned = a
            .scope_revision
            .as_deref()
            .map(|r| revision("scopeRevision", r))
            .transpose()?;
        let out = svc
            .variables
            .patch(&ctx.scope(scope), &changes, pinned.as_ref(), ctx.source())
            .await?;
        Ok(PatchOut {
            scope_revision: out.scope_revision.to_string(),
            items: out.records.iter().map(VariableOut::of).collect(),
        })
    }
}

/// `variable_delete`.
pub(crate) struct Delete;

#[async_trait]
impl TypedTool for Delete {
    type Args = DeleteArgs;
    type Output = DeleteOut;
    const NAME: &'static str = "variable_delete";
    const DESCRIPTION: &'static str =
        "Delete a variable (kept in the audit trail). Needs its current revision.";
    const WRITES: bool = true;
    const DESTRUCTIVE: bool = true;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: DeleteArgs,
    ) -> Result<DeleteOut, ToolError> {
        let scope = a.scope.scope();
        check_write(ctx, scope, a.confirmed)?;
        let n = var_name(&a.name, "name")?;
        let expected = revision("revision", &a.revision)?;
        svc.variables
            .delete(&ctx.scope(scope), &n, &expected, ctx.source())
            .await?;
        Ok(DeleteOut {
            name: n.to_string(),
            deleted: true,
        })
    }
}

/// `variable_list`.
pub(crate) struct List;

#[async_trait]
impl TypedTool for List {
    type Args = ListArgs;
    type Output = ListOut;
    const NAME: &'static str = "variable_list";
    const DESCRIPTION: &'static str = "List variable names with short value previews, by name prefix. Returns the scope revision for variable_patch.";
    const WRITES: bool = false;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: ListArgs,
    ) -> Result<ListOut, ToolError> {
        let scope = a.scope.scope();
        let listing = svc
            .variables
            .list(
                &ctx.scope(scope),
                &a.prefix,
                a.limit.unwrap_or(ctx.limits().default_results),
            )
            .await?;
        Ok(ListOut {
            scope: scope.as_str(),
            scope_revision: listing.scope_revision.as_ref().map(ToString::to_string),
            items: listing
                .items
                .iter()
                .map(|s| SummaryOut {
                    name: s.name.to_string(),
                    kind: s.kind,
                    preview: s.preview.clone(),
                    bytes: s.bytes,
                    revision: s.revision.to_string(),
                })
                .collect(),
            total: listing.total,
            truncated: listing.truncated,
        })
    }
}
