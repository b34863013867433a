//! SillyTavern chats on disk: `chats/<character>/<chat>.jsonl`, written in SillyTavern's own
//! style (lines joined by `\n`, no trailing newline) so either program can keep using the file.
//! Folder and file names are the character name and chat id themselves, with only what some file
//! system refuses escaped ([`encode_readable`]); chats written by the earlier all-escaped layout
//! are moved to these names when the store opens.
//!
//! A chat's revision is derived from the file's length, inode, modification time and a digest
//! of its last 4 KiB, so a whole-file rewrite by another program (which SillyTavern does with
//! write-temp + rename) is detected without reading the whole file. Appends check the revision
//! under our lock and, after writing, that the path still names the file written to; a rename
//! that raced the append is reported as a conflict so the caller re-reads and retries.
//! `read_chat_since` reads only the bytes appended after an earlier revision when the file is the
//! same (inode) and its old last 4 KiB are unchanged, so keeping up with a long chat costs what
//! was appended.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use async_trait::async_trait;
use tavern_core::chat::ChatLine;
use tavern_core::revision::short_digest;
use tavern_core::{CharacterName, ChatId};

use super::atomic::{ensure_dir, io_err, sync_dir, under, write_atomic, FileLock};
use super::names::{decode, decode_readable, encode_readable};
use super::{FsStore, Inner};
use crate::chat::{check_not_empty, parse_lines, ChatChange, ChatFile, ChatRevision, ChatStore};
use crate::error::{StoreError, Target};

const TAIL_BYTES: u64 = 4096;

fn chat_rel(character: &CharacterName, chat: &ChatId) -> String {
    format!(
        "chats/{}/{}.jsonl",
        encode_readable(character.as_str()),
        encode_readable(chat.as_str())
    )
}

fn lock_rel(character: &CharacterName, chat: &ChatId) -> String {
    format!(
        "chats/{}/{}.lock",
        encode_readable(character.as_str()),
        encode_readable(chat.as_str())
    )
}

/// The revision of an open file, from its metadata and tail.
fn revision_of(file: &mut std::fs::File, rel: &str) -> Result<ChatRevision, StoreError> {
    let meta = file.metadata().map_err(io_err("stat", rel))?;
    let len = meta.len();
    let start = len.saturating_sub(TAIL_BYTES);
    file.seek(SeekFrom::Start(start))
        .map_err(io_err("seek", rel))?;
    let mut tail = Vec::with_capacity(usize::try_from(len - start).unwrap_or(0));
    file.read_to_end(&mut tail).map_err(io_err("read", rel))?;
    Ok(revision_from(&meta, len, &tail))
}

/// The revision of a file of `len` bytes (as `meta` saw it) whose last bytes are `tail` (at
/// least the last [`TAIL_BYTES`], or the whole file).
fn revision_from(meta: &std::fs::Metadata, len: u64, tail: &[u8]) -> ChatRevision {
    let keep = usize::try_from(TAIL_BYTES.min(len)).unwrap_or(tail.len());
    let tail = &tail[tail.len().saturating_sub(keep)..];
    let (ino, mtime) = identity(meta);
    ChatRevision::new(format!("c1-{len}-{ino}-{mtime}-{}", short_digest(&[tail])))
}

/// What a revision issued by [`revision_from`] says: length, inode and digest of the tail.
struct RevisionParts<'a> {
    len: u64,
    ino: u64,
    digest: &'a str,
}

fn parse_revision(revision: &ChatRevision) -> Option<RevisionParts<'_>> {
    let rest = revision.as_str().strip_prefix("c1-")?;
    let mut parts = rest.splitn(3, '-');
    let len = parts.next()?.parse().ok()?;
    let ino = parts.next()?.parse().ok()?;
    // The modification time may be negative, so the digest is found from the right.
    let (_mtime, digest) = parts.next()?.rsplit_once('-')?;
    Some(RevisionParts { len, ino, digest })
}

/// Reads an open file as it was when `meta` was taken (a concurrent append after that is not
/// read, so the lines and the revision always agree).
fn read_whole(
    file: &mut std::fs::File,
    meta: &std::fs::Metadata,
    rel: &str,
) -> Result<ChatFile, StoreError> {
    let len = meta.len();
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.seek(SeekFrom::Start(0)).map_err(io_err("seek", rel))?;
    file.take(len)
        .read_to_end(&mut bytes)
        .map_err(io_err("read", rel))?;
    if bytes.len() as u64 != len {
        // Shrunk while we read: a rewrite in place; read what is there now.
        let meta = file.metadata().map_err(io_err("stat", rel))?;
        if meta.len() < len {
            return read_whole(file, &meta, rel);
        }
    }
    let revision = revision_from(meta, len, &bytes);
    let text = String::from_utf8(bytes).map_err(|e| StoreError::Corrupt {
        file: rel.to_owned(),
        reason: format!("not UTF-8: {e}"),
    })?;
    let lines = parse_lines(rel, &text)?;
    Ok(ChatFile { lines, revision })
}

