//! `tavern check` and `tavern compact`.
//!
//! `check` of a file store is `tavern_store::fs::check_files` (read-only: it never opens the
//! store, which could set files aside or compact); of a database, opening it reads every
//! operation row and every chat is read. Both print the same report.

use serde_json::json;
use tavern_store::fs::{CheckFinding, CheckReport};

use crate::output::table;
use crate::progress::Progress;
use crate::{backend, exit, CliError, Context, Report};

/// Checks the store in the data directory without changing anything.
///
/// # Errors
/// [`CliError::NotFound`] when there is no store.
pub fn run(ctx: &Context) -> Result<Report, CliError> {
    if !backend::store_exists(ctx) {
        return Err(CliError::NotFound(format!(
            "no store in {} to check",
            ctx.data_label
        )));
    }
    let progress = Progress::bar(ctx, 0, "checking");
    let found = tavern_store::fs::check_files(&ctx.data, |done, of| {
        progress.set(done as u64, of as u64);
    });
    drop(progress);
    Ok(report(found))
}

fn report(f: CheckReport) -> Report {
    let mut text = if f.problems.is_empty() {
        String::new()
    } else {
        let rows: Vec<Vec<String>> = f
            .problems
            .iter()
            .map(|p| vec![p.file.clone(), p.problem.clone()])
            .collect();
        table(&["FILE", "PROBLEM"], &rows)
    };
    text.push_str(&format!(
        "checked {} files ({} log lines): {}\n",
        f.files,
        f.log_lines,
        if f.problems.is_empty() {
            "no problems".to_owned()
        } else {
            format!("{} problems", f.problems.len())
        }
    ));
    let as_json = |ps: &[CheckFinding]| {
        ps.iter()
            .map(|p| json!({"file": p.file, "problem": p.problem}))
            .collect::<Vec<_>>()
    };
    let json = json!({
        "ok": f.problems.is_empty(),
        "files": f.files,
        "logLines": f.log_lines,
        "problems": as_json(&f.problems),
        "warnings": as_json(&f.warnings),
    });
    let mut report = Report::new(text, json);
    report.warnings = f
        .warnings
        .iter()
        .map(|w| format!("{}: {}", w.file, w.problem))
        .collect();
    if !f.problems.is_empty() {
        report.exit = exit::CORRUPT;
    }
    report
}

/// Checks a PostgreSQL store: opening it reads and parses every operation row; what could
/// not be read is reported (exit 4), as `check` reports a corrupt log line.
///
/// # Errors
/// Store failures (an unreachable server).
pub async fn run_database(ctx: &Context) -> Result<Report, CliError> {
    let backend = backend::open(ctx, false).await?;
    let tables = backend.copyable().dump_tables().await?;
    let mut f = CheckReport::default();
    // Every chat, line by line (the operation rows were read when the store opened).
    let stores = backend.stores();
    for character in backend.copyable().chat_characters().await? {
        for chat in stores.list_chats(&character).await? {
            f.files += 1;
            match stores.read_chat(&character, &chat).await {
                Ok(file) => f.log_lines += file.map_or(0, |c| c.lines.len() as u64),
                Err(tavern_store::StoreError::Corrupt { file, reason }) => {
                    f.problems.push(CheckFinding {
                        file,
                        problem: reason,
                    })
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    for d in backend.diagnostics() {
        f.problems.push(CheckFinding {
            file: d.file,
            problem: d.message,
        });
    }
    let (chats, lines) = (f.files, f.log_lines);
    let mut r = report(f);
    let summary = format!(
        "checked the database ({} memories, {} variable scopes, {chats} chats of {lines} lines)",
        tables.memory_records(),
        tables.variable_scopes()
    );
    r.text = r.text.replacen(
        &format!("checked {chats} files ({lines} log lines)"),
        &summary,
        1,
    );
    r.json["memories"] = json!(tables.memory_records());
    r.json["variableScopes"] = json!(tables.variable_scopes());
    r.json["chats"] = json!(chats);
    r.json["chatLines"] = json!(lines);
    Ok(r)
}

/// Compacts the logs.
///
/// # Errors
/// [`CliError::NotFound`] without a store; store failures (the old logs stay then).
pub async fn compact(ctx: &Context) -> Result<Report, CliError> {
    let backend = backend::open(ctx, false).await?;
    let progress = Progress::spinner(ctx, "compacting");
    let r = backend.compact().await?;
    drop(progress);
    let text = format!(
        "{}: {} -> {} {unit}\n{}: {} -> {} {unit}\n",
        r.memory_name,
        r.memory.0,
        r.memory.1,
        r.variables_name,
        r.variables.0,
        r.variables.1,
        unit = r.unit
    );
    let json = json!({
        "memory": {"before": r.memory.0, "after": r.memory.1},
        "variables": {"before": r.variables.0, "after": r.variables.1},
    });
    Ok(Report::new(text, json))
}
