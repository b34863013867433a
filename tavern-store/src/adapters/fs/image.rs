//! A saved image of a log's table (`memory.image` beside `memory.log`): opening a large store
//! reads it and replays only the log lines written since, instead of parsing and indexing
//! every line again.
//!
//! File: `tvimage` and a version byte, the body's length, how many of its first bytes the
//! checksum covers and their XXH3-128 checksum, then the body: the log position the table
//! reflects (byte offset and line count), the XXH3-128 of the log's bytes before that offset,
//! and the table's own image ([`OpTable::write_image`]) — what an open reads and checks —
//! followed by what the table reads later where it lies in the file (the search index's
//! postings, outside the checked part: each list carries its own checksum, kept in the checked
//! part). The records lie in the checked part and are read again where they lie when first
//! needed, each checked against the checksum the open took of it.
//!
//! An image is trusted only when its length is the one its header gives and its checksum
//! holds (a torn or damaged file is reported and the table rebuilt from the log; a posting
//! list damaged since is found when first read, and the index rebuilt from the records; a
//! record changed since makes the table read again from the log) and the log still begins
//! with the very bytes it was taken
//! from (a log compacted or replaced since, by this process or another, makes it stale: the
//! table is rebuilt, silently). It is written atomically (temp + fsync + rename), from a table
//! that reflects exactly the log's first `offset` bytes, anchored to the hash its log handle
//! kept of the very bytes it read or wrote (`DurableLog` hashes as it goes): the file is never
//! hashed again to save an image, since by then it may be another file — compacted by another
//! process, even under the inode number of the one read — so no lock is needed and other
//! processes go on writing.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use tavern_search::{ReadAt, Region};
use xxhash_rust::xxh3::Xxh3;

use super::atomic::{io_err, under, write_atomic};
use super::log::DurableLog;
use crate::engine::oplog::OpTable;
use crate::error::StoreError;

/// `tvimage` and the format version (of the whole image, table and index included).
const MAGIC: &[u8; 8] = b"tvimage\x05";
/// Magic, body length, checked length, checksum of the checked bytes.
pub(crate) const HEADER: usize = 8 + 8 + 8 + 16;
/// Log offset, line count, prefix digest.
const ANCHOR: usize = 8 + 8 + 16;
/// The largest image read per byte of its log (images run 1.2–2× their log: records stored
/// once, plus the index).
const MAX_IMAGE_PER_LOG_BYTE: u64 = 8;

/// Where in its log a table image was taken.
#[derive(Clone)]
pub(crate) struct Anchor {
    /// Bytes of the log the table reflects (a line boundary).
    pub(crate) offset: u64,
    /// Lines in those bytes.
    pub(crate) lines: u64,
    /// The identity of the log file hashed (see `log::identity`).
    pub(crate) identity: Option<u64>,
    /// The hash of those bytes so far (a reader goes on hashing what it reads after them).
    pub(crate) prefix: Box<Xxh3>,
}

/// What looking for an image found.
pub(crate) enum Found<T> {
    /// No image file.
    Absent,
    /// An image of a log that is no longer this one (compacted or replaced since).
    Stale,
    /// An image that cannot be read: why, in lowercase words.
    Damaged(String),
    /// The table as of `Anchor` in the log.
    Fresh(T, Anchor),
}

/// A log prefix's hash state and the identity of the file hashed.
type HashedPrefix = (Box<Xxh3>, Option<u64>);

/// The XXH3-128 state over the first `len` bytes of the log at `rel` and the file's
/// identity; `None` when the file is shorter.
fn prefix_digest(root: &Path, rel: &str, len: u64) -> Result<Option<HashedPrefix>, StoreError> {
    let mut file = std::fs::File::open(under(root, rel)).map_err(io_err("open", rel))?;
    let meta = file.metadata().map_err(io_err("stat", rel))?;
    if meta.len() < len {
        return Ok(None);
    }
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        let got = file.read(&mut buf[..want]).map_err(io_err("read", rel))?;
        if got == 0 {
            return Ok(None);
        }
        hasher.update(&buf[..got]);
        left -= got as u64;
    }
    Ok(Some((Box::new(hasher), super::log::identity(&meta))))
}

