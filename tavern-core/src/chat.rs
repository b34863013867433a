//! SillyTavern chat JSONL: a header line, then one message per line. Parsing keeps every line's
//! original text, so unchanged lines are written back byte for byte; new lines are serialized
//! in SillyTavern's field order. Files join lines with `\n` and have no trailing newline.
//!
//! Group chats written by SillyTavern before its 1.12 releases have **no header line**: every
//! line is a message (`name`, `is_user`, `send_date`, `mes`, `original_avatar`, `extra`, …).
//! Newer ones start with `{"chat_metadata": …, "user_name": "unused", "character_name":
//! "unused"}`. A first line counts as the header when it has no `mes` and has at least one of
//! `chat_metadata`, `user_name`, `character_name` or `create_date` (what SillyTavern's header
//! holds and a message never does); otherwise the chat has no header and the line is a message.

use serde_json::{Map, Value};

use crate::error::CoreError;
use crate::ids::VariableName;
use crate::record::{json_size, validate_variable_value, VARIABLE_SCOPE_MAX_BYTES};

/// A message's `send_date`: epoch milliseconds in old chats, text in newer ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendDate {
    /// Epoch milliseconds.
    Millis(i64),
    /// SillyTavern's human-readable form, e.g. `September 19, 2024 8:03pm`.
    Text(String),
}

impl SendDate {
    /// The moment as epoch milliseconds: milliseconds as they are; text in SillyTavern's
    /// forms — `September 19, 2024 8:03pm` (the writer's local time, read with `zone`), ISO
    /// `2024-09-19T20:03:29.118Z` (local time when it names no zone), or digits of
    /// milliseconds. `None` for text in no form it knows.
    pub fn millis(&self, zone: &dyn crate::UtcOffsets) -> Option<i64> {
        let text = match self {
            Self::Millis(ms) => return Some(*ms),
            Self::Text(t) => t.trim(),
        };
        if !text.is_empty() && text.len() <= 16 && text.bytes().all(|b| b.is_ascii_digit()) {
            return text.parse().ok();
        }
        let (local, explicit) =
            parse_iso(text).or_else(|| parse_humanized(text).map(|l| (l, None)))?;
        Some(match explicit {
            Some(offset_ms) => local - offset_ms,
            // Local time: the offset at that moment (the offset barely moves in a day, so the
            // guess from the local reading is right outside the hour a clock changes).
            None => local - i64::from(zone.minutes_at(crate::Timestamp(local))) * 60_000,
        })
    }
}

/// `YYYY-MM-DD[T ]HH:MM[:SS[.fff]][Z|±hh:mm]`: (local milliseconds as if UTC, the explicit
/// offset in milliseconds when one is written).
fn parse_iso(text: &str) -> Option<(i64, Option<i64>)> {
    let b = text.as_bytes();
    if b.len() < 16
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b' ')
        || b[13] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (year, month, day, hour, minute) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
    );
    let mut rest = &text[16..];
    let mut ms = 0i64;
    if let Some(r) = rest.strip_prefix(':') {
        let secs: String = r.chars().take_while(char::is_ascii_digit).collect();
        ms += secs.parse::<i64>().ok()? * 1000;
        rest = &r[secs.len()..];
        if let Some(r) = rest.strip_prefix('.') {
            let frac: String = r.chars().take_while(char::is_ascii_digit).collect();
            let first3: String = frac.chars().chain("000".chars()).take(3).collect();
            ms += first3.parse::<i64>().ok()?;
            rest = &r[frac.len()..];
        }
    }
    let local = civil_millis(year, month, day, hour, minute)? + ms;
    let explicit = match rest {
        "" => None,
        "Z" | "z" => Some(0),
        zone => Some(i64::from(crate::FixedOffset::parse(zone)?.0) * 60_000),
    };
    Some((local, explicit))
}

