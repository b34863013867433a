//! A strict in-memory host for tests of code built on the runtime (the management API, another
//! host's adapter): a log per session, an idle flag per agent, the host's facts chosen by the
//! test. Strict like the stores' `MemStore`: an agent the test never started is an error, never
//! silently idle, and an event appended out of order is refused.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tavern_core::{AgentId, HostFacts, SessionId};
use tavern_projector::{EventKind, HostEvent};

use crate::host::{AgentMount, HostError, HostPort, LoggedEvent, TavernLogEvent};

/// A host whose sessions, logs and turns live in memory. Agent id = session id (DSH's rule).
#[derive(Debug)]
pub struct MemHost {
    facts: HostFacts,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    logs: HashMap<SessionId, Vec<HostEvent>>,
    running: HashMap<AgentId, bool>,
    mounts: HashMap<AgentId, AgentMount>,
}

impl MemHost {
    /// A host with these facts and no sessions.
    pub fn new(facts: HostFacts) -> Self {
        Self {
            facts,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// A host with every seam AgentTavern uses (both context modes available).
    pub fn capable() -> Self {
        Self::new(HostFacts {
            host: "mem-host".into(),
            agent_context_seam: true,
            projection_aware_compaction: true,
            session_compaction_suppression: true,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a session's agent, idle, with an empty log.
    pub fn start(&self, session: &SessionId) {
        let mut inner = self.lock();
        inner.logs.entry(session.clone()).or_default();
        if let Ok(agent) = AgentId::parse(session.as_str()) {
            inner.running.insert(agent, false);
        }
    }

    /// Marks a session's agent as running a turn (or idle again).
    ///
    /// # Errors
    /// [`HostError`] for a session never started.
    pub fn set_running(&self, session: &SessionId, running: bool) -> Result<(), HostError> {
        let agent = self.agent_of(session)?;
        match self.lock().running.get_mut(&agent) {
            Some(flag) => {
                *flag = running;
                Ok(())
            }
            None => Err(HostError(format!("unknown session {session}"))),
        }
    }

    /// Appends an event of `kind` to a session's log and returns it as logged (the caller
    /// decides whether the runtime sees it, to model a host whose delivery was lost).
    ///
    /// # Errors
    /// [`HostError`] for a session never started.
    pub fn log(&self, session: &SessionId, kind: EventKind) -> Result<HostEvent, HostError> {
        let mut inner = self.lock();
        let log = inner
            .logs
            .get_mut(session)
            .ok_or_else(|| HostError(format!("unknown session {session}")))?;
        let seq = log.len() as u64;
        let event = HostEvent {
            seq,
            time: 1_700_000_000_000 + i64::try_from(seq).unwrap_or(0) * 1000,
            kind,
        };
        log.push(event.clone());
        Ok(event)
    }

    /// What was last mounted on an agent.
    pub fn mount_of(&self, agent: &AgentId) -> Option<AgentMount> {
        self.lock().mounts.get(agent).cloned()
    }
}

#[async_trait]
impl HostPort for MemHost {
    fn facts(&self) -> HostFacts {
        self.facts.clone()
    }

    async fn mount(&self, agent: &AgentId, mount: &AgentMount) -> Result<(), HostError> {
        let mut inner = self.lock();
        if !inner.running.contains_key(agent) {
            return Err(HostError(format!("unknown agent {agent}")));
        }
        inner.mounts.insert(agent.clone(), mount.clone());
        Ok(())
    }

    async fn is_idle(&self, agent: &AgentId) -> Result<bool, HostError> {
        self.lock()
            .running
            .get(agent)
            .map(|running| !running)
            .ok_or_else(|| HostError(format!("unknown agent {agent}")))
    }

    async fn append_event(
        &self,
        session: &SessionId,
        event: &TavernLogEvent,
    ) -> Result<HostEvent, HostError> {
        let kind = match event {
            TavernLogEvent::ContextMode(e) => EventKind::ContextMode { to: e.to },
            other => EventKind::Known(other.event_type().into()),
        };
        self.log(session, kind)
    }

    async fn read_events(
        &self,
        session: &SessionId,
        after: Option<u64>,
    ) -> Result<Vec<LoggedEvent>, HostError> {
        let inner = self.lock();
        let log = inner
            .logs
            .get(session)
            .ok_or_else(|| HostError(format!("unknown session {session}")))?;
        Ok(log
            .iter()
            .filter(|e| after.is_none_or(|a| e.seq > a))
            .cloned()
            .map(Ok)
            .collect())
    }
}
