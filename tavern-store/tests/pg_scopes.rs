//! A PostgreSQL store that holds memories by scope (`PgOptions::max_loaded_memories`) loads a
//! scope on its first use and drops the least recently used past its bound, and still sees,
//! ranks and decides exactly as a store holding every memory: beside such stores, under
//! concurrent compare-and-set writers, and across another process's compaction.

#[path = "support/memories.rs"]
mod memories;
#[path = "support/pg.rs"]
mod pg_support;

use std::sync::Arc;

use memories::{edit, fill, scope, seen};
use tavern_core::{MemoryId, ScopeKey};
use tavern_store::clock::{Clock, ManualClock};
use tavern_store::conformance::{write, T0};
use tavern_store::fs::FsStore;
use tavern_store::pg::{PgConfig, PgOptions, PgStore, PgTls};
use tavern_store::{copy_store, MemoryQuery, MemoryStore, StoreError};

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::new(T0))
}

/// A store holding every memory (`None`) or only what calls touch, about `bound` records.
async fn open(config: &PgConfig, bound: Option<usize>) -> PgStore {
    let mut options = PgOptions::default();
    options.max_loaded_memories = bound;
    PgStore::open_with_options(config.clone(), &PgTls::default(), clock(), options)
        .await
        .unwrap()
}

/// A fresh database holding the 5,000 memories of `memories::fill` (2,500 per scope, more
/// rows per scope than one batch of a scope's load), copied in from a file store.
async fn filled_database() -> PgConfig {
    let config = pg_support::cluster().fresh_database().await;
    let files = tempfile::tempdir().unwrap();
    let source = FsStore::open(files.path(), clock()).unwrap();
    fill(&source).await;
    copy_store(&source, &open(&config, None).await)
        .await
        .unwrap();
    config
}

