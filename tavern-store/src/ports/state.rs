//! The state port: normalized bindings and settings with atomic read-modify-write, and
//! [`StateStoreExt::update`], the typed way to use it.

use async_trait::async_trait;
use tavern_core::{Diagnostic, SessionBinding, SessionId, TavernState};

use crate::error::StoreError;

/// What a mutation decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Persist the mutated state.
    Write,
    /// Write nothing (the mutation changed nothing, or refused); the state stays as it was.
    Keep,
}

/// A mutation applied to the freshest state under the store's lock.
pub type StateMutation<'a> = &'a mut (dyn FnMut(&mut TavernState) -> Verdict + Send);

/// A look at the current state without copying it.
pub type StateView<'a> = &'a mut (dyn FnMut(&TavernState) + Send);

/// Persisted [`TavernState`].
#[async_trait]
pub trait StateStore: Send + Sync {
    /// Reads and normalizes the state; a missing file is the default state. Diagnostics say what
    /// the normalizer changed.
    ///
    /// # Errors
    /// IO failures. A corrupt file is set aside with a diagnostic, not an error.
    async fn load_state(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError>;

    /// Runs `view` once on the current state (as [`StateStore::load_state`] would return it)
    /// without copying it: adapters that cache the state lend it. For callers that need a few
    /// facts of a state with thousands of sessions, per request.
    ///
    /// # Errors
    /// As [`StateStore::load_state`].
    async fn view_state(&self, view: StateView<'_>) -> Result<(), StoreError> {
        view(&self.load_state().await?.0);
        Ok(())
    }

    /// One session's binding, as in [`StateStore::load_state`]. Adapters that cache the state
    /// answer without copying all of it (a host with thousands of sessions asks per event).
    ///
    /// # Errors
    /// As [`StateStore::load_state`].
    async fn binding(&self, session: &SessionId) -> Result<Option<SessionBinding>, StoreError> {
        Ok(self.load_state().await?.0.binding(session).cloned())
    }

    /// Applies `mutate` once to the freshest state under an exclusive lock and persists the
    /// result when it answers [`Verdict::Write`], so concurrent updates (also from other
    /// processes) all survive. Returns the state as it is afterwards.
    ///
    /// # Errors
    /// IO failures; nothing is written then.
    async fn update_state(&self, mutate: StateMutation<'_>) -> Result<TavernState, StoreError>;
}

/// Typed read-modify-write over any [`StateStore`]: the closure returns its own result or its
/// own error, and a refusal writes nothing.
#[async_trait]
pub trait StateStoreExt: StateStore {
    /// Runs `f` on the freshest state under the store's lock. `Ok(r)` persists the state and
    /// returns `r`; `Err(e)` writes nothing and returns `e`. Store failures convert into `E`.
    ///
    /// # Errors
    /// Whatever `f` returns, or the store's failure.
    async fn update<R, E, F>(&self, mut f: F) -> Result<R, E>
    where
        F: FnMut(&mut TavernState) -> Result<R, E> + Send,
        R: Send,
        E: From<StoreError> + Send,
    {
        let mut outcome: Option<Result<R, E>> = None;
        let mut mutate = |state: &mut TavernState| match f(state) {
            Ok(r) => {
                outcome = Some(Ok(r));
                Verdict::Write
            }
            Err(e) => {
                outcome = Some(Err(e));
                Verdict::Keep
            }
        };
        self.update_state(&mut mutate).await?;
        outcome.unwrap_or_else(|| {
            Err(StoreError::Internal("a state update never ran its mutation".into()).into())
        })
    }
}

impl<T: StateStore + ?Sized> StateStoreExt for T {}

/// Typed look at the state over any [`StateStore`].
#[async_trait]
pub trait StateViewExt: StateStore {
    /// `f` of the current state, without copying the state.
    ///
    /// # Errors
    /// The store's failure.
    async fn read_state<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&TavernState) -> R + Send,
        R: Send,
    {
        let mut f = Some(f);
        let mut out = None;
        let mut view = |state: &TavernState| {
            if let Some(f) = f.take() {
                out = Some(f(state));
            }
        };
        self.view_state(&mut view).await?;
        out.ok_or_else(|| StoreError::Internal("a state view never ran".into()))
    }
}

impl<T: StateStore + ?Sized> StateViewExt for T {}
