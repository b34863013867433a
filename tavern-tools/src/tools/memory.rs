//! `memory_search`, `memory_read`, `memory_write`, `memory_update`, `memory_forget`.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tavern_core::revision::short_digest;
use tavern_core::{MemoryId, MemoryKind, MemoryRecord, MemoryWrite, Scope, Tag};
use tavern_store::{MemoryQuery, MemorySearchExt, TagMatch};

use super::{check_write, revision, rounded, Listing, MemoryScope, RevisionArg, TruncatedBy};
use crate::context::ToolContext;
use crate::error::ToolError;
use crate::registry::ToolServices;
use crate::tool::TypedTool;

// --- argument types ------------------------------------------------------------------------

/// semantic: a lasting fact; episodic: something that happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    Semantic,
    Episodic,
}

impl Kind {
    fn core(self) -> MemoryKind {
        match self {
            Self::Semantic => MemoryKind::Semantic,
            Self::Episodic => MemoryKind::Episodic,
        }
    }
}

/// How tag filters combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TagMatchArg {
    Any,
    All,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SearchArgs {
    /// Words to look for in memories (Chinese works too); an empty string lists the most
    /// recent.
    query: String,
    /// Scope kinds to search (default all).
    #[serde(default)]
    #[schemars(length(max = 4))]
    scopes: Vec<MemoryScope>,
    /// Kinds to include (default both). semantic: a lasting fact; episodic: something that
    /// happened.
    #[serde(default)]
    #[schemars(length(max = 2))]
    kinds: Vec<Kind>,
    /// Only memories with these tags.
    #[serde(default)]
    #[schemars(inner(length(min = 1, max = 64)))]
    tags: Vec<String>,
    /// Whether a memory needs any or all of the tags (default any).
    tag_match: Option<TagMatchArg>,
    limit: Option<usize>,
    max_tokens: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ReadArgs {
    /// The memory id, as returned by memory_search or memory_write.
    #[schemars(regex(pattern = MEMORY_ID_PATTERN), length(min = 1, max = 64))]
    id: String,
    /// Scope kind (default chat).
    #[serde(default)]
    scope: MemoryScope,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct WriteArgs {
    /// The memory, one self-contained statement.
    #[schemars(length(min = 1))]
    content: String,
    /// semantic (default): a lasting fact; episodic: something that happened.
    kind: Option<Kind>,
    /// Tags to find it by.
    #[serde(default)]
    #[schemars(inner(length(min = 1, max = 64)))]
    tags: Vec<String>,
    /// How much it matters, 0 to 1 (default 0.5).
    #[schemars(range(min = 0, max = 1))]
    importance: Option<f64>,
    /// How sure it is, 0 to 1 (default 0.8).
    #[schemars(range(min = 0, max = 1))]
    confidence: Option<f64>,
    /// Scope kind (default chat).
    #[serde(default)]
    scope: MemoryScope,
    /// Seconds until it expires (expired memories are hidden, not deleted).
    #[schemars(range(min = 1, max = 31_536_000))]
    ttl_seconds: Option<i64>,
    /// Set only after the user confirmed this action in the conversation.
    #[serde(default)]
    confirmed: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct UpdateArgs {
    /// The memory id, as returned by memory_search or memory_write.
    #[schemars(regex(pattern = MEMORY_ID_PATTERN), length(min = 1, max = 64))]
    id: String,
    /// Scope kind (default chat).
    #[serde(default)]
    scope: MemoryScope,
    /// The memory's current revision, as last read.
    #[schemars(length(min = 35, max = 35))]
    revision: RevisionArg,
    /// The new statement.
    #[schemars(length(min = 1))]
    content: Option<String>,
    /// semantic: a lasting fact; episodic: something that happened.
    kind: Option<Kind>,
    /// The new tags (replacing the old ones).
    #[schemars(inner(length(min = 1, max = 64)))]
    tags: Option<Vec<String>>,
    /// 0 to 1.
    #[schemars(range(min = 0, max = 1))]
    importance: Option<f64>,
    /// 0 to 1.
    #[schemars(range(min = 0, max = 1))]
    confidence: Option<f64>,
    /// Seconds from now until it expires.
    #[schemars(range(min = 1, max = 31_536_000))]
    ttl_seconds: Option<i64>,
    /// Set only after the user confirmed this action in the conversation.
    #[serde(default)]
    confirmed: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ForgetArgs {
    /// The memory id, as returned by memory_search or memory_write.
    #[schemars(regex(pattern = MEMORY_ID_PATTERN), length(min = 1, max = 64))]
    id: String,
    /// Scope kind (default chat).
    #[serde(default)]
    scope: MemoryScope,
    /// The memory's current revision, as last read.
    #[schemars(length(min = 35, max = 35))]
    revision: RevisionArg,
    /// Set only after the user confirmed this action in the conversation.
    #[serde(default)]
    confirmed: bool,
}

// --- result types --------------------------------------------------------------------------

fn object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object"})
}

/// A memory as the model sees it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemoryOut {
    id: String,
    scope: String,
    kind: String,
    content: String,
    tags: Vec<String>,
    importance: f64,
    confidence: f64,
    revision: String,
    created_at: i64,
    updated_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<i64>,
    /// Who wrote it: session, turn, tool call.
    #[schemars(schema_with = "object_schema")]
    source: Value,
    /// Search score (searches only).
    #[serde(skip_serializing_if = "Option::is_none")]
    score: Option<f64>,
    /// The same statement was already stored; this is that memory (writes only).
    #[serde(skip_serializing_if = "Option::is_none")]
    deduplicated: Option<bool>,
}

impl MemoryOut {
    pub(crate) fn of(r: &MemoryRecord) -> Self {
        Self {
            id: r.id.to_string(),
            scope: r.scope.scope().as_str().to_owned(),
            kind: r.kind.as_str().to_owned(),
            content: r.content.clone(),
            tags: r.tags.iter().map(|t| t.as_str().to_owned()).collect(),
            importance: r.importance,
            confidence: r.confidence,
            revision: r.revision.to_string(),
            created_at: r.created_at.0,
            updated_at: r.updated_at.0,
            expires_at: r.expires_at.map(|e| e.0),
            source: serde_json::to_value(&r.source).unwrap_or(Value::Null),
            score: None,
            deduplicated: None,
        }
    }

    fn deduplicated(mut self, yes: bool) -> Self {
        self.deduplicated = Some(yes);
        self
    }
}

/// Where memory search results come from.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct SearchSource {
    /// Always `memory`.
    kind: &'static str,
    /// The scope kinds searched.
    scopes: Vec<&'static str>,
}

/// A forgotten memory.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct ForgetOut {
    id: String,
    revision: String,
    forgotten: bool,
}