async fn touch(s: &PgStore, sc: &ScopeKey) {
    let id = MemoryId::parse("m0").unwrap();
    s.inspect(&id, sc).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_holding_scopes_sees_and_ranks_as_one_holding_every_memory() {
    let config = filled_database().await;
    let everything = open(&config, None).await;
    let one_at_a_time = open(&config, Some(0)).await;
    let roomy = open(&config, Some(100_000)).await;
    // Opening holds nothing.
    assert_eq!(one_at_a_time.memory_len().await, 0);
    let want = seen(&everything).await;
    assert_eq!(seen(&one_at_a_time).await, want);
    assert_eq!(seen(&roomy).await, want);

    // A call on one scope holds that scope alone (bound 0: every other one is dropped).
    touch(&one_at_a_time, &scope(0)).await;
    assert_eq!(one_at_a_time.memory_len().await, 2500);
    touch(&one_at_a_time, &scope(1)).await;
    assert_eq!(one_at_a_time.memory_len().await, 2500);
    // A search of every scope holds them all for that call; the next scoped call drops.
    let mut all = MemoryQuery::new("lantern 灯笼", vec![]);
    all.limit = 50;
    let ids = |r: tavern_store::MemorySearchResult| {
        r.hits
            .iter()
            .map(|h| format!("{}@{}", h.record.id, h.score))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(one_at_a_time.search(&all).await.unwrap()),
        ids(everything.search(&all).await.unwrap())
    );
    assert_eq!(one_at_a_time.memory_len().await, 5000);
    touch(&one_at_a_time, &scope(0)).await;
    assert_eq!(one_at_a_time.memory_len().await, 2500);
    // Under its bound nothing is dropped.
    assert_eq!(roomy.memory_len().await, 5000);

    // Writes through the store holding one scope at a time are seen everywhere, and theirs
    // (of scopes it has dropped meanwhile) by it.
    edit(&one_at_a_time, 12..30, "again").await;
    edit(&everything, 30..40, "later").await;
    let want = seen(&everything).await;
    assert_eq!(seen(&one_at_a_time).await, want);
    assert_eq!(seen(&roomy).await, want);
    assert_eq!(seen(&open(&config, Some(0)).await).await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_through_stores_holding_different_scopes_lose_no_increment() {
    let config = pg_support::cluster().fresh_database().await;
    let stores = [
        Arc::new(open(&config, Some(0)).await),
        Arc::new(open(&config, Some(3)).await),
        Arc::new(open(&config, None).await),
    ];
    // Six writers, two per store, each adding 1 to a memory of one of three scopes, twelve
    // times, by compare-and-set on the memory's revision, retried on a conflict.
    let mut tasks = Vec::new();
    for w in 0..6usize {
        let s = stores[w % 3].clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..12usize {
                let sc = scope((w + k) % 3);
                let id = MemoryId::parse("count").unwrap();
                loop {
                    let cur = s.inspect(&id, &sc).await.unwrap();
                    let n: u64 = cur
                        .as_ref()
                        .map_or(0, |r| r.content.split(' ').nth(1).unwrap().parse().unwrap());
                    let next = write("count", sc.clone(), &format!("counted {}", n + 1));
                    match s.put(next, cur.as_ref().map(|r| &r.revision), false).await {
                        Ok(_) => break,
                        Err(StoreError::Conflict { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let id = MemoryId::parse("count").unwrap();
    for s in &stores {
        let mut total = 0;
        for sc in 0..3 {
            let r = s.inspect(&id, &scope(sc)).await.unwrap().unwrap();
            let n: u64 = r.content.split(' ').nth(1).unwrap().parse().unwrap();
            // Every increment of that scope is one version in its audit trail.
            let trail = s.memory_audit(&scope(sc), Some(&id)).await.unwrap();
            assert_eq!(trail.len() as u64, n, "scope {sc}");
            total += n;
        }
        assert_eq!(total, 72);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_compacting_leaves_a_store_holding_scopes_exact() {
    let config = filled_database().await;
    let holder = open(&config, Some(0)).await;
    let other = open(&config, None).await;
    touch(&holder, &scope(0)).await;
    // Changes to a held scope and to a dropped one, then a compaction, all elsewhere.
    edit(&other, 40..46, "before").await;
    let report = other.compact().await.unwrap();
    assert!(report.memory.1 < report.memory.0, "{report:?}");
    edit(&other, 46..50, "after").await;
    // As any process reading the compacted table sees it (the compacting process keeps its
    // own order of audit items with equal times; the snapshot lists them record by record).
    assert_eq!(seen(&holder).await, seen(&open(&config, None).await).await);

    // Compare-and-set through the holder after the compaction: the current revision wins, a
    // stale one is refused.
    let (sc, id) = (scope(1), MemoryId::parse("m47").unwrap());
    let stale = holder.inspect(&id, &sc).await.unwrap().unwrap().revision;
    edit(&other, 47..48, "moved").await;
    touch(&holder, &scope(0)).await;
    let err = holder
        .put(write("m47", sc.clone(), "stale"), Some(&stale), false)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    let current = other.inspect(&id, &sc).await.unwrap().unwrap().revision;
    holder
        .put(write("m47", sc.clone(), "fresh"), Some(&current), false)
        .await
        .unwrap();
    assert_eq!(
        other.inspect(&id, &sc).await.unwrap().unwrap().content,
        "fresh"
    );

    // Compacting through the holder holds every scope for it, and drops them after.
    holder.compact().await.unwrap();
    assert_eq!(holder.memory_len().await, 5000);
    touch(&holder, &scope(1)).await;
    assert_eq!(holder.memory_len().await, 2500);
    assert_eq!(seen(&holder).await, seen(&open(&config, None).await).await);
    // A memory forgotten before the compactions is still there, forgotten.
    let m3 = MemoryId::parse("m3").unwrap();
    let forgotten = holder.inspect(&m3, &scope(1)).await.unwrap().unwrap();
    assert!(forgotten.deleted_at.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_by_scope_and_keeping_an_image_are_refused_together() {
    let config = pg_support::cluster().fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let options = PgOptions::default()
        .with_memory_image_dir(dir.path())
        .with_max_loaded_memories(10);
    let err = PgStore::open_with_options(config, &PgTls::default(), clock(), options)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("max_loaded_memories"), "{text}");
    assert!(!text.contains(&dir.path().display().to_string()), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_loads_through_its_own_index() {
    // Many scopes of a few memories each, as a shared database holds.
    let config = pg_support::cluster().fresh_database().await;
    let files = tempfile::tempdir().unwrap();
    let source = FsStore::open(files.path(), clock()).unwrap();
    let writes = (0..3000)
        .map(|i| write(&format!("m{i}"), scope(i % 300), "a lantern"))
        .collect();
    source.import_memories(writes).unwrap();
    let store = open(&config, Some(0)).await;
    copy_store(&source, &store).await.unwrap();
    let plan = store
        .memory_scope_plan(&scope(7).to_string())
        .await
        .unwrap();
    assert!(plan.contains("memory_ops_scope_seq"), "{plan}");
    touch(&store, &scope(7)).await;
    assert_eq!(store.memory_len().await, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_scope_was_dropped_while_it_waited_is_applied_once() {
    let config = pg_support::cluster().fresh_database().await;
    let store = Arc::new(open(&config, Some(0)).await);
    let (a, b) = (scope(0), scope(1));
    store
        .put(write("m1", b.clone(), "river"), None, false)
        .await
        .unwrap();
    // Another session holds the table lock: the store's write of scope `a` is decided (with
    // `a` held) and waits for it at the server, the mirror free meanwhile.
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    let task = tokio::spawn(conn);
    client
        .batch_execute("BEGIN; LOCK TABLE memory_ops IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let writer = {
        let (store, a) = (store.clone(), a.clone());
        tokio::spawn(async move { store.put(write("m0", a, "lantern"), None, false).await })
    };
    // Until the write is seen waiting for the lock.
    until_waiting(&client).await;
    // A read of `b` drops `a` (bound 0) while the write waits.
    touch(&store, &b).await;
    assert_eq!(store.memory_len().await, 1);
    client.batch_execute("COMMIT").await.unwrap();
    writer.await.unwrap().unwrap();
    // The write's row is read with its scope, once: one version, one audit item.
    let id = MemoryId::parse("m0").unwrap();
    assert_eq!(
        store.inspect(&id, &a).await.unwrap().unwrap().content,
        "lantern"
    );
    assert_eq!(store.memory_audit(&a, Some(&id)).await.unwrap().len(), 1);
    assert_eq!(store.memory_len().await, 1);
    drop(client);
    let _ = task.await;
}

/// Until the server reports a session waiting for a lock on `memory_ops` (its own view, no
/// timing).
async fn until_waiting(client: &tavern_store::pg::PgClient) {
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                 WHERE c.relname = 'memory_ops' AND NOT l.granted",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_every_scope_loads_only_the_scopes_not_held() {
    let config = filled_database().await;
    let everything = open(&config, None).await;
    let holder = open(&config, Some(0)).await;
    touch(&holder, &scope(0)).await;
    let one_scope = holder.memory_rows_replayed().await;
    assert!(one_scope >= 2500, "{one_scope}");
    // A search of every scope reads the other scope's rows alone, and ranks as a store
    // holding everything (ties included: no slot decides between equal scores).
    let mut all = MemoryQuery::new("lantern 灯笼 river", vec![]);
    all.limit = 50;
    let page = |r: tavern_store::MemorySearchResult| {
        r.hits
            .iter()
            .map(|h| format!("{}/{}@{}", h.record.scope, h.record.id, h.score))
            .collect::<Vec<_>>()
    };
    let want = page(everything.search(&all).await.unwrap());
    assert_eq!(page(holder.search(&all).await.unwrap()), want);
    let both = holder.memory_rows_replayed().await;
    assert_eq!(
        both,
        everything.memory_rows_replayed().await,
        "every row read once"
    );
    // Dropped and needed again, a scope is read again; the one still held is not.
    touch(&holder, &scope(1)).await;
    assert_eq!(holder.memory_len().await, 2500);
    assert_eq!(page(holder.search(&all).await.unwrap()), want);
    assert_eq!(holder.memory_rows_replayed().await, both + one_scope);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_every_scope_cut_off_while_loading_leaves_the_store_exact() {
    let config = filled_database().await;
    let holder = Arc::new(open(&config, Some(0)).await);
    let other = open(&config, None).await;
    touch(&holder, &scope(0)).await;
    let (sc, id) = (scope(1), MemoryId::parse("m41").unwrap());
    let stale = other.inspect(&id, &sc).await.unwrap().unwrap().revision;

    // Another session locks the table against every read: the search's load of the scope it
    // does not hold waits at the server, and the call is abandoned there (a timeout).
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    let task = tokio::spawn(conn);
    client
        .batch_execute("BEGIN; LOCK TABLE memory_ops IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let search = {
        let holder = holder.clone();
        tokio::spawn(async move { holder.search(&MemoryQuery::new("lantern", vec![])).await })
    };
    until_waiting(&client).await;
    search.abort();
    assert!(search.await.unwrap_err().is_cancelled());
    client.batch_execute("COMMIT").await.unwrap();

    // Meanwhile another process changed the scope the abandoned call was loading.
    edit(&other, 41..42, "moved").await;
    // A write from the stale revision is refused, the current one wins, and the holder sees
    // exactly what a process reading every row sees.
    let err = holder
        .put(write("m41", sc.clone(), "stale"), Some(&stale), false)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    let current = other.inspect(&id, &sc).await.unwrap().unwrap().revision;
    holder
        .put(write("m41", sc.clone(), "fresh"), Some(&current), false)
        .await
        .unwrap();
    let want = seen(&open(&config, None).await).await;
    assert_eq!(seen(&*holder).await, want);
    let all = holder
        .search(&MemoryQuery::new("lantern", vec![]))
        .await
        .unwrap();
    let full = other
        .search(&MemoryQuery::new("lantern", vec![]))
        .await
        .unwrap();
    assert_eq!(all.source_count, full.source_count);
    drop(client);
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_row_is_reported_and_counted_once_however_often_its_scope_loads() {
    let config = pg_support::cluster().fresh_database().await;
    let holder = open(&config, Some(0)).await;
    for i in 0..2 {
        holder
            .put(write("gate", scope(i), "the gate"), None, false)
            .await
            .unwrap();
    }
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    let task = tokio::spawn(conn);
    client
        .batch_execute(&format!(
            "INSERT INTO memory_ops (scope, id, op) VALUES ('{}', 'x', '{{\"bogus\": 1}}')",
            scope(1)
        ))
        .await
        .unwrap();
    let unreadable = |s: &PgStore| {
        s.diagnostics()
            .iter()
            .filter(|d| d.message.contains("unreadable"))
            .count()
    };
    // Read with its scope, dropped with it, read again when the scope loads again.
    for _ in 0..3 {
        touch(&holder, &scope(0)).await;
        touch(&holder, &scope(1)).await;
    }
    assert_eq!(unreadable(&holder), 1);
    // Compaction holds every scope and refuses, naming one row, not one per load.
    let err = holder.compact().await.unwrap_err().to_string();
    assert!(err.contains("1 rows of memory_ops cannot be read"), "{err}");
    assert_eq!(unreadable(&holder), 1);
    drop(client);
    let _ = task.await;
}
