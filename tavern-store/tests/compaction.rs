//! Log compaction loses nothing: records, revisions, access times, audit trails, variables
//! with their tombstones and scope revisions; other instances sharing the root reload; and a
//! bloated log is compacted at open.

use std::sync::Arc;

use serde_json::{json, Value};
use tavern_core::{AgentId, MemoryId, MemorySource, ScopeKey};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::{write, T0};
use tavern_store::fs::FsStore;
use tavern_store::{MemoryQuery, MemoryStore, VariableChange, VariableStore};

fn open(dir: &tempfile::TempDir, clock: &Arc<ManualClock>) -> FsStore {
    FsStore::open(dir.path(), clock.clone()).unwrap()
}

fn agent(id: &str) -> ScopeKey {
    ScopeKey::Agent {
        agent: AgentId::parse(id).unwrap(),
    }
}

fn var(n: &str) -> tavern_core::VariableName {
    tavern_core::VariableName::parse(n).unwrap()
}

/// Everything observable through the ports, as JSON for comparison.
async fn observe(s: &FsStore) -> Value {
    let mut out = json!({});
    for scope in [agent("a"), agent("b")] {
        let key = scope.to_string();
        let hits = s
            .search(&MemoryQuery {
                include_deleted: true,
                include_expired: true,
                limit: 100,
                ..MemoryQuery::new("", vec![scope.clone()])
            })
            .await
            .unwrap();
        out[&key]["memories"] = json!(hits
            .hits
            .iter()
            .map(|h| json!([
                h.record.id.as_str(),
                h.record.content,
                h.record.revision.as_str(),
                h.record.last_accessed_at.map(|t| t.0),
                h.record.deleted_at.map(|t| t.0)
            ]))
            .collect::<Vec<_>>());
        out[&key]["search"] = json!(s
            .search(&MemoryQuery::new("lantern", vec![scope.clone()]))
            .await
            .unwrap()
            .hits
            .iter()
            .map(|h| (h.record.id.to_string(), h.score))
            .collect::<Vec<_>>());
        out[&key]["memory_audit"] =
            serde_json::to_value(s.memory_audit(&scope, None).await.unwrap()).unwrap();
        // One record's trail names its versions' texts.
        for id in ["m1", "m2", "m3"] {
            let id = MemoryId::parse(id).unwrap();
            out[&key][format!("audit_{id}")] =
                serde_json::to_value(s.memory_audit(&scope, Some(&id)).await.unwrap()).unwrap();
        }
        let listing = s.list(&scope, "", 100).await.unwrap();
        out[&key]["scope_revision"] = json!(listing.scope_revision.map(|r| r.to_string()));
        out[&key]["variables"] = json!(listing
            .items
            .iter()
            .map(|v| (
                v.name.to_string(),
                v.preview.clone(),
                v.revision.to_string()
            ))
            .collect::<Vec<_>>());
        out[&key]["variable_audit"] =
            serde_json::to_value(s.variable_audit(&scope).await.unwrap()).unwrap();
    }
    out
}

