//! The memory table as bytes and back: its records, audit trail and search index, so opening a
//! large store reads them instead of parsing, tokenizing and indexing every log line again
//! (`fs::image` keeps the bytes on disk beside the log they were read from).
//!
//! Records and audit items are written field by field; the values few records differ in
//! (scopes, sources, kinds, actions) once each, as JSON, in a dictionary. Reading validates
//! every id and revision as the log's parser does and rebuilds what is derived (the lookups
//! by id, search metadata, audit chains, kept texts); the records and the index are read on
//! two threads.

use rustc_hash::FxHashMap;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::hash::Hash;

use tavern_core::{
    AuditAction, MemoryId, MemoryKind, MemoryRecord, MemorySource, Revision, ScopeKey, Tag,
    Timestamp,
};
use tavern_search::{Bm25Index, ImageError, Put, Take};

use super::{AuditItem, MemoryTable, Meta, VersionText, NO_AUDIT};

/// The first bytes of a memory table image and its format version.
const MAGIC: &[u8; 8] = b"tvmemt\0\x01";

/// Distinct values written once each (as JSON), referred to by number.
struct Dictionary<'a, T: Hash + Eq> {
    ids: FxHashMap<&'a T, u32>,
    values: Vec<&'a T>,
}

impl<'a, T: Hash + Eq + Serialize> Dictionary<'a, T> {
    fn new() -> Self {
        Self {
            ids: FxHashMap::default(),
            values: Vec::new(),
        }
    }

    fn id(&mut self, value: &'a T) -> u32 {
        let next = u32::try_from(self.values.len()).unwrap_or(u32::MAX);
        *self.ids.entry(value).or_insert_with(|| {
            self.values.push(value);
            next
        })
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

fn entry<'v, T>(values: &'v [T], id: u32, what: &str) -> Result<&'v T, ImageError> {
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

fn maybe_time(bytes: &mut Take<'_>, what: &'static str) -> Result<Option<Timestamp>, ImageError> {
    let some = bytes.flag(what)?;
    let t = time(bytes, what)?;
    Ok(some.then_some(t))
}

fn invalid(what: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::Invalid(format!("{what}: {e}"))
}

/// Text kinds of an audit item.
const SAME: u8 = 0;
const KEPT: u8 = 1;
const DROPPED: u8 = 2;

impl MemoryTable {
    /// Appends the table's image to `out`: [`MemoryTable::read_image`] reads back the same
    /// table. Layout: the records and audit items behind their length, the dictionaries they
    /// refer to (scopes by scope id, sources, kinds, actions), the index.
    pub(crate) fn write_image(&self, out: &mut Vec<u8>) {
        out.reserve(self.records.len() * 160 + 64);
        out.extend_from_slice(MAGIC);
        let len_at = out.len();
        out.put_u64(0);
        let (mut sources, mut kinds, mut actions) =
            (Dictionary::new(), Dictionary::new(), Dictionary::new());
        out.put_len(self.records.len());
        for (r, m) in self.records.iter().zip(&self.meta) {
            out.put_str(r.id.as_str());
            out.put_u32(m.scope);
            out.put_u32(kinds.id(&r.kind));
            out.put_str(&r.content);
            out.put_len(r.tags.len());
            for tag in &r.tags {
                out.put_str(tag.as_str());
            }
            out.put_f64(r.importance);
            out.put_f64(r.confidence);
            out.put_u32(sources.id(&r.source));
            put_time(out, Some(r.created_at));
            put_time(out, Some(r.updated_at));
            put_time(out, r.last_accessed_at);
            put_time(out, r.expires_at);
            put_time(out, r.deleted_at);
            out.put_str(r.revision.as_str());
        }
        out.put_len(self.audit.len());
        for a in &self.audit {
            out.put_u32(a.slot);
            out.put_u32(actions.id(&a.action));
            put_time(out, Some(a.at));
            out.put_str(a.revision.as_str());
            out.put_u32(sources.id(&a.source));
            match &a.text {
                VersionText::Same => out.put_u8(SAME),
                VersionText::Kept(text) => {
                    out.put_u8(KEPT);
                    out.put_str(text);
                }
                VersionText::Dropped => out.put_u8(DROPPED),
            }
        }
        let records_len = (out.len() - len_at - 8) as u64;
        out[len_at..len_at + 8].copy_from_slice(&records_len.to_le_bytes());
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
        // The index last, so the records and the index are read on two threads.
        self.index.write_image(out);
    }

