//! The bounded list of problems an adapter noticed in stored data, shared by the file and
//! PostgreSQL stores: the newest are kept, so a failing disk or database never grows memory
//! without end.

use std::sync::Mutex;

use crate::mem::lock;
use crate::StoreDiagnostic;

/// Most diagnostics kept (the newest).
pub(crate) const DIAGNOSTICS_MAX: usize = 1000;

/// Diagnostics so far, at most [`DIAGNOSTICS_MAX`].
#[derive(Debug, Default)]
pub(crate) struct Diagnostics(Mutex<Vec<StoreDiagnostic>>);

impl Diagnostics {
    /// A list that starts with `found` (trimmed to the newest).
    pub(crate) fn new(found: Vec<StoreDiagnostic>) -> Self {
        let d = Self::default();
        d.extend(found);
        d
    }

    /// Adds `found`, dropping the oldest beyond the bound.
    pub(crate) fn extend(&self, found: Vec<StoreDiagnostic>) {
        let mut all = lock(&self.0);
        all.extend(found);
        let over = all.len().saturating_sub(DIAGNOSTICS_MAX);
        all.drain(..over);
    }

    /// Adds one.
    pub(crate) fn push(&self, file: String, message: String) {
        self.extend(vec![StoreDiagnostic { file, message }]);
    }

    /// A copy of the list, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<StoreDiagnostic> {
        lock(&self.0).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_within_the_bound() {
        let d = Diagnostics::new(Vec::new());
        for i in 0..DIAGNOSTICS_MAX + 5 {
            d.push(format!("f{i}"), "m".into());
        }
        let all = d.snapshot();
        assert_eq!(all.len(), DIAGNOSTICS_MAX);
        assert_eq!(all[0].file, "f5");
        assert_eq!(
            all[DIAGNOSTICS_MAX - 1].file,
            format!("f{}", DIAGNOSTICS_MAX + 4)
        );
    }
}
