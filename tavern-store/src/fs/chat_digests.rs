//! The content digests of chat files, kept per process so a chat's revision (a digest of its
//! bytes, [`ChatRevision::of_content`]) costs what changed since this process last looked, not
//! the whole file.
//!
//! For each chat the cache keeps the last few versions it digested: the file's stamp (device,
//! inode, length, times), the digest, and a digest of the version's last [`TAIL_BYTES`]. A file
//! with the same stamp is that version. A file with the same inode, no shorter, whose bytes up
//! to the old length still end as they did and continue with a new line, only had lines
//! appended: the digest is extended over the appended bytes alone. Anything else (SillyTavern's
//! temp + rename, an in-place edit, a first look) is digested whole.
//!
//! [`ChatRevision::of_content`]: crate::chat::ChatRevision::of_content

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::sync::Mutex;

use tavern_core::chat_digest::{ChatDigest, DigestLabel};
use tavern_core::revision::short_digest;

use super::atomic::{io_err, stamp_of, FileStamp};
use crate::error::StoreError;
use crate::mem::lock;

/// How much of a version's end is compared to tell an append from a rewrite.
pub(super) const TAIL_BYTES: u64 = 4096;

/// Versions remembered per chat (the newest ones).
const VERSIONS_PER_CHAT: usize = 4;

/// Chats remembered; past this the cache starts over (it only ever saves reads).
const MAX_CHATS: usize = 4096;

/// One version of a chat file this process digested.
#[derive(Debug, Clone)]
pub(super) struct Known {
    stamp: FileStamp,
    /// The digest of the file's bytes at this version.
    pub(super) digest: ChatDigest,
    /// [`short_digest`] of the version's last [`TAIL_BYTES`] (or of all of it).
    tail: String,
}

impl Known {
    /// A version of `len` bytes whose end is `end` (at least its last [`TAIL_BYTES`], or all
    /// of it).
    pub(super) fn new(meta: &std::fs::Metadata, digest: ChatDigest, end: &[u8]) -> Self {
        Self {
            stamp: stamp_of(meta),
            digest,
            tail: tail_digest(meta.len(), end),
        }
    }
}

fn tail_digest(len: u64, end: &[u8]) -> String {
    let keep = usize::try_from(TAIL_BYTES.min(len)).unwrap_or(end.len());
    short_digest(&[&end[end.len().saturating_sub(keep)..]])
}

/// What an incremental read found: the bytes appended since a known version (starting a new
/// line, or empty) and the digest with them.
pub(super) struct Extended {
    /// The bytes after the known version.
    pub(super) appended: Vec<u8>,
    /// The digest of the whole file now.
    pub(super) digest: ChatDigest,
}

/// The per-process digest cache of one store.
#[derive(Debug, Default)]
pub(super) struct ChatDigests {
    chats: Mutex<HashMap<String, VecDeque<Known>>>,
}

impl ChatDigests {
    /// The version of `rel` with exactly this stamp, if digested before, whose end is still
    /// `end` (at least the file's last [`TAIL_BYTES`], or all of it). The end is compared
    /// because a stamp's times are only as fine as the file system's clock: a rewrite in
    /// place to the same length within one tick keeps the stamp.
    pub(super) fn at(&self, rel: &str, meta: &std::fs::Metadata, end: &[u8]) -> Option<ChatDigest> {
        let stamp = stamp_of(meta);
        let tail = tail_digest(meta.len(), end);
        lock(&self.chats)
            .get(rel)?
            .iter()
            .find(|k| k.stamp == stamp && k.tail == tail)
            .map(|k| k.digest)
    }

    /// [`ChatDigests::at`], reading the file's end.
    pub(super) fn at_now(
        &self,
        file: &mut std::fs::File,
        meta: &std::fs::Metadata,
        rel: &str,
    ) -> Result<Option<ChatDigest>, StoreError> {
        if !lock(&self.chats).contains_key(rel) {
            return Ok(None);
        }
        let from = meta.len().saturating_sub(TAIL_BYTES);
        file.seek(SeekFrom::Start(from))
            .map_err(io_err("seek", rel))?;
        let mut end = Vec::new();
        file.take(meta.len() - from)
            .read_to_end(&mut end)
            .map_err(io_err("read", rel))?;
        Ok(self.at(rel, meta, &end))
    }

    /// Known versions of `rel` that `meta`'s file may have grown from (same inode, no
    /// longer), newest first, optionally only the one `since` names.
    fn ancestors(
        &self,
        rel: &str,
        meta: &std::fs::Metadata,
        since: Option<&DigestLabel>,
    ) -> Vec<Known> {
        let now = stamp_of(meta);
        lock(&self.chats)
            .get(rel)
            .map_or_else(Vec::new, |versions| {
                versions
                    .iter()
                    .rev()
                    .filter(|k| k.stamp.same_file(&now) && k.stamp.len() <= meta.len())
                    .filter(|k| since.is_none_or(|label| label.names(&k.digest)))
                    .take(1)
                    .cloned()
                    .collect()
            })
    }