/// SillyTavern's `humanizedDateTime` reading: `September 19, 2024 8:03pm` (also `8:03 pm`,
/// `20:03`), local milliseconds as if UTC.
fn parse_humanized(text: &str) -> Option<i64> {
    let mut words = text.split([' ', ',']).filter(|w| !w.is_empty());
    let month_word = words.next()?;
    let month = crate::calendar::MONTHS.iter().position(|m| {
        m.eq_ignore_ascii_case(month_word)
            || (month_word.len() >= 3 && m[..3].eq_ignore_ascii_case(month_word))
    })?;
    let day: i64 = words.next()?.parse().ok()?;
    let year: i64 = words.next()?.parse().ok()?;
    let clock: String = words.collect::<Vec<_>>().concat().to_ascii_lowercase();
    let (clock, pm) = match (clock.strip_suffix("pm"), clock.strip_suffix("am")) {
        (Some(c), _) => (c.to_owned(), Some(true)),
        (_, Some(c)) => (c.to_owned(), Some(false)),
        _ => (clock, None),
    };
    let (h, m) = clock.split_once(':')?;
    let (mut hour, minute): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    match pm {
        Some(true) if hour < 12 => hour += 12,
        Some(false) if hour == 12 => hour = 0,
        _ => {}
    }
    civil_millis(year, i64::try_from(month + 1).ok()?, day, hour, minute)
}

/// Milliseconds of a civil date and time read as UTC; `None` out of range.
fn civil_millis(year: i64, month: i64, day: i64, hour: i64, minute: i64) -> Option<i64> {
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || !(0..24).contains(&hour)
        || !(0..60).contains(&minute)
        || !(0..=9999).contains(&year)
    {
        return None;
    }
    let days = crate::calendar::days_from_civil(
        year,
        u32::try_from(month).ok()?,
        u32::try_from(day).ok()?,
    );
    Some(days * 86_400_000 + hour * 3_600_000 + minute * 60_000)
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

/// Keys of SillyTavern's header line that a message line never has.
const HEADER_KEYS: [&str; 4] = [
    "chat_metadata",
    "user_name",
    "character_name",
    "create_date",
];

impl ChatLine {
    /// Whether this line is a chat header rather than a message (see the module doc).
    pub fn is_header(&self) -> bool {
        !self.value.contains_key("mes") && HEADER_KEYS.iter().any(|k| self.value.contains_key(*k))
    }
}

/// A whole chat: header (if it has one) and messages.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatDocument {
    /// The first line when it is a header: `user_name`, `character_name`, `create_date`,
    /// `chat_metadata`. `None` for headerless (older group) chats.
    pub header: Option<ChatLine>,
    /// Every message line, in file order.
    pub messages: Vec<ChatLine>,
}

impl ChatDocument {
    /// Parses JSONL text: `\n` or `\r\n` line ends, trailing newline optional, blank lines
    /// ignored. The first line is the header only when it looks like one (see the module doc);
    /// headerless group chats are all messages.
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
        let Some((i, first)) = lines.next() else {
            return Err(CoreError::InvalidField {
                field: "chat",
                reason: "empty file: a chat needs at least one line".into(),
            });
        };
        let at = |i: usize| {
            move |e: CoreError| CoreError::InvalidField {
                field: "chat",
                reason: format!("line {}: {e}", i + 1),
            }
        };
        let first = ChatLine::parse(first).map_err(at(i))?;
        let (header, mut messages) = if first.is_header() {
            (Some(first), Vec::new())
        } else {
            (None, vec![first])
        };
        for (i, line) in lines {
            messages.push(ChatLine::parse(line).map_err(at(i))?);
        }
        Ok(Self { header, messages })
    }

    /// A document from lines already parsed: the first is the header only when it looks like
    /// one (as in [`ChatDocument::parse`]).
    ///
    /// # Errors
    /// [`CoreError::InvalidField`] for no lines.
    pub fn from_lines(lines: Vec<ChatLine>) -> Result<Self, CoreError> {
        let mut lines = lines.into_iter();
        let first = lines.next().ok_or_else(|| CoreError::InvalidField {
            field: "chat",
            reason: "empty file: a chat needs at least one line".into(),
        })?;
        let (header, mut messages) = if first.is_header() {
            (Some(first), Vec::new())
        } else {
            (None, vec![first])
        };
        messages.extend(lines);
        Ok(Self { header, messages })
    }

    /// The lines in file order (header first, if any).
    pub fn lines(&self) -> impl Iterator<Item = &ChatLine> {
        self.header.iter().chain(&self.messages)
    }

    /// The lines in file order (header first, if any) as their raw text.
    pub fn raw_lines(&self) -> Vec<String> {
        self.header
            .iter()
            .chain(&self.messages)
            .map(|l| l.raw.clone())
            .collect()
    }

    /// The file text: lines joined by `\n`, no trailing newline (as SillyTavern writes).
    pub fn to_text(&self) -> String {
        self.raw_lines().join("\n")
    }

    /// The header's `chat_metadata`, if the chat has a header holding one.
    pub fn metadata(&self) -> Option<&Map<String, Value>> {
        self.header
            .as_ref()?
            .object()
            .get("chat_metadata")
            .and_then(Value::as_object)
    }

    /// `chat_metadata.main_chat`: the chat this one was branched from.
    pub fn parent_chat(&self) -> Option<&str> {
        self.header.as_ref()?.main_chat()
    }
}

