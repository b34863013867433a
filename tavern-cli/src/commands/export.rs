//! `tavern export memories|chat`: memories as a SillyTavern world book a user can read and
//! edit there, and chats as the `.jsonl` SillyTavern opens.

use std::path::Path;

use serde_json::{json, Map, Value};
use tavern_core::{CharacterName, ChatId, MemoryRecord};
use tavern_search::stopwords::is_stop_word;
use tavern_tools::assets::world::WorldBook;

use crate::cli::{ExportCommand, MemoryFilter};
use crate::output::source;
use crate::progress::Progress;
use crate::{backend, CliError, Context, Report};

/// Salient words added to a memory's tags as its keys.
const SALIENT_WORDS: usize = 3;

/// Runs an export.
///
/// # Errors
/// Usage errors and an existing file (without `--force`) before anything is written; a
/// missing chat; store and IO failures.
pub async fn run(ctx: &Context, command: ExportCommand) -> Result<Report, CliError> {
    match command {
        ExportCommand::Memories {
            world,
            scope,
            force,
        } => {
            let scope = scope.resolve()?;
            refuse_existing(&world, force)?;
            let stores = backend::open(ctx, false).await?.stores();
            let hits = super::memory::list(
                &*stores,
                scope.into_iter().collect(),
                &MemoryFilter::default(),
                None,
            )
            .await?;
            let progress = Progress::bar(ctx, hits.len() as u64, "exporting");
            let mut records: Vec<&MemoryRecord> = hits.iter().map(|h| &h.record).collect();
            // Oldest first, so a re-export of the same store lists entries in the same order.
            records.sort_by(|a, b| {
                a.created_at
                    .cmp(&b.created_at)
                    .then_with(|| a.scope.cmp(&b.scope))
                    .then_with(|| a.id.cmp(&b.id))
            });
            let mut entries = Map::new();
            for (uid, r) in records.iter().enumerate() {
                entries.insert(uid.to_string(), world_entry(uid, r));
                progress.inc();
            }
            drop(progress);
            let book = json!({ "entries": entries });
            let bytes = serde_json::to_vec_pretty(&book)
                .map_err(|e| CliError::Failed(format!("cannot encode the world book: {e}")))?;
            let label = world.display().to_string();
            let name = world.file_stem().map_or_else(
                || "memories".to_owned(),
                |s| s.to_string_lossy().into_owned(),
            );
            // What SillyTavern reads, we read: never write a book that does not load.
            let loaded = WorldBook::from_json(&name, &bytes)?;
            write_file(&world, &bytes, &label)?;
            let text = format!(
                "wrote {} memories to {label} as world book {name}\n",
                loaded.entries.len()
            );
            Ok(Report::new(
                text,
                json!({"file": label, "world": name, "entries": loaded.entries.len()}),
            ))
        }
        ExportCommand::Chat {
            character,
            chat,
            out,
            force,
        } => {
            let c = CharacterName::parse(character).map_err(|e| CliError::Usage(e.to_string()))?;
            let id = ChatId::parse(chat).map_err(|e| CliError::Usage(e.to_string()))?;
            refuse_existing(&out, force)?;
            let stores = backend::open(ctx, false).await?.stores();
            let progress = Progress::spinner(ctx, "exporting");
            let file = stores
                .read_chat(&c, &id)
                .await?
                .ok_or_else(|| CliError::NotFound(format!("chat {id} of {c} not found")))?;
            let text = file
                .lines
                .iter()
                .map(|l| l.raw())
                .collect::<Vec<_>>()
                .join("\n");
            let label = out.display().to_string();
            write_file(&out, text.as_bytes(), &label)?;
            drop(progress);
            Ok(Report::new(
                format!(
                    "wrote chat {id} of {c} ({} lines) to {label}\n",
                    file.lines.len()
                ),
                json!({"file": label, "character": c, "chat": id, "lines": file.lines.len()}),
            ))
        }
    }
}

fn refuse_existing(path: &Path, force: bool) -> Result<(), CliError> {
    if !force && path.exists() {
        return Err(CliError::Failed(format!(
            "{} exists; pass --force to replace it",
            path.display()
        )));
    }
    Ok(())
}

