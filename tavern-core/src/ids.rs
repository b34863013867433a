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

            /// Whether `value` is valid, without copying it (a reader validating many
            /// values it keeps as bytes).
            pub fn is_valid(value: &str) -> bool {
                $check(value).is_ok()
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
    /// A SillyTavern chat file name without extension, as real users have them: any Unicode
    /// (`七大姑 - 2024-10-05@21h59m30s`, `Branch #38 - 2024-1-5@16h52m07s`, emoji) except
    /// `/ \ : * ? " < > |`, NUL and control characters; not `.` or `..`; no leading or trailing
    /// whitespace; at most 200 UTF-8 bytes. File stores encode what is unsafe on some file
    /// system (reserved device names, trailing dots) when they build a file name from it.
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

/// Characters SillyTavern (and Windows) refuse in file names.
const CHAT_ID_FORBIDDEN: [char; 9] = ['/', '\\', ':', '*', '?', '"', '<', '>', '|'];

/// Longest chat id in UTF-8 bytes (leaves room for `.jsonl` and encoding within 255 bytes).
pub const CHAT_ID_MAX_BYTES: usize = 200;

fn check_chat_id(v: &str) -> Result<(), &'static str> {
    if v.trim().is_empty() {
        return Err("must not be blank");
    }
    if v.len() > CHAT_ID_MAX_BYTES {
        return Err("longer than 200 bytes");
    }
    if v.chars().any(char::is_control) {
        return Err("must not contain NUL or control characters");
    }
    if v.contains(CHAT_ID_FORBIDDEN) {
        return Err("must not contain '/', '\\', ':', '*', '?', '\"', '<', '>' or '|'");
    }
    if v == "." || v == ".." {
        return Err("must not be '.' or '..'");
    }
    if v.trim() != v {
        return Err("must not start or end with whitespace");
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

    /// `(input, accepted)`: chat file stems from real SillyTavern data folders (CJK, branches
    /// with `#`, emoji, quotes, commas, parentheses, Windows device names — which are legal ids:
    /// the file store encodes them) and what the rule refuses.
    #[test]
    fn chat_ids_as_real_users_have_them() {
        let long_ok = "长".repeat(66); // 198 bytes
        let long_bad = "长".repeat(67); // 201 bytes
        let cases: &[(&str, bool)] = &[
            ("Seraphina - 2024-09-19@20h03m29s", true),
            ("Aqua_1677261616514", true),
            ("a.b", true),
            ("x..y", true),
            (".hidden", true),
            ("七大姑 - 2024-10-05@21h59m30s", true),
            ("Branch #38 - 2024-1-5@16h52m07s", true),
            ("Mira 🌙 - 2024-3-1@1h2m3s", true),
            ("Mira's day, part 2 (draft)", true),
            ("CON", true),
            ("aux.txt", true),
            ("ends with dot.", true),
            ("100% [done] {ok} ~ ^ & $ ! = + ;", true),
            (&long_ok, true),
            (&long_bad, false),
            ("", false),
            (" ", false),
            (".", false),
            ("..", false),
            ("../x", false),
            ("a/b", false),
            ("a\\b", false),
            ("a:b", false),
            ("a*b", false),
            ("a?b", false),
            ("a\"b", false),
            ("a<b", false),
            ("a>b", false),
            ("a|b", false),
            ("a\0b", false),
            ("a\nb", false),
            ("a\u{7f}b", false),
            (" lead", false),
            ("trail ", false),
            ("trail\u{3000}", false),
        ];
        for (input, ok) in cases {
            assert_eq!(ChatId::parse(*input).is_ok(), *ok, "{input:?}");
            assert_eq!(ChatId::is_valid(input), *ok, "{input:?}");
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
            "invalid chat id \"../etc\": must not contain '/', '\\', ':', '*', '?', '\"', '<', '>' or '|'"
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
