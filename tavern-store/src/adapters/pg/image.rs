//! A saved image of this process's memory mirror (`memory.image` in the directory
//! [`super::PgOptions::memory_image_dir`] names): a process opening a large database reads it
//! and fetches only the rows written since, instead of every row of `memory_ops`.
//!
//! File: as the file store's images (`fs::image`: magic and version, the body's length, the
//! length and XXH3-128 of the part an open reads, then the posting lists read where they lie
//! when a search first needs them), with the anchor `memory_ops`'s identity and position: the database's
//! and the table's object ids, the XXH3-128 of the store's random identity token
//! (`store_identity`, made with the schema and again when a copy fills the store), the
//! sequence number of the last row the mirror applied and the XXH3-128 of that row (its
//! operation text and reset flag). Rows are never changed, only appended or deleted by a
//! compaction (after its `reset` row), so while the very row the image ends at is still in the
//! same table of the same store, every row before it is the one the image was made from and
//! every row after it is one the image lacks. The anchor is checked before the rest of the file
//! is read: another store (a database made again, even in a cluster made again from scratch
//! with the same object ids; a restored dump; another store pointed at the same directory) or
//! a compaction since make the image stale and it is not read at all — the mirror is read from
//! the database, silently. A torn or damaged file, or one larger than 8× the table, is
//! reported and the database read too; a posting list found damaged later is reported and the
//! index rebuilt from the records, a record changed in the file since the open makes the
//! mirror read every row again. A row edited by hand is not detected: delete the image after
//! changing `memory_ops` by hand.

use std::io::Read;
use std::path::{Path, PathBuf};

use tokio_postgres::types::ToSql;

use super::ops::{Mirror, OpsTable};
use super::{db, Inner};
use crate::adapters::fs::atomic::open_regular;
use crate::adapters::fs::atomic::{io_err, write_atomic_as};
use crate::adapters::fs::image::{
    anchor_mut, frame, framing, read_checked, seal, Framed, Framing, HEADER,
};
use crate::blocking::off_the_worker;
use crate::engine::memory_table::MemoryTable;
use crate::engine::oplog::OpTable;
use crate::error::StoreError;

/// The image's file name in its directory.
pub const FILE: &str = "memory.image";
/// What a saving image's temporary file is named from, so that the sweep at open removes only
/// those from a directory the operator chose.
pub(super) const TEMP_PREFIX: &str = ".tmp-memory.image-";
/// `tvpgimg` and the format version (of the whole image, table and index included).
const MAGIC: &[u8; 8] = b"tvpgimg\x05";
/// Database oid, table oid, the store's identity digest, sequence number, the row's digest.
const ANCHOR: usize = 8 + 8 + 16 + 8 + 16;
/// The largest image read per byte the table takes on the server (an image runs well below
/// it: records with their columns, varint postings).
const MAX_IMAGE_PER_TABLE_BYTE: u64 = 8;

/// A new image is saved once the mirror is this many sequence numbers past the last one
/// (opening replayed that many rows: the next open spares them).
pub(super) const IMAGE_MIN_NEW_ROWS: i64 = 4096;

/// Where in `memory_ops` an image was taken: what must still hold for it to be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Anchor {
    database: i64,
    table: i64,
    /// XXH3-128 of the store's random identity token (`store_identity`).
    identity: u128,
    /// The last row the image reflects.
    pub(super) seq: i64,
    /// XXH3-128 of that row.
    row: u128,
}

impl Anchor {
    fn to_bytes(self) -> [u8; ANCHOR] {
        let mut out = [0u8; ANCHOR];
        out[..8].copy_from_slice(&self.database.to_le_bytes());
        out[8..16].copy_from_slice(&self.table.to_le_bytes());
        out[16..32].copy_from_slice(&self.identity.to_le_bytes());
        out[32..40].copy_from_slice(&self.seq.to_le_bytes());
        out[40..].copy_from_slice(&self.row.to_le_bytes());
        out
    }

    fn from_bytes(b: &[u8; ANCHOR]) -> Self {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            i64::from_le_bytes(w)
        };
        let digest = |at: usize| {
            let mut d = [0u8; 16];
            d.copy_from_slice(&b[at..at + 16]);
            u128::from_le_bytes(d)
        };
        Self {
            database: word(0),
            table: word(8),
            identity: digest(16),
            seq: word(32),
            row: digest(40),
        }
    }
}

/// An image file's first bytes: the framing's header and the anchor.
type Head = [u8; HEADER + ANCHOR];

