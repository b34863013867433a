//! `BridgeHost`: the [`HostPort`] seen from the sidecar. It learns everything from the plugin's
//! frames (facts at handshake, agent status, every session event) and reads a session's
//! on-disk log (DSH's `session.jsonl`) to replay after a restart.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use serde_json::Value;
use tavern_core::{AgentId, HostFacts, SessionId};
use tavern_store::fs::FileStamp;

use tavern_projector::HostEvent;
use tavern_runtime::{AgentMount, HostError, HostPort, LoggedEvent, TavernLogEvent};

use crate::dsh::session_log;

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

/// Most running agents remembered beyond those AgentTavern serves.
pub const UNMOUNTED_STATUSES: usize = 1024;

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
    /// Where the last read of each session's on-disk log stopped, so the next read parses only
    /// what was appended since.
    tails: Mutex<HashMap<SessionId, Tail>>,
}

/// How far a session's on-disk log has been read: its file, the end of the last complete line
/// read, and the highest seq before it.
#[derive(Debug, Clone)]
struct Tail {
    path: PathBuf,
    stamp: FileStamp,
    offset: u64,
    last_seq: Option<u64>,
}

/// What one read of a session's on-disk log found.
struct LogRead {
    /// `(seq, event)` of the complete lines read.
    events: Vec<(u64, Value)>,
    /// Where the next read may start.
    tail: Tail,
    /// Whether only the part after an earlier read was parsed.
    #[cfg_attr(not(test), allow(dead_code))]
    incremental: bool,
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
            tails: Mutex::default(),
        }
    }
}

impl BridgeHost {
    /// Records what the handshake said.
    pub fn configure(&self, facts: HostFacts, sessions_root: Option<PathBuf>) {
        *lock(&self.facts) = facts;
        *lock(&self.sessions_root) = sessions_root;
    }

    /// Records an `agent/status` notification. Only running agents are remembered (idle is
    /// what an unknown agent is); agents AgentTavern serves always, others up to
    /// [`UNMOUNTED_STATUSES`], so statuses of agents never disposed cannot grow the bridge.
    pub fn set_running(&self, agent: &AgentId, running: bool) {
        let mut statuses = lock(&self.running);
        if !running {
            statuses.remove(agent);
        } else if statuses.contains_key(agent)
            || lock(&self.mounts).contains_key(agent)
            || statuses.len() < UNMOUNTED_STATUSES
        {
            statuses.insert(agent.clone(), true);
        }
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
        lock(&self.tails).remove(session);
    }

    /// How many events are mirrored in all (bounded-memory checks).
    pub fn mirrored_events(&self) -> usize {
        lock(&self.events).values().map(BTreeMap::len).sum()
    }

    /// What was mounted on an agent.
    pub fn mount_of(&self, agent: &AgentId) -> Option<AgentMount> {
        lock(&self.mounts).get(agent).cloned()
    }

    /// Finds `<root>/<project>/<session>/session.jsonl[.zstd]` (DSH's layout).
    fn log_file(root: &Path, session: &SessionId) -> Option<PathBuf> {
        crate::dsh::session_log::find(root, session.as_str())
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
        let root = lock(&self.sessions_root).clone();
        let tail = lock(&self.tails).get(session).cloned();
        let s = session.clone();
        // Finding and reading the host's log is blocking work: off the executor.
        let read = tavern_store::blocking::off_executor(move || {
            let path = match &tail {
                Some(t) if t.path.is_file() => t.path.clone(),
                _ => root.as_deref().and_then(|r| Self::log_file(r, &s))?,
            };
            Some(read_log(&path, tail.filter(|t| t.path == path), after))
        })
        .await
        .map_err(|e| HostError(format!("session log of {session}: {e}")))?;
        let mut all: BTreeMap<u64, Value> = BTreeMap::new();
        if let Some(read) = read {
            let read = read.map_err(|e| HostError(format!("session log of {session}: {e}")))?;
            all.extend(read.events);
            let mut tails = lock(&self.tails);
            // A few numbers per session read (only bound sessions' logs are); disposal forgets.
            tails.insert(session.clone(), read.tail);
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

/// Reads the events of a DSH session log after `after`: from where `tail` stopped when the
/// file is the one it read, has not shrunk, and every event after `after` lies beyond it (seqs
/// grow along the file); else the whole file. Lines that do not parse (a torn last line being
/// written) are skipped and read again next time.
fn read_log(path: &Path, tail: Option<Tail>, after: Option<u64>) -> Result<LogRead, String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(|e| e.kind().to_string())?;
    let stamp = tavern_store::fs::stamp_of(&file.metadata().map_err(|e| e.kind().to_string())?);
    let start = tail.filter(|t| {
        t.stamp.same_node(&stamp)
            && stamp.len() >= t.offset
            && t.last_seq
                .is_none_or(|last| after.is_some_and(|a| a >= last))
    });
    let (offset, mut last_seq) = start.as_ref().map_or((0, None), |t| (t.offset, t.last_seq));
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| e.kind().to_string())?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| e.kind().to_string())?;
    // Stock DSH compresses each append batch as a zstd frame of whole lines; the next read
    // starts after the last whole frame.
    let (bytes, consumed) = if session_log::is_zstd(path) {
        let decoded = session_log::decode_frames(&bytes)?;
        (decoded.text, decoded.consumed)
    } else {
        let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        (bytes, complete as u64)
    };
    let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut events = Vec::new();
    for line in bytes[..complete].split(|b| *b == b'\n') {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        for (seq, event) in session_log::expand_row(v) {
            last_seq = Some(last_seq.map_or(seq, |l: u64| l.max(seq)));
            events.push((seq, event));
        }
    }
    // A last line without its newline yet counts when it parses, but the next read starts
    // before it again.
    if let Ok(v) = serde_json::from_slice::<Value>(&bytes[complete..]) {
        events.extend(session_log::expand_row(v));
    }
    Ok(LogRead {
        events,
        tail: Tail {
            path: path.to_path_buf(),
            stamp,
            offset: offset + consumed,
            last_seq,
        },
        incremental: start.is_some(),
    })
}

