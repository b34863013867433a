//! The [`Tool`] trait and its typed implementation: each tool is an argument type and a result
//! type; the JSON Schemas the model and the host see are generated from those types (schemars),
//! shaped to the subset hosts enforce, and the argument schema is also what arguments are
//! validated against before they are deserialized.

use async_trait::async_trait;
use schemars::generate::{Contract, SchemaSettings};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::context::{ToolContext, ToolLimits};
use crate::error::ToolError;
use crate::registry::ToolServices;

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
    /// Whether it removes something from view (forgetting, deleting; never from disk).
    pub destructive: bool,
    /// Whether calling it again with the same arguments changes nothing more (every reading
    /// tool is).
    pub idempotent: bool,
}

/// One tool as the registry holds it: its contract and how to run it on JSON arguments.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The contract.
    fn spec(&self) -> &ToolSpec;

    /// Runs the tool on `args` and returns its result as JSON. The caller (the registry) has
    /// removed `null`s for optional arguments and validated the
    /// rest against [`ToolSpec::parameters`], once: anything that schema describes
    /// deserializes.
    ///
    /// # Errors
    /// A [`ToolError`] the model can act on.
    async fn call(
        &self,
        services: &ToolServices,
        ctx: &ToolContext,
        args: Value,
    ) -> Result<Value, ToolError>;
}

/// A tool written against typed arguments and results.
#[async_trait]
pub(crate) trait TypedTool: Send + Sync + 'static {
    /// The arguments (`deny_unknown_fields`: identity never comes from arguments).
    type Args: DeserializeOwned + JsonSchema + Send + 'static;
    /// The result.
    type Output: Serialize + JsonSchema + Send;
    /// The name the model calls.
    const NAME: &'static str;
    /// What the model is told.
    const DESCRIPTION: &'static str;
    /// Whether it writes.
    const WRITES: bool;
    /// Whether it removes something from view (hosts may ask the user first).
    const DESTRUCTIVE: bool = false;
    /// Whether a repeat with the same arguments changes nothing more; defaults to "it does
    /// not write".
    const IDEMPOTENT: bool = !Self::WRITES;
    /// Whether its `limit` goes up to [`ToolLimits::max_search_results`] (the searches whose
    /// recall over long conversations needs it) rather than [`ToolLimits::max_results`].
    const WIDE_LIMIT: bool = false;

    /// Runs the tool on validated arguments.
    async fn run(
        &self,
        services: &ToolServices,
        ctx: &ToolContext,
        args: Self::Args,
    ) -> Result<Self::Output, ToolError>;
}

/// A [`TypedTool`] with its generated contract.
pub(crate) struct Typed<T: TypedTool> {
    tool: T,
    spec: ToolSpec,
}

impl<T: TypedTool> Typed<T> {
    pub(crate) fn new(tool: T, limits: &ToolLimits) -> Self {
        let mut parameters = schema_for::<T::Args>(false);
        apply_limits(&mut parameters, limits, T::WIDE_LIMIT);
        Self {
            tool,
            spec: ToolSpec {
                name: T::NAME,
                description: T::DESCRIPTION,
                parameters,
                result: result_schema::<T::Output>(),
                writes: T::WRITES,
                destructive: T::DESTRUCTIVE,
                idempotent: T::IDEMPOTENT,
            },
        }
    }
}

#[async_trait]
impl<T: TypedTool> Tool for Typed<T> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        services: &ToolServices,
        ctx: &ToolContext,
        args: Value,
    ) -> Result<Value, ToolError> {
        // Validated by the registry against this schema; a failure here is a schema that does
        // not describe its type, reported as such rather than trusted.
        let typed: T::Args = serde_json::from_value(args)
            .map_err(|e| ToolError::invalid("arguments", e.to_string()))?;
        let out = self.tool.run(services, ctx, typed).await?;
        serde_json::to_value(out).map_err(|e| ToolError::Unavailable {
            reason: format!("the result of {} could not be encoded: {e}", T::NAME),
        })
    }
}

