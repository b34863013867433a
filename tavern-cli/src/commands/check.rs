//! `tavern check` and `tavern compact`.
//!
//! `check` reads the file store's layout itself, read-only (it never opens the store, which
//! could set files aside or compact): every log line's checksum and payload, the revision
//! chain of every memory and variable version, `state.json`, every checkpoint, prompt and chat
//! document; set-aside (`*.corrupt-*`) files are listed. Logs and chats are read under a shared
//! lock when their lock file exists, so a write in progress is never mistaken for damage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{json, Value};
use tavern_core::chat::ChatLine;
use tavern_core::{
    AuditAction, AuditEntry, MemoryRecord, MemorySource, Revision, ScopeKey, Timestamp,
    VariableRecord,
};
use tavern_store::{ProjectorCheckpoint, SessionPrompt};

use crate::output::table;
use crate::progress::Progress;
use crate::{backend, exit, CliError, Context, Report};

/// One problem: a file (relative to the data directory, with a line where it applies) and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file, relative to the data directory.
    pub file: String,
    /// What is wrong.
    pub problem: String,
}

#[derive(Default)]
struct Findings {
    problems: Vec<Problem>,
    warnings: Vec<Problem>,
    files: usize,
    log_lines: u64,
}

impl Findings {
    fn problem(&mut self, file: impl Into<String>, problem: impl Into<String>) {
        self.problems.push(Problem {
            file: file.into(),
            problem: problem.into(),
        });
    }
}

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
    let root = &ctx.data;
    let mut docs: Vec<(String, Kind)> = Vec::new();
    let mut findings_early: Vec<(String, String)> = Vec::new();
    for (name, kind) in [
        ("memory.log", Kind::MemoryLog),
        ("variables.log", Kind::VariableLog),
        ("state.json", Kind::State),
    ] {
        match not_regular(&root.join(name)) {
            // Never opened: a FIFO would block the check, a link to a device never end.
            Some(what) => findings_early.push((
                name.to_owned(),
                format!("{what} where a file belongs; the store sets it aside when it next opens"),
            )),
            None if root.join(name).is_file() => docs.push((name.to_owned(), kind)),
            None => {}
        }
    }
    let mut dirs = vec![
        ("checkpoints".to_owned(), Kind::Checkpoint),
        ("prompts".to_owned(), Kind::Prompt),
    ];
    for c in list(&root.join("chats")) {
        if root.join("chats").join(&c).is_dir() {
            dirs.push((format!("chats/{c}"), Kind::Chat));
        }
    }
    let mut findings = Findings::default();
    for (rel, what) in findings_early {
        findings.problem(&rel, what);
    }
    let mut leftovers = Vec::new();
    for name in list(root) {
        leftovers.push(name);
    }
    for (dir, kind) in &dirs {
        for name in list(&root.join(dir)) {
            let rel = format!("{dir}/{name}");
            let wanted = match kind {
                Kind::Chat => name.ends_with(".jsonl"),
                _ => name.ends_with(".json"),
            };
            if let Some(what) = not_regular(&root.join(&rel)).filter(|_| wanted) {
                findings.problem(
                    &rel,
                    format!(
                        "{what} where a file belongs; the store sets it aside when it reads it"
                    ),
                );
            } else if wanted && root.join(&rel).is_file() {
                docs.push((rel, *kind));
            } else {
                leftovers.push(rel);
            }
        }
    }
    for rel in leftovers {
        let name = rel.rsplit('/').next().unwrap_or(&rel);
        if name.contains(".corrupt-") {
            findings.problem(
                &rel,
                "set aside as corrupt (a damaged file kept for inspection)",
            );
        } else if name.starts_with(".tmp-") {
            findings.warnings.push(Problem {
                file: rel,
                problem: "temporary file of an interrupted write (removed when the store next opens, if older than an hour)".into(),
            });
        }
    }
    let progress = Progress::bar(ctx, docs.len() as u64, "checking");
    for (rel, kind) in &docs {
        findings.files += 1;
        check_file(root, rel, *kind, &mut findings);
        progress.inc();
    }
    drop(progress);
    Ok(report(findings))
}

