//! `tavern copy`: the whole store the command line names (the data directory, or PostgreSQL
//! with `--store`) into an empty file store or PostgreSQL database, exactly, then verified.

use serde_json::json;
use tavern_store::copy_store;

use crate::backend::{self, StoreSettings};
use crate::cli::CopyArgs;
use crate::progress::Progress;
use crate::{CliError, Context, Report};

/// Copies and verifies.
///
/// # Errors
/// [`CliError::Usage`] without exactly one target; a target that is not empty (nothing is
/// written then); store failures (the target may hold part of the copy then: empty it and run
/// the copy again); a verification that finds a difference.
pub async fn run(ctx: &Context, args: &CopyArgs) -> Result<Report, CliError> {
    let one_target =
        || CliError::Usage("name one target: --to-data DIR or --to-store SETTINGS".into());
    if args.to_data.is_some() == args.to_store.is_some() {
        return Err(one_target());
    }
    let source = backend::open(ctx, false).await?;
    let (target, label) = match (&args.to_data, &args.to_store) {
        (Some(dir), None) => {
            let label = dir.display().to_string();
            let target = backend::open_files(dir, &label)
                .map_err(|e| CliError::Failed(format!("--to-data {label}: {e}")))?;
            (
                std::sync::Arc::new(target) as std::sync::Arc<dyn backend::Backend>,
                label,
            )
        }
        (None, Some(settings)) => {
            let settings = StoreSettings {
                settings: settings.clone(),
                password_file: args.to_store_password_file.clone(),
                ca_file: args.to_store_ca_file.clone(),
                image_dir: None,
                max_loaded_memories: None,
            };
            let target = backend::open_postgres(&settings, "--to-store")
                .await
                .map_err(|e| match e {
                    e @ CliError::Usage(_) => e,
                    e => CliError::Failed(format!("--to-store: {e}")),
                })?;
            (
                std::sync::Arc::new(target) as std::sync::Arc<dyn backend::Backend>,
                "the database named by --to-store".to_owned(),
            )
        }
        _ => return Err(one_target()),
    };
    let progress = Progress::spinner(ctx, "copying");
    let r = copy_store(&*source.copyable(), &*target.copyable()).await;
    drop(progress);
    let r = r.map_err(|e| match e {
        e @ tavern_store::StoreError::Invalid(_) => CliError::Failed(format!("{label}: {e}")),
        e => CliError::Failed(format!(
            "copy to {label} failed: {e}; the source is unchanged, the target may hold part \
             of the copy (empty it and run the copy again)"
        )),
    })?;
    let text = format!(
        "copied to {label} and verified: {} memories, {} variable scopes, {} chats ({} lines), \
         {} checkpoints, {} prompts, the state\n",
        r.memories, r.variable_scopes, r.chats, r.chat_lines, r.checkpoints, r.prompts
    );
    let json = json!({
        "verified": true,
        "memories": r.memories,
        "variableScopes": r.variable_scopes,
        "chats": r.chats,
        "chatLines": r.chat_lines,
        "checkpoints": r.checkpoints,
        "prompts": r.prompts,
        "skipped": r.skipped,
        "reformatted": r.reformatted,
    });
    let mut report = Report::new(text, json);
    report.warnings = r
        .skipped
        .iter()
        .map(|s| format!("not copied: {s}"))
        .chain(
            r.reformatted
                .iter()
                .map(|s| format!("copied as lines: {s}")),
        )
        .collect();
    Ok(report)
}