/// Writes a file atomically (temporary file beside it, synced, renamed).
fn write_file(path: &Path, bytes: &[u8], label: &str) -> Result<(), CliError> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| CliError::Usage(format!("{label} does not name a file")))?;
    let tmp = dir.join(format!(".tmp-export-{}-{name}", std::process::id()));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(CliError::io("write", label)(e));
    }
    Ok(())
}

/// One memory as a SillyTavern world entry (the current world-file field set).
pub fn world_entry(uid: usize, r: &MemoryRecord) -> Value {
    let mut keys: Vec<String> = Vec::new();
    let candidates = r
        .tags
        .iter()
        .map(|t| t.as_str().to_owned())
        .chain(salient_words(&r.content, SALIENT_WORDS));
    for k in candidates {
        if !keys
            .iter()
            .any(|have| have.to_lowercase() == k.to_lowercase())
        {
            keys.push(k);
        }
    }
    if keys.is_empty() {
        keys.push(r.id.to_string());
    }
    let session = r
        .source
        .session
        .as_ref()
        .map_or_else(|| "-".to_owned(), ToString::to_string);
    let comment = format!(
        "AgentTavern memory {} (revision {}, scope {}, {} {}, source {}, session {})",
        r.id,
        r.revision,
        r.scope,
        r.kind.as_str(),
        crate::output::time(r.updated_at),
        source(&r.source),
        session,
    );
    json!({
        "uid": uid,
        "key": keys,
        "keysecondary": [],
        "comment": comment,
        "content": r.content,
        "constant": false,
        "vectorized": false,
        "selective": true,
        "selectiveLogic": 0,
        "addMemo": true,
        "order": 100,
        "position": 0,
        "disable": false,
        "excludeRecursion": false,
        "preventRecursion": false,
        "delayUntilRecursion": false,
        "probability": 100,
        "useProbability": true,
        "depth": 4,
        "group": "",
        "groupOverride": false,
        "groupWeight": 100,
        "scanDepth": null,
        "caseSensitive": null,
        "matchWholeWords": null,
        "useGroupScoring": null,
        "automationId": "",
        "role": null,
        "sticky": 0,
        "cooldown": 0,
        "delay": 0,
        "displayIndex": uid,
    })
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xAC00..=0xD7AF | 0xF900..=0xFAFF)
}

/// Up to `n` words that say what a text is about: Latin words of three or more letters and
/// short CJK runs (two to six characters), without stop words, most frequent first (ties:
/// longer, then earlier).
pub fn salient_words(text: &str, n: usize) -> Vec<String> {
    let mut runs: Vec<(String, bool)> = Vec::new();
    let mut cur = String::new();
    let mut cur_cjk = false;
    for c in text.chars() {
        let cjk = is_cjk(c);
        let word = cjk || c.is_alphanumeric() || c == '\'';
        if (!word || cjk != cur_cjk) && !cur.is_empty() {
            runs.push((std::mem::take(&mut cur), cur_cjk));
        }
        if word {
            cur_cjk = cjk;
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        runs.push((cur, cur_cjk));
    }
    // (word, count, first position)
    let mut seen: Vec<(String, usize, usize)> = Vec::new();
    for (pos, (run, cjk)) in runs.into_iter().enumerate() {
        let word = if cjk {
            let len = run.chars().count();
            if !(2..=6).contains(&len) || is_stop_word(&run) {
                continue;
            }
            run
        } else {
            let lower = run.trim_matches('\'').to_lowercase();
            let lower = lower.strip_suffix("'s").unwrap_or(&lower).to_owned();
            if lower.chars().count() < 3
                || lower.chars().all(|c| c.is_ascii_digit())
                || is_stop_word(&lower)
            {
                continue;
            }
            lower
        };
        match seen.iter_mut().find(|(w, _, _)| *w == word) {
            Some(e) => e.1 += 1,
            None => seen.push((word, 1, pos)),
        }
    }
    seen.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then(b.0.chars().count().cmp(&a.0.chars().count()))
            .then(a.2.cmp(&b.2))
    });
    seen.into_iter().take(n).map(|(w, _, _)| w).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salient_words_skip_stop_words_and_prefer_frequent_long_words() {
        assert_eq!(
            salient_words("Kai fears deep water; the water at the silver gate.", 3),
            vec!["water", "silver", "fears"]
        );
        assert_eq!(
            salient_words("银色大门，月光下的银色大门", 1),
            vec!["银色大门"]
        );
        assert!(salient_words("the and is", 3).is_empty());
    }
}
