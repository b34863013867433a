//! Crash safety and multi-process safety of the file store, with real processes: a writer
//! killed mid-loop loses no acknowledged write and leaves every file readable; two processes
//! incrementing the same variable lose no update.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use tavern_core::{AgentId, MemoryId, ScopeKey, VariableName};
use tavern_store::fs::FsStore;
use tavern_store::{MemoryStore, SystemClock, VariableStore};

const WRITER: &str = env!("CARGO_BIN_EXE_tavern-store-writer");

fn writer(root: &std::path::Path, mode: &str, name: &str, count: u64) -> std::process::Child {
    Command::new(WRITER)
        .arg(root)
        .args([mode, name, &count.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the writer binary")
}

#[tokio::test]
async fn killed_writer_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let agent = ScopeKey::Agent {
        agent: AgentId::parse("writer").unwrap(),
    };
    let mut acknowledged: Vec<String> = Vec::new();
    // Kill after a different number of acks each round, so the kill lands at varied points.
    for (round, kill_after) in [1u64, 7, 23, 50, 3].into_iter().enumerate() {
        let prefix = format!("r{round}");
        let mut child = writer(dir.path(), "put", &prefix, 100_000);
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        for _ in 0..kill_after {
            let line = lines.next().expect("writer stopped early").unwrap();
            let i: u64 = line.strip_prefix("ack ").unwrap().parse().unwrap();
            acknowledged.push(format!("{prefix}-{i}"));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // Acks printed before the kill landed are acknowledged too.
        for line in lines.map_while(Result::ok) {
            let i: u64 = line.strip_prefix("ack ").unwrap().parse().unwrap();
            acknowledged.push(format!("{prefix}-{i}"));
        }

        let store = FsStore::open(dir.path(), Arc::new(SystemClock)).unwrap();
        for id in &acknowledged {
            let id = MemoryId::parse(id.as_str()).unwrap();
            assert!(
                store.read(&id, &agent).await.unwrap().is_some(),
                "lost acknowledged {id}"
            );
        }
        // At most the one torn last line of a killed writer may be reported, by relative name.
        for d in store.diagnostics() {
            assert!(d.file.starts_with("memory.log line "), "{d:?}");
            assert!(!d.file.contains(dir.path().to_str().unwrap()));
        }
        assert!(store.diagnostics().len() <= round + 1);
    }
    // Every remaining line parses: a fresh writer appends cleanly after the torn tails.
    let mut child = writer(dir.path(), "put", "final", 3);
    assert!(child.wait().unwrap().success());
    let store = FsStore::open(dir.path(), Arc::new(SystemClock)).unwrap();
    assert!(store.memory_len() >= acknowledged.len() + 3);
}

/// A store killed while it saves its memory image (the temporary file written, synced,
/// renamed: a kill can land at any step) loses nothing: the next open finds every
/// acknowledged memory, from a whole image or from the log, and answers searches exactly as a
/// store that reads the log alone.
#[tokio::test]
async fn a_store_killed_while_saving_its_image_loses_nothing() {
    use tavern_store::MemoryQuery;
    let dir = tempfile::tempdir().unwrap();
    let agent = ScopeKey::Agent {
        agent: AgentId::parse("writer").unwrap(),
    };
    let mut acknowledged: Vec<String> = Vec::new();
    // Killed in the first, second and fourth save of a round (the store grows meanwhile).
    for (round, kill_in) in [1usize, 2, 4].into_iter().enumerate() {
        let prefix = format!("i{round}");
        let mut child = writer(dir.path(), "image", &prefix, 50);
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acked = None;
        let mut saving = 0;
        let take = |line: &str, acked: &mut Option<u64>| {
            if let Some(n) = line.strip_prefix("ack ") {
                *acked = Some(n.parse::<u64>().unwrap());
            }
        };
        while saving < kill_in {
            let line = lines.next().expect("writer stopped early").unwrap();
            take(&line, &mut acked);
            saving += usize::from(line == "saving");
        }
        // Right as it says it saves: the kill lands in the save (or just before, or after).
        child.kill().unwrap();
        child.wait().unwrap();
        for line in lines.map_while(Result::ok) {
            take(&line, &mut acked);
        }
        let last = acked.expect("an import was acknowledged");
        acknowledged.extend((0..=last).map(|i| format!("{prefix}-{i}")));

        let store = FsStore::open(dir.path(), Arc::new(SystemClock)).unwrap();
        for id in &acknowledged {
            let id = MemoryId::parse(id.as_str()).unwrap();
            assert!(
                store.read(&id, &agent).await.unwrap().is_some(),
                "round {round}: lost acknowledged {id}"
            );
        }
        for d in store.diagnostics() {
            assert!(
                d.file == "memory.image" || d.file.starts_with("memory.log line "),
                "{d:?}"
            );
            assert!(!d.message.contains(dir.path().to_str().unwrap()), "{d:?}");
        }
        // The same table as the log alone gives.
        let alone = tempfile::tempdir().unwrap();
        std::fs::copy(
            dir.path().join("memory.log"),
            alone.path().join("memory.log"),
        )
        .unwrap();
        let from_log = FsStore::open(alone.path(), Arc::new(SystemClock)).unwrap();
        assert_eq!(store.memory_len(), from_log.memory_len(), "round {round}");
        for text in ["record written", "记录 i0", "record 3999"] {
            let query = MemoryQuery {
                limit: 20,
                ..MemoryQuery::new(text, vec![agent.clone()])
            };
            let hits = |r: tavern_store::MemorySearchResult| {
                r.hits
                    .into_iter()
                    .map(|h| (h.record.id.to_string(), h.relevance.to_bits()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                hits(store.search(&query).await.unwrap()),
                hits(from_log.search(&query).await.unwrap()),
                "round {round}: {text}"
            );
        }
    }
}

#[tokio::test]
async fn two_processes_never_lose_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let per_process = 150;
    let mut a = writer(dir.path(), "incr", "counter", per_process);
    let mut b = writer(dir.path(), "incr", "counter", per_process);
    let count_acks = |child: &mut std::process::Child| {
        BufReader::new(child.stdout.take().unwrap()).lines().count() as u64
    };
    let acks = count_acks(&mut a) + count_acks(&mut b);
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    assert_eq!(acks, 2 * per_process);
    let store = FsStore::open(dir.path(), Arc::new(SystemClock)).unwrap();
    let v = store
        .get(&ScopeKey::Global, &VariableName::parse("counter").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.value, serde_json::json!(2 * per_process));
}

/// A write whose fsync fails is not acknowledged, so it must never appear: not in this
/// process's next read, not after another write catches the log up, not after a reopen.
#[tokio::test]
async fn a_failed_fsync_changes_nothing() {
    use serde_json::json;
    use tavern_core::{MemoryKind, MemorySource, MemoryWrite};
    use tavern_store::{MemoryQuery, StoreError};

    let dir = tempfile::tempdir().unwrap();
    let agent = ScopeKey::Agent {
        agent: AgentId::parse("a").unwrap(),
    };
    let write = |id: &str| MemoryWrite {
        id: MemoryId::parse(id).unwrap(),
        scope: agent.clone(),
        kind: MemoryKind::Semantic,
        content: format!("fact {id} about the lighthouse"),
        tags: Vec::new(),
        importance: 0.5,
        confidence: 0.5,
        source: MemorySource::system(),
        expires_at: None,
    };
    let var = VariableName::parse("hp").unwrap();
    let store = FsStore::open(dir.path(), Arc::new(SystemClock)).unwrap();
    store.put(write("kept"), None, false).await.unwrap();

    store.fail_next_sync();
    let failed = store.put(write("lost"), None, false).await.unwrap_err();
    assert!(
        matches!(failed, StoreError::Io { op: "fsync", .. }),
        "{failed}"
    );
    store.fail_next_sync();
    let failed = store
        .set(
            &ScopeKey::Global,
            &var,
            json!(1),
            None,
            MemorySource::system(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(failed, StoreError::Io { op: "fsync", .. }),
        "{failed}"
    );

    // An import large enough to be tokenized while it is appended: nothing of it applied.
    store.fail_next_sync();
    let batch = |prefix: &str| -> Vec<MemoryWrite> {
        (0..600).map(|i| write(&format!("{prefix}{i}"))).collect()
    };
    let failed = store.import_memories(batch("lostbulk")).unwrap_err();
    assert!(
        matches!(failed, StoreError::Io { op: "fsync", .. }),
        "{failed}"
    );
    assert_eq!(store.memory_len(), 1, "the failed import left nothing");
    let search = |text: &str| MemoryQuery::new(text, vec![agent.clone()]);
    let hits = store
        .search(&search("lighthouse lostbulk5"))
        .await
        .unwrap()
        .hits;
    let ids: Vec<&str> = hits.iter().map(|h| h.record.id.as_str()).collect();
    assert_eq!(ids, ["kept"], "the failed import indexed nothing");

    // The next writes go through and catch the logs up: the failed ones stay absent.
    store.put(write("after"), None, false).await.unwrap();
    assert_eq!(store.import_memories(batch("bulk")).unwrap(), 600);
    for id in ["bulk0", "bulk599"] {
        let hits = store.search(&search(id)).await.unwrap().hits;
        assert_eq!(hits[0].record.id.as_str(), id, "the import was indexed");
    }
    let hp = store
        .set(
            &ScopeKey::Global,
            &var,
            json!(2),
            None,
            MemorySource::system(),
        )
        .await
        .unwrap();
    assert_eq!(hp.value, json!(2));
    let lost = MemoryId::parse("lost").unwrap();
    assert!(store.read(&lost, &agent).await.unwrap().is_none());

    let reopened = FsStore::open(dir.path(), Arc::new(SystemClock)).unwrap();
    assert!(reopened.read(&lost, &agent).await.unwrap().is_none());
    for id in ["kept", "after", "bulk0", "bulk599"] {
        let id = MemoryId::parse(id).unwrap();
        assert!(reopened.read(&id, &agent).await.unwrap().is_some(), "{id}");
    }
    assert_eq!(reopened.memory_len(), 602, "no line of the failed import");
    let hp = reopened
        .get(&ScopeKey::Global, &var)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(hp.value, json!(2));
    // The id of the failed write is free: writing it now creates it.
    reopened.put(write("lost"), None, false).await.unwrap();
    assert!(
        reopened.diagnostics().is_empty(),
        "{:?}",
        reopened.diagnostics()
    );
}
