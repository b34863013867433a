//! The subset of JSON Schema the tool contracts use, and a validator for it, so every schema
//! the model sees is also what the arguments are checked against (errors name the field).

use serde_json::Value;

use crate::error::ToolError;

/// Validates `value` against `schema`. Supported keywords: `type` (string, integer, number,
/// boolean, array, object), `properties`, `required`, `additionalProperties: false`, `enum`,
/// `minLength`/`maxLength` (characters), `pattern` (ECMAScript, Unicode), `minimum`/`maximum`,
/// `minItems`/`maxItems`, `items`.
/// A schema without `type` accepts any value.
///
/// # Errors
/// [`ToolError::InvalidArguments`] naming the first offending field.
pub fn validate(schema: &Value, value: &Value) -> Result<(), ToolError> {
    check(schema, value, "")
}

fn field(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn shown(path: &str) -> &str {
    if path.is_empty() {
        "arguments"
    } else {
        path
    }
}

fn check(schema: &Value, value: &Value, path: &str) -> Result<(), ToolError> {
    let fail = |reason: String| Err(ToolError::invalid(shown(path), reason));
    if let Some(ty) = schema.get("type").and_then(Value::as_str) {
        let ok = match ty {
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            _ => true,
        };
        if !ok {
            return fail(format!(
                "must be {} {ty}",
                if ty == "integer" || ty == "array" || ty == "object" {
                    "an"
                } else {
                    "a"
                }
            ));
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(value) {
            let list: Vec<String> = options.iter().map(Value::to_string).collect();
            return fail(format!("must be one of {}", list.join(", ")));
        }
    }
    if let Some(s) = value.as_str() {
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            // ECMAScript semantics with the `u` flag, as hosts in JavaScript check it.
            let matches = regress::Regex::with_flags(pattern, "u")
                .map(|re| re.find(s).is_some())
                .unwrap_or(true);
            if !matches {
                return fail(format!("must match {pattern}"));
            }
        }
        let n = s.chars().count();
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
            if (n as u64) < min {
                return fail(format!("must have at least {min} characters"));
            }
        }
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
            if n as u64 > max {
                return fail(format!("must have at most {max} characters, has {n}"));
            }
        }
    }
    if let Some(x) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            if x < min {
                return fail(format!("must be at least {min}"));
            }
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            if x > max {
                return fail(format!("must be at most {max}"));
            }
        }
    }
    if let Some(items) = value.as_array() {
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
            if (items.len() as u64) < min {
                return fail(format!("must have at least {min} items"));
            }
        }
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
            if items.len() as u64 > max {
                return fail(format!(
                    "must have at most {max} items, has {}",
                    items.len()
                ));
            }
        }
        if let Some(item_schema) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                check(item_schema, item, &format!("{}[{i}]", shown(path)))?;
            }
        }
    }
    if let Some(obj) = value.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        if let Some(required) = schema.get("required").and_then(Value::as_array) {
            for key in required.iter().filter_map(Value::as_str) {
                if !obj.contains_key(key) {
                    return Err(ToolError::invalid(field(path, key), "is required"));
                }
            }
        }
        for (key, v) in obj {
            match props.and_then(|p| p.get(key)) {
                Some(sub) => check(sub, v, &field(path, key))?,
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(ToolError::invalid(
                        field(path, key),
                        "is not an argument of this tool (the session decides identity and scope)",
                    ));
                }
                None => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_field() {
        let schema = json!({"type": "object", "additionalProperties": false, "required": ["q"],
            "properties": {"q": {"type": "string", "maxLength": 3},
                "items": {"type": "array", "maxItems": 2, "items": {"type": "object", "additionalProperties": false,
                    "properties": {"n": {"type": "integer", "minimum": 1}}}}}});
        let err = |v: Value| validate(&schema, &v).unwrap_err().to_string();
        assert_eq!(err(json!({})), "invalid argument q: is required");
        assert_eq!(
            err(json!({"q": "abcd"})),
            "invalid argument q: must have at most 3 characters, has 4"
        );
        assert_eq!(err(json!({"q": 1})), "invalid argument q: must be a string");
        assert!(err(json!({"q": "a", "chatId": "x"}))
            .starts_with("invalid argument chatId: is not an argument"));
        assert_eq!(
            err(json!({"q": "a", "items": [{"n": 0}]})),
            "invalid argument items[0].n: must be at least 1"
        );
        assert_eq!(
            err(json!({"q": "a", "items": [{}, {}, {}]})),
            "invalid argument items: must have at most 2 items, has 3"
        );
        assert_eq!(
            err(json!([1])),
            "invalid argument arguments: must be an object"
        );
        assert!(validate(&schema, &json!({"q": "abc", "items": [{"n": 2}]})).is_ok());
    }
}
