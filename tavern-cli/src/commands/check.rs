//! `tavern check` and `tavern compact`.
//!
//! `check` of a file store is `tavern_store::fs::check_files` (read-only: it never opens the
//! store, which could set files aside or compact); of a database, opening it reads every
//! operation row (never from an image) and every chat is read, and with `--store-image-dir`
//! the memory image there is read as a host would and compared with those rows. Both print
//! the same report.

use serde_json::json;
use tavern_store::fs::{CheckFinding, CheckReport};

use crate::backend::{self, Backend, StoreSettings};
use crate::output::table;
use crate::progress::Progress;
use crate::{exit, CliError, Context, Report};

/// Checks the store in the data directory without changing anything.
///
/// # Errors
/// [`CliError::NotFound`] when there is no store.
pub fn run(ctx: &Context) -> Result<Report, CliError> {
    backend::data_is_a_folder(ctx)?;
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
    let Some(settings) = &ctx.store else {
        return Err(CliError::Usage("check of a database needs --store".into()));
    };
    // Every row, whatever image or scope bound the command line names: that is the check.
    let every_row = StoreSettings {
        image_dir: None,
        max_loaded_memories: None,
        ..settings.clone()
    };
    let database = backend::open_postgres(&every_row, "--store").await?;
    let backend: &dyn Backend = &database;
    let tables = backend.copyable().dump_tables().await?;
    let mut f = CheckReport::default();
    let image = match &settings.image_dir {
        Some(dir) => check_image(settings, dir, &database, &mut f).await?,
        None => None,
    };
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
    if let Some(image) = image {
        r.text.push_str(&image.line());
        r.json["memoryImage"] = json!(image.as_str());
    }
    r.json["memories"] = json!(tables.memory_records());
    r.json["variableScopes"] = json!(tables.variable_scopes());
    r.json["chats"] = json!(chats);
    r.json["chatLines"] = json!(lines);
    Ok(r)
}

/// What the memory image in `--store-image-dir` was found to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImageState {
    /// No image there yet (the next host opening the database with the directory saves one).
    Absent,
    /// Read, and its memories (with the rows after it) are those of every row.
    Agrees,
    /// Of rows compacted since or of another store: not read (an open that reads every row
    /// saves a current one).
    Stale,
    /// Damaged, or it disagrees with the rows: a problem is reported.
    Bad,
}

impl ImageState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Absent => "absent",
            Self::Agrees => "agrees",
            Self::Stale => "stale",
            Self::Bad => "bad",
        }
    }

    fn line(self) -> String {
        let file = tavern_store::pg::MEMORY_IMAGE_FILE;
        match self {
            Self::Absent => format!("{file}: none yet (the next open with this directory saves one)\n"),
            Self::Agrees => format!("{file}: read, and it agrees with every row\n"),
            Self::Stale => format!("{file}: stale (of rows compacted since, of another store or another format): not read; a host open saves a current one once the table's last sequence number is 4,096 or more, and so does `tavern compact`\n"),
            Self::Bad => format!("{file}: see the problems above\n"),
        }
    }
}

/// Attempts to compare the image's memories with every row's while other processes write:
/// the two are read one after the other, so a write between them is a difference that the
/// next attempt no longer sees.
const IMAGE_COMPARE_ATTEMPTS: usize = 3;

/// Opens the database again as a host with `dir` would (from the memory image there, then the
/// rows after it), but never writing an image, and compares its memories with `every_row`'s:
/// a damaged image, or one that disagrees with the rows (a row changed or deleted by hand,
/// which the image's anchor cannot see), is a problem.
async fn check_image(
    settings: &StoreSettings,
    dir: &std::path::Path,
    every_row: &backend::PgBackend,
    f: &mut CheckReport,
) -> Result<Option<ImageState>, CliError> {
    let file = tavern_store::pg::MEMORY_IMAGE_FILE;
    // Only a file that is not there is absent: one that cannot be read is the store's to
    // report (as every host opening it would).
    if let Err(e) = std::fs::symlink_metadata(dir.join(file)) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return Ok(Some(ImageState::Absent));
        }
    }
    let imaged = backend::open_postgres_reading_image(&StoreSettings {
        max_loaded_memories: None,
        ..settings.clone()
    })
    .await?;
    // What the store reported of the image, as problems; whether it reported any.
    let reported = |f: &mut CheckReport| {
        let found: Vec<_> = Backend::diagnostics(&imaged)
            .into_iter()
            .filter(|d| d.file == file)
            .map(|d| CheckFinding {
                file: d.file,
                problem: d.message,
            })
            .collect();
        let any = !found.is_empty();
        f.problems.extend(found);
        any
    };
    if reported(f) {
        return Ok(Some(ImageState::Bad));
    }
    // The store says whether it began from the image: a stale one is passed over.
    if !imaged.memory_image_read().await {
        return Ok(Some(ImageState::Stale));
    }
    // An open reads the posting lists only when a search first needs them: read them all.
    if !imaged.memory_image_postings_whole().await {
        f.problems.push(CheckFinding {
            file: file.into(),
            problem: "torn or damaged (a posting list fails its checksum): a host rebuilds its \
                      search index from the records when a search meets it, and saves the \
                      image again"
                .into(),
        });
        return Ok(Some(ImageState::Bad));
    }
    // One dump at a time, each let go once digested: a large store is held three times at
    // most (the two opens and the dump being digested), not four times and two sorted copies.
    let key = tavern_store::MemoryDigest::random_key();
    let digest = |dump: tavern_store::TableDump| dump.memory_digest(key);
    for _ in 0..IMAGE_COMPARE_ATTEMPTS {
        let from_image = digest(Backend::copyable(&imaged).dump_tables().await?)?;
        // A record that did not read back from the image makes the store read every row
        // again (and say so): then the dump is of the rows, and the image is not whole.
        if reported(f) {
            return Ok(Some(ImageState::Bad));
        }
        let from_rows = digest(Backend::copyable(every_row).dump_tables().await?)?;
        if from_image.same(&from_rows) {
            return Ok(Some(ImageState::Agrees));
        }
    }
    f.problems.push(CheckFinding {
        file: file.into(),
        problem: "its memories differ from those of the rows of memory_ops (a row changed or \
                  deleted by hand?): delete it, and the next open with this directory saves \
                  one again"
            .into(),
    });
    Ok(Some(ImageState::Bad))
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
