//! The chat projector: host events → SillyTavern JSONL lines, exactly once.
//!
//! Every line carries `extra.agentTavern {sessionId, eventSeq, turn, step, architecture,
//! contextMode}`; `(sessionId, eventSeq)` is the idempotency key. A checkpoint per session
//! records the last decided seq and the chat revision after our last write. When the chat is
//! still at that revision, lines are appended without reading the file (cost independent of
//! the chat's length); otherwise (a restart between write and checkpoint, another writer) the
//! chat is re-read, lines already present are skipped, and the append is retried under the
//! chat's revision check. The projector only appends, so another writer's lines survive.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use tavern_core::chat::ChatLine;
use tavern_core::{SessionBinding, SessionId};
use tavern_store::{
    ChatRevision, ChatStore, CheckpointStatus, CheckpointStore, Clock, ProjectorCheckpoint,
    StoreError,
};
use thiserror::Error;

use crate::event::{EventKind, HostEvent};
use crate::lines;
use crate::plan::{plan, PlannedLine, Position};

/// Attempts at appending when the chat keeps changing under us.
const APPEND_ATTEMPTS: usize = 5;

/// Most events kept waiting behind a missing one, per session.
pub const MAX_WAITING_EVENTS: usize = 1024;

/// Attempts at a projection step when other projectors of the session keep moving its
/// checkpoint.
const CHECKPOINT_ATTEMPTS: usize = 8;

/// Whether two checkpoints differ only in when they were written (nothing to save).
fn same_but_time(a: &ProjectorCheckpoint, b: &ProjectorCheckpoint) -> bool {
    ProjectorCheckpoint {
        updated_at: a.updated_at,
        ..b.clone()
    } == *a
}

/// How a projection step ended.
enum Step {
    /// It finished (well or not); the checkpoint says so.
    Done(Result<Outcome, ProjectorError>),
    /// The checkpoint changed under it; redo from the new one.
    Stale,
}

/// Why a projection did not complete. The checkpoint is then `pending` with this error and a
/// replay from the host log fills the gap.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProjectorError {
    /// The chat or checkpoint store failed.
    #[error("projection of session {session} failed: {source}")]
    Store {
        /// The session.
        session: String,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// An unknown, non-ignorable event stopped the projection.
    #[error("projection of session {session} is blocked: {reason}")]
    Blocked {
        /// The session.
        session: String,
        /// Which event.
        reason: String,
    },
    /// The chat changed on every attempt.
    #[error(
        "projection of session {session} gave up after {attempts} attempts: the chat kept changing"
    )]
    Contended {
        /// The session.
        session: String,
        /// How many attempts.
        attempts: usize,
    },
}

/// What one projection call did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Lines appended to the chat.
    pub appended: usize,
    /// Planned lines found already in the chat (written before a restart).
    pub already_present: usize,
    /// The checkpoint cursor afterwards.
    pub cursor: Option<u64>,
    /// Events held back: a gap in the seqs, or an assistant message whose step has not ended.
    pub waiting: usize,
}

/// Names used in projected lines, and when the checkpoint is made durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectorConfig {
    /// The user's display name for user lines and new chat headers.
    pub user_name: String,
    /// Save the checkpoint after every event (streamed chunks, reasoning and tool results
    /// included). Off by default: the checkpoint is saved at every turn's end and whenever its
    /// status is or was pending, and in between moves in memory only — after a crash the
    /// replay re-reads the chat and skips the lines already there, so exactly-once never
    /// depends on a checkpoint being current. On measures the old behaviour in benchmarks.
    pub checkpoint_every_event: bool,
}

/// Who speaks in a chat's projected lines: the names SillyTavern writes in each line's `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speakers {
    /// The user's line name (the chat's persona).
    pub user: String,
    /// The character's line name (the card's display name, not its file name).
    pub character: String,
}

