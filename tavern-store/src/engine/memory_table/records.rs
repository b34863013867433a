//! The memory table's records by slot. A record placed or read is held decoded; those of a
//! store opened from its image stay in that image's file until first read (read where they
//! lie, checked against the checksum and metadata their columns gave), so opening a large
//! store decodes (and allocates) none of them and holds none of their bytes, and a search
//! decodes only what it shows. A record that can no longer be read there (the file changed
//! since the open, or written wrong) is not there: the table is *lost* ([`Records::lost`])
//! and its owner reads it again from its log before anything it answered is used.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tavern_core::{
    MemoryId, MemoryKind, MemoryRecord, MemorySource, Revision, ScopeKey, Tag, Timestamp,
};
use tavern_search::region::checksum as check;
use tavern_search::{ImageError, Region, Take};

use super::columns::print;
use super::image::{entry, invalid, maybe_time};
use super::Meta;

/// The values an image's records refer to by number, as the image listed them.
#[derive(Debug, Default)]
pub(super) struct Dictionaries {
    /// By scope id.
    pub(super) scopes: Vec<ScopeKey>,
    /// Shared with the audit items read from the same image (`Sources`).
    pub(super) sources: Arc<[MemorySource]>,
    pub(super) kinds: Vec<MemoryKind>,
}

/// Where the first slots' records lie in the image they were read from.
#[derive(Debug)]
struct Image {
    region: Region,
    /// Where each record begins in `region`, and where the last ends.
    starts: Vec<u64>,
    /// Per record, the checksum of its bytes as its column gives it ([`check`]).
    checks: Vec<u32>,
    /// Per record, the print of the search metadata its columns gave ([`print`]).
    prints: Vec<u32>,
    /// Every record's id, one after the other, and where each ends (the lookup by id reads
    /// them without reading a record).
    ids: Box<str>,
    id_ends: Vec<u32>,
    dictionaries: Dictionaries,
    /// How many times a record was decoded from the image.
    #[cfg(test)]
    decodes: std::sync::atomic::AtomicUsize,
}

/// What an open took of the records of an image, to read them later where they lie.
pub(super) struct Taken {
    /// Where each record begins, relative to the first, and where the last ends.
    pub(super) starts: Vec<u64>,
    pub(super) checks: Vec<u32>,
    pub(super) prints: Vec<u32>,
    pub(super) ids: String,
    pub(super) id_ends: Vec<u32>,
}

/// Records by slot, decoded on first read.
#[derive(Default)]
pub(super) struct Records {
    /// Per slot: the record, once placed or decoded.
    cells: Vec<OnceLock<Box<MemoryRecord>>>,
    /// The image slots `0..image.checks.len()` were read from.
    image: Option<Image>,
    /// Whether a record could not be read from the image (see the module doc).
    lost: AtomicBool,
}

/// The image bytes of every record still as the image holds it, read in one go (a compaction,
/// a copy or an image reads every record).
pub(super) struct Held<'a> {
    bytes: Vec<u8>,
    records: &'a Records,
}

impl Held<'_> {
    /// The bytes of `slot`'s record while it is as the image holds it (never changed or read
    /// since), checked; `None` (the table marked lost when they fail) otherwise.
    pub(super) fn undecoded(&self, slot: u32) -> Option<&[u8]> {
        let records = self.records;
        if records.cells.get(slot as usize)?.get().is_some() {
            return None;
        }
        let image = records.image.as_ref()?;
        let (start, end) = image.span(slot as usize)?;
        let bytes = self
            .bytes
            .get(usize::try_from(start).ok()?..usize::try_from(end).ok()?);
        match bytes.filter(|b| image.checks.get(slot as usize) == Some(&check(b))) {
            Some(bytes) => Some(bytes),
            None => {
                records.lost.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// `slot`'s record (not decoded yet) decoded from these bytes for the caller; `None`, the
    /// table marked lost, when they fail their check.
    fn decode(&self, slot: u32) -> Option<MemoryRecord> {
        let record = self.undecoded(slot).and_then(|bytes| {
            self.records
                .image
                .as_ref()?
                .decode_bytes(slot as usize, bytes)
        });
        if record.is_none() {
            self.records.lost.store(true, Ordering::Relaxed);
        }
        record
    }
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let decoded = self.cells.iter().filter(|c| c.get().is_some()).count();
        f.debug_struct("Records")
            .field("len", &self.cells.len())
            .field("decoded", &decoded)
            .finish()
    }
}

/// One record's fields as its image bytes hold them, every one checked.
struct Fields<'a> {
    id: &'a str,
    scope: u32,
    kind: MemoryKind,
    content: &'a str,
    /// How many tags, and the bytes from the first of them on.
    tags: (usize, Take<'a>),
    importance: f64,
    confidence: f64,
    source: u32,
    created_at: Timestamp,
    updated_at: Timestamp,
    last_accessed_at: Option<Timestamp>,
    expires_at: Option<Timestamp>,
    deleted_at: Option<Timestamp>,
    revision: &'a str,
}

/// Reads one record's fields (as `MemoryTable::write_image` wrote them), checking each id,
/// tag and revision as the log's parser does and every number against `dictionaries`,
/// without copying any text.
fn fields<'a>(take: &mut Take<'a>, dictionaries: &Dictionaries) -> Result<Fields<'a>, ImageError> {
    let id = take.str("memory id")?;
    if !MemoryId::is_valid(id) {
        return Err(invalid("memory id", format!("{id:?} is not valid")));
    }
    let scope = take.u32("record scope")?;
    if scope as usize >= dictionaries.scopes.len() {
        return Err(invalid("record scope", format!("{scope} is not listed")));
    }
    let kind = *entry(&dictionaries.kinds, take.u32("kind")?, "kind")?;
    let content = take.str("content")?;
    let tag_count = take.len(8, "tags")?;
    let tags = (tag_count, take.clone());
    for _ in 0..tag_count {
        let tag = take.str("tag")?;
        if !Tag::is_valid(tag) {
            return Err(invalid("tag", format!("{tag:?} is not valid")));
        }
    }
    let importance = take.f64("importance")?;
    let confidence = take.f64("confidence")?;
    let source = take.u32("source")?;
    entry(&dictionaries.sources, source, "source")?;
    let created_at = maybe_time(take, "created at")?.unwrap_or(Timestamp(0));
    let updated_at = maybe_time(take, "updated at")?.unwrap_or(Timestamp(0));
    let last_accessed_at = maybe_time(take, "last accessed at")?;
    let expires_at = maybe_time(take, "expires at")?;
    let deleted_at = maybe_time(take, "deleted at")?;
    let revision = take.str("revision")?;
    if !Revision::is_valid(revision) {
        return Err(invalid("revision", format!("{revision:?} is not valid")));
    }
    Ok(Fields {
        id,
        scope,
        kind,
        content,
        tags,
        importance,
        confidence,
        source,
        created_at,
        updated_at,
        last_accessed_at,
        expires_at,
        deleted_at,
        revision,
    })
}

