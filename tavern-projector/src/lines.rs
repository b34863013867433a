//! Every chat line AgentTavern writes is built here: new chat headers, card greetings,
//! projected messages and fork headers, so the `extra.agentTavern` block and SillyTavern's
//! field order are decided in one place.

use serde_json::{json, Map, Value};
use tavern_core::chat::{header_line, message_line, ChatLine, SendDate};
use tavern_core::{CharacterName, ChatId, SessionBinding, SessionId, Timestamp};

/// A new chat's header line, as SillyTavern writes one.
pub fn header(user_name: &str, character: &CharacterName, now: Timestamp) -> ChatLine {
    header_line(
        user_name,
        character.as_str(),
        &now.0.to_string(),
        Map::new(),
    )
}

/// `extra` with the `agentTavern` block.
fn extra(block: Map<String, Value>) -> Map<String, Value> {
    let mut extra = Map::new();
    extra.insert("agentTavern".into(), Value::Object(block));
    extra
}

/// The card's greeting as the chat's first message (not a model turn, so no event seq),
/// spoken by `name`, the card's display name.
pub fn greeting(session: &SessionId, name: &str, text: &str, now: Timestamp) -> ChatLine {
    let mut at = Map::new();
    at.insert("sessionId".into(), json!(session.as_str()));
    at.insert("greeting".into(), json!(true));
    message_line(name, false, &SendDate::Millis(now.0), text, extra(at))
}

/// Where a projected message came from: its idempotency key `(session, event seq)` plus the
/// turn, step and the binding's architecture and mode.
#[derive(Debug, Clone, Copy)]
pub struct Provenance<'a> {
    /// The session.
    pub session: &'a SessionId,
    /// The binding at projection time.
    pub binding: &'a SessionBinding,
    /// The host event's seq.
    pub event_seq: u64,
    /// Turn.
    pub turn: u64,
    /// Step.
    pub step: u64,
}

/// A projected message line.
pub fn projected(
    provenance: Provenance<'_>,
    speaker: &str,
    is_user: bool,
    time_ms: i64,
    text: &str,
) -> ChatLine {
    let p = provenance;
    let mut at = Map::new();
    at.insert("sessionId".into(), json!(p.session.as_str()));
    at.insert("eventSeq".into(), json!(p.event_seq));
    at.insert("turn".into(), json!(p.turn));
    at.insert("step".into(), json!(p.step));
    at.insert(
        "architecture".into(),
        json!(p.binding.architecture().as_str()),
    );
    at.insert(
        "contextMode".into(),
        json!(p.binding.context_mode().map(|m| m.as_str())),
    );
    message_line(
        speaker,
        is_user,
        &SendDate::Millis(time_ms),
        text,
        extra(at),
    )
}

/// The idempotency key of a projected line, if it is one of `session`'s.
pub fn projected_seq(line: &ChatLine, session: &SessionId) -> Option<u64> {
    let at = line.extra()?.get("agentTavern")?;
    (at.get("sessionId")?.as_str()? == session.as_str())
        .then(|| at.get("eventSeq")?.as_u64())
        .flatten()
}

/// A fork's header: the origin's header (or, for a headerless group chat, SillyTavern's group
/// header) with `chat_metadata` replaced by `metadata` plus `main_chat` pointing back at the
/// origin chat (SillyTavern's branch link); every other header field kept.
pub fn fork_header(
    origin: Option<&ChatLine>,
    origin_chat: &ChatId,
    mut metadata: Map<String, Value>,
) -> ChatLine {
    metadata.insert("main_chat".into(), json!(origin_chat.as_str()));
    let mut header = match origin {
        Some(h) => h.object().clone(),
        None => {
            let mut h = Map::new();
            h.insert("user_name".into(), json!("unused"));
            h.insert("character_name".into(), json!("unused"));
            h
        }
    };
    header.insert("chat_metadata".into(), Value::Object(metadata));
    ChatLine::from_object(header)
}