async fn history(s: &FsStore, clock: &ManualClock) {
    let a = agent("a");
    let r1 = s
        .put(write("m1", a.clone(), "the blue lantern"), None, false)
        .await
        .unwrap();
    clock.advance(10);
    let r2 = s
        .put(
            write("m1", a.clone(), "the blue lantern, repaired"),
            Some(&r1.revision),
            false,
        )
        .await
        .unwrap();
    // m2 is edited more often than its earlier texts are kept.
    let mut m2 = s
        .put(
            write("m2", a.clone(), "a lantern for the river"),
            None,
            false,
        )
        .await
        .unwrap();
    for i in 0..12 {
        clock.advance(1);
        m2 = s
            .put(
                write(
                    "m2",
                    a.clone(),
                    &format!("a lantern for the river, take {i}"),
                ),
                Some(&m2.revision),
                false,
            )
            .await
            .unwrap();
    }
    let gone = s
        .put(write("m3", agent("b"), "forget me"), None, false)
        .await
        .unwrap();
    s.forget(
        &gone.id,
        &agent("b"),
        &gone.revision,
        MemorySource::system(),
    )
    .await
    .unwrap();
    for _ in 0..3 {
        clock.advance(5);
        s.read(&r2.id, &a).await.unwrap();
    }
    let hp = s
        .set(&a, &var("hp"), json!(3), None, MemorySource::system())
        .await
        .unwrap();
    s.patch(
        &a,
        &[
            VariableChange::Set {
                name: var("hp"),
                value: json!(2),
                expected: Some(hp.revision.clone()),
            },
            VariableChange::Set {
                name: var("当前周期"),
                value: json!({"day": 1}),
                expected: None,
            },
        ],
        None,
        MemorySource::system(),
    )
    .await
    .unwrap();
    let tmp = s
        .set(
            &agent("b"),
            &var("tmp"),
            json!(true),
            None,
            MemorySource::system(),
        )
        .await
        .unwrap();
    s.delete(
        &agent("b"),
        &var("tmp"),
        &tmp.revision,
        MemorySource::system(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn compaction_preserves_every_observable_fact() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = open(&dir, &clock);
    history(&s, &clock).await;
    let before = observe(&s).await;
    let report = s.compact().unwrap();
    assert!(report.memory.1 < report.memory.0, "{report:?}");
    assert!(report.variables.1 < report.variables.0, "{report:?}");
    assert_eq!(observe(&s).await, before, "the compacting instance");
    drop(s);
    let again = open(&dir, &clock);
    assert_eq!(observe(&again).await, before, "after reopening");
    assert!(again.diagnostics().is_empty());
    // Revision chains continue: the next update of m1 still needs its current revision, and a
    // re-created tombstoned variable does not revive an old revision.
    let m1 = again
        .read(&MemoryId::parse("m1").unwrap(), &agent("a"))
        .await
        .unwrap()
        .unwrap();
    again
        .put(write("m1", agent("a"), "third"), Some(&m1.revision), false)
        .await
        .unwrap();
    let again_tmp = again
        .set(
            &agent("b"),
            &var("tmp"),
            json!(true),
            None,
            MemorySource::system(),
        )
        .await
        .unwrap();
    let audit = again.variable_audit(&agent("b")).await.unwrap();
    assert_eq!(audit.len(), 3, "set, delete and the new set");
    assert!(
        audit[..2]
            .iter()
            .all(|e| e.revision.as_ref() != Some(&again_tmp.revision)),
        "no revived revision"
    );
}

/// A log compacted before memories kept their earlier texts: its earlier versions read as
/// unknown (`None`), never as the current text; the current version's text is the record's.
#[tokio::test]
async fn a_snapshot_from_before_texts_were_kept_shows_earlier_versions_as_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = open(&dir, &clock);
    let a = agent("a");
    let v1 = s
        .put(write("m1", a.clone(), "first"), None, false)
        .await
        .unwrap();
    s.put(write("m1", a.clone(), "second"), Some(&v1.revision), false)
        .await
        .unwrap();
    s.compact().unwrap();
    drop(s);
    // Rewrite the compacted line as the earlier format wrote it (no texts, no marker).
    let path = dir.path().join("memory.log");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let (_, payload) = line.split_once(' ').unwrap();
        let mut op: Value = serde_json::from_str(payload).unwrap();
        let snap = op["snapshot"].as_object_mut().expect("a snapshot line");
        assert_eq!(snap.remove("contents"), Some(json!(true)));
        for h in snap["history"].as_array_mut().unwrap() {
            h.as_object_mut().unwrap().remove("content");
        }
        let payload = op.to_string();
        let digest = tavern_core::revision::short_digest(&[payload.as_bytes()]);
        out.push_str(&format!("{digest} {payload}\n"));
    }
    std::fs::write(&path, out).unwrap();
    let again = open(&dir, &clock);
    assert!(again.diagnostics().is_empty(), "{:?}", again.diagnostics());
    let audit = again
        .memory_audit(&a, Some(&MemoryId::parse("m1").unwrap()))
        .await
        .unwrap();
    let texts: Vec<Option<&str>> = audit.iter().map(|e| e.content.as_deref()).collect();
    assert_eq!(texts, [None, Some("second")]);
}

#[tokio::test]
async fn another_instance_reloads_after_a_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let a = open(&dir, &clock);
    let b = open(&dir, &clock);
    history(&a, &clock).await;
    let seen = b
        .read(&MemoryId::parse("m2").unwrap(), &agent("a"))
        .await
        .unwrap()
        .unwrap();
    a.compact().unwrap();
    // B's view was built from the old file; its next operation notices the new one.
    let updated = b
        .put(
            write("m2", agent("a"), "a lantern for the sea"),
            Some(&seen.revision),
            false,
        )
        .await
        .unwrap();
    assert_eq!(observe(&b).await, observe(&a).await);
    assert_eq!(
        a.read(&updated.id, &agent("a"))
            .await
            .unwrap()
            .unwrap()
            .content,
        "a lantern for the sea"
    );
    assert!(a.diagnostics().is_empty() && b.diagnostics().is_empty());
}

#[tokio::test]
async fn a_bloated_log_is_compacted_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = open(&dir, &clock);
    let r = s
        .put(write("m", agent("a"), "read often"), None, false)
        .await
        .unwrap();
    for _ in 0..5000 {
        clock.advance(1);
        s.read(&r.id, &agent("a")).await.unwrap();
    }
    drop(s);
    let lines = |p: &str| {
        std::fs::read_to_string(dir.path().join(p))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(lines("memory.log"), 5001);
    let s = open(&dir, &clock);
    assert_eq!(lines("memory.log"), 1, "one line for the one record");
    let back = s.read(&r.id, &agent("a")).await.unwrap().unwrap();
    assert_eq!(back.revision, r.revision);
    assert_eq!(s.memory_audit(&agent("a"), None).await.unwrap().len(), 1);
}
