//! `tavern import-st DIR`: a SillyTavern user folder into the data directory. Cards, world
//! books and group files are validated and copied to `<data>/assets/{characters,worlds,groups}`
//! (where `tavern-bridge --assets` finds them by name), the persona and book selection of
//! `settings.json` to `<data>/assets/settings.json`; chats go through the chat store byte-exact.
//! Idempotent: what exists identically is skipped, what exists differently is a conflict and
//! left alone; `--dry-run` writes nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use tavern_core::chat::{ChatDocument, ChatLine};
use tavern_core::{CharacterName, ChatId};
use tavern_store::AllStores;
use tavern_tools::assets::group::{Group, MAX_GROUP_FILE_BYTES};
use tavern_tools::assets::personas::Personas;
use tavern_tools::assets::world::WorldBook;

use crate::cli::ImportArgs;
use crate::output::table;
use crate::progress::Progress;
use crate::{backend, CliError, Context, Report};

/// Where group chats go when no `groups/*.json` lists them.
pub const UNLISTED_GROUP: &str = "group chats";

/// What happened to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Written.
    Imported,
    /// Would be written (`--dry-run`).
    WouldImport,
    /// Already there with identical content.
    AlreadyImported,
    /// Continued in SillyTavern since it was imported: the stored copy was a prefix of the
    /// file, and the new lines (this many) were appended.
    Updated(usize),
    /// Would be updated so (`--dry-run`).
    WouldUpdate(usize),
    /// Something different is there; left alone.
    Conflict(String),
    /// The file is not valid; skipped.
    Invalid(String),
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Self::Imported => "imported",
            Self::WouldImport => "would-import",
            Self::AlreadyImported => "already-imported",
            Self::Updated(_) => "updated",
            Self::WouldUpdate(_) => "would-update",
            Self::Conflict(_) => "conflict",
            Self::Invalid(_) => "invalid",
        }
    }

    fn reason(&self) -> Option<&str> {
        match self {
            Self::Conflict(r) | Self::Invalid(r) => Some(r),
            _ => None,
        }
    }
}

/// One file of the folder and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// `card`, `world`, `group`, `chat`, `group-chat` or `settings`.
    pub kind: &'static str,
    /// The file, relative to the imported folder.
    pub source: String,
    /// Where it goes: an asset file relative to the data directory, or `character / chat`.
    pub target: String,
    /// What happened.
    pub outcome: Outcome,
}

/// A file found in the folder, before it is looked at.
struct Candidate {
    kind: &'static str,
    rel: String,
    path: PathBuf,
    /// For chats: the character folder (or group name).
    character: Option<String>,
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// Whether `path` is a regular file (a link is not followed: a link out of the folder, or to a
/// device, is never read).
fn regular(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// Whether `path` is a directory itself (not a link to one).
fn real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_dir())
}

fn has_ext(path: &Path, exts: &[&str]) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| exts.contains(&e.to_ascii_lowercase().as_str()))
}

fn ext_is(path: &Path, exts: &[&str]) -> bool {
    regular(path)
        && path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| exts.contains(&e.to_ascii_lowercase().as_str()))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Chat id → group name, from `groups/*.json` (`{"name": …, "chats": [ids]}`).
fn group_names(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for path in sorted_entries(&dir.join("groups")) {
        if !ext_is(&path, &["json"]) {
            continue;
        }
        // A group file is a few KiB; one over the limit is not a group file.
        let Ok(v) = read_capped(&path, MAX_GROUP_FILE_BYTES, 1)
            .map(|b| serde_json::from_slice::<Value>(&b))
        else {
            continue;
        };
        let Ok(v) = v else { continue };
        let Some(name) = v.get("name").and_then(Value::as_str) else {
            continue;
        };
        for chat in v
            .get("chats")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(id) = chat.as_str() {
                out.entry(id.to_owned()).or_insert_with(|| name.to_owned());
            }
        }
    }
    out
}

/// What the scan skipped: `(path relative to the folder, why)`.
type Skipped = Vec<(String, String)>;