fn list(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn report(f: Findings) -> Report {
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
    let as_json = |ps: &[Problem]| {
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

#[derive(Debug, Clone, Copy)]
enum Kind {
    MemoryLog,
    VariableLog,
    State,
    Checkpoint,
    Prompt,
    Chat,
}

/// Holds a shared lock on `lock` (when it exists) while reading `file`.
fn read_locked(root: &Path, rel: &str, lock: Option<PathBuf>) -> std::io::Result<Vec<u8>> {
    let guard = match lock {
        Some(l) if l.is_file() => {
            let f = std::fs::File::open(l)?;
            f.lock_shared()?;
            Some(f)
        }
        _ => None,
    };
    let bytes = std::fs::read(root.join(rel));
    drop(guard);
    bytes
}

fn check_file(root: &Path, rel: &str, kind: Kind, f: &mut Findings) {
    let lock = match kind {
        Kind::MemoryLog | Kind::VariableLog => Some(root.join(format!("{rel}.lock"))),
        Kind::Chat => rel
            .strip_suffix(".jsonl")
            .map(|stem| root.join(format!("{stem}.lock"))),
        _ => None,
    };
    let bytes = match read_locked(root, rel, lock) {
        Ok(b) => b,
        Err(e) => {
            f.problem(rel, format!("unreadable: {e}"));
            return;
        }
    };
    match kind {
        Kind::MemoryLog => check_log(rel, &bytes, f, &mut MemoryChain::default()),
        Kind::VariableLog => check_log(rel, &bytes, f, &mut VariableChain::default()),
        Kind::State => {
            if let Err(e) = serde_json::from_slice::<Value>(&bytes) {
                f.problem(rel, format!("not json: {e}"));
            }
        }
        Kind::Checkpoint => {
            if let Err(e) = serde_json::from_slice::<ProjectorCheckpoint>(&bytes) {
                f.problem(rel, format!("not a projector checkpoint: {e}"));
            }
        }
        Kind::Prompt => {
            if let Err(e) = serde_json::from_slice::<SessionPrompt>(&bytes) {
                f.problem(rel, format!("not a session prompt: {e}"));
            }
        }
        Kind::Chat => check_chat(rel, &bytes, f),
    }
}

fn check_chat(rel: &str, bytes: &[u8], f: &mut Findings) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        f.problem(rel, "not utf-8");
        return;
    };
    let mut lines = 0;
    for (i, line) in text.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        lines += 1;
        if let Err(e) = ChatLine::parse(line) {
            f.problem(format!("{rel} line {}", i + 1), e.to_string());
        }
    }
    if lines == 0 {
        f.problem(rel, "empty chat (a chat has at least one line)");
    }
}

/// What a log's payloads must be, and the revision chain they must keep.
trait Chain {
    /// Checks one verified payload; returns what is wrong.
    fn payload(&mut self, payload: &str) -> Result<(), String>;
}

