//! The one normalizer for persisted state: legacy JSON in, normalized [`TavernState`] plus
//! diagnostics out. Never fails and never panics; everything it changes or sets aside is
//! reported, and no binding is ever lost: one it cannot read is kept verbatim under
//! [`INVALID_BINDINGS`] and recovered by a later version whose rules accept it.

use serde_json::{Map, Value};

use crate::binding::{
    BindingEntry, BindingTarget, ContextMode, SessionBinding, StateChange, TavernArchitecture,
    TavernState,
};
use crate::error::excerpt;
use crate::ids::{CharacterName, ChatId, SessionId};

/// Something the normalizer changed or dropped, with where it was (a JSON pointer) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// JSON pointer into the input, e.g. `/sessionBindings/s1/contextMode`.
    pub path: String,
    /// Lowercase explanation naming the offending value.
    pub message: String,
}

/// Keys of a binding object the normalizer understands; everything else is preserved.
const BINDING_KEYS: [&str; 5] = [
    "character",
    "chatId",
    "group",
    "architecture",
    "contextMode",
];
const STATE_KEYS: [&str; 8] = [
    "changes",
    "sessionBindings",
    INVALID_BINDINGS,
    "defaultArchitecture",
    "defaultContextMode",
    "allowGlobalWrites",
    "requireForgetConfirmation",
    "requireCrossCharacterConfirmation",
];

/// The top-level key under which bindings the normalizer cannot read are kept, verbatim and keyed
/// by their session key, in [`TavernState::extra`] (so every writer re-emits them). They are
/// inactive; the normalizer tries them again on every load and moves each one it can now read
/// back into the session bindings. This is the migration path for rules that got wider: chats
/// named in Chinese or with `#` were refused by the ASCII-only chat-id rule before 2026-12-01.
pub const INVALID_BINDINGS: &str = "invalidBindings";