/// A file that would be a candidate but is not a regular file: skipped, with the reason.
fn not_followed(path: &Path, rel: String, exts: &[&str], skipped: &mut Skipped) -> bool {
    if has_ext(path, exts) && !regular(path) {
        let what = match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => "a symbolic link (not followed)",
            _ => "not a regular file",
        };
        skipped.push((rel, what.to_owned()));
        return true;
    }
    false
}

fn candidates(dir: &Path, skipped: &mut Skipped) -> Vec<Candidate> {
    let mut out = Vec::new();
    for path in sorted_entries(&dir.join("characters")) {
        let rel = format!("characters/{}", file_name(&path));
        if not_followed(&path, rel, &["png", "json"], skipped) {
            continue;
        }
        if ext_is(&path, &["png", "json"]) {
            out.push(Candidate {
                kind: "card",
                rel: format!("characters/{}", file_name(&path)),
                path,
                character: None,
            });
        }
    }
    for path in sorted_entries(&dir.join("worlds")) {
        if not_followed(
            &path,
            format!("worlds/{}", file_name(&path)),
            &["json"],
            skipped,
        ) {
            continue;
        }
        if ext_is(&path, &["json"]) {
            out.push(Candidate {
                kind: "world",
                rel: format!("worlds/{}", file_name(&path)),
                path,
                character: None,
            });
        }
    }
    for path in sorted_entries(&dir.join("groups")) {
        if not_followed(
            &path,
            format!("groups/{}", file_name(&path)),
            &["json"],
            skipped,
        ) {
            continue;
        }
        if ext_is(&path, &["json"]) {
            out.push(Candidate {
                kind: "group",
                rel: format!("groups/{}", file_name(&path)),
                path,
                character: None,
            });
        }
    }
    for folder in sorted_entries(&dir.join("chats")) {
        if regular(&folder) && has_ext(&folder, &["jsonl"]) {
            // SillyTavern keeps a character's chats in chats/<character>/: a file here names
            // no character, so it cannot be placed.
            skipped.push((
                format!("chats/{}", file_name(&folder)),
                "a chat outside a character folder: move it into chats/<character>/ to import it"
                    .to_owned(),
            ));
            continue;
        }
        if !real_dir(&folder) {
            if folder.is_dir() {
                skipped.push((
                    format!("chats/{}", file_name(&folder)),
                    "a symbolic link (not followed)".to_owned(),
                ));
            }
            continue;
        }
        let character = file_name(&folder);
        for path in sorted_entries(&folder) {
            let rel = format!("chats/{character}/{}", file_name(&path));
            if not_followed(&path, rel, &["jsonl"], skipped) {
                continue;
            }
            if ext_is(&path, &["jsonl"]) {
                out.push(Candidate {
                    kind: "chat",
                    rel: format!("chats/{character}/{}", file_name(&path)),
                    path,
                    character: Some(character.clone()),
                });
            }
        }
    }
    let groups = group_names(dir);
    for path in sorted_entries(&dir.join("group chats")) {
        let rel = format!("group chats/{}", file_name(&path));
        if not_followed(&path, rel, &["jsonl"], skipped) {
            continue;
        }
        if ext_is(&path, &["jsonl"]) {
            let group = groups
                .get(&stem(&path))
                .cloned()
                .unwrap_or_else(|| UNLISTED_GROUP.to_owned());
            out.push(Candidate {
                kind: "group-chat",
                rel: format!("group chats/{}", file_name(&path)),
                path,
                character: Some(group),
            });
        }
    }
    out
}

