//! Nothing another host or the network does stalls a `PgStore` beyond its limits (issue 30,
//! F1–F3, F13), on the throwaway cluster, with a fault proxy in front of it where a connection
//! must freeze: another session holding a table lock; this store's own connection cut off
//! mid-write, and between a lock and a commit; every existing connection black-holed. Each scenario's
//! calls are bounded by an outer liveness bound far above the limits under test, so a
//! regression fails the test instead of hanging it.

#[path = "support/pg.rs"]
mod pg_support;
#[path = "support/proxy.rs"]
mod proxy;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tavern_core::{AgentId, MemorySource, ScopeKey, VariableName};
use tavern_store::clock::{Clock, ManualClock};
use tavern_store::conformance::{write, T0};
use tavern_store::pg::{PgConfig, PgLimits, PgStore, PgTls};
use tavern_store::{MemoryStore, StoreError, VariableStore};

fn agent(id: &str) -> ScopeKey {
    ScopeKey::Agent {
        agent: AgentId::parse(id).unwrap(),
    }
}

fn var(n: &str) -> VariableName {
    VariableName::parse(n).unwrap()
}

/// Far above every limit used here: reaching it means a call was not bounded at all.
const LIVENESS: Duration = Duration::from_secs(60);

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIVENESS, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not return within {LIVENESS:?}: unbounded"))
}

async fn open(config: &PgConfig, limits: PgLimits) -> PgStore {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    PgStore::open_with_limits(config.clone(), &PgTls::default(), clock, 2, limits)
        .await
        .unwrap()
}

/// The settings of `config`'s database, reached through `proxy`.
fn through(proxy: &proxy::Proxy, config: &PgConfig) -> PgConfig {
    let mut c = PgConfig::new();
    c.host_path(proxy.host_dir())
        .port(pg_support::cluster().port())
        .user("postgres")
        .dbname(config.get_dbname().unwrap());
    c
}

/// A plain connection of the test's own (another host, or psql).
async fn session(config: &PgConfig) -> tavern_store::pg::PgClient {
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// `store.set(scope, name, value)` in a task of its own (a write that will be held up).
fn spawn_set(
    store: &PgStore,
    scope: &ScopeKey,
    name: &str,
    value: serde_json::Value,
) -> tokio::task::JoinHandle<Result<tavern_core::VariableRecord, StoreError>> {
    let (store, scope, name) = (store.clone(), scope.clone(), var(name));
    tokio::spawn(async move {
        store
            .set(&scope, &name, value, None, MemorySource::system())
            .await
    })
}

fn lock_error(e: &StoreError) -> bool {
    e.to_string().contains("lock timeout")
}

/// F2 and F13: a table lock held by another session fails this store's writes to that table
/// within its `lock_timeout` — the first write on a fresh connection too, whose statements are
/// prepared under the lock — while reads, writes to other tables and a turn's end with nothing
/// to clear go on; once the lock is gone, writes succeed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_elsewhere_bounds_writes_and_stops_nothing_else() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let seed = open(&config, PgLimits::default()).await;
    let scope = agent("a1");
    seed.set(&scope, &var("hp"), json!(1), None, MemorySource::system())
        .await
        .unwrap();
    let limits = PgLimits {
        lock_timeout: Duration::from_millis(300),
        ..PgLimits::default()
    };
    let store = open(&config, limits).await;

    let holder = session(&config).await;
    holder
        .batch_execute("BEGIN; LOCK TABLE variable_ops IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let refused = bounded(
        "a write behind a held lock",
        store.set(&scope, &var("mp"), json!(2), None, MemorySource::system()),
    )
    .await
    .expect_err("the table is locked");
    assert!(lock_error(&refused), "{refused}");
    // Reads are not behind the lock.
    let hp = bounded("a read", store.get(&scope, &var("hp")))
        .await
        .unwrap();
    assert_eq!(hp.map(|r| r.value), Some(json!(1)));
    // A turn's end with no turn variables takes no lock.
    let turn = ScopeKey::Turn {
        agent: AgentId::parse("a1").unwrap(),
    };
    let cleared = bounded(
        "clearing an empty turn",
        store.clear_scope(&turn, MemorySource::system()),
    )
    .await
    .unwrap();
    assert_eq!(cleared, 0);
    // Another table's writes go on.
    bounded(
        "a memory write",
        store.put(write("m1", scope.clone(), "the gate"), None, false),
    )
    .await
    .unwrap();
    holder.batch_execute("COMMIT").await.unwrap();
    bounded(
        "a write after the lock",
        store.set(&scope, &var("mp"), json!(2), None, MemorySource::system()),
    )
    .await
    .unwrap();
}