#[cfg(unix)]
fn identity(meta: &std::fs::Metadata) -> (u64, i128) {
    use std::os::unix::fs::MetadataExt;
    (
        meta.ino(),
        i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    )
}

#[cfg(not(unix))]
fn identity(meta: &std::fs::Metadata) -> (u64, i128) {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128);
    (0, mtime)
}

fn open_existing(path: &Path, rel: &str) -> Result<Option<std::fs::File>, StoreError> {
    match std::fs::File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("open", rel)(e)),
    }
}

fn chat_target(character: &CharacterName, chat: &ChatId) -> Box<Target> {
    Box::new(Target::Chat {
        character: character.clone(),
        chat: chat.clone(),
    })
}

/// Joins lines as SillyTavern does: `\n` between lines, none at the end.
fn joined<'a>(lines: impl IntoIterator<Item = &'a ChatLine>, leading_break: bool) -> String {
    let mut text = String::new();
    for (i, line) in lines.into_iter().enumerate() {
        if leading_break || i > 0 {
            text.push('\n');
        }
        text.push_str(line.raw());
    }
    text
}

/// The legacy (all-escaped, `_`-prefixed) name's text, if `name` is one. Readable names never
/// start with `_`, so the two layouts cannot be confused.
fn legacy(name: &str) -> Option<String> {
    name.starts_with('_').then(|| decode(name)).flatten()
}

impl Inner {
    /// Moves chats of the earlier layout (`chats/_%4Dira/_c.jsonl`, every byte but `a-z0-9-_`
    /// escaped) to readable names (`chats/Mira/c.jsonl`). A chat whose readable name is already
    /// taken stays where it is, with a diagnostic; old lock files are removed. Runs at open.
    pub(super) fn migrate_legacy_chat_names(&self) {
        let chats = self.root.join("chats");
        let Ok(entries) = std::fs::read_dir(&chats) else {
            return;
        };
        let mut dirs: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        dirs.sort();
        for dir in dirs {
            let target = legacy(&dir).map_or_else(|| dir.clone(), |c| encode_readable(&c));
            let mut source = dir.clone();
            if target != dir && !chats.join(&target).exists() {
                match std::fs::rename(chats.join(&dir), chats.join(&target)) {
                    Ok(()) => {
                        let _ = sync_dir(&chats, "chats");
                        self.diag(
                            &format!("chats/{dir}"),
                            format!("moved to the readable name chats/{target}"),
                        );
                        source.clone_from(&target);
                    }
                    Err(e) => {
                        self.diag(&format!("chats/{dir}"), format!("not moved: {e}"));
                        continue;
                    }
                }
            }
            self.migrate_legacy_chat_files(&source, &target);
            if source != target && std::fs::remove_dir(chats.join(&source)).is_ok() {
                let _ = sync_dir(&chats, "chats");
            }
        }
    }

    /// Moves legacy-named chat files of `chats/<source>` into `chats/<target>`.
    fn migrate_legacy_chat_files(&self, source: &str, target: &str) {
        let chats = self.root.join("chats");
        let Ok(entries) = std::fs::read_dir(chats.join(source)) else {
            return;
        };
        let mut files: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        files.sort();
        let mut moved = false;
        for file in files {
            let from = chats.join(source).join(&file);
            if file.strip_suffix(".lock").and_then(legacy).is_some() {
                let _ = std::fs::remove_file(&from);
                continue;
            }
            let Some(chat) = file.strip_suffix(".jsonl").and_then(legacy) else {
                if source != target {
                    // Anything else in a legacy folder (a set-aside file) moves along unchanged.
                    let to = chats.join(target).join(&file);
                    if !to.exists() && std::fs::rename(&from, &to).is_ok() {
                        moved = true;
                    }
                }
                continue;
            };
            let new_name = format!("{}.jsonl", encode_readable(&chat));
            let to = chats.join(target).join(&new_name);
            if to.exists() {
                self.diag(
                    &format!("chats/{source}/{file}"),
                    format!("not moved: chats/{target}/{new_name} already exists"),
                );
                continue;
            }
            match std::fs::create_dir_all(chats.join(target))
                .and_then(|()| std::fs::rename(&from, &to))
            {
                Ok(()) => moved = true,
                Err(e) => self.diag(&format!("chats/{source}/{file}"), format!("not moved: {e}")),
            }
        }
        if moved {
            let _ = sync_dir(&chats.join(target), "chats");
            let _ = sync_dir(&chats.join(source), "chats");
        }
    }

