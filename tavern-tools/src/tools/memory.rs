//! `memory_search`, `memory_read`, `memory_write`, `memory_update`, `memory_forget`.

use serde_json::{json, Map, Value};
use tavern_core::revision::short_digest;
use tavern_core::{MemoryId, MemoryKind, MemoryRecord, MemoryWrite, Scope, Tag};
use tavern_store::{MemoryQuery, TagMatch};

use super::{
    limit_param, list_result, object, query_param, result, revision_param, scope_param,
    tokens_param, Args, ToolSpec,
};
use crate::context::{ToolContext, ToolLimits};
use crate::error::ToolError;
use crate::registry::ToolServices;

/// Scopes memories can live in (turn-local memories make no sense; use variables).
const MEMORY_SCOPES: [Scope; 4] = [Scope::Chat, Scope::Character, Scope::Agent, Scope::Global];

fn record_schema() -> Value {
    json!({"type": "object", "properties": {
        "id": {"type": "string"}, "scope": {"type": "string"}, "kind": {"type": "string"},
        "content": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
        "importance": {"type": "number"}, "confidence": {"type": "number"},
        "revision": {"type": "string"}, "createdAt": {"type": "integer"}, "updatedAt": {"type": "integer"},
        "expiresAt": {"type": "integer"}, "source": {"type": "object"},
        "score": {"type": "number"}, "deduplicated": {"type": "boolean"}, "forgotten": {"type": "boolean"}
    }})
}

pub(crate) fn specs(l: &ToolLimits) -> Vec<ToolSpec> {
    let id = json!({"type": "string", "minLength": 1, "maxLength": 64, "description": "The memory id, as returned by memory_search or memory_write."});
    let kind = json!({"type": "string", "enum": ["semantic", "episodic"], "description": "semantic: a lasting fact; episodic: something that happened."});
    let tags = json!({"type": "array", "maxItems": l.max_tags, "items": {"type": "string", "minLength": 1, "maxLength": 64}});
    let unit =
        |what: &str| json!({"type": "number", "minimum": 0, "maximum": 1, "description": what});
    let content = json!({"type": "string", "minLength": 1, "maxLength": l.max_memory_bytes, "description": "The memory, one self-contained statement."});
    let ttl = json!({"type": "integer", "minimum": 1, "maximum": 31_536_000, "description": "Seconds until it expires (expired memories are hidden, not deleted)."});
    let confirmed = json!({"type": "boolean", "description": "Set only after the user confirmed this action in the conversation."});
    vec![
        ToolSpec {
            name: "memory_search",
            description: "Search long-term memories by words (Chinese works too), newest first for an empty query. Returns scored memories with their ids and revisions; an empty list means nothing matched.",
            parameters: object(json!({
                "query": query_param(l, "memories"),
                "scopes": {"type": "array", "maxItems": 4, "items": scope_param(&MEMORY_SCOPES, Scope::Chat), "description": "Scope kinds to search (default all)."},
                "kinds": {"type": "array", "maxItems": 2, "items": kind},
                "tags": tags.clone(),
                "tagMatch": {"type": "string", "enum": ["any", "all"]},
                "limit": limit_param(l),
                "maxTokens": tokens_param(l),
            }), &["query"]),
            result: list_result(record_schema()),
            writes: false,
        },
        ToolSpec {
            name: "memory_read",
            description: "Read one memory by id, with its source and revision.",
            parameters: object(json!({"id": id, "scope": scope_param(&MEMORY_SCOPES, Scope::Chat)}), &["id"]),
            result: record_schema(),
            writes: false,
        },
        ToolSpec {
            name: "memory_write",
            description: "Store a new memory (default scope: this chat). Writing what is already stored returns the existing memory marked deduplicated.",
            parameters: object(json!({
                "content": content.clone(), "kind": kind.clone(), "tags": tags.clone(),
                "importance": unit("How much it matters, 0 to 1 (default 0.5)."),
                "confidence": unit("How sure it is, 0 to 1 (default 0.8)."),
                "scope": scope_param(&MEMORY_SCOPES, Scope::Chat), "ttlSeconds": ttl.clone(),
                "confirmed": confirmed.clone(),
            }), &["content"]),
            result: record_schema(),
            writes: true,
        },
        ToolSpec {
            name: "memory_update",
            description: "Change a memory you read before: give its id and revision; on a revision conflict, read it again and retry.",
            parameters: object(json!({
                "id": id, "scope": scope_param(&MEMORY_SCOPES, Scope::Chat), "revision": revision_param("memory"),
                "content": content, "kind": kind, "tags": tags,
                "importance": unit("0 to 1."), "confidence": unit("0 to 1."), "ttlSeconds": ttl,
                "confirmed": confirmed.clone(),
            }), &["id", "revision"]),
            result: record_schema(),
            writes: true,
        },
        ToolSpec {
            name: "memory_forget",
            description: "Forget a memory (it is hidden, kept for audit, never erased). Needs its id and revision.",
            parameters: object(json!({
                "id": id, "scope": scope_param(&MEMORY_SCOPES, Scope::Chat), "revision": revision_param("memory"),
                "confirmed": confirmed,
            }), &["id", "revision"]),
            result: result(json!({"id": {"type": "string"}, "revision": {"type": "string"}, "forgotten": {"type": "boolean"}})),
            writes: true,
        },
    ]
}