/// Resolves a chat's [`Speakers`] when lines are written (once per append). A continued
/// SillyTavern chat names its character by the card's `name` (`Seraphina`), which may differ
/// from the card's file (`default_Seraphina`), and its user by the chat's persona.
#[async_trait::async_trait]
pub trait SpeakerNames: Send + Sync {
    /// The names for lines of `binding`'s chat. Never fails: a name it cannot resolve falls
    /// back to what the projector would use alone.
    async fn speakers(&self, binding: &SessionBinding) -> Speakers;
}

impl ProjectorConfig {
    /// Settings with `user_name` and the defaults.
    pub fn new(user_name: impl Into<String>) -> Self {
        Self {
            user_name: user_name.into(),
            checkpoint_every_event: false,
        }
    }
}

/// What this projector knows of a session's checkpoint: the stored one as it last read or
/// saved it, and the one it continues from — ahead of the stored one while a turn is in
/// progress, the same once saved.
#[derive(Debug, Clone)]
struct Known {
    stored: Option<ProjectorCheckpoint>,
    ahead: ProjectorCheckpoint,
    /// A save found another projector's checkpoint: load and compare before trusting this.
    unsure: bool,
}

impl Known {
    /// Whether nothing of it is unsaved.
    fn clean(&self) -> bool {
        self.stored.as_ref() == Some(&self.ahead)
    }
}

/// Most saved ("clean") checkpoints kept known per projector; past it they are forgotten (and
/// loaded again when their session has events). Unsaved progress is never forgotten.
pub const KNOWN_CHECKPOINTS: usize = 4096;

/// Projects host events into SillyTavern chats.
pub struct ChatProjector {
    chats: Arc<dyn ChatStore>,
    checkpoints: Arc<dyn CheckpointStore>,
    clock: Arc<dyn Clock>,
    config: ProjectorConfig,
    buffers: Mutex<HashMap<SessionId, BTreeMap<u64, HostEvent>>>,
    /// One projection step at a time per session (events of a session may arrive from
    /// several threads).
    gates: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
    /// Checkpoints as this projector knows them: unsaved progress of sessions mid-turn (saved
    /// at the latest at turn end), and recently saved ones, so an event costs no checkpoint
    /// read (a save's compare-and-set still catches another projector of the session).
    known: Mutex<HashMap<SessionId, Known>>,
    /// Names for projected lines; `None`: the configured user name and the character id.
    speakers: Option<Arc<dyn SpeakerNames>>,
}

impl std::fmt::Debug for ChatProjector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatProjector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ChatProjector {
    /// A projector over the given stores.
    pub fn new(
        chats: Arc<dyn ChatStore>,
        checkpoints: Arc<dyn CheckpointStore>,
        clock: Arc<dyn Clock>,
        config: ProjectorConfig,
    ) -> Self {
        Self {
            chats,
            checkpoints,
            clock,
            config,
            buffers: Mutex::default(),
            gates: Mutex::default(),
            known: Mutex::default(),
            speakers: None,
        }
    }

    /// Lines name their speakers as `names` resolves them (default: the configured user
    /// name and the binding's character id).
    #[must_use]
    pub fn with_speaker_names(mut self, names: Arc<dyn SpeakerNames>) -> Self {
        self.speakers = Some(names);
        self
    }

    async fn speakers(&self, binding: &SessionBinding) -> Speakers {
        match &self.speakers {
            Some(names) => names.speakers(binding).await,
            None => Speakers {
                user: self.config.user_name.clone(),
                character: binding.target().character.to_string(),
            },
        }
    }

