//! The user's personas as SillyTavern keeps them in its `settings.json`, and which one a chat
//! uses (as `personas.js` `setChatLockedPersona` picks it): the persona the chat is locked to
//! (`chat_metadata.persona`, an avatar file name) when it still exists, else the default persona
//! (`power_user.default_persona`), else the one last selected (`user_avatar`); a selection that
//! names no persona is the user name (`username`) with the folder-less description
//! (`power_user.persona_description`).
//!
//! The same file says which world books are active ([`LoreSelection`]): the global selection
//! (`world_info_settings.world_info.globalSelect`) and each character's extra books
//! (`world_info_settings.world_info.charLore`, by the card's file name without extension).
//!
//! Only these fields are read, and [`Personas::to_settings`] writes only them: a `settings.json`
//! also holds API settings and proxies, which never leave the user's folder.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::provider::Persona;
use super::AssetError;

/// The world books a `settings.json` makes active.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoreSelection {
    /// Globally active books, in order (`globalSelect`).
    pub global: Vec<String>,
    /// Each character's extra books (`charLore`), by the card's file name without extension.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The personas of a `settings.json`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Personas {
    /// Each persona by its avatar file name (`power_user.personas`, with its description from
    /// `power_user.persona_descriptions`).
    pub by_avatar: BTreeMap<String, Persona>,
    /// `power_user.default_persona`: the persona of chats not locked to one.
    pub default_avatar: Option<String>,
    /// `user_avatar`: the persona selected last.
    pub current_avatar: Option<String>,
    /// `username`: the user's name when the selection names no persona.
    pub username: Option<String>,
    /// `power_user.persona_description`: the description when the selection names no persona.
    pub description: String,
    /// The world books it makes active.
    pub lore: LoreSelection,
}

