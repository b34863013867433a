//! Memory, variable and audit records with their limits, and the pure transitions between record
//! versions (create, update, forget) that keep revisions chained.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::CoreError;
use crate::ids::{MemoryId, SessionId, Tag, VariableName};
use crate::revision::{CanonicalWriter, Revision, MAX_JSON_DEPTH};
use crate::scope::ScopeKey;
use crate::time::Timestamp;

/// Largest memory content, in UTF-8 bytes.
pub const MEMORY_CONTENT_MAX_BYTES: usize = 64 * 1024;
/// Most tags on one memory.
pub const MEMORY_MAX_TAGS: usize = 32;
/// Largest variable value, in bytes of its compact JSON.
pub const VARIABLE_VALUE_MAX_BYTES: usize = 32 * 1024;
/// Largest sum of (name + value) bytes of the live variables in one scope.
pub const VARIABLE_SCOPE_MAX_BYTES: usize = 256 * 1024;
/// Longest id carried in a source (tool call id, message id).
pub const SOURCE_ID_MAX_BYTES: usize = 128;

/// Semantic facts vs. episodic events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryKind {
    /// A lasting fact ("Mira fears water").
    Semantic,
    /// Something that happened ("they met at the silver gate").
    Episodic,
}

impl MemoryKind {
    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Semantic => "semantic",
            Self::Episodic => "episodic",
        }
    }
}

/// Who caused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// A model tool call.
    Tool,
    /// The user directly (panel, command).
    User,
    /// An import of existing data.
    Import,
    /// AgentTavern itself (expiry, turn cleanup).
    System,
}

impl SourceKind {
    /// The label (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tool => "tool",
            Self::User => "user",
            Self::Import => "import",
            Self::System => "system",
        }
    }
}

/// Where a write came from, so users can trace and correct it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemorySource {
    /// Who.
    pub kind: SourceKind,
    /// The host's tool call id, for tool writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The chat message the write is about, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The host session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionId>,
    /// The turn number in that session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
}

impl MemorySource {
    /// A source for a model tool call.
    pub fn tool(call_id: impl Into<String>, session: SessionId, turn: u64) -> Self {
        Self {
            kind: SourceKind::Tool,
            tool_call_id: Some(call_id.into()),
            message_id: None,
            session: Some(session),
            turn: Some(turn),
        }
    }

    /// A source for AgentTavern's own actions.
    pub fn system() -> Self {
        Self {
            kind: SourceKind::System,
            tool_call_id: None,
            message_id: None,
            session: None,
            turn: None,
        }
    }

    fn validate(&self) -> Result<(), CoreError> {
        for (field, v) in [
            ("source.toolCallId", &self.tool_call_id),
            ("source.messageId", &self.message_id),
        ] {
            if let Some(v) = v {
                if v.is_empty() || v.len() > SOURCE_ID_MAX_BYTES || v.chars().any(char::is_control)
                {
                    return Err(CoreError::InvalidField {
                        field,
                        reason: format!("must be 1 to {SOURCE_ID_MAX_BYTES} printable bytes"),
                    });
                }
            }
        }
        Ok(())
    }

    #[cfg(test)]
    fn to_canonical(&self) -> Value {
        json!({
            "kind": serde_json::to_value(self.kind).unwrap_or(Value::Null),
            "toolCallId": self.tool_call_id,
            "messageId": self.message_id,
            "session": self.session.as_ref().map(|s| s.as_str()),
            "turn": self.turn,
        })
    }
}

/// What a caller asks to store (create or replace) for one memory id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryWrite {
    /// The record id.
    pub id: MemoryId,
    /// The concrete scope (always resolved from a binding, never from the model).
    pub scope: ScopeKey,
    /// Fact or event.
    pub kind: MemoryKind,
    /// The text, at most [`MEMORY_CONTENT_MAX_BYTES`].
    pub content: String,
    /// Up to [`MEMORY_MAX_TAGS`] tags.
    pub tags: Vec<Tag>,
    /// 0 to 1.
    pub importance: f64,
    /// 0 to 1.
    pub confidence: f64,
    /// Who wrote it.
    pub source: MemorySource,
    /// When it stops being visible, if ever.
    pub expires_at: Option<Timestamp>,
}

