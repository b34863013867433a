//! Tool calls in flight and their cancellation, bounded: a cancel for a call that is running
//! aborts it, a cancel that arrives before its call (frames race) cancels it when it comes,
//! and a cancel that arrives after its call finished is ignored — it never poisons a later
//! call. Early cancels and finished ids are remembered only up to a fixed number each.

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

/// The table of calls.
#[derive(Debug, Default)]
pub struct Calls {
    in_flight: HashMap<String, Arc<Notify>>,
    early: Recent,
    done: Recent,
}

impl Calls {
    /// Handles `tool/cancel`.
    pub fn cancel(&mut self, id: &str) -> CancelOutcome {
        if let Some(stop) = self.in_flight.remove(id) {
            // A stored permit: the call sees it even if it is not waiting yet.
            stop.notify_one();
            CancelOutcome::Aborted
        } else if self.done.contains(id) {
            CancelOutcome::Late
        } else {
            self.early.insert(id.to_owned());
            CancelOutcome::Early
        }
    }

    /// A call is arriving: `false` when it was cancelled before it came (it must not run).
    pub fn admit(&mut self, id: &str) -> bool {
        !self.early.remove(id)
    }

    /// A call starts running; the returned signal fires when it is cancelled.
    pub fn started(&mut self, id: &str) -> Arc<Notify> {
        let stop = Arc::new(Notify::new());
        self.in_flight.insert(id.to_owned(), stop.clone());
        stop
    }

    /// A call finished (or was aborted).
    pub fn finished(&mut self, id: &str) {
        self.in_flight.remove(id);
        self.done.insert(id.to_owned());
    }

    /// `(in flight, early cancels, finished ids)` remembered (bounded-memory checks).
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.in_flight.len(), self.early.len(), self.done.len())
    }
}
