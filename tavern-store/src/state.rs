//! The state port: normalized bindings and settings with atomic read-modify-write.

use async_trait::async_trait;
use tavern_core::{Diagnostic, TavernState};

use crate::error::StoreError;

/// A mutation applied to the state under the store's lock.
pub type StateMutation<'a> = &'a mut (dyn FnMut(&mut TavernState) -> Result<(), StoreError> + Send);

/// Persisted [`TavernState`].
#[async_trait]
pub trait StateStore: Send + Sync {
    /// Reads and normalizes the state; a missing file is the default state. Diagnostics say what
    /// the normalizer changed.
    ///
    /// # Errors
    /// IO failures. A corrupt file is set aside with a diagnostic, not an error.
    async fn load_state(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError>;

    /// Applies `mutate` to the freshest state under an exclusive lock and persists the result,
    /// so concurrent updates (also from other processes) all survive. If `mutate` fails nothing
    /// is written.
    ///
    /// # Errors
    /// Whatever `mutate` returns, or IO failures.
    async fn update_state(&self, mutate: StateMutation<'_>) -> Result<TavernState, StoreError>;
}
