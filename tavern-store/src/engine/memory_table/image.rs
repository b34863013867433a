//! The memory table as bytes and back: its records, audit trail and search index, so opening a
//! large store reads them instead of parsing, tokenizing and indexing every log line again
//! (`fs::image` keeps the bytes on disk beside the log they were read from).
//!
//! What an open reads of the records and audit items is fixed-width columns
//! ([`super::columns`]: ids, where each record's bytes lie and their checksums, search
//! metadata); the records' own bytes (field by field) lie after that, with the index's
//! postings, read when first needed; the values few records differ in (scopes, sources,
//! kinds, actions) are written once each, as JSON, in a dictionary. Reading checks every id
//! as the log's parser does and every reference, and rebuilds what is derived (the lookups by
//! id, audit chains, kept texts); the columns and the index are read on two threads.

use rustc_hash::FxHashMap;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::hash::Hash;

use tavern_core::{AuditAction, MemorySource, ScopeKey, Timestamp};
use tavern_search::region::checksum;
use tavern_search::{Bm25Index, ImageError, Put, Region, Take};

use super::columns::{print, AuditColumns, RecordColumns};
use super::records::{Dictionaries, Records, Taken};
use super::{id_hash, AuditItem, MemoryTable, Meta, Sources, VersionText, NO_AUDIT};

/// The first bytes of a memory table image and its format version.
const MAGIC: &[u8; 8] = b"tvmemt\0\x03";

/// Distinct values written once each (as JSON), referred to by number.
struct Dictionary<T: Hash + Eq> {
    ids: FxHashMap<T, u32>,
    values: Vec<T>,
}

impl<T: Hash + Eq + Clone + Serialize> Dictionary<T> {
    fn new() -> Self {
        Self {
            ids: FxHashMap::default(),
            values: Vec::new(),
        }
    }

    /// A dictionary that begins with `values`, numbered as they are listed; `None` when one
    /// is listed twice (their numbers would not be kept).
    fn starting_with(values: &[T]) -> Option<Self> {
        let mut d = Self::new();
        for v in values {
            d.id(v);
        }
        (d.values.len() == values.len()).then_some(d)
    }

    fn id(&mut self, value: &T) -> u32 {
        if let Some(&id) = self.ids.get(value) {
            return id;
        }
        let next = u32::try_from(self.values.len()).unwrap_or(u32::MAX);
        self.ids.insert(value.clone(), next);
        self.values.push(value.clone());
        next
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.put_len(self.values.len());
        for v in &self.values {
            out.put_str(&serde_json::to_string(v).unwrap_or_default());
        }
    }
}

fn read_dictionary<T: DeserializeOwned>(
    bytes: &mut Take<'_>,
    what: &'static str,
) -> Result<Vec<T>, ImageError> {
    let n = bytes.len(8, what)?;
    (0..n)
        .map(|_| {
            serde_json::from_str(bytes.str(what)?)
                .map_err(|e| ImageError::Invalid(format!("{what}: {e}")))
        })
        .collect()
}

pub(super) fn entry<'v, T>(values: &'v [T], id: u32, what: &str) -> Result<&'v T, ImageError> {
    values
        .get(id as usize)
        .ok_or_else(|| ImageError::Invalid(format!("{what} {id} is not in the dictionary")))
}

fn put_time(out: &mut Vec<u8>, t: Option<Timestamp>) {
    out.put_u8(u8::from(t.is_some()));
    out.put_u64(t.map_or(0, |t| t.0 as u64));
}

fn time(bytes: &mut Take<'_>, what: &'static str) -> Result<Timestamp, ImageError> {
    Ok(Timestamp(bytes.u64(what)? as i64))
}

pub(super) fn maybe_time(
    bytes: &mut Take<'_>,
    what: &'static str,
) -> Result<Option<Timestamp>, ImageError> {
    let some = bytes.flag(what)?;
    let t = time(bytes, what)?;
    Ok(some.then_some(t))
}

pub(super) fn invalid(what: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::Invalid(format!("{what}: {e}"))
}

/// Text kinds of an audit item.
const SAME: u8 = 0;
const KEPT: u8 = 1;
const DROPPED: u8 = 2;

