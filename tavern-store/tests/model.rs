//! Model-based property tests: under random operations (and concurrent writers) every adapter
//! behaves like a plain `BTreeMap`, and the durable stores (files; PostgreSQL with the
//! `postgres` feature) still do after reopening.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::json;
use tavern_core::{AgentId, MemoryId, MemorySource, Revision, ScopeKey, VariableName};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::{write, T0};
use tavern_store::fs::FsStore;
use tavern_store::mem::MemStore;
use tavern_store::{AllStores, MemoryStore, StoreError, VariableStore};

#[derive(Debug, Clone)]
enum Op {
    /// Set variable `key` to `value`, passing the current revision if `informed`, else none.
    Set {
        key: usize,
        value: i64,
        informed: bool,
    },
    /// Set with a revision seen earlier (possibly stale).
    SetStale {
        key: usize,
        value: i64,
        pick: usize,
    },
    Delete {
        key: usize,
    },
    /// Create or update memory `key`.
    Put {
        key: usize,
        text: usize,
        informed: bool,
    },
    Forget {
        key: usize,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6usize, -5..5i64, any::<bool>()).prop_map(|(key, value, informed)| Op::Set { key, value, informed }),
        2 => (0..6usize, -5..5i64, any::<usize>()).prop_map(|(key, value, pick)| Op::SetStale { key, value, pick }),
        2 => (0..6usize).prop_map(|key| Op::Delete { key }),
        3 => (0..6usize, 0..4usize, any::<bool>()).prop_map(|(key, text, informed)| Op::Put { key, text, informed }),
        1 => (0..6usize).prop_map(|key| Op::Forget { key }),
        1 => Just(Op::Reopen),
    ]
}

/// Two scopes, three names each: keys 0..6.
fn var_key(key: usize) -> (ScopeKey, VariableName) {
    let scope = if key < 3 {
        ScopeKey::Global
    } else {
        ScopeKey::Agent {
            agent: AgentId::parse("a").unwrap(),
        }
    };
    (
        scope,
        VariableName::parse(["hp", "好感度", "x.y"][key % 3]).unwrap(),
    )
}

fn mem_key(key: usize) -> (ScopeKey, MemoryId) {
    let (scope, _) = var_key(key);
    (scope, MemoryId::parse(format!("m{}", key % 3)).unwrap())
}

const TEXTS: [&str; 4] = ["silver gate", "银色大门", "river spirit", "lantern"];

#[derive(Default)]
struct Model {
    vars: BTreeMap<usize, (i64, Revision)>,
    /// (text index, revision, forgotten)
    mems: BTreeMap<usize, (usize, Revision, bool)>,
    seen: Vec<Revision>,
}

async fn check(store: &dyn AllStores, model: &Model) {
    for key in 0..6 {
        let (scope, name) = var_key(key);
        let got = store.get(&scope, &name).await.unwrap();
        match model.vars.get(&key) {
            None => assert_eq!(got, None, "variable {key}"),
            Some((v, rev)) => {
                let got = got.expect("variable present");
                assert_eq!((&got.value, &got.revision), (&json!(v), rev));
            }
        }
        let (scope, id) = mem_key(key);
        let got = store.read(&id, &scope).await.unwrap();
        match model.mems.get(&key) {
            Some((text, rev, false)) => {
                let got = got.expect("memory present");
                assert_eq!((got.content.as_str(), &got.revision), (TEXTS[*text], rev));
            }
            _ => assert_eq!(got, None, "memory {key}"),
        }
    }
}

