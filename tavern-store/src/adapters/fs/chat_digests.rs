//! The content digests of chat files, kept per process so a chat's revision (a digest of its
//! bytes, [`ChatRevision::of_content`]) does not cost a whole read each time it is asked for.
//!
//! For each chat the cache keeps the last few versions it digested: the file's stamp (device,
//! inode, birth, length and times), the digest, a digest of the version's last [`TAIL_BYTES`],
//! and — for a version this process made by appending under the chat's lock — the digest of the
//! version it appended to. A file with the same stamp and the same last bytes is that version.
//! Appends are also written down next to the chat ([`ChatDigests::record`], in its lock file),
//! so another process sharing the folder takes the appended versions from there. Nothing else
//! is trusted: a file another program changed (SillyTavern's temp + rename, an edit in place,
//! an append without the lock) is digested whole, once; a stamp alone cannot tell an append
//! from an edit before it. The links between appends tell `read_chat_since` where the lines
//! after an earlier version start without reading the rest.
//!
//! A file read within [`SETTLE`] of its last change is not remembered ("racy clean", as git
//! calls it): its times are set when a write starts and are only as fine as the file system's
//! clock, so the bytes read may not be the ones the stamp ends up naming. One case stays open:
//! a program that rewrites a chat in place, to the same length, keeping its last 4 KiB, within
//! one clock tick of this process's own append keeps the stamp of that append.
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

/// How much of a version's end is compared with the remembered one.
pub(super) const TAIL_BYTES: u64 = 4096;

/// Versions remembered per chat (the newest ones): as many appends between two reads of the
/// chat as `read_chat_since` can follow without a whole read.
const VERSIONS_PER_CHAT: usize = 16;

/// Chats remembered; past this the cache starts over (it only ever saves reads).
const MAX_CHATS: usize = 4096;

/// Appends written down for other processes ([`ChatDigests::record`]): the newest ones.
const RECORDED_APPENDS: usize = 8;

/// The first line of an append record.
const RECORD_HEADER: &str = "agent-tavern chat appends v1";

/// The most of an append record that is read.
pub(super) const RECORD_MAX_BYTES: u64 = 8192;

/// One version of a chat file this process digested.
#[derive(Debug, Clone)]
pub(super) struct Known {
    stamp: FileStamp,
    /// The digest of the file's bytes at this version.
    digest: ChatDigest,
    /// [`short_digest`] of the version's last [`TAIL_BYTES`] (or of all of it).
    tail: String,
    /// The version this one is, plus lines this process appended under the chat's lock.
    parent: Option<ChatDigest>,
}

impl Known {
    /// A version as `meta` describes it, whose bytes have `digest` and end with `end` (at
    /// least the last [`TAIL_BYTES`], or all of them); `parent` when this process made it by
    /// appending to that version.
    pub(super) fn new(
        meta: &std::fs::Metadata,
        digest: ChatDigest,
        end: &[u8],
        parent: Option<ChatDigest>,
    ) -> Self {
        Self {
            stamp: stamp_of(meta),
            digest,
            tail: tail_digest(meta.len(), end),
            parent,
        }
    }
}

fn tail_digest(len: u64, end: &[u8]) -> String {
    let keep = usize::try_from(TAIL_BYTES.min(len)).unwrap_or(end.len());
    short_digest(&[&end[end.len().saturating_sub(keep)..]])
}

/// The per-process digest cache of one store.
#[derive(Debug)]
pub(super) struct ChatDigests {
    chats: Mutex<HashMap<String, VecDeque<Known>>>,
    /// [`SETTLE`] (shorter in unit tests).
    settle: std::time::Duration,
    /// Chats read and digested whole (tests count them).
    whole_reads: std::sync::atomic::AtomicU64,
}