impl MemoryWrite {
    /// Checks every limit.
    ///
    /// # Errors
    /// [`CoreError::InvalidField`] or [`CoreError::LimitExceeded`] naming the field or limit.
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.content.trim().is_empty() {
            return Err(CoreError::InvalidField {
                field: "content",
                reason: "must not be blank".into(),
            });
        }
        if self.content.len() > MEMORY_CONTENT_MAX_BYTES {
            return Err(CoreError::LimitExceeded {
                limit: "memory content bytes",
                max: MEMORY_CONTENT_MAX_BYTES,
                actual: self.content.len(),
            });
        }
        if self.tags.len() > MEMORY_MAX_TAGS {
            return Err(CoreError::LimitExceeded {
                limit: "memory tags",
                max: MEMORY_MAX_TAGS,
                actual: self.tags.len(),
            });
        }
        unit_interval("importance", self.importance)?;
        unit_interval("confidence", self.confidence)?;
        self.source.validate()
    }
}

fn unit_interval(field: &'static str, v: f64) -> Result<(), CoreError> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(CoreError::InvalidField {
            field,
            reason: format!("{v} is not a number from 0 to 1"),
        })
    }
}

/// A stored memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryRecord {
    /// Stable id.
    pub id: MemoryId,
    /// Concrete scope.
    pub scope: ScopeKey,
    /// Fact or event.
    pub kind: MemoryKind,
    /// The text.
    pub content: String,
    /// Tags.
    pub tags: Vec<Tag>,
    /// 0 to 1.
    pub importance: f64,
    /// 0 to 1.
    pub confidence: f64,
    /// Who wrote the current version.
    pub source: MemorySource,
    /// First creation.
    pub created_at: Timestamp,
    /// Last content change.
    pub updated_at: Timestamp,
    /// Last read (does not change the revision).
    pub last_accessed_at: Option<Timestamp>,
    /// Expiry, if any.
    pub expires_at: Option<Timestamp>,
    /// Soft-delete time, if forgotten.
    pub deleted_at: Option<Timestamp>,
    /// Revision of this version.
    pub revision: Revision,
}

impl MemoryRecord {
    /// A new record from a validated write.
    ///
    /// # Errors
    /// Any limit of [`MemoryWrite::validate`].
    pub fn create(write: MemoryWrite, now: Timestamp) -> Result<Self, CoreError> {
        write.validate()?;
        let mut rec = Self {
            id: write.id,
            scope: write.scope,
            kind: write.kind,
            content: write.content,
            tags: write.tags,
            importance: write.importance,
            confidence: write.confidence,
            source: write.source,
            created_at: now,
            updated_at: now,
            last_accessed_at: None,
            expires_at: write.expires_at,
            deleted_at: None,
            // Computed from the rest just below.
            revision: Revision::unset(),
        };
        rec.revision = rec.compute_revision(None);
        Ok(rec)
    }

    /// The next version after `write` (which must have this record's id and scope); a forgotten
    /// record becomes live again only through this explicit call.
    ///
    /// # Errors
    /// Any limit of [`MemoryWrite::validate`], or a mismatched id/scope.
    pub fn updated(&self, write: MemoryWrite, now: Timestamp) -> Result<Self, CoreError> {
        write.validate()?;
        if write.id != self.id || write.scope != self.scope {
            return Err(CoreError::InvalidField {
                field: "id",
                reason: format!("update of {} must keep its id and scope", self.id),
            });
        }
        let mut rec = Self {
            kind: write.kind,
            content: write.content,
            tags: write.tags,
            importance: write.importance,
            confidence: write.confidence,
            source: write.source,
            updated_at: now.max(self.updated_at),
            expires_at: write.expires_at,
            deleted_at: None,
            ..self.clone()
        };
        rec.revision = rec.compute_revision(Some(&self.revision));
        Ok(rec)
    }