pub(crate) fn record_json(r: &MemoryRecord) -> Value {
    let mut v = json!({
        "id": r.id.as_str(), "scope": r.scope.scope().as_str(), "kind": r.kind.as_str(),
        "content": r.content, "tags": r.tags.iter().map(Tag::as_str).collect::<Vec<_>>(),
        "importance": r.importance, "confidence": r.confidence, "revision": r.revision.as_str(),
        "createdAt": r.created_at.0, "updatedAt": r.updated_at.0,
        "source": serde_json::to_value(&r.source).unwrap_or(Value::Null),
    });
    if let Some(e) = r.expires_at {
        v["expiresAt"] = json!(e.0);
    }
    v
}

fn memory_id(raw: &str) -> Result<MemoryId, ToolError> {
    MemoryId::parse(raw).map_err(|e| ToolError::invalid("id", e.to_string()))
}

fn tags(args: &Args<'_>) -> Result<Vec<Tag>, ToolError> {
    args.strs("tags")
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            Tag::parse(t.trim())
                .map_err(|e| ToolError::invalid(format!("tags[{i}]"), e.to_string()))
        })
        .collect()
}

fn kind(args: &Args<'_>) -> Option<MemoryKind> {
    args.str("kind").map(|k| {
        if k == "episodic" {
            MemoryKind::Episodic
        } else {
            MemoryKind::Semantic
        }
    })
}

fn check_write(ctx: &ToolContext, scope: Scope, args: &Args<'_>) -> Result<(), ToolError> {
    ctx.policy()
        .check_write(scope, args.bool_or("confirmed", false))
        .map_err(|d| ToolError::ScopeDenied {
            scope: scope.to_string(),
            reason: d.to_string(),
        })
}