    /// Reads a table written by [`MemoryTable::write_image`].
    ///
    /// # Errors
    /// [`ImageError`] when the bytes are not such an image, end early, hold an invalid id,
    /// revision or tag, or refer to records, scopes or dictionary entries they do not hold.
    pub(crate) fn read_image(bytes: &[u8]) -> Result<Self, ImageError> {
        let mut take = Take::new(bytes);
        if take.bytes(MAGIC.len(), "memory image header")? != MAGIC {
            return Err(ImageError::Invalid(
                "not a memory table image of this version".into(),
            ));
        }
        let records_len = take.len(1, "records")?;
        let records_part = take.bytes(records_len, "records")?;
        let scopes: Vec<ScopeKey> = read_dictionary(&mut take, "scope")?;
        let sources: Vec<MemorySource> = read_dictionary(&mut take, "source")?;
        let kinds: Vec<MemoryKind> = read_dictionary(&mut take, "kind")?;
        let actions: Vec<AuditAction> = read_dictionary(&mut take, "action")?;
        // The index is read on another thread while the records are.
        let index_part = take.rest();
        let (parts, index) = std::thread::scope(|s| {
            let index = s.spawn(move || {
                let mut take = Take::new(index_part);
                let index = Bm25Index::read_image(&mut take)?;
                match take.left() {
                    0 => Ok(index),
                    n => Err(ImageError::Invalid(format!("{n} bytes after the index"))),
                }
            });
            let parts = read_records(records_part, &scopes, &sources, &kinds, &actions);
            let index = index
                .join()
                .unwrap_or_else(|_| Err(ImageError::Invalid("reading the index failed".into())));
            (parts, index)
        });
        let (records, scope_of, audit) = parts?;
        Self::from_parts(scopes, records, scope_of, audit, index?)
    }