/// `args` without top-level `null`s for arguments the schema does not require.
pub(crate) fn without_optional_nulls(schema: &Value, args: &Value) -> Value {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match args {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, v)| !v.is_null() || required.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The JSON Schema of `T`, in the subset hosts enforce: inlined (no `$ref`), no `$schema`,
/// `title`, `format` or type arrays. For arguments an optional field is simply not required
/// (`null` is not accepted); for results a value that may be `null` becomes
/// `oneOf: [schema, {type: null}]`.
pub(crate) fn schema_for<T: JsonSchema>(nullable: bool) -> Value {
    let generator = SchemaSettings::draft07()
        .with(|s| {
            s.inline_subschemas = true;
            // Arguments are read (a defaulted field is optional); results are written (a
            // skipped field is optional).
            s.contract = if nullable {
                Contract::Serialize
            } else {
                Contract::Deserialize
            };
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    shape(&mut schema, nullable);
    schema
}

/// A result schema as hosts check results against it: the result type's schema, whose root
/// also admits the error shape a failed call returns (`{"error": {code, message, …}}`) — hosts
/// such as DSH validate every result, failed ones included — so the root requires nothing.
pub(crate) fn result_schema<T: JsonSchema>() -> Value {
    let mut schema = schema_for::<T>(true);
    if let Some(root) = schema.as_object_mut() {
        root.remove("required");
        if let Some(Value::Object(props)) = root.get_mut("properties") {
            props.insert(
                "error".into(),
                json!({"type": "object", "description": "Present instead of the other fields when the call failed: `code` (invalid-arguments, not-found, revision-conflict, scope-denied, limit-exceeded, unavailable, unknown-tool), `message`, and details such as `field` or `currentRevision`."}),
            );
        }
    }
    schema
}

/// Rewrites schemars' output into the host subset (see [`schema_for`]). With `nullable`
/// false, `null` alternatives are dropped (an optional argument is omitted, not `null`).
fn shape(node: &mut Value, nullable: bool) {
    let Some(obj) = node.as_object_mut() else {
        return;
    };
    for key in ["$schema", "title", "format", "definitions", "$defs"] {
        obj.remove(key);
    }
    if nullable {
        // Result schemas describe; hosts accept only structure and annotations there.
        for key in [
            "minimum",
            "maximum",
            "minLength",
            "maxLength",
            "minItems",
            "maxItems",
            "pattern",
        ] {
            obj.remove(key);
        }
    }
    // Doc comments wrap lines; the model reads one paragraph.
    if let Some(Value::String(d)) = obj.get_mut("description") {
        *d = d.split_whitespace().collect::<Vec<_>>().join(" ");
    }
    // `Option<Enum>` lists `null` among the values; `null` is a type alternative (results) or
    // not allowed at all (arguments), never an enum value.
    if let Some(Value::Array(values)) = obj.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    // `["string", "null"]` → `oneOf: [{type: string, …}, {type: null}]`, or just the type.
    if let Some(Value::Array(types)) = obj.get("type").cloned() {
        let non_null: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
        if let [only] = &non_null[..] {
            obj.insert("type".into(), only.clone());
            if nullable {
                let description = obj.remove("description");
                let mut inner = Value::Object(std::mem::take(obj));
                shape(&mut inner, nullable);
                obj.insert("oneOf".into(), json!([inner, {"type": "null"}]));
                if let Some(d) = description {
                    obj.insert("description".into(), d);
                }
                return;
            }
        }
    }
    // `anyOf` of alternatives (how schemars writes `Option<Enum>`) is the subset's `oneOf`;
    // without `null`, a single alternative is the schema itself.
    if let Some(Value::Array(mut any)) = obj.remove("anyOf") {
        if !nullable {
            any.retain(|a| a.get("type").and_then(Value::as_str) != Some("null"));
        }
        if let [only] = &any[..] {
            if let Value::Object(inner) = only.clone() {
                for (k, v) in inner {
                    obj.entry(k).or_insert(v);
                }
            }
        } else {
            obj.insert("oneOf".into(), Value::Array(any));
        }
        shape(node, nullable);
        return;
    }
    // A `oneOf` of constants (documented enum variants) is an `enum`.
    if let Some(Value::Array(options)) = obj.get("oneOf") {
        let consts: Option<Vec<Value>> = options
            .iter()
            .map(|o| o.get("const").cloned().or_else(|| single_enum(o)))
            .collect();
        if let Some(values) = consts {
            obj.remove("oneOf");
            obj.insert("type".into(), json!("string"));
            obj.insert("enum".into(), Value::Array(values));
        }
    }
    for (key, value) in obj.iter_mut() {
        match (key.as_str(), value) {
            // Property maps hold schemas by name, not schema keywords.
            ("properties", Value::Object(props)) => {
                props.values_mut().for_each(|p| shape(p, nullable));
            }
            (_, v @ Value::Object(_)) => shape(v, nullable),
            ("oneOf" | "allOf" | "items", Value::Array(items)) => {
                items.iter_mut().for_each(|i| shape(i, nullable));
            }
            _ => {}
        }
    }
}

fn single_enum(option: &Value) -> Option<Value> {
    match option.get("enum")?.as_array()?.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// Writes the limits in force into argument schemas, by argument name, so the model sees the
/// limits the validator enforces.
fn apply_limits(schema: &mut Value, l: &ToolLimits, wide_limit: bool) {
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    let set = |props: &mut Map<String, Value>, name: &str, values: Value| {
        if let (Some(Value::Object(p)), Value::Object(v)) = (props.get_mut(name), values) {
            p.extend(v);
        }
    };
    set(props, "query", json!({"maxLength": l.max_query_chars}));
    let most = if wide_limit {
        l.max_search_results
    } else {
        l.max_results
    };
    set(
        props,
        "limit",
        json!({"minimum": 1, "maximum": most,
            "description": format!("Most results (default {}, at most {most}); the token budget may return fewer, and `truncated` says so.", l.default_results)}),
    );
    set(
        props,
        "maxTokens",
        json!({"minimum": 1, "maximum": l.max_tokens,
            "description": format!("Token budget for returned text (default {}); results that do not fit are left out and `truncated` says so.", l.default_tokens)}),
    );
    set(props, "tags", json!({"maxItems": l.max_tags}));
    set(props, "content", json!({"maxLength": l.max_memory_bytes}));
    set(props, "changes", json!({"maxItems": l.max_patch_changes}));
}