    /// Remembers a version of `rel`.
    pub(super) fn remember(&self, rel: &str, known: Known) {
        let mut chats = lock(&self.chats);
        if chats.len() >= MAX_CHATS && !chats.contains_key(rel) {
            chats.clear();
        }
        let versions = chats.entry(rel.to_owned()).or_default();
        versions.retain(|k| k.stamp != known.stamp);
        versions.push_back(known);
        while versions.len() > VERSIONS_PER_CHAT {
            versions.pop_front();
        }
    }

    /// The file as `meta` describes it, extended from the newest known version it only
    /// appended to (that with `since`, when given): the appended bytes and the digest now.
    /// `None` when no known version fits and a whole read is needed.
    pub(super) fn extend(
        &self,
        file: &mut std::fs::File,
        meta: &std::fs::Metadata,
        rel: &str,
        since: Option<&DigestLabel>,
    ) -> Result<Option<Extended>, StoreError> {
        let Some(known) = self.ancestors(rel, meta, since).pop() else {
            return Ok(None);
        };
        let len = meta.len();
        let old = known.stamp.len();
        let from = old.saturating_sub(TAIL_BYTES);
        file.seek(SeekFrom::Start(from))
            .map_err(io_err("seek", rel))?;
        let mut buf = Vec::new();
        file.take(len - from)
            .read_to_end(&mut buf)
            .map_err(io_err("read", rel))?;
        let Ok(split) = usize::try_from(old - from) else {
            return Ok(None);
        };
        if buf.len() as u64 != len - from || short_digest(&[&buf[..split]]) != known.tail {
            return Ok(None);
        }
        let mut digest = known.digest;
        if !digest.append(&buf[split..]) {
            return Ok(None);
        }
        self.remember(rel, Known::new(meta, digest, &buf));
        Ok(Some(Extended {
            appended: buf.split_off(split),
            digest,
        }))
    }

    /// The digest of the file as `meta` describes it: remembered, extended, or read whole.
    pub(super) fn digest(
        &self,
        file: &mut std::fs::File,
        meta: &std::fs::Metadata,
        rel: &str,
    ) -> Result<ChatDigest, StoreError> {
        if let Some(digest) = self.at_now(file, meta, rel)? {
            return Ok(digest);
        }
        if let Some(extended) = self.extend(file, meta, rel, None)? {
            return Ok(extended.digest);
        }
        let bytes = read_prefix(file, meta.len(), rel)?;
        let digest = ChatDigest::of_bytes(&bytes);
        // A file that shrank while it was read is not the version `meta` describes.
        if bytes.len() as u64 == meta.len() {
            self.remember(rel, Known::new(meta, digest, &bytes));
        }
        Ok(digest)
    }
}

/// The first `len` bytes of `file` (fewer if it shrank meanwhile).
pub(super) fn read_prefix(
    file: &mut std::fs::File,
    len: u64,
    rel: &str,
) -> Result<Vec<u8>, StoreError> {
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.seek(SeekFrom::Start(0)).map_err(io_err("seek", rel))?;
    file.take(len)
        .read_to_end(&mut bytes)
        .map_err(io_err("read", rel))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rewrite in place to the same length within one tick of the file system's clock keeps
    /// the stamp; the remembered digest must not be used for the new bytes.
    #[test]
    fn a_same_stamp_with_a_different_end_is_not_the_remembered_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, b"{\"mes\":\"a\"}\n{\"mes\":\"b\"}").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let cache = ChatDigests::default();
        let mut file = std::fs::File::open(&path).unwrap();
        let digest = cache.digest(&mut file, &meta, "c.jsonl").unwrap();
        assert_eq!(digest, ChatDigest::of_bytes(&std::fs::read(&path).unwrap()));
        // The same metadata (as a coarse clock would leave it), other bytes of the same length.
        assert_eq!(
            cache.at("c.jsonl", &meta, b"{\"mes\":\"a\"}\n{\"mes\":\"b\"}"),
            Some(digest)
        );
        assert_eq!(
            cache.at("c.jsonl", &meta, b"{\"mes\":\"a\"}\n{\"mes\":\"c\"}"),
            None
        );
        std::fs::write(&path, b"{\"mes\":\"a\"}\n{\"mes\":\"c\"}").unwrap();
        let mut file = std::fs::File::open(&path).unwrap();
        assert_eq!(cache.at_now(&mut file, &meta, "c.jsonl").unwrap(), None);
    }
}