/// What looking for an image found.
enum Found<T> {
    /// No image file, or one of another format version.
    Absent,
    /// An image that cannot be read: why, in lowercase words.
    Damaged(String),
    /// The file, opened, its first bytes (the rest not read yet) and its framing.
    Opened(std::fs::File, Box<Head>, Framing),
    /// The table it holds.
    Read(Box<T>),
}

/// Opens the image in `dir` and reads its header and anchor (blocking).
fn open_image<T>(dir: &Path) -> Found<T> {
    // A FIFO would block the open, a device never end: only a regular file is read.
    let mut file = match open_regular(&dir.join(FILE)) {
        Ok(Some(file)) => file,
        Ok(None) => return Found::Damaged("not a regular file".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Absent,
        Err(e) => return Found::Damaged(format!("unreadable ({})", e.kind())),
    };
    let mut head = Box::new([0u8; HEADER + ANCHOR]);
    match file.read_exact(&mut head[..]) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Found::Damaged("torn or damaged (shorter than its header)".into())
        }
        Err(e) => return Found::Damaged(format!("unreadable ({})", e.kind())),
    }
    match framing(&head[..], MAGIC, ANCHOR) {
        // Another release's: not damage, just not ours.
        Framed::OtherVersion => Found::Absent,
        Framed::Damaged(why) => Found::Damaged(why),
        Framed::Ours(framing) => Found::Opened(file, head, framing),
    }
}

/// Reads the checked rest of an opened image (the file at most `cap` bytes) and the table it
/// holds, which reads the postings where they lie in the file later (blocking).
fn read_image<T: OpTable>(
    mut file: std::fs::File,
    head: &Head,
    framing: &Framing,
    cap: u64,
) -> Found<T> {
    let bytes = match read_checked(&mut file, head, framing, cap) {
        Ok(bytes) => bytes,
        Err(why) => return Found::Damaged(why),
    };
    match T::read_image(&bytes[HEADER + ANCHOR..], &framing.table(file, ANCHOR)) {
        Ok(table) => Found::Read(Box::new(table)),
        Err(e) => Found::Damaged(e),
    }
}

impl Inner {
    /// The anchor of `T`'s table at row `seq` as the database holds it now (`None` when that
    /// row is no longer in the table: a compaction deleted it), and the bytes the table takes.
    async fn anchor_at<T: OpsTable>(&self, seq: i64) -> Result<(Option<Anchor>, u64), StoreError> {
        let client = self.client("image").await?;
        let param: [&(dyn ToSql + Sync); 1] = [&seq];
        let identity = format!(
            "SELECT
                (SELECT oid::bigint FROM pg_database WHERE datname = current_database()),
                '{table}'::regclass::oid::bigint,
                (SELECT token FROM store_identity WHERE id = 1),
                (SELECT op::text FROM {table} WHERE seq = $1),
                (SELECT reset FROM {table} WHERE seq = $1),
                pg_total_relation_size('{table}'::regclass)",
            table = T::NAME
        );
        let row = client
            .query_one(&identity, &param)
            .await
            .map_err(db("image"))?;
        let database: Option<i64> = row.try_get(0).map_err(db("image"))?;
        let table: i64 = row.try_get(1).map_err(db("image"))?;
        let token: Option<&str> = row.try_get(2).map_err(db("image"))?;
        let op: Option<&str> = row.try_get(3).map_err(db("image"))?;
        let reset: Option<bool> = row.try_get(4).map_err(db("image"))?;
        let size: i64 = row.try_get(5).map_err(db("image"))?;
        let size = u64::try_from(size).unwrap_or(0);
        let (Some(database), Some(token), Some(op), Some(reset)) = (database, token, op, reset)
        else {
            return Ok((None, size));
        };
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(op.as_bytes());
        hasher.update(&[u8::from(reset)]);
        let anchor = Anchor {
            database,
            table,
            identity: xxhash_rust::xxh3::xxh3_128(token.as_bytes()),
            seq,
            row: hasher.digest128(),
        };
        Ok((Some(anchor), size))
    }