    /// The table of these records (with their scope ids) and audit items, and their index:
    /// every derived lookup built again, every reference checked.
    fn from_parts(
        scopes: Vec<ScopeKey>,
        records: Vec<MemoryRecord>,
        scope_of: Vec<u32>,
        audit: Vec<AuditItem>,
        index: Bm25Index,
    ) -> Result<Self, ImageError> {
        let mut table = Self {
            index,
            ..Self::default()
        };
        for scope in &scopes {
            let before = table.slots.len();
            if table.scope_id(scope) as usize != before {
                return Err(invalid("scope", "listed twice"));
            }
        }
        table.meta.reserve_exact(records.len());
        // Each scope's lookup grown once to its size, not doubled step by step.
        let mut per_scope = vec![0usize; table.slots.len()];
        for scope in &scope_of {
            match per_scope.get_mut(*scope as usize) {
                Some(n) => *n += 1,
                // `read_records` took each record's scope from the scope list.
                None => return Err(invalid("record scope", format!("{scope} is not listed"))),
            }
        }
        for (slots, n) in table.slots.iter_mut().zip(per_scope) {
            slots.reserve(n);
        }
        for (slot, (record, &scope)) in records.iter().zip(&scope_of).enumerate() {
            let slot = u32::try_from(slot).map_err(|e| invalid("slot", e))?;
            if table.slots[scope as usize]
                .insert(record.id.clone(), slot)
                .is_some()
            {
                return Err(invalid("record", format!("{} is listed twice", record.id)));
            }
            let meta = Meta::of(record, scope);
            table.maybe_hidden[scope as usize] += u32::from(meta.maybe_hidden());
            table.meta.push(meta);
        }
        // Moved whole, never record by record.
        table.records = records;
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

type Parts = (Vec<MemoryRecord>, Vec<u32>, Vec<AuditItem>);

fn read_records(
    bytes: &[u8],
    scopes: &[ScopeKey],
    sources: &[MemorySource],
    kinds: &[MemoryKind],
    actions: &[AuditAction],
) -> Result<Parts, ImageError> {
    let mut take = Take::new(bytes);
    let n = take.len(60, "records")?;
    let mut records = Vec::with_capacity(n);
    let mut scope_of = Vec::with_capacity(n);
    for _ in 0..n {
        let id = MemoryId::parse(take.str("memory id")?).map_err(|e| invalid("memory id", e))?;
        let scope = take.u32("record scope")?;
        let kind = *entry(kinds, take.u32("kind")?, "kind")?;
        let content = take.str("content")?.to_owned();
        let tag_count = take.len(8, "tags")?;
        let tags = (0..tag_count)
            .map(|_| Tag::parse(take.str("tag")?).map_err(|e| invalid("tag", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let importance = take.f64("importance")?;
        let confidence = take.f64("confidence")?;
        let source = entry(sources, take.u32("source")?, "source")?.clone();
        let created_at = maybe_time(&mut take, "created at")?.unwrap_or(Timestamp(0));
        let updated_at = maybe_time(&mut take, "updated at")?.unwrap_or(Timestamp(0));
        let last_accessed_at = maybe_time(&mut take, "last accessed at")?;
        let expires_at = maybe_time(&mut take, "expires at")?;
        let deleted_at = maybe_time(&mut take, "deleted at")?;
        let revision =
            Revision::parse(take.str("revision")?).map_err(|e| invalid("revision", e))?;
        let scope_key = entry(scopes, scope, "scope")?.clone();
        records.push(MemoryRecord {
            id,
            scope: scope_key,
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
        });
        scope_of.push(scope);
    }
    let items = take.len(30, "audit items")?;
    let mut audit = Vec::with_capacity(items);
    for _ in 0..items {
        let slot = take.u32("audit slot")?;
        let action = *entry(actions, take.u32("action")?, "action")?;
        let at = maybe_time(&mut take, "audit time")?.unwrap_or(Timestamp(0));
        let revision =
            Revision::parse(take.str("audit revision")?).map_err(|e| invalid("revision", e))?;
        let source = entry(sources, take.u32("audit source")?, "source")?.clone();
        let text = match take.u8("audit text")? {
            SAME => VersionText::Same,
            KEPT => VersionText::Kept(take.str("kept text")?.into()),
            DROPPED => VersionText::Dropped,
            other => return Err(invalid("audit text kind", other)),
        };
        audit.push(AuditItem {
            slot,
            prev: NO_AUDIT,
            action,
            at,
            revision,
            source,
            text,
        });
    }
    if take.left() != 0 {
        return Err(invalid(
            "records",
            format!("{} bytes after them", take.left()),
        ));
    }
    Ok((records, scope_of, audit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory_table::MemoryOp;
    use crate::memory::MemoryQuery;
    use proptest::prelude::*;
    use tavern_core::{AgentId, MemorySource, MemoryWrite, SessionId};

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

    fn image(t: &MemoryTable) -> Vec<u8> {
        let mut out = Vec::new();
        t.write_image(&mut out);
        out
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

    proptest! {
        /// A table read from its image is the table: the same image again, snapshot, searches
        /// (scores bit for bit), audit trails and kept texts, and it goes on alike under more
        /// writes, edits, forgets and touches.
        #[test]
        fn a_table_read_from_its_image_is_the_table(before in steps(), after in steps(), now in 0i64..60) {
            let mut t = MemoryTable::new();
            for (i, s) in before.iter().enumerate() { step(&mut t, *s, i as i64); }
            let bytes = image(&t);
            let mut read = MemoryTable::read_image(&bytes).unwrap();
            prop_assert_eq!(&image(&read), &bytes);
            same(&t, &read, now)?;
            for (i, s) in after.iter().enumerate() {
                step(&mut t, *s, 100 + i as i64);
                step(&mut read, *s, 100 + i as i64);
            }
            prop_assert_eq!(image(&read), image(&t));
            same(&t, &read, now + 100)?;
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
            prop_assert!(MemoryTable::read_image(&bytes[..cut.index(bytes.len())]).is_err());
            let mut damaged = bytes.clone();
            for (at, x) in &flips { let i = at.index(damaged.len()); damaged[i] ^= x | 1; }
            if let Ok(mut read) = MemoryTable::read_image(&damaged) {
                let _ = read.search(&MemoryQuery::new("silver", vec![]), Timestamp(5));
                step(&mut read, (1, 0, 0, 2, None), 200);
                step(&mut read, (2, 1, 2, 0, None), 201);
            }
        }
    }
}
