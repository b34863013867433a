//! The one conformance suite every store adapter must pass (feature `conformance`).
//!
//! Each check is a plain async function over a [`Fixture`]; [`store_conformance_tests!`] turns
//! them into `#[tokio::test]`s for an adapter. Checks panic with a description on failure, as
//! test code does.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::sync::Arc;

use serde_json::json;
use tavern_core::{
    AgentId, AuditAction, CharacterName, ChatId, MemoryId, MemoryKind, MemorySource, MemoryWrite,
    ScopeKey, SessionId, Tag, Timestamp, VariableName,
};

use crate::chat::{ChatChange, ChatRevision};
use crate::checkpoint::{CheckpointStatus, ProjectorCheckpoint};
use crate::clock::ManualClock;
use crate::error::StoreError;
use crate::memory::{MemoryQuery, TagMatch, Truncation};
use crate::state::{StateStoreExt, StateViewExt, Verdict};
use crate::variable::VariableChange;
use crate::{
    AllStores, ChatStore, CheckpointStore, MemoryStore, PromptStore, StateStore, VariableStore,
};
use tavern_core::chat::ChatLine;

/// A fresh store under test, its clock, and (for durable adapters) a way to reopen it.
pub struct Fixture {
    /// The store.
    pub store: Arc<dyn AllStores>,
    /// The clock the store reads.
    pub clock: Arc<ManualClock>,
    /// Opens the same data again as a new instance (`None` for volatile adapters).
    pub reopen: Option<Box<dyn Fn() -> Arc<dyn AllStores> + Send + Sync>>,
    /// Keeps temporary directories alive.
    pub guard: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// The start time of every fixture clock.
pub const T0: Timestamp = Timestamp(1_700_000_000_000);

fn agent(id: &str) -> ScopeKey {
    ScopeKey::Agent {
        agent: AgentId::parse(id).unwrap(),
    }
}

fn chat_scope(character: &str, chat: &str) -> ScopeKey {
    ScopeKey::Chat {
        character: CharacterName::parse(character).unwrap(),
        chat: ChatId::parse(chat).unwrap(),
    }
}

fn src(call: &str) -> MemorySource {
    MemorySource::tool(call, SessionId::parse("s1").unwrap(), 1)
}

/// A memory write with defaults.
pub fn write(id: &str, scope: ScopeKey, content: &str) -> MemoryWrite {
    MemoryWrite {
        id: MemoryId::parse(id).unwrap(),
        scope,
        kind: MemoryKind::Semantic,
        content: content.into(),
        tags: Vec::new(),
        importance: 0.5,
        confidence: 0.8,
        source: src("call-1"),
        expires_at: None,
    }
}

fn var(n: &str) -> VariableName {
    VariableName::parse(n).unwrap()
}

/// A sentence encoder that is stuck until the test lets it go: it says when it is first
/// asked, counts its calls, and gives texts naming a lantern the query's direction.
#[derive(Debug)]
struct StuckEncoder {
    query: String,
    entered: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    gate: (std::sync::Mutex<bool>, std::sync::Condvar),
    calls: std::sync::atomic::AtomicUsize,
}

impl StuckEncoder {
    fn open(&self) {
        *self.gate.0.lock().unwrap() = true;
        self.gate.1.notify_all();
    }
}

impl tavern_search::Encoder for StuckEncoder {
    fn name(&self) -> &str {
        "stuck"
    }
    fn dims(&self) -> usize {
        2
    }
    fn encode(
        &self,
        texts: &[&str],
    ) -> Result<Vec<Vec<f32>>, tavern_search::sentences::EncodeError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(entered) = self.entered.lock().unwrap().take() {
            let _ = entered.send(());
        }
        let mut open = self.gate.0.lock().unwrap();
        while !*open {
            open = self.gate.1.wait(open).unwrap();
        }
        Ok(texts
            .iter()
            .map(|t| {
                if *t == self.query || t.contains("lantern") {
                    vec![1.0, 0.0]
                } else {
                    vec![0.0, 1.0]
                }
            })
            .collect())
    }
}

/// A search whose ranker prepares (a sentence encoder) encodes outside the store's locks:
/// while its encoder is stuck, another player's memory calls on the same store complete;
/// once let go, the search ranks by what the encoder said, having asked it once (the search
/// proper only looked up what was prepared).
pub async fn memory_prepared_search_encodes_outside_the_lock(f: &Fixture) {
    use crate::memory::MemorySearchExt;
    use std::time::Duration;
    let (mine, theirs) = (agent("slow-player"), agent("other-player"));
    let s = &f.store;
    s.put(
        write("dusk", mine.clone(), "The gate closes at dusk, the gate."),
        None,
        false,
    )
    .await
    .unwrap();
    s.put(
        write("lantern", mine.clone(), "A lantern hangs by the gate."),
        None,
        false,
    )
    .await
    .unwrap();
    s.put(
        write("note", theirs.clone(), "The ferry leaves at noon."),
        None,
        false,
    )
    .await
    .unwrap();
    let (entered, asked) = tokio::sync::oneshot::channel();
    let encoder = Arc::new(StuckEncoder {
        query: "gate".into(),
        entered: std::sync::Mutex::new(Some(entered)),
        gate: (std::sync::Mutex::new(false), std::sync::Condvar::new()),
        calls: std::sync::atomic::AtomicUsize::new(0),
    });
    let ranker = tavern_search::SentenceRanker::new(encoder.clone()).with_weight(0.95);
    let mut query = MemoryQuery::new("gate", vec![mine.clone()]);
    query.ranker = tavern_search::RankerRef::new(ranker);
    let store = s.clone();
    let mut slow = tokio::spawn(async move { store.search_prepared(&query).await });
    let bound = Duration::from_secs(30);
    let asked = tokio::time::timeout(bound, async {
        tokio::select! {
            _ = asked => None,
            ended = &mut slow => Some(ended),
        }
    })
    .await;
    match asked {
        Ok(None) => {}
        Ok(Some(ended)) => panic!("the search ended without asking its encoder: {ended:?}"),
        Err(_) => {
            encoder.open();
            panic!("the search never asked its encoder");
        }
    }
    // Another player's calls run on other tasks: a call stuck on a lock blocks its thread,
    // and this one must still be free to notice.
    let store = s.clone();
    let others = tokio::spawn(async move {
        store
            .put(
                write("later", theirs.clone(), "The ferry is late."),
                None,
                false,
            )
            .await
            .unwrap();
        let found = store
            .search(&MemoryQuery::new("ferry", vec![theirs]))
            .await
            .unwrap();
        assert_eq!(found.hits.len(), 2);
        // The slow player's own scope, lexically, too.
        store
            .search(&MemoryQuery::new("dusk", vec![agent("slow-player")]))
            .await
            .unwrap()
            .hits
            .len()
    });
    let done = tokio::time::timeout(bound, others).await;
    encoder.open();
    let own = done
        .expect("another player's memory calls waited for a stuck encoder")
        .unwrap();
    assert_eq!(own, 1);
    let found = tokio::time::timeout(bound, slow)
        .await
        .expect("the search did not finish once its encoder was let go")
        .unwrap()
        .unwrap();
    let order: Vec<&str> = found.hits.iter().map(|h| h.record.id.as_str()).collect();
    assert_eq!(
        order,
        ["lantern", "dusk"],
        "ranked by the encoder's closeness"
    );
    assert_eq!(
        encoder.calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the search proper encoded again"
    );
}

