//! Tool calls in flight and their cancellation, bounded and scoped by session: a cancel for a
//! call that is running aborts it, a cancel that arrives before its call (frames race) cancels
//! it when it comes, and a cancel that arrives after its call finished is ignored — it never
//! poisons a later call. Calls are known by `(session, call id)`: hosts number calls per
//! session, so the same id in another session is another call. Early cancels and finished ids
//! are remembered only up to a fixed number each; a cancel that names no session (an older
//! host) aborts a running call of that id and is otherwise ignored.

use std::collections::{HashMap, HashSet, VecDeque};

use std::sync::Arc;

use tokio::sync::Notify;

/// Most early cancels and most finished call ids remembered.
pub const REMEMBERED_CALLS: usize = 1024;

/// A bounded set that forgets its oldest member first.
#[derive(Debug, Default)]
struct Recent {
    order: VecDeque<String>,
    members: HashSet<String>,
}

impl Recent {
    fn insert(&mut self, id: String) {
        if self.members.insert(id.clone()) {
            self.order.push_back(id);
            while self.order.len() > REMEMBERED_CALLS {
                if let Some(old) = self.order.pop_front() {
                    self.members.remove(&old);
                }
            }
        }
    }

    fn remove(&mut self, id: &str) -> bool {
        if self.members.remove(id) {
            self.order.retain(|o| o != id);
            true
        } else {
            false
        }
    }

    fn contains(&self, id: &str) -> bool {
        self.members.contains(id)
    }

    fn len(&self) -> usize {
        self.order.len()
    }
}

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The call was running and is aborted.
    Aborted,
    /// The call is unknown: it will be cancelled if it arrives.
    Early,
    /// The call already finished: nothing to do.
    Late,
}

/// A call's key: its session and id.
fn key(session: &str, id: &str) -> String {
    format!("{session}\u{0}{id}")
}

/// The table of calls.
#[derive(Debug, Default)]
pub struct Calls {
    in_flight: HashMap<String, Arc<Notify>>,
    early: Recent,
    done: Recent,
}

impl Calls {
    /// Handles `tool/cancel` of call `id` in `session` (`None`: a host that does not say).
    pub fn cancel(&mut self, session: Option<&str>, id: &str) -> CancelOutcome {
        let Some(session) = session else {
            // Only a running call can be meant; there must be exactly one with this id.
            let suffix = key("", id);
            let running: Vec<String> = self
                .in_flight
                .keys()
                .filter(|k| k.ends_with(&suffix))
                .cloned()
                .collect();
            return match running.as_slice() {
                [one] => self.abort(one),
                _ => CancelOutcome::Late,
            };
        };
        let k = key(session, id);
        if self.in_flight.contains_key(&k) {
            self.abort(&k)
        } else if self.done.contains(&k) {
            CancelOutcome::Late
        } else {
            self.early.insert(k);
            CancelOutcome::Early
        }
    }

    fn abort(&mut self, k: &str) -> CancelOutcome {
        if let Some(stop) = self.in_flight.remove(k) {
            // A stored permit: the call sees it even if it is not waiting yet.
            stop.notify_one();
        }
        CancelOutcome::Aborted
    }

    /// A call is arriving: `false` when it was cancelled before it came (it must not run).
    pub fn admit(&mut self, session: &str, id: &str) -> bool {
        !self.early.remove(&key(session, id))
    }

    /// A call starts running; the returned signal fires when it is cancelled.
    pub fn started(&mut self, session: &str, id: &str) -> Arc<Notify> {
        let stop = Arc::new(Notify::new());
        self.in_flight.insert(key(session, id), stop.clone());
        stop
    }

    /// A call finished (or was aborted).
    pub fn finished(&mut self, session: &str, id: &str) {
        let k = key(session, id);
        self.in_flight.remove(&k);
        self.done.insert(k);
    }

    /// `(in flight, early cancels, finished ids)` remembered (bounded-memory checks).
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.in_flight.len(), self.early.len(), self.done.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #30 F12: after more calls than are remembered, a late cancel of session A's call is
    /// taken for an early one — and must then stop only A's next call of that id, never
    /// session B's call that happens to have the same id.
    #[test]
    fn a_late_cancel_never_reaches_another_sessions_call() {
        let mut calls = Calls::default();
        calls.started("a", "call_0");
        calls.finished("a", "call_0");
        for i in 0..=REMEMBERED_CALLS {
            calls.started("a", &format!("x{i}"));
            calls.finished("a", &format!("x{i}"));
        }
        assert_eq!(calls.cancel(Some("a"), "call_0"), CancelOutcome::Early);
        assert!(calls.admit("b", "call_0"), "another session's call runs");
        assert!(
            !calls.admit("a", "call_0"),
            "the cancelled session's own call does not"
        );
        // A cancel naming no session stops only a running call, never a later one.
        assert_eq!(calls.cancel(None, "call_9"), CancelOutcome::Late);
        assert!(calls.admit("a", "call_9"));
        let stop = calls.started("b", "call_9");
        assert_eq!(calls.cancel(None, "call_9"), CancelOutcome::Aborted);
        drop(stop);
        let (in_flight, early, done) = calls.sizes();
        assert_eq!(in_flight, 0);
        assert!(early <= REMEMBERED_CALLS && done <= REMEMBERED_CALLS);
    }
}
