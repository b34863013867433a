//! What an open reads of the memory table's records and audit items, as fixed-width columns
//! (one array per field, little-endian): ids, where each record's bytes lie and their
//! checksums, and the search metadata; the records' own bytes lie after the checked part of
//! the image, read when first needed. Reading a column is a copy, not a walk over every
//! record's fields.

use tavern_core::{MemoryId, Timestamp};
use tavern_search::{ImageError, Put, Take};

use super::image::invalid;
use super::Meta;

/// Bytes each record takes at least in [`RecordColumns`] (an id of one byte and every
/// fixed-width field): bounds the count read before anything is allocated.
const RECORD_BYTES: usize = 1 + 4 * 5 + 1 + 8 * 5;

/// Flags of [`RecordColumns::flags`].
const DELETED: u8 = 1;
const EXPIRES: u8 = 2;

/// A 32-bit print of a record's search metadata: a record decoded later is checked against the
/// print of the metadata its columns gave (what lookups, filters and ranking used), so a
/// record whose bytes say otherwise is never used (4 bytes a record rather than a copy).
pub(super) fn print(meta: &Meta) -> u32 {
    let mut bytes = [0u8; 4 + 1 + 1 + 8 * 5];
    bytes[..4].copy_from_slice(&meta.scope.to_le_bytes());
    bytes[4] = meta.kind as u8;
    bytes[5] = u8::from(meta.deleted) | if meta.expires_at.is_some() { 2 } else { 0 };
    let words = [
        meta.expires_at.map_or(0, |t| t.0 as u64),
        meta.updated_at.0 as u64,
        meta.created_at.0 as u64,
        meta.importance.to_bits(),
        meta.confidence.to_bits(),
    ];
    for (i, w) in words.iter().enumerate() {
        bytes[6 + 8 * i..14 + 8 * i].copy_from_slice(&w.to_le_bytes());
    }
    tavern_search::region::checksum(&bytes)
}

/// Per record, by slot: its id and place, and its search metadata.
#[derive(Default)]
pub(super) struct RecordColumns {
    /// Every id, one after the other, and where each ends.
    pub(super) ids: String,
    pub(super) id_ends: Vec<u32>,
    /// The length of each record's bytes (they lie one after the other) and their checksum.
    pub(super) lens: Vec<u32>,
    pub(super) checks: Vec<u32>,
    /// Scope ids and kinds (by dictionary number), as the table's metadata holds them.
    pub(super) scopes: Vec<u32>,
    pub(super) kinds: Vec<u32>,
    flags: Vec<u8>,
    expires: Vec<i64>,
    updated: Vec<i64>,
    created: Vec<i64>,
    importance: Vec<f64>,
    confidence: Vec<f64>,
}

impl RecordColumns {
    /// Adds a record: its id, the length and checksum of its bytes, its metadata (`kind`
    /// its number in the image's dictionary).
    pub(super) fn push(&mut self, id: &str, len: usize, check: u32, meta: &Meta, kind: u32) {
        self.ids.push_str(id);
        self.id_ends
            .push(u32::try_from(self.ids.len()).unwrap_or(u32::MAX));
        self.lens.push(u32::try_from(len).unwrap_or(u32::MAX));
        self.checks.push(check);
        self.scopes.push(meta.scope);
        self.kinds.push(kind);
        let flags = if meta.deleted { DELETED } else { 0 }
            | if meta.expires_at.is_some() {
                EXPIRES
            } else {
                0
            };
        self.flags.push(flags);
        self.expires.push(meta.expires_at.map_or(0, |t| t.0));
        self.updated.push(meta.updated_at.0);
        self.created.push(meta.created_at.0);
        self.importance.push(meta.importance);
        self.confidence.push(meta.confidence);
    }

    pub(super) fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether an id or a length was too long for its column (the image is not to be kept).
    pub(super) fn overflowed(&self) -> bool {
        self.ids.len() > u32::MAX as usize || self.lens.contains(&u32::MAX)
    }

    pub(super) fn write(&self, out: &mut Vec<u8>) {
        out.put_len(self.len());
        out.put_str(&self.ids);
        put_all(out, &self.id_ends, |out, v| out.put_u32(*v));
        put_all(out, &self.lens, |out, v| out.put_u32(*v));
        put_all(out, &self.checks, |out, v| out.put_u32(*v));
        put_all(out, &self.scopes, |out, v| out.put_u32(*v));
        put_all(out, &self.kinds, |out, v| out.put_u32(*v));
        out.extend_from_slice(&self.flags);
        for column in [&self.expires, &self.updated, &self.created] {
            put_all(out, column, |out, v| out.put_u64(*v as u64));
        }
        for column in [&self.importance, &self.confidence] {
            put_all(out, column, |out, v| out.put_f64(*v));
        }
    }