/// Create, read, update, forget and explicit restore, with conflicts carrying the current
/// revision.
pub async fn memory_crud_and_cas(f: &Fixture) {
    let s = &f.store;
    let scope = agent("a1");
    let id = MemoryId::parse("m1").unwrap();
    let r1 = s
        .put(write("m1", scope.clone(), "Mira fears water"), None, false)
        .await
        .unwrap();
    assert_eq!(
        s.read(&id, &scope).await.unwrap().unwrap().content,
        "Mira fears water"
    );

    let again = s
        .put(write("m1", scope.clone(), "dup"), None, false)
        .await
        .unwrap_err();
    assert_eq!(
        again.conflict_revision(),
        Some(&r1.revision),
        "create over existing conflicts"
    );
    let missing = s
        .put(write("m2", scope.clone(), "x"), Some(&r1.revision), false)
        .await
        .unwrap_err();
    assert!(
        matches!(missing, StoreError::Conflict { current: None, .. }),
        "{missing}"
    );

    let r2 = s
        .put(
            write("m1", scope.clone(), "Mira fears deep water"),
            Some(&r1.revision),
            false,
        )
        .await
        .unwrap();
    assert_ne!(r2.revision, r1.revision);
    assert_eq!(r2.created_at, r1.created_at);
    let stale = s
        .put(
            write("m1", scope.clone(), "lost"),
            Some(&r1.revision),
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(stale.conflict_revision(), Some(&r2.revision));
    // Recover: re-read the current revision and retry.
    let current = s.read(&id, &scope).await.unwrap().unwrap();
    let r3 = s
        .put(
            write("m1", scope.clone(), "retried"),
            Some(&current.revision),
            false,
        )
        .await
        .unwrap();
    assert_eq!(r3.content, "retried");

    let gone = s
        .forget(&id, &scope, &r3.revision, src("call-forget"))
        .await
        .unwrap();
    assert!(gone.deleted_at.is_some());
    assert_eq!(
        s.read(&id, &scope).await.unwrap(),
        None,
        "forgotten reads as none"
    );
    // Inspecting sees the forgotten version whole, in its own scope only, and marks nothing.
    let seen = s
        .inspect(&id, &scope)
        .await
        .unwrap()
        .expect("forgotten is inspectable");
    assert_eq!(seen.revision, gone.revision);
    assert_eq!(seen.content, "retried");
    assert!(seen.deleted_at.is_some());
    assert_eq!(
        seen.last_accessed_at, gone.last_accessed_at,
        "inspect is no access"
    );
    assert_eq!(s.inspect(&id, &agent("a2")).await.unwrap(), None);
    assert_eq!(
        s.inspect(&MemoryId::parse("never").unwrap(), &scope)
            .await
            .unwrap(),
        None
    );
    assert!(matches!(
        s.forget(&id, &scope, &gone.revision, src("x")).await,
        Err(StoreError::NotFound { .. })
    ));
    let refused = s
        .put(
            write("m1", scope.clone(), "back"),
            Some(&gone.revision),
            false,
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, StoreError::Forgotten { .. }), "{refused}");
    let back = s
        .put(
            write("m1", scope.clone(), "back"),
            Some(&gone.revision),
            true,
        )
        .await
        .unwrap();
    assert!(back.deleted_at.is_none());

    let audit = s.audit_memory(&scope, Some(&id)).await;
    let actions: Vec<AuditAction> = audit.iter().map(|a| a.action).collect();
    assert_eq!(
        actions,
        [
            AuditAction::Created,
            AuditAction::Updated,
            AuditAction::Updated,
            AuditAction::Forgotten,
            AuditAction::Restored
        ]
    );
    assert_eq!(audit[3].source.tool_call_id.as_deref(), Some("call-forget"));
    assert_eq!(audit[3].revision.as_ref(), Some(&gone.revision));
}

