//! Validated id newtypes. Every constructor is a strict `parse`; a value that exists is valid, so
//! storage code can build file names from it without re-checking (and still encodes them).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{excerpt, CoreError};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $check:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value` and wraps it.
            ///
            /// # Errors
            /// [`CoreError::InvalidId`] naming the rule that refused the value.
            pub fn parse(value: impl Into<String>) -> Result<Self, CoreError> {
                let value = value.into();
                match $check(&value) {
                    Ok(()) => Ok(Self(value)),
                    Err(reason) => Err(CoreError::InvalidId {
                        kind: $kind,
                        value: excerpt(&value),
                        reason,
                    }),
                }
            }

            /// The validated text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = CoreError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::parse(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

id_type!(
    /// A host session id (DSH: the agent's session id). `[A-Za-z0-9_.-]{1,128}`, no `..`.
    SessionId, "session id", check_token
);
id_type!(
    /// A host agent id. Same alphabet as [`SessionId`]; in DSH rc.6 it equals the session id.
    AgentId, "agent id", check_token
);
id_type!(
    /// A SillyTavern chat file name without extension: `[A-Za-z0-9@ _.-]{1,80}`, no `..`, no
    /// leading dot or surrounding spaces.
    ChatId, "chat id", check_chat_id
);
id_type!(
    /// A character (card) name: 1–128 printable characters, no path separators, NUL or controls,
    /// not `.`/`..`, no surrounding whitespace.
    CharacterName, "character name", check_character_name
);
id_type!(
    /// A memory record id: `[A-Za-z0-9_-]{1,64}`.
    MemoryId, "memory id", check_memory_id
);
id_type!(
    /// A variable name: a Unicode letter or `_`, then up to 63 letters, digits, `_`, `.` or `-`
    /// (`当前周期` and `basic.好感度` are legal).
    VariableName, "variable name", check_variable_name
);
id_type!(
    /// A memory tag: 1–64 characters, no control characters, no surrounding whitespace.
    Tag, "tag", check_tag
);

fn check_token(v: &str) -> Result<(), &'static str> {
    if v.is_empty() {
        return Err("must not be empty");
    }
    if v.len() > 128 {
        return Err("longer than 128 bytes");
    }
    if !v
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err("only ascii letters, digits, '_', '.' and '-' are allowed");
    }
    if v.starts_with('.') || v.contains("..") {
        return Err("must not start with '.' or contain '..'");
    }
    Ok(())
}

fn check_chat_id(v: &str) -> Result<(), &'static str> {
    if v.trim().is_empty() {
        return Err("must not be blank");
    }
    if v.len() > 80 {
        return Err("longer than 80 bytes");
    }
    if !v
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'@' | b' ' | b'_' | b'.' | b'-'))
    {
        return Err("only ascii letters, digits, '@', ' ', '_', '.' and '-' are allowed");
    }
    if v.starts_with('.') || v.contains("..") {
        return Err("must not start with '.' or contain '..'");
    }
    if v.trim() != v {
        return Err("must not start or end with a space");
    }
    Ok(())
}

fn check_character_name(v: &str) -> Result<(), &'static str> {
    if v.trim().is_empty() {
        return Err("must not be blank");
    }
    if v.trim() != v {
        return Err("must not start or end with whitespace");
    }
    if v.chars().count() > 128 {
        return Err("longer than 128 characters");
    }
    if v.chars().any(|c| c.is_control() || matches!(c, '/' | '\\')) {
        return Err("must not contain '/', '\\', NUL or control characters");
    }
    if v == "." || v == ".." || v.contains("..") {
        return Err("must not be or contain '..'");
    }
    Ok(())
}

fn check_memory_id(v: &str) -> Result<(), &'static str> {
    if v.is_empty() || v.len() > 64 {
        return Err("must be 1 to 64 bytes");
    }
    if !v
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
    {
        return Err("only ascii letters, digits, '_' and '-' are allowed");
    }
    Ok(())
}

/// `\p{L}` is approximated by `char::is_alphabetic` (which also admits combining marks and letter
/// numbers) and `\p{N}` by `char::is_numeric`; both are stable across std versions.
fn check_variable_name(v: &str) -> Result<(), &'static str> {
    let mut chars = v.chars();
    let Some(first) = chars.next() else {
        return Err("must not be empty");
    };
    if !(first.is_alphabetic() || first == '_') {
        return Err("must start with a letter or '_'");
    }
    if v.chars().count() > 64 {
        return Err("longer than 64 characters");
    }
    if !chars.all(|c| c.is_alphabetic() || c.is_numeric() || matches!(c, '_' | '.' | '-')) {
        return Err("only letters, digits, '_', '.' and '-' are allowed");
    }
    Ok(())
}

fn check_tag(v: &str) -> Result<(), &'static str> {
    if v.trim().is_empty() {
        return Err("must not be blank");
    }
    if v.trim() != v {
        return Err("must not start or end with whitespace");
    }
    if v.chars().count() > 64 {
        return Err("longer than 64 characters");
    }
    if v.chars().any(char::is_control) {
        return Err("must not contain control characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_ids_from_real_sillytavern_files_parse() {
        for ok in [
            "Seraphina - 2024-09-19@20h03m29s",
            "Aqua_1677261616514",
            "a.b",
        ] {
            assert!(ChatId::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", " ", "../x", "a/b", "a\\b", "a\0b", ".hidden", "x..y", " lead", "中文",
        ] {
            assert!(ChatId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn variable_names_accept_cjk_and_reject_bad_starts() {
        for ok in ["当前周期", "basic.好感度", "_x", "hp-max", "a1"] {
            assert!(VariableName::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1abc", ".x", "a b", "a/b", "a\0", &"x".repeat(65)] {
            assert!(VariableName::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn errors_name_the_kind_value_and_rule() {
        let err = ChatId::parse("../etc").unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid chat id \"../etc\": only ascii letters, digits, '@', ' ', '_', '.' and '-' are allowed"
        );
    }

    #[test]
    fn serde_round_trip_validates() {
        let id: SessionId = serde_json::from_str("\"s-1\"").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"s-1\"");
        assert!(serde_json::from_str::<SessionId>("\"../x\"").is_err());
    }

    #[test]
    fn character_names_allow_unicode_but_not_separators() {
        assert!(CharacterName::parse("门之主写卡助手").is_ok());
        assert!(CharacterName::parse("Seraphina").is_ok());
        for bad in ["", "..", ".", "a/b", "a\\b", "a\nb", " x"] {
            assert!(CharacterName::parse(bad).is_err(), "{bad:?}");
        }
    }
}
