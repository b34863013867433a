//! Every port is implemented for `Arc<T>` and `Box<T>` of an implementation (including trait
//! objects), so callers can share or erase stores without adapters of their own.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tavern_core::chat::ChatLine;
use tavern_core::{
    AuditEntry, CharacterName, ChatId, Diagnostic, MemoryId, MemoryRecord, MemorySource,
    MemoryWrite, Revision, ScopeKey, SessionBinding, SessionId, TavernState, VariableName,
    VariableRecord,
};

use crate::chat::{ChatChange, ChatFile, ChatRevision, ChatStore};
use crate::checkpoint::{CheckpointStore, ProjectorCheckpoint};
use crate::error::StoreError;
use crate::memory::{MemoryQuery, MemorySearchResult, MemoryStore};
use crate::prompt::{PromptStore, SessionPrompt};
use crate::state::{StateMutation, StateStore, StateView};
use crate::variable::{PatchOutcome, VariableChange, VariableListing, VariableStore};

macro_rules! forward {
    ($($ptr:ident),*) => {$(
        #[async_trait]
        impl<T: MemoryStore + ?Sized> MemoryStore for $ptr<T> {
            async fn search(&self, q: &MemoryQuery) -> Result<MemorySearchResult, StoreError> {
                (**self).search(q).await
            }
            async fn read(&self, id: &MemoryId, scope: &ScopeKey) -> Result<Option<MemoryRecord>, StoreError> {
                (**self).read(id, scope).await
            }
            async fn inspect(&self, id: &MemoryId, scope: &ScopeKey) -> Result<Option<MemoryRecord>, StoreError> {
                (**self).inspect(id, scope).await
            }
            async fn put(&self, w: MemoryWrite, e: Option<&Revision>, restore: bool) -> Result<MemoryRecord, StoreError> {
                (**self).put(w, e, restore).await
            }
            async fn forget(&self, id: &MemoryId, scope: &ScopeKey, e: &Revision, s: MemorySource) -> Result<MemoryRecord, StoreError> {
                (**self).forget(id, scope, e, s).await
            }
            async fn memory_audit(&self, scope: &ScopeKey, id: Option<&MemoryId>) -> Result<Vec<AuditEntry>, StoreError> {
                (**self).memory_audit(scope, id).await
            }
        }

        #[async_trait]
        impl<T: VariableStore + ?Sized> VariableStore for $ptr<T> {
            async fn get(&self, scope: &ScopeKey, n: &VariableName) -> Result<Option<VariableRecord>, StoreError> {
                (**self).get(scope, n).await
            }
            async fn set(&self, scope: &ScopeKey, n: &VariableName, v: Value, e: Option<&Revision>, s: MemorySource) -> Result<VariableRecord, StoreError> {
                (**self).set(scope, n, v, e, s).await
            }
            async fn patch(&self, scope: &ScopeKey, c: &[VariableChange], e: Option<&Revision>, s: MemorySource) -> Result<PatchOutcome, StoreError> {
                (**self).patch(scope, c, e, s).await
            }
            async fn delete(&self, scope: &ScopeKey, n: &VariableName, e: &Revision, s: MemorySource) -> Result<(), StoreError> {
                (**self).delete(scope, n, e, s).await
            }
            async fn list(&self, scope: &ScopeKey, prefix: &str, limit: usize) -> Result<VariableListing, StoreError> {
                (**self).list(scope, prefix, limit).await
            }
            async fn clear_scope(&self, scope: &ScopeKey, s: MemorySource) -> Result<usize, StoreError> {
                (**self).clear_scope(scope, s).await
            }
            async fn variable_audit(&self, scope: &ScopeKey) -> Result<Vec<AuditEntry>, StoreError> {
                (**self).variable_audit(scope).await
            }
        }

        #[async_trait]
        impl<T: StateStore + ?Sized> StateStore for $ptr<T> {
            async fn load_state(&self) -> Result<(TavernState, Vec<Diagnostic>), StoreError> {
                (**self).load_state().await
            }
            async fn binding(&self, s: &SessionId) -> Result<Option<SessionBinding>, StoreError> {
                (**self).binding(s).await
            }
            async fn view_state(&self, v: StateView<'_>) -> Result<(), StoreError> {
                (**self).view_state(v).await
            }
            async fn update_state(&self, m: StateMutation<'_>) -> Result<TavernState, StoreError> {
                (**self).update_state(m).await
            }
        }

        #[async_trait]
        impl<T: ChatStore + ?Sized> ChatStore for $ptr<T> {
            async fn list_chats(&self, c: &CharacterName) -> Result<Vec<ChatId>, StoreError> {
                (**self).list_chats(c).await
            }
            async fn read_chat(&self, c: &CharacterName, id: &ChatId) -> Result<Option<ChatFile>, StoreError> {
                (**self).read_chat(c, id).await
            }
            async fn read_chat_since(&self, c: &CharacterName, id: &ChatId, since: &ChatRevision) -> Result<Option<ChatChange>, StoreError> {
                (**self).read_chat_since(c, id, since).await
            }
            async fn read_chat_head(&self, c: &CharacterName, id: &ChatId) -> Result<Option<ChatLine>, StoreError> {
                (**self).read_chat_head(c, id).await
            }
            async fn chat_revision(&self, c: &CharacterName, id: &ChatId) -> Result<Option<ChatRevision>, StoreError> {
                (**self).chat_revision(c, id).await
            }
            async fn append_lines(&self, c: &CharacterName, id: &ChatId, l: &[ChatLine], e: &ChatRevision) -> Result<ChatRevision, StoreError> {
                (**self).append_lines(c, id, l, e).await
            }
            async fn rewrite_chat(&self, c: &CharacterName, id: &ChatId, l: &[ChatLine], e: Option<&ChatRevision>) -> Result<ChatRevision, StoreError> {
                (**self).rewrite_chat(c, id, l, e).await
            }
        }

        #[async_trait]
        impl<T: CheckpointStore + ?Sized> CheckpointStore for $ptr<T> {
            async fn load_checkpoint(&self, s: &SessionId) -> Result<Option<ProjectorCheckpoint>, StoreError> {
                (**self).load_checkpoint(s).await
            }
            async fn save_checkpoint(&self, c: &ProjectorCheckpoint, e: Option<&ProjectorCheckpoint>) -> Result<(), StoreError> {
                (**self).save_checkpoint(c, e).await
            }
            async fn pending_checkpoints(&self) -> Result<Vec<ProjectorCheckpoint>, StoreError> {
                (**self).pending_checkpoints().await
            }
        }

        #[async_trait]
        impl<T: PromptStore + ?Sized> PromptStore for $ptr<T> {
            async fn get_prompt(&self, s: &SessionId) -> Result<Option<SessionPrompt>, StoreError> {
                (**self).get_prompt(s).await
            }
            async fn save_prompt(&self, s: &SessionId, t: &str) -> Result<Option<SessionPrompt>, StoreError> {
                (**self).save_prompt(s, t).await
            }
            async fn reset_prompt(&self, s: &SessionId) -> Result<bool, StoreError> {
                (**self).reset_prompt(s).await
            }
        }
    )*};
}

forward!(Arc, Box);

/// Every port at once, for code (the runtime, the conformance suite) that needs all of them.
pub trait AllStores:
    MemoryStore + VariableStore + StateStore + ChatStore + CheckpointStore + PromptStore
{
}

impl<T> AllStores for T where
    T: MemoryStore
        + VariableStore
        + StateStore
        + ChatStore
        + CheckpointStore
        + PromptStore
        + ?Sized
{
}
