//! When the projection checkpoint is saved: a turn of hundreds of streamed chunks costs one
//! save per written batch of lines plus one at the turn's end, not one per event; and a crash
//! at any event (the cursor that silent events moved in memory is lost) still ends, after a
//! replay of the host's log, with every line exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use tavern_core::chat::ChatLine;
use tavern_core::{normalize_state, CharacterName, ChatId, SessionBinding, SessionId, Timestamp};
use tavern_projector::event::{EventKind, TurnEndReason, UserSource};
use tavern_projector::{ChatProjector, HostEvent, ProjectorConfig};
use tavern_store::clock::ManualClock;
use tavern_store::mem::MemStore;
use tavern_store::{ChatStore, CheckpointStore, ProjectorCheckpoint, StoreError};

/// The memory store, counting checkpoint saves.
struct Counting {
    inner: Arc<MemStore>,
    saves: AtomicUsize,
}

#[async_trait]
impl CheckpointStore for Counting {
    async fn load_checkpoint(
        &self,
        session: &SessionId,
    ) -> Result<Option<ProjectorCheckpoint>, StoreError> {
        self.inner.load_checkpoint(session).await
    }

    async fn save_checkpoint(
        &self,
        checkpoint: &ProjectorCheckpoint,
        expected: Option<&ProjectorCheckpoint>,
    ) -> Result<(), StoreError> {
        self.saves.fetch_add(1, Ordering::SeqCst);
        self.inner.save_checkpoint(checkpoint, expected).await
    }

    async fn pending_checkpoints(&self) -> Result<Vec<ProjectorCheckpoint>, StoreError> {
        self.inner.pending_checkpoints().await
    }
}

fn session() -> SessionId {
    SessionId::parse("s1").unwrap()
}

fn binding() -> SessionBinding {
    let (state, _) = normalize_state(
        &serde_json::json!({"sessionBindings": {"s1": {"character": "Mira", "chatId": "Mira - 1", "architecture": "agent-tavern", "contextMode": "dsh-native"}}}),
    );
    state.binding(&session()).unwrap().clone()
}

/// A DSH-like turn: the user's message, a step streaming `chunks` chunks into a tool call, its
/// result, then a step streaming `chunks` chunks into the final reply.
fn turn(turn: u64, first: u64, chunks: usize) -> Vec<HostEvent> {
    let mut kinds = vec![
        EventKind::TurnStart { turn },
        EventKind::UserMessage {
            source: UserSource::User,
            text: format!("question {turn}"),
        },
        EventKind::StepStart { turn, step: 1 },
    ];
    kinds.extend((0..chunks).map(|_| EventKind::Known("assistant/chunk".into())));
    kinds.extend([
        EventKind::AssistantMessage {
            turn,
            step: 1,
            text: String::new(),
            has_tool_calls: true,
            interrupted: false,
        },
        EventKind::ToolCall { turn, step: 1 },
        EventKind::Known("tool/result".into()),
        EventKind::StepEnd { turn, step: 1 },
        EventKind::StepStart { turn, step: 2 },
    ]);
    kinds.extend((0..chunks).map(|_| EventKind::Known("assistant/chunk".into())));
    kinds.extend([
        EventKind::AssistantMessage {
            turn,
            step: 2,
            text: format!("answer {turn}"),
            has_tool_calls: false,
            interrupted: false,
        },
        EventKind::StepEnd { turn, step: 2 },
        EventKind::TurnEnd {
            turn,
            reason: TurnEndReason::Completed,
        },
    ]);
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| HostEvent {
            seq: first + i as u64,
            time: 1_700_000_000_000,
            kind,
        })
        .collect()
}

fn projector(store: &Arc<Counting>, every_event: bool) -> ChatProjector {
    let config = ProjectorConfig {
        checkpoint_every_event: every_event,
        ..ProjectorConfig::new("Kai")
    };
    ChatProjector::new(
        store.inner.clone(),
        store.clone(),
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
        config,
    )
}

fn store() -> Arc<Counting> {
    Arc::new(Counting {
        inner: Arc::new(MemStore::new(Arc::new(ManualClock::new(Timestamp(
            1_700_000_000_000,
        ))))),
        saves: AtomicUsize::new(0),
    })
}