    /// The soft-deleted version.
    pub fn forgotten(&self, source: MemorySource, now: Timestamp) -> Self {
        let mut rec = Self {
            deleted_at: Some(now),
            updated_at: now.max(self.updated_at),
            source,
            ..self.clone()
        };
        rec.revision = rec.compute_revision(Some(&self.revision));
        rec
    }

    /// Whether the record has expired at `now`.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|e| e <= now)
    }

    /// Live: neither forgotten nor expired.
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.deleted_at.is_none() && !self.is_expired(now)
    }

    /// The revision of this version's content chained to `previous`; `last_accessed_at` is not
    /// part of it, so reads never change revisions.
    pub fn compute_revision(&self, previous: Option<&Revision>) -> Revision {
        let segments = self.scope.segments();
        // Room for the texts and about 40 bytes of framing for each of the other values.
        let texts = self.content.len()
            + self.id.as_str().len()
            + segments.iter().map(|s| s.len() + 5).sum::<usize>()
            + self
                .tags
                .iter()
                .map(|t| t.as_str().len() + 5)
                .sum::<usize>();
        let mut w = CanonicalWriter::with_capacity("memory", previous, texts + 640);
        // The keys of `canonical_content` in byte order.
        w.object(12);
        w.str("confidence").float(self.confidence);
        w.str("content").str(&self.content);
        w.str("createdAt").int(self.created_at.0);
        w.str("deletedAt").opt_int(self.deleted_at.map(|t| t.0));
        w.str("expiresAt").opt_int(self.expires_at.map(|t| t.0));
        w.str("id").str(self.id.as_str());
        w.str("importance").float(self.importance);
        w.str("kind").str(self.kind.as_str());
        w.str("scope").array(segments.len());
        for segment in segments {
            w.str(segment);
        }
        let source = &self.source;
        w.str("source").object(5);
        w.str("kind").str(source.kind.as_str());
        w.str("messageId").opt_str(source.message_id.as_deref());
        w.str("session")
            .opt_str(source.session.as_ref().map(|s| s.as_str()));
        w.str("toolCallId").opt_str(source.tool_call_id.as_deref());
        match source.turn {
            Some(turn) => w.str("turn").uint(turn),
            None => w.str("turn").null(),
        };
        w.str("tags").array(self.tags.len());
        for tag in &self.tags {
            w.str(tag.as_str());
        }
        w.str("updatedAt").int(self.updated_at.0);
        w.finish()
    }

    /// The content a revision covers, as a JSON value: what [`MemoryRecord::compute_revision`]
    /// writes directly (kept to show in tests that both give the same bytes).
    #[cfg(test)]
    fn canonical_content(&self) -> Value {
        json!({
            "id": self.id.as_str(),
            "scope": self.scope.segments(),
            "kind": self.kind.as_str(),
            "content": self.content,
            "tags": self.tags.iter().map(Tag::as_str).collect::<Vec<_>>(),
            "importance": self.importance,
            "confidence": self.confidence,
            "source": self.source.to_canonical(),
            "createdAt": self.created_at.0,
            "updatedAt": self.updated_at.0,
            "expiresAt": self.expires_at.map(|t| t.0),
            "deletedAt": self.deleted_at.map(|t| t.0),
        })
    }
}

/// A stored variable version. A deleted variable stays as a tombstone so its revision chain
/// continues (no ABA after delete + re-create).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VariableRecord {
    /// Concrete scope.
    pub scope: ScopeKey,
    /// Name.
    pub name: VariableName,
    /// Typed JSON value (null for a tombstone).
    pub value: Value,
    /// Revision of this version.
    pub revision: Revision,
    /// Last change.
    pub updated_at: Timestamp,
    /// Set when deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<Timestamp>,
}

impl VariableRecord {
    /// The next version of a variable (or the first when `previous` is `None`).
    ///
    /// # Errors
    /// The value limits of [`validate_variable_value`].
    pub fn next(
        scope: ScopeKey,
        name: VariableName,
        value: Value,
        previous: Option<&VariableRecord>,
        now: Timestamp,
    ) -> Result<Self, CoreError> {
        validate_variable_value(&value)?;
        Ok(Self::chain(scope, name, value, previous, now, None))
    }

