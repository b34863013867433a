//! The conformance suite against every adapter, directly and behind `Arc`/`Box`.

use std::sync::Arc;

use tavern_store::clock::ManualClock;
use tavern_store::conformance::{Fixture, T0};
use tavern_store::fs::{FsOptions, FsStore};
use tavern_store::mem::MemStore;
use tavern_store::AllStores;

fn mem() -> Fixture {
    let clock = Arc::new(ManualClock::new(T0));
    Fixture {
        store: Arc::new(MemStore::new(clock.clone())),
        clock,
        reopen: None,
        guard: None,
    }
}

fn boxed_mem() -> Fixture {
    let clock = Arc::new(ManualClock::new(T0));
    let boxed: Box<dyn AllStores> = Box::new(MemStore::new(clock.clone()));
    Fixture {
        store: Arc::new(boxed),
        clock,
        reopen: None,
        guard: None,
    }
}

fn fs() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let root = dir.path().to_path_buf();
    let store = Arc::new(FsStore::open(&root, clock.clone()).unwrap());
    let reopen_clock = clock.clone();
    Fixture {
        store: Arc::new(store),
        clock,
        reopen: Some(Box::new(move || {
            Arc::new(FsStore::open(&root, reopen_clock.clone()).unwrap()) as Arc<dyn AllStores>
        })),
        guard: Some(Box::new(dir)),
    }
}

/// Chats in a separate (SillyTavern) folder; reopening names no folder, so it must come from
/// the store's record.
fn fs_chat_folder() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let root = dir.path().join("store");
    let st = dir.path().join("SillyTavern/data/default-user");
    std::fs::create_dir_all(&st).unwrap();
    let options = FsOptions::default().with_chat_folder(&st);
    let store = Arc::new(FsStore::open_with(&root, clock.clone(), options).unwrap());
    let reopen_clock = clock.clone();
    Fixture {
        store: Arc::new(store),
        clock,
        reopen: Some(Box::new(move || {
            let store = FsStore::open(&root, reopen_clock.clone()).unwrap();
            assert!(
                !root.join("chats").read_dir().unwrap().any(|_| true),
                "no chat is kept under the store's root"
            );
            Arc::new(store) as Arc<dyn AllStores>
        })),
        guard: Some(Box::new(dir)),
    }
}

/// Opened (and reopened) without reading the memory log: the first memory call reads it.
fn fs_deferred() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let root = dir.path().to_path_buf();
    let open = move |clock: Arc<ManualClock>| {
        let options = FsOptions::default().with_deferred_memory_load();
        FsStore::open_with(&root, clock, options).unwrap()
    };
    let store = Arc::new(open(clock.clone()));
    let reopen_clock = clock.clone();
    Fixture {
        store: Arc::new(store),
        clock,
        reopen: Some(Box::new(move || {
            Arc::new(open(reopen_clock.clone())) as Arc<dyn AllStores>
        })),
        guard: Some(Box::new(dir)),
    }
}

mod mem_store {
    tavern_store::store_conformance_tests!(super::mem());
}

mod boxed_mem_store {
    tavern_store::store_conformance_tests!(super::boxed_mem());
}

mod fs_store {
    tavern_store::store_conformance_tests!(super::fs());
}

mod fs_store_deferred_memory_load {
    tavern_store::store_conformance_tests!(super::fs_deferred());
}

mod fs_store_chats_in_a_sillytavern_folder {
    tavern_store::store_conformance_tests!(super::fs_chat_folder());
}

#[cfg(feature = "postgres")]
#[path = "support/pg.rs"]
mod pg_support;

/// A fresh database on the test process's PostgreSQL cluster; reopening connects a new store
/// (its own pool) to the same database, opened with the same `options`.
#[cfg(feature = "postgres")]
async fn pg_with(options: tavern_store::pg::PgOptions) -> Fixture {
    use tavern_store::pg::{PgConfig, PgStore, PgTls};
    let cluster = pg_support::cluster();
    let config = cluster.fresh_database().await;
    let clock = Arc::new(ManualClock::new(T0));
    let open = move |config: PgConfig, clock: Arc<ManualClock>| {
        let options = options.clone();
        async move {
            PgStore::open_with_options(config, &PgTls::default(), clock, options)
                .await
                .unwrap()
        }
    };
    let store = open(config.clone(), clock.clone()).await;
    let reopen_clock = clock.clone();
    Fixture {
        store: Arc::new(store),
        clock,
        reopen: Some(Box::new(move || {
            let (config, clock) = (config.clone(), reopen_clock.clone());
            // The suite reopens from synchronous code on a multi-thread runtime.
            let store = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(open(config, clock))
            });
            Arc::new(store) as Arc<dyn AllStores>
        })),
        guard: None,
    }
}

#[cfg(feature = "postgres")]
async fn pg() -> Fixture {
    pg_with(tavern_store::pg::PgOptions::default()).await
}

#[cfg(feature = "postgres")]
mod pg_store {
    tavern_store::store_conformance_tests!(super::pg().await);
}

/// Stores that hold the memories by scope with a bound of none: every call loads the scopes
/// it needs and drops every other one (each reopen too).
#[cfg(feature = "postgres")]
async fn pg_by_scope() -> Fixture {
    pg_with(tavern_store::pg::PgOptions::default().with_max_loaded_memories(0)).await
}

#[cfg(feature = "postgres")]
mod pg_store_holding_memories_by_scope {
    tavern_store::store_conformance_tests!(super::pg_by_scope().await);
}