    /// The checkpoint to continue from, given the stored one just loaded: what this projector
    /// knows when the store still holds what it last read or saved; else — another projector
    /// of the session saved since — whichever of the two decided further (ours with its chat
    /// revision forgotten, so the next append reads the chat and skips lines already there).
    fn effective(
        &self,
        session: &SessionId,
        stored: Option<ProjectorCheckpoint>,
    ) -> Option<ProjectorCheckpoint> {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(k) = known.get(session) else {
            return stored;
        };
        if k.stored == stored {
            return Some(k.ahead.clone());
        }
        let ours = k.ahead.clone();
        let winner = if stored.as_ref().map(|s| s.last_cursor) >= Some(ours.last_cursor) {
            stored.clone()
        } else {
            Some(ProjectorCheckpoint {
                chat_revision: None,
                ..ours
            })
        };
        match &winner {
            Some(w) => {
                known.insert(
                    session.clone(),
                    Known {
                        stored,
                        ahead: w.clone(),
                        unsure: false,
                    },
                );
            }
            None => {
                known.remove(session);
            }
        }
        winner
    }

    /// What this projector knows of a session's checkpoint without asking the store:
    /// `(stored, continue from)`, unless a save found another projector's (or every event is
    /// saved, which always reads first).
    fn trusted(
        &self,
        session: &SessionId,
    ) -> Option<(Option<ProjectorCheckpoint>, ProjectorCheckpoint)> {
        if self.config.checkpoint_every_event {
            return None;
        }
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known
            .get(session)
            .filter(|k| !k.unsure)
            .map(|k| (k.stored.clone(), k.ahead.clone()))
    }

    /// The last decided seq of a session, counting what is not saved yet: what a replay
    /// needs to read after.
    ///
    /// # Errors
    /// Store failures.
    pub async fn cursor(&self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        if let Some((_, ahead)) = self.trusted(session) {
            return Ok(ahead.last_cursor);
        }
        let stored = self.checkpoints.load_checkpoint(session).await?;
        Ok(self.effective(session, stored).and_then(|c| c.last_cursor))
    }

    /// A session's checkpoint as this projector knows it, counting what is decided but not
    /// saved yet (what a status page should show; the stored one may lag a few events).
    ///
    /// # Errors
    /// Store failures.
    pub async fn checkpoint(
        &self,
        session: &SessionId,
    ) -> Result<Option<ProjectorCheckpoint>, StoreError> {
        if let Some((_, ahead)) = self.trusted(session) {
            return Ok(Some(ahead));
        }
        let stored = self.checkpoints.load_checkpoint(session).await?;
        Ok(self.effective(session, stored))
    }

