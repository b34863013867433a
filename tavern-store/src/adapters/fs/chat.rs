//! SillyTavern chats on disk: `chats/<character>/<chat>.jsonl`, written in SillyTavern's own
//! style (lines joined by `\n`, no trailing newline) so either program can keep using the file.
//! Folder and file names are the character name and chat id themselves, with only what some file
//! system refuses escaped ([`encode_readable`]); chats written by the earlier all-escaped layout
//! are moved to these names when the store opens.
//!
//! A chat's revision is a digest of its bytes ([`ChatRevision::of_content`]), the same any
//! other store gives the same chat. This process remembers the digests of the versions it saw
//! and made ([`super::chat_digests`]): asking for the revision of a chat nobody else changed
//! costs a `stat` and a 4 KiB read; a chat another program or process changed (SillyTavern
//! writes a temp file and renames it) is digested whole once. Appends check the revision under
//! our lock and, after writing, that the path still names the file written to; a rename that
//! raced the append is reported as a conflict so the caller re-reads and retries.
//! `read_chat_since` reads only the lines appended since an earlier revision — by this process
//! or by another that recorded its appends next to the chat — so keeping up with a long chat
//! costs what was appended; after any other change it reads the file and still answers with
//! only the new lines when the file begins with the earlier content.

use std::io::{Read, Write};
use std::path::Path;

use async_trait::async_trait;
use tavern_core::chat::ChatLine;
use tavern_core::chat_digest::{ChatDigest, DigestLabel};
use tavern_core::{CharacterName, ChatId};

use super::atomic::{ensure_dir, io_err, stamp_of, sync_dir, under, write_atomic, FileLock};
use super::chat_digests::{read_exactly, read_prefix, Known, RECORD_MAX_BYTES, TAIL_BYTES};
use super::names::{decode, decode_readable, encode_readable};
use super::{FsStore, Inner};
use crate::chat::{check_not_empty, parse_lines, ChatChange, ChatFile, ChatRevision, ChatStore};
use crate::error::{StoreError, Target};

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

/// The lock file of chat `rel`, which also holds its append record.
fn record_rel(rel: &str) -> Option<String> {
    Some(format!("{}.lock", rel.strip_suffix(".jsonl")?))
}

/// Whether `rel` is a regular file (not a link, FIFO or device).
fn is_regular(root: &std::path::Path, rel: &str) -> bool {
    std::fs::symlink_metadata(under(root, rel)).is_ok_and(|m| m.is_file())
}

/// Empties the append record in the (locked) lock file `rel`: the chat is about to change in
/// a way no record describes, and no other process should take the old versions for it.
fn clear_record(root: &std::path::Path, lock: &FileLock, rel: &str) {
    if is_regular(root, rel) {
        let _ = lock.file().set_len(0);
    }
}

/// Replaces the content of the (locked) lock file with `record`.
fn write_record(file: &std::fs::File, record: &str) {
    #[cfg(unix)]
    let written = std::os::unix::fs::FileExt::write_all_at(file, record.as_bytes(), 0);
    #[cfg(not(unix))]
    let written = {
        use std::io::{Seek, SeekFrom};
        let mut f = file;
        f.seek(SeekFrom::Start(0))
            .and_then(|_| f.write_all(record.as_bytes()))
    };
    if written.is_ok() {
        let _ = file.set_len(record.len() as u64);
    }
}

/// The chat read whole: its lines and the revision of `digest`.
fn chat_file(rel: &str, bytes: Vec<u8>, digest: ChatDigest) -> Result<ChatFile, StoreError> {
    let text = String::from_utf8(bytes).map_err(|e| StoreError::Corrupt {
        file: rel.to_owned(),
        reason: format!("not UTF-8: {e}"),
    })?;
    Ok(ChatFile {
        lines: parse_lines(rel, &text)?,
        revision: ChatRevision::of_content(&digest),
    })
}

