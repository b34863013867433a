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
const MAGIC: &[u8; 8] = b"tvimage\x01";
const HEADER: usize = 8 + 8 + 16;

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
    if super::atomic::is_special(root, image_rel) {
        return Ok(Found::Damaged("not a regular file".into()));
    }
    let mut file = match std::fs::File::open(under(root, image_rel)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Absent),
        Err(e) => return Ok(Found::Damaged(format!("unreadable ({e})"))),
    };
    // The anchor first: the log's prefix is hashed on another thread while the rest of the
    // image is read (both are trusted only once the image's checksum holds).
    let mut head = [0u8; HEADER + 32];
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
    let (bytes, prefix) = std::thread::scope(|s| {
        let prefix = s.spawn(|| prefix_digest(root, log_rel, offset));
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        bytes.extend_from_slice(&head);
        let read = file.read_to_end(&mut bytes).map(|_| bytes);
        let prefix = prefix
            .join()
            .unwrap_or_else(|_| Err(StoreError::Internal("hashing the log failed".into())));
        (read, prefix)
    });
    let bytes = match bytes {
        Ok(bytes) => bytes,
        Err(e) => return Ok(Found::Damaged(format!("unreadable ({e})"))),
    };
    // Another format version (written by another release): not damage, just not ours.
    if bytes.get(..7) == Some(&MAGIC[..7]) && bytes.get(7) != Some(&MAGIC[7]) {
        return Ok(Found::Stale);
    }
    let Some(body) = checked_body(&bytes) else {
        return Ok(Found::Damaged("torn or damaged (checksum mismatch)".into()));
    };
    let Some((prefix, identity)) = prefix? else {
        return Ok(Found::Stale);
    };
    if prefix.digest128() != u128::from_le_bytes(digest) {
        return Ok(Found::Stale);
    }
    match T::read_image(&body[32..]) {
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

/// The body of an image file whose header and checksum hold (at least an anchor long).
fn checked_body(bytes: &[u8]) -> Option<&[u8]> {
    let header = bytes.get(..HEADER)?;
    if &header[..8] != MAGIC {
        return None;
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[8..16]);
    let len = usize::try_from(u64::from_le_bytes(len)).ok()?;
    let body = bytes.get(HEADER..)?;
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&header[16..32]);
    (body.len() == len
        && len >= 32
        && xxhash_rust::xxh3::xxh3_128(body) == u128::from_le_bytes(digest))
    .then_some(body)
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
    let digest = anchor.prefix.digest128();
    // One buffer: header and anchor first, filled in once the body is written.
    let mut file = vec![0u8; HEADER];
    file.extend_from_slice(&anchor.offset.to_le_bytes());
    file.extend_from_slice(&anchor.lines.to_le_bytes());
    file.extend_from_slice(&digest.to_le_bytes());
    if !table.write_image(&mut file) {
        return Ok(false);
    }
    let body_len = (file.len() - HEADER) as u64;
    let checksum = xxhash_rust::xxh3::xxh3_128(&file[HEADER..]);
    file[..8].copy_from_slice(MAGIC);
    file[8..16].copy_from_slice(&body_len.to_le_bytes());
    file[16..32].copy_from_slice(&checksum.to_le_bytes());
    write_atomic(root, image_rel, &file)?;
    Ok(true)
}
