//! `tavern var ls|get|set|rm`: typed JSON values with revisions, by scope.

use serde_json::{json, Value};
use tavern_core::{VariableName, VariableRecord};

use crate::cli::VarCommand;
use crate::output::{table, time};
use crate::{backend, CliError, Context, Report};

/// Most variables a listing shows (the store's cap).
const LIST_MAX: usize = 200;

fn name(text: &str) -> Result<VariableName, CliError> {
    VariableName::parse(text).map_err(|e| CliError::Usage(e.to_string()))
}

fn record_json(r: &VariableRecord) -> Value {
    json!({
        "scope": r.scope,
        "name": r.name,
        "value": r.value,
        "revision": r.revision,
        "updatedAt": r.updated_at,
    })
}

/// Runs a variable command.
///
/// # Errors
/// Usage errors (scope, name, JSON value, revision) before anything is opened; store failures;
/// a stale revision is a conflict.
pub async fn run(ctx: &Context, command: VarCommand) -> Result<Report, CliError> {
    match command {
        VarCommand::Ls { scope, prefix } => {
            let scope = scope.require()?;
            let stores = backend::open(ctx, false).await?.stores();
            let listing = stores.list(&scope, &prefix, LIST_MAX).await?;
            let rows: Vec<Vec<String>> = listing
                .items
                .iter()
                .map(|v| {
                    vec![
                        v.name.to_string(),
                        v.kind.to_owned(),
                        v.bytes.to_string(),
                        v.revision.to_string(),
                        v.preview.clone(),
                    ]
                })
                .collect();
            let mut text = format!(
                "scope {} (revision {})\n",
                scope,
                listing
                    .scope_revision
                    .as_ref()
                    .map_or("none", |r| r.as_str())
            );
            if rows.is_empty() {
                text.push_str("no variables\n");
            } else {
                text.push_str(&table(
                    &["NAME", "TYPE", "BYTES", "REVISION", "VALUE"],
                    &rows,
                ));
            }
            if listing.truncated {
                text.push_str(&format!(
                    "{} of {} variables shown; narrow with --prefix\n",
                    listing.items.len(),
                    listing.total
                ));
            }
            let json = json!({
                "scope": scope,
                "scopeRevision": listing.scope_revision,
                "variables": listing.items.iter().map(|v| json!({
                    "name": v.name,
                    "type": v.kind,
                    "bytes": v.bytes,
                    "revision": v.revision,
                    "preview": v.preview,
                })).collect::<Vec<_>>(),
                "total": listing.total,
                "truncated": listing.truncated,
            });
            Ok(Report::new(text, json))
        }
        VarCommand::Get { name: n, scope } => {
            let (n, scope) = (name(&n)?, scope.require()?);
            let stores = backend::open(ctx, false).await?.stores();
            let record = stores.get(&scope, &n).await?.ok_or_else(|| {
                CliError::NotFound(format!("variable {n} not found in scope {scope}"))
            })?;
            let text = format!(
                "{}\nrevision {} (updated {})\n",
                serde_json::to_string_pretty(&record.value).unwrap_or_default(),
                record.revision,
                time(record.updated_at)
            );
            Ok(Report::new(text, record_json(&record)))
        }
        VarCommand::Set {
            name: n,
            value,
            revision,
            scope,
        } => {
            let n = name(&n)?;
            let value: Value = serde_json::from_str(&value)
                .map_err(|e| CliError::Usage(format!("the value of {n} is not json: {e}")))?;
            let expected = revision.as_deref().map(super::revision).transpose()?;
            let scope = scope.require()?;
            let stores = backend::open(ctx, true).await?.stores();
            let record = stores
                .set(&scope, &n, value, expected.as_ref(), super::user_source())
                .await?;
            let text = format!(
                "set {} in scope {} (revision {})\n",
                record.name, record.scope, record.revision
            );
            Ok(Report::new(text, record_json(&record)))
        }
        VarCommand::Rm {
            name: n,
            revision,
            scope,
        } => {
            let (n, rev, scope) = (name(&n)?, super::revision(&revision)?, scope.require()?);
            let stores = backend::open(ctx, false).await?.stores();
            stores
                .delete(&scope, &n, &rev, super::user_source())
                .await?;
            let text = format!("deleted {n} in scope {scope}\n");
            Ok(Report::new(
                text,
                json!({"deleted": n, "scope": scope, "revision": rev}),
            ))
        }
    }
}