// --- the tools -----------------------------------------------------------------------------

/// What `MemoryId::parse` accepts, stated in the schema so a model sees it before calling.
const MEMORY_ID_PATTERN: &str = r"^[A-Za-z0-9_-]{1,64}$";

fn memory_id(raw: &str) -> Result<MemoryId, ToolError> {
    MemoryId::parse(raw).map_err(|e| ToolError::invalid("id", e.to_string()))
}

fn tags(raw: &[String]) -> Result<Vec<Tag>, ToolError> {
    raw.iter()
        .enumerate()
        .map(|(i, t)| {
            Tag::parse(t.trim())
                .map_err(|e| ToolError::invalid(format!("tags[{i}]"), e.to_string()))
        })
        .collect()
}

fn normalized(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

fn not_found(id: &MemoryId, scope: Scope) -> ToolError {
    ToolError::NotFound {
        what: format!("memory {id} in scope {scope}"),
    }
}

/// `memory_search`.
pub(crate) struct Search;

#[async_trait]
impl TypedTool for Search {
    type Args = SearchArgs;
    type Output = Listing<MemoryOut, SearchSource>;
    const NAME: &'static str = "memory_search";
    const DESCRIPTION: &'static str = "Search long-term memories by words (Chinese works too), newest first for an empty query. Returns scored memories with their ids and revisions; an empty list means nothing matched.";
    const WRITES: bool = false;
    const WIDE_LIMIT: bool = true;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: SearchArgs,
    ) -> Result<Self::Output, ToolError> {
        let l = ctx.limits();
        let scopes: Vec<Scope> = if a.scopes.is_empty() {
            MemoryScope::ALL.iter().map(|s| s.scope()).collect()
        } else {
            a.scopes.iter().map(|s| s.scope()).collect()
        };
        let mut q = MemoryQuery::new(a.query, scopes.iter().map(|s| ctx.scope(*s)).collect());
        q.kinds = a.kinds.iter().map(|k| k.core()).collect();
        q.tags = tags(&a.tags)?;
        q.tag_match = match a.tag_match {
            Some(TagMatchArg::All) => TagMatch::All,
            _ => TagMatch::Any,
        };
        q.limit = a.limit.unwrap_or(l.default_results);
        q.max_tokens = Some(a.max_tokens.unwrap_or(l.default_tokens));
        q.ranker = svc.ranker.clone();
        let res = svc.memory.search_prepared(&q).await?;
        Ok(Listing {
            items: res
                .hits
                .iter()
                .map(|h| {
                    let mut m = MemoryOut::of(&h.record);
                    m.score = Some(rounded(h.score));
                    m
                })
                .collect(),
            source_count: res.source_count,
            truncated: res.truncated,
            truncated_by: res.truncated_by.map(TruncatedBy::from),
            source: SearchSource {
                kind: "memory",
                scopes: scopes.iter().map(|s| s.as_str()).collect(),
            },
        })
    }
}

/// `memory_read`.
pub(crate) struct Read;