/// Runs the import.
///
/// # Errors
/// [`CliError::NotFound`] when DIR is not a SillyTavern folder (nothing is written then);
/// store failures.
pub async fn run(ctx: &Context, args: &ImportArgs) -> Result<Report, CliError> {
    let dir = &args.dir;
    let label = dir.display().to_string();
    if !dir.is_dir() {
        return Err(CliError::NotFound(format!("{label}: no such directory")));
    }
    if !["characters", "worlds", "chats", "group chats"]
        .iter()
        .any(|d| dir.join(d).is_dir())
    {
        return Err(CliError::NotFound(format!(
            "{label} is not a SillyTavern user folder: it has no characters/, worlds/, chats/ or group chats/"
        )));
    }
    let mut skipped = Skipped::new();
    let found = candidates(dir, &mut skipped);
    let max_bytes = args.max_file_mib.saturating_mul(1024 * 1024);
    let stores = if args.dry_run {
        match backend::store_exists(ctx) {
            true => Some(backend::open(ctx, false).await?.stores()),
            false => None,
        }
    } else {
        Some(backend::open(ctx, true).await?.stores())
    };
    let progress = Progress::bar(ctx, found.len() as u64, "importing");
    let mut found_links = Links::default();
    let mut items = Vec::with_capacity(found.len() + skipped.len());
    for (rel, why) in skipped {
        items.push(Item {
            kind: "skipped",
            source: rel,
            target: String::new(),
            outcome: Outcome::Invalid(why),
        });
    }
    for c in found {
        // One file that cannot be read (or is too large) is reported; the rest go on.
        let bytes = match read_capped(&c.path, max_bytes, args.max_file_mib) {
            Ok(bytes) => bytes,
            Err(why) => {
                items.push(Item {
                    kind: c.kind,
                    source: c.rel.clone(),
                    target: String::new(),
                    outcome: Outcome::Invalid(why),
                });
                progress.inc();
                continue;
            }
        };
        note_parent(&c, &bytes, &mut found_links);
        let item = match c.kind {
            "card" | "world" | "group" => {
                import_asset(ctx, &c, bytes, args.dry_run, &mut found_links)?
            }
            _ => import_chat(stores.as_ref(), &c, bytes, args.dry_run).await?,
        };
        tracing::info!(source = %item.source, result = item.outcome.label(), "import");
        items.push(item);
        progress.inc();
    }
    drop(progress);
    if let Some(item) = import_settings(ctx, dir, args.max_file_mib, args.dry_run)? {
        tracing::info!(source = %item.source, result = item.outcome.label(), "import");
        items.push(item);
    }
    let mut report = report(&items, args.dry_run);
    report
        .warnings
        .extend(missing_links(ctx, dir, stores.as_ref(), &found_links).await);
    Ok(report)
}

/// What imported cards and chats point at that is not there: a card's linked world (its lore
/// would be missing) and a branch's parent chat (history could not follow it), each one line.
async fn missing_links(
    ctx: &Context,
    dir: &Path,
    stores: Option<&Arc<dyn AllStores>>,
    links: &Links,
) -> Vec<String> {
    let mut worlds: std::collections::BTreeSet<String> = sorted_entries(&dir.join("worlds"))
        .iter()
        .chain(sorted_entries(&ctx.assets_dir().join("worlds")).iter())
        .filter(|p| has_ext(p, &["json"]))
        .map(|p| stem(p))
        .collect();
    worlds.insert(String::new());
    let mut out = Vec::new();
    for (source, world) in &links.worlds {
        if !worlds.contains(world) {
            out.push(format!(
                "{source} links the world {world:?}, which is neither in worlds/ nor imported: its lore will be missing"
            ));
        }
    }
    for (source, folder, parent) in &links.parents {
        let here = dir
            .join("chats")
            .join(folder)
            .join(format!("{parent}.jsonl"));
        let stored = match (
            stores,
            CharacterName::parse(folder.as_str()),
            ChatId::parse(parent.as_str()),
        ) {
            (Some(stores), Ok(c), Ok(p)) => {
                stores.chat_revision(&c, &p).await.ok().flatten().is_some()
            }
            _ => false,
        };
        if !regular(&here) && !stored {
            out.push(format!(
                "{source} was branched from the chat {parent:?}, which is neither in chats/{folder}/ nor stored: history cannot follow it"
            ));
        }
    }
    out
}

/// What imported files point at, for [`missing_links`].
#[derive(Default)]
struct Links {
    /// `(card, linked world)`.
    worlds: Vec<(String, String)>,
    /// `(chat, its folder, the chat it was branched from)`.
    parents: Vec<(String, String, String)>,
}