async fn run(ops: Vec<Op>, mut open: impl FnMut() -> Arc<dyn AllStores>) {
    let mut store = open();
    let mut m = Model::default();
    let src = MemorySource::system;
    for op in ops {
        match op {
            Op::Set {
                key,
                value,
                informed,
            } => {
                let (scope, name) = var_key(key);
                let current = m.vars.get(&key).map(|(_, r)| r.clone());
                let expected = if informed { current.clone() } else { None };
                let res = store
                    .set(&scope, &name, json!(value), expected.as_ref(), src())
                    .await;
                if expected == current {
                    let rec = res.unwrap();
                    m.seen.push(rec.revision.clone());
                    m.vars.insert(key, (value, rec.revision));
                } else {
                    assert_eq!(res.unwrap_err().conflict_revision(), current.as_ref());
                }
            }
            Op::SetStale { key, value, pick } => {
                if m.seen.is_empty() {
                    continue;
                }
                let stale = m.seen[pick % m.seen.len()].clone();
                let (scope, name) = var_key(key);
                let current = m.vars.get(&key).map(|(_, r)| r.clone());
                let res = store
                    .set(&scope, &name, json!(value), Some(&stale), src())
                    .await;
                if current.as_ref() == Some(&stale) {
                    let rec = res.unwrap();
                    m.seen.push(rec.revision.clone());
                    m.vars.insert(key, (value, rec.revision));
                } else {
                    assert!(matches!(res, Err(StoreError::Conflict { .. })));
                }
            }
            Op::Delete { key } => {
                let (scope, name) = var_key(key);
                match m.vars.remove(&key) {
                    Some((_, rev)) => store.delete(&scope, &name, &rev, src()).await.unwrap(),
                    None => {
                        let any = Revision::compute("x", None, &json!(key));
                        assert!(matches!(
                            store.delete(&scope, &name, &any, src()).await,
                            Err(StoreError::NotFound { .. })
                        ));
                    }
                }
            }
            Op::Put {
                key,
                text,
                informed,
            } => {
                let (scope, id) = mem_key(key);
                let current = m.mems.get(&key).cloned();
                let expected = if informed {
                    current.as_ref().map(|c| c.1.clone())
                } else {
                    None
                };
                let res = store
                    .put(
                        write(id.as_str(), scope, TEXTS[text]),
                        expected.as_ref(),
                        true,
                    )
                    .await;
                if expected == current.as_ref().map(|c| c.1.clone()) {
                    let rec = res.unwrap();
                    m.mems.insert(key, (text, rec.revision, false));
                } else {
                    assert!(matches!(res, Err(StoreError::Conflict { .. })));
                }
            }
            Op::Forget { key } => {
                let (scope, id) = mem_key(key);
                match m.mems.get(&key).cloned() {
                    Some((text, rev, false)) => {
                        let rec = store.forget(&id, &scope, &rev, src()).await.unwrap();
                        m.mems.insert(key, (text, rec.revision, true));
                    }
                    other => {
                        let rev =
                            other.map_or_else(|| Revision::compute("x", None, &json!(0)), |o| o.1);
                        assert!(matches!(
                            store.forget(&id, &scope, &rev, src()).await,
                            Err(StoreError::NotFound { .. })
                        ));
                    }
                }
            }
            Op::Reopen => store = open(),
        }
        check(&*store, &m).await;
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn mem_store_behaves_like_a_map(ops in prop::collection::vec(op(), 1..40)) {
        let store: Arc<dyn AllStores> = Arc::new(MemStore::new(Arc::new(ManualClock::new(T0))));
        block_on(run(ops, || store.clone()));
    }

    #[test]
    fn fs_store_behaves_like_a_map_across_reopens(ops in prop::collection::vec(op(), 1..30)) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        block_on(run(ops, || {
            Arc::new(FsStore::open(&root, Arc::new(ManualClock::new(T0))).unwrap()) as Arc<dyn AllStores>
        }));
    }

    /// Concurrent writers each apply random increments with CAS retries: the final values equal
    /// the sums (no update lost), on both adapters.
    #[test]
    fn concurrent_writers_lose_nothing(
        plan in prop::collection::vec(prop::collection::vec((0..3usize, 1..4i64), 1..8), 2..5),
        on_disk in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn AllStores> = if on_disk {
            Arc::new(FsStore::open(dir.path(), Arc::new(ManualClock::new(T0))).unwrap())
        } else {
            Arc::new(MemStore::new(Arc::new(ManualClock::new(T0))))
        };
        let mut expected = BTreeMap::new();
        for writer in &plan {
            for (key, n) in writer {
                *expected.entry(*key).or_insert(0i64) += n;
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).build().unwrap();
        rt.block_on(async {
            let tasks: Vec<_> = plan.into_iter().map(|writer| {
                let s = store.clone();
                tokio::spawn(async move {
                    for (key, n) in writer {
                        let (scope, name) = var_key(key);
                        loop {
                            let cur = s.get(&scope, &name).await.unwrap();
                            let v = cur.as_ref().map_or(0, |r| r.value.as_i64().unwrap());
                            match s.set(&scope, &name, json!(v + n), cur.as_ref().map(|r| &r.revision), MemorySource::system()).await {
                                Ok(_) => break,
                                Err(StoreError::Conflict { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                })
            }).collect();
            for t in tasks { t.await.unwrap(); }
            for (key, sum) in expected {
                let (scope, name) = var_key(key);
                assert_eq!(s_value(&*store, &scope, &name).await, sum);
            }
        });
    }
}

async fn s_value(store: &dyn AllStores, scope: &ScopeKey, name: &VariableName) -> i64 {
    store
        .get(scope, name)
        .await
        .unwrap()
        .unwrap()
        .value
        .as_i64()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Ranking with a small limit (which prunes candidates before blending) returns exactly the
    /// head of the unpruned ranking.
    #[test]
    fn a_small_limit_returns_the_head_of_the_full_ranking(
        records in prop::collection::vec((0..4usize, 0..4usize, 0.0..=1.0f64, 0.0..=1.0f64, 0..100_000_000i64), 1..60),
        limit in 1..12usize,
    ) {
        let clock = Arc::new(ManualClock::new(T0));
        let store = MemStore::new(clock.clone());
        let words = ["gate", "silver gate", "river gate gate", "lantern gate 门"];
        let scope = ScopeKey::Global;
        block_on(async {
            for (i, (w, extra, importance, confidence, age)) in records.iter().enumerate() {
                clock.set(tavern_core::Timestamp(T0.0 - age));
                let mut wr = write(&format!("r{i}"), scope.clone(), &format!("{} {}", words[*w], "x ".repeat(*extra)));
                wr.importance = *importance;
                wr.confidence = *confidence;
                store.put(wr, None, false).await.unwrap();
            }
            clock.set(T0);
            let mut q = tavern_store::MemoryQuery::new("gate 门", vec![scope.clone()]);
            q.limit = 100;
            let full = store.search(&q).await.unwrap();
            q.limit = limit;
            let head = store.search(&q).await.unwrap();
            assert_eq!(head.source_count, full.source_count);
            let ids = |r: &tavern_store::MemorySearchResult| r.hits.iter().map(|h| h.record.id.to_string()).collect::<Vec<_>>();
            let want: Vec<String> = ids(&full).into_iter().take(limit).collect();
            assert_eq!(ids(&head), want);
        });
    }
}

#[cfg(feature = "postgres")]
#[path = "support/pg.rs"]
mod pg_support;

#[cfg(feature = "postgres")]
proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The PostgreSQL store behaves like a map too; a reopen is a new store (its own pool and
    /// in-process tables) on the same database, as another process would be.
    #[test]
    fn pg_store_behaves_like_a_map_across_reopens(ops in prop::collection::vec(op(), 1..30)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let cluster = pg_support::cluster();
            let config = cluster.fresh_database().await;
            // On a worker thread, so opening from the synchronous `open` can block in place.
            tokio::spawn(run(ops, move || {
                let config = config.clone();
                let store = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(
                        cluster.open(&config, Arc::new(ManualClock::new(T0))),
                    )
                });
                Arc::new(store) as Arc<dyn AllStores>
            }))
            .await
            .unwrap();
        });
    }

    /// So do stores that hold memories by scope (`max_loaded_memories`, here 0–2 records:
    /// nearly every call loads a scope and drops the other), reopened in turn with stores that
    /// hold every memory.
    #[test]
    fn pg_stores_holding_memories_by_scope_behave_like_a_map(
        ops in prop::collection::vec(op(), 1..30),
        bound in 0..3usize,
    ) {
        use tavern_store::pg::{PgOptions, PgStore, PgTls};
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let config = pg_support::cluster().fresh_database().await;
            let mut opened = 0usize;
            tokio::spawn(run(ops, move || {
                let mut options = PgOptions::default();
                options.max_loaded_memories = opened.is_multiple_of(2).then_some(bound);
                opened += 1;
                let config = config.clone();
                let store = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(PgStore::open_with_options(
                        config,
                        &PgTls::default(),
                        Arc::new(ManualClock::new(T0)),
                        options,
                    ))
                });
                Arc::new(store.unwrap()) as Arc<dyn AllStores>
            }))
            .await
            .unwrap();
        });
    }
}
