//! An append-only, checksummed, multi-process log of JSON operations: the file adapter's
//! storage for memories and variables.
//!
//! Line format: 16 hex digits of a SHA-256 digest of the payload, a space, the payload JSON,
//! `\n`. An append is one `write` + `fdatasync` under an exclusive lock, so it is acknowledged
//! only once durable. A crash can leave at most a torn last line, which never verifies and is
//! skipped with a diagnostic; the next writer terminates it first so it cannot glue onto a new
//! line. Readers consume only complete lines and remember their offset, so every process sees
//! every other process's appends in order.
//!
//! Compaction replaces the whole file (temp + fsync + rename + directory fsync) with one line
//! per live state; a reader notices the replacement (another file identity, or a length below
//! its offset) and rebuilds its table from the new file.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tavern_core::revision::short_digest_ascii;
use xxhash_rust::xxh3::Xxh3;

use super::atomic::{io_err, sync_dir, under, FileLock};
use crate::error::StoreError;
use crate::StoreDiagnostic;

pub(crate) struct DurableLog {
    root: PathBuf,
    rel: String,
    offset: u64,
    lines: u64,
    /// Identity of the file the offset refers to.
    identity: Option<u64>,
    /// Set by a test to make the next fsync fail (shared by the store's logs).
    fail_next_sync: Arc<AtomicBool>,
    /// Set by a test to make the next append fail before writing (a full disk).
    fail_next_write: Arc<AtomicBool>,
    /// A failed append could not be taken back: the file holds bytes that were never
    /// acknowledged, so this handle refuses to go on rather than apply them.
    poisoned: bool,
    /// XXH3-128 of the bytes before `offset`, as this handle read or wrote them: what a table
    /// image taken now is anchored to (never hashed again from the file, which may since be
    /// another one under a reused inode number).
    prefix: Box<Xxh3>,
    /// The file last read, kept open: while it is, its inode number cannot be handed to a
    /// file that replaces it, so a replacement is never mistaken for the file read.
    #[cfg(unix)]
    pinned: Option<std::fs::File>,
}

/// Log lines built before an append, in the log's line format: what an import prepares on
/// its threads (each payload serialized in place, its digest computed there) so that the
/// append under the lock only writes.
#[derive(Debug, Default)]
pub(crate) struct LogLines {
    text: Vec<u8>,
    count: u64,
}

/// A line's digest and the space after it.
const DIGEST_AND_SPACE: usize = 17;

impl LogLines {
    /// Lines with room for `bytes` of them.
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Self {
            text: Vec::with_capacity(bytes),
            count: 0,
        }
    }

    /// Adds the line of `payload`.
    pub(crate) fn push(&mut self, payload: &str) {
        self.text
            .extend_from_slice(&short_digest_ascii(&[payload.as_bytes()]));
        self.text.push(b' ');
        self.text.extend_from_slice(payload.as_bytes());
        self.text.push(b'\n');
        self.count += 1;
    }

    /// Adds the line of `value` serialized as JSON (written in place, not first into a string
    /// of its own); nothing is added when it cannot be serialized.
    pub(crate) fn push_json<T: serde::Serialize>(&mut self, value: &T) -> Result<(), StoreError> {
        let start = self.text.len();
        self.text.resize(start + DIGEST_AND_SPACE, b' ');
        if let Err(e) = serde_json::to_writer(&mut self.text, value) {
            self.text.truncate(start);
            return Err(StoreError::Internal(format!(
                "cannot encode an operation: {e}"
            )));
        }
        let digest = short_digest_ascii(&[&self.text[start + DIGEST_AND_SPACE..]]);
        self.text[start..start + digest.len()].copy_from_slice(&digest);
        self.text.push(b'\n');
        self.count += 1;
        Ok(())
    }
}

/// What a read found.
pub(crate) enum NewLines {
    /// Verified payloads appended since the last read.
    Lines(Payloads),
    /// The file was replaced (compacted): the reader must start over from an empty table.
    Replaced,
}

/// Verified payloads, one after another in one string (the bytes read, with checksums and
/// damaged lines squeezed out): a log of a million lines is held once, as one block that goes
/// back to the system whole when freed, not again as a million small strings that left the
/// heap fragmented after an open.
#[derive(Debug, Default)]
pub(crate) struct Payloads {
    text: String,
    /// Where each payload ends in `text` (it starts where the one before ended).
    ends: Vec<usize>,
}

impl Payloads {
    /// The payloads, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| self.text.get(start..end).unwrap_or_default())
    }

    /// How many payloads there are.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }
}

#[cfg(unix)]
pub(crate) fn identity(meta: &std::fs::Metadata) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    Some(meta.ino())
}