    fn chat_revision_now(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatRevision>, StoreError> {
        let rel = chat_rel(character, chat);
        match open_existing(&under(&self.root, &rel), &rel)? {
            Some(mut f) => revision_of(&mut f, &rel).map(Some),
            None => Ok(None),
        }
    }

    /// Characters with a chat folder, by name (folders this layout would not write are
    /// skipped).
    pub(super) fn chat_characters(&self) -> Result<Vec<CharacterName>, StoreError> {
        let entries = match std::fs::read_dir(under(&self.root, "chats")) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list", "chats")(e)),
        };
        let mut out: Vec<CharacterName> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|n| decode_readable(&n))
            .filter_map(|n| CharacterName::parse(n).ok())
            .collect();
        out.sort();
        Ok(out)
    }

    fn list_chats(&self, character: &CharacterName) -> Result<Vec<ChatId>, StoreError> {
        let rel = format!("chats/{}", encode_readable(character.as_str()));
        let entries = match std::fs::read_dir(under(&self.root, &rel)) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list", &rel)(e)),
        };
        let mut out: Vec<ChatId> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix(".jsonl").and_then(decode_readable))
            .filter_map(|n| ChatId::parse(n).ok())
            .collect();
        out.sort();
        Ok(out)
    }

    fn read_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatFile>, StoreError> {
        let rel = chat_rel(character, chat);
        let Some(mut file) = open_existing(&under(&self.root, &rel), &rel)? else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(io_err("stat", &rel))?;
        read_whole(&mut file, &meta, &rel).map(Some)
    }

    /// Reads only what was appended since `since` when the file is the same file (inode), no
    /// shorter, and its bytes up to the old length end as they did then (the digest of the
    /// last [`TAIL_BYTES`] in `since`); otherwise the whole chat. A rewrite by SillyTavern
    /// (temp + rename) changes the inode; an in-place rewrite changes the old tail.
    fn read_chat_since(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        since: &ChatRevision,
    ) -> Result<Option<ChatChange>, StoreError> {
        let rel = chat_rel(character, chat);
        let Some(mut file) = open_existing(&under(&self.root, &rel), &rel)? else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(io_err("stat", &rel))?;
        let len = meta.len();
        let appended = match parse_revision(since) {
            Some(old) if old.ino == identity(&meta).0 && old.len <= len => {
                self.appended_since(&mut file, &meta, &old, &rel)?
            }
            _ => None,
        };
        match appended {
            Some((_, revision)) if &revision == since => Ok(Some(ChatChange::Unchanged)),
            Some((lines, revision)) => Ok(Some(ChatChange::Appended { lines, revision })),
            None => read_whole(&mut file, &meta, &rel).map(|f| Some(ChatChange::Whole(f))),
        }
    }

    /// The lines after `old.len` and the revision at `meta`, if the file up to `old.len` still
    /// ends as it did and the new bytes start a new line.
    fn appended_since(
        &self,
        file: &mut std::fs::File,
        meta: &std::fs::Metadata,
        old: &RevisionParts<'_>,
        rel: &str,
    ) -> Result<Option<(Vec<ChatLine>, ChatRevision)>, StoreError> {
        let len = meta.len();
        let from = old.len.saturating_sub(TAIL_BYTES);
        file.seek(SeekFrom::Start(from))
            .map_err(io_err("seek", rel))?;
        let mut buf = Vec::new();
        file.take(len - from)
            .read_to_end(&mut buf)
            .map_err(io_err("read", rel))?;
        let Ok(split) = usize::try_from(old.len - from) else {
            return Ok(None);
        };
        if buf.len() as u64 != len - from || short_digest(&[&buf[..split]]) != old.digest {
            return Ok(None);
        }
        let revision = revision_from(meta, len, &buf);
        let new = &buf[split..];
        let starts_line = split == 0
            || buf[split - 1] == b'\n'
            || new.is_empty()
            || new.starts_with(b"\n")
            || new.starts_with(b"\r\n");
        let Ok(text) = std::str::from_utf8(new) else {
            return Ok(None);
        };
        if !starts_line {
            return Ok(None);
        }
        // A line that does not parse (one being written by another process) is left to a
        // whole read, which reports it with its line number.
        Ok(parse_lines(rel, text).ok().map(|lines| (lines, revision)))
    }

    fn append_lines(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: &ChatRevision,
    ) -> Result<ChatRevision, StoreError> {
        let rel = chat_rel(character, chat);
        let path = under(&self.root, &rel);
        let _lock = FileLock::acquire(&self.root, &lock_rel(character, chat), true)?;
        let Some(mut file) = open_existing(&path, &rel)? else {
            return Err(StoreError::NotFound {
                target: chat_target(character, chat),
            });
        };
        if &revision_of(&mut file, &rel)? != expected {
            return Err(StoreError::Conflict {
                target: chat_target(character, chat),
                current: None,
            });
        }
        if lines.is_empty() {
            return Ok(expected.clone());
        }
        let mut out = std::fs::OpenOptions::new()
            .append(true)
            .read(true)
            .open(&path)
            .map_err(io_err("open", &rel))?;
        let len = out.metadata().map_err(io_err("stat", &rel))?.len();
        let text = joined(lines, len > 0);
        let synced = out
            .write_all(text.as_bytes())
            .map_err(io_err("append", &rel))
            .and_then(|()| out.sync_data().map_err(io_err("fsync", &rel)));
        if let Err(e) = synced {
            // Not acknowledged: take the lines back so a later read never shows them.
            let _ = out.set_len(len).and_then(|()| out.sync_data());
            return Err(e);
        }
        // Another program may have renamed a new file over the path while we wrote: then our
        // lines went to the replaced file and the caller must re-read and retry.
        let written = identity(&out.metadata().map_err(io_err("stat", &rel))?).0;
        let current = std::fs::metadata(&path).map(|m| identity(&m).0);
        if current.ok() != Some(written) {
            return Err(StoreError::Conflict {
                target: chat_target(character, chat),
                current: None,
            });
        }
        revision_of(&mut out, &rel)
    }

    fn rewrite_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: Option<&ChatRevision>,
    ) -> Result<ChatRevision, StoreError> {
        check_not_empty(lines)?;
        ensure_dir(
            &self.root,
            &format!("chats/{}", encode_readable(character.as_str())),
        )?;
        let rel = chat_rel(character, chat);
        let _lock = FileLock::acquire(&self.root, &lock_rel(character, chat), true)?;
        if self.chat_revision_now(character, chat)?.as_ref() != expected {
            return Err(StoreError::Conflict {
                target: chat_target(character, chat),
                current: None,
            });
        }
        write_atomic(&self.root, &rel, joined(lines, false).as_bytes())?;
        self.chat_revision_now(character, chat)?
            .ok_or_else(|| StoreError::NotFound {
                target: chat_target(character, chat),
            })
    }
}

