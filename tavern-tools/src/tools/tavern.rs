//! The read-only tavern tools: `tavern_character_get`, `tavern_lore_search`,
//! `tavern_history_search`, `tavern_scene_get`.

use serde_json::{json, Map, Value};
use tavern_core::chat::{ChatDocument, ChatLine, SendDate};
use tavern_core::{ChatId, DefaultTokenEstimator, TokenEstimator};
use tavern_store::search::{query_tokens, Bm25Index};

use super::{
    fit, limit_param, list_result, object, query_param, result, tokens_param, Args, ToolSpec,
};
use crate::assets::card::{Card, CARD_TEXT_FIELDS};
use crate::context::{ToolContext, ToolLimits};
use crate::error::ToolError;
use crate::lore::{self, LoreContext, LoreOptions, LoreSource};
use crate::registry::ToolServices;

/// Fields `tavern_character_get` serves beyond the card's text fields.
const EXTRA_FIELDS: [&str; 4] = ["alternate_greetings", "tags", "persona", "group_members"];

fn character_fields() -> Vec<&'static str> {
    CARD_TEXT_FIELDS
        .iter()
        .chain(EXTRA_FIELDS.iter())
        .copied()
        .collect()
}
const DEFAULT_FIELDS: [&str; 4] = ["name", "description", "personality", "scenario"];

pub(crate) fn specs(l: &ToolLimits) -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "tavern_character_get",
            description: "Read fields of the current character's card, the user's persona or the group members. Long fields are cut to the token budget and listed in truncatedFields.",
            parameters: object(json!({
                "fields": {"type": "array", "minItems": 1, "maxItems": character_fields().len(), "items": {"type": "string", "enum": character_fields()},
                    "description": "Which fields (default name, description, personality, scenario)."},
                "maxTokens": tokens_param(l),
            }), &[]),
            result: result(json!({"fields": {"type": "object"}, "truncatedFields": {"type": "array"}, "source": {"type": "object"}})),
            writes: false,
        },
        ToolSpec {
            name: "tavern_lore_search",
            description: "Search the world lore (globally active books, the book the card links and the card's own book) as SillyTavern activates it. Entries whose keys appear in the query come first, then entries their content activates in turn, then entries that match its words.",
            parameters: object(json!({
                "query": {"type": "string", "maxLength": l.max_query_chars,
                    "description": "Text to activate lore with (keys are matched in it) and words to rank by; an empty string activates and ranks nothing: only always-on entries come back (when includeConstant is set), with the entries their content activates."},
                "limit": limit_param(l),
                "maxTokens": tokens_param(l),
                "includeConstant": {"type": "boolean", "description": "Also return always-on (constant) entries."},
            }), &["query"]),
            result: list_result(json!({"type": "object", "properties": {
                "book": {"type": "string"}, "source": {"type": "string"}, "uid": {"type": "integer"},
                "comment": {"type": "string"}, "keys": {"type": "array"}, "content": {"type": "string"},
                "reason": {"type": "string", "enum": ["keyword", "recursion", "lexical", "constant"]}, "score": {"type": "number"}}})),
            writes: false,
        },
        ToolSpec {
            name: "tavern_history_search",
            description: "Search earlier messages of this chat (and, if asked, the chat it was branched from). An empty query returns the latest messages.",
            parameters: object(json!({
                "query": query_param(l, "the chat history"),
                "limit": limit_param(l),
                "maxTokens": tokens_param(l),
                "includeParent": {"type": "boolean", "description": "Also search the chat this one was branched from."},
            }), &["query"]),
            result: list_result(json!({"type": "object", "properties": {
                "chat": {"type": "string", "enum": ["current", "parent"]}, "index": {"type": "integer"},
                "name": {"type": "string"}, "isUser": {"type": "boolean"}, "sendDate": {}, "text": {"type": "string"}, "score": {"type": "number"}}})),
            writes: false,
        },
        ToolSpec {
            name: "tavern_scene_get",
            description: "Read the current scene: who is speaking, the chat's size and dates, the scenario and the author's note.",
            parameters: object(json!({"maxTokens": tokens_param(l)}), &[]),
            result: result(json!({"character": {"type": "string"}, "user": {"type": "string"}, "chat": {"type": "object"},
                "speakers": {"type": "array"}, "scenario": {"type": "string"}, "note": {"type": "string"},
                "architecture": {"type": "string"}, "contextMode": {"type": "string"}, "turn": {"type": "integer"}, "now": {"type": "integer"},
                "truncatedFields": {"type": "array"}})),
            writes: false,
        },
    ]
}

async fn card(svc: &ToolServices, ctx: &ToolContext) -> Result<Card, ToolError> {
    let character = &ctx.binding().target().character;
    svc.assets
        .card(character)
        .await
        .map_err(|e| ToolError::Unavailable {
            reason: e.to_string(),
        })?
        .ok_or_else(|| ToolError::NotFound {
            what: format!("card of {character}"),
        })
}