fn report(items: &[Item], dry_run: bool) -> Report {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| {
            vec![
                i.kind.to_owned(),
                i.source.clone(),
                i.outcome.label().to_owned(),
                match &i.outcome {
                    Outcome::Updated(n) | Outcome::WouldUpdate(n) => {
                        format!("{} (+{n} lines)", i.target)
                    }
                    other => other
                        .reason()
                        .map_or_else(|| i.target.clone(), str::to_owned),
                },
            ]
        })
        .collect();
    let count = |label: &str| items.iter().filter(|i| i.outcome.label() == label).count();
    let summary = json!({
        "imported": count("imported"),
        "wouldImport": count("would-import"),
        "alreadyImported": count("already-imported"),
        "updated": count("updated"),
        "wouldUpdate": count("would-update"),
        "conflict": count("conflict"),
        "invalid": count("invalid"),
    });
    let mut text = if rows.is_empty() {
        "nothing to import\n".to_owned()
    } else {
        table(&["KIND", "SOURCE", "RESULT", "TARGET OR REASON"], &rows)
    };
    text.push_str(&format!(
        "{}, {} already imported, {} conflicts, {} invalid{}\n",
        if dry_run {
            format!(
                "dry run: {} would be imported, {} updated",
                count("would-import"),
                count("would-update")
            )
        } else {
            format!(
                "{} imported, {} updated",
                count("imported"),
                count("updated")
            )
        },
        count("already-imported"),
        count("conflict"),
        count("invalid"),
        if dry_run { "; nothing was changed" } else { "" },
    ));
    let json = json!({
        "dryRun": dry_run,
        "items": items.iter().map(|i| json!({
            "kind": i.kind,
            "source": i.source,
            "target": i.target,
            "result": i.outcome.label(),
            "reason": i.outcome.reason(),
            "appended": match i.outcome {
                Outcome::Updated(n) | Outcome::WouldUpdate(n) => Some(n),
                _ => None,
            },
        })).collect::<Vec<_>>(),
        "summary": summary,
    });
    let mut report = Report::new(text, json);
    let left = count("conflict") + count("invalid");
    if left > 0 {
        report.warnings.push(format!(
            "{left} file{} not imported (conflict or invalid); see the report",
            if left == 1 { " was" } else { "s were" }
        ));
    }
    report
}

/// Notes the chat a chat was branched from (its header's `chat_metadata.main_chat`).
fn note_parent(c: &Candidate, bytes: &[u8], links: &mut Links) {
    if c.kind != "chat" {
        return;
    }
    let first = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    let parent = serde_json::from_slice::<Value>(first).ok().and_then(|h| {
        h.get("chat_metadata")?
            .get("main_chat")?
            .as_str()
            .filter(|p| !p.trim().is_empty())
            .map(str::to_owned)
    });
    if let (Some(parent), Some(folder)) = (parent, &c.character) {
        links.parents.push((c.rel.clone(), folder.clone(), parent));
    }
}

