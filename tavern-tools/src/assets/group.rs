//! A SillyTavern group (`groups/<id>.json`): its name, members (card avatar file names, some of
//! them muted) and the group's chat metadata (author's note, chat lorebook), which SillyTavern
//! keeps in the group file rather than in the group's headerless chats.

use serde_json::{Map, Value};

use super::AssetError;

/// The largest group file read: 1 MiB (SillyTavern's are a few KiB).
pub const MAX_GROUP_FILE_BYTES: u64 = 1024 * 1024;

/// A group as the tools use it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Group {
    /// The group's name (`name`), which its chats are filed under.
    pub name: String,
    /// The members' card avatar file names (`members`), in order.
    pub members: Vec<String>,
    /// Members muted in the group (`disabled_members`).
    pub disabled: Vec<String>,
    /// The group's chat metadata (`chat_metadata`): `note_prompt`, `world_info`…
    pub chat_metadata: Map<String, Value>,
}

impl Group {
    /// Reads a group file.
    ///
    /// # Errors
    /// [`AssetError::BadJson`] when it is not JSON, [`AssetError::WrongShape`] when it is not
    /// an object with a `name`.
    pub fn from_json(label: &str, bytes: &[u8]) -> Result<Self, AssetError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| AssetError::BadJson {
            name: label.to_owned(),
            reason: e.to_string(),
        })?;
        let shape = |reason: &str| AssetError::WrongShape {
            name: label.to_owned(),
            kind: "group",
            reason: reason.to_owned(),
        };
        let o = v.as_object().ok_or_else(|| shape("not an object"))?;
        let name = o
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| shape("no name"))?;
        let list = |key: &str| -> Vec<String> {
            o.get(key)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(Self {
            name: name.to_owned(),
            members: list("members"),
            disabled: list("disabled_members"),
            chat_metadata: o
                .get("chat_metadata")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        })
    }

    /// A member's character name: its avatar file name without the extension.
    pub fn member_character(avatar: &str) -> &str {
        avatar.rsplit_once('.').map_or(avatar, |(stem, _)| stem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real group file from a user's folder (`../shared/fixtures/user-folder/groups`).
    #[test]
    fn a_real_group_file_reads() {
        let bytes = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../shared/fixtures/user-folder/groups/1720882292647.json"),
        )
        .expect("../shared/fixtures/user-folder/groups/1720882292647.json is needed");
        let g = Group::from_json("group 1720882292647", &bytes).unwrap();
        assert_eq!(g.name, "ZzGroup: Conversational Real Life");
        assert_eq!(g.members.len(), 8);
        assert_eq!(g.members[1], "Tony Stark_1.png");
        assert_eq!(Group::member_character(&g.members[1]), "Tony Stark_1");
        assert_eq!(g.disabled.len(), 8);
        assert!(g.chat_metadata.contains_key("note_prompt"));
        for bad in ["[]", "{}", "{\"name\": \" \"}", "nope"] {
            let e = Group::from_json("group x", bad.as_bytes()).unwrap_err();
            assert!(e.to_string().contains("group x"), "{e}");
        }
    }
}