/// The current chat, or `None` when it has no file yet.
async fn chat(
    svc: &ToolServices,
    ctx: &ToolContext,
    id: &ChatId,
) -> Result<Option<ChatDocument>, ToolError> {
    let character = &ctx.binding().target().character;
    let Some(file) = svc.chats.read_chat(character, id).await? else {
        return Ok(None);
    };
    ChatDocument::from_lines(file.lines)
        .map(Some)
        .map_err(|e| ToolError::Unavailable {
            reason: format!("chat {id} is unreadable: {e}"),
        })
}

fn send_date_json(line: &ChatLine) -> Value {
    match line.send_date() {
        Some(SendDate::Millis(ms)) => json!(ms),
        Some(SendDate::Text(t)) => json!(t),
        None => Value::Null,
    }
}

pub(crate) async fn call(
    name: &str,
    svc: &ToolServices,
    ctx: &ToolContext,
    args: &Map<String, Value>,
) -> Result<Value, ToolError> {
    let a = Args(args);
    let l = ctx.limits();
    let budget = a.usize_or("maxTokens", l.default_tokens);
    match name {
        "tavern_character_get" => {
            let card = card(svc, ctx).await?;
            let wanted: Vec<&str> = if a.strs("fields").is_empty() {
                DEFAULT_FIELDS.to_vec()
            } else {
                a.strs("fields")
            };
            let mut left = budget;
            let mut fields = Map::new();
            let mut cut = Vec::new();
            for f in wanted {
                let value = match f {
                    "alternate_greetings" => json!(card.alternate_greetings()),
                    "tags" => json!(card.tags()),
                    "group_members" => json!([]),
                    "persona" => {
                        let p = svc.assets.persona().await;
                        json!({"name": p.name, "description": p.description})
                    }
                    text if CARD_TEXT_FIELDS.contains(&text) => {
                        json!(card.field(text).unwrap_or(""))
                    }
                    _ => continue,
                };
                match value {
                    // Text fields are cut at a character boundary and listed as cut.
                    Value::String(text) => {
                        let (kept, was_cut) = fit(&text, left);
                        left = left.saturating_sub(DefaultTokenEstimator.estimate(&kept));
                        if was_cut {
                            cut.push(f);
                        }
                        fields.insert(f.into(), json!(kept));
                    }
                    // Structured fields come whole or not at all.
                    other => {
                        let tokens = DefaultTokenEstimator.estimate(&other.to_string());
                        if tokens <= left {
                            left -= tokens;
                            fields.insert(f.into(), other);
                        } else {
                            cut.push(f);
                        }
                    }
                }
            }
            Ok(json!({"fields": fields, "truncatedFields": cut,
                "source": {"kind": "card", "character": card.name(), "spec": card.version().as_str()}}))
        }
        "tavern_lore_search" => {
            let mut books = Vec::new();
            let card = card(svc, ctx).await.ok();
            if let Some(book) = card.as_ref().and_then(Card::embedded_book) {
                books.push((LoreSource::Embedded, book));
            }
            let linked = card
                .as_ref()
                .and_then(|c| c.linked_world().map(str::to_owned));
            if let Some(name) = &linked {
                if let Some(book) =
                    svc.assets
                        .world(name)
                        .await
                        .map_err(|e| ToolError::Unavailable {
                            reason: e.to_string(),
                        })?
                {
                    books.push((LoreSource::CardLinked, book));
                }
            }
            for name in svc.assets.global_worlds().await {
                if Some(&name) == linked.as_ref() {
                    continue;
                }
                if let Some(book) =
                    svc.assets
                        .world(&name)
                        .await
                        .map_err(|e| ToolError::Unavailable {
                            reason: e.to_string(),
                        })?
                {
                    books.push((LoreSource::Global, book));
                }
            }
            let opts = LoreOptions {
                include_constant: a.bool_or("includeConstant", false),
                limit: a.usize_or("limit", l.default_results),
                max_tokens: budget,
                ..LoreOptions::default()
            };
            let character = &ctx.binding().target().character;
            let persona = svc.assets.persona().await;
            let who = LoreContext {
                character: card
                    .as_ref()
                    .map_or(character.as_str(), Card::name)
                    .to_owned(),
                user: persona.name,
                character_ids: std::iter::once(character.to_string())
                    .chain(card.as_ref().map(|c| c.name().to_owned()))
                    .collect(),
                tags: card
                    .as_ref()
                    .map(|c| c.tags().into_iter().map(str::to_owned).collect())
                    .unwrap_or_default(),
            };
            let res = lore::search_with(&books, a.str("query").unwrap_or(""), &opts, &who);
            Ok(json!({
                "items": res.hits.iter().map(|h| json!({
                    "book": h.book, "source": h.source.as_str(), "uid": h.entry.uid, "comment": h.entry.comment,
                    "keys": h.entry.keys, "content": h.content, "reason": h.reason.label(),
                    "score": (h.score * 1000.0).round() / 1000.0,
                })).collect::<Vec<_>>(),
                "sourceCount": res.source_count, "truncated": res.truncated, "truncatedBy": res.truncated_by,
                "warnings": res.warnings, "duplicates": res.duplicates,
                "source": {"kind": "lore", "books": books.iter().map(|(s, b)| json!({"name": b.name, "source": s.as_str(), "entries": b.entries.len()})).collect::<Vec<_>>()},
            }))
        }
        "tavern_history_search" => {
            let current_id = ctx.binding().target().chat_id.clone();
            let mut chats: Vec<(&str, ChatDocument)> = Vec::new();
            if let Some(doc) = chat(svc, ctx, &current_id).await? {
                let parent = doc.parent_chat().and_then(|p| ChatId::parse(p).ok());
                chats.push(("current", doc));
                if a.bool_or("includeParent", false) {
                    if let Some(pid) = parent {
                        if let Some(pdoc) = chat(svc, ctx, &pid).await? {
                            chats.push(("parent", pdoc));
                        }
                    }
                }
            }
            let query = a.str("query").unwrap_or("");
            // (chat position, message index, score)
            let mut found: Vec<(usize, usize, f64)> = Vec::new();
            for (c, (_, doc)) in chats.iter().enumerate() {
                if query.trim().is_empty() {
                    found.extend((0..doc.messages.len()).map(|i| (c, i, 0.0)));
                } else {
                    let mut index = Bm25Index::new();
                    for (i, m) in doc.messages.iter().enumerate() {
                        index.insert(u32::try_from(i).unwrap_or(u32::MAX), m.text());
                    }
                    found.extend(
                        index
                            .score(&query_tokens(query))
                            .into_iter()
                            .map(|(i, s)| (c, i as usize, f64::from(s))),
                    );
                }
            }
            // Best first; ties (and an empty query) newest first, current chat before parent.
            found.sort_by(|x, y| y.2.total_cmp(&x.2).then(x.0.cmp(&y.0)).then(y.1.cmp(&x.1)));
            let limit = a.usize_or("limit", l.default_results);
            let mut items = Vec::new();
            let (mut used, mut truncated_by) = (0usize, None);
            for (c, i, score) in &found {
                if items.len() == limit {
                    truncated_by = Some("limit");
                    break;
                }
                let m = &chats[*c].1.messages[*i];
                let tokens = DefaultTokenEstimator.estimate(m.text()) + 8;
                if used + tokens > budget {
                    truncated_by = Some("max-tokens");
                    break;
                }
                used += tokens;
                items.push(json!({"chat": chats[*c].0, "index": i, "name": m.name().unwrap_or(""), "isUser": m.is_user(),
                    "sendDate": send_date_json(m), "text": m.text(), "score": (score * 1000.0).round() / 1000.0}));
            }
            Ok(
                json!({"items": items, "sourceCount": found.len(), "truncated": truncated_by.is_some(), "truncatedBy": truncated_by,
                "source": {"kind": "chat", "chats": chats.iter().map(|(k, d)| json!({"chat": k, "messages": d.messages.len()})).collect::<Vec<_>>()}}),
            )
        }
        "tavern_scene_get" => {
            let target = ctx.binding().target();
            let doc = chat(svc, ctx, &target.chat_id).await?;
            let card = card(svc, ctx).await.ok();
            let persona = svc.assets.persona().await;
            let header = doc
                .as_ref()
                .and_then(|d| d.header.as_ref())
                .map(|h| h.object().clone())
                .unwrap_or_default();
            let messages = doc.as_ref().map_or(&[][..], |d| &d.messages[..]);
            let mut speakers: Vec<&str> = Vec::new();
            for m in messages.iter().rev().take(20) {
                if let Some(n) = m.name() {
                    if !speakers.contains(&n) {
                        speakers.push(n);
                    }
                }
            }
            let half = budget / 2;
            let (scenario, s_cut) = fit(
                card.as_ref()
                    .and_then(|c| c.field("scenario"))
                    .unwrap_or(""),
                half,
            );
            let note_raw = header
                .get("chat_metadata")
                .and_then(|m| m.get("note_prompt"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let (note, n_cut) = fit(note_raw, budget - half);
            let cut: Vec<&str> = [("scenario", s_cut), ("note", n_cut)]
                .into_iter()
                .filter(|c| c.1)
                .map(|c| c.0)
                .collect();
            let user = header
                .get("user_name")
                .and_then(Value::as_str)
                .map_or(persona.name.clone(), str::to_owned);
            Ok(json!({
                "character": target.character.as_str(),
                "user": user,
                "chat": {"id": target.chat_id.as_str(), "messageCount": messages.len(),
                    "createDate": header.get("create_date").cloned().unwrap_or(Value::Null),
                    "lastMessageDate": messages.last().map(send_date_json).unwrap_or(Value::Null),
                    "parent": doc.as_ref().and_then(ChatDocument::parent_chat)},
                "speakers": speakers, "scenario": scenario, "note": note,
                "architecture": ctx.binding().architecture().as_str(), "contextMode": ctx.context_mode().as_str(),
                "turn": ctx.turn(), "now": ctx.now().0, "truncatedFields": cut,
            }))
        }
        other => Err(ToolError::UnknownTool(other.to_owned())),
    }
}
