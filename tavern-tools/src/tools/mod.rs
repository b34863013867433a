//! The fourteen tools: their contracts (name, model-facing description, argument and result
//! schemas, whether they write) and their implementations over the store ports.

pub(crate) mod memory;
pub(crate) mod tavern;
pub(crate) mod variable;

use serde_json::{json, Map, Value};
use tavern_core::Scope;

use crate::context::ToolLimits;
use crate::error::ToolError;

/// A tool's contract.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The name the model calls.
    pub name: &'static str,
    /// What the model is told about it.
    pub description: &'static str,
    /// JSON Schema of the arguments (`additionalProperties: false`).
    pub parameters: Value,
    /// JSON Schema of a successful result.
    pub result: Value,
    /// Whether it writes (counts against the per-turn write limit).
    pub writes: bool,
}

/// Every tool's contract, in registry order.
pub fn specs(limits: &ToolLimits) -> Vec<ToolSpec> {
    let mut v = tavern::specs(limits);
    v.extend(memory::specs(limits));
    v.extend(variable::specs(limits));
    v
}

// --- schema building blocks ---------------------------------------------------------------

pub(crate) fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "additionalProperties": false, "properties": properties, "required": required})
}

pub(crate) fn query_param(limits: &ToolLimits, what: &str) -> Value {
    json!({"type": "string", "maxLength": limits.max_query_chars,
        "description": format!("Words to look for in {what}; an empty string lists the most recent.")})
}

pub(crate) fn limit_param(limits: &ToolLimits) -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": limits.max_results,
        "description": format!("Most results (default {}).", limits.default_results)})
}

pub(crate) fn tokens_param(limits: &ToolLimits) -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": limits.max_tokens,
        "description": format!("Token budget for returned text (default {}); results that do not fit are left out and `truncated` says so.", limits.default_tokens)})
}

pub(crate) fn scope_param(allowed: &[Scope], default: Scope) -> Value {
    let names: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
    json!({"type": "string", "enum": names,
        "description": format!("Scope kind (default {default}); the session decides which chat and character it means.")})
}

pub(crate) fn revision_param(what: &str) -> Value {
    json!({"type": "string", "minLength": 35, "maxLength": 35,
        "description": format!("The {what}'s current revision, as last read.")})
}

/// A result schema: an object with the given properties (results may grow new fields).
pub(crate) fn result(properties: Value) -> Value {
    json!({"type": "object", "properties": properties})
}

/// A schema that also accepts `null`, in the subset hosts enforce (no type arrays).
pub(crate) fn nullable(schema: Value) -> Value {
    json!({"oneOf": [schema, {"type": "null"}]})
}

pub(crate) fn list_result(item: Value) -> Value {
    result(json!({
        "items": {"type": "array", "items": item},
        "sourceCount": {"type": "integer", "description": "How many matched before limit and budget."},
        "truncated": {"type": "boolean"},
        "truncatedBy": nullable(json!({"type": "string", "enum": ["limit", "max-tokens"]})),
        "source": {"type": "object"}
    }))
}

// --- argument access (arguments are schema-validated before any of this runs) -------------

pub(crate) struct Args<'a>(pub(crate) &'a Map<String, Value>);

impl Args<'_> {
    pub(crate) fn str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    pub(crate) fn usize_or(&self, key: &str, default: usize) -> usize {
        self.0
            .get(key)
            .and_then(Value::as_u64)
            .map_or(default, |v| usize::try_from(v).unwrap_or(usize::MAX))
    }

    pub(crate) fn f64(&self, key: &str) -> Option<f64> {
        self.0.get(key).and_then(Value::as_f64)
    }

    pub(crate) fn bool_or(&self, key: &str, default: bool) -> bool {
        self.0.get(key).and_then(Value::as_bool).unwrap_or(default)
    }

    pub(crate) fn strs(&self, key: &str) -> Vec<&str> {
        self.0
            .get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    pub(crate) fn scope_or(&self, key: &str, default: Scope) -> Scope {
        self.str(key).and_then(Scope::from_label).unwrap_or(default)
    }

    pub(crate) fn revision(&self, key: &str) -> Result<Option<tavern_core::Revision>, ToolError> {
        self.str(key)
            .map(|r| {
                tavern_core::Revision::parse(r).map_err(|e| ToolError::invalid(key, e.to_string()))
            })
            .transpose()
    }
}

/// Truncates to at most `max_tokens` by the default estimator, at a character boundary.
/// Returns the text and whether it was cut.
pub(crate) fn fit(text: &str, max_tokens: usize) -> (String, bool) {
    use tavern_core::{DefaultTokenEstimator, TokenEstimator};
    let e = DefaultTokenEstimator;
    if e.estimate(text) <= max_tokens {
        return (text.to_owned(), false);
    }
    // Binary search on the character count.
    let chars: Vec<char> = text.chars().collect();
    let (mut lo, mut hi) = (0usize, chars.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let s: String = chars[..mid].iter().collect();
        if e.estimate(&s) <= max_tokens {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (chars[..lo].iter().collect(), true)
}