#[cfg(not(unix))]
pub(crate) fn identity(_meta: &std::fs::Metadata) -> Option<u64> {
    None
}

impl DurableLog {
    /// Opens (creating durably if needed) the log at root-relative `rel`.
    pub(crate) fn open(
        root: &Path,
        rel: &str,
        fail_next_sync: Arc<AtomicBool>,
        fail_next_write: Arc<AtomicBool>,
    ) -> Result<Self, StoreError> {
        let path = under(root, rel);
        if std::fs::symlink_metadata(&path).is_err() {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(io_err("create", rel))?;
            if let Some(parent) = path.parent() {
                sync_dir(parent, rel)?;
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            rel: rel.to_owned(),
            offset: 0,
            lines: 0,
            identity: None,
            fail_next_sync,
            fail_next_write,
            poisoned: false,
            prefix: Box::default(),
            #[cfg(unix)]
            pinned: None,
        })
    }

    fn check_poisoned(&self) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::Io {
                op: "append",
                file: self.rel.clone(),
                source: std::io::Error::other(
                    "an earlier failed write could not be taken back; reopen the store",
                ),
            });
        }
        Ok(())
    }

    /// How many lines were read (including damaged ones).
    pub(crate) fn lines(&self) -> u64 {
        self.lines
    }

    /// Where this log has read to (what a table built from it reflects); `None` once an
    /// earlier failed write left it unusable.
    pub(crate) fn position(&self) -> Option<super::image::Anchor> {
        (!self.poisoned).then(|| super::image::Anchor {
            offset: self.offset,
            lines: self.lines,
            identity: self.identity,
            prefix: self.prefix.clone(),
        })
    }

    /// Goes on reading from `at` (a table image reflects the log up to there), as if every
    /// line before it had been read.
    pub(crate) fn resume(&mut self, at: super::image::Anchor) {
        self.offset = at.offset;
        self.lines = at.lines;
        self.identity = at.identity;
        self.prefix = at.prefix;
    }

    /// Forgets the position (after a replacement) so the next read starts at the beginning.
    pub(crate) fn restart(&mut self) {
        self.offset = 0;
        self.lines = 0;
        *self.prefix = Xxh3::default();
        #[cfg(unix)]
        {
            self.pinned = None;
        }
        self.identity = None;
    }

    /// Replaces the whole log with `payloads` atomically and durably. The caller holds the
    /// exclusive lock and has read every line.
    pub(crate) fn replace_with(&mut self, payloads: &[String]) -> Result<(), StoreError> {
        let mut lines = LogLines::with_capacity(payloads.iter().map(|p| p.len() + 18).sum());
        for payload in payloads {
            lines.push(payload);
        }
        let text = &lines.text;
        super::atomic::write_atomic(&self.root, &self.rel, text)?;
        let meta =
            std::fs::metadata(under(&self.root, &self.rel)).map_err(io_err("stat", &self.rel))?;
        self.offset = meta.len();
        self.lines = payloads.len() as u64;
        *self.prefix = Xxh3::default();
        self.prefix.update(text);
        #[cfg(unix)]
        {
            self.pinned = std::fs::File::open(under(&self.root, &self.rel)).ok();
        }
        self.identity = identity(&meta);
        Ok(())
    }

    /// The log's root-relative name.
    pub(crate) fn rel(&self) -> &str {
        &self.rel
    }

    pub(crate) fn lock(&self, exclusive: bool) -> Result<FileLock, StoreError> {
        FileLock::acquire(&self.root, &format!("{}.lock", self.rel), exclusive)
    }

    /// Reads every complete line appended since the last call; verified payloads are returned,
    /// damaged lines are reported and skipped.
    pub(crate) fn read_new(
        &mut self,
        diags: &mut Vec<StoreDiagnostic>,
    ) -> Result<NewLines, StoreError> {
        self.check_poisoned()?;
        let mut file =
            std::fs::File::open(under(&self.root, &self.rel)).map_err(io_err("open", &self.rel))?;
        let meta = file.metadata().map_err(io_err("stat", &self.rel))?;
        let len = meta.len();
        let replaced =
            len < self.offset || (self.identity.is_some() && identity(&meta) != self.identity);
        if replaced {
            return Ok(NewLines::Replaced);
        }
        self.identity = identity(&meta);
        #[cfg(unix)]
        if self.pinned.is_none() {
            self.pinned = file.try_clone().ok();
        }
        if len <= self.offset {
            return Ok(NewLines::Lines(Payloads::default()));
        }
        file.seek(SeekFrom::Start(self.offset))
            .map_err(io_err("seek", &self.rel))?;
        let mut buf = Vec::with_capacity(usize::try_from(len - self.offset).unwrap_or(0));
        file.read_to_end(&mut buf)
            .map_err(io_err("read", &self.rel))?;
        let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
            return Ok(NewLines::Lines(Payloads::default()));
        };
        // Hashed as read, before the payloads are moved down over the checksums.
        self.prefix.update(&buf[..=end]);
        // Each verified payload is moved down over the checksums and damaged lines before it,
        // so the bytes read become the payloads' text without a second copy of the log.
        let mut ends = Vec::new();
        let (mut written, mut start) = (0, 0);
        while start <= end {
            let stop = buf[start..end]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(end, |at| start + at);
            self.lines += 1;
            let verified = verify_line(&buf[start..stop]).map(|payload| payload.len());
            match verified {
                Ok(len) => {
                    // A payload is the end of its line.
                    buf.copy_within(stop - len..stop, written);
                    written += len;
                    ends.push(written);
                }
                Err(reason) => diags.push(StoreDiagnostic {
                    file: format!("{} line {}", self.rel, self.lines),
                    message: format!("{reason}; line skipped"),
                }),
            }
            start = stop + 1;
        }
        buf.truncate(written);
        // Only verified payloads (each valid UTF-8) are left.
        let text = String::from_utf8(buf)
            .map_err(|_| StoreError::Internal("verified log payloads are not utf-8".into()))?;
        let out = Payloads { text, ends };
        self.offset += end as u64 + 1;
        Ok(NewLines::Lines(out))
    }

    /// Appends one payload durably. The caller holds the exclusive lock and has read every
    /// complete line. Returns `true` when a torn tail had to be terminated first (the caller
    /// must then `read_new` to step over it; its own line comes back through that read).
    pub(crate) fn append(&mut self, payload: &str, durable: bool) -> Result<bool, StoreError> {
        self.append_many(&[payload], durable)
    }

    /// Appends several payloads with one write and one fsync (bulk import); same contract as
    /// [`DurableLog::append`].
    pub(crate) fn append_many(
        &mut self,
        payloads: &[&str],
        durable: bool,
    ) -> Result<bool, StoreError> {
        let mut lines = LogLines::with_capacity(payloads.iter().map(|p| p.len() + 18).sum());
        for payload in payloads {
            lines.push(payload);
        }
        self.append_lines(&[lines], durable)
    }

    /// Appends lines built beforehand (off the lock, on other threads; `parts` one after
    /// another, not copied into one buffer) with one fsync; same contract as
    /// [`DurableLog::append`].
    pub(crate) fn append_lines(
        &mut self,
        parts: &[LogLines],
        durable: bool,
    ) -> Result<bool, StoreError> {
        self.check_poisoned()?;
        if self.fail_next_write.swap(false, Ordering::SeqCst) {
            return Err(io_err("append", &self.rel)(
                std::io::Error::from_raw_os_error(
                    28, // ENOSPC: what a full disk answers
                ),
            ));
        }
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(under(&self.root, &self.rel))
            .map_err(io_err("open", &self.rel))?;
        let len = file.metadata().map_err(io_err("stat", &self.rel))?.len();
        let torn = len > self.offset;
        // A torn last line is terminated first, so the new lines cannot glue onto it.
        let written = if torn { file.write_all(b"\n") } else { Ok(()) }
            .and_then(|()| parts.iter().try_for_each(|part| file.write_all(&part.text)))
            .map_err(io_err("append", &self.rel));
        let synced = written.and_then(|()| {
            if !durable {
                Ok(())
            } else if self.fail_next_sync.swap(false, Ordering::SeqCst) {
                Err(io_err("fsync", &self.rel)(std::io::Error::other(
                    "injected fsync failure",
                )))
            } else {
                super::atomic::count_sync();
                file.sync_data().map_err(io_err("fsync", &self.rel))
            }
        });
        if let Err(e) = synced {
            // Not acknowledged, so it must never be applied — by this process's next catch-up
            // or another's: cut the file back to where it was (we hold the exclusive lock).
            let undone = file.set_len(len).and_then(|()| file.sync_data());
            if undone.is_err() {
                self.poisoned = true;
            }
            return Err(e);
        }
        if !torn {
            for part in parts {
                self.offset += part.text.len() as u64;
                self.lines += part.count;
                self.prefix.update(&part.text);
            }
        }
        Ok(torn)
    }
}