    /// The tombstone that follows `self`.
    pub fn deleted(&self, now: Timestamp) -> Self {
        Self::chain(
            self.scope.clone(),
            self.name.clone(),
            Value::Null,
            Some(self),
            now,
            Some(now),
        )
    }

    fn chain(
        scope: ScopeKey,
        name: VariableName,
        value: Value,
        previous: Option<&VariableRecord>,
        now: Timestamp,
        deleted_at: Option<Timestamp>,
    ) -> Self {
        let content = json!({
            "scope": scope.segments(),
            "name": name.as_str(),
            "value": value,
            "deleted": deleted_at.is_some(),
        });
        let revision = Revision::compute("variable", previous.map(|p| &p.revision), &content);
        Self {
            scope,
            name,
            value,
            revision,
            updated_at: now,
            deleted_at,
        }
    }

    /// Whether this is a live value (not a tombstone).
    pub fn is_live(&self) -> bool {
        self.deleted_at.is_none()
    }

    /// Bytes this variable counts against [`VARIABLE_SCOPE_MAX_BYTES`].
    pub fn scope_bytes(&self) -> usize {
        if self.is_live() {
            self.name.as_str().len() + json_size(&self.value)
        } else {
            0
        }
    }
}

/// Size of a value's compact JSON encoding.
pub fn json_size(value: &Value) -> usize {
    serde_json::to_vec(value)
        .map(|v| v.len())
        .unwrap_or(usize::MAX)
}

/// Checks a variable value: at most [`VARIABLE_VALUE_MAX_BYTES`], nesting at most
/// [`MAX_JSON_DEPTH`], numbers finite.
///
/// # Errors
/// [`CoreError::LimitExceeded`] or [`CoreError::InvalidField`].
pub fn validate_variable_value(value: &Value) -> Result<(), CoreError> {
    check_depth_and_numbers(value, 0)?;
    let size = json_size(value);
    if size > VARIABLE_VALUE_MAX_BYTES {
        return Err(CoreError::LimitExceeded {
            limit: "variable value bytes",
            max: VARIABLE_VALUE_MAX_BYTES,
            actual: size,
        });
    }
    Ok(())
}

fn check_depth_and_numbers(value: &Value, depth: usize) -> Result<(), CoreError> {
    if depth > MAX_JSON_DEPTH {
        return Err(CoreError::LimitExceeded {
            limit: "variable value nesting depth",
            max: MAX_JSON_DEPTH,
            actual: depth,
        });
    }
    match value {
        Value::Number(n) if n.as_f64().is_some_and(|f| !f.is_finite()) => {
            Err(CoreError::InvalidField {
                field: "value",
                reason: "numbers must be finite".into(),
            })
        }
        Value::Array(items) => items
            .iter()
            .try_for_each(|v| check_depth_and_numbers(v, depth + 1)),
        Value::Object(map) => map
            .values()
            .try_for_each(|v| check_depth_and_numbers(v, depth + 1)),
        _ => Ok(()),
    }
}

/// Checks a scope's total after a write.
///
/// # Errors
/// [`CoreError::LimitExceeded`] naming the scope limit.
pub fn check_scope_bytes(total: usize) -> Result<(), CoreError> {
    if total > VARIABLE_SCOPE_MAX_BYTES {
        Err(CoreError::LimitExceeded {
            limit: "variable scope bytes",
            max: VARIABLE_SCOPE_MAX_BYTES,
            actual: total,
        })
    } else {
        Ok(())
    }
}

/// What an audit entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuditAction {
    /// A memory was created.
    Created,
    /// A memory was updated.
    Updated,
    /// A forgotten memory was explicitly put again.
    Restored,
    /// A memory was soft-deleted.
    Forgotten,
    /// A memory reached its expiry (reported in listings; nothing is purged).
    Expired,
    /// A variable was set.
    Set,
    /// A variable was deleted (tombstoned).
    Deleted,
    /// A variable scope was cleared (turn end or explicit).
    Cleared,
}

