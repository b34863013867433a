//! The memory table's records by slot. A record placed or read is held decoded; those of a
//! store opened from its image stay that image's bytes until first read, so opening a large
//! store decodes (and allocates) none of them, and a search decodes only what it shows.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use tavern_core::{
    MemoryId, MemoryKind, MemoryRecord, MemorySource, Revision, ScopeKey, Tag, Timestamp,
};
use tavern_search::{ImageError, Take};

use super::image::{entry, invalid, maybe_time};

/// The values an image's records refer to by number, as the image listed them.
#[derive(Debug, Default)]
pub(super) struct Dictionaries {
    /// By scope id.
    pub(super) scopes: Vec<ScopeKey>,
    /// Shared with the audit items read from the same image (`Sources`).
    pub(super) sources: Arc<[MemorySource]>,
    pub(super) kinds: Vec<MemoryKind>,
}

/// The bytes the first slots were read from.
#[derive(Debug)]
struct Image {
    bytes: Box<[u8]>,
    /// Where each record begins in `bytes`, and where the last ends.
    starts: Vec<usize>,
    dictionaries: Dictionaries,
    /// How many times a record was decoded from these bytes.
    #[cfg(test)]
    decodes: std::sync::atomic::AtomicUsize,
}

/// Records by slot, decoded on first read.
#[derive(Default)]
pub(super) struct Records {
    /// Per slot: the record, once placed or decoded.
    cells: Vec<OnceLock<Box<MemoryRecord>>>,
    /// The image slots `0..image.starts.len() - 1` were read from.
    image: Option<Image>,
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
pub(super) struct Fields<'a> {
    pub(super) id: &'a str,
    pub(super) scope: u32,
    pub(super) kind: MemoryKind,
    content: &'a str,
    /// How many tags, and the bytes from the first of them on.
    tags: (usize, Take<'a>),
    pub(super) importance: f64,
    pub(super) confidence: f64,
    source: u32,
    pub(super) created_at: Timestamp,
    pub(super) updated_at: Timestamp,
    last_accessed_at: Option<Timestamp>,
    pub(super) expires_at: Option<Timestamp>,
    pub(super) deleted_at: Option<Timestamp>,
    revision: &'a str,
}

/// Reads one record's fields (as `MemoryTable::write_image` wrote them), checking each id,
/// tag and revision as the log's parser does and every number against `dictionaries`,
/// without copying any text.
pub(super) fn fields<'a>(
    take: &mut Take<'a>,
    dictionaries: &Dictionaries,
) -> Result<Fields<'a>, ImageError> {
    let id = take.str("memory id")?;
    if !MemoryId::is_valid(id) {
        return Err(invalid("memory id", format!("{id:?} is not valid")));
    }
    let scope = take.u32("record scope")?;
    if scope as usize >= dictionaries.scopes.len() {
        return Err(invalid("record scope", format!("{scope} is not listed")));
    }
    let kind = *entry(&dictionaries.kinds, take.u32("kind")?, "kind")?;
    // Checked here, at open, like every other field: a record that cannot be decoded later
    // would leave its slot empty (and a compaction would drop it).
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
    fn bytes_of(&self, slot: usize) -> Option<&[u8]> {
        let (start, end) = (*self.starts.get(slot)?, *self.starts.get(slot + 1)?);
        self.bytes.get(start..end)
    }

    fn decode(&self, slot: usize) -> Option<MemoryRecord> {
        #[cfg(test)]
        self.decodes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut take = Take::new(self.bytes_of(slot)?);
        // Every field of every record was checked when the image was read: this cannot fail.
        fields(&mut take, &self.dictionaries)
            .and_then(|f| f.record(&self.dictionaries))
            .ok()
    }
}

impl Records {
    /// Records read from an image: `starts` (checked by the caller with [`fields`]) says where
    /// each begins in `bytes` and where the last ends.
    pub(super) fn from_image(
        bytes: Box<[u8]>,
        starts: Vec<usize>,
        dictionaries: Dictionaries,
    ) -> Self {
        let n = starts.len().saturating_sub(1);
        Self {
            cells: std::iter::repeat_with(OnceLock::new).take(n).collect(),
            image: Some(Image {
                bytes,
                starts,
                dictionaries,
                #[cfg(test)]
                decodes: Default::default(),
            }),
        }
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
        let record = self.image.as_ref()?.decode(slot)?;
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
            Some(old) => *old,
            None => self.image.as_ref()?.decode(slot as usize)?,
        };
        self.cells[slot as usize] = OnceLock::from(Box::new(record));
        Some(old)
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
        let bytes = self.image.as_ref()?.bytes_of(slot as usize)?;
        Take::new(bytes).str("memory id").ok()
    }

    /// Every record in slot order; those not decoded yet are decoded for the caller alone
    /// (a compaction or a copy reads every record once: keeping them all would hold the
    /// whole store decoded for good).
    pub(super) fn iter(&self) -> impl Iterator<Item = Cow<'_, MemoryRecord>> {
        (0..self.cells.len()).filter_map(|slot| self.read(u32::try_from(slot).ok()?))
    }

    /// The record of `slot`, decoded for the caller alone if it is not yet.
    pub(super) fn read(&self, slot: u32) -> Option<Cow<'_, MemoryRecord>> {
        match self.cells.get(slot as usize)?.get() {
            Some(record) => Some(Cow::Borrowed(&**record)),
            None => self.image.as_ref()?.decode(slot as usize).map(Cow::Owned),
        }
    }

    /// The image bytes of `slot`'s record while it is as the image holds it (never changed
    /// or read since), so an image written now can copy them instead of encoding it again.
    pub(super) fn undecoded(&self, slot: u32) -> Option<&[u8]> {
        let cell = self.cells.get(slot as usize)?;
        if cell.get().is_some() {
            return None;
        }
        self.image.as_ref()?.bytes_of(slot as usize)
    }

    /// How many records are held decoded.
    #[cfg(test)]
    pub(super) fn decoded(&self) -> usize {
        self.cells.iter().filter(|c| c.get().is_some()).count()
    }

    /// How many times a record was decoded from the image's bytes (kept or not).
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
