//! TLS to PostgreSQL (`sslmode=require`) against the test cluster's loopback listener, whose
//! certificate a throwaway CA signed: trusted with that CA the connections are encrypted (the
//! server says so in `pg_stat_ssl`); without it the certificate is refused with a clear error;
//! other settings connect without TLS.

#[path = "support/pg.rs"]
mod pg_support;

use std::sync::Arc;

use tavern_core::{AgentId, ScopeKey};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::{write, T0};
use tavern_store::pg::{PgConfig, PgStore, PgTls};
use tavern_store::{MemoryQuery, MemoryStore, StoreError};

/// How many of `dbname`'s sessions the server encrypts, and how many it has.
async fn sessions(cluster: &pg_support::Cluster, dbname: &str) -> (i64, i64) {
    let (client, conn) = cluster
        .config("postgres")
        .connect(tavern_store::pg::NoTls)
        .await
        .unwrap();
    let task = tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_ssl s
             JOIN pg_stat_activity a USING (pid) WHERE a.datname = $1",
            &[&dbname],
        )
        .await
        .unwrap();
    drop(client);
    let _ = task.await;
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_encrypts_with_the_deployments_ca_and_refuses_an_unknown_certificate() {
    let cluster = pg_support::cluster();
    let db = cluster.fresh_database().await;
    let name = db.get_dbname().unwrap().to_owned();
    let clock = Arc::new(ManualClock::new(T0));
    let pem = std::fs::read(cluster.ca_file()).unwrap();
    let tls = PgTls::default().with_ca_pem(&pem).unwrap();

    let config: PgConfig = cluster.tcp_settings(&name, "require").parse().unwrap();
    let store = PgStore::open_with_tls(config.clone(), &tls, clock.clone(), 2)
        .await
        .unwrap();
    let scope = ScopeKey::Agent {
        agent: AgentId::parse("a1").unwrap(),
    };
    store
        .put(write("m", scope.clone(), "sent over tls"), None, false)
        .await
        .unwrap();
    let hits = store
        .search(&MemoryQuery::new("tls", vec![scope]))
        .await
        .unwrap()
        .hits;
    assert_eq!(hits.len(), 1);
    let (encrypted, all) = sessions(cluster, &name).await;
    assert!(
        all >= 1 && encrypted == all,
        "{encrypted} of {all} sessions encrypted"
    );
    drop(store);

    // The Mozilla roots alone do not know the test CA: refused, and the error says why
    // without repeating the settings.
    let err = PgStore::open(config, clock.clone(), 2).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::Database { .. }), "{err:?}");
    assert!(
        text.contains("certificate") || text.contains("issuer"),
        "{text}"
    );
    assert!(!text.contains("127.0.0.1 port"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_settings_connect_without_tls() {
    let cluster = pg_support::cluster();
    let db = cluster.fresh_database().await;
    let name = db.get_dbname().unwrap().to_owned();
    let clock = Arc::new(ManualClock::new(T0));
    let config: PgConfig = cluster.tcp_settings(&name, "disable").parse().unwrap();
    let store = PgStore::open(config, clock, 2).await.unwrap();
    store.diagnostics();
    let (encrypted, all) = sessions(cluster, &name).await;
    assert!(
        all >= 1 && encrypted == 0,
        "{encrypted} of {all} sessions encrypted"
    );
    drop(store);
}

#[test]
fn a_ca_file_without_a_certificate_is_refused() {
    for pem in [&b"not a certificate"[..], b""] {
        let err = PgTls::default().with_ca_pem(pem).unwrap_err();
        assert!(err.to_string().contains("no certificate"), "{err}");
    }
}