/// Normalizes persisted state.
///
/// Rules: a binding without `architecture` (legacy) or with an unknown one is `st`; an
/// `agent-tavern` binding without or with an invalid `contextMode` is `dsh-native`; a group
/// binding is always `st`; a binding whose character, chat or session id is blank or invalid is
/// set aside under [`INVALID_BINDINGS`] (reported once, when it is set aside); a set-aside
/// binding the current rules accept is recovered (reported), unless its session has a binding
/// again (then it is removed, reported); `contextMode` on an `st` binding is dropped; unknown
/// fields are kept. Normalization is idempotent: `normalize_state(&normalize_state(x).0.to_json())`
/// returns the same state and no diagnostics.
pub fn normalize_state(input: &Value) -> (TavernState, Vec<Diagnostic>) {
    let mut diags = Vec::new();
    let mut state = TavernState::default();
    let Some(obj) = input.as_object() else {
        diags.push(diag(
            "",
            format!(
                "state is {} instead of an object; starting from defaults",
                kind(input)
            ),
        ));
        return (state, diags);
    };

    if let Some(v) = obj.get("defaultArchitecture") {
        match v.as_str().and_then(TavernArchitecture::from_label) {
            Some(a) => state.default_architecture = a,
            None => diags.push(diag(
                "/defaultArchitecture",
                format!(
                    "unknown default architecture {}; using agent-tavern",
                    show(v)
                ),
            )),
        }
    }
    if let Some(v) = obj.get("defaultContextMode") {
        match v.as_str().and_then(ContextMode::from_label) {
            Some(m) => state.default_context_mode = m,
            None => diags.push(diag(
                "/defaultContextMode",
                format!("unknown default context mode {}; using dsh-native", show(v)),
            )),
        }
    }
    read_flag(
        obj,
        "allowGlobalWrites",
        &mut state.allow_global_writes,
        &mut diags,
    );
    read_flag(
        obj,
        "requireForgetConfirmation",
        &mut state.require_forget_confirmation,
        &mut diags,
    );
    read_flag(
        obj,
        "requireCrossCharacterConfirmation",
        &mut state.require_cross_character_confirmation,
        &mut diags,
    );

    match obj.get("changes") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            let mut unreadable = 0;
            for (i, item) in items.iter().enumerate() {
                match serde_json::from_value::<StateChange>(item.clone()) {
                    Ok(change) => state.record_change(change),
                    // The first one is named; a file full of them is one more line, not
                    // thousands.
                    Err(e) => {
                        unreadable += 1;
                        if unreadable == 1 {
                            diags.push(diag(
                                &format!("/changes/{i}"),
                                format!("unreadable change dropped: {}", excerpt(&e.to_string())),
                            ));
                        }
                    }
                }
            }
            if unreadable > 1 {
                diags.push(diag(
                    "/changes",
                    format!("{} more unreadable changes dropped", unreadable - 1),
                ));
            }
        }
        Some(other) => diags.push(diag(
            "/changes",
            format!("changes are {} instead of a list; ignored", kind(other)),
        )),
    }

    let mut invalid = Map::new();
    let mut seen = std::collections::BTreeSet::new();
    match obj.get("sessionBindings") {
        None | Some(Value::Null) => {}
        Some(Value::Object(bindings)) => {
            for (key, raw) in bindings {
                seen.insert(key.clone());
                let path = format!("/sessionBindings/{}", pointer_escape(key));
                let Ok(session) = SessionId::parse(key.as_str()) else {
                    diags.push(diag(
                        &path,
                        format!("binding set aside: invalid session id {:?}", excerpt(key)),
                    ));
                    invalid.insert(key.clone(), raw.clone());
                    continue;
                };
                match normalize_binding(raw, &path, &mut diags) {
                    Some(entry) => {
                        state.bindings.insert(session, entry);
                    }
                    None => {
                        invalid.insert(key.clone(), raw.clone());
                    }
                }
            }
        }
        Some(other) => diags.push(diag(
            "/sessionBindings",
            format!(
                "session bindings are {} instead of an object; ignored",
                kind(other)
            ),
        )),
    }

    match obj.get(INVALID_BINDINGS) {
        None | Some(Value::Null) => {}
        Some(Value::Object(earlier)) => {
            for (key, raw) in earlier {
                let path = format!("/{INVALID_BINDINGS}/{}", pointer_escape(key));
                if seen.contains(key) {
                    diags.push(diag(
                        &path,
                        "set-aside binding superseded by the session's current binding; removed"
                            .into(),
                    ));
                    continue;
                }
                // Still unreadable: kept silently (it was reported when it was set aside).
                let mut quiet = Vec::new();
                let recovered = SessionId::parse(key.as_str())
                    .ok()
                    .and_then(|s| normalize_binding(raw, &path, &mut quiet).map(|e| (s, e)));
                match recovered {
                    Some((session, entry)) => {
                        diags.push(diag(
                            &path,
                            "recovered a binding set aside earlier: the current rules accept it"
                                .into(),
                        ));
                        diags.extend(quiet);
                        state.bindings.insert(session, entry);
                    }
                    None => {
                        invalid.insert(key.clone(), raw.clone());
                    }
                }
            }
        }
        Some(other) => diags.push(diag(
            &format!("/{INVALID_BINDINGS}"),
            format!(
                "set-aside bindings are {} instead of an object; ignored",
                kind(other)
            ),
        )),
    }

    for (k, v) in obj {
        if !STATE_KEYS.contains(&k.as_str()) {
            state.extra.insert(k.clone(), v.clone());
        }
    }
    if !invalid.is_empty() {
        state
            .extra
            .insert(INVALID_BINDINGS.to_owned(), Value::Object(invalid));
    }
    (state, diags)
}

