//! A file store opened with `defer_memory_load` answers everything but memories at once and
//! reads `memory.log` at the first memory call (or `load_memories`) exactly as an eager open
//! would have: the same records, revisions and diagnostics, the same set-aside and compaction.

use std::io::Write;
use std::sync::Arc;

use tavern_core::{AgentId, MemoryId, MemorySource, ScopeKey, VariableName};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::{write, T0};
use tavern_store::fs::{FsOptions, FsStore};
use tavern_store::{MemoryQuery, MemoryStore, StoreError, VariableStore};

fn eager(dir: &tempfile::TempDir) -> FsStore {
    FsStore::open(dir.path(), Arc::new(ManualClock::new(T0))).unwrap()
}

fn deferred(dir: &tempfile::TempDir) -> FsStore {
    let options = FsOptions::default().with_deferred_memory_load();
    FsStore::open_with(dir.path(), Arc::new(ManualClock::new(T0)), options).unwrap()
}

fn agent() -> ScopeKey {
    ScopeKey::Agent {
        agent: AgentId::parse("a1").unwrap(),
    }
}

fn lines(dir: &tempfile::TempDir, file: &str) -> usize {
    std::fs::read_to_string(dir.path().join(file))
        .unwrap()
        .lines()
        .count()
}

async fn found(s: &FsStore, text: &str) -> Vec<String> {
    s.search(&MemoryQuery::new(text, vec![agent()]))
        .await
        .unwrap()
        .hits
        .iter()
        .map(|h| h.record.id.to_string())
        .collect()
}

#[tokio::test]
async fn the_memory_log_is_read_at_the_first_memory_call_with_its_diagnostics() {
    let dir = tempfile::tempdir().unwrap();
    let s = eager(&dir);
    let kept = s
        .put(write("m1", agent(), "a lantern by the gate"), None, false)
        .await
        .unwrap();
    s.put(write("m2", agent(), "the river spirit"), None, false)
        .await
        .unwrap();
    let var = VariableName::parse("mood").unwrap();
    s.set(
        &agent(),
        &var,
        serde_json::json!("calm"),
        None,
        MemorySource::system(),
    )
    .await
    .unwrap();
    drop(s);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("memory.log"))
        .unwrap();
    f.write_all(b"hello from another program\n").unwrap();

    let s = deferred(&dir);
    assert!(!s.memories_loaded(), "opening read the memory log");
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    // Everything else is there at once.
    let mood = s.get(&agent(), &var).await.unwrap().unwrap();
    assert_eq!(mood.value, serde_json::json!("calm"));
    assert!(!s.memories_loaded(), "a variable call read the memory log");

    // The first memory call is a CAS write against the revision the log holds.
    let edited = s
        .put(
            write("m1", agent(), "a lantern by the old gate"),
            Some(&kept.revision),
            false,
        )
        .await
        .unwrap();
    assert!(s.memories_loaded());
    assert_eq!(edited.content, "a lantern by the old gate");
    let stale = s
        .put(write("m1", agent(), "again"), Some(&kept.revision), false)
        .await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    assert_eq!(found(&s, "river").await, ["m2"]);
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].file, "memory.log line 3");
}

#[tokio::test]
async fn load_memories_gives_what_an_eager_open_gives() {
    let dir = tempfile::tempdir().unwrap();
    let s = eager(&dir);
    for (id, text) in [
        ("m1", "lantern"),
        ("m2", "lantern and rope"),
        ("m3", "rope"),
    ] {
        s.put(write(id, agent(), text), None, false).await.unwrap();
    }
    let m3 = s
        .inspect(&MemoryId::parse("m3").unwrap(), &agent())
        .await
        .unwrap()
        .unwrap();
    s.forget(&m3.id, &agent(), &m3.revision, MemorySource::system())
        .await
        .unwrap();
    drop(s);
    let (a, b) = (eager(&dir), deferred(&dir));
    b.load_memories().unwrap();
    assert!(b.memories_loaded());
    b.load_memories().unwrap();
    for text in ["lantern", "rope", ""] {
        assert_eq!(found(&a, text).await, found(&b, text).await, "{text:?}");
    }
    assert_eq!(a.memory_len(), b.memory_len());
    assert_eq!(
        a.memory_audit(&agent(), None).await.unwrap(),
        b.memory_audit(&agent(), None).await.unwrap()
    );
}

#[tokio::test]
async fn writes_by_another_instance_before_the_load_are_seen() {
    let dir = tempfile::tempdir().unwrap();
    let a = deferred(&dir);
    let b = eager(&dir);
    b.put(write("m1", agent(), "written elsewhere"), None, false)
        .await
        .unwrap();
    assert_eq!(found(&a, "elsewhere").await, ["m1"]);
    // And the other way: the deferred instance's write reaches the eager one.
    a.put(write("m2", agent(), "written at the harbour"), None, false)
        .await
        .unwrap();
    assert_eq!(found(&b, "harbour").await, ["m2"]);
}

#[tokio::test]
async fn a_bloated_log_is_compacted_when_it_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = FsStore::open(dir.path(), clock.clone()).unwrap();
    let r = s
        .put(write("m", agent(), "read often"), None, false)
        .await
        .unwrap();
    for _ in 0..5000 {
        clock.advance(1);
        s.read(&r.id, &agent()).await.unwrap();
    }
    drop(s);
    assert_eq!(lines(&dir, "memory.log"), 5001);
    let s = deferred(&dir);
    assert_eq!(lines(&dir, "memory.log"), 5001, "opening compacted it");
    s.load_memories().unwrap();
    assert_eq!(lines(&dir, "memory.log"), 1, "one line for the one record");
    let back = s.inspect(&r.id, &agent()).await.unwrap().unwrap();
    assert_eq!(back.revision, r.revision);
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
}

#[tokio::test]
async fn a_memory_log_that_is_a_directory_is_set_aside_at_the_load() {
    let dir = tempfile::tempdir().unwrap();
    drop(eager(&dir));
    // Made a directory after the open's check for special files: the load's read fails for
    // good, so it is set aside as an eager open would, and the store goes on without it.
    let s = deferred(&dir);
    std::fs::remove_file(dir.path().join("memory.log")).unwrap();
    std::fs::create_dir(dir.path().join("memory.log")).unwrap();
    let loaded = s.load_memories();
    assert!(loaded.is_ok(), "{loaded:?}");
    let diags = s.diagnostics();
    assert!(
        diags
            .iter()
            .any(|d| d.file == "memory.log" && d.message.contains("set aside")),
        "{diags:?}"
    );
    s.put(write("m1", agent(), "a lighthouse"), None, false)
        .await
        .unwrap();
    assert_eq!(found(&s, "lighthouse").await, ["m1"]);
}