impl MemoryTable {
    /// Appends the table's image to `out` (what an open reads) and the records' bytes, then
    /// the index's postings, to `rest`: [`MemoryTable::read_image`] reads back the same
    /// table. Layout of `out`: the length of the columns and of the records' bytes, the
    /// records' and audit items' columns, the dictionaries they refer to (scopes by scope id,
    /// sources, kinds, actions), the index. `false` when a posting list or a record copied
    /// from the image this table was read from turned out damaged (or a column cannot hold
    /// a value): what was appended is not to be kept ([`MemoryTable::heal`] first, or the
    /// table read again).
    pub(crate) fn write_image(&self, out: &mut Vec<u8>, rest: &mut Vec<u8>) -> bool {
        out.reserve(self.records.len() * 80 + 64);
        out.extend_from_slice(MAGIC);
        let len_at = out.len();
        // The columns' length, then the records' bytes' length: patched below.
        out.put_u64(0);
        out.put_u64(0);
        // The dictionaries the records still in the image refer to come first, with
        // the same numbers, so those bytes are copied as they are.
        let seeded = self.records.dictionaries().and_then(|d| {
            Some((
                Dictionary::starting_with(&d.sources)?,
                Dictionary::starting_with(&d.kinds)?,
            ))
        });
        let copy_undecoded = seeded.is_some();
        let (mut sources, mut kinds) =
            seeded.unwrap_or_else(|| (Dictionary::new(), Dictionary::new()));
        let mut actions = Dictionary::new();
        // The bytes of the records never read, in one read of the image.
        let held = copy_undecoded.then(|| self.records.held()).flatten();
        let bodies_at = rest.len();
        let mut columns = RecordColumns::default();
        let mut body = Vec::new();
        for (slot, m) in (0u32..).zip(&self.meta) {
            let kind = kinds.id(&m.kind);
            if let Some(bytes) = held.as_ref().and_then(|h| h.undecoded(slot)) {
                let id = self.records.id(slot).unwrap_or_default();
                rest.extend_from_slice(bytes);
                columns.push(id, bytes.len(), checksum(bytes), m, kind);
                continue;
            }
            // Every slot holds a record: one that cannot be read makes the table lost, and no
            // image is kept of it.
            let Some(r) = self.records.read(slot) else {
                return false;
            };
            body.clear();
            body.put_str(r.id.as_str());
            body.put_u32(m.scope);
            body.put_u32(kind);
            body.put_str(&r.content);
            body.put_len(r.tags.len());
            for tag in &r.tags {
                body.put_str(tag.as_str());
            }
            body.put_f64(r.importance);
            body.put_f64(r.confidence);
            body.put_u32(sources.id(&r.source));
            put_time(&mut body, Some(r.created_at));
            put_time(&mut body, Some(r.updated_at));
            put_time(&mut body, r.last_accessed_at);
            put_time(&mut body, r.expires_at);
            put_time(&mut body, r.deleted_at);
            body.put_str(r.revision.as_str());
            rest.extend_from_slice(&body);
            columns.push(r.id.as_str(), body.len(), checksum(&body), m, kind);
        }
        columns.write(out);
        // The audit items' sources by their number here.
        let source_ids: Vec<u32> = self.sources.iter().map(|s| sources.id(s)).collect();
        let mut audit = AuditColumns::default();
        let mut kept = Vec::new();
        for a in &self.audit {
            audit.slots.push(a.slot);
            audit.actions.push(actions.id(&a.action));
            audit.ats.push(a.at.0);
            audit.revisions.push(a.revision);
            audit.sources.push(match source_ids.get(a.source as usize) {
                Some(&id) => id,
                // Every item's source is listed: not reached.
                None => sources.id(&MemorySource::system()),
            });
            audit.texts.push(match &a.text {
                VersionText::Same => SAME,
                VersionText::Kept(text) => {
                    kept.push(&**text);
                    KEPT
                }
                VersionText::Dropped => DROPPED,
            });
        }
        audit.write(out, &kept);
        let columns_len = (out.len() - len_at - 16) as u64;
        out[len_at..len_at + 8].copy_from_slice(&columns_len.to_le_bytes());
        let bodies_len = (rest.len() - bodies_at) as u64;
        out[len_at + 8..len_at + 16].copy_from_slice(&bodies_len.to_le_bytes());
        let mut scopes = vec![None; self.slots.len()];
        for (scope, id) in &self.scope_ids {
            if let Some(slot) = scopes.get_mut(*id as usize) {
                *slot = Some(scope);
            }
        }
        out.put_len(scopes.len());
        for scope in &scopes {
            out.put_str(&scope.map_or_else(String::new, |s| {
                serde_json::to_string(s).unwrap_or_default()
            }));
        }
        sources.write(out);
        kinds.write(out);
        actions.write(out);
        // The index last, so the records and the index are read on two threads; its
        // postings after the records' bytes.
        let index_whole = self.index.write_image(out, rest);
        index_whole && !self.records.lost() && !columns.overflowed()
    }

