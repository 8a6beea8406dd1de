//! CEL text: literals of the operator's strings, and the pieces of
//! expression the policy repeats. Written for the CEL environment of
//! Kubernetes 1.31 (the IP and CIDR library, the strings extension v2,
//! Kubernetes' list `indexOf`); nothing newer (no two-variable
//! comprehensions, no `cel.bind`).

/// A CEL string literal of `s`: single quotes, anything outside printable
/// ASCII (and the quote and backslash) escaped.
pub fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if u32::from(c) <= 0xffff => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push_str(&format!("\\U{:08x}", u32::from(c))),
        }
    }
    out.push('\'');
    out
}

/// A CEL list literal of strings.
pub fn strings<S: AsRef<str>>(items: &[S]) -> String {
    let items: Vec<String> = items.iter().map(|s| string(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

/// `e` (a string expression) for a message: in double quotes when it is
/// printable ASCII of at most 64 characters, otherwise only its length (a
/// message may not hold a line break; the API server would drop it).
pub fn shown(e: &str) -> String {
    format!(
        "({e}.matches('^[ -~]{{0,64}}$') ? '\"' + {e} + '\"'\n  : 'a value of ' + string(size({e})) + ' characters')"
    )
}

/// `a && b && ...`; `true` for none.
pub fn all(terms: &[String]) -> String {
    if terms.is_empty() {
        "true".into()
    } else {
        terms.join(" && ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_literals_escape_what_cel_would_read_otherwise() {
        assert_eq!(string("vpn"), "'vpn'");
        assert_eq!(string("it's \\"), r"'it\'s \\'");
        assert_eq!(string("a\nb\u{e9}\u{1f600}"), r"'a\u000ab\u00e9\U0001f600'");
        assert_eq!(strings(&["a", "b"]), "['a', 'b']");
        assert_eq!(strings::<&str>(&[]), "[]");
    }
}