/// The change made by appending `appended` (bytes starting a new line, or none), bringing the
/// chat to `digest`. `None` when they do not parse (a line another process is still writing):
/// a whole read reports that with its line number.
fn appended_change(rel: &str, appended: &[u8], digest: &ChatDigest) -> Option<ChatChange> {
    if appended.is_empty() {
        return Some(ChatChange::Unchanged);
    }
    let text = std::str::from_utf8(appended).ok()?;
    let lines = parse_lines(rel, text).ok()?;
    Some(ChatChange::Appended {
        lines,
        revision: ChatRevision::of_content(digest),
    })
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
        let chats = self.chat_root.join("chats");
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
        let chats = self.chat_root.join("chats");
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
        match open_existing(&under(&self.chat_root, &rel), &rel)? {
            Some(mut f) => self.revision_of(&mut f, &rel).map(Some),
            None => Ok(None),
        }
    }

    /// The revision of an open chat file.
    fn revision_of(&self, file: &mut std::fs::File, rel: &str) -> Result<ChatRevision, StoreError> {
        let meta = file.metadata().map_err(io_err("stat", rel))?;
        let digest = self.digest_now(file, &meta, rel)?;
        Ok(ChatRevision::of_content(&digest))
    }

    /// The digest of the chat file as `meta` describes it: a version this process knows,
    /// one another process appended and recorded, or read whole.
    fn digest_now(
        &self,
        file: &mut std::fs::File,
        meta: &std::fs::Metadata,
        rel: &str,
    ) -> Result<ChatDigest, StoreError> {
        match self.known_now(file, meta, rel)? {
            Some(digest) => Ok(digest),
            None => self.chat_digests.digest(file, meta, rel),
        }
    }

    /// The digest of a version of the chat file this process knows, or that another process
    /// made by appending and recorded next to it ([`ChatDigests::record`]).
    fn known_now(
        &self,
        file: &mut std::fs::File,
        meta: &std::fs::Metadata,
        rel: &str,
    ) -> Result<Option<ChatDigest>, StoreError> {
        if let Some(digest) = self.chat_digests.at_now(file, meta, rel)? {
            return Ok(Some(digest));
        }
        let Some(record) = self.read_record(rel) else {
            return Ok(None);
        };
        self.chat_digests.import(rel, &record);
        self.chat_digests.at_now(file, meta, rel)
    }

    /// The append record next to chat `rel` (in its lock file), if there is a readable one.
    fn read_record(&self, rel: &str) -> Option<String> {
        let path = under(&self.chat_root, &record_rel(rel)?);
        // Only a regular file: opening a FIFO for reading would wait for a writer.
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            return None;
        }
        let file = std::fs::File::open(path).ok()?;
        let mut text = String::new();
        file.take(RECORD_MAX_BYTES).read_to_string(&mut text).ok()?;
        (!text.is_empty()).then_some(text)
    }

    /// The file's bytes as it was when `meta` was taken (a concurrent append after that is not
    /// read, so the lines and the revision always agree), with the metadata they match.
    fn read_bytes(
        file: &mut std::fs::File,
        meta: std::fs::Metadata,
        rel: &str,
    ) -> Result<(std::fs::Metadata, Vec<u8>), StoreError> {
        let mut meta = meta;
        // Shrunk while read (a rewrite in place): read what is there now, a few times at most.
        for _ in 0..8 {
            let bytes = read_prefix(file, meta.len(), rel)?;
            if bytes.len() as u64 == meta.len() {
                return Ok((meta, bytes));
            }
            meta = file.metadata().map_err(io_err("stat", rel))?;
        }
        Err(io_err("read", rel)(std::io::Error::other(
            "the file kept changing while it was read",
        )))
    }

    /// The digest of `bytes`, read from `file` as `meta` describes it (remembered when the
    /// file did not change while it was read), and, when `since` names the bytes up to its
    /// length followed by a new line, where those bytes end.
    fn digest_read(
        &self,
        file: &std::fs::File,
        rel: &str,
        meta: &std::fs::Metadata,
        bytes: &[u8],
        since: Option<&DigestLabel>,
        started: std::time::SystemTime,
    ) -> Result<(ChatDigest, Option<usize>), StoreError> {
        let prefix = since.and_then(|label| {
            let end = usize::try_from(label.bytes).ok()?;
            let starts_line = end == 0 || end == bytes.len() || bytes.get(end) == Some(&b'\n');
            let digest = ChatDigest::of_bytes(bytes.get(..end)?);
            (starts_line && label.names(&digest)).then_some((end, digest))
        });
        let extended =
            prefix.and_then(|(end, mut digest)| digest.append(&bytes[end..]).then_some(digest));
        let digest = extended.unwrap_or_else(|| ChatDigest::of_bytes(bytes));
        let after = file.metadata().map_err(io_err("stat", rel))?;
        if meta.len() == bytes.len() as u64
            && stamp_of(&after) == stamp_of(meta)
            && self.chat_digests.settled(meta, started)
        {
            self.chat_digests
                .remember(rel, Known::new(meta, digest, bytes, None));
        }
        Ok((digest, prefix.map(|(end, _)| end)))
    }

    /// Characters with a chat folder, by name (folders this layout would not write are
    /// skipped).
    pub(super) fn chat_characters(&self) -> Result<Vec<CharacterName>, StoreError> {
        let entries = match std::fs::read_dir(under(&self.chat_root, "chats")) {
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
        let entries = match std::fs::read_dir(under(&self.chat_root, &rel)) {
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
        let Some(mut file) = open_existing(&under(&self.chat_root, &rel), &rel)? else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(io_err("stat", &rel))?;
        let started = std::time::SystemTime::now();
        let (meta, bytes) = Self::read_bytes(&mut file, meta, &rel)?;
        let (digest, _) = self.digest_read(&file, &rel, &meta, &bytes, None, started)?;
        chat_file(&rel, bytes, digest).map(Some)
    }

    /// The first non-blank line, reading no more of the file than it takes.
    fn read_chat_head(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatLine>, StoreError> {
        use std::io::{BufRead, Read};
        let rel = chat_rel(character, chat);
        let Some(file) = open_existing(&under(&self.chat_root, &rel), &rel)? else {
            return Ok(None);
        };
        let cap = crate::ports::chat::MAX_CHAT_HEAD_BYTES;
        let mut reader = std::io::BufReader::new(file.take(cap as u64 + 1));
        let mut line = Vec::new();
        let mut number = 0;
        loop {
            line.clear();
            number += 1;
            let n = reader
                .read_until(b'\n', &mut line)
                .map_err(io_err("read", &rel))?;
            if n == 0 {
                return Ok(None);
            }
            if line.last() != Some(&b'\n') && reader.get_ref().limit() == 0 {
                return Err(StoreError::LimitExceeded {
                    limit: "bytes of a chat's first line",
                    max: cap,
                    actual: cap + 1,
                });
            }
            let text = std::str::from_utf8(&line).map_err(|e| StoreError::Corrupt {
                file: format!("{rel} line {number}"),
                reason: format!("not UTF-8: {e}"),
            })?;
            let text = text.trim_end_matches('\n').trim_end_matches('\r');
            if text.trim().is_empty() {
                continue;
            }
            return ChatLine::parse(text)
                .map(Some)
                .map_err(|e| StoreError::Corrupt {
                    file: format!("{rel} line {number}"),
                    reason: e.to_string(),
                });
        }
    }

    /// Nothing when the file is the version `since` names; only the lines after it when this
    /// process appended them to that version (it reads just those); otherwise the whole file,
    /// still answered as an append when its bytes up to `since`'s length are the content
    /// `since` names.
    fn read_chat_since(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        since: &ChatRevision,
    ) -> Result<Option<ChatChange>, StoreError> {
        let rel = chat_rel(character, chat);
        let Some(mut file) = open_existing(&under(&self.chat_root, &rel), &rel)? else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(io_err("stat", &rel))?;
        let label = since.content();
        if let (Some(label), Some(current)) = (&label, self.known_now(&mut file, &meta, &rel)?) {
            if label.names(&current) {
                return Ok(Some(ChatChange::Unchanged));
            }
            let from = self.chat_digests.appended_from(&rel, &current, label);
            if let Some(from) = from.filter(|&from| from < meta.len()) {
                if let Some(appended) = read_exactly(&mut file, from, meta.len(), &rel)? {
                    if let Some(change) = appended_change(&rel, &appended, &current) {
                        return Ok(Some(change));
                    }
                }
            }
        }
        let started = std::time::SystemTime::now();
        let (meta, bytes) = Self::read_bytes(&mut file, meta, &rel)?;
        self.chat_digests.count_whole_read();
        let (digest, prefix) =
            self.digest_read(&file, &rel, &meta, &bytes, label.as_ref(), started)?;
        if let Some(change) = prefix.and_then(|end| appended_change(&rel, &bytes[end..], &digest)) {
            return Ok(Some(change));
        }
        chat_file(&rel, bytes, digest).map(|f| Some(ChatChange::Whole(f)))
    }

    fn append_lines(
        &self,
        character: &CharacterName,
        chat: &ChatId,
        lines: &[ChatLine],
        expected: &ChatRevision,
    ) -> Result<ChatRevision, StoreError> {
        let rel = chat_rel(character, chat);
        let path = under(&self.chat_root, &rel);
        let conflict = || StoreError::Conflict {
            target: chat_target(character, chat),
            current: None,
        };
        let lock = FileLock::acquire(&self.chat_root, &lock_rel(character, chat), true)?;
        let Some(mut file) = open_existing(&path, &rel)? else {
            return Err(StoreError::NotFound {
                target: chat_target(character, chat),
            });
        };
        let checked = file.metadata().map_err(io_err("stat", &rel))?;
        let digest = self.digest_now(&mut file, &checked, &rel)?;
        if !expected.names(&digest) {
            return Err(conflict());
        }
        if lines.is_empty() {
            return Ok(expected.clone());
        }
        let mut out = std::fs::OpenOptions::new()
            .append(true)
            .read(true)
            .open(&path)
            .map_err(io_err("open", &rel))?;
        let before = out.metadata().map_err(io_err("stat", &rel))?;
        // Changed between the check and now by a program that does not take our lock:
        // nothing written, the caller re-reads.
        if before.len() != digest.bytes() || stamp_of(&before) != stamp_of(&checked) {
            return Err(conflict());
        }
        let len = before.len();
        let text = joined(lines, len > 0);
        let synced = out
            .write_all(text.as_bytes())
            .map_err(io_err("append", &rel))
            .and_then(|()| {
                super::atomic::count_sync();
                out.sync_data().map_err(io_err("fsync", &rel))
            });
        if let Err(e) = synced {
            // Not acknowledged: take the lines back so a later read never shows them, and
            // forget what this process saw meanwhile (it may include them).
            let _ = out.set_len(len).and_then(|()| out.sync_data());
            self.chat_digests.forget(&rel);
            clear_record(&self.chat_root, &lock, &lock_rel(character, chat));
            return Err(e);
        }
        // Another program may have renamed a new file over the path while we wrote: then our
        // lines went to the replaced file and the caller must re-read and retry.
        let after = out.metadata().map_err(io_err("stat", &rel))?;
        let current = std::fs::metadata(&path).map(|m| stamp_of(&m));
        if !current.is_ok_and(|c| c.same_node(&stamp_of(&after))) {
            return Err(conflict());
        }
        let mut next = digest;
        if after.len() == len + text.len() as u64 && next.append(text.as_bytes()) {
            let from = after.len().saturating_sub(TAIL_BYTES);
            if let Some(end) = read_exactly(&mut out, from, after.len(), &rel)? {
                self.chat_digests
                    .remember(&rel, Known::new(&after, next, &end, Some(digest)));
                // For other processes sharing the folder; only ever saves them reads, so a
                // failure to write it changes nothing else.
                if is_regular(&self.chat_root, &lock_rel(character, chat)) {
                    write_record(lock.file(), &self.chat_digests.record(&rel));
                }
                return Ok(ChatRevision::of_content(&next));
            }
        }
        // Someone else appended too: digest what is there.
        self.revision_of(&mut out, &rel)
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
            &self.chat_root,
            &format!("chats/{}", encode_readable(character.as_str())),
        )?;
        let rel = chat_rel(character, chat);
        let lock = FileLock::acquire(&self.chat_root, &lock_rel(character, chat), true)?;
        if self.chat_revision_now(character, chat)?.as_ref() != expected {
            return Err(StoreError::Conflict {
                target: chat_target(character, chat),
                current: None,
            });
        }
        // No version recorded before describes what comes next.
        clear_record(&self.chat_root, &lock, &lock_rel(character, chat));
        self.chat_digests.forget(&rel);
        write_atomic(&self.chat_root, &rel, joined(lines, false).as_bytes())?;
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

    async fn read_chat_head(
        &self,
        character: &CharacterName,
        chat: &ChatId,
    ) -> Result<Option<ChatLine>, StoreError> {
        let (character, chat) = (character.clone(), chat.clone());
        self.run(move |s| s.read_chat_head(&character, &chat)).await
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
