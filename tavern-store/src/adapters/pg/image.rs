//! A saved image of this process's memory mirror (`memory.image` in the directory
//! [`super::PgOptions::memory_image_dir`] names): a process opening a large database reads it
//! and fetches only the rows written since, instead of every row of `memory_ops`.
//!
//! File: as the file store's images (`fs::image`: magic and version, the body's length and
//! XXH3-128 checksum), with the anchor `memory_ops`'s identity and position: the database's
//! and the table's object ids, the sequence number of the last row the mirror applied and the
//! XXH3-128 of that row (its operation text and reset flag). Rows are never changed, only
//! appended or deleted by a compaction (after its `reset` row), so while the very row the image
//! ends at is still in the same table of the same database, every row before it is the one the
//! image was made from and every row after it is one the image lacks. A table dropped and made
//! again, another database (a restored dump, another cluster, another store pointed at the same
//! directory) or a compaction since make the image stale: the mirror is read from the database,
//! silently. A torn or damaged file is reported and read from the database too.

use std::path::{Path, PathBuf};

use tokio_postgres::types::ToSql;

use super::ops::{Mirror, OpsTable};
use super::{db, Inner};
use crate::adapters::fs::atomic::{io_err, write_atomic};
use crate::adapters::fs::image::{anchor_mut, checked_body, frame, seal, Framed};
use crate::engine::memory_table::MemoryTable;
use crate::engine::oplog::OpTable;
use crate::error::StoreError;

/// The image's file name in its directory.
pub(super) const FILE: &str = "memory.image";
/// `tvpgimg` and the format version (of the whole image, table and index included).
const MAGIC: &[u8; 8] = b"tvpgimg\x01";
/// Database oid, table oid, sequence number, the row's digest.
const ANCHOR: usize = 8 + 8 + 8 + 16;

/// A new image is saved once the mirror is this many sequence numbers past the last one
/// (opening replayed that many rows: the next open spares them).
pub(super) const IMAGE_MIN_NEW_ROWS: i64 = 4096;

/// Where in `memory_ops` an image was taken: what must still hold for it to be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Anchor {
    database: i64,
    table: i64,
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
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        out[24..].copy_from_slice(&self.row.to_le_bytes());
        out
    }

    fn from_bytes(b: &[u8]) -> Self {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            i64::from_le_bytes(w)
        };
        let mut row = [0u8; 16];
        row.copy_from_slice(&b[24..40]);
        Self {
            database: word(0),
            table: word(8),
            seq: word(16),
            row: u128::from_le_bytes(row),
        }
    }
}

/// What looking for an image found.
enum Found<T> {
    /// No image file, or one of another format version.
    Absent,
    /// An image that cannot be read: why, in lowercase words.
    Damaged(String),
    /// A table and where it was taken (still to be checked against the database).
    Read(Box<T>, Anchor),
}

/// Reads the image in `dir` (blocking).
fn load<T: OpTable>(dir: &Path) -> Found<T> {
    let path = dir.join(FILE);
    // A FIFO would block the open, a device never end: only a regular file is read.
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Absent,
        Err(e) => return Found::Damaged(format!("unreadable ({})", e.kind())),
        Ok(m) if !m.is_file() => return Found::Damaged("not a regular file".into()),
        Ok(_) => {}
    }
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) => return Found::Damaged(format!("unreadable ({})", e.kind())),
    };
    let body = match checked_body(&bytes, MAGIC, ANCHOR) {
        Framed::Body(body) => body,
        Framed::OtherVersion => return Found::Absent,
        Framed::Damaged => return Found::Damaged("torn or damaged (checksum mismatch)".into()),
    };
    match T::read_image(&body[ANCHOR..]) {
        Ok(table) => Found::Read(Box::new(table), Anchor::from_bytes(&body[..ANCHOR])),
        Err(e) => Found::Damaged(e),
    }
}

impl Inner {
    /// The anchor of `T`'s table at row `seq` as the database holds it now: `None` when that
    /// row is no longer in the table (a compaction deleted it).
    async fn anchor_at<T: OpsTable>(&self, seq: i64) -> Result<Option<Anchor>, StoreError> {
        let client = self.client("image").await?;
        let param: [&(dyn ToSql + Sync); 1] = [&seq];
        let identity = format!(
            "SELECT
                (SELECT oid::bigint FROM pg_database WHERE datname = current_database()),
                '{table}'::regclass::oid::bigint,
                (SELECT op::text FROM {table} WHERE seq = $1),
                (SELECT reset FROM {table} WHERE seq = $1)",
            table = T::NAME
        );
        let row = client
            .query_one(&identity, &param)
            .await
            .map_err(db("image"))?;
        let database: Option<i64> = row.try_get(0).map_err(db("image"))?;
        let table: i64 = row.try_get(1).map_err(db("image"))?;
        let op: Option<&str> = row.try_get(2).map_err(db("image"))?;
        let reset: Option<bool> = row.try_get(3).map_err(db("image"))?;
        let (Some(database), Some(op), Some(reset)) = (database, op, reset) else {
            return Ok(None);
        };
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(op.as_bytes());
        hasher.update(&[u8::from(reset)]);
        Ok(Some(Anchor {
            database,
            table,
            seq,
            row: hasher.digest128(),
        }))
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
        let found = tokio::task::spawn_blocking(move || load::<T>(&dir))
            .await
            .unwrap_or_else(|_| Found::Damaged("reading it failed".into()));
        match found {
            Found::Absent => {}
            Found::Damaged(why) => self.diag(
                FILE.into(),
                format!("{why}; the memories were read from the database instead"),
            ),
            Found::Read(table, anchor) => {
                if self.anchor_at::<T>(anchor.seq).await? == Some(anchor) {
                    m.table = *table;
                    m.seq = anchor.seq;
                    m.image_seq = anchor.seq;
                }
            }
        }
        Ok(())
    }

    /// Saves the memory mirror's image when one is due: an image directory is set, every row
    /// so far could be read, and the mirror moved past the last image (by
    /// [`IMAGE_MIN_NEW_ROWS`] unless `force`). The table is encoded under the mirror's lock;
    /// the row it ends at is then looked up and the file written without it.
    pub(super) async fn save_memory_image(&self, force: bool) -> Result<bool, StoreError> {
        let Some(dir) = self.image_dir.clone() else {
            return Ok(false);
        };
        let (seq, mut file) = {
            let m = self.memory.lock().await;
            let moved = m.seq - m.image_seq;
            let due = if force {
                moved != 0
            } else {
                moved >= IMAGE_MIN_NEW_ROWS
            };
            // An image holds what could be read: diagnostics stay the same on every open.
            if !due || m.seq <= 0 || m.unreadable > 0 {
                return Ok(false);
            }
            let Some(file) = frame(ANCHOR, &m.table) else {
                return Ok(false);
            };
            (m.seq, file)
        };
        // Gone already (compacted by another process): the image would never be trusted.
        let Some(anchor) = self.anchor_at::<MemoryTable>(seq).await? else {
            return Ok(false);
        };
        anchor_mut(&mut file, ANCHOR).copy_from_slice(&anchor.to_bytes());
        seal(&mut file, MAGIC);
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).map_err(io_err("create the directory of", FILE))?;
            write_atomic(&dir, FILE, &file)
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