    /// Reads a table written by [`MemoryTable::write_image`]: `bytes` what it wrote to
    /// `out`, read from the start of `image`, where they lie followed by what it wrote to
    /// `rest`. The records and posting lists are read there when a call first needs them
    /// (each record checked then), so `image` must stay as it is while the table is used (a
    /// record found changed there makes the table [`MemoryTable::lost`], a list the index
    /// damaged).
    ///
    /// # Errors
    /// [`ImageError`] when the bytes are not such an image, end early, hold an invalid id
    /// or flag, or refer to records, scopes, dictionary entries, record bytes or postings
    /// they do not hold.
    pub(crate) fn read_image(bytes: &[u8], image: &Region) -> Result<Self, ImageError> {
        let mut take = Take::new(bytes);
        if take.bytes(MAGIC.len(), "memory image header")? != MAGIC {
            return Err(ImageError::Invalid(
                "not a memory table image of this version".into(),
            ));
        }
        let columns_len = take.len(1, "records")?;
        let bodies_len = take.u64("record bytes")?;
        let columns_part = take.bytes(columns_len, "records")?;
        // After what is read here: the records' bytes, then the index's postings.
        let read = bytes.len() as u64;
        let after = image
            .len()
            .checked_sub(read)
            .ok_or_else(|| invalid("image", "shorter than what was read of it"))?;
        let postings_len = after
            .checked_sub(bodies_len)
            .ok_or_else(|| invalid("record bytes", "beyond the image"))?;
        let (bodies, postings) = image
            .sub(read, bodies_len)
            .zip(image.sub(read + bodies_len, postings_len))
            .ok_or_else(|| invalid("record bytes", "beyond the image"))?;
        let dictionaries = Dictionaries {
            scopes: read_dictionary(&mut take, "scope")?,
            sources: read_dictionary::<MemorySource>(&mut take, "source")?.into(),
            kinds: read_dictionary(&mut take, "kind")?,
        };
        let actions: Vec<AuditAction> = read_dictionary(&mut take, "action")?;
        let scopes = dictionaries.scopes.clone();
        // The index is read on another thread while the records are.
        let index_part = take.rest();
        let (parts, index) = std::thread::scope(|s| {
            let index = s.spawn(move || {
                let mut take = Take::new(index_part);
                let index = Bm25Index::read_image(&mut take, &postings)?;
                match take.left() {
                    0 => Ok(index),
                    n => Err(ImageError::Invalid(format!("{n} bytes after the index"))),
                }
            });
            let parts = read_records(columns_part, bodies, dictionaries, &actions);
            let index = index
                .join()
                .unwrap_or_else(|_| Err(ImageError::Invalid("reading the index failed".into())));
            (parts, index)
        });
        let (records, meta, audit) = parts?;
        let mut table = Self::from_parts(&scopes, records, meta, audit, index?)?;
        // The items' sources are numbered as the image's dictionary numbers them.
        table.sources = Sources::read(
            table
                .records
                .dictionaries()
                .map(|d| d.sources.clone())
                .unwrap_or_default(),
        );
        Ok(table)
    }

    /// The table of these records (with their search metadata) and audit items, and their
    /// index: every derived lookup built again, every reference checked.
    fn from_parts(
        scopes: &[ScopeKey],
        records: Records,
        meta: Vec<Meta>,
        audit: Vec<AuditItem>,
        index: Bm25Index,
    ) -> Result<Self, ImageError> {
        let mut table = Self {
            index,
            records,
            ..Self::default()
        };
        for scope in scopes {
            let before = table.slots.len();
            if table.scope_id(scope) as usize != before {
                return Err(invalid("scope", "listed twice"));
            }
        }
        // Each scope's lookup grown once to its size, not doubled step by step.
        let mut per_scope = vec![0usize; table.slots.len()];
        for m in &meta {
            match per_scope.get_mut(m.scope as usize) {
                Some(n) => *n += 1,
                // A scope the image's list does not hold.
                None => {
                    return Err(invalid(
                        "record scope",
                        format!("{} is not listed", m.scope),
                    ))
                }
            }
        }
        let records = &table.records;
        let rehash = |&s: &u32| id_hash(records.id(s).unwrap_or_default());
        for (slots, n) in table.slots.iter_mut().zip(per_scope) {
            slots.reserve(n, rehash);
        }
        for (slot, m) in (0u32..).zip(&meta) {
            let id = records.id(slot).unwrap_or_default();
            let hash = id_hash(id);
            let slots = &mut table.slots[m.scope as usize];
            // One probe for both the check and the place (a million ids at a 1M open).
            match slots.entry(hash, |&s| records.id(s) == Some(id), rehash) {
                hashbrown::hash_table::Entry::Occupied(_) => {
                    return Err(invalid("record", format!("{id} is listed twice")));
                }
                hashbrown::hash_table::Entry::Vacant(place) => {
                    place.insert(slot);
                }
            }
            table.maybe_hidden[m.scope as usize] += u32::from(m.maybe_hidden());
        }
        if meta.len() != table.records.len() {
            return Err(invalid("records", "metadata of another count"));
        }
        table.meta = meta;
        table.hidden_slots = vec![0; table.records.len().div_ceil(64)];
        for (slot, meta) in table.meta.iter().enumerate() {
            if meta.maybe_hidden() {
                table.hidden_slots[slot / 64] |= 1 << (slot % 64);
            }
        }
        let mut audit = audit;
        table.last_audit = vec![NO_AUDIT; table.records.len()];
        for (here, item) in audit.iter_mut().enumerate() {
            let slot = item.slot as usize;
            let here = u32::try_from(here).map_err(|e| invalid("audit", e))?;
            let Some(last) = table.last_audit.get_mut(slot) else {
                return Err(invalid("audit item", format!("of unknown slot {slot}")));
            };
            if matches!(item.text, VersionText::Kept(_)) {
                table.kept.entry(item.slot).or_default().push_back(here);
            }
            item.prev = *last;
            *last = here;
        }
        table.audit = audit;
        // The index holds every record as the document of its slot, in its scope's group.
        let mut live = 0usize;
        for (doc, group) in table.index.live_documents() {
            live += 1;
            if table
                .meta
                .get(doc as usize)
                .is_none_or(|m| m.scope != group)
            {
                return Err(invalid(
                    "index",
                    format!("document {doc} is not a record of group {group}"),
                ));
            }
        }
        if live != table.records.len() {
            return Err(invalid(
                "index",
                format!("{live} documents for {} records", table.records.len()),
            ));
        }
        Ok(table)
    }
}