#[async_trait]
impl ChatStore for FsStore {
    async fn list_chats(&self, character: &CharacterName) -> Result<Vec<ChatId>, StoreError> {
        let character = character.clone();
        self.run(move |s| s.list_chats(&character)).await
    }

    async fn read_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatFile>, StoreError> {
        let (character, chat) = (character.clone(), chat.clone());
        self.run(move |s| s.read_chat(&character, &chat)).await
    }

    async fn read_chat_since(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        since: &ChatRevision,
    ) -> Result<Option<ChatChange>, StoreError> {
        let (character, chat, since) = (character.clone(), chat.clone(), since.clone());
        self.run(move |s| s.read_chat_since(&character, &chat, &since))
            .await
    }

    async fn chat_revision(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatRevision>, StoreError> {
        let (character, chat) = (character.clone(), chat.clone());
        self.run(move |s| s.chat_revision_now(&character, &chat))
            .await
    }

    async fn append_lines(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: &ChatRevision,
    ) -> Result<ChatRevision, StoreError> {
        let (character, chat) = (character.clone(), chat.clone());
        let (lines, expected) = (lines.to_vec(), expected.clone());
        self.run(move |s| s.append_lines(&character, &chat, &lines, &expected))
            .await
    }

    async fn rewrite_chat(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: Option<&ChatRevision>,
    ) -> Result<ChatRevision, StoreError> {
        let (character, chat) = (character.clone(), chat.clone());
        let (lines, expected) = (lines.to_vec(), expected.cloned());
        self.run(move |s| s.rewrite_chat(&character, &chat, &lines, expected.as_ref()))
            .await
    }
}