/// Verifies one line of a file store's operation log (`memory.log`, `variables.log`) without
/// its terminator: `<16 hex digits of checksum> <JSON payload>`. Returns the payload, or what
/// is wrong in lowercase words. The store reads its logs through this, and `tavern check`
/// verifies them with it, so the format is checked in one place.
///
/// # Errors
/// A line that is not UTF-8, has no checksum, or whose checksum does not match its payload.
pub fn verify_line(raw: &[u8]) -> Result<&str, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "not utf-8".to_owned())?;
    let (digest, payload) = text
        .split_once(' ')
        .ok_or_else(|| "no checksum (torn or foreign line)".to_owned())?;
    if short_digest_ascii(&[payload.as_bytes()]) != digest.as_bytes() {
        return Err("checksum mismatch (torn or edited line)".into());
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tavern_core::revision::short_digest;

    /// Lines built ahead (`LogLines`: payloads serialized in place, digests filled in after)
    /// are the log's line format — digest, space, payload, newline — read back as their
    /// payloads; appended in parts they make the file one append of the whole would.
    #[test]
    fn lines_built_ahead_are_the_lines_appended() {
        let values = [
            serde_json::json!({"put": {"content": "银色大门 \"quoted\"\n", "n": 1.5}}),
            serde_json::json!([]),
            serde_json::json!("x"),
        ];
        let payloads: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let expected: String = payloads
            .iter()
            .map(|p| format!("{} {p}\n", short_digest(&[p.as_bytes()])))
            .collect();
        let mut built = LogLines::with_capacity(8);
        for value in &values {
            built.push_json(value).unwrap();
        }
        assert_eq!(std::str::from_utf8(&built.text), Ok(expected.as_str()));
        assert_eq!(built.count, 3);
        let mut pushed = LogLines::default();
        for payload in &payloads {
            pushed.push(payload);
        }
        assert_eq!(built.text, pushed.text);
        for (line, payload) in expected.lines().zip(&payloads) {
            assert_eq!(verify_line(line.as_bytes()), Ok(payload.as_str()));
        }

        let dir = tempfile::tempdir().unwrap();
        let flag = || Arc::new(AtomicBool::new(false));
        let mut log = DurableLog::open(dir.path(), "t.log", flag(), flag()).unwrap();
        let mut first = LogLines::default();
        first.push_json(&values[0]).unwrap();
        let mut rest = LogLines::default();
        for value in &values[1..] {
            rest.push_json(value).unwrap();
        }
        assert!(!log.append_lines(&[first, rest], true).unwrap());
        let on_disk = std::fs::read_to_string(dir.path().join("t.log")).unwrap();
        assert_eq!(on_disk, expected);
        assert_eq!((log.offset, log.lines), (expected.len() as u64, 3));
        let mut prefix = Xxh3::default();
        prefix.update(expected.as_bytes());
        assert_eq!(log.prefix.digest128(), prefix.digest128());
    }

    /// Payloads come back in order with damaged, blank and foreign lines between them skipped
    /// and named by line number; a torn tail waits for its newline; a second read returns only
    /// what was appended since.
    #[test]
    fn payloads_are_read_in_place_and_damaged_lines_named() {
        let dir = tempfile::tempdir().unwrap();
        let flag = || Arc::new(AtomicBool::new(false));
        let mut log = DurableLog::open(dir.path(), "t.log", flag(), flag()).unwrap();
        let line = |p: &str| format!("{} {p}\n", short_digest(&[p.as_bytes()]));
        let text = [
            line(r#"{"a":1}"#),
            "\n".to_owned(),
            line(r#"{"b":"银色大门"}"#).replace("银色", "金色"),
            "hello from another program\n".to_owned(),
            line(r#"{"c":"银色大门"}"#),
            line(r#"{"torn":true}"#).trim_end().to_owned(),
        ]
        .concat();
        std::fs::write(dir.path().join("t.log"), text).unwrap();
        let mut diags = Vec::new();
        let NewLines::Lines(first) = log.read_new(&mut diags).unwrap() else {
            panic!("not replaced")
        };
        assert_eq!(
            first.iter().collect::<Vec<_>>(),
            [r#"{"a":1}"#, r#"{"c":"银色大门"}"#]
        );
        let lines: Vec<&str> = diags.iter().map(|d| d.file.as_str()).collect();
        assert_eq!(lines, ["t.log line 2", "t.log line 3", "t.log line 4"]);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("t.log"))
            .unwrap();
        std::io::Write::write_all(&mut f, format!("\n{}", line("{}")).as_bytes()).unwrap();
        let NewLines::Lines(second) = log.read_new(&mut diags).unwrap() else {
            panic!("not replaced")
        };
        assert_eq!(
            second.iter().collect::<Vec<_>>(),
            [r#"{"torn":true}"#, "{}"]
        );
        assert_eq!(second.len(), 2);
    }
}