/// A memory's audit names each version's text while it is kept: the last
/// [`KEPT_CONTENTS`](crate::memory::KEPT_CONTENTS) texts a record changed from (and its current
/// one); older versions' texts are let go, never shown as another version's. The same after a
/// reopen.
pub async fn memory_history_texts(f: &Fixture) {
    let s = &f.store;
    let scope = agent("a1");
    let id = MemoryId::parse("edited").unwrap();
    // Each version's text, as a reader follows the trail: a version that kept the text of
    // the one before carries none and says so.
    let texts = |audit: &[tavern_core::AuditEntry]| -> Vec<Option<String>> {
        let mut last: Option<String> = None;
        audit
            .iter()
            .map(|a| {
                if a.same_text {
                    assert!(a.content.is_none(), "{a:?}");
                } else {
                    last = a.content.clone();
                }
                last.clone()
            })
            .collect()
    };
    let some = |t: &str| Some(t.to_owned());
    let mut cur = s
        .put(write("edited", scope.clone(), "v1"), None, false)
        .await
        .unwrap();
    cur = s
        .put(
            write("edited", scope.clone(), "v2"),
            Some(&cur.revision),
            false,
        )
        .await
        .unwrap();
    let mut same_text = write("edited", scope.clone(), "v2");
    same_text.importance = 0.9;
    cur = s.put(same_text, Some(&cur.revision), false).await.unwrap();
    cur = s
        .forget(&id, &scope, &cur.revision, src("f"))
        .await
        .unwrap();
    cur = s
        .put(
            write("edited", scope.clone(), "v3"),
            Some(&cur.revision),
            true,
        )
        .await
        .unwrap();
    let audit = s.audit_memory(&scope, Some(&id)).await;
    assert_eq!(
        texts(&audit),
        [some("v1"), some("v2"), some("v2"), some("v2"), some("v3")],
        "each version with its own text, an importance change and a forget keep it"
    );
    // Only the versions that changed the text carry it (a record saved many times with one
    // text holds it once).
    let carried: Vec<bool> = audit.iter().map(|a| a.content.is_some()).collect();
    assert_eq!(carried, [true, true, false, false, true]);
    // A scope-wide trail names no texts (only one record's history does).
    assert!(s
        .audit_memory(&scope, None)
        .await
        .iter()
        .all(|a| a.content.is_none()));
    for i in 0..10 {
        cur = s
            .put(
                write("edited", scope.clone(), &format!("e{i}")),
                Some(&cur.revision),
                false,
            )
            .await
            .unwrap();
    }
    let expected: Vec<Option<String>> = std::iter::repeat_n(None, 6)
        .chain((1..10).map(|i| some(&format!("e{i}"))))
        .collect();
    let audit = s.audit_memory(&scope, Some(&id)).await;
    assert_eq!(audit.len(), 15);
    assert_eq!(
        texts(&audit),
        expected,
        "the last {} changed-from texts and the current one are kept",
        crate::memory::KEPT_CONTENTS
    );
    assert_eq!(audit[14].content.as_deref(), Some(cur.content.as_str()));
    if let Some(reopen) = &f.reopen {
        let again = reopen();
        assert_eq!(
            texts(&again.audit_memory(&scope, Some(&id)).await),
            expected
        );
    }
}

/// Helper so checks can name the memory audit without ambiguity.
#[async_trait::async_trait]
pub trait AuditExt {
    /// `MemoryStore::audit`.
    async fn audit_memory(
        &self,
        scope: &ScopeKey,
        id: Option<&MemoryId>,
    ) -> Vec<tavern_core::AuditEntry>;
}

#[async_trait::async_trait]
impl<T: crate::MemoryStore + ?Sized> AuditExt for T {
    async fn audit_memory(
        &self,
        scope: &ScopeKey,
        id: Option<&MemoryId>,
    ) -> Vec<tavern_core::AuditEntry> {
        self.memory_audit(scope, id).await.unwrap()
    }
}

/// N tasks race the same CAS update: exactly one wins, the others see conflicts.
pub async fn memory_concurrent_cas_exactly_one_wins(f: &Fixture) {
    let scope = agent("a1");
    let base = f
        .store
        .put(write("race", scope.clone(), "v0"), None, false)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = f.store.clone();
        let (scope, rev) = (scope.clone(), base.revision.clone());
        tasks.push(tokio::spawn(async move {
            s.put(write("race", scope, &format!("v{i}")), Some(&rev), false)
                .await
        }));
    }
    let mut wins = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => wins += 1,
            Err(e) => assert!(e.conflict_revision().is_some(), "{e}"),
        }
    }
    assert_eq!(wins, 1);
}