fn names(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter(|n| !n.trim().is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl LoreSelection {
    fn from_world_info(wi: Option<&Value>) -> Self {
        let extra = wi
            .and_then(|w| w.get("charLore"))
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(|c| {
                        let name = c.get("name")?.as_str()?.to_owned();
                        let books = names(c.get("extraBooks"));
                        (!books.is_empty()).then_some((name, books))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            global: names(wi.and_then(|w| w.get("globalSelect"))),
            extra,
        }
    }

    fn to_world_info(&self) -> Value {
        let char_lore: Vec<Value> = self
            .extra
            .iter()
            .map(|(name, books)| json!({"name": name, "extraBooks": books}))
            .collect();
        json!({"globalSelect": self.global, "charLore": char_lore})
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str)
        .map(str::to_owned)
        .filter(|s| !s.trim().is_empty())
}

impl Personas {
    /// Reads the persona fields of a SillyTavern `settings.json`.
    ///
    /// # Errors
    /// [`AssetError::BadJson`] when it is not JSON; [`AssetError::WrongShape`] when it is not
    /// an object.
    pub fn from_settings(bytes: &[u8]) -> Result<Self, AssetError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| AssetError::BadJson {
            name: "settings.json".into(),
            reason: e.to_string(),
        })?;
        let Some(top) = v.as_object() else {
            return Err(AssetError::WrongShape {
                name: "settings.json".into(),
                kind: "settings",
                reason: "not an object".into(),
            });
        };
        let power = top.get("power_user").and_then(Value::as_object);
        let field = |name: &str| power.and_then(|p| p.get(name));
        let descriptions = field("persona_descriptions").and_then(Value::as_object);
        let by_avatar = field("personas")
            .and_then(Value::as_object)
            .map(|names| {
                names
                    .iter()
                    .filter_map(|(avatar, name)| {
                        let name = name.as_str()?.to_owned();
                        let description = descriptions
                            .and_then(|d| d.get(avatar))
                            .and_then(|d| d.get("description"))
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned();
                        Some((avatar.clone(), Persona { name, description }))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            by_avatar,
            default_avatar: text(field("default_persona")),
            current_avatar: text(top.get("user_avatar")),
            username: text(top.get("username")),
            description: field("persona_description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            lore: LoreSelection::from_world_info(
                top.get("world_info_settings")
                    .and_then(|w| w.get("world_info")),
            ),
        })
    }

    /// The persona of a chat locked to `locked` (its `chat_metadata.persona`), or of a chat not
    /// locked to one; `None` when the settings name no persona and no user name.
    pub fn resolve(&self, locked: Option<&str>) -> Option<Persona> {
        let chosen = [
            locked,
            self.default_avatar.as_deref(),
            self.current_avatar.as_deref(),
        ]
        .into_iter()
        .flatten()
        .find_map(|a| self.by_avatar.get(a));
        match chosen {
            Some(p) => Some(p.clone()),
            None => self.username.as_ref().map(|name| Persona {
                name: name.clone(),
                description: self.description.clone(),
            }),
        }
    }

    /// These fields as a `settings.json` of their own (what an import keeps of the user's).
    pub fn to_settings(&self) -> Value {
        let names: Map<String, Value> = self
            .by_avatar
            .iter()
            .map(|(a, p)| (a.clone(), json!(p.name)))
            .collect();
        let descriptions: Map<String, Value> = self
            .by_avatar
            .iter()
            .map(|(a, p)| (a.clone(), json!({"description": p.description})))
            .collect();
        json!({
            "username": self.username,
            "user_avatar": self.current_avatar,
            "power_user": {
                "personas": names,
                "persona_descriptions": descriptions,
                "default_persona": self.default_avatar,
                "persona_description": self.description,
            },
            "world_info_settings": {"world_info": self.lore.to_world_info()},
        })
    }
}

/// The avatar a chat's header (its first line) locks the chat's persona to, if any.
pub fn persona_lock(head: Option<&tavern_core::chat::ChatLine>) -> Option<&str> {
    head?
        .object()
        .get("chat_metadata")?
        .get("persona")?
        .as_str()
        .filter(|a| !a.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest `settings.json` SillyTavern itself writes with two personas (built here:
    /// no public one was found; the field names are those of `script.js` `saveSettings` and
    /// `power-user.js`), with a secret-bearing field that must not be kept.
    fn settings() -> Value {
        json!({
            "username": "Kai",
            "user_avatar": "user-default.png",
            "proxies": [{"name": "p", "url": "https://x", "password": "hunter2"}],
            "power_user": {
                "personas": {"user-default.png": "白羽", "1700000000000-knight.png": "Sir Aldous"},
                "persona_descriptions": {
                    "user-default.png": {"description": "一名来自北方的旅人。", "position": 0, "depth": 2, "role": 0},
                    "1700000000000-knight.png": {"description": "A knight of {{char}}'s order.", "position": 0},
                },
                "default_persona": null,
                "persona_description": "unused while a persona is selected",
            },
            "world_info_settings": {"world_info": {
                "globalSelect": ["Eldoria"],
                "charLore": [{"name": "Seraphina", "extraBooks": ["tarot", ""]}, {"name": "Nobody", "extraBooks": []}],
            }},
        })
    }

    #[test]
    fn the_lore_selection_is_read() {
        let p = Personas::from_settings(settings().to_string().as_bytes()).unwrap();
        assert_eq!(p.lore.global, ["Eldoria"]);
        assert_eq!(
            p.lore.extra,
            BTreeMap::from([("Seraphina".to_owned(), vec!["tarot".to_owned()])])
        );
    }

    #[test]
    fn a_chat_uses_its_lock_then_the_default_then_the_selection() {
        let p = Personas::from_settings(settings().to_string().as_bytes()).unwrap();
        let name = |lock: Option<&str>, p: &Personas| p.resolve(lock).unwrap().name;
        // Not locked, no default: the persona selected last.
        assert_eq!(name(None, &p), "白羽");
        assert_eq!(p.resolve(None).unwrap().description, "一名来自北方的旅人。");
        // Locked to the knight.
        assert_eq!(name(Some("1700000000000-knight.png"), &p), "Sir Aldous");
        // Locked to a persona since deleted: as not locked.
        assert_eq!(name(Some("gone.png"), &p), "白羽");
        // A default persona wins over the selection, not over a lock.
        let mut with_default = p.clone();
        with_default.default_avatar = Some("1700000000000-knight.png".into());
        assert_eq!(name(None, &with_default), "Sir Aldous");
        assert_eq!(name(Some("user-default.png"), &with_default), "白羽");
        // A selection that names no persona: the user name and the plain description.
        let mut bare = p.clone();
        bare.current_avatar = Some("none.png".into());
        let r = bare.resolve(None).unwrap();
        assert_eq!(
            (r.name.as_str(), r.description.as_str()),
            ("Kai", "unused while a persona is selected")
        );
    }

    #[test]
    fn only_persona_fields_are_kept_and_they_read_back_the_same() {
        let p = Personas::from_settings(settings().to_string().as_bytes()).unwrap();
        let kept = p.to_settings().to_string();
        assert!(
            !kept.contains("hunter2") && !kept.contains("proxies"),
            "{kept}"
        );
        assert_eq!(Personas::from_settings(kept.as_bytes()).unwrap(), p);
    }

    #[test]
    fn settings_that_are_not_an_object_are_refused_by_name() {
        for bad in ["[1]", "nope"] {
            let e = Personas::from_settings(bad.as_bytes()).unwrap_err();
            assert!(e.to_string().contains("settings.json"), "{e}");
        }
        // An object without personas is no persona at all.
        assert_eq!(Personas::from_settings(b"{}").unwrap().resolve(None), None);
    }
}
