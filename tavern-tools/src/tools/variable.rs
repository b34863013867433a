//! `variable_get`, `variable_set`, `variable_patch`, `variable_delete`, `variable_list`.

use serde_json::{json, Map, Value};
use tavern_core::{Scope, VariableName, VariableRecord};
use tavern_store::VariableChange;

use super::{limit_param, nullable, object, result, revision_param, scope_param, Args, ToolSpec};
use crate::context::{ToolContext, ToolLimits};
use crate::error::ToolError;
use crate::registry::ToolServices;

fn name_param() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 64,
        "description": "Variable name: letters (any script), digits, '_', '.', '-'; starts with a letter or '_' (e.g. hp, basic.好感度)."})
}

fn value_param() -> Value {
    json!({"description": "Any JSON value: string, finite number, boolean, array or object (at most 32 KiB)."})
}

fn record_schema() -> Value {
    result(
        json!({"name": {"type": "string"}, "scope": {"type": "string"}, "value": {},
        "revision": {"type": "string"}, "updatedAt": {"type": "integer"}}),
    )
}

pub(crate) fn specs(l: &ToolLimits) -> Vec<ToolSpec> {
    let scope = scope_param(&Scope::ALL, Scope::Chat);
    vec![
        ToolSpec {
            name: "variable_get",
            description: "Read one variable's exact value and revision (default scope: this chat).",
            parameters: object(json!({"name": name_param(), "scope": scope}), &["name"]),
            result: record_schema(),
            writes: false,
        },
        ToolSpec {
            name: "variable_set",
            description: "Set a variable. Creating needs no revision; changing an existing one needs its current revision (on a conflict, read again and retry).",
            parameters: object(json!({"name": name_param(), "value": value_param(), "scope": scope,
                "revision": revision_param("variable"), "confirmed": {"type": "boolean", "description": "Set only after the user confirmed a global write."}}), &["name", "value"]),
            result: record_schema(),
            writes: true,
        },
        ToolSpec {
            name: "variable_patch",
            description: "Change several variables of one scope at once: all changes apply or none. Each change sets a value or deletes; existing variables need their revision. Optionally pin the whole scope with scopeRevision from variable_list.",
            parameters: object(json!({
                "scope": scope,
                "scopeRevision": revision_param("scope"),
                "changes": {"type": "array", "minItems": 1, "maxItems": l.max_patch_changes, "items": object(json!({
                    "name": name_param(), "value": value_param(), "delete": {"type": "boolean"},
                    "revision": revision_param("variable"),
                }), &["name"])},
                "confirmed": {"type": "boolean", "description": "Set only after the user confirmed a global write."},
            }), &["changes"]),
            result: result(json!({"scopeRevision": {"type": "string"}, "items": {"type": "array", "items": record_schema()}})),
            writes: true,
        },
        ToolSpec {
            name: "variable_delete",
            description: "Delete a variable (kept in the audit trail). Needs its current revision.",
            parameters: object(json!({"name": name_param(), "scope": scope, "revision": revision_param("variable"),
                "confirmed": {"type": "boolean", "description": "Set only after the user confirmed a global write."}}), &["name", "revision"]),
            result: result(json!({"name": {"type": "string"}, "deleted": {"type": "boolean"}})),
            writes: true,
        },
        ToolSpec {
            name: "variable_list",
            description: "List variable names with short value previews, by name prefix. Returns the scope revision for variable_patch.",
            parameters: object(json!({"scope": scope, "prefix": {"type": "string", "maxLength": 64}, "limit": limit_param(l)}), &[]),
            result: result(json!({"scopeRevision": nullable(json!({"type": "string"})), "items": {"type": "array"},
                "total": {"type": "integer"}, "truncated": {"type": "boolean"}})),
            writes: false,
        },
    ]
}

fn var_name(raw: &str, field: &str) -> Result<VariableName, ToolError> {
    VariableName::parse(raw).map_err(|e| ToolError::invalid(field, e.to_string()))
}

fn record_json(r: &VariableRecord) -> Value {
    json!({"name": r.name.as_str(), "scope": r.scope.scope().as_str(), "value": r.value,
        "revision": r.revision.as_str(), "updatedAt": r.updated_at.0})
}