    /// Starts a mirror that has read nothing yet from the image in `dir`, when it matches
    /// the database ([`Inner::lock_mirror`], holding the mirror). A damaged image is
    /// reported; a stale one ignored.
    pub(super) async fn restore_image<T: OpsTable>(
        &self,
        dir: PathBuf,
        m: &mut Mirror<T>,
    ) -> Result<(), StoreError> {
        if m.seq != 0 {
            return Ok(());
        }
        let damaged = |why: String| {
            self.diag(
                FILE.into(),
                format!("{why}; the memories were read from the database instead"),
            );
        };
        let (file, head, framing) = match blocking(move || open_image::<T>(&dir)).await {
            Found::Opened(file, head, framing) => (file, head, framing),
            Found::Damaged(why) => {
                damaged(why);
                return Ok(());
            }
            Found::Absent | Found::Read(_) => return Ok(()),
        };
        let mut anchor = [0u8; ANCHOR];
        anchor.copy_from_slice(&head[HEADER..]);
        let anchor = Anchor::from_bytes(&anchor);
        // Checked before the rest is read: an image of another store, or of rows compacted
        // since, is never read at all.
        let (now, size) = self.anchor_at::<T>(anchor.seq).await?;
        if now != Some(anchor) {
            return Ok(());
        }
        let cap = size
            .saturating_mul(MAX_IMAGE_PER_TABLE_BYTE)
            .saturating_add(1 << 20);
        match blocking(move || read_image::<T>(file, &head, &framing, cap)).await {
            Found::Read(table) => {
                m.table = *table;
                m.seq = anchor.seq;
                m.image_seq = anchor.seq;
                m.image_read = true;
            }
            Found::Damaged(why) => damaged(why),
            Found::Absent | Found::Opened(..) => {}
        }
        Ok(())
    }

    /// Saves the memory mirror's image when one is due: an image directory is set, every row
    /// so far could be read, and the mirror moved past the last image (by
    /// [`IMAGE_MIN_NEW_ROWS`] unless `force`). The table is encoded under the mirror's lock
    /// (on a multi-threaded runtime, with the worker's other tasks handed over meanwhile); the
    /// row it ends at is then looked up and the file written without it.
    pub(super) async fn save_memory_image(&self, force: bool) -> Result<bool, StoreError> {
        let Some(dir) = self.image_dir.clone().filter(|_| self.image_saves) else {
            return Ok(false);
        };
        let (seq, mut file) = {
            let mut m = self.memory.lock().await;
            let moved = m.seq - m.image_seq;
            let due = if force {
                moved != 0
            } else {
                moved >= IMAGE_MIN_NEW_ROWS
            };
            // An image holds what could be read: diagnostics stay the same on every open.
            if !due || m.seq <= 0 || !m.unreadable.is_empty() {
                return Ok(false);
            }
            // Seconds of work for a large table: on a multi-threaded runtime the worker hands
            // its other tasks over while it encodes (a current-thread runtime has no other).
            let mut encoded = None;
            // Twice at most: writing it may find a posting list of the image the mirror was
            // read from damaged (nothing written), and then the index is rebuilt first.
            // Seconds of work for a large table: off the worker.
            for _ in 0..2 {
                encoded = off_the_worker(|| frame(ANCHOR, &m.table));
                if encoded.is_some() || !off_the_worker(|| m.table.heal()) {
                    break;
                }
                self.diag(
                    FILE.into(),
                    "a posting list read from it was damaged; the search index was rebuilt \
                     from the records"
                        .into(),
                );
            }
            let Some(file) = encoded else {
                return Ok(false);
            };
            (m.seq, file)
        };
        // Gone already (compacted by another process): the image would never be trusted.
        let Some(anchor) = self.anchor_at::<MemoryTable>(seq).await?.0 else {
            return Ok(false);
        };
        anchor_mut(&mut file, ANCHOR).copy_from_slice(&anchor.to_bytes());
        seal(&mut file, MAGIC);
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).map_err(io_err("create the directory of", FILE))?;
            write_atomic_as(&dir, FILE, &file, TEMP_PREFIX)
        })
        .await
        .map_err(|_| StoreError::Internal("writing the memory image failed".into()))??;
        let mut m = self.memory.lock().await;
        // A newer image may have been saved meanwhile; either is true of its own row.
        if m.image_seq < seq {
            m.image_seq = seq;
        }
        Ok(true)
    }

    /// [`Inner::save_memory_image`] on the store's own initiative: a failure is reported,
    /// never fatal (the next open reads more rows, nothing else).
    pub(super) async fn save_memory_image_quietly(&self, force: bool) {
        if let Err(e) = self.save_memory_image(force).await {
            self.diag(FILE.into(), format!("not saved: {e}"));
        }
    }
}

/// Runs blocking file work on tokio's blocking pool.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Found<T> + Send + 'static) -> Found<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|_| Found::Damaged("reading it failed".into()))
}