type Parts = (Records, Vec<Meta>, Vec<AuditItem>);

/// Reads the records' columns (ids and where each record's bytes lie in `bodies`, their
/// checksums, search metadata: no record is decoded, each is read where it lies when first
/// needed) and the audit items, checking every reference.
fn read_records(
    bytes: &[u8],
    bodies: Region,
    dictionaries: Dictionaries,
    actions: &[AuditAction],
) -> Result<Parts, ImageError> {
    let mut take = Take::new(bytes);
    let columns = RecordColumns::read(&mut take)?;
    let n = columns.len();
    let mut starts = Vec::with_capacity(n + 1);
    let mut end = 0u64;
    starts.push(0);
    for len in &columns.lens {
        end += u64::from(*len);
        starts.push(end);
    }
    if end != bodies.len() {
        return Err(invalid(
            "records",
            format!("{end} bytes where the image holds {}", bodies.len()),
        ));
    }
    let mut meta = Vec::with_capacity(n);
    let mut prints = Vec::with_capacity(n);
    // Each scope is checked against the scope list where the table's lookups are built
    // (`from_parts`).
    for i in 0..n {
        let kind = *entry(&dictionaries.kinds, columns.kinds[i], "kind")?;
        let m = columns
            .meta(i, kind)
            .ok_or_else(|| invalid("records", "columns of unequal lengths"))?;
        prints.push(print(&m));
        meta.push(m);
    }
    let (items, kept) = AuditColumns::read(&mut take)?;
    let mut kept = kept.into_iter();
    let mut audit = Vec::with_capacity(items.slots.len());
    let sources = &dictionaries.sources;
    for i in 0..items.slots.len() {
        let source = items.sources[i];
        entry(sources, source, "source")?;
        let text = match items.texts[i] {
            SAME => VersionText::Same,
            KEPT => VersionText::Kept(
                kept.next()
                    .ok_or_else(|| invalid("kept texts", "fewer than the items keeping one"))?
                    .into(),
            ),
            DROPPED => VersionText::Dropped,
            other => return Err(invalid("audit text kind", other)),
        };
        audit.push(AuditItem {
            slot: items.slots[i],
            prev: NO_AUDIT,
            action: *entry(actions, items.actions[i], "action")?,
            at: Timestamp(items.ats[i]),
            revision: items.revisions[i],
            source,
            text,
        });
    }
    if kept.next().is_some() {
        return Err(invalid("kept texts", "more than the items keeping one"));
    }
    if take.left() != 0 {
        return Err(invalid(
            "records",
            format!("{} bytes after them", take.left()),
        ));
    }
    let taken = Taken {
        starts,
        prints,
        checks: columns.checks,
        ids: columns.ids,
        id_ends: columns.id_ends,
    };
    Ok((
        Records::from_image(bodies, taken, dictionaries),
        meta,
        audit,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory_table::MemoryOp;
    use crate::memory::MemoryQuery;
    use proptest::prelude::*;
    use tavern_core::{AgentId, MemoryId, MemoryKind, MemorySource, MemoryWrite, SessionId, Tag};

    fn scope(i: usize) -> ScopeKey {
        ScopeKey::Agent {
            agent: AgentId::parse(format!("a{i}")).unwrap(),
        }
    }

    const TEXTS: &[&str] = &[
        "the silver gate",
        "灯笼在河边",
        "a lantern by the river",
        "silver 河灵",
    ];

    /// One step: put (create, edit or restore), forget, or touch record `id` of scope `sc`.
    fn step(
        t: &mut MemoryTable,
        (id, sc, action, text, expires): (usize, usize, u8, usize, Option<i64>),
        at: i64,
    ) {
        let key = MemoryId::parse(format!("m{id}")).unwrap();
        let current = t.get(&scope(sc), &key).cloned();
        let w = MemoryWrite {
            id: key.clone(),
            scope: scope(sc),
            kind: if id % 2 == 0 {
                MemoryKind::Semantic
            } else {
                MemoryKind::Episodic
            },
            content: format!("{} {id}", TEXTS[text]),
            tags: (0..id % 3)
                .map(|i| Tag::parse(format!("t{i}")).unwrap())
                .collect(),
            importance: 0.25 * (id % 4) as f64,
            confidence: 0.5,
            source: if action == 1 {
                MemorySource::system()
            } else {
                MemorySource::tool(
                    format!("call{at}"),
                    SessionId::parse("s1").unwrap(),
                    id as u64,
                )
            },
            expires_at: expires.map(Timestamp),
        };
        let op = match (action, current) {
            (0 | 1, None) => t
                .prepare_put(w, None, false, Timestamp(at))
                .map(|(_, op)| op),
            (0 | 1, Some(cur)) => t
                .prepare_put(w, Some(&cur.revision), true, Timestamp(at))
                .map(|(_, op)| op),
            (2, Some(cur)) if cur.deleted_at.is_none() => t
                .prepare_forget(
                    &cur.id,
                    &cur.scope,
                    &cur.revision,
                    MemorySource::system(),
                    Timestamp(at),
                )
                .map(|(_, op)| op),
            (3, Some(_)) => Ok(MemoryOp::Touch {
                scope: scope(sc),
                id: key,
                at: Timestamp(at),
            }),
            _ => return,
        };
        if let Ok(op) = op {
            t.apply(op);
        }
    }

    /// A table of `n` records, one created per step, in three scopes.
    fn table_of(n: usize) -> MemoryTable {
        let mut t = MemoryTable::new();
        for i in 0..n {
            step(&mut t, (i, i % 3, 0, i % 4, None), i as i64);
        }
        t
    }

    /// A table's image: what an open reads, and the postings read where they lie.
    type Image = (Vec<u8>, Vec<u8>);

    fn image(t: &MemoryTable) -> Image {
        let (mut out, mut postings) = (Vec::new(), Vec::new());
        assert!(t.write_image(&mut out, &mut postings));
        (out, postings)
    }

    fn read_back((bytes, postings): &Image) -> Result<MemoryTable, ImageError> {
        let mut whole = bytes.clone();
        whole.extend_from_slice(postings);
        MemoryTable::read_image(bytes, &Region::in_memory(whole))
    }

    fn same(a: &MemoryTable, b: &MemoryTable, now: i64) -> Result<(), TestCaseError> {
        prop_assert_eq!(a.snapshot(), b.snapshot());
        for q in ["silver gate", "灯笼", "river lantern 河灵"] {
            for scopes in [vec![], vec![scope(0)], vec![scope(1), scope(2)]] {
                let mut query = MemoryQuery::new(q, scopes.clone());
                query.limit = 7;
                query.include_deleted = scopes.len() == 1;
                let hits = |t: &MemoryTable| {
                    let r = t.search(&query, Timestamp(now));
                    (
                        r.source_count,
                        r.hits
                            .iter()
                            .map(|h| (h.record.clone(), h.score.to_bits()))
                            .collect::<Vec<_>>(),
                    )
                };
                prop_assert_eq!(hits(a), hits(b));
            }
            for sc in 0..3 {
                prop_assert_eq!(
                    a.audit(&scope(sc), None, Timestamp(now)),
                    b.audit(&scope(sc), None, Timestamp(now))
                );
                for id in 0..8 {
                    let id = MemoryId::parse(format!("m{id}")).unwrap();
                    prop_assert_eq!(
                        a.audit(&scope(sc), Some(&id), Timestamp(now)),
                        b.audit(&scope(sc), Some(&id), Timestamp(now))
                    );
                }
            }
        }
        Ok(())
    }

    type Step = (usize, usize, u8, usize, Option<i64>);

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            (
                0usize..5,
                0usize..3,
                0u8..4,
                0usize..4,
                prop::option::of(0i64..40),
            ),
            0..150,
        )
    }

    /// Opening decodes no record; a search decodes the hits it shows (and the records whose
    /// ties it breaks), an image written then copies the others as they were, and reading
    /// that image decodes none again.
    #[test]
    fn records_are_decoded_when_read_not_when_opened() {
        let t = table_of(200);
        let bytes = image(&t);
        // Its bytes where they lie, every read of them counted.
        struct Counting(Vec<u8>, std::sync::atomic::AtomicUsize);
        impl tavern_search::ReadAt for Counting {
            fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
                self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.0.read_at(offset, buf)
            }
        }
        let whole = [bytes.0.clone(), bytes.1.clone()].concat();
        let len = whole.len() as u64;
        let source = std::sync::Arc::new(Counting(whole, Default::default()));
        let reads = || source.1.load(std::sync::atomic::Ordering::Relaxed);
        let read = MemoryTable::read_image(&bytes.0, &Region::new(source.clone(), 0, len)).unwrap();
        assert_eq!(read.records.decoded(), 0);
        assert_eq!(reads(), 0, "an open reads no record and no posting list");
        let mut q = MemoryQuery::new("silver gate", vec![scope(1)]);
        q.limit = 3;
        let hits = read.search(&q, Timestamp(500)).hits;
        assert_eq!(hits.len(), 3);
        // The query's lists in that scope and the 3 records shown, of 200 records and their
        // hundreds of lists.
        assert!((4..=12).contains(&reads()), "{}", reads());
        // The hits shown, and no other (ties are broken by scope and id, not by records).
        assert_eq!(read.records.decoded(), 3);
        let decodes = read.records.decodes();
        assert_eq!(image(&read), bytes);
        assert_eq!(
            read.records.decodes(),
            decodes,
            "writing the image decoded records"
        );
        // A tag filter reads each match's tags without keeping the records.
        q.tags = vec![Tag::parse("t0").unwrap()];
        q.limit = 2;
        let tagged = read.search(&q, Timestamp(500));
        assert_eq!(tagged.hits.len(), 2);
        assert!(tagged.source_count > 20, "{}", tagged.source_count);
        assert!(read.records.decoded() <= 5, "{}", read.records.decoded());
        let again = read_back(&image(&read)).unwrap();
        assert_eq!(again.records.decoded(), 0);
        same(&t, &again, 500).unwrap();
    }

    /// A record whose bytes change where it lies after the open (still a record: another
    /// one) is never used: the table is lost, no image is written of it, its snapshot leaves
    /// the record out (a store reads the table again before using either), and applying more
    /// to it does not panic.
    #[test]
    fn a_record_changed_where_it_lies_makes_the_table_lost() {
        let t = table_of(20);
        let bytes = image(&t);
        let mut whole = [bytes.0.clone(), bytes.1.clone()].concat();
        // m0's content ("the silver gate 0"), one letter changed: it still decodes.
        let text = b"the silver gate 0";
        let at = whole.windows(text.len()).position(|w| w == text).unwrap();
        whole[at] = b'T';
        // What the open reads is as it was: the change came after.
        let read = MemoryTable::read_image(&bytes.0, &Region::in_memory(whole)).unwrap();
        assert!(!read.lost());
        let m0 = MemoryId::parse("m0").unwrap();
        let m1 = MemoryId::parse("m1").unwrap();
        assert!(read.get(&scope(1), &m1).is_some(), "the others read back");
        assert!(!read.lost());
        assert!(read.get(&scope(0), &m0).is_none());
        assert!(read.lost());
        let (mut out, mut rest) = (Vec::new(), Vec::new());
        assert!(
            !read.write_image(&mut out, &mut rest),
            "no image of a lost table"
        );
        assert_eq!(read.snapshot().len(), t.snapshot().len() - 1);
        let mut read = read;
        for i in 0..5 {
            step(&mut read, (i, i % 3, 2, i % 4, None), 100 + i as i64);
        }
        let _ = read.search(&MemoryQuery::new("silver gate", vec![]), Timestamp(200));
        assert!(read.lost());
    }

    /// The open reads each record's id and metadata from columns and no record: one whose
    /// bytes, when first read, are not the record its columns name (an image written wrong)
    /// is never used — the table is lost (its owner reads the log) —, and an invalid id in
    /// the columns is refused at open.
    #[test]
    fn a_record_unlike_its_columns_is_never_used() {
        let t = table_of(10);
        let (bytes, postings) = image(&t);
        // The ids column holds every id one after the other.
        let ids = b"m0m1m2";
        let at = bytes.windows(ids.len()).position(|w| w == ids).unwrap();
        let mut renamed = bytes.clone();
        renamed[at] = b'n';
        let read = read_back(&(renamed, postings.clone())).unwrap();
        let (m0, n0) = (
            MemoryId::parse("m0").unwrap(),
            MemoryId::parse("n0").unwrap(),
        );
        assert!(read
            .get(&scope(1), &MemoryId::parse("m1").unwrap())
            .is_some());
        assert!(
            read.get(&scope(0), &m0).is_none(),
            "not under its columns' id"
        );
        assert!(!read.lost());
        assert!(read.get(&scope(0), &n0).is_none(), "its bytes say m0");
        assert!(read.lost());
        let mut bad_id = bytes;
        bad_id[at] = b' ';
        assert!(read_back(&(bad_id, postings)).is_err());
    }

    /// An image listing one id twice in a scope is refused (its lookups could hold only one);
    /// the same id in two scopes is two records.
    #[test]
    fn an_id_listed_twice_in_a_scope_is_refused() {
        let t = table_of(10);
        let (bytes, postings) = image(&t);
        let ids = b"m0m1m2m3";
        let at = bytes.windows(ids.len()).position(|w| w == ids).unwrap();
        // m3 shares m0's scope (0), m1 is in scope 1.
        let mut twice = bytes.clone();
        twice[at + 7] = b'0';
        let err = read_back(&(twice, postings.clone())).unwrap_err();
        assert!(err.to_string().contains("m0 is listed twice"), "{err}");
        let mut other_scope = bytes;
        other_scope[at + 3] = b'0';
        let read = read_back(&(other_scope, postings)).unwrap();
        assert!(read
            .slot(&scope(1), &MemoryId::parse("m0").unwrap())
            .is_some());
        assert!(read
            .slot(&scope(0), &MemoryId::parse("m0").unwrap())
            .is_some());
    }

    /// Where column `k` (0: the id ends, 1: lengths, 2: checksums, 3: scopes, 4: kinds, 5:
    /// flags, 6–8: expiry, update and creation times, 9–10: importance, confidence) begins in
    /// a table image, and its width: the magic, the two lengths, the count, the ids, then the
    /// columns one after the other.
    fn column(bytes: &[u8], k: usize) -> (usize, usize) {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        let n = word(24);
        let ids = word(32);
        let widths = [4, 4, 4, 4, 4, 1, 8, 8, 8, 8, 8];
        let at = 40 + ids + widths[..k].iter().map(|w| w * n).sum::<usize>();
        (at, widths[k])
    }

    /// A record whose bytes hold its checksum but do not decode (an image written wrong:
    /// content that is not UTF-8) is never used: the table is lost when it is first read, and
    /// a check of every record finds it without using it.
    #[test]
    fn a_record_that_does_not_decode_is_never_used() {
        let t = table_of(10);
        let (mut bytes, mut rest) = image(&t);
        // m0's bytes come first in the rest; its checksum is the first of its column.
        let text = b"the silver gate 0";
        let at = rest.windows(text.len()).position(|w| w == text).unwrap();
        rest[at] = 0xff;
        let (lens, _) = column(&bytes, 1);
        let len = u32::from_le_bytes(bytes[lens..lens + 4].try_into().unwrap()) as usize;
        let (checks, _) = column(&bytes, 2);
        let sum = tavern_search::region::checksum(&rest[..len]);
        bytes[checks..checks + 4].copy_from_slice(&sum.to_le_bytes());
        let damaged = (bytes, rest);
        assert!(!read_back(&damaged).unwrap().records_whole());
        let read = read_back(&damaged).unwrap();
        assert!(read
            .get(&scope(1), &MemoryId::parse("m1").unwrap())
            .is_some());
        assert!(!read.lost());
        assert!(read
            .get(&scope(0), &MemoryId::parse("m0").unwrap())
            .is_none());
        assert!(read.lost());
        assert!(read_back(&image(&t)).unwrap().records_whole());
    }

    /// A record's bytes must end where its fields do (m0's length column taking the first
    /// byte of m1's, its checksum over those), and a record's flags hold no unknown bit (the
    /// open refuses those).
    #[test]
    fn a_record_with_bytes_after_its_fields_or_unknown_flags_is_refused() {
        let t = table_of(10);
        let (bytes, rest) = image(&t);
        let word = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let (lens, _) = column(&bytes, 1);
        let (checks, _) = column(&bytes, 2);
        let mut longer = bytes.clone();
        let (first, second) = (word(&bytes, lens), word(&bytes, lens + 4));
        longer[lens..lens + 4].copy_from_slice(&(first + 1).to_le_bytes());
        longer[lens + 4..lens + 8].copy_from_slice(&(second - 1).to_le_bytes());
        let sum = tavern_search::region::checksum(&rest[..first as usize + 1]);
        longer[checks..checks + 4].copy_from_slice(&sum.to_le_bytes());
        let read = read_back(&(longer, rest.clone())).unwrap();
        assert!(read
            .get(&scope(0), &MemoryId::parse("m0").unwrap())
            .is_none());
        assert!(read.lost());

        let (flags, _) = column(&bytes, 5);
        let mut flagged = bytes;
        flagged[flags] |= 4;
        assert!(read_back(&(flagged, rest)).is_err());
    }

    /// A record whose columns say other than its bytes (an image written wrong: another
    /// importance, another deleted flag) is never used once read: lookups, filters and
    /// ranking used the columns, so the record they found is not handed out as theirs.
    #[test]
    fn a_record_unlike_its_metadata_columns_is_never_used() {
        let t = table_of(10);
        let (bytes, rest) = image(&t);
        let m1 = MemoryId::parse("m1").unwrap();
        for (k, change) in [(9usize, 0x3fu8), (5, 1)] {
            let mut changed = bytes.clone();
            let (at, width) = column(&bytes, k);
            // Slot 1's value: its most significant byte (importance) or its flags (forgotten).
            changed[at + width * 2 - 1] ^= change;
            let read = read_back(&(changed, rest.clone())).unwrap();
            assert!(read
                .get(&scope(0), &MemoryId::parse("m0").unwrap())
                .is_some());
            assert!(!read.lost());
            assert!(read.get(&scope(1), &m1).is_none(), "column {k}");
            assert!(read.lost(), "column {k}");
        }
    }

    /// Posting lists damaged in the image's region after the open checked the rest: a search
    /// that reads one finds the index damaged, rebuilds it from the records and answers as the
    /// undamaged table does; an image written meanwhile is refused until the table is healed.
    #[test]
    fn damaged_posting_lists_are_healed_from_the_records() {
        let mut t = MemoryTable::new();
        for i in 0..200 {
            step(&mut t, (i % 50, i % 3, i as u8 % 3, i % 4, None), i as i64);
        }
        let (bytes, mut rest) = image(&t);
        // The records' bytes come first (their length after the magic and the columns'), then
        // the postings: only those are damaged.
        let bodies = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
        assert!(bodies > 0 && bodies < rest.len());
        for b in &mut rest[bodies..] {
            *b ^= 0x5a;
        }
        let damaged = (bytes, rest);
        let q = MemoryQuery::new("silver gate", vec![scope(1)]);
        let expected = t.search(&q, Timestamp(500));
        assert!(!expected.hits.is_empty());

        let mut read = read_back(&damaged).unwrap();
        assert!(!read.heal(), "nothing read yet, nothing found damaged");
        // What the damaged lists alone would answer: nothing.
        assert!(read.search(&q, Timestamp(500)).hits.is_empty());
        let (found, healed) = read.search_healing(&q, Timestamp(500));
        assert!(healed);
        assert_eq!(found.hits, expected.hits);
        same(&t, &read, 500).unwrap();
        assert!(!read.heal(), "healed once");

        // Writing an image copies the lists never read: checked, refused, then healed.
        let unread = read_back(&damaged).unwrap();
        let (mut out, mut rest) = (Vec::new(), Vec::new());
        assert!(!unread.write_image(&mut out, &mut rest));
        let mut unread = unread;
        assert!(unread.heal());
        let again = read_back(&image(&unread)).unwrap();
        same(&t, &again, 500).unwrap();
        // An edit decodes the lists it changes: the next search heals.
        let mut edited = read_back(&damaged).unwrap();
        step(&mut edited, (3, 0, 1, 2, None), 600);
        step(&mut t, (3, 0, 1, 2, None), 600);
        assert!(
            edited.index.damaged(),
            "found by the edit, before any search"
        );
        let (_, healed) = edited.search_healing(&q, Timestamp(700));
        assert!(healed);
        same(&t, &edited, 700).unwrap();
    }

    proptest! {
        /// A table read from its image is the table: the same image again, snapshot, searches
        /// (scores bit for bit), audit trails and kept texts, and it goes on alike under more
        /// writes, edits, forgets and touches.
        #[test]
        fn a_table_read_from_its_image_is_the_table(before in steps(), after in steps(), now in 0i64..60) {
            let mut t = MemoryTable::new();
            for (i, s) in before.iter().enumerate() { step(&mut t, *s, i as i64); }
            let bytes = image(&t);
            let mut read = read_back(&bytes).unwrap();
            // Another, never looked at before the writes below: its records are still the
            // image's bytes when they are written over, and its next image copies those left.
            let mut unread = read_back(&bytes).unwrap();
            prop_assert_eq!(&image(&read), &bytes);
            same(&t, &read, now)?;
            for (i, s) in after.iter().enumerate() {
                step(&mut t, *s, 100 + i as i64);
                step(&mut read, *s, 100 + i as i64);
                step(&mut unread, *s, 100 + i as i64);
            }
            let unread_again = read_back(&image(&unread)).unwrap();
            same(&t, &unread_again, now + 100)?;
            same(&t, &unread, now + 100)?;
            same(&t, &read, now + 100)?;
            // Its image numbers sources and kinds as the one it was read from did (records
            // never read since are copied as they were), so the bytes may differ from a fresh
            // table's: what it reads back as may not.
            let again = read_back(&image(&read)).unwrap();
            same(&t, &again, now + 100)?;
            prop_assert_eq!(image(&again), image(&read));
        }

        /// A cut image is refused, a damaged one refused or read, never a panic.
        #[test]
        fn a_damaged_table_image_is_an_error_not_a_panic(
            before in steps(),
            cut in any::<prop::sample::Index>(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut t = MemoryTable::new();
            for (i, s) in before.iter().enumerate() { step(&mut t, *s, i as i64); }
            let bytes = image(&t);
            let cut_short = (bytes.0[..cut.index(bytes.0.len())].to_vec(), bytes.1.clone());
            prop_assert!(read_back(&cut_short).is_err());
            let mut damaged = bytes.clone();
            for (at, x) in &flips { let i = at.index(damaged.0.len()); damaged.0[i] ^= x | 1; }
            if let Ok(mut read) = read_back(&damaged) {
                let _ = read.search(&MemoryQuery::new("silver", vec![]), Timestamp(5));
                step(&mut read, (1, 0, 0, 2, None), 200);
                step(&mut read, (2, 1, 2, 0, None), 201);
            }
        }
    }
}