pub(crate) async fn call(
    name: &str,
    svc: &ToolServices,
    ctx: &ToolContext,
    args: &Map<String, Value>,
) -> Result<Value, ToolError> {
    let a = Args(args);
    let scope = a.scope_or("scope", Scope::Chat);
    let key = ctx.scope(scope);
    if matches!(name, "variable_set" | "variable_patch" | "variable_delete") {
        ctx.policy()
            .check_write(scope, a.bool_or("confirmed", false))
            .map_err(|d| ToolError::ScopeDenied {
                scope: scope.to_string(),
                reason: d.to_string(),
            })?;
    }
    match name {
        "variable_get" => {
            let n = var_name(a.str("name").unwrap_or_default(), "name")?;
            match svc.variables.get(&key, &n).await? {
                Some(r) => Ok(record_json(&r)),
                None => Err(ToolError::NotFound {
                    what: format!("variable {n} in scope {scope}"),
                }),
            }
        }
        "variable_set" => {
            let n = var_name(a.str("name").unwrap_or_default(), "name")?;
            let value = args.get("value").cloned().unwrap_or(Value::Null);
            let expected = a.revision("revision")?;
            let r = svc
                .variables
                .set(&key, &n, value, expected.as_ref(), ctx.source())
                .await?;
            Ok(record_json(&r))
        }
        "variable_patch" => {
            let mut changes = Vec::new();
            for (i, c) in args
                .get("changes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let c = c.as_object().ok_or_else(|| {
                    ToolError::invalid(format!("changes[{i}]"), "must be an object")
                })?;
                let ca = Args(c);
                let field = |k: &str| format!("changes[{i}].{k}");
                let n = var_name(ca.str("name").unwrap_or_default(), &field("name"))?;
                let rev = ca
                    .revision("revision")
                    .map_err(|_| ToolError::invalid(field("revision"), "is not a revision"))?;
                if ca.bool_or("delete", false) {
                    if c.contains_key("value") {
                        return Err(ToolError::invalid(
                            field("value"),
                            "a change either deletes or sets a value, not both",
                        ));
                    }
                    let expected = rev.ok_or_else(|| {
                        ToolError::invalid(field("revision"), "deleting needs the current revision")
                    })?;
                    changes.push(VariableChange::Delete { name: n, expected });
                } else {
                    let value = c.get("value").cloned().ok_or_else(|| {
                        ToolError::invalid(field("value"), "is required unless delete is true")
                    })?;
                    changes.push(VariableChange::Set {
                        name: n,
                        value,
                        expected: rev,
                    });
                }
            }
            let pinned = a.revision("scopeRevision")?;
            let out = svc
                .variables
                .patch(&key, &changes, pinned.as_ref(), ctx.source())
                .await?;
            Ok(json!({"scopeRevision": out.scope_revision.as_str(),
                "items": out.records.iter().map(|r| {
                    let mut v = record_json(r);
                    if !r.is_live() { v["deleted"] = json!(true); }
                    v
                }).collect::<Vec<_>>()}))
        }
        "variable_delete" => {
            let n = var_name(a.str("name").unwrap_or_default(), "name")?;
            let expected = a
                .revision("revision")?
                .ok_or_else(|| ToolError::invalid("revision", "is required"))?;
            svc.variables
                .delete(&key, &n, &expected, ctx.source())
                .await?;
            Ok(json!({"name": n.as_str(), "deleted": true}))
        }
        "variable_list" => {
            let listing = svc
                .variables
                .list(
                    &key,
                    a.str("prefix").unwrap_or(""),
                    a.usize_or("limit", ctx.limits().default_results),
                )
                .await?;
            Ok(json!({
                "scope": scope.as_str(),
                "scopeRevision": listing.scope_revision.as_ref().map(|r| r.as_str()),
                "items": listing.items.iter().map(|s| json!({"name": s.name.as_str(), "type": s.kind, "preview": s.preview, "bytes": s.bytes, "revision": s.revision.as_str()})).collect::<Vec<_>>(),
                "total": listing.total, "truncated": listing.truncated,
            }))
        }
        other => Err(ToolError::UnknownTool(other.to_owned())),
    }
}