/// F1: while this store's write waits for a lock another session holds, this store's reads of
/// the same table are answered — the write holds the table's in-process mirror only to decide
/// and to apply, never while the server waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_not_queued_behind_a_write_waiting_for_a_lock() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let store = open(
        &config,
        PgLimits {
            lock_timeout: Duration::from_secs(50),
            ..PgLimits::default()
        },
    )
    .await;
    let scope = agent("a1");
    store
        .set(&scope, &var("hp"), json!(1), None, MemorySource::system())
        .await
        .unwrap();
    let holder = session(&config).await;
    holder
        .batch_execute("BEGIN; LOCK TABLE variable_ops IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let waiting = spawn_set(&store, &scope, "mp", json!(2));
    // Until the server shows the write waiting for the lock.
    let watcher = session(&config).await;
    let waits = "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE variable_ops%'";
    bounded("the write to wait for the lock", async {
        while watcher
            .query_one(waits, &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let hp = bounded(
        "a read beside the waiting write",
        store.get(&scope, &var("hp")),
    )
    .await
    .unwrap();
    assert_eq!(hp.map(|r| r.value), Some(json!(1)));
    let still: i64 = watcher.query_one(waits, &[]).await.unwrap().get(0);
    assert_eq!(
        still, 1,
        "the read was answered while the write still waited"
    );
    assert!(!waiting.is_finished());
    holder.batch_execute("COMMIT").await.unwrap();
    bounded("the write once the lock is gone", waiting)
        .await
        .unwrap()
        .unwrap();
    let mp = store.get(&scope, &var("mp")).await.unwrap();
    assert_eq!(mp.map(|r| r.value), Some(json!(2)));
}

/// F1: this store's connection is cut off just after the message with its `LOCK TABLE`
/// reached the server. That message is the whole write (lock, conditional insert, commit), so
/// the server runs it to the end without waiting for this process: another host's write gets
/// the lock at once (within a `lock_timeout` far below the cut-off session's
/// `idle_in_transaction`), and the cut-off call fails within `call_timeout` while its write is
/// either wholly there or not at all. (Before, `BEGIN; LOCK` was a message of its own and the
/// session sat on the lock until the server gave up on it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_mid_write_holds_no_lock() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let proxy = proxy::Proxy::start(cluster.socket_dir(), cluster.port()).await;
    let cut = open(
        &through(&proxy, &config),
        PgLimits {
            idle_in_transaction: Duration::from_secs(600),
            call_timeout: Duration::from_secs(3),
            ..PgLimits::default()
        },
    )
    .await;
    let other = open(
        &config,
        PgLimits {
            lock_timeout: Duration::from_secs(2),
            ..PgLimits::default()
        },
    )
    .await;
    let scope = agent("a1");

    proxy.freeze_after_lock();
    let cut_write = spawn_set(&cut, &scope, "sent", json!(1));
    bounded("the freeze", proxy.frozen_on_trap()).await;
    bounded(
        "the other host's write",
        other.set(&scope, &var("kept"), json!(2), None, MemorySource::system()),
    )
    .await
    .expect("no lock is left behind by a host cut off mid-write");
    let failed = bounded("the cut-off call", cut_write).await.unwrap();
    let e = failed.expect_err("its answer never came back");
    assert!(e.to_string().contains("did not answer"), "{e}");
    proxy.disarm();
    // The store recovers on a new connection, and both stores see one table.
    let kept = bounded("a read after the cut", cut.get(&scope, &var("kept")))
        .await
        .unwrap();
    assert_eq!(kept.map(|r| r.value), Some(json!(2)));
    let sent = cut.get(&scope, &var("sent")).await.unwrap();
    assert_eq!(sent, other.get(&scope, &var("sent")).await.unwrap());
    if let Some(r) = sent {
        assert_eq!(r.value, json!(1));
    }
}

/// F1, the last resort: a write that keeps losing races decides under the table lock held
/// across round trips (here at once: `unlocked_attempts: 0`, and another host wrote since this
/// store last looked). Cut off between that `LOCK TABLE` and its `COMMIT`, the session is ended
/// by the server after `idle_in_transaction` (its lock with it), so another host's write that
/// waits for the lock succeeds; the cut-off call fails within `call_timeout`, nothing it wrote
/// is committed, and the store works again on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_between_lock_and_commit_holds_nobody_for_long() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let proxy = proxy::Proxy::start(cluster.socket_dir(), cluster.port()).await;
    let cut = open(
        &through(&proxy, &config),
        PgLimits {
            idle_in_transaction: Duration::from_secs(1),
            call_timeout: Duration::from_secs(3),
            unlocked_attempts: 0,
            ..PgLimits::default()
        },
    )
    .await;
    // The other host waits longer for the lock than the cut-off session may sit on it.
    let other = open(
        &config,
        PgLimits {
            lock_timeout: Duration::from_secs(20),
            ..PgLimits::default()
        },
    )
    .await;
    let scope = agent("a1");
    // The cut-off store's first try finds the table moved on: it takes the locked path.
    other
        .set(
            &scope,
            &var("first"),
            json!(0),
            None,
            MemorySource::system(),
        )
        .await
        .unwrap();

    proxy.freeze_before_commit();
    let cut_write = spawn_set(&cut, &scope, "lost", json!(1));
    bounded("the freeze", proxy.frozen_on_trap()).await;
    // The cut-off session holds the table lock now (as the server sees it) ...
    let watcher = session(&config).await;
    let held = "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                WHERE c.relname = 'variable_ops' AND l.mode = 'ExclusiveLock' AND l.granted";
    let n: i64 = watcher.query_one(held, &[]).await.unwrap().get(0);
    assert_eq!(n, 1, "the cut-off session holds the lock");
    // ... and this write waits for it, then succeeds once the server ends that session.
    bounded(
        "the other host's write",
        other.set(&scope, &var("kept"), json!(2), None, MemorySource::system()),
    )
    .await
    .unwrap();
    let n: i64 = watcher.query_one(held, &[]).await.unwrap().get(0);
    assert_eq!(n, 0, "nobody holds the lock any more");
    let failed = bounded("the cut-off call", cut_write).await.unwrap();
    let e = failed.expect_err("its commit never reached the server");
    assert!(e.to_string().contains("did not answer"), "{e}");
    // Nothing of the cut-off write was committed; the other host's write is there.
    assert!(other.get(&scope, &var("lost")).await.unwrap().is_none());
    // The cut-off store recovers on a new connection (the proxy forwards new ones; its
    // commit trap stays armed, so a read is what proves it).
    let kept = bounded("a read after the cut", cut.get(&scope, &var("kept")))
        .await
        .unwrap();
    assert_eq!(kept.map(|r| r.value), Some(json!(2)));
}

/// F3: every existing connection is black-holed (a frozen server or a half-open network, as
/// the client sees it). A call on one fails within `call_timeout` instead of hanging, and the
/// next call works on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_connections_are_given_up_and_replaced() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let proxy = proxy::Proxy::start(cluster.socket_dir(), cluster.port()).await;
    let via_proxy = through(&proxy, &config);
    let store = open(
        &via_proxy,
        PgLimits {
            call_timeout: Duration::from_secs(2),
            ..PgLimits::default()
        },
    )
    .await;
    let scope = agent("a1");
    store
        .set(&scope, &var("hp"), json!(5), None, MemorySource::system())
        .await
        .unwrap();
    proxy.freeze_all();
    let e = bounded(
        "a call on a black-holed connection",
        store.get(&scope, &var("hp")),
    )
    .await
    .expect_err("no answer can come");
    assert!(e.to_string().contains("did not answer"), "{e}");
    let hp = bounded("the next call", store.get(&scope, &var("hp")))
        .await
        .unwrap();
    assert_eq!(hp.map(|r| r.value), Some(json!(5)));
    // A write works too, on the new connection.
    bounded(
        "a write after recovery",
        store.set(&scope, &var("mp"), json!(1), None, MemorySource::system()),
    )
    .await
    .unwrap();
}