impl Fields<'_> {
    /// The record, its texts copied.
    fn record(&self, dictionaries: &Dictionaries) -> Result<MemoryRecord, ImageError> {
        let (count, mut take) = self.tags.clone();
        let tags = (0..count)
            .map(|_| Tag::parse(take.str("tag")?).map_err(|e| invalid("tag", e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MemoryRecord {
            id: MemoryId::parse(self.id).map_err(|e| invalid("memory id", e))?,
            scope: entry(&dictionaries.scopes, self.scope, "scope")?.clone(),
            kind: self.kind,
            content: self.content.to_owned(),
            tags,
            importance: self.importance,
            confidence: self.confidence,
            source: entry(&dictionaries.sources, self.source, "source")?.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            last_accessed_at: self.last_accessed_at,
            expires_at: self.expires_at,
            deleted_at: self.deleted_at,
            revision: Revision::parse(self.revision).map_err(|e| invalid("revision", e))?,
        })
    }
}

impl Image {
    /// Where `slot`'s record lies in the region.
    fn span(&self, slot: usize) -> Option<(u64, u64)> {
        Some((*self.starts.get(slot)?, *self.starts.get(slot + 1)?))
    }

    /// `slot`'s record, read where it lies and checked; `None` when it cannot be read there
    /// or its bytes are not the ones its columns describe.
    fn decode(&self, slot: usize) -> Option<MemoryRecord> {
        let (start, end) = self.span(slot)?;
        let bytes = self
            .region
            .read(start, usize::try_from(end.checked_sub(start)?).ok()?)
            .ok()?;
        if self.checks.get(slot) != Some(&check(&bytes)) {
            return None;
        }
        self.decode_bytes(slot, &bytes)
    }

    fn decode_bytes(&self, slot: usize, bytes: &[u8]) -> Option<MemoryRecord> {
        #[cfg(test)]
        self.decodes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut take = Take::new(bytes);
        // Checked here, when first read: a record written wrong — fields that do not check,
        // bytes after them, or not the record its columns gave (its id, or the metadata
        // lookups, filters and ranking used) — is not there, and the table lost.
        let f = fields(&mut take, &self.dictionaries).ok()?;
        let record = f.record(&self.dictionaries).ok()?;
        let as_columns = take.left() == 0
            && self.id(slot) == Some(record.id.as_str())
            && self.prints.get(slot) == Some(&print(&Meta::of(&record, f.scope)));
        as_columns.then_some(record)
    }

    fn id(&self, slot: usize) -> Option<&str> {
        let start = match slot.checked_sub(1) {
            Some(before) => *self.id_ends.get(before)? as usize,
            None => 0,
        };
        self.ids.get(start..*self.id_ends.get(slot)? as usize)
    }
}

impl Records {
    /// Records read from an image: they lie in `region` where `taken` says (with the checksum,
    /// id and metadata print each is checked against when first read).
    pub(super) fn from_image(region: Region, taken: Taken, dictionaries: Dictionaries) -> Self {
        let n = taken.checks.len();
        Self {
            cells: std::iter::repeat_with(OnceLock::new).take(n).collect(),
            image: Some(Image {
                region,
                starts: taken.starts,
                checks: taken.checks,
                prints: taken.prints,
                ids: taken.ids.into_boxed_str(),
                id_ends: taken.id_ends,
                dictionaries,
                #[cfg(test)]
                decodes: Default::default(),
            }),
            lost: AtomicBool::new(false),
        }
    }

    /// Whether a record could not be read from the image it lies in (the file changed since
    /// it was opened): whatever was answered since may lack it, and only reading the table
    /// again from its log makes it whole.
    pub(super) fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// `slot`'s record decoded from the image, or `None` and the table marked lost.
    fn decode(&self, slot: usize) -> Option<MemoryRecord> {
        let record = self.image.as_ref().and_then(|i| i.decode(slot));
        if record.is_none() {
            self.lost.store(true, Ordering::Relaxed);
        }
        record
    }

    /// Whether some records were read from an image and not decoded since.
    pub(super) fn in_image(&self) -> bool {
        self.image
            .as_ref()
            .is_some_and(|i| (0..i.checks.len()).any(|s| self.cells[s].get().is_none()))
    }

    /// The image bytes of every record not decoded yet, read in one go; `None` when there
    /// are none, or when they cannot be read at once (too many to hold, an I/O error): then
    /// each record is read on its own, and only one that fails its check marks the table
    /// lost.
    pub(super) fn held(&self) -> Option<Held<'_>> {
        let image = self.image.as_ref()?;
        let undecoded = (0..image.checks.len()).any(|s| self.cells[s].get().is_none());
        if !undecoded {
            return None;
        }
        let end = usize::try_from(*image.starts.last()?).ok()?;
        let bytes = image.region.read(0, end).ok()?;
        Some(Held {
            bytes,
            records: self,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.cells.len()
    }

    /// The record of `slot`, decoded on first read.
    pub(super) fn get(&self, slot: u32) -> Option<&MemoryRecord> {
        let slot = slot as usize;
        let cell = self.cells.get(slot)?;
        if let Some(record) = cell.get() {
            return Some(record);
        }
        let record = self.decode(slot)?;
        Some(cell.get_or_init(|| Box::new(record)))
    }

    /// The record of `slot`, to change.
    pub(super) fn get_mut(&mut self, slot: u32) -> Option<&mut MemoryRecord> {
        self.get(slot)?;
        self.cells
            .get_mut(slot as usize)?
            .get_mut()
            .map(|b| &mut **b)
    }

    /// Puts `record` in `slot`; returns the one it replaces.
    pub(super) fn replace(&mut self, slot: u32, record: MemoryRecord) -> Option<MemoryRecord> {
        let old = match self.cells.get_mut(slot as usize)?.take() {
            Some(old) => Some(*old),
            None => self.decode(slot as usize),
        };
        self.cells[slot as usize] = OnceLock::from(Box::new(record));
        old
    }

    /// Adds a record in the next slot.
    pub(super) fn push(&mut self, record: MemoryRecord) {
        self.cells.push(OnceLock::from(Box::new(record)));
    }

    /// The id of `slot`'s record, without decoding it.
    pub(super) fn id(&self, slot: u32) -> Option<&str> {
        let cell = self.cells.get(slot as usize)?;
        if let Some(record) = cell.get() {
            return Some(record.id.as_str());
        }
        self.image.as_ref()?.id(slot as usize)
    }

    /// Every record in slot order; those not decoded yet are decoded for the caller alone
    /// (a compaction or a copy reads every record once: keeping them all would hold the
    /// whole store decoded for good), from their bytes read in one go.
    /// A slot whose record cannot be read (the table [`Records::lost`]) is left out.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, Cow<'_, MemoryRecord>)> {
        let held = self.held();
        (0..self.cells.len()).filter_map(move |at| {
            let slot = u32::try_from(at).ok()?;
            if let Some(record) = self.cells.get(at)?.get() {
                return Some((slot, Cow::Borrowed(&**record)));
            }
            let record = match &held {
                Some(held) => held.decode(slot),
                None => self.decode(at),
            };
            record.map(|r| (slot, Cow::Owned(r)))
        })
    }

    /// The record of `slot`, decoded for the caller alone if it is not yet.
    pub(super) fn read(&self, slot: u32) -> Option<Cow<'_, MemoryRecord>> {
        match self.cells.get(slot as usize)?.get() {
            Some(record) => Some(Cow::Borrowed(&**record)),
            None => self.decode(slot as usize).map(Cow::Owned),
        }
    }

    /// How many records are held decoded.
    #[cfg(test)]
    pub(super) fn decoded(&self) -> usize {
        self.cells.iter().filter(|c| c.get().is_some()).count()
    }

    /// How many times a record was decoded from the image (kept or not).
    #[cfg(test)]
    pub(super) fn decodes(&self) -> usize {
        self.image
            .as_ref()
            .map_or(0, |i| i.decodes.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The dictionaries the undecoded records' bytes refer to.
    pub(super) fn dictionaries(&self) -> Option<&Dictionaries> {
        self.image.as_ref().map(|i| &i.dictionaries)
    }
}