impl Default for ChatDigests {
    fn default() -> Self {
        Self {
            chats: Mutex::default(),
            settle: SETTLE,
            whole_reads: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl ChatDigests {
    /// Whether the file as `meta` describes it last changed at least the settling time before
    /// `started` (when its bytes began to be read), so the digest of what was read may be
    /// remembered.
    pub(super) fn settled(&self, meta: &std::fs::Metadata, started: std::time::SystemTime) -> bool {
        if self.settle.is_zero() {
            return true;
        }
        let changed = meta.modified().ok().max(changed_status(meta));
        changed.is_some_and(|t| t + self.settle < started)
    }

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
        Ok(read_exactly(file, from, meta.len(), rel)?.and_then(|end| self.at(rel, meta, &end)))
    }

    /// Where the content `since` names ends in the version of `rel` with digest `current`,
    /// when this process made `current` from it by appending (its bytes are then the first
    /// bytes of `current`'s).
    pub(super) fn appended_from(
        &self,
        rel: &str,
        current: &ChatDigest,
        since: &DigestLabel,
    ) -> Option<u64> {
        let chats = lock(&self.chats);
        let versions = chats.get(rel)?;
        let mut at = *current;
        // Each step follows one remembered append, so the walk ends within the versions kept.
        for _ in 0..versions.len() {
            let parent = versions.iter().find(|k| k.digest == at)?.parent?;
            if since.names(&parent) {
                return Some(parent.bytes());
            }
            at = parent;
        }
        None
    }

    /// Counts a whole read of a chat.
    pub(super) fn count_whole_read(&self) {
        self.whole_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Chats read and digested whole so far.
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    pub(super) fn whole_reads(&self) -> u64 {
        self.whole_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The newest appends this process knows of `rel` (made here or read from a record), as
    /// text for other processes sharing the folder: each version's stamp, end, digest and the
    /// digest it extends, then a checksum. Written under the chat's lock right after an append,
    /// so another process can take the appended version (and read only the appended lines)
    /// instead of reading the whole file; a file changed any other way has another stamp, and
    /// the record no longer applies.
    pub(super) fn record(&self, rel: &str) -> String {
        let chats = lock(&self.chats);
        let mut text = format!("{RECORD_HEADER}\n");
        let appends = chats
            .get(rel)
            .into_iter()
            .flatten()
            .filter_map(|k| k.parent.map(|parent| (k, parent)));
        let appends: Vec<_> = appends.collect();
        for (k, parent) in appends
            .iter()
            .skip(appends.len().saturating_sub(RECORDED_APPENDS))
        {
            let stamp = k.stamp.parts().map(|p| p.to_string()).join(" ");
            text.push_str(&format!(
                "{stamp} {} {} {} .\n",
                k.tail,
                digest_text(&k.digest),
                digest_text(parent),
            ));
        }
        let sum = short_digest(&[text.as_bytes()]);
        text.push_str(&format!("sum {sum}\n"));
        text
    }

    /// Takes the appends of a [`ChatDigests::record`] of `rel` into this cache; a record that
    /// is torn, tampered with or of another format is ignored.
    pub(super) fn import(&self, rel: &str, record: &str) {
        let Some((body, sum)) = record.trim_end_matches('\n').rsplit_once('\n') else {
            return;
        };
        let body = format!("{body}\n");
        if sum.strip_prefix("sum ") != Some(short_digest(&[body.as_bytes()]).as_str()) {
            return;
        }
        let mut lines = body.lines();
        if lines.next() != Some(RECORD_HEADER) {
            return;
        }
        for line in lines {
            if let Some(known) = parse_known(line) {
                let present = lock(&self.chats)
                    .get(rel)
                    .is_some_and(|v| v.iter().any(|k| k.stamp == known.stamp));
                if !present {
                    self.remember(rel, known);
                }
            }
        }
    }

    /// Forgets every version of `rel` (bytes this process saw may be gone).
    pub(super) fn forget(&self, rel: &str) {
        lock(&self.chats).remove(rel);
    }

    /// Remembers a version of `rel`.
    pub(super) fn remember(&self, rel: &str, known: Known) {
        let mut chats = lock(&self.chats);
        if chats.len() >= MAX_CHATS && !chats.contains_key(rel) {
            chats.clear();
        }
        let versions = chats.entry(rel.to_owned()).or_default();
        let mut known = known;
        // Read again, an appended version stays one: keep the link to what it extends.
        if known.parent.is_none() {
            known.parent = versions
                .iter()
                .find(|k| k.stamp == known.stamp && k.digest == known.digest)
                .and_then(|k| k.parent);
        }
        versions.retain(|k| k.stamp != known.stamp);
        versions.push_back(known);
        while versions.len() > VERSIONS_PER_CHAT {
            versions.pop_front();
        }
    }

    /// The digest of the file as `meta` describes it: remembered, or read whole (and
    /// remembered when the file did not change while it was read).
    pub(super) fn digest(
        &self,
        file: &mut std::fs::File,
        meta: &std::fs::Metadata,
        rel: &str,
    ) -> Result<ChatDigest, StoreError> {
        if let Some(digest) = self.at_now(file, meta, rel)? {
            return Ok(digest);
        }
        let started = std::time::SystemTime::now();
        let bytes = read_prefix(file, meta.len(), rel)?;
        self.count_whole_read();
        let digest = ChatDigest::of_bytes(&bytes);
        let after = file.metadata().map_err(io_err("stat", rel))?;
        if bytes.len() as u64 == meta.len()
            && stamp_of(&after) == stamp_of(meta)
            && self.settled(meta, started)
        {
            self.remember(rel, Known::new(meta, digest, &bytes, None));
        }
        Ok(digest)
    }
}

/// `segments bytes chain` of a digest.
fn digest_text(d: &ChatDigest) -> String {
    format!(
        "{} {} {}",
        d.segments(),
        d.bytes(),
        tavern_core::revision::hex(&d.chain())
    )
}

/// One line of a record: six stamp numbers, the tail digest, two digests, a dot.
fn parse_known(line: &str) -> Option<Known> {
    let f: Vec<&str> = line.split(' ').collect();
    if f.len() != 14 || f[13] != "." {
        return None;
    }
    let mut stamp = [0i128; 6];
    for (slot, text) in stamp.iter_mut().zip(&f[..6]) {
        *slot = text.parse().ok()?;
    }
    let digest = |i: usize| -> Option<ChatDigest> {
        let hex = f[i + 2];
        if hex.len() != 64 {
            return None;
        }
        let mut chain = [0u8; 32];
        for (j, byte) in chain.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(j * 2..j * 2 + 2)?, 16).ok()?;
        }
        Some(ChatDigest::from_parts(
            chain,
            f[i].parse().ok()?,
            f[i + 1].parse().ok()?,
        ))
    };
    let tail = f[6];
    if tail.len() != 16 || !tail.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let (digest, parent) = (digest(7)?, digest(10)?);
    // What an append makes: the file's length is the digest's, and it grew from the parent.
    let consistent = i128::from(digest.bytes()) == stamp[2]
        && parent.bytes() < digest.bytes()
        && parent.segments() <= digest.segments();
    consistent.then(|| Known {
        stamp: FileStamp::from_parts(stamp),
        digest,
        tail: tail.to_owned(),
        parent: Some(parent),
    })
}

/// How long after a file's last change its stamp is trusted to name its bytes: file times are
/// set when a write starts and are only as fine as the file system's clock, so bytes read
/// within this window of the change may not be the bytes the stamp ends up naming (git's "racy
/// clean" entries). Generous against coarse clocks (a jiffy is 1–10 ms).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(20);

#[cfg(unix)]
fn changed_status(meta: &std::fs::Metadata) -> Option<std::time::SystemTime> {
    use std::os::unix::fs::MetadataExt;
    let secs = u64::try_from(meta.ctime()).ok()?;
    let nanos = u32::try_from(meta.ctime_nsec()).ok()?;
    std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(secs, nanos))
}

#[cfg(not(unix))]
fn changed_status(_: &std::fs::Metadata) -> Option<std::time::SystemTime> {
    None
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

/// The bytes of `file` from `from` up to `len`, in one read where the platform allows; `None`
/// if the file is shorter now.
pub(super) fn read_exactly(
    file: &mut std::fs::File,
    from: u64,
    len: u64,
    rel: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let size = usize::try_from(len.saturating_sub(from)).map_err(|_| StoreError::Corrupt {
        file: rel.to_owned(),
        reason: format!("{len} bytes do not fit in memory"),
    })?;
    let mut bytes = vec![0; size];
    #[cfg(unix)]
    let read = std::os::unix::fs::FileExt::read_exact_at(file, &mut bytes, from);
    #[cfg(not(unix))]
    let read = file
        .seek(SeekFrom::Start(from))
        .and_then(|_| file.read_exact(&mut bytes));
    match read {
        Ok(()) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(io_err("read", rel)(e)),
    }
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
        // Remembered at once (the file was just written; the store waits for it to settle).
        let cache = ChatDigests {
            settle: std::time::Duration::ZERO,
            ..ChatDigests::default()
        };
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

    /// A file whose last change is not well before the read is not remembered; one that
    /// changed well before is. (The change time is set in the future, so no pause of the
    /// machine can make the first case settle.)
    #[test]
    fn only_settled_files_are_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, b"{}").unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .append(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let cache = ChatDigests::default();
        assert!(!cache.settled(&meta, std::time::SystemTime::now()));
        assert!(cache.settled(&meta, later + std::time::Duration::from_secs(1)));
        let mut file = std::fs::File::open(&path).unwrap();
        cache.digest(&mut file, &meta, "c.jsonl").unwrap();
        assert_eq!(
            cache.at("c.jsonl", &meta, b"{}"),
            None,
            "read within the window"
        );
    }

    /// A chat file `{}` + `{}` on disk (kept while the directory lives), its metadata, and the
    /// digests of the one-line version and of the version with the second line appended.
    fn appended_file() -> (tempfile::TempDir, std::fs::Metadata, ChatDigest, ChatDigest) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, b"{}\n{}").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let (parent, digest) = (ChatDigest::of_bytes(b"{}"), ChatDigest::of_bytes(b"{}\n{}"));
        (dir, meta, parent, digest)
    }

    /// A record passes on the appends it names, and an entry whose numbers do not describe
    /// an append (its length is not the file's) is not taken, checksum or not.
    #[test]
    fn records_pass_on_appends_and_refuse_inconsistent_entries() {
        let (_dir, meta, parent, digest) = appended_file();
        let writer = ChatDigests::default();
        writer.remember("c", Known::new(&meta, digest, b"{}\n{}", Some(parent)));
        let reader = ChatDigests::default();
        reader.import("c", &writer.record("c"));
        assert_eq!(reader.at("c", &meta, b"{}\n{}"), Some(digest));
        let label = DigestLabel::parse(&parent.label()).unwrap();
        assert_eq!(reader.appended_from("c", &digest, &label), Some(2));
        // The same entry claiming other content: not an append of this file's length.
        let forged = ChatDigests::default();
        let other = ChatDigest::of_bytes(b"{}\n{\"a\":1}");
        forged.remember("c", Known::new(&meta, other, b"{}\n{}", Some(parent)));
        let fooled = ChatDigests::default();
        fooled.import("c", &forged.record("c"));
        assert_eq!(fooled.at("c", &meta, b"{}\n{}"), None);
        // A record cut short or edited is not taken at all.
        let record = writer.record("c");
        let edited = ChatDigests::default();
        let chain = tavern_core::revision::hex(&digest.chain());
        edited.import("c", &record.replacen(&chain[..8], "00000000", 1));
        edited.import("c", &record[..record.len() / 2]);
        assert_eq!(edited.at("c", &meta, b"{}\n{}"), None);
    }

    /// A version this process appended and then read again keeps its link (and so stays in
    /// the record other processes read).
    #[test]
    fn reading_an_appended_version_again_keeps_its_link() {
        let (_dir, meta, parent, digest) = appended_file();
        let cache = ChatDigests::default();
        cache.remember("c", Known::new(&meta, digest, b"{}\n{}", Some(parent)));
        cache.remember("c", Known::new(&meta, digest, b"{}\n{}", None));
        assert_eq!(
            cache.record("c").lines().count(),
            3,
            "header, the append, the sum"
        );
    }
}