/// Reads the image at `image_rel` of the table of the log at `log_rel`. The caller holds the
/// log's lock (shared is enough) until it has positioned its log at the anchor and caught up.
pub(crate) fn load<T: OpTable>(
    root: &Path,
    image_rel: &str,
    log_rel: &str,
) -> Result<Found<T>, StoreError> {
    // A FIFO would block the open, a device never end: only a regular file is read.
    let mut file = match super::atomic::open_regular(&under(root, image_rel)) {
        Ok(Some(file)) => file,
        Ok(None) => return Ok(Found::Damaged("not a regular file".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Absent),
        Err(e) => return Ok(Found::Damaged(format!("unreadable ({e})"))),
    };
    // The anchor first: the log's prefix is hashed on another thread while the rest of the
    // image is read (both are trusted only once the image's checksum holds).
    let mut head = [0u8; HEADER + ANCHOR];
    match file.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Ok(Found::Damaged(
                "torn or damaged (shorter than its header)".into(),
            ))
        }
        Err(e) => return Ok(Found::Damaged(format!("unreadable ({e})"))),
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&head[HEADER + at..HEADER + at + 8]);
        u64::from_le_bytes(w)
    };
    let (offset, lines) = (word(0), word(8));
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&head[HEADER + 16..HEADER + 32]);
    // The store wrote it, but whatever lies at that name is read only up to a size an image
    // of this log could have: a foreign file of any size is refused, not read whole.
    let log_len = std::fs::metadata(under(root, log_rel)).map_or(0, |m| m.len());
    let cap = log_len
        .saturating_mul(MAX_IMAGE_PER_LOG_BYTE)
        .saturating_add(1 << 20);
    let framing = match framing(&head, MAGIC, ANCHOR) {
        Framed::Ours(framing) => framing,
        Framed::OtherVersion => return Ok(Found::Stale),
        Framed::Damaged(why) => return Ok(Found::Damaged(why)),
    };
    let (checked, prefix) = std::thread::scope(|s| {
        let prefix = s.spawn(|| prefix_digest(root, log_rel, offset));
        let checked = read_checked(&mut file, &head, &framing, cap);
        let prefix = prefix
            .join()
            .unwrap_or_else(|_| Err(StoreError::Internal("hashing the log failed".into())));
        (checked, prefix)
    });
    let bytes = match checked {
        Ok(bytes) => bytes,
        Err(why) => return Ok(Found::Damaged(why)),
    };
    let body = &bytes[HEADER..];
    let Some((prefix, identity)) = prefix? else {
        return Ok(Found::Stale);
    };
    if prefix.digest128() != u128::from_le_bytes(digest) {
        return Ok(Found::Stale);
    }
    match T::read_image(&body[ANCHOR..], &framing.table(file, ANCHOR)) {
        Ok(table) => Ok(Found::Fresh(
            table,
            Anchor {
                offset,
                lines,
                identity,
                prefix,
            },
        )),
        Err(e) => Ok(Found::Damaged(e)),
    }
}

/// An image file read where its bytes lie (a record or a posting list when a call first needs
/// it). The store never writes into it (a new image replaces it by rename), so the bytes read
/// later are the ones there at open — unless another program wrote into it: each record and
/// list is checked against its checksum when read.
struct ImageFile(std::fs::File);