/// One audit line: what happened to which record, when, by whom, at which revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// When.
    pub at: Timestamp,
    /// What.
    pub action: AuditAction,
    /// The memory id or variable name.
    pub target: String,
    /// Where.
    pub scope: ScopeKey,
    /// The revision after the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<Revision>,
    /// Who.
    pub source: MemorySource,
    /// A memory's text as of this version, in the audit of one memory, when this version set
    /// it (the first version, or another text than the version before) and the store still
    /// keeps it (a memory keeps the texts of its last few content changes); `None` for
    /// variables, scope-wide trails, versions that kept the text (see
    /// [`AuditEntry::same_text`]) and versions whose text was let go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// This version kept the text of the version before it (an importance change, a forget,
    /// a restore): its text is the last `content` before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub same_text: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::AgentId;

    fn write(content: &str) -> MemoryWrite {
        MemoryWrite {
            id: MemoryId::parse("m1").unwrap(),
            scope: ScopeKey::Agent {
                agent: AgentId::parse("a").unwrap(),
            },
            kind: MemoryKind::Semantic,
            content: content.into(),
            tags: vec![],
            importance: 0.5,
            confidence: 0.5,
            source: MemorySource::system(),
            expires_at: None,
        }
    }

    mod written_directly {
        use super::*;
        use crate::ids::{CharacterName, ChatId};
        use proptest::prelude::*;

        fn scope() -> impl Strategy<Value = ScopeKey> {
            let agent = "[a-z][a-z0-9_-]{0,8}".prop_map(|a| AgentId::parse(a).unwrap());
            let name = "[A-Za-z\u{4e00}-\u{4e20}][A-Za-z0-9 \u{4e00}-\u{4e20}]{0,6}"
                .prop_map(|c| CharacterName::parse(c.trim_end().to_owned()).unwrap());
            let chat = "[A-Za-z0-9][A-Za-z0-9 -]{0,8}"
                .prop_map(|c| ChatId::parse(c.trim_end().to_owned()).unwrap());
            prop_oneof![
                agent.clone().prop_map(|agent| ScopeKey::Turn { agent }),
                agent.prop_map(|agent| ScopeKey::Agent { agent }),
                (name.clone(), chat)
                    .prop_map(|(character, chat)| ScopeKey::Chat { character, chat }),
                name.prop_map(|character| ScopeKey::Character { character }),
                Just(ScopeKey::Global),
            ]
        }

        fn float() -> impl Strategy<Value = f64> {
            prop_oneof![
                0.0..=1.0f64,
                Just(-0.0),
                Just(0.0),
                Just(1.0),
                Just(f64::NAN),
                Just(f64::INFINITY),
                any::<f64>(),
            ]
        }

        fn at() -> impl Strategy<Value = Option<Timestamp>> {
            proptest::option::of(any::<i64>().prop_map(Timestamp))
        }

        fn text() -> impl Strategy<Value = Option<String>> {
            proptest::option::of("[a-z0-9\u{4e00}-\u{4e20}\\\"]{0,12}")
        }

        fn source() -> impl Strategy<Value = MemorySource> {
            let kind = prop_oneof![
                Just(SourceKind::Tool),
                Just(SourceKind::User),
                Just(SourceKind::Import),
                Just(SourceKind::System),
            ];
            let session = proptest::option::of(
                "[a-z0-9][a-z0-9-]{0,10}".prop_map(|s| SessionId::parse(s).unwrap()),
            );
            let turn = proptest::option::of(prop_oneof![
                any::<u64>(),
                Just(i64::MAX as u64),
                Just(i64::MAX as u64 + 1),
                Just(0)
            ]);
            (kind, text(), text(), session, turn).prop_map(
                |(kind, tool_call_id, message_id, session, turn)| MemorySource {
                    kind,
                    tool_call_id,
                    message_id,
                    session,
                    turn,
                },
            )
        }

        prop_compose! {
            fn record()(
                id in "[a-z0-9][a-z0-9_-]{0,10}",
                scope in scope(),
                episodic in any::<bool>(),
                content in "(\\PC|\n){0,40}",
                tags in proptest::collection::vec("[a-z][a-z0-9-]{0,6}", 0..4),
                (importance, confidence) in (float(), float()),
                source in source(),
                (created, updated) in (any::<i64>(), any::<i64>()),
                (expires, deleted, accessed) in (at(), at(), at()),
            ) -> MemoryRecord {
                MemoryRecord {
                    id: MemoryId::parse(id).unwrap(),
                    scope,
                    kind: if episodic { MemoryKind::Episodic } else { MemoryKind::Semantic },
                    content,
                    tags: tags.into_iter().map(|t| Tag::parse(t).unwrap()).collect(),
                    importance,
                    confidence,
                    source,
                    created_at: Timestamp(created),
                    updated_at: Timestamp(updated),
                    last_accessed_at: accessed,
                    expires_at: expires,
                    deleted_at: deleted,
                    revision: Revision::parse(format!("r1-{}", "0".repeat(32))).unwrap(),
                }
            }
        }

        proptest! {
            /// The revision written field by field is the revision of the record's content
            /// as a JSON value (the canonical encoding of `docs/FORMATS.md`): stored
            /// revisions stay what they were.
            #[test]
            fn a_revision_written_directly_is_the_revision_of_its_json(
                r in record(),
                chained in any::<bool>(),
            ) {
                let previous = chained.then(|| r.revision.clone());
                prop_assert_eq!(
                    r.compute_revision(previous.as_ref()),
                    Revision::compute("memory", previous.as_ref(), &r.canonical_content())
                );
            }
        }
    }

    #[test]
    fn limits_name_what_was_hit() {
        let big = "x".repeat(MEMORY_CONTENT_MAX_BYTES + 1);
        let err = write(&big).validate().unwrap_err().to_string();
        assert!(err.starts_with("memory content bytes exceeded"), "{err}");
        let mut w = write("ok");
        w.importance = f64::NAN;
        assert!(w.validate().unwrap_err().to_string().contains("importance"));
        let mut w = write("ok");
        w.tags = (0..33)
            .map(|i| Tag::parse(format!("t{i}")).unwrap())
            .collect();
        assert!(w
            .validate()
            .unwrap_err()
            .to_string()
            .contains("memory tags"));
        assert!(write("  ").validate().is_err());
    }

    #[test]
    fn update_and_forget_chain_revisions_and_reads_do_not() {
        let a = MemoryRecord::create(write("a"), Timestamp(1)).unwrap();
        let b = a.updated(write("a"), Timestamp(1)).unwrap();
        assert_ne!(
            a.revision, b.revision,
            "same content again is a new version"
        );
        let mut read = b.clone();
        read.last_accessed_at = Some(Timestamp(99));
        assert_eq!(read.compute_revision(Some(&a.revision)), b.revision);
        let f = b.forgotten(MemorySource::system(), Timestamp(2));
        assert!(!f.is_live(Timestamp(2)));
        assert_ne!(f.revision, b.revision);
    }

    #[test]
    fn variable_values_are_bounded() {
        assert!(validate_variable_value(&json!({"hp": 3, "tags": ["a"]})).is_ok());
        let big = Value::String("x".repeat(VARIABLE_VALUE_MAX_BYTES));
        assert!(validate_variable_value(&big).is_err());
        let mut deep = json!(1);
        for _ in 0..40 {
            deep = json!([deep]);
        }
        assert!(validate_variable_value(&deep)
            .unwrap_err()
            .to_string()
            .contains("nesting depth"));
        assert!(check_scope_bytes(VARIABLE_SCOPE_MAX_BYTES + 1).is_err());
    }

    #[test]
    fn delete_then_recreate_does_not_revive_a_revision() {
        let scope = ScopeKey::Global;
        let name = VariableName::parse("x").unwrap();
        let v1 = VariableRecord::next(scope.clone(), name.clone(), json!(1), None, Timestamp(0))
            .unwrap();
        let gone = v1.deleted(Timestamp(1));
        let v1again =
            VariableRecord::next(scope, name, json!(1), Some(&gone), Timestamp(0)).unwrap();
        assert_ne!(v1.revision, v1again.revision);
        assert_eq!(gone.scope_bytes(), 0);
    }
}