fn normalized(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

pub(crate) async fn call(
    name: &str,
    svc: &ToolServices,
    ctx: &ToolContext,
    args: &Map<String, Value>,
) -> Result<Value, ToolError> {
    let a = Args(args);
    let l = ctx.limits();
    match name {
        "memory_search" => {
            let scopes: Vec<Scope> = if a.strs("scopes").is_empty() {
                MEMORY_SCOPES.to_vec()
            } else {
                a.strs("scopes")
                    .into_iter()
                    .filter_map(Scope::from_label)
                    .collect()
            };
            let mut q = MemoryQuery::new(
                a.str("query").unwrap_or(""),
                scopes.iter().map(|s| ctx.scope(*s)).collect(),
            );
            q.kinds = a
                .strs("kinds")
                .into_iter()
                .map(|k| {
                    if k == "episodic" {
                        MemoryKind::Episodic
                    } else {
                        MemoryKind::Semantic
                    }
                })
                .collect();
            q.tags = tags(&a)?;
            q.tag_match = if a.str("tagMatch") == Some("all") {
                TagMatch::All
            } else {
                TagMatch::Any
            };
            q.limit = a.usize_or("limit", l.default_results);
            q.max_tokens = Some(a.usize_or("maxTokens", l.default_tokens));
            let res = svc.memory.search(&q).await?;
            let items: Vec<Value> = res
                .hits
                .iter()
                .map(|h| {
                    let mut v = record_json(&h.record);
                    v["score"] = json!((h.score * 1000.0).round() / 1000.0);
                    v
                })
                .collect();
            Ok(json!({
                "items": items, "sourceCount": res.source_count, "truncated": res.truncated,
                "truncatedBy": res.truncated_by,
                "source": {"kind": "memory", "scopes": scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>()},
            }))
        }
        "memory_read" => {
            let id = memory_id(a.str("id").unwrap_or_default())?;
            let scope = a.scope_or("scope", Scope::Chat);
            match svc.memory.read(&id, &ctx.scope(scope)).await? {
                Some(r) => Ok(record_json(&r)),
                None => Err(ToolError::NotFound {
                    what: format!("memory {id} in scope {scope}"),
                }),
            }
        }
        "memory_write" => {
            let scope = a.scope_or("scope", Scope::Chat);
            check_write(ctx, scope, &a)?;
            let key = ctx.scope(scope);
            let content = a.str("content").unwrap_or_default().trim().to_owned();
            if content.is_empty() {
                return Err(ToolError::invalid("content", "must not be blank"));
            }
            // The same statement already stored in this scope: return it, store no copy.
            let mut probe = MemoryQuery::new(content.clone(), vec![key.clone()]);
            probe.limit = 20;
            let wanted = normalized(&content);
            if let Some(hit) = svc
                .memory
                .search(&probe)
                .await?
                .hits
                .into_iter()
                .find(|h| normalized(&h.record.content) == wanted)
            {
                let mut v = record_json(&hit.record);
                v["deduplicated"] = json!(true);
                return Ok(v);
            }
            // Derived from the call id: a host retrying the same call cannot create a duplicate.
            let id = memory_id(&format!(
                "m{}",
                short_digest(&[
                    ctx.session().as_str().as_bytes(),
                    ctx.call_id().as_bytes(),
                    content.as_bytes()
                ])
            ))?;
            let write = MemoryWrite {
                id: id.clone(),
                scope: key.clone(),
                kind: kind(&a).unwrap_or(MemoryKind::Semantic),
                content,
                tags: tags(&a)?,
                importance: a.f64("importance").unwrap_or(0.5),
                confidence: a.f64("confidence").unwrap_or(0.8),
                source: ctx.source(),
                expires_at: a
                    .0
                    .get("ttlSeconds")
                    .and_then(Value::as_i64)
                    .map(|s| ctx.now().plus_millis(s.saturating_mul(1000))),
            };
            match svc.memory.put(write, None, false).await {
                Ok(r) => {
                    let mut v = record_json(&r);
                    v["deduplicated"] = json!(false);
                    Ok(v)
                }
                Err(tavern_store::StoreError::Conflict { .. }) => {
                    let r =
                        svc.memory
                            .read(&id, &key)
                            .await?
                            .ok_or_else(|| ToolError::NotFound {
                                what: format!("memory {id}"),
                            })?;
                    let mut v = record_json(&r);
                    v["deduplicated"] = json!(true);
                    Ok(v)
                }
                Err(e) => Err(e.into()),
            }
        }
        "memory_update" => {
            let id = memory_id(a.str("id").unwrap_or_default())?;
            let scope = a.scope_or("scope", Scope::Chat);
            check_write(ctx, scope, &a)?;
            let expected = a
                .revision("revision")?
                .ok_or_else(|| ToolError::invalid("revision", "is required"))?;
            let changes = [
                "content",
                "kind",
                "tags",
                "importance",
                "confidence",
                "ttlSeconds",
            ];
            if !changes.iter().any(|k| a.0.contains_key(*k)) {
                return Err(ToolError::invalid("arguments", "name at least one of content, kind, tags, importance, confidence, ttlSeconds to change"));
            }
            let key = ctx.scope(scope);
            let Some(cur) = svc.memory.read(&id, &key).await? else {
                return Err(ToolError::NotFound {
                    what: format!("memory {id} in scope {scope}"),
                });
            };
            if cur.revision != expected {
                return Err(ToolError::RevisionConflict {
                    what: format!("memory {id}"),
                    current: Some(cur.revision.to_string()),
                });
            }
            let write = MemoryWrite {
                id: id.clone(),
                scope: key,
                kind: kind(&a).unwrap_or(cur.kind),
                content: a
                    .str("content")
                    .map_or(cur.content.clone(), |c| c.trim().to_owned()),
                tags: if a.0.contains_key("tags") {
                    tags(&a)?
                } else {
                    cur.tags.clone()
                },
                importance: a.f64("importance").unwrap_or(cur.importance),
                confidence: a.f64("confidence").unwrap_or(cur.confidence),
                source: ctx.source(),
                expires_at: match a.0.get("ttlSeconds").and_then(Value::as_i64) {
                    Some(s) => Some(ctx.now().plus_millis(s.saturating_mul(1000))),
                    None => cur.expires_at,
                },
            };
            Ok(record_json(
                &svc.memory.put(write, Some(&expected), false).await?,
            ))
        }
        "memory_forget" => {
            let id = memory_id(a.str("id").unwrap_or_default())?;
            let scope = a.scope_or("scope", Scope::Chat);
            ctx.policy()
                .check_forget(scope, a.bool_or("confirmed", false))
                .map_err(|d| ToolError::ScopeDenied {
                    scope: scope.to_string(),
                    reason: d.to_string(),
                })?;
            let expected = a
                .revision("revision")?
                .ok_or_else(|| ToolError::invalid("revision", "is required"))?;
            let r = svc
                .memory
                .forget(&id, &ctx.scope(scope), &expected, ctx.source())
                .await?;
            Ok(json!({"id": r.id.as_str(), "revision": r.revision.as_str(), "forgotten": true}))
        }
        other => Err(ToolError::UnknownTool(other.to_owned())),
    }
}