impl ReadAt for ImageFile {
    #[cfg(unix)]
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, offset)
    }

    #[cfg(windows)]
    fn read_at(&self, mut offset: u64, mut buf: &mut [u8]) -> std::io::Result<()> {
        while !buf.is_empty() {
            match std::os::windows::fs::FileExt::seek_read(&self.0, buf, offset)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }

    #[cfg(not(any(unix, windows)))]
    fn read_at(&self, _offset: u64, _buf: &mut [u8]) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

/// What an image file's header gives: the body's length and how many of its first bytes
/// (anchor and table image) the checksum covers; the rest is read where it lies.
pub(crate) struct Framing {
    body: u64,
    checked: u64,
    checksum: u128,
}

impl Framing {
    /// The body's bytes after its first `anchor`, where they lie in `file`: the table's image,
    /// the part read at open followed by the rest.
    pub(crate) fn table(&self, file: std::fs::File, anchor: usize) -> Region {
        Region::new(
            Arc::new(ImageFile(file)),
            (HEADER + anchor) as u64,
            self.body.saturating_sub(anchor as u64),
        )
    }
}

/// What an image file's header says.
pub(crate) enum Framed {
    /// An image of this format, and its framing.
    Ours(Framing),
    /// An image of another format version (written by another release): not damage, just
    /// not ours.
    OtherVersion,
    /// Torn or damaged: why, in lowercase words.
    Damaged(String),
}

/// The framing of an image file from its first bytes (at least [`HEADER`]), written with
/// `magic` by [`frame`] and [`seal`] with an anchor of `anchor` bytes.
pub(crate) fn framing(head: &[u8], magic: &[u8; 8], anchor: usize) -> Framed {
    if head.get(..7) == Some(&magic[..7]) && head.get(7).is_some_and(|v| *v != magic[7]) {
        return Framed::OtherVersion;
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(head.get(at..at + 8)?);
        Some(u64::from_le_bytes(w))
    };
    let (Some(body), Some(checked), Some(sum)) = (word(8), word(16), head.get(24..HEADER)) else {
        return Framed::Damaged("torn or damaged (shorter than its header)".into());
    };
    if &head[..8] != magic {
        return Framed::Damaged("not an image (wrong magic)".into());
    }
    if body > u64::MAX - HEADER as u64 {
        return Framed::Damaged(format!("torn or damaged (its header says {body} bytes)"));
    }
    if checked < anchor as u64 || checked > body {
        return Framed::Damaged(format!(
            "torn or damaged (its header says {checked} of {body} bytes are checked)"
        ));
    }
    let mut checksum = [0u8; 16];
    checksum.copy_from_slice(sum);
    Framed::Ours(Framing {
        body,
        checked,
        checksum: u128::from_le_bytes(checksum),
    })
}

/// Test support: replaces each `from` with `to` (as long) in the part of the image file at
/// `path` an open does not read — the records' bytes, then the postings, each checked when
/// first read — as a disk or another program changing the file would; returns how many.
///
/// # Errors
/// The file cannot be read or written, is not framed as an image, or `to` is not as long as
/// `from`.
#[cfg(feature = "testkit")]
pub fn change_unread_part(path: &Path, from: &[u8], to: &[u8]) -> std::io::Result<usize> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
    if from.len() != to.len() || from.is_empty() {
        return Err(invalid(
            "the replacement is not as long as what it replaces",
        ));
    }
    let mut bytes = std::fs::read(path)?;
    let checked = bytes
        .get(16..24)
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
        .map(u64::from_le_bytes)
        .and_then(|n| usize::try_from(n).ok())
        .and_then(|n| n.checked_add(HEADER))
        .filter(|end| *end <= bytes.len())
        .ok_or_else(|| invalid("not an image"))?;
    let mut changed = 0;
    let mut at = checked;
    while at + from.len() <= bytes.len() {
        if &bytes[at..at + from.len()] == from {
            bytes[at..at + from.len()].copy_from_slice(to);
            changed += 1;
            at += from.len();
        } else {
            at += 1;
        }
    }
    std::fs::write(path, &bytes)?;
    Ok(changed)
}