fn normalize_binding(raw: &Value, path: &str, diags: &mut Vec<Diagnostic>) -> Option<BindingEntry> {
    let Some(obj) = raw.as_object() else {
        diags.push(diag(
            path,
            format!("binding set aside: {} instead of an object", kind(raw)),
        ));
        return None;
    };
    let character = required_text(obj, "character", path, diags)?;
    let character = match CharacterName::parse(character.trim()) {
        Ok(c) => c,
        Err(e) => {
            diags.push(diag(
                &format!("{path}/character"),
                format!("binding set aside: {e}"),
            ));
            return None;
        }
    };
    let chat = required_text(obj, "chatId", path, diags)?;
    let chat_id = match ChatId::parse(chat.trim()) {
        Ok(c) => c,
        Err(e) => {
            diags.push(diag(
                &format!("{path}/chatId"),
                format!("binding set aside: {e}"),
            ));
            return None;
        }
    };
    let group = match obj.get("group") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            diags.push(diag(
                &format!("{path}/group"),
                format!(
                    "group flag {} is not a boolean; treated as a group",
                    show(other)
                ),
            ));
            // Fail closed: a doubtful group flag keeps the session on `st`.
            true
        }
    };
    let architecture = match obj.get("architecture") {
        None | Some(Value::Null) => {
            diags.push(diag(
                &format!("{path}/architecture"),
                "legacy binding without architecture; set to st".into(),
            ));
            TavernArchitecture::St
        }
        Some(v) => match v.as_str().and_then(TavernArchitecture::from_label) {
            Some(a) => a,
            None => {
                diags.push(diag(
                    &format!("{path}/architecture"),
                    format!("unknown architecture {}; set to st", show(v)),
                ));
                TavernArchitecture::St
            }
        },
    };
    let raw_mode = obj.get("contextMode").filter(|v| !v.is_null());
    let target = BindingTarget {
        character,
        chat_id,
        group,
    };
    let binding = match architecture {
        TavernArchitecture::AgentTavern if group => {
            diags.push(diag(
                &format!("{path}/architecture"),
                "group chats cannot use agent-tavern; set to st".into(),
            ));
            SessionBinding::St { target }
        }
        TavernArchitecture::AgentTavern => {
            let context_mode = match raw_mode {
                None => {
                    diags.push(diag(
                        &format!("{path}/contextMode"),
                        "agent-tavern binding without context mode; set to dsh-native".into(),
                    ));
                    ContextMode::DshNative
                }
                Some(v) => match v.as_str().and_then(ContextMode::from_label) {
                    Some(m) => m,
                    None => {
                        diags.push(diag(
                            &format!("{path}/contextMode"),
                            format!("unknown context mode {}; set to dsh-native", show(v)),
                        ));
                        ContextMode::DshNative
                    }
                },
            };
            SessionBinding::AgentTavern {
                target,
                context_mode,
            }
        }
        TavernArchitecture::St => {
            if let Some(v) = raw_mode {
                diags.push(diag(
                    &format!("{path}/contextMode"),
                    format!("st bindings have no context mode; dropped {}", show(v)),
                ));
            }
            SessionBinding::St { target }
        }
    };
    let extra = obj
        .iter()
        .filter(|(k, _)| !BINDING_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(BindingEntry { binding, extra })
}

fn required_text<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
    diags: &mut Vec<Diagnostic>,
) -> Option<&'a str> {
    match obj.get(key).and_then(Value::as_str) {
        Some(s) if !s.trim().is_empty() => Some(s),
        _ => {
            diags.push(diag(
                &format!("{path}/{key}"),
                format!("binding set aside: {key} is missing or blank"),
            ));
            None
        }
    }
}

fn read_flag(obj: &Map<String, Value>, key: &str, slot: &mut bool, diags: &mut Vec<Diagnostic>) {
    match obj.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => *slot = *b,
        Some(other) => diags.push(diag(
            &format!("/{key}"),
            format!("{key} {} is not a boolean; kept {}", show(other), slot),
        )),
    }
}

fn diag(path: &str, message: String) -> Diagnostic {
    Diagnostic {
        path: path.to_owned(),
        message,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn show(v: &Value) -> String {
    excerpt(&v.to_string())
}

fn pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}
