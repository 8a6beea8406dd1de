//! The rendered objects as YAML for `kubectl apply -f`: block style, keys
//! and simple words plain, other strings in double quotes (JSON's escapes
//! are YAML's), strings of several lines (CEL expressions, plugins.json) as
//! literal blocks, so the shipped file reads like a hand-written manifest.

use serde_json::{Map, Value};

/// One YAML document (without the `---` separator).
pub fn document(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Object(m) if !m.is_empty() => map(&mut out, m, 0),
        other => {
            out.push_str(&scalar(other, 0));
            out.push('\n');
        }
    }
    out
}

/// Keys in the order Kubernetes manifests are read (serde_json's maps are
/// sorted); others after them, sorted.
const ORDER: [&str; 24] = [
    "apiVersion",
    "kind",
    "name",
    "namespace",
    "labels",
    "annotations",
    "metadata",
    "spec",
    "data",
    "policyName",
    "validationActions",
    "failurePolicy",
    "matchConstraints",
    "resourceRules",
    "apiGroups",
    "apiVersions",
    "operations",
    "resources",
    "matchConditions",
    "variables",
    "validations",
    "expression",
    "message",
    "messageExpression",
];

fn rank(k: &str) -> usize {
    ORDER.iter().position(|o| *o == k).unwrap_or(ORDER.len())
}

fn map(out: &mut String, m: &Map<String, Value>, indent: usize) {
    let mut entries: Vec<(&String, &Value)> = m.iter().collect();
    entries.sort_by_key(|(k, _)| rank(k));
    for (i, (k, v)) in entries.into_iter().enumerate() {
        // The first key of a map that is a list item follows its `- `.
        if i > 0 || !out.ends_with("- ") {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str(&key(k));
        out.push(':');
        value(out, v, indent);
    }
}

/// What follows `key:` (or `- `): a scalar on the same line, or a nested
/// block on the next lines.
fn value(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            map(out, m, indent + 2);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            list(out, items, indent);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other, indent + 2));
            out.push('\n');
        }
    }
}

fn list(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push_str("- ");
        match item {
            Value::Object(m) if !m.is_empty() => map(out, m, indent + 2),
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                list(out, inner, indent + 2);
            }
            other => {
                out.push_str(&scalar(other, indent + 2));
                out.push('\n');
            }
        }
    }
}

fn key(k: &str) -> String {
    if plain(k) {
        k.to_string()
    } else {
        Value::String(k.to_string()).to_string()
    }
}

/// A scalar; a string of several lines as a literal block whose lines are
/// indented by `indent`.
fn scalar(v: &Value, indent: usize) -> String {
    match v {
        Value::String(s) if plain(s) => s.clone(),
        Value::String(s) => match block(s) {
            Some(chomp) => {
                let pad = " ".repeat(indent);
                let body: Vec<String> = s
                    .trim_end_matches('\n')
                    .split('\n')
                    .map(|l| {
                        if l.is_empty() {
                            String::new()
                        } else {
                            format!("{pad}{l}")
                        }
                    })
                    .collect();
                format!("{chomp}\n{}", body.join("\n"))
            }
            None => v.to_string(),
        },
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        other => other.to_string(),
    }
}

/// The literal block header for `s` (`|-`: no final newline, `|`: one),
/// if a literal block carries `s` exactly: several lines, printable
/// characters only, no trailing spaces, and a first line that does not
/// start with a space (its indentation is the block's).
fn block(s: &str) -> Option<&'static str> {
    let body = s.strip_suffix('\n').unwrap_or(s);
    let chomp = if body.len() == s.len() { "|-" } else { "|" };
    let fits = body.contains('\n')
        && !body.ends_with('\n')
        && !body.starts_with([' ', '\n'])
        && body.chars().all(|c| c == '\n' || !c.is_control())
        && body.split('\n').all(|l| !l.ends_with(' '));
    fits.then_some(chomp)
}

/// A word YAML reads back as the same string without quotes: letters,
/// digits and `._/-`, starting with a letter, and none of YAML 1.1's
/// booleans or nulls.
fn plain(s: &str) -> bool {
    const WORDS: [&str; 9] = ["y", "n", "yes", "no", "on", "off", "true", "false", "null"];
    s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
        && !WORDS.contains(&s.to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What YAML reads back is what was written, for every shape the
    /// renderer emits and the strings that need care.
    #[test]
    fn documents_read_back_as_written() {
        let v = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "metadata": {"name": "podgate-pods", "labels": {"app.kubernetes.io/name": "podgate"},
                         "annotations": {"podgate.dev/policy-digest": "sha256:00ff"}},
            "spec": {
                "empty": {}, "none": [], "n": 3, "t": true, "nothing": null,
                "words": ["Deny", "yes", "No", "on", "1.0", "", "a b", "-x", "x:", "#c", "é"],
                "rules": [{"apiGroups": [""], "resources": ["pods"], "deep": [[1, 2], []]}],
                "cel": "request.namespace in ['vpn']\n  && size(x) > 0",
                "one newline": "line 1\nline 2\n",
                "two newlines": "line 1\n\n",
                "leading space": " x\ny",
                "trailing space": "x \ny",
                "tab": "a\tb\nc",
                "blank line": "a\n\nb",
                "quotes": "'\"\\",
                "control": "a\u{7}b\nc",
            },
            "weird key: x": "v",
        });
        let text = document(&v);
        let back: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(back, v, "{text}");
        assert!(
            text.contains("  cel: |-\n    request.namespace in ['vpn']\n      && size(x) > 0\n"),
            "{text}"
        );
        assert!(
            text.contains("  - apiGroups:\n    - \"\"\n    resources:\n    - pods\n"),
            "{text}"
        );
    }
}
