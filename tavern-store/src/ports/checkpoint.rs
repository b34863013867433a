//! The projector checkpoint port: how far each session's events have been projected.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tavern_core::{SessionId, Timestamp};

use crate::error::StoreError;

/// Whether the projection is complete up to `last_cursor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointStatus {
    /// Everything up to `last_cursor` is projected.
    Ok,
    /// Projection failed at `pending_cursor`; replay will fill the gap.
    Pending,
}

/// A session's projector checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectorCheckpoint {
    /// The session.
    pub session_id: SessionId,
    /// The last event seq fully projected.
    pub last_cursor: Option<u64>,
    /// Ok or pending.
    pub status: CheckpointStatus,
    /// The first seq that failed, when pending.
    pub pending_cursor: Option<u64>,
    /// The failure, when pending.
    pub error: Option<String>,
    /// The chat revision after the last projected line.
    pub chat_revision: Option<String>,
    /// The turn in progress at `last_cursor` (0: none), so a projection resumed after a
    /// restart knows which turn a user message belongs to.
    #[serde(default)]
    pub turn: u64,
    /// The step in progress at `last_cursor` (0: none).
    #[serde(default)]
    pub step: u64,
    /// Last change.
    pub updated_at: Timestamp,
}

/// Durable projector checkpoints, one per session.
#[async_trait]
pub trait CheckpointStore: Send + Sync {
    /// The session's checkpoint, if any.
    ///
    /// # Errors
    /// IO failures; a corrupt checkpoint is set aside and reads as `None`.
    async fn load_checkpoint(
        &self,
        session: &SessionId,
    ) -> Result<Option<ProjectorCheckpoint>, StoreError>;

    /// Replaces the session's checkpoint durably if it still is `expected` (`None`: there is
    /// none yet), so two projectors of one session — threads or processes — never move a
    /// cursor backwards over each other's progress.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when the stored checkpoint is not `expected` (load it again and
    /// redo the step); IO failures.
    async fn save_checkpoint(
        &self,
        checkpoint: &ProjectorCheckpoint,
        expected: Option<&ProjectorCheckpoint>,
    ) -> Result<(), StoreError>;

    /// Every checkpoint whose status is pending, by session id.
    ///
    /// # Errors
    /// IO failures.
    async fn pending_checkpoints(&self) -> Result<Vec<ProjectorCheckpoint>, StoreError>;
}
