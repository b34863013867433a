//! The file store's integrity check (`tavern check`, the panel's store page): reads the
//! store's layout itself, read-only — it never opens the store, which could set files aside or
//! compact: every log line's checksum and payload, the revision chain of every memory and
//! variable version, `state.json`, every checkpoint, prompt and chat document, the memory image
//! (checksum, and whether it still matches `memory.log`); set-aside
//! (`*.corrupt-*`) files are listed. Logs and chats are read under a shared lock when their lock
//! file exists, so a write in progress is never mistaken for damage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use tavern_core::chat::ChatLine;
use tavern_core::{
    AuditAction, AuditEntry, MemoryRecord, MemorySource, Revision, ScopeKey, Timestamp,
    VariableRecord,
};

use crate::checkpoint::ProjectorCheckpoint;
use crate::prompt::SessionPrompt;

/// One finding: a file (relative to the store's root, with a line where it applies) and what
/// is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckFinding {
    /// The file, relative to the store's root (`memory.log line 3`).
    pub file: String,
    /// What is wrong.
    pub problem: String,
}

/// What [`check_files`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Damage: lines or files the store skips or sets aside.
    pub problems: Vec<CheckFinding>,
    /// What needs no repair (temporary files of interrupted writes).
    pub warnings: Vec<CheckFinding>,
    /// Files read.
    pub files: usize,
    /// Log lines read.
    pub log_lines: u64,
}

impl CheckReport {
    fn problem(&mut self, file: impl Into<String>, problem: impl Into<String>) {
        self.problems.push(CheckFinding {
            file: file.into(),
            problem: problem.into(),
        });
    }
}

/// Checks the file store under `root` without changing anything; `on_file(done, of)` is
/// called before each file is read and once at the end (a progress bar). A store that does
/// not exist has nothing to find (the caller says so).
pub fn check_files(root: &Path, mut on_file: impl FnMut(usize, usize)) -> CheckReport {
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
    let mut findings = CheckReport::default();
    for (rel, what) in findings_early {
        findings.problem(&rel, what);
    }
    check_memory_image(root, &mut findings);
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
            findings.warnings.push(CheckFinding {
                file: rel,
                problem: "temporary file of an interrupted write (removed when the store next opens, if older than an hour)".into(),
            });
        }
    }
    // Chats kept in a SillyTavern user folder (`FsOptions::with_chat_folder`) are the store's
    // too: named `chat folder: chats/…`, never by the folder's absolute path.
    let folder_chats = chat_folder_chats(root, &mut findings);
    let total = docs.len() + folder_chats.as_ref().map_or(0, |(_, d)| d.len());
    for (done, (rel, kind)) in docs.iter().enumerate() {
        on_file(done, total);
        findings.files += 1;
        check_file(root, rel, *kind, &mut findings);
    }
    if let Some((folder, chats)) = folder_chats {
        for (done, rel) in chats.iter().enumerate() {
            on_file(docs.len() + done, total);
            findings.files += 1;
            let before = findings.problems.len();
            check_file(&folder, rel, Kind::Chat, &mut findings);
            for p in &mut findings.problems[before..] {
                p.file = format!("chat folder: {}", p.file);
            }
        }
    }
    on_file(total, total);
    findings
}

/// The chat folder the store records (`chat-folder.json`) and its chat files (relative to it),
/// or `None` when the store keeps its chats under its root; a record that cannot be read, or
/// that names no folder, is a problem.
fn chat_folder_chats(root: &Path, f: &mut CheckReport) -> Option<(PathBuf, Vec<String>)> {
    #[derive(Deserialize)]
    struct Record {
        path: PathBuf,
    }
    let record = super::CHAT_FOLDER_RECORD;
    let bytes = std::fs::read(root.join(record)).ok()?;
    let folder = match serde_json::from_slice::<Record>(&bytes) {
        Ok(r) if r.path.is_dir() => r.path,
        Ok(_) => {
            f.problem(record, "the chat folder it names is not a directory");
            return None;
        }
        Err(e) => {
            f.problem(record, format!("not a chat folder record: {e}"));
            return None;
        }
    };
    let mut chats = Vec::new();
    for c in list(&folder.join("chats")) {
        for name in list(&folder.join("chats").join(&c)) {
            let rel = format!("chats/{c}/{name}");
            if name.ends_with(".jsonl") && not_regular(&folder.join(&rel)).is_none() {
                chats.push(rel);
            }
        }
    }
    Some((folder, chats))
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

/// The memory table's saved image: read and checked against `memory.log` as an open would
/// (a damaged one is a problem the store works around; a stale one only a warning).
fn check_memory_image(root: &Path, f: &mut CheckReport) {
    use super::image::{load, Found};
    const IMAGE: &str = "memory.image";
    if let Some(what) = not_regular(&root.join(IMAGE)) {
        f.problem(
            IMAGE,
            format!("{what} where a file belongs; the store reads memory.log instead"),
        );
        return;
    }
    if !root.join(IMAGE).is_file() {
        return;
    }
    f.files += 1;
    match load::<crate::engine::memory_table::MemoryTable>(root, IMAGE, "memory.log") {
        Ok(Found::Fresh(table, _)) if !table.postings_whole() => f.problem(
            IMAGE,
            "torn or damaged (a posting list fails its checksum): the store rebuilds its search \
             index from the records when a search meets it, and saves a new image"
                .to_string(),
        ),
        Ok(Found::Fresh(table, _)) if !table.records_whole() => f.problem(
            IMAGE,
            "torn or damaged (a record does not read back: its checksum, fields or columns): \
             the store reads memory.log again when a call meets it, and saves a new image"
                .to_string(),
        ),
        Ok(Found::Fresh(..) | Found::Absent) => {}
        Ok(Found::Stale) => f.warnings.push(CheckFinding {
            file: IMAGE.into(),
            problem: "reflects an earlier memory.log (compacted or changed since) or is of another format version (an older release's): the store reads the log and saves a new image".into(),
        }),
        Ok(Found::Damaged(why)) => f.problem(
            IMAGE,
            format!("{why}: the store reads memory.log instead and saves a new image"),
        ),
        Err(e) => f.problem(IMAGE, format!("cannot be checked against memory.log ({e})")),
    }
}

fn check_file(root: &Path, rel: &str, kind: Kind, f: &mut CheckReport) {
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

fn check_chat(rel: &str, bytes: &[u8], f: &mut CheckReport) {
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

fn check_log(rel: &str, bytes: &[u8], f: &mut CheckReport, chain: &mut dyn Chain) {
    let (complete, tail) = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(end) => (Some(&bytes[..end]), &bytes[end + 1..]),
        None => (None, bytes),
    };
    let mut n = 0u64;
    for raw in complete.into_iter().flat_map(|c| c.split(|b| *b == b'\n')) {
        n += 1;
        let at = format!("{rel} line {n}");
        let payload = match super::log::verify_line(raw) {
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