#[cfg(test)]
mod tests {
    /// #30 F11: statuses of agents that are never disposed do not accumulate.
    #[test]
    fn statuses_of_agents_never_disposed_stay_bounded() {
        use super::*;
        let host = BridgeHost::default();
        for i in 0..50_000 {
            let agent = AgentId::parse(format!("a{i}")).unwrap();
            host.set_running(&agent, true);
            if i % 2 == 0 {
                host.set_running(&agent, false);
            }
        }
        assert!(lock(&host.running).len() <= UNMOUNTED_STATUSES);
        // An agent AgentTavern serves is remembered whatever the others did.
        let ours = AgentId::parse("ours").unwrap();
        let mount = AgentMount {
            preset: "agent-tavern".into(),
            sections: Vec::new(),
            tools: Vec::new(),
        };
        lock(&host.mounts).insert(ours.clone(), mount);
        host.set_running(&ours, true);
        let idle = block_on(host.is_idle(&ours)).unwrap();
        assert!(!idle, "a running agent of ours is not idle");
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    use super::*;

    fn line(seq: u64) -> String {
        format!("{{\"type\":\"assistant/chunk\",\"seq\":{seq},\"time\":1,\"data\":{{}}}}\n")
    }

    fn seqs(read: &LogRead) -> Vec<u64> {
        read.events.iter().map(|(s, _)| *s).collect()
    }

    #[test]
    fn a_log_read_again_parses_only_what_was_appended() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.jsonl");
        std::fs::write(&path, (0..3).map(line).collect::<String>()).unwrap();
        let first = read_log(&path, None, None).unwrap();
        assert_eq!((seqs(&first), first.incremental), (vec![0, 1, 2], false));

        // Appended, a torn last line among it: read from where the last read stopped.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        write!(f, "{}{}{{\"type\":\"tu", line(3), line(4)).unwrap();
        let second = read_log(&path, Some(first.tail.clone()), Some(2)).unwrap();
        assert_eq!((seqs(&second), second.incremental), (vec![3, 4], true));
        // The torn line is read once it is whole.
        writeln!(f, "rn/end\",\"seq\":5,\"time\":1,\"data\":{{}}}}").unwrap();
        let third = read_log(&path, Some(second.tail.clone()), Some(4)).unwrap();
        assert_eq!((seqs(&third), third.incremental), (vec![5], true));

        // Asking for events before what was read means the whole file again.
        let again = read_log(&path, Some(third.tail.clone()), Some(1)).unwrap();
        assert_eq!(
            (seqs(&again), again.incremental),
            (vec![0, 1, 2, 3, 4, 5], false)
        );

        // A new file put in its place (a rewrite, a compaction) is read whole.
        let tmp = dir.path().join("new.jsonl");
        std::fs::write(&tmp, (0..2).map(line).collect::<String>()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let replaced = read_log(&path, Some(third.tail), Some(5)).unwrap();
        assert_eq!((seqs(&replaced), replaced.incremental), (vec![0, 1], false));
    }
}