    /// Sessions whose checkpoint moved ahead of the saved one (bounded-memory checks).
    pub fn sessions_ahead(&self) -> usize {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|k| !k.clean())
            .count()
    }

    /// Records where a session continues from over the stored checkpoint `stored`; saved
    /// ones beyond [`KNOWN_CHECKPOINTS`] are forgotten.
    fn remember(
        &self,
        session: &SessionId,
        stored: Option<ProjectorCheckpoint>,
        ahead: ProjectorCheckpoint,
    ) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= KNOWN_CHECKPOINTS && !known.contains_key(session) {
            known.retain(|_, k| !k.clean());
        }
        known.insert(
            session.clone(),
            Known {
                stored,
                ahead,
                unsure: false,
            },
        );
    }

    /// A save of the session's checkpoint met another projector's: read it before going on.
    fn unsure(&self, session: &SessionId) {
        if let Some(k) = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(session)
        {
            k.unsure = true;
        }
    }

    fn store_err(session: &SessionId) -> impl Fn(StoreError) -> ProjectorError + '_ {
        move |source| ProjectorError::Store {
            session: session.to_string(),
            source,
        }
    }

    /// Feeds one live event. Duplicates and events at or before the cursor are ignored;
    /// events after a gap wait until the gap is filled (by later delivery or [`Self::replay`]).
    ///
    /// # Errors
    /// [`ProjectorError`]; the checkpoint is then pending with the error.
    pub async fn on_event(
        &self,
        session: &SessionId,
        binding: &SessionBinding,
        event: HostEvent,
    ) -> Result<Outcome, ProjectorError> {
        self.feed(session, binding, vec![event]).await
    }

    /// Feeds events read from the host log (after a restart, or to fill a pending gap): only
    /// what is not projected yet is written.
    ///
    /// # Errors
    /// As [`Self::on_event`].
    pub async fn replay(
        &self,
        session: &SessionId,
        binding: &SessionBinding,
        events: Vec<HostEvent>,
    ) -> Result<Outcome, ProjectorError> {
        self.feed(session, binding, events).await
    }

    /// Records that an event of the session could not be read (the host's envelope was not
    /// understood): the projection is pending with `reason` at the next cursor, so `status`
    /// shows it and a replay from the host's log can fill it — never a silent gap.
    ///
    /// # Errors
    /// Store failures.
    pub async fn report_unreadable(
        &self,
        session: &SessionId,
        reason: &str,
    ) -> Result<(), ProjectorError> {
        let gate = self.gate(session);
        let guard = gate.lock().await;
        let out = self
            .mark_pending(session, &format!("an event could not be read: {reason}"))
            .await;
        drop(guard);
        self.release(session, &gate);
        out
    }

    /// The session's gate (one projection step at a time).
    fn gate(&self, session: &SessionId) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        gates.entry(session.clone()).or_default().clone()
    }

    /// Forgets the gate and an empty buffer when nobody else is waiting on this session, so
    /// both maps stay as small as the sessions in flight.
    fn release(&self, session: &SessionId, gate: &Arc<tokio::sync::Mutex<()>>) {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        if Arc::strong_count(gate) == 2 {
            gates.remove(session);
            let mut buffers = self.buffers.lock().unwrap_or_else(PoisonError::into_inner);
            if buffers.get(session).is_some_and(BTreeMap::is_empty) {
                buffers.remove(session);
            }
        }
    }

    /// Makes the session's projection pending at its next cursor with `error` (under its
    /// gate), so `status` shows it until a replay moves past it.
    async fn mark_pending(&self, session: &SessionId, error: &str) -> Result<(), ProjectorError> {
        let err = Self::store_err(session);
        for _ in 0..CHECKPOINT_ATTEMPTS {
            let stored = self
                .checkpoints
                .load_checkpoint(session)
                .await
                .map_err(&err)?;
            let current = self.effective(session, stored.clone());
            let cursor = current.as_ref().and_then(|c| c.last_cursor);
            let next = ProjectorCheckpoint {
                session_id: session.clone(),
                last_cursor: cursor,
                status: CheckpointStatus::Pending,
                pending_cursor: Some(cursor.map_or(0, |c| c + 1)),
                error: Some(error.to_owned()),
                chat_revision: current.as_ref().and_then(|c| c.chat_revision.clone()),
                turn: current.as_ref().map_or(0, |c| c.turn),
                step: current.as_ref().map_or(0, |c| c.step),
                updated_at: self.clock.now(),
            };
            match self
                .checkpoints
                .save_checkpoint(&next, stored.as_ref())
                .await
            {
                Ok(()) => {
                    self.remember(session, Some(next.clone()), next);
                    return Ok(());
                }
                Err(e) if e.is_conflict() => {
                    self.unsure(session);
                    continue;
                }
                Err(e) => return Err(err(e)),
            }
        }
        Err(ProjectorError::Contended {
            session: session.to_string(),
            attempts: CHECKPOINT_ATTEMPTS,
        })
    }

    /// Sessions whose projection is pending (failed and waiting for a replay).
    ///
    /// # Errors
    /// Store failures.
    pub async fn pending(&self) -> Result<Vec<ProjectorCheckpoint>, StoreError> {
        self.checkpoints.pending_checkpoints().await
    }

    /// Runs one feed under the session's gate: one projection step at a time per session in
    /// this process, and checkpoint compare-and-set across processes; a step that finds the
    /// checkpoint moved on (another projector of the session) is redone from the new one.
    async fn feed(
        &self,
        session: &SessionId,
        binding: &SessionBinding,
        events: Vec<HostEvent>,
    ) -> Result<Outcome, ProjectorError> {
        let gate = self.gate(session);
        let guard = gate.lock().await;
        let overflow = {
            let mut buffers = self.buffers.lock().unwrap_or_else(PoisonError::into_inner);
            let buf = buffers.entry(session.clone()).or_default();
            for e in events {
                buf.entry(e.seq).or_insert(e);
            }
            // Events waiting behind a missing one are kept up to a bound; past it the newest
            // are dropped (the host's log still has them) and the gap is reported.
            let mut dropped = None;
            while buf.len() > MAX_WAITING_EVENTS {
                dropped = buf.pop_last().map(|(seq, _)| seq);
            }
            dropped
        };
        let mut outcome = Err(ProjectorError::Contended {
            session: session.to_string(),
            attempts: CHECKPOINT_ATTEMPTS,
        });
        for _ in 0..CHECKPOINT_ATTEMPTS {
            match self.step(session, binding).await {
                Step::Stale => continue,
                Step::Done(result) => {
                    outcome = result;
                    break;
                }
            }
        }
        if let (Some(seq), Ok(o)) = (overflow, &outcome) {
            if o.waiting >= MAX_WAITING_EVENTS {
                let reason = format!(
                    "more than {MAX_WAITING_EVENTS} events wait behind a missing one (the latest dropped was seq {seq}); replay the host's log to fill the gap"
                );
                outcome = self
                    .mark_pending(session, &reason)
                    .await
                    .map(|()| o.clone());
            }
        }
        drop(guard);
        self.release(session, &gate);
        outcome
    }

    /// One projection step from the stored checkpoint over the buffered events.
    async fn step(&self, session: &SessionId, binding: &SessionBinding) -> Step {
        let (stored, checkpoint) = match self.trusted(session) {
            Some((stored, ahead)) => (stored, Some(ahead)),
            None => match self.checkpoints.load_checkpoint(session).await {
                Ok(stored) => {
                    let checkpoint = self.effective(session, stored.clone());
                    if let (Some(c), None) = (&checkpoint, self.trusted(session)) {
                        self.remember(session, stored.clone(), c.clone());
                    }
                    (stored, checkpoint)
                }
                Err(e) => return Step::Done(Err(Self::store_err(session)(e))),
            },
        };
        let cursor = checkpoint.as_ref().and_then(|c| c.last_cursor);
        let batch: Vec<HostEvent> = {
            let mut buffers = self.buffers.lock().unwrap_or_else(PoisonError::into_inner);
            let buf = buffers.entry(session.clone()).or_default();
            buf.retain(|seq, _| cursor.is_none_or(|c| *seq > c));
            let mut next = cursor.map_or(0, |c| c + 1);
            let mut run = Vec::new();
            while let Some(e) = buf.get(&next) {
                run.push(e.clone());
                next += 1;
            }
            run
        };
        let start = checkpoint
            .as_ref()
            .map_or(Position::default(), |c| Position {
                turn: c.turn,
                step: c.step,
            });
        let planned = plan(&batch, start);
        let result = match &planned.blocked {
            Some(reason) if planned.lines.is_empty() && planned.cursor.is_none() => {
                Err(ProjectorError::Blocked {
                    session: session.to_string(),
                    reason: reason.clone(),
                })
            }
            _ => {
                self.write(session, binding, &planned.lines, checkpoint.as_ref())
                    .await
            }
        };
        let new_cursor = planned.cursor.or(cursor);
        let (status, error, pending_cursor, chat_revision, written) = match &result {
            Ok((rev, appended, present)) => {
                let blocked = planned.blocked.clone();
                (
                    if blocked.is_some() {
                        CheckpointStatus::Pending
                    } else {
                        CheckpointStatus::Ok
                    },
                    blocked.clone(),
                    blocked.map(|_| new_cursor.map_or(0, |c| c + 1)),
                    rev.clone()
                        .or_else(|| checkpoint.as_ref().and_then(|c| c.chat_revision.clone())),
                    Some((*appended, *present)),
                )
            }
            Err(e) => (
                CheckpointStatus::Pending,
                Some(e.to_string()),
                Some(cursor.map_or(0, |c| c + 1)),
                checkpoint.as_ref().and_then(|c| c.chat_revision.clone()),
                None,
            ),
        };
        let advanced = if written.is_some() {
            new_cursor
        } else {
            cursor
        };
        let position = if written.is_some() {
            planned.position
        } else {
            start
        };
        let mut next = ProjectorCheckpoint {
            session_id: session.clone(),
            last_cursor: advanced,
            status,
            pending_cursor,
            error,
            chat_revision,
            turn: position.turn,
            step: position.step,
            updated_at: self.clock.now(),
        };
        // A pending gap clears only when the cursor moves past it, not because a later event
        // arrived that has to wait behind it.
        if let Some(prev) = checkpoint
            .as_ref()
            .filter(|c| c.status == CheckpointStatus::Pending && advanced == cursor)
        {
            if next.status == CheckpointStatus::Ok {
                next.status = CheckpointStatus::Pending;
                next.error.clone_from(&prev.error);
                next.pending_cursor = prev.pending_cursor;
            }
        }
        let changed = checkpoint.as_ref() != Some(&next)
            && !(checkpoint.as_ref().is_some_and(|c| same_but_time(c, &next)));
        // Saved at turn end and whenever the status is or was pending; in between, the
        // cursor, position and chat revision move in memory only. A crash loses at most the
        // turn's progress since the last save: the replay re-reads the chat (its revision is
        // then not ours) and skips the lines already there, so exactly-once never rests on it.
        let deferred = !self.config.checkpoint_every_event
            && written.is_some()
            && next.status == CheckpointStatus::Ok
            && stored
                .as_ref()
                .is_none_or(|s| s.status == CheckpointStatus::Ok)
            && !batch
                .iter()
                .take_while(|e| advanced.is_some_and(|c| e.seq <= c))
                .any(|e| matches!(e.kind, EventKind::TurnEnd { .. }));
        // What the store holds is not what this step decided (ignoring when): saved unless
        // deferred — also when this projector knew it all along but another projector's save
        // came between (a redo after a conflict).
        let unsaved = stored
            .as_ref()
            .is_none_or(|s| s != &next && !same_but_time(s, &next));
        if deferred {
            if changed {
                self.remember(session, stored.clone(), next);
            }
        } else if changed || unsaved {
            match self
                .checkpoints
                .save_checkpoint(&next, stored.as_ref())
                .await
            {
                Ok(()) => self.remember(session, Some(next.clone()), next),
                // Another projector of this session moved the checkpoint: what we wrote to the
                // chat is deduplicated when the step is redone from its checkpoint (or ours,
                // if ours decided further).
                Err(e) if e.is_conflict() => {
                    self.unsure(session);
                    return Step::Stale;
                }
                Err(e) => return Step::Done(Err(Self::store_err(session)(e))),
            }
        }
        let waiting = {
            let mut buffers = self.buffers.lock().unwrap_or_else(PoisonError::into_inner);
            let buf = buffers.entry(session.clone()).or_default();
            buf.retain(|seq, _| advanced.is_none_or(|c| *seq > c));
            buf.len()
        };
        Step::Done(match (result, planned.blocked) {
            (Err(e), _) => Err(e),
            (Ok(_), Some(reason)) => Err(ProjectorError::Blocked {
                session: session.to_string(),
                reason,
            }),
            (Ok((_, appended, already_present)), None) => Ok(Outcome {
                appended,
                already_present,
                cursor: advanced,
                waiting,
            }),
        })
    }

    fn line_for(
        session: &SessionId,
        binding: &SessionBinding,
        names: &Speakers,
        p: &PlannedLine,
    ) -> ChatLine {
        let speaker = if p.is_user {
            names.user.as_str()
        } else {
            names.character.as_str()
        };
        let provenance = lines::Provenance {
            session,
            binding,
            event_seq: p.seq,
            turn: p.turn,
            step: p.step,
        };
        lines::projected(provenance, speaker, p.is_user, p.time, &p.text)
    }

    /// Appends `lines` exactly once. Returns the chat revision after the write (if any write or
    /// read happened), lines appended, lines found already present.
    async fn write(
        &self,
        session: &SessionId,
        binding: &SessionBinding,
        lines: &[PlannedLine],
        checkpoint: Option<&ProjectorCheckpoint>,
    ) -> Result<(Option<String>, usize, usize), ProjectorError> {
        if lines.is_empty() {
            return Ok((None, 0, 0));
        }
        let err = Self::store_err(session);
        let target = binding.target();
        let (character, chat) = (&target.character, &target.chat_id);
        let names = self.speakers(binding).await;
        // The common case: nobody touched the chat since our last write, so append at the
        // revision the checkpoint remembers (the store checks it) without reading anything.
        if let Some(known) = checkpoint.and_then(|c| c.chat_revision.as_deref()) {
            let raw: Vec<ChatLine> = lines
                .iter()
                .map(|p| Self::line_for(session, binding, &names, p))
                .collect();
            match self
                .chats
                .append_lines(character, chat, &raw, &ChatRevision::new(known))
                .await
            {
                Ok(rev) => return Ok((Some(rev.as_str().to_owned()), raw.len(), 0)),
                Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {}
                Err(e) => return Err(err(e)),
            }
        }
        for _ in 0..APPEND_ATTEMPTS {
            let current = match self
                .chats
                .chat_revision(character, chat)
                .await
                .map_err(&err)?
            {
                Some(rev) => rev,
                None => {
                    let header = lines::header(&names.user, character, self.clock.now());
                    match self
                        .chats
                        .rewrite_chat(character, chat, &[header], None)
                        .await
                    {
                        Ok(rev) => rev,
                        Err(StoreError::Conflict { .. }) => continue,
                        Err(e) => return Err(err(e)),
                    }
                }
            };
            let clean =
                checkpoint.and_then(|c| c.chat_revision.as_deref()) == Some(current.as_str());
            // Whether the chat holds lines of this session beyond this batch (another
            // projector of the session got further): then the revision after this write must
            // not be recorded as "ours", or a later step would append at it without looking
            // and write those lines a second time.
            let mut ahead = false;
            let (expected, todo): (ChatRevision, Vec<&PlannedLine>) = if clean {
                (current, lines.iter().collect())
            } else {
                // Unknown state: read the chat and skip lines that are already there.
                let Some(file) = self.chats.read_chat(character, chat).await.map_err(&err)? else {
                    continue;
                };
                let present: HashSet<u64> = file
                    .lines
                    .iter()
                    .filter_map(|l| lines::projected_seq(l, session))
                    .collect();
                let last = lines.iter().map(|p| p.seq).max().unwrap_or(0);
                ahead = present.iter().any(|seq| *seq > last);
                (
                    file.revision,
                    lines.iter().filter(|p| !present.contains(&p.seq)).collect(),
                )
            };
            let ours = |rev: &ChatRevision| (!ahead).then(|| rev.as_str().to_owned());
            let already = lines.len() - todo.len();
            if todo.is_empty() {
                return Ok((ours(&expected), 0, already));
            }
            let raw: Vec<ChatLine> = todo
                .iter()
                .map(|p| Self::line_for(session, binding, &names, p))
                .collect();
            match self
                .chats
                .append_lines(character, chat, &raw, &expected)
                .await
            {
                Ok(rev) => return Ok((ours(&rev), raw.len(), already)),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(err(e)),
            }
        }
        Err(ProjectorError::Contended {
            session: session.to_string(),
            attempts: APPEND_ATTEMPTS,
        })
    }
}
