//! SillyTavern chat JSONL: a header line, then one message per line. Parsing keeps every line's
//! original text, so unchanged lines are written back byte for byte; new lines are serialized
//! in SillyTavern's field order. Files join lines with `\n` and have no trailing newline.

use serde_json::{Map, Value};

use crate::error::CoreError;

/// A message's `send_date`: epoch milliseconds in old chats, text in newer ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendDate {
    /// Epoch milliseconds.
    Millis(i64),
    /// SillyTavern's human-readable form, e.g. `September 19, 2024 8:03pm`.
    Text(String),
}

/// One line of a chat: its original text and its parsed object.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatLine {
    raw: String,
    value: Map<String, Value>,
}

impl ChatLine {
    /// Parses one line (a JSON object on one line).
    ///
    /// # Errors
    /// [`CoreError::InvalidField`] when the line is not a JSON object or holds a line break.
    pub fn parse(raw: &str) -> Result<Self, CoreError> {
        if raw.contains(['\n', '\r']) {
            return Err(CoreError::InvalidField {
                field: "chat line",
                reason: "a line break inside one line".into(),
            });
        }
        match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(value)) => Ok(Self {
                raw: raw.to_owned(),
                value,
            }),
            Ok(_) => Err(CoreError::InvalidField {
                field: "chat line",
                reason: "not a json object".into(),
            }),
            Err(e) => Err(CoreError::InvalidField {
                field: "chat line",
                reason: format!("not json: {e}"),
            }),
        }
    }

    /// A new line from an object (serialized compactly, in the object's field order).
    pub fn from_object(value: Map<String, Value>) -> Self {
        let raw = Value::Object(value.clone()).to_string();
        Self { raw, value }
    }

    /// The exact text of the line.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The parsed object.
    pub fn object(&self) -> &Map<String, Value> {
        &self.value
    }

    fn str_field(&self, key: &str) -> Option<&str> {
        self.value.get(key).and_then(Value::as_str)
    }

    /// `name` of a message line.
    pub fn name(&self) -> Option<&str> {
        self.str_field("name")
    }

    /// `mes`, the message text.
    pub fn text(&self) -> &str {
        self.str_field("mes").unwrap_or("")
    }

    /// Whether the user wrote it.
    pub fn is_user(&self) -> bool {
        self.value
            .get("is_user")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// Whether it is a system/narrator line.
    pub fn is_system(&self) -> bool {
        self.value
            .get("is_system")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// `send_date` in either representation.
    pub fn send_date(&self) -> Option<SendDate> {
        match self.value.get("send_date")? {
            Value::Number(n) => n.as_i64().map(SendDate::Millis),
            Value::String(s) => Some(SendDate::Text(s.clone())),
            _ => None,
        }
    }

    /// The alternative replies (`swipes`), if any.
    pub fn swipes(&self) -> Vec<&str> {
        self.value
            .get("swipes")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    /// For a header line: `chat_metadata.main_chat`, the chat this one was branched from.
    pub fn main_chat(&self) -> Option<&str> {
        self.value.get("chat_metadata")?.get("main_chat")?.as_str()
    }

    /// `extra` (API, model, AgentTavern projection keys, …).
    pub fn extra(&self) -> Option<&Map<String, Value>> {
        self.value.get("extra").and_then(Value::as_object)
    }
}

/// A whole chat: header and messages.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatDocument {
    /// The first line: `user_name`, `character_name`, `create_date`, `chat_metadata`.
    pub header: ChatLine,
    /// Every following line.
    pub messages: Vec<ChatLine>,
}

impl ChatDocument {
    /// Parses JSONL text: `\n` or `\r\n` line ends, trailing newline optional, blank lines
    /// ignored.
    ///
    /// # Errors
    /// [`CoreError::InvalidField`] naming the 1-based line that is not a JSON object, or an empty
    /// file.
    pub fn parse(text: &str) -> Result<Self, CoreError> {
        let mut lines = text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let Some((_, header)) = lines.next() else {
            return Err(CoreError::InvalidField {
                field: "chat",
                reason: "empty file: a chat needs at least its header line".into(),
            });
        };
        let header = ChatLine::parse(header)?;
        let mut messages = Vec::new();
        for (i, line) in lines {
            messages.push(ChatLine::parse(line).map_err(|e| CoreError::InvalidField {
                field: "chat",
                reason: format!("line {}: {e}", i + 1),
            })?);
        }
        Ok(Self { header, messages })
    }

    /// A document from lines already parsed (the first is the header).
    ///
    /// # Errors
    /// [`CoreError::InvalidField`] for no lines.
    pub fn from_lines(lines: Vec<ChatLine>) -> Result<Self, CoreError> {
        let mut lines = lines.into_iter();
        let header = lines.next().ok_or_else(|| CoreError::InvalidField {
            field: "chat",
            reason: "empty file: a chat needs at least its header line".into(),
        })?;
        Ok(Self {
            header,
            messages: lines.collect(),
        })
    }

    /// The lines in file order (header first).
    pub fn lines(&self) -> impl Iterator<Item = &ChatLine> {
        std::iter::once(&self.header).chain(&self.messages)
    }

    /// The lines in file order (header first) as their raw text.
    pub fn raw_lines(&self) -> Vec<String> {
        std::iter::once(&self.header)
            .chain(&self.messages)
            .map(|l| l.raw.clone())
            .collect()
    }

    /// The file text: lines joined by `\n`, no trailing newline (as SillyTavern writes).
    pub fn to_text(&self) -> String {
        self.raw_lines().join("\n")
    }

    /// `chat_metadata.main_chat`: the chat this one was branched from.
    pub fn parent_chat(&self) -> Option<&str> {
        self.header.main_chat()
    }
}

/// Builds a new message line in SillyTavern's field order: `name`, `is_user`, `is_system`,
/// `send_date`, `mes`, `extra`.
pub fn message_line(
    name: &str,
    is_user: bool,
    send_date: &SendDate,
    text: &str,
    extra: Map<String, Value>,
) -> ChatLine {
    let mut m = Map::new();
    m.insert("name".into(), name.into());
    m.insert("is_user".into(), is_user.into());
    m.insert("is_system".into(), false.into());
    m.insert(
        "send_date".into(),
        match send_date {
            SendDate::Millis(ms) => (*ms).into(),
            SendDate::Text(t) => t.clone().into(),
        },
    );
    m.insert("mes".into(), text.into());
    m.insert("extra".into(), Value::Object(extra));
    ChatLine::from_object(m)
}

/// Builds a header line.
pub fn header_line(
    user_name: &str,
    character_name: &str,
    create_date: &str,
    metadata: Map<String, Value>,
) -> ChatLine {
    let mut m = Map::new();
    m.insert("user_name".into(), user_name.into());
    m.insert("character_name".into(), character_name.into());
    m.insert("create_date".into(), create_date.into());
    m.insert("chat_metadata".into(), Value::Object(metadata));
    ChatLine::from_object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_lines_round_trip_byte_for_byte() {
        let text = "{\"user_name\":\"You\", \"create_date\":1674559900991}\r\n{\"name\":\"A\",\"is_user\":false,\"send_date\":1674563153854,\"mes\":\"line\\r\\nbreak\"}\n{\"name\":\"You\",\"is_user\":true,\"send_date\":\"July 13, 2023 11:21pm\",\"mes\":\"hi\",\"swipes\":[\"a\",\"b\"]}";
        let doc = ChatDocument::parse(text).unwrap();
        assert_eq!(doc.messages.len(), 2);
        assert_eq!(doc.messages[0].text(), "line\r\nbreak");
        assert_eq!(
            doc.messages[0].send_date(),
            Some(SendDate::Millis(1674563153854))
        );
        assert_eq!(
            doc.messages[1].send_date(),
            Some(SendDate::Text("July 13, 2023 11:21pm".into()))
        );
        assert_eq!(doc.messages[1].swipes(), ["a", "b"]);
        assert!(doc.messages[1].is_user());
        assert_eq!(doc.to_text(), text.replace("\r\n", "\n"));
        assert_eq!(
            doc.header.raw(),
            "{\"user_name\":\"You\", \"create_date\":1674559900991}"
        );
    }

    #[test]
    fn bad_lines_are_named() {
        let err = ChatDocument::parse("{}\n[1]\n").unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(ChatDocument::parse("\n\n").is_err());
    }

    #[test]
    fn new_lines_follow_sillytavern_field_order() {
        let line = message_line("Mira", false, &SendDate::Millis(5), "hello", Map::new());
        assert_eq!(
            line.raw(),
            r#"{"name":"Mira","is_user":false,"is_system":false,"send_date":5,"mes":"hello","extra":{}}"#
        );
    }
}
