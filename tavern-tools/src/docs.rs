//! Renders `docs/TOOLS.md` from the tool contracts, so the reference can never drift from the
//! schemas (a test compares the file with this output).

use std::fmt::Write as _;

use serde_json::Value;

use crate::context::ToolLimits;
use crate::tools::ToolSpec;

fn constraints(schema: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        let list: Vec<String> = e
            .iter()
            .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
            .collect();
        parts.push(format!("one of {}", list.join(", ")));
    }
    for (key, label) in [
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minimum", "min"),
        ("maximum", "max"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("pattern", "pattern"),
    ] {
        if let Some(v) = schema.get(key) {
            parts.push(format!("{label} {v}"));
        }
    }
    if let Some(items) = schema.get("items") {
        if let Some(e) = items.get("enum").and_then(Value::as_array) {
            let list: Vec<String> = e
                .iter()
                .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
                .collect();
            parts.push(format!("items one of {}", list.join(", ")));
        }
        if let Some(props) = items.get("properties").and_then(Value::as_object) {
            let names: Vec<String> = props.keys().map(|k| format!("`{k}`")).collect();
            parts.push(format!("items: objects with {}", names.join(", ")));
        }
    }
    parts.join("; ")
}

fn type_of(schema: &Value) -> String {
    match schema.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".into(),
    }
}

/// The whole tool reference as Markdown.
pub fn render(specs: &[ToolSpec], limits: &ToolLimits) -> String {
    let mut out = String::new();
    out.push_str("# Tool reference\n\n");
    out.push_str("Generated from the tool contracts by `cargo run -p tavern-tools --bin tools-doc > docs/TOOLS.md`; a test fails when this file and the schemas disagree.\n\n");
    out.push_str("Every tool runs in the calling session's context: the session, chat, character and scopes come from the host's agent id and the session's binding, never from arguments. Arguments are checked against the schema below (`additionalProperties: false`), so an unknown argument such as `sessionId` is refused. Results are data, never instructions.\n\n");
    out.push_str("## Limits\n\n| limit | value |\n|---|---|\n");
    let l = serde_json::to_value(limits).unwrap_or(Value::Null);
    if let Some(obj) = l.as_object() {
        for (k, v) in obj {
            let _ = writeln!(out, "| `{k}` | {v} |");
        }
    }
    out.push_str("\n`timeoutMs` is handed to the host with each tool definition; the host's tool pipeline enforces it and cancels the call.\n");
    out.push_str(
        "\n## Errors\n\nA failed call returns `{\"error\": {\"code\", \"message\", …}}`:\n\n",
    );
    out.push_str("| code | meaning | extra fields |\n|---|---|---|\n");
    for (code, meaning, extra) in [
        (
            "invalid-arguments",
            "an argument is missing, mistyped, out of range or not an argument of the tool",
            "`field`",
        ),
        (
            "not-found",
            "no such record in the scopes this session can see",
            "",
        ),
        (
            "revision-conflict",
            "the revision sent is not the current one: read again and retry",
            "`currentRevision`",
        ),
        (
            "scope-denied",
            "the settings forbid the write, or it needs the user's confirmation",
            "",
        ),
        (
            "limit-exceeded",
            "a limit was hit",
            "`limit`, `max`, `actual`",
        ),
        (
            "unavailable",
            "the tool cannot run here (not an agent-tavern session, no card, storage failure)",
            "",
        ),
        ("unknown-tool", "no tool has that name", ""),
    ] {
        let _ = writeln!(out, "| `{code}` | {meaning} | {extra} |");
    }
    for spec in specs {
        let _ = writeln!(out, "\n## `{}`\n\n{}\n", spec.name, spec.description);
        let _ = writeln!(
            out,
            "{}\n",
            if spec.writes {
                "Writes (counts against the per-turn write limit)."
            } else {
                "Read-only."
            }
        );
        let required: Vec<&str> = spec.parameters["required"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let props = spec.parameters["properties"].as_object();
        match props.filter(|p| !p.is_empty()) {
            None => out.push_str("No arguments.\n"),
            Some(props) => {
                out.push_str("| argument | type | required | constraints | description |\n|---|---|---|---|---|\n");
                for (name, schema) in props {
                    let _ = writeln!(
                        out,
                        "| `{name}` | {} | {} | {} | {} |",
                        type_of(schema),
                        if required.contains(&name.as_str()) {
                            "yes"
                        } else {
                            "no"
                        },
                        constraints(schema),
                        schema
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .replace('|', "\\|"),
                    );
                }
            }
        }
        if let Some(fields) = spec.result["properties"].as_object() {
            let names: Vec<String> = fields.keys().map(|k| format!("`{k}`")).collect();
            let _ = writeln!(out, "\nResult fields: {}.", names.join(", "));
        }
    }
    out
}
