//! Chats kept in a SillyTavern user folder instead of under the store's root, so SillyTavern
//! opens them as its own: `<folder>/chats/<character>/<chat>.jsonl`, its layout and its
//! line style. Only chats move; memories, variables, state and checkpoints stay in the root.
//!
//! The store records the folder in its root ([`CHAT_FOLDER_RECORD`]), so every program that
//! opens the store later (`tavern`, another bridge) finds the same chats without being told.
//! Naming the store's own root as the folder goes back to chats under the root.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::atomic::{read_optional, remove, write_atomic};
use crate::error::StoreError;

/// The file in the store's root that names the chat folder.
pub const CHAT_FOLDER_RECORD: &str = "chat-folder.json";

/// How [`super::FsStore::open_with`] opens a store.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct FsOptions {
    /// A SillyTavern user folder (the one holding `chats/`, `characters/`) to keep chats in;
    /// `None`: the folder the store recorded earlier, else the store's root.
    pub chat_folder: Option<PathBuf>,
    /// Open without reading `memory.log`: it is read by the first memory call, or by
    /// [`super::FsStore::load_memories`] on a thread of the program's choosing. For programs
    /// that must answer before a large store has loaded (a bridge's handshake); everything
    /// else (variables, state, chats) is ready at open as always.
    pub defer_memory_load: bool,
}

impl FsOptions {
    /// Chats in `folder` (a SillyTavern user folder, e.g. `data/default-user`).
    #[must_use]
    pub fn with_chat_folder(mut self, folder: impl Into<PathBuf>) -> Self {
        self.chat_folder = Some(folder.into());
        self
    }

    /// [`FsOptions::defer_memory_load`].
    #[must_use]
    pub fn with_deferred_memory_load(mut self) -> Self {
        self.defer_memory_load = true;
        self
    }
}

#[derive(Serialize, Deserialize)]
struct Record {
    path: PathBuf,
}

fn setup(reason: &str) -> StoreError {
    StoreError::Setup {
        reason: reason.to_owned(),
    }
}

/// Where `chats/` lives for a store at `root` (which exists): `given`, recorded for the next
/// open; else the recorded folder; else `root`.
pub(super) fn resolve(root: &Path, given: Option<&Path>) -> Result<PathBuf, StoreError> {
    let own = root
        .canonicalize()
        .map_err(|_| setup("the store root cannot be resolved"))?;
    if let Some(dir) = given {
        let dir = match dir.canonicalize() {
            Ok(d) if d.is_dir() => d,
            _ => return Err(setup("the chat folder is not a directory")),
        };
        if dir == own {
            remove(root, CHAT_FOLDER_RECORD)?;
            return Ok(root.to_path_buf());
        }
        let bytes = serde_json::to_vec(&Record { path: dir.clone() })
            .map_err(|e| StoreError::Internal(format!("chat folder record: {e}")))?;
        if read_optional(root, CHAT_FOLDER_RECORD)?.as_deref() != Some(bytes.as_slice()) {
            write_atomic(root, CHAT_FOLDER_RECORD, &bytes)?;
        }
        return Ok(dir);
    }
    let Some(bytes) = read_optional(root, CHAT_FOLDER_RECORD)? else {
        return Ok(root.to_path_buf());
    };
    let record: Record = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
        file: CHAT_FOLDER_RECORD.to_owned(),
        reason: e.to_string(),
    })?;
    if !record.path.is_dir() {
        // Never fall back to the root: chats would silently split between two places.
        return Err(setup(&format!(
            "the SillyTavern folder this store keeps its chats in (named in {CHAT_FOLDER_RECORD}) is missing; mount it, or open the store with another chat folder"
        )));
    }
    Ok(record.path)
}