    /// Reads what [`RecordColumns::write`] wrote, checking every id (as the log's parser
    /// does) and where each ends.
    ///
    /// # Errors
    /// [`ImageError`] when the bytes end early or an id is not valid.
    pub(super) fn read(take: &mut Take<'_>) -> Result<Self, ImageError> {
        let n = take.len(RECORD_BYTES, "records")?;
        let ids = take.str("memory ids")?.to_owned();
        let id_ends = u32s(take, n, "memory id ends")?;
        let mut start = 0usize;
        for end in &id_ends {
            let end = *end as usize;
            let id = ids
                .get(start..end)
                .ok_or_else(|| invalid("memory ids", format!("an id ends at {end}")))?;
            if !MemoryId::is_valid(id) {
                return Err(invalid("memory id", format!("{id:?} is not valid")));
            }
            start = end;
        }
        if start != ids.len() {
            return Err(invalid("memory ids", "bytes after the last"));
        }
        let lens = u32s(take, n, "record lengths")?;
        let checks = u32s(take, n, "record checksums")?;
        let scopes = u32s(take, n, "record scopes")?;
        let kinds = u32s(take, n, "record kinds")?;
        let flags = take.bytes(n, "record flags")?.to_vec();
        if let Some(bad) = flags.iter().find(|f| **f & !(DELETED | EXPIRES) != 0) {
            return Err(invalid("record flags", format!("{bad:#x}")));
        }
        Ok(Self {
            ids,
            id_ends,
            lens,
            checks,
            scopes,
            kinds,
            flags,
            expires: i64s(take, n, "expiry times")?,
            updated: i64s(take, n, "update times")?,
            created: i64s(take, n, "creation times")?,
            importance: f64s(take, n, "importance")?,
            confidence: f64s(take, n, "confidence")?,
        })
    }

    /// Record `i`'s metadata, its kind given.
    pub(super) fn meta(&self, i: usize, kind: tavern_core::MemoryKind) -> Option<Meta> {
        let flags = *self.flags.get(i)?;
        Some(Meta {
            scope: *self.scopes.get(i)?,
            kind,
            deleted: flags & DELETED != 0,
            expires_at: self
                .expires
                .get(i)
                .filter(|_| flags & EXPIRES != 0)
                .map(|e| Timestamp(*e)),
            updated_at: Timestamp(*self.updated.get(i)?),
            created_at: Timestamp(*self.created.get(i)?),
            importance: *self.importance.get(i)?,
            confidence: *self.confidence.get(i)?,
        })
    }
}

/// Bytes each audit item takes at least in [`AuditColumns`].
const AUDIT_BYTES: usize = 4 + 4 + 8 + 16 + 4 + 1;

/// Per audit item, in order; the texts of items that keep one follow, in order.
#[derive(Default)]
pub(super) struct AuditColumns {
    pub(super) slots: Vec<u32>,
    /// By number in the image's dictionary of actions.
    pub(super) actions: Vec<u32>,
    pub(super) ats: Vec<i64>,
    pub(super) revisions: Vec<u128>,
    /// By number in the image's dictionary of sources.
    pub(super) sources: Vec<u32>,
    /// `image::SAME`, `KEPT` or `DROPPED`.
    pub(super) texts: Vec<u8>,
}

impl AuditColumns {
    pub(super) fn write(&self, out: &mut Vec<u8>, kept: &[&str]) {
        out.put_len(self.slots.len());
        put_all(out, &self.slots, |out, v| out.put_u32(*v));
        put_all(out, &self.actions, |out, v| out.put_u32(*v));
        put_all(out, &self.ats, |out, v| out.put_u64(*v as u64));
        put_all(out, &self.revisions, |out, v| {
            out.extend_from_slice(&v.to_le_bytes());
        });
        put_all(out, &self.sources, |out, v| out.put_u32(*v));
        out.extend_from_slice(&self.texts);
        out.put_len(kept.len());
        for text in kept {
            out.put_str(text);
        }
    }

    /// Reads what [`AuditColumns::write`] wrote; the kept texts as they lie.
    ///
    /// # Errors
    /// [`ImageError`] when the bytes end early.
    pub(super) fn read<'a>(take: &mut Take<'a>) -> Result<(Self, Vec<&'a str>), ImageError> {
        let n = take.len(AUDIT_BYTES, "audit items")?;
        let columns = Self {
            slots: u32s(take, n, "audit slots")?,
            actions: u32s(take, n, "audit actions")?,
            ats: i64s(take, n, "audit times")?,
            revisions: column(take, n, "audit revisions", u128::from_le_bytes)?,
            sources: u32s(take, n, "audit sources")?,
            texts: take.bytes(n, "audit text kinds")?.to_vec(),
        };
        let kept = take.len(8, "kept texts")?;
        let texts = (0..kept)
            .map(|_| take.str("kept text"))
            .collect::<Result<_, _>>()?;
        Ok((columns, texts))
    }
}

fn put_all<T>(out: &mut Vec<u8>, values: &[T], put: impl Fn(&mut Vec<u8>, &T)) {
    for v in values {
        put(out, v);
    }
}

/// The first `N` bytes of `chunk` (exactly `N` long: a chunk of `chunks_exact(N)`).
fn array<const N: usize>(chunk: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    let n = chunk.len().min(N);
    a[..n].copy_from_slice(&chunk[..n]);
    a
}

/// `n` values of `W` bytes each, as `from` reads each.
fn column<const W: usize, T>(
    take: &mut Take<'_>,
    n: usize,
    what: &'static str,
    from: fn([u8; W]) -> T,
) -> Result<Vec<T>, ImageError> {
    Ok(take
        .bytes(n * W, what)?
        .chunks_exact(W)
        .map(|c| from(array(c)))
        .collect())
}

fn u32s(take: &mut Take<'_>, n: usize, what: &'static str) -> Result<Vec<u32>, ImageError> {
    column(take, n, what, u32::from_le_bytes)
}

fn i64s(take: &mut Take<'_>, n: usize, what: &'static str) -> Result<Vec<i64>, ImageError> {
    column(take, n, what, i64::from_le_bytes)
}

fn f64s(take: &mut Take<'_>, n: usize, what: &'static str) -> Result<Vec<f64>, ImageError> {
    column(take, n, what, f64::from_le_bytes)
}
