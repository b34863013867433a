//! `TableDump::memory_digest` tells two stores' memories apart by their exact records (what
//! `tavern check` compares a PostgreSQL image with the rows by): the same records written in
//! another order agree; one edit, or one record forgotten in one of them, does not.

use std::sync::Arc;

use tavern_core::{MemoryId, MemorySource, ScopeKey};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::{write, T0};
use tavern_store::fs::FsStore;
use tavern_store::{MemoryDigest, MemoryStore, Transfer};

fn scope(i: usize) -> ScopeKey {
    ScopeKey::Agent {
        agent: tavern_core::AgentId::parse(format!("a{i}")).unwrap(),
    }
}

/// A store holding memories `ids`, written in that order.
async fn store(dir: &std::path::Path, ids: impl IntoIterator<Item = usize>) -> FsStore {
    let s = FsStore::open(dir, Arc::new(ManualClock::new(T0))).unwrap();
    for i in ids {
        let w = write(&format!("m{i}"), scope(i % 2), &format!("the lantern {i}"));
        s.put(w, None, false).await.unwrap();
    }
    s
}

/// Under one key for the whole test run (as one check uses one).
async fn digest(s: &FsStore) -> MemoryDigest {
    static KEY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let key = *KEY.get_or_init(MemoryDigest::random_key);
    s.dump_tables().await.unwrap().memory_digest(key).unwrap()
}

#[tokio::test]
async fn memories_are_compared_by_their_exact_records_in_any_order() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = store(dirs[0].path(), 0..20).await;
    let b = store(dirs[1].path(), (0..20).rev()).await;
    assert!(digest(&a).await.same(&digest(&b).await));
    // Digests under different keys are never the same, and the keys differ.
    let (k1, k2) = (MemoryDigest::random_key(), MemoryDigest::random_key());
    assert_ne!(k1, k2);
    let dump = a.dump_tables().await.unwrap();
    assert!(!dump
        .memory_digest(k1)
        .unwrap()
        .same(&dump.memory_digest(k2).unwrap()));
    let (da, db) = (
        a.dump_tables().await.unwrap(),
        b.dump_tables().await.unwrap(),
    );
    assert!(da.same_memories(&db).unwrap());

    // One edit in one of them is seen.
    let (id, sc) = (MemoryId::parse("m3").unwrap(), scope(1));
    let cur = b.inspect(&id, &sc).await.unwrap().unwrap();
    b.put(
        write("m3", sc.clone(), "the lantern 3!"),
        Some(&cur.revision),
        false,
    )
    .await
    .unwrap();
    assert!(!digest(&a).await.same(&digest(&b).await));

    // So is one forgotten (still a record, with its tombstone) where the other is live.
    let dir = tempfile::tempdir().unwrap();
    let c = store(dir.path(), 0..20).await;
    let cur = c.inspect(&id, &sc).await.unwrap().unwrap();
    c.forget(&id, &sc, &cur.revision, MemorySource::system())
        .await
        .unwrap();
    assert!(!digest(&a).await.same(&digest(&c).await));
    assert!(!da.same_memories(&c.dump_tables().await.unwrap()).unwrap());
}