#[async_trait]
impl TypedTool for Read {
    type Args = ReadArgs;
    type Output = MemoryOut;
    const NAME: &'static str = "memory_read";
    const DESCRIPTION: &'static str = "Read one memory by id, with its source and revision.";
    const WRITES: bool = false;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: ReadArgs,
    ) -> Result<MemoryOut, ToolError> {
        let id = memory_id(&a.id)?;
        let scope = a.scope.scope();
        match svc.memory.read(&id, &ctx.scope(scope)).await? {
            Some(r) => Ok(MemoryOut::of(&r)),
            None => Err(not_found(&id, scope)),
        }
    }
}

/// `memory_write`.
pub(crate) struct Write;

#[async_trait]
impl TypedTool for Write {
    type Args = WriteArgs;
    type Output = MemoryOut;
    const NAME: &'static str = "memory_write";
    const DESCRIPTION: &'static str = "Store a new memory (default scope: this chat). Writing what is already stored returns the existing memory marked deduplicated.";
    const WRITES: bool = true;
    // Writing the same statement twice returns the first memory.
    const IDEMPOTENT: bool = true;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: WriteArgs,
    ) -> Result<MemoryOut, ToolError> {
        let scope = a.scope.scope();
        check_write(ctx, scope, a.confirmed)?;
        let key = ctx.scope(scope);
        let content = a.content.trim().to_owned();
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
            return Ok(MemoryOut::of(&hit.record).deduplicated(true));
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
            kind: a.kind.map_or(MemoryKind::Semantic, Kind::core),
            content,
            tags: tags(&a.tags)?,
            importance: a.importance.unwrap_or(0.5),
            confidence: a.confidence.unwrap_or(0.8),
            source: ctx.source(),
            expires_at: a
                .ttl_seconds
                .map(|s| ctx.now().plus_millis(s.saturating_mul(1000))),
        };
        match svc.memory.put(write, None, false).await {
            Ok(r) => Ok(MemoryOut::of(&r).deduplicated(false)),
            Err(e) if e.is_conflict() => {
                let r = svc
                    .memory
                    .read(&id, &key)
                    .await?
                    .ok_or_else(|| not_found(&id, scope))?;
                Ok(MemoryOut::of(&r).deduplicated(true))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// `memory_update`.
pub(crate) struct Update;

#[async_trait]
impl TypedTool for Update {
    type Args = UpdateArgs;
    type Output = MemoryOut;
    const NAME: &'static str = "memory_update";
    const DESCRIPTION: &'static str = "Change a memory you read before: give its id and revision; on a revision conflict, read it again and retry.";
    const WRITES: bool = true;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: UpdateArgs,
    ) -> Result<MemoryOut, ToolError> {
        let id = memory_id(&a.id)?;
        let scope = a.scope.scope();
        check_write(ctx, scope, a.confirmed)?;
        let expected = revision("revision", &a.revision)?;
        let changes = a.content.is_some()
            || a.kind.is_some()
            || a.tags.is_some()
            || a.importance.is_some()
            || a.confidence.is_some()
            || a.ttl_seconds.is_some();
        if !changes {
            return Err(ToolError::invalid("arguments", "name at least one of content, kind, tags, importance, confidence, ttlSeconds to change"));
        }
        let key = ctx.scope(scope);
        let Some(cur) = svc.memory.read(&id, &key).await? else {
            return Err(not_found(&id, scope));
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
            kind: a.kind.map_or(cur.kind, Kind::core),
            content: a
                .content
                .map_or(cur.content.clone(), |c| c.trim().to_owned()),
            tags: match &a.tags {
                Some(t) => tags(t)?,
                None => cur.tags.clone(),
            },
            importance: a.importance.unwrap_or(cur.importance),
            confidence: a.confidence.unwrap_or(cur.confidence),
            source: ctx.source(),
            expires_at: match a.ttl_seconds {
                Some(s) => Some(ctx.now().plus_millis(s.saturating_mul(1000))),
                None => cur.expires_at,
            },
        };
        Ok(MemoryOut::of(
            &svc.memory.put(write, Some(&expected), false).await?,
        ))
    }
}

/// `memory_forget`.
pub(crate) struct Forget;

#[async_trait]
impl TypedTool for Forget {
    type Args = ForgetArgs;
    type Output = ForgetOut;
    const NAME: &'static str = "memory_forget";
    const DESCRIPTION: &'static str =
        "Forget a memory (it is hidden, kept for audit, never erased). Needs its id and revision.";
    const WRITES: bool = true;
    const DESTRUCTIVE: bool = true;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: ForgetArgs,
    ) -> Result<ForgetOut, ToolError> {
        let id = memory_id(&a.id)?;
        let scope = a.scope.scope();
        ctx.policy()
            .check_forget(scope, a.confirmed)
            .map_err(|d| ToolError::ScopeDenied {
                scope: scope.to_string(),
                reason: d.to_string(),
            })?;
        let expected = revision("revision", &a.revision)?;
        let r = svc
            .memory
            .forget(&id, &ctx.scope(scope), &expected, ctx.source())
            .await?;
        Ok(ForgetOut {
            id: r.id.to_string(),
            revision: r.revision.to_string(),
            forgotten: true,
        })
    }
}