/// A store opened without reading its memories (as `tavern-bridge` opens one) whose
/// background load meets a black-holed connection: the load fails within `call_timeout`
/// instead of holding every memory call up for good, and the next memory call reads them on
/// a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_memory_load_on_a_black_holed_connection_gives_up_and_the_next_call_loads() {
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let writer = open(&config, PgLimits::default()).await;
    for i in 0..3 {
        let w = write(&format!("m{i}"), agent("a1"), &format!("lantern {i}"));
        writer.put(w, None, false).await.unwrap();
    }
    let proxy = proxy::Proxy::start(cluster.socket_dir(), cluster.port()).await;
    let mut options = tavern_store::pg::PgOptions::default().with_deferred_memory_load();
    options.pool_size = 1;
    options.limits.call_timeout = Duration::from_secs(2);
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let store =
        PgStore::open_with_options(through(&proxy, &config), &PgTls::default(), clock, options)
            .await
            .unwrap();
    assert!(!store.memories_loaded());
    // The pool's one connection (opened for the migration) goes dark.
    proxy.freeze_all();
    let e = bounded("a load on a black-holed connection", store.load_memories())
        .await
        .expect_err("no answer can come");
    assert!(e.to_string().contains("did not answer"), "{e}");
    let found = bounded(
        "a search after the load gave up",
        store.search(&tavern_store::MemoryQuery::new(
            "lantern",
            vec![agent("a1")],
        )),
    )
    .await
    .unwrap();
    assert_eq!(found.hits.len(), 3);
    assert!(store.memories_loaded());
}
