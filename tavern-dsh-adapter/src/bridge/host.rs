//! `BridgeHost`: the [`HostPort`] seen from the sidecar. It learns everything from the plugin's
//! frames (facts at handshake, agent status, every session event) and reads a session's
//! on-disk log (DSH's `session.jsonl`) to replay after a restart.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use serde_json::Value;
use tavern_core::{AgentId, HostFacts, SessionId};

use tavern_projector::HostEvent;
use tavern_runtime::{AgentMount, HostError, HostPort, LoggedEvent, TavernLogEvent};

use crate::dsh::event::decode_logged;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Most events mirrored per bound session (those not projected yet).
pub const MIRROR_MAX_EVENTS: usize = 1024;

/// Most events mirrored per session AgentTavern does not serve (yet): what a host logs before
/// binding a session.
pub const UNBOUND_MIRROR_EVENTS: usize = 32;

/// Most sessions AgentTavern does not serve whose first events are mirrored; the least
/// recently seen is forgotten first.
pub const UNBOUND_MIRROR_SESSIONS: usize = 256;

/// The host as the sidecar knows it.
#[derive(Debug)]
pub struct BridgeHost {
    facts: Mutex<HostFacts>,
    sessions_root: Mutex<Option<PathBuf>>,
    running: Mutex<HashMap<AgentId, bool>>,
    mounts: Mutex<HashMap<AgentId, AgentMount>>,
    events: Mutex<HashMap<SessionId, BTreeMap<u64, Value>>>,
    /// Unbound sessions with mirrored events, least recently seen first.
    unbound: Mutex<std::collections::VecDeque<SessionId>>,
}

impl Default for BridgeHost {
    fn default() -> Self {
        Self {
            facts: Mutex::new(crate::dsh::rc6_facts()),
            sessions_root: Mutex::default(),
            running: Mutex::default(),
            mounts: Mutex::default(),
            events: Mutex::default(),
            unbound: Mutex::default(),
        }
    }
}

impl BridgeHost {
    /// Records what the handshake said.
    pub fn configure(&self, facts: HostFacts, sessions_root: Option<PathBuf>) {
        *lock(&self.facts) = facts;
        *lock(&self.sessions_root) = sessions_root;
    }

    /// Records an `agent/status` notification.
    pub fn set_running(&self, agent: &AgentId, running: bool) {
        lock(&self.running).insert(agent.clone(), running);
    }

    /// Records a session event the plugin forwarded, so a replay can find it when the host's
    /// on-disk log is not readable. At most [`MIRROR_MAX_EVENTS`] per session are kept (the
    /// oldest go first); [`BridgeHost::projected_through`] and [`BridgeHost::dispose`] free
    /// the rest.
    pub fn record(&self, session: &SessionId, event: &Value, bound: bool) {
        let Some(seq) = event.get("seq").and_then(Value::as_u64) else {
            return;
        };
        let mut events = lock(&self.events);
        let mut unbound = lock(&self.unbound);
        unbound.retain(|s| s != session);
        let cap = if bound {
            MIRROR_MAX_EVENTS
        } else {
            unbound.push_back(session.clone());
            while unbound.len() > UNBOUND_MIRROR_SESSIONS {
                if let Some(old) = unbound.pop_front() {
                    events.remove(&old);
                }
            }
            UNBOUND_MIRROR_EVENTS
        };
        let mirror = events.entry(session.clone()).or_default();
        if mirror.len() < cap || bound {
            mirror.insert(seq, event.clone());
        }
        while mirror.len() > cap {
            mirror.pop_first();
        }
    }

    /// Forgets mirrored events at or before `cursor`: projected, never replayed again.
    pub fn projected_through(&self, session: &SessionId, cursor: u64) {
        if let Some(mirror) = lock(&self.events).get_mut(session) {
            mirror.retain(|seq, _| *seq > cursor);
        }
    }

    /// Forgets everything about a disposed agent and its session.
    pub fn dispose(&self, agent: &AgentId, session: &SessionId) {
        lock(&self.running).remove(agent);
        lock(&self.mounts).remove(agent);
        lock(&self.events).remove(session);
        lock(&self.unbound).retain(|s| s != session);
    }

    /// How many events are mirrored in all (bounded-memory checks).
    pub fn mirrored_events(&self) -> usize {
        lock(&self.events).values().map(BTreeMap::len).sum()
    }

    /// What was mounted on an agent.
    pub fn mount_of(&self, agent: &AgentId) -> Option<AgentMount> {
        lock(&self.mounts).get(agent).cloned()
    }

    /// Finds `<root>/<anything>/<session>/session.jsonl` (DSH's raw JSONL layout).
    fn log_file(root: &Path, session: &SessionId) -> Option<PathBuf> {
        for entry in std::fs::read_dir(root).ok()?.filter_map(Result::ok) {
            let candidate = entry.path().join(session.as_str()).join("session.jsonl");
            if candidate.is_file() {
                return Some(candidate);
            }
        }
        None
    }
}

#[async_trait]
impl HostPort for BridgeHost {
    fn facts(&self) -> HostFacts {
        lock(&self.facts).clone()
    }

    async fn mount(&self, agent: &AgentId, mount: &AgentMount) -> Result<(), HostError> {
        lock(&self.mounts).insert(agent.clone(), mount.clone());
        Ok(())
    }

    async fn is_idle(&self, agent: &AgentId) -> Result<bool, HostError> {
        Ok(!lock(&self.running).get(agent).copied().unwrap_or(false))
    }

    async fn append_event(
        &self,
        _session: &SessionId,
        event: &TavernLogEvent,
    ) -> Result<HostEvent, HostError> {
        Err(HostError(format!(
            "{} cannot append logged {} events from a plugin",
            lock(&self.facts).host,
            event.event_type()
        )))
    }

    async fn read_events(
        &self,
        session: &SessionId,
        after: Option<u64>,
    ) -> Result<Vec<LoggedEvent>, HostError> {
        let mut all: BTreeMap<u64, Value> = BTreeMap::new();
        let root = lock(&self.sessions_root).clone();
        let s = session.clone();
        // Finding and reading the host's log is blocking work: off the executor.
        let text = tavern_store::blocking::off_executor(move || {
            let path = root.as_deref().and_then(|r| Self::log_file(r, &s))?;
            Some(std::fs::read_to_string(&path).map_err(|e| e.kind().to_string()))
        })
        .await
        .map_err(|e| HostError(format!("session log of {session}: {e}")))?;
        if let Some(text) = text {
            let text = text.map_err(|e| HostError(format!("session log of {session}: {e}")))?;
            for v in text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            {
                if let Some(seq) = v.get("seq").and_then(Value::as_u64) {
                    all.insert(seq, v);
                }
            }
        }
        if let Some(mirror) = lock(&self.events).get(session) {
            for (seq, v) in mirror {
                all.entry(*seq).or_insert_with(|| v.clone());
            }
        }
        Ok(all
            .into_iter()
            .filter(|(s, _)| after.is_none_or(|a| *s > a))
            .map(|(_, v)| decode_logged(&v))
            .collect())
    }
}