/// Concurrent writers retrying on conflict never lose an update.
pub async fn variable_concurrent_increments_lose_nothing(f: &Fixture) {
    let scope = ScopeKey::Global;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let s = f.store.clone();
        let scope = scope.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                loop {
                    let cur = s.get(&scope, &var("counter")).await.unwrap();
                    let n = cur.as_ref().map_or(0, |r| r.value.as_i64().unwrap());
                    let res = s
                        .set(
                            &scope,
                            &var("counter"),
                            json!(n + 1),
                            cur.as_ref().map(|r| &r.revision),
                            src("c"),
                        )
                        .await;
                    match res {
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
    let v = f.store.get(&scope, &var("counter")).await.unwrap().unwrap();
    assert_eq!(v.value, json!(40));
}

/// Expired records are hidden from read and search, shown with `include_expired`, and listed
/// as expired in the audit; nothing is purged.
pub async fn memory_ttl(f: &Fixture) {
    let scope = agent("a1");
    let mut w = write("ttl", scope.clone(), "the lantern is lit tonight");
    w.expires_at = Some(T0.plus_millis(1000));
    f.store.put(w, None, false).await.unwrap();
    let id = MemoryId::parse("ttl").unwrap();
    assert!(f.store.read(&id, &scope).await.unwrap().is_some());
    f.clock.advance(1000);
    assert_eq!(f.store.read(&id, &scope).await.unwrap(), None);
    let q = MemoryQuery::new("lantern", vec![scope.clone()]);
    assert!(f.store.search(&q).await.unwrap().hits.is_empty());
    let mut q2 = q.clone();
    q2.include_expired = true;
    let hits = f.store.search(&q2).await.unwrap().hits;
    assert_eq!(hits.len(), 1);
    assert!(hits[0].expired);
    let audit = f.store.audit_memory(&scope, Some(&id)).await;
    assert_eq!(audit.last().unwrap().action, AuditAction::Expired);
    assert_eq!(audit.last().unwrap().at, T0.plus_millis(1000));
}

/// Reads maintain `last_accessed_at` without changing the revision.
pub async fn memory_access_time(f: &Fixture) {
    let scope = agent("a1");
    let r = f
        .store
        .put(write("acc", scope.clone(), "x y z"), None, false)
        .await
        .unwrap();
    assert_eq!(r.last_accessed_at, None);
    f.clock.advance(5);
    let read = f.store.read(&r.id, &scope).await.unwrap().unwrap();
    assert_eq!(read.last_accessed_at, Some(T0.plus_millis(5)));
    assert_eq!(read.revision, r.revision);
}

/// Lexical search: CJK words inside sentences, case folding, honest results, filters, budget.
pub async fn memory_search(f: &Fixture) {
    let s = &f.store;
    let a = agent("a1");
    let c = chat_scope("Mira", "chat 1");
    let mut w = write("zh", a.clone(), "她推开了银色大门，月光洒在石阶上。");
    w.tags = vec![Tag::parse("place").unwrap(), Tag::parse("night").unwrap()];
    w.kind = MemoryKind::Episodic;
    s.put(w, None, false).await.unwrap();
    f.clock.advance(10);
    let mut w = write("en", a.clone(), "The Silver Gate closes at moonrise.");
    w.tags = vec![Tag::parse("place").unwrap()];
    w.importance = 0.9;
    s.put(w, None, false).await.unwrap();
    f.clock.advance(10);
    s.put(
        write("other", c.clone(), "Kai owes Mira three silver coins."),
        None,
        false,
    )
    .await
    .unwrap();

    let res = s
        .search(&MemoryQuery::new("银色大门", vec![a.clone()]))
        .await
        .unwrap();
    assert_eq!(res.hits.len(), 1, "only the chinese record matches");
    assert_eq!(res.hits[0].record.id.as_str(), "zh");
    assert!(res.hits[0].score > 0.0 && res.hits[0].relevance > 0.0);

    let res = s
        .search(&MemoryQuery::new("SILVER", vec![a.clone(), c.clone()]))
        .await
        .unwrap();
    assert_eq!(res.source_count, 2);
    assert!(
        res.hits.windows(2).all(|w| w[0].score >= w[1].score),
        "ranked"
    );

    let none = s
        .search(&MemoryQuery::new("dragon", vec![a.clone()]))
        .await
        .unwrap();
    assert!(none.hits.is_empty() && none.source_count == 0 && !none.truncated);

    let res = s
        .search(&MemoryQuery::new("silver", vec![c.clone()]))
        .await
        .unwrap();
    assert_eq!(res.hits.len(), 1, "scope filter");
    assert_eq!(res.hits[0].record.id.as_str(), "other");

    let mut q = MemoryQuery::new("", vec![a.clone(), c.clone()]);
    let listed = s.search(&q).await.unwrap();
    let ids: Vec<&str> = listed.hits.iter().map(|h| h.record.id.as_str()).collect();
    assert_eq!(ids, ["other", "en", "zh"], "empty query lists by recency");

    q.kinds = vec![MemoryKind::Episodic];
    assert_eq!(s.search(&q).await.unwrap().hits.len(), 1);
    q.kinds.clear();
    q.tags = vec![Tag::parse("place").unwrap(), Tag::parse("night").unwrap()];
    q.tag_match = TagMatch::All;
    assert_eq!(s.search(&q).await.unwrap().hits.len(), 1);
    q.tag_match = TagMatch::Any;
    assert_eq!(s.search(&q).await.unwrap().hits.len(), 2);
    q.tags.clear();
    q.updated_from = Some(T0.plus_millis(10));
    q.updated_to = Some(T0.plus_millis(10));
    assert_eq!(s.search(&q).await.unwrap().hits.len(), 1, "time range");

    let mut q = MemoryQuery::new("", vec![a.clone(), c.clone()]);
    q.limit = 2;
    let res = s.search(&q).await.unwrap();
    assert_eq!(
        (
            res.hits.len(),
            res.source_count,
            res.truncated,
            res.truncated_by
        ),
        (2, 3, true, Some(Truncation::Limit))
    );
    // The next page starts where the first ended: together they list each record once.
    let first: Vec<MemoryId> = res.hits.iter().map(|h| h.record.id.clone()).collect();
    q.offset = 2;
    let page = s.search(&q).await.unwrap();
    assert_eq!(
        (page.hits.len(), page.source_count, page.truncated),
        (1, 3, false)
    );
    assert!(
        !first.contains(&page.hits[0].record.id),
        "pages do not overlap"
    );
    q.offset = 3;
    assert!(
        s.search(&q).await.unwrap().hits.is_empty(),
        "past the end: no hits"
    );
    q.offset = 0;
    q.limit = 10;
    q.max_tokens = Some(res.hits[0].tokens);
    let res = s.search(&q).await.unwrap();
    assert_eq!(
        res.hits.len(),
        1,
        "a hit that does not fit is left out whole"
    );
    assert_eq!(res.truncated_by, Some(Truncation::MaxTokens));
    q.max_tokens = Some(1);
    let res = s.search(&q).await.unwrap();
    assert!(res.hits.is_empty() && res.truncated && res.source_count == 3);

    // Exact ties (same text, scores and time) fall back to scope, then id: stable order.
    let t = agent("tie");
    for id in ["t2", "t10", "t1"] {
        s.put(write(id, t.clone(), "identical twin"), None, false)
            .await
            .unwrap();
    }
    let ids = |r: crate::MemorySearchResult| -> Vec<String> {
        r.hits.iter().map(|h| h.record.id.to_string()).collect()
    };
    let first = ids(s
        .search(&MemoryQuery::new("twin", vec![t.clone()]))
        .await
        .unwrap());
    assert_eq!(first, ["t1", "t10", "t2"]);
    let again = ids(s
        .search(&MemoryQuery::new("twin", vec![t.clone()]))
        .await
        .unwrap());
    assert_eq!(first, again);
}

/// Variables: create/update CAS, no ABA after A→B→A or delete + re-create, tombstones audited.
pub async fn variables_cas(f: &Fixture) {
    let s = &f.store;
    let scope = chat_scope("Mira", "chat 1");
    let n = var("basic.好感度");
    let a = s.set(&scope, &n, json!(10), None, src("v1")).await.unwrap();
    let dup = s
        .set(&scope, &n, json!(11), None, src("v2"))
        .await
        .unwrap_err();
    assert_eq!(dup.conflict_revision(), Some(&a.revision));
    let b = s
        .set(&scope, &n, json!(20), Some(&a.revision), src("v3"))
        .await
        .unwrap();
    let a2 = s
        .set(&scope, &n, json!(10), Some(&b.revision), src("v4"))
        .await
        .unwrap();
    assert_ne!(a2.revision, a.revision, "A→B→A gets a fresh revision");
    let stale = s
        .set(&scope, &n, json!(0), Some(&a.revision), src("v5"))
        .await
        .unwrap_err();
    assert_eq!(stale.conflict_revision(), Some(&a2.revision));
    s.delete(&scope, &n, &a2.revision, src("v6")).await.unwrap();
    assert_eq!(s.get(&scope, &n).await.unwrap(), None);
    assert!(matches!(
        s.delete(&scope, &n, &a2.revision, src("v7")).await,
        Err(StoreError::NotFound { .. })
    ));
    let again = s.set(&scope, &n, json!(10), None, src("v8")).await.unwrap();
    assert!(![&a.revision, &b.revision, &a2.revision].contains(&&again.revision));
    let actions: Vec<AuditAction> = s
        .variable_audit(&scope)
        .await
        .unwrap()
        .iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(
        actions,
        [
            AuditAction::Set,
            AuditAction::Set,
            AuditAction::Set,
            AuditAction::Deleted,
            AuditAction::Set
        ]
    );
}

/// A patch is all or nothing, on one scope revision.
pub async fn variables_patch_atomic(f: &Fixture) {
    let s = &f.store;
    let scope = agent("a1");
    let hp = s
        .set(&scope, &var("hp"), json!(5), None, src("p0"))
        .await
        .unwrap();
    let listing = s.list(&scope, "", 10).await.unwrap();
    let scope_rev = listing.scope_revision.clone().unwrap();
    let bad = [
        VariableChange::Set {
            name: var("hp"),
            value: json!(4),
            expected: Some(hp.revision.clone()),
        },
        VariableChange::Set {
            name: var("mp"),
            value: json!(1),
            expected: Some(hp.revision.clone()),
        },
    ];
    let err = s.patch(&scope, &bad, None, src("p1")).await.unwrap_err();
    assert!(err.to_string().contains("variable mp"), "{err}");
    assert_eq!(
        s.get(&scope, &var("hp")).await.unwrap().unwrap().value,
        json!(5),
        "nothing written"
    );
    assert_eq!(
        s.list(&scope, "", 10)
            .await
            .unwrap()
            .scope_revision
            .as_ref(),
        Some(&scope_rev)
    );

    let good = [
        VariableChange::Set {
            name: var("hp"),
            value: json!(4),
            expected: Some(hp.revision.clone()),
        },
        VariableChange::Set {
            name: var("mp"),
            value: json!({"cur": 1}),
            expected: None,
        },
    ];
    let out = s
        .patch(&scope, &good, Some(&scope_rev), src("p2"))
        .await
        .unwrap();
    assert_eq!(out.records.len(), 2);
    assert_ne!(out.scope_revision, scope_rev);
    let again = s
        .patch(&scope, &good[1..], Some(&scope_rev), src("p3"))
        .await
        .unwrap_err();
    assert_eq!(
        again.conflict_revision(),
        Some(&out.scope_revision),
        "stale scope revision"
    );
    let twice = [
        VariableChange::Set {
            name: var("x"),
            value: json!(1),
            expected: None,
        },
        VariableChange::Set {
            name: var("x"),
            value: json!(2),
            expected: None,
        },
    ];
    assert!(s
        .patch(&scope, &twice, None, src("p4"))
        .await
        .unwrap_err()
        .to_string()
        .contains("twice"));
}

/// Value and scope size limits name the limit; list and clear work by scope.
pub async fn variables_limits_list_clear(f: &Fixture) {
    let s = &f.store;
    let scope = agent("a1");
    let big = json!("x".repeat(33 * 1024));
    let err = s
        .set(&scope, &var("big"), big, None, src("l"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("variable value bytes"), "{err}");
    let chunk = json!("y".repeat(30 * 1024));
    let mut failed = None;
    for i in 0..10 {
        if let Err(e) = s
            .set(
                &scope,
                &var(&format!("c{i}")),
                chunk.clone(),
                None,
                src("l"),
            )
            .await
        {
            failed = Some((i, e));
            break;
        }
    }
    let (i, e) = failed.expect("the scope limit must stop the writes");
    assert_eq!(i, 8, "256 KiB fits eight 30 KiB values");
    assert!(e.to_string().contains("variable scope bytes"), "{e}");

    s.set(&scope, &var("stat.str"), json!(3), None, src("l"))
        .await
        .unwrap();
    s.set(&scope, &var("stat.dex"), json!([1, 2]), None, src("l"))
        .await
        .unwrap();
    let listing = s.list(&scope, "stat.", 1).await.unwrap();
    assert_eq!(
        (listing.total, listing.truncated, listing.items.len()),
        (2, true, 1)
    );
    assert_eq!(listing.items[0].name.as_str(), "stat.dex");
    assert_eq!(listing.items[0].kind, "array");
    assert_eq!(listing.items[0].preview, "[1,2]");

    let turn = ScopeKey::Turn {
        agent: AgentId::parse("a1").unwrap(),
    };
    s.set(&turn, &var("scratch"), json!(true), None, src("t"))
        .await
        .unwrap();
    assert_eq!(
        s.clear_scope(&turn, MemorySource::system()).await.unwrap(),
        1
    );
    assert_eq!(
        s.clear_scope(&turn, MemorySource::system()).await.unwrap(),
        0
    );
    assert_eq!(s.get(&turn, &var("scratch")).await.unwrap(), None);
    assert!(
        s.get(&scope, &var("stat.str")).await.unwrap().is_some(),
        "other scopes untouched"
    );
}

/// Two chats and two characters never see each other's data.
pub async fn scopes_are_isolated(f: &Fixture) {
    let s = &f.store;
    let c1 = chat_scope("Mira", "chat 1");
    let c2 = chat_scope("Mira", "chat 2");
    let other = chat_scope("Kai", "chat 1");
    s.put(write("m", c1.clone(), "secret of chat one"), None, false)
        .await
        .unwrap();
    s.set(&c1, &var("x"), json!(1), None, src("i"))
        .await
        .unwrap();
    for scope in [&c2, &other] {
        let id = MemoryId::parse("m").unwrap();
        assert_eq!(s.read(&id, scope).await.unwrap(), None);
        assert!(s
            .search(&MemoryQuery::new("secret", vec![scope.clone()]))
            .await
            .unwrap()
            .hits
            .is_empty());
        assert_eq!(s.get(scope, &var("x")).await.unwrap(), None);
    }
    // The same id may exist independently in another scope.
    s.put(write("m", c2.clone(), "chat two"), None, false)
        .await
        .unwrap();
}

/// Concurrent binding updates both survive; a failing mutation writes nothing.
pub async fn state_updates_compose(f: &Fixture) {
    use tavern_core::{BindingTarget, SessionBinding};
    let (state, diags) = f.store.load_state().await.unwrap();
    assert!(state.bindings.is_empty() && diags.is_empty());
    let mut tasks = Vec::new();
    for i in 0..6 {
        let s = f.store.clone();
        tasks.push(tokio::spawn(async move {
            let mut m = |st: &mut tavern_core::TavernState| {
                let target = BindingTarget {
                    character: CharacterName::parse("Mira").unwrap(),
                    chat_id: ChatId::parse(format!("chat {i}")).unwrap(),
                    group: false,
                };
                let b = SessionBinding::new_for_chat(target, st);
                st.set_binding(SessionId::parse(format!("s{i}")).unwrap(), b);
                Verdict::Write
            };
            s.update_state(&mut m).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (state, _) = f.store.load_state().await.unwrap();
    assert_eq!(state.bindings.len(), 6, "no update lost");
    // A refusal writes nothing, even though the closure changed its copy.
    #[derive(Debug, PartialEq)]
    enum Refusal {
        Refused,
        Store(String),
    }
    impl From<StoreError> for Refusal {
        fn from(e: StoreError) -> Self {
            Self::Store(e.to_string())
        }
    }
    let refused: Result<(), Refusal> = f
        .store
        .update(|st: &mut tavern_core::TavernState| {
            st.bindings.clear();
            Err(Refusal::Refused)
        })
        .await;
    assert_eq!(refused, Err(Refusal::Refused));
    assert_eq!(f.store.load_state().await.unwrap().0, state);
    let mut keep = |st: &mut tavern_core::TavernState| {
        st.bindings.clear();
        Verdict::Keep
    };
    assert_eq!(f.store.update_state(&mut keep).await.unwrap(), state);
    assert_eq!(f.store.load_state().await.unwrap().0, state);
    // A typed result comes out of the update.
    let n: usize = f
        .store
        .update(|st: &mut tavern_core::TavernState| Ok::<_, StoreError>(st.bindings.len()))
        .await
        .unwrap();
    assert_eq!(n, 6);
    // A look without a copy sees the same state, and a binding alone is the same binding.
    let seen = f.store.read_state(|st| st.bindings.len()).await.unwrap();
    assert_eq!(seen, 6);
    let s3 = SessionId::parse("s3").unwrap();
    assert_eq!(
        f.store.binding(&s3).await.unwrap(),
        state.binding(&s3).cloned()
    );
}

/// Chats: create, append under CAS, conflicts on stale revisions, rewrite, list, back-link.
pub async fn chats(f: &Fixture) {
    let s = &f.store;
    let ch = CharacterName::parse("Mira").unwrap();
    let id = ChatId::parse("Mira - 2026-11-30@10h00m00s").unwrap();
    assert!(s.read_chat(&ch, &id).await.unwrap().is_none());
    let line = |raw: &str| ChatLine::parse(raw).unwrap();
    let header = line(r#"{"user_name":"Kai","character_name":"Mira","chat_metadata":{}}"#);
    let r0 = s
        .rewrite_chat(&ch, &id, std::slice::from_ref(&header), None)
        .await
        .unwrap();
    assert!(
        s.rewrite_chat(&ch, &id, std::slice::from_ref(&header), None)
            .await
            .is_err(),
        "create conflicts"
    );
    let m1 = line(r#"{"name":"Kai","is_user":true,"mes":"hi"}"#);
    let r1 = s
        .append_lines(&ch, &id, std::slice::from_ref(&m1), &r0)
        .await
        .unwrap();
    assert_ne!(r0, r1);
    let stale = s
        .append_lines(&ch, &id, std::slice::from_ref(&m1), &r0)
        .await
        .unwrap_err();
    assert!(matches!(stale, StoreError::Conflict { .. }), "{stale}");
    // Appending nothing changes nothing: the revision stays, and a stale one is still refused.
    assert_eq!(s.append_lines(&ch, &id, &[], &r1).await.unwrap(), r1);
    assert!(s.append_lines(&ch, &id, &[], &r0).await.is_err());
    // Lines are typed: what is not one JSON object on one line cannot even be offered.
    assert!(ChatLine::parse("not json").is_err());
    assert!(ChatLine::parse("{\"a\":1}\n{\"b\":2}").is_err());
    assert!(s.rewrite_chat(&ch, &id, &[], Some(&r1)).await.is_err());
    let file = s.read_chat(&ch, &id).await.unwrap().unwrap();
    assert_eq!(file.lines, [header.clone(), m1.clone()]);
    assert_eq!(file.revision, r1);
    assert_eq!(s.chat_revision(&ch, &id).await.unwrap(), Some(r1.clone()));

    let branch = ChatId::parse("Branch 1").unwrap();
    let bheader = line(r#"{"chat_metadata":{"main_chat":"Mira - 2026-11-30@10h00m00s"}}"#);
    s.rewrite_chat(&ch, &branch, &[bheader, m1.clone()], None)
        .await
        .unwrap();
    let bfile = s.read_chat(&ch, &branch).await.unwrap().unwrap();
    assert_eq!(bfile.parent_chat(), Some(id.clone()));
    assert_eq!(s.list_chats(&ch).await.unwrap(), [branch, id.clone()]);
    assert!(s
        .list_chats(&CharacterName::parse("Kai").unwrap())
        .await
        .unwrap()
        .is_empty());
    let r2 = s
        .rewrite_chat(&ch, &id, &[header], Some(&r1))
        .await
        .unwrap();
    assert_eq!(s.read_chat(&ch, &id).await.unwrap().unwrap().lines.len(), 1);
    assert_ne!(r2, r1);
}

/// A chat's first line comes back alone, blank lines before it skipped; no chat and an empty
/// chat have none.
pub async fn chat_heads(f: &Fixture) {
    let s = &f.store;
    let ch = CharacterName::parse("Mira").unwrap();
    let id = ChatId::parse("head").unwrap();
    assert_eq!(s.read_chat_head(&ch, &id).await.unwrap(), None);
    let header = ChatLine::parse(
        r#"{"user_name":"Kai","character_name":"Mira","chat_metadata":{"persona":"knight.png"}}"#,
    )
    .unwrap();
    let message = ChatLine::parse(r#"{"name":"Kai","is_user":true,"mes":"你好"}"#).unwrap();
    s.rewrite_chat(&ch, &id, &[header.clone(), message.clone()], None)
        .await
        .unwrap();
    assert_eq!(s.read_chat_head(&ch, &id).await.unwrap(), Some(header));
    let rev = s.chat_revision(&ch, &id).await.unwrap();
    s.rewrite_chat(&ch, &id, std::slice::from_ref(&message), rev.as_ref())
        .await
        .unwrap();
    assert_eq!(s.read_chat_head(&ch, &id).await.unwrap(), Some(message));
}

/// Chat revisions are the content's: the same lines give the same revision in every adapter
/// ([`ChatRevision::of_lines`]), whichever way they got there, and a revision issued for the
/// first lines of a chat (by any store) reads back as an append of the rest.
pub async fn chat_revisions_are_content(f: &Fixture) {
    let s = &f.store;
    let ch = CharacterName::parse("Mira").unwrap();
    let id = ChatId::parse("content").unwrap();
    let line = |raw: &str| ChatLine::parse(raw).unwrap();
    let all = [
        line(r#"{"user_name":"Kai","character_name":"Mira","chat_metadata":{}}"#),
        line(r#"{"name":"Kai","is_user":true,"mes":"你好，Mira"}"#),
        line(r#"{"name":"Mira","is_user":false,"mes":"hello"}"#),
    ];
    let r1 = s.rewrite_chat(&ch, &id, &all[..1], None).await.unwrap();
    assert_eq!(r1, ChatRevision::of_lines(&all[..1]));
    let r3 = s.append_lines(&ch, &id, &all[1..], &r1).await.unwrap();
    assert_eq!(r3, ChatRevision::of_lines(&all));
    assert_eq!(s.chat_revision(&ch, &id).await.unwrap(), Some(r3.clone()));
    assert_eq!(s.read_chat(&ch, &id).await.unwrap().unwrap().revision, r3);
    // Written whole under another name: the same lines, the same revision.
    let twin = ChatId::parse("twin").unwrap();
    assert_eq!(s.rewrite_chat(&ch, &twin, &all, None).await.unwrap(), r3);
    // A revision of the first two lines that this store never issued (another store did).
    let r2 = ChatRevision::of_lines(&all[..2]);
    match s.read_chat_since(&ch, &id, &r2).await.unwrap().unwrap() {
        ChatChange::Appended { lines, revision } => {
            assert_eq!(lines, all[2..]);
            assert_eq!(revision, r3);
        }
        other => panic!("expected an append of the last line, got {other:?}"),
    }
    assert_eq!(
        s.read_chat_since(&ch, &id, &r3).await.unwrap(),
        Some(ChatChange::Unchanged)
    );
    // Content the chat never began with: the whole chat.
    let other = ChatRevision::of_lines(&all[1..2]);
    assert!(matches!(
        s.read_chat_since(&ch, &id, &other).await.unwrap(),
        Some(ChatChange::Whole(file)) if file.lines == all && file.revision == r3
    ));
    // Text that is no revision at all (an older format): the whole chat.
    assert!(matches!(
        s.read_chat_since(&ch, &id, &ChatRevision::new("c1-12-34-56-ab")).await.unwrap(),
        Some(ChatChange::Whole(file)) if file.revision == r3
    ));
    // Back to earlier content: its revision again, and an append on it is current.
    assert_eq!(
        s.rewrite_chat(&ch, &id, &all[..1], Some(&r3))
            .await
            .unwrap(),
        r1
    );
    assert_eq!(s.append_lines(&ch, &id, &all[1..], &r1).await.unwrap(), r3);
    assert!(matches!(
        s.append_lines(&ch, &id, &all[1..], &r1).await,
        Err(StoreError::Conflict { .. })
    ));
}

/// Checkpoints round-trip and pending ones are listed.
pub async fn checkpoints(f: &Fixture) {
    let s = &f.store;
    let sid = SessionId::parse("s1").unwrap();
    assert_eq!(s.load_checkpoint(&sid).await.unwrap(), None);
    let mut cp = ProjectorCheckpoint {
        session_id: sid.clone(),
        last_cursor: Some(4),
        status: CheckpointStatus::Ok,
        pending_cursor: None,
        error: None,
        chat_revision: Some("c".into()),
        turn: 2,
        step: 1,
        updated_at: T0,
    };
    s.save_checkpoint(&cp, None).await.unwrap();
    assert_eq!(s.load_checkpoint(&sid).await.unwrap(), Some(cp.clone()));
    assert!(s.pending_checkpoints().await.unwrap().is_empty());
    // Compare-and-set: a save from a stale view is refused and changes nothing.
    let stale = s.save_checkpoint(&cp, None).await.unwrap_err();
    assert!(stale.is_conflict(), "{stale}");
    let mut behind = cp.clone();
    behind.last_cursor = Some(2);
    assert!(s
        .save_checkpoint(&behind, Some(&behind))
        .await
        .unwrap_err()
        .is_conflict());
    assert_eq!(s.load_checkpoint(&sid).await.unwrap(), Some(cp.clone()));
    let previous = cp.clone();
    cp.status = CheckpointStatus::Pending;
    cp.pending_cursor = Some(5);
    cp.error = Some("disk full".into());
    s.save_checkpoint(&cp, Some(&previous)).await.unwrap();
    assert_eq!(s.pending_checkpoints().await.unwrap(), [cp]);
}

/// Prompts: one per session, literal braces, blank save resets, limits, isolation.
pub async fn prompts(f: &Fixture) {
    let s = &f.store;
    let a = SessionId::parse("s-a").unwrap();
    let b = SessionId::parse("s-b").unwrap();
    let saved = s
        .save_prompt(&a, "You are {{char}}, talking to {{user}}.")
        .await
        .unwrap();
    assert_eq!(
        saved.unwrap().text,
        "You are {{char}}, talking to {{user}}."
    );
    assert_eq!(
        s.get_prompt(&b).await.unwrap(),
        None,
        "other sessions untouched"
    );
    assert_eq!(s.save_prompt(&a, "   ").await.unwrap(), None);
    assert_eq!(s.get_prompt(&a).await.unwrap(), None, "blank save resets");
    s.save_prompt(&a, "x").await.unwrap();
    assert!(s.reset_prompt(&a).await.unwrap());
    assert!(!s.reset_prompt(&a).await.unwrap());
    let err = s
        .save_prompt(&a, &"z".repeat(crate::prompt::PROMPT_MAX_BYTES + 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("system prompt bytes"), "{err}");
    assert_eq!(
        s.get_prompt(&a).await.unwrap(),
        None,
        "a failed save changes nothing"
    );
}

/// Everything written is there after reopening (durable adapters only).
pub async fn survives_reopen(f: &Fixture) {
    let Some(reopen) = &f.reopen else { return };
    let s = &f.store;
    let scope = agent("a1");
    let m = s
        .put(
            write("keep", scope.clone(), "kept across restarts"),
            None,
            false,
        )
        .await
        .unwrap();
    let v = s
        .set(&scope, &var("当前周期"), json!(3), None, src("r"))
        .await
        .unwrap();
    s.save_prompt(&SessionId::parse("s1").unwrap(), "p")
        .await
        .unwrap();
    let again = reopen();
    assert_eq!(
        MemoryStore::read(&*again, &m.id, &scope)
            .await
            .unwrap()
            .unwrap()
            .revision,
        m.revision
    );
    assert_eq!(
        again.get(&scope, &var("当前周期")).await.unwrap().unwrap(),
        v
    );
    assert_eq!(
        again
            .search(&MemoryQuery::new("restarts", vec![scope.clone()]))
            .await
            .unwrap()
            .hits
            .len(),
        1
    );
    // The first instance sees writes made through the second.
    again
        .set(
            &scope,
            &var("当前周期"),
            json!(4),
            Some(&v.revision),
            src("r2"),
        )
        .await
        .unwrap();
    assert_eq!(
        s.get(&scope, &var("当前周期"))
            .await
            .unwrap()
            .unwrap()
            .value,
        json!(4)
    );
}

/// Generates one `#[tokio::test]` per conformance check for an adapter. `$make` is an
/// expression producing a [`Fixture`].
#[macro_export]
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::store_conformance_tests!(@each $make;
            memory_crud_and_cas, memory_concurrent_cas_exactly_one_wins,
            variable_concurrent_increments_lose_nothing, memory_ttl, memory_access_time,
            memory_search, variables_cas, variables_patch_atomic, variables_limits_list_clear,
            scopes_are_isolated, state_updates_compose, chats, chat_revisions_are_content, chat_heads,
            checkpoints, prompts,
            survives_reopen, memory_history_texts, memory_prepared_search_encodes_outside_the_lock);
    };
    (@each $make:expr; $($check:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $check() {
            let fixture = $make;
            $crate::conformance::$check(&fixture).await;
        }
    )*};
}