async fn messages(store: &Counting) -> Vec<String> {
    let file = store
        .inner
        .read_chat(
            &CharacterName::parse("Mira").unwrap(),
            &ChatId::parse("Mira - 1").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    file.lines
        .iter()
        .skip(1)
        .map(ChatLine::text)
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_streamed_turn_saves_the_checkpoint_per_written_batch_and_at_its_end() {
    let events = turn(1, 0, 300);
    let (quiet, every) = (store(), store());
    let (p, baseline) = (projector(&quiet, false), projector(&every, true));
    let mut written = 0;
    for e in &events {
        written += p
            .on_event(&session(), &binding(), e.clone())
            .await
            .unwrap()
            .appended;
        baseline
            .on_event(&session(), &binding(), e.clone())
            .await
            .unwrap();
    }
    assert_eq!(written, 2, "the question and the answer");
    let saves = quiet.saves.load(Ordering::SeqCst);
    assert!(
        saves <= written + 1,
        "{saves} checkpoint saves for {written} lines written"
    );
    // The old behaviour, measured the same way: a save for every event.
    assert!(every.saves.load(Ordering::SeqCst) >= events.len() - 1);
    assert_eq!(messages(&quiet).await, messages(&every).await);
    // Nothing is left ahead of the saved checkpoint once the turn is over.
    assert_eq!(p.sessions_ahead(), 0);
    let saved = quiet.load_checkpoint(&session()).await.unwrap().unwrap();
    assert_eq!(saved.last_cursor, Some(events.len() as u64 - 1));
}

#[tokio::test]
async fn a_crash_at_any_event_loses_and_repeats_nothing_after_a_replay() {
    let mut log = turn(1, 0, 12);
    log.extend(turn(2, log.len() as u64, 12));
    let expected = ["question 1", "answer 1", "question 2", "answer 2"];
    for crash in 0..=log.len() {
        let store = store();
        {
            let p = projector(&store, false);
            for e in &log[..crash] {
                p.on_event(&session(), &binding(), e.clone()).await.unwrap();
            }
            // Dropped here: what silent events moved in memory is gone, as in a SIGKILL.
        }
        let p = projector(&store, false);
        let after = p.cursor(&session()).await.unwrap();
        let rest: Vec<HostEvent> = log
            .iter()
            .filter(|e| after.is_none_or(|c| e.seq > c))
            .cloned()
            .collect();
        p.replay(&session(), &binding(), rest).await.unwrap();
        assert_eq!(
            messages(&store).await,
            expected,
            "crash after {crash} events"
        );
        // A second replay of the whole log changes nothing.
        let again = p.replay(&session(), &binding(), log.clone()).await.unwrap();
        assert_eq!(again.appended, 0, "crash after {crash} events");
    }
}

#[tokio::test]
async fn another_projectors_save_behind_unsaved_progress_stalls_nothing() {
    let store = store();
    let (a, b) = (projector(&store, false), projector(&store, false));
    let mut log = turn(1, 0, 4);
    log.extend(turn(2, log.len() as u64, 4));
    let first_turn = log.len() / 2;
    // A projects turn 1 (saved at its end) and half of turn 2 (in memory only).
    let mid = first_turn + 6;
    for e in &log[..mid] {
        a.on_event(&session(), &binding(), e.clone()).await.unwrap();
    }
    assert_eq!(a.sessions_ahead(), 1);
    // Meanwhile another process finds an unreadable event and saves the session pending at
    // the stored cursor, behind A's progress.
    b.report_unreadable(&session(), "an event could not be read")
        .await
        .unwrap();
    let pending = store.load_checkpoint(&session()).await.unwrap().unwrap();
    assert_eq!(pending.last_cursor, Some(first_turn as u64 - 1));
    // A goes on from where it was (its buffer no longer holds what it decided), finishes the
    // turn, and the stored checkpoint ends past the pending gap, no longer pending.
    for e in &log[mid..] {
        a.on_event(&session(), &binding(), e.clone()).await.unwrap();
    }
    assert_eq!(
        messages(&store).await,
        ["question 1", "answer 1", "question 2", "answer 2"]
    );
    let saved = store.load_checkpoint(&session()).await.unwrap().unwrap();
    assert_eq!(saved.last_cursor, Some(log.len() as u64 - 1));
    assert_eq!(
        saved.status,
        tavern_store::CheckpointStatus::Ok,
        "{saved:?}"
    );
    assert!(a.pending().await.unwrap().is_empty());
}