/// A SillyTavern chat's variables (`chat_metadata.variables`, what `/setvar` writes) split for
/// import as AgentTavern chat-scope variables.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StVariables {
    /// Variables whose name is a valid [`VariableName`] and whose value fits the variable limits
    /// (in file order, until the scope limit), with their values unchanged.
    pub importable: Vec<(VariableName, Value)>,
    /// Everything else (names such as `my var`, oversized values), untouched: it stays in the
    /// chat's metadata so nothing is lost.
    pub kept: Map<String, Value>,
}

/// Splits `chat_metadata.variables` for import: values keep their JSON type (SillyTavern stores
/// strings and numbers; an object or array it stored as JSON text stays that text).
pub fn split_st_variables(variables: &Map<String, Value>) -> StVariables {
    let mut out = StVariables::default();
    let mut total = 0usize;
    for (name, value) in variables {
        let size = name.len() + json_size(value);
        match VariableName::parse(name.as_str()) {
            Ok(n)
                if validate_variable_value(value).is_ok()
                    && total + size <= VARIABLE_SCOPE_MAX_BYTES =>
            {
                total += size;
                out.importable.push((n, value.clone()));
            }
            _ => {
                out.kept.insert(name.clone(), value.clone());
            }
        }
    }
    out
}

/// A variable value in SillyTavern's shape for `chat_metadata.variables`: strings and numbers
/// as they are (what `/setvar` and `/addvar` store); booleans, null, arrays and objects as their
/// compact JSON text (how SillyTavern itself stores structured values, e.g. `/setvar index=`).
pub fn to_st_variable_value(value: &Value) -> Value {
    match value {
        Value::String(_) | Value::Number(_) => value.clone(),
        other => Value::String(other.to_string()),
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

    #[test]
    fn send_dates_in_every_sillytavern_form_become_moments() {
        use crate::FixedOffset;
        let utc = FixedOffset(0);
        let beijing = FixedOffset(480);
        // 2024-09-19 20:03 UTC.
        let at = 1_726_776_180_000;
        let text = |t: &str| SendDate::Text(t.to_owned());
        assert_eq!(SendDate::Millis(5).millis(&utc), Some(5));
        assert_eq!(text("September 19, 2024 8:03pm").millis(&utc), Some(at));
        // Written in Beijing, local time: eight hours earlier in UTC.
        assert_eq!(text("September 20, 2024 4:03am").millis(&beijing), Some(at));
        assert_eq!(text("Sep 19, 2024 8:03 PM").millis(&utc), Some(at));
        assert_eq!(
            text("September 19, 2024 12:00am").millis(&utc),
            Some(at - 20 * 3_600_000 - 180_000)
        );
        assert_eq!(text("2024-09-19T20:03:00.000Z").millis(&beijing), Some(at));
        assert_eq!(text("2024-09-20T04:03:00+08:00").millis(&utc), Some(at));
        assert_eq!(text("2024-09-19 20:03").millis(&utc), Some(at));
        assert_eq!(text("1726776180000").millis(&utc), Some(at));
        for bad in [
            "",
            "yesterday",
            "Smarch 3, 2024 1:00pm",
            "2024-13-01T00:00Z",
            "September 19, 2024 25:00",
        ] {
            assert_eq!(text(bad).millis(&utc), None, "{bad}");
        }
    }

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
            doc.header.as_ref().map(ChatLine::raw),
            Some("{\"user_name\":\"You\", \"create_date\":1674559900991}")
        );
    }

    /// `(first line, is a header)`: SillyTavern headers of every era, and message lines
    /// (including the first line of an old headerless group chat).
    #[test]
    fn header_lines_are_told_from_messages() {
        let cases: &[(&str, bool)] = &[
            (
                r#"{"user_name":"You","character_name":"Seraphina","create_date":"2024-09-19@20h03m29s","chat_metadata":{}}"#,
                true,
            ),
            (
                r#"{"chat_metadata":{"variables":{}},"user_name":"unused","character_name":"unused"}"#,
                true,
            ),
            (
                r#"{"user_name":"You","character_name":"Megumin","create_date":1673323621108}"#,
                true,
            ),
            (
                r#"{"name":"Alice","is_user":false,"send_date":"2023-5-1 @12h 0m 0s 0ms","mes":"Hi","original_avatar":"Alice.png","extra":{}}"#,
                false,
            ),
            (
                r#"{"name":"You","is_user":true,"is_name":true,"send_date":1683000000000,"mes":"hello","extra":{}}"#,
                false,
            ),
            (
                r#"{"name":"System","is_system":true,"mes":"","extra":{"type":"narrator"}}"#,
                false,
            ),
            ("{}", false),
        ];
        for (line, header) in cases {
            assert_eq!(
                ChatLine::parse(line).unwrap().is_header(),
                *header,
                "{line}"
            );
        }
    }

    #[test]
    fn bad_lines_are_named() {
        let err = ChatDocument::parse("{\"user_name\":\"u\"}\n[1]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(ChatDocument::parse("\n\n").is_err());
    }

    /// `(chat_metadata.variables, imported names, kept names)`: SillyTavern variable names that
    /// are not AgentTavern variable names, and oversized values, stay in the metadata.
    #[test]
    fn st_variables_split_for_import() {
        let big = "x".repeat(40 * 1024);
        let cases: Vec<(Value, Vec<&str>, Vec<&str>)> = vec![
            (
                serde_json::json!({"好感度": "50", "hp": 10, "basic.mood": "calm"}),
                vec!["好感度", "hp", "basic.mood"],
                vec![],
            ),
            (
                serde_json::json!({"my var": "1", "1st": "a", "ok": "[1,2]"}),
                vec!["ok"],
                vec!["my var", "1st"],
            ),
            (
                serde_json::json!({"huge": big, "n": 1}),
                vec!["n"],
                vec!["huge"],
            ),
        ];
        for (vars, imported, kept) in cases {
            let split = split_st_variables(vars.as_object().unwrap());
            let names: Vec<&str> = split.importable.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, imported, "{vars}");
            let k: Vec<&str> = split.kept.keys().map(String::as_str).collect();
            assert_eq!(k, kept);
            for (n, v) in &split.importable {
                assert_eq!(v, &vars[n.as_str()], "values keep their type");
            }
        }
    }

    #[test]
    fn variables_are_exported_in_sillytavern_shape() {
        use serde_json::json;
        let cases = [
            (json!("50"), json!("50")),
            (json!(7), json!(7)),
            (json!(1.5), json!(1.5)),
            (json!(true), json!("true")),
            (json!(null), json!("null")),
            (json!([1, "a"]), json!("[1,\"a\"]")),
            (json!({"k": 1}), json!("{\"k\":1}")),
        ];
        for (ours, st) in cases {
            assert_eq!(to_st_variable_value(&ours), st, "{ours}");
        }
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