/// Reads the checked part of an image file whose first bytes `head` (its header and anchor)
/// are read already, after checking that the file is no larger than `cap` and as long as its
/// header says: the header and the checked bytes, their checksum verified.
pub(crate) fn read_checked(
    file: &mut std::fs::File,
    head: &[u8],
    framing: &Framing,
    cap: u64,
) -> Result<Vec<u8>, String> {
    let size = file
        .metadata()
        .map_err(|e| format!("unreadable ({})", e.kind()))?
        .len();
    if size > cap {
        return Err(format!(
            "{size} bytes, more than an image of this table can be; not read"
        ));
    }
    // `framing` bounded the body below `u64::MAX - HEADER`.
    let expected = HEADER as u64 + framing.body;
    if size != expected {
        return Err(format!(
            "torn or damaged ({size} bytes where its header says {expected})"
        ));
    }
    let checked_end = usize::try_from(HEADER as u64 + framing.checked)
        .map_err(|_| "torn or damaged (too large to read)".to_string())?;
    if checked_end < head.len() {
        return Err("torn or damaged (shorter than its header)".into());
    }
    let mut bytes = vec![0u8; checked_end];
    bytes[..head.len()].copy_from_slice(head);
    file.read_exact(&mut bytes[head.len()..])
        .map_err(|e| format!("unreadable ({})", e.kind()))?;
    if xxhash_rust::xxh3::xxh3_128(&bytes[HEADER..]) != framing.checksum {
        return Err("torn or damaged (checksum mismatch)".into());
    }
    Ok(bytes)
}

/// An image file under construction: the header's room, then the anchor's (`anchor` zero
/// bytes, filled in by the caller once known, before [`seal`]), then the table's image, then
/// what the table reads where it lies. `None` for a table that keeps no image, or whose image
/// cannot be written now.
pub(crate) fn frame<T: OpTable>(anchor: usize, table: &T) -> Option<Vec<u8>> {
    let mut file = vec![0u8; HEADER + anchor];
    let mut rest = Vec::new();
    if !table.write_image(&mut file, &mut rest) {
        return None;
    }
    let checked = (file.len() - HEADER) as u64;
    file[16..24].copy_from_slice(&checked.to_le_bytes());
    file.extend_from_slice(&rest);
    Some(file)
}

/// The anchor's bytes in a [`frame`]d file.
pub(crate) fn anchor_mut(file: &mut [u8], anchor: usize) -> &mut [u8] {
    &mut file[HEADER..HEADER + anchor]
}

/// Writes the header (`magic`, the body's length, the checksum of its checked part) of a
/// [`frame`]d file whose anchor is filled in.
pub(crate) fn seal(file: &mut [u8], magic: &[u8; 8]) {
    let body_len = (file.len() - HEADER) as u64;
    let mut checked = [0u8; 8];
    checked.copy_from_slice(&file[16..24]);
    let checked_end = HEADER + usize::try_from(u64::from_le_bytes(checked)).unwrap_or(0);
    let checksum = xxhash_rust::xxh3::xxh3_128(file.get(HEADER..checked_end).unwrap_or_default());
    file[..8].copy_from_slice(magic);
    file[8..16].copy_from_slice(&body_len.to_le_bytes());
    file[24..40].copy_from_slice(&checksum.to_le_bytes());
}

/// Writes the image of `table`, which reflects exactly the lines `log` has read, to
/// `image_rel` (no lock needed: see the module doc). Returns `false` (writing nothing) for a
/// log handle that an earlier failed write left unusable or a table that keeps no image.
pub(crate) fn save<T: OpTable>(
    root: &Path,
    image_rel: &str,
    log: &DurableLog,
    table: &T,
) -> Result<bool, StoreError> {
    let Some(anchor) = log.position() else {
        return Ok(false);
    };
    let Some(mut file) = frame(ANCHOR, table) else {
        return Ok(false);
    };
    let at = anchor_mut(&mut file, ANCHOR);
    at[..8].copy_from_slice(&anchor.offset.to_le_bytes());
    at[8..16].copy_from_slice(&anchor.lines.to_le_bytes());
    at[16..].copy_from_slice(&anchor.prefix.digest128().to_le_bytes());
    seal(&mut file, MAGIC);
    write_atomic(root, image_rel, &file)?;
    Ok(true)
}