fn check_log(rel: &str, bytes: &[u8], f: &mut Findings, chain: &mut dyn Chain) {
    let (complete, tail) = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(end) => (Some(&bytes[..end]), &bytes[end + 1..]),
        None => (None, bytes),
    };
    let mut n = 0u64;
    for raw in complete.into_iter().flat_map(|c| c.split(|b| *b == b'\n')) {
        n += 1;
        let at = format!("{rel} line {n}");
        let payload = match tavern_store::fs::verify_line(raw) {
            Ok(payload) => payload,
            Err(e) => {
                f.problem(at, e);
                continue;
            }
        };
        if let Err(e) = chain.payload(payload) {
            f.problem(at, e);
        }
    }
    f.log_lines += n;
    if !tail.is_empty() {
        f.problem(
            format!("{rel} line {}", n + 1),
            "incomplete last line (a crash during a write; skipped by the store)",
        );
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum MemoryPayload {
    Put {
        record: Box<MemoryRecord>,
        #[allow(dead_code)]
        action: AuditAction,
    },
    Touch {
        #[allow(dead_code)]
        scope: ScopeKey,
        #[allow(dead_code)]
        id: tavern_core::MemoryId,
        #[allow(dead_code)]
        at: Timestamp,
    },
    Snapshot {
        record: Box<MemoryRecord>,
        history: Vec<HistoryLine>,
    },
}

#[derive(Deserialize)]
struct HistoryLine {
    #[allow(dead_code)]
    action: AuditAction,
    #[allow(dead_code)]
    at: Timestamp,
    revision: Revision,
    #[allow(dead_code)]
    source: MemorySource,
}

/// What `path` is when it exists and is not a regular file (links are not followed).
fn not_regular(path: &std::path::Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::symlink_metadata(path).ok()?.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_symlink() {
        Some("a symbolic link")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device")
    } else {
        Some("not a regular file")
    }
}

/// The memory log: every version's revision is its content chained to the previous version's.
#[derive(Default)]
struct MemoryChain {
    last: HashMap<(ScopeKey, tavern_core::MemoryId), Revision>,
}

impl Chain for MemoryChain {
    fn payload(&mut self, payload: &str) -> Result<(), String> {
        let op: MemoryPayload =
            serde_json::from_str(payload).map_err(|e| format!("not a memory operation: {e}"))?;
        let (record, previous) = match op {
            MemoryPayload::Touch { .. } => return Ok(()),
            MemoryPayload::Put { record, .. } => {
                let key = (record.scope.clone(), record.id.clone());
                let prev = self.last.get(&key).cloned();
                (record, prev)
            }
            MemoryPayload::Snapshot { record, history } => {
                if history.last().map(|h| &h.revision) != Some(&record.revision) {
                    return Err(format!(
                        "memory {}: its history does not end at its revision",
                        record.id
                    ));
                }
                let prev = history
                    .len()
                    .checked_sub(2)
                    .map(|i| history[i].revision.clone());
                (record, prev)
            }
        };
        let expected = record.compute_revision(previous.as_ref());
        let key = (record.scope.clone(), record.id.clone());
        self.last.insert(key, record.revision.clone());
        if expected != record.revision {
            return Err(format!(
                "memory {}: revision {} does not match its content",
                record.id, record.revision
            ));
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VariablePayload {
    scope: ScopeKey,
    records: Vec<VariableRecord>,
    #[allow(dead_code)]
    scope_revision: Revision,
    audit: Vec<AuditEntry>,
}

/// The variable log: every version's revision chains to the previous version's.
#[derive(Default)]
struct VariableChain {
    last: HashMap<(ScopeKey, tavern_core::VariableName), Revision>,
}

fn variable_revision(r: &VariableRecord, previous: Option<&Revision>) -> Option<Revision> {
    let prev = previous.map(|rev| VariableRecord {
        revision: rev.clone(),
        ..r.clone()
    });
    if r.is_live() {
        VariableRecord::next(
            r.scope.clone(),
            r.name.clone(),
            r.value.clone(),
            prev.as_ref(),
            r.updated_at,
        )
        .ok()
        .map(|v| v.revision)
    } else {
        prev.map(|p| p.deleted(r.updated_at).revision)
    }
}

impl Chain for VariableChain {
    fn payload(&mut self, payload: &str) -> Result<(), String> {
        let op: VariablePayload =
            serde_json::from_str(payload).map_err(|e| format!("not a variable operation: {e}"))?;
        for r in &op.records {
            if r.scope != op.scope {
                return Err(format!("variable {}: record of another scope", r.name));
            }
            let key = (r.scope.clone(), r.name.clone());
            // The previous version: from an earlier line, or from this line's audit trail
            // (a compacted line carries every revision the variable had).
            let trail: Vec<&Revision> = op
                .audit
                .iter()
                .filter(|a| a.target == r.name.as_str())
                .filter(|a| matches!(a.action, AuditAction::Set | AuditAction::Deleted))
                .filter_map(|a| a.revision.as_ref())
                .collect();
            let from_trail = match trail.iter().position(|rev| *rev == &r.revision) {
                Some(0) => Some(None),
                Some(i) => Some(Some(trail[i - 1].clone())),
                None => trail.last().map(|rev| Some((*rev).clone())),
            };
            let mut candidates: Vec<Option<Revision>> = Vec::new();
            if let Some(prev) = self.last.get(&key) {
                candidates.push(Some(prev.clone()));
            }
            if let Some(c) = from_trail {
                candidates.push(c);
            }
            let known = !candidates.is_empty();
            if !known {
                candidates.push(None);
            }
            let ok = candidates
                .iter()
                .any(|prev| variable_revision(r, prev.as_ref()).as_ref() == Some(&r.revision));
            self.last.insert(key, r.revision.clone());
            // A first version whose predecessor nothing records cannot be checked.
            if !ok && (known || r.is_live()) {
                return Err(format!(
                    "variable {}: revision {} does not match its content",
                    r.name, r.revision
                ));
            }
        }
        Ok(())
    }
}

/// Checks a PostgreSQL store: opening it reads and parses every operation row; what could
/// not be read is reported (exit 4), as `check` reports a corrupt log line.
///
/// # Errors
/// Store failures (an unreachable server).
pub async fn run_database(ctx: &Context) -> Result<Report, CliError> {
    let backend = backend::open(ctx, false).await?;
    let tables = backend.copyable().dump_tables().await?;
    let mut f = Findings::default();
    // Every chat, line by line (the operation rows were read when the store opened).
    let stores = backend.stores();
    for character in backend.copyable().chat_characters().await? {
        for chat in stores.list_chats(&character).await? {
            f.files += 1;
            match stores.read_chat(&character, &chat).await {
                Ok(file) => f.log_lines += file.map_or(0, |c| c.lines.len() as u64),
                Err(tavern_store::StoreError::Corrupt { file, reason }) => f.problem(file, reason),
                Err(e) => return Err(e.into()),
            }
        }
    }
    for d in backend.diagnostics() {
        f.problem(d.file, d.message);
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