/// Reads a candidate whole, unless it is larger than `max` bytes (checked before reading: a
/// sparse 2 GiB file is never loaded).
fn read_capped(path: &Path, max: u64, max_mib: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot be read: {}", e.kind()))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot be read: {}", e.kind()))?
        .len();
    if len > max {
        return Err(format!(
            "{:.1} MiB, over the {max_mib} MiB limit (--max-file-mib)",
            len as f64 / 1048576.0
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // `take`: a file that grows while it is read still stops at the limit.
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {}", e.kind()))?;
    if bytes.len() as u64 > max {
        return Err(format!("over the {max_mib} MiB limit (--max-file-mib)"));
    }
    Ok(bytes)
}

fn import_asset(
    ctx: &Context,
    c: &Candidate,
    bytes: Vec<u8>,
    dry_run: bool,
    links: &mut Links,
) -> Result<Item, CliError> {
    let folder = match c.kind {
        "card" => "characters",
        "group" => "groups",
        _ => "worlds",
    };
    let name = file_name(&c.path);
    let target = format!("assets/{folder}/{name}");
    let item = |outcome| Item {
        kind: c.kind,
        source: c.rel.clone(),
        target: target.clone(),
        outcome,
    };
    let stem = stem(&c.path);
    let valid = if c.kind == "card" {
        CharacterName::parse(stem.as_str())
            .map_err(|e| e.to_string())
            .and_then(|_| super::card::inspect(&c.rel, &bytes).map_err(|e| e.to_string()))
            .map(|info| {
                // What the card links, for `missing_links` (the card is parsed once, here).
                if let Some(world) = info.card.linked_world().filter(|w| !w.trim().is_empty()) {
                    links.worlds.push((c.rel.clone(), world.to_owned()));
                }
            })
    } else if c.kind == "group" {
        // Group files are named by id; the tools find a group by the name inside.
        if bytes.len() as u64 > MAX_GROUP_FILE_BYTES {
            Err(format!(
                "over {MAX_GROUP_FILE_BYTES} bytes: not a SillyTavern group file"
            ))
        } else {
            Group::from_json(&c.rel, &bytes)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    } else {
        WorldBook::from_json(&stem, &bytes)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    if let Err(reason) = valid {
        return Ok(item(Outcome::Invalid(reason)));
    }
    let dest_dir = ctx.assets_dir().join(folder);
    let dest = dest_dir.join(&name);
    if dest.exists() {
        let same = std::fs::read(&dest).is_ok_and(|have| have == bytes);
        return Ok(item(if same {
            Outcome::AlreadyImported
        } else {
            Outcome::Conflict(format!("a different file is already imported as {target}"))
        }));
    }
    // Sessions find assets by name: another file with this name (say .json beside .png)
    // would make the name ambiguous.
    if let Some(other) = sorted_entries(&dest_dir)
        .into_iter()
        .find(|p| p.is_file() && stem_matches(p, &stem) && ext_is(p, &["png", "json"]))
    {
        return Ok(item(Outcome::Conflict(format!(
            "assets/{folder}/{} already has the name {stem}",
            file_name(&other)
        ))));
    }
    if dry_run {
        return Ok(item(Outcome::WouldImport));
    }
    write_new(&dest_dir, &name, &bytes, &target)?;
    Ok(item(Outcome::Imported))
}

/// The personas of the folder's `settings.json` (names, descriptions, the default and the
/// selection) and its active world books (global, and each character's extra books), kept as
/// `assets/settings.json` — only those fields: the rest of the file holds
/// API settings and proxies, which stay in the user's folder. A later import replaces them
/// (the user's current choice); `None` when the folder has no `settings.json`.
fn import_settings(
    ctx: &Context,
    dir: &Path,
    max_mib: u64,
    dry_run: bool,
) -> Result<Option<Item>, CliError> {
    let path = dir.join("settings.json");
    let Ok(meta) = std::fs::symlink_metadata(&path) else {
        return Ok(None);
    };
    let target = "assets/settings.json";
    let item = |outcome| Item {
        kind: "settings",
        source: "settings.json".into(),
        target: target.into(),
        outcome,
    };
    if !meta.is_file() {
        return Ok(Some(item(Outcome::Invalid(
            "not a regular file (links are not followed)".into(),
        ))));
    }
    let bytes = match read_capped(&path, max_mib.saturating_mul(1024 * 1024), max_mib) {
        Ok(bytes) => bytes,
        Err(why) => return Ok(Some(item(Outcome::Invalid(why)))),
    };
    let personas = match Personas::from_settings(&bytes) {
        Ok(p) if p.by_avatar.is_empty() && p.username.is_none() && p.lore == Default::default() => {
            return Ok(Some(item(Outcome::Invalid(
                "it names no persona, no user name and no active world book".into(),
            ))))
        }
        Ok(p) => p,
        Err(e) => return Ok(Some(item(Outcome::Invalid(e.to_string())))),
    };
    let kept = serde_json::to_vec_pretty(&personas.to_settings())
        .map_err(|e| CliError::Failed(format!("settings.json: {e}")))?;
    let dest_dir = ctx.assets_dir();
    if std::fs::read(dest_dir.join("settings.json")).is_ok_and(|have| have == kept) {
        return Ok(Some(item(Outcome::AlreadyImported)));
    }
    if dry_run {
        return Ok(Some(item(Outcome::WouldImport)));
    }
    write_new(&dest_dir, "settings.json", &kept, target)?;
    Ok(Some(item(Outcome::Imported)))
}

fn stem_matches(path: &Path, stem: &str) -> bool {
    path.file_stem().and_then(|s| s.to_str()) == Some(stem)
}

/// Writes a new file atomically: a temporary file in the same folder, synced, then renamed.
fn write_new(dir: &Path, name: &str, bytes: &[u8], label: &str) -> Result<(), CliError> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(CliError::io("create the folder of", label))?;
    // A short temporary name: a legal 240-byte card name plus a prefix would pass the file
    // system's 255-byte limit.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp-import-{}-{n}", std::process::id()));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, dir.join(name)));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(CliError::io("write", label)(e));
    }
    Ok(())
}

async fn import_chat(
    stores: Option<&Arc<dyn AllStores>>,
    c: &Candidate,
    bytes: Vec<u8>,
    dry_run: bool,
) -> Result<Item, CliError> {
    let folder = c.character.clone().unwrap_or_default();
    let chat_stem = stem(&c.path);
    let mut item = Item {
        kind: c.kind,
        source: c.rel.clone(),
        target: format!("{folder} / {chat_stem}"),
        outcome: Outcome::Invalid(String::new()),
    };
    let character = match CharacterName::parse(folder.as_str()) {
        Ok(c) => c,
        Err(e) => {
            item.outcome = Outcome::Invalid(e.to_string());
            return Ok(item);
        }
    };
    let chat = match ChatId::parse(chat_stem.as_str()) {
        Ok(c) => c,
        Err(e) => {
            item.outcome = Outcome::Invalid(e.to_string());
            return Ok(item);
        }
    };
    let doc = match std::str::from_utf8(&bytes)
        .map_err(|_| "the file is not utf-8".to_owned())
        .and_then(|text| ChatDocument::parse(text).map_err(|e| e.to_string()))
    {
        Ok(doc) => doc,
        Err(reason) => {
            item.outcome = Outcome::Invalid(reason);
            return Ok(item);
        }
    };
    let lines: Vec<ChatLine> = doc.lines().cloned().collect();
    let Some(stores) = stores else {
        // A dry run on a data directory without a store: everything would be new.
        item.outcome = Outcome::WouldImport;
        return Ok(item);
    };
    if let Some(existing) = stores.read_chat(&character, &chat).await? {
        let prefix = existing.lines.len() <= lines.len()
            && existing
                .lines
                .iter()
                .zip(&lines)
                .all(|(a, b)| a.raw() == b.raw());
        let added = lines.len() - existing.lines.len().min(lines.len());
        item.outcome = match (prefix, added) {
            (true, 0) => Outcome::AlreadyImported,
            // Continued in SillyTavern since the import: the new lines are appended, at the
            // revision just read (a chat changed meanwhile is a conflict, never overwritten).
            (true, n) if dry_run => Outcome::WouldUpdate(n),
            (true, n) => match stores
                .append_lines(
                    &character,
                    &chat,
                    &lines[existing.lines.len()..],
                    &existing.revision,
                )
                .await
            {
                Ok(_) => Outcome::Updated(n),
                Err(e) if e.is_conflict() => Outcome::Conflict(format!(
                    "chat {chat} of {character} changed while it was being updated"
                )),
                Err(e) => return Err(e.into()),
            },
            (false, _) => Outcome::Conflict(format!(
                "a different chat {chat} of {character} exists ({} lines stored, {} in the file, \
                 and the stored ones are not where the file begins)",
                existing.lines.len(),
                lines.len()
            )),
        };
        return Ok(item);
    }
    if dry_run {
        item.outcome = Outcome::WouldImport;
        return Ok(item);
    }
    item.outcome = match stores.rewrite_chat(&character, &chat, &lines, None).await {
        Ok(_) => Outcome::Imported,
        Err(e) if e.is_conflict() => {
            Outcome::Conflict(format!("chat {chat} of {character} was created meanwhile"))
        }
        Err(e) => return Err(e.into()),
    };
    Ok(item)
}
