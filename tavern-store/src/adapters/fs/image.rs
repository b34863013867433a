//! A saved image of a log's table (`memory.image` beside `memory.log`): opening a large store
//! reads it and replays only the log lines written since, instead of parsing and indexing
//! every line again.
//!
//! File: `tvimage` and a version byte, the body's length and its XXH3-128 checksum, then the
//! body: the log position the table reflects (byte offset and line count), the XXH3-128 of the
//! log's bytes before that offset, and the table's own image ([`OpTable::write_image`]).
//!
//! An image is trusted only when its checksum holds (a torn or damaged file is reported and
//! the table rebuilt from the log) and the log still begins with the very bytes it was taken
//! from (a log compacted or replaced since, by this process or another, makes it stale: the
//! table is rebuilt, silently). It is written atomically (temp + fsync + rename), from a table
//! that reflects exactly the log's first `offset` bytes, anchored to the hash its log handle
//! kept of the very bytes it read or wrote (`DurableLog` hashes as it goes): the file is never
//! hashed again to save an image, since by then it may be another file — compacted by another
//! process, even under the inode number of the one read — so no lock is needed and other
//! processes go on writing.

use std::io::Read;
use std::path::Path;

use xxhash_rust::xxh3::Xxh3;

use super::atomic::{io_err, under, write_atomic};
use super::log::DurableLog;
use crate::engine::oplog::OpTable;
use crate::error::StoreError;

/// `tvimage` and the format version (of the whole image, table and index included).
const MAGIC: &[u8; 8] = b"tvimage\x02";
/// Magic, body length, body checksum.
pub(crate) const HEADER: usize = 8 + 8 + 16;
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
    let size = file.metadata().map_or(0, |m| m.len());
    if size > cap {
        return Ok(Found::Damaged(format!(
            "{size} bytes, more than an image of a {log_len}-byte log can be; not read"
        )));
    }
    let (bytes, prefix) = std::thread::scope(|s| {
        let prefix = s.spawn(|| prefix_digest(root, log_rel, offset));
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        bytes.extend_from_slice(&head);
        let rest = cap.saturating_sub(head.len() as u64);
        let read = (&mut file)
            .take(rest)
            .read_to_end(&mut bytes)
            .map(|_| bytes);
        let prefix = prefix
            .join()
            .unwrap_or_else(|_| Err(StoreError::Internal("hashing the log failed".into())));
        (read, prefix)
    });
    let bytes = match bytes {
        Ok(bytes) => bytes,
        Err(e) => return Ok(Found::Damaged(format!("unreadable ({e})"))),
    };
    let body = match checked_body(&bytes, MAGIC, ANCHOR) {
        Framed::Body(body) => body,
        Framed::OtherVersion => return Ok(Found::Stale),
        Framed::Damaged => return Ok(Found::Damaged("torn or damaged (checksum mismatch)".into())),
    };
    let Some((prefix, identity)) = prefix? else {
        return Ok(Found::Stale);
    };
    if prefix.digest128() != u128::from_le_bytes(digest) {
        return Ok(Found::Stale);
    }
    match T::read_image(&body[ANCHOR..]) {
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

/// What an image file's framing says about its bytes.
pub(crate) enum Framed<'a> {
    /// Magic, length and checksum hold: the body (at least an anchor long).
    Body(&'a [u8]),
    /// An image of another format version (written by another release): not damage, just
    /// not ours.
    OtherVersion,
    /// Torn or damaged.
    Damaged,
}

/// The body of an image file framed by [`frame`] with `magic`, with at least `anchor` bytes.
pub(crate) fn checked_body<'a>(bytes: &'a [u8], magic: &[u8; 8], anchor: usize) -> Framed<'a> {
    if bytes.get(..7) == Some(&magic[..7]) && bytes.get(7).is_some_and(|v| *v != magic[7]) {
        return Framed::OtherVersion;
    }
    let checked = || {
        let header = bytes.get(..HEADER)?;
        if &header[..8] != magic {
            return None;
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&header[8..16]);
        let len = usize::try_from(u64::from_le_bytes(len)).ok()?;
        let body = bytes.get(HEADER..)?;
        let mut digest = [0u8; 16];
        digest.copy_from_slice(&header[16..32]);
        (body.len() == len
            && len >= anchor
            && xxhash_rust::xxh3::xxh3_128(body) == u128::from_le_bytes(digest))
        .then_some(body)
    };
    checked().map_or(Framed::Damaged, Framed::Body)
}

/// An image file under construction: the header's room, then the anchor's (`anchor` zero
/// bytes, filled in by the caller once known, before [`seal`]), then the table's image. `None`
/// for a table that keeps no image.
pub(crate) fn frame<T: OpTable>(anchor: usize, table: &T) -> Option<Vec<u8>> {
    let mut file = vec![0u8; HEADER + anchor];
    table.write_image(&mut file).then_some(file)
}

/// The anchor's bytes in a [`frame`]d file.
pub(crate) fn anchor_mut(file: &mut [u8], anchor: usize) -> &mut [u8] {
    &mut file[HEADER..HEADER + anchor]
}

/// Writes the header (`magic`, the body's length and checksum) of a [`frame`]d file whose
/// anchor is filled in.
pub(crate) fn seal(file: &mut [u8], magic: &[u8; 8]) {
    let body_len = (file.len() - HEADER) as u64;
    let checksum = xxhash_rust::xxh3::xxh3_128(&file[HEADER..]);
    file[..8].copy_from_slice(magic);
    file[8..16].copy_from_slice(&body_len.to_le_bytes());
    file[16..32].copy_from_slice(&checksum.to_le_bytes());
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
