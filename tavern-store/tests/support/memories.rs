//! Memories for the image and scope tests of every backend: scopes, texts, edits through the
//! port, and what a user can see of them (searches with scores, audit trails), to compare
//! stores by.
// Each test file uses part of it.
#![allow(dead_code)]

use tavern_core::{AgentId, MemoryId, MemorySource, ScopeKey};
use tavern_store::conformance::write;
use tavern_store::fs::FsStore;
use tavern_store::{MemoryQuery, MemoryStore};

/// An agent scope.
pub fn scope(i: usize) -> ScopeKey {
    ScopeKey::Agent {
        agent: AgentId::parse(format!("a{i}")).unwrap(),
    }
}

/// Texts, English and Chinese, that the records cycle through.
pub const TEXTS: &[&str] = &[
    "a lantern by the silver gate",
    "米拉在雨夜里点亮了灯笼",
    "the river spirit keeps the old bridge",
    "Kai fears deep water",
];

/// 5,000 records in two scopes in one append, then edits, forgets and reads through the port.
pub async fn fill(s: &FsStore) {
    let writes = (0..5000)
        .map(|i| {
            write(
                &format!("m{i}"),
                scope(i % 2),
                &format!("{} {i}", TEXTS[i % 4]),
            )
        })
        .collect();
    s.import_memories(writes).unwrap();
    edit(s, 0..12, "edited").await;
    // A read marks the record accessed (a line of its own).
    let id = MemoryId::parse("m4999").unwrap();
    assert!(s.read(&id, &scope(1)).await.unwrap().is_some());
}

/// Edits the records `ids` (each twice) and forgets every third.
pub async fn edit(s: &impl MemoryStore, ids: std::ops::Range<usize>, word: &str) {
    for i in ids {
        let (sc, id) = (scope(i % 2), MemoryId::parse(format!("m{i}")).unwrap());
        for round in 0..2 {
            let cur = s.inspect(&id, &sc).await.unwrap().unwrap();
            let w = write(
                &format!("m{i}"),
                sc.clone(),
                &format!("{word} {round} lantern {i}"),
            );
            s.put(w, Some(&cur.revision), false).await.unwrap();
        }
        if i % 3 == 0 {
            let cur = s.inspect(&id, &sc).await.unwrap().unwrap();
            s.forget(&id, &sc, &cur.revision, MemorySource::system())
                .await
                .unwrap();
        }
    }
}

/// What a user can see of the memories: searches with their scores, and audit trails.
pub async fn seen(s: &impl MemoryStore) -> String {
    let mut out = String::new();
    for q in ["lantern", "灯笼", "edited river", "silver gate 4999"] {
        for scopes in [vec![scope(0)], vec![scope(1)], vec![scope(0), scope(1)]] {
            let mut query = MemoryQuery::new(q, scopes);
            query.limit = 20;
            query.include_deleted = true;
            let r = s.search(&query).await.unwrap();
            out.push_str(&format!("{q} {}:", r.source_count));
            for h in r.hits {
                out.push_str(&format!(
                    " {}@{}/{}/{:?}",
                    h.record.id, h.score, h.record.revision, h.record.deleted_at
                ));
            }
            out.push('\n');
        }
    }
    for sc in 0..2 {
        for id in [None, Some("m0"), Some("m3"), Some("m4999")] {
            let id = id.map(|i| MemoryId::parse(i).unwrap());
            let trail = s.memory_audit(&scope(sc), id.as_ref()).await.unwrap();
            out.push_str(&format!("{trail:?}\n"));
        }
    }
    out
}

/// How many bytes of an image file an open reads (its header, 40 bytes, says how many of the
/// body's first bytes it checks).
fn checked_part(image: &[u8]) -> usize {
    40 + u64::from_le_bytes(image[16..24].try_into().unwrap()) as usize
}

/// Where an image file's posting lists begin: after its checked part (the header gives its
/// length), the records' bytes (the memory table's header gives theirs), then the postings.
pub fn postings_at(image: &[u8]) -> usize {
    let table = image
        .windows(8)
        .position(|w| w == b"tvmemt\0\x03")
        .expect("a memory table image");
    let records = u64::from_le_bytes(image[table + 16..table + 24].try_into().unwrap());
    checked_part(image) + records as usize
}

/// An image damaged three ways: a flipped bit in the middle of what an open reads (the
/// header, 40 bytes, says how much that is), its last bytes cut off, and no more than its
/// magic's first seven bytes.
pub fn damaged(image: &[u8]) -> [Vec<u8>; 3] {
    let mut flipped = image.to_vec();
    let middle = 40 + (checked_part(image) - 40) / 2;
    flipped[middle] ^= 0x20;
    [
        flipped,
        image[..image.len() - 7].to_vec(),
        image[..7].to_vec(),
    ]
}

/// Asserts that creating `m1` in scope 1 (which holds it) is refused as a conflict, not
/// written over it.
pub async fn creating_m1_again_is_refused(s: &impl MemoryStore) {
    let created = s
        .put(write("m1", scope(1), "written over"), None, false)
        .await;
    assert!(
        matches!(created, Err(tavern_store::StoreError::Conflict { .. })),
        "{created:?}"
    );
}

/// Changes, in place (the same file, as another program writing into it would), one letter
/// of the contents of the first records of the memory table image at `path` — those of `m0`
/// and `m1`, the first records written, whose texts hold "lantern" — so that they still read
/// as records (only their checksums tell), and returns the file as it was.
pub fn change_first_records(path: &std::path::Path) -> Vec<u8> {
    use std::io::{Seek, SeekFrom, Write};
    let before = std::fs::read(path).unwrap();
    // The records' bytes lie first after the checked part (the header gives its length), in
    // the order they were written.
    let mut at = checked_part(&before);
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    for _ in 0..2 {
        let word = b"lantern";
        at += before[at..]
            .windows(word.len())
            .position(|w| w == word)
            .expect("a record holding \"lantern\"");
        // "lanterm": still UTF-8, still a record.
        file.seek(SeekFrom::Start((at + 6) as u64)).unwrap();
        file.write_all(b"m").unwrap();
        at += word.len();
    }
    file.sync_all().unwrap();
    before
}
